//! `gpp`: GraphPipe's graph pipeline parallelism (Jeon et al., ASPLOS'25), and `gpp-seq`, the
//! same DP on the linearised graph (sequential pipeline parallelism, SPP) for side-by-side
//! comparison on one cost model.
//!
//! Steps:
//! 1. [`sp_tree::decompose`]: the SP tree of the forward graph (side computations
//!    duplicated, synchronising edges added by cost), then [`SpTree::coarsen`] with
//!    `θ = total work / max(2·D', 32)` so the DP sees about `max(2·D', 32)` units, where
//!    `D' = D / g` are the device counts the DP distinguishes: from `2·`[`DEVICE_SLOTS`]
//!    devices on, stages take multiples of a power-of-two granule `g` with `D / g ≥ 64`
//!    ([`device_granule`]: 16 at 1024 devices), so the DP costs what it costs on 64 devices
//!    instead of growing with `D²` (12-layer GPT-2 export at 1024 devices: 17 s → 0.5 s for
//!    the search on all devices; same or better plans than `g = 1` at 128 and 256 devices on
//!    the GraphPipe models, BENCHMARKS.md).
//! 2. **Coarse pass.** For each candidate micro-batch size (powers of two dividing the batch with
//!    at most 512 micro-batches, or `--micro-batch`), [`search::search`]
//!    (Algorithm 1) at ε = 5·10⁻², strict (no relaxed targets), on a fixed pool of worker
//!    threads. Sizes are searched in waves in the order of their lower bound
//!    ([`search::lower_bounds`]); a size whose bound exceeds the third-best coarse
//!    estimate so far cannot make the shortlist and is skipped.
//! 3. **Refinement.** The three best by estimated iteration time `(M + depth − 1)·max per_mb +
//!    sync` are searched again at ε = 10⁻³ from their coarse bracket, now also at the relaxed
//!    targets `t·{1.05, …, 3}` (shallower plans: the DP returns the smallest in-flight count
//!    under a target).
//! 4. The same on the linearised DP (for `gpp`: on the graph DP's shortlist and the extreme
//!    sizes; SPP is a special case of GPP, §2; its stage DAG keeps only real dependencies).
//! 5. **Choice by simulation.** Every refined plan and up to three of its distinct alternatives
//!    (the optimum's plan and the relaxed ones: the estimate is a model) are placed ([`place`]),
//!    given the GPP schedule ([`crate::graphpipe::schedule_gpp`], default `--schedule gpp`) and ranked by
//!    simulation ([`ranking_time`]: short runs, extrapolated over the steady state), best
//!    estimate first, skipping a candidate whose [`compute_bound`] already exceeds the best
//!    simulated time; the fastest is assembled from its full simulation (re-simulated only when
//!    the ranking extrapolated) (the paper sweeps micro-batch sizes the same way, §7 "we sweep
//!    over micro-batch sizes").
//!
//! 6. **Fewer devices, and the sequential planners' plans** (`gpp` only): the search is repeated
//!    on the first `D/2`, `D/4`, ..., 1 devices while a plan on them could still be faster (a
//!    compute bound, [`Gpp::fewer_devices`]), and the plans of `dp`, `pipedream`, `bapipe`,
//!    and (up to 32 devices) `straight` and `dapple` ([`SEQUENTIAL_SEEDS`]) join the choice: the
//!    fastest simulated plan that fits in memory wins. A sequential pipeline is a special case
//!    of a graph pipeline, so GPP never returns a plan slower than theirs on this cost model
//!    (property test in `passes/tests/gpp.rs`). A seed that provably cannot beat the best plan
//!    so far is not made: `straight` when its lower bound
//!    ([`super::straight::iteration_lower_bound`]; no search, no simulation) already exceeds
//!    it; and a seed's plan whose compute or channel bound reaches it is not simulated
//!    ([`super::Planner::plan_below`]). `dapple`, the slowest seed, runs on a thread of its own
//!    from the start, beside GPP's own search, with one search worker until GPP waits for it and
//!    every core after (`Dapple::workers`; with one core: after GPP's search, skipped when
//!    [`super::dapple::iteration_lower_bound`] exceeds the best). Both join up to 32 devices
//!    ([`SEQUENTIAL_SEEDS`]: their searches grow faster with the devices than GPP's). Search
//!    cost: the searches on `D/2^k` devices cost less than the one on `D` (the DP grows steeply
//!    with devices) and stop at the bound; the seeds cost what those planners cost.
//!
//! The searches at one micro-batch size share their stage evaluations
//! ([`dp::StageTable`]): the graph and linearised unit graphs have the same
//! units, so the coarse, refined and linearised searches cost each stage once.
//!
//! `gpp-seq` plans are simulated as the chain they are (stage `i+1` after stage `i`, see
//! [`simulate_as_chain`]), so the comparison shows the cost of the linearisation's false
//! dependencies as the paper measures it.
//!
//! Objective (`objective_s`): the bottleneck stage's time-per-sample × the batch (Eq. 1 in seconds
//! per iteration).

use super::planner::Planner;
use crate::cost::{Cluster, CostGraph};
use crate::plan::{Plan, PlanOptions, StageSpec};

pub mod dp;
pub mod params;
pub mod per_stage;
pub mod search;
pub mod sp_tree;
pub mod units;

use self::dp::{ScratchPool, StageTable};
use self::search::{device_granule, lower_bounds, search_with, SearchParams, SearchResult};
use self::sp_tree::{assign_side_nodes, decompose, node_work, SpTree};
use self::units::{UnitGraph, MAX_DP_UNITS};
use crate::sim::{compute_bound, ScheduleKind, SimResult, StageEdge, StageGraph};
use pipec_compiler::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The `gpp` planner (`sequential: true` is `gpp-seq`).
pub struct Gpp {
    pub sequential: bool,
    /// Relative tolerance of the binary search.
    pub eps: f64,
    /// Units per device the coarsening aims at.
    pub units_per_device: f64,
    /// `gpp` only: also search on fewer devices and rank the sequential planners' plans
    /// ([`SEQUENTIAL_SEEDS`]); off, the plan is Algorithm 1's on all devices.
    pub seeds: bool,
    /// Plans of [`SEQUENTIAL_SEEDS`] planners already made for the same graph, cluster and
    /// options (by `pipec compare`, which runs them anyway): used instead of planning again.
    pub seed_plans: Vec<(String, Plan)>,
    /// Device counts the DP distinguishes at most ([`device_granule`]): above `2·slots`
    /// devices, stages take multiples of a power-of-two granule and the units are coarsened
    /// for `slots` devices. `usize::MAX`: every count (exact, quadratic in the devices).
    pub device_slots: usize,
}

/// Default of [`Gpp::device_slots`]: up to 127 devices the DP sees every device count.
pub const DEVICE_SLOTS: usize = 64;

impl Default for Gpp {
    fn default() -> Self {
        Gpp {
            sequential: false,
            eps: 1e-3,
            units_per_device: 2.0,
            seeds: true,
            seed_plans: Vec::new(),
            device_slots: device_slots_from_env().unwrap_or(DEVICE_SLOTS),
        }
    }
}

/// `PIPEC_GPP_SLOTS=N` overrides [`DEVICE_SLOTS`] (`0`: every device count), to measure what the
/// granule costs in plan quality.
fn device_slots_from_env() -> Option<usize> {
    let v = std::env::var("PIPEC_GPP_SLOTS").ok()?;
    let n: usize = v.trim().parse().ok()?;
    Some(if n == 0 { usize::MAX } else { n })
}

impl Gpp {
    /// The sequential (linearised) mode.
    pub fn sequential() -> Gpp {
        Gpp {
            sequential: true,
            ..Gpp::default()
        }
    }

    /// The granule of the DP's device counts on `devices` devices ([`device_granule`]).
    fn granule(&self, devices: usize) -> usize {
        device_granule(devices, self.device_slots)
    }

    /// The coarsened unit graph the DP runs on.
    pub fn unit_graph(&self, g: &CostGraph, cluster: &Cluster) -> (SpTree, UnitGraph) {
        let (sp, coarse) = self.coarse_tree(g, cluster);
        let ug = UnitGraph::new(g, &coarse, self.sequential);
        (sp, ug)
    }

    /// The SP decomposition and its coarsening (the graph and linearised DPs share it).
    fn coarse_tree(&self, g: &CostGraph, cluster: &Cluster) -> (SpTree, SpTree) {
        let kind = cluster.kind_of(0);
        let sp = decompose(g, kind);
        let w = node_work(g, kind);
        let total: f64 = w.iter().sum();
        // Units for the device counts the DP distinguishes.
        let slots = cluster.len().max(1) / self.granule(cluster.len().max(1));
        let mut theta = total / (self.units_per_device * slots as f64).max(32.0);
        let mut coarse = sp.coarsen(&w, theta);
        // Deep nesting keeps small pieces apart at any θ that only merges small subtrees: raise
        // θ until the DP's tables (quadratic in the units) stay bounded.
        while coarse.leaves().len() > MAX_DP_UNITS && theta < total {
            theta *= 2.0;
            coarse = sp.coarsen(&w, theta);
        }
        (sp, coarse)
    }

    /// Candidate micro-batch sizes.
    pub fn candidates(opts: &PlanOptions) -> Result<Vec<u64>> {
        if let Some(mb) = opts.micro_batch() {
            return Ok(vec![opts.micro_batch_or(1)]
                .into_iter()
                .filter(|&x| x == mb)
                .collect());
        }
        let b = opts.batch.max(1);
        let mut c: Vec<u64> = (0..63)
            .map(|i| 1u64 << i)
            .take_while(|&x| x <= b)
            .filter(|&x| b.is_multiple_of(x) && b / x <= 512)
            .collect();
        if c.is_empty() || !b.is_power_of_two() {
            c.push(b);
        }
        c.dedup();
        Ok(c)
    }

    /// Turn a search result into stage specs (placement and side nodes included).
    pub fn specs(
        g: &CostGraph,
        cluster: &Cluster,
        ug: &UnitGraph,
        res: &SearchResult,
        micro_batch: u64,
    ) -> Vec<StageSpec> {
        let ns = res.stages.len();
        let mut stage_of = vec![usize::MAX; g.len()];
        for (s, st) in res.stages.iter().enumerate() {
            for u in st.lo..st.hi {
                for &n in &ug.units[u] {
                    stage_of[n] = s;
                }
            }
        }
        let (succ, bytes) = stage_edges(g, &stage_of, ns, micro_batch as f64);
        let topo = topo_order(&succ);
        let reach = reachability(&succ, &topo);
        assign_side_nodes(g, &ug.side, &mut stage_of, &topo, &reach);
        let replicas: Vec<usize> = res.stages.iter().map(|s| s.replicas).collect();
        let devices = place(cluster, &replicas, &topo, &bytes);
        let mut nodes = vec![Vec::new(); ns];
        for &n in g.topo_order() {
            if stage_of[n] < ns {
                nodes[stage_of[n]].push(n);
            }
        }
        nodes
            .into_iter()
            .zip(devices)
            .map(|(nodes, devices)| StageSpec { nodes, devices })
            .collect()
    }
}

/// The simulator's stage graph of `specs` at micro-batch `b`; with `chain`, stage `i + 1` also
/// waits for stage `i` (see [`simulate_as_chain`]).
fn stage_graph(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    specs: &[StageSpec],
    b: u64,
    schedule: ScheduleKind,
    chain: bool,
) -> StageGraph {
    let sg = StageGraph::from_specs_for(g, cluster, specs, b as f64, opts.optimizer, schedule);
    if !chain {
        return sg;
    }
    let mut edges = sg.edges.clone();
    for i in 1..specs.len() {
        if !edges.iter().any(|e| e.src == i - 1 && e.dst == i) {
            edges.push(StageEdge::new(i - 1, i, 0.0));
        }
    }
    let (round_robin, tied) = (sg.round_robin.clone(), sg.tied.clone());
    let mut out = StageGraph::new(sg.stages, edges);
    out.round_robin = round_robin;
    out.tied = tied;
    out
}

/// A candidate's iteration time for ranking the pool, from short simulations: exact when the
/// mini-batch has at most `2P` micro-batches (`P = max(16, 4·stages, 2·R)`, `R` the most
/// replicas of a stage that takes micro-batches in turn), else the steady-state
/// extrapolation `T(P) + (M − P)·(T(P) − T(P/2))/(P/2)`. The schedules repeat one micro-batch's
/// pattern between warm-up and drain (1F1B, GPipe's all-forward/all-backward, GPP's in-flight
/// windows), and the all-reduce and step at the end are in both runs, so the slope is the
/// steady-state time per micro-batch. Only the chosen candidate is then simulated in full.
/// Also returns the simulation when it is the whole iteration (`M ≤ 2P`).
fn ranking_time(
    sg: &StageGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    schedule: ScheduleKind,
    m: usize,
) -> Result<(f64, Option<SimResult>)> {
    let run = |m: usize| -> Result<SimResult> {
        Ok(crate::sim::fill::scheduled(sg, schedule, m, cluster, opts.allreduce)?.1)
    };
    // Replicas that take whole micro-batches in turn reach their steady state only once each
    // has had a micro-batch: until then the runs add replicas, not time (a stage of 256
    // replicas at 256 micro-batches ranked 2.2x below its full simulation from runs of 8 and 16).
    let turns = sg
        .stages
        .iter()
        .enumerate()
        .filter(|&(s, _)| schedule.round_robin() || sg.is_round_robin(s))
        .map(|(_, st)| st.devices.len())
        .max()
        .unwrap_or(0);
    let p = (4 * sg.stages.len()).max(16).max(2 * turns);
    if m <= 2 * p {
        let r = run(m)?;
        return Ok((r.iteration_time_s, Some(r)));
    }
    let (half, full) = (run(p / 2)?.iteration_time_s, run(p)?.iteration_time_s);
    Ok((
        full + (m - p) as f64 * (full - half) / (p - p / 2) as f64,
        None,
    ))
}

/// Below this many devices the search runs on the calling thread alone.
///
/// Searches below 16 devices take a few milliseconds (BENCHMARKS.md, "GraphPipe"): a thread's
/// start and wake-ups cost more than it saves, and the waves of micro-batch sizes run one at a
/// time prune more sizes by their bound. Measured on the 2-vCPU dev VM, 4 GPUs: MMT 2.9 → 2.0 ms,
/// 8 GPUs: 7.5 → 5.5 ms (median of cold processes). On one thread the plan does not depend on
/// the host's core count.
const PARALLEL_FROM_DEVICES: usize = 16;

/// Threads for a search over `devices` devices (see [`PARALLEL_FROM_DEVICES`]).
fn search_threads(devices: usize) -> usize {
    if devices < PARALLEL_FROM_DEVICES {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `f` over `items` on up to `threads` scoped threads (contiguous chunks, this thread takes the
/// first), results in order; a panic is an error.
fn par_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let chunk = items.len().div_ceil(threads.max(1)).max(1);
    let mut parts = items.chunks(chunk);
    let Some(first) = parts.next() else {
        return Ok(Vec::new());
    };
    let f = &f;
    std::thread::scope(|sc| {
        let handles: Vec<_> = parts
            .map(|part| sc.spawn(move || part.iter().map(f).collect::<Result<Vec<R>>>()))
            .collect();
        let mut out = first.iter().map(f).collect::<Result<Vec<R>>>()?;
        for h in handles {
            let part = h
                .join()
                .unwrap_or_else(|_| Err(Error::msg("gpp: a worker thread panicked")))?;
            out.extend(part);
        }
        Ok(out)
    })
}

/// Lower bounds of any plan's iteration on the first `d` devices of `cluster`: every node's
/// forward and backward run once per sample of the batch, on devices no faster than the fastest
/// of them, and a node's time on a slice of `x` samples is at least its time on the whole batch
/// times `x / batch` (the roofline's fixed costs only add: `r·F(b/r) ≥ F(b)`), so the busiest of
/// `d` devices computes at least `F_total(batch) / d`.
struct ComputeBound<'c> {
    cluster: &'c Cluster,
    /// `F_total(batch)` per device kind (indexed like `cluster.kinds`).
    total: Vec<f64>,
}

impl<'c> ComputeBound<'c> {
    fn new(g: &CostGraph, cluster: &'c Cluster, opts: &PlanOptions) -> ComputeBound<'c> {
        let batch = opts.batch.max(1) as f64;
        let total = cluster
            .kinds
            .iter()
            .map(|kind| {
                (0..g.nodes.len())
                    .map(|n| {
                        let (f, b) = g.times(n, batch, kind);
                        f + b
                    })
                    .sum()
            })
            .collect();
        ComputeBound { cluster, total }
    }

    /// The bound on the first `d` devices.
    fn on(&self, d: usize) -> f64 {
        let d = d.clamp(1, self.cluster.len().max(1));
        self.cluster.devices[..d]
            .iter()
            .map(|x| self.total[x.kind])
            .fold(f64::INFINITY, f64::min)
            / d as f64
    }
}

/// Re-simulate a sequential plan with the linearisation's false dependencies: stage `i + 1` waits
/// for stage `i` (a zero-byte edge where the data has none), as SPP executes (GraphPipe §2: "each
/// stage has at most one predecessor and one successor"). The plan keeps its data-derived
/// `predecessors`; its times, depth, in-flight counts and memory are those of the chain.
pub fn simulate_as_chain(
    plan: &mut Plan,
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    specs: &[StageSpec],
    schedule: ScheduleKind,
) -> Result<()> {
    let sg = stage_graph(
        g,
        cluster,
        opts,
        specs,
        plan.micro_batch.size(),
        schedule,
        true,
    );
    let m = plan.micro_batches() as usize;
    let (_, res) = crate::sim::fill::scheduled(&sg, schedule, m, cluster, opts.allreduce)?;
    let t = res.iteration_time_s;
    plan.iteration_time_s = t;
    plan.bubble_fraction = res.bubble_fraction;
    plan.pipeline_depth = sg.depth();
    for (s, st) in plan.stages.iter_mut().enumerate() {
        st.in_flight = res.stage_in_flight[s];
        let peak = st
            .devices
            .iter()
            .map(|&d| res.devices[d].peak_memory_bytes)
            .fold(0.0, f64::max);
        st.peak_memory_bytes = peak.round() as u64;
    }
    plan.peak_memory_bytes = plan
        .stages
        .iter()
        .map(|s| s.peak_memory_bytes)
        .max()
        .unwrap_or(0);
    plan.out_of_memory = res.out_of_memory(cluster);
    Ok(())
}

/// Bytes per (producer stage, consumer stage).
type StageBytes = std::collections::BTreeMap<(usize, usize), f64>;

/// Stage successor lists and bytes per stage pair (skeleton and side nodes already assigned).
fn stage_edges(
    g: &CostGraph,
    stage_of: &[usize],
    ns: usize,
    batch: f64,
) -> (Vec<Vec<usize>>, StageBytes) {
    let mut bytes: std::collections::BTreeMap<(usize, usize), f64> = Default::default();
    for (i, e) in g.edges.iter().enumerate() {
        let (a, b) = (stage_of[e.src], stage_of[e.dst]);
        if a < ns && b < ns && a != b {
            *bytes.entry((a, b)).or_insert(0.0) += g.edge_bytes(i, batch);
        }
    }
    let mut succ = vec![Vec::new(); ns];
    for &(a, b) in bytes.keys() {
        succ[a].push(b);
    }
    (succ, bytes)
}

/// The stage DAG's order (ties to the lower id); on a cycle, which a stage DAG of convex stages
/// cannot have, the stages before it.
fn topo_order(succ: &[Vec<usize>]) -> Vec<usize> {
    pipec_compiler::topo::topo_order(succ.len(), |s| succ[s].iter().copied())
        .unwrap_or_else(|c| c.partial)
}

fn reachability(succ: &[Vec<usize>], topo: &[usize]) -> Vec<Vec<bool>> {
    let n = succ.len();
    let mut reach = vec![vec![false; n]; n];
    for &s in topo.iter().rev() {
        reach[s][s] = true;
        for &t in &succ[s] {
            let row = reach[t].clone();
            for (x, r) in row.into_iter().enumerate() {
                if r {
                    reach[s][x] = true;
                }
            }
        }
    }
    reach
}

/// Placement: map stages (replica counts) onto devices `0..Σ replicas` of `cluster`.
/// Stages with several replicas go first (largest first) into the node with the fewest free
/// devices that still holds them all (best fit, so replicas share a node and its fast link);
/// stages that fit no single node take whole nodes, most free first. Single-replica stages follow
/// in topological order, each preferring the node of the neighbour stage it exchanges the most
/// bytes with (large activations on fast links), else the node with the fewest free devices.
pub fn place(
    cluster: &Cluster,
    replicas: &[usize],
    topo: &[usize],
    bytes: &std::collections::BTreeMap<(usize, usize), f64>,
) -> Vec<Vec<usize>> {
    let total: usize = replicas.iter().sum();
    let per_node = cluster.levels.first().map_or(1, |l| l.size.max(1));
    let nodes = total.div_ceil(per_node);
    let mut free: Vec<Vec<usize>> = (0..nodes)
        .map(|k| (k * per_node..((k + 1) * per_node).min(total)).collect())
        .collect();
    let mut out = vec![Vec::new(); replicas.len()];
    let mut order: Vec<usize> = topo.to_vec();
    // multi-replica stages first, largest first (stable: topological among equals)
    order.sort_by_key(|&s| std::cmp::Reverse(if replicas[s] > 1 { replicas[s] } else { 0 }));
    for s in order {
        let r = replicas[s];
        // preferred node: the node of the placed neighbour with the most bytes exchanged
        let pref = bytes
            .iter()
            .filter(|((a, b), _)| *a == s || *b == s)
            .filter_map(|((a, b), x)| {
                let o = if *a == s { *b } else { *a };
                out[o].first().map(|&d| (cluster.node_of(d), *x))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|x| x.0);
        let fits: Vec<usize> = (0..nodes).filter(|&k| free[k].len() >= r).collect();
        let chosen = match pref.filter(|p| fits.contains(p)) {
            Some(p) => Some(p),
            None => fits.iter().copied().min_by_key(|&k| free[k].len()),
        };
        if let Some(k) = chosen {
            let take: Vec<usize> = free[k].drain(..r).collect();
            out[s] = take;
            continue;
        }
        // spread: whole nodes first (most free first)
        let mut need = r;
        while need > 0 {
            let Some(k) = (0..nodes)
                .filter(|&k| !free[k].is_empty())
                .max_by_key(|&k| (free[k].len().min(need), std::cmp::Reverse(k)))
            else {
                break;
            };
            let n = free[k].len().min(need);
            out[s].extend(free[k].drain(..n));
            need -= n;
        }
    }
    for d in out.iter_mut() {
        d.sort_unstable();
    }
    out
}

/// The most devices the GPP search takes: its cost grows steeply with the device count
/// (gpt2_tiny: 0.7 s at 128 devices, 9 s at 1024; mlp4: 2.5 s at 8192, 22 s at 16384).
pub const MAX_DEVICES: usize = 1024;

impl Planner for Gpp {
    fn name(&self) -> &'static str {
        if self.sequential {
            "gpp-seq"
        } else {
            "gpp"
        }
    }

    /// `gpp-seq`: the search on all devices. `gpp`: the search on all devices, then on fewer
    /// (see [`Gpp::fewer_devices`]), then the sequential planners' plans (see
    /// [`SEQUENTIAL_SEEDS`]); the fastest simulated plan wins, so GPP never loses to a
    /// sequential pipeline on the shared cost model (SPP is a special case of GPP, §2). Unless
    /// `--schedule` says otherwise, the winner's stages are also simulated under `zb-h1` and
    /// `zb-h2`.
    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        if cluster.len() > MAX_DEVICES {
            return Err(Error::infeasible(
                self.name(),
                format!(
                    "at most {MAX_DEVICES} devices supported, cluster has {}",
                    cluster.len()
                ),
            ));
        }
        // The DP's buffers, reused by every search of this call (see `ScratchPool`).
        let pool = ScratchPool::default();
        if self.sequential || !self.seeds {
            return self.search(g, cluster, opts, t0, &pool);
        }
        let (best, time_limited) = std::thread::scope(|sc| {
            // DAPPLE's search is the slowest seed (up to about 1 s at 32 devices, where GPP's
            // own search often takes a tenth of that): with more than one core it runs on a
            // thread of its own from the start, beside GPP's search and the other seeds.
            // It takes one search worker while GPP's own search and the other seeds run, and
            // every core once they are done and GPP waits for it (its plan does not depend on
            // how many workers it had).
            let dapple = (seed_wanted("dapple", cluster)
                && !self.seed_plans.iter().any(|(n, _)| n == "dapple")
                && std::thread::available_parallelism().map_or(1, |n| n.get()) > 1)
                .then(|| {
                    let workers = Arc::new(AtomicUsize::new(1));
                    let seed = super::dapple::Dapple {
                        workers: Some(workers.clone()),
                        ..Default::default()
                    };
                    (sc.spawn(move || seed.plan(g, cluster, opts)), workers)
                });
            let mut best = self.search(g, cluster, opts, t0, &pool);
            // `--time-limit`: the searches on fewer devices and the seeds are left out once it
            // has passed (the search on all devices always completes).
            let mut time_limited = self.fewer_devices(g, cluster, opts, t0, &mut best, &pool);
            drop(pool);
            time_limited |= seeds(g, cluster, opts, t0, &self.seed_plans, &mut best, dapple);
            (best, time_limited)
        });
        let mut best = best;
        // Zero bubble on the winning stages (a pipec addition, issue #21): the same stages with
        // each backward split into input- and weight-gradient passes (`zb-h1`, and `zb-h2`'s
        // longer warm-up), kept where the simulator finds them faster within the devices' memory.
        if opts.schedule.is_none() {
            for kind in [ScheduleKind::ZbH1, ScheduleKind::ZbH2] {
                let Ok(p) = &best else { break };
                if p.schedule == kind
                    || (kind == ScheduleKind::ZbH1 && p.schedule.splits_backward())
                {
                    continue;
                }
                let zb = p.rescheduled(self.name(), g, cluster, opts, kind);
                keep_faster(&mut best, zb);
            }
        }
        let mut plan = best?;
        plan.planner = self.name().to_string();
        plan.search_time_s = t0.elapsed().as_secs_f64();
        plan.time_limited |= time_limited;
        Ok(plan)
    }
}

/// The planner of a [`SEQUENTIAL_SEEDS`] name (built here rather than through the registry,
/// which lists `gpp` itself).
fn seed_planner(name: &str) -> Option<Box<dyn Planner>> {
    Some(match name {
        "dp" => Box::new(super::dp::DataParallel),
        "dapple" => Box::new(super::dapple::Dapple::default()),
        "straight" => Box::new(super::straight::Straight),
        "pipedream" => Box::new(super::pipedream::PipeDream::default()),
        "bapipe" => Box::new(super::bapipe::BaPipe),
        _ => return None,
    })
}

/// The planners whose plans join `gpp`'s final choice. Their stage graphs are sequential
/// pipelines (chains of stages with replicas), a special case of a graph pipeline, but each
/// searches them under its own rules that GPP's DP does not share: DAPPLE's pivot objective
/// and placements, BaPipe's balanced chain with fewer devices, PipeDream's hierarchical DP and
/// 1F1B-RR, plain data parallelism. Each plan is simulated on the same cost model (it already is,
/// by [`Plan::assemble`]), so taking the fastest keeps GPP's promise without re-deriving every
/// planner's search space inside Algorithm 1.
///
/// Each with the most devices it is run at: DAPPLE's search grows steeply with the device count
/// (at most about 1 s at 32 devices on the exported zoo, 2.5-9 s at 64 on GPT-2 exports; issue
/// #18), so above 32 devices GPP does not wait for it; `straight`'s exact DP over every cut of the node order costs
/// `O(D · nodes · stage length)` (12 s at 64 devices on a 20k-node GPT-2 export, 42 s at 256,
/// where GPP's own search takes 1-3 s), so above 32 devices GPP does not run it either: its
/// guarantee covers `straight` and `dapple` up to 32 devices and `dp`, `pipedream` and `bapipe`
/// at any count.
pub const SEQUENTIAL_SEEDS: &[(&str, usize)] = &[
    ("dp", usize::MAX),
    ("straight", 32),
    ("pipedream", usize::MAX),
    ("bapipe", usize::MAX),
    ("dapple", 32),
];

/// Whether the seed `name` runs on `cluster` ([`SEQUENTIAL_SEEDS`]).
fn seed_wanted(name: &str, cluster: &Cluster) -> bool {
    SEQUENTIAL_SEEDS
        .iter()
        .any(|&(n, max_devices)| n == name && cluster.len() <= max_devices)
}

/// Replace `best` by the fastest of it and the sequential planners' plans ([`SEQUENTIAL_SEEDS`]).
/// A planner that finds no plan (too few nodes for `straight`, a schedule it does not take) is
/// skipped; when every planner failed, the first error stays. `dapple`: DAPPLE's plan in the
/// making on a thread of its own, if it was started. Returns whether `--time-limit` left seeds
/// out.
fn seeds(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    t0: Instant,
    made: &[(String, Plan)],
    best: &mut Result<Plan>,
    mut dapple: Option<(
        std::thread::ScopedJoinHandle<'_, Result<Plan>>,
        Arc<AtomicUsize>,
    )>,
) -> bool {
    let debug = std::env::var_os("PIPEC_GPP_DEBUG").is_some();
    let wanted: Vec<&str> = SEQUENTIAL_SEEDS
        .iter()
        .map(|&(name, _)| name)
        .filter(|name| seed_wanted(name, cluster))
        .collect();
    // The plans are taken in the order of [`SEQUENTIAL_SEEDS`], as one after another would
    // (DAPPLE's from its thread when it has one: its plan is made whatever the others' are).
    let mut out_of_time = false;
    for name in wanted {
        if best.is_ok() && opts.out_of_time() {
            out_of_time = true;
            break;
        }
        let made_here = made.iter().find(|(n, _)| n == name);
        let threaded = name == "dapple" && made_here.is_none() && dapple.is_some();
        // Skipped by its bound (not DAPPLE on its thread: it is already under way).
        if made_here.is_none() && !threaded && seed_cannot_win(name, g, cluster, opts, best) {
            if debug {
                eprintln!("gpp: seed {name}: skipped, its lower bound exceeds the best plan");
            }
            continue;
        }
        let got = match made_here {
            Some((_, p)) => Ok(p.clone()),
            None => match dapple.take_if(|_| threaded) {
                Some((h, workers)) => {
                    workers.store(usize::MAX, Ordering::Relaxed);
                    h.join()
                        .unwrap_or_else(|_| Err(Error::msg("dapple: the search panicked")))
                }
                None => {
                    let Some(planner) = seed_planner(name) else {
                        continue;
                    };
                    match planner.plan_below(g, cluster, opts, time_to_beat(best)) {
                        Ok(Some(p)) => Ok(p),
                        Ok(None) => {
                            if debug {
                                eprintln!(
                                    "gpp: seed {name}: its plan's bound exceeds the best plan, \
                                     not simulated, at {:.1} ms",
                                    t0.elapsed().as_secs_f64() * 1e3
                                );
                            }
                            continue;
                        }
                        Err(e) => Err(e),
                    }
                }
            },
        };
        if debug {
            match &got {
                Ok(p) => eprintln!(
                    "gpp: seed {name}: {:.6} s ({} stages, micro-batch {}) at {:.1} ms",
                    p.iteration_time_s,
                    p.stages.len(),
                    p.micro_batch.size(),
                    t0.elapsed().as_secs_f64() * 1e3
                ),
                Err(e) => eprintln!("gpp: seed {name}: {e}"),
            }
        }
        keep_faster(best, got);
    }
    // Left out by `--time-limit`: wait for DAPPLE's thread here (its own deadline stops it
    // soon) so that a panic there is its error, not the scope's.
    if let Some((h, workers)) = dapple.take() {
        workers.store(usize::MAX, Ordering::Relaxed);
        let _ = h.join();
    }
    out_of_time
}

/// Whether the seed `name` has a lower bound (`straight`, `dapple`; no search) that already
/// shows it cannot replace `best` ([`cannot_beat`]).
fn seed_cannot_win(
    name: &str,
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    best: &Result<Plan>,
) -> bool {
    match name {
        "straight" => cannot_beat(best, || {
            super::straight::iteration_lower_bound(g, cluster, opts)
        }),
        "dapple" => cannot_beat(best, || {
            super::dapple::iteration_lower_bound(g, cluster, opts)
        }),
        _ => false,
    }
}

/// Whether a plan whose simulated iteration is at least `bound()` cannot replace `best` in
/// [`keep_faster`]: `best` fits in memory and is no slower than the bound.
fn cannot_beat(best: &Result<Plan>, bound: impl FnOnce() -> Result<f64>) -> bool {
    let to_beat = time_to_beat(best);
    to_beat.is_finite() && bound().is_ok_and(|x| x >= to_beat)
}

/// The simulated iteration a plan must beat to replace `best` in [`keep_faster`]: `best`'s when
/// it fits in memory, else none (infinite).
fn time_to_beat(best: &Result<Plan>) -> f64 {
    match best {
        Ok(b) if !b.out_of_memory => b.iteration_time_s,
        _ => f64::INFINITY,
    }
}

/// Keep the faster of `best` and `other` (ties keep `best`). A plan that does not fit in
/// device memory never replaces one that fits, nor an error (GPP's own search refuses plans that
/// do not fit: its error says so).
fn keep_faster(best: &mut Result<Plan>, other: Result<Plan>) {
    let Ok(o) = other else { return };
    let better = match best {
        Ok(b) => o.beats(b),
        Err(_) => !o.out_of_memory,
    };
    if better {
        *best = Ok(o);
    }
}

impl Gpp {
    /// The search on fewer devices: the first `D/2`, `D/4`, ..., 1 devices of the cluster, while
    /// the compute bound of a plan on them ([`ComputeBound`]) is below the best time so far.
    /// Small models on fast, high-latency clusters train fastest on fewer devices than they are
    /// given (the all-reduce and the transfers cost more than the compute they spread), which a
    /// search that must use all `D` devices (constraint C3) cannot return. Returns whether
    /// `--time-limit` cut this short.
    fn fewer_devices(
        &self,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        t0: Instant,
        best: &mut Result<Plan>,
        pool: &ScratchPool,
    ) -> bool {
        let bound_on = ComputeBound::new(g, cluster, opts);
        let mut d = cluster.len() / 2;
        while d >= 1 {
            let bound = bound_on.on(d);
            if let Ok(b) = best {
                if bound >= b.iteration_time_s {
                    // The bound only grows as devices are taken away.
                    break;
                }
                if opts.out_of_time() {
                    return true;
                }
            }
            if let Ok(sub) = cluster.clone().take(d) {
                keep_faster(best, self.search(g, &sub, opts, t0, pool));
            }
            d /= 2;
        }
        false
    }

    /// The search proper on all of `cluster`'s devices (see the module doc).
    fn search(
        &self,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        t0: Instant,
        pool: &ScratchPool,
    ) -> Result<Plan> {
        let cands = Gpp::candidates(opts)?;
        let (_, coarse) = self.coarse_tree(g, cluster);
        let ug = UnitGraph::new(g, &coarse, self.sequential);
        let seq_ug = UnitGraph::new(g, &coarse, true);
        // The searches run on a fixed set of worker threads for the whole call (spawning per
        // wave was a visible share of small searches); a job names its unit graph (linearised
        // or not), micro-batch, ε and bracket, and comes back with its index in the wave.
        let threads = search_threads(cluster.len());
        // The graph and linearised unit graphs have the same units and edges, so a micro-batch
        // size's stage evaluations ([`StageTable`]) go with its job and come back with its
        // result for the next search at that size.
        type Job = (usize, bool, SearchParams, Option<StageTable>);
        type Done = (usize, u64, Result<SearchResult>, Option<StageTable>);
        let jobs = JobQueue::<Job>::default();
        let (res_tx, res_rx) = std::sync::mpsc::channel::<Done>();
        let run_job = |(i, linear, p, tab): Job| -> Done {
            let b = p.micro_batch;
            let which = if linear { &seq_ug } else { &ug };
            let (r, tab) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                search_with(g, which, cluster, p, tab, pool)
            }))
            .unwrap_or_else(|_| {
                let e = format!("gpp: the search at micro-batch {b} panicked");
                (Err(Error::msg(e)), None)
            });
            (i, b, r, tab)
        };
        std::thread::scope(|sc| {
            // `threads − 1` workers; the calling thread works on each wave too (a thread that
            // only waited would cost a wake-up per wave, a visible share of a few-ms search).
            for _ in 1..threads {
                let (res_tx, jobs, run_job) = (res_tx.clone(), &jobs, &run_job);
                sc.spawn(move || {
                    while let Some(job) = jobs.wait() {
                        if res_tx.send(run_job(job)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(res_tx);
            // Close the queue however this thread leaves the scope (a panic too), or the
            // workers would wait for jobs forever.
            let _closer = CloseOnDrop(&jobs);
            let out = {
                let tables = std::cell::RefCell::new(std::collections::BTreeMap::new());
                let run_wave = |linear: bool, wave: &[SearchParams]| {
                    for (i, p) in wave.iter().enumerate() {
                        let tab = tables.borrow_mut().remove(&p.micro_batch);
                        jobs.push((i, linear, p.clone(), tab));
                    }
                    let mut out: Vec<Option<(u64, Result<SearchResult>)>> =
                        (0..wave.len()).map(|_| None).collect();
                    let mut keep = |(i, b, r, tab): Done| {
                        if let Some(t) = tab {
                            tables.borrow_mut().insert(b, t);
                        }
                        out[i] = Some((b, r));
                    };
                    let mut done = 0;
                    // Take jobs while any is queued, then wait for the workers' results.
                    while let Some(job) = jobs.take() {
                        keep(run_job(job));
                        done += 1;
                    }
                    while done < wave.len() {
                        match res_rx.recv() {
                            Ok(d) => keep(d),
                            Err(_) => break,
                        }
                        done += 1;
                    }
                    out.into_iter().flatten().collect()
                };
                self.choose(
                    g, cluster, opts, &cands, &ug, &seq_ug, threads, &run_wave, t0,
                )
            };
            out
        })
    }
}

/// The searches' job queue: the calling thread and the workers take from it.
struct JobQueue<T> {
    /// The jobs, and whether the queue is closed.
    q: std::sync::Mutex<(std::collections::VecDeque<T>, bool)>,
    ready: std::sync::Condvar,
}

impl<T> Default for JobQueue<T> {
    fn default() -> Self {
        JobQueue {
            q: std::sync::Mutex::new((std::collections::VecDeque::new(), false)),
            ready: std::sync::Condvar::new(),
        }
    }
}

impl<T> JobQueue<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, (std::collections::VecDeque<T>, bool)> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn push(&self, job: T) {
        self.lock().0.push_back(job);
        self.ready.notify_one();
    }
    /// A queued job, without waiting.
    fn take(&self) -> Option<T> {
        self.lock().0.pop_front()
    }
    /// The next job; `None` once the queue is closed and empty.
    fn wait(&self) -> Option<T> {
        let mut g = self.lock();
        loop {
            if let Some(j) = g.0.pop_front() {
                return Some(j);
            }
            if g.1 {
                return None;
            }
            g = self.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
    fn close(&self) {
        self.lock().1 = true;
        self.ready.notify_all();
    }
}

/// Closes a [`JobQueue`] when dropped.
struct CloseOnDrop<'q, T>(&'q JobQueue<T>);

impl<T> Drop for CloseOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Runs one wave of searches (on the linearised unit graph or not) and returns each job's
/// micro-batch and result, in job order.
type RunWave<'w> = dyn Fn(bool, &[SearchParams]) -> Vec<(u64, Result<SearchResult>)> + 'w;

impl Gpp {
    /// The search proper (see the module doc): coarse and refined DPs on both unit graphs,
    /// ranking of the candidates by short simulations, the chosen plan simulated in full.
    #[allow(clippy::too_many_arguments)]
    fn choose(
        &self,
        g: &CostGraph,
        cluster: &Cluster,
        opts: &PlanOptions,
        cands: &[u64],
        ug: &UnitGraph,
        seq_ug: &UnitGraph,
        threads: usize,
        run_wave: &RunWave<'_>,
        t0: Instant,
    ) -> Result<Plan> {
        let debug = std::env::var_os("PIPEC_GPP_DEBUG").is_some();
        let phase = |what: &str| {
            if debug {
                eprintln!("gpp: {what} at {:.2} ms", t0.elapsed().as_secs_f64() * 1e3);
            }
        };
        phase("unit graphs");
        // Steps 2–4 of the module doc: strict coarse searches in waves ordered by lower bound
        // (a size whose bound exceeds the shortlist's last coarse estimate is skipped), then the
        // shortlist refined from its coarse bracket with the relaxed targets.
        let params = |b: u64, eps: f64, bracket: Option<(f64, f64)>| SearchParams {
            batch: opts.batch.max(1),
            micro_batch: b,
            devices: cluster.len(),
            optimizer: opts.optimizer,
            allreduce: opts.allreduce,
            eps,
            relax: bracket.is_some(),
            bracket,
            group: opts.schedule.map_or(1, ScheduleKind::group),
            granule: self.granule(cluster.len()),
        };
        let split = |all: Vec<(u64, Result<SearchResult>)>,
                     last_err: &mut Option<Error>|
         -> Vec<(u64, SearchResult)> {
            let mut ok = Vec::new();
            for (b, r) in all {
                match r {
                    Ok(r) => ok.push((b, r)),
                    Err(e) => {
                        if last_err.is_none() {
                            *last_err = Some(e);
                        }
                    }
                }
            }
            ok
        };
        // By estimate; ties by micro-batch size.
        let rank = |v: &mut Vec<(u64, SearchResult)>| {
            v.sort_by(|a, b| {
                a.1.estimate_s
                    .total_cmp(&b.1.estimate_s)
                    .then(a.0.cmp(&b.0))
            })
        };
        const SHORTLIST: usize = 3;
        // Alternative plans per refined search that join the simulated pool.
        const ALTERNATIVES: usize = 3;
        let mut last_err = None;
        let coarse_eps = self.eps.max(5e-2);
        let mut skipped = 0usize;
        // Both unit graphs have the same units and edges: one bound per size, computed on the
        // threads.
        let bounds_by_size: std::collections::BTreeMap<u64, f64> = cands
            .iter()
            .copied()
            .zip(par_map(cands, threads, |&b| {
                Ok(lower_bounds(g, ug, cluster, &params(b, coarse_eps, None)).1)
            })?)
            .collect();
        let refine =
            |linear: bool, cands: &[u64], last_err: &mut Option<Error>, skipped: &mut usize| {
                let mut order: Vec<(u64, f64)> = cands
                    .iter()
                    .map(|&b| (b, bounds_by_size.get(&b).copied().unwrap_or(0.0)))
                    .collect();
                order.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
                if debug {
                    eprintln!("gpp: lower bounds {order:?}");
                }
                let mut results: Vec<(u64, SearchResult)> = Vec::new();
                let mut rest = &order[..];
                while !rest.is_empty() {
                    let cutoff = if results.len() >= SHORTLIST {
                        results[SHORTLIST - 1].1.estimate_s
                    } else {
                        f64::INFINITY
                    };
                    let n = rest
                        .iter()
                        .take(threads)
                        .take_while(|(_, lb)| *lb <= cutoff)
                        .count();
                    if n == 0 {
                        *skipped += rest.len();
                        break;
                    }
                    let (wave, tail) = rest.split_at(n);
                    rest = tail;
                    let jobs: Vec<SearchParams> = wave
                        .iter()
                        .map(|&(b, _)| params(b, coarse_eps, None))
                        .collect();
                    results.extend(split(run_wave(linear, &jobs), last_err));
                    if debug {
                        for (b, r) in &results {
                            eprintln!("gpp:   coarse b={b} est={:.4}", r.estimate_s);
                        }
                    }
                    rank(&mut results);
                }
                if coarse_eps > self.eps && !results.is_empty() {
                    let top: Vec<SearchParams> = results
                        .iter()
                        .take(SHORTLIST)
                        .map(|r| params(r.0, self.eps, Some(r.1.bracket)))
                        .collect();
                    results = split(run_wave(linear, &top), last_err);
                    rank(&mut results);
                }
                results
            };
        let results = refine(self.sequential, cands, &mut last_err, &mut skipped);
        phase("graph DP");
        // The linearised DP runs on the micro-batch sizes the graph DP ranked best (and the
        // extremes), not on every candidate: half the search time for the same pool in practice.
        let mut seq_cands: Vec<u64> = results.iter().take(SHORTLIST).map(|r| r.0).collect();
        seq_cands.extend(cands.first().copied());
        seq_cands.extend(cands.last().copied());
        seq_cands.sort_unstable();
        seq_cands.dedup();
        // SPP is a special case of GPP (§2): the linearised DP's shortlisted plans are
        // candidates too (simulated on their real stage DAG, without the linearisation's false
        // edges). Every refined search also contributes up to `ALTERNATIVES` of its other
        // distinct plans (its optimum's, its relaxed targets'): the estimate is only a model,
        // the simulation decides.
        let mut pool: Vec<(&UnitGraph, u64, SearchResult)> = Vec::new();
        let mut add = |ug, b: u64, r: SearchResult| {
            for (depth, stages, est) in r.alternatives.iter().take(ALTERNATIVES).cloned() {
                let alt = SearchResult {
                    bottleneck_tps: stages.iter().map(|x| x.tps).fold(0.0, f64::max),
                    stages,
                    depth,
                    estimate_s: est,
                    alternatives: Vec::new(),
                    ..r.clone()
                };
                pool.push((ug, b, alt));
            }
            pool.push((ug, b, r));
        };
        for (b, r) in results.into_iter().take(SHORTLIST) {
            add(ug, b, r);
        }
        if !self.sequential {
            for (b, r) in refine(true, &seq_cands, &mut last_err, &mut skipped)
                .into_iter()
                .take(SHORTLIST)
            {
                add(seq_ug, b, r);
            }
        }
        phase(&format!(
            "linearised DP ({skipped} micro-batch sizes skipped by their bound)"
        ));
        if debug {
            for (_, b, r) in &pool {
                eprintln!(
                    "gpp: b={b} units={} runs={} depth={} tps={:.3e} est={:.4} at {:.1} ms",
                    ug.units.len(),
                    r.dp_runs,
                    r.depth,
                    r.bottleneck_tps,
                    r.estimate_s,
                    t0.elapsed().as_secs_f64() * 1e3
                );
            }
        }
        if pool.is_empty() {
            return Err(
                last_err.unwrap_or_else(|| Error::infeasible("gpp", "no candidate micro-batch"))
            );
        }
        let schedule = opts.schedule.unwrap_or(ScheduleKind::Gpp);
        // Rank the pool by (short) simulation; the graph and linearised DPs often return the
        // same stage graph: rank it once.
        let mut cands: Vec<(u64, Vec<StageSpec>, f64)> = Vec::new();
        let mut ests: Vec<f64> = Vec::new();
        let all_specs = par_map(&pool, threads, |(ug, b, r)| {
            Ok(Gpp::specs(g, cluster, ug, r, *b))
        })?;
        for ((_, b, r), specs) in pool.iter().zip(all_specs) {
            if cands.iter().any(|(sb, ss, _)| sb == b && *ss == specs) {
                continue;
            }
            let objective = r.bottleneck_tps * opts.batch.max(1) as f64;
            cands.push((*b, specs, objective));
            ests.push(r.estimate_s);
        }
        // Rank by simulation, best estimate first, `threads` candidates at a time; a candidate
        // whose compute bound ([`compute_bound`]) already exceeds the best time so far cannot
        // win and is not simulated.
        let m = opts.batch.max(1);
        let costed = par_map(&cands, threads, |(b, specs, _)| {
            let sg = stage_graph(g, cluster, opts, specs, *b, schedule, self.sequential);
            let bound = compute_bound(&sg, cluster, opts.allreduce, schedule, (m / b) as usize);
            Ok((sg, bound))
        })?;
        let (graphs, bounds): (Vec<StageGraph>, Vec<f64>) = costed.into_iter().unzip();
        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.sort_by(|&a, &b| ests[a].total_cmp(&ests[b]).then(a.cmp(&b)));
        let mut times: Vec<Option<f64>> = vec![None; cands.len()];
        let mut sims: Vec<Option<SimResult>> = (0..cands.len()).map(|_| None).collect();
        let mut best_so_far = f64::INFINITY;
        let mut pruned = 0usize;
        let mut rest = &order[..];
        while !rest.is_empty() {
            let mut wave = Vec::with_capacity(threads);
            while let Some((&i, tail)) = rest.split_first() {
                if wave.len() == threads {
                    break;
                }
                rest = tail;
                if bounds[i] > best_so_far * (1.0 + 1e-9) {
                    pruned += 1;
                } else {
                    wave.push(i);
                }
            }
            let got = par_map(&wave, threads, |&i| {
                let (t, full) = ranking_time(
                    &graphs[i],
                    cluster,
                    opts,
                    schedule,
                    (m / cands[i].0) as usize,
                )?;
                Ok((t.max(bounds[i]), full))
            })?;
            for (&i, (t, full)) in wave.iter().zip(got) {
                best_so_far = best_so_far.min(t);
                times[i] = Some(t);
                sims[i] = full;
            }
        }
        phase(&format!(
            "ranked {} candidates ({pruned} skipped by their compute bound)",
            cands.len()
        ));
        let mut best: Option<(f64, usize)> = None;
        for (i, t) in times.into_iter().enumerate() {
            let Some(t) = t else { continue };
            if debug {
                eprintln!(
                    "gpp:   candidate b={} est={:.5} ranked={t:.5}",
                    cands[i].0, ests[i]
                );
            }
            if best.is_none_or(|(bt, _)| t < bt * (1.0 - 1e-9)) {
                best = Some((t, i));
            }
        }
        let (ranked_t, i) = best.ok_or_else(|| Error::infeasible("gpp", "no plan"))?;
        let (b, specs, objective) = cands.swap_remove(i);
        // Per-stage sizes are searched on the stage DAG (not on `gpp-seq`'s chain simulation).
        let per_stage_specs =
            (schedule == ScheduleKind::GppPerStage && !self.sequential).then(|| specs.clone());
        // The plan of `specs` from a simulation of its whole iteration.
        let simulated = |specs: Vec<StageSpec>, sim: (&StageGraph, &SimResult)| {
            Plan::from_simulation(
                self.name(),
                g,
                cluster,
                opts,
                specs,
                b,
                schedule,
                objective,
                0.0,
                sim,
            )
        };
        let plan = match &sims[i] {
            // The ranking simulated the whole iteration (of the chain, for `gpp-seq`): the plan's
            // figures are that simulation's.
            Some(res) => simulated(specs, (&graphs[i], res))?,
            None => {
                let mut plan = Plan::assemble(
                    self.name(),
                    g,
                    cluster,
                    opts,
                    specs.clone(),
                    b,
                    schedule,
                    objective,
                    0.0,
                )?;
                if self.sequential {
                    simulate_as_chain(&mut plan, g, cluster, opts, &specs, schedule)?;
                }
                plan
            }
        };
        let mut plan = plan;
        phase(&format!(
            "simulated the plan ({:.6} s; ranking time {ranked_t:.6} s)",
            plan.iteration_time_s
        ));
        if let Some(specs) = per_stage_specs {
            // Per-stage micro-batch sizes and kFkB groups on the chosen stages (behind the
            // flag); kept only when the simulation is faster than the uniform plan.
            if let Some(p) = per_stage::search(g, cluster, opts, &specs, b)? {
                phase("per-stage micro-batch sizes");
                if p.sim.iteration_time_s < plan.iteration_time_s * (1.0 - 1e-9) {
                    plan = simulated(specs, (&p.graph, &p.sim))?;
                }
            }
        }
        plan.search_time_s = t0.elapsed().as_secs_f64();
        Ok(plan)
    }
}
