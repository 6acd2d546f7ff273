//! `sp-decompose`: the IR pass of GraphPipe's series-parallel decomposition (Jeon et al.,
//! ASPLOS'25, §5). The decomposition itself, its contract and method are
//! [`crate::planners::gpp::sp_tree`] (re-exported here), below the planners that use it.
//!
//! # Contract
//! - **Requires**: a module the cost model reads (its cluster and batch attributes, or the
//!   defaults; [`crate::graphpipe::gpp_ir`]).
//! - **Guarantees**: annotates every op with `pipec.sp_unit` (its unit in depth-first order, `-1`
//!   for side ops) after [`check_tree`] accepted the tree, and records the tree shape in the
//!   statistics; invalidates nothing.

pub use crate::planners::gpp::sp_tree::*;
use pipec_compiler::ir::Module;
use pipec_compiler::passmgr::PassInfo;
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_compiler::Result;

/// The `sp-decompose` IR pass: decomposes the module's cost graph and annotates each op with
/// `pipec.sp_unit` (unit index in depth-first order; −1 for duplicated side ops).
pub struct SpDecompose;

/// The contract of `sp-decompose` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "sp-decompose",
    summary: "series-parallel decomposition (GraphPipe §5): annotate ops with pipec.sp_unit",
    options: &[],
    statistics: &[
        "forced-splits",
        "parallel",
        "series",
        "side-ops",
        "tree-depth",
        "units",
    ],
    requires: &[],
    provides: &[],
    invalidates: &[],
};

impl Pass for SpDecompose {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()> {
        let g = crate::graphpipe::gpp_ir::cost_graph(module)?;
        let cfg = crate::graphpipe::gpp_ir::IrConfig::from_module(module, &g)?;
        let sp = decompose(&g, cfg.cluster.kind_of(0));
        check_tree(&g, &sp)
            .map_err(|e| pipec_compiler::Error::msg(format!("sp-decompose: {e}")))?;
        let mut unit = vec![-1i64; g.len()];
        for (i, &l) in sp.leaves().iter().enumerate() {
            for &n in &sp.tree[l].nodes {
                unit[n] = i as i64;
            }
        }
        let order = module.graph.order.clone();
        for (n, &op) in order.iter().enumerate() {
            module.graph.ops[op].attrs.insert(
                "pipec.sp_unit".into(),
                pipec_compiler::ir::Attr::Int(unit.get(n).copied().unwrap_or(-1)),
            );
        }
        let (l, se, p, depth) = sp.shape();
        stats.add("units", l as u64);
        stats.add("series", se as u64);
        stats.add("parallel", p as u64);
        stats.add("tree-depth", depth as u64);
        stats.add("side-ops", sp.side.len() as u64);
        stats.add("forced-splits", sp.forced_splits as u64);
        Ok(())
    }
}
