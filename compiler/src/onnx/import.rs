//! ONNX → IR import.
//!
//! [`load`] memory-maps the model file and wraps the mapping in a [`Bytes`], so every initializer's
//! `raw_data` (and every external-data slice) is a view into a mapping: weights are never copied.
//! [`from_bytes`] does the same from any buffer.
//!
//! The importer checks what it relies on and names the culprit in every error: undefined inputs,
//! names defined twice, cycles, initializers whose data does not match their dims (checked against
//! the bytes actually present before anything proportional to the claimed size is allocated),
//! unsupported types, subgraph attributes, sparse initializers and external-data paths that leave
//! the model's folder. It does not run shape inference: op results without a declared type get the
//! placeholder `TensorType::unranked(DType::F32)`.

use super::proto::{
    attribute_type as at, tensor_shape_proto::dimension, type_proto, AttributeProto, GraphProto,
    ModelProto, NodeProto, TensorProto, TypeProto, DATA_LOCATION_DEFAULT, DATA_LOCATION_EXTERNAL,
};
use crate::error::{Error, Result};
use crate::ir::{
    numel, Attr, DType, Dim, Graph, Module, OpData, Payload, Subgraph, TensorData, TensorType,
    Value, CAPTURES_ATTR,
};
use bytes::Bytes;
use prost::Message;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

/// Load an ONNX model file. The file is memory-mapped; initializers share the mapping.
/// External data is resolved relative to the file's folder.
pub fn load(path: &Path) -> Result<Module> {
    let display = path.display().to_string();
    let buf = map_file(path)?;
    if buf.is_empty() {
        return Err(decode_err(&display, "file is empty"));
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    from_bytes(buf, Some(&dir), &display)
}

/// Import an ONNX model from an in-memory buffer. Initializer data is sliced from `buf` (no copy).
/// `model_dir` is the folder external data is resolved against (`None`: external data is an
/// error); `display` names the model in error messages (usually its path).
pub fn from_bytes(buf: Bytes, model_dir: Option<&Path>, display: &str) -> Result<Module> {
    if buf.is_empty() {
        return Err(decode_err(display, "file is empty"));
    }
    let model = ModelProto::decode(buf).map_err(|e| decode_err(display, e.to_string()))?;
    from_model_proto(&model, model_dir, display)
}

/// Import an already decoded [`ModelProto`] (see [`from_bytes`] for the arguments).
pub fn from_model_proto(
    model: &ModelProto,
    model_dir: Option<&Path>,
    display: &str,
) -> Result<Module> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| decode_err(display, "the model has no graph"))?;
    let mut opset_imports = BTreeMap::new();
    for o in &model.opset_import {
        let domain = if o.domain == "ai.onnx" {
            ""
        } else {
            o.domain.as_str()
        };
        opset_imports.insert(domain.to_string(), o.version);
    }
    let mut ext = ExternalFiles {
        dir: model_dir.map(Path::to_path_buf),
        files: HashMap::new(),
    };
    let g = import_graph(graph, &mut ext)?;
    Ok(Module {
        graph: g,
        opset_imports,
        ir_version: model.ir_version,
        producer_name: model.producer_name.clone(),
        producer_version: model.producer_version.clone(),
        attrs: BTreeMap::new(),
    })
}

fn decode_err(display: &str, msg: impl Into<String>) -> Error {
    Error::Decode {
        path: PathBuf::from(display),
        msg: msg.into(),
    }
}

/// Memory-map a whole file as `Bytes` (an empty file gives an empty buffer).
fn map_file(path: &Path) -> Result<Bytes> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the mapping is read-only. As with every mmap-based loader, the file must not be
    // truncated or modified while the module is alive; that is the caller's contract.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Bytes::from_owner(map))
}

/// External-data files, each mapped once.
struct ExternalFiles {
    dir: Option<PathBuf>,
    files: HashMap<PathBuf, Bytes>,
}

impl ExternalFiles {
    /// The bytes of `location` (relative to the model's folder), checked to stay inside it.
    fn file(&mut self, location: &str) -> std::result::Result<Bytes, String> {
        let rel = Path::new(location);
        if location.is_empty() {
            return Err("external data has an empty location".into());
        }
        if rel.is_absolute() || rel.has_root() {
            return Err(format!(
                "external data location '{location}' is an absolute path"
            ));
        }
        if rel.components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::Prefix(_) | Component::RootDir
            )
        }) {
            return Err(format!(
                "external data location '{location}' contains '..' (it must stay inside the model's folder)"
            ));
        }
        let dir = self.dir.as_ref().ok_or_else(|| {
            format!("external data location '{location}' cannot be resolved: the model's folder is unknown")
        })?;
        let canon_dir = dir.canonicalize().map_err(|e| {
            format!(
                "external data location '{location}': model folder {}: {e}",
                dir.display()
            )
        })?;
        let full = dir.join(rel);
        let canon = full.canonicalize().map_err(|e| {
            format!(
                "external data location '{location}': {}: {e}",
                full.display()
            )
        })?;
        if !canon.starts_with(&canon_dir) {
            return Err(format!(
                "external data location '{location}' resolves to {} outside the model's folder",
                canon.display()
            ));
        }
        if let Some(b) = self.files.get(&canon) {
            return Ok(b.clone());
        }
        let b =
            map_file(&canon).map_err(|e| format!("external data location '{location}': {e}"))?;
        self.files.insert(canon, b.clone());
        Ok(b)
    }
}

/// Fresh names for dims with neither value nor param (`unk__N`), skipping names the file
/// already uses as `dim_param` (onnxruntime's shape inference writes `unk__N` itself).
struct Fresh {
    next: usize,
    taken: HashSet<String>,
}

impl Fresh {
    fn new(gp: &GraphProto) -> Fresh {
        let mut taken = HashSet::new();
        for vi in gp.input.iter().chain(&gp.output).chain(&gp.value_info) {
            if let Some(TypeProto {
                value:
                    Some(type_proto::Value::TensorType(type_proto::Tensor { shape: Some(s), .. })),
                ..
            }) = &vi.r#type
            {
                for d in &s.dim {
                    if let Some(dimension::Value::DimParam(p)) = &d.value {
                        taken.insert(p.clone());
                    }
                }
            }
        }
        Fresh { next: 0, taken }
    }

    fn next(&mut self) -> Dim {
        loop {
            let name = format!("unk__{}", self.next);
            self.next += 1;
            if !self.taken.contains(&name) {
                return Dim::sym(name);
            }
        }
    }
}

/// Convert a declared ONNX type. `Ok(None)`: not a tensor type / no element type.
fn tensor_type(
    tp: &TypeProto,
    fresh: &mut Fresh,
) -> std::result::Result<Option<TensorType>, String> {
    let t = match &tp.value {
        Some(type_proto::Value::TensorType(t)) => t,
        Some(_) => {
            return Err(
                "only tensor types are supported (not sequence, map, optional or sparse)".into(),
            )
        }
        None => return Ok(None),
    };
    if t.elem_type == 0 {
        return Ok(None);
    }
    let dtype = DType::from_onnx(t.elem_type)
        .ok_or_else(|| format!("unsupported element type code {}", t.elem_type))?;
    let Some(shape) = &t.shape else {
        return Ok(Some(TensorType::unranked(dtype)));
    };
    let dims = shape
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::Known(*v),
            Some(dimension::Value::DimParam(p)) if !p.is_empty() => parse_dim_param(p),
            _ => fresh.next(),
        })
        .collect();
    Ok(Some(TensorType::new(dtype, dims)))
}

/// A `dim_param`: parsed as a product (`2*batch`) when it reads back identically, else one symbol.
fn parse_dim_param(p: &str) -> Dim {
    match Dim::parse(p) {
        Some(d @ Dim::Sym(_)) if d.to_string() == p => d,
        _ => Dim::sym(p),
    }
}

fn import_graph(gp: &GraphProto, ext: &mut ExternalFiles) -> Result<Graph> {
    import_scoped(gp, ext, None).map(|(g, _)| g)
}

/// Types of the values of the enclosing graphs a subgraph may read, by name.
type Outer<'a> = &'a dyn Fn(&str) -> Option<TensorType>;

/// Import a graph; for a subgraph, `outer` resolves names of enclosing graphs. Returns the graph
/// and the names it captured from enclosing graphs (appended to its inputs, see
/// [`crate::ir::Subgraph`]).
fn import_scoped(
    gp: &GraphProto,
    ext: &mut ExternalFiles,
    outer: Option<Outer>,
) -> Result<(Graph, Vec<String>)> {
    if let Some(s) = gp.sparse_initializer.first() {
        let name = s.values.as_ref().map(|v| v.name.as_str()).unwrap_or("");
        return Err(Error::named(name, "sparse initializers are not supported"));
    }
    let mut g = Graph::new(gp.name.clone());
    let mut fresh = Fresh::new(gp);
    // Every defined name -> value, and a description of its definer for duplicate errors.
    let mut by_name: HashMap<String, Value> = HashMap::new();

    for (i, t) in gp.initializer.iter().enumerate() {
        if t.name.is_empty() {
            return Err(Error::msg(format!("initializer #{i} has no name")));
        }
        if by_name.contains_key(&t.name) {
            return Err(Error::named(&t.name, "two initializers have this name"));
        }
        let data =
            tensor_data(t, ext).map_err(|m| Error::named(&t.name, format!("initializer: {m}")))?;
        let v = g.add_initializer(t.name.clone(), data);
        by_name.insert(t.name.clone(), v);
    }
    let init_names: HashSet<&str> = gp.initializer.iter().map(|t| t.name.as_str()).collect();
    let mut seen_inputs = HashSet::new();
    for inp in &gp.input {
        if inp.name.is_empty() {
            return Err(Error::msg("a graph input has no name"));
        }
        if !seen_inputs.insert(inp.name.as_str()) {
            return Err(Error::named(&inp.name, "graph input is listed twice"));
        }
        if init_names.contains(inp.name.as_str()) {
            continue; // an initializer listed as input (older exporters): it stays a constant
        }
        let ty = inp
            .r#type
            .as_ref()
            .map(|t| tensor_type(t, &mut fresh))
            .transpose()
            .map_err(|m| Error::named(&inp.name, format!("graph input: {m}")))?
            .flatten()
            .ok_or_else(|| Error::named(&inp.name, "graph input has no tensor type"))?;
        let v = g.add_input(inp.name.clone(), ty);
        by_name.insert(inp.name.clone(), v);
    }

    // Declared types of intermediate values and outputs.
    let mut declared: HashMap<&str, TensorType> = HashMap::new();
    for vi in &gp.value_info {
        if let Some(tp) = &vi.r#type {
            // value_info is only a hint: a type we cannot represent is dropped.
            if let Ok(Some(t)) = tensor_type(tp, &mut fresh) {
                declared.insert(vi.name.as_str(), t);
            }
        }
    }
    for out in &gp.output {
        if let Some(tp) = &out.r#type {
            let t = tensor_type(tp, &mut fresh)
                .map_err(|m| Error::named(&out.name, format!("graph output: {m}")))?;
            if let Some(t) = t {
                declared.insert(out.name.as_str(), t);
            }
        }
    }

    // Pass 1: create every op with its results (nodes may be out of order in real files).
    let mut node_names: HashSet<String> = HashSet::new();
    let mut subgraphs: Vec<(usize, &AttributeProto)> = Vec::new();
    let mut ops = Vec::with_capacity(gp.node.len());
    for (idx, n) in gp.node.iter().enumerate() {
        let name = unique_node_name(n, idx, &mut node_names);
        let data = OpData {
            name: name.clone(),
            op_type: n.op_type.clone(),
            domain: if n.domain == "ai.onnx" {
                String::new()
            } else {
                n.domain.clone()
            },
            inputs: Vec::new(),
            outputs: Vec::new(),
            attrs: import_attrs(n, &name, ext)?,
        };
        if n.op_type.is_empty() {
            return Err(Error::node(&name, "", "node has no op type"));
        }
        for a in &n.attribute {
            if is_graph_attr(a) {
                subgraphs.push((idx, a));
            }
        }
        // Trailing omitted outputs are dropped; inner ones get a generated unused name.
        let keep = n
            .output
            .iter()
            .rposition(|o| !o.is_empty())
            .map_or(0, |p| p + 1);
        let mut results = Vec::with_capacity(keep);
        for (i, o) in n.output[..keep].iter().enumerate() {
            let oname = if o.is_empty() {
                format!("{name}__unused_output_{i}")
            } else {
                o.clone()
            };
            if by_name.contains_key(&oname) || results.iter().any(|(r, _)| *r == oname) {
                return Err(Error::node(
                    &name,
                    &n.op_type,
                    format!("output '{oname}' is already defined (by another node, a graph input or an initializer)"),
                ));
            }
            let ty = declared
                .get(oname.as_str())
                .cloned()
                .unwrap_or_else(|| TensorType::unranked(DType::F32));
            results.push((oname, ty));
        }
        let (op, outs) = g.add_op(data, results);
        for &v in &outs {
            by_name.insert(g.values[v].name.clone(), v);
        }
        ops.push(op);
    }
    // Subgraphs (Loop bodies, If branches), once every name of this graph is defined: the names
    // they read from this graph (or, through it, from enclosing ones) become extra operands.
    let mut extra: HashMap<usize, Vec<String>> = HashMap::new();
    for (idx, a) in subgraphs {
        let op = ops[idx];
        let n = &gp.node[idx];
        let node = g.ops[op].name.clone();
        let sub = match (&a.g, a.graphs.is_empty()) {
            (Some(sub), true) if a.r#type == at::GRAPH || a.r#type == at::UNDEFINED => sub,
            _ => {
                return Err(Error::node(
                    &node,
                    &n.op_type,
                    format!(
                        "attribute '{}': only single-graph subgraph attributes are supported",
                        a.name
                    ),
                ))
            }
        };
        let (body, captured) = {
            let resolve = |name: &str| -> Option<TensorType> {
                match by_name.get(name) {
                    Some(v) => Some(g.ty(*v).clone()),
                    None => outer.and_then(|o| o(name)),
                }
            };
            let resolve: Outer = &resolve;
            import_scoped(sub, ext, Some(resolve)).map_err(|e| {
                Error::node(&node, &n.op_type, format!("subgraph '{}': {e}", a.name))
            })?
        };
        let formal = body.inputs.len() - captured.len();
        let list = extra.entry(idx).or_default();
        let mut pos = Vec::with_capacity(captured.len());
        for c in captured {
            match list.iter().position(|x| *x == c) {
                Some(p) => pos.push(p),
                None => {
                    pos.push(list.len());
                    list.push(c);
                }
            }
        }
        g.ops[op].attrs.insert(
            a.name.clone(),
            Attr::Graph(Subgraph {
                graph: std::sync::Arc::new(body),
                formal,
                captured: pos,
            }),
        );
    }
    // Pass 2: resolve operands (a name of an enclosing graph is captured: a new graph input).
    let mut captured: Vec<String> = Vec::new();
    let mut resolve = |g: &mut Graph, by_name: &mut HashMap<String, Value>, i: &str| {
        if let Some(v) = by_name.get(i) {
            return Some(*v);
        }
        let ty = outer?(i)?;
        let v = g.add_input(i.to_string(), ty);
        by_name.insert(i.to_string(), v);
        captured.push(i.to_string());
        Some(v)
    };
    for (idx, (n, &op)) in gp.node.iter().zip(&ops).enumerate() {
        let mut inputs = Vec::with_capacity(n.input.len());
        let caps = extra.remove(&idx).unwrap_or_default();
        for i in n.input.iter().chain(&caps) {
            if i.is_empty() {
                inputs.push(None);
                continue;
            }
            let v = resolve(&mut g, &mut by_name, i).ok_or_else(|| {
                Error::node(
                    &g.ops[op].name,
                    &n.op_type,
                    format!("input '{i}' is not produced by any node, graph input or initializer"),
                )
            })?;
            inputs.push(Some(v));
        }
        if !caps.is_empty() {
            g.ops[op]
                .attrs
                .insert(CAPTURES_ATTR.into(), Attr::Int(caps.len() as i64));
        }
        g.ops[op].inputs = inputs;
    }
    for out in &gp.output {
        let v = resolve(&mut g, &mut by_name, &out.name).ok_or_else(|| {
            Error::named(
                &out.name,
                "graph output is not produced by any node, graph input or initializer",
            )
        })?;
        g.outputs.push(v);
    }
    g.topo_sort()?;
    Ok((g, captured))
}

fn is_graph_attr(a: &AttributeProto) -> bool {
    a.g.is_some() || !a.graphs.is_empty() || matches!(a.r#type, at::GRAPH | at::GRAPHS)
}

/// The node's name, or `<op_type>_<index>` if empty; made unique with a numeric suffix.
fn unique_node_name(n: &NodeProto, idx: usize, used: &mut HashSet<String>) -> String {
    let base = if n.name.is_empty() {
        format!("{}_{idx}", n.op_type)
    } else {
        n.name.clone()
    };
    let mut name = base.clone();
    let mut k = 1;
    while used.contains(&name) {
        name = format!("{base}_{k}");
        k += 1;
    }
    used.insert(name.clone());
    name
}

fn import_attrs(
    n: &NodeProto,
    node: &str,
    ext: &mut ExternalFiles,
) -> Result<BTreeMap<String, Attr>> {
    let mut attrs = BTreeMap::new();
    for a in &n.attribute {
        let err = |m: String| Error::node(node, &n.op_type, format!("attribute '{}': {m}", a.name));
        if is_graph_attr(a) {
            continue; // imported by `import_scoped` once the graph's names are known
        }
        if !a.ref_attr_name.is_empty() {
            return Err(err(
                "attribute references (function bodies) are not supported".into(),
            ));
        }
        let v = attr_value(a, ext).map_err(err)?;
        if attrs.insert(a.name.clone(), v).is_some() {
            return Err(Error::node(
                node,
                &n.op_type,
                format!("attribute '{}' is given twice", a.name),
            ));
        }
    }
    Ok(attrs)
}

fn utf8(b: &Bytes) -> std::result::Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "string is not valid UTF-8".to_string())
}

fn attr_value(a: &AttributeProto, ext: &mut ExternalFiles) -> std::result::Result<Attr, String> {
    let ty = if a.r#type != at::UNDEFINED {
        a.r#type
    } else if a.f.is_some() {
        at::FLOAT
    } else if a.i.is_some() {
        at::INT
    } else if a.s.is_some() {
        at::STRING
    } else if a.t.is_some() {
        at::TENSOR
    } else if !a.floats.is_empty() {
        at::FLOATS
    } else if !a.ints.is_empty() {
        at::INTS
    } else if !a.strings.is_empty() {
        at::STRINGS
    } else {
        return Err("attribute has no type and no value".into());
    };
    Ok(match ty {
        at::FLOAT => Attr::Float(a.f.unwrap_or(0.0)),
        at::INT => Attr::Int(a.i.unwrap_or(0)),
        at::STRING => Attr::String(a.s.as_ref().map(utf8).transpose()?.unwrap_or_default()),
        at::TENSOR => {
            let t = a.t.as_ref().ok_or("tensor attribute has no tensor")?;
            Attr::Tensor(tensor_data(t, ext)?)
        }
        at::FLOATS => Attr::Floats(a.floats.clone()),
        at::INTS => Attr::Ints(a.ints.clone()),
        at::STRINGS => Attr::Strings(
            a.strings
                .iter()
                .map(utf8)
                .collect::<std::result::Result<_, _>>()?,
        ),
        at::TENSORS => return Err("tensor-list attributes are not supported".into()),
        at::SPARSE_TENSOR | at::SPARSE_TENSORS => {
            return Err("sparse tensor attributes are not supported".into())
        }
        at::TYPE_PROTO | at::TYPE_PROTOS => return Err("type attributes are not supported".into()),
        other => return Err(format!("unknown attribute type code {other}")),
    })
}

/// Convert a `TensorProto` to `TensorData`. All size checks happen against the bytes present
/// before any buffer proportional to the element count is allocated.
fn tensor_data(
    t: &TensorProto,
    ext: &mut ExternalFiles,
) -> std::result::Result<TensorData, String> {
    if t.data_type == 0 {
        return Err("tensor has no data type".into());
    }
    let dtype = DType::from_onnx(t.data_type)
        .ok_or_else(|| format!("unsupported data type code {}", t.data_type))?;
    let dims = t.dims.clone();
    if let Some(d) = dims.iter().find(|d| **d < 0) {
        return Err(format!("negative dimension {d} in dims {dims:?}"));
    }
    let n = numel(&dims)
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or_else(|| format!("dims {dims:?}: element count overflows i64"))?;
    if t.segment.is_some() {
        return Err("segmented tensors are not supported".into());
    }
    let mismatch = |have: std::string::String| {
        format!("{dtype} tensor with dims {dims:?} needs {n} elements but {have}")
    };

    if t.data_location == DATA_LOCATION_EXTERNAL {
        if dtype == DType::String {
            return Err("string tensors cannot use external data".into());
        }
        return external_data(t, dtype, dims.clone(), n, ext);
    }
    if t.data_location != DATA_LOCATION_DEFAULT {
        return Err(format!("unknown data_location {}", t.data_location));
    }
    if dtype == DType::String {
        if t.string_data.len() as u64 != n {
            return Err(mismatch(format!("string_data has {}", t.string_data.len())));
        }
        return Ok(TensorData {
            dtype,
            dims,
            payload: Payload::Strings(t.string_data.clone()),
        });
    }
    let want = dtype
        .bytes_for(n)
        .ok_or_else(|| format!("dims {dims:?}: byte size overflows"))?;
    if !t.raw_data.is_empty() {
        if t.raw_data.len() as u64 != want {
            return Err(mismatch(format!(
                "raw_data has {} bytes instead of {want}",
                t.raw_data.len()
            )));
        }
        return Ok(TensorData {
            dtype,
            dims,
            payload: Payload::Raw(t.raw_data.clone()),
        });
    }
    use DType::*;
    // (number of typed values present, number expected): checked before converting.
    let (have, expect, field) = match dtype {
        F32 => (t.float_data.len(), n, "float_data"),
        Complex64 => (t.float_data.len(), n.saturating_mul(2), "float_data"),
        F64 => (t.double_data.len(), n, "double_data"),
        Complex128 => (t.double_data.len(), n.saturating_mul(2), "double_data"),
        I64 => (t.int64_data.len(), n, "int64_data"),
        U32 | U64 => (t.uint64_data.len(), n, "uint64_data"),
        U4 | I4 => (t.int32_data.len(), n.div_ceil(2), "int32_data"),
        _ => (t.int32_data.len(), n, "int32_data"),
    };
    if have as u64 != expect {
        let what = if have == 0 && t.raw_data.is_empty() {
            "the tensor has no data".to_string()
        } else {
            format!("{field} has {have} values instead of {expect}")
        };
        return Err(mismatch(what));
    }
    // `want` is now bounded by the data actually decoded (at most 8 bytes per value present).
    let mut out: Vec<u8> = Vec::with_capacity(want as usize);
    match dtype {
        F32 | Complex64 => t
            .float_data
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        F64 | Complex128 => t
            .double_data
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        I64 => t
            .int64_data
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        U32 => t
            .uint64_data
            .iter()
            .for_each(|v| out.extend_from_slice(&(*v as u32).to_le_bytes())),
        U64 => t
            .uint64_data
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        I32 => t
            .int32_data
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        I16 | U16 | F16 | BF16 => t
            .int32_data
            .iter()
            .for_each(|v| out.extend_from_slice(&(*v as u16).to_le_bytes())),
        Bool => t
            .int32_data
            .iter()
            .for_each(|v| out.push(u8::from(*v != 0))),
        // 8-bit types (one value per int32) and 4-bit types (one packed byte per int32).
        _ => t.int32_data.iter().for_each(|v| out.push(*v as u8)),
    }
    if out.len() as u64 != want {
        return Err(mismatch(format!(
            "the typed data converts to {} bytes instead of {want}",
            out.len()
        )));
    }
    Ok(TensorData {
        dtype,
        dims,
        payload: Payload::Raw(Bytes::from(out)),
    })
}

fn external_data(
    t: &TensorProto,
    dtype: DType,
    dims: Vec<i64>,
    n: u64,
    ext: &mut ExternalFiles,
) -> std::result::Result<TensorData, String> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for kv in &t.external_data {
        match kv.key.as_str() {
            "location" => location = Some(kv.value.as_str()),
            "offset" => {
                offset = kv
                    .value
                    .parse()
                    .map_err(|_| format!("external data offset '{}' is not a number", kv.value))?
            }
            "length" => {
                length =
                    Some(kv.value.parse::<u64>().map_err(|_| {
                        format!("external data length '{}' is not a number", kv.value)
                    })?)
            }
            _ => {}
        }
    }
    let location = location.ok_or("external data has no 'location' key")?;
    let file = ext.file(location)?;
    let flen = file.len() as u64;
    if offset > flen {
        return Err(format!(
            "external data location '{location}': offset {offset} is past the end of the file ({flen} bytes)"
        ));
    }
    let length = length.unwrap_or(flen - offset);
    let end = offset
        .checked_add(length)
        .filter(|e| *e <= flen)
        .ok_or_else(|| {
            format!(
                "external data location '{location}': offset {offset} + length {length} is past the end of the file ({flen} bytes)"
            )
        })?;
    let want = dtype.bytes_for(n).ok_or("byte size overflows")?;
    if length != want {
        return Err(format!(
            "external data location '{location}': {length} bytes but {dtype} {dims:?} needs {want}"
        ));
    }
    // Both bounds are <= flen, which is a usize.
    let raw = file.slice(offset as usize..end as usize);
    Ok(TensorData {
        dtype,
        dims,
        payload: Payload::Raw(raw),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::proto::StringStringEntryProto;

    fn no_ext() -> ExternalFiles {
        ExternalFiles {
            dir: None,
            files: HashMap::new(),
        }
    }

    #[test]
    fn dim_params() {
        assert_eq!(parse_dim_param("batch"), Dim::sym("batch"));
        let two_b = Dim::Known(2).mul(&Dim::sym("batch")).unwrap();
        assert_eq!(parse_dim_param("2*batch"), two_b);
        // Not in canonical form: kept as one opaque symbol so it exports back unchanged.
        assert_eq!(parse_dim_param("seq*batch"), Dim::sym("seq*batch"));
        assert_eq!(parse_dim_param("s + 1"), Dim::sym("s + 1"));
        assert_eq!(parse_dim_param("6"), Dim::sym("6"));
    }

    #[test]
    fn typed_int4_and_complex() {
        let t = TensorProto {
            data_type: DType::I4.onnx_code(),
            dims: vec![3],
            int32_data: vec![0x21, 0x03],
            ..Default::default()
        };
        let d = tensor_data(&t, &mut no_ext()).unwrap();
        assert_eq!(d.raw().unwrap().as_ref(), &[0x21, 0x03]);
        let t = TensorProto {
            data_type: DType::Complex64.onnx_code(),
            dims: vec![1],
            float_data: vec![1.0, 2.0],
            ..Default::default()
        };
        assert_eq!(tensor_data(&t, &mut no_ext()).unwrap().byte_len(), 8);
        let t = TensorProto {
            data_type: DType::Complex64.onnx_code(),
            dims: vec![2],
            float_data: vec![1.0, 2.0],
            ..Default::default()
        };
        let e = tensor_data(&t, &mut no_ext()).unwrap_err();
        assert!(e.contains("float_data has 2 values instead of 4"), "{e}");
    }

    #[test]
    fn attribute_type_inferred_when_missing() {
        let a = AttributeProto {
            name: "axis".into(),
            i: Some(-1),
            ..Default::default()
        };
        assert_eq!(attr_value(&a, &mut no_ext()).unwrap(), Attr::Int(-1));
        let a = AttributeProto {
            name: "perm".into(),
            ints: vec![0, 2, 1],
            ..Default::default()
        };
        assert_eq!(
            attr_value(&a, &mut no_ext()).unwrap(),
            Attr::Ints(vec![0, 2, 1])
        );
        let a = AttributeProto {
            name: "mode".into(),
            r#type: at::STRING,
            s: Some(Bytes::from_static(&[0xff, 0xfe])),
            ..Default::default()
        };
        assert!(attr_value(&a, &mut no_ext()).unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn external_without_model_dir_is_an_error() {
        let t = TensorProto {
            data_type: 1,
            dims: vec![1],
            data_location: DATA_LOCATION_EXTERNAL,
            external_data: vec![StringStringEntryProto {
                key: "location".into(),
                value: "w.bin".into(),
            }],
            ..Default::default()
        };
        let e = tensor_data(&t, &mut no_ext()).unwrap_err();
        assert!(
            e.contains("w.bin") && e.contains("folder is unknown"),
            "{e}"
        );
    }

    #[test]
    fn external_files_are_mapped_once() {
        let dir = std::env::temp_dir().join(format!("pipec-onnx-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w.bin"), [7u8; 32]).unwrap();
        let mut ext = ExternalFiles {
            dir: Some(dir.clone()),
            files: HashMap::new(),
        };
        let a = ext.file("w.bin").unwrap();
        let b = ext.file("./w.bin").unwrap();
        assert_eq!(a.as_ptr(), b.as_ptr());
        assert_eq!(ext.files.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
