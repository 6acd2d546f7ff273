#!/usr/bin/env bash
# Download what `pipec run --device cuda` needs from PyPI, on a machine that can reach it, for a
# GPU machine that cannot (companion of scripts/gpu_check.sh --wheels DIR).
#
# Usage: scripts/gpu_wheels.sh DIR [--part-size SIZE] [--slim] [--with-cuda-libs]
#
#   DIR               where the files go (created).
#   --part-size SIZE  split every file larger than SIZE (split(1) syntax, default 45M) into
#                     NAME.part-000, NAME.part-001, ... so that each piece fits a size-limited
#                     transfer; gpu_check.sh puts them back together and checks SHA256SUMS.
#   --slim            keep only the three libraries ONNX Runtime's CUDA path loads
#                     (libonnxruntime.so.*, libonnxruntime_providers_cuda.so,
#                     libonnxruntime_providers_shared.so) as onnxruntime-gpu-libs.tar.xz: 195 MB
#                     instead of the 256 MB wheel (its CUDA kernels are compressed already, so
#                     the provider library, 284 MB unpacked, is most of it).
#   --with-cuda-libs  also download cuBLAS, cuDNN 9, cuRAND and the CUDA runtime wheels
#                     (CUDA 13); a machine with PyTorch for CUDA 13 already has them.
#
# The wheels are for CPython 3.12 on manylinux x86_64 (PIPEC_GPU_PY, default 3.12); pins:
# onnxruntime-gpu 1.31.1 (CUDA 13), the version the `ort` crate's API level and requirements-test
# pin match.
set -euo pipefail
DIR=${1:?usage: scripts/gpu_wheels.sh DIR [--part-size SIZE] [--slim] [--with-cuda-libs]}
shift
PART=45M
SLIM=0
CUDA_LIBS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --part-size) PART=$2; shift 2 ;;
    --slim) SLIM=1; shift ;;
    --with-cuda-libs) CUDA_LIBS=1; shift ;;
    *) echo "gpu_wheels.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
PYV=${PIPEC_GPU_PY:-3.12}
mkdir -p "$DIR"
pkgs=(onnxruntime-gpu==1.31.1)
if [ "$CUDA_LIBS" = 1 ]; then
  pkgs+=(nvidia-cublas nvidia-cudnn-cu13 nvidia-curand nvidia-cuda-runtime)
fi
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYV" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DIR" "${pkgs[@]}"
cd "$DIR"
if [ "$SLIM" = 1 ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  whl=$(ls onnxruntime_gpu-*.whl)
  python3 - "$whl" "$tmp" <<'EOF'
import sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
keep = ("libonnxruntime.so", "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_shared.so")
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        base = n.rsplit("/", 1)[-1]
        if n.startswith("onnxruntime/capi/") and base.startswith(keep):
            with z.open(n) as src, open(f"{out}/{base}", "wb") as dst:
                dst.write(src.read())
EOF
  tar -C "$tmp" -cf - . | xz -6 -T0 > onnxruntime-gpu-libs.tar.xz
  rm -f "$whl"
fi
rm -f SHA256SUMS
for f in *; do
  case "$f" in *.part-*|SHA256SUMS) continue ;; esac
  sha256sum "$f" >> SHA256SUMS
done
for f in $(awk '{print $2}' SHA256SUMS); do
  size=$(stat -c %s "$f")
  if [ "$size" -gt "$(numfmt --from=iec "$PART")" ]; then
    split -b "$PART" -d -a 3 "$f" "$f.part-"
    rm -f "$f"
  fi
done
echo "gpu_wheels.sh: $(ls | wc -l) files in $DIR:"
ls -l
