#!/usr/bin/env python3
"""Per-stage and critical-path view of a decode trace written by `loom_bench --trace=t.json`.

  python3 tools/trace_stages.py t.json [--first-step 2]

Per stage (instructions of one layer op, all layers and SMs): medians of the wait for the barriers, the
hand-off of the activation slot and the rest of the instruction. Per layer: the hop from the last SM's end of
the stage before to the first SM whose waits were met, the spread of those, the time from the last waits met to
the last end, and the spread of the ends (the stage waits for its slowest SM). A streaming opcode's (MATVEC*)
rest splits into its part before its first page (after the waits), its pages and its epilogue.
"""
import argparse
import collections
import json
import re
import statistics
import sys


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--first-step", type=int, default=2, help="skip the steps before (warm-up)")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    stages = collections.OrderedDict()  # stage -> (step, layer) -> events
    for e in events:
        a = e["args"]
        m = re.match(r"layers\.(\d+)\.(\w+)", a.get("op", ""))
        if a["step"] < args.first_step or not m:
            continue
        stages.setdefault(e["name"] + ":" + m.group(2), collections.defaultdict(list))[
            (a["step"], int(m.group(1)))].append(e)
    if not stages:
        sys.exit(f"{args.trace}: no layer instructions at step >= {args.first_step} (a decode trace with op names?)")

    print(f"{'stage':24s} {'count':>6s} {'wait us':>8s} {'hand-off':>9s} {'rest':>7s} {'(before pages':>14s} "
          f"{'pages':>6s} {'after)':>7s}")
    totals = collections.Counter()  # a layer's sum of the stages' medians, by part
    for name, groups in stages.items():
        es = [e for g in groups.values() for e in g]
        wait = [e["args"]["wait_us"] for e in es]
        hand = [e["args"].get("handoff_us", 0.0) for e in es]
        rest = [e["dur"] - w - h for e, w, h in zip(es, wait, hand)]
        line = f"{name:24s} {len(es):6d} {median(wait):8.2f} {median(hand):9.2f} {median(rest):7.2f}"
        marked = [(e, w + h) for e, w, h in zip(es, wait, hand) if "pages_begin_us" in e["args"]]
        if marked:
            before = [e["args"]["pages_begin_us"] - r for e, r in marked]
            pages = [e["args"]["pages_end_us"] - e["args"]["pages_begin_us"] for e, _ in marked]
            after = [e["dur"] - e["args"]["pages_end_us"] for e, _ in marked]
            line += f" {median(before):14.2f} {median(pages):6.2f} {median(after):7.2f}"
            totals.update({"before pages": median(before), "pages": median(pages), "after pages": median(after)})
        else:
            totals["other stages' rest"] += median(rest)
        totals.update({"waits": median(wait), "hand-offs": median(hand)})
        print(line)
    print("a layer, the stages' medians summed (us): " + ", ".join(f"{k} {v:.1f}" for k, v in totals.items())
          + f"; all {sum(totals.values()):.1f}")

    print(f"\nper layer, us: {'stage':24s} {'hop':>6s} {'ready spread':>13s} {'last ready -> last end':>23s} "
          f"{'end spread':>11s}")
    names = list(stages)
    last_end = {(key, name): max(e["ts"] + e["dur"] for e in es) for name in names for key, es in stages[name].items()}
    for i, name in enumerate(names):
        hop, ready_spread, critical, end_spread = [], [], [], []
        for (step, layer), es in stages[name].items():
            ready = [e["ts"] + e["args"]["wait_us"] for e in es]
            end = [e["ts"] + e["dur"] for e in es]
            before = ((step, layer), names[i - 1]) if i > 0 else ((step, layer - 1), names[-1])  # q after down
            if before in last_end:
                hop.append(min(ready) - last_end[before])
            ready_spread.append(max(ready) - min(ready))
            critical.append(max(end) - max(ready))
            end_spread.append(max(end) - min(end))
        print(f"{'':15s}{name:24s} {median(hop):6.2f} {median(ready_spread):13.2f} {median(critical):23.2f} "
              f"{median(end_spread):11.2f}")

if __name__ == "__main__":
    main()
