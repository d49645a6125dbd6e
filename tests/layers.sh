#!/usr/bin/env bash
# The layer check:   bash tests/layers.sh [SRC_DIR [ARCHIVE]]
#
# Reads the `#include "..."` lines of src/ and fails when
#   - a file is not in the map below (a new file names its layer here, or
#     matches one of its names with a *: park_*.c),
#   - a file includes a header of a layer above its own,
#   - the modules' includes form a cycle (within a layer too), or
#   - a built-in task (tasks/) includes more than atap.h, the headers
#     every layer may use and the tasks' own headers (tasks/*.h),
# except for the edges listed under UPWARD, the calls that still go up a
# layer by name (src/README.md says which and why). That list only
# shrinks: an entry whose include is gone fails the check until it is
# taken out, so a fixed edge cannot come back unnoticed.
#
# Given ARCHIVE, a static library of src/ (the tests' libatap_testing.a),
# it also reads its symbols (nm) and fails when an object uses an atap_ or
# atap__ symbol (a call, a variable) defined by an object of a layer above
# its own: an include alone cannot show a function declared low and
# defined high. The observers (faults.c, trace.c) are excepted: every
# layer calls their hooks. LAYERS_PLANT="OBJECT SYMBOL" adds a use, so that
# the check can be shown to catch one (CTest test_layers_catches).
#
# src/README.md describes the layers; this map is the one they are checked
# against. Layer 0 is what every file may include (the public header and
# abi.h, its versioned structs' reader; the atomics, fault injection, the
# test hooks, the trace hooks); faults.c and trace.c sit on top, since they
# observe every layer.
set -uo pipefail

src=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../src" && pwd)}
archive=${2:-}

# LAYER MODULE FILE...
map='
0 api       atap.h
0 abi       abi.h
0 atomics   atomics.h
0 faults    faults.h
0 testing   testing.h
0 trace     trace.h
0 inotify   inotify_changes.h
1 wait      wait.h wait.c
1 cpus      cpus.h cpus.c
1 fiber     fiber.h fiber.c
2 table     slot.h table.h table.c handle.h
3 queues    deque.h injector.h injector.c
3 timer     timer.h timer.c
3 poller    poller.h poller_epoll.c poller_kqueue.c poller_poll.c
3 hub       hub.h hub.c
4 pool      pool.h pool_int.h pool.c pool_grow.c pool_recover.c pool_life.c pool_io.c help.c pool_aside.c
5 executor  executor.h extras.h side.h executor.c spawn.c
5 executor  read.c join.c
6 park      park.h park.c park_*.h park_*.c sources.c
6 kwait     kwait.c
6 schedule  schedule.h schedule_int.h schedule.c schedule_read.c rate.c
6 dataflow  dataflow.h dataflow_int.h gate.c forward.c settle.c
7 manager   manager.h manager.c
8 runtime   runtime.c
9 tasks     tasks/sleep.c tasks/channel.c tasks/process.c tasks/process_start.c tasks/process_kill.c tasks/process_int.h tasks/signal.c tasks/net.c tasks/net_sock.c tasks/net_int.h tasks/fs.c tasks/fs_file.c tasks/fs_int.h tasks/fs_watch.c
10 observe  faults.c trace.c
'

# A name with a * stands for every file of src/ it matches: a park kind's
# own file (park_<kind>.c, src/README.md's recipe) is in the park layer
# without a line here.
map=$(printf '%s\n' "$map" | while read -r line; do
    set -f
    # shellcheck disable=SC2086 # split into words, unglobbed
    set -- $line
    set +f
    [ $# -ge 3 ] || continue
    out="$1 $2"
    shift 2
    for w; do
        case $w in
        *'*'*) for f in $(cd "$src" && compgen -G "$w"); do out="$out $f"; done ;;
        *) out="$out $w" ;;
        esac
    done
    echo "$out"
done)

# FILE HEADER: the includes that still go up a layer, or that tie two
# modules of one layer in a circle, by name.
upward='
'

# The includes, as "FILE HEADER" lines; a tasks/ include of ../x.h names x.h,
# and one of x.h beside it (tasks/x.h) names tasks/x.h.
includes=$(cd "$src" && for f in *.c *.h tasks/*.c tasks/*.h; do
    [ -e "$f" ] || continue
    sed -nE 's/^[[:space:]]*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1/p' "$f" |
        while read -r h; do
            case $f:$h in tasks/*:*/*) ;; tasks/*) [ ! -e "tasks/$h" ] || h=tasks/$h ;; esac
            echo "$f ${h#../}"
        done
done)
files=$(cd "$src" && ls *.c *.h tasks/*.c tasks/*.h 2>/dev/null)

awk -v map="$map" -v upward="$upward" -v files="$files" -v includes="$includes" '
function fail(msg) { print "layers: " msg; bad = 1 }
BEGIN {
    n = split(map, lines, "\n")
    for (i = 1; i <= n; i++) {
        k = split(lines[i], w, " ")
        if (k < 3) continue
        for (j = 3; j <= k; j++) { layer[w[j]] = w[1] + 0; module[w[j]] = w[2] }
        modlayer[w[2]] = w[1] + 0
    }
    n = split(upward, lines, "\n")
    for (i = 1; i <= n; i++)
        if (split(lines[i], w, " ") == 2) { allowed[w[1] " " w[2]] = 1; used[w[1] " " w[2]] = 0 }
    n = split(files, fl, "\n")
    nfiles = 0
    for (i = 1; i <= n; i++)
        if (fl[i] != "" && ++nfiles && !(fl[i] in layer))
            fail(fl[i] " is in no layer: add it to the map in tests/layers.sh and to src/README.md")
    n = split(includes, lines, "\n")
    for (i = 1; i <= n; i++) {
        if (split(lines[i], w, " ") != 2) continue
        f = w[1]; h = w[2]
        if (!(h in layer)) continue # a system header spelled with quotes: not ours
        if (!(f in layer)) continue
        key = f " " h
        if (key in allowed) { used[key] = 1; continue }
        if (layer[h] > layer[f])
            fail(f " (layer " layer[f] ", " module[f] ") includes " h " (layer " layer[h] ", " module[h] ")")
        if (module[f] == "tasks" && layer[h] != 0 && module[h] != "tasks")
            fail(f " is a built-in task: atap.h and layer 0 only, not " h)
        if (module[f] != module[h]) edge[module[f] " " module[h]] = 1
    }
    for (key in used)
        if (!used[key])
            fail("\"" key "\" is listed under UPWARD but no longer included: take it out")
    # A cycle among the modules: depth-first, three colours.
    for (e in edge) { split(e, w, " "); succ[w[1]] = succ[w[1]] " " w[2] }
    for (m in modlayer) colour[m] = 0
    for (m in modlayer) if (colour[m] == 0) visit(m, m)
    if (!bad) print "layers: ok (" nfiles " files, " length(allowed) " upward includes left)"
    exit bad
}
function visit(m, path,    k, i, s, nx) {
    colour[m] = 1
    k = split(succ[m], s, " ")
    for (i = 1; i <= k; i++) {
        nx = s[i]
        if (colour[nx] == 1) fail("the modules include each other in a circle: " path " -> " nx)
        else if (colour[nx] == 0) visit(nx, path " -> " nx)
    }
    colour[m] = 2
}
'
rc=$?

# The symbols: "OBJECT SYMBOL" lines of what each object defines and uses.
if [ -n "$archive" ]; then
    command -v nm >/dev/null 2>&1 || { echo "layers: nm not found, symbols not checked"; exit $rc; }
    [ -f "$archive" ] || { echo "layers: no archive $archive"; exit 1; }
    sym() { nm -A "$@" "$archive" 2>/dev/null |
        awk '$NF ~ /^atap_/ { n = split($1, p, ":"); print p[n - 1], $NF }'; }
    defs=$(nm -A --defined-only "$archive" 2>/dev/null |
        awk '$NF ~ /^atap_/ && $(NF - 1) ~ /^[A-Z]$/ { n = split($1, p, ":"); print p[n - 1], $NF }')
    uses=$(sym -u)
    [ -z "${LAYERS_PLANT:-}" ] || uses=$(printf '%s\n%s' "$uses" "$LAYERS_PLANT")
    awk -v map="$map" -v defs="$defs" -v uses="$uses" '
    function fail(msg) { print "layers: " msg; bad = 1 }
    # An object of the library, by the file it was built from (spawn.c.o:
    # spawn.c; net.c.o: tasks/net.c).
    function file_of(o,    f) { f = o; sub(/\.o(bj)?$/, "", f); return (f in layer) ? f : ("tasks/" f) }
    BEGIN {
        n = split(map, lines, "\n")
        for (i = 1; i <= n; i++) {
            k = split(lines[i], w, " ")
            for (j = 3; j <= k; j++) { layer[w[j]] = w[1] + 0; module[w[j]] = w[2] }
        }
        n = split(defs, lines, "\n")
        for (i = 1; i <= n; i++)
            if (split(lines[i], w, " ") == 2) def[w[2]] = file_of(w[1])
        n = split(uses, lines, "\n")
        for (i = 1; i <= n; i++) {
            if (split(lines[i], w, " ") != 2 || !(w[2] in def)) continue
            f = file_of(w[1]); d = def[w[2]]; nuses++
            if (!(f in layer) || !(d in layer) || module[d] == "observe") continue
            if (layer[d] > layer[f])
                fail(f " (layer " layer[f] ", " module[f] ") uses " w[2] ", defined in " d \
                     " (layer " layer[d] ", " module[d] ")")
        }
        if (!bad) print "layers: symbols ok (" nuses " uses of the library'"'"'s own symbols)"
        exit bad
    }' || rc=1
fi
exit $rc
