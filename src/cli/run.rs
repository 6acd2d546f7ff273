//! `pipec run OUTDIR [--steps N] [--inputs DATA.npz] [--seed S] [--check] [--trace TRACE.json]
//! [--timeout SECS] [--backend inproc|mpi]` (cli.md): executes a compiled program with one worker
//! per device: threads of this process (`inproc`), or one process per device under
//! `mpirun -np N` (`mpi`, cargo feature `mpi`) (`pipec_runtime::dist`).
//!
//! Exit codes: 0 success; 1 `--check` found a relative difference above 1e-4; 2 bad input
//! (missing OUTDIR or file, a schedule that does not verify, bad `--inputs`) or a failed run
//! (the first device error, naming device, instruction and step).

use anyhow::{bail, Context, Result};
use clap::Args;
use pipec_runtime::dist::{self, RunOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Execute a compiled program (the OUTDIR of `pipec compile`) with one worker per device.
///
/// Every device runs its instruction list from `schedule.json` once per step on its own thread
/// (backend `inproc`: messages move between threads without copies; all-reduce is a ring), or,
/// with `--backend mpi` under `mpirun -np DEVICES`, in its own process (rank = device; MPI
/// point-to-point messages and MPI all-reduce; a failing rank aborts the whole job).
/// The data of a step is random from `--seed` (floats standard normal, integer inputs uniform
/// in [0, high)) unless `--inputs` gives it; the same data is used every step. Prints the loss
/// of every step and where each device spent its time.
///
/// `--check` also runs the unpartitioned reference program on one device with the same data,
/// optimizer and steps, and compares every parameter: `max_abs_diff` = max |a - b|,
/// `max_rel_diff` = max over parameters of max|a - b| / max|b|; exit 1 if it exceeds 1e-4.
/// The first failing device stops the run (every other worker within a second) and its error
/// names the device, the instruction and the step.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The compiled program (written by `pipec compile -o OUTDIR`).
    pub outdir: PathBuf,
    /// Training steps to run (at least 1).
    #[arg(long, default_value_t = 1)]
    pub steps: usize,
    /// One array per data input at the global batch, keyed by input name (else random data).
    #[arg(long, value_name = "DATA.npz")]
    pub inputs: Option<PathBuf>,
    /// Seed of the random data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compare every parameter with the single-device reference run (exit 1 above 1e-4); for a
    /// `pipedream-async` program, with the single-device emulation of PipeDream's update rule
    /// (each micro-batch on the weight versions the program's computes read).
    #[arg(long)]
    pub check: bool,
    /// Write a Chrome/Perfetto trace (one track per device, one event per instruction).
    #[arg(long, value_name = "TRACE.json")]
    pub trace: Option<PathBuf>,
    /// Seconds a receive or all-reduce waits before the run fails.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub timeout: f64,
    /// Transport between workers: `inproc` (threads in this process) or `mpi` (one process per
    /// device: `mpirun -np DEVICES pipec run OUTDIR --backend mpi`; rank r runs device r, rank 0
    /// prints the results and runs `--check`; needs a build with `--features mpi`).
    #[arg(long, default_value = "inproc")]
    pub backend: String,
    /// Write every parameter after the last step here (npz keyed by parameter name).
    #[arg(short = 'o', long = "output", value_name = "PARAMS.npz")]
    pub output: Option<PathBuf>,
    /// Executor of the stage pieces: `reference` (default, pipec's own interpreter), `tract`, or
    /// `ort` (ONNX Runtime: one session per piece; the library is found through ORT_DYLIB_PATH or
    /// the `onnxruntime` Python package; PIPEC_ORT_THREADS intra-op threads per session, default 1).
    /// `--check`'s single-device reference always runs on the reference interpreter.
    #[arg(long, default_value = "reference")]
    pub executor: String,
    /// Where the pieces compute: `cpu`, or `cuda` (ONNX Runtime's CUDA provider on GPU
    /// PIPEC_CUDA_DEVICE, default 0; implies `--executor ort`; needs a build with `--features cuda`
    /// and onnxruntime-gpu with its CUDA libraries: see README, "GPU").
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
    /// How the all-reduces of GPU values travel: `backend` (default: the backend's own: handed
    /// over in-process, MPI through the host) or `nccl` (with `--device cuda`: each all-reduce
    /// group's GPU values are summed where they are by NCCL, one rank per process and GPU; under
    /// `mpirun` with `--backend mpi` a rank per device, in one process a world of one after the
    /// devices' in-process sum; needs a build with `--features cuda` and `libnccl.so` on the
    /// library path, see README, "GPU"). Point-to-point messages are the backend's either way.
    #[arg(long, default_value = "backend", value_parser = ["backend", "nccl"])]
    pub transport: String,
    /// Arithmetic of the run (pipeline and `--check` reference alike): `f32` as compiled, or
    /// `f64` (every piece, weight, data input and message widened), which separates real
    /// mismatches from float32 rounding amplified by ill-conditioned training (e.g. Adam on
    /// parameters whose gradient is near zero).
    #[arg(long, default_value = "f32", value_parser = ["f32", "f64"])]
    pub precision: String,
    /// With `--check`: also run the reference in float64 (exact training to ~1e-13) and print
    /// how far the float32 pipeline and the float32 reference each are from it, in
    /// `max_rel_diff`'s norm. Tells float32 rounding that the training amplifies (both equally
    /// far, e.g. Adam on near-zero gradients) from a wrong program (the pipeline farther). The
    /// exit code is still `--check`'s.
    #[arg(long, requires = "check")]
    pub accuracy: bool,
    /// Leave the worker threads unpinned. By default, when the devices outnumber this host's
    /// cores and divide evenly among them (e.g. 4 devices on 2 cores), each worker is pinned to
    /// a core so that every core runs stages from both ends of the pipeline, as the planner's
    /// simulator assumes for the `cpu` preset (`inproc` backend, Linux).
    #[arg(long)]
    pub no_pin: bool,
}

/// Run the command.
pub fn run(mut a: RunArgs) -> Result<ExitCode> {
    if a.device == "cuda" {
        a.executor = match a.executor.as_str() {
            "reference" | "ort" | "ort-cuda" => "ort-cuda".into(),
            other => bail!(
                "--device cuda runs the pieces with ONNX Runtime's CUDA provider: drop \
                 --executor {other} (or use --executor ort)"
            ),
        };
    }
    if a.transport == "nccl" && a.device != "cuda" {
        bail!(
            "--transport nccl sums GPU values with NCCL: it needs --device cuda (and a build \
             with --features cuda)"
        );
    }
    match a.backend.as_str() {
        "inproc" => {}
        "mpi" => return run_mpi(a),
        other => bail!("--backend {other}: unknown backend (backends: inproc, mpi)"),
    }
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let (lp, mut opts) = prepare(&a)?;
    print_header(&a, &lp);
    // Steps done, on a terminal only (no extra thread where nobody watches, e.g. benchmarks).
    let bar = super::progress::bar(
        a.steps as u64,
        format!("{} devices", lp.program.devices.len()),
        "steps",
    );
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    let finished = AtomicBool::new(false);
    if !bar.is_hidden() {
        opts.steps_done = Some(done.clone());
    }
    let r = std::thread::scope(|s| {
        if !bar.is_hidden() {
            s.spawn(|| {
                while !finished.load(Ordering::Relaxed) {
                    bar.set_position(done.load(Ordering::Relaxed) as u64);
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        let r = dist::run(&lp, &opts);
        finished.store(true, Ordering::Relaxed);
        r
    })
    .context("the run failed")?;
    drop(bar);
    report(&a, &lp, &r)
}

/// Check the arguments, load OUTDIR and build the run options (the same on every MPI rank).
fn prepare(a: &RunArgs) -> Result<(dist::LoadedProgram, RunOptions)> {
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        bail!(
            "--timeout {}: must be a positive number of seconds",
            a.timeout
        );
    }
    if a.steps == 0 {
        bail!("--steps 0: must be at least 1");
    }
    if a.accuracy && a.precision != "f32" {
        bail!("--accuracy compares a float32 run with float64 training: drop --precision f64");
    }
    if pipec_runtime::exec::executor_by_name(&a.executor).is_none() {
        bail!(
            "--executor {}: unknown executor (executors: reference, tract, ort)",
            a.executor
        );
    }
    let od = pipec::artifact::OutDir::open(&a.outdir)?;
    let mut lp = dist::load_program(&od.dir, od.program, dist::LoadOptions::default())?;
    let f64 = a.precision == "f64";
    if f64 {
        lp.widen_to_f64()?;
    }
    let inputs = match &a.inputs {
        Some(p) => {
            let mut d: dist::Data = pipec_runtime::npz::read(p)?.into_iter().collect();
            if f64 {
                dist::data::widen_f32(&mut d)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            }
            Some(d)
        }
        None => None,
    };
    let opts = RunOptions {
        steps: a.steps,
        seed: a.seed,
        inputs,
        timeout: Duration::from_secs_f64(a.timeout),
        trace: a.trace.is_some(),
        executor: a.executor.clone(),
        pin_threads: !a.no_pin,
        steps_done: None,
        nccl: a.transport == "nccl",
    };
    Ok((lp, opts))
}

fn print_header(a: &RunArgs, lp: &dist::LoadedProgram) {
    let p = &lp.program;
    println!(
        "{}: {} devices, {} stages, batch {} = {} x {} ({}, {})",
        a.outdir.display(),
        p.devices.len(),
        p.stages.len(),
        p.batch,
        p.micro_batches,
        p.micro_batch,
        p.schedule,
        p.optimizer
    );
}

/// Print the result of a run (losses, timings), write the trace and `-o`, run `--check`.
fn report(a: &RunArgs, lp: &dist::LoadedProgram, r: &dist::RunResult) -> Result<ExitCode> {
    let p = &lp.program;
    for (i, l) in r.losses.iter().enumerate() {
        println!("step {}: loss {l:.6e}", i + 1);
    }
    println!(
        "{} steps in {:.3} s ({:.1} samples/s)",
        a.steps,
        r.wall_s,
        (a.steps as f64 * p.batch as f64) / r.wall_s.max(1e-9)
    );
    let steady = r
        .timings
        .iter()
        .map(|t| t.steady_step_s)
        .fold(0.0, f64::max);
    if a.steps >= 2 {
        println!(
            "steady state: {:.6} s/step (steps 2-{}, slowest device; without preparing and the first step)",
            steady, a.steps
        );
    }
    println!("device  prepare_s  compute_s  comm_s  other_s  total_s    cpu_s");
    for t in &r.timings {
        let cpu = if t.cpu_s.is_nan() {
            format!("{:>7}", "-")
        } else {
            format!("{:>7.3}", t.cpu_s)
        };
        println!(
            "{:>6}  {:>9.3}  {:>9.3}  {:>6.3}  {:>7.3}  {:>7.3}  {cpu}",
            t.device, t.prepare_s, t.compute_s, t.comm_s, t.other_s, t.total_s
        );
    }
    if a.executor.starts_with("ort") {
        // Values stay where ONNX Runtime computes them: after the first step's placement of
        // the parameters and optimizer state, a step moves its data batches in and the losses
        // (and any host all-reduce or MPI message) out.
        let (into, out) = pipec_runtime::ort_backend::transfers();
        println!(
            "host -> ONNX Runtime: {into} bytes, ONNX Runtime -> host: {out} bytes ({})",
            if a.executor == "ort-cuda" {
                "copies to and from the GPU"
            } else {
                "host memory: hand-overs and copies"
            }
        );
    }
    #[cfg(feature = "cuda")]
    if a.transport == "nccl" {
        let (calls, bytes) = pipec_runtime::dist::nccl::totals();
        println!(
            "NCCL {}: {calls} all-reduce calls, {bytes} bytes summed on the GPU",
            pipec_runtime::dist::nccl::version()
                .map(|v| v.to_string())
                .unwrap_or_else(|e| e)
        );
    }
    if let (Some(path), Some(t)) = (&a.trace, &r.trace) {
        let text = serde_json::to_string(&t.to_json())?;
        super::write_atomic(path, text.as_bytes())?;
        println!("trace: {}", path.display());
    }
    if let Some(path) = &a.output {
        let entries = pipec::artifact::OutDir::model_params(&a.outdir, &r.params)?;
        let tmp = path.with_extension("npz.tmp");
        pipec_runtime::npz::write(&tmp, &entries)?;
        std::fs::rename(&tmp, path).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    if a.check {
        let (rep, acc) = if a.accuracy {
            let (rep, acc) = dist::check::check_accuracy(lp, r).context("--check")?;
            (rep, Some(acc))
        } else {
            (dist::check(lp, r).context("--check")?, None)
        };
        for (i, l) in rep.ref_losses.iter().enumerate() {
            println!("reference step {}: loss {l:.6e}", i + 1);
        }
        for (name, abs, rel) in &rep.params {
            println!("  {name}: abs {abs:.3e} rel {rel:.3e}");
        }
        println!("max_abs_diff {:.6e}", rep.max_abs_diff);
        println!("max_rel_diff {:.6e}", rep.max_rel_diff);
        if let Some(acc) = acc {
            println!(
                "accuracy against float64 training: pipeline {:.3e}, reference {:.3e} (ratio {:.3})",
                acc.pipeline,
                acc.reference,
                acc.pipeline / acc.reference.max(1e-300)
            );
        }
        if let Some(why) = &rep.diverged {
            println!(
                "check INCONCLUSIVE: the single-device reference training diverged ({why}), so \
                 the comparison says nothing about the program; compile with a smaller learning \
                 rate than this program's ({}) or run fewer --steps",
                p.optimizer
            );
            return Ok(ExitCode::from(1));
        }
        if !rep.ok {
            println!(
                "check FAILED: max_rel_diff {:.3e} > {:.0e}",
                rep.max_rel_diff,
                dist::check::TOLERANCE
            );
            if !a.accuracy && a.precision == "f32" {
                println!(
                    "hint: --accuracy (or --precision f64) tells float32 rounding that the training amplifies from a wrong program"
                );
            }
            return Ok(ExitCode::from(1));
        }
        println!("check ok (max_rel_diff <= {:.0e})", dist::check::TOLERANCE);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_a: RunArgs) -> Result<ExitCode> {
    bail!(
        "--backend mpi: this pipec was built without MPI; rebuild with --features mpi \
         (cargo build --features mpi) and start it with mpirun -np DEVICES"
    )
}

/// `--backend mpi`: this process is one rank of `mpirun -np N` and runs device `rank`.
///
/// Errors the ranks detect alike before running (bad arguments, OUTDIR, `-np` different from
/// the device count) are agreed on with two all-reduces and reported once, every rank exits 2.
/// A rank that fails while running prints its error and calls `MPI_Abort`, which ends the job
/// (mpirun exits non-zero). Rank 0 prints the results and runs `--check`; its exit code is
/// broadcast so every rank exits with it.
#[cfg(feature = "mpi")]
fn run_mpi(a: RunArgs) -> Result<ExitCode> {
    use pipec_runtime::dist::mpi::{run_rank, Session};
    use std::io::Write;
    let Some(s) = Session::init() else {
        bail!("--backend mpi: MPI could not be initialized");
    };
    let (rank, size) = (s.rank(), s.size());
    let prepared = prepare(&a).and_then(|(lp, opts)| {
        let n = lp.program.devices.len();
        if size != n {
            bail!(
                "--backend mpi: {} has {n} devices but mpirun started {size} ranks \
                 (one rank per device: mpirun -np {n} pipec run ...)",
                a.outdir.display()
            );
        }
        Ok((lp, opts))
    });
    // The lowest failing rank reports; everyone exits 2 (no rank is left waiting).
    let first_bad = s.min_rank(prepared.is_err());
    if let Some(bad) = first_bad {
        if let Err(e) = &prepared {
            if bad == rank {
                let prefix = if size > 1 {
                    format!("rank {rank}: ")
                } else {
                    String::new()
                };
                eprintln!("error: {prefix}{e:#}");
            }
        }
        return Ok(ExitCode::from(2));
    }
    let Ok((lp, opts)) = prepared else {
        unreachable!("every rank prepared")
    };
    if rank == 0 {
        print_header(&a, &lp);
        println!(
            "backend mpi: {size} ranks ({})",
            s.library_version()
                .split(',')
                .next()
                .unwrap_or("MPI")
                .trim()
        );
    }
    let code = match run_rank(&s, &lp, &opts) {
        Err(e) => {
            eprintln!("error: rank {rank}: the run failed: {e}");
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            s.abort(2);
        }
        Ok(Some(r)) => match report(&a, &lp, &r) {
            Ok(c) if c == ExitCode::SUCCESS => 0,
            Ok(_) => 1,
            Err(e) => {
                super::report_error(&e);
                2
            }
        },
        Ok(None) => 0,
    };
    let _ = std::io::stdout().flush();
    Ok(ExitCode::from(s.broadcast_code(code)))
}
