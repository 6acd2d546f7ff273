//! Reductions: `Reduce{Mean,Sum,Max,Min,Prod,L1,L2,LogSum,LogSumExp,SumSquare}` (axes as an
//! attribute before opset 18 — 13 for ReduceSum — and as an optional input after; `keepdims`,
//! `noop_with_empty_axes`), `ArgMax`/`ArgMin` (int64), `TopK` (values + int64 indices).

use super::{node::Node, Rule};
use crate::error::Result;
use crate::ir::{DType, Dim, TensorType};
use std::collections::HashMap;

const REDUCE: &[&str] = &[
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
];

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    for op in REDUCE {
        r.insert(op, reduce);
    }
    r.insert("ArgMax", arg);
    r.insert("ArgMin", arg);
    r.insert("TopK", topk);
}

/// Result shape of reducing `s` over `axes` (all axes if empty).
fn reduce_shape(s: &[Dim], axes: &[usize], keep: bool) -> Vec<Dim> {
    let all = axes.is_empty();
    let mut out = Vec::with_capacity(s.len());
    for (i, d) in s.iter().enumerate() {
        if all || axes.contains(&i) {
            if keep {
                out.push(Dim::Known(1));
            }
        } else {
            out.push(d.clone());
        }
    }
    out
}

/// `Reduce*(data, axes?)`.
fn reduce(n: &Node) -> Result<Vec<TensorType>> {
    let t = n.ty(0)?;
    let keep = n.int_attr("keepdims", 1)? != 0;
    let noop = n.int_attr("noop_with_empty_axes", 0)? != 0;
    let Some(s) = &t.shape else {
        return Ok(vec![TensorType::unranked(t.dtype)]);
    };
    let axes: Vec<i64> = match n.input(1) {
        Some(_) => match n.const_ints(1) {
            Some(a) => a,
            None => {
                // Axes only known at run time.
                return Ok(vec![if keep {
                    TensorType::new(t.dtype, (0..s.len()).map(|k| n.fresh(k)).collect())
                } else {
                    TensorType::unranked(t.dtype)
                }]);
            }
        },
        None => n.ints_attr("axes")?.unwrap_or_default(),
    };
    if axes.is_empty() && noop {
        return Ok(vec![t.clone()]);
    }
    let axes = n.axes(&axes, s.len())?;
    Ok(vec![TensorType::new(t.dtype, reduce_shape(s, &axes, keep))])
}

/// `ArgMax` / `ArgMin(axis, keepdims)`: int64.
fn arg(n: &Node) -> Result<Vec<TensorType>> {
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(DType::I64)]);
    };
    let keep = n.int_attr("keepdims", 1)? != 0;
    let ax = n.axis(n.int_attr("axis", 0)?, s.len())?;
    Ok(vec![TensorType::new(
        DType::I64,
        reduce_shape(s, &[ax], keep),
    )])
}

/// `TopK(X, K; axis)`: values and int64 indices, dim `axis` replaced by K (attribute `k` before
/// opset 10).
fn topk(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![
            TensorType::unranked(dt),
            TensorType::unranked(DType::I64),
        ]);
    };
    let ax = n.axis(n.int_attr("axis", -1)?, s.len())?;
    let k = if n.input(1).is_some() {
        match n.value(1).as_deref() {
            Some([d]) => d.clone(),
            Some(v) => return Err(n.err(format!("K must have one element, got {}", v.len()))),
            None => n.fresh(ax),
        }
    } else {
        n.check_dim(
            n.opt_int_attr("k")?
                .ok_or_else(|| n.err("K is missing (input 1 or attribute 'k')"))?,
            "k",
        )?
    };
    if let (Dim::Known(kv), Dim::Known(sv)) = (&k, &s[ax]) {
        if kv > sv {
            return Err(n.err(format!("K = {kv} exceeds the axis size {sv}")));
        }
    }
    let mut out = s.to_vec();
    out[ax] = k;
    Ok(vec![
        TensorType::new(dt, out.clone()),
        TensorType::new(DType::I64, out),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::testutil::T;
    use super::*;
    use crate::ir::Attr;

    #[test]
    fn reductions() {
        let mut t = T::new();
        let x = t.input(DType::F32, "b,3,4");
        let op = t.op(
            "ReduceMax",
            &[Some(x)],
            &[("axes", Attr::Ints(vec![-1, 1]))],
            1,
        );
        assert_eq!(t.shapes(op, 13), ["b,1,1"]);
        let ax = t.ints(&[0]);
        let op = t.op(
            "ReduceL2",
            &[Some(x), Some(ax)],
            &[("keepdims", Attr::Int(0))],
            1,
        );
        assert_eq!(t.shapes(op, 18), ["3,4"]);
        let empty = t.ints(&[]);
        let op = t.op(
            "ReduceSum",
            &[Some(x), Some(empty)],
            &[("noop_with_empty_axes", Attr::Int(1))],
            1,
        );
        assert_eq!(t.shapes(op, 18), ["b,3,4"]);
        let op = t.op(
            "ReduceSum",
            &[Some(x), Some(empty)],
            &[("keepdims", Attr::Int(0))],
            1,
        );
        assert_eq!(t.shapes(op, 18), [""]);
        let dyn_axes = t.input(DType::I64, "1");
        let op = t.op("ReduceMean", &[Some(x), Some(dyn_axes)], &[], 1);
        assert_eq!(t.shapes(op, 18)[0].split(',').count(), 3);
        let op = t.op(
            "ReduceMean",
            &[Some(x)],
            &[("axes", Attr::Ints(vec![3]))],
            1,
        );
        assert!(t.shapes(op, 13)[0].contains("axis 3 is out of range"));
    }

    #[test]
    fn arg_and_topk() {
        let mut t = T::new();
        let x = t.input(DType::F32, "b,3,4");
        let op = t.op("ArgMin", &[Some(x)], &[("axis", Attr::Int(1))], 1);
        let ty = t.infer(op, 18).unwrap();
        assert_eq!(ty[0].dtype, DType::I64);
        assert_eq!(super::super::testutil::show(&ty[0]), "b,1,4");
        let k = t.ints(&[5]);
        let op = t.op("TopK", &[Some(x), Some(k)], &[], 2);
        assert!(t.shapes(op, 18)[0].contains("exceeds the axis size 4"));
        let op = t.op(
            "TopK",
            &[Some(x)],
            &[("k", Attr::Int(2)), ("axis", Attr::Int(1))],
            2,
        );
        assert_eq!(t.shapes(op, 1), ["b,2,4", "b,2,4"]);
    }
}
