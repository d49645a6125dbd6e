# CTest test_exports: a shared build of libatap must export atap_* symbols
# and nothing else. Internal functions are atap__* (two underscores) and
# hidden; if one shows up here the check fails. So does any atap_inject_*
# (fault injection belongs to the test suite's own copy of the library).
#
#   cmake -DNM=<nm> -DLIB=<libatap shared object> -P check_exports.cmake
#
# With -DMODE=no_inject, LIB may be static or shared, and the only check is
# that it defines atap_init and no atap_inject_* symbol (test_no_fault_injection).
cmake_minimum_required(VERSION 3.20)
if(NOT NM OR NOT LIB)
    message(FATAL_ERROR "usage: cmake -DNM=nm -DLIB=libfoo.so [-DMODE=no_inject] -P check_exports.cmake")
endif()

if(MODE STREQUAL "no_inject")
    execute_process(COMMAND "${NM}" --defined-only "${LIB}"
        OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${NM} failed on ${LIB} (${rc}): ${err}")
    endif()
    string(REGEX MATCHALL "[ \t]atap_inject_[A-Za-z0-9_]*" injected "${out}")
    if(injected)
        list(REMOVE_DUPLICATES injected)
        message(FATAL_ERROR "${LIB} carries fault injection:${injected}")
    endif()
    if(NOT out MATCHES "[ \t]atap_init\n")
        message(FATAL_ERROR "${LIB} does not define atap_init:\n${out}")
    endif()
    message(STATUS "${LIB}: no atap_inject_* symbol")
    return()
endif()
execute_process(COMMAND "${NM}" -D --defined-only "${LIB}"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${LIB} (${rc}): ${err}")
endif()

# Symbols every linker may add to a shared object.
set(linker_symbols _init _fini __bss_start _edata _end __bss_end__ _bss_end__ __end__)
string(REPLACE "\n" ";" lines "${out}")
set(bad "")
set(good 0)
set(have_init OFF)
foreach(line IN LISTS lines)
    # "<address> <type> <name>[@@version]"
    if(NOT line MATCHES "^[0-9a-fA-F]* *([A-Za-z]) ([^ @]+)")
        continue()
    endif()
    set(type "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    if(type STREQUAL "A" OR name IN_LIST linker_symbols)
        continue() # absolute symbols are version nodes, not code or data
    endif()
    if(name MATCHES "^atap_inject_")
        list(APPEND bad "${type} ${name} (fault injection)")
    elseif(name MATCHES "^atap_[^_]")
        math(EXPR good "${good} + 1")
        if(name STREQUAL "atap_init" AND type STREQUAL "T")
            set(have_init ON)
        endif()
    else()
        list(APPEND bad "${type} ${name}")
    endif()
endforeach()

if(bad)
    list(JOIN bad "\n  " bad_text)
    message(FATAL_ERROR "${LIB} exports symbols outside the public atap_ API:\n  ${bad_text}")
endif()
if(NOT have_init)
    message(FATAL_ERROR "${LIB} does not export atap_init: is ATAP_EXPORT working?\n${out}")
endif()
message(STATUS "${LIB}: ${good} exported symbols, all atap_*")
