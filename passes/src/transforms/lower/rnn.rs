//! `LSTM` and `GRU` unrolled over a static sequence length (ONNX operator spec, LSTM-14 and
//! GRU-14, <https://onnx.ai/onnx/operators/onnx__LSTM.html>,
//! <https://onnx.ai/onnx/operators/onnx__GRU.html>).
//!
//! LSTM, gates in the order `i o f c` in `W[dirs, 4H, I]`, `R[dirs, 4H, H]`,
//! `B[dirs, 8H] = [Wb, Rb]`, peepholes `P[dirs, 3H]` in the order `i o f`:
//! ```text
//! i = f(Xt·Wiᵀ + Hₜ₋₁·Riᵀ + Pi⊙Cₜ₋₁ + Wbi + Rbi)
//! f = f(Xt·Wfᵀ + Hₜ₋₁·Rfᵀ + Pf⊙Cₜ₋₁ + Wbf + Rbf)
//! c = g(Xt·Wcᵀ + Hₜ₋₁·Rcᵀ + Wbc + Rbc)
//! Cₜ = f⊙Cₜ₋₁ + i⊙c
//! o = f(Xt·Woᵀ + Hₜ₋₁·Roᵀ + Po⊙Cₜ + Wbo + Rbo)
//! Hₜ = o⊙h(Cₜ)
//! ```
//! GRU, gates `z r h`:
//! ```text
//! z = f(Xt·Wzᵀ + Hₜ₋₁·Rzᵀ + Wbz + Rbz)
//! r = f(Xt·Wrᵀ + Hₜ₋₁·Rrᵀ + Wbr + Rbr)
//! h = g(Xt·Whᵀ + (r⊙Hₜ₋₁)·Rhᵀ + Rbh + Wbh)          linear_before_reset = 0
//! h = g(Xt·Whᵀ + r⊙(Hₜ₋₁·Rhᵀ + Rbh) + Wbh)          linear_before_reset ≠ 0
//! Hₜ = (1 − z)⊙h + z⊙Hₜ₋₁
//! ```
//! Defaults: f = Sigmoid, g = h = Tanh; a missing `B`, `P`, `initial_h`, `initial_c` is zero (the
//! terms are left out, no zero tensor is built). `clip` clamps every pre-activation to
//! `[-clip, clip]`. The reverse direction walks `t = S-1 .. 0` and stores `Hₜ` at position `t` of
//! `Y`; `Y_h`/`Y_c` are the states after the last step walked. Layout 1 (batch first) is
//! transposed to layout 0 and back. `X·Wᵀ` is computed once for the whole sequence per gate;
//! the recurrence is unrolled, `S` steps per direction.

use crate::transforms::autodiff::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Attr, Op, Value};
use pipec_compiler::Result;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Lstm,
    Gru,
}

/// An activation of the `activations` attribute that the rewrite supports.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Act {
    Sigmoid,
    Tanh,
    Relu,
}

/// Replacements for the op's results `[Y, Y_h, Y_c]` (`None` where not needed or absent).
pub fn lower_rnn(
    b: &mut Builder,
    op: Op,
    needed: &[bool],
    opset: i64,
) -> Result<Vec<Option<Value>>> {
    let d = b.g.ops[op].clone();
    let kind = if d.op_type == "LSTM" {
        Kind::Lstm
    } else {
        Kind::Gru
    };
    let err = |m: String| Error::node(&d.name, &d.op_type, format!("cannot lower: {m}"));
    let gates: i64 = if kind == Kind::Lstm { 4 } else { 3 };
    let x = d.input(0).ok_or_else(|| err("X is missing".into()))?;
    let w = d.input(1).ok_or_else(|| err("W is missing".into()))?;
    let r = d.input(2).ok_or_else(|| err("R is missing".into()))?;
    let bias = d.input(3);
    let seq_lens = d.input(4);
    let init_h = d.input(5);
    let init_c = if kind == Kind::Lstm { d.input(6) } else { None };
    let peep = if kind == Kind::Lstm { d.input(7) } else { None };
    let layout = d.int_attr("layout").unwrap_or(0);
    if layout != 0 && layout != 1 {
        return Err(err(format!("layout {layout} (0 or 1 expected)")));
    }
    if kind == Kind::Lstm && d.int_attr("input_forget").unwrap_or(0) != 0 {
        return Err(err(
            "input_forget = 1 (coupled input and forget gates) is not supported".into(),
        ));
    }
    let lbr = kind == Kind::Gru && d.int_attr("linear_before_reset").unwrap_or(0) != 0;
    let dirs: Vec<bool> = match d.str_attr("direction").unwrap_or("forward") {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => return Err(err(format!("unknown direction '{other}'"))),
    };
    let xdims =
        b.g.ty(x)
            .static_dims()
            .filter(|s| s.len() == 3)
            .or_else(|| {
                // The batch may be symbolic: only the sequence and input dims must be known.
                let s = b.g.ty(x).shape.as_ref()?;
                (s.len() == 3).then(|| s.iter().map(|d| d.known().unwrap_or(-1)).collect())
            })
            .ok_or_else(|| err("X must be 3-D with a known rank".into()))?;
    let seq = if layout == 0 { xdims[0] } else { xdims[1] };
    if seq < 1 {
        return Err(err(
            "the sequence length of X is not static (give the input shapes, or fold them first)"
                .into(),
        ));
    }
    let hidden = match d.int_attr("hidden_size") {
        Some(h) if h > 0 => h,
        Some(h) => return Err(err(format!("hidden_size {h}"))),
        None => match b.g.ty(w).static_dims() {
            Some(s) if s.len() == 3 && s[1] % gates == 0 => s[1] / gates,
            _ => {
                return Err(err(
                    "hidden_size is not given and W's shape is not static".into()
                ))
            }
        },
    };
    if let Some(sl) = seq_lens {
        let full =
            b.g.constant(sl)
                .and_then(|t| t.to_i64_vec())
                .is_some_and(|v| v.iter().all(|&n| n == seq));
        if !full {
            return Err(err(format!(
                "sequence_lens is given and is not the constant {seq} for every batch entry (variable-length sequences are not supported)"
            )));
        }
    }
    let n_acts = if kind == Kind::Lstm { 3 } else { 2 };
    let acts: Vec<Act> = match d.attr("activations") {
        None => {
            let one = if kind == Kind::Lstm {
                vec![Act::Sigmoid, Act::Tanh, Act::Tanh]
            } else {
                vec![Act::Sigmoid, Act::Tanh]
            };
            one.repeat(dirs.len())
        }
        Some(Attr::Strings(v)) => {
            if v.len() != n_acts * dirs.len() {
                return Err(err(format!(
                    "activations has {} names, {} expected ({n_acts} per direction)",
                    v.len(),
                    n_acts * dirs.len()
                )));
            }
            v.iter()
                .map(|a| match a.to_ascii_lowercase().as_str() {
                    "sigmoid" => Ok(Act::Sigmoid),
                    "tanh" => Ok(Act::Tanh),
                    "relu" => Ok(Act::Relu),
                    _ => Err(err(format!(
                        "activation '{a}' (only Sigmoid, Tanh and Relu are supported)"
                    ))),
                })
                .collect::<Result<_>>()?
        }
        Some(_) => return Err(err("activations is not a list of strings".into())),
    };
    let clip = d.float_attr("clip");
    let dt = b.dt(x);

    // Layout 0 views: X[S, B, I], initial states [dirs, B, H].
    let (x0, h0, c0) = if layout == 1 {
        let x0 = b.transpose(x, &[1, 0, 2]);
        let h0 = init_h.map(|v| b.transpose(v, &[1, 0, 2]));
        let c0 = init_c.map(|v| b.transpose(v, &[1, 0, 2]));
        (x0, h0, c0)
    } else {
        (x, init_h, init_c)
    };

    // Values with a batch dim (possibly symbolic) are cut with Split, whose gradient needs no
    // static shape; the weights (static) with Slice.
    let h0s = h0.map(|v| split0(b, v, dirs.len(), opset));
    let c0s = c0.map(|v| split0(b, v, dirs.len(), opset));
    let mut ys = Vec::new();
    let mut yhs = Vec::new();
    let mut ycs = Vec::new();
    for (di, &reverse) in dirs.iter().enumerate() {
        let di = di as i64;
        let pick = |b: &mut Builder, v: Value| {
            let s = slice(b, v, 0, di, di + 1);
            b.squeeze(s, &[0])
        };
        let wd = pick(b, w); // [G*H, I]
        let rd = pick(b, r); // [G*H, H]
        let bd = bias.map(|v| pick(b, v)); // [2*G*H]
        let pd = peep.map(|v| pick(b, v)); // [3H]
        let a = &acts[di as usize * n_acts..(di as usize + 1) * n_acts];
        let gate = |b: &mut Builder, v: Value, k: i64| slice(b, v, 0, k * hidden, (k + 1) * hidden);
        // Per gate: X·Wₖᵀ (+ biases folded in where the equations allow), and Rₖᵀ.
        let mut xw = Vec::new();
        let mut rt = Vec::new();
        let mut rb_inside = None;
        for k in 0..gates {
            let wk = gate(b, wd, k);
            let wkt = b.transpose(wk, &[1, 0]);
            let mut v = b.op1("MatMul", &[x0, wkt], vec![], dt); // [S, B, H]
            if let Some(bd) = bd {
                let wb = gate(b, bd, k);
                v = b.add(v, wb);
                let rb = gate(b, bd, gates + k);
                if kind == Kind::Gru && lbr && k == 2 {
                    rb_inside = Some(rb);
                } else {
                    v = b.add(v, rb);
                }
            }
            xw.push(v);
            let rk = gate(b, rd, k);
            rt.push(b.transpose(rk, &[1, 0]));
        }
        let peeps = pd.map(|p| [gate(b, p, 0), gate(b, p, 1), gate(b, p, 2)]);
        let mut h = h0s.as_ref().map(|v| v[di as usize]);
        let mut c = c0s.as_ref().map(|v| v[di as usize]);
        let xts: Vec<Vec<Value>> = xw
            .iter()
            .map(|&v| split0(b, v, seq as usize, opset))
            .collect();
        let mut outs: Vec<Option<Value>> = vec![None; seq as usize];
        let steps: Vec<i64> = if reverse {
            (0..seq).rev().collect()
        } else {
            (0..seq).collect()
        };
        for t in steps {
            let xt: Vec<Value> = xts.iter().map(|v| v[t as usize]).collect();
            // Xt·Wₖᵀ + Hₜ₋₁·Rₖᵀ (+ peephole) for gate k.
            let pre = |b: &mut Builder, k: usize, h: Option<Value>| -> Value {
                match h {
                    Some(h) => {
                        let hr = b.op1("MatMul", &[h, rt[k]], vec![], dt);
                        b.add(xt[k], hr)
                    }
                    None => xt[k],
                }
            };
            let (hn, cn) = match kind {
                Kind::Lstm => {
                    let mut pi = pre(b, 0, h);
                    let mut pf = pre(b, 2, h);
                    if let (Some(p), Some(c)) = (peeps, c) {
                        let t1 = b.mul(p[0], c);
                        pi = b.add(pi, t1);
                        let t2 = b.mul(p[2], c);
                        pf = b.add(pf, t2);
                    }
                    let i = activate(b, a[0], pi, clip)?;
                    let f = activate(b, a[0], pf, clip)?;
                    let pc = pre(b, 3, h);
                    let g = activate(b, a[1], pc, clip)?;
                    let ig = b.mul(i, g);
                    let cn = match c {
                        Some(c) => {
                            let fc = b.mul(f, c);
                            b.add(fc, ig)
                        }
                        None => ig,
                    };
                    let mut po = pre(b, 1, h);
                    if let Some(p) = peeps {
                        let t3 = b.mul(p[1], cn);
                        po = b.add(po, t3);
                    }
                    let o = activate(b, a[0], po, clip)?;
                    let hc = activate(b, a[2], cn, None)?;
                    (b.mul(o, hc), Some(cn))
                }
                Kind::Gru => {
                    let pz = pre(b, 0, h);
                    let pr = pre(b, 1, h);
                    let z = activate(b, a[0], pz, clip)?;
                    let rg = activate(b, a[0], pr, clip)?;
                    let ph = match (h, lbr) {
                        (Some(h), false) => {
                            let rh = b.mul(rg, h);
                            let m = b.op1("MatMul", &[rh, rt[2]], vec![], dt);
                            b.add(xt[2], m)
                        }
                        (hh, true) => {
                            let inner = match (hh, rb_inside) {
                                (Some(h), Some(rb)) => {
                                    let m = b.op1("MatMul", &[h, rt[2]], vec![], dt);
                                    Some(b.add(m, rb))
                                }
                                (Some(h), None) => Some(b.op1("MatMul", &[h, rt[2]], vec![], dt)),
                                (None, rb) => rb,
                            };
                            match inner {
                                Some(v) => {
                                    let rv = b.mul(rg, v);
                                    b.add(xt[2], rv)
                                }
                                None => xt[2],
                            }
                        }
                        (None, false) => xt[2],
                    };
                    let hh = activate(b, a[1], ph, clip)?;
                    // (1 − z)⊙h + z⊙Hₜ₋₁ = h − z⊙h + z⊙Hₜ₋₁
                    let zh = b.mul(z, hh);
                    let mut hn = b.sub(hh, zh);
                    if let Some(h) = h {
                        let zp = b.mul(z, h);
                        hn = b.add(hn, zp);
                    }
                    (hn, None)
                }
            };
            outs[t as usize] = Some(hn);
            h = Some(hn);
            c = cn;
        }
        if needed.first().copied().unwrap_or(false) {
            let parts: Vec<Value> = outs
                .into_iter()
                .flatten()
                .map(|v| b.unsqueeze(v, &[0, 1]))
                .collect();
            ys.push(concat(b, &parts, 0));
        }
        let uh = h.map(|v| b.unsqueeze(v, &[0]));
        yhs.extend(uh);
        let uc = c.map(|v| b.unsqueeze(v, &[0]));
        ycs.extend(uc);
    }
    let mut y = (!ys.is_empty()).then(|| concat(b, &ys, 1)); // [S, dirs, B, H]
    let mut yh = (needed.get(1).copied().unwrap_or(false)).then(|| concat(b, &yhs, 0));
    let mut yc = (kind == Kind::Lstm && needed.get(2).copied().unwrap_or(false) && !ycs.is_empty())
        .then(|| concat(b, &ycs, 0));
    if layout == 1 {
        y = y.map(|v| b.transpose(v, &[2, 0, 1, 3]));
        yh = yh.map(|v| b.transpose(v, &[1, 0, 2]));
        yc = yc.map(|v| b.transpose(v, &[1, 0, 2]));
    }
    Ok(vec![y, yh, yc])
}

/// `x` cut along axis 0 into `n` pieces of size 1, that axis squeezed away.
fn split0(b: &mut Builder, x: Value, n: usize, opset: i64) -> Vec<Value> {
    let dt = b.dt(x);
    let parts = if n == 1 {
        vec![x]
    } else if opset >= 13 || opset == 0 {
        let sizes = b.ints(&vec![1; n]);
        b.op(
            "Split",
            &[Some(x), Some(sizes)],
            vec![("axis", Attr::Int(0))],
            &vec![dt; n],
        )
    } else {
        b.op(
            "Split",
            &[Some(x)],
            vec![("axis", Attr::Int(0)), ("split", Attr::Ints(vec![1; n]))],
            &vec![dt; n],
        )
    };
    parts.into_iter().map(|p| b.squeeze(p, &[0])).collect()
}

/// `Concat(parts, axis)`, or the single part.
fn concat(b: &mut Builder, parts: &[Value], axis: i64) -> Value {
    if parts.len() == 1 {
        return parts[0];
    }
    let dt = b.dt(parts[0]);
    b.op1("Concat", parts, vec![("axis", Attr::Int(axis))], dt)
}

/// `act(clip(v))`.
fn activate(b: &mut Builder, act: Act, v: Value, clip: Option<f32>) -> Result<Value> {
    let v = match clip {
        Some(c) => {
            let dt = b.dt(v);
            let lo = b.scalar(dt, -(c as f64))?;
            let hi = b.scalar(dt, c as f64)?;
            b.op1("Clip", &[v, lo, hi], vec![], dt)
        }
        None => v,
    };
    Ok(match act {
        Act::Sigmoid => b.un("Sigmoid", v),
        Act::Tanh => b.un("Tanh", v),
        Act::Relu => b.un("Relu", v),
    })
}

/// `Slice(x, [start], [end], [axis])` with constant bounds.
fn slice(b: &mut Builder, x: Value, axis: i64, start: i64, end: i64) -> Value {
    let s = b.ints(&[start]);
    let e = b.ints(&[end]);
    let a = b.ints(&[axis]);
    let dt = b.dt(x);
    b.op1("Slice", &[x, s, e, a], vec![], dt)
}
