//! The evaluator's working tensor: packed little-endian bytes plus `usize` dims, a numeric view
//! (`f64` for float types, `i64` for integer and bool types) and the index arithmetic that every
//! data-movement op reduces to (strides, broadcasting, gathers of whole elements).
//!
//! Data movement never looks at element values, so Transpose, Slice, Gather, Where, ... work on
//! every byte-sized dtype; arithmetic goes through [`Num`], which rounds once when re-encoded.

use super::{Fail, MAX_ELEMENTS, R};
use crate::ir::{DType, Payload, TensorData};
use bytes::Bytes;

/// A dense tensor of a byte-sized, fixed-width dtype.
#[derive(Clone, Debug)]
pub(crate) struct Tensor {
    pub dtype: DType,
    pub dims: Vec<usize>,
    pub data: Vec<u8>,
}

/// Bytes per element of a dtype the evaluator can move, or `Unsupported`.
pub(crate) fn elem_size(dtype: DType) -> R<usize> {
    // Strings have no fixed width; 4-bit types are packed two to a byte.
    if matches!(dtype, DType::String | DType::U4 | DType::I4) {
        return Err(Fail::Unsupported);
    }
    Ok((dtype.bits() / 8) as usize)
}

/// Number of elements of `dims`, refusing shapes above [`MAX_ELEMENTS`].
///
/// Zero dims count as 1 against the cap, so every partial product of the dims of an accepted
/// shape is bounded too: strides never overflow and no loop runs long over an empty tensor
/// (`[0, 2^40, 2^40]` is refused).
pub(crate) fn capped_numel(dims: &[usize]) -> R<usize> {
    let bound = dims
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul((*d).max(1)))
        .ok_or(Fail::Unsupported)?;
    if bound as u64 > MAX_ELEMENTS {
        return Err(Fail::Unsupported);
    }
    Ok(dims.iter().product())
}

/// Dims from ONNX `i64` dims: negative dims are invalid, large shapes are refused.
pub(crate) fn dims_from_i64(dims: &[i64]) -> R<Vec<usize>> {
    let out = dims
        .iter()
        .map(|d| usize::try_from(*d).map_err(|_| Fail::invalid(format!("negative dim {d}"))))
        .collect::<R<Vec<usize>>>()?;
    capped_numel(&out)?;
    Ok(out)
}

impl Tensor {
    /// Import constant data; `Unsupported` for strings, sub-byte types, elided payloads and
    /// tensors above the size cap.
    pub fn from_data(t: &TensorData) -> R<Tensor> {
        let size = elem_size(t.dtype)?;
        let dims = dims_from_i64(&t.dims)?;
        let raw = match &t.payload {
            Payload::Raw(b) => b,
            Payload::Strings(_) | Payload::Elided(_) => return Err(Fail::Unsupported),
        };
        let n = capped_numel(&dims)?;
        if raw.len() != n * size {
            return Err(Fail::invalid(format!(
                "constant has {} bytes but {} {:?} needs {}",
                raw.len(),
                t.dtype,
                t.dims,
                n * size
            )));
        }
        Ok(Tensor {
            dtype: t.dtype,
            dims,
            data: raw.to_vec(),
        })
    }

    /// Export as IR constant data.
    pub fn into_data(self) -> TensorData {
        TensorData {
            dtype: self.dtype,
            dims: self.dims.iter().map(|d| *d as i64).collect(),
            payload: Payload::Raw(Bytes::from(self.data)),
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// A tensor of i64 values.
    pub fn from_i64s(dims: Vec<usize>, vals: &[i64]) -> Tensor {
        Tensor {
            dtype: DType::I64,
            dims,
            data: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The same data under new dims (the caller checked the element count).
    pub fn reshaped(mut self, dims: Vec<usize>) -> Tensor {
        self.dims = dims;
        self
    }

    /// Elements as i64; `Invalid` unless an integer type (indices, shapes, axes).
    pub fn ints(&self, what: &str) -> R<Vec<i64>> {
        if !self.dtype.is_int() {
            return Err(Fail::invalid(format!(
                "{what} must be an integer tensor, got {}",
                self.dtype
            )));
        }
        match self.num()? {
            Num::I(v) => Ok(v),
            Num::F(_) => Err(Fail::Unsupported),
        }
    }

    /// The single element of a scalar (or one-element) integer tensor.
    pub fn scalar_int(&self, what: &str) -> R<i64> {
        match self.ints(what)?.as_slice() {
            [v] => Ok(*v),
            _ => Err(Fail::invalid(format!(
                "{what} must be a scalar, got shape {:?}",
                self.dims
            ))),
        }
    }

    /// New tensor of dims `dims` whose i-th element is element `idx[i]` of `self`.
    pub fn take(&self, idx: &[usize], dims: Vec<usize>) -> R<Tensor> {
        let size = elem_size(self.dtype)?;
        let mut data = Vec::with_capacity(idx.len() * size);
        for &i in idx {
            data.extend_from_slice(&self.data[i * size..(i + 1) * size]);
        }
        Ok(Tensor {
            dtype: self.dtype,
            dims,
            data,
        })
    }

    /// Numeric view: floats as f64, integers and bool as i64. `Unsupported` for other types
    /// (complex, float8) and for u64 values beyond i64.
    pub fn num(&self) -> R<Num> {
        let td = TensorData {
            dtype: self.dtype,
            dims: Vec::new(),
            payload: Payload::Raw(Bytes::copy_from_slice(&self.data)),
        };
        match self.dtype {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
                td.to_f64_vec().map(Num::F).ok_or(Fail::Unsupported)
            }
            DType::U64 => {
                let v = td.to_i64_vec().ok_or(Fail::Unsupported)?;
                if v.iter().any(|x| *x < 0) {
                    return Err(Fail::Unsupported);
                }
                Ok(Num::I(v))
            }
            DType::I64
            | DType::I32
            | DType::I16
            | DType::I8
            | DType::U32
            | DType::U16
            | DType::U8
            | DType::Bool => td.to_i64_vec().map(Num::I).ok_or(Fail::Unsupported),
            _ => Err(Fail::Unsupported),
        }
    }

    /// Encode numeric values as `dtype` with dims `dims`: one rounding for floats, truncation
    /// toward zero float -> int, wrap-around between integer widths, nonzero -> true for bool.
    pub fn from_num(dtype: DType, dims: Vec<usize>, vals: &Num) -> R<Tensor> {
        let data = match vals {
            Num::F(v) => encode(dtype, v.iter().copied())?,
            Num::I(v) => encode_int(dtype, v)?,
        };
        Ok(Tensor { dtype, dims, data })
    }
}

/// Numeric view of a tensor.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Num {
    F(Vec<f64>),
    I(Vec<i64>),
}

impl Num {
    /// Values as f64.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            Num::F(v) => v.clone(),
            Num::I(v) => v.iter().map(|x| *x as f64).collect(),
        }
    }
}

fn encode(dtype: DType, vals: impl Iterator<Item = f64>) -> R<Vec<u8>> {
    let mut out = Vec::new();
    for v in vals {
        match dtype {
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I16 => out.extend_from_slice(&(v as i16).to_le_bytes()),
            DType::I8 => out.push(v as i8 as u8),
            DType::U64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::U16 => out.extend_from_slice(&(v as u16).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push(u8::from(v != 0.0)),
            _ => return Err(Fail::Unsupported),
        }
    }
    Ok(out)
}

fn encode_int(dtype: DType, vals: &[i64]) -> R<Vec<u8>> {
    if dtype.is_float() {
        return encode(dtype, vals.iter().map(|v| *v as f64));
    }
    let mut out = Vec::new();
    for &v in vals {
        match dtype {
            DType::I64 => out.extend_from_slice(&v.to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DType::I16 => out.extend_from_slice(&(v as i16).to_le_bytes()),
            DType::I8 => out.push(v as i8 as u8),
            DType::U64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
            DType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DType::U16 => out.extend_from_slice(&(v as u16).to_le_bytes()),
            DType::U8 => out.push(v as u8),
            DType::Bool => out.push(u8::from(v != 0)),
            _ => return Err(Fail::Unsupported),
        }
    }
    Ok(out)
}

/// Row-major strides of `dims`, in elements.
pub(crate) fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Calls `f` with every multi-index of `dims` in row-major order.
pub(crate) fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize])) {
    if dims.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; dims.len()];
    loop {
        f(&idx);
        let mut a = dims.len();
        loop {
            if a == 0 {
                return;
            }
            a -= 1;
            idx[a] += 1;
            if idx[a] < dims[a] {
                break;
            }
            idx[a] = 0;
        }
    }
}

/// Numpy-style broadcast of several shapes.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> R<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(Fail::invalid(format!(
                    "shapes {:?} cannot be broadcast together",
                    shapes
                )));
            }
        }
    }
    capped_numel(&out)?;
    Ok(out)
}

/// For each element of `out` (row-major), the flat index of the element of a tensor of dims
/// `src` that broadcasting reads (`src` must broadcast to `out`).
pub(crate) fn broadcast_index(src: &[usize], out: &[usize]) -> Vec<usize> {
    let off = out.len() - src.len();
    let st = strides(src);
    let mut idx = Vec::with_capacity(out.iter().product());
    for_each_index(out, |i| {
        let mut flat = 0;
        for (a, (&d, &s)) in src.iter().zip(&st).enumerate() {
            if d != 1 {
                flat += i[off + a] * s;
            }
        }
        idx.push(flat);
    });
    idx
}

/// Normalize an ONNX axis (negative counts from the end) against `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(Fail::invalid(format!(
            "axis {axis} is out of range for rank {rank}"
        )));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}
