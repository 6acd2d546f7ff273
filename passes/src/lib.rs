//! IR -> IR passes of pipec, one per file. Each file opens with its contract (requires,
//! guarantees, invalidates, statistics); [`registry`] lists them all for the CLI and the pass
//! manager.

pub mod cost;
pub mod dce;
pub mod fold_constants;
pub mod partition_gpp;
pub mod plan;
pub mod planners;
pub mod schedule_gpp;
pub mod shape_infer;
pub mod sim;
pub mod sp_decompose;

pub use dce::Dce;
pub use fold_constants::FoldConstants;
pub use shape_infer::ShapeInfer;

use pipec_compiler::passmgr::Pass;

/// Every pass, in the order `--list-passes` prints them (roughly the order a pipeline runs them).
pub fn registry() -> Vec<Box<dyn Pass>> {
    vec![
        // Analyses that refine types go first.
        Box::new(ShapeInfer),
        // Canonicalization.
        Box::new(FoldConstants),
        Box::new(Dce),
        // GraphPipe (issue 5).
        Box::new(sp_decompose::SpDecompose),
        Box::new(partition_gpp::PartitionGpp),
        Box::new(schedule_gpp::ScheduleGpp),
    ]
}

/// The pass named `name` (its CLI name), if any.
pub fn lookup(name: &str) -> Option<Box<dyn Pass>> {
    registry().into_iter().find(|p| p.name() == name)
}
