//! `pipec run`: a program from `pipec compile` checked against its reference (`--check`), the
//! trace, and the exit codes on hand-built programs (`pipec_runtime::dist::fixtures`):
//! 0 ok, 1 a failing check, 2 missing OUTDIR / file or a schedule that does not verify.

mod common;

use common::{compile, pipec, pipec_ok, tempdir, MLP4_DAPPLE_4};
use pipec_runtime::dist::fixtures::{write_linear, LinearSpec};

#[test]
fn compiled_mlp_runs_and_matches_the_reference() {
    let dir = tempdir();
    let out = dir.path().join("out");
    compile("mlp4.onnx", &out, MLP4_DAPPLE_4);
    let trace = dir.path().join("t.json");
    let params = dir.path().join("p.npz");
    let s = pipec_ok(&[
        "run",
        out.to_str().unwrap(),
        "--steps",
        "3",
        "--check",
        "--trace",
        trace.to_str().unwrap(),
        "-o",
        params.to_str().unwrap(),
    ]);
    assert!(s.contains("step 3: loss"), "{s}");
    assert!(s.contains("max_abs_diff") && s.contains("check ok"), "{s}");
    // The timing table: per device, the worker thread's CPU time within its wall time.
    assert!(s.contains("total_s    cpu_s"), "{s}");
    if cfg!(target_os = "linux") {
        let rows: Vec<Vec<f64>> = s
            .lines()
            .skip_while(|l| !l.starts_with("device  prepare_s"))
            .skip(1)
            .take(4)
            .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
            .collect();
        assert_eq!(rows.len(), 4, "{s}");
        assert!(
            rows.iter().all(|r| r[6] > 0.0 && r[6] <= r[5] * 1.05),
            "{s}"
        );
    }
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let evs = t["traceEvents"].as_array().unwrap();
    if cfg!(target_os = "linux") {
        // The worker thread's CPU time in each instruction.
        assert!(evs
            .iter()
            .filter(|e| e["ph"] == "X")
            .all(|e| e["args"]["cpu_us"].as_f64().is_some_and(|c| c >= 0.0)));
    }
    for d in 0..4 {
        assert!(
            evs.iter().any(|e| e["pid"] == d && e["ph"] == "X"),
            "device {d}"
        );
    }
    let p = pipec_runtime::npz::read(&params).unwrap();
    assert!(p.iter().any(|(k, _)| k == "net.0.weight"), "{p:?}");
}

#[test]
fn hand_built_program_with_replicas_passes_check() {
    let dir = tempdir();
    write_linear(
        dir.path(),
        &LinearSpec {
            replicas0: 2,
            momentum: true,
            ..Default::default()
        },
    )
    .unwrap();
    let s = pipec_ok(&[
        "run",
        dir.path().to_str().unwrap(),
        "--steps",
        "2",
        "--check",
    ]);
    assert!(s.contains("3 devices, 2 stages"), "{s}");
    assert!(s.contains("check ok"), "{s}");
}

#[test]
fn a_failing_check_exits_1() {
    let a = tempdir();
    let b = tempdir();
    write_linear(a.path(), &LinearSpec::default()).unwrap();
    write_linear(
        b.path(),
        &LinearSpec {
            lr: 0.02,
            ..Default::default()
        },
    )
    .unwrap();
    // The reference optimizer now uses another learning rate than the stages.
    std::fs::copy(
        b.path().join("reference/step.onnx"),
        a.path().join("reference/step.onnx"),
    )
    .unwrap();
    let out = pipec(&["run", a.path().to_str().unwrap(), "--check"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{s}");
    assert!(s.contains("check FAILED"), "{s}");
    assert!(s.contains("hint: --accuracy"), "{s}");
}

#[test]
fn a_diverging_reference_makes_the_check_inconclusive_not_a_wrong_program() {
    // A learning rate the model's loss cannot take: the single-device reference itself leaves
    // the finite numbers, and the check says so instead of blaming the program.
    let dir = tempdir();
    let out = dir.path().join("out");
    let mut flags = MLP4_DAPPLE_4.to_vec();
    let at = flags.iter().position(|f| *f == "--optimizer").unwrap();
    flags[at + 1] = "sgd:lr=1e30";
    compile("mlp4.onnx", &out, &flags);
    let r = pipec(&["run", out.to_str().unwrap(), "--steps", "3", "--check"]);
    let s = String::from_utf8_lossy(&r.stdout);
    assert_eq!(r.status.code(), Some(1), "{s}");
    assert!(s.contains("check INCONCLUSIVE"), "{s}");
    assert!(
        s.contains("diverged") && s.contains("smaller learning rate"),
        "{s}"
    );
    assert!(!s.contains("check FAILED"), "{s}");
}

/// `pipec run --check --accuracy`: `(pipeline, reference)` distances from float64 training.
fn accuracy(s: &str) -> (f64, f64) {
    let line = s
        .lines()
        .find_map(|l| l.strip_prefix("accuracy against float64 training: pipeline "))
        .unwrap_or_else(|| panic!("no accuracy line: {s}"));
    let (p, rest) = line.split_once(", reference ").unwrap();
    let r = rest.split_whitespace().next().unwrap();
    (p.parse().unwrap(), r.parse().unwrap())
}

#[test]
fn accuracy_tells_rounding_from_a_wrong_program() {
    // A right program: pipeline and reference equally close to float64 training.
    let a = tempdir();
    let spec = LinearSpec {
        replicas0: 2,
        momentum: true,
        ..Default::default()
    };
    write_linear(a.path(), &spec).unwrap();
    let dir = a.path().to_str().unwrap();
    let s = pipec_ok(&["run", dir, "--steps", "2", "--check", "--accuracy"]);
    let (p, r) = accuracy(&s);
    assert!(s.contains("check ok"), "{s}");
    assert!(p < 1e-6 && r < 1e-6, "{s}");
    // A wrong program (its stages step with another learning rate than the reference): the
    // float32 reference stays close to float64 training, the pipeline does not.
    let b = tempdir();
    write_linear(b.path(), &LinearSpec { lr: 0.02, ..spec }).unwrap();
    std::fs::copy(
        a.path().join("reference/step.onnx"),
        b.path().join("reference/step.onnx"),
    )
    .unwrap();
    let out = pipec(&[
        "run",
        b.path().to_str().unwrap(),
        "--steps",
        "2",
        "--check",
        "--accuracy",
    ]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{s}");
    let (p, r) = accuracy(&s);
    assert!(r < 1e-6 && p > 1e-3, "{s}");
    // Flags: --accuracy needs --check and a float32 run.
    let out = pipec(&["run", dir, "--accuracy"]);
    assert_eq!(out.status.code(), Some(2));
    let out = pipec(&["run", dir, "--check", "--accuracy", "--precision", "f64"]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("--accuracy") && e.contains("--precision f64"),
        "{e}"
    );
}

#[test]
fn bad_input_exits_2_with_a_one_line_error() {
    let dir = tempdir();
    let out = pipec(&["run", dir.path().join("none").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.starts_with("error: ") && e.contains("not a directory"),
        "{e}"
    );

    write_linear(dir.path(), &LinearSpec::default()).unwrap();
    std::fs::remove_file(dir.path().join("stages/s0.step.onnx")).unwrap();
    let out = pipec(&["run", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("stages/s0.step.onnx") && e.contains("missing"),
        "{e}"
    );

    std::fs::write(dir.path().join("schedule.json"), "{}").unwrap();
    let out = pipec(&["run", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("schedule.json") && !e.contains("panicked"),
        "{e}"
    );

    let out = pipec(&["run", dir.path().to_str().unwrap(), "--backend", "tcp"]);
    assert_eq!(out.status.code(), Some(2));

    // Flags are checked before anything runs (a zero-step --check could not fail).
    for (flags, says) in [
        (&["--steps", "0", "--check"][..], "--steps 0"),
        (
            &["--executor", "onnx"][..],
            "--executor onnx: unknown executor",
        ),
        (
            &["--transport", "nccl"][..],
            "--transport nccl sums GPU values with NCCL: it needs --device cuda",
        ),
    ] {
        let mut args = vec!["run", dir.path().to_str().unwrap()];
        args.extend_from_slice(flags);
        let out = pipec(&args);
        assert_eq!(out.status.code(), Some(2));
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.starts_with("error: ") && e.contains(says), "{e}");
        assert!(out.stdout.is_empty(), "{flags:?}");
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn backend_mpi_without_the_feature_is_a_clear_error() {
    let dir = tempdir();
    write_linear(dir.path(), &LinearSpec::default()).unwrap();
    let out = pipec(&["run", dir.path().to_str().unwrap(), "--backend", "mpi"]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("built without MPI") && e.contains("--features mpi"),
        "{e}"
    );
}
