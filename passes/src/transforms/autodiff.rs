//! `autodiff`: turns a forward (inference) graph into a training graph: forward, loss, backward
//! (reverse-mode differentiation), all in standard ONNX ops of the default domain.
//!
//! - **Requires**: default-domain opset >= 13 (axes as inputs of `ReduceSum`/`Squeeze`/
//!   `Unsqueeze`; MaxPool and Gather gradients use `ScatterND` with `reduction = add`, opset >= 16);
//!   a module of opset 7..12 is first upgraded to 17 (`pipec_compiler::onnx::upgrade`, which the
//!   CLI's front end applies on import to every opset below 17);
//!   a topological `order`. Shape inference runs first (ranks of the forward values are needed;
//!   Conv and pool gradients need static channel and spatial dims; the batch may be symbolic).
//! - **Guarantees**: a loss op chain ([`crate::transforms::loss`], option `loss`) on the first output, then,
//!   in reverse program order, the gradient rule of every op on a path from a parameter to the
//!   loss ([`rules`], [`conv`], [`norm`]; each file cites its equations). Parameters are the
//!   floating-point initializers (and, with `wrt_inputs`, the floating-point graph inputs) the
//!   loss depends on through differentiable operands: integer values, `Shape`, comparisons,
//!   casts to integers, Gather/Scatter indices, BatchNormalization running statistics are cut.
//!   Gradients of a value used several times are summed (`Add`/`Sum`). Graph outputs become
//!   `[loss, original outputs..., grad/<param>...]`, the gradient of parameter `P` named
//!   `grad/P`, in initializer order. Result types are re-inferred; the module verifies.
//! - **Annotations**: every op gets `pipec.phase` = `fwd` | `loss` | `bwd`; forward ops whose
//!   results the backward reads get `pipec.saved` = indices of those results (the saved
//!   activations; uses through `Shape`/`Size` only need metadata and are not counted). Module
//!   attrs: `pipec.loss` (name of the loss value), `pipec.params` and `pipec.grads` (parallel
//!   lists of names), `pipec.saved` (names of all saved forward values, graph inputs included).
//!   MaxPool ops get their optional `Indices` result when the backward needs it.
//! - **Fails** with the node name and op type when an op on a path from a parameter to the loss
//!   has no gradient rule, or a rule's preconditions (static spatial dims, constant slice bounds,
//!   ...) do not hold.
//! - **Invalidates**: graph outputs, op results of MaxPool (one more), everything keyed by op.
//! - **Statistics**: `params`, `forward-ops`, `backward-ops`, `saved-values`.
//! - **Options**: [`Autodiff::with_loss`] (default `mean-square`), [`Autodiff::wrt_inputs`].

pub mod activations;
pub mod builder;
pub mod conv;
mod extra;
pub mod norm;
pub mod pad;
pub mod rules;

use crate::transforms::loss::{add_loss, LossKind};
use builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Attr, Module, Op, Value, ValueDef};
use pipec_compiler::passmgr::{OptionKind, PassInfo, PassOption};
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_compiler::Result;
use std::collections::{HashMap, HashSet};

/// The `autodiff` pass and its options.
#[derive(Clone, Debug)]
pub struct Autodiff {
    /// The loss put on the first output; `None`: the first output already is a 0-D loss.
    pub loss: Option<LossKind>,
    /// Also differentiate with respect to floating-point graph inputs (`grad/<input>`).
    pub wrt_inputs: bool,
    /// With `wrt_inputs`: only the graph inputs with these names (codegen differentiates a
    /// stage with respect to the activations it receives, not its data or cotangent inputs).
    pub wrt_only: Option<Vec<String>>,
    /// Cotangent seeds `(value, cotangent input)`: the backward adds each cotangent to its
    /// value's gradient, as if the loss had a term `Σ value ⊙ cotangent` but without computing
    /// that term (codegen seeds a stage's backward with the cotangents of what it sends, and the
    /// backward then reads no sent value it does not need).
    pub seeds: Vec<(String, String)>,
}

impl Default for Autodiff {
    fn default() -> Self {
        Autodiff {
            loss: Some(LossKind::MeanSquare),
            wrt_inputs: false,
            wrt_only: None,
            seeds: Vec::new(),
        }
    }
}

impl Autodiff {
    /// With the given loss (`None`: use output 0 as the loss).
    pub fn with_loss(loss: Option<LossKind>) -> Self {
        Autodiff {
            loss,
            ..Default::default()
        }
    }
    /// Also produce gradients for floating-point graph inputs.
    pub fn wrt_inputs(mut self, yes: bool) -> Self {
        self.wrt_inputs = yes;
        self
    }
}

/// Op types with a gradient rule (those whose operands carry no gradient, such as `Shape`,
/// comparisons or `ArgMax`, need none). Kept in step with the match arms of [`rules::grad`],
/// [`extra::extra_grad`] and [`activations::OPS`] by a unit test.
pub const GRAD_OPS: &[&str] = &[
    "Abs",
    "Add",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "Celu",
    "Clip",
    "Concat",
    "Conv",
    "ConvTranspose",
    "Cos",
    "CumSum",
    "Div",
    "Dropout",
    "Einsum",
    "Elu",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Gather",
    "GatherElements",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "GroupNormalization",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "InstanceNormalization",
    "LayerNormalization",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "MaxPool",
    "Mean",
    "Min",
    "Mish",
    "Mul",
    "Neg",
    "PRelu",
    "Pad",
    "Pow",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "ScatterND",
    "Selu",
    "Sigmoid",
    "Sin",
    "Slice",
    "Softmax",
    "Softplus",
    "Softsign",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "ThresholdedRelu",
    "Tile",
    "Transpose",
    "Unsqueeze",
    "Where",
];

/// The refusal of an op without a gradient rule on the path from a parameter to the loss.
fn no_rule(node: &str, op_type: &str, via: &str) -> Error {
    let via = if via.is_empty() {
        String::new()
    } else {
        format!(" through its operand '{via}'")
    };
    Error::node(
        node,
        op_type,
        format!(
            "autodiff: no gradient rule for op type '{op_type}', and the loss depends on a \
             parameter{via} (the node is on the path from a parameter to the loss). \
             To train it: export the model with '{op_type}' decomposed into ops that have \
             rules (another exporter opset or a different module), or export the parameters \
             before it as constants (Constant nodes are not trained), or file an issue asking \
             for a '{op_type}' rule. Ops with gradient rules: {}",
            GRAD_OPS.join(", ")
        ),
    )
}

/// What [`differentiate`] built.
#[derive(Clone, Debug, Default)]
pub struct TrainingGraph {
    /// The 0-D loss value.
    pub loss: Option<Value>,
    /// `(parameter, its gradient)` in initializer order (then inputs).
    pub grads: Vec<(Value, Value)>,
    /// Forward values the backward reads.
    pub saved: Vec<Value>,
    /// Op counts.
    pub forward_ops: usize,
    pub backward_ops: usize,
    /// For every backward op, the forward op it belongs to: the ops of that op's gradient rule,
    /// the accumulation (`Add`/`Sum`) of the gradients of its results, and, for a parameter,
    /// the accumulation of the parameter's gradient and its `grad/<param>` `Identity` (given to
    /// the parameter's first reader, the node that owns the parameter in the cost graph).
    /// Backward ops not in the map: the seed constant `dL/dL = 1`. `pipec profile` uses it to
    /// attribute backward time to forward nodes; unlike the `<node>/grad` name prefix, it does
    /// not depend on forward node names being present and unique.
    pub grad_of: HashMap<Op, Op>,
    /// Every accumulation of a forward value's cotangent from several contributions (the
    /// `Add`/`Sum` of [`TrainingGraph::grad_of`] that sums the cotangents of one result):
    /// the summing op and, per contribution, the forward op whose gradient rule made it (`None`
    /// for a seed). A pipeline places this sum where the contributions meet, which is not
    /// always the producer's stage.
    pub cotangent_sums: Vec<CotangentSum>,
}

/// See [`TrainingGraph::cotangent_sums`].
#[derive(Clone, Debug, PartialEq)]
pub struct CotangentSum {
    pub op: Op,
    pub from: Vec<Option<Op>>,
}

/// The contract of `autodiff` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "autodiff",
    summary: "adds a loss and the backward pass (reverse-mode gradients of the parameters) in standard ONNX ops",
    options: &[
        PassOption {
            name: "loss",
            kind: OptionKind::Text,
            default: "mean-square",
            help: "the loss on the first output: mean-square, sum, cross-entropy:LABEL_INPUT, or none (the first output is the 0-D loss)",
        },
        PassOption {
            name: "wrt-inputs",
            kind: OptionKind::Bool,
            default: "false",
            help: "also differentiate with respect to the float graph inputs",
        },
    ],
    statistics: &["backward-ops", "forward-ops", "params", "saved-values"],
    requires: &[],
    provides: &["pipec.loss", "pipec.params", "pipec.grads", "pipec.saved"],
    invalidates: &["pipec.stages"],
};

impl Pass for Autodiff {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()> {
        let t = differentiate(module, self)?;
        stats.add("params", t.grads.len() as u64);
        stats.add("forward-ops", t.forward_ops as u64);
        stats.add("backward-ops", t.backward_ops as u64);
        stats.add("saved-values", t.saved.len() as u64);
        Ok(())
    }
}

/// Build the training graph in place (see the module doc).
pub fn differentiate(m: &mut Module, opts: &Autodiff) -> Result<TrainingGraph> {
    if (1..13).contains(&m.opset()) {
        // Older forms (Softmax's 2-D coercion, axes attributes): upgrade as on import.
        pipec_compiler::shape::infer_shapes(m)?;
        pipec_compiler::onnx::upgrade::upgrade_opset(m)?;
    }
    let opset = match m.opset() {
        0 => 17,
        v => v,
    };
    if opset < 13 {
        return Err(Error::msg(format!(
            "autodiff needs default-domain opset >= 13 (the model has {opset})"
        )));
    }
    pipec_compiler::shape::infer_shapes(m)?;
    let fwd_count = m.graph.order.len();
    for &op in &m.graph.order {
        m.graph.ops[op]
            .attrs
            .insert("pipec.phase".into(), Attr::String("fwd".into()));
    }
    let orig_outputs = m.graph.outputs.clone();
    let loss = match &opts.loss {
        Some(k) => {
            let l = add_loss(m, k)?;
            // The backward reads the ranks of the loss ops' values.
            pipec_compiler::shape::infer_shapes(m)?;
            l
        }
        None => {
            let l = *orig_outputs
                .first()
                .ok_or_else(|| Error::msg("the model has no outputs"))?;
            let t = m.graph.ty(l);
            if !t.dtype.is_float() || t.rank() != Some(0) {
                return Err(Error::named(
                    m.graph.name(l),
                    "with no loss option the first output must be a floating-point scalar",
                ));
            }
            l
        }
    };
    let label: Option<Value> = match &opts.loss {
        Some(LossKind::CrossEntropy(n)) => m
            .graph
            .inputs
            .iter()
            .copied()
            .find(|v| m.graph.name(*v) == n),
        _ => None,
    };
    // Shape arithmetic the rules read as constants (Slice bounds, Pad pads, Tile repeats) is
    // often `Shape -> Gather -> ...` of a value with a symbolic batch: known exactly, not folded.
    let (_, known) = pipec_compiler::shape::infer_shapes_with_values(m)?;
    let order: Vec<Op> = m.graph.order.clone();
    let g = &m.graph;

    // Parameters.
    let mut params: Vec<Value> = g
        .initializers
        .keys()
        .copied()
        .filter(|v| g.ty(*v).dtype.is_float())
        .collect();
    if opts.wrt_inputs {
        params.extend(g.inputs.iter().copied().filter(|v| {
            g.ty(*v).dtype.is_float()
                && Some(*v) != label
                && opts
                    .wrt_only
                    .as_ref()
                    .is_none_or(|names| names.iter().any(|n| n == g.name(*v)))
        }));
    }
    // Values that depend on a parameter through differentiable operands.
    let mut varied: HashSet<Value> = params.iter().copied().collect();
    let mut diff: HashMap<Op, Vec<bool>> = HashMap::new();
    for &op in &order {
        let d = &g.ops[op];
        let di = rules::diff_inputs(d);
        let hit = d
            .inputs
            .iter()
            .enumerate()
            .any(|(i, v)| di[i] && v.is_some_and(|v| varied.contains(&v)));
        if hit {
            for &o in &d.outputs {
                if g.ty(o).dtype.is_float() {
                    varied.insert(o);
                }
            }
        }
        diff.insert(op, di);
    }
    let names = if opts.seeds.is_empty() {
        HashMap::new()
    } else {
        g.values_by_name()
    };
    let by_name = |n: &str| {
        names
            .get(n)
            .copied()
            .ok_or_else(|| Error::named(n, "autodiff: no such value to seed"))
    };
    let mut seeds: Vec<(Value, Value)> = Vec::with_capacity(opts.seeds.len());
    for (v, c) in &opts.seeds {
        seeds.push((by_name(v)?, by_name(c)?));
    }
    // Values the loss (and the seeded values) depend on through differentiable operands.
    let mut useful: HashSet<Value> = HashSet::from([loss]);
    useful.extend(seeds.iter().map(|s| s.0));
    for &op in order.iter().rev() {
        let d = &g.ops[op];
        if d.outputs.iter().any(|o| useful.contains(o)) {
            for (i, v) in d.inputs.iter().enumerate() {
                if let (true, Some(v)) = (diff[&op][i], v) {
                    useful.insert(*v);
                }
            }
        }
    }
    let active = |v: Value| varied.contains(&v) && useful.contains(&v);

    let mut b = Builder::new(&mut m.graph, "bwd");
    b.known = known;
    let mut contrib: HashMap<Value, Vec<Value>> = HashMap::new();
    // Per value: the forward op that made each contribution (`None`: a seed).
    let mut contrib_from: HashMap<Value, Vec<Option<Op>>> = HashMap::new();
    let mut cotangent_sums: Vec<CotangentSum> = Vec::new();
    let dt = b.dt(loss);
    let seed = b.scalar(dt, 1.0)?;
    contrib.insert(loss, vec![seed]);
    contrib_from.insert(loss, vec![None]);
    for &(v, c) in &seeds {
        contrib.entry(v).or_default().push(c);
        contrib_from.entry(v).or_default().push(None);
    }
    let take = |b: &mut Builder, contrib: &mut HashMap<Value, Vec<Value>>, v: Value| {
        contrib.remove(&v).map(|vs| b.sum(&vs))
    };
    for &op in order.iter().rev() {
        b.grad_of = Some(op);
        let outs = b.g.ops[op].outputs.clone();
        let mut dys = Vec::with_capacity(outs.len());
        for &o in &outs {
            dys.push(if active(o) {
                let from = contrib_from.remove(&o).unwrap_or_default();
                let dy = take(&mut b, &mut contrib, o);
                if from.len() > 1 {
                    if let Some(op) = dy.and_then(|v| b.g.producer(v)) {
                        cotangent_sums.push(CotangentSum { op, from });
                    }
                }
                dy
            } else {
                None
            });
        }
        if dys.iter().all(Option::is_none) {
            continue;
        }
        let d = &b.g.ops[op];
        let need: Vec<bool> = d
            .inputs
            .iter()
            .enumerate()
            .map(|(i, v)| diff[&op][i] && v.is_some_and(active))
            .collect();
        if !need.iter().any(|x| *x) {
            continue;
        }
        let (name, op_type, inputs) = (d.name.clone(), d.op_type.clone(), d.inputs.clone());
        b.prefix = format!("{name}/grad");
        let gs = rules::grad(&mut b, op, &dys, &need, opset)?.ok_or_else(|| {
            let via = need
                .iter()
                .zip(&inputs)
                .find_map(|(n, v)| v.filter(|_| *n))
                .map(|v| b.g.name(v).to_string())
                .unwrap_or_default();
            no_rule(&name, &op_type, &via)
        })?;
        for (i, needed) in need.iter().enumerate() {
            if !needed {
                continue;
            }
            let (Some(v), Some(gv)) = (inputs[i], gs.get(i).copied().flatten()) else {
                return Err(Error::node(
                    &name,
                    &op_type,
                    format!("autodiff: the gradient rule gave no gradient for operand {i}"),
                ));
            };
            contrib.entry(v).or_default().push(gv);
            contrib_from.entry(v).or_default().push(Some(op));
        }
    }
    // Gradients of the parameters, named `grad/<param>`.
    b.prefix = String::new();
    b.grad_of = None;
    let made: HashSet<Value> = b
        .made
        .iter()
        .flat_map(|o| b.g.ops[*o].outputs.clone())
        .collect();
    let mut renamed: HashSet<Value> = HashSet::new();
    let mut grads = Vec::new();
    for &p in &params {
        b.grad_of = order
            .iter()
            .copied()
            .find(|&o| b.g.ops[o].inputs.contains(&Some(p)));
        let Some(gv) = take(&mut b, &mut contrib, p) else {
            continue;
        };
        let want = format!("grad/{}", b.g.name(p));
        let name = b.fresh(&want);
        let gv = if made.contains(&gv)
            && !renamed.contains(&gv)
            && b.g
                .producer(gv)
                .is_some_and(|o| b.g.ops[o].op_type != "Constant")
        {
            b.g.values[gv].name = name;
            gv
        } else {
            let dtp = b.dt(gv);
            let v = b.op1("Identity", &[gv], vec![], dtp);
            b.g.values[v].name = name;
            v
        };
        renamed.insert(gv);
        grads.push((p, gv));
    }
    let grad_of: HashMap<Op, Op> = b
        .made
        .iter()
        .zip(&b.origins)
        .filter_map(|(&o, f)| f.map(|f| (o, f)))
        .collect();
    let bwd_ops: HashSet<Op> = b.made.iter().copied().collect();
    let backward_ops = b.made.len();
    let g = &mut m.graph;
    let mut outputs = vec![loss];
    outputs.extend(orig_outputs.iter().copied().filter(|v| *v != loss));
    outputs.extend(grads.iter().map(|(_, gv)| *gv));
    g.outputs = outputs;

    // Saved activations: forward values read by backward ops (not only through Shape/Size).
    let mut saved_set: HashSet<Value> = HashSet::new();
    let mut saved = Vec::new();
    for &op in &g.order {
        if !bwd_ops.contains(&op) {
            continue;
        }
        let d = &g.ops[op];
        if matches!(d.op_type.as_str(), "Shape" | "Size") {
            continue;
        }
        for v in d.inputs.iter().flatten() {
            let fwd = match g.values[*v].def {
                ValueDef::Input(_) => true,
                ValueDef::Initializer => false,
                ValueDef::Result(p, _) => !bwd_ops.contains(&p) && g.ops[p].op_type != "Constant",
            };
            if fwd && saved_set.insert(*v) {
                saved.push(*v);
            }
        }
    }
    let mut per_op: HashMap<Op, Vec<i64>> = HashMap::new();
    for &v in &saved {
        if let ValueDef::Result(p, k) = g.values[v].def {
            per_op.entry(p).or_default().push(k as i64);
        }
    }
    for (op, mut ks) in per_op {
        ks.sort_unstable();
        g.ops[op].attrs.insert("pipec.saved".into(), Attr::Ints(ks));
    }
    let names = |vs: &mut dyn Iterator<Item = Value>| -> Vec<String> {
        vs.map(|v| g.name(v).to_string()).collect()
    };
    let attrs = vec![
        ("pipec.loss", Attr::String(g.name(loss).to_string())),
        (
            "pipec.params",
            Attr::Strings(names(&mut grads.iter().map(|x| x.0))),
        ),
        (
            "pipec.grads",
            Attr::Strings(names(&mut grads.iter().map(|x| x.1))),
        ),
        (
            "pipec.saved",
            Attr::Strings(names(&mut saved.iter().copied())),
        ),
    ];
    for (k, v) in attrs {
        m.attrs.insert(k.to_string(), v);
    }
    pipec_compiler::shape::infer_shapes(m)?;
    Ok(TrainingGraph {
        loss: Some(loss),
        grads,
        saved,
        forward_ops: fwd_count,
        backward_ops,
        grad_of,
        cotangent_sums,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Capitalised string literals that open a line (match arms) of `src` between `from` and
    /// `to`.
    fn arms(src: &str, from: &str, to: &str) -> Vec<String> {
        let a = src.find(from).expect("start marker");
        let e = a + src[a..].find(to).expect("end marker");
        let mut out = Vec::new();
        let lines: Vec<&str> = src[a..e].lines().map(str::trim_start).collect();
        for (k, t) in lines.iter().enumerate() {
            // A pattern line: it ends in `=>`, or the pattern goes on with `| ...` below.
            let pattern =
                t.contains("=>") || lines.get(k + 1).is_some_and(|n| n.starts_with("| \""));
            if !(t.starts_with('"') || t.starts_with("| \"")) || !pattern {
                continue;
            }
            for (i, part) in t.split('"').enumerate() {
                if i % 2 == 1 && part.starts_with(|c: char| c.is_ascii_uppercase()) {
                    out.push(part.to_string());
                }
            }
        }
        out
    }

    #[test]
    fn grad_ops_lists_every_rule() {
        let mut found = arms(
            include_str!("autodiff/rules.rs"),
            "pub fn grad(",
            "fn matmul_grads",
        );
        found.extend(arms(
            include_str!("autodiff/extra.rs"),
            "fn extra_grad(",
            "Ok(Some(out))",
        ));
        found.extend(activations::OPS.iter().map(|s| s.to_string()));
        assert!(found.len() > 60, "{found:?}");
        for op in &found {
            assert!(
                GRAD_OPS.contains(&op.as_str()),
                "{op} has a rule but is not in GRAD_OPS"
            );
        }
        for op in GRAD_OPS {
            assert!(
                found.iter().any(|f| f == op),
                "{op} is in GRAD_OPS but has no rule"
            );
        }
        let mut sorted = GRAD_OPS.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, GRAD_OPS, "GRAD_OPS is sorted");
    }
}
