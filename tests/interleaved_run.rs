//! Schedules with several chunks per device compiled and run: interleaved 1F1B
//! (`--schedule interleaved-V`, Megatron-LM's order) and ZB-V (`--schedule zbv`, the V layout
//! with split backwards). Each device runs its group's chunks in the schedule's order,
//! switching with `stage` instructions; the programs train exactly as single-device training
//! does (`run --check`) on chains, a DAG with messages between two chunks of one device,
//! replicated groups and parameters two chunks of one device read (a tied embedding, an
//! unrolled LSTM's weights: stepped once, by the first chunk), and replay as planned.

mod common;

use common::{check_and_replay, compile, tempdir};
use pipec_compiler::program::{DeviceProgram, Instr, PieceKind, Program};
use pipec_passes::sim::schedule::{chunk_order, Pass};
use pipec_passes::sim::{takes_turns, ScheduleKind};
use std::path::Path;

fn load(out: &Path) -> Program {
    let text = std::fs::read_to_string(out.join("schedule.json")).expect("schedule.json");
    Program::from_json(&text, "schedule.json").expect("program")
}

/// A device's computes as `(pass, stage, mb)`, each in the stage its context says.
fn computes(d: &DeviceProgram) -> Vec<(Pass, usize, usize)> {
    d.instructions
        .iter()
        .zip(d.stage_at())
        .filter_map(|(i, s)| match i {
            Instr::Compute { pass, mb } => {
                let pass = match pass {
                    PieceKind::Fwd => Pass::Fwd,
                    PieceKind::BwdW => Pass::Wgt,
                    _ => Pass::Bwd,
                };
                Some((pass, s, *mb as usize))
            }
            _ => None,
        })
        .collect()
}

/// Compile `model` under `schedule` (`interleaved-V` or `zbv`) with `flags`, check the layout
/// and each device's order, then train against one device and replay against the plan.
fn case(model: &str, schedule: &str, flags: &[&str]) -> Program {
    let t = tempdir();
    let out = t.path().join("o");
    let mut all = vec!["--schedule", schedule];
    all.extend_from_slice(flags);
    compile(&format!("{model}.onnx"), &out, &all);
    let p = load(&out);
    assert_eq!(p.schedule, schedule);
    let kind = ScheduleKind::parse(schedule).expect("schedule");
    let v = kind.chunks();
    let groups = p.stages.len() / v;
    for d in &p.devices {
        let r = d.stage;
        assert!(
            r < groups,
            "{model}: device {} starts in stage {r}",
            d.device
        );
        let want: Vec<usize> = (1..v).map(|c| kind.chunk_stage(c, r, groups)).collect();
        assert_eq!(d.chunks, want, "{model}: device {}", d.device);
        // The schedule's order; a stage whose backward does not split runs it whole, one with
        // nothing to differentiate runs none.
        let order: Vec<(Pass, usize, usize)> =
            chunk_order(kind, r, groups, p.micro_batches as usize)
                .into_iter()
                .map(|(pass, c, mb)| (pass, kind.chunk_stage(c, r, groups), mb))
                .filter(|&(pass, s, _)| match pass {
                    Pass::Fwd => true,
                    Pass::Bwd => p.stages[s].bwd.is_some(),
                    Pass::Wgt => p.stages[s].bwd_w.is_some(),
                })
                // Replicas that cannot split a micro-batch take whole ones in turn.
                .filter(|&(_, s, mb)| {
                    let reps = p.stages[s].devices.len();
                    !takes_turns(p.micro_batch as f64, reps) || mb % reps == d.replica
                })
                .collect();
        assert_eq!(computes(d), order, "{model}: device {}", d.device);
    }
    check_and_replay(&out, &format!("{model} {schedule}"));
    p
}

/// The parameter `name` is read by stages `a` and `b` (sharing their devices) and updated by
/// the step of `a` alone.
fn stepped_once(p: &Program, name: &str, (a, b): (usize, usize)) {
    for s in [a, b] {
        assert!(
            p.stages[s].params.iter().any(|q| q == name),
            "stage {s} reads '{name}'"
        );
    }
    assert_eq!(p.stages[a].devices, p.stages[b].devices);
    assert!(
        p.stages[a].updated().contains(name),
        "stage {a} steps '{name}'"
    );
    assert!(
        !p.stages[b].updated().contains(name),
        "stage {b} leaves '{name}'"
    );
}

#[test]
fn a_chain_with_a_tied_embedding_trains_like_one_device() {
    // gpt2_tiny: the embedding's table is read by the first chunk and the LM head (last chunk,
    // another group); 4 groups of 2 chunks.
    let p = case(
        "gpt2_tiny",
        "interleaved-2",
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
        "interleaved-3",
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
        "interleaved-2",
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
fn a_parameter_two_chunks_of_a_device_read_is_stepped_once() {
    // DAPPLE's groups for gpt2_tiny put the embedding's table in two chunks of one group: both
    // accumulate into the device's one gradient, the first chunk's step updates it (Adam: one
    // moment pair).
    let p = case(
        "gpt2_tiny",
        "interleaved-2",
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
            "adam:lr=0.001",
        ],
    );
    let wte = "transformer.wte.weight";
    let holders: Vec<usize> = (0..p.stages.len())
        .filter(|&s| p.stages[s].params.iter().any(|q| q == wte))
        .collect();
    assert_eq!(holders.len(), 2, "{holders:?}");
    stepped_once(&p, wte, (holders[0], holders[1]));
}

#[test]
fn zbv_runs_the_v_with_the_loss_beside_the_input() {
    // gpt2_tiny on 4 devices: stage s < 4 on device s, stage s ≥ 4 on device 7 − s, so device 0
    // holds the input (stage 0) and the loss (stage 7); backwards split into B and W, a message
    // from stage 3 to stage 4 stays on device 3.
    let p = case(
        "gpt2_tiny",
        "zbv",
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
            "1",
            "--optimizer",
            "adam:lr=0.001",
        ],
    );
    assert_eq!(p.stages.len(), 8);
    assert_eq!(p.devices[0].chunks, vec![7]);
    assert_eq!(p.devices[3].chunks, vec![4]);
    assert!(p.stages[7].loss.is_some(), "the loss in the last stage");
    assert!(
        p.stages.iter().any(|s| s.bwd_w.is_some()),
        "split backwards"
    );
    let d3 = &p.devices[3];
    assert!(d3
        .instructions
        .iter()
        .any(|i| matches!(i, Instr::Send { peer, .. } if *peer == 3)));
}

#[test]
fn zbv_on_a_dag_and_on_replicated_groups() {
    // inception_mini's branches, and dlrm_tiny's DAPPLE groups of replicas (one all-reduce per
    // device for both chunks), each trained against one device.
    case(
        "inception_mini",
        "zbv",
        &[
            "--cluster",
            "cpu",
            "--devices",
            "3",
            "--planner",
            "straight",
            "--batch",
            "8",
            "--optimizer",
            "sgd:lr=0.01,momentum=0.9",
        ],
    );
    let p = case(
        "dlrm_tiny",
        "zbv",
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
    assert!(p
        .devices
        .iter()
        .any(|d| p.stages[d.stage].devices.len() > 1));
}

#[test]
fn an_unrolled_lstm_in_two_chunks_of_a_device() {
    // lstm_tiny's unrolled time steps read one set of weights; BaPipe's groups under ZB-V put
    // two of them on one device.
    let p = case(
        "lstm_tiny",
        "zbv",
        &[
            "--cluster",
            "cpu",
            "--devices",
            "2",
            "--planner",
            "bapipe",
            "--batch",
            "16",
            "--optimizer",
            "sgd:lr=0.01,momentum=0.9",
        ],
    );
    let shared = p.stages.iter().enumerate().find_map(|(a, sa)| {
        p.stages.iter().enumerate().skip(a + 1).find_map(|(b, sb)| {
            (sa.devices == sb.devices)
                .then(|| sa.params.iter().find(|q| sb.params.contains(q)))
                .flatten()
                .map(|q| (q.clone(), a, b))
        })
    });
    let (q, a, b) = shared.expect("a parameter two chunks of a device read");
    stepped_once(&p, &q, (a, b));
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
