#!/usr/bin/env python3
"""Byte-identity check for refactors that must not change behaviour (issue: architecture).

Runs one pipec binary over every bundled model (onnx-models/*.onnx) x planner x configuration
and records a SHA-256 of everything it writes: every file of `compile -o OUTDIR` (plan.json,
schedule.json, program.mlir, weights.npz, every piece), every `--dump-ir` snapshot, the stdout of
`plan --json` (less the measured `search_time_s`) and of `simulate OUTDIR --json`, and the
stdout/stderr/exit code of a few commands that must fail. Compare two binaries' manifests:

    python3 scripts/identity_check.py --pipec OLD/pipec --out old.json
    python3 scripts/identity_check.py --pipec target/release/pipec --out new.json --compare old.json

`--compare` prints every case and file whose hash differs (or that exists in only one) and exits
1 if there is any. `--quick` keeps 3 models and 2 planners.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANNERS = ["gpp", "dapple", "pipedream", "bapipe", "straight", "dp"]
# (name, compile/plan flags): one fixed micro-batch on the cpu preset (the README job's shape),
# one planner-chosen micro-batch on a GPU preset.
CONFIGS = [
    ("cpu4", ["--cluster", "cpu", "--devices", "4", "--batch", "8", "--micro-batch", "2",
              "--optimizer", "adam:lr=0.001"]),
    ("dgx8", ["--cluster", "dgx-h100", "--devices", "8", "--batch", "32"]),
]
# Commands that must fail with exit 2 and a stable message.
FAILURES = [
    ["compile", "onnx-models/mlp4.onnx", "--cluster", "cpu", "--devices", "4", "--planner", "gpp",
     "--batch", "8", "--micro-batch", "3", "-o", "{tmp}/bad"],
    ["plan", "onnx-models/mlp4.onnx", "--cluster", "nowhere", "--planner", "gpp"],
    ["simulate", "{tmp}/missing"],
    ["run", "{tmp}/missing"],
]


def sha(data):
    return hashlib.sha256(data).hexdigest()


def tree_hashes(d):
    out = {}
    for base, _, files in os.walk(d):
        for f in sorted(files):
            p = os.path.join(base, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = sha(fh.read())
    return out


def run(cmd):
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=600)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipec", default=os.path.join(ROOT, "target/release/pipec"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    pipec = os.path.abspath(a.pipec)
    models = sorted(f for f in os.listdir(os.path.join(ROOT, "onnx-models")) if f.endswith(".onnx"))
    planners = PLANNERS
    if a.quick:
        models = [m for m in models if m in ("mlp4.onnx", "gpt2_tiny.onnx", "inception_mini.onnx")]
        planners = ["gpp", "dapple"]
    manifest = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            for cname, flags in CONFIGS:
                for planner in planners:
                    case = f"{model}/{cname}/{planner}"
                    path = f"onnx-models/{model}"
                    out, dump = os.path.join(tmp, "out"), os.path.join(tmp, "dump")
                    for d in (out, dump):
                        subprocess.run(["rm", "-rf", d])
                    entry = {}
                    r = run([pipec, "plan", path, "--planner", planner, "--json"] + flags)
                    if r.returncode == 0:
                        plan = json.loads(r.stdout)
                        plan.pop("search_time_s", None)
                        entry["plan --json"] = sha(json.dumps(plan, sort_keys=True).encode())
                    else:
                        entry["plan (failed)"] = sha(r.stderr)
                    r = run([pipec, "compile", path, "--planner", planner, "--dump-ir", dump,
                             "-o", out] + flags)
                    entry["compile stdout"] = sha(r.stdout.replace(tmp.encode(), b"TMP"))
                    entry["compile exit"] = str(r.returncode)
                    if r.returncode == 0:
                        for k, v in tree_hashes(out).items():
                            entry[f"OUTDIR/{k}"] = v
                        for k, v in tree_hashes(dump).items():
                            entry[f"dump-ir/{k}"] = v
                        s = run([pipec, "simulate", out, "--json"])
                        entry["simulate --json"] = sha(s.stdout) if s.returncode == 0 else "exit " + str(s.returncode)
                    else:
                        entry["compile stderr"] = sha(r.stderr.replace(tmp.encode(), b"TMP"))
                    manifest[case] = entry
                    print(f"{case}: {len(entry)} hashes", file=sys.stderr)
        for i, f in enumerate(FAILURES):
            cmd = [pipec] + [x.replace("{tmp}", tmp) for x in f]
            r = run(cmd)
            manifest[f"failure {i}: {' '.join(f)}"] = {
                "exit": str(r.returncode),
                "stderr": sha(r.stderr.replace(tmp.encode(), b"TMP")),
            }
    with open(a.out, "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    if not a.compare:
        return 0
    with open(a.compare) as fh:
        base = json.load(fh)
    diffs = 0
    for case in sorted(set(base) | set(manifest)):
        b, n = base.get(case, {}), manifest.get(case, {})
        for k in sorted(set(b) | set(n)):
            if b.get(k) != n.get(k):
                diffs += 1
                print(f"DIFF {case} {k}: {b.get(k, 'absent')[:12]} -> {n.get(k, 'absent')[:12]}")
    files = sum(len(v) for v in manifest.values())
    print(f"{len(manifest)} cases, {files} hashes, {diffs} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
