//! What GraphPipe's partitioner DP ([`super::dp`]) and its binary search ([`super::search`])
//! exchange: a search's inputs and one stage of its result.

use crate::cost::{AllReduceAlgo, Optimizer};

/// Inputs of one search.
#[derive(Clone, Debug)]
pub struct SearchParams {
    pub batch: u64,
    pub micro_batch: u64,
    pub devices: usize,
    pub optimizer: Optimizer,
    pub allreduce: AllReduceAlgo,
    /// Relative tolerance of the binary search.
    pub eps: f64,
    /// Also try targets `t·{1.05, 1.1, 1.25, 1.5, 2, 3}` above the optimum `t` (shallower plans, since the
    /// DP picks the smallest in-flight count under a target) and return the plan with the best
    /// estimated iteration time `(M + depth − 1)·max per_mb + max sync` (pipeline fill and drain
    /// are not in the bottleneck TPS). The targets stop at the first plan of depth 1: a larger
    /// one can only return another depth-1 plan with a larger bottleneck.
    pub relax: bool,
    /// A known bracket `(t_l, t_r)` of the optimum: the DP finds no plan at `t_l` and one at
    /// `t_r` (a coarser search's result, see [`super::search::SearchResult::bracket`]). Without it the
    /// search brackets from [`super::search::lower_bounds`] and a first feasible plan.
    pub bracket: Option<(f64, f64)>,
    /// `k` of a kFkB schedule (`kfkb-K`, same on every stage; 1 = 1F1B, the default): only the
    /// memory check changes (`Search::sigma_of`).
    pub group: usize,
    /// Device granule `g` (a power of two dividing `devices`; 1 = every count): the DP's device
    /// counts, and so every stage's replica count, are multiples of `g`. The DP's states and
    /// splits scale with the number of counts (`devices / g`), its split loops with their square;
    /// see [`super::search::device_granule`].
    pub granule: usize,
}

/// One stage of a search result.
#[derive(Clone, Debug, PartialEq)]
pub struct StageChoice {
    /// Unit range `[lo, hi)`.
    pub lo: usize,
    pub hi: usize,
    pub replicas: usize,
    /// The stage's estimated TPS, seconds per sample.
    pub tps: f64,
    /// Seconds per micro-batch (one replica's slice).
    pub per_mb: f64,
    /// All-reduce + optimizer step seconds per iteration.
    pub sync: f64,
}
