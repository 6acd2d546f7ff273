#!/usr/bin/env python3
"""Per device of a `pipec run --trace` run: the thread CPU time its compute pieces took per step
(trace events' `args.cpu_us`, steps 2.. only) against the plan's predicted compute
(`micro_batches x stage compute_time_s` of OUTDIR/plan.json), and the CPU of everything else
(sends, receives, accumulation, optimizer step). With several workers time-sharing a core the
events' wall durations also count the other workers' slices; the CPU times do not.

Usage: python3 scripts/trace_cpu.py TRACE.json OUTDIR
"""
import collections
import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ev = json.load(open(sys.argv[1]))["traceEvents"]
    plan = json.load(open(os.path.join(sys.argv[2], "plan.json")))
    xs = [e for e in ev if e.get("ph") == "X"]
    steps = max(e["args"].get("step", 0) for e in xs)
    if steps < 2:
        sys.exit("need a run of at least 2 steps (the first step is left out)")
    if not any("cpu_us" in e["args"] for e in xs):
        sys.exit("the trace has no cpu_us (written on Linux only)")
    cpu = collections.defaultdict(float)
    for e in xs:
        if e["args"].get("step", 0) < 2:
            continue
        kind = "compute" if e["cat"] == "compute" else "other"
        cpu[(e["pid"], kind)] += e["args"].get("cpu_us", 0.0) / 1e3 / (steps - 1)
    m = plan["micro_batches"]
    tot_c = tot_p = 0.0
    for s in plan["stages"]:
        for d in s["devices"]:
            c, p = cpu[(d, "compute")], m * s["compute_time_s"] * 1e3
            tot_c, tot_p = tot_c + c, tot_p + p
            print(f"device {d} (stage {s['id']}): compute {c:.2f} ms CPU/step, predicted {p:.2f} "
                  f"({100 * (c / p - 1):+.1f}%); other {cpu[(d, 'other')]:.2f} ms CPU/step")
    print(f"all devices: compute {tot_c:.2f} ms CPU/step, predicted {tot_p:.2f} ({100 * (tot_c / tot_p - 1):+.1f}%)")


if __name__ == "__main__":
    main()
