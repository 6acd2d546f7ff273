//! `shape-infer`: infer the element type and shape of every value.
//!
//! - **Requires**: a structurally valid module (every operand defined before use).
//! - **Guarantees**: every op result carries the type its op's shape rule gives (ONNX semantics,
//!   opsets 13–21), static wherever the inputs allow; symbolic dims (`batch`, `2*batch`) flow
//!   through shape arithmetic (`Shape -> Gather -> Concat -> Reshape`) by symbolic value
//!   propagation. Declared types (ONNX `value_info`) are checked against the inferred ones.
//! - **Invalidates**: nothing (types only get more precise).
//! - **Statistics**: `inferred-ops`, `refined-values` (types made more precise),
//!   `unranked-values` (results whose rank stays unknown).
//!
//! The importer already runs inference once, as the last step of the front end; this pass re-runs
//! it after transformations or on hand-written IR.

use pipec_compiler::ir::Module;
use pipec_compiler::passmgr::PassInfo;
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_compiler::Result;

/// The `shape-infer` pass.
pub struct ShapeInfer;

/// The contract of `shape-infer` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "shape-infer",
    summary: "infer element types and (symbolic) shapes of every value",
    options: &[],
    statistics: &["inferred-ops", "refined-values", "unranked-values"],
    requires: &[],
    provides: &[],
    invalidates: &[],
};

impl Pass for ShapeInfer {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()> {
        let s = pipec_compiler::shape::infer_shapes(module)?;
        stats.add("inferred-ops", s.ops as u64);
        stats.add("refined-values", s.refined as u64);
        stats.add("unranked-values", s.unranked as u64);
        Ok(())
    }
}
