//! `pipec profile` end to end: a measured profile of mlp4, `--profile` in `plan` and `compare`,
//! mismatched profiles as exit-2 errors, `--compare-analytic`.

mod common;

use common::{model, pipec, pipec_ok, tempdir};
use serde_json::Value;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Profile mlp4 at batch 4 into `dir/prof.json`; returns the path and the parsed JSON.
fn profile_mlp4(dir: &std::path::Path) -> (String, Value) {
    let out = dir.join("prof.json").display().to_string();
    let m = model("mlp4.onnx").display().to_string();
    pipec_ok(&[
        "profile", &m, "--batch", "4", "--repeat", "3", "--warmup", "1", "-o", &out,
    ]);
    let text = std::fs::read_to_string(&out).expect("profile written");
    (out, serde_json::from_str(&text).expect("valid JSON"))
}

#[test]
fn profile_mlp4_has_every_node_and_positive_times() {
    let dir = tempdir();
    let (_, p) = profile_mlp4(dir.path());
    assert_eq!(p["batch"], 4);
    assert_eq!(p["executor"], "reference");
    assert_eq!(p["repeat"], 3);
    assert!(p["model"]
        .as_str()
        .is_some_and(|s| s.ends_with("mlp4.onnx")));
    // Every node of the model's cost graph, in the same order as `plan` names them.
    let inspect: Value = serde_json::from_str(&pipec_ok(&[
        "inspect",
        &model("mlp4.onnx").display().to_string(),
        "--json",
    ]))
    .expect("inspect json");
    let nodes = p["nodes"].as_array().expect("nodes");
    assert_eq!(
        nodes.len() as u64,
        inspect["nodes"].as_u64().expect("count")
    );
    let mut fwd_sum = 0.0;
    let mut bwd_sum = 0.0;
    for n in nodes {
        for k in [
            "name",
            "op_type",
            "fwd_s",
            "bwd_s",
            "output_bytes",
            "parameter_bytes",
        ] {
            assert!(n.get(k).is_some(), "node {n} lacks {k}");
        }
        let f = n["fwd_s"].as_f64().expect("fwd_s");
        let b = n["bwd_s"].as_f64().expect("bwd_s");
        // mlp4 is Gemm/Relu (and a Flatten-free chain): every op has forward and backward work.
        assert!(f > 0.0, "{n}");
        assert!(b > 0.0, "{n}");
        assert!(n["output_bytes"].as_f64().expect("bytes") > 0.0, "{n}");
        fwd_sum += f;
        bwd_sum += b;
    }
    let gemms = nodes.iter().filter(|n| n["op_type"] == "Gemm").count();
    assert!(gemms > 0);
    for n in nodes.iter().filter(|n| n["op_type"] == "Gemm") {
        assert!(n["parameter_bytes"].as_f64().expect("params") > 0.0, "{n}");
    }
    let tf = p["total_fwd_s"].as_f64().expect("total_fwd_s");
    let tb = p["total_bwd_s"].as_f64().expect("total_bwd_s");
    assert!((tf - fwd_sum).abs() <= 1e-12 * tf.max(1.0));
    assert!((tb - bwd_sum).abs() <= 1e-12 * tb.max(1.0));
    // The transport's one-way message latency between two cores (0 on a one-core host).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let lat = p["message_latency_s"].as_f64().expect("message_latency_s");
    if cores >= 2 {
        assert!(lat > 0.0 && lat < 0.05, "message latency {lat} s");
    } else {
        assert_eq!(lat, 0.0);
    }
}

fn stage_times(plan_json: &str) -> Vec<f64> {
    let v: Value = serde_json::from_str(plan_json).expect("plan json");
    v["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["compute_time_s"].as_f64().expect("compute_time_s"))
        .collect()
}

#[test]
fn plan_and_compare_accept_a_profile() {
    let dir = tempdir();
    let (prof, _) = profile_mlp4(dir.path());
    let m = model("mlp4.onnx").display().to_string();
    let base = [
        "plan",
        m.as_str(),
        "--cluster",
        "cpu",
        "--devices",
        "2",
        "--planner",
        "straight",
        "--batch",
        "8",
        "--micro-batch",
        "4",
        "--json",
    ];
    let analytic = stage_times(&pipec_ok(&base));
    let mut with = base.to_vec();
    with.extend(["--profile", prof.as_str()]);
    let measured = stage_times(&pipec_ok(&with));
    assert_eq!(analytic.len(), measured.len());
    assert!(measured.iter().all(|t| *t > 0.0));
    assert_ne!(analytic, measured, "--profile must change the stage times");

    let out = pipec_ok(&[
        "compare",
        &m,
        "--cluster",
        "cpu",
        "--devices",
        "2",
        "--batch",
        "8",
        "--profile",
        &prof,
        "--json",
    ]);
    let plans: Value = serde_json::from_str(&out).expect("compare json");
    assert!(!plans.as_array().expect("list").is_empty());
}

#[test]
fn a_profile_of_another_model_is_an_exit_2_error_naming_the_node() {
    let dir = tempdir();
    let (prof, mut p) = profile_mlp4(dir.path());
    let m = model("mlp4.onnx").display().to_string();
    let first = p["nodes"][1]["name"].as_str().expect("name").to_string();
    p["nodes"][1]["name"] = Value::String("not_a_node".into());
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, serde_json::to_string(&p).expect("json")).expect("write");
    let bad = bad.display().to_string();
    let o = pipec(&[
        "plan",
        &m,
        "--cluster",
        "cpu",
        "--planner",
        "dp",
        "--profile",
        &bad,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("not_a_node") && e.contains(&first), "{e}");
    assert!(e.starts_with("error: "), "{e}");

    // A profile of mlp4 does not fit inception_mini.
    let inc = model("inception_mini.onnx").display().to_string();
    let o = pipec(&["compare", &inc, "--cluster", "cpu", "--profile", &prof]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("node 0"), "{}", stderr(&o));

    // Not a profile at all.
    let junk = dir.path().join("junk.json");
    std::fs::write(&junk, "{\"nodes\": 3}").expect("write");
    let o = pipec(&[
        "plan",
        &m,
        "--cluster",
        "cpu",
        "--planner",
        "dp",
        "--profile",
        &junk.display().to_string(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not a pipec profile"), "{}", stderr(&o));
}

#[test]
fn compare_analytic_prints_the_error_table() {
    let dir = tempdir();
    let (prof, _) = profile_mlp4(dir.path());
    let m = model("mlp4.onnx").display().to_string();
    let out = pipec_ok(&["profile", &m, "--from", &prof, "--compare-analytic"]);
    assert!(out.contains("all fwd") && out.contains("all bwd"), "{out}");
    assert!(out.contains("Gemm fwd"), "{out}");
    assert!(out.contains("worst"), "{out}");
}

#[test]
fn profile_usage_errors() {
    let m = model("mlp4.onnx").display().to_string();
    let o = pipec(&["profile", &m]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("-o"), "{}", stderr(&o));
    let o = pipec(&["profile", "no/such.onnx", "-o", "x.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no/such.onnx"), "{}", stderr(&o));
    let o = pipec(&["profile", &m, "--repeat", "0", "-o", "x.json"]);
    assert_eq!(o.status.code(), Some(2));
    let o = pipec(&["profile", &m, "--executor", "tract", "-o", "x.json"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--executor"), "{}", stderr(&o));
}
