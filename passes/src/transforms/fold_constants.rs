//! `fold-constants`: evaluates ops whose operands are all constants (and `Shape`/`Size` of
//! statically shaped values) and replaces them with `Constant` ops.
//!
//! - **Requires**: `order` in topological order (so one forward sweep folds whole chains such as
//!   `Shape -> Gather -> Unsqueeze -> Concat`). Operand types are read for `Shape`/`Size`; run
//!   `shape-infer` first to fold more of them.
//! - **Guarantees**: each folded op's results are now defined by `Constant` ops carrying a `value`
//!   tensor, under the same value names and ids, so every use, graph output and ONNX name is
//!   unchanged. A single-result op is rewritten in place and keeps its node name; each further
//!   result of a multi-result op (`Split`) gets a new `Constant` node placed right after it.
//!   Result types are preserved: dims the type left symbolic or unranked are refined to the
//!   computed ones; a result that contradicts its declared type (element type, rank or a known
//!   dim) leaves the op unfolded and is counted in `type-mismatches`. `pipec.*` annotations on a
//!   folded op are kept. `Constant` ops written with `value_float(s)`/`value_int(s)`/
//!   `value_string(s)` are rewritten to the `value` form, which is what `Graph::constant` reads.
//!   Integer results that shape inference's symbolic value propagation knows element by element
//!   (`Gather(Shape(x), 1)` where only dim 0 of `x` is symbolic) are folded too, so the
//!   `Shape -> Gather -> Unsqueeze -> Concat -> Reshape` chains of real exports collapse to
//!   constants even with a symbolic batch.
//!   What else is folded and how is [`pipec_compiler::eval::eval_op`]'s business: ops outside the
//!   default domain, random or stateful ops, non-constant operands and anything above
//!   [`pipec_compiler::eval::MAX_ELEMENTS`] are left alone. Invalid constant operands (a Gather
//!   index out of range) fail the pass with the node's name.
//! - **Never folds through parameters**: floating-point initializers are trained, so ops reading
//!   them stay (integer initializers and `Constant` ops are folded).
//! - **Does not** remove the ops and initializers that folding leaves unused: run `dce` after.
//! - **Invalidates**: op types of folded ops (analyses keyed by op type or operand lists).
//! - **Statistics**: `folded-ops`, `canonicalized-constants`, `type-mismatches`.
//! - **Options**: none.

use pipec_compiler::error::Error;
use pipec_compiler::eval::eval_op;
use pipec_compiler::ir::{
    Attr, DType, Dim, Graph, Module, Op, OpData, TensorData, TensorType, ValueDef,
};
use pipec_compiler::passmgr::PassInfo;
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_compiler::shape::SymbolicValues;
use pipec_compiler::Result;
use std::collections::{BTreeMap, HashSet};

/// The `fold-constants` pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct FoldConstants;

/// The contract of `fold-constants` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "fold-constants",
    summary: "evaluates ops whose operands are all constants (and Shape of statically shaped values) and replaces them with Constant ops",
    options: &[],
    statistics: &["canonicalized-constants", "folded-ops", "type-mismatches"],
    requires: &[],
    provides: &[],
    // Folded ops become new Constant ops, which no stage holds.
    invalidates: &["pipec.stages"],
};

impl Pass for FoldConstants {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()> {
        let opset = module.opset();
        // Shape arithmetic on symbolically shaped values (`Gather(Shape(x), 1)` with a symbolic
        // batch in dim 0) is not constant-foldable by evaluation, but shape inference knows the
        // values exactly when every element is a known integer.
        let (_, tracked) = pipec_compiler::shape::infer_shapes_with_values(module)?;
        let g = &mut module.graph;
        let mut names: HashSet<String> = g.order.iter().map(|o| g.ops[*o].name.clone()).collect();
        // Index loop: results of multi-result ops insert new ops into `order` as we go, so the
        // graph is consistent after every step even if a later op fails.
        let mut i = 0;
        while i < g.order.len() {
            let op = g.order[i];
            i += 1;
            let Some(results) = evaluate(g, op, opset, &tracked)? else {
                continue;
            };
            let data = &g.ops[op];
            if results.len() != data.outputs.len() {
                return Err(Error::node(
                    &data.name,
                    &data.op_type,
                    format!(
                        "evaluates to {} results but the node has {}",
                        results.len(),
                        data.outputs.len()
                    ),
                ));
            }
            let types: Option<Vec<TensorType>> = data
                .outputs
                .iter()
                .zip(&results)
                .map(|(v, t)| refine(g.ty(*v), t))
                .collect();
            let Some(types) = types else {
                stats.add("type-mismatches", 1);
                continue;
            };
            if data.op_type == "Constant" {
                stats.add("canonicalized-constants", 1);
            } else {
                stats.add("folded-ops", 1);
            }
            let inserted = replace_with_constants(g, op, results, types, &mut names);
            g.order.splice(i..i, inserted.iter().copied());
            i += inserted.len();
        }
        Ok(())
    }
}

/// The data of `v` if it is a constant expression: a constant (not a float parameter) or an op
/// whose operands are such (evaluated on demand, up to `depth` producers deep). The graph is not
/// changed: this is `fold-constants` for one value, for passes that need an operand's data (a
/// Resize's `scales` written as `Concat(Constant, Constant)`) without folding the whole graph.
pub fn constant_value(
    g: &Graph,
    v: pipec_compiler::ir::Value,
    opset: i64,
    depth: usize,
) -> Option<TensorData> {
    if let Some(t) = operand_constant(g, v) {
        return Some(t.clone());
    }
    let ValueDef::Result(op, k) = g.values[v].def else {
        return None;
    };
    if depth == 0 {
        return None;
    }
    let data = &g.ops[op];
    let owned: Vec<Option<TensorData>> = data
        .inputs
        .iter()
        .map(|i| match i {
            Some(i) => constant_value(g, *i, opset, depth - 1).map(Some),
            None => Some(None),
        })
        .collect::<Option<_>>()?;
    let inputs: Vec<Option<&TensorData>> = owned.iter().map(Option::as_ref).collect();
    let types: Vec<Option<&TensorType>> = data.inputs.iter().map(|i| i.map(|i| g.ty(i))).collect();
    let mut res = eval_op(data, &inputs, &types, opset).ok()??;
    let k = k as usize;
    (k < res.len()).then(|| res.swap_remove(k))
}

/// Evaluate `op` if its operands allow; `None` when it stays as it is.
fn evaluate(
    g: &Graph,
    op: Op,
    opset: i64,
    tracked: &SymbolicValues,
) -> Result<Option<Vec<TensorData>>> {
    let data = &g.ops[op];
    // A Constant already in `value` form is the fold's target form.
    if data.op_type == "Constant" && data.attr("value").is_some() {
        return Ok(None);
    }
    let inputs: Vec<Option<&TensorData>> = data
        .inputs
        .iter()
        .map(|v| v.and_then(|v| operand_constant(g, v)))
        .collect();
    let types: Vec<Option<&TensorType>> = data.inputs.iter().map(|v| v.map(|v| g.ty(v))).collect();
    if let Some(r) = eval_op(data, &inputs, &types, opset)? {
        return Ok(Some(r));
    }
    Ok(from_tracked_values(g, op, tracked).map(|t| vec![t]))
}

/// The result of a single-result integer op whose every element shape inference knows (e.g.
/// `Gather(Shape(x), 1)` where dim 1 of `x` is static and dim 0 is `batch`), as a tensor.
fn from_tracked_values(g: &Graph, op: Op, tracked: &SymbolicValues) -> Option<TensorData> {
    let data = &g.ops[op];
    if data.outputs.len() != 1 || !data.domain.is_empty() || data.op_type == "Constant" {
        return None;
    }
    let v = data.outputs[0];
    let ty = g.ty(v);
    let dims = ty.static_dims()?;
    let vals: Vec<i64> = tracked
        .get(v)?
        .iter()
        .map(Dim::known)
        .collect::<Option<_>>()?;
    if pipec_compiler::ir::numel(&dims)? != vals.len() as u64 {
        return None;
    }
    match ty.dtype {
        DType::I64 => Some(TensorData::from_i64(dims, &vals)),
        DType::I32 => {
            let raw: Vec<u8> = vals
                .iter()
                .map(|x| i32::try_from(*x).ok().map(i32::to_le_bytes))
                .collect::<Option<Vec<_>>>()?
                .concat();
            TensorData::from_raw(DType::I32, dims, raw.into()).ok()
        }
        _ => None,
    }
}

/// Constant data of an operand, for folding. Floating-point initializers are the model's
/// parameters: pipec trains them, so they are variables, never folded into (an inference-style
/// `Transpose(weight)` fold would bake the initial weights into the training graph).
fn operand_constant(g: &Graph, v: pipec_compiler::ir::Value) -> Option<&TensorData> {
    match g.initializers.get(&v) {
        Some(t) if t.dtype.is_float() => None,
        _ => g.constant(v),
    }
}

/// The type of a value whose data is `t`: its declared type with symbolic dims (or an unknown
/// rank) filled in; `None` if the declared type contradicts the data.
fn refine(declared: &TensorType, t: &TensorData) -> Option<TensorType> {
    if declared.dtype != t.dtype {
        return None;
    }
    if let Some(shape) = &declared.shape {
        let fits = shape.len() == t.dims.len()
            && shape
                .iter()
                .zip(&t.dims)
                .all(|(d, n)| !matches!(d, Dim::Known(k) if k != n));
        if !fits {
            return None;
        }
    }
    Some(TensorType::known(t.dtype, &t.dims))
}

/// Turn `op` into a `Constant` for its first result and add one `Constant` per further result;
/// returns the added ops, which the caller places after `op`.
fn replace_with_constants(
    g: &mut Graph,
    op: Op,
    results: Vec<TensorData>,
    types: Vec<TensorType>,
    names: &mut HashSet<String>,
) -> Vec<Op> {
    let old = std::mem::take(&mut g.ops[op]);
    let annotations: BTreeMap<String, Attr> = old
        .attrs
        .into_iter()
        .filter(|(k, _)| k.starts_with("pipec."))
        .collect();
    let mut added = Vec::new();
    for (k, ((v, t), ty)) in old.outputs.iter().zip(results).zip(types).enumerate() {
        let mut attrs = annotations.clone();
        attrs.insert("value".to_string(), Attr::Tensor(t));
        let mut name = old.name.clone();
        if k > 0 {
            let mut n = k;
            name = format!("{}_{n}", old.name);
            while names.contains(&name) {
                n += 1;
                name = format!("{}_{n}", old.name);
            }
            names.insert(name.clone());
        }
        let new = OpData {
            name,
            op_type: "Constant".to_string(),
            domain: String::new(),
            inputs: Vec::new(),
            outputs: vec![*v],
            attrs,
        };
        let target = if k == 0 {
            g.ops[op] = new;
            op
        } else {
            let o = g.ops.push(new);
            added.push(o);
            o
        };
        let vd = &mut g.values[*v];
        vd.ty = ty;
        vd.def = ValueDef::Result(target, 0);
    }
    added
}
