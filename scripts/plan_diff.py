#!/usr/bin/env python3
"""Do two pipec builds plan the same? For a search speed-up that must not change (or worsen)
plans: runs `pipec plan --json` with both binaries over models x clusters x device counts x
planners and compares the plans (every field but `search_time_s`).

Prints one line per setup: `same`, `better` or `WORSE` (the new plan's iteration_time_s against
the base's, 1e-9 relative), or `differs` (same time, another plan), with both search times; then
a summary with the largest search time of each binary. Exit status 1 when any plan is worse or a
run fails in one binary only.

Usage: python3 scripts/plan_diff.py --base OLD_PIPEC --new NEW_PIPEC
       [--models onnx-models/gpt2_tiny.onnx,...] [--clusters "summit;dgx-h100;cpu" (";" between clusters)]
       [--devices 4,8,16,32] [--planners gpp,dapple,bapipe,pipedream,straight]
       [--batch 64] [--extra "--device-kind H100-80GB"] [--timeout 120]
       [--base-env KEY=VALUE]... [--new-env KEY=VALUE]...
The default models are the bundled ones (onnx-models/*.onnx).
"""
import argparse
import glob
import itertools
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plan(binary, model, cluster, devices, planner, a, env=None):
    cmd = [binary, "plan", model, "--cluster", cluster, "--planner", planner,
           "--batch", str(a.batch), "--json"]
    if devices:
        cmd += ["--devices", str(devices)]
    cmd += shlex.split(a.extra)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                           env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired:
        return None, "timeout", a.timeout
    wall = time.time() - t0
    if r.returncode != 0:
        err = [x for x in r.stderr.splitlines() if x.strip()]
        return None, (err[-1] if err else f"exit {r.returncode}")[:120], wall
    p = json.loads(r.stdout)
    p.pop("search_time_s", None)
    return p, None, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", default=os.path.join(ROOT, "target", "release", "pipec"))
    ap.add_argument("--models", default=None)
    ap.add_argument("--clusters", default="summit;dgx-h100;cpu")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--planners", default="gpp,dapple,bapipe,pipedream,straight")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--extra", default="")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--base-env", action="append", default=[],
                    help="KEY=VALUE in the base binary's environment (repeatable); with --new "
                         "the same binary, compares two settings")
    ap.add_argument("--new-env", action="append", default=[])
    a = ap.parse_args()
    models = (a.models.split(",") if a.models
              else sorted(glob.glob(os.path.join(ROOT, "onnx-models", "*.onnx"))))
    devices = [int(x) if x else 0 for x in a.devices.split(",")]
    base_env = dict(kv.split("=", 1) for kv in a.base_env)
    new_env = dict(kv.split("=", 1) for kv in a.new_env)
    counts = {"same": 0, "better": 0, "WORSE": 0, "differs": 0, "fails": 0}
    worst = {"base": 0.0, "new": 0.0}
    bad = False
    for model, cluster, d, planner in itertools.product(
            models, a.clusters.split(";"), devices, a.planners.split(",")):
        pb, eb, tb = plan(a.base, model, cluster, d, planner, a, base_env)
        pn, en, tn = plan(a.new, model, cluster, d, planner, a, new_env)
        worst["base"] = max(worst["base"], tb)
        worst["new"] = max(worst["new"], tn)
        name = f"{os.path.basename(model):24s} {cluster:14s} {d:5d} {planner:10s}"
        if pb is None or pn is None:
            if (pb is None) != (pn is None):
                bad = True
            counts["fails"] += 1
            print(f"{name} base: {eb or 'ok'} | new: {en or 'ok'}", flush=True)
            continue
        tb_i, tn_i = pb["iteration_time_s"], pn["iteration_time_s"]
        if pb == pn:
            verdict = "same"
        elif tn_i < tb_i * (1 - 1e-9):
            verdict = "better"
        elif tn_i > tb_i * (1 + 1e-9):
            verdict = "WORSE"
            bad = True
        else:
            verdict = "differs"
        counts[verdict] += 1
        print(f"{name} {verdict:7s} {tb_i:.6g} -> {tn_i:.6g}  search {tb:.2f} -> {tn:.2f} s",
              flush=True)
    print(" ".join(f"{k}: {v}" for k, v in counts.items()),
          f"| slowest run: base {worst['base']:.2f} s, new {worst['new']:.2f} s")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
