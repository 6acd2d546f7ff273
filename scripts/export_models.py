#!/usr/bin/env python3
"""Fresh ONNX exports of full-size benchmark models (random weights, nothing downloaded).

Run with the export venv (torch, torchvision, transformers; see scripts/requirements-export.txt):

    /root/torchenv/bin/python scripts/export_models.py                 # all models
    /root/torchenv/bin/python scripts/export_models.py --only gpt2     # one (repeatable)
    /root/torchenv/bin/python scripts/export_models.py --out DIR       # default bench-data/exports

Models (NAME -> DIR/NAME.onnx):
  resnet50      torchvision.models.resnet50(weights=None)                        input [batch,3,224,224]
  inception_v3  torchvision.models.inception_v3(weights=None, aux_logits=False,
                init_weights=False)                                              input [batch,3,299,299]
  vit_b_16      torchvision.models.vit_b_16(weights=None), zero-initialised      input [batch,3,224,224]
                classifier head re-drawn from N(0, 0.02) (else all logits are 0)
  bert_base     transformers.BertModel(BertConfig())  (bert-base-uncased sizes)  input_ids/attention_mask/
                                                                                 token_type_ids [batch,seq]
  gpt2          transformers.GPT2LMHeadModel(GPT2Config())  (GPT-2 small, 124M;  input_ids/attention_mask
                LM head tied to transformer.wte.weight)                          [batch,seq]
  t5_small      transformers.T5ForConditionalGeneration(T5Config.from_dict(<t5-small config>))
                                                                                 input_ids/attention_mask
                                                                                 [batch,enc_seq],
                                                                                 decoder_input_ids [batch,dec_seq]

Export settings (same as onnx-models/gen_dev_models.py, plus a symbolic sequence axis):
  torch.onnx.export(model, args, path, dynamo=False, opset_version=17,
                    input_names=..., output_names=..., dynamic_axes=<batch on every input/output,
                    and seq / enc_seq / dec_seq on the token axes of the text models>,
                    do_constant_folding=False, export_params=True,
                    keep_initializers_as_inputs=True, training=torch.onnx.TrainingMode.EVAL)
  HF models: config attn_implementation="eager", use_cache=False, wrapped in a module that takes
  positional args and returns a tuple.  Post-processing with `onnx`: initializers are removed from
  graph.input again and the wrapper prefix "m." is stripped, so initializer names equal the
  PyTorch state_dict names.  BatchNorm models (resnet50, inception_v3) get calibrated running
  stats (3 train-mode no_grad passes on random batches) so eval-mode activations stay sane.
  All models are < 2 GB, so weights are stored INSIDE the .onnx (no external data); the script
  prints `"weights": "inline"` or `"external"` per model as it finds them.

Every export is then checked: onnx.checker.check_model(path), and onnxruntime vs torch at the
trace shape and at a different batch/sequence length (proves the symbolic axes work).
One JSON line per model goes to stdout; progress goes to stderr.
"""
import argparse
import json
import os
import sys
import time
import warnings
import zlib

import numpy as np
import onnx
import torch
import torch.nn as nn

warnings.filterwarnings("ignore")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPSET = 17
EXPORT_KW = dict(
    dynamo=False,
    opset_version=OPSET,
    do_constant_folding=False,
    export_params=True,
    keep_initializers_as_inputs=True,
    training=torch.onnx.TrainingMode.EVAL,
)
MODELS = ["resnet50", "inception_v3", "vit_b_16", "bert_base", "gpt2", "t5_small"]

# google-t5/t5-small config.json (the well-known values; nothing downloaded)
T5_SMALL = {
    "architectures": ["T5ForConditionalGeneration"],
    "d_ff": 2048,
    "d_kv": 64,
    "d_model": 512,
    "decoder_start_token_id": 0,
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "feed_forward_proj": "relu",
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "model_type": "t5",
    "n_positions": 512,
    "num_decoder_layers": 6,
    "num_heads": 8,
    "num_layers": 6,
    "pad_token_id": 0,
    "relative_attention_max_distance": 128,
    "relative_attention_num_buckets": 32,
    "tie_word_embeddings": True,
    "vocab_size": 32128,
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Branches:
    """Records (mode "record") or replays (mode "replay") the branch decisions of a forward +
    backward pass, in call order, as a torch dispatch mode: the masks of ReLU, ReLU6 / Hardtanh,
    LeakyReLU, Hardsigmoid and Hardswish backward, and max-pool argmax indices.  Replaying a
    float32 run's log in float64 gives the exact gradient of the piece float32 chose (a tie
    within float32 rounding can take the other branch in float64, which moves one routed element
    without any error in the arithmetic).  `pipec grad --precision f64 --f32-branches` is pipec's
    counterpart.  `make()` builds the mode (torch imported lazily: this module is also imported
    without torch)."""

    @staticmethod
    def make(mode, log=None):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        aten = torch.ops.aten
        masks = {
            # op -> (mask from the op's saved input, gradient from (grad, x, mask))
            aten.threshold_backward.default: lambda a: a[1] > a[2],
            aten.hardtanh_backward.default: lambda a: (a[1] > a[2]) & (a[1] < a[3]),
            aten.leaky_relu_backward.default: lambda a: a[1] > 0,
            aten.hardsigmoid_backward.default: lambda a: (a[1] > -3) & (a[1] < 3),
            # Hardswish: three pieces (x < -3: 0, -3 <= x <= 3: (2x + 3) / 6, x > 3: 1)
            aten.hardswish_backward.default: lambda a: (a[1] >= -3).to(torch.int8) + (a[1] > 3).to(torch.int8),
        }

        def replay_grad(func, a, m):
            g, x = a[0], a[1]
            if func is aten.hardtanh_backward.default or func is aten.threshold_backward.default:
                return g * m.to(g.dtype)
            if func is aten.leaky_relu_backward.default:
                return g * torch.where(m, torch.ones_like(x), torch.full_like(x, float(a[2])))
            if func is aten.hardsigmoid_backward.default:
                return g * m.to(g.dtype) / 6
            piece = torch.where(m == 1, (2 * x + 3) / 6, torch.zeros_like(x))
            return g * torch.where(m == 2, torch.ones_like(x), piece)

        class Mode(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.mode, self.log, self.i = mode, [] if log is None else log, 0

            def _next(self, what):
                if self.i >= len(self.log):
                    raise RuntimeError(f"branch replay out of step: nothing recorded for {what}")
                kind, val = self.log[self.i]
                if kind != what:
                    raise RuntimeError(f"branch replay out of step: {kind} recorded, {what} now")
                self.i += 1
                return val

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in masks:
                    if self.mode == "record":
                        self.log.append((str(func), masks[func](args)))
                    else:
                        return replay_grad(func, args, self._next(str(func)))
                res = func(*args, **kwargs)
                if func is aten.max_pool2d_with_indices.default:
                    if self.mode == "record":
                        self.log.append(("argmax", res[1].clone()))
                    else:
                        idx = self._next("argmax")
                        x = args[0]
                        val = x.flatten(-2).gather(-1, idx.flatten(-2)).view_as(res[0])
                        res = (val, idx)
                return res

        return Mode()


class Wrap(nn.Module):
    """Positional args in, tuple out (HF models take keywords and return ModelOutput)."""

    def __init__(self, m, fn):
        super().__init__()
        self.m = m
        self.fn = fn

    def forward(self, *args):
        return self.fn(self.m, *args)


def seed_for(name):
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def calibrate_batchnorm(model, inputs, gen, iters=3):
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return False
    moms = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(iters):
            model(*[torch.randn(t.shape, generator=gen, dtype=t.dtype) if t.is_floating_point() else t
                    for t in inputs])
    for bn, mo in zip(bns, moms):
        bn.momentum = mo
    model.eval()
    return True


def _hf_eager(cfg):
    cfg.use_cache = False
    cfg._attn_implementation = "eager"
    return cfg


def _bert_fn(m, ids, am, tt):
    o = m(input_ids=ids, attention_mask=am, token_type_ids=tt, return_dict=True)
    return o.last_hidden_state, o.pooler_output


def _gpt2_fn(m, ids, am):
    return (m(input_ids=ids, attention_mask=am, use_cache=False, return_dict=True).logits,)


def _t5_fn(m, ids, am, dids):
    return (m(input_ids=ids, attention_mask=am, decoder_input_ids=dids, use_cache=False,
              return_dict=True).logits,)


def _img(gen, b, hw):
    return {"input": torch.randn(b, 3, hw, hw, generator=gen)}


def _tokens(gen, vocab, b, s, names=("input_ids", "attention_mask")):
    d = {"input_ids": torch.randint(0, vocab, (b, s), generator=gen)}
    if "attention_mask" in names:
        am = torch.ones(b, s, dtype=torch.long)
        if b > 1 and s > 4:
            am[-1, -2:] = 0  # some right padding in the last row
        d["attention_mask"] = am
    if "token_type_ids" in names:
        tt = torch.zeros(b, s, dtype=torch.long)
        tt[:, s // 2:] = 1
        d["token_type_ids"] = tt
    return d


def build(name, gen):
    """-> model, make_inputs(b, s) -> ordered dict, output names, dynamic_axes, strip prefix, origin."""
    if name in ("resnet50", "inception_v3", "vit_b_16"):
        import torchvision.models as tvm
        if name == "resnet50":
            m, hw, origin = tvm.resnet50(weights=None), 224, "torchvision.models.resnet50(weights=None)"
        elif name == "inception_v3":
            m, hw = tvm.inception_v3(weights=None, aux_logits=False, init_weights=False), 299
            origin = "torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False)"
        else:
            m, hw = tvm.vit_b_16(weights=None), 224
            # torchvision zero-initialises the classifier head, which would make every logit 0
            # (and the onnxruntime-vs-torch check vacuous): draw it from N(0, 0.02) instead.
            with torch.no_grad():
                m.heads.head.weight.normal_(0.0, 0.02, generator=gen)
                m.heads.head.bias.normal_(0.0, 0.02, generator=gen)
            origin = ("torchvision.models.vit_b_16(weights=None), classifier head (zero-initialised "
                      "by torchvision) re-drawn from N(0, 0.02)")
        dyn = {"input": {0: "batch"}, "logits": {0: "batch"}}
        return m, (lambda b, s: _img(gen, b, hw)), ["logits"], dyn, None, origin
    if name == "bert_base":
        from transformers import BertConfig, BertModel
        cfg = _hf_eager(BertConfig())
        names = ("input_ids", "attention_mask", "token_type_ids")
        dyn = {k: {0: "batch", 1: "seq"} for k in names}
        dyn["last_hidden_state"] = {0: "batch", 1: "seq"}
        dyn["pooler_output"] = {0: "batch"}
        return (Wrap(BertModel(cfg), _bert_fn), (lambda b, s: _tokens(gen, cfg.vocab_size, b, s, names)),
                ["last_hidden_state", "pooler_output"], dyn, "m.",
                "transformers.BertModel(BertConfig(), attn_implementation='eager', use_cache=False)")
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = _hf_eager(GPT2Config())
        dyn = {k: {0: "batch", 1: "seq"} for k in ("input_ids", "attention_mask", "logits")}
        return (Wrap(GPT2LMHeadModel(cfg), _gpt2_fn), (lambda b, s: _tokens(gen, cfg.vocab_size, b, s)),
                ["logits"], dyn, "m.",
                "transformers.GPT2LMHeadModel(GPT2Config()) (GPT-2 small), attn_implementation='eager', "
                "use_cache=False, lm_head tied to transformer.wte.weight")
    if name == "t5_small":
        from transformers import T5Config, T5ForConditionalGeneration
        cfg = _hf_eager(T5Config.from_dict(dict(T5_SMALL)))

        def mk(b, s):
            d = _tokens(gen, cfg.vocab_size, b, s)
            sd = max(2, s // 2 + 1)
            d["decoder_input_ids"] = torch.randint(0, cfg.vocab_size, (b, sd), generator=gen)
            d["decoder_input_ids"][:, 0] = cfg.decoder_start_token_id
            return d
        dyn = {"input_ids": {0: "batch", 1: "enc_seq"}, "attention_mask": {0: "batch", 1: "enc_seq"},
               "decoder_input_ids": {0: "batch", 1: "dec_seq"}, "logits": {0: "batch", 1: "dec_seq"}}
        return (Wrap(T5ForConditionalGeneration(cfg), _t5_fn), mk, ["logits"], dyn, "m.",
                "transformers.T5ForConditionalGeneration(T5Config.from_dict(t5-small config)), "
                "attn_implementation='eager', use_cache=False, lm_head tied to shared")
    raise KeyError(name)


def _rename_in_graph(g, ren):
    for n in g.node:
        for i, x in enumerate(n.input):
            if x in ren:
                n.input[i] = ren[x]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_in_graph(a.g, ren)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    _rename_in_graph(sg, ren)
    for o in g.output:
        if o.name in ren:
            o.name = ren[o.name]


def postprocess_onnx(path, strip_prefix=None):
    m = onnx.load(path)
    g = m.graph
    init_names = {i.name for i in g.initializer}
    keep = [i for i in g.input if i.name not in init_names]
    del g.input[:]
    g.input.extend(keep)
    if strip_prefix:
        ren, existing = {}, set(init_names)
        for init in g.initializer:
            if init.name.startswith(strip_prefix) and init.name[len(strip_prefix):] not in existing:
                ren[init.name] = init.name[len(strip_prefix):]
                existing.add(ren[init.name])
                init.name = ren[init.name]
        _rename_in_graph(g, ren)
    onnx.save_model(m, path)  # < 2 GB: everything stays inside the one file
    return m


def weights_location(m):
    ext = [i.name for i in m.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    return "external" if ext else "inline"


def ort_vs_torch(model, path, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    got = s.run(None, {k: v.numpy() for k, v in feeds.items()})
    with torch.no_grad():
        ref = model(*feeds.values())
    ref = (ref,) if isinstance(ref, torch.Tensor) else tuple(ref)
    worst_abs, worst_rel = 0.0, 0.0
    for r, o in zip(ref, got):
        r = r.numpy()
        if r.shape != o.shape:
            raise RuntimeError(f"shape mismatch ort {o.shape} vs torch {r.shape}")
        d = float(np.abs(r - o).max())
        worst_abs = max(worst_abs, d)
        worst_rel = max(worst_rel, d / max(float(np.abs(r).max()), 1e-12))
    return worst_abs, worst_rel


def export_one(name, out_dir, verify=True):
    seed = seed_for(name)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.time()
    model, mk, out_names, dyn, prefix, origin = build(name, gen)
    model.eval()
    trace = mk(2, 16)
    in_names = list(trace)
    args = tuple(trace.values())
    bn = calibrate_batchnorm(model, args, gen)
    build_s = time.time() - t0

    path = os.path.join(out_dir, name + ".onnx")
    log(f"[{name}] exporting to {path} ...")
    t0 = time.time()
    torch.onnx.export(model, args, path, input_names=in_names, output_names=out_names,
                      dynamic_axes=dyn, **EXPORT_KW)
    export_s = time.time() - t0
    t0 = time.time()
    om = postprocess_onnx(path, prefix)
    post_s = time.time() - t0
    t0 = time.time()
    onnx.checker.check_model(path)
    check_s = time.time() - t0

    n_params = sum(p.numel() for p in model.parameters())
    rec = {
        "name": name, "path": os.path.relpath(path, ROOT) if path.startswith(ROOT) else path,
        "bytes": os.path.getsize(path), "weights": weights_location(om),
        "nodes": len(om.graph.node), "initializers": len(om.graph.initializer),
        "torch_param_count": n_params, "bn_calibrated": bn,
        "build_s": round(build_s, 2), "export_s": round(export_s, 2),
        "postprocess_s": round(post_s, 2), "check_s": round(check_s, 2),
        "origin": origin, "seed": seed,
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__},
    }
    del om
    if verify:
        t0 = time.time()
        a, r = ort_vs_torch(model, path, trace)
        rec["ort_vs_torch_trace_shape"] = {"max_abs": a, "max_rel": r}
        other = mk(3, 11)
        a, r = ort_vs_torch(model, path, other)
        rec["ort_vs_torch_other_shape"] = {"shapes": {k: list(v.shape) for k, v in other.items()},
                                           "max_abs": a, "max_rel": r}
        rec["verify_s"] = round(time.time() - t0, 2)
    log(f"[{name}] {rec['bytes'] / 1e6:.1f} MB, {rec['nodes']} nodes, export {export_s:.1f}s")
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=MODELS, help="export just this model (repeatable)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-data", "exports"), help="output directory")
    ap.add_argument("--no-verify", action="store_true", help="skip the onnxruntime vs torch check")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    failed = []
    for name in a.only or MODELS:
        try:
            rec = export_one(name, a.out, verify=not a.no_verify)
            print(json.dumps(rec), flush=True)
        except Exception as e:  # keep going, report at the end
            import traceback
            traceback.print_exc()
            failed.append(name)
            print(json.dumps({"name": name, "error": f"{type(e).__name__}: {e}"}), flush=True)
    if failed:
        log("FAILED: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
