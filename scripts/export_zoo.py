#!/usr/bin/env python3
"""The model zoo (issue #16): ~40 small architectures exported to ONNX with random weights, plus
reference inputs and PyTorch float32 / float64 gradients for each.  Nothing is downloaded.

Run with the export venv (torch, torchvision, transformers, onnx, onnxruntime, onnxscript; see
scripts/requirements-export.txt):

    python scripts/export_zoo.py                     # every model into bench-data/zoo/
    python scripts/export_zoo.py --only gpt2 --only lstm --out DIR
    python scripts/export_zoo.py --list              # names, families, sizes
    python scripts/export_zoo.py --manifest-only     # rewrite scripts/zoo_manifest.json only

Sizes: the models keep the op-graph structure of the real architecture but are small (few or
narrow layers where the constructor allows it, 10 classes, tiny vocabularies) and take small inputs
(32x32 or 64x64 images where the architecture allows, the minimum where it does not; batch 2;
sequences of 16), so that a single-threaded CPU executor can run forward + backward in seconds.
Every model's constructor call, config and input shapes are recorded in scripts/zoo_manifest.json.

Per model NAME, into OUT:
  NAME.onnx         TorchScript exporter, same settings as scripts/export_models.py:
                    dynamo=False, opset 17, do_constant_folding=False, keep_initializers_as_inputs
                    (removed from graph.input afterwards), TrainingMode.EVAL, symbolic batch axis;
                    wrapper prefix "m." stripped so initializer names are the state_dict names.
  NAME.dynamo.onnx  torch.onnx.export(dynamo=True, opset_version=18), static shapes, same name
                    post-processing; a failure is recorded in the manifest ("dynamo": "failed: ...").
  NAME.inputs.npz   the reference inputs, keyed by ONNX input name (seeded, batch 2).
  NAME.ref.npz      loss32 / loss64, output/<name> (float32), grad32/<init> and grad64/<init>:
                    PyTorch's gradients in float32 and in float64 (same weights, same inputs, the
                    model cast with .double()) of every parameter that is an ONNX initializer of
                    NAME.onnx, keyed by the initializer name.  The loss is `pipec grad`'s default
                    `mean-square`: L = mean(y0**2) over all elements of the model's FIRST output.
                    grad64b/<init>: float64 again, but with every branch decision (ReLU-family
                    masks, max-pool argmax) replayed from the float32 run (export_models.Branches):
                    the exact gradient of the piece float32 chose, the reference for float32's
                    arithmetic alone (`pipec grad --precision f64 --f32-branches` is pipec's side);
                    branch_decisions: how many were replayed (branches_note instead if the replay
                    failed).  meta_json: model, loss, params not found among the initializers, etc.
Every export is checked with onnx.checker and onnxruntime vs torch (at batch 2 and, for the
TorchScript file, batch 3).  Models with BatchNorm are exported in eval mode with calibrated
running statistics (3 train-mode passes on random batches, as export_models.py does).
OUT/PARTIAL lists the models done so far (updated after each model); OUT/READY is written at the
end with the full list.  One JSON line per model goes to stdout, progress to stderr.
"""
import argparse
import contextlib
import json
import os
import sys
import time
import traceback
import warnings
from collections import OrderedDict

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402

warnings.filterwarnings("ignore")

ROOT = em.ROOT
MANIFEST = os.path.join(ROOT, "scripts", "zoo_manifest.json")
BATCH = 2
SEQ = 16
DYNAMO_OPSET = 18
REF_SEED = 12345


# ---------------------------------------------------------------------------------------------
# Inputs: a list of In(name, shape without batch, dtype, high) -> tensors of batch b.


class In:
    def __init__(self, name, shape, dtype="float32", high=None, kind=None, low=0):
        self.name, self.shape, self.dtype, self.high, self.kind = name, tuple(shape), dtype, high, kind
        self.low = low

    def make(self, b, gen):
        shape = (b,) + self.shape
        if self.kind == "mask":  # ones, with some right padding in the last row
            t = torch.ones(shape, dtype=torch.long)
            if b > 1 and shape[-1] > 4:
                t[-1, -2:] = 0
            return t
        if self.kind == "token_type":
            t = torch.zeros(shape, dtype=torch.long)
            t[..., shape[-1] // 2:] = 1
            return t
        if self.dtype == "int64":
            return torch.randint(self.low, self.high, shape, generator=gen)
        return torch.randn(shape, generator=gen)

    def manifest(self):
        d = {"name": self.name, "shape": ["batch"] + list(self.shape), "dtype": self.dtype}
        if self.high is not None:
            d["range"] = [self.low, self.high]
        if self.kind:
            d["kind"] = self.kind
        return d


def img(hw, c=3):
    return [In("input", (c, hw, hw))]


def toks(vocab, names=("input_ids", "attention_mask"), seq=SEQ):
    out = []
    for n in names:
        if n == "attention_mask":
            out.append(In(n, (seq,), "int64", kind="mask"))
        elif n == "token_type_ids":
            out.append(In(n, (seq,), "int64", kind="token_type"))
        else:
            # ids 0 and 1 are the pad tokens of these configs: PyTorch gives an Embedding's
            # padding_idx row no gradient, which the exported Gather cannot know
            out.append(In(n, (seq,), "int64", high=vocab, low=2))
    return out


Wrap = em.Wrap  # positional args in, tuple out; its "m." prefix is stripped from the names


class Spec:
    """One zoo model: build() -> (module, inputs [In], outputs [str], strip prefix, origin)."""

    def __init__(self, name, family, build, notes=""):
        self.name, self.family, self.build, self.notes = name, family, build, notes


# ---------------------------------------------------------------------------------------------
# torchvision classification


def _tv(origin, fn, hw=32):
    def b():
        m = fn()
        return m, img(hw), ["logits"], "m." if isinstance(m, em.Wrap) else None, origin
    return b


def _resnet_basic():
    from torchvision.models.resnet import BasicBlock, ResNet
    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)


def _resnet_bottleneck():
    from torchvision.models.resnet import Bottleneck, ResNet
    return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10)


def _resnext():
    from torchvision.models.resnet import Bottleneck, ResNet
    return ResNet(Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=8, num_classes=10)


def _vgg():
    from torchvision.models.vgg import VGG, make_layers
    cfg = [8, "M", 16, "M", 32, 32, "M", 64, 64, "M", 64, 64, "M"]  # vgg11 ("A") at 1/8 width
    m = VGG(make_layers(cfg, batch_norm=True), num_classes=10)
    # the constructor's classifier is fixed at 512*7*7 -> 4096 -> 4096; same layers, narrower
    m.classifier = nn.Sequential(nn.Linear(64 * 7 * 7, 128), nn.ReLU(True), nn.Dropout(),
                                 nn.Linear(128, 128), nn.ReLU(True), nn.Dropout(), nn.Linear(128, 10))
    return m


def _densenet():
    from torchvision.models.densenet import DenseNet
    return DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2,
                    num_classes=10)


def _googlenet():
    from torchvision.models import googlenet
    return googlenet(weights=None, aux_logits=False, init_weights=True, num_classes=10)


def _inception():
    from torchvision.models import inception_v3
    return inception_v3(weights=None, aux_logits=False, init_weights=False, num_classes=10)


def _effnet_b0():
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.5, depth_mult=0.5)
    return EfficientNet(setting, dropout=0.2, last_channel=last, num_classes=10)


def _effnet_v2():
    from torchvision.models.efficientnet import (EfficientNet, FusedMBConvConfig, MBConvConfig)
    # efficientnet_v2_s's stage kinds (FusedMBConv x3 then MBConv+SE x3), 1 layer each, narrow
    setting = [
        FusedMBConvConfig(1, 3, 1, 8, 8, 1),
        FusedMBConvConfig(4, 3, 2, 8, 16, 1),
        FusedMBConvConfig(4, 3, 2, 16, 24, 1),
        MBConvConfig(4, 3, 2, 24, 32, 1),
        MBConvConfig(6, 3, 1, 32, 40, 1),
        MBConvConfig(6, 3, 2, 40, 64, 1),
    ]
    return EfficientNet(setting, dropout=0.2, last_channel=128, num_classes=10)


def _mbv2():
    from torchvision.models import mobilenet_v2
    return mobilenet_v2(weights=None, width_mult=0.5, num_classes=10)


def _mbv3s():
    from torchvision.models import mobilenet_v3_small
    return mobilenet_v3_small(weights=None, width_mult=0.5, num_classes=10)


def _mbv3l():
    from torchvision.models import mobilenet_v3_large
    return mobilenet_v3_large(weights=None, width_mult=0.5, num_classes=10)


def _regnet():
    from torchvision.models import regnet_y_400mf
    return regnet_y_400mf(weights=None, num_classes=10)


def _shufflenet():
    from torchvision.models import shufflenet_v2_x0_5
    return shufflenet_v2_x0_5(weights=None, num_classes=10)


def _squeezenet():
    from torchvision.models import squeezenet1_1
    return squeezenet1_1(weights=None, num_classes=10)


def _mnasnet():
    from torchvision.models import mnasnet0_5
    return mnasnet0_5(weights=None, num_classes=10)


def _convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    setting = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, 64, 1), CNBlockConfig(64, 128, 1),
               CNBlockConfig(128, None, 1)]
    return ConvNeXt(setting, stochastic_depth_prob=0.0, num_classes=10)


def _vit(gen):
    from torchvision.models.vision_transformer import VisionTransformer
    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                          mlp_dim=64, num_classes=10)
    with torch.no_grad():  # torchvision zero-initialises the head: every logit would be 0
        m.heads.head.weight.normal_(0.0, 0.02, generator=gen)
        m.heads.head.bias.normal_(0.0, 0.02, generator=gen)
    return m


def _swin():
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4],
                           window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=10)


def _swin_v2():
    from torchvision.models.swin_transformer import (PatchMergingV2, SwinTransformer,
                                                     SwinTransformerBlockV2)
    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 2, 4],
                           window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=10,
                           block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2)


# ---------------------------------------------------------------------------------------------
# segmentation, UNet


def _seg_out(m, x):
    return (m(x)["out"],)


def _fcn():
    from torchvision.models.resnet import Bottleneck, ResNet
    from torchvision.models.segmentation.fcn import _fcn_resnet
    backbone = ResNet(Bottleneck, [1, 1, 1, 1], replace_stride_with_dilation=[False, True, True])
    return Wrap(_fcn_resnet(backbone, num_classes=4, aux=False), _seg_out)


def _deeplab():
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large
    return Wrap(deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4,
                                             aux_loss=False), _seg_out)


def _lraspp():
    from torchvision.models.segmentation import lraspp_mobilenet_v3_large
    return Wrap(lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4), _seg_out)


class DoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                   nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.block(x)


class UNet(nn.Module):
    """The UNet of Ronneberger et al. 2015 (arXiv:1505.04597) in the common padded form (as in
    milesial/Pytorch-UNet): DoubleConv blocks, MaxPool down, ConvTranspose2d (or bilinear
    Upsample + conv) up, skip connections by channel concat; base width 8, 3 levels."""

    def __init__(self, cin=3, classes=2, base=8, levels=3, bilinear=False):
        super().__init__()
        self.inc = DoubleConv(cin, base)
        self.downs = nn.ModuleList()
        ch = [base * 2 ** i for i in range(levels + 1)]
        for i in range(levels):
            self.downs.append(nn.Sequential(nn.MaxPool2d(2), DoubleConv(ch[i], ch[i + 1])))
        self.ups, self.convs = nn.ModuleList(), nn.ModuleList()
        for i in reversed(range(levels)):
            if bilinear:
                self.ups.append(nn.Sequential(nn.Upsample(scale_factor=2, mode="bilinear",
                                                          align_corners=True),
                                              nn.Conv2d(ch[i + 1], ch[i], 1)))
            else:
                self.ups.append(nn.ConvTranspose2d(ch[i + 1], ch[i], 2, stride=2))
            self.convs.append(DoubleConv(2 * ch[i], ch[i]))
        self.outc = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        x = self.inc(x)
        skips = [x]
        for d in self.downs:
            x = d(x)
            skips.append(x)
        skips.pop()
        for up, conv in zip(self.ups, self.convs):
            x = up(x)
            x = conv(torch.cat([skips.pop(), x], dim=1))
        return self.outc(x)


# ---------------------------------------------------------------------------------------------
# Hugging Face (small configs; attn_implementation="eager", use_cache=False)

VOCAB = 1000


def _hf_cfg(cls, **kw):
    cfg = cls(**kw)
    cfg.use_cache = False
    cfg._attn_implementation = "eager"
    return cfg


def _logits_ids_mask(m, ids, am):
    return (m(input_ids=ids, attention_mask=am, return_dict=True).logits,)


def _logits_bert(m, ids, am, tt):
    return (m(input_ids=ids, attention_mask=am, token_type_ids=tt, return_dict=True).logits,)


def _logits_seq2seq(m, ids, am, dids):
    return (m(input_ids=ids, attention_mask=am, decoder_input_ids=dids, use_cache=False,
              return_dict=True).logits,)


def _logits_pixels(m, x):
    return (m(pixel_values=x, return_dict=True).logits,)


ENC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
           vocab_size=VOCAB, max_position_embeddings=64)


def _bert():
    from transformers import BertConfig, BertForMaskedLM
    cfg = _hf_cfg(BertConfig, **ENC, type_vocab_size=2)
    return (Wrap(BertForMaskedLM(cfg), _logits_bert),
            toks(VOCAB, ("input_ids", "attention_mask", "token_type_ids")), ["logits"], "m.",
            f"transformers.BertForMaskedLM(BertConfig(**{ENC}, type_vocab_size=2)) "
            "(decoder tied to the word embeddings)")


def _distilbert():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    kw = dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, vocab_size=VOCAB,
              max_position_embeddings=64, num_labels=3)
    return (Wrap(DistilBertForSequenceClassification(_hf_cfg(DistilBertConfig, **kw)), _logits_ids_mask),
            toks(VOCAB), ["logits"], "m.",
            f"transformers.DistilBertForSequenceClassification(DistilBertConfig(**{kw}))")


def _roberta():
    from transformers import RobertaConfig, RobertaForTokenClassification
    kw = dict(ENC, num_labels=5, pad_token_id=1)
    # RoBERTa's position ids start after pad_token_id: 16 tokens need max_position >= 18
    return (Wrap(RobertaForTokenClassification(_hf_cfg(RobertaConfig, **kw)), _logits_ids_mask),
            toks(VOCAB), ["logits"], "m.",
            f"transformers.RobertaForTokenClassification(RobertaConfig(**{kw}))")


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    kw = dict(n_embd=32, n_layer=2, n_head=2, n_positions=64, vocab_size=VOCAB, bos_token_id=0,
              eos_token_id=0)
    return (Wrap(GPT2LMHeadModel(_hf_cfg(GPT2Config, **kw)), _logits_ids_mask), toks(VOCAB),
            ["logits"], "m.", f"transformers.GPT2LMHeadModel(GPT2Config(**{kw})) (lm_head tied to wte)")


def _dec_toks(vocab):
    return toks(vocab) + [In("decoder_input_ids", (SEQ // 2,), "int64", high=vocab, low=2)]


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration
    kw = dict(d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2, num_decoder_layers=2,
              vocab_size=VOCAB, relative_attention_num_buckets=8, feed_forward_proj="relu",
              decoder_start_token_id=0)
    return (Wrap(T5ForConditionalGeneration(_hf_cfg(T5Config, **kw)), _logits_seq2seq),
            _dec_toks(VOCAB), ["logits"], "m.",
            f"transformers.T5ForConditionalGeneration(T5Config(**{kw})) (lm_head tied to shared)")


def _bart():
    from transformers import BartConfig, BartForConditionalGeneration
    kw = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
              decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=VOCAB,
              max_position_embeddings=64)
    return (Wrap(BartForConditionalGeneration(_hf_cfg(BartConfig, **kw)), _logits_seq2seq),
            _dec_toks(VOCAB), ["logits"], "m.",
            f"transformers.BartForConditionalGeneration(BartConfig(**{kw})) (lm_head tied to shared)")


def _hf_vit():
    from transformers import ViTConfig, ViTForImageClassification
    kw = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, num_labels=10)
    return (Wrap(ViTForImageClassification(_hf_cfg(ViTConfig, **kw)), _logits_pixels), img(32),
            ["logits"], "m.", f"transformers.ViTForImageClassification(ViTConfig(**{kw}))")


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, hidden_act="silu",
              tie_word_embeddings=False)
    return (Wrap(LlamaForCausalLM(_hf_cfg(LlamaConfig, **kw)), _logits_ids_mask), toks(VOCAB),
            ["logits"], "m.",
            f"transformers.LlamaForCausalLM(LlamaConfig(**{kw})) (RMSNorm, rotary embeddings, "
            "SiLU-gated MLP, grouped-query attention)")


# ---------------------------------------------------------------------------------------------
# recurrent, recommendation, multi-input / multi-branch


class RNNClassifier(nn.Module):
    """Token embedding -> 2-layer (bi)LSTM/GRU -> Linear on the last time step."""

    def __init__(self, cell, vocab=100, emb=16, hidden=16, classes=5, bidirectional=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = getattr(nn, cell)(emb, hidden, num_layers=2, batch_first=True,
                                     bidirectional=bidirectional)
        self.fc = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, ids):
        y, _ = self.rnn(self.emb(ids))
        return self.fc(y[:, -1])


class LSTMSeq(nn.Module):
    """A float-sequence LSTM (no embedding): LSTM over [batch, seq, 8] -> per-step Linear."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.lstm(x)[0])


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019, arXiv:1906.00091): bottom MLP on dense features, one
    nn.EmbeddingBag (mode='sum') per sparse feature over a bag of ids, pairwise dot-product
    interaction (bmm of the stacked vectors, strictly lower triangle), top MLP -> 1 logit."""

    def __init__(self, dense=8, tables=(50, 40, 30), dim=8, bag=3):
        super().__init__()
        self.bot = nn.Sequential(nn.Linear(dense, 16), nn.ReLU(), nn.Linear(16, dim), nn.ReLU())
        self.emb = nn.ModuleList([nn.EmbeddingBag(n, dim, mode="sum") for n in tables])
        n = len(tables) + 1
        self.register_buffer("li", torch.tril_indices(n, n, -1)[0], persistent=False)
        self.register_buffer("lj", torch.tril_indices(n, n, -1)[1], persistent=False)
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, sparse):
        x = self.bot(dense)
        ly = [e(sparse[:, i]) for i, e in enumerate(self.emb)]
        t = torch.stack([x] + ly, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        zf = z[:, self.li, self.lj]
        return self.top(torch.cat([x, zf], dim=1))


class TwoTower(nn.Module):
    """Multi-input: an image branch (conv) and a vector branch (MLP), concatenated -> head."""

    def __init__(self):
        super().__init__()
        self.img = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten())
        self.vec = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16))
        self.head = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))

    def forward(self, image, features):
        return self.head(torch.cat([self.img(image), self.vec(features)], dim=1))


class Siamese(nn.Module):
    """Shared weights: one encoder applied to two inputs, |a - b| and a * b -> head (the encoder's
    gradients are the sum over both uses)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16))
        self.head = nn.Linear(32, 2)

    def forward(self, a, b):
        x, y = self.enc(a), self.enc(b)
        return self.head(torch.cat([(x - y).abs(), x * y], dim=1))


class MultiBranch(nn.Module):
    """Multi-branch, multi-output: three parallel branches (conv 1x1, conv 3x3 dilated, pooled)
    summed and concatenated, and two heads (the first output is the one a loss goes on)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = nn.Conv2d(16, 8, 1)
        self.b2 = nn.Sequential(nn.Conv2d(16, 8, 3, padding=2, dilation=2), nn.Sigmoid())
        self.b3 = nn.Sequential(nn.AvgPool2d(3, 1, 1), nn.Conv2d(16, 8, 1))
        self.cls = nn.Linear(24, 10)
        self.aux = nn.Linear(24, 1)

    def forward(self, x):
        s = F.relu(self.stem(x))
        a, b, c = self.b1(s), self.b2(s), self.b3(s)
        y = torch.cat([a + b, b * c, F.silu(c)], dim=1).mean(dim=(2, 3))
        return self.cls(y), self.aux(y)


class ResidualMLP(nn.Module):
    """A plain MLP with residual blocks, LayerNorm and GELU (a sanity baseline of the zoo)."""

    def __init__(self, d=32, blocks=3):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(),
                                                   nn.Linear(2 * d, d)) for _ in range(blocks)])
        self.out = nn.Linear(d, 4)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


def _custom(cls, inputs, outputs=("logits",), origin=None, **kw):
    def b():
        return cls(**kw), inputs, list(outputs), None, origin or f"{cls.__name__}({kw}) (defined in this script)"
    return b


# ---------------------------------------------------------------------------------------------
# The zoo, smallest / fastest first.

ZOO = [
    Spec("mlp_residual", "mlp", _custom(ResidualMLP, [In("input", (16,))])),
    Spec("siamese", "multi-input", _custom(Siamese, [In("a", (20,)), In("b", (20,))]),
         "shared encoder used twice"),
    Spec("two_tower", "multi-input", _custom(TwoTower, [In("image", (3, 16, 16)), In("features", (12,))])),
    Spec("multi_branch", "multi-branch", _custom(MultiBranch, img(16), ("logits", "aux"))),
    Spec("lstm", "rnn", _custom(RNNClassifier, [In("input_ids", (SEQ,), "int64", high=100)], cell="LSTM")),
    Spec("gru", "rnn", _custom(RNNClassifier, [In("input_ids", (SEQ,), "int64", high=100)], cell="GRU",
                               bidirectional=True), "bidirectional"),
    Spec("lstm_seq", "rnn", _custom(LSTMSeq, [In("input", (SEQ, 8))])),
    Spec("dlrm", "recommendation",
         _custom(DLRM, [In("dense", (8,)), In("sparse", (3, 3), "int64", high=30)]),
         "nn.EmbeddingBag(mode='sum') with 2-D [batch, bag] ids per table"),
    Spec("gpt2", "hf-decoder", _gpt2),
    Spec("llama", "hf-decoder", _llama),
    Spec("bert", "hf-encoder", _bert),
    Spec("distilbert", "hf-encoder", _distilbert),
    Spec("roberta", "hf-encoder", _roberta),
    Spec("hf_vit", "hf-encoder", _hf_vit),
    Spec("t5", "hf-seq2seq", _t5),
    Spec("bart", "hf-seq2seq", _bart),
    Spec("vit", "classification", lambda: (None,)),  # filled in build_spec (needs the generator)
    Spec("squeezenet", "classification", _tv("torchvision.models.squeezenet1_1(weights=None, num_classes=10)",
                                             _squeezenet, 64)),
    Spec("shufflenet", "classification",
         _tv("torchvision.models.shufflenet_v2_x0_5(weights=None, num_classes=10)", _shufflenet)),
    Spec("mnasnet", "classification", _tv("torchvision.models.mnasnet0_5(weights=None, num_classes=10)",
                                          _mnasnet)),
    Spec("mobilenet_v2", "classification",
         _tv("torchvision.models.mobilenet_v2(weights=None, width_mult=0.5, num_classes=10)", _mbv2)),
    Spec("mobilenet_v3_small", "classification",
         _tv("torchvision.models.mobilenet_v3_small(weights=None, width_mult=0.5, num_classes=10)", _mbv3s)),
    Spec("mobilenet_v3_large", "classification",
         _tv("torchvision.models.mobilenet_v3_large(weights=None, width_mult=0.5, num_classes=10)", _mbv3l)),
    Spec("efficientnet_b0", "classification",
         _tv("torchvision EfficientNet(*_efficientnet_conf('efficientnet_b0', width_mult=0.5, "
             "depth_mult=0.5), dropout=0.2, num_classes=10)", _effnet_b0)),
    Spec("efficientnet_v2", "classification",
         _tv("torchvision EfficientNet(FusedMBConv x3 + MBConv x3 (efficientnet_v2_s stage kinds, 1 layer "
             "each, channels 8..64), last_channel=128, num_classes=10)", _effnet_v2)),
    Spec("regnet_y_400mf", "classification",
         _tv("torchvision.models.regnet_y_400mf(weights=None, num_classes=10)", _regnet)),
    Spec("resnet_basic", "classification",
         _tv("torchvision ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10) (resnet18 with 1 block per stage)",
             _resnet_basic)),
    Spec("resnet_bottleneck", "classification",
         _tv("torchvision ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10) (resnet50 with 1 block per stage)",
             _resnet_bottleneck)),
    Spec("resnext", "classification",
         _tv("torchvision ResNet(Bottleneck, [1, 1, 1, 1], groups=8, width_per_group=8, num_classes=10)",
             _resnext)),
    Spec("densenet", "classification",
         _tv("torchvision DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, "
             "bn_size=2, num_classes=10)", _densenet)),
    Spec("convnext", "classification",
         _tv("torchvision ConvNeXt([CNBlockConfig(16, 32, 1), (32, 64, 1), (64, 128, 1), (128, None, 1)], "
             "stochastic_depth_prob=0, num_classes=10)", _convnext)),
    Spec("swin", "classification",
         _tv("torchvision SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2, 2, 2], "
             "num_heads=[1, 2, 2, 4], window_size=[4, 4], stochastic_depth_prob=0, num_classes=10)",
             _swin, 64)),
    Spec("swin_v2", "classification",
         _tv("torchvision SwinTransformer(... as swin ..., block=SwinTransformerBlockV2, "
             "downsample_layer=PatchMergingV2)", _swin_v2, 64)),
    Spec("googlenet", "classification",
         _tv("torchvision.models.googlenet(weights=None, aux_logits=False, init_weights=True, num_classes=10)",
             _googlenet)),
    Spec("vgg11_bn", "classification",
         _tv("torchvision VGG(make_layers(vgg11 'A' cfg at 1/8 width, batch_norm=True)), classifier "
             "Linear(64*7*7,128)-ReLU-Dropout-Linear(128,128)-ReLU-Dropout-Linear(128,10) (224x224: the "
             "AdaptiveAvgPool2d((7, 7)) exports only for a multiple of 7)", _vgg, 224)),
    Spec("inception_v3", "classification",
         _tv("torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False, "
             "num_classes=10) at its minimum input 75x75", _inception, 75)),
    Spec("unet", "segmentation", _custom(UNet, img(32), origin="UNet(base=8, levels=3) (defined in this "
                                         "script; ConvTranspose2d up-sampling)")),
    Spec("unet_bilinear", "segmentation",
         _custom(UNet, img(32), origin="UNet(base=8, levels=3, bilinear=True) (defined in this script; "
                 "Upsample(bilinear, align_corners=True) up-sampling)", bilinear=True)),
    Spec("lraspp", "segmentation",
         _tv("torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None, "
             "num_classes=4)['out']", _lraspp, 64)),
    Spec("deeplabv3", "segmentation",
         _tv("torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, "
             "weights_backbone=None, num_classes=4, aux_loss=False)['out']", _deeplab, 64)),
    Spec("fcn", "segmentation",
         _tv("torchvision.models.segmentation.fcn._fcn_resnet(ResNet(Bottleneck, [1, 1, 1, 1], "
             "replace_stride_with_dilation=[False, True, True]), num_classes=4, aux=False)['out']", _fcn, 64)),
]
BY_NAME = {s.name: s for s in ZOO}


def build_spec(spec, gen):
    if spec.name == "vit":
        return (_vit(gen), img(32), ["logits"], None,
                "torchvision VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, "
                "hidden_dim=32, mlp_dim=64, num_classes=10), classifier head (zero-initialised by "
                "torchvision) re-drawn from N(0, 0.02)")
    return spec.build()


# ---------------------------------------------------------------------------------------------


def rename_with_prefix(path, prefix):
    if prefix:
        em.postprocess_onnx(path, prefix)
    else:
        em.postprocess_onnx(path, None)
    return onnx.load(path)


def ort_run(path, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, {k: v.numpy() for k, v in feeds.items()})


def ort_vs_torch(model, path, feeds):
    got = ort_run(path, feeds)
    with torch.no_grad():
        ref = model(*feeds.values())
    ref = (ref,) if isinstance(ref, torch.Tensor) else tuple(ref)
    worst = 0.0
    for r, o in zip(ref, got):
        r = r.numpy()
        if r.shape != o.shape:
            raise RuntimeError(f"onnxruntime output shape {o.shape} != torch {r.shape}")
        worst = max(worst, float(np.abs(r - o).max()) / max(float(np.abs(r).max()), 1e-12))
    if not np.abs(ref[0].numpy()).max() > 0:
        raise RuntimeError("the first output is all zeros (a vacuous reference)")
    return worst


def first_line(e):
    s = f"{type(e).__name__}: {e}".strip().splitlines()
    return s[0][:300] if s else type(e).__name__


def references(model, feeds, prefix, init_names):
    """loss and gradients (float32, float64, and float64 along float32's branch decisions) of
    mean(y0^2) w.r.t. every parameter that is an initializer (keyed by initializer name)."""
    params = dict(model.named_parameters(remove_duplicate=False))  # tied ones under every name
    by_init, covered = {}, set()
    for k in init_names:
        tk = (prefix or "") + k
        if tk in params and id(params[tk]) not in covered:
            by_init[k] = tk
            covered.add(id(params[tk]))
    rec, log_ = {}, []
    for dt, tag, branches in ((torch.float32, "32", em.Branches.make("record", log_)),
                              (torch.float64, "64", None),
                              (torch.float64, "64b", em.Branches.make("replay", log_))):
        model.to(dt)
        model.zero_grad(set_to_none=True)
        f = {k: v.to(dt) if v.is_floating_point() else v for k, v in feeds.items()}
        try:
            with branches or contextlib.nullcontext():
                outs = model(*f.values())
                outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
                loss = (outs[0] ** 2).mean()
                loss.backward()
            if tag == "64b" and branches.i != len(log_):
                raise RuntimeError(f"{len(log_) - branches.i} recorded branch decisions not replayed")
        except RuntimeError as e:
            if tag != "64b":
                raise
            rec["branches_note"] = np.frombuffer(first_line(e).encode(), np.uint8)
            continue
        if tag == "64b":
            rec["branch_decisions"] = np.asarray(len(log_), np.int64)
        else:
            rec["loss" + tag] = np.asarray(loss.item(), np.float64)
        if dt == torch.float32:
            for i, o in enumerate(outs):
                rec[f"output{i}"] = o.detach().numpy()
        for k, tk in by_init.items():
            g = params[tk].grad
            g = torch.zeros_like(params[tk]) if g is None else g
            rec[f"grad{tag}/{k}"] = g.detach().numpy().astype(np.float32 if tag == "32" else np.float64)
    model.to(torch.float32)
    missing = [n for n, p in model.named_parameters() if id(p) not in covered]
    return rec, missing


def export_model(spec, out_dir, dynamo=True, verify=True):
    name = spec.name
    seed = em.seed_for(name)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model, ins, out_names, prefix, origin = build_spec(spec, gen)
    model.eval()
    # Constant parameters (zero biases, norm weights of 1, torchvision's zero ViT head) get
    # N(0, 0.02) added: no two initializers are then equal (the dynamo exporter's optimizer
    # merges equal initializers into one, which makes per-name gradients incomparable) and no
    # gradient is trivially zero.
    perturbed = []
    with torch.no_grad():
        for pn, p in model.named_parameters():
            if p.is_floating_point() and p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
                perturbed.append(pn)
    trace = OrderedDict((i.name, i.make(BATCH, gen)) for i in ins)
    args = tuple(trace.values())
    bn = em.calibrate_batchnorm(model, args, gen)
    model.eval()
    rec = OrderedDict(name=name, family=spec.family, origin=origin, seed=seed,
                      inputs=[i.manifest() for i in ins], batch=BATCH, outputs=out_names,
                      loss="mean-square: L = mean(y0**2) over the first output " + out_names[0],
                      bn_calibrated=bn, notes=spec.notes, constant_params_perturbed=len(perturbed),
                      torch_params=sum(p.numel() for p in model.parameters()))
    path = os.path.join(out_dir, name + ".onnx")
    t0 = time.time()
    dyn = {i.name: {0: "batch"} for i in ins}
    dyn.update({o: {0: "batch"} for o in out_names})
    torch.onnx.export(model, args, path, input_names=[i.name for i in ins], output_names=out_names,
                      dynamic_axes=dyn, **em.EXPORT_KW)
    om = rename_with_prefix(path, prefix)
    onnx.checker.check_model(path)
    rec["export_s"] = round(time.time() - t0, 2)
    rec["onnx_bytes"] = os.path.getsize(path)
    rec["onnx_nodes"] = len(om.graph.node)
    ops = {}
    for n in om.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    rec["op_types"] = dict(sorted(ops.items()))
    init_names = [i.name for i in om.graph.initializer]
    del om
    exporters = ["torchscript-opset17"]
    if verify:
        rec["ort_vs_torch_rel"] = ort_vs_torch(model, path, trace)
        other = OrderedDict((i.name, i.make(BATCH + 1, gen)) for i in ins)
        rec["ort_vs_torch_rel_batch3"] = ort_vs_torch(model, path, other)

    # reference data
    igen = torch.Generator().manual_seed(REF_SEED)
    feeds = OrderedDict((i.name, i.make(BATCH, igen)) for i in ins)
    np.savez(os.path.join(out_dir, name + ".inputs.npz"), **{k: v.numpy() for k, v in feeds.items()})
    t0 = time.time()
    ref, missing = references(model, feeds, prefix, init_names)
    out_rec = {f"output/{out_names[i]}": ref.pop(f"output{i}") for i in range(len(out_names))}
    ref.update(out_rec)
    meta = {"model": name, "loss": rec["loss"], "ref_seed": REF_SEED,
            "params_not_initializers": missing, "torch": torch.__version__}
    ref["meta_json"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(os.path.join(out_dir, name + ".ref.npz"), **ref)
    rec["ref_s"] = round(time.time() - t0, 2)
    rec["ref_loss32"] = float(ref["loss32"])
    rec["grads_in_ref"] = sum(1 for k in ref if k.startswith("grad32/"))
    rec["params_not_initializers"] = missing

    if dynamo:
        dpath = os.path.join(out_dir, name + ".dynamo.onnx")
        t0 = time.time()
        try:
            with torch.no_grad():
                torch.onnx.export(model, args, dpath, dynamo=True, opset_version=DYNAMO_OPSET,
                                  input_names=[i.name for i in ins], output_names=out_names,
                                  external_data=False, verbose=False)
            dm = rename_with_prefix(dpath, prefix)
            onnx.checker.check_model(dpath)
            dinit = {i.name for i in dm.graph.initializer}
            del dm
            rel = ort_vs_torch(model, dpath, trace) if verify else None
            exporters.append(f"dynamo-opset{DYNAMO_OPSET}")
            rec["dynamo"] = {"status": "ok", "export_s": round(time.time() - t0, 2),
                             "onnx_bytes": os.path.getsize(dpath), "ort_vs_torch_rel": rel,
                             "static_batch": BATCH,
                             "ref_grads_named_as_initializers": sum(
                                 1 for k in ref if k.startswith("grad32/") and k[7:] in dinit)}
        except Exception as e:  # recorded in the manifest, not hidden
            for p in (dpath, dpath + ".data"):
                if os.path.exists(p):
                    os.remove(p)
            rec["dynamo"] = {"status": "failed", "error": first_line(e)}
    rec["exporters"] = exporters
    return rec


def manifest_entry(rec):
    keep = ["name", "family", "origin", "seed", "inputs", "batch", "outputs", "loss", "exporters",
            "constant_params_perturbed",
            "dynamo", "bn_calibrated", "torch_params", "onnx_nodes", "op_types", "grads_in_ref",
            "params_not_initializers", "ort_vs_torch_rel", "notes", "error"]
    e = OrderedDict((k, rec[k]) for k in keep if k in rec)
    if isinstance(e.get("dynamo"), dict):
        e["dynamo"] = {k: v for k, v in e["dynamo"].items() if k not in ("export_s", "onnx_bytes")}
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=list(BY_NAME), help="just this model (repeatable)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench-data", "zoo"))
    ap.add_argument("--no-dynamo", action="store_true", help="skip the dynamo=True exports")
    ap.add_argument("--no-verify", action="store_true", help="skip onnxruntime vs torch")
    ap.add_argument("--manifest", default=MANIFEST, help="manifest to update (entries merged by name)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        for s in ZOO:
            print(f"{s.name:20s} {s.family}")
        return
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    manifest = OrderedDict()
    if os.path.exists(a.manifest):
        for e in json.load(open(a.manifest))["models"]:
            manifest[e["name"]] = e
    done, failed = [], []
    partial = os.path.join(a.out, "PARTIAL")
    for spec in ZOO:
        if a.only and spec.name not in a.only:
            continue
        log(f"[{spec.name}] ...")
        t0 = time.time()
        try:
            rec = export_model(spec, a.out, dynamo=not a.no_dynamo, verify=not a.no_verify)
            done.append(spec.name)
        except Exception as e:
            traceback.print_exc()
            rec = {"name": spec.name, "family": spec.family, "error": first_line(e)}
            failed.append(spec.name)
        rec["total_s"] = round(time.time() - t0, 1)
        print(json.dumps(rec), flush=True)
        log(f"[{spec.name}] {rec.get('error') or 'ok'} ({rec['total_s']} s, dynamo: "
            f"{(rec.get('dynamo') or {}).get('status', '-')})")
        manifest[spec.name] = manifest_entry(rec)
        with open(partial, "w") as f:
            f.write("".join(f"{n}\n" for n in done))
    order = {s.name: i for i, s in enumerate(ZOO)}
    models = sorted(manifest.values(), key=lambda e: order.get(e["name"], 1 << 30))
    with open(a.manifest, "w") as f:
        json.dump({"generated_by": "scripts/export_zoo.py", "batch": BATCH, "seq": SEQ,
                   "torch": torch.__version__, "onnx": onnx.__version__,
                   "reference": {"inputs": "NAME.inputs.npz (seed %d)" % REF_SEED,
                                 "ref": "NAME.ref.npz: loss32, loss64, output/<name>, grad32/<init>, "
                                        "grad64/<init>, grad64b/<init> (float64 along float32's branches), branch_decisions, meta_json"},
                   "models": models}, f, indent=1)
        f.write("\n")
    if not a.only:
        files = sorted(os.listdir(a.out))
        with open(os.path.join(a.out, "READY"), "w") as f:
            f.write("".join(x + "\n" for x in files if x.endswith((".onnx", ".npz"))))
    if failed:
        log("FAILED: " + ", ".join(failed))
        sys.exit(1)


def log(*x):
    print(*x, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
