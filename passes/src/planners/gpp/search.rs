//! GraphPipe's pipeline stage partitioner (Jeon et al., ASPLOS'25, §5,
//! Algorithm 1): a binary search on the bottleneck time-per-sample (TPS) around a memoised DP over
//! the series-parallel decomposition tree ([`super::sp_tree`]). This file: the search's inputs
//! and results, the lower bounds and the binary search; the DP is [`super::dp`], the units it cuts
//! are [`super::units`].
//!
//! # Contract
//! - **Requires**: a [`CostGraph`], a [`Cluster`] (homogeneous: timed on device 0's kind, memory of
//!   the smallest device), the mini-batch `B` and a micro-batch `b` dividing it.
//! - **Guarantees**: [`search`] returns stages (unit ranges of the coarsened tree with a replica
//!   count each; replica counts sum to the device count, C3) whose bottleneck TPS is within `ε`
//!   (relative) of the smallest any stage graph of the DP's space reaches under the memory
//!   constraint (Eq. 2), and, among those, the smallest source in-flight count (PICKBETTER). Every
//!   stage is a convex union of units (C1) by construction of the tree.
//! - **Errors**: no plan fits in memory ("Eq. 2"), naming the largest static footprint.
//!
//! # Binary search (lines 2–11)
//! `t_r` starts at a feasible plan's bottleneck (the DP at `t = ∞` picks the shallowest plan that
//! fits), `t_l` at the work bound of [`lower_bounds`] (`F_total/(b·D)`, no plan can beat it), and
//! the interval halves until `t_r − t_l ≤ ε·t_r`. A refinement passes a coarser search's bracket
//! ([`SearchParams::bracket`]) instead of starting over. A DP run compares stage TPS values with
//! the target and nothing else, so every target below the smallest compared value above it
//! (`next_t`) runs the same way: a failed run moves `t_l` up to there, and a relaxed target
//! inside the previous run's interval is not run again.
//!
//! The sequential mode runs the same DP on a one-level tree: the units linearised in the tree's
//! depth-first order (a topological order), so only chains of stages are possible (SPP).
//!
//! The `partition-gpp` IR pass ([`crate::graphpipe::partition_gpp`]) runs this search through the `gpp`
//! planner; the pass and the planner depend on these files, never the other way round.

use super::dp::{ScratchPool, Search, StageTable};
pub use super::params::{SearchParams, StageChoice};
use super::units::{UnitGraph, MAX_DP_UNITS};
use crate::cost::comm::AllReduceGroup;
use crate::cost::memory::step_time;
use crate::cost::{Cluster, CostGraph, NodeId};
use pipec_compiler::{Error, Result};

/// The device granule for a search on `devices` devices: the largest power of two `g` dividing
/// `devices` with at least `slots` device counts left (`devices / g ≥ slots`), 1 below
/// `2·slots` devices.
///
/// A plan for `D` devices whose stages are multiples of `g` is what clusters of servers of `g`
/// (or `g`-GPU groups) allow anyway, and a stage of fewer than `g` devices would carry at most
/// `g/D ≤ 1/slots` of the model's work: with the units coarsened to about `2·slots` (the
/// planner's `θ`), such a stage would hold a fraction of one unit. The DP then costs what it
/// costs on `slots` devices, instead of growing with the square of `D`. Not exact: the
/// error against `g = 1` is measured in BENCHMARKS.md ("GraphPipe at 1024 devices").
pub fn device_granule(devices: usize, slots: usize) -> usize {
    let mut g = 1;
    while devices.is_multiple_of(2 * g) && devices / (2 * g) >= slots.max(1) {
        g *= 2;
    }
    g
}

/// A search result.
#[derive(Clone, Debug)]
pub struct SearchResult {
    pub stages: Vec<StageChoice>,
    /// Bottleneck TPS (seconds per sample).
    pub bottleneck_tps: f64,
    /// Source in-flight micro-batches (the plan's depth in the SP-ized graph).
    pub depth: u32,
    /// Number of DP runs (binary-search steps).
    pub dp_runs: usize,
    /// Estimated iteration time: `(M + depth − 1) · max per_mb + max sync`.
    pub estimate_s: f64,
    /// The binary search's final `(t_l, t_r)`: no plan at `t_l`, the optimum's bottleneck at
    /// `t_r` (before the relaxation; pass it to a finer search as [`SearchParams::bracket`]).
    pub bracket: (f64, f64),
    /// With relaxation: the other distinct plans found (the optimum's own, when a relaxed target
    /// won on the estimate, and the other relaxed ones) as `(depth, stages, estimate)`, by
    /// estimate. The estimate is a model; the planner simulates them too.
    pub alternatives: Vec<(u32, Vec<StageChoice>, f64)>,
}

/// Lower bounds at one micro-batch size, before any DP run: `(tps, estimate)`.
///
/// - **TPS**: every stage `s` on `r_s` replicas has `TPS_s ≥ F_s(b/r_s)/b`, a unit's time is
///   `max(flops·x/peak, (bytes·x + fixed)/bw)` or linear in the slice `x`, so
///   `r·F(b/r) ≥ F(b)`, and the replica counts sum to `D` (C3); hence
///   `max_s TPS_s ≥ Σ_s r_s·TPS_s / D ≥ F_total(b) / (b·D)`.
/// - **Estimate** `(M + depth − 1)·P + S` (`P` the largest per-micro-batch time, `S` ≥ 0):
///   `P ≥ F_total(b)/D` by the same argument, and `depth·P` is at least the sum of the stage
///   times along any path of units, each unit at most `D`-way split: `depth·P ≥ CP(b/D)`, the
///   longest path of unit times at slice `b/D`; and `depth·P ≥ P`. So
///   `estimate ≥ (M − 1)·F_total(b)/D + max(CP(b/D), F_total(b)/D)`.
/// - When the unit graph is connected, a plan of two or more stages has a stage edge, so
///   `depth ≥ 2` (the DP's `δ` adds along every stage edge) and `depth·P ≥ 2·F_total(b)/D`; a
///   plan of depth 1 is the whole graph as one stage on all `D` devices, whose estimate is at
///   least `M·F_total(b/D) + AllReduce(all parameters, D) + step`. The bound is the smaller of
///   the two cases: large micro-batches (few of them, `M` small) pay either a bubble or a whole
///   model's all-reduce, and the planner skips them without a search.
///
/// The planner ranks micro-batch sizes by this bound and skips those that cannot make its
/// shortlist; the binary search starts from the TPS bound instead of 0.
pub fn lower_bounds(
    g: &CostGraph,
    ug: &UnitGraph,
    cluster: &Cluster,
    p: &SearchParams,
) -> (f64, f64) {
    let kind = cluster.kind_of(0);
    let d = p.devices.max(1) as f64;
    let b = p.micro_batch.max(1) as f64;
    let unit_time = |u: &[NodeId], x: f64| -> f64 {
        u.iter()
            .map(|&n| {
                let (f, bw) = g.times(n, x, kind);
                f + bw
            })
            .sum()
    };
    let total: f64 = ug.units.iter().map(|u| unit_time(u, b)).sum();
    let thin: Vec<f64> = ug.units.iter().map(|u| unit_time(u, b / d)).collect();
    // Longest path over the unit DAG (edges go forward in the depth-first order).
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); ug.units.len()];
    for &(a, c, _) in &ug.edges {
        if a < c && c < ug.units.len() {
            preds[c].push(a);
        }
    }
    let mut longest = vec![0.0f64; ug.units.len()];
    for u in 0..ug.units.len() {
        let before = preds[u].iter().map(|&a| longest[a]).fold(0.0, f64::max);
        longest[u] = before + thin[u];
    }
    let cp = longest.iter().copied().fold(0.0, f64::max);
    let m = (p.batch / p.micro_batch.max(1)).max(1) as f64;
    let any_depth = (m - 1.0) * total / d + cp.max(total / d);
    if !connected(ug) {
        return (total / (b * d), any_depth);
    }
    let params: f64 = ug
        .units
        .iter()
        .flatten()
        .map(|&n| g.nodes[n].parameter_bytes)
        .sum();
    let devs: Vec<usize> = (0..p.devices.min(cluster.len())).collect();
    let sync = AllReduceGroup::new(cluster, &devs, p.allreduce).time(params)
        + step_time(params, kind.memory_bandwidth, p.optimizer);
    let one_stage = m * thin.iter().sum::<f64>() + sync;
    let deeper = (m - 1.0) * total / d + cp.max(2.0 * total / d);
    (total / (b * d), one_stage.min(deeper))
}

/// Whether the units with the unit graph's edges form one (weakly) connected graph.
fn connected(ug: &UnitGraph) -> bool {
    let n = ug.units.len();
    let mut parent: Vec<usize> = (0..n).collect();
    let mut parts = n;
    let find = super::sp_tree::find;
    for &(a, c, _) in &ug.edges {
        if a >= n || c >= n {
            continue;
        }
        let (ra, rc) = (find(&mut parent, a), find(&mut parent, c));
        if ra != rc {
            parent[ra] = rc;
            parts -= 1;
        }
    }
    parts <= 1
}

/// Relaxed targets `t_r·f` tried after the binary search (see [`SearchParams::relax`]).
const RELAX: [f64; 6] = [1.05, 1.1, 1.25, 1.5, 2.0, 3.0];

/// Algorithm 1: binary search on the bottleneck TPS around the DP, for one micro-batch size.
pub fn search(
    g: &CostGraph,
    ug: &UnitGraph,
    cluster: &Cluster,
    p: SearchParams,
) -> Result<SearchResult> {
    search_with(g, ug, cluster, p, None, &ScratchPool::default()).0
}

/// [`search`] starting from the stage evaluations `tab` of an earlier search at the same
/// micro-batch size (see [`StageTable`]); returns them, completed, for the next one. The DP's
/// buffers come from `pool` and go back to it.
pub fn search_with(
    g: &CostGraph,
    ug: &UnitGraph,
    cluster: &Cluster,
    p: SearchParams,
    tab: Option<StageTable>,
    pool: &ScratchPool,
) -> (Result<SearchResult>, Option<StageTable>) {
    match search_in(g, ug, cluster, p, tab, pool) {
        Ok((r, t)) => (Ok(r), Some(t)),
        Err(e) => (Err(e), None),
    }
}

fn search_in(
    g: &CostGraph,
    ug: &UnitGraph,
    cluster: &Cluster,
    p: SearchParams,
    tab: Option<StageTable>,
    pool: &ScratchPool,
) -> Result<(SearchResult, StageTable)> {
    if p.devices == 0 || p.devices > cluster.len() {
        return Err(Error::infeasible(
            "gpp",
            format!(
                "{} devices requested but the cluster '{}' has {}",
                p.devices,
                cluster.name,
                cluster.len()
            ),
        ));
    }
    crate::plan::check_micro_batch(p.batch, p.micro_batch)?;
    if !p.granule.max(1).is_power_of_two() || !p.devices.is_multiple_of(p.granule.max(1)) {
        return Err(Error::msg(format!(
            "gpp: device granule {} is not a power of two dividing the {} devices",
            p.granule, p.devices
        )));
    }
    if ug.units.len() > MAX_DP_UNITS {
        return Err(Error::infeasible(
            "gpp",
            format!(
                "{} units after coarsening, more than the DP's {MAX_DP_UNITS} (its stage tables \
                 grow with the square of the units); coarsen the decomposition further",
                ug.units.len()
            ),
        ));
    }
    if ug.units.is_empty() {
        return Err(Error::infeasible(
            "gpp",
            "the model has no node to partition",
        ));
    }
    let mut s = Search::new(g, ug, cluster, p, tab, pool.take());
    let r = bisect(&mut s);
    pool.put(std::mem::take(&mut s.sc));
    r.map(|r| (r, s.tab))
}

/// Algorithm 1's binary search on `s`, then the relaxed targets.
fn bisect(s: &mut Search) -> Result<SearchResult> {
    let (g, ug) = (s.g, s.ug);
    let eps = s.p.eps;
    let bracket = s.p.bracket;
    // The TPS bound of [`lower_bounds`]: all the work at slice `b` (`times(1)`) over `b·D`.
    let lb_tps = s.times(1).last().copied().unwrap_or(0.0)
        / (s.p.micro_batch.max(1) as f64 * s.p.devices.max(1) as f64);
    let mut runs = 0usize;
    // t_r: a feasible bottleneck (the whole model on every device if it fits, else the DP's
    // shallowest feasible plan at t = ∞).
    // Start from the whole model as one stage's TPS and double until a plan fits (cheap: tight
    // targets prune most of the DP); fall back to t = ∞ (memory permitting, any TPS).
    let whole = s.eval(0, ug.units.len(), s.p.devices);
    let mut best = None;
    let mut t = match bracket {
        Some((_, t_r)) => t_r,
        None => whole.tps,
    };
    for _ in 0..6 {
        runs += 1;
        best = s.run(t);
        if best.is_some() {
            break;
        }
        t *= 2.0;
    }
    if best.is_none() {
        runs += 1;
        best = s.run(f64::INFINITY);
    }
    let Some(mut best) = best else {
        let (u, bytes) = s.worst_unit();
        let name = ug.units[u]
            .first()
            .map(|&n| g.nodes[n].name.clone())
            .unwrap_or_default();
        // Every stage graph has a stage over its memory (Eq. 2's constraint); the largest unit
        // is the smallest stage that cannot fit.
        return Err(Error::OutOfMemory {
            planner: "gpp".into(),
            at: format!(" at micro-batch {}", s.p.micro_batch),
            stage: name,
            need: bytes,
            have: s.mem,
        });
    };
    let bottleneck = |st: &[StageChoice]| st.iter().map(|x| x.tps).fold(0.0, f64::max);
    let mut t_r = bottleneck(&best.1);
    // Strictly below the bound: a plan could sit exactly on it.
    let mut t_l = lb_tps * (1.0 - 1e-9);
    if let Some((known, _)) = bracket {
        t_l = t_l.max(known);
    }
    if t_l >= t_r {
        t_l = 0.0;
    }
    while t_r - t_l > eps * t_r {
        let t_m = 0.5 * (t_l + t_r);
        runs += 1;
        match s.run(t_m) {
            // Every target below `next_t` fails the same way ([`Search::run`]): the optimum is
            // at `next_t` or above.
            None => t_l = t_m.max(s.next_t.min(t_r) * (1.0 - 1e-12)),
            Some(r) => {
                t_r = bottleneck(&r.1).min(t_m);
                best = r;
            }
        }
    }
    let m = (s.p.batch / s.p.micro_batch) as f64;
    let estimate = |depth: u32, st: &[StageChoice]| {
        let per_mb = st.iter().map(|x| x.per_mb).fold(0.0, f64::max);
        let sync = st.iter().map(|x| x.sync).fold(0.0, f64::max);
        (m + depth as f64 - 1.0) * per_mb + sync
    };
    let mut best_est = estimate(best.0, &best.1);
    // Every distinct plan seen (the optimum and the relaxed ones), for the planner to simulate.
    let mut seen: Vec<(u32, Vec<StageChoice>, f64)> = vec![(best.0, best.1.clone(), best_est)];
    if s.p.relax {
        // A relaxed target in the last run's `[t, next_t)` returns that run's plan again.
        let mut same_below = 0.0;
        for f in RELAX {
            if t_r * f < same_below {
                continue;
            }
            runs += 1;
            let got = s.run(t_r * f);
            same_below = s.next_t;
            if let Some(r) = got {
                let e = estimate(r.0, &r.1);
                if !seen.iter().any(|x| x.1 == r.1) {
                    seen.push((r.0, r.1.clone(), e));
                }
                let shallowest = r.0 <= 1;
                if e < best_est * (1.0 - 1e-9) {
                    best_est = e;
                    best = r;
                }
                // A larger target can only return another one-stage-deep plan with a larger
                // bottleneck: no better estimate, nothing new for the pool.
                if shallowest {
                    break;
                }
            }
        }
    }
    let mut alternatives: Vec<(u32, Vec<StageChoice>, f64)> =
        seen.into_iter().filter(|x| x.1 != best.1).collect();
    alternatives.sort_by(|a, b| a.2.total_cmp(&b.2));
    let (depth, stages) = best;
    Ok(SearchResult {
        bottleneck_tps: bottleneck(&stages),
        estimate_s: best_est,
        stages,
        depth,
        dp_runs: runs,
        bracket: (t_l, t_r),
        alternatives,
    })
}
