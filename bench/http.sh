#!/usr/bin/env bash
# Usage: bench/http.sh
# examples/http_hello beside the HTTP servers of ../shared/bench-peers/http
# (a hand-written epoll loop, libuv, Tokio) under wrk, measured by the
# peers' own http/run.sh: ROUNDS rounds, each running every server once at
# each connection count, in an order that turns by one server a round (so
# that no server always follows the same one). Prints every result line and
# ends with a Markdown table of medians and atap's ratios to the best peer
# (bench/ratio.py). On a shared machine one run of a server says little
# (the same server's requests/s moves by half from minute to minute, and
# every server with it), so each line carries its round, and beside the
# ratio of the medians ratio.py takes atap's ratio to each peer within each
# round, the median over the rounds, against the peer atap fares worst with.
#   ROUNDS=5                rounds
#   DURATION=5              seconds of wrk a run
#   CONNS="100 1000"        wrk connection counts
#   SERVERS="epoll uv tokio atap"   atap: examples/http_hello
#   SERVER_CMD_<name>=...   another server, as http/run.sh takes it (add
#                           <name> to SERVERS): e.g. a second build of
#                           http_hello, to compare two libatap commits
#   ATAP_HTTP_BUILD=build/bench-http   libatap's build folder
#   PEERS_BUILD=build/bench-peers      the peers' build folder
#   ATAP_BENCH_PEERS_DIR=../shared/bench-peers   the peer harness
# The raw lines are also kept in $ATAP_HTTP_BUILD/results.txt.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
peers_dir=${ATAP_BENCH_PEERS_DIR:-$root/../shared/bench-peers}
B=${ATAP_HTTP_BUILD:-$root/build/bench-http}
export PEERS_BUILD=${PEERS_BUILD:-$root/build/bench-peers}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-5}
CONNS=${CONNS:-"100 1000"}
read -r -a servers <<<"${SERVERS:-epoll uv tokio atap}"

[ -x "$peers_dir/http/run.sh" ] || { echo "http.sh: no peer harness at $peers_dir/http" >&2; exit 1; }

cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
grep -qw hypervisor /proc/cpuinfo && cpu="$cpu (VM)"
echo "machine: nproc=$(nproc), CPU \"$cpu\", $(uname -sr), $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "libatap: $(git -C "$root" describe --always --dirty 2>/dev/null || echo "no commit yet")," \
     "ROUNDS=$ROUNDS, DURATION=${DURATION}s, SERVERS=\"${servers[*]}\", $(date -u '+%Y-%m-%d %H:%M UTC')"

# http_hello at -O2 -g, as the peers are built at -O2.
mkdir -p "$B"
echo "http.sh: building http_hello in $B (log: $B/build.log)" >&2
if ! { cmake -S "$root" -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATAP_BUILD_TESTS=OFF &&
       cmake --build "$B" --target http_hello -j "$(nproc)"; } >"$B/build.log" 2>&1; then
    tail -n 30 "$B/build.log" >&2
    echo "http.sh: building http_hello failed" >&2
    exit 1
fi
export SERVER_CMD_atap=${SERVER_CMD_atap:-"$B/examples/http_hello --port {port} --threads {threads}"}
"$peers_dir/build.sh" >&2 || echo "http.sh: no peer could be built" >&2

results="$B/results.txt"
: >"$results"
n=${#servers[@]}
for ((r = 0; r < ROUNDS; r++)); do
    for c in $CONNS; do
        for ((i = 0; i < n; i++)); do
            s=${servers[(i + r) % n]}
            SERVERS=$s CONNS=$c REPS=1 DURATION=$DURATION "$peers_dir/http/run.sh" 2>/dev/null |
                sed "s/\$/ round=$((r + 1))/" | tee -a "$results"
        done
    done
done

echo
REPS=$ROUNDS python3 "$here/ratio.py" "$results"
