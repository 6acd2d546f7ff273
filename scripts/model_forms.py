#!/usr/bin/env python3
"""Small models in forms shipped models take, for pipec's end-to-end tests.

  model_forms.py DIR   writes
    audio_seq.onnx      1-D convolutions over a symbolic sequence axis:
                        input float32[batch,4,sequence_length] (an audio front end)
    audio_seq.in.npz    one input array (batch 2, sequence_length 20)
    unused_head.onnx    an MLP whose first output is the loss path and whose second output is a
                        head no loss reads (like BERT's pooler), plus a float initializer that
                        nothing reads
    unused_head.in.npz  one input array (batch 4)

Needs onnx and numpy.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper as h, numpy_helper as nh

F = TensorProto.FLOAT
rng = np.random.default_rng(11)


def w(name, *shape, scale=0.4):
    return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def save(d, name, nodes, inputs, outputs, inits, feeds):
    g = h.make_graph(nodes, name, inputs, outputs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, os.path.join(d, name + ".onnx"))
    np.savez(os.path.join(d, name + ".in.npz"), **feeds)


def main(d):
    os.makedirs(d, exist_ok=True)
    N = h.make_node
    save(d, "audio_seq", [
        N("Conv", ["x", "W1", "B1"], ["c1"], pads=[1, 1], kernel_shape=[3]),
        N("Relu", ["c1"], ["r1"]),
        N("MaxPool", ["r1"], ["p1"], kernel_shape=[2], strides=[2]),
        N("Conv", ["p1", "W2", "B2"], ["c2"], pads=[1, 1], kernel_shape=[3]),
        N("Relu", ["c2"], ["r2"]),
        N("ReduceMean", ["r2"], ["m"], axes=[2], keepdims=0),
        N("Gemm", ["m", "W3", "B3"], ["y"]),
    ], [h.make_tensor_value_info("x", F, ["batch", 4, "sequence_length"])],
        [h.make_tensor_value_info("y", F, ["batch", 5])],
        [w("W1", 8, 4, 3), w("B1", 8), w("W2", 8, 8, 3), w("B2", 8), w("W3", 8, 5), w("B3", 5)],
        {"x": rng.standard_normal((2, 4, 20)).astype(np.float32)})
    save(d, "unused_head", [
        N("Gemm", ["x", "W1", "B1"], ["h1"]),
        N("Relu", ["h1"], ["a1"]),
        N("Gemm", ["a1", "W2", "B2"], ["h2"]),
        N("Relu", ["h2"], ["a2"]),
        N("Gemm", ["a2", "W3", "B3"], ["y"]),
        # The head: reads the trunk, feeds only the second output.
        N("Gemm", ["a1", "Wp", "Bp"], ["hp"]),
        N("Tanh", ["hp"], ["pooled"]),
    ], [h.make_tensor_value_info("x", F, ["batch", 8])],
        [h.make_tensor_value_info("y", F, ["batch", 3]),
         h.make_tensor_value_info("pooled", F, ["batch", 6])],
        [w("W1", 8, 16), w("B1", 16), w("W2", 16, 16), w("B2", 16), w("W3", 16, 3), w("B3", 3),
         w("Wp", 16, 6), w("Bp", 6), w("orphan", 4)],
        {"x": rng.standard_normal((4, 8)).astype(np.float32)})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
