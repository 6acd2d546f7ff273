//! `pipec simulate OUTDIR [--cluster C] [--device-kind K] [--trace TRACE.json] [--json]` (cli.md):
//! replay the compiled schedule (`OUTDIR/schedule.json`) on the cost model
//! (`pipec_passes::sim::replay`) and print iteration time, bubble fraction, and per-device busy
//! time and peak memory.

use super::plan::resolve_cluster;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use pipec::artifact::OutDir;
use pipec_compiler::program::Program;
use pipec_passes::cost::AllReduceAlgo;
use pipec_passes::sim::replay::{self, ReplayResult};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// Replay a compiled program on the cost model.
///
/// Reads OUTDIR/schedule.json (written by `pipec compile`) and times every instruction of every
/// device: compute and optimizer-step pieces by the analytic roofline model of their ONNX files,
/// sends and receives by the α-β link model (sends never block the compute stream), all-reduces
/// as collectives that start when the whole group arrives. Prints the iteration time, the bubble
/// fraction (idle share of the compute streams) and, per device, busy time and an estimate of
/// peak memory (parameters + gradients + optimizer state + live micro-batch buffers). The
/// planner's own estimate from OUTDIR/plan.json is printed alongside for comparison.
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Output directory of `pipec compile`.
    pub outdir: PathBuf,
    /// Cluster to replay on (default: the one recorded in OUTDIR/cluster.json): preset name,
    /// TOML file, or `N1@BW1,N2@BW2,...`.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Device kind for an inline `N@BW` cluster given with --cluster (default V100-16GB).
    /// Without --cluster and --device-kind the replay uses the cluster compile recorded in
    /// OUTDIR/cluster.json (device kinds included); OUTDIRs from before that file existed
    /// fall back to the `cluster` of plan.json with this kind.
    #[arg(long = "device-kind")]
    pub device_kind: Option<String>,
    /// Write a Chrome/Perfetto trace (one track per device) to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Print a JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Run `pipec simulate`.
pub fn run(a: SimulateArgs) -> Result<ExitCode> {
    let od = OutDir::open(&a.outdir)?;
    let (dir, program) = (&od.dir, &od.program);
    let plan_path = od.plan_path();
    let plan = od.plan_raw.as_ref();
    let spec = match (&a.cluster, plan) {
        (Some(c), _) => c.clone(),
        (None, Some(p)) => p
            .get("cluster")
            .and_then(|c| c.as_str())
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .or_else(|| od.cluster.as_ref().map(|c| c.name.clone()))
            .ok_or_else(|| {
                anyhow!(
                    "{}: no `cluster` field; pass --cluster",
                    plan_path.display()
                )
            })?,
        (None, None) => match &od.cluster {
            Some(c) => c.name.clone(),
            None => bail!(
                "{}: missing or not JSON; pass --cluster",
                plan_path.display()
            ),
        },
    };
    let cluster = match (&a.cluster, &od.cluster, &a.device_kind) {
        // The cluster compile planned for, exactly (device kinds, `--profile`'s measurements).
        (None, Some(recorded), None) => recorded.clone(),
        // The program's devices are the first N of the cluster (the `cpu` preset may have been
        // oversubscribed with `--devices N` at compile time).
        _ => resolve_cluster(&spec, a.device_kind.as_deref(), Some(program.devices.len()))
            .with_context(|| format!("cannot resolve the cluster '{spec}' (pass --cluster)"))?,
    };
    let res = replay::replay(program, dir, &cluster, AllReduceAlgo::Auto)?;
    let planned = plan
        .as_ref()
        .and_then(|p| p.get("iteration_time_s"))
        .and_then(|v| v.as_f64());
    if let Some(path) = &a.trace {
        let text = serde_json::to_string(&replay::chrome_trace(&res))?;
        std::fs::write(path, text).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    if a.json {
        let v = json!({
            "iteration_time_s": res.iteration_time_s,
            "bubble_fraction": res.bubble_fraction,
            "planned_iteration_time_s": planned,
            "cluster": spec,
            "devices": res.devices.iter().map(|d| json!({
                "device": d.device,
                "stage": d.stage,
                "busy_s": d.busy_s,
                "allreduce_s": d.allreduce_s,
                "peak_memory_bytes": d.peak_memory_bytes.round() as u64,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(program, &spec, &res, planned));
    }
    Ok(ExitCode::SUCCESS)
}

fn render(p: &Program, cluster: &str, r: &ReplayResult, planned: Option<f64>) -> String {
    let mut s = format!(
        "simulate {} ({} planner, {} schedule) on {cluster}: {} devices, batch {}, {} micro-batches of {}\n",
        p.model,
        p.planner,
        p.schedule,
        p.devices.len(),
        p.batch,
        p.micro_batches,
        p.micro_batch
    );
    for d in &r.devices {
        s.push_str(&format!(
            "  device {:>2} (stage {:>2}): busy {:.6} s, all-reduce {:.6} s, peak memory {:.3} MB\n",
            d.device,
            d.stage,
            d.busy_s,
            d.allreduce_s,
            d.peak_memory_bytes / 1e6
        ));
    }
    s.push_str(&format!(
        "iteration {:.6} s (replayed), bubble {:.1}%",
        r.iteration_time_s,
        r.bubble_fraction * 100.0
    ));
    if let Some(t) = planned {
        s.push_str(&format!(
            "; planner estimate {t:.6} s (ratio replayed/planned {:.3})",
            if t > 0.0 {
                r.iteration_time_s / t
            } else {
                f64::NAN
            }
        ));
    }
    s.push('\n');
    s
}
