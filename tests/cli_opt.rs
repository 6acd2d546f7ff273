//! `pipec opt`: round trip, mlir-opt acceptance, pass pipelines and their instrumentation.

mod common;
use common::*;
use std::process::Command;

const PIPELINE: &str = "shape-infer,fold-constants,dce";

#[test]
fn text_round_trips_for_every_dev_model() {
    let dir = tempdir();
    for name in DEV_MODELS {
        for passes in ["", PIPELINE] {
            let a = dir.path().join(format!("{name}.a.mlir"));
            let b = dir.path().join(format!("{name}.b.mlir"));
            let src = model(&format!("{name}.onnx"));
            let mut args = vec!["opt", src.to_str().unwrap(), "-o", a.to_str().unwrap()];
            if !passes.is_empty() {
                args.extend(["--passes", passes]);
            }
            pipec_ok(&args);
            pipec_ok(&["opt", a.to_str().unwrap(), "-o", b.to_str().unwrap()]);
            let (ta, tb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
            assert!(
                ta == tb,
                "{name} (passes '{passes}'): a.mlir and b.mlir differ"
            );
        }
    }
}

#[test]
fn mlir_opt_accepts_the_text() {
    let Some(mlir_opt) = mlir_opt() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "mlir-opt is required under CI"
        );
        eprintln!("note: mlir-opt not found; skipping");
        return;
    };
    let dir = tempdir();
    for name in DEV_MODELS {
        let a = dir.path().join(format!("{name}.mlir"));
        let src = model(&format!("{name}.onnx"));
        pipec_ok(&[
            "opt",
            src.to_str().unwrap(),
            "--passes",
            PIPELINE,
            "-o",
            a.to_str().unwrap(),
        ]);
        let out = Command::new(&mlir_opt)
            .arg("--allow-unregistered-dialect")
            .arg(&a)
            .output()
            .expect("run mlir-opt");
        assert!(
            out.status.success(),
            "mlir-opt rejected {name}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn weights_stay_out_of_the_text() {
    let text = pipec_ok(&["opt", model("gpt2_tiny.onnx").to_str().unwrap()]);
    assert!(
        text.contains("dense_resource<"),
        "large weights print as resources"
    );
    assert!(
        text.len() < 1_000_000,
        "gpt2_tiny text is {} bytes",
        text.len()
    );
}

#[test]
fn output_is_deterministic() {
    let p = model("inception_mini.onnx");
    let a = pipec_ok(&["opt", p.to_str().unwrap(), "--passes", PIPELINE]);
    let b = pipec_ok(&["opt", p.to_str().unwrap(), "--passes", PIPELINE]);
    assert_eq!(a, b);
}

#[test]
fn print_ir_after_all_dumps_after_each_pass() {
    let out = pipec(&[
        "opt",
        model("mlp4.onnx").to_str().unwrap(),
        "--passes",
        PIPELINE,
        "--print-ir-after-all",
        "--timing",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for pass in ["shape-infer", "fold-constants", "dce"] {
        assert!(err.contains(&format!("IR Dump After {pass} ")), "{err}");
        assert!(
            err.contains(&format!("  {pass}")),
            "timing row for {pass}: {err}"
        );
    }
    let one = pipec(&[
        "opt",
        model("mlp4.onnx").to_str().unwrap(),
        "--passes",
        PIPELINE,
        "--print-ir-after",
        "dce",
    ]);
    let err = String::from_utf8_lossy(&one.stderr);
    assert_eq!(err.matches("IR Dump After").count(), 1, "{err}");
}

#[test]
fn list_passes_names_the_first_passes() {
    let out = pipec_ok(&["opt", "--list-passes"]);
    for pass in ["shape-infer", "fold-constants", "dce"] {
        assert!(out.lines().any(|l| l.starts_with(pass)), "{out}");
    }
    // Each pass's contract follows its summary: options with kind and default, statistics,
    // what it requires, provides and invalidates.
    for line in [
        "{devices=...} devices to plan for (an integer >= 1, default 4)",
        "{type=...} the update rule (one of sgd, adam, default sgd)",
        "statistics: removed-initializers, removed-ops",
        "requires: pipec.stages (from partition-gpp)",
        "provides: pipec.loss, pipec.params, pipec.grads, pipec.saved",
        "invalidates: pipec.stages",
    ] {
        assert!(out.contains(line), "missing '{line}' in:\n{out}");
    }
}

#[test]
fn unknown_pass_is_a_usage_error() {
    let out = pipec(&[
        "opt",
        model("mlp4.onnx").to_str().unwrap(),
        "--passes",
        "dce,frobnicate",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown pass 'frobnicate'"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn fold_constants_and_dce_shrink_gpt2() {
    let before = pipec_ok(&["opt", model("gpt2_tiny.onnx").to_str().unwrap()]);
    let after = pipec_ok(&[
        "opt",
        model("gpt2_tiny.onnx").to_str().unwrap(),
        "--passes",
        PIPELINE,
    ]);
    let count = |t: &str| t.matches("= \"onnx.").count();
    assert!(
        count(&after) < count(&before),
        "folding shape arithmetic must remove ops: {} -> {}",
        count(&before),
        count(&after)
    );
}

#[test]
fn training_pipeline_with_pass_options_round_trips() {
    let dir = tempdir();
    for name in ["mlp4", "gpt2_tiny"] {
        let a = dir.path().join(format!("{name}.train.mlir"));
        let b = dir.path().join(format!("{name}.train2.mlir"));
        let src = model(&format!("{name}.onnx"));
        pipec_ok(&[
            "opt",
            src.to_str().unwrap(),
            "--passes",
            "shape-infer,autodiff{loss=mean-square},optimizer{type=adam lr=0.001},dce",
            "-o",
            a.to_str().unwrap(),
        ]);
        pipec_ok(&["opt", a.to_str().unwrap(), "-o", b.to_str().unwrap()]);
        assert!(
            std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
            "{name}: training IR must round-trip"
        );
        let text = std::fs::read_to_string(&a).unwrap();
        assert!(
            text.contains("pipec.phase = \"bwd\""),
            "{name}: backward ops are annotated"
        );
        if let Some(mlir_opt) = mlir_opt() {
            let out = Command::new(mlir_opt)
                .arg("--allow-unregistered-dialect")
                .arg(&a)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let bad = pipec(&[
        "opt",
        model("mlp4.onnx").to_str().unwrap(),
        "--passes",
        "autodiff{loss=bogus}",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown loss 'bogus'"));
}
