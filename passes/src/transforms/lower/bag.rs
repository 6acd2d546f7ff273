//! A `Loop` over equal-sized bags, rewritten without the loop: what `torch.nn.EmbeddingBag`
//! exports to for a 2-D input `[B, k]` (bags of `k` indices), whose trip count `B` is the
//! symbolic batch and so cannot be unrolled before the run.
//!
//! The exporter flattens the indices to `X: [N]` (`N = B·k`), builds the bag offsets
//! `Off = Concat(Range(0, N, k), [N])` and their ends `End = Slice(Off, 1, ∞)`, and loops
//! `i = 0..B` over the body
//!
//! ```text
//! s = Slice(X, [Off[i]], [End[i]], axes = [0])      // the indices of bag i
//! r = Reduce{Sum,Mean,Max}(Gather(W, s, axis = 0), axes = [0], keepdims = 0)
//! ```
//!
//! stacking the `r` into `[B, D]`. When every bag has exactly `k` indices (checked on the offsets
//! as written above, with `k` static and `N` a multiple of `k`), that is
//! `Reduce(Gather(W, Reshape(X, [-1, k])), axes = [1], keepdims = 0)`: the same numbers, ops that
//! have kernels and gradient rules, and no dependence on the batch. Ragged bags (a 1-D input with
//! an `offsets` input) do not match and the loop is refused as before.

use crate::transforms::autodiff::builder::Builder;
use pipec_compiler::ir::{Attr, Dim, Graph, OpData, Subgraph, Value};
use pipec_compiler::shape::SymbolicValues;

/// The replacement of the loop's one scan output, or `None` when the loop is not of this form.
/// `caps_in[j]` is the outer value the body's captured input `j` reads.
pub fn lower_bag_loop(
    b: &mut Builder,
    loop_op: &OpData,
    body: &Subgraph,
    caps_in: &[Value],
    vals: &SymbolicValues,
) -> Option<Vec<Value>> {
    let bg = &body.graph;
    // Only (iter, cond) in, (cond, one scan) out: no loop-carried values.
    if body.formal != 2 || bg.outputs.len() != 2 || loop_op.outputs.len() != 1 {
        return None;
    }
    let iter = bg.inputs[0];
    let outer = |v: Value| -> Option<Value> {
        let j = bg.inputs[body.formal..].iter().position(|&x| x == v)?;
        caps_in.get(j).copied()
    };
    let body_op = |v: Value, op_type: &str| -> Option<&OpData> {
        let d = &bg.ops[bg.producer(v)?];
        (d.domain.is_empty() && d.op_type == op_type).then_some(d)
    };
    // A constant of the body, or an outer constant the body captures.
    let body_ints = |v: Value| {
        bg.constant(v)
            .or_else(|| b.g.constant(outer(v)?))
            .and_then(|t| t.to_i64_vec())
    };

    // r = Reduce(Gather(W, s), axes = [0], keepdims = 0)
    let red = &bg.ops[bg.producer(bg.outputs[1])?];
    if !red.domain.is_empty()
        || !matches!(
            red.op_type.as_str(),
            "ReduceSum" | "ReduceMean" | "ReduceMax"
        )
        || red.int_attr("keepdims") != Some(0)
    {
        return None;
    }
    let axes_as_input = red.input(1).is_some();
    let axes = match red.input(1) {
        Some(a) => body_ints(a)?,
        None => red.ints_attr("axes")?.to_vec(),
    };
    if axes != [0] {
        return None;
    }
    let gather = body_op(red.input(0)?, "Gather")?;
    if gather.int_attr("axis").unwrap_or(0) != 0 {
        return None;
    }
    let w = outer(gather.input(0)?)?;
    // s = Slice(X, [Off[iter]], [End[iter]], axes = [0] (, steps = [1]))
    let slice = body_op(gather.input(1)?, "Slice")?;
    let x = outer(slice.input(0)?)?;
    if let Some(a) = slice.input(3) {
        if body_ints(a)? != [0] {
            return None;
        }
    }
    if let Some(s) = slice.input(4) {
        if body_ints(s)? != [1] {
            return None;
        }
    }
    let element = |v: Value| -> Option<Value> {
        let u = body_op(v, "Unsqueeze").or_else(|| body_op(v, "Reshape"))?;
        let g = body_op(u.input(0)?, "Gather")?;
        (g.int_attr("axis").unwrap_or(0) == 0 && g.input(1)? == iter)
            .then_some(())
            .and(outer(g.input(0)?))
    };
    let off = element(slice.input(1)?)?;
    let end = element(slice.input(2)?)?;

    // Outer side: X is [N]; Off = Concat(Range(0, N, k), T) with T = [N]; End = Slice(Off, 1, ∞).
    let g: &Graph = b.g;
    let outer_op = |v: Value, op_type: &str| -> Option<&OpData> {
        let d = &g.ops[g.producer(v)?];
        (d.domain.is_empty() && d.op_type == op_type).then_some(d)
    };
    let scalar = |v: Value| -> Option<Dim> {
        if let Some(t) = g.constant(v) {
            return match t.to_i64_vec()?.as_slice() {
                [x] => Some(Dim::Known(*x)),
                _ => None,
            };
        }
        match vals.get(v)? {
            [d] => Some(d.clone()),
            _ => None,
        }
    };
    let n = match g.ty(x).shape.as_deref() {
        Some([n]) => n.clone(),
        _ => return None,
    };
    let concat = outer_op(off, "Concat")?;
    if concat.int_attr("axis") != Some(0) || concat.inputs.len() != 2 {
        return None;
    }
    let range = outer_op(concat.input(0)?, "Range")?;
    let k = scalar(range.input(2)?)?.known()?;
    if k <= 0 || scalar(range.input(0)?)? != Dim::Known(0) || scalar(range.input(1)?)? != n {
        return None;
    }
    if scalar(concat.input(1)?)? != n {
        return None;
    }
    let divisible = match &n {
        Dim::Known(v) => v % k == 0,
        Dim::Sym(s) => s.coeff % k == 0,
    };
    if !divisible {
        return None;
    }
    let ends = outer_op(end, "Slice")?;
    let ints = |v: Value| g.constant(v).and_then(|t| t.to_i64_vec());
    let from_one = ends.input(0)? == off
        && ints(ends.input(1)?)? == [1]
        && ints(ends.input(2)?)?
            .first()
            .is_some_and(|&e| e >= i32::MAX as i64)
        && ends
            .input(3)
            .map_or(Some(true), |a| ints(a).map(|a| a == [0]))?
        && ends
            .input(4)
            .map_or(Some(true), |s| ints(s).map(|s| s == [1]))?;
    if !from_one {
        return None;
    }

    // Reduce(Gather(W, Reshape(X, [-1, k])), axes = [1], keepdims = 0)
    let bags = b.reshape(x, &[-1, k]);
    let dt = b.dt(w);
    let rows = b.op1("Gather", &[w, bags], vec![("axis", Attr::Int(0))], dt);
    let mut attrs: Vec<(&str, Attr)> = vec![("keepdims", Attr::Int(0))];
    let ins = if axes_as_input {
        vec![rows, b.ints(&[1])]
    } else {
        attrs.push(("axes", Attr::Ints(vec![1])));
        vec![rows]
    };
    Some(vec![b.op1(&red.op_type, &ins, attrs, dt)])
}
