//! Replay of a compiled program (`schedule.json`, [`Program`]) on the cost model: what
//! `pipec simulate` runs.
//!
//! Unlike [`super::simulate`], which replays a *planned* schedule on stage costs, this replays the
//! exact per-device instruction lists that `pipec compile` emitted, costing every instruction from
//! the emitted pieces themselves.
//!
//! # Time model
//! The program becomes tasks of the shared simulator's engine (the one [`super::simulate`] runs
//! planned schedules on), so a plan and the replay of its program are timed by the same rules:
//! - Each device has one **compute stream** that runs its instructions in program order.
//! - `Compute`: the stage piece (`stages/sN.fwd.onnx` / `.bwd.onnx`) is imported, shape-inferred and
//!   costed with the analytic model ([`crate::cost::analytic::from_module`]); its time is the sum
//!   of the *forward* roofline time of every op at the slice's sample count (a backward piece's ops
//!   already are the backward computation, so their own forward work is what runs). The slice's
//!   samples are those of the first batch-carrying micro-batch buffer the piece reads
//!   (from `Load` sample ranges, `Recv` shapes — the batch axis over its per-sample factor, so
//!   a `[batch·seq, d]` value counts samples, not rows — and `Concat` sums), else
//!   `micro_batch / replicas`.
//!   Every symbolic dim of the piece is set to that sample count.
//! - `Step`: the step piece costed the same way (no batch).
//! - `Send`: never blocks the stream. The message is ready when the stream reaches the send; it
//!   holds the sender's send channel, the receiver's receive channel and, between nodes, both
//!   nodes' ports for [`comm::p2p_time`] (first come, first served). Sends issued back to back
//!   to one peer are one burst, timed as one transfer paying the latency per value (`bursts`).
//! - `Recv`: the next task on the stream waits until the message has arrived.
//! - `AllReduce`: starts when every group member's stream reaches it, lasts
//!   [`comm::allreduce_time`] of the summed gradient bytes (`grad/P` is shaped like `P`), holds
//!   the members' channels (and nodes' ports) and blocks their streams meanwhile.
//! - `Concat`, `Sum`, `Zeros`, `Accumulate`, `Stash`: memory-bound (bytes read + written over
//!   the device's memory bandwidth). An `Accumulate` into a gradient buffer that is empty since the last
//!   `Step` is a move, as in the runtime: free. `Load`, `Free`: free.
//! - On a host with fewer cores than devices (the `cpu` preset), the compute and memory tasks
//!   running at once share the cores (processor sharing, the cores' measured slowdown).
//!
//! Busy time is compute + step time; the bubble fraction is `1 − Σ busy / (devices × T)` with `T`
//! the iteration time (the last stream's end), as in [`super::SimResult`].
//!
//! # Memory model (an estimate)
//! Static: parameters (their shapes from the forward piece's inputs) and one buffer per
//! optimizer-state entry ([`StageProgram::state_init`]). Gradients: as the runtime holds them, a
//! global buffer per gradient from its first `Accumulate` after a step (the micro-batch's buffer
//! moves into it) to the `Step`. Dynamic: every live micro-batch buffer, tracked exactly as the
//! program model defines them: `Load`, `Recv` and piece outputs create buffers (piece outputs at
//! the slice's sample count), `Concat` / `Sum` replace their inputs by their output, `Accumulate`
//! and `Free` drop them, and, as in the runtime, a buffer's last reader (a compute, or a whole
//! send) moves it out: a compute's inputs are dropped once its outputs exist, a sent value the
//! backward does not read is dropped at the send. Workspace inside a piece and the send buffers
//! (sends are taken as zero-copy) are not counted. The peak is the largest static + gradients +
//! live total after any instruction and at the end of every compute (inputs and outputs live).

use crate::cost::analytic::{from_module, AnalyticOptions};
use crate::cost::cluster::DeviceKind;
use crate::cost::{comm, AllReduceAlgo, Cluster};
use crate::sim::TaskKind;
use pipec_compiler::ir::{DType, Dim, TensorType};
use pipec_compiler::program::{Instr, Piece, PieceKind, Program};
use pipec_compiler::{Error, Result};
use rustc_hash::FxHashMap;
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

    /// The axis that carries the batch (the first symbolic one: 0, or e.g. 1 for an RNN's
    /// `[seq, batch, hidden]`).
    fn batch_axis(&self) -> Option<usize> {
        self.dims.as_deref()?.iter().position(|&(_, pow)| pow > 0)
    }

    /// Whether some axis carries the batch (is symbolic).
    fn batched(&self) -> bool {
        self.batch_axis().is_some()
    }

    /// The samples a buffer of this port and `shape` holds: its batch axis is `coeff · samples`
    /// long (a `[batch·seq, d]` tensor of 4 samples has 4·seq rows).
    fn samples_of(&self, shape: &[i64]) -> Option<u64> {
        let k = self.batch_axis()?;
        let len = shape.get(k)?.max(&0).to_owned() as u64;
        match self.dims.as_deref()?[k] {
            (c, 1) if c > 0 => Some(len / c),
            _ => Some(len),
        }
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
            ..AnalyticOptions::default()
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
    /// Parameters + optimizer state (gradient buffers are counted while they hold a sum: from a
    /// device's first `Accumulate` after a step to the step, as the runtime keeps them).
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
    // Load every piece once: (stage, 0 fwd / 1 bwd / 2 step / 3 bwd_b / 4 bwd_w).
    let mut pieces: HashMap<(usize, u8), PieceModel> = HashMap::new();
    for st in &p.stages {
        pieces.insert((st.id, 0), PieceModel::load(outdir, &st.fwd)?);
        for (k, piece) in [
            (1u8, &st.bwd),
            (2, &st.step),
            (3, &st.bwd_b),
            (4, &st.bwd_w),
        ] {
            if let Some(b) = piece {
                pieces.insert((st.id, k), PieceModel::load(outdir, b)?);
            }
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
    // Walk every device's instructions once, in program order: the buffers (for each piece's
    // sample count and for memory, which depend on the order only) and the tasks of the shared
    // simulator's engine ([`super::Builder`]), which then times them as it times planned
    // schedules: one compute stream per device, send/receive channels and node ports held by
    // each message, collectives, and the host's cores shared by the compute of every device
    // (processor sharing on the `cpu` preset).
    let mut tasks = Tasks {
        tb: super::Builder {
            ndev: cluster.len(),
            program_devices: n,
            ..Default::default()
        },
        shown: Vec::new(),
        messages: HashMap::new(),
        bursts: bursts(p),
        streams: vec![Vec::new(); n],
        pending: Vec::new(),
    };
    let mut sent: BTreeSet<u32> = BTreeSet::new();
    let mut collectives: HashMap<u32, (u32, Vec<usize>, usize)> = HashMap::new();
    let mut live = vec![0.0f64; n];
    // Bytes of the global gradient buffers each device holds (see `Accumulate`, `Step`).
    let mut grads = vec![0.0f64; n];
    let mut devs: Vec<DeviceReplay> = Vec::with_capacity(n);
    for d in &p.devices {
        let mut stat = 0.0;
        for s in d.stages() {
            let st = p.stages.get(s).ok_or_else(|| {
                Error::msg(format!("schedule: device {} has no stage {s}", d.device))
            })?;
            // Folded from +0.0: an empty `sum` of f64 is -0.0, printed as "-0.000 MB".
            let params = st
                .params
                .iter()
                .map(|q| param_bytes(st.id, q))
                .fold(0.0, |a, b| a + b);
            let state = st
                .state_init
                .iter()
                .map(|(_, q)| param_bytes(st.id, q))
                .fold(0.0, |a, b| a + b);
            stat += params + state;
        }
        devs.push(DeviceReplay {
            device: d.device,
            stage: d.stage,
            busy_s: 0.0,
            allreduce_s: 0.0,
            static_bytes: stat,
            peak_memory_bytes: stat,
        });
    }
    for d in 0..n {
        let dp = &p.devices[d];
        let kind = cluster.kind_of(d).clone();
        let bw = kind.memory_bandwidth;
        tasks.pending.clear();
        // Gradient buffers that hold a sum since the last optimizer step (and their bytes).
        let mut accumulated: FxHashMap<&str, f64> = FxHashMap::default();
        let last_use = pipec_compiler::program::last_uses(p, dp);
        // Micro-batch buffers per stage (a device's chunks keep their own).
        let mut stage_bufs: FxHashMap<usize, HashMap<(String, u32), Buf>> = FxHashMap::default();
        // A parameter's bytes, whichever of the device's stages holds it.
        let device_stages = dp.stages();
        let held_bytes = |name: &str| -> f64 {
            device_stages
                .iter()
                .find(|&&s| pbytes.contains_key(&(s, name.to_string())))
                .map_or(0.0, |&s| param_bytes(s, name))
        };
        for ((k_ins, ins), cur) in dp.instructions.iter().enumerate().zip(dp.stage_at()) {
            let stage = &p.stages[cur];
            let bufs_d = stage_bufs.entry(cur).or_default();
            match ins {
                Instr::Load { mb, input, samples } => {
                    let rows = samples[1].saturating_sub(samples[0]);
                    let x = p.data_inputs.iter().find(|x| &x.name == input);
                    let bytes = x.map_or(0.0, |x| {
                        let full = shape_bytes(&x.dtype, &x.shape);
                        match x.batch_axis.and_then(|a| x.shape.get(a)) {
                            Some(&b) if b > 0 => full * rows as f64 / b as f64,
                            _ => full,
                        }
                    });
                    let rows = x.and_then(|x| x.batch_axis).map(|_| rows);
                    put(bufs_d, &mut live[d], input, *mb, Buf { bytes, rows });
                }
                Instr::Compute { pass, mb } => {
                    let k = match pass {
                        PieceKind::Fwd => 0u8,
                        PieceKind::Bwd => 1,
                        PieceKind::BwdB => 3,
                        PieceKind::BwdW => 4,
                    };
                    let pm = pieces.get_mut(&(stage.id, k)).ok_or_else(|| {
                        Error::msg(format!(
                            "schedule: device {d} runs {} but stage {} has no such piece",
                            ins.describe(),
                            stage.id
                        ))
                    })?;
                    let piece = stage.piece(*pass).unwrap_or(&stage.fwd);
                    let default = p.micro_batch / (stage.devices.len().max(1) as u64);
                    let samples = piece
                        .inputs
                        .iter()
                        .filter(|i| pm.inputs.get(*i).is_some_and(|port| port.batched()))
                        .find_map(|i| bufs_d.get(&(i.clone(), *mb)).and_then(|b| b.rows))
                        .unwrap_or(default)
                        .max(1);
                    let t = pm.time(&kind, samples)?;
                    let outs: Vec<(String, Buf)> = pm
                        .outputs
                        .iter()
                        .map(|(name, port)| {
                            let rows = port.batched().then_some(samples);
                            let bytes = port.bytes(samples);
                            (name.clone(), Buf { bytes, rows })
                        })
                        .collect();
                    for (name, b) in outs {
                        put(bufs_d, &mut live[d], &name, *mb, b);
                    }
                    // The piece's inputs and outputs exist together; then the inputs whose last
                    // use this is are gone (the runtime moves them into the compute).
                    devs[d].peak_memory_bytes = devs[d]
                        .peak_memory_bytes
                        .max(devs[d].static_bytes + live[d] + grads[d]);
                    for i in &piece.inputs {
                        let key = (cur, i.clone(), *mb);
                        if last_use.get(&key) == Some(&k_ins) {
                            take(bufs_d, &mut live[d], i, *mb);
                        }
                    }
                    let (stage, mb, device) = (stage.id, *mb as usize, d);
                    let (tk, tag, cat) = match pass {
                        PieceKind::Fwd => (TaskKind::Forward { stage, mb, device }, 'F', "forward"),
                        PieceKind::Bwd | PieceKind::BwdB => {
                            (TaskKind::Backward { stage, mb, device }, 'B', "backward")
                        }
                        PieceKind::BwdW => (
                            TaskKind::WeightGrad { stage, mb, device },
                            'W',
                            "weight-grad",
                        ),
                    };
                    let name = format!("{tag}{mb}");
                    tasks.on_stream(d, StreamTask::New(tk, t, Some((name, cat))));
                }
                Instr::Send {
                    mb,
                    tensor,
                    peer,
                    tag,
                    dtype,
                    shape,
                    slice,
                } => {
                    let bytes = shape_bytes(dtype, shape);
                    if *peer >= n || !sent.insert(*tag) {
                        return Err(Error::msg(format!(
                            "schedule: device {d} sends tag {tag} to device {peer}: no such device, or the tag is sent twice"
                        )));
                    }
                    let id = tasks.message(cluster, *tag, d, *peer, bytes);
                    let burst = tasks.bursts.get(tag).copied();
                    let leads = burst.is_none_or(|b| b.0 == *tag);
                    if leads {
                        let more = match burst {
                            Some((_, _, k)) if k > 1 => format!(" (+{} more)", k - 1),
                            _ => String::new(),
                        };
                        tasks.shown[id as usize] =
                            Some((d, 1, format!("{tensor}[{mb}]->{peer}{more}"), "send"));
                    }
                    // A whole-buffer send that is the buffer's last use moves it out.
                    if slice.is_none() && last_use.get(&(cur, tensor.clone(), *mb)) == Some(&k_ins)
                    {
                        take(bufs_d, &mut live[d], tensor, *mb);
                    }
                    if let (true, Some(&(p, _))) = (leads, tasks.streams[d].last()) {
                        tasks.tb.edge(p, id);
                    }
                }
                Instr::Recv {
                    mb,
                    tensor,
                    peer,
                    tag,
                    dtype,
                    shape,
                    ..
                } => {
                    let bytes = shape_bytes(dtype, shape);
                    if *peer >= n {
                        return Err(Error::msg(format!(
                            "schedule: device {d} receives tag {tag} from device {peer}, which is not in the program"
                        )));
                    }
                    let id = tasks.message(cluster, *tag, *peer, d, bytes);
                    tasks.pending.push((id, format!("wait {tensor}[{mb}]")));
                    let whole = pipec_compiler::program::joined_name(tensor);
                    let rows = [0u8, 1, 3, 4].iter().find_map(|k| {
                        let port = pieces.get(&(stage.id, *k))?.inputs.get(whole)?;
                        port.samples_of(shape)
                    });
                    put(bufs_d, &mut live[d], tensor, *mb, Buf { bytes, rows });
                }
                Instr::Concat {
                    mb, inputs, output, ..
                }
                | Instr::Sum { mb, inputs, output } => {
                    let is_concat = matches!(ins, Instr::Concat { .. });
                    let mut bytes = 0.0;
                    let mut rows: Option<u64> = None;
                    for i in inputs {
                        if let Some(b) = take(bufs_d, &mut live[d], i, *mb) {
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
                    put(bufs_d, &mut live[d], output, *mb, Buf { bytes, rows });
                    let what = if is_concat { "concat" } else { "sum" };
                    let show = (t > 0.0).then(|| (format!("{what} {output}[{mb}]"), "memory"));
                    tasks.on_stream(d, StreamTask::New(TaskKind::Memory { device: d }, t, show));
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
                    let t = b.bytes / bw;
                    put(bufs_d, &mut live[d], output, *mb, b);
                    let show = (t > 0.0).then(|| (format!("zeros {output}[{mb}]"), "memory"));
                    tasks.on_stream(d, StreamTask::New(TaskKind::Memory { device: d }, t, show));
                }
                Instr::Accumulate { mb, tensors } => {
                    // The runtime moves a gradient into an empty global buffer (the first
                    // micro-batch of the iteration) and adds the later ones.
                    let mut bytes = 0.0;
                    for t in tensors {
                        if let Some(b) = take(bufs_d, &mut live[d], t, *mb) {
                            if !accumulated.contains_key(t.as_str()) {
                                // Moved into the empty global buffer, which it now is.
                                accumulated.insert(t.as_str(), b.bytes);
                                grads[d] += b.bytes;
                            } else {
                                bytes += b.bytes;
                            }
                        }
                    }
                    let t = 3.0 * bytes / bw;
                    let show = (t > 0.0).then(|| (format!("accumulate[{mb}]"), "memory"));
                    tasks.on_stream(d, StreamTask::New(TaskKind::Memory { device: d }, t, show));
                }
                Instr::Free { mb, tensors } => {
                    for t in tensors {
                        take(bufs_d, &mut live[d], t, *mb);
                    }
                }
                Instr::Stash { mb, tensors } => {
                    // A copy of the parameters: read and write them (memory-bound).
                    let mut bytes = 0.0;
                    for t in tensors {
                        let b = param_bytes(stage.id, t);
                        bytes += b;
                        put(
                            bufs_d,
                            &mut live[d],
                            t,
                            *mb,
                            Buf {
                                bytes: b,
                                rows: None,
                            },
                        );
                    }
                    let t = 2.0 * bytes / bw;
                    let show = (t > 0.0).then(|| (format!("stash[{mb}]"), "memory"));
                    tasks.on_stream(d, StreamTask::New(TaskKind::Memory { device: d }, t, show));
                }
                Instr::AllReduce {
                    group,
                    tensors,
                    tag,
                } => {
                    if let Some(&g) = group.iter().find(|&&g| g >= n) {
                        return Err(Error::msg(format!(
                            "schedule: device {d}'s all-reduce (tag {tag}) names device {g}, which is not in the program"
                        )));
                    }
                    let bytes: f64 = tensors
                        .iter()
                        .map(|t| held_bytes(t.strip_prefix("grad/").unwrap_or(t)))
                        .sum();
                    let entry = collectives.entry(*tag).or_insert_with(|| {
                        let t = comm::allreduce_time(cluster, group, bytes, algo);
                        let k = TaskKind::AllReduce {
                            stage: stage.id,
                            devices: group.clone(),
                            bytes,
                        };
                        tasks.shown.push(None);
                        (tasks.tb.collective(cluster, k, group, t), group.clone(), 0)
                    });
                    entry.2 += 1;
                    let id = entry.0;
                    let task = StreamTask::Collective(id);
                    tasks.on_stream(d, task);
                }
                Instr::Stage { .. } => {}
                Instr::Step => {
                    if dp.chunks.is_empty() {
                        accumulated.clear();
                        grads[d] = 0.0;
                    } else {
                        // This chunk's gradients go (those of what its step updates); the
                        // device's other chunks keep theirs.
                        for q in stage.stepped_params() {
                            if let Some(b) = accumulated.remove(format!("grad/{q}").as_str()) {
                                grads[d] -= b;
                            }
                        }
                    }
                    let t = match pieces.get_mut(&(stage.id, 2)) {
                        Some(pm) => pm.time(&kind, 1)?,
                        None => 0.0,
                    };
                    let tk = TaskKind::Step {
                        stage: stage.id,
                        device: d,
                    };
                    tasks.on_stream(
                        d,
                        StreamTask::New(tk, t, Some(("step".into(), "optimizer"))),
                    );
                }
            }
            devs[d].peak_memory_bytes = devs[d]
                .peak_memory_bytes
                .max(devs[d].static_bytes + live[d] + grads[d]);
        }
    }
    if let Some((tag, _)) = tasks.messages.iter().find(|(t, _)| !sent.contains(t)) {
        return Err(Error::msg(format!(
            "schedule: the replay deadlocks: tag {tag} is received but never sent"
        )));
    }
    for (tag, (_, group, arrived)) in &collectives {
        if *arrived != group.len() {
            return Err(Error::msg(format!(
                "schedule: the replay deadlocks: all-reduce tag {tag} over {group:?} is reached by {arrived} of its members"
            )));
        }
    }
    let Tasks {
        tb, shown, streams, ..
    } = tasks;
    let (start, end) = tb
        .run(cluster)
        .map_err(|e| Error::msg(format!("schedule: the replay deadlocks: {e}")))?;
    let mut events = Vec::new();
    for (id, k) in tb.kinds.iter().enumerate() {
        let (s, e) = (start[id], end[id]);
        match k {
            TaskKind::Forward { device, .. }
            | TaskKind::Backward { device, .. }
            | TaskKind::WeightGrad { device, .. }
            | TaskKind::Step { device, .. } => devs[*device].busy_s += e - s,
            TaskKind::AllReduce { devices, .. } => {
                for &g in devices {
                    devs[g].allreduce_s += e - s;
                    events.push(ReplayEvent {
                        device: g,
                        lane: 0,
                        name: "allreduce".into(),
                        cat: "allreduce",
                        start: s,
                        end: e,
                    });
                }
            }
            _ => {}
        }
        if let Some((device, lane, name, cat)) = &shown[id] {
            if *lane == 0 || e > s {
                events.push(ReplayEvent {
                    device: *device,
                    lane: *lane,
                    name: name.clone(),
                    cat,
                    start: s,
                    end: e,
                });
            }
        }
    }
    // Waits for messages: the gap before a stream task that received data.
    for (device, ids) in streams.iter().enumerate() {
        for w in ids.windows(2) {
            let (a, b) = (w[0].0 as usize, w[1].0 as usize);
            if let Some(name) = &w[1].1 {
                if start[b] > end[a] {
                    events.push(ReplayEvent {
                        device,
                        lane: 0,
                        name: name.clone(),
                        cat: "recv-wait",
                        start: end[a],
                        end: start[b],
                    });
                }
            }
        }
    }
    events.sort_by(|a, b| {
        a.start
            .total_cmp(&b.start)
            .then(a.device.cmp(&b.device))
            .then(a.lane.cmp(&b.lane))
    });
    let t = end.iter().copied().fold(0.0, f64::max);
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

/// A task on a device's compute stream: a new one (kind, seconds, what the trace shows), or a
/// collective that every member's stream reaches.
enum StreamTask {
    New(TaskKind, f64, Option<(String, &'static str)>),
    Collective(u32),
}

/// The engine's tasks of a replayed program, built by the walk over the devices' instructions.
struct Tasks {
    tb: super::Builder,
    /// Per task: what the trace shows of it (device, lane, name, category); `None` for
    /// collectives (shown per member) and messages until their send names them.
    shown: Vec<Option<(usize, u8, String, &'static str)>>,
    /// The message task of each burst's first tag.
    messages: HashMap<u32, u32>,
    /// Each sent tag's burst (see [`bursts`]): its first tag, summed bytes and value count.
    bursts: HashMap<u32, (u32, f64, usize)>,
    /// Per device: its compute stream's tasks in order, each with the first message it waited
    /// for (named in the trace's waits).
    streams: Vec<Vec<(u32, Option<String>)>>,
    /// Messages received on the device being walked since its last stream task.
    pending: Vec<(u32, String)>,
}

impl Tasks {
    /// Append `task` to device `d`'s compute stream: it runs after the stream's previous task
    /// and the messages received since.
    fn on_stream(&mut self, d: usize, task: StreamTask) -> u32 {
        let id = match task {
            StreamTask::New(k, t, what) => {
                let id = self.tb.task(k, t, Vec::new());
                self.shown.push(what.map(|(name, cat)| (d, 0, name, cat)));
                id
            }
            StreamTask::Collective(id) => id,
        };
        if let Some(&(p, _)) = self.streams[d].last() {
            self.tb.edge(p, id);
        }
        let waited = self.pending.first().map(|(_, name)| name.clone());
        for (m, _) in std::mem::take(&mut self.pending) {
            self.tb.edge(m, id);
        }
        self.streams[d].push((id, waited));
        id
    }

    /// The task of message `tag` from `src` to `dst` (created by its send or its receive,
    /// whichever comes first in the walk): the transfer of its whole burst.
    fn message(&mut self, cluster: &Cluster, tag: u32, src: usize, dst: usize, bytes: f64) -> u32 {
        let (lead, bytes, values) = self.bursts.get(&tag).copied().unwrap_or((tag, bytes, 1));
        if let Some(&id) = self.messages.get(&lead) {
            return id;
        }
        let k = TaskKind::Transfer {
            dir: super::Dir::Act,
            mb: 0,
            src,
            dst,
            bytes,
        };
        // One message per value: the latency is paid `values` times (as the planned
        // schedule's transfers pay it, [`super::Builder::transfer`]).
        let t = comm::message_time(cluster, src, dst, bytes, values);
        let id = self.tb.p2p(cluster, k, src, dst, t);
        self.shown.push(None);
        self.messages.insert(lead, id);
        id
    }
}

/// The program's sends grouped into **bursts**: the sends a device issues back to back to one
/// peer (no stream task between them; a `Free` does not count) go out together when the stream
/// reaches them, one message per value on one channel, so the replay times a burst as one
/// transfer of their summed bytes paying the link latency once per value — as the planned
/// schedule times the values one stage sends another for one micro-batch. Timing them as
/// separate transfers would let other messages slip between them first come, first served,
/// which the plan cannot see and the runtime's back-to-back posting does not do. Each sent tag
/// maps to (its burst's first tag, the burst's bytes, its number of values).
fn bursts(p: &Program) -> HashMap<u32, (u32, f64, usize)> {
    let mut out: HashMap<u32, (u32, f64, usize)> = HashMap::new();
    for dp in &p.devices {
        // The open burst: its peer, first tag and tags so far.
        let mut open: Option<(usize, u32, Vec<u32>, f64)> = None;
        let mut close = |open: &mut Option<(usize, u32, Vec<u32>, f64)>| {
            if let Some((_, lead, tags, bytes)) = open.take() {
                let k = tags.len();
                for t in tags {
                    out.insert(t, (lead, bytes, k));
                }
            }
        };
        for ins in &dp.instructions {
            match ins {
                Instr::Send {
                    peer,
                    tag,
                    dtype,
                    shape,
                    ..
                } => {
                    let b = shape_bytes(dtype, shape);
                    match &mut open {
                        Some((q, _, tags, bytes)) if q == peer => {
                            tags.push(*tag);
                            *bytes += b;
                        }
                        _ => {
                            close(&mut open);
                            open = Some((*peer, *tag, vec![*tag], b));
                        }
                    }
                }
                Instr::Free { .. } => {}
                _ => close(&mut open),
            }
        }
        close(&mut open);
    }
    out
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
