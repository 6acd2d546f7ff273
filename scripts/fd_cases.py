#!/usr/bin/env python3
"""Single-op (and a few multi-op) test models for the autodiff finite-difference check.

usage: fd_cases.py OUTDIR
Writes OUTDIR/NAME.onnx for every case: all float operands are random initializers (the
parameters autodiff differentiates), integer operands (indices, shapes) are int64 initializers.
A case named `NAME@LOSS` asks for that loss (`sum`, `ce` = cross-entropy with labels from graph
input `labels`, fed from OUTDIR/NAME@LOSS.inputs.npz). Ops ORT runs in double precision are
built in float64 (checked with tight tolerances), the others (Conv, ConvTranspose-based grads,
pools, Erf, ...) in float32, see F32_OPS.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

rng = np.random.default_rng(int(os.environ.get("PIPEC_FD_SEED", "1234")))
CASES = []


def case(name, nodes, params, opset=17, ints=None, dtype=np.float64, pos=(), inputs=None,
         n_out=1):
    """params: {name: shape or array}; pos: params that must be positive."""
    inits = []
    for p, s in params.items():
        if isinstance(s, np.ndarray):
            a = s.astype(dtype)
        else:
            a = rng.standard_normal(s).astype(dtype)
            if p in pos:
                a = np.abs(a) + 0.5
        inits.append(nh.from_array(a, p))
    for p, a in (ints or {}).items():
        inits.append(nh.from_array(np.asarray(a), p))
    et = T.DOUBLE if dtype == np.float64 else T.FLOAT
    outs = [h.make_tensor_value_info(f"y{i}" if n_out > 1 else "y", et, None) for i in range(n_out)]
    graph_inputs = []
    for n, (t, shape) in (inputs or {}).items():
        graph_inputs.append(h.make_tensor_value_info(n, t, shape))
    g = h.make_graph(nodes, name, graph_inputs, outs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 10 if opset >= 21 else 8
    CASES.append((name, m))


N = h.make_node
F32 = np.float32


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    # Elementwise with broadcasting.
    case("add_bcast", [N("Add", ["a", "b"], ["y"])], {"a": (2, 3, 4), "b": (3, 1)})
    case("sub_bcast", [N("Sub", ["a", "b"], ["y"])], {"a": (4,), "b": (2, 3, 4)})
    case("mul_bcast", [N("Mul", ["a", "b"], ["y"])], {"a": (2, 1, 4), "b": (3, 1)})
    case("div_bcast", [N("Div", ["a", "b"], ["y"])], {"a": (2, 3), "b": (3,)}, pos=("b",))
    case("pow_param_exp", [N("Pow", ["a", "e"], ["y"])], {"a": (2, 3), "e": np.array(1.7)}, pos=("a",))
    case("pow_const3", [N("Constant", [], ["e"], value=nh.from_array(np.array(3.0, np.float64))),
                        N("Pow", ["a", "e"], ["y"])], {"a": (3, 4)})
    case("sum3_bcast", [N("Sum", ["a", "b", "c"], ["y"])], {"a": (2, 3), "b": (3,), "c": (1, 1)})
    case("mean2", [N("Mean", ["a", "b"], ["y"])], {"a": (2, 3), "b": (2, 1)}, dtype=F32)
    case("multi_use", [N("Mul", ["a", "a"], ["t"]), N("Add", ["t", "a"], ["u"]), N("Mul", ["u", "b"], ["y"])],
         {"a": (3, 4), "b": (4,)})
    for op in ["Neg", "Exp", "Tanh", "Sigmoid", "Relu", "Abs", "Identity"]:
        case(op.lower(), [N(op, ["a"], ["y"])], {"a": (3, 4)})
    for op in ["Log", "Sqrt", "Reciprocal"]:
        case(op.lower(), [N(op, ["a"], ["y"])], {"a": (3, 4)}, pos=("a",))
    case("leakyrelu", [N("LeakyRelu", ["a"], ["y"], alpha=0.2)], {"a": (3, 4)})
    case("erf", [N("Erf", ["a"], ["y"])], {"a": (3, 4)}, dtype=F32)
    case("hardswish", [N("HardSwish", ["a"], ["y"])], {"a": np.linspace(-5, 5, 12).reshape(3, 4) + 0.01},
         opset=17, dtype=F32)
    case("gelu", [N("Gelu", ["a"], ["y"])], {"a": (3, 4)}, opset=20, dtype=F32)
    case("clip", [N("Clip", ["a", "lo", "hi"], ["y"])], {"a": (3, 4), "lo": np.array(-0.5), "hi": np.array(0.7)})
    case("dropout_eval", [N("Dropout", ["a"], ["y"])], {"a": (3, 4)})
    case("cast_f32_f64", [N("Cast", ["a"], ["t"], to=T.DOUBLE), N("Mul", ["t", "t"], ["u"]),
                          N("Cast", ["u"], ["y"], to=T.FLOAT)], {"a": (3, 4)}, dtype=F32)
    # Activations (ORT has float kernels only for most of them).
    away = np.linspace(-2.9, 2.9, 12).reshape(3, 4) + 0.013
    for op, attrs in [("HardSigmoid", {}), ("HardSigmoid", dict(alpha=0.7, beta=0.4)), ("Elu", dict(alpha=0.3)),
                      ("Selu", {}), ("Celu", dict(alpha=2.5)), ("Softplus", {}), ("Softsign", {}),
                      ("ThresholdedRelu", dict(alpha=0.4)), ("Mish", {})]:
        case(f"{op.lower()}{'_attrs' if attrs else ''}", [N(op, ["a"], ["y"], **attrs)], {"a": away},
             opset=18, dtype=F32)
    for op in ["Sin", "Cos"]:
        case(op.lower(), [N(op, ["a"], ["y"])], {"a": (3, 4)})
    case("prelu", [N("PRelu", ["a", "s"], ["y"])], {"a": (2, 3, 4), "s": (3, 1)}, dtype=F32)
    case("cumsum_rev_excl", [N("CumSum", ["a", "ax"], ["y"], reverse=1, exclusive=1)], {"a": (3, 4)},
         ints={"ax": np.array(1, np.int64)})
    case("tile", [N("Tile", ["a", "r"], ["y"])], {"a": (2, 3)}, ints={"r": np.array([3, 2], np.int64)})
    # ConvTranspose (float32: ORT has no double kernel): every attribute.
    for name, attrs, xs, ws in [
        ("s2_pads_outpad", dict(strides=[2, 2], pads=[1, 0, 2, 1], output_padding=[1, 0]), (2, 3, 3, 4),
         (3, 2, 3, 3)),
        ("group2_dil", dict(group=2, dilations=[2, 1], pads=[1, 1, 0, 1]), (1, 4, 3, 4), (4, 3, 3, 2)),
        ("output_shape", dict(strides=[2, 2], output_shape=[6, 8]), (1, 2, 3, 4), (2, 2, 3, 3)),
        ("same_upper", dict(strides=[2, 2], auto_pad="SAME_UPPER"), (1, 2, 3, 3), (2, 3, 3, 3)),
        ("same_lower", dict(strides=[2, 2], auto_pad="SAME_LOWER"), (1, 2, 3, 3), (2, 3, 3, 3)),
        ("valid", dict(strides=[2, 3], auto_pad="VALID"), (1, 2, 3, 3), (2, 2, 2, 3)),
        ("1d", dict(strides=[3], dilations=[2], pads=[2, 1], output_padding=[2]), (2, 3, 5), (3, 4, 3)),
    ]:
        m = ws[1] * attrs.get("group", 1)
        case(f"convtranspose_{name}", [N("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)],
             {"x": xs, "w": ws, "b": (m,)}, dtype=F32)
    # (Followed by a random scaling: with scale and bias constant over a normalised group,
    # mean(y^2) does not depend on x.)
    case("instancenorm", [N("InstanceNormalization", ["x", "s", "b"], ["t"]), N("Mul", ["t", "r"], ["y"])],
         {"x": (2, 3, 4, 5), "s": (3,), "b": (3,), "r": (2, 3, 4, 5)}, dtype=F32)
    case("groupnorm18", [N("GroupNormalization", ["x", "s", "b"], ["t"], num_groups=3), N("Mul", ["t", "r"], ["y"])],
         {"x": (2, 6, 3, 2), "s": (3,), "b": (3,), "r": (2, 6, 3, 2)}, opset=18, dtype=F32)
    case("groupnorm21", [N("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)],
         {"x": (2, 6, 3, 2), "s": (6,), "b": (6,)}, opset=21, dtype=F32)
    for mode in ["reflect", "edge", "wrap"]:
        case(f"pad_{mode}", [N("Pad", ["a", "p"], ["y"], mode=mode)], {"a": (1, 2, 4, 5)}, opset=19,
             ints={"p": np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)})
    case("pad_reflect_axes", [N("Pad", ["a", "p", "", "ax"], ["y"], mode="reflect")], {"a": (2, 3, 4)}, opset=18,
         ints={"p": np.array([1, 2, 2, 1], np.int64), "ax": np.array([-1, 1], np.int64)})
    # MatMul with broadcasting and 1-D operands.
    for i, (sa, sb) in enumerate([((2, 3), (3, 4)), ((5, 2, 3), (3, 4)), ((3,), (2, 3, 4)), ((2, 3, 4), (4,)),
                                  ((2, 1, 3, 4), (5, 4, 2)), ((3,), (3,)), ((1, 2, 3), (4, 3, 2))]):
        case(f"matmul_{i}", [N("MatMul", ["a", "b"], ["y"])], {"a": sa, "b": sb})
    # Einsum (ORT: float32 only for some equations, so float32).
    case("einsum_bmm", [N("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")], {"a": (2, 3, 4), "b": (2, 4, 5)},
         dtype=F32)
    case("einsum_sum_ell", [N("Einsum", ["a", "b"], ["y"], equation="...ij,jk->...k")],
         {"a": (2, 3, 4), "b": (4, 5)}, dtype=F32)
    case("einsum_implicit3", [N("Einsum", ["a", "b", "c"], ["y"], equation="ij,jk,kl")],
         {"a": (2, 3), "b": (3, 4), "c": (4, 5)}, dtype=F32)
    # Gemm: every transA/transB, alpha/beta, C broadcast.
    for ta in (0, 1):
        for tb in (0, 1):
            for cs in ((4,), (3, 4), (1,)):
                sa = (5, 3) if ta else (3, 5)
                sb = (4, 5) if tb else (5, 4)
                case(f"gemm_t{ta}{tb}_c{'x'.join(map(str, cs))}",
                     [N("Gemm", ["a", "b", "c"], ["y"], transA=ta, transB=tb, alpha=0.7, beta=1.3)],
                     {"a": sa, "b": sb, "c": cs})
    # Softmax family, normalisations.
    case("softmax_ax1", [N("Softmax", ["a"], ["y"], axis=1)], {"a": (2, 3, 4)})
    case("logsoftmax", [N("LogSoftmax", ["a"], ["y"], axis=-1)], {"a": (2, 3, 4)})
    case("layernorm_last", [N("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
         {"x": (2, 3, 6), "s": (6,), "b": (6,)}, dtype=F32)
    case("layernorm_ax1", [N("LayerNormalization", ["x", "s", "b"], ["y"], axis=1, epsilon=1e-5)],
         {"x": (2, 3, 4), "s": (3, 4), "b": (4,)}, dtype=F32)
    case("batchnorm_eval", [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-5)],
         {"x": (2, 3, 4, 5), "s": (3,), "b": (3,), "m": (3,), "v": (3,)}, pos=("v",))
    # (Followed by a random scaling: mean(BN(x)^2) alone hardly depends on x in training mode.)
    case("batchnorm_train", [N("BatchNormalization", ["x", "s", "b", "m", "v"], ["t", "rm", "rv"], epsilon=1e-5,
                               training_mode=1), N("Mul", ["t", "r"], ["y"])],
         {"x": (4, 3, 2, 3), "s": (3,), "b": (3,), "m": (3,), "v": (3,), "r": (4, 3, 2, 3)}, pos=("v",),
         dtype=F32)
    # Conv and pools (float32: ORT has no double Conv/ConvTranspose kernels).
    case("conv_s2p1", [N("Conv", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": (2, 3, 7, 6), "w": (4, 3, 3, 3), "b": (4,)}, dtype=F32)
    case("conv_g2_d2_asym", [N("Conv", ["x", "w"], ["y"], group=2, dilations=[2, 1], pads=[1, 0, 2, 1])],
         {"x": (2, 4, 7, 6), "w": (6, 2, 3, 2)}, dtype=F32)
    case("conv_depthwise_s2", [N("Conv", ["x", "w"], ["y"], group=3, strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": (1, 3, 6, 6), "w": (3, 1, 3, 3)}, dtype=F32)
    case("conv1d_same", [N("Conv", ["x", "w", "b"], ["y"], auto_pad="SAME_UPPER", strides=[2])],
         {"x": (2, 3, 9), "w": (2, 3, 4), "b": (2,)}, dtype=F32)
    case("maxpool_3s2p1", [N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": (2, 3, 7, 7)}, dtype=F32)
    case("avgpool_excl", [N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
         {"x": (2, 3, 7, 6)}, dtype=F32)
    case("avgpool_incl", [N("AveragePool", ["x"], ["y"], kernel_shape=[2, 3], strides=[2, 1], pads=[0, 1, 1, 1],
                            count_include_pad=1)], {"x": (2, 2, 5, 5)}, dtype=F32)
    case("gap", [N("GlobalAveragePool", ["x"], ["y"])], {"x": (2, 3, 4, 5)}, dtype=F32)
    case("gmp", [N("GlobalMaxPool", ["x"], ["y"])], {"x": (2, 3, 4, 5)}, dtype=F32)
    # Indexing, shape ops.
    case("gather_embed", [N("Gather", ["w", "i"], ["y"])], {"w": (10, 4)},
         ints={"i": np.array([[1, 3, 1], [9, -1, 0]], np.int64)})
    case("gather_axis1_scalar", [N("Gather", ["w", "i"], ["y"], axis=1)], {"w": (2, 5, 3)},
         ints={"i": np.array(0, np.int64)})
    case("gather_axis2_2d", [N("Gather", ["w", "i"], ["y"], axis=2)], {"w": (2, 3, 4, 2)},
         ints={"i": np.array([[3, 0], [3, -1], [1, 1]], np.int64)})
    case("gather_elements", [N("GatherElements", ["w", "i"], ["y"], axis=1)], {"w": (3, 4)},
         ints={"i": np.array([[0, 0, 3], [1, 2, 1], [3, 3, 3]], np.int64)})
    case("concat", [N("Concat", ["a", "b", "c"], ["y"], axis=1)], {"a": (2, 1, 3), "b": (2, 2, 3), "c": (2, 3, 3)})
    case("split_both", [N("Split", ["a", "s"], ["p", "q"], axis=1), N("Mul", ["p", "q"], ["y"])], {"a": (2, 4)},
         ints={"s": np.array([2, 2], np.int64)})
    case("split_one_used", [N("Split", ["a", "s"], ["p", "q"], axis=1), N("Identity", ["q"], ["y"])],
         {"a": (2, 5)}, ints={"s": np.array([2, 3], np.int64)})
    case("slice", [N("Slice", ["a", "st", "en", "ax"], ["y"])], {"a": (4, 5, 6)},
         ints={"st": np.array([1, -4], np.int64), "en": np.array([100, -1], np.int64), "ax": np.array([0, 2], np.int64)})
    case("pad", [N("Pad", ["a", "p"], ["y"])], {"a": (2, 3)}, ints={"p": np.array([1, 0, 0, 2], np.int64)})
    case("reshape", [N("Reshape", ["a", "s"], ["y"])], {"a": (2, 3, 4)}, ints={"s": np.array([4, -1], np.int64)})
    case("flatten", [N("Flatten", ["a"], ["y"], axis=2)], {"a": (2, 3, 4)})
    case("squeeze_unsqueeze", [N("Squeeze", ["a", "ax"], ["t"]), N("Unsqueeze", ["t", "ax2"], ["y"])],
         {"a": (2, 1, 3)}, ints={"ax": np.array([1], np.int64), "ax2": np.array([0], np.int64)})
    case("transpose", [N("Transpose", ["a"], ["y"], perm=[2, 0, 1])], {"a": (2, 3, 4)})
    case("expand", [N("Expand", ["a", "s"], ["y"])], {"a": (3, 1)}, ints={"s": np.array([2, 3, 4], np.int64)})
    case("where", [N("Where", ["c", "a", "b"], ["y"])], {"a": (3, 4), "b": (4,)},
         ints={"c": rng.random((3, 4)) > 0.5})
    # Reductions (opset 17: ReduceSum axes input, the others attribute).
    case("reducesum_k0", [N("ReduceSum", ["a", "ax"], ["y"], keepdims=0)], {"a": (2, 3, 4)},
         ints={"ax": np.array([1], np.int64)})
    case("reducesum_all", [N("ReduceSum", ["a"], ["y"], keepdims=0)], {"a": (2, 3)})
    case("reducemean", [N("ReduceMean", ["a"], ["y"], axes=[0, 2], keepdims=1)], {"a": (2, 3, 4)})
    case("reducemean_opset18", [N("ReduceMean", ["a", "ax"], ["y"], keepdims=0)], {"a": (2, 3, 4)}, opset=18,
         ints={"ax": np.array([-1], np.int64)})
    case("reducemax", [N("ReduceMax", ["a"], ["y"], axes=[1], keepdims=0)], {"a": (2, 3, 4)})
    case("reducel2", [N("ReduceL2", ["a"], ["y"], axes=[1], keepdims=1)], {"a": (2, 3, 4)})
    case("reducelse", [N("ReduceLogSumExp", ["a"], ["y"], axes=[2], keepdims=0)], {"a": (2, 3, 4)})
    case("reduceprod", [N("ReduceProd", ["a"], ["y"], axes=[1], keepdims=0)], {"a": (2, 3, 4)}, pos=("a",))
    case("max_bcast", [N("Max", ["a", "b", "c"], ["y"])], {"a": (2, 3), "b": (3,), "c": (2, 1)})
    case("min2", [N("Min", ["a", "b"], ["y"])], {"a": (3, 4), "b": (3, 4)})
    case("reducesumsq", [N("ReduceSumSquare", ["a"], ["y"], axes=[0], keepdims=0)], {"a": (2, 3, 4)})
    # Random shapes with random broadcasting (seed: $PIPEC_FD_SEED, default 1234).
    def bshape(full):
        """A shape that broadcasts to `full`: leading axes dropped, some axes set to 1."""
        k = int(rng.integers(0, len(full) + 1))
        return tuple(1 if rng.random() < 0.35 else d for d in full[len(full) - k:])
    for i in range(12):
        op = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Where"][i % 7]
        full = tuple(int(d) for d in rng.integers(1, 5, int(rng.integers(1, 5))))
        sa, sb = bshape(full), bshape(full)
        sa = full if rng.random() < 0.5 else sa  # one operand usually full-sized
        pos = ("a", "b") if op in ("Div", "Pow") else ()
        if op == "Where":
            case(f"rand{i}_where", [N("Where", ["c", "a", "b"], ["y"])], {"a": sa, "b": sb},
                 ints={"c": rng.random(bshape(full) or (1,)) > 0.5})
        else:
            case(f"rand{i}_{op.lower()}", [N(op, ["a", "b"], ["y"])], {"a": sa, "b": sb}, pos=pos)
    for i in range(6):
        m, k, n = (int(v) for v in rng.integers(1, 5, 3))
        batch = tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(0, 3))))
        sa = bshape(batch) + (m, k)
        sb = bshape(batch) + (k, n)
        if i == 4:
            sa = (k,)
        if i == 5:
            sb = (k,)
        case(f"rand{i}_matmul", [N("MatMul", ["a", "b"], ["y"])], {"a": sa, "b": sb})
    # Losses.
    case("mlp@sum", [N("Gemm", ["x", "w", "b"], ["h"], transB=1), N("Tanh", ["h"], ["y"])],
         {"x": (4, 5), "w": (3, 5), "b": (3,)})
    case("mlp@ce", [N("Gemm", ["x", "w", "b"], ["h"], transB=1), N("Tanh", ["h"], ["y"])],
         {"x": (4, 5), "w": (3, 5), "b": (3,)})
    case("seq@ce", [N("MatMul", ["x", "w"], ["y"])], {"x": (2, 3, 5), "w": (5, 7)})
    labels = {"mlp@ce": np.array([0, 2, 1, 2], np.int64), "seq@ce": rng.integers(0, 7, (2, 3)).astype(np.int64)}
    for name, m in CASES:
        onnx.save(m, os.path.join(out, name + ".onnx"))
        if name in labels:
            np.savez(os.path.join(out, name + ".inputs.npz"), labels=labels[name])
    print(len(CASES))


if __name__ == "__main__":
    main()
