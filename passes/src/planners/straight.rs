//! `straight`: one stage per device (device `s` runs stage `s`), no replication, the nodes cut
//! into `S = min(D, nodes)` contiguous runs of the graph's topological order ([`CostGraph::chain`])
//! so that the slowest stage is as fast as possible.
//!
//! A stage's time per batch is the larger of its compute and its communication (they overlap):
//! `T_s = max(Σ_{l∈s}(F_l + B_l), cut_in/β_{s−1,s} + cut_out/β_{s,s+1})`, where `cut` is the bytes
//! crossing the stage boundary (activations forward, the same bytes of gradients backward, both
//! through the stage's one send channel) and β the path bandwidth between neighbouring devices.
//! An exact DP over (stage, end position) minimizes `max_s T_s` in `O(S·n²)` at worst; a stage's
//! start is searched from the latest down and stops once the stage's compute alone exceeds the
//! best bottleneck, about `O(n²)` on balanced chains. `Input` nodes come first in the order, so
//! they land in the first stage. The default micro-batch gives `M ≈ 4·S`
//! micro-batches and the default schedule is 1F1B.
//!
//! Objective: `max_s T_s` at the whole batch, PipeDream's "time per stage" for a pipeline without
//! replication.

use super::planner::Planner;
use crate::cost::{Cluster, CostGraph};
use crate::plan::{Plan, PlanOptions, StageSpec};
use crate::sim::ScheduleKind;
use pipec_compiler::Result;
use std::time::Instant;

/// The `straight` planner.
pub struct Straight;

/// Cut `w` (non-negative weights in order) into at most `k` contiguous non-empty runs minimizing
/// the largest run sum; returns the run lengths.
pub fn linear_partition(w: &[f64], k: usize) -> Vec<usize> {
    let n = w.len();
    if n == 0 {
        return Vec::new();
    }
    let k = k.clamp(1, n);
    let greedy = |cap: f64| -> Vec<usize> {
        let mut runs = Vec::new();
        let (mut len, mut sum) = (0usize, 0.0);
        for &x in w {
            if len > 0 && sum + x > cap {
                runs.push(len);
                len = 0;
                sum = 0.0;
            }
            len += 1;
            sum += x;
        }
        runs.push(len);
        runs
    };
    let total: f64 = w.iter().sum();
    let maxw = w.iter().copied().fold(0.0, f64::max);
    let (mut lo, mut hi) = (maxw, total.max(maxw));
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if greedy(mid).len() <= k {
            hi = mid;
        } else {
            lo = mid;
        }
        if hi - lo <= 1e-12 * hi.max(1e-300) {
            break;
        }
    }
    let mut runs = greedy(hi);
    // Use every device when there are enough nodes: split the longest runs further.
    while runs.len() < k {
        let Some((i, _)) = runs
            .iter()
            .enumerate()
            .filter(|(_, l)| **l > 1)
            .max_by_key(|(_, l)| **l)
        else {
            break;
        };
        let l = runs[i];
        runs[i] = l / 2;
        runs.insert(i + 1, l - l / 2);
    }
    runs
}

/// The stage time of the module doc: stage `s` over positions `[i, j)` of the chain `ch` cut
/// into `k` stages, `bw[s]` the bandwidth between stages `s` and `s + 1`.
struct StageTime<'a> {
    ch: &'a crate::cost::Chain,
    bw: &'a [f64],
    k: usize,
}

impl StageTime<'_> {
    /// The transfer into stage `s` starting at `i` (none into the first).
    fn comm_in(&self, s: usize, i: usize) -> f64 {
        if s > 0 {
            self.ch.cut[i] / self.bw[s - 1]
        } else {
            0.0
        }
    }
    /// The transfer out of stage `s` ending at `j` (none out of the last).
    fn comm_out(&self, s: usize, j: usize) -> f64 {
        if s + 1 < self.k {
            self.ch.cut[j] / self.bw[s]
        } else {
            0.0
        }
    }
    fn time(&self, s: usize, i: usize, j: usize) -> f64 {
        self.ch
            .compute(i, j)
            .max(self.comm_in(s, i) + self.comm_out(s, j))
    }
    /// The last position stage `s` may end at (every later stage keeps one position).
    fn last_end(&self, s: usize) -> usize {
        self.ch.len() + 1 - (self.k - s)
    }

    /// `reach[s][j]`: stages `0..=s` can cover positions `0..j` with every stage's time at
    /// most `t`. Per stage one pass over the ends with a monotone queue of the reachable
    /// starts (the starts whose compute to `j` is at most `t` form a window that only moves
    /// right): `O(k · n)`.
    fn forward(&self, t: f64) -> Vec<Vec<bool>> {
        let (n, k) = (self.ch.len(), self.k);
        let mut reach = vec![vec![false; n + 1]; k];
        let first_end = self.last_end(0);
        for (j, r) in reach[0].iter_mut().enumerate().take(first_end + 1).skip(1) {
            *r = self.time(0, 0, j) <= t;
        }
        let mut q: std::collections::VecDeque<(usize, f64)> = Default::default();
        for s in 1..k {
            q.clear();
            let (done, rest) = reach.split_at_mut(s);
            let (prev, row) = (&done[s - 1], &mut rest[0]);
            let mut next = s;
            let last = self.last_end(s);
            for (j, r) in row.iter_mut().enumerate().take(last + 1).skip(s + 1) {
                while next < j {
                    if prev[next] {
                        let c = self.comm_in(s, next);
                        while q.back().is_some_and(|&(_, v)| v >= c) {
                            q.pop_back();
                        }
                        q.push_back((next, c));
                    }
                    next += 1;
                }
                while q.front().is_some_and(|&(i, _)| self.ch.compute(i, j) > t) {
                    q.pop_front();
                }
                *r = q
                    .front()
                    .is_some_and(|&(_, c)| c + self.comm_out(s, j) <= t);
            }
        }
        reach
    }

    /// `done[s][j]`: stage `s` ending at `j` can be followed by stages `s + 1..k` covering
    /// the rest of the chain, each at most `t` (the mirror of [`StageTime::forward`]).
    fn backward(&self, t: f64) -> Vec<Vec<bool>> {
        let (n, k) = (self.ch.len(), self.k);
        let mut done = vec![vec![false; n + 1]; k];
        done[k - 1][n] = true;
        let mut q: std::collections::VecDeque<(usize, f64)> = Default::default();
        for s in (0..k - 1).rev() {
            q.clear();
            let (head, tail) = done.split_at_mut(s + 1);
            let (row, after) = (&mut head[s], &tail[0]);
            let mut next = self.last_end(s + 1);
            for j in (s + 1..=self.last_end(s)).rev() {
                while next > j {
                    if after[next] {
                        let c = self.comm_out(s + 1, next);
                        while q.back().is_some_and(|&(_, v)| v >= c) {
                            q.pop_back();
                        }
                        q.push_back((next, c));
                    }
                    next -= 1;
                }
                while q.front().is_some_and(|&(e, _)| self.ch.compute(j, e) > t) {
                    q.pop_front();
                }
                row[j] = q
                    .front()
                    .is_some_and(|&(_, c)| self.comm_in(s + 1, j) + c <= t);
            }
        }
        done
    }
}

/// Cut the chain into exactly `k` non-empty runs (`k ≤ n`) minimizing the bottleneck stage time
/// `max(compute, boundary bytes / bandwidth)`; `bw[s]` is the bandwidth between stage `s` and
/// `s + 1`. Returns the run lengths and the bottleneck.
///
/// The exact DP over (stage, end) of the module doc, on the states that can lie on a plan of
/// bottleneck at most `u`, an upper bound of the optimum found by bisection on the bottleneck
/// ([`StageTime::forward`] decides a bound in `O(k · n)`, from the compute-balanced runs'
/// bottleneck down to within 1e-4 of the optimum). A state with no such plan through it
/// (forward or backward) is on no optimal path, and a start whose stage time exceeds `u` is no
/// remaining state's choice: the optimum and the chosen starts are the DP's over all states
/// (same plans), at about `n/k` starts for each of the few states left (on a 4.4k-node Swin
/// export at 32 devices: 59 M candidate starts before, 0.34 s).
pub fn comm_aware_partition(ch: &crate::cost::Chain, k: usize, bw: &[f64]) -> (Vec<usize>, f64) {
    let n = ch.len();
    let k = k.clamp(1, n.max(1));
    if n == 0 {
        return (Vec::new(), 0.0);
    }
    let st = StageTime { ch, bw, k };
    // An upper bound of the optimum: the compute-balanced runs ([`linear_partition`]) costed
    // with their transfers, then bisected down while a plan stays feasible.
    let mut u = {
        let w: Vec<f64> = (0..n).map(|i| ch.compute(i, i + 1)).collect();
        let runs = linear_partition(&w, k);
        let mut at = 0;
        let mut worst: f64 = 0.0;
        for (s, len) in runs.iter().enumerate() {
            worst = worst.max(st.time(s, at, at + len));
            at += len;
        }
        if runs.len() == k {
            worst
        } else {
            f64::INFINITY
        }
    };
    if u.is_finite() {
        let mut lo = 0.0;
        for _ in 0..64 {
            if u - lo <= 1e-4 * u {
                break;
            }
            let mid = 0.5 * (lo + u);
            if st.forward(mid)[k - 1][n] {
                u = mid;
            } else {
                lo = mid;
            }
        }
    }
    let (reach, ahead) = if u.is_finite() {
        (st.forward(u), st.backward(u))
    } else {
        (vec![vec![true; n + 1]; k], vec![vec![true; n + 1]; k])
    };
    let on_path = |s: usize, j: usize| reach[s][j] && ahead[s][j];
    // best[s][j]: bottleneck of stages 0..=s covering positions 0..j; arg[s][j]: start of stage s.
    let mut best = vec![vec![f64::INFINITY; n + 1]; k];
    let mut arg = vec![vec![0usize; n + 1]; k];
    for (j, b) in best[0].iter_mut().enumerate().take(n + 2 - k).skip(1) {
        if on_path(0, j) {
            *b = st.time(0, 0, j);
        }
    }
    // The transfers into stage `s` ([`StageTime::comm_in`]), once per stage and start rather
    // than per candidate.
    let mut comm_in = vec![0.0f64; n + 1];
    for s in 1..k {
        for (i, c) in comm_in.iter_mut().enumerate() {
            *c = st.comm_in(s, i);
        }
        let (done, rest) = best.split_at_mut(s);
        let (prev_row, row) = (&done[s - 1], &mut rest[0]);
        for j in s + 1..=st.last_end(s) {
            if !on_path(s, j) {
                continue;
            }
            let out = st.comm_out(s, j);
            let (fj, bj) = (ch.fwd[j], ch.bwd[j]);
            // Starts `i` from the latest down: stage `s`'s compute only grows as `i` moves
            // earlier, so once it exceeds the best bottleneck (or `u`) no earlier start can do
            // better. Ties go to the earliest start.
            let (mut b, mut a) = (f64::INFINITY, s);
            for i in (s..j).rev() {
                let compute = (fj - ch.fwd[i]) + (bj - ch.bwd[i]);
                let cap = b.min(u);
                if compute > cap {
                    break;
                }
                let prev = prev_row[i];
                if prev > cap {
                    continue;
                }
                let t = prev.max(compute.max(comm_in[i] + out));
                if t <= b {
                    b = t;
                    a = i;
                }
            }
            row[j] = b;
            arg[s][j] = a;
        }
    }
    let mut runs = vec![0usize; k];
    let mut j = n;
    for s in (0..k).rev() {
        let i = if s == 0 { 0 } else { arg[s][j] };
        runs[s] = j - i;
        j = i;
    }
    (runs, best[k - 1][n])
}

/// A lower bound of the simulated iteration of the `straight` plan for `g` on `cluster` with
/// `opts`, without making it: the plan has `S = min(D, nodes)` single-device stages, contiguous
/// runs of the topological order, at the micro-batch `b` that [`Straight`] picks (`M = batch / b`
/// micro-batches). Each device runs its stage's `M` forwards and backwards one after another
/// (the simulator's per-device stream, [`crate::sim::compute_bound`]), so the iteration is at
/// least `M` times the largest stage's compute at `b`, and that is at least the smallest
/// largest run sum over every cut of the order into at most `S` runs (node times on the fastest
/// kind among the `S` devices). `O(nodes × 100)`; the `gpp` planner skips the `straight` seed
/// when this bound already exceeds its best plan (at 1024 devices the plan is 1024 stages and
/// 4096 micro-batches, a simulation of millions of tasks).
pub fn iteration_lower_bound(g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<f64> {
    let order = g.topo_order();
    let s = cluster.len().min(order.len()).max(1);
    let mb = opts.micro_batch_or(4 * s as u64);
    let m = opts.batch.max(1) / mb;
    let mut kinds: Vec<usize> = cluster.devices[..s.min(cluster.len())]
        .iter()
        .map(|d| d.kind)
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    let w: Vec<f64> = order
        .iter()
        .map(|&n| {
            kinds
                .iter()
                .map(|&k| {
                    let (f, b) = g.times(n, mb as f64, &cluster.kinds[k]);
                    f + b
                })
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let mut at = 0;
    let mut largest: f64 = 0.0;
    for len in linear_partition(&w, s) {
        largest = largest.max(w[at..at + len].iter().sum());
        at += len;
    }
    // `linear_partition` is optimal to its bisection's 1e-12: stay below.
    Ok(m as f64 * largest * (1.0 - 1e-9))
}

impl Planner for Straight {
    fn name(&self) -> &'static str {
        "straight"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let (specs, mb, objective, search) = partition(g, cluster, opts)?;
        Plan::assemble(
            self.name(),
            g,
            cluster,
            opts,
            specs,
            mb,
            opts.schedule.unwrap_or(ScheduleKind::OneFOneB),
            objective,
            search,
        )
    }

    /// The partition, then the simulation only when the bounds of [`Plan::assemble_below`] do
    /// not already reach `cutoff` (a straight pipeline of a communication-bound model is often
    /// 10-20× slower than GPP's plan, and its simulation costs as much as its search).
    fn plan_below(
        &self,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        cutoff: f64,
    ) -> Result<Option<Plan>> {
        let (specs, mb, objective, search) = partition(g, cluster, opts)?;
        Plan::assemble_below(
            self.name(),
            g,
            cluster,
            opts,
            specs,
            (mb, opts.schedule.unwrap_or(ScheduleKind::OneFOneB)),
            (objective, search),
            cutoff,
        )
    }
}

/// The stages of the `straight` plan (see the module doc), its micro-batch, its objective and
/// the search time.
fn partition(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
) -> Result<(Vec<StageSpec>, u64, f64, f64)> {
    let t0 = Instant::now();
    // Costed on device 0's kind (a straight pipeline does not rebalance for heterogeneity).
    let chain = g.chain(opts.batch.max(1) as f64, cluster.kind_of(0));
    let order = &chain.order;
    let k = cluster.len().min(chain.len()).max(1);
    let bw: Vec<f64> = (1..k)
        .map(|s| cluster.path(s - 1, s).map_or(f64::INFINITY, |p| p.0))
        .collect();
    let (runs, objective) = comm_aware_partition(&chain, k, &bw);
    let mut specs = Vec::with_capacity(runs.len());
    let mut at = 0usize;
    for (s, len) in runs.iter().enumerate() {
        specs.push(StageSpec {
            nodes: order[at..at + len].to_vec(),
            devices: vec![s],
        });
        at += len;
    }
    let mb = opts.micro_batch_or(4 * specs.len() as u64);
    let search = t0.elapsed().as_secs_f64();
    Ok((specs, mb, objective, search))
}
