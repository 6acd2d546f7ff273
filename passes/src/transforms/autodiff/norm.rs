//! Gradient rules of the normalisations.
//!
//! **BatchNormalization**, per channel `c` over the axes `R = {0, 2, 3, ...}` with `M = |R|`
//! elements: `Y = s (X - m) / sqrt(v + eps) + b`.
//! - Eval mode (`training_mode = 0`, running stats `m`, `v` are constants):
//!   `dX = dY s / sqrt(v + eps)`, `ds = sum_R(dY xhat)`, `db = sum_R(dY)`, `xhat = (X - m)/sqrt(v + eps)`.
//! - Training mode (batch stats `mu = mean_R(X)`, `var = mean_R((X - mu)^2)`, biased, as ONNX
//!   and PyTorch): with `inv = 1/sqrt(var + eps)` and `xhat = (X - mu) inv`,
//!   `dX = s inv (dY - mean_R(dY) - xhat mean_R(dY xhat))` (Ioffe & Szegedy 2015, sec. 3, the
//!   chain rule through `mu` and `var` collapsed), `ds = sum_R(dY xhat)`, `db = sum_R(dY)`.
//!
//! **LayerNormalization** over the axes `N = {axis, ..., r-1}`: the same formula with the
//! statistics taken per row over `N`:
//! `dX = inv (dY s - mean_N(dY s) - xhat mean_N(dY s xhat))`, `ds = unb(dY xhat)`, `db = unb(dY)`
//! (Ba et al. 2016; the mean and inverse std-dev are recomputed from `X` rather than read from
//! the op's optional results, so the rule works for any element type).
//!
//! **GroupNormalization** (opset 18 and 21) with `G` groups and **InstanceNormalization**
//! (`G = C`): `X` `[N, C, D..]` viewed as `Xr` `[N, G, L]` (`L = C/G * prod(D)`), statistics
//! per row of `Xr` as in LayerNormalization, `Y = s xhat + b` with `s`, `b` per channel
//! (`[C]`: InstanceNormalization, GroupNormalization-21) or per group (`[G]`:
//! GroupNormalization-18's function body). With `dxh = dY s` (viewed as `[N, G, L]`):
//! `dXr = inv (dxh - mean_L(dxh) - xhat mean_L(dxh xhat))`, `ds = sum(dY xhat)`, `db = sum(dY)`
//! over every axis but the channel (per channel) or over `N` and `L` (per group).

use super::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{DType, Dim, OpData, Value};
use pipec_compiler::Result;

fn err(d: &OpData, msg: impl Into<String>) -> Error {
    Error::node(&d.name, &d.op_type, msg)
}

/// `1 / prod(dims of x over axes)` as a scalar of element type `dt`: a constant when the dims
/// are static, else computed from `Shape(x)`.
pub fn inv_count(b: &mut Builder, x: Value, axes: &[i64], dt: DType) -> Result<Value> {
    let xd = b.g.ty(x).shape.clone().unwrap_or_default();
    let n: Option<i64> = axes
        .iter()
        .map(|a| xd.get(*a as usize).and_then(Dim::known))
        .try_fold(1i64, |acc, v| v.map(|v| acc * v));
    if let Some(n) = n {
        return b.scalar(dt, 1.0 / n as f64);
    }
    let s = b.op1("Shape", &[x], vec![], DType::I64);
    let idx = b.ints(axes);
    let s = b.op1("Gather", &[s, idx], vec![], DType::I64);
    let p = b.op1(
        "ReduceProd",
        &[s],
        vec![("keepdims", pipec_compiler::ir::Attr::Int(0))],
        DType::I64,
    );
    let p = b.cast(p, dt);
    Ok(b.un("Reciprocal", p))
}

/// `1 / sqrt(v + eps)`.
fn inv_std(b: &mut Builder, var: Value, eps: f64, dt: DType) -> Result<Value> {
    let e = b.scalar(dt, eps)?;
    let t = b.add(var, e);
    let t = b.un("Sqrt", t);
    Ok(b.un("Reciprocal", t))
}

/// BatchNormalization (see the module doc).
pub fn batch_norm_grads(
    b: &mut Builder,
    d: &OpData,
    g: Value,
    need: &[bool],
    out: &mut [Option<Value>],
) -> Result<()> {
    let inp = |i: usize| {
        d.input(i)
            .ok_or_else(|| err(d, format!("missing input {i}")))
    };
    let (x, s, mean, var) = (inp(0)?, inp(1)?, inp(3)?, inp(4)?);
    let dt = b.dt(g);
    let r =
        b.g.ty(x)
            .rank()
            .ok_or_else(|| err(d, "autodiff needs the rank of the input"))?;
    if r < 2 {
        return Err(err(d, "BatchNormalization input of rank < 2"));
    }
    let eps = d.float_attr("epsilon").unwrap_or(1e-5) as f64;
    let training = d.int_attr("training_mode").unwrap_or(0) != 0;
    let axes: Vec<i64> = std::iter::once(0).chain(2..r as i64).collect();
    let mut pshape = vec![-1i64];
    pshape.extend(std::iter::repeat_n(1, r - 2));
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    let sb = b.reshape(s, &pshape);
    if !training {
        let inv = inv_std(b, var, eps, dt)?;
        let invb = b.reshape(inv, &pshape);
        if need_i(0) {
            let k = b.mul(sb, invb);
            out[0] = Some(b.mul(g, k));
        }
        if need_i(1) {
            let mb = b.reshape(mean, &pshape);
            let xc = b.sub(x, mb);
            let xhat = b.mul(xc, invb);
            let t = b.mul(g, xhat);
            out[1] = Some(b.reduce_sum(t, &axes, false));
        }
    } else {
        let ic = inv_count(b, x, &axes, dt)?;
        let sx = b.reduce_sum(x, &axes, true);
        let mu = b.mul(sx, ic);
        let xc = b.sub(x, mu);
        let sq = b.mul(xc, xc);
        let sv = b.reduce_sum(sq, &axes, true);
        let v = b.mul(sv, ic);
        let inv = inv_std(b, v, eps, dt)?;
        let xhat = b.mul(xc, inv);
        let gx = b.mul(g, xhat);
        if need_i(0) {
            let sdy = b.reduce_sum(g, &axes, true);
            let m1 = b.mul(sdy, ic);
            let sdyx = b.reduce_sum(gx, &axes, true);
            let m2 = b.mul(sdyx, ic);
            let t = b.sub(g, m1);
            let u = b.mul(xhat, m2);
            let t = b.sub(t, u);
            let k = b.mul(sb, inv);
            out[0] = Some(b.mul(t, k));
        }
        if need_i(1) {
            out[1] = Some(b.reduce_sum(gx, &axes, false));
        }
    }
    if need_i(2) {
        out[2] = Some(b.reduce_sum(g, &axes, false));
    }
    Ok(())
}

/// LayerNormalization (see the module doc).
pub fn layer_norm_grads(
    b: &mut Builder,
    d: &OpData,
    g: Value,
    need: &[bool],
    out: &mut [Option<Value>],
) -> Result<()> {
    let x = d.input(0).ok_or_else(|| err(d, "missing input 0"))?;
    let s = d.input(1).ok_or_else(|| err(d, "missing input 1"))?;
    let dt = b.dt(g);
    let xd =
        b.g.ty(x)
            .shape
            .clone()
            .ok_or_else(|| err(d, "autodiff needs the rank of the input"))?;
    let r = xd.len() as i64;
    let mut ax = d.int_attr("axis").unwrap_or(-1);
    if ax < 0 {
        ax += r;
    }
    if !(0..r).contains(&ax) {
        return Err(err(d, format!("axis {ax} out of range")));
    }
    let eps = d.float_attr("epsilon").unwrap_or(1e-5) as f64;
    let naxes: Vec<i64> = (ax..r).collect();
    let ic = inv_count(b, x, &naxes, dt)?;
    let sx = b.reduce_sum(x, &naxes, true);
    let mu = b.mul(sx, ic);
    let xc = b.sub(x, mu);
    let sq = b.mul(xc, xc);
    let sv = b.reduce_sum(sq, &naxes, true);
    let v = b.mul(sv, ic);
    let inv = inv_std(b, v, eps, dt)?;
    let xhat = b.mul(xc, inv);
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    if need_i(0) {
        let dxh = b.mul(g, s);
        let s1 = b.reduce_sum(dxh, &naxes, true);
        let m1 = b.mul(s1, ic);
        let t2 = b.mul(dxh, xhat);
        let s2 = b.reduce_sum(t2, &naxes, true);
        let m2 = b.mul(s2, ic);
        let t = b.sub(dxh, m1);
        let u = b.mul(xhat, m2);
        let t = b.sub(t, u);
        out[0] = Some(b.mul(t, inv));
    }
    if need_i(1) {
        let t = b.mul(g, xhat);
        let sd =
            b.g.ty(s)
                .shape
                .clone()
                .ok_or_else(|| err(d, "autodiff needs the rank of scale"))?;
        out[1] = Some(b.unbroadcast(t, &xd, &sd)?);
    }
    if need_i(2) {
        if let Some(bias) = d.input(2) {
            let bd =
                b.g.ty(bias)
                    .shape
                    .clone()
                    .ok_or_else(|| err(d, "autodiff needs the rank of bias"))?;
            out[2] = Some(b.unbroadcast(g, &xd, &bd)?);
        }
    }
    Ok(())
}

/// GroupNormalization / InstanceNormalization (see the module doc).
pub fn group_norm_grads(
    b: &mut Builder,
    d: &OpData,
    g: Value,
    need: &[bool],
    out: &mut [Option<Value>],
    opset: i64,
) -> Result<()> {
    let inp = |i: usize| {
        d.input(i)
            .ok_or_else(|| err(d, format!("missing input {i}")))
    };
    let (x, s) = (inp(0)?, inp(1)?);
    let dt = b.dt(g);
    let r =
        b.g.ty(x)
            .rank()
            .ok_or_else(|| err(d, "autodiff needs the rank of the input"))?;
    if r < 2 {
        return Err(err(d, "input of rank < 2"));
    }
    let eps = d.float_attr("epsilon").unwrap_or(1e-5) as f64;
    let instance = d.op_type == "InstanceNormalization";
    let groups = if instance {
        0 // Reshape's 0: as many groups as channels
    } else {
        d.int_attr("num_groups")
            .filter(|v| *v > 0)
            .ok_or_else(|| err(d, "num_groups must be positive"))?
    };
    let per_group = !instance && opset < 21;
    let xr = b.reshape(x, &[0, groups, -1]);
    let ic = inv_count(b, xr, &[2], dt)?;
    let sx = b.reduce_sum(xr, &[2], true);
    let mu = b.mul(sx, ic);
    let xc = b.sub(xr, mu);
    let sq = b.mul(xc, xc);
    let sv = b.reduce_sum(sq, &[2], true);
    let v = b.mul(sv, ic);
    let inv = inv_std(b, v, eps, dt)?;
    let xhat = b.mul(xc, inv);
    let gr = b.reshape(g, &[0, groups, -1]);
    // Scale broadcast to X (per channel) or to Xr (per group).
    let mut cshape = vec![1i64, -1];
    cshape.extend(std::iter::repeat_n(1, r - 2));
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    let chan_axes: Vec<i64> = std::iter::once(0).chain(2..r as i64).collect();
    if need_i(0) {
        let dxh = if per_group {
            let sb = b.reshape(s, &[1, -1, 1]);
            b.mul(gr, sb)
        } else {
            let sb = b.reshape(s, &cshape);
            let t = b.mul(g, sb);
            b.reshape(t, &[0, groups, -1])
        };
        let s1 = b.reduce_sum(dxh, &[2], true);
        let m1 = b.mul(s1, ic);
        let t2 = b.mul(dxh, xhat);
        let s2 = b.reduce_sum(t2, &[2], true);
        let m2 = b.mul(s2, ic);
        let t = b.sub(dxh, m1);
        let u = b.mul(xhat, m2);
        let t = b.sub(t, u);
        let t = b.mul(t, inv);
        out[0] = Some(b.reshape_like(t, x));
    }
    if need_i(1) {
        out[1] = Some(if per_group {
            let t = b.mul(gr, xhat);
            b.reduce_sum(t, &[0, 2], false)
        } else {
            let xh = b.reshape_like(xhat, x);
            let t = b.mul(g, xh);
            b.reduce_sum(t, &chan_axes, false)
        });
    }
    if need_i(2) {
        out[2] = Some(if per_group {
            b.reduce_sum(gr, &[0, 2], false)
        } else {
            b.reduce_sum(g, &chan_axes, false)
        });
    }
    Ok(())
}
