//! Replay of a compiled program (`schedule.json`, [`Program`]) on the cost model: what
//! `pipec simulate` runs.
//!
//! Unlike [`super::simulate`], which replays a *planned* schedule on stage costs, this replays the
//! exact per-device instruction lists that `pipec compile` emitted, costing every instruction from
//! the emitted pieces themselves.
//!
//! # Time model
//! - Each device has one **compute stream** that runs its instructions in program order.
//! - `Compute`: the stage piece (`stages/sN.fwd.onnx` / `.bwd.onnx`) is imported, shape-inferred and
//!   costed with the analytic model ([`crate::cost::analytic::from_module`]); its time is the sum
//!   of the *forward* roofline time of every op at the slice's sample count (a backward piece's ops
//!   already are the backward computation, so their own forward work is what runs). The slice's
//!   samples are the rows of the first batch-carrying micro-batch buffer the piece reads
//!   (from `Load` sample ranges, `Recv` shapes and `Concat` sums), else `micro_batch / replicas`.
//!   Every symbolic dim of the piece is set to that sample count.
//! - `Step`: the step piece costed the same way (no batch).
//! - `Send`: never blocks the stream. The message occupies the sender's send channel (FIFO in
//!   program order) for [`comm::p2p_time`] between the two devices; it arrives at the end.
//! - `Recv`: the stream waits until the message has arrived.
//! - `AllReduce`: starts when every group member's stream reaches it, lasts
//!   [`comm::allreduce_time`] of the summed gradient bytes (`grad/P` is shaped like `P`) and blocks
//!   all members' streams meanwhile.
//! - `Concat`, `Sum`, `Accumulate`: memory-bound (bytes read + written over the device's memory
//!   bandwidth). `Load`, `Free`: free.
//!
//! Busy time is compute + step time; the bubble fraction is `1 − Σ busy / (devices × T)` with `T`
//! the iteration time (the last stream's end), as in [`super::SimResult`].
//!
//! # Memory model (an estimate)
//! Static: parameters (their shapes from the forward piece's inputs), one gradient buffer per
//! parameter, and one buffer per optimizer-state entry ([`StageProgram::state_init`]). Dynamic:
//! every live micro-batch buffer, tracked exactly as the program model defines them: `Load`,
//! `Recv` and piece outputs create buffers (piece outputs at the slice's sample count), `Concat` /
//! `Sum` replace their inputs by their output, `Accumulate` and `Free` drop them. Workspace inside
//! a piece and the send buffers (sends are taken as zero-copy) are not counted. The peak is the
//! largest static + live total after any instruction.

use crate::cost::analytic::{from_module, AnalyticOptions};
use crate::cost::cluster::DeviceKind;
use crate::cost::{comm, AllReduceAlgo, Cluster};
use pipec_compiler::ir::{DType, Dim, TensorType};
use pipec_compiler::program::{Instr, Piece, PieceKind, Program};
use pipec_compiler::{Error, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// A graph input or output of a piece: dtype size and dims, each `coeff · samples^pow` (every
/// symbol is taken to be the batch).
#[derive(Clone, Debug)]
struct Port {
    elem_bytes: f64,
    dims: Option<Vec<(u64, u32)>>,
}

impl Port {
    fn from_type(t: &TensorType) -> Port {
        Port {
            elem_bytes: t.dtype.bits() as f64 / 8.0,
            dims: t.shape.as_ref().map(|s| {
                s.iter()
                    .map(|d| match d {
                        Dim::Known(v) => ((*v).max(0) as u64, 0),
                        Dim::Sym(s) => (s.coeff.max(0) as u64, s.syms.len() as u32),
                    })
                    .collect()
            }),
        }
    }

    /// Whether axis 0 carries the batch (is symbolic).
    fn batched(&self) -> bool {
        matches!(self.dims.as_deref(), Some([(_, pow), ..]) if *pow > 0)
    }

    /// Bytes with every symbol = `samples`.
    fn bytes(&self, samples: u64) -> f64 {
        match &self.dims {
            None => 0.0,
            Some(d) => {
                d.iter()
                    .map(|&(c, pow)| c as f64 * (samples as f64).powi(pow as i32))
                    .product::<f64>()
                    * self.elem_bytes
            }
        }
    }
}

/// A loaded stage piece.
struct PieceModel {
    module: pipec_compiler::ir::Module,
    inputs: HashMap<String, Port>,
    outputs: Vec<(String, Port)>,
    syms: BTreeSet<String>,
    file: String,
    /// Seconds by (device kind name, samples).
    times: HashMap<(String, u64), f64>,
}

impl PieceModel {
    fn load(outdir: &Path, piece: &Piece) -> Result<PieceModel> {
        let path = outdir.join(&piece.file);
        let mut module = pipec_compiler::onnx::import::load(&path)?;
        pipec_compiler::shape::infer_shapes(&mut module)?;
        let g = &module.graph;
        let mut inputs = HashMap::new();
        let mut syms = BTreeSet::new();
        for &v in &g.inputs {
            let t = g.ty(v);
            for d in t.shape.iter().flatten() {
                if let Dim::Sym(s) = d {
                    syms.extend(s.syms.iter().cloned());
                }
            }
            inputs.insert(g.name(v).to_string(), Port::from_type(t));
        }
        let outputs = g
            .outputs
            .iter()
            .map(|&v| (g.name(v).to_string(), Port::from_type(g.ty(v))))
            .collect();
        Ok(PieceModel {
            module,
            inputs,
            outputs,
            syms,
            file: path.display().to_string(),
            times: HashMap::new(),
        })
    }

    /// Seconds of one run on `kind` with every symbolic dim = `samples`.
    fn time(&mut self, kind: &DeviceKind, samples: u64) -> Result<f64> {
        let key = (kind.name.clone(), samples);
        if let Some(&t) = self.times.get(&key) {
            return Ok(t);
        }
        let opts = AnalyticOptions {
            dims: self
                .syms
                .iter()
                .map(|s| (s.clone(), samples as i64))
                .collect::<BTreeMap<_, _>>(),
        };
        let g = from_module(&self.module, &opts, &self.file)?;
        // Scale 1: the env already fixed the sample count.
        let t = (0..g.len())
            .map(|n| g.times(n, g.reference_batch, kind).0)
            .sum();
        self.times.insert(key, t);
        Ok(t)
    }
}

/// One device's results.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceReplay {
    pub device: usize,
    pub stage: usize,
    /// Seconds of forward, backward and optimizer-step pieces.
    pub busy_s: f64,
    /// Seconds the stream spent in all-reduce.
    pub allreduce_s: f64,
    /// Parameters + gradients + optimizer state.
    pub static_bytes: f64,
    pub peak_memory_bytes: f64,
}

/// One timed event (for the trace). `lane` 0 is the compute stream, 1 the send channel.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayEvent {
    pub device: usize,
    pub lane: u8,
    pub name: String,
    pub cat: &'static str,
    pub start: f64,
    pub end: f64,
}

/// The replay's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayResult {
    pub iteration_time_s: f64,
    pub bubble_fraction: f64,
    pub devices: Vec<DeviceReplay>,
    pub events: Vec<ReplayEvent>,
}

fn dtype_bytes(s: &str) -> f64 {
    DType::ALL
        .iter()
        .find(|d| d.name() == s || d.mlir_name() == s)
        .map_or(4.0, |d| d.bits() as f64 / 8.0)
}

fn shape_bytes(dtype: &str, shape: &[i64]) -> f64 {
    shape.iter().map(|&d| d.max(0) as f64).product::<f64>() * dtype_bytes(dtype)
}

/// A live micro-batch buffer: bytes and rows (batch samples) if it carries the batch.
#[derive(Clone, Copy, Debug)]
struct Buf {
    bytes: f64,
    rows: Option<u64>,
}

/// Replay `p` (read from `outdir`, whose pieces it loads) on `cluster` (device `d` of the program
/// is device `d` of the cluster).
pub fn replay(
    p: &Program,
    outdir: &Path,
    cluster: &Cluster,
    algo: AllReduceAlgo,
) -> Result<ReplayResult> {
    let n = p.devices.len();
    if cluster.len() < n {
        return Err(Error::Usage(format!(
            "cluster '{}' has {} devices but the program needs {n}",
            cluster.name,
            cluster.len()
        )));
    }
    // Load every piece once: (stage, 0 fwd / 1 bwd / 2 step).
    let mut pieces: HashMap<(usize, u8), PieceModel> = HashMap::new();
    for st in &p.stages {
        pieces.insert((st.id, 0), PieceModel::load(outdir, &st.fwd)?);
        if let Some(b) = &st.bwd {
            pieces.insert((st.id, 1), PieceModel::load(outdir, b)?);
        }
        if let Some(s) = &st.step {
            pieces.insert((st.id, 2), PieceModel::load(outdir, s)?);
        }
    }
    // Parameter bytes per stage, from the forward piece's (else the step or backward piece's)
    // inputs.
    let mut pbytes: HashMap<(usize, String), f64> = HashMap::new();
    for st in &p.stages {
        for q in &st.params {
            let b = [0u8, 2, 1]
                .iter()
                .filter_map(|k| pieces.get(&(st.id, *k)))
                .find_map(|pm| pm.inputs.get(q).map(|port| port.bytes(1)))
                .unwrap_or(0.0);
            pbytes.insert((st.id, q.clone()), b);
        }
    }
    let param_bytes = |stage: usize, name: &str| -> f64 {
        pbytes
            .get(&(stage, name.to_string()))
            .copied()
            .unwrap_or(0.0)
    };
    let mut clock = vec![0.0f64; n];
    let mut send_free = vec![0.0f64; n];
    let mut pc = vec![0usize; n];
    let mut arrival: HashMap<u32, f64> = HashMap::new();
    let mut bufs: Vec<HashMap<(String, u32), Buf>> = vec![HashMap::new(); n];
    let mut live = vec![0.0f64; n];
    let mut devs: Vec<DeviceReplay> = Vec::with_capacity(n);
    let mut events = Vec::new();
    for d in &p.devices {
        let st = p
            .stages
            .get(d.stage)
            .ok_or_else(|| Error::msg(format!("schedule: device {} has no stage", d.device)))?;
        let params: f64 = st.params.iter().map(|q| param_bytes(st.id, q)).sum();
        let state: f64 = st
            .state_init
            .iter()
            .map(|(_, q)| param_bytes(st.id, q))
            .sum();
        let stat = 2.0 * params + state;
        devs.push(DeviceReplay {
            device: d.device,
            stage: d.stage,
            busy_s: 0.0,
            allreduce_s: 0.0,
            static_bytes: stat,
            peak_memory_bytes: stat,
        });
    }

    loop {
        let mut progress = false;
        for d in 0..n {
            let dp = &p.devices[d];
            let stage = &p.stages[dp.stage];
            let kind = cluster.kind_of(d).clone();
            let bw = kind.memory_bandwidth;
            while let Some(ins) = dp.instructions.get(pc[d]) {
                match ins {
                    Instr::Load { mb, input, samples } => {
                        let rows = samples[1].saturating_sub(samples[0]);
                        let bytes =
                            p.data_inputs
                                .iter()
                                .find(|x| &x.name == input)
                                .map_or(0.0, |x| {
                                    let full = shape_bytes(&x.dtype, &x.shape);
                                    match x.batch_axis.and_then(|a| x.shape.get(a)) {
                                        Some(&b) if b > 0 => full * rows as f64 / b as f64,
                                        _ => full,
                                    }
                                });
                        let rows = p
                            .data_inputs
                            .iter()
                            .find(|x| &x.name == input)
                            .and_then(|x| x.batch_axis)
                            .map(|_| rows);
                        put(&mut bufs[d], &mut live[d], input, *mb, Buf { bytes, rows });
                    }
                    Instr::Compute { pass, mb } => {
                        let k = match pass {
                            PieceKind::Fwd => 0u8,
                            PieceKind::Bwd => 1,
                        };
                        let pm = pieces.get_mut(&(stage.id, k)).ok_or_else(|| {
                            Error::msg(format!(
                                "schedule: device {d} runs {} but stage {} has no such piece",
                                ins.describe(),
                                stage.id
                            ))
                        })?;
                        let piece = if k == 0 {
                            &stage.fwd
                        } else {
                            stage.bwd.as_ref().unwrap_or(&stage.fwd)
                        };
                        let default = p.micro_batch / (stage.devices.len().max(1) as u64);
                        let samples = piece
                            .inputs
                            .iter()
                            .filter(|i| pm.inputs.get(*i).is_some_and(|port| port.batched()))
                            .find_map(|i| bufs[d].get(&(i.clone(), *mb)).and_then(|b| b.rows))
                            .unwrap_or(default)
                            .max(1);
                        let t = pm.time(&kind, samples)?;
                        let start = clock[d];
                        clock[d] += t;
                        devs[d].busy_s += t;
                        let outs: Vec<(String, Buf)> = pm
                            .outputs
                            .iter()
                            .map(|(name, port)| {
                                let rows = port.batched().then_some(samples);
                                (
                                    name.clone(),
                                    Buf {
                                        bytes: port.bytes(samples),
                                        rows,
                                    },
                                )
                            })
                            .collect();
                        for (name, b) in outs {
                            put(&mut bufs[d], &mut live[d], &name, *mb, b);
                        }
                        events.push(ReplayEvent {
                            device: d,
                            lane: 0,
                            name: format!("{}{mb}", if k == 0 { "F" } else { "B" }),
                            cat: if k == 0 { "forward" } else { "backward" },
                            start,
                            end: clock[d],
                        });
                    }
                    Instr::Send {
                        mb,
                        tensor,
                        peer,
                        tag,
                        dtype,
                        shape,
                        ..
                    } => {
                        let bytes = shape_bytes(dtype, shape);
                        let start = clock[d].max(send_free[d]);
                        let end = start + comm::p2p_time(cluster, d, *peer, bytes);
                        send_free[d] = end;
                        arrival.insert(*tag, end);
                        if end > start {
                            events.push(ReplayEvent {
                                device: d,
                                lane: 1,
                                name: format!("{tensor}[{mb}]->{peer}"),
                                cat: "send",
                                start,
                                end,
                            });
                        }
                    }
                    Instr::Recv {
                        mb,
                        tensor,
                        tag,
                        dtype,
                        shape,
                        ..
                    } => {
                        let Some(&at) = arrival.get(tag) else { break };
                        let start = clock[d];
                        clock[d] = clock[d].max(at);
                        if clock[d] > start {
                            events.push(ReplayEvent {
                                device: d,
                                lane: 0,
                                name: format!("wait {tensor}[{mb}]"),
                                cat: "recv-wait",
                                start,
                                end: clock[d],
                            });
                        }
                        let batched = [0u8, 1].iter().any(|k| {
                            pieces
                                .get(&(stage.id, *k))
                                .and_then(|pm| pm.inputs.get(tensor))
                                .is_some_and(|port| port.batched())
                        });
                        let rows = if batched {
                            shape.first().map(|&r| r.max(0) as u64)
                        } else {
                            None
                        };
                        let b = Buf {
                            bytes: shape_bytes(dtype, shape),
                            rows,
                        };
                        put(&mut bufs[d], &mut live[d], tensor, *mb, b);
                    }
                    Instr::Concat { mb, inputs, output } | Instr::Sum { mb, inputs, output } => {
                        let is_concat = matches!(ins, Instr::Concat { .. });
                        let mut bytes = 0.0;
                        let mut rows: Option<u64> = None;
                        for i in inputs {
                            if let Some(b) = take(&mut bufs[d], &mut live[d], i, *mb) {
                                if is_concat {
                                    bytes += b.bytes;
                                    rows = Some(rows.unwrap_or(0) + b.rows.unwrap_or(0));
                                } else {
                                    bytes = b.bytes;
                                    rows = b.rows;
                                }
                            }
                        }
                        let read: f64 = if is_concat {
                            bytes
                        } else {
                            bytes * inputs.len() as f64
                        };
                        let t = (read + bytes) / bw;
                        let start = clock[d];
                        clock[d] += t;
                        put(&mut bufs[d], &mut live[d], output, *mb, Buf { bytes, rows });
                        if t > 0.0 {
                            events.push(ReplayEvent {
                                device: d,
                                lane: 0,
                                name: format!(
                                    "{} {output}[{mb}]",
                                    if is_concat { "concat" } else { "sum" }
                                ),
                                cat: "memory",
                                start,
                                end: clock[d],
                            });
                        }
                    }
                    Instr::Zeros {
                        mb,
                        output,
                        dtype,
                        shape,
                    } => {
                        let b = Buf {
                            bytes: shape_bytes(dtype, shape),
                            rows: None,
                        };
                        clock[d] += b.bytes / bw;
                        put(&mut bufs[d], &mut live[d], output, *mb, b);
                    }
                    Instr::Accumulate { mb, tensors } => {
                        let mut bytes = 0.0;
                        for t in tensors {
                            if let Some(b) = take(&mut bufs[d], &mut live[d], t, *mb) {
                                bytes += b.bytes;
                            }
                        }
                        clock[d] += 3.0 * bytes / bw;
                    }
                    Instr::Free { mb, tensors } => {
                        for t in tensors {
                            take(&mut bufs[d], &mut live[d], t, *mb);
                        }
                    }
                    Instr::AllReduce {
                        group,
                        tensors,
                        tag,
                    } => {
                        // Every member must be at this all-reduce.
                        let ready = group.iter().all(|&g| {
                            g < n
                                && matches!(p.devices[g].instructions.get(pc[g]),
                                    Some(Instr::AllReduce { tag: t2, .. }) if t2 == tag)
                        });
                        if !ready {
                            break;
                        }
                        let bytes: f64 = tensors
                            .iter()
                            .map(|t| param_bytes(stage.id, t.strip_prefix("grad/").unwrap_or(t)))
                            .sum();
                        let start = group.iter().map(|&g| clock[g]).fold(0.0, f64::max);
                        let end = start + comm::allreduce_time(cluster, group, bytes, algo);
                        for &g in group {
                            events.push(ReplayEvent {
                                device: g,
                                lane: 0,
                                name: "allreduce".into(),
                                cat: "allreduce",
                                start: clock[g],
                                end,
                            });
                            devs[g].allreduce_s += end - start;
                            clock[g] = end;
                            if g != d {
                                pc[g] += 1;
                            }
                        }
                    }
                    Instr::Step => {
                        let t = match pieces.get_mut(&(stage.id, 2)) {
                            Some(pm) => pm.time(&kind, 1)?,
                            None => 0.0,
                        };
                        let start = clock[d];
                        clock[d] += t;
                        devs[d].busy_s += t;
                        events.push(ReplayEvent {
                            device: d,
                            lane: 0,
                            name: "step".into(),
                            cat: "optimizer",
                            start,
                            end: clock[d],
                        });
                    }
                }
                devs[d].peak_memory_bytes = devs[d]
                    .peak_memory_bytes
                    .max(devs[d].static_bytes + live[d]);
                pc[d] += 1;
                progress = true;
            }
        }
        if (0..n).all(|d| pc[d] >= p.devices[d].instructions.len()) {
            break;
        }
        if !progress {
            let stuck: Vec<String> = (0..n)
                .filter_map(|d| {
                    p.devices[d]
                        .instructions
                        .get(pc[d])
                        .map(|i| format!("device {d} at #{} ({})", pc[d], i.describe()))
                })
                .collect();
            return Err(Error::msg(format!(
                "schedule: the replay deadlocks: {}",
                stuck.join("; ")
            )));
        }
    }
    let t = clock
        .iter()
        .chain(send_free.iter())
        .copied()
        .fold(0.0, f64::max);
    let busy: f64 = devs.iter().map(|d| d.busy_s).sum();
    let bubble = if t > 0.0 && n > 0 {
        (1.0 - busy / (n as f64 * t)).clamp(0.0, 1.0)
    } else {
        0.0
    };
    Ok(ReplayResult {
        iteration_time_s: t,
        bubble_fraction: bubble,
        devices: devs,
        events,
    })
}

fn put(m: &mut HashMap<(String, u32), Buf>, live: &mut f64, name: &str, mb: u32, b: Buf) {
    *live += b.bytes;
    if let Some(old) = m.insert((name.to_string(), mb), b) {
        *live -= old.bytes;
    }
}

fn take(m: &mut HashMap<(String, u32), Buf>, live: &mut f64, name: &str, mb: u32) -> Option<Buf> {
    let b = m.remove(&(name.to_string(), mb))?;
    *live -= b.bytes;
    Some(b)
}

/// Chrome / Perfetto trace of a replay: process 0 holds one thread (track) per device for its
/// compute stream, process 1 one thread per device for its send channel. Times in microseconds.
pub fn chrome_trace(r: &ReplayResult) -> Value {
    let mut ev = vec![
        json!({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "compute"}}),
        json!({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "send"}}),
    ];
    for d in &r.devices {
        for pid in [0, 1] {
            ev.push(
                json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": d.device,
                "args": {"name": format!("device {} (stage {})", d.device, d.stage)}}),
            );
        }
    }
    for e in &r.events {
        ev.push(json!({
            "name": e.name, "cat": e.cat, "ph": "X", "pid": e.lane, "tid": e.device,
            "ts": e.start * 1e6, "dur": (e.end - e.start) * 1e6,
        }));
    }
    json!({ "traceEvents": ev, "displayTimeUnit": "ms" })
}
