#!/usr/bin/env python3
"""Generate GraphPipe's three model families (ASPLOS'25, Appendix A.2) as ONNX, plus a purely
sequential Transformer, for `pipec plan --planner gpp` and its tests.

Models (batch dim symbolic, fp32):
- mmt.onnx:        4 branches x 8 Transformer layers (seq 256, hidden 1024, 16 heads, FFN 4096),
                   mean-pooled, concatenated, linear head (CLIP-style multi-modal Transformer).
- dlrm.onnx:       7 dense branches (4 FF layers, hidden 4096) + 7 sparse branches (embedding
                   lookup, 4 FF layers, hidden 64), concatenated, top MLP.
- candle_uno.onnx: 7 feature branches x 4 FF layers (hidden 4096), concatenated, linear head.
- seq_transformer.onnx: 32 Transformer layers in one chain (MMT's layer), the A.3 check.

The full-size weights (0.4-0.6 G parameters per model) would make multi-GB files, so every float
weight is stored as ONNX *external data* in `NAME.weights`, which this script creates as a sparse
file of zeros (`truncate`: no disk blocks, instant). The `.onnx` files are a few hundred KB and
are committed; the `.weights` files are git-ignored and re-created by running this script (the
Rust tests do so when they are missing). Only system python3 + `onnx` are needed (no torch).

Usage: python3 scripts/gen_graphpipe_models.py [--out onnx-models/graphpipe]
"""
import argparse
import os

import onnx
from onnx import TensorProto, helper


class Builder:
    def __init__(self, name, weights_file):
        self.name = name
        self.nodes = []
        self.inits = []
        self.inputs = []
        self.weights_file = weights_file
        self.offset = 0
        self.counter = 0

    def uid(self, base):
        self.counter += 1
        return f"{base}_{self.counter}"

    def weight(self, name, shape):
        """A float weight stored as external data (zeros, in the sparse weights file)."""
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(shape)
        n = 4
        for d in shape:
            n *= d
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", os.path.basename(self.weights_file)),
                     ("offset", str(self.offset)), ("length", str(n))):
            e = t.external_data.add()
            e.key = k
            e.value = v
        # 4 KiB alignment, as onnx's own writer does for mmap
        self.offset += (n + 4095) // 4096 * 4096
        self.inits.append(t)
        return name

    def const_i64(self, name, vals):
        self.inits.append(helper.make_tensor(name, TensorProto.INT64, [len(vals)], vals))
        return name

    def const_f(self, name, val):
        self.inits.append(helper.make_tensor(name, TensorProto.FLOAT, [], [val]))
        return name

    def node(self, op, inputs, name=None, **attrs):
        name = name or self.uid(op)
        out = name + "_out"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def input(self, name, elem, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def linear(self, x, din, dout, prefix, act=None):
        w = self.weight(f"{prefix}.w", [din, dout])
        b = self.weight(f"{prefix}.b", [dout])
        y = self.node("MatMul", [x, w], name=f"{prefix}.matmul")
        y = self.node("Add", [y, b], name=f"{prefix}.bias")
        if act:
            y = self.node(act, [y], name=f"{prefix}.{act.lower()}")
        return y

    def layernorm(self, x, h, prefix):
        g = self.weight(f"{prefix}.gamma", [h])
        b = self.weight(f"{prefix}.beta", [h])
        return self.node("LayerNormalization", [x, g, b], name=prefix, axis=-1)

    def transformer_layer(self, x, prefix, seq=256, h=1024, heads=16, ffn=4096):
        hd = h // heads
        y = self.layernorm(x, h, f"{prefix}.ln1")
        split = self.const_i64(f"{prefix}.heads_shape", [0, seq, heads, hd])
        merge = self.const_i64(f"{prefix}.merge_shape", [0, seq, h])
        qkv = []
        for t in ("q", "k", "v"):
            z = self.linear(y, h, h, f"{prefix}.{t}")
            z = self.node("Reshape", [z, split], name=f"{prefix}.{t}.split")
            perm = [0, 2, 3, 1] if t == "k" else [0, 2, 1, 3]
            z = self.node("Transpose", [z], name=f"{prefix}.{t}.perm", perm=perm)
            qkv.append(z)
        s = self.node("MatMul", [qkv[0], qkv[1]], name=f"{prefix}.scores")
        s = self.node("Mul", [s, self.const_f(f"{prefix}.scale", hd ** -0.5)], name=f"{prefix}.scaled")
        p = self.node("Softmax", [s], name=f"{prefix}.softmax", axis=-1)
        o = self.node("MatMul", [p, qkv[2]], name=f"{prefix}.context")
        o = self.node("Transpose", [o], name=f"{prefix}.ctx.perm", perm=[0, 2, 1, 3])
        o = self.node("Reshape", [o, merge], name=f"{prefix}.ctx.merge")
        o = self.linear(o, h, h, f"{prefix}.o")
        x = self.node("Add", [x, o], name=f"{prefix}.res1")
        y = self.layernorm(x, h, f"{prefix}.ln2")
        y = self.linear(y, h, ffn, f"{prefix}.ff1", act="Relu")
        y = self.linear(y, ffn, h, f"{prefix}.ff2")
        return self.node("Add", [x, y], name=f"{prefix}.res2")

    def save(self, out, outputs, path):
        graph = helper.make_graph(self.nodes, self.name, self.inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  producer_name="pipec-gen-graphpipe")
        model.ir_version = 8
        onnx.save_model(model, path)
        with open(self.weights_file, "wb") as f:
            f.truncate(self.offset)  # sparse: all zeros, no blocks
        return path


def mmt(out, branches=4, layers=8, seq=256, h=1024):
    b = Builder("mmt", os.path.join(out, "mmt.weights"))
    pooled = []
    for br in range(branches):
        x = b.input(f"modality{br}", TensorProto.FLOAT, ["batch", seq, h])
        for layer in range(layers):
            x = b.transformer_layer(x, f"b{br}.l{layer}", seq=seq, h=h)
        # Opset 17: ReduceMean's axes are an attribute (an input from opset 18).
        pooled.append(b.node("ReduceMean", [x], name=f"b{br}.pool", axes=[1], keepdims=0))
    cat = b.node("Concat", pooled, name="fuse.concat", axis=1)
    y = b.linear(cat, branches * h, 512, "head")
    outv = helper.make_tensor_value_info(y, TensorProto.FLOAT, ["batch", 512])
    return b.save(y, [outv], os.path.join(out, "mmt.onnx"))


def seq_transformer(out, layers=32, seq=256, h=1024):
    b = Builder("seq_transformer", os.path.join(out, "seq_transformer.weights"))
    x = b.input("tokens", TensorProto.FLOAT, ["batch", seq, h])
    for layer in range(layers):
        x = b.transformer_layer(x, f"l{layer}", seq=seq, h=h)
    y = b.node("ReduceMean", [x], name="pool", axes=[1], keepdims=0)
    y = b.linear(y, h, 512, "head")
    outv = helper.make_tensor_value_info(y, TensorProto.FLOAT, ["batch", 512])
    return b.save(y, [outv], os.path.join(out, "seq_transformer.onnx"))


def mlp_branch(b, x, din, hidden, layers, prefix):
    for layer in range(layers):
        x = b.linear(x, din if layer == 0 else hidden, hidden, f"{prefix}.fc{layer}", act="Relu")
    return x


def dlrm(out, dense=7, sparse=7, hidden=4096, sparse_hidden=64, vocab=100000, din=512):
    b = Builder("dlrm", os.path.join(out, "dlrm.weights"))
    feats = []
    for i in range(dense):
        x = b.input(f"dense{i}", TensorProto.FLOAT, ["batch", din])
        feats.append(mlp_branch(b, x, din, hidden, 4, f"dense{i}"))
    for i in range(sparse):
        ids = b.input(f"sparse{i}", TensorProto.INT64, ["batch"])
        table = b.weight(f"emb{i}.table", [vocab, sparse_hidden])
        x = b.node("Gather", [table, ids], name=f"emb{i}.lookup", axis=0)
        feats.append(mlp_branch(b, x, sparse_hidden, sparse_hidden, 4, f"sparse{i}"))
    cat = b.node("Concat", feats, name="interact.concat", axis=1)
    width = dense * hidden + sparse * sparse_hidden
    y = b.linear(cat, width, 1024, "top.fc0", act="Relu")
    y = b.linear(y, 1024, 1, "top.fc1")
    outv = helper.make_tensor_value_info(y, TensorProto.FLOAT, ["batch", 1])
    return b.save(y, [outv], os.path.join(out, "dlrm.onnx"))


def candle_uno(out, branches=7, hidden=4096):
    dims = [942, 5270, 2048, 942, 5270, 2048, 4096]
    b = Builder("candle_uno", os.path.join(out, "candle_uno.weights"))
    feats = []
    for i in range(branches):
        x = b.input(f"feature{i}", TensorProto.FLOAT, ["batch", dims[i % len(dims)]])
        feats.append(mlp_branch(b, x, dims[i % len(dims)], hidden, 4, f"branch{i}"))
    cat = b.node("Concat", feats, name="merge.concat", axis=1)
    y = b.linear(cat, branches * hidden, 1, "head")
    outv = helper.make_tensor_value_info(y, TensorProto.FLOAT, ["batch", 1])
    return b.save(y, [outv], os.path.join(out, "candle_uno.onnx"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "onnx-models", "graphpipe"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for f in (mmt, dlrm, candle_uno, seq_transformer):
        p = f(a.out)
        print(p, os.path.getsize(p), "bytes")


if __name__ == "__main__":
    main()
