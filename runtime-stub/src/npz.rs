//! Minimal `.npy` / `.npz` reading and writing (numpy's format, version 1–3 headers), enough for
//! the CLI's `--inputs IN.npz` and `-o OUT.npz` and for the reference data in `onnx-models/`.
//!
//! Only *stored* (uncompressed) zip entries are supported, which is what `np.savez` writes
//! (`np.savez_compressed` files are rejected with a message saying so). Zip64 extra fields, which
//! numpy always writes, are understood. Arrays must be little-endian and C-ordered.

use pipec_compiler::error::Error;
use pipec_compiler::ir::{DType, Payload, TensorData};
use pipec_compiler::Result;
use std::path::Path;

fn bad(path: &str, msg: impl std::fmt::Display) -> Error {
    Error::named(path, format!("not a valid npz: {msg}"))
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// numpy `descr` string of an element type.
pub fn descr(dt: DType) -> Option<&'static str> {
    Some(match dt {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "|i1",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
        _ => return None,
    })
}

fn from_descr(s: &str) -> Option<DType> {
    let s = s.replace('=', "<");
    [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ]
    .into_iter()
    .find(|d| {
        descr(*d) == Some(s.as_str()) || descr(*d).map(|x| x.replace('|', "<")) == Some(s.clone())
    })
}

/// Parse one `.npy` file's bytes.
pub fn parse_npy(b: &[u8], what: &str) -> Result<TensorData> {
    if b.get(..6) != Some(b"\x93NUMPY") {
        return Err(bad(what, "missing the NUMPY magic"));
    }
    let major = b.get(6).copied().ok_or_else(|| bad(what, "truncated"))?;
    let (hlen, hstart) = if major == 1 {
        (
            u16_at(b, 8).ok_or_else(|| bad(what, "truncated"))? as usize,
            10,
        )
    } else {
        (
            u32_at(b, 8).ok_or_else(|| bad(what, "truncated"))? as usize,
            12,
        )
    };
    let header = b
        .get(hstart..hstart + hlen)
        .ok_or_else(|| bad(what, "truncated header"))?;
    let header = std::str::from_utf8(header).map_err(|_| bad(what, "header is not text"))?;
    let field = |key: &str| -> Option<&str> {
        let i = header.find(&format!("'{key}'"))?;
        let rest = header[i + key.len() + 2..]
            .trim_start()
            .strip_prefix(':')?
            .trim_start();
        Some(rest)
    };
    let d = field("descr").ok_or_else(|| bad(what, "no descr"))?;
    let d = d
        .strip_prefix('\'')
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad(what, "bad descr"))?;
    let dt = from_descr(d).ok_or_else(|| bad(what, format!("unsupported dtype '{d}'")))?;
    if field("fortran_order").is_some_and(|f| f.starts_with("True")) {
        return Err(bad(what, "Fortran-ordered arrays are not supported"));
    }
    let sh = field("shape").ok_or_else(|| bad(what, "no shape"))?;
    let sh = sh
        .strip_prefix('(')
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad(what, "bad shape"))?;
    let dims: Vec<i64> = sh
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<i64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| bad(what, "bad shape"))?;
    let data = &b[hstart + hlen..];
    let n = pipec_compiler::ir::numel(&dims).ok_or_else(|| bad(what, "bad shape"))?;
    let want = dt.bytes_for(n).ok_or_else(|| bad(what, "too large"))? as usize;
    let raw = data
        .get(..want)
        .ok_or_else(|| bad(what, "truncated data"))?;
    TensorData::from_raw(dt, dims, bytes::Bytes::copy_from_slice(raw))
}

/// Serialize a tensor as `.npy` (version 1.0 header).
pub fn to_npy(t: &TensorData) -> Result<Vec<u8>> {
    let d = descr(t.dtype)
        .ok_or_else(|| Error::msg(format!("cannot write element type {} to npy", t.dtype)))?;
    let shape = match t.dims.len() {
        0 => "()".to_string(),
        1 => format!("({},)", t.dims[0]),
        _ => format!(
            "({})",
            t.dims
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut h = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    let total = 10 + h.len() + 1;
    h.push_str(&" ".repeat((64 - total % 64) % 64));
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(h.as_bytes());
    match &t.payload {
        Payload::Raw(r) => out.extend_from_slice(r),
        _ => return Err(Error::msg("cannot write a tensor without data to npy")),
    }
    Ok(out)
}

/// Read every array of an `.npz` file, keyed by entry name without `.npy`, in file order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, TensorData)>> {
    let what = path.display().to_string();
    let b = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    // End of central directory: scan back for its signature.
    let eocd = (0..b.len().saturating_sub(21))
        .rev()
        .find(|&i| u32_at(&b, i) == Some(0x0605_4b50))
        .ok_or_else(|| bad(&what, "no zip end-of-central-directory record"))?;
    let count = u16_at(&b, eocd + 10).ok_or_else(|| bad(&what, "truncated"))? as usize;
    let mut off = u32_at(&b, eocd + 16).ok_or_else(|| bad(&what, "truncated"))? as u64;
    if off == 0xFFFF_FFFF {
        // Zip64 end of central directory locator, just before the EOCD.
        let loc = eocd
            .checked_sub(20)
            .ok_or_else(|| bad(&what, "bad zip64 locator"))?;
        let rec = u64_at(&b, loc + 8).ok_or_else(|| bad(&what, "bad zip64 locator"))? as usize;
        off = u64_at(&b, rec + 48).ok_or_else(|| bad(&what, "bad zip64 record"))?;
    }
    let mut p = off as usize;
    let mut out = Vec::new();
    for _ in 0..count {
        if u32_at(&b, p) != Some(0x0201_4b50) {
            return Err(bad(&what, "bad central directory entry"));
        }
        let t = |o: usize| u32_at(&b, p + o).ok_or_else(|| bad(&what, "truncated"));
        let method = u16_at(&b, p + 10).ok_or_else(|| bad(&what, "truncated"))?;
        let mut csize = t(20)? as u64;
        let mut usize_ = t(24)? as u64;
        let nlen = u16_at(&b, p + 28).ok_or_else(|| bad(&what, "truncated"))? as usize;
        let elen = u16_at(&b, p + 30).ok_or_else(|| bad(&what, "truncated"))? as usize;
        let clen = u16_at(&b, p + 32).ok_or_else(|| bad(&what, "truncated"))? as usize;
        let mut loff = t(42)? as u64;
        let name = b
            .get(p + 46..p + 46 + nlen)
            .ok_or_else(|| bad(&what, "truncated"))?;
        let name = String::from_utf8_lossy(name).into_owned();
        // Zip64 extra field: the sizes/offset that are 0xFFFFFFFF in the header, in order.
        let extra = b
            .get(p + 46 + nlen..p + 46 + nlen + elen)
            .ok_or_else(|| bad(&what, "truncated"))?;
        let mut e = 0;
        while e + 4 <= extra.len() {
            let id = u16_at(extra, e).unwrap_or(0);
            let sz = u16_at(extra, e + 2).unwrap_or(0) as usize;
            if id == 1 {
                let mut q = e + 4;
                if usize_ == 0xFFFF_FFFF {
                    usize_ = u64_at(extra, q).ok_or_else(|| bad(&what, "bad zip64 extra"))?;
                    q += 8;
                }
                if csize == 0xFFFF_FFFF {
                    csize = u64_at(extra, q).ok_or_else(|| bad(&what, "bad zip64 extra"))?;
                    q += 8;
                }
                if loff == 0xFFFF_FFFF {
                    loff = u64_at(extra, q).ok_or_else(|| bad(&what, "bad zip64 extra"))?;
                }
            }
            e += 4 + sz;
        }
        if method != 0 {
            return Err(bad(
                &what,
                format!(
                    "entry '{name}' is compressed; write it with np.savez, not np.savez_compressed"
                ),
            ));
        }
        let lo = loff as usize;
        if u32_at(&b, lo) != Some(0x0403_4b50) {
            return Err(bad(&what, "bad local header"));
        }
        let ln = u16_at(&b, lo + 26).ok_or_else(|| bad(&what, "truncated"))? as usize;
        let le = u16_at(&b, lo + 28).ok_or_else(|| bad(&what, "truncated"))? as usize;
        let start = lo + 30 + ln + le;
        let data = b
            .get(start..start + csize as usize)
            .ok_or_else(|| bad(&what, format!("entry '{name}' is truncated")))?;
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        out.push((key.clone(), parse_npy(data, &format!("{what}:{key}"))?));
        p += 46 + nlen + elen + clen;
    }
    Ok(out)
}

fn crc32(data: &[u8]) -> u32 {
    let mut table = [0u32; 256];
    for (i, t) in table.iter_mut().enumerate() {
        let mut c = i as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
        *t = c;
    }
    let mut c = 0xFFFF_FFFFu32;
    for &x in data {
        c = table[((c ^ x as u32) & 0xFF) as usize] ^ (c >> 8);
    }
    c ^ 0xFFFF_FFFF
}

/// Serialize arrays as an `.npz` (stored zip, entries `KEY.npy`).
pub fn npz_bytes(arrays: &[(String, TensorData)]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (key, t) in arrays {
        let data = to_npy(t)?;
        let name = format!("{key}.npy");
        let (off, size) = (out.len(), data.len());
        if off > u32::MAX as usize / 2 || size > u32::MAX as usize / 2 {
            return Err(Error::msg("npz output larger than 2 GiB is not supported"));
        }
        let crc = crc32(&data);
        let mut hdr = Vec::new();
        hdr.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        hdr.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]); // version, flags, method, time, date
        hdr.extend_from_slice(&crc.to_le_bytes());
        hdr.extend_from_slice(&(size as u32).to_le_bytes());
        hdr.extend_from_slice(&(size as u32).to_le_bytes());
        hdr.extend_from_slice(&(name.len() as u16).to_le_bytes());
        hdr.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&hdr);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0x21, 0]);
        central.extend_from_slice(&crc.to_le_bytes());
        central.extend_from_slice(&(size as u32).to_le_bytes());
        central.extend_from_slice(&(size as u32).to_le_bytes());
        central.extend_from_slice(&(name.len() as u16).to_le_bytes());
        central.extend_from_slice(&[0; 12]); // extra, comment, disk, int attr, ext attr (4)
        central.extend_from_slice(&(off as u32).to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let cd_off = out.len();
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&(arrays.len() as u16).to_le_bytes());
    out.extend_from_slice(&(arrays.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&(cd_off as u32).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    Ok(out)
}

/// Write arrays to an `.npz` file.
pub fn write_npz(path: &Path, arrays: &[(String, TensorData)]) -> Result<()> {
    std::fs::write(path, npz_bytes(arrays)?).map_err(|e| Error::io(path, e))
}
