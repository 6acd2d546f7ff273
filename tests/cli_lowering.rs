//! `pipec grad` on PyTorch exports that need the `lower` pass (`onnx-models/gen_lowering_models.py`):
//! nn.LSTM (2 layers, bidirectional, batch first), nn.GRU, nn.EmbeddingBag (a `Loop` over the
//! bags, trip count from the offsets' shape; on a 2-D input, `batch` trips, rewritten without the
//! loop) and F.interpolate (bilinear and nearest `Resize`).
//! Loss, output and every parameter gradient are compared with PyTorch's
//! (`scripts/compare_grads.py`, max relative error 1e-4); with the batch kept symbolic the
//! exported training graph is also checked by onnxruntime (`scripts/ort_check_training.py`).
//! Needs python3 with onnx, onnxruntime and numpy.

mod common;
use common::*;
use std::process::Command;

fn check_model(name: &str, symbolic: bool) {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let m = model(&format!("{name}.onnx"));
    let r = model(&format!("{name}.ref.npz"));
    let out = dir.path().join("out.npz");
    let (m, r) = (m.to_str().unwrap(), r.to_str().unwrap());
    pipec_ok(&["grad", m, "--inputs", r, "-o", out.to_str().unwrap()]);
    let (ok, log) = run_script(
        "compare_grads.py",
        &[out.as_path(), std::path::Path::new(r)],
    );
    eprintln!("{name}: {}", log.lines().last().unwrap_or(""));
    assert!(ok, "{name}: pipec grad differs from PyTorch:\n{log}");
    if symbolic {
        let out2 = dir.path().join("out_sym.npz");
        let train = dir.path().join("train.onnx");
        pipec_ok(&[
            "grad",
            m,
            "--inputs",
            r,
            "-o",
            out2.to_str().unwrap(),
            "--keep-symbolic",
            "--save-training-graph",
            train.to_str().unwrap(),
        ]);
        let (ok, log) = run_script(
            "ort_check_training.py",
            &[train.as_path(), std::path::Path::new(r)],
        );
        assert!(
            ok,
            "{name}: the training graph fails in onnxruntime:\n{log}"
        );
    }
}

#[test]
fn grad_lstm_tiny() {
    check_model("lstm_tiny", true);
}

#[test]
fn grad_gru_tiny() {
    check_model("gru_tiny", true);
}

#[test]
fn grad_embbag_tiny() {
    check_model("embbag_tiny", false);
}

#[test]
fn grad_interp_tiny() {
    check_model("interp_tiny", true);
}

#[test]
fn loop_with_a_dynamic_trip_count_is_refused_naming_the_node() {
    // embbag_tiny's trip count comes from the offsets' shape: with that shape left symbolic
    // the loop cannot be unrolled.
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let src = model("embbag_tiny.onnx");
    let dst = dir.path().join("dyn.onnx");
    let st = Command::new("python3")
        .args([
            "-c",
            "import onnx,sys; m=onnx.load(sys.argv[1]); \
             [d.Clear() or setattr(d,'dim_param','nbags') for i in m.graph.input if i.name=='off' \
              for d in i.type.tensor_type.shape.dim]; onnx.save(m, sys.argv[2])",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(st.success());
    // The lowering pass alone (no arrays to size `nbags` from) must refuse the loop.
    let o = pipec(&[
        "opt",
        dst.to_str().unwrap(),
        "--passes",
        "shape-infer,lower",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("(Loop)"), "{err}");
    assert!(err.contains("trip count"), "{err}");
    // `pipec grad` sizes every non-batch dim from the arrays (even with --keep-symbolic), so the
    // same model then unrolls and trains.
    let r = model("embbag_tiny.ref.npz");
    let out = dir.path().join("o.npz");
    let o = pipec(&[
        "grad",
        dst.to_str().unwrap(),
        "--inputs",
        r.to_str().unwrap(),
        "--keep-symbolic",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn grad_embbag2d_tiny() {
    // EmbeddingBag (sum and mean) on a 2-D input: the loops over the bags run `batch` times, so
    // they are rewritten to a Gather and a reduction instead of unrolled; with the batch kept
    // symbolic the training graph must still run in onnxruntime.
    check_model("embbag2d_tiny", true);
}
