#!/usr/bin/env bash
# The GPU path end to end, on a machine with an NVIDIA GPU: `pipec run --device cuda --check` on
# two bundled models compiled for 2 devices (both on this one GPU), step times next to the CPU
# executors and PyTorch training the same model on the same GPU; then data-parallel and
# straight programs whose steps all-reduce on the GPU, with `--transport nccl --check` (NCCL,
# one rank on this one GPU) next to the in-process GPU sum.
#
# Usage: scripts/gpu_check.sh [--wheels DIR] [--pipec BIN] [--steps N] [--models "M1 M2"]
#                             [--big-batch B] [--zoo DIR]
#
#   --wheels DIR  install from files that scripts/gpu_wheels.sh downloaded (for a machine without
#                 network): an onnxruntime-gpu wheel or onnxruntime-gpu-libs.tar.xz, whole or in
#                 parts NAME.part-000, NAME.part-001, ... (joined here and checked against
#                 SHA256SUMS), and optionally nvidia-* wheels. Without it: an `onnxruntime` with
#                 the CUDA provider already importable by python3 is used, else
#                 `pip install onnxruntime-gpu==1.31.1` (needs network).
#   --pipec BIN   a pipec built with `cargo build --release --features cuda` (default
#                 target/release/pipec, built here if missing).
#   --steps N     training steps per run (default 20; step times are the steady state).
#   --models      bundled models (default "gpt2_tiny inception_mini").
#   --big-batch B also time batch B in micro-batches of B/4 on the GPU, pipec vs PyTorch
#                 (default 64; 0 skips it).
#   --zoo DIR     also every DIR/*.onnx (models exported by scripts/export_zoo.py): data
#                 parallel on 2 devices (batch 4 in micro-batches of 2, SGD lr 1e-4 momentum),
#                 2 steps with --device cuda --transport nccl --check; a table of the outcomes
#                 (GPU_CHECK_ZOO_BUDGET=S: start no model after S seconds of the script).
#
# With a pipec built with `--features mpi,cuda` and Open MPI's mpirun here, it also runs the
# MPI backend on the GPU (2 ranks: on one GPU both use it, and NCCL, which takes one rank per
# GPU, must refuse with a clear error; on 2 or more GPUs --transport nccl must pass --check).
#
# cuBLAS, cuDNN 9, cuRAND and the CUDA runtime (CUDA 13) come from python3's nvidia-* packages
# (PyTorch for CUDA 13 installs them) or from --wheels; their folders go on LD_LIBRARY_PATH.
# Env: PYTHON (default python3), GPU_CHECK_DIR (scratch, default /tmp/pipec-gpu),
# GPU_CHECK_OUT (also write the summary and every log there).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=${GPU_CHECK_DIR:-/tmp/pipec-gpu}
WHEELS=
PIPEC=target/release/pipec
STEPS=20
MODELS="gpt2_tiny inception_mini"
BIG=64
ZOO=
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS=$2; shift 2 ;;
    --pipec) PIPEC=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    --big-batch) BIG=$2; shift 2 ;;
    --zoo) ZOO=$2; shift 2 ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$WORK/logs"
OUTDIR=${GPU_CHECK_OUT:-}
say() { echo "== $* (at $SECONDS s)"; }
die() { echo "gpu_check.sh: $*" >&2; exit 2; }

say "GPU"
nvidia-smi -L || die "no NVIDIA GPU here (nvidia-smi failed)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

say "pipec"
if [ ! -x "$PIPEC" ]; then
  cargo build --release --features cuda || die "cargo build --release --features cuda failed"
fi
"$PIPEC" --version || die "$PIPEC does not run"

say "ONNX Runtime with the CUDA provider"
LIBDIR=
if [ -n "$WHEELS" ]; then
  [ -d "$WHEELS" ] || die "--wheels $WHEELS: no such folder"
  (
    cd "$WHEELS" || exit 2
    for first in *.part-000; do
      [ -e "$first" ] || continue
      base=${first%.part-000}
      cat "$base".part-* > "$base.tmp" && mv "$base.tmp" "$base" || exit 2
      echo "joined $(ls "$base".part-* | wc -l) parts into $base"
    done
    if [ -f SHA256SUMS ]; then
      sha256sum -c SHA256SUMS || { echo "checksum mismatch: a part is missing or damaged" >&2; exit 2; }
    fi
  ) || die "--wheels $WHEELS: could not put the files back together"
  mkdir -p "$WORK/ort"
  if ls "$WHEELS"/onnxruntime-gpu-libs.tar.xz >/dev/null 2>&1; then
    xz -dc "$WHEELS"/onnxruntime-gpu-libs.tar.xz | tar -C "$WORK/ort" -xf - || die "cannot unpack the libraries"
  elif ls "$WHEELS"/onnxruntime_gpu-*.whl >/dev/null 2>&1; then
    "$PY" - "$WHEELS" "$WORK/ort" <<'EOF' || die "cannot unpack the onnxruntime-gpu wheel"
import glob, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(sorted(glob.glob(f"{src}/onnxruntime_gpu-*.whl"))[-1]) as z:
    for n in z.namelist():
        if n.startswith("onnxruntime/capi/lib") and ".so" in n:
            with z.open(n) as s, open(f"{out}/{n.rsplit('/', 1)[-1]}", "wb") as d:
                d.write(s.read())
EOF
  else
    die "--wheels $WHEELS: no onnxruntime_gpu-*.whl or onnxruntime-gpu-libs.tar.xz in it"
  fi
  LIBDIR=$WORK/ort
  if ls "$WHEELS"/nvidia_*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --target "$WORK/site" "$WHEELS"/nvidia_*.whl \
      || die "pip could not install the nvidia-* wheels of $WHEELS"
  fi
elif "$PY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
  LIBDIR=$("$PY" -c "import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))")
else
  "$PY" -m pip install -q --target "$WORK/site" onnxruntime-gpu==1.31.1 \
    || die "pip install onnxruntime-gpu==1.31.1 failed (no network? use scripts/gpu_wheels.sh and --wheels)"
  LIBDIR=$WORK/site/onnxruntime/capi
fi
ORT_DYLIB_PATH=$(ls "$LIBDIR"/libonnxruntime.so* 2>/dev/null | sort | tail -1)
[ -n "$ORT_DYLIB_PATH" ] || die "no libonnxruntime.so in $LIBDIR"
[ -f "$LIBDIR/libonnxruntime_providers_cuda.so" ] || die "no libonnxruntime_providers_cuda.so in $LIBDIR"
export ORT_DYLIB_PATH
echo "ORT_DYLIB_PATH=$ORT_DYLIB_PATH"

# The CUDA libraries: every folder of lib*.so* under the nvidia packages (python3's, --wheels').
sites=$("$PY" -c "import site, sys; print(' '.join(site.getsitepackages() + [site.getusersitepackages()]))")
libpath=
for s in "$WORK/site" $sites; do
  [ -d "$s/nvidia" ] || continue
  for d in $(find "$s/nvidia" -name 'lib*.so*' -printf '%h\n' | sort -u); do libpath=$libpath:$d; done
done
export LD_LIBRARY_PATH=${libpath#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NCCL (--transport nccl) is opened as libnccl.so; the nvidia-nccl-cu13 package ships libnccl.so.2.
nccl2=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | while read -r d; do [ -e "$d/libnccl.so.2" ] && echo "$d/libnccl.so.2" && break; done)
if [ -n "$nccl2" ] && [ ! -e "$(dirname "$nccl2")/libnccl.so" ]; then
  mkdir -p "$WORK/nccl-lib" && ln -sf "$nccl2" "$WORK/nccl-lib/libnccl.so"
  export LD_LIBRARY_PATH=$WORK/nccl-lib:$LD_LIBRARY_PATH
fi
for l in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13 libcudnn.so.9 libnccl.so.2; do
  found=$(echo "$LD_LIBRARY_PATH" | tr ':' '\n' | while read -r d; do [ -e "$d/$l" ] && echo "$d/$l" && break; done)
  echo "$l: ${found:-NOT FOUND}"
done

run_log() { # name cmd... : run, keep the log, print its tail on failure
  local name=$1; shift
  if "$@" > "$WORK/logs/$name.log" 2>&1; then return 0; fi
  echo "FAILED: $*"; tail -5 "$WORK/logs/$name.log"; return 1
}
steady() { sed -n 's/^steady state: \([0-9.e-]*\) s\/step.*/\1/p' "$WORK/logs/$1.log" | tail -1; }
rel() { sed -n 's/^max_rel_diff \(.*\)/\1/p' "$WORK/logs/$1.log" | tail -1; }
# Bytes copied host -> GPU per step after the first (pipec prints the totals of a run).
copies() { sed -n 's/^host -> ONNX Runtime: \([0-9]*\) bytes, ONNX Runtime -> host: \([0-9]*\) bytes.*/\1 \2/p' "$WORK/logs/$1.log" | tail -1; }
# torch_step.py's median step (its last line is JSON).
tj() { "$PY" -c "import json,sys; print('%.6f' % json.loads(open(sys.argv[1]).read().splitlines()[-1])['median_step_s'])" "$WORK/logs/$1.log" 2>/dev/null; }

SUMMARY=$WORK/summary.md
{
  echo "| model | pipec reference (CPU) s/step | pipec ort CPU s/step | pipec ort CUDA s/step | --check max_rel_diff (CUDA) | PyTorch CUDA s/step | PyTorch CPU s/step |"
  echo "|---|---|---|---|---|---|---|"
} > "$SUMMARY"
status=0
for m in $MODELS; do
  say "$m: compile for 2 devices"
  out=$WORK/$m.out
  rm -rf "$out"
  run_log "$m.compile" "$PIPEC" compile "onnx-models/$m.onnx" --cluster 2@1e10 --device-kind cpu-core \
    --planner straight --batch 8 --micro-batch 2 --optimizer sgd:lr=0.01,momentum=0.9 -o "$out" || { status=1; continue; }
  say "$m: run --device cuda --check ($STEPS steps)"
  cuda=$m.cuda
  run_log "$cuda" "$PIPEC" run "$out" --device cuda --steps "$STEPS" --check --no-pin || status=1
  grep -q "check ok" "$WORK/logs/$cuda.log" || status=1
  say "$m: which nodes ONNX Runtime kept on the CPU (PIPEC_ORT_LOG=verbose, 1 step)"
  PIPEC_ORT_LOG=verbose "$PIPEC" run "$out" --device cuda --steps 1 --no-pin > "$WORK/logs/$m.placement.log" 2>&1
  grep -i -A6 "placed on \[CPUExecutionProvider\]" "$WORK/logs/$m.placement.log" | cut -c1-160 | head -40
  say "$m: PIPEC_ORT_STRICT=1 (no CPU fallback), 1 step"
  PIPEC_ORT_STRICT=1 "$PIPEC" run "$out" --device cuda --steps 1 --no-pin > "$WORK/logs/$m.strict.log" 2>&1 \
    && echo "strict: ok" || echo "strict: $(grep -m1 -o 'This session contains.*' "$WORK/logs/$m.strict.log" || tail -1 "$WORK/logs/$m.strict.log")"
  grep -E "^(step 1:|step $STEPS:|steady|max_rel|check|host -> )" "$WORK/logs/$cuda.log"
  say "$m: CPU executors"
  run_log "$m.ortcpu" "$PIPEC" run "$out" --executor ort --steps "$STEPS"
  run_log "$m.ref" "$PIPEC" run "$out" --steps 5
  say "$m: PyTorch"
  run_log "$m.torch-cuda" "$PY" scripts/torch_step.py "$m" --batch 8 --steps "$STEPS" --device cuda
  run_log "$m.torch-cpu" "$PY" scripts/torch_step.py "$m" --batch 8 --steps "$STEPS" --device cpu
  echo "| $m | $(steady "$m.ref") | $(steady "$m.ortcpu") | $(steady "$cuda") | $(rel "$cuda") | $(tj "$m.torch-cuda") | $(tj "$m.torch-cpu") |" >> "$SUMMARY"
done
BIGSUM=$WORK/summary_big.md
if [ "$BIG" -gt 0 ]; then
  {
    echo "| model | batch | pipec ort CUDA s/step | PyTorch CUDA s/step | host -> GPU bytes, GPU -> host bytes (whole run) |"
    echo "|---|---|---|---|---|"
  } > "$BIGSUM"
  for m in $MODELS; do
    say "$m: batch $BIG on the GPU"
    out=$WORK/$m.big.out
    rm -rf "$out"
    run_log "$m.big.compile" "$PIPEC" compile "onnx-models/$m.onnx" --cluster 2@1e10 --device-kind cpu-core \
      --planner straight --batch "$BIG" --micro-batch $((BIG / 4)) --optimizer sgd:lr=0.01,momentum=0.9 -o "$out" || { status=1; continue; }
    run_log "$m.big.cuda" "$PIPEC" run "$out" --device cuda --steps 10 --no-pin || status=1
    run_log "$m.big.torch-cuda" "$PY" scripts/torch_step.py "$m" --batch "$BIG" --steps 10 --device cuda
    echo "| $m | $BIG | $(steady "$m.big.cuda") | $(tj "$m.big.torch-cuda") | $(copies "$m.big.cuda") |" >> "$BIGSUM"
  done
fi
# NCCL: programs whose every step all-reduces on the GPU (data parallel: every parameter's
# gradient; gpt2_tiny's straight pipeline: its tied embedding), run with the in-process sum and
# with --transport nccl (one process and GPU: NCCL worlds of one after the in-process sum).
NCCLSUM=$WORK/summary_nccl.md
{
  echo "| model | program | in-process all-reduce s/step | --transport nccl s/step | --check max_rel_diff (nccl) | NCCL calls, bytes (whole run) |"
  echo "|---|---|---|---|---|---|"
} > "$NCCLSUM"
for m in $MODELS; do
  for planner in dp straight; do
    say "$m: $planner, 2 devices, --transport nccl ($STEPS steps)"
    out=$WORK/$m.$planner.out
    rm -rf "$out"
    run_log "$m.$planner.compile" "$PIPEC" compile "onnx-models/$m.onnx" --cluster 2@1e10 --device-kind cpu-core \
      --planner "$planner" --batch 8 --micro-batch 2 --optimizer sgd:lr=0.01,momentum=0.9 -o "$out" || { status=1; continue; }
    grep -q '"all_reduce"' "$out/schedule.json" || { echo "(no all-reduce in this program: skipped)"; continue; }
    run_log "$m.$planner.gpu" "$PIPEC" run "$out" --device cuda --steps "$STEPS" --no-pin || status=1
    run_log "$m.$planner.nccl" env NCCL_DEBUG=WARN "$PIPEC" run "$out" --device cuda --transport nccl --steps "$STEPS" --check --no-pin || status=1
    grep -q "check ok" "$WORK/logs/$m.$planner.nccl.log" || status=1
    grep -E "^(NCCL|max_rel|check)" "$WORK/logs/$m.$planner.nccl.log"
    calls=$(sed -n 's/^NCCL [^:]*: \([0-9]*\) all-reduce calls, \([0-9]*\) bytes.*/\1, \2/p' "$WORK/logs/$m.$planner.nccl.log")
    echo "| $m | $planner | $(steady "$m.$planner.gpu") | $(steady "$m.$planner.nccl") | $(rel "$m.$planner.nccl") | ${calls:-none} |" >> "$NCCLSUM"
  done
done
# The MPI backend on the GPU (a pipec built with --features mpi,cuda, Open MPI's mpirun).
MPISUM=$WORK/summary_mpi.md
: > "$MPISUM"
if command -v mpirun >/dev/null && "$PIPEC" --version | grep -q "features:.* mpi"; then
  ngpu=$(nvidia-smi -L | wc -l)
  m=gpt2_tiny
  out=$WORK/$m.dp.out
  if [ -d "$out" ]; then
    mpi() { # log name, then mpirun options and the command
      local name=$1; shift
      run_log "$name" timeout -k 10 300 mpirun --allow-run-as-root --oversubscribe -np 2 -x ORT_DYLIB_PATH -x LD_LIBRARY_PATH "$@"
    }
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp \
      OMPI_MCA_btl_vader_single_copy_mechanism=none
    # One GPU: both ranks on GPU 0 (else each rank takes the GPU of its local rank).
    pin=
    [ "$ngpu" -lt 2 ] && pin="-x PIPEC_CUDA_DEVICE=0"
    say "$m: dp under mpirun -np 2 --backend mpi --device cuda --check ($ngpu GPU(s))"
    # shellcheck disable=SC2086
    mpi "$m.mpi" $pin "$PIPEC" run "$out" --backend mpi --device cuda --steps "$STEPS" --check || status=1
    grep -E "^(backend|steady|max_rel|check)" "$WORK/logs/$m.mpi.log"
    say "$m: dp under mpirun -np 2 --backend mpi --device cuda --transport nccl --check"
    # shellcheck disable=SC2086
    if mpi "$m.mpi-nccl" $pin -x NCCL_DEBUG=WARN "$PIPEC" run "$out" --backend mpi --device cuda --transport nccl --steps "$STEPS" --check; then
      grep -E "^(backend|steady|NCCL|max_rel|check)" "$WORK/logs/$m.mpi-nccl.log"
      echo "| $m dp, mpirun -np 2, $ngpu GPU(s) | $(steady "$m.mpi") | $(steady "$m.mpi-nccl") | $(rel "$m.mpi-nccl") |" >> "$MPISUM"
    else
      [ "$ngpu" -ge 2 ] && status=1
      why=$(grep -m1 -o "ncclCommInitRank.*" "$WORK/logs/$m.mpi-nccl.log" | cut -c1-200)
      echo "NCCL under mpirun on $ngpu GPU(s): ${why:-see $WORK/logs/$m.mpi-nccl.log}"
      grep -m3 -i "duplicate gpu" "$WORK/logs/$m.mpi-nccl.log" | cut -c1-200
      echo "| $m dp, mpirun -np 2, $ngpu GPU(s) | $(steady "$m.mpi") | refused: ${why:-?} | |" >> "$MPISUM"
    fi
  fi
fi
# The zoo: models nobody here built the runtime for.
ZOOSUM=$WORK/summary_zoo.md
: > "$ZOOSUM"
if [ -n "$ZOO" ]; then
  echo "| model | outcome | max_rel_diff | steady s/step | NCCL calls |" >> "$ZOOSUM"
  echo "|---|---|---|---|---|" >> "$ZOOSUM"
  for f in "$ZOO"/*.onnx; do
    z=$(basename "$f" .onnx)
    if [ -n "${GPU_CHECK_ZOO_BUDGET:-}" ] && [ "$SECONDS" -gt "$GPU_CHECK_ZOO_BUDGET" ]; then
      echo "| $z | not run: past GPU_CHECK_ZOO_BUDGET=$GPU_CHECK_ZOO_BUDGET s | | | |" | tee -a "$ZOOSUM"
      continue
    fi
    say "zoo $z: dp, 2 devices, --device cuda --transport nccl --check (2 steps)"
    out=$WORK/zoo.$z.out
    rm -rf "$out"
    if ! run_log "zoo.$z.compile" "$PIPEC" compile "$f" --cluster 2@1e10 --device-kind cpu-core \
        --planner dp --batch 4 --micro-batch 2 --optimizer sgd:lr=0.0001,momentum=0.9 -o "$out"; then
      echo "| $z | compile failed: $(grep -m1 '^error' "$WORK/logs/zoo.$z.compile.log" | cut -c1-120) | | | |" | tee -a "$ZOOSUM"
      continue
    fi
    run_log "zoo.$z.run" "$PIPEC" run "$out" --device cuda --transport nccl --steps 2 --check --no-pin
    log=$WORK/logs/zoo.$z.run.log
    if grep -q "^check ok" "$log"; then o="check ok"
    elif grep -q "^check INCONCLUSIVE" "$log"; then o="inconclusive (reference diverged)"
    elif grep -q "^check FAILED" "$log"; then o="over 1e-4"
    else o="error: $(grep -m1 -E '^(error|  caused by)' "$log" | cut -c1-120)"
    fi
    calls=$(sed -n 's/^NCCL [^:]*: \([0-9]*\) all-reduce calls.*/\1/p' "$log")
    echo "| $z | $o | $(rel "zoo.$z.run") | $(steady "zoo.$z.run") | ${calls:-} |" | tee -a "$ZOOSUM"
  done
fi
say "summary (batch 8 = 4 micro-batches of 2, 2 devices on one GPU, SGD momentum; s/step = steady state)"
cat "$SUMMARY"
[ -f "$BIGSUM" ] && cat "$BIGSUM"
cat "$NCCLSUM"
if [ -s "$MPISUM" ]; then
  echo "| program | MPI, host messages and all-reduces s/step | MPI + --transport nccl s/step | --check max_rel_diff (nccl) |"
  echo "|---|---|---|---|"
  cat "$MPISUM"
fi
[ -s "$ZOOSUM" ] && cat "$ZOOSUM"
if [ -n "$OUTDIR" ]; then
  mkdir -p "$OUTDIR"
  cp "$SUMMARY" "$OUTDIR/"
  [ -f "$BIGSUM" ] && cp "$BIGSUM" "$OUTDIR/"
  cp "$NCCLSUM" "$OUTDIR/"
  [ -s "$MPISUM" ] && cp "$MPISUM" "$OUTDIR/"
  [ -s "$ZOOSUM" ] && cp "$ZOOSUM" "$OUTDIR/"
  tar -C "$WORK" -czf "$OUTDIR/gpu_check_logs.tgz" logs
fi
exit $status
