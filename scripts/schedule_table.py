#!/usr/bin/env python3
"""Simulated iteration time and peak memory of one schedule against a baseline (issue #21's table):
for every model, planner and device count, `pipec plan --schedule BASE` and `--schedule NEW`
(each planner plans for the schedule it is given), side by side.

Usage: python3 scripts/schedule_table.py [--pipec target/release/pipec] [--models a,b]
       [--planners straight,gpp] [--devices 4,8] [--cluster summit] [--batch 64]
       [--base 1f1b] [--new zb-h1] [--md OUT.md]
A planner's own default schedule is taken as the base where `--base` is `own`.
"""

import argparse
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan(a, model, planner, devices, schedule):
    path = model if model.endswith(".onnx") else os.path.join(ROOT, "onnx-models", model + ".onnx")
    cmd = [a.pipec, "plan", path, "--cluster", a.cluster, "--devices", str(devices),
           "--planner", planner, "--batch", str(a.batch), "--json"]
    if schedule != "own":
        cmd += ["--schedule", schedule]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[0]
    return json.loads(r.stdout), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "target", "release", "pipec"))
    ap.add_argument("--models", default="mlp4,gpt2_tiny,vit_tiny,mmt_tiny,resnet18,"
                    "inception_mini,dlrm_tiny,lstm_tiny")
    ap.add_argument("--planners", default="straight,gpp")
    ap.add_argument("--devices", default="4,8")
    ap.add_argument("--cluster", default="summit")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--base", default="1f1b")
    ap.add_argument("--new", default="zb-h1")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--md")
    a = ap.parse_args()
    head = (f"| model | planner | devices | {a.base}: time, peak | {a.new}: time, peak "
            f"| time ratio | memory ratio |")
    lines = [head, "|---|---|---|---|---|---|---|"]
    ratios = []
    for m in a.models.split(","):
        for p in a.planners.split(","):
            for d in a.devices.split(","):
                base, e1 = plan(a, m, p, int(d), a.base)
                new, e2 = plan(a, m, p, int(d), a.new)
                name = os.path.basename(m)[:-5] if m.endswith(".onnx") else m
                if e1 or e2:
                    lines.append(f"| {name} | {p} | {d} | {e1 or ''} | {e2 or ''} | | |")
                    continue
                tr = new["iteration_time_s"] / base["iteration_time_s"]
                mr = new["peak_memory_bytes"] / max(base["peak_memory_bytes"], 1)
                ratios.append((tr, mr))
                cell = lambda x: (f"{x['iteration_time_s'] * 1e3:.3f} ms, "
                                  f"{x['peak_memory_bytes'] / 2**20:.1f} MiB")
                lines.append(f"| {name} | {p} | {d} | {cell(base)} | {cell(new)} "
                             f"| {tr:.3f} | {mr:.3f} |")
    out = "\n".join(lines)
    print(out)
    if ratios:
        ts = sorted(r[0] for r in ratios)
        ms = sorted(r[1] for r in ratios)
        print(f"\n{len(ratios)} cases: time ratio {ts[0]:.3f} .. {ts[-1]:.3f} "
              f"(median {ts[len(ts) // 2]:.3f}); memory ratio {ms[0]:.3f} .. {ms[-1]:.3f} "
              f"(median {ms[len(ms) // 2]:.3f})")
    if a.md:
        with open(a.md, "w") as f:
            f.write(out + "\n")


if __name__ == "__main__":
    main()
