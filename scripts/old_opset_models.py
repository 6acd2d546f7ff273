#!/usr/bin/env python3
"""Small models in older default-domain opsets (7 to 12), for pipec's opset upgrade tests.

  old_opset_models.py gen DIR       writes, per case NAME: NAME.onnx (the old opset),
                                    NAME.in.npz (one array per graph input), NAME.ref.npz
                                    (onnxruntime on NAME.onnx: `output/<name>`), and
                                    NAME.conv17.onnx (onnx.version_converter to 17) when the
                                    converter handles the model. DIR/cases.txt lists
                                    `NAME trainable|forward`.
  old_opset_models.py compare DIR   for every NAME.up.onnx (the model as pipec upgraded it):
                                    onnx.checker full_check, default-domain opset 17, and
                                    onnxruntime's outputs equal NAME.ref.npz.

Needs onnx, onnxruntime and numpy.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper as h, numpy_helper as nh

F = TensorProto.FLOAT
rng = np.random.default_rng(7)


def w(name, *shape, scale=0.5):
    return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def ints(name, vals):
    return nh.from_array(np.array(vals, dtype=np.int64), name)


def model(name, opset, nodes, inputs, outputs, inits):
    g = h.make_graph(nodes, name, inputs, outputs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 6 if opset <= 12 else 8
    onnx.checker.check_model(m, full_check=True)
    return m


def vi(name, dtype, shape):
    return h.make_tensor_value_info(name, dtype, shape)


def cases():
    N = h.make_node
    out = []
    # A CNN at opset 9: BatchNormalization-9, Clip/Pad/Slice attributes, Dropout-7 ratio,
    # Softmax on the last axis of a 2-D input.
    out.append(("cnn_op9", True, model("cnn_op9", 9, [
        N("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        N("BatchNormalization", ["c", "s", "b", "mu", "var"], ["bn"]),
        N("Clip", ["bn"], ["cl"], min=0.0, max=6.0),
        N("Pad", ["cl"], ["pd"], pads=[0, 0, 1, 1, 0, 0, 1, 1], value=0.5),
        N("MaxPool", ["pd"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        N("Slice", ["mp"], ["sl"], starts=[1], ends=[4], axes=[1]),
        N("Flatten", ["sl"], ["fl"]),
        N("Dropout", ["fl"], ["dr"], ratio=0.3),
        N("Gemm", ["dr", "W2", "B2"], ["g"]),
        N("Softmax", ["g"], ["y"], axis=1),
    ], [vi("x", F, [2, 3, 8, 8])], [vi("y", F, [2, 5])], [
        w("W", 4, 3, 3, 3), w("B", 4), w("s", 4), w("b", 4), w("mu", 4, scale=0.1),
        nh.from_array(np.abs(rng.standard_normal(4)).astype(np.float32) + 0.5, "var"),
        w("W2", 75, 5, scale=0.2), w("B2", 5)])))
    # A sequence model at opset 11: Softmax on a middle axis (the 2-D coercion), axes/split
    # attributes, Dropout-11 with an unread mask, LogSoftmax on the last axis.
    out.append(("seq_op11", True, model("seq_op11", 11, [
        N("MatMul", ["x", "W"], ["m"]),
        N("Softmax", ["m"], ["sm"], axis=1),
        N("Unsqueeze", ["sm"], ["u"], axes=[1]),
        N("Squeeze", ["u"], ["sq"], axes=[1]),
        N("Split", ["sq"], ["a", "b"], axis=2, split=[2, 4]),
        N("ReduceSum", ["a"], ["r"], axes=[2], keepdims=1),
        N("Mul", ["r", "b"], ["p"]),
        N("Dropout", ["p"], ["d", "mask"], ratio=0.1),
        N("Clip", ["d", "lo"], ["c"]),
        N("LogSoftmax", ["c"], ["y"], axis=2),
    ], [vi("x", F, [2, 4, 6])], [vi("y", F, [2, 4, 4])], [
        w("W", 6, 6), nh.from_array(np.array(-0.5, dtype=np.float32), "lo")])))
    # A transformer block at opset 12: embedding Gather (its gradient needs opset 16),
    # attention with Softmax on the last axis of a 3-D input, a LayerNorm spelled out with
    # ReduceMean (unchanged), Unsqueeze/Squeeze with axes attributes.
    out.append(("attn_op12", True, model("attn_op12", 12, [
        N("Gather", ["E", "ids"], ["x"]),
        N("MatMul", ["x", "Wq"], ["q"]),
        N("MatMul", ["x", "Wk"], ["k"]),
        N("MatMul", ["x", "Wv"], ["v"]),
        N("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        N("MatMul", ["q", "kt"], ["s0"]),
        N("Div", ["s0", "scale"], ["s"]),
        N("Softmax", ["s"], ["p"], axis=2),
        N("MatMul", ["p", "v"], ["o"]),
        N("Add", ["o", "x"], ["res"]),
        N("ReduceMean", ["res"], ["mean"], axes=[-1]),
        N("Sub", ["res", "mean"], ["cen"]),
        N("Mul", ["cen", "cen"], ["sq"]),
        N("ReduceMean", ["sq"], ["var"], axes=[-1]),
        N("Add", ["var", "eps"], ["ve"]),
        N("Sqrt", ["ve"], ["sd"]),
        N("Div", ["cen", "sd"], ["nrm"]),
        N("Mul", ["nrm", "gamma"], ["sc"]),
        N("Add", ["sc", "beta"], ["ln"]),
        N("Unsqueeze", ["ln"], ["u"], axes=[0]),
        N("Squeeze", ["u"], ["y"], axes=[0]),
    ], [vi("ids", TensorProto.INT64, [2, 5])], [vi("y", F, [2, 5, 8])], [
        w("E", 10, 8), w("Wq", 8, 8), w("Wk", 8, 8), w("Wv", 8, 8),
        nh.from_array(np.array(np.sqrt(8.0), dtype=np.float32), "scale"),
        nh.from_array(np.array(1e-5, dtype=np.float32), "eps"),
        w("gamma", 8), w("beta", 8)])))
    # Forward-only rewrites (ops pipec's runtime does not execute): Resize-10, Upsample-9 and
    # -7, TopK-1's k attribute, Hardmax on a middle axis, Scatter-9.
    out.append(("resize_op10", False, model("resize_op10", 10, [
        N("Resize", ["x", "sc"], ["yn"], mode="nearest"),
        N("Resize", ["x", "sc"], ["yl"], mode="linear"),
    ], [vi("x", F, [1, 2, 3, 4])], [vi("yn", F, [1, 2, 6, 8]), vi("yl", F, [1, 2, 6, 8])],
        [nh.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "sc")])))
    out.append(("upsample_op9", False, model("upsample_op9", 9, [
        N("Upsample", ["x", "sc"], ["yn"], mode="nearest"),
        N("Upsample", ["x", "sc"], ["yl"], mode="linear"),
    ], [vi("x", F, [1, 2, 3, 4])], [vi("yn", F, [1, 2, 6, 12]), vi("yl", F, [1, 2, 6, 12])],
        [nh.from_array(np.array([1, 1, 2, 3], dtype=np.float32), "sc")])))
    out.append(("upsample_op7", False, model("upsample_op7", 7, [
        N("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 2.0]),
    ], [vi("x", F, [1, 2, 3, 4])], [vi("y", F, [1, 2, 6, 8])], [])))
    out.append(("misc_op9", False, model("misc_op9", 9, [
        N("TopK", ["x"], ["tv", "ti"], k=3, axis=1),
        N("Hardmax", ["z"], ["hm"], axis=1),
        N("Scatter", ["x", "idx", "upd"], ["sc"], axis=1),
    ], [vi("x", F, [2, 6]), vi("z", F, [2, 3, 4])],
        [vi("tv", F, [2, 3]), vi("ti", TensorProto.INT64, [2, 3]), vi("hm", F, [2, 3, 4]),
         vi("sc", F, [2, 6])],
        [ints("idx", [[0, 5], [3, 1]]), w("upd", 2, 2)])))
    return out


def random_input(v):
    t = v.type.tensor_type
    shape = [d.dim_value for d in t.shape.dim]
    if t.elem_type == TensorProto.INT64:
        return rng.integers(0, 10, size=shape).astype(np.int64)
    return rng.standard_normal(shape).astype(np.float32)


def run(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, feeds)))


def gen(d):
    os.makedirs(d, exist_ok=True)
    lines = []
    for name, trainable, m in cases():
        p = os.path.join(d, name + ".onnx")
        onnx.save(m, p)
        feeds = {v.name: random_input(v) for v in m.graph.input}
        np.savez(os.path.join(d, name + ".in.npz"), **feeds)
        ref = run(p, feeds)
        np.savez(os.path.join(d, name + ".ref.npz"), **{"output/" + k: v for k, v in ref.items()})
        try:
            c = onnx.version_converter.convert_version(m, 17)
            onnx.checker.check_model(c, full_check=True)
            onnx.save(c, os.path.join(d, name + ".conv17.onnx"))
            conv = "converted"
        except Exception as e:  # the converter lacks some adapters (e.g. Upsample)
            conv = "not converted: " + str(e).splitlines()[0][:80]
        lines.append(f"{name} {'trainable' if trainable else 'forward'}")
        print(f"{name}: opset {m.opset_import[0].version}, {conv}")
    with open(os.path.join(d, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def compare(d):
    bad = 0
    names = [l.split()[0] for l in open(os.path.join(d, "cases.txt")) if l.strip()]
    for name in names:
        p = os.path.join(d, name + ".up.onnx")
        m = onnx.load(p)
        onnx.checker.check_model(m, full_check=True)
        ops = {o.domain: o.version for o in m.opset_import}
        if ops.get("", ops.get("ai.onnx")) != 17:
            print(f"{name}: upgraded model declares {ops}, not opset 17")
            bad += 1
            continue
        feeds = dict(np.load(os.path.join(d, name + ".in.npz")))
        ref = np.load(os.path.join(d, name + ".ref.npz"))
        got = run(p, feeds)
        worst = 0.0
        for k in ref.files:
            a, b = got[k[len("output/"):]], ref[k]
            if a.shape != b.shape:
                print(f"{name}: {k} has shape {a.shape}, expected {b.shape}")
                bad += 1
                continue
            if a.dtype.kind in "iub":
                err = float(np.max(a != b)) if a.size else 0.0
            else:
                err = float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12)) if a.size else 0.0
            worst = max(worst, err)
        ok = worst <= 1e-5
        bad += not ok
        print(f"{name}: max relative difference {worst:.2e} {'ok' if ok else 'FAIL'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("gen", "compare"):
        sys.exit(__doc__)
    (gen if sys.argv[1] == "gen" else compare)(sys.argv[2])
