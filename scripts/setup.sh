#!/usr/bin/env bash
# Install everything pipec's README commands and CI need on a fresh Debian 12 machine
# (run as root; Rust 1.95, Python 3.11 and pip are expected to be there already).
#
#   scripts/setup.sh                        # system packages + test Python packages
#   scripts/setup.sh --export-venv DIR      # also: venv DIR with scripts/requirements-export.txt
#                                           # (torch etc., only for scripts/export_models.py)
# Env: PYTHON (default python3) is the interpreter whose pip gets requirements-test.txt.
#
# Idempotent: apt is skipped when all its packages are installed, pip skips what is
# installed at the pinned version. Quiet on success (one line per step); on failure prints the
# step's log tail and exits non-zero.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
EXPORT_VENV=""
while [ $# -gt 0 ]; do
  case "$1" in
    --export-venv) EXPORT_VENV="${2:?--export-venv needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

LOG="$(mktemp /tmp/pipec-setup.XXXXXX.log)"
step() {  # step "description" cmd args...
  local what="$1"; shift
  printf '[setup] %s ... ' "$what"
  if "$@" >>"$LOG" 2>&1; then
    echo ok
  else
    local rc=$?
    echo FAILED
    echo "[setup] ERROR: '$what' failed (exit $rc): $*" >&2
    echo "[setup] last lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    exit "$rc"
  fi
}

# libclang1-22 + libclang-common-22-dev: bindgen (mlir-sys, tblgen) loads libclang and its builtin
# headers when building the `mlir` cargo feature (melior); g++ compiles tblgen's C++ shim;
# libpolly-22-dev: `llvm-config --link-static --libnames` lists libPolly.a, which mlir-sys and
# tblgen link.
# libopenmpi-dev + openmpi-bin: the `mpi` cargo feature (rsmpi's mpi-sys binds Open MPI's mpi.h
# with bindgen, i.e. the libclang above) and `mpirun` for `pipec run --backend mpi` and its tests;
# openssh-client: Open MPI 4's mpirun refuses to start without an ssh/rsh agent, even on one node.
APT_PKGS=(libmlir-22-dev mlir-22-tools llvm-22-dev libzstd-dev libz3-dev libxml2-dev zlib1g-dev
          libclang1-22 libclang-common-22-dev libpolly-22-dev g++ libopenmpi-dev openmpi-bin
          openssh-client)
apt_missing() {  # prints the packages of APT_PKGS that dpkg does not have installed
  local p
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
  done
}
if [ -z "$(apt_missing)" ]; then
  echo "[setup] apt: all ${#APT_PKGS[@]} packages installed, skipping"
else
  if [ "$(id -u)" -ne 0 ]; then
    echo "[setup] ERROR: apt packages missing and not running as root: $(apt_missing | tr "\n" " ")" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  step "apt-get update" apt-get update -qq
  step "apt-get install ${APT_PKGS[*]}" apt-get install -y -qq --no-install-recommends "${APT_PKGS[@]}"
fi
step "mlir-opt runs" /usr/lib/llvm-22/bin/mlir-opt --version
step "mpirun runs" mpirun --allow-run-as-root --version

# Debian's own python3 is "externally managed" (PEP 668); we install into it on purpose.
PIP_FLAGS=(--quiet --disable-pip-version-check --no-input)
if "$PYTHON" -c 'import sys,sysconfig,os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"),"EXTERNALLY-MANAGED")) else 1)' \
   && [ -z "${VIRTUAL_ENV:-}" ]; then
  PIP_FLAGS+=(--break-system-packages)
fi
step "pip install -r requirements-test.txt ($PYTHON)" \
  "$PYTHON" -m pip install "${PIP_FLAGS[@]}" -r "$HERE/requirements-test.txt"
step "python test packages import at pinned versions" "$PYTHON" - "$HERE/requirements-test.txt" <<'PY'
import importlib.metadata as md, sys
bad = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    have = md.version(name)
    if have != want:
        bad.append(f"{name} {have} != {want}")
import numpy, onnx, onnxruntime  # noqa: F401
if bad:
    sys.exit("version mismatch: " + "; ".join(bad))
PY

if [ -n "$EXPORT_VENV" ]; then
  [ -x "$EXPORT_VENV/bin/python" ] || step "python -m venv $EXPORT_VENV" "$PYTHON" -m venv "$EXPORT_VENV"
  step "pip install -r requirements-export.txt ($EXPORT_VENV)" \
    "$EXPORT_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$HERE/requirements-export.txt"
  step "export venv imports torch/torchvision/transformers" \
    "$EXPORT_VENV/bin/python" -c "import torch, torchvision, transformers, onnx, onnxscript"
fi

rm -f "$LOG"
echo "[setup] done"
