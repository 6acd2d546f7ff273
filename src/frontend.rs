//! The front end every command shares: read a model (ONNX or textual IR), infer shapes, upgrade
//! an older opset, verify, bind the sizes of symbolic dims, and lower control flow and RNNs.

use anyhow::{bail, Context, Result};
use pipec_compiler::ir::{Dim, Module};
use std::collections::BTreeMap;
use std::path::Path;

/// Whether a path names textual IR (by extension) rather than an ONNX file.
pub fn is_text_ir(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "mlir")
}

/// Load an ONNX model or textual IR, infer shapes, upgrade an older default-domain opset to the
/// one pipec's passes use (`pipec_compiler::onnx::upgrade`) and verify: the front end every
/// command but `inspect` uses.
pub fn load_module(path: &Path) -> Result<Module> {
    load_module_with(path, true)
}

/// [`load_module`], with the opset upgrade optional (`inspect` describes the file as written).
pub fn load_module_with(path: &Path, upgrade: bool) -> Result<Module> {
    let mut m = if is_text_ir(path) {
        let src = std::fs::read_to_string(path)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        pipec_compiler::text::parse(&src, &path.display().to_string())?
    } else {
        pipec_compiler::onnx::import::load(path)?
    };
    pipec_compiler::shape::infer_shapes(&mut m)
        .with_context(|| format!("{}: shape inference failed", path.display()))?;
    if upgrade {
        let up = pipec_compiler::onnx::upgrade::upgrade_opset(&mut m)
            .with_context(|| format!("{}: opset upgrade failed", path.display()))?;
        if up.is_some() {
            pipec_compiler::shape::infer_shapes(&mut m).with_context(|| {
                format!(
                    "{}: shape inference after the opset upgrade failed",
                    path.display()
                )
            })?;
        }
    }
    pipec_compiler::verify::verify_with(&m, pipec_compiler::verify::VerifyOptions { types: false })
        .with_context(|| format!("{}: the imported IR does not verify", path.display()))?;
    Ok(m)
}

/// The batch symbol: the symbolic leading dim of the first data input, if any.
pub fn batch_symbol(m: &Module) -> Option<String> {
    let g = &m.graph;
    let first = g.inputs.iter().find(|v| !g.initializers.contains_key(*v))?;
    match g.ty(*first).shape.as_deref()?.first()? {
        Dim::Sym(s) if s.syms.len() == 1 && s.coeff == 1 => Some(s.syms[0].clone()),
        _ => None,
    }
}

/// Bind the `--dim` symbols in `m` and re-infer shapes. A name that no data input has, or the
/// batch symbol (sized by `--batch`), is an error. With `require_all`, every symbolic dim of a
/// data input other than the batch symbol must then be bound: the error names the input, the
/// dim and the flag.
pub fn bind_dims(
    m: &mut Module,
    path: &Path,
    dims: &BTreeMap<String, i64>,
    require_all: bool,
) -> Result<()> {
    let g = &m.graph;
    let data: Vec<_> = g
        .inputs
        .iter()
        .copied()
        .filter(|v| !g.initializers.contains_key(v))
        .collect();
    let syms_of = |v: pipec_compiler::ir::Value| -> Vec<String> {
        g.ty(v)
            .shape
            .iter()
            .flatten()
            .flat_map(|d| match d {
                Dim::Sym(s) => s.syms.clone(),
                Dim::Known(_) => vec![],
            })
            .collect()
    };
    let batch = batch_symbol(m);
    for k in dims.keys() {
        if require_all && batch.as_deref() == Some(k.as_str()) {
            bail!("--dim {k}: '{k}' is the batch dim, sized by --batch");
        }
        if !data.iter().any(|v| syms_of(*v).contains(k)) {
            bail!(
                "--dim {k}: no graph input of {} has a dim named '{k}'",
                path.display()
            );
        }
    }
    if require_all {
        for &v in &data {
            if let Some(s) = syms_of(v)
                .into_iter()
                .find(|s| Some(s) != batch.as_ref() && !dims.contains_key(s))
            {
                bail!(
                    "{}: input '{}' is {}: its dim '{s}' has no size (only the batch may stay \
                     symbolic); give one with --dim {s}=N",
                    path.display(),
                    g.name(v),
                    pipec_compiler::ir::fmt_type(g.ty(v))
                );
            }
        }
    }
    if !dims.is_empty() {
        pipec_compiler::shape::bind_symbols(m, dims)?;
        pipec_compiler::shape::infer_shapes(m).with_context(|| {
            format!(
                "{}: shape inference with the --dim sizes failed",
                path.display()
            )
        })?;
    }
    Ok(())
}

/// [`load_module`], [`bind_dims`] with every non-batch dim required, then the `lower` pass
/// (Loop/If unrolled, LSTM/GRU unrolled, Resize as MatMuls): the front end of the commands that
/// plan or train a model (`plan`, `compare`, `compile`), so the cost graph, the plan and the
/// stage programs all see the ops the executor runs and autodiff differentiates.
pub fn load_module_dims(path: &Path, dims: &BTreeMap<String, i64>) -> Result<Module> {
    let mut m = load_module(path)?;
    bind_dims(&mut m, path, dims, true)?;
    pipec_passes::lower::lower(&mut m)
        .with_context(|| format!("{}: lowering (pass 'lower') failed", path.display()))?;
    Ok(m)
}
