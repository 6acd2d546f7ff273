//! Planners: each turns a [`CostGraph`] and a [`Cluster`] into a [`Plan`].
//!
//! A planner decides the stages (which nodes, which devices), the micro-batch size and its
//! schedule, and reports its own objective; [`Plan::assemble`] then runs the shared simulator so
//! every planner's `iteration_time_s` is comparable. `straight` and `dp` are the trivial baselines;
//! `pipedream` is PipeDream's hierarchical DP ([`pipedream`]). [`dapple_hpgo`] reproduces
//! DAPPLE's published planner (HPGO) for comparison (`--planner dapple --dapple-reference hpgo`).
//!
//! # Writing a planner
//! 1. Read costs from the [`CostGraph`]: per node [`CostGraph::times`] (seconds at any batch on a
//!    device kind), [`CostGraph::activation_bytes`], `nodes[n].parameter_bytes`; for chain
//!    planners, [`CostGraph::chain`] gives O(1) range sums and the bytes crossing every cut of the
//!    topological order; for DAG planners, [`CostGraph::group_cost`] sums any node set. Chain
//!    planners that must cut a DAG correctly (skips, branches) take their cut candidates from
//!    [`crate::cost::antichain::Linearization`] (PipeDream's antichain DAG, or a coarsened
//!    topological chain for graphs too wide for it): states with nested down-sets, stage =
//!    `D(j) \ D(k)` for an ancestor `k` of `j`, sums by [`crate::cost::antichain::Linearization::down_sums`].
//! 2. Read the machine from the [`Cluster`]: `levels` (PipeDream's `-n/-b` hierarchy, innermost
//!    first), [`Cluster::kind_of`], and the costs of [`crate::cost::comm`]: `p2p_time`,
//!    `allreduce_time` (ring / hierarchical), `redistribute_time` (split/concat between replica
//!    counts); memory from [`crate::cost::memory`] (`stage_memory` with the in-flight count of
//!    the schedule: `ScheduleKind::warmup`).
//! 3. Decide [`crate::plan::StageSpec`]s (node ids + device ids per stage), a micro-batch
//!    ([`PlanOptions::micro_batch_or`]) and a [`crate::sim::ScheduleKind`], compute the objective
//!    in the paper's own terms, and return [`Plan::assemble`]`(...)`, which checks the stages
//!    (every node once, devices disjoint, acyclic stage DAG), simulates, and fills the report.
//!    To compare candidates by simulation inside a search, call [`crate::sim::simulate`] on a
//!    [`crate::sim::StageGraph::from_specs`] directly (about 1 µs per simulated task).

pub mod bapipe;
pub mod dapple;
pub mod dapple_hpgo;
pub mod dp;
pub mod gpp;
pub mod interleave;
pub mod pipedream;
pub mod planner;
pub mod stages;
pub mod straight;

use pipec_compiler::{Error, PlanOption, Result};
pub use planner::Planner;

/// The planner name `stages:SPEC` is the user's own stages ([`stages`], `--stages SPEC`).
pub const STAGES_PREFIX: &str = "stages:";

/// The internal planner name of `--planner dapple --dapple-reference hpgo` ([`dapple_hpgo`]).
pub const DAPPLE_HPGO: &str = "dapple-hpgo";

/// Every planner name the CLI accepts.
pub const PLANNER_NAMES: &[&str] = &[
    "gpp",
    "dapple",
    "pipedream",
    "bapipe",
    "dp",
    "straight",
    "gpp-seq",
];

/// The planner called `name`.
pub fn by_name(name: &str) -> Result<Box<dyn Planner>> {
    match name {
        "dp" => Ok(Box::new(dp::DataParallel)),
        "straight" => Ok(Box::new(straight::Straight)),
        "pipedream" => Ok(Box::new(pipedream::PipeDream::default())),
        "dapple" => Ok(Box::new(dapple::Dapple::default())),
        // `--planner dapple --dapple-reference hpgo` (not in PLANNER_NAMES: a reference mode).
        DAPPLE_HPGO => Ok(Box::new(dapple_hpgo::DappleHpgo)),
        "bapipe" => Ok(Box::new(bapipe::BaPipe)),
        "gpp" => Ok(Box::new(gpp::Gpp::default())),
        "gpp-seq" => Ok(Box::new(gpp::Gpp::sequential())),
        n if n.starts_with(STAGES_PREFIX) => Ok(Box::new(stages::UserStages {
            spec: n[STAGES_PREFIX.len()..].to_string(),
        })),
        n => Err(Error::option(
            PlanOption::Planner,
            n,
            format!("unknown planner (one of {})", PLANNER_NAMES.join(", ")),
        )),
    }
}
