//! The graph: SSA values and ops in arenas (index types, no pointers), program order kept apart
//! from definitions (Cranelift's `DataFlowGraph` vs `Layout`).

use super::tensor::{Attr, TensorData};
use super::types::TensorType;
use crate::error::{Error, Result};
use cranelift_entity::{entity_impl, PrimaryMap, SecondaryMap};
use indexmap::IndexMap;
use std::collections::{BTreeMap, HashMap};

/// An SSA value (a tensor).
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(u32);
entity_impl!(Value, "v");

/// An operation (an ONNX node).
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Op(u32);
entity_impl!(Op, "op");

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDef {
    /// The n-th graph input.
    Input(u32),
    /// A constant initializer (data in `Graph::initializers`).
    Initializer,
    /// The n-th result of an op.
    Result(Op, u32),
}

/// Definition of a value.
#[derive(Clone, Debug)]
pub struct ValueData {
    /// The ONNX name of the value (unique in the graph).
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDef,
}

/// Definition of an op.
#[derive(Clone, Debug, Default)]
pub struct OpData {
    /// ONNX node name (may be empty in ONNX; the importer fills in a unique one).
    pub name: String,
    /// ONNX op type (`Conv`, `MatMul`, ...).
    pub op_type: String,
    /// ONNX domain (`""` is the default domain `ai.onnx`).
    pub domain: String,
    /// Operands; `None` for an omitted optional input (ONNX's empty name).
    pub inputs: Vec<Option<Value>>,
    pub outputs: Vec<Value>,
    /// ONNX attributes and `pipec.*` annotations, sorted by name.
    pub attrs: BTreeMap<String, Attr>,
}

impl OpData {
    /// How errors name this op: its node name, or, when it has none (textual IR without
    /// `pipec.node`), its first result as the text shows it (`%y`).
    pub fn display_name(&self, g: &Graph) -> String {
        match (self.name.is_empty(), self.outputs.first()) {
            (false, _) => self.name.clone(),
            (true, Some(&v)) if g.values.is_valid(v) => format!("%{}", g.values[v].name),
            (true, _) => "<unnamed>".to_string(),
        }
    }
    pub fn attr(&self, name: &str) -> Option<&Attr> {
        self.attrs.get(name)
    }
    pub fn int_attr(&self, name: &str) -> Option<i64> {
        self.attrs.get(name).and_then(Attr::as_int)
    }
    pub fn float_attr(&self, name: &str) -> Option<f32> {
        self.attrs.get(name).and_then(Attr::as_float)
    }
    pub fn ints_attr(&self, name: &str) -> Option<&[i64]> {
        self.attrs.get(name).and_then(Attr::as_ints)
    }
    pub fn str_attr(&self, name: &str) -> Option<&str> {
        self.attrs.get(name).and_then(Attr::as_str)
    }
    /// The i-th operand, if present.
    pub fn input(&self, i: usize) -> Option<Value> {
        self.inputs.get(i).copied().flatten()
    }
}

/// One function: the model's main graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    pub values: PrimaryMap<Value, ValueData>,
    pub ops: PrimaryMap<Op, OpData>,
    /// Live ops in program order (a topological order once verified). Ops not listed are dead.
    pub order: Vec<Op>,
    pub inputs: Vec<Value>,
    pub outputs: Vec<Value>,
    /// Constant initializers in ONNX order, sharing the imported buffers.
    pub initializers: IndexMap<Value, TensorData>,
}

impl Graph {
    /// New empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Add a graph input.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> Value {
        let idx = self.inputs.len() as u32;
        let v = self.values.push(ValueData {
            name: name.into(),
            ty,
            def: ValueDef::Input(idx),
        });
        self.inputs.push(v);
        v
    }

    /// Add an initializer; its type comes from the data.
    pub fn add_initializer(&mut self, name: impl Into<String>, data: TensorData) -> Value {
        let ty = TensorType::known(data.dtype, &data.dims);
        let v = self.values.push(ValueData {
            name: name.into(),
            ty,
            def: ValueDef::Initializer,
        });
        self.initializers.insert(v, data);
        v
    }

    /// Append an op at the end of the program order, creating its result values.
    pub fn add_op(
        &mut self,
        mut data: OpData,
        results: Vec<(String, TensorType)>,
    ) -> (Op, Vec<Value>) {
        let op = self.ops.next_key();
        let mut outs = Vec::with_capacity(results.len());
        for (i, (name, ty)) in results.into_iter().enumerate() {
            outs.push(self.values.push(ValueData {
                name,
                ty,
                def: ValueDef::Result(op, i as u32),
            }));
        }
        data.outputs = outs.clone();
        let op2 = self.ops.push(data);
        debug_assert_eq!(op, op2);
        self.order.push(op);
        (op, outs)
    }

    /// Name of a value.
    pub fn name(&self, v: Value) -> &str {
        &self.values[v].name
    }

    /// Type of a value.
    pub fn ty(&self, v: Value) -> &TensorType {
        &self.values[v].ty
    }

    /// The op defining `v`, if any.
    pub fn producer(&self, v: Value) -> Option<Op> {
        match self.values[v].def {
            ValueDef::Result(op, _) => Some(op),
            _ => None,
        }
    }

    /// Constant data of `v`: an initializer, or the result of a `Constant` op with a `value` tensor.
    pub fn constant(&self, v: Value) -> Option<&TensorData> {
        if let Some(t) = self.initializers.get(&v) {
            return Some(t);
        }
        let op = self.producer(v)?;
        let d = &self.ops[op];
        if d.op_type == "Constant" && d.domain.is_empty() {
            return d.attrs.get("value").and_then(Attr::as_tensor);
        }
        None
    }

    /// Uses of every value by live ops: `(op, operand index)` in program order.
    pub fn uses(&self) -> SecondaryMap<Value, Vec<(Op, u32)>> {
        let mut uses: SecondaryMap<Value, Vec<(Op, u32)>> = SecondaryMap::new();
        for &op in &self.order {
            for (i, v) in self.ops[op].inputs.iter().enumerate() {
                if let Some(v) = v {
                    uses[*v].push((op, i as u32));
                }
            }
        }
        uses
    }

    /// Map from value name to value, over inputs, initializers and live op results.
    pub fn values_by_name(&self) -> HashMap<&str, Value> {
        let mut m = HashMap::new();
        for &v in &self.inputs {
            m.insert(self.values[v].name.as_str(), v);
        }
        for &v in self.initializers.keys() {
            m.insert(self.values[v].name.as_str(), v);
        }
        for &op in &self.order {
            for &v in &self.ops[op].outputs {
                m.insert(self.values[v].name.as_str(), v);
            }
        }
        m
    }

    /// Replace every operand use of `from` (and graph outputs) by `to`.
    pub fn replace_all_uses(&mut self, from: Value, to: Value) {
        for &op in &self.order {
            for v in self.ops[op].inputs.iter_mut().flatten() {
                if *v == from {
                    *v = to;
                }
            }
        }
        for v in &mut self.outputs {
            if *v == from {
                *v = to;
            }
        }
    }

    /// Drop ops from the program order (they stay in the arena, dead).
    pub fn remove_ops(&mut self, dead: &std::collections::HashSet<Op>) {
        self.order.retain(|op| !dead.contains(op));
    }

    /// Re-order `order` topologically (stable: keeps the current order where it is already valid).
    /// Fails with the name of an op on a cycle.
    pub fn topo_sort(&mut self) -> Result<()> {
        let n = self.order.len();
        let pos: HashMap<Op, usize> = self
            .order
            .iter()
            .enumerate()
            .map(|(i, o)| (*o, i))
            .collect();
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, &op) in self.order.iter().enumerate() {
            for v in self.ops[op].inputs.iter().flatten() {
                if let ValueDef::Result(p, _) = self.values[*v].def {
                    if let Some(&j) = pos.get(&p) {
                        succ[j].push(i);
                    }
                }
            }
        }
        // Lowest old position first keeps the order stable.
        match crate::topo::topo_order(n, |i| succ[i].iter().copied()) {
            Ok(order) => {
                self.order = order.into_iter().map(|i| self.order[i]).collect();
                Ok(())
            }
            Err(cycle) => {
                let o = self.order[cycle.stuck];
                Err(Error::node(
                    self.ops[o].name.clone(),
                    self.ops[o].op_type.clone(),
                    "the graph has a cycle through this node",
                ))
            }
        }
    }
}

/// A whole model: the main graph plus model-level metadata.
#[derive(Clone, Debug, Default)]
pub struct Module {
    pub graph: Graph,
    /// Opset version per domain (`""` = `ai.onnx`).
    pub opset_imports: BTreeMap<String, i64>,
    pub ir_version: i64,
    pub producer_name: String,
    pub producer_version: String,
    /// Model-level `pipec.*` annotations.
    pub attrs: BTreeMap<String, Attr>,
}

impl Module {
    /// Opset of the default domain (`ai.onnx`), 0 if not imported.
    pub fn opset(&self) -> i64 {
        self.opset_imports
            .get("")
            .or_else(|| self.opset_imports.get("ai.onnx"))
            .copied()
            .unwrap_or(0)
    }
}
