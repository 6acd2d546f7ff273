#!/usr/bin/env bash
# Import benchmark (foundation issue): pipec vs Python's onnx.load on the same file, same run,
# warm page cache.   Usage: scripts/bench_import.sh [MODEL.onnx]  (default: GPT-2 small export)
set -euo pipefail
cd "$(dirname "$0")/.."
f=${1:-bench-data/exports/gpt2.onnx}
cargo build --release --quiet -p pipec-compiler --example import_bench
cargo build --release --quiet --bin pipec
cat "$f" > /dev/null   # warm the page cache
echo "== pipec import only (mmap + protobuf decode + IR build), 10 runs"
target/release/examples/import_bench "$f" 10
echo "== pipec front end (import + shape inference + verify), best of 5 'pipec inspect --timing'"
best=""
for _ in 1 2 3 4 5; do
  t=$(target/release/pipec inspect "$f" --timing 2>&1 >/dev/null | sed -E 's/import: ([0-9.]+) ms.*/\1/')
  if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; fi
done
echo "front end best: $best ms"
echo "== python onnx.load, best of 5"
python3 scripts/bench_onnx_load.py "$f" --repeat 5
