//! The op implementations of the evaluator, dispatched on the ONNX op type. Each function reads
//! its operands from the [`Cx`], computes the result shape first (checking the size cap before
//! allocating), then the data.

use super::tensor::{
    broadcast_index, broadcast_shapes, capped_numel, dims_from_i64, elem_size, for_each_index,
    norm_axis, strides, Num, Tensor,
};
use super::{Cx, Fail, R};
use crate::ir::{Attr, DType, Payload, TensorData};
use bytes::Bytes;

/// Evaluate the op of `cx`.
pub(crate) fn eval(cx: &Cx) -> R<Vec<TensorData>> {
    let one = |t: Tensor| Ok(vec![t.into_data()]);
    match cx.op.op_type.as_str() {
        "Constant" => constant(cx).map(|t| vec![t]),
        "Identity" => one(cx.input(0)?),
        "Cast" => one(cast(cx)?),
        "Shape" => one(shape(cx)?),
        "Size" => one(size(cx)?),
        "Gather" => one(gather(cx)?),
        "Unsqueeze" => one(unsqueeze(cx)?),
        "Squeeze" => one(squeeze(cx)?),
        "Concat" => one(concat(cx)?),
        "Slice" => one(slice(cx)?),
        "Reshape" => one(reshape(cx)?),
        "Flatten" => one(flatten(cx)?),
        "Transpose" => one(transpose(cx)?),
        "Expand" => one(expand(cx)?),
        "Tile" => one(tile(cx)?),
        "ConstantOfShape" => one(constant_of_shape(cx)?),
        "Range" => one(range(cx)?),
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => one(compare(cx)?),
        "And" | "Or" | "Xor" => one(logical(cx)?),
        "Not" => one(not(cx)?),
        "Where" => one(where_(cx)?),
        "Add" | "Sub" | "Mul" | "Div" | "Mod" | "Pow" => one(arith(cx)?),
        "Min" | "Max" => one(min_max(cx)?),
        "Neg" | "Abs" | "Sqrt" => one(unary(cx)?),
        "ReduceProd" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceMean" => one(reduce(cx)?),
        "Trilu" => one(trilu(cx)?),
        "CumSum" => one(cumsum(cx)?),
        "Split" => Ok(split(cx)?.into_iter().map(Tensor::into_data).collect()),
        _ => Err(Fail::Unsupported),
    }
}

// ---------------------------------------------------------------------------------------------
// Constants, casts, shapes

/// `Constant`: the one `value*` attribute it carries, as a tensor.
fn constant(cx: &Cx) -> R<TensorData> {
    let a = &cx.op.attrs;
    if let Some(Attr::Tensor(t)) = a.get("value") {
        return Ok(t.clone());
    }
    if let Some(v) = a.get("value_float").and_then(Attr::as_float) {
        return Ok(TensorData::from_f32(vec![], &[v]));
    }
    if let Some(Attr::Floats(v)) = a.get("value_floats") {
        return Ok(TensorData::from_f32(vec![v.len() as i64], v));
    }
    if let Some(v) = a.get("value_int").and_then(Attr::as_int) {
        return Ok(TensorData::from_i64(vec![], &[v]));
    }
    if let Some(Attr::Ints(v)) = a.get("value_ints") {
        return Ok(TensorData::from_i64(vec![v.len() as i64], v));
    }
    let strings = |dims: Vec<i64>, v: &[String]| TensorData {
        dtype: DType::String,
        dims,
        payload: Payload::Strings(v.iter().map(|s| Bytes::from(s.clone())).collect()),
    };
    if let Some(Attr::String(s)) = a.get("value_string") {
        return Ok(strings(vec![], std::slice::from_ref(s)));
    }
    if let Some(Attr::Strings(v)) = a.get("value_strings") {
        return Ok(strings(vec![v.len() as i64], v));
    }
    // `sparse_value` (not representable as an IR attribute) or a malformed Constant.
    Err(Fail::Unsupported)
}

/// `Cast` (`to` attribute): see [`Tensor::from_num`] for the conversion rules.
fn cast(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let code = cx
        .op
        .int_attr("to")
        .ok_or_else(|| Fail::invalid("missing attribute 'to'"))?;
    let to = i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx)
        .ok_or_else(|| Fail::invalid(format!("'to' = {code} is not an ONNX element type")))?;
    if to == x.dtype {
        return Ok(x);
    }
    Tensor::from_num(to, x.dims.clone(), &x.num()?)
}

/// Static dims of operand `i`, from its data or else its type (entries `None` where symbolic).
fn operand_dims(cx: &Cx, i: usize) -> R<Vec<Option<i64>>> {
    if let Some(t) = cx.data(i) {
        return Ok(t.dims.iter().map(|d| Some(*d)).collect());
    }
    let ty = cx.ty(i).ok_or(Fail::Unsupported)?;
    let shape = ty.shape.as_ref().ok_or(Fail::Unsupported)?;
    Ok(shape.iter().map(|d| d.known()).collect())
}

/// `Shape` (with the `start`/`end` attributes of opset 15): needs only the selected dims static.
fn shape(cx: &Cx) -> R<Tensor> {
    let dims = operand_dims(cx, 0)?;
    let r = dims.len() as i64;
    let clamp = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) } as usize;
    let start = clamp(cx.int_attr("start", 0));
    let end = clamp(cx.int_attr("end", r));
    let sel = dims.get(start..end.max(start)).unwrap_or(&[]);
    let vals = sel
        .iter()
        .map(|d| d.ok_or(Fail::Unsupported))
        .collect::<R<Vec<i64>>>()?;
    Ok(Tensor::from_i64s(vec![vals.len()], &vals))
}

/// `Size`: element count of a statically shaped operand.
fn size(cx: &Cx) -> R<Tensor> {
    let dims = operand_dims(cx, 0)?;
    let n = dims.iter().try_fold(1i64, |acc, d| {
        d.and_then(|d| acc.checked_mul(d)).ok_or(Fail::Unsupported)
    })?;
    Ok(Tensor::from_i64s(vec![], &[n]))
}

// ---------------------------------------------------------------------------------------------
// Data movement

/// Product of a dims slice.
fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

/// `Gather` along `axis` (negative indices count from the end; out of range is an error).
fn gather(cx: &Cx) -> R<Tensor> {
    let data = cx.input(0)?;
    let ind = cx.input(1)?;
    let r = data.rank();
    if r == 0 {
        return Err(Fail::invalid("Gather of a scalar"));
    }
    let axis = norm_axis(cx.int_attr("axis", 0), r)?;
    let n = data.dims[axis];
    let indices = ind
        .ints("indices")?
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + n as i64 } else { i };
            if j < 0 || j >= n as i64 {
                Err(Fail::invalid(format!(
                    "index {i} is out of range for axis {axis} of size {n}"
                )))
            } else {
                Ok(j as usize)
            }
        })
        .collect::<R<Vec<usize>>>()?;
    let mut out_dims = data.dims[..axis].to_vec();
    out_dims.extend_from_slice(&ind.dims);
    out_dims.extend_from_slice(&data.dims[axis + 1..]);
    capped_numel(&out_dims)?;
    let outer = prod(&data.dims[..axis]);
    let inner = prod(&data.dims[axis + 1..]);
    let mut idx = Vec::new();
    for o in 0..outer {
        for &j in &indices {
            idx.extend((0..inner).map(|k| (o * n + j) * inner + k));
        }
    }
    data.take(&idx, out_dims)
}

/// `Unsqueeze` (axes attribute before opset 13, operand after).
fn unsqueeze(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let axes = cx
        .ints_arg(1, "axes")?
        .ok_or_else(|| Fail::invalid("missing axes"))?;
    let out_rank = x.rank() + axes.len();
    let mut is_new = vec![false; out_rank];
    for a in axes {
        let a = norm_axis(a, out_rank)?;
        if std::mem::replace(&mut is_new[a], true) {
            return Err(Fail::invalid(format!("axis {a} is repeated")));
        }
    }
    let mut rest = x.dims.iter();
    let dims = is_new
        .iter()
        .map(|n| {
            if *n {
                1
            } else {
                rest.next().copied().unwrap_or(1)
            }
        })
        .collect();
    Ok(x.reshaped(dims))
}

/// `Squeeze`: the listed axes (which must have size 1), or every size-1 axis.
fn squeeze(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let r = x.rank();
    let drop: Vec<bool> = match cx.ints_arg(1, "axes")? {
        Some(axes) => {
            let mut drop = vec![false; r];
            for a in axes {
                let a = norm_axis(a, r)?;
                if x.dims[a] != 1 {
                    return Err(Fail::invalid(format!(
                        "cannot squeeze axis {a} of size {}",
                        x.dims[a]
                    )));
                }
                drop[a] = true;
            }
            drop
        }
        None => x.dims.iter().map(|d| *d == 1).collect(),
    };
    let dims = x
        .dims
        .iter()
        .zip(&drop)
        .filter(|(_, d)| !**d)
        .map(|(x, _)| *x)
        .collect();
    Ok(x.reshaped(dims))
}

/// `Concat` along `axis`.
fn concat(cx: &Cx) -> R<Tensor> {
    let xs = cx.all_inputs()?;
    let first = xs
        .first()
        .ok_or_else(|| Fail::invalid("Concat of nothing"))?;
    let r = first.rank();
    let axis = norm_axis(
        cx.op
            .int_attr("axis")
            .ok_or_else(|| Fail::invalid("missing attribute 'axis'"))?,
        r,
    )?;
    let mut out_dims = first.dims.clone();
    out_dims[axis] = 0;
    for x in &xs {
        let same = x.rank() == r
            && x.dtype == first.dtype
            && (0..r).all(|a| a == axis || x.dims[a] == first.dims[a]);
        if !same {
            return Err(Fail::invalid(format!(
                "operand {} {:?} does not match {} {:?} outside axis {axis}",
                x.dtype, x.dims, first.dtype, first.dims
            )));
        }
        out_dims[axis] += x.dims[axis];
    }
    capped_numel(&out_dims)?;
    let size = elem_size(first.dtype)?;
    let outer = prod(&first.dims[..axis]);
    let mut data = Vec::new();
    for o in 0..outer {
        for x in &xs {
            let chunk = prod(&x.dims[axis..]) * size;
            data.extend_from_slice(&x.data[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(Tensor {
        dtype: first.dtype,
        dims: out_dims,
        data,
    })
}

/// `Slice` (attributes before opset 10, operands after), with ONNX's clamping rules.
fn slice(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let r = x.rank();
    let (starts, ends, axes, steps) = if cx.opset < 10 {
        let attr = |n: &str| cx.op.ints_attr(n).map(<[i64]>::to_vec);
        (attr("starts"), attr("ends"), attr("axes"), None)
    } else {
        let opt = |i: usize, n: &str| cx.opt_input(i)?.map(|t| t.ints(n)).transpose();
        (
            opt(1, "starts")?,
            opt(2, "ends")?,
            opt(3, "axes")?,
            opt(4, "steps")?,
        )
    };
    let starts = starts.ok_or_else(|| Fail::invalid("missing starts"))?;
    let ends = ends.ok_or_else(|| Fail::invalid("missing ends"))?;
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(Fail::invalid(
            "starts, ends, axes and steps differ in length",
        ));
    }
    let mut start = vec![0i64; r];
    let mut step = vec![1i64; r];
    let mut out_dims = x.dims.clone();
    let mut seen = vec![false; r];
    for k in 0..starts.len() {
        let a = norm_axis(axes[k], r)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(Fail::invalid(format!("axis {a} is repeated")));
        }
        let d = x.dims[a] as i64;
        let st = steps[k];
        if st == 0 {
            return Err(Fail::invalid("step 0"));
        }
        let fix = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        // `max` then `min` rather than `clamp`: for an empty axis the negative-step bounds cross.
        let (s, e) = if st > 0 {
            (fix(starts[k]).max(0).min(d), fix(ends[k]).max(0).min(d))
        } else {
            (
                fix(starts[k]).max(0).min(d - 1),
                fix(ends[k]).max(-1).min(d - 1),
            )
        };
        // ceil(span / |step|) without overflow for huge steps.
        let (span, mag) = if st > 0 {
            (e - s, st)
        } else {
            (s - e, st.saturating_neg())
        };
        let len = if span <= 0 { 0 } else { (span - 1) / mag + 1 };
        start[a] = s;
        step[a] = st;
        out_dims[a] = len as usize;
    }
    capped_numel(&out_dims)?;
    let st = strides(&x.dims);
    let mut idx = Vec::new();
    for_each_index(&out_dims, |i| {
        let flat: i64 = (0..r)
            .map(|a| (start[a] + i[a] as i64 * step[a]) * st[a] as i64)
            .sum();
        idx.push(flat as usize);
    });
    x.take(&idx, out_dims)
}

/// `Reshape`: `0` copies the input dim (unless `allowzero`), one `-1` is inferred.
fn reshape(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let shape = cx.input(1)?.ints("shape")?;
    let allowzero = cx.int_attr("allowzero", 0) != 0;
    let mut dims = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer.is_none() => {
                infer = Some(i);
                dims.push(1);
            }
            0 if !allowzero => {
                dims.push(*x.dims.get(i).ok_or_else(|| {
                    Fail::invalid(format!("shape {shape:?} copies a missing dim"))
                })?)
            }
            s if s >= 0 => dims.push(s as usize),
            _ => return Err(Fail::invalid(format!("bad shape {shape:?}"))),
        }
    }
    let n = x.numel();
    let known: usize = dims
        .iter()
        .try_fold(1usize, |a, d| a.checked_mul(*d))
        .ok_or(Fail::Unsupported)?;
    if let Some(i) = infer {
        if known == 0 || n % known != 0 {
            return Err(Fail::invalid(format!(
                "cannot reshape {:?} to {shape:?}",
                x.dims
            )));
        }
        dims[i] = n / known;
    } else if known != n {
        return Err(Fail::invalid(format!(
            "cannot reshape {:?} to {shape:?}",
            x.dims
        )));
    }
    // Only `allowzero` can create new zero dims, whose partner dims are unbounded.
    capped_numel(&dims)?;
    Ok(x.reshaped(dims))
}

/// `Flatten` at `axis` (in `[-r, r]`).
fn flatten(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let r = x.rank();
    let a = cx.int_attr("axis", 1);
    let axis = if a == r as i64 { r } else { norm_axis(a, r)? };
    let dims = vec![prod(&x.dims[..axis]), prod(&x.dims[axis..])];
    Ok(x.reshaped(dims))
}

/// `Transpose` by `perm` (default: reversed axes).
fn transpose(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let r = x.rank();
    let perm: Vec<usize> = match cx.op.ints_attr("perm") {
        Some(p) => p.iter().map(|a| norm_axis(*a, r)).collect::<R<_>>()?,
        None => (0..r).rev().collect(),
    };
    let mut sorted = perm.clone();
    sorted.sort_unstable();
    if sorted != (0..r).collect::<Vec<_>>() {
        return Err(Fail::invalid(format!(
            "perm {perm:?} is not a permutation of rank {r}"
        )));
    }
    let st = strides(&x.dims);
    let out_dims: Vec<usize> = perm.iter().map(|a| x.dims[*a]).collect();
    let mut idx = Vec::with_capacity(x.numel());
    for_each_index(&out_dims, |i| {
        idx.push(perm.iter().zip(i).map(|(a, v)| st[*a] * v).sum());
    });
    x.take(&idx, out_dims)
}

/// `Expand`: bidirectional broadcast of the input with `shape`.
fn expand(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let shape = dims_from_i64(&cx.input(1)?.ints("shape")?)?;
    let out = broadcast_shapes(&[&x.dims, &shape])?;
    let idx = broadcast_index(&x.dims, &out);
    x.take(&idx, out)
}

/// `Tile` by `repeats` (one per axis).
fn tile(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let reps = cx.input(1)?.ints("repeats")?;
    if reps.len() != x.rank() {
        return Err(Fail::invalid(format!(
            "{} repeats for rank {}",
            reps.len(),
            x.rank()
        )));
    }
    let reps = dims_from_i64(&reps)?;
    let out_dims = x
        .dims
        .iter()
        .zip(&reps)
        .map(|(d, r)| d.checked_mul(*r).ok_or(Fail::Unsupported))
        .collect::<R<Vec<usize>>>()?;
    capped_numel(&out_dims)?;
    let st = strides(&x.dims);
    let mut idx = Vec::new();
    for_each_index(&out_dims, |i| {
        idx.push((0..x.rank()).map(|a| (i[a] % x.dims[a]) * st[a]).sum());
    });
    x.take(&idx, out_dims)
}

/// `ConstantOfShape`: `value` (one element, default f32 0) repeated to `shape`.
fn constant_of_shape(cx: &Cx) -> R<Tensor> {
    let dims = dims_from_i64(&cx.input(0)?.ints("shape")?)?;
    let fill = match cx.op.attr("value").and_then(Attr::as_tensor) {
        Some(t) => Tensor::from_data(t)?,
        None => Tensor::from_num(DType::F32, vec![1], &Num::F(vec![0.0]))?,
    };
    if fill.numel() != 1 {
        return Err(Fail::invalid("'value' must have one element"));
    }
    let n = capped_numel(&dims)?;
    Ok(Tensor {
        dtype: fill.dtype,
        dims,
        data: fill.data.repeat(n),
    })
}

/// `Range(start, limit, delta)`: `max(ceil((limit - start) / delta), 0)` elements.
fn range(cx: &Cx) -> R<Tensor> {
    let (s, l, d) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    if s.dtype != l.dtype || s.dtype != d.dtype {
        return Err(Fail::invalid("start, limit and delta differ in type"));
    }
    let one = |t: &Tensor| -> R<Num> {
        if t.numel() != 1 {
            return Err(Fail::invalid("start, limit and delta must be scalars"));
        }
        t.num()
    };
    let vals = match (one(&s)?, one(&l)?, one(&d)?) {
        (Num::I(s), Num::I(l), Num::I(d)) => {
            let (s, l, d) = (s[0] as i128, l[0] as i128, d[0] as i128);
            if d == 0 {
                return Err(Fail::invalid("delta is 0"));
            }
            // Exact ceil((l - s) / d), 0 when the range runs the other way.
            let span = l - s;
            let n = if span == 0 || (span < 0) != (d < 0) {
                0
            } else {
                (span.abs() + d.abs() - 1) / d.abs()
            };
            let n = u64::try_from(n).map_err(|_| Fail::Unsupported)?;
            cap_len(n)?;
            Num::I((0..n as i128).map(|i| (s + i * d) as i64).collect())
        }
        (s, l, d) => {
            let (s, l, d) = (s.to_f64()[0], l.to_f64()[0], d.to_f64()[0]);
            if d == 0.0 {
                return Err(Fail::invalid("delta is 0"));
            }
            let n = ((l - s) / d).ceil();
            if !n.is_finite() {
                return Err(Fail::Unsupported);
            }
            let n = n.max(0.0) as u64;
            cap_len(n)?;
            Num::F((0..n).map(|i| s + i as f64 * d).collect())
        }
    };
    let n = match &vals {
        Num::F(v) => v.len(),
        Num::I(v) => v.len(),
    };
    Tensor::from_num(s.dtype, vec![n], &vals)
}

fn cap_len(n: u64) -> R<()> {
    capped_numel(&[usize::try_from(n).map_err(|_| Fail::Unsupported)?]).map(|_| ())
}

// ---------------------------------------------------------------------------------------------
// Element-wise ops

/// Broadcast the operands' numeric values to their common shape.
fn broadcast_num(xs: &[&Tensor]) -> R<(Vec<usize>, Vec<Num>)> {
    let shapes: Vec<&[usize]> = xs.iter().map(|x| x.dims.as_slice()).collect();
    let out = broadcast_shapes(&shapes)?;
    let vals = xs
        .iter()
        .map(|x| {
            let idx = broadcast_index(&x.dims, &out);
            Ok(match x.num()? {
                Num::F(v) => Num::F(idx.iter().map(|i| v[*i]).collect()),
                Num::I(v) => Num::I(idx.iter().map(|i| v[*i]).collect()),
            })
        })
        .collect::<R<Vec<Num>>>()?;
    Ok((out, vals))
}

fn same_dtype(a: &Tensor, b: &Tensor) -> R<()> {
    if a.dtype != b.dtype {
        return Err(Fail::invalid(format!(
            "operand types differ: {} and {}",
            a.dtype, b.dtype
        )));
    }
    Ok(())
}

/// Comparisons, result bool.
fn compare(cx: &Cx) -> R<Tensor> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    same_dtype(&a, &b)?;
    let (dims, v) = broadcast_num(&[&a, &b])?;
    let op = cx.op.op_type.as_str();
    let res: Vec<i64> = match (&v[0], &v[1]) {
        (Num::I(x), Num::I(y)) => x.iter().zip(y).map(|(x, y)| cmp(op, x, y)).collect(),
        (Num::F(x), Num::F(y)) => x.iter().zip(y).map(|(x, y)| cmp(op, x, y)).collect(),
        _ => return Err(Fail::Unsupported),
    };
    Tensor::from_num(DType::Bool, dims, &Num::I(res))
}

fn cmp<T: PartialOrd>(op: &str, x: &T, y: &T) -> i64 {
    i64::from(match op {
        "Equal" => x == y,
        "Less" => x < y,
        "Greater" => x > y,
        "LessOrEqual" => x <= y,
        _ => x >= y,
    })
}

fn bools(x: &Tensor) -> R<Vec<bool>> {
    if x.dtype != DType::Bool {
        return Err(Fail::invalid(format!("expected bool, got {}", x.dtype)));
    }
    Ok(x.data.iter().map(|b| *b != 0).collect())
}

/// `And`, `Or`, `Xor` on bool.
fn logical(cx: &Cx) -> R<Tensor> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let (av, bv) = (bools(&a)?, bools(&b)?);
    let out = broadcast_shapes(&[&a.dims, &b.dims])?;
    let (ia, ib) = (
        broadcast_index(&a.dims, &out),
        broadcast_index(&b.dims, &out),
    );
    let data = ia
        .iter()
        .zip(&ib)
        .map(|(i, j)| {
            let (x, y) = (av[*i], bv[*j]);
            u8::from(match cx.op.op_type.as_str() {
                "And" => x && y,
                "Or" => x || y,
                _ => x ^ y,
            })
        })
        .collect();
    Ok(Tensor {
        dtype: DType::Bool,
        dims: out,
        data,
    })
}

/// `Not` on bool.
fn not(cx: &Cx) -> R<Tensor> {
    let mut x = cx.input(0)?;
    bools(&x)?;
    x.data.iter_mut().for_each(|b| *b = u8::from(*b == 0));
    Ok(x)
}

/// `Where(cond, x, y)`, broadcasting all three; any element type.
fn where_(cx: &Cx) -> R<Tensor> {
    let (c, x, y) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let cv = bools(&c)?;
    same_dtype(&x, &y)?;
    let out = broadcast_shapes(&[&c.dims, &x.dims, &y.dims])?;
    let ic = broadcast_index(&c.dims, &out);
    let (ix, iy) = (
        broadcast_index(&x.dims, &out),
        broadcast_index(&y.dims, &out),
    );
    let size = elem_size(x.dtype)?;
    let mut data = Vec::with_capacity(ic.len() * size);
    for k in 0..ic.len() {
        let (src, i) = if cv[ic[k]] { (&x, ix[k]) } else { (&y, iy[k]) };
        data.extend_from_slice(&src.data[i * size..(i + 1) * size]);
    }
    Ok(Tensor {
        dtype: x.dtype,
        dims: out,
        data,
    })
}

/// Binary arithmetic: `Add`, `Sub`, `Mul`, `Div`, `Mod` (`fmod` attribute), `Pow`.
fn arith(cx: &Cx) -> R<Tensor> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let op = cx.op.op_type.as_str();
    if op != "Pow" {
        same_dtype(&a, &b)?;
    }
    if a.dtype == DType::Bool || b.dtype == DType::Bool {
        return Err(Fail::Unsupported);
    }
    let fmod = cx.int_attr("fmod", 0) != 0;
    let (dims, v) = broadcast_num(&[&a, &b])?;
    let res = match (&v[0], &v[1]) {
        (Num::I(x), Num::I(y)) => Num::I(
            x.iter()
                .zip(y)
                .map(|(x, y)| int_arith(op, *x, *y, fmod))
                .collect::<R<_>>()?,
        ),
        (x, y) => {
            if op == "Mod" && !fmod {
                return Err(Fail::invalid("floating-point Mod requires fmod = 1"));
            }
            let (x, y) = (x.to_f64(), y.to_f64());
            Num::F(
                x.iter()
                    .zip(&y)
                    .map(|(x, y)| match op {
                        "Add" => x + y,
                        "Sub" => x - y,
                        "Mul" => x * y,
                        "Div" => x / y,
                        "Mod" => x % y,
                        _ => x.powf(*y),
                    })
                    .collect(),
            )
        }
    };
    Tensor::from_num(a.dtype, dims, &res)
}

fn int_arith(op: &str, x: i64, y: i64, fmod: bool) -> R<i64> {
    Ok(match op {
        "Add" => x.wrapping_add(y),
        "Sub" => x.wrapping_sub(y),
        "Mul" => x.wrapping_mul(y),
        "Div" | "Mod" if y == 0 => return Err(Fail::Unsupported),
        "Div" => x.wrapping_div(y),
        "Mod" => {
            let r = x.wrapping_rem(y);
            if !fmod && r != 0 && (r < 0) != (y < 0) {
                r + y
            } else {
                r
            }
        }
        _ => x.wrapping_pow(u32::try_from(y).map_err(|_| Fail::Unsupported)?),
    })
}

/// Variadic `Min` / `Max` with broadcasting (NaN propagates).
fn min_max(cx: &Cx) -> R<Tensor> {
    let xs = cx.all_inputs()?;
    let first = xs.first().ok_or_else(|| Fail::invalid("no operands"))?;
    for x in &xs {
        same_dtype(first, x)?;
    }
    let refs: Vec<&Tensor> = xs.iter().collect();
    let (dims, vals) = broadcast_num(&refs)?;
    let max = cx.op.op_type == "Max";
    let res = match &vals[0] {
        Num::I(_) => {
            let vs: Vec<&Vec<i64>> = vals
                .iter()
                .filter_map(|v| if let Num::I(v) = v { Some(v) } else { None })
                .collect();
            Num::I(
                (0..vs[0].len())
                    .map(|k| {
                        let it = vs.iter().map(|v| v[k]);
                        if max { it.max() } else { it.min() }.unwrap_or(0)
                    })
                    .collect(),
            )
        }
        Num::F(_) => {
            let vs: Vec<Vec<f64>> = vals.iter().map(Num::to_f64).collect();
            Num::F(
                (0..vs[0].len())
                    .map(|k| {
                        vs.iter().map(|v| v[k]).fold(vs[0][k], |acc, x| {
                            if acc.is_nan() || x.is_nan() {
                                f64::NAN
                            } else if max {
                                acc.max(x)
                            } else {
                                acc.min(x)
                            }
                        })
                    })
                    .collect(),
            )
        }
    };
    Tensor::from_num(first.dtype, dims, &res)
}

/// `Neg`, `Abs`, `Sqrt`.
fn unary(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    if x.dtype == DType::Bool {
        return Err(Fail::Unsupported);
    }
    let op = cx.op.op_type.as_str();
    let res = match x.num()? {
        Num::I(v) => Num::I(match op {
            "Neg" => v.iter().map(|x| x.wrapping_neg()).collect(),
            "Abs" => v.iter().map(|x| x.wrapping_abs()).collect(),
            _ => return Err(Fail::Unsupported),
        }),
        Num::F(v) => Num::F(match op {
            "Neg" => v.iter().map(|x| -x).collect(),
            "Abs" => v.iter().map(|x| x.abs()).collect(),
            _ => v.iter().map(|x| x.sqrt()).collect(),
        }),
    };
    Tensor::from_num(x.dtype, x.dims.clone(), &res)
}

// ---------------------------------------------------------------------------------------------
// Reductions and scans

/// `Reduce*`: axes from the attribute (older opsets) or operand 1, `keepdims` (default 1),
/// `noop_with_empty_axes` (default 0: no axes reduces everything).
fn reduce(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let r = x.rank();
    let axes = cx.ints_arg(1, "axes")?.unwrap_or_default();
    if axes.is_empty() && cx.int_attr("noop_with_empty_axes", 0) != 0 {
        return Ok(x);
    }
    let mut red = vec![axes.is_empty(); r];
    for a in axes {
        red[norm_axis(a, r)?] = true;
    }
    let keep = cx.int_attr("keepdims", 1) != 0;
    let kept: Vec<usize> = (0..r).map(|a| if red[a] { 1 } else { x.dims[a] }).collect();
    let count = (0..r)
        .filter(|a| red[*a])
        .map(|a| x.dims[a])
        .product::<usize>();
    let op = cx.op.op_type.as_str();
    if count == 0 && !matches!(op, "ReduceSum" | "ReduceProd") {
        return Err(Fail::Unsupported);
    }
    let ost = strides(&kept);
    let out_n = prod(&kept);
    let mut groups: Vec<Vec<usize>> = vec![Vec::with_capacity(count); out_n];
    let mut flat = 0usize;
    for_each_index(&x.dims, |i| {
        let o: usize = (0..r).filter(|a| !red[*a]).map(|a| i[a] * ost[a]).sum();
        groups[o].push(flat);
        flat += 1;
    });
    let res = match x.num()? {
        Num::I(v) => Num::I(
            groups
                .iter()
                .map(|g| {
                    let it = g.iter().map(|i| v[*i]);
                    match op {
                        "ReduceSum" => it.fold(0i64, i64::wrapping_add),
                        "ReduceProd" => it.fold(1i64, i64::wrapping_mul),
                        "ReduceMax" => it.max().unwrap_or(0),
                        "ReduceMin" => it.min().unwrap_or(0),
                        _ => it.fold(0i64, i64::wrapping_add) / count as i64,
                    }
                })
                .collect(),
        ),
        Num::F(v) => Num::F(
            groups
                .iter()
                .map(|g| {
                    let it = g.iter().map(|i| v[*i]);
                    match op {
                        "ReduceSum" => it.sum(),
                        "ReduceProd" => it.product(),
                        "ReduceMax" => it.fold(f64::NEG_INFINITY, nan_max),
                        "ReduceMin" => it.fold(f64::INFINITY, |a, b| -nan_max(-a, -b)),
                        _ => it.sum::<f64>() / count as f64,
                    }
                })
                .collect(),
        ),
    };
    let dims = if keep {
        kept
    } else {
        (0..r).filter(|a| !red[*a]).map(|a| x.dims[a]).collect()
    };
    Tensor::from_num(x.dtype, dims, &res)
}

fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// `Trilu`: keeps the upper (`upper` = 1, default) or lower triangle of the last two axes,
/// shifted by the optional diagonal `k`; zeros elsewhere.
fn trilu(cx: &Cx) -> R<Tensor> {
    let mut x = cx.input(0)?;
    let r = x.rank();
    if r < 2 {
        return Err(Fail::invalid("Trilu needs rank >= 2"));
    }
    let k = match cx.opt_input(1)? {
        Some(t) => t.scalar_int("k")?,
        None => 0,
    };
    let upper = cx.int_attr("upper", 1) != 0;
    let (rows, cols) = (x.dims[r - 2], x.dims[r - 1]);
    let size = elem_size(x.dtype)?;
    for (e, chunk) in x.data.chunks_exact_mut(size).enumerate() {
        let (i, j) = (((e / cols) % rows) as i64, (e % cols) as i64);
        let keep = if upper { j - i >= k } else { j - i <= k };
        if !keep {
            chunk.fill(0);
        }
    }
    Ok(x)
}

/// `CumSum` along the scalar `axis` operand, with `exclusive` and `reverse`.
fn cumsum(cx: &Cx) -> R<Tensor> {
    let x = cx.input(0)?;
    let axis = norm_axis(cx.input(1)?.scalar_int("axis")?, x.rank())?;
    let exclusive = cx.int_attr("exclusive", 0) != 0;
    let reverse = cx.int_attr("reverse", 0) != 0;
    let n = x.dims[axis];
    let inner = prod(&x.dims[axis + 1..]);
    let outer = prod(&x.dims[..axis]);
    fn scan<T: Copy + std::ops::Add<Output = T>>(
        v: &[T],
        zero: T,
        (outer, n, inner): (usize, usize, usize),
        exclusive: bool,
        reverse: bool,
    ) -> Vec<T> {
        let mut out = vec![zero; v.len()];
        for o in 0..outer {
            for k in 0..inner {
                let mut acc = zero;
                for s in 0..n {
                    let j = if reverse { n - 1 - s } else { s };
                    let p = (o * n + j) * inner + k;
                    if exclusive {
                        out[p] = acc;
                        acc = acc + v[p];
                    } else {
                        acc = acc + v[p];
                        out[p] = acc;
                    }
                }
            }
        }
        out
    }
    let geo = (outer, n, inner);
    let res = match x.num()? {
        Num::I(v) => Num::I(
            scan(
                &v.iter().map(|x| std::num::Wrapping(*x)).collect::<Vec<_>>(),
                std::num::Wrapping(0),
                geo,
                exclusive,
                reverse,
            )
            .into_iter()
            .map(|w| w.0)
            .collect(),
        ),
        Num::F(v) => Num::F(scan(&v, 0.0, geo, exclusive, reverse)),
    };
    Tensor::from_num(x.dtype, x.dims.clone(), &res)
}

/// `Split` along `axis`: sizes from operand 1 (opset 13+) or the `split` attribute, else equal
/// parts, one per result (opset 18's `num_outputs` allows a smaller last part).
fn split(cx: &Cx) -> R<Vec<Tensor>> {
    let x = cx.input(0)?;
    let axis = norm_axis(cx.int_attr("axis", 0), x.rank())?;
    let d = x.dims[axis];
    let sizes: Vec<usize> = match cx.ints_arg(1, "split")? {
        Some(s) => {
            let s = dims_from_i64(&s)?;
            if s.iter().sum::<usize>() != d {
                return Err(Fail::invalid(format!(
                    "split {s:?} does not sum to dim {d}"
                )));
            }
            s
        }
        None => {
            let n = match cx.op.int_attr("num_outputs") {
                Some(n) => usize::try_from(n)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| Fail::invalid(format!("num_outputs = {n}")))?,
                None => cx.op.outputs.len(),
            };
            if n == 0 {
                return Err(Fail::Unsupported);
            }
            let part = d.div_ceil(n);
            if cx.op.int_attr("num_outputs").is_none() && d % n != 0 {
                return Err(Fail::invalid(format!(
                    "dim {d} does not split into {n} equal parts"
                )));
            }
            (0..n)
                .map(|i| part.min(d.saturating_sub(i * part)))
                .collect()
        }
    };
    let st = strides(&x.dims);
    let mut off = 0;
    let mut outs = Vec::with_capacity(sizes.len());
    for s in sizes {
        let mut dims = x.dims.clone();
        dims[axis] = s;
        let mut idx = Vec::new();
        for_each_index(&dims, |i| {
            idx.push(
                (0..x.rank())
                    .map(|a| (i[a] + if a == axis { off } else { 0 }) * st[a])
                    .sum(),
            );
        });
        outs.push(x.take(&idx, dims)?);
        off += s;
    }
    Ok(outs)
}
