#!/usr/bin/env bash
# Usage: bench/run.sh [workload...]
# Builds libatap's atap_bench (Release) and the peer programs of
# ../shared/bench-peers, runs the peers (their run.sh, one run at a time) and
# atap_bench on each workload with the same n, REPS rounds of every runtime
# in turn, prints every result line, and ends with a Markdown table of
# medians and atap's ratio to each peer (bench/ratio.py).
# Before every run, of every runtime, bench/warm_memory writes WARM_MB of
# fresh memory and gives it back, so that each run starts with the same free
# memory, backed by the host (see bench/warm_memory.c: on a VM that reports
# free memory to its host, a first touch otherwise costs what the host
# charges at that moment, and which run pays depended on what ran before).
#   workloads: spawn_many spawn_local fib chain ping_pong timers idle_memory
#              tree wide_tree live_memory fan (the default is all;
#              live_memory and fan are atap only). tree, wide_tree: n = the
#              root's children (2000); every runtime must print the same
#              nodes= depth= checksum= (bench/ratio.py lists a mismatch);
#              the peers' run.sh gives the omp peer its OMP_STACKSIZE=256M
#              for them. fan: n = the children (5000); each round runs it
#              with ATAP_WORKERS=1, then 2 (bench/ratio.py prints the
#              speedup)
#   TREE_JOIN=spawn_order           the order in which atap's tree and
#                                   wide_tree nodes join their children:
#                                   spawn_order (the peers'), last_first, or
#                                   both ("spawn_order last_first": each
#                                   round runs atap once per order)
#   REPS=3                          repetitions
#   PEERS="tbb omp uv tokio naive"  which peers ("" for atap alone)
#   N_<workload>=<size>             e.g. N_fib=25 N_spawn_many=100000
#   TIMEOUT=300                     seconds per run
#   WARM_MB=256                     memory warmed before each run (0: none)
#   ATAP_BENCH_BUILD=build/bench    libatap's build folder
#   PEERS_BUILD=build/bench-peers   the peers' build folder
#   ATAP_BENCH_PEERS_DIR=../shared/bench-peers   the peer harness
# The raw lines are also kept in $ATAP_BENCH_BUILD/results.txt. A "vm" line
# before the runs and one after give the VM's state (bench/README.md).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
peers_dir=${ATAP_BENCH_PEERS_DIR:-$root/../shared/bench-peers}
B=${ATAP_BENCH_BUILD:-$root/build/bench}
export PEERS_BUILD=${PEERS_BUILD:-$root/build/bench-peers}
export REPS=${REPS:-3}
export PEERS=${PEERS-"tbb omp uv tokio naive"}
export TIMEOUT=${TIMEOUT:-300}
WARM_MB=${WARM_MB:-256}
TREE_JOIN=${TREE_JOIN:-spawn_order}
all="spawn_many spawn_local fib chain ping_pong timers idle_memory tree wide_tree live_memory fan"
[ $# -gt 0 ] && workloads="$*" || workloads=$all

for w in $workloads; do
    case " $all " in *" $w "*) ;; *) echo "run.sh: unknown workload $w" >&2; exit 2 ;; esac
done
[ -x "$peers_dir/run.sh" ] || { echo "run.sh: no peer harness at $peers_dir" >&2; exit 1; }

default_n() {
    case $1 in
        fib) echo 30 ;;
        tree|wide_tree) echo 2000 ;;
        fan) echo 5000 ;;
        chain|ping_pong|timers) echo 100000 ;;
        *) echo 1000000 ;;
    esac
}

# The machine, first.
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
grep -qw hypervisor /proc/cpuinfo && cpu="$cpu (VM)"
mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
echo "machine: nproc=$(nproc), CPU \"$cpu\", $mem, $(uname -sr), $(gcc --version | head -1)"
echo "libatap: $(git -C "$root" describe --always --dirty 2>/dev/null || echo "no commit yet")," \
     "REPS=$REPS, PEERS=\"$PEERS\", WARM_MB=$WARM_MB, $(date -u '+%Y-%m-%d %H:%M UTC')"

# Build libatap's bench and the peers (build output goes to logs / stderr).
mkdir -p "$B"
echo "run.sh: building atap_bench in $B (log: $B/build.log)" >&2
if ! { cmake -S "$root" -B "$B" -DCMAKE_BUILD_TYPE=Release -DATAP_BUILD_BENCH=ON \
         -DATAP_BUILD_TESTS=OFF -DATAP_BUILD_EXAMPLES=OFF \
         -DATAP_BENCH_PEERS_DIR="$peers_dir" &&
       cmake --build "$B" --target atap_bench warm_memory -j "$(nproc)"; } >"$B/build.log" 2>&1; then
    tail -n 30 "$B/build.log" >&2
    echo "run.sh: building atap_bench failed" >&2
    exit 1
fi
exe="$B/bench/atap_bench"
[ -x "$exe" ] || { echo "run.sh: atap_bench was not built (see $B/build.log)" >&2; exit 1; }
if [ -n "$PEERS" ]; then
    "$peers_dir/build.sh" >&2 || echo "run.sh: no peer could be built" >&2
fi

# The VM's state, before the runs and after them: a cache line's hand-over
# between two threads, and how often a woken thread waits over 1 ms for a
# CPU while its waker runs on (atap_bench handover and wake_latency,
# bench/README.md). Both move with the VM, and every runtime's rows move
# with them.
vm_state() {
    local ho wl
    ho=$("$exe" handover | grep -oE 'ns_per_op=[0-9.]+' | cut -d= -f2)
    wl=$("$exe" wake_latency 10000 |
         grep -oE '(wake_max_us|over_1ms_per_s)=[0-9.]+' | sed 's/^over/wake_over/' | paste -sd' ')
    echo "vm ($1): handover_ns=${ho:-?} ${wl:-wake_latency=?}"
}
vm_state before

results="$B/results.txt"
: >"$results"
err="$B/atap_bench.err"
warm() { [ "$WARM_MB" -gt 0 ] && "$B/bench/warm_memory" "$WARM_MB"; }
# atap's runs of workload $1 in a round: "atap", or "atap+VAR=value" for a
# run with that setting in its environment.
atap_runs() {
    local j
    case $1 in
        fan) echo "atap+ATAP_WORKERS=1 atap+ATAP_WORKERS=2" ;;
        tree|wide_tree) for j in $TREE_JOIN; do printf 'atap+TREE_JOIN=%s ' "$j"; done ;;
        *) echo atap ;;
    esac
}
# One run of atap_bench ($3: its setting, VAR=value, or nothing), reported
# as the peers' run.sh reports one: its line (na= when not applicable), or
# a status=FAILED line.
run_atap() {
    local out rc
    out=$(env ${3:+"$3"} timeout "$TIMEOUT" "$exe" "$1" "$2" 2>"$err")
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then
        out="peer=atap workload=$1 n=$2 status=FAILED rc=$rc${3:+ env=$3} err=\"$(head -c 200 "$err" | tr '\n' ' ')\""
    fi
    echo "$out"
}
for w in $workloads; do
    var="N_$w"
    n=${!var:-$(default_n "$w")}
    runtimes=$(atap_runs "$w")
    case $w in live_memory|fan) ;; *) runtimes="$PEERS $runtimes" ;; esac
    done_with="" # runtimes that said n/a or failed: not run again
    for ((r = 1; r <= REPS; r++)); do
        for p in $runtimes; do
            case " $done_with " in *" $p "*) continue ;; esac
            warm
            if [ "${p%%+*}" = atap ]; then
                setting=${p#atap}
                out=$(run_atap "$w" "$n" "${setting#+}")
            else
                out=$(env "N_$w=$n" PEERS="$p" REPS=1 "$peers_dir/run.sh" "$w")
            fi
            echo "$out" | tee -a "$results"
            case "$out" in *na=*|*status=*) done_with="$done_with $p" ;; esac
        done
    done
done
rm -f "$err"
vm_state after

echo
python3 "$here/ratio.py" "$results"
