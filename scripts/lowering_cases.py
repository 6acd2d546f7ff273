#!/usr/bin/env python3
"""Test models for the `lower` pass (LSTM, GRU, Resize/Upsample) with onnxruntime references.

usage: lowering_cases.py OUTDIR
For every case writes OUTDIR/NAME.onnx (float64: every operand, X included, is an initializer,
so autodiff differentiates all of them), OUTDIR/NAME.f32.onnx (the same model in float32) and
OUTDIR/NAME.ref.npz (the outputs onnxruntime computes for the float32 model; ORT has no double
kernels for LSTM, GRU and Resize). Data are float32 values (exactly representable in float64),
so the float64 lowering is compared to the same numbers. Run by passes/tests/lowering.rs.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

rng = np.random.default_rng(int(os.environ.get("PIPEC_LOWER_SEED", "2024")))
N = h.make_node


def retype(nodes, et):
    """Copies of `nodes` whose subgraphs declare float values as `et`."""
    out = []
    for n in nodes:
        n = onnx.NodeProto.FromString(n.SerializeToString())
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                for vi in list(a.g.input) + list(a.g.output) + list(a.g.value_info):
                    if vi.type.tensor_type.elem_type == T.FLOAT:
                        vi.type.tensor_type.elem_type = et
                sub = retype(a.g.node, et)
                del a.g.node[:]
                a.g.node.extend(sub)
        out.append(n)
    return out


def build(name, nodes, params, ints, n_out, opset, dtype):
    nodes = retype(nodes, T.DOUBLE if dtype == np.float64 else T.FLOAT)
    inits = [nh.from_array(a.astype(dtype), p) for p, a in params.items()]
    inits += [nh.from_array(np.asarray(a), p) for p, a in ints.items()]
    et = T.DOUBLE if dtype == np.float64 else T.FLOAT
    outs = [h.make_tensor_value_info(f"y{i}" if n_out > 1 else "y", et, None) for i in range(n_out)]
    g = h.make_graph(nodes, name, [], outs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


CASES = []


def case(name, nodes, params, ints=None, n_out=1, opset=17, scale=1.0, ref_nodes=None):
    """params: {name: shape or array} float operands (float32-representable values);
    ref_nodes: an equivalent graph for onnxruntime where it lacks the form (RNN layout 1)."""
    vals = {}
    for p, s in params.items():
        a = s if isinstance(s, np.ndarray) else rng.standard_normal(s) * scale
        vals[p] = np.asarray(a, np.float32)
    CASES.append((name, nodes, vals, ints or {}, n_out, opset, ref_nodes or nodes))


def rnn(op, name, seq=3, batch=2, inp=4, hid=3, direction="forward", bias=True, init_h=False,
        init_c=False, peep=False, outs=("y",), attrs=None, seq_lens=False, layout=0):
    g = 4 if op == "LSTM" else 3
    d = 2 if direction == "bidirectional" else 1
    xs = (seq, batch, inp) if layout == 0 else (batch, seq, inp)
    ss = (d, batch, hid) if layout == 0 else (batch, d, hid)
    params = {"x": xs, "w": (d, g * hid, inp), "r": (d, g * hid, hid)}
    ins = ["x", "w", "r", "", "", "", "", ""]
    ints = {}
    if bias:
        params["b"] = (d, 2 * g * hid)
        ins[3] = "b"
    if seq_lens:
        ints["sl"] = np.full((batch,), seq, np.int32)
        ins[4] = "sl"
    if init_h:
        params["h0"] = ss
        ins[5] = "h0"
    if init_c:
        params["c0"] = ss
        ins[6] = "c0"
    if peep:
        params["p"] = (d, 3 * hid)
        ins[7] = "p"
    if op == "GRU":
        ins = ins[:6]
    while ins and ins[-1] == "":
        ins.pop()
    a = dict(hidden_size=hid, direction=direction, layout=layout)
    a.update(attrs or {})
    node = N(op, ins, list(outs), **a)
    ref = None
    if layout == 1:
        # onnxruntime runs layout 0 only: the reference transposes around it.
        a0 = dict(a, layout=0)
        rins = [f"{i}_t" if i in ("x", "h0", "c0") else i for i in ins]
        ref = [N("Transpose", [i], [f"{i}_t"], perm=[1, 0, 2]) for i in ins if i in ("x", "h0", "c0")]
        ref.append(N(op, rins, [f"{o}_t" if o else "" for o in outs], **a0))
        for k, o in enumerate(outs):
            if o:
                perm = [2, 0, 1, 3] if k == 0 else [1, 0, 2]
                ref.append(N("Transpose", [f"{o}_t"], [o], perm=perm))
    case(name, [node], params, ints, n_out=sum(1 for o in outs if o), scale=0.7, ref_nodes=ref)


def resize(name, xshape, attrs, scales=None, sizes=None, opset=17, op="Resize"):
    ints = {}
    params = {"x": xshape}
    if op == "Upsample" or opset < 11:
        ins = ["x", "s"]
        ints["s"] = np.asarray(scales, np.float32)
    else:
        ins = ["x", "", "", ""]
        if scales is not None:
            ins[2] = "s"
            ints["s"] = np.asarray(scales, np.float32)
        if sizes is not None:
            ins[3] = "z"
            ints["z"] = np.asarray(sizes, np.int64)
        while ins[-1] == "":
            ins.pop()
    case(name, [N(op, ins, ["y"], **attrs)], params, ints, opset=opset)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    F = T.FLOAT
    rnn("LSTM", "lstm_fwd")
    rnn("LSTM", "lstm_bidi_states_peep", direction="bidirectional", init_h=True, init_c=True,
        peep=True, outs=("y0", "y1", "y2"))
    rnn("LSTM", "lstm_reverse_clip_layout1", direction="reverse", init_h=True, layout=1,
        attrs=dict(clip=0.6))
    rnn("LSTM", "lstm_yh_only_relu", bias=False, outs=("", "y"),
        attrs=dict(activations=["Sigmoid", "Relu", "Tanh"]))
    rnn("LSTM", "lstm_yc_only_seqlens", seq_lens=True, init_c=True, outs=("", "", "y"))
    rnn("GRU", "gru_fwd")
    rnn("GRU", "gru_bidi_lbr", direction="bidirectional", init_h=True, outs=("y0", "y1"),
        attrs=dict(linear_before_reset=1))
    rnn("GRU", "gru_reverse_lbr_nobias", direction="reverse", bias=False, init_h=True,
        attrs=dict(linear_before_reset=1))
    rnn("GRU", "gru_layout1_yh", layout=1, init_h=True, outs=("", "y"))
    rnn("GRU", "gru_lbr_no_state", attrs=dict(linear_before_reset=1), seq=4, hid=2)

    x4 = (1, 2, 3, 4)
    resize("resize_nearest_up2", x4, dict(mode="nearest"), scales=[1, 1, 2, 2])
    resize("resize_nearest_asym_floor", x4,
           dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
           scales=[1, 1, 3, 1.5])
    resize("resize_nearest_ceil_sizes_down", (1, 1, 5, 7),
           dict(mode="nearest", coordinate_transformation_mode="tf_half_pixel_for_nn",
                nearest_mode="ceil"), sizes=[1, 1, 3, 4])
    resize("resize_nearest_prefer_ceil", x4,
           dict(mode="nearest", coordinate_transformation_mode="align_corners",
                nearest_mode="round_prefer_ceil"), sizes=[1, 2, 5, 7])
    resize("resize_linear_half_pixel", x4, dict(mode="linear"), scales=[1, 1, 2, 2])
    resize("resize_linear_align_corners", x4,
           dict(mode="linear", coordinate_transformation_mode="align_corners"), sizes=[1, 2, 5, 7])
    resize("resize_linear_asymmetric", x4,
           dict(mode="linear", coordinate_transformation_mode="asymmetric"), scales=[1, 1, 1.5, 0.75])
    resize("resize_linear_pytorch_down", (2, 1, 6, 5),
           dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
           sizes=[2, 1, 3, 1])
    resize("resize_cubic", x4, dict(mode="cubic"), scales=[1, 1, 2, 2])
    resize("resize_cubic_exclude", (1, 1, 4, 5),
           dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), sizes=[1, 1, 7, 3])
    resize("resize_nearest_axis0", (2, 3, 4), dict(mode="nearest"), scales=[2, 1, 1])
    resize("resize_opset10_nearest", x4, dict(mode="nearest"), scales=[1, 1, 2, 3], opset=10)
    resize("upsample_opset9_linear", x4, dict(mode="linear"), scales=[1, 1, 2, 2], opset=9,
           op="Upsample")
    resize("resize_opset18_axes_keep_aspect", x4,
           dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy="not_larger"),
           sizes=[5, 6], opset=18)
    resize("resize_opset19_symmetric", x4,
           dict(mode="linear", coordinate_transformation_mode="half_pixel_symmetric"),
           scales=[1, 1, 1.7, 2.3], opset=19)

    # Scales as a constant expression (torch's bilinear up-sampling, UNet decoders): shape
    # inference may not know the output, so the lowering takes floor(in * scale).
    case("resize_linear_scales_concat",
         [N("Constant", [], ["s01"], value=nh.from_array(np.array([1, 1], np.float32))),
          N("Constant", [], ["s23"], value=nh.from_array(np.array([2, 2], np.float32))),
          N("Concat", ["s01", "s23"], ["s"], axis=0),
          N("Resize", ["x", "", "s"], ["y"], mode="linear",
            coordinate_transformation_mode="align_corners")],
         {"x": x4})

    # Control flow. A loop of 3 iterations: carried accumulator, scan output, the iteration
    # number used as an index into an outer tensor, captured outer parameters.
    F = T.FLOAT
    body = h.make_graph(
        [N("Gather", ["rows", "i"], ["row"], axis=0),
         N("Mul", ["row", "w"], ["rw"]),
         N("Tanh", ["rw"], ["t"]),
         N("Add", ["acc_in", "t"], ["acc_out"]),
         N("Mul", ["acc_out", "t"], ["scan"]),
         N("Identity", ["c_in"], ["c_out"])],
        "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("acc_in", F, None)],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("acc_out", F, None),
         h.make_tensor_value_info("scan", F, None)])
    case("loop_const_trip", [N("Loop", ["m", "", "a0"], ["y0", "y1"], body=body)],
         {"rows": (3, 4), "w": (4,), "a0": (4,)}, {"m": np.array(3, np.int64)}, n_out=2)
    # Trip count from a shape (what nn.EmbeddingBag exports to), constant cond, Cast cond_out.
    body2 = h.make_graph(
        [N("Gather", ["rows", "i"], ["row"], axis=0),
         N("Sigmoid", ["row"], ["s"]),
         N("Mul", ["s", "acc_in"], ["acc_out"]),
         N("Constant", [], ["one"], value=h.make_tensor("one", T.INT64, [], [1])),
         N("Cast", ["one"], ["c_out"], to=T.BOOL)],
        "body2",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("acc_in", F, None)],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("acc_out", F, None)])
    case("loop_shape_trip", [
        N("Shape", ["rows"], ["sh"]),
        N("Gather", ["sh", "zero"], ["n"], axis=0),
        N("Loop", ["n", "t", "a0"], ["y"], body=body2)],
        {"rows": (5, 3), "a0": (3,)},
        {"zero": np.array(0, np.int64), "t": np.array(True)})
    # If on a constant, a Loop nested in the branch taken; the other branch would fail.
    inner = h.make_graph(
        [N("Mul", ["acc_in", "w"], ["acc_out"]), N("Identity", ["c_in"], ["c_out"])],
        "inner",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c_in", T.BOOL, []),
         h.make_tensor_value_info("acc_in", F, None)],
        [h.make_tensor_value_info("c_out", T.BOOL, []), h.make_tensor_value_info("acc_out", F, None)])
    then_b = h.make_graph(
        [N("Loop", ["m", "", "a0"], ["l"], body=inner), N("Add", ["l", "b"], ["o"])],
        "then", [], [h.make_tensor_value_info("o", F, None)])
    else_b = h.make_graph([N("Sub", ["a0", "b"], ["o2"])], "else", [],
                          [h.make_tensor_value_info("o2", F, None)])
    case("if_const_nested_loop", [N("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b)],
         {"a0": (2, 3), "w": (3,), "b": (2, 3)},
         {"c": np.array(True), "m": np.array(2, np.int64)})

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    for name, nodes, vals, ints, n_out, opset, ref_nodes in CASES:
        m32 = build(name, nodes, vals, ints, n_out, opset, np.float32)
        m64 = build(name, nodes, vals, ints, n_out, opset, np.float64)
        mref = build(name, ref_nodes, vals, ints, n_out, opset, np.float32)
        sess = ort.InferenceSession(mref.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in m32.graph.output]
        res = sess.run(names, {})
        onnx.save(m64, os.path.join(out, f"{name}.onnx"))
        onnx.save(m32, os.path.join(out, f"{name}.f32.onnx"))
        np.savez(os.path.join(out, f"{name}.ref.npz"),
                 **{k: np.asarray(v, np.float64) for k, v in zip(names, res)})
    print(f"{len(CASES)} cases written to {out}")


if __name__ == "__main__":
    main()
