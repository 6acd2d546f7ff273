#!/usr/bin/env python3
"""Run the ONNX checker (full_check=True, i.e. with shape inference) on each FILE.

    python3 scripts/onnx_check.py FILE.onnx [FILE.onnx ...]

Prints `OK FILE` or `FAIL FILE: error` per file; exit 0 if all pass, 1 if any fails.
Files over 2 GB (or with external data) are checked by path, which the checker supports.
"""
import os
import sys

import onnx

TWO_GB = 2 * 1024 ** 3


def check(path):
    if os.path.getsize(path) >= TWO_GB:
        onnx.checker.check_model(path, full_check=True)
        return
    m = onnx.load(path)  # pulls in external data, if any
    if m.ByteSize() >= TWO_GB:  # weights too big for one proto: let the checker read the files
        del m
        onnx.checker.check_model(path, full_check=True)
    else:
        onnx.checker.check_model(m, full_check=True)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    failed = 0
    for p in argv:
        try:
            check(p)
            print(f"OK {p}", flush=True)
        except Exception as e:
            msg = " ".join(str(e).split())
            print(f"FAIL {p}: {type(e).__name__}: {msg}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
