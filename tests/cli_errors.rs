//! Bad input through the CLI: exit code 2, one line naming the problem (and node), no panic, no
//! output file.

mod common;
use common::*;
use pipec_compiler::onnx::proto::tensor_shape_proto::{dimension, Dimension};
use pipec_compiler::onnx::proto::*;
use prost::Message;
use std::path::Path;

fn vi(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
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

fn onnx_model(
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    input: &[i64],
    output: &[i64],
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: nodes,
            initializer: inits,
            input: vec![vi("x", input)],
            output: vec![vi("y", output)],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn i64_tensor(name: &str, vals: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: 7,
        dims: vec![vals.len() as i64],
        int64_data: vals.to_vec(),
        ..Default::default()
    }
}

/// Run `inspect` and `opt -o` on `file`; both must exit 2 with every needle in stderr, no panic,
/// and `opt` must leave no output file.
#[track_caller]
fn expect_bad(dir: &Path, file: &Path, needles: &[&str]) {
    let out_path = dir.join("out.mlir");
    for args in [
        vec!["inspect", file.to_str().unwrap(), "--json"],
        vec![
            "opt",
            file.to_str().unwrap(),
            "-o",
            out_path.to_str().unwrap(),
        ],
    ] {
        let out = pipec(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: stderr lacks '{n}':\n{err}");
        }
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
        assert!(!out_path.exists(), "{args:?} left a partial output");
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn missing_file() {
    let dir = tempdir();
    expect_bad(dir.path(), &dir.path().join("nope.onnx"), &["nope.onnx"]);
}

#[test]
fn empty_random_and_truncated_files() {
    let dir = tempdir();
    let p = write(dir.path(), "empty.onnx", b"");
    expect_bad(dir.path(), &p, &["empty.onnx", "empty"]);
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let p = write(dir.path(), "noise.onnx", &noise);
    expect_bad(dir.path(), &p, &["noise.onnx"]);
    let full = std::fs::read(model("mlp4.onnx")).unwrap();
    let p = write(dir.path(), "half.onnx", &full[..full.len() / 2]);
    expect_bad(dir.path(), &p, &["half.onnx"]);
}

#[test]
fn unknown_op_names_node_and_type() {
    let dir = tempdir();
    let m = onnx_model(
        vec![node("weird0", "FrobnicateTensor", &["x"], &["y"])],
        vec![],
        &[4],
        &[4],
    );
    let p = write(dir.path(), "unknown.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["weird0", "FrobnicateTensor"]);
}

#[test]
fn cycle_and_dangling_input() {
    let dir = tempdir();
    let m = onnx_model(
        vec![
            node("a", "Relu", &["b_out"], &["a_out"]),
            node("b", "Add", &["a_out", "x"], &["b_out"]),
            node("c", "Identity", &["a_out"], &["y"]),
        ],
        vec![],
        &[4],
        &[4],
    );
    let p = write(dir.path(), "cycle.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["cycle"]);
    let m = onnx_model(
        vec![node("lonely", "Add", &["x", "ghost"], &["y"])],
        vec![],
        &[4],
        &[4],
    );
    let p = write(dir.path(), "dangling.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["lonely", "ghost"]);
}

#[test]
fn reshape_element_count_mismatch() {
    let dir = tempdir();
    let m = onnx_model(
        vec![node("bad_reshape", "Reshape", &["x", "shape"], &["y"])],
        vec![i64_tensor("shape", &[3, 5])],
        &[2, 6],
        &[3, 5],
    );
    let p = write(dir.path(), "reshape.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["bad_reshape", "Reshape"]);
}

#[test]
fn huge_initializer_without_data() {
    let dir = tempdir();
    let big = TensorProto {
        name: "huge".into(),
        data_type: 1,
        dims: vec![1_000_000, 1_000_000],
        ..Default::default()
    };
    let m = onnx_model(
        vec![node("add", "Add", &["x", "huge"], &["y"])],
        vec![big],
        &[4],
        &[4],
    );
    let p = write(dir.path(), "huge.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["huge"]);
    let over = TensorProto {
        name: "over".into(),
        data_type: 1,
        dims: vec![i64::MAX, 4],
        ..Default::default()
    };
    let m = onnx_model(
        vec![node("add", "Add", &["x", "over"], &["y"])],
        vec![over],
        &[4],
        &[4],
    );
    let p = write(dir.path(), "overflow.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["over"]);
}

#[test]
fn external_data_leaving_the_folder() {
    let dir = tempdir();
    let ext = TensorProto {
        name: "w".into(),
        data_type: 1,
        dims: vec![4],
        data_location: DATA_LOCATION_EXTERNAL,
        external_data: vec![StringStringEntryProto {
            key: "location".into(),
            value: "../../etc/passwd".into(),
        }],
        ..Default::default()
    };
    let m = onnx_model(
        vec![node("add", "Add", &["x", "w"], &["y"])],
        vec![ext],
        &[4],
        &[4],
    );
    let p = write(dir.path(), "escape.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["'w'", "../../etc/passwd"]);
    // past the end of its file
    std::fs::write(dir.path().join("w.bin"), [0u8; 8]).unwrap();
    let ext = TensorProto {
        name: "w".into(),
        data_type: 1,
        dims: vec![4],
        data_location: DATA_LOCATION_EXTERNAL,
        external_data: vec![
            StringStringEntryProto {
                key: "location".into(),
                value: "w.bin".into(),
            },
            StringStringEntryProto {
                key: "offset".into(),
                value: "4".into(),
            },
        ],
        ..Default::default()
    };
    let m = onnx_model(
        vec![node("add", "Add", &["x", "w"], &["y"])],
        vec![ext],
        &[4],
        &[4],
    );
    let p = write(dir.path(), "pastend.onnx", &m.encode_to_vec());
    expect_bad(dir.path(), &p, &["'w'"]);
}

#[test]
fn unparsable_text_ir_names_line_and_column() {
    let dir = tempdir();
    let p = write(dir.path(), "bad.mlir", b"\"builtin.module\"() ({\n  %0 = \"onnx.Relu\"(%nothing) : (tensor<4xf32>) -> tensor<4xf32>\n");
    let out = pipec(&["opt", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.mlir:"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
