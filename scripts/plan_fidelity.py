#!/usr/bin/env python3
"""Plan fidelity: does a plan's `iteration_time_s` (and peak memory) match the replay of the
program `pipec compile` emits for it (`pipec simulate`, the same cost model)?

For every model x planner x cluster preset x device count: `pipec plan --json` (the planner's
own micro-batch), `pipec compile` (which takes the planner's micro-batch; a compile that plans
differently is an error row), `pipec simulate --json`, and the ratios
replay / plan of the iteration time and of the largest per-device peak memory. Prints one line
per case, a summary (worst ratios per planner) and, with --md, a markdown table.

usage: python3 scripts/plan_fidelity.py [--pipec target/release/pipec] [--models a,b]
           [--planners gpp,dapple,...] [--clusters summit,dapple-a,...] [--devices 4,8,16,32]
           [--batch 64] [--schedule S [--vertical-sync]] [--jobs 2] [--json out.json] [--md out.md]
Models are names in onnx-models/ or paths. A case the planner or the compiler refuses (a model
too small for the devices, out of memory) is listed with its first error line, not counted.
"""
import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(cmd, timeout):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    if r.returncode != 0:
        lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
        return None, (lines[0] if lines else f"exit {r.returncode}")
    return r.stdout, None


def case(a, model, planner, cluster, devices):
    path = model if model.endswith(".onnx") else os.path.join(ROOT, "onnx-models", model + ".onnx")
    base = ["--cluster", cluster, "--devices", str(devices), "--planner", planner,
            "--batch", str(a.batch)]
    if a.schedule:
        base += ["--schedule", a.schedule]
    out = {"model": os.path.basename(path)[:-5], "planner": planner, "cluster": cluster,
           "devices": devices}
    so, err = run([a.pipec, "plan", path, *base, "--json"], a.timeout)
    if err:
        out["error"] = "plan: " + err
        return out
    plan = json.loads(so)
    with tempfile.TemporaryDirectory() as od:
        # `compile` without --micro-batch takes the planner's: the program of this very plan.
        # (With `--micro-batch MB` it would plan again at MB, and DAPPLE's search at a fixed
        # micro-batch can return another plan than its free search at that size.)
        extra = ["--vertical-sync"] if a.vertical_sync else []
        _, err = run([a.pipec, "compile", path, *base, *extra, "-o", od], a.timeout)
        if err:
            out["error"] = "compile: " + err
            return out
        with open(os.path.join(od, "plan.json")) as f:
            compiled = json.load(f)
        if a.vertical_sync:
            # The same stages, simulated with vertical sync's stashes: compare against those.
            layout = lambda p: [(s["nodes"], s["devices"]) for s in p["stages"]]
            if compiled["micro_batch"] != plan["micro_batch"] or layout(compiled) != layout(plan):
                out["error"] = "compile: planned other stages than `plan` did"
                return out
            plan = compiled
        elif (compiled["micro_batch"] != plan["micro_batch"]
                or abs(compiled["iteration_time_s"] / plan["iteration_time_s"] - 1) > 1e-9):
            out["error"] = (f"compile: planned another plan ({compiled['iteration_time_s']} s, "
                            f"micro-batch {compiled['micro_batch']}) than `plan` did")
            return out
        so, err = run([a.pipec, "simulate", od, "--json"], a.timeout)
        if err:
            out["error"] = "simulate: " + err
            return out
    rep = json.loads(so)
    mem = max((d.get("peak_memory_bytes", 0) for d in rep.get("devices", [])), default=0)
    out.update(
        micro_batch=plan["micro_batch"],
        stages="/".join(str(s["replicas"]) for s in plan["stages"]),
        plan_s=plan["iteration_time_s"],
        replay_s=rep["iteration_time_s"],
        time_ratio=rep["iteration_time_s"] / plan["iteration_time_s"],
        plan_mem=plan["peak_memory_bytes"],
        replay_mem=mem,
        mem_ratio=(mem / plan["peak_memory_bytes"]) if plan["peak_memory_bytes"] else None,
    )
    return out


def gpp_vs_others(ok, tolerance=0.005):
    """GraphPipe never loses (issue #17): per (model, cluster, devices), gpp's plan time and
    replayed time against the best of the other planners' (each planner's own micro-batch)."""
    groups = {}
    for r in ok:
        groups.setdefault((r["model"], r["cluster"], r["devices"]), {})[r["planner"]] = r
    out = {"cases": 0}
    for k in ("plan", "replay"):
        out[k] = {"lost": 0, "worst": 0.0, "worst_case": "", "losses": []}
    for (m, c, d), by in sorted(groups.items()):
        others = [r for p, r in by.items() if p != "gpp"]
        if "gpp" not in by or not others:
            continue
        out["cases"] += 1
        for k in ("plan", "replay"):
            best = min(others, key=lambda r: r[k + "_s"])
            ratio = by["gpp"][k + "_s"] / best[k + "_s"]
            w = out[k]
            if ratio > 1 + tolerance:
                w["lost"] += 1
                w["losses"].append(f"{m} {c} {d}: x{ratio:.3f} vs {best['planner']}")
            if ratio > w["worst"]:
                w["worst"], w["worst_case"] = ratio, f"{m} {c} {d} vs {best['planner']}"
    if out["cases"]:
        for k in ("plan", "replay"):
            w = out[k]
            print(f"gpp vs best other ({k}): slower by > {tolerance:.1%} in {w['lost']}/{out['cases']};"
                  f" worst x{w['worst']:.3f} ({w['worst_case']})")
            for line in w["losses"]:
                print("   " + line)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "target", "release", "pipec"))
    ap.add_argument("--models", default="resnet18,inception_mini,mmt_tiny,gpt2_tiny,dlrm_tiny")
    ap.add_argument("--planners", default="gpp,dapple,bapipe,pipedream")
    ap.add_argument("--clusters", default="summit,dapple-a,dgx-h100,bapipe-hetero,cpu")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--schedule", help="--schedule for every plan (default: each planner's own)")
    ap.add_argument("--vertical-sync", action="store_true",
                    help="compile with --vertical-sync (with --schedule pipedream-async); the "
                         "compiled plan.json, the same stages simulated with its stashes, is the plan")
    ap.add_argument("--tolerance", type=float, default=0.05, help="agreement band (default 5%%)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    a = ap.parse_args()
    cases = [(m, p, c, int(d)) for m in a.models.split(",") for c in a.clusters.split(",")
             for d in a.devices.split(",") for p in a.planners.split(",")]
    rows = []
    with cf.ThreadPoolExecutor(a.jobs) as ex:
        futs = [ex.submit(case, a, *c) for c in cases]
        for f in futs:
            r = f.result()
            rows.append(r)
            tag = f"{r['model']:16s} {r['planner']:10s} {r['cluster']:14s} {r['devices']:3d}"
            if "error" in r:
                print(f"{tag} -- {r['error'][:100]}", flush=True)
            else:
                print(f"{tag} mb={r['micro_batch']:<4d} {r['stages']:<16s} time x{r['time_ratio']:.3f}"
                      f" mem x{(r['mem_ratio'] or 0):.3f}", flush=True)
    ok = [r for r in rows if "error" not in r]
    print(f"\n{len(ok)} of {len(rows)} cases compiled; agreement band {a.tolerance:.0%}")
    summary = {}
    for p in a.planners.split(","):
        rs = [r for r in ok if r["planner"] == p]
        if not rs:
            continue
        inside = sum(1 for r in rs if abs(r["time_ratio"] - 1) <= a.tolerance)
        lo = min(rs, key=lambda r: r["time_ratio"])
        hi = max(rs, key=lambda r: r["time_ratio"])
        summary[p] = dict(cases=len(rs), within=inside, min=lo["time_ratio"], max=hi["time_ratio"],
                          min_case=f"{lo['model']} {lo['cluster']} {lo['devices']}",
                          max_case=f"{hi['model']} {hi['cluster']} {hi['devices']}")
        print(f"{p:10s} {inside}/{len(rs)} within; replay/plan {lo['time_ratio']:.3f} ({summary[p]['min_case']})"
              f" .. {hi['time_ratio']:.3f} ({summary[p]['max_case']})")
    losses = gpp_vs_others(ok)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "summary": summary, "gpp_vs_others": losses}, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write("| planner | cases | within ±%d%% | replay/plan min (case) | max (case) |\n|---|---|---|---|---|\n"
                    % round(a.tolerance * 100))
            for p, s in summary.items():
                f.write(f"| {p} | {s['cases']} | {s['within']} | {s['min']:.3f} ({s['min_case']}) | "
                        f"{s['max']:.3f} ({s['max_case']}) |\n")
            if losses["cases"]:
                f.write("\n| GPP vs the best other planner | cases | GPP slower by > 0.5% | worst gpp/best (case) |\n"
                        "|---|---|---|---|\n")
                for k in ("plan", "replay"):
                    w = losses[k]
                    f.write(f"| {k} | {losses['cases']} | {w['lost']} | {w['worst']:.3f} ({w['worst_case']}) |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
