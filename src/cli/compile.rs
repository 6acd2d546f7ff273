//! `pipec compile MODEL --cluster C --planner P --batch B --micro-batch b [--loss KIND]
//! [--optimizer SPEC] [--dump-ir DIR] -o OUTDIR` (cli.md): plan, build the per-stage pieces,
//! insert communication, verify the schedule, and write OUTDIR atomically.
//!
//! OUTDIR (byte-identical for identical inputs): `plan.json` (as `plan --json`, less the measured
//! `search_time_s`), `schedule.json` (the program, see
//! `pipec_compiler::program`), `weights.npz` (initial parameters), `stages/s{i}.{fwd,bwd,step}.onnx`,
//! `reference/{train,step}.onnx` (the unpartitioned program `pipec run --check` compares with),
//! `program.mlir` (every piece as MLIR, plus the schedule).

use super::plan::{planner_name, render, resolve_cluster, with_dapple_reference};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use pipec::driver::{self, CompileOptions};
use pipec_compiler::ir::Module;
use pipec_compiler::passmgr::PrintIr;
use pipec_compiler::text;
use pipec_passes::loss::LossKind;
use pipec_passes::optimizer::OptimizerKind;
use pipec_passes::plan::MicroBatch;
use pipec_passes::planners;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Compile MODEL into one program per device: plan it, cut the training graph into per-stage
/// forward/backward/step ONNX pieces, insert every send/recv, split/concat, accumulation,
/// all-reduce and optimizer step, verify the schedule statically, and write OUTDIR atomically
/// (a failed compile leaves no OUTDIR). Run the result with `pipec run OUTDIR`.
#[derive(Args, Debug)]
pub struct CompileArgs {
    /// The model (`.onnx`, or textual IR `.mlir`).
    pub model: PathBuf,
    /// Cluster: preset name (`pipec plan --list-clusters`), TOML file, or `N1@BW1,N2@BW2,...`.
    #[arg(long)]
    pub cluster: String,
    /// Use only the first N devices of the cluster (the `cpu` preset takes more than this host's
    /// cores: they share them). At most 16384; the gpp planner takes at most 1024, dapple 128.
    #[arg(long)]
    pub devices: Option<usize>,
    /// Planner: gpp, dapple, pipedream, bapipe, dp, straight, gpp-seq.
    #[arg(long, required_unless_present = "stages", conflicts_with = "stages")]
    pub planner: Option<String>,
    /// With `--planner dapple`: `hpgo` plans with DAPPLE's published planner reproduced
    /// (see `pipec plan --help`).
    #[arg(long = "dapple-reference", value_name = "IMPL")]
    pub dapple_reference: Option<String>,
    /// Compile stages you write instead of a planner's: stages separated by `;`, each
    /// `ITEMS[@R]` (R replicas on the next R devices, default 1), ITEMS comma-separated node
    /// ranges `A..B` (positions in the model's node order, half-open; `A..` to the end), node
    /// names, or `FIRST..=LAST` names. Example: `--stages '0..40@2;40..'`.
    #[arg(long, value_name = "SPEC")]
    pub stages: Option<String>,
    /// Global mini-batch (samples per step).
    #[arg(long)]
    pub batch: u64,
    /// Micro-batch size (divides --batch into at most 4096 micro-batches; each stage's replicas
    /// split it evenly, or take whole micro-batches in turn when it does not divide over them)
    /// (default: the planner's choice).
    #[arg(long = "micro-batch")]
    pub micro_batch: Option<u64>,
    /// Schedule: gpipe, 1f1b, dapple-a, dapple-b, 1f1b-so, gpp, gpipe-recompute, 1f1b-recompute,
    /// 1f1b-rr, kfkb-K (GraphPipe's kFkB: K forwards then K backwards after the warm-up),
    /// gpp-per-stage, zb-h1 (zero bubble: each backward split into input-gradient and
    /// weight-gradient pieces, the latter run later), zb-h2 (zb-h1 with a longer warm-up: on
    /// balanced stages none idles between its first forward and the flush; up to twice the
    /// activations) pipedream-async
    /// (PipeDream's asynchronous 1F1B: each micro-batch's gradients update the weights right
    /// after its backward, no flush, weight stashing keeps the version its forward read; needs
    /// each stage's replica count to divide the micro-batch; `run --check` compares with an
    /// emulation of that update rule), interleaved-V (Megatron-LM's interleaved 1F1B: each
    /// device group runs V model chunks in one order, switching between them; `interleaved` lets
    /// the planner pick V or ZB-V, or keep 1F1B), zbv (zero-bubble V: two chunks per device group, down
    /// the groups and back up, backwards split as zb-h1; 1F1B's activation memory)
    /// (default: the planner's own).
    #[arg(long)]
    pub schedule: Option<String>,
    /// Loss on the first output: mean-square, sum, cross-entropy:LABEL_INPUT.
    #[arg(long, default_value = "mean-square")]
    pub loss: String,
    /// Optimizer: sgd:lr=0.01[,momentum=0.9][,weight_decay=0] or adam:lr=0.001[,beta1=..].
    #[arg(long, default_value = "sgd:lr=0.01")]
    pub optimizer: String,
    /// Stop the planner's search after SECONDS and compile the best plan found by then (as
    /// `pipec plan --time-limit`; plan.json then says `"time_limited": true`).
    #[arg(
        long = "time-limit",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub time_limit: Option<f64>,
    /// Device kind for an inline `N@BW` cluster (default V100-16GB).
    #[arg(long = "device-kind")]
    pub device_kind: Option<String>,
    /// Write the IR after every step as DIR/NN-name.mlir (the imported module, BaPipe's
    /// rewritten one, the partition, each stage's training module, every piece).
    #[arg(long = "dump-ir", value_name = "DIR")]
    pub dump_ir: Option<PathBuf>,
    /// Print the IR each step makes to stderr, after every step (steps: import, plan, partition,
    /// stage-pieces, reference, insert-comm, verify-program).
    #[arg(long)]
    pub print_ir_after_all: bool,
    /// Print the IR the named step makes to stderr (repeatable).
    #[arg(long, value_name = "STEP")]
    pub print_ir_after: Vec<String>,
    /// Print each step's wall time and statistics to stderr.
    #[arg(long)]
    pub timing: bool,
    /// Output directory (written atomically).
    #[arg(short = 'o', long = "output", value_name = "OUTDIR")]
    pub output: PathBuf,
    /// Print the plan summary.
    #[arg(long)]
    pub verbose: bool,
    #[arg(long = "dim", value_name = "NAME=VALUE", help = super::DIM_HELP)]
    pub dims: Vec<String>,
    /// Plan with a measured profile of MODEL (`pipec profile -o prof.json`) instead of the
    /// analytic cost model.
    #[arg(long, value_name = "prof.json")]
    pub profile: Option<PathBuf>,
    /// With `--schedule pipedream-async`: PipeDream's vertical sync (§3.4): every stage's
    /// computes of a micro-batch read the weight version the input stage's forward of it read
    /// (older versions are stashed for it), instead of each stage's newest at its forward.
    #[arg(long = "vertical-sync")]
    pub vertical_sync: bool,
}

/// Run `pipec compile`: check the flags, run [`driver::pipeline`] on the pass manager (its IR
/// printing writes `--dump-ir`), write OUTDIR, print a summary.
pub fn run(a: CompileArgs) -> Result<ExitCode> {
    let loss: LossKind = a.loss.parse().map_err(|e| anyhow!("--loss: {e}"))?;
    let limit = super::plan::time_limit(a.time_limit)?;
    let optimizer: OptimizerKind = a
        .optimizer
        .parse()
        .map_err(|e| anyhow!("--optimizer: {e}"))?;
    if a.batch == 0 {
        bail!("--batch 0: must be >= 1");
    }
    let micro_batch = a
        .micro_batch
        .map(|mb| MicroBatch::new(a.batch, mb))
        .transpose()?;
    let planner_name = with_dapple_reference(
        planner_name(a.planner.as_deref(), a.stages.as_deref())?,
        a.dapple_reference.as_deref(),
    )?;
    let schedule = super::plan::parse_schedule(a.schedule.as_deref(), &planner_name)?;
    if a.vertical_sync && !schedule.is_some_and(|k| k.per_micro_batch_step()) {
        bail!("--vertical-sync: only with --schedule pipedream-async (it chooses which weight version each stage reads under asynchronous updates)");
    }
    planners::by_name(&planner_name)?; // an unknown name fails before any work
    let cluster = resolve_cluster(&a.cluster, a.device_kind.as_deref(), a.devices)?;
    let spin = super::progress::spinner(format!("importing {}", a.model.display()));
    let dims = super::parse_dims(&a.dims)?;
    let mut opts = CompileOptions::new(&planner_name, cluster, a.batch);
    opts.micro_batch = micro_batch;
    opts.schedule = schedule;
    opts.vertical_sync = a.vertical_sync;
    opts.loss = loss;
    opts.optimizer = optimizer;
    opts.optimizer_spec = a.optimizer.clone();
    opts.time_limit = limit;
    opts.dims = dims;
    opts.profile = a.profile.clone();
    opts.keep_ir = a.dump_ir.is_some();
    let progress = |msg: &str| spin.set_message(msg.to_string());
    let steps: Vec<&str> = driver::pipeline().iter().map(|p| p.name()).collect();
    for name in &a.print_ir_after {
        if !steps.contains(&name.as_str()) {
            bail!(
                "--print-ir-after {name}: no such step (steps: {})",
                steps.join(", ")
            );
        }
    }
    // `--dump-ir` and `--print-ir-after*` are the pass manager's IR printing: every module a
    // step made, after the step.
    let print_ir = if a.dump_ir.is_some() || a.print_ir_after_all {
        PrintIr::AfterAll
    } else if !a.print_ir_after.is_empty() {
        PrintIr::After(a.print_ir_after.clone())
    } else {
        PrintIr::Never
    };
    // `--dump-ir` files are written once the compile succeeded (a failed compile leaves none).
    let mut dumps: Vec<(String, String)> = Vec::new();
    let mut print = |step: &str, label: &str, m: &Module| {
        if a.dump_ir.is_some() {
            dumps.push((label.to_string(), text::print(m)));
        }
        if a.print_ir_after_all || a.print_ir_after.iter().any(|n| n == step) {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "// -----// IR Dump After {step} ({label}) //----- //");
            let _ = err.write_all(text::print(m).as_bytes());
        }
    };
    let t0 = std::time::Instant::now();
    let (st, records) = driver::run_pipeline(&a.model, &opts, &progress, print_ir, &mut print)?;
    if let Some(dir) = &a.dump_ir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create", dir.display()))?;
        for (n, (label, text)) in dumps.iter().enumerate() {
            let p = dir.join(format!("{n:02}-{label}.mlir"));
            std::fs::write(&p, text).with_context(|| format!("{}: cannot write", p.display()))?;
        }
    }
    if let Some(plan) = st.plan() {
        super::plan::warn_time_limited(plan, a.time_limit);
    }
    let name = st.name();
    let art = st.into_artifact()?;
    spin.set_message(format!("writing {}", a.output.display()));
    art.write(&a.output)?;
    drop(spin);
    if a.timing {
        super::opt::print_timing(&records, None, t0.elapsed());
    }
    if a.verbose {
        eprint!("{}", render(&art.plan));
    }
    let per_stage: Option<Vec<u64>> = art.plan.stages.iter().map(|s| s.micro_batch).collect();
    let sizes = match per_stage {
        Some(p) => format!(
            " (per stage: {})",
            p.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
        ),
        None => String::new(),
    };
    let program = &art.compiled.program;
    println!(
        "compiled {} for {} devices ({} stages, {} micro-batches of {}{sizes}, schedule {}) into {}",
        name,
        program.devices.len(),
        program.stages.len(),
        program.micro_batches,
        program.micro_batch,
        program.schedule,
        a.output.display()
    );
    Ok(ExitCode::SUCCESS)
}
