//! The host tensor: an element type, a shape and the data, as an `ndarray::ArrayD` per dtype.

use crate::error::{Error, Result};
use ndarray::{ArrayD, IxDyn};
use pipec_compiler::ir::{DType, Payload, TensorData};

/// A dense tensor in host memory. One variant per supported element type; the shape is the
/// array's shape (a 0-d array is a scalar).
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    I64(ArrayD<i64>),
    I32(ArrayD<i32>),
    U8(ArrayD<u8>),
    Bool(ArrayD<bool>),
}

macro_rules! conversions {
    ($($v:ident $t:ty),*) => {$(
        impl From<ArrayD<$t>> for Tensor {
            fn from(a: ArrayD<$t>) -> Self {
                Tensor::$v(a)
            }
        }
        impl TryFrom<Tensor> for ArrayD<$t> {
            type Error = Error;
            fn try_from(t: Tensor) -> Result<Self> {
                match t {
                    Tensor::$v(a) => Ok(a),
                    other => Err(Error::Msg(format!(
                        "expected a {} tensor, got {}",
                        stringify!($t),
                        other.dtype()
                    ))),
                }
            }
        }
    )*};
}
conversions!(F32 f32, F64 f64, I64 i64, I32 i32, U8 u8, Bool bool);

/// Apply `$body` to the array inside any variant, rewrapping the result in the same variant.
#[macro_export]
#[doc(hidden)]
macro_rules! map_any {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::tensor::Tensor::F32($a) => $crate::tensor::Tensor::F32($body),
            $crate::tensor::Tensor::F64($a) => $crate::tensor::Tensor::F64($body),
            $crate::tensor::Tensor::I64($a) => $crate::tensor::Tensor::I64($body),
            $crate::tensor::Tensor::I32($a) => $crate::tensor::Tensor::I32($body),
            $crate::tensor::Tensor::U8($a) => $crate::tensor::Tensor::U8($body),
            $crate::tensor::Tensor::Bool($a) => $crate::tensor::Tensor::Bool($body),
        }
    };
}

impl Tensor {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
            Tensor::I64(_) => DType::I64,
            Tensor::I32(_) => DType::I32,
            Tensor::U8(_) => DType::U8,
            Tensor::Bool(_) => DType::Bool,
        }
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            Tensor::F32(a) => a.shape(),
            Tensor::F64(a) => a.shape(),
            Tensor::I64(a) => a.shape(),
            Tensor::I32(a) => a.shape(),
            Tensor::U8(a) => a.shape(),
            Tensor::Bool(a) => a.shape(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    /// True if the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All-zero tensor of a dtype and shape.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let s = IxDyn(shape);
        Ok(match dtype {
            DType::F32 => Tensor::F32(ArrayD::zeros(s)),
            DType::F64 => Tensor::F64(ArrayD::zeros(s)),
            DType::I64 => Tensor::I64(ArrayD::zeros(s)),
            DType::I32 => Tensor::I32(ArrayD::zeros(s)),
            DType::U8 => Tensor::U8(ArrayD::zeros(s)),
            DType::Bool => Tensor::Bool(ArrayD::from_elem(s, false)),
            other => return Err(Error::Msg(format!("unsupported tensor dtype {other}"))),
        })
    }

    /// The tensor in row-major (standard) layout.
    pub fn into_standard(self) -> Tensor {
        map_any!(self, a => if a.is_standard_layout() { a } else { a.as_standard_layout().into_owned() })
    }

    /// Convert a constant of the IR (initializer, `Constant` value).
    pub fn from_tensor_data(t: &TensorData) -> Result<Tensor> {
        let raw = match &t.payload {
            Payload::Raw(b) => b,
            Payload::Strings(_) => {
                return Err(Error::Msg("string tensors are not supported".into()));
            }
            Payload::Elided(k) => {
                return Err(Error::Msg(format!(
                    "the tensor data was elided (dense_resource<{k}>)"
                )));
            }
        };
        let mut shape = Vec::with_capacity(t.dims.len());
        for d in &t.dims {
            shape.push(
                usize::try_from(*d)
                    .map_err(|_| Error::Msg(format!("bad tensor dims {:?}", t.dims)))?,
            );
        }
        let n: usize = shape.iter().product();
        let want = t.dtype.bytes_for(n as u64).unwrap_or(u64::MAX);
        if want != raw.len() as u64 {
            return Err(Error::Msg(format!(
                "tensor data has {} bytes but {} {:?} needs {want}",
                raw.len(),
                t.dtype,
                t.dims
            )));
        }
        fn arr<T>(shape: Vec<usize>, v: Vec<T>) -> Result<ArrayD<T>> {
            ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| Error::Msg(e.to_string()))
        }
        macro_rules! le {
            ($t:ty, $n:expr) => {
                raw.chunks_exact($n)
                    .map(|c| {
                        let mut b = [0u8; $n];
                        b.copy_from_slice(c);
                        <$t>::from_le_bytes(b)
                    })
                    .collect::<Vec<$t>>()
            };
        }
        Ok(match t.dtype {
            DType::F32 => Tensor::F32(arr(shape, le!(f32, 4))?),
            DType::F64 => Tensor::F64(arr(shape, le!(f64, 8))?),
            DType::I64 => Tensor::I64(arr(shape, le!(i64, 8))?),
            DType::I32 => Tensor::I32(arr(shape, le!(i32, 4))?),
            DType::U8 => Tensor::U8(arr(shape, raw.to_vec())?),
            DType::Bool => Tensor::Bool(arr(shape, raw.iter().map(|b| *b != 0).collect())?),
            DType::F16 => {
                let v = le!(u16, 2)
                    .into_iter()
                    .map(|b| half::f16::from_bits(b).to_f32())
                    .collect();
                Tensor::F32(arr(shape, v)?)
            }
            DType::I8 => Tensor::I32(arr(shape, raw.iter().map(|b| *b as i8 as i32).collect())?),
            DType::I16 => Tensor::I32(arr(
                shape,
                le!(i16, 2).into_iter().map(i32::from).collect(),
            )?),
            DType::U16 => Tensor::I32(arr(
                shape,
                le!(u16, 2).into_iter().map(i32::from).collect(),
            )?),
            DType::U32 => Tensor::I64(arr(
                shape,
                le!(u32, 4).into_iter().map(i64::from).collect(),
            )?),
            other => return Err(Error::Msg(format!("unsupported tensor dtype {other}"))),
        })
    }

    /// Convert to an IR constant (little-endian raw bytes).
    pub fn to_tensor_data(&self) -> TensorData {
        let dims: Vec<i64> = self.shape().iter().map(|d| *d as i64).collect();
        let mut b: Vec<u8> = Vec::with_capacity(self.len() * 8);
        match self {
            Tensor::F32(a) => a.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes())),
            Tensor::F64(a) => a.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes())),
            Tensor::I64(a) => a.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes())),
            Tensor::I32(a) => a.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes())),
            Tensor::U8(a) => b.extend(a.iter().copied()),
            Tensor::Bool(a) => b.extend(a.iter().map(|x| *x as u8)),
        }
        TensorData {
            dtype: self.dtype(),
            dims,
            payload: Payload::Raw(bytes::Bytes::from(b)),
        }
    }

    /// The elements as i64 (integer and bool tensors; floats are truncated), row-major.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match self {
            Tensor::F32(a) => a.iter().map(|x| *x as i64).collect(),
            Tensor::F64(a) => a.iter().map(|x| *x as i64).collect(),
            Tensor::I64(a) => a.iter().copied().collect(),
            Tensor::I32(a) => a.iter().map(|x| *x as i64).collect(),
            Tensor::U8(a) => a.iter().map(|x| *x as i64).collect(),
            Tensor::Bool(a) => a.iter().map(|x| *x as i64).collect(),
        }
    }

    /// The elements converted to f64 (for comparisons), same shape.
    pub fn to_f64(&self) -> ArrayD<f64> {
        match self {
            Tensor::F32(a) => a.mapv(f64::from),
            Tensor::F64(a) => a.clone(),
            Tensor::I64(a) => a.mapv(|x| x as f64),
            Tensor::I32(a) => a.mapv(f64::from),
            Tensor::U8(a) => a.mapv(f64::from),
            Tensor::Bool(a) => a.mapv(|x| x as u8 as f64),
        }
    }

    /// Convert to another element type (ONNX `Cast` semantics: float → int truncates toward zero,
    /// anything → bool is `!= 0`).
    pub fn cast(&self, to: DType) -> Result<Tensor> {
        if self.dtype() == to {
            return Ok(self.clone());
        }
        macro_rules! conv {
            ($f:expr) => {
                match self {
                    Tensor::F32(a) => a.mapv(|x| $f(x as f64)),
                    Tensor::F64(a) => a.mapv(|x| $f(x)),
                    Tensor::I64(a) => a.mapv(|x| $f(x as f64)),
                    Tensor::I32(a) => a.mapv(|x| $f(x as f64)),
                    Tensor::U8(a) => a.mapv(|x| $f(x as f64)),
                    Tensor::Bool(a) => a.mapv(|x| $f(x as u8 as f64)),
                }
            };
        }
        // Integer → integer goes through i64 so large values stay exact.
        let ints = |t: &Tensor| -> Option<ArrayD<i64>> {
            match t {
                Tensor::I64(a) => Some(a.clone()),
                Tensor::I32(a) => Some(a.mapv(i64::from)),
                Tensor::U8(a) => Some(a.mapv(i64::from)),
                Tensor::Bool(a) => Some(a.mapv(i64::from)),
                _ => None,
            }
        };
        Ok(match to {
            DType::F32 => Tensor::F32(match self {
                Tensor::F64(a) => a.mapv(|x| x as f32),
                _ => conv!(|x: f64| x as f32),
            }),
            DType::F64 => Tensor::F64(conv!(|x: f64| x)),
            DType::I64 => Tensor::I64(match ints(self) {
                Some(a) => a,
                None => conv!(|x: f64| x as i64),
            }),
            DType::I32 => Tensor::I32(match ints(self) {
                Some(a) => a.mapv(|x| x as i32),
                None => conv!(|x: f64| x as i32),
            }),
            DType::U8 => Tensor::U8(match ints(self) {
                Some(a) => a.mapv(|x| x as u8),
                None => conv!(|x: f64| x as u8),
            }),
            DType::Bool => Tensor::Bool(conv!(|x: f64| x != 0.0)),
            other => return Err(Error::Msg(format!("cannot cast to {other}"))),
        })
    }
}

/// The elements of `a` in row-major order: an owned contiguous array hands its buffer over (no
/// copy when it starts at the buffer's beginning), anything else is copied once.
pub fn into_row_major_vec<T: Clone>(a: ArrayD<T>) -> Vec<T> {
    if !a.is_standard_layout() {
        return a.iter().cloned().collect();
    }
    let n = a.len();
    let (mut v, off) = a.into_raw_vec_and_offset();
    let off = off.unwrap_or(0);
    if off != 0 || v.len() != n {
        v.drain(..off);
        v.truncate(n);
    }
    v
}

/// Largest absolute difference between two tensors of the same shape (as f64), and the largest
/// absolute value of `reference`. Errors if the shapes differ.
pub fn max_abs_diff(got: &Tensor, reference: &Tensor) -> Result<(f64, f64)> {
    if got.shape() != reference.shape() {
        return Err(Error::Msg(format!(
            "shape {:?} differs from the reference shape {:?}",
            got.shape(),
            reference.shape()
        )));
    }
    let a = got.to_f64();
    let b = reference.to_f64();
    let mut d = 0f64;
    let mut m = 0f64;
    for (x, y) in a.iter().zip(b.iter()) {
        let e = (x - y).abs();
        if e > d || e.is_nan() {
            d = if e.is_nan() { f64::INFINITY } else { e };
        }
        m = m.max(y.abs());
    }
    Ok((d, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_data_round_trip() {
        let t =
            Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1.0, -2.0, 3.5, 4.0]).unwrap());
        let d = t.to_tensor_data();
        assert_eq!(d.dims, vec![2, 2]);
        assert_eq!(Tensor::from_tensor_data(&d).unwrap(), t);
        let c = t.cast(DType::I64).unwrap();
        assert_eq!(c.to_i64_vec(), vec![1, -2, 3, 4]);
        assert_eq!(c.cast(DType::Bool).unwrap().to_i64_vec(), vec![1, 1, 1, 1]);
    }
}
