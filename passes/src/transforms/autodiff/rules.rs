//! Gradient rules: for one forward op and the gradients of its results (`dY`), the ops that
//! compute the gradients of its operands (vector-Jacobian products), in standard ONNX ops.
//!
//! Notation: `X`, `A`, `B` operands, `Y` result, `dY` its gradient; `unb(g, A)` sums `g` over
//! the axes along which `A` was broadcast (see [`Builder::unbroadcast`]). A rule is only asked
//! for the operands in `need` (those on a path from a parameter to the loss) and may return
//! `None` for the others.

use super::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Attr, DType, Dim, Op, OpData, Value};
use pipec_compiler::Result;

pub use super::builder::Grads;

/// Which operands of `d` carry gradients (the rest are indices, shapes, masks, running stats).
/// Ops without a rule report all operands, so that reaching one from a parameter is an error.
pub fn diff_inputs(d: &OpData) -> Vec<bool> {
    let n = d.inputs.len();
    let only = |k: &[usize]| (0..n).map(|i| k.contains(&i)).collect::<Vec<_>>();
    if let Some(v) = super::extra::extra_diff_inputs(d) {
        return v;
    }
    match d.op_type.as_str() {
        "Reshape" | "Squeeze" | "Unsqueeze" | "Expand" | "Slice" | "Split" | "Gather"
        | "GatherElements" | "Dropout" | "MaxPool" | "Pad" | "ReduceSum" | "ReduceMean"
        | "ReduceMax" | "ReduceMin" | "ReduceSumSquare" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSumExp" | "Clip" | "Tile" | "Cast" | "Flatten" | "ReduceProd" => only(&[0]),
        "BatchNormalization" => only(&[0, 1, 2]),
        "Where" => only(&[1, 2]),
        "ScatterND" => only(&[0, 2]),
        // Zero almost everywhere, or not numeric: no gradient flows.
        "Shape" | "Size" | "Sign" | "Floor" | "Ceil" | "Round" | "Equal" | "Less" | "Greater"
        | "LessOrEqual" | "GreaterOrEqual" | "Not" | "And" | "Or" | "Xor" | "ArgMax" | "ArgMin"
        | "ConstantOfShape" | "Range" | "OneHot" | "NonZero" | "EyeLike" | "RandomNormalLike"
        | "RandomUniformLike" | "Bernoulli" | "Constant" | "IsNaN" | "IsInf" | "TopK" => only(&[]),
        _ => vec![true; n],
    }
}

/// Ranked dims of a forward value (error naming `d` if the rank is unknown).
fn dims(b: &Builder, d: &OpData, v: Value) -> Result<Vec<Dim>> {
    b.g.ty(v).shape.clone().ok_or_else(|| {
        Error::node(
            &d.name,
            &d.op_type,
            format!("autodiff needs the rank of '{}'", b.g.name(v)),
        )
    })
}

/// Constant int64 values of an optional operand.
fn const_ints(b: &Builder, d: &OpData, i: usize) -> Option<Vec<i64>> {
    d.input(i).and_then(|v| b.const_ints(v))
}

fn norm_axis(a: i64, r: usize) -> i64 {
    if a < 0 {
        a + r as i64
    } else {
        a
    }
}

fn err(d: &OpData, msg: impl Into<String>) -> Error {
    Error::node(&d.name, &d.op_type, msg)
}

/// Broadcast shape of several operand shapes (numpy rules; a symbol against 1 gives the symbol).
pub fn broadcast_dims(shapes: &[Vec<Dim>]) -> Vec<Dim> {
    let r = shapes.iter().map(Vec::len).max().unwrap_or(0);
    (0..r)
        .map(|i| {
            let mut out = Dim::Known(1);
            for s in shapes {
                let off = r - s.len();
                if i >= off {
                    let dd = &s[i - off];
                    if out == Dim::Known(1) {
                        out = dd.clone();
                    }
                }
            }
            out
        })
        .collect()
}

/// The gradient rule of `op`. `dys[k]` is the gradient of result `k` (`None`: the loss does not
/// depend on it). Returns `None` when the op type has no rule.
pub fn grad(
    b: &mut Builder,
    op: Op,
    dys: &[Option<Value>],
    need: &[bool],
    opset: i64,
) -> Result<Option<Grads>> {
    let d = b.g.ops[op].clone();
    let n = d.inputs.len();
    let mut out: Grads = vec![None; n];
    let x = |i: usize| d.input(i);
    let y = d.outputs.first().copied();
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    // Most rules have one result.
    let dy0 = dys.first().copied().flatten();
    let Some(y) = y else { return Ok(Some(out)) };
    macro_rules! dy {
        () => {
            match dy0 {
                Some(v) => v,
                None => return Ok(Some(out)),
            }
        };
    }
    let dt = b.g.ty(y).dtype;
    match d.op_type.as_str() {
        "Identity" => out[0] = Some(dy!()),
        "Dropout" => {
            // Eval mode (training_mode absent or false) or ratio 0: identity. Training mode:
            // dX = dY * mask / (1 - ratio) (inverted dropout); the forward op gets its optional
            // mask result if it has none, and the mask is a saved value.
            let g = dy!();
            let ratio_const = match d.input(1) {
                None => Some(0.5),
                Some(v) => {
                    b.g.constant(v)
                        .and_then(|t| t.to_f64_vec())
                        .and_then(|v| v.first().copied())
                }
            };
            let training = match d.input(2) {
                None => Some(false),
                Some(v) => {
                    b.g.constant(v)
                        .and_then(|t| t.to_i64_vec())
                        .map(|v| v.first().copied().unwrap_or(0) != 0)
                }
            };
            if training == Some(false) || ratio_const == Some(0.0) {
                out[0] = Some(g);
            } else {
                let mask = match d.outputs.get(1) {
                    Some(m) => *m,
                    None => {
                        let name = b.fresh(&format!("{}_mask", b.g.name(y)));
                        let shape = b.g.ty(y).shape.clone();
                        let v = b.g.values.push(pipec_compiler::ir::ValueData {
                            name,
                            ty: pipec_compiler::ir::TensorType {
                                dtype: DType::Bool,
                                shape,
                            },
                            def: pipec_compiler::ir::ValueDef::Result(op, 1),
                        });
                        b.g.ops[op].outputs.push(v);
                        v
                    }
                };
                let m = b.cast(mask, dt);
                let t = b.mul(g, m);
                let scale = match ratio_const {
                    Some(r) => b.scalar(dt, 1.0 / (1.0 - r))?,
                    None => {
                        let r = d.input(1).ok_or_else(|| err(&d, "missing ratio"))?;
                        let one = b.scalar(dt, 1.0)?;
                        let r = b.cast(r, dt);
                        let k = b.sub(one, r);
                        b.un("Reciprocal", k)
                    }
                };
                out[0] = Some(b.mul(t, scale));
            }
        }
        "Neg" => {
            let g = dy!();
            out[0] = Some(b.neg(g));
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" => {
            let g = dy!();
            let (a, bb) = (x(0).unwrap_or(y), x(1).unwrap_or(y));
            let yd = dims(b, &d, y)?;
            let ad = dims(b, &d, a)?;
            let bd = dims(b, &d, bb)?;
            let (ga, gb) = match d.op_type.as_str() {
                "Add" => (Some(g), Some(g)),
                "Sub" => (Some(g), need_i(1).then(|| b.neg(g))),
                "Mul" => (
                    need_i(0).then(|| b.mul(g, bb)),
                    need_i(1).then(|| b.mul(g, a)),
                ),
                "Div" => {
                    // d(a/b)/da = 1/b ; d(a/b)/db = -y/b
                    let ga = need_i(0).then(|| b.div(g, bb));
                    let gb = if need_i(1) {
                        let t = b.mul(g, y);
                        let t = b.div(t, bb);
                        Some(b.neg(t))
                    } else {
                        None
                    };
                    (ga, gb)
                }
                _ => {
                    // Pow: d(a^e)/da = e a^(e-1) ; d(a^e)/de = y ln a
                    let ga = if need_i(0) {
                        let e = b.cast(bb, dt);
                        let em1 = match b.g.constant(bb).and_then(|t| t.to_f64_vec()) {
                            Some(v) if v.len() == 1 => {
                                let dims_e: Vec<i64> = b.g.ty(bb).static_dims().unwrap_or_default();
                                b.constant(dt, &dims_e, &[v[0] - 1.0])?
                            }
                            _ => {
                                let one = b.scalar(dt, 1.0)?;
                                b.sub(e, one)
                            }
                        };
                        let p = b.bin("Pow", a, em1);
                        let t = b.mul(p, e);
                        Some(b.mul(g, t))
                    } else {
                        None
                    };
                    let gb = if need_i(1) {
                        let l = b.un("Log", a);
                        let t = b.mul(y, l);
                        let t = b.mul(g, t);
                        Some(b.cast(t, b.g.ty(bb).dtype))
                    } else {
                        None
                    };
                    (ga, gb)
                }
            };
            if need_i(0) {
                if let Some(ga) = ga {
                    out[0] = Some(b.unbroadcast(ga, &yd, &ad)?);
                }
            }
            if need_i(1) {
                if let Some(gb) = gb {
                    out[1] = Some(b.unbroadcast(gb, &yd, &bd)?);
                }
            }
        }
        "Sum" | "Mean" => {
            let g = dy!();
            let yd = dims(b, &d, y)?;
            let g = if d.op_type == "Mean" {
                let s = b.scalar(dt, 1.0 / n as f64)?;
                b.mul(g, s)
            } else {
                g
            };
            for (i, slot) in out.iter_mut().enumerate() {
                if let (true, Some(v)) = (need_i(i), x(i)) {
                    let vd = dims(b, &d, v)?;
                    *slot = Some(b.unbroadcast(g, &yd, &vd)?);
                }
            }
        }
        "Max" | "Min" => {
            // dX_i = unb(dY where X_i == Y): every operand equal to the extremum gets the
            // gradient (ties are measure-zero for random data).
            let g = dy!();
            let yd = dims(b, &d, y)?;
            let z = b.scalar(dt, 0.0)?;
            for (i, slot) in out.iter_mut().enumerate() {
                if let (true, Some(v)) = (need_i(i), x(i)) {
                    let vd = dims(b, &d, v)?;
                    let m = b.op1("Equal", &[v, y], vec![], DType::Bool);
                    let w = b.op1("Where", &[m, g, z], vec![], dt);
                    *slot = Some(b.unbroadcast(w, &yd, &vd)?);
                }
            }
        }
        "Relu" => {
            // dX = dY where Y > 0
            let g = dy!();
            let z = b.scalar(dt, 0.0)?;
            let m = b.op1("Greater", &[y, z], vec![], DType::Bool);
            out[0] = Some(b.op1("Where", &[m, g, z], vec![], dt));
        }
        "LeakyRelu" => {
            let g = dy!();
            let alpha = d.float_attr("alpha").unwrap_or(0.01) as f64;
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let z = b.scalar(dt, 0.0)?;
            let al = b.scalar(dt, alpha)?;
            let m = b.op1("Greater", &[xv, z], vec![], DType::Bool);
            let ga = b.mul(g, al);
            out[0] = Some(b.op1("Where", &[m, g, ga], vec![], dt));
        }
        "Tanh" => {
            // dX = dY (1 - Y^2)
            let g = dy!();
            let one = b.scalar(dt, 1.0)?;
            let y2 = b.mul(y, y);
            let t = b.sub(one, y2);
            out[0] = Some(b.mul(g, t));
        }
        "Sigmoid" => {
            // dX = dY Y (1 - Y)
            let g = dy!();
            let one = b.scalar(dt, 1.0)?;
            let t = b.sub(one, y);
            let t = b.mul(y, t);
            out[0] = Some(b.mul(g, t));
        }
        "Exp" => {
            let g = dy!();
            out[0] = Some(b.mul(g, y));
        }
        "Log" => {
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            out[0] = Some(b.div(g, xv));
        }
        "Sqrt" => {
            // dX = dY / (2 Y)
            let g = dy!();
            let h = b.scalar(dt, 0.5)?;
            let t = b.mul(g, h);
            out[0] = Some(b.div(t, y));
        }
        "Reciprocal" => {
            // dX = -dY Y^2
            let g = dy!();
            let y2 = b.mul(y, y);
            let t = b.mul(g, y2);
            out[0] = Some(b.neg(t));
        }
        "Abs" => {
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let s = b.un("Sign", xv);
            out[0] = Some(b.mul(g, s));
        }
        "Erf" => {
            // d erf(x)/dx = 2/sqrt(pi) exp(-x^2)
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let x2 = b.mul(xv, xv);
            let nx2 = b.neg(x2);
            let e = b.un("Exp", nx2);
            let c = b.scalar(dt, 2.0 / std::f64::consts::PI.sqrt())?;
            let t = b.mul(e, c);
            out[0] = Some(b.mul(g, t));
        }
        "Gelu" => {
            // Exact Gelu: d/dx [x Phi(x)] = Phi(x) + x phi(x),
            // Phi(x) = (1 + erf(x/sqrt2))/2, phi(x) = exp(-x^2/2)/sqrt(2 pi).
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            match d.str_attr("approximate").unwrap_or("none") {
                "none" => {}
                "tanh" => {
                    out[0] = Some(super::activations::gelu_tanh(b, xv, g)?);
                    return Ok(Some(out));
                }
                other => return Err(err(&d, format!("unknown Gelu approximate '{other}'"))),
            }
            let is2 = b.scalar(dt, std::f64::consts::FRAC_1_SQRT_2)?;
            let half = b.scalar(dt, 0.5)?;
            let one = b.scalar(dt, 1.0)?;
            let c = b.scalar(dt, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
            let t = b.mul(xv, is2);
            let e = b.un("Erf", t);
            let e = b.add(e, one);
            let cdf = b.mul(e, half);
            let x2 = b.mul(xv, xv);
            let x2 = b.mul(x2, half);
            let x2 = b.neg(x2);
            let pdf = b.un("Exp", x2);
            let pdf = b.mul(pdf, c);
            let t = b.mul(xv, pdf);
            let t = b.add(cdf, t);
            out[0] = Some(b.mul(g, t));
        }
        "HardSwish" => {
            // y = x relu6(x+3)/6: dy/dx = 0 (x < -3), 1 (x > 3), (2x + 3)/6 otherwise.
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let three = b.scalar(dt, 3.0)?;
            let m3 = b.scalar(dt, -3.0)?;
            let z = b.scalar(dt, 0.0)?;
            // Divide by 6 (exact in every float type) rather than multiply by a rounded 1/6.
            let six = b.scalar(dt, 6.0)?;
            let two = b.scalar(dt, 2.0)?;
            let t = b.mul(xv, two);
            let t = b.add(t, three);
            let t = b.div(t, six);
            let mid = b.mul(g, t);
            let hi = b.op1("Greater", &[xv, three], vec![], DType::Bool);
            let lo = b.op1("Less", &[xv, m3], vec![], DType::Bool);
            let w = b.op1("Where", &[hi, g, mid], vec![], dt);
            out[0] = Some(b.op1("Where", &[lo, z, w], vec![], dt));
        }
        "Clip" => {
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let mut m: Option<Value> = None;
            for (i, cmp) in [(1, "GreaterOrEqual"), (2, "LessOrEqual")] {
                if let Some(lim) = x(i) {
                    let c = b.op1(cmp, &[xv, lim], vec![], DType::Bool);
                    m = Some(match m {
                        Some(p) => b.op1("And", &[p, c], vec![], DType::Bool),
                        None => c,
                    });
                }
            }
            out[0] = Some(match m {
                Some(m) => {
                    let z = b.scalar(dt, 0.0)?;
                    b.op1("Where", &[m, g, z], vec![], dt)
                }
                None => g,
            });
        }
        "Softmax" => {
            // dX = Y (dY - sum_axis(dY Y))
            let g = dy!();
            let r = dims(b, &d, y)?.len();
            if opset < 13 {
                return Err(err(
                    &d,
                    "autodiff: Softmax before opset 13 is not supported",
                ));
            }
            let ax = norm_axis(d.int_attr("axis").unwrap_or(-1), r);
            let gy = b.mul(g, y);
            let s = b.reduce_sum(gy, &[ax], true);
            let t = b.sub(g, s);
            out[0] = Some(b.mul(y, t));
        }
        "LogSoftmax" => {
            // dX = dY - exp(Y) sum_axis(dY)
            let g = dy!();
            let r = dims(b, &d, y)?.len();
            if opset < 13 {
                return Err(err(
                    &d,
                    "autodiff: LogSoftmax before opset 13 is not supported",
                ));
            }
            let ax = norm_axis(d.int_attr("axis").unwrap_or(-1), r);
            let s = b.reduce_sum(g, &[ax], true);
            let e = b.un("Exp", y);
            let t = b.mul(e, s);
            out[0] = Some(b.sub(g, t));
        }
        "Cast" => {
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let xt = b.g.ty(xv).dtype;
            if xt.is_float() && dt.is_float() {
                out[0] = Some(b.cast(g, xt));
            }
        }
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            out[0] = Some(b.reshape_like(g, xv));
        }
        "Transpose" => {
            let g = dy!();
            let r = dims(b, &d, y)?.len() as i64;
            let perm: Vec<i64> = d
                .ints_attr("perm")
                .map(<[i64]>::to_vec)
                .unwrap_or_else(|| (0..r).rev().collect());
            let mut inv = vec![0i64; perm.len()];
            for (i, p) in perm.iter().enumerate() {
                let p = usize::try_from(*p).map_err(|_| err(&d, "bad perm"))?;
                *inv.get_mut(p).ok_or_else(|| err(&d, "bad perm"))? = i as i64;
            }
            out[0] = Some(b.transpose(g, &inv));
        }
        "Expand" => {
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let (yd, xd) = (dims(b, &d, y)?, dims(b, &d, xv)?);
            out[0] = Some(b.unbroadcast(g, &yd, &xd)?);
        }
        "Where" => {
            // dA = unb(where(c, dY, 0)), dB = unb(where(c, 0, dY))
            let g = dy!();
            let c = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let yd = dims(b, &d, y)?;
            let z = b.scalar(dt, 0.0)?;
            for (i, slot) in out.iter_mut().enumerate().skip(1) {
                if !need_i(i) {
                    continue;
                }
                let v = x(i).ok_or_else(|| err(&d, "missing input"))?;
                let vd = dims(b, &d, v)?;
                let w = if i == 1 {
                    b.op1("Where", &[c, g, z], vec![], dt)
                } else {
                    b.op1("Where", &[c, z, g], vec![], dt)
                };
                *slot = Some(b.unbroadcast(w, &yd, &vd)?);
            }
        }
        "Concat" => {
            // dX_i = Split(dY) along the axis.
            let g = dy!();
            let r = dims(b, &d, y)?.len();
            let ax = norm_axis(d.int_attr("axis").unwrap_or(0), r);
            let mut sizes = Vec::new();
            for i in 0..n {
                let v = x(i).ok_or_else(|| err(&d, "missing input"))?;
                sizes.push(dims(b, &d, v)?[ax as usize].clone());
            }
            let split = if let Some(s) = sizes.iter().map(Dim::known).collect::<Option<Vec<_>>>() {
                b.ints(&s)
            } else {
                let mut parts = Vec::new();
                for i in 0..n {
                    let v = x(i).ok_or_else(|| err(&d, "missing input"))?;
                    let s = b.op1("Shape", &[v], vec![], DType::I64);
                    let idx = b.ints(&[ax]);
                    parts.push(b.op1("Gather", &[s, idx], vec![], DType::I64));
                }
                b.op1("Concat", &parts, vec![("axis", Attr::Int(0))], DType::I64)
            };
            let types = vec![dt; n];
            let outs = b.op(
                "Split",
                &[Some(g), Some(split)],
                vec![("axis", Attr::Int(ax))],
                &types,
            );
            for (i, slot) in out.iter_mut().enumerate() {
                if need_i(i) {
                    *slot = Some(outs[i]);
                }
            }
        }
        "Split" => {
            // dX = Concat(dY_k, zeros for results the loss does not use).
            if dys.iter().all(Option::is_none) {
                return Ok(Some(out));
            }
            let r = dims(b, &d, y)?.len();
            let ax = norm_axis(d.int_attr("axis").unwrap_or(0), r);
            let mut parts = Vec::new();
            for (k, res) in d.outputs.iter().enumerate() {
                parts.push(match dys.get(k).copied().flatten() {
                    Some(g) => g,
                    None => b.zeros_like(*res)?,
                });
            }
            out[0] = Some(b.op1("Concat", &parts, vec![("axis", Attr::Int(ax))], dt));
        }
        "Slice" => {
            // Constant bounds: dX = Pad(dY) with the cut-off sizes. A positive step `st` > 1
            // along an axis first spreads dY's `n` elements to every `st`-th place (Unsqueeze
            // after the axis, Pad that new axis to `st`, Reshape back: `[.., n, st, ..]` ->
            // `[.., n st, ..]`), then pads as a step-1 slice of `n st` elements would (the
            // trailing pad may be negative, a crop).
            let mut g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            // Only the sliced axes need static sizes (a symbolic batch elsewhere is fine).
            let xd = dims(b, &d, xv)?;
            let r = xd.len();
            let (Some(starts), Some(ends)) = (const_ints(b, &d, 1), const_ints(b, &d, 2)) else {
                return Err(err(&d, "autodiff: Slice needs constant starts/ends"));
            };
            let axes = const_ints(b, &d, 3).unwrap_or_else(|| (0..starts.len() as i64).collect());
            let steps = const_ints(b, &d, 4).unwrap_or_else(|| vec![1; starts.len()]);
            let mut pads = vec![0i64; 2 * r];
            for k in 0..starts.len() {
                let st = steps.get(k).copied().unwrap_or(1);
                if st < 1 {
                    return Err(err(
                        &d,
                        format!("autodiff: Slice with step {st} has no gradient rule (steps must be positive)"),
                    ));
                }
                let a = norm_axis(*axes.get(k).ok_or_else(|| err(&d, "bad axes"))?, r) as usize;
                let dim = match xd.get(a).ok_or_else(|| err(&d, "bad axes"))? {
                    Dim::Known(n) => *n,
                    // The whole of a symbolic axis (`x[0:]`, `x[:INT_MAX]`) cuts nothing off.
                    _ if st == 1 && starts[k] == 0 && ends[k] >= i64::from(i32::MAX) => continue,
                    _ => {
                        return Err(err(
                            &d,
                            format!(
                                "autodiff: Slice along axis {a} needs its size, but '{}' is {}",
                                b.g.name(xv),
                                pipec_compiler::ir::fmt_type(b.g.ty(xv))
                            ),
                        ))
                    }
                };
                let clamp = |v: i64| {
                    let v = if v < 0 { v + dim } else { v };
                    v.clamp(0, dim)
                };
                let (s, e) = (clamp(starts[k]), clamp(ends[k]));
                let mut e = e.max(s);
                if st > 1 {
                    let n = (e - s + st - 1) / st;
                    let u = b.unsqueeze(g, &[a as i64 + 1]);
                    let mut up = vec![0i64; 2 * (r + 1)];
                    up[r + 1 + a + 1] = st - 1;
                    let up = b.ints(&up);
                    let spread = b.op1("Pad", &[u, up], vec![], dt);
                    // Target shape: dY's, with axis a holding n st.
                    let sh = b.op1("Shape", &[g], vec![], DType::I64);
                    let mut parts = Vec::new();
                    if a > 0 {
                        let (z, hi) = (b.ints(&[0]), b.ints(&[a as i64]));
                        parts.push(b.op1("Slice", &[sh, z, hi], vec![], DType::I64));
                    }
                    parts.push(b.ints(&[n * st]));
                    if a + 1 < r {
                        let (lo, hi) = (b.ints(&[a as i64 + 1]), b.ints(&[r as i64]));
                        parts.push(b.op1("Slice", &[sh, lo, hi], vec![], DType::I64));
                    }
                    let shape = b.op1("Concat", &parts, vec![("axis", Attr::Int(0))], DType::I64);
                    g = b.op1("Reshape", &[spread, shape], vec![], dt);
                    e = s + n * st;
                }
                pads[a] = s;
                pads[r + a] = dim - e;
            }
            let p = b.ints(&pads);
            out[0] = Some(b.op1("Pad", &[g, p], vec![], dt));
        }
        "Gather" => {
            // Along axis 0 (embeddings): dW = ScatterND(zeros, idx[..., None], dY, reduction=add).
            // Along axis k: the same on W with axis k moved to the front (dY's index axes moved
            // to the front likewise), then moved back.
            let g = dy!();
            let w = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let idx = x(1).ok_or_else(|| err(&d, "missing input"))?;
            let wr = dims(b, &d, w)?;
            let r = wr.len();
            let ri = dims(b, &d, idx)?.len();
            let ax = norm_axis(d.int_attr("axis").unwrap_or(0), r) as usize;
            if ax >= r {
                return Err(err(&d, "axis out of range"));
            }
            if opset < 16 {
                return Err(err(
                    &d,
                    "autodiff: Gather's gradient needs ScatterND reduction (opset >= 16)",
                ));
            }
            let mut ix = b.cast(idx, DType::I64);
            if let Dim::Known(n0) = wr[ax] {
                // Negative indices count from the end.
                let z = b.scalar(DType::I64, 0.0)?;
                let nn = b.scalar(DType::I64, n0 as f64)?;
                let neg = b.op1("Less", &[ix, z], vec![], DType::Bool);
                let wrapped = b.add(ix, nn);
                ix = b.op1("Where", &[neg, wrapped, ix], vec![], DType::I64);
            }
            let ix = b.unsqueeze(ix, &[-1]);
            let zeros = b.zeros_like(w)?;
            if ax == 0 {
                out[0] = Some(b.op1(
                    "ScatterND",
                    &[zeros, ix, g],
                    vec![("reduction", Attr::String("add".into()))],
                    dt,
                ));
            } else {
                // W perm: [ax, 0..ax, ax+1..r]; dY perm: [ax..ax+ri, 0..ax, ax+ri..].
                let wperm: Vec<i64> = std::iter::once(ax)
                    .chain(0..ax)
                    .chain(ax + 1..r)
                    .map(|v| v as i64)
                    .collect();
                let gperm: Vec<i64> = (ax..ax + ri)
                    .chain(0..ax)
                    .chain(ax + ri..r - 1 + ri)
                    .map(|v| v as i64)
                    .collect();
                let zt = b.transpose(zeros, &wperm);
                let gt = if gperm.iter().enumerate().all(|(i, p)| i as i64 == *p) {
                    g
                } else {
                    b.transpose(g, &gperm)
                };
                let sc = b.op1(
                    "ScatterND",
                    &[zt, ix, gt],
                    vec![("reduction", Attr::String("add".into()))],
                    dt,
                );
                let mut inv = vec![0i64; r];
                for (i, p) in wperm.iter().enumerate() {
                    inv[*p as usize] = i as i64;
                }
                out[0] = Some(b.transpose(sc, &inv));
            }
        }
        "ScatterND" => {
            // Y = X with Y[indices[j]] = updates[j] (reduction none; indices distinct, as ONNX
            // requires): dX = dY with the written slices zeroed, dUpdates = GatherND(dY, indices).
            // With reduction `add` every X element also reaches Y: dX = dY.
            let g = dy!();
            let idx = x(1).ok_or_else(|| err(&d, "missing input"))?;
            let upd = x(2).ok_or_else(|| err(&d, "missing input"))?;
            let reduction = d.str_attr("reduction").unwrap_or("none");
            if need_i(0) {
                out[0] = Some(match reduction {
                    "none" => {
                        let z = b.zeros_like(upd)?;
                        b.op1("ScatterND", &[g, idx, z], vec![], dt)
                    }
                    "add" => g,
                    other => {
                        return Err(err(
                            &d,
                            format!("autodiff: no gradient for ScatterND reduction '{other}'"),
                        ))
                    }
                });
            }
            if need_i(2) {
                if !matches!(reduction, "none" | "add") {
                    return Err(err(
                        &d,
                        format!("autodiff: no gradient for ScatterND reduction '{reduction}'"),
                    ));
                }
                out[2] = Some(b.op1("GatherND", &[g, idx], vec![], dt));
            }
        }
        "GatherElements" => {
            let g = dy!();
            let w = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let idx = x(1).ok_or_else(|| err(&d, "missing input"))?;
            if opset < 16 {
                return Err(err(&d, "autodiff: GatherElements' gradient needs ScatterElements reduction (opset >= 16)"));
            }
            let zeros = b.zeros_like(w)?;
            let axis = d.int_attr("axis").unwrap_or(0);
            out[0] = Some(b.op1(
                "ScatterElements",
                &[zeros, idx, g],
                vec![
                    ("axis", Attr::Int(axis)),
                    ("reduction", Attr::String("add".into())),
                ],
                dt,
            ));
        }
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceSumSquare" | "ReduceL1"
        | "ReduceL2" | "ReduceLogSumExp" | "ReduceProd" => {
            let g = dy!();
            let xv = x(0).ok_or_else(|| err(&d, "missing input"))?;
            let xd = dims(b, &d, xv)?;
            let r = xd.len();
            let axes_in_input = d.op_type == "ReduceSum" && opset >= 13 || opset >= 18;
            let axes = if axes_in_input {
                match d.input(1) {
                    Some(_) => Some(
                        const_ints(b, &d, 1)
                            .ok_or_else(|| err(&d, "autodiff: reduction axes must be constant"))?,
                    ),
                    None => None,
                }
            } else {
                d.ints_attr("axes").map(<[i64]>::to_vec)
            };
            let noop = d.int_attr("noop_with_empty_axes").unwrap_or(0) != 0;
            let axes: Vec<i64> = match axes {
                Some(a) if !a.is_empty() => a.iter().map(|a| norm_axis(*a, r)).collect(),
                _ if noop => {
                    out[0] = Some(g);
                    return Ok(Some(out));
                }
                _ => (0..r as i64).collect(),
            };
            let keep = d.int_attr("keepdims").unwrap_or(1) != 0;
            let (gk, yk) = if keep {
                (g, y)
            } else {
                (b.unsqueeze(g, &axes), b.unsqueeze(y, &axes))
            };
            let ge = b.expand_like(gk, xv);
            out[0] = Some(match d.op_type.as_str() {
                "ReduceSum" => ge,
                "ReduceMean" => {
                    let cnt: Option<i64> = axes
                        .iter()
                        .map(|a| xd.get(*a as usize).and_then(Dim::known))
                        .try_fold(1i64, |acc, v| v.map(|v| acc * v));
                    match cnt {
                        Some(c) => {
                            let s = b.scalar(dt, 1.0 / c as f64)?;
                            b.mul(ge, s)
                        }
                        None => {
                            let sx = b.op1("Size", &[xv], vec![], DType::I64);
                            let sy = b.op1("Size", &[y], vec![], DType::I64);
                            let sx = b.cast(sx, dt);
                            let sy = b.cast(sy, dt);
                            let t = b.mul(ge, sy);
                            b.div(t, sx)
                        }
                    }
                }
                "ReduceMax" | "ReduceMin" => {
                    // Every element equal to the extremum gets the gradient.
                    let z = b.scalar(dt, 0.0)?;
                    let m = b.op1("Equal", &[xv, yk], vec![], DType::Bool);
                    b.op1("Where", &[m, ge, z], vec![], dt)
                }
                "ReduceSumSquare" => {
                    let two = b.scalar(dt, 2.0)?;
                    let t = b.mul(xv, two);
                    b.mul(ge, t)
                }
                "ReduceL2" => {
                    // dX = dY X / Y, and 0 where Y = 0 (PyTorch's subgradient of the norm at 0:
                    // Swin V2's cosine attention normalizes all-zero keys of padded tokens, and
                    // 0/0 made every parameter NaN after one step).
                    let z = b.scalar(dt, 0.0)?;
                    let t = b.div(xv, yk);
                    let at0 = b.op1("Equal", &[yk, z], vec![], DType::Bool);
                    let t = b.op1("Where", &[at0, z, t], vec![], dt);
                    b.mul(ge, t)
                }
                "ReduceL1" => {
                    let t = b.un("Sign", xv);
                    b.mul(ge, t)
                }
                "ReduceProd" => {
                    // dX = dY * Y / X (inputs without zeros).
                    let t = b.div(yk, xv);
                    b.mul(ge, t)
                }
                _ => {
                    // ReduceLogSumExp: dX = dY exp(X - Y)
                    let t = b.sub(xv, yk);
                    let e = b.un("Exp", t);
                    b.mul(ge, e)
                }
            });
        }
        "MatMul" => {
            let g = dy!();
            let (a, bb) = (
                x(0).ok_or_else(|| err(&d, "missing input"))?,
                x(1).ok_or_else(|| err(&d, "missing input"))?,
            );
            let (ga, gb) = matmul_grads(b, &d, a, bb, g, need_i(0), need_i(1))?;
            out[0] = ga;
            out[1] = gb;
        }
        "Gemm" => {
            // Y = alpha A' B' + beta C, A' = op(A), B' = op(B).
            let g = dy!();
            let (a, bb) = (
                x(0).ok_or_else(|| err(&d, "missing input"))?,
                x(1).ok_or_else(|| err(&d, "missing input"))?,
            );
            let alpha = d.float_attr("alpha").unwrap_or(1.0);
            let beta = d.float_attr("beta").unwrap_or(1.0);
            let ta = d.int_attr("transA").unwrap_or(0) != 0;
            let tb = d.int_attr("transB").unwrap_or(0) != 0;
            let gemm = |b: &mut Builder, p: Value, q: Value, tp: bool, tq: bool| {
                b.op1(
                    "Gemm",
                    &[p, q],
                    vec![
                        ("alpha", Attr::Float(alpha)),
                        ("transA", Attr::Int(tp as i64)),
                        ("transB", Attr::Int(tq as i64)),
                    ],
                    dt,
                )
            };
            if need_i(0) {
                out[0] = Some(match (ta, tb) {
                    (false, false) => gemm(b, g, bb, false, true),
                    (false, true) => gemm(b, g, bb, false, false),
                    (true, false) => gemm(b, bb, g, false, true),
                    (true, true) => gemm(b, bb, g, true, true),
                });
            }
            if need_i(1) {
                out[1] = Some(match (ta, tb) {
                    (false, false) => gemm(b, a, g, true, false),
                    (false, true) => gemm(b, g, a, true, false),
                    (true, false) => gemm(b, a, g, false, false),
                    (true, true) => gemm(b, g, a, true, true),
                });
            }
            if need_i(2) {
                let c = x(2).ok_or_else(|| err(&d, "missing input"))?;
                let gc = if beta != 1.0 {
                    let s = b.scalar(dt, beta as f64)?;
                    b.mul(g, s)
                } else {
                    g
                };
                let (yd, cd) = (dims(b, &d, y)?, dims(b, &d, c)?);
                out[2] = Some(b.unbroadcast(gc, &yd, &cd)?);
            }
        }
        "Conv" => {
            let g = dy!();
            super::conv::conv_grads(b, &d, g, need, &mut out)?;
        }
        "MaxPool" | "AveragePool" | "GlobalAveragePool" | "GlobalMaxPool" => {
            let g = dy!();
            super::conv::pool_grads(b, op, &d, g, &mut out)?;
        }
        "BatchNormalization" => {
            let g = dy!();
            super::norm::batch_norm_grads(b, &d, g, need, &mut out)?;
        }
        "Einsum" => {
            let g = dy!();
            einsum_grads(b, &d, g, need, &mut out)?;
        }
        "LayerNormalization" => {
            let g = dy!();
            super::norm::layer_norm_grads(b, &d, g, need, &mut out)?;
        }
        _ => return super::extra::extra_grad(b, op, &d, dys, need, opset),
    }
    Ok(Some(out))
}

/// Gradients of `Y = MatMul(A, B)` (numpy matmul: 1-D operands are promoted by a unit axis,
/// batch dims broadcast): `dA = unb(dY B^T)`, `dB = unb(A^T dY)`.
fn matmul_grads(
    b: &mut Builder,
    d: &OpData,
    a: Value,
    bb: Value,
    g: Value,
    need_a: bool,
    need_b: bool,
) -> Result<(Option<Value>, Option<Value>)> {
    let ad = dims(b, d, a)?;
    let bd = dims(b, d, bb)?;
    let (ra, rb) = (ad.len(), bd.len());
    if ra == 0 || rb == 0 {
        return Err(err(d, "MatMul of a scalar"));
    }
    // Promote to >= 2-D.
    let (a2, ad2) = if ra == 1 {
        (b.unsqueeze(a, &[0]), vec![Dim::Known(1), ad[0].clone()])
    } else {
        (a, ad.clone())
    };
    let (b2, bd2) = if rb == 1 {
        (b.unsqueeze(bb, &[1]), vec![bd[0].clone(), Dim::Known(1)])
    } else {
        (bb, bd.clone())
    };
    let g2 = match (ra == 1, rb == 1) {
        (true, true) => b.reshape(g, &[1, 1]),
        (true, false) => b.unsqueeze(g, &[-2]),
        (false, true) => b.unsqueeze(g, &[-1]),
        _ => g,
    };
    let batch = broadcast_dims(&[ad2[..ad2.len() - 2].to_vec(), bd2[..bd2.len() - 2].to_vec()]);
    let swap = |r: usize| -> Vec<i64> {
        let mut p: Vec<i64> = (0..r as i64).collect();
        p.swap(r - 1, r - 2);
        p
    };
    let dt = b.dt(g);
    let mut ga = None;
    let mut gb = None;
    if need_a {
        let bt = b.transpose(b2, &swap(bd2.len()));
        let m = b.op1("MatMul", &[g2, bt], vec![], dt);
        let mut full = batch.clone();
        full.extend_from_slice(&ad2[ad2.len() - 2..]);
        let r = b.unbroadcast(m, &full, &ad2)?;
        ga = Some(if ra == 1 { b.squeeze(r, &[0]) } else { r });
    }
    if need_b {
        let at = b.transpose(a2, &swap(ad2.len()));
        let m = b.op1("MatMul", &[at, g2], vec![], dt);
        let mut full = batch.clone();
        full.extend_from_slice(&bd2[bd2.len() - 2..]);
        let r = b.unbroadcast(m, &full, &bd2)?;
        gb = Some(if rb == 1 { b.squeeze(r, &[1]) } else { r });
    }
    Ok((ga, gb))
}

/// Gradients of `Einsum` (the terms' letters, `...` expanded to fresh letters using the operand
/// ranks): `dX_i = Einsum(dY, X_j (j != i); "out, terms_j -> term_i")`. Letters of `term_i`
/// that appear nowhere else were summed away in the forward; the result gets them back by
/// `Unsqueeze` + `Expand` to `X_i`'s shape. Repeated letters within one term (diagonals) and
/// broadcasting inside `...` are not supported (an error names the node).
pub fn einsum_grads(
    b: &mut Builder,
    d: &OpData,
    g: Value,
    need: &[bool],
    out: &mut [Option<Value>],
) -> Result<()> {
    let eq: String = d
        .str_attr("equation")
        .ok_or_else(|| err(d, "missing equation"))?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l.to_string(), Some(r.to_string())),
        None => (eq.clone(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != d.inputs.len() {
        return Err(err(d, "equation and operand count differ"));
    }
    let used: std::collections::HashSet<char> =
        eq.chars().filter(|c| c.is_ascii_alphabetic()).collect();
    let mut spare = ('a'..='z').chain('A'..='Z').filter(|c| !used.contains(c));
    let mut ranks = Vec::new();
    for i in 0..terms.len() {
        let v = d.input(i).ok_or_else(|| err(d, "missing input"))?;
        ranks.push(dims(b, d, v)?.len());
    }
    let ell_rank = terms
        .iter()
        .zip(&ranks)
        .filter(|(t, _)| t.contains("..."))
        .map(|(t, r)| r + 3 - t.len())
        .max()
        .unwrap_or(0);
    let ell: String = (0..ell_rank)
        .map(|_| spare.next().ok_or_else(|| err(d, "too many letters")))
        .collect::<Result<_>>()?;
    let expand = |t: &str, r: usize| -> String {
        if t.contains("...") {
            let k = r + 3 - t.len();
            t.replace("...", &ell[ell.len() - k..])
        } else {
            t.to_string()
        }
    };
    let terms: Vec<String> = terms
        .iter()
        .zip(&ranks)
        .map(|(t, r)| expand(t, *r))
        .collect();
    let outt = match rhs {
        Some(r) => r.replace("...", &ell),
        None => {
            let mut counts: std::collections::BTreeMap<char, usize> = Default::default();
            for c in terms.iter().flat_map(|t| t.chars()) {
                *counts.entry(c).or_default() += 1;
            }
            let single: String = counts
                .iter()
                .filter(|(c, n)| **n == 1 && !ell.contains(**c))
                .map(|(c, _)| *c)
                .collect();
            format!("{ell}{single}")
        }
    };
    for t in terms.iter().chain(std::iter::once(&outt)) {
        let mut seen = std::collections::HashSet::new();
        if !t.chars().all(|c| seen.insert(c)) {
            return Err(err(
                d,
                "autodiff: Einsum with a repeated index in one term has no gradient rule",
            ));
        }
    }
    let dt = b.dt(g);
    for i in 0..terms.len() {
        if !need.get(i).copied().unwrap_or(false) {
            continue;
        }
        let xi = d.input(i).ok_or_else(|| err(d, "missing input"))?;
        let others: String = terms
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, t)| t.as_str())
            .chain(std::iter::once(outt.as_str()))
            .collect();
        let kept: String = terms[i].chars().filter(|c| others.contains(*c)).collect();
        let mut ops = vec![g];
        let mut ts = vec![outt.clone()];
        for (j, t) in terms.iter().enumerate() {
            if j != i {
                ops.push(d.input(j).ok_or_else(|| err(d, "missing input"))?);
                ts.push(t.clone());
            }
        }
        let e = format!("{}->{kept}", ts.join(","));
        let r = b.op1("Einsum", &ops, vec![("equation", Attr::String(e))], dt);
        out[i] = Some(if kept.len() == terms[i].len() {
            r
        } else {
            let axes: Vec<i64> = terms[i]
                .chars()
                .enumerate()
                .filter(|(_, c)| !others.contains(*c))
                .map(|(k, _)| k as i64)
                .collect();
            let u = b.unsqueeze(r, &axes);
            b.expand_like(u, xi)
        });
    }
    Ok(())
}
