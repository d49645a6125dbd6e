#!/usr/bin/env python3
"""Checks that a trace libatap wrote opens whole in the viewers.

    python3 tests/trace_check.py TRACE.json [TRACE.json ...]
    python3 tests/trace_check.py --self-test

Exit status 0 when every file passes, 1 when one does not (each problem is
printed with the event it is about), 2 on a usage error.

The rules are those of the Trace Event Format (the "Trace Event Format"
document of the Chromium catapult project, which chrome://tracing, Chrome
DevTools and ui.perfetto.dev read), narrowed to what libatap writes and
tightened where the two viewers bind events more strictly than the document
says:

 1. The file is JSON as a whole: the JSON Object Format, an object whose
    "traceEvents" is an array of events. The document lets the JSON Array
    Format lose its closing "]"; this checker relies on no such tolerance.
 2. Every event has "ph". Every event but a metadata one ("M") has a
    numeric "ts" (microseconds) and numeric "pid" and "tid".
 3. Events need not be in time order in the file (the document says so);
    each thread's events (same pid and tid) are taken in time order, ties in
    file order, as the viewers sort them.
 4. Duration events: each "E" ends the innermost slice open on its thread,
    which must be a "B", not earlier than it, with the same "name" and
    "cat" (Chrome's parser refuses an "E" without a name; Perfetto matches
    an "E" by name and category). No "B" is left open at the end of the file
    (the document allows that; a libatap trace closes every slice).
 5. Complete events ("X") have a "dur" of at least 0 and nest: an "X"
    inside a slice ends no later than that slice does.
 6. Instant events ("i") have a scope "s" of "g", "p" or "t"; a thread
    instant is a slice of no length on its thread (as Perfetto imports it).
 7. Flow events ("s", "t", "f") carry "id", "cat" and "name", and a flow is
    the events with the same id, cat and name (how both viewers group
    them). Each flow has exactly one "s" and one "f", the "f" no earlier
    than the "s", and no "t": one arrow per pair, no arrow that shares an
    end with another of the same id.
 8. A flow event binds to a slice: the document binds an "s" to the
    enclosing slice, and an "f" with "bp":"e" to the enclosing slice (without
    it, to the next one; libatap always writes "bp":"e"). Perfetto takes the
    innermost slice open on the thread at that moment; Chrome DevTools takes
    the event of the same pid, tid, cat and ts. So each flow event's
    innermost open slice must start at the flow event's ts and have its cat.
 9. Metadata: a "process_name" for each pid, and a "thread_name" for every
    thread that has an event, each with args.name a string.
"""
import json
import sys

SLICE_PHASES = ("B", "E", "X", "i", "I")
FLOW_PHASES = ("s", "t", "f")


class Problems:
    def __init__(self, path):
        self.path = path
        self.items = []

    def add(self, what, event=None):
        where = "" if event is None else ": " + json.dumps(event, sort_keys=True)[:300]
        self.items.append("%s: %s%s" % (self.path, what, where))


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_events(events, problems):
    lanes = {}
    named_threads = set()
    named_processes = set()
    flows = {}
    for order, ev in enumerate(events):
        if not isinstance(ev, dict) or not isinstance(ev.get("ph"), str):
            problems.add("an event without a phase", ev)
            continue
        ph = ev["ph"]
        if ph == "M":
            args = ev.get("args")
            if not isinstance(args, dict) or not isinstance(args.get("name"), str):
                problems.add("a metadata event without args.name", ev)
            elif ev.get("name") == "thread_name":
                named_threads.add((ev.get("pid"), ev.get("tid")))
            elif ev.get("name") == "process_name":
                named_processes.add(ev.get("pid"))
            continue
        if not (is_num(ev.get("ts")) and is_num(ev.get("pid")) and is_num(ev.get("tid"))):
            problems.add("an event without a numeric ts, pid or tid", ev)
            continue
        if ph == "i" or ph == "I":
            if ev.get("s", "t") not in ("g", "p", "t"):
                problems.add("an instant with an unknown scope", ev)
            if ev.get("s", "t") != "t":
                continue  # not on a thread
        lanes.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], order, ev))
        if ph in FLOW_PHASES:
            if "id" not in ev or not isinstance(ev.get("cat"), str) or \
                    not isinstance(ev.get("name"), str):
                problems.add("a flow event without id, cat or name", ev)
                continue
            flows.setdefault((ev["cat"], ev["name"], str(ev["id"])), []).append(ev)

    for key, evs in sorted(flows.items()):
        phases = sorted(e["ph"] for e in evs)
        if phases != ["f", "s"]:
            problems.add("flow %s has phases %s, not one s and one f" % (key, phases), evs[0])
            continue
        s = next(e for e in evs if e["ph"] == "s")
        f = next(e for e in evs if e["ph"] == "f")
        if f["ts"] < s["ts"]:
            problems.add("flow %s ends before it starts" % (key,), f)
        if f.get("bp") != "e":
            problems.add("a flow end not bound to its enclosing slice (bp e)", f)

    for (pid, tid), evs in lanes.items():
        if (pid, tid) not in named_threads:
            problems.add("thread %s of process %s has no thread_name" % (tid, pid))
        if pid not in named_processes:
            problems.add("process %s has no process_name" % (pid,))
        evs.sort(key=lambda item: (item[0], item[1]))
        check_lane(evs, problems)


def check_lane(evs, problems):
    # The open slices, innermost last: [ph, start, end (None for a B), event].
    stack = []

    def close_ended(ts):
        # A complete slice (X, thread instant) is closed by the first slice
        # event at or past its end, as Perfetto's slice tracker does.
        while stack and stack[-1][2] is not None and ts >= stack[-1][2]:
            stack.pop()

    for ts, _, ev in evs:
        ph = ev["ph"]
        if ph in FLOW_PHASES:
            if not stack:
                problems.add("a flow event outside every slice", ev)
                continue
            top = stack[-1]
            if top[1] != ts or top[3].get("cat") != ev.get("cat"):
                problems.add("a flow event whose innermost slice does not start at its ts "
                             "with its cat (bound to: %s)" % json.dumps(top[3])[:200], ev)
            continue
        close_ended(ts)
        if ph == "B":
            stack.append(["B", ts, None, ev])
        elif ph == "E":
            if not stack or stack[-1][0] != "B":
                problems.add("an E with no B open on its thread"
                             + (" (a complete slice inside ends after it)" if stack else ""), ev)
                continue
            b = stack.pop()[3]
            if not isinstance(ev.get("name"), str) or ev.get("name") != b.get("name"):
                problems.add("an E not named as its B (%r)" % (b.get("name"),), ev)
            if ev.get("cat") != b.get("cat"):
                problems.add("an E whose cat is not its B's (%r)" % (b.get("cat"),), ev)
        elif ph == "X":
            dur = ev.get("dur")
            if not is_num(dur) or dur < 0:
                problems.add("a complete event without a dur of 0 or more", ev)
                continue
            stack.append(["X", ts, ts + dur, ev])
        elif ph in ("i", "I"):
            stack.append(["i", ts, ts, ev])
    close_ended(float("inf"))
    for entry in stack:
        problems.add("a slice left open at the end of the file", entry[3])


def check_text(text, path):
    problems = Problems(path)
    try:
        doc = json.loads(text)
    except ValueError as e:
        problems.add("not JSON (%s)" % e)
        return problems.items
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        problems.add("not an object with a traceEvents array")
        return problems.items
    check_events(doc["traceEvents"], problems)
    return problems.items


def check_file(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        return ["%s: cannot read (%s)" % (path, e)]
    return check_text(text, path)


def self_test():
    """The checker refuses what it must: each case is a small trace and
    whether it passes."""
    def ev(ph, ts, tid=1, **kw):
        d = {"ph": ph, "ts": ts, "pid": 1, "tid": tid}
        d.update(kw)
        return d

    meta = [ev("M", 0, name="process_name", args={"name": "p"}),
            ev("M", 0, name="thread_name", args={"name": "t1"}),
            ev("M", 0, tid=2, name="thread_name", args={"name": "t2"})]
    b = dict(name="run", cat="atap")
    good = meta + [
        ev("B", 1, **b), ev("X", 2, dur=0, name="spawn", cat="atap"),
        ev("E", 5, **b),
        ev("B", 6, tid=2, **b), ev("E", 7, tid=2, **b),
        # flows written after the slices they bind to, out of time order
        ev("s", 2, name="spawn", cat="atap", id="0x1"),
        ev("f", 6, tid=2, name="spawn", cat="atap", id="0x1", bp="e"),
    ]
    cases = [
        ("good", good, True),
        ("truncated", None, False),
        ("unnamed E", meta + [ev("B", 1, **b), ev("E", 2)], False),
        ("E named otherwise", meta + [ev("B", 1, **b), ev("E", 2, name="x", cat="atap")], False),
        ("B left open", meta + [ev("B", 1, **b)], False),
        ("E without B", meta + [ev("E", 1, **b)], False),
        ("X overlapping its parent's end",
         meta + [ev("B", 1, **b), ev("X", 2, dur=5, name="x", cat="atap"), ev("E", 3, **b)],
         False),
        ("flow of another cat", meta + [
            ev("B", 1, **b), ev("E", 5, **b), ev("B", 6, tid=2, **b), ev("E", 7, tid=2, **b),
            ev("s", 1, name="spawn", cat="spawn", id="0x1"),
            ev("f", 6, tid=2, name="spawn", cat="spawn", id="0x1", bp="e")], False),
        ("flow inside a slice it does not start with", meta + [
            ev("B", 1, **b), ev("E", 5, **b), ev("B", 6, tid=2, **b), ev("E", 7, tid=2, **b),
            ev("s", 3, name="spawn", cat="atap", id="0x1"),
            ev("f", 6, tid=2, name="spawn", cat="atap", id="0x1", bp="e")], False),
        ("flow without end", meta + [ev("B", 1, **b), ev("E", 5, **b),
                                     ev("s", 1, name="spawn", cat="atap", id="0x1")], False),
        ("two ends for one start", meta + [
            ev("B", 1, **b), ev("E", 5, **b), ev("B", 6, tid=2, **b), ev("E", 7, tid=2, **b),
            ev("B", 8, tid=2, **b), ev("E", 9, tid=2, **b),
            ev("s", 1, name="spawn", cat="atap", id="0x1"),
            ev("f", 6, tid=2, name="spawn", cat="atap", id="0x1", bp="e"),
            ev("f", 8, tid=2, name="spawn", cat="atap", id="0x1", bp="e")], False),
        ("flow end to the next slice", meta + [
            ev("B", 1, **b), ev("E", 5, **b), ev("B", 6, tid=2, **b), ev("E", 7, tid=2, **b),
            ev("s", 1, name="spawn", cat="atap", id="0x1"),
            ev("f", 6, tid=2, name="spawn", cat="atap", id="0x1")], False),
        ("unnamed thread", [meta[0]] + [ev("B", 1, **b), ev("E", 2, **b)], False),
    ]
    failed = 0
    for name, events, want in cases:
        if events is None:
            text = json.dumps({"traceEvents": good})[:-3]
        else:
            text = json.dumps({"traceEvents": events})
        got = check_text(text, name)
        if (not got) != want:
            failed += 1
            print("self-test %r: expected %s, got %s" % (name, "pass" if want else "problems",
                                                        got or "a pass"))
    print("trace_check self-test: %d passed, %d failed" % (len(cases) - failed, failed))
    return 1 if failed else 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    if not argv or any(a.startswith("-") for a in argv):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    bad = 0
    for path in argv:
        problems = check_file(path)
        for p in problems[:50]:
            print(p)
        if len(problems) > 50:
            print("%s: ... %d problems in all" % (path, len(problems)))
        if problems:
            bad += 1
        else:
            print("%s: ok" % path)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
