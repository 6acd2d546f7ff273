//! Interleaved 1F1B compiled and run (`--schedule interleaved-V`): each device runs its group's
//! chunks in Megatron-LM's order, switching with `stage` instructions; the programs train
//! exactly as single-device training does (`run --check`) on chains, a DAG with messages
//! between two chunks of one device, replicated groups and a tied embedding, and replay as
//! planned; a parameter two chunks of one device would both step is refused.

mod common;

use common::{check_and_replay, compile, pipec, stderr, tempdir};
use pipec_compiler::program::{DeviceProgram, Instr, PieceKind, Program};
use pipec_passes::sim::schedule::interleaved_order;
use std::path::Path;

fn load(out: &Path) -> Program {
    let text = std::fs::read_to_string(out.join("schedule.json")).expect("schedule.json");
    Program::from_json(&text, "schedule.json").expect("program")
}

/// A device's computes as `(forward, stage, mb)`, each in the stage its context says.
fn computes(d: &DeviceProgram) -> Vec<(bool, usize, usize)> {
    d.instructions
        .iter()
        .zip(d.stage_at())
        .filter_map(|(i, s)| match i {
            Instr::Compute { pass, mb } => Some((*pass == PieceKind::Fwd, s, *mb as usize)),
            _ => None,
        })
        .collect()
}

/// Compile `model` under `interleaved-V` with `flags`, check the layout and each device's order,
/// then train against one device and replay against the plan.
fn case(model: &str, v: usize, flags: &[&str]) -> Program {
    let t = tempdir();
    let out = t.path().join("o");
    let kind = format!("interleaved-{v}");
    let mut all = vec!["--schedule", kind.as_str()];
    all.extend_from_slice(flags);
    compile(&format!("{model}.onnx"), &out, &all);
    let p = load(&out);
    assert_eq!(p.schedule, kind);
    let groups = p.stages.len() / v;
    for d in &p.devices {
        let r = d.stage;
        assert!(
            r < groups,
            "{model}: device {} starts in stage {r}",
            d.device
        );
        let want: Vec<usize> = (1..v).map(|c| c * groups + r).collect();
        assert_eq!(d.chunks, want, "{model}: device {}", d.device);
        let order: Vec<(bool, usize, usize)> =
            interleaved_order(r, groups, v, p.micro_batches as usize)
                .into_iter()
                .map(|(f, c, mb)| (f, c * groups + r, mb))
                .collect();
        assert_eq!(computes(d), order, "{model}: device {}", d.device);
    }
    check_and_replay(&out, &format!("{model} {kind}"));
    p
}

#[test]
fn a_chain_with_a_tied_embedding_trains_like_one_device() {
    // gpt2_tiny: the embedding's table is read by the first chunk and the LM head (last chunk,
    // another group); 4 groups of 2 chunks.
    let p = case(
        "gpt2_tiny",
        2,
        &[
            "--cluster",
            "cpu",
            "--devices",
            "4",
            "--planner",
            "straight",
            "--batch",
            "8",
            "--micro-batch",
            "2",
            "--optimizer",
            "adam:lr=0.001",
        ],
    );
    assert_eq!(p.stages.len(), 8);
    assert!(p.devices[0]
        .instructions
        .iter()
        .any(|i| matches!(i, Instr::Stage { stage: 4 })));
}

#[test]
fn chunks_of_one_device_exchange_values_in_place() {
    // inception_mini's branches on 2 devices, 3 chunks each: values that skip a chunk go from
    // a device to itself.
    let p = case(
        "inception_mini",
        3,
        &[
            "--cluster",
            "cpu",
            "--devices",
            "2",
            "--planner",
            "straight",
            "--batch",
            "8",
            "--optimizer",
            "sgd:lr=0.01,momentum=0.9",
        ],
    );
    let to_self = p.devices.iter().any(|d| {
        d.instructions
            .iter()
            .any(|i| matches!(i, Instr::Send { peer, .. } if *peer == d.device))
    });
    assert!(to_self, "a message between two chunks of one device");
}

#[test]
fn replicated_groups_reduce_their_chunks_together() {
    // dlrm_tiny under DAPPLE on 4 devices: groups of replicas; each device all-reduces its
    // chunks' gradients in one collective, then steps each chunk.
    let p = case(
        "dlrm_tiny",
        2,
        &[
            "--cluster",
            "cpu",
            "--devices",
            "4",
            "--planner",
            "dapple",
            "--batch",
            "16",
            "--optimizer",
            "sgd:lr=0.05",
        ],
    );
    let replicated = p
        .devices
        .iter()
        .find(|d| p.stages[d.stage].devices.len() > 1);
    let d = replicated.expect("a replicated group");
    let ars = d
        .instructions
        .iter()
        .filter(|i| matches!(i, Instr::AllReduce { .. }))
        .count();
    let steps = d
        .instructions
        .iter()
        .filter(|i| matches!(i, Instr::Step))
        .count();
    assert_eq!(ars, 1, "device {}: one all-reduce", d.device);
    assert_eq!(
        steps,
        1 + d.chunks.len(),
        "device {}: a step per chunk",
        d.device
    );
}

#[test]
fn a_parameter_in_two_chunks_of_a_device_is_refused() {
    // DAPPLE's groups for gpt2_tiny put the embedding's table in two chunks of one group.
    let t = tempdir();
    let out = t.path().join("o");
    let m = common::model("gpt2_tiny.onnx");
    let o = pipec(&[
        "compile",
        m.to_str().unwrap(),
        "--cluster",
        "cpu",
        "--devices",
        "4",
        "--planner",
        "dapple",
        "--batch",
        "16",
        "--schedule",
        "interleaved-2",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is held by stages") && stderr(&o).contains("distinct parameters"),
        "{}",
        stderr(&o)
    );
    assert!(!out.exists());
}

#[test]
fn the_verifier_checks_the_chunks() {
    let t = tempdir();
    let out = t.path().join("o");
    compile(
        "gpt2_tiny.onnx",
        &out,
        &[
            "--schedule",
            "interleaved-2",
            "--cluster",
            "cpu",
            "--devices",
            "4",
            "--planner",
            "straight",
            "--batch",
            "8",
        ],
    );
    let p = load(&out);
    pipec_compiler::program::verify(&p).expect("as compiled");
    let refuse = |mutate: &dyn Fn(&mut Program), want: &str| {
        let mut q = p.clone();
        mutate(&mut q);
        let e = pipec_compiler::program::verify(&q)
            .expect_err(want)
            .to_string();
        assert!(e.contains(want), "want '{want}' in: {e}");
    };
    // A switch to a stage the device does not run.
    refuse(
        &|q| {
            for i in &mut q.devices[0].instructions {
                if let Instr::Stage { stage } = i {
                    *stage = 5;
                }
            }
        },
        "switches to stage 5, which the device does not run",
    );
    // Without its chunks, the device's list names a stage it does not run.
    refuse(
        &|q| q.devices[0].chunks.clear(),
        "which the device does not run",
    );
    // Its switches removed, a device runs every chunk's instructions in its first stage,
    // whose pieces read buffers the other chunk made.
    refuse(
        &|q| {
            q.devices[3]
                .instructions
                .retain(|i| !matches!(i, Instr::Stage { .. }));
        },
        "nothing on the device produces it before",
    );
}
