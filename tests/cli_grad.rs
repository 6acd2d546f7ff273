//! `pipec grad`: every dev model against the PyTorch reference in `onnx-models/NAME.ref.npz`
//! (max relative error <= 1e-4, relative to the largest |value| of each tensor; resnet18's big
//! parameters through their samples plus L2/sum stats), and the exported training graph checked
//! independently (onnx.checker full_check + onnxruntime) with the batch left symbolic.
//! Needs python3 with onnx, onnxruntime and numpy (the temporary executor uses them too).

mod common;
use common::*;
use std::process::Command;

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
    let (ok, log) = run_script("compare_grads.py", &[&out, &r]);
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
    let (ok, log) = run_script("ort_check_training.py", &[&train, &r]);
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
g = h.make_graph([h.make_node("Mul", ["x", "w"], ["m"], name="mul0"),
                  h.make_node("Atan", ["m"], ["y"], name="my_atan")],
                 "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                 [h.make_tensor_value_info("y", T.FLOAT, [2, 3])], [w])
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
        err.contains("my_atan") && err.contains("Atan") && err.contains("no gradient rule"),
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

/// `pipec grad ... --precision f64` (plus `extra` flags) on MODEL with the arrays of INPUTS;
/// returns every array of OUT.npz.
fn grad_arrays(
    m: &std::path::Path,
    inputs: &std::path::Path,
    out: &std::path::Path,
    extra: &[&str],
) -> Vec<(String, pipec_runtime::Tensor)> {
    let mut args = vec![
        "grad",
        m.to_str().unwrap(),
        "--inputs",
        inputs.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    pipec_ok(&args);
    pipec_runtime::npz::read(out).expect("read OUT.npz")
}

/// max |a - b| / max |b| (0 when both are all-zero).
fn rel(a: &pipec_runtime::Tensor, b: &pipec_runtime::Tensor) -> f64 {
    let (a, b) = (a.to_f64(), b.to_f64());
    assert_eq!(a.shape(), b.shape());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    if scale > 0.0 {
        diff / scale
    } else {
        diff
    }
}

/// `--precision f64` runs the whole training graph in float64: every output array is float64,
/// and the gradients agree with the float32 run to float32 rounding on bundled models.
#[test]
fn grad_f64_agrees_with_f32_to_rounding() {
    for name in ["mlp4", "inception_mini"] {
        let dir = tempdir();
        let m = model(&format!("{name}.onnx"));
        let r = model(&format!("{name}.ref.npz"));
        let f32s = grad_arrays(&m, &r, &dir.path().join("f32.npz"), &[]);
        let f64s = grad_arrays(&m, &r, &dir.path().join("f64.npz"), &["--precision", "f64"]);
        assert_eq!(f32s.len(), f64s.len(), "{name}");
        let mut grads = 0;
        for ((k, a), (k2, b)) in f32s.iter().zip(&f64s) {
            assert_eq!(k, k2);
            assert_eq!(a.dtype(), pipec_compiler::ir::DType::F32, "{name} {k}");
            assert_eq!(b.dtype(), pipec_compiler::ir::DType::F64, "{name} {k}");
            let e = rel(a, b);
            assert!(e < 1e-4, "{name}: {k} float32 is {e:.2e} from float64");
            grads += k.starts_with("grad/") as usize;
        }
        assert!(grads > 0, "{name}: no gradients");
    }
}

/// A ReLU whose input is exactly 0 in float32 (`fl(fl(a p + b) - c) = 0`, `c = fl(a + b)`) but
/// 2^-25 in float64: the float64 gradient of `p` takes the other branch (2a instead of 0), and
/// `--f32-branches` (the ReLU mask fed from the float32 run) gives float32's branch back, exact.
#[test]
fn f32_branches_follow_float32_at_a_relu_tie() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let path = dir.path().join("kink.onnx");
    let npz = dir.path().join("in.npz");
    let src = format!(
        r#"
import numpy as np, onnx
from onnx import helper as h, TensorProto as T
f = lambda v: onnx.numpy_helper.from_array(np.array([v], np.float32), None)
p, q = onnx.numpy_helper.from_array(np.ones(1, np.float32), "p"), onnx.numpy_helper.from_array(np.ones(1, np.float32), "q")
nodes = [h.make_node("Mul", ["a", "p"], ["u"]), h.make_node("Add", ["u", "b"], ["s"]),
         h.make_node("Sub", ["s", "c"], ["d"]), h.make_node("Relu", ["d"], ["r"], name="kink"),
         h.make_node("Add", ["r", "q"], ["y"])]
vi = lambda n: h.make_tensor_value_info(n, T.FLOAT, [1])
g = h.make_graph(nodes, "g", [vi("a"), vi("b"), vi("c")], [vi("y")], [p, q])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), r"{}")
a, b = np.float32(0.7566899), np.float32(0.25809005)
c = np.float32(a + b)
assert np.float32(np.float32(a + b) - c) == 0 and float(a) + float(b) - float(c) > 0
np.savez(r"{}", a=np.array([a]), b=np.array([b]), c=np.array([c]))
"#,
        path.display(),
        npz.display()
    );
    let st = Command::new("python3").args(["-c", &src]).status().unwrap();
    assert!(st.success());
    let get = |v: &[(String, pipec_runtime::Tensor)], k: &str| {
        v.iter()
            .find(|(n, _)| n == k)
            .map(|(_, t)| t.to_f64().iter().copied().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let f32s = grad_arrays(&path, &npz, &dir.path().join("f32.npz"), &[]);
    let f64s = grad_arrays(
        &path,
        &npz,
        &dir.path().join("f64.npz"),
        &["--precision", "f64"],
    );
    let f64b = grad_arrays(
        &path,
        &npz,
        &dir.path().join("f64b.npz"),
        &["--precision", "f64", "--f32-branches"],
    );
    let a = 0.7566899f32 as f64;
    // float32: mask off, dL/dp = 0; float64: mask on, dL/dp = 2 y a with y = 1 + 2^-25.
    assert_eq!(get(&f32s, "grad/p"), vec![0.0]);
    let g64 = get(&f64s, "grad/p")[0];
    assert!(
        (g64 - 2.0 * a).abs() < 1e-6,
        "float64 took the other branch: {g64}"
    );
    assert_eq!(get(&f64b, "grad/p"), vec![0.0]);
    // q's gradient does not depend on the branch: 2 y in both.
    assert!((get(&f64b, "grad/q")[0] - 2.0).abs() < 1e-6);
}

/// `--precision f64` refuses a model that computes in float16, naming the value and node;
/// `--f32-branches` needs `--precision f64`.
#[test]
fn precision_f64_errors() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let path = dir.path().join("half.onnx");
    let npz = dir.path().join("in.npz");
    let src = format!(
        r#"
import numpy as np, onnx
from onnx import helper as h, TensorProto as T
w = onnx.numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
g = h.make_graph([h.make_node("Cast", ["x"], ["xh"], to=T.FLOAT16, name="to_half"),
                  h.make_node("Cast", ["xh"], ["xf"], to=T.FLOAT, name="to_float"),
                  h.make_node("Mul", ["xf", "w"], ["y"], name="mul0")],
                 "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                 [h.make_tensor_value_info("y", T.FLOAT, [2, 3])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), r"{}")
np.savez(r"{}", x=np.ones((2, 3), np.float32))
"#,
        path.display(),
        npz.display()
    );
    let st = Command::new("python3").args(["-c", &src]).status().unwrap();
    assert!(st.success());
    let o = dir.path().join("o.npz");
    let (p, n, o) = (
        path.to_str().unwrap(),
        npz.to_str().unwrap(),
        o.to_str().unwrap(),
    );
    let out = pipec(&["grad", p, "--inputs", n, "-o", o, "--precision", "f64"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("half.onnx") && err.contains("'xh'") && err.contains("to_half"),
        "{err}"
    );
    let out = pipec(&["grad", p, "--inputs", n, "-o", o, "--f32-branches"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--f32-branches") && err.contains("--precision f64"),
        "{err}"
    );
}

/// MaxPool over tied values routes each window's gradient to ONE element, the first maximum in
/// row-major window order (the ONNX `Indices` output as onnxruntime computes it, and PyTorch's
/// max_pool2d), not to every tied element: all-zero windows (ReLU outputs) are common.
#[test]
fn maxpool_ties_route_the_gradient_to_the_first_argmax() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let path = dir.path().join("pool.onnx");
    let npz = dir.path().join("in.npz");
    let src = format!(
        r#"
import numpy as np, onnx
from onnx import helper as h, TensorProto as T
w = onnx.numpy_helper.from_array(np.zeros((1, 1, 4, 4), np.float32), "w")
g = h.make_graph([h.make_node("Add", ["x", "w"], ["m"]),
                  h.make_node("MaxPool", ["m"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                 "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, 4, 4])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 1, 2, 2])], [w])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), r"{}")
# windows: all 0; all 1; 2 tied at the second and fourth place; a single max at the third
x = np.array([[0, 0, 1, 1], [0, 0, 1, 1], [0, 2, 0, 0], [0, 2, 3, 0]], np.float32)
np.savez(r"{}", x=x.reshape(1, 1, 4, 4))
"#,
        path.display(),
        npz.display()
    );
    let st = Command::new("python3").args(["-c", &src]).status().unwrap();
    assert!(st.success());
    let out = grad_arrays(&path, &npz, &dir.path().join("o.npz"), &["--loss", "sum"]);
    let gw = out
        .iter()
        .find(|(k, _)| k == "grad/w")
        .map(|(_, t)| t.to_f64().iter().copied().collect::<Vec<_>>())
        .expect("grad/w");
    // dL/dw = 1 where each window's gradient lands, 0 elsewhere: flat positions 0, 2, 9, 14,
    // the Indices onnxruntime's MaxPool and PyTorch's max_pool2d return for this x.
    #[rustfmt::skip]
    let want = vec![
        1.0, 0.0, 1.0, 0.0,
        0.0, 0.0, 0.0, 0.0,
        0.0, 1.0, 0.0, 0.0,
        0.0, 0.0, 1.0, 0.0,
    ];
    assert_eq!(gw, want);
}
