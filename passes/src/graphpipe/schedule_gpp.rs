//! `schedule-gpp`: GraphPipe's static micro-batch scheduler (Jeon et al., ASPLOS'25, §6,
//! Algorithm 2 and Appendix A.1 `ComputeInFlight`), and the verifier of a stage graph's validity
//! conditions C1–C4 (§3).
//!
//! # Contract
//! - **Requires**: a stage DAG (stages, edges), a micro-batch size `b_s` and a `k_s` (of `k_sFk_sB`)
//!   per stage, the number of micro-batches.
//! - **Guarantees** (the algorithm lives in [`crate::sim::in_flight`], which the simulator's
//!   schedules and the partitioner share; re-exported here): [`in_flight_samples`] gives every stage's in-flight count (samples), computed
//!   in **reverse topological order** (the last stages first: a stage's activation memory needs its
//!   successors' complete schedules), each stage taking the largest [`compute_in_flight`] over its
//!   successors (Appendix A.1; the paper's `max_{(S_x,S_y)}` ranges over the stage edges); a sink
//!   stage holds `k·b` samples. [`choose_k`] picks each stage's `k` as the paper's
//!   `argmin_k max_y ComputeInFlight(k, b_x, k_y, b_y, i_y)`. The instruction lists themselves
//!   are [`crate::sim::schedule::generate`] with [`ScheduleKind::Gpp`]: each stage runs
//!   `K_s = min(i_s / b, M)` warm-up forwards, then one backward as early as possible after each
//!   forward (SCHEDULETASK's greedy early backward), then drains.
//! - **Default** (uniform `b`, 1F1B, `k = 1`): row 7 of the table applies to every edge,
//!   `i_x = max_y i_y + b`, so a stage's in-flight micro-batches equal the number of stages on the
//!   longest path from it to a sink: exactly [`crate::sim::StageGraph::depth_to_sink`], which the
//!   partitioner's DP also uses (its `δ`).
//! - [`verify`] checks C1 (stages partition the nodes and are convex), C2 (every graph edge
//!   between stages is a stage edge, and the stage graph is acyclic), C3 (device sets partition the
//!   plan's devices, the first `plan.devices` of the cluster; each stage has one) and C4 (in every replica's program, `fw_k` before
//!   `fw_{k+1}`, `bw_k` before `bw_{k+1}`, `fw_k` before `bw_k`, each exactly once).

use crate::cost::{Cluster, CostGraph};
use crate::plan::Plan;
use crate::sim::schedule::{Instr, Schedule};
use crate::sim::ScheduleKind;
use pipec_compiler::passmgr::PassInfo;
use pipec_compiler::{Error, Result};

pub use crate::sim::in_flight::{
    choose_k, compute_in_flight, default_in_flight, in_flight_samples, reverse_topo,
};

/// Check C1–C4 for `plan` (on `g`, `cluster`) and its `schedule`.
pub fn verify(plan: &Plan, g: &CostGraph, cluster: &Cluster, schedule: &Schedule) -> Result<()> {
    // C1 (partition) and C2 (edges induce the stage DAG; acyclic, which with a partition is
    // convexity: a path leaving a stage and re-entering it would be a stage cycle).
    plan.verify(g, cluster)
        .map_err(|e| Error::msg(format!("C1/C2: {e}")))?;
    let specs = plan.specs();
    let stage_of = crate::stage::stage_of(&specs, g.len());
    // C1 explicitly: no path leaves a stage and comes back (reachability in the node DAG).
    for s in 0..specs.len() {
        let mut left = vec![false; g.len()];
        for &u in g.topo_order() {
            if stage_of[u] == s {
                if let Some(p) = g.preds(u).find(|&p| left[p]) {
                    return Err(Error::msg(format!(
                        "C1: stage {s} is not convex: node '{}' is reached from it through '{}' of stage {}",
                        g.nodes[u].name, g.nodes[p].name, stage_of[p]
                    )));
                }
            } else {
                left[u] = g.preds(u).any(|p| stage_of[p] == s || left[p]);
            }
        }
    }
    // C3: device sets partition the plan's devices, the first `plan.devices` of the cluster (a
    // plan may leave the rest idle: a small model trains faster on fewer devices).
    let mut used = vec![0usize; plan.devices().min(cluster.len())];
    for sp in &specs {
        if sp.devices.is_empty() {
            return Err(Error::msg("C3: a stage has no device"));
        }
        for &d in &sp.devices {
            match used.get_mut(d) {
                Some(u) => *u += 1,
                None => {
                    return Err(Error::msg(format!(
                        "C3: device {d} is not one of the plan's {} devices",
                        used.len()
                    )))
                }
            }
        }
    }
    if let Some(d) = used.iter().position(|&u| u != 1) {
        return Err(Error::msg(format!(
            "C3: device {d} is used by {} stages (must be exactly 1)",
            used[d]
        )));
    }
    // C4: per replica program order: every micro-batch of the stage in order, or, for a
    // replica taking whole micro-batches in turn (1F1B-RR, or a micro-batch that does not divide
    // over the stage's replicas), its own ones `j, j + r, ...`.
    let m = schedule.micro_batches;
    let mine = |d: usize, s: usize| -> Vec<usize> {
        let ms = schedule.stage_micro_batches.get(s).copied().unwrap_or(m);
        let devs = &specs[s].devices;
        let r = devs.len().max(1);
        // The stage's own micro-batch size (per-stage schedules run `batch / b_s` of them).
        let own = plan.batch() / ms.max(1) as u64;
        let whole =
            (r > 1 && schedule.kind.round_robin()) || crate::sim::takes_turns(own as f64, r);
        match devs.iter().position(|&x| x == d) {
            Some(j) if whole => crate::sim::schedule::round_robin_micro_batches(j, r, ms),
            _ => (0..ms).collect(),
        }
    };
    for (d, prog) in schedule.programs.iter().enumerate() {
        let mut next_f: std::collections::HashMap<usize, usize> = Default::default();
        let mut next_b: std::collections::HashMap<usize, usize> = Default::default();
        let mut want: std::collections::HashMap<usize, Vec<usize>> = Default::default();
        for ins in prog {
            match ins {
                Instr::Forward { stage, mb } => {
                    let w = want.entry(*stage).or_insert_with(|| mine(d, *stage));
                    let f = next_f.entry(*stage).or_insert(0);
                    if w.get(*f) != Some(mb) {
                        return Err(Error::msg(format!(
                            "C4: device {d} stage {stage}: forward {mb} out of order (expected {:?})",
                            w.get(*f)
                        )));
                    }
                    *f += 1;
                }
                Instr::Backward { stage, mb } => {
                    let w = want.entry(*stage).or_insert_with(|| mine(d, *stage));
                    let f = next_f.get(stage).copied().unwrap_or(0);
                    let b = next_b.entry(*stage).or_insert(0);
                    if w.get(*b) != Some(mb) || *b >= f {
                        return Err(Error::msg(format!(
                            "C4: device {d} stage {stage}: backward {mb} before its forward or out of order"
                        )));
                    }
                    *b += 1;
                }
                _ => {}
            }
        }
        for (s, f) in &next_f {
            let m = want.get(s).map_or(0, Vec::len);
            if *f != m || next_b.get(s).copied().unwrap_or(0) != m {
                return Err(Error::msg(format!(
                    "C4: device {d} stage {s}: {f} forwards / {} backwards, expected {m}",
                    next_b.get(s).copied().unwrap_or(0)
                )));
            }
        }
    }
    Ok(())
}

/// The `schedule-gpp` IR pass: reads `pipec.stage` (from `partition-gpp`), computes every stage's
/// in-flight count with [`in_flight_samples`] in reverse topological order, writes
/// `pipec.stage{i}.in_flight` (micro-batches), generates the GPP schedule and checks C1–C4.
pub struct ScheduleGpp;

/// The contract of `schedule-gpp` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "schedule-gpp",
    summary: "GraphPipe scheduler (Algorithm 2, ComputeInFlight): per-stage in-flight counts, C1-C4 check",
    options: &[],
    statistics: &["max-in-flight", "stages"],
    requires: &[("pipec.stages", "partition-gpp")],
    provides: &[],
    invalidates: &[],
};

impl pipec_compiler::passmgr::Pass for ScheduleGpp {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(
        &self,
        module: &mut pipec_compiler::ir::Module,
        stats: &mut pipec_compiler::passmgr::Stats,
    ) -> Result<()> {
        use crate::plan::{PlanOptions, StageSpec};
        use crate::sim::StageGraph;
        use pipec_compiler::ir::Attr;
        let g = crate::graphpipe::gpp_ir::cost_graph(module)?;
        let cfg = crate::graphpipe::gpp_ir::IrConfig::from_module(module, &g)?;
        let missing = || Error::msg("schedule-gpp: run partition-gpp first (no pipec.stage)");
        let ns = module
            .attrs
            .get("pipec.stages")
            .and_then(Attr::as_int)
            .ok_or_else(missing)? as usize;
        let mb = module
            .attrs
            .get("pipec.micro_batch")
            .and_then(Attr::as_int)
            .ok_or_else(missing)?
            .max(1) as u64;
        let mut specs: Vec<StageSpec> = (0..ns)
            .map(|s| {
                let devices = module
                    .attrs
                    .get(&format!("pipec.stage{s}.devices"))
                    .and_then(Attr::as_ints)
                    .map(|v| v.iter().map(|&d| d.max(0) as usize).collect())
                    .unwrap_or_default();
                StageSpec {
                    nodes: Vec::new(),
                    devices,
                }
            })
            .collect();
        for (n, &op) in module.graph.order.iter().enumerate() {
            let s = module.graph.ops[op]
                .int_attr("pipec.stage")
                .ok_or_else(missing)?;
            let s = usize::try_from(s)
                .ok()
                .filter(|&s| s < ns)
                .ok_or_else(|| Error::msg(format!("schedule-gpp: op {n} has stage {s} of {ns}")))?;
            specs[s].nodes.push(n);
        }
        let kind = cfg.schedule.unwrap_or(ScheduleKind::Gpp);
        let mut opts = PlanOptions::new(cfg.batch);
        opts.set_micro_batch(Some(mb))?;
        opts.schedule = Some(kind);
        let plan = Plan::assemble(
            "gpp",
            &g,
            &cfg.cluster,
            &opts,
            specs.clone(),
            mb,
            kind,
            0.0,
            0.0,
        )?;
        // Per-stage micro-batch sizes and k (`gpp-per-stage`, from partition-gpp).
        let own = |s: usize, what: &str| {
            module
                .attrs
                .get(&format!("pipec.stage{s}.{what}"))
                .and_then(Attr::as_int)
                .map(|x| x.max(1) as u64)
        };
        let sg = match (0..ns)
            .map(|s| own(s, "micro_batch").zip(own(s, "k")))
            .collect::<Option<Vec<(u64, u64)>>>()
        {
            Some(v) if kind == ScheduleKind::GppPerStage => {
                let ps = crate::sim::PerStage {
                    batch: cfg.batch,
                    base_micro_batch: mb,
                    micro_batch: v.iter().map(|x| x.0).collect(),
                    group: v.iter().map(|x| x.1).collect(),
                };
                StageGraph::from_specs_per_stage(&g, &cfg.cluster, &specs, opts.optimizer, ps)
            }
            _ => StageGraph::from_specs(&g, &cfg.cluster, &specs, mb as f64, opts.optimizer),
        };
        let m = (cfg.batch / mb) as usize;
        // The warm-ups are the in-flight counts of Appendix A.1 (`in_flight_samples`) with each
        // stage's b and k, in micro-batches of the stage.
        let sched = crate::sim::schedule::generate(&sg, kind, m);
        verify(&plan, &g, &cfg.cluster, &sched)?;
        for (s, k) in sched.warmup.iter().enumerate() {
            module
                .attrs
                .insert(format!("pipec.stage{s}.in_flight"), Attr::Int(*k as i64));
        }
        stats.add("stages", ns as u64);
        stats.add(
            "max-in-flight",
            sched.warmup.iter().max().copied().unwrap_or(0) as u64,
        );
        Ok(())
    }
}
