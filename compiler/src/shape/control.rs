//! Control flow: `Loop` and `If` (ONNX operator spec, Loop-16 and If-16). The result types come
//! from the subgraphs' declared output types; what a loop's iterations do to shapes is not
//! followed (the `lower` pass unrolls a loop with a static trip count into ops that infer).
//!
//! - `Loop(M, cond, v_initial...)`, body `(iter, cond, v...) -> (cond, v..., scan...)`: the
//!   loop-carried results keep the types of `v_initial` where the body leaves a carried value's
//!   declared type the same, else the element type only; scan outputs get one more (leading,
//!   unknown) dim than the body's declared scan value when that is ranked.
//! - `If(cond)`: the branches' declared output types where both agree, else the element type
//!   (then the rank, if both have the same rank).

use super::{node::Node, Rule};
use crate::error::Result;
use crate::ir::{Attr, Subgraph, TensorType, CAPTURES_ATTR};
use std::collections::HashMap;

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    r.insert("Loop", loop_op);
    r.insert("If", if_op);
}

fn subgraph<'a>(n: &Node<'a>, name: &str) -> Result<&'a Subgraph> {
    n.data
        .attrs
        .get(name)
        .and_then(Attr::as_graph)
        .ok_or_else(|| n.err(format!("has no subgraph attribute '{name}'")))
}

/// Number of ONNX operands (the captured ones excluded).
fn onnx_inputs(n: &Node) -> usize {
    let caps = n.data.int_attr(CAPTURES_ATTR).unwrap_or(0).max(0) as usize;
    n.data.inputs.len().saturating_sub(caps)
}

fn loop_op(n: &Node) -> Result<Vec<TensorType>> {
    let body = subgraph(n, "body")?;
    let b = &body.graph;
    let carried = onnx_inputs(n).saturating_sub(2);
    if body.formal != carried + 2 {
        return Err(n.err(format!(
            "the body has {} inputs for {carried} loop-carried values (2 + N expected)",
            body.formal
        )));
    }
    if b.outputs.len() < carried + 1 {
        return Err(n.err(format!(
            "the body has {} outputs for {carried} loop-carried values (1 + N + K expected)",
            b.outputs.len()
        )));
    }
    let mut out = Vec::new();
    for k in 0..carried {
        let init = n.ty(2 + k)?;
        let decl = b.ty(b.outputs[1 + k]);
        out.push(if decl.shape.is_some() && decl.shape == init.shape {
            init.clone()
        } else {
            TensorType::unranked(init.dtype)
        });
    }
    for &v in &b.outputs[1 + carried..] {
        let decl = b.ty(v);
        out.push(match &decl.shape {
            Some(s) => {
                let mut dims = vec![n.fresh(out.len())];
                dims.extend(s.iter().cloned());
                TensorType::new(decl.dtype, dims)
            }
            None => TensorType::unranked(decl.dtype),
        });
    }
    Ok(out)
}

fn if_op(n: &Node) -> Result<Vec<TensorType>> {
    let t = &subgraph(n, "then_branch")?.graph;
    let e = &subgraph(n, "else_branch")?.graph;
    if t.outputs.len() != e.outputs.len() {
        return Err(n.err(format!(
            "then_branch has {} outputs, else_branch {}",
            t.outputs.len(),
            e.outputs.len()
        )));
    }
    Ok(t.outputs
        .iter()
        .zip(&e.outputs)
        .enumerate()
        .map(|(k, (&a, &b))| {
            let (ta, tb) = (t.ty(a), e.ty(b));
            if ta == tb {
                return ta.clone();
            }
            match (&ta.shape, &tb.shape) {
                (Some(x), Some(y)) if x.len() == y.len() => {
                    let dims = x
                        .iter()
                        .zip(y)
                        .enumerate()
                        .map(|(i, (p, q))| {
                            if p == q {
                                p.clone()
                            } else {
                                n.fresh(k * 8 + i)
                            }
                        })
                        .collect();
                    TensorType::new(ta.dtype, dims)
                }
                _ => TensorType::unranked(ta.dtype),
            }
        })
        .collect())
}
