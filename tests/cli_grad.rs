//! `pipec grad`: every dev model against the PyTorch reference in `onnx-models/NAME.ref.npz`
//! (max relative error <= 1e-4, relative to the largest |value| of each tensor; resnet18's big
//! parameters through their samples plus L2/sum stats), and the exported training graph checked
//! independently (onnx.checker full_check + onnxruntime) with the batch left symbolic.
//! Needs python3 with onnx, onnxruntime and numpy (the temporary executor uses them too).

mod common;
use common::*;
use std::process::Command;

fn py(script: &str, args: &[&std::path::Path]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(root().join("scripts").join(script))
        .args(args)
        .output()
        .expect("run python3");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn check_model(name: &str) {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let m = model(&format!("{name}.onnx"));
    let r = model(&format!("{name}.ref.npz"));
    let out = dir.path().join("out.npz");
    pipec_ok(&[
        "grad",
        m.to_str().unwrap(),
        "--inputs",
        r.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    let (ok, log) = py("compare_grads.py", &[&out, &r]);
    eprintln!("{name} (specialised): {}", log.lines().last().unwrap_or(""));
    assert!(ok, "{name}: pipec grad differs from the reference:\n{log}");

    let out2 = dir.path().join("out_sym.npz");
    let train = dir.path().join("train.onnx");
    pipec_ok(&[
        "grad",
        m.to_str().unwrap(),
        "--inputs",
        r.to_str().unwrap(),
        "-o",
        out2.to_str().unwrap(),
        "--keep-symbolic",
        "--save-training-graph",
        train.to_str().unwrap(),
    ]);
    let (ok, log) = py("ort_check_training.py", &[&train, &r]);
    eprintln!("{name} (symbolic batch, onnxruntime): {log}");
    assert!(
        ok,
        "{name}: the exported training graph fails the check:\n{log}"
    );
}

#[test]
fn grad_mlp4() {
    check_model("mlp4");
}

#[test]
fn grad_inception_mini() {
    check_model("inception_mini");
}

#[test]
fn grad_gpt2_tiny() {
    check_model("gpt2_tiny");
}

#[test]
fn grad_resnet18() {
    check_model("resnet18");
}

#[test]
fn op_without_gradient_rule_is_an_error_naming_node_and_op() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let path = dir.path().join("tile.onnx");
    let npz = dir.path().join("in.npz");
    let src = format!(
        r#"
import numpy as np, onnx
from onnx import helper as h, TensorProto as T
w = onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
reps = onnx.numpy_helper.from_array(np.array([2, 1], np.int64), "reps")
g = h.make_graph([h.make_node("Mul", ["x", "w"], ["m"], name="mul0"),
                  h.make_node("Tile", ["m", "reps"], ["y"], name="my_tile")],
                 "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                 [h.make_tensor_value_info("y", T.FLOAT, [4, 3])], [w, reps])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), r"{}")
np.savez(r"{}", x=np.ones((2, 3), np.float32))
"#,
        path.display(),
        npz.display()
    );
    let st = Command::new("python3").args(["-c", &src]).status().unwrap();
    assert!(st.success());
    let out = pipec(&[
        "grad",
        path.to_str().unwrap(),
        "--inputs",
        npz.to_str().unwrap(),
        "-o",
        dir.path().join("o.npz").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("my_tile") && err.contains("Tile") && err.contains("no gradient rule"),
        "{err}"
    );
}

#[test]
fn bad_loss_is_a_usage_error() {
    let out = pipec(&[
        "grad",
        model("mlp4.onnx").to_str().unwrap(),
        "--inputs",
        model("mlp4.ref.npz").to_str().unwrap(),
        "--loss",
        "hinge",
        "-o",
        "/nonexistent/o.npz",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown loss 'hinge'"));
}
