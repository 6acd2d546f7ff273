#!/usr/bin/env python3
"""TEMPORARY executor used by pipec's runtime-stub (`run_graph`) until the native CPU executor lands.

usage: ort_run.py MODEL.onnx IN.npz OUT.npz
Runs MODEL with onnxruntime (CPU, graph optimizations off so results follow the graph as written)
on the arrays of IN.npz (keyed by graph input name; extra keys are ignored) and writes every graph
output, keyed by output name, to OUT.npz (np.savez, uncompressed).
"""
import sys

import numpy as np
import onnxruntime as ort


def main():
    model, inp, out = sys.argv[1:4]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    z = np.load(inp)
    feeds = {}
    for i in sess.get_inputs():
        if i.name not in z.files:
            sys.exit(f"input '{i.name}' is missing from {inp}")
        feeds[i.name] = z[i.name]
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, feeds)
    np.savez(out, **{n: np.asarray(r) for n, r in zip(names, res)})


if __name__ == "__main__":
    main()
