//! `bapipe`: BaPipe's balanced partition and schedule exploration (Zhao et al., "BaPipe:
//! Exploration of Balanced Pipeline Parallelism for DNN Training", §III) for a **chain of possibly
//! different devices**: device `n` runs stage `n` (no replication, BaPipe's 1-D daisy chain), the
//! layers in a topological order, each stage costed on its own device kind.
//!
//! Layer orders ([`orders`]): the order through the longest chain of PipeDream's antichain-DAG
//! states ([`crate::cost::antichain::Linearization::chain_order`], when the DAG has at most
//! [`MAX_ANTICHAIN_STATES`] states), so that the antichain cuts of branches and skips are cut
//! candidates, and the cost graph's own topological order ([`CostGraph::chain`]) when it differs;
//! the exploration below runs on each and keeps the fastest in simulation.
//!
//! # Balanced partition (§III-B)
//! 1. **Inter-layer partition (Eq. 1).** With `T_n` the time of one micro-batch through the whole
//!    network on device `n`, the balanced stage time is `T = 1 / Σ_n (1/T_n)` (Eq. 1) and device
//!    `n`'s share of the network is `l_n/L = T/T_n`. Boundaries are first placed greedily on each
//!    device's cumulative time (stage `n` takes layers until its time reaches `T`), then iterated:
//!    a boundary of the slowest stage moves (to any cut between its neighbouring boundaries)
//!    whenever that lowers `max_n t_n`, until nothing improves ([`balance`]).
//! 2. **Communication check.** A stage is communication-bound when its boundary traffic per
//!    micro-batch (`cut_in/β_in + cut_out/β_out`, activations forward and the same bytes of
//!    gradients backward) exceeds its compute. Then BaPipe makes a **coarse-grained network**:
//!    with the threshold `a_th = T·β` (the ideal stage time times the slowest chain link), cuts
//!    are allowed only where the activation crossing them is below `a_th`, and step 1 is re-run on
//!    the coarse network; the intra-layer split is skipped (it adds traffic).
//! 3. **Intra-layer partition** (when not communication-bound): the boundary layer between two
//!    unequal neighbours, if it is a MatMul/Gemm/Conv (or a profile's Linear/Conv), is split by
//!    output channels so the two stage times become equal: a fraction
//!    `f = (t_slow − t_fast) / (w_slow + w_fast)` of its channels (`w` the layer's time on each
//!    device) moves to the faster neighbour ([`IntraSplit`], one per boundary, a node split at
//!    most once). The [`Planner`] (cost graph only) keeps whole layers; [`plan_module`], which
//!    `pipec plan` and `pipec compile` use for an ONNX model, **emits** the split: the layer is
//!    rewritten by [`crate::transforms::split_layer`] into a kept half (`round((1 − f)·C)` channels, in the
//!    slower stage), a moved half (`round(f·C)`, at least 1 each, in the faster neighbour) and a
//!    `Concat` (in the later of the two stages, where the layer's consumers are), the cost graph
//!    is rebuilt from the rewritten module and the plan re-simulated; the split is kept when the
//!    simulated iteration is not slower than the whole-layer plan (the extra transfer of the
//!    layer input and of a half output can outweigh the balance on slow links), and reported in
//!    [`Plan::intra_splits`](crate::plan::Plan::intra_splits).
//! 4. **Memory fine-tuning.** Stage `i` (1-based) of `N` holds weights and gradients `2w`
//!    (plus optimizer state), buffers, and `k·(N − i + 1)` micro-batches of activations (`k = 1`
//!    for 1F1B-SNO, `k = 2` for 1F1B-SO; Table 2). While a stage exceeds its device memory, a
//!    layer at one of its boundaries moves to a neighbour that can take it (toward the end first:
//!    later stages hold fewer micro-batches).
//!
//! # Schedule exploration (§III-C)
//! For every candidate micro-batch (the requested one, else the divisors of the batch giving
//! `M = 2^k` micro-batches) and both synchronous schedules, **1F1B-SNO** (`1f1b`: warm-up
//! `N − i + 1`) and **1F1B-SO** (`1f1b-so`: doubled warm-up `2(N − i + 1)`, so transfers hide behind
//! compute), the partition is memory-tuned and, if it fits, simulated; the fastest wins, with
//! 1F1B-SNO kept unless 1F1B-SO is more than 0.5% faster (it costs twice the activations).
//!
//! Search cost: `orders (≤ 2) × micro-batch sizes (≤ 21) × 2 schedules` candidates, each a
//! balance (`O(stages × layers)`) and, the expensive part, a simulation of `M` micro-batches
//! through `N` stages. Candidates are simulated in the order of a lower bound of their
//! iteration (each device runs its `M` forwards and backwards and its optimizer step one after
//! another, [`chain_time_bound`]); once one simulates faster than another's bound (plus the
//! 0.5% SO margin), that one cannot win and is not simulated. On a 12-layer GPT-2 export at 32
//! devices this skips most candidates (2.5 → 0.2 s); the chosen plan is the same (test
//! `pruned_exploration_keeps_the_best_candidate`). Devices of one kind share one table of prefix
//! sums ([`Chains`]), so memory is `O(kinds × layers)` per candidate, not `O(devices × layers)`.
//!
//! Objective: BaPipe's Table 2 mini-batch time for the chosen schedule, with `F + B` the slowest
//! stage and `SR` the slowest boundary transfer of one micro-batch:
//! SNO `(M+N−1)(F+B) + (N+M−2−⌈(M−1)/N⌉)·2SR`, SO `(M+N−1)(F+B) + (N−1)·2SR`.

use super::planner::Planner;
use crate::cost::analytic::{self, AnalyticOptions};
use crate::cost::antichain::Linearization;
use crate::cost::memory::{stage_memory, step_time};
use crate::cost::{Chain, Cluster, CostGraph, NodeId};
use crate::plan::{IntraSplitReport, Plan, PlanOptions, StageSpec};
use crate::sim::{self, ScheduleKind, StageGraph};
use crate::transforms::split_layer;
use pipec_compiler::ir::{Module, Op};
use pipec_compiler::{Error, Result};
use std::collections::HashMap;
use std::time::Instant;

/// The `bapipe` planner.
pub struct BaPipe;

/// A planned intra-layer split of a boundary layer (emitted by [`plan_module`]).
#[derive(Clone, Debug, PartialEq)]
pub struct IntraSplit {
    /// The boundary: between stage `boundary` and `boundary + 1`.
    pub boundary: usize,
    pub node: NodeId,
    pub op: String,
    /// Stage that owns the layer, and the neighbour that gets `fraction` of its output channels.
    pub from_stage: usize,
    pub to_stage: usize,
    pub fraction: f64,
}

/// A balanced partition of the chain over the devices `0..n` (one stage each).
#[derive(Clone, Debug)]
pub struct Balance {
    /// Stage `s` covers positions `bounds[s]..bounds[s + 1]` of the topological order.
    pub bounds: Vec<usize>,
    /// Eq. 1's ideal stage time `T`.
    pub ideal: f64,
    /// Compute seconds (forward + backward, one micro-batch) per stage on its device.
    pub stage_times: Vec<f64>,
    /// Boundary transfer seconds per stage (in + out, one micro-batch).
    pub comm_times: Vec<f64>,
    /// Whether the communication check failed and the coarse network was used.
    pub coarse: bool,
    /// The coarse network's activation threshold `a_th` (bytes), when used.
    pub threshold_bytes: Option<f64>,
    /// Planned intra-layer splits (none when coarse).
    pub intra: Vec<IntraSplit>,
    /// Stage times after the planned intra-layer splits.
    pub balanced_times: Vec<f64>,
}

/// Per-device prefix sums at one micro-batch: `chains[n]` costs the order on device `n`'s kind.
pub struct Chains {
    /// One per device, shared between devices of one kind (a chain of 20k nodes is ~1 MB; a
    /// copy per device of 1024 was a GB per micro-batch size).
    pub chains: Vec<std::rc::Rc<Chain>>,
    /// Bandwidth and latency of the link from device `n` to `n + 1`.
    pub links: Vec<(f64, f64)>,
}

impl Chains {
    /// Prefix sums for the first `n` devices of `cluster` at `micro_batch` samples, over the cost
    /// graph's topological order.
    pub fn new(g: &CostGraph, cluster: &Cluster, n: usize, micro_batch: f64) -> Chains {
        Chains::new_in(g, cluster, n, micro_batch, g.topo_order())
    }

    /// [`Chains::new`] over another topological order of every node.
    pub fn new_in(
        g: &CostGraph,
        cluster: &Cluster,
        n: usize,
        micro_batch: f64,
        order: &[NodeId],
    ) -> Chains {
        let mut by_kind: Vec<Option<std::rc::Rc<Chain>>> = vec![None; cluster.kinds.len()];
        let mut chains = Vec::with_capacity(n);
        for d in 0..n {
            let k = cluster.devices[d].kind;
            let c = by_kind[k].get_or_insert_with(|| {
                std::rc::Rc::new(g.chain_in(order, micro_batch, &cluster.kinds[k]))
            });
            chains.push(c.clone());
        }
        let links = (1..n)
            .map(|d| cluster.path(d - 1, d).unwrap_or((f64::INFINITY, 0.0)))
            .collect();
        Chains { chains, links }
    }

    fn len(&self) -> usize {
        self.chains.first().map_or(0, |c| c.len())
    }

    /// Time of one micro-batch through the whole network on device `n` (`T_n` of Eq. 1).
    pub fn whole(&self, n: usize) -> f64 {
        self.chains[n].compute(0, self.len())
    }

    /// Transfer seconds of the boundary at position `p` between stage `s` and `s + 1`.
    fn transfer(&self, s: usize, p: usize) -> f64 {
        let (bw, lat) = self.links[s];
        let b = self.chains[s].cut[p];
        if b > 0.0 {
            lat + b / bw
        } else {
            0.0
        }
    }

    fn times(&self, bounds: &[usize]) -> (Vec<f64>, Vec<f64>) {
        let k = bounds.len() - 1;
        let comp = (0..k)
            .map(|s| self.chains[s].compute(bounds[s], bounds[s + 1]))
            .collect();
        let comm = (0..k)
            .map(|s| {
                let mut t = 0.0;
                if s > 0 {
                    t += self.transfer(s - 1, bounds[s]);
                }
                if s + 1 < k {
                    t += self.transfer(s, bounds[s + 1]);
                }
                t
            })
            .collect();
        (comp, comm)
    }
}

/// Eq. 1: `T = 1 / Σ_n 1/T_n`.
pub fn ideal_stage_time(whole: &[f64]) -> f64 {
    let inv: f64 = whole.iter().map(|t| 1.0 / t.max(f64::MIN_POSITIVE)).sum();
    if inv > 0.0 {
        1.0 / inv
    } else {
        0.0
    }
}

/// Greedy placement on cumulative time then boundary iteration (steps 1 of the module doc), over
/// the allowed cut positions `allowed` (always including 0 and the end). `k` stages.
fn inter_layer(ch: &Chains, k: usize, allowed: &[bool], ideal: f64) -> Vec<usize> {
    let n = ch.len();
    let cuts: Vec<usize> = (1..n).filter(|&p| allowed[p]).collect();
    let k = k.min(cuts.len() + 1).max(1);
    // Greedy: stage s takes allowed cuts until its own time reaches the ideal T.
    let mut bounds = vec![0usize];
    let mut ci = 0usize;
    for s in 0..k - 1 {
        let start = *bounds.last().unwrap_or(&0);
        let must_leave = k - 1 - s - 1; // cuts the later boundaries still need
        let mut pick = None;
        while ci + must_leave < cuts.len() {
            let p = cuts[ci];
            ci += 1;
            pick = Some(p);
            if ch.chains[s].compute(start, p) >= ideal {
                // Take the closer of p and the previous cut.
                if let Some(&q) = ci.checked_sub(2).and_then(|x| cuts.get(x)) {
                    if q > start
                        && ch.chains[s].compute(start, q) > 0.0
                        && (ideal - ch.chains[s].compute(start, q))
                            < (ch.chains[s].compute(start, p) - ideal)
                    {
                        pick = Some(q);
                        ci -= 1;
                    }
                }
                break;
            }
        }
        match pick {
            Some(p) => bounds.push(p),
            None => break,
        }
    }
    bounds.push(n);
    // Boundary iteration: move a boundary of the slowest stage while it helps.
    let pos: Vec<usize> = std::iter::once(0)
        .chain(cuts.iter().copied())
        .chain(std::iter::once(n))
        .collect();
    let idx_of = |p: usize| pos.binary_search(&p).unwrap_or(0);
    let key = |b: &[usize]| -> (f64, f64) {
        let (t, _) = ch.times(b);
        let mx = t.iter().copied().fold(0.0, f64::max);
        (mx, t.iter().map(|x| x * x).sum())
    };
    let mut cur = key(&bounds);
    for _ in 0..4 * n.max(1) {
        let (t, _) = ch.times(&bounds);
        let slow = (0..t.len())
            .max_by(|&a, &b| t[a].total_cmp(&t[b]))
            .unwrap_or(0);
        let mut best: Option<(Vec<usize>, (f64, f64))> = None;
        // Move either boundary of the slowest stage to any allowed cut between its neighbours.
        for bi in [slow, slow + 1] {
            if bi == 0 || bi >= bounds.len() - 1 {
                continue;
            }
            let (lo, hi) = (idx_of(bounds[bi - 1]) + 1, idx_of(bounds[bi + 1]));
            for &np in &pos[lo.min(hi)..hi] {
                if np == bounds[bi] {
                    continue;
                }
                let mut nb = bounds.clone();
                nb[bi] = np;
                let kk = key(&nb);
                let improves =
                    kk.0 < cur.0 * (1.0 - 1e-12) || (kk.0 <= cur.0 && kk.1 < cur.1 * (1.0 - 1e-12));
                if improves && best.as_ref().is_none_or(|(_, b)| kk < *b) {
                    best = Some((nb, kk));
                }
            }
        }
        match best {
            Some((nb, kk)) => {
                bounds = nb;
                cur = kk;
            }
            None => break,
        }
    }
    bounds
}

fn splittable(op: &str) -> bool {
    let o = op.trim_start();
    ["MatMul", "Gemm", "Conv", "Linear"]
        .iter()
        .any(|p| o.starts_with(p))
}

/// BaPipe's balanced partition of the chain over the first `k` devices (steps 1–3).
pub fn balance(g: &CostGraph, ch: &Chains, k: usize) -> Balance {
    let n = ch.len();
    let whole: Vec<f64> = (0..k).map(|d| ch.whole(d)).collect();
    let ideal = ideal_stage_time(&whole);
    let all = vec![true; n + 1];
    let mut bounds = inter_layer(ch, k, &all, ideal);
    let (mut comp, mut comm) = ch.times(&bounds);
    let mut coarse = false;
    let mut threshold = None;
    if comp.iter().zip(&comm).any(|(c, m)| m > c) {
        // Coarse network: cut only where the crossing activation is below a_th = T·β.
        let bw = ch.links.iter().map(|l| l.0).fold(f64::INFINITY, f64::min);
        let a_th = ideal * bw;
        let allowed: Vec<bool> = (0..=n)
            .map(|p| p == 0 || p == n || ch.chains[0].cut[p] <= a_th)
            .collect();
        bounds = inter_layer(ch, k, &allowed, ideal);
        (comp, comm) = ch.times(&bounds);
        coarse = true;
        threshold = Some(a_th);
    }
    let mut intra = Vec::new();
    let mut balanced = comp.clone();
    if !coarse {
        let order = &ch.chains[0].order;
        for s in 0..bounds.len().saturating_sub(2) {
            let (a, b) = (balanced[s], balanced[s + 1]);
            if (a - b).abs() <= 1e-12 * a.max(b) {
                continue;
            }
            // The boundary layer: the slower side's layer next to the cut.
            let (from, to, pos) = if a > b {
                (s, s + 1, bounds[s + 1] - 1)
            } else {
                (s + 1, s, bounds[s + 1])
            };
            let node = order[pos];
            if !splittable(&g.nodes[node].op) || intra.iter().any(|x: &IntraSplit| x.node == node) {
                continue;
            }
            let w_from = ch.chains[from].compute(pos, pos + 1);
            let w_to = ch.chains[to].compute(pos, pos + 1);
            if w_from + w_to <= 0.0 {
                continue;
            }
            let f = ((a - b).abs() / (w_from + w_to)).clamp(0.0, 1.0);
            balanced[from] -= f * w_from;
            balanced[to] += f * w_to;
            intra.push(IntraSplit {
                boundary: s,
                node,
                op: g.nodes[node].op.clone(),
                from_stage: from,
                to_stage: to,
                fraction: f,
            });
        }
    }
    Balance {
        bounds,
        ideal,
        stage_times: comp,
        comm_times: comm,
        coarse,
        threshold_bytes: threshold,
        intra,
        balanced_times: balanced,
    }
}

/// Memory fine-tuning (step 4): move boundary layers off over-full stages. `factor` is `k` of
/// BaPipe's `k·(N − i + 1)` in-flight micro-batches. Returns the tuned bounds, or `None` when no
/// move makes every stage fit.
pub fn fit_memory(
    cluster: &Cluster,
    ch: &Chains,
    bounds: &[usize],
    factor: usize,
    m: usize,
    opts: &PlanOptions,
) -> Option<Vec<usize>> {
    let k = bounds.len() - 1;
    let need = |b: &[usize], s: usize| -> f64 {
        let c = &ch.chains[s];
        let inflight = (factor * (k - s)).min(m.max(1));
        stage_memory(
            c.parameter_bytes(b[s], b[s + 1]),
            c.saved_bytes(b[s], b[s + 1]),
            inflight,
            c.cut[b[s]] + c.cut[b[s + 1]],
            opts.optimizer,
        )
        .total()
    };
    let cap = |s: usize| cluster.kind_of(s).memory_bytes as f64;
    let mut b = bounds.to_vec();
    for _ in 0..(4 * ch.len() * k.max(1)) {
        let Some(s) = (0..k).find(|&s| need(&b, s) > cap(s)) else {
            return Some(b);
        };
        let mut moved = false;
        // Toward the end first (move the stage's last layer to s + 1), then toward the start.
        if s + 1 < k && b[s + 1] - 1 > b[s] {
            let mut nb = b.clone();
            nb[s + 1] -= 1;
            if need(&nb, s + 1) <= cap(s + 1) {
                b = nb;
                moved = true;
            }
        }
        if !moved && s > 0 && b[s] + 1 < b[s + 1] {
            let mut nb = b.clone();
            nb[s] += 1;
            if need(&nb, s - 1) <= cap(s - 1) {
                b = nb;
                moved = true;
            }
        }
        if !moved {
            return None;
        }
    }
    None
}

/// BaPipe's Table 2 mini-batch time (see the module doc).
pub fn table2_time(kind: ScheduleKind, m: usize, n: usize, fb: f64, sr: f64) -> f64 {
    let (mf, nf) = (m as f64, n as f64);
    let base = (mf + nf - 1.0) * fb;
    match kind {
        ScheduleKind::OneFOneBSo => base + (nf - 1.0) * 2.0 * sr,
        _ => {
            let ceil = ((m.max(1) - 1) as f64 / nf).ceil();
            base + (nf + mf - 2.0 - ceil).max(0.0) * 2.0 * sr
        }
    }
}

/// One explored candidate.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub micro_batch: u64,
    pub schedule: ScheduleKind,
    pub bounds: Vec<usize>,
    /// The layer order `bounds` cut (one of [`orders`]).
    pub order: Vec<NodeId>,
    pub balance: Balance,
    /// Simulated iteration seconds.
    pub simulated_s: f64,
    /// Table 2 mini-batch time.
    pub table2_s: f64,
    /// Table 2's `SR`: the slowest boundary transfer of one micro-batch.
    pub transfer_s: f64,
    /// The lower bound of `simulated_s` the exploration ranks by ([`chain_time_bound`]).
    pub bound_s: f64,
}

/// A lower bound of the simulated iteration of single-device stages whose forward + backward
/// seconds per micro-batch are `comp` and optimizer steps `step`, with `m` micro-batches: each
/// device runs its `m` forwards and backwards and then its step one after another (the
/// simulator's per-device stream, as [`sim::compute_bound`]); transfers and bubbles only add.
/// (No pipeline fill term: stages of a topological order need not depend on each other.)
pub fn chain_time_bound(comp: &[f64], step: &[f64], m: usize) -> f64 {
    comp.iter()
        .zip(step)
        .map(|(c, s)| m as f64 * c + s)
        .fold(0.0, f64::max)
}

/// The micro-batch sizes the exploration tries: the requested one, else the divisors of the
/// batch that give `M = 2^k` micro-batches (`k ≤ 20`).
pub fn micro_batches(opts: &PlanOptions) -> Result<Vec<u64>> {
    let batch = opts.batch.max(1);
    Ok(match opts.micro_batch() {
        Some(_) => vec![opts.micro_batch_or(1)],
        None => {
            let mut v: Vec<u64> = (0..=20)
                .map(|e| 1u64 << e)
                .filter(|&m| m <= batch && batch.is_multiple_of(m))
                .map(|m| batch / m)
                .collect();
            v.dedup();
            v
        }
    })
}

/// The schedule exploration: the candidates that fit, best first. Candidates are simulated in
/// the order of a lower bound of their iteration ([`chain_time_bound`]) and those whose bound
/// shows they cannot be first are left out: the first is that of [`explore_all`].
pub fn explore(g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Vec<Candidate>> {
    explore_with(g, cluster, opts, true)
}

/// [`explore`] with every candidate simulated (for tests of the bound).
pub fn explore_all(g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Vec<Candidate>> {
    explore_with(g, cluster, opts, false)
}

fn explore_with(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    prune: bool,
) -> Result<Vec<Candidate>> {
    if g.is_empty() {
        return Err(Error::infeasible("bapipe", "the graph has no node"));
    }
    let batch = opts.batch.max(1);
    let k = cluster.len().min(g.len()).max(1);
    let mbs = micro_batches(opts)?;
    let kinds: Vec<ScheduleKind> = match opts.schedule {
        Some(s) => vec![s],
        None => vec![ScheduleKind::OneFOneB, ScheduleKind::OneFOneBSo],
    };
    // Every (order, micro-batch, schedule) that fits the memory model, with a lower bound of
    // its simulated iteration ([`chain_time_bound`]). Only what the candidate needs is kept
    // (the per-device prefix sums and stage graphs of 1024 devices are tens of MB each).
    struct Pending {
        seq: usize,
        order: usize,
        mb: u64,
        kind: ScheduleKind,
        balance: Balance,
        bounds: Vec<usize>,
        table2_s: f64,
        transfer_s: f64,
        bound: f64,
    }
    let orders = orders(g);
    let mut pending: Vec<Pending> = Vec::new();
    for (oi, order) in orders.iter().enumerate() {
        for &mb in &mbs {
            let m = (batch / mb) as usize;
            let ch = Chains::new_in(g, cluster, k, mb as f64, order);
            let bal = balance(g, &ch, k);
            for &kind in &kinds {
                let factor = if kind == ScheduleKind::OneFOneBSo {
                    2
                } else {
                    1
                };
                let Some(bounds) = fit_memory(cluster, &ch, &bal.bounds, factor, m, opts) else {
                    continue;
                };
                let (comp, _) = ch.times(&bounds);
                let step: Vec<f64> = (0..bounds.len() - 1)
                    .map(|s| {
                        let params = ch.chains[s].parameter_bytes(bounds[s], bounds[s + 1]);
                        step_time(params, cluster.kind_of(s).memory_bandwidth, opts.optimizer)
                    })
                    .collect();
                let bound = chain_time_bound(&comp, &step, m);
                let fb = comp.iter().copied().fold(0.0, f64::max);
                let sr = (0..bounds.len().saturating_sub(2))
                    .map(|s| ch.transfer(s, bounds[s + 1]))
                    .fold(0.0, f64::max);
                pending.push(Pending {
                    seq: pending.len(),
                    order: oi,
                    mb,
                    kind,
                    balance: bal.clone(),
                    table2_s: table2_time(kind, m, bounds.len() - 1, fb, sr),
                    transfer_s: sr,
                    bounds,
                    bound,
                });
            }
        }
    }
    // Simulate in the order of the bound; a candidate whose bound exceeds the best simulated
    // time by more than the 1F1B-SO tie margin below can neither win nor be the 1F1B-SNO
    // alternative of the winner, so it is not simulated (the result's first candidate is the
    // same as with every candidate simulated; the list holds only the simulated ones).
    pending.sort_by(|a, b| a.bound.total_cmp(&b.bound).then(a.seq.cmp(&b.seq)));
    let mut best = f64::INFINITY;
    let mut out: Vec<(usize, Candidate)> = Vec::new();
    for p in pending {
        if prune && p.bound > best * (1.0 + SO_MARGIN) {
            continue;
        }
        let m = (batch / p.mb) as usize;
        let order = &orders[p.order];
        let specs = specs_of(order, &p.bounds);
        let sg = StageGraph::from_specs(g, cluster, &specs, p.mb as f64, opts.optimizer);
        let sched = sim::schedule::generate(&sg, p.kind, m);
        let res = sim::simulate(&sg, &sched, cluster, opts.allreduce)?;
        // The simulated peak has the last word on memory.
        if (0..p.bounds.len() - 1)
            .any(|d| res.devices[d].peak_memory_bytes > cluster.kind_of(d).memory_bytes as f64)
        {
            continue;
        }
        best = best.min(res.iteration_time_s);
        out.push((
            p.seq,
            Candidate {
                micro_batch: p.mb,
                schedule: p.kind,
                table2_s: p.table2_s,
                transfer_s: p.transfer_s,
                bound_s: p.bound,
                bounds: p.bounds,
                order: order.clone(),
                balance: p.balance,
                simulated_s: res.iteration_time_s,
            },
        ));
    }
    // Ties keep the exploration order (order, micro-batch, schedule).
    out.sort_by(|a, b| {
        a.1.simulated_s
            .total_cmp(&b.1.simulated_s)
            .then(a.0.cmp(&b.0))
    });
    let mut out: Vec<Candidate> = out.into_iter().map(|(_, c)| c).collect();
    // Best first; 1F1B-SNO unless 1F1B-SO is more than 0.5% faster at the same micro-batch.
    if let Some(best) = out.first().cloned() {
        if best.schedule == ScheduleKind::OneFOneBSo {
            if let Some(i) = out.iter().position(|c| {
                c.schedule == ScheduleKind::OneFOneB
                    && c.micro_batch == best.micro_batch
                    && c.order == best.order
                    && c.simulated_s <= best.simulated_s * (1.0 + SO_MARGIN)
            }) {
                let c = out.remove(i);
                out.insert(0, c);
            }
        }
    }
    Ok(out)
}

/// 1F1B-SO (twice the activations) is chosen over 1F1B-SNO only when this much faster.
const SO_MARGIN: f64 = 0.005;

/// Largest antichain DAG whose chain order [`orders`] uses.
pub const MAX_ANTICHAIN_STATES: usize = 512;

/// The layer orders BaPipe partitions (see the module doc): the antichain chain order, then the
/// topological order if different.
pub fn orders(g: &CostGraph) -> Vec<Vec<NodeId>> {
    let mut out = Vec::with_capacity(2);
    if let Some(lin) = Linearization::antichain_dag(g, &vec![false; g.len()], MAX_ANTICHAIN_STATES)
    {
        // Bytes leaving each state's down-set (ties between equally long chains).
        let cut = |j: usize| -> f64 {
            let d = &lin.states[j].down;
            d.iter()
                .filter(|&u| g.succs(u).any(|v| !d.contains(v)))
                .map(|u| {
                    g.out_edges(u)
                        .iter()
                        .map(|&e| g.edges[e].bytes + g.edges[e].fixed_bytes)
                        .fold(0.0, f64::max)
                })
                .sum()
        };
        out.push(lin.chain_order(g, cut));
    }
    if out.first().is_none_or(|o| o.as_slice() != g.topo_order()) {
        out.push(g.topo_order().to_vec());
    }
    out
}

fn specs_of(order: &[NodeId], bounds: &[usize]) -> Vec<StageSpec> {
    (0..bounds.len() - 1)
        .map(|s| StageSpec {
            nodes: order[bounds[s]..bounds[s + 1]].to_vec(),
            devices: vec![s],
        })
        .collect()
}

impl Planner for BaPipe {
    fn name(&self) -> &'static str {
        "bapipe"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        let cands = explore(g, cluster, opts)?;
        match cands.first() {
            Some(c) => assemble_candidate(g, cluster, opts, c, t0),
            None => unfitted_plan(g, cluster, opts, t0),
        }
    }
}

/// The whole-layer plan of an explored candidate.
fn assemble_candidate(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    c: &Candidate,
    t0: Instant,
) -> Result<Plan> {
    Plan::assemble(
        "bapipe",
        g,
        cluster,
        opts,
        specs_of(&c.order, &c.bounds),
        c.micro_batch,
        c.schedule,
        c.table2_s,
        t0.elapsed().as_secs_f64(),
    )
}

/// Nothing fits: the balanced partition at the default micro-batch, flagged OOM.
fn unfitted_plan(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    t0: Instant,
) -> Result<Plan> {
    let mb = opts.micro_batch_or(4 * cluster.len() as u64);
    let k = cluster.len().min(g.len()).max(1);
    let ch = Chains::new(g, cluster, k, mb as f64);
    let bal = balance(g, &ch, k);
    let kind = opts.schedule.unwrap_or(ScheduleKind::OneFOneB);
    let (comp, _) = ch.times(&bal.bounds);
    let fb = comp.iter().copied().fold(0.0, f64::max);
    let m = (opts.batch.max(1) / mb) as usize;
    Plan::assemble(
        "bapipe",
        g,
        cluster,
        opts,
        specs_of(g.topo_order(), &bal.bounds),
        mb,
        kind,
        table2_time(kind, m, bal.bounds.len() - 1, fb, 0.0),
        t0.elapsed().as_secs_f64(),
    )
}

/// A BaPipe plan of a module, with its intra-layer splits emitted ([`plan_module`]).
pub struct ModulePlan {
    pub plan: Plan,
    /// The rewritten module and its cost graph (what `plan` names) when the plan realises
    /// intra-layer splits; `None` when it keeps whole layers (then `plan` names the input's nodes).
    pub rewritten: Option<(Module, CostGraph)>,
}

/// BaPipe on a module `m` whose analytic cost graph is `g` (node `i` = `m.graph.order[i]`, as
/// [`analytic::from_module`] builds it): the best candidate of [`explore`], with its planned
/// intra-layer splits emitted as IR rewrites (see the module doc, step 3). A split whose layer the
/// rewrite does not support (e.g. a shared or non-constant weight), or that memory tuning moved
/// off the boundary, is left out; when none is left, or the split plan simulates slower, the
/// whole-layer plan is returned.
pub fn plan_module(
    m: &Module,
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
) -> Result<ModulePlan> {
    let t0 = Instant::now();
    let cands = explore(g, cluster, opts)?;
    let Some(c) = cands.first() else {
        return Ok(ModulePlan {
            plan: unfitted_plan(g, cluster, opts, t0)?,
            rewritten: None,
        });
    };
    let base = assemble_candidate(g, cluster, opts, c, t0)?;
    let whole = |plan: Plan| {
        Ok(ModulePlan {
            plan,
            rewritten: None,
        })
    };
    if c.balance.intra.is_empty() || m.graph.order.len() != g.len() {
        return whole(base);
    }
    let specs = specs_of(&c.order, &c.bounds);
    let mut stage_of: HashMap<Op, usize> = HashMap::new();
    for (s, spec) in specs.iter().enumerate() {
        for &n in &spec.nodes {
            stage_of.insert(m.graph.order[n], s);
        }
    }
    let mut m2 = m.clone();
    let mut reports = Vec::new();
    for sp in &c.balance.intra {
        // Still at the candidate's boundary (memory tuning may have moved it)?
        let end = c.bounds[sp.boundary + 1];
        let at = if sp.from_stage < sp.to_stage {
            end.checked_sub(1)
        } else {
            Some(end)
        };
        if at.and_then(|p| c.order.get(p)) != Some(&sp.node) {
            continue;
        }
        let op = m.graph.order[sp.node];
        if m.graph.ops[op].name != g.nodes[sp.node].name {
            continue; // `g` was not built from `m`
        }
        let Some(ch) = split_layer::output_channels(&m2, op).filter(|&c| c >= 2) else {
            continue;
        };
        let moved = ((sp.fraction * ch as f64).round() as u64).clamp(1, ch - 1);
        let Ok(ls) = split_layer::split_output_channels(&mut m2, op, [ch - moved, moved]) else {
            continue;
        };
        stage_of.insert(ls.ops[0], sp.from_stage);
        stage_of.insert(ls.ops[1], sp.to_stage);
        stage_of.insert(ls.ops[2], sp.from_stage.max(sp.to_stage));
        reports.push(IntraSplitReport {
            node: ls.node,
            op: ls.op_type,
            from_stage: sp.from_stage,
            to_stage: sp.to_stage,
            fraction: sp.fraction,
            channels: ls.channels,
            nodes: ls.names,
            params: ls.params,
        });
    }
    if reports.is_empty() {
        return whole(base);
    }
    let (g2, _) = analytic::planning_graph(&m2, &AnalyticOptions::default(), &g.name)?;
    let specs2: Vec<StageSpec> = specs
        .iter()
        .enumerate()
        .map(|(s, spec)| StageSpec {
            nodes: (0..m2.graph.order.len())
                .filter(|&i| stage_of.get(&m2.graph.order[i]) == Some(&s))
                .collect(),
            devices: spec.devices.clone(),
        })
        .collect();
    let m_count = (opts.batch.max(1) / c.micro_batch.max(1)) as usize;
    let mut plan = Plan::assemble(
        "bapipe",
        &g2,
        cluster,
        opts,
        specs2,
        c.micro_batch,
        c.schedule,
        0.0,
        0.0,
    )?;
    let fb = plan
        .stages
        .iter()
        .map(|s| s.compute_time_s)
        .fold(0.0, f64::max);
    plan.objective_s = table2_time(c.schedule, m_count, specs.len(), fb, c.transfer_s);
    plan.search_time_s = t0.elapsed().as_secs_f64();
    plan.intra_splits = reports;
    if plan.iteration_time_s > base.iteration_time_s {
        return whole(base);
    }
    Ok(ModulePlan {
        plan,
        rewritten: Some((m2, g2)),
    })
}
