//! Constant tensor data (initializers, `Constant` values, tensor attributes).
//!
//! Data is kept as little-endian packed bytes in a [`bytes::Bytes`], so an initializer imported from
//! a memory-mapped file shares the mapping: a weight is never copied after import.

use super::types::DType;
use crate::error::{Error, Result};
use bytes::Bytes;

/// Payload of a constant tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// Packed little-endian elements (`dtype.bytes_for(numel)` bytes).
    Raw(Bytes),
    /// One byte string per element (`DType::String`).
    Strings(Vec<Bytes>),
    /// Data not present: the tensor came from textual IR that printed it as
    /// `dense_resource<KEY>` without the blob. Shapes and types are still known.
    Elided(String),
}

/// A constant tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorData {
    pub dtype: DType,
    pub dims: Vec<i64>,
    pub payload: Payload,
}

impl TensorData {
    /// Number of elements (checked: dims are non-negative and their product fits in u64).
    pub fn numel(&self) -> Option<u64> {
        numel(&self.dims)
    }

    /// Raw bytes, if not a string tensor.
    pub fn raw(&self) -> Option<&Bytes> {
        match &self.payload {
            Payload::Raw(b) => Some(b),
            Payload::Strings(_) | Payload::Elided(_) => None,
        }
    }

    /// Byte size of the payload.
    pub fn byte_len(&self) -> usize {
        match &self.payload {
            Payload::Raw(b) => b.len(),
            Payload::Strings(s) => s.iter().map(|b| b.len()).sum(),
            Payload::Elided(_) => 0,
        }
    }

    /// A tensor from raw bytes, checking that the length matches the dims.
    pub fn from_raw(dtype: DType, dims: Vec<i64>, raw: Bytes) -> Result<Self> {
        let n = numel(&dims).ok_or_else(|| Error::msg(format!("bad tensor dims {dims:?}")))?;
        let want = dtype
            .bytes_for(n)
            .ok_or_else(|| Error::msg(format!("tensor of {n} elements is too large")))?;
        if want != raw.len() as u64 {
            return Err(Error::msg(format!(
                "tensor data has {} bytes but {dtype} {dims:?} needs {want}",
                raw.len()
            )));
        }
        Ok(TensorData {
            dtype,
            dims,
            payload: Payload::Raw(raw),
        })
    }

    /// A tensor of i64 values.
    pub fn from_i64(dims: Vec<i64>, vals: &[i64]) -> Self {
        let mut b = Vec::with_capacity(vals.len() * 8);
        for v in vals {
            b.extend_from_slice(&v.to_le_bytes());
        }
        TensorData {
            dtype: DType::I64,
            dims,
            payload: Payload::Raw(Bytes::from(b)),
        }
    }

    /// A tensor of f32 values.
    pub fn from_f32(dims: Vec<i64>, vals: &[f32]) -> Self {
        let mut b = Vec::with_capacity(vals.len() * 4);
        for v in vals {
            b.extend_from_slice(&v.to_le_bytes());
        }
        TensorData {
            dtype: DType::F32,
            dims,
            payload: Payload::Raw(Bytes::from(b)),
        }
    }

    /// The elements converted to i64, for integer and bool tensors (shape arithmetic).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        let raw = self.raw()?;
        let b = &raw[..];
        Some(match self.dtype {
            DType::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
                .collect(),
            DType::U32 => b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as i64)
                .collect(),
            DType::I16 => b
                .chunks_exact(2)
                .map(|c| i16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            DType::U16 => b
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as i64)
                .collect(),
            DType::I8 => b.iter().map(|x| *x as i8 as i64).collect(),
            DType::U8 | DType::Bool => b.iter().map(|x| *x as i64).collect(),
            DType::U64 => b
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as i64)
                .collect(),
            _ => return None,
        })
    }

    /// The elements converted to f64, for numeric tensors.
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        let raw = self.raw()?;
        let b = &raw[..];
        Some(match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap_or([0; 4])) as f64)
                .collect(),
            DType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            _ => self.to_i64_vec()?.into_iter().map(|v| v as f64).collect(),
        })
    }
}

/// Checked element count of a shape: `None` if a dim is negative or the product overflows.
pub fn numel(dims: &[i64]) -> Option<u64> {
    dims.iter()
        .try_fold(1u64, |acc, d| acc.checked_mul(u64::try_from(*d).ok()?))
}

/// An attribute value of an op (ONNX `AttributeProto`, plus pipec annotations).
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Float(f32),
    Int(i64),
    String(String),
    Tensor(TensorData),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<String>),
    /// A subgraph (`Loop`'s body, `If`'s branches).
    Graph(Subgraph),
}

/// A subgraph attribute. ONNX subgraphs read values of enclosing graphs by name (lexical
/// scoping); here those reads are explicit: `graph.inputs` are the `formal` ONNX inputs followed
/// by one input per captured outer value, named like it, and the op carrying the subgraph lists
/// the captured outer values as extra operands after its ONNX operands (their number in the
/// `pipec.captures` attribute), so use lists, dead-code elimination and the topological order
/// see the dependency. The exporter writes the ONNX form back (formal inputs, ONNX operands).
#[derive(Clone, Debug)]
pub struct Subgraph {
    pub graph: std::sync::Arc<super::Graph>,
    /// Number of ONNX (formal) inputs; the rest of `graph.inputs` are captured values.
    pub formal: usize,
    /// For each captured input (`graph.inputs[formal + j]`), the index of the outer operand it
    /// reads among the op's captured operands (several subgraphs of one op share them).
    pub captured: Vec<usize>,
}

impl PartialEq for Subgraph {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.graph, &other.graph)
            && self.formal == other.formal
            && self.captured == other.captured
    }
}

/// Name of the attribute that counts an op's captured operands (see [`Subgraph`]).
pub const CAPTURES_ATTR: &str = "pipec.captures";

impl Attr {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int(v) => Some(*v),
            _ => None,
        }
    }
    pub fn as_float(&self) -> Option<f32> {
        match self {
            Attr::Float(v) => Some(*v),
            Attr::Int(v) => Some(*v as f32),
            _ => None,
        }
    }
    pub fn as_ints(&self) -> Option<&[i64]> {
        match self {
            Attr::Ints(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attr::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_tensor(&self) -> Option<&TensorData> {
        match self {
            Attr::Tensor(t) => Some(t),
            _ => None,
        }
    }
    pub fn as_graph(&self) -> Option<&Subgraph> {
        match self {
            Attr::Graph(g) => Some(g),
            _ => None,
        }
    }
}
