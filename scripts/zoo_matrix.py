#!/usr/bin/env python3
"""The zoo matrix (issue #16): every zoo model (scripts/zoo_manifest.json) through pipec.

Per model found in the zoo folder (scripts/export_zoo.py writes it):
  1. `pipec inspect NAME.onnx --json`
  2. `pipec grad NAME.onnx --inputs NAME.inputs.npz` (default loss mean-square, as the references)
     in float32, and twice more in float64: `--precision f64` (its own branches) and
     `--precision f64 --f32-branches` (along the float32 run's ReLU masks / pooling indices).
     Per tensor, relative to s = its largest |PyTorch f64 gradient| (at least 1e-6 of the model's
     largest gradient: a gradient that is zero analytically is float64 noise):
       f64_err = |pipec f64 - torch f64| / s      correctness: both exact, <= --f64-tol (1e-6);
                 here s is at least 1e-4 of the model's largest gradient (float64 noise of a
                 gradient that is zero analytically is ~1e-12 of it).  Known limit: the ONNX
                 file holds some constants in float32 (BatchNormalization epsilon, HardSigmoid
                 alpha), PyTorch's float64 run the exact ones; on MobileNetV3 that alone is
                 ~2e-6 (with exact constants pipec matches PyTorch to 2e-13).
       pipec_b = |pipec f32 - pipec f64 along pipec f32's branches| / s
       torch_b = |torch f32 - torch f64 along torch f32's branches| / s  (NAME.ref.npz grad64b/)
     and passes when pipec_b <= 2 * torch_b + floor (floor default 5e-7, ~4 float32 ulps of the
     tensor's scale).  The branch-matched pair measures float32 arithmetic alone: a value within
     float32 rounding of a ReLU / max-pool tie takes the other branch in float64 and moves one
     routed element, in PyTorch's float32 run as in pipec's, by luck of the summation order.
     Without grad64b in the reference (or with --no-f64) the plain pair is judged instead:
     |x f32 - torch f64| / s for both.  A gradient the reference has but pipec does not is a
     failure unless torch f64's is all zero.  The worst tensor (largest pipec / allowed) is printed.
  3. for every planner: `pipec compile NAME.onnx --cluster cpu --devices 4 --planner P --batch B
     --micro-batch b -o OUT`, then `pipec run OUT --steps 2 --check` (float32) and, when that
     fails its check, again with `--accuracy`: `rounding` when the pipeline is no farther from
     float64 training than the float32 single-device reference (ratio <= 1.01) or the same
     program run in float64 (`--precision f64`) matches its float64 reference to 1e-9 (float32
     rounding that a diverging step amplifies), else FAIL.
     When the check is INCONCLUSIVE (the single-device reference training itself diverged at
     sgd's default lr 0.01), it runs again for one step (shown as `1 step`; the update is then
     large next to the weights, so a wrong gradient still shows), and if that diverges too the
     model is compiled again at lr 1e-4, 1e-6, ... (shown as `lr`; a small lr makes the check
     weak, since the weights then barely move).
Every step has a timeout (a timed-out step is `timeout`); one step's failure does not stop the
next model.  Each step records status, seconds and the first line of its error.

Usage:
    python3 scripts/zoo_matrix.py [--zoo bench-data/zoo] [--pipec target/release/pipec]
        [--only NAME ...] [--planners gpp,dapple,...] [--skip-compile] [--dynamo]
        [--batch 8 --micro-batch 4 --devices 4] [--timeout-grad 600 ...]
        [--json results.json] [--md table.md]
Needs numpy only (no torch).  Exit status 0 (a measurement, not a gate) unless --strict.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZERO_SCALE = 1e-6
F64_ZERO_SCALE = 1e-4
PLANNERS = ["gpp", "dapple", "pipedream", "bapipe", "dp", "straight"]


def first_error_line(text):
    """The first line that reads like the error (pipec prints `error: ...` then causes)."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    for l in lines:
        if l.lower().startswith(("error", "thread '", "panicked")) or "panicked at" in l:
            return l[:400]
    return lines[-1][:400] if lines else ""


def error_causes(text):
    """All lines of pipec's error report (`error: X` and the `Caused by:` list), joined."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    out, on = [], False
    for l in lines:
        if l.lower().startswith("error"):
            on = True
        if on and not l.startswith("Caused by"):
            out.append(re.sub(r"^\d+:\s*", "", l))
    return " | ".join(out)[:600]


def sh(args, timeout):
    t0 = time.time()
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, f"timeout after {timeout} s", time.time() - t0


def step(status, secs, err="", **kw):
    d = OrderedDict(status=status, s=round(secs, 2))
    if err:
        d["error"] = err
    d.update(kw)
    return d


def _grads(path, prefix="grad/"):
    if not path or not os.path.exists(path):
        return None
    z = np.load(path)
    return {k[len(prefix):]: np.asarray(z[k], np.float64) for k in z.files if k.startswith(prefix)}


def compare_grads(out_npz, ref_npz, floor, out64_npz=None, out64b_npz=None, f64_tol=1e-6):
    """Per tensor, with s = the tensor's scale (its largest |torch f64| gradient, at least
    ZERO_SCALE of the model's largest):
      plain pair:   pipec_err = |pipec f32 - torch f64| / s,  torch_err = |torch f32 - torch f64| / s
      branch pair:  pipec_b = |pipec f32 - pipec f64 along pipec f32's branches| / s,
                    torch_b = |torch f32 - torch f64 along torch f32's branches| / s
      f64 check:    f64_err = |pipec f64 - torch f64| / s  (both exact: rounding of float64 and
                    of the graph's float32 constants only)
    A tensor passes when the judged pair (the branch pair where both sides have it, else the
    plain pair) has pipec <= 2 torch + floor and f64_err <= f64_tol."""
    o = np.load(out_npz)
    r = np.load(ref_npz)
    g64o, g64b = _grads(out64_npz), _grads(out64b_npz)
    keys = [k[7:] for k in r.files if k.startswith("grad64/")]
    branch = g64b is not None and all("grad64b/" + k in r.files for k in keys)
    scale_all = max([float(np.abs(r["grad64/" + k]).max()) if r["grad64/" + k].size else 0.0
                     for k in keys] + [0.0])
    rows, missing, failed, f64_bad = [], [], [], []
    f64_worst = 0.0
    for k in keys:
        g64 = np.asarray(r["grad64/" + k], np.float64)
        g32 = np.asarray(r["grad32/" + k], np.float64)
        # a tensor's scale: its largest |g64|, but at least ZERO_SCALE of the model's largest
        # gradient (a gradient that is zero analytically, e.g. an attention key bias under
        # softmax, is float64 noise; it is compared at the model's scale)
        s = float(np.abs(g64).max()) if g64.size else 0.0
        s = max(s, ZERO_SCALE * scale_all) or 1.0

        def e(x, ref, scale=s):
            if x is None or x.shape != ref.shape:
                return float("inf")
            return float(np.abs(x - ref).max()) / scale if ref.size else 0.0

        t_err = e(g32, g64)
        if "grad/" + k not in o.files:
            if np.any(g64 != 0):
                missing.append(k)
            continue
        gp = np.asarray(o["grad/" + k], np.float64)
        p_err = e(gp, g64)
        if branch:
            pj, tj = e(gp, g64b.get(k)), e(g32, np.asarray(r["grad64b/" + k], np.float64))
        else:
            pj, tj = p_err, t_err
        allowed = 2 * tj + floor
        bad = not np.isfinite(pj) or pj > allowed
        if g64o is not None:
            # float64 against float64: a gradient that is zero analytically (attention key
            # biases) is float64 noise of cancellations, ~1e-12 of the model's largest gradient,
            # so it is compared at F64_ZERO_SCALE of that instead.
            fe = e(g64o.get(k), g64, max(s, F64_ZERO_SCALE * scale_all))
            f64_worst = max(f64_worst, fe)
            if not fe <= f64_tol:
                f64_bad.append(k)
                bad = True
        if bad:
            failed.append(k)
        rows.append((k, p_err, t_err, pj, tj, pj / allowed))
    extra = [k[5:] for k in o.files if k.startswith("grad/") and "grad64/" + k[5:] not in r.files]
    loss_rel = abs(float(o["loss"]) - float(r["loss64"])) / max(abs(float(r["loss64"])), 1e-30)
    t_loss_rel = abs(float(r["loss32"]) - float(r["loss64"])) / max(abs(float(r["loss64"])), 1e-30)
    worst = max(rows, key=lambda x: x[5]) if rows else None
    return OrderedDict(
        tensors=len(rows), failed=len(failed) + len(missing), missing=missing[:10],
        n_missing=len(missing), extra_grads=len(extra), loss_rel_err=loss_rel, torch_loss_rel_err=t_loss_rel,
        judged="branch-matched" if branch else "plain",
        f64_err=(f64_worst if g64o is not None else None), f64_failed=f64_bad[:5], n_f64_failed=len(f64_bad),
        worst=(OrderedDict(tensor=worst[0], pipec_err=worst[1], torch_err=worst[2], pipec_judged=worst[3],
                           torch_judged=worst[4], err_over_allowed=worst[5]) if worst else None),
        first_failed=(failed[:5]))


def run_model(a, name, model_path, tag):
    res = OrderedDict(model=name, variant=tag, file=os.path.basename(model_path))
    p = a.pipec
    rc, out, err, s = sh([p, "inspect", model_path, "--json"], a.timeout_inspect)
    if rc == 0:
        try:
            j = json.loads(out)
            res["inspect"] = step("ok", s, nodes=j.get("nodes"), parameters=j.get("parameters"))
        except ValueError:
            res["inspect"] = step("FAIL", s, "inspect --json printed no JSON")
    else:
        res["inspect"] = step("timeout" if rc is None else "FAIL", s, first_error_line(err),
                              causes=error_causes(err))
    print(f"[{name}{tag}] inspect {res['inspect']['status']} {res['inspect'].get('error', '')}",
          file=sys.stderr, flush=True)

    inputs = os.path.join(a.zoo, name + ".inputs.npz")
    ref = os.path.join(a.zoo, name + ".ref.npz")
    tmp = tempfile.mkdtemp(prefix="zoo-")
    try:
        if os.path.exists(inputs) and os.path.exists(ref):
            g = os.path.join(tmp, "grad.npz")
            rc, out, err, s = sh([p, "grad", model_path, "--inputs", inputs, "-o", g], a.timeout_grad)
            g64 = g64b = None
            if rc == 0 and not a.no_f64:
                # the exact gradients: float64 on its own branches (vs PyTorch's float64) and
                # along float32's branch decisions (float32's arithmetic error alone)
                for extra, path in ((["--precision", "f64"], "grad64.npz"),
                                    (["--precision", "f64", "--f32-branches"], "grad64b.npz")):
                    q = os.path.join(tmp, path)
                    rc2, _, err2, s2 = sh([p, "grad", model_path, "--inputs", inputs, "-o", q] + extra,
                                          a.timeout_grad)
                    s += s2
                    if rc2 != 0:
                        rc, err = rc2, err2
                        break
                    if path == "grad64.npz":
                        g64 = q
                    else:
                        g64b = q
            if rc == 0:
                try:
                    c = compare_grads(g, ref, a.floor, g64, g64b, a.f64_tol)
                    st = "pass" if c["failed"] == 0 and c["tensors"] > 0 else "FAIL"
                    res["grad"] = step(st, s, "" if st == "pass" else
                                       f"{c['failed']} of {c['tensors'] + c['n_missing']} tensors over "
                                       f"2*torch_err+floor ({c['judged']})"
                                       + (f" ({c['n_missing']} missing)" if c["n_missing"] else "")
                                       + (f" ({c['n_f64_failed']} off PyTorch in float64)"
                                          if c["n_f64_failed"] else ""), **c)
                except Exception as e:  # noqa: BLE001 (a measurement: record and go on)
                    res["grad"] = step("FAIL", s, f"comparison: {type(e).__name__}: {e}")
            else:
                res["grad"] = step("timeout" if rc is None else "FAIL", s, first_error_line(err),
                                   causes=error_causes(err))
        else:
            res["grad"] = step("skipped", 0, "no NAME.inputs.npz / NAME.ref.npz")
        w = res["grad"].get("worst")
        print(f"[{name}{tag}] grad {res['grad']['status']} {res['grad'].get('error', '')}"
              + (f" worst {w['tensor']}: pipec {w['pipec_judged']:.2e} torch {w['torch_judged']:.2e}"
               f" ({res['grad'].get('judged')}; f64 vs torch {res['grad'].get('f64_err')})" if w else ""),
              file=sys.stderr, flush=True)

        res["planners"] = OrderedDict()
        if a.skip_compile:
            return res
        for planner in a.planners:
            od = os.path.join(tmp, planner)
            c = OrderedDict()
            comp = [p, "compile", model_path, "--cluster", "cpu", "--devices", str(a.devices), "--planner",
                    planner, "--batch", str(a.batch), "--micro-batch", str(a.micro_batch), "-o", od]
            rc, out, err, s = sh(comp, a.timeout_compile)
            if rc != 0:
                c["compile"] = step("timeout" if rc is None else "FAIL", s, first_error_line(err),
                                    causes=error_causes(err))
            else:
                shape = ""
                try:
                    prog = json.load(open(os.path.join(od, "schedule.json")))
                    shape = ":".join(str(len(x["devices"])) for x in prog["stages"])
                except (OSError, ValueError, KeyError, TypeError):
                    pass
                c["compile"] = step("ok", s, replicas_per_stage=shape)
                if not a.skip_run:
                    rc, out, err, s = sh([p, "run", od, "--steps", str(a.steps), "--check"], a.timeout_run)
                    # The single-device reference itself diverged (random weights and a
                    # mean-square loss of unnormalised logits can take sgd's default lr 0.01 to
                    # inf in two steps): the check cannot judge the program at that lr, so compile
                    # again with 100x smaller ones (recorded as `lr`).
                    # First one step at the same lr: the update is then large next to the weights,
                    # so the check still sees a wrong gradient (a tiny lr would hide it).
                    steps = a.steps
                    if rc == 1 and "check INCONCLUSIVE" in out and steps > 1:
                        steps = 1
                        rc, out, err, s2 = sh([p, "run", od, "--steps", "1", "--check"], a.timeout_run)
                        s += s2
                        c["compile"]["steps"] = 1
                    lr = 0.01
                    while rc == 1 and "check INCONCLUSIVE" in out and lr > 1e-7:
                        lr /= 100
                        shutil.rmtree(od, ignore_errors=True)
                        rc, out, err, s2 = sh(comp + ["--optimizer", f"sgd:lr={lr:g}"], a.timeout_compile)
                        s += s2
                        if rc == 0:
                            rc, out, err, s2 = sh([p, "run", od, "--steps", str(steps), "--check"],
                                                  a.timeout_run)
                            s += s2
                            c["compile"]["lr"] = lr
                    m = re.search(r"max_rel_diff[ =:]*([0-9.eE+-]+|inf|NaN)", out + err)
                    rel = float(m.group(1)) if m else None
                    if rc == 0:
                        c["run"] = step("pass", s, max_rel_diff=rel)
                    elif rc == 1 and rel is not None:
                        rc2, out2, err2, s2 = sh([p, "run", od, "--steps", str(steps), "--check",
                                                  "--accuracy"], a.timeout_run)
                        m2 = re.search(r"pipeline ([0-9.eE+-]+), reference ([0-9.eE+-]+) \(ratio "
                                       r"([0-9.eE+-]+|inf|NaN)\)", out2 + err2)
                        if m2:
                            ratio = float(m2.group(3))
                            f64_ok = None
                            if ratio > 1.01:
                                # Farther from float64 training than one device: is it float32
                                # rounding that the training amplifies (the same program in
                                # float64 matches its float64 reference) or a wrong program?
                                rc3, out3, _, s3 = sh([p, "run", od, "--steps", str(steps), "--check",
                                                       "--precision", "f64"], a.timeout_run)
                                s2 += s3
                                m3 = re.search(r"max_rel_diff[ =:]*([0-9.eE+-]+|inf|NaN)", out3)
                                f64_ok = rc3 == 0 and m3 is not None and float(m3.group(1)) <= 1e-9
                            good = ratio <= 1.01 or f64_ok
                            c["run"] = step("rounding" if good else "FAIL", s + s2,
                                            "" if good else
                                            f"max_rel_diff {rel:.2e}; vs f64 training: pipeline "
                                            f"{m2.group(1)}, reference {m2.group(2)} (ratio {ratio:.3f}); "
                                            f"float64 run also off",
                                            max_rel_diff=rel, accuracy_ratio=ratio, f64_exact=f64_ok)
                        else:
                            c["run"] = step("FAIL", s + s2, f"max_rel_diff {rel:.2e}; --accuracy: "
                                            + first_error_line(err2 or out2), max_rel_diff=rel)
                    else:
                        c["run"] = step("timeout" if rc is None else "FAIL", s, first_error_line(err),
                                        causes=error_causes(err))
            shutil.rmtree(od, ignore_errors=True)
            res["planners"][planner] = c
            cs = c["compile"]["status"]
            rs = c.get("run", {}).get("status", "-")
            e = c.get("run", {}).get("error") or c["compile"].get("error", "")
            print(f"[{name}{tag}] {planner}: compile {cs} run {rs} {e}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def cell(d):
    if not d:
        return "-"
    st = d["status"]
    return f"{st} {d['s']:.0f}s" if st in ("ok", "pass", "rounding") else st


def planner_cell(c):
    comp = c["compile"]
    if comp["status"] != "ok":
        return "compile " + comp["status"]
    r = c.get("run")
    if not r:
        return "compiled"
    lr = f", lr {comp['lr']:g}" if comp.get("lr") else ""
    lr += ", 1 step" if comp.get("steps") == 1 else ""
    return f"{r['status']} ({comp.get('replicas_per_stage', '')}{lr})"


def grad_cell(g):
    if g["status"] in ("pass", "FAIL") and g.get("worst"):
        w = g["worst"]
        tag = "pass" if g["status"] == "pass" else f"FAIL {g['failed']}/{g['tensors'] + g.get('n_missing', 0)}"
        f64 = g.get("f64_err")
        return (f"{tag}: {w.get('pipec_judged', w['pipec_err']):.1e} vs {w.get('torch_judged', w['torch_err']):.1e}"
                + (f"{'' if g.get('judged') == 'branch-matched' else ' (plain)'}; f64 {f64:.0e}"
                   if f64 is not None else ""))
    return g["status"]


def normalise(msg):
    """An error message with the model-specific bits (names, numbers, shapes) taken out, so
    that the same cause in different models groups together."""
    m = re.sub(r"'[^']*'", "'…'", msg)
    m = re.sub(r"`[^`]*`", "`…`", m)
    m = re.sub(r"\"[^\"]*\"", "\"…\"", m)
    m = re.sub(r"\[[0-9, ?a-z_]*\]", "[…]", m)
    m = re.sub(r"\b\d+(\.\d+)?(e[-+]?\d+)?\b", "N", m)
    m = re.sub(r"/[^\s:]+", "PATH", m)
    return m[:300]


def failure_classes(results):
    groups = OrderedDict()
    for r in results:
        steps = [("inspect", r.get("inspect")), ("grad", r.get("grad"))]
        for pl, c in (r.get("planners") or {}).items():
            steps.append(("compile", c.get("compile")))
            steps.append(("run", c.get("run")))
        seen = set()
        for kind, d in steps:
            if not d or d["status"] in ("ok", "pass", "rounding", "skipped"):
                continue
            msg = d.get("causes") or d.get("error", "")
            if kind == "grad" and d.get("worst") is not None:  # ran, but off the reference
                w = d["worst"]["err_over_allowed"]
                msg = ("gradients missing (names not among the initializers)" if d.get("n_missing") else
                       "float64 gradients off PyTorch's float64 ones" if d.get("n_f64_failed") else
                       "gradient error 1-10x over 2*torch_err+floor" if w <= 10 else
                       "gradient error > 10x over 2*torch_err+floor")
            key = (kind, d["status"], normalise(msg))
            g = groups.setdefault(key, OrderedDict(step=kind, status=d["status"], message=msg, models=[],
                                                   count=0))
            g["count"] += 1
            if (key, r["model"]) not in seen:
                seen.add((key, r["model"]))
                g["models"].append(r["model"] + r["variant"])
    return sorted(groups.values(), key=lambda g: (-len(g["models"]), g["step"]))


def markdown(results, planners, manifest):
    fam = {m["name"]: m.get("family", "") for m in manifest}
    head = ["model", "family", "nodes", "params", "inspect", "grad: worst tensor pipec vs torch f32 err; pipec f64 vs torch f64"] + planners
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        ins = r["inspect"]
        row = [r["model"] + r["variant"], fam.get(r["model"], ""), str(ins.get("nodes", "-")),
               str(ins.get("parameters", "-")), cell(ins), grad_cell(r["grad"])]
        for p in planners:
            c = (r.get("planners") or {}).get(p)
            row.append(planner_cell(c) if c else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zoo", default=os.path.join(ROOT, "bench-data", "zoo"))
    ap.add_argument("--manifest", default=os.path.join(ROOT, "scripts", "zoo_manifest.json"))
    ap.add_argument("--pipec", default=os.path.join(ROOT, "target", "release", "pipec"))
    ap.add_argument("--only", action="append", help="this model only (repeatable)")
    ap.add_argument("--planners", default=",".join(PLANNERS), help="comma-separated")
    ap.add_argument("--devices", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--floor", type=float, default=5e-7)
    ap.add_argument("--f64-tol", type=float, default=1e-6,
                    help="largest |pipec f64 - torch f64| / scale per tensor (default 1e-6)")
    ap.add_argument("--no-f64", action="store_true",
                    help="skip the two float64 grad runs (judge the plain pair, no float64 check)")
    ap.add_argument("--dynamo", action="store_true", help="also NAME.dynamo.onnx (inspect + grad only)")
    ap.add_argument("--skip-compile", action="store_true", help="inspect + grad only")
    ap.add_argument("--skip-run", action="store_true", help="compile but do not run")
    ap.add_argument("--timeout-inspect", type=float, default=120)
    ap.add_argument("--timeout-grad", type=float, default=600)
    ap.add_argument("--timeout-compile", type=float, default=300)
    ap.add_argument("--timeout-run", type=float, default=600)
    ap.add_argument("--jobs", type=int, default=1, help="models in parallel (default 1)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--md", default=None, help="write the Markdown table (and failure classes) here")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any step is not ok/pass/rounding")
    a = ap.parse_args()
    a.planners = [x for x in a.planners.split(",") if x]
    if not os.path.exists(a.pipec):
        sys.exit(f"--pipec {a.pipec}: no such file (cargo build --release --bin pipec)")
    manifest = json.load(open(a.manifest))["models"]
    names = [m["name"] for m in manifest]
    if a.only:
        unknown = [n for n in a.only if n not in names]
        if unknown:
            sys.exit(f"--only {unknown[0]}: not in {a.manifest}")
        names = [n for n in names if n in a.only]
    todo = []
    for n in names:
        f = os.path.join(a.zoo, n + ".onnx")
        if os.path.exists(f):
            todo.append((n, f, ""))
        else:
            print(f"[{n}] not in {a.zoo}, skipped", file=sys.stderr)
        fd = os.path.join(a.zoo, n + ".dynamo.onnx")
        if a.dynamo and os.path.exists(fd):
            todo.append((n, fd, ".dynamo"))

    def one(t):
        n, f, tag = t
        if tag:
            b = argparse.Namespace(**vars(a))
            b.skip_compile = True
            return run_model(b, n, f, tag)
        return run_model(a, n, f, tag)

    t0 = time.time()
    if a.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(a.jobs) as ex:
            results = list(ex.map(one, todo))
    else:
        results = [one(t) for t in todo]
    classes = failure_classes(results)
    out = OrderedDict(pipec=a.pipec, devices=a.devices, batch=a.batch, micro_batch=a.micro_batch,
                      steps=a.steps, floor=a.floor, planners=a.planners, wall_s=round(time.time() - t0, 1),
                      results=results, failure_classes=classes)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    md = markdown(results, a.planners if not a.skip_compile else [], manifest)
    md += "\nFailure classes (step, status, first message; models):\n\n"
    for g in classes:
        md += f"- {g['step']} {g['status']} x{len(g['models'])}: {g['message'][:240]} ({', '.join(g['models'])})\n"
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    print(md)
    bad = any(d["status"] not in ("ok", "pass", "rounding", "skipped")
              for r in results for d in [r["inspect"], r["grad"]] +
              [x for c in (r.get("planners") or {}).values() for x in c.values()])
    sys.exit(1 if a.strict and bad else 0)


if __name__ == "__main__":
    main()
