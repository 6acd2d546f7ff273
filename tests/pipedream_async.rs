//! PipeDream's asynchronous 1F1B (`--schedule pipedream-async`, Narayanan et al. 2019, §3.3–3.4):
//! an all-reduce and optimizer step after every micro-batch's backward, no flush, and weight
//! stashing. The programs equal the single-device emulation of PipeDream's update rule
//! (`run --check`), on a chain, a graph (DAG) pipeline, replicated stages and tied parameters;
//! the verifier rejects a program whose backward would see other weights than its forward; the
//! replay matches the plan; and the training differs from synchronous training, as the paper
//! says it does.

mod common;

use common::{compile, pipec, pipec_ok, stderr, tempdir};
use pipec_compiler::program::{self, Instr, PieceKind, Program};
use std::path::Path;

fn load(out: &Path) -> Program {
    let text = std::fs::read_to_string(out.join("schedule.json")).expect("schedule.json");
    Program::from_json(&text, "schedule.json").expect("program")
}

fn save(out: &Path, p: &Program) {
    std::fs::write(out.join("schedule.json"), p.to_json()).expect("write");
}

/// Device `d`'s computes, stashes and steps as `F3`, `B3`, `S3` (stash), `U` (update).
fn order(p: &Program, d: usize) -> Vec<String> {
    p.devices[d]
        .instructions
        .iter()
        .filter_map(|i| match i {
            Instr::Compute {
                pass: PieceKind::Fwd,
                mb,
            } => Some(format!("F{mb}")),
            Instr::Compute { mb, .. } => Some(format!("B{mb}")),
            Instr::Stash { mb, .. } => Some(format!("S{mb}")),
            Instr::Step => Some("U".into()),
            _ => None,
        })
        .collect()
}

/// Compile under `pipedream-async`, train 3 steps against the emulation, replay against the
/// plan (within 5%). Returns the output folder and the program.
fn case(
    model: &str,
    planner: &str,
    devices: &str,
    batch: &str,
    mb: &str,
) -> (tempfile::TempDir, Program) {
    // `stages:SPEC` compiles the stages SPEC (`--stages`) instead of a planner's.
    case_with(model, planner, devices, batch, mb, &[])
}

/// [`case`] with more compile flags.
fn case_with(
    model: &str,
    planner: &str,
    devices: &str,
    batch: &str,
    mb: &str,
    extra: &[&str],
) -> (tempfile::TempDir, Program) {
    let t = tempdir();
    let out = t.path().join("o");
    let (flag, what) = match planner.strip_prefix("stages:") {
        Some(spec) => ("--stages", spec),
        None => ("--planner", planner),
    };
    compile(
        &format!("{model}.onnx"),
        &out,
        &[
            "--cluster",
            "cpu",
            "--devices",
            devices,
            flag,
            what,
            "--batch",
            batch,
            "--micro-batch",
            mb,
            "--schedule",
            "pipedream-async",
        ]
        .iter()
        .chain(extra)
        .copied()
        .collect::<Vec<_>>(),
    );
    let p = load(&out);
    program::verify(&p).expect("verified");
    assert!(p.per_micro_batch_step);
    common::check_and_replay(&out, &format!("{model} {planner}"));
    (t, p)
}

/// A chain of 4 stages (mlp4, 8 micro-batches): 1F1B's order with a step after every backward
/// of a stage that has parameters, and a stash exactly for the micro-batches that see a step
/// between their forward and backward (none on the last stage), of the parameters the backward
/// reads: none on the first stage, whose backward computes no input gradient (the data input
/// has none) and so never reads its weight.
#[test]
fn chain_steps_after_every_backward_and_stashes_what_it_must() {
    let (_t, p) = case("mlp4", "straight", "4", "16", "2");
    let first = order(&p, 0);
    assert_eq!(
        &first[..9],
        ["F0", "F1", "F2", "F3", "B0", "U", "F4", "B1", "U"],
        "{first:?}"
    );
    assert_eq!(first.iter().filter(|x| *x == "U").count(), 8);
    let third = order(&p, 2);
    assert_eq!(
        &third[..12],
        ["F0", "S1", "F1", "B0", "U", "S2", "F2", "B1", "U", "S3", "F3", "B2"],
        "{third:?}"
    );
    let last = order(&p, p.devices.len() - 1);
    assert!(!last.iter().any(|x| x.starts_with('S')), "{last:?}");
    assert_eq!(&last[..6], ["F0", "B0", "U", "F1", "B1", "U"], "{last:?}");
}

/// A graph pipeline (inception_mini's branches on two stages), DAPPLE's replicated stages
/// (an all-reduce per micro-batch) and PipeDream's own planner.
#[test]
fn dag_replicas_and_the_pipedream_planner_equal_the_emulation() {
    // Stem; two inception branches side by side; the join and the rest: a diamond.
    let (_t, p) = case(
        "inception_mini",
        "stages:0..3;3..12;12..25;25..",
        "4",
        "16",
        "4",
    );
    let preds: Vec<usize> = p
        .devices
        .iter()
        .filter(|d| d.stage == 3)
        .flat_map(|d| {
            d.instructions.iter().filter_map(|i| match i {
                Instr::Recv { peer, .. } => Some(*peer),
                _ => None,
            })
        })
        .collect();
    assert!(preds.contains(&1) && preds.contains(&2), "{preds:?}");
    let (_t, p) = case("dlrm_tiny", "dapple", "8", "64", "8");
    let replicated = p.stages.iter().filter(|s| s.devices.len() > 1).count();
    assert!(replicated > 0, "dapple chose no replicated stage");
    // Each replicated stage all-reduces once per micro-batch.
    for d in &p.devices {
        if p.stages[d.stage].devices.len() > 1 && !p.stages[d.stage].params.is_empty() {
            let ars = d
                .instructions
                .iter()
                .filter(|i| matches!(i, Instr::AllReduce { .. }))
                .count();
            assert_eq!(ars as u64, p.micro_batches, "device {}", d.device);
        }
    }
    case("lstm_tiny", "pipedream", "4", "64", "8");
}

/// GPT-2's tied embedding (read by the first and the last stage): the last stage stashes it
/// for each micro-batch right after the steps the first stage ran before that micro-batch's
/// forward, so both read one version; with the stashes moved to its own forwards (its newer
/// version) the same program no longer equals the emulation (float64, so that nothing is
/// rounding).
#[test]
fn a_tied_parameter_has_one_version_per_micro_batch() {
    let (t, p) = case("gpt2_tiny", "straight", "4", "16", "2");
    let out = t.path().join("o");
    let last = p.devices.len() - 1;
    let o = out.to_str().expect("utf-8");
    let exact = pipec_ok(&["run", o, "--steps", "2", "--check", "--precision", "f64"]);
    assert!(exact.contains("check ok"), "{exact}");
    let mut moved = p.clone();
    let list = &mut moved.devices[last].instructions;
    let stashes: Vec<Instr> = list
        .iter()
        .filter(|i| matches!(i, Instr::Stash { .. }))
        .cloned()
        .collect();
    assert!(!stashes.is_empty(), "{:?}", order(&p, last));
    list.retain(|i| !matches!(i, Instr::Stash { .. }));
    let mut with: Vec<Instr> = Vec::new();
    for i in list.drain(..) {
        if let Instr::Compute {
            pass: PieceKind::Fwd,
            mb,
        } = &i
        {
            with.extend(
                stashes
                    .iter()
                    .filter(|s| matches!(s, Instr::Stash { mb: m, .. } if m == mb))
                    .cloned(),
            );
        }
        with.push(i);
    }
    *list = with;
    program::verify(&moved).expect("still a valid program");
    save(&out, &moved);
    let o = pipec(&["run", o, "--steps", "2", "--check", "--precision", "f64"]);
    let so = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(so.contains("check FAILED"), "{so}{}", stderr(&o));
}

/// Without the stash of one micro-batch that sees steps between its forward and backward, the
/// verifier refuses the program and names the parameter.
#[test]
fn the_verifier_refuses_a_backward_without_its_stash() {
    let (_t, p) = case("mlp4", "straight", "2", "8", "2");
    let mut q = p.clone();
    let list = &mut q.devices[0].instructions;
    let k = list
        .iter()
        .position(|i| matches!(i, Instr::Stash { mb: 1, .. }))
        .expect("a stash of micro-batch 1");
    list.remove(k);
    let e = program::verify(&q).expect_err("refused").to_string();
    assert!(
        e.contains("micro-batch 1") && e.contains("not stashed"),
        "{e}"
    );
    // A step moved after the next accumulation leaves two micro-batches' gradients summed.
    let mut q = p.clone();
    let list = &mut q.devices[0].instructions;
    let k = list
        .iter()
        .position(|i| matches!(i, Instr::Step))
        .expect("a step");
    let step = list.remove(k);
    let next = list[k..]
        .iter()
        .position(|i| matches!(i, Instr::Accumulate { .. }))
        .expect("a later accumulation");
    list.insert(k + next + 1, step);
    let e = program::verify(&q).expect_err("refused").to_string();
    assert!(e.contains("not stepped"), "{e}");
    // A stash moved after its micro-batch's forward would hold a later version than the
    // forward read.
    let mut q = p.clone();
    let list = &mut q.devices[0].instructions;
    let k = list
        .iter()
        .position(|i| matches!(i, Instr::Stash { mb: 2, .. }))
        .expect("a stash of micro-batch 2");
    let stash = list.remove(k);
    let f = list
        .iter()
        .position(|i| {
            matches!(
                i,
                Instr::Compute {
                    pass: PieceKind::Fwd,
                    mb: 2
                }
            )
        })
        .expect("the forward of micro-batch 2");
    list.insert(f + 1, stash);
    let e = program::verify(&q).expect_err("refused").to_string();
    assert!(
        e.contains("micro-batch 2 is stashed after its forward"),
        "{e}"
    );
}

/// A replica whose parameters get no gradient (none accumulated) still all-reduces and steps
/// after every micro-batch: its all-reduce of zeros opens the update, which the step closes.
/// Two all-reduces of one micro-batch with no step between them stay refused.
#[test]
fn an_update_without_gradients_opens_at_its_all_reduce() {
    let (_t, p) = case("dlrm_tiny", "dapple", "8", "64", "8");
    let d = p
        .devices
        .iter()
        .position(|d| {
            d.instructions
                .iter()
                .any(|i| matches!(i, Instr::AllReduce { .. }))
        })
        .expect("a replicated device");
    let mut q = p.clone();
    q.devices[d]
        .instructions
        .retain(|i| !matches!(i, Instr::Accumulate { .. }));
    program::verify(&q).expect("all-reduces of zeros open their updates");
    let list = &mut q.devices[d].instructions;
    let k = list
        .iter()
        .position(|i| matches!(i, Instr::Step))
        .expect("a step");
    list.remove(k);
    let e = program::verify(&q).expect_err("refused").to_string();
    assert!(e.contains("not stepped"), "{e}");
}

/// PipeDream's numerics are not synchronous training's (stale weights, an update per
/// micro-batch): the same model, data and steps end with other parameters under `1f1b`, and
/// the losses differ from the first step on.
#[test]
fn asynchronous_training_differs_from_synchronous() {
    let t = tempdir();
    let run = |schedule: &str| -> Vec<f64> {
        let out = t.path().join(schedule);
        compile(
            "mlp4.onnx",
            &out,
            &[
                "--cluster",
                "cpu",
                "--devices",
                "4",
                "--planner",
                "straight",
                "--batch",
                "16",
                "--micro-batch",
                "2",
                "--schedule",
                schedule,
            ],
        );
        let so = pipec_ok(&["run", out.to_str().expect("utf-8"), "--steps", "3"]);
        // `step N: loss X` lines.
        so.lines()
            .filter_map(|l| {
                l.split_once(": loss ")
                    .and_then(|x| x.1.trim().parse().ok())
            })
            .collect()
    };
    let (a, s) = (run("pipedream-async"), run("1f1b"));
    assert_eq!((a.len(), s.len()), (3, 3), "{a:?} {s:?}");
    // The first step's first micro-batch sees the same weights; later ones do not.
    assert!((a[0] - s[0]).abs() > 1e-6 * s[0].abs(), "{a:?} vs {s:?}");
    assert!(
        a[2] < s[2],
        "per-micro-batch updates descend faster here: {a:?} vs {s:?}"
    );
}

/// A stage whose replicas would take micro-batches in turn cannot update per micro-batch: the
/// error says why and what to change.
#[test]
fn replicas_that_take_turns_are_refused_with_the_reason() {
    let t = tempdir();
    let out = t.path().join("o");
    let o = pipec(&[
        "compile",
        common::model("mlp4.onnx").to_str().expect("utf-8"),
        "--cluster",
        "cpu",
        "--devices",
        "3",
        "--stages",
        "..3@2;3..",
        "--batch",
        "8",
        "--micro-batch",
        "1",
        "--schedule",
        "pipedream-async",
        "-o",
        out.to_str().expect("utf-8"),
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("in turn") && e.contains("divisible"), "{e}");
    assert!(!out.join("schedule.json").exists());
}

/// The planners keep to what the schedule can run: DAPPLE's replica counts divide the
/// micro-batch, given (8 CPU devices, where it otherwise replicates 3 or 5 ways) or its own
/// choice (4 Summit GPUs, where data parallelism at a micro-batch of 2 would be re-ranked).
#[test]
fn dapple_replicates_only_by_divisors_of_the_micro_batch() {
    for (model, cluster, devices, mb) in [
        ("mlp4", "cpu", "8", Some("8")),
        ("resnet18", "summit", "4", None),
    ] {
        let m = common::model(&format!("{model}.onnx"));
        let mut args = vec![
            "plan",
            m.to_str().expect("utf-8"),
            "--cluster",
            cluster,
            "--devices",
            devices,
            "--planner",
            "dapple",
            "--batch",
            "32",
            "--schedule",
            "pipedream-async",
            "--json",
        ];
        if let Some(mb) = mb {
            args.extend(["--micro-batch", mb]);
        }
        let v: serde_json::Value = serde_json::from_str(&pipec_ok(&args)).expect("json");
        let mb = v["micro_batch"].as_u64().expect("micro_batch");
        for st in v["stages"].as_array().expect("stages") {
            let r = st["devices"].as_array().expect("devices").len() as u64;
            assert_eq!(mb % r, 0, "{model}: micro-batch {mb}, {st}");
        }
    }
}

/// `--vertical-sync` (PipeDream §3.4): every stage reads, for each micro-batch, the version the
/// input stage's forward read, so the versions agree across devices (the verifier checks it,
/// and refuses weight stashing alone under that claim) and the program equals its emulation.
/// The flag without `pipedream-async` is refused.
#[test]
fn vertical_sync_reads_one_version_per_micro_batch() {
    let (t, vs) = case_with("mlp4", "straight", "4", "16", "2", &["--vertical-sync"]);
    assert!(vs.vertical_sync);
    let o = t.path().join("o");
    let exact = pipec_ok(&[
        "run",
        o.to_str().expect("utf-8"),
        "--steps",
        "2",
        "--check",
        "--precision",
        "f64",
    ]);
    assert!(exact.contains("check ok"), "{exact}");
    for d in &vs.devices {
        for ((_, mb), v) in program::read_versions(&vs, d) {
            let first = program::read_versions(&vs, &vs.devices[0]);
            let want = first.iter().find(|((_, m), _)| *m == mb).map(|x| *x.1);
            assert_eq!(Some(v), want, "device {} micro-batch {mb}", d.device);
        }
    }
    // Weight stashing alone: later stages read newer versions, which vertical sync forbids.
    let (_t, ws) = case("mlp4", "straight", "4", "16", "2");
    let mut claimed = ws.clone();
    claimed.vertical_sync = true;
    let e = program::verify(&claimed)
        .expect_err("versions differ")
        .to_string();
    assert!(e.contains("vertical sync"), "{e}");
    let o = pipec(&[
        "compile",
        common::model("mlp4.onnx").to_str().expect("utf-8"),
        "--cluster",
        "cpu",
        "--devices",
        "4",
        "--planner",
        "straight",
        "--batch",
        "16",
        "--vertical-sync",
        "-o",
        t.path().join("x").to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--vertical-sync"), "{}", stderr(&o));
}

/// The plan's memory under weight stashing is the program's: per stage, the planned peak is
/// within 2% of the replayed peak of its device, on GPT-2 (whose tied embedding the LM-head
/// stage stashes for every micro-batch, from its step that reaches the embedding stage's
/// version until its forward, the last reader there) and on mlp4 (whose first stage stashes
/// nothing: its backward computes no input gradient and never reads its weight); and under
/// `--vertical-sync`, where every stage but the input stage stashes all its trained parameters
/// for every micro-batch from the step that reaches the input stage's version.
#[test]
fn planned_memory_counts_the_stashes_the_program_holds() {
    for (model, devices, extra) in [
        ("gpt2_tiny", "8", None),
        ("gpt2_tiny", "4", None),
        ("mlp4", "4", None),
        ("gpt2_tiny", "8", Some("--vertical-sync")),
        ("inception_mini", "8", Some("--vertical-sync")),
    ] {
        let t = tempdir();
        let out = t.path().join("o");
        compile(
            &format!("{model}.onnx"),
            &out,
            &[
                "--cluster",
                "summit",
                "--devices",
                devices,
                "--planner",
                "straight",
                "--batch",
                "64",
                "--schedule",
                "pipedream-async",
            ]
            .into_iter()
            .chain(extra)
            .collect::<Vec<_>>(),
        );
        let o = out.to_str().expect("utf-8");
        let sim: serde_json::Value =
            serde_json::from_str(&pipec_ok(&["simulate", o, "--json"])).expect("json");
        let plan: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.join("plan.json")).expect("plan.json"),
        )
        .expect("json");
        let devs = sim["devices"].as_array().expect("devices");
        for (s, st) in plan["stages"]
            .as_array()
            .expect("stages")
            .iter()
            .enumerate()
        {
            let planned = st["peak_memory_bytes"].as_f64().expect("planned peak");
            let replayed = devs[s]["peak_memory_bytes"]
                .as_f64()
                .expect("replayed peak");
            assert!(
                (replayed / planned - 1.0).abs() < 0.02,
                "{model} on {devices} {extra:?}: stage {s} planned {planned} vs replayed {replayed}"
            );
        }
    }
}
