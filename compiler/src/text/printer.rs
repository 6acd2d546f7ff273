//! The printer: one linear walk over the module; names are made unique with hash sets.

use super::{PrintOptions, ESC, MODULE_RESERVED, OP_RESERVED};
use crate::ir::{Attr, DType, Dim, Module, Payload, TensorData, TensorType, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write;

/// Print `m` as MLIR text.
pub(crate) fn print_module(m: &Module, opts: &PrintOptions) -> String {
    let mut p = Printer {
        opts,
        names: HashMap::new(),
        used: HashSet::new(),
        next_suffix: HashMap::new(),
        keys: HashSet::new(),
        key_suffix: HashMap::new(),
        blobs: Vec::new(),
    };
    p.module(m)
}

struct Printer<'a> {
    opts: &'a PrintOptions,
    /// SSA name of each value printed so far.
    names: HashMap<Value, String>,
    used: HashSet<String>,
    next_suffix: HashMap<String, u32>,
    /// Resource keys taken.
    keys: HashSet<String>,
    key_suffix: HashMap<String, u32>,
    /// Blobs to print in the resource section: key, alignment, bytes.
    blobs: Vec<(String, u32, bytes::Bytes)>,
}

/// True for an MLIR `bare-id`: `[A-Za-z_][A-Za-z0-9_$.]*`.
pub(crate) fn is_bare_id(s: &str) -> bool {
    let mut it = s.bytes();
    match it.next() {
        Some(c) if c.is_ascii_alphabetic() || c == b'_' => {}
        _ => return false,
    }
    it.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'.'))
}

/// The SSA name for an ONNX name (before making it unique).
fn sanitize_ssa(name: &str) -> String {
    let s = name.strip_prefix('/').unwrap_or(name);
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '$' | '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        out.push('v');
    } else if out.as_bytes()[0].is_ascii_digit() && !out.bytes().all(|c| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// A resource key (an MLIR keyword: `[A-Za-z_][A-Za-z0-9_.]*`) for a name.
fn sanitize_key(name: &str) -> String {
    let mut out: String = name
        .strip_prefix('/')
        .unwrap_or(name)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        out.push('t');
    } else if !(out.as_bytes()[0].is_ascii_alphabetic() || out.as_bytes()[0] == b'_') {
        out.insert(0, '_');
    }
    out
}

/// True if `k` is a valid resource key.
fn is_key(k: &str) -> bool {
    is_bare_id(k) && !k.contains('$')
}

/// Make `base` unique in `used`, recording the next suffix to try per base.
fn unique(base: String, used: &mut HashSet<String>, next: &mut HashMap<String, u32>) -> String {
    if used.insert(base.clone()) {
        return base;
    }
    let n = next.entry(base.clone()).or_insert(1);
    loop {
        let cand = format!("{base}_{n}");
        *n += 1;
        if used.insert(cand.clone()) {
            return cand;
        }
    }
}

/// Append `s` as an MLIR string literal.
pub(crate) fn quote_bytes(out: &mut String, s: &[u8]) {
    out.push('"');
    for &c in s {
        match c {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(c as char),
            _ => {
                let _ = write!(out, "\\{c:02X}");
            }
        }
    }
    out.push('"');
}

fn quote(out: &mut String, s: &str) {
    quote_bytes(out, s.as_bytes());
}

/// An attribute name: bare if possible, else quoted.
fn attr_name(out: &mut String, s: &str) {
    if is_bare_id(s) {
        out.push_str(s);
    } else {
        quote(out, s);
    }
}

/// An f32 that reads back exactly: shortest decimal, or hex bits when not finite.
pub(crate) fn fmt_f32(out: &mut String, f: f32) {
    if !f.is_finite() {
        let _ = write!(out, "0x{:08X}", f.to_bits());
        return;
    }
    push_decimal(out, format!("{f:?}"));
}

/// An f64 that reads back exactly.
fn fmt_f64(out: &mut String, f: f64) {
    if !f.is_finite() {
        let _ = write!(out, "0x{:016X}", f.to_bits());
        return;
    }
    push_decimal(out, format!("{f:?}"));
}

/// MLIR float literals need a `.` before the exponent (`1e20` lexes as `1` then `e20`).
fn push_decimal(out: &mut String, s: String) {
    if s.contains('.') {
        out.push_str(&s);
    } else if let Some(i) = s.find('e') {
        out.push_str(&s[..i]);
        out.push_str(".0");
        out.push_str(&s[i..]);
    } else {
        out.push_str(&s);
        out.push_str(".0");
    }
}

/// Print a dim list encoding entry for a `?` dim.
fn dim_enc(out: &mut String, d: &Dim) {
    match d {
        Dim::Known(v) => {
            let _ = write!(out, "{v}");
        }
        Dim::Sym(s) => {
            let text = d.to_string();
            if Dim::parse(&text).as_ref() == Some(d) {
                quote(out, &text);
            } else {
                let _ = write!(out, "[{}", s.coeff);
                for sym in &s.syms {
                    out.push_str(", ");
                    quote(out, sym);
                }
                out.push(']');
            }
        }
    }
}

/// Print a tensor type.
pub(crate) fn fmt_type(out: &mut String, t: &TensorType) {
    out.push_str("tensor<");
    match &t.shape {
        None => out.push_str("*x"),
        Some(dims) => {
            for d in dims {
                match d {
                    Dim::Known(v) if *v >= 0 => {
                        let _ = write!(out, "{v}x");
                    }
                    _ => out.push_str("?x"),
                }
            }
        }
    }
    out.push_str(t.dtype.mlir_name());
    if let Some(dims) = &t.shape {
        let mut first = true;
        for d in dims {
            if matches!(d, Dim::Known(v) if *v >= 0) {
                continue;
            }
            out.push_str(if first { ", [" } else { ", " });
            first = false;
            dim_enc(out, d);
        }
        if !first {
            out.push(']');
        }
    }
    out.push('>');
}

/// Alignment written in a blob header for a dtype.
fn blob_align(d: DType) -> u32 {
    match d.bits() {
        0..=8 => 1,
        16 => 2,
        32 => 4,
        _ => 8,
    }
}

/// Read the i-th element's bits of a packed little-endian buffer (`n` bytes per element).
fn le_bits(b: &[u8], i: usize, n: usize) -> u64 {
    let mut v = 0u64;
    if let Some(chunk) = b.get(i * n..i * n + n) {
        for (k, byte) in chunk.iter().enumerate() {
            v |= (*byte as u64) << (8 * k);
        }
    }
    v
}

/// Print element `i` of a raw tensor.
fn fmt_elem(out: &mut String, dtype: DType, b: &[u8], i: usize) {
    use DType::*;
    match dtype {
        F32 => fmt_f32(out, f32::from_bits(le_bits(b, i, 4) as u32)),
        F64 => fmt_f64(out, f64::from_bits(le_bits(b, i, 8))),
        F16 => {
            let h = half::f16::from_bits(le_bits(b, i, 2) as u16);
            if h.is_finite() {
                fmt_f32(out, h.to_f32());
            } else {
                let _ = write!(out, "0x{:04X}", h.to_bits());
            }
        }
        BF16 => {
            let h = half::bf16::from_bits(le_bits(b, i, 2) as u16);
            if h.is_finite() {
                fmt_f32(out, h.to_f32());
            } else {
                let _ = write!(out, "0x{:04X}", h.to_bits());
            }
        }
        F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ => {
            let _ = write!(out, "0x{:02X}", le_bits(b, i, 1));
        }
        Bool => out.push_str(if le_bits(b, i, 1) != 0 {
            "true"
        } else {
            "false"
        }),
        U8 | U16 | U32 | U64 => {
            let n = (dtype.bits() / 8) as usize;
            let _ = write!(out, "{}", le_bits(b, i, n));
        }
        I8 | I16 | I32 | I64 => {
            let n = (dtype.bits() / 8) as usize;
            let v = le_bits(b, i, n);
            let shift = 64 - 8 * n as u32;
            let _ = write!(out, "{}", ((v << shift) as i64) >> shift);
        }
        U4 | I4 => {
            let byte = b.get(i / 2).copied().unwrap_or(0);
            let nib = if i & 1 == 0 { byte & 0xf } else { byte >> 4 };
            if dtype == I4 {
                let _ = write!(out, "{}", ((nib << 4) as i8) >> 4);
            } else {
                let _ = write!(out, "{nib}");
            }
        }
        Complex64 => {
            out.push('(');
            fmt_f32(out, f32::from_bits(le_bits(b, 2 * i, 4) as u32));
            out.push_str(", ");
            fmt_f32(out, f32::from_bits(le_bits(b, 2 * i + 1, 4) as u32));
            out.push(')');
        }
        Complex128 => {
            out.push('(');
            fmt_f64(out, f64::from_bits(le_bits(b, 2 * i, 8)));
            out.push_str(", ");
            fmt_f64(out, f64::from_bits(le_bits(b, 2 * i + 1, 8)));
            out.push(')');
        }
        String => out.push_str("\"\""),
    }
}

/// Print the nested list of elements of a tensor with shape `dims` (all non-negative).
fn fmt_nested(out: &mut String, dims: &[usize], elem: &mut dyn FnMut(&mut String, usize)) {
    fn rec(
        out: &mut String,
        dims: &[usize],
        level: usize,
        base: usize,
        stride: &[usize],
        elem: &mut dyn FnMut(&mut String, usize),
    ) {
        if level == dims.len() {
            elem(out, base);
            return;
        }
        out.push('[');
        for k in 0..dims[level] {
            if k > 0 {
                out.push_str(", ");
            }
            rec(out, dims, level + 1, base + k * stride[level], stride, elem);
        }
        out.push(']');
    }
    let mut stride = vec![1usize; dims.len()];
    for l in (0..dims.len().saturating_sub(1)).rev() {
        stride[l] = stride[l + 1].saturating_mul(dims[l + 1]);
    }
    rec(out, dims, 0, 0, &stride, elem);
}

impl Printer<'_> {
    /// A fresh unique SSA name for `v` (ONNX name `name`); returns it and whether it differs.
    fn define(&mut self, v: Value, name: &str) -> (String, bool) {
        let base = sanitize_ssa(name);
        let s = unique(base, &mut self.used, &mut self.next_suffix);
        self.names.insert(v, s.clone());
        let changed = s != name;
        (s, changed)
    }

    /// The SSA name of a use (values not defined in the text get a name on first use).
    fn use_name(&mut self, v: Value, m: &Module) -> String {
        if let Some(s) = self.names.get(&v) {
            return s.clone();
        }
        let name = m
            .graph
            .values
            .get(v)
            .map(|d| d.name.clone())
            .unwrap_or_default();
        self.define(v, &name).0
    }

    fn value_type(&self, m: &Module, v: Value, out: &mut String) {
        match m.graph.values.get(v) {
            Some(d) => fmt_type(out, &d.ty),
            None => out.push_str("tensor<*xf32>"),
        }
    }

    fn resource_key(&mut self, hint: &str, elided: Option<&str>) -> String {
        if let Some(k) = elided {
            if is_key(k) && self.keys.insert(k.to_string()) {
                return k.to_string();
            }
        }
        unique(sanitize_key(hint), &mut self.keys, &mut self.key_suffix)
    }

    /// Print a tensor literal (`dense<...> : tensor<...>` or `dense_resource<KEY> : ...`).
    fn tensor(&mut self, out: &mut String, t: &TensorData, hint: &str) {
        let ty = TensorType::known(t.dtype, &t.dims);
        let numel = t.numel();
        let dims: Option<Vec<usize>> = t.dims.iter().map(|d| usize::try_from(*d).ok()).collect();
        let want = numel.and_then(|n| t.dtype.bytes_for(n));
        match &t.payload {
            Payload::Raw(b)
                if dims.is_some()
                    && want == Some(b.len() as u64)
                    && numel.is_some_and(|n| n <= self.opts.elide_threshold as u64)
                    && t.dtype != DType::String =>
            {
                let dims = dims.unwrap_or_default();
                out.push_str("dense<");
                if numel != Some(0) {
                    let dtype = t.dtype;
                    fmt_nested(out, &dims, &mut |o, i| fmt_elem(o, dtype, b, i));
                }
                out.push('>');
            }
            Payload::Strings(s) if dims.is_some() && numel == Some(s.len() as u64) => {
                let dims = dims.unwrap_or_default();
                out.push_str("dense<");
                if !s.is_empty() {
                    fmt_nested(out, &dims, &mut |o, i| {
                        quote_bytes(o, s.get(i).map(|b| &b[..]).unwrap_or(b""))
                    });
                }
                out.push('>');
            }
            Payload::Elided(k) => {
                let key = self.resource_key(hint, Some(k));
                let _ = write!(out, "dense_resource<{key}>");
            }
            Payload::Raw(b) => {
                let key = self.resource_key(hint, None);
                if self.opts.emit_resources {
                    self.blobs
                        .push((key.clone(), blob_align(t.dtype), b.clone()));
                }
                let _ = write!(out, "dense_resource<{key}>");
            }
            Payload::Strings(_) => {
                // Element count does not match the shape: not representable, keep the shape.
                let key = self.resource_key(hint, None);
                let _ = write!(out, "dense_resource<{key}>");
            }
        }
        out.push_str(" : ");
        fmt_type(out, &ty);
    }

    fn attr(&mut self, out: &mut String, a: &Attr, hint: &str) {
        match a {
            Attr::Int(v) => {
                let _ = write!(out, "{v} : i64");
            }
            Attr::Float(f) => {
                fmt_f32(out, *f);
                out.push_str(" : f32");
            }
            Attr::String(s) => quote(out, s),
            Attr::Tensor(t) => self.tensor(out, t, hint),
            Attr::Ints(v) => {
                out.push_str("array<i64");
                for (i, x) in v.iter().enumerate() {
                    out.push_str(if i == 0 { ": " } else { ", " });
                    let _ = write!(out, "{x}");
                }
                out.push('>');
            }
            Attr::Floats(v) => {
                out.push_str("array<f32");
                for (i, x) in v.iter().enumerate() {
                    out.push_str(if i == 0 { ": " } else { ", " });
                    fmt_f32(out, *x);
                }
                out.push('>');
            }
            Attr::Graph(sg) => {
                // Not parsed back: the text form of a model with control flow is for reading.
                out.push_str("#pipec.subgraph<");
                quote(out, &sg.graph.name);
                let _ = write!(
                    out,
                    ", {} inputs, {} captured, {} ops, {} outputs>",
                    sg.formal,
                    sg.graph.inputs.len() - sg.formal,
                    sg.graph.order.len(),
                    sg.graph.outputs.len()
                );
            }
            Attr::Strings(v) => {
                out.push('[');
                for (i, s) in v.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    quote(out, s);
                }
                out.push(']');
            }
        }
    }

    /// Print an attribute dictionary from IR attributes (escaping reserved names) plus the
    /// format's own entries (already printed values). Keys are sorted as MLIR sorts them.
    fn dict(
        &mut self,
        out: &mut String,
        ir: &BTreeMap<String, Attr>,
        reserved: &[&str],
        own: Vec<(String, String)>,
        hint: &str,
    ) {
        let mut entries = own;
        for (k, a) in ir {
            let key = if k.is_empty() || reserved.contains(&k.as_str()) || k.starts_with(ESC) {
                format!("{ESC}{k}")
            } else {
                k.clone()
            };
            let mut v = String::new();
            self.attr(&mut v, a, &format!("{hint}.{k}"));
            entries.push((key, v));
        }
        if entries.is_empty() {
            return;
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        out.push_str(" {");
        for (i, (k, v)) in entries.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            attr_name(out, k);
            out.push_str(" = ");
            out.push_str(v);
        }
        out.push('}');
    }

    fn module(&mut self, m: &Module) -> String {
        let g = &m.graph;
        let mut out = String::with_capacity(256 + 256 * g.order.len());

        // Module attributes.
        let mut own = Vec::new();
        own.push((
            "pipec.ir_version".to_string(),
            format!("{} : i64", m.ir_version),
        ));
        let mut ops = String::from("[");
        for (i, (d, v)) in m.opset_imports.iter().enumerate() {
            if i > 0 {
                ops.push_str(", ");
            }
            ops.push('[');
            quote(&mut ops, d);
            let _ = write!(ops, ", {v}]");
        }
        ops.push(']');
        own.push(("pipec.opset_imports".to_string(), ops));
        if !m.producer_name.is_empty() {
            let mut s = String::new();
            quote(&mut s, &m.producer_name);
            own.push(("pipec.producer_name".to_string(), s));
        }
        if !m.producer_version.is_empty() {
            let mut s = String::new();
            quote(&mut s, &m.producer_version);
            own.push(("pipec.producer_version".to_string(), s));
        }
        out.push_str("module attributes");
        self.dict(&mut out, &m.attrs, MODULE_RESERVED, own, "module");
        out.push_str(" {\n");

        // Function signature.
        let fname = if g.name.is_empty() {
            "main".to_string()
        } else if is_bare_id(&g.name) {
            g.name.clone()
        } else {
            sanitize_key(&g.name)
        };
        let _ = write!(out, "  func.func @{fname}(");
        for (i, &v) in g.inputs.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let name = g.values.get(v).map(|d| d.name.as_str()).unwrap_or("");
            let (s, changed) = self.define(v, name);
            let _ = write!(out, "%{s}: ");
            self.value_type(m, v, &mut out);
            if changed {
                out.push_str(" {pipec.name = ");
                quote(&mut out, name);
                out.push('}');
            }
        }
        out.push(')');
        if !g.outputs.is_empty() {
            out.push_str(" -> (");
            for (i, &v) in g.outputs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                self.value_type(m, v, &mut out);
            }
            out.push(')');
        }
        if fname != g.name {
            out.push_str(" attributes {pipec.graph_name = ");
            quote(&mut out, &g.name);
            out.push('}');
        }
        out.push_str(" {\n");

        // Initializers.
        for (&v, data) in &g.initializers {
            let name = g.values.get(v).map(|d| d.name.as_str()).unwrap_or("");
            let (s, changed) = self.define(v, name);
            let _ = write!(out, "    %{s} = \"pipec.initializer\"() {{");
            if changed {
                out.push_str("pipec.name = ");
                quote(&mut out, name);
                out.push_str(", ");
            }
            out.push_str("value = ");
            self.tensor(&mut out, data, name);
            out.push_str("} : () -> ");
            self.value_type(m, v, &mut out);
            out.push('\n');
        }

        // Ops.
        for &op in &g.order {
            let Some(d) = g.ops.get(op) else { continue };
            out.push_str("    ");
            let mut orig = Vec::with_capacity(d.outputs.len());
            let mut any_changed = false;
            for (i, &v) in d.outputs.iter().enumerate() {
                let name = g.values.get(v).map(|d| d.name.as_str()).unwrap_or("");
                let (s, changed) = self.define(v, name);
                any_changed |= changed;
                orig.push(name);
                if i > 0 {
                    out.push_str(", ");
                }
                out.push('%');
                out.push_str(&s);
            }
            if !d.outputs.is_empty() {
                out.push_str(" = ");
            }
            let generic = d.op_type.is_empty() || d.op_type.contains('.');
            let mut opname = String::from("onnx.");
            if !generic {
                if !d.domain.is_empty() {
                    opname.push_str(&d.domain);
                    opname.push('.');
                }
                opname.push_str(&d.op_type);
            }
            if generic {
                out.push_str("\"pipec.op\"");
            } else {
                quote(&mut out, &opname);
            }
            out.push('(');
            let mut absent = Vec::new();
            let mut first = true;
            for (i, inp) in d.inputs.iter().enumerate() {
                match inp {
                    Some(v) => {
                        if !first {
                            out.push_str(", ");
                        }
                        first = false;
                        out.push('%');
                        let s = self.use_name(*v, m);
                        out.push_str(&s);
                    }
                    None => absent.push(i),
                }
            }
            out.push(')');

            let mut own = Vec::new();
            if !d.name.is_empty() {
                let mut s = String::new();
                quote(&mut s, &d.name);
                own.push(("pipec.node".to_string(), s));
            }
            if any_changed {
                let mut s = String::from("[");
                for (i, n) in orig.iter().enumerate() {
                    if i > 0 {
                        s.push_str(", ");
                    }
                    quote(&mut s, n);
                }
                s.push(']');
                own.push(("pipec.names".to_string(), s));
            }
            if !absent.is_empty() {
                let mut s = String::from("array<i64: ");
                for (i, a) in absent.iter().enumerate() {
                    if i > 0 {
                        s.push_str(", ");
                    }
                    let _ = write!(s, "{a}");
                }
                s.push('>');
                own.push(("pipec.absent".to_string(), s));
            }
            if generic {
                let mut s = String::new();
                quote(&mut s, &d.op_type);
                own.push(("pipec.op_type".to_string(), s));
                let mut s = String::new();
                quote(&mut s, &d.domain);
                own.push(("pipec.domain".to_string(), s));
            }
            let hint = if d.name.is_empty() {
                d.op_type.as_str()
            } else {
                d.name.as_str()
            };
            self.dict(&mut out, &d.attrs, OP_RESERVED, own, hint);

            out.push_str(" : (");
            for (i, v) in d.inputs.iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                self.value_type(m, *v, &mut out);
            }
            out.push_str(") -> ");
            if d.outputs.len() == 1 {
                self.value_type(m, d.outputs[0], &mut out);
            } else {
                out.push('(');
                for (i, &v) in d.outputs.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.value_type(m, v, &mut out);
                }
                out.push(')');
            }
            out.push('\n');
        }

        // Return.
        out.push_str("    func.return");
        for (i, &v) in g.outputs.iter().enumerate() {
            out.push_str(if i == 0 { " %" } else { ", %" });
            let s = self.use_name(v, m);
            out.push_str(&s);
        }
        for (i, &v) in g.outputs.iter().enumerate() {
            out.push_str(if i == 0 { " : " } else { ", " });
            self.value_type(m, v, &mut out);
        }
        out.push_str("\n  }\n}\n");

        if self.opts.emit_resources && !self.blobs.is_empty() {
            out.push_str("\n{-#\n  dialect_resources: {\n    builtin: {\n");
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            let n = self.blobs.len();
            for (i, (k, align, b)) in self.blobs.iter().enumerate() {
                let _ = write!(out, "      {k}: \"0x");
                for &c in align.to_le_bytes().iter().chain(b.iter()) {
                    out.push(HEX[(c >> 4) as usize] as char);
                    out.push(HEX[(c & 15) as usize] as char);
                }
                out.push('"');
                if i + 1 < n {
                    out.push(',');
                }
                out.push('\n');
            }
            out.push_str("    }\n  }\n#-}\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_back() {
        for f in [
            0.0f32,
            -0.0,
            1.0,
            1.5,
            0.1,
            1e20,
            1e-7,
            f32::MIN_POSITIVE,
            1e-45,
            f32::MAX,
            3.4028235e38,
            -123456.79,
        ] {
            let mut s = String::new();
            fmt_f32(&mut s, f);
            assert!(s.contains('.'), "{s}");
            assert_eq!(s.parse::<f32>().map(f32::to_bits), Ok(f.to_bits()), "{s}");
        }
        let mut s = String::new();
        fmt_f32(&mut s, f32::NAN);
        assert_eq!(s, "0x7FC00000");
    }

    #[test]
    fn sanitizing() {
        assert_eq!(
            sanitize_ssa("/layer1/layer1.0/conv1/Conv_output_0"),
            "layer1_layer1.0_conv1_Conv_output_0"
        );
        assert_eq!(sanitize_ssa("onnx::Gemm_12"), "onnx__Gemm_12");
        assert_eq!(sanitize_ssa("12"), "12");
        assert_eq!(sanitize_ssa("1a"), "_1a");
        assert_eq!(sanitize_ssa(""), "v");
        assert_eq!(sanitize_key("conv1.weight"), "conv1.weight");
        assert_eq!(sanitize_key("1w"), "_1w");
        assert_eq!(sanitize_key("/a-b"), "a_b");
        assert_eq!(sanitize_key("/"), "t");
        assert!(is_key(&sanitize_key("")));
    }
}
