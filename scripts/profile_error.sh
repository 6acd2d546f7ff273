#!/usr/bin/env bash
# Analytic cost model vs measurement on this CPU (issue 4, BENCHMARKS.md "Analytic vs measured").
#
# 1. `pipec profile --calibrate`: this machine's effective f32 FLOP/s (a 1024^3 MatMul) and memory
#    bandwidth (an Add over 2^24 floats) on the reference executor, one core: the figures the
#    `cpu-core` device kind carries (passes/src/cost/cluster.rs).
# 2. For each dev model: `pipec profile` (forward + backward of the training graph, every op
#    timed, median of REPEAT runs) into $OUT/<model>.prof.json, then
#    `pipec profile --from ... --compare-analytic` prints analytic/measured per op: median ratio,
#    p10 / median / p90 of |ln(analytic/measured)|, per op type, and the worst ops.
#
# Usage: scripts/profile_error.sh [OUT_DIR]   (env: PIPEC=path/to/pipec, REPEAT=5)
# Build first: cargo build --release. Timings are noisy on a loaded machine: run it idle.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPEC=${PIPEC:-target/release/pipec}
OUT=${1:-target/profile_error}
REPEAT=${REPEAT:-5}
mkdir -p "$OUT"
echo "== calibration (reference executor, one core)"
"$PIPEC" profile --calibrate --repeat 3
# model:batch (a batch where the model does real work but a run stays in seconds)
for mb in mlp4:32 inception_mini:8 gpt2_tiny:4 resnet18:2; do
  m=${mb%%:*}
  b=${mb##*:}
  echo
  echo "== $m (batch $b)"
  "$PIPEC" profile "onnx-models/$m.onnx" --batch "$b" --repeat "$REPEAT" --warmup 1 \
    -o "$OUT/$m.prof.json"
  "$PIPEC" profile "onnx-models/$m.onnx" --from "$OUT/$m.prof.json" --compare-analytic --worst 8
done
