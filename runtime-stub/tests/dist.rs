//! The distributed runtime (`pipec_runtime::dist`) on hand-built programs
//! (`dist::fixtures`): numerics against a single-device computation, replicas with all-reduce,
//! failure handling (missing file, executor error, deadlock, timeout) and the collectives.

use ndarray::{Array2, ArrayD, Ix2, IxDyn};
use pipec_compiler::program::{Instr, Program};
use pipec_runtime::dist::fixtures::{write_linear, LinearSpec};
use pipec_runtime::dist::{self, inproc, Collectives, Endpoint, LoadOptions, Ring, RunOptions};
use pipec_runtime::Tensor;
use std::path::Path;
use std::time::{Duration, Instant};

fn f64_2d(t: &Tensor) -> Array2<f64> {
    t.to_f64().into_dimensionality::<Ix2>().unwrap()
}

fn opts(steps: usize) -> RunOptions {
    RunOptions {
        steps,
        seed: 7,
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

#[test]
fn two_stages_match_a_hand_computed_step() {
    let dir = tempfile::tempdir().unwrap();
    let spec = LinearSpec::default();
    write_linear(dir.path(), &spec).unwrap();
    let lp = dist::load(dir.path()).unwrap();
    let r = dist::run(&lp, &opts(1)).unwrap();
    // One SGD step by hand, in f64 on the whole batch (the loss is a plain sum, so the sum of
    // the micro-batch gradients is the full-batch gradient).
    let x = f64_2d(&r.data["x"]);
    let w1 = f64_2d(&lp.weights["W1"]);
    let w2 = f64_2d(&lp.weights["W2"]);
    let h = x.dot(&w1);
    let y = h.dot(&w2);
    let loss: f64 = y.iter().map(|v| v * v).sum();
    let dy = &y * 2.0;
    let gw2 = h.t().dot(&dy);
    let gw1 = x.t().dot(&dy.dot(&w2.t()));
    let lr = spec.lr as f64;
    let want1 = &w1 - &(gw1 * lr);
    let want2 = &w2 - &(gw2 * lr);
    assert!(
        (r.losses[0] - loss).abs() <= 1e-5 * loss.abs(),
        "{} vs {loss}",
        r.losses[0]
    );
    let close = |a: &Array2<f64>, b: &Array2<f64>| {
        let d = (a - b).iter().fold(0f64, |m, v| m.max(v.abs()));
        assert!(d < 1e-5, "max diff {d}\n{a}\n{b}");
    };
    close(&f64_2d(&r.params["W1"]), &want1);
    close(&f64_2d(&r.params["W2"]), &want2);
    assert_eq!(r.timings.len(), 2);
}

#[test]
fn check_agrees_with_the_reference_over_several_steps() {
    let dir = tempfile::tempdir().unwrap();
    write_linear(
        dir.path(),
        &LinearSpec {
            momentum: true,
            micro_batches: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let lp = dist::load(dir.path()).unwrap();
    let r = dist::run(&lp, &opts(3)).unwrap();
    let rep = dist::check(&lp, &r).unwrap();
    assert!(rep.ok, "{rep:?}");
    assert!(rep.max_rel_diff < 1e-5, "{rep:?}");
    for (a, b) in r.losses.iter().zip(&rep.ref_losses) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
    }
    // Training makes progress on this quadratic.
    assert!(r.losses[2] < r.losses[0], "{:?}", r.losses);
}

#[test]
fn replicated_stage_with_slices_concat_and_all_reduce() {
    for replicas0 in [2, 3] {
        let dir = tempfile::tempdir().unwrap();
        write_linear(
            dir.path(),
            &LinearSpec {
                batch: 12,
                micro_batches: 2,
                replicas0,
                momentum: true,
                lr: 0.01,
            },
        )
        .unwrap();
        let lp = dist::load(dir.path()).unwrap();
        assert_eq!(lp.program.devices.len(), replicas0 + 1);
        let r = dist::run(&lp, &opts(2)).unwrap();
        let rep = dist::check(&lp, &r).unwrap();
        assert!(
            rep.ok && rep.max_rel_diff < 1e-5,
            "{replicas0} replicas: {rep:?}"
        );
    }
}

#[test]
fn a_missing_file_is_named_before_any_worker_starts() {
    let dir = tempfile::tempdir().unwrap();
    write_linear(dir.path(), &LinearSpec::default()).unwrap();
    std::fs::remove_file(dir.path().join("stages/s1.bwd.onnx")).unwrap();
    let e = dist::load(dir.path()).unwrap_err();
    assert!(matches!(e, dist::DistError::Input(_)), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("stages/s1.bwd.onnx") && e.contains("missing"),
        "{e}"
    );

    let e = dist::load(&dir.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn weights_without_a_parameter_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    write_linear(dir.path(), &LinearSpec::default()).unwrap();
    let w = pipec_runtime::dist::fixtures::initial_weights();
    pipec_runtime::npz::write(&dir.path().join("weights.npz"), &w[..1]).unwrap();
    let e = dist::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("'W2'") && e.contains("weights.npz"), "{e}");
}

#[test]
fn an_executor_error_stops_every_worker_quickly() {
    let dir = tempfile::tempdir().unwrap();
    write_linear(dir.path(), &LinearSpec::default()).unwrap();
    // W2 of the wrong shape: stage 1's forward fails on device 1 while device 0 waits for dh.
    let mut w = pipec_runtime::dist::fixtures::initial_weights();
    w[1].1 = Tensor::F32(ArrayD::zeros(IxDyn(&[5, 2])));
    pipec_runtime::npz::write(&dir.path().join("weights.npz"), &w).unwrap();
    let lp = dist::load(dir.path()).unwrap();
    let start = Instant::now();
    let e = dist::run(&lp, &opts(2)).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let e = e.to_string();
    assert!(
        e.starts_with("device 1 instruction 1 (compute fwd mb 0) in step 1:"),
        "{e}"
    );
    assert!(e.contains("W2"), "{e}");
}

fn edit_schedule(dir: &Path, f: impl FnOnce(&mut Program)) {
    let p = dir.join("schedule.json");
    let mut prog = Program::from_json(&std::fs::read_to_string(&p).unwrap(), "s").unwrap();
    f(&mut prog);
    std::fs::write(&p, prog.to_json()).unwrap();
}

#[test]
fn a_deadlocking_schedule_is_rejected_and_times_out_when_forced() {
    let dir = tempfile::tempdir().unwrap();
    write_linear(dir.path(), &LinearSpec::default()).unwrap();
    // Device 0 waits for dh of micro-batch 0 before sending h of micro-batch 0.
    edit_schedule(dir.path(), |p| {
        let l = &mut p.devices[0].instructions;
        let recv = l
            .iter()
            .position(|i| matches!(i, Instr::Recv { .. }))
            .unwrap();
        let r = l.remove(recv);
        l.insert(0, r);
    });
    let e = dist::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("deadlocks"), "{e}");
    assert!(e.contains("device 0 at instruction 0"), "{e}");

    let lp = dist::load_with(dir.path(), LoadOptions { verify: false }).unwrap();
    let start = Instant::now();
    let mut o = opts(1);
    o.timeout = Duration::from_millis(500);
    let e = dist::run(&lp, &o).unwrap_err().to_string();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(e.contains("timed out after 0.5 s"), "{e}");
    let dev0 = "device 0 instruction 0 (recv 'dh' mb 0 from device 1 (tag 2)) in step 1";
    let dev1 = "device 1 instruction 0 (recv 'h' mb 0 from device 0 (tag 1)) in step 1";
    assert!(e.starts_with(dev0) || e.starts_with(dev1), "{e}");
}

#[test]
fn given_inputs_are_checked_and_used() {
    let dir = tempfile::tempdir().unwrap();
    write_linear(dir.path(), &LinearSpec::default()).unwrap();
    let lp = dist::load(dir.path()).unwrap();
    let x = Tensor::F32(ArrayD::from_shape_fn(IxDyn(&[8, 4]), |i| {
        (i[0] * 4 + i[1]) as f32 * 0.1
    }));
    let mut o = opts(1);
    o.inputs = Some([("x".to_string(), x.clone())].into_iter().collect());
    let r = dist::run(&lp, &o).unwrap();
    assert_eq!(r.data["x"], x);
    o.inputs = Some(
        [("x".to_string(), Tensor::F32(ArrayD::zeros(IxDyn(&[4, 4]))))]
            .into_iter()
            .collect(),
    );
    let e = dist::run(&lp, &o).unwrap_err().to_string();
    assert!(
        e.contains("shape [4, 4]") && e.contains("global batch"),
        "{e}"
    );
}

#[test]
fn the_trace_has_one_event_per_instruction_and_device() {
    let dir = tempfile::tempdir().unwrap();
    let prog = write_linear(dir.path(), &LinearSpec::default()).unwrap();
    let lp = dist::load(dir.path()).unwrap();
    let mut o = opts(2);
    o.trace = true;
    let r = dist::run(&lp, &o).unwrap();
    let t = r.trace.unwrap();
    let n: usize = prog.devices.iter().map(|d| d.instructions.len()).sum();
    assert_eq!(t.events.len(), 2 * n);
    let j = t.to_json();
    let evs = j["traceEvents"].as_array().unwrap();
    assert!(evs
        .iter()
        .any(|e| e["pid"] == 1 && e["name"] == "compute bwd mb 1" && e["ph"] == "X"));
}

/// Ring all-reduce over `n` in-process devices of tensors with uneven sizes and two dtypes.
fn ring_case(n: usize) {
    let eps = inproc::endpoints(n);
    let input = |d: usize| -> Vec<Tensor> {
        vec![
            Tensor::F32(ArrayD::from_shape_fn(IxDyn(&[5]), |i| {
                (d * 10 + i[0]) as f32
            })),
            Tensor::F64(ArrayD::from_shape_fn(IxDyn(&[2, 3]), |i| {
                (d as f64 + 1.0) * (i[0] * 3 + i[1]) as f64
            })),
            Tensor::F32(ArrayD::from_shape_fn(IxDyn(&[7]), |i| {
                (d + i[0]) as f32 * 0.5
            })),
        ]
    };
    let group: Vec<usize> = (0..n).collect();
    let results: Vec<Vec<Tensor>> = std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .into_iter()
            .enumerate()
            .map(|(d, mut ep)| {
                let group = &group;
                s.spawn(move || {
                    let mut ts = input(d);
                    Ring.all_reduce_sum(&mut ep, group, 3, &mut ts, Duration::from_secs(10))
                        .unwrap();
                    ts
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for k in 0..3 {
        let mut want = input(0)[k].to_f64();
        for d in 1..n {
            want = want + input(d)[k].to_f64();
        }
        for r in &results {
            assert_eq!(r[k].to_f64(), want, "{n} devices, tensor {k}");
            assert_eq!(r[k].dtype(), input(0)[k].dtype());
        }
    }
}

#[test]
fn ring_all_reduce_of_3_and_4_devices_is_the_sum() {
    ring_case(3);
    ring_case(4);
    ring_case(1);
}

#[test]
fn all_reduce_of_a_non_member_is_an_error() {
    let mut eps = inproc::endpoints(3);
    let mut ts = vec![Tensor::F32(ArrayD::zeros(IxDyn(&[2])))];
    let e = Ring
        .all_reduce_sum(&mut eps[2], &[0, 1], 1, &mut ts, Duration::from_secs(1))
        .unwrap_err();
    assert!(e.to_string().contains("not a member"), "{e}");
    assert_eq!(eps[0].rank(), 0);
}
