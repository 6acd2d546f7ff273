//! The tract backend (`"tract"`): runs the module through `tract-onnx`.
//!
//! `prepare` exports the module with `pipec_compiler::onnx::export::to_bytes` and parses it with
//! tract-onnx (so unknown ops fail early). Each `run` fixes the input facts from the concrete
//! inputs (dtype and shape), optimizes and builds a plan, caches it per input signature, and
//! runs it.
//!
//! What tract lacks or gets wrong for pipec's graphs (checked by `tests/ops.rs`, tract 0.23.9):
//! see [`KNOWN_GAPS`]. tract is an inference engine: it is fine for the forward graphs of the
//! dev models, but the reference backend is the default for training graphs.

use crate::error::{Error, Result};
use crate::exec::{bind_inputs, Executor, Prepared};
use crate::tensor::Tensor;
use pipec_compiler::ir::{Graph, Module};
use std::collections::HashMap;
use std::sync::Arc;
#[allow(unused_imports)]
use tract_onnx::prelude::*;

/// Ops of the training-graph list that tract 0.23 cannot run correctly, as found by the per-op
/// tests (`tests/ops.rs`): op and reason.
pub const KNOWN_GAPS: &[(&str, &str)] = &[
    (
        "ConvTranspose",
        "with `output_shape`: tract panics (subtract overflow in deconv::adjustments); caught and \
         reported as an error",
    ),
    (
        "BatchNormalization",
        "scale/B/mean/var must be constants (initializers): fails when they are graph inputs, \
         as in a stage subgraph that takes its parameters as inputs",
    ),
    (
        "Pad",
        "the constant_value operand must be a constant; mode `wrap` is unsupported",
    ),
    (
        "Celu",
        "results differ from onnxruntime's (the `celu` op case, alpha != 1)",
    ),
    ("HardSwish", "no f64 kernel"),
    ("Erf", "no f64 kernel"),
    ("Sigmoid", "no f64 kernel"),
    (
        "Gemm",
        "f64 with alpha/beta != 1 fails (an f32 constant is mixed in)",
    ),
];

/// The tract backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tract;

/// Run tract code, turning a panic inside tract (it has some on odd attribute combinations)
/// into an error.
fn guard<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(Error::Backend {
            backend: "tract",
            msg: format!("tract panicked during {what}: {msg}"),
        })
    })
}

fn terr(e: impl std::fmt::Display) -> Error {
    Error::Backend {
        backend: "tract",
        msg: format!("{e:#}").replace('\n', " "),
    }
}

impl Executor for Tract {
    fn name(&self) -> &'static str {
        "tract"
    }

    fn prepare(&self, module: &Module) -> Result<Box<dyn Prepared>> {
        let bytes = pipec_compiler::onnx::export::to_bytes(module)?;
        let model = guard("loading", || {
            tract_onnx::onnx()
                .model_for_read(&mut &bytes[..])
                .map_err(terr)
        })?;
        Ok(Box::new(TractProgram {
            graph: module.graph.clone(),
            model,
            plans: HashMap::new(),
        }))
    }
}

type Signature = Vec<(DatumType, Vec<usize>)>;

struct TractProgram {
    graph: Graph,
    model: InferenceModel,
    plans: HashMap<Signature, Arc<TypedRunnableModel>>,
}

fn to_tract(t: &Tensor) -> tract_onnx::prelude::Tensor {
    match t {
        Tensor::F32(a) => a.clone().into_tensor(),
        Tensor::F64(a) => a.clone().into_tensor(),
        Tensor::I64(a) => a.clone().into_tensor(),
        Tensor::I32(a) => a.clone().into_tensor(),
        Tensor::U8(a) => a.clone().into_tensor(),
        Tensor::Bool(a) => a.clone().into_tensor(),
    }
}

fn from_tract(name: &str, t: &tract_onnx::prelude::Tensor) -> Result<Tensor> {
    macro_rules! view {
        ($ty:ty) => {
            t.to_plain_array_view::<$ty>()
                .map_err(|e| Error::input(name, format!("tract output: {e:#}")))?
                .to_owned()
        };
    }
    Ok(match t.datum_type() {
        DatumType::F32 => Tensor::F32(view!(f32)),
        DatumType::F64 => Tensor::F64(view!(f64)),
        DatumType::I64 => Tensor::I64(view!(i64)),
        DatumType::I32 => Tensor::I32(view!(i32)),
        DatumType::U8 => Tensor::U8(view!(u8)),
        DatumType::Bool => Tensor::Bool(view!(bool)),
        // tract keeps some integer results as symbolic dims (TDim); they are concrete here.
        DatumType::TDim => {
            let c = t
                .cast_to::<i64>()
                .map_err(|e| Error::input(name, format!("tract output: {e:#}")))?;
            Tensor::I64(
                c.to_plain_array_view::<i64>()
                    .map_err(|e| Error::input(name, format!("tract output: {e:#}")))?
                    .to_owned(),
            )
        }
        other => {
            return Err(Error::input(
                name,
                format!("tract produced an unsupported dtype {other:?}"),
            ))
        }
    })
}

impl Prepared for TractProgram {
    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let (ins, _) = bind_inputs(&self.graph, inputs)?;
        let tins: Vec<tract_onnx::prelude::Tensor> = ins.iter().map(|t| to_tract(t)).collect();
        let sig: Signature = tins
            .iter()
            .map(|t| (t.datum_type(), t.shape().to_vec()))
            .collect();
        let plan = match self.plans.get(&sig) {
            Some(p) => p.clone(),
            None => {
                let mut m = self.model.clone();
                for (i, (dt, shape)) in sig.iter().enumerate() {
                    m.set_input_fact(i, InferenceFact::dt_shape(*dt, shape.clone()))
                        .map_err(terr)?;
                }
                let plan = guard("optimization", || {
                    m.into_optimized()
                        .map_err(terr)?
                        .into_runnable()
                        .map_err(terr)
                })?;
                self.plans.insert(sig, plan.clone());
                plan
            }
        };
        let tv: TVec<TValue> = tins.into_iter().map(TValue::from).collect();
        let outs = guard("execution", || plan.run(tv).map_err(terr))?;
        let mut res = Vec::with_capacity(outs.len());
        for (v, t) in self.graph.outputs.iter().zip(outs.iter()) {
            let name = self.graph.values[*v].name.clone();
            let t = from_tract(&name, t)?;
            res.push((name, t));
        }
        Ok(res)
    }
}
