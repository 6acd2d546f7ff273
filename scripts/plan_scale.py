#!/usr/bin/env python3
"""Planner search at scale (issue "search at scale"): search time and peak RSS of every planner
over GPT-style models of growing depth and clusters of growing size.

The models are GPT-2 language models from a config (n_embd 128, 4 heads, 16 tokens, vocabulary
512, random weights, nothing downloaded), exported by torch.onnx.export (opset 17) at each
--layers depth into --out (kept between runs: an existing file is reused). Export needs torch and
transformers: `bash scripts/setup.sh --export-venv`, then run this script with that venv's python.

Clusters: `8@450e9,K@50e9` with `--device-kind H100-80GB` (servers of 8 GPUs on NVLink, K servers
on a 50 GB/s network), K = devices / 8 (devices < 8: one server of that many GPUs).

Every run is `pipec plan MODEL --cluster C --device-kind H100-80GB --planner P --batch B --json`
under /usr/bin/time (peak RSS) with --timeout seconds (a run past it counts as "> timeout").
With --time-limit S the planners get `--time-limit S` too (their plans say whether it cut them).

Prints a Markdown table (planner x layers x devices: search seconds, peak MB, plan iteration
time) and, per planner, the fitted exponents of search time in nodes (at the largest device
count every depth finished) and in devices (at the largest depth every device count finished):
time ~ nodes^a, time ~ devices^b, least squares on the logs.

Usage: python3 scripts/plan_scale.py [--pipec target/release/pipec] [--out DIR]
       [--layers 12,24,48,96] [--devices 8,64,256,1024] [--planners gpp,dapple,...]
       [--batch 4096] [--timeout 120] [--time-limit S] [--json FILE]
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANNERS = ["gpp", "dapple", "pipedream", "bapipe", "straight", "dp"]


def export_gpt(layers, path):
    """GPT2LMHeadModel(n_embd=128, n_layer=layers, n_head=4) to ONNX at `path` (eager attention
    with an attention mask, as scripts/export_zoo.py exports its GPT-2)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=128, n_layer=layers, n_head=4, n_positions=64, vocab_size=512,
                     bos_token_id=0, eos_token_id=0)
    cfg.use_cache = False
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask, return_dict=True).logits

    ids = torch.randint(2, 512, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    tmp = path + ".tmp"
    torch.onnx.export(Wrap(model), (ids, mask), tmp, input_names=["input_ids", "attention_mask"],
                      output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"},
                                    "logits": {0: "batch"}},
                      opset_version=17, dynamo=False, do_constant_folding=False)
    os.replace(tmp, path)


def onnx_nodes(path):
    try:
        import onnx
        return len(onnx.load(path, load_external_data=False).graph.node)
    except Exception:  # noqa: BLE001 - the count is informative only
        return None


def cluster(devices):
    if devices < 8:
        return f"{devices}@450e9"
    return f"8@450e9,{devices // 8}@50e9"


def run_timed(cmd, timeout):
    """`cmd` under /usr/bin/time: `None` past `timeout` seconds, else `(completed process, wall
    seconds, peak RSS in MB or None)`."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        t0 = time.monotonic()
        try:
            r = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, *cmd],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        wall = time.monotonic() - t0
        rss = tf.read().strip().splitlines()
    kb = int(rss[-1]) if rss and rss[-1].isdigit() else None
    return r, wall, (kb / 1024 if kb else None)


def run_plan(a, model, planner, devices):
    cmd = [a.pipec, "plan", model, "--cluster", cluster(devices), "--device-kind", "H100-80GB",
           "--planner", planner, "--batch", str(a.batch), "--json"]
    if a.time_limit is not None:
        cmd += ["--time-limit", str(a.time_limit)]
    got = run_timed(cmd, a.timeout)
    if got is None:
        return {"status": "timeout", "wall_s": a.timeout}
    r, wall, mb = got
    out = {"wall_s": wall, "peak_mb": mb}
    if r.returncode != 0:
        err = [line.strip() for line in r.stderr.splitlines() if line.strip()]
        last = err[-1] if err else f"exit {r.returncode}"
        out.update(status="error", error=re.sub(r"^(caused by:|error:)\s*", "", last)[:200])
        return out
    p = json.loads(r.stdout)
    out.update(status="ok", search_s=p["search_time_s"], iteration_s=p["iteration_time_s"],
               stages=len(p["stages"]), time_limited=bool(p.get("time_limited")))
    return out


def fit(points):
    """Least-squares slope of log(y) on log(x)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "target", "release", "pipec"))
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "plan-scale-models"))
    ap.add_argument("--layers", default="12,24,48,96")
    ap.add_argument("--devices", default="8,64,256,1024")
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--time-limit", type=float, default=None)
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args()
    layers = [int(x) for x in a.layers.split(",") if x]
    devices = [int(x) for x in a.devices.split(",") if x]
    planners = [x for x in a.planners.split(",") if x]
    for p in planners:
        if p not in PLANNERS:
            sys.exit(f"--planners: unknown planner '{p}' (known: {', '.join(PLANNERS)})")
    if not os.path.exists(a.pipec):
        sys.exit(f"--pipec {a.pipec}: no such file (cargo build --release --bin pipec)")
    os.makedirs(a.out, exist_ok=True)
    models = {}
    for n in layers:
        path = os.path.join(a.out, f"gpt_l{n}.onnx")
        if not os.path.exists(path):
            print(f"exporting GPT-style model, {n} layers -> {path}", file=sys.stderr, flush=True)
            export_gpt(n, path)
        models[n] = (path, onnx_nodes(path))
    rows = []
    for planner in planners:
        for n in layers:
            for d in devices:
                path, nodes = models[n]
                r = run_plan(a, path, planner, d)
                r.update(planner=planner, layers=n, nodes=nodes, devices=d)
                rows.append(r)
                shown = (f"{r['search_s']:.3f} s" if r["status"] == "ok"
                         else f"> {a.timeout:.0f} s" if r["status"] == "timeout"
                         else r.get("error", "error"))
                print(f"{planner:<10} L={n:<3} nodes={nodes} D={d:<5} {shown}", file=sys.stderr,
                      flush=True)
    print(f"`pipec plan` search time / peak RSS / plan iteration time; GPT-style, n_embd 128, "
          f"batch {a.batch}, cluster 8@450e9,D/8@50e9 H100-80GB, timeout {a.timeout:.0f} s"
          + (f", --time-limit {a.time_limit}" if a.time_limit is not None else "") + "\n")
    print("| planner | layers | nodes | " + " | ".join(f"{d} devices" for d in devices) + " |")
    print("|---|---|---|" + "---|" * len(devices))
    for planner in planners:
        for n in layers:
            cells = []
            for d in devices:
                r = next(x for x in rows if (x["planner"], x["layers"], x["devices"]) == (planner, n, d))
                if r["status"] == "ok":
                    mark = " (time-limited)" if r.get("time_limited") else ""
                    cells.append(f"{r['search_s']:.2f} s, {r['peak_mb']:.0f} MB, "
                                 f"{r['iteration_s'] * 1e3:.1f} ms{mark}")
                elif r["status"] == "timeout":
                    cells.append(f"> {a.timeout:.0f} s")
                else:
                    cells.append("error: " + re.sub(r"\|", "/", r.get("error", "")))
            print(f"| {planner} | {n} | {models[n][1]} | " + " | ".join(cells) + " |")
    print("\n| planner | time ~ nodes^a (devices) | time ~ devices^b (layers) |\n|---|---|---|")
    for planner in planners:
        ok = {(r["layers"], r["devices"]): r for r in rows
              if r["planner"] == planner and r["status"] == "ok"}
        a_fit, b_fit = "-", "-"
        for d in sorted(devices, reverse=True):
            pts = [(models[n][1] or 0, ok[(n, d)]["search_s"]) for n in layers if (n, d) in ok]
            if len(pts) == len(layers) and len(pts) >= 2:
                s = fit(pts)
                a_fit = f"{s:.2f} ({d})" if s is not None else "-"
                break
        for n in sorted(layers, reverse=True):
            pts = [(d, ok[(n, d)]["search_s"]) for d in devices if (n, d) in ok]
            if len(pts) == len(devices) and len(pts) >= 2:
                s = fit(pts)
                b_fit = f"{s:.2f} ({n})" if s is not None else "-"
                break
        print(f"| {planner} | {a_fit} | {b_fit} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
