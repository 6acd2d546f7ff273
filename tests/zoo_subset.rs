//! The zoo matrix (issue #16) on the CI subset in `onnx-models/zoo/`: a Hugging Face BERT
//! (attention, a pooler off the loss path), a UNet (ConvTranspose, skip concatenations) and an
//! LSTM classifier (lowered before autodiff), exported by `scripts/export_zoo.py` with random
//! weights. `scripts/zoo_matrix.py --strict` runs, per model: `pipec grad` in float32 and float64
//! against PyTorch's float32 / float64 gradients (float64 within 1e-6 of PyTorch's; float32
//! within 2x PyTorch's float32 error, branch-matched), then every planner's `compile` on 4 cpu
//! devices and `run --steps 2 --check`. Needs python3 with numpy.

mod common;
use common::*;

#[test]
fn zoo_subset_trains_correctly_with_every_planner() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let json = dir.path().join("zoo.json");
    let zoo = root().join("onnx-models").join("zoo");
    let (ok, log) = run_script(
        "zoo_matrix.py",
        &[
            "--zoo",
            zoo.to_str().unwrap(),
            "--manifest",
            zoo.join("manifest.json").to_str().unwrap(),
            "--pipec",
            env!("CARGO_BIN_EXE_pipec"),
            "--json",
            json.to_str().unwrap(),
            "--strict",
        ],
    );
    assert!(ok, "zoo matrix failed:\n{log}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = j["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["model"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lstm", "bert", "unet"], "{log}");
    for r in results {
        let g = &r["grad"];
        assert_eq!(g["status"], "pass", "{log}");
        assert_eq!(g["judged"], "branch-matched", "{log}");
        assert!(g["tensors"].as_u64().unwrap() > 0, "{log}");
        let planners = r["planners"].as_object().unwrap();
        assert_eq!(planners.len(), 6, "{log}");
        for (p, c) in planners {
            let run = c["run"]["status"].as_str().unwrap_or("-");
            assert!(matches!(run, "pass" | "rounding"), "{p}: {run}\n{log}");
        }
    }
}
