//! ONNX import/export tests: the four developer models, round trips, `onnx.checker` on exports,
//! and bad inputs built in Rust with the prost structs (no binary fixtures in the repo).

use bytes::Bytes;
use pipec_compiler::ir::{Attr, DType, Dim, Module, Payload, TensorData, TensorType};
use pipec_compiler::onnx::proto::{
    attribute_type, tensor_shape_proto::dimension, tensor_shape_proto::Dimension, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, SparseTensorProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
    DATA_LOCATION_EXTERNAL,
};
use pipec_compiler::onnx::{self, ExportOptions};
use pipec_compiler::Error;
use prost::Message;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

// ---------------------------------------------------------------------------------------------
// Helpers

/// Path of a developer model: `shared/models/` in the workspace root or one of its ancestors
/// (worktrees live below the main checkout's parent), else `onnx-models/` in the workspace root.
fn model_path(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root.canonicalize().unwrap_or(root);
    if let Some(dir) = std::env::var_os("PIPEC_ONNX_MODELS") {
        return Path::new(&dir).join(name);
    }
    for anc in root.ancestors() {
        let p = anc.join("shared/models").join(name);
        if p.exists() {
            return p;
        }
    }
    let p = root.join("onnx-models").join(name);
    assert!(
        p.exists(),
        "model {name} not found in shared/models (above {}) nor in onnx-models/",
        root.display()
    );
    p
}

/// A fresh temporary folder, removed on drop.
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(tag: &str) -> TmpDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "pipec-onnx-test-{}-{tag}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TmpDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(dimension::Value::DimValue(*d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(name: &str, op: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
    NodeProto {
        name: name.into(),
        op_type: op.into(),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn model(
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "pipec-test".into(),
        graph: Some(GraphProto {
            name: "g".into(),
            node: nodes,
            initializer: inits,
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `x: f32[4] -> Relu -> y`, optionally with an Add of an initializer `w`.
fn relu_model(inits: Vec<TensorProto>) -> ModelProto {
    let mut nodes = vec![node("relu", "Relu", &["x"], &["r"])];
    if inits.is_empty() {
        nodes.push(node("id", "Identity", &["r"], &["y"]));
    } else {
        nodes.push(node("add", "Add", &["r", "w"], &["y"]));
    }
    model(nodes, inits, vec![vi("x", 1, &[4])], vec![vi("y", 1, &[4])])
}

fn tensor(name: &str, dtype: i32, dims: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: dtype,
        dims: dims.to_vec(),
        ..Default::default()
    }
}

fn external(name: &str, dims: &[i64], kv: &[(&str, &str)]) -> TensorProto {
    TensorProto {
        data_location: DATA_LOCATION_EXTERNAL,
        external_data: kv
            .iter()
            .map(|(k, v)| StringStringEntryProto {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..tensor(name, 1, dims)
    }
}

/// Write the model into `dir/model.onnx` and load it from there.
fn load_in(dir: &Path, m: &ModelProto) -> pipec_compiler::Result<Module> {
    let p = dir.join("model.onnx");
    std::fs::write(&p, m.encode_to_vec()).expect("write model");
    onnx::load(&p)
}

fn import(m: &ModelProto) -> pipec_compiler::Result<Module> {
    onnx::from_bytes(Bytes::from(m.encode_to_vec()), None, "test.onnx")
}

/// The error's one-line message, checked to contain every `needle`.
#[track_caller]
fn expect_err(r: pipec_compiler::Result<Module>, needles: &[&str]) -> Error {
    let e = match r {
        Ok(_) => panic!("expected an error containing {needles:?}, got Ok"),
        Err(e) => e,
    };
    let msg = e.to_string();
    eprintln!("error: {msg}");
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} should contain {n:?}");
    }
    e
}

fn float_params(m: &Module) -> u64 {
    m.graph
        .initializers
        .values()
        .filter(|t| t.dtype.is_float())
        .map(|t| t.numel().unwrap())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// The developer models

/// (file, nodes, float parameters per Python `onnx`, initializers)
const MODELS: [(&str, usize, u64, usize); 4] = [
    ("resnet18.onnx", 69, 11_699_112, 102),
    ("gpt2_tiny.onnx", 522, 541_184, 28),
    ("inception_mini.onnx", 53, 44_202, 77),
    ("mlp4.onnx", 7, 33_738, 8),
];

#[test]
fn imports_the_developer_models() {
    for (file, nodes, params, inits) in MODELS {
        let m = onnx::load(&model_path(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let g = &m.graph;
        assert_eq!(g.order.len(), nodes, "{file}: nodes");
        assert_eq!(g.initializers.len(), inits, "{file}: initializers");
        assert_eq!(float_params(&m), params, "{file}: float parameters");
        assert_eq!(m.opset(), 17, "{file}");
        assert_eq!(m.ir_version, 8, "{file}");
        assert_eq!(m.producer_name, "pytorch", "{file}");
        assert_eq!(g.outputs.len(), 1, "{file}");
        let out = g.ty(g.outputs[0]);
        assert_eq!(out.dtype, DType::F32);
        assert_eq!(out.shape.as_ref().unwrap()[0], Dim::sym("batch"), "{file}");
        for &op in &g.order {
            assert!(!g.ops[op].name.is_empty());
        }
    }
}

#[test]
fn resnet18_types_and_attributes() {
    let m = onnx::load(&model_path("resnet18.onnx")).unwrap();
    let g = &m.graph;
    assert_eq!(g.inputs.len(), 1);
    assert_eq!(g.name(g.inputs[0]), "input");
    assert_eq!(
        g.ty(g.inputs[0]),
        &TensorType::new(
            DType::F32,
            vec![
                Dim::sym("batch"),
                Dim::Known(3),
                Dim::Known(224),
                Dim::Known(224)
            ]
        )
    );
    let by_name = g.values_by_name();
    let w = by_name["conv1.weight"];
    assert_eq!(g.ty(w), &TensorType::known(DType::F32, &[64, 3, 7, 7]));
    let conv = g
        .order
        .iter()
        .find(|o| g.ops[**o].op_type == "Conv")
        .unwrap();
    let c = &g.ops[*conv];
    assert_eq!(c.ints_attr("kernel_shape"), Some(&[7i64, 7][..]));
    assert_eq!(c.ints_attr("strides"), Some(&[2i64, 2][..]));
    assert_eq!(c.input(1), Some(w));
    // Op results without a declared type get the placeholder.
    assert_eq!(g.ty(c.outputs[0]), &TensorType::unranked(DType::F32));
}

#[test]
fn gpt2_constants_and_shared_embedding() {
    let m = onnx::load(&model_path("gpt2_tiny.onnx")).unwrap();
    let g = &m.graph;
    let consts = g
        .order
        .iter()
        .filter(|o| g.ops[**o].op_type == "Constant")
        .count();
    assert_eq!(consts, 191);
    // Every Constant carries a tensor attribute the IR can read.
    for &op in &g.order {
        if g.ops[op].op_type == "Constant" {
            let v = g.ops[op].outputs[0];
            assert!(g.constant(v).is_some(), "{}", g.ops[op].name);
        }
    }
    let wte = g.values_by_name()["transformer.wte.weight"];
    let users = g.uses()[wte].len();
    assert!(users >= 2, "tied embedding used {users} times");
    let ids = g.inputs[0];
    assert_eq!(g.ty(ids).dtype, DType::I64);
}

/// An initializer's bytes lie inside the buffer they were decoded from (no copy), and with
/// `load` inside the file's memory mapping.
#[test]
fn initializers_share_the_source_buffer() {
    let path = model_path("resnet18.onnx");
    let buf = Bytes::from(std::fs::read(&path).unwrap());
    let (lo, hi) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
    let m = onnx::from_bytes(buf.clone(), None, "resnet18").unwrap();
    let mut checked = 0;
    for t in m.graph.initializers.values() {
        let r = t.raw().unwrap();
        let p = r.as_ptr() as usize;
        assert!(
            p >= lo && p + r.len() <= hi,
            "initializer copied out of the source buffer"
        );
        checked += 1;
    }
    assert_eq!(checked, 102);

    let m = onnx::load(&path).unwrap();
    let ranges: Vec<(usize, usize)> = m
        .graph
        .initializers
        .values()
        .map(|t| {
            let r = t.raw().unwrap();
            (r.as_ptr() as usize, r.as_ptr() as usize + r.len())
        })
        .collect();
    let lo = ranges.iter().map(|r| r.0).min().unwrap();
    let hi = ranges.iter().map(|r| r.1).max().unwrap();
    let file_len = std::fs::metadata(&path).unwrap().len() as usize;
    assert!(
        hi - lo <= file_len,
        "initializers are not slices of one file-sized buffer"
    );
    #[cfg(target_os = "linux")]
    {
        // The mapping of the file, from /proc/self/maps.
        let canon = path.canonicalize().unwrap();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let inside = maps.lines().any(|l| {
            let mut f = l.split_whitespace();
            let range = f.next().unwrap_or("");
            let file = l.split_whitespace().nth(5).unwrap_or("");
            let Some((a, b)) = range.split_once('-') else {
                return false;
            };
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap_or(0),
                usize::from_str_radix(b, 16).unwrap_or(0),
            );
            Path::new(file) == canon && a <= lo && hi <= b
        });
        assert!(
            inside,
            "initializers are not inside the mapping of {}",
            canon.display()
        );
    }
}

/// A node as (name, op type, domain, input names, output names, attributes).
type NodeSummary = (
    String,
    String,
    String,
    Vec<Option<String>>,
    Vec<String>,
    Vec<(String, Attr)>,
);

/// Everything a round trip must keep.
#[derive(Debug, PartialEq)]
struct Summary {
    nodes: Vec<NodeSummary>,
    inits: Vec<(String, TensorData)>,
    inputs: Vec<(String, TensorType)>,
    outputs: Vec<(String, TensorType)>,
    result_types: Vec<(String, TensorType)>,
    opsets: Vec<(String, i64)>,
    ir_version: i64,
}

fn summary(m: &Module) -> Summary {
    let g = &m.graph;
    let nv = |v: &pipec_compiler::ir::Value| (g.name(*v).to_string(), g.ty(*v).clone());
    Summary {
        nodes: g
            .order
            .iter()
            .map(|o| {
                let d = &g.ops[*o];
                (
                    d.name.clone(),
                    d.op_type.clone(),
                    d.domain.clone(),
                    d.inputs
                        .iter()
                        .map(|i| i.map(|v| g.name(v).to_string()))
                        .collect(),
                    d.outputs.iter().map(|v| g.name(*v).to_string()).collect(),
                    d.attrs
                        .iter()
                        .map(|(k, a)| (k.clone(), a.clone()))
                        .collect(),
                )
            })
            .collect(),
        inits: g
            .initializers
            .iter()
            .map(|(v, t)| (g.name(*v).to_string(), t.clone()))
            .collect(),
        inputs: g.inputs.iter().map(nv).collect(),
        outputs: g.outputs.iter().map(nv).collect(),
        result_types: g
            .order
            .iter()
            .flat_map(|o| g.ops[*o].outputs.iter().map(nv))
            .collect(),
        opsets: m.opset_imports.clone().into_iter().collect(),
        ir_version: m.ir_version,
    }
}

#[test]
fn round_trip_keeps_everything() {
    for (file, ..) in MODELS {
        let m = onnx::load(&model_path(file)).unwrap();
        let bytes = onnx::to_bytes(&m).unwrap();
        let m2 = onnx::from_bytes(Bytes::from(bytes.clone()), None, file).unwrap();
        assert_eq!(summary(&m), summary(&m2), "{file}");
        assert_eq!(
            onnx::to_bytes(&m2).unwrap(),
            bytes,
            "{file}: export is not deterministic"
        );
    }
}

#[test]
fn round_trip_with_ranked_intermediates_and_symbols() {
    // Give intermediates ranked types with product symbols: they must come back as value_info.
    let mut m = onnx::load(&model_path("mlp4.onnx")).unwrap();
    let batch = Dim::sym("batch");
    let two_b = Dim::Known(2).mul(&batch).unwrap();
    let bs = batch.mul(&Dim::sym("seq")).unwrap();
    let order = m.graph.order.clone();
    for (i, op) in order.iter().enumerate() {
        let v = m.graph.ops[*op].outputs[0];
        if !m.graph.outputs.contains(&v) {
            let d = if i % 2 == 0 {
                two_b.clone()
            } else {
                bs.clone()
            };
            m.graph.values[v].ty = TensorType::new(DType::F32, vec![d, Dim::Known(128)]);
        }
    }
    let m2 = onnx::from_bytes(Bytes::from(onnx::to_bytes(&m).unwrap()), None, "mlp4").unwrap();
    assert_eq!(summary(&m), summary(&m2));
}

#[test]
fn export_skips_annotations_unless_asked_and_rejects_elided_data() {
    let mut m = onnx::load(&model_path("mlp4.onnx")).unwrap();
    let op = m.graph.order[0];
    m.graph.ops[op]
        .attrs
        .insert("pipec.stage".into(), Attr::Int(3));
    let p = onnx::to_model_proto(&m).unwrap();
    let n0 = &p.graph.as_ref().unwrap().node[0];
    assert!(n0.attribute.iter().all(|a| a.name != "pipec.stage"));
    let p = onnx::to_model_proto_with(
        &m,
        &ExportOptions {
            keep_annotations: true,
        },
    )
    .unwrap();
    let n0 = &p.graph.as_ref().unwrap().node[0];
    assert!(n0
        .attribute
        .iter()
        .any(|a| a.name == "pipec.stage" && a.i == Some(3)));

    let (v, t) = m.graph.initializers.get_index_mut(0).unwrap();
    let name = m.graph.values[*v].name.clone();
    t.payload = Payload::Elided("blob0".into());
    let e = onnx::to_model_proto(&m).unwrap_err().to_string();
    assert!(e.contains(&name) && e.contains("elided"), "{e}");
}

/// Exported files pass `onnx.checker.check_model(full_check=True)` (skipped with a note if
/// Python's `onnx` is not installed).
#[test]
fn exported_models_pass_the_onnx_checker_and_run_the_same() {
    let has_onnx = std::process::Command::new("python3")
        .args(["-c", "import onnx"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_onnx {
        eprintln!("note: python3 with `onnx` is not available; skipping the checker test");
        return;
    }
    let dir = TmpDir::new("checker");
    let mut paths = Vec::new();
    let mut envs = Vec::new();
    for (file, ..) in MODELS {
        let m = onnx::load(&model_path(file)).unwrap();
        let p = dir.path().join(file);
        onnx::save(&m, &p).unwrap();
        paths.push(p.display().to_string());
        envs.push((format!("PIPEC_MODELS_{file}"), model_path(file)));
    }
    // The checker on every export; then, where onnxruntime is installed, the exported model must
    // compute exactly what the original computes on the reference batch.
    let script = r#"
import sys, os, onnx
import numpy as np
for p in sys.argv[1:]:
    onnx.checker.check_model(onnx.load(p), full_check=True)
try:
    import onnxruntime as ort
except ImportError:
    print("note: onnxruntime is not available; outputs not compared")
    sys.exit(0)
for p in sys.argv[1:]:
    orig = os.environ["PIPEC_MODELS_" + os.path.basename(p)]
    ref = orig[: -len(".onnx")] + ".ref.npz"
    if not os.path.exists(ref):
        print("note: no reference batch for", orig)
        continue
    z = np.load(ref)
    feeds = {k[len("input/"):]: z[k] for k in z.files if k.startswith("input/")}
    run = lambda f: ort.InferenceSession(f, providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(run(orig), run(p)):
        assert np.array_equal(a, b), p
    print("ok", p)
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(&paths)
        .envs(envs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "onnx.checker failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn initializers_listed_as_inputs_stay_constants() {
    let w = TensorProto {
        float_data: vec![1.0; 4],
        ..tensor("w", 1, &[4])
    };
    let mut m = relu_model(vec![w]);
    m.graph.as_mut().unwrap().input.push(vi("w", 1, &[4]));
    let mut m = import(&m).unwrap();
    assert_eq!(m.graph.inputs.len(), 1);
    assert_eq!(m.graph.initializers.len(), 1);
    // An IR version 3 export lists them as inputs again.
    m.ir_version = 3;
    let p = onnx::to_model_proto(&m).unwrap();
    let names: Vec<_> = p.graph.unwrap().input.into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["x", "w"]);
}

// ---------------------------------------------------------------------------------------------
// Small hand-built models

#[test]
fn typed_data_fields_become_packed_raw() {
    let f32s = TensorProto {
        float_data: vec![1.0, -2.5],
        ..tensor("f", 1, &[2])
    };
    let i64s = TensorProto {
        int64_data: vec![7, -1, 1 << 40],
        ..tensor("l", 7, &[3])
    };
    let f16s = TensorProto {
        int32_data: vec![half::f16::from_f32(1.5).to_bits() as i32],
        ..tensor("h", 10, &[1])
    };
    let bools = TensorProto {
        int32_data: vec![1, 0, 1],
        ..tensor("b", 9, &[3])
    };
    let f64s = TensorProto {
        double_data: vec![0.25],
        ..tensor("d", 11, &[])
    };
    let u64s = TensorProto {
        uint64_data: vec![u64::MAX],
        ..tensor("u", 13, &[1])
    };
    let strs = TensorProto {
        string_data: vec![Bytes::from_static(b"ab"), Bytes::from_static(b"")],
        ..tensor("s", 8, &[2])
    };
    let empty = tensor("e", 1, &[0, 3]);
    let w = TensorProto {
        float_data: vec![0.0; 4],
        ..tensor("w", 1, &[4])
    };
    let m = relu_model(vec![w, f32s, i64s, f16s, bools, f64s, u64s, strs, empty]);
    let m = import(&m).unwrap();
    let g = &m.graph;
    let get = |n: &str| &g.initializers[&g.values_by_name()[n]];
    assert_eq!(get("f").to_f64_vec().unwrap(), vec![1.0, -2.5]);
    assert_eq!(get("l").to_i64_vec().unwrap(), vec![7, -1, 1 << 40]);
    assert_eq!(get("h").to_f64_vec().unwrap(), vec![1.5]);
    assert_eq!(get("b").raw().unwrap().as_ref(), &[1u8, 0, 1]);
    assert_eq!(get("d").to_f64_vec().unwrap(), vec![0.25]);
    assert_eq!(get("u").raw().unwrap().as_ref(), &[0xff; 8]);
    assert_eq!(
        get("s").payload,
        Payload::Strings(vec![Bytes::from_static(b"ab"), Bytes::new()])
    );
    assert_eq!(get("e").byte_len(), 0);
    // ... and they export as raw_data / string_data and come back equal.
    let m2 = onnx::from_bytes(Bytes::from(onnx::to_bytes(&m).unwrap()), None, "t").unwrap();
    assert_eq!(summary(&m), summary(&m2));
}

#[test]
fn unsorted_nodes_are_sorted_and_names_generated() {
    let mut nodes = vec![
        node("", "Identity", &["r"], &["y"]),
        node("", "Relu", &["x"], &["r"]),
    ];
    nodes[0].attribute.push(AttributeProto {
        name: "alpha".into(),
        r#type: attribute_type::FLOAT,
        f: Some(0.5),
        ..Default::default()
    });
    let m = model(
        nodes,
        vec![],
        vec![vi("x", 1, &[4])],
        vec![vi("y", 1, &[4])],
    );
    let m = import(&m).unwrap();
    let g = &m.graph;
    let names: Vec<&str> = g.order.iter().map(|o| g.ops[*o].name.as_str()).collect();
    assert_eq!(names, ["Relu_1", "Identity_0"]);
    assert_eq!(g.ops[g.order[1]].float_attr("alpha"), Some(0.5));
    assert_eq!(g.ty(g.outputs[0]), &TensorType::known(DType::F32, &[4]));
}

#[test]
fn symbolic_and_unknown_dims() {
    let mut x = vi("x", 1, &[0, 4]);
    if let Some(type_proto::Value::TensorType(t)) = &mut x.r#type.as_mut().unwrap().value {
        let dims = &mut t.shape.as_mut().unwrap().dim;
        dims[0].value = Some(dimension::Value::DimParam("unk__0".into()));
        dims.push(Dimension::default());
        dims.push(Dimension::default());
    }
    let m = model(
        vec![node("r", "Relu", &["x"], &["y"])],
        vec![],
        vec![x],
        vec![vi("y", 1, &[])],
    );
    let m = import(&m).unwrap();
    let t = m.graph.ty(m.graph.inputs[0]).shape.clone().unwrap();
    // Fresh symbols do not collide with the file's own `unk__0`.
    assert_eq!(t[0], Dim::sym("unk__0"));
    assert_eq!(t[1], Dim::Known(4));
    assert_eq!(t[2], Dim::sym("unk__1"));
    assert_eq!(t[3], Dim::sym("unk__2"));
}

#[test]
fn external_data_is_mapped_and_checked() {
    let dir = TmpDir::new("ext");
    let vals: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/w.bin"), &vals).unwrap();
    let w = external(
        "w",
        &[4],
        &[("location", "sub/w.bin"), ("offset", "4"), ("length", "16")],
    );
    let m = load_in(dir.path(), &relu_model(vec![w])).unwrap();
    let t = m.graph.initializers.values().next().unwrap();
    assert_eq!(t.to_f64_vec().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    // Without length: the rest of the file.
    let w = external("w", &[4], &[("location", "sub/w.bin"), ("offset", "4")]);
    assert!(load_in(dir.path(), &relu_model(vec![w])).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Bad inputs: every error names the problem and where it is.

#[test]
fn bad_empty_file() {
    let dir = TmpDir::new("empty");
    let p = dir.path().join("empty.onnx");
    std::fs::write(&p, b"").unwrap();
    let e = expect_err(onnx::load(&p), &["empty.onnx", "file is empty"]);
    assert!(matches!(e, Error::Decode { .. }));
    expect_err(
        onnx::from_bytes(Bytes::new(), None, "x.onnx"),
        &["file is empty"],
    );
}

#[test]
fn bad_truncated_protobuf() {
    let bytes = std::fs::read(model_path("mlp4.onnx")).unwrap();
    let half = Bytes::from(bytes[..bytes.len() / 2].to_vec());
    let e = expect_err(
        onnx::from_bytes(half, None, "mlp4-half.onnx"),
        &["mlp4-half.onnx", "not a valid ONNX model"],
    );
    assert!(matches!(e, Error::Decode { .. }), "{e:?}");
}

#[test]
fn bad_random_bytes() {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let junk: Vec<u8> = (0..4096)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    let e = expect_err(
        onnx::from_bytes(Bytes::from(junk), None, "junk.onnx"),
        &["junk.onnx"],
    );
    assert!(matches!(e, Error::Decode { .. }), "{e:?}");
}

#[test]
fn bad_missing_graph() {
    let m = ModelProto {
        ir_version: 8,
        ..Default::default()
    };
    expect_err(import(&m), &["no graph"]);
}

#[test]
fn bad_cycle() {
    let m = model(
        vec![
            node("a", "Relu", &["y"], &["x1"]),
            node("b", "Relu", &["x1"], &["y"]),
        ],
        vec![],
        vec![],
        vec![vi("y", 1, &[4])],
    );
    let e = expect_err(import(&m), &["cycle", "Relu"]);
    let msg = e.to_string();
    assert!(msg.contains("'a'") || msg.contains("'b'"), "{msg}");
}

#[test]
fn bad_dangling_input() {
    let m = model(
        vec![
            node("relu0", "Relu", &["x"], &["r"]),
            node("add0", "Add", &["r", "nowhere"], &["y"]),
        ],
        vec![],
        vec![vi("x", 1, &[4])],
        vec![vi("y", 1, &[4])],
    );
    expect_err(
        import(&m),
        &["node 'add0' (Add)", "'nowhere'", "not produced"],
    );
}

#[test]
fn bad_duplicate_output_names() {
    let m = model(
        vec![
            node("n1", "Relu", &["x"], &["y"]),
            node("n2", "Sigmoid", &["x"], &["y"]),
        ],
        vec![],
        vec![vi("x", 1, &[4])],
        vec![vi("y", 1, &[4])],
    );
    expect_err(
        import(&m),
        &["node 'n2' (Sigmoid)", "'y'", "already defined"],
    );
    // A node redefining a graph input.
    let m = model(
        vec![node("n1", "Relu", &["x"], &["x"])],
        vec![],
        vec![vi("x", 1, &[4])],
        vec![vi("x", 1, &[4])],
    );
    expect_err(import(&m), &["node 'n1' (Relu)", "'x'", "already defined"]);
    // Two initializers with one name.
    let w = TensorProto {
        float_data: vec![0.0; 4],
        ..tensor("w", 1, &[4])
    };
    expect_err(
        import(&relu_model(vec![w.clone(), w])),
        &["'w'", "two initializers"],
    );
}

#[test]
fn bad_initializer_claims_huge_size_without_data() {
    let w = tensor("huge", 1, &[1_000_000, 1_000_000]);
    expect_err(
        import(&relu_model(vec![w])),
        &["'huge'", "1000000000000 elements", "no data"],
    );
    let w = TensorProto {
        raw_data: Bytes::from_static(&[0; 8]),
        ..tensor("huge", 1, &[1_000_000, 1_000_000])
    };
    expect_err(
        import(&relu_model(vec![w])),
        &["'huge'", "raw_data has 8 bytes"],
    );
    let w = TensorProto {
        float_data: vec![1.0; 3],
        ..tensor("short", 1, &[4])
    };
    expect_err(
        import(&relu_model(vec![w])),
        &["'short'", "float_data has 3 values instead of 4"],
    );
}

#[test]
fn bad_dims_overflowing_i64() {
    let w = tensor("wide", 1, &[i64::MAX, 2]);
    expect_err(import(&relu_model(vec![w])), &["'wide'", "overflows"]);
    let w = tensor("neg", 1, &[-3]);
    expect_err(import(&relu_model(vec![w])), &["'neg'", "negative"]);
}

#[test]
fn bad_unknown_data_type() {
    let w = tensor("odd", 99, &[1]);
    expect_err(
        import(&relu_model(vec![w])),
        &["'odd'", "unsupported data type code 99"],
    );
    let mut m = relu_model(vec![]);
    m.graph.as_mut().unwrap().input = vec![vi("x", 77, &[4])];
    expect_err(import(&m), &["'x'", "unsupported element type code 77"]);
}

#[test]
fn bad_external_parent_path() {
    let dir = TmpDir::new("dotdot");
    let w = external("w", &[4], &[("location", "../../etc/passwd")]);
    expect_err(
        load_in(dir.path(), &relu_model(vec![w])),
        &["'w'", "../../etc/passwd", "'..'"],
    );
}

#[test]
fn bad_external_absolute_path() {
    let dir = TmpDir::new("abs");
    let w = external("w", &[4], &[("location", "/etc/passwd")]);
    expect_err(
        load_in(dir.path(), &relu_model(vec![w])),
        &["'w'", "/etc/passwd", "absolute"],
    );
}

#[cfg(unix)]
#[test]
fn bad_external_symlink_out_of_the_folder() {
    let dir = TmpDir::new("symlink");
    let outside = TmpDir::new("outside");
    std::fs::write(outside.path().join("w.bin"), [0u8; 16]).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
    let w = external("w", &[4], &[("location", "link/w.bin")]);
    expect_err(
        load_in(dir.path(), &relu_model(vec![w])),
        &["'w'", "link/w.bin", "outside the model's folder"],
    );
}

#[test]
fn bad_external_past_end_of_file() {
    let dir = TmpDir::new("pastend");
    std::fs::write(dir.path().join("w.bin"), [0u8; 16]).unwrap();
    let w = external(
        "w",
        &[4],
        &[("location", "w.bin"), ("offset", "8"), ("length", "16")],
    );
    expect_err(
        load_in(dir.path(), &relu_model(vec![w])),
        &["'w'", "w.bin", "past the end"],
    );
    let w = external("w", &[4], &[("location", "w.bin"), ("offset", "100")]);
    expect_err(
        load_in(dir.path(), &relu_model(vec![w])),
        &["'w'", "w.bin", "past the end"],
    );
    let w = external(
        "w",
        &[4],
        &[
            ("location", "w.bin"),
            ("offset", "1"),
            ("length", "18446744073709551615"),
        ],
    );
    expect_err(
        load_in(dir.path(), &relu_model(vec![w])),
        &["'w'", "past the end"],
    );
    let w = external("w", &[4], &[("location", "missing.bin")]);
    expect_err(
        load_in(dir.path(), &relu_model(vec![w])),
        &["'w'", "missing.bin"],
    );
}

/// `If(c)` whose branches read the outer `x` and `w` (ONNX lexical scoping).
fn if_model() -> ModelProto {
    let branch = |name: &str, op: &str| GraphProto {
        name: name.into(),
        node: vec![node(
            &format!("{name}_op"),
            op,
            &["x", "w"],
            &[&format!("{name}_out")],
        )],
        output: vec![vi(&format!("{name}_out"), 1, &[4])],
        ..Default::default()
    };
    let mut n = node("cond", "If", &["c"], &["y"]);
    for (attr, g) in [
        ("then_branch", branch("then", "Add")),
        ("else_branch", branch("else", "Mul")),
    ] {
        n.attribute.push(AttributeProto {
            name: attr.into(),
            r#type: attribute_type::GRAPH,
            g: Some(g),
            ..Default::default()
        });
    }
    model(
        vec![n],
        vec![TensorProto {
            float_data: vec![1.0, 2.0, 3.0, 4.0],
            ..tensor("w", 1, &[4])
        }],
        vec![vi("c", 9, &[]), vi("x", 1, &[4])],
        vec![vi("y", 1, &[4])],
    )
}

#[test]
fn subgraphs_capture_outer_values_and_round_trip() {
    let m = import(&if_model()).unwrap();
    let g = &m.graph;
    let op = g.order[0];
    let d = &g.ops[op];
    // c, then the captured x and w as explicit operands.
    let names: Vec<&str> = d.inputs.iter().map(|v| g.name(v.unwrap())).collect();
    assert_eq!(names, ["c", "x", "w"]);
    assert_eq!(d.int_attr(pipec_compiler::ir::CAPTURES_ATTR), Some(2));
    let then = d.attr("then_branch").and_then(Attr::as_graph).unwrap();
    assert_eq!(then.formal, 0);
    assert_eq!(then.captured, [0, 1]);
    let body_inputs: Vec<&str> = then
        .graph
        .inputs
        .iter()
        .map(|v| then.graph.name(*v))
        .collect();
    assert_eq!(body_inputs, ["x", "w"]);
    // Export writes the ONNX form back: one operand, branches without inputs.
    let p = onnx::export::to_model_proto(&m).unwrap();
    let n = &p.graph.as_ref().unwrap().node[0];
    assert_eq!(n.input, ["c"]);
    assert!(n.attribute.iter().all(|a| a.name != "pipec.captures"));
    let tb = n
        .attribute
        .iter()
        .find(|a| a.name == "then_branch")
        .unwrap();
    assert!(tb.g.as_ref().unwrap().input.is_empty());
    // And re-imports to the same structure.
    let again = onnx::import::from_model_proto(&p, None, "re").unwrap();
    let d2 = &again.graph.ops[again.graph.order[0]];
    assert_eq!(d2.inputs.len(), 3);
}

#[test]
fn bad_subgraph_attribute() {
    let mut n = node("cond", "If", &["c"], &["y"]);
    n.attribute.push(AttributeProto {
        name: "then_branch".into(),
        r#type: attribute_type::GRAPHS,
        graphs: vec![GraphProto::default()],
        ..Default::default()
    });
    let m = model(
        vec![n],
        vec![],
        vec![vi("c", 9, &[])],
        vec![vi("y", 1, &[4])],
    );
    expect_err(
        import(&m),
        &[
            "node 'cond' (If)",
            "then_branch",
            "only single-graph subgraph attributes are supported",
        ],
    );
    // A subgraph reading a name no scope defines names it.
    let mut m = if_model();
    let g = m.graph.as_mut().unwrap();
    g.input.retain(|i| i.name != "x");
    expect_err(import(&m), &["node 'cond' (If)", "then_branch", "'x'"]);
}

#[test]
fn bad_sparse_initializer() {
    let mut m = relu_model(vec![]);
    m.graph
        .as_mut()
        .unwrap()
        .sparse_initializer
        .push(SparseTensorProto {
            values: Some(tensor("sp", 1, &[0])),
            indices: Some(tensor("sp_idx", 7, &[0])),
            dims: vec![4],
        });
    expect_err(
        import(&m),
        &["'sp'", "sparse initializers are not supported"],
    );
}

/// Corrupted and truncated files give errors (or, by chance, a valid model), never a panic.
#[test]
fn corrupted_files_never_panic() {
    // gpt2_tiny, mutated only outside the weights' raw data (where the structure is).
    let orig = std::fs::read(model_path("gpt2_tiny.onnx")).unwrap();
    let buf = Bytes::from(orig.clone());
    let base = buf.as_ptr() as usize;
    let m = onnx::from_bytes(buf, None, "gpt2_tiny").unwrap();
    let mut weights: Vec<(usize, usize)> = m
        .graph
        .initializers
        .values()
        .map(|t| {
            let r = t.raw().unwrap();
            (
                r.as_ptr() as usize - base,
                r.as_ptr() as usize - base + r.len(),
            )
        })
        .collect();
    weights.sort();
    let structure: Vec<usize> = (0..orig.len())
        .filter(|i| !weights.iter().any(|(a, b)| a <= i && i < b))
        .collect();
    assert!(structure.len() > 10_000);
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let (mut ok, mut err) = (0, 0);
    for i in 0..300 {
        let mut b = orig.clone();
        if i % 4 == 0 {
            b.truncate(structure[(rnd() as usize) % structure.len()]);
        } else {
            for _ in 0..1 + i % 7 {
                let at = structure[(rnd() as usize) % structure.len()];
                b[at] = rnd() as u8;
            }
        }
        match onnx::from_bytes(Bytes::from(b), None, "fuzz.onnx") {
            Ok(m) => {
                ok += 1;
                // Whatever imported must also export.
                let _ = onnx::to_bytes(&m);
            }
            Err(e) => {
                err += 1;
                assert!(!e.to_string().is_empty());
            }
        }
    }
    eprintln!("{ok} imported, {err} rejected");
    assert!(err > 100 && ok + err == 300);
}
