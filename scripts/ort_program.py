#!/usr/bin/env python3
"""Independent oracle for `pipec compile` output: executes OUTDIR's schedule.json with
onnxruntime (one simulated worker per device, replayed round-robin in one process: buffered
sends, blocking receives, collective all-reduces), runs the unpartitioned reference program the
same way `pipec run --check` does (for `pipedream-async` programs: its emulation of PipeDream's
update rule, each micro-batch reading the parameter versions the program's computes read), and
compares every parameter after N steps. Also runs
`onnx.checker.check_model(full_check=True)` on every emitted ONNX file.

Usage: python3 scripts/ort_program.py OUTDIR [--steps 3] [--seed 0] [--tol 1e-4]
Exit 0 when every parameter agrees within tol (norm-wise relative: max|a-b| / max|b|).
"""
import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort

DT = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32, "bool": np.bool_,
      "float32": np.float32, "float64": np.float64, "int64": np.int64, "int32": np.int32}


def session(path):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_piece(sess, lookup):
    feeds = {i.name: lookup(i.name) for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    return {o.name: v for o, v in zip(sess.get_outputs(), outs)}


def make_data(prog, seed):
    rng = np.random.default_rng(seed)
    data = {}
    for d in prog["data_inputs"]:
        shape = d["shape"]
        if d["dtype"] in ("f32", "f64", "float32", "float64"):
            data[d["name"]] = rng.standard_normal(shape).astype(DT[d["dtype"]])
        else:
            hi = d.get("high") or 2
            data[d["name"]] = rng.integers(0, hi, size=shape).astype(DT[d["dtype"]])
    return data


def take_rows(x, lo, hi, axis):
    return np.take(x, np.arange(lo, hi), axis=axis)


def run_pipeline(outdir, prog, weights, data, steps):
    n = len(prog["devices"])
    stages = prog["stages"]
    sess = {}
    glob = []
    # A device runs its stage, and under interleaved 1F1B its further chunks ("chunks"); an
    # instruction {"op": "stage"} switches between them. They share the device's globals and
    # keep their own micro-batch buffers.
    own = [[d["stage"]] + d.get("chunks", []) for d in prog["devices"]]
    for d, sids in zip(prog["devices"], own):
        g = {}
        for sid in sids:
            st = stages[sid]
            g.update({p: weights[p].copy() for p in st["params"]})
            for key in ("fwd", "bwd", "bwd_b", "bwd_w", "step"):
                if st.get(key) and (sid, key) not in sess:
                    sess[(sid, key)] = session(os.path.join(outdir, st[key]["file"]))
        glob.append(g)
    state_made = set()  # (device, stage) whose optimizer state exists
    nsteps = {}  # optimizer steps per (device, stage): the step counter counts them
    losses = []
    for step in range(1, steps + 1):
        mbuf = [dict() for _ in range(n)]  # per device: stage -> {(name, mb): array}
        cur = [d["stage"] for d in prog["devices"]]
        mailbox = {}
        pc = [0] * n
        loss = 0.0
        lists = [d["instructions"] for d in prog["devices"]]
        while any(pc[i] < len(lists[i]) for i in range(n)):
            progress = False
            for dv in range(n):
                while pc[dv] < len(lists[dv]):
                    ins = lists[dv][pc[dv]]
                    op = ins["op"]
                    if op == "stage":
                        cur[dv] = ins["stage"]
                    sid = cur[dv]
                    st = stages[sid]
                    g, mb = glob[dv], mbuf[dv].setdefault(sid, {})
                    if op == "stage":
                        pass
                    elif op == "load":
                        d = next(x for x in prog["data_inputs"] if x["name"] == ins["input"])
                        x = data[d["name"]]
                        if d["batch_axis"] is not None:
                            x = take_rows(x, ins["samples"][0], ins["samples"][1], d["batch_axis"])
                        mb[(ins["input"], ins["mb"])] = x
                    elif op == "compute":
                        key = ins["pass"]  # fwd, bwd, or a split backward's bwd_b / bwd_w
                        m = ins["mb"]
                        look = lambda name: mb[(name, m)] if (name, m) in mb else g[name]
                        outs = run_piece(sess[(sid, key)], look)
                        for k, v in outs.items():
                            mb[(k, m)] = v
                        if key == "fwd" and st.get("loss"):
                            loss += float(outs[st["loss"][0]]) * st["loss"][1]
                    elif op == "send":
                        x = mb[(ins["tensor"], ins["mb"])]
                        s = ins.get("slice")
                        if s:
                            rows = x.shape[0]
                            x = x[s["lo"] * rows // s["of"]: s["hi"] * rows // s["of"]]
                        assert list(x.shape) == [d if d >= 0 else x.shape[i] for i, d in enumerate(ins["shape"])], (ins, x.shape)
                        mailbox[ins["tag"]] = x
                    elif op == "recv":
                        if ins["tag"] not in mailbox:
                            break
                        mb[(ins["tensor"], ins["mb"])] = mailbox.pop(ins["tag"])
                    elif op == "concat":
                        parts = [mb.pop((i, ins["mb"])) for i in ins["inputs"]]
                        mb[(ins["output"], ins["mb"])] = np.concatenate(parts, axis=0)
                    elif op == "sum":
                        parts = [mb.pop((i, ins["mb"])) for i in ins["inputs"]]
                        mb[(ins["output"], ins["mb"])] = sum(parts[1:], parts[0])
                    elif op == "zeros":
                        mb[(ins["output"], ins["mb"])] = np.zeros(ins["shape"], dtype=DT[ins["dtype"]])
                    elif op == "accumulate":
                        for t in ins["tensors"]:
                            v = mb.pop((t, ins["mb"]))
                            g[t] = g[t] + v if t in g else v.copy()
                    elif op == "stash":
                        for t in ins["tensors"]:
                            mb[(t, ins["mb"])] = g[t].copy()
                    elif op == "free":
                        for t in ins["tensors"]:
                            mb.pop((t, ins["mb"]), None)
                    elif op == "all_reduce":
                        grp = ins["group"]
                        ready = all(pc[o] < len(lists[o]) and lists[o][pc[o]]["op"] == "all_reduce"
                                    and lists[o][pc[o]]["tag"] == ins["tag"] for o in grp)
                        if not ready:
                            break
                        for t in ins["tensors"]:
                            p = t[len("grad/"):]
                            tot = sum(glob[o].get(t, np.zeros_like(glob[o][p])) for o in grp)
                            for o in grp:
                                glob[o][t] = tot.copy()
                        for o in grp:
                            if o != dv:
                                pc[o] += 1
                    elif op == "step":
                        if (dv, sid) not in state_made:
                            for s_, p in st["state_init"]:
                                g[s_] = np.zeros_like(g[p])
                            state_made.add((dv, sid))
                        nsteps[(dv, sid)] = nsteps.get((dv, sid), 0) + 1
                        if st.get("step_counter"):
                            g[st["step_counter"]] = np.array(nsteps[(dv, sid)], dtype=g[st["params"][0]].dtype)
                        look = lambda name: g[name] if name in g else np.zeros_like(g[name[len("grad/"):]])
                        outs = run_piece(sess[(sid, "step")], look)
                        for o, target in st["updates"]:
                            g[target] = outs[o]
                        mine = {"grad/" + p for p in st["params"]}
                        for k in [k for k in g if k.startswith("grad/") and (len(own[dv]) == 1 or k in mine)]:
                            del g[k]
                    else:
                        raise SystemExit(f"unknown instruction {op}")
                    pc[dv] += 1
                    progress = True
            if not progress:
                raise SystemExit(f"deadlock at {pc}")
        losses.append(loss)
    params = {}
    for dv in range(n):
        for p in [q for sid in own[dv] for q in stages[sid]["params"]]:
            params.setdefault(p, glob[dv][p])
            if not np.array_equal(params[p], glob[dv][p]):
                raise SystemExit(f"tied/replicated parameter {p} differs between holders")
    return params, losses


def read_versions(prog):
    """Per-micro-batch updates (`pipedream-async`): per parameter and micro-batch, the optimizer
    steps its first holder ran before the stash of it for that micro-batch, else before the
    micro-batch's forward."""
    out = {}
    for d in prog["devices"]:
        st = prog["stages"][d["stage"]]
        steps, at_stash, at_fwd = 0, {}, {}
        for ins in d["instructions"]:
            if ins["op"] == "step":
                steps += 1
            elif ins["op"] == "stash":
                for t in ins["tensors"]:
                    at_stash[(t, ins["mb"])] = steps
            elif ins["op"] == "compute" and ins["pass"] == "fwd":
                at_fwd.setdefault(ins["mb"], steps)
        for p in st["params"]:
            if p not in out:
                out[p] = [at_stash.get((p, m), at_fwd.get(m)) for m in range(prog["micro_batches"])]
    return out


def run_reference(outdir, prog, weights, data, steps):
    ref = prog["reference"]
    train = session(os.path.join(outdir, ref["train"]["file"]))
    stepper = session(os.path.join(outdir, ref["step"]["file"]))
    g = {k: v.copy() for k, v in weights.items()}
    for s_, p in ref["state_init"]:
        g[s_] = np.zeros_like(g[p])
    b, M = prog["micro_batch"], prog["micro_batches"]
    # PipeDream's update rule: micro-batch m reads each parameter at the version the program's
    # computes of m read, and its gradients update the newest parameters at once.
    versions = read_versions(prog) if prog.get("per_micro_batch_step") else None
    updated = {target for _, target in ref["updates"]}
    losses = []
    updates = 0

    def update(acc):
        nonlocal updates
        updates += 1
        if ref.get("step_counter"):
            g[ref["step_counter"]] = np.array(updates, dtype=np.float32)
        look = lambda name: acc[name] if name in acc else (g[name] if name in g else np.zeros_like(g[name[len("grad/"):]]))
        outs = run_piece(stepper, look)
        for o, target in ref["updates"]:
            g[target] = outs[o]

    for step in range(1, steps + 1):
        acc = {}
        loss = 0.0
        hist = {p: [g[p]] for p in weights} if versions else None
        for m in range(M):
            feeds = {}
            for d in prog["data_inputs"]:
                x = data[d["name"]]
                if d["batch_axis"] is not None:
                    x = take_rows(x, m * b, (m + 1) * b, d["batch_axis"])
                feeds[d["name"]] = x
            if versions:
                for p, h in hist.items():
                    k = versions.get(p, [None] * M)[m]
                    if k is None and p not in updated:
                        k = len(h) - 1  # no step changes it: one version
                    if k is None or k >= len(h):
                        raise SystemExit(
                            f"step {step} micro-batch {m}: the program reads version {k} of {p}, "
                            f"but PipeDream's update rule has {len(h) - 1} updates before it")
                    feeds[p] = h[k]
            look = lambda name: feeds[name] if name in feeds else g[name]
            outs = run_piece(train, look)
            loss += float(outs[ref["loss"][0]]) * ref["loss"][1]
            for gn, p in ref["grads"]:
                acc["grad/" + p] = acc.get("grad/" + p, 0) + outs[gn]
            if versions:
                update(acc)
                acc = {}
                for p, h in hist.items():
                    h.append(g[p])
        if not versions:
            update(acc)
        losses.append(loss)
    return g, losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--no-checker", action="store_true")
    ap.add_argument("--inputs", help="data npz (keys = data input names, global batch) instead of random")
    ap.add_argument("--save-inputs", help="write the data used to this npz")
    ap.add_argument("--against", help="also compare the final parameters with this npz (e.g. `pipec run -o`)")
    a = ap.parse_args()
    prog = json.load(open(os.path.join(a.outdir, "schedule.json")))
    if not a.no_checker:
        for root, _, files in os.walk(a.outdir):
            for f in sorted(files):
                if f.endswith(".onnx"):
                    onnx.checker.check_model(onnx.load(os.path.join(root, f)), full_check=True)
    w = dict(np.load(os.path.join(a.outdir, prog["weights"])))
    data = dict(np.load(a.inputs)) if a.inputs else make_data(prog, a.seed)
    if a.save_inputs:
        np.savez(a.save_inputs, **data)
    pp, pl = run_pipeline(a.outdir, prog, w, data, a.steps)
    rp, rl = run_reference(a.outdir, prog, w, data, a.steps)
    worst_abs = worst_rel = 0.0
    for p, v in pp.items():
        r = rp[p]
        d = float(np.max(np.abs(v.astype(np.float64) - r))) if v.size else 0.0
        scale = max(float(np.max(np.abs(r))) if r.size else 0.0, 1e-12)
        worst_abs, worst_rel = max(worst_abs, d), max(worst_rel, d / scale)
    moved = max(float(np.max(np.abs(rp[p] - w[p]))) for p in pp if p in w)
    print(f"losses pipeline {['%.6g' % x for x in pl]} reference {['%.6g' % x for x in rl]}")
    print(f"params {len(pp)} max_abs_diff {worst_abs:.3e} max_rel_diff {worst_rel:.3e} (largest update {moved:.3e})")
    ok = worst_rel <= a.tol
    if a.against:
        other = dict(np.load(a.against))
        w = 0.0
        for p, v in pp.items():
            if p not in other:
                raise SystemExit(f"{a.against}: no parameter {p}")
            d = float(np.max(np.abs(v.astype(np.float64) - other[p]))) if v.size else 0.0
            w = max(w, d / max(float(np.max(np.abs(v))) if v.size else 0.0, 1e-12))
        print(f"onnxruntime pipeline vs {a.against}: max_rel_diff {w:.3e}")
        ok = ok and w <= a.tol
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
