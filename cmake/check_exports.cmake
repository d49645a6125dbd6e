# CTest test_exports: a shared build of libatap must export atap_* symbols
# and nothing else. Internal functions are atap__* (two underscores) and
# hidden; if one shows up here the check fails.
#
#   cmake -DNM=<nm> -DLIB=<libatap shared object> -P check_exports.cmake
cmake_minimum_required(VERSION 3.20)
if(NOT NM OR NOT LIB)
    message(FATAL_ERROR "usage: cmake -DNM=nm -DLIB=libfoo.so -P check_exports.cmake")
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
    if(name MATCHES "^atap_[^_]")
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
