#!/usr/bin/env bash
# libatap as its users get it:   bash tests/consumers.sh
#
# Builds and runs the small consumer projects of tests/consumers/ in a temp
# dir against this checkout:
#   - consumer.c, a file including atap.h, compiled with -Wall -Wextra
#     -Werror -pedantic as C99/C11/C17 (gcc, clang) and, with consumer.cpp
#     (atap.hpp), as C++11/14/17/20 (g++, clang++);
#   - a static install and a shared install (top-level builds with the
#     tests on, installed to temp prefixes): no atap_inject_* symbol, no
#     ATAP_FAULT_INJECTION in the CMake package, the shared library exporting
#     atap_* only (nm -D);
#   - find_package(atap) against each install (C and C++ consumers);
#   - pkg-config against the shared install, and --static against the
#     static one after moving its prefix (atap.pc is relocatable);
#   - add_subdirectory: a vendored copy builds, carries no fault injection
#     and installs nothing into the consumer's prefix; built shared
#     (BUILD_SHARED_LIBS=ON), it installs its shared library alone beside
#     the consumer's app, which then runs from the prefix on its run path;
#   - waits_cleanup.c, cleanup handlers across stacks set aside, on glibc
#     and on musl (a library built with CC=musl-gcc).
# Installs what it needs when missing (Debian: cmake, g++, clang, pkg-config,
# libcmocka-dev, musl-tools). One line per check; the last line is "N
# passed, N failed"; exits nonzero on any failure. ATAP_JOBS (default 2) sets the parallelism,
# ATAP_KEEP_TMP=1 keeps the temp dir.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$root/tests/consumers
jobs=${ATAP_JOBS:-2}
have() { command -v "$1" >/dev/null 2>&1; }

install_deps() {
    local missing=() sudo=""
    have cmake || missing+=(cmake)
    have make || missing+=(make)
    have gcc || missing+=(gcc)
    have g++ || missing+=(g++)
    { have clang && have clang++; } || missing+=(clang)
    have pkg-config || missing+=(pkg-config)
    have nm || missing+=(binutils)
    have musl-gcc || missing+=(musl-tools)
    [ -f /usr/include/cmocka.h ] || missing+=(libcmocka-dev) # a top-level build with the tests on
    [ ${#missing[@]} -eq 0 ] && return 0
    have apt-get || { echo "consumers: please install: ${missing[*]}" >&2; return 1; }
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    echo "consumers: installing ${missing[*]}"
    $sudo apt-get update -q >/dev/null || return 1
    $sudo env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >/dev/null
}

if ! install_deps; then
    echo "consumers: could not install the tools the checks need" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/atap-consumers.XXXXXX") || exit 1
if [ "${ATAP_KEEP_TMP:-0}" = 1 ]; then
    echo "consumers: working in $tmp (kept)"
else
    trap 'rm -rf "$tmp"' EXIT
fi

passed=0
failed=0
n=0
# check NAME COMMAND...: runs the command with its output in a log; one line
# per check, and the log's tail when it fails.
check() {
    local name=$1 log
    shift
    n=$((n + 1))
    log=$tmp/log.$n
    if "$@" >"$log" 2>&1; then
        printf 'ok    %s\n' "$name"
        passed=$((passed + 1))
    else
        printf 'FAIL  %s\n' "$name"
        tail -n 25 "$log" | sed 's/^/      | /'
        failed=$((failed + 1))
    fi
}

# --- the header, as a consumer's strict build sees it ----------------------
strict=(-Wall -Wextra -Werror -pedantic -I"$root/include")
header_c() { "$1" -x c -std="$2" "${strict[@]}" -c "$src/consumer.c" -o "$tmp/h.o"; }
header_cxx() {
    "$1" -x c++ -std="$2" "${strict[@]}" -c "$src/consumer.c" -o "$tmp/h.o" &&
        "$1" -std="$2" "${strict[@]}" -c "$src/consumer.cpp" -o "$tmp/h.o"
}
for cc in gcc clang; do
    for std in c99 c11 c17; do
        check "atap.h, $cc -std=$std -Wall -Wextra -Werror -pedantic" header_c $cc $std
    done
done
for cxx in g++ clang++; do
    for std in c++11 c++14 c++17 c++20; do
        check "atap.h and atap.hpp, $cxx -std=$std -Wall -Wextra -Werror -pedantic" header_cxx $cxx $std
    done
done

# Each area's header alone (with atap/core.h), and the runtime's without
# <sys/socket.h>, which only atap/net.h brings in.
area_alone() {
    printf '#include <atap/%s.h>\nint main(void) { return 0; }\n' "$1" >"$tmp/area-$1.c" &&
        gcc -std=c99 "${strict[@]}" -c "$tmp/area-$1.c" -o "$tmp/area.o" &&
        g++ -x c++ -std=c++11 "${strict[@]}" -c "$tmp/area-$1.c" -o "$tmp/area.o"
}
core_lean() {
    printf '#include <atap/core.h>\n#ifdef AF_INET\n#error atap/core.h brought in <sys/socket.h>\n#endif\nint main(void) { return 0; }\n' >"$tmp/lean.c" &&
        gcc -std=c99 "${strict[@]}" -c "$tmp/lean.c" -o "$tmp/lean.o"
}
for area in core fs net process tasks; do
    check "atap/$area.h alone, gcc -std=c99 and g++ -std=c++11, -Werror -pedantic" area_alone $area
done
check "atap/core.h alone brings in no <sys/socket.h>" core_lean

# --- installs --------------------------------------------------------------
# install_lib NAME CMAKE_ARGS...: a top-level build with the tests on (as
# run_suite configures it), only the library built, installed to $tmp/NAME.
install_lib() {
    local name=$1
    shift
    cmake -S "$root" -B "$tmp/build-$name" -DCMAKE_BUILD_TYPE=Release -DATAP_BUILD_TESTS=ON \
        -DATAP_BUILD_BENCH=OFF "$@" &&
        cmake --build "$tmp/build-$name" -j "$jobs" --target atap &&
        cmake --install "$tmp/build-$name" --prefix "$tmp/$name"
}
no_inject() { ! nm "$@" | grep -E ' [A-Za-z] atap_inject_'; }
package_clean() { ! grep -rn ATAP_FAULT_INJECTION "$tmp/$1/lib/cmake/atap"; }
exports_atap_only() {
    local so bad
    so=$(ls "$tmp/shared/lib/"libatap.so.*.*.* | head -n 1) || return 1
    # (grep -q would stop reading early: nm's SIGPIPE fails the pipe under pipefail)
    nm -D --defined-only "$so" | grep ' T atap_init$' >/dev/null || { echo "no atap_init in $so"; return 1; }
    bad=$(nm -D --defined-only "$so" | awk '$2 != "A" && $3 !~ /^atap_[^_]/ || $3 ~ /^atap_inject_/')
    [ -z "$bad" ] || { echo "$so exports:"; echo "$bad"; return 1; }
}

check "static install (top-level, tests on) to a temp prefix" install_lib static
check "static install: libatap.a has no atap_inject_* symbol" no_inject "$tmp/static/lib/libatap.a"

# Cleanup handlers across stacks set aside (waits_cleanup.c), on glibc
# against the static install, and on musl: a library built with musl-gcc.
waits_cleanup() {
    local cc=$1 lib=$2 exe=$tmp/waits-cleanup-$1
    "$cc" -std=c11 -Wall -Wextra -Werror -O1 -I"$root/include" "$src/waits_cleanup.c" "$lib" \
        -lpthread -o "$exe" && "$exe"
}
musl_build() {
    cmake -S "$root" -B "$tmp/build-musl" -DCMAKE_C_COMPILER=musl-gcc -DCMAKE_BUILD_TYPE=Release \
        -DATAP_BUILD_TESTS=OFF -DATAP_BUILD_EXAMPLES=OFF -DATAP_BUILD_BENCH=OFF &&
        cmake --build "$tmp/build-musl" -j "$jobs" --target atap
}
check "waits_cleanup.c (cleanup handlers across stacks set aside), gcc and glibc" \
    waits_cleanup gcc "$tmp/static/lib/libatap.a"
if have musl-gcc; then
    check "musl: CC=musl-gcc builds libatap" musl_build
    check "waits_cleanup.c, musl-gcc and musl" waits_cleanup musl-gcc "$tmp/build-musl/libatap.a"
else
    echo "skip  musl: no musl-gcc"
fi
installed_headers() {
    local inc=$tmp/static/include
    for h in atap.h atap.hpp atap/core.h atap/fs.h atap/net.h atap/process.h atap/tasks.h; do
        [ -f "$inc/$h" ] || { echo "no $inc/$h"; return 1; }
    done
    [ ! -e "$inc/atap/inject.h" ] || { echo "atap/inject.h is installed"; return 1; }
}
check "static install: atap.h and its areas installed, atap/inject.h not" installed_headers
check "static install: CMake package sets no ATAP_FAULT_INJECTION" package_clean static
check "shared install (top-level, tests on) to a temp prefix" install_lib shared -DBUILD_SHARED_LIBS=ON
check "shared install: nm -D shows only atap_* symbols, no atap_inject_*" exports_atap_only
check "shared install: CMake package sets no ATAP_FAULT_INJECTION" package_clean shared

# --- find_package ----------------------------------------------------------
# find_pkg NAME: the find_package consumer against $tmp/NAME; runs both apps.
find_pkg() {
    local b=$tmp/fp-$1
    cmake -S "$src/find_package" -B "$b" -DCMAKE_PREFIX_PATH="$tmp/$1" &&
        cmake --build "$b" -j "$jobs" && "$b/app_c" && "$b/app_cpp"
}
check "find_package(atap) against the static install: C and C++ consumers run" find_pkg static
check "find_package(atap) against the shared install: C and C++ consumers run" find_pkg shared

# --- pkg-config ------------------------------------------------------------
pc_shared() {
    export PKG_CONFIG_PATH=$tmp/shared/lib/pkgconfig
    # shellcheck disable=SC2046
    cc "$src/consumer.c" $(pkg-config --cflags --libs atap) -o "$tmp/pc-shared" &&
        LD_LIBRARY_PATH=$tmp/shared/lib "$tmp/pc-shared" &&
        [[ $(LD_LIBRARY_PATH=$tmp/shared/lib ldd "$tmp/pc-shared") == *"$tmp/shared/lib/libatap.so"* ]]
}
pc_static_moved() {
    mv "$tmp/static" "$tmp/static-moved" || return 1
    grep -x 'prefix=${pcfiledir}/../..' "$tmp/static-moved/lib/pkgconfig/atap.pc" || return 1
    export PKG_CONFIG_PATH=$tmp/static-moved/lib/pkgconfig
    # shellcheck disable=SC2046
    c++ -std=c++11 "$src/consumer.cpp" $(pkg-config --static --cflags --libs atap) -o "$tmp/pc-static" &&
        "$tmp/pc-static" &&
        [[ $(ldd "$tmp/pc-static") != *libatap* ]]
}
check "pkg-config --cflags --libs atap (shared install): C consumer runs" pc_shared
check "pkg-config --static (static install, prefix moved): C++ consumer runs" pc_static_moved

# --- add_subdirectory ------------------------------------------------------
vendored() {
    local b=$tmp/vendored
    cmake -S "$src/vendored" -B "$b" -DATAP_SOURCE="$root" -DCMAKE_INSTALL_PREFIX="$tmp/vendored-prefix" &&
        cmake --build "$b" -j "$jobs" && "$b/app" &&
        no_inject "$b/atap/libatap.a" &&
        cmake --install "$b" &&
        [ -x "$tmp/vendored-prefix/bin/app" ] &&
        [ "$(cd "$tmp/vendored-prefix" && find . -type f)" = "./bin/app" ]
}
check "add_subdirectory: builds and runs, no fault injection, installs only the consumer's app" vendored

# Shared: the installed app loads the libatap.so.0 installed beside it (its
# run path, $ORIGIN/../lib), not the one in the build tree, which is gone.
vendored_shared() {
    local b=$tmp/vendored-shared p=$tmp/vendored-shared-prefix files
    cmake -S "$src/vendored" -B "$b" -DATAP_SOURCE="$root" -DBUILD_SHARED_LIBS=ON \
        -DCMAKE_INSTALL_PREFIX="$p" -DCMAKE_INSTALL_LIBDIR=lib &&
        cmake --build "$b" -j "$jobs" && "$b/app" &&
        no_inject "$b"/atap/libatap.so.*.*.* &&
        cmake --install "$b" || return 1
    files=$(cd "$p" && find . \( -type f -o -type l \) | sort | tr '\n' ' ')
    [[ $files =~ ^\./bin/app\ \./lib/libatap\.so\.0\ \./lib/libatap\.so\.0\.[0-9]+\.[0-9]+\ $ ]] ||
        { echo "installed: $files"; return 1; }
    rm -rf "$b" || return 1
    env -u LD_LIBRARY_PATH "$p/bin/app" &&
        [[ $(env -u LD_LIBRARY_PATH ldd "$p/bin/app") == *"$p/bin/../lib/libatap.so.0 "* ]]
}
check "add_subdirectory, BUILD_SHARED_LIBS=ON: installs the app and libatap.so.0 alone; the installed app runs" vendored_shared

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
