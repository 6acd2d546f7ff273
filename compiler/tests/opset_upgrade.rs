//! The opset upgrade (`onnx::upgrade`): rewrites on hand-built graphs, refusals with the node
//! named, and forward equivalence with onnxruntime on small models of opsets 7 to 12
//! (`scripts/old_opset_models.py`: the upgraded model, exported, gives onnxruntime's outputs on
//! the original model; needs python3 with onnx, onnxruntime and numpy).

use pipec_compiler::ir::{Attr, DType, Dim, Graph, Module, OpData, TensorData, TensorType, Value};
use pipec_compiler::onnx::upgrade::{upgrade_opset, Upgraded};
use pipec_compiler::shape::infer_shapes;
use std::path::PathBuf;
use std::process::Command;

fn module(g: Graph, opset: i64) -> Module {
    let mut m = Module {
        graph: g,
        ir_version: 6,
        ..Default::default()
    };
    m.opset_imports.insert(String::new(), opset);
    m
}

fn op(
    g: &mut Graph,
    name: &str,
    t: &str,
    ins: &[Value],
    attrs: Vec<(&str, Attr)>,
    n: usize,
) -> Vec<Value> {
    let data = OpData {
        name: name.into(),
        op_type: t.into(),
        inputs: ins.iter().map(|v| Some(*v)).collect(),
        attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        ..Default::default()
    };
    let res = (0..n)
        .map(|i| (format!("{name}:{i}"), TensorType::unranked(DType::F32)))
        .collect();
    g.add_op(data, res).1
}

fn input(g: &mut Graph, name: &str, dims: &[i64]) -> Value {
    g.add_input(
        name,
        TensorType::new(DType::F32, dims.iter().map(|d| Dim::Known(*d)).collect()),
    )
}

/// Upgrade as the CLI front end does: shape inference, upgrade, shape inference, verify.
fn upgrade(m: &mut Module) -> Option<Upgraded> {
    infer_shapes(m).unwrap();
    let u = upgrade_opset(m).unwrap();
    infer_shapes(m).unwrap();
    pipec_compiler::verify::verify(m).unwrap();
    u
}

fn op_types(m: &Module) -> Vec<String> {
    m.graph
        .order
        .iter()
        .map(|o| m.graph.ops[*o].op_type.clone())
        .collect()
}

#[test]
fn softmax_on_the_last_axis_only_changes_axis() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[2, 5]);
    let y = op(&mut g, "sm", "Softmax", &[x], vec![], 1)[0];
    g.outputs.push(y);
    let mut m = module(g, 11);
    let u = upgrade(&mut m).unwrap();
    assert_eq!((u.from, u.to, u.rewritten), (11, 17, 1));
    assert_eq!(op_types(&m), ["Softmax"]);
    assert_eq!(m.graph.ops[m.graph.order[0]].int_attr("axis"), Some(-1));
    assert_eq!(m.opset(), 17);
    assert_eq!(m.ir_version, 8);
}

#[test]
fn softmax_on_a_middle_axis_is_flattened_and_reshaped_back() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[2, 3, 4]);
    let y = op(
        &mut g,
        "sm",
        "LogSoftmax",
        &[x],
        vec![("axis", Attr::Int(1))],
        1,
    )[0];
    g.outputs.push(y);
    let mut m = module(g, 12);
    upgrade(&mut m);
    assert_eq!(op_types(&m), ["Shape", "Flatten", "LogSoftmax", "Reshape"]);
    // The original result keeps its name and its type.
    assert_eq!(m.graph.outputs, vec![y]);
    assert_eq!(m.graph.name(y), "sm:0");
    assert_eq!(
        pipec_compiler::ir::fmt_type(m.graph.ty(y)),
        "float32[2,3,4]"
    );
    let ls = m.graph.order[2];
    assert_eq!(m.graph.ops[ls].int_attr("axis"), Some(1));
}

#[test]
fn attributes_become_constant_inputs_not_parameters() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[2, 1, 6]);
    let s = op(
        &mut g,
        "sq",
        "Squeeze",
        &[x],
        vec![("axes", Attr::Ints(vec![1]))],
        1,
    )[0];
    let c = op(
        &mut g,
        "cl",
        "Clip",
        &[s],
        vec![("min", Attr::Float(-1.0)), ("max", Attr::Float(1.0))],
        1,
    )[0];
    let parts = op(
        &mut g,
        "sp",
        "Split",
        &[c],
        vec![("axis", Attr::Int(1)), ("split", Attr::Ints(vec![2, 4]))],
        2,
    );
    g.outputs.extend(parts.iter().copied());
    let mut m = module(g, 10);
    upgrade(&mut m);
    assert!(m.graph.initializers.is_empty(), "no new initializers");
    let shapes: Vec<String> = m
        .graph
        .outputs
        .iter()
        .map(|v| pipec_compiler::ir::fmt_type(m.graph.ty(*v)))
        .collect();
    assert_eq!(shapes, ["float32[2,2]", "float32[2,4]"]);
    for o in &m.graph.order {
        let d = &m.graph.ops[*o];
        assert!(
            d.attr("axes").is_none() && d.attr("split").is_none() && d.attr("min").is_none(),
            "{} kept an attribute that is an input at opset 17",
            d.name
        );
    }
    let clip = m
        .graph
        .order
        .iter()
        .find(|o| m.graph.ops[**o].op_type == "Clip")
        .unwrap();
    let max = m.graph.ops[*clip].input(2).unwrap();
    assert_eq!(
        m.graph.constant(max).unwrap(),
        &TensorData::from_f32(vec![], &[1.0])
    );
}

#[test]
fn new_opsets_are_left_alone() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[2, 5]);
    let y = op(
        &mut g,
        "sm",
        "Softmax",
        &[x],
        vec![("axis", Attr::Int(0))],
        1,
    )[0];
    g.outputs.push(y);
    for opset in [17, 18] {
        let mut m = module(g.clone(), opset);
        assert_eq!(upgrade(&mut m), None);
        assert_eq!(m.opset(), opset);
        assert_eq!(op_types(&m), ["Softmax"]);
    }
}

fn upgrade_err(g: Graph, opset: i64) -> String {
    let mut m = module(g, opset);
    let _ = infer_shapes(&mut m);
    upgrade_opset(&mut m).unwrap_err().to_string()
}

#[test]
fn what_cannot_be_upgraded_is_refused_with_the_node_named() {
    // An op the upgrade does not know (an experimental op of old opsets).
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[1, 3, 4, 4]);
    op(&mut g, "crop0", "Crop", &[x], vec![], 1);
    let e = upgrade_err(g, 9);
    assert!(
        e.contains("node 'crop0' (Crop)") && e.contains("opset 9") && e.contains("'Crop'"),
        "{e}"
    );
    // BatchNormalization with per-element statistics.
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[1, 3, 4, 4]);
    let p: Vec<Value> = (0..4)
        .map(|i| g.add_initializer(format!("p{i}"), TensorData::from_f32(vec![3], &[1.0; 3])))
        .collect();
    op(
        &mut g,
        "bn0",
        "BatchNormalization",
        &[x, p[0], p[1], p[2], p[3]],
        vec![("spatial", Attr::Int(0))],
        1,
    );
    let e = upgrade_err(g, 8);
    assert!(e.contains("node 'bn0'") && e.contains("spatial = 0"), "{e}");
    // BatchNormalization whose training outputs are read.
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[1, 3, 4, 4]);
    let p: Vec<Value> = (0..4)
        .map(|i| g.add_initializer(format!("p{i}"), TensorData::from_f32(vec![3], &[1.0; 3])))
        .collect();
    let outs = op(
        &mut g,
        "bn1",
        "BatchNormalization",
        &[x, p[0], p[1], p[2], p[3]],
        vec![],
        3,
    );
    g.outputs.extend(outs);
    let e = upgrade_err(g, 9);
    assert!(
        e.contains("node 'bn1'") && e.contains("training-mode"),
        "{e}"
    );
    // Models older than opset 7.
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[2]);
    op(&mut g, "r", "Relu", &[x], vec![], 1);
    let e = upgrade_err(g, 6);
    assert!(e.contains("opset 6") && e.contains("from opset 7"), "{e}");
}

#[test]
fn unread_training_outputs_of_batchnorm_are_dropped() {
    let mut g = Graph::new("t");
    let x = input(&mut g, "x", &[1, 3, 4, 4]);
    let p: Vec<Value> = (0..4)
        .map(|i| g.add_initializer(format!("p{i}"), TensorData::from_f32(vec![3], &[1.0; 3])))
        .collect();
    let outs = op(
        &mut g,
        "bn",
        "BatchNormalization",
        &[x, p[0], p[1], p[2], p[3]],
        vec![],
        5,
    );
    g.outputs.push(outs[0]);
    let mut m = module(g, 9);
    upgrade(&mut m);
    assert_eq!(m.graph.ops[m.graph.order[0]].outputs, vec![outs[0]]);
}

/// A fresh folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn python_ok() -> bool {
    Command::new("python3")
        .args(["-c", "import onnx, onnxruntime, numpy"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Every case of `scripts/old_opset_models.py`: imported, upgraded, exported; the exported model
/// passes `onnx.checker` (full check), declares opset 17 and gives onnxruntime's outputs on the
/// original (relative difference <= 1e-5).
#[test]
fn upgraded_models_match_onnxruntime_on_the_originals() {
    if !python_ok() {
        eprintln!("note: python3 with onnx/onnxruntime/numpy not found; skipping");
        return;
    }
    let dir = TempDir::new("pipec-opset-upgrade");
    let script = root().join("scripts/old_opset_models.py");
    let st = Command::new("python3")
        .arg(&script)
        .arg("gen")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success(), "old_opset_models.py gen failed");
    let cases = std::fs::read_to_string(dir.path().join("cases.txt")).unwrap();
    let mut n = 0;
    for line in cases.lines() {
        let name = line.split_whitespace().next().unwrap();
        let mut m = pipec_compiler::onnx::load(&dir.path().join(format!("{name}.onnx"))).unwrap();
        let from = m.opset();
        let u = upgrade(&mut m).unwrap_or_else(|| panic!("{name}: not upgraded"));
        assert_eq!(u.from, from);
        assert!(u.rewritten > 0, "{name}: nothing rewritten");
        pipec_compiler::onnx::save(&m, &dir.path().join(format!("{name}.up.onnx"))).unwrap();
        n += 1;
    }
    assert!(n >= 7, "only {n} cases");
    let out = Command::new("python3")
        .arg(&script)
        .arg("compare")
        .arg(dir.path())
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{log}");
    assert!(out.status.success(), "upgraded models differ:\n{log}");
}
