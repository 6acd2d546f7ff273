#!/usr/bin/env python3
"""PyTorch reference outputs + gradients for the fresh exports (scripts/export_models.py).

Run with the export venv:

    /root/torchenv/bin/python scripts/torch_reference.py resnet50 gpt2 bert_base \
        [--exports bench-data/exports] [--out bench-data/refs] [--batch 2] [--seq 16]

For each NAME it rebuilds the torch model of export_models.build(NAME) (same architecture,
same HF wrapper), then loads EVERY weight from the ONNX initializers by name
(onnx.numpy_helper.to_array; the exports strip the wrapper prefix "m.", so names equal the
state_dict names) and checks that every parameter and buffer was loaded.  Eval mode, float32,
random inputs from a fixed seed (images: N(0,1) [batch,3,224,224]; tokens: uniform ids, attention
mask with the last two positions of the last row padded, token_type_ids 0/1 halves), loss =
mean(y0**2) over the first output (pipec grad's default mean-square loss), backward.

Writes OUT/NAME.ref.npz with
    input/<graph input>, output/<graph output>, loss,
    grad/<initializer name>  for every initializer that is a torch parameter (tied weights, e.g.
                             GPT-2 lm_head.weight == transformer.wte.weight, appear once, under the
                             initializer name, with the summed gradient),
    meta_json                (model, seed, shapes, torch version, skipped buffers),
which is the format scripts/compare_grads.py reads.  With --double the same is done in float64
(same inputs) and written to OUT/NAME.ref64.npz, to measure how far the float32 reference itself is
from the exact gradient (compare_grads.py REF.npz REF64.npz).  --loss cross-entropy instead uses
softmax cross-entropy over y0's last axis with random labels (input/labels; NAME.ce.ref.npz):
BERT's first output is a LayerNorm output, on which mean(y0^2) is ~1 whatever the encoder does.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402

ROOT = em.ROOT
REF_SEED = 12345


def make_inputs(name, b, s, gen):
    if name in ("resnet50", "vit_b_16"):
        return {"input": torch.randn(b, 3, 224, 224, generator=gen)}
    if name == "inception_v3":
        return {"input": torch.randn(b, 3, 299, 299, generator=gen)}
    if name == "bert_base":
        return em._tokens(gen, 30522, b, s, ("input_ids", "attention_mask", "token_type_ids"))
    if name == "gpt2":
        return em._tokens(gen, 50257, b, s)
    raise KeyError(name)


def reference(name, exports, out_dir, b, s, double=False, ce=False):
    path = os.path.join(exports, name + ".onnx")
    gen = torch.Generator().manual_seed(em.seed_for(name))
    model, _mk, out_names, _dyn, prefix, origin = em.build(name, gen)
    om = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in om.graph.initializer}
    graph_inputs = [i.name for i in om.graph.input]
    graph_outputs = [o.name for o in om.graph.output]
    del om

    # torch names: the HF wrapper's "m." prefix was stripped from the initializer names
    def tname(k):
        return (prefix or "") + k
    sd = model.state_dict()
    params = dict(model.named_parameters(remove_duplicate=False))
    load, unused = {}, []
    for k, v in inits.items():
        if tname(k) in sd:
            load[tname(k)] = torch.from_numpy(np.ascontiguousarray(v))
        else:
            unused.append(k)
    missing, unexpected = model.load_state_dict(load, strict=False)
    assert not unexpected, unexpected
    # every parameter must come from the export (tied ones through their partner)
    not_loaded = []
    for pn, p in params.items():
        if pn not in load and not any(p is params.get(o) for o in load):
            not_loaded.append(pn)
    assert not not_loaded, f"parameters not in the ONNX initializers: {not_loaded}"
    buffers_missing = [k for k in missing if k not in params]
    for pn, p in params.items():
        src = pn if pn in load else next(o for o in load if params.get(o) is p)
        assert torch.equal(p.detach(), load[src]), pn

    model.eval()
    torch.manual_seed(REF_SEED)
    igen = torch.Generator().manual_seed(REF_SEED)
    feeds = make_inputs(name, b, s, igen)
    if double:  # float64 cross-check of the float32 reference's own rounding error
        model.double()
        feeds = {k: v.double() if v.is_floating_point() else v for k, v in feeds.items()}
    assert list(feeds) == graph_inputs, (list(feeds), graph_inputs)
    for p in model.parameters():
        p.grad = None
    t0 = time.time()
    outs = model(*feeds.values())
    outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
    if ce:  # pipec --loss cross-entropy:labels: softmax CE over y0's last axis, mean over positions
        C = outs[0].shape[-1]
        labels = torch.randint(0, C, outs[0].shape[:-1], generator=igen)
        loss = torch.nn.functional.cross_entropy(outs[0].reshape(-1, C), labels.reshape(-1))
    else:
        loss = (outs[0] ** 2).mean()
    loss.backward()
    torch_s = time.time() - t0

    rec = {"input/" + k: v.numpy() for k, v in feeds.items()}
    if ce:
        rec["input/labels"] = labels.numpy()
    for on, o in zip(graph_outputs, outs):
        rec["output/" + on] = o.detach().numpy()
    rec["loss"] = np.asarray(loss.item(), np.float64 if double else np.float32)
    n_grads = 0
    no_grad = []
    for k, v in inits.items():
        p = params.get(tname(k))
        if p is None or not np.issubdtype(v.dtype, np.floating):
            continue
        if p.grad is None:
            no_grad.append(k)
            g = np.zeros_like(v)
        else:
            g = p.grad.detach().numpy()
        rec["grad/" + k] = g if double else g.astype(np.float32)
        n_grads += 1
    meta = {"model": name, "origin": origin, "export": path, "seed": REF_SEED, "dtype": "float64" if double else "float32",
            "inputs": {k: list(v.shape) for k, v in feeds.items()},
            "loss": ("cross_entropy(y0, labels) over " if ce else "mean(y0^2) over ") + graph_outputs[0], "grads": n_grads,
            "initializers_not_params": [k for k in inits if tname(k) not in params],
            "params_without_grad": no_grad, "buffers_not_in_export": buffers_missing,
            "unused_initializers": unused, "torch": torch.__version__, "torch_fwd_bwd_s": round(torch_s, 2)}
    rec["meta_json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, name + (".ce" if ce else "") + (".ref64.npz" if double else ".ref.npz"))
    np.savez(out, **rec)
    print(json.dumps({"name": name, "ref": out, "loss": float(loss), "grads": n_grads,
                      "initializers_not_params": len(meta["initializers_not_params"]),
                      "params_without_grad": no_grad, "torch_fwd_bwd_s": meta["torch_fwd_bwd_s"]}),
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--exports", default=os.path.join(ROOT, "bench-data", "exports"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-data", "refs"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--double", action="store_true",
                    help="run torch in float64 and write NAME.ref64.npz (to measure the float32 "
                         "reference's own error)")
    ap.add_argument("--loss", choices=["mean-square", "cross-entropy"], default="mean-square",
                    help="cross-entropy: random int64 labels of shape y0.shape[:-1] saved as "
                         "input/labels, loss = F.cross_entropy over y0's last axis (pipec grad "
                         "--loss cross-entropy:labels); written to NAME.ce.ref.npz")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for n in a.models:
        reference(n, a.exports, a.out, a.batch, a.seq, a.double, a.loss == "cross-entropy")


if __name__ == "__main__":
    main()
