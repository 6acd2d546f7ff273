//! Command implementations and the helpers they share.

pub mod compare;
pub mod compile;
pub mod grad;
pub mod inspect;
pub mod opt;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod run;
pub mod simulate;

use anyhow::{Context, Result};
use pipec_compiler::ir::Module;
use std::path::Path;

/// Print an error as `error: <one line>` followed by its causes, one per line.
pub fn report_error(e: &anyhow::Error) {
    eprintln!("error: {e}");
    for cause in e.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
}

/// Whether a path names textual IR (by extension) rather than an ONNX file.
pub fn is_text_ir(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "mlir")
}

/// Load an ONNX model or textual IR, infer shapes and verify: the front end every command uses.
pub fn load_module(path: &Path) -> Result<Module> {
    let mut m = if is_text_ir(path) {
        let src = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        pipec_compiler::text::parse(&src, &path.display().to_string())?
    } else {
        pipec_compiler::onnx::import::load(path)?
    };
    pipec_compiler::shape::infer_shapes(&mut m)
        .with_context(|| format!("{}: shape inference failed", path.display()))?;
    pipec_compiler::verify::verify_with(&m, pipec_compiler::verify::VerifyOptions { types: false })
        .with_context(|| format!("{}: the imported IR does not verify", path.display()))?;
    Ok(m)
}

/// [`load_module`], then the `lower` pass (LSTM/GRU unrolled, Resize as MatMuls): what the
/// commands that plan, compile or train a model work on, so the cost graph, the plan and the
/// stage programs all see the ops the executor runs and autodiff differentiates.
pub fn load_lowered(path: &Path) -> Result<Module> {
    let mut m = load_module(path)?;
    pipec_passes::lower::lower(&mut m)
        .with_context(|| format!("{}: lowering (pass 'lower') failed", path.display()))?;
    Ok(m)
}

/// Write `contents` to `path` atomically: a temporary file next to it, then a rename, so a failed
/// run never leaves a partial output.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    std::fs::write(&tmp, contents).with_context(|| format!("{}: cannot write", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: cannot write", path.display())
    })?;
    Ok(())
}
