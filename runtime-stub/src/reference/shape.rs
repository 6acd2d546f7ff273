//! Shape, layout and indexing ops (any element type where it makes sense).

use super::elementwise::{broadcast_shape, num_map, Num};
use super::nn::flat;
use super::{norm_axis, Ctx, KResult};
use crate::map_any;
use crate::tensor::Tensor;
use ndarray::{ArrayD, Axis, IxDyn};

/// Any element type: clone, default, and extraction of a scalar from a tensor.
pub(crate) trait Elem: Clone + Default + Send + Sync + 'static {
    /// First element of `t`, converted to this type.
    fn scalar(t: &Tensor) -> Option<Self>;
}
macro_rules! impl_elem {
    ($($t:ty => $v:ident),*) => {$(
        impl Elem for $t {
            fn scalar(t: &Tensor) -> Option<Self> {
                match t.cast(pipec_compiler::ir::DType::$v).ok()? {
                    Tensor::$v(a) => a.iter().next().cloned(),
                    _ => None,
                }
            }
        }
    )*};
}
impl_elem!(f32 => F32, f64 => F64, i64 => I64, i32 => I32, u8 => U8, bool => Bool);

fn arr<T>(shape: &[usize], v: Vec<T>) -> KResult<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| e.to_string())
}

fn reshape_to<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> KResult<ArrayD<T>> {
    let n: usize = shape.iter().product();
    if n != a.len() {
        return Err(format!(
            "cannot reshape {:?} ({} elements) to {shape:?}",
            a.shape(),
            a.len()
        ));
    }
    arr(shape, flat(a).into_owned())
}

fn usizes(v: &[i64], what: &str) -> KResult<Vec<usize>> {
    v.iter()
        .map(|x| usize::try_from(*x).map_err(|_| format!("negative {what} {x}")))
        .collect()
}

fn reshape(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    let spec = c
        .ints_input(1)
        .or_else(|| c.ints("shape"))
        .ok_or("shape is required")?;
    let allowzero = c.int("allowzero", 0) != 0;
    let mut shape = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            0 if !allowzero => shape.push(*x.shape().get(i).ok_or_else(|| {
                format!(
                    "0 at position {i} but the input has rank {}",
                    x.shape().len()
                )
            })?),
            -1 => {
                if infer.replace(i).is_some() {
                    return Err("more than one -1 in the shape".into());
                }
                shape.push(1);
            }
            d if d < 0 => return Err(format!("bad dim {d} in the shape")),
            d => shape.push(d as usize),
        }
    }
    if let Some(i) = infer {
        let known: usize = shape.iter().product();
        if known == 0 || x.len() % known != 0 {
            return Err(format!(
                "cannot infer -1 reshaping {:?} to {spec:?}",
                x.shape()
            ));
        }
        shape[i] = x.len() / known;
    }
    Ok(map_any!(x, a => reshape_to(a, &shape)?))
}

fn transpose(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    let r = x.shape().len();
    let perm = match c.ints("perm") {
        Some(p) => usizes(&p, "perm")?,
        None => (0..r).rev().collect(),
    };
    let mut seen = vec![false; r];
    if perm.len() != r
        || perm
            .iter()
            .any(|p| *p >= r || std::mem::replace(&mut seen[*p], true))
    {
        return Err(format!("perm {perm:?} is not a permutation of {r} axes"));
    }
    Ok(map_any!(x, a => permute_copy(a, &perm)?))
}

/// `a` with its axes permuted, in row-major order.
fn permute_copy<T: Copy>(a: &ArrayD<T>, perm: &[usize]) -> KResult<ArrayD<T>> {
    let st = row_major_strides(a.shape());
    let shape: Vec<usize> = perm.iter().map(|&p| a.shape()[p]).collect();
    let strides: Vec<isize> = perm.iter().map(|&p| st[p]).collect();
    arr(&shape, gather_strided(&flat(a), 0, &shape, &strides))
}

/// Element strides of a row-major array of this shape.
fn row_major_strides(shape: &[usize]) -> Vec<isize> {
    let mut st = vec![1isize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * shape[i + 1] as isize;
    }
    st
}

/// Row-major copy of the strided view of `src` that starts at `offset` and has `shape` and
/// element `strides` (any sign). Axes of length 1 are dropped and neighbours that are one
/// contiguous run merged, so the inner loop is a `memcpy` of the longest contiguous run (a
/// strided loop when the last axis moves); the outer axes are walked by an odometer. This is
/// what Transpose and Slice do; ndarray's `select` / `as_standard_layout` on such views went
/// element by element through `IxDyn` indices, 5-10x slower on the Conv gradient's
/// `[C, O, K, K]` transposes and slices.
pub(crate) fn gather_strided<T: Copy>(
    src: &[T],
    offset: usize,
    shape: &[usize],
    strides: &[isize],
) -> Vec<T> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let mut dims: Vec<(usize, isize)> = Vec::with_capacity(shape.len());
    for (&l, &st) in shape.iter().zip(strides) {
        if l == 1 {
            continue;
        }
        match dims.last_mut() {
            Some(last) if last.1 == st * l as isize => *last = (last.0 * l, st),
            _ => dims.push((l, st)),
        }
    }
    let (il, is) = dims.pop().unwrap_or((1, 1));
    let mut idx = vec![0usize; dims.len()];
    let mut base = offset as isize;
    loop {
        if is == 1 {
            let b = base as usize;
            out.extend_from_slice(&src[b..b + il]);
        } else {
            out.extend((0..il as isize).map(|j| src[(base + j * is) as usize]));
        }
        let mut ax = dims.len();
        loop {
            if ax == 0 {
                return out;
            }
            ax -= 1;
            idx[ax] += 1;
            base += dims[ax].1;
            if idx[ax] < dims[ax].0 {
                break;
            }
            base -= dims[ax].1 * dims[ax].0 as isize;
            idx[ax] = 0;
        }
    }
}

fn axes_of(c: &Ctx, idx: usize) -> Option<Vec<i64>> {
    if c.opset >= 13 {
        c.ints_input(idx)
    } else {
        c.ints("axes")
    }
}

fn squeeze(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    let r = x.shape().len();
    let axes: Vec<usize> = match axes_of(c, 1) {
        Some(a) => a.iter().map(|&v| norm_axis(v, r)).collect::<KResult<_>>()?,
        None => (0..r).filter(|&i| x.shape()[i] == 1).collect(),
    };
    for &a in &axes {
        if x.shape()[a] != 1 {
            return Err(format!("cannot squeeze axis {a} of size {}", x.shape()[a]));
        }
    }
    let shape: Vec<usize> = (0..r)
        .filter(|i| !axes.contains(i))
        .map(|i| x.shape()[i])
        .collect();
    Ok(map_any!(x, a => reshape_to(a, &shape)?))
}

fn unsqueeze(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    let axes = axes_of(c, 1).ok_or("axes are required")?;
    let r = x.shape().len() + axes.len();
    let mut ax: Vec<usize> = axes
        .iter()
        .map(|&v| norm_axis(v, r))
        .collect::<KResult<_>>()?;
    ax.sort_unstable();
    let mut shape = Vec::with_capacity(r);
    let mut it = x.shape().iter();
    for i in 0..r {
        if ax.contains(&i) {
            shape.push(1);
        } else {
            shape.push(*it.next().ok_or("duplicate axes")?);
        }
    }
    Ok(map_any!(x, a => reshape_to(a, &shape)?))
}

fn flatten(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    let r = x.shape().len() as i64;
    let mut ax = c.int("axis", 1);
    if ax < 0 {
        ax += r;
    }
    if ax < 0 || ax > r {
        return Err(format!(
            "axis {} out of range for rank {r}",
            c.int("axis", 1)
        ));
    }
    let ax = ax as usize;
    let shape = [
        x.shape()[..ax].iter().product(),
        x.shape()[ax..].iter().product::<usize>(),
    ];
    Ok(map_any!(x, a => reshape_to(a, &shape)?))
}

macro_rules! same_variant {
    ($ts:expr, $v:ident) => {
        $ts.iter()
            .map(|t| match t {
                Tensor::$v(a) => Ok(a.view()),
                other => Err(format!("operand dtypes differ: {}", other.dtype())),
            })
            .collect::<KResult<Vec<_>>>()?
    };
}

fn concat(c: &Ctx) -> KResult<Tensor> {
    let ts: Vec<&Tensor> = c.inputs.iter().flatten().copied().collect();
    let first = ts.first().ok_or("no operands")?;
    let ax = norm_axis(c.int("axis", 0), first.shape().len())?;
    let cat = |e: ndarray::ShapeError| format!("operands do not fit: {e}");
    Ok(match first {
        Tensor::F32(_) => {
            Tensor::F32(ndarray::concatenate(Axis(ax), &same_variant!(ts, F32)).map_err(cat)?)
        }
        Tensor::F64(_) => {
            Tensor::F64(ndarray::concatenate(Axis(ax), &same_variant!(ts, F64)).map_err(cat)?)
        }
        Tensor::I64(_) => {
            Tensor::I64(ndarray::concatenate(Axis(ax), &same_variant!(ts, I64)).map_err(cat)?)
        }
        Tensor::I32(_) => {
            Tensor::I32(ndarray::concatenate(Axis(ax), &same_variant!(ts, I32)).map_err(cat)?)
        }
        Tensor::U8(_) => {
            Tensor::U8(ndarray::concatenate(Axis(ax), &same_variant!(ts, U8)).map_err(cat)?)
        }
        Tensor::Bool(_) => {
            Tensor::Bool(ndarray::concatenate(Axis(ax), &same_variant!(ts, Bool)).map_err(cat)?)
        }
    })
}

fn split(c: &Ctx) -> KResult<Vec<Tensor>> {
    let x = c.input(0)?;
    let ax = norm_axis(c.int("axis", 0), x.shape().len())?;
    let n = x.shape()[ax];
    let sizes: Vec<usize> = match c.ints_input(1).or_else(|| c.ints("split")) {
        Some(s) => usizes(&s, "split")?,
        None => {
            let k =
                c.op.int_attr("num_outputs")
                    .map(|v| v.max(1) as usize)
                    .unwrap_or(c.n_outputs.max(1));
            let chunk = n.div_ceil(k);
            (0..k)
                .map(|i| chunk.min(n.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if sizes.iter().sum::<usize>() != n {
        return Err(format!("split sizes {sizes:?} do not add up to {n}"));
    }
    let mut out = Vec::with_capacity(sizes.len());
    let mut start = 0;
    for s in sizes {
        let (b, e) = (start as isize, (start + s) as isize);
        out.push(map_any!(x, a => a.slice_axis(Axis(ax), ndarray::Slice::from(b..e)).to_owned()));
        start += s;
    }
    Ok(out)
}

fn slice(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    let (starts, ends, axes, steps) = if c.opset >= 10 {
        (
            c.ints_input(1).ok_or("starts are required")?,
            c.ints_input(2).ok_or("ends are required")?,
            c.ints_input(3),
            c.ints_input(4),
        )
    } else {
        (
            c.ints("starts").ok_or("starts are required")?,
            c.ints("ends").ok_or("ends are required")?,
            c.ints("axes"),
            None,
        )
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let (offset, count, strides) = slice_view(x.shape(), &starts, &ends, &axes, &steps)?;
    Ok(map_any!(x, a => arr(&count, gather_strided(&flat(a), offset, &count, &strides))?))
}

/// The ONNX Slice of a row-major array of `shape` as a strided view: `(offset, shape, strides)`
/// (each axis's indices are an arithmetic progression: first index, step, count).
fn slice_view(
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: &[i64],
    steps: &[i64],
) -> KResult<(usize, Vec<usize>, Vec<isize>)> {
    let r = shape.len();
    // Per axis: first index, step and count (an arithmetic progression); then one strided copy.
    let mut first = vec![0i64; r];
    let mut step_of = vec![1i64; r];
    let mut count: Vec<usize> = shape.to_vec();
    for i in 0..starts.len() {
        let ax = norm_axis(axes[i], r)?;
        let dim = shape[ax] as i64;
        let step = steps[i];
        if step == 0 {
            return Err("step 0".into());
        }
        let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let (s, e) = (fix(starts[i]), fix(ends[i]));
        let (f, n) = if dim == 0 {
            (0, 0)
        } else if step > 0 {
            let (s, e) = (s.clamp(0, dim), e.clamp(0, dim));
            (s, (e - s).max(0).saturating_add(step - 1) / step)
        } else {
            let (s, e) = (s.clamp(0, dim - 1), e.clamp(-1, dim - 1));
            let back = step.saturating_neg();
            (s, (s - e).max(0).saturating_add(back - 1) / back)
        };
        first[ax] = f;
        step_of[ax] = step;
        count[ax] = n as usize;
    }
    let st = row_major_strides(shape);
    let offset: isize = (0..r).map(|a| first[a] as isize * st[a]).sum();
    let strides: Vec<isize> = (0..r).map(|a| st[a] * step_of[a] as isize).collect();
    let offset = usize::try_from(offset).map_err(|_| "negative slice offset".to_string())?;
    Ok((offset, count, strides))
}

fn index_vec(t: &Tensor, dim: usize) -> KResult<Vec<usize>> {
    t.to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim as i64 } else { i };
            if j < 0 || j >= dim as i64 {
                Err(format!("index {i} is out of range for a dim of size {dim}"))
            } else {
                Ok(j as usize)
            }
        })
        .collect()
}

fn gather_t<T: Elem>(
    a: &ArrayD<T>,
    idx: &[usize],
    idx_shape: &[usize],
    ax: usize,
) -> KResult<ArrayD<T>> {
    let s = a.shape();
    let outer: usize = s[..ax].iter().product();
    let n = s[ax];
    let inner: usize = s[ax + 1..].iter().product();
    let d = flat(a);
    let mut out = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &i in idx {
            out.extend_from_slice(&d[(o * n + i) * inner..(o * n + i + 1) * inner]);
        }
    }
    let mut shape = s[..ax].to_vec();
    shape.extend_from_slice(idx_shape);
    shape.extend_from_slice(&s[ax + 1..]);
    arr(&shape, out)
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1] * shape[i + 1];
    }
    st
}

/// For GatherElements / ScatterElements: for each position of `idx_shape`, the flat offset in
/// `data_shape` with the coordinate on `ax` replaced by the index.
fn element_offsets(
    data_shape: &[usize],
    idx_shape: &[usize],
    idx: &Tensor,
    ax: usize,
) -> KResult<Vec<usize>> {
    if data_shape.len() != idx_shape.len() {
        return Err("indices must have the rank of the data".into());
    }
    let ds = strides(data_shape);
    let is = strides(idx_shape);
    let raw = idx.to_i64_vec();
    let mut out = Vec::with_capacity(raw.len());
    for (p, &i) in raw.iter().enumerate() {
        let dim = data_shape[ax] as i64;
        let j = if i < 0 { i + dim } else { i };
        if j < 0 || j >= dim {
            return Err(format!("index {i} is out of range for a dim of size {dim}"));
        }
        let mut off = 0;
        let mut rem = p;
        for k in 0..idx_shape.len() {
            let coord = rem / is[k];
            rem %= is[k];
            if k == ax {
                off += j as usize * ds[k];
            } else {
                if coord >= data_shape[k] {
                    return Err(format!(
                        "indices shape {idx_shape:?} exceeds data shape {data_shape:?}"
                    ));
                }
                off += coord * ds[k];
            }
        }
        out.push(off);
    }
    Ok(out)
}

fn gather_elements_t<T: Elem>(
    a: &ArrayD<T>,
    offs: &[usize],
    shape: &[usize],
) -> KResult<ArrayD<T>> {
    let d = flat(a);
    arr(shape, offs.iter().map(|&o| d[o].clone()).collect())
}

#[derive(Clone, Copy)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduction(c: &Ctx) -> KResult<Reduction> {
    Ok(match c.string("reduction", "none").as_str() {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        r => return Err(format!("unknown reduction '{r}'")),
    })
}

fn apply<T: Num>(dst: &mut T, v: T, r: Reduction) {
    *dst = match r {
        Reduction::None => v,
        Reduction::Add => *dst + v,
        Reduction::Mul => *dst * v,
        Reduction::Max => {
            if v > *dst {
                v
            } else {
                *dst
            }
        }
        Reduction::Min => {
            if v < *dst {
                v
            } else {
                *dst
            }
        }
    };
}

fn scatter_elements_t<T: Num + Elem>(
    a: &ArrayD<T>,
    offs: &[usize],
    upd: &Tensor,
    r: Reduction,
) -> KResult<ArrayD<T>> {
    let u = upd_vec::<T>(upd, offs.len())?;
    let mut d = flat(a).into_owned();
    for (&o, v) in offs.iter().zip(u) {
        apply(&mut d[o], v, r);
    }
    arr(a.shape(), d)
}

fn upd_vec<T: Elem>(upd: &Tensor, n: usize) -> KResult<Vec<T>> {
    let u: Vec<T> = match upd {
        Tensor::F32(a) => cast_vec(a),
        Tensor::F64(a) => cast_vec(a),
        Tensor::I64(a) => cast_vec(a),
        Tensor::I32(a) => cast_vec(a),
        Tensor::U8(a) => cast_vec(a),
        Tensor::Bool(a) => cast_vec(a),
    }?;
    if u.len() != n {
        return Err(format!("updates have {} elements, expected {n}", u.len()));
    }
    Ok(u)
}

fn cast_vec<S: Elem, T: Elem>(a: &ArrayD<S>) -> KResult<Vec<T>> {
    // Same type: a plain copy (the dtype was checked by the caller).
    let any: &dyn std::any::Any = a;
    any.downcast_ref::<ArrayD<T>>()
        .map(|x| flat(x).into_owned())
        .ok_or_else(|| "updates must have the dtype of the data".to_string())
}

/// GatherND / ScatterND geometry: (batch count, index tuples per batch, k, slice size, offsets).
fn nd_offsets(
    data_shape: &[usize],
    idx: &Tensor,
    batch_dims: usize,
) -> KResult<(Vec<usize>, usize)> {
    let is = idx.shape();
    let k = *is.last().ok_or("indices must have rank >= 1")?;
    let b = batch_dims;
    if b + k > data_shape.len() || b >= is.len() || is[..b] != data_shape[..b] {
        return Err(format!(
            "indices {is:?} do not fit data {data_shape:?} with batch_dims {b}"
        ));
    }
    let nb: usize = is[..b].iter().product();
    let per: usize = is[b..is.len() - 1].iter().product();
    let slice: usize = data_shape[b + k..].iter().product();
    let ds = strides(data_shape);
    let raw = idx.to_i64_vec();
    let mut offs = Vec::with_capacity(nb * per);
    for bi in 0..nb {
        // batch coordinates
        let mut base = 0;
        let mut rem = bi;
        let bst = strides(&data_shape[..b]);
        for j in 0..b {
            base += (rem / bst[j]) * ds[j];
            rem %= bst[j];
        }
        for t in 0..per {
            let tup = &raw[(bi * per + t) * k..(bi * per + t + 1) * k];
            let mut off = base;
            for (j, &i) in tup.iter().enumerate() {
                let dim = data_shape[b + j] as i64;
                let v = if i < 0 { i + dim } else { i };
                if v < 0 || v >= dim {
                    return Err(format!("index {i} is out of range for a dim of size {dim}"));
                }
                off += v as usize * ds[b + j];
            }
            offs.push(off);
        }
    }
    Ok((offs, slice))
}

fn gather_nd_t<T: Elem>(
    a: &ArrayD<T>,
    offs: &[usize],
    slice: usize,
    shape: &[usize],
) -> KResult<ArrayD<T>> {
    let d = flat(a);
    let mut out = Vec::with_capacity(offs.len() * slice);
    for &o in offs {
        out.extend_from_slice(&d[o..o + slice]);
    }
    arr(shape, out)
}

fn scatter_nd_t<T: Num + Elem>(
    a: &ArrayD<T>,
    offs: &[usize],
    slice: usize,
    upd: &Tensor,
    r: Reduction,
) -> KResult<ArrayD<T>> {
    let u = upd_vec::<T>(upd, offs.len() * slice)?;
    let mut d = flat(a).into_owned();
    for (t, &o) in offs.iter().enumerate() {
        for j in 0..slice {
            apply(&mut d[o + j], u[t * slice + j], r);
        }
    }
    arr(a.shape(), d)
}

fn expand_t<T: Elem>(a: &ArrayD<T>, shape: &[usize]) -> KResult<ArrayD<T>> {
    let s = broadcast_shape(a.shape(), shape)?;
    Ok(a.broadcast(IxDyn(&s))
        .ok_or("cannot broadcast")?
        .as_standard_layout()
        .into_owned())
}

fn tile_t<T: Elem>(a: &ArrayD<T>, reps: &[usize]) -> KResult<ArrayD<T>> {
    if reps.len() != a.ndim() {
        return Err(format!(
            "repeats has {} values for rank {}",
            reps.len(),
            a.ndim()
        ));
    }
    let shape: Vec<usize> = a.shape().iter().zip(reps).map(|(d, r)| d * r).collect();
    let src = a.shape().to_vec();
    Ok(ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
        let s: Vec<usize> = (0..src.len()).map(|i| ix[i] % src[i]).collect();
        a[IxDyn(&s)].clone()
    }))
}

fn pad_t<T: Elem>(a: &ArrayD<T>, maps: &[Vec<Option<usize>>], fill: T) -> ArrayD<T> {
    let shape: Vec<usize> = maps.iter().map(Vec::len).collect();
    let mut src = vec![0usize; shape.len()];
    ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
        for i in 0..src.len() {
            match maps[i][ix[i]] {
                Some(s) => src[i] = s,
                None => return fill.clone(),
            }
        }
        a[IxDyn(&src)].clone()
    })
}

fn pad(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    let r = x.shape().len();
    let pads = if c.opset >= 11 {
        c.ints_input(1)
    } else {
        c.ints("pads")
    }
    .ok_or("pads are required")?;
    let axes: Vec<usize> = match c.ints_input(3) {
        Some(a) => a.iter().map(|&v| norm_axis(v, r)).collect::<KResult<_>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "pads has {} values for {} axes",
            pads.len(),
            axes.len()
        ));
    }
    let mode = c.string("mode", "constant");
    let mut maps: Vec<Vec<Option<usize>>> = x
        .shape()
        .iter()
        .map(|&n| (0..n).map(Some).collect())
        .collect();
    for (j, &ax) in axes.iter().enumerate() {
        let n = x.shape()[ax] as i64;
        let (pb, pe) = (pads[j], pads[j + axes.len()]);
        let len = n + pb + pe;
        if len < 0 {
            return Err(format!("pads {pads:?} make axis {ax} negative"));
        }
        let mut m = Vec::with_capacity(len as usize);
        for o in 0..len {
            let s = o - pb;
            let v = if (0..n).contains(&s) {
                Some(s as usize)
            } else {
                match mode.as_str() {
                    "constant" => None,
                    _ if n == 0 => return Err("cannot pad an empty axis in this mode".into()),
                    "edge" => Some(s.clamp(0, n - 1) as usize),
                    "wrap" => Some(s.rem_euclid(n) as usize),
                    "reflect" => {
                        if n == 1 {
                            Some(0)
                        } else {
                            let p = 2 * (n - 1);
                            let q = s.rem_euclid(p);
                            Some((if q < n { q } else { p - q }) as usize)
                        }
                    }
                    other => return Err(format!("mode '{other}' is not supported")),
                }
            };
            m.push(v);
        }
        maps[ax] = m;
    }
    let fill_t = c.opt(2);
    let attr_fill = c.float("value", 0.0);
    macro_rules! fill {
        ($t:ty) => {
            match fill_t {
                Some(f) => <$t as Elem>::scalar(f).ok_or("bad constant_value")?,
                None => <$t as Elem>::scalar(&Tensor::F32(ndarray::arr0(attr_fill).into_dyn()))
                    .unwrap_or_default(),
            }
        };
    }
    Ok(match x {
        Tensor::F32(a) => Tensor::F32(pad_t(a, &maps, fill!(f32))),
        Tensor::F64(a) => Tensor::F64(pad_t(a, &maps, fill!(f64))),
        Tensor::I64(a) => Tensor::I64(pad_t(a, &maps, fill!(i64))),
        Tensor::I32(a) => Tensor::I32(pad_t(a, &maps, fill!(i32))),
        Tensor::U8(a) => Tensor::U8(pad_t(a, &maps, fill!(u8))),
        Tensor::Bool(a) => Tensor::Bool(pad_t(a, &maps, fill!(bool))),
    })
}

fn range(c: &Ctx) -> KResult<Tensor> {
    let (s, l, d) = (c.input(0)?, c.input(1)?, c.input(2)?);
    let f = |t: &Tensor| {
        t.to_f64()
            .iter()
            .next()
            .copied()
            .ok_or("empty operand".to_string())
    };
    let (sf, lf, df) = (f(s)?, f(l)?, f(d)?);
    if df == 0.0 {
        return Err("delta is 0".into());
    }
    let n = ((lf - sf) / df).ceil().max(0.0) as usize;
    if n > (1 << 28) {
        return Err(format!("range of {n} elements is too large"));
    }
    Ok(match s {
        Tensor::F32(_) => {
            let (s0, d0) = (sf as f32, df as f32);
            Tensor::F32(arr(&[n], (0..n).map(|i| s0 + i as f32 * d0).collect())?)
        }
        Tensor::F64(_) => Tensor::F64(arr(&[n], (0..n).map(|i| sf + i as f64 * df).collect())?),
        Tensor::I64(_) | Tensor::I32(_) => {
            let (s0, d0) = (s.to_i64_vec()[0], d.to_i64_vec()[0]);
            let v: Vec<i64> = (0..n as i64).map(|i| s0 + i * d0).collect();
            let t = Tensor::I64(arr(&[n], v)?);
            t.cast(s.dtype()).map_err(|e| e.to_string())?
        }
        other => return Err(format!("Range of {} is not supported", other.dtype())),
    })
}

fn trilu_t<T: Elem>(a: &ArrayD<T>, upper: bool, k: i64) -> KResult<ArrayD<T>> {
    if a.ndim() < 2 {
        return Err("input must have rank >= 2".into());
    }
    let mut out = a.as_standard_layout().into_owned();
    let r = a.ndim();
    for ((ix, v), _) in out.indexed_iter_mut().zip(0..) {
        let (i, j) = (ix[r - 2] as i64, ix[r - 1] as i64);
        let keep = if upper { j - i >= k } else { j - i <= k };
        if !keep {
            *v = T::default();
        }
    }
    Ok(out)
}

fn one_hot_t<T: Elem>(
    idx: &Tensor,
    depth: usize,
    ax: usize,
    vals: &ArrayD<T>,
) -> KResult<ArrayD<T>> {
    let v = flat(vals);
    if v.len() != 2 {
        return Err("values must have 2 elements".into());
    }
    let is = idx.shape();
    let mut shape = is.to_vec();
    shape.insert(ax, depth);
    let raw = idx.to_i64_vec();
    let iss = strides(is);
    Ok(ArrayD::from_shape_fn(IxDyn(&shape), |ix| {
        let mut off = 0;
        let mut k = 0;
        for (i, st) in iss.iter().enumerate() {
            let coord = if i < ax { ix[i] } else { ix[i + 1] };
            off += coord * st;
            k = i;
        }
        let _ = k;
        let mut t = raw.get(off).copied().unwrap_or(-1);
        if t < 0 {
            t += depth as i64;
        }
        if t == ix[ax] as i64 {
            v[1].clone()
        } else {
            v[0].clone()
        }
    }))
}

fn constant(c: &Ctx) -> KResult<Tensor> {
    if let Some(t) = c.tensor_attr("value") {
        return Tensor::from_tensor_data(t).map_err(|e| e.to_string());
    }
    if let Some(v) = c.op.attr("value_float").and_then(|a| a.as_float()) {
        return Ok(Tensor::F32(ndarray::arr0(v).into_dyn()));
    }
    if let Some(v) = c.op.int_attr("value_int") {
        return Ok(Tensor::I64(ndarray::arr0(v).into_dyn()));
    }
    if let Some(v) = c.ints("value_ints") {
        return Ok(Tensor::I64(arr(&[v.len()], v)?));
    }
    if let Some(pipec_compiler::ir::Attr::Floats(v)) = c.op.attr("value_floats") {
        return Ok(Tensor::F32(arr(&[v.len()], v.clone())?));
    }
    Err("no supported value attribute".into())
}

/// Shape and indexing ops; `None` if `op` is not one of them.
pub(crate) fn eval(op: &str, c: &Ctx) -> Option<KResult<Vec<Tensor>>> {
    let r = || -> KResult<Vec<Tensor>> {
        let one = |t: Tensor| Ok(vec![t]);
        match op {
            "Constant" => one(constant(c)?),
            "Shape" => {
                let s: Vec<i64> = c.input(0)?.shape().iter().map(|d| *d as i64).collect();
                let r = s.len() as i64;
                let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (b, e) = (clampi(c.int("start", 0)), clampi(c.int("end", r)));
                let v = s[b..e.max(b)].to_vec();
                one(Tensor::I64(arr(&[v.len()], v)?))
            }
            "Size" => one(Tensor::I64(
                ndarray::arr0(c.input(0)?.len() as i64).into_dyn(),
            )),
            "Reshape" => one(reshape(c)?),
            "Flatten" => one(flatten(c)?),
            "Transpose" => one(transpose(c)?),
            "Squeeze" => one(squeeze(c)?),
            "Unsqueeze" => one(unsqueeze(c)?),
            "Concat" => one(concat(c)?),
            "Split" => split(c),
            "Slice" => one(slice(c)?),
            "Gather" => {
                let x = c.input(0)?;
                let ax = norm_axis(c.int("axis", 0), x.shape().len())?;
                let it = c.input(1)?;
                let idx = index_vec(it, x.shape()[ax])?;
                one(map_any!(x, a => gather_t(a, &idx, it.shape(), ax)?))
            }
            "GatherElements" => {
                let x = c.input(0)?;
                let ax = norm_axis(c.int("axis", 0), x.shape().len())?;
                let it = c.input(1)?;
                let offs = element_offsets(x.shape(), it.shape(), it, ax)?;
                one(map_any!(x, a => gather_elements_t(a, &offs, it.shape())?))
            }
            "GatherND" => {
                let x = c.input(0)?;
                let it = c.input(1)?;
                let b = c.int("batch_dims", 0).max(0) as usize;
                let (offs, slice) = nd_offsets(x.shape(), it, b)?;
                let k = it.shape().last().copied().unwrap_or(0);
                let mut shape = it.shape()[..it.shape().len() - 1].to_vec();
                shape.extend_from_slice(&x.shape()[b + k..]);
                one(map_any!(x, a => gather_nd_t(a, &offs, slice, &shape)?))
            }
            "ScatterElements" | "Scatter" => {
                let x = c.input(0)?;
                let ax = norm_axis(c.int("axis", 0), x.shape().len())?;
                let (it, upd) = (c.input(1)?, c.input(2)?);
                if it.shape() != upd.shape() {
                    return Err("indices and updates differ in shape".into());
                }
                if upd.dtype() != x.dtype() {
                    return Err("updates must have the dtype of the data".into());
                }
                let offs = element_offsets(x.shape(), it.shape(), it, ax)?;
                let red = reduction(c)?;
                one(num_map!(x, a => scatter_elements_t(a, &offs, upd, red)?))
            }
            "ScatterND" => {
                let x = c.input(0)?;
                let (it, upd) = (c.input(1)?, c.input(2)?);
                if upd.dtype() != x.dtype() {
                    return Err("updates must have the dtype of the data".into());
                }
                let (offs, slice) = nd_offsets(x.shape(), it, 0)?;
                let red = reduction(c)?;
                one(num_map!(x, a => scatter_nd_t(a, &offs, slice, upd, red)?))
            }
            "Expand" => {
                let x = c.input(0)?;
                let shape = usizes(&c.ints_input(1).ok_or("shape is required")?, "shape")?;
                one(map_any!(x, a => expand_t(a, &shape)?))
            }
            "Tile" => {
                let x = c.input(0)?;
                let reps = usizes(&c.ints_input(1).ok_or("repeats are required")?, "repeats")?;
                one(map_any!(x, a => tile_t(a, &reps)?))
            }
            "Pad" => one(pad(c)?),
            "Range" => one(range(c)?),
            "ConstantOfShape" => {
                let shape = usizes(&c.ints_input(0).ok_or("shape is required")?, "shape")?;
                let v = match c.tensor_attr("value") {
                    Some(t) => Tensor::from_tensor_data(t).map_err(|e| e.to_string())?,
                    None => Tensor::F32(ndarray::arr1(&[0f32]).into_dyn()),
                };
                if v.len() != 1 {
                    return Err("value must have one element".into());
                }
                one(map_any!(&v, a => {
                    let e = a.iter().next().cloned().ok_or("empty value")?;
                    ArrayD::from_elem(IxDyn(&shape), e)
                }))
            }
            "Trilu" => {
                let x = c.input(0)?;
                let k = c
                    .ints_input(1)
                    .and_then(|v| v.first().copied())
                    .unwrap_or(0);
                let upper = c.int("upper", 1) != 0;
                one(map_any!(x, a => trilu_t(a, upper, k)?))
            }
            "OneHot" => {
                let (it, d, v) = (c.input(0)?, c.input(1)?, c.input(2)?);
                let depth = d.to_f64().iter().next().copied().ok_or("empty depth")?;
                if depth < 1.0 {
                    return Err(format!("depth {depth} must be positive"));
                }
                let ax = norm_axis(c.int("axis", -1), it.shape().len() + 1)?;
                one(map_any!(v, a => one_hot_t(it, depth as usize, ax, a)?))
            }
            _ => Err(String::new()),
        }
    };
    const OPS: &[&str] = &[
        "Constant",
        "Shape",
        "Size",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Concat",
        "Split",
        "Slice",
        "Gather",
        "GatherElements",
        "GatherND",
        "ScatterElements",
        "Scatter",
        "ScatterND",
        "Expand",
        "Tile",
        "Pad",
        "Range",
        "ConstantOfShape",
        "Trilu",
        "OneHot",
    ];
    if OPS.contains(&op) {
        Some(r())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Slice definition the kernel had before (index lists per axis, `select`).
    fn slice_by_select(
        a: &ArrayD<i64>,
        starts: &[i64],
        ends: &[i64],
        axes: &[i64],
        steps: &[i64],
    ) -> ArrayD<i64> {
        let mut out = a.clone();
        for i in 0..starts.len() {
            let ax = norm_axis(axes[i], a.ndim()).unwrap();
            let dim = a.shape()[ax] as i64;
            let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
            let (s, e) = (fix(starts[i]), fix(ends[i]));
            let idx: Vec<usize> = if steps[i] > 0 {
                let (s, e) = (s.clamp(0, dim), e.clamp(0, dim));
                (s..e.max(s))
                    .step_by(steps[i] as usize)
                    .map(|v| v as usize)
                    .collect()
            } else {
                let (s, e) = (s.clamp(0, dim - 1), e.clamp(-1, dim - 1));
                let mut v = Vec::new();
                let mut k = s;
                while k > e {
                    v.push(k as usize);
                    k += steps[i];
                }
                v
            };
            out = out.select(Axis(ax), &idx);
        }
        out.as_standard_layout().into_owned()
    }

    fn iota(shape: &[usize]) -> ArrayD<i64> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(IxDyn(shape), (0..n as i64).collect()).unwrap()
    }

    #[test]
    fn slice_matches_select() {
        let a = iota(&[3, 5, 4, 6]);
        #[allow(clippy::type_complexity)]
        let cases: Vec<(Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>)> = vec![
            (vec![0, 0], vec![3, 3], vec![2, 3], vec![1, 1]), // the Conv gradient's cut to K
            (vec![1], vec![i64::MAX], vec![1], vec![2]),
            (vec![-1, 4], vec![i64::MIN, 0], vec![3, 1], vec![-2, -1]),
            (
                vec![2, -3, 0],
                vec![1, 100, 4],
                vec![0, 3, 2],
                vec![1, 1, 3],
            ), // empty axis 0
            (
                vec![0, 1, 1, 1],
                vec![3, 4, 3, 5],
                vec![0, 1, 2, 3],
                vec![2, 2, 1, 3],
            ),
            (vec![5], vec![-100], vec![-1], vec![-1]),
        ];
        for (st, en, ax, sp) in cases {
            let want = slice_by_select(&a, &st, &en, &ax, &sp);
            let (off, shape, strides) = slice_view(a.shape(), &st, &en, &ax, &sp).unwrap();
            let got = gather_strided(a.as_slice().unwrap(), off, &shape, &strides);
            assert_eq!(shape, want.shape(), "{st:?} {en:?} {ax:?} {sp:?}");
            assert_eq!(got, want.as_slice().unwrap(), "{st:?} {en:?} {ax:?} {sp:?}");
        }
    }

    #[test]
    fn permute_matches_ndarray() {
        let a = iota(&[2, 3, 1, 4, 5]);
        for perm in [
            vec![1, 0, 2, 3, 4],
            vec![4, 3, 2, 1, 0],
            vec![0, 2, 1, 4, 3],
            vec![3, 4, 0, 1, 2],
            vec![0, 1, 2, 3, 4],
        ] {
            let want = a
                .view()
                .permuted_axes(IxDyn(&perm))
                .as_standard_layout()
                .into_owned();
            assert_eq!(permute_copy(&a, &perm).unwrap(), want, "{perm:?}");
        }
        let s = iota(&[]);
        assert_eq!(permute_copy(&s, &[]).unwrap(), s);
        let e = iota(&[2, 0, 3]);
        assert_eq!(permute_copy(&e, &[2, 1, 0]).unwrap().shape(), &[3, 0, 2]);
    }
}
