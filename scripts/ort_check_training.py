#!/usr/bin/env python3
"""Check an exported training graph (pipec grad --save-training-graph) independently of pipec.

usage: ort_check_training.py TRAIN.onnx REF.npz [--tol 1e-4]
1. onnx.checker.check_model(full_check=True) (strict shape inference included);
2. onnxruntime (CPU, graph optimizations off: the graph exactly as written) runs it on the
   reference inputs (`input/*`). With ORT's fusions and NCHWc layouts on, float32 rounding differs
   by machine and flips near-tied ReLU/pooling branches of randomly initialised BatchNorm nets:
   resnet18's worst gradient then moved 6.8e-3 on an AMD EPYC host, against 2.3e-6 unoptimised;
3. the loss, outputs and `grad/*` outputs are compared with the reference as in compare_grads.py.
The graph's outputs are [loss, model outputs..., grad/<param>...]. Exits 1 on any failure.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ref")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    m = onnx.load(a.model)
    onnx.checker.check_model(m, full_check=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
    r = np.load(a.ref)
    feeds = {i.name: r["input/" + i.name] for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    res = dict(zip(names, sess.run(names, feeds)))
    out = {"loss": res[names[0]]}
    for n in names[1:]:
        out[n if n.startswith("grad/") else "output/" + n] = res[n]
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "ort.npz")
        np.savez(p, **out)
        here = os.path.dirname(os.path.abspath(__file__))
        rc = subprocess.call([sys.executable, os.path.join(here, "compare_grads.py"), p, a.ref,
                              "--tol", str(a.tol), "--json"])
    print(f"checker full_check: ok; {len(m.graph.node)} nodes")
    sys.exit(rc)


if __name__ == "__main__":
    main()
