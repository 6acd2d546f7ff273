//! Data-movement ops whose result shape comes from attributes or from (symbolically tracked)
//! operand values: `Reshape`, `Flatten`, `Transpose`, `Squeeze`, `Unsqueeze`, `Concat`, `Split`,
//! `Slice`, `Gather`, `GatherElements`, `GatherND`, `Scatter*`, `Expand`, `Shape`, `Size`,
//! `ConstantOfShape`, `Constant`, `Range`, `Pad`, `Tile`, `DepthToSpace`, `SpaceToDepth`.

use super::{fmt_dims, node::Node, Rule};
use crate::error::Result;
use crate::ir::{Attr, DType, Dim, TensorType};
use std::collections::HashMap;

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    r.insert("Reshape", reshape);
    r.insert("Flatten", flatten);
    r.insert("Transpose", transpose);
    r.insert("Squeeze", squeeze);
    r.insert("Unsqueeze", unsqueeze);
    r.insert("Concat", concat);
    r.insert("Split", split);
    r.insert("Slice", slice);
    r.insert("Gather", gather);
    r.insert("GatherElements", gather_elements);
    r.insert("GatherND", gather_nd);
    r.insert("ScatterND", same0);
    r.insert("ScatterElements", same0);
    r.insert("Scatter", same0);
    r.insert("Expand", expand);
    r.insert("Shape", shape);
    r.insert("Size", size);
    r.insert("ConstantOfShape", constant_of_shape);
    r.insert("Constant", constant);
    r.insert("Range", range);
    r.insert("Pad", pad);
    r.insert("Tile", tile);
    r.insert("DepthToSpace", depth_to_space);
    r.insert("SpaceToDepth", space_to_depth);
}

fn same0(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![n.ty(0)?.clone()])
}

/// `a + b` on dims where it is exact: known + known, equal symbolic terms (`b + b = 2*b`), `+0`.
pub(super) fn add_dims(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Known(x), Dim::Known(y)) => x.checked_add(*y).map(Dim::Known),
        (Dim::Known(0), o) | (o, Dim::Known(0)) => Some(o.clone()),
        (Dim::Sym(x), Dim::Sym(y)) if x.syms == y.syms => {
            let c = x.coeff.checked_add(y.coeff)?;
            Some(Dim::Sym(crate::ir::SymDim {
                coeff: c,
                syms: x.syms.clone(),
            }))
            .map(|d| if c == 0 { Dim::Known(0) } else { d })
        }
        _ => None,
    }
}

/// Normalized `(start, count)` of a `Slice` over an axis of known size `dim` (ONNX Slice:
/// negative indices count from the end, then clamp to `[0, dim]` (`[-1, dim-1]` for negative
/// steps)).
pub(super) fn slice_range(dim: i64, start: i64, end: i64, step: i64) -> (i64, i64) {
    let (d, s, e, st) = (dim as i128, start as i128, end as i128, step as i128);
    let norm = |v: i128| if v < 0 { v + d } else { v };
    if d <= 0 {
        return (0, 0);
    }
    if st > 0 {
        let s = norm(s).clamp(0, d);
        let e = norm(e).clamp(0, d);
        let len = if e > s { (e - s + st - 1) / st } else { 0 };
        (s as i64, len as i64)
    } else {
        let s = norm(s).clamp(0, d - 1);
        let e = norm(e).clamp(-1, d - 1);
        let len = if s > e {
            (s - e + (-st) - 1) / (-st)
        } else {
            0
        };
        (s as i64, len as i64)
    }
}

/// `Reshape(data, shape; allowzero)`: 0 copies the input dim (unless `allowzero`), one -1 is
/// inferred from the element count (symbolic division). The element counts must match.
fn reshape(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let target: Vec<Dim> = if n.input(1).is_some() {
        match n.value(1) {
            Some(v) => v,
            None => {
                // Rank from the shape operand's length, dims unknown.
                let len = n
                    .shape(1)?
                    .and_then(|s| s.first().and_then(|d| d.known()).filter(|_| s.len() == 1));
                return Ok(vec![match len {
                    Some(k) => TensorType::new(dt, n.fresh_shape(k)?),
                    None => TensorType::unranked(dt),
                }]);
            }
        }
    } else {
        // Reshape-1: `shape` attribute.
        n.ints_attr("shape")?
            .ok_or_else(|| n.err("missing shape input"))?
            .into_iter()
            .map(Dim::Known)
            .collect()
    };
    let allowzero = n.int_attr("allowzero", 0)? != 0;
    let input = n.shape(0)?;
    let mut out: Vec<Dim> = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, t) in target.iter().enumerate() {
        match t {
            Dim::Known(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err(n.err("shape has more than one -1"));
                }
                out.push(Dim::Known(-1));
            }
            Dim::Known(0) if !allowzero => {
                match input {
                    Some(s) => out.push(s.get(i).cloned().ok_or_else(|| {
                        n.err(format!("shape has 0 at {i} beyond the input rank"))
                    })?),
                    None => out.push(n.fresh(i)),
                }
            }
            Dim::Known(v) if *v < 0 => {
                return Err(n.err(format!("shape has a negative entry {v}")));
            }
            d => out.push(d.clone()),
        }
    }
    if allowzero && infer_at.is_some() && out.contains(&Dim::Known(0)) {
        return Err(n.err("shape has both 0 (allowzero) and -1"));
    }
    let Some(input) = input else {
        if let Some(i) = infer_at {
            out[i] = n.fresh(i);
        }
        return Ok(vec![TensorType::new(dt, out)]);
    };
    let total = n.product(input)?;
    match infer_at {
        Some(i) => {
            let mut rest = out.clone();
            rest.remove(i);
            let rest = n.product(&rest)?;
            out[i] = match total.div(&rest) {
                Some(d) => d,
                None => match (&total, &rest) {
                    (Dim::Known(a), Dim::Known(b)) => {
                        return Err(n.err(format!(
                            "cannot reshape {} ({a} elements) to {}: {a} is not a multiple of {b}",
                            fmt_dims(input),
                            fmt_dims(&target)
                        )))
                    }
                    _ => n.fresh(i),
                },
            };
        }
        None => {
            let got = n.product(&out)?;
            if let (Dim::Known(a), Dim::Known(b)) = (&total, &got) {
                if a != b {
                    return Err(n.err(format!(
                        "cannot reshape {} ({a} elements) to {} ({b} elements)",
                        fmt_dims(input),
                        fmt_dims(&out)
                    )));
                }
            }
        }
    }
    Ok(vec![TensorType::new(dt, out)])
}

/// `Flatten(axis=1)`: `[prod(d[..axis]), prod(d[axis..])]`, axis in `[-r, r]`.
fn flatten(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let a = n.int_attr("axis", 1)?;
    let r = s.len() as i64;
    if a < -r || a > r {
        return Err(n.err(format!("axis {a} is out of range for rank {r}")));
    }
    let a = if a < 0 { a + r } else { a } as usize;
    Ok(vec![TensorType::new(
        dt,
        vec![n.product(&s[..a])?, n.product(&s[a..])?],
    )])
}

/// `Transpose(perm)`: default reverses the dims.
fn transpose(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let perm = match n.ints_attr("perm")? {
        Some(p) => {
            if p.len() != s.len() {
                return Err(n.err(format!("perm {p:?} does not match rank {}", s.len())));
            }
            n.axes(&p, s.len())?
        }
        None => (0..s.len()).rev().collect(),
    };
    Ok(vec![TensorType::new(
        dt,
        perm.iter().map(|&p| s[p].clone()).collect(),
    )])
}

/// Axes of Squeeze/Unsqueeze/ReduceX: input 1 (opset 13+) or attribute `axes`.
/// `Ok(None)`: given as a non-constant input.
fn axes_operand(n: &Node, idx: usize) -> Result<Option<Option<Vec<i64>>>> {
    if n.input(idx).is_some() {
        return Ok(n.const_ints(idx).map(Some));
    }
    Ok(Some(n.ints_attr("axes")?))
}

/// `Squeeze(axes?)`: removes the listed dims (which must be 1), or all dims equal to 1.
fn squeeze(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let Some(axes) = axes_operand(n, 1)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    // An empty axes list squeezes every 1 like an absent one (onnxruntime does the same).
    let out = match axes.filter(|a| !a.is_empty()) {
        None => s.iter().filter(|d| **d != Dim::Known(1)).cloned().collect(),
        Some(a) => {
            let a = n.axes(&a, s.len())?;
            for &i in &a {
                if let Dim::Known(v) = s[i] {
                    if v != 1 {
                        return Err(n.err(format!("cannot squeeze axis {i} of size {v}")));
                    }
                }
            }
            s.iter()
                .enumerate()
                .filter(|(i, _)| !a.contains(i))
                .map(|(_, d)| d.clone())
                .collect()
        }
    };
    Ok(vec![TensorType::new(dt, out)])
}

/// `Unsqueeze(axes)`: inserts 1s at `axes` (normalized against the result rank).
fn unsqueeze(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let Some(axes) = axes_operand(n, 1)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let axes = axes.ok_or_else(|| n.err("axes are required"))?;
    let r = s.len() + axes.len();
    let a = n.axes(&axes, r)?;
    let mut it = s.iter();
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        if a.contains(&i) {
            out.push(Dim::Known(1));
        } else {
            out.push(it.next().cloned().unwrap_or(Dim::Known(1)));
        }
    }
    Ok(vec![TensorType::new(dt, out)])
}

/// `Concat(axis)`: equal ranks, other dims agree, the axis dims add up.
fn concat(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let mut shapes = Vec::new();
    for i in 0..n.num_inputs() {
        let Some(t) = n.opt_ty(i) else { continue };
        if t.dtype != dt {
            return Err(n.err(format!(
                "operand dtypes differ: {dt} (input 0) vs {} (input {i})",
                t.dtype
            )));
        }
        match &t.shape {
            Some(s) => shapes.push(s),
            None => return Ok(vec![TensorType::unranked(dt)]),
        }
    }
    let Some(first) = shapes.first() else {
        return Err(n.err("needs at least one input"));
    };
    let r = first.len();
    let ax = n.axis(
        n.opt_int_attr("axis")?
            .ok_or_else(|| n.err("attribute 'axis' is required"))?,
        r,
    )?;
    let mut out = first.to_vec();
    for (i, s) in shapes.iter().enumerate().skip(1) {
        if s.len() != r {
            return Err(n.err(format!(
                "input {i} has rank {} but input 0 has rank {r}",
                s.len()
            )));
        }
        for k in 0..r {
            if k == ax {
                out[k] = match (&out[k], &s[k]) {
                    (Dim::Known(a), Dim::Known(b)) => {
                        Dim::Known(a.checked_add(*b).ok_or_else(|| {
                            n.err(format!("concatenated size {a} + {b} overflows i64"))
                        })?)
                    }
                    (a, b) => add_dims(a, b).unwrap_or_else(|| n.fresh(k)),
                };
            } else {
                out[k] = match (&out[k], &s[k]) {
                    (Dim::Known(a), Dim::Known(b)) if a != b => {
                        return Err(
                            n.err(format!("input {i} has {b} at dim {k} but input 0 has {a}"))
                        )
                    }
                    (Dim::Known(a), _) | (_, Dim::Known(a)) => Dim::Known(*a),
                    (a, _) => a.clone(),
                };
            }
        }
    }
    Ok(vec![TensorType::new(dt, out)])
}

/// `Split(axis; split input (13+) / split attribute / num_outputs (18+))`.
fn split(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let k = n.num_outputs();
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt); k]);
    };
    let ax = n.axis(n.int_attr("axis", 0)?, s.len())?;
    let d = &s[ax];
    let sizes: Vec<Dim> = if n.input(1).is_some() {
        match n.value(1) {
            Some(v) => v,
            None => (0..k).map(|i| n.fresh(i)).collect(),
        }
    } else if let Some(v) = n.ints_attr("split")? {
        v.into_iter().map(Dim::Known).collect()
    } else {
        let parts = n.int_attr("num_outputs", k as i64)?;
        if parts < 1 || parts as usize != k {
            return Err(n.err(format!(
                "num_outputs {parts} does not match the {k} results"
            )));
        }
        match d {
            Dim::Known(v) => {
                let chunk = v / parts + i64::from(v % parts != 0);
                if n.data.attr("num_outputs").is_none() && v % parts != 0 {
                    return Err(n.err(format!("axis size {v} does not split evenly in {parts}")));
                }
                (0..parts)
                    .map(|i| {
                        Dim::Known(chunk.min(v.saturating_sub(chunk.saturating_mul(i)).max(0)))
                    })
                    .collect()
            }
            _ => {
                let c = d.div(&Dim::Known(parts)).unwrap_or_else(|| n.fresh(ax));
                vec![c; k]
            }
        }
    };
    if sizes.len() != k {
        return Err(n.err(format!(
            "split has {} sizes but the node has {k} results",
            sizes.len()
        )));
    }
    if let (Some(v), Dim::Known(total)) =
        (sizes.iter().map(Dim::known).collect::<Option<Vec<_>>>(), d)
    {
        let sum = v.iter().try_fold(0i64, |a, x| a.checked_add(*x));
        if sum != Some(*total) || v.iter().any(|x| *x < 0) {
            return Err(n.err(format!(
                "split sizes {v:?} do not add up to the axis size {total}"
            )));
        }
    }
    Ok(sizes
        .into_iter()
        .map(|sz| {
            let mut o = s.to_vec();
            o[ax] = sz;
            TensorType::new(dt, o)
        })
        .collect())
}

/// Starts/ends/axes/steps of a Slice (inputs from opset 10, attributes before).
pub(super) struct SliceArgs {
    pub starts: Vec<i64>,
    pub ends: Vec<i64>,
    pub axes: Vec<i64>,
    pub steps: Vec<i64>,
}

/// Read the Slice arguments; `Ok(None)` if some are not constant.
pub(super) fn slice_args(n: &Node) -> Result<Option<SliceArgs>> {
    let (starts, ends, axes, steps) = if n.input(1).is_some() {
        let (Some(st), Some(en)) = (n.const_ints(1), n.const_ints(2)) else {
            return Ok(None);
        };
        let axes = if n.input(3).is_some() {
            match n.const_ints(3) {
                Some(a) => Some(a),
                None => return Ok(None),
            }
        } else {
            None
        };
        let steps = if n.input(4).is_some() {
            match n.const_ints(4) {
                Some(a) => Some(a),
                None => return Ok(None),
            }
        } else {
            None
        };
        (st, en, axes, steps)
    } else {
        (
            n.ints_attr("starts")?
                .ok_or_else(|| n.err("starts are required"))?,
            n.ints_attr("ends")?
                .ok_or_else(|| n.err("ends are required"))?,
            n.ints_attr("axes")?,
            None,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(n.err(format!(
            "starts/ends/axes/steps lengths differ: {}/{}/{}/{}",
            starts.len(),
            ends.len(),
            axes.len(),
            steps.len()
        )));
    }
    if steps.contains(&0) {
        return Err(n.err("a step is 0"));
    }
    Ok(Some(SliceArgs {
        starts,
        ends,
        axes,
        steps,
    }))
}

/// `Slice(data, starts, ends, axes?, steps?)`.
fn slice(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let Some(a) = slice_args(n)? else {
        return symbolic_slice(n, dt, s);
    };
    let axes = n.axes(&a.axes, s.len())?;
    let mut out = s.to_vec();
    for (i, &ax) in axes.iter().enumerate() {
        let (st, en, sp) = (a.starts[i], a.ends[i], a.steps[i]);
        out[ax] = match &s[ax] {
            Dim::Known(d) => Dim::Known(slice_range(*d, st, en, sp).1),
            d => {
                if st == 0 && sp == 1 && en >= i32::MAX as i64 {
                    d.clone()
                } else {
                    n.fresh(ax)
                }
            }
        };
    }
    Ok(vec![TensorType::new(dt, out)])
}

/// Slice with non-constant starts/ends (opset 10+ inputs). With known axes and steps, only the
/// sliced axes change; `x[..., 0:e]` with a symbolic `e` (the `[:seq]` idiom of real exports)
/// gives `e`, assuming `e` is within the axis (the size is `min(e, dim)`); otherwise a fresh
/// symbol.
fn symbolic_slice(n: &Node, dt: DType, s: &[Dim]) -> Result<Vec<TensorType>> {
    let all_fresh = || TensorType::new(dt, (0..s.len()).map(|k| n.fresh(k)).collect());
    let axes = if n.input(3).is_some() {
        match n.const_ints(3) {
            Some(a) => a,
            None => return Ok(vec![all_fresh()]),
        }
    } else {
        let len = n.value(1).map(|v| v.len()).or_else(|| {
            n.opt_ty(1)
                .and_then(|t| t.shape.as_deref())
                .and_then(|sh| sh.first().and_then(Dim::known))
                .and_then(|k| usize::try_from(k).ok())
        });
        match len {
            Some(l) if l <= s.len() => (0..l as i64).collect(),
            _ => return Ok(vec![all_fresh()]),
        }
    };
    let axes = n.axes(&axes, s.len())?;
    let steps = if n.input(4).is_some() {
        n.const_ints(4)
    } else {
        Some(vec![1; axes.len()])
    };
    let (starts, ends) = (n.value(1), n.value(2));
    let mut out = s.to_vec();
    for (i, &ax) in axes.iter().enumerate() {
        let st = starts.as_ref().and_then(|v| v.get(i));
        let en = ends.as_ref().and_then(|v| v.get(i));
        let sp = steps.as_ref().and_then(|v| v.get(i)).copied();
        out[ax] = match (st, en, sp, &s[ax]) {
            (Some(Dim::Known(a)), Some(Dim::Known(b)), Some(c), Dim::Known(d)) if c != 0 => {
                Dim::Known(slice_range(*d, *a, *b, c).1)
            }
            (Some(Dim::Known(0)), Some(e), Some(1), d) if e == d => d.clone(),
            (Some(Dim::Known(0)), Some(e @ Dim::Sym(_)), Some(1), _)
                if !super::is_fresh_symbol(e) =>
            {
                e.clone()
            }
            _ => n.fresh(ax),
        };
    }
    Ok(vec![TensorType::new(dt, out)])
}

/// `Gather(data, indices; axis)`: `data[..axis] ++ indices ++ data[axis+1..]`.
fn gather(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let (Some(d), Some(ix)) = (n.shape(0)?, n.shape(1)?) else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let ax = n.axis(n.int_attr("axis", 0)?, d.len())?;
    if let (Dim::Known(size), Some(vals)) = (&d[ax], n.const_ints(1)) {
        if let Some(bad) = vals.iter().find(|v| **v < -size || **v >= *size) {
            return Err(n.err(format!(
                "index {bad} is out of range for axis {ax} of size {size}"
            )));
        }
    }
    let mut out = d[..ax].to_vec();
    out.extend(ix.iter().cloned());
    out.extend(d[ax + 1..].iter().cloned());
    Ok(vec![TensorType::new(dt, out)])
}

/// `GatherElements`: the shape of `indices`.
fn gather_elements(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![TensorType {
        dtype: n.dtype(0)?,
        shape: n.ty(1)?.shape.clone(),
    }])
}

/// `GatherND(data, indices; batch_dims=b)`: `indices[..-1] ++ data[b + indices[-1]..]`.
fn gather_nd(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let (Some(d), Some(ix)) = (n.shape(0)?, n.shape(1)?) else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let b = n.int_attr("batch_dims", 0)?;
    let Some(last) = ix.last() else {
        return Err(n.err("indices must have rank >= 1"));
    };
    let Dim::Known(k) = last else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let start = usize::try_from(b.checked_add(*k).unwrap_or(-1))
        .ok()
        .filter(|s| *s <= d.len() && b >= 0)
        .ok_or_else(|| {
            n.err(format!(
                "batch_dims {b} + {k} exceeds the data rank {}",
                d.len()
            ))
        })?;
    let mut out = ix[..ix.len() - 1].to_vec();
    out.extend(d[start..].iter().cloned());
    Ok(vec![TensorType::new(dt, out)])
}

/// `Expand(input, shape)`: broadcast of the input shape with `shape`.
fn expand(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let s = n.shape(0)?;
    match (s, n.value(1)) {
        (Some(s), Some(v)) => Ok(vec![TensorType::new(dt, n.broadcast(s, &v)?)]),
        (s, _) => {
            let k = n.shape(1)?.and_then(|x| x.first().and_then(Dim::known));
            Ok(vec![match (s, k) {
                (Some(s), Some(k)) => TensorType::new(dt, n.fresh_shape(k.max(s.len() as i64))?),
                _ => TensorType::unranked(dt),
            }])
        }
    }
}

/// Normalized `[start, end)` of `Shape(start, end)` (opset 15) for rank `r`.
pub(super) fn shape_range(n: &Node, r: usize) -> Result<(usize, usize)> {
    let ri = r as i64;
    let clamp =
        |v: i64| -> usize { (if v < 0 { v.saturating_add(ri) } else { v }).clamp(0, ri) as usize };
    let s = clamp(n.int_attr("start", 0)?);
    let e = clamp(n.int_attr("end", ri)?);
    Ok((s, e.max(s)))
}

/// `Shape(start?, end?)`: int64 `[end - start]`.
fn shape(n: &Node) -> Result<Vec<TensorType>> {
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::new(DType::I64, vec![n.fresh(0)])]);
    };
    let (a, b) = shape_range(n, s.len())?;
    Ok(vec![TensorType::known(DType::I64, &[(b - a) as i64])])
}

/// `Size`: int64 scalar.
fn size(n: &Node) -> Result<Vec<TensorType>> {
    n.ty(0)?;
    Ok(vec![TensorType::known(DType::I64, &[])])
}

/// `ConstantOfShape(shape; value)`: dims from the input's values, dtype of `value` (float32).
fn constant_of_shape(n: &Node) -> Result<Vec<TensorType>> {
    let dt = match n.data.attr("value") {
        Some(Attr::Tensor(t)) => t.dtype,
        Some(_) => return Err(n.err("attribute 'value' must be a tensor")),
        None => DType::F32,
    };
    if let Some(v) = n.value(0) {
        if let Some(bad) = v.iter().find(|d| d.known().is_some_and(|k| k < 0)) {
            return Err(n.err(format!("shape has a negative dim {bad}")));
        }
        return Ok(vec![TensorType::new(dt, v)]);
    }
    let k = n.shape(0)?.and_then(|s| s.first().and_then(Dim::known));
    Ok(vec![match k {
        Some(k) => TensorType::new(dt, n.fresh_shape(k)?),
        None => TensorType::unranked(dt),
    }])
}

/// `Constant`: type of whichever `value*` attribute is set.
fn constant(n: &Node) -> Result<Vec<TensorType>> {
    let a = &n.data.attrs;
    let ty = if let Some(Attr::Tensor(t)) = a.get("value") {
        TensorType::known(t.dtype, &t.dims)
    } else if a.contains_key("value_float") {
        TensorType::known(DType::F32, &[])
    } else if let Some(Attr::Floats(v)) = a.get("value_floats") {
        TensorType::known(DType::F32, &[v.len() as i64])
    } else if a.contains_key("value_int") {
        TensorType::known(DType::I64, &[])
    } else if let Some(Attr::Ints(v)) = a.get("value_ints") {
        TensorType::known(DType::I64, &[v.len() as i64])
    } else if a.contains_key("value_string") {
        TensorType::known(DType::String, &[])
    } else if let Some(Attr::Strings(v)) = a.get("value_strings") {
        TensorType::known(DType::String, &[v.len() as i64])
    } else if a.contains_key("sparse_value") {
        return Err(n.err("sparse_value constants are not supported"));
    } else {
        return Err(
            n.err("no value attribute (value, value_float(s), value_int(s), value_string(s))")
        );
    };
    Ok(vec![ty])
}

/// `Range(start, limit, delta)`: 1-D of `max(ceil((limit - start) / delta), 0)` elements.
fn range(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let one = |i: usize| {
        n.value(i)
            .and_then(|v| (v.len() == 1).then(|| v[0].clone()))
    };
    let len = if let (Some(s), Some(l), Some(d)) =
        (n.const_floats(0), n.const_floats(1), n.const_floats(2))
    {
        match (s.as_slice(), l.as_slice(), d.as_slice()) {
            ([s], [l], [d]) => {
                if *d == 0.0 {
                    return Err(n.err("delta is 0"));
                }
                let c = ((l - s) / d).ceil().max(0.0);
                if c > i64::MAX as f64 {
                    return Err(n.err("range length overflows i64"));
                }
                Dim::Known(c as i64)
            }
            _ => return Err(n.err("start, limit and delta must be scalars")),
        }
    } else {
        match (one(0), one(1), one(2)) {
            (Some(Dim::Known(0)), Some(l), Some(Dim::Known(1))) => l,
            _ => n.fresh(0),
        }
    };
    Ok(vec![TensorType::new(dt, vec![len])])
}

/// `Pad(data, pads, constant_value?, axes?)` (pads attribute before opset 11):
/// `out[i] = d[i] + pads[i] + pads[i + k]` over the padded axes.
fn pad(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let pads = if n.input(1).is_some() {
        n.const_ints(1)
    } else {
        n.ints_attr("pads")?
    };
    let Some(pads) = pads else {
        return Ok(vec![TensorType::new(
            dt,
            (0..s.len()).map(|k| n.fresh(k)).collect(),
        )]);
    };
    let axes: Vec<usize> = if n.input(3).is_some() {
        match n.const_ints(3) {
            Some(a) => n.axes(&a, s.len())?,
            None => {
                return Ok(vec![TensorType::new(
                    dt,
                    (0..s.len()).map(|k| n.fresh(k)).collect(),
                )])
            }
        }
    } else {
        (0..s.len()).collect()
    };
    let k = axes.len();
    if pads.len() != 2 * k {
        return Err(n.err(format!(
            "pads has {} values, expected {} (2 x {k} axes)",
            pads.len(),
            2 * k
        )));
    }
    let mut out = s.to_vec();
    for (i, &ax) in axes.iter().enumerate() {
        let add = pads[i]
            .checked_add(pads[i + k])
            .ok_or_else(|| n.err("pads overflow i64"))?;
        out[ax] = match &s[ax] {
            Dim::Known(d) => {
                let v = d
                    .checked_add(add)
                    .ok_or_else(|| n.err("pads overflow i64"))?;
                if v < 0 {
                    return Err(n.err(format!("axis {ax} of size {d} padded by {add} is negative")));
                }
                Dim::Known(v)
            }
            d if add == 0 => d.clone(),
            _ => n.fresh(ax),
        };
    }
    Ok(vec![TensorType::new(dt, out)])
}

/// `Tile(input, repeats)`: `out[i] = d[i] * repeats[i]`.
fn tile(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let Some(rep) = n.value(1) else {
        return Ok(vec![TensorType::new(
            dt,
            (0..s.len()).map(|k| n.fresh(k)).collect(),
        )]);
    };
    if rep.len() != s.len() {
        return Err(n.err(format!(
            "repeats has {} values but the input has rank {}",
            rep.len(),
            s.len()
        )));
    }
    let out = s
        .iter()
        .zip(&rep)
        .map(|(d, r)| n.mul(d, r))
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![TensorType::new(dt, out)])
}

fn block(n: &Node) -> Result<i64> {
    let b = n.int_attr("blocksize", 0)?;
    if b < 1 {
        return Err(n.err(format!("blocksize must be >= 1, got {b}")));
    }
    Ok(b)
}

/// `DepthToSpace(blocksize b)`: `[N, C/b², H*b, W*b]`.
fn depth_to_space(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let b = Dim::Known(block(n)?);
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    if s.len() != 4 {
        return Err(n.err(format!("input must be 4-D, got rank {}", s.len())));
    }
    let bb = n.mul(&b, &b)?;
    let c = s[1]
        .div(&bb)
        .ok_or_else(|| n.err(format!("channels {} are not a multiple of {bb}", s[1])))?;
    Ok(vec![TensorType::new(
        dt,
        vec![s[0].clone(), c, n.mul(&s[2], &b)?, n.mul(&s[3], &b)?],
    )])
}

/// `SpaceToDepth(blocksize b)`: `[N, C*b², H/b, W/b]`.
fn space_to_depth(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let b = Dim::Known(block(n)?);
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    if s.len() != 4 {
        return Err(n.err(format!("input must be 4-D, got rank {}", s.len())));
    }
    let bb = n.mul(&b, &b)?;
    let mut out = vec![s[0].clone(), n.mul(&s[1], &bb)?];
    for (k, d) in s[2..].iter().enumerate() {
        out.push(match d.div(&b) {
            Some(x) => x,
            None if d.known().is_some() => {
                return Err(n.err(format!("spatial dim {d} is not a multiple of {b}")))
            }
            None => n.fresh(k + 2),
        });
    }
    Ok(vec![TensorType::new(dt, out)])
}

#[cfg(test)]
mod tests {
    use super::super::testutil::T;
    use super::*;

    #[test]
    fn slice_ranges_match_numpy() {
        // (dim, start, end, step) -> (first index, count), from numpy slicing.
        let cases = [
            ((10, 0, 10, 1), 10),
            ((10, -3, 100, 1), 3),
            ((10, 2, -2, 3), 2),
            ((10, 9, -100, -1), 10),
            ((10, -1, 0, -2), 5),
            ((10, 100, 200, 1), 0),
            ((10, 5, 2, 1), 0),
            ((10, -100, 100, 4), 3),
            ((0, 0, 5, 1), 0),
            ((0, 0, -5, -1), 0),
            ((5, 4, -6, -1), 5),
            ((5, i64::MIN, i64::MAX, i64::MAX), 1),
        ];
        for ((d, s, e, st), want) in cases {
            assert_eq!(slice_range(d, s, e, st).1, want, "{d} {s} {e} {st}");
        }
    }

    #[test]
    fn dim_addition() {
        let b = Dim::sym("b");
        assert_eq!(add_dims(&b, &b).unwrap().to_string(), "2*b");
        assert_eq!(add_dims(&b, &Dim::Known(0)).unwrap(), b);
        assert_eq!(
            add_dims(&Dim::Known(2), &Dim::Known(3)).unwrap(),
            Dim::Known(5)
        );
        assert!(add_dims(&b, &Dim::Known(1)).is_none());
        assert!(add_dims(&Dim::Known(i64::MAX), &Dim::Known(1)).is_none());
        let neg = b.mul(&Dim::Known(-1)).unwrap();
        assert_eq!(add_dims(&b, &neg).unwrap(), Dim::Known(0));
    }

    #[test]
    fn reshape_rules() {
        let mut t = T::new();
        let x = t.input(DType::F32, "batch,6,4");
        let s = t.ints(&[-1, -1]);
        let op = t.op("Reshape", &[Some(x), Some(s)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("more than one -1"));
        let s = t.ints(&[0, 3, -1]);
        let op = t.op("Reshape", &[Some(x), Some(s)], &[], 1);
        assert_eq!(t.shapes(op, 18), ["batch,3,8"]);
        let s = t.ints(&[5, -1]);
        let op = t.op("Reshape", &[Some(x), Some(s)], &[], 1);
        // 24*batch / 5 is not exact: a fresh symbol, not an error (batch could be 5).
        assert!(t.shapes(op, 18)[0].starts_with("5,unk_"));
        // Shape operand not constant: rank from its length.
        let sh = t.input(DType::I64, "3");
        let op = t.op("Reshape", &[Some(x), Some(sh)], &[], 1);
        assert_eq!(t.shapes(op, 18)[0].split(',').count(), 3);
    }

    #[test]
    fn split_forms() {
        let mut t = T::new();
        let x = t.input(DType::F32, "batch,10");
        let op = t.op(
            "Split",
            &[Some(x)],
            &[("axis", Attr::Int(1)), ("num_outputs", Attr::Int(4))],
            4,
        );
        assert_eq!(
            t.shapes(op, 18),
            ["batch,3", "batch,3", "batch,3", "batch,1"]
        );
        let op = t.op("Split", &[Some(x)], &[("axis", Attr::Int(1))], 3);
        assert!(t.shapes(op, 13)[0].contains("does not split evenly"));
        let s = t.ints(&[4, 5]);
        let op = t.op("Split", &[Some(x), Some(s)], &[("axis", Attr::Int(1))], 2);
        assert!(t.shapes(op, 13)[0].contains("do not add up"));
        let op = t.op("Split", &[Some(x)], &[], 2);
        assert_eq!(t.shapes(op, 13)[0], format!("unk_{}_0,10", op.as_u32()));
    }

    #[test]
    fn squeeze_unsqueeze_errors() {
        let mut t = T::new();
        let x = t.input(DType::F32, "batch,3,1");
        let a = t.ints(&[1]);
        let op = t.op("Squeeze", &[Some(x), Some(a)], &[], 1);
        assert!(t.shapes(op, 13)[0].contains("cannot squeeze axis 1 of size 3"));
        let op = t.op("Squeeze", &[Some(x)], &[], 1);
        assert_eq!(t.shapes(op, 13), ["batch,3"]);
        let empty = t.ints(&[]);
        let op = t.op("Squeeze", &[Some(x), Some(empty)], &[], 1);
        assert_eq!(t.shapes(op, 13), ["batch,3"]);
        let a = t.ints(&[-1, 0]);
        let op = t.op("Unsqueeze", &[Some(x), Some(a)], &[], 1);
        assert_eq!(t.shapes(op, 13), ["1,batch,3,1,1"]);
        // Since opset 13 the axes are an operand: the schema's count refuses the op first.
        let op = t.op("Unsqueeze", &[Some(x)], &[], 1);
        assert!(t.shapes(op, 13)[0].contains("has 1 operand but Unsqueeze (opset 13) takes 2"));
    }

    #[test]
    fn pad_and_range() {
        let mut t = T::new();
        let x = t.input(DType::F32, "batch,4");
        let p = t.ints(&[0, -1, 0, -1]);
        let op = t.op("Pad", &[Some(x), Some(p)], &[], 1);
        assert_eq!(t.shapes(op, 18), ["batch,2"]);
        let p = t.ints(&[0, -3, 0, -3]);
        let op = t.op("Pad", &[Some(x), Some(p)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("negative"));
        let op = t.op(
            "Pad",
            &[Some(x)],
            &[("pads", Attr::Ints(vec![1, 1, 1, 1]))],
            1,
        );
        assert!(t.shapes(op, 2)[0].starts_with("unk_"));
        let (a, b, c) = (t.scalar(10), t.scalar(0), t.scalar(-3));
        let op = t.op("Range", &[Some(a), Some(b), Some(c)], &[], 1);
        assert_eq!(t.shapes(op, 18), ["4"]);
        let z = t.scalar(0);
        let op = t.op("Range", &[Some(a), Some(b), Some(z)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("delta is 0"));
    }
}

#[cfg(test)]
mod overflow_tests {
    use super::super::testutil::T;
    use crate::ir::{Attr, DType};

    #[test]
    fn split_sizes_that_overflow_are_an_error() {
        let mut t = T::new();
        let x = t.input(DType::F32, "b,10");
        let s = t.ints(&[i64::MAX, 1]);
        let op = t.op("Split", &[Some(x), Some(s)], &[("axis", Attr::Int(1))], 2);
        assert!(t.shapes(op, 18)[0].contains("do not add up"));
    }
}
