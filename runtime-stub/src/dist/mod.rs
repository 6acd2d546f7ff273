//! The distributed runtime of `pipec run` (issue 7): loads a compiled program (`OUTDIR` of
//! `pipec compile`) and executes it with one worker per device.
//!
//! ```text
//! OUTDIR/schedule.json ──► load() ── verify, weights.npz, every piece imported ──► LoadedProgram
//!                                                                                     │
//!   run(): one thread per device (std::thread::scope), each with an Endpoint of the   ▼
//!   transport (inproc: mailboxes, zero copy) and the Collectives (ring all-reduce);
//!   worker::run_device prepares its stage's pieces and interprets its instruction list
//!   `steps` times; the first error aborts every worker and is returned.
//! ```
//!
//! The execution model is the one of [`pipec_compiler::program`] (read its module doc); the
//! runtime adds these conventions:
//! - The instruction list of a device is one training step; it is run `steps` times. Tags are
//!   reused every step (the transport is FIFO per `(source, tag)`). Micro-batch buffers do not
//!   survive a step (cleared after it); global buffers (parameters, optimizer state) do.
//! - A micro-batch buffer is moved, not copied, into the compute or send that is its last use
//!   on the device (a later [`Free`](pipec_compiler::program::Instr::Free) of it is a no-op).
//! - A missing `grad/P` at an all-reduce or a step (no micro-batch touched `P`) counts as zeros.
//! - The step counter input of a step piece is the 1-based step number as a 0-D tensor of the
//!   dtype of the stage's first parameter (`f32` if it has none).
//! - The run's loss of a step is the sum over devices of `factor * value` over the stage's
//!   forward computes ([`StageProgram::loss`]).
//!
//! What the codegen must guarantee beyond [`pipec_compiler::program::verify`]: every piece's
//! ONNX graph inputs/outputs are the names of its [`Piece`] (checked on load), every stage
//! parameter is in `weights.npz` (checked on load), piece inputs are resolvable as buffers at
//! the time of the compute (checked when it runs).

pub mod check;
pub mod collective;
pub mod data;
/// Hand-built programs for tests (feature `test-support`: the runtime's own tests and the CLI's
/// enable it as a dev-dependency feature; release builds do not contain it).
#[cfg(feature = "test-support")]
pub mod fixtures;
pub mod inproc;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod trace;
pub mod transport;
pub mod value_ops;
pub mod worker;

pub use check::{check, CheckReport};
pub use collective::{Collectives, Ring, ValueCollectives};
pub use data::Data;
pub use transport::{CommError, Endpoint, Tag};

use crate::exec::Executor;
use crate::tensor::Tensor;
use pipec_compiler::ir::Module;
use pipec_compiler::program::{Piece, Program};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Errors of the distributed runtime. `Display` is one line naming the file, device and
/// instruction at fault.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// The compiled program is unusable (missing OUTDIR or file, a schedule that does not
    /// verify, weights that do not fit, bad `--inputs`): detected before any worker starts.
    #[error("{0}")]
    Input(String),
    /// A device failed while running (the first failure of the run).
    #[error("device {device} {at}: {msg}")]
    Device {
        device: usize,
        /// `instruction 3 (compute fwd mb 0) in step 1`, or what it was preparing.
        at: String,
        msg: String,
    },
    /// A device stopped because another one failed (never the error a run returns unless no
    /// device reported its own failure).
    #[error("device {0} stopped: another device failed")]
    Aborted(usize),
}

/// Result alias of the module.
pub type Result<T, E = DistError> = std::result::Result<T, E>;

/// The imported pieces of one stage.
#[derive(Clone, Debug)]
pub struct StageModules {
    pub fwd: Module,
    pub bwd: Option<Module>,
    /// The split backward's input- and weight-gradient parts, when the program has them.
    pub bwd_b: Option<Module>,
    pub bwd_w: Option<Module>,
    pub step: Option<Module>,
}

/// A compiled program ready to run: the verified schedule, the initial weights and every
/// stage piece imported (shape-inferred) from its ONNX file.
#[derive(Clone, Debug)]
pub struct LoadedProgram {
    pub outdir: PathBuf,
    pub program: Program,
    /// Initial value of every trainable parameter (`weights.npz`).
    pub weights: BTreeMap<String, Tensor>,
    /// Per stage, indexed like `program.stages`.
    pub stages: Vec<StageModules>,
    /// Every float32 piece, weight and message widened to float64 ([`LoadedProgram::widen_to_f64`]).
    pub f64: bool,
}

impl LoadedProgram {
    /// Run everything in float64 instead of float32: every piece (with
    /// [`crate::exec::to_f64`]), the weights, the float data inputs and the declared dtypes of
    /// every message; the `--check` reference is widened the same way. The pipeline and the
    /// reference then differ only by float64 rounding, so `--check` can judge programs whose
    /// float32 results are ill-conditioned (Adam on ResNet: a near-zero gradient's sign decides
    /// a step of `lr`) without loosening the 1e-4 bound.
    pub fn widen_to_f64(&mut self) -> Result<()> {
        use pipec_compiler::ir::DType;
        use pipec_compiler::program::Instr;
        let w = |m: &Module| crate::exec::to_f64(m).map_err(|e| input_err(e.to_string()));
        for st in &mut self.stages {
            st.fwd = w(&st.fwd)?;
            for piece in [&mut st.bwd, &mut st.bwd_b, &mut st.bwd_w] {
                if let Some(b) = piece.as_ref() {
                    *piece = Some(w(b)?);
                }
            }
            if let Some(b) = &st.step {
                st.step = Some(w(b)?);
            }
        }
        data::widen_f32(&mut self.weights).map_err(input_err)?;
        let widen = |d: &mut String| {
            if data::parse_dtype(d) == Some(DType::F32) {
                *d = "float64".into();
            }
        };
        for di in &mut self.program.data_inputs {
            widen(&mut di.dtype);
        }
        for dp in &mut self.program.devices {
            for ins in &mut dp.instructions {
                if let Instr::Send { dtype, .. } | Instr::Recv { dtype, .. } = ins {
                    widen(dtype);
                }
            }
        }
        self.f64 = true;
        Ok(())
    }
}

/// Options of [`load_with`].
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Run [`pipec_compiler::program::verify`] (default true; tests switch it off to exercise
    /// the runtime's own deadlock detection).
    pub verify: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { verify: true }
    }
}

/// Load `OUTDIR` (see [`load_with`]). Test support: the `pipec` library's `OutDir` owns
/// OUTDIR's format and hands the program to [`load_program`].
#[cfg(feature = "test-support")]
pub fn load(outdir: &Path) -> Result<LoadedProgram> {
    load_with(outdir, LoadOptions::default())
}

fn input_err(msg: impl Into<String>) -> DistError {
    DistError::Input(msg.into())
}

/// Load `OUTDIR`: parse `schedule.json`, verify it, check that every file it names exists
/// (before anything is imported, so a missing file is reported by name), read `weights.npz`
/// and check that it holds every stage parameter, import every stage piece and check that its
/// graph inputs/outputs are the ones the schedule lists. Test support, as [`load`].
#[cfg(feature = "test-support")]
pub fn load_with(outdir: &Path, opts: LoadOptions) -> Result<LoadedProgram> {
    if !outdir.is_dir() {
        return Err(input_err(format!(
            "{}: not a directory (expected the OUTDIR of `pipec compile`)",
            outdir.display()
        )));
    }
    let sched = outdir.join("schedule.json");
    let text = std::fs::read_to_string(&sched)
        .map_err(|e| input_err(format!("{}: cannot read: {e}", sched.display())))?;
    let program = Program::from_json(&text, &sched.display().to_string())
        .map_err(|e| input_err(e.to_string()))?;
    load_program(outdir, program, opts)
}

/// [`load_with`] for a program already read from `outdir`'s `schedule.json` (by the `pipec`
/// library's `OutDir`, which owns OUTDIR's format): verify it, check the files it names, read
/// the weights and import the pieces from `outdir`.
pub fn load_program(outdir: &Path, program: Program, opts: LoadOptions) -> Result<LoadedProgram> {
    let sched = outdir.join("schedule.json");
    if opts.verify {
        pipec_compiler::program::verify(&program)
            .map_err(|e| input_err(format!("{}: {e}", sched.display())))?;
    }
    if program.devices.is_empty() {
        return Err(input_err(format!("{}: no devices", sched.display())));
    }
    if program.micro_batches == 0 || program.micro_batch == 0 {
        return Err(input_err(format!(
            "{}: micro_batch {} x micro_batches {}",
            sched.display(),
            program.micro_batch,
            program.micro_batches
        )));
    }
    for (i, st) in program.stages.iter().enumerate() {
        if st.id != i {
            return Err(input_err(format!(
                "{}: stage entry {i} has id {}",
                sched.display(),
                st.id
            )));
        }
    }
    // Every referenced file exists.
    let mut files: Vec<&str> = vec![program.weights.as_str()];
    for st in &program.stages {
        files.push(&st.fwd.file);
        files.extend(st.bwd.iter().map(|p| p.file.as_str()));
        files.extend(st.bwd_b.iter().map(|p| p.file.as_str()));
        files.extend(st.bwd_w.iter().map(|p| p.file.as_str()));
        files.extend(st.step.iter().map(|p| p.file.as_str()));
    }
    if let Some(r) = &program.reference {
        files.push(&r.train.file);
        files.push(&r.step.file);
    }
    for f in &files {
        let p = resolve(outdir, f)?;
        if !p.is_file() {
            return Err(input_err(format!(
                "{}: missing (named by {})",
                p.display(),
                sched.display()
            )));
        }
    }
    let wpath = resolve(outdir, &program.weights)?;
    let weights: BTreeMap<String, Tensor> = crate::npz::read(&wpath)
        .map_err(|e| input_err(e.to_string()))?
        .into_iter()
        .collect();
    for st in &program.stages {
        for p in st.params.iter().chain(st.state_init.iter().map(|(_, p)| p)) {
            if !weights.contains_key(p) {
                return Err(input_err(format!(
                    "{}: no initial value for parameter '{p}' of stage {}",
                    wpath.display(),
                    st.id
                )));
            }
        }
    }
    let mut stages = Vec::with_capacity(program.stages.len());
    for st in &program.stages {
        stages.push(StageModules {
            fwd: import_piece(outdir, &st.fwd)?,
            bwd: st
                .bwd
                .as_ref()
                .map(|p| import_piece(outdir, p))
                .transpose()?,
            bwd_b: st
                .bwd_b
                .as_ref()
                .map(|p| import_piece(outdir, p))
                .transpose()?,
            bwd_w: st
                .bwd_w
                .as_ref()
                .map(|p| import_piece(outdir, p))
                .transpose()?,
            step: st
                .step
                .as_ref()
                .map(|p| import_piece(outdir, p))
                .transpose()?,
        });
    }
    Ok(LoadedProgram {
        outdir: outdir.to_path_buf(),
        program,
        weights,
        stages,
        f64: false,
    })
}

/// `OUTDIR/file`, refusing absolute paths and `..` (a schedule names files inside OUTDIR).
fn resolve(outdir: &Path, file: &str) -> Result<PathBuf> {
    let rel = Path::new(file);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(input_err(format!(
            "schedule names file '{file}' outside OUTDIR"
        )));
    }
    Ok(outdir.join(rel))
}

/// Import one piece and check its signature against the schedule.
pub fn import_piece(outdir: &Path, piece: &Piece) -> Result<Module> {
    let path = resolve(outdir, &piece.file)?;
    let mut m = pipec_compiler::onnx::import::load(&path).map_err(|e| input_err(e.to_string()))?;
    pipec_compiler::shape::infer_shapes(&mut m)
        .map_err(|e| input_err(format!("{}: shape inference failed: {e}", path.display())))?;
    let g = &m.graph;
    let names = |vs: &[pipec_compiler::ir::Value]| -> Vec<String> {
        let mut v: Vec<String> = vs.iter().map(|v| g.name(*v).to_string()).collect();
        v.sort();
        v
    };
    let sorted = |v: &[String]| -> Vec<String> {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    let (gi, go) = (names(&g.inputs), names(&g.outputs));
    if gi != sorted(&piece.inputs) {
        return Err(input_err(format!(
            "{}: graph inputs {gi:?} differ from the schedule's {:?}",
            path.display(),
            piece.inputs
        )));
    }
    if go != sorted(&piece.outputs) {
        return Err(input_err(format!(
            "{}: graph outputs {go:?} differ from the schedule's {:?}",
            path.display(),
            piece.outputs
        )));
    }
    Ok(m)
}

/// Options of [`run`].
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Training steps (each runs every device's instruction list once).
    pub steps: usize,
    /// Seed of the random data (ignored with `inputs`).
    pub seed: u64,
    /// The data of every step (keyed by data input name, at the global batch); random if
    /// `None`. The same data is used every step.
    pub inputs: Option<Data>,
    /// How long a receive waits before the run fails.
    pub timeout: Duration,
    /// Record one trace event per instruction ([`RunResult::trace`]).
    pub trace: bool,
    /// Executor backend of the pieces (`reference` or `tract`).
    pub executor: String,
    /// Pin the worker threads to host cores by [`pipec_compiler::program::host_core_map`] when
    /// the devices outnumber the cores (in-process backend, Linux).
    pub pin_threads: bool,
    /// Counts the steps device 0 has finished, for a caller's progress display.
    pub steps_done: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
    /// All-reduce GPU values with NCCL (`--transport nccl`; executor `ort-cuda`, feature `cuda`).
    pub nccl: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            steps: 1,
            seed: 0,
            inputs: None,
            timeout: Duration::from_secs(60),
            trace: false,
            executor: "reference".into(),
            pin_threads: true,
            steps_done: None,
            nccl: false,
        }
    }
}

/// Where a device spent its time (seconds, all steps together).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceTiming {
    pub device: usize,
    /// Preparing the stage's pieces with the executor.
    pub prepare_s: f64,
    /// Compute and optimizer-step instructions.
    pub compute_s: f64,
    /// Send, receive and all-reduce instructions (mostly waiting).
    pub comm_s: f64,
    /// Everything else (load, concat, accumulate, free).
    pub other_s: f64,
    /// From the worker's start to its end.
    pub total_s: f64,
    /// CPU seconds the worker's thread ran in that time (Linux; NaN elsewhere). Below
    /// `total_s` by the time it waited; with workers time-sharing a core, the wall columns
    /// also count the other workers' slices and this does not.
    pub cpu_s: f64,
    /// Steady-state seconds per step: from the end of this device's first step to the end of
    /// its last, over `steps − 1` (0 with one step). Excludes preparing the pieces and the
    /// first (cold) step.
    pub steady_step_s: f64,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The loss of each step (sum over devices, see the module doc).
    pub losses: Vec<f64>,
    /// Every parameter after the last step (a tied parameter from its first holder).
    pub params: BTreeMap<String, Tensor>,
    /// One per device.
    pub timings: Vec<DeviceTiming>,
    /// Per-instruction events, if asked for.
    pub trace: Option<trace::Trace>,
    /// Wall time of the whole run.
    pub wall_s: f64,
    /// The data the run used.
    pub data: Data,
}

/// The data a run uses: `opts.inputs` checked against the data inputs, else random from the
/// seed.
pub fn run_data(p: &Program, opts: &RunOptions) -> Result<Data> {
    match &opts.inputs {
        Some(d) => data::check_data(&p.data_inputs, d.clone()).map_err(input_err),
        None => data::random_data(&p.data_inputs, opts.seed).map_err(input_err),
    }
}

/// Run the program with the in-process transport (one thread per device) and the ring
/// all-reduce. Returns the first error of any device (the others are stopped within a second).
pub fn run(lp: &LoadedProgram, opts: &RunOptions) -> Result<RunResult> {
    let n = lp.program.devices.len();
    let eps = inproc::endpoints(n);
    let mut boxed: Vec<Box<dyn Endpoint>> = Vec::with_capacity(n);
    for e in eps {
        boxed.push(Box::new(e));
    }
    run_with(lp, opts, boxed, &Ring)
}

/// The GPU whose NCCL rank this process is, if `opts.nccl` (`--transport nccl`): NCCL moves GPU
/// values, so it needs the CUDA executor and a build with the `cuda` feature.
pub(crate) fn nccl_gpu(opts: &RunOptions) -> Result<Option<usize>> {
    if !opts.nccl {
        return Ok(None);
    }
    if opts.executor != "ort-cuda" {
        return Err(input_err(format!(
            "--transport nccl moves GPU values: it needs --device cuda (executor is '{}')",
            opts.executor
        )));
    }
    if cfg!(feature = "cuda") {
        Ok(Some(crate::ort_backend::cuda_device().max(0) as usize))
    } else {
        Err(input_err(
            "--transport nccl: this pipec was built without CUDA support; rebuild with \
             `cargo build --release --features cuda` (`--features mpi,cuda` for --backend mpi)",
        ))
    }
}

/// The NCCL collectives of an in-process run with `opts.nccl` (one NCCL rank: this process).
fn value_collectives(
    lp: &LoadedProgram,
    opts: &RunOptions,
) -> Result<Option<Box<dyn ValueCollectives>>> {
    let Some(gpu) = nccl_gpu(opts)? else {
        return Ok(None);
    };
    #[cfg(feature = "cuda")]
    {
        let n = nccl::Nccl::in_process(gpu, &lp.program).map_err(input_err)?;
        Ok(Some(Box::new(n)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        // nccl_gpu refused already.
        let _ = (gpu, lp);
        Ok(None)
    }
}

/// Run with the given endpoints (one per device, `endpoints[d].rank() == d`) and collectives.
pub fn run_with(
    lp: &LoadedProgram,
    opts: &RunOptions,
    endpoints: Vec<Box<dyn Endpoint>>,
    coll: &dyn Collectives,
) -> Result<RunResult> {
    let n = lp.program.devices.len();
    if endpoints.len() != n || endpoints.iter().enumerate().any(|(i, e)| e.rank() != i) {
        return Err(input_err(format!(
            "{n} devices need endpoints of ranks 0..{n}"
        )));
    }
    let executor: Box<dyn Executor> = crate::exec::executor_by_name(&opts.executor)
        .ok_or_else(|| input_err(format!("unknown executor '{}'", opts.executor)))?;
    let data = run_data(&lp.program, opts)?;
    let nccl = value_collectives(lp, opts)?;
    let cpus = if opts.pin_threads {
        pinning::allowed_cpus()
    } else {
        Vec::new()
    };
    let pin = pipec_compiler::program::host_core_map(n, cpus.len());
    let t0 = Instant::now();
    let first: Mutex<Option<DistError>> = Mutex::new(None);
    let outcomes: Vec<Option<worker::DeviceOutcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = endpoints
            .into_iter()
            .enumerate()
            .map(|(d, mut ep)| {
                let ctx = worker::DeviceCtx {
                    lp,
                    device: d,
                    data: &data,
                    steps: opts.steps,
                    timeout: opts.timeout,
                    executor: executor.as_ref(),
                    collectives: coll,
                    value_collectives: nccl.as_deref(),
                    t0,
                    trace: opts.trace,
                    steps_done: if d == 0 {
                        opts.steps_done.as_deref()
                    } else {
                        None
                    },
                };
                let first = &first;
                let cpu = pin.as_ref().map(|m| cpus[m[d]]);
                s.spawn(move || {
                    if let Some(c) = cpu {
                        pinning::pin_to(c);
                    }
                    match worker::run_device_catching(&ctx, ep.as_mut()) {
                        Ok(o) => Some(o),
                        Err(e) => {
                            if !matches!(e, DistError::Aborted(_)) {
                                let mut f = first.lock().unwrap_or_else(|e| e.into_inner());
                                if f.is_none() {
                                    *f = Some(e);
                                }
                            }
                            ep.abort();
                            None
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().ok().flatten())
            .collect()
    });
    if let Some(e) = first.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let mut outs = Vec::with_capacity(n);
    for (d, o) in outcomes.into_iter().enumerate() {
        outs.push(o.ok_or(DistError::Aborted(d))?);
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let mut losses = vec![0.0; opts.steps];
    let mut params = BTreeMap::new();
    let mut timings = Vec::with_capacity(n);
    let mut events = Vec::new();
    for o in outs {
        for (l, x) in losses.iter_mut().zip(&o.losses) {
            *l += x;
        }
        for (k, v) in o.params {
            params.entry(k).or_insert(v);
        }
        timings.push(o.timing);
        events.extend(o.events);
    }
    Ok(RunResult {
        losses,
        params,
        timings,
        trace: opts.trace.then_some(trace::Trace { devices: n, events }),
        wall_s,
        data,
    })
}

/// Pinning worker threads to host cores, and their CPU clocks (Linux; elsewhere no-ops).
pub mod pinning {
    /// The CPUs this process may run on (its affinity mask, e.g. under `taskset`), ascending.
    #[cfg(target_os = "linux")]
    pub fn allowed_cpus() -> Vec<usize> {
        // SAFETY: `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into `set`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    /// Pins the calling thread to `cpu` (best effort: a refusal leaves it unpinned).
    #[cfg(target_os = "linux")]
    pub fn pin_to(cpu: usize) {
        // SAFETY: `set` is a zeroed `cpu_set_t` with one bit set; pid 0 is the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }

    /// CPU seconds the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`).
    #[cfg(target_os = "linux")]
    pub fn thread_cpu_s() -> Option<f64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        (r == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
    }

    #[cfg(not(target_os = "linux"))]
    pub fn thread_cpu_s() -> Option<f64> {
        None
    }

    #[cfg(not(target_os = "linux"))]
    pub fn allowed_cpus() -> Vec<usize> {
        Vec::new()
    }

    #[cfg(not(target_os = "linux"))]
    pub fn pin_to(_cpu: usize) {}
}
