#!/usr/bin/env bash
# The whole test suite, as CI runs it (`.ci/run` calls exactly this). Installs what it needs first
# (scripts/setup.sh: LLVM 22's mlir-opt, Python's onnx/onnxruntime/numpy for the oracles).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage is announced with the seconds since the start, so a slow run shows where it went.
stage() { echo "== $* (at ${SECONDS} s)"; }
bash scripts/setup.sh
export PATH="/usr/lib/llvm-22/bin:$PATH"
# A clean clone gains nothing from incremental compilation, and its caches would be several GB
# of the target folder: CI's disk is not large.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
stage "cargo test"
cargo test --workspace --quiet
stage "MLIR in-process (feature 'mlir': melior on LLVM 22)"
cargo clippy -p pipec-compiler --features mlir --all-targets --quiet -- -D warnings
cargo test -p pipec-compiler --features mlir --quiet --test mlir_feature
# One build for both optional runtime features: 'cuda' (ONNX Runtime's CUDA provider, loaded at
# run time, so it builds and is checked here without a GPU) rides along with 'mpi'.
stage "MPI backend + CUDA feature build (features 'mpi,cuda': rsmpi on Open MPI, pipec run --backend mpi under mpirun)"
export LIBCLANG_PATH="${LIBCLANG_PATH:-/usr/lib/llvm-22/lib}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cargo clippy --workspace --features mpi,cuda --all-targets --quiet -- -D warnings
cargo test --workspace --features mpi,cuda --quiet --lib dist::mpi
cargo test --features mpi,cuda --quiet --test cli_mpi
stage "done"
