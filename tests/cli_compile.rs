//! `pipec compile`: OUTDIR contents, static schedule verification, determinism, atomic failure,
//! and numeric equivalence of the emitted program with single-device training, checked by an
//! independent onnxruntime executor of schedule.json (`scripts/ort_program.py`, which also runs
//! `onnx.checker.check_model(full_check=True)` on every emitted file).

mod common;

use common::{model, pipec, pipec_ok, python_with_onnx, root, tempdir};
use pipec_compiler::program::{self, Instr, PieceKind, Program};
use std::path::Path;
use std::process::Command;

const CPU8: &[&str] = &["--cluster", "8@1e10", "--device-kind", "cpu-core"];

fn compile(
    name: &str,
    planner: &str,
    devices: usize,
    batch: u64,
    mb: u64,
    extra: &[&str],
    out: &Path,
) {
    let m = model(&format!("{name}.onnx"));
    let (d, b, mbs) = (devices.to_string(), batch.to_string(), mb.to_string());
    let mut args = vec!["compile", m.to_str().unwrap()];
    if extra.contains(&"--cluster") {
        args.extend_from_slice(&CPU8[2..]);
    } else {
        args.extend_from_slice(CPU8);
    }
    args.extend_from_slice(&[
        "--devices",
        &d,
        "--planner",
        planner,
        "--batch",
        &b,
        "--micro-batch",
        &mbs,
        "-o",
        out.to_str().unwrap(),
    ]);
    args.extend_from_slice(extra);
    pipec_ok(&args);
}

/// OUTDIR's `plan.json`.
fn plan_json(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).unwrap()).unwrap()
}

/// `pipec run OUTDIR --steps 3 --check` (must exit 0); its stdout.
fn run_3_steps_checked(out: &Path) -> String {
    pipec_ok(&["run", out.to_str().unwrap(), "--steps", "3", "--check"])
}

fn load(out: &Path) -> Program {
    let text = std::fs::read_to_string(out.join("schedule.json")).unwrap();
    Program::from_json(&text, "schedule.json").unwrap()
}

#[test]
fn outdir_has_every_piece_and_a_verified_schedule() {
    let t = tempdir();
    let out = t.path().join("o");
    compile("mlp4", "straight", 2, 8, 2, &[], &out);
    for f in ["plan.json", "schedule.json", "weights.npz", "program.mlir"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let p = load(&out);
    program::verify(&p).unwrap();
    assert_eq!(p.devices.len(), 2);
    assert_eq!(p.micro_batches, 4);
    for st in &p.stages {
        assert!(out.join(&st.fwd.file).is_file());
        assert!(out.join(&st.bwd.as_ref().unwrap().file).is_file());
        assert!(out.join(&st.step.as_ref().unwrap().file).is_file());
    }
    // 1F1B on the first of two stages: two forwards before the first backward.
    let d0: Vec<&Instr> = p.devices[0]
        .instructions
        .iter()
        .filter(|i| matches!(i, Instr::Compute { .. }))
        .collect();
    let fwd_first = d0
        .iter()
        .take_while(
            |i| matches!(i, Instr::Compute { pass, .. } if *pass == program::PieceKind::Fwd),
        )
        .count();
    assert_eq!(fwd_first, 2, "{d0:?}");
    // Every activation sent forward comes back as a cotangent.
    let sends = p.devices[0]
        .instructions
        .iter()
        .filter(|i| matches!(i, Instr::Send { .. }))
        .count();
    let recvs = p.devices[0]
        .instructions
        .iter()
        .filter(|i| matches!(i, Instr::Recv { .. }))
        .count();
    assert_eq!((sends, recvs), (4, 4));
    let plan = plan_json(&out);
    assert_eq!(plan["planner"], "straight");
}

/// Two compiles of the same inputs give byte-identical OUTDIRs (every file, `plan.json`
/// included: it holds no timing), for every planner that searches.
#[test]
fn compile_is_deterministic() {
    let t = tempdir();
    for (name, planner, devices, batch, mb) in [
        ("gpt2_tiny", "straight", 4, 4, 1),
        ("inception_mini", "gpp", 4, 8, 2),
        ("mlp4", "dapple", 4, 16, 4),
        ("mlp4", "bapipe", 3, 16, 4),
        ("gpt2_tiny", "pipedream", 3, 4, 2),
    ] {
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        compile(name, planner, devices, batch, mb, &[], &a);
        compile(name, planner, devices, batch, mb, &[], &b);
        let fa = common::assert_same_files(&a, &b, &format!("{name} {planner}: two compiles"));
        assert!(fa.len() >= 5, "{fa:?}");
        let plan = plan_json(&a);
        assert!(plan.get("search_time_s").is_none(), "{plan}");
        assert!(plan.get("iteration_time_s").is_some(), "{plan}");
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }
}

#[test]
fn tied_embedding_is_all_reduced_across_the_stages_that_hold_it() {
    let t = tempdir();
    let out = t.path().join("o");
    compile("gpt2_tiny", "straight", 4, 4, 1, &[], &out);
    let p = load(&out);
    let holders: Vec<usize> = p
        .stages
        .iter()
        .filter(|s| s.params.iter().any(|n| n == "transformer.wte.weight"))
        .map(|s| s.id)
        .collect();
    assert!(
        holders.len() >= 2,
        "wte should be held by the first and the last stage: {holders:?}"
    );
    let group = p.devices[holders[0]]
        .instructions
        .iter()
        .find_map(|i| match i {
            Instr::AllReduce { group, tensors, .. }
                if tensors.iter().any(|t| t == "grad/transformer.wte.weight") =>
            {
                Some(group.clone())
            }
            _ => None,
        });
    assert_eq!(group, Some(holders.clone()));
}

#[test]
fn bad_inputs_fail_cleanly_without_outdir() {
    let t = tempdir();
    let out = t.path().join("o");
    let m = model("mlp4.onnx");
    let ms = m.to_str().unwrap();
    let o = out.to_str().unwrap();
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "compile",
                ms,
                "--planner",
                "straight",
                "--batch",
                "8",
                "--micro-batch",
                "3",
                "-o",
                o,
            ],
            "--micro-batch 3",
        ),
        (
            vec![
                "compile",
                "/nonexistent.onnx",
                "--planner",
                "straight",
                "--batch",
                "8",
                "--micro-batch",
                "2",
                "-o",
                o,
            ],
            "nonexistent",
        ),
        (
            vec![
                "compile",
                ms,
                "--planner",
                "nope",
                "--batch",
                "8",
                "--micro-batch",
                "2",
                "-o",
                o,
            ],
            "--planner nope",
        ),
        (
            vec![
                "compile",
                ms,
                "--planner",
                "straight",
                "--batch",
                "8",
                "--micro-batch",
                "2",
                "--optimizer",
                "rmsprop",
                "-o",
                o,
            ],
            "--optimizer",
        ),
    ];
    for (args, _) in &mut cases {
        args.extend_from_slice(CPU8);
    }
    for (args, needle) in cases {
        let r = pipec(&args);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out.exists(), "a failed compile left {}", out.display());
    }
}

/// Compile, then execute with onnxruntime (independent of pipec's runtime) and compare every
/// parameter with single-device training after 3 steps.
fn ort_check(name: &str, planner: &str, devices: usize, batch: u64, mb: u64, extra: &[&str]) {
    let Some(py) = python_with_onnx() else { return };
    let t = tempdir();
    let out = t.path().join("o");
    compile(name, planner, devices, batch, mb, extra, &out);
    let r = Command::new(py)
        .arg(root().join("scripts/ort_program.py"))
        .arg(&out)
        .args(["--steps", "3"])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success(),
        "{name}/{planner}/{devices}: {so}\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(so.contains("max_rel_diff"), "{so}");
}

#[test]
fn ort_oracle_mlp4_dapple_momentum() {
    ort_check(
        "mlp4",
        "dapple",
        4,
        8,
        4,
        &["--optimizer", "sgd:lr=0.1,momentum=0.9"],
    );
}

#[test]
fn ort_oracle_gpt2_tied_straight_adam() {
    ort_check(
        "gpt2_tiny",
        "straight",
        4,
        4,
        1,
        &["--optimizer", "adam:lr=0.001", "--schedule", "gpipe"],
    );
}

/// PipeDream's asynchronous 1F1B with Adam (its step counter counts updates) and GPT-2's tied
/// embedding: onnxruntime's run of the program against its own emulation of the update rule.
#[test]
fn ort_oracle_gpt2_pipedream_async_adam() {
    ort_check(
        "gpt2_tiny",
        "straight",
        4,
        16,
        2,
        &[
            "--optimizer",
            "adam:lr=0.001",
            "--schedule",
            "pipedream-async",
        ],
    );
}

#[test]
fn ort_oracle_dlrm_gpp_dag() {
    ort_check(
        "dlrm_tiny",
        "gpp",
        4,
        8,
        4,
        &["--optimizer", "sgd:lr=0.1,momentum=0.9"],
    );
}

#[test]
fn ort_oracle_mmt_pipedream_round_robin() {
    ort_check(
        "mmt_tiny",
        "pipedream",
        8,
        16,
        4,
        &["--optimizer", "adam:lr=0.001"],
    );
}

#[test]
fn ort_oracle_inception_straight_skips() {
    ort_check("inception_mini", "straight", 4, 8, 2, &[]);
}

/// `pipec compile` then `pipec run --check` (pipec's own runtime, in-process transport).
fn run_check(name: &str, planner: &str, devices: usize, batch: u64, mb: u64, extra: &[&str]) {
    let t = tempdir();
    let out = t.path().join("o");
    compile(name, planner, devices, batch, mb, extra, &out);
    let so = run_3_steps_checked(&out);
    assert!(so.contains("max_rel_diff"), "{so}");
}

#[test]
fn run_check_gpt2_tied_gpipe_adam() {
    run_check(
        "gpt2_tiny",
        "straight",
        4,
        4,
        1,
        &["--schedule", "gpipe", "--optimizer", "adam:lr=0.001"],
    );
}

#[test]
fn run_check_uneven_replication_momentum() {
    // dapple on 8 devices gives mlp4 a 1:1:6 plan: a 1 -> 6 split and its concat back.
    run_check(
        "mlp4",
        "dapple",
        8,
        12,
        6,
        &["--optimizer", "sgd:lr=0.1,momentum=0.9"],
    );
}

#[test]
fn run_check_round_robin_and_dag() {
    run_check("mmt_tiny", "pipedream", 8, 16, 4, &[]);
    run_check("dlrm_tiny", "gpp", 4, 8, 4, &["--schedule", "gpp"]);
    run_check("inception_mini", "straight", 2, 4, 1, &[]);
}

#[test]
fn edited_deadlocking_schedule_and_missing_file_fail_fast() {
    let t = tempdir();
    let out = t.path().join("o");
    compile("mlp4", "straight", 2, 4, 2, &[], &out);
    // Swap device 1's first receive behind its first send: device 1 now waits on itself.
    let path = out.join("schedule.json");
    let mut p = load(&out);
    let list = &mut p.devices[1].instructions;
    let r = list
        .iter()
        .position(|i| matches!(i, Instr::Recv { .. }))
        .unwrap();
    let s = list
        .iter()
        .position(|i| matches!(i, Instr::Send { .. }))
        .unwrap();
    let recv = list.remove(r);
    list.insert(s, recv);
    std::fs::write(&path, p.to_json()).unwrap();
    let t0 = std::time::Instant::now();
    let r = pipec(&["run", out.to_str().unwrap(), "--steps", "1"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_ne!(r.status.code(), Some(0), "{err}");
    assert!(err.contains("device"), "{err}");
    assert!(t0.elapsed().as_secs() < 30, "took {:?}", t0.elapsed());
    // A missing piece is named.
    compile("mlp4", "straight", 2, 4, 2, &[], &out);
    std::fs::remove_file(out.join("stages/s1.bwd.onnx")).unwrap();
    let r = pipec(&["run", out.to_str().unwrap(), "--steps", "1"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(err.contains("s1.bwd.onnx"), "{err}");
}

#[test]
fn run_check_in_f64_agrees_to_rounding() {
    let t = tempdir();
    let out = t.path().join("o");
    compile(
        "inception_mini",
        "dapple",
        4,
        8,
        4,
        &["--optimizer", "adam:lr=0.001"],
        &out,
    );
    let so = pipec_ok(&[
        "run",
        out.to_str().unwrap(),
        "--steps",
        "2",
        "--check",
        "--precision",
        "f64",
    ]);
    let rel: f64 = so
        .lines()
        .find_map(|l| l.strip_prefix("max_rel_diff "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{so}"));
    assert!(rel < 1e-10, "f64 pipeline vs f64 reference: {rel}");
}

#[test]
fn program_mlir_is_accepted_by_mlir_opt() {
    let Some(opt) = common::mlir_opt() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "mlir-opt is required under CI"
        );
        return;
    };
    let t = tempdir();
    let out = t.path().join("o");
    compile("dlrm_tiny", "gpp", 4, 8, 4, &[], &out);
    let text = std::fs::read_to_string(out.join("program.mlir")).unwrap();
    assert!(text.contains("module @schedule"), "no schedule module");
    assert!(text.contains("\"pipec.all_reduce\"") || text.contains("\"pipec.send\""));
    let r = Command::new(opt)
        .arg("--allow-unregistered-dialect")
        .arg(out.join("program.mlir"))
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

/// onnxruntime runs every stage's forward and backward (the whole schedule) with the same numbers
/// as pipec's executor: same data, same steps, final parameters compared.
#[test]
fn onnxruntime_and_pipec_runtime_agree_on_the_same_program() {
    let Some(py) = python_with_onnx() else { return };
    let t = tempdir();
    let out = t.path().join("o");
    compile(
        "gpt2_tiny",
        "dapple",
        4,
        8,
        4,
        &["--optimizer", "sgd:lr=0.1,momentum=0.9"],
        &out,
    );
    let data = t.path().join("data.npz");
    let params = t.path().join("params.npz");
    let script = root().join("scripts/ort_program.py");
    let r = Command::new(py)
        .arg(&script)
        .arg(&out)
        .args(["--steps", "2", "--no-checker", "--save-inputs"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    pipec_ok(&[
        "run",
        out.to_str().unwrap(),
        "--steps",
        "2",
        "--inputs",
        data.to_str().unwrap(),
        "-o",
        params.to_str().unwrap(),
    ]);
    let r = Command::new(py)
        .arg(&script)
        .arg(&out)
        .args(["--steps", "2", "--no-checker", "--inputs"])
        .arg(&data)
        .arg("--against")
        .arg(&params)
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(so.contains("onnxruntime pipeline vs"), "{so}");
}

#[test]
fn round_robin_replicas_follow_the_stage_order_without_deadlock() {
    // dapple gives dlrm_tiny 3:3:2 replicas on 8 devices; a micro-batch of 8 does not divide
    // over 3, so those stages take whole micro-batches round robin. Each replica must keep the
    // stage's 1F1B order restricted to its micro-batches (a per-replica warm-up deadlocked).
    run_check(
        "dlrm_tiny",
        "dapple",
        8,
        32,
        8,
        &["--schedule", "1f1b", "--optimizer", "adam:lr=0.001"],
    );
}

/// GraphPipe's kFkB (`--schedule kfkb-K`): every stage runs `K` forwards, then `K` backwards, in
/// turn after its warm-up `K + 2·(depth − 1)` (Appendix A.1 row 8), on a DAG plan and on a chain;
/// the program trains exactly as single-device training does.
#[test]
fn run_check_kfkb_dag_and_chain() {
    let t = tempdir();
    let out = t.path().join("o");
    compile(
        "dlrm_tiny",
        "gpp",
        4,
        16,
        4,
        &["--schedule", "kfkb-2", "--optimizer", "adam:lr=0.001"],
        &out,
    );
    let p = load(&out);
    assert_eq!(p.schedule, "kfkb-2");
    let plan = plan_json(&out);
    assert_eq!(plan["schedule"], "kfkb-2");
    // Depth of every stage from the stage DAG (preds), then each device's compute order.
    let stages = plan["stages"].as_array().unwrap();
    let n = stages.len();
    let preds: Vec<Vec<usize>> = stages
        .iter()
        .map(|s| {
            s["predecessors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect()
        })
        .collect();
    let mut depth = vec![1usize; n];
    for s in (0..n).rev() {
        for &q in &preds[s] {
            depth[q] = depth[q].max(depth[s] + 1);
        }
    }
    assert!(depth.iter().any(|&d| d > 1), "a one-stage plan: {depth:?}");
    let m = p.micro_batches as usize;
    for d in &p.devices {
        let order: Vec<(bool, u32)> = d
            .instructions
            .iter()
            .filter_map(|i| match i {
                Instr::Compute { pass, mb } => Some((*pass == program::PieceKind::Fwd, *mb)),
                _ => None,
            })
            .collect();
        let warm = (2 + 2 * (depth[d.stage] - 1)).min(m);
        assert_eq!(
            stages[d.stage]["in_flight"], warm as u64,
            "stage {}",
            d.stage
        );
        let mut want: Vec<(bool, u32)> = (0..warm as u32).map(|f| (true, f)).collect();
        let (mut nf, mut nb) = (warm, 0);
        while nb < m {
            for _ in 0..2.min(m - nb) {
                want.push((false, nb as u32));
                nb += 1;
            }
            for _ in 0..2.min(m - nf) {
                want.push((true, nf as u32));
                nf += 1;
            }
        }
        assert_eq!(order, want, "device {} (stage {})", d.device, d.stage);
    }
    let so = run_3_steps_checked(&out);
    assert!(so.contains("check ok"), "{so}");
    run_check(
        "gpt2_tiny",
        "straight",
        4,
        16,
        2,
        &["--schedule", "kfkb-3", "--optimizer", "adam:lr=0.001"],
    );
}

/// GraphPipe's per-stage micro-batch sizes (`--schedule gpp-per-stage`): stages of different
/// sizes (and replica counts) exchange re-sliced pieces of each other's micro-batches, every
/// device runs `B / b_s` micro-batches of its stage, and the program trains exactly as
/// single-device training does (tied GPT-2 embeddings included). A stage with batch statistics
/// keeps the plan's size.
#[test]
fn run_check_per_stage_micro_batches() {
    let t = tempdir();
    let out = t.path().join("o");
    compile(
        "dlrm_tiny",
        "gpp",
        8,
        32,
        2,
        &[
            "--schedule",
            "gpp-per-stage",
            "--optimizer",
            "sgd:lr=0.1,momentum=0.9",
            // A slow network: on fast links data parallelism wins and there is one stage.
            "--cluster",
            "8@1e8",
        ],
        &out,
    );
    let p = load(&out);
    assert_eq!(p.schedule, "gpp-per-stage");
    // Re-sliced pieces of several micro-batches still reach each device in the order it
    // receives them.
    program::pair_order(&p).unwrap();
    let plan = plan_json(&out);
    let sizes: Vec<u64> = plan["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["micro_batch"].as_u64().expect("per-stage micro_batch"))
        .collect();
    let mut distinct = sizes.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 1, "one size for all stages: {sizes:?}");
    let mut resliced = 0;
    for d in &p.devices {
        let computes = d
            .instructions
            .iter()
            .filter(|i| matches!(i, Instr::Compute { .. }))
            .count() as u64;
        assert_eq!(computes, 2 * 32 / sizes[d.stage], "device {}", d.device);
        resliced += d
            .instructions
            .iter()
            .filter(|i| {
                // `name#r1m3`: a piece of the sender's micro-batch 3.
                matches!(i, Instr::Recv { tensor, .. }
                    if tensor.rsplit('#').next().is_some_and(|x| x.contains('m')))
            })
            .count();
    }
    assert!(resliced > 0, "no piece of another stage's micro-batch");
    let so = run_3_steps_checked(&out);
    assert!(so.contains("check ok"), "{so}");
    run_check(
        "gpt2_tiny",
        "gpp",
        8,
        32,
        2,
        &[
            "--schedule",
            "gpp-per-stage",
            "--optimizer",
            "adam:lr=0.001",
        ],
    );
    run_check(
        "inception_mini",
        "gpp",
        6,
        32,
        2,
        &["--schedule", "gpp-per-stage"],
    );
}

/// ViT's `Linear` is `MatMul(x, Transpose(W))`: the transposed weight is batch-independent, and
/// when the stage computing it has more replicas than the stage reading it, the
/// extra producer replicas get no cotangent for it from anyone. Codegen gives them a zero
/// cotangent (`zeros`); without it their backward read a buffer nothing produced, which the
/// verifier's dataflow check refuses and `pipec run` used to hit in step 1.
#[test]
fn vit_weight_transpose_read_by_fewer_replicas_gets_zero_cotangents() {
    let t = tempdir();
    let out = t.path().join("o");
    // Stage 0 (2 replicas) ends with the transposed weight of the first MLP's second Linear;
    // stage 1 (1 replica) reads it.
    let t_ = "/encoder/layers/encoder_layer_0/mlp/mlp.3";
    let stages = format!("..={t_}/Transpose@2;{t_}/MatMul..");
    let flags = [
        "--cluster",
        "cpu",
        "--devices",
        "6",
        "--stages",
        &stages,
        "--batch",
        "8",
        "--micro-batch",
        "2",
    ];
    common::compile("vit_tiny.onnx", &out, &flags);
    let p = load(&out);
    let zeros: Vec<(usize, String)> = p
        .devices
        .iter()
        .flat_map(|d| {
            d.instructions.iter().filter_map(move |i| match i {
                Instr::Zeros { output, .. } => Some((d.device, output.clone())),
                _ => None,
            })
        })
        .collect();
    assert!(
        zeros
            .iter()
            .any(|(_, o)| o.starts_with("cot/") && o.contains("Transpose_output_0")),
        "the plan no longer exercises the zero cotangent: {zeros:?}"
    );
    // Without them, the program is refused statically, naming device, instruction and buffer.
    let mut bad = p.clone();
    for d in &mut bad.devices {
        d.instructions.retain(|i| !matches!(i, Instr::Zeros { .. }));
    }
    let e = program::verify(&bad).unwrap_err().to_string();
    let dev = zeros[0].0;
    assert!(e.contains(&format!("device {dev} instruction")), "{e}");
    assert!(e.contains("(compute bwd mb 0)"), "{e}");
    assert!(e.contains("is neither buffer"), "{e}");
    assert!(
        zeros
            .iter()
            .any(|(d, b)| *d == dev && e.contains(&format!("input '{b}' "))),
        "{e}"
    );
    // With them, it trains like one device.
    let s = pipec_ok(&["run", out.to_str().unwrap(), "--steps", "2", "--check"]);
    assert!(s.contains("check ok"), "{s}");
}

/// `--stages SPEC` (a plan the user writes) and `compile` without `--micro-batch`: the stages are
/// the ones written, every node in one of them; the micro-batch is the planner's (here the
/// fastest one every stage's replica count divides); bad specs are refused naming the problem.
#[test]
fn user_stages_and_the_planners_micro_batch() {
    let t = tempdir();
    let out = t.path().join("o");
    let m = model("gpt2_tiny.onnx");
    let m = m.to_str().unwrap();
    let base = [
        "--cluster",
        "8@1e10",
        "--device-kind",
        "cpu-core",
        "--batch",
        "16",
    ];
    let mut args = vec!["compile", m, "--stages", "..100@2;100..", "-o"];
    args.push(out.to_str().unwrap());
    args.extend_from_slice(&base);
    pipec_ok(&args);
    let plan = plan_json(&out);
    assert_eq!(plan["planner"], "stages");
    let stages = plan["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0]["devices"], serde_json::json!([0, 1]));
    assert_eq!(stages[1]["devices"], serde_json::json!([2]));
    let mb = plan["micro_batch"].as_u64().unwrap();
    assert!(mb.is_multiple_of(2) && 16 % mb == 0, "micro-batch {mb}");
    let so = run_3_steps_checked(&out);
    assert!(so.contains("check ok"), "{so}");
    // `pipec plan --stages` gives the same plan.
    let mut pargs = vec!["plan", m, "--stages", "..100@2;100..", "--json"];
    pargs.extend_from_slice(&base);
    let pj: serde_json::Value = serde_json::from_str(&pipec_ok(&pargs)).unwrap();
    assert_eq!(pj["micro_batch"], plan["micro_batch"]);
    assert_eq!(pj["iteration_time_s"], plan["iteration_time_s"]);
    // A planner without --micro-batch: the plan's own.
    let out2 = t.path().join("o2");
    let mut args = vec!["compile", m, "--planner", "dapple", "-o"];
    args.push(out2.to_str().unwrap());
    args.extend_from_slice(&base);
    pipec_ok(&args);
    let mut pargs = vec!["plan", m, "--planner", "dapple", "--json"];
    pargs.extend_from_slice(&base);
    let pj: serde_json::Value = serde_json::from_str(&pipec_ok(&pargs)).unwrap();
    assert_eq!(plan_json(&out2)["micro_batch"], pj["micro_batch"]);
    // Bad specs.
    for (spec, want) in [
        ("..100;90..", "is in stage 0 and in stage 1"),
        ("..100", "node(s) in no stage, the first at position 100"),
        ("..100@8;100..", "devices or more; 8 are available"),
        ("..100@0;100..", "0 replicas"),
        ("..nope;100..", "no node named 'nope'"),
        ("..100@x;100..", "replicas 'x' is not a number"),
    ] {
        let mut pargs = vec!["plan", m, "--stages", spec];
        pargs.extend_from_slice(&base);
        let o = pipec(&pargs);
        let e = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{spec}: {e}");
        assert!(e.contains(want), "{spec}: {e}");
    }
}

#[test]
fn batch_on_axis_one_is_resliced_between_replica_counts() {
    // lstm_tiny's LSTM keeps `[seq, batch, hidden]` (the batch on axis 1). Between a stage of
    // one replica and a stage of two such values are cut along axis 1 (one -> two) or joined
    // along axis 1 (two -> one) (zoo: gru, lstm_seq and vit under dapple on 32 devices).
    let m = model("lstm_tiny.onnx");
    for (spec, want_slices, want_concats) in
        [("0..12;12..@2", true, false), ("0..10@2;10..", false, true)]
    {
        let t = tempdir();
        let out = t.path().join("o");
        pipec_ok(&[
            "compile",
            m.to_str().unwrap(),
            "--stages",
            spec,
            "--cluster",
            "3@1e10",
            "--device-kind",
            "cpu-core",
            "--batch",
            "8",
            "--micro-batch",
            "4",
            "-o",
            out.to_str().unwrap(),
        ]);
        let p = load(&out);
        let all = || p.devices.iter().flat_map(|d| &d.instructions);
        let slices = all()
            .filter(|i| matches!(i, Instr::Send { slice: Some(s), .. } if s.axis == 1))
            .count();
        let concats = all()
            .filter(|i| matches!(i, Instr::Concat { axis: 1, .. }))
            .count();
        assert_eq!(
            (slices > 0, concats > 0),
            (want_slices, want_concats),
            "{spec}: {slices} {concats}"
        );
        let so = run_3_steps_checked(&out);
        assert!(so.contains("check ok"), "{spec}: {so}");
    }
}

/// Largest replayed peak memory over the largest planned stage peak (`pipec simulate --json`
/// against plan.json).
fn replay_over_plan_memory(out: &Path) -> f64 {
    let s: serde_json::Value =
        serde_json::from_str(&pipec_ok(&["simulate", out.to_str().unwrap(), "--json"])).unwrap();
    common::replayed_peak(&s) / plan_json(out)["peak_memory_bytes"].as_f64().unwrap()
}

#[test]
fn batch_independent_values_hold_no_more_than_the_plan_counts() {
    // vit_tiny's transposed MLP weight (batch-independent) crosses a stage boundary.
    let t_ = "/encoder/layers/encoder_layer_0/mlp/mlp.3";
    for (spec, devices) in [
        // One producer replica, four consumers: four partial-sum cotangents come back and are
        // added as they arrive (a running sum: two buffers, not four).
        (format!("..={t_}/Transpose;{t_}/MatMul..@4"), "5"),
        // Two producer replicas, one consumer: replica 1 computes the weight but sends it to
        // no one, and frees it at once instead of holding it to its backward.
        (format!("..={t_}/Transpose@2;{t_}/MatMul.."), "3"),
    ] {
        let t = tempdir();
        let out = t.path().join("o");
        let flags = [
            "--cluster",
            "cpu",
            "--devices",
            devices,
            "--stages",
            &spec,
            "--batch",
            "8",
            "--micro-batch",
            "4",
        ];
        common::compile("vit_tiny.onnx", &out, &flags);
        let p = load(&out);
        let all = || p.devices.iter().flat_map(|d| &d.instructions);
        assert!(
            all().all(|i| !matches!(i, Instr::Sum { inputs, .. } if inputs.len() > 2)),
            "{spec}: a sum of more than two pieces"
        );
        if devices == "5" {
            assert!(
                all().any(|i| matches!(i, Instr::Sum { .. })),
                "{spec}: no running sum"
            );
        } else {
            // Freed after its forward, before the backward of the same micro-batch.
            let list = &p.devices[1].instructions;
            let early_free = list.iter().enumerate().any(|(k, i)| match i {
                Instr::Free { mb, tensors }
                    if tensors.iter().any(|x| x.contains("Transpose_output_0")) =>
                {
                    list[k..].iter().any(
                        |j| matches!(j, Instr::Compute { pass: PieceKind::Bwd, mb: m } if m == mb),
                    )
                }
                _ => false,
            });
            assert!(early_free, "{spec}: replica 1 holds the unsent weight");
        }
        let r = replay_over_plan_memory(&out);
        assert!(
            (0.9..=1.1).contains(&r),
            "{spec}: replayed / planned peak memory {r}"
        );
        let s = pipec_ok(&["run", out.to_str().unwrap(), "--steps", "2", "--check"]);
        assert!(s.contains("check ok"), "{spec}: {s}");
    }
}

/// `--dump-ir`, `--print-ir-after STEP` and `--timing` come from the pass manager that runs the
/// compile steps: the dump holds every step's IR in order (each file parses back as textual IR),
/// the printer names the step and the module, and the timing lists every step with its
/// statistics. An unknown step is refused by name; a failed compile leaves no dump.
#[test]
fn dump_print_and_timing_come_from_the_pass_manager() {
    let t = tempdir();
    let (out, dump) = (t.path().join("o"), t.path().join("ir"));
    let m = model("mlp4.onnx");
    let args = |extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "compile",
            m.to_str().unwrap(),
            "--cluster",
            "cpu",
            "--devices",
            "2",
            "--planner",
            "straight",
            "--batch",
            "4",
            "-o",
            out.to_str().unwrap(),
            "--dump-ir",
            dump.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let a = args(&["--print-ir-after", "partition", "--timing"]);
    let o = pipec(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let err = common::stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("// -----// IR Dump After partition (partition) //----- //"),
        "{err}"
    );
    assert!(!err.contains("IR Dump After stage-pieces"), "{err}");
    // Every step of the pipeline (`tests/library.rs` pins the list).
    for step in pipec::driver::pipeline().iter().map(|p| p.name()) {
        assert!(err.contains(&format!(" ms  {step}  ")), "{step}: {err}");
    }
    assert!(err.contains("partition  stages=2"), "{err}");
    let mut files: Vec<String> = std::fs::read_dir(&dump)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files[0], "00-import.mlir");
    assert_eq!(files[1], "01-partition.mlir");
    assert_eq!(files[2], "02-training-s0.mlir");
    assert_eq!(
        files.last().unwrap(),
        &format!("{:02}-reference-step.mlir", files.len() - 1)
    );
    for f in &files {
        let p = dump.join(f);
        pipec_ok(&["opt", p.to_str().unwrap()]);
    }

    let bad = args(&["--print-ir-after", "autodiff"]);
    let o = pipec(&bad.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        common::stderr(&o)
            .contains("--print-ir-after autodiff: no such step (steps: import, plan,"),
        "{}",
        common::stderr(&o)
    );
}

/// An error a compile step raises reaches the user as the step raised it, through the pass
/// manager: codegen's refusal of a model without a symbolic batch names the input under
/// `MODEL: compile failed`, and nothing is written, neither OUTDIR nor the `--dump-ir` of the
/// steps that ran before (a failed compile leaves no partial output).
#[test]
fn a_step_error_keeps_its_message() {
    let t = tempdir();
    let m = model("mlp4.onnx");
    let text = pipec_ok(&["opt", m.to_str().unwrap(), "--emit-resources"]);
    // The batch dim made static: shapes stay consistent, codegen has no batch to cut.
    let fixed = text
        .replace("tensor<?x64xf32, [\"batch\"]>", "tensor<8x64xf32>")
        .replace("tensor<?x128xf32, [\"batch\"]>", "tensor<8x128xf32>")
        .replace("tensor<?x10xf32, [\"batch\"]>", "tensor<8x10xf32>");
    assert!(!fixed.contains("\"batch\""), "{fixed}");
    let src = t.path().join("static.mlir");
    std::fs::write(&src, fixed).unwrap();
    let (out, dump) = (t.path().join("o"), t.path().join("ir"));
    let o = pipec(&[
        "compile",
        src.to_str().unwrap(),
        "--dump-ir",
        dump.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--devices",
        "2",
        "--planner",
        "straight",
        "--batch",
        "8",
        "-o",
        out.to_str().unwrap(),
    ]);
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "error: {}: compile failed\n  caused by: 'input': codegen: the first data input \
             needs a symbolic batch on axis 0 (re-export the model with a dynamic batch axis)",
            src.display()
        )
    );
    assert!(!out.exists() && !dump.exists());
}
