//! `.npz` files (a zip of `.npy` arrays) with arbitrary entry names (`input/input_ids`,
//! `grad/conv1.weight`). Supported dtypes: f32, f64, i64, i32, u8, bool.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use ndarray::ArrayD;
use ndarray_npy::{NpzReader, NpzWriter, ReadNpzError};
use pipec_compiler::ir::TensorData;
use std::fs::File;
use std::io::{Read, Seek};
use std::path::Path;

fn npz_err(path: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Npz {
        path: path.to_path_buf(),
        msg: msg.to_string(),
    }
}

/// Read one entry of an open npz, trying each supported dtype in turn.
fn read_entry<R: Read + Seek>(
    z: &mut NpzReader<R>,
    name: &str,
) -> std::result::Result<Tensor, String> {
    let mut errs: Vec<String> = Vec::new();
    macro_rules! attempt {
        ($t:ty) => {
            match z.by_name::<ndarray::OwnedRepr<$t>, ndarray::IxDyn>(name) {
                Ok(a) => return Ok(Tensor::from(a as ArrayD<$t>)),
                Err(e @ ReadNpzError::Zip(_)) => return Err(e.to_string()),
                Err(e) => errs.push(e.to_string()),
            }
        };
    }
    attempt!(f32);
    attempt!(f64);
    attempt!(i64);
    attempt!(i32);
    attempt!(u8);
    attempt!(bool);
    Err(format!(
        "entry '{name}': unsupported array ({})",
        errs.last().map(String::as_str).unwrap_or("")
    ))
}

/// Read every entry of an `.npz` file, in file order. Names have their `.npy` suffix stripped.
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let f = File::open(path).map_err(|e| npz_err(path, e))?;
    let mut z = NpzReader::new(f).map_err(|e| npz_err(path, e))?;
    let names = z.names().map_err(|e| npz_err(path, e))?;
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let t = read_entry(&mut z, &n).map_err(|e| npz_err(path, e))?;
        out.push((n, t));
    }
    Ok(out)
}

/// Read the entries of an `.npz` file whose names start with `prefix`, with the prefix removed
/// (`read_prefixed(p, "input/")` gives the graph inputs of a reference file).
pub fn read_prefixed(path: &Path, prefix: &str) -> Result<Vec<(String, Tensor)>> {
    Ok(read(path)?
        .into_iter()
        .filter_map(|(n, t)| n.strip_prefix(prefix).map(|s| (s.to_string(), t)))
        .collect())
}

/// Write tensors to an `.npz` file (uncompressed), in the given order.
pub fn write(path: &Path, entries: &[(String, Tensor)]) -> Result<()> {
    let f = File::create(path).map_err(|e| npz_err(path, e))?;
    write_to(f, entries, path)?;
    Ok(())
}

/// Read every entry as IR constant data ([`TensorData`]), in file order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, TensorData)>> {
    Ok(read(path)?
        .into_iter()
        .map(|(n, t)| (n, t.to_tensor_data()))
        .collect())
}

fn to_tensors(arrays: &[(String, TensorData)]) -> Result<Vec<(String, Tensor)>> {
    arrays
        .iter()
        .map(|(n, t)| Ok((n.clone(), Tensor::from_tensor_data(t)?)))
        .collect()
}

fn write_to<W: std::io::Write + Seek>(
    w: W,
    entries: &[(String, Tensor)],
    path: &Path,
) -> Result<W> {
    let mut z = NpzWriter::new(w);
    for (n, t) in entries {
        let r = match t {
            Tensor::F32(a) => z.add_array(n.as_str(), a),
            Tensor::F64(a) => z.add_array(n.as_str(), a),
            Tensor::I64(a) => z.add_array(n.as_str(), a),
            Tensor::I32(a) => z.add_array(n.as_str(), a),
            Tensor::U8(a) => z.add_array(n.as_str(), a),
            Tensor::Bool(a) => z.add_array(n.as_str(), a),
        };
        r.map_err(|e| npz_err(path, format!("entry '{n}': {e}")))?;
    }
    z.finish().map_err(|e| npz_err(path, e))
}

/// An `.npz` file's bytes for IR constant data (uncompressed), in the given order.
pub fn npz_bytes(arrays: &[(String, TensorData)]) -> Result<Vec<u8>> {
    let cursor = write_to(
        std::io::Cursor::new(Vec::new()),
        &to_tensors(arrays)?,
        Path::new("<memory>"),
    )?;
    Ok(cursor.into_inner())
}

/// Write IR constant data to an `.npz` file (uncompressed), in the given order.
pub fn write_npz(path: &Path, arrays: &[(String, TensorData)]) -> Result<()> {
    write(path, &to_tensors(arrays)?)
}
