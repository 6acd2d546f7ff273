//! The planning vocabulary at the bottom of the planning layers: what a planner decides for a
//! stage. The simulator, the planners, the plan and codegen all speak it; it depends only on the
//! cost graph's node ids.

use crate::cost::NodeId;

/// What a planner decides for one stage: its nodes (cost-graph ids, in topological order) and
/// its devices (cluster indices, one per replica).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageSpec {
    pub nodes: Vec<NodeId>,
    pub devices: Vec<usize>,
}

/// `stage_of[n]`: the index in `specs` of the stage holding node `n` of a graph of `nodes` nodes
/// (`usize::MAX` for a node in none; [`crate::plan::Plan::verify`] rejects such plans, and a
/// node in two stages, before anything reads this).
pub fn stage_of(specs: &[StageSpec], nodes: usize) -> Vec<usize> {
    let mut stage_of = vec![usize::MAX; nodes];
    for (s, sp) in specs.iter().enumerate() {
        for &n in &sp.nodes {
            stage_of[n] = s;
        }
    }
    stage_of
}
