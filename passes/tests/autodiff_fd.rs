//! Gradient checks of every autodiff rule against central finite differences.
//!
//! `scripts/fd_cases.py` writes small models (one op, or a few): fixed shapes covering the
//! corner cases (1-D MatMul operands, every Gemm transpose, grouped/dilated/strided Conv, ...)
//! plus random shapes with random broadcasting, seeded by `$PIPEC_FD_SEED`. This test differentiates each with the `autodiff` pass (mean-square loss unless the case name
//! asks `@sum` or `@ce`), verifies and exports the training graph, and `scripts/fd_check.py` runs
//! it in onnxruntime: float64 where ORT has double kernels (tolerance 1e-6), float32 otherwise
//! (Conv, pools, Erf/Gelu, LayerNorm, training-mode BN; tolerance 3e-3). Needs python3 with onnx,
//! onnxruntime and numpy; skipped (with a note) without them unless `CI` is set.

use pipec_passes::autodiff::{differentiate, Autodiff};
use pipec_passes::loss::LossKind;
use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn have_python() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import onnx, onnxruntime, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "python3 with onnx, onnxruntime and numpy is required under CI"
    );
    ok
}

#[test]
fn every_rule_matches_finite_differences() {
    if !have_python() {
        eprintln!("note: python3 with onnx/onnxruntime not found; skipping");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pipec-fd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("python3")
        .arg(root().join("scripts/fd_cases.py"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "fd_cases.py failed");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    cases.sort();
    let mut failures = Vec::new();
    for p in &cases {
        let stem = p.file_stem().unwrap().to_string_lossy().to_string();
        let loss = match stem.split_once('@').map(|x| x.1) {
            Some("sum") => LossKind::Sum,
            Some("ce") => LossKind::CrossEntropy("labels".into()),
            _ => LossKind::MeanSquare,
        };
        let res = (|| -> pipec_compiler::Result<()> {
            let mut m = pipec_compiler::onnx::import::load(p)?;
            pipec_compiler::shape::infer_shapes(&mut m)?;
            let t = differentiate(&mut m, &Autodiff::with_loss(Some(loss)))?;
            if t.grads.is_empty() {
                return Err(pipec_compiler::Error::msg("no gradients"));
            }
            pipec_compiler::verify::verify(&m)?;
            pipec_compiler::onnx::export::save(&m, &dir.join(format!("{stem}.train.onnx")))
        })();
        if let Err(e) = res {
            failures.push(format!("{stem}: {e}"));
        }
    }
    let out = Command::new("python3")
        .arg(root().join("scripts/fd_check.py"))
        .arg(&dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    eprintln!("{log}{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "autodiff failed on: {failures:#?}");
    assert!(
        out.status.success(),
        "finite-difference check failed:\n{log}"
    );
}
