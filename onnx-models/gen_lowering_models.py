#!/usr/bin/env python3
"""Tiny PyTorch models whose ONNX exports use ops the `lower` pass rewrites, with references.

usage (export venv, scripts/requirements-export.txt): python onnx-models/gen_lowering_models.py
Writes, in this folder, for each model NAME.onnx and NAME.ref.npz in the layout of
gen_dev_models.py (input/<name>, output/<name>, loss = sum(out0**2)/numel, grad/<initializer>,
meta_json):
- lstm_tiny:   2-layer bidirectional nn.LSTM (batch_first) + Linear          -> LSTM
- gru_tiny:    nn.GRU + Linear                                               -> GRU
- embbag_tiny: nn.EmbeddingBag(mode="sum") with offsets + Linear (opset 17)  -> Loop over bags
- embbag2d_tiny: nn.EmbeddingBag sum and mean on a 2-D input [batch, 3] + Linear, batch symbolic
                 -> Loops over equal bags whose trip count is the batch (not unrollable)
- interp_tiny: Conv, F.interpolate bilinear x2, Conv, F.interpolate nearest to a size -> Resize
Exported with the TorchScript exporter (dynamo=False), opset 17, batch dim symbolic where the
model allows it. Fixed seeds; every file is well under 100 KB.
"""
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


class Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.fc(y)


class Gru(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(5, 4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y, h = self.rnn(x)
        return self.fc(y) + h.sum()


class EmbBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(20, 6, mode="sum")
        self.fc = nn.Linear(6, 2)

    def forward(self, idx, off):
        return self.fc(torch.relu(self.emb(idx, off)))


class EmbBag2d(nn.Module):
    def __init__(self):
        super().__init__()
        self.sum = nn.EmbeddingBag(20, 6, mode="sum")
        self.mean = nn.EmbeddingBag(15, 6, mode="mean")
        self.fc = nn.Linear(6, 2)

    def forward(self, a, b):
        return self.fc(torch.relu(self.sum(a) * self.mean(b)))


class Interp(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        y = F.interpolate(self.c1(x), scale_factor=2, mode="bilinear", align_corners=False)
        y = torch.tanh(self.c2(y))
        return F.interpolate(y, size=(7, 9), mode="nearest")


def make(name, model, inputs, dyn):
    torch.manual_seed(0)
    path = os.path.join(HERE, name + ".onnx")
    names = list(inputs)
    args = tuple(inputs[k] for k in names)
    torch.onnx.export(model, args, path, input_names=names, output_names=["y"],
                      dynamic_axes=dyn, opset_version=17, dynamo=False)
    om = onnx.load(path)
    init = {i.name: onnx.numpy_helper.to_array(i) for i in om.graph.initializer}
    onnx.checker.check_model(om)
    model.zero_grad(set_to_none=True)
    out = model(*args)
    loss = (out.float() ** 2).sum() / out.numel()
    loss.backward()
    d = {"input/" + k: v.numpy() for k, v in inputs.items()}
    d["output/y"] = out.detach().numpy()
    d["loss"] = np.array(float(loss.detach().double()), np.float64)
    # RNN exports reorder and stack the torch weights (gates ifgo -> iofc, both directions):
    # every initializer element is matched to the torch parameter element of the same value
    # (random floats, unique), and its gradient is taken from there.
    where = {}
    grads = {}
    for pname, p in model.named_parameters():
        if p.grad is None:
            continue
        grads[pname] = p.grad.detach().numpy().reshape(-1)
        for i, v in enumerate(p.detach().numpy().reshape(-1)):
            where.setdefault(float(v), []).append((pname, i))
    mapping = {}
    for k, v in init.items():
        if v.dtype != np.float32:
            continue
        hits = [where.get(float(x), []) for x in v.reshape(-1)]
        if all(len(h) == 1 for h in hits):
            d["grad/" + k] = np.array([grads[h[0][0]][h[0][1]] for h in hits],
                                      np.float32).reshape(v.shape)
            mapping[k] = sorted({h[0][0] for h in hits})
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ort_y = sess.run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    diff = float(np.abs(ort_y - out.detach().numpy()).max())
    ops = sorted({n.op_type for n in om.graph.node})
    meta = {"name": name, "reference": "torch", "opset": 17, "param_to_initializer": mapping,
            "ort_vs_torch_max_abs": diff, "op_types": ops,
            "loss": "sum(output[0].float()**2) / output[0].numel()", "grad_stats": {}}
    d["meta_json"] = np.frombuffer(json.dumps(meta, indent=1).encode(), dtype=np.uint8)
    np.savez(os.path.join(HERE, name + ".ref.npz"), **d)
    print(f"{name}: {len(om.graph.node)} nodes {ops}, {len(mapping)} params mapped, "
          f"ort diff {diff:.2g}, {os.path.getsize(path)} bytes")


def main():
    torch.manual_seed(1)
    make("lstm_tiny", Lstm().eval(), {"x": torch.randn(2, 6, 5)}, {"x": {0: "batch"}, "y": {0: "batch"}})
    torch.manual_seed(2)
    make("gru_tiny", Gru().eval(), {"x": torch.randn(4, 3, 5)}, {"x": {1: "batch"}, "y": {1: "batch"}})
    torch.manual_seed(3)
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 19, 0, 7], dtype=torch.int64)
    off = torch.tensor([0, 4, 6], dtype=torch.int64)
    make("embbag_tiny", EmbBag().eval(), {"idx": idx, "off": off}, {})
    torch.manual_seed(5)
    a = torch.randint(0, 20, (4, 3))
    b = torch.randint(0, 15, (4, 3))
    make("embbag2d_tiny", EmbBag2d().eval(), {"a": a, "b": b},
         {"a": {0: "batch"}, "b": {0: "batch"}, "y": {0: "batch"}})
    torch.manual_seed(4)
    make("interp_tiny", Interp().eval(), {"x": torch.randn(2, 3, 5, 6)}, {"x": {0: "batch"}, "y": {0: "batch"}})


if __name__ == "__main__":
    main()
