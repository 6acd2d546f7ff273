//! Helpers shared by the end-to-end tests: run the `pipec` binary, find bundled models.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `python3 scripts/NAME ARGS...`: whether it exited 0, and its stdout then stderr.
pub fn run_script<S: AsRef<std::ffi::OsStr>>(name: &str, args: &[S]) -> (bool, String) {
    let out = Command::new("python3")
        .arg(root().join("scripts").join(name))
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

/// A model bundled in `onnx-models/`.
pub fn model(name: &str) -> PathBuf {
    root().join("onnx-models").join(name)
}

/// A PipeDream `graph.txt` profile bundled in `onnx-models/profiles/`, as a CLI argument.
pub fn profile(name: &str) -> String {
    root()
        .join("onnx-models/profiles")
        .join(name)
        .display()
        .to_string()
}

/// A command's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The four dev models.
pub const DEV_MODELS: [&str; 4] = ["mlp4", "inception_mini", "resnet18", "gpt2_tiny"];

/// Run `pipec` with arguments.
pub fn pipec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipec"))
        .args(args)
        .output()
        .expect("spawn pipec")
}

/// Run `pipec` and require success; returns stdout.
pub fn pipec_ok(args: &[&str]) -> String {
    let out = pipec(args);
    assert!(
        out.status.success(),
        "pipec {args:?} failed ({:?}):\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// `pipec compile onnx-models/MODEL FLAGS... -o OUT`, required to succeed.
pub fn compile(model_name: &str, out: &Path, flags: &[&str]) {
    let m = model(model_name);
    let mut args = vec!["compile", m.to_str().expect("utf-8 path")];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["-o", out.to_str().expect("utf-8 path")]);
    pipec_ok(&args);
}

/// mlp4 on 4 CPU-core devices with DAPPLE and Adam (stages 0 and 1 on one device each, the last
/// stage replicated): the `compile` flags `pipec run` and its MPI backend test with.
pub const MLP4_DAPPLE_4: &[&str] = &[
    "--cluster",
    "8@1e10",
    "--device-kind",
    "cpu-core",
    "--devices",
    "4",
    "--planner",
    "dapple",
    "--batch",
    "16",
    "--micro-batch",
    "4",
    "--optimizer",
    "adam:lr=0.001",
];

/// The README's job on gpt2_tiny (`cpu` preset, 4 devices, batch 8, micro-batch 2, Adam), less
/// the planner.
pub const README_CONFIG: &[&str] = &[
    "--cluster",
    "cpu",
    "--devices",
    "4",
    "--batch",
    "8",
    "--micro-batch",
    "2",
    "--optimizer",
    "adam:lr=0.001",
];

/// Every file under `dir`, relative, sorted.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Assert that folders `a` and `b` hold the same files, byte for byte (`what` names the pair in
/// the failure message); returns the file list.
pub fn assert_same_files(a: &Path, b: &Path, what: &str) -> Vec<PathBuf> {
    let names = files_under(a);
    assert_eq!(names, files_under(b), "{what}: different file lists");
    for name in &names {
        let (x, y) = (
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(b.join(name)).unwrap(),
        );
        assert!(x == y, "{what}: {} differs", name.display());
    }
    names
}

/// A fresh empty temp directory for one test.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// `mlir-opt` from LLVM 22, if installed.
pub fn mlir_opt() -> Option<PathBuf> {
    let p = Path::new("/usr/lib/llvm-22/bin/mlir-opt");
    if p.exists() {
        return Some(p.to_path_buf());
    }
    which("mlir-opt-22").or_else(|| which("mlir-opt"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.exists())
    })
}

/// Python 3 with the `onnx` package (installed by scripts/setup.sh). Under CI its absence fails
/// the test; elsewhere the caller may skip.
pub fn python_with_onnx() -> Option<&'static str> {
    let ok = Command::new("python3")
        .args(["-c", "import onnx"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Some("python3")
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3 with onnx is required under CI (scripts/setup.sh installs it)"
        );
        eprintln!("note: python3 with onnx not found; skipping the Python oracle");
        None
    }
}

/// The largest device peak memory of a replay (`pipec simulate OUTDIR --json`'s object).
pub fn replayed_peak(simulate_json: &serde_json::Value) -> f64 {
    simulate_json["devices"]
        .as_array()
        .expect("simulate --json has devices")
        .iter()
        .map(|d| d["peak_memory_bytes"].as_f64().expect("peak_memory_bytes"))
        .fold(0.0, f64::max)
}

/// Train the program in `out` 3 steps with `run --check` (it must pass), and replay it with
/// `pipec simulate`: the replay's iteration within 5% of the plan's. `what` names the case.
pub fn check_and_replay(out: &Path, what: &str) {
    check_and_replay_within(out, what, 0.05);
}

/// [`check_and_replay`] with the replay within `tol` (relative) of the plan.
pub fn check_and_replay_within(out: &Path, what: &str, tol: f64) {
    let o = out.to_str().expect("utf-8");
    let so = pipec_ok(&["run", o, "--steps", "3", "--check"]);
    assert!(so.contains("check ok"), "{what}: {so}");
    let sim: serde_json::Value =
        serde_json::from_str(&pipec_ok(&["simulate", o, "--json"])).expect("json");
    let (replay, plan) = (
        sim["iteration_time_s"].as_f64().expect("time"),
        sim["planned_iteration_time_s"].as_f64().expect("planned"),
    );
    assert!(
        (replay / plan - 1.0).abs() < tol,
        "{what}: replay {replay} vs plan {plan}"
    );
}
