//! `pipec profile MODEL [--batch b] [--repeat N] [--warmup N] -o prof.json` (issue 4): the
//! command's flags and printing; the engine (method and output format) is
//! [`pipec::profile`].

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use pipec::profile::{self, ProfileOptions};
use pipec_passes::cost::cluster::device_kind_by_name;
use pipec_passes::cost::measured::{self, error_report, error_rows, MeasuredProfile};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Time every op of MODEL, forward and backward, on the CPU executor; write a measured profile.
///
/// The model is differentiated (mean-square loss) and run on the reference interpreter with
/// random inputs at --batch; each op is timed, the median over --repeat runs taken, and backward
/// ops attributed to the forward node they differentiate. The profile (-o) lists every node of
/// the model's cost graph with fwd_s, bwd_s (seconds at the profiled batch), output_bytes and
/// parameter_bytes; `pipec plan --profile prof.json` plans with these times instead of the
/// analytic model (scaled linearly from the profiled batch). --compare-analytic prints the
/// analytic-vs-measured error distribution; --calibrate measures the machine's FLOP/s and memory
/// bandwidth.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// The model (`.onnx` or `.mlir`).
    pub model: Option<PathBuf>,
    /// Samples per run (the leading dim of the first graph input; default: its static size, else 1).
    #[arg(long)]
    pub batch: Option<u64>,
    /// Timed runs; each op's time is the median over them.
    #[arg(long, default_value_t = 5)]
    pub repeat: u32,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Executor backend (only `reference` can time single ops).
    #[arg(long, default_value = "reference")]
    pub executor: String,
    /// Write the profile (JSON) here.
    #[arg(short = 'o', long = "output", value_name = "PROF.json")]
    pub output: Option<PathBuf>,
    /// Print the analytic-vs-measured error table (median, p10/p90 of |ln(analytic/measured)|,
    /// per op type, worst ops) to stdout.
    #[arg(long = "compare-analytic")]
    pub compare_analytic: bool,
    /// With --compare-analytic: take the measurements from this profile instead of running.
    #[arg(long, value_name = "PROF.json")]
    pub from: Option<PathBuf>,
    /// Device kind of the analytic side of --compare-analytic.
    #[arg(long = "device-kind", default_value = "cpu-core")]
    pub device_kind: String,
    /// How many worst ops --compare-analytic lists.
    #[arg(long, default_value_t = 10)]
    pub worst: usize,
    /// Measure this machine's effective f32 FLOP/s (a MatMul) and memory bandwidth (an Add over
    /// large arrays) on the reference executor and print them; MODEL is not needed.
    #[arg(long)]
    pub calibrate: bool,
}

/// Run `pipec profile`.
pub fn run(a: ProfileArgs) -> Result<ExitCode> {
    if a.calibrate {
        print!("{}", profile::calibrate(a.repeat.max(1))?);
        return Ok(ExitCode::SUCCESS);
    }
    let model = a
        .model
        .as_deref()
        .ok_or_else(|| anyhow!("MODEL: missing (an .onnx or .mlir file)"))?;
    if !model.exists() {
        bail!("{}: no such file", model.display());
    }
    if a.output.is_none() && !a.compare_analytic {
        bail!("-o PROF.json: missing (or --compare-analytic)");
    }
    if a.from.is_some() && !a.compare_analytic {
        bail!("--from: only with --compare-analytic");
    }
    if a.repeat == 0 {
        bail!("--repeat 0: must be >= 1");
    }
    let (m, g) = profile::load(model)?;
    let name = model.display().to_string();
    let prof = match &a.from {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("{}: cannot read", p.display()))?;
            let prof = MeasuredProfile::parse(&text, &p.display().to_string())?;
            // The same check `--profile` makes.
            let mut check = g.clone();
            measured::apply(&mut check, &prof, &p.display().to_string())?;
            prof
        }
        None => {
            if a.executor != "reference" {
                bail!(
                    "--executor {}: only the reference executor can time single ops",
                    a.executor
                );
            }
            let opts = ProfileOptions {
                batch: a.batch,
                repeat: a.repeat,
                warmup: a.warmup,
                seed: a.seed,
                executor: a.executor.clone(),
            };
            let mut bar = None;
            profile::measure(&m, &g, &name, &opts, &mut |p| {
                if p.done == p.total {
                    bar = None;
                    return;
                }
                bar.get_or_insert_with(|| {
                    super::progress::bar(
                        u64::from(p.total),
                        format!("profile {} (batch {})", model_label(&name), p.batch),
                        "runs",
                    )
                })
                .set_position(u64::from(p.done));
            })?
        }
    };
    if let Some(out) = &a.output {
        if a.from.is_none() {
            let text = serde_json::to_string_pretty(&prof)? + "\n";
            super::write_atomic(out, text.as_bytes())?;
        }
    }
    if a.compare_analytic {
        let kind = device_kind_by_name(&a.device_kind).ok_or_else(|| {
            anyhow!(
                "--device-kind {}: unknown device kind (V100-16GB, TitanX-12GB, H100-80GB, cpu-core)",
                a.device_kind
            )
        })?;
        let rows = error_rows(&g, &prof, &kind);
        println!(
            "analytic ({}: {:.3e} FLOP/s f32, {:.3e} B/s) vs measured ({}, batch {}, median of {}) for {}",
            kind.name,
            kind.peak(pipec_passes::cost::Precision::F32),
            kind.memory_bandwidth,
            prof.executor,
            prof.batch,
            prof.repeat,
            prof.model
        );
        println!(
            "totals: measured fwd {:.4e} s, bwd {:.4e} s (loss {:.2e} s, unattributed {:.2e} s; \
             whole run {:.4e} s, op kernels {:.4e} s)",
            prof.total_fwd_s,
            prof.total_bwd_s,
            prof.loss_s,
            prof.unattributed_s,
            prof.run_s,
            prof.kernel_s
        );
        print!("{}", error_report(&rows, a.worst));
    }
    Ok(ExitCode::SUCCESS)
}

fn model_label(name: &str) -> String {
    Path::new(name)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| name.to_string())
}
