//! `gpp`: GraphPipe's graph pipeline parallelism (Jeon et al., ASPLOS'25), and `gpp-seq`, the
//! same DP on the linearised graph (sequential pipeline parallelism, SPP) for side-by-side
//! comparison on one cost model.
//!
//! Steps:
//! 1. [`crate::sp_decompose::decompose`]: the SP tree of the forward graph (side computations
//!    duplicated, synchronising edges added by cost), then [`SpTree::coarsen`] with
//!    `θ = total work / max(2·D, 32)` so the DP sees about `max(2·D, 32)` units.
//! 2. For each candidate micro-batch size (powers of two dividing the batch with at most 512
//!    micro-batches, or `--micro-batch`), [`crate::partition_gpp::search`] (Algorithm 1) with a
//!    coarse ε = 5·10⁻², on all cores; the two best by estimate are searched again at ε = 10⁻³.
//! 3. The two candidates with the best estimated iteration time
//!    `(M + depth − 1)·max per_mb + sync`, plus (for `gpp`) the two best of the linearised DP
//!    (SPP is a special case of GPP, §2; their stage DAG keeps only real dependencies), are placed
//!    ([`place`]), assembled with the GPP schedule
//!    ([`crate::schedule_gpp`], default `--schedule gpp`) and simulated; the fastest is returned
//!    (the paper sweeps micro-batch sizes the same way, §7 "we sweep over micro-batch sizes").
//!
//! `gpp-seq` plans are simulated as the chain they are (stage `i+1` after stage `i`, see
//! [`simulate_as_chain`]), so the comparison shows the cost of the linearisation's false
//! dependencies as the paper measures it.
//!
//! Objective (`objective_s`): the bottleneck stage's time-per-sample × the batch (Eq. 1 in seconds
//! per iteration).

use super::Planner;
use crate::cost::{Cluster, CostGraph};
use crate::partition_gpp::{search, SearchParams, SearchResult, UnitGraph};
use crate::plan::{Plan, PlanOptions, StageSpec};
use crate::sim::{simulate, ScheduleKind, StageEdge, StageGraph};
use crate::sp_decompose::{assign_side_nodes, decompose, node_work, SpTree};
use pipec_compiler::{Error, Result};
use std::time::Instant;

/// The `gpp` planner (`sequential: true` is `gpp-seq`).
pub struct Gpp {
    pub sequential: bool,
    /// Relative tolerance of the binary search.
    pub eps: f64,
    /// Units per device the coarsening aims at.
    pub units_per_device: f64,
}

impl Default for Gpp {
    fn default() -> Self {
        Gpp {
            sequential: false,
            eps: 1e-3,
            units_per_device: 2.0,
        }
    }
}

impl Gpp {
    /// The sequential (linearised) mode.
    pub fn sequential() -> Gpp {
        Gpp {
            sequential: true,
            ..Gpp::default()
        }
    }

    /// The coarsened unit graph the DP runs on.
    pub fn unit_graph(&self, g: &CostGraph, cluster: &Cluster) -> (SpTree, UnitGraph) {
        let kind = cluster.kind_of(0);
        let sp = decompose(g, kind);
        let w = node_work(g, kind);
        let total: f64 = w.iter().sum();
        let theta = total / (self.units_per_device * cluster.len().max(1) as f64).max(32.0);
        let coarse = sp.coarsen(&w, theta);
        let ug = UnitGraph::new(g, &coarse, self.sequential);
        (sp, ug)
    }

    /// Candidate micro-batch sizes.
    pub fn candidates(opts: &PlanOptions) -> Result<Vec<u64>> {
        if let Some(mb) = opts.micro_batch {
            return Ok(vec![opts.micro_batch_or(1)?]
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
    let sg = StageGraph::from_specs_for(
        g,
        cluster,
        specs,
        plan.micro_batch as f64,
        opts.optimizer,
        schedule,
    );
    let mut edges = sg.edges.clone();
    for i in 1..specs.len() {
        if !edges.iter().any(|e| e.src == i - 1 && e.dst == i) {
            edges.push(StageEdge {
                src: i - 1,
                dst: i,
                bytes: 0.0,
            });
        }
    }
    let sg = StageGraph::new(sg.stages, edges);
    let sched = crate::sim::schedule::generate(&sg, schedule, plan.micro_batches as usize);
    let res = simulate(&sg, &sched, cluster, opts.allreduce)?;
    let t = res.iteration_time_s;
    plan.iteration_time_s = t;
    plan.throughput_samples_per_s = if t > 0.0 { plan.batch as f64 / t } else { 0.0 };
    plan.bubble_fraction = res.bubble_fraction;
    plan.pipeline_depth = sg.depth();
    let mut oom = false;
    for (s, st) in plan.stages.iter_mut().enumerate() {
        st.in_flight = res.stage_in_flight[s];
        let peak = st
            .devices
            .iter()
            .map(|&d| res.devices[d].peak_memory_bytes)
            .fold(0.0, f64::max);
        oom |= st
            .devices
            .iter()
            .any(|&d| res.devices[d].peak_memory_bytes > cluster.kind_of(d).memory_bytes as f64);
        st.peak_memory_bytes = peak.round() as u64;
    }
    plan.peak_memory_bytes = plan
        .stages
        .iter()
        .map(|s| s.peak_memory_bytes)
        .max()
        .unwrap_or(0);
    plan.out_of_memory = oom;
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

fn topo_order(succ: &[Vec<usize>]) -> Vec<usize> {
    let n = succ.len();
    let mut indeg = vec![0usize; n];
    for s in succ {
        for &t in s {
            indeg[t] += 1;
        }
    }
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..n)
        .filter(|&s| indeg[s] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse(s)) = heap.pop() {
        order.push(s);
        for &t in &succ[s] {
            indeg[t] -= 1;
            if indeg[t] == 0 {
                heap.push(std::cmp::Reverse(t));
            }
        }
    }
    order
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

impl Planner for Gpp {
    fn name(&self) -> &'static str {
        if self.sequential {
            "gpp-seq"
        } else {
            "gpp"
        }
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        let cands = Gpp::candidates(opts)?;
        let (_, ug) = self.unit_graph(g, cluster);
        // Coarse search (ε = 1e-2) for every candidate micro-batch, in parallel; then the three
        // best by estimated iteration time are refined at the planner's ε.
        let run_all =
            |ug: &UnitGraph, cands: &[u64], eps: f64| -> Vec<(u64, Result<SearchResult>)> {
                let threads = std::thread::available_parallelism()
                    .map_or(1, |n| n.get())
                    .max(1);
                let chunk = cands.len().div_ceil(threads).max(1);
                std::thread::scope(|sc| {
                    let handles: Vec<_> = cands
                        .chunks(chunk)
                        .map(|part| {
                            sc.spawn(move || {
                                part.iter()
                                    .map(|&b| {
                                        let p = SearchParams {
                                            batch: opts.batch.max(1),
                                            micro_batch: b,
                                            devices: cluster.len(),
                                            optimizer: opts.optimizer,
                                            allreduce: opts.allreduce,
                                            eps,
                                            relax: true,
                                        };
                                        (b, search(g, ug, cluster, p))
                                    })
                                    .collect::<Vec<_>>()
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .flat_map(|h| h.join().unwrap_or_default())
                        .collect()
                })
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
            ok.sort_by(|a, b| a.1.estimate_s.total_cmp(&b.1.estimate_s));
            ok
        };
        let mut last_err = None;
        let coarse_eps = self.eps.max(5e-2);
        let refine = |ug: &UnitGraph, cands: &[u64], last_err: &mut Option<Error>| {
            let mut results = split(run_all(ug, cands, coarse_eps), last_err);
            if coarse_eps > self.eps && !results.is_empty() {
                let top: Vec<u64> = results.iter().take(2).map(|r| r.0).collect();
                results = split(run_all(ug, &top, self.eps), last_err);
            }
            results
        };
        let results = refine(&ug, &cands, &mut last_err);
        // The linearised DP runs on the micro-batch sizes the graph DP ranked best (and the
        // extremes), not on every candidate: half the search time for the same pool in practice.
        let mut seq_cands: Vec<u64> = results.iter().take(2).map(|r| r.0).collect();
        seq_cands.extend(cands.first().copied());
        seq_cands.extend(cands.last().copied());
        seq_cands.sort_unstable();
        seq_cands.dedup();
        // SPP is a special case of GPP (§2): the linearised DP's two best plans are candidates
        // too (simulated on their real stage DAG, without the linearisation's false edges).
        let seq_ug;
        let mut pool: Vec<(&UnitGraph, u64, SearchResult)> = results
            .into_iter()
            .take(2)
            .map(|(b, r)| (&ug, b, r))
            .collect();
        if !self.sequential {
            seq_ug = Gpp::sequential().unit_graph(g, cluster).1;
            for (b, r) in refine(&seq_ug, &seq_cands, &mut last_err)
                .into_iter()
                .take(2)
            {
                pool.push((&seq_ug, b, r));
            }
        }
        let results: Vec<(u64, SearchResult)> =
            pool.iter().map(|(_, b, r)| (*b, r.clone())).collect();
        if std::env::var_os("PIPEC_GPP_DEBUG").is_some() {
            for (b, r) in &results {
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
        if results.is_empty() {
            return Err(last_err.unwrap_or_else(|| Error::msg("gpp: no candidate micro-batch")));
        }
        let schedule = opts.schedule.unwrap_or(ScheduleKind::Gpp);
        let mut best: Option<Plan> = None;
        for (ug, b, r) in &pool {
            let specs = Gpp::specs(g, cluster, ug, r, *b);
            let objective = r.bottleneck_tps * opts.batch.max(1) as f64;
            let mut plan = Plan::assemble(
                self.name(),
                g,
                cluster,
                opts,
                specs.clone(),
                *b,
                schedule,
                objective,
                0.0,
            )?;
            if self.sequential {
                simulate_as_chain(&mut plan, g, cluster, opts, &specs, schedule)?;
            }
            let better = match &best {
                None => true,
                Some(p) => plan.iteration_time_s < p.iteration_time_s * (1.0 - 1e-9),
            };
            if better {
                best = Some(plan);
            }
        }
        let mut plan = best.ok_or_else(|| Error::msg("gpp: no plan"))?;
        plan.search_time_s = t0.elapsed().as_secs_f64();
        Ok(plan)
    }
}
