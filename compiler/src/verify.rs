//! The IR verifier, run after import, after parsing and after every pass.
//!
//! Checks, in order:
//! 1. **Structure**: every value is defined exactly once (its `ValueDef` points back at the op
//!    result, graph input or initializer that defines it); names are unique; op operands and graph
//!    outputs refer to defined values; an initializer's data has its value's declared type.
//! 2. **SSA dominance**: an operand is defined before its use in program order. The graph is one
//!    block, so this also proves **acyclicity**.
//! 3. **Types** (optional, [`VerifyOptions::types`]): every recorded type agrees with what the op's
//!    shape rule gives for its operands (`shape::infer_shapes` re-run on a copy).

use crate::error::{Error, Result};
use crate::ir::{Module, Op, Value, ValueDef};
use std::collections::{HashMap, HashSet};

/// What the verifier checks.
#[derive(Clone, Copy, Debug)]
pub struct VerifyOptions {
    /// Re-run shape inference on a copy and compare types.
    pub types: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions { types: true }
    }
}

/// Verify a module with the default options (structure, dominance and types).
pub fn verify(m: &Module) -> Result<()> {
    verify_with(m, VerifyOptions::default())
}

/// Verify with explicit options.
pub fn verify_with(m: &Module, opts: VerifyOptions) -> Result<()> {
    verify_structure(m)?;
    if opts.types {
        verify_types(m)?;
    }
    Ok(())
}

fn describe_op(m: &Module, op: Op) -> String {
    let d = &m.graph.ops[op];
    format!("node '{}' ({})", d.display_name(&m.graph), d.op_type)
}

/// Record that `v` is defined; fails if it is defined twice or its name is taken.
fn define<'a>(
    m: &'a Module,
    defined: &mut HashSet<Value>,
    names: &mut HashMap<&'a str, Value>,
    v: Value,
    what: &str,
) -> Result<()> {
    let g = &m.graph;
    if !g.values.is_valid(v) {
        return Err(Error::Verify(format!(
            "{what} defines value {v} that does not exist"
        )));
    }
    if !defined.insert(v) {
        return Err(Error::Verify(format!(
            "{what}: value '{}' is defined twice",
            g.values[v].name
        )));
    }
    let name = g.values[v].name.as_str();
    if let Some(prev) = names.insert(name, v) {
        if prev != v {
            return Err(Error::Verify(format!(
                "{what}: two values are named '{name}'"
            )));
        }
    }
    Ok(())
}

fn verify_structure(m: &Module) -> Result<()> {
    let g = &m.graph;
    let mut defined: HashSet<Value> = HashSet::new();
    let mut names: HashMap<&str, Value> = HashMap::new();
    for (i, &v) in g.inputs.iter().enumerate() {
        define(m, &mut defined, &mut names, v, &format!("graph input #{i}"))?;
        if g.values[v].def != ValueDef::Input(i as u32) {
            return Err(Error::Verify(format!(
                "graph input #{i} '{}' is not marked as input {i}",
                g.values[v].name
            )));
        }
    }
    for &v in g.initializers.keys() {
        define(m, &mut defined, &mut names, v, "initializer")?;
        if g.values[v].def != ValueDef::Initializer {
            return Err(Error::Verify(format!(
                "initializer '{}' is not marked as an initializer",
                g.values[v].name
            )));
        }
        let (data, ty) = (&g.initializers[&v], &g.values[v].ty);
        let dims_agree = ty.shape.as_ref().is_none_or(|s| {
            s.len() == data.dims.len()
                && s.iter().zip(&data.dims).all(|(d, &n)| d.known() == Some(n))
        });
        if data.dtype != ty.dtype || !dims_agree {
            return Err(Error::Verify(format!(
                "initializer '{}' holds a {} tensor but its value is declared {}",
                g.values[v].name,
                crate::ir::fmt_type(&crate::ir::TensorType::known(data.dtype, &data.dims)),
                crate::ir::fmt_type(ty)
            )));
        }
    }
    let mut seen_ops: HashSet<Op> = HashSet::new();
    for &op in &g.order {
        if !g.ops.is_valid(op) {
            return Err(Error::Verify(format!(
                "program order lists {op}, which does not exist"
            )));
        }
        if !seen_ops.insert(op) {
            return Err(Error::Verify(format!(
                "{} appears twice in program order",
                describe_op(m, op)
            )));
        }
        let d = &g.ops[op];
        for (i, v) in d.inputs.iter().enumerate() {
            let Some(v) = v else { continue };
            if !g.values.is_valid(*v) {
                return Err(Error::Verify(format!(
                    "{}: operand #{i} does not exist",
                    describe_op(m, op)
                )));
            }
            if !defined.contains(v) {
                let why = match g.values[*v].def {
                    ValueDef::Result(p, _) if g.order.contains(&p) => {
                        "is used before it is defined (not in topological order, or a cycle)"
                    }
                    _ => "is not defined by any live op, input or initializer",
                };
                return Err(Error::Verify(format!(
                    "{}: operand #{i} '{}' {why}",
                    describe_op(m, op),
                    g.values[*v].name
                )));
            }
        }
        for (i, &v) in d.outputs.iter().enumerate() {
            define(m, &mut defined, &mut names, v, &describe_op(m, op))?;
            if g.values[v].def != ValueDef::Result(op, i as u32) {
                return Err(Error::Verify(format!(
                    "{}: result #{i} '{}' does not point back at its op",
                    describe_op(m, op),
                    g.values[v].name
                )));
            }
        }
    }
    for (i, v) in g.outputs.iter().enumerate() {
        if !g.values.is_valid(*v) || !defined.contains(v) {
            return Err(Error::Verify(format!("graph output #{i} is not defined")));
        }
    }
    Ok(())
}

fn verify_types(m: &Module) -> Result<()> {
    let mut copy = m.clone();
    crate::shape::infer_shapes(&mut copy)?;
    let g = &m.graph;
    for &op in &g.order {
        for &v in &g.ops[op].outputs {
            let (a, b) = (&g.values[v].ty, &copy.graph.values[v].ty);
            if a != b {
                return Err(Error::Verify(format!(
                    "{}: result '{}' has type {} but the op's shape rule gives {}",
                    describe_op(m, op),
                    g.values[v].name,
                    crate::ir::fmt_type(a),
                    crate::ir::fmt_type(b)
                )));
            }
        }
    }
    Ok(())
}
