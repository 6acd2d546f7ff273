//! The `Planner` trait every planner implements. Apart from the registry (`planners/mod.rs`)
//! so that a planner that runs others (GPP's seeds) depends on them and on this trait, not on
//! the registry that lists it.

use crate::cost::{Cluster, CostGraph};
use crate::plan::{Plan, PlanOptions};
use pipec_compiler::Result;

/// A planner.
pub trait Planner {
    /// The `--planner` name.
    fn name(&self) -> &'static str;
    /// Plan `g` on `cluster`.
    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan>;
    /// [`Planner::plan`] for a caller that only wants a plan whose simulated iteration is below
    /// `cutoff` seconds (GPP's seeds): `None` when the planner can tell without simulating it
    /// that its plan is not (its iteration is at or above `cutoff`). A planner without such a
    /// shortcut returns its plan.
    fn plan_below(
        &self,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        cutoff: f64,
    ) -> Result<Option<Plan>> {
        let _ = cutoff;
        self.plan(g, cluster, opts).map(Some)
    }
}
