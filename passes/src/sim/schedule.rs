//! Pipeline schedules as explicit per-device instruction lists (what codegen will emit).
//!
//! Every replica of stage `s` runs the same list for its slice of each micro-batch. The lists
//! differ only in the number of forward passes `K_s` a stage runs before its first backward
//! (its warm-up); after it, each stage alternates one backward and one forward (early backward)
//! until the forwards run out, then drains its backwards. With `depth(s)` the number of stages on
//! the longest path from `s` to a sink of the stage DAG (for a chain of `S` stages, stage `i`
//! 0-based: `S − i`):
//!
//! | schedule | `K_s` | source |
//! |---|---|---|
//! | `gpipe` | `M` (all forwards, then all backwards) | GPipe |
//! | `1f1b`, `dapple-a` | `min(depth(s), M)` | PipeDream-Flush; DAPPLE policy A `K_i = min(S − i, D)` |
//! | `dapple-b` | `min(2·depth(s) − 1, M)` | DAPPLE policy B `K_i = min(2(S − i) − 1, D)` |
//! | `1f1b-so` | `min(2·depth(s), M)` | BaPipe 1F1B-SO: warm-up doubled, features `2(N−i+1)a` |
//! | `gpp` | `min(depth(s), M)` on the stage DAG | GraphPipe App. A.1, default row: `i_x = max_y i_y + b` |
//! | `kfkb-K` | `min(K + 2·(depth(s) − 1), M)`, then `K` backwards / `K` forwards | GraphPipe §6 kFkB, App. A.1 row 8 |
//! | `gpipe-recompute` | `M`, backward re-runs the forward | GPipe §2.3 re-materialisation |
//! | `1f1b-recompute` | `min(depth(s), M)`, backward re-runs the forward | DAPPLE "+ RC" (Table 6) |
//! | `1f1b-rr` | `min(⌈W(s)/r_s⌉, M_k)` of the replica's own micro-batches | PipeDream 1F1B-RR (§3.3, NOAM) |
//! | `zb-h1` | `min(depth(s), M)`, backward split into `B` and `W`, `W` lagging by `max depth − depth(s)` | Qi et al. 2023 §3.1 ZB-H1 |
//! | `zb-h2` | `min(2·depth(s) − 1, M)`, backward split, `W` lagging by `2·(max depth − depth(s))` | Qi et al. 2023 §3.1 ZB-H2 |
//! | `pipedream-async` | `min(depth(s), M)`, an all-reduce and optimizer step after every backward, weight stashing | PipeDream §3.3–3.4 |
//! | `interleaved-V` | `V` stages per device group, round robin; Megatron's order ([`interleaved_order`]) | Narayanan et al. SC'21 §2.2 |
//! | `zbv` | 2 stages per device group as a V, backward split; ZB-V's order ([`zbv_order`]) | Qi et al. 2024 §6 ZB-V |
//!
//! **Re-computation** (GPipe's re-materialisation, DAPPLE's "RC"): the `*-recompute` kinds emit the
//! same instruction order as their base kind, and a `Backward` stands for "re-run the forward of
//! the micro-batch from its saved stage input, then the backward". The simulator costs them on
//! [`StageGraph::with_recomputation`] (`B' = B + F`, only the stage input saved per in-flight
//! micro-batch): GPipe with `S` equal stages takes `(M + S − 1)(2F + B)` instead of
//! `(M + S − 1)(F + B)`, and its activation memory drops from `M·a_s` to `M·in_s + a_s`
//! (GPipe §2.3: `O(N + L/K · N/M)` instead of `O(N·L/K)`).
//!
//! **Round robin** (`1f1b-rr`, PipeDream's 1F1B-RR, §3.3 "each stage replica processes a whole
//! minibatch; minibatches are assigned round robin"): replica `k` of a stage with `r` replicas runs
//! the micro-batches `m ≡ k (mod r)` at the *full* micro-batch size (no split/concat), each
//! micro-batch going from replica `m mod r_s` to replica `m mod r_t`. Its warm-up generalises
//! PipeDream's `NOAM = ⌈(# machines) / (# machines in the input stage)⌉` to every stage: with
//! `W(s)` the most workers (replicas summed) on a path from `s` to a sink, a replica runs
//! `⌈W(s)/r_s⌉` of its own forwards before its first backward. In steady state a stage with
//! per-micro-batch time `T_s` on one replica then accepts one micro-batch every `T_s / r_s`, the
//! stage time of PipeDream's optimizer (`A(j, m) = T/m`); the slowest `T_s / r_s` sets the pace.
//! All other kinds split every micro-batch evenly over a stage's replicas (DAPPLE §3.3).
//!
//! **kFkB** (`kfkb-K`, GraphPipe §6 footnote 2: a schedule "starts with `ℓ` forward passes (for
//! warm-up), alternates between `k` backward and `k` forward passes, and ends with `ℓ` backward
//! passes"): every stage uses the same `K` and micro-batch. Its in-flight count is Appendix A.1's
//! [`crate::sim::in_flight::in_flight_samples`] with uniform `k = K`, `b = 1`: a sink holds `K`, and
//! each stage edge adds `2` (row 8, `max(b_x, b_y) < k_y b_y = k_x b_x`, for `K ≥ 2`; row 7 adds
//! `1` for `K = 1`, which is `gpp`), so `K_s = K + 2·(depth(s) − 1)` on the longest path. Larger
//! `K` groups `K` forwards (and backwards) back to back — fewer switches between directions — at
//! the price of more micro-batches in flight.
//!
//! **Zero bubble** (`zb-h1`, Qi et al., "Zero Bubble Pipeline Parallelism", 2023, §3.1): each
//! backward of a stage that sends input gradients upstream is two tasks, `B` (the input
//! gradients, sent at once) and `W` (the weight gradients, [`Instr::WeightGrad`]); the forwards
//! and `B`s keep 1F1B's order and `W` trails by [`weight_lag`] backwards, the rest closing the
//! step ([`with_weight_passes`], the rule DeepSpeed's and torch's ZB-H1 use on chains, here on the
//! stage DAG). With `S` equal stages, `M ≥ S` and free communication an iteration takes
//! `M(F+B+W) + (S−1)(max(F,W)+B−W)` (the paper's `(S−1)(F+B−W)` bubble for `W ≤ F`) where 1F1B
//! takes `(M+S−1)(F+B+W)`, and no stage holds more than `S` micro-batches, 1F1B's first-stage
//! count (`passes/tests/sim_closed_forms.rs`). On a stage DAG or with unequal stages a plan's
//! zero-bubble schedule then has its `W`s moved into the waits a simulation finds
//! ([`crate::sim::fill`]; the closed forms are of this generator's order).
//!
//! `zb-h2` (same section) adds forwards to the warm-up, DAPPLE policy B's `2·depth(s) − 1`, so no
//! stage waits for its first backward, and lags `W` twice as far ([`weight_lag`]). With `S` equal
//! stages, `M ≥ 2S − 1` and free communication an iteration takes `M(F+B+W) + (S−1)F`: the last
//! stage cannot start before `S − 1` forwards have run and then never idles, so no synchronous
//! schedule (one that ends every iteration with the flush below) is shorter. The paper's ZB-H2
//! also moves the optimizer step's synchronisation out of the way ("post-validation", §4) so
//! that the next iteration's warm-up overlaps this one's tail; pipec keeps the flush, so the
//! `(S−1)F` stays. Every stage holds up to `2S − 1` micro-batches.
//!
//! **PipeDream's asynchronous 1F1B** (`pipedream-async`, Narayanan et al. 2019, §3.3–3.4):
//! 1F1B's order (`K_s = min(depth(s), M)`, PipeDream's NOAM for one replica per stage) without
//! the flush: after each backward the stage all-reduces that micro-batch's gradients over its
//! replicas and steps its optimizer, so micro-batch `j`'s forward on stage `i` reads the
//! parameters after the updates of the micro-batches whose backward ran there before it
//! (`j − (S − i) + 1` of them in steady state on a chain, stage `i` 0-based: PipeDream's
//! staleness). **Weight
//! stashing** ([`stashed`]) makes the backward of `j` use the version its forward read. One
//! program covers `M` micro-batches; successive runs of it (`pipec run --steps`) drain the
//! pipeline between them, so the steady state is the `M ≫ S` limit.
//!
//! The synchronous schedules all end with the flush: after its last backward, a replicated stage
//! all-reduces its gradients over its replicas, then every device applies the optimizer step.

pub use super::kind::ScheduleKind;
use super::stage_graph::{PerStage, StageGraph};
use crate::cost::comm::routes;
use serde::Serialize;

/// Direction of a transfer between stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Dir {
    /// Forward activations (producer → consumer).
    Act,
    /// Backward gradients (consumer → producer).
    Grad,
}

/// One instruction of a device's program.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Instr {
    /// Forward pass of micro-batch `mb` (this replica's slice) of `stage`.
    Forward { stage: usize, mb: usize },
    /// Backward pass of micro-batch `mb`; accumulates the weight gradients. Under a schedule
    /// that splits the backward ([`ScheduleKind::splits_backward`]) only its input-gradient part.
    Backward { stage: usize, mb: usize },
    /// The weight-gradient part of micro-batch `mb`'s split backward; accumulates the weight
    /// gradients.
    WeightGrad { stage: usize, mb: usize },
    /// Send `bytes` of micro-batch `mb` to device `peer` (of stage `to`), for its micro-batch
    /// `peer_mb` (the same index unless the stages' micro-batch sizes differ): a split/concat
    /// piece when replica counts or micro-batch sizes differ.
    Send {
        dir: Dir,
        stage: usize,
        to: usize,
        mb: usize,
        peer_mb: usize,
        peer: usize,
        bytes: f64,
    },
    /// Receive `bytes` of micro-batch `mb` from device `peer` (of stage `from`), out of its
    /// micro-batch `peer_mb`.
    Recv {
        dir: Dir,
        stage: usize,
        from: usize,
        mb: usize,
        peer_mb: usize,
        peer: usize,
        bytes: f64,
    },
    /// All-reduce of the stage's gradients (`bytes`) over the devices `group`.
    AllReduce {
        stage: usize,
        group: Vec<usize>,
        bytes: f64,
    },
    /// Apply the optimizer to the stage's parameters.
    OptimizerStep { stage: usize },
}

impl Instr {
    /// The pass a compute of a micro-batch runs, `(pass, stage, mb)`; `None` for messages,
    /// all-reduces and steps.
    pub fn pass(&self) -> Option<(Pass, usize, usize)> {
        match *self {
            Instr::Forward { stage, mb } => Some((Pass::Fwd, stage, mb)),
            Instr::Backward { stage, mb } => Some((Pass::Bwd, stage, mb)),
            Instr::WeightGrad { stage, mb } => Some((Pass::Wgt, stage, mb)),
            _ => None,
        }
    }
}

/// A schedule: the instruction list of every device (empty for devices no stage uses).
#[derive(Clone, Debug, Serialize)]
pub struct Schedule {
    pub kind: ScheduleKind,
    pub micro_batches: usize,
    /// Micro-batches of every stage (`micro_batches` each, unless per-stage sizes differ).
    pub stage_micro_batches: Vec<usize>,
    /// Warm-up forwards `K_s` per stage (for `1f1b-rr`: of one replica's own micro-batches).
    pub warmup: Vec<usize>,
    /// `programs[d]`: the ordered instructions of device `d`.
    pub programs: Vec<Vec<Instr>>,
}

/// The forward/backward order of one stage: `K` forwards, then backward/forward pairs, then the
/// remaining backwards. `true` = forward.
pub fn fb_order(k: usize, m: usize) -> Vec<(bool, usize)> {
    fb_order_grouped(k, 1, m)
}

/// The kFkB order (GraphPipe §6): `warmup` forwards, then `group` backwards and `group` forwards
/// in turn while forwards remain, then the remaining backwards. `group = 1` is [`fb_order`].
pub fn fb_order_grouped(warmup: usize, group: usize, m: usize) -> Vec<(bool, usize)> {
    let mut out = Vec::with_capacity(2 * m);
    let (k, group) = (warmup.min(m), group.max(1));
    let (mut nf, mut nb) = (0, 0);
    while nf < k {
        out.push((true, nf));
        nf += 1;
    }
    while nb < m {
        for _ in 0..group.min(m - nb) {
            out.push((false, nb));
            nb += 1;
        }
        for _ in 0..group.min(m - nf) {
            out.push((true, nf));
            nf += 1;
        }
    }
    out
}

/// One pass of a stage's order ([`with_weight_passes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pass {
    Fwd,
    /// The backward, or its input-gradient part when a weight pass follows.
    Bwd,
    /// The weight-gradient part of a split backward.
    Wgt,
}

/// How many backwards stage `s`'s weight passes trail its backwards by, with `behind = max
/// depth − depth(s)` the micro-batches its warm-up is shorter than the deepest stage's (on a
/// chain of `S` stages, stage `i`'s `i`):
/// - `zb-h1`: `behind`. A stage then holds at most `K_s + lag = max depth` micro-batches of
///   activations, the first stage's 1F1B count (Qi et al. §3.1: ZB-H1 keeps 1F1B's peak
///   memory), and the stages that idle longest at the end of 1F1B fill that time with `W`.
/// - `zb-h2`: `2·behind`. With its warm-up `K_s = 2·depth(s) − 1` every stage holds up to
///   `K_s + lag = 2·max depth − 1` micro-batches (the paper's `(2p − 1)·M_B`), and on a chain the
///   stages' busy spans become a parallelogram: stage `i` starts after `i` forwards and runs
///   without a gap to the end, its last `W`s overlapping the backwards still coming up the
///   pipeline.
pub fn weight_lag(kind: ScheduleKind, depth: &[usize], s: usize) -> usize {
    let deepest = depth.iter().copied().max().unwrap_or(0);
    let behind = deepest.saturating_sub(depth.get(s).copied().unwrap_or(deepest));
    match kind {
        ScheduleKind::ZbH2 => 2 * behind,
        _ => behind,
    }
}

/// A stage's forward/backward `order` (backwards in micro-batch order, as [`fb_order_grouped`]
/// makes them) with weight passes: after the `j`-th backward, the weight pass of micro-batch
/// `j − lag` (none while `j < lag`), the rest at the end. `split = false`: the order as it is.
pub fn with_weight_passes(order: &[(bool, usize)], split: bool, lag: usize) -> Vec<(Pass, usize)> {
    let mut out = Vec::with_capacity(order.len() * 3 / 2);
    let mut waiting = std::collections::VecDeque::new();
    for &(fwd, mb) in order {
        if fwd {
            out.push((Pass::Fwd, mb));
            continue;
        }
        out.push((Pass::Bwd, mb));
        if split {
            waiting.push_back(mb);
            if waiting.len() > lag {
                out.extend(waiting.pop_front().map(|w| (Pass::Wgt, w)));
            }
        }
    }
    out.extend(waiting.into_iter().map(|w| (Pass::Wgt, w)));
    out
}

/// The micro-batches of a stage's forward/backward `order` that need **weight stashing** under
/// PipeDream's asynchronous 1F1B (§3.3): those whose forward and backward have another
/// micro-batch's backward, hence an optimizer step, between them, so that the backward would
/// otherwise see newer parameters than the forward did. `stashed(order)[mb]`; the stage then
/// keeps one copy of its parameters per such micro-batch from its forward to its backward (on a
/// chain of `S` stages, stage `i` holds up to `S − i` copies besides the live version, one per
/// micro-batch in flight as in PipeDream; the last stage none).
pub fn stashed(order: &[(bool, usize)]) -> Vec<bool> {
    let m = order.iter().map(|&(_, mb)| mb + 1).max().unwrap_or(0);
    let mut out = vec![false; m];
    let mut open: Vec<usize> = Vec::new();
    for &(fwd, mb) in order {
        if fwd {
            open.push(mb);
        } else {
            open.retain(|&x| x != mb);
            for &x in &open {
                out[x] = true;
            }
        }
    }
    out
}

/// Under per-micro-batch updates (an optimizer step after every backward): per micro-batch of a
/// stage's forward/backward `order` (`(is_forward, mb)`), the steps that run before its forward,
/// i.e. the weight version the forward reads. `out[mb]`, sized as [`stashed`]'s. Codegen places
/// a tied parameter's stashes by it and the simulator holds their copies by it.
pub fn steps_before_forward(order: &[(bool, usize)]) -> Vec<usize> {
    let m = order.iter().map(|&(_, mb)| mb + 1).max().unwrap_or(0);
    let mut out = vec![0; m];
    let mut done = 0;
    for &(fwd, mb) in order {
        if fwd {
            out[mb] = done;
        } else {
            done += 1;
        }
    }
    out
}

/// Generate the instruction lists of every device for `m` micro-batches.
pub fn generate(sg: &StageGraph, kind: ScheduleKind, m: usize) -> Schedule {
    if kind.round_robin() {
        return generate_round_robin(sg, kind, m);
    }
    if let (ScheduleKind::GppPerStage, Some(ps)) = (kind, &sg.per_stage) {
        return generate_per_stage(sg, ps, m);
    }
    if kind.chunks() > 1 {
        return generate_interleaved(sg, kind, m);
    }
    let ndev = device_count(sg);
    let mut programs: Vec<Vec<Instr>> = vec![Vec::new(); ndev];
    let depth = sg.depth_to_sink();
    let mut warmup = Vec::with_capacity(sg.stages.len());
    for (s, st) in sg.stages.iter().enumerate() {
        let k = kind.warmup(depth[s], m);
        warmup.push(k);
        let (r, rr) = (st.devices.len(), sg.is_round_robin(s));
        for (j, &d) in st.devices.iter().enumerate() {
            let prog = &mut programs[d];
            // The stage's order over all micro-batches; a round-robin replica keeps its own.
            let order = fb_order_grouped(k, kind.group(), m);
            let lag = weight_lag(kind, &depth, s);
            for (pass, mb) in with_weight_passes(&order, sg.splits_backward(s, kind), lag) {
                if rr && mb % r != j {
                    continue;
                }
                push_pass(prog, sg, kind, s, j, pass, mb);
            }
            if !kind.per_micro_batch_step() {
                push_flush(prog, &[s], sg, d);
            }
        }
    }
    Schedule {
        kind,
        micro_batches: m,
        stage_micro_batches: vec![m; sg.stages.len()],
        warmup,
        programs,
    }
}

/// The parts of stage `t`'s micro-batches for redistribution: its replicas' even slices, or one
/// part for a round-robin stage ([`StageGraph::round_robin`]), which holds each micro-batch
/// whole on one replica.
fn parts(sg: &StageGraph, t: usize) -> usize {
    if sg.is_round_robin(t) {
        1
    } else {
        sg.stages[t].devices.len()
    }
}

/// The device holding part `part` of stage `t`'s micro-batch `mb`: replica `part`, or under
/// round robin replica `mb mod r`.
fn part_device(sg: &StageGraph, t: usize, part: usize, mb: usize) -> usize {
    let devs = &sg.stages[t].devices;
    if sg.is_round_robin(t) {
        devs[mb % devs.len()]
    } else {
        devs[part]
    }
}

/// The messages of stage edge `e` for micro-batch `mb` at part `me` of stage `s`, one of the
/// edge's ends: its parts by [`routes`], activations from the producer to the consumer, or
/// gradients back (none when no gradient flows on the edge).
fn push_edge(
    prog: &mut Vec<Instr>,
    sg: &StageGraph,
    e: usize,
    dir: Dir,
    (s, me, mb): (usize, usize, usize),
) {
    let ed = &sg.edges[e];
    let (bytes, whole) = match dir {
        Dir::Act => (ed.bytes, ed.whole_bytes),
        Dir::Grad if ed.grad_tensors == 0 => return,
        Dir::Grad => (ed.grad_bytes, ed.whole_grad_bytes),
    };
    let consumer = s == ed.dst;
    let other = if consumer { ed.src } else { ed.dst };
    // The consumer sends gradients, the producer activations.
    let sends = consumer == (dir == Dir::Grad);
    for (i, jj, b) in routes(parts(sg, ed.src), parts(sg, ed.dst), bytes, whole) {
        let (mine, theirs) = if consumer { (jj, i) } else { (i, jj) };
        if mine != me {
            continue;
        }
        let peer = part_device(sg, other, theirs, mb);
        prog.push(if sends {
            Instr::Send {
                dir,
                stage: s,
                to: other,
                mb,
                peer_mb: mb,
                peer,
                bytes: b,
            }
        } else {
            Instr::Recv {
                dir,
                stage: s,
                from: other,
                mb,
                peer_mb: mb,
                peer,
                bytes: b,
            }
        });
    }
}

/// One pass of replica `j` of stage `s` on micro-batch `mb`, with its messages: a forward
/// receives its inputs' parts, computes and sends its outputs' parts; a backward (or its
/// input-gradient part) receives the cotangents, computes and sends the input gradients (then,
/// under per-micro-batch updates, the all-reduces and step); a weight-gradient part computes.
fn push_pass(
    prog: &mut Vec<Instr>,
    sg: &StageGraph,
    kind: ScheduleKind,
    s: usize,
    j: usize,
    pass: Pass,
    mb: usize,
) {
    let me = if sg.is_round_robin(s) { 0 } else { j };
    if pass == Pass::Wgt {
        prog.push(Instr::WeightGrad { stage: s, mb });
    } else if pass == Pass::Fwd {
        for &e in &sg.in_edges[s] {
            push_edge(prog, sg, e, Dir::Act, (s, me, mb));
        }
        prog.push(Instr::Forward { stage: s, mb });
        for &e in &sg.out_edges[s] {
            push_edge(prog, sg, e, Dir::Act, (s, me, mb));
        }
    } else {
        for &e in &sg.out_edges[s] {
            push_edge(prog, sg, e, Dir::Grad, (s, me, mb));
        }
        prog.push(Instr::Backward { stage: s, mb });
        for &e in &sg.in_edges[s] {
            push_edge(prog, sg, e, Dir::Grad, (s, me, mb));
        }
        if kind.per_micro_batch_step() {
            let st = &sg.stages[s];
            push_flush(prog, &[s], sg, st.devices[j]);
        }
    }
}

/// The layout of a schedule with several chunks per device group ([`ScheduleKind::chunks`]
/// `= v`): the stage graph's `S = v·P` stages on `P` device groups, stage `s` on the devices
/// of stage [`ScheduleKind::group_of`]`(s, P)` (the same list, so replica `j` of every chunk of
/// a group is on one device): round robin under interleaved 1F1B, a V under ZB-V. The `P`
/// stages that define the groups are on disjoint devices, and every stage edge goes from a
/// lower stage to a higher one. `Ok(P)`, or what is wrong.
pub fn interleaved_groups(
    sg: &StageGraph,
    kind: ScheduleKind,
) -> std::result::Result<usize, String> {
    let (n, v) = (sg.stages.len(), kind.chunks());
    if v < 2 || n < 2 * v || !n.is_multiple_of(v) {
        return Err(format!(
            "{kind} needs {v} stages per device group and at least 2 groups; the plan has {n} stages"
        ));
    }
    let p = n / v;
    let mut seen = std::collections::BTreeSet::new();
    for r in 0..p {
        for &d in &sg.stages[r].devices {
            if !seen.insert(d) {
                return Err(format!(
                    "{kind}: device {d} is in two of the first {p} stages (the device groups)"
                ));
            }
        }
    }
    for s in p..n {
        let g = kind.group_of(s, p);
        if sg.stages[s].devices != sg.stages[g].devices {
            return Err(format!(
                "{kind}: stage {s} must run on the devices of stage {g} ({:?}), not {:?}",
                sg.stages[g].devices, sg.stages[s].devices
            ));
        }
    }
    if let Some(e) = sg.edges.iter().find(|e| e.src >= e.dst) {
        return Err(format!(
            "{kind}: stage {} feeds stage {}, an earlier one",
            e.src, e.dst
        ));
    }
    Ok(p)
}

/// Megatron-LM's interleaved 1F1B order of the device group of rank `r` of `p`, `v` chunks,
/// `m` micro-batches (a multiple of `p`): `(is_forward, chunk, micro-batch)`. The micro-batches
/// go through the chunks in groups of `p`: forwards run chunk 0 on micro-batches `0..p`, chunk 1
/// on the same, ..., chunk `v − 1`, then the next `p` micro-batches; backwards the same with the
/// chunks from last to first. The device runs `W = min(2·(p − r − 1) + (v − 1)·p, v·m)` of these
/// forwards, then one forward and one backward in turn, then the remaining backwards
/// (Narayanan et al., SC'21, §2.2; Megatron-LM's `forward_backward_pipelining_with_interleaving`).
/// With equal chunks and free communication an iteration takes `m·(F + B) + (p − 1)·(F + B)/v`
/// (`F`, `B`: one micro-batch's forward and backward over a group's `v` chunks), against
/// 1F1B's `(m + p − 1)·(F + B)`.
pub fn interleaved_order(r: usize, p: usize, v: usize, m: usize) -> Vec<(bool, usize, usize)> {
    let total = v * m;
    let warm = (2 * (p - r - 1) + (v - 1) * p).min(total);
    let at = |k: usize, forward: bool| {
        let (round, within) = (k / (p * v), k % (p * v));
        let chunk = within / p;
        let chunk = if forward { chunk } else { v - 1 - chunk };
        (chunk, round * p + within % p)
    };
    fb_order((warm + 1).min(total), total)
        .into_iter()
        .map(|(f, k)| {
            let (c, mb) = at(k, f);
            (f, c, mb)
        })
        .collect()
}

/// ZB-V's order of the device group of rank `r` of `p` with `m` micro-batches (Qi et al.,
/// ICLR 2024, §6, Figure 7; the order of torch's `ScheduleZBVZeroBubble`): `(pass, chunk,
/// micro-batch)`, chunk 0 the group's stage `r` on the way down, chunk 1 its stage `2p − 1 − r`
/// on the way back. With `c0`/`c1` for the chunks:
/// - warm-up: `2(p − r) − 1` forwards of `c0`; `r` pairs (forward `c1`, forward `c0`); `p − r`
///   triples (forward, `B`, `W` of `c1`);
/// - steady state, until every forward has run: forward `c0` (while any remain), `B` and `W`
///   of `c0`, forward, `B` and `W` of `c1`;
/// - cool-down: `r` pairs (`B` of `c0`, `B` of `c1`), `p − r` pairs (`B`, and the oldest
///   pending `W`, of `c0`), then the pending `W`s of `c1` and of `c0`.
///
/// The order is built for `max(m, 2p − 1)` micro-batches (the fewest that fill the V) and
/// keeps those below `m`. A group holds at most `2p` chunk micro-batches of activations, the
/// `p` whole-stage micro-batches of 1F1B's first stage (the paper's "same peak memory as
/// 1F1B"); with equal chunks and `F = B = W` every device runs without a gap once its first
/// forward has run (`passes/tests/sim_closed_forms.rs` has the closed form).
pub fn zbv_order(r: usize, p: usize, m: usize) -> Vec<(Pass, usize, usize)> {
    let mm = m.max(2 * p - 1);
    let mut out = Vec::with_capacity(6 * mm);
    let (mut f, mut b, mut w) = ([0usize; 2], [0usize; 2], [0usize; 2]);
    let push = |out: &mut Vec<(Pass, usize, usize)>, pass: Pass, c: usize, n: &mut usize| {
        out.push((pass, c, *n));
        *n += 1;
    };
    for _ in 0..2 * (p - r) - 1 {
        push(&mut out, Pass::Fwd, 0, &mut f[0]);
    }
    for _ in 0..r {
        push(&mut out, Pass::Fwd, 1, &mut f[1]);
        push(&mut out, Pass::Fwd, 0, &mut f[0]);
    }
    for _ in 0..p - r {
        push(&mut out, Pass::Fwd, 1, &mut f[1]);
        push(&mut out, Pass::Bwd, 1, &mut b[1]);
        push(&mut out, Pass::Wgt, 1, &mut w[1]);
    }
    while f[1] < f[0] || f[0] < mm {
        if f[0] < mm {
            push(&mut out, Pass::Fwd, 0, &mut f[0]);
        }
        push(&mut out, Pass::Bwd, 0, &mut b[0]);
        push(&mut out, Pass::Wgt, 0, &mut w[0]);
        push(&mut out, Pass::Fwd, 1, &mut f[1]);
        push(&mut out, Pass::Bwd, 1, &mut b[1]);
        push(&mut out, Pass::Wgt, 1, &mut w[1]);
    }
    for _ in 0..r {
        push(&mut out, Pass::Bwd, 0, &mut b[0]);
        push(&mut out, Pass::Bwd, 1, &mut b[1]);
    }
    for _ in 0..p - r {
        push(&mut out, Pass::Bwd, 0, &mut b[0]);
        push(&mut out, Pass::Wgt, 0, &mut w[0]);
    }
    for c in [1, 0] {
        while w[c] < b[c] {
            push(&mut out, Pass::Wgt, c, &mut w[c]);
        }
    }
    out.retain(|x| x.2 < m);
    out
}

/// The order of device group `r` of `p` under a schedule with several chunks per group
/// (`kind.chunks() ≥ 2`), `m` micro-batches: `(pass, chunk, micro-batch)`, chunk `c` being
/// stage [`ScheduleKind::chunk_stage`]`(c, r, p)`. [`interleaved_order`] or [`zbv_order`];
/// a chunk whose backward does not split runs its whole backward at `Bwd` and skips `Wgt`.
pub fn chunk_order(kind: ScheduleKind, r: usize, p: usize, m: usize) -> Vec<(Pass, usize, usize)> {
    match kind {
        ScheduleKind::Zbv => zbv_order(r, p, m),
        _ => interleaved_order(r, p, kind.chunks(), m)
            .into_iter()
            .map(|(f, c, mb)| (if f { Pass::Fwd } else { Pass::Bwd }, c, mb))
            .collect(),
    }
}

/// A schedule with several chunks per device group ([`chunk_order`]: interleaved 1F1B, ZB-V)
/// on a stage graph laid out as [`interleaved_groups`] says (the caller checks it; a stage
/// graph that is not is scheduled as 1F1B). Each stage's replicas split the micro-batch
/// evenly, or take whole micro-batches in turn where they cannot ([`StageGraph::round_robin`]);
/// after its last pass every device flushes all its chunks together.
fn generate_interleaved(sg: &StageGraph, kind: ScheduleKind, m: usize) -> Schedule {
    let Ok(p) = interleaved_groups(sg, kind) else {
        return generate(sg, ScheduleKind::OneFOneB, m);
    };
    let ndev = device_count(sg);
    let mut programs: Vec<Vec<Instr>> = vec![Vec::new(); ndev];
    let mut warmup = vec![0; sg.stages.len()];
    for r in 0..p {
        let order = chunk_order(kind, r, p, m);
        // Forwards of each chunk before the device's first backward.
        for &(_, c, _) in order.iter().take_while(|x| x.0 == Pass::Fwd) {
            warmup[kind.chunk_stage(c, r, p)] += 1;
        }
        let replicas = sg.stages[r].devices.len();
        for (j, &d) in sg.stages[r].devices.iter().enumerate() {
            let prog = &mut programs[d];
            for &(pass, c, mb) in &order {
                let s = kind.chunk_stage(c, r, p);
                if pass == Pass::Wgt && !sg.splits_backward(s, kind) {
                    continue;
                }
                // Replicas that take whole micro-batches in turn run their own.
                if sg.is_round_robin(s) && mb % replicas != j {
                    continue;
                }
                push_pass(prog, sg, kind, s, j, pass, mb);
            }
            let chunks: Vec<usize> = (0..kind.chunks())
                .map(|c| kind.chunk_stage(c, r, p))
                .collect();
            push_flush(prog, &chunks, sg, d);
        }
    }
    Schedule {
        kind,
        micro_batches: m,
        stage_micro_batches: vec![m; sg.stages.len()],
        warmup,
        programs,
    }
}

/// Devices the stage graph uses (one past the largest device id).
fn device_count(sg: &StageGraph) -> usize {
    sg.stages
        .iter()
        .flat_map(|s| s.devices.iter().copied())
        .max()
        .map_or(0, |d| d + 1)
}

/// The flush on device `d` after the last pass of its `stages` (one, or a device group's
/// chunks in stage order): the all-reduces of their gradients, then each one's optimizer step.
/// As codegen emits them: one all-reduce per device set in ascending order of the sets, the
/// stages' replicas (all their own parameters together, under the first stage, when
/// replicated) and each tied group holding `d` ([`StageGraph::tied`], `stage` numbered after
/// the stages).
fn push_flush(prog: &mut Vec<Instr>, stages: &[usize], sg: &StageGraph, d: usize) {
    let Some(&first) = stages.first() else {
        return;
    };
    let st = &sg.stages[first];
    let mut ars: Vec<(Vec<usize>, Instr)> = Vec::new();
    // Codegen all-reduces the gradients a stage has; none when no parameter of it is trained.
    let bytes: f64 = stages
        .iter()
        .map(|&s| sg.stages[s].parameter_bytes - sg.stages[s].tied_bytes)
        .sum();
    if st.devices.len() > 1 && bytes > 0.0 {
        let mut key = st.devices.clone();
        key.sort_unstable();
        ars.push((
            key,
            Instr::AllReduce {
                stage: first,
                group: st.devices.clone(),
                bytes,
            },
        ));
    }
    push_all_reduces(prog, ars, sg, d);
    prog.extend(stages.iter().map(|&s| Instr::OptimizerStep { stage: s }));
}

/// The all-reduces `ars` (keyed by their sorted device sets) and those of every tied group
/// holding device `d` ([`StageGraph::tied`], `stage` numbered after the stages), in ascending
/// order of the sets, as codegen emits them.
fn push_all_reduces(
    prog: &mut Vec<Instr>,
    mut ars: Vec<(Vec<usize>, Instr)>,
    sg: &StageGraph,
    d: usize,
) {
    for (k, t) in sg.tied.iter().enumerate() {
        if t.devices.contains(&d) {
            ars.push((
                t.devices.clone(),
                Instr::AllReduce {
                    stage: sg.stages.len() + k,
                    group: t.devices.clone(),
                    bytes: t.bytes,
                },
            ));
        }
    }
    ars.sort_by(|a, b| a.0.cmp(&b.0));
    prog.extend(ars.into_iter().map(|x| x.1));
}

/// The micro-batches replica `k` of `r` runs under round robin: `k, k + r, k + 2r, ... < m`.
pub fn round_robin_micro_batches(k: usize, r: usize, m: usize) -> Vec<usize> {
    (k..m).step_by(r.max(1)).collect()
}

/// PipeDream's 1F1B-RR (see the module doc): replica `k` of stage `s` runs the micro-batches
/// `m ≡ k (mod r_s)` whole, in 1F1B order with `⌈W(s)/r_s⌉` warm-up forwards.
fn generate_round_robin(sg: &StageGraph, kind: ScheduleKind, m: usize) -> Schedule {
    let ndev = device_count(sg);
    let mut programs: Vec<Vec<Instr>> = vec![Vec::new(); ndev];
    let workers = sg.workers_to_sink();
    let mut warmup = Vec::with_capacity(sg.stages.len());
    for (s, st) in sg.stages.iter().enumerate() {
        let r = st.devices.len().max(1);
        let k = workers[s].div_ceil(r).max(1);
        warmup.push(k.min(m.div_ceil(r)).max(1));
        for (j, &d) in st.devices.iter().enumerate() {
            let mine = round_robin_micro_batches(j, r, m);
            let prog = &mut programs[d];
            for (fwd, local) in fb_order(k, mine.len()) {
                let mb = mine[local];
                if fwd {
                    for &e in &sg.in_edges[s] {
                        let ed = &sg.edges[e];
                        let src = &sg.stages[ed.src].devices;
                        prog.push(Instr::Recv {
                            dir: Dir::Act,
                            stage: s,
                            from: ed.src,
                            mb,
                            peer_mb: mb,
                            peer: src[mb % src.len()],
                            bytes: ed.bytes,
                        });
                    }
                    prog.push(Instr::Forward { stage: s, mb });
                    for &e in &sg.out_edges[s] {
                        let ed = &sg.edges[e];
                        let dst = &sg.stages[ed.dst].devices;
                        prog.push(Instr::Send {
                            dir: Dir::Act,
                            stage: s,
                            to: ed.dst,
                            mb,
                            peer_mb: mb,
                            peer: dst[mb % dst.len()],
                            bytes: ed.bytes,
                        });
                    }
                } else {
                    for &e in &sg.out_edges[s] {
                        let ed = &sg.edges[e];
                        if ed.grad_tensors == 0 {
                            continue;
                        }
                        let dst = &sg.stages[ed.dst].devices;
                        prog.push(Instr::Recv {
                            dir: Dir::Grad,
                            stage: s,
                            from: ed.dst,
                            mb,
                            peer_mb: mb,
                            peer: dst[mb % dst.len()],
                            bytes: ed.grad_bytes,
                        });
                    }
                    prog.push(Instr::Backward { stage: s, mb });
                    for &e in &sg.in_edges[s] {
                        let ed = &sg.edges[e];
                        if ed.grad_tensors == 0 {
                            continue;
                        }
                        let src = &sg.stages[ed.src].devices;
                        prog.push(Instr::Send {
                            dir: Dir::Grad,
                            stage: s,
                            to: ed.src,
                            mb,
                            peer_mb: mb,
                            peer: src[mb % src.len()],
                            bytes: ed.grad_bytes,
                        });
                    }
                }
            }
            push_flush(prog, &[s], sg, d);
        }
    }
    Schedule {
        kind,
        micro_batches: m,
        stage_micro_batches: vec![m; sg.stages.len()],
        warmup,
        programs,
    }
}

/// The sample pieces of stage `t` (`r` replicas, micro-batch `b`) that cover the global samples
/// `[lo, hi)`: `(micro-batch, replica, samples)` in sample order. Replica `j` of micro-batch `m`
/// holds samples `[m·b + j·b/r, m·b + (j + 1)·b/r)`.
pub fn covering(b: u64, r: usize, lo: u64, hi: u64) -> Vec<(usize, usize, u64)> {
    let r64 = r.max(1) as u64;
    let q = (b / r64).max(1);
    let mut out = Vec::new();
    let mut x = lo;
    while x < hi {
        let u = x / q;
        let end = ((u + 1) * q).min(hi);
        out.push(((u / r64) as usize, (u % r64) as usize, end - x));
        x = end;
    }
    out
}

/// The warm-up `K_s = ⌈i_s / b_s⌉` (capped at the stage's `B / b_s` micro-batches) of every
/// stage of a per-stage configuration, from the in-flight samples `i_s` of
/// [`crate::sim::in_flight::in_flight_samples`] on the stage DAG `succ`. Codegen emits the same.
pub fn per_stage_warmups(succ: &[Vec<usize>], ps: &PerStage) -> Vec<usize> {
    let samples = crate::sim::in_flight::in_flight_samples(succ, &ps.micro_batch, &ps.group);
    samples
        .iter()
        .zip(&ps.micro_batch)
        .map(|(&i, &b)| {
            let b = b.max(1);
            (i.div_ceil(b) as usize).clamp(1, (ps.batch / b).max(1) as usize)
        })
        .collect()
}

/// Per-stage micro-batch sizes and `k_sFk_sB` orders (GraphPipe §6, Figure 5): stage `s` runs
/// `M_s = B / b_s` micro-batches of `b_s` samples, each split evenly over its replicas, in the
/// order [`fb_order_grouped`]`(K_s, k_s, M_s)` with the warm-up `K_s = ⌈i_s / b_s⌉` from the
/// in-flight samples `i_s` of [`crate::sim::in_flight::in_flight_samples`] (Appendix A.1, reverse
/// topological order). A forward receives, per input edge, the pieces of the producer's
/// micro-batches that overlap its samples (a concat when the producer's micro-batches are
/// smaller, a split when larger) and sends its output pieces to the consumers' micro-batches;
/// gradients take the same pieces back.
fn generate_per_stage(sg: &StageGraph, ps: &PerStage, m: usize) -> Schedule {
    let ndev = device_count(sg);
    let b = &ps.micro_batch;
    let ms: Vec<usize> = b.iter().map(|&x| (ps.batch / x.max(1)) as usize).collect();
    let warmup = per_stage_warmups(&sg.successors(), ps);
    let mut programs: Vec<Vec<Instr>> = vec![Vec::new(); ndev];
    // Bytes per sample of every edge (its `bytes` are per micro-batch of the graph's base size).
    let per_sample: Vec<f64> = sg
        .edges
        .iter()
        .map(|e| e.bytes / ps.base_micro_batch.max(1) as f64)
        .collect();
    let per_sample_grad: Vec<f64> = sg
        .edges
        .iter()
        .map(|e| e.grad_bytes / ps.base_micro_batch.max(1) as f64)
        .collect();
    for (s, st) in sg.stages.iter().enumerate() {
        let k = warmup[s];
        let r = st.devices.len().max(1);
        let q = b[s] / r as u64;
        for (j, &d) in st.devices.iter().enumerate() {
            let prog = &mut programs[d];
            for (fwd, mb) in fb_order_grouped(k, ps.group[s] as usize, ms[s]) {
                let lo = mb as u64 * b[s] + j as u64 * q;
                let hi = lo + q;
                // Pieces of the other stage's micro-batches over this replica's samples.
                let pieces = |t: usize| covering(b[t], sg.stages[t].devices.len(), lo, hi);
                // One message per piece, received (`send = false`) or sent.
                let hops = |prog: &mut Vec<Instr>, send: bool, dir: Dir, e: usize, t: usize| {
                    let rate = match dir {
                        Dir::Act => per_sample[e],
                        Dir::Grad if sg.edges[e].grad_tensors == 0 => return,
                        Dir::Grad => per_sample_grad[e],
                    };
                    for (pm, pj, x) in pieces(t) {
                        let (peer, bytes) = (sg.stages[t].devices[pj], x as f64 * rate);
                        let (stage, peer_mb) = (s, pm);
                        prog.push(if send {
                            Instr::Send {
                                dir,
                                stage,
                                to: t,
                                mb,
                                peer_mb,
                                peer,
                                bytes,
                            }
                        } else {
                            Instr::Recv {
                                dir,
                                stage,
                                from: t,
                                mb,
                                peer_mb,
                                peer,
                                bytes,
                            }
                        });
                    }
                };
                if fwd {
                    for &e in &sg.in_edges[s] {
                        hops(prog, false, Dir::Act, e, sg.edges[e].src);
                    }
                    prog.push(Instr::Forward { stage: s, mb });
                    for &e in &sg.out_edges[s] {
                        hops(prog, true, Dir::Act, e, sg.edges[e].dst);
                    }
                } else {
                    for &e in &sg.out_edges[s] {
                        hops(prog, false, Dir::Grad, e, sg.edges[e].dst);
                    }
                    prog.push(Instr::Backward { stage: s, mb });
                    for &e in &sg.in_edges[s] {
                        hops(prog, true, Dir::Grad, e, sg.edges[e].src);
                    }
                }
            }
            push_flush(prog, &[s], sg, d);
        }
    }
    Schedule {
        kind: ScheduleKind::GppPerStage,
        micro_batches: m,
        stage_micro_batches: ms,
        warmup,
        programs,
    }
}
