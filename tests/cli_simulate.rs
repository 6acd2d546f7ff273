//! `pipec simulate`: replay of a compiled program on the cost model.

mod common;

use common::{model, pipec, pipec_ok, tempdir};
use serde_json::Value;

const CPU8: &[&str] = &["--cluster", "8@1e10", "--device-kind", "cpu-core"];

#[test]
fn simulate_mlp4_straight_two_devices() {
    let t = tempdir();
    let out = t.path().join("o");
    let m = model("mlp4.onnx");
    let m = m.to_str().unwrap();
    let cfg = [
        "--devices",
        "2",
        "--planner",
        "straight",
        "--batch",
        "8",
        "--micro-batch",
        "2",
    ];
    let mut args = vec!["compile", m];
    args.extend_from_slice(CPU8);
    args.extend_from_slice(&cfg);
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    pipec_ok(&args);

    let trace = t.path().join("trace.json");
    let mut args = vec!["simulate", out.to_str().unwrap(), "--json"];
    args.extend_from_slice(CPU8);
    args.extend_from_slice(&["--trace", trace.to_str().unwrap()]);
    let v: Value = serde_json::from_str(&pipec_ok(&args)).unwrap();
    let it = v["iteration_time_s"].as_f64().unwrap();
    let bubble = v["bubble_fraction"].as_f64().unwrap();
    assert!(it > 0.0, "iteration time {it}");
    assert!((0.0..1.0).contains(&bubble), "bubble {bubble}");
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    for d in devs {
        assert!(d["busy_s"].as_f64().unwrap() > 0.0);
        assert!(d["peak_memory_bytes"].as_u64().unwrap() > 0);
    }

    let tr: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let evs = tr["traceEvents"].as_array().unwrap();
    for d in 0..2u64 {
        assert!(
            evs.iter()
                .any(|e| e["ph"] == "X" && e["tid"].as_u64() == Some(d)),
            "no trace event for device {d}"
        );
    }

    // The planner's estimate for the same configuration, for comparison.
    let mut args = vec!["plan", m, "--json"];
    args.extend_from_slice(CPU8);
    args.extend_from_slice(&cfg);
    let plan: Value = serde_json::from_str(&pipec_ok(&args)).unwrap();
    let planned = plan["iteration_time_s"].as_f64().unwrap();
    println!(
        "replayed {it:.6e} s, planned {planned:.6e} s, ratio {:.3}",
        it / planned
    );

    // Text output mentions the iteration and every device.
    let mut args = vec!["simulate", out.to_str().unwrap()];
    args.extend_from_slice(CPU8);
    let text = pipec_ok(&args);
    assert!(text.contains("iteration"), "{text}");
    assert!(text.contains("device  1"), "{text}");
}

#[test]
fn simulate_missing_outdir_is_usage_error() {
    let t = tempdir();
    let missing = t.path().join("nope");
    let out = pipec(&["simulate", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a directory"), "{err}");
    assert!(err.contains("pipec compile"), "{err}");
}

/// `pipec compile` of bundled model `name` into `out` (the planner's own micro-batch).
fn compile_case(
    out: &std::path::Path,
    name: &str,
    planner: &str,
    cluster: &str,
    devices: &str,
    batch: &str,
) {
    let m = model(&format!("{name}.onnx"));
    pipec_ok(&[
        "compile",
        m.to_str().unwrap(),
        "--cluster",
        cluster,
        "--devices",
        devices,
        "--planner",
        planner,
        "--batch",
        batch,
        "-o",
        out.to_str().unwrap(),
    ]);
}

/// `pipec simulate OUTDIR --json` and OUTDIR's plan.json, once the replay is asserted within 5%
/// of the plan's `iteration_time_s` (`what` names the case).
fn replay_within_5_percent(out: &std::path::Path, what: &str) -> (Value, Value) {
    let v: Value =
        serde_json::from_str(&pipec_ok(&["simulate", out.to_str().unwrap(), "--json"])).unwrap();
    let replay = v["iteration_time_s"].as_f64().unwrap();
    let planned = v["planned_iteration_time_s"].as_f64().unwrap();
    let r = replay / planned;
    assert!(
        (0.95..=1.05).contains(&r),
        "{what}: replay {replay} s vs plan {planned} s (x{r:.3})"
    );
    let plan =
        serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).unwrap()).unwrap();
    (v, plan)
}

/// The replay's largest device peak (of `pipec simulate --json`'s `v`) within 10% of the plan's
/// `peak_memory_bytes`.
fn peak_within_10_percent(v: &Value, plan: &Value, what: &str) {
    let planned = plan["peak_memory_bytes"].as_f64().unwrap();
    let replay = common::replayed_peak(v);
    let r = replay / planned;
    assert!(
        (0.9..=1.1).contains(&r),
        "{what}: replay peak {replay} B vs plan {planned} B (x{r:.3})"
    );
}

/// Plan fidelity (issue: plans judged on the emitted program): the plan's `iteration_time_s` is
/// the replay of the program `pipec compile` emits for it within 5%, and its peak memory the
/// replay's within 10% (batch 64, the planner's own micro-batch: `compile` without
/// `--micro-batch`). Every planner, branchy models (GPT-2's residuals, DLRM's branches,
/// Inception's), chains of single-device stages over slow links (one message per tensor, in the
/// plan's edge order), and the `cpu` preset, whose devices share the host's cores in the plan's
/// simulation and in the replay alike. The whole matrix is `scripts/plan_fidelity.py`
/// (BENCHMARKS.md).
#[test]
fn plan_time_is_the_replay_of_the_compiled_program() {
    for (name, planner, cluster, devices) in [
        ("inception_mini", "gpp", "summit", "8"),
        ("inception_mini", "bapipe", "summit", "8"),
        ("gpt2_tiny", "gpp", "summit", "8"),
        ("gpt2_tiny", "dapple", "summit", "8"),
        ("gpt2_tiny", "pipedream", "summit", "8"),
        ("mmt_tiny", "pipedream", "summit", "8"),
        ("mmt_tiny", "dapple", "summit", "8"),
        ("dlrm_tiny", "dapple", "summit", "8"),
        ("dlrm_tiny", "bapipe", "dapple-a", "8"),
        ("resnet18", "gpp", "cpu", "8"),
        ("gpt2_tiny", "dapple", "cpu", "4"),
        ("mmt_tiny", "pipedream", "cpu", "4"),
        // The LM head's `Transpose(wte)` is fixed-size: sent whole with every micro-batch (and
        // its cotangent back), costed whatever the micro-batch (was 1.11 and 0.92).
        ("gpt2_tiny", "straight", "dapple-a", "8"),
        ("gpt2_tiny", "straight", "cpu", "4"),
        // Peak memory: a value the backward of both sides of a cut reads is kept on both (was
        // 1.19); a residual read by two ops of the next stage is one buffer (was 0.83).
        ("inception_mini", "pipedream", "dgx-h100", "8"),
        ("mmt_tiny", "bapipe", "dgx-h100", "16"),
        // A forward op as the training graph runs it: MaxPool also writes its indices (was
        // 0.924: the 1F1B-RR stage's forward planned 13% short, so its messages went first).
        ("inception_mini", "pipedream", "dapple-a", "8"),
        // The sum of the tied `wte`'s gradient shares runs only where one stage holds both
        // readers (was 0.921: planned on the embedding's stage every micro-batch).
        ("gpt2_tiny", "pipedream", "summit", "32"),
        // 31 stages on the `cpu` preset's 32 devices: `pipec run` starts 31 workers, which do
        // not divide over 2 cores, so none is pinned (was 0.908: planned as 32 pinned devices).
        ("dlrm_tiny", "bapipe", "cpu", "32"),
    ] {
        let t = tempdir();
        let out = t.path().join("o");
        compile_case(&out, name, planner, cluster, devices, "64");
        let (v, plan) =
            replay_within_5_percent(&out, &format!("{name} {planner} {cluster} {devices}"));
        peak_within_10_percent(&v, &plan, &format!("{name} {planner} {cluster} {devices}"));
    }
}

/// Two plans whose time the simulator once got wrong by a few percent, now timed as replayed
/// to 0.5%:
/// - 32 single-device stages of GPT-2 over summit's links (an iteration of link latencies):
///   a message once reserved its receiver's channel from the time its sender's channel would be
///   free, blocking a later message that fit in the gap; which of two messages that became
///   ready within nanoseconds of each other asked first then moved the iteration by 6% (plan
///   3.18 ms, replay 3.37 ms). Reservations now take the earliest common gap.
/// - A 2-replica last stage after a 1-replica stage (GPP on mlp4, `cpu` preset): the
///   1-replica stage joins its cotangent from the two replicas' halves with a `Concat` before
///   its backward, which the plan did not count (x1.028; GPP's program then replayed 2.2%
///   slower than BaPipe's).
/// - The tiny LSTM in 8 single-device stages on the `cpu` preset's shared cores (x1.061): side
///   computations (slices of the zero initial state) run in the stage that reads them, not
///   where the plan put them, and a value's cotangent contributions are summed where they meet
///   (in the consumers' stage when all of them are there), not in the producer's backward.
#[test]
fn plans_of_latency_chains_and_joined_slices_replay_exactly() {
    for (name, planner, cluster, devices) in [
        ("gpt2_tiny", "straight", "summit", "32"),
        ("mlp4", "gpp", "cpu", "4"),
        ("lstm_tiny", "bapipe", "cpu", "8"),
    ] {
        let t = tempdir();
        let out = t.path().join("o");
        compile_case(&out, name, planner, cluster, devices, "32");
        let (v, _) = replay_within_5_percent(&out, &format!("{name} {planner} {cluster}"));
        let r = v["iteration_time_s"].as_f64().unwrap()
            / v["planned_iteration_time_s"].as_f64().unwrap();
        assert!(
            (r - 1.0).abs() <= 0.005,
            "{name} {planner} {cluster} {devices}: replay/plan x{r:.4}"
        );
    }
}

/// A tied parameter (GPT-2's `wte`, read by the embedding in the first stage and the LM head in
/// the last) is held by both stages in the emitted program: a copy, its gradient buffer and
/// Adam's state in each, one all-reduce over both holders, the step in each. The plan's
/// simulation counts all of it: the replay agrees within 5% in time and 10% in peak memory,
/// every device's (before, the chain's last stage's memory was planned at a quarter of the
/// replay's and the time 10% short), on the README's
/// configuration (batch 8, micro-batch 2, Adam).
#[test]
fn tied_parameters_are_planned_as_emitted() {
    for planner in ["bapipe", "gpp"] {
        let t = tempdir();
        let out = t.path().join("o");
        let mut flags = common::README_CONFIG.to_vec();
        flags.extend_from_slice(&["--planner", planner]);
        if planner == "bapipe" {
            // Four single-device stages: the embedding in the first, the LM head in the last.
            flags.extend_from_slice(&["--schedule", "1f1b"]);
        }
        common::compile("gpt2_tiny.onnx", &out, &flags);
        let (v, plan) = replay_within_5_percent(&out, planner);
        let devices = v["devices"].as_array().unwrap();
        let mut tied_holders = 0;
        for st in plan["stages"].as_array().unwrap() {
            let planned = st["peak_memory_bytes"].as_f64().unwrap();
            for d in st["devices"].as_array().unwrap() {
                let dev = &devices[d.as_u64().unwrap() as usize];
                let replay = dev["peak_memory_bytes"].as_f64().unwrap();
                let r = replay / planned;
                // Every device, for both plans (GPP's DAPPLE-B schedule's last stage was
                // planned 1.4x high while communication buffers counted per consuming node).
                assert!(
                    (0.9..=1.1).contains(&r),
                    "{planner}: stage {} device {d}: replay peak {replay} B vs plan {planned} B \
                     (x{r:.3})",
                    st["id"]
                );
                if dev["allreduce_s"].as_f64().unwrap_or(0.0) > 0.0 && st["replicas"] == 1 {
                    tied_holders += 1;
                }
            }
        }
        if planner == "bapipe" {
            assert_eq!(tied_holders, 2, "{v}");
        }
        peak_within_10_percent(&v, &plan, planner);
    }
}

/// OUTDIR records the resolved cluster (`cluster.json`, device kinds included), so `simulate`
/// without flags replays on the cluster compile planned for: here an inline cluster of H100s,
/// which the old default (V100) would replay differently.
#[test]
fn simulate_replays_on_the_recorded_cluster() {
    let t = tempdir();
    let out = t.path().join("o");
    let o = out.to_str().unwrap();
    common::compile(
        "mlp4.onnx",
        &out,
        &[
            "--cluster",
            "2@25e9",
            "--device-kind",
            "H100-80GB",
            "--planner",
            "straight",
            "--batch",
            "8",
            "--micro-batch",
            "2",
        ],
    );
    let cluster: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("cluster.json")).unwrap()).unwrap();
    assert_eq!(cluster["kinds"][0]["name"], "H100-80GB", "{cluster}");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("artifact.json")).unwrap()).unwrap();
    assert_eq!(manifest["format"], "pipec-outdir");

    let replay = |extra: &[&str]| -> f64 {
        let mut args = vec!["simulate", o, "--json"];
        args.extend_from_slice(extra);
        let v: Value = serde_json::from_str(&pipec_ok(&args)).unwrap();
        v["iteration_time_s"].as_f64().unwrap()
    };
    let recorded = replay(&[]);
    let explicit = replay(&["--cluster", "2@25e9", "--device-kind", "H100-80GB"]);
    let v100 = replay(&["--cluster", "2@25e9"]);
    assert_eq!(recorded, explicit);
    assert!(v100 > recorded * 1.5, "V100 {v100} s vs H100 {recorded} s");
    // The plan's own estimate is on the same cluster: the replay agrees with it.
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).unwrap()).unwrap();
    let planned = plan["iteration_time_s"].as_f64().unwrap();
    assert!(
        (recorded / planned - 1.0).abs() < 0.05,
        "replay {recorded} vs plan {planned}"
    );

    // An OUTDIR of a newer format is refused, naming the file and both versions.
    std::fs::write(
        out.join("artifact.json"),
        r#"{"format": "pipec-outdir", "version": 99}"#,
    )
    .unwrap();
    let r = pipec(&["simulate", o]);
    assert_eq!(r.status.code(), Some(2));
    let e = common::stderr(&r);
    assert!(
        e.contains("artifact.json: written by a newer pipec (format 99; this one reads up to"),
        "{e}"
    );
}
