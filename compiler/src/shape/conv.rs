//! Convolutions and pooling: `Conv`, `ConvInteger`, `ConvTranspose`, `MaxPool`, `AveragePool`,
//! `LpPool`, `GlobalAveragePool`, `GlobalMaxPool`, `GlobalLpPool`.
//!
//! Output spatial size (ONNX Conv / pool spec, NOTSET padding):
//! `out = floor((in + pad_begin + pad_end - dilation*(k-1) - 1) / stride) + 1`, with `ceil`
//! instead of `floor` for pools in `ceil_mode`, where a last window that would start in the end
//! padding is dropped (PyTorch / onnxruntime). `SAME_UPPER`/`SAME_LOWER`: `out = ceil(in /
//! stride)`; `VALID`: no padding. `ConvTranspose`: `out = stride*(in-1) + output_padding +
//! dilation*(k-1) + 1 - pad_begin - pad_end`, or `in*stride` for SAME, or `output_shape`.

use super::{node::Node, Rule};
use crate::error::Result;
use crate::ir::{DType, Dim, TensorType};
use std::collections::HashMap;

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    r.insert("Conv", conv);
    r.insert("ConvInteger", conv);
    r.insert("QLinearConv", qlinear_conv);
    r.insert("ConvTranspose", conv_transpose);
    r.insert("MaxPool", pool);
    r.insert("AveragePool", pool);
    r.insert("LpPool", pool);
    r.insert("GlobalAveragePool", global_pool);
    r.insert("GlobalMaxPool", global_pool);
    r.insert("GlobalLpPool", global_pool);
}

/// Window parameters of one spatial axis.
struct Window {
    k: i64,
    stride: i64,
    dil: i64,
    pad_b: i64,
    pad_e: i64,
}

/// Read `strides`, `dilations`, `pads` (defaults 1, 1, 0) for `r` spatial axes and check them.
fn windows(n: &Node, kernel: &[i64], r: usize) -> Result<Vec<Window>> {
    let get = |name: &str, len: usize, def: i64| -> Result<Vec<i64>> {
        match n.ints_attr(name)? {
            None => Ok(vec![def; len]),
            Some(v) if v.len() == len => Ok(v),
            Some(v) => Err(n.err(format!(
                "attribute '{name}' has {} values, expected {len}",
                v.len()
            ))),
        }
    };
    let strides = get("strides", r, 1)?;
    let dils = get("dilations", r, 1)?;
    let pads = get("pads", 2 * r, 0)?;
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let w = Window {
            k: kernel[i],
            stride: strides[i],
            dil: dils[i],
            pad_b: pads[i],
            pad_e: pads[i + r],
        };
        if w.k < 1 || w.stride < 1 || w.dil < 1 || w.pad_b < 0 || w.pad_e < 0 {
            return Err(n.err(format!(
                "bad window on spatial axis {i}: kernel {}, stride {}, dilation {}, pads {}/{}",
                w.k, w.stride, w.dil, w.pad_b, w.pad_e
            )));
        }
        out.push(w);
    }
    Ok(out)
}

/// Output size of one spatial axis of a conv or pool.
fn out_size(
    n: &Node,
    x: &Dim,
    w: &Window,
    auto_pad: &str,
    ceil: bool,
    k_idx: usize,
) -> Result<Dim> {
    let overflow = || n.err("spatial size arithmetic overflows i64");
    let eff_k = w
        .dil
        .checked_mul(w.k - 1)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(overflow)?;
    match auto_pad {
        "SAME_UPPER" | "SAME_LOWER" => {
            return Ok(match x {
                Dim::Known(i) => Dim::Known(i.div_euclid(w.stride) + i64::from(i % w.stride != 0)),
                _ if w.stride == 1 => x.clone(),
                _ => x
                    .div(&Dim::Known(w.stride))
                    .unwrap_or_else(|| n.fresh(k_idx)),
            });
        }
        "NOTSET" | "VALID" => {}
        other => return Err(n.err(format!("unsupported auto_pad '{other}'"))),
    }
    let (pb, pe) = if auto_pad == "VALID" {
        (0, 0)
    } else {
        (w.pad_b, w.pad_e)
    };
    match x {
        Dim::Known(i) => {
            let padded = i
                .checked_add(pb)
                .and_then(|v| v.checked_add(pe))
                .ok_or_else(overflow)?;
            let num = padded - eff_k;
            if num < 0 {
                return Err(n.err(format!(
                    "spatial axis {}: padded input size {padded} is smaller than the \
                     (dilated) kernel {eff_k}",
                    k_idx - 2
                )));
            }
            let mut out = if ceil {
                num / w.stride + i64::from(num % w.stride != 0) + 1
            } else {
                num / w.stride + 1
            };
            if ceil && (out - 1) * w.stride >= i + pb {
                out -= 1;
            }
            Ok(Dim::Known(out))
        }
        Dim::Sym(_) => {
            if w.stride == 1 && pb + pe == eff_k - 1 {
                Ok(x.clone())
            } else {
                Ok(n.fresh(k_idx))
            }
        }
    }
}

/// Kernel shape: attribute `kernel_shape`, else the weight's spatial dims.
fn kernel_shape(n: &Node, w: Option<&[Dim]>, r: usize) -> Result<Vec<i64>> {
    if let Some(k) = n.ints_attr("kernel_shape")? {
        if k.len() != r {
            return Err(n.err(format!(
                "kernel_shape has {} values but the input has {r} spatial axes",
                k.len()
            )));
        }
        return Ok(k);
    }
    let w = w.ok_or_else(|| n.err("kernel_shape is missing and the weight rank is unknown"))?;
    w.get(2..)
        .unwrap_or(&[])
        .iter()
        .map(|d| d.known())
        .collect::<Option<Vec<_>>>()
        .filter(|k| k.len() == r)
        .ok_or_else(|| {
            n.err("kernel_shape is missing and the weight's spatial dims are not static")
        })
}

fn conv_dtype(n: &Node) -> Result<DType> {
    Ok(if n.op_type() == "ConvInteger" {
        DType::I32
    } else {
        n.dtype(0)?
    })
}

/// `Conv(X[N,C,D...], W[M,C/group,k...], B[M])` → `[N, M, out...]`.
fn conv(n: &Node) -> Result<Vec<TensorType>> {
    conv_impl(n, 0, 1)
}

/// `QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B)`: like Conv, dtype of y_zp.
fn qlinear_conv(n: &Node) -> Result<Vec<TensorType>> {
    let mut t = conv_impl(n, 0, 3)?;
    if let (Some(o), Some(zp)) = (t.first_mut(), n.opt_ty(7)) {
        o.dtype = zp.dtype;
    }
    Ok(t)
}

fn conv_impl(n: &Node, xi: usize, wi: usize) -> Result<Vec<TensorType>> {
    let dtype = conv_dtype(n)?;
    let (Some(x), w) = (n.shape(xi)?, n.shape(wi)?) else {
        return Ok(vec![TensorType::unranked(dtype)]);
    };
    if x.len() < 3 {
        return Err(n.err(format!("input must have rank >= 3, got {}", x.len())));
    }
    let r = x.len() - 2;
    if let Some(w) = w {
        if w.len() != x.len() {
            return Err(n.err(format!(
                "weight rank {} differs from input rank {}",
                w.len(),
                x.len()
            )));
        }
        let group = n.int_attr("group", 1)?;
        if group < 1 {
            return Err(n.err(format!("group must be >= 1, got {group}")));
        }
        if let (Dim::Known(c), Dim::Known(wc)) = (&x[1], &w[1]) {
            if wc.checked_mul(group) != Some(*c) {
                return Err(n.err(format!(
                    "input has {c} channels but weight expects {wc} x group {group}"
                )));
            }
        }
    }
    let kernel = kernel_shape(n, w, r)?;
    let wins = windows(n, &kernel, r)?;
    let auto_pad = n.str_attr("auto_pad", "NOTSET")?;
    let mut out = vec![x[0].clone()];
    out.push(match w {
        Some(w) => w[0].clone(),
        None => n.fresh(1),
    });
    for (i, win) in wins.iter().enumerate() {
        out.push(out_size(n, &x[i + 2], win, auto_pad, false, i + 2)?);
    }
    Ok(vec![TensorType::new(dtype, out)])
}

/// `ConvTranspose(X[N,C,D...], W[C,M/group,k...])` → `[N, M, out...]`.
fn conv_transpose(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = n.dtype(0)?;
    let Some(x) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dtype)]);
    };
    if x.len() < 3 {
        return Err(n.err(format!("input must have rank >= 3, got {}", x.len())));
    }
    let r = x.len() - 2;
    let w = n.shape(1)?;
    let group = n.int_attr("group", 1)?;
    if group < 1 {
        return Err(n.err(format!("group must be >= 1, got {group}")));
    }
    let kernel = kernel_shape(n, w, r)?;
    let wins = windows(n, &kernel, r)?;
    let out_pad = match n.ints_attr("output_padding")? {
        None => vec![0; r],
        Some(v) if v.len() == r => v,
        Some(v) => {
            return Err(n.err(format!(
                "output_padding has {} values, expected {r}",
                v.len()
            )))
        }
    };
    let m = match w {
        Some(w) if w.len() == x.len() => {
            if let (Dim::Known(c), Dim::Known(wc)) = (&x[1], &w[0]) {
                if c != wc {
                    return Err(n.err(format!(
                        "input has {c} channels but the weight has {wc} input channels"
                    )));
                }
            }
            n.mul(&w[1], &Dim::Known(group))?
        }
        Some(w) => {
            return Err(n.err(format!(
                "weight rank {} differs from input rank {}",
                w.len(),
                x.len()
            )))
        }
        None => n.fresh(1),
    };
    let mut out = vec![x[0].clone(), m];
    if let Some(os) = n.ints_attr("output_shape")? {
        let os = if os.len() == r + 2 {
            os[2..].to_vec()
        } else {
            os
        };
        if os.len() != r {
            return Err(n.err(format!(
                "output_shape has {} values, expected {r}",
                os.len()
            )));
        }
        for v in os {
            out.push(n.check_dim(v, "output_shape")?);
        }
        return Ok(vec![TensorType::new(dtype, out)]);
    }
    let auto_pad = n.str_attr("auto_pad", "NOTSET")?;
    let overflow = || n.err("spatial size arithmetic overflows i64");
    for (i, win) in wins.iter().enumerate() {
        let xi = &x[i + 2];
        let op = out_pad[i];
        let eff_k = win
            .dil
            .checked_mul(win.k - 1)
            .and_then(|v| v.checked_add(1))
            .ok_or_else(overflow)?;
        let (pb, pe) = if auto_pad == "VALID" {
            (0, 0)
        } else {
            (win.pad_b, win.pad_e)
        };
        let d = match (auto_pad, xi) {
            ("SAME_UPPER" | "SAME_LOWER", _) => n.mul(xi, &Dim::Known(win.stride))?,
            ("NOTSET" | "VALID", Dim::Known(v)) => {
                let o = v
                    .checked_sub(1)
                    .and_then(|a| a.checked_mul(win.stride))
                    .and_then(|a| a.checked_add(op))
                    .and_then(|a| a.checked_add(eff_k))
                    .and_then(|a| a.checked_sub(pb))
                    .and_then(|a| a.checked_sub(pe))
                    .ok_or_else(overflow)?;
                if o < 0 {
                    return Err(n.err(format!("spatial axis {i}: output size {o} is negative")));
                }
                Dim::Known(o)
            }
            ("NOTSET" | "VALID", _) => {
                // stride*(x-1) + c = stride*x + (c - stride)
                let c = (op as i128) + (eff_k as i128) - (pb as i128) - (pe as i128);
                if c == win.stride as i128 {
                    n.mul(xi, &Dim::Known(win.stride))?
                } else {
                    n.fresh(i + 2)
                }
            }
            (other, _) => return Err(n.err(format!("unsupported auto_pad '{other}'"))),
        };
        out.push(d);
    }
    Ok(vec![TensorType::new(dtype, out)])
}

/// `MaxPool` (Y, Indices: int64), `AveragePool`, `LpPool` → `[N, C, out...]`.
fn pool(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = n.dtype(0)?;
    let Some(x) = n.shape(0)? else {
        return Ok(vec![
            TensorType::unranked(dtype),
            TensorType::unranked(DType::I64),
        ]);
    };
    if x.len() < 3 {
        return Err(n.err(format!("input must have rank >= 3, got {}", x.len())));
    }
    let r = x.len() - 2;
    let kernel = n
        .ints_attr("kernel_shape")?
        .ok_or_else(|| n.err("attribute 'kernel_shape' is required"))?;
    if kernel.len() != r {
        return Err(n.err(format!(
            "kernel_shape has {} values but the input has {r} spatial axes",
            kernel.len()
        )));
    }
    let wins = windows(n, &kernel, r)?;
    let auto_pad = n.str_attr("auto_pad", "NOTSET")?;
    let ceil = n.int_attr("ceil_mode", 0)? != 0;
    let mut out = vec![x[0].clone(), x[1].clone()];
    for (i, w) in wins.iter().enumerate() {
        out.push(out_size(n, &x[i + 2], w, auto_pad, ceil, i + 2)?);
    }
    Ok(vec![
        TensorType::new(dtype, out.clone()),
        TensorType::new(DType::I64, out),
    ])
}

/// Global pools: `[N, C, 1, ...]`.
fn global_pool(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = n.dtype(0)?;
    let Some(x) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dtype)]);
    };
    if x.len() < 2 {
        return Err(n.err(format!("input must have rank >= 2, got {}", x.len())));
    }
    let mut out = x[..2].to_vec();
    out.extend(std::iter::repeat_n(Dim::Known(1), x.len() - 2));
    Ok(vec![TensorType::new(dtype, out)])
}

#[cfg(test)]
mod tests {
    use super::super::testutil::T;
    use super::*;
    use crate::ir::Attr;

    /// Count window start positions by enumeration (floor mode: the window fits in the padded
    /// input; ceil mode: it starts before the end of the padded input minus the kernel plus a
    /// stride, and not inside the end padding).
    fn reference(i: i64, k: i64, s: i64, d: i64, pb: i64, pe: i64, ceil: bool) -> i64 {
        let eff = d * (k - 1) + 1;
        let padded = i + pb + pe;
        (0..)
            .take_while(|j| {
                let p = j * s;
                if ceil {
                    p + eff < padded + s && p < i + pb
                } else {
                    p + eff <= padded
                }
            })
            .count() as i64
    }

    #[test]
    fn pool_sizes_match_enumeration() {
        for i in 3..12 {
            for k in 1..4 {
                for s in 1..4 {
                    for d in 1..3 {
                        for (pb, pe) in [(0, 0), (1, 0), (1, 1), (0, 2)] {
                            if pb >= k || pe >= k || d * (k - 1) + 1 > i + pb + pe {
                                continue;
                            }
                            for ceil in [false, true] {
                                let mut t = T::new();
                                let x = t.input(DType::F32, &format!("1,1,{i}"));
                                let op = t.op(
                                    "MaxPool",
                                    &[Some(x)],
                                    &[
                                        ("kernel_shape", Attr::Ints(vec![k])),
                                        ("strides", Attr::Ints(vec![s])),
                                        ("dilations", Attr::Ints(vec![d])),
                                        ("pads", Attr::Ints(vec![pb, pe])),
                                        ("ceil_mode", Attr::Int(i64::from(ceil))),
                                    ],
                                    2,
                                );
                                let want = reference(i, k, s, d, pb, pe, ceil);
                                assert_eq!(
                                    t.shapes(op, 19)[0],
                                    format!("1,1,{want}"),
                                    "i={i} k={k} s={s} d={d} pads={pb},{pe} ceil={ceil}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn kernel_larger_than_input_is_an_error() {
        let mut t = T::new();
        let x = t.input(DType::F32, "1,1,2,2");
        let op = t.op(
            "AveragePool",
            &[Some(x)],
            &[("kernel_shape", Attr::Ints(vec![3, 3]))],
            1,
        );
        assert!(t.shapes(op, 19)[0].contains("smaller than the (dilated) kernel"));
    }

    #[test]
    fn same_padding_symbolic() {
        let mut t = T::new();
        let x = t.input(DType::F32, "n,3,h,w");
        let op = t.op(
            "MaxPool",
            &[Some(x)],
            &[
                ("kernel_shape", Attr::Ints(vec![3, 3])),
                ("strides", Attr::Ints(vec![2, 2])),
                ("auto_pad", Attr::String("SAME_UPPER".into())),
            ],
            1,
        );
        let s = t.shapes(op, 19);
        assert!(s[0].starts_with("n,3,unk_"), "{s:?}");
        let op = t.op("GlobalMaxPool", &[Some(x)], &[], 1);
        assert_eq!(t.shapes(op, 19), ["n,3,1,1"]);
    }

    #[test]
    fn bad_window_attributes() {
        let mut t = T::new();
        let x = t.input(DType::F32, "1,1,8,8");
        let op = t.op(
            "MaxPool",
            &[Some(x)],
            &[
                ("kernel_shape", Attr::Ints(vec![2, 2])),
                ("strides", Attr::Ints(vec![0, 1])),
            ],
            1,
        );
        assert!(t.shapes(op, 19)[0].contains("bad window"));
        let op = t.op(
            "MaxPool",
            &[Some(x)],
            &[
                ("kernel_shape", Attr::Ints(vec![2, 2])),
                ("pads", Attr::Ints(vec![1])),
            ],
            1,
        );
        assert!(t.shapes(op, 19)[0].contains("'pads' has 1 values"));
    }
}
