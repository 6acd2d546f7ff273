//! Recursive-descent parser for the format described in the module docs.

use super::lexer::{Lexer, Num, NumKind};
use super::ESC;
use crate::error::{Error, Result};
use crate::ir::{
    numel, Attr, DType, Dim, Graph, Module, OpData, Payload, SymDim, TensorData, TensorType, Value,
    ValueData, ValueDef,
};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A type as printed, for messages.
fn type_text(t: &TensorType) -> String {
    let mut s = String::new();
    super::printer::fmt_type(&mut s, t);
    s
}

/// Deepest nesting of attribute lists / dense literals accepted.
const MAX_DEPTH: usize = 64;
/// Largest tensor a splat literal may expand to (elements).
const MAX_SPLAT: u64 = 1 << 24;

/// Parse a module.
pub(crate) fn parse_module(src: &str, file: &str) -> Result<Module> {
    let mut p = Parser {
        lx: Lexer::new(src, file),
        m: Module::default(),
        scope: HashMap::new(),
    };
    p.top()?;
    Ok(p.m)
}

/// A parsed attribute value, before it is given a meaning by where it appears.
#[derive(Clone, Debug)]
enum AV<'a> {
    Str(Vec<u8>),
    /// A number with its optional `: type`.
    Num(Num<'a>, Option<&'a str>),
    Bool(bool),
    List(Vec<(usize, AV<'a>)>),
    Dict,
    /// `array<ty: ...>`
    Array(&'a str, Vec<Num<'a>>),
    Tensor(TensorData),
}

/// An element of a `dense<...>` literal.
#[derive(Clone, Debug)]
enum Elem<'a> {
    Num(Num<'a>),
    Bool(bool, usize),
    Str(Vec<u8>, usize),
    Complex(Num<'a>, Num<'a>),
    List(Vec<Elem<'a>>, usize),
}

struct Parser<'a> {
    lx: Lexer<'a>,
    m: Module,
    /// SSA name -> the values it defines (more than one for `%x:2` groups).
    scope: HashMap<&'a str, Vec<Value>>,
}

fn utf8(b: Vec<u8>, lx: &Lexer, pos: usize) -> Result<String> {
    String::from_utf8(b).map_err(|_| lx.err_at(pos, "string is not valid UTF-8"))
}

impl<'a> Parser<'a> {
    fn top(&mut self) -> Result<()> {
        if self.lx.eat_keyword("module") {
            if self.lx.peek() == Some(b'@') {
                self.symbol()?;
            }
            if self.lx.eat_keyword("attributes") {
                let d = self.dict()?;
                self.module_attrs(d)?;
            }
            self.lx.expect("{")?;
            self.func()?;
            self.lx.expect("}")?;
        } else if self.lx.eat_keyword("func.func") {
            self.func_after_keyword()?;
        } else {
            return Err(self.lx.err("expected 'module'"));
        }
        if self.lx.eat("{-#") {
            self.resources()?;
        }
        if !self.lx.at_end() {
            return Err(self.lx.err("expected end of input"));
        }
        Ok(())
    }

    /// `@name` or `@"name"`.
    fn symbol(&mut self) -> Result<String> {
        self.lx.expect("@")?;
        if self.lx.peek_raw() == Some(b'"') {
            let pos = self.lx.pos;
            let b = self.lx.string()?;
            return utf8(b, &self.lx, pos);
        }
        let start = self.lx.pos;
        let s = self
            .lx
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.' | b'-'));
        if s.is_empty() {
            return Err(self.lx.err_at(start, "expected a symbol name after '@'"));
        }
        Ok(s.to_string())
    }

    /// `{key = value, ...}`: entries with their positions.
    fn dict(&mut self) -> Result<Vec<(String, usize, AV<'a>)>> {
        self.lx.expect("{")?;
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        if self.lx.eat("}") {
            return Ok(out);
        }
        loop {
            self.lx.skip_ws();
            let pos = self.lx.pos;
            let key = if self.lx.peek() == Some(b'"') {
                let b = self.lx.string()?;
                utf8(b, &self.lx, pos)?
            } else {
                match self.lx.ident() {
                    Some(k) => k.to_string(),
                    None => return Err(self.lx.err("expected an attribute name")),
                }
            };
            if !self.lx.eat("=") {
                return Err(self
                    .lx
                    .err(format!("expected '=' after attribute name '{key}'")));
            }
            self.lx.skip_ws();
            let vpos = self.lx.pos;
            let v = self.attr(0)?;
            if !seen.insert(key.clone()) {
                return Err(self.lx.err_at(pos, format!("duplicate attribute '{key}'")));
            }
            out.push((key, vpos, v));
            if self.lx.eat("}") {
                return Ok(out);
            }
            self.lx.expect(",")?;
        }
    }

    /// An attribute value.
    fn attr(&mut self, depth: usize) -> Result<AV<'a>> {
        if depth > MAX_DEPTH {
            return Err(self.lx.err("attribute nested too deeply"));
        }
        match self.lx.peek() {
            Some(b'"') => return Ok(AV::Str(self.lx.string()?)),
            Some(b'[') => {
                self.lx.expect("[")?;
                let mut items = Vec::new();
                if self.lx.eat("]") {
                    return Ok(AV::List(items));
                }
                loop {
                    self.lx.skip_ws();
                    let pos = self.lx.pos;
                    items.push((pos, self.attr(depth + 1)?));
                    if self.lx.eat("]") {
                        return Ok(AV::List(items));
                    }
                    self.lx.expect(",")?;
                }
            }
            Some(b'{') => {
                if depth > 0 {
                    return Err(self.lx.err("nested dictionaries are not supported"));
                }
                self.dict()?;
                return Ok(AV::Dict);
            }
            _ => {}
        }
        if self.lx.at_number() {
            let n = self.lx.number()?;
            let ty = if self.lx.eat(":") {
                match self.lx.ident() {
                    Some(t) => Some(t),
                    None => return Err(self.lx.err("expected a type after ':'")),
                }
            } else {
                None
            };
            return Ok(AV::Num(n, ty));
        }
        let pos = self.lx.pos;
        match self.lx.ident() {
            Some("true") => Ok(AV::Bool(true)),
            Some("false") => Ok(AV::Bool(false)),
            Some("array") => {
                self.lx.expect_raw("<")?;
                let ty = match self.lx.ident() {
                    Some(t) => t,
                    None => return Err(self.lx.err("expected an element type")),
                };
                let mut items = Vec::new();
                if self.lx.eat(":") {
                    loop {
                        items.push(self.lx.number()?);
                        if !self.lx.eat(",") {
                            break;
                        }
                    }
                }
                self.lx.expect(">")?;
                Ok(AV::Array(ty, items))
            }
            Some("dense") => {
                self.lx.expect_raw("<")?;
                let lit = if self.lx.eat(">") {
                    None
                } else {
                    let e = self.elem(0)?;
                    self.lx.expect(">")?;
                    Some(e)
                };
                self.lx.expect(":")?;
                let tpos = self.lx.pos;
                let ty = self.tensor_type()?;
                let t = self.dense(lit, ty, tpos)?;
                Ok(AV::Tensor(t))
            }
            Some("dense_resource") => {
                self.lx.expect_raw("<")?;
                let key = match self.lx.ident() {
                    Some(k) => k.to_string(),
                    None => return Err(self.lx.err("expected a resource key")),
                };
                self.lx.expect(">")?;
                self.lx.expect(":")?;
                let tpos = self.lx.pos;
                let ty = self.tensor_type()?;
                let dims = self.static_dims(&ty, tpos)?;
                Ok(AV::Tensor(TensorData {
                    dtype: ty.dtype,
                    dims,
                    payload: Payload::Elided(key),
                }))
            }
            Some(other) => Err(self
                .lx
                .err_at(pos, format!("expected an attribute value, found '{other}'"))),
            None => Err(self.lx.err("expected an attribute value")),
        }
    }

    /// An element of a dense literal.
    fn elem(&mut self, depth: usize) -> Result<Elem<'a>> {
        if depth > MAX_DEPTH {
            return Err(self.lx.err("dense literal nested too deeply"));
        }
        self.lx.skip_ws();
        let pos = self.lx.pos;
        match self.lx.peek() {
            Some(b'[') => {
                self.lx.expect("[")?;
                let mut items = Vec::new();
                if self.lx.eat("]") {
                    return Ok(Elem::List(items, pos));
                }
                loop {
                    items.push(self.elem(depth + 1)?);
                    if self.lx.eat("]") {
                        return Ok(Elem::List(items, pos));
                    }
                    self.lx.expect(",")?;
                }
            }
            Some(b'(') => {
                self.lx.expect("(")?;
                let re = self.lx.number()?;
                self.lx.expect(",")?;
                let im = self.lx.number()?;
                self.lx.expect(")")?;
                Ok(Elem::Complex(re, im))
            }
            Some(b'"') => Ok(Elem::Str(self.lx.string()?, pos)),
            _ => {
                if self.lx.eat_keyword("true") {
                    Ok(Elem::Bool(true, pos))
                } else if self.lx.eat_keyword("false") {
                    Ok(Elem::Bool(false, pos))
                } else {
                    Ok(Elem::Num(self.lx.number()?))
                }
            }
        }
    }

    /// The static dims of a tensor literal's type.
    fn static_dims(&self, ty: &TensorType, pos: usize) -> Result<Vec<i64>> {
        ty.static_dims()
            .ok_or_else(|| self.lx.err_at(pos, "a tensor literal needs a static shape"))
    }

    /// Build tensor data from a dense literal.
    fn dense(&self, lit: Option<Elem<'a>>, ty: TensorType, tpos: usize) -> Result<TensorData> {
        let dims = self.static_dims(&ty, tpos)?;
        let n = numel(&dims).ok_or_else(|| self.lx.err_at(tpos, "bad tensor shape"))?;
        if let Some(Elem::Str(b, pos)) = &lit {
            if ty.dtype != DType::String {
                return self.dense_hex(b, *pos, ty.dtype, dims, n);
            }
        }
        let mut flat: Vec<&Elem<'a>> = Vec::new();
        match &lit {
            None => {
                if n != 0 {
                    return Err(self.lx.err_at(
                        tpos,
                        format!("empty dense literal for a tensor of {n} elements"),
                    ));
                }
            }
            Some(e @ Elem::List(..)) => self.flatten(e, &dims, 0, &mut flat)?,
            Some(e) => {
                if n > MAX_SPLAT {
                    return Err(self.lx.err_at(tpos, "splat literal too large"));
                }
                flat = vec![e; n as usize];
            }
        }
        let dtype = ty.dtype;
        if dtype == DType::String {
            let mut out = Vec::with_capacity(flat.len());
            for e in flat {
                match e {
                    Elem::Str(b, _) => out.push(Bytes::from(b.clone())),
                    _ => return Err(self.elem_err(e, "expected a string element")),
                }
            }
            return Ok(TensorData {
                dtype,
                dims,
                payload: Payload::Strings(out),
            });
        }
        let mut raw: Vec<u8> = Vec::new();
        for (i, e) in flat.iter().enumerate() {
            self.encode_elem(&mut raw, dtype, e, i)?;
        }
        TensorData::from_raw(dtype, dims, Bytes::from(raw))
            .map_err(|e| self.lx.err_at(tpos, e.to_string()))
    }

    /// `dense<"0xHEX">`, as mlir-opt prints large literals: the raw little-endian elements
    /// (MLIR's storage: one byte per 4-bit element, i1 one byte each or packed in bits), or one
    /// element for a splat.
    fn dense_hex(
        &self,
        hex: &[u8],
        pos: usize,
        dtype: DType,
        dims: Vec<i64>,
        n: u64,
    ) -> Result<TensorData> {
        let bad = || {
            self.lx
                .err_at(pos, "expected a hex string \"0x...\" of tensor data")
        };
        let h = hex.strip_prefix(b"0x").ok_or_else(bad)?;
        if h.len() % 2 != 0 {
            return Err(bad());
        }
        let d = |c: u8| (c as char).to_digit(16).map(|v| v as u8);
        let bytes: Vec<u8> = h
            .chunks_exact(2)
            .map(|p| Some(d(p[0])? * 16 + d(p[1])?))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        // Bytes per element in MLIR's storage.
        let elem_bytes = (dtype.bits() as usize).div_ceil(8).max(1);
        let want = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(elem_bytes))
            .ok_or_else(|| self.lx.err_at(pos, "tensor too large"))?;
        let packed_bools = dtype == DType::Bool && bytes.len() as u64 == n.div_ceil(8);
        let full = if bytes.len() == want {
            bytes
        } else if packed_bools {
            // i1 data packed 8 to a byte, least significant bit first.
            (0..want).map(|i| (bytes[i / 8] >> (i % 8)) & 1).collect()
        } else if bytes.len() == elem_bytes && n <= MAX_SPLAT {
            bytes.repeat(n as usize)
        } else {
            return Err(self.lx.err_at(
                pos,
                format!(
                    "hex data has {} bytes but {dtype} {dims:?} needs {want}",
                    bytes.len()
                ),
            ));
        };
        let raw = match dtype {
            DType::Bool => full.iter().map(|b| (*b != 0) as u8).collect(),
            DType::I4 | DType::U4 => {
                let mut out = vec![0u8; full.len().div_ceil(2)];
                for (i, b) in full.iter().enumerate() {
                    out[i / 2] |= (b & 0xf) << (4 * (i & 1));
                }
                out
            }
            _ => full,
        };
        TensorData::from_raw(dtype, dims, Bytes::from(raw))
            .map_err(|e| self.lx.err_at(pos, e.to_string()))
    }

    fn elem_pos(e: &Elem) -> usize {
        match e {
            Elem::Num(n) => n.pos,
            Elem::Bool(_, p) | Elem::Str(_, p) | Elem::List(_, p) => *p,
            Elem::Complex(n, _) => n.pos,
        }
    }

    fn elem_err(&self, e: &Elem, msg: &str) -> Error {
        self.lx.err_at(Self::elem_pos(e), msg)
    }

    fn flatten<'e>(
        &self,
        e: &'e Elem<'a>,
        dims: &[i64],
        level: usize,
        out: &mut Vec<&'e Elem<'a>>,
    ) -> Result<()> {
        if level == dims.len() {
            if matches!(e, Elem::List(..)) {
                return Err(
                    self.elem_err(e, "dense literal is nested deeper than the tensor's rank")
                );
            }
            out.push(e);
            return Ok(());
        }
        match e {
            Elem::List(items, _) => {
                if items.len() as i64 != dims[level] {
                    return Err(self.elem_err(
                        e,
                        &format!(
                            "dense literal has {} elements at depth {level} but the type says {}",
                            items.len(),
                            dims[level]
                        ),
                    ));
                }
                for it in items {
                    self.flatten(it, dims, level + 1, out)?;
                }
                Ok(())
            }
            _ => Err(self.elem_err(e, "dense literal does not match the tensor's shape")),
        }
    }

    /// An integer literal as i128.
    fn int_of(&self, n: &Num) -> Result<i128> {
        let r = match n.kind {
            NumKind::Int => n.text.parse::<i128>().ok(),
            NumKind::Hex => u64::from_str_radix(n.text.get(2..).unwrap_or(""), 16)
                .ok()
                .map(|v| v as i128),
            NumKind::Float => None,
        };
        r.ok_or_else(|| {
            self.lx
                .err_at(n.pos, format!("expected an integer, found '{}'", n.text))
        })
    }

    /// Bits of a hex float literal that must fit in `bits` bits.
    fn hex_bits(&self, n: &Num, bits: u32) -> Result<u64> {
        let v = u64::from_str_radix(n.text.get(2..).unwrap_or(""), 16)
            .map_err(|_| self.lx.err_at(n.pos, "hex literal too large"))?;
        if bits < 64 && v >> bits != 0 {
            return Err(self
                .lx
                .err_at(n.pos, format!("hex literal does not fit in {bits} bits")));
        }
        Ok(v)
    }

    fn f32_of(&self, n: &Num) -> Result<f32> {
        match n.kind {
            NumKind::Hex => Ok(f32::from_bits(self.hex_bits(n, 32)? as u32)),
            _ => n
                .text
                .parse::<f32>()
                .map_err(|_| self.lx.err_at(n.pos, "bad float literal")),
        }
    }

    fn f64_of(&self, n: &Num) -> Result<f64> {
        match n.kind {
            NumKind::Hex => Ok(f64::from_bits(self.hex_bits(n, 64)?)),
            _ => n
                .text
                .parse::<f64>()
                .map_err(|_| self.lx.err_at(n.pos, "bad float literal")),
        }
    }

    /// Append element `i` of a tensor of `dtype` to `raw`.
    fn encode_elem(&self, raw: &mut Vec<u8>, dtype: DType, e: &Elem<'a>, i: usize) -> Result<()> {
        use DType::*;
        let num = |e: &Elem<'a>| -> Result<Num<'a>> {
            match e {
                Elem::Num(n) => Ok(*n),
                _ => Err(self.elem_err(e, &format!("expected a number for a {dtype} tensor"))),
            }
        };
        match dtype {
            F32 => raw.extend_from_slice(&self.f32_of(&num(e)?)?.to_le_bytes()),
            F64 => raw.extend_from_slice(&self.f64_of(&num(e)?)?.to_le_bytes()),
            F16 | BF16 => {
                let n = num(e)?;
                let bits = if n.kind == NumKind::Hex {
                    self.hex_bits(&n, 16)? as u16
                } else {
                    // Through f64, not f32: one rounding step that matters, not two.
                    let f = self.f64_of(&n)?;
                    if dtype == F16 {
                        half::f16::from_f64(f).to_bits()
                    } else {
                        half::bf16::from_f64(f).to_bits()
                    }
                };
                raw.extend_from_slice(&bits.to_le_bytes());
            }
            F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ => {
                let n = num(e)?;
                if n.kind == NumKind::Hex {
                    raw.push(self.hex_bits(&n, 8)? as u8);
                } else {
                    // Decimal (as mlir-opt prints them): the nearest float8 value.
                    let f = self.f64_of(&n)?;
                    raw.push(nearest_f8(dtype, f).ok_or_else(|| {
                        self.lx
                            .err_at(n.pos, format!("{} is not a finite {dtype}", n.text))
                    })?);
                }
            }
            Bool => {
                let v = match e {
                    Elem::Bool(b, _) => *b,
                    _ => match self.int_of(&num(e)?)? {
                        0 => false,
                        1 => true,
                        _ => return Err(self.elem_err(e, "expected true or false")),
                    },
                };
                raw.push(v as u8);
            }
            U8 | U16 | U32 | U64 | I8 | I16 | I32 | I64 | U4 | I4 => {
                let v = match e {
                    Elem::Bool(b, _) => *b as i128,
                    _ => self.int_of(&num(e)?)?,
                };
                let bits = dtype.bits() as u32;
                let (lo, hi) = if matches!(dtype, I8 | I16 | I32 | I64 | I4) {
                    (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
                } else {
                    (0, (1i128 << bits) - 1)
                };
                if v < lo || v > hi {
                    return Err(self.elem_err(e, &format!("{v} is out of range for {dtype}")));
                }
                if bits == 4 {
                    let nib = (v as u8) & 0xf;
                    if i & 1 == 0 {
                        raw.push(nib);
                    } else if let Some(last) = raw.last_mut() {
                        *last |= nib << 4;
                    }
                } else {
                    raw.extend_from_slice(&(v as u64).to_le_bytes()[..(bits / 8) as usize]);
                }
            }
            Complex64 | Complex128 => {
                let Elem::Complex(re, im) = e else {
                    return Err(self.elem_err(e, "expected a complex element '(re, im)'"));
                };
                if dtype == Complex64 {
                    raw.extend_from_slice(&self.f32_of(re)?.to_le_bytes());
                    raw.extend_from_slice(&self.f32_of(im)?.to_le_bytes());
                } else {
                    raw.extend_from_slice(&self.f64_of(re)?.to_le_bytes());
                    raw.extend_from_slice(&self.f64_of(im)?.to_le_bytes());
                }
            }
            String => return Err(self.elem_err(e, "unexpected string tensor")),
        }
        Ok(())
    }

    /// `tensor<...>`.
    fn tensor_type(&mut self) -> Result<TensorType> {
        self.lx.skip_ws();
        if !self.lx.eat_keyword("tensor") {
            return Err(self.lx.err("expected a tensor type"));
        }
        self.lx.expect_raw("<")?;
        self.lx.skip_ws();
        let mut shape: Option<Vec<Option<i64>>> = Some(Vec::new());
        if self.lx.peek_raw() == Some(b'*') {
            self.lx.expect_raw("*")?;
            self.lx.expect_raw("x")?;
            shape = None;
        } else {
            loop {
                match self.lx.peek_raw() {
                    Some(c) if c.is_ascii_digit() => {
                        let v = self.lx.raw_int()?;
                        self.lx.expect_raw("x")?;
                        if let Some(s) = shape.as_mut() {
                            s.push(Some(v));
                        }
                    }
                    Some(b'?') => {
                        self.lx.expect_raw("?")?;
                        self.lx.expect_raw("x")?;
                        if let Some(s) = shape.as_mut() {
                            s.push(None);
                        }
                    }
                    _ => break,
                }
            }
        }
        let epos = self.lx.pos;
        let name = if self.lx.peek_raw() == Some(b'!') {
            self.lx
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'!' | b'$'))
        } else {
            let s = self
                .lx
                .take_while(|c| c.is_ascii_alphanumeric() || c == b'_');
            if s == "complex" {
                self.lx.expect_raw("<")?;
                self.lx.take_while(|c| c.is_ascii_alphanumeric());
                self.lx.expect_raw(">")?;
                self.lx.src_slice(epos, self.lx.pos)
            } else {
                s
            }
        };
        let dtype = match name {
            "i8" => Some(DType::I8),
            "i16" => Some(DType::I16),
            "i32" => Some(DType::I32),
            "i64" => Some(DType::I64),
            _ => DType::from_mlir_name(name),
        }
        .ok_or_else(|| {
            self.lx
                .err_at(epos, format!("unknown element type '{name}'"))
        })?;
        let enc = if self.lx.eat(",") {
            self.lx.skip_ws();
            let p = self.lx.pos;
            Some((p, self.attr(1)?))
        } else {
            None
        };
        self.lx.expect(">")?;
        let Some(shape) = shape else {
            if let Some((p, _)) = enc {
                return Err(self
                    .lx
                    .err_at(p, "an unranked tensor type cannot have an encoding"));
            }
            return Ok(TensorType::unranked(dtype));
        };
        let n_unknown = shape.iter().filter(|d| d.is_none()).count();
        let mut syms: Vec<Dim> = Vec::new();
        match enc {
            None => syms.resize(n_unknown, Dim::sym("?")),
            Some((p, AV::List(items))) => {
                if items.len() != n_unknown {
                    return Err(self.lx.err_at(
                        p,
                        format!(
                            "the type has {n_unknown} '?' dims but its encoding lists {}",
                            items.len()
                        ),
                    ));
                }
                for (ip, it) in items {
                    syms.push(self.dim_enc(ip, it)?);
                }
            }
            Some((p, _)) => {
                return Err(self
                    .lx
                    .err_at(p, "expected a list of symbolic dims as the tensor encoding"))
            }
        }
        let mut it = syms.into_iter();
        let dims = shape
            .into_iter()
            .map(|d| match d {
                Some(v) => Dim::Known(v),
                None => it.next().unwrap_or_else(|| Dim::sym("?")),
            })
            .collect();
        Ok(TensorType::new(dtype, dims))
    }

    /// One entry of a type's dims encoding.
    fn dim_enc(&self, pos: usize, a: AV) -> Result<Dim> {
        match a {
            AV::Str(b) => {
                let s = utf8(b, &self.lx, pos)?;
                Dim::parse(&s).ok_or_else(|| self.lx.err_at(pos, format!("bad symbolic dim '{s}'")))
            }
            AV::Num(n, _) => Ok(Dim::Known(self.int_of(&n)? as i64)),
            AV::List(items) => {
                let mut it = items.into_iter();
                let coeff = match it.next() {
                    Some((_, AV::Num(n, _))) => i64::try_from(self.int_of(&n)?)
                        .map_err(|_| self.lx.err_at(pos, "coefficient out of range"))?,
                    _ => return Err(self.lx.err_at(pos, "expected [coeff, \"sym\", ...]")),
                };
                let mut syms = Vec::new();
                for (p, s) in it {
                    match s {
                        AV::Str(b) => syms.push(utf8(b, &self.lx, p)?),
                        _ => return Err(self.lx.err_at(p, "expected a symbol name")),
                    }
                }
                Ok(Dim::Sym(SymDim { coeff, syms }))
            }
            _ => Err(self.lx.err_at(pos, "expected a symbolic dim")),
        }
    }

    /// Give an attribute value its IR meaning.
    fn to_attr(&self, pos: usize, a: AV<'a>) -> Result<Attr> {
        Ok(match a {
            AV::Str(b) => Attr::String(utf8(b, &self.lx, pos)?),
            AV::Num(n, ty) => match ty {
                Some("f32") | Some("f64") | Some("f16") | Some("bf16") => {
                    if ty == Some("f64") && n.kind == NumKind::Hex {
                        Attr::Float(self.f64_of(&n)? as f32)
                    } else {
                        Attr::Float(self.f32_of(&n)?)
                    }
                }
                None | Some("i64") | Some("si64") | Some("i32") | Some("si32") | Some("index") => {
                    if n.kind == NumKind::Float {
                        Attr::Float(self.f32_of(&n)?)
                    } else {
                        let v = self.int_of(&n)?;
                        Attr::Int(
                            i64::try_from(v)
                                .map_err(|_| self.lx.err_at(n.pos, "integer out of range"))?,
                        )
                    }
                }
                Some(t) => return Err(self.lx.err_at(pos, format!("unsupported scalar type '{t}'"))),
            },
            AV::Bool(b) => Attr::Int(b as i64),
            AV::Array(ty, items) => match ty {
                "i64" | "i32" | "i16" | "i8" | "i1" => {
                    let mut v = Vec::with_capacity(items.len());
                    for n in &items {
                        v.push(
                            i64::try_from(self.int_of(n)?)
                                .map_err(|_| self.lx.err_at(n.pos, "integer out of range"))?,
                        );
                    }
                    Attr::Ints(v)
                }
                "f32" | "f64" => {
                    let mut v = Vec::with_capacity(items.len());
                    for n in &items {
                        v.push(if ty == "f64" && n.kind == NumKind::Hex {
                            self.f64_of(n)? as f32
                        } else {
                            self.f32_of(n)?
                        });
                    }
                    Attr::Floats(v)
                }
                _ => return Err(self.lx.err_at(pos, format!("unsupported array element type '{ty}'"))),
            },
            AV::List(items) => {
                if items.iter().all(|(_, a)| matches!(a, AV::Str(_))) {
                    let mut v = Vec::with_capacity(items.len());
                    for (p, a) in items {
                        if let AV::Str(b) = a {
                            v.push(utf8(b, &self.lx, p)?);
                        }
                    }
                    Attr::Strings(v)
                } else if items
                    .iter()
                    .all(|(_, a)| matches!(a, AV::Num(n, t) if n.kind != NumKind::Float && !matches!(t, Some("f32"|"f64"))))
                {
                    let mut v = Vec::with_capacity(items.len());
                    for (p, a) in items {
                        if let Attr::Int(x) = self.to_attr(p, a)? {
                            v.push(x);
                        }
                    }
                    Attr::Ints(v)
                } else if items.iter().all(|(_, a)| matches!(a, AV::Num(..))) {
                    let mut v = Vec::with_capacity(items.len());
                    for (p, a) in items {
                        match self.to_attr(p, a)? {
                            Attr::Float(x) => v.push(x),
                            Attr::Int(x) => v.push(x as f32),
                            _ => {}
                        }
                    }
                    Attr::Floats(v)
                } else {
                    return Err(self.lx.err_at(
                        pos,
                        "a list attribute must hold only strings, only integers or only floats",
                    ));
                }
            }
            AV::Dict => return Err(self.lx.err_at(pos, "dictionary attributes are not supported")),
            AV::Tensor(t) => Attr::Tensor(t),
        })
    }

    /// Strip the escape prefix of an attribute name.
    fn unescape(k: String) -> String {
        match k.strip_prefix(ESC) {
            Some(rest) => rest.to_string(),
            None => k,
        }
    }

    fn module_attrs(&mut self, d: Vec<(String, usize, AV<'a>)>) -> Result<()> {
        for (k, pos, v) in d {
            match k.as_str() {
                "pipec.ir_version" => match self.to_attr(pos, v)? {
                    Attr::Int(i) => self.m.ir_version = i,
                    _ => return Err(self.lx.err_at(pos, "pipec.ir_version must be an integer")),
                },
                "pipec.producer_name" | "pipec.producer_version" => {
                    let s = match v {
                        AV::Str(b) => utf8(b, &self.lx, pos)?,
                        _ => return Err(self.lx.err_at(pos, format!("{k} must be a string"))),
                    };
                    if k == "pipec.producer_name" {
                        self.m.producer_name = s;
                    } else {
                        self.m.producer_version = s;
                    }
                }
                "pipec.opset_imports" => {
                    let bad = |lx: &Lexer, p| {
                        lx.err_at(
                            p,
                            "pipec.opset_imports must be a list of [domain, version] pairs",
                        )
                    };
                    let AV::List(items) = v else {
                        return Err(bad(&self.lx, pos));
                    };
                    for (p, it) in items {
                        let AV::List(pair) = it else {
                            return Err(bad(&self.lx, p));
                        };
                        let mut pair = pair.into_iter();
                        let (Some((dp, AV::Str(d))), Some((vp, ver)), None) =
                            (pair.next(), pair.next(), pair.next())
                        else {
                            return Err(bad(&self.lx, p));
                        };
                        let Attr::Int(ver) = self.to_attr(vp, ver)? else {
                            return Err(bad(&self.lx, vp));
                        };
                        let d = utf8(d, &self.lx, dp)?;
                        self.m.opset_imports.insert(d, ver);
                    }
                }
                _ => {
                    let a = self.to_attr(pos, v)?;
                    self.m.attrs.insert(Self::unescape(k), a);
                }
            }
        }
        Ok(())
    }

    fn func(&mut self) -> Result<()> {
        if !self.lx.eat_keyword("func.func") {
            return Err(self.lx.err("expected 'func.func'"));
        }
        self.func_after_keyword()
    }

    /// A type list `(t, t)` or a single type.
    fn type_list(&mut self, allow_single: bool) -> Result<Vec<TensorType>> {
        let mut out = Vec::new();
        if allow_single && !matches!(self.lx.peek(), Some(b'(')) {
            out.push(self.tensor_type()?);
            return Ok(out);
        }
        self.lx.expect("(")?;
        if self.lx.eat(")") {
            return Ok(out);
        }
        loop {
            out.push(self.tensor_type()?);
            if self.lx.peek() == Some(b'{') {
                // Result attributes: not part of the format.
                return Err(self.lx.err("result attributes are not supported"));
            }
            if self.lx.eat(")") {
                return Ok(out);
            }
            self.lx.expect(",")?;
        }
    }

    /// Define `%name` (as a group of `vals`).
    fn define(&mut self, name: &'a str, pos: usize, vals: Vec<Value>) -> Result<()> {
        if self.scope.insert(name, vals).is_some() {
            return Err(self
                .lx
                .err_at(pos, format!("redefinition of value '%{name}'")));
        }
        Ok(())
    }

    fn func_after_keyword(&mut self) -> Result<()> {
        self.lx.eat_keyword("private");
        self.lx.eat_keyword("public");
        let name = self.symbol()?;
        self.m.graph = Graph::new(name);
        self.lx.expect("(")?;
        if !self.lx.eat(")") {
            loop {
                self.lx.expect("%")?;
                let npos = self.lx.pos;
                let ssa = self.lx.suffix_id()?;
                self.lx.expect(":")?;
                let ty = self.tensor_type()?;
                let mut vname = ssa.to_string();
                if self.lx.peek() == Some(b'{') {
                    for (k, p, v) in self.dict()? {
                        match (k.as_str(), v) {
                            ("pipec.name", AV::Str(b)) => vname = utf8(b, &self.lx, p)?,
                            _ => {
                                return Err(self
                                    .lx
                                    .err_at(p, format!("unexpected argument attribute '{k}'")))
                            }
                        }
                    }
                }
                let v = self.m.graph.add_input(vname, ty);
                self.define(ssa, npos, vec![v])?;
                if self.lx.eat(")") {
                    break;
                }
                self.lx.expect(",")?;
            }
        }
        let results = if self.lx.eat("->") {
            self.type_list(true)?
        } else {
            Vec::new()
        };
        if self.lx.eat_keyword("attributes") {
            for (k, p, v) in self.dict()? {
                match (k.as_str(), v) {
                    ("pipec.graph_name", AV::Str(b)) => self.m.graph.name = utf8(b, &self.lx, p)?,
                    _ => {
                        return Err(self
                            .lx
                            .err_at(p, format!("unexpected function attribute '{k}'")))
                    }
                }
            }
        }
        self.lx.expect("{")?;
        loop {
            self.lx.skip_ws();
            let pos = self.lx.pos;
            if self.lx.eat_keyword("func.return") || self.lx.eat_keyword("return") {
                let outs = self.operands(false)?;
                let tys = if outs.is_empty() {
                    Vec::new()
                } else {
                    self.lx.expect(":")?;
                    let mut t = vec![self.tensor_type()?];
                    while self.lx.eat(",") {
                        t.push(self.tensor_type()?);
                    }
                    t
                };
                if tys.len() != outs.len() || results.len() != outs.len() {
                    return Err(self.lx.err_at(
                        pos,
                        format!(
                            "return has {} values and {} types; the function declares {} results",
                            outs.len(),
                            tys.len(),
                            results.len()
                        ),
                    ));
                }
                for (((v, p), ty), rty) in outs.iter().zip(&tys).zip(&results) {
                    self.check_type(*v, *p, ty)?;
                    if ty != rty {
                        return Err(self.lx.err_at(
                            *p,
                            format!(
                                "returned type {} does not match the declared result type {}",
                                type_text(ty),
                                type_text(rty)
                            ),
                        ));
                    }
                }
                self.m.graph.outputs = outs.into_iter().map(|(v, _)| v).collect();
                break;
            }
            self.op()?;
        }
        self.lx.expect("}")?;
        Ok(())
    }

    /// Check that a use of `v` (at `pos`) states the type `v` was defined with.
    fn check_type(&self, v: Value, pos: usize, ty: &TensorType) -> Result<()> {
        let def = &self.m.graph.values[v].ty;
        if def != ty {
            return Err(self.lx.err_at(
                pos,
                format!(
                    "value used with type {} but defined with type {}",
                    type_text(ty),
                    type_text(def)
                ),
            ));
        }
        Ok(())
    }

    /// A value use `%name` or `%name#i`.
    fn use_value(&mut self) -> Result<Value> {
        self.lx.expect("%")?;
        let pos = self.lx.pos - 1;
        let name = self.lx.suffix_id()?;
        let idx = if self.lx.peek_raw() == Some(b'#') {
            self.lx.expect_raw("#")?;
            Some(self.lx.raw_int()?)
        } else {
            None
        };
        let Some(vals) = self.scope.get(name) else {
            return Err(self
                .lx
                .err_at(pos, format!("use of undefined value '%{name}'")));
        };
        match idx {
            None if vals.len() == 1 => Ok(vals[0]),
            None => Err(self.lx.err_at(
                pos,
                format!("'%{name}' has {} results; use '%{name}#N'", vals.len()),
            )),
            Some(i) => usize::try_from(i)
                .ok()
                .and_then(|i| vals.get(i).copied())
                .ok_or_else(|| self.lx.err_at(pos, format!("'%{name}' has no result #{i}"))),
        }
    }

    /// A comma-separated operand list; `parens` when enclosed in `(...)`.
    fn operands(&mut self, parens: bool) -> Result<Vec<(Value, usize)>> {
        let mut out = Vec::new();
        if parens {
            self.lx.expect("(")?;
            if self.lx.eat(")") {
                return Ok(out);
            }
        } else if self.lx.peek() != Some(b'%') {
            return Ok(out);
        }
        loop {
            self.lx.skip_ws();
            let pos = self.lx.pos;
            out.push((self.use_value()?, pos));
            if !self.lx.eat(",") {
                break;
            }
        }
        if parens {
            self.lx.expect(")")?;
        }
        Ok(out)
    }

    /// One op line.
    fn op(&mut self) -> Result<()> {
        self.lx.skip_ws();
        let start = self.lx.pos;
        // Results: `%a, %b =` or `%r:2 =`.
        let mut res: Vec<(&'a str, usize, usize)> = Vec::new();
        if self.lx.peek() == Some(b'%') {
            loop {
                self.lx.expect("%")?;
                let p = self.lx.pos - 1;
                let n = self.lx.suffix_id()?;
                let count = if self.lx.peek_raw() == Some(b':') {
                    self.lx.expect_raw(":")?;
                    let c = self.lx.raw_int()?;
                    if !(1..=1 << 16).contains(&c) {
                        return Err(self.lx.err_at(p, "bad result count"));
                    }
                    c as usize
                } else {
                    1
                };
                res.push((n, p, count));
                if !self.lx.eat(",") {
                    break;
                }
            }
            self.lx.expect("=")?;
        }
        self.lx.skip_ws();
        let npos = self.lx.pos;
        if self.lx.peek() != Some(b'"') {
            return Err(self.lx.err("expected an op name string or 'func.return'"));
        }
        let opname = utf8(self.lx.string()?, &self.lx, npos)?;
        let operands = self.operands(true)?;
        let attrs = if self.lx.peek() == Some(b'{') {
            self.dict()?
        } else {
            Vec::new()
        };
        self.lx.expect(":")?;
        let in_tys = self.type_list(false)?;
        self.lx.expect("->")?;
        let out_tys = self.type_list(true)?;
        if in_tys.len() != operands.len() {
            return Err(self.lx.err_at(
                start,
                format!(
                    "op has {} operands but {} operand types",
                    operands.len(),
                    in_tys.len()
                ),
            ));
        }
        for ((v, p), ty) in operands.iter().zip(&in_tys) {
            self.check_type(*v, *p, ty)?;
        }
        let operands: Vec<Value> = operands.into_iter().map(|(v, _)| v).collect();
        let nres: usize = res.iter().map(|r| r.2).sum();
        if nres != out_tys.len() {
            return Err(self.lx.err_at(
                start,
                format!(
                    "op defines {nres} results but has {} result types",
                    out_tys.len()
                ),
            ));
        }
        // SSA names of the individual results.
        let mut ssa_names: Vec<String> = Vec::with_capacity(nres);
        for (n, _, c) in &res {
            if *c == 1 {
                ssa_names.push(n.to_string());
            } else {
                for i in 0..*c {
                    ssa_names.push(format!("{n}#{i}"));
                }
            }
        }

        let vals: Vec<Value> = if opname == "pipec.initializer" {
            if !operands.is_empty() || nres != 1 {
                return Err(self.lx.err_at(
                    start,
                    "pipec.initializer takes no operands and has one result",
                ));
            }
            let mut name = ssa_names[0].clone();
            let mut data = None;
            for (k, p, v) in attrs {
                match (k.as_str(), v) {
                    ("pipec.name", AV::Str(b)) => name = utf8(b, &self.lx, p)?,
                    ("value", AV::Tensor(t)) => data = Some(t),
                    _ => {
                        return Err(self
                            .lx
                            .err_at(p, format!("unexpected initializer attribute '{k}'")))
                    }
                }
            }
            let Some(data) = data else {
                return Err(self
                    .lx
                    .err_at(start, "pipec.initializer needs a 'value' tensor"));
            };
            let ty = out_tys
                .into_iter()
                .next()
                .unwrap_or_else(|| TensorType::unranked(data.dtype));
            let v = self.m.graph.values.push(ValueData {
                name,
                ty,
                def: ValueDef::Initializer,
            });
            self.m.graph.initializers.insert(v, data);
            vec![v]
        } else {
            let mut d = OpData::default();
            let mut names: Option<Vec<String>> = None;
            let mut absent: Vec<i64> = Vec::new();
            let mut op_type: Option<String> = None;
            let mut domain: Option<String> = None;
            let mut ir_attrs = BTreeMap::new();
            for (k, p, v) in attrs {
                match k.as_str() {
                    "pipec.node" | "pipec.op_type" | "pipec.domain" => {
                        let AV::Str(b) = v else {
                            return Err(self.lx.err_at(p, format!("{k} must be a string")));
                        };
                        let s = utf8(b, &self.lx, p)?;
                        match k.as_str() {
                            "pipec.node" => d.name = s,
                            "pipec.op_type" => op_type = Some(s),
                            _ => domain = Some(s),
                        }
                    }
                    "pipec.names" => match self.to_attr(p, v)? {
                        Attr::Strings(s) if s.len() == nres => names = Some(s),
                        _ => {
                            return Err(self.lx.err_at(
                                p,
                                format!("pipec.names must list {nres} strings, one per result"),
                            ))
                        }
                    },
                    "pipec.absent" => match self.to_attr(p, v)? {
                        Attr::Ints(s) => absent = s,
                        _ => {
                            return Err(self
                                .lx
                                .err_at(p, "pipec.absent must be an array<i64: ...>"))
                        }
                    },
                    _ => {
                        let a = self.to_attr(p, v)?;
                        ir_attrs.insert(Self::unescape(k), a);
                    }
                }
            }
            if opname == "pipec.op" {
                match (op_type, domain) {
                    (Some(t), Some(dm)) => {
                        d.op_type = t;
                        d.domain = dm;
                    }
                    _ => {
                        return Err(self.lx.err_at(
                            npos,
                            "pipec.op needs pipec.op_type and pipec.domain attributes",
                        ))
                    }
                }
            } else if let Some(rest) = opname.strip_prefix("onnx.") {
                if op_type.is_some() || domain.is_some() {
                    return Err(self
                        .lx
                        .err_at(npos, "pipec.op_type/pipec.domain are only for \"pipec.op\""));
                }
                match rest.rfind('.') {
                    Some(i) => {
                        d.domain = rest[..i].to_string();
                        d.op_type = rest[i + 1..].to_string();
                    }
                    None => d.op_type = rest.to_string(),
                }
                if d.op_type.is_empty() {
                    return Err(self
                        .lx
                        .err_at(npos, format!("op name '{opname}' has no op type")));
                }
            } else {
                return Err(self.lx.err_at(
                    npos,
                    format!("unknown op '{opname}' (expected \"onnx.*\", \"pipec.initializer\" or \"pipec.op\")"),
                ));
            }
            // Operands with the absent positions put back.
            let total = operands.len() + absent.len();
            let mut inputs: Vec<Option<Value>> = Vec::with_capacity(total);
            let mut it = operands.into_iter();
            let mut prev: i64 = -1;
            for &a in &absent {
                if a <= prev || a as usize >= total {
                    return Err(self.lx.err_at(
                        start,
                        format!("bad pipec.absent position {a} (positions must be increasing and below {total})"),
                    ));
                }
                prev = a;
            }
            let mut ai = absent.iter().peekable();
            for i in 0..total {
                if ai.peek().is_some_and(|a| **a as usize == i) {
                    ai.next();
                    inputs.push(None);
                } else {
                    inputs.push(it.next());
                }
            }
            d.inputs = inputs;
            d.attrs = ir_attrs;
            let names = names.unwrap_or_else(|| ssa_names.clone());
            let results = names.into_iter().zip(out_tys).collect();
            let (_, outs) = self.m.graph.add_op(d, results);
            outs
        };
        let mut k = 0;
        for (n, p, c) in res {
            let group = vals
                .get(k..k + c)
                .map(<[Value]>::to_vec)
                .unwrap_or_default();
            k += c;
            self.define(n, p, group)?;
        }
        Ok(())
    }

    /// The `{-# ... #-}` section (after `{-#`).
    fn resources(&mut self) -> Result<()> {
        let mut blobs: HashMap<String, (usize, Vec<u8>)> = HashMap::new();
        loop {
            if self.lx.eat("#-}") {
                break;
            }
            let Some(section) = self.lx.ident() else {
                return Err(self.lx.err("expected 'dialect_resources' or '#-}'"));
            };
            if section != "dialect_resources" {
                return Err(self
                    .lx
                    .err(format!("unsupported metadata section '{section}'")));
            }
            self.lx.expect(":")?;
            self.lx.expect("{")?;
            while !self.lx.eat("}") {
                let Some(dialect) = self.lx.ident() else {
                    return Err(self.lx.err("expected a dialect name"));
                };
                let dialect = dialect.to_string();
                self.lx.expect(":")?;
                self.lx.expect("{")?;
                while !self.lx.eat("}") {
                    self.lx.skip_ws();
                    let kpos = self.lx.pos;
                    let Some(key) = self.lx.ident() else {
                        return Err(self.lx.err("expected a resource key"));
                    };
                    self.lx.expect(":")?;
                    self.lx.skip_ws();
                    let vpos = self.lx.pos;
                    let s = self.lx.string()?;
                    if dialect == "builtin" {
                        let blob = Self::hex_blob(&s).ok_or_else(|| {
                            self.lx.err_at(
                                vpos,
                                "expected a hex blob \"0x...\" with a 4-byte alignment header",
                            )
                        })?;
                        if blobs.insert(key.to_string(), (kpos, blob)).is_some() {
                            return Err(self
                                .lx
                                .err_at(kpos, format!("duplicate resource '{key}'")));
                        }
                    }
                    if !self.lx.eat(",") {
                        self.lx.expect("}")?;
                        break;
                    }
                }
                if !self.lx.eat(",") {
                    self.lx.expect("}")?;
                    break;
                }
            }
            self.lx.eat(",");
        }
        // Put the blobs into the elided tensors.
        let lx = &self.lx;
        let fill = |t: &mut TensorData| -> Result<()> {
            let Payload::Elided(k) = &t.payload else {
                return Ok(());
            };
            let Some((pos, blob)) = blobs.get(k) else {
                return Ok(());
            };
            if t.dtype == DType::String {
                return Err(lx.err_at(*pos, format!("resource '{k}' is used by a string tensor")));
            }
            let want = t.numel().and_then(|n| t.dtype.bytes_for(n));
            let body = blob.get(4..).unwrap_or(&[]);
            if want != Some(body.len() as u64) {
                return Err(lx.err_at(
                    *pos,
                    format!(
                        "resource '{k}' has {} bytes but its tensor {} {:?} needs {}",
                        body.len(),
                        t.dtype,
                        t.dims,
                        want.map_or("too many".to_string(), |w| w.to_string())
                    ),
                ));
            }
            t.payload = Payload::Raw(Bytes::copy_from_slice(body));
            Ok(())
        };
        for t in self.m.graph.initializers.values_mut() {
            fill(t)?;
        }
        for op in self.m.graph.ops.values_mut() {
            for a in op.attrs.values_mut() {
                if let Attr::Tensor(t) = a {
                    fill(t)?;
                }
            }
        }
        for a in self.m.attrs.values_mut() {
            if let Attr::Tensor(t) = a {
                fill(t)?;
            }
        }
        Ok(())
    }

    /// Decode `0x` + hex; at least the 4 header bytes.
    fn hex_blob(s: &[u8]) -> Option<Vec<u8>> {
        let h = s.strip_prefix(b"0x")?;
        if h.len() % 2 != 0 || h.len() < 8 {
            return None;
        }
        let d = |c: u8| (c as char).to_digit(16).map(|v| v as u8);
        h.chunks_exact(2)
            .map(|p| Some(d(p[0])? * 16 + d(p[1])?))
            .collect()
    }
}

/// The value of a float8 bit pattern (`None` for NaN and infinities).
fn f8_value(dtype: DType, b: u8) -> Option<f32> {
    let (mbits, bias, ieee) = match dtype {
        DType::F8E4M3FN => (3, 7, false),
        DType::F8E4M3FNUZ => (3, 8, false),
        DType::F8E5M2 => (2, 15, true),
        DType::F8E5M2FNUZ => (2, 16, false),
        _ => return None,
    };
    let fnuz = matches!(dtype, DType::F8E4M3FNUZ | DType::F8E5M2FNUZ);
    if fnuz && b == 0x80 {
        return None;
    }
    let ebits = 7 - mbits;
    let emax = (1u8 << ebits) - 1;
    let exp = (b >> mbits) & emax;
    let man = b & ((1 << mbits) - 1);
    if ieee && exp == emax {
        return None;
    }
    if dtype == DType::F8E4M3FN && exp == emax && man == (1 << mbits) - 1 {
        return None;
    }
    let frac = man as f32 / (1u32 << mbits) as f32;
    let mag = if exp == 0 {
        frac * 2f32.powi(1 - bias)
    } else {
        (1.0 + frac) * 2f32.powi(exp as i32 - bias)
    };
    Some(if b & 0x80 != 0 { -mag } else { mag })
}

/// The float8 bit pattern nearest to `f` (ties to the even pattern; `-0.0` kept where the
/// format has it).
fn nearest_f8(dtype: DType, f: f64) -> Option<u8> {
    if !f.is_finite() {
        return None;
    }
    let mut best: Option<(f64, u8)> = None;
    for b in 0..=255u8 {
        let Some(v) = f8_value(dtype, b) else {
            continue;
        };
        let v = v as f64;
        if v.to_bits() == f.to_bits() {
            return Some(b);
        }
        let d = (v - f).abs();
        if best.is_none_or(|(bd, bb)| d < bd || (d == bd && b & 1 == 0 && bb & 1 == 1)) {
            best = Some((d, b));
        }
    }
    best.map(|(_, b)| b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f8_decoding() {
        assert_eq!(f8_value(DType::F8E4M3FN, 0x38), Some(1.0));
        assert_eq!(f8_value(DType::F8E4M3FN, 0x7e), Some(448.0));
        assert_eq!(f8_value(DType::F8E4M3FN, 0x7f), None);
        assert_eq!(f8_value(DType::F8E4M3FNUZ, 0x40), Some(1.0));
        assert_eq!(f8_value(DType::F8E5M2, 0x3c), Some(1.0));
        assert_eq!(f8_value(DType::F8E5M2, 0x7c), None);
        assert_eq!(f8_value(DType::F8E5M2FNUZ, 0x40), Some(1.0));
        assert_eq!(f8_value(DType::F8E5M2FNUZ, 0x80), None);
        for dt in [
            DType::F8E4M3FN,
            DType::F8E4M3FNUZ,
            DType::F8E5M2,
            DType::F8E5M2FNUZ,
        ] {
            for b in 0..=255u8 {
                if let Some(v) = f8_value(dt, b) {
                    assert_eq!(nearest_f8(dt, v as f64), Some(b), "{dt} {b:#x}");
                    // Six significant digits, as mlir-opt prints them, still find it.
                    let s = format!("{v:.5e}");
                    assert_eq!(nearest_f8(dt, s.parse().unwrap()), Some(b), "{dt} {s}");
                }
            }
        }
    }
}
