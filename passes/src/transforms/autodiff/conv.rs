//! Gradient rules of convolution and pooling.
//!
//! **Conv** `Y[n,o,i] = sum_{c,k} W[o,c,k] Xp[n, g(o)*Cg + c, i*s + k*d] + B[o]` (`Xp` padded by
//! `pb`/`pe`, `g(o)` the group of `o`, one spatial axis shown):
//! - `dX = ConvTranspose(dY, W)` with the same strides, dilations, pads and groups, and
//!   `output_padding = H + pb + pe - ((OH-1) s + (K-1) d + 1)` (the input rows the forward
//!   window never reached), which makes the result exactly `X`'s shape.
//! - `dW[o,c,k] = sum_{n,i} dY[n,o,i] Xp[n,c,k d + i s]`: a convolution of `X` with `dY` as the
//!   kernel, batch and channels swapped (`X^T: [C,N,H]`, `dY^T: [O,N,OH]`), strides and
//!   dilations exchanged, same pads; the result `[C,O,K']` is cut to `K` (`K' >= K` always) and
//!   transposed to `[O,C,K]`. With `groups = G` the input is regrouped to `[Cg, G*N, H]` and the
//!   convolution runs with `group = G`, so group `j` correlates `X[:, j*Cg + c]` with `dY[:, o]`
//!   for the `o` of group `j`.
//! - `dB = sum_{n,i} dY`.
//!
//! **ConvTranspose** (ONNX ConvTranspose-11) is the transpose of a Conv with the same
//! weights: `Y = Yfull[pb : pb + OH]` with `Yfull[n, g Mg + m, i s + k d] += X[n, g Cg + c, i]
//! W[g Cg + c, m, k]` (`Yfull` of length `s (H-1) + output_padding + (K-1) d + 1`; the pads
//! are the explicit ones, or those `auto_pad`/`output_shape` resolve to). Hence
//! - `dX = Conv(dY, W)` with the same strides, dilations, group and pads (`W` `[C, Mg, K]`
//!   read as a Conv weight: `C` outputs, `Mg` inputs per group), cut to `H` when
//!   `output_padding >= stride` made the padded `dY` longer;
//! - `dW` = the Conv weight gradient above with `dY` as the Conv's input (padded by the same
//!   pads) and `X` as its result gradient: `dW[c, m, k] = sum_{n,i} X[n,c,i] dYp[n,m,i s + k d]`;
//! - `dB = sum_{n,i} dY`.
//!
//! **MaxPool** (via indices): the forward op gets its optional `Indices` result (flat row-major
//! positions in `X`, ONNX semantics with `storage_order = 0`) and
//! `dX = Reshape(ScatterND(zeros[numel X], Indices[:,None], dY[:], reduction=add), shape X)`.
//!
//! **AveragePool**: `dX = ConvTranspose(dY / f, ones/K)` per channel (`[N*C,1,OH]`), where
//! `f = 1` with `count_include_pad = 1` or no padding, else `f = AveragePool(ones_like X)` with
//! pads counted (the fraction of each window inside `X`). **GlobalAveragePool**:
//! `dX = expand(dY) / (H W)`. **GlobalMaxPool**: `dX = expand(dY)` where `X == Y`.

use super::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{
    Attr, DType, Dim, Op, OpData, TensorData, TensorType, Value, ValueData, ValueDef,
};
use pipec_compiler::Result;

fn err(d: &OpData, msg: impl Into<String>) -> Error {
    Error::node(&d.name, &d.op_type, msg)
}

/// Static spatial dims (and the channel dim) of `v`; `dim 0` may be symbolic.
fn spatial(b: &Builder, d: &OpData, v: Value) -> Result<Vec<i64>> {
    let s =
        b.g.ty(v)
            .shape
            .clone()
            .ok_or_else(|| err(d, format!("autodiff needs the rank of '{}'", b.g.name(v))))?;
    s.iter()
        .skip(1)
        .map(Dim::known)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            err(
                d,
                format!(
                    "autodiff needs static channel and spatial dims of '{}' (it is {}); give the \
                     symbolic input dims sizes (`--dim NAME=N`)",
                    b.g.name(v),
                    pipec_compiler::ir::fmt_type(b.g.ty(v))
                ),
            )
        })
}

/// Window attributes resolved to explicit values: (kernel, strides, dilations, pads).
type Window = (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>);

fn window(d: &OpData, kernel: Vec<i64>, in_sp: &[i64]) -> Result<Window> {
    let nsp = kernel.len();
    let strides = d
        .ints_attr("strides")
        .map(<[i64]>::to_vec)
        .unwrap_or(vec![1; nsp]);
    let dil = d
        .ints_attr("dilations")
        .map(<[i64]>::to_vec)
        .unwrap_or(vec![1; nsp]);
    let auto = d.str_attr("auto_pad").unwrap_or("NOTSET");
    let pads = match auto {
        "NOTSET" => d
            .ints_attr("pads")
            .map(<[i64]>::to_vec)
            .unwrap_or(vec![0; 2 * nsp]),
        "VALID" => vec![0; 2 * nsp],
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut p = vec![0; 2 * nsp];
            for i in 0..nsp {
                let out = (in_sp[i] + strides[i] - 1) / strides[i];
                let total =
                    ((out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in_sp[i]).max(0);
                let small = total / 2;
                let (pb, pe) = if auto == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                p[i] = pb;
                p[nsp + i] = pe;
            }
            p
        }
        other => return Err(err(d, format!("unknown auto_pad '{other}'"))),
    };
    if strides.len() != nsp || dil.len() != nsp || pads.len() != 2 * nsp {
        return Err(err(
            d,
            "strides/dilations/pads do not match the kernel rank",
        ));
    }
    Ok((kernel, strides, dil, pads))
}

/// `output_padding` that makes a ConvTranspose of `out_sp` come back to `in_sp`.
fn output_padding(w: &Window, in_sp: &[i64], out_sp: &[i64]) -> Vec<i64> {
    let (k, s, dl, p) = w;
    let nsp = k.len();
    (0..nsp)
        .map(|i| in_sp[i] + p[i] + p[nsp + i] - ((out_sp[i] - 1) * s[i] + (k[i] - 1) * dl[i] + 1))
        .collect()
}

/// Conv: see the module doc.
pub fn conv_grads(
    b: &mut Builder,
    d: &OpData,
    g: Value,
    need: &[bool],
    out: &mut [Option<Value>],
) -> Result<()> {
    let x = d.input(0).ok_or_else(|| err(d, "missing input 0"))?;
    let w = d.input(1).ok_or_else(|| err(d, "missing input 1"))?;
    let y = d.outputs[0];
    let dt = b.dt(g);
    let xs = spatial(b, d, x)?; // [C, H, W..]
    let ys = spatial(b, d, y)?; // [O, OH, OW..]
    let wd =
        b.g.ty(w)
            .static_dims()
            .ok_or_else(|| err(d, "autodiff needs the static shape of the weight"))?;
    let nsp = xs.len() - 1;
    let groups = d.int_attr("group").unwrap_or(1);
    let kernel = wd[2..].to_vec();
    let win = window(d, kernel.clone(), &xs[1..])?;
    let (_, strides, dil, pads) = win.clone();
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    if need_i(0) {
        let op = output_padding(&win, &xs[1..], &ys[1..]);
        if op.iter().any(|v| *v < 0) {
            return Err(err(d, "autodiff: inconsistent Conv shapes"));
        }
        out[0] = Some(b.op1(
            "ConvTranspose",
            &[g, w],
            vec![
                ("strides", Attr::Ints(strides.clone())),
                ("dilations", Attr::Ints(dil.clone())),
                ("pads", Attr::Ints(pads.clone())),
                ("group", Attr::Int(groups)),
                ("kernel_shape", Attr::Ints(kernel.clone())),
                ("output_padding", Attr::Ints(op)),
            ],
            dt,
        ));
    }
    if need_i(1) {
        out[1] = Some(weight_grad(
            b,
            x,
            &xs,
            g,
            &ys,
            &WinArgs {
                kernel: &kernel,
                strides: &strides,
                dil: &dil,
                pads: &pads,
                groups,
            },
        ));
    }
    if need_i(2) {
        let axes: Vec<i64> = std::iter::once(0).chain(2..(nsp + 2) as i64).collect();
        out[2] = Some(b.reduce_sum(g, &axes, false));
    }
    Ok(())
}

/// The geometry of a convolution: kernel, strides, dilations, pads `[begin.., end..]`, groups.
struct WinArgs<'a> {
    kernel: &'a [i64],
    strides: &'a [i64],
    dil: &'a [i64],
    pads: &'a [i64],
    groups: i64,
}

/// The weight gradient of `Y = Conv(X, W)` with geometry `w`: `x` is `X` (`xs`: its static
/// `[C, H..]`), `g` is `dY` (`ys`: `[O, OH..]`); the result is `dW` `[O, C/groups, K..]` (see
/// the module doc).
fn weight_grad(b: &mut Builder, x: Value, xs: &[i64], g: Value, ys: &[i64], w: &WinArgs) -> Value {
    let dt = b.dt(g);
    let nsp = xs.len() - 1;
    let groups = w.groups;
    let perm_nc: Vec<i64> = [1, 0].into_iter().chain(2..(nsp + 2) as i64).collect();
    let cg = xs[0] / groups.max(1);
    let xt = if groups == 1 {
        b.transpose(x, &perm_nc)
    } else {
        // [N, C, H..] -> [N, G, Cg, H..] -> [Cg, G, N, H..] -> [Cg, G*N, H..]
        let mut s5 = vec![0, groups, cg];
        s5.extend_from_slice(&xs[1..]);
        let x5 = b.reshape(x, &s5);
        let p5: Vec<i64> = [2, 1, 0].into_iter().chain(3..(nsp + 3) as i64).collect();
        let t = b.transpose(x5, &p5);
        let mut s4 = vec![cg, -1];
        s4.extend_from_slice(&xs[1..]);
        b.reshape(t, &s4)
    };
    let gt = b.transpose(g, &perm_nc);
    let c = b.op1(
        "Conv",
        &[xt, gt],
        vec![
            ("strides", Attr::Ints(w.dil.to_vec())),
            ("dilations", Attr::Ints(w.strides.to_vec())),
            ("pads", Attr::Ints(w.pads.to_vec())),
            ("group", Attr::Int(groups)),
        ],
        dt,
    );
    // Result size per spatial axis: floor((H + pb + pe - s (OH-1) - 1) / d) + 1 >= K.
    let kp: Vec<i64> = (0..nsp)
        .map(|i| {
            (xs[i + 1] + w.pads[i] + w.pads[nsp + i] - w.strides[i] * (ys[i + 1] - 1) - 1)
                / w.dil[i]
                + 1
        })
        .collect();
    let c = if kp != w.kernel {
        let starts = b.ints(&vec![0; nsp]);
        let ends = b.ints(w.kernel);
        let axes = b.ints(&(2..(nsp + 2) as i64).collect::<Vec<_>>());
        b.op1("Slice", &[c, starts, ends, axes], vec![], dt)
    } else {
        c
    };
    b.transpose(c, &perm_nc)
}

/// ConvTranspose: see the module doc.
pub fn conv_transpose_grads(
    b: &mut Builder,
    d: &OpData,
    g: Value,
    need: &[bool],
    out: &mut [Option<Value>],
) -> Result<()> {
    let x = d.input(0).ok_or_else(|| err(d, "missing input 0"))?;
    let w = d.input(1).ok_or_else(|| err(d, "missing input 1"))?;
    let y = d.outputs[0];
    let dt = b.dt(g);
    let xs = spatial(b, d, x)?; // [C, H..]
    let ys = spatial(b, d, y)?; // [M, OH..]
    let wd =
        b.g.ty(w)
            .static_dims()
            .ok_or_else(|| err(d, "autodiff needs the static shape of the weight"))?;
    let nsp = xs.len() - 1;
    if wd.len() != nsp + 2 || ys.len() != nsp + 1 {
        return Err(err(d, "input, weight and result ranks differ"));
    }
    let groups = d.int_attr("group").unwrap_or(1);
    let kernel = d
        .ints_attr("kernel_shape")
        .map(<[i64]>::to_vec)
        .unwrap_or_else(|| wd[2..].to_vec());
    let attr = |name: &str, def: i64| -> Result<Vec<i64>> {
        let v = d
            .ints_attr(name)
            .map(<[i64]>::to_vec)
            .unwrap_or(vec![def; nsp]);
        if v.len() != nsp {
            return Err(err(d, format!("{name} does not match the kernel rank")));
        }
        Ok(v)
    };
    let strides = attr("strides", 1)?;
    let dil = attr("dilations", 1)?;
    let opad = attr("output_padding", 0)?;
    let auto = d.str_attr("auto_pad").unwrap_or("NOTSET");
    let explicit = d
        .ints_attr("pads")
        .map(<[i64]>::to_vec)
        .unwrap_or(vec![0; 2 * nsp]);
    if explicit.len() != 2 * nsp || kernel.len() != nsp {
        return Err(err(d, "pads/kernel_shape do not match the kernel rank"));
    }
    // Begin pads as the forward resolved them (ONNX ConvTranspose-11: with output_shape or
    // SAME_*, total = full - out, SAME_UPPER puts total/2 first, the others total - total/2);
    // the end pads follow from the output size.
    let mut pads = vec![0i64; 2 * nsp];
    for i in 0..nsp {
        let full = strides[i] * (xs[i + 1] - 1) + opad[i] + (kernel[i] - 1) * dil[i] + 1;
        let total = full - ys[i + 1];
        let pb = if d.ints_attr("output_shape").is_some()
            || matches!(auto, "SAME_UPPER" | "SAME_LOWER")
        {
            if auto == "SAME_UPPER" {
                total / 2
            } else {
                total - total / 2
            }
        } else if auto == "VALID" {
            0
        } else {
            explicit[i]
        };
        if total < 0 || pb < 0 || pb > total {
            return Err(err(d, "autodiff: inconsistent ConvTranspose shapes"));
        }
        pads[i] = pb;
        pads[nsp + i] = total - pb;
    }
    let win = WinArgs {
        kernel: &kernel,
        strides: &strides,
        dil: &dil,
        pads: &pads,
        groups,
    };
    let need_i = |i: usize| need.get(i).copied().unwrap_or(false);
    if need_i(0) {
        // dX = Conv(dY, W): the rows s (H-1) + 1 .. of the padded dY that output_padding
        // added are cut when output_padding >= stride.
        let c = b.op1(
            "Conv",
            &[g, w],
            vec![
                ("strides", Attr::Ints(strides.clone())),
                ("dilations", Attr::Ints(dil.clone())),
                ("pads", Attr::Ints(pads.clone())),
                ("group", Attr::Int(groups)),
                ("kernel_shape", Attr::Ints(kernel.clone())),
            ],
            dt,
        );
        let long = (0..nsp).any(|i| opad[i] >= strides[i]);
        out[0] = Some(if long {
            let starts = b.ints(&vec![0; nsp]);
            let ends = b.ints(&xs[1..]);
            let axes = b.ints(&(2..(nsp + 2) as i64).collect::<Vec<_>>());
            b.op1("Slice", &[c, starts, ends, axes], vec![], dt)
        } else {
            c
        });
    }
    if need_i(1) {
        // ConvTranspose is the input gradient of a Conv of its result; its weight gradient is
        // that Conv's weight gradient with dY as the Conv input and X as the Conv's dY.
        out[1] = Some(weight_grad(b, g, &ys, x, &xs, &win));
    }
    if need_i(2) {
        let axes: Vec<i64> = std::iter::once(0).chain(2..(nsp + 2) as i64).collect();
        out[2] = Some(b.reduce_sum(g, &axes, false));
    }
    Ok(())
}

/// The `Indices` result of a MaxPool, added to the forward op if it has none.
fn maxpool_indices(b: &mut Builder, op: Op) -> Value {
    if let Some(v) = b.g.ops[op].outputs.get(1) {
        return *v;
    }
    let y = b.g.ops[op].outputs[0];
    let name = b.fresh(&format!("{}_indices", b.g.name(y)));
    let shape = b.g.ty(y).shape.clone();
    let v = b.g.values.push(ValueData {
        name,
        ty: TensorType {
            dtype: DType::I64,
            shape,
        },
        def: ValueDef::Result(op, 1),
    });
    b.g.ops[op].outputs.push(v);
    v
}

/// Pools: see the module doc.
pub fn pool_grads(
    b: &mut Builder,
    op: Op,
    d: &OpData,
    g: Value,
    out: &mut [Option<Value>],
) -> Result<()> {
    let x = d.input(0).ok_or_else(|| err(d, "missing input 0"))?;
    let y = d.outputs[0];
    let dt = b.dt(g);
    match d.op_type.as_str() {
        "GlobalAveragePool" => {
            let r =
                b.g.ty(x)
                    .rank()
                    .ok_or_else(|| err(d, "autodiff needs the rank"))?;
            let axes: Vec<i64> = (2..r as i64).collect();
            let ic = super::norm::inv_count(b, x, &axes, dt)?;
            let e = b.expand_like(g, x);
            out[0] = Some(b.mul(e, ic));
        }
        "GlobalMaxPool" => {
            let e = b.expand_like(g, x);
            let z = b.scalar(dt, 0.0)?;
            let m = b.op1("Equal", &[x, y], vec![], DType::Bool);
            out[0] = Some(b.op1("Where", &[m, e, z], vec![], dt));
        }
        "MaxPool" => {
            if d.int_attr("storage_order").unwrap_or(0) != 0 {
                return Err(err(
                    d,
                    "autodiff: MaxPool with storage_order=1 has no gradient rule",
                ));
            }
            if b.g.ty(x).dtype != dt {
                return Err(err(d, "bad dtype"));
            }
            let idx = maxpool_indices(b, op);
            let ix = b.reshape(idx, &[-1, 1]);
            let upd = b.reshape(g, &[-1]);
            let n = match b.g.ty(x).num_elements() {
                Some(n) => b.ints(&[n as i64]),
                None => {
                    let s = b.op1("Size", &[x], vec![], DType::I64);
                    b.reshape(s, &[1])
                }
            };
            let z = TensorData::from_raw(dt, vec![1], super::builder::zero_bytes(dt)?.into())?;
            let zeros = b.op1(
                "ConstantOfShape",
                &[n],
                vec![("value", Attr::Tensor(z))],
                dt,
            );
            let sc = b.op1(
                "ScatterND",
                &[zeros, ix, upd],
                vec![("reduction", Attr::String("add".into()))],
                dt,
            );
            out[0] = Some(b.reshape_like(sc, x));
        }
        _ => {
            // AveragePool
            let xs = spatial(b, d, x)?;
            let ys = spatial(b, d, y)?;
            let kernel = d
                .ints_attr("kernel_shape")
                .map(<[i64]>::to_vec)
                .ok_or_else(|| err(d, "missing kernel_shape"))?;
            if d.ints_attr("dilations")
                .is_some_and(|v| v.iter().any(|x| *x != 1))
            {
                return Err(err(d, "autodiff: dilated AveragePool has no gradient rule"));
            }
            let win = window(d, kernel.clone(), &xs[1..])?;
            let (_, strides, _, pads) = win.clone();
            let opad = output_padding(&win, &xs[1..], &ys[1..]);
            if opad.iter().any(|v| *v < 0) {
                return Err(err(d, "autodiff: AveragePool with ceil_mode windows past the padding has no gradient rule"));
            }
            let kprod: i64 = kernel.iter().product();
            let include = d.int_attr("count_include_pad").unwrap_or(0) != 0;
            let gg = if !include && pads.iter().any(|p| *p != 0) {
                let one = TensorData::from_raw(dt, vec![1], one_bytes(dt)?.into())?;
                let s = b.shape_of(x);
                let ones = b.op1(
                    "ConstantOfShape",
                    &[s],
                    vec![("value", Attr::Tensor(one))],
                    dt,
                );
                let mut attrs: Vec<(&str, Attr)> = vec![
                    ("kernel_shape", Attr::Ints(kernel.clone())),
                    ("strides", Attr::Ints(strides.clone())),
                    ("pads", Attr::Ints(pads.clone())),
                    ("count_include_pad", Attr::Int(1)),
                ];
                if let Some(c) = d.int_attr("ceil_mode") {
                    attrs.push(("ceil_mode", Attr::Int(c)));
                }
                let f = b.op1("AveragePool", &[ones], attrs, dt);
                b.div(g, f)
            } else {
                g
            };
            let mut s3 = vec![-1, 1];
            s3.extend_from_slice(&ys[1..]);
            let g3 = b.reshape(gg, &s3);
            let mut wdims = vec![1, 1];
            wdims.extend_from_slice(&kernel);
            let wv = vec![1.0 / kprod as f64; kprod as usize];
            let wk = b.constant(dt, &wdims, &wv)?;
            let ct = b.op1(
                "ConvTranspose",
                &[g3, wk],
                vec![
                    ("strides", Attr::Ints(strides)),
                    ("pads", Attr::Ints(pads)),
                    ("kernel_shape", Attr::Ints(kernel)),
                    ("output_padding", Attr::Ints(opad)),
                ],
                dt,
            );
            out[0] = Some(b.reshape_like(ct, x));
        }
    }
    Ok(())
}

fn one_bytes(dt: DType) -> Result<Vec<u8>> {
    Ok(match dt {
        DType::F32 => 1f32.to_le_bytes().to_vec(),
        DType::F64 => 1f64.to_le_bytes().to_vec(),
        DType::F16 => half::f16::ONE.to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::ONE.to_le_bytes().to_vec(),
        other => {
            return Err(Error::msg(format!(
                "autodiff: no one of element type {other}"
            )))
        }
    })
}
