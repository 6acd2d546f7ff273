//! Plans: what a planner decides (stages, their nodes and devices) with the shared simulator's
//! figures for it ([`Plan`], typed: node indices of the cost graph, a checked [`MicroBatch`], a
//! [`ScheduleKind`]), and what `pipec plan --json` prints ([`PlanReport`], the fields of
//! `shared/spec/cli.md`: node names, plain numbers), plus verifiers of the basic invariants.
//!
//! A planner only has to decide a list of [`StageSpec`]s (nodes and devices per stage) and its own
//! objective; [`Plan::assemble`] derives the stage DAG, builds the schedule, runs the shared
//! simulator ([`crate::sim`]) and fills in every reported time and memory figure, so plans from
//! different planners are comparable. [`Plan::report`] names the nodes for output;
//! [`PlanReport::resolve`] reads a report back against its cost graph.

use crate::cost::{AllReduceAlgo, Cluster, CostGraph, Optimizer};
use crate::sim::{self, ScheduleKind, StageGraph};
use pipec_compiler::{Error, PlanOption, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// One stage of a plan, as printed by `plan --json` ([`PlannedStage`] with node names).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    pub id: usize,
    /// Node names (ONNX node names or profile node ids), in the graph's topological order.
    pub nodes: Vec<String>,
    /// Device indices of the cluster, one per replica.
    pub devices: Vec<usize>,
    pub replicas: usize,
    /// Stages that feed this one (ids), ascending.
    pub predecessors: Vec<usize>,
    /// Most micro-batches in flight on one replica (forward done, backward not) in the simulation.
    pub in_flight: usize,
    /// Forward + backward seconds of one micro-batch on one replica (its `micro_batch/replicas`
    /// slice; the whole micro-batch under `1f1b-rr`), on the slowest of its devices; with a
    /// re-computing schedule the backward includes the re-run forward.
    pub compute_time_s: f64,
    /// Peak memory of the stage's most loaded replica in the simulation.
    pub peak_memory_bytes: u64,
    /// The stage's own micro-batch size `b_s` (`gpp-per-stage` only; else the plan's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch: Option<u64>,
    /// `k_s` of the stage's `k_sFk_sB` order (`gpp-per-stage` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u64>,
}

/// [`PlanReport::schedule`] in JSON: its label, the `--schedule` name ([`ScheduleKind::label`]).
mod schedule_name {
    use crate::sim::ScheduleKind;
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(k: &ScheduleKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&k.label())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ScheduleKind, D::Error> {
        let name = String::deserialize(d)?;
        ScheduleKind::parse(&name)
            .ok_or_else(|| D::Error::custom(format!("unknown schedule '{name}'")))
    }
}

/// A whole plan, as printed by `plan --json` and written to OUTDIR's `plan.json` (extra fields
/// after the contract's): [`Plan::report`] of a [`Plan`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    pub planner: String,
    pub devices: usize,
    pub batch: u64,
    pub micro_batch: u64,
    pub micro_batches: u64,
    /// The schedule, written as its `--schedule` name (`1f1b`, `kfkb-4`, ...); reading an
    /// unknown name fails.
    #[serde(with = "schedule_name")]
    pub schedule: ScheduleKind,
    pub stages: Vec<StageReport>,
    /// Number of stages on the longest path of the stage DAG.
    pub pipeline_depth: usize,
    pub iteration_time_s: f64,
    pub throughput_samples_per_s: f64,
    pub peak_memory_bytes: u64,
    /// Measured; OUTDIR's `plan.json` leaves it out (so reading it gives 0).
    #[serde(default)]
    pub search_time_s: f64,
    pub objective_s: f64,
    /// Fraction of device-time the compute streams are idle in the simulation.
    #[serde(default)]
    pub bubble_fraction: f64,
    /// Cluster name.
    #[serde(default)]
    pub cluster: String,
    /// True when some device's peak memory exceeds its capacity.
    #[serde(default)]
    pub out_of_memory: bool,
    /// BaPipe's intra-layer splits that the stages realise (`[]` for whole-layer plans): the
    /// node was rewritten by [`crate::transforms::split_layer`] and its halves are in different stages.
    #[serde(default)]
    pub intra_splits: Vec<IntraSplitReport>,
    /// The search stopped at `--time-limit`: the best plan found by then, not the planner's
    /// optimum (absent from the JSON when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time_limited: bool,
    /// DAPPLE's search passed its transition budget and then extended only the best states of
    /// each cut (`planners::dapple::BEAM`): a bounded search, not the exhaustive optimum
    /// (absent from the JSON when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub search_capped: bool,
}

/// One stage of a [`Plan`]: the planner's decision (nodes and devices) and the simulator's
/// figures for it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedStage {
    /// Nodes of the cost graph (indices), in its topological order.
    pub nodes: Vec<usize>,
    /// Device indices of the cluster, one per replica (replica `k` on `devices[k]`).
    pub devices: Vec<usize>,
    /// Stages that feed this one, ascending.
    pub predecessors: Vec<usize>,
    /// Most micro-batches in flight on one replica (forward done, backward not) in the simulation.
    pub in_flight: usize,
    /// Forward + backward seconds of one micro-batch on one replica, on the slowest of its
    /// devices ([`StageReport::compute_time_s`]).
    pub compute_time_s: f64,
    /// Peak memory of the stage's most loaded replica in the simulation.
    pub peak_memory_bytes: u64,
    /// The stage's own micro-batch size `b_s` (`gpp-per-stage` only; else the plan's).
    pub micro_batch: Option<u64>,
    /// `k_s` of the stage's `k_sFk_sB` order (`gpp-per-stage` only).
    pub group: Option<u64>,
}

/// A planner's plan of a cost graph with the shared simulator's figures: what the compiler acts
/// on. Its stages name nodes by index into the cost graph the planner was given (or the one it
/// rewrote: BaPipe's intra-layer splits), so it is read against that graph; [`Plan::report`]
/// turns it into the [`PlanReport`] that is printed and written.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub planner: String,
    /// The micro-batch (and the mini-batch it divides).
    pub micro_batch: MicroBatch,
    pub schedule: ScheduleKind,
    pub stages: Vec<PlannedStage>,
    /// Number of stages on the longest path of the stage DAG.
    pub pipeline_depth: usize,
    pub iteration_time_s: f64,
    pub peak_memory_bytes: u64,
    /// Measured wall time of the planner's search.
    pub search_time_s: f64,
    /// The planner's own objective for this plan (seconds).
    pub objective_s: f64,
    /// Fraction of device-time the compute streams are idle in the simulation.
    pub bubble_fraction: f64,
    /// Cluster name.
    pub cluster: String,
    /// True when some device's peak memory exceeds its capacity.
    pub out_of_memory: bool,
    /// BaPipe's intra-layer splits that the stages realise ([`PlanReport::intra_splits`]).
    pub intra_splits: Vec<IntraSplitReport>,
    /// The search stopped at `--time-limit` ([`PlanReport::time_limited`]).
    pub time_limited: bool,
    /// DAPPLE's search passed its transition budget ([`PlanReport::search_capped`]).
    pub search_capped: bool,
}

/// One emitted intra-layer split, as `plan.json` reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntraSplitReport {
    /// The original node (its output value keeps its name).
    pub node: String,
    pub op: String,
    /// The stage that keeps `channels[0]` output channels (node `nodes[0]`) and the neighbour
    /// that takes `channels[1]` (node `nodes[1]`); the `Concat` (`nodes[2]`) is in the later one.
    pub from_stage: usize,
    pub to_stage: usize,
    /// The planned share of the channels that moves (before rounding to whole channels).
    pub fraction: f64,
    pub channels: [u64; 2],
    /// `[kept half, moved half, concat]` node names.
    pub nodes: [String; 3],
    /// Parameters that were cut: `{name, parts, axis}` (`weights.npz` holds the parts).
    pub params: Vec<crate::transforms::split_layer::SplitParam>,
}

/// Whether an op (an ONNX op type, or a profile's module repr such as `BatchNorm2d(64)`) couples
/// the samples of a micro-batch (batch statistics): a stage holding one cannot take another
/// micro-batch size than the plan's without changing what it computes.
pub fn couples_samples(op: &str) -> bool {
    op.starts_with("BatchNorm")
}

/// The most micro-batches per iteration (`--batch / --micro-batch`): the schedules, the
/// simulator and `schedule.json` grow with it (DAPPLE's search: 2 s at 4096 micro-batches, 37 s
/// at 65536 on mlp4); a user asking for more is asking for a bigger micro-batch.
pub const MAX_MICRO_BATCHES: u64 = 4096;

/// The number of micro-batches of `mb` samples in `batch`; an error unless `mb` is at least 1
/// and divides the batch. Plans a planner assembles (its own micro-batch choice) need only this;
/// user flags also go through [`check_micro_batch`].
pub fn micro_batches(batch: u64, mb: u64) -> Result<u64> {
    if mb == 0 || !batch.is_multiple_of(mb) {
        return Err(Error::option(
            PlanOption::MicroBatch,
            mb,
            format!("must be >= 1 and divide the batch ({batch})"),
        ));
    }
    Ok(batch / mb)
}

/// Check `--micro-batch mb` against `--batch batch`: at least 1, dividing the batch, and at most
/// [`MAX_MICRO_BATCHES`] micro-batches. Returns the number of micro-batches.
pub fn check_micro_batch(batch: u64, mb: u64) -> Result<u64> {
    let m = micro_batches(batch, mb)?;
    if m > MAX_MICRO_BATCHES {
        return Err(Error::option(
            PlanOption::MicroBatch,
            mb,
            format!(
                "the batch ({batch}) in micro-batches of {mb} is {m} micro-batches: at most \
                 {MAX_MICRO_BATCHES} per iteration (raise the micro-batch)"
            ),
        ));
    }
    Ok(m)
}

/// A micro-batch size checked against its mini-batch once, where it enters (a flag, a library
/// caller, a planner's choice reaching codegen): at least one sample, dividing the batch, at most
/// [`MAX_MICRO_BATCHES`] micro-batches. Code that holds one does not check again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroBatch {
    batch: u64,
    size: u64,
}

impl MicroBatch {
    /// `size` samples per micro-batch of the mini-batch `batch` ([`check_micro_batch`]'s rules
    /// and messages).
    pub fn new(batch: u64, size: u64) -> Result<MicroBatch> {
        check_micro_batch(batch, size)?;
        Ok(MicroBatch { batch, size })
    }

    /// `size` samples per micro-batch of `batch` as a planner chooses it: only [`micro_batches`]'
    /// rule (dividing the batch), not the per-iteration cap that user flags get.
    pub fn dividing(batch: u64, size: u64) -> Result<MicroBatch> {
        micro_batches(batch, size)?;
        Ok(MicroBatch { batch, size })
    }

    /// Samples per micro-batch.
    pub fn size(self) -> u64 {
        self.size
    }

    /// The mini-batch it divides (samples per iteration).
    pub fn batch(self) -> u64 {
        self.batch
    }

    /// Micro-batches per iteration (`M`).
    pub fn count(self) -> u64 {
        self.batch / self.size
    }
}

pub use crate::stage::StageSpec;

/// Options every planner gets (from the CLI flags).
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Global mini-batch (samples per iteration).
    pub batch: u64,
    /// Micro-batch size, checked against `batch` ([`PlanOptions::set_micro_batch`]); `None`
    /// lets the planner choose.
    micro_batch: Option<MicroBatch>,
    /// Schedule; `None` is the planner's own.
    pub schedule: Option<ScheduleKind>,
    pub optimizer: Optimizer,
    pub allreduce: AllReduceAlgo,
    /// `--time-limit`: planners that can stop early return the best plan found by then, marked
    /// [`Plan::time_limited`]. `None`: search to the end.
    pub deadline: Option<std::time::Instant>,
    /// PipeDream's vertical sync under per-micro-batch updates (`--vertical-sync`): the plan's
    /// simulation holds every stage's stashes as codegen emits them
    /// ([`crate::sim::StageGraph::with_vertical_sync`]). The planners' own searches do not
    /// see it; [`Plan::assemble`] does.
    pub vertical_sync: bool,
}

impl PlanOptions {
    /// Defaults for a batch: planner's micro-batch and schedule, SGD, automatic all-reduce.
    pub fn new(batch: u64) -> PlanOptions {
        PlanOptions {
            batch,
            micro_batch: None,
            schedule: None,
            optimizer: Optimizer::Sgd,
            allreduce: AllReduceAlgo::Auto,
            deadline: None,
            vertical_sync: false,
        }
    }

    /// Ask for micro-batches of `size` samples (`None`: the planner's choice), checked against
    /// [`PlanOptions::batch`] here, once (set the batch first).
    pub fn set_micro_batch(&mut self, size: Option<u64>) -> Result<()> {
        self.micro_batch = size.map(|mb| MicroBatch::new(self.batch, mb)).transpose()?;
        Ok(())
    }

    /// Ask for a micro-batch already checked ([`MicroBatch::new`]) against this batch.
    pub fn set_checked_micro_batch(&mut self, mb: Option<MicroBatch>) -> Result<()> {
        if let Some(m) = mb.filter(|m| m.batch() != self.batch) {
            return Err(Error::option(
                PlanOption::MicroBatch,
                m.size(),
                format!(
                    "was checked against a batch of {}, not this batch ({})",
                    m.batch(),
                    self.batch
                ),
            ));
        }
        self.micro_batch = mb;
        Ok(())
    }

    /// The requested micro-batch size, if any.
    pub fn micro_batch(&self) -> Option<u64> {
        self.micro_batch.map(MicroBatch::size)
    }

    /// Whether the `--time-limit` deadline has passed.
    pub fn out_of_time(&self) -> bool {
        self.deadline
            .is_some_and(|d| std::time::Instant::now() >= d)
    }

    /// The micro-batch to use: the requested one (checked when set), else the largest divisor of
    /// the batch that gives at least `min(batch, want_micro_batches)` micro-batches.
    pub fn micro_batch_or(&self, want_micro_batches: u64) -> u64 {
        let b = self.batch.max(1);
        if let Some(mb) = self.micro_batch {
            return mb.size();
        }
        let want = want_micro_batches.clamp(1, b);
        (1..=b)
            .rev()
            .find(|mb| b.is_multiple_of(*mb) && b / mb >= want)
            .unwrap_or(1)
    }
}

/// Stage of every node, predecessor lists, and checks; shared by the verifier and `assemble`.
/// A device is in one stage, except under interleaved 1F1B and ZB-V (`schedule.chunks() > 1`),
/// whose chunks share their group's devices ([`sim::schedule::interleaved_groups`] checks the layout).
fn stage_structure(
    g: &CostGraph,
    cluster: &Cluster,
    specs: &[StageSpec],
    schedule: ScheduleKind,
) -> Result<(Vec<usize>, Vec<Vec<usize>>)> {
    let shared = schedule.chunks() > 1;
    if specs.is_empty() {
        return Err(Error::msg("plan has no stage"));
    }
    let mut stage_of = vec![usize::MAX; g.len()];
    let mut used = vec![false; cluster.len()];
    for (s, spec) in specs.iter().enumerate() {
        if spec.devices.is_empty() {
            return Err(Error::msg(format!("stage {s} has no device")));
        }
        for &d in &spec.devices {
            if d >= cluster.len() {
                return Err(Error::msg(format!(
                    "stage {s} uses device {d} but the cluster has {}",
                    cluster.len()
                )));
            }
            if std::mem::replace(&mut used[d], true) && !shared {
                return Err(Error::msg(format!("device {d} is in two stages")));
            }
        }
        for &n in &spec.nodes {
            if n >= g.len() {
                return Err(Error::msg(format!(
                    "stage {s} names node index {n} out of range"
                )));
            }
            if stage_of[n] != usize::MAX {
                return Err(Error::msg(format!(
                    "node '{}' is in stages {} and {s}",
                    g.nodes[n].name, stage_of[n]
                )));
            }
            stage_of[n] = s;
        }
    }
    if let Some(n) = stage_of.iter().position(|s| *s == usize::MAX) {
        return Err(Error::msg(format!(
            "node '{}' is in no stage",
            g.nodes[n].name
        )));
    }
    let mut preds: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); specs.len()];
    for e in &g.edges {
        let (a, b) = (stage_of[e.src], stage_of[e.dst]);
        if a != b {
            preds[b].insert(a);
        }
    }
    let preds: Vec<Vec<usize>> = preds.into_iter().map(|p| p.into_iter().collect()).collect();
    // Acyclic stage DAG.
    let n = specs.len();
    let mut succ = vec![Vec::new(); n];
    for (s, ps) in preds.iter().enumerate() {
        for &p in ps {
            succ[p].push(s);
        }
    }
    if let Err(c) = pipec_compiler::topo::topo_order(n, |s| succ[s].iter().copied()) {
        return Err(Error::msg(format!(
            "the stage graph has a cycle through stage {} (a stage is not convex)",
            c.stuck
        )));
    }
    Ok((stage_of, preds))
}

impl PlanReport {
    /// Check a report against its graph and cluster: stage ids are `0..n`, every node is in
    /// exactly one stage, devices are in range and in at most one stage, `replicas` equals the
    /// device count, the stage DAG is acyclic, and `predecessors` are exactly the stages that
    /// send to it.
    pub fn verify(&self, g: &CostGraph, cluster: &Cluster) -> Result<()> {
        for (i, st) in self.stages.iter().enumerate() {
            if st.id != i {
                return Err(Error::msg(format!(
                    "stage at position {i} has id {}",
                    st.id
                )));
            }
            if st.replicas != st.devices.len() {
                return Err(Error::msg(format!(
                    "stage {i}: replicas {} but {} devices",
                    st.replicas,
                    st.devices.len()
                )));
            }
        }
        let specs = self.specs(g)?;
        check_predecessors(
            g,
            cluster,
            (&specs, self.schedule),
            self.stages.iter().map(|s| &s.predecessors),
        )
    }

    /// The stage specs of this report, its node names resolved against `g`.
    pub fn specs(&self, g: &CostGraph) -> Result<Vec<StageSpec>> {
        self.stages
            .iter()
            .enumerate()
            .map(|(i, st)| {
                Ok(StageSpec {
                    nodes: st
                        .nodes
                        .iter()
                        .map(|n| {
                            g.node_by_name(n).ok_or_else(|| {
                                Error::msg(format!("stage {i} names unknown node '{n}'"))
                            })
                        })
                        .collect::<Result<_>>()?,
                    devices: st.devices.clone(),
                })
            })
            .collect()
    }

    /// The typed plan this report describes, read against the cost graph `g` it names the
    /// nodes of (after [`PlanReport::verify`]). `plan.report(g).resolve(g, cluster)` is `plan`.
    pub fn resolve(&self, g: &CostGraph, cluster: &Cluster) -> Result<Plan> {
        self.verify(g, cluster)?;
        let specs = self.specs(g)?;
        Ok(Plan {
            planner: self.planner.clone(),
            micro_batch: MicroBatch::dividing(self.batch, self.micro_batch)?,
            schedule: self.schedule,
            stages: self
                .stages
                .iter()
                .zip(specs)
                .map(|(st, spec)| PlannedStage {
                    nodes: spec.nodes,
                    devices: spec.devices,
                    predecessors: st.predecessors.clone(),
                    in_flight: st.in_flight,
                    compute_time_s: st.compute_time_s,
                    peak_memory_bytes: st.peak_memory_bytes,
                    micro_batch: st.micro_batch,
                    group: st.group,
                })
                .collect(),
            pipeline_depth: self.pipeline_depth,
            iteration_time_s: self.iteration_time_s,
            peak_memory_bytes: self.peak_memory_bytes,
            search_time_s: self.search_time_s,
            objective_s: self.objective_s,
            bubble_fraction: self.bubble_fraction,
            cluster: self.cluster.clone(),
            out_of_memory: self.out_of_memory,
            intra_splits: self.intra_splits.clone(),
            time_limited: self.time_limited,
            search_capped: self.search_capped,
        })
    }
}

/// The conditions of a schedule with several chunks per device group on a stage graph with
/// `m` micro-batches: the chunks laid out on the device groups as
/// [`sim::schedule::interleaved_groups`] says, and under interleaved 1F1B `m` a multiple of
/// the groups (its order runs micro-batches through the chunks in groups of that many; ZB-V's
/// takes any `m`).
fn check_interleaved(
    sg: &StageGraph,
    schedule: ScheduleKind,
    (micro_batch, m): (u64, u64),
) -> Result<()> {
    let p = sim::schedule::interleaved_groups(sg, schedule).map_err(Error::msg)?;
    if schedule.micro_batches_in_groups() && !m.is_multiple_of(p as u64) {
        return Err(Error::option(
            PlanOption::MicroBatch,
            micro_batch,
            format!(
                "under --schedule {schedule} the micro-batches ({m}) must be a multiple of the pipeline's {p} device groups"
            ),
        ));
    }
    Ok(())
}

/// [`stage_structure`] of `specs`, and every stage's `predecessors` exactly the stages its
/// nodes' inputs come from.
fn check_predecessors<'a>(
    g: &CostGraph,
    cluster: &Cluster,
    (specs, schedule): (&[StageSpec], ScheduleKind),
    predecessors: impl Iterator<Item = &'a Vec<usize>>,
) -> Result<()> {
    let (_, preds) = stage_structure(g, cluster, specs, schedule)?;
    for (i, given) in predecessors.enumerate() {
        let mut p = given.clone();
        p.sort_unstable();
        if preds.get(i) != Some(&p) {
            return Err(Error::msg(format!(
                "stage {i}: predecessors {given:?} but its nodes' inputs come from stages {:?}",
                preds.get(i).cloned().unwrap_or_default()
            )));
        }
    }
    Ok(())
}

impl Plan {
    /// The mini-batch (samples per iteration).
    pub fn batch(&self) -> u64 {
        self.micro_batch.batch()
    }

    /// Micro-batches per iteration (`M`).
    pub fn micro_batches(&self) -> u64 {
        self.micro_batch.count()
    }

    /// Devices the plan uses: every stage's replicas (the cluster's first ones), each once
    /// (interleaved 1F1B's chunks share their group's).
    pub fn devices(&self) -> usize {
        let mut all: Vec<usize> = self
            .stages
            .iter()
            .flat_map(|s| s.devices.iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all.len()
    }

    /// Samples per second of the simulated iteration (0 for an empty one).
    pub fn throughput_samples_per_s(&self) -> f64 {
        let t = self.iteration_time_s;
        if t > 0.0 {
            self.batch() as f64 / t
        } else {
            0.0
        }
    }

    /// Check a plan against its graph and cluster: every node is in exactly one stage, devices
    /// are in range and in at most one stage, the stage DAG is acyclic, and `predecessors` are
    /// exactly the stages that send to it.
    pub fn verify(&self, g: &CostGraph, cluster: &Cluster) -> Result<()> {
        let specs = self.specs();
        check_predecessors(
            g,
            cluster,
            (&specs, self.schedule),
            self.stages.iter().map(|s| &s.predecessors),
        )
    }

    /// The stage specs of this plan (nodes and devices per stage).
    pub fn specs(&self) -> Vec<StageSpec> {
        self.stages
            .iter()
            .map(|st| StageSpec {
                nodes: st.nodes.clone(),
                devices: st.devices.clone(),
            })
            .collect()
    }

    /// The plan as `plan --json` prints it: node names of `g`, the graph its stages index.
    pub fn report(&self, g: &CostGraph) -> PlanReport {
        let stages: Vec<StageReport> = self
            .stages
            .iter()
            .enumerate()
            .map(|(s, st)| StageReport {
                id: s,
                nodes: st.nodes.iter().map(|&n| g.nodes[n].name.clone()).collect(),
                devices: st.devices.clone(),
                replicas: st.devices.len(),
                predecessors: st.predecessors.clone(),
                in_flight: st.in_flight,
                compute_time_s: st.compute_time_s,
                peak_memory_bytes: st.peak_memory_bytes,
                micro_batch: st.micro_batch,
                group: st.group,
            })
            .collect();
        PlanReport {
            planner: self.planner.clone(),
            devices: self.devices(),
            batch: self.batch(),
            micro_batch: self.micro_batch.size(),
            micro_batches: self.micro_batches(),
            schedule: self.schedule,
            stages,
            pipeline_depth: self.pipeline_depth,
            iteration_time_s: self.iteration_time_s,
            throughput_samples_per_s: self.throughput_samples_per_s(),
            peak_memory_bytes: self.peak_memory_bytes,
            search_time_s: self.search_time_s,
            objective_s: self.objective_s,
            bubble_fraction: self.bubble_fraction,
            cluster: self.cluster.clone(),
            out_of_memory: self.out_of_memory,
            intra_splits: self.intra_splits.clone(),
            time_limited: self.time_limited,
            search_capped: self.search_capped,
        }
    }

    /// Per device, the passes of the schedule this plan was simulated with
    /// ([`sim::fill::scheduled`] on its stage graph, as [`Plan::assemble`] builds it), for
    /// codegen to lay out the same order; `None` where that is the schedule kind's fixed order
    /// (all but the zero-bubble schedules, whose weight passes move into idle slots).
    pub fn pass_orders(
        &self,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
    ) -> Result<Option<Vec<sim::fill::PassOrder>>> {
        if !sim::fill::fills(self.schedule) {
            return Ok(None);
        }
        let sg = StageGraph::from_specs_for(
            g,
            cluster,
            &self.specs(),
            self.micro_batch.size() as f64,
            opts.optimizer,
            self.schedule,
        );
        let m = self.micro_batches() as usize;
        let (sched, _) = sim::fill::scheduled(&sg, self.schedule, m, cluster, opts.allreduce)?;
        Ok(Some(sim::fill::pass_orders(&sched)))
    }

    /// The same stages and micro-batch under `schedule`, simulated again (`planner` names the
    /// result): how a planner tries another schedule on the stages it chose.
    pub fn rescheduled(
        &self,
        planner: &str,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        schedule: ScheduleKind,
    ) -> Result<Plan> {
        Plan::assemble(
            planner,
            g,
            cluster,
            opts,
            self.specs(),
            self.micro_batch.size(),
            schedule,
            self.objective_s,
            0.0,
        )
    }

    /// Whether this plan is better than `other`: it fits in memory where `other` does not, or
    /// both do (or neither) and it is faster (by more than rounding).
    pub fn beats(&self, other: &Plan) -> bool {
        (other.out_of_memory && !self.out_of_memory)
            || (other.out_of_memory == self.out_of_memory
                && self.iteration_time_s < other.iteration_time_s * (1.0 - 1e-9))
    }

    /// Build a full plan from a planner's decision: checks the specs, derives the stage DAG,
    /// generates `schedule`, simulates it, and fills in every field.
    #[allow(clippy::too_many_arguments)]
    pub fn assemble(
        planner: &str,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        specs: Vec<StageSpec>,
        micro_batch: u64,
        schedule: ScheduleKind,
        objective_s: f64,
        search_time_s: f64,
    ) -> Result<Plan> {
        let plan = Self::assemble_below(
            planner,
            g,
            cluster,
            opts,
            specs,
            (micro_batch, schedule),
            (objective_s, search_time_s),
            f64::INFINITY,
        )?;
        plan.ok_or_else(|| Error::msg(format!("{planner}: no simulated iteration")))
    }

    /// [`Plan::assemble`] for a caller that only wants a plan faster than `cutoff` seconds:
    /// `None` (no simulation) when a lower bound of the iteration from the stage graph and the
    /// schedule ([`sim::compute_bound`], [`sim::channel_bound`]) is already at or above it.
    #[allow(clippy::too_many_arguments)]
    pub fn assemble_below(
        planner: &str,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        specs: Vec<StageSpec>,
        (micro_batch, schedule): (u64, ScheduleKind),
        (objective_s, search_time_s): (f64, f64),
        cutoff: f64,
    ) -> Result<Option<Plan>> {
        // Checked before simulating (invalid specs name devices outside the cluster).
        stage_structure(g, cluster, &specs, schedule)?;
        let batch = opts.batch.max(1);
        let m = micro_batches(batch, micro_batch)?;
        let mut sg = StageGraph::from_specs_for(
            g,
            cluster,
            &specs,
            micro_batch as f64,
            opts.optimizer,
            schedule,
        );
        if opts.vertical_sync && schedule.per_micro_batch_step() {
            sg.with_vertical_sync();
        }
        if schedule.chunks() > 1 {
            check_interleaved(&sg, schedule, (micro_batch, m))?;
        }
        let sched = sim::schedule::generate(&sg, schedule, m as usize);
        if cutoff.is_finite() {
            let bound = sim::compute_bound(&sg, cluster, opts.allreduce, schedule, m as usize)
                .max(sim::channel_bound(&sched, cluster));
            if bound >= cutoff {
                return Ok(None);
            }
        }
        // The zero-bubble schedules with their weight passes moved into idle slots.
        let res = if sim::fill::fills(schedule) {
            sim::fill::fill_weight_gaps(&sg, sched, cluster, opts.allreduce)?.1
        } else {
            sim::simulate(&sg, &sched, cluster, opts.allreduce)?
        };
        Self::from_simulation(
            planner,
            g,
            cluster,
            opts,
            specs,
            micro_batch,
            schedule,
            objective_s,
            search_time_s,
            (&sg, &res),
        )
        .map(Some)
    }

    /// [`Plan::assemble`] when the planner has already simulated the whole iteration: `sim` is
    /// the stage graph ([`StageGraph::from_specs_for`] of `specs` at `micro_batch` for
    /// `schedule`) and the simulator's result of `schedule` on it with `batch / micro_batch`
    /// micro-batches.
    #[allow(clippy::too_many_arguments)]
    pub fn from_simulation(
        planner: &str,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        specs: Vec<StageSpec>,
        micro_batch: u64,
        schedule: ScheduleKind,
        objective_s: f64,
        search_time_s: f64,
        (sg, res): (&StageGraph, &sim::SimResult),
    ) -> Result<Plan> {
        let (_, preds) = stage_structure(g, cluster, &specs, schedule)?;
        let batch = opts.batch.max(1);
        let micro_batch = MicroBatch::dividing(batch, micro_batch)?;
        // The figures the simulator ran on (re-computation adds the forward to the backward).
        let sg = sg.for_schedule(schedule);
        let mut stages = Vec::with_capacity(specs.len());
        let topo_pos = g.topo_positions();
        for (s, spec) in specs.iter().enumerate() {
            let mut nodes = spec.nodes.clone();
            nodes.sort_by_key(|&n| topo_pos[n]);
            let st = &sg.stages[s];
            let compute = (0..st.devices.len())
                .map(|r| st.fwd_s[r] + st.bwd_s[r])
                .fold(0.0, f64::max);
            let peak = st
                .devices
                .iter()
                .map(|&d| res.devices[d].peak_memory_bytes)
                .fold(0.0, f64::max);
            stages.push(PlannedStage {
                nodes,
                devices: spec.devices.clone(),
                predecessors: preds[s].clone(),
                in_flight: res.stage_in_flight[s],
                compute_time_s: compute,
                peak_memory_bytes: peak.round() as u64,
                micro_batch: sg.per_stage.as_ref().map(|p| p.micro_batch[s]),
                group: sg.per_stage.as_ref().map(|p| p.group[s]),
            });
        }
        Ok(Plan {
            planner: planner.to_string(),
            micro_batch,
            schedule,
            pipeline_depth: sg.depth(),
            iteration_time_s: res.iteration_time_s,
            peak_memory_bytes: stages
                .iter()
                .map(|s| s.peak_memory_bytes)
                .max()
                .unwrap_or(0),
            stages,
            search_time_s,
            objective_s,
            bubble_fraction: res.bubble_fraction,
            cluster: cluster.name.clone(),
            out_of_memory: res.out_of_memory(cluster),
            intra_splits: Vec::new(),
            time_limited: false,
            search_capped: false,
        })
    }
}
