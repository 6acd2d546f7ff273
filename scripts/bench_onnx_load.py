#!/usr/bin/env python3
"""Time the Python `onnx` package loading a model: the import-speed baseline for `pipec`.

    python3 scripts/bench_onnx_load.py bench-data/exports/gpt2.onnx [--repeat 5]

Loads the file once untimed (warms the page cache), then `--repeat` timed `onnx.load(path)` calls
(time.perf_counter, wall clock, including external data if any); prints one JSON line with the
best, median and all times in seconds, the file size, and the versions.
"""
import argparse
import gc
import json
import os
import platform
import statistics
import time

import onnx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    m = onnx.load(a.model)  # warm-up: page cache
    nodes = len(m.graph.node)
    del m
    gc.collect()
    times = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        m = onnx.load(a.model)
        times.append(time.perf_counter() - t0)
        del m
        gc.collect()
    print(json.dumps({
        "file": a.model, "bytes": os.path.getsize(a.model), "nodes": nodes,
        "best_s": round(min(times), 4), "median_s": round(statistics.median(times), 4),
        "times_s": [round(t, 4) for t in times],
        "onnx": onnx.__version__, "protobuf": __import__("google.protobuf").protobuf.__version__,
        "python": platform.python_version(), "cpus": os.cpu_count(),
    }))


if __name__ == "__main__":
    main()
