#!/usr/bin/env bash
# Acceptance check of the foundation issue on fresh exports (made by scripts/export_models.py into
# bench-data/exports/, too big to commit): for each model, `pipec inspect --json` node and
# parameter counts must equal the Python onnx package's, every result shape must be known up to
# the named symbolic dims, `pipec opt` -> a.mlir -> b.mlir must round-trip byte for byte, and
# LLVM 22's mlir-opt must accept a.mlir.   Usage: scripts/check_exports.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-bench-data/exports}
pipec=${PIPEC:-target/release/pipec}
mlir_opt=${MLIR_OPT:-/usr/lib/llvm-22/bin/mlir-opt}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
printf '%-14s %6s %12s %8s %-22s %6s %6s %6s\n' model nodes parameters unknown symbols counts rtrip mlir
for f in "$dir"/*.onnx; do
  name=$(basename "$f" .onnx)
  "$pipec" inspect "$f" --json > "$tmp/p.json"
  python3 scripts/onnx_stats.py "$f" > "$tmp/o.json"
  counts=$(python3 - "$tmp/p.json" "$tmp/o.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])); o = json.load(open(sys.argv[2]))
ok = all(p[k] == o[k] for k in ("nodes", "parameters", "parameter_bytes", "op_types"))
print("ok" if ok else "DIFF", p["nodes"], p["parameters"], p["shapes"]["unknown_values"], ",".join(p["shapes"]["symbols"]))
PY
)
  read -r cok nodes params unknown symbols <<<"$counts"
  "$pipec" opt "$f" --passes shape-infer,fold-constants,dce -o "$tmp/a.mlir"
  "$pipec" opt "$tmp/a.mlir" -o "$tmp/b.mlir"
  if cmp -s "$tmp/a.mlir" "$tmp/b.mlir"; then rt=ok; else rt=DIFF; fi
  if "$mlir_opt" --allow-unregistered-dialect "$tmp/a.mlir" > /dev/null 2> "$tmp/mlir.err"; then mo=ok; else mo=FAIL; fi
  printf '%-14s %6s %12s %8s %-22s %6s %6s %6s\n' "$name" "$nodes" "$params" "$unknown" "$symbols" "$cok" "$rt" "$mo"
  if [ "$cok" != ok ] || [ "$rt" != ok ] || [ "$mo" != ok ] || [ "$unknown" != 0 ]; then fail=1; fi
done
exit $fail
