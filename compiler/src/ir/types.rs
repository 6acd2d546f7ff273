//! Tensor types: element types (`DType`), dimensions (`Dim`, static or symbolic) and `TensorType`.

use std::fmt;

/// Element type of a tensor. Discriminants are the ONNX `TensorProto.DataType` codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum DType {
    F32 = 1,
    U8 = 2,
    I8 = 3,
    U16 = 4,
    I16 = 5,
    I32 = 6,
    I64 = 7,
    String = 8,
    Bool = 9,
    F16 = 10,
    F64 = 11,
    U32 = 12,
    U64 = 13,
    Complex64 = 14,
    Complex128 = 15,
    BF16 = 16,
    F8E4M3FN = 17,
    F8E4M3FNUZ = 18,
    F8E5M2 = 19,
    F8E5M2FNUZ = 20,
    U4 = 21,
    I4 = 22,
}

impl DType {
    /// All element types, in ONNX code order.
    pub const ALL: [DType; 22] = [
        DType::F32,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::String,
        DType::Bool,
        DType::F16,
        DType::F64,
        DType::U32,
        DType::U64,
        DType::Complex64,
        DType::Complex128,
        DType::BF16,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::U4,
        DType::I4,
    ];

    /// From an ONNX `TensorProto.DataType` code.
    pub fn from_onnx(code: i32) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| *d as i32 == code)
    }

    /// The ONNX `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        self as i32
    }

    /// Size of one element in bits (strings: 0, they have no fixed size).
    pub fn bits(self) -> u64 {
        use DType::*;
        match self {
            U4 | I4 => 4,
            Bool | U8 | I8 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ => 8,
            U16 | I16 | F16 | BF16 => 16,
            F32 | I32 | U32 => 32,
            F64 | I64 | U64 | Complex64 => 64,
            Complex128 => 128,
            String => 0,
        }
    }

    /// Bytes taken by `n` packed elements (sub-byte types round up).
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        n.checked_mul(self.bits()).map(|b| b.div_ceil(8))
    }

    /// True for the floating-point types (the ones that carry gradients).
    pub fn is_float(self) -> bool {
        use DType::*;
        matches!(
            self,
            F32 | F16 | BF16 | F64 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ
        )
    }

    /// True for the integer types (not bool).
    pub fn is_int(self) -> bool {
        use DType::*;
        matches!(self, U8 | I8 | U16 | I16 | I32 | I64 | U32 | U64 | U4 | I4)
    }

    /// Name of the element type in MLIR's builtin syntax.
    pub fn mlir_name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "f32",
            U8 => "ui8",
            I8 => "si8",
            U16 => "ui16",
            I16 => "si16",
            I32 => "si32",
            I64 => "si64",
            String => "!onnx.string",
            Bool => "i1",
            F16 => "f16",
            F64 => "f64",
            U32 => "ui32",
            U64 => "ui64",
            Complex64 => "complex<f32>",
            Complex128 => "complex<f64>",
            BF16 => "bf16",
            F8E4M3FN => "f8E4M3FN",
            F8E4M3FNUZ => "f8E4M3FNUZ",
            F8E5M2 => "f8E5M2",
            F8E5M2FNUZ => "f8E5M2FNUZ",
            U4 => "ui4",
            I4 => "si4",
        }
    }

    /// Parse an MLIR element type name as printed by [`DType::mlir_name`].
    pub fn from_mlir_name(s: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.mlir_name() == s)
    }

    /// Short lowercase name used in JSON and messages (`float32`, `int64`, ...), as numpy names them.
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "float32",
            U8 => "uint8",
            I8 => "int8",
            U16 => "uint16",
            I16 => "int16",
            I32 => "int32",
            I64 => "int64",
            String => "string",
            Bool => "bool",
            F16 => "float16",
            F64 => "float64",
            U32 => "uint32",
            U64 => "uint64",
            Complex64 => "complex64",
            Complex128 => "complex128",
            BF16 => "bfloat16",
            F8E4M3FN => "float8e4m3fn",
            F8E4M3FNUZ => "float8e4m3fnuz",
            F8E5M2 => "float8e5m2",
            F8E5M2FNUZ => "float8e5m2fnuz",
            U4 => "uint4",
            I4 => "int4",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A symbolic dimension: `coeff * s1 * s2 * ...` with the symbol names sorted.
/// Products are what shape arithmetic in real exports produces (`batch*seq` after a flatten).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SymDim {
    pub coeff: i64,
    pub syms: Vec<String>,
}

/// One dimension of a tensor shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A known size.
    Known(i64),
    /// A symbolic size (`batch`, `2*batch`, `batch*seq`).
    Sym(SymDim),
}

impl Dim {
    /// A single named symbol.
    pub fn sym(name: impl Into<String>) -> Dim {
        Dim::Sym(SymDim {
            coeff: 1,
            syms: vec![name.into()],
        })
    }

    /// The static size, if known.
    pub fn known(&self) -> Option<i64> {
        match self {
            Dim::Known(v) => Some(*v),
            Dim::Sym(_) => None,
        }
    }

    /// Product of two dims; `None` on i64 overflow.
    pub fn mul(&self, other: &Dim) -> Option<Dim> {
        let (c1, s1) = self.parts();
        let (c2, s2) = other.parts();
        let coeff = c1.checked_mul(c2)?;
        let mut syms: Vec<String> = s1.iter().chain(s2.iter()).cloned().collect();
        syms.sort();
        Some(Dim::from_parts(coeff, syms))
    }

    /// Exact division `self / other`, if it is a product of the same form.
    pub fn div(&self, other: &Dim) -> Option<Dim> {
        let (c1, s1) = self.parts();
        let (c2, s2) = other.parts();
        if c2 == 0 || c1 % c2 != 0 {
            return None;
        }
        let mut rest = s1.to_vec();
        for s in s2 {
            let pos = rest.iter().position(|r| r == s)?;
            rest.remove(pos);
        }
        Some(Dim::from_parts(c1 / c2, rest))
    }

    fn parts(&self) -> (i64, &[String]) {
        match self {
            Dim::Known(v) => (*v, &[]),
            Dim::Sym(s) => (s.coeff, &s.syms),
        }
    }

    fn from_parts(coeff: i64, syms: Vec<String>) -> Dim {
        if syms.is_empty() || coeff == 0 {
            Dim::Known(coeff)
        } else {
            Dim::Sym(SymDim { coeff, syms })
        }
    }

    /// Parse the text form written by `Display` (`3`, `batch`, `2*batch*seq`).
    pub fn parse(s: &str) -> Option<Dim> {
        if let Ok(v) = s.parse::<i64>() {
            return Some(Dim::Known(v));
        }
        let mut coeff = 1i64;
        let mut syms = Vec::new();
        for part in s.split('*') {
            if part.is_empty() {
                return None;
            }
            if let Ok(v) = part.parse::<i64>() {
                coeff = coeff.checked_mul(v)?;
            } else {
                syms.push(part.to_string());
            }
        }
        syms.sort();
        Some(Dim::from_parts(coeff, syms))
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(v) => write!(f, "{v}"),
            Dim::Sym(s) => {
                if s.coeff != 1 {
                    write!(f, "{}*", s.coeff)?;
                }
                f.write_str(&s.syms.join("*"))
            }
        }
    }
}

/// Type of an SSA value: element type and shape (`None` = rank unknown).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Option<Vec<Dim>>,
}

impl TensorType {
    /// Ranked type with the given dims.
    pub fn new(dtype: DType, shape: Vec<Dim>) -> Self {
        TensorType {
            dtype,
            shape: Some(shape),
        }
    }
    /// Ranked type with static dims.
    pub fn known(dtype: DType, dims: &[i64]) -> Self {
        TensorType::new(dtype, dims.iter().map(|d| Dim::Known(*d)).collect())
    }
    /// Unranked type.
    pub fn unranked(dtype: DType) -> Self {
        TensorType { dtype, shape: None }
    }
    /// Rank, if known.
    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(|s| s.len())
    }
    /// Static dims, if every dim is known.
    pub fn static_dims(&self) -> Option<Vec<i64>> {
        self.shape.as_ref()?.iter().map(|d| d.known()).collect()
    }
    /// Number of elements, if static (`None` also on overflow).
    pub fn num_elements(&self) -> Option<u64> {
        let dims = self.static_dims()?;
        dims.iter()
            .try_fold(1u64, |acc, d| acc.checked_mul(u64::try_from(*d).ok()?))
    }
}

/// Human-readable type, e.g. `float32[batch,3,224,224]` (used in messages and `inspect`).
pub fn fmt_type(t: &TensorType) -> String {
    match &t.shape {
        None => format!("{}[*]", t.dtype),
        Some(s) => format!(
            "{}[{}]",
            t.dtype,
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}
