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

/// `--best-schedule`: every planner keeps its stages and micro-batch and gets the fastest
/// synchronous schedule the simulator finds, never slower than its own; for `straight` (whose
/// stages do not depend on the schedule) that is the fastest `plan --schedule K` over the
/// candidates, and the table names the planner's own choice where another won.
#[test]
fn compare_best_schedule_keeps_stages_and_is_never_slower() {
    let model = path("onnx-models/gpt2_tiny.onnx");
    let cfg = ["--cluster", "cpu", "--devices", "4", "--batch", "32"];
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["compare", model.as_str(), "--json"];
        args.extend_from_slice(&cfg);
        args.extend_from_slice(extra);
        let o = pipec(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    let own = run(&[]);
    let best = run(&["--best-schedule"]);
    let (own, best) = (own.as_array().unwrap(), best.as_array().unwrap());
    assert_eq!(own.len(), best.len());
    // The stages' nodes and devices (their times and memory depend on the schedule).
    let layout = |p: &serde_json::Value| -> Vec<(serde_json::Value, serde_json::Value)> {
        p["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["nodes"].clone(), s["devices"].clone()))
            .collect()
    };
    for (a, b) in own.iter().zip(best) {
        assert_eq!(a["planner"], b["planner"]);
        assert_eq!(layout(a), layout(b), "{}", a["planner"]);
        assert_eq!(a["micro_batch"], b["micro_batch"], "{}", a["planner"]);
        let (ta, tb) = (
            a["iteration_time_s"].as_f64().unwrap(),
            b["iteration_time_s"].as_f64().unwrap(),
        );
        assert!(tb <= ta, "{}: {tb} > {ta}", a["planner"]);
        if a["out_of_memory"] == false {
            assert_eq!(b["out_of_memory"], false, "{}", a["planner"]);
        }
        // A replaced schedule names the planner's own; an unchanged one does not.
        if a["schedule"] == b["schedule"] {
            assert!(b.get("own_schedule").is_none(), "{b}");
        } else {
            assert_eq!(b["own_schedule"], a["schedule"], "{}", a["planner"]);
        }
    }
    let straight = best
        .iter()
        .find(|p| p["planner"] == "straight")
        .expect("straight row");
    let mut fastest = f64::INFINITY;
    for k in [
        "1f1b",
        "gpipe",
        "dapple-b",
        "1f1b-so",
        "kfkb-2",
        "gpipe-recompute",
        "1f1b-recompute",
        "zb-h1",
        "zb-h2",
    ] {
        let mut args = vec!["plan", model.as_str(), "--planner", "straight", "--json"];
        args.extend_from_slice(&cfg);
        args.extend_from_slice(&["--schedule", k]);
        let o = pipec(&args);
        assert!(
            o.status.success(),
            "{k}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(layout(&p), layout(straight), "{k}");
        fastest = fastest.min(p["iteration_time_s"].as_f64().unwrap());
    }
    let got = straight["iteration_time_s"].as_f64().unwrap();
    assert!(
        (got - fastest).abs() <= 1e-12 * fastest,
        "{got} vs {fastest}"
    );
    let mut args = vec!["compare", model.as_str(), "--best-schedule"];
    args.extend_from_slice(&cfg);
    let o = pipec(&args);
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out
        .lines()
        .find(|l| l.starts_with("straight "))
        .expect("straight row");
    if straight["schedule"] != "1f1b" {
        assert!(row.contains("(own 1f1b)"), "{row}");
    }
}
