//! `fold-constants` and `dce` on hand-built graphs (the shapes of what `torch.onnx.export` writes).

use pipec_compiler::ir::{
    Attr, DType, Dim, Graph, Module, OpData, TensorData, TensorType, Value, ValueDef,
};
use pipec_compiler::passmgr::{Pass, Stats};
use pipec_passes::{lookup, registry, Dce, FoldConstants};

fn module(graph: Graph) -> Module {
    Module {
        graph,
        opset_imports: [(String::new(), 17)].into_iter().collect(),
        ..Default::default()
    }
}

/// Append a one-result op `name` of type `op_type` whose result is `out` of type `ty`.
fn add(
    g: &mut Graph,
    name: &str,
    op_type: &str,
    inputs: &[Value],
    attrs: &[(&str, Attr)],
    ty: TensorType,
) -> Value {
    let data = OpData {
        name: name.into(),
        op_type: op_type.into(),
        inputs: inputs.iter().map(|v| Some(*v)).collect(),
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..Default::default()
    };
    g.add_op(data, vec![(format!("{name}_out"), ty)]).1[0]
}

fn constant(g: &mut Graph, name: &str, t: TensorData) -> Value {
    let ty = TensorType::known(t.dtype, &t.dims);
    add(g, name, "Constant", &[], &[("value", Attr::Tensor(t))], ty)
}

fn i64_ty(dims: &[i64]) -> TensorType {
    TensorType::known(DType::I64, dims)
}

fn run(pass: &dyn Pass, m: &mut Module) -> Stats {
    let mut stats = Stats::default();
    pass.run(m, &mut stats).unwrap();
    stats
}

/// Op types of the live ops, in program order.
fn live_ops(g: &Graph) -> Vec<&str> {
    g.order.iter().map(|o| g.ops[*o].op_type.as_str()).collect()
}

/// `x: f32[2, 3, 4]`; `Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 1), [0]), [-1]))`, the
/// pattern GPT-2's export writes before every Reshape.
fn shape_chain() -> (Module, Value) {
    let mut g = Graph::new("chain");
    let x = g.add_input("x", TensorType::known(DType::F32, &[2, 3, 4]));
    let s = add(&mut g, "Shape", "Shape", &[x], &[], i64_ty(&[3]));
    let one = constant(&mut g, "C1", TensorData::from_i64(vec![], &[1]));
    let d = add(
        &mut g,
        "Gather",
        "Gather",
        &[s, one],
        &[("axis", Attr::Int(0))],
        i64_ty(&[]),
    );
    let axes = constant(&mut g, "C2", TensorData::from_i64(vec![1], &[0]));
    let u = add(
        &mut g,
        "Unsqueeze",
        "Unsqueeze",
        &[d, axes],
        &[],
        i64_ty(&[1]),
    );
    let m1 = constant(&mut g, "C3", TensorData::from_i64(vec![1], &[-1]));
    // Declared with a symbolic dim: folding refines it.
    let cat_ty = TensorType::new(DType::I64, vec![Dim::sym("n")]);
    let cat = add(
        &mut g,
        "Concat",
        "Concat",
        &[u, m1],
        &[("axis", Attr::Int(0))],
        cat_ty,
    );
    let y = add(
        &mut g,
        "Reshape",
        "Reshape",
        &[x, cat],
        &[],
        TensorType::known(DType::F32, &[3, 8]),
    );
    g.outputs.push(y);
    (module(g), cat)
}

/// The whole Shape -> Gather -> Unsqueeze -> Concat chain folds in one run, to one Constant
/// under the Concat's value name, and dce then leaves only that Constant and the Reshape.
#[test]
fn shape_chain_folds_to_one_constant() {
    let (mut m, cat) = shape_chain();
    let stats = run(&FoldConstants, &mut m);
    assert_eq!(stats.get("folded-ops"), 4);
    let g = &m.graph;
    assert_eq!(
        g.constant(cat),
        Some(&TensorData::from_i64(vec![2], &[3, -1]))
    );
    assert_eq!(g.name(cat), "Concat_out");
    assert_eq!(g.ty(cat), &i64_ty(&[2]));
    let ValueDef::Result(op, 0) = g.values[cat].def else {
        panic!("cat is not an op result");
    };
    assert_eq!(g.ops[op].name, "Concat");
    assert_eq!(g.ops[op].outputs, [cat]);
    // Nothing removed by folding itself.
    assert_eq!(g.order.len(), 8);

    let stats = run(&Dce, &mut m);
    assert_eq!(stats.get("removed-ops"), 6);
    assert_eq!(live_ops(&m.graph), ["Constant", "Reshape"]);
    assert_eq!(m.graph.inputs.len(), 1);
}

/// A folded chain that ends in a graph output keeps the output pointing at the same value.
#[test]
fn folded_graph_output_keeps_its_value() {
    let mut g = Graph::new("out");
    let a = constant(&mut g, "A", TensorData::from_i64(vec![2], &[1, 2]));
    let b = constant(&mut g, "B", TensorData::from_i64(vec![], &[10]));
    let s = add(&mut g, "Mul", "Mul", &[a, b], &[], i64_ty(&[2]));
    g.outputs.push(s);
    let mut m = module(g);
    run(&FoldConstants, &mut m);
    run(&Dce, &mut m);
    assert_eq!(m.graph.outputs, [s]);
    assert_eq!(
        m.graph.constant(s),
        Some(&TensorData::from_i64(vec![2], &[10, 20]))
    );
    assert_eq!(live_ops(&m.graph), ["Constant"]);
}

/// Ops with a non-constant operand, and Shape of a symbolically shaped value, stay.
#[test]
fn fold_leaves_non_constant_ops_alone() {
    let mut g = Graph::new("dyn");
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(4)]),
    );
    let c = constant(&mut g, "C", TensorData::from_f32(vec![], &[1.0]));
    let x_ty = g.ty(x).clone();
    let y = add(&mut g, "Add", "Add", &[x, c], &[], x_ty);
    let s = add(&mut g, "Shape", "Shape", &[y], &[], i64_ty(&[2]));
    let r = add(
        &mut g,
        "Rand",
        "RandomNormal",
        &[],
        &[("shape", Attr::Ints(vec![2]))],
        TensorType::known(DType::F32, &[2]),
    );
    g.outputs.extend([y, s, r]);
    let mut m = module(g);
    let before = live_ops(&m.graph).join(",");
    let stats = run(&FoldConstants, &mut m);
    assert_eq!(stats.get("folded-ops"), 0);
    assert_eq!(live_ops(&m.graph).join(","), before);
}

/// Shape(start = 1) of `[batch, 4]` selects only the known dim, so it folds.
#[test]
fn shape_slice_of_known_dims_folds() {
    let mut g = Graph::new("dyn");
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(4)]),
    );
    let s = add(
        &mut g,
        "Shape",
        "Shape",
        &[x],
        &[("start", Attr::Int(1))],
        i64_ty(&[1]),
    );
    g.outputs.push(s);
    let mut m = module(g);
    assert_eq!(run(&FoldConstants, &mut m).get("folded-ops"), 1);
    assert_eq!(
        m.graph.constant(s),
        Some(&TensorData::from_i64(vec![1], &[4]))
    );
}

/// A multi-result op becomes one Constant per result, each right after the other, names unique.
#[test]
fn split_folds_to_one_constant_per_result() {
    let mut g = Graph::new("split");
    let a = constant(&mut g, "A", TensorData::from_i64(vec![4], &[1, 2, 3, 4]));
    let data = OpData {
        name: "Split".into(),
        op_type: "Split".into(),
        inputs: vec![Some(a)],
        ..Default::default()
    };
    let (_, outs) = g.add_op(
        data,
        vec![("lo".into(), i64_ty(&[2])), ("hi".into(), i64_ty(&[2]))],
    );
    let n = add(&mut g, "Neg", "Neg", &[outs[1]], &[], i64_ty(&[2]));
    g.outputs.extend([outs[0], n]);
    let mut m = module(g);
    assert_eq!(run(&FoldConstants, &mut m).get("folded-ops"), 2);
    let g = &m.graph;
    assert_eq!(
        live_ops(g),
        ["Constant", "Constant", "Constant", "Constant"]
    );
    let names: Vec<&str> = g.order.iter().map(|o| g.ops[*o].name.as_str()).collect();
    assert_eq!(names, ["A", "Split", "Split_1", "Neg"]);
    assert_eq!(
        g.constant(outs[0]),
        Some(&TensorData::from_i64(vec![2], &[1, 2]))
    );
    assert_eq!(
        g.constant(n),
        Some(&TensorData::from_i64(vec![2], &[-3, -4]))
    );
}

/// `value_ints` Constants are rewritten to the `value` form and their users fold.
#[test]
fn attribute_form_constants_are_canonicalized() {
    let mut g = Graph::new("c");
    let a = add(
        &mut g,
        "A",
        "Constant",
        &[],
        &[("value_ints", Attr::Ints(vec![2, 3]))],
        i64_ty(&[2]),
    );
    let p = add(
        &mut g,
        "P",
        "ReduceProd",
        &[a],
        &[("keepdims", Attr::Int(0))],
        i64_ty(&[]),
    );
    g.outputs.push(p);
    let mut m = module(g);
    let stats = run(&FoldConstants, &mut m);
    assert_eq!(stats.get("canonicalized-constants"), 1);
    assert_eq!(stats.get("folded-ops"), 1);
    assert_eq!(
        m.graph.constant(p),
        Some(&TensorData::from_i64(vec![], &[6]))
    );
}

/// A computed value that contradicts its declared type is left unfolded and counted.
#[test]
fn type_mismatch_is_an_error_naming_the_node() {
    // fold-constants re-runs shape inference first, so an ill-typed result is reported (with the
    // node's name) instead of being folded into a constant of another shape.
    let mut g = Graph::new("t");
    let a = constant(&mut g, "A", TensorData::from_i64(vec![2], &[1, 2]));
    let b = add(&mut g, "B", "Neg", &[a], &[], i64_ty(&[3]));
    g.outputs.push(b);
    let mut m = module(g);
    let err = FoldConstants
        .run(&mut m, &mut Stats::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("node 'B' (Neg)") && err.contains("declared 3"),
        "{err}"
    );
}

/// Invalid constant operands fail the pass with the node's name.
#[test]
fn invalid_gather_fails_naming_the_node() {
    let mut g = Graph::new("bad");
    let a = constant(&mut g, "A", TensorData::from_i64(vec![3], &[1, 2, 3]));
    let i = constant(&mut g, "I", TensorData::from_i64(vec![], &[5]));
    let y = add(&mut g, "/m/Gather_7", "Gather", &[a, i], &[], i64_ty(&[]));
    g.outputs.push(y);
    let mut m = module(g);
    let err = FoldConstants
        .run(&mut m, &mut Stats::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("node '/m/Gather_7' (Gather)"), "{err}");
}

/// dce drops a dead branch and the initializers only it used; it keeps graph outputs, unused
/// graph inputs and initializers that are graph outputs.
#[test]
fn dce_removes_dead_branch_keeps_outputs() {
    let mut g = Graph::new("dce");
    let x = g.add_input("x", TensorType::known(DType::F32, &[2]));
    let unused_in = g.add_input("unused", TensorType::known(DType::F32, &[2]));
    let w = g.add_initializer("w", TensorData::from_f32(vec![2], &[1.0, 2.0]));
    let w_out = g.add_initializer("w_out", TensorData::from_f32(vec![1], &[3.0]));
    let _w_dead = g.add_initializer("w_dead", TensorData::from_f32(vec![1], &[4.0]));
    let f32_2 = TensorType::known(DType::F32, &[2]);
    let live = add(&mut g, "Relu", "Relu", &[x], &[], f32_2.clone());
    let d1 = add(&mut g, "Mul", "Mul", &[x, w], &[], f32_2.clone());
    let _d2 = add(&mut g, "Neg", "Neg", &[d1], &[], f32_2.clone());
    let out = add(&mut g, "Add", "Add", &[live, x], &[], f32_2);
    g.outputs.extend([out, live, w_out]);
    let mut m = module(g);
    let stats = run(&Dce, &mut m);
    assert_eq!(stats.get("removed-ops"), 2);
    assert_eq!(stats.get("removed-initializers"), 2);
    let g = &m.graph;
    assert_eq!(live_ops(g), ["Relu", "Add"]);
    assert_eq!(g.inputs, [x, unused_in]);
    assert_eq!(g.initializers.keys().copied().collect::<Vec<_>>(), [w_out]);
    // A second run has nothing left to do.
    let stats = run(&Dce, &mut m);
    assert_eq!(
        (stats.get("removed-ops"), stats.get("removed-initializers")),
        (0, 0)
    );
}

#[test]
fn registry_names_are_unique_and_looked_up() {
    let names: Vec<&str> = registry().iter().map(|p| p.name()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len());
    assert!(names.contains(&"fold-constants") && names.contains(&"dce"));
    assert_eq!(lookup("dce").map(|p| p.name()), Some("dce"));
    assert!(lookup("no-such-pass").is_none());
    assert!(registry().iter().all(|p| !p.summary().is_empty()));
}

/// Parameters (floating-point initializers) are trained, so ops on them are never folded.
#[test]
fn float_initializers_are_not_folded() {
    let mut g = Graph::new("t");
    let w = g.add_initializer("w", TensorData::from_f32(vec![2], &[1.0, -2.0]));
    let y = add(
        &mut g,
        "neg_w",
        "Neg",
        &[w],
        &[],
        TensorType::known(DType::F32, &[2]),
    );
    g.outputs.push(y);
    let mut m = module(g);
    let stats = run(&FoldConstants, &mut m);
    assert_eq!(stats.get("folded-ops"), 0);
    assert_eq!(live_ops(&m.graph), ["Neg"]);
}
