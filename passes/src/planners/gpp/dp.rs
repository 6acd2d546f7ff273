//! GraphPipe's pipeline stage partitioner, the DP of Algorithm 1 (Jeon et al., ASPLOS'25, §5)
//! over the units' series-parallel tree ([`super::units`]), run by the binary search of
//! [`super::search`].
//!
//! # The DP (Algorithm 1, lines 23–48)
//! A DP state is a subgraph `G` of the tree (a whole tree node, a prefix `c_0..c_j` of a series
//! node's children, a suffix `c_s..` of a parallel node's children), a device count `d`, and the
//! target `t_max`. With the default uniform micro-batch and 1F1B (`k = 1`), the schedule
//! configuration `c = (i, b, k)` that crosses a boundary reduces to the in-flight count `i`, and by
//! Appendix A.1 row 7 every stage adds one micro-batch to its successors' maximum
//! ([`crate::sim::in_flight::compute_in_flight`]). A sub-plan is therefore summarised by
//! `(δ, σ)`: it turns the in-flight count `i_b` of the stage after its sink into `i_f = i_b + δ` at
//! its source, and it fits in memory iff `i_b ≤ σ` (each stage's memory check, `min(i_b + depth, M)`
//! in flight, is a bound on `i_b`). Instead of one memo entry per `i_b` (Algorithm 1's `c_b`),
//! the DP value is the Pareto set of `(δ, σ)` over feasible sub-plans, which answers every `i_b`
//! at once; PICKBETTER (less memory) is "smallest `δ` with `σ ≥ i_b`".
//! - **Base case** (line 28): all of `G` is one stage on `d` replicas; feasible iff
//!   `TPS ≤ t_max`, `(δ, σ) = (1, cap − 1)` with `cap` the most micro-batches in flight that fit
//!   (`σ = ⌊(cap − K)/2⌋` under a uniform kFkB, [`SearchParams::group`]: the sink holds `K` and
//!   each stage edge adds two, Appendix A.1 row 8).
//! - **Series split** (lines 33–40): the last segment `c_k..c_{j−1}` gets `d₂` devices and the
//!   prefix `c_0..c_{k−1}` the other `d − d₂`; the segment is solved first and its `i_m` fixes the
//!   prefix's `c_b`: `δ = δ₁ + δ₂`, `σ = min(σ₂, σ₁ − δ₂)`. A segment of one non-unit child
//!   is that child's own DP state (any `d₂`); a segment of units is a single stage with a
//!   power-of-two replica count (the paper's set 𝒟). (A whole subproblem as one stage — the base
//!   case — takes all its `d` devices, any count.)
//! - **Parallel split** (lines 41–47): the first child gets `d₁`, the remaining children `d − d₁`;
//!   both see the same `c_b`, and the larger in-flight count wins: `δ = max`, `σ = min`.
//!
//! # Stage TPS (ESTIMATETPS)
//! For a stage over node set `G` with `r` replicas at micro-batch `b` (each replica gets `b/r`
//! samples): `per_mb = max(F + B, comm)`, where `F + B` is the summed forward and backward time of
//! a slice and `comm = α + (in + out bytes of the micro-batch)/(β·ports)` (activations out and
//! gradients in share the send channel) with `β, α` of the cluster level the device set spans and
//! `ports` the replicas' own links (`r`) inside one node, or the nodes they span
//! (`⌈r / node size⌉`) when the devices span nodes (the simulator's per-node port contention);
//! `TPS = per_mb / b + (AllReduce(params, r) + step) / B`.
//! Memory: [`crate::cost::memory::stage_memory`] with the stage's in-flight count.
//!

use super::params::{SearchParams, StageChoice};
use super::sp_tree::SpKind;
use super::units::UnitGraph;
use crate::cost::comm::AllReduceGroup;
use crate::cost::memory::step_time;
use crate::cost::{Cluster, CostGraph};

#[derive(Clone, Copy, Debug)]
pub(super) struct StageEval {
    pub(super) tps: f64,
    /// Lower bound of the TPS from compute alone (monotone in the range).
    compute_tps: f64,
    per_mb: f64,
    sync: f64,
    /// Most micro-batches in flight that fit in memory (negative: never fits).
    cap: i64,
    static_bytes: f64,
}

/// The fields of a [`StageEval`] the series split's inner loop reads.
#[derive(Clone, Copy, Debug)]
struct Hot {
    tps: f64,
    compute_tps: f64,
    cap: i64,
}

impl Hot {
    const UNSET: Hot = Hot {
        tps: f64::NAN,
        compute_tps: f64::NAN,
        cap: 0,
    };
}

/// Stage evaluations at one micro-batch size, shared by every search at that size on unit graphs
/// with the same units and unit edges: the graph DP and its linearisation (built from one
/// coarsened tree) and the coarse and refined searches. A stage over `[lo, hi)` on `r` replicas
/// costs the same in all of them; only the DP's tree differs. Pass it from one search to the next
/// with [`super::search::search_with`]; one whose micro-batch, device count or unit graph size differs is
/// replaced by a fresh one.
pub struct StageTable {
    key: (u64, usize, usize, usize),
    /// `time[r][i]`: prefix sums of fwd+bwd seconds of units `0..i` at slice `b/r`.
    time: Vec<Option<Vec<f64>>>,
    /// Boundary bytes per range `lo * (U + 1) + hi` at the reference batch.
    bnd: Vec<f64>,
    /// The series split's hot table: per `(hi * (U + 1) + lo) * P + pi` the stage over
    /// `[lo, hi)` on `pow2[pi]` replicas (NaN `tps`: not evaluated yet). Compact and laid out so
    /// that the split loop (growing segment, fixed `hi`) walks it contiguously.
    hot: Vec<Hot>,
}

impl StageTable {
    fn key(ug: &UnitGraph, p: &SearchParams) -> (u64, usize, usize, usize) {
        (p.micro_batch, p.devices, ug.units.len(), ug.edges.len())
    }

    fn new(ug: &UnitGraph, p: &SearchParams) -> StageTable {
        let d = p.devices;
        let np = (0..).take_while(|&i| (1usize << i) <= d).count();
        let u = ug.units.len();
        StageTable {
            key: StageTable::key(ug, p),
            time: vec![None; d + 1],
            bnd: boundary_table(ug),
            hot: vec![Hot::UNSET; (u + 1) * (u + 1) * np],
        }
    }
}

/// Boundary bytes (reference batch) of every unit range `[lo, hi)`, at `lo * (U + 1) + hi`: the
/// edges with exactly one end in the range. Built incrementally per `lo` (adding unit `hi − 1`
/// makes its edges into the range internal and its other edges crossing), `O(U·(U + E))`.
fn boundary_table(ug: &UnitGraph) -> Vec<f64> {
    let n = ug.units.len();
    let mut adj: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
    for &(a, b, w) in &ug.edges {
        if a < n && b < n {
            adj[a].push((b, w));
            adj[b].push((a, w));
        }
    }
    let mut t = vec![0.0; (n + 1) * (n + 1)];
    for lo in 0..n {
        // The count of crossing edges keeps a range without any exactly at zero.
        let (mut cur, mut crossing) = (0.0, 0usize);
        for hi in lo + 1..=n {
            let u = hi - 1;
            for &(o, w) in &adj[u] {
                if (lo..u).contains(&o) {
                    cur -= w;
                    crossing -= 1;
                } else {
                    cur += w;
                    crossing += 1;
                }
            }
            t[lo * (n + 1) + hi] = if crossing == 0 { 0.0 } else { cur };
        }
    }
    t
}

#[derive(Clone, Copy, Debug)]
enum Back {
    /// The same plan as another state's entry (a parallel node solved as its chain).
    Alias((usize, usize)),
    Single {
        lo: usize,
        hi: usize,
        r: usize,
    },
    Ser {
        seg: (usize, usize),
        pre: (usize, usize),
    },
    /// A single stage over `[lo, hi)` with `r` replicas after the prefix entry `pre`.
    SerSingle {
        lo: usize,
        hi: usize,
        r: usize,
        pre: (usize, usize),
    },
    Par {
        a: (usize, usize),
        b: (usize, usize),
    },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    delta: u32,
    sigma: i64,
    /// In a join's last child `V` (and the join node's suffixes): the in-flight offset of the
    /// stage holding the join unit; 0 elsewhere.
    jo: u32,
    back: Back,
}

const INF: i64 = i64::MAX / 4;

/// A state's base case as [`Search::single`] reads it: the stage's TPS and in-flight cap,
/// valid when `epoch` is the search's.
#[derive(Clone, Copy, Debug, Default)]
struct Base {
    tps: f64,
    cap: i64,
    epoch: u32,
}

/// The DP's per-state buffers (memo, stamps, base cases, series segments), kept from one search
/// to the next through a [`ScratchPool`]. A DP state `(t, j, d)` lives in its tree position's
/// row (one slot per device count), allocated when the search first reaches the position: a
/// search visits ~15% of the positions (2.8 k of 17.9 k rows on a 145-unit graph at 32 devices,
/// where a table of every state would take 30 MB, and fresh tables per search cost more in
/// page faults than the DP). Nothing carries over from one search to the next: rows, stamps
/// and base cases of an older epoch or run read as unset.
#[derive(Default)]
pub struct Scratch {
    /// Per tree position: its row, valid when `row_epoch` is the search's.
    row: Vec<u32>,
    row_epoch: Vec<u32>,
    rows: usize,
    memo: Vec<Vec<Entry>>,
    stamp: Vec<u32>,
    run: u32,
    base: Vec<Base>,
    epoch: u32,
    segs: Vec<Vec<(u32, u32, i64)>>,
    segs_stamp: Vec<u32>,
}

impl Scratch {
    /// Ready for a search over `positions` tree positions (series states); every state reads
    /// as unset to it.
    fn prepare(&mut self, positions: usize) {
        self.row.resize(positions, 0);
        self.row_epoch.resize(positions, 0);
        self.rows = 0;
        self.segs.resize_with(positions, Vec::new);
        self.segs_stamp.resize(positions, 0);
        if self.epoch == u32::MAX {
            self.base.fill(Base::default());
            self.row_epoch.fill(0);
            self.epoch = 0;
        }
        self.epoch += 1;
    }

    /// The first state index of `position`'s row of `slots` states.
    #[inline(always)]
    fn row_of(&mut self, position: usize, slots: usize) -> usize {
        if self.row_epoch[position] == self.epoch {
            return self.row[position] as usize * slots;
        }
        self.new_row(position, slots)
    }

    #[inline(never)]
    fn new_row(&mut self, position: usize, slots: usize) -> usize {
        let r = self.rows;
        self.rows += 1;
        self.row[position] = r as u32;
        self.row_epoch[position] = self.epoch;
        let end = (r + 1) * slots;
        if self.memo.len() < end {
            self.memo.resize_with(end, Vec::new);
            self.stamp.resize(end, 0);
            self.base.resize(end, Base::default());
        }
        r * slots
    }
}

/// Scratch buffers shared by the searches of one planning call (the worker threads take and
/// return them); see [`Scratch`].
#[derive(Default)]
pub struct ScratchPool(std::sync::Mutex<Vec<Scratch>>);

impl ScratchPool {
    pub(super) fn take(&self) -> Scratch {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default()
    }
    pub(super) fn put(&self, s: Scratch) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

/// The search engine for one micro-batch size.
pub struct Search<'a> {
    pub(super) g: &'a CostGraph,
    pub(super) ug: &'a UnitGraph,
    cluster: &'a Cluster,
    pub(super) p: SearchParams,
    m: i64,
    params: Vec<f64>,
    /// Prefix sums over the units of saved bytes per sample and of saved bytes per micro-batch.
    saved: Vec<f64>,
    saved_fixed: Vec<f64>,
    /// Stage evaluations at this micro-batch size (see [`StageTable`]).
    pub(super) tab: StageTable,
    /// All-reduce over the first `r` devices, per `r`.
    ar: Vec<AllReduceGroup>,
    bw: f64,
    alpha: f64,
    multi_node: bool,
    node_size: usize,
    pub(super) mem: f64,
    /// Memo: state index -> Pareto entries, valid when `stamp[id] == run` (the vectors keep
    /// their capacity from one DP run to the next); each DP state's base case (its whole range
    /// as one stage on the state's `d` devices), the same in every DP run; per series state
    /// `(t, j)` (at `state_base[t] + j`): [`Search::segments`], valid when `segs_stamp` is the
    /// current run.
    pub(super) sc: Scratch,
    state_base: Vec<usize>,
    t_max: f64,
    /// The smallest TPS the current run compared against `t_max` and found above it (see
    /// [`Search::run`]): every target in `[t_max, next_t)` makes the same comparisons, so the
    /// same DP run.
    pub(super) next_t: f64,
    pow2: Vec<usize>,
}

impl<'a> Search<'a> {
    pub fn new(
        g: &'a CostGraph,
        ug: &'a UnitGraph,
        cluster: &'a Cluster,
        p: SearchParams,
        tab: Option<StageTable>,
        mut sc: Scratch,
    ) -> Self {
        let tab = match tab {
            Some(t) if t.key == StageTable::key(ug, &p) => t,
            _ => StageTable::new(ug, &p),
        };
        let s = g.scale(1.0);
        let mut params = vec![0.0];
        let mut saved = vec![0.0];
        let mut saved_fixed = vec![0.0];
        for u in &ug.units {
            let pb: f64 = u.iter().map(|&n| g.nodes[n].parameter_bytes).sum();
            let sb: f64 = u.iter().map(|&n| g.nodes[n].saved_bytes).sum::<f64>() * s;
            let sf: f64 = u.iter().map(|&n| g.nodes[n].saved_fixed_bytes).sum();
            params.push(params.last().copied().unwrap_or(0.0) + pb);
            saved.push(saved.last().copied().unwrap_or(0.0) + sb);
            saved_fixed.push(saved_fixed.last().copied().unwrap_or(0.0) + sf);
        }
        let devs: Vec<usize> = (0..p.devices).collect();
        let (bw, alpha) = match cluster.group_span_level(&devs) {
            Some(l) => cluster.path_to_level(l),
            None => cluster.path_to_level(0),
        };
        let multi_node = cluster.group_span_level(&devs).is_some_and(|l| l > 0);
        let mem = (0..cluster.len())
            .map(|d| cluster.kind_of(d).memory_bytes as f64)
            .fold(f64::INFINITY, f64::min);
        let mut state_base = Vec::with_capacity(ug.tree.len());
        let mut total = 0;
        for t in &ug.tree {
            state_base.push(total);
            total += t.children.len() + 1;
        }
        let ar = (0..=p.devices)
            .map(|r| AllReduceGroup::new(cluster, &devs[..r], p.allreduce))
            .collect();
        let mut p = p;
        p.granule = p.granule.max(1);
        let d = p.devices;
        let pow2: Vec<usize> = (0..).map(|i| 1usize << i).take_while(|&x| x <= d).collect();
        sc.prepare(total);
        Search {
            g,
            ug,
            cluster,
            m: (p.batch / p.micro_batch.max(1)) as i64,
            p,
            params,
            saved,
            saved_fixed,
            tab,
            ar,
            bw,
            alpha,
            multi_node,
            node_size: cluster.levels.first().map_or(1, |l| l.size.max(1)),
            mem,
            sc,
            state_base,
            t_max: f64::INFINITY,
            next_t: f64::INFINITY,
            pow2,
        }
    }

    pub(super) fn times(&mut self, r: usize) -> &Vec<f64> {
        let (g, ug, kind) = (self.g, self.ug, self.cluster.kind_of(0));
        let slice = self.p.micro_batch as f64 / r as f64;
        self.tab.time[r].get_or_insert_with(|| {
            let mut v = Vec::with_capacity(ug.units.len() + 1);
            v.push(0.0);
            for u in &ug.units {
                let t: f64 = u
                    .iter()
                    .map(|&n| {
                        let (f, b) = g.times(n, slice, kind);
                        f + b
                    })
                    .sum();
                v.push(v.last().copied().unwrap_or(0.0) + t);
            }
            v
        })
    }

    fn boundary(&self, lo: usize, hi: usize) -> f64 {
        self.tab.bnd[lo * (self.ug.units.len() + 1) + hi]
    }

    /// The stage `[lo, hi)` on `pow2[pi]` replicas, from the hot table.
    fn hot(&mut self, lo: usize, hi: usize, pi: usize) -> Hot {
        let i = (hi * (self.ug.units.len() + 1) + lo) * self.pow2.len() + pi;
        let h = self.tab.hot[i];
        if !h.tps.is_nan() {
            return h;
        }
        let e = self.eval(lo, hi, self.pow2[pi]);
        let h = Hot {
            tps: e.tps,
            compute_tps: e.compute_tps,
            cap: e.cap,
        };
        self.tab.hot[i] = h;
        h
    }

    pub(super) fn eval(&mut self, lo: usize, hi: usize, r: usize) -> StageEval {
        let b = self.p.micro_batch as f64;
        let slice = b / r as f64;
        // When the micro-batch does not divide over the replicas, codegen gives each replica
        // whole micro-batches in turn: one replica's time per micro-batch is then the whole
        // micro-batch's, shared by `r` replicas.
        let compute = if crate::sim::takes_turns(b, r) {
            let t = self.times(1);
            (t[hi] - t[lo]) / r as f64
        } else {
            let t = self.times(r);
            t[hi] - t[lo]
        };
        let s = self.g.scale(slice);
        let bnd = self.boundary(lo, hi) * s;
        // Between nodes, every transfer of a node's replicas shares the node's port: the stage's
        // whole micro-batch crosses `ceil(r / node size)` ports; inside one node each replica has
        // its own links.
        let ports = if self.multi_node {
            r.div_ceil(self.node_size) as f64
        } else {
            r as f64
        };
        let comm = if bnd > 0.0 {
            self.alpha + bnd * r as f64 / ports / self.bw
        } else {
            0.0
        };
        let per_mb = compute.max(comm);
        let params = self.params[hi] - self.params[lo];
        let ar = self.ar[r].time(params);
        let step = step_time(
            params,
            self.cluster.kind_of(0).memory_bandwidth,
            self.p.optimizer,
        );
        let bt = self.p.batch as f64;
        let sync = ar + step;
        let static_bytes = params * (2.0 + self.p.optimizer.state_factor()) + bnd;
        let saved = (self.saved[hi] - self.saved[lo]) * slice
            + (self.saved_fixed[hi] - self.saved_fixed[lo]);
        let cap = if static_bytes > self.mem {
            -1
        } else if saved <= 0.0 {
            INF
        } else {
            ((self.mem - static_bytes) / saved).floor().min(INF as f64) as i64
        };
        StageEval {
            tps: per_mb / b + sync / bt,
            compute_tps: compute / b,
            per_mb,
            sync,
            cap,
            static_bytes,
        }
    }

    /// State `id`'s base case: `[lo, hi)` as one stage on `r` replicas.
    fn single(&mut self, id: usize, lo: usize, hi: usize, r: usize) -> Option<Entry> {
        let epoch = self.sc.epoch;
        let e = match self.sc.base[id] {
            e if e.epoch == epoch => e,
            _ => {
                let e = self.eval(lo, hi, r);
                let e = Base {
                    tps: e.tps,
                    cap: e.cap,
                    epoch,
                };
                self.sc.base[id] = e;
                e
            }
        };
        let sigma = self.sigma_of(e.tps, e.cap)?;
        Some(Entry {
            delta: 1,
            sigma,
            jo: 0,
            back: Back::Single { lo, hi, r },
        })
    }

    /// A single stage's `σ` (the most stages after it on a path to a sink that still fit), or
    /// `None` when it misses the target or never fits.
    ///
    /// A stage with `n` stages after it holds `K + step·n` micro-batches (capped at `M`): with
    /// 1F1B (`K = 1`) Appendix A.1 row 7 adds one per stage edge, `step = 1`, so `σ = cap − 1`;
    /// with kFkB (`K ≥ 2`, same `K` and `b` everywhere) row 8 adds two, so
    /// `σ = ⌊(cap − K) / 2⌋`.
    fn sigma_of(&mut self, tps: f64, cap: i64) -> Option<i64> {
        if tps > self.t_max {
            self.next_t = self.next_t.min(tps);
            return None;
        }
        if cap >= self.m {
            return Some(INF);
        }
        let k = self.p.group.max(1) as i64;
        if cap < k {
            return None;
        }
        Some(if k == 1 { cap - 1 } else { (cap - k) / 2 })
    }

    /// The series node `t`'s candidate last segments `c_k..c_{j−1}` (units only) as one stage:
    /// `(k, pow2 index, σ)` for every segment and power-of-two replica count below the device
    /// count that meets the current target, in the split loop's order (`k` descending, replicas
    /// descending). The same for every device count `d` of the state (which only filters
    /// `r < d`), so it is built once per DP run and taken out of `segs` while in use. The scan
    /// stops at the first `k` where no replica count meets the target on compute alone (a longer
    /// segment only has more compute).
    fn segments(&mut self, t: usize, j: usize) -> Vec<(u32, u32, i64)> {
        let si = self.state_base[t] + j;
        let mut v = std::mem::take(&mut self.sc.segs[si]);
        if self.sc.segs_stamp[si] == self.sc.run {
            return v;
        }
        self.sc.segs_stamp[si] = self.sc.run;
        v.clear();
        let ug = self.ug;
        let kids = &ug.tree[t].children;
        let hi = ug.tree[kids[j - 1]].hi;
        let np = self.pow2.partition_point(|&r| r < self.p.devices);
        // Replica counts below the granule are not device counts of the DP.
        let first_ri = self.pow2.partition_point(|&r| r < self.p.granule);
        let first = if ug.tree[kids[j - 1]].kind == SpKind::Leaf {
            j - 1
        } else {
            j.saturating_sub(2)
        };
        for k in (1..=first).rev() {
            let seg_lo = ug.tree[kids[k]].lo;
            let mut any = false;
            for ri in (first_ri..np).rev() {
                let e = self.hot(seg_lo, hi, ri);
                if e.compute_tps <= self.t_max {
                    any = true;
                } else {
                    // A longer segment on `ri` replicas has at least this compute (prefix
                    // sums), so at least this TPS: the break below skips nothing under it.
                    self.next_t = self.next_t.min(e.compute_tps);
                }
                if let Some(sigma) = self.sigma_of(e.tps, e.cap) {
                    v.push((k as u32, ri as u32, sigma));
                }
            }
            if !any {
                break;
            }
        }
        v
    }

    fn whole(&self, t: usize) -> (usize, usize) {
        let node = &self.ug.tree[t];
        match node.kind {
            SpKind::Leaf => (t, 0),
            SpKind::Series => {
                if node.children.len() == 1 {
                    self.whole(node.children[0])
                } else {
                    (t, node.children.len())
                }
            }
            SpKind::Parallel => {
                if node.children.len() == 1 {
                    self.whole(node.children[0])
                } else {
                    (t, 0)
                }
            }
        }
    }

    fn norm(&self, t: usize, j: usize) -> (usize, usize) {
        let node = &self.ug.tree[t];
        match node.kind {
            SpKind::Series if j == 1 => self.whole(node.children[0]),
            SpKind::Parallel if j + 1 == node.children.len() => {
                self.whole(node.children[node.children.len() - 1])
            }
            _ => (t, j),
        }
    }

    #[inline(always)]
    fn idx(&mut self, t: usize, j: usize, d: usize) -> usize {
        let g = self.p.granule;
        let slots = self.p.devices / g + 1;
        self.sc.row_of(self.state_base[t] + j, slots) + d / g
    }

    /// Solve state (t, j, d) (normalised); returns its index in the memo. A memo hit (most
    /// calls) stays inline; the state itself is solved out of line.
    #[inline(always)]
    fn solve(&mut self, t: usize, j: usize, d: usize) -> usize {
        let (t, j) = self.norm(t, j);
        let id = self.idx(t, j, d);
        if self.sc.stamp[id] == self.sc.run {
            return id;
        }
        self.solve_state(t, j, d, id)
    }

    #[inline(never)]
    fn solve_state(&mut self, t: usize, j: usize, d: usize, id: usize) -> usize {
        let mut out = std::mem::take(&mut self.sc.memo[id]);
        out.clear();
        let ug = self.ug;
        let node = &ug.tree[t];
        let gr = self.p.granule;
        match node.kind {
            SpKind::Leaf => {
                if let Some(e) = self.single(id, node.lo, node.hi, d) {
                    push_pareto(&mut out, e);
                }
            }
            SpKind::Series => {
                let kids = &node.children;
                let lo = self.ug.tree[kids[0]].lo;
                let hi = self.ug.tree[kids[j - 1]].hi;
                let q0 = node.join_at;
                if let Some(mut e) = self.single(id, lo, hi, d) {
                    e.jo = u32::from(q0.is_some_and(|q| q < j));
                    push_pareto(&mut out, e);
                }
                if d >= 2 * gr {
                    let last = j - 1;
                    if self.ug.tree[kids[last]].kind != SpKind::Leaf {
                        // The last child is a subgraph of its own: its DP state on d₂ devices.
                        let (ct, cj) = self.whole(kids[last]);
                        for d2 in (gr..d).step_by(gr) {
                            let s = self.solve(ct, cj, d2);
                            if self.sc.memo[s].is_empty() {
                                continue;
                            }
                            let p = self.solve(t, last, d - d2);
                            self.combine_series(&mut out, s, p, join_rule(q0, last, j));
                        }
                    }
                    // A segment of units as one stage on r (a power of two) replicas.
                    let si = self.state_base[t] + j;
                    let segs = self.segments(t, j);
                    for &(k, ri, se_sigma) in &segs {
                        let (k, r) = (k as usize, self.pow2[ri as usize]);
                        if r >= d {
                            continue;
                        }
                        let seg_lo = self.ug.tree[kids[k]].lo;
                        let jo_rule = join_rule(q0, k, j);
                        let p = self.solve(t, k, d - r);
                        let pre = &self.sc.memo[p];
                        for (pi, pe) in pre.iter().enumerate() {
                            let sigma = se_sigma.min(pe.sigma.saturating_sub(1));
                            if sigma >= 0 {
                                push_pareto(
                                    &mut out,
                                    Entry {
                                        delta: pe.delta + 1,
                                        sigma,
                                        jo: match jo_rule {
                                            JoinAt::Segment => 1,
                                            JoinAt::Prefix => 1 + pe.jo,
                                            JoinAt::None => 0,
                                        },
                                        back: Back::SerSingle {
                                            lo: seg_lo,
                                            hi,
                                            r,
                                            pre: (p, pi),
                                        },
                                    },
                                );
                            }
                        }
                    }
                    self.sc.segs[si] = segs;
                }
            }
            SpKind::Parallel => {
                let kids = &node.children;
                let lo = self.ug.tree[kids[j]].lo;
                let hi = node.hi;
                if let Some(mut e) = self.single(id, lo, hi, d) {
                    e.jo = u32::from(node.join);
                    push_pareto(&mut out, e);
                }
                if let (0, Some(c)) = (j, node.chain) {
                    let (ct, cj) = self.whole(c);
                    let cid = self.solve(ct, cj, d);
                    let es = &self.sc.memo[cid];
                    for (i, e) in es.iter().enumerate() {
                        push_pareto(
                            &mut out,
                            Entry {
                                back: Back::Alias((cid, i)),
                                ..*e
                            },
                        );
                    }
                }
                let (ct, cj) = self.whole(kids[j]);
                for d1 in (gr..d).step_by(gr) {
                    let a = self.solve(ct, cj, d1);
                    if self.sc.memo[a].is_empty() {
                        continue;
                    }
                    let b = self.solve(t, j + 1, d - d1);
                    let (ea, eb) = (&self.sc.memo[a], &self.sc.memo[b]);
                    // In a join node, child j feeds the join's stage (inside the last child).
                    for (ia, x) in ea.iter().enumerate() {
                        for (ib, y) in eb.iter().enumerate() {
                            let shift = if node.join { y.jo.max(1) } else { 0 };
                            let sigma = x.sigma.saturating_sub(shift as i64).min(y.sigma);
                            if sigma >= 0 {
                                push_pareto(
                                    &mut out,
                                    Entry {
                                        delta: (x.delta + shift).max(y.delta),
                                        jo: if node.join { y.jo } else { 0 },
                                        sigma,
                                        back: Back::Par {
                                            a: (a, ia),
                                            b: (b, ib),
                                        },
                                    },
                                );
                            }
                        }
                    }
                }
            }
        }
        self.sc.memo[id] = out;
        self.sc.stamp[id] = self.sc.run;
        id
    }

    fn combine_series(&self, out: &mut Vec<Entry>, s: usize, p: usize, rule: JoinAt) {
        let (es, ep) = (&self.sc.memo[s], &self.sc.memo[p]);
        for (is, x) in es.iter().enumerate() {
            for (ip, y) in ep.iter().enumerate() {
                let sigma = x.sigma.min(y.sigma.saturating_sub(x.delta as i64));
                if sigma >= 0 {
                    push_pareto(
                        out,
                        Entry {
                            delta: x.delta + y.delta,
                            sigma,
                            jo: match rule {
                                JoinAt::Segment => x.jo.max(1),
                                JoinAt::Prefix => x.delta + y.jo,
                                JoinAt::None => 0,
                            },
                            back: Back::Ser {
                                seg: (s, is),
                                pre: (p, ip),
                            },
                        },
                    );
                }
            }
        }
    }
}

/// Where the join unit of a join's last child lies relative to a series split `[0,k) | [k,j)`.
#[derive(Clone, Copy, Debug)]
enum JoinAt {
    Segment,
    Prefix,
    None,
}

fn join_rule(q0: Option<usize>, k: usize, j: usize) -> JoinAt {
    match q0 {
        Some(q) if k <= q && q < j => JoinAt::Segment,
        Some(q) if q < k => JoinAt::Prefix,
        _ => JoinAt::None,
    }
}

/// Insert `e` into a Pareto set on (smaller δ, larger σ, smaller join offset).
fn push_pareto(out: &mut Vec<Entry>, e: Entry) {
    let dominates = |a: &Entry, b: &Entry| a.delta <= b.delta && a.sigma >= b.sigma && a.jo <= b.jo;
    if out.iter().any(|x| dominates(x, &e)) {
        return;
    }
    out.retain(|x| !dominates(&e, x));
    out.push(e);
}

impl Search<'_> {
    /// One DP run at `t_max` (Algorithm 1's SEARCHSTAGEGRAPH): the best top-level entry, if any.
    ///
    /// The run depends on `t_max` only through comparisons of stage TPS (and compute TPS)
    /// values with it; afterwards `next_t` is the smallest compared value above `t_max`. A run
    /// at any `t ∈ [t_max, next_t)` makes every comparison the same way (by induction over the
    /// run's steps, identical until a comparison differs, which needs a compared value in
    /// `(t_max, t]`), so it returns the same result: the binary search uses this to skip
    /// targets that cannot change the outcome.
    pub(super) fn run(&mut self, t_max: f64) -> Option<(u32, Vec<StageChoice>)> {
        self.t_max = t_max;
        self.next_t = f64::INFINITY;
        if self.sc.run == u32::MAX {
            self.sc.stamp.fill(0);
            self.sc.segs_stamp.fill(0);
            self.sc.run = 0;
        }
        self.sc.run += 1;
        let (t, j) = self.whole(self.ug.root);
        let id = self.solve(t, j, self.p.devices);
        let entries = self.sc.memo[id].clone();
        let (ei, best) = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.sigma >= 0)
            .min_by_key(|(_, e)| (e.delta, std::cmp::Reverse(e.sigma)))?;
        let mut stages = Vec::new();
        self.extract((id, ei), &mut stages);
        stages.sort_by_key(|s| s.lo);
        Some((best.delta, stages))
    }

    /// One DP run at `t_max` and its `next_t` (see [`Search::run`]), for tests of the binary
    /// search's jumps.
    #[doc(hidden)]
    pub fn probe(&mut self, t_max: f64) -> (Option<(u32, Vec<StageChoice>)>, f64) {
        let r = self.run(t_max);
        (r, self.next_t)
    }

    fn extract(&mut self, (id, ei): (usize, usize), out: &mut Vec<StageChoice>) {
        let Some(e) = self.sc.memo[id].get(ei).copied() else {
            return;
        };
        match e.back {
            Back::Single { lo, hi, r } => self.push_stage(lo, hi, r, out),
            Back::SerSingle { lo, hi, r, pre } => {
                self.push_stage(lo, hi, r, out);
                self.extract(pre, out);
            }
            Back::Ser { seg, pre } => {
                self.extract(seg, out);
                self.extract(pre, out);
            }
            Back::Par { a, b } => {
                self.extract(a, out);
                self.extract(b, out);
            }
            Back::Alias(x) => self.extract(x, out),
        }
    }

    fn push_stage(&mut self, lo: usize, hi: usize, r: usize, out: &mut Vec<StageChoice>) {
        let e = self.eval(lo, hi, r);
        out.push(StageChoice {
            lo,
            hi,
            replicas: r,
            tps: e.tps,
            per_mb: e.per_mb,
            sync: e.sync,
        });
    }

    /// The largest static footprint of a single unit on all devices (for the memory error).
    pub(super) fn worst_unit(&mut self) -> (usize, f64) {
        let d = self.p.devices;
        (0..self.ug.units.len())
            .map(|u| (u, self.eval(u, u + 1, d).static_bytes))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0))
    }
}
