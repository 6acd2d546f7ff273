#!/usr/bin/env python3
"""Small torchvision CNN exports with float32 AND float64 PyTorch gradients, for
scripts/grad_accuracy.py (how far pipec's float32 gradients are from exact, next to PyTorch's).

Run with the export venv (torch, torchvision):

    /root/torchenv/bin/python scripts/export_accuracy_cases.py vgg16 [resnet50 densenet121 googlenet
        inception_v3 ...] [--hw 224] [--batch 4] [--out bench-data/accuracy]

For each NAME: torchvision.models.NAME(weights=None) (googlenet / inception_v3 without aux
logits), weights drawn by torchvision's own initialisation under a fixed seed, BatchNorm running
stats calibrated as in scripts/export_models.py (3 train-mode passes on random batches), eval
mode, exported with export_models.EXPORT_KW (opset 17, no constant folding, initializers named
like the state_dict). Input `input` N(0,1) [batch, 3, hw, hw]; loss mean(y^2) over the logits
(pipec grad's default mean-square loss), backward.

Input sizes other than the native one: ResNet / DenseNet / GoogLeNet / Inception end in a global
average pool and take any size (>= 32, Inception >= 75). VGG's AdaptiveAvgPool2d((7, 7)) exports
only when 7 divides the feature map, so for hw != 224 it is replaced by AdaptiveAvgPool2d(hw // 32)
(the identity on the feature map) and classifier[0] by a Linear(512 (hw/32)^2, 4096) drawn like
torchvision's (N(0, 0.01), zero bias); the convolutional part is unchanged.

Writes OUT/NAME.onnx, OUT/NAME.ref.npz (float32: input/input, output/logits, loss, grad/<param>),
OUT/NAME.ref64.npz (the same model and input in float64: the exact-gradient reference) and
OUT/NAME.ref64b.npz: float64 again, but with every branch decision taken from the float32 run
(ReLU-family backward masks and max-pool argmax indices, replayed in call order by
export_models.Branches), i.e. the exact
gradient of the piece PyTorch's float32 run chose. A ReLU input or pooling window within float32
rounding of a tie can take the other branch in float64; the float32 gradient then differs from
NAME.ref64.npz by one routed element (~1e-3 of a conv weight gradient) without any inaccuracy in
the arithmetic. NAME.ref64b.npz measures the arithmetic alone (`pipec grad --precision f64
--f32-branches` is pipec's counterpart).
"""
import argparse
import contextlib
import json
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402

INPUT_SEED = 12345


def build(name, hw, gen):
    import torchvision.models as tvm
    if name == "googlenet":
        m = tvm.googlenet(weights=None, aux_logits=False, init_weights=True)
    elif name == "inception_v3":
        m = tvm.inception_v3(weights=None, aux_logits=False, init_weights=True)
    else:
        m = getattr(tvm, name)(weights=None)
    if name.startswith("vgg") and hw != 224:
        if hw % 32:
            raise SystemExit(f"{name}: --hw must be a multiple of 32 (got {hw})")
        s = hw // 32
        m.avgpool = nn.AdaptiveAvgPool2d((s, s))
        lin = nn.Linear(512 * s * s, 4096)
        with torch.no_grad():
            lin.weight.normal_(0.0, 0.01, generator=gen)
            lin.bias.zero_()
        m.classifier[0] = lin
    return m


def grads(model, x, double, branches=None):
    if double:
        model = model.double()
        x = x.double()
    for p in model.parameters():
        p.grad = None
    with branches or contextlib.nullcontext():
        y = model(x)
        loss = (y ** 2).mean()
        loss.backward()
    rec = {"input/input": x.detach().numpy(), "output/logits": y.detach().numpy(),
           "loss": np.asarray(loss.item(), np.float64 if double else np.float32)}
    for k, p in model.named_parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        rec["grad/" + k] = g.detach().numpy()
    return rec


def export(name, hw, batch, out):
    seed = em.seed_for(name)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = build(name, hw, gen)
    x = torch.randn(batch, 3, hw, hw, generator=torch.Generator().manual_seed(INPUT_SEED))
    em.calibrate_batchnorm(model, (x,), gen)
    model.eval()
    path = os.path.join(out, name + ".onnx")
    torch.onnx.export(model, (x,), path, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, **em.EXPORT_KW)
    em.postprocess_onnx(path)
    onnx.checker.check_model(path)
    inits = {i.name for i in onnx.load(path).graph.initializer}
    meta = {"model": name, "hw": hw, "batch": batch, "seed": seed, "input_seed": INPUT_SEED,
            "loss": "mean(logits^2)", "torch": torch.__version__}
    log = []
    for double, branches, suffix in ((False, em.Branches.make("record", log), ".ref.npz"),
                                     (True, None, ".ref64.npz"),
                                     (True, em.Branches.make("replay", log), ".ref64b.npz")):
        rec = grads(model, x, double, branches)
        if branches is not None and branches.mode == "replay" and branches.i != len(log):
            raise SystemExit(f"{name}: {len(log) - branches.i} recorded branch decisions not replayed")
        missing = [k for k in rec if k.startswith("grad/") and k[5:] not in inits]
        if missing:
            raise SystemExit(f"{name}: parameters not among the ONNX initializers: {missing[:5]}")
        meta["dtype"] = "float64" if double else "float32"
        meta["branches"] = "float32's" if suffix == ".ref64b.npz" else "own"
        rec["meta_json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(os.path.join(out, name + suffix), **rec)
    print(json.dumps({"name": name, "onnx": path, "hw": hw, "batch": batch}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--hw", type=int, default=224, help="input height = width")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--out", default=os.path.join(em.ROOT, "bench-data", "accuracy"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    for n in a.models:
        export(n, a.hw, a.batch, a.out)


if __name__ == "__main__":
    main()
