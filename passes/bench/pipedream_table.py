#!/usr/bin/env python3
"""Compare `pipec plan --planner pipedream` with PipeDream's own optimizer.

Reads onnx-models/profiles/pipedream-reference/summary.txt, runs the release pipec on every
profile x cluster setting (best of REPEAT runs for the timings: the planner's own search_time_s,
wall clock, and the CPU time of the whole process from `perf stat -e task-clock`) and prints a markdown table.
Usage (from the repository root, after `cargo build --release -p pipec`):
    python3 passes/bench/pipedream_table.py [REPEAT]
"""
import json, re, subprocess, sys

REPEAT = int(sys.argv[1]) if len(sys.argv) > 1 else 3
CLUSTERS = {"n4": "4@1250000000", "n8": "8@1250000000", "n16": "16@3125000000",
            "n8x2": "8@25000000000,2@3125000000", "n8x4": "8@25000000000,4@1250000000"}
ref = {}
for line in open("onnx-models/profiles/pipedream-reference/summary.txt"):
    tag = line.split()[0]
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    ref[tag] = (float(kv["objective_s"]), float(kv["wall_s"]))
print("| profile | setting | reference objective_s | pipec objective_s | rel. error | "
      "PipeDream wall s | pipec search s (wall) | pipec process CPU s | speed-up (search) | speed-up (process CPU) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for model in ["vgg16", "resnet50", "gnmt", "inception_v3"]:
    for tag, cl in CLUSTERS.items():
        cmd = ["./target/release/pipec", "plan", f"onnx-models/profiles/{model}.txt", "--planner",
               "pipedream", "--cluster", cl, "--profile-batch", "64", "--json"]
        best_search, best_wall, obj = 1e9, 1e9, None
        for _ in range(REPEAT):
            # CPU time of the whole process (perf's task-clock, ms): robust to a loaded machine.
            p = subprocess.run(["perf", "stat", "-x,", "-e", "task-clock"] + cmd,
                               capture_output=True, text=True, check=True)
            wall = float(p.stderr.strip().splitlines()[-1].split(",")[0]) / 1e3
            d = json.loads(p.stdout)
            obj = d["objective_s"]
            best_search = min(best_search, d["search_time_s"])
            best_wall = min(best_wall, wall)
        r = ref.get(f"{model}__{tag}")
        if r:
            err = abs(obj - r[0]) / r[0]
            print(f"| {model} | {tag} | {r[0]:.10g} | {obj:.10g} | {err:.1e} | {r[1]:.2f} | "
                  f"{best_search:.5f} | {best_wall:.4f} | {r[1]/best_search:.0f}x | {r[1]/best_wall:.0f}x |")
        else:
            print(f"| {model} | {tag} | - | {obj:.10g} | - | - | {best_search:.5f} | {best_wall:.4f} | - | - |")
