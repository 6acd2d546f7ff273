//! The `lower` pass: LSTM, GRU and Resize/Upsample rewritten into ops with kernels and gradient
//! rules.
//!
//! `scripts/lowering_cases.py` writes small models (every ONNX form the pass covers: LSTM/GRU
//! directions, initial states, peepholes, clip, layout 1, linear_before_reset, activations;
//! Resize nearest/linear/cubic with every coordinate transform and nearest mode, scales or
//! sizes, opsets 9-19) and onnxruntime's outputs for them. This test lowers each, checks that
//! no such op is left, runs the lowered model on the reference executor in float32 and float64
//! and compares with onnxruntime, then differentiates the float64 model and has
//! `scripts/fd_check.py` compare every gradient (the input X included) with central finite
//! differences. Needs python3 with onnx, onnxruntime and numpy; skipped (with a note) without
//! them unless `CI` is set.

use pipec_compiler::ir::{DType, Dim, Graph, Module, OpData, TensorData, TensorType};
use pipec_passes::autodiff::{differentiate, Autodiff};
use pipec_passes::lower::{is_lowered, lower};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn have_python() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import onnx, onnxruntime, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "python3 with onnx, onnxruntime and numpy is required under CI"
    );
    ok
}

/// Lower the model at `p`, check nothing is left to lower, run it and compare every output with
/// `refs` (max |a - b| / (1 + |b|)).
fn forward_matches(p: &Path, refs: &[(String, TensorData)], tol: f64) -> Result<Module, String> {
    let mut m = pipec_compiler::onnx::import::load(p).map_err(|e| e.to_string())?;
    pipec_compiler::shape::infer_shapes(&mut m).map_err(|e| e.to_string())?;
    let l = lower(&mut m).map_err(|e| e.to_string())?;
    if l.is_empty() {
        return Err("nothing was lowered".into());
    }
    if let Some(op) = m
        .graph
        .order
        .iter()
        .find(|&&o| is_lowered(&m.graph.ops[o].op_type))
    {
        return Err(format!("{} is left", m.graph.ops[*op].name));
    }
    pipec_compiler::verify::verify(&m).map_err(|e| e.to_string())?;
    let res = pipec_runtime::run_graph(&m, &[]).map_err(|e| e.to_string())?;
    for (name, want) in refs {
        let got = res
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, t)| t)
            .ok_or_else(|| format!("no output {name}"))?;
        if got.dims != want.dims {
            return Err(format!("{name}: dims {:?}, want {:?}", got.dims, want.dims));
        }
        let (g, w) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
        let err = g
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
            // NaN-propagating max: f64::max would drop a NaN output.
            .fold(0.0, |m: f64, e| {
                if m.is_nan() || e.is_nan() {
                    f64::NAN
                } else {
                    m.max(e)
                }
            });
        if err.is_nan() || err > tol {
            return Err(format!("{name}: error {err:.2e} > {tol:.0e}"));
        }
    }
    Ok(m)
}

#[test]
fn lowered_ops_match_onnxruntime_and_finite_differences() {
    if !have_python() {
        eprintln!("note: python3 with onnx/onnxruntime not found; skipping");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pipec-lower-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let st = Command::new("python3")
        .arg(root().join("scripts/lowering_cases.py"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success(), "lowering_cases.py failed");
    let mut cases: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().to_string();
            n.strip_suffix(".ref.npz").map(str::to_string)
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let mut failures = Vec::new();
    let mut differentiated = 0;
    for c in &cases {
        let refs = pipec_runtime::npz::read_npz(&dir.join(format!("{c}.ref.npz"))).unwrap();
        // float32: the same arithmetic as onnxruntime up to summation order.
        if let Err(e) = forward_matches(&dir.join(format!("{c}.f32.onnx")), &refs, 2e-5) {
            failures.push(format!("{c} (f32): {e}"));
        }
        // float64 on float32-representable data: onnxruntime's float32 round-off dominates.
        let res = forward_matches(&dir.join(format!("{c}.onnx")), &refs, 2e-5).and_then(|mut m| {
            if m.opset() < 13 {
                return Ok(()); // autodiff needs opset >= 13; the forward is checked above
            }
            differentiated += 1;
            let t = differentiate(&mut m, &Autodiff::default()).map_err(|e| e.to_string())?;
            if t.grads.is_empty() {
                return Err("no gradients".into());
            }
            pipec_compiler::verify::verify(&m).map_err(|e| e.to_string())?;
            pipec_compiler::onnx::export::save(&m, &dir.join(format!("{c}.train.onnx")))
                .map_err(|e| e.to_string())
        });
        if let Err(e) = res {
            failures.push(format!("{c} (f64): {e}"));
        }
    }
    let out = Command::new("python3")
        .arg(root().join("scripts/fd_check.py"))
        .arg(&dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout);
    eprintln!("{log}{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "lowering failed on: {failures:#?}");
    assert!(
        out.status.success(),
        "finite-difference check failed:\n{log}"
    );
    // Every case of opset >= 13 (all but the Resize-10 and Upsample-9 ones) was differentiated
    // and checked in float64.
    assert_eq!(differentiated + 2, cases.len());
    assert_eq!(
        log.lines()
            .filter(|l| l.starts_with("ok ") && l.contains(" f64 "))
            .count(),
        differentiated,
        "{log}"
    );
}

/// `LSTM(X, W, R)` with X `[seq, 2, 4]`, hidden 3.
fn lstm_module(seq: Dim) -> Module {
    let mut g = Graph::new("g");
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, vec![seq, Dim::Known(2), Dim::Known(4)]),
    );
    let w = g.add_initializer("w", TensorData::from_f32(vec![1, 12, 4], &[0.1; 48]));
    let r = g.add_initializer("r", TensorData::from_f32(vec![1, 12, 3], &[0.1; 36]));
    let (_, outs) = g.add_op(
        OpData {
            name: "the_lstm".into(),
            op_type: "LSTM".into(),
            inputs: vec![Some(x), Some(w), Some(r)],
            attrs: [("hidden_size".to_string(), pipec_compiler::ir::Attr::Int(3))]
                .into_iter()
                .collect(),
            ..Default::default()
        },
        vec![("y".into(), TensorType::unranked(DType::F32))],
    );
    g.outputs = outs;
    let mut m = Module {
        graph: g,
        ..Default::default()
    };
    m.opset_imports.insert(String::new(), 17);
    m
}

#[test]
fn dynamic_sequence_length_is_refused_naming_the_node() {
    let mut m = lstm_module(Dim::sym("seq"));
    let e = lower(&mut m).unwrap_err().to_string();
    assert!(e.contains("the_lstm"), "{e}");
    assert!(e.contains("sequence length"), "{e}");
    // With the length known the same model lowers, to ops with no LSTM left.
    let mut m = lstm_module(Dim::Known(3));
    let l = lower(&mut m).unwrap();
    assert_eq!(l.rnn, 1);
    assert!(m
        .graph
        .order
        .iter()
        .all(|o| m.graph.ops[*o].op_type != "LSTM"));
    assert_eq!(m.graph.name(m.graph.outputs[0]), "y");
    assert_eq!(
        m.graph.ty(m.graph.outputs[0]).static_dims(),
        Some(vec![3, 1, 2, 3])
    );
}

#[test]
fn modules_without_such_ops_are_untouched() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Known(2)]));
    let (_, outs) = g.add_op(
        OpData {
            name: "r".into(),
            op_type: "Relu".into(),
            inputs: vec![Some(x)],
            ..Default::default()
        },
        vec![("y".into(), TensorType::unranked(DType::F32))],
    );
    g.outputs = outs;
    let mut m = Module {
        graph: g,
        ..Default::default()
    };
    let before = format!("{:?}", m.graph);
    assert!(lower(&mut m).unwrap().is_empty());
    assert_eq!(format!("{:?}", m.graph), before);
}
