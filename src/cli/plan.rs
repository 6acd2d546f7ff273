//! `pipec plan MODEL --cluster C [--devices N] --planner P [--batch B] [--micro-batch b]
//! [--schedule S] [--json]` (cli.md): plan without emitting code, and report the plan with the
//! shared simulator's figures.
//!
//! MODEL is a PipeDream `graph.txt` profile (`.txt`) or an ONNX model (costed with the analytic
//! model on the cluster's first device kind). `--list-clusters` prints the presets.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use pipec_passes::cost::cluster::PRESETS;
use pipec_passes::cost::{AllReduceAlgo, Optimizer};
use pipec_passes::plan::{Plan, PlanOptions, PlanReport};
use pipec_passes::planners;
use pipec_passes::sim::ScheduleKind;
use std::path::PathBuf;
use std::process::ExitCode;

pub use pipec::driver::{
    apply_measured_profile, deadline, is_profile_path, load_cost_graph, plan_label, plan_repeated,
    resolve_cluster,
};

/// Plan a model on a cluster without emitting code, and simulate the plan.
///
/// MODEL is an ONNX file or a PipeDream `graph.txt` profile (`.txt`). C is a preset
/// (`--list-clusters`), a TOML file, or an inline hierarchy `N1@BW1,N2@BW2` (N1 devices per group
/// at BW1 bytes/s, N2 groups at BW2, ...). P is one of gpp, dapple, pipedream, bapipe, dp, straight.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The model: `.onnx`, or a `graph.txt` profile (`.txt`).
    pub model: Option<PathBuf>,
    /// Cluster: preset name, TOML file, or `N1@BW1,N2@BW2,...`.
    #[arg(long)]
    pub cluster: Option<String>,
    /// Use only the first N devices of the cluster (the `cpu` preset takes more than this host's
    /// cores: they share them). At most 16384; the gpp planner takes at most 1024, dapple 128.
    #[arg(long)]
    pub devices: Option<usize>,
    /// Planner: gpp, dapple, pipedream, bapipe, dp, straight (and gpp-seq). gpp returns the
    /// fastest of GraphPipe's graph pipelines (also on fewer devices than given) and the
    /// sequential planners' plans, so it never loses to them on this cost model.
    #[arg(long, conflicts_with = "stages")]
    pub planner: Option<String>,
    /// With `--planner dapple`: run a reference implementation instead of pipec's search.
    /// `hpgo`: DAPPLE's published planner (HPGO 0.9.1) reproduced: its candidates (data
    /// parallelism, straight pipelines, every two-way split), its constants (25 GB/s NVLink,
    /// 1/3 GB/s Ethernet), one-sample micro-batches, no memory check, and its choice; the
    /// cluster gives only the servers (its level-0 groups).
    #[arg(long = "dapple-reference", value_name = "IMPL")]
    pub dapple_reference: Option<String>,
    /// Evaluate stages you write instead of running a planner: stages separated by `;`, each
    /// `ITEMS[@R]` (R replicas on the next R devices, default 1), ITEMS comma-separated node
    /// ranges `A..B` (positions in the model's node order, half-open; `A..` to the end), node
    /// names, or `FIRST..=LAST` names. Costed and simulated like a planner's plan (the
    /// micro-batch, unless given, is the fastest one every stage's replicas divide). Example:
    /// `--stages '0..40@2;40..'`.
    #[arg(long, value_name = "SPEC")]
    pub stages: Option<String>,
    /// Global mini-batch size (default: the profile batch, else the model's batch dim, else 1).
    #[arg(long)]
    pub batch: Option<u64>,
    /// Micro-batch size (must divide the batch into at most 4096 micro-batches; default: the
    /// planner's choice).
    #[arg(long = "micro-batch")]
    pub micro_batch: Option<u64>,
    /// Schedule: gpipe, 1f1b, dapple-a, dapple-b, 1f1b-so, gpp, gpipe-recompute, 1f1b-recompute,
    /// 1f1b-rr, kfkb-K (GraphPipe's kFkB: K forwards then K backwards after the warm-up; with
    /// `--planner gpp` the DP sizes the in-flight memory for it), gpp-per-stage, zb-h1 (zero
    /// bubble: each backward split into input-gradient and weight-gradient passes, the latter
    /// filling the pipeline's idle time), zb-h2 (zb-h1 with a longer warm-up: on balanced stages
    /// none idles between its first forward and the flush; up to twice the activations)
    /// pipedream-async
    /// (PipeDream's asynchronous 1F1B: each micro-batch's gradients update the weights right
    /// after its backward, no flush, weight stashing keeps the version its forward read; needs
    /// each stage's replica count to divide the micro-batch; `run --check` compares with an
    /// emulation of that update rule), interleaved-V (Megatron-LM's interleaved 1F1B: the
    /// planner's device groups each hold V model chunks, V from 2 to 64, so the pipeline bubble
    /// shrinks V times at V times the messages; the micro-batches must be a multiple of the
    /// groups; with --stages, stage s runs on the devices of stage s mod (stages / V)),
    /// interleaved (the planner picks V among 2, 3, 4, 6, 8 or ZB-V, or keeps its 1F1B plan
    /// where interleaving is slower), zbv (zero-bubble V, Qi et al. 2024: the planner's device groups
    /// each hold two chunks, the model going down the groups and back up so that the first group
    /// holds the input and the loss; backwards split as zb-h1; on balanced chunks no device
    /// idles between its first forward and the flush, at 1F1B's activation memory and twice
    /// its messages; with --stages, stage s ≥ P runs on the devices of stage 2P − 1 − s)
    /// (default: the planner's own).
    #[arg(long)]
    pub schedule: Option<String>,
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
    /// Stop the planner's search after SECONDS and take the best plan found by then, marked
    /// `"time_limited": true` in the JSON (and in OUTDIR/plan.json): DAPPLE stops extending its
    /// partial plans and trying further micro-batch sizes, GPP leaves out its searches on fewer
    /// devices and the sequential planners' plans (its search on all devices always completes);
    /// the other planners' searches are short and always complete.
    #[arg(
        long = "time-limit",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub time_limit: Option<f64>,
    /// All-reduce algorithm: ring, hierarchical, auto.
    #[arg(long, default_value = "auto")]
    pub allreduce: String,
    #[arg(long = "dim", value_name = "NAME=VALUE", help = super::DIM_HELP)]
    pub dims: Vec<String>,
    /// Print the plan as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// List the cluster presets and exit.
    #[arg(long = "list-clusters")]
    pub list_clusters: bool,
    /// Print a preset's TOML description and exit: copy it, edit it, and pass the file to
    /// `--cluster` (the presets are these files, compiled in).
    #[arg(long = "show-cluster", value_name = "PRESET")]
    pub show_cluster: Option<String>,
    /// Write a Chrome/Perfetto trace of the simulated iteration to this file.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// A measured profile of MODEL (`pipec profile -o prof.json`): plan with its forward and
    /// backward seconds instead of the analytic model (scaled linearly from its batch).
    #[arg(long, value_name = "PROF.json")]
    pub profile: Option<PathBuf>,
    /// Benchmark the search: plan N times in this process on the model loaded once and report
    /// the fastest `search_time_s` (the first run pays cold caches and page faults). The plans
    /// must be identical (the planners are deterministic); a difference is an error.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repeat: usize,
}

/// `--time-limit SECONDS`, checked (before any slow work); the clock starts with [`deadline`].
pub fn time_limit(limit: Option<f64>) -> Result<Option<std::time::Duration>> {
    let Some(s) = limit else { return Ok(None) };
    if !(0.0..=1e9).contains(&s) {
        bail!("--time-limit {s}: must be a number of seconds >= 0");
    }
    Ok(Some(std::time::Duration::from_secs_f64(s)))
}

/// Say on stderr that `plan` is the best found by `--time-limit`, not the planner's optimum.
pub fn warn_time_limited(plan: &Plan, limit: Option<f64>) {
    if plan.search_capped {
        eprintln!(
            "note: planner '{}' bounded its search (past {} transitions it extends the {} best \
             states of each cut; plan.json says \"search_capped\": true)",
            plan.planner,
            pipec_passes::planners::dapple::TRANSITION_BUDGET,
            pipec_passes::planners::dapple::BEAM
        );
    }
    if plan.time_limited {
        eprintln!(
            "warning: --time-limit {} s reached: planner '{}' returns the best plan found by then",
            limit.unwrap_or(0.0),
            plan.planner
        );
    }
}

/// `--planner P` or `--stages SPEC` as the name [`pipec::driver::plan_model`] takes (`stages:SPEC` for the
/// user's stages).
pub fn planner_name(planner: Option<&str>, stages: Option<&str>) -> Result<String> {
    match (stages, planner) {
        (Some(s), _) => Ok(format!("{}{s}", planners::STAGES_PREFIX)),
        (None, Some(p)) => Ok(p.to_string()),
        (None, None) => bail!(
            "--planner: missing (one of {}; or --stages SPEC)",
            planners::PLANNER_NAMES.join(", ")
        ),
    }
}

/// `--dapple-reference R` applied to the planner name: `hpgo` with `--planner dapple` is the
/// internal planner [`planners::DAPPLE_HPGO`]; anything else is a usage error naming the flag.
pub fn with_dapple_reference(name: String, reference: Option<&str>) -> Result<String> {
    match reference {
        None => Ok(name),
        Some("hpgo") if name == "dapple" => Ok(planners::DAPPLE_HPGO.to_string()),
        Some("hpgo") => bail!(
            "--dapple-reference hpgo: only with --planner dapple (got '{}')",
            plan_label(&name)
        ),
        Some(r) => bail!("--dapple-reference {r}: unknown reference (one of: hpgo)"),
    }
}

fn parse_allreduce(s: &str) -> Result<AllReduceAlgo> {
    Ok(match s {
        "ring" => AllReduceAlgo::Ring,
        "hierarchical" => AllReduceAlgo::Hierarchical,
        "auto" => AllReduceAlgo::Auto,
        _ => bail!("--allreduce {s}: one of ring, hierarchical, auto"),
    })
}

/// The list printed by `--list-clusters`.
pub fn list_clusters() -> String {
    let mut out = String::new();
    for p in PRESETS {
        let c = p.build();
        out.push_str(&format!(
            "{:<12} {:>3} devices  {}\n",
            p.name,
            c.len(),
            p.summary()
        ));
    }
    out
}

fn gb(b: f64) -> String {
    format!("{:.2} GB", b / 1e9)
}

/// Text rendering of a plan.
pub fn render(plan: &PlanReport) -> String {
    let per_stage = if plan.stages.iter().any(|s| s.micro_batch.is_some()) {
        " (per-stage micro-batch sizes below)"
    } else {
        ""
    };
    let mut s = format!(
        "plan: {} on {} ({} devices), batch {} = {} x {}{per_stage}, schedule {}\n",
        plan.planner,
        plan.cluster,
        plan.devices,
        plan.batch,
        plan.micro_batches,
        plan.micro_batch,
        plan.schedule
    );
    for st in &plan.stages {
        let span = match (st.nodes.first(), st.nodes.last()) {
            (Some(a), Some(b)) if st.nodes.len() > 1 => format!("{a} .. {b}"),
            (Some(a), _) => a.clone(),
            _ => String::new(),
        };
        // gpp-per-stage: the stage's own micro-batch size and k of its kFkB order.
        let own = match (st.micro_batch, st.group) {
            (Some(b), Some(k)) => format!(", micro-batch {b}, {k}F{k}B"),
            _ => String::new(),
        };
        s.push_str(&format!(
            "  stage {:>2}: {:>4} nodes ({span}), devices {:?}, preds {:?}{own}, in-flight {}, {:.3} ms/micro-batch, peak {}\n",
            st.id,
            st.nodes.len(),
            st.devices,
            st.predecessors,
            st.in_flight,
            st.compute_time_s * 1e3,
            gb(st.peak_memory_bytes as f64)
        ));
    }
    s.push_str(&format!(
        "iteration {:.6} s (simulated), {:.2} samples/s, bubble {:.1}%, depth {}, peak memory {}{}, objective {:.6} s, search {:.3} ms\n",
        plan.iteration_time_s,
        plan.throughput_samples_per_s,
        plan.bubble_fraction * 100.0,
        plan.pipeline_depth,
        gb(plan.peak_memory_bytes as f64),
        if plan.out_of_memory { " (exceeds a device's memory)" } else { "" },
        plan.objective_s,
        plan.search_time_s * 1e3
    ));
    s
}

/// Run `pipec plan`.
pub fn run(a: PlanArgs) -> Result<ExitCode> {
    if a.list_clusters {
        print!("{}", list_clusters());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(name) = &a.show_cluster {
        let p = PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            anyhow!(
                "--show-cluster {name}: not a preset (one of {})",
                names.join(", ")
            )
        })?;
        print!("{}", p.toml());
        return Ok(ExitCode::SUCCESS);
    }
    let model = a
        .model
        .as_deref()
        .ok_or_else(|| anyhow!("MODEL: missing (an .onnx file or a graph.txt profile)"))?;
    let spec = a
        .cluster
        .as_deref()
        .ok_or_else(|| anyhow!("--cluster: missing (a preset, a TOML file or N@BW,...)"))?;
    let planner_name = &with_dapple_reference(
        planner_name(a.planner.as_deref(), a.stages.as_deref())?,
        a.dapple_reference.as_deref(),
    )?;
    let label = plan_label(planner_name);
    planners::by_name(planner_name)?; // an unknown name fails before any work
    let mut cluster = resolve_cluster(spec, a.device_kind.as_deref(), a.devices)?;
    let schedule = parse_schedule(a.schedule.as_deref(), planner_name)?;
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
    opts.set_micro_batch(a.micro_batch)?;
    opts.schedule = schedule;
    opts.optimizer = Optimizer::parse(&a.optimizer)?;
    opts.allreduce = parse_allreduce(&a.allreduce)?;
    let limit = time_limit(a.time_limit)?;
    // BaPipe emits its intra-layer splits on an ONNX model costed analytically.
    let module = if planner_name == "bapipe" && a.profile.is_none() && !is_profile_path(model) {
        Some(super::load_module_dims(model, &dims)?)
    } else {
        None
    };
    let spin = super::progress::spinner(format!(
        "planning {} with {label} on {} devices",
        model.display(),
        cluster.len()
    ));
    opts.deadline = deadline(limit);
    let context = || format!("{}: planner '{label}' failed", model.display());
    let (plan, g, _, times) = plan_repeated(
        planner_name,
        module.as_ref(),
        g,
        &cluster,
        &opts,
        a.repeat,
        &context,
        |i| spin.set_message(format!("--repeat: run {i} of {}", a.repeat)),
    )?;
    if let Some(t) = times {
        spin.finish_and_clear();
        eprintln!(
            "search time over {} runs: fastest {:.3} ms, median {:.3} ms, first {:.3} ms",
            t.runs,
            t.fastest_s * 1e3,
            t.median_s * 1e3,
            t.first_s * 1e3
        );
    }
    drop(spin);
    warn_time_limited(&plan, a.time_limit);
    plan.verify(&g, &cluster)
        .with_context(|| format!("planner '{label}' produced an invalid plan"))?;
    if let Some(path) = &a.trace {
        let text = pipec::driver::plan_trace(&plan, &g, &cluster, &opts)?;
        std::fs::write(path, text).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    let report = plan.report(&g);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// `--schedule S` for `planner`: a known name (`kfkb-K` with K in 1..=1024); `gpp-per-stage`
/// only with the `gpp` planner (its per-stage sizes are searched on GPP's stage graph).
pub fn parse_schedule(s: Option<&str>, planner: &str) -> Result<Option<ScheduleKind>> {
    let Some(s) = s else { return Ok(None) };
    let kind = ScheduleKind::parse(s).ok_or_else(|| {
        anyhow!(
            "--schedule {s}: one of {} (kfkb-K: K from 1 to 1024; interleaved-V: V from 2 to 64)",
            ScheduleKind::names().join(", ")
        )
    })?;
    if kind == ScheduleKind::GppPerStage && planner != "gpp" {
        bail!("--schedule gpp-per-stage: only with --planner gpp (got '{planner}')");
    }
    Ok(Some(kind))
}
