//! Megatron-LM's interleaved 1F1B (`--schedule interleaved-V`): planned and simulated with `V`
//! chunks per device group, for `--stages` and for the planners (their device groups, their
//! stages re-cut into chunks); the layout and micro-batch rules are errors that say what to
//! change. Compiled and run: `tests/interleaved_run.rs`.

mod common;

use common::{model, pipec, pipec_ok, stderr};
use serde_json::Value;

fn plan_json(args: &[&str]) -> Value {
    serde_json::from_str(&pipec_ok(args)).expect("plan --json")
}

/// The planned stages' device lists.
fn devices(plan: &Value) -> Vec<Vec<u64>> {
    plan["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| {
            s["devices"]
                .as_array()
                .expect("devices")
                .iter()
                .map(|d| d.as_u64().expect("device"))
                .collect()
        })
        .collect()
}

#[test]
fn user_stages_are_dealt_to_device_groups() {
    let m = model("gpt2_tiny.onnx");
    let spec = "0..100;100..200@2;200..300;300..400;400..450;450..500@2;500..510;510..";
    let plan = plan_json(&[
        "plan",
        m.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--devices",
        "5",
        "--stages",
        spec,
        "--batch",
        "16",
        "--schedule",
        "interleaved-2",
        "--json",
    ]);
    assert_eq!(plan["schedule"], "interleaved-2");
    assert_eq!(plan["devices"], 5, "each device counted once");
    let d = devices(&plan);
    assert_eq!(d.len(), 8);
    for s in 4..8 {
        assert_eq!(d[s], d[s - 4], "stage {s} on its group's devices");
    }
    assert_eq!(d[1], vec![1, 2]);
    // 16 / micro-batch must be a multiple of the 4 groups and stage 1's 2 replicas divide it.
    let mb = plan["micro_batch"].as_u64().unwrap();
    assert_eq!((16 / mb) % 4, 0);
    assert_eq!(mb % 2, 0);
    assert!(plan["iteration_time_s"].as_f64().unwrap() > 0.0);

    // A chunk whose replicas differ from its group's, and a micro-batch count the groups do
    // not divide, are refused with what to change.
    let o = pipec(&[
        "plan",
        m.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--devices",
        "5",
        "--stages",
        "0..100;100..200@2;200..300;300..400;400..450;450..500;500..510;510..",
        "--batch",
        "16",
        "--schedule",
        "interleaved-2",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("stage 5 runs on the 2 device(s) of stage 1"),
        "{}",
        stderr(&o)
    );
    let o = pipec(&[
        "plan",
        m.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--devices",
        "5",
        "--stages",
        spec,
        "--batch",
        "16",
        "--micro-batch",
        "8",
        "--schedule",
        "interleaved-2",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("--micro-batch 8") && e.contains("multiple of the pipeline's 4 device groups"),
        "{e}"
    );
}

/// A planner's device groups keep their devices; every group holds `V` chunks; the plan reports
/// the interleaved schedule and the chunks' depth.
#[test]
fn planners_stages_are_recut_into_chunks() {
    let m = model("vit_tiny.onnx");
    for (planner, v) in [("straight", 2), ("straight", 3), ("dapple", 2)] {
        let kind = format!("interleaved-{v}");
        let planned = |schedule: &str| {
            plan_json(&[
                "plan",
                m.to_str().unwrap(),
                "--cluster",
                "cpu",
                "--devices",
                "4",
                "--planner",
                planner,
                "--batch",
                "32",
                "--schedule",
                schedule,
                "--json",
            ])
        };
        let (base, plan) = (planned("1f1b"), planned(&kind));
        let (groups, d) = (devices(&base), devices(&plan));
        let p = groups.len();
        assert!(p >= 2, "{planner}: a pipeline");
        assert_eq!(d.len(), v * p, "{planner} {kind}");
        for (s, ds) in d.iter().enumerate() {
            assert_eq!(ds, &groups[s % p], "{planner} {kind}: stage {s}");
        }
        assert_eq!(plan["schedule"], kind.as_str());
        assert_eq!(plan["devices"], base["devices"]);
        let m_count = plan["micro_batches"].as_u64().unwrap();
        assert_eq!(m_count % p as u64, 0, "{planner} {kind}");
        // Every node in one chunk.
        let nodes = |x: &Value| -> usize {
            x["stages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["nodes"].as_array().unwrap().len())
                .sum()
        };
        assert_eq!(nodes(&plan), nodes(&base));
    }
}

#[test]
fn a_planner_with_one_stage_is_not_interleaved() {
    let m = model("gpt2_tiny.onnx");
    // A planner that chose one stage cannot be interleaved; it says so.
    let o = pipec(&[
        "plan",
        m.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--devices",
        "4",
        "--planner",
        "dp",
        "--batch",
        "8",
        "--schedule",
        "interleaved-2",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("chose 1 stage"), "{}", stderr(&o));
}

/// `--schedule interleaved`: the planner picks the chunks per group (or ZB-V), or keeps its 1F1B plan
/// where interleaving's messages cost more than its smaller bubble saves.
#[test]
fn the_planner_picks_the_chunks_or_keeps_1f1b() {
    let time = |m: &str, devices: &str, schedule: &str| -> (String, f64) {
        let p = plan_json(&[
            "plan",
            model(m).to_str().unwrap(),
            "--cluster",
            "summit",
            "--devices",
            devices,
            "--planner",
            "straight",
            "--batch",
            "64",
            "--schedule",
            schedule,
            "--json",
        ]);
        (
            p["schedule"].as_str().unwrap().to_string(),
            p["iteration_time_s"].as_f64().unwrap(),
        )
    };
    // resnet18 on 4 GPUs: its convolutions outweigh the extra messages (ZB-V, which also fills
    // the bubble with weight-gradient passes, is among the candidates).
    let (kind, t) = time("resnet18.onnx", "4", "interleaved");
    let (_, t1) = time("resnet18.onnx", "4", "1f1b");
    assert!(kind.starts_with("interleaved-") || kind == "zbv", "{kind}");
    assert!(t < t1, "{t} vs 1f1b {t1}");
    assert_eq!(time("resnet18.onnx", "4", &kind).1, t);
    // lstm_tiny on 8: tiny steps, messages dominate; 1F1B stays.
    let (kind, t) = time("lstm_tiny.onnx", "8", "interleaved");
    assert_eq!(kind, "1f1b");
    assert_eq!(t, time("lstm_tiny.onnx", "8", "1f1b").1);
}

/// ZB-V: a planner's `P` device groups hold `2P` chunks as a V (chunk `k ≥ P` on group
/// `2P − 1 − k`), any micro-batch count; `--stages` deals the user's stages the same way.
#[test]
fn zbv_lays_the_chunks_out_as_a_v() {
    let m = model("vit_tiny.onnx");
    for planner in ["straight", "dapple"] {
        let planned = |schedule: &str| {
            plan_json(&[
                "plan",
                m.to_str().unwrap(),
                "--cluster",
                "cpu",
                "--devices",
                "4",
                "--planner",
                planner,
                "--batch",
                "30",
                "--schedule",
                schedule,
                "--json",
            ])
        };
        let (base, plan) = (planned("1f1b"), planned("zbv"));
        let (groups, d) = (devices(&base), devices(&plan));
        let p = groups.len();
        assert!(p >= 2, "{planner}: a pipeline");
        assert_eq!(d.len(), 2 * p, "{planner}");
        for (s, ds) in d.iter().enumerate() {
            let g = if s < p { s } else { 2 * p - 1 - s };
            assert_eq!(ds, &groups[g], "{planner} zbv: stage {s}");
        }
        assert_eq!(plan["schedule"], "zbv");
        assert_eq!(plan["devices"], base["devices"]);
    }
    // --stages: stage 3 on the devices of stage 0, stage 2 on those of stage 1; a stage off
    // the V is refused naming the stage it must follow.
    let spec = |s: &str| {
        plan_json(&[
            "plan",
            m.to_str().unwrap(),
            "--cluster",
            "cpu",
            "--devices",
            "3",
            "--stages",
            s,
            "--batch",
            "6",
            "--schedule",
            "zbv",
            "--json",
        ])
    };
    let plan = spec("0..40;40..80@2;80..120@2;120..");
    assert_eq!(
        devices(&plan),
        vec![vec![0], vec![1, 2], vec![1, 2], vec![0]]
    );
    let o = pipec(&[
        "plan",
        m.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--devices",
        "3",
        "--stages",
        "0..40;40..80@2;80..120;120..",
        "--batch",
        "6",
        "--schedule",
        "zbv",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("stage 2 runs on the 2 device(s) of stage 1 (zbv)"),
        "{}",
        stderr(&o)
    );
}
