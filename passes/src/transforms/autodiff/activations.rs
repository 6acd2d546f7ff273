//! Gradient rules of the elementwise activations and a few cheap shape ops that
//! [`super::rules`] does not cover. Forward definitions are the ONNX operator specs
//! (<https://onnx.ai/onnx/operators/>); `X` operand, `Y` result, `dY` its gradient, and every
//! derivative below is taken where the function is smooth (at a kink the one-sided value of
//! the branch named first is used, as PyTorch does).
//!
//! - **HardSigmoid** `Y = max(0, min(1, a X + b))`: `dX = a dY` where `0 < Y < 1`, else 0.
//! - **Elu** `Y = X (X > 0), a (e^X - 1)`: `dX = dY (X > 0), dY (Y + a)`.
//! - **Selu** `Y = g X (X > 0), g a (e^X - 1)`: `dX = g dY (X > 0), dY (Y + g a)`.
//! - **Celu** `Y = max(0, X) + min(0, a (e^(X/a) - 1))`: `dX = dY (X > 0), dY e^(X/a)`.
//! - **Softplus** `Y = ln(1 + e^X)`: `dX = dY sigmoid(X)`.
//! - **Softsign** `Y = X / (1 + |X|)`: `dX = dY / (1 + |X|)^2`.
//! - **Mish** `Y = X tanh(softplus(X))`, `t = tanh(softplus(X))`:
//!   `dX = dY (t + X (1 - t^2) sigmoid(X))`.
//! - **ThresholdedRelu** `Y = X (X > a), 0`: `dX = dY (X > a)`.
//! - **PRelu** `Y = X (X >= 0), s X` (`s` broadcast to `X`): `dX = dY (X >= 0), s dY`;
//!   `ds = unb(dY X (X < 0))`.
//! - **Sin**: `dX = dY cos X`; **Cos**: `dX = -dY sin X`.
//! - **CumSum** (a linear map whose transpose sums the other way): `dX = CumSum(dY, axis,
//!   exclusive, reverse = !reverse)`.
//! - **Tile** with constant repeats `r` over static dims `d`: `dY` reshaped to
//!   `[r0, d0, r1, d1, ...]` and summed over the `r` axes.

use super::builder::{Builder, Grads};
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Attr, DType, OpData, Value};
use pipec_compiler::Result;

fn err(d: &OpData, msg: impl Into<String>) -> Error {
    Error::node(&d.name, &d.op_type, msg)
}

/// The op types this file has rules for.
pub const OPS: &[&str] = &[
    "HardSigmoid",
    "Elu",
    "Selu",
    "Celu",
    "Softplus",
    "Softsign",
    "Mish",
    "ThresholdedRelu",
    "PRelu",
    "Sin",
    "Cos",
    "CumSum",
    "Tile",
];

/// Which operands of one of [`OPS`] carry gradients.
pub fn diff_inputs(d: &OpData) -> Option<Vec<bool>> {
    let n = d.inputs.len();
    match d.op_type.as_str() {
        "CumSum" | "Tile" => Some((0..n).map(|i| i == 0).collect()),
        t if OPS.contains(&t) => Some(vec![true; n]),
        _ => None,
    }
}

/// The rule of `d` (one of [`OPS`]); `None` for other op types.
pub fn grad(
    b: &mut Builder,
    d: &OpData,
    dys: &[Option<Value>],
    need: &[bool],
) -> Result<Option<Grads>> {
    if !OPS.contains(&d.op_type.as_str()) {
        return Ok(None);
    }
    let mut out: Grads = vec![None; d.inputs.len()];
    let (Some(g), Some(&y)) = (dys.first().copied().flatten(), d.outputs.first()) else {
        return Ok(Some(out));
    };
    let x = d.input(0).ok_or_else(|| err(d, "missing input 0"))?;
    let dt = b.dt(g);
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    let alpha = |def: f32| d.float_attr("alpha").unwrap_or(def) as f64;
    let dx = match d.op_type.as_str() {
        "HardSigmoid" => {
            let (z, one) = (b.scalar(dt, 0.0)?, b.scalar(dt, 1.0)?);
            let a = b.scalar(dt, alpha(0.2))?;
            let lo = b.op1("Greater", &[y, z], vec![], DType::Bool);
            let hi = b.op1("Less", &[y, one], vec![], DType::Bool);
            let m = b.op1("And", &[lo, hi], vec![], DType::Bool);
            let ga = b.mul(g, a);
            Some(b.op1("Where", &[m, ga, z], vec![], dt))
        }
        "Elu" | "Selu" => {
            let (scale, off) = if d.op_type == "Elu" {
                (1.0, alpha(1.0))
            } else {
                let gm = d.float_attr("gamma").unwrap_or(1.050_701) as f64;
                (gm, alpha(1.673_263_2) * gm)
            };
            let z = b.scalar(dt, 0.0)?;
            let pos = b.op1("Greater", &[x, z], vec![], DType::Bool);
            let o = b.scalar(dt, off)?;
            let t = b.add(y, o);
            let neg = b.mul(g, t);
            let gp = if scale == 1.0 {
                g
            } else {
                let s = b.scalar(dt, scale)?;
                b.mul(g, s)
            };
            Some(b.op1("Where", &[pos, gp, neg], vec![], dt))
        }
        "Celu" => {
            let a = b.scalar(dt, alpha(1.0))?;
            let z = b.scalar(dt, 0.0)?;
            let pos = b.op1("Greater", &[x, z], vec![], DType::Bool);
            let t = b.div(x, a);
            let e = b.un("Exp", t);
            let neg = b.mul(g, e);
            Some(b.op1("Where", &[pos, g, neg], vec![], dt))
        }
        "Softplus" => {
            let s = b.un("Sigmoid", x);
            Some(b.mul(g, s))
        }
        "Softsign" => {
            let one = b.scalar(dt, 1.0)?;
            let a = b.un("Abs", x);
            let t = b.add(a, one);
            let t = b.mul(t, t);
            Some(b.div(g, t))
        }
        "Mish" => {
            let one = b.scalar(dt, 1.0)?;
            let sp = b.un("Softplus", x);
            let t = b.un("Tanh", sp);
            let t2 = b.mul(t, t);
            let u = b.sub(one, t2);
            let s = b.un("Sigmoid", x);
            let u = b.mul(u, s);
            let u = b.mul(u, x);
            let u = b.add(t, u);
            Some(b.mul(g, u))
        }
        "ThresholdedRelu" => {
            let a = b.scalar(dt, alpha(1.0))?;
            let z = b.scalar(dt, 0.0)?;
            let m = b.op1("Greater", &[x, a], vec![], DType::Bool);
            Some(b.op1("Where", &[m, g, z], vec![], dt))
        }
        "PRelu" => {
            let s = d.input(1).ok_or_else(|| err(d, "missing input 1"))?;
            let z = b.scalar(dt, 0.0)?;
            let neg = b.op1("Less", &[x, z], vec![], DType::Bool);
            if need_i(1) {
                let xd = dims(b, d, x)?;
                let sd = dims(b, d, s)?;
                let t = b.mul(g, x);
                let t = b.op1("Where", &[neg, t, z], vec![], dt);
                out[1] = Some(b.unbroadcast(t, &xd, &sd)?);
            }
            let gs = b.mul(g, s);
            Some(b.op1("Where", &[neg, gs, g], vec![], dt))
        }
        "Sin" => {
            let c = b.un("Cos", x);
            Some(b.mul(g, c))
        }
        "Cos" => {
            let s = b.un("Sin", x);
            let t = b.mul(g, s);
            Some(b.neg(t))
        }
        "CumSum" => {
            let axis = d.input(1).ok_or_else(|| err(d, "missing axis"))?;
            let rev = d.int_attr("reverse").unwrap_or(0) != 0;
            let ex = d.int_attr("exclusive").unwrap_or(0);
            Some(b.op1(
                "CumSum",
                &[g, axis],
                vec![
                    ("exclusive", Attr::Int(ex)),
                    ("reverse", Attr::Int(i64::from(!rev))),
                ],
                dt,
            ))
        }
        "Tile" => {
            let xd =
                b.g.ty(x)
                    .static_dims()
                    .ok_or_else(|| err(d, "autodiff: Tile needs the static shape of its input"))?;
            let reps = d
                .input(1)
                .and_then(|v| b.const_ints(v))
                .ok_or_else(|| err(d, "autodiff: Tile needs constant repeats"))?;
            if reps.len() != xd.len() {
                return Err(err(d, "repeats and input rank differ"));
            }
            let split: Vec<i64> = reps.iter().zip(&xd).flat_map(|(r, n)| [*r, *n]).collect();
            let t = b.reshape(g, &split);
            let axes: Vec<i64> = (0..xd.len() as i64).map(|i| 2 * i).collect();
            Some(b.reduce_sum(t, &axes, false))
        }
        _ => None,
    };
    if need_i(0) {
        out[0] = dx;
    }
    Ok(Some(out))
}

/// Gelu with `approximate = "tanh"`: `Y = X (1 + t) / 2`, `t = tanh(k (X + c X^3))`,
/// `k = sqrt(2/pi)`, `c = 0.044715`; `dX = dY ((1 + t)/2 + X (1 - t^2) k (1 + 3 c X^2) / 2)`.
pub fn gelu_tanh(b: &mut Builder, x: Value, g: Value) -> Result<Value> {
    let dt = b.dt(g);
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let c = 0.044715;
    let (half, one) = (b.scalar(dt, 0.5)?, b.scalar(dt, 1.0)?);
    let (kc, k3c) = (b.scalar(dt, k * c)?, b.scalar(dt, 3.0 * k * c)?);
    let kk = b.scalar(dt, k)?;
    let x2 = b.mul(x, x);
    // inner = k x + k c x^3, its derivative k + 3 k c x^2
    let t = b.mul(x2, kc);
    let t = b.add(t, kk);
    let inner = b.mul(x, t);
    let th = b.un("Tanh", inner);
    let dinner = b.mul(x2, k3c);
    let dinner = b.add(dinner, kk);
    let th2 = b.mul(th, th);
    let sech2 = b.sub(one, th2);
    let u = b.mul(sech2, dinner);
    let u = b.mul(u, x);
    let v = b.add(th, one);
    let u = b.add(u, v);
    let u = b.mul(u, half);
    Ok(b.mul(g, u))
}

fn dims(b: &Builder, d: &OpData, v: Value) -> Result<Vec<pipec_compiler::ir::Dim>> {
    b.g.ty(v)
        .shape
        .clone()
        .ok_or_else(|| err(d, format!("autodiff needs the rank of '{}'", b.g.name(v))))
}
