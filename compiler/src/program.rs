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
//! through even slices). Tensors that carry the batch on axis 0 move between stages with
//! different replica counts as row ranges ([`Slice`]) and are reassembled with
//! [`Instr::Concat`]; batch-independent tensors move whole.
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
use std::collections::{BTreeMap, HashMap};

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
    pub stage: usize,
    pub replica: usize,
    pub instructions: Vec<Instr>,
}

/// Rows `[lo*n/of, (hi)*n/of)` of a tensor whose axis 0 has `n` rows (`of` divides `n`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    pub lo: u64,
    pub hi: u64,
    pub of: u64,
}

/// Which piece a [`Instr::Compute`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PieceKind {
    Fwd,
    Bwd,
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
    /// `(output, mb)` = concatenation along axis 0 of `(inputs[i], mb)`, which are freed.
    Concat {
        mb: u32,
        inputs: Vec<String>,
        output: String,
    },
    /// `(output, mb)` = element-wise sum of `(inputs[i], mb)`, which are freed (cotangents of a
    /// batch-independent value from several consumer replicas).
    Sum {
        mb: u32,
        inputs: Vec<String>,
        output: String,
    },
    /// Global `grad/P` += buffer `(grad/P, mb)` for every name in `tensors` (created as zeros
    /// on first use); the micro-batch buffers are freed.
    Accumulate { mb: u32, tensors: Vec<String> },
    /// Drop micro-batch buffers.
    Free { mb: u32, tensors: Vec<String> },
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
}

impl Instr {
    /// Short text for messages: `recv 'x' mb 3 from device 1 (tag 17)`.
    pub fn describe(&self) -> String {
        match self {
            Instr::Load { mb, input, .. } => format!("load '{input}' mb {mb}"),
            Instr::Compute { pass, mb } => format!("compute {pass:?} mb {mb}").to_lowercase(),
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
            Instr::Accumulate { mb, tensors } => {
                format!("accumulate {} gradients mb {mb}", tensors.len())
            }
            Instr::Free { mb, tensors } => format!("free {} buffers mb {mb}", tensors.len()),
            Instr::AllReduce { group, tag, .. } => {
                format!("all-reduce over devices {group:?} (tag {tag})")
            }
            Instr::Step => "optimizer step".into(),
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

/// The static schedule verifier (run by codegen before it emits, and by the runtime on load).
///
/// Checks, naming devices and instruction indices on failure:
/// 1. the device list is `0..n`, each device's stage exists and lists it as replica `replica`;
/// 2. every recv has exactly one matching send (same tag, sender = the recv's peer, receiver =
///    the send's peer) with equal dtype and shape, and every send is received;
/// 3. on every device, the forward of micro-batch `m` precedes its backward; accumulation of
///    `m` follows its backward; all-reduces and the step follow the last accumulation; nothing
///    but all-reduce and step comes after the step;
/// 4. no device can wait forever: a replay with buffered sends, blocking receives and
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
        let st = p.stages.get(d.stage).ok_or_else(|| {
            Error::msg(format!(
                "schedule: device {i} runs unknown stage {}",
                d.stage
            ))
        })?;
        if st.devices.get(d.replica) != Some(&i) {
            return Err(Error::msg(format!(
                "schedule: device {i} claims replica {} of stage {} but the stage lists devices {:?}",
                d.replica, d.stage, st.devices
            )));
        }
    }
    // 2. Matching sends and receives.
    let mut sends: HashMap<u32, (usize, usize, &Instr)> = HashMap::new();
    let mut recvs: HashMap<u32, (usize, usize, &Instr)> = HashMap::new();
    for d in &p.devices {
        for (k, ins) in d.instructions.iter().enumerate() {
            let (map, tag, peer) = match ins {
                Instr::Send { tag, peer, .. } => (&mut sends, *tag, *peer),
                Instr::Recv { tag, peer, .. } => (&mut recvs, *tag, *peer),
                _ => continue,
            };
            if peer >= n || peer == d.device {
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
        let mut fwd: BTreeMap<u32, usize> = BTreeMap::new();
        let mut bwd: BTreeMap<u32, usize> = BTreeMap::new();
        let mut last_acc = None;
        let mut step_at = None;
        for (k, ins) in d.instructions.iter().enumerate() {
            if let Some(s) = step_at {
                if !matches!(ins, Instr::AllReduce { .. }) {
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
                    fwd.insert(*mb, k);
                }
                Instr::Compute {
                    pass: PieceKind::Bwd,
                    mb,
                } => {
                    if !fwd.contains_key(mb) {
                        return Err(Error::msg(format!(
                            "schedule: device {dev} instruction {k}: backward of micro-batch {mb} before its forward"
                        )));
                    }
                    bwd.insert(*mb, k);
                }
                Instr::Accumulate { mb, .. } => {
                    if !bwd.contains_key(mb) {
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
        let has_bwd = p.stages.get(d.stage).is_some_and(|s| s.bwd.is_some());
        if has_bwd {
            if let Some(mb) = fwd.keys().find(|mb| !bwd.contains_key(mb)) {
                return Err(Error::msg(format!(
                    "schedule: device {dev} runs the forward of micro-batch {mb} but never its backward"
                )));
            }
        }
        if let Some(a) = last_acc {
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
    // 4. Deadlock freedom: replay.
    replay(p)
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
            step: None,
            params: vec![],
            updates: vec![],
            state_init: vec![],
            step_counter: None,
            loss: None,
        };
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
            stages: vec![stage(0), stage(1)],
            devices: vec![
                DeviceProgram {
                    device: 0,
                    stage: 0,
                    replica: 0,
                    instructions: a,
                },
                DeviceProgram {
                    device: 1,
                    stage: 1,
                    replica: 0,
                    instructions: b,
                },
            ],
            reference: None,
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
    fn matched_exchange_verifies_and_round_trips() {
        let p = two_devices(vec![send(0, 1), recv(1, 1)], vec![recv(0, 0), send(1, 0)]);
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
}
