#!/usr/bin/env python3
"""Print what the Python `onnx` package says about each model: one JSON line per MODEL.

    python3 scripts/onnx_stats.py MODEL.onnx [MODEL.onnx ...]

This is the CI oracle for `pipec inspect --json` (see /work/shared/spec/cli.md). Fields:
  file             the path as given
  nodes            len(graph.node)              (top-level graph only; subgraphs not counted)
  parameters       sum of numel over the floating-point initializers
                   (float16, bfloat16, float, double; top-level graph.initializer)
  parameter_bytes  sum of numel * element size over those same initializers
  initializers     len(graph.initializer)  (all dtypes)
  op_types         {op_type: count}, keys sorted; op_type is prefixed "domain:" for
                   ops outside the default ONNX domain ("" / "ai.onnx")
  inputs, outputs  [{"name", "dtype", "shape"}]; graph.input minus anything that is also an
                   initializer; dtype as numpy names it ("float32", "int64", ...);
                   shape is a list with ints for fixed dims and the dim_param string for symbolic
                   dims (null for a dim with neither; "shape": null when the rank is unknown)
Exit status: 0 on success, 2 if a file cannot be loaded (an error line names the file).
External data next to the model is loaded only for its size: parameter counts come from dims.
"""
import json
import sys

import onnx
from onnx import TensorProto

FLOAT_TYPES = {
    TensorProto.FLOAT16: 2,
    TensorProto.BFLOAT16: 2,
    TensorProto.FLOAT: 4,
    TensorProto.DOUBLE: 8,
}


def dtype_name(elem_type):
    if elem_type == TensorProto.BFLOAT16:
        return "bfloat16"
    if elem_type == TensorProto.UNDEFINED:
        return "undefined"
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name
    except Exception:
        return TensorProto.DataType.Name(elem_type).lower()


def value_info(vi):
    t = vi.type
    if not t.HasField("tensor_type"):
        return {"name": vi.name, "dtype": t.WhichOneof("value") or "unknown", "shape": None}
    tt = t.tensor_type
    shape = None
    if tt.HasField("shape"):
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                shape.append(d.dim_param)
            else:
                shape.append(None)
    return {"name": vi.name, "dtype": dtype_name(tt.elem_type), "shape": shape}


def numel(dims):
    n = 1
    for d in dims:
        n *= int(d)
    return n


def stats(path):
    # load_external_data=False: the counts only need dims and types, and big models load faster.
    m = onnx.load(path, load_external_data=False)
    g = m.graph
    ops = {}
    for n in g.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
        ops[key] = ops.get(key, 0) + 1
    params = pbytes = 0
    for init in g.initializer:
        size = FLOAT_TYPES.get(init.data_type)
        if size is None:
            continue
        k = numel(init.dims)
        params += k
        pbytes += k * size
    init_names = {i.name for i in g.initializer}
    return {
        "file": path,
        "nodes": len(g.node),
        "parameters": params,
        "parameter_bytes": pbytes,
        "initializers": len(g.initializer),
        "op_types": dict(sorted(ops.items())),
        "inputs": [value_info(v) for v in g.input if v.name not in init_names],
        "outputs": [value_info(v) for v in g.output],
        "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
    }


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    rc = 0
    for p in argv:
        try:
            print(json.dumps(stats(p)), flush=True)
        except Exception as e:
            print(f"error: {p}: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 2
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
