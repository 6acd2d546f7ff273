//! Weight-gradient passes moved into idle slots: the zero-bubble schedules on stage DAGs.
//!
//! ZB-H1 and ZB-H2 (Qi et al. 2023, §3.1) place each stage's `W` a fixed number of backwards
//! after its `B` ([`super::schedule::weight_lag`]), which on a chain of equal stages fills the
//! bubbles exactly. On a stage DAG, or with unequal stages, a device still waits for messages
//! here and there while `W`s it could run sit later in its list. [`fill_weight_gaps`] simulates
//! the schedule and moves such `W`s into those waits: a `W` goes into the idle time before a
//! forward or backward when its `B` has ended by the time the wait starts and it fits in what is
//! left of the wait, so what follows starts no later; the schedule is simulated again and the
//! moves kept when the iteration got faster, for a few rounds. A `W` run earlier frees what it
//! held earlier, so memory does not grow; `W` has no messages, so no order of them deadlocks.
//! [`scheduled`] is the one entry point: every plan's schedule comes from it, and codegen emits
//! its per-device order ([`pass_orders`]).

use super::schedule::{generate, Instr, Pass, Schedule, ScheduleKind};
use super::{simulate, SimResult, StageGraph, TaskKind};
use crate::cost::{AllReduceAlgo, Cluster};
use pipec_compiler::Result;
use std::collections::HashMap;

/// A device's passes in order: `(pass, stage, mb)`.
pub type PassOrder = Vec<(Pass, usize, usize)>;

/// Rounds of moves at most (each one simulation).
const ROUNDS: usize = 4;

/// Whether `kind`'s schedule gets its `W`s moved into idle slots: the zero-bubble schedules
/// with one stage per device (ZB-V's order is the paper's own).
pub fn fills(kind: ScheduleKind) -> bool {
    kind.splits_backward() && kind.chunks() == 1
}

/// The schedule of `kind` on `sg` with `m` micro-batches, as plans and codegen use it
/// ([`generate`], then [`fill_weight_gaps`] where [`fills`]), and its simulation.
pub fn scheduled(
    sg: &StageGraph,
    kind: ScheduleKind,
    m: usize,
    cluster: &Cluster,
    algo: AllReduceAlgo,
) -> Result<(Schedule, SimResult)> {
    let sched = generate(sg, kind, m);
    if fills(kind) {
        return fill_weight_gaps(sg, sched, cluster, algo);
    }
    let res = simulate(sg, &sched, cluster, algo)?;
    Ok((sched, res))
}

/// Per device, the passes of its list in order (`(pass, stage, mb)`): what codegen lays out.
pub fn pass_orders(sched: &Schedule) -> Vec<PassOrder> {
    sched
        .programs
        .iter()
        .map(|prog| prog.iter().filter_map(Instr::pass).collect())
        .collect()
}

/// `sched` with weight-gradient passes moved into idle slots (see the module doc), and its
/// simulation; `sched` itself (simulated) when no move helps.
pub fn fill_weight_gaps(
    sg: &StageGraph,
    sched: Schedule,
    cluster: &Cluster,
    algo: AllReduceAlgo,
) -> Result<(Schedule, SimResult)> {
    let mut res = simulate(sg, &sched, cluster, algo)?;
    let mut best = sched;
    for _ in 0..ROUNDS {
        let Some(moved) = moved_weights(&best, &res) else {
            break;
        };
        let r = simulate(sg, &moved, cluster, algo)?;
        if r.iteration_time_s >= res.iteration_time_s * (1.0 - 1e-9) {
            break;
        }
        best = moved;
        res = r;
    }
    Ok((best, res))
}

/// One round of moves over every device's list, or `None` when no `W` fits any wait.
fn moved_weights(sched: &Schedule, res: &SimResult) -> Option<Schedule> {
    // Compute tasks' (start, end) by (device, pass, stage, mb).
    let mut at: HashMap<(usize, Pass, usize, usize), (f64, f64)> = HashMap::new();
    for t in &res.tasks {
        let key = match t.kind {
            TaskKind::Forward { stage, mb, device } => (device, Pass::Fwd, stage, mb),
            TaskKind::Backward { stage, mb, device } => (device, Pass::Bwd, stage, mb),
            TaskKind::WeightGrad { stage, mb, device } => (device, Pass::Wgt, stage, mb),
            _ => continue,
        };
        at.insert(key, (t.start, t.end));
    }
    let eps = 1e-12;
    let mut out = sched.clone();
    let mut any = false;
    for (d, prog) in sched.programs.iter().enumerate() {
        // (insert before this index, the moved W instructions' indices), in list order.
        let mut moves: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut taken = vec![false; prog.len()];
        let mut prev_end = f64::NEG_INFINITY;
        for (i, ins) in prog.iter().enumerate() {
            let Some((pass, s, mb)) = ins.pass() else {
                continue;
            };
            let Some(&(start, end)) = at.get(&(d, pass, s, mb)) else {
                continue;
            };
            if taken[i] {
                continue;
            }
            if pass != Pass::Wgt && prev_end.is_finite() && start - prev_end > eps {
                let mut left = start - prev_end;
                let mut chosen = Vec::new();
                for (w, wi) in prog.iter().enumerate().skip(i + 1) {
                    let Instr::WeightGrad { stage, mb } = *wi else {
                        continue;
                    };
                    let (Some(&(ws, we)), Some(&(_, be))) = (
                        at.get(&(d, Pass::Wgt, stage, mb)),
                        at.get(&(d, Pass::Bwd, stage, mb)),
                    ) else {
                        continue;
                    };
                    if !taken[w] && be <= prev_end + eps && we - ws <= left + eps {
                        left -= we - ws;
                        taken[w] = true;
                        chosen.push(w);
                    }
                }
                if !chosen.is_empty() {
                    // Before the pass's receives, which wait for its messages.
                    let mut first = i;
                    while first > 0 && matches!(prog[first - 1], Instr::Recv { .. }) {
                        first -= 1;
                    }
                    moves.push((first, chosen));
                }
            }
            prev_end = prev_end.max(end);
        }
        if moves.is_empty() {
            continue;
        }
        any = true;
        let mut list = Vec::with_capacity(prog.len());
        let mut next = moves.into_iter().peekable();
        for (i, ins) in prog.iter().enumerate() {
            while let Some((_, ws)) = next.next_if(|m| m.0 == i) {
                list.extend(ws.into_iter().map(|w| prog[w].clone()));
            }
            if !taken[i] {
                list.push(ins.clone());
            }
        }
        out.programs[d] = list;
    }
    any.then_some(out)
}
