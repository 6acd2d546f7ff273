//! The stage graph the simulator runs: stages with their per-micro-batch times, memory and
//! replicas, the edges between them, tied-parameter groups and per-stage micro-batches
//! (`gpp-per-stage`), built from a plan's stages on the cost graph.

use super::kind::ScheduleKind;
use crate::cost::memory::{stage_memory, step_time};
use crate::cost::{Cluster, CostGraph, Optimizer};
use crate::stage::StageSpec;
use std::collections::HashMap;

/// One stage as the simulator sees it. Times are for one micro-batch slice (`micro_batch /
/// replicas` samples) on each replica's device.
#[derive(Clone, Debug, PartialEq)]
pub struct SimStage {
    /// Devices, one per replica.
    pub devices: Vec<usize>,
    /// Forward seconds per replica.
    pub fwd_s: Vec<f64>,
    /// Backward seconds per replica.
    pub bwd_s: Vec<f64>,
    /// Of `bwd_s`, the weight-gradient seconds per replica (Qi et al.'s `W`): what a schedule
    /// that splits the backward ([`ScheduleKind::splits_backward`]) runs apart, after
    /// the input-gradient part `B = bwd_s − wgt_s`.
    pub wgt_s: Vec<f64>,
    /// Optimizer step seconds per replica.
    pub step_s: Vec<f64>,
    /// Parameter bytes the stage holds (its copies of tied parameters included).
    pub parameter_bytes: f64,
    /// Of `parameter_bytes`, those of tied parameters, all-reduced in a [`TiedGroup`] rather
    /// than over the stage's replicas.
    pub tied_bytes: f64,
    /// Static memory of one replica (parameters, gradients, optimizer state, buffers).
    pub static_bytes: f64,
    /// Activation bytes saved by one micro-batch slice until its backward.
    pub saved_bytes: f64,
    /// What the weight-gradient part of a split backward ([`StageGraph::splits_backward`])
    /// reads, per micro-batch slice: saved activations (of `saved_bytes`), held past the
    /// input-gradient part, and the values that part computes for it.
    pub weight_saved_bytes: f64,
    pub carried_bytes: f64,
    /// Data-input bytes one micro-batch slice loads for the forward alone (no backward of the
    /// stage reads them): held while the forward runs (`DataInput`).
    pub load_bytes: f64,
}

/// How many partial sums of a batch-independent value's cotangent producer replica `i` of a
/// stage split over `rp` replicas receives from a consumer stage split over `rc`: codegen sends
/// such a value to consumer replica `x` from producer replica `x mod rp`, and each consumer
/// replica sends its partial sum back the same way (`⌈(rc − i) / rp⌉` for `i < rc`, else 0). A
/// stage whose replicas take whole micro-batches in turn counts as split over 1.
pub fn partial_sums(rp: usize, rc: usize, i: usize) -> usize {
    let i = if rp <= 1 { 0 } else { i };
    if i < rc {
        (rc - i).div_ceil(rp.max(1))
    } else {
        0
    }
}

/// A data edge between stages: `bytes` per whole micro-batch (split over replicas as needed).
#[derive(Clone, Debug, PartialEq)]
pub struct StageEdge {
    pub src: usize,
    pub dst: usize,
    pub bytes: f64,
    /// Values crossing the edge: codegen sends each as its own message (per micro-batch and
    /// replica piece), so a transfer pays the link latency once per value.
    pub tensors: usize,
    /// Bytes of the cotangents coming back per whole micro-batch: only values a consumer
    /// differentiates get one (not those read only by side computations, nor values that
    /// depend on no parameter).
    pub grad_bytes: f64,
    /// Values whose cotangents come back (0: no gradient message on this edge).
    pub grad_tensors: usize,
    /// The part of `bytes` (and of `grad_bytes`) in values with no batch axis (computed from
    /// parameters alone): codegen sends such a value whole to every consumer replica `j`, from
    /// producer replica `j mod r`, rather than slicing it ([`crate::cost::comm::routes`]).
    pub whole_bytes: f64,
    pub whole_grad_bytes: f64,
}

impl StageEdge {
    /// An edge of one value, `bytes` per micro-batch each way.
    pub fn new(src: usize, dst: usize, bytes: f64) -> StageEdge {
        StageEdge {
            src,
            dst,
            bytes,
            tensors: 1,
            grad_bytes: bytes,
            grad_tensors: 1,
            whole_bytes: 0.0,
            whole_grad_bytes: 0.0,
        }
    }
}

/// The stage DAG the simulator runs.
#[derive(Clone, Debug, Default)]
pub struct StageGraph {
    pub stages: Vec<SimStage>,
    pub edges: Vec<StageEdge>,
    pub in_edges: Vec<Vec<usize>>,
    pub out_edges: Vec<Vec<usize>>,
    /// Per-stage micro-batch sizes and kFkB groups (`gpp-per-stage`); `None`: one micro-batch
    /// size for all stages, the schedule kind's own order.
    pub per_stage: Option<PerStage>,
    /// Per stage: its replicas take whole micro-batches in turn (replica `m mod r` runs
    /// micro-batch `m`) instead of an even slice of each. Codegen does this when the micro-batch
    /// does not divide over the replicas, so the simulator does too. Empty: no stage.
    pub round_robin: Vec<bool>,
    /// The all-reduces of tied parameters held by several stages, one per set of holding
    /// devices, ascending by that set.
    pub tied: Vec<TiedGroup>,
    /// Per stage: `(stage, bytes, backward)` of the tied parameters it holds whose version,
    /// under per-micro-batch updates (`pipedream-async`), another holder's forward sets (the
    /// holder deepest from a sink, as codegen picks it): the stage stashes them for every
    /// micro-batch, from its step that brings it to that version until the micro-batch's
    /// backward (`backward`: the stage's backward reads them) or forward. Empty: none.
    pub tied_stash: Vec<Vec<(usize, f64, bool)>>,
    /// Per stage: parameter bytes weight stashing leaves out, those only forward ops read
    /// ([`crate::cost::CostGraph::forward_only_params`]). Empty: none.
    pub unstashed: Vec<f64>,
}

/// Tied parameters ([`crate::cost::TiedParameter`]) held by several stages: codegen keeps a
/// copy in each and sums the gradient shares with one all-reduce over every replica of every
/// holding stage, before each holder's optimizer step.
#[derive(Clone, Debug, PartialEq)]
pub struct TiedGroup {
    /// The holding devices, ascending.
    pub devices: Vec<usize>,
    /// The tied parameters' bytes.
    pub bytes: f64,
}

/// GraphPipe's per-stage schedule configuration (§4: `b_i` "the micro-batch size of `S_i`",
/// §6: a `k_iFk_iB` schedule per stage): what [`ScheduleKind::GppPerStage`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerStage {
    /// The mini-batch `B` (samples per iteration).
    pub batch: u64,
    /// The micro-batch size the stage graph's edge bytes are for.
    pub base_micro_batch: u64,
    /// `b_s` per stage: divides `B` and is a multiple of the stage's replica count.
    pub micro_batch: Vec<u64>,
    /// `k_s` per stage.
    pub group: Vec<u64>,
}

/// Whether a stage's `replicas` take whole micro-batches in turn (replica `m mod r` runs
/// micro-batch `m`) instead of an even slice of each: when the micro-batch does not divide over
/// them. Codegen emits this and the simulator, GPP's stage evaluation and the C4 check model it.
pub fn takes_turns(micro_batch: f64, replicas: usize) -> bool {
    replicas > 1 && (micro_batch / replicas as f64).fract() != 0.0
}

/// Of `stages`, the one deepest from a sink by `depth` (ties: the lowest index): under
/// per-micro-batch updates, the holder of a tied parameter whose forward sets its version, and
/// vertical sync's input stage. Codegen and the simulator pick it alike.
pub fn deepest_stage(depth: &[usize], stages: impl IntoIterator<Item = usize>) -> Option<usize> {
    stages
        .into_iter()
        .max_by_key(|&t| (depth[t], std::cmp::Reverse(t)))
}

/// Per node of a DAG given by successor lists, the largest sum of `weight` over a path from it
/// to a sink, its own weight included: with weight 1 the depth in stages, with replica counts
/// PipeDream's number of machines. (A node on a cycle, which no stage DAG has, keeps its own.)
pub fn heaviest_path_to_sink(succ: &[Vec<usize>], weight: &[usize]) -> Vec<usize> {
    // Any topological order gives the same sums; on a cycle, the nodes before it.
    let order = pipec_compiler::topo::topo_order(succ.len(), |s| succ[s].iter().copied())
        .unwrap_or_else(|c| c.partial);
    let mut w = weight.to_vec();
    for &s in order.iter().rev() {
        let below = succ[s].iter().map(|&t| w[t]).max().unwrap_or(0);
        w[s] = weight[s] + below;
    }
    w
}

impl StageGraph {
    /// A stage graph from stages and edges (edges must go between existing stages, acyclic).
    pub fn new(stages: Vec<SimStage>, edges: Vec<StageEdge>) -> StageGraph {
        let mut in_edges = vec![Vec::new(); stages.len()];
        let mut out_edges = vec![Vec::new(); stages.len()];
        for (i, e) in edges.iter().enumerate() {
            out_edges[e.src].push(i);
            in_edges[e.dst].push(i);
        }
        StageGraph {
            stages,
            edges,
            in_edges,
            out_edges,
            per_stage: None,
            round_robin: Vec::new(),
            tied: Vec::new(),
            tied_stash: Vec::new(),
            unstashed: Vec::new(),
        }
    }

    /// Whether `kind` runs stage `s`'s backward as two tasks, the input-gradient part `B` and
    /// the weight-gradient part `W` ([`ScheduleKind::splits_backward`]): only where the
    /// stage holds parameters, has weight-gradient work and sends input gradients upstream
    /// (with none to send, `B` is empty and the backward runs whole), as codegen splits a
    /// backward piece only when it has both parameter and input gradients.
    pub fn splits_backward(&self, s: usize, kind: ScheduleKind) -> bool {
        kind.splits_backward()
            && self.stages[s].parameter_bytes > 0.0
            && self.stages[s].wgt_s.iter().any(|&w| w > 0.0)
            && self.in_edges[s]
                .iter()
                .any(|&e| self.edges[e].grad_tensors > 0)
    }

    /// Whether stage `s`'s replicas take whole micro-batches in turn ([`StageGraph::round_robin`]).
    pub fn is_round_robin(&self, s: usize) -> bool {
        self.round_robin.get(s).copied().unwrap_or(false)
    }

    /// A chain of `s` unreplicated stages (device i runs stage i) with forward `f`, backward `b`,
    /// `bytes` per micro-batch between neighbours, no parameters: the closed-form test fixture.
    pub fn uniform_chain(s: usize, f: f64, b: f64, bytes: f64) -> StageGraph {
        let stages = (0..s)
            .map(|i| SimStage {
                devices: vec![i],
                fwd_s: vec![f],
                bwd_s: vec![b],
                wgt_s: vec![0.0],
                step_s: vec![0.0],
                parameter_bytes: 0.0,
                tied_bytes: 0.0,
                static_bytes: 0.0,
                saved_bytes: 1.0,
                weight_saved_bytes: 1.0,
                carried_bytes: 0.0,
                load_bytes: 0.0,
            })
            .collect();
        let edges = (1..s).map(|i| StageEdge::new(i - 1, i, bytes)).collect();
        StageGraph::new(stages, edges)
    }

    /// Cost a planner's stages: per replica, its slice `micro_batch / replicas` on its device kind.
    pub fn from_specs(
        g: &CostGraph,
        cluster: &Cluster,
        specs: &[StageSpec],
        micro_batch: f64,
        opt: Optimizer,
    ) -> StageGraph {
        Self::build(g, cluster, specs, micro_batch, opt, true, None)
    }

    /// Cost a planner's stages with GraphPipe's per-stage micro-batch sizes `ps` (for
    /// [`ScheduleKind::GppPerStage`]): stage `s`'s replicas each take `ps.micro_batch[s] /
    /// replicas` samples; the edges' bytes are per micro-batch of `ps.base_micro_batch`.
    pub fn from_specs_per_stage(
        g: &CostGraph,
        cluster: &Cluster,
        specs: &[StageSpec],
        opt: Optimizer,
        ps: PerStage,
    ) -> StageGraph {
        let mut sg = Self::build(
            g,
            cluster,
            specs,
            ps.base_micro_batch as f64,
            opt,
            true,
            Some(&ps.micro_batch),
        );
        sg.per_stage = Some(ps);
        sg
    }

    /// Cost a planner's stages for the schedule `kind`: as [`StageGraph::from_specs`], except
    /// that under round robin (`1f1b-rr`) every replica runs the whole micro-batch. Apply
    /// [`StageGraph::for_schedule`] to get the figures the simulator uses.
    pub fn from_specs_for(
        g: &CostGraph,
        cluster: &Cluster,
        specs: &[StageSpec],
        micro_batch: f64,
        opt: Optimizer,
        kind: ScheduleKind,
    ) -> StageGraph {
        let sg = Self::build(
            g,
            cluster,
            specs,
            micro_batch,
            opt,
            !kind.round_robin(),
            None,
        );
        if kind.splits_backward() {
            sg.with_weight_parts(g, cluster, specs, micro_batch)
        } else {
            sg
        }
    }

    /// Each stage's weight-gradient seconds and what its split backward holds
    /// ([`CostGraph::weight_part`]), for the schedules that split the backward (zero bubble;
    /// the other constructors leave them 0: nothing splits).
    pub fn with_weight_parts(
        mut self,
        g: &CostGraph,
        cluster: &Cluster,
        specs: &[StageSpec],
        micro_batch: f64,
    ) -> StageGraph {
        let trained = g.trained_nodes();
        for (s, sp) in specs.iter().enumerate() {
            let mask = g.mask(&sp.nodes);
            let r = if self.is_round_robin(s) {
                1
            } else {
                sp.devices.len().max(1)
            };
            let slice = micro_batch / r as f64;
            let mut by_kind: HashMap<usize, crate::cost::WeightPart> = HashMap::new();
            let st = &mut self.stages[s];
            for (j, &d) in sp.devices.iter().enumerate() {
                let k = cluster.devices[d].kind;
                let w = *by_kind
                    .entry(k)
                    .or_insert_with(|| g.weight_part(&mask, &trained, slice, &cluster.kinds[k]));
                st.wgt_s[j] = w.wgt_s.min(st.bwd_s[j]);
                st.weight_saved_bytes = w.weight_saved_bytes.min(st.saved_bytes);
                st.carried_bytes = w.carried_bytes;
            }
        }
        self
    }

    /// The stage graph the simulator runs `kind` on: itself, or
    /// [`StageGraph::with_recomputation`] for the re-computing kinds.
    pub fn for_schedule(&self, kind: ScheduleKind) -> std::borrow::Cow<'_, StageGraph> {
        if kind.recompute() {
            std::borrow::Cow::Owned(self.with_recomputation())
        } else {
            std::borrow::Cow::Borrowed(self)
        }
    }

    fn build(
        g: &CostGraph,
        cluster: &Cluster,
        specs: &[StageSpec],
        micro_batch: f64,
        opt: Optimizer,
        split: bool,
        per_stage_mb: Option<&[u64]>,
    ) -> StageGraph {
        let stage_of = crate::stage::stage_of(specs, g.len());
        // Tied parameters read in several stages: a copy in each (`extra` beyond the node
        // that counts the bytes), all-reduced over every holder's devices.
        let mut extra = vec![0.0f64; specs.len()];
        let mut tied_in = vec![0.0f64; specs.len()];
        let mut tied: std::collections::BTreeMap<Vec<usize>, f64> = Default::default();
        // Per tied parameter read in several stages: its holder stages, bytes and the stages
        // whose backward reads it (`None`: unknown, all).
        let mut tied_holders: Vec<(Vec<usize>, f64, Option<Vec<usize>>)> = Vec::new();
        for t in &g.tied {
            let mut holders: Vec<usize> = t
                .readers
                .iter()
                .map(|&r| stage_of[r])
                .filter(|&s| s != usize::MAX)
                .collect();
            holders.sort_unstable();
            holders.dedup();
            if holders.len() < 2 {
                continue;
            }
            let owner = t.readers.first().map_or(usize::MAX, |&r| stage_of[r]);
            let mut devices: Vec<usize> = holders
                .iter()
                .flat_map(|&s| specs[s].devices.iter().copied())
                .collect();
            devices.sort_unstable();
            devices.dedup();
            // Holders on one device set (chunks of a device group) share the device's one copy,
            // which the lowest of them steps (codegen's `stage_pieces`).
            let keeps = |s: usize| {
                holders
                    .iter()
                    .find(|&&h| specs[h].devices == specs[s].devices)
                    .is_none_or(|&h| h == s)
            };
            let keepers = holders.iter().filter(|&&s| keeps(s)).count();
            for &s in &holders {
                match (keeps(s), s == owner) {
                    (true, false) => extra[s] += t.bytes,
                    (false, true) => extra[s] -= t.bytes,
                    _ => {}
                }
                if keeps(s) && keepers > 1 {
                    tied_in[s] += t.bytes;
                }
            }
            // Held on one device set, its gradients go with that set's others.
            if keepers > 1 {
                *tied.entry(devices).or_default() += t.bytes;
            }
            let bwd = t.backward_readers.as_ref().map(|r| {
                r.iter()
                    .map(|&n| stage_of[n])
                    .filter(|&s| s != usize::MAX)
                    .collect()
            });
            tied_holders.push((holders, t.bytes, bwd));
        }
        // Per side computation: the stages that run it (those whose pieces read it, directly
        // or through other side computations; codegen recomputes it in each).
        let mut need: HashMap<usize, std::collections::BTreeSet<usize>> = HashMap::new();
        // The stages that run node `d`: those that need it if it is a side computation, else
        // its own stage.
        let runs = |need: &HashMap<usize, std::collections::BTreeSet<usize>>,
                    d: usize,
                    into: &mut std::collections::BTreeSet<usize>| {
            match need.get(&d) {
                Some(ss) if g.nodes[d].side => into.extend(ss.iter().copied()),
                _ => {
                    into.insert(stage_of[d]);
                }
            }
        };
        for &x in g.topo_order().iter().rev() {
            if !g.nodes[x].side {
                continue;
            }
            let mut set = std::collections::BTreeSet::new();
            for &e in g.out_edges(x) {
                runs(&need, g.edges[e].dst, &mut set);
            }
            need.insert(x, set);
        }
        // Per stage: the side computations whose forward it runs that are not its members
        // (+1: codegen recomputes them there) and the members it does not run (−1: nothing of
        // the stage reads them, so its forward piece drops them).
        let mut side_runs: Vec<Vec<(usize, f64)>> = vec![Vec::new(); specs.len()];
        for (&x, at) in &need {
            let home = stage_of[x];
            for &s in at {
                if s != home && s < side_runs.len() {
                    side_runs[s].push((x, 1.0));
                }
            }
            if home < side_runs.len() && !at.contains(&home) {
                side_runs[home].push((x, -1.0));
            }
        }
        for v in &mut side_runs {
            v.sort_by_key(|&(x, _)| x);
        }
        // Per stage: the cotangent sums it runs (+1) and the whole sums costed with its
        // members' backward that it does not run as such (−1); see `CotangentSum`.
        let mut sum_parts: Vec<Vec<(crate::cost::Kernel, f64)>> = vec![Vec::new(); specs.len()];
        for cs in &g.cotangent_sums {
            let home = stage_of[cs.producer];
            if home >= specs.len() {
                continue;
            }
            let mut per: std::collections::BTreeMap<usize, usize> = Default::default();
            for f in &cs.from {
                *per.entry(f.map_or(home, |n| stage_of[n])).or_default() += 1;
            }
            let at_home =
                per.get(&home).copied().unwrap_or(0) + per.keys().filter(|&&t| t != home).count();
            let parts: Vec<(usize, usize)> = per
                .iter()
                .filter(|&(&t, _)| t != home)
                .map(|(&t, &k)| (t, k))
                .chain([(home, at_home)])
                .filter(|&(t, k)| k >= 2 && t < specs.len())
                .collect();
            if parts == [(home, cs.from.len())] {
                continue;
            }
            sum_parts[home].push((cs.kernel.clone(), -1.0));
            for (t, k) in parts {
                sum_parts[t].push((cs.part(k), 1.0));
            }
        }
        // Per stage: the data inputs it loads and holds through the forward besides its saved
        // activations (bytes at the graph's reference batch; see `DataInput`).
        let mut loads = vec![0.0f64; specs.len()];
        for di in &g.data_inputs {
            let mut at = std::collections::BTreeSet::new();
            for &r in &di.readers {
                runs(&need, r, &mut at);
            }
            for s in at {
                if s < loads.len() && !di.saved_by.iter().any(|&n| stage_of[n] == s) {
                    loads[s] += di.bytes;
                }
            }
        }
        let mut untrained = vec![0.0f64; specs.len()];
        for &(n, b) in &g.untrained {
            if let Some(u) = untrained.get_mut(stage_of[n]) {
                *u += b;
            }
        }
        let mut stages = Vec::with_capacity(specs.len());
        let mut round_robin = Vec::with_capacity(specs.len());
        // Per stage: the replicas a micro-batch is split over, and the forward's boundary
        // buffers per device (received activations and outputs to send).
        let mut split_of: Vec<f64> = Vec::with_capacity(specs.len());
        let mut fwd_comm: Vec<f64> = Vec::with_capacity(specs.len());
        for (s, sp) in specs.iter().enumerate() {
            let mask = g.mask(&sp.nodes);
            let own = per_stage_mb
                .and_then(|v| v.get(s))
                .map_or(micro_batch, |&b| b as f64);
            // As codegen: replicas split each micro-batch evenly when it divides over them,
            // else (and always under 1F1B-RR) take whole micro-batches in turn.
            let replicas = sp.devices.len().max(1);
            let r = if split && !takes_turns(own, replicas) {
                replicas
            } else {
                1
            };
            round_robin.push(replicas > 1 && r == 1);
            split_of.push(r as f64);
            fwd_comm.push(0.0f64);
            let slice = own / r as f64;
            let mut by_kind: HashMap<usize, crate::cost::GroupCost> = HashMap::new();
            let (mut fwd, mut bwd, mut step) = (Vec::new(), Vec::new(), Vec::new());
            let mut static_bytes: f64 = 0.0;
            let mut params = 0.0;
            let mut saved = 0.0;
            let mut load = 0.0;
            for &d in &sp.devices {
                let k = cluster.devices[d].kind;
                let kind = &cluster.kinds[k];
                let c = by_kind
                    .entry(k)
                    .or_insert_with(|| g.group_cost(&mask, slice, kind));
                // Side computations run where they are read, not where the plan put them.
                let side_s: f64 = side_runs[s]
                    .iter()
                    .map(|&(x, sign)| sign * g.times(x, slice, kind).0)
                    .sum();
                fwd.push(c.fwd_s + side_s);
                let sums_s: f64 = sum_parts[s]
                    .iter()
                    .map(|(k, sign)| sign * k.time(g.scale(slice), kind))
                    .sum();
                bwd.push(c.bwd_s + sums_s);
                // Trained parameters: stepped, with gradients and optimizer state; the
                // untrained ones are only held.
                let held = c.parameter_bytes + extra[s] - untrained[s];
                step.push(step_time(held, kind.memory_bandwidth, opt));
                let comm = c.in_bytes + c.out_bytes;
                load = loads[s] * g.scale(slice);
                let mut mem = stage_memory(held, c.saved_bytes, 1, comm, opt);
                mem.parameters += untrained[s];
                fwd_comm[s] = fwd_comm[s].max(comm);
                static_bytes = static_bytes.max(mem.static_bytes());
                params = held;
                saved = c.saved_bytes;
            }
            stages.push(SimStage {
                devices: sp.devices.clone(),
                fwd_s: fwd,
                bwd_s: bwd,
                wgt_s: vec![0.0; sp.devices.len()],
                step_s: step,
                parameter_bytes: params,
                tied_bytes: tied_in[s],
                static_bytes,
                saved_bytes: saved,
                weight_saved_bytes: saved,
                carried_bytes: 0.0,
                load_bytes: load,
            });
        }
        // Stage edges: a node's output crosses once per consuming stage (the largest of its edges
        // into that stage: graph.txt edges all carry the node's whole output).
        // Side computations are not sent: codegen recomputes each in every stage that reads it,
        // directly or through other side computations (not in a stage of its own where nothing
        // reads it: a stage's forward piece keeps only what leads to what it sends); what a side
        // computation reads from a heavy node crosses to each of those stages.
        // Nodes whose output depends on a parameter: only those get cotangents back. A node
        // reads a parameter when it holds its bytes or is one of a tied parameter's readers
        // (whose bytes count at the first reader only, e.g. GPT-2's LM-head `Transpose(wte)`).
        let trained = g.trained_nodes();
        // Per (stage, stage): activation bytes and values, cotangent bytes and values, and the
        // parts of both in values with no batch axis.
        #[derive(Default)]
        struct Acc {
            bytes: f64,
            tensors: usize,
            grad_bytes: f64,
            grad_tensors: usize,
            whole: f64,
            whole_grad: f64,
        }
        let mut acc: std::collections::BTreeMap<(usize, usize), Acc> = Default::default();
        for u in 0..g.len() {
            if g.nodes[u].side {
                continue;
            }
            let su = stage_of[u];
            // Per consumer stage: per set of outputs read (bytes, whole bytes), and whether a
            // consumer there differentiates them.
            type Reads = Vec<(u64, [f64; 2])>;
            let mut per: std::collections::BTreeMap<usize, (Reads, bool)> = Default::default();
            for &e in g.out_edges(u) {
                let d = g.edges[e].dst;
                let bytes = g.edge_bytes(e, micro_batch);
                let (whole, outputs) = (g.edges[e].fixed_bytes, g.edges[e].outputs.max(1));
                let mut cross = |t: usize, grad: bool| {
                    if t != su {
                        let (reads, g) = per.entry(t).or_default();
                        reads.push((outputs, [bytes, whole]));
                        *g |= grad;
                    }
                };
                match need.get(&d) {
                    Some(ss) => ss.iter().for_each(|&t| cross(t, false)),
                    None => cross(stage_of[d], trained[u] && g.edges[e].cotangent),
                }
            }
            for (t, (reads, grad)) in per {
                // Each output crosses once, as its own message.
                let ([b, whole], seen) = crate::cost::output_union(reads);
                let n = seen.count_ones() as usize;
                let e = acc.entry((su, t)).or_default();
                e.bytes += b;
                e.tensors += n;
                e.whole += whole;
                if grad {
                    e.grad_bytes += b;
                    e.grad_tensors += n;
                    e.whole_grad += whole;
                }
            }
        }
        let edges: Vec<StageEdge> = acc
            .into_iter()
            .map(|((src, dst), a)| StageEdge {
                src,
                dst,
                bytes: a.bytes,
                tensors: a.tensors,
                grad_bytes: a.grad_bytes,
                grad_tensors: a.grad_tensors,
                whole_bytes: a.whole,
                whole_grad_bytes: a.whole_grad,
            })
            .collect();
        // The backward's boundary buffers: a cotangent from every consumer stage of a value
        // (codegen receives one buffer per consuming stage and the backward piece sums them)
        // and the gradients sent to the producer stages. Where they exceed the forward's, the
        // stage holds the difference on top of its forward-sized communication buffers. A
        // batch-independent value's cotangent comes back from each consumer replica a producer
        // replica serves (`⌈r_dst / r_src⌉` partial sums), added up as they arrive: two buffers
        // live while there are several.
        let mut bwd_comm = vec![0.0f64; stages.len()];
        for e in &edges {
            let batched = e.grad_bytes - e.whole_grad_bytes;
            // Replica 0 gets the most pieces.
            let pieces = partial_sums(split_of[e.src] as usize, split_of[e.dst] as usize, 0);
            let running = if pieces >= 2 { 2.0 } else { 1.0 };
            bwd_comm[e.src] += batched / split_of[e.src] + e.whole_grad_bytes * running;
            bwd_comm[e.dst] += batched / split_of[e.dst] + e.whole_grad_bytes;
        }
        for (s, st) in stages.iter_mut().enumerate() {
            st.static_bytes += (bwd_comm[s] - fwd_comm[s]).max(0.0);
        }
        let mut sg = StageGraph::new(stages, edges);
        if split {
            sg.round_robin = round_robin;
        }
        sg.tied = tied
            .into_iter()
            .map(|(devices, bytes)| TiedGroup { devices, bytes })
            .collect();
        if !g.forward_only_params.is_empty() {
            let mut u = vec![0.0f64; sg.stages.len()];
            for &(n, b) in &g.forward_only_params {
                if let Some(x) = stage_of.get(n).and_then(|&s| u.get_mut(s)) {
                    *x += b;
                }
            }
            sg.unstashed = u;
        }
        if !tied_holders.is_empty() {
            let depth = sg.depth_to_sink();
            let mut follow: Vec<std::collections::BTreeMap<(usize, bool), f64>> =
                vec![Default::default(); sg.stages.len()];
            for (holders, bytes, bwd) in tied_holders {
                let Some(first) = deepest_stage(&depth, holders.iter().copied()) else {
                    continue;
                };
                for &t in holders.iter().filter(|&&t| t != first) {
                    let backward = bwd.as_ref().is_none_or(|b: &Vec<usize>| b.contains(&t));
                    *follow[t].entry((first, backward)).or_default() += bytes;
                }
            }
            sg.tied_stash = follow
                .into_iter()
                .map(|m| m.into_iter().map(|((o, b), x)| (o, x, b)).collect())
                .collect();
        }
        sg
    }

    /// PipeDream's **vertical sync** (§3.4) under per-micro-batch updates: every stage but the
    /// input stage (the one deepest from a sink) reads, for each micro-batch, the version the
    /// input stage's forward read, so it stashes all its trained parameters for every
    /// micro-batch, from its step that reaches that version until their last reader (the
    /// backward for those it reads, [`StageGraph::unstashed`] until the forward), as codegen
    /// emits it. The input stage stashes as without vertical sync.
    pub fn with_vertical_sync(&mut self) {
        let depth = self.depth_to_sink();
        let n = self.stages.len();
        let Some(input) = deepest_stage(&depth, 0..n) else {
            return;
        };
        self.tied_stash = (0..n)
            .map(|s| {
                if s == input {
                    return self.tied_stash.get(s).cloned().unwrap_or_default();
                }
                // Tied parameters keep their last reader; the rest split by theirs.
                let tied = self.tied_stash.get(s).cloned().unwrap_or_default();
                let tied_bytes: f64 = tied.iter().map(|x| x.1).sum();
                let fwd_only = self.unstashed.get(s).copied().unwrap_or(0.0);
                let bwd = (self.stages[s].parameter_bytes - tied_bytes - fwd_only).max(0.0);
                tied.into_iter()
                    .map(|(_, b, backward)| (input, b, backward))
                    .chain([(input, bwd, true), (input, fwd_only, false)])
                    .filter(|x| x.1 > 0.0)
                    .collect()
            })
            .collect();
    }

    /// The same stages with **re-computation** (GPipe's rematerialisation, DAPPLE's "RC"): a stage
    /// keeps only its input (the boundary activations it received, or nothing for a source stage)
    /// per in-flight micro-batch, and re-runs its forward before each backward, so
    /// `B' = B + F`, the saved bytes become the input slice, and one micro-batch's full
    /// activations are live during a backward (added to the static memory).
    pub fn with_recomputation(&self) -> StageGraph {
        let mut out = self.clone();
        for (s, st) in out.stages.iter_mut().enumerate() {
            let r = if self.is_round_robin(s) {
                1.0
            } else {
                st.devices.len().max(1) as f64
            };
            let input: f64 = self.in_edges[s]
                .iter()
                .map(|&e| self.edges[e].bytes)
                .sum::<f64>()
                / r;
            for (b, f) in st.bwd_s.iter_mut().zip(&st.fwd_s) {
                *b += f;
            }
            st.static_bytes += st.saved_bytes;
            st.saved_bytes = input.min(st.saved_bytes);
        }
        out
    }

    /// Per stage, the most workers (replicas summed over the stages) on a path from it to a sink,
    /// itself included: PipeDream's "number of machines" that 1F1B-RR's warm-up divides.
    pub fn workers_to_sink(&self) -> Vec<usize> {
        let replicas: Vec<usize> = self.stages.iter().map(|s| s.devices.len()).collect();
        heaviest_path_to_sink(&self.successors(), &replicas)
    }

    /// Per stage, the stages its edges feed (the stage DAG's successor lists).
    pub fn successors(&self) -> Vec<Vec<usize>> {
        self.out_edges
            .iter()
            .map(|es| es.iter().map(|&e| self.edges[e].dst).collect())
            .collect()
    }

    /// Per stage, the number of stages on the longest path from it to a sink (a sink has 1).
    pub fn depth_to_sink(&self) -> Vec<usize> {
        heaviest_path_to_sink(&self.successors(), &vec![1; self.stages.len()])
    }

    /// Pipeline depth: stages on the longest path (the stage graph's diameter in GraphPipe's sense).
    pub fn depth(&self) -> usize {
        self.depth_to_sink().into_iter().max().unwrap_or(0)
    }
}
