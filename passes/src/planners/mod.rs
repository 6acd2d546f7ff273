//! Planners: each turns a [`CostGraph`] and a [`Cluster`] into a [`Plan`].
//!
//! A planner decides the stages (which nodes, which devices), the micro-batch size and its
//! schedule, and reports its own objective; [`Plan::assemble`] then runs the shared simulator so
//! every planner's `iteration_time_s` is comparable. `straight` and `dp` are the trivial baselines.

pub mod dp;
pub mod straight;

use crate::cost::{Cluster, CostGraph};
use crate::plan::{Plan, PlanOptions};
use pipec_compiler::{Error, Result};

/// A planner.
pub trait Planner {
    /// The `--planner` name.
    fn name(&self) -> &'static str;
    /// Plan `g` on `cluster`.
    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan>;
}

/// Every planner name the CLI accepts (the real planners land in later issues).
pub const PLANNER_NAMES: &[&str] = &["gpp", "dapple", "pipedream", "bapipe", "dp", "straight"];

/// The planner called `name`.
pub fn by_name(name: &str) -> Result<Box<dyn Planner>> {
    match name {
        "dp" => Ok(Box::new(dp::DataParallel)),
        "straight" => Ok(Box::new(straight::Straight)),
        n if PLANNER_NAMES.contains(&n) => Err(Error::Usage(format!(
            "--planner {n}: not implemented yet (available: dp, straight)"
        ))),
        n => Err(Error::Usage(format!(
            "--planner {n}: unknown planner (one of {})",
            PLANNER_NAMES.join(", ")
        ))),
    }
}
