//! One device's worker: prepares its stage's pieces and interprets its instruction list (see
//! [`pipec_compiler::program`] for the semantics and [`super`] for the runtime's conventions).

use super::collective::{Collectives, ValueCollectives};
use super::data::{self, Data};
use super::trace::Event;
use super::transport::{CommError, Endpoint, Tag};
use super::value_ops::ValueOps;
use super::{DeviceTiming, DistError, LoadedProgram, Result};
use crate::exec::{Executor, Prepared};
use crate::tensor::Tensor;
use crate::value::Value;
use pipec_compiler::ir::{DType, Module};
use pipec_compiler::program::{Instr, PieceKind, Program, StageProgram};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// What a worker needs (shared, read-only).
pub struct DeviceCtx<'a> {
    pub lp: &'a LoadedProgram,
    pub device: usize,
    pub data: &'a Data,
    pub steps: usize,
    pub timeout: Duration,
    pub executor: &'a dyn Executor,
    pub collectives: &'a dyn Collectives,
    /// Collectives on the executor's own values (NCCL), for the groups they cover.
    pub value_collectives: Option<&'a dyn ValueCollectives>,
    /// Common time origin of the trace.
    pub t0: Instant,
    pub trace: bool,
    /// Incremented after each finished step (progress display), if given.
    pub steps_done: Option<&'a std::sync::atomic::AtomicUsize>,
}

/// What a worker returns.
#[derive(Debug)]
pub struct DeviceOutcome {
    pub device: usize,
    /// This device's share of each step's loss.
    pub losses: Vec<f64>,
    /// The stage's parameters after the last step.
    pub params: BTreeMap<String, Tensor>,
    pub timing: DeviceTiming,
    pub events: Vec<Event>,
}

/// A prepared piece and its graph input names.
struct PreparedPiece {
    prepared: Box<dyn Prepared>,
    inputs: Vec<String>,
}

fn prepare(
    ctx: &DeviceCtx<'_>,
    m: &Module,
    file: &str,
) -> std::result::Result<PreparedPiece, String> {
    let prepared = ctx
        .executor
        .prepare(m)
        .map_err(|e| format!("{file}: {e}"))?;
    let inputs = m
        .graph
        .inputs
        .iter()
        .map(|v| m.graph.name(*v).to_string())
        .collect();
    Ok(PreparedPiece { prepared, inputs })
}

/// One stage the device runs (one, or interleaved 1F1B's chunks): its program and pieces.
struct StageRun<'a> {
    stage: &'a StageProgram,
    fwd: PreparedPiece,
    /// The backward pieces the device's instructions run: whole, input-gradient part,
    /// weight-gradient part ([`PieceKind::Bwd`], [`PieceKind::BwdB`], [`PieceKind::BwdW`]).
    bwd: [Option<PreparedPiece>; 3],
    step: Option<PreparedPiece>,
    /// Dtype of the stage's parameters (for the step counter).
    param_dtype: DType,
    /// Optimizer steps applied so far (the step counter's base).
    steps_taken: usize,
}

struct Worker<'a> {
    ctx: &'a DeviceCtx<'a>,
    program: &'a Program,
    /// The device's stages ([`pipec_compiler::program::DeviceProgram::stages`] order).
    stages: Vec<StageRun<'a>>,
    /// The one whose context the instructions run in now ([`Instr::Stage`] switches).
    cur: usize,
    /// Parameters, gradients and optimizer state, as the executor holds them (on the GPU with
    /// `--device cuda`); shared by the device's stages.
    globals: HashMap<String, Value>,
    /// Micro-batch buffers, likewise, per `(stage, name, mb)`.
    bufs: HashMap<(usize, String, u32), Value>,
    /// Sum, accumulation, concatenation and slices on the executor's values.
    ops: ValueOps<'a>,
    /// Per `(stage, name, mb)`: index of the last instruction reading that buffer.
    last_use: HashMap<(usize, String, u32), usize>,
    /// Messages this device sent itself (between its interleaved chunks), by tag: handed
    /// over here, not through the transport.
    to_self: HashMap<u32, Value>,
    loss: f64,
}

/// [`run_device`], with a panic inside it turned into `DistError::Device { at: "worker" }` (what
/// both the in-process threads and the MPI ranks report).
pub fn run_device_catching(ctx: &DeviceCtx<'_>, ep: &mut dyn Endpoint) -> Result<DeviceOutcome> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_device(ctx, ep))).unwrap_or_else(
        |p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(DistError::Device {
                device: ctx.device,
                at: "worker".into(),
                msg: format!("panicked: {msg}"),
            })
        },
    )
}

/// Run one device: prepare its pieces, then its instruction list `ctx.steps` times.
pub fn run_device(ctx: &DeviceCtx<'_>, ep: &mut dyn Endpoint) -> Result<DeviceOutcome> {
    let start = Instant::now();
    let cpu_start = super::pinning::thread_cpu_s();
    let lp = ctx.lp;
    let d = ctx.device;
    let program = &lp.program;
    let dp = &program.devices[d];
    let fail = |at: String, msg: String| DistError::Device { device: d, at, msg };
    let upload = |what: &str, t: Tensor| {
        ctx.executor
            .upload(t)
            .map_err(|e| fail(format!("placing {what}"), e.to_string()))
    };
    let stage_at = dp.stage_at();
    let mut runs_of = Vec::new();
    let mut globals: HashMap<String, Value> = HashMap::new();
    for sid in dp.stages() {
        let stage = program.stages.get(sid).ok_or_else(|| {
            fail(
                "loading the program".into(),
                format!("device {d} runs unknown stage {sid}"),
            )
        })?;
        let mods = &lp.stages[sid];
        let fwd = prepare(ctx, &mods.fwd, &stage.fwd.file)
            .map_err(|m| fail(format!("preparing stage {} forward", stage.id), m))?;
        // Only the backward pieces this device runs are prepared.
        let runs = |pass: PieceKind| {
            dp.instructions.iter().zip(&stage_at).any(|(i, &s)| {
                s == sid && matches!(i, Instr::Compute { pass: p, .. } if *p == pass)
            })
        };
        let mut bwd: [Option<PreparedPiece>; 3] = [None, None, None];
        for (slot, pass, m) in [
            (0, PieceKind::Bwd, &mods.bwd),
            (1, PieceKind::BwdB, &mods.bwd_b),
            (2, PieceKind::BwdW, &mods.bwd_w),
        ] {
            if let (Some(m), Some(p), true) = (m, stage.piece(pass), runs(pass)) {
                bwd[slot] = Some(prepare(ctx, m, &p.file).map_err(|m| {
                    fail(
                        format!("preparing stage {} piece {}", stage.id, pass.name()),
                        m,
                    )
                })?);
            }
        }
        let step = match (&mods.step, &stage.step) {
            (Some(m), Some(p)) => Some(
                prepare(ctx, m, &p.file)
                    .map_err(|m| fail(format!("preparing stage {} step", stage.id), m))?,
            ),
            _ => None,
        };
        for p in &stage.params {
            if let Some(t) = lp.weights.get(p) {
                globals.insert(p.clone(), upload(p, t.clone())?);
            }
        }
        for (s, p) in &stage.state_init {
            let like = lp.weights.get(p).ok_or_else(|| {
                fail(
                    "creating optimizer state".into(),
                    format!("no parameter '{p}' for state '{s}'"),
                )
            })?;
            let z = Tensor::zeros(like.dtype(), like.shape())
                .map_err(|e| fail("creating optimizer state".into(), e.to_string()))?;
            globals.insert(s.clone(), upload(s, z)?);
        }
        let param_dtype = stage
            .params
            .first()
            .and_then(|p| lp.weights.get(p))
            .map(|t| t.dtype())
            .unwrap_or(DType::F32);
        runs_of.push(StageRun {
            stage,
            fwd,
            bwd,
            step,
            param_dtype,
            steps_taken: 0,
        });
    }
    let mut w = Worker {
        ctx,
        program,
        stages: runs_of,
        cur: 0,
        last_use: pipec_compiler::program::last_uses(program, dp),
        globals,
        bufs: HashMap::new(),
        ops: ValueOps::new(ctx.executor),
        to_self: HashMap::new(),
        loss: 0.0,
    };
    let prepare_s = start.elapsed().as_secs_f64();
    let mut timing = DeviceTiming {
        device: d,
        prepare_s,
        ..Default::default()
    };
    let mut losses = Vec::with_capacity(ctx.steps);
    let mut events = Vec::new();
    let mut first_step_end: Option<Instant> = None;
    for s in 0..ctx.steps {
        w.loss = 0.0;
        for (k, ins) in dp.instructions.iter().enumerate() {
            if ep.is_aborted() {
                return Err(DistError::Aborted(d));
            }
            let t = Instant::now();
            let cpu0 = if ctx.trace {
                super::pinning::thread_cpu_s()
            } else {
                None
            };
            w.exec(k, ins, ep).map_err(|e| match e {
                CommError::Aborted => DistError::Aborted(d),
                e => fail(
                    format!("instruction {k} ({}) in step {}", ins.describe(), s + 1),
                    e.to_string(),
                ),
            })?;
            let dur = t.elapsed();
            let secs = dur.as_secs_f64();
            match ins {
                Instr::Compute { .. } | Instr::Step => timing.compute_s += secs,
                Instr::Send { .. } | Instr::Recv { .. } | Instr::AllReduce { .. } => {
                    timing.comm_s += secs
                }
                _ => timing.other_s += secs,
            }
            if ctx.trace {
                events.push(Event {
                    device: d,
                    step: s + 1,
                    index: k,
                    name: ins.describe(),
                    start_us: t.duration_since(ctx.t0).as_secs_f64() * 1e6,
                    dur_us: secs * 1e6,
                    cpu_us: cpu0
                        .zip(super::pinning::thread_cpu_s())
                        .map(|(a, b)| (b - a) * 1e6),
                });
            }
        }
        w.bufs.clear();
        w.cur = 0;
        losses.push(w.loss);
        if let Some(n) = ctx.steps_done {
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        match first_step_end {
            None => first_step_end = Some(Instant::now()),
            Some(t1) => timing.steady_step_s = t1.elapsed().as_secs_f64() / s as f64,
        }
    }
    timing.total_s = start.elapsed().as_secs_f64();
    timing.cpu_s = match (cpu_start, super::pinning::thread_cpu_s()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    let mut params = BTreeMap::new();
    let held: Vec<&String> = w.stages.iter().flat_map(|r| &r.stage.params).collect();
    for p in held {
        if let Some(v) = w.globals.remove(p) {
            let t = v.into_host().map_err(|e| {
                fail(
                    format!("copying parameter '{p}' to the host"),
                    e.to_string(),
                )
            })?;
            params.insert(p.clone(), t);
        }
    }
    Ok(DeviceOutcome {
        device: d,
        losses,
        params,
        timing,
        events,
    })
}

fn other(msg: impl Into<String>) -> CommError {
    CommError::Other(msg.into())
}

fn check_sig(
    t: &Value,
    dtype: &str,
    shape: &[i64],
    what: &str,
) -> std::result::Result<(), CommError> {
    let want = data::parse_dtype(dtype)
        .ok_or_else(|| other(format!("unknown dtype '{dtype}' in the schedule")))?;
    let got: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    if t.dtype() != want || got != shape {
        return Err(other(format!(
            "{what} {}{got:?} but the schedule says {want}{shape:?}",
            t.dtype()
        )));
    }
    Ok(())
}

impl Worker<'_> {
    /// Execute one instruction. Every error names what was missing.
    fn exec(
        &mut self,
        k: usize,
        ins: &Instr,
        ep: &mut dyn Endpoint,
    ) -> std::result::Result<(), CommError> {
        let sid = self.stages[self.cur].stage.id;
        match ins {
            Instr::Stage { stage } => {
                self.cur = self
                    .stages
                    .iter()
                    .position(|r| r.stage.id == *stage)
                    .ok_or_else(|| other(format!("the device does not run stage {stage}")))?;
            }
            Instr::Load { mb, input, samples } => {
                let di = self
                    .program
                    .data_inputs
                    .iter()
                    .find(|d| &d.name == input)
                    .ok_or_else(|| other(format!("'{input}' is not a data input")))?;
                let t = self
                    .ctx
                    .data
                    .get(input)
                    .ok_or_else(|| other(format!("no data for '{input}'")))?;
                let t = match di.batch_axis {
                    Some(ax) => data::slice_axis(t, ax, samples[0] as usize, samples[1] as usize)
                        .map_err(other)?,
                    None => t.clone(),
                };
                let v = self.upload(t)?;
                self.bufs.insert((sid, input.clone(), *mb), v);
            }
            Instr::Compute { pass, mb } => self.compute(k, *pass, *mb)?,
            Instr::Send {
                mb,
                tensor,
                peer,
                slice,
                tag,
                dtype,
                shape,
            } => {
                let key = (sid, tensor.clone(), *mb);
                let last = self.last_use.get(&key) == Some(&k);
                let b = self.bufs.remove(&key).ok_or_else(|| missing(tensor, *mb))?;
                let t = match slice {
                    Some(sl) => {
                        let (b, t) = self
                            .ops
                            .slice_rows(b, sl.axis as usize, sl.lo, sl.hi, sl.of)
                            .map_err(other)?;
                        if !last {
                            self.bufs.insert(key, b);
                        }
                        t
                    }
                    None if last => b,
                    None => {
                        // Sent and still needed here: a copy where the value is (on the GPU
                        // for CUDA; an inter-process transport then copies it to the host).
                        let t = b.try_clone().map_err(|e| other(e.to_string()))?;
                        self.bufs.insert(key, b);
                        t
                    }
                };
                check_sig(&t, dtype, shape, "it would send")?;
                if *peer == self.ctx.device {
                    self.to_self.insert(*tag, t);
                } else {
                    ep.send_value(*peer, Tag::p2p(*tag), t)?;
                }
            }
            Instr::Recv {
                mb,
                tensor,
                peer,
                tag,
                dtype,
                shape,
            } => {
                let t = match self.to_self.remove(tag) {
                    Some(t) if *peer == self.ctx.device => t,
                    _ if *peer == self.ctx.device => {
                        return Err(other(format!(
                            "tag {tag} from this device itself was not sent before"
                        )))
                    }
                    _ => ep.recv_value(*peer, Tag::p2p(*tag), self.ctx.timeout)?,
                };
                check_sig(&t, dtype, shape, &format!("device {peer} sent"))?;
                let t = match t {
                    Value::Host(t) => self.upload(t)?,
                    v => v,
                };
                self.bufs.insert((sid, tensor.clone(), *mb), t);
            }
            Instr::Concat {
                mb,
                inputs,
                output,
                axis,
            } => {
                let parts = inputs
                    .iter()
                    .map(|x| {
                        self.bufs
                            .remove(&(sid, x.clone(), *mb))
                            .ok_or_else(|| missing(x, *mb))
                    })
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let t = self.ops.concat(parts, *axis as usize).map_err(other)?;
                self.bufs.insert((sid, output.clone(), *mb), t);
            }
            Instr::Sum { mb, inputs, output } => {
                let mut acc: Option<Value> = None;
                for x in inputs {
                    let t = self
                        .bufs
                        .remove(&(sid, x.clone(), *mb))
                        .ok_or_else(|| missing(x, *mb))?;
                    acc = Some(match acc {
                        Some(a) => self
                            .ops
                            .add(a, t)
                            .map_err(|e| other(format!("'{x}': {e}")))?,
                        None => t,
                    });
                }
                let t = acc.ok_or_else(|| other("nothing to sum"))?;
                self.bufs.insert((sid, output.clone(), *mb), t);
            }
            Instr::Zeros {
                mb,
                output,
                dtype,
                shape,
            } => {
                let dt = data::parse_dtype(dtype)
                    .ok_or_else(|| other(format!("unknown dtype '{dtype}' in the schedule")))?;
                let dims: Vec<usize> = shape.iter().map(|&x| x.max(0) as usize).collect();
                let t = Tensor::zeros(dt, &dims).map_err(|e| other(e.to_string()))?;
                let t = self.upload(t)?;
                self.bufs.insert((sid, output.clone(), *mb), t);
            }
            Instr::Accumulate { mb, tensors } => {
                for x in tensors {
                    let t = self
                        .bufs
                        .remove(&(sid, x.clone(), *mb))
                        .ok_or_else(|| missing(x, *mb))?;
                    let t = match self.globals.remove(x) {
                        Some(acc) => self
                            .ops
                            .add(acc, t)
                            .map_err(|e| other(format!("'{x}': {e}")))?,
                        None => t,
                    };
                    self.globals.insert(x.clone(), t);
                }
            }
            Instr::Free { mb, tensors } => {
                for x in tensors {
                    self.bufs.remove(&(sid, x.clone(), *mb));
                }
            }
            Instr::Stash { mb, tensors } => {
                for x in tensors {
                    let t = self
                        .globals
                        .get(x)
                        .ok_or_else(|| other(format!("no global buffer '{x}' to stash")))?
                        .try_clone()
                        .map_err(|e| other(format!("stashing '{x}': {e}")))?;
                    self.bufs.insert((sid, x.clone(), *mb), t);
                }
            }
            Instr::AllReduce {
                group,
                tensors,
                tag,
            } => {
                // Every member decides alike: same executor, transport and collectives.
                if group.len() > 1 && self.ctx.executor.holds_values() {
                    if let Some(vc) = self.ctx.value_collectives.filter(|vc| vc.covers(group)) {
                        return self.all_reduce_values(ep, group, *tag, tensors, Some(vc));
                    }
                    if ep.moves_values() {
                        return self.all_reduce_values(ep, group, *tag, tensors, None);
                    }
                }
                // The collectives reduce host tensors (an executor's values are copied out
                // and back).
                let mut ts = Vec::with_capacity(tensors.len());
                for x in tensors {
                    let t = self
                        .take_global(x)?
                        .into_host()
                        .map_err(|e| other(format!("'{x}' to the host: {e}")))?;
                    ts.push(t);
                }
                let r =
                    self.ctx
                        .collectives
                        .all_reduce_sum(ep, group, *tag, &mut ts, self.ctx.timeout);
                for (x, t) in tensors.iter().zip(ts) {
                    let v = self.upload(t)?;
                    self.globals.insert(x.clone(), v);
                }
                r?;
            }
            Instr::Step => self.step()?,
        }
        Ok(())
    }

    /// The all-reduce (sum) of executor values that never leave the device. The group's
    /// devices in this process (all of them without `vc`: one process's devices sharing a GPU)
    /// send their values to the first of them, which adds them in group order with
    /// [`ValueOps`], sums across processes with `vc` (NCCL) if given, and sends each local
    /// member a copy, so all members end bit-identical. Messages use the instruction's tag id
    /// with parts `1..` (values in) and `1 + n..` (sums out).
    fn all_reduce_values(
        &mut self,
        ep: &mut dyn Endpoint,
        group: &[usize],
        tag: u32,
        tensors: &[String],
        vc: Option<&dyn ValueCollectives>,
    ) -> std::result::Result<(), CommError> {
        let n = tensors.len() as u32;
        let part = |p: u32| Tag { id: tag, part: p };
        let local: Vec<usize> = match vc {
            Some(vc) => group.iter().copied().filter(|&d| vc.is_local(d)).collect(),
            None => group.to_vec(),
        };
        let me = ep.rank();
        let root = *local.first().unwrap_or(&me);
        let timeout = self.ctx.timeout;
        if me != root {
            for (i, x) in tensors.iter().enumerate() {
                let v = self.take_global(x)?;
                ep.send_value(root, part(1 + i as u32), v)?;
            }
            for (i, x) in tensors.iter().enumerate() {
                let v = ep.recv_value(root, part(1 + n + i as u32), timeout)?;
                self.globals.insert(x.clone(), v);
            }
            return Ok(());
        }
        let mut sums = Vec::with_capacity(tensors.len());
        for (i, x) in tensors.iter().enumerate() {
            let mut acc = self.take_global(x)?;
            for &m in local.iter().filter(|&&m| m != root) {
                let v = ep.recv_value(m, part(1 + i as u32), timeout)?;
                acc = self
                    .ops
                    .add(acc, v)
                    .map_err(|e| other(format!("'{x}' from device {m}: {e}")))?;
            }
            sums.push(acc);
        }
        if let Some(vc) = vc {
            vc.all_reduce_sum(group, tag, &mut sums)?;
        }
        for (i, (x, acc)) in tensors.iter().zip(sums).enumerate() {
            for &m in local.iter().filter(|&&m| m != root) {
                let c = acc.try_clone().map_err(|e| other(e.to_string()))?;
                ep.send_value(m, part(1 + n + i as u32), c)?;
            }
            self.globals.insert(x.clone(), acc);
        }
        Ok(())
    }

    /// `t` as the executor holds it.
    fn upload(&self, t: Tensor) -> std::result::Result<Value, CommError> {
        self.ctx
            .executor
            .upload(t)
            .map_err(|e| other(e.to_string()))
    }

    /// Global buffer `x`, removed; a missing `grad/P` of a held parameter is zeros.
    fn take_global(&mut self, x: &str) -> std::result::Result<Value, CommError> {
        if let Some(t) = self.globals.remove(x) {
            return Ok(t);
        }
        if let Some(p) = x.strip_prefix("grad/") {
            if let Some(pt) = self.globals.get(p) {
                let z = Tensor::zeros(pt.dtype(), &pt.shape()).map_err(|e| other(e.to_string()))?;
                return self.upload(z);
            }
        }
        Err(other(format!("no global buffer '{x}' on this device")))
    }

    fn compute(
        &mut self,
        k: usize,
        pass: PieceKind,
        mb: u32,
    ) -> std::result::Result<(), CommError> {
        let slot = match pass {
            PieceKind::Fwd => None,
            PieceKind::Bwd => Some(0),
            PieceKind::BwdB => Some(1),
            PieceKind::BwdW => Some(2),
        };
        let run = &mut self.stages[self.cur];
        let (stage, sid) = (run.stage, run.stage.id);
        let piece = match slot {
            None => &mut run.fwd,
            Some(i) => run.bwd[i]
                .as_mut()
                .ok_or_else(|| other(format!("stage {sid} has no {} piece", pass.name())))?,
        };
        // Move the inputs out of the buffers (no copies); put back what is used later. (An
        // error ends the device's run, so nothing is put back then.)
        let mut feeds: Vec<(String, Value)> = Vec::with_capacity(piece.inputs.len());
        let mut back: Vec<(bool, bool)> = Vec::with_capacity(piece.inputs.len()); // (global, keep)
        for x in &piece.inputs {
            let key = (sid, x.clone(), mb);
            if let Some(t) = self.bufs.remove(&key) {
                let keep = self.last_use.get(&key) != Some(&k);
                feeds.push((x.clone(), t));
                back.push((false, keep));
            } else if let Some(t) = self.globals.remove(x) {
                feeds.push((x.clone(), t));
                back.push((true, true));
            } else {
                return Err(other(format!(
                    "input '{x}' is neither buffer ('{x}', mb {mb}) nor a global buffer"
                )));
            }
        }
        let (given_back, outs) = piece
            .prepared
            .run_values(feeds)
            .map_err(|e| other(e.to_string()))?;
        for ((x, t), (global, keep)) in given_back.into_iter().zip(back) {
            if global {
                self.globals.insert(x, t);
            } else if keep {
                self.bufs.insert((sid, x, mb), t);
            }
        }
        for (y, t) in outs {
            if pass == PieceKind::Fwd {
                if let Some((l, f)) = &stage.loss {
                    if *l == y {
                        let host = t.to_host().map_err(|e| other(format!("the loss: {e}")))?;
                        self.loss += f * data::sum_f64(&host);
                    }
                }
            }
            self.bufs.insert((sid, y, mb), t);
        }
        Ok(())
    }

    /// The stage's optimizer step; its step counter is this device's count of steps so far,
    /// 1-based (the step number, or the micro-batch update's under per-micro-batch steps).
    fn step(&mut self) -> std::result::Result<(), CommError> {
        let run = &mut self.stages[self.cur];
        run.steps_taken += 1;
        let (s, stage, param_dtype) = (run.steps_taken - 1, run.stage, run.param_dtype);
        let mut piece = run
            .step
            .take()
            .ok_or_else(|| other(format!("stage {} has no step piece", stage.id)))?;
        let feeds = piece
            .inputs
            .iter()
            .map(|x| {
                let t = if stage.step_counter.as_deref() == Some(x.as_str()) {
                    self.upload(data::scalar(param_dtype, (s + 1) as f64).map_err(other)?)?
                } else {
                    // A parameter's missing gradient is zeros (take_global).
                    self.take_global(x)
                        .map_err(|_| other(format!("step input '{x}' is not a global buffer")))?
                };
                Ok((x.clone(), t))
            })
            .collect::<std::result::Result<Vec<_>, CommError>>();
        let res = feeds.and_then(|f| {
            piece
                .prepared
                .run_values(f)
                .map_err(|e| other(e.to_string()))
        });
        self.stages[self.cur].step = Some(piece);
        let (given_back, outs) = res?;
        for (x, t) in given_back {
            if stage.step_counter.as_deref() != Some(x.as_str()) {
                self.globals.insert(x, t);
            }
        }
        let mut outs: HashMap<String, Value> = outs.into_iter().collect();
        for (out, target) in &stage.updates {
            let t = outs
                .remove(out)
                .ok_or_else(|| other(format!("the step piece has no output '{out}'")))?;
            self.globals.insert(target.clone(), t);
        }
        // The gradients of what it updated go; another chunk of the device that reads a
        // parameter this step does not update leaves that one's to its holder's step.
        for p in stage.stepped_params() {
            self.globals.remove(&format!("grad/{p}"));
        }
        Ok(())
    }
}

fn missing(x: &str, mb: u32) -> CommError {
    other(format!("no buffer ('{x}', mb {mb})"))
}
