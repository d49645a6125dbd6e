#!/usr/bin/env bash
# The kqueue backend on Linux:   bash tests/kqueue_emu.sh PREFIX [BUILD_DIR]
#
# Builds libatap with ATAP_POLLER=kqueue against a user-space kqueue
# (libkqueue) installed under PREFIX (its include/kqueue/sys/event.h and
# lib/libkqueue.*; src/README.md says how to build one), in BUILD_DIR
# (build/kq by default; reused when it exists), and runs the whole CTest
# suite there. Not a stage of run_suite.sh, nor of CI: libkqueue is no
# dependency of libatap. Exits with ctest's status.
#
# The tests see ATAP_POLLER_EMULATED and check libkqueue's behaviour where
# it differs from a kernel's kqueue, printing a line that starts with
# "emulated kqueue:" each time (tests/test_util.h lists those places);
# the summary at the end counts them.
set -euo pipefail

if [[ $# -lt 1 || ! -d "$1" ]]; then
    echo "usage: bash tests/kqueue_emu.sh LIBKQUEUE_PREFIX [BUILD_DIR]" >&2
    exit 2
fi
prefix=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${2:-$root/build/kq}
jobs=${ATAP_JOBS:-2}

if [[ ! -f "$prefix/include/kqueue/sys/event.h" && ! -f "$prefix/include/sys/event.h" ]]; then
    echo "kqueue_emu: no sys/event.h under $prefix/include" >&2
    exit 2
fi
cmake -S "$root" -B "$dir" -DATAP_POLLER=kqueue -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATAP_BUILD_TESTS=ON -DATAP_WERROR=ON >/dev/null
cmake --build "$dir" -j "$jobs"
rc=0
ctest --test-dir "$dir" -j "$jobs" --output-on-failure || rc=$?
log="$dir/Testing/Temporary/LastTest.log"
if [[ -f "$log" ]]; then
    echo "kqueue_emu: $(grep -c '^emulated kqueue:' "$log" || true) check(s) took libkqueue's behaviour:"
    grep '^emulated kqueue:' "$log" | sort | uniq -c || true
fi
exit "$rc"
