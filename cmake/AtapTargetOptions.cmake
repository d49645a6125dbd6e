# Per-target build settings shared by the library, its tests, examples and
# benchmarks. Everything here is set on a target, never through global
# CMAKE_C_FLAGS, so a project that vendors libatap keeps its own flags.

# -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes, and -Werror
# when ATAP_WERROR is on. C only (a C++ bench target is left alone).
function(atap_apply_warnings target)
    if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
        target_compile_options(${target} PRIVATE
            $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes>
            $<$<AND:$<COMPILE_LANGUAGE:C>,$<BOOL:${ATAP_WERROR}>>:-Werror>)
    endif()
endfunction()

# ATAP_SANITIZER: none | address (ASan + UBSan) | thread (TSan) | undefined (UBSan).
# Compile flags stay on the target; link flags also go to whatever links a
# library target, since an executable must pull in the sanitizer runtime.
function(atap_apply_sanitizer target)
    if(ATAP_SANITIZER STREQUAL "" OR ATAP_SANITIZER STREQUAL "none")
        return()
    elseif(ATAP_SANITIZER STREQUAL "address")
        set(_flags -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
    elseif(ATAP_SANITIZER STREQUAL "thread")
        set(_flags -fsanitize=thread -fno-omit-frame-pointer)
    elseif(ATAP_SANITIZER STREQUAL "undefined")
        set(_flags -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
    else()
        message(FATAL_ERROR "ATAP_SANITIZER must be none, address, thread or undefined "
                            "(got '${ATAP_SANITIZER}')")
    endif()
    target_compile_options(${target} PRIVATE ${_flags})
    get_target_property(_type ${target} TYPE)
    if(_type MATCHES "LIBRARY")
        target_link_options(${target} PUBLIC ${_flags})
    else()
        target_link_options(${target} PRIVATE ${_flags})
    endif()
endfunction()

# Everything a library built from libatap's sources needs: the public header,
# C11, hidden visibility (only ATAP_EXPORT symbols leave a shared library),
# ATAP_BUILDING, _GNU_SOURCE on Linux (futex, madvise, pthread_setname_np),
# pthreads and the warnings. Used for atap and for the test-only copies.
# No fault injection: see atap_enable_fault_injection().
function(atap_configure_library target)
    target_include_directories(${target} PUBLIC "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>")
    target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/src")
    target_compile_definitions(${target} PRIVATE ATAP_BUILDING)
    if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
        target_compile_definitions(${target} PRIVATE _GNU_SOURCE)
    endif()
    if(ATAP_POLLER_SELECTED)
        string(TOUPPER "${ATAP_POLLER_SELECTED}" _poller)
        target_compile_definitions(${target} PRIVATE ATAP_POLLER_${_poller}=1)
    endif()
    # A user-space kqueue (Linux), when the top-level CMakeLists.txt found one.
    if(ATAP_POLLER_SELECTED STREQUAL "kqueue" AND ATAP_KQUEUE_LIBRARY)
        target_include_directories(${target} PRIVATE "${ATAP_KQUEUE_INCLUDE_DIR}")
        target_link_libraries(${target} PUBLIC "${ATAP_KQUEUE_LIBRARY}")
    endif()
    set_target_properties(${target} PROPERTIES
        C_STANDARD 11
        C_STANDARD_REQUIRED ON
        C_EXTENSIONS OFF
        C_VISIBILITY_PRESET hidden
        VISIBILITY_INLINES_HIDDEN ON)
    target_link_libraries(${target} PUBLIC Threads::Threads)
    # dladdr (traces name task functions): libdl before glibc 2.34.
    if(CMAKE_DL_LIBS)
        target_link_libraries(${target} PUBLIC ${CMAKE_DL_LIBS})
    endif()
    atap_apply_warnings(${target})
endfunction()

# A program of libatap's own (test, example, benchmark): C11, warnings,
# sanitizer, _GNU_SOURCE on Linux.
function(atap_configure_program target)
    set_target_properties(${target} PROPERTIES C_STANDARD 11 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
    if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
        target_compile_definitions(${target} PRIVATE _GNU_SOURCE)
    endif()
    atap_apply_warnings(${target})
    atap_apply_sanitizer(${target})
endfunction()

# Builds the atap_inject_* calls and the fault checks into a library built by
# atap_configure_library(), and declares them to whatever links it (atap.h
# shows them under ATAP_FAULT_INJECTION). For the test suite's own copy of
# the library; never for one that is installed.
function(atap_enable_fault_injection target)
    target_compile_definitions(${target} PUBLIC ATAP_FAULT_INJECTION=1)
endfunction()

# A C++ program of libatap's own (examples/cpp_tour, tests/test_hpp): C++11,
# the oldest standard atap.h and atap.hpp support, with -Wall -Wextra
# -pedantic (and -Werror when ATAP_WERROR is on), and the sanitizer.
function(atap_configure_cxx_program target)
    set_target_properties(${target} PROPERTIES
        CXX_STANDARD 11 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF)
    if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
        target_compile_options(${target} PRIVATE -Wall -Wextra -pedantic
            $<$<BOOL:${ATAP_WERROR}>:-Werror>)
    endif()
    atap_apply_sanitizer(${target})
endfunction()
