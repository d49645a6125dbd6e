#!/usr/bin/env bash
# fuzz_api under libFuzzer for a short while, from the committed corpus:
#   bash tests/libfuzzer.sh FUZZER CORPUS WORKDIR SECONDS
# CTest's fuzz_api_libfuzzer (builds with ATAP_BUILD_FUZZER=ON: run_suite.sh's
# asan stage). FUZZER is the fuzz_api_libfuzzer program, CORPUS the committed
# corpus (tests/corpus/fuzz_api; read, never written), WORKDIR where the
# programs found on the way go (emptied first; a failing program is saved
# beside it as WORKDIR-crash-*). It runs for SECONDS, or $ATAP_FUZZ_SECONDS
# when set (as the plain driver does), plus whatever loading the corpus takes
# beyond that, and ends with one line, which run_suite.sh copies to its log:
#   fuzz_api: N edges, M programs (E edges from the K committed programs, S s, peak RSS R MB)
# N and E are libFuzzer's `cov:` (edges of the instrumented library and
# driver reached), M its corpus at the end. Exits nonzero if libFuzzer
# stopped on a broken promise, a sanitizer report, a hang or its RSS limit,
# or printed no coverage.
set -uo pipefail

[ $# -eq 4 ] || { echo "usage: libfuzzer.sh FUZZER CORPUS WORKDIR SECONDS" >&2; exit 2; }
fuzzer=$1 corpus=$2 work=$3 seconds=${ATAP_FUZZ_SECONDS:-$4}
log=$work.log

rm -rf "$work" "$work"-crash-* "$work"-leak-* "$work"-timeout-* "$work"-oom-* &&
    mkdir -p "$work" || exit 2
committed=$(find "$corpus" -maxdepth 1 -type f ! -name '.*' | wc -l)

# The log goes to a file (libFuzzer prints a line for every program it
# keeps); only its summary and, on a failure, its tail are printed here.
"$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work-" "$work" "$corpus" >"$log" 2>&1
rc=$?

# "#412	INITED cov: 3305 ft: 13120 corp: 398/60Kb exec/s: 0 rss: 61Mb"
field() { sed -nE "s/.* $1: ([0-9]+).*/\1/p" <<<"$2"; }
inited=$(grep -m 1 -E '^#[0-9]+[[:space:]]+INITED ' "$log")
last=$(grep -E '^#[0-9]+[[:space:]]+[A-Z]+ +cov: ' "$log" | tail -n 1)
edges=$(field cov "$last")
programs=$(sed -nE 's/.* corp: ([0-9]+)\/.*/\1/p' <<<"$last")
peak=$(sed -nE 's/^stat::peak_rss_mb:[[:space:]]*([0-9]+).*/\1/p' "$log" | tail -n 1)

if [ "$rc" -ne 0 ] || [ -z "$edges" ]; then
    tail -n 60 "$log"
    echo "fuzz_api: libFuzzer FAILED (status $rc; whole log: $log; the program, if saved: $work-crash-*)"
    exit 1
fi
echo "fuzz_api: $edges edges, $programs programs ($(field cov "$inited") edges from the" \
    "$committed committed programs, $seconds s, peak RSS ${peak:-?} MB)"
