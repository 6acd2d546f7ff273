//! IR → ONNX export.
//!
//! Writes a `ModelProto` from a [`Module`]: nodes in `graph.order`, initializers as `raw_data`
//! (`string_data` for strings), graph inputs and outputs with their types (symbolic dims as
//! `dim_param`, spelled as the `Dim`'s `Display`), `value_info` for every intermediate value with
//! a ranked type, the opset imports and the IR version (the imported one, 8 by default).
//! `pipec.*` annotations are left out unless [`ExportOptions::keep_annotations`] is set.
//! The output is deterministic: the same module always gives the same bytes.

use super::proto::{
    attribute_type as at, tensor_shape_proto::dimension, tensor_shape_proto::Dimension, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use crate::error::{Error, Result};
use crate::ir::{
    Attr, DType, Dim, Graph, Module, Payload, TensorData, TensorType, Value, ValueDef,
    CAPTURES_ATTR,
};
use prost::Message;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// IR version written when the module has none.
pub const DEFAULT_IR_VERSION: i64 = 8;

/// Options of the exporter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Keep `pipec.*` op attributes (they are not ONNX; `onnx.checker` rejects them).
    pub keep_annotations: bool,
}

/// Build a `ModelProto` from the module with default options.
pub fn to_model_proto(m: &Module) -> Result<ModelProto> {
    to_model_proto_with(m, &ExportOptions::default())
}

/// Build a `ModelProto` from the module.
pub fn to_model_proto_with(m: &Module, opts: &ExportOptions) -> Result<ModelProto> {
    let g = &m.graph;
    let mut opsets: BTreeMap<String, i64> = m.opset_imports.clone();
    // Every domain used by a node needs an import, or the file is invalid.
    for &op in &g.order {
        let d = &g.ops[op].domain;
        if !d.is_empty() && d != "ai.onnx" {
            opsets.entry(d.clone()).or_insert(1);
        }
    }
    let ir_version = if m.ir_version > 0 {
        m.ir_version
    } else {
        DEFAULT_IR_VERSION
    };
    Ok(ModelProto {
        ir_version,
        opset_import: opsets
            .into_iter()
            .map(|(domain, version)| OperatorSetIdProto { domain, version })
            .collect(),
        producer_name: m.producer_name.clone(),
        producer_version: m.producer_version.clone(),
        graph: Some(graph_proto(g, ir_version, opts)?),
        ..Default::default()
    })
}

/// Serialize the module to ONNX protobuf bytes with default options.
pub fn to_bytes(m: &Module) -> Result<Vec<u8>> {
    to_bytes_with(m, &ExportOptions::default())
}

/// Serialize the module to ONNX protobuf bytes.
pub fn to_bytes_with(m: &Module, opts: &ExportOptions) -> Result<Vec<u8>> {
    Ok(to_model_proto_with(m, opts)?.encode_to_vec())
}

/// Write the module as an ONNX file with default options.
pub fn save(m: &Module, path: &Path) -> Result<()> {
    save_with(m, path, &ExportOptions::default())
}

/// Write the module as an ONNX file.
pub fn save_with(m: &Module, path: &Path, opts: &ExportOptions) -> Result<()> {
    let bytes = to_bytes_with(m, opts)?;
    std::fs::write(path, bytes).map_err(|e| Error::io(path, e))
}

fn graph_proto(g: &Graph, ir_version: i64, opts: &ExportOptions) -> Result<GraphProto> {
    let name = |v: &Value| g.values[*v].name.clone();
    let mut node = Vec::with_capacity(g.order.len());
    for &op in &g.order {
        let d = &g.ops[op];
        let mut attribute = Vec::with_capacity(d.attrs.len());
        for (k, a) in &d.attrs {
            if k.starts_with("pipec.") && !opts.keep_annotations {
                continue;
            }
            if k == CAPTURES_ATTR {
                continue; // the captured operands are implicit in ONNX
            }
            if let Attr::Graph(sg) = a {
                // ONNX form: the formal inputs only; captured values are read by name.
                let mut body = graph_proto(&sg.graph, ir_version, opts)?;
                body.input.truncate(sg.formal);
                attribute.push(AttributeProto {
                    name: k.clone(),
                    r#type: at::GRAPH,
                    g: Some(body),
                    ..Default::default()
                });
                continue;
            }
            let ap = attr_proto(k, a).map_err(|msg| {
                Error::node(&d.name, &d.op_type, format!("attribute '{k}': {msg}"))
            })?;
            attribute.push(ap);
        }
        let captures = d.int_attr(CAPTURES_ATTR).unwrap_or(0).max(0) as usize;
        let n_onnx = d.inputs.len().saturating_sub(captures);
        node.push(NodeProto {
            input: d.inputs[..n_onnx]
                .iter()
                .map(|i| i.as_ref().map(name).unwrap_or_default())
                .collect(),
            output: d.outputs.iter().map(name).collect(),
            name: d.name.clone(),
            op_type: d.op_type.clone(),
            attribute,
            domain: d.domain.clone(),
            ..Default::default()
        });
    }
    let mut initializer = Vec::with_capacity(g.initializers.len());
    for (v, t) in &g.initializers {
        let n = name(v);
        initializer.push(
            tensor_proto(&n, t).map_err(|msg| Error::named(&n, format!("initializer: {msg}")))?,
        );
    }
    let mut input: Vec<ValueInfoProto> = g.inputs.iter().map(|v| value_info(g, *v)).collect();
    if ir_version < 4 {
        // Before IR version 4 every initializer must also be listed as a graph input.
        input.extend(g.initializers.keys().map(|v| value_info(g, *v)));
    }
    let output = g.outputs.iter().map(|v| value_info(g, *v)).collect();
    let outs: HashSet<Value> = g.outputs.iter().copied().collect();
    let mut vi = Vec::new();
    for &op in &g.order {
        for &v in &g.ops[op].outputs {
            let vd = &g.values[v];
            if vd.ty.shape.is_some() && !outs.contains(&v) && matches!(vd.def, ValueDef::Result(..))
            {
                vi.push(value_info(g, v));
            }
        }
    }
    Ok(GraphProto {
        node,
        name: if g.name.is_empty() {
            "main".to_string()
        } else {
            g.name.clone()
        },
        initializer,
        input,
        output,
        value_info: vi,
        ..Default::default()
    })
}

fn value_info(g: &Graph, v: Value) -> ValueInfoProto {
    ValueInfoProto {
        name: g.values[v].name.clone(),
        r#type: Some(type_proto(&g.values[v].ty)),
        ..Default::default()
    }
}

/// The ONNX type of a tensor type (symbolic dims as `dim_param`).
pub fn type_proto(t: &TensorType) -> TypeProto {
    let shape = t.shape.as_ref().map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| Dimension {
                value: Some(match d {
                    Dim::Known(v) => dimension::Value::DimValue(*v),
                    Dim::Sym(_) => dimension::Value::DimParam(d.to_string()),
                }),
                ..Default::default()
            })
            .collect(),
    });
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: t.dtype.onnx_code(),
            shape,
        })),
        ..Default::default()
    }
}

/// A `TensorProto` holding the data (`raw_data`, or `string_data` for strings).
fn tensor_proto(name: &str, t: &TensorData) -> std::result::Result<TensorProto, String> {
    let mut p = TensorProto {
        name: name.to_string(),
        dims: t.dims.clone(),
        data_type: t.dtype.onnx_code(),
        ..Default::default()
    };
    match &t.payload {
        Payload::Raw(b) => p.raw_data = b.clone(),
        Payload::Strings(s) if t.dtype == DType::String => p.string_data = s.clone(),
        Payload::Strings(_) => return Err(format!("{} tensor holds strings", t.dtype)),
        Payload::Elided(key) => {
            return Err(format!(
                "the data was elided (dense_resource<{key}>), so it cannot be exported"
            ))
        }
    }
    Ok(p)
}

fn attr_proto(name: &str, a: &Attr) -> std::result::Result<AttributeProto, String> {
    let mut p = AttributeProto {
        name: name.to_string(),
        ..Default::default()
    };
    match a {
        Attr::Float(f) => {
            p.r#type = at::FLOAT;
            p.f = Some(*f);
        }
        Attr::Int(i) => {
            p.r#type = at::INT;
            p.i = Some(*i);
        }
        Attr::String(s) => {
            p.r#type = at::STRING;
            p.s = Some(s.clone().into_bytes().into());
        }
        Attr::Tensor(t) => {
            p.r#type = at::TENSOR;
            p.t = Some(tensor_proto("", t)?);
        }
        Attr::Floats(v) => {
            p.r#type = at::FLOATS;
            p.floats = v.clone();
        }
        Attr::Ints(v) => {
            p.r#type = at::INTS;
            p.ints = v.clone();
        }
        Attr::Strings(v) => {
            p.r#type = at::STRINGS;
            p.strings = v.iter().map(|s| s.clone().into_bytes().into()).collect();
        }
        Attr::Graph(_) => return Err("a subgraph is exported with its node".into()),
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolic_dims_become_dim_params() {
        let b = Dim::sym("batch");
        let t = TensorType::new(
            DType::F16,
            vec![Dim::Known(2).mul(&b).unwrap(), Dim::Known(0)],
        );
        let p = type_proto(&t);
        let Some(type_proto::Value::TensorType(tt)) = p.value else {
            panic!("not a tensor type")
        };
        assert_eq!(tt.elem_type, 10);
        let dims: Vec<_> = tt.shape.unwrap().dim.into_iter().map(|d| d.value).collect();
        assert_eq!(
            dims,
            vec![
                Some(dimension::Value::DimParam("2*batch".into())),
                Some(dimension::Value::DimValue(0))
            ]
        );
        let p = type_proto(&TensorType::unranked(DType::I64));
        let Some(type_proto::Value::TensorType(tt)) = p.value else {
            panic!("not a tensor type")
        };
        assert!(tt.shape.is_none());
    }

    #[test]
    fn attributes_carry_their_type() {
        let a = attr_proto("k", &Attr::Int(0)).unwrap();
        assert_eq!((a.r#type, a.i), (at::INT, Some(0)));
        let a = attr_proto("s", &Attr::Strings(vec!["x".into()])).unwrap();
        assert_eq!(a.r#type, at::STRINGS);
        assert_eq!(a.strings[0].as_ref(), b"x");
        let t = TensorData {
            dtype: DType::F32,
            dims: vec![1],
            payload: Payload::Elided("k0".into()),
        };
        assert!(attr_proto("value", &Attr::Tensor(t))
            .unwrap_err()
            .contains("k0"));
    }
}
