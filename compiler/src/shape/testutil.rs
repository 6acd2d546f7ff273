//! Helpers for the unit tests of the rule families.

use super::{infer_op, SymbolicValues};
use crate::error::Result;
use crate::ir::{Attr, DType, Dim, Graph, Op, OpData, TensorData, TensorType, Value};

/// A graph under construction.
pub struct T {
    pub g: Graph,
    n: usize,
}

/// Parse `"batch,3"`.
pub fn dims(s: &str) -> Vec<Dim> {
    if s.is_empty() {
        return vec![];
    }
    s.split(',').filter_map(|d| Dim::parse(d.trim())).collect()
}

/// `"batch,3"` text of a type's shape (`?` if unranked).
pub fn show(t: &TensorType) -> String {
    match &t.shape {
        None => "?".into(),
        Some(s) => s
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

impl T {
    pub fn new() -> Self {
        T {
            g: Graph::new("t"),
            n: 0,
        }
    }
    pub fn input(&mut self, dt: DType, shape: &str) -> Value {
        self.n += 1;
        self.g
            .add_input(format!("in{}", self.n), TensorType::new(dt, dims(shape)))
    }
    pub fn ints(&mut self, vals: &[i64]) -> Value {
        self.n += 1;
        self.g.add_initializer(
            format!("c{}", self.n),
            TensorData::from_i64(vec![vals.len() as i64], vals),
        )
    }
    pub fn scalar(&mut self, v: i64) -> Value {
        self.n += 1;
        self.g
            .add_initializer(format!("c{}", self.n), TensorData::from_i64(vec![], &[v]))
    }
    pub fn op(
        &mut self,
        op_type: &str,
        inputs: &[Option<Value>],
        attrs: &[(&str, Attr)],
        nout: usize,
    ) -> Op {
        self.n += 1;
        let name = format!("{op_type}_{}", self.n);
        let data = OpData {
            name: name.clone(),
            op_type: op_type.into(),
            inputs: inputs.to_vec(),
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        };
        let res = (0..nout)
            .map(|i| (format!("{name}:{i}"), TensorType::unranked(DType::F32)))
            .collect();
        self.g.add_op(data, res).0
    }
    /// Infer one op (no tracked values).
    pub fn infer(&self, op: Op, opset: i64) -> Result<Vec<TensorType>> {
        infer_op(&self.g, op, opset, &SymbolicValues::new())
    }
    /// Infer one op and return its result shapes as text.
    pub fn shapes(&self, op: Op, opset: i64) -> Vec<String> {
        match self.infer(op, opset) {
            Ok(t) => t.iter().map(show).collect(),
            Err(e) => vec![format!("error: {e}")],
        }
    }
}
