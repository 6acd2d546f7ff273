//! Shape and dtype inference.
//!
//! [`infer_shapes`] walks `graph.order` (a topological order) and sets every op result's
//! [`TensorType`] from its operands' types, its attributes and its constant operands, merging the
//! result with the type already declared on the value (ONNX `value_info` / graph outputs):
//! a declared static dim that disagrees with the inferred one is an error naming both, an inferred
//! static dim wins over a declared symbol.
//!
//! Alongside types, small int64 0-D/1-D tensors get their element values tracked as
//! [`Dim`]s ([`SymbolicValues`], like ONNX's data propagation), so that the usual
//! `Shape → Gather → Unsqueeze → Concat → Reshape` arithmetic of real exports yields static shapes
//! even with a symbolic batch dimension.
//!
//! Symbols: graph inputs bring named symbols (`batch`); sizes that cannot be derived exactly
//! (data-dependent ops, inexact symbolic division, windows over a symbolic axis) get fresh
//! symbols named `unk_<op>_<dim>` ([`is_fresh_symbol`]); a declared type's symbol replaces a fresh
//! one on merge. Assumptions, all standard in ONNX data propagation: a symbol is a non-negative
//! size; in broadcasting a known dim `k != 1` against a symbol gives `k`; `Slice` of an axis to a
//! symbolic end `e` from 0 (the `x[:seq]` idiom) gives `e`.
//!
//! Rules live in one file per op family and are registered by op type in [`registry`]
//! (tract's `register_all_ops` style). An op type without a rule is [`Error::UnknownOp`].

mod arity;
mod control;
mod conv;
mod elementwise;
mod misc;
mod nn;
mod node;
mod reduce;
mod rnn;
mod shape_ops;
#[cfg(test)]
mod testutil;
mod values;

use crate::error::{Error, Result};
use crate::ir::{Dim, Graph, Module, Op, TensorType, Value};
use std::collections::HashMap;
use std::sync::OnceLock;

pub use node::Node;

/// A shape rule: the result types of one op.
pub type Rule = fn(&Node) -> Result<Vec<TensorType>>;

/// Rules keyed by ONNX op type (default domain).
pub fn registry() -> &'static HashMap<&'static str, Rule> {
    static REG: OnceLock<HashMap<&'static str, Rule>> = OnceLock::new();
    REG.get_or_init(|| {
        let mut r: HashMap<&'static str, Rule> = HashMap::new();
        elementwise::register(&mut r);
        conv::register(&mut r);
        nn::register(&mut r);
        reduce::register(&mut r);
        shape_ops::register(&mut r);
        misc::register(&mut r);
        rnn::register(&mut r);
        control::register(&mut r);
        r
    })
}

/// Op types that have a shape rule, sorted.
pub fn supported_ops() -> Vec<&'static str> {
    let mut v: Vec<_> = registry().keys().copied().collect();
    v.sort_unstable();
    v
}

/// Largest int tensor (in elements) whose values are tracked symbolically.
pub const MAX_TRACKED_ELEMS: usize = 64;

/// Element values of small integer tensors (mostly 0-D/1-D shape vectors; any rank with a static
/// shape, row-major, up to [`MAX_TRACKED_ELEMS`]), as [`Dim`]s (known ints or symbols),
/// propagated through shape arithmetic. Values of rank-0 tensors have one element.
#[derive(Clone, Debug, Default)]
pub struct SymbolicValues {
    map: HashMap<Value, Vec<Dim>>,
}

impl SymbolicValues {
    /// Empty set.
    pub fn new() -> Self {
        Self::default()
    }
    /// Values of `v`, if tracked.
    pub fn get(&self, v: Value) -> Option<&[Dim]> {
        self.map.get(&v).map(Vec::as_slice)
    }
    /// Record values for `v`.
    pub fn insert(&mut self, v: Value, dims: Vec<Dim>) {
        self.map.insert(v, dims);
    }
    /// Number of tracked values.
    pub fn len(&self) -> usize {
        self.map.len()
    }
    /// True if nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// What [`infer_shapes`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InferStats {
    /// Ops whose result types were inferred.
    pub ops: usize,
    /// Result values whose type changed (vs what was declared).
    pub refined: usize,
    /// Result values with a fully static shape afterwards.
    pub static_shapes: usize,
    /// Result values with a ranked shape holding at least one symbolic dim.
    pub symbolic_shapes: usize,
    /// Result values whose rank is still unknown.
    pub unranked: usize,
    /// Values whose elements were tracked symbolically.
    pub tracked_values: usize,
}

/// Infer the result types of one op. `vals` are the symbolic values known for its operands.
pub fn infer_op(g: &Graph, op: Op, opset: i64, vals: &SymbolicValues) -> Result<Vec<TensorType>> {
    let n = Node::new(g, op, opset, vals);
    let d = n.data;
    if !(d.domain.is_empty() || d.domain == "ai.onnx") {
        return Err(Error::UnknownOp {
            node: d.display_name(g),
            op_type: d.op_type.clone(),
            domain: d.domain.clone(),
        });
    }
    let rule = registry()
        .get(d.op_type.as_str())
        .ok_or_else(|| Error::UnknownOp {
            node: d.display_name(g),
            op_type: d.op_type.clone(),
            domain: d.domain.clone(),
        })?;
    check_arity(g, d, opset)?;
    let mut tys = rule(&n)?;
    if tys.len() < d.outputs.len() {
        return Err(n.err(format!(
            "has {} results but the op defines only {}",
            d.outputs.len(),
            tys.len()
        )));
    }
    tys.truncate(d.outputs.len());
    // Sizes are never negative: a negative repeat, pad or target dim is the model's error. (Only
    // checked when no operand already has one, e.g. a `-1` that some tools write for "unknown".)
    let negative = |x: &&Dim| match x {
        Dim::Known(k) => *k < 0,
        Dim::Sym(s) => s.coeff < 0,
    };
    let operands_ok = d
        .inputs
        .iter()
        .flatten()
        .all(|v| g.ty(*v).shape.iter().flatten().find(negative).is_none());
    for (i, t) in tys.iter().enumerate().filter(|_| operands_ok) {
        let neg = t.shape.iter().flatten().find(negative);
        if let Some(x) = neg {
            return Err(n.err(format!(
                "result {i} would have a negative dim {x} ({})",
                fmt_dims(t.shape.as_deref().unwrap_or(&[]))
            )));
        }
    }
    Ok(tys)
}

/// The operand and result counts of `d` against the ONNX schema of its op at `opset`
/// ([`arity::ARITY`]; absent optional operands count, as in ONNX, captured values do not). An op that the opset does
/// not define yet is left to its rule.
fn check_arity(g: &Graph, d: &crate::ir::OpData, opset: i64) -> Result<()> {
    let rows = arity::ARITY;
    let start = rows.partition_point(|r| r.0 < d.op_type.as_str());
    let Some(&(_, since, min_in, max_in, min_out, max_out)) = rows[start..]
        .iter()
        .take_while(|r| r.0 == d.op_type)
        .filter(|r| i64::from(r.1) <= opset)
        .last()
    else {
        return Ok(());
    };
    let count = |what: &str, n: usize, lo: u8, hi: u8| -> Result<()> {
        if n >= usize::from(lo) && (hi == arity::UNBOUNDED || n <= usize::from(hi)) {
            return Ok(());
        }
        let allowed = match (lo, hi) {
            (lo, arity::UNBOUNDED) => format!("at least {lo}"),
            (lo, hi) if lo == hi => format!("{lo}"),
            (lo, hi) => format!("{lo} to {hi}"),
        };
        Err(Error::node(
            d.display_name(g),
            d.op_type.clone(),
            format!(
                "has {n} {what}{} but {} (opset {since}) takes {allowed}",
                if n == 1 { "" } else { "s" },
                d.op_type
            ),
        ))
    };
    // A control-flow op's captured values are pipec's extra trailing operands (`Subgraph`).
    let captures = d.int_attr(crate::ir::CAPTURES_ATTR).unwrap_or(0).max(0) as usize;
    count(
        "operand",
        d.inputs.len().saturating_sub(captures),
        min_in,
        max_in,
    )?;
    count("result", d.outputs.len(), min_out, max_out)
}

/// Bind named symbols to sizes in every value's type (`sequence_length = 128`): a symbolic dim
/// `c * s1 * s2 ...` becomes the product with the bound symbols replaced, a known size when all
/// are bound. Run [`infer_shapes`] afterwards to propagate. Returns how many dims changed.
/// Errors on a size below 1 or a product that overflows.
pub fn bind_symbols(
    m: &mut Module,
    binds: &std::collections::BTreeMap<String, i64>,
) -> Result<usize> {
    if let Some((k, v)) = binds.iter().find(|(_, v)| **v < 1) {
        return Err(Error::msg(format!(
            "symbol '{k}' bound to {v}: sizes must be >= 1"
        )));
    }
    let mut changed = 0;
    for (_, vd) in m.graph.values.iter_mut() {
        let Some(shape) = vd.ty.shape.as_mut() else {
            continue;
        };
        for d in shape.iter_mut() {
            let Dim::Sym(s) = &*d else { continue };
            if !s.syms.iter().any(|x| binds.contains_key(x)) {
                continue;
            }
            let s = s.clone();
            let mut out = Dim::Known(s.coeff);
            for x in &s.syms {
                let f = binds
                    .get(x)
                    .map_or_else(|| Dim::sym(x.clone()), |v| Dim::Known(*v));
                out = out.mul(&f).ok_or_else(|| {
                    Error::named(&vd.name, format!("dim {d} overflows once '{x}' is bound"))
                })?;
            }
            *d = out;
            changed += 1;
        }
    }
    Ok(changed)
}

/// Infer every op result's type in `m.graph`, in program order. See the module doc.
pub fn infer_shapes(m: &mut Module) -> Result<InferStats> {
    infer_shapes_with_values(m).map(|(s, _)| s)
}

/// [`infer_shapes`], also returning the symbolic values it tracked (e.g. for a pass that folds
/// shape subgraphs whose values are fully known).
pub fn infer_shapes_with_values(m: &mut Module) -> Result<(InferStats, SymbolicValues)> {
    let opset = match m.opset() {
        0 => 21,
        v => v,
    };
    let mut vals = SymbolicValues::new();
    let mut stats = InferStats::default();
    let order = m.graph.order.clone();
    for op in order {
        let tys = infer_op(&m.graph, op, opset, &vals)?;
        let (tracked, merged) = {
            let g = &m.graph;
            let n = Node::new(g, op, opset, &vals);
            let mut merged = Vec::with_capacity(tys.len());
            for (i, ty) in tys.iter().enumerate() {
                let v = n.data.outputs[i];
                merged.push(merge(&n, g.ty(v), ty, g.name(v))?);
            }
            // Values are computed with the merged result types.
            let tracked = values::propagate(&n, &merged);
            (tracked, merged)
        };
        let outs = m.graph.ops[op].outputs.clone();
        for (v, ty) in outs.iter().zip(merged) {
            if m.graph.values[*v].ty != ty {
                stats.refined += 1;
            }
            m.graph.values[*v].ty = ty;
        }
        for (i, t) in tracked.into_iter().enumerate() {
            if let (Some(t), Some(v)) = (t, outs.get(i)) {
                vals.insert(*v, t);
            }
        }
        stats.ops += 1;
    }
    for &op in &m.graph.order {
        for &v in &m.graph.ops[op].outputs {
            match &m.graph.values[v].ty.shape {
                None => stats.unranked += 1,
                Some(s) if s.iter().all(|d| d.known().is_some()) => stats.static_shapes += 1,
                Some(_) => stats.symbolic_shapes += 1,
            }
        }
    }
    stats.tracked_values = vals.len();
    Ok((stats, vals))
}

/// True for symbols made up by inference (data-dependent or not derivable sizes).
pub fn is_fresh_symbol(d: &Dim) -> bool {
    match d {
        Dim::Sym(s) => s.syms.iter().any(|x| x.starts_with(node::FRESH_PREFIX)),
        Dim::Known(_) => false,
    }
}

/// Merge an inferred type with the declared one of value `name` (graph outputs included: their
/// declared types are checked here, as results of the ops that define them).
fn merge(n: &Node, declared: &TensorType, inferred: &TensorType, name: &str) -> Result<TensorType> {
    let shape = match (&declared.shape, &inferred.shape) {
        (None, s) => s.clone(),
        (Some(d), None) => Some(d.clone()),
        (Some(d), Some(i)) => {
            if d.len() != i.len() {
                return Err(n.err(format!(
                    "result '{name}' is declared with rank {} ({}) but inferred rank {} ({})",
                    d.len(),
                    fmt_dims(d),
                    i.len(),
                    fmt_dims(i)
                )));
            }
            let mut out = Vec::with_capacity(d.len());
            for (k, (dd, id)) in d.iter().zip(i).enumerate() {
                out.push(match (dd, id) {
                    // A negative declared dim is some tools' "unknown".
                    (Dim::Known(a), _) if *a < 0 => id.clone(),
                    (Dim::Known(a), Dim::Known(b)) if a != b => {
                        return Err(n.err(format!(
                            "result '{name}' dim {k}: declared {a} but inferred {b} \
                             (declared {}, inferred {})",
                            fmt_dims(d),
                            fmt_dims(i)
                        )))
                    }
                    (_, Dim::Known(b)) => Dim::Known(*b),
                    (Dim::Known(a), _) => Dim::Known(*a),
                    (decl, inf) if is_fresh_symbol(inf) => decl.clone(),
                    (_, inf) => inf.clone(),
                });
            }
            Some(out)
        }
    };
    if declared.shape.is_some() && declared.dtype != inferred.dtype {
        return Err(n.err(format!(
            "result '{name}' is declared {} but inferred {}",
            declared.dtype, inferred.dtype
        )));
    }
    Ok(TensorType {
        dtype: inferred.dtype,
        shape,
    })
}

/// `[2, batch, 3]`.
pub fn fmt_dims(d: &[Dim]) -> String {
    let v: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(", "))
}

#[cfg(test)]
mod tests {
    use super::testutil::T;
    use super::*;
    use crate::ir::{Attr, DType, TensorData, Value};

    /// Tiny deterministic PRNG (xorshift) for the robustness sweep.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a, X>(&mut self, v: &'a [X]) -> &'a X {
            &v[(self.next() % v.len() as u64) as usize]
        }
    }

    /// Iterations per op type of the robustness sweep.
    const ITERS: usize = 150;

    /// Every rule, fed random (often invalid) operands and attributes, returns `Ok` or `Err`:
    /// never panics.
    #[test]
    fn rules_never_panic_on_garbage() {
        let shapes = [
            "",
            "0",
            "1",
            "3",
            "b",
            "b,3",
            "2,3",
            "0,0",
            "1,1,1",
            "b,3,8,8",
            "2,4,5,7",
            "1,1,1,1,1",
            "-1,3",
            "9223372036854775807,2",
            "2*b,4",
            "3,b,1",
        ];
        let ints = [
            vec![],
            vec![0],
            vec![1],
            vec![-1],
            vec![2, 3],
            vec![0, -1],
            vec![i64::MAX],
            vec![i64::MIN],
            vec![1, 1, 1, 1],
            vec![-5, 7, 0, 100],
            vec![3, 3, 3, 3, 3, 3, 3, 3],
        ];
        let attr_names = [
            "axis",
            "axes",
            "perm",
            "kernel_shape",
            "strides",
            "pads",
            "dilations",
            "group",
            "keepdims",
            "to",
            "split",
            "num_outputs",
            "starts",
            "ends",
            "shape",
            "allowzero",
            "transA",
            "transB",
            "output_padding",
            "output_shape",
            "blocksize",
            "k",
            "start",
            "end",
            "batch_dims",
            "ceil_mode",
            "hidden_size",
            "layout",
            "scales",
            "noop_with_empty_axes",
            "stash_type",
            "dtype",
            "value",
            "value_ints",
            "value_int",
        ];
        let dtypes = [DType::F32, DType::I64, DType::Bool, DType::U8, DType::F16];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let ops = supported_ops();
        for (k, op) in ops.iter().enumerate() {
            for it in 0..ITERS {
                let mut t = T::new();
                // A chain: a random producer (also a rule) feeds the op under test sometimes.
                let mut pool: Vec<Value> = Vec::new();
                let chain = it % 3 == 0;
                let mut targets = vec![*op];
                if chain {
                    targets.insert(0, ops[(k + it) % ops.len()]);
                }
                let mut last = None;
                for target in targets {
                    let n_in = (rng.next() % 6) as usize;
                    let mut ins = Vec::new();
                    for _ in 0..n_in {
                        let v = match rng.next() % 5 {
                            0 => None,
                            1 => Some(t.ints(&rng.pick(&ints[..]).clone())),
                            2 => Some(t.g.add_initializer(
                                format!("f{}", rng.next()),
                                TensorData::from_f32(vec![2], &[0.5, -3.0]),
                            )),
                            3 if !pool.is_empty() => Some(*rng.pick(&pool[..])),
                            _ => Some(t.input(*rng.pick(&dtypes), rng.pick::<&str>(&shapes[..]))),
                        };
                        ins.push(v);
                    }
                    let mut attrs: Vec<(&str, Attr)> = Vec::new();
                    for _ in 0..(rng.next() % 5) {
                        let name = *rng.pick(&attr_names);
                        let a = match rng.next() % 6 {
                            0 => Attr::Int(*rng.pick(&[0, 1, -1, 7, i64::MAX, i64::MIN, 99])),
                            1 => Attr::Ints(rng.pick(&ints[..]).clone()),
                            2 => Attr::Float(*rng.pick(&[0.0, -1.0, 2.5, f32::NAN, f32::INFINITY])),
                            3 => Attr::String(
                                rng.pick(&["", "SAME_UPPER", "VALID", "x"]).to_string(),
                            ),
                            4 => Attr::Floats(vec![0.0, 2.0, f32::NAN]),
                            _ => Attr::Tensor(TensorData::from_i64(vec![1], &[3])),
                        };
                        attrs.push((name, a));
                    }
                    let n_out = 1 + (rng.next() % 4) as usize;
                    let o = t.op(target, &ins, &attrs, n_out);
                    pool.extend(t.g.ops[o].outputs.iter().copied());
                    last = Some((o, ins, attrs));
                }
                let Some((o, ins, attrs)) = last else {
                    continue;
                };
                let opset = *rng.pick(&[1, 9, 11, 13, 18, 21]);
                let r = std::panic::catch_unwind(|| t.infer(o, opset).map(|_| ()));
                assert!(r.is_ok(), "{op} panicked: inputs {ins:?} attrs {attrs:?}");
                // And through the whole-graph driver, which also propagates values.
                let mut m = Module {
                    graph: t.g.clone(),
                    ..Default::default()
                };
                m.opset_imports.insert(String::new(), opset);
                let r = std::panic::catch_unwind(move || infer_shapes(&mut m).map(|_| ()));
                assert!(r.is_ok(), "{op} panicked in infer_shapes: attrs {attrs:?}");
            }
        }
    }

    #[test]
    fn inference_is_idempotent() {
        let mut t = T::new();
        let x = t.input(DType::F32, "b,3,8,8");
        let w = t.input(DType::F32, "4,3,3,3");
        let c = t.op(
            "Conv",
            &[Some(x), Some(w)],
            &[("strides", Attr::Ints(vec![2, 2]))],
            1,
        );
        let cv = t.g.ops[c].outputs[0];
        let _nz = t.op("NonZero", &[Some(cv)], &[], 1);
        let mut m = Module {
            graph: t.g,
            ..Default::default()
        };
        let s1 = infer_shapes(&mut m).unwrap();
        let before: Vec<_> = m.graph.values.values().map(|v| v.ty.clone()).collect();
        let s2 = infer_shapes(&mut m).unwrap();
        let after: Vec<_> = m.graph.values.values().map(|v| v.ty.clone()).collect();
        assert_eq!(before, after);
        assert_eq!(s1.refined, 2);
        assert_eq!(s2.refined, 0);
    }
}
