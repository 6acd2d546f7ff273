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
