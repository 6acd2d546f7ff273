//! `pipec grad MODEL --inputs IN.npz [--loss KIND] -o OUT.npz` (cli.md): one forward + backward
//! pass on one device.
//!
//! The model is imported, its graph inputs are specialised to the shapes of the arrays given,
//! the `autodiff` pass builds the training graph (loss + backward), the verifier checks it, and
//! `pipec_runtime::run_graph` executes it on the CPU with the default single-device executor
//! (the reference interpreter, see `runtime-stub/EXECUTOR.md`). OUT.npz gets `loss` (0-D), `output/<name>` for every graph
//! output of the model and `grad/<initializer>` for every floating-point initializer the loss
//! depends on. Input arrays are looked up by input name, then as `input/<name>` (the layout of
//! the reference files in `onnx-models/`).

use anyhow::{bail, Context, Result};
use clap::Args;
use pipec_compiler::ir::{Dim, TensorData};
use pipec_passes::autodiff::{differentiate, Autodiff};
use pipec_passes::loss::LossKind;
use std::path::PathBuf;
use std::process::ExitCode;

/// One forward + backward pass of MODEL on the arrays in IN.npz; writes loss, outputs and
/// parameter gradients to OUT.npz.
#[derive(Args, Debug)]
pub struct GradArgs {
    /// The model (`.onnx` or `.mlir`).
    pub model: PathBuf,
    /// One array per graph input, keyed by input name.
    #[arg(long, value_name = "IN.npz")]
    pub inputs: PathBuf,
    /// `mean-square` (default), `sum` or `cross-entropy:LABEL_INPUT_NAME`.
    #[arg(long, default_value = "mean-square")]
    pub loss: String,
    /// Where to write the results.
    #[arg(short = 'o', long = "output", value_name = "OUT.npz")]
    pub output: PathBuf,
    /// Also write the training graph (forward + loss + backward) as ONNX here.
    #[arg(long, value_name = "FILE.onnx")]
    pub save_training_graph: Option<PathBuf>,
    /// Keep the model's symbolic input dims (e.g. `batch`) in the training graph instead of
    /// specialising them to the arrays given.
    #[arg(long)]
    pub keep_symbolic: bool,
}

/// Run the command.
pub fn run(a: GradArgs) -> Result<ExitCode> {
    let loss: LossKind = a.loss.parse().context("--loss")?;
    let mut m = super::load_module(&a.model)?;
    let arrays = pipec_runtime::npz::read_npz(&a.inputs)?;
    let label = match &loss {
        LossKind::CrossEntropy(l) => Some(l.clone()),
        _ => None,
    };
    let find = |name: &str| -> Option<&TensorData> {
        arrays
            .iter()
            .find(|(k, _)| k == name)
            .or_else(|| arrays.iter().find(|(k, _)| *k == format!("input/{name}")))
            .map(|(_, t)| t)
    };
    // Specialise the graph inputs to the given arrays.
    let mut feeds = Vec::new();
    for &v in &m.graph.inputs.clone() {
        let name = m.graph.name(v).to_string();
        let Some(t) = find(&name) else {
            bail!("{}: no array for graph input '{name}'", a.inputs.display());
        };
        let ty = m.graph.ty(v);
        if ty.dtype != t.dtype {
            bail!(
                "{}: array '{name}' is {} but the graph input is {}",
                a.inputs.display(),
                t.dtype,
                ty.dtype
            );
        }
        if let Some(s) = &ty.shape {
            let fits = s.len() == t.dims.len()
                && s.iter()
                    .zip(&t.dims)
                    .all(|(d, n)| d.known().is_none_or(|k| k == *n));
            if !fits {
                bail!(
                    "{}: array '{name}' has shape {:?} but the graph input is {}",
                    a.inputs.display(),
                    t.dims,
                    pipec_compiler::ir::fmt_type(ty)
                );
            }
        }
        if !a.keep_symbolic {
            m.graph.values[v].ty.shape = Some(t.dims.iter().map(|d| Dim::Known(*d)).collect());
        }
        feeds.push((name, t.clone()));
    }
    pipec_compiler::shape::infer_shapes(&mut m).context("shape inference with the given inputs")?;
    pipec_passes::lower::lower(&mut m)
        .with_context(|| format!("{}: lowering (pass 'lower') failed", a.model.display()))?;
    let outputs: Vec<String> = m
        .graph
        .outputs
        .iter()
        .map(|v| m.graph.name(*v).to_string())
        .collect();
    let t = differentiate(&mut m, &Autodiff::with_loss(Some(loss)))?;
    if let Some(l) = &label {
        if !feeds.iter().any(|(k, _)| k == l) {
            let t = find(l).with_context(|| {
                format!("{}: no array for the labels '{l}'", a.inputs.display())
            })?;
            feeds.push((l.clone(), t.clone()));
        }
    }
    pipec_compiler::verify::verify(&m).context("the training graph does not verify")?;
    if let Some(p) = &a.save_training_graph {
        pipec_compiler::onnx::export::save(&m, p)?;
    }
    let res = pipec_runtime::run_graph(&m, &feeds)?;
    let get = |name: &str| -> Result<TensorData> {
        res.iter()
            .find(|(k, _)| k == name)
            .map(|(_, t)| t.clone())
            .with_context(|| format!("the executor returned no value '{name}'"))
    };
    let loss_name = t
        .loss
        .map(|l| m.graph.name(l).to_string())
        .unwrap_or_default();
    let mut out = vec![("loss".to_string(), get(&loss_name)?)];
    for o in &outputs {
        out.push((format!("output/{o}"), get(o)?));
    }
    for (p, gv) in &t.grads {
        out.push((
            format!("grad/{}", m.graph.name(*p)),
            get(m.graph.name(*gv))?,
        ));
    }
    super::write_atomic(&a.output, &pipec_runtime::npz::npz_bytes(&out)?)?;
    Ok(ExitCode::SUCCESS)
}
