//! `pipec compile MODEL --cluster C --planner P --batch B --micro-batch b [--loss KIND]
//! [--optimizer SPEC] [--dump-ir DIR] -o OUTDIR` (cli.md): plan, build the per-stage pieces,
//! insert communication, verify the schedule, and write OUTDIR atomically.
//!
//! OUTDIR (byte-identical for identical inputs): `plan.json` (as `plan --json`, less the measured
//! `search_time_s`), `schedule.json` (the program, see
//! `pipec_compiler::program`), `weights.npz` (initial parameters), `stages/s{i}.{fwd,bwd,step}.onnx`,
//! `reference/{train,step}.onnx` (the unpartitioned program `pipec run --check` compares with),
//! `program.mlir` (every piece as MLIR, plus the schedule).

use super::plan::{
    plan_label, plan_model, planner_name, planning_graph, render, resolve_cluster,
    with_dapple_reference,
};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use pipec_compiler::program::Program;
use pipec_passes::codegen::{self, CompileOptions};
use pipec_passes::cost::Optimizer as MemOptimizer;
use pipec_passes::loss::LossKind;
use pipec_passes::optimizer::OptimizerKind;
use pipec_passes::plan::PlanOptions;
use pipec_passes::planners;
use std::path::{Path, PathBuf};
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
    /// 1f1b-rr, kfkb-K (GraphPipe's kFkB: K forwards then K backwards after the warm-up)
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
    /// Write the IR after every step as DIR/NN-name.mlir.
    #[arg(long = "dump-ir", value_name = "DIR")]
    pub dump_ir: Option<PathBuf>,
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
}

/// Run `pipec compile`.
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
    if let Some(mb) = a.micro_batch {
        pipec_passes::plan::check_micro_batch(a.batch, mb)?;
    }
    let planner_name = with_dapple_reference(
        planner_name(a.planner.as_deref(), a.stages.as_deref())?,
        a.dapple_reference.as_deref(),
    )?;
    let label = plan_label(&planner_name);
    let schedule = super::plan::parse_schedule(a.schedule.as_deref(), &planner_name)?;
    planners::by_name(&planner_name)?; // an unknown name fails before any work
    let mut cluster = resolve_cluster(&a.cluster, a.device_kind.as_deref(), a.devices)?;
    let spin = super::progress::spinner(format!("importing {}", a.model.display()));
    let dims = super::parse_dims(&a.dims)?;
    let m = super::load_module_dims(&a.model, &dims)?;
    let name = a.model.display().to_string();
    let mut g = planning_graph(&m, &name)?;
    if let Some(p) = &a.profile {
        super::plan::apply_measured_profile(&mut g, &mut cluster, &a.model, p)?;
    }
    let mut opts = PlanOptions::new(a.batch);
    opts.micro_batch = a.micro_batch;
    opts.schedule = schedule;
    opts.optimizer = match &optimizer {
        OptimizerKind::Adam { .. } => MemOptimizer::Adam,
        OptimizerKind::Sgd { momentum, .. } if *momentum > 0.0 => MemOptimizer::Momentum,
        OptimizerKind::Sgd { .. } => MemOptimizer::Sgd,
    };
    // BaPipe's intra-layer splits rewrite the module (not with a measured profile: its
    // seconds are per original node).
    let with_module = a.profile.is_none().then_some(&m);
    spin.set_message(format!(
        "planning with {} on {} devices",
        label,
        cluster.len()
    ));
    opts.deadline = super::plan::deadline(limit);
    let (plan, g, rewritten) = plan_model(&planner_name, with_module, g, &cluster, &opts)
        .with_context(|| format!("{name}: planner '{label}' failed"))?;
    super::plan::warn_time_limited(&plan, a.time_limit);
    let imported = &m;
    let m = rewritten.as_ref().unwrap_or(&m);
    plan.verify(&g, &cluster)
        .with_context(|| format!("planner '{label}' produced an invalid plan"))?;
    let specs = plan.specs(&g)?;
    let kind = plan.schedule;
    let copts = CompileOptions {
        model_name: a
            .model
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        planner: plan.planner.clone(),
        batch: a.batch,
        micro_batch: plan.micro_batch,
        schedule: kind,
        loss,
        optimizer,
        optimizer_spec: a.optimizer.clone(),
        per_stage: per_stage_of(&plan),
    };
    spin.set_message(format!("compiling {} stages", specs.len()));
    let compiled =
        codegen::compile(m, &specs, &copts).with_context(|| format!("{name}: compile failed"))?;
    if let Some(dir) = &a.dump_ir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{}: cannot create", dir.display()))?;
        let mut n = 0;
        let mut dump = |label: &str, md: &pipec_compiler::ir::Module| -> Result<()> {
            let p = dir.join(format!("{n:02}-{label}.mlir"));
            n += 1;
            std::fs::write(&p, pipec_compiler::text::print(md))
                .with_context(|| format!("{}: cannot write", p.display()))
        };
        dump("import", imported)?;
        if !plan.intra_splits.is_empty() {
            dump("split-layer", m)?;
        }
        for (label, md) in &compiled.dumps {
            dump(label, md)?;
        }
        for (file, md) in &compiled.modules {
            let label = file.trim_end_matches(".onnx").replace(['/', '.'], "-");
            dump(&label, md)?;
        }
    }
    spin.set_message(format!("writing {}", a.output.display()));
    write_outdir(&a.output, &plan, &compiled)?;
    drop(spin);
    if a.verbose {
        eprint!("{}", render(&plan));
    }
    let sizes = match per_stage_of(&plan) {
        Some(p) => format!(
            " (per stage: {})",
            p.micro_batch
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    println!(
        "compiled {} for {} devices ({} stages, {} micro-batches of {}{sizes}, schedule {}) into {}",
        name,
        compiled.program.devices.len(),
        compiled.program.stages.len(),
        compiled.program.micro_batches,
        compiled.program.micro_batch,
        compiled.program.schedule,
        a.output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// A `gpp-per-stage` plan's per-stage micro-batch sizes and groups (every stage has them).
fn per_stage_of(plan: &pipec_passes::plan::Plan) -> Option<pipec_passes::sim::PerStage> {
    let micro_batch: Option<Vec<u64>> = plan.stages.iter().map(|s| s.micro_batch).collect();
    Some(pipec_passes::sim::PerStage {
        batch: plan.batch,
        base_micro_batch: plan.micro_batch,
        micro_batch: micro_batch?,
        group: plan.stages.iter().map(|s| s.group.unwrap_or(1)).collect(),
    })
}

/// The whole program as MLIR (accepted by `mlir-opt --allow-unregistered-dialect`): every piece
/// as a nested `builtin.module` named after its file (`@stages_s0_fwd`), then `module @schedule`
/// with one function per device whose body is its instruction list as generic `pipec.*` ops
/// (`"pipec.send"() {tensor = "...", peer = 1, tag = 7, mb = 0} : () -> ()`).
fn program_mlir(p: &Program, compiled: &codegen::Compiled) -> String {
    let q = |x: &str| serde_json::to_string(x).unwrap_or_default();
    let ints = |v: &[i64]| {
        let items: Vec<String> = v.iter().map(|x| format!("{x} : i64")).collect();
        format!("[{}]", items.join(", "))
    };
    let mut s = format!(
        "// pipec program: {} on {} devices, {} stages, {} micro-batches of {}, schedule {}\nmodule {{\n",
        p.model,
        p.devices.len(),
        p.stages.len(),
        p.micro_batches,
        p.micro_batch,
        p.schedule
    );
    for (file, md) in &compiled.modules {
        let sym: String = file
            .trim_end_matches(".onnx")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        s.push_str(&format!("  module @{sym} {{\n"));
        for line in pipec_compiler::text::print(md).lines() {
            s.push_str("    ");
            s.push_str(line);
            s.push('\n');
        }
        s.push_str("  }\n");
    }
    s.push_str("  module @schedule {\n");
    for d in &p.devices {
        s.push_str(&format!(
            "    func.func @device{}() attributes {{pipec.stage = {} : i64, pipec.replica = {} : i64}} {{\n",
            d.device, d.stage, d.replica
        ));
        for ins in &d.instructions {
            use pipec_compiler::program::Instr as I;
            let attrs = match ins {
                I::Load { mb, input, samples } => (
                    "load",
                    format!("mb = {mb} : i64, input = {}, samples = {}", q(input), ints(&[samples[0] as i64, samples[1] as i64])),
                ),
                I::Compute { pass, mb } => (
                    "compute",
                    format!("mb = {mb} : i64, pass = {}", q(&format!("{pass:?}").to_lowercase())),
                ),
                I::Send { mb, tensor, peer, slice, tag, dtype, shape } => (
                    "send",
                    format!(
                        "mb = {mb} : i64, tensor = {}, peer = {peer} : i64, tag = {tag} : i64, dtype = {}, shape = {}{}",
                        q(tensor),
                        q(dtype),
                        ints(shape),
                        slice.map(|sl| format!(", slice = {}", ints(&[sl.lo as i64, sl.hi as i64, sl.of as i64]))).unwrap_or_default()
                    ),
                ),
                I::Recv { mb, tensor, peer, tag, dtype, shape } => (
                    "recv",
                    format!(
                        "mb = {mb} : i64, tensor = {}, peer = {peer} : i64, tag = {tag} : i64, dtype = {}, shape = {}",
                        q(tensor),
                        q(dtype),
                        ints(shape)
                    ),
                ),
                I::Concat { mb, inputs, output } | I::Sum { mb, inputs, output } => (
                    if matches!(ins, I::Concat { .. }) { "concat" } else { "sum" },
                    format!(
                        "mb = {mb} : i64, inputs = [{}], output = {}",
                        inputs.iter().map(|x| q(x)).collect::<Vec<_>>().join(", "),
                        q(output)
                    ),
                ),
                I::Zeros { mb, output, dtype, shape } => (
                    "zeros",
                    format!(
                        "mb = {mb} : i64, output = {}, dtype = {}, shape = {}",
                        q(output),
                        q(dtype),
                        ints(shape)
                    ),
                ),
                I::Accumulate { mb, tensors } | I::Free { mb, tensors } => (
                    if matches!(ins, I::Accumulate { .. }) { "accumulate" } else { "free" },
                    format!(
                        "mb = {mb} : i64, tensors = [{}]",
                        tensors.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ")
                    ),
                ),
                I::AllReduce { group, tensors, tag } => (
                    "all_reduce",
                    format!(
                        "group = {}, tag = {tag} : i64, tensors = [{}]",
                        ints(&group.iter().map(|g| *g as i64).collect::<Vec<_>>()),
                        tensors.iter().map(|x| q(x)).collect::<Vec<_>>().join(", ")
                    ),
                ),
                I::Step => ("step", String::new()),
            };
            let body = if attrs.1.is_empty() {
                String::new()
            } else {
                format!(" {{{}}}", attrs.1)
            };
            s.push_str(&format!("      \"pipec.{}\"(){body} : () -> ()\n", attrs.0));
        }
        s.push_str("      return\n    }\n");
    }
    s.push_str("  }\n}\n");
    s
}

/// Write OUTDIR into a temporary sibling directory and rename it into place.
/// OUTDIR's `plan.json`: the plan as `plan --json` prints it, less `search_time_s`. OUTDIR
/// holds only what the inputs determine (two compiles give byte-identical files); the search
/// time is a measurement, which `pipec plan --json` reports.
fn plan_artifact(plan: &pipec_passes::plan::Plan) -> Result<String> {
    let mut v = serde_json::to_value(plan)?;
    if let Some(o) = v.as_object_mut() {
        o.remove("search_time_s");
    }
    Ok(serde_json::to_string_pretty(&v)?)
}

fn write_outdir(out: &Path, plan: &pipec_passes::plan::Plan, c: &codegen::Compiled) -> Result<()> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = out
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .ok_or_else(|| anyhow!("-o {}: not a directory name", out.display()))?;
    if !parent.exists() {
        bail!("-o {}: parent directory does not exist", out.display());
    }
    let tmp = parent.join(format!(".{base}.tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let result = (|| -> Result<()> {
        std::fs::create_dir_all(tmp.join("stages"))?;
        std::fs::create_dir_all(tmp.join("reference"))?;
        std::fs::write(tmp.join("plan.json"), plan_artifact(plan)?)?;
        std::fs::write(tmp.join("schedule.json"), c.program.to_json())?;
        pipec_runtime::npz::write_npz(&tmp.join("weights.npz"), &c.weights)
            .map_err(|e| anyhow!("weights.npz: {e}"))?;
        for (file, md) in &c.modules {
            pipec_compiler::onnx::export::save(md, &tmp.join(file))
                .with_context(|| format!("{file}: cannot export"))?;
        }
        std::fs::write(tmp.join("program.mlir"), program_mlir(&c.program, c))?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e.context(format!(
            "{}: cannot write the compiled program",
            out.display()
        )));
    }
    if out.exists() {
        std::fs::remove_dir_all(out)
            .with_context(|| format!("{}: cannot replace the existing directory", out.display()))?;
    }
    std::fs::rename(&tmp, out).with_context(|| {
        let _ = std::fs::remove_dir_all(&tmp);
        format!(
            "{}: cannot move the compiled program into place",
            out.display()
        )
    })?;
    Ok(())
}
