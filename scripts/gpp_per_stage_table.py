#!/usr/bin/env python3
"""GraphPipe's schedule options behind flags (issue #5): the default GPP plan (uniform
micro-batch, 1F1B) against `--schedule kfkb-2` (kFkB, same k everywhere) and `--schedule
gpp-per-stage` (per-stage micro-batch sizes and k_sFk_sB), on the paper's three model families
on `summit` at 4/8/16/32 GPUs with the paper's mini-batch sizes (as scripts/gpp_table.py).

Usage: python3 scripts/gpp_per_stage_table.py [--pipec target/release/pipec] [--repeat N]
Prints a markdown table: simulated samples/s of each, the per-stage sizes chosen, and the search
times (fastest of N runs, default 3).
"""
import argparse
import os

from gpp_table import BATCH, GPUS, PIPEC, models_dir, plan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", default=PIPEC)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    d = models_dir()
    print("| model | GPUs | batch | GPP b | GPP samples/s | kfkb-2 samples/s | per-stage samples/s | per-stage / GPP | per-stage sizes b_s (k_s) | GPP search s | per-stage search s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for m in ["mmt", "dlrm", "candle_uno"]:
        for i, g in enumerate(GPUS):
            b = BATCH[m][i]
            model = os.path.join(d, m + ".onnx")
            p = plan(a.pipec, model, "gpp", g, b, a.repeat)
            k = plan(a.pipec, model, "gpp", g, b, 1, ("--schedule", "kfkb-2"))
            s = plan(a.pipec, model, "gpp", g, b, a.repeat, ("--schedule", "gpp-per-stage"))
            sizes = [st.get("micro_batch") for st in s["stages"]]
            own = ("uniform kept" if sizes[0] is None else
                   ", ".join(f"{st['micro_batch']} ({st['group']})" for st in s["stages"]))
            print(f"| {m} | {g} | {b} | {p['micro_batch']} | {p['throughput_samples_per_s']:.1f} | "
                  f"{k['throughput_samples_per_s']:.1f} | {s['throughput_samples_per_s']:.1f} | "
                  f"{s['throughput_samples_per_s'] / p['throughput_samples_per_s']:.3f} | {own} | "
                  f"{p['search_time_s']:.3f} | {s['search_time_s']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
