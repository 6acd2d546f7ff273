//! The compile pipeline as the library runs it: `pipec compile` is [`plan`] then [`emit`], and
//! build pipelines call [`compile`] (both steps) and write the [`Artifact`] where they like.
//!
//! ```text
//! model ──frontend::load_module_dims──► Module (shape-inferred, verified, lowered)
//!       ──planning_graph──► CostGraph ──(--profile: measured seconds)──► planner ──► Plan
//!       ──codegen::compile (per-stage autodiff, loss, optimizer; communication; schedule
//!         verified)──► Artifact { plan, cluster, program, pieces, weights } ──write──► OUTDIR
//! ```
//!
//! Example (a build script that compiles a model for 4 CPU devices):
//!
//! ```no_run
//! use pipec::driver::{self, CompileOptions};
//! let cluster = driver::resolve_cluster("cpu", None, Some(4))?;
//! let mut opts = CompileOptions::new("gpp", cluster, 8);
//! opts.micro_batch = Some(2);
//! opts.set_optimizer("adam:lr=0.001")?;
//! let out = driver::compile(std::path::Path::new("model.onnx"), &opts, &|_| {})?;
//! out.artifact.write(std::path::Path::new("model.out"))?;
//! # Ok::<(), anyhow::Error>(())
//! ```

use crate::artifact::Artifact;
use crate::frontend::load_module_dims;
use anyhow::{anyhow, bail, Context, Result};
use pipec_compiler::ir::Module;
use pipec_passes::codegen::{self, Compiled};
use pipec_passes::cost::analytic::{self, AnalyticOptions};
use pipec_passes::cost::cluster::{device_kind_by_name, device_kind_names, Cluster};
use pipec_passes::cost::measured::{self, MeasuredProfile};
use pipec_passes::cost::{CostGraph, Optimizer as MemOptimizer};
use pipec_passes::loss::LossKind;
use pipec_passes::optimizer::OptimizerKind;
use pipec_passes::plan::{Plan, PlanOptions};
use pipec_passes::planners::{self, bapipe};
use pipec_passes::sim::{PerStage, ScheduleKind};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What [`compile`] needs besides the model.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The planner's name (`gpp`, `dapple`, ..., [`planners::DAPPLE_HPGO`], or
    /// [`planners::STAGES_PREFIX`] followed by a stage spec).
    pub planner: String,
    /// The cluster (see [`resolve_cluster`]).
    pub cluster: Cluster,
    /// Global mini-batch (samples per step).
    pub batch: u64,
    /// Micro-batch size; `None`: the planner's choice.
    pub micro_batch: Option<u64>,
    /// Schedule; `None`: the planner's own.
    pub schedule: Option<ScheduleKind>,
    pub loss: LossKind,
    /// The optimizer, and its spec as written (`adam:lr=0.001`; recorded in the program). Set
    /// both with [`CompileOptions::set_optimizer`].
    pub optimizer: OptimizerKind,
    pub optimizer_spec: String,
    /// Stop the planner's search after this long (the best plan found by then is compiled).
    pub time_limit: Option<Duration>,
    /// Sizes of symbolic input dims other than the batch.
    pub dims: BTreeMap<String, i64>,
    /// Plan with a measured profile of the model (`pipec profile`) instead of the analytic model.
    pub profile: Option<PathBuf>,
    /// Keep the IR after every step for `--dump-ir` ([`Compilation::ir`]).
    pub keep_ir: bool,
}

impl CompileOptions {
    /// Defaults as `pipec compile` has them: mean-square loss, SGD with lr 0.01, the planner's
    /// micro-batch and schedule.
    pub fn new(planner: &str, cluster: Cluster, batch: u64) -> Self {
        CompileOptions {
            planner: planner.to_string(),
            cluster,
            batch,
            micro_batch: None,
            schedule: None,
            loss: LossKind::MeanSquare,
            optimizer: OptimizerKind::Sgd {
                lr: 0.01,
                momentum: 0.0,
                weight_decay: 0.0,
            },
            optimizer_spec: "sgd:lr=0.01".to_string(),
            time_limit: None,
            dims: BTreeMap::new(),
            profile: None,
            keep_ir: false,
        }
    }

    /// Parse an optimizer spec (`sgd:lr=0.01[,momentum=0.9][,weight_decay=0]` or
    /// `adam:lr=0.001[,beta1=..]`) into [`CompileOptions::optimizer`].
    pub fn set_optimizer(&mut self, spec: &str) -> Result<()> {
        self.optimizer = spec.parse().map_err(|e| anyhow!("{e}"))?;
        self.optimizer_spec = spec.to_string();
        Ok(())
    }
}

/// The result of [`plan`]: the plan and what [`emit`] compiles it from.
pub struct Planned {
    /// The model as the front end left it (for `--dump-ir`'s first snapshot).
    pub imported: Module,
    /// BaPipe's module with intra-layer splits, when its plan has some (the plan names its nodes).
    pub rewritten: Option<Module>,
    /// The cost graph the plan is on.
    pub graph: CostGraph,
    pub plan: Plan,
    /// The cluster given to the planner (with `--profile`'s measured adjustments); the plan
    /// uses its first `plan.devices` devices.
    pub cluster: Cluster,
    /// The model's path as messages show it.
    pub name: String,
}

impl Planned {
    /// The module the plan's stages are cut from.
    pub fn module(&self) -> &Module {
        self.rewritten.as_ref().unwrap_or(&self.imported)
    }
}

/// A compiled model: the artifact, and the IR after every step when asked for.
pub struct Compilation {
    pub artifact: Artifact,
    /// `(label, module)` in pipeline order (`import`, `split-layer`, codegen's steps, every
    /// piece), when [`CompileOptions::keep_ir`].
    pub ir: Vec<(String, Module)>,
}

/// Plan and compile `model`: [`plan`] then [`emit`]. `progress` receives a line per step.
pub fn compile(
    model: &Path,
    opts: &CompileOptions,
    progress: &dyn Fn(&str),
) -> Result<Compilation> {
    let planned = plan(model, opts, progress)?;
    emit(planned, opts, progress)
}

/// Import `model` (front end, cost graph, `--profile`) and run the planner.
pub fn plan(model: &Path, opts: &CompileOptions, progress: &dyn Fn(&str)) -> Result<Planned> {
    let m = load_module_dims(model, &opts.dims)?;
    let name = model.display().to_string();
    let mut g = planning_graph(&m, &name)?;
    let mut cluster = opts.cluster.clone();
    if let Some(p) = &opts.profile {
        apply_measured_profile(&mut g, &mut cluster, model, p)?;
    }
    let mut popts = PlanOptions::new(opts.batch);
    popts.micro_batch = opts.micro_batch;
    popts.schedule = opts.schedule;
    popts.optimizer = memory_optimizer(&opts.optimizer);
    // BaPipe's intra-layer splits rewrite the module (not with a measured profile: its
    // seconds are per original node).
    let with_module = opts.profile.is_none().then_some(&m);
    let label = plan_label(&opts.planner);
    progress(&format!(
        "planning with {} on {} devices",
        label,
        cluster.len()
    ));
    popts.deadline = deadline(opts.time_limit);
    let (plan, g, rewritten) = plan_model(&opts.planner, with_module, g, &cluster, &popts)
        .with_context(|| format!("{name}: planner '{label}' failed"))?;
    Ok(Planned {
        imported: m,
        rewritten,
        graph: g,
        plan,
        cluster,
        name,
    })
}

/// Verify the plan and compile it: per-stage pieces (autodiff, loss, optimizer), communication,
/// the per-device schedule (verified statically), initial weights.
pub fn emit(
    planned: Planned,
    opts: &CompileOptions,
    progress: &dyn Fn(&str),
) -> Result<Compilation> {
    let label = plan_label(&opts.planner);
    let plan = &planned.plan;
    plan.verify(&planned.graph, &planned.cluster)
        .with_context(|| format!("planner '{label}' produced an invalid plan"))?;
    let specs = plan.specs(&planned.graph)?;
    let copts = codegen::CompileOptions {
        model_name: Path::new(&planned.name)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        planner: plan.planner.clone(),
        batch: opts.batch,
        micro_batch: plan.micro_batch,
        schedule: plan.schedule,
        loss: opts.loss.clone(),
        optimizer: opts.optimizer.clone(),
        optimizer_spec: opts.optimizer_spec.clone(),
        per_stage: per_stage_of(plan),
    };
    progress(&format!("compiling {} stages", specs.len()));
    let compiled = codegen::compile(planned.module(), &specs, &copts)
        .with_context(|| format!("{}: compile failed", planned.name))?;
    let ir = if opts.keep_ir {
        ir_snapshots(&planned, &compiled)
    } else {
        Vec::new()
    };
    let Planned { plan, cluster, .. } = planned;
    // The plan's devices are the cluster's first `plan.devices` (GPP may use fewer than given),
    // and its simulation ran on that cluster: the one recorded.
    let cluster = cluster.take(plan.devices)?;
    Ok(Compilation {
        artifact: Artifact {
            plan,
            cluster,
            compiled,
        },
        ir,
    })
}

/// `--dump-ir`'s snapshots, in pipeline order.
fn ir_snapshots(planned: &Planned, compiled: &Compiled) -> Vec<(String, Module)> {
    let mut out = vec![("import".to_string(), planned.imported.clone())];
    if !planned.plan.intra_splits.is_empty() {
        out.push(("split-layer".to_string(), planned.module().clone()));
    }
    out.extend(compiled.dumps.iter().cloned());
    for (file, md) in &compiled.modules {
        let label = file.trim_end_matches(".onnx").replace(['/', '.'], "-");
        out.push((label, md.clone()));
    }
    out
}

/// The memory model's optimizer class of an optimizer (state tensors per parameter).
pub fn memory_optimizer(o: &OptimizerKind) -> MemOptimizer {
    match o {
        OptimizerKind::Adam { .. } => MemOptimizer::Adam,
        OptimizerKind::Sgd { momentum, .. } if *momentum > 0.0 => MemOptimizer::Momentum,
        OptimizerKind::Sgd { .. } => MemOptimizer::Sgd,
    }
}

/// A `gpp-per-stage` plan's per-stage micro-batch sizes and groups (every stage has them).
pub fn per_stage_of(plan: &Plan) -> Option<PerStage> {
    let micro_batch: Option<Vec<u64>> = plan.stages.iter().map(|s| s.micro_batch).collect();
    Some(PerStage {
        batch: plan.batch,
        base_micro_batch: plan.micro_batch,
        micro_batch: micro_batch?,
        group: plan.stages.iter().map(|s| s.group.unwrap_or(1)).collect(),
    })
}

/// Run the planner `name` on `g`. For `bapipe` with the module `m` that `g` was built from
/// (analytic costs), the intra-layer splits are emitted ([`bapipe::plan_module`]): the plan then
/// names the nodes of the returned rewritten module and cost graph. Otherwise the plan is on `g`,
/// returned unchanged, and no module is returned.
pub fn plan_model(
    name: &str,
    m: Option<&Module>,
    g: CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
) -> Result<(Plan, CostGraph, Option<Module>)> {
    if let (Some(m), "bapipe") = (m, name) {
        let mp = bapipe::plan_module(m, &g, cluster, opts)?;
        return Ok(match mp.rewritten {
            Some((m2, g2)) => (mp.plan, g2, Some(m2)),
            None => (mp.plan, g, None),
        });
    }
    let plan = planners::by_name(name)?.plan(&g, cluster, opts)?;
    Ok((plan, g, None))
}

/// The cost graph planners use for module `m` (named `name` in messages): the analytic model
/// with autodiff's backward kernels; when autodiff refuses the model, the fixed factors, and a
/// warning says so.
pub fn planning_graph(m: &Module, name: &str) -> Result<CostGraph> {
    let (g, note) = analytic::planning_graph(m, &AnalyticOptions::default(), name)?;
    if let Some(note) = note {
        eprintln!("warning: {note}");
    }
    Ok(g)
}

/// A planner name as messages show it (`stages` for `--stages SPEC`).
pub fn plan_label(name: &str) -> &str {
    if name.starts_with(planners::STAGES_PREFIX) {
        "stages"
    } else {
        name
    }
}

/// `--profile prof.json`: replace the works of an ONNX model's cost graph by the measured
/// seconds of a `pipec profile` output (node names must match, in order). On a cluster whose
/// devices share the host's cores, the profile's measured all-cores slowdown becomes the
/// cluster's `host_slowdown`; on the `cpu` preset (the devices `pipec run` emulates with
/// threads), the measured message latency becomes every link level's latency α.
pub fn apply_measured_profile(
    g: &mut CostGraph,
    cluster: &mut Cluster,
    model: &Path,
    profile: &Path,
) -> Result<()> {
    if model.extension().is_some_and(|e| e == "txt") {
        bail!(
            "--profile {}: MODEL is already a graph.txt profile; --profile needs an ONNX model",
            profile.display()
        );
    }
    let file = profile.display().to_string();
    let text = std::fs::read_to_string(profile).with_context(|| format!("{file}: cannot read"))?;
    let p = MeasuredProfile::parse(&text, &file)?;
    measured::apply(g, &p, &file)?;
    if cluster.host_cores.is_some() {
        cluster.host_slowdown = p.host_slowdown();
    }
    if cluster.name == "cpu" && p.message_latency_s > 0.0 {
        for l in &mut cluster.levels {
            l.latency = p.message_latency_s;
        }
    }
    Ok(())
}

/// Resolve `--cluster`, `--device-kind` and `--devices`.
pub fn resolve_cluster(spec: &str, kind: Option<&str>, devices: Option<usize>) -> Result<Cluster> {
    let kind = match kind {
        None => None,
        Some(k) => Some(device_kind_by_name(k).ok_or_else(|| {
            anyhow!(
                "--device-kind {k}: unknown device kind ({})",
                device_kind_names().join(", ")
            )
        })?),
    };
    let c = Cluster::resolve(spec, kind)?;
    Ok(match devices {
        Some(n) => c.take(n)?,
        None => c,
    })
}

/// The planner's deadline for a `--time-limit` starting now (just before the planner runs, so
/// importing and costing the model do not count against it).
pub fn deadline(limit: Option<std::time::Duration>) -> Option<std::time::Instant> {
    limit.map(|d| std::time::Instant::now() + d)
}
