#!/usr/bin/env bash
# Runtime overhead of `pipec run` against the simulator's prediction (issue 7, BENCHMARKS.md
# "Runtime overhead vs the simulator").
#
# ROUNDS times (each round re-measures the machine, whose speed drifts over minutes):
# 1. `pipec profile` the model at the micro-batch (every op forward and backward on one core,
#    and the whole graph on every core at once: the concurrency slowdown).
# 2. `pipec compile --profile`: plan and compile a STAGES-stage straight pipeline on the `cpu`
#    preset; the plan's `iteration_time_s` is the simulator's prediction from those costs. With
#    more devices than cores the preset shares the host's cores (`Cluster::host_cores`; pinned
#    per core when the devices divide evenly, as the runtime pins its workers).
# 3. `pipec run --steps STEPS`, RUNS times, right after: the measured step time is (a) the
#    run's wall time / STEPS (it includes loading the pieces and the first, cold step) and
#    (b) the steady state the run prints (end of step 1 to end of step STEPS over STEPS - 1,
#    slowest device); the round's figure is the median over its runs.
# 4. Overhead = measured / predicted - 1 per round; the summary is the median over rounds.
#
# Usage: scripts/runtime_overhead.sh [MODEL] [STAGES]   (env: PIPEC, BATCH=16, MB=2, STEPS=20,
#        RUNS=3, ROUNDS=5, REPEAT=20). Build first: cargo build --release. Run on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPEC=${PIPEC:-target/release/pipec}
MODEL=${1:-onnx-models/gpt2_tiny.onnx}
STAGES=${2:-4}
BATCH=${BATCH:-16}
MB=${MB:-2}
STEPS=${STEPS:-20}
RUNS=${RUNS:-3}
ROUNDS=${ROUNDS:-5}
REPEAT=${REPEAT:-20}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "cores: $(nproc), model: $MODEL, $STAGES stages, batch $BATCH = $((BATCH / MB)) x $MB"
rows=()
for r in $(seq "$ROUNDS"); do
  "$PIPEC" profile "$MODEL" --batch "$MB" --repeat "$REPEAT" -o "$WORK/prof.json" >/dev/null
  rm -rf "$WORK/out"
  "$PIPEC" compile "$MODEL" --cluster cpu --devices "$STAGES" --planner straight \
    --batch "$BATCH" --micro-batch "$MB" --profile "$WORK/prof.json" -o "$WORK/out" >/dev/null
  row=$(python3 -c "import json; p=json.load(open('$WORK/out/plan.json')); q=json.load(open('$WORK/prof.json')); print(p['iteration_time_s'], q['concurrent_run_s'] / q['run_s'] if q['run_s'] else 0)")
  for _ in $(seq "$RUNS"); do
    out=$("$PIPEC" run "$WORK/out" --steps "$STEPS")
    row="$row $(echo "$out" | grep "steps in" | awk '{print $4}')"
    row="$row $(echo "$out" | grep "steady state:" | awk '{print $3}')"
  done
  rows+=("$row")
done
python3 - "$STEPS" "${rows[@]}" <<'PY'
import statistics, sys
steps = int(sys.argv[1])
wall_oh, steady_oh = [], []
for i, row in enumerate(sys.argv[2:], 1):
    v = [float(x) for x in row.split()]
    pred, conc, runs = v[0], v[1], v[2:]
    wall = statistics.median(runs[0::2]) / steps
    steady = statistics.median(runs[1::2])
    wall_oh.append(100 * (wall / pred - 1))
    steady_oh.append(100 * (steady / pred - 1))
    print(f"round {i}: predicted {pred * 1e3:.1f} ms/step (profile concurrency slowdown {conc:.2f}); "
          f"measured wall/steps {wall * 1e3:.1f}, steady {steady * 1e3:.1f} ms/step; "
          f"overhead {wall_oh[-1]:+.1f}% (wall), {steady_oh[-1]:+.1f}% (steady)")
for what, oh in [("wall / steps (with loading and the cold first step)", wall_oh),
                 ("steady state", steady_oh)]:
    print(f"{what}: overhead median {statistics.median(oh):+.1f}% over {len(oh)} rounds "
          f"(min {min(oh):+.1f}%, max {max(oh):+.1f}%)")
PY
