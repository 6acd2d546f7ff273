//! The rest: `Resize` / `Upsample` (scales or sizes, `axes`, `keep_aspect_ratio_policy`),
//! `OneHot`, data-dependent ops (`NonZero`, `Unique`, `Compress`: fresh symbols), `EyeLike`,
//! `Det`, quantization (`QuantizeLinear`, `DequantizeLinear`, `DynamicQuantizeLinear`), random
//! ops, detection ops (`NonMaxSuppression`, `RoiAlign`), `GridSample`.

use super::{node::Node, Rule};
use crate::error::Result;
use crate::ir::{DType, Dim, TensorType};
use std::collections::HashMap;

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    r.insert("Resize", resize);
    r.insert("Upsample", resize);
    r.insert("OneHot", one_hot);
    r.insert("NonZero", non_zero);
    r.insert("Unique", unique);
    r.insert("Compress", compress);
    r.insert("EyeLike", like);
    r.insert("RandomNormalLike", like);
    r.insert("RandomUniformLike", like);
    r.insert("Det", det);
    r.insert("QuantizeLinear", quantize);
    r.insert("DequantizeLinear", dequantize);
    r.insert("DynamicQuantizeLinear", dynamic_quantize);
    r.insert("RandomNormal", random);
    r.insert("RandomUniform", random);
    r.insert("Bernoulli", like);
    r.insert("NonMaxSuppression", nms);
    r.insert("RoiAlign", roi_align);
    r.insert("GridSample", grid_sample);
}

/// `DynamicQuantizeLinear(x)`: y (uint8, x's shape), y_scale (float scalar), y_zero_point
/// (uint8 scalar).
fn dynamic_quantize(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![
        TensorType {
            dtype: DType::U8,
            shape: n.ty(0)?.shape.clone(),
        },
        TensorType::known(DType::F32, &[]),
        TensorType::known(DType::U8, &[]),
    ])
}

/// `RandomNormal` / `RandomUniform(shape, dtype=float)`.
fn random(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = match n.opt_int_attr("dtype")? {
        Some(c) => i32::try_from(c)
            .ok()
            .and_then(DType::from_onnx)
            .ok_or_else(|| n.err(format!("bad dtype code {c}")))?,
        None => DType::F32,
    };
    let shape = n
        .ints_attr("shape")?
        .ok_or_else(|| n.err("attribute 'shape' is required"))?
        .into_iter()
        .map(|d| n.check_dim(d, "shape"))
        .collect::<Result<Vec<_>>>()?;
    Ok(vec![TensorType::new(dtype, shape)])
}

/// `NonMaxSuppression`: int64 `[num_selected, 3]`, data-dependent.
fn nms(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![TensorType::new(
        DType::I64,
        vec![n.fresh(0), Dim::Known(3)],
    )])
}

/// `RoiAlign(X[N,C,H,W], rois[R,4], batch_indices[R])`: `[R, C, output_height, output_width]`.
fn roi_align(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let c = match n.shape(0)? {
        Some(s) if s.len() == 4 => s[1].clone(),
        Some(s) => return Err(n.err(format!("X must be 4-D, got rank {}", s.len()))),
        None => n.fresh(1),
    };
    let r = n
        .shape(1)?
        .and_then(|s| s.first().cloned())
        .unwrap_or_else(|| n.fresh(0));
    let oh = n.check_dim(n.int_attr("output_height", 1)?, "output_height")?;
    let ow = n.check_dim(n.int_attr("output_width", 1)?, "output_width")?;
    Ok(vec![TensorType::new(dt, vec![r, c, oh, ow])])
}

/// `GridSample(X[N,C,D...], grid[N,D_out...,r])`: `[N, C, D_out...]`.
fn grid_sample(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let (Some(x), Some(g)) = (n.shape(0)?, n.shape(1)?) else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    if x.len() < 3 || g.len() != x.len() {
        return Err(n.err(format!(
            "X (rank {}) and grid (rank {}) must have the same rank >= 3",
            x.len(),
            g.len()
        )));
    }
    let mut out = vec![x[0].clone(), x[1].clone()];
    out.extend(g[1..g.len() - 1].iter().cloned());
    Ok(vec![TensorType::new(dt, out)])
}

/// `Resize(X, roi, scales, sizes)` (opset 11+), `Resize(X, scales)` (10), `Upsample(X, scales)`:
/// `out = floor(in * scale)` or `sizes`; with `keep_aspect_ratio_policy` not_larger / not_smaller
/// one scale (min / max of `sizes/in` over the axes) is used and `out = round(in * scale)`.
fn resize(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let r = s.len();
    let axes = match n.ints_attr("axes")? {
        Some(a) => n.axes(&a, r)?,
        None => (0..r).collect(),
    };
    let (scales_idx, sizes_idx) =
        if n.op_type() == "Upsample" || (n.num_inputs() == 2 && n.opset < 11) {
            (1, usize::MAX)
        } else {
            (2, 3)
        };
    let fresh_all = || TensorType::new(dt, (0..r).map(|k| n.fresh(k)).collect());
    let mut out = s.to_vec();
    if n.input(sizes_idx).is_some() {
        let Some(sizes) = n.value(sizes_idx) else {
            return Ok(vec![fresh_all()]);
        };
        if sizes.len() != axes.len() {
            return Err(n.err(format!(
                "sizes has {} values for {} axes",
                sizes.len(),
                axes.len()
            )));
        }
        let policy = n.str_attr("keep_aspect_ratio_policy", "stretch")?;
        if policy == "stretch" {
            for (&ax, d) in axes.iter().zip(sizes) {
                out[ax] = d;
            }
        } else {
            let (Some(ins), Some(sz)) = (
                axes.iter()
                    .map(|&a| s[a].known())
                    .collect::<Option<Vec<_>>>(),
                sizes.iter().map(Dim::known).collect::<Option<Vec<_>>>(),
            ) else {
                return Ok(vec![fresh_all()]);
            };
            let ratios = ins.iter().zip(&sz).map(|(i, o)| *o as f64 / *i as f64);
            let scale = match policy {
                "not_larger" => ratios.fold(f64::INFINITY, f64::min),
                "not_smaller" => ratios.fold(0.0, f64::max),
                p => return Err(n.err(format!("unknown keep_aspect_ratio_policy '{p}'"))),
            };
            for (&ax, i) in axes.iter().zip(ins) {
                out[ax] = Dim::Known((i as f64 * scale).round() as i64);
            }
        }
        return Ok(vec![TensorType::new(dt, out)]);
    }
    let scales = if n.input(scales_idx).is_some() {
        n.const_floats(scales_idx)
    } else {
        n.floats_attr("scales")?
            .map(|v| v.into_iter().map(f64::from).collect())
    };
    let Some(scales) = scales else {
        return Ok(vec![fresh_all()]);
    };
    if scales.len() != axes.len() {
        return Err(n.err(format!(
            "scales has {} values for {} axes",
            scales.len(),
            axes.len()
        )));
    }
    for (&ax, sc) in axes.iter().zip(scales) {
        if sc.is_nan() || sc <= 0.0 {
            return Err(n.err(format!("scale {sc} must be positive")));
        }
        out[ax] = match &s[ax] {
            Dim::Known(i) => {
                let v = (*i as f64 * sc).floor();
                if v > i64::MAX as f64 {
                    return Err(n.err("resized dim overflows i64"));
                }
                Dim::Known(v as i64)
            }
            d if sc == 1.0 => d.clone(),
            d if sc.fract() == 0.0 && sc < i64::MAX as f64 => n.mul(d, &Dim::Known(sc as i64))?,
            _ => n.fresh(ax),
        };
    }
    Ok(vec![TensorType::new(dt, out)])
}

/// `OneHot(indices, depth, values; axis=-1)`: inserts a `depth` dim at `axis`, dtype of values.
fn one_hot(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(2)?;
    let Some(s) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt)]);
    };
    let r = s.len() + 1;
    let ax = n.axis(n.int_attr("axis", -1)?, r)?;
    let depth = match n.const_floats(1).as_deref() {
        Some([d]) => {
            if *d < 1.0 || *d > i64::MAX as f64 {
                return Err(n.err(format!("depth {d} must be a positive size")));
            }
            Dim::Known(*d as i64)
        }
        Some(v) => return Err(n.err(format!("depth must be a scalar, got {} values", v.len()))),
        None => n.fresh(ax),
    };
    let mut out = s.to_vec();
    out.insert(ax, depth);
    Ok(vec![TensorType::new(dt, out)])
}

/// `NonZero`: int64 `[rank, nnz]`, nnz data-dependent.
fn non_zero(n: &Node) -> Result<Vec<TensorType>> {
    let r = n.shape(0)?.map(|s| Dim::Known(s.len() as i64));
    Ok(vec![TensorType::new(
        DType::I64,
        vec![r.unwrap_or_else(|| n.fresh(0)), n.fresh(1)],
    )])
}

/// `Unique(X; axis?)`: Y (data-dependent count along axis, or 1-D), indices, inverse_indices,
/// counts (int64 1-D).
fn unique(n: &Node) -> Result<Vec<TensorType>> {
    let t = n.ty(0)?;
    let u = n.fresh(0);
    let y = match (n.opt_int_attr("axis")?, &t.shape) {
        (None, _) => TensorType::new(t.dtype, vec![u.clone()]),
        (Some(a), Some(s)) => {
            let ax = n.axis(a, s.len())?;
            let mut o = s.clone();
            o[ax] = u.clone();
            TensorType::new(t.dtype, o)
        }
        (Some(_), None) => TensorType::unranked(t.dtype),
    };
    let inverse = match (n.opt_int_attr("axis")?, &t.shape) {
        (None, Some(s)) => vec![n.product(s)?],
        (Some(a), Some(s)) => vec![s[n.axis(a, s.len())?].clone()],
        _ => vec![n.fresh(2)],
    };
    Ok(vec![
        y,
        TensorType::new(DType::I64, vec![u.clone()]),
        TensorType::new(DType::I64, inverse),
        TensorType::new(DType::I64, vec![u]),
    ])
}

/// `Compress(input, condition; axis?)`: data-dependent count along axis (or flattened).
fn compress(n: &Node) -> Result<Vec<TensorType>> {
    let t = n.ty(0)?;
    let shape = match (n.opt_int_attr("axis")?, &t.shape) {
        (None, _) => Some(vec![n.fresh(0)]),
        (Some(a), Some(s)) => {
            let ax = n.axis(a, s.len())?;
            let mut o = s.clone();
            o[ax] = n.fresh(ax);
            Some(o)
        }
        (Some(_), None) => None,
    };
    Ok(vec![TensorType {
        dtype: t.dtype,
        shape,
    }])
}

/// `EyeLike` / `Random*Like` / `Bernoulli(dtype?)`: the input's shape, dtype attribute or the input's.
fn like(n: &Node) -> Result<Vec<TensorType>> {
    let t = n.ty(0)?;
    let dtype = match n.opt_int_attr("dtype")? {
        Some(c) => i32::try_from(c)
            .ok()
            .and_then(DType::from_onnx)
            .ok_or_else(|| n.err(format!("bad dtype code {c}")))?,
        None => t.dtype,
    };
    Ok(vec![TensorType {
        dtype,
        shape: t.shape.clone(),
    }])
}

/// `Det(X[..., M, M])`: `[...]`.
fn det(n: &Node) -> Result<Vec<TensorType>> {
    let t = n.ty(0)?;
    let shape = match &t.shape {
        Some(s) if s.len() >= 2 => Some(s[..s.len() - 2].to_vec()),
        Some(s) => return Err(n.err(format!("input must have rank >= 2, got {}", s.len()))),
        None => None,
    };
    Ok(vec![TensorType {
        dtype: t.dtype,
        shape,
    }])
}

/// `QuantizeLinear(x, y_scale, y_zero_point?)`: x's shape, dtype of the zero point (uint8).
fn quantize(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = match n.opt_int_attr("output_dtype")?.filter(|c| *c != 0) {
        Some(c) => i32::try_from(c)
            .ok()
            .and_then(DType::from_onnx)
            .ok_or_else(|| n.err(format!("bad output_dtype {c}")))?,
        None => n.opt_ty(2).map(|t| t.dtype).unwrap_or(DType::U8),
    };
    Ok(vec![TensorType {
        dtype,
        shape: n.ty(0)?.shape.clone(),
    }])
}

/// `DequantizeLinear(x, x_scale, x_zero_point?)`: x's shape, dtype of the scale.
fn dequantize(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![TensorType {
        dtype: n.dtype(1)?,
        shape: n.ty(0)?.shape.clone(),
    }])
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{show, T};
    use super::*;
    use crate::ir::{Attr, TensorData};

    #[test]
    fn resize_forms() {
        let mut t = T::new();
        let x = t.input(DType::F32, "b,3,10,20");
        let sz = t.ints(&[5, 5]);
        let op = t.op(
            "Resize",
            &[Some(x), None, None, Some(sz)],
            &[
                ("axes", Attr::Ints(vec![2, 3])),
                (
                    "keep_aspect_ratio_policy",
                    Attr::String("not_larger".into()),
                ),
            ],
            1,
        );
        assert_eq!(t.shapes(op, 18), ["b,3,3,5"]);
        let op = t.op(
            "Resize",
            &[Some(x), None, None, Some(sz)],
            &[
                ("axes", Attr::Ints(vec![2, 3])),
                (
                    "keep_aspect_ratio_policy",
                    Attr::String("not_smaller".into()),
                ),
            ],
            1,
        );
        assert_eq!(t.shapes(op, 18), ["b,3,5,10"]);
        let sc =
            t.g.add_initializer("sc", TensorData::from_f32(vec![4], &[2.0, 1.0, 0.5, 1.5]));
        let op = t.op("Resize", &[Some(x), None, Some(sc)], &[], 1);
        assert_eq!(t.shapes(op, 18), ["2*b,3,5,30"]);
        let op = t.op(
            "Upsample",
            &[Some(x)],
            &[("scales", Attr::Floats(vec![1.0, 1.0, 2.0, 2.0]))],
            1,
        );
        assert_eq!(t.shapes(op, 7), ["b,3,20,40"]);
        let bad =
            t.g.add_initializer("bad", TensorData::from_f32(vec![2], &[2.0, 1.0]));
        let op = t.op("Resize", &[Some(x), None, Some(bad)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("scales has 2 values"));
    }

    #[test]
    fn one_hot_nonzero_unique_compress() {
        let mut t = T::new();
        let i = t.input(DType::I64, "b,3");
        let depth = t.scalar(10);
        let v = t.input(DType::F32, "2");
        let op = t.op("OneHot", &[Some(i), Some(depth), Some(v)], &[], 1);
        let ty = t.infer(op, 18).unwrap();
        assert_eq!((show(&ty[0]), ty[0].dtype), ("b,3,10".into(), DType::F32));
        let op = t.op("Unique", &[Some(i)], &[("axis", Attr::Int(1))], 4);
        let s = t.shapes(op, 18);
        assert!(s[0].starts_with("b,unk_"), "{s:?}");
        assert_eq!(s[2], "3");
        let c = t.input(DType::Bool, "3");
        let op = t.op("Compress", &[Some(i), Some(c)], &[], 1);
        assert_eq!(t.shapes(op, 18)[0].split(',').count(), 1);
        let m = t.input(DType::F32, "4");
        let op = t.op("Det", &[Some(m)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("rank >= 2"));
    }
}
