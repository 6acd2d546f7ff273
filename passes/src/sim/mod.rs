//! The shared simulator: a discrete-event replay of per-device instruction lists on the cost model.
//!
//! Inputs: a [`StageGraph`] (stages with per-replica costs, and the bytes each stage edge carries
//! per micro-batch), a [`Schedule`] ([`schedule::generate`]) and the [`Cluster`].
//!
//! Model:
//! - each device has **one compute stream** that runs its `Forward`, `Backward` and `OptimizerStep`
//!   instructions strictly in program order; a compute waits for the data its `Recv`s name;
//! - each device has a **send channel** and a **receive channel**; a transfer holds the sender's
//!   send channel and the receiver's receive channel for its α-β time ([`comm::p2p_time`]), so
//!   communication overlaps compute but not other transfers on the same channel;
//! - **link contention**: a transfer that leaves a node also holds that node's egress port and the
//!   destination node's ingress port, so transfers between nodes share the inter-node link;
//! - an `AllReduce` is a collective: it starts when every participant's stream reaches it, holds
//!   all their channels (and their nodes' ports when it spans nodes) for [`comm::allreduce_time`]
//!   and blocks their streams meanwhile;
//! - resources are granted first come, first served at the time a task becomes ready (a transfer
//!   reserves its sender's and receiver's channels together, as a rendezvous send does), in the
//!   earliest interval where all of them are free: a transfer that becomes ready later may use an
//!   idle gap before an earlier reservation if it ends before that reservation starts
//!   (conservative backfilling). So a channel never idles while a message that could use it
//!   waits on its other end, and which of two nearly simultaneous messages asks first changes
//!   the timing only where both compete for the same gap (`earliest_fit`);
//! - a replicated stage splits every micro-batch evenly over its replicas (DAPPLE §3.3, GraphPipe
//!   §7.5), with split/concat traffic between stages of different replica counts
//!   ([`comm::redistribute`]); under `1f1b-rr` (PipeDream's 1F1B-RR) replicas instead take whole
//!   micro-batches round robin (stage graph from [`StageGraph::from_specs_for`]); gradients are
//!   accumulated and all-reduced once, after the last backward (synchronous, no weight stashing);
//! - every backward after a device's first adds its weight gradients into the gradient buffer, a
//!   memory-bound task on the stream (`3 × parameter bytes / memory bandwidth`, as codegen's
//!   `Accumulate` replays; the first backward's gradients become the buffer);
//! - a batch-independent value's cotangent comes back from each consumer replica a producer
//!   replica serves; codegen adds these partial sums as they arrive, a memory-bound task
//!   (`(k − 1) × 3 × bytes / memory bandwidth`) on the stream before the backward;
//! - the re-computing kinds (`gpipe-recompute`, `1f1b-recompute`) run on
//!   [`StageGraph::with_recomputation`] of the given graph (`B' = B + F`, stage inputs saved).
//!
//! Checked closed forms (tests in `passes/tests/sim_closed_forms.rs`): for `S` equal stages, `M`
//! micro-batches and free communication, GPipe and 1F1B take `(M+S−1)(F+B)` with bubble
//! `(S−1)/(M+S−1)` (GPipe; DAPPLE §II's `P = (S−1)/M` overhead); 1F1B keeps `S−i` micro-batches in
//! flight on stage `i` and GPipe `M`; with a send/receive time `SR ≤ F` per micro-batch, 1F1B
//! reproduces BaPipe Table 2's 1F1B-SNO time `(M+N−1)(F+B) + (N+M−2−⌈(M−1)/N⌉)·2SR` and
//! `1f1b-so` its 1F1B-SO time `(M+N−1)(F+B) + (N−1)·2SR`.
//!
//! Outputs ([`SimResult`]): iteration time (last task end), bubble fraction (idle share of the used
//! devices' compute streams: `1 − Σ busy / (devices × T)`), per-device busy time, peak memory and
//! the memory-over-time curve ([`crate::cost::memory`]: static memory less the gradients from
//! t = 0, the gradients from a device's first backward to its optimizer step as the runtime holds
//! them, a micro-batch's saved activations from the start of its forward to the end of its
//! backward), the most
//! micro-batches in flight per stage, and every task's start and end for the Chrome trace
//! ([`trace::chrome_trace`]).

pub mod fill;
pub mod in_flight;
mod kind;
pub mod replay;
pub mod schedule;
mod stage_graph;
pub mod trace;

pub use kind::ScheduleKind;
pub use schedule::{Dir, Instr, Schedule};
pub use stage_graph::{
    deepest_stage, heaviest_path_to_sink, takes_turns, PerStage, SimStage, StageEdge, StageGraph,
    TiedGroup,
};

use crate::cost::{comm, AllReduceAlgo, Cluster};
use pipec_compiler::{Error, Result};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// What a simulated task was.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskKind {
    Forward {
        stage: usize,
        mb: usize,
        device: usize,
    },
    Backward {
        stage: usize,
        mb: usize,
        device: usize,
    },
    /// The weight-gradient part of a split backward (Qi et al.'s `W`; the `Backward` before it
    /// is then the input-gradient part `B`).
    WeightGrad {
        stage: usize,
        mb: usize,
        device: usize,
    },
    Step {
        stage: usize,
        device: usize,
    },
    Transfer {
        dir: Dir,
        mb: usize,
        src: usize,
        dst: usize,
        bytes: f64,
    },
    AllReduce {
        stage: usize,
        devices: Vec<usize>,
        bytes: f64,
    },
    /// Memory-bound work on a device's compute stream (a replayed program's concat, sum,
    /// zero-fill or gradient accumulation).
    Memory {
        device: usize,
    },
}

/// One task with its simulated start and end (seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRecord {
    pub kind: TaskKind,
    pub start: f64,
    pub end: f64,
}

/// Per-device results.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceStats {
    /// Seconds the compute stream ran forward, backward and optimizer-step work.
    pub busy_s: f64,
    /// Seconds in all-reduce.
    pub allreduce_s: f64,
    pub peak_memory_bytes: f64,
    /// `(time, bytes)` after every change, starting at `(0, static)`.
    pub memory_over_time: Vec<(f64, f64)>,
    /// Whether a stage runs on this device.
    pub used: bool,
}

/// The simulator's answer.
#[derive(Clone, Debug, Default)]
pub struct SimResult {
    pub iteration_time_s: f64,
    pub bubble_fraction: f64,
    /// Indexed by device id (devices of the cluster no stage uses have `used == false`).
    pub devices: Vec<DeviceStats>,
    /// Most micro-batches in flight on one replica of each stage.
    pub stage_in_flight: Vec<usize>,
    pub tasks: Vec<TaskRecord>,
}

impl SimResult {
    /// Whether some used device's peak memory exceeds its capacity in `cluster`.
    pub fn out_of_memory(&self, cluster: &Cluster) -> bool {
        self.devices
            .iter()
            .enumerate()
            .any(|(d, x)| x.used && x.peak_memory_bytes > cluster.kind_of(d).memory_bytes as f64)
    }
}

// Resource ids: per device a send and a receive channel, then per node an egress and an ingress port.
fn send_res(d: usize) -> usize {
    2 * d
}
fn recv_res(d: usize) -> usize {
    2 * d + 1
}
fn egress_res(ndev: usize, n: usize) -> usize {
    2 * ndev + 2 * n
}
fn ingress_res(ndev: usize, n: usize) -> usize {
    2 * ndev + 2 * n + 1
}

/// (direction, sender's micro-batch, receiver's micro-batch, source device, destination device,
/// sending stage, receiving stage): the stages tell apart the messages of two stages that share
/// a device pair (interleaved 1F1B's chunks).
type TransferKey = (Dir, usize, usize, usize, usize, usize, usize);

/// Task arrays under construction.
#[derive(Default)]
struct Builder {
    ndev: usize,
    /// Devices the program runs (`pipec run` starts one worker per device of the program, and
    /// pins them to cores by that count); 0: every device of the cluster.
    program_devices: usize,
    /// Transfers by (direction, micro-batch, source device, destination device).
    /// (Fx hash: the simulator's hottest map, keys are small integers.)
    transfers: FxHashMap<TransferKey, u32>,
    kinds: Vec<TaskKind>,
    dur: Vec<f64>,
    res: Vec<Vec<usize>>,
    succs: Vec<Vec<u32>>,
    deps: Vec<u32>,
}

impl Builder {
    fn task(&mut self, k: TaskKind, d: f64, r: Vec<usize>) -> u32 {
        self.kinds.push(k);
        self.dur.push(d);
        self.res.push(r);
        self.succs.push(Vec::new());
        self.deps.push(0);
        (self.kinds.len() - 1) as u32
    }
    /// The transfer task for `key`, created on first use (by its send or its receive).
    fn transfer(&mut self, cluster: &Cluster, key: TransferKey, bytes: f64, tensors: usize) -> u32 {
        if let Some(&t) = self.transfers.get(&key) {
            return t;
        }
        let (dir, mb, _, src, dst, _, _) = key;
        // One message per value: the latency is paid `tensors` times.
        let t = comm::message_time(cluster, src, dst, bytes, tensors);
        let id = self.p2p(
            cluster,
            TaskKind::Transfer {
                dir,
                mb,
                src,
                dst,
                bytes,
            },
            src,
            dst,
            t,
        );
        self.transfers.insert(key, id);
        id
    }
    /// A point-to-point message of `t` seconds from `src` to `dst`: it holds the sender's send
    /// channel and the receiver's receive channel, and the nodes' egress and ingress ports when
    /// it crosses nodes.
    fn p2p(&mut self, cluster: &Cluster, k: TaskKind, src: usize, dst: usize, t: f64) -> u32 {
        if src == dst {
            // A device's message to itself (between interleaved 1F1B's chunks): handed over
            // in place, no channel or link.
            return self.task(k, 0.0, Vec::new());
        }
        let mut rs = vec![send_res(src), recv_res(dst)];
        let (ns, nd) = (cluster.node_of(src), cluster.node_of(dst));
        if ns != nd {
            rs.push(egress_res(self.ndev, ns));
            rs.push(ingress_res(self.ndev, nd));
        }
        self.task(k, t, rs)
    }
    /// A collective of `t` seconds over `group`: it holds every member's channels, and the
    /// ports of their nodes when it spans nodes.
    fn collective(&mut self, cluster: &Cluster, k: TaskKind, group: &[usize], t: f64) -> u32 {
        let mut rs: Vec<usize> = group
            .iter()
            .flat_map(|&g| [send_res(g), recv_res(g)])
            .collect();
        let mut ns: Vec<usize> = group.iter().map(|&g| cluster.node_of(g)).collect();
        ns.sort_unstable();
        ns.dedup();
        if ns.len() > 1 {
            rs.extend(
                ns.iter()
                    .flat_map(|&n| [egress_res(self.ndev, n), ingress_res(self.ndev, n)]),
            );
        }
        self.task(k, t, rs)
    }
    fn edge(&mut self, a: u32, b: u32) {
        self.succs[a as usize].push(b);
        self.deps[b as usize] += 1;
    }
}

impl Builder {
    /// Run the tasks: the start and end of each (seconds). A task starts when its predecessors
    /// have ended and every resource it holds is free (first come, first served); compute tasks
    /// (`Forward`, `Backward`, `Step`, `Memory`) on a host with fewer cores than devices share
    /// the cores (processor sharing). Fails if some task never runs (a deadlock).
    fn run(&self, cluster: &Cluster) -> Result<(Vec<f64>, Vec<f64>)> {
        let (kinds, dur, res, succs) = (&self.kinds, &self.dur, &self.res, &self.succs);
        let mut deps = self.deps.clone();
        let ndev = cluster.len();
        let nodes = ndev.div_ceil(cluster.levels[0].size.max(1));
        let nres = 2 * ndev + 2 * nodes;
        let n = kinds.len();
        let mut start = vec![f64::NAN; n];
        let mut end = vec![f64::NAN; n];
        let mut ready = vec![0.0f64; n];
        // Each resource's reserved intervals `[start, end)` from the current time on, in order.
        let mut busy: Vec<Reservations> = vec![Reservations::default(); nres];
        // Host cores shared by every device's compute (the oversubscribed `cpu` preset): the compute
        // tasks running at once share the cores as the OS time-slices threads (processor sharing):
        // with k of them on C < k cores each progresses at C/k. Such a task's end is only known when
        // it finishes, so it starts from `starting` and runs in `running` (remaining seconds of work).
        let workers = if self.program_devices > 0 {
            self.program_devices.min(ndev)
        } else {
            ndev
        };
        let host = cluster
            .host_cores
            .filter(|&c| c > 0 && c < workers)
            .map_or(0.0, |c| c as f64);
        let shared: Vec<bool> = kinds
            .iter()
            .map(|k| {
                host > 0.0
                    && matches!(
                        k,
                        TaskKind::Forward { .. }
                            | TaskKind::Backward { .. }
                            | TaskKind::WeightGrad { .. }
                            | TaskKind::Step { .. }
                            | TaskKind::Memory { .. }
                    )
            })
            .collect();
        // With `c = min(k, C)` cores busy each runs `1 + (s − 1)(c − 1)/(C − 1)` times slower than
        // alone (`s`: the measured all-cores slowdown, `Cluster::host_slowdown`).
        let slow = cluster.host_slowdown.max(1.0);
        let slowdown = |busy: f64| {
            if host > 1.0 && busy > 1.0 {
                1.0 + (slow - 1.0) * (busy - 1.0) / (host - 1.0)
            } else {
                1.0
            }
        };
        // When the devices divide evenly among the cores, `pipec run` pins each device's worker to
        // a core ([`pipec_compiler::program::host_core_map`]): a core is shared only by its own
        // devices' running tasks. Otherwise the OS spreads them: all cores shared by all.
        let core_of: Option<Vec<usize>> = cluster
            .host_cores
            .filter(|_| host > 0.0)
            .and_then(|c| pipec_compiler::program::host_core_map(workers, c));
        let task_core = |id: usize| -> usize {
            let d = match &kinds[id] {
                TaskKind::Forward { device, .. }
                | TaskKind::Backward { device, .. }
                | TaskKind::WeightGrad { device, .. }
                | TaskKind::Step { device, .. }
                | TaskKind::Memory { device } => *device,
                _ => 0,
            };
            core_of
                .as_ref()
                .map_or(0, |m| m.get(d).copied().unwrap_or(0))
        };
        let mut per_core = vec![0usize; core_of.as_ref().map_or(0, |_| host as usize)];
        // The rate of every running task (seconds of its work per second).
        let rates = |running: &[(usize, f64)], per_core: &mut Vec<usize>, out: &mut Vec<f64>| {
            out.clear();
            let k = running.len();
            if core_of.is_none() {
                let share = if k as f64 <= host {
                    1.0
                } else {
                    host / k as f64
                };
                out.resize(k, share / slowdown((k as f64).min(host)));
                return;
            }
            per_core.iter_mut().for_each(|c| *c = 0);
            for &(id, _) in running {
                per_core[task_core(id)] += 1;
            }
            let busy = per_core.iter().filter(|&&c| c > 0).count() as f64;
            let f = slowdown(busy);
            out.extend(
                running
                    .iter()
                    .map(|&(id, _)| 1.0 / (per_core[task_core(id)] as f64 * f)),
            );
        };
        let mut rate_of: Vec<f64> = Vec::new();
        let mut heap = BinaryHeap::with_capacity(n);
        let mut starting: BinaryHeap<Ev> = BinaryHeap::new();
        let mut running: Vec<(usize, f64)> = Vec::new();
        let mut clock = 0.0f64;
        let launch = |id: usize,
                      at: f64,
                      busy: &mut Vec<Reservations>,
                      heap: &mut BinaryHeap<Ev>,
                      starting: &mut BinaryHeap<Ev>,
                      start: &mut Vec<f64>,
                      end: &mut Vec<f64>| {
            let s = earliest_fit(busy, &res[id], at, dur[id]);
            start[id] = s;
            if shared[id] {
                // Compute tasks hold no resource (their device's order is in the edges).
                starting.push(Ev(s, id as u32));
                return;
            }
            let e = s + dur[id];
            if e > s {
                for &r in &res[id] {
                    busy[r].reserve(s, e);
                }
            }
            end[id] = e;
            heap.push(Ev(e, id as u32));
        };
        let roots: Vec<usize> = (0..n).filter(|&i| deps[i] == 0).collect();
        for id in roots {
            launch(
                id,
                0.0,
                &mut busy,
                &mut heap,
                &mut starting,
                &mut start,
                &mut end,
            );
        }
        let mut done = 0usize;
        loop {
            // The next event: a task's end, a shared task's end, or a shared task's start (ends
            // first at equal times).
            let t_end = heap.peek().map(|e| e.0);
            rates(&running, &mut per_core, &mut rate_of);
            let t_shared = running
                .iter()
                .zip(&rate_of)
                .enumerate()
                .map(|(i, (&(_, rem), &r))| (clock + rem.max(0.0) / r, i))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let t_start = starting.peek().map(|e| e.0);
            let first = [t_end, t_shared.map(|x| x.0), t_start]
                .into_iter()
                .enumerate()
                .filter_map(|(k, t)| t.map(|t| (t, k)))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let Some((t, which)) = first else { break };
            for (x, &r) in running.iter_mut().zip(&rate_of) {
                x.1 -= (t - clock) * r;
            }
            clock = clock.max(t);
            let finished = match which {
                0 => heap.pop().map(|Ev(_, id)| id as usize),
                1 => t_shared.map(|(_, i)| {
                    let (id, _) = running.swap_remove(i);
                    end[id] = t;
                    id
                }),
                _ => {
                    if let Some(Ev(_, id)) = starting.pop() {
                        running.push((id as usize, dur[id as usize]));
                    }
                    None
                }
            };
            let Some(id) = finished else { continue };
            done += 1;
            for &s in &succs[id] {
                let s = s as usize;
                ready[s] = ready[s].max(t);
                deps[s] -= 1;
                if deps[s] == 0 {
                    launch(
                        s,
                        ready[s],
                        &mut busy,
                        &mut heap,
                        &mut starting,
                        &mut start,
                        &mut end,
                    );
                }
            }
        }
        if done != n {
            let stuck = (0..n)
                .find(|&i| start[i].is_nan())
                .map(|i| kinds[i].clone());
            return Err(Error::msg(format!(
                "schedule deadlocks: {} of {n} tasks never run (first: {stuck:?})",
                n - done
            )));
        }
        Ok((start, end))
    }
}

/// One resource's reservations `[start, end)` from the current time on: each one, in order
/// (they never overlap), and the same merged where one ends exactly where the next starts (a
/// saturated channel's back-to-back messages are one run). A task of positive length fits in a
/// gap between runs exactly when it fits between the reservations (inside a run every point is
/// reserved), so [`earliest_fit`] walks the runs; a zero-length task may start on the boundary
/// between two touching reservations and walks them one by one.
#[derive(Clone, Debug, Default, PartialEq)]
struct Reservations {
    each: VecDeque<(f64, f64)>,
    runs: VecDeque<(f64, f64)>,
}

impl Reservations {
    /// Forget the reservations that end by `at` (tasks are launched in time order: no later task
    /// starts before `at`).
    fn drop_before(&mut self, at: f64) {
        for q in [&mut self.each, &mut self.runs] {
            while q.front().is_some_and(|&(_, e)| e <= at) {
                q.pop_front();
            }
        }
    }

    /// Reserve `[s, e)`, `e > s`, free until now.
    fn reserve(&mut self, s: f64, e: f64) {
        let at = self.each.partition_point(|&(a, _)| a < s);
        self.each.insert(at, (s, e));
        let q = &mut self.runs;
        let k = q.partition_point(|&(a, _)| a < s);
        let joins_prev = k > 0 && q[k - 1].1 == s;
        let joins_next = q.get(k).is_some_and(|&(a, _)| a == e);
        match (joins_prev, joins_next) {
            (true, true) => {
                q[k - 1].1 = q[k].1;
                q.remove(k);
            }
            (true, false) => q[k - 1].1 = e,
            (false, true) => q[k].0 = s,
            (false, false) => q.insert(k, (s, e)),
        }
    }

    /// The intervals a task of length `d` must avoid, as [`earliest_fit`] walks them.
    fn for_length(&self, d: f64) -> &VecDeque<(f64, f64)> {
        if d > 0.0 {
            &self.runs
        } else {
            &self.each
        }
    }
}

/// The earliest start `≥ at` at which every resource in `rs` is free for `d` seconds: the first
/// gap common to their reservations that fits (a later-ready task may take an idle gap before a
/// reservation made earlier, as long as it ends before that reservation starts). Reservations
/// that end by `at` are dropped: tasks are launched in time order, so no later task can start
/// before `at`.
fn earliest_fit(busy: &mut [Reservations], rs: &[usize], at: f64, d: f64) -> f64 {
    for &r in rs {
        busy[r].drop_before(at);
    }
    let mut t = at;
    // Per resource, the first interval that ends after `t`. `t` only grows, so each cursor only
    // moves forward: one binary search, then a walk.
    let mut stack = [0usize; 8];
    let mut heap = Vec::new();
    let cur: &mut [usize] = if rs.len() <= stack.len() {
        &mut stack[..rs.len()]
    } else {
        heap.resize(rs.len(), 0);
        &mut heap
    };
    for (c, &r) in cur.iter_mut().zip(rs) {
        *c = busy[r].for_length(d).partition_point(|&(_, e)| e <= t);
    }
    'retry: loop {
        for (c, &r) in cur.iter_mut().zip(rs) {
            // The first interval of `r` that overlaps `[t, t + d)` (`[t, t]` when `d = 0`).
            let q = busy[r].for_length(d);
            while q.get(*c).is_some_and(|&(_, e)| e <= t) {
                *c += 1;
            }
            if let Some(&(a, e)) = q.get(*c) {
                if a < t + d {
                    t = e;
                    continue 'retry;
                }
            }
        }
        return t;
    }
}

#[derive(PartialEq)]
struct Ev(f64, u32);
impl Eq for Ev {}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ev {
    // Min-heap on (time, id).
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

/// A lower bound of any simulated iteration of `sg` under `schedule` with `m` micro-batches:
/// each device runs its compute tasks, its stage's all-reduce and its optimizer step one after
/// another (the simulator's per-device stream), so the iteration is at least the busiest
/// replica's `m · (forward + backward) + all-reduce + step` (round robin: its share of the
/// micro-batches; re-computing schedules: the plain forward, still a bound). Transfers and
/// bubbles only add to it.
pub fn compute_bound(
    sg: &StageGraph,
    cluster: &Cluster,
    algo: AllReduceAlgo,
    schedule: ScheduleKind,
    m: usize,
) -> f64 {
    sg.stages
        .iter()
        .enumerate()
        .map(|(s, st)| {
            let r = st.devices.len().max(1);
            let mine = if schedule.round_robin() {
                m / r
            } else if sg.is_round_robin(s) {
                m.div_ceil(r)
            } else {
                m
            };
            let ar = if r > 1 {
                crate::cost::comm::allreduce_time(
                    cluster,
                    &st.devices,
                    st.parameter_bytes - st.tied_bytes,
                    algo,
                )
            } else {
                0.0
            };
            (0..st.fwd_s.len())
                .map(|k| {
                    // The tied groups this replica's device is in.
                    let tied: f64 = sg
                        .tied
                        .iter()
                        .filter(|t| st.devices.get(k).is_some_and(|d| t.devices.contains(d)))
                        .map(|t| {
                            crate::cost::comm::allreduce_time(cluster, &t.devices, t.bytes, algo)
                        })
                        .sum();
                    // One all-reduce and step per iteration, or per micro-batch
                    // (`pipedream-async`).
                    let updates = if schedule.per_micro_batch_step() {
                        mine as f64
                    } else {
                        1.0
                    };
                    mine as f64 * (st.fwd_s[k] + st.bwd_s[k])
                        + updates * (ar + tied + st.step_s.get(k).copied().unwrap_or(0.0))
                })
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

/// A lower bound of the simulated iteration of `sched` from its transfers: every `Send` is one
/// transfer task (per direction, micro-batch pair and device pair, as the simulator keys them)
/// that holds its sender's send channel and its receiver's receive channel for at least its
/// α-β time ([`comm::p2p_time`]; the latency of each further value of a message only adds), and
/// a channel runs one transfer at a time, so the iteration is at least the busiest channel's
/// summed transfer time. `O(instructions)`; with [`compute_bound`] it lets a caller that only
/// wants a plan faster than a known one skip the simulation of one that cannot be.
pub fn channel_bound(sched: &Schedule, cluster: &Cluster) -> f64 {
    let n = sched.programs.len();
    let (mut send, mut recv) = (vec![0.0f64; n], vec![0.0f64; n]);
    let mut seen = FxHashSet::default();
    for (d, prog) in sched.programs.iter().enumerate() {
        for ins in prog {
            if let Instr::Send {
                dir,
                stage,
                to,
                mb,
                peer_mb,
                peer,
                bytes,
            } = ins
            {
                if *peer < n && seen.insert((*dir, *mb, *peer_mb, d, *peer, *stage, *to)) {
                    let t = comm::p2p_time(cluster, d, *peer, *bytes);
                    send[d] += t;
                    recv[*peer] += t;
                }
            }
        }
    }
    send.into_iter().chain(recv).fold(0.0, f64::max)
}

/// Simulate `sched` on `sg` and `cluster`. Fails if the schedule deadlocks (a receive whose send
/// never comes, or orders that wait on each other) or names a device outside the cluster.
pub fn simulate(
    sg: &StageGraph,
    sched: &Schedule,
    cluster: &Cluster,
    algo: AllReduceAlgo,
) -> Result<SimResult> {
    let costed = sg.for_schedule(sched.kind);
    let sg: &StageGraph = &costed;
    if sched.kind.per_micro_batch_step() {
        if let Some(s) = (0..sg.stages.len()).find(|&s| sg.is_round_robin(s)) {
            return Err(Error::msg(format!(
                "--schedule {}: stage {s}'s {} replicas would take micro-batches in turn (the micro-batch does not divide over them), but every micro-batch's update needs all of a stage's replicas; use a micro-batch divisible by the replica counts",
                sched.kind.name(),
                sg.stages[s].devices.len()
            )));
        }
    }
    // Values per stage edge (src stage, dst stage).
    let tensors: HashMap<(usize, usize), (usize, usize)> = sg
        .edges
        .iter()
        .map(|e| ((e.src, e.dst), (e.tensors.max(1), e.grad_tensors.max(1))))
        .collect();
    let edge_tensors = |a: usize, b: usize| tensors.get(&(a, b)).copied().unwrap_or((1, 1));
    let ndev = cluster.len();
    if sched.programs.len() > ndev {
        return Err(Error::msg(format!(
            "schedule uses {} devices but the cluster has {ndev}",
            sched.programs.len()
        )));
    }
    // device -> its (stage, replica) pairs: one, or a group's chunks under interleaved 1F1B
    let mut place: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ndev];
    let shared = sched.kind.chunks() > 1;
    for (s, st) in sg.stages.iter().enumerate() {
        let r = st.devices.len();
        if r == 0 || st.fwd_s.len() != r || st.bwd_s.len() != r || st.step_s.len() != r {
            return Err(Error::msg(format!(
                "stage {s}: needs one forward, backward and step time per device ({r} devices)"
            )));
        }
        for (r, &d) in st.devices.iter().enumerate() {
            if d >= ndev || (!shared && !place[d].is_empty()) {
                return Err(Error::msg(format!(
                    "stage {s}: device {d} is outside the cluster or in two stages"
                )));
            }
            place[d].push((s, r));
        }
    }
    // A batch-independent value's cotangent comes back from every consumer replica a producer
    // replica serves ([`stage_graph::partial_sums`]), and codegen adds these partial sums as they
    // arrive: `k − 1` adds (read two, write one) before the backward.
    let split = |s: usize| {
        if sched.kind.round_robin() || sg.is_round_robin(s) {
            1
        } else {
            sg.stages[s].devices.len().max(1)
        }
    };
    let mut partial_sum_bytes: Vec<Vec<f64>> = sg
        .stages
        .iter()
        .map(|st| vec![0.0; st.devices.len()])
        .collect();
    for e in sg.edges.iter().filter(|e| e.whole_grad_bytes > 0.0) {
        let (rp, rc) = (split(e.src), split(e.dst));
        for (r, b) in partial_sum_bytes[e.src].iter_mut().enumerate() {
            let pieces = stage_graph::partial_sums(rp, rc, r);
            *b += pieces.saturating_sub(1) as f64 * e.whole_grad_bytes;
        }
    }
    // A replica whose samples of a micro-batch span the slices of several micro-batch pieces of
    // the stage on the other side of an edge (its replicas' even slices, or its smaller
    // micro-batches) receives one piece from each, and codegen joins them with a `Concat` along
    // the batch (read the pieces, write the whole: memory-bound) before the forward
    // (activations) or the backward (cotangents). Values with no batch axis come whole and are
    // not joined. `joined(s, j, mb, backward)`: the bytes replica `j` of stage `s` joins.
    let joined = |s: usize, j: usize, mb: usize, backward: bool| -> f64 {
        // Samples per micro-batch of a stage and per unit of an edge's bytes.
        let ps = sg.per_stage.as_ref();
        let size = |t: usize| {
            ps.and_then(|ps| ps.micro_batch.get(t))
                .map_or(1.0, |&b| b as f64)
        };
        let base = ps.map_or(1.0, |ps| ps.base_micro_batch.max(1) as f64);
        let slice = |t: usize| size(t) / split(t) as f64;
        // Under round robin a replica runs whole micro-batches.
        let j = if split(s) > 1 { j } else { 0 };
        let lo = mb as f64 * size(s) + j as f64 * slice(s);
        let hi = lo + slice(s);
        let pieces = |t: usize| {
            let q = slice(t);
            ((hi / q - 1e-9).ceil() - (lo / q + 1e-9).floor()).max(1.0)
        };
        let mut bytes = 0.0;
        if backward {
            for &e in &sg.out_edges[s] {
                let e = &sg.edges[e];
                if e.grad_tensors > 0 && pieces(e.dst) > 1.0 {
                    bytes += (e.grad_bytes - e.whole_grad_bytes).max(0.0) / base * slice(s);
                }
            }
        } else {
            for &e in &sg.in_edges[s] {
                let e = &sg.edges[e];
                if pieces(e.src) > 1.0 {
                    bytes += (e.bytes - e.whole_bytes).max(0.0) / base * slice(s);
                }
            }
        }
        bytes
    };
    // With uniform micro-batches every micro-batch's slices sit alike, so what a replica joins
    // does not depend on the micro-batch: computed once per replica and direction.
    let joined_uniform: Option<Vec<Vec<[f64; 2]>>> = sg.per_stage.is_none().then(|| {
        sg.stages
            .iter()
            .enumerate()
            .map(|(s, st)| {
                (0..st.devices.len())
                    .map(|j| [joined(s, j, 0, false), joined(s, j, 0, true)])
                    .collect()
            })
            .collect()
    });
    let joined = |s: usize, j: usize, mb: usize, backward: bool| match &joined_uniform {
        Some(t) => t[s][j][usize::from(backward)],
        None => joined(s, j, mb, backward),
    };
    let mut tb = Builder {
        ndev,
        program_devices: sched.programs.len(),
        ..Default::default()
    };
    // Which stages run their backward as two tasks ([`StageGraph::splits_backward`]), once.
    let split: Vec<bool> = (0..sg.stages.len())
        .map(|s| sg.splits_backward(s, sched.kind))
        .collect();
    // One collective per (stage, occurrence): a stage's `k`-th all-reduce is the same task on
    // every member (one per iteration, or one per micro-batch under `pipedream-async`).
    let mut collectives: FxHashMap<(usize, usize), u32> = FxHashMap::default();
    let per_mb_step = sched.kind.per_micro_batch_step();
    // Per stage followed for a tied parameter's versions: the steps before each micro-batch.
    let versions = if per_mb_step {
        version_steps(sg, sched, &place)
    } else {
        FxHashMap::default()
    };
    // Per device, the micro-batches whose parameters it stashes ([`schedule::stashed`]).
    let mut stash: Vec<Vec<bool>> = vec![Vec::new(); ndev];
    let mut sends_seen: FxHashSet<TransferKey> = FxHashSet::default();
    for (d, prog) in sched.programs.iter().enumerate() {
        if prog.is_empty() {
            continue;
        }
        let Some(&(first, _)) = place[d].first() else {
            return Err(Error::msg(format!(
                "device {d} has a program but runs no stage"
            )));
        };
        // The replica of stage `s` this device runs.
        let replica = |s: usize| -> Result<usize> {
            place[d]
                .iter()
                .find(|x| x.0 == s)
                .map(|x| x.1)
                .ok_or_else(|| {
                    Error::msg(format!(
                        "device {d}: computes of stage {s}, which it does not run"
                    ))
                })
        };
        // Codegen's `Accumulate` after every backward adds the micro-batch's weight gradients
        // into the stage's gradient buffer: read both, write one (memory-bound). The first
        // backward's gradients become that buffer (a move), so a stage replica with `m`
        // backwards pays `m − 1` accumulations.
        let mem_bw = cluster.kind_of(d).memory_bandwidth;
        let accumulate_s = |s: usize| {
            if mem_bw > 0.0 {
                3.0 * sg.stages[s].parameter_bytes / mem_bw
            } else {
                0.0
            }
        };
        let partial_sums_s = |s: usize, r: usize| {
            if mem_bw > 0.0 {
                3.0 * partial_sum_bytes[s][r] / mem_bw
            } else {
                0.0
            }
        };
        // Before the backward: the partial sums, then the joins of sliced cotangents; before
        // the forward: the joins of sliced activations.
        let join_s = |s: usize, r: usize, mb: usize, backward: bool| {
            if mem_bw > 0.0 {
                2.0 * joined(s, r, mb, backward) / mem_bw
            } else {
                0.0
            }
        };
        if per_mb_step {
            stash[d] = schedule::stashed(&fb_order(prog));
        }
        // The tied-parameter copies codegen emits after each of the device's steps (at the
        // start for none): bytes by step count.
        let mut tied_copies: std::collections::BTreeMap<usize, f64> = Default::default();
        for &(owner, bytes, _) in sg.tied_stash.get(first).into_iter().flatten() {
            for &v in versions.get(&owner).into_iter().flatten() {
                *tied_copies.entry(v).or_default() += bytes;
            }
        }
        let mut reductions_seen: FxHashMap<usize, usize> = FxHashMap::default();
        let mut backwards_seen: FxHashMap<usize, usize> = FxHashMap::default();
        let mut steps_seen = 0usize;
        // Codegen's copies of tied parameters after `steps` steps: one memory task on the
        // device's stream after that step (at the start for none).
        let copy_tied = |tb: &mut Builder,
                         copies: &mut std::collections::BTreeMap<usize, f64>,
                         steps: usize,
                         after: Option<u32>| {
            let bytes = copies.remove(&steps)?;
            if mem_bw <= 0.0 {
                return None;
            }
            let c = tb.task(
                TaskKind::Memory { device: d },
                2.0 * bytes / mem_bw,
                Vec::new(),
            );
            if let Some(p) = after {
                tb.edge(p, c);
            }
            Some(c)
        };
        let mut prev_stream: Option<u32> = copy_tied(&mut tb, &mut tied_copies, 0, None);
        let mut last_compute: Option<u32> = None;
        let mut pending: Vec<u32> = Vec::new();
        for ins in prog {
            // A compute runs in its stage (one of the device's); the rest need none.
            let computed = match ins {
                Instr::Forward { stage, .. }
                | Instr::Backward { stage, .. }
                | Instr::WeightGrad { stage, .. }
                | Instr::OptimizerStep { stage } => Some(*stage),
                _ => None,
            };
            let s = computed.unwrap_or(first);
            let r = match computed {
                Some(s) => replica(s)?,
                None => 0,
            };
            let st = &sg.stages[s];
            let split_here = split[s];
            let compute = match ins {
                Instr::Forward { mb, .. } => Some((
                    TaskKind::Forward {
                        stage: s,
                        mb: *mb,
                        device: d,
                    },
                    st.fwd_s[r],
                )),
                // With the backward split, `Backward` is its input-gradient part.
                Instr::Backward { mb, .. } => Some((
                    TaskKind::Backward {
                        stage: s,
                        mb: *mb,
                        device: d,
                    },
                    if split_here {
                        (st.bwd_s[r] - st.wgt_s[r]).max(0.0)
                    } else {
                        st.bwd_s[r]
                    },
                )),
                Instr::WeightGrad { mb, .. } => Some((
                    TaskKind::WeightGrad {
                        stage: s,
                        mb: *mb,
                        device: d,
                    },
                    st.wgt_s[r],
                )),
                Instr::OptimizerStep { .. } => Some((
                    TaskKind::Step {
                        stage: s,
                        device: d,
                    },
                    st.step_s[r],
                )),
                _ => None,
            };
            if let Some((k, t)) = compute {
                let before = match ins {
                    Instr::Backward { mb, .. } => partial_sums_s(s, r) + join_s(s, r, *mb, true),
                    Instr::Forward { mb, .. } if per_mb_step => {
                        // Weight stashing copies the parameters the backward reads (read and
                        // write), where the micro-batch needs it (the tied ones another stage
                        // versions are copied after the steps, below).
                        let own = if stash[d].get(*mb).copied().unwrap_or(false) {
                            own_stash_bytes(sg, s)
                        } else {
                            0.0
                        };
                        let copy = if mem_bw > 0.0 {
                            2.0 * own / mem_bw
                        } else {
                            0.0
                        };
                        join_s(s, r, *mb, false) + copy
                    }
                    Instr::Forward { mb, .. } => join_s(s, r, *mb, false),
                    _ => 0.0,
                };
                if before > 0.0 {
                    let sum = tb.task(TaskKind::Memory { device: d }, before, Vec::new());
                    if let Some(p) = prev_stream {
                        tb.edge(p, sum);
                    }
                    for p in pending.drain(..) {
                        tb.edge(p, sum);
                    }
                    prev_stream = Some(sum);
                }
                let id = tb.task(k, t, Vec::new());
                if let Some(p) = prev_stream {
                    tb.edge(p, id);
                }
                for p in pending.drain(..) {
                    tb.edge(p, id);
                }
                prev_stream = Some(id);
                last_compute = Some(id);
                if matches!(ins, Instr::OptimizerStep { .. }) {
                    steps_seen += 1;
                    if let Some(p) = copy_tied(&mut tb, &mut tied_copies, steps_seen, Some(id)) {
                        prev_stream = Some(p);
                    }
                }
                // The micro-batch's gradients are complete after its backward, or after its
                // weight-gradient part when split.
                let grads_done = match ins {
                    Instr::Backward { .. } => !split_here,
                    Instr::WeightGrad { .. } => true,
                    _ => false,
                };
                if grads_done {
                    // Under per-micro-batch steps every accumulation is into a gradient buffer
                    // the last step emptied: a move.
                    let seen = backwards_seen.entry(s).or_insert(0);
                    if *seen > 0 && accumulate_s(s) > 0.0 && !per_mb_step {
                        // After the backward on the stream; the gradient sends that follow
                        // wait only for the backward (codegen sends, then accumulates).
                        let acc =
                            tb.task(TaskKind::Memory { device: d }, accumulate_s(s), Vec::new());
                        tb.edge(id, acc);
                        prev_stream = Some(acc);
                    }
                    *seen += 1;
                }
                continue;
            }
            match ins {
                Instr::Recv {
                    dir,
                    stage,
                    from,
                    mb,
                    peer_mb,
                    peer,
                    bytes,
                } => {
                    if *peer >= ndev {
                        return Err(Error::msg(format!(
                            "device {d}: receive from device {peer} outside the cluster"
                        )));
                    }
                    let k = match dir {
                        Dir::Act => edge_tensors(*from, *stage).0,
                        Dir::Grad => edge_tensors(*stage, *from).1,
                    };
                    pending.push(tb.transfer(
                        cluster,
                        (*dir, *peer_mb, *mb, *peer, d, *from, *stage),
                        *bytes,
                        k,
                    ));
                }
                Instr::Send {
                    dir,
                    stage,
                    to,
                    mb,
                    peer_mb,
                    peer,
                    bytes,
                } => {
                    if *peer >= ndev {
                        return Err(Error::msg(format!(
                            "device {d}: send to device {peer} outside the cluster"
                        )));
                    }
                    let k = match dir {
                        Dir::Act => edge_tensors(*stage, *to).0,
                        Dir::Grad => edge_tensors(*to, *stage).1,
                    };
                    let key = (*dir, *mb, *peer_mb, d, *peer, *stage, *to);
                    let t = tb.transfer(cluster, key, *bytes, k);
                    sends_seen.insert(key);
                    if let Some(p) = last_compute {
                        tb.edge(p, t);
                    }
                }
                Instr::AllReduce {
                    stage,
                    group,
                    bytes,
                } => {
                    let nth = reductions_seen.entry(*stage).or_insert(0);
                    *nth += 1;
                    let id = *collectives.entry((*stage, *nth)).or_insert_with(|| {
                        let t = comm::allreduce_time(cluster, group, *bytes, algo);
                        tb.collective(
                            cluster,
                            TaskKind::AllReduce {
                                stage: *stage,
                                devices: group.clone(),
                                bytes: *bytes,
                            },
                            group,
                            t,
                        )
                    });
                    if let Some(p) = prev_stream {
                        tb.edge(p, id);
                    }
                    for p in pending.drain(..) {
                        tb.edge(p, id);
                    }
                    prev_stream = Some(id);
                }
                _ => {}
            }
        }
    }
    if tb.transfers.len() != sends_seen.len() {
        let k = tb.transfers.keys().find(|k| !sends_seen.contains(k));
        return Err(Error::msg(format!(
            "schedule: a receive has no matching send ({k:?})"
        )));
    }
    let (start, end) = tb.run(cluster)?;
    let kinds = tb.kinds;
    let n = kinds.len();
    // Statistics.
    let t_end = end.iter().copied().fold(0.0, f64::max);
    let mut devices = vec![DeviceStats::default(); ndev];
    let mut mem_events: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ndev];
    let mut flight_events: FxHashMap<(usize, usize), Vec<(f64, i64)>> = FxHashMap::default();
    // Gradients as the runtime holds them: every backward writes its micro-batch's parameter
    // gradients into fresh buffers, held while it runs; the first of an iteration then moves into
    // the (empty) global buffer, held to the device's step, and each later one is added to it.
    // Per (device, stage): a device runs one stage, or a group's chunks (interleaved 1F1B),
    // each with its own gradient buffer.
    let mut grads_from: FxHashMap<(usize, usize), f64> = FxHashMap::default();
    let mut grads_to: FxHashMap<(usize, usize), f64> = FxHashMap::default();
    // Under per-micro-batch updates: per device, when each step and each micro-batch's
    // backward end (for the stashes of tied parameters another stage versions).
    let mut step_end: Vec<Vec<f64>> = vec![Vec::new(); ndev];
    let mut backward_end: Vec<FxHashMap<usize, f64>> = vec![FxHashMap::default(); ndev];
    let mut forward_end: Vec<FxHashMap<usize, f64>> = vec![FxHashMap::default(); ndev];
    for i in 0..n {
        let dt = end[i] - start[i];
        match &kinds[i] {
            TaskKind::Forward { stage, device, mb } => {
                devices[*device].busy_s += dt;
                mem_events[*device].push((start[i], sg.stages[*stage].saved_bytes));
                if stash[*device].get(*mb).copied().unwrap_or(false) {
                    // Weight stashing: a copy of the parameters the backward reads, from the
                    // forward to the backward ([`schedule::stashed`]), but the tied ones
                    // another stage versions (stashed for every micro-batch, below).
                    mem_events[*device].push((start[i], own_stash_bytes(sg, *stage)));
                }
                if per_mb_step {
                    forward_end[*device].insert(*mb, end[i]);
                }
                // The data inputs only the forward reads, loaded for it and dropped after it.
                let load = sg.stages[*stage].load_bytes;
                if load > 0.0 {
                    mem_events[*device].push((start[i], load));
                    mem_events[*device].push((end[i], -load));
                }
                flight_events
                    .entry((*device, *stage))
                    .or_default()
                    .push((start[i], 1));
            }
            TaskKind::Backward { stage, device, .. } if split[*stage] => {
                // The input-gradient part: the micro-batch stays in flight until its
                // weight-gradient part, holding what that reads (saved activations and the
                // values this part computes for it) instead of all its saved activations.
                devices[*device].busy_s += dt;
                let st = &sg.stages[*stage];
                mem_events[*device].push((start[i], st.carried_bytes));
                mem_events[*device].push((end[i], st.weight_saved_bytes - st.saved_bytes));
            }
            // The micro-batch's gradients are complete: it frees what it held (its saved
            // activations, or what the weight-gradient part read).
            TaskKind::Backward { stage, device, mb }
            | TaskKind::WeightGrad { stage, device, mb } => {
                devices[*device].busy_s += dt;
                let st = &sg.stages[*stage];
                if stash[*device].get(*mb).copied().unwrap_or(false) {
                    mem_events[*device].push((end[i], -own_stash_bytes(sg, *stage)));
                }
                if per_mb_step {
                    backward_end[*device].insert(*mb, end[i]);
                }
                let from = grads_from.entry((*device, *stage)).or_insert(f64::INFINITY);
                if per_mb_step {
                    // Its gradients move into the global buffer until the step that follows.
                    *from = end[i];
                }
                *from = from.min(end[i]);
                let freed = if split[*stage] {
                    -st.weight_saved_bytes - st.carried_bytes
                } else {
                    -st.saved_bytes
                };
                mem_events[*device].push((end[i], freed));
                let b = st.parameter_bytes;
                mem_events[*device].push((start[i], b));
                mem_events[*device].push((end[i], -b));
                flight_events
                    .entry((*device, *stage))
                    .or_default()
                    .push((end[i], -1));
            }
            TaskKind::Step { device, stage } => {
                devices[*device].busy_s += dt;
                let to = grads_to
                    .entry((*device, *stage))
                    .or_insert(f64::NEG_INFINITY);
                *to = to.max(end[i]);
                if per_mb_step {
                    step_end[*device].push(end[i]);
                }
                let from = grads_from.entry((*device, *stage)).or_insert(f64::INFINITY);
                if per_mb_step && from.is_finite() {
                    // One micro-batch's gradients, from its backward to this step.
                    let b = sg.stages[*stage].parameter_bytes;
                    mem_events[*device].push((*from, b));
                    mem_events[*device].push((end[i], -b));
                    *from = f64::INFINITY;
                }
            }
            TaskKind::AllReduce { devices: g, .. } => {
                for &d in g {
                    devices[d].allreduce_s += dt;
                }
            }
            TaskKind::Transfer { .. } | TaskKind::Memory { .. } => {}
        }
    }
    if per_mb_step {
        for t in step_end.iter_mut() {
            t.sort_by(f64::total_cmp);
        }
        tied_stash_memory(
            sg,
            &versions,
            &place,
            &step_end,
            [&forward_end, &backward_end],
            &mut mem_events,
        );
    }
    for (d, p) in place.iter().enumerate() {
        for &(s, _) in p {
            devices[d].used = !sched.programs.get(d).is_none_or(|p| p.is_empty());
            let b = sg.stages[s].parameter_bytes;
            mem_events[d].push((0.0, sg.stages[s].static_bytes - b));
            let from = grads_from.get(&(d, s)).copied().unwrap_or(f64::INFINITY);
            let to = grads_to.get(&(d, s)).copied().unwrap_or(f64::NEG_INFINITY);
            if per_mb_step {
                // Counted per micro-batch at each step.
            } else if from.is_finite() {
                mem_events[d].push((from, b));
                if to >= from {
                    mem_events[d].push((to, -b));
                }
            } else {
                mem_events[d].push((0.0, b));
            }
        }
    }
    let mut stage_in_flight = vec![0usize; sg.stages.len()];
    for d in 0..ndev {
        // Frees before allocations at equal times.
        let ev = &mut mem_events[d];
        ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let (mut cur, mut peak) = (0.0f64, 0.0f64);
        let mut curve = Vec::with_capacity(ev.len());
        for &(t, delta) in ev.iter() {
            cur += delta;
            peak = peak.max(cur);
            curve.push((t, cur));
        }
        devices[d].peak_memory_bytes = peak;
        devices[d].memory_over_time = curve;
        for &(s, _) in &place[d] {
            let Some(fe) = flight_events.get_mut(&(d, s)) else {
                continue;
            };
            fe.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let (mut c, mut pk) = (0i64, 0i64);
            for &(_, x) in fe.iter() {
                c += x;
                pk = pk.max(c);
            }
            stage_in_flight[s] = stage_in_flight[s].max(pk as usize);
        }
    }
    let used = devices.iter().filter(|d| d.used).count();
    let busy: f64 = devices.iter().filter(|d| d.used).map(|d| d.busy_s).sum();
    let bubble = if used > 0 && t_end > 0.0 {
        (1.0 - busy / (used as f64 * t_end)).max(0.0)
    } else {
        0.0
    };
    let tasks = kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| TaskRecord {
            kind,
            start: start[i],
            end: end[i],
        })
        .collect();
    Ok(SimResult {
        iteration_time_s: t_end,
        bubble_fraction: bubble,
        devices,
        stage_in_flight,
        tasks,
    })
}

/// A device program's forwards and backwards in order, as `(is_forward, mb)`.
fn fb_order(prog: &[Instr]) -> Vec<(bool, usize)> {
    prog.iter()
        .filter_map(|i| match i {
            Instr::Forward { mb, .. } => Some((true, *mb)),
            Instr::Backward { mb, .. } => Some((false, *mb)),
            _ => None,
        })
        .collect()
}

/// Weight stashing's bytes on stage `s` per stashed micro-batch: the parameters the backward
/// reads that the stage versions itself (copied for the micro-batches that see a step between
/// forward and backward, [`schedule::stashed`]); not the tied ones another holder's forward
/// versions ([`StageGraph::tied_stash`], copied for every micro-batch).
fn own_stash_bytes(sg: &StageGraph, s: usize) -> f64 {
    let tied: f64 = sg
        .tied_stash
        .get(s)
        .map_or(0.0, |v| v.iter().map(|x| x.1).sum());
    let unstashed = sg.unstashed.get(s).copied().unwrap_or(0.0);
    (sg.stages[s].parameter_bytes - tied - unstashed).max(0.0)
}

/// Per stage that sets a version others follow ([`StageGraph::tied_stash`]): per micro-batch,
/// the steps its first replica runs before its forward of it
/// ([`schedule::steps_before_forward`]).
fn version_steps(
    sg: &StageGraph,
    sched: &Schedule,
    place: &[Vec<(usize, usize)>],
) -> FxHashMap<usize, Vec<usize>> {
    let mut out: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    for &(owner, _, _) in sg.tied_stash.iter().flatten() {
        out.entry(owner).or_insert_with(|| {
            place
                .iter()
                .position(|p| p.contains(&(owner, 0)))
                .and_then(|d| sched.programs.get(d))
                .map(|prog| schedule::steps_before_forward(&fb_order(prog)))
                .unwrap_or_default()
        });
    }
    out
}

/// Under per-micro-batch updates: the stashes of tied parameters whose version another
/// holder's forward sets ([`StageGraph::tied_stash`]). As codegen emits them, a follower stashes
/// them for micro-batch `j` right after its own step number `v`, with `v` the backwards that
/// holder ran before its forward of `j` (at the start for `v = 0`), and the copy lives until
/// its last reader: the follower's backward of `j` if that reads it, else its forward.
fn tied_stash_memory(
    sg: &StageGraph,
    versions: &FxHashMap<usize, Vec<usize>>,
    place: &[Vec<(usize, usize)>],
    step_end: &[Vec<f64>],
    [forward_end, backward_end]: [&[FxHashMap<usize, f64>]; 2],
    mem_events: &mut [Vec<(f64, f64)>],
) {
    for (d, p) in place.iter().enumerate() {
        let Some(&(s, _)) = p.first() else { continue };
        for &(owner, bytes, backward) in sg.tied_stash.get(s).into_iter().flatten() {
            let ends = if backward {
                &backward_end[d]
            } else {
                &forward_end[d]
            };
            for (mb, &v) in versions.get(&owner).into_iter().flatten().enumerate() {
                let Some(&until) = ends.get(&mb) else {
                    continue;
                };
                let from = match v {
                    0 => 0.0,
                    v => match step_end[d].get(v - 1) {
                        Some(&t) => t,
                        None => continue,
                    },
                };
                mem_events[d].push((from.min(until), bytes));
                mem_events[d].push((until, -bytes));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{earliest_fit, Reservations};
    use std::collections::VecDeque;

    fn reserved(list: &[(f64, f64)]) -> Reservations {
        let mut r = Reservations::default();
        for &(s, e) in list {
            r.reserve(s, e);
        }
        r
    }

    #[test]
    fn earliest_fit_takes_the_first_common_gap() {
        let mut busy = vec![reserved(&[(2.0, 3.0), (5.0, 6.0)]), reserved(&[(0.0, 1.0)])];
        // Alone on resource 0: before its first reservation when it fits, else in a later gap.
        assert_eq!(earliest_fit(&mut busy, &[0], 0.0, 2.0), 0.0);
        assert_eq!(earliest_fit(&mut busy, &[0], 0.0, 2.5), 6.0);
        assert_eq!(earliest_fit(&mut busy, &[0], 0.0, 1.5), 0.0);
        // Both resources: [1, 2) is free on both, [3, 5) too.
        assert_eq!(earliest_fit(&mut busy, &[0, 1], 0.0, 1.0), 1.0);
        assert_eq!(earliest_fit(&mut busy, &[0, 1], 0.0, 1.5), 3.0);
        // A zero-length task starts inside no reservation.
        assert_eq!(earliest_fit(&mut busy, &[0], 2.5, 0.0), 3.0);
        // Reservations that ended by `at` are dropped.
        assert_eq!(earliest_fit(&mut busy, &[0], 4.0, 0.5), 4.0);
        assert_eq!(busy[0].each, VecDeque::from([(5.0, 6.0)]));
        assert_eq!(busy[0].runs, VecDeque::from([(5.0, 6.0)]));
    }

    /// Back-to-back reservations (a saturated channel) are one run for tasks of positive length,
    /// while a zero-length task still starts on a boundary between two of them; reserving into
    /// the gap between two runs joins them. The same answers as walking the reservations one by
    /// one, on random reservations.
    #[test]
    fn touching_reservations_are_one_run() {
        let mut busy = vec![reserved(&[(0.0, 1.0), (2.0, 3.0), (1.0, 2.0), (4.0, 5.0)])];
        assert_eq!(busy[0].runs, VecDeque::from([(0.0, 3.0), (4.0, 5.0)]));
        assert_eq!(earliest_fit(&mut busy, &[0], 0.5, 0.5), 3.0);
        assert_eq!(earliest_fit(&mut busy, &[0], 0.5, 1.5), 5.0);
        assert_eq!(earliest_fit(&mut busy, &[0], 1.0, 0.0), 1.0);
        assert_eq!(earliest_fit(&mut busy, &[0], 1.5, 0.0), 2.0);
        busy[0].reserve(3.0, 4.0);
        assert_eq!(busy[0].runs, VecDeque::from([(0.0, 5.0)]));

        // Against the one-by-one walk: random integer reservations on 3 resources.
        let mut x = 12345u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..200 {
            let mut busy = vec![Reservations::default(); 3];
            let mut plain: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 3];
            let mut at = 0.0;
            for _ in 0..40 {
                let rs: Vec<usize> = (0..3).filter(|_| next(2) == 1).collect();
                let d = next(4) as f64;
                at += next(3) as f64;
                // The reference: the smallest t >= at overlapping no reservation of rs.
                let mut t = at;
                while rs.iter().any(|&r| {
                    plain[r]
                        .iter()
                        .any(|&(a, e)| a < t + d && e > t && (d > 0.0 || a < t))
                }) {
                    t += 1.0;
                }
                assert_eq!(earliest_fit(&mut busy, &rs, at, d), t);
                if d > 0.0 {
                    for &r in &rs {
                        busy[r].reserve(t, t + d);
                        plain[r].push((t, t + d));
                    }
                }
            }
        }
    }
}
