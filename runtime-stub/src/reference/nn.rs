//! Linear algebra, convolution, pooling and normalisation kernels (generic over f32/f64).

use super::elementwise::{broadcast_shape, Fl};
use super::{norm_axis, Ctx, KResult};
use crate::tensor::Tensor;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, Array3, ArrayD, ArrayView2, ArrayViewMut2, Axis, IxDyn};
use std::borrow::Cow;

/// The elements in row-major order (borrowed when already contiguous).
pub(crate) fn flat<T: Clone>(a: &ArrayD<T>) -> Cow<'_, [T]> {
    match a.as_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}

fn arr<T>(shape: &[usize], v: Vec<T>) -> KResult<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| e.to_string())
}

fn same<'a, T>(
    x: &'a Tensor,
    get: impl Fn(&'a Tensor) -> Option<&'a ArrayD<T>>,
    what: &str,
) -> KResult<&'a ArrayD<T>> {
    get(x).ok_or_else(|| {
        format!(
            "{what} must have the same float type as the input, got {}",
            x.dtype()
        )
    })
}

fn get_f32(t: &Tensor) -> Option<&ArrayD<f32>> {
    match t {
        Tensor::F32(a) => Some(a),
        _ => None,
    }
}
fn get_f64(t: &Tensor) -> Option<&ArrayD<f64>> {
    match t {
        Tensor::F64(a) => Some(a),
        _ => None,
    }
}

/// Dispatch a float kernel on the type of operand 0, fetching the other float operands with the
/// same type. `$f` is called as `$f(x, &[Option<&ArrayD<T>>])` for the remaining operands.
macro_rules! float_kernel {
    ($c:expr, $f:ident) => {{
        let x = $c.input(0)?;
        match x {
            Tensor::F32(a) => {
                let rest: Vec<Option<&ArrayD<f32>>> = (1..$c.inputs.len())
                    .map(|i| $c.opt(i).map(|t| same(t, get_f32, "operand")).transpose())
                    .collect::<KResult<_>>()?;
                $f($c, a, &rest)?
                    .into_iter()
                    .map(Tensor::F32)
                    .collect::<Vec<_>>()
            }
            Tensor::F64(a) => {
                let rest: Vec<Option<&ArrayD<f64>>> = (1..$c.inputs.len())
                    .map(|i| $c.opt(i).map(|t| same(t, get_f64, "operand")).transpose())
                    .collect::<KResult<_>>()?;
                $f($c, a, &rest)?
                    .into_iter()
                    .map(Tensor::F64)
                    .collect::<Vec<_>>()
            }
            other => return Err(format!("expects a float input, got {}", other.dtype())),
        }
    }};
}

fn req<'a, T>(rest: &[Option<&'a ArrayD<T>>], i: usize) -> KResult<&'a ArrayD<T>> {
    rest.get(i - 1)
        .copied()
        .flatten()
        .ok_or_else(|| format!("operand {i} is required"))
}
fn opt<'a, T>(rest: &[Option<&'a ArrayD<T>>], i: usize) -> Option<&'a ArrayD<T>> {
    rest.get(i - 1).copied().flatten()
}

// ---------------------------------------------------------------- matmul, gemm, einsum

pub(crate) fn matmul<T: Fl>(a: &ArrayD<T>, b: &ArrayD<T>) -> KResult<ArrayD<T>> {
    let (ra, rb) = (a.ndim(), b.ndim());
    if ra == 0 || rb == 0 {
        return Err("MatMul operands must have rank >= 1".into());
    }
    let a2 = if ra == 1 {
        a.view().insert_axis(Axis(0))
    } else {
        a.view()
    };
    let b2 = if rb == 1 {
        b.view().insert_axis(Axis(1))
    } else {
        b.view()
    };
    let (sa, sb) = (a2.shape().to_vec(), b2.shape().to_vec());
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        return Err(format!(
            "MatMul shapes {:?} and {:?} do not match",
            a.shape(),
            b.shape()
        ));
    }
    let batch = broadcast_shape(&sa[..sa.len() - 2], &sb[..sb.len() - 2])?;
    let nb: usize = batch.iter().product();
    let mut out_shape = batch.clone();
    out_shape.extend([m, n]);
    let out = if sb.len() == 2 {
        // [.., m, k] x [k, n]: one GEMM over all rows.
        let mut full = batch.clone();
        full.extend([m, k]);
        let av = a2
            .broadcast(IxDyn(&full))
            .ok_or("cannot broadcast")?
            .as_standard_layout()
            .into_owned();
        let av = av
            .into_shape_with_order((nb * m, k))
            .map_err(|e| e.to_string())?;
        let bv = b2
            .into_dimensionality::<ndarray::Ix2>()
            .map_err(|e| e.to_string())?;
        let mut o = Array2::<T>::zeros((nb * m, n));
        general_mat_mul(T::one(), &av, &bv, T::zero(), &mut o);
        o.into_dyn()
    } else {
        let mut fa = batch.clone();
        fa.extend([m, k]);
        let mut fb = batch.clone();
        fb.extend([k, n]);
        let av = a2
            .broadcast(IxDyn(&fa))
            .ok_or("cannot broadcast")?
            .as_standard_layout()
            .into_owned();
        let bv = b2
            .broadcast(IxDyn(&fb))
            .ok_or("cannot broadcast")?
            .as_standard_layout()
            .into_owned();
        let av: Array3<T> = av
            .into_shape_with_order((nb, m, k))
            .map_err(|e| e.to_string())?;
        let bv: Array3<T> = bv
            .into_shape_with_order((nb, k, n))
            .map_err(|e| e.to_string())?;
        let mut o = Array3::<T>::zeros((nb, m, n));
        for i in 0..nb {
            let mut oi = o.index_axis_mut(Axis(0), i);
            general_mat_mul(
                T::one(),
                &av.index_axis(Axis(0), i),
                &bv.index_axis(Axis(0), i),
                T::zero(),
                &mut oi,
            );
        }
        o.into_dyn()
    };
    let mut final_shape = batch;
    if ra != 1 {
        final_shape.push(m);
    }
    if rb != 1 {
        final_shape.push(n);
    }
    out.into_shape_with_order(IxDyn(&final_shape))
        .map_err(|e| e.to_string())
}

fn gemm<T: Fl>(c: &Ctx, a: &ArrayD<T>, rest: &[Option<&ArrayD<T>>]) -> KResult<Vec<ArrayD<T>>> {
    let b = req(rest, 1)?;
    let a = a
        .view()
        .into_dimensionality::<ndarray::Ix2>()
        .map_err(|_| "A must be 2-D".to_string())?;
    let b = b
        .view()
        .into_dimensionality::<ndarray::Ix2>()
        .map_err(|_| "B must be 2-D".to_string())?;
    let a = if c.int("transA", 0) != 0 {
        a.reversed_axes()
    } else {
        a
    };
    let b = if c.int("transB", 0) != 0 {
        b.reversed_axes()
    } else {
        b
    };
    let (m, k) = a.dim();
    let (k2, n) = b.dim();
    if k != k2 {
        return Err(format!("Gemm inner dims differ: {k} and {k2}"));
    }
    let alpha = T::c(c.float("alpha", 1.0) as f64);
    let beta = T::c(c.float("beta", 1.0) as f64);
    let (mut o, beta) = match opt(rest, 2) {
        Some(cc) => (
            cc.broadcast(IxDyn(&[m, n]))
                .ok_or_else(|| {
                    format!(
                        "C of shape {:?} does not broadcast to [{m}, {n}]",
                        cc.shape()
                    )
                })?
                .into_dimensionality::<ndarray::Ix2>()
                .map_err(|e| e.to_string())?
                .to_owned(),
            beta,
        ),
        None => (Array2::zeros((m, n)), T::zero()),
    };
    general_mat_mul(alpha, &a, &b, beta, &mut o);
    Ok(vec![o.into_dyn()])
}

/// General Einsum by direct summation over all index labels (with `...` and repeated labels).
pub(crate) fn einsum<T: Fl>(eq: &str, ops: &[&ArrayD<T>]) -> KResult<ArrayD<T>> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ops.len() {
        return Err(format!(
            "equation has {} operands but the node has {}",
            terms.len(),
            ops.len()
        ));
    }
    // Ellipsis labels are private-use chars, right-aligned across operands.
    let ell = |i: usize| char::from_u32(0xE000 + i as u32).unwrap_or('?');
    let mut max_ell = 0usize;
    let mut labels: Vec<Vec<char>> = Vec::new();
    for (t, a) in terms.iter().zip(ops) {
        let named = t.replace("...", "").chars().count();
        if a.ndim() < named {
            return Err(format!(
                "term '{t}' has more labels than the operand's rank {}",
                a.ndim()
            ));
        }
        let ne = if t.contains("...") {
            a.ndim() - named
        } else {
            0
        };
        if !t.contains("...") && a.ndim() != named {
            return Err(format!(
                "term '{t}' does not match the operand's rank {}",
                a.ndim()
            ));
        }
        max_ell = max_ell.max(ne);
        let (pre, post) = t.split_once("...").unwrap_or((t, ""));
        let mut l: Vec<char> = pre.chars().collect();
        l.extend((0..ne).map(|i| ell(max_ell.max(ne) - ne + i)));
        l.extend(post.chars());
        labels.push(l);
    }
    // Re-align ellipsis labels to the largest ellipsis rank.
    for (t, l) in terms.iter().zip(labels.iter_mut()) {
        if let Some(p) = t.find("...") {
            let pre = t[..p].chars().count();
            let ne = l.len() - t.replace("...", "").chars().count();
            for i in 0..ne {
                l[pre + i] = ell(max_ell - ne + i);
            }
        }
    }
    let out: Vec<char> = match rhs {
        Some(r) => {
            let (pre, post) = r.split_once("...").unwrap_or((&r, ""));
            let mut o: Vec<char> = pre.chars().collect();
            if r.contains("...") {
                o.extend((0..max_ell).map(ell));
            }
            o.extend(post.chars());
            o
        }
        None => {
            let mut o: Vec<char> = (0..max_ell).map(ell).collect();
            let mut once: Vec<char> = Vec::new();
            for ch in labels.iter().flatten() {
                if ch.is_ascii_alphabetic()
                    && labels.iter().flatten().filter(|c| *c == ch).count() == 1
                {
                    once.push(*ch);
                }
            }
            once.sort_unstable();
            o.extend(once);
            o
        }
    };
    let mut all: Vec<char> = out.clone();
    for ch in labels.iter().flatten() {
        if !all.contains(ch) {
            all.push(*ch);
        }
    }
    let mut size = vec![1usize; all.len()];
    for (l, a) in labels.iter().zip(ops) {
        for (ch, &d) in l.iter().zip(a.shape()) {
            let i = all.iter().position(|c| c == ch).ok_or("bad label")?;
            if d != 1 {
                if size[i] != 1 && size[i] != d {
                    return Err(format!("label '{ch}' has sizes {} and {d}", size[i]));
                }
                size[i] = d;
            }
        }
    }
    // Per operand, the stride of each label (0 where broadcast), summed over repeats.
    let datas: Vec<Cow<[T]>> = ops.iter().map(|a| flat(a)).collect();
    let mut strides: Vec<Vec<usize>> = Vec::new();
    for (l, a) in labels.iter().zip(ops) {
        let mut st = vec![0usize; all.len()];
        let mut s = 1usize;
        for (j, ch) in l.iter().enumerate().rev() {
            let i = all.iter().position(|c| c == ch).ok_or("bad label")?;
            if a.shape()[j] != 1 {
                st[i] += s;
            }
            s *= a.shape()[j];
        }
        strides.push(st);
    }
    for ch in &out {
        if !labels.iter().flatten().any(|c| c == ch) {
            return Err(format!("output label '{ch}' is not in any input"));
        }
    }
    let out_shape: Vec<usize> = size[..out.len()].to_vec();
    let n_out: usize = out_shape.iter().product();
    let n_in: usize = size[out.len()..].iter().product();
    let mut res = vec![T::zero(); n_out];
    let mut idx = vec![0usize; all.len()];
    for r in res.iter_mut() {
        let mut acc = T::zero();
        for _ in 0..n_in {
            let mut p = T::one();
            for (d, st) in datas.iter().zip(&strides) {
                let off: usize = idx.iter().zip(st).map(|(i, s)| i * s).sum();
                p *= d[off];
            }
            acc += p;
            // advance the contracted labels
            for j in (out.len()..all.len()).rev() {
                idx[j] += 1;
                if idx[j] < size[j] {
                    break;
                }
                idx[j] = 0;
            }
        }
        *r = acc;
        for j in (0..out.len()).rev() {
            idx[j] += 1;
            if idx[j] < size[j] {
                break;
            }
            idx[j] = 0;
        }
    }
    arr(&out_shape, res)
}

// ---------------------------------------------------------------- convolution and pooling

/// Spatial geometry of a 2-D window op (1-D ops are lifted to 2-D with height 1).
struct Geo {
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    pb: [usize; 2],
    pe: [usize; 2],
}

fn two(v: &[i64], lift: bool, fill: i64) -> KResult<[usize; 2]> {
    let g = |x: i64| usize::try_from(x).map_err(|_| format!("negative value {x} in an attribute"));
    match (v.len(), lift) {
        (1, true) => Ok([g(fill)?, g(v[0])?]),
        (2, false) => Ok([g(v[0])?, g(v[1])?]),
        _ => Err(format!(
            "attribute has {} values; only 1-D and 2-D windows are supported",
            v.len()
        )),
    }
}

/// Geometry from the attributes; `kernel` is the spatial kernel shape, `input` the spatial input.
fn geometry(c: &Ctx, kernel: &[usize], input: &[usize], lift: bool, ceil: bool) -> KResult<Geo> {
    let nsp = kernel.len();
    let kernel_i: Vec<i64> = kernel.iter().map(|k| *k as i64).collect();
    let k = two(&kernel_i, lift, 1)?;
    let s = two(&c.ints("strides").unwrap_or(vec![1; nsp]), lift, 1)?;
    let d = two(&c.ints("dilations").unwrap_or(vec![1; nsp]), lift, 1)?;
    let pads = c.ints("pads").unwrap_or(vec![0; 2 * nsp]);
    if pads.len() != 2 * nsp {
        return Err(format!(
            "pads has {} values for {nsp} spatial dims",
            pads.len()
        ));
    }
    let mut pb = two(&pads[..nsp], lift, 0)?;
    let mut pe = two(&pads[nsp..], lift, 0)?;
    let inp: Vec<i64> = input.iter().map(|x| *x as i64).collect();
    let inp = two(&inp, lift, 1)?;
    let auto = c.string("auto_pad", "NOTSET");
    match auto.as_str() {
        "NOTSET" => {}
        "VALID" => {
            pb = [0, 0];
            pe = [0, 0];
        }
        "SAME_UPPER" | "SAME_LOWER" => {
            if s.contains(&0) || k.contains(&0) {
                return Err("kernel and strides must be positive".into());
            }
            for i in 0..2 {
                let out = inp[i].div_ceil(s[i]);
                let need = ((out.max(1) - 1) * s[i] + (k[i] - 1) * d[i] + 1).saturating_sub(inp[i]);
                let small = need / 2;
                if auto == "SAME_UPPER" {
                    pb[i] = small;
                    pe[i] = need - small;
                } else {
                    pb[i] = need - small;
                    pe[i] = small;
                }
            }
        }
        other => return Err(format!("auto_pad '{other}' is not supported")),
    }
    let _ = ceil;
    if s.contains(&0) || d.contains(&0) || k.contains(&0) {
        return Err("kernel, strides and dilations must be positive".into());
    }
    Ok(Geo { k, s, d, pb, pe })
}

fn out_size(inp: usize, g: &Geo, i: usize, ceil: bool) -> KResult<usize> {
    let span = (g.k[i] - 1) * g.d[i] + 1;
    let padded = inp + g.pb[i] + g.pe[i];
    if padded < span {
        return Err(format!(
            "window {span} is larger than the padded input {padded}"
        ));
    }
    let mut o = if ceil {
        (padded - span).div_ceil(g.s[i]) + 1
    } else {
        (padded - span) / g.s[i] + 1
    };
    if ceil && (o - 1) * g.s[i] >= inp + g.pb[i] {
        o -= 1;
    }
    Ok(o)
}

/// Input as 4-D [n, c, h, w]: 1-D spatial inputs get h = 1.
fn as4(shape: &[usize]) -> KResult<([usize; 4], bool)> {
    match shape.len() {
        3 => Ok(([shape[0], shape[1], 1, shape[2]], true)),
        4 => Ok(([shape[0], shape[1], shape[2], shape[3]], false)),
        r => Err(format!(
            "only 1-D and 2-D spatial inputs are supported (rank {r})"
        )),
    }
}

/// Elements of the im2col (or ConvTranspose column) buffer one GEMM may use: batch items are
/// packed side by side into one GEMM's columns up to this size. The convolutions of the Conv
/// weight gradient (`passes/src/transforms/autodiff/conv.rs`: batch = input channels, kernel = `dY`) have
/// only a handful of output positions per item, so one GEMM per item was hundreds of skinny GEMMs
/// that re-packed the whole kernel each time; merged, it is one well-shaped GEMM per group.
const COLS_CAP: usize = 1 << 22;

/// Runs a convolution kernel `f(x, w, cols_cap)` in float64 for a float32 `T`
/// ([`Fl::WIDE_ACCUMULATION`]) and rounds its result once: each output element is a dot product
/// of `C/group * kh * kw` terms (thousands in late 1x1 convolutions), which a float32 GEMM
/// accumulates with up to ~K u error (Higham, 2nd ed., eq. 3.5); the forward's rounding is what
/// the backward carries into every weight gradient. The im2col buffer keeps its byte budget.
fn widened<T: Fl>(
    x: &[T],
    w: &[T],
    f: impl Fn(&[f64], &[f64], usize) -> KResult<Vec<f64>>,
) -> KResult<Vec<T>> {
    let x64: Vec<f64> = x.iter().map(|v| v.to64()).collect();
    let w64: Vec<f64> = w.iter().map(|v| v.to64()).collect();
    let cap = if T::WIDE_ACCUMULATION {
        COLS_CAP / 2
    } else {
        COLS_CAP
    };
    Ok(f(&x64, &w64, cap)?.into_iter().map(T::c).collect())
}

/// The output positions `o` in `0..out` whose input position `o*s + off - pb` lies in `0..inp`,
/// as a half-open range (`off` is the kernel tap's offset `k*d`).
fn valid_range(out: usize, inp: usize, s: usize, off: usize, pb: usize) -> (usize, usize) {
    // o*s + off >= pb  <=>  o >= ceil((pb - off) / s)
    let lo = if pb > off { (pb - off).div_ceil(s) } else { 0 };
    // o*s + off - pb < inp  <=>  o*s < inp + pb - off  <=>  o < ceil((inp + pb - off) / s)
    let hi = if inp + pb > off {
        (inp + pb - off).div_ceil(s)
    } else {
        0
    };
    (lo.min(out), hi.min(out).max(lo.min(out)))
}

/// Convolution on contiguous data, `x` `[n, ch, h, wd]`, `w` `[m, cg, kh, kw]` (`ch = cg *
/// group`), output `[n, m, oh, ow]` without bias: im2col + one GEMM per group and chunk of at
/// most `cap / (cg kh kw oh ow)` batch items.
#[allow(clippy::too_many_arguments)]
fn conv_core<T: Fl>(
    xs: &[T],
    [n, ch, h, wd]: [usize; 4],
    wv: &[T],
    m: usize,
    group: usize,
    g: &Geo,
    [oh, ow]: [usize; 2],
    cap: usize,
) -> KResult<Vec<T>> {
    let cg = ch / group;
    let (kh, kw) = (g.k[0], g.k[1]);
    let mg = m / group;
    let k = cg * kh * kw;
    let p = oh * ow;
    let mut out = vec![T::zero(); n * m * p];
    if out.is_empty() || k == 0 {
        return Ok(out);
    }
    let nb = (cap / (k * p).max(1)).clamp(1, n);
    let mut cols = vec![T::zero(); k * nb * p];
    let mut tmp = if nb > 1 {
        vec![T::zero(); mg * nb * p]
    } else {
        Vec::new()
    };
    for b0 in (0..n).step_by(nb) {
        let nbb = nb.min(n - b0);
        let cn = nbb * p; // columns of this chunk's GEMM
        for gi in 0..group {
            for ci in 0..cg {
                for ki in 0..kh {
                    let (ylo, yhi) = valid_range(oh, h, g.s[0], ki * g.d[0], g.pb[0]);
                    for kj in 0..kw {
                        let (xlo, xhi) = valid_range(ow, wd, g.s[1], kj * g.d[1], g.pb[1]);
                        let row = ((ci * kh + ki) * kw + kj) * cn;
                        for bb in 0..nbb {
                            let base = ((b0 + bb) * ch + gi * cg + ci) * h * wd;
                            let dst = &mut cols[row + bb * p..row + (bb + 1) * p];
                            dst[..ylo * ow].fill(T::zero());
                            dst[yhi * ow..].fill(T::zero());
                            for oy in ylo..yhi {
                                let iy = oy * g.s[0] + ki * g.d[0] - g.pb[0];
                                let d = &mut dst[oy * ow..(oy + 1) * ow];
                                d[..xlo].fill(T::zero());
                                d[xhi..].fill(T::zero());
                                if xlo == xhi {
                                    continue;
                                }
                                // first input column of the valid run
                                let src = base + iy * wd + xlo * g.s[1] + kj * g.d[1] - g.pb[1];
                                if g.s[1] == 1 {
                                    d[xlo..xhi].copy_from_slice(&xs[src..src + (xhi - xlo)]);
                                } else {
                                    for (j, v) in d[xlo..xhi].iter_mut().enumerate() {
                                        *v = xs[src + j * g.s[1]];
                                    }
                                }
                            }
                        }
                    }
                }
            }
            let wg = ArrayView2::from_shape((mg, k), &wv[gi * mg * k..(gi + 1) * mg * k])
                .map_err(|e| e.to_string())?;
            let cv = ArrayView2::from_shape((k, cn), &cols[..k * cn]).map_err(|e| e.to_string())?;
            if nbb == 1 {
                let o0 = (b0 * m + gi * mg) * p;
                let mut ov = ArrayViewMut2::from_shape((mg, p), &mut out[o0..o0 + mg * p])
                    .map_err(|e| e.to_string())?;
                general_mat_mul(T::one(), &wg, &cv, T::zero(), &mut ov);
            } else {
                let mut tv = ArrayViewMut2::from_shape((mg, cn), &mut tmp[..mg * cn])
                    .map_err(|e| e.to_string())?;
                general_mat_mul(T::one(), &wg, &cv, T::zero(), &mut tv);
                for mi in 0..mg {
                    for bb in 0..nbb {
                        let o0 = ((b0 + bb) * m + gi * mg + mi) * p;
                        let t0 = mi * cn + bb * p;
                        out[o0..o0 + p].copy_from_slice(&tmp[t0..t0 + p]);
                    }
                }
            }
        }
    }
    Ok(out)
}

fn conv<T: Fl>(c: &Ctx, x: &ArrayD<T>, rest: &[Option<&ArrayD<T>>]) -> KResult<Vec<ArrayD<T>>> {
    let w = req(rest, 1)?;
    let ([n, ch, h, wd], lift) = as4(x.shape())?;
    if w.ndim() != x.ndim() {
        return Err(format!(
            "weight rank {} differs from input rank {}",
            w.ndim(),
            x.ndim()
        ));
    }
    let ws = w.shape();
    let (m, cg) = (ws[0], ws[1]);
    let group = c.int("group", 1).max(1) as usize;
    if cg * group != ch || m % group != 0 {
        return Err(format!(
            "weight {ws:?} does not fit {ch} input channels in {group} groups"
        ));
    }
    let g = geometry(c, &ws[2..], &x.shape()[2..], lift, false)?;
    let (oh, ow) = (out_size(h, &g, 0, false)?, out_size(wd, &g, 1, false)?);
    let p = oh * ow;
    let mut out = widened(&flat(x), &flat(w), |x, w, cap| {
        conv_core(x, [n, ch, h, wd], w, m, group, &g, [oh, ow], cap)
    })?;
    add_bias(&mut out, opt(rest, 2), n, m, p)?;
    let shape: Vec<usize> = if lift {
        vec![n, m, ow]
    } else {
        vec![n, m, oh, ow]
    };
    Ok(vec![arr(&shape, out)?])
}

fn add_bias<T: Fl>(
    out: &mut [T],
    bias: Option<&ArrayD<T>>,
    n: usize,
    m: usize,
    p: usize,
) -> KResult<()> {
    if let Some(bias) = bias {
        let bs = flat(bias);
        if bs.len() != m {
            return Err(format!("bias has {} elements for {m} channels", bs.len()));
        }
        for b in 0..n {
            for (mi, bv) in bs.iter().enumerate() {
                for v in &mut out[(b * m + mi) * p..(b * m + mi + 1) * p] {
                    *v += *bv;
                }
            }
        }
    }
    Ok(())
}

fn conv_transpose<T: Fl>(
    c: &Ctx,
    x: &ArrayD<T>,
    rest: &[Option<&ArrayD<T>>],
) -> KResult<Vec<ArrayD<T>>> {
    let w = req(rest, 1)?;
    let ([n, ch, h, wd], lift) = as4(x.shape())?;
    if w.ndim() != x.ndim() {
        return Err(format!(
            "weight rank {} differs from input rank {}",
            w.ndim(),
            x.ndim()
        ));
    }
    let ws = w.shape();
    let group = c.int("group", 1).max(1) as usize;
    let (cw, mg) = (ws[0], ws[1]);
    if cw != ch || ch % group != 0 {
        return Err(format!(
            "weight {ws:?} does not fit {ch} input channels in {group} groups"
        ));
    }
    let m = mg * group;
    if h == 0 || wd == 0 {
        return Err("empty spatial input".into());
    }
    let nsp = ws.len() - 2;
    // The explicit pads are used unless output_shape is given.
    let mut g = geometry(c, &ws[2..], &x.shape()[2..], lift, false)?;
    let op = two(&c.ints("output_padding").unwrap_or(vec![0; nsp]), lift, 0)?;
    let inp = [h, wd];
    let full = |i: usize, g: &Geo| g.s[i] * (inp[i] - 1) + op[i] + (g.k[i] - 1) * g.d[i] + 1;
    let auto = c.string("auto_pad", "NOTSET");
    let out_shape_attr = c.ints("output_shape");
    let target: Option<[usize; 2]> = match &out_shape_attr {
        Some(os) => {
            let sp = if os.len() == nsp + 2 {
                &os[2..]
            } else {
                &os[..]
            };
            Some(two(sp, lift, 1)?)
        }
        None if auto == "SAME_UPPER" || auto == "SAME_LOWER" => {
            Some([inp[0] * g.s[0], inp[1] * g.s[1]])
        }
        None => None,
    };
    if let Some(t) = target {
        for i in 0..2 {
            let total = full(i, &g)
                .checked_sub(t[i])
                .ok_or_else(|| format!("output_shape {t:?} is larger than the full output"))?;
            if auto == "SAME_UPPER" {
                g.pb[i] = total / 2;
                g.pe[i] = total - total / 2;
            } else {
                g.pb[i] = total - total / 2;
                g.pe[i] = total / 2;
            }
        }
    }
    let oh = full(0, &g)
        .checked_sub(g.pb[0] + g.pe[0])
        .ok_or("pads larger than the output")?;
    let ow = full(1, &g)
        .checked_sub(g.pb[1] + g.pe[1])
        .ok_or("pads larger than the output")?;
    let mut out = widened(&flat(x), &flat(w), |x, w, cap| {
        conv_transpose_core(x, [n, ch, h, wd], w, mg, group, &g, [oh, ow], cap)
    })?;
    add_bias(&mut out, opt(rest, 2), n, m, oh * ow)?;
    let shape: Vec<usize> = if lift {
        vec![n, m, ow]
    } else {
        vec![n, m, oh, ow]
    };
    Ok(vec![arr(&shape, out)?])
}

/// ConvTranspose on contiguous data after the geometry is resolved: `x` `[n, ch, h, wd]`, `w`
/// `[ch, mg, kh, kw]`, output `[n, mg*group, oh, ow]` without bias. Per group and chunk of batch
/// items (columns up to `cap` elements): one GEMM `cols = W_g^T X_g` then col2im.
#[allow(clippy::too_many_arguments)]
fn conv_transpose_core<T: Fl>(
    xs: &[T],
    [n, ch, h, wd]: [usize; 4],
    wv: &[T],
    mg: usize,
    group: usize,
    g: &Geo,
    [oh, ow]: [usize; 2],
    cap: usize,
) -> KResult<Vec<T>> {
    let cg = ch / group;
    let m = mg * group;
    let (kh, kw) = (g.k[0], g.k[1]);
    let k = mg * kh * kw;
    let p = h * wd;
    let mut out = vec![T::zero(); n * m * oh * ow];
    if out.is_empty() || k == 0 || p == 0 {
        return Ok(out);
    }
    let nb = (cap / (k * p).max(1)).clamp(1, n);
    let mut cols = vec![T::zero(); k * nb * p];
    let mut xbuf = if nb > 1 {
        vec![T::zero(); cg * nb * p]
    } else {
        Vec::new()
    };
    for b0 in (0..n).step_by(nb) {
        let nbb = nb.min(n - b0);
        let cn = nbb * p;
        for gi in 0..group {
            let wg = ArrayView2::from_shape((cg, k), &wv[gi * cg * k..(gi + 1) * cg * k])
                .map_err(|e| e.to_string())?;
            let mut cv = ArrayViewMut2::from_shape((k, cn), &mut cols[..k * cn])
                .map_err(|e| e.to_string())?;
            if nbb == 1 {
                let x0 = (b0 * ch + gi * cg) * p;
                let xg = ArrayView2::from_shape((cg, p), &xs[x0..x0 + cg * p])
                    .map_err(|e| e.to_string())?;
                general_mat_mul(T::one(), &wg.t(), &xg, T::zero(), &mut cv);
            } else {
                for ci in 0..cg {
                    for bb in 0..nbb {
                        let x0 = ((b0 + bb) * ch + gi * cg + ci) * p;
                        let d0 = ci * cn + bb * p;
                        xbuf[d0..d0 + p].copy_from_slice(&xs[x0..x0 + p]);
                    }
                }
                let xg = ArrayView2::from_shape((cg, cn), &xbuf[..cg * cn])
                    .map_err(|e| e.to_string())?;
                general_mat_mul(T::one(), &wg.t(), &xg, T::zero(), &mut cv);
            }
            for bb in 0..nbb {
                for mi in 0..mg {
                    let obase = ((b0 + bb) * m + gi * mg + mi) * oh * ow;
                    for ki in 0..kh {
                        // input rows iy whose output row iy*s + ki*d - pb lies in 0..oh
                        let (ylo, yhi) = valid_range(h, oh, g.s[0], ki * g.d[0], g.pb[0]);
                        for kj in 0..kw {
                            let (xlo, xhi) = valid_range(wd, ow, g.s[1], kj * g.d[1], g.pb[1]);
                            if xlo == xhi {
                                continue;
                            }
                            let row = ((mi * kh + ki) * kw + kj) * cn + bb * p;
                            for iy in ylo..yhi {
                                let oy = iy * g.s[0] + ki * g.d[0] - g.pb[0];
                                let o0 = obase + oy * ow + xlo * g.s[1] + kj * g.d[1] - g.pb[1];
                                let src = &cols[row + iy * wd + xlo..row + iy * wd + xhi];
                                if g.s[1] == 1 {
                                    for (o, v) in out[o0..o0 + src.len()].iter_mut().zip(src) {
                                        *o += *v;
                                    }
                                } else {
                                    for (j, v) in src.iter().enumerate() {
                                        out[o0 + j * g.s[1]] += *v;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// MaxPool / AveragePool; MaxPool also gives the flat (row-major, whole-tensor) argmax indices.
fn pool<T: Fl>(c: &Ctx, x: &ArrayD<T>) -> KResult<(ArrayD<T>, ArrayD<i64>)> {
    let is_max = c.op.op_type == "MaxPool";
    let ([n, ch, h, wd], lift) = as4(x.shape())?;
    let kernel: Vec<usize> = c
        .ints("kernel_shape")
        .ok_or("kernel_shape is required")?
        .iter()
        .map(|k| usize::try_from(*k).map_err(|_| "negative kernel_shape".to_string()))
        .collect::<KResult<_>>()?;
    if c.int("storage_order", 0) != 0 {
        return Err("storage_order=1 is not supported".into());
    }
    let ceil = c.int("ceil_mode", 0) != 0;
    let g = geometry(c, &kernel, &x.shape()[2..], lift, ceil)?;
    let (oh, ow) = (out_size(h, &g, 0, ceil)?, out_size(wd, &g, 1, ceil)?);
    let include_pad = c.int("count_include_pad", 0) != 0;
    let xs = flat(x);
    let mut out = vec![T::zero(); n * ch * oh * ow];
    let mut idx = vec![0i64; if is_max { n * ch * oh * ow } else { 0 }];
    for nc in 0..n * ch {
        let base = nc * h * wd;
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best = T::neg_infinity();
                let mut bi = -1i64;
                let mut sum = T::zero();
                let mut cnt = 0usize;
                for ki in 0..g.k[0] {
                    let iy = (oy * g.s[0] + ki * g.d[0]) as isize - g.pb[0] as isize;
                    for kj in 0..g.k[1] {
                        let ix = (ox * g.s[1] + kj * g.d[1]) as isize - g.pb[1] as isize;
                        let inside = iy >= 0 && iy < h as isize && ix >= 0 && ix < wd as isize;
                        if !inside {
                            let in_pad =
                                iy < (h + g.pe[0]) as isize && ix < (wd + g.pe[1]) as isize;
                            if include_pad && in_pad {
                                cnt += 1;
                            }
                            continue;
                        }
                        let off = base + iy as usize * wd + ix as usize;
                        let v = xs[off];
                        if is_max {
                            if v > best || bi < 0 || v.is_nan() {
                                best = v;
                                bi = off as i64;
                            }
                        } else {
                            sum += v;
                            cnt += 1;
                        }
                    }
                }
                let o = (nc * oh + oy) * ow + ox;
                if is_max {
                    out[o] = best;
                    idx[o] = bi;
                } else {
                    out[o] = if cnt > 0 {
                        sum / T::c(cnt as f64)
                    } else {
                        T::zero()
                    };
                }
            }
        }
    }
    let shape: Vec<usize> = if lift {
        vec![n, ch, ow]
    } else {
        vec![n, ch, oh, ow]
    };
    let idx = if is_max {
        arr(&shape, idx)?
    } else {
        arr(&[0], idx)?
    };
    Ok((arr(&shape, out)?, idx))
}

fn global_pool<T: Fl>(
    c: &Ctx,
    x: &ArrayD<T>,
    _rest: &[Option<&ArrayD<T>>],
) -> KResult<Vec<ArrayD<T>>> {
    let is_max = c.op.op_type == "GlobalMaxPool";
    if x.ndim() < 2 {
        return Err("input must have rank >= 2".into());
    }
    let (n, ch) = (x.shape()[0], x.shape()[1]);
    let inner: usize = x.shape()[2..].iter().product();
    let xs = flat(x);
    let mut out = Vec::with_capacity(n * ch);
    for nc in 0..n * ch {
        let s = &xs[nc * inner..(nc + 1) * inner];
        out.push(if is_max {
            s.iter().copied().fold(
                T::neg_infinity(),
                |a, b| if b > a || b.is_nan() { b } else { a },
            )
        } else {
            // Accumulated in float64 and rounded once (as the reductions).
            T::c(s.iter().map(|v| v.to64()).sum::<f64>() / inner as f64)
        });
    }
    let mut shape = vec![n, ch];
    shape.extend(std::iter::repeat_n(1, x.ndim() - 2));
    Ok(vec![arr(&shape, out)?])
}

// ---------------------------------------------------------------- normalisation

fn batch_norm<T: Fl>(
    c: &Ctx,
    x: &ArrayD<T>,
    rest: &[Option<&ArrayD<T>>],
) -> KResult<Vec<ArrayD<T>>> {
    if c.int("training_mode", 0) != 0 {
        return Err("training_mode=1 is not supported (inference BatchNormalization only)".into());
    }
    let (scale, bias, mean, var) = (
        flat(req(rest, 1)?),
        flat(req(rest, 2)?),
        flat(req(rest, 3)?),
        flat(req(rest, 4)?),
    );
    let eps = T::c(c.float("epsilon", 1e-5) as f64);
    if x.ndim() < 2 {
        return Err("input must have rank >= 2".into());
    }
    let (n, ch) = (x.shape()[0], x.shape()[1]);
    for (nm, v) in [
        ("scale", &scale),
        ("B", &bias),
        ("mean", &mean),
        ("var", &var),
    ] {
        if v.len() != ch {
            return Err(format!("{nm} has {} elements for {ch} channels", v.len()));
        }
    }
    let inner: usize = x.shape()[2..].iter().product();
    let mut out = flat(x).into_owned();
    for b in 0..n {
        for ci in 0..ch {
            let a = scale[ci] / (var[ci] + eps).sqrt();
            let sh = bias[ci] - mean[ci] * a;
            for v in &mut out[(b * ch + ci) * inner..(b * ch + ci + 1) * inner] {
                *v = *v * a + sh;
            }
        }
    }
    Ok(vec![arr(x.shape(), out)?])
}

/// InstanceNormalization-6 and GroupNormalization-18/21: `X` `[N, C, D..]` normalised per
/// sample over each group of `C / G` channels and all spatial positions (biased variance),
/// then `scale * xhat + bias`. InstanceNormalization is `G = C`. Scale and bias are per
/// channel (`[C]`: InstanceNormalization, GroupNormalization from opset 21) or per group
/// (`[G]`: GroupNormalization-18, as its function body applies them).
fn group_norm<T: Fl>(
    c: &Ctx,
    x: &ArrayD<T>,
    rest: &[Option<&ArrayD<T>>],
) -> KResult<Vec<ArrayD<T>>> {
    let sh = x.shape();
    if sh.len() < 2 {
        return Err(format!("input of rank {} (needs N, C, ...)", sh.len()));
    }
    let (n, ch) = (sh[0], sh[1]);
    let sp: usize = sh[2..].iter().product();
    let instance = c.op.op_type == "InstanceNormalization";
    let groups = if instance {
        ch
    } else {
        let g = c.int("num_groups", 0);
        if g <= 0 || ch % g as usize != 0 {
            return Err(format!("num_groups {g} does not divide {ch} channels"));
        }
        g as usize
    };
    let per_group = !instance && c.opset < 21;
    let want = if per_group { groups } else { ch };
    let eps = T::c(c.float("epsilon", 1e-5) as f64);
    let vec_of = |i: usize, what: &str| -> KResult<Vec<T>> {
        let a = req(rest, i)?;
        if a.len() != want {
            return Err(format!("{what} has {} values, expected {want}", a.len()));
        }
        Ok(a.iter().copied().collect())
    };
    let scale = vec_of(1, "scale")?;
    let bias = vec_of(2, "bias")?;
    let cg = ch / groups;
    let blk = cg * sp;
    let xs = flat(x);
    let mut y = vec![T::zero(); xs.len()];
    let nf = T::c(blk as f64);
    for b in 0..n {
        for gi in 0..groups {
            let o = (b * groups + gi) * blk;
            let row = &xs[o..o + blk];
            let mean = row.iter().copied().fold(T::zero(), |a, v| a + v) / nf;
            let var = row
                .iter()
                .map(|v| (*v - mean) * (*v - mean))
                .fold(T::zero(), |a, v| a + v)
                / nf;
            let inv = T::one() / (var + eps).sqrt();
            for (i, v) in row.iter().enumerate() {
                let k = if per_group { gi } else { gi * cg + i / sp };
                y[o + i] = (*v - mean) * inv * scale[k] + bias[k];
            }
        }
    }
    Ok(vec![arr(sh, y)?])
}

fn layer_norm<T: Fl>(
    c: &Ctx,
    x: &ArrayD<T>,
    rest: &[Option<&ArrayD<T>>],
) -> KResult<Vec<ArrayD<T>>> {
    let rank = x.ndim();
    let ax = norm_axis(c.int("axis", -1), rank)?;
    let eps = T::c(c.float("epsilon", 1e-5) as f64);
    let norm_shape = &x.shape()[ax..];
    let inner: usize = norm_shape.iter().product();
    let outer: usize = x.shape()[..ax].iter().product();
    let bc = |a: &ArrayD<T>, what: &str| -> KResult<Vec<T>> {
        Ok(a.broadcast(IxDyn(norm_shape))
            .ok_or_else(|| {
                format!(
                    "{what} of shape {:?} does not broadcast to {norm_shape:?}",
                    a.shape()
                )
            })?
            .iter()
            .copied()
            .collect())
    };
    let scale = bc(req(rest, 1)?, "Scale")?;
    let bias = opt(rest, 2).map(|b| bc(b, "B")).transpose()?;
    let xs = flat(x);
    let mut y = vec![T::zero(); outer * inner];
    let mut means = Vec::with_capacity(outer);
    let mut invs = Vec::with_capacity(outer);
    let nf = T::c(inner as f64);
    for o in 0..outer {
        let row = &xs[o * inner..(o + 1) * inner];
        let mean = row.iter().copied().fold(T::zero(), |a, b| a + b) / nf;
        let var = row
            .iter()
            .map(|v| (*v - mean) * (*v - mean))
            .fold(T::zero(), |a, b| a + b)
            / nf;
        let inv = T::one() / (var + eps).sqrt();
        for (i, v) in row.iter().enumerate() {
            let mut r = (*v - mean) * inv * scale[i];
            if let Some(b) = &bias {
                r += b[i];
            }
            y[o * inner + i] = r;
        }
        means.push(mean);
        invs.push(inv);
    }
    let mut stat_shape = x.shape()[..ax].to_vec();
    stat_shape.extend(std::iter::repeat_n(1, rank - ax));
    Ok(vec![
        arr(x.shape(), y)?,
        arr(&stat_shape, means)?,
        arr(&stat_shape, invs)?,
    ])
}

fn softmax<T: Fl>(c: &Ctx, x: &ArrayD<T>, _rest: &[Option<&ArrayD<T>>]) -> KResult<Vec<ArrayD<T>>> {
    let log = c.op.op_type == "LogSoftmax";
    let rank = x.ndim();
    if rank == 0 {
        return Err("input must have rank >= 1".into());
    }
    let lanes = |mut a: ArrayD<T>, ax: usize| -> ArrayD<T> {
        for mut lane in a.lanes_mut(Axis(ax)) {
            let m = lane
                .iter()
                .copied()
                .fold(T::neg_infinity(), |a, b| if b > a { b } else { a });
            let m = if m.is_finite() { m } else { T::zero() };
            let s = lane
                .iter()
                .map(|v| (*v - m).exp())
                .fold(T::zero(), |a, b| a + b);
            if log {
                let ls = s.ln();
                lane.mapv_inplace(|v| v - m - ls);
            } else {
                lane.mapv_inplace(|v| (v - m).exp() / s);
            }
        }
        a
    };
    if c.opset >= 13 {
        let ax = norm_axis(c.int("axis", -1), rank)?;
        Ok(vec![lanes(x.as_standard_layout().into_owned(), ax)])
    } else {
        let ax = norm_axis(c.int("axis", 1), rank)?;
        let outer: usize = x.shape()[..ax].iter().product();
        let inner: usize = x.shape()[ax..].iter().product();
        let a = arr(&[outer, inner], flat(x).into_owned())?;
        let r = lanes(a, 1);
        Ok(vec![arr(x.shape(), flat(&r).into_owned())?])
    }
}

fn matmul_k<T: Fl>(
    _c: &Ctx,
    a: &ArrayD<T>,
    rest: &[Option<&ArrayD<T>>],
) -> KResult<Vec<ArrayD<T>>> {
    Ok(vec![matmul(a, req(rest, 1)?)?])
}

fn einsum_k<T: Fl>(c: &Ctx, a: &ArrayD<T>, rest: &[Option<&ArrayD<T>>]) -> KResult<Vec<ArrayD<T>>> {
    let eq = c.op.str_attr("equation").ok_or("equation is required")?;
    let mut ops = vec![a];
    for (i, r) in rest.iter().enumerate() {
        ops.push(r.ok_or_else(|| format!("operand {} is missing", i + 1))?);
    }
    Ok(vec![einsum(eq, &ops)?])
}

/// nn ops; `None` if `op` is not one of them.
pub(crate) fn eval(op: &str, c: &Ctx) -> Option<KResult<Vec<Tensor>>> {
    let r = || -> KResult<Vec<Tensor>> {
        Ok(match op {
            "MatMul" => float_kernel!(c, matmul_k),
            "Gemm" => float_kernel!(c, gemm),
            "Einsum" => float_kernel!(c, einsum_k),
            "Conv" => float_kernel!(c, conv),
            "ConvTranspose" => float_kernel!(c, conv_transpose),
            "MaxPool" | "AveragePool" => {
                let (y, idx) = match c.input(0)? {
                    Tensor::F32(a) => {
                        let (y, i) = pool(c, a)?;
                        (Tensor::F32(y), i)
                    }
                    Tensor::F64(a) => {
                        let (y, i) = pool(c, a)?;
                        (Tensor::F64(y), i)
                    }
                    other => return Err(format!("expects a float input, got {}", other.dtype())),
                };
                if c.n_outputs > 1 {
                    vec![y, Tensor::I64(idx)]
                } else {
                    vec![y]
                }
            }
            "GlobalAveragePool" | "GlobalMaxPool" => float_kernel!(c, global_pool),
            "BatchNormalization" => float_kernel!(c, batch_norm),
            "LayerNormalization" => float_kernel!(c, layer_norm),
            "InstanceNormalization" | "GroupNormalization" => float_kernel!(c, group_norm),
            "Softmax" | "LogSoftmax" => float_kernel!(c, softmax),
            _ => return Err(String::new()),
        })
    };
    const OPS: &[&str] = &[
        "MatMul",
        "Gemm",
        "Einsum",
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "BatchNormalization",
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "Softmax",
        "LogSoftmax",
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

    fn data(len: usize, seed: u64) -> Vec<f64> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5
            })
            .collect()
    }

    /// Geometry `(k, s, d, pb, pe)` per axis (h, w).
    fn geo(k: [usize; 2], s: [usize; 2], d: [usize; 2], pb: [usize; 2], pe: [usize; 2]) -> Geo {
        Geo { k, s, d, pb, pe }
    }

    fn close(a: &[f64], b: &[f64], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let scale = b.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= 1e-12 * scale,
                "{what}: element {i}: {x} vs {y}"
            );
        }
    }

    /// Direct definition: `y[b, o, oy, ox] = sum_{c,ki,kj} w[o, c, ki, kj] x[b, g(o)*cg + c,
    /// oy*s + ki*d - pb, ox*s + kj*d - pb]` (zero outside `x`).
    fn naive_conv(
        x: &[f64],
        [n, ch, h, wd]: [usize; 4],
        w: &[f64],
        m: usize,
        group: usize,
        g: &Geo,
    ) -> (Vec<f64>, [usize; 2]) {
        let (oh, ow) = (
            out_size(h, g, 0, false).unwrap(),
            out_size(wd, g, 1, false).unwrap(),
        );
        let (cg, mg) = (ch / group, m / group);
        let [kh, kw] = g.k;
        let mut y = vec![0.0; n * m * oh * ow];
        for b in 0..n {
            for o in 0..m {
                let gi = o / mg;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = 0.0;
                        for c in 0..cg {
                            for ki in 0..kh {
                                for kj in 0..kw {
                                    let iy =
                                        (oy * g.s[0] + ki * g.d[0]) as isize - g.pb[0] as isize;
                                    let ix =
                                        (ox * g.s[1] + kj * g.d[1]) as isize - g.pb[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                        continue;
                                    }
                                    let xv = x[((b * ch + gi * cg + c) * h + iy as usize) * wd
                                        + ix as usize];
                                    acc += w[((o * cg + c) * kh + ki) * kw + kj] * xv;
                                }
                            }
                        }
                        y[((b * m + o) * oh + oy) * ow + ox] = acc;
                    }
                }
            }
        }
        (y, [oh, ow])
    }

    /// Direct definition of ConvTranspose: every `x[b, c, iy, ix] w[c, mi, ki, kj]` lands on
    /// `y[b, g(c)*mg + mi, iy*s + ki*d - pb, ix*s + kj*d - pb]` when that is inside `y`.
    #[allow(clippy::too_many_arguments)]
    fn naive_conv_t(
        x: &[f64],
        [n, ch, h, wd]: [usize; 4],
        w: &[f64],
        mg: usize,
        group: usize,
        g: &Geo,
        [oh, ow]: [usize; 2],
    ) -> Vec<f64> {
        let cg = ch / group;
        let m = mg * group;
        let [kh, kw] = g.k;
        let mut y = vec![0.0; n * m * oh * ow];
        for b in 0..n {
            for c in 0..ch {
                let gi = c / cg;
                for mi in 0..mg {
                    for ki in 0..kh {
                        for kj in 0..kw {
                            for iy in 0..h {
                                for ix in 0..wd {
                                    let oy =
                                        (iy * g.s[0] + ki * g.d[0]) as isize - g.pb[0] as isize;
                                    let ox =
                                        (ix * g.s[1] + kj * g.d[1]) as isize - g.pb[1] as isize;
                                    if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                        continue;
                                    }
                                    y[((b * m + gi * mg + mi) * oh + oy as usize) * ow
                                        + ox as usize] += x[((b * ch + c) * h + iy) * wd + ix]
                                        * w[((c * mg + mi) * kh + ki) * kw + kj];
                                }
                            }
                        }
                    }
                }
            }
        }
        y
    }

    /// `(name, x dims, m, group, geometry)`: strides, asymmetric pads, dilation, groups, 1-D
    /// (h = 1), the 1x1 stride-2 downsample, and the weight-gradient shape (a kernel as large as
    /// the input, dilated by the forward stride, few output positions).
    fn cases() -> Vec<(&'static str, [usize; 4], usize, usize, Geo)> {
        vec![
            (
                "3x3 s2 p1",
                [3, 4, 9, 8],
                6,
                1,
                geo([3, 3], [2, 2], [1, 1], [1, 1], [1, 1]),
            ),
            (
                "1x1 s2",
                [3, 4, 8, 8],
                6,
                1,
                geo([1, 1], [2, 2], [1, 1], [0, 0], [0, 0]),
            ),
            (
                "dil2 pads 2/1 groups 2",
                [2, 4, 10, 9],
                6,
                2,
                geo([3, 2], [1, 2], [2, 2], [2, 0], [1, 2]),
            ),
            (
                "depthwise s2",
                [3, 6, 7, 7],
                6,
                6,
                geo([3, 3], [2, 1], [1, 1], [1, 1], [0, 1]),
            ),
            (
                "1-D s2 p1 d2",
                [5, 3, 1, 17],
                4,
                1,
                geo([1, 3], [1, 2], [1, 2], [0, 1], [0, 1]),
            ),
            (
                "weight-grad 3x3 s2",
                [5, 2, 9, 9],
                3,
                1,
                geo([4, 4], [1, 1], [2, 2], [1, 1], [1, 1]),
            ),
            (
                "weight-grad 1x1 s2",
                [4, 3, 8, 8],
                5,
                1,
                geo([4, 4], [1, 1], [2, 2], [0, 0], [0, 0]),
            ),
            (
                "pads beyond the window",
                [2, 2, 3, 3],
                2,
                1,
                geo([2, 2], [3, 3], [1, 1], [3, 2], [3, 3]),
            ),
        ]
    }

    #[test]
    fn conv_matches_direct_definition() {
        for (name, xd, m, group, g) in cases() {
            let x = data(xd.iter().product(), 1);
            let w = data(m * (xd[1] / group) * g.k[0] * g.k[1], 2);
            let (want, osz) = naive_conv(&x, xd, &w, m, group, &g);
            // cap 1: one batch item per GEMM; 2 chunks with a remainder; all items at once
            for cap in [
                1,
                2 * (xd[1] / group) * g.k[0] * g.k[1] * osz[0] * osz[1],
                usize::MAX,
            ] {
                let got = conv_core(&x, xd, &w, m, group, &g, osz, cap).unwrap();
                close(&got, &want, &format!("conv {name}, cap {cap}"));
            }
        }
    }

    #[test]
    fn conv_transpose_matches_direct_definition() {
        for (name, xd, mg, group, g) in cases() {
            // ConvTranspose weight [ch, mg, kh, kw]; output padding 1 on the last axis
            let (h, wd) = (xd[2], xd[3]);
            let full = |i: usize, inp: usize, op: usize| {
                g.s[i] * (inp - 1) + op + (g.k[i] - 1) * g.d[i] + 1
            };
            let (fh, fw) = (full(0, h, 0), full(1, wd, 1));
            if fh <= g.pb[0] + g.pe[0] || fw <= g.pb[1] + g.pe[1] {
                continue;
            }
            let osz = [fh - g.pb[0] - g.pe[0], fw - g.pb[1] - g.pe[1]];
            let x = data(xd.iter().product(), 3);
            let w = data(xd[1] * mg * g.k[0] * g.k[1], 4);
            let want = naive_conv_t(&x, xd, &w, mg, group, &g, osz);
            for cap in [1, 2 * mg * g.k[0] * g.k[1] * h * wd, usize::MAX] {
                let got = conv_transpose_core(&x, xd, &w, mg, group, &g, osz, cap).unwrap();
                close(&got, &want, &format!("conv_transpose {name}, cap {cap}"));
            }
        }
    }

    /// Packing batch items into one GEMM does not change a single bit of an f32 result (the
    /// GEMM's reduction order depends on `k` only), so pipelines and the `--check` reference,
    /// which run different batch sizes, see the same per-item arithmetic as before.
    #[test]
    fn batch_packing_is_bit_exact_in_f32() {
        for (name, xd, m, group, g) in cases() {
            let x: Vec<f32> = data(xd.iter().product(), 5)
                .iter()
                .map(|v| *v as f32)
                .collect();
            let w: Vec<f32> = data(m * (xd[1] / group) * g.k[0] * g.k[1], 6)
                .iter()
                .map(|v| *v as f32)
                .collect();
            let osz = [
                out_size(xd[2], &g, 0, false).unwrap(),
                out_size(xd[3], &g, 1, false).unwrap(),
            ];
            let one = conv_core(&x, xd, &w, m, group, &g, osz, 1).unwrap();
            let all = conv_core(&x, xd, &w, m, group, &g, osz, usize::MAX).unwrap();
            assert_eq!(one, all, "{name}");
        }
    }
}
