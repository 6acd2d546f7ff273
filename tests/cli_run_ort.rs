//! `pipec run --executor ort --check`: the bundled models' programs, every planner, executed
//! piece by piece with ONNX Runtime (CPU provider) and compared with single-device training on
//! pipec's reference interpreter.
//!
//! ONNX Runtime is opened at run time from the `onnxruntime` Python package that
//! `scripts/setup.sh` installs; the tests skip (saying so) where `python3` has none, as the other
//! onnxruntime oracles do. SGD with momentum at lr 0.01: large steps let a float32 rounding
//! difference between the two engines flip a ReLU or max-pool decision (inception_mini at lr 0.1
//! jumps from 1e-7 to 8e-4 at step 2), and Adam amplifies rounding on near-zero gradients
//! (`run --accuracy` tells both apart); neither is what this test is about.

mod common;

use common::{model, pipec, pipec_ok, python_with_onnx, tempdir};

/// Every planner the CLI accepts.
const PLANNERS: &[&str] = pipec_passes::planners::PLANNER_NAMES;

/// `pipec compile MODEL --device-kind cpu-core --planner PLANNER -o OUT` on the cluster CLUSTER
/// (more flags in `extra`), training batch 8 in micro-batches of 2 with SGD and momentum.
fn compile(
    model: &std::path::Path,
    cluster: &str,
    planner: &str,
    extra: &[&str],
    out: &str,
) -> std::process::Output {
    let m = model.to_str().unwrap();
    let mut args = vec![
        "compile",
        m,
        "--cluster",
        cluster,
        "--device-kind",
        "cpu-core",
        "--planner",
        planner,
        "-o",
        out,
        "--batch",
        "8",
        "--micro-batch",
        "2",
        "--optimizer",
        "sgd:lr=0.01,momentum=0.9",
    ];
    args.extend_from_slice(extra);
    pipec(&args)
}

/// Compile MODEL for 4 CPU-core devices with PLANNER, run 2 steps on ONNX Runtime with
/// `--check`; a failure message, or None.
fn ort_case(name: &str, planner: &str) -> Option<String> {
    let t = tempdir();
    let out = t.path().join("o");
    let m = model(&format!("{name}.onnx"));
    let o = out.to_str().unwrap();
    let c = compile(&m, "8@1e10", planner, &["--devices", "4"], o);
    if !c.status.success() {
        return Some(format!(
            "{name}/{planner}: compile failed: {}",
            String::from_utf8_lossy(&c.stderr)
        ));
    }
    let r = pipec(&["run", o, "--steps", "2", "--check", "--executor", "ort"]);
    let so = String::from_utf8_lossy(&r.stdout);
    if !r.status.success() || !so.contains("check ok") {
        return Some(format!(
            "{name}/{planner}: {so}\n{}",
            String::from_utf8_lossy(&r.stderr)
        ));
    }
    None
}

/// Models × planners, each model with two planners in turn so that every planner meets several
/// models.
fn matrix(models: &[&str], first: usize) {
    if python_with_onnx().is_none() {
        eprintln!("skipped: python3 has no onnxruntime (scripts/setup.sh installs it)");
        return;
    }
    let mut failures = Vec::new();
    for (i, name) in models.iter().enumerate() {
        for k in 0..2 {
            let planner = PLANNERS[(first + 2 * i + k) % PLANNERS.len()];
            failures.extend(ort_case(name, planner));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn dev_models_on_onnx_runtime_train_like_one_device() {
    matrix(&["mlp4", "gpt2_tiny", "inception_mini"], 0);
}

#[test]
fn more_bundled_models_on_onnx_runtime_train_like_one_device() {
    matrix(
        &[
            "dlrm_tiny",
            "mmt_tiny",
            "vit_tiny",
            "lstm_tiny",
            "interp_tiny",
        ],
        6,
    );
}

/// mlp4 compiled with the runtime tests' flags (`common::MLP4_DAPPLE_4`): its temp folder (keep
/// it alive) and OUTDIR.
fn compiled_mlp4() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempdir();
    let out = t.path().join("o");
    common::compile("mlp4.onnx", &out, common::MLP4_DAPPLE_4);
    (t, out)
}

#[test]
fn a_missing_onnx_runtime_library_is_a_clear_error() {
    let (t, out) = compiled_mlp4();
    let r = std::process::Command::new(env!("CARGO_BIN_EXE_pipec"))
        .args(["run", out.to_str().unwrap(), "--executor", "ort"])
        .env("ORT_DYLIB_PATH", t.path().join("no-such-libonnxruntime.so"))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{e}");
    assert!(
        e.contains("ORT_DYLIB_PATH") && e.contains("no-such-libonnxruntime.so"),
        "{e}"
    );
}

#[test]
fn device_cuda_with_another_executor_is_refused() {
    let (_t, out) = compiled_mlp4();
    let r = pipec(&[
        "run",
        out.to_str().unwrap(),
        "--device",
        "cuda",
        "--executor",
        "tract",
    ]);
    let e = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{e}");
    assert!(
        e.contains("--device cuda") && e.contains("--executor tract"),
        "{e}"
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn device_cuda_without_the_feature_names_the_rebuild() {
    if python_with_onnx().is_none() {
        return;
    }
    let (_t, out) = compiled_mlp4();
    let r = pipec(&["run", out.to_str().unwrap(), "--device", "cuda"]);
    let e = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{e}");
    assert!(e.contains("--features cuda"), "{e}");
}

#[test]
fn ort_runs_are_deterministic() {
    if python_with_onnx().is_none() {
        return;
    }
    let (_t, out) = compiled_mlp4();
    let o = out.to_str().unwrap();
    let losses = |s: String| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("step "))
            .map(String::from)
            .collect()
    };
    let a = losses(pipec_ok(&["run", o, "--steps", "2", "--executor", "ort"]));
    let b = losses(pipec_ok(&["run", o, "--steps", "2", "--executor", "ort"]));
    assert!(!a.is_empty());
    assert_eq!(a, b);
}

/// Parameters, gradients, optimizer state and activations stay in ONNX Runtime's values from
/// one piece and one step to the next, through sends and all-reduces: after the first step placed
/// them, a step of mlp4 moves exactly its data batch in (8 samples x 64 float32 features = 2048
/// bytes) and one float32 loss per micro-batch and replica out (a 2-stage pipeline: 4 x 4 bytes;
/// data parallelism on 2 devices, whose gradients are all-reduced every step: 8 x 4 bytes). The
/// same accounting on the CUDA provider counts host <-> GPU copies.
#[test]
fn a_step_moves_only_its_batch_in_and_its_losses_out() {
    if python_with_onnx().is_none() {
        return;
    }
    for (planner, losses_out) in [("straight", 16), ("dp", 32)] {
        let t = tempdir();
        let out = t.path().join("o");
        let o = out.to_str().unwrap();
        let c = compile(&model("mlp4.onnx"), "2@1e10", planner, &[], o);
        assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
        let moved = |steps: &str| -> (i64, i64) {
            let s = pipec_ok(&["run", o, "--steps", steps, "--executor", "ort"]);
            let l = s
                .lines()
                .find(|l| l.starts_with("host -> ONNX Runtime: "))
                .unwrap_or_else(|| panic!("no transfer line in:\n{s}"));
            let n: Vec<i64> = l
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            (n[0], n[1])
        };
        let (in1, out1) = moved("1");
        let (in3, out3) = moved("3");
        assert_eq!(
            ((in3 - in1) / 2, (out3 - out1) / 2),
            (2048, losses_out),
            "{planner}"
        );
        // The first step placed the parameters and the momentum buffers (134952 bytes each).
        assert!(in1 >= 2 * 134952, "{planner}: {in1}");
    }
}
