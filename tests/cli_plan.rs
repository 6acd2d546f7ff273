//! `pipec plan` end to end: profiles, presets, JSON fields, and clear exit-2 errors.

mod common;

use common::{pipec, profile, root, stderr};
use std::process::{Command, Output};

#[test]
fn plan_vgg16_dp_and_straight() {
    let vgg = profile("vgg16.txt");
    for planner in ["dp", "straight"] {
        let o = pipec(&[
            "plan",
            &vgg,
            "--cluster",
            "pipedream-b",
            "--devices",
            "8",
            "--planner",
            planner,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!("plan: {planner} on pipedream-b (8 devices)")),
            "{out}"
        );
        assert!(out.contains("s (simulated)"), "{out}");
    }
    let o = pipec(&[
        "plan",
        &vgg,
        "--cluster",
        "pipedream-b",
        "--devices",
        "8",
        "--planner",
        "straight",
        "--profile-batch",
        "64",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["planner"], "straight");
    assert_eq!(v["devices"], 8);
    assert_eq!(v["batch"], 64);
    assert_eq!(v["schedule"], "1f1b");
    assert_eq!(v["stages"].as_array().map(Vec::len), Some(8));
    assert_eq!(v["pipeline_depth"], 8);
    assert!(v["iteration_time_s"].as_f64().is_some_and(|t| t > 0.0));
    for k in [
        "micro_batch",
        "micro_batches",
        "throughput_samples_per_s",
        "peak_memory_bytes",
        "search_time_s",
        "objective_s",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
}

#[test]
fn plan_options_schedule_and_trace() {
    let dir = tempfile::tempdir().expect("tmp");
    let trace = dir.path().join("t.json");
    let o = pipec(&[
        "plan",
        &profile("gnmt-16-pbs-64.txt"),
        "--cluster",
        "8@25e9,2@3.125e9",
        "--planner",
        "straight",
        "--micro-batch",
        "8",
        "--schedule",
        "gpipe",
        "--json",
        "--trace",
        &trace.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(
        v["batch"], 64,
        "batch defaults to pbs-64 from the file name"
    );
    assert_eq!(v["micro_batches"], 8);
    assert_eq!(v["schedule"], "gpipe");
    assert_eq!(v["stages"][0]["in_flight"], 8, "GPipe keeps M in flight");
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("trace json");
    assert!(t["traceEvents"]
        .as_array()
        .is_some_and(|e| e.len() > 16 * 16));
}

/// `--schedule gpipe-recompute` / `1f1b-recompute`: same order as GPipe / 1F1B, the backward
/// re-runs the forward (slower) and only stage inputs stay in flight (less memory); pipedream's
/// default schedule is 1F1B-RR.
#[test]
fn plan_recompute_and_round_robin_schedules() {
    let run = |planner: &str, schedule: Option<&str>| -> serde_json::Value {
        let mut args = vec![
            "plan",
            "onnx-models/resnet18.onnx",
            "--cluster",
            "dapple-a",
            "--devices",
            "4",
            "--batch",
            "32",
            "--micro-batch",
            "4",
            "--planner",
            planner,
            "--json",
        ];
        if let Some(s) = schedule {
            args.extend(["--schedule", s]);
        }
        let o = Command::new(env!("CARGO_BIN_EXE_pipec"))
            .current_dir(root())
            .args(&args)
            .output()
            .expect("run pipec");
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    for (base, rc) in [("gpipe", "gpipe-recompute"), ("1f1b", "1f1b-recompute")] {
        let a = run("straight", Some(base));
        let b = run("straight", Some(rc));
        assert_eq!(b["schedule"], rc);
        let t = |v: &serde_json::Value| v["iteration_time_s"].as_f64().expect("t");
        let m = |v: &serde_json::Value| v["peak_memory_bytes"].as_u64().expect("m");
        assert!(t(&b) > t(&a), "{rc}: {} vs {}", t(&b), t(&a));
        assert!(m(&b) < m(&a), "{rc}: {} vs {}", m(&b), m(&a));
    }
    let p = run("pipedream", None);
    assert_eq!(p["schedule"], "1f1b-rr");
}

#[test]
fn list_clusters() {
    let o = pipec(&["plan", "--list-clusters"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for p in [
        "dapple-a",
        "dapple-b",
        "dapple-c",
        "pipedream-a",
        "pipedream-b",
        "summit",
        "bapipe-pcie",
        "dgx-h100",
        "cpu",
    ] {
        assert!(out.contains(p), "{p} missing from {out}");
    }
}

/// `--show-cluster NAME` prints the preset's TOML; planning on that file gives the preset's plan.
#[test]
fn show_cluster_writes_a_file_that_plans_like_the_preset() {
    let dir = tempfile::tempdir().expect("tmp");
    let model = root().join("onnx-models/mlp4.onnx");
    let model = model.to_str().expect("utf8");
    for name in ["bapipe-hetero", "cpu"] {
        let o = pipec(&["plan", "--show-cluster", name]);
        assert!(o.status.success(), "{}", stderr(&o));
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, &o.stdout).expect("write");
        let file = file.to_str().expect("utf8");
        let plan = |cluster: &str| {
            let o = pipec(&[
                "plan",
                model,
                "--cluster",
                cluster,
                "--planner",
                "gpp",
                "--batch",
                "16",
                "--json",
            ]);
            assert!(o.status.success(), "{cluster}: {}", stderr(&o));
            let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
            v.as_object_mut().expect("object").remove("search_time_s");
            v
        };
        assert_eq!(plan(name), plan(file), "{name}");
    }
    bad(
        &["plan", "--show-cluster", "nowhere"],
        "--show-cluster nowhere: not a preset (one of dapple-a",
    );
}

fn bad(args: &[&str], want: &str) {
    let o = pipec(args);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    let e = stderr(&o);
    let first = e.lines().next().unwrap_or("");
    assert!(
        first.contains(want),
        "{args:?}: want '{want}' in first line: {e}"
    );
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn bad_input_exits_2_naming_the_culprit() {
    let vgg = profile("vgg16.txt");
    bad(
        &[
            "plan",
            &vgg,
            "--cluster",
            "pipedream-b",
            "--devices",
            "40",
            "--planner",
            "dp",
        ],
        "--devices 40",
    );
    // Schedules: a kFkB group out of range, per-stage sizes with another planner.
    for (sched, planner, want) in [
        ("kfkb-0", "dp", "--schedule kfkb-0: one of"),
        ("kfkb-x", "dp", "--schedule kfkb-x: one of"),
        ("gpp-per-stage", "dp", "only with --planner gpp"),
    ] {
        bad(
            &[
                "plan",
                &vgg,
                "--cluster",
                "pipedream-b",
                "--planner",
                planner,
                "--schedule",
                sched,
            ],
            want,
        );
    }
    bad(
        &["plan", &vgg, "--cluster", "nope", "--planner", "dp"],
        "--cluster nope",
    );
    // Absurd sizes are refused at once, not searched for minutes.
    for (args, want) in [
        (
            &["--cluster", "100000@1e10", "--planner", "dp"][..],
            "too many devices",
        ),
        (
            &["--cluster", "cpu", "--devices", "100000", "--planner", "dp"][..],
            "--devices 100000: pipec plans for at most 16384",
        ),
        (
            &["--cluster", "2048@1e10", "--planner", "gpp"][..],
            "gpp: at most 1024 devices",
        ),
        (
            &[
                "--cluster",
                "8@1e10",
                "--planner",
                "dp",
                "--batch",
                "99999999999",
                "--micro-batch",
                "1",
            ][..],
            "at most 4096 per iteration",
        ),
    ] {
        let o = pipec(&[&["plan", &vgg][..], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    bad(
        &["plan", &vgg, "--cluster", "8@0", "--planner", "dp"],
        "--cluster 8@0",
    );
    bad(
        &["plan", &vgg, "--cluster", "dapple-a", "--planner", "magic"],
        "--planner magic",
    );
    bad(
        &[
            "plan",
            &vgg,
            "--cluster",
            "dapple-a",
            "--planner",
            "dp",
            "--schedule",
            "zigzag",
        ],
        "--schedule zigzag",
    );
    bad(
        &[
            "plan",
            &vgg,
            "--cluster",
            "dapple-a",
            "--planner",
            "dp",
            "--batch",
            "64",
            "--micro-batch",
            "5",
        ],
        "--micro-batch 5",
    );
    bad(
        &[
            "plan",
            "missing.txt",
            "--cluster",
            "dapple-a",
            "--planner",
            "dp",
        ],
        "missing.txt",
    );
    bad(&["plan", &vgg, "--planner", "dp"], "--cluster");
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("c.toml");
    std::fs::write(&f, "[[device_kind]]\nname = \"g\"\nmemory_bytes = 1e9\nmemory_bandwidth = 1e11\npeak_flops = { f32 = 1e12 }\n[[level]]\nsize = 4\nbandwidth = 0\n").expect("write");
    let fs = f.display().to_string();
    bad(&["plan", &vgg, "--cluster", &fs, "--planner", "dp"], &fs);
    let p = dir.path().join("p.txt");
    std::fs::write(&p, "node1 -- X -- forward_compute_time=oops\n").expect("write");
    bad(
        &[
            "plan",
            &p.display().to_string(),
            "--cluster",
            "dapple-a",
            "--planner",
            "dp",
        ],
        &p.display().to_string(),
    );
}

#[test]
fn plan_onnx_models_with_the_analytic_model() {
    for m in [
        "mlp4.onnx",
        "resnet18.onnx",
        "inception_mini.onnx",
        "gpt2_tiny.onnx",
    ] {
        let path = root().join("onnx-models").join(m).display().to_string();
        for planner in ["straight", "dp"] {
            let o = pipec(&[
                "plan",
                &path,
                "--cluster",
                "summit",
                "--devices",
                "4",
                "--planner",
                planner,
                "--batch",
                "16",
                "--json",
            ]);
            assert!(o.status.success(), "{m} {planner}: {}", stderr(&o));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
            assert_eq!(v["batch"], 16);
            assert!(
                v["iteration_time_s"].as_f64().is_some_and(|t| t > 0.0),
                "{m}"
            );
            let nodes: usize = v["stages"]
                .as_array()
                .map(|st| {
                    st.iter()
                        .map(|s| s["nodes"].as_array().map_or(0, Vec::len))
                        .sum()
                })
                .unwrap_or(0);
            assert!(nodes > 0, "{m}");
        }
    }
}

/// The acceptance command of the PipeDream planner: `objective_s` equals PipeDream's own
/// optimizer's "Time per stage in pipeline" (reference in
/// `onnx-models/profiles/pipedream-reference/summary.txt`).
#[test]
fn plan_pipedream_matches_its_optimizer() {
    for (model, cluster, want) in [
        ("vgg16.txt", "8@1250000000", 0.09335713400000001),
        (
            "gnmt.txt",
            "8@25000000000,2@3125000000",
            0.009893226631111111,
        ),
    ] {
        let o = pipec(&[
            "plan",
            &profile(model),
            "--planner",
            "pipedream",
            "--cluster",
            cluster,
            "--profile-batch",
            "64",
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let got = v["objective_s"].as_f64().expect("objective_s");
        assert!(
            (got - want).abs() <= 1e-3 * want,
            "{model}: {got} vs {want}"
        );
        assert_eq!(v["planner"], "pipedream");
    }
}

/// GraphPipe: `--planner gpp` and `gpp-seq` on an ONNX model and a profile (a profile is a DAG
/// too), and its errors.
#[test]
fn plan_gpp_and_gpp_seq() {
    let inc = root()
        .join("onnx-models/inception_mini.onnx")
        .display()
        .to_string();
    let vgg = profile("vgg16.txt");
    for (model, batch) in [(inc.as_str(), "32"), (vgg.as_str(), "64")] {
        for planner in ["gpp", "gpp-seq"] {
            let o = pipec(&[
                "plan",
                model,
                "--cluster",
                "summit",
                "--devices",
                "8",
                "--planner",
                planner,
                "--batch",
                batch,
                "--json",
            ]);
            assert!(o.status.success(), "{planner}: {}", stderr(&o));
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
            assert_eq!(v["planner"], planner);
            assert_eq!(v["devices"], 8);
            let used: u64 = v["stages"]
                .as_array()
                .expect("stages")
                .iter()
                .map(|s| s["replicas"].as_u64().unwrap_or(0))
                .sum();
            assert_eq!(used, 8, "every device is used (C3)");
            assert!(v["throughput_samples_per_s"].as_f64().unwrap_or(0.0) > 0.0);
        }
    }
    bad(
        &[
            "plan",
            &inc,
            "--cluster",
            "summit",
            "--devices",
            "64",
            "--planner",
            "gpp",
        ],
        "has only 32 devices",
    );
    bad(
        &[
            "plan",
            &inc,
            "--cluster",
            "summit",
            "--planner",
            "gpp",
            "--batch",
            "10",
            "--micro-batch",
            "3",
        ],
        "--micro-batch 3",
    );
}

/// `--repeat N` plans N times on the model loaded once: the same plan as one run (the search
/// time is the fastest), and 0 is refused.
#[test]
fn plan_repeat_reports_the_same_plan() {
    let model = root().join("onnx-models/mlp4.onnx").display().to_string();
    let args = |n: &'static str| {
        vec![
            "plan".to_string(),
            model.clone(),
            "--cluster".into(),
            "summit".into(),
            "--devices".into(),
            "4".into(),
            "--planner".into(),
            "gpp".into(),
            "--batch".into(),
            "32".into(),
            "--json".into(),
            "--repeat".into(),
            n.into(),
        ]
    };
    let run = |n: &'static str| {
        let a = args(n);
        let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
        pipec(&a)
    };
    let strip = |o: &Output| {
        assert!(o.status.success(), "{}", stderr(o));
        let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let t = v["search_time_s"].as_f64().expect("search time");
        assert!(t > 0.0);
        v.as_object_mut().expect("object").remove("search_time_s");
        v
    };
    assert_eq!(strip(&run("1")), strip(&run("3")));
    let o = run("0");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--repeat 0"), "{}", stderr(&o));
}

/// `--time-limit`: a search cut short returns a valid plan marked `time_limited` (JSON field and
/// a warning), never worse than data parallelism for DAPPLE (its first candidate); without the
/// flag the field is absent; a negative limit is a usage error.
#[test]
fn time_limit_returns_the_best_plan_so_far() {
    let model = root().join("onnx-models/resnet18.onnx");
    let model = model.to_str().expect("utf-8 path");
    let base = [
        "plan",
        model,
        "--cluster",
        "summit",
        "--devices",
        "16",
        "--batch",
        "64",
        "--json",
    ];
    let json = |o: &Output| -> serde_json::Value {
        assert!(o.status.success(), "{}", stderr(o));
        serde_json::from_slice(&o.stdout).expect("plan JSON")
    };
    for planner in ["dapple", "gpp"] {
        let full = json(&pipec(&[&base[..], &["--planner", planner]].concat()));
        assert!(full.get("time_limited").is_none(), "{full}");
        let o = pipec(&[&base[..], &["--planner", planner, "--time-limit", "0"]].concat());
        let cut = json(&o);
        assert_eq!(cut["time_limited"], serde_json::Value::Bool(true), "{cut}");
        assert!(
            stderr(&o).contains("--time-limit 0 s reached"),
            "{}",
            stderr(&o)
        );
        let stages = cut["stages"].as_array().expect("stages");
        let devices: usize = stages
            .iter()
            .map(|s| s["devices"].as_array().map_or(0, |d| d.len()))
            .sum();
        assert!((1..=16).contains(&devices), "{cut}");
        let t = |v: &serde_json::Value| v["iteration_time_s"].as_f64().expect("time");
        assert!(t(&cut) >= t(&full) * (1.0 - 1e-9), "{cut} vs {full}");
    }
    let o = pipec(&[&base[..], &["--planner", "dapple", "--time-limit", "-1"]].concat());
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--time-limit"), "{}", stderr(&o));
}

/// DAPPLE's bounded search: a search past its transition budget (resnet18 on 32 summit GPUs)
/// says so (`"search_capped": true` and a note on stderr) and still returns a plan no slower
/// than pure data parallelism (the search's base state); a small one (mlp4) stays exhaustive
/// and the field is absent.
#[test]
fn dapple_says_when_it_bounds_its_search() {
    let plan = |m: &str, planner: &str| {
        let model = root().join(format!("onnx-models/{m}.onnx"));
        let o = pipec(&[
            "plan",
            model.to_str().expect("utf-8 path"),
            "--cluster",
            "summit",
            "--devices",
            "32",
            "--batch",
            "64",
            "--planner",
            planner,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan JSON");
        (j, stderr(&o))
    };
    let (big, err) = plan("resnet18", "dapple");
    assert_eq!(big["search_capped"], serde_json::Value::Bool(true), "{big}");
    assert!(err.contains("bounded its search"), "{err}");
    let (dp, _) = plan("resnet18", "dp");
    let t = |v: &serde_json::Value| v["iteration_time_s"].as_f64().expect("time");
    assert!(t(&big) <= t(&dp) * (1.0 + 1e-9), "{big} vs {dp}");
    let (small, err) = plan("mlp4", "dapple");
    assert!(small.get("search_capped").is_none(), "{small}");
    assert!(!err.contains("bounded its search"), "{err}");
}
