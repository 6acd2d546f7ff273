//! `--planner dapple --dapple-reference hpgo`: DAPPLE's own public planner, reproduced.
//!
//! DAPPLE's authors published their planner as the Rust crate HPGO (version 0.9.1, in the
//! AlibabaPAI/DAPPLE repository, `src/`). The paper (PPoPP'21 §4) describes a search over stage
//! splits, replica counts and placements that minimises the pipeline latency of Eq. 2; the
//! published code does something simpler (and on DAPPLE's own profiles does not return all of the
//! paper's Table 4 plans), and this module reproduces *that* (re-implemented from reading it, not
//! copied), so pipec's `dapple` planner can be compared with the real artifact on the same
//! profiles. The default `dapple` planner ([`super::dapple`]) is
//! untouched by this mode.
//!
//! # HPGO's model
//! - **States.** The profile is turned into PipeDream's antichain DAG (`Input*` sources and
//!   `__getitem__` sinks left out, [`crate::cost::antichain`]), numbered as HPGO's importer
//!   does ([`StateOrder::Descriptions`]: a depth-first topological sort with states sorted by
//!   module description; the numbering matters, see the quirks below); state `j` has the compute
//!   `C_j` (forward + backward of its down-set), the parameters `P_j` of its down-set and the
//!   output activation `A_j` (the activations of its augmented antichain). A stage `(k, j]` costs
//!   `C_j − C_k`. Times and activations are scaled linearly from the profile batch to the global
//!   batch `GBS` (`--batch`); parameters are not scaled.
//! - **Constants** (`environment/*.rs`): NVLink 25 GB/s inside a server; between servers
//!   1 GB/s point to point and 3 GB/s for NCCL collectives; 16 GB per GPU (declared, never used:
//!   **memory is ignored**). pipec's `--cluster` only gives the topology (servers = its level-0
//!   groups); its bandwidths are not used by the search (they are by pipec's simulator).
//! - **All-reduce** of `P` bytes over `n` GPUs: 0 for `n = 1`; `2P(n−1)/n / 3 GB/s` across
//!   servers; `2P(n−1)/n / 25 GB/s / ⌊n/2⌋` inside one server.
//! - **Split/concat** of `S` bytes from GPU set `a` to set `b`: if `b` spans servers, `S / 3 GB/s`
//!   when `a ∪ b` spans servers, else `S / 25 GB/s`; if `b` is inside one server, `S · r / |a| /
//!   1 GB/s` with `r` the members of `a` outside `b`'s server (`S / 25 GB/s` when `r = 0`).
//! - **Micro-batch**: one sample (`min_micro_batch_size = 1`); a plan that copies its pipeline
//!   `rp` times has `M = ⌊GBS / rp⌋` micro-batches per copy.
//! - **Time** of a plan (`sync_pipeline_speedup_analytical`), with `T` the slowest stage's block
//!   for the whole batch: `L = T/M · (M − 1) + C_total/(rp·M) + Σ_cuts split_concat(A_cut/(rp·M))
//!   + max(0, max_s (AR_s − s·T/M))`: the slowest stage times `M − 1`, one micro-batch's full
//!   pass, the transfers, and the all-reduce left unoverlapped (stage `s`'s all-reduce hides behind
//!   `s` blocks). This is DAPPLE's Eq. 2 with the pivot fixed at the slowest stage, no backward
//!   in the ending phase and the transfers outside the steady state. HPGO maximises `C_total / L`
//!   (its "speedup"); pipec reports `L` as the plan's objective.
//!
//! # HPGO's candidates (`orchestration/orchestrate.rs`)
//! 1. **General search**, for `i = 2..=N` stages-worth of GPUs and `rp = ⌊N/i⌋` copies: a
//!    min–max DP over (state, GPUs, occupancy bitset) whose block time is the stage compute
//!    divided by its GPUs (`C/(m·rp)`), the all-reduce term being commented out. Since
//!    `max(a/p, b/q) ≥ (a+b)/(p+q)`, a split never beats one stage on all `i` GPUs, so this search
//!    always returns **one stage on GPUs `0..i·rp`** (data parallelism on `i·rp` GPUs with
//!    block `C_total/(i·rp)`); this module computes that result in closed form. (In floating
//!    point an exactly balanced split could tie-win by a rounding; HPGO never returned one on the
//!    DAPPLE profiles. An abort inside that DP's allocator calls is not reproduced either.)
//! 2. **Straight pipelines**: the same DP with one GPU per stage per copy, for `i = 2` (`rp = N/2`
//!    copies of a 2-stage pipeline) and `i = N` (`N` stages, one GPU each) when `N > 2` is even,
//!    else `i = N` alone. Placements come from HPGO's allocator ([`Devices::next_cards`]:
//!    Fresh-First, Append-First, Scatter-First, with their quirks); the DP's block of a split
//!    `k → j` is `max(block(k), (C_j − C_k)/rp, split_concat(2·A_k))`, minimised; the plan is
//!    backtracked as HPGO does (its stage tuples keep HPGO's quirky bounds: a non-last stage's
//!    all-reduce counts the parameters up to the next stage's first state).
//! 3. **Every two-way split** `g : N − g` (`g = 1..N−1`, at every state `l`, each placement of
//!    the two groups): block `max(C_l/g, (C_total − C_l)/(N − g), split_concat(A_l))`, `rp = 1`.
//!    (Stage 0's all-reduce counts the parameters up to state `l + 1`, as in HPGO.)
//!
//! The answer is the candidate with the largest speedup; ties go to the last in the order
//! general (`i` ascending), straight (`2`, then `N`), two-way splits (`l`, then `g` ascending,
//! then placements), as rayon's `max_by_key` picks.
//!
//! # Where HPGO is not deterministic, and what this module does
//! HPGO iterates hash maps (Rust's `HashMap` for placements, Python sets for a state's
//! predecessors), so among candidates with *equal* values its choice varies from run to run
//! (e.g. where the 16-stage straight pipeline puts a cut that is not its bottleneck). This
//! module takes the first in a fixed order: predecessor states ascending, placements in the
//! order Fresh-First, Append-First, Scatter-First (first appearance), occupancy bitsets in
//! HPGO's `BTreeMap` order. Where HPGO would abort (a panic: a pipeline block under 1 ms, fewer
//! states than stages, an out-of-range index in its allocator, one device), this mode returns
//! an error saying so.
//!
//! # The plan pipec gets
//! Stage `s` holds the nodes of its states (the excluded `Input*` nodes join the first stage,
//! other left-over nodes their latest producer's stage) on HPGO's GPU ids, all copies of the
//! stage together (replicas = GPUs per stage × `rp`). Micro-batch: `rp` samples (one per
//! pipeline copy) when that divides the batch, else 1, unless `--micro-batch`; schedule DAPPLE's
//! early backward (policy A) unless `--schedule`. `objective_s` is HPGO's `L`; the simulated
//! iteration time is pipec's as for every plan.

use super::planner::Planner;
use crate::cost::antichain::{pipedream_exclusions, stage_of_nodes, Linearization, StateOrder};
use crate::cost::{Cluster, CostGraph};
use crate::plan::{micro_batches, Plan, PlanOptions, StageSpec};
use crate::sim::ScheduleKind;
use pipec_compiler::{Error, PlanOption, Result};
use std::time::Instant;

/// HPGO's NVLink bandwidth, bytes/s (`environment/nvlink.rs`).
pub const NVLINK_BPS: f64 = 25.0 * 1e9;
/// HPGO's point-to-point Ethernet bandwidth, bytes/s (`environment/ethernet.rs`).
pub const ETHERNET_P2P_BPS: f64 = 1.0 * 1e9;
/// HPGO's Ethernet bandwidth for NCCL collectives, bytes/s (`environment/ethernet.rs`).
pub const ETHERNET_NCCL_BPS: f64 = 3.0 * 1e9;
/// HPGO's GPU memory (`environment/device.rs`); declared there and never used by the search.
pub const GPU_MEMORY_BYTES: f64 = 16.0 * 1e9;
/// HPGO's pipeline block below which it aborts (`plan_for`: "ppl time error"), seconds.
pub const MIN_BLOCK_S: f64 = 0.001;
/// Most devices (placements are 128-bit masks).
pub const MAX_DEVICES: usize = 128;
/// Most antichain-DAG states this mode builds (HPGO has no limit; its DP is quadratic in them).
pub const MAX_STATES: usize = 4096;

/// A set of GPU ids (bit `d` = GPU `d`).
pub type Mask = u128;

/// The `--dapple-reference hpgo` planner.
pub struct DappleHpgo;

/// Why HPGO would abort on this input (it panics).
fn abort(what: &str) -> Error {
    Error::option(
        PlanOption::DappleReference,
        "hpgo",
        format!("HPGO aborts on this input ({what}); no reference plan"),
    )
}

/// An allocation policy of HPGO's `next_cards`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    FreshFirst,
    AppendFirst,
    ScatterFirst,
    /// A placement of several rounds (`next_cards_with_replica`).
    Fusion,
}

/// One placement: the occupancy after it and the GPUs it took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alloc {
    pub strategy: Strategy,
    pub occupied: Mask,
    pub gids: Mask,
}

/// HPGO's cluster: `n` GPUs in servers ending at `seps` (exclusive, ascending, last = `n`).
#[derive(Clone, Debug)]
pub struct Devices {
    pub n: usize,
    pub seps: Vec<usize>,
}

fn bit(d: usize) -> Mask {
    1u128 << d
}

fn count(m: Mask) -> usize {
    m.count_ones() as usize
}

/// Insertion-ordered de-duplication by GPU set, as HPGO's `HashMap<gids, _>` but iterated in
/// first-appearance order (a later equal key replaces the value, keeps the place).
fn dedup_push(v: &mut Vec<Alloc>, a: Alloc) {
    match v.iter_mut().find(|x| x.gids == a.gids) {
        Some(x) => *x = a,
        None => v.push(a),
    }
}

impl Devices {
    /// Servers of `cluster`'s level-0 groups (the last one may be partial after `--devices`).
    pub fn of_cluster(cluster: &Cluster) -> Devices {
        let n = cluster.len();
        let per = cluster.levels[0].size.max(1);
        let mut seps: Vec<usize> = (1..).map(|i| i * per).take_while(|&e| e < n).collect();
        seps.push(n);
        Devices { n, seps }
    }

    /// Whether `min`..`max` of the ids lie in different servers (`is_cross_machine_*`).
    fn spans(&self, lo: usize, hi: usize) -> bool {
        let mut l = 0;
        for &r in &self.seps {
            if l <= lo && lo < r && l <= hi && hi < r {
                return false;
            }
            l = r;
        }
        true
    }

    /// `is_cross_machine_within`: the set spans servers (by its least and greatest id).
    pub fn cross_within(&self, g: Mask) -> bool {
        debug_assert!(g != 0);
        self.spans(
            g.trailing_zeros() as usize,
            127 - g.leading_zeros() as usize,
        )
    }

    /// `is_cross_machine_from_to`: `a ∪ b` spans servers (by its least and greatest id).
    pub fn cross_from_to(&self, a: Mask, b: Mask) -> bool {
        self.cross_within(a | b)
    }

    /// Free GPUs per server and whether the server is untouched ("fresh").
    fn availability(&self, bs: Mask) -> Vec<(bool, u32)> {
        let mut start = 0;
        self.seps
            .iter()
            .map(|&end| {
                let used = (start..end).filter(|&d| bs & bit(d) != 0).count();
                let free = (end - start - used) as u32;
                start = end;
                (used == 0, free)
            })
            .collect()
    }

    fn start_of(&self, i: usize) -> usize {
        if i == 0 {
            0
        } else {
            self.seps[i - 1]
        }
    }

    /// `next_cards_with_strategy`, quirks included (Append-First may take occupied GPUs; the
    /// counter wraps as HPGO's release build does; an index past the last GPU is an abort).
    fn with_strategy(
        &self,
        bs: Mask,
        need: u32,
        mut avail: Vec<(bool, u32)>,
        s: Strategy,
    ) -> Result<Option<Alloc>> {
        let n = self.n;
        let mut occ = bs;
        let mut gids: Mask = 0;
        let mut left = need;
        let oob = || abort("an index past the last GPU in its device allocator");
        let occupied = |occ: Mask, j: usize| -> Result<bool> {
            if j >= n {
                Err(oob())
            } else {
                Ok(occ & bit(j) != 0)
            }
        };
        match s {
            Strategy::ScatterFirst => {
                while left > 0 {
                    for (i, a) in avail.iter_mut().enumerate() {
                        if a.1 > 0 && left > 0 {
                            let mut j = self.start_of(i);
                            while occupied(occ, j)? {
                                j += 1;
                            }
                            occ |= bit(j);
                            gids |= bit(j);
                            left -= 1;
                            a.1 -= 1;
                        }
                    }
                    if left > 0 && avail.iter().all(|a| a.1 == 0) {
                        // HPGO loops forever here; `next_cards` asserts enough free GPUs first.
                        return Err(abort("no free GPU left in its scatter-first allocator"));
                    }
                }
            }
            Strategy::FreshFirst | Strategy::AppendFirst => {
                let fresh = s == Strategy::FreshFirst;
                for (i, a) in avail.iter().enumerate() {
                    if a.0 != fresh {
                        continue;
                    }
                    let mut j = self.start_of(i);
                    if a.1 >= left {
                        while occupied(occ, j)? && j < n - 1 {
                            j += 1;
                        }
                        while left > 0 {
                            if j >= n {
                                return Err(oob());
                            }
                            occ |= bit(j);
                            gids |= bit(j);
                            j += 1;
                            left -= 1;
                        }
                    } else {
                        while occupied(occ, j)? {
                            j += 1;
                        }
                        while j < self.seps[i] {
                            occ |= bit(j);
                            gids |= bit(j);
                            j += 1;
                            left = left.wrapping_sub(1);
                        }
                    }
                }
            }
            Strategy::Fusion => unreachable!("not a single-round policy"),
        }
        Ok((left == 0).then_some(Alloc {
            strategy: s,
            occupied: occ,
            gids,
        }))
    }

    /// `next_cards`: the distinct placements of `need` more GPUs after `bs` (Fresh-First,
    /// Append-First, Scatter-First; first appearance order, see the module doc).
    pub fn next_cards(&self, bs: Mask, need: u32) -> Result<Vec<Alloc>> {
        let avail = self.availability(bs);
        let left: u32 = avail.iter().map(|a| a.1).sum();
        if left < need {
            return Err(abort("fewer free GPUs than a placement asks for"));
        }
        let mut out = Vec::with_capacity(3);
        for s in [
            Strategy::FreshFirst,
            Strategy::AppendFirst,
            Strategy::ScatterFirst,
        ] {
            if let Some(a) = self.with_strategy(bs, need, avail.clone(), s)? {
                dedup_push(&mut out, a);
            }
        }
        Ok(out)
    }

    /// `next_cards_with_replica`: `replica` rounds of `need` GPUs each, de-duplicated by the
    /// union of the GPUs taken.
    pub fn next_cards_with_replica(&self, bs: Mask, need: u32, replica: u32) -> Result<Vec<Alloc>> {
        let mut seqs: Vec<(Mask, Mask)> = Vec::new(); // (final occupancy, union of gids)
        self.replica_rounds(bs, need, replica, 0, &mut seqs)?;
        let mut out = Vec::new();
        for (occupied, gids) in seqs {
            dedup_push(
                &mut out,
                Alloc {
                    strategy: Strategy::Fusion,
                    occupied,
                    gids,
                },
            );
        }
        Ok(out)
    }

    fn replica_rounds(
        &self,
        bs: Mask,
        need: u32,
        replica: u32,
        taken: Mask,
        out: &mut Vec<(Mask, Mask)>,
    ) -> Result<()> {
        for a in self.next_cards(bs, need)? {
            if replica <= 1 {
                out.push((a.occupied, taken | a.gids));
            } else {
                self.replica_rounds(a.occupied, need, replica - 1, taken | a.gids, out)?;
            }
        }
        Ok(())
    }

    /// `all_reduce_time`: `size` bytes over the GPUs `g`.
    pub fn all_reduce_time(&self, g: Mask, size: f64) -> f64 {
        let n = count(g);
        if n <= 1 {
            return 0.0;
        }
        let f = (n - 1) as f64 / n as f64;
        if self.cross_within(g) {
            size * 2.0 * f / ETHERNET_NCCL_BPS
        } else {
            size * 2.0 * f / NVLINK_BPS / (n / 2) as f64
        }
    }

    /// `split_concat_all2all_time`: `size` bytes from the GPUs `from` to the GPUs `to`.
    pub fn split_concat_time(&self, from: Mask, to: Mask, size: f64) -> f64 {
        if !self.cross_within(to) {
            let remote = (0..self.n)
                .filter(|&s| from & bit(s) != 0 && self.cross_from_to(bit(s), to))
                .count();
            if remote > 0 {
                size / count(from) as f64 * remote as f64 / ETHERNET_P2P_BPS
            } else {
                size / NVLINK_BPS
            }
        } else if self.cross_from_to(from, to) {
            size / ETHERNET_NCCL_BPS
        } else {
            size / NVLINK_BPS
        }
    }
}

/// HPGO's model of the profile: per state (in the antichain DAG's topological order) the
/// down-set sums at the profile batch, and the scale factor to the global batch.
pub struct Model {
    /// Compute (forward + backward seconds) of each state's down-set at the profile batch.
    pub compute: Vec<f64>,
    /// Parameter bytes of each state's down-set.
    pub params: Vec<f64>,
    /// Output activation bytes of each state (its augmented antichain) at the profile batch.
    pub out_act: Vec<f64>,
    /// `GBS / profile batch`.
    pub factor: f64,
    /// The global batch.
    pub gbs: u64,
    /// The states (for the plan's node sets and the predecessors of each state).
    pub lin: Linearization,
}

impl Model {
    /// Build HPGO's model of `g` at the global batch `gbs` (times on device 0's kind).
    pub fn new(g: &CostGraph, cluster: &Cluster, gbs: u64) -> Result<Model> {
        if g.is_empty() {
            return Err(Error::infeasible("dapple-hpgo", "the graph has no node"));
        }
        let mut excluded = pipedream_exclusions(g);
        if excluded.iter().all(|&e| e) {
            excluded.iter_mut().for_each(|e| *e = false);
        }
        let lin = Linearization::antichain_dag_ordered(
            g,
            &excluded,
            MAX_STATES,
            StateOrder::Descriptions,
        )
        .ok_or_else(|| {
            Error::option(
                PlanOption::DappleReference,
                "hpgo",
                format!("the model's antichain DAG has more than {MAX_STATES} states"),
            )
        })?;
        let kind = cluster.kind_of(0);
        let rb = g.reference_batch;
        let compute = lin.down_sums(|n| {
            let (f, b) = g.times(n, rb, kind);
            f + b
        });
        let params = lin.down_sums(|n| g.nodes[n].parameter_bytes);
        let out_act = lin.antichain_sums(|n| g.nodes[n].activation_bytes);
        Ok(Model {
            compute,
            params,
            out_act,
            factor: gbs as f64 / rb,
            gbs,
            lin,
        })
    }

    /// Number of states.
    pub fn len(&self) -> usize {
        self.compute.len()
    }

    /// True when there is no state.
    pub fn is_empty(&self) -> bool {
        self.compute.is_empty()
    }

    /// `compute_times[i][j]` at the global batch: states `i..=j` (row 0: the down-set of `j`),
    /// `−factor` when `j < i` (HPGO's −1, scaled).
    pub fn ct(&self, i: usize, j: usize) -> f64 {
        let v = if i == 0 {
            self.compute[j]
        } else if j > i - 1 {
            self.compute[j] - self.compute[i - 1]
        } else {
            -1.0
        };
        v * self.factor
    }

    /// `parameter_sizes[i][j]` (not scaled).
    pub fn ps(&self, i: usize, j: usize) -> f64 {
        if i == 0 {
            self.params[j]
        } else if j > i - 1 {
            self.params[j] - self.params[i - 1]
        } else {
            -1.0
        }
    }

    /// `output_activation_sizes[j]` at the global batch.
    pub fn oas(&self, j: usize) -> f64 {
        self.out_act[j] * self.factor
    }
}

/// One stage as HPGO reports it: `(start, end, GPUs per copy, GPU ids)`. `end` is the next
/// stage's `start` for every stage but the last, whose `end` is the last state (see the module
/// doc).
#[derive(Clone, Debug, PartialEq)]
pub struct HStage {
    pub start: usize,
    pub end: usize,
    pub per_copy: u32,
    pub gids: Mask,
}

/// Which of HPGO's searches a candidate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The general search for `i` (one stage on `i·rp` GPUs).
    General { i: u32 },
    /// The straight-pipeline DP with `i` stages.
    Straight { i: u32 },
    /// The best two-way split.
    Bipartition,
}

/// One of HPGO's candidates with its figures.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub source: Source,
    /// Copies of the pipeline.
    pub rp: u32,
    pub stages: Vec<HStage>,
    /// The slowest stage's block for the whole batch (the DP's value).
    pub block: f64,
    /// `C_total / L`.
    pub speedup: f64,
    /// `L`, seconds.
    pub time_s: f64,
}

/// HPGO's comparison (`OrderedFloat`: NaN above everything).
fn ordered(a: f64, b: f64) -> std::cmp::Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(std::cmp::Ordering::Equal),
    }
}

/// Index of the last maximum (rayon's `max_by_key`).
fn last_max(v: &[f64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, &x) in v.iter().enumerate() {
        if best.is_none_or(|b| ordered(x, v[b]) != std::cmp::Ordering::Less) {
            best = Some(i);
        }
    }
    best
}

/// HPGO's run: every candidate, and the index of the chosen one.
pub struct Outcome {
    pub candidates: Vec<Candidate>,
    pub best: usize,
}

/// `sync_pipeline_speedup_analytical`: `(speedup, L)` of stages `p` with `rp` copies and the
/// DP's block `block`.
pub fn speedup(d: &Devices, m: &Model, rp: u32, block: f64, p: &[HStage]) -> (f64, f64) {
    let total = m.ct(0, m.len() - 1);
    let mb = m.gbs / rp as u64; // min_micro_batch_size = 1
    if mb == 0 {
        return (0.0, f64::INFINITY);
    }
    let mf = mb as f64;
    let bt = block / mf;
    let mut len = bt * (mb - 1) as f64 + total / rp as f64 / mf;
    for w in p.windows(2) {
        let cut = m.oas(w[0].end - 1) / rp as f64 / mf;
        len += d.split_concat_time(w[0].gids, w[1].gids, cut);
    }
    let mut delta: f64 = 0.0;
    for (i, s) in p.iter().enumerate() {
        let ar = d.all_reduce_time(s.gids, m.ps(s.start, s.end));
        if ar > i as f64 * bt {
            delta = f64::max(ar - i as f64 * bt, delta);
        }
    }
    let l = len + delta;
    (total / l, l)
}

/// A cell of the straight DP (`MatrixCell`).
#[derive(Clone, Copy, Debug)]
struct Cell {
    block: Option<f64>,
    split: Option<(usize, usize)>,
    ngpus: Option<u32>,
    from: Mask,
    gids: Mask,
}

const EMPTY: Cell = Cell {
    block: None,
    split: None,
    ngpus: None,
    from: 0,
    gids: 0,
};

/// HPGO's `BTreeMap<Vec<bool>, _>` order of occupancies: GPU 0 most significant.
fn key(m: Mask) -> u128 {
    m.reverse_bits()
}

/// One entry `A[j][m]`: the placeholder cell and the cells by occupancy, in HPGO's key order.
#[derive(Clone, Default)]
struct Entry {
    ph: Option<Cell>,
    cells: Vec<(Mask, Cell)>,
}

impl Entry {
    fn get(&self, occ: Mask) -> Option<&Cell> {
        self.cells.iter().find(|(o, _)| *o == occ).map(|(_, c)| c)
    }
}

/// One way to extend a plan ending at state `k` by a stage: from the cell of occupancy `from`
/// to the placement `gids` (its occupancy's id `occ_id`); `pre` is
/// `max(block(k), split_concat(2·A_k))`, the part of the block that does not depend on `j`.
#[derive(Clone, Copy)]
struct Step {
    pre: f64,
    from: Mask,
    gids: Mask,
    occ_id: usize,
}

/// `plan_for(i, true)`: the straight DP with `i` stages of `rp = N / i` copies. The loops are
/// HPGO's (`m`, then `j`, then the predecessors `k`, the cells of `A[k][m−1]`, the
/// placements), with what does not depend on `j` computed once per `k`.
fn straight(d: &Devices, m: &Model, i: u32) -> Result<Candidate> {
    let rp = d.n as u32 / i;
    let l = m.len();
    let mut a: Vec<Vec<Entry>> = vec![vec![Entry::default(); i as usize]; l];
    let first = d.next_cards(0, rp)?;
    let first = first
        .iter()
        .find(|x| x.strategy == Strategy::FreshFirst)
        .or(first.first())
        .copied()
        .ok_or_else(|| abort("no placement for the first stage"))?;
    for (j, row) in a.iter_mut().enumerate() {
        let c = m.ct(0, j);
        let ok = c >= -0.5;
        let cell = Cell {
            block: ok.then(|| f64::max(c / 1.0 / rp as f64, 0.0)),
            split: None,
            ngpus: ok.then_some(1),
            from: 0,
            gids: if ok { first.gids } else { 0 },
        };
        row[0].ph = Some(cell);
        row[0].cells.push((first.occupied, cell));
    }
    let mut replicas: std::collections::HashMap<Mask, Vec<Alloc>> = Default::default();
    let mut occ_ids: std::collections::HashMap<Mask, usize> = Default::default();
    let mut occ_of: Vec<Mask> = Vec::new();
    let mut scratch: Vec<Option<Cell>> = Vec::new();
    let mut touched: Vec<usize> = Vec::new();
    // HPGO reads A[k][·] only for the predecessors k of some state.
    let mut needed = vec![false; l];
    for j in 1..l {
        for &k in m.lin.ancestors(j) {
            needed[k as usize] = true;
        }
    }
    for mm in 1..i as usize {
        // The steps out of every A[k][mm − 1] that HPGO reads.
        let mut steps: Vec<Vec<Step>> = vec![Vec::new(); l];
        for (k, st) in steps.iter_mut().enumerate() {
            if !needed[k] {
                continue;
            }
            let prev = &a[k][mm - 1];
            for &(bs, cell) in &prev.cells {
                if let std::collections::hash_map::Entry::Vacant(e) = replicas.entry(bs) {
                    e.insert(d.next_cards_with_replica(bs, 1, rp)?);
                }
                for nbs in &replicas[&bs] {
                    let itt = d.split_concat_time(cell.gids, nbs.gids, 2.0 * m.oas(k));
                    match prev.ph.map(|c| c.block) {
                        None => continue,
                        Some(None) => return Err(abort("an empty DP cell is read")),
                        Some(Some(b)) if b < -0.5 => continue,
                        _ => {}
                    }
                    let prev_block = cell
                        .block
                        .ok_or_else(|| abort("an empty DP cell is read"))?;
                    let occ_id = *occ_ids.entry(nbs.occupied).or_insert_with(|| {
                        occ_of.push(nbs.occupied);
                        occ_of.len() - 1
                    });
                    st.push(Step {
                        pre: f64::max(prev_block, itt),
                        from: bs,
                        gids: nbs.gids,
                        occ_id,
                    });
                }
            }
        }
        scratch.resize(occ_of.len(), None);
        for (j, row) in a.iter_mut().enumerate().skip(1) {
            let mut cur = row[mm].ph.unwrap_or(EMPTY);
            for &k in m.lin.ancestors(j) {
                let k = k as usize;
                let mut last_stage = m.ct(k + 1, j);
                if last_stage < -0.5 {
                    continue;
                }
                last_stage /= rp as f64;
                for s in &steps[k] {
                    // HPGO: max(max(block(k), last), transfer); max is exact, so the order is free.
                    let pt = f64::max(s.pre, last_stage);
                    if cur.block.is_none_or(|b| pt < b) {
                        cur = Cell {
                            block: Some(pt),
                            split: Some((k, mm - 1)),
                            ngpus: Some(1),
                            from: s.from,
                            gids: s.gids,
                        };
                    }
                    let slot = &mut scratch[s.occ_id];
                    let better = match slot {
                        None => true,
                        Some(c) => c.block.is_some_and(|b| pt < b),
                    };
                    if better {
                        if slot.is_none() {
                            touched.push(s.occ_id);
                        }
                        *slot = Some(Cell {
                            block: Some(pt),
                            split: Some((k, mm - 1)),
                            ngpus: Some(1),
                            from: s.from,
                            gids: s.gids,
                        });
                    }
                }
            }
            let mut cells: Vec<(Mask, Cell)> = touched
                .drain(..)
                .filter_map(|id| scratch[id].take().map(|c| (occ_of[id], c)))
                .collect();
            cells.sort_by_key(|(o, _)| key(*o));
            row[mm].cells = cells;
            row[mm].ph = Some(cur);
        }
    }
    // plan_for: the block, its check, then analyse_plan_sync.
    let top = a[l - 1][i as usize - 1]
        .ph
        .ok_or_else(|| abort("fewer states than pipeline stages"))?;
    let block = top
        .block
        .ok_or_else(|| abort("fewer states than pipeline stages"))?;
    if block < MIN_BLOCK_S {
        return Err(abort("a pipeline block under 1 ms: 'ppl time error'"));
    }
    if top.gids == 0 {
        return Err(abort("'last_machines.is_empty()'"));
    }
    let mut res = Vec::new();
    let mut meta = top;
    let mut prev_split = l - 1;
    while let Some((k, mk)) = meta.split {
        res.push(HStage {
            start: k + 1,
            end: prev_split,
            per_copy: meta.ngpus.unwrap_or(0),
            gids: meta.gids,
        });
        prev_split = k + 1;
        meta = *a[k][mk]
            .get(meta.from)
            .ok_or_else(|| abort("a missing DP cell in its backtracking"))?;
    }
    res.push(HStage {
        start: 0,
        end: prev_split,
        per_copy: meta.ngpus.unwrap_or(0),
        gids: meta.gids,
    });
    res.reverse();
    let (sp, t) = speedup(d, m, rp, block, &res);
    Ok(Candidate {
        source: Source::Straight { i },
        rp,
        stages: res,
        block,
        speedup: sp,
        time_s: t,
    })
}

/// `plan_for(i, false)` in closed form (see the module doc): one stage on GPUs `0..i·rp`.
fn general(d: &Devices, m: &Model, i: u32) -> Result<Candidate> {
    let rp = d.n as u32 / i;
    let l = m.len();
    let block = f64::max(m.ct(0, l - 1) / i as f64 / rp as f64, 0.0);
    if block < MIN_BLOCK_S {
        return Err(abort("a pipeline block under 1 ms: 'ppl time error'"));
    }
    let first = d
        .next_cards(0, i * rp)?
        .into_iter()
        .find(|x| x.strategy == Strategy::FreshFirst)
        .or_else(|| d.next_cards(0, i * rp).ok()?.into_iter().next())
        .ok_or_else(|| abort("no placement for data parallelism"))?;
    let stages = vec![HStage {
        start: 0,
        end: l - 1,
        per_copy: i,
        gids: first.gids,
    }];
    let (sp, t) = speedup(d, m, rp, block, &stages);
    Ok(Candidate {
        source: Source::General { i },
        rp,
        stages,
        block,
        speedup: sp,
        time_s: t,
    })
}

/// `compute_bipartition`: the best `g : N − g` split (last maximum in HPGO's order).
fn bipartition(d: &Devices, m: &Model) -> Result<Candidate> {
    let l = m.len();
    let n = d.n as u32;
    let mut best: Option<Candidate> = None;
    for s in 0..l.saturating_sub(1) {
        let c0 = m.ct(0, s);
        let c1 = m.ct(s + 1, l - 1);
        for g in 1..n {
            for g1 in d.next_cards(0, g)? {
                for g2 in d.next_cards(g1.occupied, n - g)? {
                    let comp = f64::max(c0 / count(g1.gids) as f64, c1 / count(g2.gids) as f64);
                    let comm = d.split_concat_time(g1.gids, g2.gids, m.oas(s));
                    let block = f64::max(comp, comm);
                    let stages = vec![
                        HStage {
                            start: 0,
                            end: s + 1,
                            per_copy: count(g1.gids) as u32,
                            gids: g1.gids,
                        },
                        HStage {
                            start: s + 1,
                            end: l - 1,
                            per_copy: count(g2.gids) as u32,
                            gids: g2.gids,
                        },
                    ];
                    let (sp, t) = speedup(d, m, 1, block, &stages);
                    if best
                        .as_ref()
                        .is_none_or(|b| ordered(sp, b.speedup) != std::cmp::Ordering::Less)
                    {
                        best = Some(Candidate {
                            source: Source::Bipartition,
                            rp: 1,
                            stages,
                            block,
                            speedup: sp,
                            time_s: t,
                        });
                    }
                }
            }
        }
    }
    best.ok_or_else(|| abort("no two-way split: one device or one state"))
}

/// HPGO's `orchestrate()` and its choice (`py_orchestrate`).
pub fn orchestrate(d: &Devices, m: &Model) -> Result<Outcome> {
    if m.is_empty() {
        return Err(Error::infeasible("dapple-hpgo", "the graph has no state"));
    }
    let n = d.n as u32;
    let mut candidates = Vec::new();
    for i in 2..=n {
        candidates.push(general(d, m, i)?);
    }
    let straight_is: Vec<u32> = if n > 2 && n.is_multiple_of(2) {
        vec![2, n]
    } else {
        vec![n]
    };
    for i in straight_is {
        candidates.push(straight(d, m, i)?);
    }
    candidates.push(bipartition(d, m)?);
    let sp: Vec<f64> = candidates.iter().map(|c| c.speedup).collect();
    let best = last_max(&sp).ok_or_else(|| abort("no candidate"))?;
    Ok(Outcome { candidates, best })
}

/// The node sets of `stages` (HPGO's tuples), as pipec stage specs on HPGO's GPU ids.
pub fn specs(g: &CostGraph, m: &Model, stages: &[HStage]) -> Vec<StageSpec> {
    let l = m.len();
    // A non-last stage ends before the next one's first state; the last at the last state.
    let ends: Vec<usize> = stages
        .iter()
        .enumerate()
        .map(|(s, st)| {
            if s + 1 == stages.len() {
                l - 1
            } else {
                st.end - 1
            }
        })
        .collect();
    let stage_of = stage_of_nodes(g, &m.lin, &ends);
    let mut out: Vec<StageSpec> = stages
        .iter()
        .map(|st| StageSpec {
            nodes: Vec::new(),
            devices: (0..128).filter(|&x| st.gids & bit(x) != 0).collect(),
        })
        .collect();
    for &u in g.topo_order() {
        out[stage_of[u]].nodes.push(u);
    }
    out.retain(|s| !s.nodes.is_empty());
    out
}

impl Planner for DappleHpgo {
    fn name(&self) -> &'static str {
        "dapple-hpgo"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        if cluster.len() > MAX_DEVICES {
            return Err(Error::option(
                PlanOption::DappleReference,
                "hpgo",
                format!("at most {MAX_DEVICES} devices (got {})", cluster.len()),
            ));
        }
        if cluster.len() < 2 {
            return Err(abort("one device: its two-way split search is empty"));
        }
        let gbs = opts.batch.max(1);
        let d = Devices::of_cluster(cluster);
        let m = Model::new(g, cluster, gbs)?;
        let out = orchestrate(&d, &m)?;
        let best = &out.candidates[out.best];
        let specs = specs(g, &m, &best.stages);
        let used = best.stages.iter().map(|s| s.gids).fold(0, |a, b| a | b);
        if best.stages.iter().map(|s| count(s.gids)).sum::<usize>() != count(used) {
            return Err(Error::option(
                PlanOption::DappleReference,
                "hpgo",
                "HPGO's plan puts two stages on one GPU; pipec cannot represent it",
            ));
        }
        let mb = match opts.micro_batch() {
            Some(mb) => mb,
            None => {
                let rp = best.rp as u64;
                if micro_batches(gbs, rp).is_ok() {
                    rp
                } else {
                    1
                }
            }
        };
        let search = t0.elapsed().as_secs_f64();
        let schedule = opts.schedule.unwrap_or(ScheduleKind::DappleA);
        Plan::assemble(
            self.name(),
            g,
            cluster,
            opts,
            specs,
            mb,
            schedule,
            best.time_s,
            search,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(seps: &[usize]) -> Devices {
        Devices {
            n: *seps.last().unwrap(),
            seps: seps.to_vec(),
        }
    }

    fn mask(ids: &[usize]) -> Mask {
        ids.iter().fold(0, |a, &d| a | bit(d))
    }

    #[test]
    fn allocator_policies_on_two_servers() {
        let d = devs(&[8, 16]);
        // Empty: Fresh-First and Scatter-First.
        let v = d.next_cards(0, 3).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(v[0].gids, mask(&[0, 1, 2]));
        assert_eq!(v[0].strategy, Strategy::FreshFirst);
        assert_eq!(v[1].gids, mask(&[0, 8, 1]));
        // Same set from two policies: one entry, the later policy's label.
        let v = d.next_cards(0, 16).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].strategy, Strategy::ScatterFirst);
        // Append-First takes the next GPU of the server in use.
        let v = d.next_cards(mask(&[0, 1]), 1).unwrap();
        let sets: Vec<Mask> = v.iter().map(|a| a.gids).collect();
        assert_eq!(sets, vec![mask(&[8]), mask(&[2])]);
        // Eight rounds of one GPU after server 0: server 1.
        let v = d
            .next_cards_with_replica(mask(&[0, 1, 2, 3, 4, 5, 6, 7]), 1, 8)
            .unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].gids, mask(&[8, 9, 10, 11, 12, 13, 14, 15]));
    }

    #[test]
    fn append_first_quirk_takes_an_occupied_gpu() {
        // GPUs 0 and 2 used: Append-First starts at the first free one (1) and takes 1, 2.
        let d = devs(&[8, 16]);
        let avail = d.availability(mask(&[0, 2]));
        assert_eq!(avail, vec![(false, 6), (true, 8)]);
        let a = d
            .with_strategy(mask(&[0, 2]), 2, avail, Strategy::AppendFirst)
            .unwrap()
            .unwrap();
        assert_eq!(a.gids, mask(&[1, 2]));
    }

    #[test]
    fn comm_constants() {
        let d = devs(&[8, 16]);
        // All-reduce of 1 GB inside a server over 8 GPUs: 2·7/8 GB / 25 GB/s / 4.
        let t = d.all_reduce_time(mask(&[0, 1, 2, 3, 4, 5, 6, 7]), 1e9);
        assert!((t - 2.0 * 7.0 / 8.0 / 25.0 / 4.0).abs() < 1e-15);
        // Across servers: 3 GB/s.
        let t = d.all_reduce_time(mask(&[7, 8]), 1e9);
        assert!((t - 1.0 / 3.0).abs() < 1e-15);
        // 15 GPUs to the last one (in server 1): 7 of 15 senders remote, 1 GB/s.
        let from = mask(&(0..15).collect::<Vec<_>>());
        let t = d.split_concat_time(from, mask(&[15]), 1e9);
        assert!((t - 8.0 / 15.0).abs() < 1e-15);
        // To a group spanning servers: 3 GB/s.
        let t = d.split_concat_time(mask(&[0]), mask(&[7, 8]), 3e9);
        assert!((t - 1.0).abs() < 1e-15);
    }

    #[test]
    fn last_maximum_wins_ties() {
        assert_eq!(last_max(&[1.0, 3.0, 2.0, 3.0]), Some(3));
        assert_eq!(last_max(&[1.0, f64::NAN, 2.0]), Some(1));
        assert_eq!(last_max(&[]), None);
    }
}
