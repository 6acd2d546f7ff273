#!/usr/bin/env python3
"""Compare `pipec grad` output with a dev model's reference (onnx-models/NAME.ref.npz).

usage: compare_grads.py OUT.npz REF.npz [--tol 1e-4] [--json]
Error of a tensor = max|got - ref| / max|ref| (relative to the largest |value| of that tensor).
For sampled parameters (resnet18) the samples are compared the same way, and the full gradient's
L2 norm and sum are compared with meta grad_stats (|got - ref| / max(|ref|, l2 * 1e-6 for sum)).
Prints one line per tensor (worst first with --json a summary); exits 1 if any error > tol.
"""
import argparse
import json
import sys

import numpy as np


def rel(got, ref):
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return float("inf")
    scale = np.max(np.abs(ref)) if ref.size else 0.0
    diff = np.max(np.abs(got - ref)) if ref.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("ref")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    o = np.load(a.out)
    r = np.load(a.ref)
    meta = json.loads(bytes(r["meta_json"]).decode())
    errs = {}
    errs["loss"] = rel(o["loss"], r["loss"])
    for k in r.files:
        if k.startswith("output/") or k.startswith("grad/"):
            errs[k] = rel(o[k], r[k]) if k in o.files else float("inf")
        elif k.startswith("grad_sample_idx/"):
            p = k.split("/", 1)[1]
            gk = "grad/" + p
            if gk not in o.files:
                errs[gk + "[samples]"] = float("inf")
                continue
            g = np.asarray(o[gk], np.float64).ravel()
            errs[gk + "[samples]"] = rel(g[r[k]], r["grad_sample_val/" + p])
            st = meta["grad_stats"][p]
            errs[gk + "[l2]"] = abs(np.linalg.norm(g) - st["l2"]) / st["l2"]
            errs[gk + "[sum]"] = abs(g.sum() - st["sum"]) / max(abs(st["sum"]), st["l2"] * 1e-3)
    missing = [k for k in o.files if k.startswith("grad/") and k not in r.files and k + "[samples]" not in errs]
    worst = max(errs.values())
    if a.json:
        print(json.dumps({"max_rel_err": worst, "tensors": len(errs), "extra_grads": missing,
                          "worst": sorted(errs.items(), key=lambda kv: -kv[1])[:5]}))
    else:
        for k, e in sorted(errs.items(), key=lambda kv: -kv[1]):
            print(f"{e:.3e}  {k}")
        print(f"max_rel_err {worst:.3e} over {len(errs)} tensors; grads not in ref: {missing}")
    sys.exit(0 if worst <= a.tol else 1)


if __name__ == "__main__":
    main()
