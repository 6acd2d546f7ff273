//! The compile pipeline as the library runs it: `pipec compile` and build pipelines call
//! [`compile`] (or [`run_pipeline`], to print IR or time the steps) and write the [`Artifact`]
//! where they like.
//!
//! The pipeline is a list of steps on the pass manager ([`pipeline`]), each a
//! [`Pass`]`<`[`CompileState`]`>` whose contract (summary, statistics, the products it requires
//! and provides) is data, with the IR verifier run on every module a step makes and IR printing
//! (`--dump-ir`, `--print-ir-after*`) as the manager's instrumentation:
//!
//! ```text
//! import          model ──frontend::load_module_dims──► Module (shape-inferred, lowered)
//! plan            ──planning_graph──► CostGraph ──(--profile)──► planner ──► Plan
//!                 (BaPipe's intra-layer splits: the rewritten module, snapshot split-layer)
//! partition       Plan::verify; codegen::partition: stages' ops, cross values, forward modules
//! stage-pieces    codegen::stage_pieces: per-stage autodiff, loss, B/W split, optimizer step
//! reference       codegen::reference: data inputs, the one-device training step
//! insert-comm     codegen::communicate: every device's instructions in schedule order
//! verify-program  codegen::verify_program: the schedule verifier
//!                 ──► Artifact { plan, cluster, program, pieces, weights } ──write──► OUTDIR
//! ```
//!
//! Example (a build script that compiles a model for 4 CPU devices):
//!
//! ```no_run
//! use pipec::driver::{self, CompileOptions};
//! let cluster = driver::resolve_cluster("cpu", None, Some(4))?;
//! let mut opts = CompileOptions::new("gpp", cluster, 8);
//! opts.set_micro_batch(Some(2))?;
//! opts.set_optimizer("adam:lr=0.001")?;
//! let out = driver::compile(std::path::Path::new("model.onnx"), &opts, &|_| {})?;
//! out.artifact.write(std::path::Path::new("model.out"))?;
//! # Ok::<(), anyhow::Error>(())
//! ```

use crate::artifact::Artifact;
use crate::frontend::load_module_dims;
use anyhow::{anyhow, bail, Context, Result};
use pipec_compiler::ir::Module;
use pipec_compiler::passmgr::{IrUnit, Pass, PassInfo, PassManager, PassRecord, PrintIr, Stats};
use pipec_passes::codegen;
use pipec_passes::cost::analytic::{self, AnalyticOptions};
use pipec_passes::cost::cluster::{device_kind_by_name, device_kind_names, Cluster};
use pipec_passes::cost::measured::{self, MeasuredProfile};
use pipec_passes::cost::profile::{load_profile, profile_batch_from_name};
use pipec_passes::cost::{CostGraph, Optimizer as MemOptimizer};
use pipec_passes::loss::LossKind;
use pipec_passes::optimizer::OptimizerKind;
use pipec_passes::plan::{MicroBatch, Plan, PlanOptions, PlanReport};
use pipec_passes::planners::{self, bapipe, Planner};
use pipec_passes::sim::{self, PerStage, ScheduleKind, StageGraph};
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
    /// Micro-batch size, checked against `batch` ([`CompileOptions::set_micro_batch`]); `None`:
    /// the planner's choice.
    pub micro_batch: Option<MicroBatch>,
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
    /// PipeDream's vertical sync (`--vertical-sync`; `pipedream-async` only).
    pub vertical_sync: bool,
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
            vertical_sync: false,
        }
    }

    /// Ask for micro-batches of `size` samples (`None`: the planner's choice), checked against
    /// the batch here, once.
    pub fn set_micro_batch(&mut self, size: Option<u64>) -> Result<()> {
        self.micro_batch = size.map(|mb| MicroBatch::new(self.batch, mb)).transpose()?;
        Ok(())
    }

    /// Parse an optimizer spec (`sgd:lr=0.01[,momentum=0.9][,weight_decay=0]` or
    /// `adam:lr=0.001[,beta1=..]`) into [`CompileOptions::optimizer`].
    pub fn set_optimizer(&mut self, spec: &str) -> Result<()> {
        self.optimizer = spec.parse().map_err(|e| anyhow!("{e}"))?;
        self.optimizer_spec = spec.to_string();
        Ok(())
    }
}

/// A compiled model: the artifact, and the IR after every step when asked for.
pub struct Compilation {
    pub artifact: Artifact,
    /// `(label, module)` in pipeline order (`import`, `split-layer`, `partition`, each stage's
    /// training module, every piece), when [`CompileOptions::keep_ir`].
    pub ir: Vec<(String, Module)>,
}

/// Plan and compile `model`: the [`pipeline`] on the pass manager, the IR verifier after every
/// step. `progress` receives a line per step.
pub fn compile(
    model: &Path,
    opts: &CompileOptions,
    progress: &dyn Fn(&str),
) -> Result<Compilation> {
    let mut ir = Vec::new();
    let print = if opts.keep_ir {
        PrintIr::AfterAll
    } else {
        PrintIr::Never
    };
    let (st, _) = run_pipeline(model, opts, progress, print, &mut |_, label, m| {
        ir.push((label.to_string(), m.clone()))
    })?;
    Ok(Compilation {
        artifact: st.into_artifact()?,
        ir,
    })
}

/// Run the [`pipeline`] on `model` with the given IR printing (`print(step, label, module)`, as
/// [`PassManager::run`]); the finished state gives the artifact ([`CompileState::into_artifact`]).
/// A step's own error comes back as it was raised; the manager's (a verifier failure, a missing
/// requirement) names the step.
pub fn run_pipeline<'a>(
    model: &Path,
    opts: &'a CompileOptions,
    progress: &'a dyn Fn(&str),
    print_ir: PrintIr,
    print: &mut dyn FnMut(&str, &str, &Module),
) -> Result<(CompileState<'a>, Vec<PassRecord>)> {
    let mut st = CompileState::new(model, opts, progress);
    // The `partition` snapshot (the module annotated with stages) is only for printers.
    st.snapshots = !matches!(print_ir, PrintIr::Never);
    let mut pm = PassManager::new(pipeline());
    pm.print_ir = print_ir;
    let records = pm.run(&mut st, print).map_err(step_error)?;
    Ok((st, records))
}

/// The steps of `pipec compile`, in order (see the module doc):
/// `import → plan → partition → stage-pieces → reference → insert-comm → verify-program`.
pub fn pipeline<'a>() -> Vec<Box<dyn Pass<CompileState<'a>>>> {
    vec![
        Box::new(steps::Import),
        Box::new(steps::PlanStep),
        Box::new(steps::Partition),
        Box::new(steps::StagePieces),
        Box::new(steps::Reference),
        Box::new(steps::InsertComm),
        Box::new(steps::VerifyProgram),
    ]
}

/// A step's own error, unwrapped from the pass manager's `pass 'NAME'` (the messages the
/// commands print stay those of the functions the steps call).
fn step_error(e: pipec_compiler::Error) -> anyhow::Error {
    match e {
        pipec_compiler::Error::Pass { source, .. }
            if matches!(*source, pipec_compiler::Error::External(_)) =>
        {
            match *source {
                pipec_compiler::Error::External(b) => anyhow::Error::from_boxed(b),
                other => other.into(),
            }
        }
        other => other.into(),
    }
}

/// A product of step `by`, or an error saying that step has not run (the pass manager checks the
/// declared requirements first, so only a pipeline built by hand meets it).
fn made<'s, T>(x: &'s Option<T>, by: &str) -> pipec_compiler::Result<&'s T> {
    x.as_ref().ok_or_else(|| not_run(by))
}

/// The error of a step whose input step `by` has not run.
fn not_run(by: &str) -> pipec_compiler::Error {
    pipec_compiler::Error::msg(format!("step '{by}' has not run"))
}

/// A codegen function's error as `pipec compile` reports it (`MODEL: compile failed`).
fn compile_failed(name: &str, e: pipec_compiler::Error) -> pipec_compiler::Error {
    external(anyhow::Error::from(e).context(format!("{name}: compile failed")))
}

/// A step's error as the pass manager carries it.
fn external(e: anyhow::Error) -> pipec_compiler::Error {
    pipec_compiler::Error::External(e.into())
}

/// Where an IR snapshot of a compilation lives in its [`CompileState`].
#[derive(Clone, Copy, Debug)]
enum IrRef {
    /// The module as the front end left it.
    Imported,
    /// BaPipe's module with intra-layer splits.
    Rewritten,
    /// The module annotated with each op's stage.
    Partition,
    /// Stage `s`'s training module.
    Training(usize),
    /// A stage piece, by position in [`codegen::StagePieces::modules`].
    Piece(usize),
    /// A reference piece, by position in [`codegen::Reference::modules`].
    ReferencePiece(usize),
}

/// A compilation in progress: what the steps of [`pipeline`] read and make, and the IR they
/// made, in order (the `--dump-ir` snapshots, verified after each step).
pub struct CompileState<'a> {
    model: PathBuf,
    opts: &'a CompileOptions,
    progress: &'a dyn Fn(&str),
    imported: Option<Module>,
    planned: Option<Planned>,
    codegen_opts: Option<codegen::CompileOptions>,
    partition: Option<codegen::Partition>,
    annotated: Option<Module>,
    pieces: Option<codegen::StagePieces>,
    reference: Option<codegen::Reference>,
    program: Option<pipec_compiler::program::Program>,
    ir: Vec<(String, IrRef)>,
    /// Make the snapshots that exist only to be printed (the `partition` one: the verified
    /// module with a stage attribute per op, which the verifier does not read).
    snapshots: bool,
}

impl<'a> CompileState<'a> {
    /// A compilation of `model` that no step has run on yet.
    pub fn new(model: &Path, opts: &'a CompileOptions, progress: &'a dyn Fn(&str)) -> Self {
        CompileState {
            model: model.to_path_buf(),
            opts,
            progress,
            imported: None,
            planned: None,
            codegen_opts: None,
            partition: None,
            annotated: None,
            pieces: None,
            reference: None,
            program: None,
            ir: Vec::new(),
            snapshots: true,
        }
    }

    /// The plan, once the `plan` step ran.
    pub fn plan(&self) -> Option<&Plan> {
        self.planned.as_ref().map(|p| &p.plan)
    }

    /// The model's path as messages show it.
    pub fn name(&self) -> String {
        self.model.display().to_string()
    }

    /// What the codegen steps read: the plan (its module and name), the partition and codegen's
    /// options, which the `partition` step made.
    fn codegen_input(
        &self,
    ) -> pipec_compiler::Result<(&Planned, &codegen::Partition, &codegen::CompileOptions)> {
        Ok((
            made(&self.planned, "plan")?,
            made(&self.partition, "partition")?,
            made(&self.codegen_opts, "partition")?,
        ))
    }

    /// The artifact of a finished pipeline.
    pub fn into_artifact(self) -> Result<Artifact> {
        let (Some(planned), Some(program), Some(pieces), Some(reference)) =
            (self.planned, self.program, self.pieces, self.reference)
        else {
            bail!("the compile pipeline did not finish");
        };
        let compiled = codegen::finish(planned.module(), program, pieces, reference)?;
        let Planned {
            plan,
            cluster,
            graph,
            ..
        } = planned;
        // The plan's devices are the cluster's first `plan.devices()` (GPP may use fewer than
        // given), and its simulation ran on that cluster: the one recorded.
        let cluster = cluster.take(plan.devices())?;
        Ok(Artifact {
            plan: plan.report(&graph),
            cluster,
            compiled,
        })
    }

    fn module_at(&self, r: IrRef) -> Option<&Module> {
        match r {
            IrRef::Imported => self
                .planned
                .as_ref()
                .map(|p| &p.imported)
                .or(self.imported.as_ref()),
            IrRef::Rewritten => self.planned.as_ref()?.rewritten.as_ref(),
            IrRef::Partition => self.annotated.as_ref(),
            IrRef::Training(s) => self.pieces.as_ref()?.training_modules().nth(s),
            IrRef::Piece(i) => self.pieces.as_ref()?.modules().get(i).map(|x| &x.1),
            IrRef::ReferencePiece(i) => self.reference.as_ref()?.modules().get(i).map(|x| &x.1),
        }
    }
}

impl IrUnit for CompileState<'_> {
    fn attr_kind(&self) -> &'static str {
        "compile product"
    }

    fn holds(&self, attr: &str) -> bool {
        match attr {
            steps::MODULE => self.imported.is_some() || self.planned.is_some(),
            steps::PLAN => self.planned.is_some(),
            steps::STAGES => self.partition.is_some(),
            steps::PIECES => self.pieces.is_some(),
            steps::REFERENCE => self.reference.is_some(),
            steps::PROGRAM => self.program.is_some(),
            _ => false,
        }
    }

    fn ir_mark(&self) -> usize {
        self.ir.len()
    }

    fn ir_since(&self, mark: usize) -> Vec<(&str, &Module)> {
        self.ir[mark.min(self.ir.len())..]
            .iter()
            .filter_map(|(label, r)| Some((label.as_str(), self.module_at(*r)?)))
            .collect()
    }
}

/// The snapshot label of a piece file (`stages/s0.fwd.onnx` -> `stages-s0-fwd`).
fn piece_label(file: &str) -> String {
    file.trim_end_matches(".onnx").replace(['/', '.'], "-")
}

/// The steps of [`pipeline`], each with its contract as data.
pub mod steps {
    use super::*;

    /// Products of the steps, for their `requires` / `provides`.
    pub const MODULE: &str = "module";
    pub const PLAN: &str = "plan";
    pub const STAGES: &str = "stages";
    pub const PIECES: &str = "pieces";
    pub const REFERENCE: &str = "reference";
    pub const PROGRAM: &str = "program";

    fn info(
        name: &'static str,
        summary: &'static str,
        statistics: &'static [&'static str],
        requires: &'static [(&'static str, &'static str)],
        provides: &'static [&'static str],
    ) -> PassInfo {
        PassInfo {
            name,
            summary,
            options: &[],
            statistics,
            requires,
            provides,
            invalidates: &[],
        }
    }

    macro_rules! contract {
        ($name:expr, $summary:expr, $stats:expr, $req:expr, $prov:expr) => {{
            static INFO: std::sync::OnceLock<PassInfo> = std::sync::OnceLock::new();
            INFO.get_or_init(|| info($name, $summary, $stats, $req, $prov))
        }};
    }

    /// `import`: the front end ([`crate::frontend::load_module_dims`]).
    pub struct Import;
    impl<'a> Pass<CompileState<'a>> for Import {
        fn info(&self) -> &'static PassInfo {
            contract!(
                "import",
                "read the model (ONNX or textual IR), infer shapes, upgrade the opset, bind --dim sizes, lower control flow and RNNs",
                &["ops"],
                &[],
                &[MODULE]
            )
        }
        fn run(&self, st: &mut CompileState<'a>, stats: &mut Stats) -> pipec_compiler::Result<()> {
            let m = load_module_dims(&st.model, &st.opts.dims).map_err(external)?;
            stats.add("ops", m.graph.order.len() as u64);
            st.imported = Some(m);
            st.ir.push(("import".to_string(), IrRef::Imported));
            Ok(())
        }
    }

    /// `plan`: the cost graph, `--profile`'s measured costs, the planner ([`plan_imported`]).
    pub struct PlanStep;
    impl<'a> Pass<CompileState<'a>> for PlanStep {
        fn info(&self) -> &'static PassInfo {
            contract!(
                "plan",
                "cost the module and run the planner: stages, replicas, devices, micro-batch, schedule (BaPipe's intra-layer splits rewrite the module: snapshot split-layer)",
                &["stages", "devices"],
                &[(MODULE, "import")],
                &[PLAN]
            )
        }
        fn run(&self, st: &mut CompileState<'a>, stats: &mut Stats) -> pipec_compiler::Result<()> {
            let m = st.imported.take().ok_or_else(|| not_run("import"))?;
            let name = st.name();
            let planned =
                plan_imported(m, name, &st.model, st.opts, st.progress).map_err(external)?;
            stats.add("stages", planned.plan.stages.len() as u64);
            stats.add("devices", planned.plan.devices() as u64);
            if !planned.plan.intra_splits.is_empty() {
                st.ir.push(("split-layer".to_string(), IrRef::Rewritten));
            }
            st.planned = Some(planned);
            Ok(())
        }
    }

    /// `partition`: the plan verified and cut out of the module ([`codegen::partition`]).
    pub struct Partition;
    impl<'a> Pass<CompileState<'a>> for Partition {
        fn info(&self) -> &'static PassInfo {
            contract!(
                "partition",
                "verify the plan and cut the module into its stages: ops (side computations duplicated), values received and sent, forward modules, the stage DAG",
                &["stages"],
                &[(PLAN, "plan")],
                &[STAGES]
            )
        }
        fn run(&self, st: &mut CompileState<'a>, stats: &mut Stats) -> pipec_compiler::Result<()> {
            let r = partition_step(st).map_err(external)?;
            stats.add("stages", r as u64);
            if st.annotated.is_some() {
                st.ir.push(("partition".to_string(), IrRef::Partition));
            }
            Ok(())
        }
    }

    /// `stage-pieces`: per-stage autodiff, loss and optimizer ([`codegen::stage_pieces`]).
    pub struct StagePieces;
    impl<'a> Pass<CompileState<'a>> for StagePieces {
        fn info(&self) -> &'static PassInfo {
            contract!(
                "stage-pieces",
                "per stage: the training module (autodiff of its loss or received cotangents), forward/backward pieces (B and W apart under zero bubble), the optimizer step",
                &["pieces"],
                &[(STAGES, "partition")],
                &[PIECES]
            )
        }
        fn run(&self, st: &mut CompileState<'a>, stats: &mut Stats) -> pipec_compiler::Result<()> {
            let (planned, part, copts) = st.codegen_input()?;
            let pieces = codegen::stage_pieces(planned.module(), part, copts)
                .map_err(|e| compile_failed(&planned.name, e))?;
            stats.add("pieces", pieces.modules().len() as u64);
            for s in 0..part.len() {
                st.ir.push((format!("training-s{s}"), IrRef::Training(s)));
            }
            for (i, (file, _)) in pieces.modules().iter().enumerate() {
                st.ir.push((piece_label(file), IrRef::Piece(i)));
            }
            st.pieces = Some(pieces);
            Ok(())
        }
    }

    /// `reference`: data inputs and the one-device program ([`codegen::reference`]).
    pub struct Reference;
    impl<'a> Pass<CompileState<'a>> for Reference {
        fn info(&self) -> &'static PassInfo {
            contract!(
                "reference",
                "the data inputs and the unpartitioned training step that run --check compares with",
                &[],
                &[(PIECES, "stage-pieces")],
                &[REFERENCE]
            )
        }
        fn run(&self, st: &mut CompileState<'a>, _: &mut Stats) -> pipec_compiler::Result<()> {
            let (planned, part, copts) = st.codegen_input()?;
            let pieces = made(&st.pieces, "stage-pieces")?;
            let r = codegen::reference(planned.module(), part, pieces, copts)
                .map_err(|e| compile_failed(&planned.name, e))?;
            for (i, (file, _)) in r.modules().iter().enumerate() {
                st.ir.push((piece_label(file), IrRef::ReferencePiece(i)));
            }
            st.reference = Some(r);
            Ok(())
        }
    }

    /// `insert-comm`: every device's instruction list ([`codegen::communicate`]).
    pub struct InsertComm;
    impl<'a> Pass<CompileState<'a>> for InsertComm {
        fn info(&self) -> &'static PassInfo {
            contract!(
                "insert-comm",
                "every device's instructions in the schedule's order: receives, compute, sends, split/concat, accumulation, all-reduces, the step",
                &["instructions"],
                &[(PIECES, "stage-pieces"), (REFERENCE, "reference")],
                &[PROGRAM]
            )
        }
        fn run(&self, st: &mut CompileState<'a>, stats: &mut Stats) -> pipec_compiler::Result<()> {
            let (planned, part, copts) = st.codegen_input()?;
            let (pieces, r) = (
                made(&st.pieces, "stage-pieces")?,
                made(&st.reference, "reference")?,
            );
            let program = codegen::communicate(planned.module(), part, pieces, r, copts)
                .map_err(|e| compile_failed(&planned.name, e))?;
            let n: usize = program.devices.iter().map(|d| d.instructions.len()).sum();
            stats.add("instructions", n as u64);
            st.program = Some(program);
            Ok(())
        }
    }

    /// `verify-program`: the schedule verifier ([`codegen::verify_program`]).
    pub struct VerifyProgram;
    impl<'a> Pass<CompileState<'a>> for VerifyProgram {
        fn info(&self) -> &'static PassInfo {
            contract!(
                "verify-program",
                "the schedule verifier: every send has its receive in the same order, no device waits forever, every piece exists, W after B",
                &[],
                &[(PROGRAM, "insert-comm")],
                &[]
            )
        }
        fn run(&self, st: &mut CompileState<'a>, _: &mut Stats) -> pipec_compiler::Result<()> {
            let (planned, program) = (
                made(&st.planned, "plan")?,
                made(&st.program, "insert-comm")?,
            );
            codegen::verify_program(program).map_err(|e| compile_failed(&planned.name, e))
        }
    }
}

/// The `partition` step: verify the plan, build codegen's options, cut the stages. Returns the
/// stage count.
fn partition_step(st: &mut CompileState) -> Result<usize> {
    let opts = st.opts;
    let planned = made(&st.planned, "plan")?;
    let label = plan_label(&opts.planner);
    let plan = &planned.plan;
    plan.verify(&planned.graph, &planned.cluster)
        .with_context(|| format!("planner '{label}' produced an invalid plan"))?;
    let specs = plan.specs();
    // The order the plan was simulated with, where it is not the schedule kind's own.
    let mut popts = PlanOptions::new(opts.batch);
    popts.optimizer = memory_optimizer(&opts.optimizer);
    let pass_orders = plan
        .pass_orders(&planned.graph, &planned.cluster, &popts)
        .with_context(|| format!("{}: the plan's schedule", planned.name))?;
    let copts = codegen::CompileOptions {
        model_name: Path::new(&planned.name)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
        planner: plan.planner.clone(),
        micro_batch: MicroBatch::new(opts.batch, plan.micro_batch.size())?,
        schedule: plan.schedule,
        loss: opts.loss.clone(),
        optimizer: opts.optimizer.clone(),
        optimizer_spec: opts.optimizer_spec.clone(),
        per_stage: per_stage_of(plan),
        vertical_sync: opts.vertical_sync,
        pass_orders,
    };
    (st.progress)(&format!("compiling {} stages", specs.len()));
    let part = codegen::partition(planned.module(), &specs, &copts)
        .with_context(|| format!("{}: compile failed", planned.name))?;
    if st.snapshots {
        st.annotated = Some(part.annotated(planned.module()));
    }
    let n = part.len();
    st.partition = Some(part);
    st.codegen_opts = Some(copts);
    Ok(n)
}

/// The result of [`plan`]: the plan and what the compile steps cut from it.
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

/// Import `model` (front end, cost graph, `--profile`) and run the planner: the pipeline's first
/// two steps, for callers that want the plan alone.
pub fn plan(model: &Path, opts: &CompileOptions, progress: &dyn Fn(&str)) -> Result<Planned> {
    let m = load_module_dims(model, &opts.dims)?;
    plan_imported(m, model.display().to_string(), model, opts, progress)
}

/// Plan the imported module `m` (named `name` in messages) of `model`.
fn plan_imported(
    m: Module,
    name: String,
    model: &Path,
    opts: &CompileOptions,
    progress: &dyn Fn(&str),
) -> Result<Planned> {
    let mut g = planning_graph(&m, &name)?;
    let mut cluster = opts.cluster.clone();
    if let Some(p) = &opts.profile {
        apply_measured_profile(&mut g, &mut cluster, model, p)?;
    }
    let mut popts = PlanOptions::new(opts.batch);
    popts.set_checked_micro_batch(opts.micro_batch)?;
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
    let (mut plan, g, rewritten) = plan_model(&opts.planner, with_module, g, &cluster, &popts)
        .with_context(|| format!("{name}: planner '{label}' failed"))?;
    if opts.vertical_sync && plan.schedule.per_micro_batch_step() {
        // The planner chose its stages without vertical sync; the plan reports the program's
        // time and memory with it (every stage's stashes of the input stage's versions).
        popts.vertical_sync = true;
        let vs = plan
            .rescheduled(&plan.planner, &g, &cluster, &popts, plan.schedule)
            .with_context(|| format!("{name}: the plan with --vertical-sync"))?;
        plan = with_search_of(&plan, vs, 0.0);
    }
    Ok(Planned {
        imported: m,
        rewritten,
        graph: g,
        plan,
        cluster,
        name,
    })
}

/// Load MODEL as a cost graph for `pipec plan` / `compare`: a PipeDream `graph.txt` profile
/// (measured at `profile_batch`, default `pbs-N` in the name, else 1) or an ONNX model / textual
/// IR costed with the analytic model (the batch symbol at 1 sample when symbolic). Returns it
/// with its reference batch.
pub fn load_cost_graph(
    model: &Path,
    profile_batch: Option<u64>,
    dims: &BTreeMap<String, i64>,
) -> Result<(CostGraph, u64)> {
    if !model.exists() {
        bail!("{}: no such file", model.display());
    }
    if is_profile_path(model) {
        let pb = match profile_batch {
            Some(0) => bail!("--profile-batch 0: must be >= 1"),
            Some(n) => n,
            None => profile_batch_from_name(model).unwrap_or(1),
        };
        let p = load_profile(model, pb as f64)?;
        return Ok((p.graph, pb));
    }
    let m = load_module_dims(model, dims)?;
    let g = planning_graph(&m, &model.display().to_string())?;
    let batch = g.reference_batch.round().max(1.0) as u64;
    Ok((g, batch))
}

/// A PipeDream `graph.txt` profile (by extension), not a model.
pub fn is_profile_path(model: &Path) -> bool {
    model.extension().is_some_and(|e| e == "txt")
}

/// `pipec plan --trace`: the plan's schedule simulated on its cluster, as a Chrome trace (JSON).
pub fn plan_trace(
    plan: &Plan,
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
) -> Result<String> {
    let specs = plan.specs();
    let kind = plan.schedule;
    let sg = StageGraph::from_specs_for(
        g,
        cluster,
        &specs,
        plan.micro_batch.size() as f64,
        opts.optimizer,
        kind,
    );
    let m = plan.micro_batches() as usize;
    let (_, res) = sim::fill::scheduled(&sg, kind, m, cluster, opts.allreduce)?;
    Ok(serde_json::to_string(&sim::trace::chrome_trace(&res))?)
}

/// `pipec compare`: every planner on `g` ([`planners::PLANNER_NAMES`], in that order), each plan
/// verified, or the planner's error as text. `module` (the ONNX model costed analytically) lets
/// BaPipe emit its intra-layer splits, as `pipec plan` does. `gpp` runs last and takes the other
/// planners' plans as its candidates (those made on `g` itself and not cut short by
/// `time_limit`), instead of planning them again. `each` is called with a planner's name before
/// it runs.
///
/// With `best_schedule`, every plan is then given its best synchronous schedule
/// ([`with_best_schedule`]); each row also carries the schedule its planner chose when that
/// differs.
pub fn compare(
    module: Option<&Module>,
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    time_limit: Option<Duration>,
    best_schedule: bool,
    each: &dyn Fn(&str),
) -> Vec<CompareRow> {
    let mut opts = opts.clone();
    let mut rows = Vec::new();
    let mut order: Vec<&'static str> = planners::PLANNER_NAMES.to_vec();
    order.sort_by_key(|n| *n == "gpp");
    let mut made: Vec<(String, Plan)> = Vec::new();
    for name in order {
        each(name);
        opts.deadline = deadline(time_limit);
        // Interleaving re-cuts each planner's plan (`plan_model`), GPP's too.
        let interleaved = opts.schedule.is_some_and(ScheduleKind::chunked);
        let planned = if name == "gpp" && !interleaved {
            let gpp = planners::gpp::Gpp {
                seed_plans: std::mem::take(&mut made),
                ..Default::default()
            };
            gpp.plan(g, cluster, &opts)
                .map(|p| (p, g.clone(), None))
                .map_err(anyhow::Error::from)
        } else {
            plan_model(name, module, g.clone(), cluster, &opts)
        };
        let mut own = None;
        let result = planned
            .and_then(|(p, g2, rewritten)| {
                p.verify(&g2, cluster)?;
                if rewritten.is_none() && opts.deadline.is_none() {
                    made.push((name.to_string(), p.clone()));
                }
                if !best_schedule {
                    return Ok((p, g2));
                }
                let best = with_best_schedule(&p, &g2, cluster, &opts);
                if best.schedule != p.schedule {
                    best.verify(&g2, cluster)?;
                    own = Some(p.schedule);
                }
                Ok((best, g2))
            })
            .map(|(p, g2)| p.report(&g2))
            .map_err(|e| format!("{e:#}"));
        rows.push(CompareRow {
            planner: name,
            result,
            own_schedule: own,
        });
    }
    rows.sort_by_key(|r| {
        planners::PLANNER_NAMES
            .iter()
            .position(|n| *n == r.planner)
            .unwrap_or(usize::MAX)
    });
    rows
}

/// One planner's row of [`compare`].
#[derive(Clone, Debug)]
pub struct CompareRow {
    pub planner: &'static str,
    /// The verified plan as reported (its nodes named in the graph it was made on), or the
    /// planner's error as text.
    pub result: std::result::Result<PlanReport, String>,
    /// With `best_schedule`: the schedule the planner chose, where another one won.
    pub own_schedule: Option<ScheduleKind>,
}

/// The synchronous schedules [`with_best_schedule`] tries: every kind that runs any plan's
/// stages at its one micro-batch size and ends the iteration with the flush, so the training is
/// the same (`run --check` holds for each) and only time and memory differ. Left out: `dapple-a`
/// and `gpp` (1F1B's order under other names), `1f1b-rr` (round-robin replicas change the split
/// of micro-batches), `gpp-per-stage` (per-stage micro-batch sizes, a planner's own decision)
/// and `pipedream-async` (other numerics).
pub const BEST_SCHEDULE_CANDIDATES: [ScheduleKind; 9] = [
    ScheduleKind::OneFOneB,
    ScheduleKind::GPipe,
    ScheduleKind::DappleB,
    ScheduleKind::OneFOneBSo,
    ScheduleKind::Kfkb(2),
    ScheduleKind::GPipeRecompute,
    ScheduleKind::OneFOneBRecompute,
    ScheduleKind::ZbH1,
    ScheduleKind::ZbH2,
];

/// `plan`'s stages and micro-batch under the fastest of [`BEST_SCHEDULE_CANDIDATES`] that the
/// simulator finds ([`Plan::beats`]: fitting in memory first, then faster by more than
/// rounding), or `plan` itself when none beats its own schedule. A plan whose schedule is a
/// planner's structural decision (`gpp-per-stage`, `1f1b-rr`) or changes the numerics
/// (`pipedream-async`) is returned as it is. The search time reported adds the re-simulations to
/// the planner's.
pub fn with_best_schedule(
    plan: &Plan,
    g: &CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
) -> Plan {
    if matches!(
        plan.schedule,
        ScheduleKind::GppPerStage | ScheduleKind::OneFOneBRr | ScheduleKind::PipeDreamAsync
    ) {
        return plan.clone();
    }
    let t0 = std::time::Instant::now();
    let mut best = plan.clone();
    for kind in BEST_SCHEDULE_CANDIDATES {
        if kind == plan.schedule {
            continue;
        }
        if let Ok(p) = plan.rescheduled(&plan.planner, g, cluster, opts, kind) {
            if p.beats(&best) {
                best = p;
            }
        }
    }
    if best.schedule == plan.schedule {
        return best;
    }
    with_search_of(plan, best, t0.elapsed().as_secs_f64())
}

/// `resimulated` (the planner's stages re-simulated, [`Plan::rescheduled`]) with what the
/// planner's search found and reported kept from `planned`: its search time (plus `extra_s`
/// seconds of re-simulation), time limit and cap flags, and BaPipe's intra-layer splits.
fn with_search_of(planned: &Plan, resimulated: Plan, extra_s: f64) -> Plan {
    Plan {
        search_time_s: planned.search_time_s + extra_s,
        time_limited: planned.time_limited,
        search_capped: planned.search_capped,
        intra_splits: planned.intra_splits.clone(),
        ..resimulated
    }
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
        batch: plan.batch(),
        base_micro_batch: plan.micro_batch.size(),
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
    if let Some(schedule) = opts.schedule.filter(|k| k.chunked()) {
        if !name.starts_with(planners::STAGES_PREFIX) {
            // The planner's device groups, its stages re-cut into chunks (BaPipe's intra-layer
            // splits are not made: the chunks cut the layers anew).
            let inner = planners::by_name(name)?;
            let plan = planners::interleave::Interleaved {
                inner: inner.as_ref(),
                schedule,
            }
            .plan(&g, cluster, opts)?;
            return Ok((plan, g, None));
        }
    }
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

/// Search times of a planner run several times on the same inputs ([`plan_repeated`]).
#[derive(Clone, Debug)]
pub struct RepeatTimes {
    /// Runs made (all returned the same plan).
    pub runs: usize,
    /// The fastest, the median and the first run's `search_time_s`.
    pub fastest_s: f64,
    pub median_s: f64,
    pub first_s: f64,
}

/// [`plan_model`] run `repeat` (≥ 1) times on the same inputs, for timing (`pipec plan
/// --repeat N`): every run must return the same plan but for its search time, else an error
/// names the run; the plan returned carries the fastest run's search time. `context` wraps a
/// planner's own error (the CLI names the model and planner); `progress(i)` is told before run
/// `i` (1-based, from the second).
#[allow(clippy::too_many_arguments)] // plan_model's five inputs, the count and two hooks
pub fn plan_repeated(
    name: &str,
    m: Option<&Module>,
    g: CostGraph,
    cluster: &Cluster,
    opts: &PlanOptions,
    repeat: usize,
    context: &dyn Fn() -> String,
    mut progress: impl FnMut(usize),
) -> Result<(Plan, CostGraph, Option<Module>, Option<RepeatTimes>)> {
    if repeat == 0 {
        bail!("--repeat 0: must be >= 1");
    }
    if repeat > 1 && opts.deadline.is_some() {
        bail!("--repeat with --time-limit: a search cut short by time returns other plans on other runs");
    }
    let first = (repeat > 1).then(|| g.clone());
    let (mut plan, g, m2) = plan_model(name, m, g, cluster, opts).with_context(context)?;
    let Some(g0) = first else {
        return Ok((plan, g, m2, None));
    };
    // Compared as reported (node names: BaPipe's rewritten graph is a new one every run).
    let strip = |p: &Plan, g: &CostGraph| -> Result<serde_json::Value> {
        let mut v = serde_json::to_value(p.report(g))?;
        if let Some(o) = v.as_object_mut() {
            o.remove("search_time_s");
        }
        Ok(v)
    };
    let want = strip(&plan, &g)?;
    let first_s = plan.search_time_s;
    let mut times = vec![first_s];
    for i in 1..repeat {
        progress(i + 1);
        let (p, gi, _) = plan_model(name, m, g0.clone(), cluster, opts).with_context(context)?;
        if strip(&p, &gi)? != want {
            bail!(
                "--repeat: run {} of planner '{}' returned another plan (not deterministic)",
                i + 1,
                plan_label(name)
            );
        }
        times.push(p.search_time_s);
    }
    times.sort_by(f64::total_cmp);
    plan.search_time_s = times[0];
    let stats = RepeatTimes {
        runs: repeat,
        fastest_s: times[0],
        median_s: times[times.len() / 2],
        first_s,
    };
    Ok((plan, g, m2, Some(stats)))
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
