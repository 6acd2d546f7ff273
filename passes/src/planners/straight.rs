//! `straight`: one stage per device, no replication, the nodes cut into contiguous runs of the
//! graph's topological order so that the slowest stage (forward + backward) is as fast as possible.
//!
//! The cut is the classic linear partition: binary search on the bottleneck `T` with a greedy
//! feasibility check (fill a stage until adding the next node would exceed `T`), exact for the
//! min-max partition of a sequence into at most `D` runs. `Input` nodes come first in the order,
//! so they land in the first stage. The default micro-batch gives `M ≈ 4·S` micro-batches and the
//! default schedule is 1F1B.
//!
//! Objective: the slowest stage's forward + backward time per batch, PipeDream's "time per stage"
//! without replication (`max_s Σ_{l∈s} (F_l + B_l)` at the whole batch).

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

impl Planner for Straight {
    fn name(&self) -> &'static str {
        "straight"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        // Costed on device 0's kind (a straight pipeline does not rebalance for heterogeneity).
        let chain = g.chain(opts.batch.max(1) as f64, cluster.kind_of(0));
        let order = &chain.order;
        let w: Vec<f64> = (0..chain.len()).map(|i| chain.compute(i, i + 1)).collect();
        let runs = linear_partition(&w, cluster.len());
        let mut specs = Vec::with_capacity(runs.len());
        let (mut at, mut objective) = (0usize, 0.0f64);
        for (s, len) in runs.iter().enumerate() {
            objective = objective.max(w[at..at + len].iter().sum());
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
