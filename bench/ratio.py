#!/usr/bin/env python3
"""libatap against the peers: one Markdown table from bench/run.sh output.

Usage: python3 bench/ratio.py results.txt   (or: ... | python3 bench/ratio.py)

For each workload: the median over the repetitions of atap and of every peer,
then atap's ratio to each peer (atap / peer: below 1 means atap is better)
and to the best peer. The figure is ns_per_op for the speed workloads,
bytes_per_task for idle_memory and live_memory, and seconds for timers.
tree runs that disagree on nodes= depth= checksum= are listed after the table.
"""
import os
import statistics
import sys

WORKLOADS = ["spawn_many", "spawn_local", "fib", "chain", "ping_pong", "timers",
             "idle_memory", "tree", "live_memory"]
METRIC = {"timers": "seconds", "idle_memory": "bytes_per_task", "live_memory": "bytes_per_task"}
UNIT = {
    "spawn_many": "ns/task", "spawn_local": "ns/task", "fib": "ns/spawned task",
    "chain": "ns/hop", "ping_pong": "ns/round trip", "timers": "wall s",
    "idle_memory": "bytes/parked task", "tree": "ns/node", "live_memory": "bytes/live task",
}
TREE_KEYS = ("nodes", "depth", "checksum")


def parse(lines):
    runs = {}  # (workload, peer) -> list of {field: value}
    peers = []
    for line in lines:
        if not line.startswith("peer="):
            continue
        d = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if d["peer"] not in peers:
            peers.append(d["peer"])
        runs.setdefault((d["workload"], d["peer"]), []).append(d)
    # atap first, the peers in the order they ran
    peers.sort(key=lambda p: p != "atap")
    return runs, peers


def median(rs, key):
    """The median of one field over the runs, or None when there is none."""
    vals = []
    for r in rs:
        try:
            vals.append(float(r[key]))
        except (KeyError, ValueError):
            pass
    return statistics.median(vals) if vals else None


def fmt(v, w):
    if w == "timers":
        return f"{v:.3f}"
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def cell(rs, w, reps):
    """(text, value): value is None when there is no figure."""
    if not rs:
        return "—", None
    if "na" in rs[0]:
        return "n/a", None
    ok = [r for r in rs if "status" not in r]
    v = median(ok, METRIC.get(w, "ns_per_op"))
    if v is None:
        return rs[0].get("status", "—"), None
    text = fmt(v, w)
    if len(ok) < reps:
        text += f" ({len(ok)})"
    return text, v


def main():
    src = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin
    runs, peers = parse(src)
    others = [p for p in peers if p != "atap"]
    reps = int(os.environ.get("REPS", "0")) or max((len(rs) for rs in runs.values()), default=1)

    head = ["workload", "n", "unit", "atap"] + others + [f"atap/{p}" for p in others] + ["atap/best peer"]
    out = [
        f"Median of {reps} runs; ratio = atap / peer, lower is better "
        "(a count in parentheses: fewer runs succeeded).\n",
        "| " + " | ".join(head) + " |",
        "|---|---:|---|" + "---:|" * (len(head) - 3),
    ]
    for w in WORKLOADS:
        if not any(k[0] == w for k in runs):
            continue
        n = next(rs[0]["n"] for (ww, _), rs in runs.items() if ww == w)
        atap_text, a = cell(runs.get((w, "atap"), []), w, reps)
        texts, ratios, best = [], [], None
        for p in others:
            t, v = cell(runs.get((w, p), []), w, reps)
            texts.append(t)
            if a is not None and v:
                ratios.append(f"{a / v:.2f}")
                if best is None or v < best[1]:
                    best = (p, v)
            else:
                ratios.append("—")
        best_text = f"{a / best[1]:.2f} ({best[0]})" if best else "—"
        out.append(f"| {w} | {int(n):,} | {UNIT[w]} | {atap_text} | " +
                   " | ".join(texts + ratios + [best_text]) + " |")

    notes = [(w, p, rs[0]["na"]) for (w, p), rs in runs.items() if rs and "na" in rs[0]]
    fails = [(w, p, " ".join(f"{k}={v}" for k, v in r.items() if k not in ("peer", "workload")))
             for (w, p), rs in runs.items() for r in rs if "status" in r]
    trees = {(p, tuple(r.get(k) for k in TREE_KEYS)) for (w, p), rs in runs.items()
             if w == "tree" for r in rs if "nodes" in r}
    if len({sig for _, sig in trees}) > 1:
        out.append("\ntree MISMATCH (runtimes disagree on the tree):\n")
        out += [f"- {p}: " + " ".join(f"{k}={v}" for k, v in zip(TREE_KEYS, sig))
                for p, sig in sorted(trees)]
    if notes:
        out.append("\nNot applicable:\n")
        out += [f"- {p} / {w}: {why}" for w, p, why in notes]
    if fails:
        out.append("\nFailed or not built:\n")
        out += [f"- {p} / {w}: {why}" for w, p, why in fails]
    print("\n".join(out))


if __name__ == "__main__":
    main()
