//! Gradient rule of `Pad` (ONNX Pad-11/13/18/19: pads as an input, the optional
//! `constant_value` and `axes` inputs, modes `constant`, `reflect`, `edge`, `wrap`).
//!
//! Pad is separable: along each padded axis `a`, `Y[.., o, ..] = X[.., src_a(o), ..]` (or the
//! constant where `src_a(o)` is outside `X`, constant mode only), with `o - pb` clamped into
//! range (edge), reflected without repeating the border (reflect), or taken modulo the size
//! (wrap); negative pads crop.
//! - **constant**: `dX = Pad(Slice(dY), cropped)`: the padded border is cut off, the cropped one
//!   comes back as zeros; `d constant_value = sum(dY) - sum(dX)` (what landed on the border).
//! - **reflect / edge / wrap**: the border folds back onto the rows it copied. Per padded axis,
//!   `dY` (that axis moved last) is multiplied by the one-hot matrix `S_a[o, src_a(o)]`
//!   (`len x n`, a constant): `dX = dY S_a`, which sums every copy into its source row. This
//!   needs the static size of the padded axes.

use super::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{OpData, Value};
use pipec_compiler::Result;

fn err(d: &OpData, msg: impl Into<String>) -> Error {
    Error::node(&d.name, &d.op_type, msg)
}

/// Source index along one axis of size `n` for output position `o` (`None`: the constant).
fn src(mode: &str, o: i64, pb: i64, n: i64) -> Option<i64> {
    let s = o - pb;
    if (0..n).contains(&s) {
        return Some(s);
    }
    match mode {
        "edge" => Some(s.clamp(0, n - 1)),
        "wrap" => Some(s.rem_euclid(n)),
        "reflect" if n == 1 => Some(0),
        "reflect" => {
            let p = 2 * (n - 1);
            let q = s.rem_euclid(p);
            Some(if q < n { q } else { p - q })
        }
        _ => None,
    }
}

/// Pad (see the module doc): the gradients of `X` and of `constant_value`.
pub fn pad_grads(
    b: &mut Builder,
    d: &OpData,
    g: Value,
    need: &[bool],
    out: &mut [Option<Value>],
) -> Result<()> {
    let x = d.input(0).ok_or_else(|| err(d, "missing input 0"))?;
    let dt = b.dt(g);
    let xd =
        b.g.ty(x)
            .shape
            .clone()
            .ok_or_else(|| err(d, "autodiff needs the rank of the input"))?;
    let r = xd.len();
    let const_of = |b: &Builder, i: usize| d.input(i).map(|v| b.const_ints(v));
    let pads = const_of(b, 1)
        .flatten()
        .ok_or_else(|| err(d, "autodiff: Pad needs constant pads"))?;
    let axes: Vec<usize> = match const_of(b, 3) {
        None => (0..r).collect(),
        Some(None) => return Err(err(d, "autodiff: Pad needs constant axes")),
        Some(Some(a)) => a
            .iter()
            .map(|&v| {
                let v = if v < 0 { v + r as i64 } else { v };
                usize::try_from(v)
                    .ok()
                    .filter(|v| *v < r)
                    .ok_or_else(|| err(d, format!("axis {v} out of range")))
            })
            .collect::<Result<_>>()?,
    };
    if pads.len() != 2 * axes.len() {
        return Err(err(d, "pads and axes lengths differ"));
    }
    // (begin, end) pads per axis of X.
    let mut pe = vec![(0i64, 0i64); r];
    for (j, &a) in axes.iter().enumerate() {
        pe[a] = (pads[j], pads[axes.len() + j]);
    }
    let mode = d.str_attr("mode").unwrap_or("constant");
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    let padded: Vec<usize> = (0..r).filter(|a| pe[*a] != (0, 0)).collect();
    if mode == "constant" {
        let cut: Vec<usize> = padded
            .iter()
            .copied()
            .filter(|a| pe[*a].0 > 0 || pe[*a].1 > 0)
            .collect();
        let mut dx = g;
        if !cut.is_empty() {
            let starts: Vec<i64> = cut.iter().map(|a| pe[*a].0.max(0)).collect();
            let ends: Vec<i64> = cut
                .iter()
                .map(|a| match pe[*a].1 {
                    e if e > 0 => -e,
                    _ => i64::MAX,
                })
                .collect();
            let ax: Vec<i64> = cut.iter().map(|a| *a as i64).collect();
            let (s, e, a) = (b.ints(&starts), b.ints(&ends), b.ints(&ax));
            dx = b.op1("Slice", &[dx, s, e, a], vec![], dt);
        }
        if padded.iter().any(|a| pe[*a].0 < 0 || pe[*a].1 < 0) {
            let mut p = vec![0i64; 2 * r];
            for a in 0..r {
                p[a] = (-pe[a].0).max(0);
                p[r + a] = (-pe[a].1).max(0);
            }
            let pv = b.ints(&p);
            dx = b.op1("Pad", &[dx, pv], vec![], dt);
        }
        if need_i(2) {
            let cv = d.input(2).ok_or_else(|| err(d, "missing constant_value"))?;
            let all: Vec<i64> = (0..r as i64).collect();
            let sy = b.reduce_sum(g, &all, false);
            let sx = b.reduce_sum(dx, &all, false);
            let t = b.sub(sy, sx);
            // constant_value may be 0-D or [1].
            out[2] = Some(b.reshape_like(t, cv));
        }
        if need_i(0) {
            out[0] = Some(dx);
        }
        return Ok(());
    }
    if !matches!(mode, "reflect" | "edge" | "wrap") {
        return Err(err(
            d,
            format!("autodiff: Pad mode '{mode}' has no gradient rule"),
        ));
    }
    let mut dx = g;
    for &a in &padded {
        let n = xd[a].known().ok_or_else(|| {
            err(
                d,
                format!("autodiff: Pad in {mode} mode needs the static size of axis {a}"),
            )
        })?;
        if n == 0 {
            return Err(err(d, format!("cannot pad an empty axis in {mode} mode")));
        }
        let (pb, pend) = pe[a];
        let len = n + pb + pend;
        let mut m = vec![0.0f64; (len.max(0) * n) as usize];
        for o in 0..len {
            if let Some(s) = src(mode, o, pb, n) {
                m[(o * n + s) as usize] = 1.0;
            }
        }
        let mv = b.constant(dt, &[len, n], &m)?;
        dx = if a + 1 == r {
            b.op1("MatMul", &[dx, mv], vec![], dt)
        } else {
            let mut perm: Vec<i64> = (0..r as i64).collect();
            perm.swap(a, r - 1);
            let t = b.transpose(dx, &perm);
            let t = b.op1("MatMul", &[t, mv], vec![], dt);
            b.transpose(t, &perm)
        };
    }
    if need_i(0) {
        out[0] = Some(dx);
    }
    Ok(())
}
