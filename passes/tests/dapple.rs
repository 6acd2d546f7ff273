//! DAPPLE planner: Eq. 2 and Algorithm 1, the placement policies, and plans on the DAPPLE
//! profiles with the `dapple-a/b/c` presets.

use pipec_passes::cost::cluster::Cluster;
use pipec_passes::cost::profile::load_profile;
use pipec_passes::cost::{CostEdge, CostGraph, CostNode, Work};
use pipec_passes::plan::PlanOptions;
use pipec_passes::planners::by_name;
use pipec_passes::planners::dapple::{self, latency, pivot, place, LatStage, Policy};
use std::path::Path;

fn profile(name: &str, batch: f64) -> CostGraph {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../onnx-models/profiles")
        .join(name);
    load_profile(&p, batch).expect("profile").graph
}

fn st(f: f64, b: f64, ar: f64) -> LatStage {
    LatStage { f, b, ar }
}

/// A chain of measured layers: `(fwd ms, bwd ms, activation bytes, parameter bytes)`.
fn chain(layers: &[(f64, f64, f64, f64)]) -> CostGraph {
    let nodes = layers
        .iter()
        .enumerate()
        .map(|(i, &(f, b, a, p))| CostNode {
            name: format!("l{i}"),
            op: "Linear".into(),
            work: Work::Measured {
                fwd_s: f * 1e-3,
                bwd_s: b * 1e-3,
            },
            activation_bytes: a,
            saved_bytes: a,
            saved_fixed_bytes: 0.0,
            parameter_bytes: p,
            is_input: false,
            side: false,
        })
        .collect();
    let edges = (1..layers.len())
        .map(|i| CostEdge::new(i - 1, i, layers[i - 1].2))
        .collect();
    CostGraph::new("chain", 32.0, nodes, edges, "chain").expect("graph")
}

#[test]
fn one_stage_latency_is_data_parallel() {
    // L = M(F+B) + AR for S = 1.
    let (l, q) = latency(&[st(1.0, 2.0, 5.0)], 8);
    assert_eq!(q, 0);
    assert!((l - (8.0 * 3.0 + 5.0)).abs() < 1e-12);
}

#[test]
fn eq2_phases_and_pivot() {
    // Stage 0 is the heaviest: Algorithm 1 moves Q to it.
    let s = [st(2.0, 4.0, 1.0), st(0.1, 0.1, 0.0), st(1.0, 2.0, 3.0)];
    assert_eq!(pivot(&s, 10), 0);
    let (l, q) = latency(&s, 10);
    assert_eq!(q, 0);
    // T_w = F_0, T_s = 9·6, T_e = max(AR_0 + B_0, AR_1 − (B_0 + B_1), AR_2 − (B_0+B_1+B_2)).
    let te = (1.0f64 + 4.0).max(0.0 - 4.1).max(3.0 - 6.1);
    assert!((l - (2.0 + 54.0 + te)).abs() < 1e-12, "{l}");
    // Equal stages: the last stage stays the pivot and the warm-up spans the pipeline.
    let s = [st(1.0, 2.0, 0.0), st(1.0, 2.0, 0.0)];
    assert_eq!(pivot(&s, 4), 1);
    // T_w = F_0 + F_1, T_s = 3·3, T_e = B_0 + B_1: (M + S − 1)(F + B), GPipe's closed form.
    let (l, _) = latency(&s, 4);
    assert!((l - 15.0).abs() < 1e-12, "{l}");
    // A heavy earlier stage only wins when its steady time beats the pivot's plus the stages
    // in between (strict >).
    let s = [st(1.5, 1.5, 0.0), st(1.0, 1.0, 0.0), st(1.0, 1.0, 0.0)];
    // l1 for s=0: 1·3 = 3; l2 = 1·2 + (F_1+B_1) = 4 → Q stays 2 with M = 2.
    assert_eq!(pivot(&s, 2), 2);
    // With M = 10: 27 > 18 + 2 → Q = 0.
    assert_eq!(pivot(&s, 10), 0);
}

#[test]
fn placement_policies_on_two_servers() {
    let c = Cluster::preset("dapple-a").expect("preset");
    let all: u128 = (1 << 16) - 1;
    let bits = |m: u128| (0..16).filter(|d| m >> d & 1 == 1).collect::<Vec<_>>();
    // All fresh: FF and AF fill server 0; SF scatters over both servers.
    assert_eq!(
        bits(place(&c, all, 4, Policy::FreshFirst).expect("ff")),
        vec![0, 1, 2, 3]
    );
    assert_eq!(
        bits(place(&c, all, 4, Policy::ScatterFirst).expect("sf")),
        vec![0, 1, 8, 9]
    );
    // Devices 0..3 in use: FF takes the fresh server, AF appends to server 0.
    let free = all & !0b1111;
    assert_eq!(
        bits(place(&c, free, 4, Policy::FreshFirst).expect("ff")),
        vec![8, 9, 10, 11]
    );
    assert_eq!(
        bits(place(&c, free, 4, Policy::AppendFirst).expect("af")),
        vec![4, 5, 6, 7]
    );
    // Spilling over: AF of 6 takes server 0's four free devices, then two fresh ones.
    assert_eq!(
        bits(place(&c, free, 6, Policy::AppendFirst).expect("af")),
        vec![4, 5, 6, 7, 8, 9]
    );
    assert!(place(&c, free, 13, Policy::FreshFirst).is_none());
}

#[test]
fn free_network_gives_data_parallelism() {
    // With (almost) free all-reduce, replicating everything has no bubble: DP wins.
    let g = profile("vgg-19-pbs-32.txt", 32.0);
    let c = Cluster::resolve("16@1e15", None).expect("cluster");
    let opts = PlanOptions::new(512);
    let plan = by_name("dapple")
        .expect("dapple")
        .plan(&g, &c, &opts)
        .expect("plan");
    plan.verify(&g, &c).expect("verifies");
    assert_eq!(plan.stages.len(), 1);
    assert_eq!(plan.stages[0].devices.len(), 16);
}

#[test]
fn heavy_weights_at_the_end_stay_unreplicated() {
    // Compute up front, a huge parameter block at the end, slow network: the search keeps the
    // weights on few devices (an uneven, VGG-like 15:1 shape) rather than all-reducing them.
    let mut layers = vec![(10.0, 20.0, 4e6, 1e6); 8];
    layers.push((0.5, 1.0, 4e3, 4e8));
    let g = chain(&layers);
    let c = Cluster::preset("dapple-c").expect("preset");
    let opts = PlanOptions::new(2048);
    let s = dapple::search(&g, &c, &opts, 32).expect("search");
    assert!(s.stages.len() >= 2, "{:?}", s.stages);
    let last = s.stages.last().expect("stage");
    assert_eq!(last.2.len(), 1, "{:?}", s.stages);
    let all = s.cuts.last();
    let dp = dapple::evaluate(&g, &c, &opts, 32, &s.cuts, &[(0, all, (0..16).collect())]).0;
    assert!(s.latency < dp, "{} vs DP {dp}", s.latency);
    // evaluate() agrees with the search on the plan it found.
    let (l, _) = dapple::evaluate(&g, &c, &opts, 32, &s.cuts, &s.stages);
    assert!((l - s.latency).abs() < 1e-9 * l, "{l} vs {}", s.latency);
}

#[test]
fn memory_forces_a_pipeline() {
    // 10 GB of parameters: DP (16 GB V100s, SGD: weights + gradients = 20 GB) cannot fit.
    let layers = vec![(1.0, 2.0, 1e6, 1e9); 10];
    let g = chain(&layers);
    let c = Cluster::preset("dapple-a")
        .expect("preset")
        .take(8)
        .expect("8");
    let opts = PlanOptions::new(256);
    let plan = by_name("dapple")
        .expect("dapple")
        .plan(&g, &c, &opts)
        .expect("plan");
    plan.verify(&g, &c).expect("verifies");
    assert!(plan.stages.len() >= 2);
    assert!(!plan.out_of_memory, "{plan:?}");
}

#[test]
fn plans_on_the_dapple_profiles_verify() {
    for (name, pbs, gbs) in [
        ("vgg-19-pbs-32.txt", 32.0, 2048),
        ("gnmt-16-pbs-64.txt", 64.0, 1024),
    ] {
        let g = profile(name, pbs);
        for preset in ["dapple-a", "dapple-b", "dapple-c"] {
            let c = Cluster::preset(preset).expect("preset");
            let opts = PlanOptions::new(gbs);
            let plan = by_name("dapple")
                .expect("dapple")
                .plan(&g, &c, &opts)
                .expect("plan");
            plan.verify(&g, &c).expect("verifies");
            assert_eq!(plan.devices(), 16, "{name} {preset}");
            assert!(!plan.out_of_memory, "{name} {preset}");
            assert!(["dapple-a", "dapple-b", "zb-h1", "zb-h2"].contains(&plan.schedule.name()));
            // The plan is no worse than DP under the planner's own objective.
            let fam = dapple::cuts(&g, &c);
            let dp = dapple::evaluate(
                &g,
                &c,
                &opts,
                plan.micro_batch.size(),
                &fam,
                &[(0, fam.last(), (0..16).collect())],
            )
            .0;
            assert!(plan.objective_s <= dp * (1.0 + 1e-9), "{name} {preset}");
        }
    }
}

#[test]
fn early_backward_vs_gpipe_and_recomputation() {
    use pipec_passes::cost::Optimizer;
    use pipec_passes::plan::{Plan, StageSpec};
    use pipec_passes::sim::{schedule, simulate, ScheduleKind, StageGraph};
    // Table 6's setting in small: 2 stages of 8 uniform layers, one device each.
    let g = chain(&vec![(3.3, 6.7, 4e6, 5e7); 16]);
    let c = Cluster::preset("dapple-b")
        .expect("preset")
        .take(2)
        .expect("2");
    let specs = vec![
        StageSpec {
            nodes: (0..8).collect(),
            devices: vec![0],
        },
        StageSpec {
            nodes: (8..16).collect(),
            devices: vec![1],
        },
    ];
    let run = |kind, m: u64| {
        let mut o = PlanOptions::new(32 * m);
        o.optimizer = Optimizer::Adam;
        Plan::assemble("t", &g, &c, &o, specs.clone(), 32, kind, 0.0, 0.0).expect("plan")
    };
    let avg = |p: &Plan| {
        p.stages
            .iter()
            .map(|s| s.peak_memory_bytes as f64)
            .sum::<f64>()
            / 2.0
    };
    let gpipe = run(ScheduleKind::GPipe, 2);
    let eb2 = run(ScheduleKind::DappleA, 2);
    let eb4 = run(ScheduleKind::DappleA, 4);
    let eb16 = run(ScheduleKind::DappleA, 16);
    // Same bubbles as GPipe at equal M; early backward's memory does not grow with M (once M
    // exceeds the warm-up, so that a backward runs while the gradients of an earlier one are
    // held).
    assert!((eb2.throughput_samples_per_s() / gpipe.throughput_samples_per_s() - 1.0).abs() < 0.02);
    assert_eq!(eb4.peak_memory_bytes, eb16.peak_memory_bytes);
    assert!(eb16.throughput_samples_per_s() > 1.3 * gpipe.throughput_samples_per_s());
    // GPipe holds all M micro-batches' activations; early backward at most the warm-up's.
    let gpipe16 = run(ScheduleKind::GPipe, 16);
    assert!(avg(&eb16) < avg(&gpipe16));
    // Re-computation: less memory, one more forward per backward.
    let sg = StageGraph::from_specs(&g, &c, &specs, 32.0, Optimizer::Adam);
    let rc = sg.with_recomputation();
    let t = |sg: &StageGraph| {
        let s = schedule::generate(sg, ScheduleKind::GPipe, 4);
        let r = simulate(sg, &s, &c, Default::default()).expect("sim");
        (r.iteration_time_s, r.devices[0].peak_memory_bytes)
    };
    let ((t0, m0), (t1, m1)) = (t(&sg), t(&rc));
    assert!(t1 > t0 && m1 < m0, "{t0} {m0} / {t1} {m1}");
}

/// The search's workers change nothing: the plan (and every candidate a search keeps, and its
/// state count) is the same with 1, 2 or 3 threads, on a search that passes its transition
/// budget (GNMT on 32 summit GPUs: the beam) and on a whole planner run.
#[test]
fn search_workers_do_not_change_the_plan() {
    let in_pool = |n: usize, f: &(dyn Fn() -> String + Sync)| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .expect("thread pool")
            .install(f)
    };
    let gnmt = profile("gnmt.txt", 64.0);
    let summit = Cluster::preset("summit")
        .expect("preset")
        .take(32)
        .expect("32");
    let opts = PlanOptions::new(1024);
    let search = || {
        let s = dapple::search(&gnmt, &summit, &opts, 64).expect("search");
        assert!(s.capped, "the case should exercise the beam");
        format!(
            "{:?} {:?} {} {:e}",
            s.stages, s.candidates, s.states, s.latency
        )
    };
    let vgg = profile("vgg-19-pbs-32.txt", 32.0);
    let dapple_a = Cluster::preset("dapple-a")
        .expect("preset")
        .take(16)
        .expect("16");
    let plan = || {
        let mut p = by_name("dapple")
            .expect("dapple")
            .plan(&vgg, &dapple_a, &PlanOptions::new(512))
            .expect("plan");
        p.search_time_s = 0.0;
        format!("{p:?}")
    };
    for f in [&search as &(dyn Fn() -> String + Sync), &plan] {
        let one = in_pool(1, f);
        for n in [2, 3] {
            assert_eq!(in_pool(n, f), one, "{n} threads differ from one");
        }
    }
}
