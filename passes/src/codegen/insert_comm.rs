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
//!   the cotangents it receives (the gradient of a broadcast is a sum);
//! - otherwise the replica counts must agree and replica `j` talks to replica `j`.
//!
//! Cotangents take the routes of their activations in reverse. Message tags are allocated in a
//! deterministic order, so the same plan always gives byte-identical schedules.

use super::{concrete_dims, layout, Layout};
use crate::sim::schedule::fb_order_grouped;
use crate::sim::ScheduleKind;
use pipec_compiler::ir::{Module, Value};
use pipec_compiler::program::{DataInput, DeviceProgram, Instr, PieceKind, Slice, StageProgram};
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
}

/// Deterministic message tags: allocated on first request by either side.
#[derive(Default)]
struct Tags {
    map: HashMap<(bool, String, usize, usize, usize, u32), u32>,
}

impl Tags {
    fn get(&mut self, grad: bool, v: &str, c: usize, i: usize, j: usize, mb: u32) -> u32 {
        let n = self.map.len() as u32;
        *self
            .map
            .entry((grad, v.to_string(), c, i, j, mb))
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
/// carries relative to the micro-batch (`None`: the whole value).
struct Hop {
    i: usize,
    j: usize,
    samples: Option<(u64, u64)>,
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
        Layout::Rows => {
            let mut out = Vec::new();
            for &(i, (plo, phi)) in &prod {
                for &(j, (clo, chi)) in &cons {
                    let (lo, hi) = (plo.max(clo), phi.min(chi));
                    if lo < hi {
                        out.push(Hop {
                            i,
                            j,
                            samples: Some((lo, hi)),
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
                samples: None,
            })
            .collect(),
        Layout::Other => {
            let same = prod.len() == cons.len() && prod.iter().zip(&cons).all(|(a, c)| a.1 == c.1);
            if !same {
                return Err(Error::named(
                    v,
                    format!(
                        "codegen: the value carries the batch on an axis other than 0 and crosses between stages that split micro-batches differently ({rp} and {rc} replicas)"
                    ),
                ));
            }
            prod.iter()
                .zip(&cons)
                .map(|(a, c)| Hop {
                    i: a.0,
                    j: c.0,
                    samples: None,
                })
                .collect()
        }
    })
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
        (Layout::Rows, Some((lo, hi))) => concrete_dims(ty, batch_sym, hi - lo),
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
    let slice = match (lay, samples) {
        (Layout::Rows, Some((lo, hi))) if (lo - held.0, hi - held.0) != (0, own) => Some(Slice {
            lo: lo - held.0,
            hi: hi - held.0,
            of: own,
        }),
        _ => None,
    };
    (slice, piece_shape(lay, samples, own, ty, batch_sym))
}

/// One message of a value arriving in pieces: the piece's buffer name, sender, tag and shape.
struct Incoming {
    tensor: String,
    peer: usize,
    tag: u32,
    shape: Vec<i64>,
}

/// Receive `output` of micro-batch `mb` from its `pieces`: one `Recv` straight into `output`
/// when there is one piece, else one `Recv` per piece and a join (`Concat` along the batch, or
/// `Sum` when the pieces are partial sums).
fn recv_joined(
    list: &mut Vec<Instr>,
    mb: u32,
    output: &str,
    dtype: &str,
    pieces: Vec<Incoming>,
    sum: bool,
) {
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
            }
        });
    }
}

/// Longest path (in stages) from each stage to a sink, ≥ 1.
fn depth_to_sink(preds: &[BTreeSet<usize>]) -> Vec<usize> {
    let n = preds.len();
    let mut succ = vec![Vec::new(); n];
    for (s, ps) in preds.iter().enumerate() {
        for &p in ps {
            succ[p].push(s);
        }
    }
    let mut depth = vec![0usize; n];
    fn go(s: usize, succ: &[Vec<usize>], depth: &mut [usize]) -> usize {
        if depth[s] > 0 {
            return depth[s];
        }
        let d = 1 + succ[s]
            .iter()
            .map(|&t| go(t, succ, depth))
            .max()
            .unwrap_or(0);
        depth[s] = d;
        d
    }
    for s in 0..n {
        go(s, &succ, &mut depth);
    }
    depth
}

/// Build every device's instruction list.
pub fn device_programs(cx: &Context) -> Result<Vec<DeviceProgram>> {
    let g = &cx.m.graph;
    let ndev = cx.stage_devices.iter().map(Vec::len).sum::<usize>();
    let mut programs: Vec<Option<DeviceProgram>> = (0..ndev).map(|_| None).collect();
    let depth = depth_to_sink(cx.preds);
    let nmb = cx.micro_batches as usize;
    let b = cx.micro_batch;
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
    let group_tags: Vec<(Vec<usize>, Vec<String>, u32)> = groups
        .into_iter()
        .enumerate()
        .map(|(k, (d, t))| (d, t, 1_000_000 + k as u32))
        .collect();
    for (s, devs) in cx.stage_devices.iter().enumerate() {
        let st = &cx.stages[s];
        let r = devs.len();
        let mode = cx.replication[s];
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
        for (j, &dev) in devs.iter().enumerate() {
            let mut list: Vec<Instr> = Vec::new();
            let mut live: HashMap<u32, Vec<String>> = HashMap::new();
            // The stage's order over all micro-batches; a round-robin replica keeps the events
            // of its own micro-batches (so its order is consistent with its neighbours').
            let k = cx.schedule.warmup(depth[s], nmb);
            for (fwd, m) in fb_order_grouped(k, cx.schedule.group(), nmb) {
                let Some((olo, ohi)) = owned(mode, r, j, m, b) else {
                    continue;
                };
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
                    // Activations in.
                    for &v in &cx.stage_inputs[s] {
                        let p = stage_of_value(v);
                        if p == usize::MAX {
                            return Err(Error::named(g.name(v), "codegen: no producer stage"));
                        }
                        let vn = g.name(v);
                        let ty = g.ty(v);
                        let lay = layout(ty, cx.batch_sym);
                        let rp = cx.stage_devices[p].len();
                        let pm = (rp, cx.replication[p]);
                        let hops: Vec<Hop> = routes(lay, b, m, pm, (r, mode), vn)?
                            .into_iter()
                            .filter(|h| h.j == j)
                            .collect();
                        let mut pieces = Vec::with_capacity(hops.len());
                        for h in &hops {
                            pieces.push(Incoming {
                                tensor: format!("{vn}#r{}", h.i),
                                peer: cx.stage_devices[p][h.i],
                                tag: tags.get(false, vn, s, h.i, h.j, mb),
                                shape: piece_shape(lay, h.samples, own, ty, cx.batch_sym),
                            });
                        }
                        recv_joined(&mut list, mb, vn, &ty.dtype.to_string(), pieces, false);
                        keep.push(vn.to_string());
                    }
                    list.push(Instr::Compute {
                        pass: PieceKind::Fwd,
                        mb,
                    });
                    keep.extend(st.fwd.outputs.iter().cloned());
                    // Activations out.
                    for (v, cs) in &cx.stage_outputs[s] {
                        let vn = g.name(*v);
                        let ty = g.ty(*v);
                        let lay = layout(ty, cx.batch_sym);
                        for &c in cs {
                            let rc = cx.stage_devices[c].len();
                            let cm = (rc, cx.replication[c]);
                            for h in routes(lay, b, m, (r, mode), cm, vn)?
                                .into_iter()
                                .filter(|h| h.i == j)
                            {
                                let (slice, shape) =
                                    send_piece(lay, h.samples, (olo, ohi), ty, cx.batch_sym);
                                list.push(Instr::Send {
                                    mb,
                                    tensor: vn.to_string(),
                                    peer: cx.stage_devices[c][h.j],
                                    slice,
                                    tag: tags.get(false, vn, c, h.i, h.j, mb),
                                    dtype: ty.dtype.to_string(),
                                    shape,
                                });
                            }
                        }
                    }
                    if st.bwd.is_none() {
                        let names = live.remove(&mb).unwrap_or_default();
                        list.push(Instr::Free {
                            mb,
                            tensors: dedup(names),
                        });
                    }
                } else {
                    let Some(bwd) = &st.bwd else { continue };
                    let keep = live.entry(mb).or_default();
                    // Cotangents in.
                    for (v, _) in &cx.stage_outputs[s] {
                        let Some(cs) = cx.cot_from.get(&(s, *v)) else {
                            continue;
                        };
                        let vn = g.name(*v);
                        let ty = g.ty(*v);
                        let lay = layout(ty, cx.batch_sym);
                        for &c in cs {
                            let rc = cx.stage_devices[c].len();
                            let cm = (rc, cx.replication[c]);
                            let hops: Vec<Hop> = routes(lay, b, m, (r, mode), cm, vn)?
                                .into_iter()
                                .filter(|h| h.i == j)
                                .collect();
                            let cot = super::cot_name(vn, c);
                            let mut pieces = Vec::with_capacity(hops.len());
                            for h in &hops {
                                pieces.push(Incoming {
                                    tensor: format!("{cot}#r{}", h.j),
                                    peer: cx.stage_devices[c][h.j],
                                    tag: tags.get(true, vn, c, h.i, h.j, mb),
                                    shape: piece_shape(lay, h.samples, own, ty, cx.batch_sym),
                                });
                            }
                            // A batch-independent value's cotangent pieces are partial sums.
                            let sum = lay == Layout::Whole;
                            recv_joined(&mut list, mb, &cot, &ty.dtype.to_string(), pieces, sum);
                            keep.push(cot);
                        }
                    }
                    list.push(Instr::Compute {
                        pass: PieceKind::Bwd,
                        mb,
                    });
                    keep.extend(
                        bwd.outputs
                            .iter()
                            .filter(|o| !param_grad_names.contains(o))
                            .cloned(),
                    );
                    // Cotangents out, to the producers of what this stage received.
                    for (vn, gn) in &cx.input_grads[s] {
                        let Some(&v) = cx.stage_inputs[s].iter().find(|v| g.name(**v) == vn) else {
                            continue;
                        };
                        let p = stage_of_value(v);
                        let ty = g.ty(v);
                        let lay = layout(ty, cx.batch_sym);
                        let rp = cx.stage_devices[p].len();
                        let pm = (rp, cx.replication[p]);
                        for h in routes(lay, b, m, pm, (r, mode), vn)?
                            .into_iter()
                            .filter(|h| h.j == j)
                        {
                            let (slice, shape) =
                                send_piece(lay, h.samples, (olo, ohi), ty, cx.batch_sym);
                            list.push(Instr::Send {
                                mb,
                                tensor: gn.clone(),
                                peer: cx.stage_devices[p][h.i],
                                slice,
                                tag: tags.get(true, vn, s, h.i, h.j, mb),
                                dtype: ty.dtype.to_string(),
                                shape,
                            });
                        }
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
                }
            }
            for (group, tensors, tag) in &group_tags {
                if group.contains(&dev) {
                    list.push(Instr::AllReduce {
                        group: group.clone(),
                        tensors: tensors.clone(),
                        tag: *tag,
                    });
                }
            }
            if st.step.is_some() {
                list.push(Instr::Step);
            }
            programs[dev] = Some(DeviceProgram {
                device: dev,
                stage: s,
                replica: j,
                instructions: list,
            });
        }
    }
    programs
        .into_iter()
        .enumerate()
        .map(|(d, p)| p.ok_or_else(|| Error::msg(format!("codegen: device {d} has no stage"))))
        .collect()
}

fn dedup(v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    v.into_iter().filter(|x| seen.insert(x.clone())).collect()
}
