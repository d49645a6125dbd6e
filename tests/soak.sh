#!/usr/bin/env bash
# The soak:   bash tests/soak.sh MINUTES [plain|asan]
#
# Builds tests/soak.c (target soak, linked against atap_testing, the tests'
# copy of the library with fault injection) in build/soak-<mode>, or reuses
# that build, and runs it for MINUTES:
#   plain  gcc, RelWithDebInfo
#   asan   clang, -DATAP_SANITIZER=address (ASan + UBSan); a report fails
#          the run. ASan's quarantine is held to 16 MiB so that the RSS check
#          measures the program, not the sanitizer's free list filling up.
# Exits with soak's status: 0 only if every check held.
#
# How it works (tests/soak.c says it in full). Everything runs at once:
# driver threads spawn and read tasks of every kind test_stress runs (once,
# delayed, timed out, cancelled, repeat, at-rate, waiting tasks fed by
# gives, receive_all / receive_any, channel send and receive tasks, parks
# on pipes and deadlines, sleep tasks, trees of tasks that spawn and join
# children); an echo server on loopback (a parked listener task, a parked
# task per connection) serves client threads that connect, send payloads
# of checked bytes and leave; the manager is made to fall apart every 3 s
# (the supervisor's restart window set to 0, so it always restarts it) and
# a pool thread dies every 5 s. Every output carries its task's tag and a
# checksum (a crossed or torn output is counted), every delay, gap,
# deadline, sleep and timeout is measured against CLOCK_MONOTONIC (early
# ones counted), every wait is bounded at 10 s (a stall), and a watchdog
# fails the run when no operation completes for 10 s. ATAP_EFAILED is
# accepted only from a task whose thread died (the pool's death count moved
# during that operation). Each minute, and at the end, the load pauses, the
# pool goes quiet, and one line gives operations, outputs checked, crossed,
# early, stalls, failures, live tasks, RSS and open fds. At the end RSS must
# be within 10 % + 16 MiB of the second minute's, the fds other than the
# pollers the same, the pollers bounded by the pool's thread records, live
# tasks no more than the listener, and every in_free / elem_free owed run.
#
# The API fuzzer: if this tree has tests/fuzz_api.c (and so a fuzz_api
# target), its plain driver also runs alongside, in a loop of random runs of
# up to 60 s from fresh seeds, for as long as the soak; a failure prints its
# seed and fails this script too. SOAK_FUZZ_SKIP, if set, is passed to CMake
# as ATAP_FUZZ_SKIP (known open bugs the fuzzer leaves unchecked).
# SOAK_SEED fixes the soak's own generator.
set -uo pipefail

minutes=${1:-}
mode=${2:-plain}
if [ -z "$minutes" ] || [ "$#" -gt 2 ]; then
    echo "usage: bash tests/soak.sh MINUTES [plain|asan]" >&2
    exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=$root/build/soak-$mode
case $mode in
    plain) cc=gcc san=none ;;
    asan) cc=clang san=address
        export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:quarantine_size_mb=16
        export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ;;
    *) echo "soak.sh: unknown mode '$mode' (plain, asan)" >&2; exit 2 ;;
esac

fuzz=no
[ -f "$root/tests/fuzz_api.c" ] && fuzz=yes
targets=(soak)
[ $fuzz = yes ] && targets+=(fuzz_api)

mkdir -p "$dir"
if ! cmake -S "$root" -B "$dir" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DATAP_SANITIZER="$san" -DATAP_WERROR=ON -DATAP_BUILD_TESTS=ON -DATAP_BUILD_EXAMPLES=OFF \
    -DATAP_BUILD_BENCH=OFF -DATAP_FAULT_INJECTION=OFF ${SOAK_FUZZ_SKIP+"-DATAP_FUZZ_SKIP=$SOAK_FUZZ_SKIP"} \
    >"$dir/configure.log" 2>&1; then
    echo "soak.sh: configure failed, see $dir/configure.log" >&2
    exit 1
fi
if ! cmake --build "$dir" -j "${ATAP_JOBS:-2}" --target "${targets[@]}"; then
    echo "soak.sh: build failed" >&2
    exit 1
fi

fuzz_pid=
fuzz_status=$dir/fuzz.status
rm -f "$fuzz_status"
if [ $fuzz = yes ]; then
    # Random programs from a fresh seed each round, until the soak's time is up.
    (
        cd "$dir" || exit 1 # a failing program is saved in the current directory
        end=$((SECONDS + $(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')))
        rounds=0 programs=0
        while [ $SECONDS -lt $end ]; do
            left=$((end - SECONDS))
            secs=$((left < 60 ? left : 60))
            [ "$secs" -gt 0 ] || break
            seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
            if ! ATAP_FUZZ_SECONDS= "$dir/tests/fuzz_api" --seconds "$secs" --seed "$seed" >"$dir/fuzz.last.log" 2>&1; then
                echo "soak.sh: fuzz_api FAILED (seed $seed):" >&2
                tail -n 20 "$dir/fuzz.last.log" >&2
                echo "failed seed $seed" >"$fuzz_status"
                exit 1
            fi
            rounds=$((rounds + 1))
            n=$(sed -nE 's/^fuzz_api: ([0-9]+) programs.*/\1/p' "$dir/fuzz.last.log" | tail -n 1)
            programs=$((programs + ${n:-0}))
        done
        echo "ok: $programs random programs in $rounds runs, all promises kept" >"$fuzz_status"
    ) &
    fuzz_pid=$!
    echo "soak.sh: fuzz_api runs alongside (pid $fuzz_pid)"
else
    echo "soak.sh: no tests/fuzz_api.c in this tree: the soak runs without the API fuzzer"
fi

echo "soak.sh: $mode, $minutes minutes, build $dir"
"$dir/tests/soak" "$minutes"
status=$?

if [ -n "$fuzz_pid" ]; then
    wait "$fuzz_pid"
    echo "soak.sh: fuzz_api: $(cat "$fuzz_status" 2>/dev/null || echo 'no status')"
    grep -q '^ok' "$fuzz_status" 2>/dev/null || status=1
fi
echo "soak.sh: exit status $status"
exit $status
