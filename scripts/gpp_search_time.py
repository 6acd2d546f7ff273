#!/usr/bin/env python3
"""GraphPipe search time at 4 GPUs by the distribution of fresh processes (issue 5,
BENCHMARKS.md "GraphPipe planner").

Runs `pipec plan --planner gpp --json` N times per model (MMT@4, batch 64; CANDLE-Uno@4, batch
4096; each binary and model alternating, so drift hits them alike) and prints the min, p25 and
median of `search_time_s` and the median's ratio to the paper's Table 1.

Usage: python3 scripts/gpp_search_time.py [--pipec BIN[,BIN2...]] [-n 50]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from gpp_table import PIPEC, models_dir  # noqa: E402
CASES = {"mmt": (64, 0.12), "candle_uno": (4096, 0.19)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", default=PIPEC)
    ap.add_argument("-n", type=int, default=50)
    a = ap.parse_args()
    d = models_dir()
    bins = a.pipec.split(",")
    res = {(b, m): [] for b in bins for m in CASES}
    for _ in range(a.n):
        for m, (batch, _) in CASES.items():
            for b in bins:
                out = subprocess.run(
                    [b, "plan", os.path.join(d, f"{m}.onnx"), "--cluster", "summit", "--devices",
                     "4", "--planner", "gpp", "--batch", str(batch), "--json"],
                    capture_output=True, text=True, check=True).stdout
                res[(b, m)].append(json.loads(out)["search_time_s"] * 1e3)
    for (b, m), v in res.items():
        v.sort()
        med = statistics.median(v)
        print(f"{b}: {m}@4 over {len(v)} processes: min {v[0]:.2f} ms, p25 {v[len(v) // 4]:.2f} ms, "
              f"median {med:.2f} ms ({CASES[m][1] * 1e3 / med:.0f}x the paper's {CASES[m][1]} s)")


if __name__ == "__main__":
    main()
