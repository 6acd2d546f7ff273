#!/usr/bin/env bash
# Step time of a training step on the CPU: pipec's reference interpreter vs `--executor ort`
# (ONNX Runtime) vs PyTorch training the same model (scripts/torch_step.py), on one core and on
# two (issue #19, BENCHMARKS.md "Executors on the CPU").
#
# Usage: scripts/bench_executors.sh [MODELS]   (default "gpt2_tiny resnet18")
# Env: PIPEC (default target/release/pipec), TORCH_PY (a python with torch, torchvision,
#      transformers, onnx and onnxruntime; default python3), BATCH=8, MB=2, STEPS=6, ROUNDS=3.
#
# One core: `taskset -c 0`, a 1-device program (pipec) / torch.set_num_threads(1).
# Two cores: `taskset -c 0,1`, a 2-stage straight pipeline (one worker per core) / 2 threads.
# Every figure is a steady-state step (pipec: its "steady state" line; torch: the median step
# after warm-up); each round runs every configuration once in turn, and the table gives the
# median over ROUNDS, so the machine's drift hits all of them alike.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPEC=${PIPEC:-target/release/pipec}
PY=${TORCH_PY:-python3}
BATCH=${BATCH:-8}
MB=${MB:-2}
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-3}
MODELS=${1:-gpt2_tiny resnet18}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
steady() { sed -n 's/^steady state: \([0-9.e-]*\) s\/step.*/\1/p' | tail -1; }
for m in $MODELS; do
  for d in 1 2; do
    "$PIPEC" compile "onnx-models/$m.onnx" --cluster "$d@1e10" --device-kind cpu-core \
      --planner straight --batch "$BATCH" --micro-batch "$MB" \
      --optimizer sgd:lr=0.01,momentum=0.9 -o "$T/$m.$d" > /dev/null
  done
done
for r in $(seq "$ROUNDS"); do
  for m in $MODELS; do
    for d in 1 2; do
      cores=$([ "$d" = 1 ] && echo 0 || echo 0,1)
      for ex in reference ort; do
        taskset -c "$cores" "$PIPEC" run "$T/$m.$d" --executor "$ex" --steps "$STEPS" \
          | steady >> "$T/$m.$d.$ex"
      done
      taskset -c "$cores" "$PY" scripts/torch_step.py "$m" --batch "$BATCH" --steps "$STEPS" \
        --threads "$d" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['median_step_s'])" \
        >> "$T/$m.$d.torch"
    done
  done
  echo "round $r done" >&2
done
med() { sort -g "$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| model | cores | reference s/step | ort s/step | PyTorch s/step | reference / ort | ort / PyTorch |"
echo "|---|---|---|---|---|---|---|"
for m in $MODELS; do
  for d in 1 2; do
    a=$(med "$T/$m.$d.reference"); b=$(med "$T/$m.$d.ort"); c=$(med "$T/$m.$d.torch")
    printf '| %s | %s | %.4f | %.4f | %.4f | %.2f | %.2f |\n' "$m" "$d" "$a" "$b" "$c" \
      "$(echo "$a / $b" | bc -l)" "$(echo "$b / $c" | bc -l)"
  done
done
echo "(batch $BATCH = micro-batches of $MB, SGD momentum, $STEPS steps per run, median of $ROUNDS rounds)"
