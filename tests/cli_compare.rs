//! `pipec compare`: every planner on one model and cluster, errors in their rows, `--json`.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pipec(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipec"))
        .args(args)
        .output()
        .expect("run pipec")
}

fn path(rel: &str) -> String {
    root().join(rel).display().to_string()
}

#[test]
fn compare_on_a_profile_prints_one_row_per_planner() {
    let o = pipec(&[
        "compare",
        &path("onnx-models/profiles/vgg16.txt"),
        "--cluster",
        "pipedream-b",
        "--devices",
        "8",
        "--profile-batch",
        "64",
        "--batch",
        "256",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    for p in ["gpp", "dapple", "pipedream", "bapipe", "dp", "straight"] {
        assert!(
            out.lines().any(|l| l.starts_with(p)),
            "no row for {p}:\n{out}"
        );
    }
    let dp = out.lines().find(|l| l.starts_with("dp ")).expect("dp row");
    assert!(dp.contains("1.00x"), "{dp}");
}

#[test]
fn compare_json_is_a_list_of_plans() {
    let o = pipec(&[
        "compare",
        &path("onnx-models/mlp4.onnx"),
        "--cluster",
        "dapple-a",
        "--devices",
        "4",
        "--batch",
        "32",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let list = v.as_array().expect("a list");
    assert!(list.len() >= 4, "{v}");
    for p in list {
        for f in [
            "planner",
            "stages",
            "iteration_time_s",
            "search_time_s",
            "objective_s",
        ] {
            assert!(p.get(f).is_some(), "missing {f}");
        }
    }
    let names: Vec<&str> = list.iter().filter_map(|p| p["planner"].as_str()).collect();
    for p in ["dapple", "bapipe", "dp", "straight"] {
        assert!(names.contains(&p), "{names:?}");
    }
}

#[test]
fn compare_bad_input_is_exit_2() {
    let o = pipec(&["compare", "nope.onnx", "--cluster", "dapple-a"]);
    assert_eq!(o.status.code(), Some(2));
    let o = pipec(&[
        "compare",
        &path("onnx-models/mlp4.onnx"),
        "--cluster",
        "no-such-cluster",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

/// `compare` hands the plans of its other rows to `gpp` as its sequential candidates instead of
/// planning them again: its `gpp` row is still exactly `pipec plan --planner gpp` (same stages,
/// micro-batch, times), on a branchy model where the seeds matter.
#[test]
fn compare_gpp_row_is_plan_gpp() {
    let model = path("onnx-models/inception_mini.onnx");
    let cfg = ["--cluster", "dgx-h100", "--devices", "8", "--batch", "64"];
    let mut args = vec!["compare", model.as_str(), "--json"];
    args.extend_from_slice(&cfg);
    let o = pipec(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["planner"] == "gpp")
        .expect("gpp row")
        .clone();
    let mut args = vec!["plan", model.as_str(), "--planner", "gpp", "--json"];
    args.extend_from_slice(&cfg);
    let o = pipec(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for v in [&mut row, &mut plan] {
        v.as_object_mut().unwrap().remove("search_time_s");
    }
    assert_eq!(row, plan);
}
