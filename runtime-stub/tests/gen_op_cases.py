#!/usr/bin/env python3
"""Generate tests/op_cases/mod.rs: single-node ONNX cases with expected outputs.

Inputs are deterministic patterns (the Rust side computes the same values, see `pattern` in
tests/common/mod.rs), so only the expected outputs are inlined. Expected values come from
onnxruntime (float32), cross-checked with numpy where numpy has the op.
Run: python3 runtime-stub/tests/gen_op_cases.py > runtime-stub/tests/op_cases/mod.rs
"""
import math

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def pattern(shape, seed, positive=False):
    n = int(np.prod(shape)) if len(shape) else 1
    i = np.arange(n, dtype=np.int64)
    k = (i * 7 + seed * 13) % 23
    v = (k + 1) / 8.0 if positive else (k - 11) / 8.0
    return v.astype(np.float32).reshape(shape)


CASES = []


def case(name, op, inputs, attrs=None, n_out=1, opset=17, check=None):
    """inputs: list of ('f', name, shape, seed, positive) float graph input,
    ('i', name, values_list, shape) int64 initializer, ('ii', name, values, shape) int64 graph input,
    ('b', name, values, shape) bool graph input, None (omitted)."""
    CASES.append(dict(name=name, op=op, inputs=inputs, attrs=attrs or {}, n_out=n_out, opset=opset, check=check))


def f(name, shape, seed, positive=False):
    return ("f", name, list(shape), seed, positive)


def i64(name, vals, shape=None):
    return ("i", name, list(vals), list(shape if shape is not None else [len(vals)]))


def i64in(name, vals, shape):
    return ("ii", name, list(vals), list(shape))


def b(name, vals, shape):
    return ("b", name, list(vals), list(shape))


# ---- elementwise
case("add_broadcast", "Add", [f("a", [2, 3, 4], 0), f("b", [3, 1], 1)], check=lambda a, b: a + b)
case("sub_broadcast", "Sub", [f("a", [2, 3], 2), f("b", [3], 3)], check=lambda a, b: a - b)
case("mul_broadcast", "Mul", [f("a", [2, 1, 4], 4), f("b", [3, 1], 5)], check=lambda a, b: a * b)
case("div_broadcast", "Div", [f("a", [2, 3], 6), f("b", [2, 1], 7, True)], check=lambda a, b: a / b)
case("pow", "Pow", [f("a", [2, 3], 8, True), f("b", [1], 9)], check=lambda a, b: a ** b)
case("sqrt", "Sqrt", [f("x", [2, 3], 10, True)], check=np.sqrt)
case("exp", "Exp", [f("x", [2, 3], 11)], check=np.exp)
case("log", "Log", [f("x", [2, 3], 12, True)], check=np.log)
case("erf", "Erf", [f("x", [2, 5], 13)], check=np.vectorize(math.erf))
case("tanh", "Tanh", [f("x", [2, 3], 14)], check=np.tanh)
case("sigmoid", "Sigmoid", [f("x", [2, 3], 15)], check=lambda x: 1 / (1 + np.exp(-x)))
case("relu", "Relu", [f("x", [2, 3], 16)], check=lambda x: np.maximum(x, 0))
case("where", "Where", [b("c", [1, 0, 1], [3]), f("x", [2, 3], 17), f("y", [2, 1], 18)],
     check=lambda c, x, y: np.where(c, x, y))
case("identity", "Identity", [f("x", [2, 3], 19)], check=lambda x: x)
case("cast_to_i64", "Cast", [f("x", [2, 3], 20)], {"to": TensorProto.INT64}, check=lambda x: x.astype(np.int64))
case("cast_to_f64", "Cast", [f("x", [2, 3], 21)], {"to": TensorProto.DOUBLE}, check=lambda x: x.astype(np.float64))
# ---- reductions, softmax, layernorm
case("reduce_sum_axes02", "ReduceSum", [f("x", [2, 3, 4], 22), i64("axes", [0, 2])], {"keepdims": 0},
     check=lambda x, a: x.sum(axis=(0, 2)))
case("reduce_sum_keep", "ReduceSum", [f("x", [2, 3, 4], 23), i64("axes", [-2])],
     check=lambda x, a: x.sum(axis=1, keepdims=True))
case("reduce_sum_all", "ReduceSum", [f("x", [2, 3], 24)], {"keepdims": 0}, check=lambda x: x.sum())
case("reduce_mean", "ReduceMean", [f("x", [2, 3, 4], 25)], {"axes": [1, -1]},
     check=lambda x: x.mean(axis=(1, 2), keepdims=True))
case("softmax_last", "Softmax", [f("x", [2, 3, 4], 26)], {"axis": -1},
     check=lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True))
case("softmax_axis1", "Softmax", [f("x", [2, 3, 4], 27)], {"axis": 1},
     check=lambda x: np.exp(x) / np.exp(x).sum(1, keepdims=True))
case("log_softmax", "LogSoftmax", [f("x", [2, 5], 28)], {"axis": -1})
case("layer_norm_last", "LayerNormalization", [f("x", [2, 3, 4], 29), f("s", [4], 30), f("bb", [4], 31)],
     {"axis": -1, "epsilon": 1e-5}, n_out=3)
case("layer_norm_axis1", "LayerNormalization", [f("x", [2, 3, 4], 32), f("s", [3, 4], 33)],
     {"axis": 1}, n_out=3)
# ---- linear algebra
case("einsum_bmm", "Einsum", [f("a", [2, 3, 4], 34), f("b", [2, 4, 5], 35)], {"equation": "bij,bjk->bik"},
     check=lambda a, b: np.einsum("bij,bjk->bik", a, b))
case("einsum_transpose", "Einsum", [f("a", [3, 4], 36)], {"equation": "ij->ji"},
     check=lambda a: a.T)
case("einsum_attn", "Einsum", [f("q", [1, 2, 3, 4], 37), f("k", [1, 2, 5, 4], 38)], {"equation": "bhqd,bhkd->bhqk"},
     check=lambda q, k: np.einsum("bhqd,bhkd->bhqk", q, k))
case("einsum_outer_sum", "Einsum", [f("a", [3], 39), f("b", [4], 40)], {"equation": "i,j->ij"},
     check=lambda a, b: np.outer(a, b))
case("einsum_ellipsis", "Einsum", [f("a", [2, 3, 4], 41), f("b", [4, 2], 42)], {"equation": "...ij,jk->...ik"},
     check=lambda a, b: a @ b)
case("einsum_reduce", "Einsum", [f("a", [2, 3, 4], 43)], {"equation": "ijk->j"},
     check=lambda a: a.sum(axis=(0, 2)))
case("matmul_batched_bcast", "MatMul", [f("a", [2, 1, 3, 4], 44), f("b", [3, 4, 5], 45)], check=np.matmul)
case("matmul_vec", "MatMul", [f("a", [4], 46), f("b", [2, 4, 3], 47)], check=np.matmul)
case("gemm_transb", "Gemm", [f("a", [3, 4], 48), f("b", [5, 4], 49), f("c", [5], 50)],
     {"transB": 1, "alpha": 0.5, "beta": 2.0}, check=lambda a, b, c: 0.5 * a @ b.T + 2.0 * c)
case("gemm_transa", "Gemm", [f("a", [4, 3], 51), f("b", [4, 5], 52)], {"transA": 1},
     check=lambda a, b: a.T @ b)
# ---- conv, pooling, batchnorm
case("conv_pad_stride", "Conv", [f("x", [2, 2, 6, 5], 53), f("w", [3, 2, 3, 3], 54), f("bias", [3], 55)],
     {"pads": [1, 1, 1, 1], "strides": [2, 2]})
case("conv_group_dilation", "Conv", [f("x", [1, 4, 7, 7], 56), f("w", [2, 2, 3, 3], 57)],
     {"group": 2, "dilations": [2, 2], "pads": [1, 2, 0, 1]})
case("conv_1d", "Conv", [f("x", [2, 3, 9], 58), f("w", [4, 3, 3], 59)], {"strides": [2], "pads": [1, 1]})
case("conv_same_upper", "Conv", [f("x", [1, 2, 5, 5], 60), f("w", [2, 2, 2, 2], 61)], {"auto_pad": "SAME_UPPER"})
case("conv_transpose_s2", "ConvTranspose", [f("x", [2, 3, 3, 4], 62), f("w", [3, 2, 3, 3], 63), f("bias", [2], 64)],
     {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]})
case("conv_transpose_group_dil", "ConvTranspose", [f("x", [1, 4, 3, 3], 65), f("w", [4, 1, 2, 3], 66)],
     {"group": 2, "dilations": [2, 1]})
case("conv_transpose_1d", "ConvTranspose", [f("x", [1, 2, 5], 67), f("w", [2, 3, 3], 68)], {"strides": [3]})
case("conv_transpose_output_shape", "ConvTranspose", [f("x", [1, 1, 3, 3], 69), f("w", [1, 1, 3, 3], 70)],
     {"strides": [2, 2], "output_shape": [6, 6]})
case("maxpool_indices", "MaxPool", [f("x", [2, 2, 5, 6], 71)],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, n_out=2)
case("maxpool_ceil", "MaxPool", [f("x", [1, 2, 6, 6], 72)],
     {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, n_out=2)
case("avgpool_exclude_pad", "AveragePool", [f("x", [1, 2, 5, 5], 73)],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
case("avgpool_include_pad", "AveragePool", [f("x", [1, 2, 5, 5], 74)],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1})
case("global_avg_pool", "GlobalAveragePool", [f("x", [2, 3, 4, 5], 75)],
     check=lambda x: x.mean(axis=(2, 3), keepdims=True))
case("batchnorm", "BatchNormalization",
     [f("x", [2, 3, 4], 76), f("s", [3], 77), f("bb", [3], 78), f("m", [3], 79), f("v", [3], 80, True)],
     {"epsilon": 1e-5})
# ---- shape and indexing
case("transpose", "Transpose", [f("x", [2, 3, 4], 81)], {"perm": [2, 0, 1]},
     check=lambda x: x.transpose(2, 0, 1))
case("reshape", "Reshape", [f("x", [2, 3, 4], 82), i64("shape", [0, -1, 2])],
     check=lambda x, s: x.reshape(2, 6, 2))
case("expand", "Expand", [f("x", [3, 1], 83), i64("shape", [2, 1, 4])],
     check=lambda x, s: np.broadcast_to(x, (2, 3, 4)))
case("concat", "Concat", [f("a", [2, 1, 3], 84), f("b", [2, 2, 3], 85)], {"axis": 1},
     check=lambda a, b: np.concatenate([a, b], 1))
case("split", "Split", [f("x", [2, 5], 86), i64("split", [2, 3])], {"axis": 1}, n_out=2)
case("split_equal", "Split", [f("x", [6, 2], 87)], {"axis": 0}, n_out=3)
case("slice_steps", "Slice", [f("x", [4, 6], 88), i64("st", [-1, 1]), i64("en", [-10, 100]), i64("ax", [0, 1]),
                              i64("sp", [-2, 2])],
     check=lambda x, *a: x[::-2, 1::2])
case("slice_basic", "Slice", [f("x", [3, 4, 5], 89), i64("st", [1]), i64("en", [-1]), i64("ax", [2])],
     check=lambda x, *a: x[:, :, 1:-1])
case("pad_constant", "Pad", [f("x", [2, 3], 90), i64("pads", [0, 1, 1, 2]), f("cv", [], 91)],
     {"mode": "constant"})
case("pad_reflect", "Pad", [f("x", [3, 4], 92), i64("pads", [1, 2, 2, 1])], {"mode": "reflect"},
     check=lambda x, p: np.pad(x, ((1, 2), (2, 1)), mode="reflect"))
case("pad_edge", "Pad", [f("x", [3, 4], 93), i64("pads", [2, 0, 0, 3])], {"mode": "edge"},
     check=lambda x, p: np.pad(x, ((2, 0), (0, 3)), mode="edge"))
case("gather_neg", "Gather", [f("x", [3, 4], 94), i64("idx", [3, -1, 0, 2], [2, 2])], {"axis": 1},
     check=lambda x, i: np.take(x, np.array([[3, 3], [0, 2]]), axis=1))
case("gather_elements", "GatherElements", [f("x", [3, 4], 95), i64("idx", [0, 3, 1, 2, 2, -1], [3, 2])], {"axis": 1})
case("gather_nd", "GatherND", [f("x", [2, 3, 4], 96), i64("idx", [1, 2, 0, 1], [2, 2])])
case("scatter_nd_add", "ScatterND", [f("x", [4, 3], 97), i64("idx", [1, 3, 1], [3, 1]), f("u", [3, 3], 98)],
     {"reduction": "add"})
case("scatter_nd_none", "ScatterND", [f("x", [2, 3], 99), i64("idx", [1, 2, 0, 0], [2, 2]), f("u", [2], 100)])
case("scatter_elements_add", "ScatterElements",
     [f("x", [3, 4], 101), i64("idx", [0, 0, 3, 1, 1, 1], [3, 2]), f("u", [3, 2], 102)],
     {"axis": 1, "reduction": "add"})
case("scatter_elements_none", "ScatterElements",
     [f("x", [3, 3], 103), i64("idx", [1, 0, 2, 0, 2, 1], [2, 3]), f("u", [2, 3], 104)], {"axis": 0})
case("trilu_lower", "Trilu", [f("x", [2, 3, 4], 105), i64("k", [1], [])], {"upper": 0},
     check=lambda x, k: np.tril(x, 1))
case("where_int_mask", "Where", [b("c", [1, 0, 0, 1], [2, 2]), f("x", [2, 2], 106), f("y", [], 107)],
     check=lambda c, x, y: np.where(c, x, y))
case("cumsum", "CumSum", [f("x", [2, 3], 108), i64("ax", [1], [])], check=lambda x, a: np.cumsum(x, axis=1))

# ---- activations, normalisations, ConvTranspose padding and Pad modes for the autodiff rules
case("hard_sigmoid", "HardSigmoid", [f("x", [2, 6], 109)], {"alpha": 0.7, "beta": 0.4},
     check=lambda x: np.clip(0.7 * x + 0.4, 0, 1))
case("hard_swish", "HardSwish", [f("x", [4, 6], 110)], check=lambda x: x * np.clip(x / 6 + 0.5, 0, 1))
case("elu", "Elu", [f("x", [2, 6], 111)], {"alpha": 0.3}, check=lambda x: np.where(x > 0, x, 0.3 * np.expm1(x)))
case("selu", "Selu", [f("x", [2, 6], 112)])
case("selu_attrs", "Selu", [f("x", [2, 6], 113)], {"alpha": 1.2, "gamma": 0.8},
     check=lambda x: 0.8 * np.where(x > 0, x, 1.2 * np.expm1(x)))
case("celu", "Celu", [f("x", [2, 6], 114)], {"alpha": 2.5},
     check=lambda x: np.maximum(x, 0) + np.minimum(0, 2.5 * np.expm1(x / 2.5)))
case("softplus", "Softplus", [f("x", [2, 6], 115)], check=lambda x: np.log1p(np.exp(x)))
case("softsign", "Softsign", [f("x", [2, 6], 116)], check=lambda x: x / (1 + np.abs(x)))
case("mish", "Mish", [f("x", [2, 6], 117)], opset=18, check=lambda x: x * np.tanh(np.log1p(np.exp(x))))
case("thresholded_relu", "ThresholdedRelu", [f("x", [2, 6], 118)], {"alpha": 0.4},
     check=lambda x: np.where(x > 0.4, x, 0))
case("prelu", "PRelu", [f("x", [2, 3, 4], 119), f("s", [3, 1], 120)], check=lambda x, s: np.where(x < 0, s * x, x))
case("instance_norm", "InstanceNormalization", [f("x", [2, 3, 4, 2], 121), f("s", [3], 122), f("bb", [3], 123)],
     {"epsilon": 1e-3})
case("group_norm_18", "GroupNormalization", [f("x", [2, 6, 3], 124), f("s", [3], 125), f("bb", [3], 126)],
     {"num_groups": 3}, opset=18)
case("group_norm_21", "GroupNormalization", [f("x", [2, 6, 3], 127), f("s", [6], 128), f("bb", [6], 129)],
     {"num_groups": 2}, opset=21)
case("conv_transpose_same_upper", "ConvTranspose", [f("x", [1, 2, 3, 3], 130), f("w", [2, 3, 3, 3], 131)],
     {"strides": [2, 2], "auto_pad": "SAME_UPPER"})
case("conv_transpose_same_lower", "ConvTranspose", [f("x", [1, 2, 3, 3], 132), f("w", [2, 3, 3, 3], 133)],
     {"strides": [2, 2], "auto_pad": "SAME_LOWER"})
case("conv_transpose_valid", "ConvTranspose", [f("x", [1, 2, 3, 3], 134), f("w", [2, 2, 2, 3], 135)],
     {"strides": [2, 3], "auto_pad": "VALID"})
case("conv_transpose_output_shape_odd", "ConvTranspose", [f("x", [1, 2, 3, 4], 136), f("w", [2, 2, 3, 3], 137)],
     {"strides": [2, 1], "output_shape": [6, 5]})
case("conv_transpose_outpad_dil", "ConvTranspose", [f("x", [2, 2, 4], 138), f("w", [2, 3, 2], 139)],
     {"dilations": [3], "strides": [3], "output_padding": [2], "pads": [1, 0]})
case("pad_wrap", "Pad", [f("x", [3, 4], 140), i64("pads", [1, 2, 2, 1])], {"mode": "wrap"}, opset=19,
     check=lambda x, p: np.pad(x, ((1, 2), (2, 1)), mode="wrap"))
case("pad_reflect_axes", "Pad", [f("x", [2, 3, 4], 141), i64("pads", [1, 2, 2, 1]), None, i64("ax", [-1, 1])],
     {"mode": "reflect"}, opset=18, check=lambda x, p, a: np.pad(x, ((0, 0), (2, 1), (1, 2)), mode="reflect"))


def make_model(c, dtype=np.float32):
    inputs, inits, names = [], [], []
    feeds = {}
    for spec in c["inputs"]:
        if spec is None:
            names.append("")
            continue
        kind, name = spec[0], spec[1]
        names.append(name)
        if kind == "f":
            v = pattern(spec[2], spec[3], spec[4]).astype(dtype)
            feeds[name] = v
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
        elif kind == "i":
            v = np.array(spec[2], dtype=np.int64).reshape(spec[3])
            inits.append(onnx.numpy_helper.from_array(v, name))
        elif kind == "ii":
            v = np.array(spec[2], dtype=np.int64).reshape(spec[3])
            feeds[name] = v
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, v.shape))
        elif kind == "b":
            v = np.array(spec[2], dtype=bool).reshape(spec[3])
            feeds[name] = v
            inputs.append(helper.make_tensor_value_info(name, TensorProto.BOOL, v.shape))
    outs = [f"y{k}" for k in range(c["n_out"])]
    node = helper.make_node(c["op"], names, outs, name="n0", **c["attrs"])
    g = helper.make_graph([node], c["name"], inputs,
                          [helper.make_empty_tensor_value_info(o) for o in outs],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", c["opset"])])
    m.ir_version = 10 if c["opset"] >= 21 else 8
    return m, feeds


def rust_attr(k, v):
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, int):
        return f'("{k}", Attr::Int({v}))'
    if isinstance(v, float):
        return f'("{k}", Attr::Float({v!r}))'
    if isinstance(v, str):
        return f'("{k}", Attr::String("{v}".into()))'
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return f'("{k}", Attr::Ints(vec!{v}))'
    raise ValueError(v)


def rust_input(spec):
    if spec is None:
        return "Arg::Omitted"
    kind, name = spec[0], spec[1]
    if kind == "f":
        return f'Arg::Float("{name}", vec!{spec[2]}, {spec[3]}, {str(spec[4]).lower()})'
    if kind == "i":
        return f'Arg::IntConst("{name}", vec!{spec[3]}, vec!{spec[2]})'
    if kind == "ii":
        return f'Arg::IntInput("{name}", vec!{spec[3]}, vec!{spec[2]})'
    if kind == "b":
        return f'Arg::Bool("{name}", vec!{spec[3]}, vec!{[bool(x) for x in spec[2]]})'.replace("True", "true").replace("False", "false")


def fmt(x):
    return repr(float(x)) if np.isfinite(x) else ("f64::INFINITY" if x > 0 else "f64::NEG_INFINITY")


def main():
    out = ["// @generated by gen_op_cases.py from onnxruntime " + ort.__version__ + " (float32). Do not edit.",
           "#![allow(clippy::all)]", "use super::common::{Arg, Case, Expect};", "use pipec_compiler::ir::Attr;", "",
           "pub fn cases() -> Vec<Case> {", "    vec!["]
    for c in CASES:
        m, feeds = make_model(c)
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        res = sess.run(None, feeds)
        if c["check"] is not None:
            args = []
            for spec in c["inputs"]:
                if spec is None:
                    continue
                if spec[0] == "f":
                    args.append(feeds[spec[1]].astype(np.float64))
                elif spec[0] in ("ii", "b"):
                    args.append(feeds[spec[1]])
                else:
                    args.append(np.array(spec[2]))
            want = np.asarray(c["check"](*args))
            assert want.shape == res[0].shape, (c["name"], want.shape, res[0].shape)
            err = np.abs(want.astype(np.float64) - res[0].astype(np.float64)).max() if want.size else 0
            assert err < 1e-5, (c["name"], err)
        exps = []
        for r in res:
            r = np.asarray(r)
            kind = "Int" if r.dtype.kind in "iub" else "Float"
            data = ", ".join(str(int(x)) if kind == "Int" else fmt(x) for x in r.reshape(-1))
            exps.append(f"Expect::{kind}(vec!{list(r.shape)}, vec![{data}])")
        out.append("        Case {")
        out.append(f'            name: "{c["name"]}",')
        out.append(f'            op: "{c["op"]}",')
        out.append(f'            opset: {c["opset"]},')
        out.append(f'            attrs: vec![{", ".join(rust_attr(k, v) for k, v in c["attrs"].items())}],')
        out.append(f'            inputs: vec![{", ".join(rust_input(s) for s in c["inputs"])}],')
        out.append(f'            expect: vec![{", ".join(exps)}],')
        out.append("        },")
    out += ["    ]", "}", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
