//! `dce`: dead-code elimination: removes ops whose results reach no graph output, and unused
//! initializers.
//!
//! - **Requires**: a graph whose `order` lists every live op after the producers of its operands
//!   (a topological order, as the verifier checks). Ops not in `order` are already dead.
//! - **Guarantees**: every op left in `order` has a result that a graph output depends on; every
//!   initializer left is an operand of a live op or a graph output. Graph inputs are never
//!   removed, even when unused (they are the model's signature). The relative order of the
//!   surviving ops is unchanged. ONNX ops are side-effect free, so an op is kept only for its
//!   results.
//! - **Invalidates**: nothing that survives changes; removed ops stay in the arena (dead) and
//!   removed initializers' values keep their ids, so side tables keyed by live entities stay valid.
//! - **Statistics**: `removed-ops`, `removed-initializers`.
//! - **Options**: none.

use pipec_compiler::ir::{Module, Value};
use pipec_compiler::passmgr::PassInfo;
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_compiler::Result;
use std::collections::HashSet;

/// The `dce` pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

/// The contract of `dce` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "dce",
    summary: "dead-code elimination: removes ops whose results reach no graph output, and unused initializers",
    options: &[],
    statistics: &["removed-initializers", "removed-ops"],
    requires: &[],
    provides: &[],
    // The ops that stay keep their annotations.
    invalidates: &[],
};

impl Pass for Dce {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()> {
        let g = &mut module.graph;
        let mut live: HashSet<Value> = g.outputs.iter().copied().collect();
        let mut dead_ops = HashSet::new();
        // One backward sweep suffices: in a topological order every user precedes its producer.
        for &op in g.order.iter().rev() {
            let data = &g.ops[op];
            if data.outputs.iter().any(|v| live.contains(v)) {
                live.extend(data.inputs.iter().flatten().copied());
            } else {
                dead_ops.insert(op);
            }
        }
        g.remove_ops(&dead_ops);
        let before = g.initializers.len();
        g.initializers.retain(|v, _| live.contains(v));
        stats.add("removed-ops", dead_ops.len() as u64);
        stats.add(
            "removed-initializers",
            (before - g.initializers.len()) as u64,
        );
        Ok(())
    }
}
