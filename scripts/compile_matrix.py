#!/usr/bin/env python3
"""The issue-7 equivalence matrix: for every bundled model x planner x device count x number of
micro-batches x optimizer x schedule, `pipec compile` then execute and compare every parameter
with single-device training after 3 steps (max norm-wise relative difference <= 1e-4).

Executors: `--runner ort` (default) uses scripts/ort_program.py (onnxruntime, independent of
pipec's runtime); `--runner pipec` uses `pipec run OUTDIR --steps 3 --check`.

Usage: python3 scripts/compile_matrix.py [--pipec target/debug/pipec] [--runner ort|pipec]
         [--quick | --rest | --gpp-flags] [--schedules zb-h1,...] [--out matrix.md]
Writes a markdown table (one row per case: result, stages/replicas, max_rel_diff, seconds).
`--accuracy` (pipec runner): a case failing in float32 is re-run with `pipec run --check
--accuracy` and reported as `rounding` when the pipeline is no farther from float64 training
than the float32 single-device reference is (ratio <= 1.01), else it stays FAIL.
"""
import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ["mlp4", "inception_mini", "resnet18", "gpt2_tiny", "mmt_tiny", "dlrm_tiny"]
PLANNERS = ["straight", "dp", "pipedream", "dapple", "bapipe", "gpp"]
DEVICES = [2, 4, 8]
MICRO_BATCHES = [1, 4, 8]
OPTIMIZERS = ["sgd:lr=0.01,momentum=0.9", "adam:lr=0.001"]
SCHEDULES = ["gpipe", "1f1b", "gpp"]
PRECISION = "f32"
ACCURACY = False


def in_quick(planner, dev, M, opt):
    # one optimizer per (model, planner), alternating; M in {1, 4}
    return not (M == 8 or (OPTIMIZERS.index(opt) + PLANNERS.index(planner) + DEVICES.index(dev)) % 2)


# GraphPipe's schedules behind flags (issue 5): kFkB and per-stage micro-batch sizes, on gpp plans.
GPP_FLAG_SCHEDULES = ["kfkb-2", "gpp-per-stage"]


def gpp_flag_cases():
    for model, dev, M, opt, sched in itertools.product(
        MODELS, DEVICES, [4, 8], OPTIMIZERS, GPP_FLAG_SCHEDULES
    ):
        yield model, "gpp", dev, M, opt, sched


def case_list(quick, rest=False):
    for model, planner, dev, M, opt, sched in itertools.product(
        MODELS, PLANNERS, DEVICES, MICRO_BATCHES, OPTIMIZERS, SCHEDULES
    ):
        if sched == "gpp" and planner not in ("gpp",):
            continue  # the DAG schedule applies to GraphPipe's stage DAGs
        if sched != "gpp" and planner == "gpp" and sched not in ("1f1b", "zb-h1"):
            continue
        if quick and not in_quick(planner, dev, M, opt):
            continue
        if rest and in_quick(planner, dev, M, opt):
            continue
        yield model, planner, dev, M, opt, sched


def run_case(pipec, runner, model, planner, dev, M, opt, sched):
    mb = dev if model != "resnet18" else max(2, dev // 2)  # micro-batch divisible by replicas
    batch = mb * M
    d = tempfile.mkdtemp(prefix="pipec-matrix-")
    out = os.path.join(d, "o")
    t0 = time.time()
    args = [pipec, "compile", os.path.join(ROOT, "onnx-models", model + ".onnx"),
            "--cluster", "8@1e10", "--device-kind", "cpu-core", "--devices", str(dev),
            "--planner", planner, "--batch", str(batch), "--micro-batch", str(mb),
            "--optimizer", opt, "--schedule", sched, "-o", out]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        return "compile-error", "", None, time.time() - t0, r.stderr.strip().splitlines()[-1:]
    prog = json.load(open(os.path.join(out, "schedule.json")))
    shape = ":".join(str(len(s["devices"])) for s in prog["stages"])
    if runner == "ort":
        cmd = [sys.executable, os.path.join(ROOT, "scripts", "ort_program.py"), out, "--steps", "3", "--no-checker"]
    else:
        cmd = [pipec, "run", out, "--steps", "3", "--check", "--precision", PRECISION]
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"max_rel_diff[ =:]*([0-9.eE+-]+)", r.stdout + r.stderr)
    rel = float(m.group(1)) if m else None
    status = "pass" if r.returncode == 0 else "FAIL"
    tail = (r.stdout + r.stderr).strip().splitlines()[-1:]
    if status == "FAIL" and ACCURACY and rel is not None and PRECISION == "f32":
        # Tell float32 rounding from a wrong program: both results against float64 training.
        q = subprocess.run([pipec, "run", out, "--steps", "3", "--check", "--accuracy"],
                           capture_output=True, text=True)
        m = re.search(r"pipeline ([0-9.eE+-]+), reference ([0-9.eE+-]+) \(ratio ([0-9.eE+-]+)\)", q.stdout)
        if m:
            status = "rounding" if float(m.group(3)) <= 1.01 else "FAIL"
            tail = [f"f32 vs f64 training: pipeline {m.group(1)}, reference {m.group(2)} (ratio {m.group(3)})"]
    shutil.rmtree(d, ignore_errors=True)
    return status, shape, rel, time.time() - t0, tail


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipec", default=os.path.join(ROOT, "target", "debug", "pipec"))
    ap.add_argument("--runner", default="ort", choices=["ort", "pipec"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rest", action="store_true",
                    help="the full matrix minus the --quick cases (run both for the whole matrix)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--precision", default="f32", choices=["f32", "f64"],
                    help="with --runner pipec: run pipeline and reference in f32 or f64")
    ap.add_argument("--models", default=None,
                    help="comma-separated models to run (default: all, in the MODELS order)")
    ap.add_argument("--gpp-flags", action="store_true",
                    help="instead: gpp plans under --schedule kfkb-2 and gpp-per-stage, M in {4, 8}")
    ap.add_argument("--schedules", default=None,
                    help="comma-separated schedules instead of gpipe,1f1b,gpp (e.g. zb-h1: every "
                         "planner's stages under zero bubble)")
    ap.add_argument("--only", default=None, help="a file of `model planner devices M optimizer schedule` lines to run")
    ap.add_argument("--accuracy", action="store_true",
                    help="with --runner pipec: re-run a case failing in f32 with `--check --accuracy`; "
                         "it counts as `rounding` (not FAIL) when the pipeline is no farther from "
                         "float64 training than the float32 reference (ratio <= 1.01)")
    a = ap.parse_args()
    global PRECISION, ACCURACY, SCHEDULES
    if a.schedules:
        SCHEDULES = a.schedules.split(",")
    PRECISION = a.precision
    ACCURACY = a.accuracy
    rows = []
    counts = {}
    cases = list(gpp_flag_cases() if a.gpp_flags else case_list(a.quick, a.rest))
    if a.models:
        keep = a.models.split(",")
        cases = sorted((c for c in cases if c[0] in keep), key=lambda c: keep.index(c[0]))
    if a.only:
        cases = [tuple(int(x) if x.isdigit() else x for x in l.split()) for l in open(a.only) if l.strip()]
    for c in cases:
        status, shape, rel, secs, tail = run_case(a.pipec, a.runner, *c)
        counts[status] = counts.get(status, 0) + 1
        line = f"| {' | '.join(map(str, c))} | {status} | {shape} | {rel if rel is not None else '-'} | {secs:.1f} |"
        if status != "pass":
            line += f" {tail[0][:120] if tail else ''}"
        rows.append(line)
        print(line, flush=True)
    head = "| model | planner | devices | M | optimizer | schedule | result | replicas per stage | max_rel_diff | s |\n|---|---|---|---|---|---|---|---|---|---|"
    text = head + "\n" + "\n".join(rows) + f"\n\nTotals: {counts}\n"
    if a.out:
        open(a.out, "w").write(text)
    print(f"Totals: {counts}")
    sys.exit(0 if counts.get("FAIL", 0) == 0 else 1)


if __name__ == "__main__":
    main()
