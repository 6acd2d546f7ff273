#!/usr/bin/env python3
"""Finite-difference check of autodiff's training graphs.

usage: fd_check.py DIR
For every DIR/NAME.train.onnx (outputs [loss, ..., grad/<param>...]) the parameters are turned
into graph inputs, onnxruntime (CPU, optimizations off) computes the loss and the analytic
gradients, and up to 12 elements of every parameter are checked against central differences
(L(p + h) - L(p - h)) / 2h. Error = max |fd - analytic| over the samples / max |analytic| of the
whole gradient. float64 cases: h = 1e-6, tolerance 1e-6; float32 cases (ops ORT has no double
kernel for): h = 4e-3, tolerance 3e-3 (f32 round-off of the loss over h dominates).
Labels for cross-entropy cases come from DIR/NAME.inputs.npz. Prints one line per case and a
summary; exits 1 if any case fails.
"""
import glob
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper as nh

rng = np.random.default_rng(7)


def check(path):
    m = onnx.load(path)
    g = m.graph
    outs = [o.name for o in g.output]
    grads = [o for o in outs if o.startswith("grad/")]
    params = [o[len("grad/"):] for o in grads]
    vals = {}
    keep = []
    for init in g.initializer:
        if init.name in params:
            vals[init.name] = nh.to_array(init).copy()
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            keep.append(init)
    del g.initializer[:]
    g.initializer.extend(keep)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    extra = {}
    npz = path[: -len(".train.onnx")] + ".inputs.npz"
    if os.path.exists(npz):
        z = np.load(npz)
        extra = {k: z[k] for k in z.files}

    def run(names):
        return sess.run(names, {**vals, **extra})

    res = run([outs[0]] + grads)
    an = dict(zip(params, res[1:]))
    f64 = all(v.dtype == np.float64 for v in vals.values())
    h, tol = (1e-6, 1e-6) if f64 else (4e-3, 3e-3)
    worst = 0.0
    for p in params:
        a = np.asarray(an[p], np.float64)
        if a.shape != vals[p].shape:
            return False, f"grad/{p} has shape {a.shape}, param {vals[p].shape}", f64
        flat = vals[p].reshape(-1)
        idx = rng.choice(flat.size, size=min(12, flat.size), replace=False)
        scale = max(np.max(np.abs(a)), 1e-12)
        for i in idx:
            old = flat[i]
            flat[i] = old + h
            lp = float(run([outs[0]])[0])
            flat[i] = old - h
            lm = float(run([outs[0]])[0])
            flat[i] = old
            fd = (lp - lm) / (2 * h)
            worst = max(worst, abs(fd - a.reshape(-1)[i]) / scale)
    return worst <= tol, f"{worst:.2e} (tol {tol:.0e}, {len(params)} params)", f64


def main():
    files = sorted(glob.glob(os.path.join(sys.argv[1], "*.train.onnx")))
    bad = 0
    for f in files:
        name = os.path.basename(f)[: -len(".train.onnx")]
        try:
            ok, msg, f64 = check(f)
        except Exception as e:  # noqa: BLE001 - report and count as failure
            ok, msg, f64 = False, f"error: {e}", True
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:28s} {'f64' if f64 else 'f32'} {msg}")
    print(f"{len(files) - bad}/{len(files)} cases pass")
    sys.exit(1 if bad or not files else 0)


if __name__ == "__main__":
    main()
