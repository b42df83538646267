#!/usr/bin/env python3
"""bench-amqp-table.py OUTDIR prints the table of scripts/bench-amqp.sh.

It reads OUTDIR/round-*/CASE-TARGET.json (courier-bench --json) and
CASE-TARGET.load (the load average before the run), and prints, per
figure, the median over the rounds with its range for RabbitMQ, Courier's
AMQP port and Courier's own protocol, then Courier-AMQP's ratio to
RabbitMQ (aim: 2x or more) and to Courier's own protocol (aim: 0.70 or
more, "within 30%"); rates are divided, latencies and memory inverted, so
that above 1 is always Courier-AMQP doing better. A second table gives
each server's CPU per operation, peak RSS during the run, and the load
average before the runs.
"""

import glob
import json
import os
import statistics
import sys

TARGETS = ["rabbitmq", "courier-amqp", "courier", "courier-amqp-before"]
HEAD = {"rabbitmq": "RabbitMQ", "courier-amqp": "Courier AMQP", "courier": "Courier native",
        "courier-amqp-before": "Courier AMQP before"}
# The ratio columns: Courier AMQP against each of these.
VERSUS = {"rabbitmq": "AMQP/RabbitMQ", "courier": "AMQP/native", "courier-amqp-before": "after/before"}
CASES = ["reqresp", "fanout", "tasks", "backlog"]


def run_of(js, parallel):
    for r in js.get("runs", []):
        if r.get("parallel", 0) == parallel:
            return r
    return None


def figures(case, js):
    """(name, unit, lower_is_better, value) of one run."""
    out = []
    if case == "reqresp":
        seq, par = run_of(js, 0), run_of(js, 10)
        if seq:
            out.append(("sequential", "cycles/s", False, seq["cycles_per_s"]))
            out.append(("sequential p50", "us", True, seq["latency_us"]["p50"]))
        if par:
            out.append(("parallel 10", "cycles/s", False, par["cycles_per_s"]))
    elif case == "fanout":
        out.append(("published", "msgs/s", False, js["publish_per_s"]))
        out.append(("delivered", "msgs/s", False, js["deliver_per_s"]))
        if js.get("lost"):
            out.append(("lost", "msgs", True, js["lost"]))
    elif case == "tasks":
        out.append(("produced (confirmed)", "tasks/s", False, js["produced_per_s"]))
        out.append(("consumed (acked)", "tasks/s", False, js["consumed_per_s"]))
    elif case == "backlog":
        out.append(("iterations", "iter/s", False, js["iterations_per_s"]))
        curve = js.get("curve") or []
        if len(curve) >= 2:
            first, last = curve[0]["server_rss_bytes"], curve[-1]["server_rss_bytes"]
            out.append(("RSS at 1/4 depth", "MB", True, first / 1e6))
            out.append(("RSS at full depth", "MB", True, last / 1e6))
    return out


def cpu_per_op(js):
    for key in ("cpu_per_cycle", "cpu_per_delivery", "cpu_per_task", "cpu_per_iteration"):
        if key in js:
            return js[key].get("broker_us")
    return None


def fmt(v):
    if v is None:
        return "–"
    if abs(v) >= 100 or v == int(v):
        return f"{v:.0f}"
    return f"{v:.1f}"


def cell(vals):
    if not vals:
        return "–"
    m = statistics.median(vals)
    if len(vals) > 1:
        return f"{fmt(m)} [{fmt(min(vals))}–{fmt(max(vals))}]"
    return fmt(m)


def ratio(a, b, lower):
    if not a or not b:
        return None
    a, b = statistics.median(a), statistics.median(b)
    if lower:
        a, b = b, a
    if b == 0:
        return None
    return a / b


def table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cols = [r[0].ljust(widths[0]), r[1].ljust(widths[1])]
        cols += [r[i].rjust(widths[i]) for i in range(2, len(r))]
        lines.append("  ".join(cols).rstrip())
    return "\n".join(lines)


def main():
    out = sys.argv[1]
    rounds = sorted(glob.glob(os.path.join(out, "round-*")))
    figs = {}  # (case, name, unit, lower) -> target -> [values]
    order = []
    res = {}  # (case, target) -> {"cpu": [], "rss": [], "load": []}
    failed = []
    for rd in rounds:
        for case in CASES:
            for t in TARGETS:
                path = os.path.join(rd, f"{case}-{t}.json")
                if not os.path.exists(path):
                    continue
                try:
                    with open(path) as f:
                        js = json.load(f)
                except (OSError, ValueError):
                    failed.append(f"{os.path.basename(rd)} {case} on {HEAD[t]}")
                    continue
                for name, unit, lower, v in figures(case, js):
                    key = (case, name, unit, lower)
                    if key not in figs:
                        figs[key] = {}
                        order.append(key)
                    figs[key].setdefault(t, []).append(v)
                r = res.setdefault((case, t), {"cpu": [], "rss": [], "load": []})
                c = cpu_per_op(js)
                if c is not None:
                    r["cpu"].append(c)
                rss = js.get("usage", {}).get("server_peak_rss_bytes")
                if rss:
                    r["rss"].append(rss / 1e6)
                try:
                    with open(os.path.join(rd, f"{case}-{t}.load")) as f:
                        r["load"].append(float(f.read().split()[0]))
                except (OSError, ValueError, IndexError):
                    pass

    order.sort(key=lambda k: CASES.index(k[0]))
    present = [t for t in TARGETS if any(t in by for by in figs.values())]
    versus = [t for t in VERSUS if t in present and "courier-amqp" in present]
    rows = [["case", "figure", "unit"] + [HEAD[t] for t in present] + [VERSUS[t] for t in versus]]
    for key in order:
        case, name, unit, lower = key
        by = figs[key]
        row = [case, name, unit] + [cell(by.get(t, [])) for t in present]
        for other in versus:
            q = ratio(by.get("courier-amqp"), by.get(other), lower)
            row.append("–" if q is None else f"{q:.2f}x")
        rows.append(row)
    print(f"Medians of {len(rounds)} round(s) [lowest–highest]; ratios of the medians, above 1: Courier AMQP did better.")
    print("Aims (issue 16): AMQP/RabbitMQ 2.00x or more; AMQP/native 0.70x or more.")
    if "courier-amqp-before" in versus:
        print("after/before: Courier AMQP against the BEFORE_BIN build's AMQP port, in the same rounds.")
    print(table(rows))
    print()
    rows = [["case", "server", "CPU us/op", "peak RSS MB", "load avg"]]
    for case in CASES:
        for t in present:
            r = res.get((case, t))
            if not r:
                continue
            rows.append([case, HEAD[t], cell(r["cpu"]), cell(r["rss"]), cell(r["load"])])
    print("Servers during the runs: CPU (utime+stime) per cycle, delivery, task or iteration; peak RSS; 1-minute load average before.")
    print(table(rows))
    for f in failed:
        print("Failed: " + f)


if __name__ == "__main__":
    main()
