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
//!
//! `--precision f64` runs the same training graph in float64: after autodiff, every float32
//! initializer, value, `Cast(to=FLOAT)` and constant is widened ([`pipec_runtime::exec::to_f64`],
//! the widening `pipec run --precision f64` applies to its pieces) and so are the float32 input
//! arrays; OUT.npz then holds float64 arrays. Its rounding (~1e-16 per operation) stands for the
//! exact gradient when judging how far float32 gradients are from it (`scripts/grad_accuracy.py`).
//! With `--f32-branches` the float64 run also takes every branch decision from a float32 run of
//! the same graph: each non-float result of an op with a float operand (the masks of
//! `Greater`/`Equal`/..., MaxPool/ArgMax/TopK indices, float-to-integer casts) is computed in
//! float32 and fed to the float64 graph in its place. The result is the exact gradient of the
//! piece of the piecewise-smooth function the float32 run chose. Without it, a ReLU input or a
//! pooling window within float32 rounding of a tie can take the other branch in float64, and
//! the float32 gradient then differs from float64 by one routed element (~1e-3 of a conv weight
//! gradient) although neither is wrong: such flips are a lottery that PyTorch's float32
//! gradients draw as well (1-ulp input noise moves them between layers).
//! Models computing in another float type (float16, bfloat16, float8) are refused: widening
//! only float32 would leave part of the graph in low precision.

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
    /// Keep the batch dim (the symbolic leading dim of the first input, e.g. `batch`) symbolic
    /// in the training graph instead of specialising it to the arrays given. Other symbolic
    /// dims (a sequence length, an image size) are always specialised: convolution and pooling
    /// gradients need static spatial dims.
    #[arg(long)]
    pub keep_symbolic: bool,
    /// Arithmetic of the run: `f32` as exported, or `f64` (float32 weights, inputs and every
    /// float32 value widened to float64; OUT.npz in float64).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f64"])]
    pub precision: String,
    /// With `--precision f64`: take every branch decision (comparison masks, pooling and
    /// arg-max indices) from a float32 run of the same graph, so the result is the exact
    /// gradient along float32's branches (see the module doc).
    #[arg(long)]
    pub f32_branches: bool,
    #[arg(long = "dim", value_name = "NAME=VALUE", help = super::DIM_HELP)]
    pub dims: Vec<String>,
}

/// Run the command.
pub fn run(a: GradArgs) -> Result<ExitCode> {
    let loss: LossKind = a.loss.parse().context("--loss")?;
    let dims = super::parse_dims(&a.dims)?;
    let mut m = super::load_module(&a.model)?;
    if a.f32_branches && a.precision != "f64" {
        bail!("--f32-branches takes the branches of a float32 run for a float64 one: add --precision f64");
    }
    if a.precision == "f64" {
        refuse_low_precision(&m, &a.model)?;
    }
    // --dim sizes first (then checked against the arrays like any static dim).
    super::bind_dims(&mut m, &a.model, &dims, false)?;
    let batch = super::batch_symbol(&m);
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
        let keep = |d: &Dim| {
            a.keep_symbolic
                && matches!((d, &batch), (Dim::Sym(s), Some(b)) if s.coeff == 1 && s.syms == [b.clone()])
        };
        let old = ty.shape.clone().unwrap_or_default();
        m.graph.values[v].ty.shape = Some(
            t.dims
                .iter()
                .enumerate()
                .map(|(i, n)| match old.get(i) {
                    Some(d) if keep(d) => d.clone(),
                    _ => Dim::Known(*n),
                })
                .collect(),
        );
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
    let res = if a.precision == "f64" {
        let mut narrow = m.clone();
        let decisions = if a.f32_branches {
            branch_decisions(&mut narrow)
        } else {
            Vec::new()
        };
        let f32_feeds = feeds.clone();
        let mut wide = widen_to_f64(&m, &mut feeds)?;
        if !decisions.is_empty() {
            let got = pipec_runtime::run_graph(&narrow, &f32_feeds)?;
            for &v in &decisions {
                let name = m.graph.name(v).to_string();
                let t = got
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, t)| t.clone())
                    .with_context(|| format!("the float32 run returned no value '{name}'"))?;
                let fed = format!("{name}.f32");
                let ty = wide.graph.ty(v).clone();
                let input = wide.graph.add_input(fed.clone(), ty);
                wide.graph.replace_all_uses(v, input);
                feeds.push((fed, t));
            }
        }
        pipec_runtime::run_graph(&wide, &feeds)?
    } else {
        pipec_runtime::run_graph(&m, &feeds)?
    };
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

/// `--precision f64` refuses a model with values of a float type other than float32/float64
/// (naming the first one): widening float32 alone would leave that part in low precision.
fn refuse_low_precision(m: &pipec_compiler::ir::Module, model: &std::path::Path) -> Result<()> {
    use pipec_compiler::ir::DType;
    let g = &m.graph;
    let found = g.order.iter().find_map(|&op| {
        let d = &g.ops[op];
        d.inputs
            .iter()
            .flatten()
            .chain(&d.outputs)
            .find(|v| {
                g.ty(**v).dtype.is_float() && !matches!(g.ty(**v).dtype, DType::F32 | DType::F64)
            })
            .map(|v| (d.name.clone(), d.op_type.clone(), *v))
    });
    if let Some((node, op, v)) = found {
        bail!(
            "{}: --precision f64 widens float32 models, but value '{}' (of node '{node}' ({op})) is {}",
            model.display(),
            g.name(v),
            g.ty(v).dtype
        );
    }
    Ok(())
}

/// `--precision f64`: the training graph with every float32 value widened to float64, and the
/// float32 `feeds` widened in place.
fn widen_to_f64(
    m: &pipec_compiler::ir::Module,
    feeds: &mut [(String, TensorData)],
) -> Result<pipec_compiler::ir::Module> {
    use pipec_compiler::ir::DType;
    for (name, t) in feeds.iter_mut() {
        if t.dtype == DType::F32 {
            *t = pipec_runtime::tensor::Tensor::from_tensor_data(t)
                .and_then(|x| x.cast(DType::F64))
                .map(|x| x.to_tensor_data())
                .with_context(|| format!("widening input '{name}' to float64"))?;
        }
    }
    pipec_runtime::exec::to_f64(m).context("--precision f64")
}

/// `--f32-branches`: the branch decisions of `m`, i.e. every non-float result of an op with a
/// float operand, in program order; each is also made a graph output of `m` so that a run
/// returns it.
fn branch_decisions(m: &mut pipec_compiler::ir::Module) -> Vec<pipec_compiler::ir::Value> {
    let g = &m.graph;
    let mut out = Vec::new();
    for &op in &g.order {
        let d = &g.ops[op];
        let float_in = d.inputs.iter().flatten().any(|v| g.ty(*v).dtype.is_float());
        if !float_in || matches!(d.op_type.as_str(), "Shape" | "Size") {
            continue;
        }
        out.extend(d.outputs.iter().filter(|v| !g.ty(**v).dtype.is_float()));
    }
    for &v in &out {
        if !m.graph.outputs.contains(&v) {
            m.graph.outputs.push(v);
        }
    }
    out
}
