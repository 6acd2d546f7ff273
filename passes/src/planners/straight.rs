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

use super::Planner;
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

/// Cut the chain into exactly `k` non-empty runs (`k ≤ n`) minimizing the bottleneck stage time
/// `max(compute, boundary bytes / bandwidth)`; `bw[s]` is the bandwidth between stage `s` and
/// `s + 1`. Returns the run lengths and the bottleneck.
pub fn comm_aware_partition(ch: &crate::cost::Chain, k: usize, bw: &[f64]) -> (Vec<usize>, f64) {
    let n = ch.len();
    let k = k.clamp(1, n.max(1));
    if n == 0 {
        return (Vec::new(), 0.0);
    }
    let stage_time = |s: usize, i: usize, j: usize| -> f64 {
        let mut comm = 0.0;
        if s > 0 {
            comm += ch.cut[i] / bw[s - 1];
        }
        if s + 1 < k {
            comm += ch.cut[j] / bw[s];
        }
        ch.compute(i, j).max(comm)
    };
    // best[s][j]: bottleneck of stages 0..=s covering positions 0..j; arg[s][j]: start of stage s.
    let mut best = vec![vec![f64::INFINITY; n + 1]; k];
    let mut arg = vec![vec![0usize; n + 1]; k];
    for (j, b) in best[0].iter_mut().enumerate().take(n + 2 - k).skip(1) {
        *b = stage_time(0, 0, j);
    }
    for s in 1..k {
        for j in s + 1..=n + 1 - (k - s) {
            // Starts `i` from the latest down: stage `s`'s compute only grows as `i` moves
            // earlier, so once it exceeds the best bottleneck no earlier start can do better.
            // Ties go to the earliest start.
            let (mut b, mut a) = (f64::INFINITY, s);
            for i in (s..j).rev() {
                if ch.compute(i, j) > b {
                    break;
                }
                let prev = best[s - 1][i];
                if prev > b {
                    continue;
                }
                let t = prev.max(stage_time(s, i, j));
                if t <= b {
                    b = t;
                    a = i;
                }
            }
            best[s][j] = b;
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
    let mb = opts.micro_batch_or(4 * s as u64)?;
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
        let mb = opts.micro_batch_or(4 * specs.len() as u64)?;
        let search = t0.elapsed().as_secs_f64();
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
}
