//! The reference interpreter backend (`"reference"`, the default): ndarray kernels run op by op
//! over the IR in program order.
//!
//! - Float kernels are generic over f32 and f64, so a whole graph can run in f64 (the
//!   finite-difference gradient checks) as long as its inputs and initializers are f64.
//! - Integer shape arithmetic (Shape/Gather/Concat/Range/...) runs in i64 (and i32).
//! - A value is freed right after its last use, so peak memory is close to the live set.
//! - Convolutions are im2col + `matrixmultiply` GEMM (through ndarray); everything else is
//!   straightforward loops. Single-threaded.
//!
//! Ops: see [`SUPPORTED_OPS`]. Not supported: control flow (If/Loop/Scan), sequences, strings,
//! quantized ops, RNNs (LSTM/GRU/RNN), 3-D convolution and pooling, BatchNormalization in training
//! mode, Resize, NonZero, TopK, and any non-default domain. `prepare` names the first such node.
//! (pipec's `lower` pass rewrites Loop with a static trip count, If with a constant condition,
//! LSTM, GRU and Resize into ops of this list; the CLI runs it before training.)

mod elementwise;
mod nn;
mod shape;

use crate::error::{Error, Result};
use crate::exec::{bind_inputs, Executor, Prepared};
use crate::tensor::Tensor;
use pipec_compiler::ir::{Attr, Graph, Module, OpData, Value};
use std::collections::{HashMap, HashSet};

/// Result of a kernel: the error text is wrapped with the node name and op by the driver.
pub(crate) type KResult<T> = std::result::Result<T, String>;

/// Every op type the reference backend runs (default ONNX domain).
pub const SUPPORTED_OPS: &[&str] = &[
    // elementwise
    "Abs",
    "Add",
    "And",
    "Ceil",
    "Celu",
    "Clip",
    "Cos",
    "Div",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Floor",
    "Gelu",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "IsInf",
    "IsNaN",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "Max",
    "Mean",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "PRelu",
    "Pow",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Sigmoid",
    "Sign",
    "Sin",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Sub",
    "Sum",
    "Tanh",
    "ThresholdedRelu",
    "Where",
    "Xor",
    // type and identity
    "Cast",
    "CastLike",
    "Constant",
    "Dropout",
    "Identity",
    // reductions and normalisation
    "ArgMax",
    "ArgMin",
    "BatchNormalization",
    "CumSum",
    "GroupNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "LogSoftmax",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Softmax",
    // linear algebra, convolution, pooling
    "AveragePool",
    "Conv",
    "ConvTranspose",
    "Einsum",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "MatMul",
    "MaxPool",
    // shape and indexing
    "Concat",
    "ConstantOfShape",
    "Expand",
    "Flatten",
    "Gather",
    "GatherElements",
    "GatherND",
    "OneHot",
    "Pad",
    "Range",
    "Reshape",
    "ScatterElements",
    "ScatterND",
    "Shape",
    "Size",
    "Slice",
    "Split",
    "Squeeze",
    "Tile",
    "Transpose",
    "Trilu",
    "Unsqueeze",
];

/// The reference interpreter (see the module doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct Reference;

impl Executor for Reference {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn prepare(&self, module: &Module) -> Result<Box<dyn Prepared>> {
        let g = &module.graph;
        let supported: HashSet<&str> = SUPPORTED_OPS.iter().copied().collect();
        for &op in &g.order {
            let d = &g.ops[op];
            let default_domain = d.domain.is_empty() || d.domain == "ai.onnx";
            if !default_domain || !supported.contains(d.op_type.as_str()) {
                return Err(Error::Unsupported {
                    node: d.name.clone(),
                    op_type: if default_domain {
                        d.op_type.clone()
                    } else {
                        format!("{}.{}", d.domain, d.op_type)
                    },
                    backend: "reference",
                });
            }
        }
        let mut consts = HashMap::new();
        for (v, t) in &g.initializers {
            let name = &g.values[*v].name;
            let t = Tensor::from_tensor_data(t)
                .map_err(|e| Error::input(name, format!("initializer: {e}")))?;
            consts.insert(*v, t);
        }
        // Last use of every value (position in the order), to free it early.
        let mut last_use: HashMap<Value, usize> = HashMap::new();
        for (i, &op) in g.order.iter().enumerate() {
            for v in g.ops[op].inputs.iter().flatten() {
                last_use.insert(*v, i);
            }
        }
        let mut frees: Vec<Vec<Value>> = vec![Vec::new(); g.order.len()];
        let keep: HashSet<Value> = g.outputs.iter().copied().collect();
        for (v, i) in last_use {
            if !keep.contains(&v) && !consts.contains_key(&v) {
                frees[i].push(v);
            }
        }
        Ok(Box::new(RefProgram {
            graph: g.clone(),
            opset: module.opset(),
            consts,
            frees,
        }))
    }
}

struct RefProgram {
    graph: Graph,
    opset: i64,
    consts: HashMap<Value, Tensor>,
    /// Values to drop after the op at each position of the order.
    frees: Vec<Vec<Value>>,
}

impl Prepared for RefProgram {
    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        self.exec(inputs, None)
    }

    fn run_profiled(&mut self, inputs: &[(String, Tensor)]) -> Result<crate::exec::ProfiledRun> {
        let mut times = vec![0.0; self.graph.order.len()];
        let out = self.exec(inputs, Some(&mut times))?;
        Ok((out, times))
    }
}

impl RefProgram {
    /// Run the program; with `times`, also record each op's kernel seconds (operand lookup,
    /// the kernel, and storing its results; not the freeing of dead values) at its position in
    /// the order. Without it the only cost is one branch per op.
    fn exec(
        &self,
        inputs: &[(String, Tensor)],
        mut times: Option<&mut Vec<f64>>,
    ) -> Result<Vec<(String, Tensor)>> {
        let g = &self.graph;
        let (ins, _) = bind_inputs(g, inputs)?;
        // Graph inputs are read in place (the caller's tensors: weights, saved activations,
        // messages), not copied; `env` holds what the ops compute, and its results move out.
        let bound: HashMap<Value, &Tensor> = g.inputs.iter().copied().zip(ins).collect();
        let mut env: HashMap<Value, Tensor> = HashMap::new();
        for (pos, &op) in g.order.iter().enumerate() {
            let d = &g.ops[op];
            let start = times.is_some().then(std::time::Instant::now);
            let outs = {
                let mut args: Vec<Option<&Tensor>> = Vec::with_capacity(d.inputs.len());
                for v in &d.inputs {
                    args.push(match v {
                        None => None,
                        Some(v) => Some(
                            env.get(v)
                                .or_else(|| bound.get(v).copied())
                                .or_else(|| self.consts.get(v))
                                .ok_or_else(|| {
                                    Error::node(
                                        &d.name,
                                        &d.op_type,
                                        format!("operand '{}' has no value", g.values[*v].name),
                                    )
                                })?,
                        ),
                    });
                }
                let ctx = Ctx {
                    op: d,
                    inputs: args,
                    opset: self.opset,
                    n_outputs: d.outputs.len(),
                };
                eval(&ctx).map_err(|m| Error::node(&d.name, &d.op_type, m))?
            };
            if outs.len() < d.outputs.len() {
                return Err(Error::node(
                    &d.name,
                    &d.op_type,
                    format!(
                        "produced {} results but the node has {}",
                        outs.len(),
                        d.outputs.len()
                    ),
                ));
            }
            for (v, t) in d.outputs.iter().zip(outs) {
                env.insert(*v, t);
            }
            if let (Some(ts), Some(t0)) = (times.as_deref_mut(), start) {
                ts[pos] = t0.elapsed().as_secs_f64();
            }
            for v in &self.frees[pos] {
                env.remove(v);
            }
        }
        let mut out = Vec::with_capacity(g.outputs.len());
        for (i, &v) in g.outputs.iter().enumerate() {
            let name = g.values[v].name.clone();
            // A computed result moves out, unless a later output names it again.
            let computed = if g.outputs[i + 1..].contains(&v) {
                env.get(&v).cloned()
            } else {
                env.remove(&v)
            };
            let t = match computed {
                Some(t) => t,
                None => bound
                    .get(&v)
                    .copied()
                    .or_else(|| self.consts.get(&v))
                    .cloned()
                    .ok_or_else(|| Error::input(&name, "graph output was never computed"))?,
            };
            out.push((name, t));
        }
        Ok(out)
    }
}

/// What a kernel sees: the node, its operands and the model's opset.
pub(crate) struct Ctx<'a> {
    pub op: &'a OpData,
    pub inputs: Vec<Option<&'a Tensor>>,
    pub opset: i64,
    pub n_outputs: usize,
}

impl<'a> Ctx<'a> {
    /// A required operand.
    pub fn input(&self, i: usize) -> KResult<&'a Tensor> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| format!("operand {i} is required"))
    }
    /// An optional operand.
    pub fn opt(&self, i: usize) -> Option<&'a Tensor> {
        self.inputs.get(i).copied().flatten()
    }
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.op.int_attr(name).unwrap_or(default)
    }
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.op.float_attr(name).unwrap_or(default)
    }
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.op.ints_attr(name).map(<[i64]>::to_vec)
    }
    pub fn string(&self, name: &str, default: &str) -> String {
        self.op.str_attr(name).unwrap_or(default).to_string()
    }
    pub fn tensor_attr(&self, name: &str) -> Option<&'a pipec_compiler::ir::TensorData> {
        self.op.attr(name).and_then(Attr::as_tensor)
    }
    /// An operand holding integers (axes, shapes, pads), as i64.
    pub fn ints_input(&self, i: usize) -> Option<Vec<i64>> {
        self.opt(i).map(Tensor::to_i64_vec)
    }
}

/// Normalise a possibly negative axis against a rank.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> KResult<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

fn eval(c: &Ctx) -> KResult<Vec<Tensor>> {
    let t = c.op.op_type.as_str();
    if let Some(r) = elementwise::eval(t, c) {
        return r;
    }
    if let Some(r) = nn::eval(t, c) {
        return r;
    }
    if let Some(r) = shape::eval(t, c) {
        return r;
    }
    Err(format!("op '{t}' is not implemented"))
}
