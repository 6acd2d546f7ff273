//! Analytic op costs: FLOPs and memory traffic per IR op from its `TensorType`s, forward and
//! backward, turned into a [`CostGraph`] with one node per live op ([`from_module`]).
//!
//! Times come from a roofline on the device kind ([`Work::Counted`]): `max(FLOPs / peak(dtype),
//! bytes / memory bandwidth)`, dtype-aware through [`Precision::of`].
//!
//! # FLOP counts (forward; a multiply-add is 2 FLOPs)
//! | op | FLOPs |
//! |---|---|
//! | `Conv` | `2 · |Y| · (C/group) · Πk` (+ `|Y|` with a bias) |
//! | `ConvTranspose` | `2 · |X| · (M/group) · Πk` |
//! | `Gemm`, `MatMul` | `2 · |Y| · K` (K the contracted dim) (+ `|Y|` for Gemm's C) |
//! | `Einsum` | `2 · Π` of the sizes of all distinct indices |
//! | `BatchNormalization`, `InstanceNormalization`, `GroupNormalization` | `5 · |X|` |
//! | `LayerNormalization`, `RMSNormalization` | `8 · |X|` |
//! | `MaxPool`, `AveragePool`, `LpPool` | `|Y| · Πkernel` |
//! | `GlobalAveragePool`, `GlobalMaxPool`, `Reduce*` | `|X|` |
//! | `Softmax`, `LogSoftmax` | `5 · |X|` |
//! | transcendental elementwise (`Exp`, `Tanh`, `Sigmoid`, `Erf`, `Gelu`, `Pow`, `Sqrt`, ...) | `4 · |Y|` |
//! | other elementwise (`Add`, `Mul`, `Relu`, `Where`, ...) | `|Y|` |
//! | data movement (`Gather`, `Transpose`, `Concat`, `Slice`, `Split`, `Pad`, ...) | 0 |
//! | views and shape arithmetic (`Reshape`, `Flatten`, `Squeeze`, `Shape`, `Constant`, ...) | 0, and 0 bytes |
//!
//! # Backward factors (documented approximations; planners use the exact kernels)
//! [`from_module`] alone uses the factors below. The cost graph the planners get
//! ([`planning_graph`]) replaces every node's backward by the kernels autodiff emits for it
//! ([`with_autodiff_backward`]), each costed like a forward op, which is how the replay of a
//! compiled program costs a backward piece; the factors remain for models autodiff refuses.
//! - matmul-like ops (`Conv`, `ConvTranspose`, `Gemm`, `MatMul`, `Einsum`): **2×** forward FLOPs
//!   (one product for the input gradient, one for the weight gradient);
//! - every other op: **1×** forward FLOPs (the local derivative costs about what the op does);
//! - ops whose inputs are all integer (index and shape arithmetic) and views: no backward work.
//!
//! # Bytes
//! Forward traffic = bytes of the activation inputs + outputs (batch-proportional) plus the
//! weights read (fixed). Backward traffic = twice the forward activation traffic (read the output
//! gradient and the saved input, write the input gradient) plus weights read and weight gradients
//! written (2× weight bytes, fixed). The node's activation is the bytes of its outputs, which is
//! also what it saves for backward (PipeDream's profiles make the same assumption).
//!
//! # Batch
//! Symbolic dims are evaluated with `AnalyticOptions::dims` (default 1 for every symbol). The
//! reference batch is the first graph input's leading dim after that substitution; batch-dependent
//! counts scale linearly from it.
//!
//! # Parameters
//! A floating-point initializer belongs to the first live op (in program order) that reads it.

use super::{CostEdge, CostGraph, CostNode, Precision, Work};
use pipec_compiler::ir::{DType, Dim, Module, Op, OpData, TensorType, Value, ValueDef};
use pipec_compiler::Result;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// Options of the analytic model.
#[derive(Clone, Debug, Default)]
pub struct AnalyticOptions {
    /// Values of symbolic dims (`batch`, `seq`); a symbol not listed counts as 1.
    pub dims: BTreeMap<String, i64>,
    /// The graph of a whole model that codegen turns into a training program: an op that does
    /// not lead to the model's first output (the one the loss reads) gets no work and no
    /// incoming edges, as codegen computes nothing else. Off for a piece of a compiled program,
    /// whose every op runs. [`planning_graph`] sets it.
    pub to_output_only: bool,
}

/// Forward/backward counts of one op at the reference batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpCost {
    pub fwd_flops: f64,
    pub bwd_flops: f64,
    pub fwd_bytes: f64,
    pub bwd_bytes: f64,
    pub weight_bytes: f64,
    pub output_bytes: f64,
}

fn dim_value(d: &Dim, env: &BTreeMap<String, i64>) -> u64 {
    match d {
        Dim::Known(v) => (*v).max(0) as u64,
        Dim::Sym(s) => {
            let mut v = s.coeff.max(0) as u64;
            for sym in &s.syms {
                v = v.saturating_mul(env.get(sym).copied().unwrap_or(1).max(0) as u64);
            }
            v
        }
    }
}

/// Static dims of a type under `env` (`None` for unranked).
fn eval_dims(ty: &TensorType, env: &BTreeMap<String, i64>) -> Option<Vec<u64>> {
    ty.shape
        .as_ref()
        .map(|s| s.iter().map(|d| dim_value(d, env)).collect())
}

fn numel(ty: &TensorType, env: &BTreeMap<String, i64>) -> f64 {
    eval_dims(ty, env).map_or(0.0, |d| d.iter().map(|&x| x as f64).product())
}

fn bytes_of(ty: &TensorType, env: &BTreeMap<String, i64>) -> f64 {
    numel(ty, env) * ty.dtype.bits() as f64 / 8.0
}

const VIEWS: &[&str] = &[
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Identity",
    "Shape",
    "Size",
    "Constant",
    "ConstantOfShape",
    "Dropout",
];

const MOVES: &[&str] = &[
    "Gather",
    "GatherElements",
    "GatherND",
    "Transpose",
    "Concat",
    "Slice",
    "Split",
    "Pad",
    "Expand",
    "Tile",
    "Cast",
    "ScatterND",
    "ScatterElements",
    "DepthToSpace",
    "SpaceToDepth",
    "Resize",
    "Range",
    "Trilu",
];

const TRANSCENDENTAL: &[&str] = &[
    "Exp",
    "Log",
    "Tanh",
    "Sigmoid",
    "Erf",
    "Gelu",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "Softplus",
    "Softsign",
    "Elu",
    "Selu",
    "HardSigmoid",
    "HardSwish",
    "Mish",
    "Sin",
    "Cos",
    "Div",
];

/// Counts for one op. `ty(v)` gives value types; `is_param(v)` tells weights apart.
pub fn op_cost(
    op: &OpData,
    ty: &dyn Fn(Value) -> TensorType,
    is_param: &dyn Fn(Value) -> bool,
    env: &BTreeMap<String, i64>,
) -> OpCost {
    let ins: Vec<(Value, TensorType)> = op.inputs.iter().flatten().map(|&v| (v, ty(v))).collect();
    let outs: Vec<TensorType> = op.outputs.iter().map(|&v| ty(v)).collect();
    let out_bytes: f64 = outs.iter().map(|t| bytes_of(t, env)).sum();
    let y = outs.first().map_or(0.0, |t| numel(t, env));
    let t = op.op_type.as_str();
    let all_int = !ins.is_empty() && ins.iter().all(|(_, t)| !t.dtype.is_float());
    let weight_bytes: f64 = ins
        .iter()
        .filter(|(v, _)| is_param(*v))
        .map(|(_, t)| bytes_of(t, env))
        .sum();
    let act_in: f64 = ins
        .iter()
        .filter(|(v, _)| !is_param(*v))
        .map(|(_, t)| bytes_of(t, env))
        .sum();
    if VIEWS.contains(&t) || (all_int && !matches!(t, "Gather" | "Embedding")) {
        return OpCost {
            output_bytes: out_bytes,
            ..Default::default()
        };
    }
    let dims_in = |i: usize| -> Vec<u64> {
        op.input(i)
            .map(|v| eval_dims(&ty(v), env).unwrap_or_default())
            .unwrap_or_default()
    };
    let x = ins.first().map_or(0.0, |(_, t)| numel(t, env));
    let mut matmul_like = false;
    let fwd_flops = match t {
        "Conv" => {
            matmul_like = true;
            let w = dims_in(1);
            let group = op.int_attr("group").unwrap_or(1).max(1) as f64;
            let c = dims_in(0).get(1).copied().unwrap_or(0) as f64;
            let k: f64 = w.iter().skip(2).map(|&d| d as f64).product();
            let bias = if op.input(2).is_some() { y } else { 0.0 };
            2.0 * y * (c / group) * k + bias
        }
        "ConvTranspose" => {
            matmul_like = true;
            // W: [C, M/group, k...]: every input element feeds M/group · Πk outputs.
            let w = dims_in(1);
            let m_per_g = w.get(1).copied().unwrap_or(0) as f64;
            let k: f64 = w.iter().skip(2).map(|&d| d as f64).product();
            2.0 * x * m_per_g * k
        }
        "Gemm" => {
            matmul_like = true;
            let a = dims_in(0);
            let trans_a = op.int_attr("transA").unwrap_or(0) != 0;
            let k = if trans_a { a.first() } else { a.get(1) };
            let k = k.copied().unwrap_or(0) as f64;
            let c = if op.input(2).is_some() { y } else { 0.0 };
            2.0 * y * k + c
        }
        "MatMul" | "MatMulInteger" | "FusedMatMul" => {
            matmul_like = true;
            let a = dims_in(0);
            let k = a.last().copied().unwrap_or(0) as f64;
            2.0 * y * k
        }
        "Einsum" => {
            matmul_like = true;
            let eq = op.str_attr("equation").unwrap_or("");
            let lhs = eq.split("->").next().unwrap_or("");
            let mut size: BTreeMap<char, u64> = BTreeMap::new();
            for (i, term) in lhs.split(',').enumerate() {
                let d = dims_in(i);
                let letters: Vec<char> = term.chars().filter(|c| c.is_ascii_alphabetic()).collect();
                // Ellipsis dims are folded into one pseudo-index per operand.
                let extra = d.len().saturating_sub(letters.len());
                if extra > 0 {
                    let e: u64 = d[..extra].iter().product();
                    let cur = size.entry('.').or_insert(1);
                    *cur = (*cur).max(e);
                }
                for (j, c) in letters.iter().enumerate() {
                    let v = d.get(extra + j).copied().unwrap_or(1);
                    let cur = size.entry(*c).or_insert(1);
                    *cur = (*cur).max(v);
                }
            }
            2.0 * size.values().map(|&v| v as f64).product::<f64>()
        }
        "BatchNormalization" | "InstanceNormalization" | "GroupNormalization" => 5.0 * x,
        "LayerNormalization" | "RMSNormalization" | "SkipLayerNormalization" => 8.0 * x,
        "MaxPool" | "AveragePool" | "LpPool" => {
            let k: f64 = op
                .ints_attr("kernel_shape")
                .map(|k| k.iter().map(|&d| d.max(1) as f64).product())
                .unwrap_or(1.0);
            y * k
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => x,
        "Softmax" | "LogSoftmax" => 5.0 * x,
        t if t.starts_with("Reduce") || t == "ArgMax" || t == "ArgMin" || t == "CumSum" => x,
        t if MOVES.contains(&t) => 0.0,
        t if TRANSCENDENTAL.contains(&t) => 4.0 * y,
        _ => y, // elementwise and anything unknown: one op per output element
    };
    let bwd_flops = if matmul_like {
        2.0 * fwd_flops
    } else {
        fwd_flops
    };
    let fwd_bytes = if t == "Gather" {
        2.0 * out_bytes // read the gathered rows, write them
    } else {
        act_in + out_bytes
    };
    OpCost {
        fwd_flops,
        bwd_flops,
        fwd_bytes,
        bwd_bytes: 2.0 * fwd_bytes,
        weight_bytes,
        output_bytes: out_bytes,
    }
}

/// The precision an op computes in: its first floating-point output or input, else f32.
fn op_precision(op: &OpData, ty: &dyn Fn(Value) -> TensorType) -> Precision {
    op.outputs
        .iter()
        .chain(op.inputs.iter().flatten())
        .map(|&v| ty(v).dtype)
        .find(|d| d.is_float())
        .map_or(Precision::of(DType::F32), Precision::of)
}

/// Side computations: ops that need no float parameter and no float activation (computed from
/// constants, integer data and shapes), plus `Shape`, `Size` and constants. Codegen duplicates
/// them into every stage that reads them instead of sending their values; the cost graph marks
/// them [`CostNode::side`].
pub fn side_ops(m: &Module) -> HashSet<Op> {
    let g = &m.graph;
    let mut heavy: HashSet<Value> = HashSet::new();
    for (v, t) in &g.initializers {
        if t.dtype.is_float() {
            heavy.insert(*v);
        }
    }
    for &v in &g.inputs {
        if g.ty(v).dtype.is_float() && !g.initializers.contains_key(&v) {
            heavy.insert(v);
        }
    }
    let mut side = HashSet::new();
    for &op in &g.order {
        let d = &g.ops[op];
        let always = matches!(
            d.op_type.as_str(),
            "Shape" | "Size" | "Constant" | "ConstantOfShape"
        );
        let reads_heavy = d.inputs.iter().flatten().any(|v| heavy.contains(v));
        if always || !reads_heavy {
            side.insert(op);
        } else {
            heavy.extend(d.outputs.iter().copied());
        }
    }
    side
}

/// The floating-point initializers of `g`: the weights the analytic model counts as fixed traffic.
fn float_initializers(g: &pipec_compiler::ir::Graph) -> HashSet<Value> {
    g.initializers
        .iter()
        .filter(|(_, t)| t.dtype.is_float())
        .map(|(v, _)| *v)
        .collect()
}

/// `(grows with the batch, does not)` of a count taken at the batch (`at`) and, where the
/// module has a symbolic dim, at twice it (`at_twice`): the difference is the part that
/// doubles, the rest is fixed. Without a second count everything counts as growing.
fn batch_split(at: f64, at_twice: Option<f64>) -> (f64, f64) {
    match at_twice {
        Some(x2) => {
            let prop = (x2 - at).max(0.0);
            (prop, (at - prop).max(0.0))
        }
        None => (at, 0.0),
    }
}

/// The forward of op `d` as a [`super::Kernel`]: what grows with the batch and what does not
/// (counted again at `env2`, every symbol doubled, when the module has a symbolic dim), plus
/// the weights it reads (a lookup reads the rows it gathers, counted in its bytes, not its
/// table).
fn forward_work(
    d: &OpData,
    ty: &dyn Fn(Value) -> TensorType,
    is_param: &dyn Fn(Value) -> bool,
    env: &BTreeMap<String, i64>,
    env2: Option<&BTreeMap<String, i64>>,
) -> super::Kernel {
    let c = op_cost(d, ty, is_param, env);
    let c2 = env2.map(|e| op_cost(d, ty, is_param, e));
    let (flops, fixed_flops) = batch_split(c.fwd_flops, c2.as_ref().map(|c2| c2.fwd_flops));
    let (bytes, fixed_act) = batch_split(c.fwd_bytes, c2.as_ref().map(|c2| c2.fwd_bytes));
    super::Kernel {
        flops,
        fixed_flops,
        bytes,
        fixed_bytes: fixed_act
            + if d.op_type == "Gather" {
                0.0
            } else {
                c.weight_bytes
            },
        precision: op_precision(d, ty),
        weight: false,
        weight_to: None,
    }
}

/// The dims of `env` with every symbol doubled, and symbols `env` leaves unbound (which count
/// as 1) bound to 2: counting at both tells what grows with the batch from what does not. The
/// flag is false when `g` has no unbound symbol (a model exported at a fixed batch).
fn doubled_dims(
    g: &pipec_compiler::ir::Graph,
    env: &BTreeMap<String, i64>,
) -> (BTreeMap<String, i64>, bool) {
    let mut env2 = env.clone();
    for v in g.values.values() {
        for d in v.ty.shape.iter().flatten() {
            if let Dim::Sym(s) = d {
                for sym in &s.syms {
                    if !env.contains_key(sym) {
                        env2.insert(sym.clone(), 2);
                    }
                }
            }
        }
    }
    let symbolic = env2.len() > env.len();
    for (sym, v) in env {
        env2.insert(sym.clone(), 2 * v);
    }
    (env2, symbolic)
}

/// Build the [`CostGraph`] of a shape-inferred module: one node per live op, edges for the
/// values ops pass each other (bytes summed per op pair). `file` names the model in errors.
pub fn from_module(m: &Module, opts: &AnalyticOptions, file: &str) -> Result<CostGraph> {
    let g = &m.graph;
    let env = &opts.dims;
    let ty = |v: Value| g.ty(v).clone();
    let param_set = float_initializers(g);
    let is_param = |v: Value| param_set.contains(&v);
    let reference_batch = g
        .inputs
        .iter()
        .find(|v| !g.initializers.contains_key(*v))
        .and_then(|&v| eval_dims(g.ty(v), env))
        .and_then(|d| d.first().copied())
        .filter(|&b| b > 0)
        .unwrap_or(1) as f64;
    let side = side_ops(m);
    let mut owned: HashSet<Value> = HashSet::new();
    // Each parameter, the node its bytes count at, and its bytes.
    let mut credited: Vec<(Value, usize, f64)> = Vec::new();
    // Per parameter (in order of first reader): its bytes and reading nodes.
    let mut readers: Vec<(Value, f64, Vec<usize>)> = Vec::new();
    let mut reader_of: HashMap<Value, usize> = HashMap::new();
    let mut index = HashMap::new();
    let mut nodes = Vec::with_capacity(g.order.len());
    let mut used_names: HashSet<String> = HashSet::new();
    // What grows with the batch and what does not, from counting at the batch and at twice it:
    // an op on a value computed from parameters alone (the LM head's `Transpose(wte)`, and the
    // `MatMul` reading it) has a forward whose cost is fixed, whatever the micro-batch.
    let (env2, symbolic) = doubled_dims(g, env);
    let alive = if opts.to_output_only {
        reaches_output(m)
    } else {
        vec![true; g.order.len()]
    };
    for (i, &op) in g.order.iter().enumerate() {
        let d = &g.ops[op];
        let (c, fwd) = if alive[i] {
            (
                op_cost(d, &ty, &is_param, env),
                forward_work(d, &ty, &is_param, env, symbolic.then_some(&env2)),
            )
        } else {
            let none = super::Kernel {
                flops: 0.0,
                fixed_flops: 0.0,
                bytes: 0.0,
                fixed_bytes: 0.0,
                precision: op_precision(d, &ty),
                weight: false,
                weight_to: None,
            };
            (OpCost::default(), none)
        };
        // Parameters: each float initializer counts once, at its first reader.
        let mut params = 0.0;
        // Readers for tied parameters: only where a gradient flows (a parameter read as, e.g., a
        // Dropout ratio or a Clip bound gets none, and codegen all-reduces nothing for it).
        let diff = crate::transforms::autodiff::rules::diff_inputs(d);
        for (slot, v) in d.inputs.iter().enumerate() {
            let Some(v) = v else { continue };
            if is_param(*v) && owned.insert(*v) {
                params += bytes_of(g.ty(*v), env);
                credited.push((*v, nodes.len(), bytes_of(g.ty(*v), env)));
            }
            if is_param(*v) && alive[i] && diff.get(slot).copied().unwrap_or(true) {
                let k = *reader_of.entry(*v).or_insert_with(|| {
                    readers.push((*v, bytes_of(g.ty(*v), env), Vec::new()));
                    readers.len() - 1
                });
                if readers[k].2.last() != Some(&nodes.len()) {
                    readers[k].2.push(nodes.len());
                }
            }
        }
        let mut name = if d.name.is_empty() {
            format!("{}_{i}", d.op_type)
        } else {
            d.name.clone()
        };
        while !used_names.insert(name.clone()) {
            name.push('_');
        }
        index.insert(op, nodes.len());
        let view = c.fwd_flops == 0.0 && c.fwd_bytes == 0.0;
        let is_side = side.contains(&op);
        nodes.push(CostNode {
            name,
            op: d.op_type.clone(),
            work: Work::Counted {
                fwd_flops: fwd.flops,
                fwd_fixed_flops: fwd.fixed_flops,
                bwd_flops: c.bwd_flops,
                fwd_bytes: fwd.bytes,
                bwd_bytes: c.bwd_bytes,
                fwd_fixed_bytes: fwd.fixed_bytes,
                bwd_fixed_bytes: 2.0 * c.weight_bytes,
                precision: op_precision(d, &ty),
                bwd_kernels: Vec::new(),
            },
            activation_bytes: if is_side { 0.0 } else { c.output_bytes },
            saved_bytes: if view || is_side { 0.0 } else { c.output_bytes },
            saved_fixed_bytes: 0.0,
            parameter_bytes: params,
            is_input: false,
            side: is_side,
        });
    }
    let live = loss_path(m);
    // Per op pair: the bytes that grow with the batch and those that do not (a value computed
    // from parameters alone), split by counting at the batch and at twice it; the outputs read;
    // whether a cotangent flows back.
    let mut acc: BTreeMap<(usize, usize), (f64, f64, u64, bool)> = BTreeMap::new();
    for &op in &g.order {
        let dst = index[&op];
        // Nothing is sent to an op the program does not compute.
        if !alive[dst] {
            continue;
        }
        let mut seen = HashSet::new();
        let diff = crate::transforms::autodiff::rules::diff_inputs(&g.ops[op]);
        for (slot, &v) in g.ops[op].inputs.iter().enumerate() {
            let Some(v) = v else { continue };
            if let ValueDef::Result(p, k) = g.values[v].def {
                if let Some(&src) = index.get(&p) {
                    if src != dst {
                        let flows = live[dst] && diff.get(slot).copied().unwrap_or(true);
                        acc.entry((src, dst)).or_default().3 |= flows;
                    }
                    if src != dst && seen.insert(v) {
                        let bit = 1u64 << k.min(63);
                        // A side value is recomputed by its reader, never sent.
                        if side.contains(&p) {
                            acc.entry((src, dst)).or_default().2 |= bit;
                            continue;
                        }
                        let (prop, fixed) = batch_split(
                            bytes_of(g.ty(v), env),
                            symbolic.then(|| bytes_of(g.ty(v), &env2)),
                        );
                        let e = acc.entry((src, dst)).or_default();
                        e.0 += prop;
                        e.1 += fixed;
                        e.2 |= bit;
                    }
                }
            }
        }
    }
    let edges = acc
        .into_iter()
        .map(
            |((src, dst), (bytes, fixed_bytes, outputs, cotangent))| CostEdge {
                src,
                dst,
                bytes,
                fixed_bytes,
                outputs,
                cotangent,
            },
        )
        .collect();
    let mut cg = CostGraph::new(g.name.clone(), reference_batch, nodes, edges, file)?;
    // A parameter no computed op differentiates (read only by ops that lead nowhere, like an
    // auxiliary head the loss does not read) gets no gradient: held, never stepped or reduced.
    cg.untrained = credited
        .into_iter()
        .filter(|(v, _, b)| !reader_of.contains_key(v) && *b > 0.0)
        .map(|(_, n, b)| (n, b))
        .collect();
    cg.data_inputs = g
        .inputs
        .iter()
        .filter(|v| !g.initializers.contains_key(*v))
        .map(|&v| super::DataInput {
            name: g.name(v).to_string(),
            bytes: bytes_of(g.ty(v), env),
            readers: g
                .order
                .iter()
                .enumerate()
                .filter(|(i, op)| alive[*i] && g.ops[**op].inputs.contains(&Some(v)))
                .map(|(i, _)| i)
                .collect(),
            saved_by: Vec::new(),
        })
        .collect();
    cg.tied = readers
        .into_iter()
        .filter(|r| r.2.len() > 1 && r.1 > 0.0)
        .map(|(v, bytes, readers)| super::TiedParameter {
            bytes,
            readers,
            name: g.name(v).to_string(),
            accumulate: Vec::new(),
            backward_readers: None,
        })
        .collect();
    Ok(cg)
}

/// Per op of `m.graph.order`: whether it leads to the model's first output (the one the loss
/// reads) through any input. Codegen computes nothing else (a stage's forward piece keeps only
/// what its sent values and the loss need, and nothing is sent to an op that leads nowhere), so
/// the cost graph gives every other op no work and no incoming edges: an LSTM's final states
/// when the loss reads its sequence output, a side computation whose result nothing reads.
fn reaches_output(m: &Module) -> Vec<bool> {
    reaches_first_output(m, |_, _| true)
}

/// Per op of `m.graph.order`: whether its outputs get a cotangent from the loss that autodiff
/// puts on the model's first output, i.e. whether the op lies on a path to that output through
/// inputs its gradient rule differentiates ([`crate::transforms::autodiff::rules::diff_inputs`]).
fn loss_path(m: &Module) -> Vec<bool> {
    reaches_first_output(m, |d, slot| {
        crate::transforms::autodiff::rules::diff_inputs(d)
            .get(slot)
            .copied()
            .unwrap_or(true)
    })
}

/// Per op of `m.graph.order`: whether a path from it reaches the producer of the model's first
/// output, entering each op only through the input slots `follow(op, slot)` accepts.
fn reaches_first_output(m: &Module, follow: impl Fn(&OpData, usize) -> bool) -> Vec<bool> {
    let g = &m.graph;
    let pos: HashMap<Op, usize> = g.order.iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut reach = vec![false; g.order.len()];
    if let Some(&i) = g
        .outputs
        .first()
        .and_then(|&v| g.producer(v))
        .and_then(|o| pos.get(&o))
    {
        reach[i] = true;
    }
    for (i, &op) in g.order.iter().enumerate().rev() {
        if !reach[i] {
            continue;
        }
        let d = &g.ops[op];
        for (slot, &v) in d.inputs.iter().enumerate() {
            let Some(v) = v else { continue };
            if !follow(d, slot) {
                continue;
            }
            if let Some(&p) = g.producer(v).and_then(|o| pos.get(&o)) {
                reach[p] = true;
            }
        }
    }
    reach
}

/// Replace the backward work of every counted node of `g` (built by [`from_module`] from `m`,
/// node `i` = op `i` of `m.graph.order`) by the kernels autodiff emits for it, so planners judge
/// the backward that codegen's stage pieces run rather than the documented factors (issue: plans
/// judged on the emitted program).
///
/// `m` is differentiated as codegen differentiates it (mean-square loss on the first output,
/// [`crate::transforms::autodiff::Autodiff::default`]); every backward op is attributed to the forward op it
/// differentiates ([`super::measured::attribute`], autodiff's `grad_of`); the loss and its
/// backward go to the node producing the first output, whose stage computes them. Each op becomes
/// one [`super::Kernel`], costed as the replay of a compiled program costs a backward piece's ops
/// (their forward counts: a backward op is what runs). Batch-proportional and fixed parts come
/// from counting at the reference batch and at twice it (every symbolic dim doubled): a weight
/// gradient's accumulation does not grow with the batch, an activation gradient does. Without a
/// symbolic dim (a model exported at a fixed batch) activations count as proportional and weights
/// as fixed, as in [`from_module`].
///
/// Each node's `saved_bytes` becomes what the emitted backward reads of the forward: every
/// forward value or graph input a backward op reads, counted once at the last node whose
/// backward reads it (not every output of every op, which the factor model assumes), except
/// through `Shape`/`Size` (codegen takes those in the forward piece). What does not grow with
/// the batch (a transposed weight) goes to `saved_fixed_bytes`.
///
/// Fails (leaving `g` unchanged) when the model cannot be differentiated; callers then keep the
/// factor model and say so.
pub fn with_autodiff_backward(g: &mut CostGraph, m: &Module, opts: &AnalyticOptions) -> Result<()> {
    use super::measured::{attribute, Role};
    use super::Kernel;
    let fwd_ops = m.graph.order.clone();
    if fwd_ops.len() != g.len() {
        return Err(pipec_compiler::Error::msg(format!(
            "the cost graph has {} nodes for {} ops",
            g.len(),
            fwd_ops.len()
        )));
    }
    let mut t = m.clone();
    let tg = crate::transforms::autodiff::differentiate(
        &mut t,
        &crate::transforms::autodiff::Autodiff::default(),
    )?;
    let roles = attribute(&t, &fwd_ops, &tg.grad_of);
    let loss_node = m
        .graph
        .outputs
        .first()
        .and_then(|&v| m.graph.producer(v))
        .and_then(|op| fwd_ops.iter().position(|&o| o == op));
    let tgr = &t.graph;
    let alive = if opts.to_output_only {
        reaches_output(m)
    } else {
        vec![true; fwd_ops.len()]
    };
    let env1 = &opts.dims;
    let (env2, symbolic) = doubled_dims(tgr, env1);
    let ty = |v: Value| tgr.ty(v).clone();
    let param_set = float_initializers(tgr);
    let is_param = |v: Value| param_set.contains(&v);
    let mut kernels: Vec<Vec<Kernel>> = vec![Vec::new(); g.len()];
    // Saved activations: the forward values (and graph inputs) that backward ops read, which
    // codegen's forward piece hands to the backward piece and the runtime keeps alive in between.
    // Each is counted at the last node (in forward order) whose backward reads it: that node's
    // stage holds it (received there when it crosses a cut). One read by the backward of several
    // nodes is also listed in `shared_saved`: a cut between its readers keeps it on both sides.
    let role_of: HashMap<Op, &Role> = tgr.order.iter().copied().zip(&roles).collect();
    // Ordered, so the sums below are the same on every run.
    let mut reader: BTreeMap<Value, BTreeSet<usize>> = BTreeMap::new();
    // The sum of a tied parameter's gradient shares (the `Add`/`Sum` under its `grad/<name>`
    // `Identity`, given to its first reader): a stage holding only some readers does not run
    // it (the all-reduce sums the shares), so it is costed on the tied parameter instead.
    let tied_names: HashMap<&str, usize> = g
        .tied
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let mut tied_sum: HashMap<Op, usize> = HashMap::new();
    for &(p, gv) in &tg.grads {
        let Some(&ti) = tied_names.get(tgr.name(p)) else {
            continue;
        };
        let mut v = gv;
        // Through the `Identity` that names the gradient.
        while let Some(op) = tgr.producer(v) {
            let d = &tgr.ops[op];
            match d.op_type.as_str() {
                "Identity" => match d.inputs.first().copied().flatten() {
                    Some(x) => v = x,
                    None => break,
                },
                "Add" | "Sum" => {
                    tied_sum.insert(op, ti);
                    break;
                }
                _ => break,
            }
        }
    }
    let mut tied_kernels: Vec<Vec<Kernel>> = vec![Vec::new(); g.tied.len()];
    // Per value the weight-gradient kernels read (not a parameter), the nodes reading it.
    let mut weight_reader: BTreeMap<(bool, Value), BTreeSet<usize>> = BTreeMap::new();
    // Weight-gradient ops (Qi et al.'s `W`): backward ops of a node whose results reach only
    // parameter gradients (directly, through the node's own backward ops, through a tied
    // parameter's sum, or as a value with no batch axis through another node's weight-gradient
    // ops), never the input gradient of another node, the loss or a gradient of a data input:
    // one sweep against the order.
    // Per weight-gradient op whose result goes on to another node's (a batch-free value), that
    // node, inherited by the node's own weight-gradient ops that feed it.
    let mut weight_to: HashMap<Op, usize> = HashMap::new();
    let weight_ops: HashSet<Op> = {
        let uses = tgr.uses();
        let param_grads: HashSet<Value> = tg
            .grads
            .iter()
            .filter(|(p, _)| is_param(*p))
            .map(|&(_, gv)| gv)
            .collect();
        let outputs: HashSet<Value> = tgr.outputs.iter().copied().collect();
        let mut w: HashSet<Op> = HashSet::new();
        for &op in tgr.order.iter().rev() {
            let Some(Role::Bwd(n)) = role_of.get(&op).copied() else {
                continue;
            };
            let n = *n;
            let mut reaches_grad = false;
            let mut to: Option<usize> = None;
            let only_grads = tgr.ops[op].outputs.iter().all(|&v| {
                if outputs.contains(&v) {
                    if !param_grads.contains(&v) {
                        return false;
                    }
                    reaches_grad = true;
                }
                // A value with no batch axis (the cotangent of a weight's transpose, read by
                // a per-step matmul) may go on to another node's weight-gradient ops.
                let batch_free =
                    symbolic && bytes_of(tgr.ty(v), env1) == bytes_of(tgr.ty(v), &env2);
                uses[v].iter().all(|&(c, _)| {
                    let ok = tied_sum.contains_key(&c)
                        || (matches!(role_of.get(&c), Some(Role::Bwd(m)) if *m == n || batch_free)
                            && w.contains(&c));
                    // (A tied parameter's sum is all-reduced, not sent: no export.)
                    if ok && !tied_sum.contains_key(&c) {
                        match role_of.get(&c) {
                            Some(Role::Bwd(m)) if *m != n => to = Some(*m),
                            _ => to = to.or(weight_to.get(&c).copied()),
                        }
                    }
                    reaches_grad |= ok;
                    ok
                })
            });
            if only_grads && reaches_grad {
                w.insert(op);
                if let Some(m) = to {
                    weight_to.insert(op, m);
                }
            }
        }
        w
    };
    let sums: HashMap<Op, &[Option<Op>]> = tg
        .cotangent_sums
        .iter()
        .map(|c| (c.op, c.from.as_slice()))
        .collect();
    let mut cotangent_sums: Vec<super::CotangentSum> = Vec::new();
    let mut loss_forward: Vec<Kernel> = Vec::new();
    // The forward as the training graph runs it: autodiff may change a forward op (a `MaxPool`
    // also returns its indices, which its backward reads), and the forward piece runs that op.
    let mut forward: Vec<Option<super::Kernel>> = vec![None; g.len()];
    for (&op, role) in tgr.order.iter().zip(&roles) {
        let node = match role {
            Role::Bwd(n) => *n,
            Role::Loss | Role::Other => match loss_node {
                Some(n) => n,
                None => continue,
            },
            Role::Fwd(n) => {
                let d = &tgr.ops[op];
                if d.outputs.len() != m.graph.ops[fwd_ops[*n]].outputs.len() && alive[*n] {
                    forward[*n] = Some(forward_work(
                        d,
                        &ty,
                        &is_param,
                        env1,
                        symbolic.then_some(&env2),
                    ));
                }
                continue;
            }
        };
        // Codegen takes a `Shape` / `Size` of a forward value in the forward piece: the backward
        // keeps the few integers (saved by every micro-batch, like any forward value it reads),
        // not the value.
        let shape_only = matches!(tgr.ops[op].op_type.as_str(), "Shape" | "Size");
        if shape_only {
            for &o in &tgr.ops[op].outputs {
                reader.entry(o).or_default().insert(node);
            }
        }
        for &v in tgr.ops[op].inputs.iter().flatten().filter(|_| !shape_only) {
            let forward = match tgr.values[v].def {
                ValueDef::Result(p, _) => match role_of.get(&p) {
                    Some(Role::Fwd(n)) => !g.nodes[*n].side,
                    _ => false,
                },
                _ => tgr.inputs.contains(&v) && !tgr.initializers.contains_key(&v),
            };
            if forward {
                reader.entry(v).or_default().insert(node);
            }
        }
        let d = &tgr.ops[op];
        let c1 = op_cost(d, &ty, &is_param, env1);
        let (flops, fixed_flops, bytes, fixed_bytes) = if symbolic {
            let c2 = op_cost(d, &ty, &is_param, &env2);
            let (f, ff) = batch_split(c1.fwd_flops, Some(c2.fwd_flops));
            let (b, fb) = batch_split(
                c1.fwd_bytes + c1.weight_bytes,
                Some(c2.fwd_bytes + c2.weight_bytes),
            );
            (f, ff, b, fb)
        } else {
            (c1.fwd_flops, 0.0, c1.fwd_bytes, c1.weight_bytes)
        };
        if weight_ops.contains(&op) {
            // What the weight-gradient part reads besides parameters: forward values and
            // what the input-gradient part computed.
            for &v in tgr.ops[op].inputs.iter().flatten() {
                // Carried: made by the input-gradient part; else a saved forward value.
                let held = match tgr.values[v].def {
                    ValueDef::Result(p, _) if weight_ops.contains(&p) => None,
                    ValueDef::Result(p, _) => Some(!matches!(role_of.get(&p), Some(Role::Fwd(_)))),
                    _ => (!is_param(v)).then_some(false),
                };
                if let Some(carried) = held {
                    weight_reader.entry((carried, v)).or_default().insert(node);
                }
            }
        }
        if flops + fixed_flops + bytes + fixed_bytes == 0.0 {
            continue;
        }
        // The loss's own forward ops run in the forward piece (their backward in the backward).
        let loss_fwd = matches!(role, Role::Loss) && !tg.grad_of.contains_key(&op);
        let kernel = Kernel {
            flops,
            fixed_flops,
            bytes,
            fixed_bytes,
            precision: op_precision(d, &ty),
            weight: weight_ops.contains(&op),
            weight_to: weight_to.get(&op).copied(),
        };
        if let (Some(from), Role::Bwd(_), None) = (sums.get(&op), role, tied_sum.get(&op)) {
            let from = from
                .iter()
                .map(|f| {
                    f.and_then(|f| match role_of.get(&f) {
                        Some(Role::Fwd(n)) => Some(*n),
                        Some(Role::Loss) => loss_node,
                        _ => None,
                    })
                })
                .collect();
            cotangent_sums.push(super::CotangentSum {
                producer: node,
                from,
                kernel: kernel.clone(),
            });
        }
        let to = match tied_sum.get(&op) {
            Some(&ti) => &mut tied_kernels[ti],
            None if loss_fwd => &mut loss_forward,
            None => &mut kernels[node],
        };
        to.push(kernel);
    }
    // Split like the kernels: the part that doubles with the batch, and the rest (a value
    // computed from parameters alone is saved whole by every micro-batch).
    g.cotangent_sums = cotangent_sums;
    let by_name = tgr.values_by_name();
    for di in &mut g.data_inputs {
        if let Some(r) = by_name.get(di.name.as_str()).and_then(|v| reader.get(v)) {
            di.saved_by = r.iter().copied().collect();
        }
    }
    let mut held = vec![[0.0; 4]; g.len()];
    let mut held_shared = Vec::new();
    for ((carried, v), readers) in weight_reader {
        let (prop, fixed) = batch_split(
            bytes_of(tgr.ty(v), env1),
            symbolic.then(|| bytes_of(tgr.ty(v), &env2)),
        );
        match readers.len() {
            0 => {}
            1 => {
                let n = readers.into_iter().next().unwrap_or(0);
                let k = if carried { 2 } else { 0 };
                held[n][k] += prop;
                held[n][k + 1] += fixed;
            }
            _ => held_shared.push(super::HeldValue {
                carried,
                bytes: prop,
                fixed_bytes: fixed,
                readers: readers.into_iter().collect(),
            }),
        }
    }
    g.weight_held = held;
    g.weight_held_shared = held_shared;
    let mut saved = vec![(0.0, 0.0); g.len()];
    let mut shared = Vec::new();
    for (v, readers) in reader {
        let Some(&n) = readers.last() else { continue };
        let (prop, fixed) = batch_split(
            bytes_of(tgr.ty(v), env1),
            symbolic.then(|| bytes_of(tgr.ty(v), &env2)),
        );
        saved[n].0 += prop;
        saved[n].1 += fixed;
        if readers.len() > 1 && prop + fixed > 0.0 {
            shared.push(super::SharedSaved {
                bytes: prop,
                fixed_bytes: fixed,
                readers: readers.into_iter().collect(),
            });
        }
    }
    g.shared_saved = shared;
    for (node, (prop, fixed)) in g.nodes.iter_mut().zip(saved) {
        node.saved_bytes = prop;
        node.saved_fixed_bytes = fixed;
    }
    for (t, ks) in g.tied.iter_mut().zip(tied_kernels) {
        t.accumulate = ks;
    }
    if loss_node.is_some() {
        g.loss_forward = loss_forward;
        g.loss_node = loss_node;
    }
    for ((node, ks), fk) in g.nodes.iter_mut().zip(kernels).zip(forward) {
        if let Work::Counted {
            fwd_flops,
            fwd_fixed_flops,
            fwd_bytes,
            fwd_fixed_bytes,
            bwd_flops,
            bwd_bytes,
            bwd_fixed_bytes,
            bwd_kernels,
            ..
        } = &mut node.work
        {
            if let Some(k) = fk {
                *fwd_flops = k.flops;
                *fwd_fixed_flops = k.fixed_flops;
                *fwd_bytes = k.bytes;
                *fwd_fixed_bytes = k.fixed_bytes;
            }
            *bwd_flops = ks.iter().map(|k| k.flops).sum();
            *bwd_bytes = ks.iter().map(|k| k.bytes).sum();
            *bwd_fixed_bytes = ks.iter().map(|k| k.fixed_bytes).sum();
            *bwd_kernels = ks;
        }
    }
    // Parameters read after the forward, by every op that is not a forward op (conservative:
    // the loss's too), with the nodes whose backward ops read them.
    let mut read_after_forward: HashMap<Value, BTreeSet<usize>> = HashMap::new();
    for (&op, role) in tgr.order.iter().zip(&roles) {
        if matches!(role, Role::Fwd(_)) {
            continue;
        }
        for &v in tgr.ops[op].inputs.iter().flatten() {
            if is_param(v) {
                let readers = read_after_forward.entry(v).or_default();
                if let Role::Bwd(n) = role {
                    readers.insert(*n);
                }
            }
        }
    }
    // Trainable parameters no such op reads, at the node that counts their bytes (the first
    // forward op reading them): weight stashing need not copy them, since the forward reads
    // them before any later step.
    let mut first_reader: HashMap<Value, usize> = HashMap::new();
    for (n, &op) in fwd_ops.iter().enumerate() {
        for &v in m.graph.ops[op].inputs.iter().flatten() {
            first_reader.entry(v).or_insert(n);
        }
    }
    g.forward_only_params = tg
        .grads
        .iter()
        .filter(|&&(p, _)| is_param(p) && !read_after_forward.contains_key(&p))
        .filter_map(|&(p, _)| Some((*first_reader.get(&p)?, bytes_of(tgr.ty(p), env1))))
        .filter(|&(_, b)| b > 0.0)
        .collect();
    // Per tied parameter, the nodes whose backward reads it.
    let by_name: HashMap<&str, &BTreeSet<usize>> = read_after_forward
        .iter()
        .map(|(&v, r)| (tgr.name(v), r))
        .collect();
    for t in g.tied.iter_mut() {
        let readers = by_name.get(t.name.as_str());
        t.backward_readers = Some(
            readers
                .map(|r| r.iter().copied().collect())
                .unwrap_or_default(),
        );
    }
    Ok(())
}

/// The cost graph planners use for an ONNX model: [`from_module`] with the backward of
/// [`with_autodiff_backward`]. When the model cannot be differentiated the documented factors
/// stay and the returned note says why (the CLI prints it as a warning).
pub fn planning_graph(
    m: &Module,
    opts: &AnalyticOptions,
    file: &str,
) -> Result<(CostGraph, Option<String>)> {
    let opts = &AnalyticOptions {
        to_output_only: true,
        ..opts.clone()
    };
    let mut g = from_module(m, opts, file)?;
    let note = with_autodiff_backward(&mut g, m, opts).err().map(|e| {
        format!("{file}: backward costs use fixed factors (autodiff of the model failed: {e})")
    });
    Ok((g, note))
}
