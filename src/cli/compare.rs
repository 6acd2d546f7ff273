//! `pipec compare MODEL --cluster C [--devices N] [--batch B] [--best-schedule] [--json]`
//! (cli.md): run every
//! registered planner on the same model and cluster and print one row each (planner, stages,
//! depth, replicas per stage, simulated iteration time, speed-up over `dp`, peak memory, search
//! time). A planner that fails prints its error in its row; the command still succeeds. `--json`
//! prints a list of `plan --json` objects (failed planners are left out).

use super::plan::{apply_measured_profile, is_profile_path, load_cost_graph, resolve_cluster};
use anyhow::{anyhow, bail, Result};
use clap::Args;
use pipec::driver::CompareRow;
use pipec_passes::cost::Optimizer;
use pipec_passes::plan::{PlanOptions, PlanReport};
use pipec_passes::planners;
use std::path::PathBuf;
use std::process::ExitCode;

/// Run every planner on the same model and cluster and compare their plans.
///
/// MODEL is an ONNX file or a PipeDream `graph.txt` profile (`.txt`). C is a preset, a TOML file,
/// or an inline hierarchy `N1@BW1,N2@BW2`.
#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The model: `.onnx`, or a `graph.txt` profile (`.txt`).
    pub model: Option<PathBuf>,
    /// Cluster: preset name, TOML file, or `N1@BW1,N2@BW2,...`.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Use only the first N devices of the cluster.
    #[arg(long)]
    pub devices: Option<usize>,
    /// Global mini-batch size (default: the profile batch, else the model's batch dim, else 1).
    #[arg(long)]
    pub batch: Option<u64>,
    /// For a graph.txt profile: the batch it was measured at (default: `pbs-N` in the file
    /// name, else 1).
    #[arg(long = "profile-batch")]
    pub profile_batch: Option<u64>,
    /// Device kind for an inline `N@BW` cluster (default V100-16GB).
    #[arg(long = "device-kind")]
    pub device_kind: Option<String>,
    /// Optimizer for the memory model and the step time: sgd, sgd:momentum=0.9, adam.
    #[arg(long, default_value = "sgd")]
    pub optimizer: String,
    /// Stop each planner's search after SECONDS and take its best plan found by then (as
    /// `pipec plan --time-limit`).
    #[arg(
        long = "time-limit",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub time_limit: Option<f64>,
    #[arg(long = "dim", value_name = "NAME=VALUE", help = super::DIM_HELP)]
    pub dims: Vec<String>,
    /// Print a JSON list of `plan --json` objects.
    #[arg(long)]
    pub json: bool,
    /// Give every planner's stages their best synchronous schedule (1f1b, gpipe, dapple-b,
    /// 1f1b-so, kfkb-2, the re-computing and the zero-bubble kinds): the fastest the simulator
    /// finds that fits in memory. The schedule column then names the planner's own choice where
    /// another one won (`zb-h1 (own 1f1b)`; `own_schedule` in `--json`); the training is the
    /// same under each.
    #[arg(long = "best-schedule")]
    pub best_schedule: bool,
    /// A measured profile of MODEL (`pipec profile -o prof.json`): plan with its seconds
    /// instead of the analytic model.
    #[arg(long, value_name = "PROF.json")]
    pub profile: Option<PathBuf>,
}

/// Render the comparison table.
fn table(rows: &[CompareRow]) -> String {
    let dp_time = rows
        .iter()
        .find(|r| r.planner == "dp")
        .and_then(|r| r.result.as_ref().ok())
        .map(|p| p.iteration_time_s);
    let mut s = format!(
        "{:<10} {:>6} {:>5} {:<24} {:>12} {:>9} {:>10} {:>10}  {}\n",
        "planner",
        "stages",
        "depth",
        "replicas",
        "iter (s)",
        "vs dp",
        "peak GB",
        "search ms",
        "schedule"
    );
    for r in rows {
        match &r.result {
            Ok(p) => {
                let reps: Vec<String> = p.stages.iter().map(|s| s.replicas.to_string()).collect();
                let mut reps = reps.join(":");
                if reps.len() > 24 {
                    reps.truncate(21);
                    reps.push_str("...");
                }
                let speedup = match dp_time {
                    Some(t) if p.iteration_time_s > 0.0 => {
                        format!("{:.2}x", t / p.iteration_time_s)
                    }
                    _ => "-".into(),
                };
                s.push_str(&format!(
                    "{:<10} {:>6} {:>5} {:<24} {:>12.6} {:>9} {:>10.2} {:>10.3}  {}{}{}\n",
                    r.planner,
                    p.stages.len(),
                    p.pipeline_depth,
                    reps,
                    p.iteration_time_s,
                    speedup,
                    p.peak_memory_bytes as f64 / 1e9,
                    p.search_time_s * 1e3,
                    p.schedule.label(),
                    r.own_schedule
                        .map(|k| format!(" (own {})", k.label()))
                        .unwrap_or_default(),
                    if p.out_of_memory {
                        "  (out of memory)"
                    } else {
                        ""
                    }
                ));
            }
            Err(e) => s.push_str(&format!("{:<10} error: {e}\n", r.planner)),
        }
    }
    s
}

/// Run `pipec compare`.
pub fn run(a: CompareArgs) -> Result<ExitCode> {
    let model = a
        .model
        .as_deref()
        .ok_or_else(|| anyhow!("MODEL: missing (an .onnx file or a graph.txt profile)"))?;
    let spec = a
        .cluster
        .as_deref()
        .ok_or_else(|| anyhow!("--cluster: missing (a preset, a TOML file or N@BW,...)"))?;
    let mut cluster = resolve_cluster(spec, a.device_kind.as_deref(), a.devices)?;
    let dims = super::parse_dims(&a.dims)?;
    let (mut g, ref_batch) = load_cost_graph(model, a.profile_batch, &dims)?;
    if let Some(p) = &a.profile {
        apply_measured_profile(&mut g, &mut cluster, model, p)?;
    }
    let batch = match a.batch {
        Some(0) => bail!("--batch 0: must be >= 1"),
        Some(b) => b,
        None => ref_batch.max(1),
    };
    let mut opts = PlanOptions::new(batch);
    opts.optimizer = Optimizer::parse(&a.optimizer)?;
    let limit = super::plan::time_limit(a.time_limit)?;
    // The same plans `pipec plan` makes: BaPipe emits its intra-layer splits on an ONNX model
    // costed analytically.
    let module = if a.profile.is_none() && !is_profile_path(model) {
        Some(super::load_module_dims(model, &dims)?)
    } else {
        None
    };
    let bar = super::progress::bar(
        planners::PLANNER_NAMES.len() as u64,
        format!("compare on {} devices", cluster.len()),
        "planners",
    );
    let started = std::cell::Cell::new(false);
    let each = |name: &str| {
        if started.replace(true) {
            bar.inc(1);
        }
        bar.set_message(format!("compare on {} devices: {name}", cluster.len()));
    };
    let rows = pipec::driver::compare(
        module.as_ref(),
        &g,
        &cluster,
        &opts,
        limit,
        a.best_schedule,
        &each,
    );
    drop(bar);
    if a.json {
        // With --best-schedule, a plan whose schedule another replaced also names its
        // planner's own (`own_schedule`, after the plan's fields).
        #[derive(serde::Serialize)]
        struct JsonRow<'a> {
            #[serde(flatten)]
            plan: &'a PlanReport,
            #[serde(skip_serializing_if = "Option::is_none")]
            own_schedule: Option<String>,
        }
        let plans: Vec<JsonRow> = rows
            .iter()
            .filter_map(|r| {
                let plan = r.result.as_ref().ok()?;
                Some(JsonRow {
                    plan,
                    own_schedule: r.own_schedule.map(|k| k.label()),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&plans)?);
    } else {
        println!(
            "compare: {} on {} ({} devices), batch {}",
            model.display(),
            cluster.name,
            cluster.len(),
            batch
        );
        print!("{}", table(&rows));
    }
    Ok(ExitCode::SUCCESS)
}
