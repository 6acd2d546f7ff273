//! The compiled program: what `pipec compile` writes as `schedule.json` and what the runtime
//! (`pipec run`) and the simulator (`pipec simulate`) read. It is the contract between codegen
//! (`pipec_passes::codegen`) and `pipec_runtime::dist`, so it lives at the bottom of the stack.
//!
//! # Model of execution
//! Every device runs exactly one **replica** of one **stage**. A device holds
//! - *global buffers* keyed by name: the stage's parameters (initial values from
//!   [`Program::weights`]), their accumulated gradients (`grad/P`) and optimizer state;
//! - *micro-batch buffers* keyed by `(name, mb)`: data slices, received activations and
//!   cotangents, the outputs of its forward and backward pieces.
//!
//! It executes its [`DeviceProgram::instructions`] in order. A [`Instr::Compute`] runs one stage
//! piece (an ONNX file: forward or backward of one micro-batch slice): each graph input named `X`
//! is taken from buffer `(X, mb)` if present, else from global buffer `X`; each graph output `Y`
//! is stored as `(Y, mb)`. Sends never block (buffered); receives block until the message with
//! their [`Instr::Recv::tag`] from `peer` arrives. All-reduce is a collective over its group
//! (every member executes the same instruction, same tag, same tensor list).
//!
//! # Micro-batches, replicas and slices
//! The global batch of `batch` samples is cut into `micro_batches` micro-batches of `micro_batch`
//! samples; micro-batch `m` is samples `[m*b, (m+1)*b)`. A stage with `r` replicas gives replica
//! `k` the even slice `[k*b/r, (k+1)*b/r)` of every micro-batch (DAPPLE's uneven replication
//! through even slices). Tensors that carry the batch on one axis (0, or e.g. 1 for an RNN's
//! `[seq, batch, hidden]`) move between stages with different replica counts as ranges of that
//! axis ([`Slice`]) and are reassembled with [`Instr::Concat`] along it; batch-independent
//! tensors move whole, and their cotangents come back as partial sums added with [`Instr::Sum`].
//!
//! # Gradients
//! Each piece's loss is pre-scaled (by `1/(M*r)` for mean losses), so every gradient of the step
//! is the plain **sum** of the per-slice gradients: [`Instr::Accumulate`] adds a micro-batch's
//! parameter gradients into the global `grad/P`, [`Instr::AllReduce`] sums them over the
//! replicas (and over every stage holding a tied parameter), and [`Instr::Step`] runs the stage's
//! optimizer piece on the result (then zeroes `grad/P`).
//!
//! [`verify`] is the static schedule verifier run before anything is emitted.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Format version written to `schedule.json`.
pub const PROGRAM_VERSION: u32 = 1;

/// The whole compiled program (`schedule.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub version: u32,
    /// The model file it was compiled from (for messages only).
    pub model: String,
    pub planner: String,
    pub schedule: String,
    /// Global batch (samples per step).
    pub batch: u64,
    pub micro_batch: u64,
    pub micro_batches: u64,
    /// Loss kind (`mean-square`, `sum`, `cross-entropy:LABEL`).
    pub loss: String,
    /// Optimizer spec as given to `--optimizer`.
    pub optimizer: String,
    /// Data inputs of the model, at the global batch.
    pub data_inputs: Vec<DataInput>,
    /// npz file (relative to OUTDIR) with the initial value of every trainable parameter.
    pub weights: String,
    pub stages: Vec<StageProgram>,
    /// One per device, `device` = index.
    pub devices: Vec<DeviceProgram>,
    /// The unpartitioned single-device training program for `pipec run --check`.
    pub reference: Option<ReferenceProgram>,
    /// PipeDream's asynchronous updates (`--schedule pipedream-async`): every micro-batch's
    /// accumulation is followed by its own all-reduces and [`Instr::Step`], with no flush, and
    /// [`Instr::Stash`] keeps the parameter version a micro-batch's forward read for its
    /// backward. `run --check` then compares with an emulation of that update rule
    /// (`pipec_runtime::dist::check`). Written only when true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_micro_batch_step: bool,
    /// PipeDream's vertical sync (§3.4): with per-micro-batch steps, every device's computes of
    /// a micro-batch read one weight version (the verifier checks it). Written only when true.
    #[serde(default, skip_serializing_if = "is_false")]
    pub vertical_sync: bool,
}

fn is_false(x: &bool) -> bool {
    !*x
}

/// A graph input of the model that the runtime feeds with data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataInput {
    pub name: String,
    /// `f32`, `i64`, ... (as [`crate::ir::DType`]'s `Display`).
    pub dtype: String,
    /// Concrete shape at the global batch.
    pub shape: Vec<i64>,
    /// Axis that carries the batch (sliced per micro-batch and replica), `None` if none.
    pub batch_axis: Option<usize>,
    /// For integer inputs (token ids, labels, indices): random data is drawn from `[0, high)`.
    #[serde(default)]
    pub high: Option<i64>,
}

/// One stage piece: an ONNX file and its graph signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Piece {
    /// Path relative to OUTDIR (`stages/s0.fwd.onnx`).
    pub file: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

/// One stage: its pieces and what its step updates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageProgram {
    pub id: usize,
    /// Devices of its replicas, replica `k` on `devices[k]`.
    pub devices: Vec<usize>,
    pub fwd: Piece,
    /// `None` when nothing in the stage needs a gradient.
    pub bwd: Option<Piece>,
    /// The backward split for the zero-bubble schedules (Qi et al. 2023): `bwd_b` computes the
    /// input gradients the stage sends upstream and the values `bwd_w` reads from it; `bwd_w`
    /// the parameter gradients. Running `bwd_b` then `bwd_w` computes what `bwd` does. Present
    /// when the schedule runs them apart (`--schedule zb-h1`); `bwd` is then kept for reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_b: Option<Piece>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwd_w: Option<Piece>,
    /// Optimizer step; `None` when the stage has no trainable parameter.
    pub step: Option<Piece>,
    /// Trainable parameters the stage holds (a tied parameter is held by several stages).
    pub params: Vec<String>,
    /// After a step: `(step output, global buffer it replaces)`, e.g. `("update/W", "W")`,
    /// `("opt/W/m.out", "opt/W/m")`.
    pub updates: Vec<(String, String)>,
    /// Optimizer state buffers to create as zeros shaped like a parameter: `(state, param)`.
    pub state_init: Vec<(String, String)>,
    /// A 0-D input of the step piece fed with the 1-based step number (Adam's `t`).
    pub step_counter: Option<String>,
    /// The forward output holding this slice's loss, and the factor that turns the sum of
    /// those values over micro-batches and replicas into the mini-batch loss.
    pub loss: Option<(String, f64)>,
}

impl StageProgram {
    /// The global buffers its step replaces (the targets of [`StageProgram::updates`]:
    /// parameters and optimizer state). Under per-micro-batch updates the parameters among
    /// them are the ones with versions; any other reads alike at every step count.
    pub fn updated(&self) -> BTreeSet<&str> {
        self.updates.iter().map(|(_, q)| q.as_str()).collect()
    }

    /// The parameters (of [`StageProgram::params`]) its step updates: all it holds, but a
    /// parameter several chunks of one device read, which the first such chunk's step updates.
    /// A step frees the gradients of these.
    pub fn stepped_params(&self) -> impl Iterator<Item = &str> {
        let updated = self.updated();
        self.params
            .iter()
            .map(String::as_str)
            .filter(move |q| updated.contains(q))
    }

    /// The piece a [`Instr::Compute`] of `pass` runs, if the stage has it.
    pub fn piece(&self, pass: PieceKind) -> Option<&Piece> {
        match pass {
            PieceKind::Fwd => Some(&self.fwd),
            PieceKind::Bwd => self.bwd.as_ref(),
            PieceKind::BwdB => self.bwd_b.as_ref(),
            PieceKind::BwdW => self.bwd_w.as_ref(),
        }
    }
}

/// The reference program of `--check`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReferenceProgram {
    /// Forward + backward of one whole micro-batch (outputs `loss` and `grad/P`, pre-scaled so
    /// the step's gradient is the sum over micro-batches).
    pub train: Piece,
    /// Optimizer step over every parameter (same conventions as [`StageProgram::step`]).
    pub step: Piece,
    pub updates: Vec<(String, String)>,
    pub state_init: Vec<(String, String)>,
    pub step_counter: Option<String>,
    /// `(loss output, factor)` as for stages.
    pub loss: (String, f64),
    /// `(gradient output, parameter)` pairs of `train`.
    pub grads: Vec<(String, String)>,
}

/// What one device executes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceProgram {
    pub device: usize,
    /// The stage its list starts in (its only one, unless `chunks`).
    pub stage: usize,
    /// The replica it runs of `stage` (and of every stage in `chunks`).
    pub replica: usize,
    pub instructions: Vec<Instr>,
    /// Interleaved 1F1B: the further stages (model chunks) this device runs, ascending; an
    /// [`Instr::Stage`] switches between them. The stages share the device's global buffers
    /// (their parameters are distinct) and keep their own micro-batch buffers. Written only
    /// when not empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<usize>,
}

impl DeviceProgram {
    /// Every stage the device runs: `stage`, then `chunks`.
    pub fn stages(&self) -> Vec<usize> {
        std::iter::once(self.stage)
            .chain(self.chunks.iter().copied())
            .collect()
    }

    /// Per instruction, the stage whose context it runs in: `stage` up to the first
    /// [`Instr::Stage`], then the one that names (the marker itself included).
    pub fn stage_at(&self) -> Vec<usize> {
        let mut cur = self.stage;
        self.instructions
            .iter()
            .map(|ins| {
                if let Instr::Stage { stage } = ins {
                    cur = *stage;
                }
                cur
            })
            .collect()
    }
}

/// Rows `[lo*n/of, (hi)*n/of)` of a tensor whose axis `axis` (the one carrying the batch,
/// 0 unless the value is e.g. an RNN's `[seq, batch, ...]`) has `n` rows (`of` divides `n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    pub lo: u64,
    pub hi: u64,
    pub of: u64,
    /// The batch axis; written only when not 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub axis: u32,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// Which piece a [`Instr::Compute`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PieceKind {
    Fwd,
    Bwd,
    /// The input-gradient part of a split backward ([`StageProgram::bwd_b`]).
    BwdB,
    /// The weight-gradient part of a split backward ([`StageProgram::bwd_w`]).
    BwdW,
}

impl PieceKind {
    /// As JSON names it (`fwd`, `bwd`, `bwd_b`, `bwd_w`).
    pub fn name(self) -> &'static str {
        match self {
            PieceKind::Fwd => "fwd",
            PieceKind::Bwd => "bwd",
            PieceKind::BwdB => "bwd_b",
            PieceKind::BwdW => "bwd_w",
        }
    }
}

/// One instruction of a device program (`"op"` tags it in JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Instr {
    /// Copy rows `samples` (of the global batch, along the input's batch axis) of data input
    /// `input` into buffer `(input, mb)`.
    Load {
        mb: u32,
        input: String,
        samples: [u64; 2],
    },
    /// Run the stage's forward or backward piece on micro-batch `mb`.
    Compute { pass: PieceKind, mb: u32 },
    /// Send buffer `(tensor, mb)` (rows `slice` of it, if given) to `peer`. Never blocks.
    Send {
        mb: u32,
        tensor: String,
        peer: usize,
        slice: Option<Slice>,
        /// Program-wide unique message id.
        tag: u32,
        dtype: String,
        /// Shape of what is sent.
        shape: Vec<i64>,
    },
    /// Receive message `tag` from `peer` into buffer `(tensor, mb)`. Blocks.
    Recv {
        mb: u32,
        tensor: String,
        peer: usize,
        tag: u32,
        dtype: String,
        shape: Vec<i64>,
    },
    /// `(output, mb)` = concatenation along `axis` (the batch axis) of `(inputs[i], mb)`, which
    /// are freed.
    Concat {
        mb: u32,
        inputs: Vec<String>,
        output: String,
        /// Written only when not 0.
        #[serde(default, skip_serializing_if = "is_zero")]
        axis: u32,
    },
    /// `(output, mb)` = element-wise sum of `(inputs[i], mb)`, which are freed (cotangents of a
    /// batch-independent value from several consumer replicas).
    Sum {
        mb: u32,
        inputs: Vec<String>,
        output: String,
    },
    /// `(output, mb)` = zeros of `dtype` and `shape`: the cotangent of a batch-independent
    /// value for a producer replica that no consumer replica reads it from (its share of the
    /// gradient through that value is zero; another replica of its stage gets the sum).
    Zeros {
        mb: u32,
        output: String,
        dtype: String,
        shape: Vec<i64>,
    },
    /// Global `grad/P` += buffer `(grad/P, mb)` for every name in `tensors` (created as zeros
    /// on first use); the micro-batch buffers are freed.
    Accumulate { mb: u32, tensors: Vec<String> },
    /// Drop micro-batch buffers.
    Free { mb: u32, tensors: Vec<String> },
    /// Weight stashing (PipeDream §3.3): copy the global buffers `tensors` (parameters of the
    /// stage) into micro-batch buffers `(P, mb)`, which the computes of `mb` then read before
    /// the global `P` (the dataflow rule above), so its forward and backward see one version
    /// whatever steps run between them. The backward, the copy's last reader, frees it.
    Stash { mb: u32, tensors: Vec<String> },
    /// Sum the global buffers `tensors` over the devices of `group` (ascending; this device is
    /// one of them); every member ends with the sum. A device that never accumulated `grad/P`
    /// contributes zeros shaped like its parameter `P` (the name after `grad/`).
    AllReduce {
        group: Vec<usize>,
        tensors: Vec<String>,
        tag: u32,
    },
    /// Run the stage's optimizer piece, apply its updates, zero the accumulated gradients. A
    /// missing `grad/P` input is zeros shaped like `P`.
    Step,
    /// Interleaved 1F1B: the instructions after this one, up to the next `Stage`, run in stage
    /// `stage`'s context (its pieces, its micro-batch buffers, its step, its loss); it must be
    /// one of the device's ([`DeviceProgram::stages`]).
    Stage { stage: usize },
}

impl Instr {
    /// Short text for messages: `recv 'x' mb 3 from device 1 (tag 17)`.
    pub fn describe(&self) -> String {
        match self {
            Instr::Load { mb, input, .. } => format!("load '{input}' mb {mb}"),
            Instr::Compute { pass, mb } => format!("compute {} mb {mb}", pass.name()),
            Instr::Send {
                mb,
                tensor,
                peer,
                tag,
                ..
            } => format!("send '{tensor}' mb {mb} to device {peer} (tag {tag})"),
            Instr::Recv {
                mb,
                tensor,
                peer,
                tag,
                ..
            } => format!("recv '{tensor}' mb {mb} from device {peer} (tag {tag})"),
            Instr::Concat { mb, output, .. } => format!("concat '{output}' mb {mb}"),
            Instr::Sum { mb, output, .. } => format!("sum '{output}' mb {mb}"),
            Instr::Zeros { mb, output, .. } => format!("zeros '{output}' mb {mb}"),
            Instr::Accumulate { mb, tensors } => {
                format!("accumulate {} gradients mb {mb}", tensors.len())
            }
            Instr::Free { mb, tensors } => format!("free {} buffers mb {mb}", tensors.len()),
            Instr::Stash { mb, tensors } => {
                format!("stash {} parameters mb {mb}", tensors.len())
            }
            Instr::AllReduce { group, tag, .. } => {
                format!("all-reduce over devices {group:?} (tag {tag})")
            }
            Instr::Step => "optimizer step".into(),
            Instr::Stage { stage } => format!("stage {stage}"),
        }
    }
}

impl Program {
    /// The stage program of `device`.
    pub fn stage_of(&self, device: usize) -> Option<&StageProgram> {
        let d = self.devices.get(device)?;
        self.stages.get(d.stage)
    }

    /// Parse `schedule.json` text.
    pub fn from_json(text: &str, file: &str) -> Result<Program> {
        let p: Program = serde_json::from_str(text)
            .map_err(|e| Error::msg(format!("{file}: not a pipec schedule: {e}")))?;
        if p.version != PROGRAM_VERSION {
            return Err(Error::msg(format!(
                "{file}: schedule version {} (this pipec reads version {PROGRAM_VERSION})",
                p.version
            )));
        }
        Ok(p)
    }

    /// Pretty JSON (deterministic: every map is ordered).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// The buffer of one received piece of `name` (joined by a [`Instr::Concat`] or [`Instr::Sum`]
/// into `name`): from replica `r` (`name#r1`), and of the sender's micro-batch `theirs` when it
/// differs from the receiver's `mine` (`name#r1m3`).
pub fn piece_name(name: &str, r: usize, theirs: u32, mine: u32) -> String {
    if theirs == mine {
        format!("{name}#r{r}")
    } else {
        format!("{name}#r{r}m{theirs}")
    }
}

/// The buffer a [`piece_name`] is a piece of (`name` itself when it is none).
pub fn joined_name(piece: &str) -> &str {
    piece.rsplit_once("#r").map_or(piece, |(whole, _)| whole)
}

/// The last instruction (index into `d`'s list) reading each micro-batch buffer `(stage, name,
/// mb)` (a device's stages keep their own micro-batch buffers): the computes (every input of the
/// piece they run in their stage) and the sends. Frees do not count; concat and accumulate
/// consume their inputs anyway. A runtime may move a buffer into the compute or send that is
/// its last use, and `pipec simulate` counts its memory until then.
pub fn last_uses(p: &Program, d: &DeviceProgram) -> HashMap<(usize, String, u32), usize> {
    let mut m = HashMap::new();
    for ((k, ins), s) in d.instructions.iter().enumerate().zip(d.stage_at()) {
        match ins {
            Instr::Compute { pass, mb } => {
                let piece = p.stages.get(s).and_then(|st| st.piece(*pass));
                for x in piece.into_iter().flat_map(|p| &p.inputs) {
                    m.insert((s, x.clone(), *mb), k);
                }
            }
            Instr::Send { mb, tensor, .. } => {
                m.insert((s, tensor.clone(), *mb), k);
            }
            _ => {}
        }
    }
    m
}

/// Whether both ends of every device pair order their messages alike: for each ordered pair
/// `(a, b)`, the tags of `a`'s sends to `b` in program order equal the tags of `b`'s receives
/// from `a` in program order. Transports that match messages by tag (MPI, in-process) do not
/// need it; one that matches them by order on a channel per pair (NCCL's point-to-point) does.
/// The error names the pair, the position and both tags.
pub fn pair_order(p: &Program) -> Result<()> {
    let mut sent: BTreeMap<(usize, usize), Vec<u32>> = BTreeMap::new();
    let mut received: BTreeMap<(usize, usize), Vec<u32>> = BTreeMap::new();
    for d in &p.devices {
        for ins in &d.instructions {
            match ins {
                Instr::Send { peer, tag, .. } => {
                    sent.entry((d.device, *peer)).or_default().push(*tag)
                }
                Instr::Recv { peer, tag, .. } => {
                    received.entry((*peer, d.device)).or_default().push(*tag)
                }
                _ => {}
            }
        }
    }
    let empty = Vec::new();
    let pairs: std::collections::BTreeSet<(usize, usize)> =
        sent.keys().chain(received.keys()).copied().collect();
    for (a, b) in pairs {
        let (s, r) = (
            sent.get(&(a, b)).unwrap_or(&empty),
            received.get(&(a, b)).unwrap_or(&empty),
        );
        if let Some(k) = (0..s.len().max(r.len())).find(|&k| s.get(k) != r.get(k)) {
            let tag = |x: Option<&u32>| x.map_or("nothing".to_string(), |t| format!("tag {t}"));
            return Err(Error::msg(format!(
                "schedule: device {a}'s message {k} to device {b} is {} but device {b}'s receive {k} from device {a} is {}",
                tag(s.get(k)),
                tag(r.get(k))
            )));
        }
    }
    Ok(())
}

/// The static schedule verifier (run by codegen before it emits, and by the runtime on load).
///
/// Checks, naming devices and instruction indices on failure:
/// 1. the device list is `0..n`, each device's stage (and interleaved chunks,
///    [`DeviceProgram::chunks`]) exists and lists it as replica `replica`, and every
///    [`Instr::Stage`] names one of them;
/// 2. every recv has exactly one matching send (same tag, sender = the recv's peer, receiver =
///    the send's peer) with equal dtype and shape, and every send is received;
/// 3. on every device, the forward of micro-batch `m` precedes its backward; accumulation of
///    `m` follows its backward; all-reduces and the step follow the last accumulation; nothing
///    but all-reduce and step comes after the step (with per-micro-batch steps instead
///    [`per_micro_batch_order`]: a step after every accumulation, and weight stashing);
/// 4. *dataflow*: on every device, every buffer an instruction reads exists when it runs
///    ([`dataflow`]: the runtime's buffer rules, replayed statically);
/// 5. no device can wait forever: a replay with buffered sends, blocking receives and
///    collective all-reduces runs every list to its end (else: the cyclic wait is reported).
pub fn verify(p: &Program) -> Result<()> {
    let n = p.devices.len();
    for (i, d) in p.devices.iter().enumerate() {
        if d.device != i {
            return Err(Error::msg(format!(
                "schedule: device entry {i} is for device {}",
                d.device
            )));
        }
        let stages = d.stages();
        for &s in &stages {
            let st = p.stages.get(s).ok_or_else(|| {
                Error::msg(format!("schedule: device {i} runs unknown stage {s}"))
            })?;
            if st.devices.get(d.replica) != Some(&i) {
                return Err(Error::msg(format!(
                    "schedule: device {i} claims replica {} of stage {s} but the stage lists devices {:?}",
                    d.replica, st.devices
                )));
            }
        }
        for (k, ins) in d.instructions.iter().enumerate() {
            if let Instr::Stage { stage } = ins {
                if !stages.contains(stage) {
                    return Err(Error::msg(format!(
                        "schedule: device {i} instruction {k} switches to stage {stage}, which the device does not run (its stages: {stages:?})"
                    )));
                }
            }
        }
    }
    // 2. Matching sends and receives.
    // Ordered by tag, so the error reported is the same every time.
    let mut sends: BTreeMap<u32, (usize, usize, &Instr)> = BTreeMap::new();
    let mut recvs: BTreeMap<u32, (usize, usize, &Instr)> = BTreeMap::new();
    for d in &p.devices {
        for (k, ins) in d.instructions.iter().enumerate() {
            let (map, tag, peer) = match ins {
                Instr::Send { tag, peer, .. } => (&mut sends, *tag, *peer),
                Instr::Recv { tag, peer, .. } => (&mut recvs, *tag, *peer),
                _ => continue,
            };
            // A device sends to itself only between its interleaved chunks.
            if peer >= n || (peer == d.device && d.chunks.is_empty()) {
                return Err(Error::msg(format!(
                    "schedule: device {} instruction {k} ({}) names peer {peer}",
                    d.device,
                    ins.describe()
                )));
            }
            if let Some((od, ok, _)) = map.insert(tag, (d.device, k, ins)) {
                return Err(Error::msg(format!(
                    "schedule: tag {tag} is used twice (device {od} instruction {ok} and device {} instruction {k})",
                    d.device
                )));
            }
        }
    }
    for (tag, (rd, rk, r)) in &recvs {
        let Instr::Recv {
            peer, dtype, shape, ..
        } = r
        else {
            continue;
        };
        let Some((sd, sk, s)) = sends.get(tag) else {
            return Err(Error::msg(format!(
                "schedule: device {rd} instruction {rk} ({}) has no matching send",
                r.describe()
            )));
        };
        let Instr::Send {
            peer: speer,
            dtype: sdt,
            shape: sshape,
            ..
        } = s
        else {
            continue;
        };
        if sd != peer || speer != rd {
            return Err(Error::msg(format!(
                "schedule: device {rd} instruction {rk} ({}) expects device {peer}, but tag {tag} is sent by device {sd} to device {speer}",
                r.describe()
            )));
        }
        if sdt != dtype || sshape != shape {
            return Err(Error::msg(format!(
                "schedule: device {rd} instruction {rk} ({}) expects {dtype}{shape:?} but device {sd} instruction {sk} sends {sdt}{sshape:?}",
                r.describe()
            )));
        }
    }
    if let Some((tag, (sd, sk, s))) = sends.iter().find(|(t, _)| !recvs.contains_key(t)) {
        return Err(Error::msg(format!(
            "schedule: device {sd} instruction {sk} ({}) is never received (tag {tag})",
            s.describe()
        )));
    }
    // 3. Per-device order.
    for d in &p.devices {
        let dev = d.device;
        // Per (stage, micro-batch): a device's chunks have micro-batches of their own.
        let mut fwd: BTreeMap<(usize, u32), usize> = BTreeMap::new();
        // The backward (or its weight-gradient part) and the input-gradient part per
        // micro-batch.
        let mut bwd: BTreeMap<(usize, u32), usize> = BTreeMap::new();
        let mut bwd_b: BTreeMap<(usize, u32), usize> = BTreeMap::new();
        let mut last_acc = None;
        let mut step_at = None;
        if p.per_micro_batch_step {
            per_micro_batch_order(p, d)?;
        }
        for ((k, ins), cur) in d.instructions.iter().enumerate().zip(d.stage_at()) {
            if p.per_micro_batch_step {
                // Checked by `per_micro_batch_order`; the forward/backward rules below hold.
            } else if let Some(s) = step_at {
                // The flush: all-reduces, and each of the device's stages' steps.
                if !matches!(
                    ins,
                    Instr::AllReduce { .. } | Instr::Step | Instr::Stage { .. }
                ) {
                    return Err(Error::msg(format!(
                        "schedule: device {dev} instruction {k} ({}) comes after the optimizer step (instruction {s})",
                        ins.describe()
                    )));
                }
            }
            match ins {
                Instr::Compute {
                    pass: PieceKind::Fwd,
                    mb,
                } => {
                    fwd.insert((cur, *mb), k);
                }
                Instr::Compute {
                    pass: pass @ (PieceKind::Bwd | PieceKind::BwdB),
                    mb,
                } => {
                    if !fwd.contains_key(&(cur, *mb)) {
                        return Err(Error::msg(format!(
                            "schedule: device {dev} instruction {k}: backward of micro-batch {mb} before its forward"
                        )));
                    }
                    if *pass == PieceKind::Bwd {
                        bwd.insert((cur, *mb), k);
                    } else {
                        bwd_b.insert((cur, *mb), k);
                    }
                }
                Instr::Compute {
                    pass: PieceKind::BwdW,
                    mb,
                } => {
                    if !bwd_b.contains_key(&(cur, *mb)) {
                        return Err(Error::msg(format!(
                            "schedule: device {dev} instruction {k}: weight gradients of micro-batch {mb} before its input gradients (bwd_b)"
                        )));
                    }
                    bwd.insert((cur, *mb), k);
                }
                Instr::Accumulate { mb, .. } => {
                    if !bwd.contains_key(&(cur, *mb)) {
                        return Err(Error::msg(format!(
                            "schedule: device {dev} instruction {k}: accumulation of micro-batch {mb} before its backward"
                        )));
                    }
                    last_acc = Some(k);
                }
                Instr::AllReduce { group, .. } if !group.contains(&dev) => {
                    return Err(Error::msg(format!(
                        "schedule: device {dev} instruction {k}: all-reduce over {group:?} does not include the device"
                    )));
                }
                Instr::Step => step_at = Some(k),
                _ => {}
            }
        }
        let has_bwd = |s: usize| p.stages.get(s).is_some_and(|s| s.bwd.is_some());
        if let Some((s, mb)) = fwd
            .keys()
            .find(|key| has_bwd(key.0) && !bwd.contains_key(key))
        {
            let of = if d.chunks.is_empty() {
                String::new()
            } else {
                format!(" of stage {s}")
            };
            return Err(Error::msg(format!(
                "schedule: device {dev} runs the forward of micro-batch {mb}{of} but never its backward"
            )));
        }
        if let Some(a) = last_acc.filter(|_| !p.per_micro_batch_step) {
            for (k, ins) in d.instructions.iter().enumerate().take(a) {
                if matches!(ins, Instr::AllReduce { .. } | Instr::Step) {
                    return Err(Error::msg(format!(
                        "schedule: device {dev} instruction {k} ({}) comes before the last accumulation (instruction {a})",
                        ins.describe()
                    )));
                }
            }
        }
    }
    if p.vertical_sync {
        vertical_sync(p)?;
    }
    // 4. Every read buffer is produced first.
    dataflow(p)?;
    // 5. Deadlock freedom: replay.
    replay(p)
}

/// Rule 3 for [`Program::per_micro_batch_step`] (PipeDream's asynchronous 1F1B) on device `d`:
/// - each [`Instr::Accumulate`] is followed by a [`Instr::Step`] before the next accumulation
///   or the end (every micro-batch's gradients are applied alone, none is dropped), and the
///   all-reduces lie between an accumulation and its step (or open the update themselves, on a
///   holder no gradient reaches);
/// - **weight stashing**: when optimizer steps run between the forward of a micro-batch and its
///   backward, a [`Instr::Stash`] of that micro-batch before the forward holds every parameter
///   the backward reads that a step updates (the forward reads the live version, or the stash
///   where there is one), so both read the version the forward saw (a stash after the
///   micro-batch's forward is refused: it would hold a later version than the forward read).
fn per_micro_batch_order(p: &Program, d: &DeviceProgram) -> Result<()> {
    let dev = d.device;
    let Some(st) = p.stages.get(d.stage) else {
        return Ok(());
    };
    // Parameters a step updates: only they have versions (one no step changes reads alike).
    let updated = st.updated();
    let mut steps = 0usize;
    let mut open_acc: Option<usize> = None;
    let mut reduced: BTreeSet<&str> = BTreeSet::new();
    let mut stashed: HashMap<u32, Vec<&String>> = HashMap::new();
    let mut fwd_at: HashMap<u32, usize> = HashMap::new();
    for (k, ins) in d.instructions.iter().enumerate() {
        let fail = |msg: String| {
            Err(Error::msg(format!(
                "schedule: device {dev} instruction {k} ({}): {msg}",
                ins.describe()
            )))
        };
        match ins {
            Instr::Accumulate { .. } => {
                if let Some(a) = open_acc {
                    return fail(format!(
                        "the update opened at instruction {a} (its accumulation or all-reduce) is not stepped before it (per-micro-batch updates)"
                    ));
                }
                open_acc = Some(k);
            }
            // A holder no gradient reaches all-reduces zeros: its all-reduce opens the update.
            // A gradient all-reduced twice in one update is two micro-batches' without a step.
            Instr::AllReduce { tensors, .. } => {
                open_acc.get_or_insert(k);
                if let Some(x) = tensors.iter().find(|x| !reduced.insert(x.as_str())) {
                    return fail(format!(
                        "'{x}' is all-reduced twice in the update opened at instruction {} (not stepped between)",
                        open_acc.unwrap_or(k)
                    ));
                }
            }
            Instr::Step => {
                reduced.clear();
                open_acc = None;
                steps += 1;
            }
            Instr::Stash { mb, .. } if fwd_at.contains_key(mb) => {
                return fail(format!(
                    "micro-batch {mb} is stashed after its forward (the stash must hold the version the forward read)"
                ));
            }
            Instr::Stash { mb, tensors } => {
                stashed.entry(*mb).or_default().extend(tensors);
            }
            Instr::Compute {
                pass: PieceKind::Fwd,
                mb,
            } => {
                fwd_at.insert(*mb, steps);
            }
            Instr::Compute { pass, mb } => {
                let Some(&seen) = fwd_at.get(mb) else {
                    continue;
                };
                if seen == steps {
                    continue;
                }
                let read = |pass: PieceKind| {
                    st.piece(pass)
                        .into_iter()
                        .flat_map(|pc| pc.inputs.iter())
                        .filter(|x| updated.contains(x.as_str()))
                        .collect::<Vec<_>>()
                };
                let have = stashed.get(mb);
                if let Some(q) = read(*pass)
                    .into_iter()
                    .find(|q| !have.is_some_and(|h| h.contains(q)))
                {
                    return fail(format!(
                        "{} optimizer step(s) ran since micro-batch {mb}'s forward, and parameter '{q}' is not stashed for it (weight stashing)",
                        steps - seen
                    ));
                }
            }
            _ => {}
        }
    }
    if let Some(a) = open_acc {
        return Err(Error::msg(format!(
            "schedule: device {dev}: the gradients accumulated at instruction {a} are never stepped (per-micro-batch updates)"
        )));
    }
    Ok(())
}

/// Per device, parameter and micro-batch: the optimizer steps the device ran before the version
/// of the parameter that micro-batch's computes read (at its stash, else at its forward).
pub fn read_versions(p: &Program, d: &DeviceProgram) -> BTreeMap<(String, u32), usize> {
    let mut out = BTreeMap::new();
    let Some(st) = p.stages.get(d.stage) else {
        return out;
    };
    let mut steps = 0usize;
    for ins in &d.instructions {
        match ins {
            Instr::Step => steps += 1,
            Instr::Stash { mb, tensors } => {
                for q in tensors {
                    out.insert((q.clone(), *mb), steps);
                }
            }
            Instr::Compute {
                pass: PieceKind::Fwd,
                mb,
            } => {
                for q in &st.params {
                    out.entry((q.clone(), *mb)).or_insert(steps);
                }
            }
            _ => {}
        }
    }
    out
}

/// PipeDream's vertical sync: every device reads one weight version per micro-batch (the
/// number of steps before it, counted on each device: the stages step in lockstep per
/// micro-batch). Only parameters a step updates have versions: one no step changes (held but
/// not trained, or on a stage without a step) reads the same value at any count. The error
/// names the two devices and the versions.
fn vertical_sync(p: &Program) -> Result<()> {
    let mut seen: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for d in &p.devices {
        let Some(st) = p.stages.get(d.stage) else {
            continue;
        };
        let updated = st.updated();
        for ((q, mb), v) in read_versions(p, d) {
            if !updated.contains(q.as_str()) {
                continue;
            }
            match seen.get(&mb) {
                Some(&(od, ov)) if ov != v => {
                    return Err(Error::msg(format!(
                        "schedule: vertical sync: micro-batch {mb} reads weight version {ov} on device {od} but version {v} of '{q}' on device {}",
                        d.device
                    )))
                }
                Some(_) => {}
                None => {
                    seen.insert(mb, (d.device, v));
                }
            }
        }
    }
    Ok(())
}

/// The dataflow check: replays every device's list over the *names* of its buffers, with
/// exactly the rules the runtime's interpreter (`pipec_runtime::dist::worker`) applies to the
/// tensors, and fails on the first read of a buffer that does not exist at that point.
///
/// - Global buffers at the start: the stage's parameters and optimizer state
///   ([`StageProgram::params`], [`StageProgram::state_init`]).
/// - `Load`, `Recv`, `Zeros`: define `(name, mb)` (a load must name a data input and stay inside its
///   samples); `Compute`: reads every input `X` of its piece as `(X, mb)` if it exists, else
///   as global `X`, and defines `(Y, mb)` for every output; `Concat`/`Sum`: read and free their
///   inputs, define the output; `Send`: reads `(tensor, mb)`; `Accumulate`: reads and frees
///   `(grad/P, mb)` and defines global `grad/P`; `Free`: frees (missing buffers are fine);
///   `AllReduce`: reads global `grad/P` (or zeros when the device holds `P`) and defines it;
///   `Step`: reads its inputs from the globals (the step counter, zeros for a missing `grad/P`
///   of a held `P`), defines the targets of its updates, frees every `grad/P`; `Stash`: reads
///   globals, defines `(P, mb)`.
/// - A micro-batch buffer is freed by the compute or send that is its *last use* on the device
///   (the last instruction reading it as a compute input or a send), as the runtime moves it
///   there.
///
/// One pass stands for every step: micro-batch buffers are cleared after a step, and the
/// globals after a step are a superset of those before it (updates replace parameters and
/// state, the step frees only gradients it made), so a read that succeeds in the first step
/// succeeds in every later one.
pub fn dataflow(p: &Program) -> Result<()> {
    use std::collections::{BTreeSet, HashSet};
    for d in &p.devices {
        let dev = d.device;
        if p.stages.get(d.stage).is_none() {
            continue;
        }
        // Last reading instruction of every (stage, buffer, mb), as the runtime computes it.
        let last_use = last_uses(p, d);
        let is_last = |cur: usize, x: &str, mb: u32, k: usize| {
            last_use.get(&(cur, x.to_string(), mb)) == Some(&k)
        };
        // The device's stages share its globals.
        let mut globals: BTreeSet<&str> = BTreeSet::new();
        for st in d.stages().into_iter().filter_map(|s| p.stages.get(s)) {
            globals.extend(st.params.iter().map(String::as_str));
            globals.extend(st.state_init.iter().map(|(s, _)| s.as_str()));
        }
        // Micro-batch buffers per (stage, name, mb).
        let mut bufs: HashSet<(usize, &str, u32)> = HashSet::new();
        for ((k, ins), cur) in d.instructions.iter().enumerate().zip(d.stage_at()) {
            let Some(st) = p.stages.get(cur) else {
                continue;
            };
            let piece_of = |pass: PieceKind| st.piece(pass);
            let fail = |msg: String| {
                Err(Error::msg(format!(
                    "schedule: device {dev} instruction {k} ({}): {msg}",
                    ins.describe()
                )))
            };
            let nothing = |x: &str, mb: u32| {
                format!("buffer ('{x}', mb {mb}) does not exist (nothing on the device defines it before, or it was consumed)")
            };
            // A global read: the buffer, or zeros for the gradient of a held parameter.
            let global_ok = |globals: &BTreeSet<&str>, x: &str| {
                globals.contains(x) || x.strip_prefix("grad/").is_some_and(|q| globals.contains(q))
            };
            match ins {
                Instr::Load { mb, input, samples } => {
                    let Some(di) = p.data_inputs.iter().find(|di| &di.name == input) else {
                        return fail(format!("'{input}' is not a data input of the program"));
                    };
                    if let Some(ax) = di.batch_axis {
                        let n = di.shape.get(ax).copied().unwrap_or(0).max(0) as u64;
                        if samples[0] > samples[1] || samples[1] > n {
                            return fail(format!(
                                "samples [{}, {}) outside the {n} samples of '{input}'",
                                samples[0], samples[1]
                            ));
                        }
                    }
                    bufs.insert((cur, input.as_str(), *mb));
                }
                Instr::Compute { pass, mb } => {
                    let Some(pc) = piece_of(*pass) else {
                        return fail(format!("stage {} has no {} piece", st.id, pass.name()));
                    };
                    for x in &pc.inputs {
                        let key = (cur, x.as_str(), *mb);
                        if bufs.contains(&key) {
                            if is_last(cur, x, *mb, k) {
                                bufs.remove(&key);
                            }
                        } else if !globals.contains(x.as_str()) {
                            return fail(format!(
                                "input '{x}' of {} is neither buffer ('{x}', mb {mb}) nor a global buffer: nothing on the device produces it before",
                                pc.file
                            ));
                        }
                    }
                    bufs.extend(pc.outputs.iter().map(|y| (cur, y.as_str(), *mb)));
                }
                Instr::Send { mb, tensor, .. } => {
                    let key = (cur, tensor.as_str(), *mb);
                    if !bufs.contains(&key) {
                        return fail(nothing(tensor, *mb));
                    }
                    if is_last(cur, tensor, *mb, k) {
                        bufs.remove(&key);
                    }
                }
                Instr::Recv { mb, tensor, .. } => {
                    bufs.insert((cur, tensor.as_str(), *mb));
                }
                Instr::Zeros {
                    mb, output, shape, ..
                } => {
                    if shape.iter().any(|&x| x < 0) {
                        return fail(format!("shape {shape:?} is not concrete"));
                    }
                    bufs.insert((cur, output.as_str(), *mb));
                }
                Instr::Concat {
                    mb, inputs, output, ..
                }
                | Instr::Sum { mb, inputs, output } => {
                    if inputs.is_empty() {
                        return fail("no inputs".into());
                    }
                    for x in inputs {
                        if !bufs.remove(&(cur, x.as_str(), *mb)) {
                            return fail(nothing(x, *mb));
                        }
                    }
                    bufs.insert((cur, output.as_str(), *mb));
                }
                Instr::Accumulate { mb, tensors } => {
                    for x in tensors {
                        if !bufs.remove(&(cur, x.as_str(), *mb)) {
                            return fail(nothing(x, *mb));
                        }
                        globals.insert(x.as_str());
                    }
                }
                Instr::Free { mb, tensors } => {
                    for x in tensors {
                        bufs.remove(&(cur, x.as_str(), *mb));
                    }
                }
                Instr::Stash { mb, tensors } => {
                    for x in tensors {
                        if !globals.contains(x.as_str()) {
                            return fail(format!("no global buffer '{x}' to stash"));
                        }
                        bufs.insert((cur, x.as_str(), *mb));
                    }
                }
                Instr::AllReduce { tensors, .. } => {
                    for x in tensors {
                        if !global_ok(&globals, x) {
                            return fail(format!("no global buffer '{x}' on the device"));
                        }
                        globals.insert(x.as_str());
                    }
                }
                Instr::Step => {
                    let Some(sp) = &st.step else {
                        return fail(format!("stage {} has no step piece", st.id));
                    };
                    for x in &sp.inputs {
                        if st.step_counter.as_deref() != Some(x.as_str()) && !global_ok(&globals, x)
                        {
                            return fail(format!(
                                "input '{x}' of {} is not a global buffer",
                                sp.file
                            ));
                        }
                    }
                    for (out, target) in &st.updates {
                        if !sp.outputs.contains(out) {
                            return fail(format!("{} has no output '{out}'", sp.file));
                        }
                        globals.insert(target.as_str());
                    }
                    for q in st.stepped_params() {
                        globals.remove(format!("grad/{q}").as_str());
                    }
                }
                Instr::Stage { .. } => {}
            }
        }
    }
    Ok(())
}

/// Replay every device list with buffered sends, blocking receives and collective all-reduces;
/// an error names every stuck device and what it waits for.
fn replay(p: &Program) -> Result<()> {
    let n = p.devices.len();
    let mut pc = vec![0usize; n];
    let mut delivered: std::collections::HashSet<u32> = std::collections::HashSet::new();
    loop {
        let mut progress = false;
        for d in 0..n {
            let list = &p.devices[d].instructions;
            while pc[d] < list.len() {
                match &list[pc[d]] {
                    Instr::Send { tag, .. } => {
                        delivered.insert(*tag);
                    }
                    Instr::Recv { tag, .. } if !delivered.contains(tag) => break,
                    Instr::AllReduce { group, tag, .. } => {
                        // Ready when every member is at an all-reduce with the same tag.
                        let ready = group.iter().all(|&g| {
                            g < n
                                && matches!(p.devices[g].instructions.get(pc[g]),
                                    Some(Instr::AllReduce { tag: t, .. }) if t == tag)
                        });
                        if !ready {
                            break;
                        }
                        for &g in group {
                            if g != d {
                                pc[g] += 1;
                            }
                        }
                    }
                    _ => {}
                }
                pc[d] += 1;
                progress = true;
            }
        }
        if (0..n).all(|d| pc[d] >= p.devices[d].instructions.len()) {
            return Ok(());
        }
        if !progress {
            let stuck: Vec<String> = (0..n)
                .filter(|&d| pc[d] < p.devices[d].instructions.len())
                .map(|d| {
                    format!(
                        "device {d} at instruction {} ({})",
                        pc[d],
                        p.devices[d].instructions[pc[d]].describe()
                    )
                })
                .collect();
            return Err(Error::msg(format!(
                "schedule deadlocks: no device can proceed; {}",
                stuck.join("; ")
            )));
        }
    }
}

/// Which host core runs each emulated device when `devices` in-process devices share `cores`
/// host cores (the `cpu` preset oversubscribed): `Some(core of each device)` when the devices
/// divide evenly (`devices = k·cores`, `k ≥ 2`), else `None` (the OS places the threads).
///
/// Devices are taken in mirror order (`0, D−1, 1, D−2, …`) and dealt `k` to a core, so each
/// core holds stages from both ends of the pipeline: in 1F1B the first stages are busy in the
/// warm-up and drain when the last ones wait, and the other way round in the steady state, so a
/// core's devices rarely compete. The runtime pins its worker threads to this map and the
/// simulator shares each core only among its own devices (measured on gpt2_tiny, 4 stages on 2
/// cores: 41.1 → 37.9 ms/step median over 12 alternating runs, BENCHMARKS.md).
pub fn host_core_map(devices: usize, cores: usize) -> Option<Vec<usize>> {
    if cores < 2 || devices < 2 * cores || !devices.is_multiple_of(cores) {
        return None;
    }
    let k = devices / cores;
    let mut map = vec![0; devices];
    let (mut lo, mut hi) = (0, devices - 1);
    for i in 0..devices {
        let d = if i % 2 == 0 {
            lo += 1;
            lo - 1
        } else {
            hi -= 1;
            hi + 1
        };
        map[d] = i / k;
    }
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_name_gives_back_its_buffer() {
        assert_eq!(piece_name("h.0/out", 1, 3, 3), "h.0/out#r1");
        assert_eq!(piece_name("h.0/out", 1, 2, 3), "h.0/out#r1m2");
        for p in [
            piece_name("cot/x/s2", 0, 0, 0),
            piece_name("cot/x/s2", 12, 4, 5),
        ] {
            assert_eq!(joined_name(&p), "cot/x/s2");
        }
        assert_eq!(joined_name("plain"), "plain");
    }

    #[test]
    fn host_core_map_pairs_the_ends() {
        assert_eq!(host_core_map(4, 2), Some(vec![0, 1, 1, 0]));
        assert_eq!(host_core_map(8, 4), Some(vec![0, 1, 2, 3, 3, 2, 1, 0]));
        assert_eq!(host_core_map(8, 2), Some(vec![0, 0, 1, 1, 1, 1, 0, 0]));
        assert_eq!(host_core_map(6, 2), Some(vec![0, 0, 1, 1, 1, 0]));
        assert_eq!(host_core_map(6, 4), None);
        assert_eq!(host_core_map(2, 2), None);
        assert_eq!(host_core_map(4, 1), None);
    }

    fn piece(f: &str) -> Piece {
        Piece {
            file: f.into(),
            inputs: vec![],
            outputs: vec![],
        }
    }

    fn two_devices(a: Vec<Instr>, b: Vec<Instr>) -> Program {
        let stage = |id: usize| StageProgram {
            id,
            devices: vec![id],
            fwd: piece("f"),
            bwd: None,
            bwd_b: None,
            bwd_w: None,
            step: None,
            params: vec![],
            updates: vec![],
            state_init: vec![],
            step_counter: None,
            loss: None,
        };
        let mut stages = vec![stage(0), stage(1)];
        // Device 0's forward makes 'x' (what the tests send).
        stages[0].fwd.outputs = vec!["x".into()];
        Program {
            version: PROGRAM_VERSION,
            model: "m".into(),
            planner: "straight".into(),
            schedule: "1f1b".into(),
            batch: 1,
            micro_batch: 1,
            micro_batches: 1,
            loss: "sum".into(),
            optimizer: "sgd".into(),
            data_inputs: vec![],
            weights: "weights.npz".into(),
            stages,
            devices: vec![
                DeviceProgram {
                    device: 0,
                    stage: 0,
                    replica: 0,
                    instructions: a,
                    chunks: Vec::new(),
                },
                DeviceProgram {
                    device: 1,
                    stage: 1,
                    replica: 0,
                    instructions: b,
                    chunks: Vec::new(),
                },
            ],
            reference: None,
            per_micro_batch_step: false,
            vertical_sync: false,
        }
    }

    fn send(tag: u32, peer: usize) -> Instr {
        Instr::Send {
            mb: 0,
            tensor: "x".into(),
            peer,
            slice: None,
            tag,
            dtype: "f32".into(),
            shape: vec![2],
        }
    }
    fn recv(tag: u32, peer: usize) -> Instr {
        Instr::Recv {
            mb: 0,
            tensor: "x".into(),
            peer,
            tag,
            dtype: "f32".into(),
            shape: vec![2],
        }
    }

    #[test]
    fn pair_order_holds_when_both_ends_agree_and_names_the_first_difference() {
        let same = two_devices(vec![send(0, 1), send(1, 1)], vec![recv(0, 0), recv(1, 0)]);
        pair_order(&same).unwrap();
        // Matched by tag (MPI) this is fine; matched by order (NCCL) it is not.
        let swapped = two_devices(vec![send(0, 1), send(1, 1)], vec![recv(1, 0), recv(0, 0)]);
        let e = pair_order(&swapped).unwrap_err().to_string();
        assert!(
            e.contains("device 0's message 0 to device 1 is tag 0")
                && e.contains("device 1's receive 0 from device 0 is tag 1"),
            "{e}"
        );
    }

    #[test]
    fn matched_exchange_verifies_and_round_trips() {
        let p = two_devices(
            vec![compute_fwd(0), send(0, 1), recv(1, 1)],
            vec![recv(0, 0), send(1, 0)],
        );
        verify(&p).unwrap();
        let back = Program::from_json(&p.to_json(), "s.json").unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn cyclic_wait_is_reported_with_both_devices() {
        let p = two_devices(vec![recv(1, 1), send(0, 1)], vec![recv(0, 0), send(1, 0)]);
        let e = verify(&p).unwrap_err().to_string();
        assert!(e.contains("deadlocks"), "{e}");
        assert!(e.contains("device 0 at instruction 0"), "{e}");
        assert!(e.contains("device 1 at instruction 0"), "{e}");
    }

    #[test]
    fn shape_mismatch_and_orphans_are_errors() {
        let mut bad = recv(0, 0);
        if let Instr::Recv { shape, .. } = &mut bad {
            *shape = vec![3];
        }
        let e = verify(&two_devices(vec![send(0, 1)], vec![bad]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("expects f32[3]"), "{e}");
        let e = verify(&two_devices(vec![send(0, 1)], vec![]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("never received"), "{e}");
        let e = verify(&two_devices(vec![], vec![recv(0, 0)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no matching send"), "{e}");
    }

    #[test]
    fn backward_before_forward_is_an_error() {
        let p = two_devices(
            vec![Instr::Compute {
                pass: PieceKind::Bwd,
                mb: 0,
            }],
            vec![],
        );
        let e = verify(&p).unwrap_err().to_string();
        assert!(
            e.contains("backward of micro-batch 0 before its forward"),
            "{e}"
        );
    }

    /// A split backward (`bwd_b` then `bwd_w`): the weight-gradient part before the input-gradient
    /// part is rejected, a piece the stage lacks is named, and the order B, W verifies.
    #[test]
    fn weight_pass_needs_its_input_gradient_pass_and_its_piece() {
        let c = |pass, mb| Instr::Compute { pass, mb };
        let split = |a: Vec<Instr>| {
            let mut p = two_devices(a, vec![]);
            p.stages[0].bwd_b = Some(piece("b"));
            p.stages[0].bwd_w = Some(piece("w"));
            p
        };
        let e = verify(&split(vec![
            compute_fwd(0),
            c(PieceKind::BwdW, 0),
            c(PieceKind::BwdB, 0),
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("weight gradients of micro-batch 0 before its input gradients"),
            "{e}"
        );
        verify(&split(vec![
            compute_fwd(0),
            c(PieceKind::BwdB, 0),
            c(PieceKind::BwdW, 0),
        ]))
        .unwrap();
        let e = verify(&two_devices(
            vec![compute_fwd(0), c(PieceKind::BwdB, 0), c(PieceKind::BwdW, 0)],
            vec![],
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("stage 0 has no bwd_b piece"), "{e}");
    }

    fn with_fwd_inputs(mut p: Program, stage: usize, inputs: &[&str]) -> Program {
        p.stages[stage].fwd.inputs = inputs.iter().map(|x| x.to_string()).collect();
        p
    }

    fn compute_fwd(mb: u32) -> Instr {
        Instr::Compute {
            pass: PieceKind::Fwd,
            mb,
        }
    }

    #[test]
    fn a_piece_reading_an_unproduced_buffer_is_refused() {
        // Device 1 computes its forward without receiving 'x'.
        let p = with_fwd_inputs(two_devices(vec![], vec![compute_fwd(0)]), 1, &["x"]);
        let e = verify(&p).unwrap_err().to_string();
        assert!(
            e.contains("device 1 instruction 0 (compute fwd mb 0)"),
            "{e}"
        );
        assert!(
            e.contains("input 'x' of f is neither buffer ('x', mb 0) nor a global buffer"),
            "{e}"
        );
        // Received first, it verifies; received for another micro-batch, it does not.
        let ok = with_fwd_inputs(
            two_devices(
                vec![compute_fwd(0), send(0, 1)],
                vec![recv(0, 0), compute_fwd(0)],
            ),
            1,
            &["x"],
        );
        verify(&ok).unwrap();
        let wrong_mb = with_fwd_inputs(
            two_devices(
                vec![compute_fwd(0), send(0, 1)],
                vec![recv(0, 0), compute_fwd(1)],
            ),
            1,
            &["x"],
        );
        let e = verify(&wrong_mb).unwrap_err().to_string();
        assert!(e.contains("device 1 instruction 1"), "{e}");
        assert!(e.contains("('x', mb 1)"), "{e}");
    }

    #[test]
    fn dataflow_follows_the_runtime_buffer_rules() {
        // A parameter is a global buffer: no receive needed.
        let mut p = with_fwd_inputs(two_devices(vec![], vec![compute_fwd(0)]), 1, &["W"]);
        p.stages[1].params = vec!["W".into()];
        verify(&p).unwrap();
        // A buffer read twice stays until its last use.
        let twice = with_fwd_inputs(
            two_devices(
                vec![compute_fwd(0), send(0, 1)],
                vec![recv(0, 0), compute_fwd(0), compute_fwd(0)],
            ),
            1,
            &["x"],
        );
        verify(&twice).unwrap();
        // A free drops it.
        let freed = with_fwd_inputs(
            two_devices(
                vec![compute_fwd(0), send(0, 1)],
                vec![
                    recv(0, 0),
                    Instr::Free {
                        mb: 0,
                        tensors: vec!["x".into()],
                    },
                    compute_fwd(0),
                ],
            ),
            1,
            &["x"],
        );
        let e = verify(&freed).unwrap_err().to_string();
        assert!(
            e.contains("device 1 instruction 2 (compute fwd mb 0)"),
            "{e}"
        );
        // A concat consumes its inputs.
        let concat = with_fwd_inputs(
            two_devices(
                vec![compute_fwd(0), send(0, 1)],
                vec![
                    recv(0, 0),
                    Instr::Concat {
                        mb: 0,
                        inputs: vec!["x".into()],
                        output: "y".into(),
                        axis: 0,
                    },
                    compute_fwd(0),
                ],
            ),
            1,
            &["x"],
        );
        let e = verify(&concat).unwrap_err().to_string();
        assert!(e.contains("device 1 instruction 2"), "{e}");
        // Accumulating a gradient that no backward produced.
        let acc = two_devices(
            vec![],
            vec![Instr::Accumulate {
                mb: 0,
                tensors: vec!["grad/W".into()],
            }],
        );
        let e = dataflow(&acc).unwrap_err().to_string();
        assert!(
            e.contains("device 1 instruction 0 (accumulate 1 gradients mb 0): buffer ('grad/W', mb 0) does not exist"),
            "{e}"
        );
        // Loading something that is not a data input.
        let load = two_devices(
            vec![Instr::Load {
                mb: 0,
                input: "ids".into(),
                samples: [0, 1],
            }],
            vec![],
        );
        let e = verify(&load).unwrap_err().to_string();
        assert!(e.contains("'ids' is not a data input"), "{e}");
    }
}
