//! `bapipe`: placeholder.
use super::Planner;
use crate::cost::{Cluster, CostGraph};
use crate::plan::{Plan, PlanOptions};
use pipec_compiler::{Error, Result};

/// The `bapipe` planner.
pub struct BaPipe;

impl Planner for BaPipe {
    fn name(&self) -> &'static str {
        "bapipe"
    }
    fn plan(&self, _g: &CostGraph, _c: &Cluster, _o: &PlanOptions) -> Result<Plan> {
        Err(Error::msg("bapipe: not implemented yet"))
    }
}
