//! `insert-comm`: every device's instruction list (see [`crate::codegen`] for the contract).
//!
//! Routes between a producer stage `p` (`r_p` replicas, slices of `q_p = b/r_p` samples) and a
//! consumer stage `c` for a cross value `v` of micro-batch `m`:
//! - `v` has the batch on axis 0 ([`Layout::Rows`]): one message per replica pair `(i, j)` whose
//!   sample ranges `[i·q_p, (i+1)·q_p)` and `[j·q_c, (j+1)·q_c)` overlap, carrying exactly the
//!   overlap (a split when `r_c > r_p`, a concat when `r_c < r_p`, both for `n→m`: DAPPLE's
//!   uneven replication by even slices); the consumer concatenates the pieces in sample order;
//! - `v` has no batch axis ([`Layout::Whole`]): consumer replica `j` gets the whole value from
//!   producer replica `j mod r_p`; its cotangent goes back the same way and the producer sums
//!   the cotangents it receives (the gradient of a broadcast is a sum); a producer replica that
//!   no consumer replica reads from (`r_p > r_c`, or round-robin consumers) takes a zero
//!   cotangent ([`Instr::Zeros`]);
//! - otherwise the replica counts must agree and replica `j` talks to replica `j`.
//!
//! With GraphPipe's per-stage micro-batch sizes (`gpp-per-stage`, [`PerStageOrder`]) stage `s`
//! runs `B/b_s` micro-batches; between stages of different sizes the ranges are global sample
//! ranges (replica `j` of micro-batch `m` holds `[m·b_s + j·q_s, m·b_s + (j+1)·q_s)`), so a
//! consumer micro-batch may gather pieces of several producer micro-batches (named
//! `v#r{i}m{m_p}`) and a producer micro-batch may feed several consumer ones; only
//! [`Layout::Rows`] values can be re-sliced that way. Each stage follows the per-stage
//! `k_sFk_sB` order with the warm-ups the simulator uses.
//!
//! Cotangents take the routes of their activations in reverse. Message tags are allocated in a
//! deterministic order, so the same plan always gives byte-identical schedules.
//!
//! Several chunks per device group (`interleaved-V`, `zbv`:
//! [`crate::sim::schedule::chunk_order`]): every stage replica's list is built as above, cut
//! into one segment per pass (`F`, `B`, `W`), and each device's list is its chunks' segments in
//! the device's order, an [`Instr::Stage`] before each switch of chunk; the flush is the
//! device's all-reduces (its chunks' gradients together, one per device set), then each
//! chunk's step.

use super::layout::{concrete_dims, cot_name, layout, Layout};
use crate::sim::schedule::{
    chunk_order, fb_order_grouped, round_robin_micro_batches, stashed, steps_before_forward,
    weight_lag, with_weight_passes, Pass,
};
use crate::sim::{deepest_stage, heaviest_path_to_sink, ScheduleKind};
use pipec_compiler::ir::{Module, Value};
use pipec_compiler::program::{
    piece_name, DataInput, DeviceProgram, Instr, PieceKind, Slice, StageProgram,
};
use pipec_compiler::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Everything [`device_programs`] reads.
pub struct Context<'a> {
    pub m: &'a Module,
    pub batch_sym: &'a str,
    pub micro_batch: u64,
    pub micro_batches: u64,
    pub schedule: ScheduleKind,
    /// Dense device ids per stage (replica order).
    pub stage_devices: &'a [Vec<usize>],
    /// Stage DAG: predecessors per stage.
    pub preds: &'a [BTreeSet<usize>],
    /// Per stage: values it sends and their consumer stages.
    pub stage_outputs: Vec<Vec<(Value, Vec<usize>)>>,
    /// Per stage: values it receives.
    pub stage_inputs: Vec<Vec<Value>>,
    /// `(producer stage, value)` → consumer stages that send a cotangent back.
    pub cot_from: &'a HashMap<(usize, Value), Vec<usize>>,
    pub stages: &'a [StageProgram],
    pub data_inputs: &'a [DataInput],
    /// Per stage: how its replicas share micro-batches.
    pub replication: &'a [Replication],
    /// Trainable parameter → devices holding it.
    pub holders: &'a BTreeMap<String, Vec<usize>>,
    /// Per stage: `(received activation, its gradient output)`.
    pub input_grads: Vec<Vec<(String, String)>>,
    /// Per stage: `(parameter, gradient output)`.
    pub param_grads: Vec<Vec<(String, String)>>,
    /// PipeDream's vertical sync: every stage reads, for micro-batch `j`, the weight version
    /// the input stage (the deepest from the sink) read.
    pub vertical_sync: bool,
    /// GraphPipe's per-stage micro-batch sizes and kFkB groups (`gpp-per-stage`), with the
    /// warm-up of every stage; `None`: `micro_batch` everywhere, the schedule kind's order.
    pub per_stage: Option<PerStageOrder>,
    /// Per device, its passes in the plan's order ([`super::CompileOptions::pass_orders`]);
    /// `None`: the schedule kind's order.
    pub pass_orders: Option<&'a [crate::sim::fill::PassOrder]>,
}

/// Per-stage micro-batch sizes `b_s`, groups `k_s` and warm-ups `K_s` (see
/// [`crate::sim::schedule`]'s per-stage schedule, which this order follows).
pub struct PerStageOrder {
    pub micro_batch: Vec<u64>,
    pub group: Vec<usize>,
    pub warmup: Vec<usize>,
}

/// Deterministic message tags: allocated on first request by either side.
#[derive(Default)]
struct Tags {
    map: HashMap<TagKey, u32>,
}

/// (cotangent?, value, consumer stage, producer replica, consumer replica, producer's
/// micro-batch, consumer's micro-batch).
type TagKey = (bool, String, usize, usize, usize, u32, u32);

impl Tags {
    /// The tag of value `v`'s message (or its cotangent's, `grad`) for consumer stage `c` from
    /// producer replica `i` (micro-batch `mp`) to consumer replica `j` (micro-batch `mc`).
    #[allow(clippy::too_many_arguments)]
    fn get(&mut self, grad: bool, v: &str, c: usize, i: usize, j: usize, mp: u32, mc: u32) -> u32 {
        let n = self.map.len() as u32;
        *self
            .map
            .entry((grad, v.to_string(), c, i, j, mp, mc))
            .or_insert(n)
    }
}

/// How a stage's replicas share the micro-batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    /// DAPPLE: every micro-batch is cut into `r` even slices, replica `k` takes slice `k`.
    Slices,
    /// PipeDream (1F1B-RR): replica `k` takes the whole micro-batches `m ≡ k (mod r)`.
    RoundRobin,
}

/// Samples `[lo, hi)` of micro-batch `m` that replica `k` of a stage with `r` replicas holds.
pub fn owned(mode: Replication, r: usize, k: usize, m: usize, b: u64) -> Option<(u64, u64)> {
    match mode {
        Replication::Slices => {
            let q = b / r as u64;
            Some((k as u64 * q, (k as u64 + 1) * q))
        }
        Replication::RoundRobin => (m % r == k).then_some((0, b)),
    }
}

/// One message of a route: producer replica `i`, consumer replica `j`, and the samples it
/// carries.
struct Hop {
    i: usize,
    j: usize,
    /// The producer's and the consumer's micro-batch (equal unless their sizes differ).
    mp: u32,
    mc: u32,
    /// The samples it carries relative to the producer's and to the consumer's micro-batch
    /// (equal unless the sizes differ; `None`: the whole value).
    at_p: Option<(u64, u64)>,
    at_c: Option<(u64, u64)>,
}

/// The messages carrying value `v` (layout `lay`) of micro-batch `m` from a producer stage
/// (`rp` replicas, `mp`) to a consumer stage (`rc`, `mc`).
#[allow(clippy::too_many_arguments)]
fn routes(
    lay: Layout,
    b: u64,
    m: usize,
    (rp, mp): (usize, Replication),
    (rc, mc): (usize, Replication),
    v: &str,
) -> Result<Vec<Hop>> {
    let prod: Vec<(usize, (u64, u64))> = (0..rp)
        .filter_map(|i| owned(mp, rp, i, m, b).map(|o| (i, o)))
        .collect();
    let cons: Vec<(usize, (u64, u64))> = (0..rc)
        .filter_map(|j| owned(mc, rc, j, m, b).map(|o| (j, o)))
        .collect();
    Ok(match lay {
        Layout::Rows | Layout::Axis(_) => {
            let mut out = Vec::new();
            for &(i, (plo, phi)) in &prod {
                for &(j, (clo, chi)) in &cons {
                    let (lo, hi) = (plo.max(clo), phi.min(chi));
                    if lo < hi {
                        out.push(Hop {
                            i,
                            j,
                            mp: m as u32,
                            mc: m as u32,
                            at_p: Some((lo, hi)),
                            at_c: Some((lo, hi)),
                        });
                    }
                }
            }
            out
        }
        Layout::Whole => cons
            .iter()
            .enumerate()
            .map(|(x, &(j, _))| Hop {
                i: prod[x % prod.len()].0,
                j,
                mp: m as u32,
                mc: m as u32,
                at_p: None,
                at_c: None,
            })
            .collect(),
        Layout::Other => {
            let same = prod.len() == cons.len() && prod.iter().zip(&cons).all(|(a, c)| a.1 == c.1);
            if !same {
                return Err(Error::named(
                    v,
                    format!(
                        "codegen: the value carries the batch on more than one axis and crosses between stages that split micro-batches differently ({rp} and {rc} replicas)"
                    ),
                ));
            }
            prod.iter()
                .zip(&cons)
                .map(|(a, c)| Hop {
                    i: a.0,
                    j: c.0,
                    mp: m as u32,
                    mc: m as u32,
                    at_p: None,
                    at_c: None,
                })
                .collect()
        }
    })
}

/// The messages of value `v` between a producer stage (`rp` replicas, micro-batch `bp`) and a
/// consumer stage (`rc`, `bc`) of different micro-batch sizes (`gpp-per-stage`; both split
/// their micro-batches evenly): the pieces where the consumer replica `j`'s samples of its
/// micro-batch `mc` (`side = Consumer`) or the producer replica `i`'s samples of its micro-batch
/// `mp` (`side = Producer`) overlap the other stage's replica slices. Only batch-major values
/// can be re-sliced.
fn routes_resliced(
    lay: Layout,
    (bp, rp): (u64, usize),
    (bc, rc): (u64, usize),
    side: Side,
    v: &str,
) -> Result<Vec<Hop>> {
    if lay.batch_axis().is_none() {
        return Err(Error::named(
            v,
            format!(
                "codegen: the value has no single batch axis and crosses between stages of different micro-batch sizes ({bp} and {bc}); plan without gpp-per-stage"
            ),
        ));
    }
    let (qp, qc) = (bp / rp as u64, bc / rc as u64);
    let (lo, hi, other_b, other_r) = match side {
        Side::Consumer { mc, j } => {
            let lo = mc as u64 * bc + j as u64 * qc;
            (lo, lo + qc, bp, rp)
        }
        Side::Producer { mp, i } => {
            let lo = mp as u64 * bp + i as u64 * qp;
            (lo, lo + qp, bc, rc)
        }
    };
    let mut out = Vec::new();
    let mut x = lo;
    for (om, oj, n) in crate::sim::schedule::covering(other_b, other_r, lo, hi) {
        let (mp, i, mc, j) = match side {
            Side::Consumer { mc, j } => (om as u32, oj, mc, j),
            Side::Producer { mp, i } => (mp, i, om as u32, oj),
        };
        let (p0, c0) = (mp as u64 * bp, mc as u64 * bc);
        out.push(Hop {
            i,
            j,
            mp,
            mc,
            at_p: Some((x - p0, x + n - p0)),
            at_c: Some((x - c0, x + n - c0)),
        });
        x += n;
    }
    Ok(out)
}

/// Which side of a stage edge asks for its messages (for [`routes_resliced`]).
#[derive(Clone, Copy)]
enum Side {
    Consumer { mc: u32, j: usize },
    Producer { mp: u32, i: usize },
}

/// Shape of the message of hop samples `samples` of a value of type `ty`: the overlap's rows for
/// [`Layout::Rows`], else the whole value as a replica holding `own` samples has it.
fn piece_shape(
    lay: Layout,
    samples: Option<(u64, u64)>,
    own: u64,
    ty: &pipec_compiler::ir::TensorType,
    batch_sym: &str,
) -> Vec<i64> {
    match (lay, samples) {
        (Layout::Rows | Layout::Axis(_), Some((lo, hi))) => concrete_dims(ty, batch_sym, hi - lo),
        _ => concrete_dims(ty, batch_sym, own),
    }
}

/// What a sender holding samples `held` of the micro-batch cuts out for a hop: the row slice
/// (`None` when it sends all it holds) and the message shape.
fn send_piece(
    lay: Layout,
    samples: Option<(u64, u64)>,
    held: (u64, u64),
    ty: &pipec_compiler::ir::TensorType,
    batch_sym: &str,
) -> (Option<Slice>, Vec<i64>) {
    let own = held.1 - held.0;
    let slice = match (lay.batch_axis(), samples) {
        (Some(axis), Some((lo, hi))) if (lo - held.0, hi - held.0) != (0, own) => Some(Slice {
            lo: lo - held.0,
            hi: hi - held.0,
            of: own,
            axis: axis as u32,
        }),
        _ => None,
    };
    (slice, piece_shape(lay, samples, own, ty, batch_sym))
}

/// Where a `Send` goes in the list after a compute: `(stage, device, micro-batch, value)` of the
/// receiving end. By stage, then by device: a replica gets all its values before the next
/// replica's, so it can start as soon as the plan's one message per device pair would let it.
/// Within, in the order the receiver receives them (by its micro-batch, where micro-batch sizes
/// differ, then by its value order), so both ends of a device pair order its messages alike
/// ([`program::pair_order`](pipec_compiler::program::pair_order)).
type SendOrder = (usize, usize, u32, usize);

/// One message of a value arriving in pieces: the piece's buffer name, sender, tag and shape.
struct Incoming {
    tensor: String,
    peer: usize,
    tag: u32,
    shape: Vec<i64>,
}

/// Receive `output` of micro-batch `mb` from its `pieces`: one `Recv` straight into `output`
/// when there is one piece, else one `Recv` per piece and a join: a `Concat` along the batch
/// axis of `lay`, or, when the pieces are partial sums (the cotangent of a batch-independent
/// value from several consumer replicas), a running sum: the first piece is received into
/// `output` and each later one is added to it as it arrives, so two pieces are live at most,
/// not all of them.
fn recv_joined(
    list: &mut Vec<Instr>,
    mb: u32,
    output: &str,
    dtype: &str,
    pieces: Vec<Incoming>,
    lay: Layout,
    sum: bool,
) {
    if sum && pieces.len() > 1 {
        for (k, p) in pieces.into_iter().enumerate() {
            let tensor = if k == 0 { output.to_string() } else { p.tensor };
            list.push(Instr::Recv {
                mb,
                tensor: tensor.clone(),
                peer: p.peer,
                tag: p.tag,
                dtype: dtype.to_string(),
                shape: p.shape,
            });
            if k > 0 {
                list.push(Instr::Sum {
                    mb,
                    inputs: vec![output.to_string(), tensor],
                    output: output.to_string(),
                });
            }
        }
        return;
    }
    let whole = pieces.len() == 1;
    let mut names = Vec::with_capacity(pieces.len());
    for p in pieces {
        let tensor = if whole { output.to_string() } else { p.tensor };
        names.push(tensor.clone());
        list.push(Instr::Recv {
            mb,
            tensor,
            peer: p.peer,
            tag: p.tag,
            dtype: dtype.to_string(),
            shape: p.shape,
        });
    }
    if names.len() > 1 {
        let output = output.to_string();
        list.push(if sum {
            Instr::Sum {
                mb,
                inputs: names,
                output,
            }
        } else {
            Instr::Concat {
                mb,
                inputs: names,
                output,
                axis: lay.batch_axis().unwrap_or(0) as u32,
            }
        });
    }
}

/// The hops of value `v` (layout `lay`) on the edge from stage `p` to stage `c` that concern one
/// replica: for `side = Consumer { mc, j }` the pieces consumer replica `j` receives for its
/// micro-batch `mc`, for `Producer { mp, i }` the pieces producer replica `i` sends of its `mp`.
fn edge_hops(
    cx: &Context,
    lay: Layout,
    p: usize,
    c: usize,
    side: Side,
    v: &str,
) -> Result<Vec<Hop>> {
    let size = |s: usize| {
        cx.per_stage
            .as_ref()
            .map_or(cx.micro_batch, |o| o.micro_batch[s])
    };
    let (bp, bc) = (size(p), size(c));
    let (rp, rc) = (cx.stage_devices[p].len(), cx.stage_devices[c].len());
    if bp != bc {
        return routes_resliced(lay, (bp, rp), (bc, rc), side, v);
    }
    let (pm, cm) = ((rp, cx.replication[p]), (rc, cx.replication[c]));
    Ok(match side {
        Side::Consumer { mc, j } => routes(lay, bp, mc as usize, pm, cm, v)?
            .into_iter()
            .filter(|h| h.j == j)
            .collect(),
        Side::Producer { mp, i } => routes(lay, bp, mp as usize, pm, cm, v)?
            .into_iter()
            .filter(|h| h.i == i)
            .collect(),
    })
}

/// Build every device's instruction list.
pub fn device_programs(cx: &Context) -> Result<Vec<DeviceProgram>> {
    let g = &cx.m.graph;
    let ndev = cx
        .stage_devices
        .iter()
        .flatten()
        .collect::<BTreeSet<_>>()
        .len();
    // Interleaved 1F1B: each replica's list cut into per-pass segments, merged per device below.
    let chunks = cx.schedule.chunks();
    let mut chunk_lists: ChunkLists = BTreeMap::new();
    let mut programs: Vec<Option<DeviceProgram>> = (0..ndev).map(|_| None).collect();
    // Per stage, the longest path to a sink: in stages (the warm-up's depth) and in workers
    // (1F1B-RR's number of machines).
    let mut succ = vec![Vec::new(); cx.preds.len()];
    for (c, ps) in cx.preds.iter().enumerate() {
        for &p in ps {
            succ[p].push(c);
        }
    }
    let depth = heaviest_path_to_sink(&succ, &vec![1; succ.len()]);
    let replicas: Vec<usize> = cx.stage_devices.iter().map(Vec::len).collect();
    let workers = heaviest_path_to_sink(&succ, &replicas);
    let batch = cx.micro_batch * cx.micro_batches;
    let mut tags = Tags::default();
    // The stage that sends `v` (usize::MAX if none does).
    let stage_of_value = |v: Value| -> usize {
        cx.stage_outputs
            .iter()
            .position(|outs| outs.iter().any(|(x, _)| *x == v))
            .unwrap_or(usize::MAX)
    };
    let data: HashMap<&str, &DataInput> = cx
        .data_inputs
        .iter()
        .map(|d| (d.name.as_str(), d))
        .collect();
    // All-reduce groups: devices -> gradient names; in one global order.
    let mut groups: BTreeMap<Vec<usize>, Vec<String>> = BTreeMap::new();
    for (p, devs) in cx.holders {
        let mut d = devs.clone();
        d.sort_unstable();
        d.dedup();
        if d.len() > 1 {
            groups.entry(d).or_default().push(format!("grad/{p}"));
        }
    }
    // Under per-micro-batch steps, a tied parameter's holders update it together (one
    // all-reduce per micro-batch over all of them), and every holder's computes of micro-batch
    // `j` read the version its *first* reader's forward of `j` read (the holder stage deepest
    // from the sink): the others stash it right after that many of their own steps
    // (`forward_versions`), so the one parameter has one version per micro-batch, as in
    // single-device training (PipeDream's vertical sync, for that parameter).
    let stage_of_device = |d: usize| cx.stage_devices.iter().position(|ds| ds.contains(&d));
    // Per stage: `(parameter, stage whose forward sets its version)` for the tied parameters it
    // holds but does not set.
    let mut tied_to: Vec<Vec<(String, usize)>> = vec![Vec::new(); cx.stage_devices.len()];
    if cx.schedule.per_micro_batch_step() && cx.vertical_sync {
        // Vertical sync: every parameter a step updates follows the input stage's versions
        // (one no step changes, held but not trained or on a stage without a step, has one).
        let input = deepest_stage(&depth, 0..cx.stage_devices.len());
        for (t, st) in cx.stages.iter().enumerate() {
            if Some(t) != input && st.step.is_some() {
                tied_to[t] = st
                    .params
                    .iter()
                    .filter(|q| cx.holders.contains_key(*q))
                    .map(|q| (q.clone(), input.unwrap_or(0)))
                    .collect();
            }
        }
    } else if cx.schedule.per_micro_batch_step() {
        for (p, devs) in cx.holders {
            let stages: BTreeSet<usize> = devs.iter().filter_map(|&d| stage_of_device(d)).collect();
            let Some(first) = deepest_stage(&depth, stages.iter().copied()) else {
                continue;
            };
            for &t in stages.iter().filter(|&&t| t != first) {
                tied_to[t].push((p.clone(), first));
            }
        }
    }
    // Per stage and micro-batch: the optimizer steps a stage runs before its forward of it
    // (one after each backward under per-micro-batch steps).
    let forward_versions = |t: usize| -> Vec<usize> {
        let nmb = cx.micro_batches as usize;
        let k = cx.schedule.warmup(depth[t], nmb);
        steps_before_forward(&fb_order_grouped(k, cx.schedule.group(), nmb))
    };
    let group_tags: Vec<(Vec<usize>, Vec<String>, u32)> = groups
        .into_iter()
        .enumerate()
        .map(|(k, (d, t))| (d, t, 1_000_000 + k as u32))
        .collect();
    for (s, devs) in cx.stage_devices.iter().enumerate() {
        let st = &cx.stages[s];
        let r = devs.len();
        let mode = cx.replication[s];
        // This stage's micro-batch size, count, warm-up and group.
        let (b, k, group) = match &cx.per_stage {
            Some(o) => (o.micro_batch[s], o.warmup[s], o.group[s]),
            None => {
                let nmb = cx.micro_batches as usize;
                let k = cx.schedule.warmup(depth[s], nmb);
                (cx.micro_batch, k, cx.schedule.group())
            }
        };
        let nmb = (batch / b.max(1)) as usize;
        // Data inputs this stage reads (either piece).
        let mut loads: Vec<&DataInput> = Vec::new();
        for name in st
            .fwd
            .inputs
            .iter()
            .chain(st.bwd.iter().flat_map(|p| p.inputs.iter()))
        {
            if let Some(d) = data.get(name.as_str()) {
                if !loads.iter().any(|x| x.name == d.name) {
                    loads.push(d);
                }
            }
        }
        let param_grad_names: Vec<String> = cx.param_grads[s].iter().map(|x| x.1.clone()).collect();
        // The parameters another stage's forward versions (`tied_to`), by `(steps, mb)`: every
        // replica stashes them for `mb` once it has run `steps` steps.
        let mut tied_stash: BTreeMap<(usize, u32), Vec<String>> = BTreeMap::new();
        let mut forward_steps: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (q, first) in &tied_to[s] {
            let steps = forward_steps
                .entry(*first)
                .or_insert_with(|| forward_versions(*first));
            for (mb, &v) in steps.iter().enumerate() {
                tied_stash
                    .entry((v, mb as u32))
                    .or_default()
                    .push(q.clone());
            }
        }
        if cx.schedule.per_micro_batch_step() && r > 1 && mode == Replication::RoundRobin {
            return Err(Error::msg(format!(
                "codegen: --schedule {} updates after every micro-batch, all replicas together, but stage {s}'s {r} replicas take micro-batches in turn (its micro-batch of {b} samples cannot be split {r} ways); use a micro-batch divisible by {r}",
                cx.schedule.name()
            )));
        }
        for (j, &dev) in devs.iter().enumerate() {
            let mut list: Vec<Instr> = Vec::new();
            let mut live: HashMap<u32, Vec<String>> = HashMap::new();
            // The stage's order over all micro-batches; a round-robin replica keeps the events
            // of its own micro-batches (so its order is consistent with its neighbours'). Under
            // PipeDream's 1F1B-RR a replica runs 1F1B over its own micro-batches after
            // NOAM = ⌈W(s)/r⌉ warm-up forwards (W: workers on the longest path to a sink), as
            // the simulator's 1F1B-RR generator does.
            let events: Vec<(bool, usize)> = if cx.schedule.round_robin() && cx.per_stage.is_none()
            {
                let mine = round_robin_micro_batches(j, r, nmb);
                let noam = workers[s].div_ceil(r.max(1)).max(1);
                fb_order_grouped(noam, 1, mine.len())
                    .into_iter()
                    .map(|(f, l)| (f, mine[l]))
                    .collect()
            } else {
                fb_order_grouped(k, group, nmb)
            };
            // A split backward runs its weight-gradient part later (zero bubble).
            let split = st.bwd_b.is_some() && st.bwd_w.is_some();
            // PipeDream's asynchronous 1F1B: an update after every backward, and the
            // parameters stashed for the micro-batches that see one between their forward and
            // backward.
            let per_mb_step = cx.schedule.per_micro_batch_step();
            let stash: Vec<bool> = if per_mb_step {
                stashed(&events)
            } else {
                Vec::new()
            };
            // Only what a step updates has versions to keep apart, and only the backward
            // needs a copy: the forward reads the live version, the one the copy holds.
            let stash_params: Vec<String> = st
                .params
                .iter()
                .filter(|q| {
                    cx.holders.contains_key(*q)
                        && st.bwd.as_ref().is_some_and(|b| b.inputs.contains(q))
                        && !tied_to[s].iter().any(|(t, _)| t == *q)
                })
                .cloned()
                .collect();
            let mut steps_done = 0usize;
            let mut tied_stashed: BTreeSet<u32> = BTreeSet::new();
            let emit_tied = |list: &mut Vec<Instr>,
                             live: &mut HashMap<u32, Vec<String>>,
                             stashed: &mut BTreeSet<u32>,
                             steps: usize| {
                for (&(_, mb), names) in tied_stash.range((steps, 0)..=(steps, u32::MAX)) {
                    list.push(Instr::Stash {
                        mb,
                        tensors: names.clone(),
                    });
                    live.entry(mb).or_default().extend(names.iter().cloned());
                    stashed.insert(mb);
                }
            };
            emit_tied(&mut list, &mut live, &mut tied_stashed, 0);
            // The plan's own order (weight passes moved into idle slots), else the kind's
            // (also where the plan has no weight pass for a backward codegen splits: the
            // simulator splits by the same rule, so this does not happen).
            let planned = cx.pass_orders.and_then(|o| o.get(dev)).map(|order| {
                order
                    .iter()
                    .filter(|x| x.1 == s && (split || x.0 != Pass::Wgt))
                    .map(|x| (x.0, x.2))
                    .collect::<Vec<_>>()
            });
            let passes = planned
                .filter(|p| !p.is_empty() && (!split || p.iter().any(|x| x.0 == Pass::Wgt)))
                .unwrap_or_else(|| {
                    with_weight_passes(&events, split, weight_lag(cx.schedule, &depth, s))
                });
            // The all-reduces of the device's gradients (in one global order) and the step:
            // once at the end (the flush), or for micro-batch `mb` alone (its own tags).
            let update = |list: &mut Vec<Instr>, mb: Option<u32>| {
                for (k, (group, tensors, tag)) in group_tags.iter().enumerate() {
                    if group.contains(&dev) {
                        let tag = match mb {
                            None => *tag,
                            Some(mb) => 1_000_000 + (k * nmb) as u32 + mb + group_tags.len() as u32,
                        };
                        list.push(Instr::AllReduce {
                            group: group.clone(),
                            tensors: tensors.clone(),
                            tag,
                        });
                    }
                }
                if st.step.is_some() {
                    list.push(Instr::Step);
                }
            };
            // Several chunks per device: where each pass's instructions start.
            let mut segments: Vec<(Pass, u32, usize)> = Vec::new();
            for (pass, m) in passes {
                if chunks > 1 {
                    segments.push((pass, m as u32, list.len()));
                }
                let Some((olo, ohi)) = owned(mode, r, j, m, b) else {
                    continue;
                };
                let fwd = pass == Pass::Fwd;
                if let (Pass::Wgt, Some(w)) = (pass, &st.bwd_w) {
                    let mb = m as u32;
                    list.push(Instr::Compute {
                        pass: PieceKind::BwdW,
                        mb,
                    });
                    if !param_grad_names.is_empty() {
                        list.push(Instr::Accumulate {
                            mb,
                            tensors: param_grad_names.clone(),
                        });
                    }
                    let mut names = live.remove(&mb).unwrap_or_default();
                    names.retain(|x| !w.outputs.contains(x));
                    list.push(Instr::Free {
                        mb,
                        tensors: dedup(names),
                    });
                    continue;
                }
                let mb = m as u32;
                let own = ohi - olo;
                if fwd {
                    let keep = live.entry(mb).or_default();
                    for d in &loads {
                        let samples = match d.batch_axis {
                            Some(_) => {
                                let base = m as u64 * b;
                                [base + olo, base + ohi]
                            }
                            None => [0, 0],
                        };
                        list.push(Instr::Load {
                            mb,
                            input: d.name.clone(),
                            samples,
                        });
                        keep.push(d.name.clone());
                    }
                    // Activations in, grouped by producer stage in stage order (the plan's
                    // simulator receives a stage edge's values together, edges in that order).
                    let mut incoming: Vec<(usize, Vec<Instr>)> = Vec::new();
                    for &v in &cx.stage_inputs[s] {
                        let p = stage_of_value(v);
                        if p == usize::MAX {
                            return Err(Error::named(g.name(v), "codegen: no producer stage"));
                        }
                        let vn = g.name(v);
                        let ty = g.ty(v);
                        let lay = layout(ty, cx.batch_sym);
                        let side = Side::Consumer { mc: mb, j };
                        let hops = edge_hops(cx, lay, p, s, side, vn)?;
                        let mut pieces = Vec::with_capacity(hops.len());
                        for h in &hops {
                            pieces.push(Incoming {
                                tensor: piece_name(vn, h.i, h.mp, h.mc),
                                peer: cx.stage_devices[p][h.i],
                                tag: tags.get(false, vn, s, h.i, h.j, h.mp, h.mc),
                                shape: piece_shape(lay, h.at_c, own, ty, cx.batch_sym),
                            });
                        }
                        let mut part = Vec::new();
                        recv_joined(&mut part, mb, vn, &ty.dtype.to_string(), pieces, lay, false);
                        incoming.push((p, part));
                        keep.push(vn.to_string());
                    }
                    incoming.sort_by_key(|x| x.0);
                    list.extend(incoming.into_iter().flat_map(|x| x.1));
                    if !tied_stash.is_empty() && !tied_stashed.contains(&mb) {
                        return Err(Error::msg(format!(
                            "codegen: --schedule {}: stage {s} would run the forward of micro-batch {mb} before the version of its tied parameters that micro-batch reads exists",
                            cx.schedule.name()
                        )));
                    }
                    if stash.get(m).copied().unwrap_or(false) && !stash_params.is_empty() {
                        list.push(Instr::Stash {
                            mb,
                            tensors: stash_params.clone(),
                        });
                        keep.extend(stash_params.iter().cloned());
                    }
                    list.push(Instr::Compute {
                        pass: PieceKind::Fwd,
                        mb,
                    });
                    keep.extend(st.fwd.outputs.iter().cloned());
                    // Activations out, in [`SendOrder`].
                    let mut outgoing: Vec<(SendOrder, Instr)> = Vec::new();
                    for (v, cs) in &cx.stage_outputs[s] {
                        let vn = g.name(*v);
                        let ty = g.ty(*v);
                        let lay = layout(ty, cx.batch_sym);
                        for &c in cs {
                            // Where the consumer receives this value among its inputs.
                            let at = cx.stage_inputs[c]
                                .iter()
                                .position(|x| x == v)
                                .unwrap_or(usize::MAX);
                            let side = Side::Producer { mp: mb, i: j };
                            for h in edge_hops(cx, lay, s, c, side, vn)? {
                                let (slice, shape) =
                                    send_piece(lay, h.at_p, (olo, ohi), ty, cx.batch_sym);
                                let peer = cx.stage_devices[c][h.j];
                                outgoing.push((
                                    (c, peer, h.mc, at),
                                    Instr::Send {
                                        mb,
                                        tensor: vn.to_string(),
                                        peer,
                                        slice,
                                        tag: tags.get(false, vn, c, h.i, h.j, h.mp, h.mc),
                                        dtype: ty.dtype.to_string(),
                                        shape,
                                    },
                                ));
                            }
                        }
                    }
                    outgoing.sort_by_key(|x| x.0);
                    // A value other stages read that its backward does not read, and that this
                    // replica sends to none of them (a batch-independent value goes from one
                    // producer replica) or sends last as a slice (a slice is copied out; only a
                    // whole-buffer send moves the buffer): freed now, not held with the
                    // micro-batch to its backward.
                    let last_send_sliced = |vn: &str| {
                        outgoing
                            .iter()
                            .rev()
                            .find_map(|(_, i)| match i {
                                Instr::Send { tensor, slice, .. } if tensor == vn => {
                                    Some(slice.is_some())
                                }
                                _ => None,
                            })
                            .unwrap_or(true)
                    };
                    let free_now: Vec<String> = match &st.bwd {
                        Some(bwd) => cx.stage_outputs[s]
                            .iter()
                            .map(|(v, _)| g.name(*v))
                            .filter(|vn| {
                                !bwd.inputs.iter().any(|x| x == vn) && last_send_sliced(vn)
                            })
                            .map(str::to_string)
                            .collect(),
                        None => Vec::new(),
                    };
                    list.extend(outgoing.into_iter().map(|x| x.1));
                    if !free_now.is_empty() {
                        if let Some(keep) = live.get_mut(&mb) {
                            keep.retain(|x| !free_now.contains(x));
                        }
                        list.push(Instr::Free {
                            mb,
                            tensors: dedup(free_now),
                        });
                    }
                    if st.bwd.is_none() {
                        let names = live.remove(&mb).unwrap_or_default();
                        list.push(Instr::Free {
                            mb,
                            tensors: dedup(names),
                        });
                        if per_mb_step && st.step.is_some() {
                            // Parameters no gradient reaches: still one update per micro-batch.
                            update(&mut list, Some(mb));
                            steps_done += 1;
                            emit_tied(&mut list, &mut live, &mut tied_stashed, steps_done);
                        }
                    }
                } else {
                    let Some(bwd) = &st.bwd else { continue };
                    let keep = live.entry(mb).or_default();
                    // Cotangents in, grouped by consumer stage in stage order.
                    let mut incoming: Vec<(usize, Vec<Instr>)> = Vec::new();
                    for (v, _) in &cx.stage_outputs[s] {
                        let Some(cs) = cx.cot_from.get(&(s, *v)) else {
                            continue;
                        };
                        let vn = g.name(*v);
                        let ty = g.ty(*v);
                        let lay = layout(ty, cx.batch_sym);
                        for &c in cs {
                            let side = Side::Producer { mp: mb, i: j };
                            let hops = edge_hops(cx, lay, s, c, side, vn)?;
                            let cot = cot_name(vn, c);
                            let mut pieces = Vec::with_capacity(hops.len());
                            for h in &hops {
                                pieces.push(Incoming {
                                    tensor: piece_name(&cot, h.j, h.mc, h.mp),
                                    peer: cx.stage_devices[c][h.j],
                                    tag: tags.get(true, vn, c, h.i, h.j, h.mp, h.mc),
                                    shape: piece_shape(lay, h.at_p, own, ty, cx.batch_sym),
                                });
                            }
                            if pieces.is_empty() {
                                // No consumer replica reads this value from this replica (a
                                // batch-independent value, more producer than consumer
                                // replicas): its cotangent here is zero; the replicas it was
                                // read from receive the whole sum.
                                if bwd.inputs.contains(&cot) {
                                    list.push(Instr::Zeros {
                                        mb,
                                        output: cot.clone(),
                                        dtype: ty.dtype.to_string(),
                                        shape: piece_shape(lay, None, own, ty, cx.batch_sym),
                                    });
                                    keep.push(cot);
                                }
                                continue;
                            }
                            // A batch-independent value's cotangent pieces are partial sums.
                            let sum = lay == Layout::Whole;
                            let mut part = Vec::new();
                            recv_joined(
                                &mut part,
                                mb,
                                &cot,
                                &ty.dtype.to_string(),
                                pieces,
                                lay,
                                sum,
                            );
                            incoming.push((c, part));
                            keep.push(cot);
                        }
                    }
                    incoming.sort_by_key(|x| x.0);
                    list.extend(incoming.into_iter().flat_map(|x| x.1));
                    let (pass, ran) = match &st.bwd_b {
                        Some(b) if split => (PieceKind::BwdB, b),
                        _ => (PieceKind::Bwd, bwd),
                    };
                    list.push(Instr::Compute { pass, mb });
                    keep.extend(
                        ran.outputs
                            .iter()
                            .filter(|o| !param_grad_names.contains(o))
                            .cloned(),
                    );
                    // Cotangents out, to the producers of what this stage received, in
                    // [`SendOrder`].
                    let mut outgoing: Vec<(SendOrder, Instr)> = Vec::new();
                    for (vn, gn) in &cx.input_grads[s] {
                        let Some(&v) = cx.stage_inputs[s].iter().find(|v| g.name(**v) == vn) else {
                            continue;
                        };
                        let p = stage_of_value(v);
                        let ty = g.ty(v);
                        let lay = layout(ty, cx.batch_sym);
                        // Where the producer receives this cotangent among its outputs'.
                        let at = cx.stage_outputs[p]
                            .iter()
                            .position(|(x, _)| *x == v)
                            .unwrap_or(usize::MAX);
                        let side = Side::Consumer { mc: mb, j };
                        for h in edge_hops(cx, lay, p, s, side, vn)? {
                            let (slice, shape) =
                                send_piece(lay, h.at_c, (olo, ohi), ty, cx.batch_sym);
                            let peer = cx.stage_devices[p][h.i];
                            outgoing.push((
                                (p, peer, h.mp, at),
                                Instr::Send {
                                    mb,
                                    tensor: gn.clone(),
                                    peer,
                                    slice,
                                    tag: tags.get(true, vn, s, h.i, h.j, h.mp, h.mc),
                                    dtype: ty.dtype.to_string(),
                                    shape,
                                },
                            ));
                        }
                    }
                    outgoing.sort_by_key(|x| x.0);
                    list.extend(outgoing.into_iter().map(|x| x.1));
                    if let (true, Some(w)) = (split, &st.bwd_w) {
                        // What the weight-gradient part reads stays; the rest goes now.
                        let keep = live.entry(mb).or_default();
                        let (stay, gone): (Vec<String>, Vec<String>) =
                            keep.drain(..).partition(|x| w.inputs.contains(x));
                        *keep = stay;
                        if !gone.is_empty() {
                            list.push(Instr::Free {
                                mb,
                                tensors: dedup(gone),
                            });
                        }
                        continue;
                    }
                    if !param_grad_names.is_empty() {
                        list.push(Instr::Accumulate {
                            mb,
                            tensors: param_grad_names.clone(),
                        });
                    }
                    let names = live.remove(&mb).unwrap_or_default();
                    list.push(Instr::Free {
                        mb,
                        tensors: dedup(names),
                    });
                    if per_mb_step && st.step.is_some() {
                        // Every micro-batch is an update of all the stage's parameters, those
                        // without a gradient too (their step with zero gradients, as the
                        // single-device update rule takes it: weight decay, momentum).
                        update(&mut list, Some(mb));
                        steps_done += 1;
                        emit_tied(&mut list, &mut live, &mut tied_stashed, steps_done);
                    }
                }
            }
            if chunks > 1 {
                // The device's flush is emitted with its other chunks' (below).
                chunk_lists.insert((s, j), (list, segments));
                continue;
            }
            if !per_mb_step {
                update(&mut list, None);
            }
            programs[dev] = Some(DeviceProgram {
                device: dev,
                stage: s,
                replica: j,
                instructions: list,
                chunks: Vec::new(),
            });
        }
    }
    if chunks > 1 {
        interleave_lists(cx, chunks, &group_tags, chunk_lists, &mut programs)?;
    }
    programs
        .into_iter()
        .enumerate()
        .map(|(d, p)| p.ok_or_else(|| Error::msg(format!("codegen: device {d} has no stage"))))
        .collect()
}

/// Per `(stage, replica)` under a schedule with several chunks per device group: its
/// instruction list and where each of its passes starts (`(pass, mb, index)`).
type ChunkLists = BTreeMap<(usize, usize), (Vec<Instr>, Vec<(Pass, u32, usize)>)>;

/// The device lists of a schedule with several chunks per device group (interleaved 1F1B,
/// ZB-V) from its stage replicas' lists cut into per-pass segments (`chunk_lists[(stage,
/// replica)]`: the list and where each `(pass, mb)` starts): device `d`, replica `j` of group
/// `r` of `P`, runs its chunks' segments in [`chunk_order`]`(kind, r, P, M)`, with an
/// [`Instr::Stage`] at every switch of chunk, then the all-reduces of its device sets (every
/// chunk's gradients together) and each chunk's step (a parameter several chunks read is
/// updated by the first one's: [`super::stage_pieces`]).
fn interleave_lists(
    cx: &Context,
    v: usize,
    group_tags: &[(Vec<usize>, Vec<String>, u32)],
    mut chunk_lists: ChunkLists,
    programs: &mut [Option<DeviceProgram>],
) -> Result<()> {
    let n = cx.stage_devices.len();
    let p = n / v;
    let nmb = cx.micro_batches as usize;
    let kind = cx.schedule;
    for r in 0..p {
        let stages: Vec<usize> = (0..v).map(|c| kind.chunk_stage(c, r, p)).collect();
        for (j, &dev) in cx.stage_devices[r].iter().enumerate() {
            // Each chunk's segments by `(pass, mb)`.
            let mut parts: BTreeMap<(usize, Pass, u32), Vec<Instr>> = BTreeMap::new();
            for &s in &stages {
                let (list, segments) = chunk_lists.remove(&(s, j)).ok_or_else(|| {
                    Error::msg(format!(
                        "codegen: stage {s} has no replica {j} on device {dev}"
                    ))
                })?;
                for (i, &(pass, mb, start)) in segments.iter().enumerate() {
                    let end = segments.get(i + 1).map_or(list.len(), |x| x.2);
                    parts.insert((s, pass, mb), list[start..end].to_vec());
                }
            }
            let mut list = Vec::new();
            let mut cur = r;
            let mut enter = |list: &mut Vec<Instr>, s: usize| {
                if s != cur {
                    list.push(Instr::Stage { stage: s });
                    cur = s;
                }
            };
            for (pass, c, mb) in chunk_order(kind, r, p, nmb) {
                let s = stages[c];
                if let Some(seg) = parts.remove(&(s, pass, mb as u32)) {
                    if !seg.is_empty() {
                        enter(&mut list, s);
                        list.extend(seg);
                    }
                }
            }
            for (group, tensors, tag) in group_tags {
                if group.contains(&dev) {
                    list.push(Instr::AllReduce {
                        group: group.clone(),
                        tensors: tensors.clone(),
                        tag: *tag,
                    });
                }
            }
            for &s in &stages {
                if cx.stages[s].step.is_some() {
                    enter(&mut list, s);
                    list.push(Instr::Step);
                }
            }
            programs[dev] = Some(DeviceProgram {
                device: dev,
                stage: r,
                replica: j,
                instructions: list,
                chunks: stages[1..].to_vec(),
            });
        }
    }
    Ok(())
}

fn dedup(v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    v.into_iter().filter(|x| seen.insert(x.clone())).collect()
}
