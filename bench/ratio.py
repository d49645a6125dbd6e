#!/usr/bin/env python3
"""libatap against the peers: one Markdown table from bench/run.sh output.

Usage: python3 bench/ratio.py results.txt [more.txt ...]   (or: ... | python3 bench/ratio.py)
Several files are read as one: the medians are over all their rounds.

For each workload: the median over the repetitions of atap and of every peer,
then atap's ratio to each peer (atap / peer: below 1 means atap is better)
and to the best peer. The figure is ns_per_op for the speed workloads,
bytes_per_task for idle_memory and live_memory, and seconds for timers.
Under each workload's row, a row of the same columns for memory: the median
peak_rss_kb (the whole process's peak RSS) of each runtime, and atap's
ratio to each peer's. atap runs with a setting of their own get rows of
their own, set against the peers' one run: tree and wide_tree with
join=last_first (the peers join in spawn order, as atap's plain row),
timers with start=after (delayed starts instead of parks) or from=spawn, fan
with each workers= (atap only; after the table, the speedup: median seconds
with 1 worker / median seconds with each other count). tree and wide_tree
runs with the same n that disagree on nodes= depth= checksum= are listed
after the table.

HTTP runs (workload http_c<connections>, from bench/http.sh) get a table of
their own: per server the medians of requests/s, p99 latency and the server's
CPU per request, then atap's ratio to the best peer in each (for requests/s
atap / best, higher is better; for the others lower is better): the ratio
of the medians, and, when the lines carry round=, atap's ratio to each
peer within each round, the median over the rounds, against the peer it
fares worst with (the machine's swings from minute to minute, which move
every server alike, cancel within a round).
"""
import fileinput
import os
import statistics
import sys

WORKLOADS = ["spawn_many", "spawn_local", "fib", "chain", "ping_pong", "timers",
             "idle_memory", "tree", "wide_tree", "live_memory", "fan"]
METRIC = {"timers": "seconds", "idle_memory": "bytes_per_task", "live_memory": "bytes_per_task"}
UNIT = {
    "spawn_many": "ns/task", "spawn_local": "ns/task", "fib": "ns/spawned task",
    "chain": "ns/hop", "ping_pong": "ns/round trip", "timers": "wall s",
    "idle_memory": "bytes/parked task", "tree": "ns/node", "wide_tree": "ns/node",
    "live_memory": "bytes/live task", "fan": "ns/child",
}
TREES = ("tree", "wide_tree")
TREE_KEYS = ("nodes", "depth", "checksum")


def setting(d):
    """An atap run's setting that gets a row of its own, or "": a tree's
    join=last_first, fan's workers=, timers' start=after (delayed starts,
    ATAP_BENCH_TIMERS_AFTER) and parks' from=spawn (deadlines counted from
    the spawn, ATAP_BENCH_TIMERS_FROM_SPAWN)."""
    if d.get("join") == "last_first":
        return "join=last_first"
    if d.get("start") == "after":
        return "start=after"
    if d.get("from") == "spawn":
        return "from=spawn"
    if d["workload"] == "fan" and "workers" in d:
        return "workers=" + d["workers"]
    return ""


def parse(lines):
    runs = {}  # (row, peer) -> list of {field: value}; row: "workload [setting]"
    peers = []
    for line in lines:
        if not line.startswith("peer="):
            continue
        d = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if d["peer"] not in peers:
            peers.append(d["peer"])
        row = " ".join(filter(None, (d["workload"], setting(d))))
        runs.setdefault((row, d["peer"]), []).append(d)
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


def fmt(v, key):
    if key == "seconds":
        return f"{v:.3f}"
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def cell(rs, key, reps):
    """(text, value) of the median of field key: value is None when there
    is no figure."""
    if not rs:
        return "—", None
    if "na" in rs[0]:
        return "n/a", None
    ok = [r for r in rs if "status" not in r]
    v = median(ok, key)
    if v is None:
        return rs[0].get("status", "—"), None
    text = fmt(v, key)
    if len(ok) < reps:
        text += f" ({len(ok)})"
    return text, v


HTTP_FIELDS = [("rps", "requests/s", max), ("p99_us", "p99 µs", min),
               ("server_us_per_req", "server CPU µs/request", min)]


def http_table(runs, peers, reps):
    """The HTTP rows, or [] when there are none."""
    loads = sorted({int(w[len("http_c"):]) for w, _ in runs if w.startswith("http_c")})
    if not loads:
        return []
    out = [f"\nHTTP: median of {reps} runs a server; atap / best peer per column "
           "(requests/s: higher is better; the others: lower is better).\n",
           "| connections | server | " + " | ".join(h for _, h, _ in HTTP_FIELDS) + " |",
           "|---:|---|" + "---:|" * len(HTTP_FIELDS)]
    for c in loads:
        meds = {}
        for p in peers:
            ok = [r for r in runs.get((f"http_c{c}", p), []) if "status" not in r]
            if ok:
                meds[p] = {k: median(ok, k) for k, _, _ in HTTP_FIELDS}
                cells = [f"{meds[p][k]:,.0f}" if k != "server_us_per_req" else f"{meds[p][k]:.2f}"
                         for k, _, _ in HTTP_FIELDS]
                if len(ok) < reps:
                    cells[0] += f" ({len(ok)})"
                out.append(f"| {c:,} | {p} | " + " | ".join(cells) + " |")
        others = [p for p in meds if p != "atap"]
        if "atap" in meds and others:
            ratios = []
            for k, _, best_of in HTTP_FIELDS:
                best = best_of(others, key=lambda p: meds[p][k])
                ratios.append(f"{meds['atap'][k] / meds[best][k]:.2f}x ({best})")
            out.append(f"| {c:,} | atap / best | " + " | ".join(ratios) + " |")
            per_peer = round_ratios(runs, f"http_c{c}", others)
            if per_peer:
                cells = []
                for k, _, best_of in HTTP_FIELDS:
                    # the peer atap fares worst against: the best one
                    meds_k = {p: statistics.median(r[k] for r in rs) for p, rs in per_peer.items()}
                    worst = (min if best_of is max else max)(meds_k, key=meds_k.get)
                    cells.append(f"{meds_k[worst]:.2f}x ({worst}, {len(per_peer[worst])})")
                out.append(f"| {c:,} | atap / best, within rounds | " + " | ".join(cells) + " |")
    return out


def round_ratios(runs, w, others):
    """Per peer, per round that ran both atap and it: atap's ratio to that
    peer in each HTTP field. A round's own best peer would be the best of
    several noisy runs, which favours the peers; a ratio to one peer at a
    time, the median over the rounds, is not biased so."""
    by_round = {}
    for p in ["atap"] + others:
        for r in runs.get((w, p), []):
            if "status" not in r and "round" in r:
                by_round.setdefault(r["round"], {})[p] = r
    out = {}
    for rs in by_round.values():
        for p in others:
            if "atap" in rs and p in rs:
                out.setdefault(p, []).append(
                    {k: float(rs["atap"][k]) / float(rs[p][k]) for k, _, _ in HTTP_FIELDS})
    return out


def table_row(runs, row, w, others, key, head, reps):
    """One row of the table: the median of field key for atap's runs of row
    and for each peer's runs of workload w, and atap's ratios to them."""
    atap_text, a = cell(runs.get((row, "atap"), []), key, reps)
    texts, ratios, best = [], [], None
    for p in others:
        t, v = cell(runs.get((w, p), []), key, reps)
        texts.append(t)
        if a is not None and v:
            ratios.append(f"{a / v:.2f}")
            if best is None or v < best[1]:
                best = (p, v)
        else:
            ratios.append("—")
    best_text = f"{a / best[1]:.2f} ({best[0]})" if best else "—"
    return f"| {head} | {atap_text} | " + " | ".join(texts + ratios + [best_text]) + " |"


def fan_speedup(runs, reps):
    """fan: median seconds with 1 worker / median seconds with each other
    count, or [] when fan did not run with 1 worker and another count."""
    secs = {}
    for (row, p), rs in runs.items():
        ok = [r for r in rs if "status" not in r]
        if p == "atap" and row.startswith("fan workers=") and ok:
            secs[int(row[len("fan workers="):])] = (median(ok, "seconds"), len(ok))
    if 1 not in secs or len(secs) < 2:
        return []
    one, k1 = secs[1]
    return ["\nfan speedup (median seconds with 1 worker / with k; higher is better):\n"] + [
        f"- 1 -> {k} workers: {one:.3f} s / {s:.3f} s = {one / s:.2f}x ({k1} and {kk} runs)"
        for k, (s, kk) in sorted(secs.items()) if k != 1]


def main():
    src = fileinput.input(sys.argv[1:])  # every file named, else standard input
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
    if not any(row.split()[0] in WORKLOADS for row, _ in runs):
        out = []  # HTTP runs only
    for w in WORKLOADS:
        rows = sorted({row for row, _ in runs if row.split()[0] == w}, key=lambda r: (r != w, r))
        for row in rows:
            n = next(rs[0]["n"] for (rr, _), rs in runs.items() if rr == row)
            for key, unit in ((METRIC.get(w, "ns_per_op"), UNIT[w]), ("peak_rss_kb", "peak RSS KiB")):
                out.append(table_row(runs, row, w, others, key, f"{row} | {int(n):,} | {unit}", reps))

    out += fan_speedup(runs, reps)
    out += http_table(runs, peers, reps)
    notes = [(w, p, rs[0]["na"]) for (w, p), rs in runs.items() if rs and "na" in rs[0]]
    fails = [(w, p, " ".join(f"{k}={v}" for k, v in r.items() if k not in ("peer", "workload")))
             for (w, p), rs in runs.items() for r in rs if "status" in r]
    for tw in TREES:
        trees = {(p, r["n"], tuple(r.get(k) for k in TREE_KEYS)) for (_, p), rs in runs.items()
                 for r in rs if r["workload"] == tw and "nodes" in r}
        if len({sig for _, _, sig in trees}) > len({n for _, n, _ in trees}):
            out.append(f"\n{tw} MISMATCH (runs with the same n disagree on the tree):\n")
            out += [f"- {p}: n={n} " + " ".join(f"{k}={v}" for k, v in zip(TREE_KEYS, sig))
                    for p, n, sig in sorted(trees)]
    if notes:
        out.append("\nNot applicable:\n")
        out += [f"- {p} / {w}: {why}" for w, p, why in notes]
    if fails:
        out.append("\nFailed or not built:\n")
        out += [f"- {p} / {w}: {why}" for w, p, why in fails]
    print("\n".join(out))


if __name__ == "__main__":
    main()
