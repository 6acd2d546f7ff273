//! `Resize` (opsets 10–19) and `Upsample` as one `MatMul` per resized axis (ONNX operator spec,
//! <https://onnx.ai/onnx/operators/onnx__Resize.html>).
//!
//! Every mode of Resize but `tf_crop_and_resize` and antialiased downsampling is separable: the
//! output along axis `k` is a fixed linear combination of the input along `k`, `Y = A_k · X`
//! with a constant `A_k[out_k, in_k]` whose row `j` holds the weights of output position `j`:
//! - the coordinate transform maps `j` to `x = T(j)` (`half_pixel` `(j+½)/s − ½`,
//!   `pytorch_half_pixel` (the same, 0 when `out = 1`), `align_corners` `j·(in−1)/(out−1)`,
//!   `asymmetric` `j/s`, `tf_half_pixel_for_nn` `(j+½)/s`, `half_pixel_symmetric`), with `s` the
//!   scale given (or `out/in` when sizes are given);
//! - `nearest` puts weight 1 on `nearest_mode(x)` (`round_prefer_floor`, `round_prefer_ceil`,
//!   `floor`, `ceil`; opset < 11 and Upsample: floor, ceil when downsampling, as onnxruntime),
//!   clamped to `[0, in−1]`;
//! - `linear` puts `1−r` on `⌊x⌋` and `r` on `⌊x⌋+1` (`r = x − ⌊x⌋`), `cubic` the four Keys
//!   weights (coefficient `cubic_coeff_a`) on `⌊x⌋−1 .. ⌊x⌋+2`; neighbours outside `[0, in−1]`
//!   are clamped to the edge (the spec's edge padding) or, with `exclude_outside`, dropped and
//!   the weights renormalised.
//!
//! Applied axis by axis: the last axis as `X · A_kᵀ`, the one before as `A_k · X` (MatMul
//! broadcasting), others between two Transposes. Identity axes are skipped. Being MatMuls with
//! constants, the forward runs on existing kernels and the gradient (`dX = A_kᵀ · dY` per axis,
//! the transpose of the interpolation; for nearest the scatter-add of `dY` to the source pixels)
//! comes from the MatMul rule. The matrices are dense: `out_k × in_k` elements per axis.

use crate::transforms::autodiff::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Op, Value};
use pipec_compiler::Result;

/// Largest interpolation matrix built (elements), 16 Mi.
const MAX_MATRIX: i64 = 1 << 24;

/// Coordinate transform of the spec.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Coord {
    HalfPixel,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
    HalfPixelSymmetric,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Opset < 11 / Upsample in onnxruntime: floor when upsampling, ceil when downsampling.
    Simple,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Nearest(Nearest),
    Linear,
    Cubic { a: f64, exclude_outside: bool },
}

/// The replacement of the op's result.
pub fn lower_resize(b: &mut Builder, op: Op, opset: i64) -> Result<Value> {
    let d = b.g.ops[op].clone();
    let err = |m: String| Error::node(&d.name, &d.op_type, format!("cannot lower: {m}"));
    let x = d.input(0).ok_or_else(|| err("X is missing".into()))?;
    let y = d.outputs[0];
    let old_form = d.op_type == "Upsample" || (opset > 0 && opset < 11);
    let (scales_in, sizes_in) = if old_form { (1, usize::MAX) } else { (2, 3) };
    let mode_s = d.str_attr("mode").unwrap_or("nearest");
    let coord = if old_form {
        Coord::Asymmetric
    } else {
        match d
            .str_attr("coordinate_transformation_mode")
            .unwrap_or("half_pixel")
        {
            "half_pixel" => Coord::HalfPixel,
            "pytorch_half_pixel" => Coord::PytorchHalfPixel,
            "align_corners" => Coord::AlignCorners,
            "asymmetric" => Coord::Asymmetric,
            "tf_half_pixel_for_nn" => Coord::TfHalfPixelForNn,
            "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
            other => {
                return Err(err(format!(
                    "coordinate_transformation_mode '{other}' is not supported"
                )))
            }
        }
    };
    let mode = match mode_s {
        "nearest" => Mode::Nearest(if old_form {
            Nearest::Simple
        } else {
            match d.str_attr("nearest_mode").unwrap_or("round_prefer_floor") {
                "round_prefer_floor" => Nearest::RoundPreferFloor,
                "round_prefer_ceil" => Nearest::RoundPreferCeil,
                "floor" => Nearest::Floor,
                "ceil" => Nearest::Ceil,
                other => return Err(err(format!("nearest_mode '{other}'"))),
            }
        }),
        "linear" | "bilinear" | "trilinear" => Mode::Linear,
        "cubic" | "bicubic" if !old_form => Mode::Cubic {
            a: d.float_attr("cubic_coeff_a").unwrap_or(-0.75) as f64,
            exclude_outside: d.int_attr("exclude_outside").unwrap_or(0) != 0,
        },
        other => return Err(err(format!("mode '{other}' is not supported"))),
    };
    let xs =
        b.g.ty(x)
            .shape
            .clone()
            .ok_or_else(|| err("the rank of X is not known".into()))?;
    let ys =
        b.g.ty(y)
            .shape
            .clone()
            .filter(|s| s.len() == xs.len())
            .ok_or_else(|| err("the output shape is not known".into()))?;
    let r = xs.len();
    let axes: Vec<usize> = match d.ints_attr("axes") {
        Some(a) => a
            .iter()
            .map(|&k| {
                let k = if k < 0 { k + r as i64 } else { k };
                usize::try_from(k)
                    .ok()
                    .filter(|k| *k < r)
                    .ok_or_else(|| err(format!("axis {k} out of range for rank {r}")))
            })
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    // The scale of each axis in `axes`, as given (scales) or out/in (sizes).
    let const_of = |i: usize| -> Option<Vec<f64>> {
        let v = d.input(i)?;
        // A constant (an initializer too: scales are not trained) or a constant expression
        // (`Concat(Constant [1, 1], Constant [2, 2])`, as torch exports bilinear up-sampling).
        let t = match b.g.constant(v) {
            Some(t) => t.clone(),
            None => crate::transforms::fold_constants::constant_value(b.g, v, opset, 16)?,
        };
        if t.numel() == Some(0) {
            return None;
        }
        t.to_f64_vec()
    };
    let scales: Option<Vec<f64>> = match (const_of(scales_in), d.attr("scales")) {
        (Some(s), _) => Some(s),
        (None, Some(pipec_compiler::ir::Attr::Floats(f))) => {
            Some(f.iter().map(|v| *v as f64).collect())
        }
        _ => None,
    };
    let has_sizes = d.input(sizes_in).is_some();
    if scales.is_none() && !has_sizes {
        return Err(err(
            "scales is not a constant (and no sizes are given)".into()
        ));
    }
    if let Some(s) = &scales {
        if s.len() != axes.len() {
            return Err(err(format!(
                "scales has {} values for {} axes",
                s.len(),
                axes.len()
            )));
        }
    }
    let antialias = d.int_attr("antialias").unwrap_or(0) != 0;
    let mut cur = x;
    let dt = b.dt(x);
    let mut applied = 0;
    let mut sizes_scale = None;
    if scales.is_none() {
        // Sizes: scale out/in per axis, or one scale with keep_aspect_ratio_policy.
        let mut per = Vec::new();
        let policy = d.str_attr("keep_aspect_ratio_policy").unwrap_or("stretch");
        for &k in &axes {
            if xs[k] == ys[k] && policy == "stretch" {
                per.push(1.0); // untouched (possibly symbolic, e.g. the batch)
                continue;
            }
            let (i, o) = (xs[k].known(), ys[k].known());
            match (i, o) {
                (Some(i), Some(o)) if i > 0 => per.push(o as f64 / i as f64),
                _ => {
                    return Err(err(format!(
                        "axis {k}: the input or output size is not static"
                    )))
                }
            }
        }
        let one = match policy {
            "stretch" => None,
            "not_larger" => per.iter().copied().reduce(f64::min),
            "not_smaller" => per.iter().copied().reduce(f64::max),
            other => return Err(err(format!("keep_aspect_ratio_policy '{other}'"))),
        };
        sizes_scale = Some(match one {
            Some(s) => vec![s; per.len()],
            None => per,
        });
    }
    let scale_list = scales.or(sizes_scale).unwrap_or_default();
    for (pos, &k) in axes.iter().enumerate() {
        let s = scale_list[pos];
        if s == 1.0 && (xs[k] == ys[k] || ys[k].known().is_none()) {
            // An untouched (possibly symbolic) axis, e.g. the batch: output size = floor(in * 1)
            // = in, also where shape inference could not tell (scales from a constant
            // expression, as torch exports bilinear up-sampling).
            continue;
        }
        // The output size: as inferred, else floor(in * scale) (ONNX Resize with scales).
        let n_out = ys[k]
            .known()
            .or_else(|| xs[k].known().map(|i| (i as f64 * s).floor() as i64));
        let (Some(n_in), Some(n_out)) = (xs[k].known(), n_out) else {
            return Err(err(format!(
                "axis {k}: the input or output size is not static"
            )));
        };
        if s <= 0.0 || !s.is_finite() {
            return Err(err(format!("axis {k}: scale {s}")));
        }
        if antialias && s < 1.0 && !matches!(mode, Mode::Nearest(_)) {
            return Err(err(
                "antialias = 1 with downsampling is not supported".into()
            ));
        }
        if n_in.saturating_mul(n_out) > MAX_MATRIX {
            return Err(err(format!(
                "axis {k}: the {n_out}x{n_in} interpolation matrix is too large"
            )));
        }
        let a = matrix(mode, coord, s, n_in, n_out);
        if n_in == n_out && is_identity(&a, n_in as usize) {
            continue;
        }
        applied += 1;
        cur = apply(b, cur, &a, k, r, n_in, n_out, dt)?;
    }
    if applied == 0 {
        return Ok(b.op1("Identity", &[x], vec![], dt));
    }
    Ok(cur)
}

/// `A[out, in]`, row-major.
fn matrix(mode: Mode, coord: Coord, s: f64, n_in: i64, n_out: i64) -> Vec<f64> {
    let (ni, no) = (n_in as usize, n_out as usize);
    let mut a = vec![0.0; no * ni];
    let clamp = |i: i64| i.clamp(0, n_in - 1) as usize;
    for j in 0..no {
        let jf = j as f64;
        let x = match coord {
            Coord::HalfPixel => (jf + 0.5) / s - 0.5,
            Coord::PytorchHalfPixel => {
                if n_out > 1 {
                    (jf + 0.5) / s - 0.5
                } else {
                    0.0
                }
            }
            Coord::AlignCorners => {
                if n_out > 1 {
                    jf * (n_in - 1) as f64 / (n_out - 1) as f64
                } else {
                    0.0
                }
            }
            Coord::Asymmetric => jf / s,
            Coord::TfHalfPixelForNn => (jf + 0.5) / s,
            Coord::HalfPixelSymmetric => {
                let adjustment = n_out as f64 / (s * n_in as f64);
                let center = n_in as f64 / 2.0;
                center * (1.0 - adjustment) + (jf + 0.5) / s - 0.5
            }
        };
        let row = &mut a[j * ni..(j + 1) * ni];
        match mode {
            Mode::Nearest(nm) => {
                let frac = x - x.floor();
                let i = match nm {
                    Nearest::RoundPreferFloor if frac == 0.5 => x.floor(),
                    Nearest::RoundPreferCeil if frac == 0.5 => x.ceil(),
                    Nearest::RoundPreferFloor | Nearest::RoundPreferCeil => x.round(),
                    Nearest::Floor => x.floor(),
                    Nearest::Ceil => x.ceil(),
                    Nearest::Simple if s < 1.0 => x.ceil(),
                    Nearest::Simple => x.floor(),
                };
                row[clamp(i as i64)] = 1.0;
            }
            Mode::Linear => {
                let x = x.clamp(0.0, (n_in - 1) as f64);
                let i0 = x.floor();
                let t = x - i0;
                row[clamp(i0 as i64)] += 1.0 - t;
                row[clamp(i0 as i64 + 1)] += t;
            }
            Mode::Cubic {
                a: ca,
                exclude_outside,
            } => {
                let i0 = x.floor();
                let t = x - i0;
                let w = cubic_weights(t, ca);
                let idx: Vec<i64> = (-1..=2).map(|o| i0 as i64 + o).collect();
                let mut w = w.to_vec();
                if exclude_outside {
                    for (wk, &ik) in w.iter_mut().zip(&idx) {
                        if ik < 0 || ik >= n_in {
                            *wk = 0.0;
                        }
                    }
                    let sum: f64 = w.iter().sum();
                    if sum != 0.0 {
                        for wk in &mut w {
                            *wk /= sum;
                        }
                    }
                }
                for (wk, &ik) in w.iter().zip(&idx) {
                    row[clamp(ik)] += wk;
                }
            }
        }
    }
    a
}

/// Keys cubic convolution weights of the neighbours at offsets −1, 0, 1, 2 for fraction `t`.
fn cubic_weights(t: f64, a: f64) -> [f64; 4] {
    let k = |d: f64| {
        let d = d.abs();
        if d <= 1.0 {
            ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
        } else if d < 2.0 {
            ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
        } else {
            0.0
        }
    };
    [k(t + 1.0), k(t), k(1.0 - t), k(2.0 - t)]
}

fn is_identity(a: &[f64], n: usize) -> bool {
    (0..n).all(|i| (0..n).all(|j| a[i * n + j] == if i == j { 1.0 } else { 0.0 }))
}

/// Interpolate `x` along axis `k` of rank `r` with `A[out, in]`.
#[allow(clippy::too_many_arguments)]
fn apply(
    b: &mut Builder,
    x: Value,
    a: &[f64],
    k: usize,
    r: usize,
    n_in: i64,
    n_out: i64,
    dt: pipec_compiler::ir::DType,
) -> Result<Value> {
    if k + 2 == r {
        let m = b.constant(dt, &[n_out, n_in], a)?;
        return Ok(b.op1("MatMul", &[m, x], vec![], dt));
    }
    // Aᵀ[in, out]
    let (ni, no) = (n_in as usize, n_out as usize);
    let mut at = vec![0.0; ni * no];
    for j in 0..no {
        for i in 0..ni {
            at[i * no + j] = a[j * ni + i];
        }
    }
    let m = b.constant(dt, &[n_in, n_out], &at)?;
    if k + 1 == r {
        return Ok(b.op1("MatMul", &[x, m], vec![], dt));
    }
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(k, r - 1);
    let t = b.transpose(x, &perm);
    let p = b.op1("MatMul", &[t, m], vec![], dt);
    Ok(b.transpose(p, &perm))
}
