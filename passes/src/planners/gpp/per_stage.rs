//! GraphPipe's per-stage micro-batch sizes and `k_sFk_sB` schedules (`--schedule
//! gpp-per-stage`; Jeon et al., ASPLOS'25 §4 "`b_i` is the micro-batch size of `S_i`", §6 and
//! Figure 5, Appendix A.1), on top of the GPP planner's stage graph.
//!
//! # Contract
//! - **Requires**: the GPP planner's chosen stages (nodes, replicas, devices) and its uniform
//!   micro-batch `b`.
//! - **Guarantees**: per stage a micro-batch size `b_s` (a divisor of the mini-batch `B`, a
//!   multiple of the stage's replica count, `b·2^j` for `|j| ≤ 3`; `b` itself for a stage with
//!   batch statistics, `BatchNormalization`) and a group `k_s`, such that
//!   the simulated iteration ([`crate::sim::schedule`]'s per-stage kFkB schedule) fits every
//!   device's memory and is no slower than the uniform `b`, 1F1B start (the plan the default
//!   schedule gives); each `k_s` is the paper's `argmin_k max_y ComputeInFlight(k, b_s, k_y, b_y,
//!   i_y)` over `k ∈ {1, 2, 4}` ([`crate::sim::in_flight::choose_k`]), taken in reverse topological
//!   order as Algorithm 2 schedules stages.
//!
//! # Method (and how it differs from the paper)
//! The paper folds `(i, b, k)` into the DP's schedule configuration. Here the DP's partition and
//! replica counts are kept and the sizes are chosen afterwards by coordinate descent on the
//! simulator: for each stage in turn, every candidate `b_s` is tried with the others fixed (the
//! `k`s re-chosen), and the fastest configuration that fits is kept; passes repeat until none
//! improves (at most [`MAX_PASSES`]). The simulator is the judge because a stage's size changes
//! its neighbours' in-flight counts, the re-slicing traffic and the pipeline fill, which a
//! per-stage TPS does not see. As the paper notes (§6), this is rarely better than the uniform
//! default for the models it evaluates; it helps where stages differ in how their time scales
//! with the micro-batch (per-op efficiency, fixed per-micro-batch costs such as latency).
//!
//! Search cost: at most [`MAX_PASSES`] passes × stages × 7 candidate sizes (`b·2^j`), each one
//! simulation of the whole schedule (stages × micro-batches events), plus the `k` choice per
//! candidate; nothing is pruned, the coordinate descent stops at the first pass without
//! improvement.

use crate::cost::{Cluster, CostGraph};
use crate::plan::{couples_samples, PlanOptions, StageSpec};
use crate::sim::in_flight::{choose_k, in_flight_samples, reverse_topo};
use crate::sim::{schedule, simulate, PerStage, ScheduleKind, SimResult, StageGraph};
use pipec_compiler::Result;

/// Most coordinate-descent passes over the stages.
pub const MAX_PASSES: usize = 3;

/// `k` candidates of every stage's `k_sFk_sB` order.
const GROUPS: [u64; 3] = [1, 2, 4];

/// The chosen configuration (`graph.per_stage`) with its stage graph and simulation.
pub struct PerStagePlan {
    pub graph: StageGraph,
    pub sim: SimResult,
}

/// Each stage's `k_s` (`argmin_k` of Appendix A.1, sinks first) for sizes `b`.
pub fn choose_groups(succ: &[Vec<usize>], b: &[u64]) -> Vec<u64> {
    let n = succ.len();
    let mut k = vec![1u64; n];
    let mut i = vec![0u64; n];
    for x in reverse_topo(succ) {
        let ys: Vec<(u64, u64, u64)> = succ[x].iter().map(|&y| (k[y], b[y], i[y])).collect();
        k[x] = choose_k(b[x], &ys, &GROUPS);
        // Only x's own in-flight count changes (its successors are final).
        i[x] = in_flight_samples(succ, b, &k)[x];
    }
    k
}

/// Candidate sizes of a stage with `r` replicas: `b·2^j` (`|j| ≤ 3`) dividing `batch`, multiples of `r`.
fn candidates(batch: u64, b: u64, r: u64) -> Vec<u64> {
    (-3i32..=3)
        .filter_map(|j| {
            let x = if j < 0 {
                b.checked_shr((-j) as u32)
                    .filter(|&x| x << (-j) as u32 == b)?
            } else {
                b.checked_shl(j as u32)?
            };
            (x >= 1 && x <= batch && batch.is_multiple_of(x) && x.is_multiple_of(r)).then_some(x)
        })
        .collect()
}

/// Search per-stage sizes and groups for `specs` (from the GPP planner at micro-batch `b`).
/// `None` when some stage has no valid size (its replicas divide no candidate) or no
/// configuration fits in memory.
pub fn search(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    specs: &[StageSpec],
    b: u64,
) -> Result<Option<PerStagePlan>> {
    let batch = opts.batch.max(1);
    let n = specs.len();
    // A stage with batch statistics keeps the plan's size (re-slicing would change them).
    let coupled = |s: &StageSpec| s.nodes.iter().any(|&n| couples_samples(&g.nodes[n].op));
    let cands: Vec<Vec<u64>> = specs
        .iter()
        .map(|s| {
            let mut c = candidates(batch, b, s.devices.len().max(1) as u64);
            if coupled(s) {
                c.retain(|&x| x == b);
            }
            c
        })
        .collect();
    // Start: the uniform size where the replicas divide it, else the nearest candidate above.
    let mut sizes = Vec::with_capacity(n);
    for c in &cands {
        match c.iter().find(|&&x| x >= b).or(c.last()) {
            Some(&x) => sizes.push(x),
            None => return Ok(None),
        }
    }
    let eval = |sizes: &[u64]| -> Result<Option<PerStagePlan>> {
        let config = PerStage {
            batch,
            base_micro_batch: b,
            micro_batch: sizes.to_vec(),
            group: vec![1; n],
        };
        let mut graph = StageGraph::from_specs_per_stage(g, cluster, specs, opts.optimizer, config);
        // Each k_s depends on the stage DAG and the sizes only.
        let groups = choose_groups(&graph.successors(), sizes);
        if let Some(ps) = graph.per_stage.as_mut() {
            ps.group = groups;
        }
        let sched = schedule::generate(&graph, ScheduleKind::GppPerStage, (batch / b) as usize);
        let sim = simulate(&graph, &sched, cluster, opts.allreduce)?;
        Ok((!sim.out_of_memory(cluster)).then_some(PerStagePlan { graph, sim }))
    };
    let Some(mut best) = eval(&sizes)? else {
        return Ok(None);
    };
    for _ in 0..MAX_PASSES {
        let mut improved = false;
        for s in 0..n {
            for &x in &cands[s] {
                if x == sizes[s] {
                    continue;
                }
                let mut trial = sizes.clone();
                trial[s] = x;
                if let Some(p) = eval(&trial)? {
                    if p.sim.iteration_time_s < best.sim.iteration_time_s * (1.0 - 1e-9) {
                        best = p;
                        sizes = trial;
                        improved = true;
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    Ok(Some(best))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_sizes() {
        assert_eq!(candidates(64, 8, 1), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(candidates(64, 8, 4), vec![4, 8, 16, 32, 64]);
        assert_eq!(candidates(24, 6, 1), vec![3, 6, 12, 24]);
        assert_eq!(candidates(8, 2, 3), Vec::<u64>::new());
    }

    #[test]
    fn groups_by_argmin() {
        // Figure 5: S1 (b = 1) -> S2 (b = 2) -> S3 (b = 4): every stage's k minimises its
        // in-flight samples; a chain of equal sizes keeps 1F1B.
        let succ = vec![vec![1], vec![2], vec![]];
        assert_eq!(choose_groups(&succ, &[2, 2, 2]), vec![1, 1, 1]);
        let k = choose_groups(&succ, &[1, 2, 4]);
        let i = in_flight_samples(&succ, &[1, 2, 4], &k);
        for k0 in GROUPS {
            let mut kk = k.clone();
            kk[0] = k0;
            assert!(in_flight_samples(&succ, &[1, 2, 4], &kk)[0] >= i[0]);
        }
    }
}
