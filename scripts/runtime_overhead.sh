#!/usr/bin/env bash
# Runtime overhead of `pipec run` against the simulator's prediction (issue 7, BENCHMARKS.md
# "Runtime overhead vs the simulator").
#
# 1. `pipec profile` the model at the micro-batch (every op forward and backward, one core).
# 2. `pipec compile --profile`: plan and compile a STAGES-stage straight pipeline on the `cpu`
#    preset; the plan's `iteration_time_s` is the simulator's prediction from those costs. With
#    more devices than cores the preset shares the host's cores (`Cluster::host_cores`), as the
#    runtime's worker threads do.
# 3. `pipec run --steps STEPS`, RUNS times: the measured step time is (a) the run's wall time /
#    STEPS (it includes loading the pieces and the first, cold step) and (b) the steady state the
#    run prints (end of step 1 to end of step STEPS over STEPS - 1, slowest device).
# 4. Overhead = measured / predicted - 1, for the median, best and worst run, both ways.
#
# Usage: scripts/runtime_overhead.sh [MODEL] [STAGES]   (env: PIPEC, BATCH=16, MB=2, STEPS=20,
#        RUNS=5). Build first: cargo build --release. Run it on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PIPEC=${PIPEC:-target/release/pipec}
MODEL=${1:-onnx-models/gpt2_tiny.onnx}
STAGES=${2:-4}
BATCH=${BATCH:-16}
MB=${MB:-2}
STEPS=${STEPS:-20}
RUNS=${RUNS:-5}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "cores: $(nproc), model: $MODEL, $STAGES stages, batch $BATCH = $((BATCH / MB)) x $MB"
"$PIPEC" profile "$MODEL" --batch "$MB" --repeat 5 -o "$WORK/prof.json" >/dev/null
"$PIPEC" compile "$MODEL" --cluster cpu --devices "$STAGES" --planner straight \
  --batch "$BATCH" --micro-batch "$MB" --profile "$WORK/prof.json" -o "$WORK/out" >/dev/null
predicted=$(python3 -c "import json; print(json.load(open('$WORK/out/plan.json'))['iteration_time_s'])")
times=()
steady=()
for _ in $(seq "$RUNS"); do
  out=$("$PIPEC" run "$WORK/out" --steps "$STEPS")
  times+=("$(echo "$out" | grep "steps in" | awk '{print $4}')")
  steady+=("$(echo "$out" | grep "steady state:" | awk '{print $3}')")
done
python3 - "$predicted" "$STEPS" "${times[@]}" -- "${steady[@]}" <<'EOF'
import statistics, sys
pred, steps = float(sys.argv[1]), int(sys.argv[2])
rest = sys.argv[3:]
cut = rest.index("--")
for what, per in [("wall / steps (with loading and the cold first step)",
                   sorted(float(t) / steps for t in rest[:cut])),
                  (f"steady state (steps 2-{steps})", sorted(float(t) for t in rest[cut + 1:]))]:
    med = statistics.median(per)
    print(f"{what}: predicted {pred * 1e3:.1f} ms/step; measured median {med * 1e3:.1f} ms/step "
          f"(best {per[0] * 1e3:.1f}, worst {per[-1] * 1e3:.1f}, {len(per)} runs); "
          f"overhead median {100 * (med / pred - 1):+.1f}%, best {100 * (per[0] / pred - 1):+.1f}%, "
          f"worst {100 * (per[-1] / pred - 1):+.1f}%")
EOF
