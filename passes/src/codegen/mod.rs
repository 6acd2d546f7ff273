//! `insert-comm` and codegen: from a forward model and a plan (stages, replicas, devices,
//! schedule) to a [`Program`] — per-stage forward/backward/step modules and every device's
//! instruction list with its sends, receives, split/concat, accumulation, all-reduces and step.
//!
//! - **Requires**: a forward module with inferred shapes whose data inputs carry one batch symbol
//!   on axis 0 (the symbol of the first input's axis 0); the plan's stages given as op indices
//!   into `module.graph.order` (what [`crate::cost::analytic::from_module`] names nodes by);
//!   the micro-batch divisible by every stage's replica count.
//! - **Guarantees** (checked by [`pipec_compiler::program::verify`] before returning):
//!   1. *Stages*: each stage's ops, plus duplicated **side computations** it reads from other
//!      stages (ops that do not depend on a float parameter or a float activation, and
//!      `Shape`/`Size`/`Constant*`: masks, position ids, shape arithmetic — cheap, and their
//!      values may depend on the slice size, so they must be computed where they are used);
//!      everything else a stage reads from another stage is a **cross value** and is sent.
//!   2. *Pieces* ([`pieces`]): forward, backward (of `J_s`, see [`pieces`]) and optimizer step
//!      per stage; parameters are graph inputs; a **tied parameter** (read by several stages,
//!      e.g. GPT-2's `wte` in the embedding and the LM head) is held by each of them, each
//!      computes its share of the gradient, one all-reduce sums the shares over every holder
//!      (all replicas of all holding stages), and every holder applies the same step, so the
//!      copies stay identical.
//!   3. *Communication* ([`insert_comm`]): per micro-batch, one message per (cross value,
//!      producer replica, consumer replica) whose sample ranges overlap (DAPPLE's even slices:
//!      1→n split, n→1 concat, n→m both), rows cut by [`pipec_compiler::program::Slice`] and
//!      reassembled by `Concat`; batch-independent cross values go whole from producer replica
//!      `j mod r_p` to consumer replica `j`, and their cotangents come back and are summed;
//!      cotangents flow back along the same routes. Skip edges (stage 0 → stage 3) are just
//!      cross values whose consumer is not the next stage: nothing special.
//!   4. *Order*: per stage, the schedule's forward/backward order
//!      ([`crate::sim::schedule::fb_order_grouped`] with the warm-up `K_s` of the schedule kind at
//!      the stage's depth and its group `k`: GPipe all forwards first; 1F1B / DAPPLE / GraphPipe
//!      early backward; GraphPipe's kFkB `k` backwards and `k` forwards in turn; per-stage sizes:
//!      [`crate::sim::schedule::per_stage_warmups`]), receives just before the compute that
//!      reads them, sends right after the compute that makes them, gradient accumulation after
//!      each backward, then the all-reduces (in one global order) and the step. Under a schedule
//!      that splits the backward (`zb-h1`), a stage that sends input gradients gets the pieces
//!      `bwd_b` and `bwd_w` ([`pieces::split_backward`]) and its weight passes trail its
//!      backwards ([`crate::sim::schedule::with_weight_passes`]); the accumulation follows `W`.
//!   5. *Scaling*: the loss of a slice is pre-scaled by `1/(M·r)` (mean losses) or `1/M` (sum),
//!      so every gradient of a step is the plain sum over micro-batches, replicas and holders,
//!      equal to single-device training with gradient accumulation (DAPPLE's equivalence).
//!      Under `pipedream-async` every micro-batch is its own update (PipeDream's minibatch):
//!      `1/r` (mean) or `1`, an update after each backward, and weight stashing.
//! - **Fails** with the value, stage or flag at fault: a cross value with the batch on an axis
//!   other than 0 between stages of different replica counts; a micro-batch not divisible by a
//!   replica count; an op without gradient rule; a schedule the verifier rejects.

pub mod insert_comm;
pub mod pieces;

mod layout;
use crate::plan::StageSpec;
use crate::sim::ScheduleKind;
use crate::transforms::loss::LossKind;
use crate::transforms::optimizer::OptimizerKind;
pub use insert_comm::Replication;
pub use layout::{concrete_dims, cot_name, layout, Layout};
use pipec_compiler::ir::{DType, Dim, Module, Op, TensorData, TensorType, Value, ValueDef};
use pipec_compiler::program::{
    self, DataInput, Piece, Program, ReferenceProgram, StageProgram, PROGRAM_VERSION,
};
use pipec_compiler::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// What `pipec compile` asks for.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    pub model_name: String,
    pub planner: String,
    /// The plan's micro-batch and the mini-batch it divides.
    pub micro_batch: crate::plan::MicroBatch,
    pub schedule: ScheduleKind,
    pub loss: LossKind,
    pub optimizer: OptimizerKind,
    /// The `--optimizer` text, recorded in the program.
    pub optimizer_spec: String,
    /// GraphPipe's per-stage micro-batch sizes and kFkB groups (`gpp-per-stage` plans).
    pub per_stage: Option<crate::sim::PerStage>,
    /// PipeDream's vertical sync (§3.4, `--vertical-sync`, with `pipedream-async` only): every
    /// stage's computes of a micro-batch read the weight version the input stage's forward of
    /// it read.
    pub vertical_sync: bool,
    /// Per device, its passes in order (`(pass, stage, mb)`), where the plan's schedule is not
    /// the kind's fixed order: the zero-bubble schedules' weight passes moved into idle slots
    /// ([`crate::sim::fill`], [`crate::plan::Plan::pass_orders`]).
    pub pass_orders: Option<Vec<crate::sim::fill::PassOrder>>,
}

/// A compiled program with the modules and data its files hold.
pub struct Compiled {
    pub program: Program,
    /// `(path relative to OUTDIR, module)` for every piece and the reference.
    pub modules: Vec<(String, Module)>,
    /// Initial value of every float initializer, by name (`weights.npz`).
    pub weights: Vec<(String, TensorData)>,
}

/// The batch symbol: axis 0 of the first data input.
fn batch_symbol(m: &Module) -> Result<String> {
    let g = &m.graph;
    let first = g
        .inputs
        .iter()
        .find(|v| !g.initializers.contains_key(*v))
        .ok_or_else(|| Error::msg("codegen: the model has no data input"))?;
    match g.ty(*first).shape.as_deref().and_then(|s| s.first()) {
        Some(Dim::Sym(s)) if s.syms.len() == 1 && s.coeff == 1 => Ok(s.syms[0].clone()),
        _ => Err(Error::named(
            g.name(*first),
            "codegen: the first data input needs a symbolic batch on axis 0 (re-export the model with a dynamic batch axis)",
        )),
    }
}

/// One stage after extraction.
struct StageBuild {
    ops: Vec<Op>,
    /// Values it receives from other stages (in first-use order).
    inputs: Vec<Value>,
    /// Values it sends, with the consumer stages.
    outputs: Vec<(Value, Vec<usize>)>,
}

/// Compile `m` under the plan's stages (see the module doc): [`partition`], [`stage_pieces`],
/// [`reference`], [`communicate`], [`finish`] in turn (the steps `pipec compile` runs on the
/// pass manager, with the IR verifier after each).
pub fn compile(m: &Module, specs: &[StageSpec], opts: &CompileOptions) -> Result<Compiled> {
    let part = partition(m, specs, opts)?;
    let pieces = stage_pieces(m, &part, opts)?;
    let training = pieces.training_modules().enumerate();
    verify_modules(training.map(|(s, md)| (format!("the training module of stage {s}"), md)))?;
    let files = pieces.modules().iter();
    verify_modules(files.map(|(f, md)| (format!("piece {f}"), md)))?;
    let refp = reference(m, &part, &pieces, opts)?;
    let files = refp.modules().iter();
    verify_modules(files.map(|(f, md)| (format!("piece {f}"), md)))?;
    let program = communicate(m, &part, &pieces, &refp, opts)?;
    verify_program(&program)?;
    finish(m, program, pieces, refp)
}

/// The plan's stages cut out of the module (step `partition`, guarantee 1 of the module doc).
pub struct Partition {
    batch_sym: String,
    micro_batches: u64,
    /// Devices of each stage, numbered densely.
    stage_devices: Vec<Vec<usize>>,
    replication: Vec<Replication>,
    stage_of: HashMap<Op, usize>,
    /// The first output (the loss reads it) and its stage.
    y0: Value,
    y0_stage: usize,
    builds: Vec<StageBuild>,
    /// Each stage's forward module.
    fwd_modules: Vec<Module>,
    /// The stage DAG: each stage's predecessors, and a topological order.
    preds: Vec<BTreeSet<usize>>,
    topo: Vec<usize>,
}

impl Partition {
    /// `m` with every op annotated `pipec.stage = S` (`--dump-ir`'s `partition` snapshot).
    pub fn annotated(&self, m: &Module) -> Module {
        let mut annotated = m.clone();
        for (op, s) in &self.stage_of {
            annotated.graph.ops[*op].attrs.insert(
                "pipec.stage".into(),
                pipec_compiler::ir::Attr::Int(*s as i64),
            );
        }
        annotated
    }

    /// Stage count.
    pub fn len(&self) -> usize {
        self.builds.len()
    }

    /// Whether the plan has no stage.
    pub fn is_empty(&self) -> bool {
        self.builds.is_empty()
    }
}

/// Step `partition`: which ops each stage computes (with its duplicated side computations), the
/// values it receives and sends, its forward module and the stage DAG.
pub fn partition(m: &Module, specs: &[StageSpec], opts: &CompileOptions) -> Result<Partition> {
    let g = &m.graph;
    let batch_sym = batch_symbol(m)?;
    let mbs = opts.micro_batch;
    let (b, mb, nmb) = (mbs.batch(), mbs.size(), mbs.count());
    // Dense device numbering.
    let mut used: Vec<usize> = specs.iter().flat_map(|s| s.devices.clone()).collect();
    used.sort_unstable();
    // Interleaved 1F1B's chunks share their group's devices.
    used.dedup();
    let dense: HashMap<usize, usize> = used.iter().enumerate().map(|(i, d)| (*d, i)).collect();
    let stage_devices: Vec<Vec<usize>> = specs
        .iter()
        .map(|s| s.devices.iter().map(|d| dense[d]).collect())
        .collect();
    // PipeDream's replicas take whole micro-batches round robin (1F1B-RR); the others cut
    // each micro-batch into even slices (DAPPLE), falling back to round robin when the
    // micro-batch does not divide over the replicas.
    if let Some(ps) = &opts.per_stage {
        check_per_stage(m, specs, ps, b)?;
    }
    // A stage's own micro-batch size (per-stage plans), else the plan's.
    let size = |s: usize| opts.per_stage.as_ref().map_or(mb, |p| p.micro_batch[s]);
    let replication: Vec<Replication> = stage_devices
        .iter()
        .enumerate()
        .map(|(s, devs)| {
            let r = devs.len();
            // As the simulator decides ([`crate::sim::StageGraph::from_specs_for`]): by the
            // schedule (`1f1b-rr`, whichever planner chose it), or a micro-batch that does not
            // divide over the replicas.
            if (r > 1 && opts.schedule.round_robin()) || crate::sim::takes_turns(size(s) as f64, r)
            {
                Replication::RoundRobin
            } else {
                Replication::Slices
            }
        })
        .collect();
    // Op -> stage.
    let mut stage_of: HashMap<Op, usize> = HashMap::new();
    for (s, sp) in specs.iter().enumerate() {
        for &n in &sp.nodes {
            let op = *g.order.get(n).ok_or_else(|| {
                Error::msg(format!(
                    "codegen: stage {s} names node index {n} out of range"
                ))
            })?;
            stage_of.insert(op, s);
        }
    }
    if let Some(op) = g.order.iter().find(|o| !stage_of.contains_key(o)) {
        return Err(Error::node(
            &g.ops[*op].name,
            &g.ops[*op].op_type,
            "codegen: op is in no stage",
        ));
    }
    let side = crate::cost::analytic::side_ops(m);
    let pos: HashMap<Op, usize> = g.order.iter().enumerate().map(|(i, o)| (*o, i)).collect();
    let y0 = *g
        .outputs
        .first()
        .ok_or_else(|| Error::msg("codegen: the model has no output"))?;
    let y0_stage = match g.values[y0].def {
        ValueDef::Result(op, _) => stage_of[&op],
        _ => {
            return Err(Error::named(
                g.name(y0),
                "codegen: the first output is not computed",
            ))
        }
    };
    // Stage op sets with duplicated side computations.
    let ns = specs.len();
    let mut builds: Vec<StageBuild> = Vec::with_capacity(ns);
    for s in 0..ns {
        let mut set: BTreeSet<usize> = g
            .order
            .iter()
            .filter(|o| stage_of[o] == s)
            .map(|o| pos[o])
            .collect();
        let mut work: Vec<usize> = set.iter().copied().collect();
        let mut inputs: Vec<Value> = Vec::new();
        let mut seen_in: HashSet<Value> = HashSet::new();
        while let Some(i) = work.pop() {
            let d = &g.ops[g.order[i]];
            for &v in d.inputs.iter().flatten() {
                if let ValueDef::Result(p, _) = g.values[v].def {
                    if set.contains(&pos[&p]) {
                        continue;
                    }
                    if side.contains(&p) {
                        set.insert(pos[&p]);
                        work.push(pos[&p]);
                    } else if seen_in.insert(v) {
                        inputs.push(v);
                    }
                }
            }
        }
        inputs.sort_by_key(|v| match g.values[*v].def {
            ValueDef::Result(p, k) => (pos[&p], k),
            _ => (0, 0),
        });
        let ops: Vec<Op> = set.iter().map(|i| g.order[*i]).collect();
        builds.push(StageBuild {
            ops,
            inputs,
            outputs: vec![],
        });
    }
    // Producers of cross values, and the forward modules. A side computation recomputed in a
    // stage may turn out not to lead to anything the stage computes (its forward module keeps
    // only what its outputs need); the values it would have read are then not received: drop
    // them and extract again, until every received value is read.
    let mut fwd_modules: Vec<Module>;
    loop {
        let mut consumers: BTreeMap<(usize, Value), Vec<usize>> = BTreeMap::new();
        for (s, bld) in builds.iter().enumerate() {
            for &v in &bld.inputs {
                let ValueDef::Result(p, _) = g.values[v].def else {
                    continue;
                };
                let ps = stage_of[&p];
                consumers.entry((ps, v)).or_default().push(s);
            }
        }
        for bld in &mut builds {
            bld.outputs.clear();
        }
        for ((ps, v), cs) in consumers {
            builds[ps].outputs.push((v, cs));
        }
        for bld in &mut builds {
            bld.outputs.sort_by_key(|(v, _)| match g.values[*v].def {
                ValueDef::Result(p, k) => (pos[&p], k),
                _ => (0, 0),
            });
        }
        fwd_modules = Vec::with_capacity(ns);
        for (s, bld) in builds.iter().enumerate() {
            let mut outs: Vec<Value> = bld.outputs.iter().map(|(v, _)| *v).collect();
            if s == y0_stage && !outs.contains(&y0) {
                outs.push(y0);
            }
            let fm = pieces::extract(m, &bld.ops, &outs, false, &format!("s{s}"))?;
            fwd_modules.push(fm);
        }
        let mut changed = false;
        for (bld, fm) in builds.iter_mut().zip(&fwd_modules) {
            let read: HashSet<&str> = fm.graph.inputs.iter().map(|&v| fm.graph.name(v)).collect();
            let before = bld.inputs.len();
            bld.inputs.retain(|&v| read.contains(g.name(v)));
            changed |= bld.inputs.len() != before;
        }
        if !changed {
            break;
        }
    }
    // Stage DAG order (consumers before producers for the backward).
    let mut preds: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); ns];
    for (s, bld) in builds.iter().enumerate() {
        for (_, cs) in &bld.outputs {
            for &c in cs {
                if c != s {
                    preds[c].insert(s);
                }
            }
        }
    }
    let topo = topo_order(&preds)?;
    Ok(Partition {
        batch_sym,
        micro_batches: nmb,
        stage_devices,
        replication,
        stage_of,
        y0,
        y0_stage,
        builds,
        fwd_modules,
        preds,
        topo,
    })
}

/// Every stage's pieces and program entry (step `stage-pieces`, guarantees 2 and 5 of the
/// module doc).
pub struct StagePieces {
    built: Vec<pieces::Pieces>,
    /// For a cross value v sent by s: consumer stages that send back a cotangent.
    cot_from: HashMap<(usize, Value), Vec<usize>>,
    /// Float initializers' types, by name.
    param_ty: HashMap<String, TensorType>,
    /// `(path relative to OUTDIR, module)` of every piece, in stage order.
    modules: Vec<(String, Module)>,
    stages: Vec<StageProgram>,
    /// Devices holding each trained parameter.
    holders: BTreeMap<String, Vec<usize>>,
}

impl StagePieces {
    /// Each stage's training module (forward, loss, backward), in stage order.
    pub fn training_modules(&self) -> impl Iterator<Item = &Module> {
        self.built.iter().map(|p| &p.training)
    }

    /// `(path relative to OUTDIR, module)` of every piece.
    pub fn modules(&self) -> &[(String, Module)] {
        &self.modules
    }
}

/// Step `stage-pieces`: per stage (consumers first), autodiff of its objective (the loss on the
/// first output's stage, the received cotangents elsewhere), the backward split in B and W
/// under a zero-bubble schedule, and the optimizer step of the parameters it holds.
pub fn stage_pieces(m: &Module, part: &Partition, opts: &CompileOptions) -> Result<StagePieces> {
    let g = &m.graph;
    let (b, mb) = (opts.micro_batch.batch(), opts.micro_batch.size());
    let Partition {
        stage_devices,
        replication,
        stage_of,
        y0,
        y0_stage,
        builds,
        fwd_modules,
        topo,
        ..
    } = part;
    let (y0, y0_stage) = (*y0, *y0_stage);
    let ns = builds.len();
    let size = |s: usize| opts.per_stage.as_ref().map_or(mb, |p| p.micro_batch[s]);
    // A received value gets a cotangent only if it depends on a trainable parameter: the
    // gradient of, say, a slice of a data input has no one to go to (its producer stage may
    // have no backward at all).
    let needs_grad = depends_on_parameters(m);
    // Pieces, consumers first.
    let mut built: Vec<Option<pieces::Pieces>> = (0..ns).map(|_| None).collect();
    // For a cross value v sent by s: consumer stages that send back a cotangent.
    let mut cot_from: HashMap<(usize, Value), Vec<usize>> = HashMap::new();
    // A slice's share of the mini-batch loss (module doc, 5.).
    let slices_per_mb = |s: usize| match (replication[s], &opts.loss) {
        (Replication::RoundRobin, _) | (_, LossKind::Sum) => 1.0,
        (Replication::Slices, _) => stage_devices[s].len() as f64,
    };
    let loss_scale = |s: usize| 1.0 / ((b / size(s)) as f64 * slices_per_mb(s));
    // The factor the loss is scaled by before differentiation: the mini-batch's share as above,
    // or, when every micro-batch is its own update (`pipedream-async`), the micro-batch's
    // (PipeDream's minibatch gradient).
    let grad_scale = |s: usize| {
        if opts.schedule.per_micro_batch_step() {
            1.0 / slices_per_mb(s)
        } else {
            loss_scale(s)
        }
    };
    for &s in topo.iter().rev() {
        let bld = &builds[s];
        let mut cots: Vec<(String, String)> = Vec::new();
        for (v, cs) in &bld.outputs {
            for &c in cs {
                let differentiates = built[c]
                    .as_ref()
                    .is_some_and(|p| p.input_grads.iter().any(|(x, _)| x == g.name(*v)));
                if differentiates {
                    cots.push((g.name(*v).to_string(), cot_name(g.name(*v), c)));
                    cot_from.entry((s, *v)).or_default().push(c);
                }
            }
        }
        let wrt: Vec<String> = bld
            .inputs
            .iter()
            .filter(|v| needs_grad.contains(*v))
            .map(|v| g.name(*v).to_string())
            .collect();
        let y0n = g.name(y0).to_string();
        let spec = pieces::TrainSpec {
            forward: &fwd_modules[s],
            loss: (s == y0_stage).then(|| (y0n.as_str(), &opts.loss, grad_scale(s))),
            cotangents: &cots,
            wrt: &wrt,
        };
        let p = pieces::stage_pieces(&spec, &format!("s{s}"))
            .map_err(|e| Error::msg(format!("stage {s}: {e}")))?;
        built[s] = Some(p);
    }
    let built: Vec<pieces::Pieces> = built.into_iter().flatten().collect();
    // Trainable parameters and their holders.
    let param_ty: HashMap<String, TensorType> = g
        .initializers
        .iter()
        .filter(|(_, t)| t.dtype.is_float())
        .map(|(v, _)| (g.name(*v).to_string(), g.ty(*v).clone()))
        .collect();
    let mut trainable: BTreeSet<String> = BTreeSet::new();
    for p in &built {
        for (pn, gn) in &p.param_grads {
            if gn != &format!("grad/{pn}") {
                return Err(Error::named(
                    gn,
                    format!("codegen: gradient of '{pn}' is not named 'grad/{pn}'"),
                ));
            }
            trainable.insert(pn.clone());
        }
    }
    let mut modules: Vec<(String, Module)> = Vec::new();
    let mut stages: Vec<StageProgram> = Vec::with_capacity(ns);
    let mut holders: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    // Parameters each stage's pieces read.
    let mut held_by: Vec<BTreeSet<String>> = built
        .iter()
        .map(|p| {
            std::iter::once(&p.fwd)
                .chain(p.bwd.as_ref())
                .flat_map(|md| md.graph.inputs.iter().map(|&v| md.graph.name(v)))
                .filter(|n| param_ty.contains_key(*n))
                .map(str::to_string)
                .collect()
        })
        .collect();
    // A parameter no piece reads (off the path to the loss and to every value a stage sends,
    // e.g. BERT's pooler when the loss reads only the last hidden state; or read by nothing):
    // it gets no gradient, so training leaves it unchanged, but the program still holds it —
    // in the stage of its first reader, else stage 0 — so the run returns every parameter and
    // `run --check` compares it with the reference like any other.
    for (v, t) in &g.initializers {
        let n = g.name(*v);
        if !t.dtype.is_float() || held_by.iter().any(|h| h.contains(n)) {
            continue;
        }
        let s = g
            .order
            .iter()
            .find(|o| g.ops[**o].inputs.contains(&Some(*v)))
            .map_or(0, |o| stage_of[o]);
        held_by[s].insert(n.to_string());
    }
    // Per device set: the parameters a step of a stage on it updates. Several chunks of one
    // device (interleaved 1F1B, ZB-V) may read one parameter (a tied embedding and LM head, an
    // unrolled RNN's weights): its gradients accumulate in the device's one buffer from every
    // chunk, and only the first chunk's step (steps run in stage order) updates it.
    let mut stepped: BTreeMap<Vec<usize>, BTreeSet<String>> = BTreeMap::new();
    for (s, (p, held)) in built.iter().zip(held_by).enumerate() {
        let on_devices = stepped.entry(stage_devices[s].clone()).or_default();
        let step_params: Vec<(String, TensorType)> = held
            .iter()
            .filter(|n| trainable.contains(*n) && on_devices.insert((*n).clone()))
            .map(|n| (n.clone(), param_ty[n].clone()))
            .collect();
        for (n, _) in &step_params {
            holders
                .entry(n.clone())
                .or_default()
                .extend(stage_devices[s].iter().copied());
        }
        let fwd_file = format!("stages/s{s}.fwd.onnx");
        let fwd = piece(&fwd_file, &p.fwd);
        modules.push((fwd_file, p.fwd.clone()));
        let bwd = match &p.bwd {
            Some(bm) => {
                let f = format!("stages/s{s}.bwd.onnx");
                let pc = piece(&f, bm);
                modules.push((f, bm.clone()));
                Some(pc)
            }
            None => None,
        };
        // The backward split in two when the schedule runs its parts apart (zero bubble):
        // input gradients (`bwd_b`) and parameter gradients (`bwd_w`).
        let (bwd_b, bwd_w) = match &p.bwd {
            // As the simulator: only a stage that sends input gradients upstream splits
            // (`StageGraph::splits_backward`).
            Some(bm)
                if opts.schedule.splits_backward()
                    && !p.param_grads.is_empty()
                    && !p.input_grads.is_empty() =>
            {
                let names: Vec<String> = p.param_grads.iter().map(|x| x.1.clone()).collect();
                let sp = pieces::split_backward(bm, &names, &format!("s{s}.bwd"))
                    .map_err(|e| Error::msg(format!("stage {s}: {e}")))?;
                if sp.w.graph.order.is_empty() {
                    (None, None)
                } else {
                    let (fb, fw) = (
                        format!("stages/s{s}.bwd_b.onnx"),
                        format!("stages/s{s}.bwd_w.onnx"),
                    );
                    let (pb, pw) = (piece(&fb, &sp.b), piece(&fw, &sp.w));
                    modules.push((fb, sp.b));
                    modules.push((fw, sp.w));
                    (Some(pb), Some(pw))
                }
            }
            _ => (None, None),
        };
        let (step, updates, state_init, step_counter) = if step_params.is_empty() {
            (None, vec![], vec![], None)
        } else {
            let sp = pieces::step_piece(&step_params, &opts.optimizer, m, &format!("s{s}.step"))?;
            let f = format!("stages/s{s}.step.onnx");
            let pc = piece(&f, &sp.module);
            modules.push((f, sp.module));
            (Some(pc), sp.updates, sp.state_init, sp.step_counter)
        };
        let loss = p.loss.as_ref().map(|l| {
            let f = match opts.loss {
                LossKind::Sum => 1.0,
                _ => loss_scale(s),
            };
            (l.clone(), f)
        });
        stages.push(StageProgram {
            id: s,
            devices: stage_devices[s].clone(),
            fwd,
            bwd,
            bwd_b,
            bwd_w,
            step,
            params: held.into_iter().collect(),
            updates,
            state_init,
            step_counter,
            loss,
        });
    }
    Ok(StagePieces {
        built,
        cot_from,
        param_ty,
        modules,
        stages,
        holders,
    })
}

/// The model's data inputs and the unpartitioned program (step `reference`).
pub struct Reference {
    data_inputs: Vec<DataInput>,
    program: ReferenceProgram,
    /// `reference/train.onnx` and `reference/step.onnx`.
    modules: Vec<(String, Module)>,
}

impl Reference {
    /// `(path relative to OUTDIR, module)` of the reference's pieces.
    pub fn modules(&self) -> &[(String, Module)] {
        &self.modules
    }
}

/// Step `reference`: the data inputs the program loads, and the reference program `run --check`
/// compares with (the whole model's training step on one device, the same loss scaling).
pub fn reference(
    m: &Module,
    part: &Partition,
    sp: &StagePieces,
    opts: &CompileOptions,
) -> Result<Reference> {
    let g = &m.graph;
    let b = opts.micro_batch.batch();
    let (batch_sym, nmb, y0) = (&part.batch_sym, part.micro_batches, part.y0);
    let param_ty = &sp.param_ty;
    let mut modules: Vec<(String, Module)> = Vec::new();
    // Data inputs.
    let mut data_inputs = Vec::new();
    let gather_tables = gather_index_bounds(m);
    for &v in &g.inputs {
        if g.initializers.contains_key(&v) {
            continue;
        }
        let ty = g.ty(v);
        let lay = layout(ty, batch_sym);
        data_inputs.push(DataInput {
            name: g.name(v).to_string(),
            dtype: ty.dtype.to_string(),
            shape: concrete_dims(ty, batch_sym, b),
            batch_axis: lay.batch_axis(),
            high: (!ty.dtype.is_float()).then(|| gather_tables.get(&v).copied().unwrap_or(2)),
        });
    }
    if let LossKind::CrossEntropy(label) = &opts.loss {
        if !data_inputs.iter().any(|d| &d.name == label) {
            let yt = g.ty(y0);
            let mut dims = concrete_dims(yt, batch_sym, b);
            let classes = dims.pop().unwrap_or(2);
            data_inputs.push(DataInput {
                name: label.clone(),
                dtype: DType::I64.to_string(),
                shape: dims,
                batch_axis: Some(0),
                high: Some(classes.max(1)),
            });
        }
    }
    // Reference program.
    let reference = {
        let all_ops: Vec<Op> = g.order.clone();
        let whole = pieces::extract(m, &all_ops, &[y0], false, "reference")?;
        let y0n = g.name(y0).to_string();
        let spec = pieces::TrainSpec {
            forward: &whole,
            loss: Some((
                y0n.as_str(),
                &opts.loss,
                if opts.schedule.per_micro_batch_step() {
                    1.0
                } else {
                    1.0 / nmb as f64
                },
            )),
            cotangents: &[],
            wrt: &[],
        };
        let p = pieces::stage_pieces(&spec, "reference")?;
        let t = &p.training;
        let mut outs: Vec<Value> = Vec::new();
        let names = t.graph.values_by_name();
        let loss_name = p.loss.clone().unwrap_or_default();
        outs.push(names[loss_name.as_str()]);
        let mut grads = Vec::new();
        for (pn, gn) in &p.param_grads {
            outs.push(names[gn.as_str()]);
            grads.push((gn.clone(), pn.clone()));
        }
        let train = pieces::extract(t, &t.graph.order, &outs, true, "reference.train")?;
        let rp: Vec<(String, TensorType)> = p
            .param_grads
            .iter()
            .map(|(pn, _)| (pn.clone(), param_ty[pn].clone()))
            .collect();
        let sp = pieces::step_piece(&rp, &opts.optimizer, m, "reference.step")?;
        let tf = "reference/train.onnx".to_string();
        let sf = "reference/step.onnx".to_string();
        let rprog = ReferenceProgram {
            train: piece(&tf, &train),
            step: piece(&sf, &sp.module),
            updates: sp.updates,
            state_init: sp.state_init,
            step_counter: sp.step_counter,
            loss: (
                loss_name,
                match opts.loss {
                    LossKind::Sum => 1.0,
                    _ => 1.0 / nmb as f64,
                },
            ),
            grads,
        };
        modules.push((tf, train));
        modules.push((sf, sp.module));
        rprog
    };
    Ok(Reference {
        data_inputs,
        program: reference,
        modules,
    })
}

/// Step `insert-comm` (guarantees 3 and 4 of the module doc): every device's instruction list —
/// receives, compute, sends, split/concat, accumulation, all-reduces and the step in the
/// schedule's order — and the program that holds them.
pub fn communicate(
    m: &Module,
    part: &Partition,
    sp: &StagePieces,
    refp: &Reference,
    opts: &CompileOptions,
) -> Result<Program> {
    let (b, mb) = (opts.micro_batch.batch(), opts.micro_batch.size());
    let nmb = part.micro_batches;
    let ns = part.len();
    let preds = &part.preds;
    let ctx = insert_comm::Context {
        m,
        batch_sym: &part.batch_sym,
        micro_batch: mb,
        micro_batches: nmb,
        schedule: opts.schedule,
        stage_devices: &part.stage_devices,
        preds,
        stage_outputs: part
            .builds
            .iter()
            .map(|b| b.outputs.iter().map(|(v, cs)| (*v, cs.clone())).collect())
            .collect(),
        stage_inputs: part.builds.iter().map(|b| b.inputs.clone()).collect(),
        cot_from: &sp.cot_from,
        stages: &sp.stages,
        data_inputs: &refp.data_inputs,
        replication: &part.replication,
        holders: &sp.holders,
        input_grads: sp.built.iter().map(|p| p.input_grads.clone()).collect(),
        param_grads: sp.built.iter().map(|p| p.param_grads.clone()).collect(),
        vertical_sync: opts.vertical_sync,
        pass_orders: opts.pass_orders.as_deref(),
        per_stage: opts.per_stage.as_ref().map(|ps| {
            // The simulator's warm-ups (Appendix A.1's in-flight samples) on the stage DAG.
            let mut succ = vec![Vec::new(); ns];
            for (c, ps_) in preds.iter().enumerate() {
                for &p in ps_ {
                    succ[p].push(c);
                }
            }
            insert_comm::PerStageOrder {
                micro_batch: ps.micro_batch.clone(),
                group: ps.group.iter().map(|&k| k.max(1) as usize).collect(),
                warmup: crate::sim::schedule::per_stage_warmups(&succ, ps),
            }
        }),
    };
    let devices = insert_comm::device_programs(&ctx)?;
    Ok(Program {
        version: PROGRAM_VERSION,
        model: opts.model_name.clone(),
        planner: opts.planner.clone(),
        schedule: opts.schedule.label(),
        batch: b,
        micro_batch: mb,
        micro_batches: nmb,
        loss: opts.loss.to_string(),
        optimizer: opts.optimizer_spec.clone(),
        data_inputs: refp.data_inputs.clone(),
        weights: "weights.npz".into(),
        stages: sp.stages.clone(),
        devices,
        reference: Some(refp.program.clone()),
        per_micro_batch_step: opts.schedule.per_micro_batch_step(),
        vertical_sync: opts.vertical_sync,
    })
}

/// Step `verify-program`: the schedule verifier ([`program::verify`]: every send has its
/// receive, no device waits forever, pieces exist, W after B, ...).
pub fn verify_program(program: &Program) -> Result<()> {
    program::verify(program)
        .map_err(|e| Error::msg(format!("codegen produced a bad schedule: {e}")))
}

/// The IR verifier on modules a step made (structure, dominance, types), as the pass manager
/// runs it after every step.
pub fn verify_modules<'a>(modules: impl IntoIterator<Item = (String, &'a Module)>) -> Result<()> {
    for (what, md) in modules {
        pipec_compiler::verify::verify(md)
            .map_err(|e| Error::msg(format!("codegen: {what} does not verify: {e}")))?;
    }
    Ok(())
}

/// The compiled program with its pieces (stage pieces, then the reference's) and the initial
/// weights.
pub fn finish(m: &Module, program: Program, sp: StagePieces, refp: Reference) -> Result<Compiled> {
    let g = &m.graph;
    let weights: Vec<(String, TensorData)> = g
        .initializers
        .iter()
        .filter(|(_, t)| t.dtype.is_float())
        .map(|(v, t)| (g.name(*v).to_string(), t.clone()))
        .collect();
    let mut modules = sp.modules;
    modules.extend(refp.modules);
    Ok(Compiled {
        program,
        modules,
        weights,
    })
}

/// Float values that depend on a float initializer (a trainable parameter), in the forward.
fn depends_on_parameters(m: &Module) -> HashSet<Value> {
    let g = &m.graph;
    let mut out: HashSet<Value> = g
        .initializers
        .iter()
        .filter(|(_, t)| t.dtype.is_float())
        .map(|(v, _)| *v)
        .collect();
    for &op in &g.order {
        let d = &g.ops[op];
        if d.inputs.iter().flatten().any(|v| out.contains(v)) {
            out.extend(
                d.outputs
                    .iter()
                    .copied()
                    .filter(|v| g.ty(*v).dtype.is_float()),
            );
        }
    }
    out
}

fn piece(file: &str, m: &Module) -> Piece {
    Piece {
        file: file.to_string(),
        inputs: m
            .graph
            .inputs
            .iter()
            .map(|v| m.graph.name(*v).to_string())
            .collect(),
        outputs: m
            .graph
            .outputs
            .iter()
            .map(|v| m.graph.name(*v).to_string())
            .collect(),
    }
}

/// A per-stage configuration must name every stage with a size that divides the mini-batch
/// over its replicas, and a stage whose size differs from the plan's must hold no op whose
/// result couples the samples of a micro-batch (batch statistics), since re-slicing would change
/// what it computes.
fn check_per_stage(
    m: &Module,
    specs: &[StageSpec],
    ps: &crate::sim::PerStage,
    batch: u64,
) -> Result<()> {
    if ps.micro_batch.len() != specs.len() || ps.group.len() != specs.len() {
        return Err(Error::msg(format!(
            "codegen: per-stage micro-batch sizes for {} stages, the plan has {}",
            ps.micro_batch.len(),
            specs.len()
        )));
    }
    let g = &m.graph;
    for (s, sp) in specs.iter().enumerate() {
        let (bs, r) = (ps.micro_batch[s], sp.devices.len().max(1) as u64);
        if bs == 0 || !batch.is_multiple_of(bs) || !bs.is_multiple_of(r) {
            return Err(Error::Usage(format!(
                "stage {s}: micro-batch {bs} must divide the batch {batch} and be a multiple of its {r} replicas"
            )));
        }
        if bs != ps.base_micro_batch {
            for &n in &sp.nodes {
                let Some(op) = g.order.get(n).map(|&o| &g.ops[o]) else {
                    continue;
                };
                if crate::plan::couples_samples(&op.op_type) {
                    return Err(Error::node(
                        &op.name,
                        &op.op_type,
                        format!(
                            "codegen: stage {s} runs micro-batches of {bs} (the plan's are {}): batch statistics would change; plan without gpp-per-stage",
                            ps.base_micro_batch
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Kahn order of the stage DAG (ties to the lower id).
fn topo_order(preds: &[BTreeSet<usize>]) -> Result<Vec<usize>> {
    let n = preds.len();
    let mut succ = vec![Vec::new(); n];
    for (s, ps) in preds.iter().enumerate() {
        for &p in ps {
            succ[p].push(s);
        }
    }
    pipec_compiler::topo::topo_order(n, |s| succ[s].iter().copied())
        .map_err(|_| Error::msg("codegen: the stage graph has a cycle (a stage is not convex)"))
}

/// For integer data inputs used as `Gather` indices: the size of the gathered axis (random
/// data must stay in range).
fn gather_index_bounds(m: &Module) -> HashMap<Value, i64> {
    let g = &m.graph;
    let mut out: HashMap<Value, i64> = HashMap::new();
    // Follow a few index-preserving ops (Cast, Reshape, Unsqueeze, Squeeze, Flatten) back to an input.
    let root = |mut v: Value| -> Value {
        for _ in 0..8 {
            match g.values[v].def {
                ValueDef::Result(p, _)
                    if matches!(
                        g.ops[p].op_type.as_str(),
                        "Cast" | "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" | "Identity"
                    ) =>
                {
                    match g.ops[p].inputs.first().copied().flatten() {
                        Some(u) => v = u,
                        None => break,
                    }
                }
                _ => break,
            }
        }
        v
    };
    for &op in &g.order {
        let d = &g.ops[op];
        if d.op_type != "Gather" {
            continue;
        }
        let (Some(Some(data)), Some(Some(idx))) = (d.inputs.first(), d.inputs.get(1)) else {
            continue;
        };
        let axis = d.int_attr("axis").unwrap_or(0);
        let Some(dims) = g.ty(*data).static_dims() else {
            continue;
        };
        let ax = if axis < 0 {
            axis + dims.len() as i64
        } else {
            axis
        };
        let Some(&n) = dims.get(ax as usize) else {
            continue;
        };
        let r = root(*idx);
        if matches!(g.values[r].def, ValueDef::Input(_)) {
            let e = out.entry(r).or_insert(n);
            *e = (*e).min(n);
        }
    }
    out
}
