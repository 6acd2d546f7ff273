//! `lower`: rewrites ops that have neither a reference kernel nor a gradient rule into standard
//! ops that have both, so a model using them can be executed and trained with no new kernel.
//!
//! - **Requires**: a topological `order`; shape inference runs first. The rewrites need static
//!   dims where they unroll or build constants (the sequence length of an RNN, the resized axes of
//!   a `Resize`); the batch may stay symbolic.
//! - **Guarantees**: every `Loop` with a static trip count is unrolled, a `Loop` over the
//!   equal-sized bags of an `EmbeddingBag` becomes one `Gather` and a reduction ([`bag`]), and every `If` with a
//!   constant condition inlined ([`control`]; repeatedly, for nested control flow); every `LSTM` and `GRU` ([`rnn`]) becomes MatMul/Add/Mul/Sub/Sigmoid/Tanh/
//!   Relu/Slice/Squeeze/Unsqueeze/Concat/Transpose ops unrolled over the sequence; every
//!   `Resize` / `Upsample` ([`resize`]) becomes one `MatMul` per resized axis with a constant
//!   interpolation matrix. The results keep the names of the values they replace, so graph
//!   outputs and values named elsewhere (stage boundaries, `--inputs` files) still resolve.
//!   Result types are re-inferred; the module verifies. Other ops are left alone.
//! - **Fails** with the node name and op type when an op of these kinds uses a form the rewrite
//!   does not cover (a loop with a dynamic trip count or an early exit, an `If` on data, a dynamic sequence length, `sequence_lens` shorter than the sequence,
//!   `input_forget`, an activation other than Sigmoid/Tanh/Relu, a Resize mode other than
//!   nearest/linear, a dynamic output size, ...), saying why.
//! - **Invalidates**: everything keyed by op; the rewritten ops are dropped from the order.
//! - **Statistics**: `lowered-control`, `lowered-rnn`, `lowered-resize`, `ops-added`.

pub mod bag;
pub mod control;
pub mod resize;
pub mod rnn;

use crate::transforms::autodiff::builder::Builder;
use pipec_compiler::ir::{Module, Op, Value};
use pipec_compiler::passmgr::PassInfo;
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_compiler::Result;
use std::collections::HashSet;

/// The `lower` pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lower;

/// What [`lower`] rewrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lowered {
    /// `Loop`s unrolled and `If`s inlined (nested ones included).
    pub control: usize,
    pub rnn: usize,
    pub resize: usize,
    /// Ops added in their place.
    pub ops_added: usize,
}

impl Lowered {
    /// True when nothing was rewritten.
    pub fn is_empty(&self) -> bool {
        self.control == 0 && self.rnn == 0 && self.resize == 0
    }
}

/// The contract of `lower` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "lower",
    summary: "unrolls Loop (static trip count), inlines If (constant condition), rewrites LSTM/GRU (unrolled) and Resize (MatMul with constant interpolation matrices) into ops with kernels and gradient rules",
    options: &[],
    statistics: &["lowered-control", "lowered-resize", "lowered-rnn", "ops-added"],
    requires: &[],
    provides: &[],
    invalidates: &["pipec.stages"],
};

impl Pass for Lower {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()> {
        let l = lower(module)?;
        stats.add("lowered-control", l.control as u64);
        stats.add("lowered-rnn", l.rnn as u64);
        stats.add("lowered-resize", l.resize as u64);
        stats.add("ops-added", l.ops_added as u64);
        Ok(())
    }
}

/// True when `op_type` (default domain) is one [`lower`] rewrites.
pub fn is_lowered(op_type: &str) -> bool {
    matches!(op_type, "LSTM" | "GRU" | "Resize" | "Upsample") || is_control(op_type)
}

fn is_control(op_type: &str) -> bool {
    matches!(op_type, "Loop" | "If")
}

/// Most rounds of control-flow lowering (nesting depth of Loop/If).
const MAX_NESTING: usize = 32;

fn find(m: &Module, pred: fn(&str) -> bool) -> Vec<Op> {
    m.graph
        .order
        .iter()
        .copied()
        .filter(|&o| {
            let d = &m.graph.ops[o];
            d.domain.is_empty() && pred(&d.op_type)
        })
        .collect()
}

/// Rewrite every op [`is_lowered`] names (see the module doc). A module with none of them is
/// left untouched (not even re-inferred).
pub fn lower(m: &mut Module) -> Result<Lowered> {
    let mut stats = Lowered::default();
    let before = m.graph.order.len();
    let mut removed = 0;
    // Control flow first: an unrolled body may hold more control flow, RNNs or Resizes.
    for round in 0.. {
        let targets = find(m, is_control);
        if targets.is_empty() {
            break;
        }
        if round == MAX_NESTING {
            let d = &m.graph.ops[targets[0]];
            return Err(pipec_compiler::Error::node(
                &d.name,
                &d.op_type,
                format!("cannot lower: control flow nested deeper than {MAX_NESTING}"),
            ));
        }
        let (_, vals) = pipec_compiler::shape::infer_shapes_with_values(m)?;
        removed += rewrite(m, &targets, &mut stats, |b, op, _| {
            control::lower_control(b, op, &vals).map(|v| v.into_iter().map(Some).collect())
        })?;
    }
    let targets = find(m, is_lowered);
    if targets.is_empty() && stats.is_empty() {
        return Ok(stats);
    }
    if !targets.is_empty() {
        pipec_compiler::shape::infer_shapes(m)?;
    }
    let opset = m.opset();
    removed += rewrite(m, &targets, &mut stats, |b, op, needed| {
        match b.g.ops[op].op_type.as_str() {
            "LSTM" | "GRU" => rnn::lower_rnn(b, op, needed, opset),
            _ => Ok(vec![Some(resize::lower_resize(b, op, opset)?)]),
        }
    })?;
    stats.ops_added = (m.graph.order.len() + removed).saturating_sub(before);
    pipec_compiler::shape::infer_shapes(m)?;
    Ok(stats)
}

/// Replace every op of `targets` by what `f` builds for its results (`needed[i]`: result `i`
/// is read); returns the number of ops removed.
fn rewrite(
    m: &mut Module,
    targets: &[Op],
    stats: &mut Lowered,
    mut f: impl FnMut(&mut Builder, Op, &[bool]) -> Result<Vec<Option<Value>>>,
) -> Result<usize> {
    let mut dead = HashSet::new();
    for &op in targets {
        let uses = m.graph.uses();
        let outputs = m.graph.outputs.clone();
        let needed: Vec<bool> = m.graph.ops[op]
            .outputs
            .iter()
            .map(|v| !uses[*v].is_empty() || outputs.contains(v))
            .collect();
        match m.graph.ops[op].op_type.as_str() {
            "LSTM" | "GRU" => stats.rnn += 1,
            "Resize" | "Upsample" => stats.resize += 1,
            _ => stats.control += 1,
        }
        let mut b = Builder::new(&mut m.graph, "fwd");
        b.prefix = b.g.ops[op].name.clone();
        let repl = f(&mut b, op, &needed)?;
        let old_outs = b.g.ops[op].outputs.clone();
        for (old, new) in old_outs.into_iter().zip(repl) {
            if let Some(new) = new {
                rename_into(&mut b, old, new);
            }
        }
        // Forward ops like any other: no training-phase annotation yet.
        for &o in &b.made {
            b.g.ops[o].attrs.remove("pipec.phase");
        }
        dead.insert(op);
    }
    m.graph.remove_ops(&dead);
    m.graph.topo_sort()?;
    Ok(dead.len())
}

/// Make `new` take the place of `old`: every use, and its name (`old` gets a fresh one).
/// A `new` the rewrite did not make (an operand passed through) is copied by an `Identity` first.
fn rename_into(b: &mut Builder, old: Value, new: Value) {
    let made = b.g.producer(new).is_some_and(|p| b.made.contains(&p));
    let new = if made {
        new
    } else {
        let dt = b.dt(new);
        b.op1("Identity", &[new], vec![], dt)
    };
    b.g.replace_all_uses(old, new);
    let name = b.g.values[old].name.clone();
    let spare = b.fresh(&format!("{name}__lowered"));
    b.g.values[old].name = spare;
    b.g.values[new].name = name;
}
