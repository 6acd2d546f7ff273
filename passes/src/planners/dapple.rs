//! `dapple`: DAPPLE's planner (Fan et al., PPoPP'21, §4; arXiv §IV): a synchronous pipeline of
//! contiguous layer ranges, each stage replicated on a device set (stage-level data parallelism),
//! found by a memoised search that minimises the pipeline latency `L` of Eq. 2.
//!
//! # Latency model (Eq. 1–3)
//! A plan is a list of stages; between two compute stages sits a **communication stage** whose
//! forward time is the activation transfer and whose backward time is the gradient transfer of one
//! micro-batch (split/concat when the replica counts differ, [`redistribute_time`]), with no
//! all-reduce. For stage `s`, `F_s`/`B_s` are the forward/backward seconds of one replica on its
//! `micro_batch / |g_s|` slice and `AR_s = AR(P_s, g_s)` the all-reduce of its parameters over its
//! replicas (0 for one replica). With `M` micro-batches and the pivot stage `Q`:
//!
//! ```text
//! T_w = Σ_{s=0}^{Q} F_s                                              (warm-up)
//! T_s = (M − 1)·(F_Q + B_Q)                                          (steady)
//! T_e = max_{s} ( AR_s + { Σ_{a=s}^{Q} B_a  if s ≤ Q ; −Σ_{a=Q}^{s} B_a  if s > Q } )   (ending)
//! L   = T_w + T_s + T_e                                              (Eq. 2)
//! ```
//!
//! (PPoPP's boundary `s ≤ Q`; the arXiv `s < Q` would give the pivot a `−B_Q` term.) The pivot is
//! found by Algorithm 1 (Eq. 3, [`pivot`]): start from the last stage and move `Q` to an earlier
//! stage `s` whenever `(M−1)(F_s+B_s) > (M−1)(F_Q+B_Q) + Σ_{s<s'<Q}(F_{s'}+B_{s'})`.
//! For one stage `L = M·(F+B) + AR`, the `dp` planner's objective.
//!
//! # Search (Eq. 4–5)
//! `T_PL(j, g)`: the best latency with the layers before cut `j` planned on the device set `g` and
//! the layers after it forming **one last stage replicated on every remaining device**. From the
//! base state (`j = 0`, nothing planned: pure data parallelism) a state is extended by splitting
//! its last stage at a later cut `j'` into a new stage `[j, j')` on `m'` devices, placed by each of
//! the policies of §4.3 ([`place`]: Fresh-First, Append-First, Scatter-First on the hierarchical
//! cluster), and the rest `[j', N)` on the remaining devices; Eq. 2 of the new plan gives
//! `T_PL(j', g + g')`, and each state `(j', g + g')` memoises its best plan (the split points,
//! replica counts and placements to backtrack). The answer is the best state over all (Eq. 4).
//! States are memoised by the device set's class under permutations of interchangeable nodes
//! (at most `C(n + d, d)` classes for `n` nodes of `d` devices, not `(d + 1)^n` sets), and a
//! state or split whose lower bound on `L` (from Algorithm 1, [`Bound`]) exceeds the `TOP`-th
//! best plan so far is not extended. A candidate split whose bound already reaches the best
//! latency of its target state is not costed (a dense per-cut table of the states' latencies
//! answers that without a hash lookup).
//!
//! The bound counts the all-reduces too (`T_e` holds `AR_s` of every stage up to the pivot,
//! [`Bound`]), and before a placement's communication stage is looked up, a lower bound from the
//! cluster's fastest links ([`Links`], [`Bound::through`]) skips the placements (or replica
//! counts, or whole states) where the loop over cuts would break at once: on an LSTM export at 32
//! summit GPUs 98% of the placements, each a hash lookup of two device masks. The searches at the
//! micro-batch sizes share the device-set costs and the prefix sums of equal slices ([`Caches`]).
//!
//! Cost: states × transitions, where a state `(cut, class)` is extended by every replica count
//! of the new stage, up to 3 placements and every later cut (42 M transitions over the seven
//! micro-batch searches of resnet18 on 32 summit GPUs). Past [`TRANSITION_BUDGET`] transitions
//! in one micro-batch's search, only the [`BEAM`] best states of each later cut are extended
//! (the others still count as complete plans), and the plan says `search_capped`: on the bundled
//! models at 8, 16 and 32 GPUs of summit, dgx-h100 and cpu every plan equals the exhaustive
//! search's, in at most 1.3 s of CPU instead of up to 24 s (BENCHMARKS.md). The states of one cut
//! are extended by up to [`MAX_SEARCH_WORKERS`] threads and their candidate splits applied in the
//! sequential order, so the plans are those of one thread ([`run_search`]; a test pins it).
//!
//! Cut candidates ([`cuts`], a [`Cuts`] family): the states of PipeDream's antichain DAG
//! ([`crate::cost::antichain`], when it has at most [`MAX_ANTICHAIN_STATES`]) together with the
//! prefixes of the topological order (every prefix for graphs of at most [`MAX_CUTS`] nodes, else
//! the compute quantiles). A "cut `j`" is a down-set `D(j)`; a split of `[i, N)` at `j` needs
//! `D(i) ⊊ D(j)`, and stages are the differences `D(j) \ D(i)`, so branches and skips of a DAG
//! cross stage boundaries correctly and the communication stage carries every byte leaving
//! `D(j)`. Since the topological prefixes are in the family, the search's optimum is never worse
//! than on the plain topological chain.
//!
//! # Memory
//! A stage is feasible when one replica's parameters, gradients, optimizer state, communication
//! buffers and `K_i` in-flight slices of saved activations fit its device
//! ([`crate::cost::memory::stage_memory`]), with `K_i = min(S − i, M)` (policy A, the smallest
//! warm-up). Adding stages only raises earlier stages' `K_i`, so an infeasible prefix is pruned.
//! If no plan fits, the search is repeated without the memory check (the plan then reports
//! `out_of_memory`).
//!
//! # Re-ranking by simulation (a pipec addition)
//! Eq. 2 ignores the bubbles inside the pivot stage and so flatters deep pipelines. The search
//! keeps the [`TOP`] best complete plans by `L`, one per replica-count shape (8:8, 4:4:8, ...); the planner simulates each (with both warm-up
//! policies), together with pure data parallelism, and emits the fastest in simulation. [`Dapple`]`{ rerank: 1 }` is the paper's
//! planner alone (least `L`). `objective_s` is always Eq. 2 of the emitted plan.
//!
//! # Micro-batch and schedule
//! Default micro-batch: the cost graph's reference (profile) batch when it divides the batch,
//! else the largest giving `M ≥ 8`; the search also runs at `M = 1, 2, 4, ..., 64`
//! ([`micro_batch_candidates`]: counted work pays fixed weight traffic per micro-batch, and every
//! micro-batch pays a gradient accumulation). Schedule: DAPPLE early backward with warm-up policy A
//! (`K_i = min(S−i, M)`) or B (`K_i = min(2(S−i)−1, M)`), or policy A's order with each backward
//! split into input- and weight-gradient passes (zero-bubble ZB-H1, a pipec addition:
//! [`crate::sim::schedule::with_weight_passes`]), whichever the simulator finds faster with the
//! peak memory within the devices (policy A on ties: less memory), unless `--schedule`; then
//! the winner's stages under ZB-H2 (policy B's warm-up with the split backward), kept where
//! faster and within memory.
//!
//! Devices: at most 128 (placements are bit masks). Stage times are costed on device 0's kind
//! (DAPPLE targets homogeneous clusters).
//!
//! Objective: `L` of Eq. 2 for the chosen plan.

use super::planner::Planner;
use crate::cost::antichain::{CutSums, Cuts};
use crate::cost::comm::allreduce_time;
use crate::cost::memory::stage_memory;
use crate::cost::{AllReduceAlgo, Chain, Cluster, CostGraph};
use crate::plan::{Plan, PlanOptions, StageSpec};
use crate::sim::ScheduleKind;
use pipec_compiler::{Error, Result};
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Most prefixes of the topological order the search considers (see the module doc).
pub const MAX_CUTS: usize = 96;

/// Largest antichain DAG whose states are added to the cut candidates (see the module doc).
pub const MAX_ANTICHAIN_STATES: usize = 256;

/// The `dapple` planner. `rerank`: how many of the best plans by Eq. 2 the simulator re-ranks
/// (1 = the paper's planner alone: the plan with the least `L`). `workers`: how many search
/// workers may run now, read at every cut (none: the thread pool's size, [`search_workers`]);
/// the plan does not depend on it ([`run_search`]). GPP keeps it at one while its own search
/// shares the cores with DAPPLE's seed, and lifts it once it waits for that seed.
pub struct Dapple {
    pub rerank: usize,
    pub workers: Option<Arc<AtomicUsize>>,
}

/// One stage of the latency model: compute (with its all-reduce) or communication (`ar = 0`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatStage {
    /// Forward seconds of one micro-batch (slice) on one replica, or the activation transfer.
    pub f: f64,
    /// Backward seconds, or the gradient transfer.
    pub b: f64,
    /// All-reduce seconds of the stage's gradients over its replicas.
    pub ar: f64,
}

/// The pivot stage `Q` of Algorithm 1 (PPoPP'21) / Eq. 3, for `m` micro-batches.
pub fn pivot(st: &[LatStage], m: usize) -> usize {
    if st.is_empty() {
        return 0;
    }
    scan_pivot(|s| st[s].f + st[s].b, st.len() - 1, m.max(1) as f64 - 1.0).0
}

/// Algorithm 1's scan over the stages before `q` (from the back, `c(s) = F_s + B_s`, `mf = M − 1`)
/// with `q` the pivot so far: the pivot and the final `acc = Σ_{0 ≤ s' < Q} c(s')` since the last
/// move.
fn scan_pivot(c: impl Fn(usize) -> f64, q: usize, mf: f64) -> (usize, f64) {
    let mut q = q;
    // acc = Σ_{s < s' < Q} (F_{s'} + B_{s'}) for the current s.
    let mut acc = 0.0;
    for s in (0..q).rev() {
        if mf * c(s) > mf * c(q) + acc {
            q = s;
            acc = 0.0;
        } else {
            acc += c(s);
        }
    }
    (q, acc)
}

/// DAPPLE's latency `L = T_w + T_s + T_e` (Eq. 2) of a stage list for `m` micro-batches, and
/// its pivot `Q`.
pub fn latency(st: &[LatStage], m: usize) -> (f64, usize) {
    if st.is_empty() {
        return (0.0, 0);
    }
    let q = pivot(st, m);
    let tw: f64 = st[..=q].iter().map(|s| s.f).sum();
    let ts = (m.max(1) as f64 - 1.0) * (st[q].f + st[q].b);
    let mut te = f64::NEG_INFINITY;
    let mut acc = 0.0;
    for s in (0..=q).rev() {
        acc += st[s].b;
        te = te.max(st[s].ar + acc);
    }
    let mut acc = st[q].b;
    for x in &st[q + 1..] {
        acc += x.b;
        te = te.max(x.ar - acc);
    }
    (tw + ts + te, q)
}

/// Eq. 2 ([`latency`]) of the plans that extend one prefix of stages by a few more, at a cost
/// independent of the prefix's length: the search costs every split of a state's last stage
/// against the same planned prefix (hundreds of splits per state), and a scan of the whole list
/// per split had been a quarter of its time.
///
/// Algorithm 1 ([`pivot`]) scans from the back; after the appended stages it enters the prefix
/// with a pivot `q` and the running sum `acc`, i.e. a threshold `T = (M−1)·c_q + acc` (`c = F + B`).
/// Its first move inside the prefix is to the latest stage `s` with
/// `key_s = (M−1)·c_s − Σ_{s<i<P} c_i > T`, necessarily a **record** (a key above every later
/// one), found by binary search over the records; from there on the scan no longer depends on the
/// appended stages (`acc` restarts at 0), so its result per record is computed once. `T_w` and
/// `T_e` come from prefix sums of `F` and `B` and prefix/suffix maxima of the all-reduce terms.
/// Equal to [`latency`] up to the rounding of those sums (the unit test bounds it).
pub struct PrefixLatency {
    mf: f64,
    c: Vec<f64>,
    f: Vec<f64>,
    b: Vec<f64>,
    ar: Vec<f64>,
    /// `fsum[k] = Σ_{s<k} F_s`, `bsum[k] = Σ_{s<k} B_s`.
    fsum: Vec<f64>,
    bsum: Vec<f64>,
    /// `up[k] = max_{s<k} (AR_s − bsum[s])` (the `s ≤ Q` terms of `T_e`).
    up: Vec<f64>,
    /// `down[k] = max_{k≤s<P} (AR_s − bsum[s+1])` (the `s > Q` terms of `T_e`).
    down: Vec<f64>,
    /// Algorithm 1's records from the back: `(key_s, s)`, `s` descending, keys ascending.
    records: Vec<(f64, usize)>,
    /// The pivot after the scan moves to each record (`usize::MAX`: not computed yet).
    cont: Vec<usize>,
}

impl PrefixLatency {
    pub fn new(prefix: &[LatStage], m: usize) -> PrefixLatency {
        let p = prefix.len();
        let mf = m.max(1) as f64 - 1.0;
        let c: Vec<f64> = prefix.iter().map(|x| x.f + x.b).collect();
        let mut fsum = Vec::with_capacity(p + 1);
        let mut bsum = Vec::with_capacity(p + 1);
        let mut up = Vec::with_capacity(p + 1);
        let (mut fs, mut bs, mut u) = (0.0, 0.0, f64::NEG_INFINITY);
        for x in prefix {
            fsum.push(fs);
            bsum.push(bs);
            up.push(u);
            u = u.max(x.ar - bs);
            fs += x.f;
            bs += x.b;
        }
        fsum.push(fs);
        bsum.push(bs);
        up.push(u);
        let mut down = vec![f64::NEG_INFINITY; p + 1];
        for s in (0..p).rev() {
            down[s] = down[s + 1].max(prefix[s].ar - bsum[s + 1]);
        }
        let mut records: Vec<(f64, usize)> = Vec::new();
        let mut after = 0.0;
        for s in (0..p).rev() {
            let key = mf * c[s] - after;
            if records.last().is_none_or(|&(k, _)| key > k) {
                records.push((key, s));
            }
            after += c[s];
        }
        PrefixLatency {
            mf,
            f: prefix.iter().map(|x| x.f).collect(),
            b: prefix.iter().map(|x| x.b).collect(),
            ar: prefix.iter().map(|x| x.ar).collect(),
            cont: vec![usize::MAX; records.len()],
            c,
            fsum,
            bsum,
            up,
            down,
            records,
        }
    }

    /// `(L, Q)` of the prefix followed by `tail` (as [`latency`] of the whole list).
    pub fn latency(&mut self, tail: &[LatStage]) -> (f64, usize) {
        let p = self.c.len();
        if tail.is_empty() {
            // Not used by the search; the plain scan.
            let all: Vec<LatStage> = (0..p)
                .map(|s| LatStage {
                    f: self.f[s],
                    b: self.b[s],
                    ar: self.ar[s],
                })
                .collect();
            return latency(&all, self.mf as usize + 1);
        }
        let mf = self.mf;
        // Algorithm 1 over the tail, then into the prefix.
        let (q, acc) = scan_pivot(|s| tail[s].f + tail[s].b, tail.len() - 1, mf);
        let threshold = mf * (tail[q].f + tail[q].b) + acc;
        let r = self.records.partition_point(|&(k, _)| k <= threshold);
        let q = if r < self.records.len() {
            if self.cont[r] == usize::MAX {
                let c = &self.c;
                self.cont[r] = scan_pivot(|s| c[s], self.records[r].1, mf).0;
            }
            self.cont[r]
        } else {
            p + q
        };
        let stage = |s: usize| -> (f64, f64, f64) {
            if s < p {
                (self.f[s], self.b[s], self.ar[s])
            } else {
                let x = tail[s - p];
                (x.f, x.b, x.ar)
            }
        };
        let (fq, bq, _) = stage(q);
        let ts = mf * (fq + bq);
        let n = p + tail.len();
        let (tw, te) = if q < p {
            let tw = self.fsum[q + 1];
            let mut te = (self.bsum[q + 1] + self.up[q + 1]).max(self.bsum[q] + self.down[q + 1]);
            let mut acc = self.bsum[p] - self.bsum[q];
            for x in tail {
                acc += x.b;
                te = te.max(x.ar - acc);
            }
            (tw, te)
        } else {
            let mut tw = self.fsum[p];
            for x in &tail[..=q - p] {
                tw += x.f;
            }
            let mut te = f64::NEG_INFINITY;
            let mut acc = 0.0;
            for x in tail[..=q - p].iter().rev() {
                acc += x.b;
                te = te.max(x.ar + acc);
            }
            te = te.max(acc + self.bsum[p] + self.up[p]);
            let mut acc = bq;
            for s in q + 1..n {
                let (_, b, ar) = stage(s);
                acc += b;
                te = te.max(ar - acc);
            }
            (tw, te)
        };
        (tw + ts + te, q)
    }
}

/// Device placement policy of DAPPLE §4.3 (PPoPP Fig. 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Take devices from fresh (wholly free) nodes first: keeps the stage's all-reduce inside
    /// nodes.
    FreshFirst,
    /// Take devices from nodes already in use first: less fragmentation.
    AppendFirst,
    /// Take devices evenly from every used node that has free devices (every node when all are
    /// fresh): activations stay inside nodes, the all-reduce crosses them.
    ScatterFirst,
}

impl Policy {
    pub const ALL: [Policy; 3] = [
        Policy::FreshFirst,
        Policy::AppendFirst,
        Policy::ScatterFirst,
    ];
}

/// `D(free, n)`: `n` devices from the free set `free` (bit `d` set = device `d` free) by `policy`,
/// as a bit mask; `None` when fewer than `n` are free. Nodes are the cluster's level-0 groups.
pub fn place(cluster: &Cluster, free: u128, n: usize, policy: Policy) -> Option<u128> {
    place_in(&Symmetry::new(cluster).nodes, free, n, policy)
}

fn devices_of(mask: u128) -> Vec<usize> {
    (0..128).filter(|&d| mask >> d & 1 == 1).collect()
}

/// One compute stage of a search state: chain positions `[start, end)` on the devices `mask`.
#[derive(Clone, Debug)]
struct PlannedStage {
    start: usize,
    end: usize,
    mask: u128,
}

/// A memoised state: the planned prefix, its latency-model stages (compute and communication, the
/// prefix only) and the latency of the whole plan with the rest as one stage.
#[derive(Clone, Debug)]
struct State {
    /// The devices of the planned stages.
    used: u128,
    stages: Vec<PlannedStage>,
    lat: Vec<LatStage>,
    latency: f64,
    /// Whether the last (rest) stage fits too, i.e. this state is a complete feasible plan.
    complete_ok: bool,
}

/// A plan as `(start position, end position, devices)` per stage over a [`Cuts`] family: the stage
/// is `D(end) \ D(start)`.
pub type StagePlan = Vec<(usize, usize, Vec<usize>)>;

/// What the search found (for tests and the notes).
#[derive(Clone, Debug)]
pub struct Search {
    /// `(start position, end position, devices)` per stage, over [`Search::cuts`].
    pub stages: StagePlan,
    /// The cut candidates the positions refer to ([`cuts`]).
    pub cuts: Cuts,
    /// Eq. 2 of the plan.
    pub latency: f64,
    /// Pivot stage among the latency-model stages (compute and communication, interleaved).
    pub pivot: usize,
    pub micro_batch: u64,
    pub micro_batches: u64,
    /// States memoised.
    pub states: usize,
    /// Whether the plan passed the memory check.
    pub fits: bool,
    /// The best complete plans by Eq. 2 (at most [`TOP`]), best first: `(stages, L)`.
    pub candidates: Vec<(StagePlan, f64)>,
    /// The search passed its [`TRANSITION_BUDGET`] and extended only [`BEAM`] states per cut.
    pub capped: bool,
}

/// How many of the best complete plans the search keeps (for re-ranking by simulation).
pub const TOP: usize = 32;

/// How many of each micro-batch size's best plans by Eq. 2 the simulator re-ranks besides the
/// [`TOP`] best over all sizes.
pub const PER_MICRO_BATCH: usize = 4;

struct Ctx<'a> {
    cluster: &'a Cluster,
    opts: &'a PlanOptions,
    /// `chains[r]`: prefix sums at the slice `micro_batch / r` (index 0: the whole micro-batch).
    chains: Vec<Arc<CutSums>>,
    /// Whole-micro-batch sums (cut bytes for communication stages).
    whole: Arc<CutSums>,
    family: &'a Cuts,
    m: usize,
    mem_check: bool,
    /// The micro-batch every stage's replica count must divide (a stage whose replicas would
    /// take micro-batches in turn is infeasible): under per-micro-batch updates
    /// (`pipedream-async`), where each micro-batch's update needs all of a stage's replicas.
    divides: Option<u64>,
    /// [`sublinear`] at this micro-batch.
    sublinear: bool,
    /// Plans with a larger `L` are not wanted (the search prunes by it).
    bound: f64,
    /// [`Dapple::workers`].
    workers: Option<&'a AtomicUsize>,
}

/// What the searches at every micro-batch size share: costs of device sets that do not depend on
/// the micro-batch, one memo per search worker ([`run_search`]), and the prefix sums of each
/// slice.
#[derive(Default)]
struct Caches {
    /// `workers[w]`: worker `w`'s memo and buffers (worker 0 is the calling thread).
    workers: Vec<Worker>,
    /// Prefix sums by slice (`f64` bits): the slices `micro_batch / r` of the micro-batch sizes
    /// tried coincide often (`256 / 4 = 128 / 2`).
    sums: HashMap<u64, Arc<CutSums>>,
    /// [`Dapple::workers`].
    cap: Option<Arc<AtomicUsize>>,
}

/// One worker's memo of device-set costs: the all-reduce lines of a set, the communication cost
/// between two (pure functions of the sets: which worker computed a cost never changes it).
#[derive(Default)]
struct Costs {
    ar: HashMap<u128, (Affine, Affine)>,
    /// By sending set, then receiving set: the search asks for many receiving sets of one
    /// sending set in a row (a state's placements of its next stage), which then share a small
    /// table (a third of DAPPLE's time went to cache misses in one table of every pair).
    comm: HashMap<u128, HashMap<u128, Arc<CommCost>>>,
}

/// One search worker's state, kept from cut to cut and search to search: its memo and the
/// buffers of its expansions (fresh ones every cut cost their pages again: a fifth of the time
/// of a search in GPP's seed thread went to zeroing them).
#[derive(Default)]
struct Worker {
    costs: Costs,
    /// The last cut's expansion ([`Cut::expand`]).
    out: Expansion,
    /// The worker's own view of target latencies, `view[cut][class]` ([`Cut::expand`]).
    view: Vec<Vec<f64>>,
}

/// `t(bytes) = c + s·bytes` for `bytes > 0`, 0 otherwise.
#[derive(Clone, Copy, Debug, Default)]
struct Affine {
    c: f64,
    s: f64,
}

impl Affine {
    fn at(self, bytes: f64) -> f64 {
        if bytes > 0.0 {
            self.c + self.s * bytes
        } else {
            0.0
        }
    }
    /// Fit an affine cost from two evaluations (the α-β costs are affine in the bytes).
    fn fit(f: impl Fn(f64) -> f64) -> Affine {
        let (x1, x2) = (1e6, 2e6);
        let (y1, y2) = (f(x1), f(x2));
        let s = (y2 - y1) / (x2 - x1);
        Affine { c: y1 - s * x1, s }
    }
}

/// Communication stage cost between two device sets: the max over the devices' affine costs
/// (each device sends or receives its split/concat pieces one after another).
#[derive(Clone, Debug)]
struct CommCost(Vec<Affine>);

impl CommCost {
    fn at(&self, bytes: f64) -> f64 {
        if bytes <= 0.0 {
            return 0.0;
        }
        self.0.iter().map(|a| a.at(bytes)).fold(0.0, f64::max)
    }
}

impl Ctx<'_> {
    /// All-reduce cost of the device set `mask` (ring and hierarchical lines, per `--allreduce`).
    fn ar(&self, costs: &mut Costs, mask: u128, bytes: f64) -> f64 {
        if mask.count_ones() <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let lines = self.ar_lines(costs, mask);
        self.ar_at(lines, bytes)
    }

    fn ar_at(&self, (ring, hier): (Affine, Affine), bytes: f64) -> f64 {
        match self.opts.allreduce {
            AllReduceAlgo::Ring => ring.at(bytes),
            AllReduceAlgo::Hierarchical => hier.at(bytes),
            AllReduceAlgo::Auto => ring.at(bytes).min(hier.at(bytes)),
        }
    }

    /// The ring and hierarchical all-reduce lines of the device set `mask` (zero for one device).
    fn ar_lines(&self, costs: &mut Costs, mask: u128) -> (Affine, Affine) {
        if mask.count_ones() <= 1 {
            return (Affine::default(), Affine::default());
        }
        let cluster = self.cluster;
        *costs.ar.entry(mask).or_insert_with(|| {
            let devs = devices_of(mask);
            (
                Affine::fit(|b| allreduce_time(cluster, &devs, b, AllReduceAlgo::Ring)),
                Affine::fit(|b| allreduce_time(cluster, &devs, b, AllReduceAlgo::Hierarchical)),
            )
        })
    }

    /// [`Ctx::compute_stage`] with the all-reduce lines already looked up.
    fn compute_stage_with(
        &self,
        i: usize,
        j: usize,
        r: usize,
        lines: (Affine, Affine),
    ) -> LatStage {
        let ch = &self.chains[r];
        LatStage {
            f: ch.fwd[j] - ch.fwd[i],
            b: ch.bwd[j] - ch.bwd[i],
            ar: self.ar_at(lines, ch.parameter_bytes(i, j)),
        }
    }

    fn compute_stage(&self, costs: &mut Costs, i: usize, j: usize, mask: u128) -> LatStage {
        let r = mask.count_ones() as usize;
        let ch = &self.chains[r];
        let (f, b) = (ch.fwd[j] - ch.fwd[i], ch.bwd[j] - ch.bwd[i]);
        let p = ch.parameter_bytes(i, j);
        LatStage {
            f,
            b,
            ar: self.ar(costs, mask, p),
        }
    }

    /// The cost of moving one tensor from stage devices `a` to `b` ([`crate::cost::comm::redistribute_time`]).
    fn comm_cost(&self, costs: &mut Costs, a: u128, b: u128) -> Arc<CommCost> {
        let cluster = self.cluster;
        costs
            .comm
            .entry(a)
            .or_default()
            .entry(b)
            .or_insert_with(|| {
                let (da, db) = (devices_of(a), devices_of(b));
                let mut per_dev: Vec<Affine> = vec![Affine::default(); da.len() + db.len()];
                for (i, j, frac) in crate::cost::comm::redistribute(da.len(), db.len(), 1.0) {
                    let lat = cluster
                        .path(da[i], db[j])
                        .map_or((f64::INFINITY, 0.0), |p| p);
                    let (bw, alpha) = lat;
                    for k in [i, da.len() + j] {
                        if bw.is_finite() {
                            per_dev[k].c += alpha;
                            per_dev[k].s += frac / bw;
                        }
                    }
                }
                // Only the upper envelope matters: a line below another in both intercept and
                // slope never gives the max for positive bytes (exactly so in floating point:
                // `c + s·x` is monotone in `c` and `s`): fewer lines for [`CommCost::at`] to
                // evaluate per costed split.
                let mut lines: Vec<Affine> = Vec::with_capacity(2);
                for a in per_dev {
                    if lines.iter().any(|l| l.c >= a.c && l.s >= a.s) {
                        continue;
                    }
                    lines.retain(|l| !(a.c >= l.c && a.s >= l.s));
                    lines.push(a);
                }
                Arc::new(CommCost(lines))
            })
            .clone()
    }

    fn comm_stage(&self, costs: &mut Costs, at: usize, a: u128, b: u128) -> LatStage {
        let t = self.comm_cost(costs, a, b).at(self.whole.cut[at]);
        LatStage {
            f: t,
            b: t,
            ar: 0.0,
        }
    }

    /// The memory of the smallest device of `mask` (the cap [`Ctx::fits_cap`] checks against).
    fn cap(&self, mask: u128) -> f64 {
        (0..self.cluster.len())
            .filter(|&d| mask >> d & 1 == 1)
            .map(|d| self.cluster.kind_of(d).memory_bytes)
            .min()
            .unwrap_or(0) as f64
    }

    /// Memory check of stage `idx` of `n` compute stages (policy-A warm-up).
    fn fits(&self, st: &PlannedStage, idx: usize, n: usize) -> bool {
        self.divisible(st.mask) && (!self.mem_check || self.fits_cap(st, idx, n, self.cap(st.mask)))
    }

    /// Whether the replicas on `mask` split the micro-batch evenly where they must
    /// ([`Ctx::divides`]): they do not take it in turns ([`crate::sim::takes_turns`]).
    fn divisible(&self, mask: u128) -> bool {
        self.divides
            .is_none_or(|mb| !crate::sim::takes_turns(mb as f64, mask.count_ones() as usize))
    }

    /// [`Ctx::fits`] with the stage's devices' memory `cap` ([`Ctx::cap`]) already looked up.
    fn fits_cap(&self, st: &PlannedStage, idx: usize, n: usize, cap: f64) -> bool {
        if !self.divisible(st.mask) {
            return false;
        }
        if !self.mem_check {
            return true;
        }
        let r = st.mask.count_ones() as usize;
        let ch = &self.chains[r];
        let k = ScheduleKind::DappleA.warmup(n - idx, self.m);
        let mem = stage_memory(
            ch.parameter_bytes(st.start, st.end),
            ch.saved_bytes(st.start, st.end),
            k,
            ch.cut[st.start] + ch.cut[st.end],
            self.opts.optimizer,
        );
        mem.total() <= cap
    }
}

/// The cut candidates of `g` (see the module doc): antichain-DAG states and topological prefixes
/// (compute quantiles at the reference batch on device 0's kind when `g` has more than
/// [`MAX_CUTS`] nodes).
pub fn cuts(g: &CostGraph, cluster: &Cluster) -> Cuts {
    let ch = g.chain(g.reference_batch, cluster.kind_of(0));
    Cuts::new(g, &candidate_cuts(&ch), MAX_ANTICHAIN_STATES)
}

/// Run DAPPLE's search (see the module doc) at micro-batch `mb`.
pub fn search(g: &CostGraph, cluster: &Cluster, opts: &PlanOptions, mb: u64) -> Result<Search> {
    let family = cuts(g, cluster);
    search_with(g, cluster, opts, mb, &family)
}

/// [`search`] over a given cut family.
pub fn search_with(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    mb: u64,
    family: &Cuts,
) -> Result<Search> {
    let mut caches = Caches::default();
    let found = search_bounded(g, cluster, opts, mb, family, f64::INFINITY, &mut caches)?;
    let (stages, latency) = found
        .candidates
        .first()
        .cloned()
        .ok_or_else(|| Error::infeasible("dapple", "no plan found"))?;
    Ok(Search {
        stages,
        latency,
        pivot: found.pivot,
        micro_batch: mb,
        micro_batches: found.m as u64,
        states: found.states,
        fits: found.fits,
        candidates: found.candidates,
        capped: found.capped,
        cuts: family.clone(),
    })
}

/// What [`search_bounded`] found.
struct Found {
    candidates: Vec<(StagePlan, f64)>,
    pivot: usize,
    m: usize,
    states: usize,
    fits: bool,
    /// The search stopped extending states at `--time-limit`.
    time_limited: bool,
    /// The search passed its [`TRANSITION_BUDGET`] and extended only [`BEAM`] states per cut.
    capped: bool,
}

/// [`search_with`], leaving out every plan whose `L` exceeds `bound` (the candidates may then be
/// empty).
fn search_bounded(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    mb: u64,
    family: &Cuts,
    bound: f64,
    caches: &mut Caches,
) -> Result<Found> {
    let ndev = cluster.len();
    if ndev > 128 {
        return Err(Error::infeasible(
            "dapple",
            format!("at most 128 devices supported, cluster has {ndev}"),
        ));
    }
    if g.is_empty() {
        return Err(Error::infeasible("dapple", "the graph has no node"));
    }
    let batch = opts.batch.max(1);
    let m = (batch / mb.max(1)).max(1) as usize;
    let kind = cluster.kind_of(0);
    let mut sums = |slice: f64| {
        caches
            .sums
            .entry(slice.to_bits())
            .or_insert_with(|| Arc::new(family.sums(g, slice, kind)))
            .clone()
    };
    let chains: Vec<_> = std::iter::once(sums(mb as f64))
        .chain((1..=ndev).map(|r| sums(mb as f64 / r as f64)))
        .collect();
    let whole = chains[1].clone();
    let n = whole.len();
    let mut ctx = Ctx {
        cluster,
        opts,
        chains,
        whole,
        family,
        m,
        mem_check: true,
        divides: opts
            .schedule
            .is_some_and(ScheduleKind::per_micro_batch_step)
            .then_some(mb),
        sublinear: sublinear(g, kind, mb as f64, ndev),
        bound,
        workers: caches.cap.as_deref(),
    };
    let workers = search_workers();
    if caches.workers.len() < workers {
        caches.workers.resize_with(workers, Worker::default);
    }
    let mut found = run_search(&ctx, &mut caches.workers);
    let mut fits = true;
    // No feasible plan at all (not merely none under the bound): repeat without the check.
    if found.top.is_empty() && !found.any_pruned {
        ctx.mem_check = false;
        fits = false;
        found = run_search(&ctx, &mut caches.workers);
    }
    let Searched {
        top,
        states,
        out_of_time: time_limited,
        capped,
        ..
    } = found;
    let all: u128 = if ndev == 128 {
        u128::MAX
    } else {
        (1u128 << ndev) - 1
    };
    let mut candidates = Vec::with_capacity(top.len());
    let mut pivot_of_best = 0;
    for (x, st) in top.iter().enumerate() {
        let mut stages: StagePlan = st
            .stages
            .iter()
            .map(|s| (s.start, s.end, devices_of(s.mask)))
            .collect();
        let used: u128 = st.stages.iter().fold(0, |a, s| a | s.mask);
        let rest = all & !used;
        let last_start = st.stages.last().map_or(0, |s| s.end);
        stages.push((last_start, n, devices_of(rest)));
        // Eq. 2 of the full plan (and its pivot).
        let mut lat = st.lat.clone();
        if let Some(prev) = st.stages.last() {
            lat.push(ctx.comm_stage(&mut caches.workers[0].costs, last_start, prev.mask, rest));
        }
        lat.push(ctx.compute_stage(&mut caches.workers[0].costs, last_start, n, rest));
        let (l, q) = latency(&lat, m);
        if x == 0 {
            pivot_of_best = q;
        }
        candidates.push((stages, l));
    }
    Ok(Found {
        candidates,
        pivot: pivot_of_best,
        m,
        states,
        fits,
        time_limited,
        capped,
    })
}

/// Eq. 2 for a given plan: `stages` as `(start, end, devices)` over the cut family `family`
/// ([`cuts`]), at micro-batch `mb`. Returns `L` and the pivot (over compute and communication
/// stages).
pub fn evaluate(
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    mb: u64,
    family: &Cuts,
    stages: &[(usize, usize, Vec<usize>)],
) -> (f64, usize) {
    let kind = cluster.kind_of(0);
    let m = (opts.batch.max(1) / mb.max(1)).max(1) as usize;
    let whole = family.sums(g, mb as f64, kind);
    let mut lat = Vec::new();
    for (x, (i, j, devs)) in stages.iter().enumerate() {
        let r = devs.len().max(1);
        let ch = family.sums(g, mb as f64 / r as f64, kind);
        if x > 0 {
            let prev = &stages[x - 1].2;
            let t = crate::cost::comm::redistribute_time(cluster, prev, devs, whole.cut[*i]);
            lat.push(LatStage {
                f: t,
                b: t,
                ar: 0.0,
            });
        }
        let p = ch.parameter_bytes(*i, *j);
        let ar = if devs.len() > 1 {
            allreduce_time(cluster, devs, p, opts.allreduce)
        } else {
            0.0
        };
        lat.push(LatStage {
            f: ch.fwd[*j] - ch.fwd[*i],
            b: ch.bwd[*j] - ch.bwd[*i],
            ar,
        });
    }
    latency(&lat, m)
}

/// Cut positions `0 = c_0 < c_1 < ... < c_k = n`: every position when `n ≤ MAX_CUTS`, else the
/// compute quantiles.
fn candidate_cuts(ch: &Chain) -> Vec<usize> {
    let n = ch.len();
    if n <= MAX_CUTS {
        return (0..=n).collect();
    }
    let total = ch.compute(0, n).max(f64::MIN_POSITIVE);
    let mut cuts = vec![0usize];
    let mut p = 0usize;
    for k in 1..MAX_CUTS {
        let target = total * k as f64 / MAX_CUTS as f64;
        while p < n && ch.compute(0, p) < target {
            p += 1;
        }
        if p > *cuts.last().unwrap_or(&0) && p < n {
            cuts.push(p);
        }
    }
    cuts.push(n);
    cuts
}

/// The costs of splitting a state's rest into a new stage on `gm` and the rest on `rest`.
struct Split {
    out_cost: Arc<CommCost>,
    l_rest: (Affine, Affine),
    /// Class of the devices used after the split.
    key: u32,
    cap_new: f64,
    cap_rest: f64,
}

/// [`place`] on the nodes' device masks (`nodes[k].0`, in node order), without allocating.
fn place_in(nodes: &[(u128, u16)], free: u128, n: usize, policy: Policy) -> Option<u128> {
    if n == 0 || (free.count_ones() as usize) < n {
        return None;
    }
    let used = |m: u128| m & !free != 0;
    let mut mask = 0u128;
    let mut got = 0usize;
    // Lowest free devices of the nodes `pick` selects, node by node.
    let take = |pick: &dyn Fn(u128) -> bool, mask: &mut u128, got: &mut usize| {
        for &(m, _) in nodes {
            let mut f = m & free & !*mask;
            if f == 0 || !pick(m) {
                continue;
            }
            while f != 0 && *got < n {
                let d = f & f.wrapping_neg();
                *mask |= d;
                f &= !d;
                *got += 1;
            }
        }
    };
    match policy {
        Policy::FreshFirst => {
            take(&|m| !used(m), &mut mask, &mut got);
            take(&|m| used(m), &mut mask, &mut got);
        }
        Policy::AppendFirst => {
            take(&|m| used(m), &mut mask, &mut got);
            take(&|m| !used(m), &mut mask, &mut got);
        }
        Policy::ScatterFirst => {
            // Round-robin over the used nodes (all nodes when none is used), then the rest.
            let any_used = nodes.iter().any(|&(m, _)| used(m) && m & free != 0);
            let groups: [Option<bool>; 2] = if any_used {
                [Some(true), Some(false)]
            } else {
                [Some(false), None]
            };
            for grp in groups.into_iter().flatten() {
                loop {
                    let mut progressed = false;
                    for &(m, _) in nodes {
                        if got == n {
                            break;
                        }
                        let f = m & free & !mask;
                        if f != 0 && used(m) == grp {
                            mask |= f & f.wrapping_neg();
                            got += 1;
                            progressed = true;
                        }
                    }
                    if got == n || !progressed {
                        break;
                    }
                }
                if got == n {
                    break;
                }
            }
        }
    }
    (mask.count_ones() as usize == n).then_some(mask)
}

/// Symmetry of the cluster's nodes (level-0 groups): two nodes of the same size, device kinds and
/// enclosing groups above level 1 are interchangeable for every cost of the search (all-reduce
/// lines, communication paths, memory). A set of used devices is memoised by its class under
/// these permutations: the multiset of `(node class, devices used on the node)`.
struct Symmetry {
    /// Per node: its devices (mask) and its class id.
    nodes: Vec<(u128, u16)>,
}

impl Symmetry {
    fn new(cluster: &Cluster) -> Symmetry {
        let mut per: Vec<(u128, Vec<usize>, Vec<usize>)> = Vec::new();
        for d in 0..cluster.len() {
            let k = cluster.node_of(d);
            if per.len() <= k {
                per.resize(k + 1, (0, Vec::new(), Vec::new()));
            }
            per[k].0 |= 1u128 << d;
            per[k].1.push(cluster.devices[d].kind);
            per[k].2 = cluster.devices[d].coord.get(2..).unwrap_or(&[]).to_vec();
        }
        let mut ids: HashMap<(Vec<usize>, Vec<usize>), u16> = HashMap::default();
        let nodes = per
            .into_iter()
            .map(|(mask, kinds, parent)| {
                let next = ids.len() as u16;
                (mask, *ids.entry((kinds, parent)).or_insert(next))
            })
            .collect();
        Symmetry { nodes }
    }

    /// The class of the used-device set `used` (sorted `class << 8 | used count` per node).
    fn key(&self, used: u128) -> Vec<u16> {
        let mut v: Vec<u16> = self
            .nodes
            .iter()
            .map(|&(m, c)| (c << 8) | (used & m).count_ones() as u16)
            .collect();
        v.sort_unstable();
        v
    }
}

/// Whether `r · t(mb / r) ≥ t(mb)` for every node of `g` and replica count `r ≤ ndev` (a node's
/// time never scales better than linearly in its slice; true of the analytic and measured
/// costs), which makes `C(j, N; 1) / n` a lower bound on the slowest stage of any split of
/// `[j, N)` over `n` devices.
fn sublinear(g: &CostGraph, kind: &crate::cost::DeviceKind, mb: f64, ndev: usize) -> bool {
    (0..g.len()).all(|u| {
        let (f1, b1) = g.times(u, mb, kind);
        (2..=ndev).all(|r| {
            let (f, b) = g.times(u, mb / r as f64, kind);
            r as f64 * (f + b) >= (f1 + b1) * (1.0 - 1e-9)
        })
    })
}

/// The best links of the cluster, for a lower bound on a communication stage's time that needs
/// no lookup ([`CommCost`]). Every device of the receiving set `b` gets `bytes / |b|` and every
/// device of the sending set `a` sends `bytes / |a|` ([`crate::cost::comm::redistribute`]), each
/// in at least one message over a path no faster than the best link available to it: inside a
/// node (level 0) when `b` shares a node with `a`, else across nodes (levels 0 and 1). So the
/// stage takes at least `α + bytes / (β · min(|a|, |b|))` for that link's `(β, α)`.
struct Links {
    /// `(bandwidth, latency)` of a path inside one node.
    near: (f64, f64),
    /// `(bandwidth, latency)` of the fastest path between two nodes.
    far: (f64, f64),
}

impl Links {
    fn new(cluster: &Cluster) -> Links {
        let near = cluster.path_to_level(0);
        let far = if cluster.levels.len() > 1 {
            cluster.path_to_level(1)
        } else {
            near
        };
        Links { near, far }
    }

    /// The lower bound for moving `bytes` between two device sets, the smaller of `n` devices,
    /// over `near` or `far` links, rounded down a little so that it stays below [`CommCost::at`]
    /// in floating point.
    fn lower_bound(&self, near: bool, n: usize, bytes: f64) -> f64 {
        if bytes <= 0.0 {
            return 0.0;
        }
        let (bw, alpha) = if near { self.near } else { self.far };
        (alpha + bytes / (bw * n.max(1) as f64)) * (1.0 - 1e-9)
    }
}

/// A lower bound on Eq. 2 of every plan that starts with a given list of stages (the prefix)
/// and splits the rest over the remaining devices. With `c_s = F_s + B_s`, Algorithm 1 gives
/// (a) every stage after the pivot `Q` is strictly faster than `Q` (for `M > 1`), so the last
/// slowest stage `s*` is at or before `Q`, and (b) `L ≥ Σ_{s ≤ s*} c_s + (M − 1) c_{s*}` (from
/// `T_w + T_s + T_e ≥ Σ_{s ≤ Q} c_s + (M − 1) c_Q` and the pivot condition, not met by the stages
/// between `s*` and `Q`); for `M = 1`, `Q` is the last stage and `L ≥ Σ_s c_s`. When the rest's
/// slowest stage takes at least `r` ([`sublinear`]): `L ≥ Σ_prefix c + M·r` if `r` exceeds every
/// prefix stage, else `L ≥ Σ_{s ≤ s*} c_s + (M − 1) c_{s*}` over the prefix.
///
/// The all-reduces: (b) takes `T_e ≥ Σ_{a ≤ Q} B_a`, the ending's term of stage 0 without its
/// `AR_0`. Every stage `s ≤ Q` gives `T_e ≥ AR_s + Σ_{a=s}^{Q} B_a = Σ_{a ≤ Q} B_a + (AR_s −
/// Σ_{a<s} B_a)`, so the bound grows by `max_{s ≤ s*} (AR_s − Σ_{a<s} B_a)` (at least `AR_0 ≥ 0`)
/// over the prefix stages known to be at or before `s*`: all of them when the rest holds `s*`
/// (and for `M = 1`), those up to the prefix's last slowest stage otherwise. A stage pushed with
/// an unknown all-reduce (0) or backward (`c`) keeps the bound valid.
#[derive(Clone, Copy, Debug, Default)]
struct Bound {
    /// `Σ c_s` over the prefix.
    sum: f64,
    /// `max c_s` over the prefix.
    max: f64,
    /// `Σ c_s` up to and including the last slowest prefix stage.
    at_max: f64,
    /// `Σ B_s` over the prefix (an upper bound where a stage's `B` is unknown).
    bwd: f64,
    /// `max (AR_s − Σ_{a<s} B_a)` over the prefix, floored at 0.
    ar: f64,
    /// `ar` up to and including the last slowest prefix stage.
    ar_at_max: f64,
}

impl Bound {
    fn of(lat: &[LatStage]) -> Bound {
        lat.iter()
            .fold(Bound::default(), |b, x| b.push(x.f + x.b, x.b, x.ar))
    }
    /// Append a stage with `c = F + B`, backward `b` (or an upper bound) and all-reduce `ar` (or
    /// a lower bound).
    fn push(mut self, c: f64, b: f64, ar: f64) -> Bound {
        self.ar = self.ar.max(ar - self.bwd);
        self.bwd += b;
        self.sum += c;
        if c >= self.max {
            self.max = c;
            self.at_max = self.sum;
            self.ar_at_max = self.ar;
        }
        self
    }
    /// Append a stage of which only a lower bound `c` on `F + B` is known (the last one before
    /// [`Bound::lb`]: its backward does not enter the bound).
    fn push_c(self, c: f64) -> Bound {
        self.push(c, c, 0.0)
    }
    /// A lower bound on `self.push(2t', t', 0).push_c(x').lb(m, 0)` (a communication stage of
    /// `t'` each way, then a stage of at least `x'`) for every `t' ≥ t` and `x' ≥ x`, the check
    /// that the search's loop over cuts breaks on. For `M = 1` that is itself (a sum, monotone);
    /// for `M > 1`, `self.push(2t, t, 0).lb(m, 0)`: `P.sum + M·2t` once the communication stage is
    /// the slowest, else the prefix's own bound, nondecreasing in `t` and below the check in
    /// each case of which stage is the last slowest.
    fn through(self, m: f64, t: f64, x: f64) -> f64 {
        let b = self.push(2.0 * t, t, 0.0);
        if m <= 1.0 {
            b.push_c(x).lb(m, 0.0)
        } else {
            b.lb(m, 0.0)
        }
    }
    /// The bound for `m` micro-batches when the rest's slowest stage takes at least `rest`.
    fn lb(&self, m: f64, rest: f64) -> f64 {
        if m <= 1.0 {
            self.sum + rest + self.ar
        } else if rest > self.max {
            self.sum + m * rest + self.ar
        } else {
            self.at_max + (m - 1.0) * self.max + self.ar_at_max
        }
    }
}

/// What [`run_search`] returns.
struct Searched {
    /// The best complete feasible states (at most [`TOP`]), best first.
    top: Vec<State>,
    /// States memoised.
    states: usize,
    /// Whether a bound pruned anything (else an empty `top` means no feasible plan at all).
    any_pruned: bool,
    /// `--time-limit` stopped the extension of states.
    out_of_time: bool,
    /// The search passed its [`TRANSITION_BUDGET`] and extended only [`BEAM`] states per cut.
    capped: bool,
}

/// Keep `st` among the [`TOP`] best complete feasible plans if it is one, at most one per
/// replica-count shape (e.g. 8:8, 4:4:8) so that the re-ranking sees different shapes rather
/// than near-copies of one.
fn consider(top: &mut Vec<State>, st: &State, ndev: usize) {
    let shape = |x: &State| -> Vec<u32> {
        let mut v: Vec<u32> = x.stages.iter().map(|p| p.mask.count_ones()).collect();
        v.push(ndev as u32 - v.iter().sum::<u32>());
        v
    };
    if st.complete_ok && (top.len() < TOP || top.last().is_some_and(|b| st.latency < b.latency)) {
        let sh = shape(st);
        match top.iter().position(|b| shape(b) == sh) {
            Some(k) if top[k].latency <= st.latency => {}
            other => {
                if let Some(k) = other {
                    top.remove(k);
                }
                let at = top.partition_point(|b| b.latency <= st.latency);
                top.insert(at, st.clone());
                top.truncate(TOP);
            }
        }
    }
}

/// Transitions (a state's split at a cut that survives the bounds) after which the search
/// extends only the [`BEAM`] best states of each cut (see [`run_search`]).
pub const TRANSITION_BUDGET: usize = 1_000_000;

/// States per cut that a search past its [`TRANSITION_BUDGET`] extends.
pub const BEAM: usize = 16;

/// The memoised search ([`Searched`]: the best complete feasible states, at most [`TOP`], best
/// first, and the number of states).
///
/// States are `(cut, class of the used devices)` ([`Symmetry`]): of the used-device sets that
/// differ only by a permutation of interchangeable nodes, the one with the least `L` is kept and
/// extended (its actual devices are placed and costed). With `n` identical nodes of `d` devices
/// there are at most `C(n + d, d)` classes per cut (495 for summit's 8 × 4) instead of up to
/// `(d + 1)^n` sets (87 380 reachable at 8 × 4).
///
/// Memoising by class is exact up to the index order that [`place`] and
/// [`crate::cost::comm::redistribute`] see (which node of a class comes first); it keeps the one
/// state per class with the least `L`, where the mask-keyed table kept one per permutation.
///
/// Pruning ([`Bound`]): a state, a replica count or a cut whose lower bound on every plan
/// extending it exceeds the incumbent is not extended. The incumbent is the `TOP`-th best
/// complete `L` of this search (such a plan cannot enter `top`) or `ctx.bound` (it cannot enter
/// the planner's pool), whichever is smaller.
///
/// **Workers.** The states of one cut are extended by up to [`search_workers`] threads, state
/// `x` by worker `x mod W`, and the results are exactly those of extending them one after another
/// in order (whatever `W` is): everything a state's extension reads but the target states'
/// latencies is fixed before the cut (the incumbent of state `x` is the `TOP`-th best after the
/// states up to `x` were considered as complete plans, which does not depend on extensions), a
/// worker keeps a candidate only where its own view of the target's latency (the table as of the
/// cut start, lowered by its own earlier candidates) does not already reject it, and the
/// candidates are then applied in the sequential order with the sequential tests. A worker's view
/// is never below the sequential one (a kept candidate lowers it to at most
/// `max(L, lb·(1 − 1e-12))`, what the sequential test would leave), so no candidate that the
/// sequential search would apply is dropped. Counts (transitions, states) are the same.
fn run_search(ctx: &Ctx, workers: &mut [Worker]) -> Searched {
    let ndev = ctx.cluster.len();
    let all: u128 = if ndev == 128 {
        u128::MAX
    } else {
        (1u128 << ndev) - 1
    };
    let k = ctx.family.positions() - 1;
    let n = ctx.whole.len();
    let sym = Symmetry::new(ctx.cluster);
    let links = Links::new(ctx.cluster);
    // later[i]: the cuts `j` after which `[i, j)` is a stage (`D(i) ⊊ D(j)`), ascending, the last
    // position (the whole graph) excluded: the rest is never empty.
    let later: Vec<Vec<usize>> = (0..k)
        .map(|i| (i + 1..k).filter(|&j| ctx.family.valid(i, j)).collect())
        .collect();
    let mut class_ids: HashMap<Vec<u16>, u32> = HashMap::default();
    // smin[j] at cut c: the least one-device compute of a stage [c, j') with j' ≥ j (a stage on
    // r devices takes at least 1/r of it, for sublinear node times): once the new stage alone
    // reaches the incumbent, no later cut can do better. Filled once per cut (empty when node
    // times are not sublinear).
    let mut smin: Vec<f64> = Vec::new();
    // states[c]: the best state of each class of used devices at cut index c, in the order the
    // classes were first reached there (the order does not matter: each cut sorts its states).
    let mut states: Vec<Vec<State>> = vec![Vec::new(); k + 1];
    // best_l[c][class]: the latency of the class's state at cut c (infinite if none) and its
    // index in states[c], read before a candidate's latency is computed (a dense array: most
    // candidates are not better).
    let mut best_l: Vec<Vec<(f64, u32)>> = vec![Vec::new(); k + 1];
    let (main, _) = workers
        .split_first_mut()
        .expect("run_search: at least one worker");
    // Base state: one stage on every device (pure data parallelism).
    {
        let last = ctx.compute_stage(&mut main.costs, 0, n, all);
        let (l, _) = latency(&[last], ctx.m);
        let ok = ctx.fits(
            &PlannedStage {
                start: 0,
                end: n,
                mask: all,
            },
            0,
            1,
        );
        class_ids.insert(sym.key(0), 0);
        best_l[0].push((l, 0));
        states[0].push(State {
            used: 0,
            stages: Vec::new(),
            lat: Vec::new(),
            latency: l,
            complete_ok: ok,
        });
    }
    let mut top: Vec<State> = Vec::with_capacity(TOP + 1);
    let mut count = 0usize;
    let mut any_pruned = false;
    // Splits costed so far, and whether the beam has dropped states.
    let mut transitions = 0usize;
    let mut capped = false;
    // `--time-limit`: once it has passed, states are still collected as complete plans (every
    // state is one: its last stage takes the free devices) but no longer extended.
    let mut out_of_time = false;
    let mut visited = 0usize;
    let mut incumbents: Vec<f64> = Vec::new();
    for c in 0..k {
        let mut here: Vec<State> = std::mem::take(&mut states[c]);
        best_l[c] = Vec::new();
        // Past the transition budget, extend only the BEAM best states of each cut (by the
        // latency of their plan with the rest as one stage); every state still counts as a
        // complete plan below.
        if transitions > TRANSITION_BUDGET && here.len() > BEAM {
            here.sort_by(|a, b| a.latency.total_cmp(&b.latency).then(a.used.cmp(&b.used)));
            for st in here.drain(BEAM..) {
                consider(&mut top, &st, ndev);
            }
            capped = true;
        }
        here.sort_by_key(|s| s.used);
        count += here.len();
        // Each state counts as a complete plan before it is extended; its incumbent is the
        // `TOP`-th best after that (NaN: not extended, `--time-limit`).
        incumbents.clear();
        for st in &here {
            consider(&mut top, st, ndev);
            if !out_of_time && visited.is_multiple_of(64) {
                out_of_time = ctx.opts.out_of_time();
            }
            visited += 1;
            incumbents.push(if out_of_time {
                f64::NAN
            } else if top.len() == TOP {
                top.last()
                    .map_or(f64::INFINITY, |b| b.latency)
                    .min(ctx.bound)
            } else {
                ctx.bound
            });
        }
        if ctx.sublinear {
            let c1 = &ctx.chains[1];
            smin.clear();
            smin.resize(k + 1, f64::INFINITY);
            for j in (c + 1..k).rev() {
                let here = if ctx.family.valid(c, j) {
                    c1.compute(c, j)
                } else {
                    f64::INFINITY
                };
                smin[j] = here.min(smin[j + 1]);
            }
        }
        let cut = Cut {
            i: c,
            all,
            sym: &sym,
            links: &links,
            later: &later[c],
            smin: &smin,
            class_ids: &class_ids,
            best_l: &best_l,
            here: &here,
            incumbents: &incumbents,
        };
        let allowed = ctx
            .workers
            .map_or(usize::MAX, |w| w.load(Ordering::Relaxed));
        let nw = workers
            .len()
            .min(allowed)
            .min(here.len().div_ceil(MIN_STATES_PER_WORKER))
            .max(1);
        if nw == 1 {
            cut.expand(ctx, &mut workers[0], 0, 1);
        } else {
            use rayon::prelude::*;
            workers[..nw]
                .par_iter_mut()
                .enumerate()
                .for_each(|(w, wk)| cut.expand(ctx, wk, w, nw));
        }
        let done = &mut workers[..nw];
        for e in done.iter().map(|wk| &wk.out) {
            transitions += e.transitions;
            any_pruned |= e.any_pruned;
        }
        // Apply the candidates in the sequential order: state by state (state x is worker
        // x mod nw's), each state's in the order its worker made them.
        let mut next = vec![0usize; nw];
        let mut gid: Vec<Vec<u32>> = done
            .iter()
            .map(|wk| vec![u32::MAX; wk.out.new_keys.len()])
            .collect();
        let known = class_ids.len() as u32;
        for (x, st) in here.iter().enumerate() {
            let w = x % nw;
            let e = &mut done[w].out;
            while let Some(cand) = e.cands.get(next[w]).filter(|cand| cand.state as usize == x) {
                next[w] += 1;
                let key = if cand.class < known {
                    cand.class
                } else {
                    let local = (cand.class - known) as usize;
                    if gid[w][local] == u32::MAX {
                        let fresh = class_ids.len() as u32;
                        gid[w][local] = *class_ids
                            .entry(std::mem::take(&mut e.new_keys[local]))
                            .or_insert(fresh);
                    }
                    gid[w][local]
                };
                let c2 = cand.c2 as usize;
                let (old, at) = best_l[c2]
                    .get(key as usize)
                    .copied()
                    .unwrap_or((f64::INFINITY, u32::MAX));
                if old.is_finite() && cand.lb * (1.0 - 1e-12) >= old {
                    continue;
                }
                if cand.l >= old {
                    continue;
                }
                let slot = &mut best_l[c2];
                if slot.len() <= key as usize {
                    slot.resize(key as usize + 1, (f64::INFINITY, u32::MAX));
                }
                let new_stage = PlannedStage {
                    start: c,
                    end: c2,
                    mask: cand.gm,
                };
                let (into, new_st) = (cand.into, cand.new_st);
                let fill = |s: &mut State| {
                    s.used = st.used | cand.gm;
                    s.stages.clear();
                    s.stages.extend_from_slice(&st.stages);
                    s.stages.push(new_stage);
                    s.lat.clear();
                    s.lat.extend_from_slice(&st.lat);
                    s.lat.extend(into);
                    s.lat.push(new_st);
                    s.latency = cand.l;
                    s.complete_ok = cand.last_ok;
                };
                // A better plan for a known state reuses its buffers.
                if let Some(s) = states[c2].get_mut(at as usize) {
                    slot[key as usize].0 = cand.l;
                    fill(s);
                } else {
                    slot[key as usize] = (cand.l, states[c2].len() as u32);
                    let mut s = State {
                        used: 0,
                        stages: Vec::with_capacity(st.stages.len() + 1),
                        lat: Vec::with_capacity(st.lat.len() + 2),
                        latency: 0.0,
                        complete_ok: false,
                    };
                    fill(&mut s);
                    states[c2].push(s);
                }
            }
        }
    }
    Searched {
        top,
        states: count,
        any_pruned,
        out_of_time,
        capped,
    }
}

/// The fewest states of a cut per search worker (below it, fewer workers: a thread costs about
/// what extending a few states does).
const MIN_STATES_PER_WORKER: usize = 4;

/// The most threads one search uses.
const MAX_SEARCH_WORKERS: usize = 4;

/// Workers a search uses: the threads of the shared pool (the machine's parallelism), at most
/// [`MAX_SEARCH_WORKERS`]. The plans do not depend on it ([`run_search`]).
fn search_workers() -> usize {
    rayon::current_num_threads().clamp(1, MAX_SEARCH_WORKERS)
}

/// What every worker of one cut reads ([`run_search`]).
struct Cut<'s> {
    /// The cut index the states are at.
    i: usize,
    all: u128,
    sym: &'s Symmetry,
    links: &'s Links,
    /// The later cuts a stage from `i` may end at.
    later: &'s [usize],
    /// The least one-device compute of a stage from `i` ending at or after each cut (empty
    /// when node times are not sublinear; see [`run_search`]).
    smin: &'s [f64],
    /// The classes known at the cut start.
    class_ids: &'s HashMap<Vec<u16>, u32>,
    /// The states' latencies at the cut start.
    best_l: &'s [Vec<(f64, u32)>],
    here: &'s [State],
    /// Per state: its incumbent, NaN when it is not extended.
    incumbents: &'s [f64],
}

/// A split that its worker found better than the target state as far as it knew.
struct Candidate {
    /// Index of the extended state in the cut's states.
    state: u32,
    /// The cut the new stage ends at (the target state's cut).
    c2: u32,
    /// The target class: a known class id (`< class_ids.len()` at the cut start) or
    /// `known + index` into [`Expansion::new_keys`].
    class: u32,
    /// The new stage's devices.
    gm: u128,
    /// The communication stage into the new stage (none from the first stage).
    into: Option<LatStage>,
    new_st: LatStage,
    /// Eq. 2 of the plan (the rest as one last stage) and the bound the sequential search checks
    /// first.
    l: f64,
    lb: f64,
    /// Whether the rest fits as the last stage.
    last_ok: bool,
}

/// One worker's extensions of its states of a cut.
#[derive(Default)]
struct Expansion {
    /// In the order of the states, then of the loops.
    cands: Vec<Candidate>,
    /// Classes not known at the cut start, in the order this worker met them.
    new_keys: Vec<Vec<u16>>,
    transitions: usize,
    any_pruned: bool,
}

impl Cut<'_> {
    /// Extend the states `w, w + nw, w + 2·nw, …` with worker `wk`'s memo, into `wk.out`.
    fn expand(&self, ctx: &Ctx, wk: &mut Worker, w: usize, nw: usize) {
        let Worker { costs, out, view } = wk;
        out.cands.clear();
        out.new_keys.clear();
        out.transitions = 0;
        out.any_pruned = false;
        let known = self.class_ids.len() as u32;
        let mut new_ids: HashMap<Vec<u16>, u32> = HashMap::default();
        // This worker's own lowered view of target latencies: view[cut][class] (dense, as
        // `best_l`: read for most transitions).
        view.resize_with(self.best_l.len(), Vec::new);
        for v in view.iter_mut() {
            v.clear();
        }
        let mut class_of = |used: u128, out: &mut Expansion| -> u32 {
            let key = self.sym.key(used);
            if let Some(&id) = self.class_ids.get(&key) {
                return id;
            }
            let next = known + new_ids.len() as u32;
            *new_ids.entry(key).or_insert_with_key(|key| {
                out.new_keys.push(key.clone());
                next
            })
        };
        let mf = ctx.m.max(1) as f64;
        let rest_bound = ctx.sublinear;
        let n = ctx.whole.len();
        let i = self.i;
        let smin = self.smin;
        // Lower bound on the slowest stage of any split of `[j, N)` over `nrest` devices.
        let rest_lb = |j: usize, nrest: usize| -> f64 {
            if rest_bound && nrest > 0 {
                ctx.chains[1].compute(j, n) / nrest as f64
            } else {
                0.0
            }
        };
        // Prune when the bound reaches the incumbent (with a margin for rounding).
        let pruned = |bound: f64, incumbent: f64| bound * (1.0 - 1e-9) >= incumbent;
        for x in (w..self.here.len()).step_by(nw) {
            let st = &self.here[x];
            let incumbent = self.incumbents[x];
            if incumbent.is_nan() {
                continue;
            }
            let used = st.used;
            let free = self.all & !used;
            let nfree = free.count_ones() as usize;
            if nfree < 2 {
                continue;
            }
            let bound = Bound::of(&st.lat);
            if pruned(bound.lb(mf, rest_lb(i, nfree)), incumbent) {
                out.any_pruned = true;
                continue;
            }
            let nstages = st.stages.len() + 2;
            // Earlier stages' feasibility depends only on the new stage count.
            if !st
                .stages
                .iter()
                .enumerate()
                .all(|(x, s)| ctx.fits(s, x, nstages))
            {
                continue;
            }
            // The communication stage into the new stage, bounded without a lookup (`Links`):
            // where it alone brings the bound to the incumbent, every cut of the loop below would
            // break at once (Eq. 2's bound is monotone in that stage's time for the forms used
            // here: `M = 1` sums every stage; for `M > 1`, `L ≥ M·(F + B)` of any one stage), so
            // the state, a replica count or a placement is skipped without it. Exactly the
            // states, splits and transitions of the full loop.
            let smin_first = if rest_bound { smin[i + 1] } else { 0.0 };
            let bytes_in = ctx.whole.cut[i];
            let r_prev = st.stages.last().map(|prev| prev.mask.count_ones() as usize);
            let into_lb = |t: f64, x: f64| bound.through(mf, t, x);
            if let Some(r_prev) = r_prev {
                let t = self.links.lower_bound(true, r_prev, bytes_in);
                if rest_bound && pruned(into_lb(t, smin_first / (nfree - 1) as f64), incumbent) {
                    out.any_pruned = true;
                    continue;
                }
            }
            // The nodes holding the last planned stage.
            let prev_nodes = st.stages.last().map_or(0, |prev| {
                self.sym
                    .nodes
                    .iter()
                    .filter(|&&(m, _)| m & prev.mask != 0)
                    .fold(0, |a, &(m, _)| a | m)
            });
            let mut lat = st.lat.clone();
            let base_len = lat.len();
            let mut eq2 = PrefixLatency::new(&st.lat, ctx.m);
            for mnew in 1..nfree {
                // The smallest stage at `i` on `mnew` devices already reaches the incumbent
                // (then so it does on fewer devices).
                if rest_bound
                    && pruned(
                        bound.push_c(smin[i + 1] / mnew as f64).lb(mf, 0.0),
                        incumbent,
                    )
                {
                    out.any_pruned = true;
                    continue;
                }
                if let Some(r_prev) = r_prev {
                    let t = self.links.lower_bound(true, r_prev.min(mnew), bytes_in);
                    if rest_bound && pruned(into_lb(t, smin_first / mnew as f64), incumbent) {
                        out.any_pruned = true;
                        continue;
                    }
                }
                let mut placed: Vec<u128> = Vec::with_capacity(3);
                for pol in Policy::ALL {
                    if let Some(gm) = place_in(&self.sym.nodes, free, mnew, pol) {
                        debug_assert_eq!(Some(gm), place(ctx.cluster, free, mnew, pol));
                        if !placed.contains(&gm) {
                            placed.push(gm);
                        }
                    }
                }
                for gm in placed {
                    // Skip the placement without looking up its communication stage when a lower
                    // bound on that stage already prunes it: exactly where the first cut below
                    // would break (see `Links`).
                    if let Some(r_prev) = r_prev {
                        let t = self.links.lower_bound(
                            gm & prev_nodes != 0,
                            r_prev.min(mnew),
                            bytes_in,
                        );
                        if rest_bound && pruned(into_lb(t, smin_first / mnew as f64), incumbent) {
                            out.any_pruned = true;
                            continue;
                        }
                    }
                    let rest = free & !gm;
                    let into = st
                        .stages
                        .last()
                        .map(|prev| ctx.comm_stage(costs, i, prev.mask, gm));
                    let bound_in = into.map_or(bound, |x| bound.push(x.f + x.b, x.b, 0.0));
                    let (r_new, r_rest) = (gm.count_ones() as usize, rest.count_ones() as usize);
                    // The new stage's all-reduce lines (its `AR` enters the bounds below), looked
                    // up at the first cut that survives the break.
                    let mut lines_new: Option<(Affine, Affine)> = None;
                    // Costs of the split, looked up when a cut survives the bound.
                    let mut split: Option<Split> = None;
                    for &j in self.later {
                        if rest_bound
                            && pruned(
                                bound_in.push_c(smin[j] / r_new as f64).lb(mf, 0.0),
                                incumbent,
                            )
                        {
                            out.any_pruned = true;
                            break;
                        }
                        out.transitions += 1;
                        let lines = match lines_new {
                            Some(l) => l,
                            None => *lines_new.insert(ctx.ar_lines(costs, gm)),
                        };
                        let new_st = ctx.compute_stage_with(i, j, r_new, lines);
                        let c_new = new_st.f + new_st.b;
                        let with_new = bound_in.push(c_new, new_st.b, new_st.ar);
                        if pruned(with_new.lb(mf, rest_lb(j, r_rest)), incumbent) {
                            out.any_pruned = true;
                            continue;
                        }
                        let &mut Split {
                            ref out_cost,
                            l_rest,
                            key,
                            cap_new,
                            cap_rest,
                        } = split.get_or_insert_with(|| Split {
                            out_cost: ctx.comm_cost(costs, gm, rest),
                            l_rest: ctx.ar_lines(costs, rest),
                            key: class_of(used | gm, &mut *out),
                            cap_new: ctx.cap(gm),
                            cap_rest: ctx.cap(rest),
                        });
                        let t = out_cost.at(ctx.whole.cut[j]);
                        // This worker's view of the target's latency: never below what the
                        // sequential search would hold here (see `run_search`).
                        let old = self.best_l[j]
                            .get(key as usize)
                            .map_or(f64::INFINITY, |e| e.0)
                            .min(view[j].get(key as usize).copied().unwrap_or(f64::INFINITY));
                        // Eq. 2 of this plan is at least its Bound (Algorithm 1, with the rest
                        // as the last stage): when that reaches the state's best, it is not
                        // better (a margin covers the two sums' rounding).
                        let rest_st = ctx.compute_stage_with(j, n, r_rest, l_rest);
                        let lb = with_new
                            .push(2.0 * t, t, 0.0)
                            .push(rest_st.f + rest_st.b, rest_st.b, rest_st.ar)
                            .lb(mf, 0.0);
                        if old.is_finite() && lb * (1.0 - 1e-12) >= old {
                            continue;
                        }
                        let new_stage = PlannedStage {
                            start: i,
                            end: j,
                            mask: gm,
                        };
                        if !ctx.fits_cap(&new_stage, nstages - 2, nstages, cap_new) {
                            continue;
                        }
                        lat.truncate(base_len);
                        if let Some(x) = into {
                            lat.push(x);
                        }
                        lat.push(new_st);
                        lat.push(LatStage {
                            f: t,
                            b: t,
                            ar: 0.0,
                        });
                        lat.push(rest_st);
                        let (l, _) = eq2.latency(&lat[base_len..]);
                        if l < old {
                            let v = &mut view[j];
                            if v.len() <= key as usize {
                                v.resize(key as usize + 1, f64::INFINITY);
                            }
                            v[key as usize] = l.max(lb * (1.0 - 1e-12));
                            let last_ok = ctx.fits_cap(
                                &PlannedStage {
                                    start: j,
                                    end: n,
                                    mask: rest,
                                },
                                nstages - 1,
                                nstages,
                                cap_rest,
                            );
                            out.cands.push(Candidate {
                                state: x as u32,
                                c2: j as u32,
                                class: key,
                                gm,
                                into,
                                new_st,
                                l,
                                lb,
                                last_ok,
                            });
                        }
                    }
                }
            }
        }
    }
}

/// The default micro-batch (see the module doc).
pub fn default_micro_batch(g: &CostGraph, opts: &PlanOptions) -> Result<u64> {
    if opts.micro_batch().is_some() {
        return Ok(opts.micro_batch_or(1));
    }
    let b = opts.batch.max(1);
    let r = g.reference_batch.round() as u64;
    if r >= 1 && r < b && b.is_multiple_of(r) {
        return Ok(r);
    }
    Ok(opts.micro_batch_or(8))
}

/// Micro-batches the planner tries: the requested one; else the default and the divisors giving
/// `M = 1, 2, 4, ..., 64`. Counted work needs them because small micro-batches pay a fixed weight
/// traffic each; a measured profile (linear in the batch) because every micro-batch after a
/// device's first adds its weight gradients into the gradient buffer (see [`crate::sim`]), so
/// fewer micro-batches can win where the bubble is small (data parallelism on a fast network).
pub fn micro_batch_candidates(g: &CostGraph, opts: &PlanOptions) -> Result<Vec<u64>> {
    let d = default_micro_batch(g, opts)?;
    if opts.micro_batch().is_some() {
        return Ok(vec![d]);
    }
    let b = opts.batch.max(1);
    let mut v: Vec<u64> = (0..=6)
        .map(|e| 1u64 << e)
        .filter(|&m| m <= b && b.is_multiple_of(m))
        .map(|m| b / m)
        .collect();
    if !v.contains(&d) {
        v.push(d);
    }
    Ok(v)
}

/// A lower bound of the simulated iteration of every plan the `dapple` planner can return for
/// `g` on `cluster` with `opts`, without searching: at micro-batch `mb` (`M = batch / mb`), a
/// stage of `r` replicas keeps each of its devices busy at least `M · t(mb / r) ≥ M · t(mb) / r`
/// ([`sublinear`] node times), so the devices together compute at least `M · C(mb)` (`C` the
/// whole graph's forward + backward) and the busiest at least `M · C(mb) / D`
/// ([`crate::sim::compute_bound`]: the simulator runs a device's tasks one after another); the
/// bound is the least over the micro-batches the planner tries ([`micro_batch_candidates`]). 0
/// where it does not hold as stated (device kinds differ, or node times are not sublinear).
/// `O(nodes × devices × micro-batches)`; the `gpp` planner skips its `dapple` seed when this
/// already exceeds its best plan.
pub fn iteration_lower_bound(g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<f64> {
    let ndev = cluster.len();
    if ndev == 0
        || cluster
            .devices
            .iter()
            .any(|d| d.kind != cluster.devices[0].kind)
    {
        return Ok(0.0);
    }
    let kind = cluster.kind_of(0);
    let batch = opts.batch.max(1);
    let mut bound = f64::INFINITY;
    for mb in micro_batch_candidates(g, opts)? {
        if !sublinear(g, kind, mb as f64, ndev) {
            return Ok(0.0);
        }
        let (f, b) = g.total_time(mb as f64, kind);
        let c = f + b;
        let m = (batch / mb.max(1)).max(1) as f64;
        bound = bound.min(m * c / ndev as f64);
    }
    Ok(if bound.is_finite() {
        bound * (1.0 - 1e-9)
    } else {
        0.0
    })
}

impl Default for Dapple {
    fn default() -> Dapple {
        Dapple {
            rerank: TOP,
            workers: None,
        }
    }
}

impl Planner for Dapple {
    fn name(&self) -> &'static str {
        "dapple"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        let family = cuts(g, cluster);
        // Candidates (micro-batch, stages, L), best L first.
        let mut pool: Vec<(u64, StagePlan, f64)> = Vec::new();
        // Search the micro-batches in turn; once `rerank` candidates are known, a later
        // search leaves out what could not make the pool (`L` above the `rerank`-th best so
        // far). The pool is filled in the candidates' order, as if every search were complete.
        let mbs = micro_batch_candidates(g, opts)?;
        let keep = self.rerank.max(1);
        // Most promising first: by Eq. 2 of pure data parallelism at each micro-batch.
        let dp_all = vec![(0, family.last(), (0..cluster.len()).collect::<Vec<_>>())];
        let dp_l: Vec<f64> = mbs
            .iter()
            .map(|&mb| evaluate(g, cluster, opts, mb, &family, &dp_all).0)
            .collect();
        let mut order: Vec<usize> = (0..mbs.len()).collect();
        order.sort_by(|&a, &b| dp_l[a].total_cmp(&dp_l[b]));
        let mut found: Vec<Vec<(StagePlan, f64)>> = vec![Vec::new(); mbs.len()];
        let mut caches = Caches {
            cap: self.workers.clone(),
            ..Default::default()
        };
        let mut ls: Vec<f64> = Vec::new();
        let mut time_limited = false;
        let mut capped = false;
        for x in order {
            // `--time-limit`: the micro-batches not searched yet are left out once a plan is known.
            if !ls.is_empty() && opts.out_of_time() {
                time_limited = true;
                break;
            }
            let bound = if ls.len() >= keep {
                ls.sort_by(f64::total_cmp);
                ls[keep - 1]
            } else {
                f64::INFINITY
            };
            let s = search_bounded(g, cluster, opts, mbs[x], &family, bound, &mut caches)?;
            if s.candidates.is_empty() && bound == f64::INFINITY {
                // Under per-micro-batch updates a micro-batch may admit no plan (no stages
                // whose replica counts divide it use every device); the others are tried.
                if opts
                    .schedule
                    .is_some_and(ScheduleKind::per_micro_batch_step)
                {
                    continue;
                }
                return Err(Error::infeasible("dapple", "no plan found"));
            }
            time_limited |= s.time_limited;
            capped |= s.capped;
            ls.extend(s.candidates.iter().map(|c| c.1));
            found[x] = s.candidates;
        }
        // Eq. 2 ranks plans at one micro-batch size well but not across sizes (it leaves out
        // the bubbles inside the pivot stage, whose share changes with M): besides the best
        // `rerank` over all sizes, each size's own best [`PER_MICRO_BATCH`] are re-ranked.
        let mut own: Vec<(u64, StagePlan, f64)> = Vec::new();
        for (x, mut cands) in found.into_iter().enumerate() {
            cands.sort_by(|a, b| a.1.total_cmp(&b.1));
            for (k, (st, l)) in cands.into_iter().enumerate() {
                if k < PER_MICRO_BATCH && self.rerank > 1 {
                    own.push((mbs[x], st.clone(), l));
                }
                pool.push((mbs[x], st, l));
            }
        }
        pool.sort_by(|a, b| a.2.total_cmp(&b.2));
        pool.truncate(self.rerank.max(1));
        for c in own {
            if !pool.iter().any(|p| p.0 == c.0 && p.1 == c.1) {
                pool.push(c);
            }
        }
        if self.rerank > 1 {
            // Pure data parallelism (the search's base state) is always re-ranked too, at every
            // micro-batch tried.
            let dp = vec![(0, family.last(), (0..cluster.len()).collect::<Vec<_>>())];
            for mb in micro_batch_candidates(g, opts)? {
                if !pool.iter().any(|p| p.0 == mb && p.1 == dp) {
                    let l = evaluate(g, cluster, opts, mb, &family, &dp).0;
                    pool.push((mb, dp.clone(), l));
                }
            }
        }
        let kinds: Vec<ScheduleKind> = match opts.schedule {
            Some(k) => vec![k],
            None => vec![
                ScheduleKind::DappleA,
                ScheduleKind::DappleB,
                ScheduleKind::ZbH1,
            ],
        };
        let mut best: Option<Plan> = None;
        // Under per-micro-batch updates every stage's replicas must split the micro-batch
        // (the search keeps to that; the re-ranked data parallelism may not).
        let per_mb_step = opts
            .schedule
            .is_some_and(ScheduleKind::per_micro_batch_step);
        for (mb, stages, l) in pool {
            if per_mb_step
                && stages
                    .iter()
                    .any(|(_, _, d)| crate::sim::takes_turns(mb as f64, d.len()))
            {
                continue;
            }
            let specs: Vec<StageSpec> = stages
                .iter()
                .map(|(i, j, devs)| StageSpec {
                    nodes: family.nodes(*i, *j),
                    devices: devs.clone(),
                })
                .collect();
            for &k in &kinds {
                let p =
                    Plan::assemble(self.name(), g, cluster, opts, specs.clone(), mb, k, l, 0.0)?;
                let better = best.as_ref().is_none_or(|b| p.beats(b));
                if better {
                    best = Some(p);
                }
            }
        }
        let mut plan = best.ok_or_else(|| {
            Error::infeasible(
                "dapple",
                if opts.schedule.is_some_and(ScheduleKind::per_micro_batch_step) {
                    "no plan found whose stages' replica counts divide the micro-batch (needed by per-micro-batch updates)"
                } else {
                    "no plan found"
                },
            )
        })?;
        // ZB-H2 on the winner's stages only (one more simulation, not one per candidate): it
        // differs from zb-h1 by a longer warm-up and later weight passes, so it wins where the
        // stages already pipeline well, at up to twice the activations (kept only if they fit).
        // A trial, as in GPP's `keep_faster`: if it cannot be assembled, the plan found stands.
        if opts.schedule.is_none() {
            if let Ok(zb) = plan.rescheduled(self.name(), g, cluster, opts, ScheduleKind::ZbH2) {
                if zb.beats(&plan) {
                    plan = zb;
                }
            }
        }
        plan.search_time_s = t0.elapsed().as_secs_f64();
        plan.time_limited = time_limited;
        plan.search_capped = capped;
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform numbers in `[0, 1)` (xorshift64 from `seed`).
    fn uniform(mut x: u64) -> impl FnMut() -> f64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// [`Bound::through`] stays below the loop's check for any larger communication stage and
    /// new stage (what lets the search skip a placement without costing its communication).
    #[test]
    fn through_bound_is_below_the_cut_check() {
        let mut rnd = uniform(0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..200_000 {
            let s = (rnd() * 6.0) as usize;
            let m = [1.0, 2.0, 3.0, 4.0, 8.0, 64.0][(rnd() * 6.0) as usize];
            let prefix = (0..s).fold(Bound::default(), |b, _| {
                let (f, bw) = (rnd(), rnd());
                b.push(f + bw, bw, if rnd() < 0.5 { 0.0 } else { rnd() })
            });
            let (t, xs) = (rnd() * rnd(), rnd() * rnd());
            let (t2, x2) = (t * (1.0 + 3.0 * rnd()), xs * (1.0 + 3.0 * rnd()));
            let lb = prefix.through(m, t, xs);
            let check = prefix.push(2.0 * t2, t2, 0.0).push_c(x2).lb(m, 0.0);
            assert!(
                lb <= check * (1.0 + 1e-12),
                "m={m} t={t} {t2} x={xs} {x2}: {lb} > {check}"
            );
        }
    }

    /// [`PrefixLatency`] gives Eq. 2 and the pivot of [`latency`] for every split of a stage
    /// list into a prefix and a tail.
    #[test]
    fn prefix_latency_is_eq2() {
        let mut rnd = uniform(0x51_7cc1_b727_220au64);
        for _ in 0..50_000 {
            let s = 1 + (rnd() * 14.0) as usize;
            let m = [1, 2, 3, 4, 8, 16, 64][(rnd() * 7.0) as usize];
            // Some stages repeat exactly (ties in Algorithm 1), some are communication stages.
            let mut st: Vec<LatStage> = Vec::new();
            for _ in 0..s {
                let x = if !st.is_empty() && rnd() < 0.2 {
                    st[(rnd() * st.len() as f64) as usize]
                } else if rnd() < 0.3 {
                    let t = rnd() * 0.1;
                    LatStage {
                        f: t,
                        b: t,
                        ar: 0.0,
                    }
                } else {
                    LatStage {
                        f: rnd().powi(1 + 2 * (rnd() < 0.5) as i32),
                        b: rnd().powi(1 + 2 * (rnd() < 0.5) as i32),
                        ar: if rnd() < 0.5 { 0.0 } else { rnd() },
                    }
                };
                st.push(x);
            }
            let (l, q) = latency(&st, m);
            for p in 0..s {
                let mut pl = PrefixLatency::new(&st[..p], m);
                let (l2, q2) = pl.latency(&st[p..]);
                // Twice: the second reads the cached continuation.
                let (l3, q3) = pl.latency(&st[p..]);
                assert_eq!((l2, q2), (l3, q3));
                assert!(
                    (l2 - l).abs() <= 1e-12 * l.abs().max(1.0),
                    "{st:?} m={m} p={p}: {l2} (Q={q2}) vs {l} (Q={q})"
                );
                let (lq, _) = latency(&st, m);
                assert_eq!(q2, q, "{st:?} m={m} p={p}: pivot, L {l2} vs {lq}");
            }
        }
    }

    /// [`Bound`] never exceeds Eq. 2 of a plan that starts with the prefix, whatever the rest.
    #[test]
    fn pivot_bound_holds() {
        let mut rnd = uniform(0x2545_f491_4f6c_dd1du64);
        for _ in 0..200_000 {
            let s = 1 + (rnd() * 9.0) as usize;
            let m = [1, 2, 3, 4, 8, 16, 64][(rnd() * 7.0) as usize];
            let st: Vec<LatStage> = (0..s)
                .map(|_| LatStage {
                    f: rnd().powi(1 + 2 * (rnd() < 0.5) as i32),
                    b: rnd().powi(1 + 2 * (rnd() < 0.5) as i32),
                    ar: if rnd() < 0.5 { 0.0 } else { rnd() },
                })
                .collect();
            let (l, _) = latency(&st, m);
            for p in 0..=s {
                let rest_max = st[p..].iter().map(|x| x.f + x.b).fold(0.0, f64::max);
                let b = Bound::of(&st[..p]).lb(m as f64, rest_max * rnd());
                assert!(
                    b <= l * (1.0 + 1e-12),
                    "{st:?} m={m} p={p}: bound {b} > L {l}"
                );
            }
        }
    }
}
