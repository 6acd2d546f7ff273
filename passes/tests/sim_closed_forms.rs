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
    for &(s, m) in &[
        (1, 1),
        (1, 4),
        (2, 1),
        (4, 8),
        (4, 4),
        (3, 7),
        (8, 32),
        (5, 2),
    ] {
        for &(f, b) in &[(1.0, 2.0), (0.3, 0.5), (1.0, 1.0)] {
            let sg = StageGraph::uniform_chain(s, f, b, 0.0);
            let c = flat(s, 1e9);
            for kind in [
                ScheduleKind::GPipe,
                ScheduleKind::OneFOneB,
                ScheduleKind::DappleB,
            ] {
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
    let r = simulate(
        &sg,
        &schedule::generate(&sg, ScheduleKind::OneFOneB, m),
        &c,
        AllReduceAlgo::Ring,
    )
    .expect("sim");
    assert_eq!(r.stage_in_flight, vec![4, 3, 2, 1]);
    let r = simulate(
        &sg,
        &schedule::generate(&sg, ScheduleKind::GPipe, m),
        &c,
        AllReduceAlgo::Ring,
    )
    .expect("sim");
    assert_eq!(r.stage_in_flight, vec![m; s]);
    // Memory follows: saved bytes are 1 per micro-batch in the fixture.
    assert_eq!(r.devices[0].peak_memory_bytes, m as f64);
}

/// BaPipe Table 2 (synchronous schedules on GPUs), N stages, M micro-batches, per-stage F and B,
/// and every send/receive of a micro-batch taking SR:
/// 1F1B-SNO: (M+N−1)(F+B) + (N+M−2−⌈(M−1)/N⌉)·2SR; 1F1B-SO: (M+N−1)(F+B) + (N−1)·2SR.
/// The table assumes communication is not the bottleneck (SR ≤ F); these cases respect that.
/// The paper's own check (N=4, M=32, F+B=3, SR=0.5) gives 131 and 108.
#[test]
fn bapipe_table2_sno_and_so() {
    for &(n, m) in &[
        (4usize, 32usize),
        (4, 8),
        (2, 4),
        (8, 64),
        (3, 5),
        (5, 17),
        (6, 6),
    ] {
        for &(f, b, sr) in &[
            (1.0, 2.0, 0.5),
            (1.0, 1.0, 0.25),
            (2.0, 3.0, 1.0),
            (1.0, 2.0, 1.0),
        ] {
            let sg = StageGraph::uniform_chain(n, f, b, sr * 1e9);
            let c = flat(n, 1e9);
            let ceil = (m - 1).div_ceil(n) as f64;
            let sno = (m + n - 1) as f64 * (f + b) + ((n + m - 2) as f64 - ceil) * 2.0 * sr;
            let so = (m + n - 1) as f64 * (f + b) + (n - 1) as f64 * 2.0 * sr;
            let run = |kind| {
                simulate(
                    &sg,
                    &schedule::generate(&sg, kind, m),
                    &c,
                    AllReduceAlgo::Ring,
                )
                .expect("sim")
            };
            let r = run(ScheduleKind::OneFOneB);
            assert!(
                close(r.iteration_time_s, sno),
                "SNO N={n} M={m} F={f} B={b} SR={sr}: {} != {sno}",
                r.iteration_time_s
            );
            let bubble = 1.0 - m as f64 * (f + b) / sno;
            assert!(
                close(r.bubble_fraction, bubble),
                "SNO bubble {} != {bubble}",
                r.bubble_fraction
            );
            let r = run(ScheduleKind::OneFOneBSo);
            assert!(
                close(r.iteration_time_s, so),
                "SO N={n} M={m} F={f} B={b} SR={sr}: {} != {so}",
                r.iteration_time_s
            );
            // Features memory: k(N−i+1)·a with k = 1 (SNO) and 2 (SO), i 1-based, capped by M.
            let want: Vec<usize> = (0..n).map(|i| (2 * (n - i)).min(m)).collect();
            assert_eq!(r.stage_in_flight, want, "SO in-flight N={n} M={m}");
        }
    }
}

/// GraphPipe: on a stage DAG the pipeline depth (stages on the longest path) plays the role of S.
/// A diamond 0 → {1, 2} → 3 has depth 3: with free communication the iteration takes
/// (M+3−1)(F+B), and 1F1B keeps depth-to-sink micro-batches in flight per stage
/// (GraphPipe App. A.1, default row: i_x = max_y i_y + b).
#[test]
fn graphpipe_dag_depth() {
    use pipec_passes::sim::StageEdge;
    let (f, b, m) = (1.0, 2.0, 6);
    let mut sg = StageGraph::uniform_chain(4, f, b, 0.0);
    let edges = vec![
        StageEdge::new(0, 1, 0.0),
        StageEdge::new(0, 2, 0.0),
        StageEdge::new(1, 3, 0.0),
        StageEdge::new(2, 3, 0.0),
    ];
    sg = StageGraph::new(sg.stages, edges);
    assert_eq!(sg.depth(), 3);
    assert_eq!(sg.depth_to_sink(), vec![3, 2, 2, 1]);
    let c = flat(4, 1e9);
    let r = simulate(
        &sg,
        &schedule::generate(&sg, ScheduleKind::Gpp, m),
        &c,
        AllReduceAlgo::Ring,
    )
    .expect("sim");
    assert!(
        close(r.iteration_time_s, (m + 2) as f64 * (f + b)),
        "{}",
        r.iteration_time_s
    );
    assert_eq!(r.stage_in_flight, vec![3, 2, 2, 1]);
    // The same stages linearized (SPP) take one stage longer.
    let chain = StageGraph::uniform_chain(4, f, b, 0.0);
    let r = simulate(
        &chain,
        &schedule::generate(&chain, ScheduleKind::OneFOneB, m),
        &c,
        AllReduceAlgo::Ring,
    )
    .expect("sim");
    assert!(close(r.iteration_time_s, (m + 3) as f64 * (f + b)));
}

/// DAPPLE warm-up policies: K_i = min(S−i, M) (A) and min(2(S−i)−1, M) (B), 0-based i.
#[test]
fn dapple_warmup_policies() {
    let sg = StageGraph::uniform_chain(4, 1.0, 1.0, 0.0);
    assert_eq!(
        schedule::generate(&sg, ScheduleKind::DappleA, 16).warmup,
        vec![4, 3, 2, 1]
    );
    assert_eq!(
        schedule::generate(&sg, ScheduleKind::DappleB, 16).warmup,
        vec![7, 5, 3, 1]
    );
    assert_eq!(
        schedule::generate(&sg, ScheduleKind::DappleB, 4).warmup,
        vec![4, 4, 3, 1]
    );
    assert_eq!(
        schedule::generate(&sg, ScheduleKind::GPipe, 5).warmup,
        vec![5; 4]
    );
    assert_eq!(
        schedule::generate(&sg, ScheduleKind::OneFOneBSo, 16).warmup,
        vec![8, 6, 4, 2]
    );
    // The F/B order: K forwards, then backward/forward pairs, then the drain.
    assert_eq!(
        schedule::fb_order(2, 4),
        vec![
            (true, 0),
            (true, 1),
            (false, 0),
            (true, 2),
            (false, 1),
            (true, 3),
            (false, 2),
            (false, 3)
        ]
    );
}

/// GPipe and 1F1B with re-computation (`gpipe-recompute`, `1f1b-recompute`): the backward re-runs
/// the forward, so S equal stages take (M+S−1)(2F+B) (GPipe §2.3), and only the stage inputs stay
/// in flight: GPipe's activation memory M·a becomes a + M·in (stage 0 keeps no input).
#[test]
fn recompute_time_and_memory() {
    for &(s, m) in &[(1, 1), (2, 1), (4, 8), (3, 7), (8, 32)] {
        for &(f, b) in &[(1.0, 2.0), (0.3, 0.5)] {
            let sg = StageGraph::uniform_chain(s, f, b, 0.0);
            let c = flat(s, 1e9);
            for kind in [
                ScheduleKind::GPipeRecompute,
                ScheduleKind::OneFOneBRecompute,
            ] {
                assert!(kind.recompute());
                assert_eq!(ScheduleKind::parse(kind.name()), Some(kind));
                let sched = schedule::generate(&sg, kind, m);
                let r = simulate(&sg, &sched, &c, AllReduceAlgo::Ring).expect("sim");
                let want = (m + s - 1) as f64 * (2.0 * f + b);
                assert!(
                    close(r.iteration_time_s, want),
                    "{kind:?} S={s} M={m}: {} != {want}",
                    r.iteration_time_s
                );
            }
        }
    }
    // Memory: saved bytes 1 per micro-batch, stage inputs 0.125 bytes (free, fast links).
    let (s, m) = (4, 8);
    let sg = StageGraph::uniform_chain(s, 1.0, 2.0, 0.125);
    let c = flat(s, 1e15);
    let run =
        |k| simulate(&sg, &schedule::generate(&sg, k, m), &c, AllReduceAlgo::Ring).expect("sim");
    let plain = run(ScheduleKind::GPipe);
    let rc = run(ScheduleKind::GPipeRecompute);
    for d in 0..s {
        assert_eq!(plain.devices[d].peak_memory_bytes, m as f64);
        let input = if d == 0 { 0.0 } else { 0.125 };
        let want = 1.0 + m as f64 * input;
        assert!(
            close(rc.devices[d].peak_memory_bytes, want),
            "device {d}: {} != {want}",
            rc.devices[d].peak_memory_bytes
        );
        assert!(rc.devices[d].peak_memory_bytes < plain.devices[d].peak_memory_bytes);
    }
    assert!(rc.iteration_time_s > plain.iteration_time_s);
}

/// PipeDream's 1F1B-RR: a 2-stage plan whose second stage (twice as slow per micro-batch) runs on
/// 2 replicas that take whole micro-batches round robin. PipeDream's model (optimizer stage time
/// `T_s / r_s`, §3.1) predicts one micro-batch per `max(T_0/1, T_1/2)`; the simulation reaches it
/// in steady state, replica k runs exactly the micro-batches m ≡ k (mod 2), and every replica of
/// the replicated stage keeps ⌈W/r⌉ = 1 micro-batch in flight (NOAM).
#[test]
fn pipedream_round_robin_throughput() {
    use pipec_passes::sim::{SimStage, StageEdge, TaskKind};
    let stage = |devices: Vec<usize>, f: f64, b: f64| SimStage {
        fwd_s: vec![f; devices.len()],
        bwd_s: vec![b; devices.len()],
        wgt_s: vec![0.0; devices.len()],
        step_s: vec![0.0; devices.len()],
        devices,
        parameter_bytes: 0.0,
        tied_bytes: 0.0,
        static_bytes: 0.0,
        saved_bytes: 1.0,
        weight_saved_bytes: 1.0,
        carried_bytes: 0.0,
        load_bytes: 0.0,
    };
    // T_0 = 3 on one device; T_1 = 6 per whole micro-batch on each of 2 replicas.
    let sg = StageGraph::new(
        vec![stage(vec![0], 1.0, 2.0), stage(vec![1, 2], 2.0, 4.0)],
        vec![StageEdge::new(0, 1, 0.0)],
    );
    let c = flat(3, 1e9);
    let predicted_period = f64::max(3.0 / 1.0, 6.0 / 2.0);
    for m in [8usize, 32, 64] {
        let sched = schedule::generate(&sg, ScheduleKind::OneFOneBRr, m);
        assert_eq!(sched.warmup, vec![3, 1]);
        let r = simulate(&sg, &sched, &c, AllReduceAlgo::Ring).expect("sim");
        // Fill and drain add one pass through the replicated stage: T = M·period + T_1.
        let want = m as f64 * predicted_period + 6.0;
        assert!(
            close(r.iteration_time_s, want),
            "M={m}: {} != {want}",
            r.iteration_time_s
        );
        assert_eq!(r.stage_in_flight, vec![3, 1]);
        for t in &r.tasks {
            if let TaskKind::Forward {
                stage: 1,
                mb,
                device,
            } = t.kind
            {
                assert_eq!(device, 1 + mb % 2, "micro-batch {mb} on device {device}");
            }
        }
    }
    // Throughput at M = 64 is within 10 % of PipeDream's prediction.
    let r = simulate(
        &sg,
        &schedule::generate(&sg, ScheduleKind::OneFOneBRr, 64),
        &c,
        AllReduceAlgo::Ring,
    )
    .expect("sim");
    let tput = 64.0 / r.iteration_time_s;
    assert!(tput >= 0.9 / predicted_period, "{tput}");
}

/// Devices sharing a host's cores (the oversubscribed `cpu` preset, processor sharing): on one
/// core the computing tasks share it and there is always one to run, so an iteration is the
/// whole work `S·M·(F+B)`; on two cores it lies between half the work (and the unshared
/// pipeline's time) and the whole work; with as many cores as devices nothing changes.
#[test]
fn shared_host_cores_serialize_compute() {
    let (s, m, f, b) = (4, 8, 1.0, 2.0);
    let sg = StageGraph::uniform_chain(s, f, b, 0.0);
    let sched = schedule::generate(&sg, ScheduleKind::OneFOneB, m);
    let run = |cores: Option<usize>| {
        let mut c = flat(s, 1e9);
        c.host_cores = cores;
        simulate(&sg, &sched, &c, AllReduceAlgo::Ring)
            .expect("sim")
            .iteration_time_s
    };
    let work = (s * m) as f64 * (f + b);
    let alone = run(None);
    assert!(close(alone, (m + s - 1) as f64 * (f + b)));
    assert!(close(run(Some(s)), alone), "as many cores as devices");
    assert!(
        close(run(Some(1)), work),
        "one core: {} != {work}",
        run(Some(1))
    );
    let two = run(Some(2));
    assert!(
        two >= (work / 2.0).max(alone) - 1e-9 && two <= work + 1e-9,
        "two cores: {two} outside [{}, {work}]",
        (work / 2.0).max(alone)
    );
    assert!(
        two > alone * (1.0 + 1e-6),
        "two cores must be slower than four"
    );
}

/// `host_slowdown`: one core busy computes at full speed (no slowdown with one shared core);
/// with two shared cores and every task slowed `s` when both are busy, a chain of stages whose
/// two halves run side by side takes longer, but never more than `s` times the unslowed run.
#[test]
fn host_slowdown_scales_busy_cores() {
    let (s, m, f, b) = (4, 8, 1.0, 2.0);
    let sg = StageGraph::uniform_chain(s, f, b, 0.0);
    let sched = schedule::generate(&sg, ScheduleKind::OneFOneB, m);
    let run = |cores: usize, slow: f64| {
        let mut c = flat(s, 1e9);
        c.host_cores = Some(cores);
        c.host_slowdown = slow;
        simulate(&sg, &sched, &c, AllReduceAlgo::Ring)
            .expect("sim")
            .iteration_time_s
    };
    let work = (s * m) as f64 * (f + b);
    assert!(close(run(1, 1.5), work), "one core is never slowed");
    let (base, slowed) = (run(2, 1.0), run(2, 1.5));
    assert!(
        slowed > base * (1.0 + 1e-6) && slowed <= 1.5 * base + 1e-9,
        "two cores: {slowed} not in ({base}, {}]",
        1.5 * base
    );
}

/// Pinned workers (`pipec run` pins device `d` to core `host_core_map(D, C)[d]` when `C` divides
/// `D`): a core is shared only by its own devices. Four independent stages of forward work
/// 2, 1, 1, 2 on two cores: the map `[0, 1, 1, 0]` puts both 2s on core 0, which finishes at 4
/// (processor sharing over both cores would finish at 3: the 1s at 2, then the 2s alone). With
/// six devices on four cores (no even split) all cores are shared: six unit tasks end at 1.5.
#[test]
fn pinned_devices_share_only_their_core() {
    use pipec_passes::sim::SimStage;
    let independent = |work: &[f64]| {
        let stages = work
            .iter()
            .enumerate()
            .map(|(i, &w)| SimStage {
                devices: vec![i],
                fwd_s: vec![w],
                bwd_s: vec![0.0],
                wgt_s: vec![0.0],
                step_s: vec![0.0],
                parameter_bytes: 0.0,
                tied_bytes: 0.0,
                static_bytes: 0.0,
                saved_bytes: 1.0,
                weight_saved_bytes: 1.0,
                carried_bytes: 0.0,
                load_bytes: 0.0,
            })
            .collect();
        StageGraph::new(stages, Vec::new())
    };
    let run = |work: &[f64], cores: usize| {
        let sg = independent(work);
        let mut c = flat(work.len(), 1e9);
        c.host_cores = Some(cores);
        simulate(
            &sg,
            &schedule::generate(&sg, ScheduleKind::OneFOneB, 1),
            &c,
            AllReduceAlgo::Ring,
        )
        .expect("sim")
        .iteration_time_s
    };
    let pinned = run(&[2.0, 1.0, 1.0, 2.0], 2);
    assert!(close(pinned, 4.0), "pinned: {pinned}");
    let spread = run(&[1.0; 6], 4);
    assert!(close(spread, 1.5), "six on four: {spread}");
}

/// A xorshift generator: `rnd(n)` is uniform-ish in `0..n`.
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

/// A random stage DAG of 2–6 stages in topological order: every stage but the last feeds a
/// later one, some feed two; each edge carries `bytes`. Returns `(stages, edges, successors)`.
fn random_dag(
    rnd: &mut impl FnMut(u64) -> u64,
    bytes: f64,
) -> (usize, Vec<pipec_passes::sim::StageEdge>, Vec<Vec<usize>>) {
    use pipec_passes::sim::StageEdge;
    let n = 2 + rnd(5) as usize;
    let mut edges = Vec::new();
    for s in 0..n - 1 {
        let t = s + 1 + rnd((n - s - 1) as u64) as usize;
        edges.push(StageEdge::new(s, t, bytes));
        let u = s + 1 + rnd((n - s - 1) as u64) as usize;
        if u != t && rnd(2) == 0 {
            edges.push(StageEdge::new(s, u, bytes));
        }
    }
    let succ = (0..n)
        .map(|s| edges.iter().filter(|e| e.src == s).map(|e| e.dst).collect())
        .collect();
    (n, edges, succ)
}

/// GraphPipe's kFkB (`kfkb-K`, §6): on random stage DAGs each stage's warm-up is its in-flight
/// count from Appendix A.1's table with uniform `k = K`, `b = 1` (sinks `K`, `+2` per edge by
/// row 8, `+1` for `K = 1` by row 7), capped at `M`; the simulator runs every such schedule to
/// the end (no deadlock) and finds exactly that many micro-batches in flight per stage. `kfkb-1`
/// is the default GPP schedule.
#[test]
fn kfkb_in_flight_follows_appendix_a1() {
    use pipec_passes::schedule_gpp::in_flight_samples;
    let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
    for _ in 0..40 {
        let (n, edges, succ) = random_dag(&mut rnd, 0.0);
        let sg = StageGraph::new(StageGraph::uniform_chain(n, 1.0, 2.0, 0.0).stages, edges);
        let c = flat(n, 1e9);
        for k in 1..=4u32 {
            let inf = in_flight_samples(&succ, &vec![1; n], &vec![u64::from(k); n]);
            for m in [1usize, 3, 8, 16] {
                let kind = ScheduleKind::Kfkb(k);
                assert_eq!(ScheduleKind::parse(&kind.label()), Some(kind));
                let sched = schedule::generate(&sg, kind, m);
                let want: Vec<usize> = inf.iter().map(|&i| (i as usize).clamp(1, m)).collect();
                assert_eq!(sched.warmup, want, "K={k} M={m} succ={succ:?}");
                if k == 1 {
                    assert_eq!(
                        sched.programs,
                        schedule::generate(&sg, ScheduleKind::Gpp, m).programs
                    );
                }
                let r = simulate(&sg, &sched, &c, AllReduceAlgo::Ring)
                    .unwrap_or_else(|e| panic!("K={k} M={m} succ={succ:?}: {e}"));
                assert_eq!(r.stage_in_flight, want, "K={k} M={m} succ={succ:?}");
            }
        }
    }
    // The kFkB order: K forwards of warm-up, then K backwards / K forwards in turn, then drain.
    let f = |x| (true, x);
    let b = |x| (false, x);
    assert_eq!(
        schedule::fb_order_grouped(4, 2, 7),
        vec![
            f(0),
            f(1),
            f(2),
            f(3),
            b(0),
            b(1),
            f(4),
            f(5),
            b(2),
            b(3),
            f(6),
            b(4),
            b(5),
            b(6)
        ]
    );
}

/// GraphPipe's per-stage micro-batch sizes and `k_sFk_sB` (`gpp-per-stage`, §6, Figure 5): on
/// random stage DAGs with random sizes `b_s` and groups `k_s` (some chosen by the paper's
/// `argmin_k ComputeInFlight`), every stage runs `B / b_s` micro-batches, its warm-up is
/// `⌈i_s / b_s⌉` of Appendix A.1's in-flight samples, the schedule runs to the end (no
/// deadlock) with exactly that many micro-batches in flight per stage, every backward after its
/// forward. Every sample crosses every edge exactly once per direction.
#[test]
fn per_stage_micro_batches_follow_appendix_a1() {
    use pipec_passes::schedule_gpp::{choose_k, in_flight_samples, reverse_topo};
    use pipec_passes::sim::{Dir, Instr, PerStage};
    let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
    let batch = 16u64;
    for case in 0..200 {
        let (n, edges, succ) = random_dag(&mut rnd, 8.0);
        let b: Vec<u64> = (0..n).map(|_| 1 << rnd(4)).collect();
        let mut k = vec![1u64; n];
        let by_argmin = case % 2 == 0;
        let mut inf = vec![0u64; n];
        for &x in &reverse_topo(&succ) {
            k[x] = if by_argmin {
                let ss: Vec<(u64, u64, u64)> =
                    succ[x].iter().map(|&y| (k[y], b[y], inf[y])).collect();
                choose_k(b[x], &ss, &[1, 2, 4])
            } else {
                1 << rnd(3)
            };
            inf = in_flight_samples(&succ, &b, &k);
        }
        let mut sg = StageGraph::new(StageGraph::uniform_chain(n, 1.0, 2.0, 0.0).stages, edges);
        sg.per_stage = Some(PerStage {
            batch,
            base_micro_batch: 1,
            micro_batch: b.clone(),
            group: k.clone(),
        });
        let sched = schedule::generate(&sg, ScheduleKind::GppPerStage, batch as usize);
        let ms: Vec<usize> = b.iter().map(|&x| (batch / x) as usize).collect();
        assert_eq!(sched.stage_micro_batches, ms);
        let want: Vec<usize> = (0..n)
            .map(|s| (inf[s].div_ceil(b[s]) as usize).clamp(1, ms[s]))
            .collect();
        assert_eq!(sched.warmup, want);
        // Every edge carries each of the B samples once forward and once backward.
        for dir in [Dir::Act, Dir::Grad] {
            let sent: f64 = sched
                .programs
                .iter()
                .flatten()
                .map(|i| match i {
                    Instr::Send { dir: d, bytes, .. } if *d == dir => *bytes,
                    _ => 0.0,
                })
                .sum();
            assert_eq!(sent, 8.0 * batch as f64 * sg.edges.len() as f64);
        }
        let r = simulate(&sg, &sched, &flat(n, 1e9), AllReduceAlgo::Ring)
            .unwrap_or_else(|e| panic!("b={b:?} k={k:?} succ={succ:?}: {e}"));
        assert_eq!(r.stage_in_flight, want, "b={b:?} k={k:?} succ={succ:?}");
        // C4: every backward after its forward.
        for prog in &sched.programs {
            let mut fwd = std::collections::HashSet::new();
            for i in prog {
                match i {
                    Instr::Forward { mb, .. } => {
                        fwd.insert(*mb);
                    }
                    Instr::Backward { mb, .. } => assert!(fwd.contains(mb)),
                    _ => {}
                }
            }
        }
    }
}

/// `s` equal stages of forward `f`, backward `b + w` of which `w` is weight gradients, with
/// parameters (a byte: their accumulations take picoseconds) so that the zero-bubble
/// schedules split every backward that sends input gradients.
fn split_chain(s: usize, f: f64, b: f64, w: f64) -> StageGraph {
    let mut sg = StageGraph::uniform_chain(s, f, b + w, 0.0);
    for st in &mut sg.stages {
        st.wgt_s = vec![w];
        st.parameter_bytes = 1.0;
    }
    sg
}

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, §3.1) on S equal stages with
/// the backward split into `B` (input gradients) and `W` (weight gradients), M ≥ S micro-batches
/// and free communication: for `W ≤ F` the iteration takes the paper's `M(F+B+W) + (S−1)(F+B−W)`
/// where 1F1B takes `(M+S−1)(F+B+W)` (for `F = B = W`, a third of 1F1B's bubble); for `W > F`
/// the last stage's deferred `W`s outlast the forwards they stand in for, `(S−1)(W−F)` more, so
/// in general `M(F+B+W) + (S−1)(max(F,W)+B−W)`. Every stage keeps at most S micro-batches in
/// flight, 1F1B's first-stage count (its peak memory).
#[test]
fn zb_h1_bubble_and_in_flight() {
    for &(s, m) in &[(2, 2), (4, 4), (4, 8), (3, 7), (8, 32), (5, 5)] {
        for &(f, b, w) in &[
            (1.0, 1.0, 1.0),
            (1.0, 0.6, 0.4),
            (2.0, 1.0, 0.5),
            (0.5, 1.0, 0.8),
        ] {
            let sg = split_chain(s, f, b, w);
            let c = flat(s, 1e9);
            let zb = simulate(
                &sg,
                &schedule::generate(&sg, ScheduleKind::ZbH1, m),
                &c,
                AllReduceAlgo::Ring,
            )
            .expect("sim");
            let want = m as f64 * (f + b + w) + (s - 1) as f64 * (f.max(w) + b - w);
            assert!(
                close(zb.iteration_time_s, want),
                "ZB-H1 S={s} M={m} F={f} B={b} W={w}: {} != {want}",
                zb.iteration_time_s
            );
            let one = simulate(
                &sg,
                &schedule::generate(&sg, ScheduleKind::OneFOneB, m),
                &c,
                AllReduceAlgo::Ring,
            )
            .expect("sim");
            assert!(close(
                one.iteration_time_s,
                (m + s - 1) as f64 * (f + b + w)
            ));
            assert!(
                zb.stage_in_flight.iter().all(|&k| k <= s),
                "S={s} M={m}: {:?}",
                zb.stage_in_flight
            );
            assert_eq!(zb.stage_in_flight[0], s.min(m));
        }
    }
}

/// ZB-H2 (Qi et al. 2023, §3.1) on S equal stages, M ≥ 2S − 1 micro-batches, free
/// communication: warm-up `2·depth − 1` and `W` lagging `2·(S − 1 − i)` backwards make every
/// stage's busy span one unbroken run from its first forward, so the iteration takes
/// `M(F+B+W) + (S−1)F`, the least any schedule ending in a flush can take (the last stage starts
/// after `S − 1` forwards), for any `F`, `B`, `W`; never more than ZB-H1, and less wherever
/// ZB-H1's bubble `(S−1)(max(F,W)+B−W)` exceeds `(S−1)F`. Every stage holds `2S − 1`
/// micro-batches (the paper's `(2p − 1)·M_B`).
#[test]
fn zb_h2_bubble_and_in_flight() {
    for &(s, m) in &[
        (2, 3),
        (2, 4),
        (3, 5),
        (4, 7),
        (4, 8),
        (4, 16),
        (5, 9),
        (8, 32),
    ] {
        for &(f, b, w) in &[
            (1.0, 1.0, 1.0),
            (1.0, 0.6, 0.4),
            (2.0, 1.0, 0.5),
            (0.5, 1.0, 0.8),
            (1.0, 1.0, 2.0),
        ] {
            let sg = split_chain(s, f, b, w);
            let c = flat(s, 1e9);
            let run = |k| {
                simulate(&sg, &schedule::generate(&sg, k, m), &c, AllReduceAlgo::Ring).expect("sim")
            };
            let (h1, h2) = (run(ScheduleKind::ZbH1), run(ScheduleKind::ZbH2));
            let want = m as f64 * (f + b + w) + (s - 1) as f64 * f;
            assert!(
                close(h2.iteration_time_s, want),
                "ZB-H2 S={s} M={m} F={f} B={b} W={w}: {} != {want}",
                h2.iteration_time_s
            );
            assert!(h2.iteration_time_s <= h1.iteration_time_s * (1.0 + 1e-12));
            assert_eq!(h2.stage_in_flight, vec![2 * s - 1; s], "S={s} M={m}");
        }
    }
}

/// PipeDream's asynchronous 1F1B (§3.3) on S equal stages with an optimizer step of `U` after
/// every backward, M micro-batches and free communication: the last stage cycles through
/// `F + B + U` from `(S−1)F` on, and only the first stage's last step trails the backwards
/// coming up, so an iteration takes `(M+S−1)(F+B) + M·U`, 1F1B's time plus every micro-batch's
/// update, where synchronous 1F1B (one step) takes `(M+S−1)(F+B) + U`; stage `i` keeps 1F1B's
/// `S−i` micro-batches in flight, and on every stage but the last each of them holds a stashed
/// copy of its weights in steady state (`S−i` copies besides the live weights, PipeDream's
/// one version per in-flight minibatch).
#[test]
fn pipedream_async_cycle_and_stashes() {
    for &(s, m) in &[(1, 4), (2, 2), (2, 5), (3, 7), (4, 8), (4, 16), (8, 32)] {
        for &(f, b, u) in &[(1.0, 2.0, 0.5), (1.0, 1.0, 0.0), (0.3, 0.5, 0.2)] {
            let mut sg = StageGraph::uniform_chain(s, f, b, 0.0);
            for st in &mut sg.stages {
                st.step_s = vec![u];
                // A byte: accumulations and stash copies take picoseconds.
                st.parameter_bytes = 1.0;
            }
            let c = flat(s, 1e9);
            let run = |k| {
                simulate(&sg, &schedule::generate(&sg, k, m), &c, AllReduceAlgo::Ring).expect("sim")
            };
            let (a, sync) = (
                run(ScheduleKind::PipeDreamAsync),
                run(ScheduleKind::OneFOneB),
            );
            let want = (m + s - 1) as f64 * (f + b) + m as f64 * u;
            assert!(
                (a.iteration_time_s - want).abs() <= 1e-6 * want,
                "S={s} M={m} F={f} B={b} U={u}: {} != {want}",
                a.iteration_time_s
            );
            let want_sync = (m + s - 1) as f64 * (f + b) + u;
            assert!(
                (sync.iteration_time_s - want_sync).abs() <= 1e-6 * want_sync,
                "1F1B S={s} M={m}: {} != {want_sync}",
                sync.iteration_time_s
            );
            let flight: Vec<usize> = (0..s).map(|i| (s - i).min(m)).collect();
            assert_eq!(a.stage_in_flight, flight, "S={s} M={m}");
            // The stashes ([`schedule::stashed`] on each stage's order): every micro-batch
            // but the first on a stage with more than one in flight, at most S−i at once.
            for i in 0..s {
                let k = ScheduleKind::PipeDreamAsync.warmup(s - i, m);
                let order = schedule::fb_order(k, m);
                let stashed = schedule::stashed(&order);
                let n = stashed.iter().filter(|&&x| x).count();
                assert_eq!(n, if k > 1 { m - 1 } else { 0 }, "S={s} M={m} stage {i}");
                let (mut held, mut most) = (0usize, 0usize);
                for &(fwd, mb) in &order {
                    if stashed[mb] {
                        if fwd {
                            held += 1;
                        } else {
                            held -= 1;
                        }
                    }
                    most = most.max(held);
                }
                let want = if k > 1 { k.min(m - 1) } else { 0 };
                assert_eq!(most, want, "S={s} M={m} stage {i}");
            }
        }
    }
}

/// Interleaved 1F1B (Narayanan et al., SC'21, §2.2): `P` device groups with `v` equal chunks
/// each (a chunk's forward `F/v`, backward `B/v`), `M` a multiple of `P` and free communication
/// take `M(F+B) + (P−1)(F+B)/v`, the 1F1B bubble `(P−1)(F+B)` shrunk `v` times. Device `r`
/// holds at most `min(2(P−r−1) + (v−1)P + 1, vM)` chunk-micro-batches of activations (its
/// warm-up and one more forward).
#[test]
fn interleaved_1f1b_bubble_shrinks_by_v() {
    for &(p, v, m) in &[
        (2usize, 2usize, 2usize),
        (2, 2, 4),
        (4, 2, 8),
        (4, 2, 4),
        (4, 3, 8),
        (3, 4, 9),
        (8, 2, 16),
        (4, 4, 32),
    ] {
        for &(f, b) in &[(1.0, 2.0), (0.3, 0.5)] {
            let mut sg = StageGraph::uniform_chain(p * v, f / v as f64, b / v as f64, 0.0);
            for (s, st) in sg.stages.iter_mut().enumerate() {
                st.devices = vec![s % p];
            }
            let c = flat(p, 1e9);
            let kind = ScheduleKind::Interleaved(v as u32);
            let sched = schedule::generate(&sg, kind, m);
            let r = simulate(&sg, &sched, &c, AllReduceAlgo::Ring).expect("sim");
            let want = m as f64 * (f + b) + (p - 1) as f64 * (f + b) / v as f64;
            assert!(
                close(r.iteration_time_s, want),
                "P={p} v={v} M={m} F={f} B={b}: {} != {want}",
                r.iteration_time_s
            );
            let bubble = 1.0 - m as f64 * (f + b) / want;
            assert!(
                close(r.bubble_fraction, bubble),
                "P={p} v={v} M={m}: bubble {} != {bubble}",
                r.bubble_fraction
            );
            for d in 0..p {
                let held = (2 * (p - d - 1) + (v - 1) * p + 1).min(v * m);
                assert_eq!(
                    r.devices[d].peak_memory_bytes, held as f64,
                    "P={p} v={v} M={m}: device {d}"
                );
            }
            // v = 1 is 1F1B: the same stages on one chunk per device.
            let one = StageGraph::uniform_chain(p, f, b, 0.0);
            let r1 = simulate(
                &one,
                &schedule::generate(&one, ScheduleKind::OneFOneB, m),
                &c,
                AllReduceAlgo::Ring,
            )
            .expect("sim");
            assert!(r.iteration_time_s < r1.iteration_time_s);
        }
    }
    // The layout is checked: a chunk off its group's devices is refused.
    let mut sg = StageGraph::uniform_chain(4, 1.0, 1.0, 0.0);
    for (s, st) in sg.stages.iter_mut().enumerate() {
        st.devices = vec![[0, 1, 1, 0][s]];
    }
    let e = schedule::interleaved_groups(&sg, ScheduleKind::Interleaved(2)).unwrap_err();
    assert!(
        e.contains("stage 2 must run on the devices of stage 0"),
        "{e}"
    );
}

/// ZB-V (Qi et al., ICLR 2024, §6): `P` device groups with two equal chunks each laid out as
/// a V (a chunk's forward `F`, input-gradient part `B`, weight-gradient part `W`: half a
/// stage's). Under the paper's assumption `F = B = W` and `M ≥ 2P − 1`, with free
/// communication, every device runs without a gap from its first forward to the flush: the
/// iteration takes `2M(F+B+W) + (P−1)F`, the least any schedule ending in a flush takes (the
/// last group cannot start before `P − 1` forwards have run; the paper's "zero bubble"), half
/// of ZB-H2's `(S−1)F` on `P` whole stages, where ZB-H1 on those stages leaves `(P−1)·2F`
/// and 1F1B `(P−1)·6F`. Its activation memory is 1F1B's: a group holds at most `2P` chunk
/// micro-batches (`P` whole-stage ones, 1F1B's first stage), exactly that once
/// `M ≥ 2P − 1`. For other times no schedule ending in a flush beats `2M(F+B+W) + (P−1)F`,
/// and the order still runs (any `M`, even below `2P − 1`).
#[test]
fn zbv_fills_the_v_at_1f1b_memory() {
    let v_chain = |p: usize, (f, b, w): (f64, f64, f64)| {
        let mut sg = split_chain(2 * p, f, b, w);
        for (s, st) in sg.stages.iter_mut().enumerate() {
            st.devices = vec![ScheduleKind::Zbv.group_of(s, p)];
            // A parameter too small to show beside the activations (it makes the backward
            // split).
            st.parameter_bytes = 1e-9;
        }
        sg
    };
    let run = |sg: &StageGraph, kind: ScheduleKind, m: usize| {
        let c = flat(
            sg.stages
                .iter()
                .flat_map(|s| s.devices.clone())
                .max()
                .unwrap_or(0)
                + 1,
            1e9,
        );
        simulate(
            sg,
            &schedule::generate(sg, kind, m),
            &c,
            AllReduceAlgo::Ring,
        )
        .expect("sim")
    };
    for &(p, m) in &[
        (2usize, 3usize),
        (2, 8),
        (3, 5),
        (3, 7),
        (4, 7),
        (4, 8),
        (4, 16),
        (6, 11),
        (8, 32),
    ] {
        for &f in &[1.0, 0.25] {
            let sg = v_chain(p, (f, f, f));
            let r = run(&sg, ScheduleKind::Zbv, m);
            let want = 2.0 * m as f64 * 3.0 * f + (p - 1) as f64 * f;
            assert!(
                close(r.iteration_time_s, want),
                "P={p} M={m} F=B=W={f}: {} != {want}",
                r.iteration_time_s
            );
            for d in &r.devices {
                assert!(
                    (d.peak_memory_bytes - (2 * p) as f64).abs() < 1e-6,
                    "P={p} M={m}: device peak {} != 2P",
                    d.peak_memory_bytes
                );
            }
            // The same work on P whole stages (2F, 2B, 2W): ZB-H1 and 1F1B leave more.
            let whole = split_chain(p, 2.0 * f, 2.0 * f, 2.0 * f);
            let h1 = run(&whole, ScheduleKind::ZbH1, m).iteration_time_s;
            let one = run(&whole, ScheduleKind::OneFOneB, m).iteration_time_s;
            assert!(
                close(h1, want + (p - 1) as f64 * f),
                "P={p} M={m}: ZB-H1 {h1}"
            );
            assert!(
                close(one, want + (p - 1) as f64 * 5.0 * f),
                "P={p} M={m}: 1F1B {one}"
            );
        }
    }
    // Other times, and fewer micro-batches than the V holds: the flush bound, 1F1B's memory.
    let mut rng = xorshift(5);
    for _ in 0..200 {
        let mut t = || 0.1 + rng(1000) as f64 / 400.0;
        let (f, b, w) = (t(), t(), t());
        let p = 2 + rng(5) as usize;
        let m = 1 + rng(5 * p as u64) as usize;
        let sg = v_chain(p, (f, b, w));
        let r = run(&sg, ScheduleKind::Zbv, m);
        let bound = 2.0 * m as f64 * (f + b + w) + (p - 1) as f64 * f;
        assert!(
            r.iteration_time_s >= bound - 1e-9,
            "P={p} M={m} F={f} B={b} W={w}: {} below {bound}",
            r.iteration_time_s
        );
        for d in &r.devices {
            assert!(d.peak_memory_bytes <= (2 * p) as f64 + 1e-6, "P={p} M={m}");
        }
    }
    // The V is checked: a second chunk off its group's devices is refused.
    let mut sg = StageGraph::uniform_chain(4, 1.0, 1.0, 0.0);
    for (s, st) in sg.stages.iter_mut().enumerate() {
        st.devices = vec![[0, 1, 0, 1][s]];
    }
    let e = schedule::interleaved_groups(&sg, ScheduleKind::Zbv).unwrap_err();
    assert!(
        e.contains("stage 2 must run on the devices of stage 1"),
        "{e}"
    );
}

/// Weight passes moved into idle slots (`sim::fill`, the zero-bubble schedules on stage DAGs):
/// on random stage DAGs with unequal stages, ZB-H1 and ZB-H2 with their `W`s moved are never
/// slower than with the kind's fixed lag and never hold more memory on any device, and on some
/// they are faster; on a chain of equal stages, where the fixed lag already fills every bubble,
/// nothing moves.
#[test]
fn weight_passes_fill_idle_slots_on_dags() {
    use pipec_passes::sim::fill::fill_weight_gaps;
    let mut rnd = xorshift(23);
    let mut faster = 0;
    for _ in 0..60 {
        let (n, edges, _) = random_dag(&mut rnd, 0.0);
        let mut stages = split_chain(n, 1.0, 1.0, 1.0).stages;
        for st in &mut stages {
            let f = 0.2 + rnd(100) as f64 / 50.0;
            let (b, w) = (0.2 + rnd(100) as f64 / 50.0, 0.2 + rnd(100) as f64 / 50.0);
            st.fwd_s = vec![f];
            st.bwd_s = vec![b + w];
            st.wgt_s = vec![w];
        }
        let sg = StageGraph::new(stages, edges);
        let c = flat(n, 1e9);
        for kind in [ScheduleKind::ZbH1, ScheduleKind::ZbH2] {
            let m = 1 + rnd(12) as usize;
            let sched = schedule::generate(&sg, kind, m);
            let fixed = simulate(&sg, &sched, &c, AllReduceAlgo::Ring).expect("sim");
            let (moved, r) = fill_weight_gaps(&sg, sched, &c, AllReduceAlgo::Ring).expect("fill");
            assert!(r.iteration_time_s <= fixed.iteration_time_s, "{kind} M={m}");
            for (a, b) in r.devices.iter().zip(&fixed.devices) {
                assert!(
                    a.peak_memory_bytes <= b.peak_memory_bytes + 1e-9,
                    "{kind} M={m}"
                );
            }
            // Every pass is still there, once.
            for (p, q) in moved
                .programs
                .iter()
                .zip(&schedule::generate(&sg, kind, m).programs)
            {
                assert_eq!(p.len(), q.len());
            }
            if r.iteration_time_s < fixed.iteration_time_s * (1.0 - 1e-9) {
                faster += 1;
            }
        }
    }
    assert!(faster > 0, "no DAG had a weight pass to move");
    let sg = split_chain(4, 1.0, 1.0, 1.0);
    let c = flat(4, 1e9);
    let sched = schedule::generate(&sg, ScheduleKind::ZbH1, 8);
    let (moved, _) = fill_weight_gaps(&sg, sched.clone(), &c, AllReduceAlgo::Ring).expect("fill");
    assert_eq!(moved.programs, sched.programs);
}
