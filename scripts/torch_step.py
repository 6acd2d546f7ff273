#!/usr/bin/env python3
"""Time PyTorch doing the training step that `pipec run` does, for a bundled dev model.

    python3 scripts/torch_step.py MODEL [--batch 8] [--steps 20] [--device cpu|cuda]
                                  [--threads N] [--lr 0.01] [--momentum 0.9]

MODEL is one of onnx-models/gen_dev_models.py's builders (mlp4, inception_mini, resnet18,
gpt2_tiny): the same architecture pipec's ONNX file was exported from, with fresh random weights
(the step time does not depend on their values). The step is what `pipec compile --loss
mean-square --optimizer sgd:lr=LR,momentum=M` trains: eval mode (BatchNorm uses its running
statistics, as the exported graph does), loss = mean(y0**2) over the first output, backward,
SGD with momentum. Inputs are random at --batch (tokens uniform in the vocabulary, attention mask
all ones), the same every step, as `pipec run` does without --inputs.

Prints one JSON line: model, device, threads, batch, steps, median and mean step seconds (after
3 warm-up steps; CUDA steps are synchronized before the clock is read), torch version.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "onnx-models"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    import gen_dev_models  # noqa: E402  (needs onnx and onnxruntime importable, as its header says)

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model, inputs, _, _, _ = gen_dev_models.build(a.model, gen)
    dev = torch.device(a.device)
    model = model.to(dev).eval()
    feeds = []
    for t in inputs.values():
        shape = (a.batch,) + tuple(t.shape[1:])
        if t.is_floating_point():
            feeds.append(torch.randn(shape, generator=gen).to(dev))
        elif t.min() == t.max():  # attention mask
            feeds.append(torch.ones(shape, dtype=t.dtype).to(dev))
        else:
            feeds.append(torch.randint(0, int(t.max()) + 1, shape, generator=gen).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(*feeds)
        y0 = out[0] if isinstance(out, (tuple, list)) else out
        loss = (y0.float() ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step()
    times = []
    for _ in range(a.steps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(json.dumps({
        "model": a.model, "device": a.device, "threads": torch.get_num_threads(), "batch": a.batch,
        "steps": a.steps, "median_step_s": statistics.median(times), "mean_step_s": statistics.mean(times),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
