#!/usr/bin/env python3
"""GraphPipe acceptance table: GPP vs its sequential mode (gpp-seq) on the paper's three model
families (+ a sequential Transformer) on the `summit` preset at 4/8/16/32 GPUs with the paper's
mini-batch sizes (ASPLOS'25 §7, Table 1 for search times).

Usage: python3 scripts/gpp_table.py [--pipec target/release/pipec] [--repeat N]
Prints a markdown table (stdout). Search times are the fastest of N runs (default 5; the plans are
deterministic, the machine is shared). Generates the models first if their weight files are missing.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
BATCH = {"mmt": [64, 128, 256, 512], "dlrm": [256, 512, 1024, 2048],
         "candle_uno": [4096, 8192, 16384, 32768], "seq_transformer": [64, 128, 256, 512]}
PAPER = {"mmt": [0.12, 0.76, 3.00, 10.11], "dlrm": [0.33, 2.73, 13.28, 54.6],
         "candle_uno": [0.19, 1.43, 6.14, 22.37], "seq_transformer": [None] * 4}
GPUS = [4, 8, 16, 32]
# The binary the GraphPipe scripts run by default (`--pipec`).
PIPEC = os.path.join(ROOT, "target/release/pipec")


def plan(pipec, model, planner, gpus, batch, repeat=1, extra=()):
    best = None
    for _ in range(max(1, repeat)):
        out = subprocess.run([pipec, "plan", model, "--cluster", "summit", "--devices", str(gpus),
                              "--planner", planner, "--batch", str(batch), "--json", *extra],
                             capture_output=True, text=True, check=True).stdout
        p = json.loads(out)
        if best is not None and p["throughput_samples_per_s"] != best["throughput_samples_per_s"]:
            sys.exit(f"{model} {planner} {gpus}: plans differ between runs (not deterministic)")
        if best is None or p["search_time_s"] < best["search_time_s"]:
            best = p
    return best


def models_dir():
    """The GraphPipe family models, generated on first use."""
    d = os.path.join(ROOT, "onnx-models/graphpipe")
    if not os.path.exists(os.path.join(d, "mmt.weights")):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts/gen_graphpipe_models.py")], check=True)
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", default=PIPEC)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    d = models_dir()
    print("| model | GPUs | batch | GPP stage graph (depth, stages, replicas) | GPP b | GPP samples/s | seq b | seq depth | seq samples/s | GPP/seq | GPP search s | seq search s | paper s | paper/GPP |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in ["mmt", "dlrm", "candle_uno", "seq_transformer"]:
        for i, g in enumerate(GPUS):
            b = BATCH[m][i]
            model = os.path.join(d, m + ".onnx")
            p = plan(a.pipec, model, "gpp", g, b, a.repeat)
            s = plan(a.pipec, model, "gpp-seq", g, b, a.repeat)
            reps = [st["replicas"] for st in p["stages"]]
            paper = PAPER[m][i]
            ratio = f"{paper / p['search_time_s']:.0f}x" if paper else "-"
            print(f"| {m} | {g} | {b} | depth {p['pipeline_depth']}, {len(reps)} stages, replicas {reps} | "
                  f"{p['micro_batch']} | {p['throughput_samples_per_s']:.1f} | {s['micro_batch']} | {s['pipeline_depth']} | "
                  f"{s['throughput_samples_per_s']:.1f} | {p['throughput_samples_per_s'] / s['throughput_samples_per_s']:.3f} | "
                  f"{p['search_time_s']:.3f} | {s['search_time_s']:.3f} | {paper if paper else '-'} | {ratio} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
