//! Stage pieces: the forward, backward and optimizer-step modules of one stage, and the
//! single-device reference program.
//!
//! A stage's **training module** is its forward ops (plus the cheap side computations it needs,
//! duplicated from other stages) closed by a scalar objective
//!
//! `J_s = c · loss(y0)  +  Σ_(v, u) sum(v ⊙ ḡ_{v,u})`
//!
//! where the first term exists on the stage that computes the model's first output `y0`
//! (`c` = `1/(M·r)` for mean losses, `1/M` for `sum`: a slice's share of the mini-batch loss, so
//! that every gradient of the step is a plain sum, [`crate::codegen`]) and the second has one
//! term per float value `v` the stage sends to a consumer stage `u` that differentiates it, with
//! `ḡ_{v,u}` the cotangent `u` sends back (graph input `cot/<v>/s<u>`). Then `∂J_s/∂θ` is exactly
//! the stage's share of the vector–Jacobian product of the whole model (the chain rule applied
//! across the stage boundary), and `∂J_s/∂x` for a received activation `x` is the cotangent to
//! send to its producer. [`crate::transforms::autodiff`] differentiates `J_s` (with respect to the
//! parameters and the received float activations). The second term is not built: its gradient
//! with respect to `v` is `ḡ_{v,u}`, which autodiff adds as a seed ([`Autodiff::seeds`]), so the
//! backward does not read the values the stage sends.
//!
//! The training module is then cut into two **pieces**: forward = the model's ops, the loss
//! ops that do not read a cotangent and the `Shape`/`Size` of forward values that the gradient
//! rules read; backward = everything else. Values the backward reads from the forward become
//! forward outputs (the saved activations); parameters become graph inputs of both pieces (the
//! runtime owns their values).

use crate::transforms::autodiff::builder::Builder;
use crate::transforms::autodiff::{differentiate, Autodiff};
use crate::transforms::loss::{add_loss, LossKind};
use crate::transforms::optimizer::{add_optimizer, Optimizer, OptimizerKind};
use pipec_compiler::ir::{Attr, Graph, Module, Op, TensorType, Value, ValueDef};
use pipec_compiler::{Error, Result};
use std::collections::{HashMap, HashSet};

/// Copy `ops` (in the given order) of `src` into a fresh module whose outputs are `outputs`.
/// Ops that do not contribute to an output are dropped. A value used but not defined by the
/// kept ops becomes a graph input (with its type), except initializers: float ones become graph
/// inputs when `params_as_inputs` (else they are copied), others are always copied. Graph inputs
/// come in order of first use, so the result is deterministic.
pub fn extract(
    src: &Module,
    ops: &[Op],
    outputs: &[Value],
    params_as_inputs: bool,
    name: &str,
) -> Result<Module> {
    let g = &src.graph;
    // Liveness from the outputs.
    let mut needed: HashSet<Value> = outputs.iter().copied().collect();
    let mut live = vec![false; ops.len()];
    for (i, &op) in ops.iter().enumerate().rev() {
        let d = &g.ops[op];
        if d.outputs.iter().any(|o| needed.contains(o)) {
            live[i] = true;
            needed.extend(d.inputs.iter().flatten().copied());
        }
    }
    let kept: Vec<Op> = ops
        .iter()
        .zip(&live)
        .filter(|(_, l)| **l)
        .map(|(o, _)| *o)
        .collect();
    let defined: HashSet<Value> = kept
        .iter()
        .flat_map(|o| g.ops[*o].outputs.iter().copied())
        .collect();
    let mut ng = Graph::new(name);
    let mut map: HashMap<Value, Value> = HashMap::new();
    let bring = |ng: &mut Graph, map: &mut HashMap<Value, Value>, v: Value| {
        if map.contains_key(&v) || defined.contains(&v) {
            return;
        }
        let vd = &g.values[v];
        let nv = match (&vd.def, g.initializers.get(&v)) {
            (ValueDef::Initializer, Some(t)) if !(params_as_inputs && t.dtype.is_float()) => {
                ng.add_initializer(vd.name.clone(), t.clone())
            }
            _ => ng.add_input(vd.name.clone(), vd.ty.clone()),
        };
        map.insert(v, nv);
    };
    for &op in &kept {
        for v in g.ops[op].inputs.iter().flatten() {
            bring(&mut ng, &mut map, *v);
        }
        let mut d = g.ops[op].clone();
        d.inputs = d.inputs.iter().map(|v| v.map(|v| map[&v])).collect();
        let results: Vec<(String, TensorType)> = g.ops[op]
            .outputs
            .iter()
            .map(|o| (g.values[*o].name.clone(), g.values[*o].ty.clone()))
            .collect();
        let (_, outs) = ng.add_op(d, results);
        for (o, n) in g.ops[op].outputs.iter().zip(outs) {
            map.insert(*o, n);
        }
    }
    for &v in outputs {
        bring(&mut ng, &mut map, v);
        ng.outputs.push(map[&v]);
    }
    Ok(Module {
        graph: ng,
        opset_imports: src.opset_imports.clone(),
        ir_version: src.ir_version.max(8),
        producer_name: "pipec".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        attrs: Default::default(),
    })
}

/// What a stage (or the reference) needs differentiated.
pub struct TrainSpec<'a> {
    /// The stage's forward module (parameters as initializers); outputs = the values it sends.
    pub forward: &'a Module,
    /// The model's first output `y0` if this stage computes the loss, with the loss and `c`.
    pub loss: Option<(&'a str, &'a LossKind, f64)>,
    /// `(sent value, cotangent input name)`: one term `sum(v ⊙ cot)` each (a seed of the backward).
    pub cotangents: &'a [(String, String)],
    /// Received float activations to differentiate with respect to.
    pub wrt: &'a [String],
}

/// The two pieces of a stage and what they produce.
#[derive(Clone, Debug)]
pub struct Pieces {
    pub fwd: Module,
    /// `None` when the objective is empty or nothing needs a gradient.
    pub bwd: Option<Module>,
    /// Name of the (unscaled) loss output of `fwd`, on the loss stage.
    pub loss: Option<String>,
    /// `(parameter, gradient output of bwd)`.
    pub param_grads: Vec<(String, String)>,
    /// `(received activation, gradient output of bwd)`.
    pub input_grads: Vec<(String, String)>,
    /// The whole training module (forward + objective + backward), for `--dump-ir`.
    pub training: Module,
}

/// Build the training module of a stage and cut it into its forward and backward pieces.
pub fn stage_pieces(spec: &TrainSpec, name: &str) -> Result<Pieces> {
    let mut t = spec.forward.clone();
    // A no-op on a module the CLI already lowered.
    crate::transforms::lower::lower(&mut t)?;
    let sent: Vec<Value> = t.graph.outputs.clone();
    let fwd_ops: HashSet<Op> = t.graph.order.iter().copied().collect();
    let by_name: HashMap<String, Value> = t
        .graph
        .values_by_name()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let value = |n: &str| -> Result<Value> {
        by_name
            .get(n)
            .copied()
            .ok_or_else(|| Error::named(n, format!("codegen: no such value in stage {name}")))
    };
    // Cotangent inputs first (before any builder reserves names).
    let mut cots = Vec::new();
    for (v, c) in spec.cotangents {
        let vv = value(v)?;
        let ty = t.graph.ty(vv).clone();
        cots.push((vv, t.graph.add_input(c.clone(), ty)));
    }
    let mut terms: Vec<Value> = Vec::new();
    let mut loss_value = None;
    if let Some((y0, kind, scale)) = spec.loss {
        let y = value(y0)?;
        t.graph.outputs = vec![y];
        let l = add_loss(&mut t, kind)?;
        pipec_compiler::shape::infer_shapes(&mut t)?;
        let dt = t.graph.ty(l).dtype;
        let mut b = Builder::new(&mut t.graph, "loss");
        b.prefix = "objective".into();
        let c = b.scalar(dt, scale)?;
        terms.push(b.mul(l, c));
        loss_value = Some(l);
    }
    let label = match spec.loss {
        Some((_, LossKind::CrossEntropy(l), _)) => Some(l.clone()),
        _ => None,
    };
    if terms.is_empty() && cots.is_empty() {
        // Nothing to differentiate: the forward piece is the whole stage.
        let mut outs = sent.clone();
        if let Some(l) = loss_value {
            outs.push(l);
        }
        let ops: Vec<Op> = t.graph.order.clone();
        let fwd = extract(&t, &ops, &outs, true, &format!("{name}.fwd"))?;
        return Ok(Pieces {
            fwd,
            bwd: None,
            loss: loss_value.map(|l| t.graph.name(l).to_string()),
            param_grads: vec![],
            input_grads: vec![],
            training: t,
        });
    }
    // The objective: the loss term, if this stage computes the loss; the cotangents of what the
    // stage sends seed its backward directly (`Autodiff::seeds`: the gradient of
    // `Σ sent ⊙ cotangent` without computing that product, so the backward does not read the
    // sent values).
    let total = {
        let mut b = Builder::new(&mut t.graph, "loss");
        b.prefix = "objective".into();
        if terms.is_empty() {
            let dt = b.dt(cots[0].1);
            terms.push(b.scalar(dt, 0.0)?);
        }
        let s = b.sum(&terms);
        let dt = b.dt(s);
        let o = b.op1("Identity", &[s], vec![], dt);
        let n = b.fresh("objective");
        b.g.values[o].name = n;
        o
    };
    let loss_ops: Vec<Op> = t
        .graph
        .order
        .iter()
        .copied()
        .filter(|o| !fwd_ops.contains(o))
        .collect();
    let mut outs = vec![total];
    outs.extend(loss_value);
    outs.extend(sent.iter().copied());
    t.graph.outputs = outs;
    let mut wrt: Vec<String> = spec.wrt.to_vec();
    if let Some(l) = &label {
        wrt.retain(|w| w != l);
    }
    let seeds = cots
        .iter()
        .map(|&(v, c)| (t.graph.name(v).to_string(), t.graph.name(c).to_string()))
        .collect();
    let ad = Autodiff {
        loss: None,
        wrt_inputs: true,
        wrt_only: Some(wrt.clone()),
        seeds,
    };
    let tg = differentiate(&mut t, &ad)?;
    // Forward piece: model ops, and the loss ops and `Shape`/`Size` ops (the shape of a
    // forward value, which the gradient rules read: the backward then holds a few integers
    // instead of the value) that read nothing of the backward. `tainted`: the cotangents and
    // every backward result.
    let mut tainted: HashSet<Value> = cots.iter().map(|c| c.1).collect();
    let mut fwd_list: Vec<Op> = Vec::new();
    let mut bwd_list: Vec<Op> = Vec::new();
    let loss_set: HashSet<Op> = loss_ops.iter().copied().collect();
    for &op in &t.graph.order {
        let d = &t.graph.ops[op];
        let forward = fwd_ops.contains(&op)
            || ((loss_set.contains(&op) || matches!(d.op_type.as_str(), "Shape" | "Size"))
                && !d.inputs.iter().flatten().any(|v| tainted.contains(v)));
        if forward {
            fwd_list.push(op);
        } else {
            tainted.extend(d.outputs.iter().copied());
            bwd_list.push(op);
        }
    }
    let g = &t.graph;
    let fwd_defined: HashSet<Value> = fwd_list
        .iter()
        .flat_map(|o| g.ops[*o].outputs.iter().copied())
        .collect();
    // Saved: forward results the backward reads.
    let mut saved: Vec<Value> = Vec::new();
    let mut seen: HashSet<Value> = HashSet::new();
    let bwd_grad_outputs: Vec<Value> = tg.grads.iter().map(|(_, gv)| *gv).collect();
    // Only ops that reach a gradient output count (the backward piece is DCE'd by extract).
    let mut needed: HashSet<Value> = bwd_grad_outputs.iter().copied().collect();
    for &op in bwd_list.iter().rev() {
        let d = &g.ops[op];
        if d.outputs.iter().any(|o| needed.contains(o)) {
            needed.extend(d.inputs.iter().flatten().copied());
        }
    }
    // A `Constant` the backward reads is emitted again in the backward piece instead: saved, it
    // would be a buffer per micro-batch in flight (an interpolation matrix, a mask) for a value
    // that never changes.
    let mut consts: Vec<Op> = Vec::new();
    for &op in &bwd_list {
        let d = &g.ops[op];
        if !d.outputs.iter().any(|o| needed.contains(o)) {
            continue;
        }
        for v in d.inputs.iter().flatten() {
            if fwd_defined.contains(v) && seen.insert(*v) {
                match g.values[*v].def {
                    ValueDef::Result(p, _)
                        if g.ops[p].op_type == "Constant" && g.ops[p].inputs.is_empty() =>
                    {
                        consts.push(p)
                    }
                    _ => saved.push(*v),
                }
            }
        }
    }
    let bwd_list: Vec<Op> = consts.into_iter().chain(bwd_list).collect();
    let mut f_outs: Vec<Value> = sent.clone();
    if let Some(l) = loss_value {
        f_outs.push(l);
    }
    for v in &saved {
        if !f_outs.contains(v) {
            f_outs.push(*v);
        }
    }
    let fwd = extract(&t, &fwd_list, &f_outs, true, &format!("{name}.fwd"))?;
    let mut param_grads = Vec::new();
    let mut input_grads = Vec::new();
    let input_names: HashSet<String> = spec
        .forward
        .graph
        .inputs
        .iter()
        .map(|v| spec.forward.graph.name(*v).to_string())
        .collect();
    for (p, gv) in &tg.grads {
        let (pn, gn) = (g.name(*p).to_string(), g.name(*gv).to_string());
        if input_names.contains(&pn) {
            input_grads.push((pn, gn));
        } else {
            param_grads.push((pn, gn));
        }
    }
    let bwd = if bwd_grad_outputs.is_empty() {
        None
    } else {
        Some(extract(
            &t,
            &bwd_list,
            &bwd_grad_outputs,
            true,
            &format!("{name}.bwd"),
        )?)
    };
    Ok(Pieces {
        fwd,
        bwd,
        loss: loss_value.map(|l| g.name(l).to_string()),
        param_grads: if bwd_grad_outputs.is_empty() {
            vec![]
        } else {
            param_grads
        },
        input_grads: if bwd_grad_outputs.is_empty() {
            vec![]
        } else {
            input_grads
        },
        training: t,
    })
}

/// The optimizer step of a set of parameters: graph inputs `P` and `grad/P` (the summed
/// gradient), plus the optimizer's state inputs; outputs `update/P` and the new state.
pub struct StepPiece {
    pub module: Module,
    /// `(output, buffer it replaces)`.
    pub updates: Vec<(String, String)>,
    /// `(state input, parameter it is shaped like)`.
    pub state_init: Vec<(String, String)>,
    pub step_counter: Option<String>,
}

/// Build the step piece for `params` (name, type), with [`crate::transforms::optimizer`] (one micro-batch:
/// the accumulation is done by the runtime).
pub fn step_piece(
    params: &[(String, TensorType)],
    kind: &OptimizerKind,
    opset: &Module,
    name: &str,
) -> Result<StepPiece> {
    let mut g = Graph::new(name);
    for (p, ty) in params {
        g.add_input(p.clone(), ty.clone());
    }
    for (p, ty) in params {
        g.add_input(format!("grad/{p}"), ty.clone());
    }
    let mut m = Module {
        graph: g,
        opset_imports: opset.opset_imports.clone(),
        ir_version: opset.ir_version.max(8),
        producer_name: "pipec".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        attrs: Default::default(),
    };
    let names: Vec<String> = params.iter().map(|p| p.0.clone()).collect();
    let grads: Vec<String> = names.iter().map(|p| format!("grad/{p}")).collect();
    m.attrs
        .insert("pipec.params".into(), Attr::Strings(names.clone()));
    m.attrs.insert("pipec.grads".into(), Attr::Strings(grads));
    add_optimizer(&mut m, &Optimizer::new(kind.clone(), 1))?;
    let state_in = match m.attrs.get("pipec.opt_inputs") {
        Some(Attr::Strings(v)) => v.clone(),
        _ => vec![],
    };
    let mut updates = Vec::new();
    for &o in &m.graph.outputs {
        let n = m.graph.name(o).to_string();
        if let Some(p) = n.strip_prefix("update/") {
            updates.push((n.clone(), p.to_string()));
        } else if let Some(s) = n.strip_suffix(".out") {
            updates.push((n.clone(), s.to_string()));
        } else {
            return Err(Error::named(
                &n,
                "codegen: unexpected optimizer output name",
            ));
        }
    }
    let mut state_init = Vec::new();
    let mut step_counter = None;
    for s in state_in {
        if s == "opt/step" {
            step_counter = Some(s);
            continue;
        }
        // `opt/<P>/<slot>`: shaped like P.
        let p = names
            .iter()
            .filter(|p| s.starts_with(&format!("opt/{p}/")))
            .max_by_key(|p| p.len())
            .ok_or_else(|| Error::named(&s, "codegen: optimizer state of no parameter"))?;
        state_init.push((s.clone(), p.clone()));
    }
    // The updated parameter names are the parameters themselves.
    for (o, p) in &updates {
        if o.starts_with("update/") && !names.contains(p) {
            return Err(Error::named(o, "codegen: update of an unknown parameter"));
        }
    }
    Ok(StepPiece {
        module: m,
        updates,
        state_init,
        step_counter,
    })
}

/// A stage's backward piece split in two for the zero-bubble schedules (Qi et al., "Zero Bubble
/// Pipeline Parallelism", 2023, §2: `B` computes the gradient with respect to the stage's input,
/// `W` the gradient with respect to its parameters), from the same autodiff output, so that a
/// schedule may run `W` later, in a bubble:
/// - `b`: the ops every input gradient needs; its outputs are the input gradients (what the stage
///   sends upstream), then the `carried` values that are not among them;
/// - `w`: the ops only parameter gradients need; its inputs are the backward's own inputs it reads
///   and the `carried` values; its outputs are the parameter gradients.
///
/// `carried` (in the backward's op order) is what `B` must keep alive for `W`: values `b`
/// computes that `w` reads (e.g. the cotangent at a matmul's output, which `W` multiplies by the
/// saved activation), and parameter gradients that `b` computes anyway. Running `b` then `w`
/// computes exactly what the backward does (the same ops on the same values), and no op runs in
/// both.
#[derive(Clone, Debug)]
pub struct BwSplit {
    pub b: Module,
    pub w: Module,
    pub carried: Vec<String>,
}

/// Split `bwd` (a backward piece of [`stage_pieces`]) into [`BwSplit`]: `param_grads` names its
/// parameter-gradient outputs; every other output is an input gradient.
pub fn split_backward(bwd: &Module, param_grads: &[String], name: &str) -> Result<BwSplit> {
    let g = &bwd.graph;
    let mut w_out = Vec::new();
    let mut b_out = Vec::new();
    for &v in &g.outputs {
        if param_grads.iter().any(|p| p == g.name(v)) {
            w_out.push(v);
        } else {
            b_out.push(v);
        }
    }
    if w_out.len() != param_grads.len() {
        let missing = param_grads
            .iter()
            .find(|p| !w_out.iter().any(|&v| g.name(v) == p.as_str()))
            .cloned()
            .unwrap_or_default();
        return Err(Error::named(
            missing,
            format!(
                "B/W split of '{}': not an output of the backward piece",
                g.name
            ),
        ));
    }
    // The ops each side needs (one backward sweep over a topological order).
    let needed_by = |outs: &[Value]| -> HashSet<Op> {
        let mut live: HashSet<Value> = outs.iter().copied().collect();
        let mut ops = HashSet::new();
        for &op in g.order.iter().rev() {
            let d = &g.ops[op];
            if d.outputs.iter().any(|v| live.contains(v)) {
                ops.insert(op);
                live.extend(d.inputs.iter().flatten().copied());
            }
        }
        ops
    };
    let b_ops = needed_by(&b_out);
    let w_all = needed_by(&w_out);
    let b_order: Vec<Op> = g
        .order
        .iter()
        .copied()
        .filter(|o| b_ops.contains(o))
        .collect();
    let w_order: Vec<Op> = g
        .order
        .iter()
        .copied()
        .filter(|o| w_all.contains(o) && !b_ops.contains(o))
        .collect();
    // Carried: values of B's ops that W's ops read, or that are parameter gradients.
    let w_reads: HashSet<Value> = w_order
        .iter()
        .flat_map(|o| g.ops[*o].inputs.iter().flatten().copied())
        .chain(w_out.iter().copied())
        .collect();
    let carried: Vec<Value> = b_order
        .iter()
        .flat_map(|o| g.ops[*o].outputs.iter().copied())
        .filter(|v| w_reads.contains(v))
        .collect();
    let mut b_all = b_out.clone();
    b_all.extend(carried.iter().copied().filter(|v| !b_out.contains(v)));
    let b = extract(bwd, &b_order, &b_all, false, &format!("{name}.B"))?;
    let w = extract(bwd, &w_order, &w_out, false, &format!("{name}.W"))?;
    Ok(BwSplit {
        b,
        w,
        carried: carried.iter().map(|&v| g.name(v).to_string()).collect(),
    })
}
