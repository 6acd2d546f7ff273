//! Plans: the verifier, the `straight` and `dp` planners on real profiles, and simulator invariants.

use pipec_passes::cost::cluster::{v100_16gb, Cluster};
use pipec_passes::cost::profile::load_profile;
use pipec_passes::cost::{AllReduceAlgo, CostGraph};
use pipec_passes::plan::{Plan, PlanOptions, PlanReport, StageSpec};
use pipec_passes::planners::{
    by_name,
    straight::{comm_aware_partition, linear_partition},
};
use pipec_passes::sim::{schedule, simulate, trace, Instr, ScheduleKind, StageGraph};
use std::path::Path;

fn profile(name: &str, batch: f64) -> CostGraph {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../onnx-models/profiles")
        .join(name);
    load_profile(&p, batch).expect("profile").graph
}

fn pd_b(n: usize) -> Cluster {
    Cluster::preset("pipedream-b")
        .expect("preset")
        .take(n)
        .expect("take")
}

#[test]
fn straight_and_dp_on_vgg16() {
    let g = profile("vgg16.txt", 64.0);
    let c = pd_b(8);
    let opts = PlanOptions::new(64);
    for name in ["straight", "dp"] {
        let plan = by_name(name)
            .expect("planner")
            .plan(&g, &c, &opts)
            .expect("plan");
        plan.verify(&g, &c).expect("verifies");
        assert_eq!(plan.planner, name);
        assert_eq!(plan.devices(), 8);
        assert_eq!(plan.batch(), 64);
        assert_eq!(plan.micro_batch.size() * plan.micro_batches(), 64);
        assert!(plan.iteration_time_s > 0.0 && plan.iteration_time_s.is_finite());
        assert!(plan.peak_memory_bytes > 0);
        let nodes: usize = plan.stages.iter().map(|s| s.nodes.len()).sum();
        assert_eq!(nodes, g.len());
        let report = plan.report(&g);
        let json = serde_json::to_value(&report).expect("json");
        for k in [
            "planner",
            "devices",
            "batch",
            "micro_batch",
            "micro_batches",
            "schedule",
            "stages",
            "pipeline_depth",
            "iteration_time_s",
            "throughput_samples_per_s",
            "peak_memory_bytes",
            "search_time_s",
            "objective_s",
        ] {
            assert!(json.get(k).is_some(), "missing {k}");
        }
        for k in [
            "id",
            "nodes",
            "devices",
            "replicas",
            "predecessors",
            "in_flight",
            "compute_time_s",
            "peak_memory_bytes",
        ] {
            assert!(
                json["stages"][0].get(k).is_some(),
                "missing stage field {k}"
            );
        }
        assert_eq!(json["schedule"], plan.schedule.label());
        let mut bad = json.clone();
        bad["schedule"] = "1f2b".into();
        let e = serde_json::from_value::<PlanReport>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown schedule '1f2b'"), "{e}");
        let back: PlanReport = serde_json::from_value(json).expect("round trip");
        assert_eq!(back, report);
        // Read back against its graph, the report is the typed plan again.
        assert_eq!(back.resolve(&g, &c).expect("resolves"), plan);
    }
    let dp = by_name("dp")
        .expect("dp")
        .plan(&g, &c, &opts)
        .expect("plan");
    assert_eq!(dp.stages.len(), 1);
    assert_eq!(dp.stages[0].devices.len(), 8);
    assert_eq!(dp.pipeline_depth, 1);
    let st = by_name("straight")
        .expect("s")
        .plan(&g, &c, &opts)
        .expect("plan");
    assert_eq!(st.stages.len(), 8);
    assert_eq!(st.pipeline_depth, 8);
    assert!(st.stages.iter().all(|s| s.devices.len() == 1));
    // The input node is pinned to the first stage.
    let node1 = g.node_by_name("node1").expect("node1");
    assert!(st.stages[0].nodes.contains(&node1));
    // 1F1B: stage i holds S−i micro-batches; stage 0 is the input alone, which depends on no
    // parameter, so no gradient comes back to it and it holds none.
    assert_eq!(st.stages[0].nodes, vec![node1]);
    let fl: Vec<usize> = st.stages.iter().map(|s| s.in_flight).collect();
    assert_eq!(fl, vec![0, 7, 6, 5, 4, 3, 2, 1]);
    // DP on 10 Gbps: the 550 MB gradient ring all-reduce dominates (2·7/8·P/1.25e9 s).
    let ar = 2.0 * 7.0 / 8.0 * g.total_parameter_bytes() / 1.25e9;
    assert!(
        dp.iteration_time_s > ar && dp.iteration_time_s < ar + 0.7,
        "{}",
        dp.iteration_time_s
    );
}

#[test]
fn planners_on_every_profile() {
    for (f, pbs) in [
        ("resnet50.txt", 64.0),
        ("inception_v3.txt", 64.0),
        ("gnmt.txt", 64.0),
        ("vgg-19-pbs-32.txt", 32.0),
        ("gnmt-16-pbs-64.txt", 64.0),
    ] {
        let g = profile(f, pbs);
        let c = Cluster::preset("dapple-a").expect("a");
        for p in ["straight", "dp"] {
            let plan = by_name(p)
                .expect(p)
                .plan(&g, &c, &PlanOptions::new(pbs as u64))
                .expect(f);
            plan.verify(&g, &c)
                .unwrap_or_else(|e| panic!("{f} {p}: {e}"));
        }
    }
}

#[test]
fn verifier_rejects_broken_plans() {
    let g = profile("vgg16.txt", 64.0);
    let c = pd_b(4);
    let good = by_name("straight")
        .expect("s")
        .plan(&g, &c, &PlanOptions::new(64))
        .expect("plan");
    good.verify(&g, &c).expect("good");
    // The report's verifier (what `plan.json` says), and for a broken report that still
    // resolves to stages, the typed plan's verifier says the same.
    let report = good.report(&g);
    let check = |mutate: &dyn Fn(&mut PlanReport), what: &str| {
        let mut p = report.clone();
        mutate(&mut p);
        let e = p.verify(&g, &c).expect_err(what).to_string();
        assert!(e.contains(what), "want '{what}' in: {e}");
        if let Ok(specs) = p.specs(&g) {
            let mut typed = good.clone();
            for ((st, spec), r) in typed.stages.iter_mut().zip(specs).zip(&p.stages) {
                st.nodes = spec.nodes;
                st.devices = spec.devices;
                st.predecessors = r.predecessors.clone();
            }
            if p.stages.len() == typed.stages.len()
                && p.stages.iter().all(|s| s.replicas == s.devices.len())
            {
                let e = typed.verify(&g, &c).expect_err(what).to_string();
                assert!(e.contains(what), "typed: want '{what}' in: {e}");
            }
        }
    };
    check(
        &|p| {
            p.stages[1].nodes.pop();
        },
        "in no stage",
    );
    check(
        &|p| {
            let n = p.stages[0].nodes[0].clone();
            p.stages[1].nodes.push(n);
        },
        "in stages",
    );
    check(
        &|p| p.stages[1].devices = vec![0],
        "device 0 is in two stages",
    );
    check(&|p| p.stages[1].devices = vec![9], "device 9");
    check(&|p| p.stages[1].replicas = 3, "replicas");
    check(&|p| p.stages[2].predecessors = vec![0], "predecessors");
    check(&|p| p.stages[0].nodes.push("nope".into()), "unknown node");
    // A non-convex split: move the last stage's first node into stage 0 → cycle 0→1→…→0.
    check(
        &|p| {
            let n = p.stages[3].nodes.remove(0);
            p.stages[0].nodes.push(n);
        },
        "cycle",
    );
}

#[test]
fn linear_partition_is_min_max() {
    let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
    let runs = linear_partition(&w, 3);
    assert_eq!(runs.iter().sum::<usize>(), 9);
    let mut at = 0;
    let mut worst: f64 = 0.0;
    for r in &runs {
        worst = worst.max(w[at..at + r].iter().sum());
        at += r;
    }
    assert_eq!(worst, 17.0); // 1..5 | 6,7 | 8,9
    assert_eq!(linear_partition(&[1.0, 1.0], 5), vec![1, 1]);
    assert_eq!(linear_partition(&[0.0; 6], 3).len(), 3);
}

/// The plain `O(k · n²)` DP of the `straight` planner's module doc, every state and start.
fn comm_aware_reference(ch: &pipec_passes::cost::Chain, k: usize, bw: &[f64]) -> (Vec<usize>, f64) {
    let n = ch.len();
    let time = |s: usize, i: usize, j: usize| {
        let mut comm = 0.0;
        if s > 0 {
            comm += ch.cut[i] / bw[s - 1];
        }
        if s + 1 < k {
            comm += ch.cut[j] / bw[s];
        }
        ch.compute(i, j).max(comm)
    };
    let mut best = vec![vec![f64::INFINITY; n + 1]; k];
    let mut arg = vec![vec![0usize; n + 1]; k];
    for (j, b) in best[0].iter_mut().enumerate().take(n + 2 - k).skip(1) {
        *b = time(0, 0, j);
    }
    for s in 1..k {
        for j in s + 1..=n + 1 - (k - s) {
            for i in (s..j).rev() {
                let t = best[s - 1][i].max(time(s, i, j));
                if t <= best[s][j] {
                    best[s][j] = t;
                    arg[s][j] = i;
                }
            }
        }
    }
    let mut runs = vec![0usize; k];
    let mut j = n;
    for s in (0..k).rev() {
        let i = if s == 0 { 0 } else { arg[s][j] };
        runs[s] = j - i;
        j = i;
    }
    (runs, best[k - 1][n])
}

/// The `straight` planner's DP on the states a bisected bound leaves returns the plain DP's
/// runs and bottleneck (ties to the earliest start included) on random chains: compute-bound,
/// transfer-bound, with repeated weights (ties) and zero cuts.
#[test]
fn comm_aware_partition_matches_the_plain_dp() {
    let mut x: u64 = 0x2545f4914f6cdd1d;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for case in 0..300 {
        let n = 1 + next(60) as usize;
        let k = 1 + next(n.min(12) as u64) as usize;
        let (mut fwd, mut bwd, mut cut) = (vec![0.0], vec![0.0], vec![0.0]);
        for i in 0..n {
            // Few distinct values: many equal bottlenecks.
            let f = (1 + next(if case % 3 == 0 { 3 } else { 50 })) as f64 * 1e-3;
            fwd.push(fwd[i] + f);
            bwd.push(bwd[i] + 2.0 * f);
            let c = if i + 1 == n || next(4) == 0 {
                0.0
            } else {
                next(if case % 2 == 0 { 10 } else { 1000 }) as f64 * 1e-4
            };
            cut.push(c);
        }
        cut[n] = 0.0;
        let ch = pipec_passes::cost::Chain {
            order: (0..n).collect(),
            fwd,
            bwd,
            params: vec![0.0; n + 1],
            saved: vec![0.0; n + 1],
            cut,
        };
        let bw: Vec<f64> = (1..k)
            .map(|_| [1.0, 0.5, f64::INFINITY][next(3) as usize])
            .collect();
        let got = comm_aware_partition(&ch, k, &bw);
        let want = comm_aware_reference(&ch, k, &bw);
        assert_eq!(got, want, "case {case}: n {n}, k {k}");
    }
}

#[test]
fn replicated_stages_split_and_allreduce() {
    // 2 stages: 3 replicas then 2 replicas, split/concat traffic between them.
    let g = profile("vgg-19-pbs-32.txt", 32.0);
    let c = Cluster::preset("dapple-a").expect("a").take(5).expect("5");
    let order = g.topo_order().to_vec();
    let specs = vec![
        StageSpec {
            nodes: order[..13].to_vec(),
            devices: vec![0, 1, 2],
        },
        StageSpec {
            nodes: order[13..].to_vec(),
            devices: vec![3, 4],
        },
    ];
    let mut opts = PlanOptions::new(48);
    opts.allreduce = AllReduceAlgo::Ring;
    let plan = Plan::assemble(
        "test",
        &g,
        &c,
        &opts,
        specs.clone(),
        6,
        ScheduleKind::OneFOneB,
        0.0,
        0.0,
    )
    .expect("plan");
    plan.verify(&g, &c).expect("verifies");
    assert_eq!(plan.stages[1].predecessors, vec![0]);
    let sg = StageGraph::from_specs(&g, &c, &specs, 6.0, Default::default());
    let sched = schedule::generate(&sg, ScheduleKind::OneFOneB, 8);
    // Device 1 (middle replica of 3) sends to both replicas of stage 1 (2→3 split).
    let sends: Vec<usize> = sched.programs[1]
        .iter()
        .filter_map(|i| match i {
            Instr::Send { mb: 0, peer, .. } => Some(*peer),
            _ => None,
        })
        .collect();
    assert_eq!(sends, vec![3, 4]);
    assert!(sched.programs[0]
        .iter()
        .any(|i| matches!(i, Instr::AllReduce { .. })));
    let r = simulate(&sg, &sched, &c, AllReduceAlgo::Ring).expect("sim");
    // Simulator invariants: every compute task after its inputs; busy ≤ T; memory returns to static.
    assert!(r
        .devices
        .iter()
        .take(5)
        .all(|d| d.used && d.busy_s <= r.iteration_time_s + 1e-12));
    for d in 0..5 {
        let curve = &r.devices[d].memory_over_time;
        assert!((curve[0].1 - curve.last().expect("curve").1).abs() < 1e-3);
    }
    assert!(r.bubble_fraction > 0.0 && r.bubble_fraction < 1.0);
    let trace = trace::chrome_trace(&r);
    let n = trace["traceEvents"].as_array().expect("events").len();
    assert!(n > 2 * 8 * 5);
    // Deterministic.
    let r2 = simulate(&sg, &sched, &c, AllReduceAlgo::Ring).expect("sim");
    assert_eq!(
        serde_json::to_string(&trace).ok(),
        serde_json::to_string(&trace::chrome_trace(&r2)).ok()
    );
}

#[test]
fn contention_on_shared_links() {
    // Two transfers from one sender serialize on its send channel.
    let c = Cluster::from_inline("4@1e9", v100_16gb()).expect("c");
    let mut sg = StageGraph::uniform_chain(1, 1.0, 1.0, 0.0);
    sg.stages.push(sg.stages[0].clone());
    sg.stages.push(sg.stages[0].clone());
    sg.stages[1].devices = vec![1];
    sg.stages[2].devices = vec![2];
    let edges = vec![
        pipec_passes::sim::StageEdge::new(0, 1, 1e9),
        pipec_passes::sim::StageEdge::new(0, 2, 1e9),
    ];
    let sg = StageGraph::new(sg.stages, edges);
    let r = simulate(
        &sg,
        &schedule::generate(&sg, ScheduleKind::GPipe, 1),
        &c,
        AllReduceAlgo::Ring,
    )
    .expect("sim");
    // F0 (1) + two 1 s sends back to back (2) + F (1) + B (1) + grad back (1) + B0 (1) = 7.
    assert!(
        (r.iteration_time_s - 7.0).abs() < 1e-9,
        "{}",
        r.iteration_time_s
    );
}

/// The simulated peak memory of a 1F1B straight pipeline is its static memory plus (S−i)
/// micro-batches of saved activations (PipeDream §2.7: the input stage keeps NOAM of them)
/// plus, during every backward but the first, that micro-batch's own parameter gradients.
#[test]
fn simulated_memory_matches_the_model() {
    use pipec_passes::cost::memory::stage_memory;
    use pipec_passes::cost::Optimizer;
    let g = profile("resnet50.txt", 64.0);
    let c = pd_b(4);
    let mut opts = PlanOptions::new(64);
    opts.optimizer = Optimizer::Adam;
    opts.set_micro_batch(Some(8)).unwrap();
    let plan = by_name("straight")
        .expect("s")
        .plan(&g, &c, &opts)
        .expect("plan");
    let specs = plan.specs();
    for (i, (st, spec)) in plan.stages.iter().zip(&specs).enumerate() {
        let gc = g.group_cost(&g.mask(&spec.nodes), 8.0, c.kind_of(0));
        assert_eq!(st.in_flight, 4 - i);
        let want = stage_memory(
            gc.parameter_bytes,
            gc.saved_bytes,
            4 - i,
            gc.in_bytes + gc.out_bytes,
            Optimizer::Adam,
        );
        let got = st.peak_memory_bytes as f64;
        let want = want.total() + gc.parameter_bytes;
        assert!((got - want).abs() <= 1.0, "stage {i}: {got} vs {want}");
    }
}

#[test]
fn broken_schedules_are_errors_not_hangs() {
    let sg = StageGraph::uniform_chain(3, 1.0, 1.0, 1e6);
    let c = Cluster::from_inline("3@1e9", v100_16gb()).expect("c");
    let mut sched = schedule::generate(&sg, ScheduleKind::OneFOneB, 4);
    sched.programs[0].retain(|i| !matches!(i, Instr::Send { .. }));
    let e = simulate(&sg, &sched, &c, AllReduceAlgo::Ring)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no matching send"), "{e}");
    // Device 1 waits for a gradient of micro-batch 0 before it ever runs forward 0: a deadlock.
    let mut sched = schedule::generate(&sg, ScheduleKind::OneFOneB, 4);
    sched.programs[1].reverse();
    let e = simulate(&sg, &sched, &c, AllReduceAlgo::Ring)
        .unwrap_err()
        .to_string();
    assert!(e.contains("deadlock"), "{e}");
    // A stage on a device outside the cluster.
    let small = Cluster::from_inline("2@1e9", v100_16gb()).expect("c");
    let sched = schedule::generate(&sg, ScheduleKind::OneFOneB, 4);
    assert!(simulate(&sg, &sched, &small, AllReduceAlgo::Ring).is_err());
}

#[test]
fn heterogeneous_replicas_run_at_their_own_speed() {
    let toml = r#"
        [[device_kind]]
        name = "fast"
        memory_bytes = 8e10
        memory_bandwidth = 3e12
        peak_flops = { f32 = 60e12 }
        [[device_kind]]
        name = "slow"
        memory_bytes = 1.6e10
        memory_bandwidth = 9e11
        peak_flops = { f32 = 15e12 }
        [[level]]
        size = 1
        bandwidth = 1e11
        [[level]]
        size = 2
        bandwidth = 1e10
        [[node]]
        kind = "fast"
        [[node]]
        kind = "slow"
    "#;
    let c = Cluster::from_toml_str(toml, "het.toml").expect("cluster");
    use pipec_compiler::ir::{DType, Dim, Module, OpData, TensorData, TensorType};
    let mut m = Module::default();
    let gr = &mut m.graph;
    let x = gr.add_input(
        "x",
        TensorType::new(DType::F32, vec![Dim::Known(1024), Dim::Known(1024)]),
    );
    let w = gr.add_initializer(
        "w",
        TensorData::from_f32(vec![1024, 1024], &vec![0.0; 1 << 20]),
    );
    let op = OpData {
        name: "mm".into(),
        op_type: "MatMul".into(),
        inputs: vec![Some(x), Some(w)],
        ..Default::default()
    };
    gr.add_op(
        op,
        vec![("y".into(), TensorType::known(DType::F32, &[1024, 1024]))],
    );
    let g =
        pipec_passes::cost::analytic::from_module(&m, &Default::default(), "mm").expect("graph");
    let specs = vec![StageSpec {
        nodes: vec![0],
        devices: vec![0, 1],
    }];
    let sg = StageGraph::from_specs(&g, &c, &specs, 1024.0, Default::default());
    let st = &sg.stages[0];
    assert!(st.fwd_s[1] > 3.0 * st.fwd_s[0], "{:?}", st.fwd_s);
    let r = simulate(
        &sg,
        &schedule::generate(&sg, ScheduleKind::OneFOneB, 1),
        &c,
        AllReduceAlgo::Ring,
    )
    .expect("sim");
    // The fast device idles while the slow one computes; the all-reduce waits for both.
    assert!(r.devices[0].busy_s < r.devices[1].busy_s);
    assert!(r.iteration_time_s >= st.fwd_s[1] + st.bwd_s[1]);
}

#[test]
fn comm_aware_straight_partition() {
    use pipec_passes::planners::straight::comm_aware_partition;
    let g = profile("vgg16.txt", 64.0);
    let ch = g.chain(64.0, &v100_16gb());
    let w: Vec<f64> = (0..ch.len()).map(|i| ch.compute(i, i + 1)).collect();
    let bottleneck = |runs: &[usize]| {
        let mut at = 0;
        let mut worst: f64 = 0.0;
        for r in runs {
            worst = worst.max(ch.compute(at, at + r));
            at += r;
        }
        worst
    };
    // With free links it is the min-max linear partition.
    for k in [2, 4, 8] {
        let (runs, t) = comm_aware_partition(&ch, k, &vec![f64::INFINITY; k - 1]);
        assert_eq!(runs.len(), k);
        assert_eq!(runs.iter().sum::<usize>(), ch.len());
        assert!(runs.iter().all(|r| *r > 0));
        assert!(
            (t - bottleneck(&linear_partition(&w, k))).abs() < 1e-12,
            "k={k}"
        );
    }
    // On 10 Gbps the cuts move to small activations: no boundary costs more than the bottleneck.
    let bw = 1.25e9;
    let (runs, t) = comm_aware_partition(&ch, 4, &[bw; 3]);
    let mut at = 0;
    for r in &runs[..3] {
        at += r;
        assert!(ch.cut[at] / bw <= t + 1e-12);
    }
    assert!(t >= bottleneck(&runs) - 1e-12);
}
