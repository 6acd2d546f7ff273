//! `--schedule interleaved-V` and `--schedule zbv` for any planner: Megatron-LM's interleaved
//! 1F1B (Narayanan et al., SC'21, §2.2) and ZB-V (Qi et al., ICLR 2024, §6) on the device groups
//! a planner chose.
//!
//! Interleaving needs another partition than the planner's: the model in `V·P` chunks, chunk
//! `c·P + r` on device group `r` ([`crate::sim::schedule::interleaved_groups`]), so each group
//! holds `V` non-adjacent pieces and a micro-batch crosses every group `V` times. [`Interleaved`]
//! runs the planner under 1F1B (the schedule interleaving refines), takes its `P` stages as the
//! device groups (in a topological order of its stage DAG, which with one group per stage is a
//! chain order of the nodes), and cuts that node order into `V` rounds of `P` chunks: round `c`
//! is `1/V` of the model's work, and within it group `r` gets the share of the work its stage
//! had in the planner's plan (the balance the planner found between groups of different replica
//! counts and links). Work is a node's forward + backward seconds at the micro-batch on device
//! 0's kind. Each chunk is a run of a topological order, hence convex, and every stage edge goes
//! from a lower chunk to a higher one. ZB-V is the same with `V = 2` and its V-shaped layout:
//! the second round's chunks go back up the groups (chunk `k ≥ P` on group `2P − 1 − k`, with
//! that group's share).
//!
//! Micro-batch: the planner's when every group's replicas divide it and, under interleaved
//! 1F1B, the pipeline's `P` groups divide the micro-batch count, else the nearest that does
//! (smaller first: interleaving wants micro-batches); `--micro-batch` is kept as given. The plan is simulated under
//! `interleaved-V` like any other ([`Plan::assemble`]); its objective is that simulated time.
//!
//! Cost: the planner's search, one pass over the nodes and one simulation.

use super::planner::Planner;
use crate::cost::{Cluster, CostGraph};
use crate::plan::{micro_batches, Plan, PlanOptions, StageSpec};
use crate::sim::ScheduleKind;
use pipec_compiler::{Error, Result};
use std::time::Instant;

/// A planner's device groups with its stages re-cut into chunks for `schedule` (see the module
/// doc).
pub struct Interleaved<'a> {
    pub inner: &'a dyn Planner,
    /// `interleaved-V` (`V ≥ 2`), `interleaved` (`V = 0`: the planner picks among
    /// [`AUTO_CHUNKS`], ZB-V and its 1F1B plan) or `zbv`.
    pub schedule: ScheduleKind,
}

/// The chunk counts `--schedule interleaved` (no `V`) tries on the planner's device groups,
/// besides ZB-V and its own 1F1B plan (`V = 1`): the fastest plan that fits in memory wins
/// ([`Plan::beats`]), so where interleaving's extra messages cost more than its smaller bubble
/// the plan stays 1F1B.
pub const AUTO_CHUNKS: [usize; 5] = [2, 3, 4, 6, 8];

impl Planner for Interleaved<'_> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        let mut inner_opts = opts.clone();
        inner_opts.schedule = Some(ScheduleKind::OneFOneB);
        let base = self.inner.plan(g, cluster, &inner_opts)?;
        if self.schedule != ScheduleKind::Interleaved(0) {
            let mut plan = interleave(&base, self.inner.name(), g, cluster, opts, self.schedule)?;
            plan.search_time_s = base.search_time_s + t0.elapsed().as_secs_f64();
            return Ok(plan);
        }
        // The planner picks: its own 1F1B plan, or the fastest interleaving (ZB-V among them)
        // that fits.
        let mut best = base.clone();
        let kinds = AUTO_CHUNKS
            .iter()
            .map(|&v| ScheduleKind::Interleaved(v as u32))
            .chain([ScheduleKind::Zbv]);
        for kind in kinds {
            if let Ok(p) = interleave(&base, self.inner.name(), g, cluster, opts, kind) {
                if p.beats(&best) {
                    best = p;
                }
            }
        }
        best.search_time_s = base.search_time_s + t0.elapsed().as_secs_f64();
        Ok(best)
    }
}

/// `base` (a plan under 1F1B) with its stages re-cut into `kind.chunks()` chunks per device
/// group laid out for `kind` (interleaved-V or zbv; see the module doc); `name` is its
/// planner's. The search time is left to the caller.
pub fn interleave(
    base: &Plan,
    name: &'static str,
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    kind: ScheduleKind,
) -> Result<Plan> {
    let v = kind.chunks();
    let p = base.stages.len();
    if p < 2 {
        return Err(Error::infeasible(
            name,
            format!(
                "--schedule {kind} interleaves the stages of a pipeline, but the planner chose {p} stage (data parallelism); use more devices or another planner"
            ),
        ));
    }
    // The groups in a topological order of the stage DAG.
    let mut succ = vec![Vec::new(); p];
    for (s, st) in base.stages.iter().enumerate() {
        for &q in &st.predecessors {
            succ[q].push(s);
        }
    }
    let order = pipec_compiler::topo::topo_order(p, |s| succ[s].iter().copied())
        .map_err(|_| Error::msg(format!("{name}: the stage graph has a cycle")))?;
    let chain: Vec<usize> = order
        .iter()
        .flat_map(|&s| base.stages[s].nodes.iter().copied())
        .collect();
    let n = chain.len();
    if n < v * p {
        return Err(Error::infeasible(
            name,
            format!(
                "--schedule {kind} needs {} chunks ({v} on each of {p} device groups) but the model has {n} nodes",
                v * p
            ),
        ));
    }
    let micro_batch = interleaved_micro_batch(opts, base, kind)?;
    let kind0 = cluster.kind_of(0);
    let work: Vec<f64> = chain
        .iter()
        .map(|&u| {
            let (f, b) = g.times(u, micro_batch as f64, kind0);
            f + b
        })
        .collect();
    let total: f64 = work.iter().sum();
    // Each group's share of the work in the planner's plan (node counts if no work).
    let share: Vec<f64> = order
        .iter()
        .map(|&s| {
            let nodes = &base.stages[s].nodes;
            if total > 0.0 {
                nodes
                    .iter()
                    .map(|&u| {
                        let (f, b) = g.times(u, micro_batch as f64, kind0);
                        f + b
                    })
                    .sum::<f64>()
                    / total
            } else {
                nodes.len() as f64 / n as f64
            }
        })
        .collect();
    let weight: Vec<f64> = if total > 0.0 { work } else { vec![1.0; n] };
    let groups: Vec<usize> = (0..v * p).map(|k| kind.group_of(k, p)).collect();
    let ends = cut_rounds(&weight, &share, &groups);
    let mut specs = Vec::with_capacity(v * p);
    let mut at = 0;
    for (k, &end) in ends.iter().enumerate() {
        specs.push(StageSpec {
            nodes: chain[at..end].to_vec(),
            devices: base.stages[order[groups[k]]].devices.clone(),
        });
        at = end;
    }
    let mut plan = Plan::assemble(name, g, cluster, opts, specs, micro_batch, kind, 0.0, 0.0)?;
    plan.objective_s = plan.iteration_time_s;
    plan.time_limited = base.time_limited;
    plan.search_capped = base.search_capped;
    Ok(plan)
}

/// The micro-batch of a plan re-cut for `kind` (see the module doc): `--micro-batch` as given,
/// else the one nearest the planner's (smaller first) that every group's replica count divides
/// and, under interleaved 1F1B, whose count the `p` groups divide.
fn interleaved_micro_batch(opts: &PlanOptions, base: &Plan, kind: ScheduleKind) -> Result<u64> {
    if let Some(mb) = opts.micro_batch() {
        return Ok(mb);
    }
    let batch = opts.batch.max(1);
    let p = base.stages.len() as u64;
    let in_groups = kind.micro_batches_in_groups();
    let fits = |mb: u64| {
        micro_batches(batch, mb).is_ok_and(|m| !in_groups || m.is_multiple_of(p))
            && base
                .stages
                .iter()
                .all(|s| mb.is_multiple_of(s.devices.len() as u64))
    };
    let mb0 = base.micro_batch.size();
    (1..=mb0)
        .rev()
        .chain(mb0 + 1..=batch)
        .find(|&mb| fits(mb))
        .ok_or_else(|| {
            Error::infeasible(
                base.planner.clone(),
                if in_groups {
                    format!(
                        "no micro-batch of the batch {batch} gives a multiple of the pipeline's {p} device groups as micro-batches, split evenly over every group's replicas"
                    )
                } else {
                    format!(
                        "no micro-batch of the batch {batch} splits evenly over every device group's replicas ({kind})"
                    )
                },
            )
        })
}

/// Where the `v·p` chunks of a chain with node `weight`s end (exclusive indices, the last
/// `weight.len()`), chunk `k` going to device group `groups[k]` (each of the `p` groups once in
/// every round of `p` chunks): round `c` of `v` ends at `(c + 1)/v` of the total, and within
/// it chunk `k` at the cumulative `share` of the groups of the round's chunks up to `k`. Every
/// chunk gets at least one node (the chain has at least `v·p`).
pub fn cut_rounds(weight: &[f64], share: &[f64], groups: &[usize]) -> Vec<usize> {
    let (n, p) = (weight.len(), share.len());
    let k_all = groups.len();
    let v = (k_all / p.max(1)).max(1);
    let total: f64 = weight.iter().sum();
    let mut prefix = Vec::with_capacity(n + 1);
    prefix.push(0.0);
    for w in weight {
        prefix.push(prefix.last().copied().unwrap_or(0.0) + w);
    }
    let mut ends = Vec::with_capacity(k_all);
    let mut cum = 0.0;
    let mut prev = 0usize;
    for (k, &g) in groups.iter().enumerate() {
        let (c, r) = (k / p, k % p);
        if r == 0 {
            cum = 0.0;
        }
        cum += share[g];
        let target = total * (c as f64 + cum.min(1.0)) / v as f64;
        // The boundary whose prefix is nearest the target.
        let i = prefix.partition_point(|&x| x < target).min(n);
        let i = if i > 0 && (target - prefix[i - 1]) <= (prefix[i] - target) {
            i - 1
        } else {
            i
        };
        // At least one node here and one for each chunk after it.
        let end = if k + 1 == k_all {
            n
        } else {
            i.clamp(prev + 1, n - (k_all - 1 - k))
        };
        ends.push(end);
        prev = end;
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::cut_rounds;

    #[test]
    fn rounds_split_work_by_the_groups_shares() {
        // 12 unit nodes, 2 groups with shares 1/3 and 2/3, 2 rounds: chunks of 2, 4, 2, 4.
        let ends = cut_rounds(&[1.0; 12], &[1.0 / 3.0, 2.0 / 3.0], &[0, 1, 0, 1]);
        assert_eq!(ends, vec![2, 6, 8, 12]);
        // ZB-V's V: the second round comes back up the groups.
        let ends = cut_rounds(&[1.0; 12], &[1.0 / 3.0, 2.0 / 3.0], &[0, 1, 1, 0]);
        assert_eq!(ends, vec![2, 6, 10, 12]);
        // Every chunk keeps a node even when the work sits in one place.
        let mut w = vec![0.0; 8];
        w[7] = 5.0;
        let ends = cut_rounds(&w, &[0.5, 0.5], &[0, 1, 0, 1]);
        assert_eq!(ends.len(), 4);
        assert!(ends.windows(2).all(|x| x[0] < x[1]), "{ends:?}");
        assert_eq!(*ends.last().unwrap(), 8);
    }
}
