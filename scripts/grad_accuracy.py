#!/usr/bin/env python3
"""How far pipec's float32 gradients are from exact, next to PyTorch's float32 ones.

usage: grad_accuracy.py MODEL.onnx --torch-ref REF.npz --torch-ref64 REF64.npz
                        [--torch-ref64b REF64B.npz] [--pipec target/debug/pipec] [--keep DIR] [--json]

REF.npz / REF64.npz: PyTorch's float32 and float64 runs of the same model on the same input
(input/<name>, loss, grad/<param>; scripts/export_accuracy_cases.py writes them, REF.npz is also
what `pipec grad --inputs` reads). REF64B.npz (optional): PyTorch float64 along the float32
run's branches (NAME.ref64b.npz from the same script).

The script runs `pipec grad MODEL --inputs REF.npz` three times: float32, `--precision f64` and
`--precision f64 --f32-branches`, and reports per parameter tensor

  err(a, ref) = max|a - ref| / max|ref|     (the tensor's own scale; for a gradient that is
                                             exactly zero in float64, e.g. attention key biases,
                                             the largest |ref| over all parameters instead)

  pipec   = err(pipec f32, torch f64)          torch   = err(torch f32, torch f64)
  pipec_b = err(pipec f32, pipec f64 along pipec f32's branches)
  torch_b = err(torch f32, torch f64 along torch f32's branches)        (with --torch-ref64b)

and `ok` iff pipec <= 2 torch + FLOOR (and likewise for the _b pair). FLOOR = 1e-6 of the
tensor's scale, ~17 float32 units of roundoff (u = 2^-24 = 6e-8): a float32 sum of K terms can
be off by up to ~K u (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 4.4),
sqrt(K) u typically, and conv weight gradients sum K = N*OH*OW ~ 1e3..1e5 products, so two correct
float32 implementations legitimately differ by a few 1e-7; below the floor a ratio only compares
two roundings of the same sum (and PyTorch's error can be exactly 0 where pipec's is 1e-9).

The plain pair (pipec, torch) includes branch flips: a ReLU input or max-pool window within
float32 rounding of a tie takes the other branch in float64, and the float32 gradient then moves
one routed element (~1e-3 of a conv weight gradient); which layers draw a flip is a lottery that
moves with 1-ulp changes of the input. The _b pair measures the arithmetic alone and is the one the
exit code judges when --torch-ref64b is given (else the plain pair). Also printed: how far
pipec's float64 gradients are from PyTorch's (both "exact"; ~1e-12 expected), which checks that
the two float64 references agree.

Exit 1 if any tensor fails.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

FLOOR = 1e-6


def grads(path):
    z = np.load(path)
    return {k[len("grad/"):]: np.asarray(z[k], np.float64) for k in z.files if k.startswith("grad/")}


def err(a, ref, scale):
    if a.shape != ref.shape:
        return float("inf")
    return float(np.max(np.abs(a - ref)) / scale) if ref.size else 0.0


def pipec_grad(pipec, model, inputs, out, extra):
    cmd = [pipec, "grad", model, "--inputs", inputs, "-o", out] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return grads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--torch-ref", required=True, help="PyTorch float32 (also pipec's --inputs)")
    ap.add_argument("--torch-ref64", required=True, help="PyTorch float64")
    ap.add_argument("--torch-ref64b", help="PyTorch float64 along float32's branches")
    ap.add_argument("--pipec", default=os.path.join("target", "debug", "pipec"))
    ap.add_argument("--keep", help="write pipec's outputs here (default: a temporary directory)")
    ap.add_argument("--json", action="store_true", help="one JSON summary line instead of the table")
    a = ap.parse_args()

    t32, t64 = grads(a.torch_ref), grads(a.torch_ref64)
    t64b = grads(a.torch_ref64b) if a.torch_ref64b else None
    with tempfile.TemporaryDirectory() as tmp:
        d = a.keep or tmp
        os.makedirs(d, exist_ok=True)
        p32 = pipec_grad(a.pipec, a.model, a.torch_ref, os.path.join(d, "f32.npz"), [])
        p64 = pipec_grad(a.pipec, a.model, a.torch_ref, os.path.join(d, "f64.npz"),
                         ["--precision", "f64"])
        p64b = pipec_grad(a.pipec, a.model, a.torch_ref, os.path.join(d, "f64b.npz"),
                          ["--precision", "f64", "--f32-branches"])
    names = [k for k in t64 if k in t32]
    missing = [k for k in names if k not in p32]
    if missing:
        sys.exit(f"pipec grad gave no gradient for {missing[:5]}")
    top = max(float(np.max(np.abs(t64[k]))) if t64[k].size else 0.0 for k in names) or 1.0
    rows = []
    for k in names:
        s = float(np.max(np.abs(t64[k]))) if t64[k].size else 0.0
        s = s if s > 0 else top
        r = {"param": k, "pipec": err(p32[k], t64[k], s), "torch": err(t32[k], t64[k], s),
             "pipec_b": err(p32[k], p64b[k], s), "f64_agree": err(p64[k], t64[k], s)}
        r["ok"] = r["pipec"] <= 2 * r["torch"] + FLOOR
        if t64b is not None:
            r["torch_b"] = err(t32[k], t64b[k], s)
            r["ok_b"] = r["pipec_b"] <= 2 * r["torch_b"] + FLOOR
        rows.append(r)

    def ratio(p, t):
        return p / max(t, FLOOR)

    judge = "ok_b" if t64b is not None else "ok"
    fails = [r["param"] for r in rows if not r[judge]]
    summary = {
        "model": a.model, "params": len(rows), "judged_on": judge, "failed": len(fails),
        "worst_ratio": max(ratio(r["pipec"], r["torch"]) for r in rows),
        "worst_ratio_b": (max(ratio(r["pipec_b"], r["torch_b"]) for r in rows)
                          if t64b is not None else None),
        "worst_pipec": max(r["pipec"] for r in rows), "worst_torch": max(r["torch"] for r in rows),
        "worst_pipec_b": max(r["pipec_b"] for r in rows),
        "worst_torch_b": max(r["torch_b"] for r in rows) if t64b is not None else None,
        "f64_agree": max(r["f64_agree"] for r in rows), "floor": FLOOR, "failures": fails[:10],
    }
    if a.json:
        print(json.dumps(summary))
    else:
        hdr = f"{'param':40s} {'pipec':>9s} {'torch':>9s} {'ratio':>8s} ok"
        if t64b is not None:
            hdr += f"  {'pipec_b':>9s} {'torch_b':>9s} {'ratio_b':>8s} ok_b"
        print(hdr + f"  {'f64 pipec~torch':>15s}")
        for r in rows:
            line = (f"{r['param']:40s} {r['pipec']:9.2e} {r['torch']:9.2e} "
                    f"{ratio(r['pipec'], r['torch']):8.2f} {'y' if r['ok'] else 'N'} ")
            if t64b is not None:
                line += (f"  {r['pipec_b']:9.2e} {r['torch_b']:9.2e} "
                         f"{ratio(r['pipec_b'], r['torch_b']):8.2f} {'y' if r['ok_b'] else 'N'}   ")
            print(line + f"  {r['f64_agree']:15.2e}")
        print(json.dumps(summary))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
