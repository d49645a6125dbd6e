#!/usr/bin/env bash
# The whole test suite in one command:   bash tests/run_suite.sh
#
# Installs what the tests need when something is missing (cmake, make, gcc,
# pkg-config, clang and its sanitizer runtimes, libcmocka-dev), then builds
# and runs CTest in one build tree per stage under build/ (or $ATAP_BUILD_ROOT):
#   plain  gcc, RelWithDebInfo (-O2 -g); also runs examples/tour as a smoke check
#   asan   clang, ASan + UBSan; also builds the libFuzzer target and runs it
#          ATAP_FUZZ_SECONDS from the committed corpus (CTest fuzz_api_libfuzzer),
#          and copies its line "fuzz_api: N edges, M programs (...)" to this log
#   tsan   clang, TSan. clang on purpose: TSan does not model atomic_thread_fence
#          and gcc 12's TSan reports false races on correct fence code; clang 14's does not.
#   consumers  tests/consumers.sh: libatap as its users get it (installs, find_package,
#          pkg-config, add_subdirectory, C and C++ consumers, exported symbols)
#   analysis   tests/analyze.sh: the tree's format (clang-format), cppcheck and
#          clang-tidy (.clang-tidy); any finding fails it (one check in the count)
# ATAP_LOAD=N runs N busy loops beside the whole suite (0 by default), to show
# that it holds on a loaded machine (4 x cores is a heavily loaded one); the
# tests' timeouts and their bounds on lateness then stretch by 1 + N / cores
# (ATAP_TEST_SLACK in tests/CMakeLists.txt), never what they assert exactly.
# Every stage builds with -Werror. ATAP_SUITE="plain asan tsan consumers" picks the stages,
# ATAP_JOBS (default 2) the parallelism. Exits nonzero if any stage fails; the
# last line is "N passed, N failed", CTest's counts summed over the stages (a
# stage that fails to configure or build, or whose tour fails, adds one failure).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_root=${ATAP_BUILD_ROOT:-$root/build}
stages=${ATAP_SUITE:-plain analysis asan tsan consumers}
jobs=${ATAP_JOBS:-2}
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
slack=$((1 + (${ATAP_LOAD:-0} + cores - 1) / cores))

# A sanitizer report must fail the run.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

have() { command -v "$1" >/dev/null 2>&1; }
needs_clang() { [[ " $stages " == *" asan "* || " $stages " == *" tsan "* || " $stages " == *" analysis "* ]]; }
needs_analysis() { [[ " $stages " == *" analysis "* ]]; }

# Can clang build and link both sanitizer flavours and libFuzzer? (Debian 12
# ships the runtimes apart from clang, in libclang-rt-14-dev.)
sanitizers_ok() {
    local tmp rc
    tmp=$(mktemp -d) || return 1
    echo 'int main(void) { return 0; }' >"$tmp/t.c"
    printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
        'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);' \
        'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }' \
        >"$tmp/f.c"
    clang -fsanitize=address,undefined "$tmp/t.c" -o "$tmp/a" 2>/dev/null &&
        clang -fsanitize=thread "$tmp/t.c" -o "$tmp/t" 2>/dev/null &&
        clang -fsanitize=fuzzer,address,undefined "$tmp/f.c" -o "$tmp/f" 2>/dev/null
    rc=$?
    rm -rf "$tmp"
    return $rc
}

install_deps() {
    local missing=() rt_ok=yes sudo=""
    have cmake || missing+=(cmake)
    have make || missing+=(make)
    have gcc || missing+=(gcc)
    have pkg-config || missing+=(pkg-config)
    # The trace checker and the reference check (CTest) are Python; without
    # it they would be skipped, so the suite installs it.
    have python3 || missing+=(python3)
    # valgrind_waits (CTest) runs waits under memcheck where it is found.
    have valgrind || missing+=(valgrind)
    [ -f /usr/include/cmocka.h ] || pkg-config --exists cmocka 2>/dev/null || missing+=(libcmocka-dev)
    if needs_analysis; then
        have clang-format || missing+=(clang-format)
        have clang-tidy || missing+=(clang-tidy)
        have cppcheck || missing+=(cppcheck)
    fi
    if needs_clang; then
        have clang || missing+=(clang)
        have clang && sanitizers_ok || rt_ok=no
    fi
    [ ${#missing[@]} -eq 0 ] && [ $rt_ok = yes ] && return 0

    have apt-get || { echo "run_suite: please install: ${missing[*]} (and clang's sanitizer runtimes)" >&2; return 1; }
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    echo "run_suite: installing ${missing[*]}"
    $sudo apt-get update -q || return 1
    if [ $rt_ok = no ] && apt-cache show libclang-rt-dev >/dev/null 2>&1; then
        missing+=(libclang-rt-dev)
    fi
    $sudo env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null || return 1
    if needs_clang && ! sanitizers_ok; then
        echo "run_suite: clang cannot link -fsanitize=address/thread programs" >&2
        return 1
    fi
}

passed=0
failed=0

# run_stage NAME CC SANITIZER [CMAKE_ARG...]: returns nonzero if anything in
# the stage failed.
run_stage() {
    local name=$1 cc=$2 san=$3 dir=$build_root/$1 ok=0 counts nfail ntotal
    shift 3
    echo "=== $name: $cc, ATAP_SANITIZER=$san $*, build in $dir ==="
    if ! cmake -S "$root" -B "$dir" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DATAP_SANITIZER="$san" -DATAP_WERROR=ON -DATAP_BUILD_TESTS=ON \
        -DATAP_BUILD_EXAMPLES=ON -DATAP_BUILD_BENCH=OFF -DATAP_FAULT_INJECTION=OFF \
        -DATAP_TEST_SLACK="$slack" "$@" ||
        ! cmake --build "$dir" -j "$jobs"; then
        echo "=== $name: configure or build FAILED ==="
        failed=$((failed + 1))
        return 1
    fi
    if [ "$name" = plain ]; then
        "$dir/examples/tour" || { echo "=== $name: examples/tour FAILED ==="; failed=$((failed + 1)); ok=1; }
    fi
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" --no-tests=error 2>&1 | tee "$dir/ctest.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || ok=1
    # libFuzzer's summary (CTest shows a passing test's output only in its own log).
    grep -hE '^fuzz_api: ([0-9]+ edges|libFuzzer FAILED)' "$dir/Testing/Temporary/LastTest.log" 2>/dev/null
    # "83% tests passed, 1 tests failed out of 6"
    counts=$(sed -nE 's/.*tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\1 \2/p' "$dir/ctest.log" | tail -n 1)
    if [ -n "$counts" ]; then
        read -r nfail ntotal <<<"$counts"
        failed=$((failed + nfail))
        passed=$((passed + ntotal - nfail))
    else
        echo "=== $name: no CTest summary ==="
        failed=$((failed + 1))
        ok=1
    fi
    return $ok
}

# The consumers stage: its own script, whose last line is "N passed, N failed".
run_consumers() {
    local log=$build_root/consumers.log counts
    mkdir -p "$build_root"
    echo "=== consumers: tests/consumers.sh ==="
    bash "$root/tests/consumers.sh" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    counts=$(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' "$log" | tail -n 1)
    if [ -n "$counts" ]; then
        read -r p f <<<"$counts"
        passed=$((passed + p))
        failed=$((failed + f))
    else
        failed=$((failed + 1))
        rc=1
    fi
    return $rc
}

# The analysis stage: tests/analyze.sh, one check in the count.
run_analysis() {
    echo "=== analysis: tests/analyze.sh ==="
    if bash "$root/tests/analyze.sh" "$build_root/analyze"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        return 1
    fi
}

# The load, if asked for: busy loops, ended with the script.
loaders=()
stop_load() { [ ${#loaders[@]} -eq 0 ] || kill "${loaders[@]}" 2>/dev/null; }
trap stop_load EXIT
for ((i = 0; i < ${ATAP_LOAD:-0}; i++)); do
    (while :; do :; done) &
    loaders+=($!)
done
[ ${#loaders[@]} -eq 0 ] || echo "run_suite: ${#loaders[@]} busy loops beside the suite (ATAP_LOAD)"

bad_stages=()
install_deps || { echo "run_suite: could not install the test dependencies" >&2; echo "0 passed, 1 failed"; exit 1; }
for stage in $stages; do
    start=$SECONDS
    case $stage in
        plain) run_stage plain gcc none ;;
        asan) run_stage asan clang address -DATAP_BUILD_FUZZER=ON ;;
        tsan) run_stage tsan clang thread ;;
        consumers) run_consumers ;;
        analysis) run_analysis ;;
        *) echo "run_suite: unknown stage '$stage' (plain, analysis, asan, tsan, consumers)" >&2; failed=$((failed + 1)); false ;;
    esac || bad_stages+=("$stage")
    echo "=== $stage: done in $((SECONDS - start)) s ==="
done

if [ ${#bad_stages[@]} -gt 0 ]; then
    echo "run_suite: FAILED stages: ${bad_stages[*]}"
else
    echo "run_suite: all stages passed ($stages)"
fi
echo "$passed passed, $failed failed"
[ ${#bad_stages[@]} -eq 0 ] && [ "$failed" -eq 0 ]
