//! Closed forms of pipeline schedules, checked against the simulator.

use pipec_passes::cost::cluster::{v100_16gb, Cluster};
use pipec_passes::cost::AllReduceAlgo;
use pipec_passes::sim::{schedule, simulate, ScheduleKind, StageGraph};

fn flat(n: usize, bw: f64) -> Cluster {
    Cluster::from_inline(&format!("{n}@{bw}"), v100_16gb()).expect("cluster")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// GPipe and 1F1B with S equal stages, M micro-batches and free communication both take
/// (M+S−1)(F+B); the bubble fraction is (S−1)/(M+S−1).
#[test]
fn gpipe_and_1f1b_iteration_time_and_bubble() {
    for &(s, m) in &[(1, 1), (1, 4), (2, 1), (4, 8), (4, 4), (3, 7), (8, 32), (5, 2)] {
        for &(f, b) in &[(1.0, 2.0), (0.3, 0.5), (1.0, 1.0)] {
            let sg = StageGraph::uniform_chain(s, f, b, 0.0);
            let c = flat(s, 1e9);
            for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::DappleB] {
                let sched = schedule::generate(&sg, kind, m);
                let r = simulate(&sg, &sched, &c, AllReduceAlgo::Ring).expect("sim");
                let want = (m + s - 1) as f64 * (f + b);
                assert!(
                    close(r.iteration_time_s, want),
                    "{kind:?} S={s} M={m} F={f} B={b}: {} != {want}",
                    r.iteration_time_s
                );
                let bubble = (s - 1) as f64 / (m + s - 1) as f64;
                assert!(
                    close(r.bubble_fraction, bubble),
                    "{kind:?} S={s} M={m}: bubble {} != {bubble}",
                    r.bubble_fraction
                );
            }
        }
    }
}

/// 1F1B keeps S−i micro-batches in flight on stage i (0-based); GPipe keeps M.
#[test]
fn in_flight_1f1b_vs_gpipe() {
    let (s, m) = (4, 8);
    let sg = StageGraph::uniform_chain(s, 1.0, 2.0, 0.0);
    let c = flat(s, 1e9);
    let r = simulate(&sg, &schedule::generate(&sg, ScheduleKind::OneFOneB, m), &c, AllReduceAlgo::Ring)
        .expect("sim");
    assert_eq!(r.stage_in_flight, vec![4, 3, 2, 1]);
    let r = simulate(&sg, &schedule::generate(&sg, ScheduleKind::GPipe, m), &c, AllReduceAlgo::Ring)
        .expect("sim");
    assert_eq!(r.stage_in_flight, vec![m; s]);
    // Memory follows: saved bytes are 1 per micro-batch in the fixture.
    assert_eq!(r.devices[0].peak_memory_bytes, m as f64);
}
