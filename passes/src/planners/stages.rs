//! `--stages SPEC`: a plan the user writes, costed and simulated exactly like a planner's, so
//! hand-made and planned pipelines are compared on the same model (`pipec plan --stages`), and
//! compiled like any plan (`pipec compile --stages`).
//!
//! `SPEC` is stages separated by `;`, each `ITEMS[@R]` (`R` replicas, default 1), `ITEMS` a
//! comma-separated list of
//! - `A..B`: the nodes at positions `A` to `B − 1` of the model's node order (the ONNX node
//!   order; `pipec inspect` lists it); either end may be left out (`..B` from the first node,
//!   `A..` to the last);
//! - `NAME`: one node by name;
//! - `FIRST..=LAST`: the nodes from `FIRST` to `LAST` in node order, both included (`..=LAST`
//!   from the first node); any end of a range may be a position or a node name.
//!
//! Every node must be in exactly one stage. Stage `s` runs on the next `R_s` devices in order;
//! under `--schedule interleaved-V` the `S` stages are `V` chunks on each of `P = S / V` device
//! groups: stages `0..P` take the next devices in order and stage `s ≥ P` runs on the devices of
//! stage `s mod P` (its `R` must be theirs), as Megatron-LM deals model chunks to devices;
//! under `--schedule zbv` the `2P` stages go down the groups and back up as a V, stage `s ≥ P`
//! on the devices of stage `2P − 1 − s`.
//! Without `--micro-batch`, every divisor of the batch that each stage's replica count divides
//! is simulated and the fastest is kept (ties: the larger micro-batch); the schedule defaults to
//! `gpp` (1F1B on the stage DAG).

use super::planner::Planner;
use crate::cost::{Cluster, CostGraph};
use crate::plan::{micro_batches, Plan, PlanOptions, StageSpec};
use crate::sim::ScheduleKind;
use pipec_compiler::{Error, PlanOption, Result};
use std::time::Instant;

/// Most micro-batch sizes tried when `--micro-batch` is not given.
const MAX_TRIES: usize = 64;

/// The user's stages (see the module doc).
pub struct UserStages {
    pub spec: String,
}

fn err(spec: &str, m: impl std::fmt::Display) -> Error {
    Error::option(PlanOption::Stages, format!("'{spec}'"), m.to_string())
}

/// Parse `spec` against `g` into stage specs on devices `0..`, at most `devices` of them, laid
/// out for `schedule` ([`ScheduleKind::chunks`] stages per device group: 1, `V` of
/// `interleaved-V` or 2 of `zbv`; see the module doc).
pub fn parse(
    spec: &str,
    g: &CostGraph,
    devices: usize,
    schedule: ScheduleKind,
) -> Result<Vec<StageSpec>> {
    let chunks = schedule.chunks();
    let stages = spec.split(';').count();
    let groups = stages / chunks.max(1);
    if chunks > 1 && (groups < 2 || !stages.is_multiple_of(chunks)) {
        return Err(err(
            spec,
            format!(
                "{stages} stages: --schedule {schedule} needs {chunks} stages on each of at least 2 device groups (a multiple of {chunks} stages)"
            ),
        ));
    }
    let n = g.len();
    let mut owner: Vec<Option<usize>> = vec![None; n];
    let mut specs = Vec::new();
    let mut next_dev = 0usize;
    let pos = |tok: &str, s: usize| -> Result<usize> {
        let t = tok.trim();
        if let Ok(i) = t.parse::<usize>() {
            if i > n {
                return Err(err(
                    spec,
                    format!("stage {s}: position {i} is past the last node ({n} nodes)"),
                ));
            }
            return Ok(i);
        }
        g.node_by_name(t)
            .ok_or_else(|| err(spec, format!("stage {s}: no node named '{t}'")))
    };
    for (s, stage) in spec.split(';').enumerate() {
        let stage = stage.trim();
        if stage.is_empty() {
            return Err(err(spec, format!("stage {s} is empty")));
        }
        let (items, r) = match stage.rsplit_once('@') {
            Some((items, r)) => {
                let r: usize = r
                    .trim()
                    .parse()
                    .map_err(|_| err(spec, format!("stage {s}: replicas '{r}' is not a number")))?;
                if r == 0 {
                    return Err(err(spec, format!("stage {s}: 0 replicas")));
                }
                (items, r)
            }
            None => (stage, 1),
        };
        let mut nodes = Vec::new();
        for item in items.split(',') {
            let item = item.trim();
            let range = if let Some((a, b)) = item.split_once("..=") {
                let a = if a.trim().is_empty() { 0 } else { pos(a, s)? };
                a..pos(b, s)? + 1
            } else if let Some((a, b)) = item.split_once("..") {
                let a = if a.trim().is_empty() { 0 } else { pos(a, s)? };
                let b = if b.trim().is_empty() { n } else { pos(b, s)? };
                a..b
            } else {
                let i = pos(item, s)?;
                if item.parse::<usize>().is_ok() {
                    return Err(err(
                        spec,
                        format!(
                            "stage {s}: '{item}' is a position; write a range '{item}..{}'",
                            i + 1
                        ),
                    ));
                }
                i..i + 1
            };
            if range.is_empty() {
                return Err(err(spec, format!("stage {s}: '{item}' names no node")));
            }
            for i in range {
                if let Some(o) = owner[i] {
                    return Err(err(
                        spec,
                        format!(
                            "node {i} '{}' is in stage {o} and in stage {s}",
                            g.nodes[i].name
                        ),
                    ));
                }
                owner[i] = Some(s);
                nodes.push(i);
            }
        }
        if chunks > 1 && s >= groups {
            let at = schedule.group_of(s, groups);
            let group: &StageSpec = &specs[at];
            if group.devices.len() != r {
                return Err(err(
                    spec,
                    format!(
                        "stage {s} runs on the {} device(s) of stage {at} ({schedule}), not @{r}",
                        group.devices.len(),
                    ),
                ));
            }
            let devices = group.devices.clone();
            specs.push(StageSpec { nodes, devices });
            continue;
        }
        if next_dev + r > devices {
            return Err(err(
                spec,
                format!(
                    "the stages need {} devices or more; {devices} are available",
                    next_dev + r
                ),
            ));
        }
        specs.push(StageSpec {
            nodes,
            devices: (next_dev..next_dev + r).collect(),
        });
        next_dev += r;
    }
    if let Some(i) = owner.iter().position(Option::is_none) {
        let missing = owner.iter().filter(|o| o.is_none()).count();
        return Err(err(
            spec,
            format!(
                "{missing} node(s) in no stage, the first at position {i} ('{}')",
                g.nodes[i].name
            ),
        ));
    }
    Ok(specs)
}

impl Planner for UserStages {
    fn name(&self) -> &'static str {
        "stages"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        let schedule = opts.schedule.unwrap_or(ScheduleKind::Gpp);
        if schedule == ScheduleKind::Interleaved(0) {
            return Err(err(
                &self.spec,
                "--schedule interleaved lets a planner pick the chunks per device; with --stages, say how many: interleaved-V",
            ));
        }
        let specs = parse(&self.spec, g, cluster.len(), schedule)?;
        // Interleaved 1F1B runs the micro-batches through the chunks in groups of the device
        // groups' count.
        let groups = specs.len() / schedule.chunks();
        let in_groups = schedule.micro_batches_in_groups();
        let batch = opts.batch.max(1);
        let sizes: Vec<u64> = match opts.micro_batch() {
            Some(mb) => vec![mb],
            None => {
                let fits = |mb: u64| {
                    specs
                        .iter()
                        .all(|s| mb.is_multiple_of(s.devices.len() as u64))
                        && (!in_groups || (batch / mb).is_multiple_of(groups as u64))
                };
                let mut v: Vec<u64> = (1..=batch)
                    .rev()
                    .filter(|&mb| {
                        batch.is_multiple_of(mb) && fits(mb) && micro_batches(batch, mb).is_ok()
                    })
                    .collect();
                if v.is_empty() {
                    return Err(err(
                        &self.spec,
                        if in_groups {
                            format!("no micro-batch divides the batch {batch} and every stage's replica count into a multiple of {groups} micro-batches ({schedule})")
                        } else {
                            format!("no micro-batch divides the batch {batch} and every stage's replica count")
                        },
                    ));
                }
                v.truncate(MAX_TRIES);
                v
            }
        };
        let mut best: Option<Plan> = None;
        for mb in sizes {
            let p = Plan::assemble(
                "stages",
                g,
                cluster,
                opts,
                specs.clone(),
                mb,
                schedule,
                f64::NAN,
                0.0,
            )?;
            if best
                .as_ref()
                .is_none_or(|b| p.iteration_time_s < b.iteration_time_s)
            {
                best = Some(p);
            }
        }
        let mut p = best.ok_or_else(|| err(&self.spec, "no plan"))?;
        p.objective_s = p.iteration_time_s;
        p.search_time_s = t0.elapsed().as_secs_f64();
        Ok(p)
    }
}
