//! The single-device executor: a small trait with pluggable backends.
//!
//! An [`Executor`] turns an IR [`Module`] into a [`Prepared`] program once; [`Prepared::run`] then
//! runs it on concrete inputs as often as needed. Symbolic dims (`batch`) are bound from the
//! actual inputs of each run, so one prepared program serves any batch size.
//!
//! Backends:
//!
//! - [`crate::reference::Reference`] (`"reference"`, **the default**): our own interpreter, ndarray
//!   kernels op by op over the IR in program order, in f32 and f64. It runs every op the training
//!   graphs use (ScatterND/ScatterElements with `reduction`, ConvTranspose, MaxPool indices,
//!   Einsum, LayerNormalization with its Mean/InvStdDev outputs, ...) and does f64 end to end,
//!   which finite-difference gradient checks need. It is the default because correctness and
//!   coverage of training graphs matter more here than speed, and it has no graph-level
//!   rewriting that could change numerics.
//! - [`crate::tract_backend::Tract`] (`"tract"`): exports the module with
//!   `pipec_compiler::onnx::export::to_bytes`, loads it with `tract-onnx`, fixes the input facts
//!   from the concrete inputs, optimizes and runs. Faster on big convolutions, but an inference
//!   engine: see its module doc for the ops it lacks.
//!
//! - [`crate::ort_backend::Ort`] (`"ort"`, `"ort-cuda"`): one ONNX Runtime session per piece, on
//!   the CPU or the CUDA execution provider; ONNX Runtime is opened at run time (see its module
//!   doc for where the library comes from).

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::value::Value;
use pipec_compiler::ir::{Dim, Graph, Module, TensorData};
use std::collections::HashMap;

/// A backend that can prepare IR modules for execution.
pub trait Executor: Send + Sync {
    /// Short name of the backend (`"reference"`, `"tract"`).
    fn name(&self) -> &'static str;
    /// Check and compile the module (its main graph). Fails on ops the backend cannot run,
    /// naming the node and op.
    fn prepare(&self, module: &Module) -> Result<Box<dyn Prepared>>;

    /// The value this executor computes on without copying `t` on every run: its own value
    /// where it has one (ONNX Runtime: a value in the provider's memory, the GPU's for CUDA),
    /// else the host tensor itself (the default).
    fn upload(&self, t: Tensor) -> Result<Value> {
        Ok(Value::Host(t))
    }

    /// Whether [`Executor::upload`] makes values of the executor's own (not host tensors).
    fn holds_values(&self) -> bool {
        false
    }
}

/// A module ready to run on one backend.
pub trait Prepared: Send {
    /// Run on the given graph inputs (by name, any order; every graph input is required).
    /// Returns the graph outputs by name, in graph-output order.
    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>>;

    /// Like [`Prepared::run`] on [`Value`]s, which the caller moves in and gets back unchanged
    /// (first of the pair) with the outputs (second, in graph-output order). An executor with
    /// its own values binds them where they are and returns its outputs where it computed them
    /// (ONNX Runtime on CUDA: on the GPU). The default moves host values in, copies others to
    /// the host and returns host outputs.
    fn run_values(&mut self, inputs: Vec<(String, Value)>) -> Result<ValuesRun> {
        let feeds = inputs
            .into_iter()
            .map(|(n, v)| Ok((n, v.into_host()?)))
            .collect::<Result<Vec<_>>>()?;
        let outs = self.run(&feeds)?;
        let back = feeds
            .into_iter()
            .map(|(n, t)| (n, Value::Host(t)))
            .collect();
        let outs = outs.into_iter().map(|(n, t)| (n, Value::Host(t))).collect();
        Ok((back, outs))
    }

    /// Like [`Prepared::run`], and also returns the wall-clock seconds each op took, indexed by
    /// its position in the graph's program order (`Graph::order`; 0 for ops the backend did not
    /// run one by one). Only backends that execute op by op can do this (the reference
    /// interpreter); the default returns an error. `pipec profile` uses it.
    fn run_profiled(&mut self, inputs: &[(String, Tensor)]) -> Result<ProfiledRun> {
        let _ = inputs;
        Err(Error::Msg(
            "this backend cannot time single ops (use the reference backend)".into(),
        ))
    }
}

/// The inputs of [`Prepared::run_values`] given back, and the outputs, by name.
pub type ValuesRun = (Vec<(String, Value)>, Vec<(String, Value)>);

/// Outputs of a run by name, and the seconds of each op by position in the program order.
pub type ProfiledRun = (Vec<(String, Tensor)>, Vec<f64>);

/// The default backend (the reference interpreter; see the module doc for why).
pub fn default_executor() -> Box<dyn Executor> {
    Box::new(crate::reference::Reference)
}

/// A backend by name: `"reference"`, `"tract"`, `"ort"` (ONNX Runtime, CPU) or `"ort-cuda"`
/// (ONNX Runtime's CUDA provider; an error at `prepare` unless built with feature `cuda`).
pub fn executor_by_name(name: &str) -> Option<Box<dyn Executor>> {
    match name {
        "reference" | "ref" => Some(Box::new(crate::reference::Reference)),
        "tract" => Some(Box::new(crate::tract_backend::Tract)),
        "ort" => Some(Box::new(crate::ort_backend::Ort {
            device: crate::ort_backend::OrtDevice::Cpu,
        })),
        "ort-cuda" => Some(Box::new(crate::ort_backend::Ort {
            device: crate::ort_backend::OrtDevice::Cuda,
        })),
        _ => None,
    }
}

/// Prepare and run a module once with the default backend.
pub fn run_module(module: &Module, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
    default_executor().prepare(module)?.run(inputs)
}

/// Match the given inputs to the graph inputs, checking dtypes, ranks, static dims and that a
/// symbolic dim has one size across all inputs. Returns the tensors in graph-input order and
/// the symbol bindings.
pub fn bind_inputs<'a>(
    g: &Graph,
    inputs: &'a [(String, Tensor)],
) -> Result<(Vec<&'a Tensor>, HashMap<String, i64>)> {
    let by_name: HashMap<&str, &Tensor> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut out = Vec::with_capacity(g.inputs.len());
    let mut syms: HashMap<String, i64> = HashMap::new();
    for &v in &g.inputs {
        let vd = &g.values[v];
        let t = by_name
            .get(vd.name.as_str())
            .copied()
            .ok_or_else(|| Error::input(&vd.name, "missing (every graph input is required)"))?;
        if t.dtype() != vd.ty.dtype {
            return Err(Error::input(
                &vd.name,
                format!("dtype {} but the graph declares {}", t.dtype(), vd.ty.dtype),
            ));
        }
        if let Some(shape) = &vd.ty.shape {
            if shape.len() != t.shape().len() {
                return Err(Error::input(
                    &vd.name,
                    format!(
                        "shape {:?} but the graph declares rank {}",
                        t.shape(),
                        shape.len()
                    ),
                ));
            }
            for (i, (d, &n)) in shape.iter().zip(t.shape()).enumerate() {
                match d {
                    Dim::Known(k) if *k != n as i64 => {
                        return Err(Error::input(
                            &vd.name,
                            format!("dim {i} is {n} but the graph declares {k}"),
                        ))
                    }
                    Dim::Sym(s) if s.coeff == 1 && s.syms.len() == 1 => {
                        let prev = *syms.entry(s.syms[0].clone()).or_insert(n as i64);
                        if prev != n as i64 {
                            return Err(Error::input(
                                &vd.name,
                                format!(
                                    "dim {i} ('{}') is {n} but another input has it as {prev}",
                                    s.syms[0]
                                ),
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
        out.push(t);
    }
    let graph_inputs: std::collections::HashSet<&str> = g
        .inputs
        .iter()
        .map(|v| g.values[*v].name.as_str())
        .collect();
    if let Some((n, _)) = inputs
        .iter()
        .find(|(n, _)| !graph_inputs.contains(n.as_str()))
    {
        return Err(Error::input(n, "not an input of the graph"));
    }
    Ok((out, syms))
}

/// A copy of the module computing in f64 instead of f32: f32 initializers, graph inputs and
/// value types become f64, as do `Cast(to=FLOAT)`, f32 `Constant` values and the
/// `ConstantOfShape` fill. Run it on the reference backend (tract lacks some f64 kernels) for
/// finite-difference gradient checks; feed f64 tensors for the f32 inputs.
pub fn to_f64(module: &Module) -> Result<Module> {
    use pipec_compiler::ir::{Attr, DType};
    let mut m = module.clone();
    let g = &mut m.graph;
    let widen = |t: &pipec_compiler::ir::TensorData| -> Result<pipec_compiler::ir::TensorData> {
        if t.dtype == DType::F32 {
            Ok(Tensor::from_tensor_data(t)?
                .cast(DType::F64)?
                .to_tensor_data())
        } else {
            Ok(t.clone())
        }
    };
    for (v, t) in g.initializers.iter_mut() {
        *t = widen(t).map_err(|e| Error::input(&g.values[*v].name, e.to_string()))?;
    }
    for (_, vd) in g.values.iter_mut() {
        if vd.ty.dtype == DType::F32 {
            vd.ty.dtype = DType::F64;
        }
    }
    for &op in &g.order {
        let d = &mut g.ops[op];
        let (name, ty) = (d.name.clone(), d.op_type.clone());
        match d.op_type.as_str() {
            "Cast" if d.int_attr("to") == Some(DType::F32.onnx_code() as i64) => {
                d.attrs
                    .insert("to".into(), Attr::Int(DType::F64.onnx_code() as i64));
            }
            "Constant" | "ConstantOfShape" => {
                if let Some(Attr::Tensor(t)) = d.attrs.get("value") {
                    let w = widen(t).map_err(|e| Error::node(&name, &ty, e.to_string()))?;
                    d.attrs.insert("value".into(), Attr::Tensor(w));
                }
                if let Some(f) = d.attrs.remove("value_float").and_then(|a| a.as_float()) {
                    let t = Tensor::F64(ndarray::arr0(f as f64).into_dyn());
                    d.attrs
                        .insert("value".into(), Attr::Tensor(t.to_tensor_data()));
                }
                if let Some(Attr::Floats(v)) = d.attrs.remove("value_floats") {
                    let a = ndarray::Array1::from_iter(v.iter().map(|x| *x as f64));
                    let t = Tensor::F64(a.into_dyn());
                    d.attrs
                        .insert("value".into(), Attr::Tensor(t.to_tensor_data()));
                }
            }
            _ => {}
        }
    }
    Ok(m)
}

/// Run `module` on IR constant data keyed by graph input name with the default executor; returns
/// every graph output keyed by its value name, in graph output order (what `pipec grad` uses).
pub fn run_graph(
    module: &Module,
    inputs: &[(String, TensorData)],
) -> Result<Vec<(String, TensorData)>> {
    let tensors = inputs
        .iter()
        .map(|(n, t)| Ok((n.clone(), Tensor::from_tensor_data(t)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(run_module(module, &tensors)?
        .into_iter()
        .map(|(n, t)| (n, t.to_tensor_data()))
        .collect())
}
