//! `pipedream`: PipeDream's partitioner (Narayanan et al., "PipeDream: Generalized Pipeline
//! Parallelism for DNN Training", SOSP'19, §3.1), hierarchical as in its
//! `optimizer_graph_hierarchical.py`, on the antichain DAG of the model
//! ([`crate::cost::antichain::Linearization`]).
//!
//! # The DP (paper §3.1, per level of the hierarchy)
//! States are cuts of the model (antichains) in a topological order `0..S`; a stage is the set of
//! layers between two comparable states `k → j`. With `m` workers of the level and bandwidth `B`:
//!
//! - `T(i → j, m) = (1/m) · max(Σ_{l=i..j} T_l, Σ_{l=i..j} W_l^m)` in the paper, with
//!   `W_l^m = 4(m−1)|w_l| / (B·m)` the ring all-reduce of layer `l`'s weights; as implemented in
//!   PipeDream's optimizer the two terms are *added*:
//!   `T(i → j, m) = (C(i→j) + 4·(m−1)·|w_{i→j}| / (B·m)) / m`, where `C` is the stage's
//!   forward + backward time (the previous level's best time for the range on one whole
//!   level-`l−1` group, at levels above the first) and `4(m−1)|w|/(B m)` the all-reduce of its
//!   weights (divided by the previous level's worker count for the replicate-everything case,
//!   exactly as the optimizer does);
//! - `A(j, m) = min( T(0 → j, m), min_{k ∈ anc(j), 1≤m'<m} max(A(k, m − m'), 2·C_k, T(k+1 → j, m')) )`
//!   (paper's recurrence; `2·C_k = 2·a_k / B` is the activation + gradient transfer of the cut,
//!   which the optimizer only counts when an activation compression ratio is given, so it is
//!   off by default: [`PipeDreamOptions::activation_compression`]).
//!
//! The hierarchical version solves the DP for every level, innermost first, and uses level `l`'s
//! `A(i → j, N_l)` for every range `i → j` as the compute time of level `l+1` (the official
//! code's hierarchical optimizer; the paper's §3.1 sketches it). The objective is
//! `A(0 → S−1, N_top)` at the top level: the time of the slowest stage per profiled batch, the
//! optimizer's "Time per stage in pipeline".
//!
//! Conventions kept from the optimizer, so the objective matches it: `Input*` sources are left
//! out of the states and pinned to the first stage; `__getitem__` sinks are dropped (placed with
//! their producer here); at every level below the top, rows `i → j` of the table are filled for
//! every pair of state indices `i ≤ j` of the topological order (the optimizer does not restrict
//! them to comparable states); memory is not constrained unless asked
//! ([`PipeDreamOptions::memory_limit_bytes`], the optimizer's `--use_memory_constraint`, with its
//! stash count `⌈(N − m)/m'⌉` of `(activations + weights)`); `straight_pipeline` forbids
//! replication.
//!
//! Size: the DP costs about `S³/6 · N²/2` steps per lower level, so the number of states is capped
//! by [`PipeDreamOptions::max_work`] ([`states_for_budget`]); a graph whose antichain DAG is
//! larger is planned on its topological chain coarsened to that many positions.
//!
//! Execution: replicated stages take whole micro-batches round robin, PipeDream's 1F1B-RR (§3.3):
//! the default schedule is `1f1b-rr` ([`ScheduleKind::OneFOneBRr`]: replica `k` of a stage with
//! `r` replicas runs micro-batches `m ≡ k (mod r)` at the full micro-batch size), so a stage
//! accepts one micro-batch every `T/r`, the optimizer's stage time. The plan is simulated as the
//! synchronous flush variant (gradients all-reduced after the last backward; no weight
//! stashing) unless `--schedule pipedream-async` asks for PipeDream's own runtime: an update
//! after every micro-batch and weight stashing, whose copies the simulator then holds
//! (`crate::sim::schedule::stashed`, `StageGraph::tied_stash`). Default micro-batch:
//! `M ≥ 4·stages`.

use super::planner::Planner;
use crate::cost::antichain::{pipedream_exclusions, stage_of_nodes, Linearization};
use crate::cost::{Cluster, CostGraph, NodeId};
use crate::plan::{Plan, PlanOptions, StageSpec};
use crate::sim::ScheduleKind;
use pipec_compiler::{Error, Result};
use std::time::Instant;

/// Knobs of PipeDream's optimizer (its command-line flags).
#[derive(Clone, Debug)]
pub struct PipeDreamOptions {
    /// `--straight_pipeline`: no replication (every stage on one worker of its level).
    pub straight_pipeline: bool,
    /// `--use_memory_constraint` with `--memory_size`: bytes per worker.
    pub memory_limit_bytes: Option<f64>,
    /// `--activation_compression_ratio`: when set, the transfer `2·a/(B·m')` of a stage's input
    /// and output cut, divided by this ratio, also bounds the stage time (the paper's `2·C_i`;
    /// `Some(1.0)` is the paper's model without compression).
    pub activation_compression: Option<f64>,
    /// Most antichain states before falling back to a coarsened topological chain.
    pub max_states: usize,
    /// Budget of DP steps ([`dp_work`]); fewer states are used when `max_states` would exceed it
    /// (about 2 s on one core for the default).
    pub max_work: f64,
}

impl Default for PipeDreamOptions {
    fn default() -> Self {
        PipeDreamOptions {
            straight_pipeline: false,
            memory_limit_bytes: None,
            activation_compression: None,
            max_states: 4096,
            max_work: 5e8,
        }
    }
}

/// The `pipedream` planner.
#[derive(Clone, Debug, Default)]
pub struct PipeDream {
    pub options: PipeDreamOptions,
}

/// One level of PipeDream's hierarchy: `machines` workers (groups of the level below) joined at
/// `bandwidth` bytes/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HierLevel {
    pub machines: usize,
    pub bandwidth: f64,
}

/// The hierarchy of a cluster: its levels, or one level of all devices at the slowest bandwidth
/// when the levels do not multiply to the device count (after `--devices`).
pub fn hierarchy(cluster: &Cluster) -> Vec<HierLevel> {
    let prod: usize = cluster.levels.iter().map(|l| l.size).product();
    if prod == cluster.len() {
        cluster
            .levels
            .iter()
            .map(|l| HierLevel {
                machines: l.size,
                bandwidth: l.bandwidth,
            })
            .collect()
    } else {
        vec![HierLevel {
            machines: cluster.len(),
            bandwidth: cluster
                .levels
                .iter()
                .map(|l| l.bandwidth)
                .fold(f64::INFINITY, f64::min),
        }]
    }
}

/// Rough count of inner DP steps for `s` states: every pair `k < j` times `N²/2` worker splits,
/// for one row at the top level and `s + 1` rows at each lower level.
pub fn dp_work(s: usize, levels: &[HierLevel]) -> f64 {
    let s = s as f64;
    levels
        .iter()
        .enumerate()
        .map(|(l, lv)| {
            let rows = if l + 1 == levels.len() { 1.0 } else { s / 3.0 };
            rows * s * s / 2.0 * (lv.machines * lv.machines) as f64 / 2.0
        })
        .sum()
}

/// The most states whose [`dp_work`] fits in `budget` (at least 2).
pub fn states_for_budget(levels: &[HierLevel], budget: f64) -> usize {
    let (mut lo, mut hi) = (2usize, 1usize << 20);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if dp_work(mid, levels) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Back-pointer of a table entry: the last stage starts after state `k` on `used` workers, the
/// rest is entry `(k, prev_m)`; `k == NONE`: the whole range replicated on `used` workers.
#[derive(Clone, Copy, Debug)]
struct Arg {
    k: u32,
    prev_m: u16,
    used: u16,
}

const NONE: u32 = u32::MAX;

/// The per-level DP tables of one run. See the module doc.
pub struct Solver<'a> {
    lin: &'a Linearization,
    opts: &'a PipeDreamOptions,
    levels: Vec<HierLevel>,
    /// Down-set prefix sums per state: compute seconds, activation bytes, parameter bytes.
    c: Vec<f64>,
    act: Vec<f64>,
    par: Vec<f64>,
    /// Output activation bytes of each state's antichain.
    out_act: Vec<f64>,
    /// `ct[l]` (l ≥ 1): level `l`'s compute-time table, `(S+1) × S`, row `i` = range starting
    /// after state `i − 1` (row 0: from the start), NaN where undefined.
    ct: Vec<Vec<f64>>,
    /// `order[l][j]`: the ancestors `k` of state `j` with a defined `C_l(k+1 → j)`, by
    /// increasing `C_l(k+1 → j)`.
    order: Vec<Vec<Vec<u32>>>,
}

/// `(a, b)` range sums over prefix sums `p`: row `i`, column `j` as in the optimizer's tables.
#[inline]
fn range(p: &[f64], i: usize, j: usize) -> f64 {
    if i == 0 {
        p[j]
    } else if j + 1 > i {
        p[j] - p[i - 1]
    } else {
        f64::NAN
    }
}

impl<'a> Solver<'a> {
    /// Set up the tables for `lin` with per-node compute seconds `time`.
    pub fn new(
        g: &CostGraph,
        lin: &'a Linearization,
        levels: Vec<HierLevel>,
        opts: &'a PipeDreamOptions,
        time: impl Fn(NodeId) -> f64,
    ) -> Solver<'a> {
        Solver {
            lin,
            opts,
            levels,
            c: lin.down_sums(&time),
            act: lin.down_sums(|n| g.nodes[n].activation_bytes),
            par: lin.down_sums(|n| g.nodes[n].parameter_bytes),
            out_act: lin.antichain_sums(|n| g.nodes[n].activation_bytes),
            ct: Vec::new(),
            order: Vec::new(),
        }
    }

    fn s(&self) -> usize {
        self.lin.len()
    }

    #[inline]
    fn ct(&self, l: usize, i: usize, j: usize) -> f64 {
        if l == 0 {
            range(&self.c, i, j)
        } else {
            self.ct[l][i * self.s() + j]
        }
    }

    /// Row `i` of level `l`'s table `A[i][j][m]` (flattened `j·N + m`, `m` = workers − 1), with
    /// back-pointers when `args` is given.
    fn row(&self, l: usize, i: usize, mut args: Option<&mut Vec<Arg>>) -> Vec<f64> {
        let s = self.s();
        let HierLevel {
            machines: n,
            bandwidth: bw,
        } = self.levels[l];
        let inner = if l == 0 {
            1.0
        } else {
            self.levels[l - 1].machines as f64
        };
        let mem = self.opts.memory_limit_bytes;
        let straight = self.opts.straight_pipeline;
        let mut a = vec![f64::NAN; s * n];
        if let Some(args) = args.as_deref_mut() {
            args.clear();
            args.resize(
                s * n,
                Arg {
                    k: NONE,
                    prev_m: 0,
                    used: 0,
                },
            );
        }
        // Replicate the whole range i → j on m + 1 workers.
        let max_m = if straight { 1 } else { n };
        for j in i..s {
            let cum = self.ct(l, i, j);
            let (act, par) = (range(&self.act, i, j), range(&self.par, i, j));
            for m in 0..max_m {
                if let Some(limit) = mem {
                    let stash = (n - (m + 1)).div_ceil(m + 1) as f64 * (act + par);
                    if stash > limit {
                        continue;
                    }
                }
                let dp = (4.0 * m as f64 * par) / (bw * (m + 1) as f64) / inner;
                if !cum.is_nan() {
                    a[j * n + m] = (cum + dp) / (m + 1) as f64;
                    if let Some(args) = args.as_deref_mut() {
                        args[j * n + m].used = (m + 1) as u16;
                    }
                }
            }
        }
        // Split off a last stage k+1 → j on m' workers. The optimizer loops m outside j; since
        // every ancestor k of j comes before j, looping j outside m reads the same final entries
        // A(k, ·) and gives the same minima, and lets the last-stage times T(k+1 → j, m') be
        // computed once per (j, k). Candidates that cannot beat the best so far are skipped by
        // exact lower bounds (`max(prev, last) ≥ prev ≥ min_t A(k, t)` and, as every stage k+1 → j
        // has C ≥ 0 and weights ≥ 0, `last ≥ C/m' ≥ C/m`), so the result is the optimizer's.
        let last_j = s.saturating_sub(1);
        // pmin[k·n + t] = min_{t' ≤ t} A(k, t') (∞ for none), for every finished row k.
        let mut pmin = vec![f64::INFINITY; s * n];
        let prefix_min = |a: &[f64], pmin: &mut [f64], k: usize| {
            let mut lo = f64::INFINITY;
            for t in 0..n {
                let v = a[k * n + t];
                if !v.is_nan() && v < lo {
                    lo = v;
                }
                pmin[k * n + t] = lo;
            }
        };
        for k in 0..=i.min(last_j) {
            prefix_min(&a, &mut pmin, k);
        }
        let max_mp = if straight { 1 } else { n - 1 };
        let mut last = vec![0.0f64; n];
        for j in i + 1..s {
            let mut best: Vec<f64> = a[j * n..(j + 1) * n].to_vec();
            for &k in &self.order[l][j] {
                let k = k as usize;
                // A(i, k) is undefined for k < i.
                if k < i {
                    continue;
                }
                let ctl = self.ct(l, k + 1, j);
                // Ancestors come by increasing C(k+1 → j): once no m can gain, none later can.
                if (1..n).all(|m| !best[m].is_nan() && ctl / m as f64 >= best[m]) {
                    break;
                }
                if i > 0 && self.lin.is_ancestor(k, i - 1) {
                    continue;
                }
                let lpar = range(&self.par, k + 1, j);
                let stage_bytes = range(&self.act, k + 1, j) + lpar;
                for (mp, slot) in last.iter_mut().enumerate().take(max_mp + 1).skip(1) {
                    let mpf = mp as f64;
                    let mut t = (ctl + (4.0 * (mpf - 1.0) * lpar) / (bw * mpf)) / mpf;
                    if let Some(r) = self.opts.activation_compression {
                        t = t.max(2.0 * self.out_act[k] / (bw * mpf) / r);
                        if j < last_j {
                            t = t.max(2.0 * self.out_act[j] / (bw * mpf) / r);
                        }
                    }
                    *slot = t;
                }
                for m in 1..n {
                    let b = best[m];
                    if !b.is_nan() && (pmin[k * n + m - 1] >= b || ctl / m as f64 >= b) {
                        continue;
                    }
                    let mut b = b;
                    let mut arg = None;
                    for (mp, &lt) in last.iter().enumerate().take(max_mp.min(m) + 1).skip(1) {
                        let prev = a[k * n + m - mp];
                        // NaN (infeasible) or no better than the best so far: max(prev, ·) ≥ best.
                        if prev.is_nan() || prev >= b || lt >= b {
                            continue;
                        }
                        if let Some(limit) = mem {
                            if stage_bytes * (n - (m + 1)).div_ceil(mp) as f64 > limit {
                                continue;
                            }
                        }
                        b = prev.max(lt);
                        arg = Some(mp);
                    }
                    if let Some(mp) = arg {
                        best[m] = b;
                        if let Some(args) = args.as_deref_mut() {
                            args[j * n + m] = Arg {
                                k: k as u32,
                                prev_m: (m - mp) as u16,
                                used: mp as u16,
                            };
                        }
                    }
                }
            }
            a[j * n + 1..(j + 1) * n].copy_from_slice(&best[1..]);
            prefix_min(&a, &mut pmin, j);
        }
        a
    }

    /// Sort every state's ancestors by the level-`l` time of the stage they would start.
    fn sort_ancestors(&mut self, l: usize) {
        let order = (0..self.s())
            .map(|j| {
                let mut v: Vec<(f64, u32)> = self
                    .lin
                    .ancestors(j)
                    .iter()
                    .map(|&k| (self.ct(l, k as usize + 1, j), k))
                    .filter(|(c, _)| !c.is_nan())
                    .collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                v.into_iter().map(|(_, k)| k).collect()
            })
            .collect();
        self.order.push(order);
    }

    /// Solve every level; returns the objective `A(0 → S−1, N_top)` (NaN when infeasible).
    pub fn solve(&mut self) -> f64 {
        let s = self.s();
        self.ct = vec![Vec::new()];
        self.order.clear();
        let top = self.levels.len() - 1;
        for l in 0..top {
            self.sort_ancestors(l);
            let n = self.levels[l].machines;
            let mut next = vec![f64::NAN; (s + 1) * s];
            for i in 0..=s {
                let a = self.row(l, i, None);
                for j in 0..s {
                    next[i * s + j] = a[j * n + n - 1];
                }
            }
            self.ct.push(next);
        }
        self.sort_ancestors(top);
        let n = self.levels[top].machines;
        let a = self.row(top, 0, None);
        a[(s - 1) * n + n - 1]
    }

    /// The stages of level `l` for states `start..end` (the optimizer's `analyze_partitioning`):
    /// `(first state, end state (exclusive), workers)` per stage, in order.
    fn split(&self, l: usize, start: usize, end: usize) -> Result<Vec<(usize, usize, usize)>> {
        let n = self.levels[l].machines;
        let mut args = Vec::new();
        let a = self.row(l, start, Some(&mut args));
        let (mut j, mut m) = (end - 1, n - 1);
        if a[j * n + m].is_nan() {
            return Err(Error::infeasible(
                "pipedream",
                format!("no feasible partition of states {start}..{end} on {n} workers"),
            ));
        }
        let mut right = end;
        let mut out = Vec::new();
        loop {
            let g = args[j * n + m];
            if g.k == NONE {
                out.push((start, right, g.used as usize));
                break;
            }
            let k = g.k as usize;
            out.push((k + 1, right, g.used as usize));
            right = k + 1;
            j = k;
            m = g.prev_m as usize;
        }
        out.reverse();
        Ok(out)
    }

    /// Expand the solved hierarchy into leaf stages: `(first state, end state, devices)`.
    /// Device ids follow the cluster layout (coordinate 0 fastest).
    pub fn stages(&self) -> Result<Vec<(usize, usize, Vec<usize>)>> {
        let mut out = Vec::new();
        let top = self.levels.len() - 1;
        self.expand(top, 0, self.s(), &[0], &mut out)?;
        Ok(out)
    }

    fn expand(
        &self,
        l: usize,
        start: usize,
        end: usize,
        bases: &[usize],
        out: &mut Vec<(usize, usize, Vec<usize>)>,
    ) -> Result<()> {
        // Devices per worker of level l.
        let group: usize = self.levels[..l].iter().map(|v| v.machines).product();
        let mut at = 0usize;
        for (a, b, r) in self.split(l, start, end)? {
            let sub: Vec<usize> = bases
                .iter()
                .flat_map(|&base| (at..at + r).map(move |q| base + q * group))
                .collect();
            at += r;
            if l == 0 {
                out.push((a, b, sub));
            } else {
                self.expand(l - 1, a, b, &sub, out)?;
            }
        }
        Ok(())
    }
}

impl Planner for PipeDream {
    fn name(&self) -> &'static str {
        "pipedream"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        if g.is_empty() {
            return Err(Error::infeasible("pipedream", "the graph has no node"));
        }
        let batch = opts.batch.max(1) as f64;
        let kind = cluster.kind_of(0);
        let time = |n: NodeId| {
            let (f, b) = g.times(n, batch, kind);
            f + b
        };
        let mut excluded = pipedream_exclusions(g);
        if excluded.iter().all(|&e| e) {
            excluded.iter_mut().for_each(|e| *e = false);
        }
        let levels = hierarchy(cluster);
        // The antichain DAG when its DP fits the budget, else a coarser topological chain.
        let cap = self
            .options
            .max_states
            .min(states_for_budget(&levels, self.options.max_work));
        let lin = Linearization::for_graph(g, &excluded, cap, time);
        let solve = |options: &PipeDreamOptions| {
            let mut solver = Solver::new(g, &lin, levels.clone(), options, time);
            let objective = solver.solve();
            if objective.is_nan() {
                return Err(Error::infeasible(
                    "pipedream",
                    "no feasible partition (memory constraint?)",
                ));
            }
            Ok((objective, solver.stages()?))
        };
        let (mut objective, mut leaves) = solve(&self.options)?;
        // Per-micro-batch updates (`pipedream-async`) need every replica of a stage on each
        // micro-batch: when no micro-batch (the given one, or one the planner may choose) is a
        // multiple of every replica count, the plan is a straight pipeline instead.
        let per_mb_step = opts
            .schedule
            .is_some_and(ScheduleKind::per_micro_batch_step);
        if per_mb_step {
            let turn = leaves
                .iter()
                .map(|(_, _, d)| d.len().max(1) as u64)
                .fold(1, lcm);
            if async_micro_batch(opts, turn, 4 * leaves.len() as u64).is_none() {
                let straight = PipeDreamOptions {
                    straight_pipeline: true,
                    ..self.options.clone()
                };
                (objective, leaves) = solve(&straight).map_err(|_| {
                    Error::infeasible(
                        "pipedream",
                        format!(
                            "--schedule pipedream-async needs a micro-batch that divides the batch and that every stage's replica count divides; the optimizer's plan has none, and no straight pipeline (one device per stage) of this graph fits {} devices",
                            cluster.len()
                        ),
                    )
                })?;
            }
        }
        // Nodes: each stage takes the not yet placed nodes of its end state's down-set.
        let ends: Vec<usize> = leaves.iter().map(|(_, b, _)| b - 1).collect();
        let stage_of = stage_of_nodes(g, &lin, &ends);
        let mut specs: Vec<StageSpec> = leaves
            .into_iter()
            .map(|(_, _, devices)| StageSpec {
                nodes: Vec::new(),
                devices,
            })
            .collect();
        for &u in g.topo_order() {
            specs[stage_of[u]].nodes.push(u);
        }
        // A stage can come out empty when a range adds no node; merge it away.
        specs.retain(|s| !s.nodes.is_empty());
        // Four micro-batches per stage, and under 1F1B-RR (replicas take whole micro-batches in
        // turn) a multiple of every stage's replica count, so no replica idles for want of one.
        let turn = specs.iter().map(|s| s.devices.len() as u64).fold(1, lcm);
        let want = 4 * specs.len() as u64;
        let mb = match per_mb_step {
            true => async_micro_batch(opts, turn, want)
                .unwrap_or_else(|| opts.micro_batch_or(want.div_ceil(turn) * turn)),
            false => opts.micro_batch_or(want.div_ceil(turn) * turn),
        };
        let search = t0.elapsed().as_secs_f64();
        Plan::assemble(
            self.name(),
            g,
            cluster,
            opts,
            specs,
            mb,
            opts.schedule.unwrap_or(ScheduleKind::OneFOneBRr),
            objective,
            search,
        )
    }
}

/// The micro-batch under per-micro-batch updates, where every stage's replicas split each
/// micro-batch: the given one if `turn` (the replica counts' least common multiple) divides
/// it; else the largest divisor of the batch that `turn` divides with at least `want`
/// micro-batches, or failing that the one with the most; `None` when there is none.
fn async_micro_batch(opts: &PlanOptions, turn: u64, want: u64) -> Option<u64> {
    if let Some(mb) = opts.micro_batch() {
        return mb.is_multiple_of(turn).then_some(mb);
    }
    let b = opts.batch.max(1);
    let ok: Vec<u64> = (1..=b)
        .filter(|mb| b.is_multiple_of(*mb) && mb.is_multiple_of(turn))
        .collect();
    ok.iter()
        .rev()
        .find(|&&mb| b / mb >= want)
        .or(ok.first())
        .copied()
}

/// Least common multiple (1 for an overflow, where no micro-batch count could be one).
fn lcm(a: u64, b: u64) -> u64 {
    let gcd = |mut x: u64, mut y: u64| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    (a / gcd(a, b).max(1)).checked_mul(b).unwrap_or(1)
}
