//! `pipec inspect`: counts against the Python `onnx` package as the oracle.

mod common;
use common::*;
use std::process::Command;

fn oracle(path: &std::path::Path) -> Option<serde_json::Value> {
    let py = python_with_onnx()?;
    let out = Command::new(py)
        .arg(root().join("scripts/onnx_stats.py"))
        .arg(path)
        .output()
        .expect("run onnx_stats.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("oracle JSON"))
}

#[test]
fn inspect_matches_python_onnx_on_dev_models() {
    for name in DEV_MODELS {
        let path = model(&format!("{name}.onnx"));
        let got: serde_json::Value =
            serde_json::from_str(&pipec_ok(&["inspect", path.to_str().unwrap(), "--json"]))
                .unwrap();
        let Some(want) = oracle(&path) else { return };
        for key in [
            "nodes",
            "parameters",
            "parameter_bytes",
            "op_types",
            "inputs",
        ] {
            assert_eq!(
                got[key], want[key],
                "{name}: field '{key}' differs from python onnx"
            );
        }
        // Outputs: same names, dtypes and ranks; a dim the file declares as a number must match,
        // and a dim it leaves symbolic may be resolved by shape inference (gpt2_tiny declares
        // `MatMullogits_dim_1` where inference knows 32).
        let (g, w) = (
            got["outputs"].as_array().unwrap(),
            want["outputs"].as_array().unwrap(),
        );
        assert_eq!(g.len(), w.len(), "{name}: output count");
        for (g, w) in g.iter().zip(w) {
            assert_eq!(g["name"], w["name"]);
            assert_eq!(g["dtype"], w["dtype"]);
            let (gs, ws) = (
                g["shape"].as_array().unwrap(),
                w["shape"].as_array().unwrap(),
            );
            assert_eq!(gs.len(), ws.len(), "{name}: output rank");
            for (gd, wd) in gs.iter().zip(ws) {
                if wd.is_i64() {
                    assert_eq!(gd, wd, "{name}: output dims {gs:?} vs declared {ws:?}");
                }
            }
        }
    }
}

#[test]
fn inspect_reports_series_parallel_structure() {
    let sp = |name: &str| {
        let j: serde_json::Value = serde_json::from_str(&pipec_ok(&[
            "inspect",
            model(&format!("{name}.onnx")).to_str().unwrap(),
            "--json",
        ]))
        .unwrap();
        (
            j["series_parallel"].as_bool().unwrap(),
            j["multi_consumer_nodes"].as_u64().unwrap(),
        )
    };
    // A chain: series-parallel, no fan-out.
    assert_eq!(sp("mlp4"), (true, 0));
    // Residual blocks and inception branches are series-parallel, with fan-out at every block.
    let (r_sp, r_multi) = sp("resnet18");
    assert!(r_sp);
    assert_eq!(r_multi, 8, "resnet18 has 8 residual forks");
    assert!(sp("inception_mini").0);
    // GPT-2's position ids and attention mask feed every layer: not series-parallel as exported.
    assert!(!sp("gpt2_tiny").0);
}

#[test]
fn inspect_text_lists_inputs_and_ops() {
    let out = pipec_ok(&["inspect", model("resnet18.onnx").to_str().unwrap()]);
    assert!(out.contains("nodes:       69"), "{out}");
    assert!(out.contains("input: float32[batch, 3, 224, 224]"), "{out}");
    assert!(out.contains("Conv"), "{out}");
}
