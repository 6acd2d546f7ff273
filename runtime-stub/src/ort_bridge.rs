//! **TEMPORARY executor**: runs a module by exporting it to ONNX and shelling out to
//! `python3 scripts/ort_run.py MODEL.onnx IN.npz OUT.npz` (onnxruntime), npz in, npz out.
//!
//! It exists only until the native CPU executor (branch `exec`) lands; [`run_graph`]'s signature
//! is the one the native executor will provide, so callers (`pipec grad`) do not change. Needs
//! `python3` with `onnx`, `onnxruntime` and `numpy` on `PATH`. The script path is
//! `$PIPEC_ORT_RUN` if set, else `scripts/ort_run.py` of this repository.

use crate::npz;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Module, TensorData};
use pipec_compiler::Result;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

fn script() -> PathBuf {
    std::env::var_os("PIPEC_ORT_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../scripts/ort_run.py"
            ))
        })
}

/// Run `module` on `inputs` (keyed by graph input name); returns every graph output, keyed by
/// its value name, in graph output order. TEMPORARY implementation via onnxruntime (see the
/// module doc).
pub fn run_graph(
    module: &Module,
    inputs: &[(String, TensorData)],
) -> Result<Vec<(String, TensorData)>> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "pipec-ort-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let res = (|| {
        let model = dir.join("model.onnx");
        pipec_compiler::onnx::export::save(module, &model)?;
        let inp = dir.join("in.npz");
        npz::write_npz(&inp, inputs)?;
        let outp = dir.join("out.npz");
        let o = std::process::Command::new("python3")
            .arg(script())
            .arg(&model)
            .arg(&inp)
            .arg(&outp)
            .output()
            .map_err(|e| {
                Error::msg(format!(
                    "cannot run python3 (temporary onnxruntime executor): {e}"
                ))
            })?;
        if !o.status.success() {
            return Err(Error::msg(format!(
                "onnxruntime (temporary executor) failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        npz::read_npz(&outp)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    res
}
