//! Tensor helpers of the distributed runtime (row slices, concatenation, accumulation) and the
//! step's input data (random from a seed, or read from an npz).

use crate::map_any;
use crate::tensor::Tensor;
use ndarray::{Axis, IxDyn, Slice as NdSlice};
use pipec_compiler::ir::DType;
use pipec_compiler::program::DataInput;
use std::collections::BTreeMap;

/// The data of one step: every data input at the global batch, keyed by input name.
pub type Data = BTreeMap<String, Tensor>;

/// Parse a dtype as written in `schedule.json`: `f32`, `i64`, ..., the numpy names of
/// [`DType`]'s `Display` (`float32`, `int64`) or MLIR names (`si64`).
pub fn parse_dtype(s: &str) -> Option<DType> {
    let short = match s {
        "f32" | "float" => Some(DType::F32),
        "f64" | "double" => Some(DType::F64),
        "f16" | "half" => Some(DType::F16),
        "i64" => Some(DType::I64),
        "i32" => Some(DType::I32),
        "i16" => Some(DType::I16),
        "i8" => Some(DType::I8),
        "u8" => Some(DType::U8),
        "bool" => Some(DType::Bool),
        _ => None,
    };
    short
        .or_else(|| DType::ALL.iter().copied().find(|d| d.name() == s))
        .or_else(|| DType::from_mlir_name(s))
}

/// Rows `[lo, hi)` of `t` along `axis` (a copy).
pub fn slice_axis(t: &Tensor, axis: usize, lo: usize, hi: usize) -> Result<Tensor, String> {
    let shape = t.shape();
    if axis >= shape.len() {
        return Err(format!(
            "cannot slice axis {axis} of a tensor of shape {shape:?}"
        ));
    }
    if lo > hi || hi > shape[axis] {
        return Err(format!(
            "rows [{lo}, {hi}) of axis {axis} are out of range for shape {shape:?}"
        ));
    }
    let s = NdSlice::from(lo..hi);
    Ok(map_any!(t, a => a.slice_axis(Axis(axis), s).to_owned()))
}

/// Rows `[lo*n/of, hi*n/of)` of axis `axis` (the schedule's
/// [`pipec_compiler::program::Slice`]).
pub fn slice_rows(t: &Tensor, axis: usize, lo: u64, hi: u64, of: u64) -> Result<Tensor, String> {
    let (a, b) = row_range(t.shape(), axis, lo, hi, of)?;
    slice_axis(t, axis, a, b)
}

/// The rows `[lo*n/of, hi*n/of)` that [`slice_rows`] takes of axis `axis` of a tensor of
/// `shape` (`n` long).
pub fn row_range(
    shape: &[usize],
    axis: usize,
    lo: u64,
    hi: u64,
    of: u64,
) -> Result<(usize, usize), String> {
    let n = *shape
        .get(axis)
        .ok_or_else(|| format!("cannot slice axis {axis} of a {}-D tensor", shape.len()))?
        as u64;
    if of == 0 || !n.is_multiple_of(of) {
        return Err(format!("a slice in {of} parts of {n} rows"));
    }
    Ok(((lo * n / of) as usize, (hi * n / of) as usize))
}

/// Concatenate along `axis` (same dtype, same other dims).
pub fn concat(parts: &[Tensor], axis: usize) -> Result<Tensor, String> {
    let first = parts.first().ok_or("nothing to concatenate")?;
    macro_rules! cat {
        ($v:ident) => {{
            let views = parts
                .iter()
                .map(|p| match p {
                    Tensor::$v(a) => Ok(a.view()),
                    o => Err(format!(
                        "cannot concatenate {} with {}",
                        first.dtype(),
                        o.dtype()
                    )),
                })
                .collect::<Result<Vec<_>, String>>()?;
            Tensor::$v(ndarray::concatenate(Axis(axis), &views).map_err(|e| {
                format!(
                    "cannot concatenate shapes {:?}: {e}",
                    parts.iter().map(|p| p.shape().to_vec()).collect::<Vec<_>>()
                )
            })?)
        }};
    }
    Ok(match first {
        Tensor::F32(_) => cat!(F32),
        Tensor::F64(_) => cat!(F64),
        Tensor::I64(_) => cat!(I64),
        Tensor::I32(_) => cat!(I32),
        Tensor::U8(_) => cat!(U8),
        Tensor::Bool(_) => cat!(Bool),
    })
}

/// `acc += t` (same dtype and shape; floats and integers).
pub fn add_assign(acc: &mut Tensor, t: &Tensor) -> Result<(), String> {
    if acc.shape() != t.shape() {
        return Err(format!(
            "cannot add a {:?} tensor to a {:?} accumulator",
            t.shape(),
            acc.shape()
        ));
    }
    match (acc, t) {
        (Tensor::F32(a), Tensor::F32(b)) => *a += b,
        (Tensor::F64(a), Tensor::F64(b)) => *a += b,
        (Tensor::I64(a), Tensor::I64(b)) => *a += b,
        (Tensor::I32(a), Tensor::I32(b)) => *a += b,
        (a, b) => {
            return Err(format!(
                "cannot add a {} tensor to a {} accumulator",
                b.dtype(),
                a.dtype()
            ))
        }
    }
    Ok(())
}

/// Widen every float32 tensor of `d` to float64 in place (`--precision f64`, `--accuracy`);
/// other dtypes stay as they are.
pub fn widen_f32(d: &mut Data) -> Result<(), String> {
    for t in d.values_mut() {
        if t.dtype() == DType::F32 {
            *t = t.cast(DType::F64).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Sum of all elements as f64.
pub fn sum_f64(t: &Tensor) -> f64 {
    t.to_f64().sum()
}

/// A 0-D tensor of `dtype` holding `v`.
pub fn scalar(dtype: DType, v: f64) -> Result<Tensor, String> {
    Tensor::F64(ndarray::arr0(v).into_dyn())
        .cast(dtype)
        .map_err(|e| e.to_string())
}

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Random data for every data input from `seed`: floats standard normal, integers uniform in
/// `[0, high)` (`[0, 2)` if `high` is not given), bools fair coins. Deterministic: the same seed
/// and inputs give the same data on every machine.
pub fn random_data(inputs: &[DataInput], seed: u64) -> Result<Data, String> {
    let mut out = Data::new();
    for (k, di) in inputs.iter().enumerate() {
        let dt = parse_dtype(&di.dtype)
            .ok_or_else(|| format!("data input '{}': unknown dtype '{}'", di.name, di.dtype))?;
        let shape = dims(di)?;
        let n: usize = shape.iter().product();
        let mut rng = Rng(seed ^ (k as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let hi = di.high.unwrap_or(2).max(1) as u64;
        let t = if dt.is_float() {
            let v: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
            Tensor::F64(
                ndarray::ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| e.to_string())?,
            )
        } else if dt == DType::Bool {
            let v: Vec<bool> = (0..n).map(|_| rng.next() & 1 == 1).collect();
            Tensor::Bool(
                ndarray::ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| e.to_string())?,
            )
        } else {
            let v: Vec<i64> = (0..n).map(|_| (rng.next() % hi) as i64).collect();
            Tensor::I64(
                ndarray::ArrayD::from_shape_vec(IxDyn(&shape), v).map_err(|e| e.to_string())?,
            )
        };
        let t = t
            .cast(dt)
            .map_err(|e| format!("data input '{}': {e}", di.name))?;
        out.insert(di.name.clone(), t);
    }
    Ok(out)
}

fn dims(di: &DataInput) -> Result<Vec<usize>, String> {
    di.shape
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .map_err(|_| format!("data input '{}': bad shape {:?}", di.name, di.shape))
        })
        .collect()
}

/// Check user-given data against the data inputs (every input present with its dtype and
/// global-batch shape; extra entries are ignored) and keep only the data inputs.
pub fn check_data(inputs: &[DataInput], mut given: Data) -> Result<Data, String> {
    let mut out = Data::new();
    for di in inputs {
        let t = given
            .remove(&di.name)
            .ok_or_else(|| format!("no array for data input '{}'", di.name))?;
        let want = parse_dtype(&di.dtype)
            .ok_or_else(|| format!("data input '{}': unknown dtype '{}'", di.name, di.dtype))?;
        if t.dtype() != want {
            return Err(format!(
                "array '{}' is {} but the data input is {want}",
                di.name,
                t.dtype()
            ));
        }
        if t.shape() != dims(di)?.as_slice() {
            return Err(format!(
                "array '{}' has shape {:?} but the data input has {:?} (the global batch)",
                di.name,
                t.shape(),
                di.shape
            ));
        }
        out.insert(di.name.clone(), t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_and_concat_round_trip() {
        let a =
            Tensor::I64(ndarray::ArrayD::from_shape_vec(IxDyn(&[4, 2]), (0..8).collect()).unwrap());
        let lo = slice_rows(&a, 0, 0, 1, 2).unwrap();
        let hi = slice_rows(&a, 0, 1, 2, 2).unwrap();
        assert_eq!(lo.to_i64_vec(), vec![0, 1, 2, 3]);
        assert_eq!(concat(&[lo, hi], 0).unwrap(), a);
        assert!(slice_rows(&a, 0, 0, 1, 3).is_err());
        // Along axis 1 (an RNN's batch axis).
        let left = slice_rows(&a, 1, 0, 1, 2).unwrap();
        let right = slice_rows(&a, 1, 1, 2, 2).unwrap();
        assert_eq!(left.to_i64_vec(), vec![0, 2, 4, 6]);
        assert_eq!(concat(&[left, right], 1).unwrap(), a);
        assert!(slice_rows(&a, 2, 0, 1, 2).is_err());
    }

    #[test]
    fn random_data_is_deterministic_and_in_range() {
        let di = vec![
            DataInput {
                name: "x".into(),
                dtype: "f32".into(),
                shape: vec![8, 3],
                batch_axis: Some(0),
                high: None,
            },
            DataInput {
                name: "ids".into(),
                dtype: "int64".into(),
                shape: vec![8],
                batch_axis: Some(0),
                high: Some(5),
            },
        ];
        let a = random_data(&di, 3).unwrap();
        assert_eq!(a, random_data(&di, 3).unwrap());
        assert_ne!(a, random_data(&di, 4).unwrap());
        assert!(a["ids"].to_i64_vec().iter().all(|v| (0..5).contains(v)));
        assert_eq!(a["x"].dtype(), DType::F32);
    }
}
