//! `Loop` with a static trip count unrolled, `If` with a constant condition inlined (ONNX
//! operator spec, <https://onnx.ai/onnx/operators/onnx__Loop.html>,
//! <https://onnx.ai/onnx/operators/onnx__If.html>), so autodiff and the executor see straight-line
//! ops.
//!
//! `Loop(M, cond, v_initial...)` runs its body `(iter_num, cond_in, v_in...) -> (cond_out,
//! v_out..., scan...)` while `iter_num < M && cond`. It is unrolled when
//! - `M` is given and known: a constant, or a value shape inference computes (e.g.
//!   `Gather(Shape(offsets), 0)` once the inputs' shapes are static — what `nn.EmbeddingBag`
//!   exports to);
//! - `cond` is absent or constant true, and the body's `cond_out` is constant true or `cond_in`
//!   passed through (then the loop never exits early).
//!
//! Iteration `i` is a copy of the body with `iter_num = i`, `cond_in = true`, `v_in` the previous
//! iteration's `v_out` (`v_initial` first) and the captured outer values; the loop-carried
//! results are the last `v_out`, scan output `k` is the `Concat` along a new leading axis of the
//! iterations' values. `If(cond)` with `cond` constant (or computed by shape inference) is
//! replaced by a copy of the branch taken. Anything else is refused naming the node and why.

use crate::transforms::autodiff::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{
    Attr, DType, Graph, Op, OpData, Payload, Subgraph, TensorData, TensorType, Value, ValueDef,
    CAPTURES_ATTR,
};
use pipec_compiler::shape::SymbolicValues;
use pipec_compiler::Result;
use std::collections::HashMap;

/// Most ops one unrolled loop may add.
pub const MAX_UNROLLED_OPS: usize = 1 << 18;

/// Replacements of the op's results.
pub fn lower_control(b: &mut Builder, op: Op, vals: &SymbolicValues) -> Result<Vec<Value>> {
    let d = b.g.ops[op].clone();
    let err = |m: String| Error::node(&d.name, &d.op_type, format!("cannot lower: {m}"));
    let caps = d.int_attr(CAPTURES_ATTR).unwrap_or(0).max(0) as usize;
    let n_onnx = d
        .inputs
        .len()
        .checked_sub(caps)
        .ok_or_else(|| err("fewer operands than captured values".into()))?;
    let captured: Vec<Value> = d.inputs[n_onnx..]
        .iter()
        .map(|v| v.ok_or_else(|| err("a captured operand is missing".into())))
        .collect::<Result<_>>()?;
    let sub = |name: &str| -> Result<Subgraph> {
        d.attr(name)
            .and_then(Attr::as_graph)
            .cloned()
            .ok_or_else(|| err(format!("no subgraph attribute '{name}'")))
    };
    if d.op_type == "If" {
        let c = d
            .input(0)
            .ok_or_else(|| err("the condition is missing".into()))?;
        let cond = const_bool(b.g, c, vals, &|_| None).ok_or_else(|| {
            err(format!(
                "the condition '{}' is not a constant (only an If whose branch is known before the run is supported)",
                b.g.name(c)
            ))
        })?;
        let branch = sub(if cond { "then_branch" } else { "else_branch" })?;
        if branch.formal != 0 {
            return Err(err("a branch has formal inputs".into()));
        }
        let ins = captured_inputs(&branch, &captured, &err)?;
        return inline(
            b,
            &branch.graph,
            &ins,
            &format!("{}/{}", d.name, if cond { "then" } else { "else" }),
        );
    }
    // Loop.
    let body = sub("body")?;
    let carried = n_onnx.saturating_sub(2);
    if body.formal != carried + 2 || body.graph.outputs.len() < carried + 1 {
        return Err(err(format!(
            "the body has {} inputs and {} outputs for {carried} loop-carried values",
            body.formal,
            body.graph.outputs.len()
        )));
    }
    let m_val = d.input(0).ok_or_else(|| {
        err(
            "no trip count M (a while loop; only loops with a static trip count are unrolled)"
                .into(),
        )
    })?;
    let trips = const_int(b.g, m_val, vals);
    if let Some(c) = d.input(1) {
        match const_bool(b.g, c, vals, &|_| None) {
            Some(true) => {}
            Some(false) => {
                return Err(err(
                    "the initial condition is false (the loop never runs)".into()
                ))
            }
            None => {
                return Err(err(format!(
                    "the initial condition '{}' is not a constant",
                    b.g.name(c)
                )))
            }
        }
    }
    let bg = &body.graph;
    let cond_out = bg.outputs[0];
    let caps_in = captured_inputs(&body, &captured, &err)?;
    // Inside the body `cond_in` is true (the loop is running) and a captured value is the outer
    // value it reads.
    let outer = |v: Value| -> Option<bool> {
        if v == bg.inputs[1] {
            return Some(true);
        }
        let j = bg.inputs[body.formal..].iter().position(|&x| x == v)?;
        const_bool(b.g, caps_in[j], vals, &|_| None)
    };
    let keeps_running = const_bool(bg, cond_out, &SymbolicValues::default(), &outer) == Some(true);
    if !keeps_running {
        return Err(err(format!(
            "the body's condition output '{}' is computed from data (a loop that may exit early is not supported)",
            bg.name(cond_out)
        )));
    }
    let Some(trips) = trips else {
        // A loop over the bags of an EmbeddingBag needs no trip count: it is one Gather.
        if let Some(r) = super::bag::lower_bag_loop(b, &d, &body, &caps_in, vals) {
            return Ok(r);
        }
        return Err(err(format!(
            "the trip count M '{}' is not known before the run (give static input shapes, or it depends on data)",
            b.g.name(m_val)
        )));
    };
    if trips < 0 {
        return Err(err(format!("trip count {trips}")));
    }
    let scans = bg.outputs.len() - 1 - carried;
    if trips == 0 && scans > 0 {
        return Err(err(
            "a loop of 0 iterations with scan outputs (empty tensors) is not supported".into(),
        ));
    }
    let total = (trips as usize).saturating_mul(bg.order.len().max(1));
    if total > MAX_UNROLLED_OPS {
        return Err(err(format!(
            "unrolling {trips} iterations of {} ops exceeds {MAX_UNROLLED_OPS} ops",
            bg.order.len()
        )));
    }
    let mut state: Vec<Value> = d.inputs[2..n_onnx]
        .iter()
        .map(|v| v.ok_or_else(|| err("a loop-carried initial value is missing".into())))
        .collect::<Result<_>>()?;
    let t = TensorData {
        dtype: DType::Bool,
        dims: vec![],
        payload: Payload::Raw(vec![1u8].into()),
    };
    let yes = b.op1(
        "Constant",
        &[],
        vec![("value", Attr::Tensor(t))],
        DType::Bool,
    );
    let mut scan_vals: Vec<Vec<Value>> = vec![Vec::new(); scans];
    for i in 0..trips {
        let iter = b.constant(DType::I64, &[], &[i as f64])?;
        let mut ins = vec![iter, yes];
        ins.extend(&state);
        ins.extend(&caps_in);
        let outs = inline(b, bg, &ins, &format!("{}/iter{i}", d.name))?;
        state = outs[1..1 + carried].to_vec();
        for (k, &v) in outs[1 + carried..].iter().enumerate() {
            scan_vals[k].push(v);
        }
    }
    let mut results = state;
    for vs in scan_vals {
        let parts: Vec<Value> = vs.iter().map(|&v| b.unsqueeze(v, &[0])).collect();
        let dt = b.dt(parts[0]);
        results.push(if parts.len() == 1 {
            parts[0]
        } else {
            b.op1("Concat", &parts, vec![("axis", Attr::Int(0))], dt)
        });
    }
    Ok(results)
}

/// The outer values a subgraph's captured inputs read.
fn captured_inputs(
    sg: &Subgraph,
    captured: &[Value],
    err: &dyn Fn(String) -> Error,
) -> Result<Vec<Value>> {
    sg.captured
        .iter()
        .map(|&p| {
            captured
                .get(p)
                .copied()
                .ok_or_else(|| err(format!("captured operand {p} is missing")))
        })
        .collect()
}

/// Copy `sub`'s ops into `b`'s graph with `sub.inputs[i]` read as `inputs[i]`; returns the values
/// of `sub.outputs`. Node and value names get the prefix `tag/`.
fn inline(b: &mut Builder, sub: &Graph, inputs: &[Value], tag: &str) -> Result<Vec<Value>> {
    if inputs.len() != sub.inputs.len() {
        return Err(Error::msg(format!(
            "{tag}: {} inputs for a subgraph of {}",
            inputs.len(),
            sub.inputs.len()
        )));
    }
    let mut map: HashMap<Value, Value> = sub
        .inputs
        .iter()
        .copied()
        .zip(inputs.iter().copied())
        .collect();
    for (&v, t) in &sub.initializers {
        let c = b.op1(
            "Constant",
            &[],
            vec![("value", Attr::Tensor(t.clone()))],
            t.dtype,
        );
        let n = b.fresh(&format!("{tag}/{}", sub.name(v)));
        b.g.values[c].name = n;
        map.insert(v, c);
    }
    for &op in &sub.order {
        let od = &sub.ops[op];
        let inputs = od
            .inputs
            .iter()
            .map(|i| match i {
                None => Ok(None),
                Some(v) => map.get(v).copied().map(Some).ok_or_else(|| {
                    Error::node(&od.name, &od.op_type, "subgraph operand is not defined")
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        let name = b.fresh(&format!("{tag}/{}", od.name));
        let results: Vec<(String, TensorType)> = od
            .outputs
            .iter()
            .map(|&v| {
                (
                    b.fresh(&format!("{tag}/{}", sub.name(v))),
                    sub.ty(v).clone(),
                )
            })
            .collect();
        let (new_op, outs) = b.g.add_op(
            OpData {
                name,
                op_type: od.op_type.clone(),
                domain: od.domain.clone(),
                inputs,
                outputs: Vec::new(),
                attrs: od.attrs.clone(),
            },
            results,
        );
        b.made.push(new_op);
        b.origins.push(None);
        for (&o, n) in od.outputs.iter().zip(outs) {
            map.insert(o, n);
        }
    }
    sub.outputs
        .iter()
        .map(|v| {
            map.get(v)
                .copied()
                .ok_or_else(|| Error::named(sub.name(*v), "subgraph output is not defined"))
        })
        .collect()
}

/// The value of a scalar (or one-element) integer `v`, if known before the run.
fn const_int(g: &Graph, v: Value, vals: &SymbolicValues) -> Option<i64> {
    if let Some(t) = g.constant(v) {
        return match t.to_i64_vec()?.as_slice() {
            [x] => Some(*x),
            _ => None,
        };
    }
    match vals.get(v)? {
        [x] => x.known(),
        _ => None,
    }
}

/// The value of a scalar boolean `v`, if known: a constant, an integer shape inference knows, an
/// `Identity`/`Cast`/`Not` of one, or a graph input `input` knows.
fn const_bool(
    g: &Graph,
    v: Value,
    vals: &SymbolicValues,
    input: &dyn Fn(Value) -> Option<bool>,
) -> Option<bool> {
    if matches!(g.values[v].def, ValueDef::Input(_)) {
        return input(v);
    }
    if let Some(x) = const_int(g, v, vals) {
        return Some(x != 0);
    }
    if let Some(t) = g.constant(v) {
        let f = t.to_f64_vec()?;
        return match f.as_slice() {
            [x] => Some(*x != 0.0),
            _ => None,
        };
    }
    let op = g.producer(v)?;
    let d = &g.ops[op];
    if !d.domain.is_empty() {
        return None;
    }
    match d.op_type.as_str() {
        "Identity" | "Cast" => const_bool(g, d.input(0)?, vals, input),
        "Not" => const_bool(g, d.input(0)?, vals, input).map(|x| !x),
        _ => None,
    }
}
