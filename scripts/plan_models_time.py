#!/usr/bin/env python3
"""Every planner on every given model at one cluster size (issue "search at scale": every planner
at most 1 s and 500 MB at 32 devices on any bundled or exported model up to 3k nodes).

Every run is `pipec plan MODEL --cluster C --devices D --batch B --planner P --json` under
/usr/bin/time (peak RSS), --repeat times in a row; a cell shows the MEDIAN of the runs' search
time (`search_time_s` of plan.json), the median wall time of the whole process (loading the model
and building the cost graph included) and the largest peak RSS. Models with more than
--max-nodes ONNX nodes are listed apart (the target does not cover them). Cells past --limit-s
(wall) or --limit-mb, or past --timeout, are marked with `!`; the exit code is 1 if any is. A
model pipec refuses (e.g. a symbolic dim other than the batch) shows `error` in every cell and
its message on stderr.

The machine's load moves single runs; the median of 3-5 runs, on a machine doing nothing else,
is the figure to quote (with the machine and the command).

Usage: python3 scripts/plan_models_time.py --models 'ZOO/*.onnx' [--pipec target/release/pipec]
       [--cluster summit] [--devices 32] [--batch 32] [--planners gpp,dapple,...] [--repeat 3]
       [--max-nodes 3000] [--limit-s 1.0] [--limit-mb 500] [--json FILE]
"""
import argparse
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_scale import run_timed  # noqa: E402 - the scripts folder is not a package

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANNERS = ["gpp", "dapple", "pipedream", "bapipe", "straight", "dp"]


def onnx_nodes(path):
    try:
        import onnx
        return len(onnx.load(path, load_external_data=False).graph.node)
    except Exception:  # noqa: BLE001 - the count decides only which table a model goes to
        return None


def run_once(a, model, planner):
    cmd = [a.pipec, "plan", model, "--cluster", a.cluster, "--devices", str(a.devices),
           "--batch", str(a.batch), "--planner", planner, "--json"]
    got = run_timed(cmd, a.timeout)
    if got is None:
        return {"status": "timeout", "wall_s": a.timeout}
    r, wall, mb = got
    out = {"wall_s": wall, "peak_mb": mb}
    if r.returncode != 0:
        err = [line.strip() for line in r.stderr.splitlines() if line.strip()]
        out.update(status="error", error=(err[-1] if err else f"exit {r.returncode}")[:200])
        return out
    p = json.loads(r.stdout)
    out.update(status="ok", search_s=p["search_time_s"], capped=bool(p.get("search_capped")))
    return out


def measure(a, model, planner):
    runs = [run_once(a, model, planner) for _ in range(a.repeat)]
    ok = [r for r in runs if r["status"] == "ok"]
    if len(ok) < len(runs):
        bad = next(r for r in runs if r["status"] != "ok")
        return {"status": bad["status"], "error": bad.get("error", "")}
    return {
        "status": "ok",
        "search_s": statistics.median(r["search_s"] for r in ok),
        "wall_s": statistics.median(r["wall_s"] for r in ok),
        "peak_mb": max((r["peak_mb"] or 0) for r in ok),
        "capped": any(r["capped"] for r in ok),
        "runs_wall_s": [round(r["wall_s"], 4) for r in ok],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipec", default=os.path.join(ROOT, "target", "release", "pipec"))
    ap.add_argument("--models", required=True, help="a glob or a comma-separated list of .onnx")
    ap.add_argument("--cluster", default="summit")
    ap.add_argument("--devices", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-nodes", type=int, default=3000)
    ap.add_argument("--limit-s", type=float, default=1.0)
    ap.add_argument("--limit-mb", type=float, default=500.0)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args()
    if not os.path.exists(a.pipec):
        sys.exit(f"--pipec {a.pipec}: no such file (cargo build --release --bin pipec)")
    if a.repeat < 1:
        sys.exit("--repeat: at least 1")
    paths = []
    for part in a.models.split(","):
        hits = sorted(glob.glob(part)) if any(ch in part for ch in "*?[") else [part]
        paths += [p for p in hits if p.endswith(".onnx")]
    if not paths:
        sys.exit(f"--models {a.models}: no .onnx file")
    for p in paths:
        if not os.path.exists(p):
            sys.exit(f"--models: {p}: no such file")
    planners = [x for x in a.planners.split(",") if x]
    rows = []
    for path in paths:
        nodes = onnx_nodes(path)
        for planner in planners:
            r = measure(a, path, planner)
            r.update(model=os.path.basename(path), nodes=nodes, planner=planner)
            rows.append(r)
            shown = (f"search {r['search_s']:.3f} s, wall {r['wall_s']:.3f} s, "
                     f"{r['peak_mb']:.0f} MB" if r["status"] == "ok" else r.get("error", ""))
            print(f"{r['model']:<28} {planner:<10} {shown}", file=sys.stderr, flush=True)

    def over(r):
        return r["status"] == "timeout" or (
            r["status"] == "ok" and (r["wall_s"] > a.limit_s or r["peak_mb"] > a.limit_mb))

    def cell(r):
        if r["status"] != "ok":
            return "timeout!" if over(r) else "error"
        mark = "!" if over(r) else ""
        cap = " c" if r["capped"] else ""
        return f"{r['search_s']:.2f} / {r['wall_s']:.2f} s, {r['peak_mb']:.0f} MB{cap}{mark}"

    print(f"`pipec plan --cluster {a.cluster} --devices {a.devices} --batch {a.batch}`: median "
          f"of {a.repeat} runs, search / wall seconds, largest peak RSS; `c`: the search was "
          f"capped (plan.json `search_capped`); `!`: over {a.limit_s} s or {a.limit_mb:.0f} MB; "
          f"`error`: pipec refused the model (its message on stderr)\n")
    failed = False
    for title, keep in ((f"up to {a.max_nodes} nodes", lambda n: n is None or n <= a.max_nodes),
                        (f"over {a.max_nodes} nodes (outside the target)",
                         lambda n: n is not None and n > a.max_nodes)):
        models = [m for m in dict.fromkeys(r["model"] for r in rows)
                  if keep(next(r["nodes"] for r in rows if r["model"] == m))]
        if not models:
            continue
        print(f"Models {title}:\n")
        print("| model | nodes | " + " | ".join(planners) + " |")
        print("|---|---|" + "---|" * len(planners))
        for m in models:
            mine = {r["planner"]: r for r in rows if r["model"] == m}
            print(f"| {m.removesuffix('.onnx')} | {mine[planners[0]]['nodes']} | "
                  + " | ".join(cell(mine[p]) for p in planners) + " |")
        print()
        if title.startswith("up to"):
            failed = any(over(r) for r in rows if r["model"] in models)
            worst = []
            for p in planners:
                ok = [r for r in rows if r["planner"] == p and r["model"] in models
                      and r["status"] == "ok"]
                if ok:
                    w = max(ok, key=lambda r: r["wall_s"])
                    mm = max(ok, key=lambda r: r["peak_mb"])
                    worst.append(f"{p} {w['wall_s']:.2f} s ({w['model'].removesuffix('.onnx')}), "
                                 f"{mm['peak_mb']:.0f} MB")
            print("Slowest wall and largest memory per planner: " + "; ".join(worst) + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
