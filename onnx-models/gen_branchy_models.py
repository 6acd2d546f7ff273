#!/usr/bin/env python3
"""Generate two small, trainable, multi-branch ONNX models with inline weights (no torch):

- mmt_tiny.onnx:  MMT-like multi-branch Transformer: 4 modality branches (`modality0..3`,
                  f32 [batch, 8, 32]) x 2 pre-LN Transformer layers (hidden 32, 4 heads, FFN 64,
                  ReLU MLP), mean-pooled over the sequence, concatenated, linear head -> `output`
                  f32 [batch, 10].
- dlrm_tiny.onnx: DLRM-like: 3 dense branches (`dense0..2`, f32 [batch, 16], 2 x Gemm+Relu,
                  hidden 32) + 3 sparse branches (`sparse0..2`, i64 [batch], Gather from a 50x16
                  embedding table, 2 x Gemm+Relu, hidden 16), concatenated, top MLP
                  (Gemm+Relu 144->32, Gemm 32->1) -> `output` f32 [batch, 1].

ONNX opset 17, ir_version 8, symbolic batch dim `batch` on every input and output, all weights
float32 inline (no external data). Every initializer is a trainable parameter: non-trainable
constants (Reshape shapes, the attention scale) are Constant nodes. Weights: N(0, 0.1) (linear
weights, biases, embedding tables); LayerNorm scale 1, bias 0.

Reference data NAME.ref.npz uses the layout of gen_dev_models.py (see README.md), but the
reference is NOT torch: it comes from a float64 numpy interpreter of the ONNX graph itself with
hand-written reverse-mode gradients (`ref_forward_backward` below). Outputs/gradients are stored
as float32. onnxruntime forward and finite differences (check_refs.py) are run as checks.

Seeds: zlib.crc32(name) for the weights (numpy default_rng) and crc32(name)+1 for the inputs.
Needs only system python3 + onnx + numpy (+ onnxruntime for the checks).

Usage: python3 onnx-models/gen_branchy_models.py [--out onnx-models]
"""
import argparse
import collections
import json
import os
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
REF_BATCH = 4
STD = 0.1


class Builder:
    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs = [], [], []

    def param(self, name, shape, init="normal"):
        if init == "normal":
            a = self.rng.normal(0.0, STD, size=shape)
        elif init == "ones":
            a = np.ones(shape)
        else:
            a = np.zeros(shape)
        self.inits.append(numpy_helper.from_array(a.astype(np.float32), name))
        return name

    def const(self, name, value):
        """A non-trainable constant as a Constant node (so it is not an initializer/parameter)."""
        t = numpy_helper.from_array(np.asarray(value), name + "_value")
        self.nodes.append(helper.make_node("Constant", [], [name], name=name, value=t))
        return name

    def node(self, op, inputs, name, **attrs):
        out = name + "_out"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def input(self, name, elem, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    # building blocks -------------------------------------------------------------------------
    def linear(self, x, din, dout, prefix, act=None):
        """x[..., din] @ W[din, dout] + b (MatMul+Add; works for 3-D activations)."""
        w = self.param(f"{prefix}.weight", [din, dout])
        b = self.param(f"{prefix}.bias", [dout])
        y = self.node("MatMul", [x, w], f"{prefix}.matmul")
        y = self.node("Add", [y, b], f"{prefix}.add")
        if act:
            y = self.node(act, [y], f"{prefix}.{act.lower()}")
        return y

    def gemm(self, x, din, dout, prefix, act=None):
        """torch.nn.Linear layout: Gemm(x, W[dout, din], b, transB=1)."""
        w = self.param(f"{prefix}.weight", [dout, din])
        b = self.param(f"{prefix}.bias", [dout])
        y = self.node("Gemm", [x, w, b], f"{prefix}.gemm", transB=1)
        if act:
            y = self.node(act, [y], f"{prefix}.{act.lower()}")
        return y

    def layernorm(self, x, h, prefix):
        g = self.param(f"{prefix}.weight", [h], "ones")
        b = self.param(f"{prefix}.bias", [h], "zeros")
        return self.node("LayerNormalization", [x, g, b], prefix, axis=-1, epsilon=1e-5)

    def transformer_layer(self, x, prefix, seq, h, heads, ffn):
        hd = h // heads
        y = self.layernorm(x, h, f"{prefix}.ln1")
        # batch kept symbolic: 0 (copy input dim) when splitting heads, -1 when merging
        split = self.const(f"{prefix}.heads_shape", np.array([0, seq, heads, hd], np.int64))
        merge = self.const(f"{prefix}.merge_shape", np.array([-1, seq, h], np.int64))
        qkv = []
        for t in ("q", "k", "v"):
            z = self.linear(y, h, h, f"{prefix}.attn.{t}")
            z = self.node("Reshape", [z, split], f"{prefix}.attn.{t}.split")
            perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
            z = self.node("Transpose", [z], f"{prefix}.attn.{t}.perm", perm=perm)
            qkv.append(z)
        s = self.node("MatMul", [qkv[0], qkv[1]], f"{prefix}.attn.scores")
        scale = self.const(f"{prefix}.attn.scale_c", np.array(hd ** -0.5, np.float32))
        s = self.node("Mul", [s, scale], f"{prefix}.attn.scale")
        p = self.node("Softmax", [s], f"{prefix}.attn.softmax", axis=-1)
        o = self.node("MatMul", [p, qkv[2]], f"{prefix}.attn.context")
        o = self.node("Transpose", [o], f"{prefix}.attn.ctx.perm", perm=[0, 2, 1, 3])
        o = self.node("Reshape", [o, merge], f"{prefix}.attn.ctx.merge")
        o = self.linear(o, h, h, f"{prefix}.attn.o")
        x = self.node("Add", [x, o], f"{prefix}.res1")
        y = self.layernorm(x, h, f"{prefix}.ln2")
        y = self.linear(y, h, ffn, f"{prefix}.mlp.fc1", act="Relu")
        y = self.linear(y, ffn, h, f"{prefix}.mlp.fc2")
        return self.node("Add", [x, y], f"{prefix}.res2")

    def finish(self, out_name, out_shape, producer_out):
        # rename the last node's output to the graph output name
        last = self.nodes[-1]
        assert last.output[0] == producer_out
        last.output[0] = out_name
        outv = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, out_shape)
        graph = helper.make_graph(self.nodes, self.name, self.inputs, [outv], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  producer_name="pipec-gen-branchy")
        model.ir_version = 8
        return model


def mmt_tiny(seed, branches=4, layers=2, seq=8, h=32, heads=4, ffn=64, classes=10):
    b = Builder("mmt_tiny", seed)
    pooled = []
    for br in range(branches):
        x = b.input(f"modality{br}", TensorProto.FLOAT, ["batch", seq, h])
        for layer in range(layers):
            x = b.transformer_layer(x, f"b{br}.l{layer}", seq, h, heads, ffn)
        # opset 17: ReduceMean takes `axes` as an attribute (it became an input in opset 18)
        pooled.append(b.node("ReduceMean", [x], f"b{br}.pool", axes=[1], keepdims=0))
    cat = b.node("Concat", pooled, "fuse.concat", axis=1)
    y = b.linear(cat, branches * h, classes, "head")
    return b.finish("output", ["batch", classes], y)


def dlrm_tiny(seed, dense=3, sparse=3, din=16, hidden=32, vocab=50, emb=16, top=32):
    b = Builder("dlrm_tiny", seed)
    feats = []
    for i in range(dense):
        x = b.input(f"dense{i}", TensorProto.FLOAT, ["batch", din])
        for layer in range(2):
            x = b.gemm(x, din if layer == 0 else hidden, hidden, f"dense{i}.fc{layer}", act="Relu")
        feats.append(x)
    for i in range(sparse):
        ids = b.input(f"sparse{i}", TensorProto.INT64, ["batch"])
        table = b.param(f"emb{i}.weight", [vocab, emb])
        x = b.node("Gather", [table, ids], f"emb{i}.lookup", axis=0)
        for layer in range(2):
            x = b.gemm(x, emb, emb, f"sparse{i}.fc{layer}", act="Relu")
        feats.append(x)
    cat = b.node("Concat", feats, "interact.concat", axis=1)
    y = b.gemm(cat, dense * hidden + sparse * emb, top, "top.fc0", act="Relu")
    y = b.gemm(y, top, 1, "top.fc1")
    return b.finish("output", ["batch", 1], y)


# --------------------------------------------------------------------------------------------
# float64 reference interpreter with reverse-mode gradients (only the ops used above)
# --------------------------------------------------------------------------------------------
def _unbroadcast(g, shape):
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for ax, d in enumerate(shape):
        if d == 1 and g.shape[ax] != 1:
            g = g.sum(axis=ax, keepdims=True)
    return g


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _reshape_target(x, shape):
    shape = [int(x.shape[i]) if s == 0 else int(s) for i, s in enumerate(shape)]
    return x.reshape(shape)


def ref_forward_backward(model, feeds):
    """Forward in float64 on the ONNX graph; loss = sum(out0^2)/numel; returns
    (outputs, loss, {initializer: grad})."""
    g = model.graph
    env = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in g.initializer}
    params = set(env)
    for k, v in feeds.items():
        env[k] = v.astype(np.float64) if v.dtype.kind == "f" else v
    saved = []
    for n in g.node:
        a = _attrs(n)
        x = [env[i] for i in n.input]
        op = n.op_type
        aux = None
        if op == "Constant":
            v = numpy_helper.to_array(a["value"])
            y = v.astype(np.float64) if v.dtype.kind == "f" else v
        elif op == "MatMul":
            y = np.matmul(x[0], x[1])
        elif op == "Add":
            y = x[0] + x[1]
        elif op == "Mul":
            y = x[0] * x[1]
        elif op == "Relu":
            y = np.maximum(x[0], 0.0)
        elif op == "Reshape":
            y = _reshape_target(x[0], x[1])
        elif op == "Transpose":
            y = np.transpose(x[0], a["perm"])
        elif op == "Softmax":
            assert a.get("axis", -1) in (-1, x[0].ndim - 1)
            e = np.exp(x[0] - x[0].max(axis=-1, keepdims=True))
            y = e / e.sum(axis=-1, keepdims=True)
        elif op == "LayerNormalization":
            assert a.get("axis", -1) in (-1, x[0].ndim - 1)
            eps = a.get("epsilon", 1e-5)
            mu = x[0].mean(axis=-1, keepdims=True)
            xc = x[0] - mu
            rstd = 1.0 / np.sqrt((xc ** 2).mean(axis=-1, keepdims=True) + eps)
            xh = xc * rstd
            y = xh * x[1] + x[2]
            aux = (xh, rstd)
        elif op == "ReduceMean":
            axes = tuple(a["axes"])
            y = x[0].mean(axis=axes, keepdims=bool(a.get("keepdims", 1)))
        elif op == "Concat":
            y = np.concatenate(x, axis=a["axis"])
        elif op == "Gemm":
            assert a.get("alpha", 1.0) == 1.0 and a.get("beta", 1.0) == 1.0 and not a.get("transA", 0)
            B = x[1].T if a.get("transB", 0) else x[1]
            y = x[0] @ B + x[2]
        elif op == "Gather":
            assert a.get("axis", 0) == 0
            y = x[0][x[1]]
        else:
            raise NotImplementedError(op)
        env[n.output[0]] = y
        saved.append((n, a, x, y, aux))

    out_name = g.output[0].name
    out = env[out_name]
    loss = float((out ** 2).sum() / out.size)
    grads = {out_name: 2.0 * out / out.size}

    def acc(name, gv):
        if name in grads:
            grads[name] = grads[name] + gv
        else:
            grads[name] = gv

    for n, a, x, y, aux in reversed(saved):
        gy = grads.get(n.output[0])
        if gy is None or n.op_type == "Constant":
            continue
        op, i = n.op_type, n.input
        if op == "MatMul":
            A, B = x
            acc(i[0], _unbroadcast(np.matmul(gy, np.swapaxes(B, -1, -2)), A.shape))
            acc(i[1], _unbroadcast(np.matmul(np.swapaxes(A, -1, -2), gy), B.shape))
        elif op == "Add":
            acc(i[0], _unbroadcast(gy, x[0].shape))
            acc(i[1], _unbroadcast(gy, x[1].shape))
        elif op == "Mul":
            acc(i[0], _unbroadcast(gy * x[1], x[0].shape))
            acc(i[1], _unbroadcast(gy * x[0], x[1].shape))
        elif op == "Relu":
            acc(i[0], gy * (x[0] > 0))
        elif op == "Reshape":
            acc(i[0], gy.reshape(x[0].shape))
        elif op == "Transpose":
            acc(i[0], np.transpose(gy, np.argsort(a["perm"])))
        elif op == "Softmax":
            acc(i[0], y * (gy - (gy * y).sum(axis=-1, keepdims=True)))
        elif op == "LayerNormalization":
            xh, rstd = aux
            gam = x[1]
            red = tuple(range(gy.ndim - 1))
            acc(i[1], (gy * xh).sum(axis=red))
            acc(i[2], gy.sum(axis=red))
            gxh = gy * gam
            acc(i[0], rstd * (gxh - gxh.mean(axis=-1, keepdims=True)
                              - xh * (gxh * xh).mean(axis=-1, keepdims=True)))
        elif op == "ReduceMean":
            axes = tuple(a["axes"])
            gg = gy if a.get("keepdims", 1) else np.expand_dims(gy, axes)
            cnt = np.prod([x[0].shape[ax] for ax in axes])
            acc(i[0], np.broadcast_to(gg, x[0].shape) / cnt)
        elif op == "Concat":
            ax = a["axis"]
            offs = np.cumsum([0] + [t.shape[ax] for t in x])
            for k, name in enumerate(i):
                acc(name, np.take(gy, np.arange(offs[k], offs[k + 1]), axis=ax))
        elif op == "Gemm":
            A, W = x[0], x[1]
            if a.get("transB", 0):
                acc(i[0], gy @ W)
                acc(i[1], gy.T @ A)
            else:
                acc(i[0], gy @ W.T)
                acc(i[1], A.T @ gy)
            acc(i[2], _unbroadcast(gy, x[2].shape))
        elif op == "Gather":
            gt = np.zeros_like(x[0])
            np.add.at(gt, x[1], gy)
            acc(i[0], gt)
        else:
            raise NotImplementedError(op)
    pgrads = {k: grads.get(k, np.zeros_like(env[k])) for k in params}
    no_grad = sorted(k for k in params if k not in grads)
    return {o.name: env[o.name] for o in g.output}, loss, pgrads, no_grad


def make_inputs(model, seed, batch):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [batch if d.dim_param == "batch" else d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == TensorProto.INT64:
            feeds[vi.name] = rng.integers(0, 50, size=shape).astype(np.int64)
        else:
            feeds[vi.name] = rng.normal(0.0, 1.0, size=shape).astype(np.float32)
    return feeds


def ort_run(path, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def build(name, fn, out_dir):
    seed = zlib.crc32(name.encode())
    model = fn(seed)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                 data_prop=True)
    path = os.path.join(out_dir, name + ".onnx")
    onnx.save_model(model, path)  # inline weights (all < 2 GB)
    onnx.checker.check_model(path, full_check=True)

    feeds = make_inputs(model, seed + 1, REF_BATCH)
    outs, loss, grads, no_grad = ref_forward_backward(model, feeds)
    ort_outs = ort_run(path, feeds)
    diffs = {o.name: float(np.abs(r.astype(np.float64) - outs[o.name]).max())
             for o, r in zip(model.graph.output, ort_outs)}
    feeds1 = {k: v[:1] for k, v in feeds.items()}
    ort1 = ort_run(path, feeds1)
    outs1, _, _, _ = ref_forward_backward(model, feeds1)
    diff_b1 = max(float(np.abs(r.astype(np.float64) - outs1[o.name]).max())
                  for o, r in zip(model.graph.output, ort1))

    d = {}
    for k, v in feeds.items():
        d["input/" + k] = v
    for k, v in outs.items():
        d["output/" + k] = v.astype(np.float32)
    d["loss"] = np.array(loss, dtype=np.float64)
    grad_stats = {}
    for init in model.graph.initializer:
        gg = grads[init.name]
        grad_stats[init.name] = {"l2": float(np.linalg.norm(gg)), "sum": float(gg.sum()),
                                 "numel": int(gg.size)}
        d["grad/" + init.name] = gg.astype(np.float32)

    import onnxruntime
    ops = collections.Counter(n.op_type for n in model.graph.node)
    nparams = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    vi = {v.name: v for v in inferred.graph.value_info}
    meta = {
        "name": name, "origin": "onnx-models/gen_branchy_models.py (built directly with onnx.helper)",
        "seed": seed, "input_seed": seed + 1,
        "reference": "numpy-float64 (interpreter of the ONNX graph with hand-written reverse-mode "
                     "gradients; no torch)",
        "versions": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                     "numpy": np.__version__},
        "inputs": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in feeds.items()},
        "outputs": {k: {"dtype": "float32", "shape": list(v.shape)} for k, v in outs.items()},
        "loss": "sum(output[0].double()**2) / output[0].numel()  (float64)",
        "loss_value": loss,
        "torch_param_count": nparams,  # no torch model: = number of parameter elements
        "param_to_initializer": {i.name: i.name for i in model.graph.initializer},
        "unmapped_params": [], "params_without_grad": no_grad, "initializers_not_params": [],
        "perturbed": [], "bn_calibrated": False,
        "grad_full_max_elems": None, "grad_sampled": [], "grad_stats": grad_stats,
        "ort_vs_ref_max_abs": diffs, "ort_batch1_vs_ref_max_abs": diff_b1,
        "graph": {"nodes": len(model.graph.node), "op_types": dict(sorted(ops.items())),
                  "initializers": len(model.graph.initializer),
                  "shape_inference": "strict_mode ok, %d value_info" % len(vi)},
    }
    d["meta_json"] = np.frombuffer(json.dumps(meta, indent=1).encode(), dtype=np.uint8)
    ref = os.path.join(out_dir, name + ".ref.npz")
    np.savez(ref, **d)
    print(f"[ok] {name}: {len(model.graph.node)} nodes, ops {dict(sorted(ops.items()))}, "
          f"{nparams} params, {os.path.getsize(path)/1e6:.3f} MB onnx, {os.path.getsize(ref)/1e6:.3f} MB ref, "
          f"loss {loss:.6g}, ort diff {max(diffs.values()):.3g}, batch1 diff {diff_b1:.3g}, "
          f"no-grad params {no_grad}", flush=True)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=HERE)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, fn in (("mmt_tiny", mmt_tiny), ("dlrm_tiny", dlrm_tiny)):
        build(name, fn, a.out)


if __name__ == "__main__":
    main()
