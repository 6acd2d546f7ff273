//! Simulator speed: a 32-device, 64-micro-batch 1F1B schedule of a 1000-node graph.
//!
//! `cargo run --release -p pipec-passes --example sim_speed` prints the median and worst time of
//! each step over 20 runs (the figure in `passes/BENCH_COST.md`).

use pipec_passes::cost::cluster::{v100_16gb, Cluster};
use pipec_passes::cost::{AllReduceAlgo, CostEdge, CostGraph, CostNode, Optimizer, Work};
use pipec_passes::plan::StageSpec;
use pipec_passes::sim::{schedule, simulate, ScheduleKind, StageGraph};
use std::time::Instant;

/// A 1000-node graph: a chain with a skip edge every 10 nodes (residual blocks).
fn graph(n: usize) -> CostGraph {
    let nodes = (0..n)
        .map(|i| CostNode {
            name: format!("n{i}"),
            op: "Layer".into(),
            work: Work::Measured {
                fwd_s: 1e-3 * (1.0 + (i % 7) as f64 / 7.0),
                bwd_s: 2e-3 * (1.0 + (i % 5) as f64 / 5.0),
            },
            activation_bytes: 1e6 * (1 + i % 3) as f64,
            saved_bytes: 1e6,
            saved_fixed_bytes: 0.0,
            parameter_bytes: 4e6,
            is_input: i == 0,
            side: false,
        })
        .collect();
    let mut edges: Vec<CostEdge> = (1..n).map(|i| CostEdge::new(i - 1, i, 1e6)).collect();
    edges.extend((10..n).step_by(10).map(|i| CostEdge::new(i - 10, i, 1e6)));
    CostGraph::new("bench", 64.0, nodes, edges, "bench").expect("graph")
}

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

fn main() {
    let g = graph(1000);
    let cluster = Cluster::from_inline("8@1.3e11,4@3.125e9", v100_16gb()).expect("cluster");
    let cases: [(&str, Vec<StageSpec>); 2] = [
        (
            "32 stages x 1 replica",
            (0..32)
                .map(|s| StageSpec {
                    nodes: (s * 1000 / 32..(s + 1) * 1000 / 32).collect(),
                    devices: vec![s],
                })
                .collect(),
        ),
        (
            "16 stages x 2 replicas",
            (0..16)
                .map(|s| StageSpec {
                    nodes: (s * 1000 / 16..(s + 1) * 1000 / 16).collect(),
                    devices: vec![2 * s, 2 * s + 1],
                })
                .collect(),
        ),
    ];
    for (name, specs) in cases {
        let (mut t_cost, mut t_sched, mut t_sim, mut t_all) = (vec![], vec![], vec![], vec![]);
        let mut tasks = 0;
        let mut iter = 0.0;
        for _ in 0..20 {
            let t0 = Instant::now();
            let sg = StageGraph::from_specs(&g, &cluster, &specs, 2.0, Optimizer::Adam);
            let t1 = Instant::now();
            let sched = schedule::generate(&sg, ScheduleKind::OneFOneB, 64);
            let t2 = Instant::now();
            let r = simulate(&sg, &sched, &cluster, AllReduceAlgo::Auto).expect("sim");
            let t3 = Instant::now();
            t_cost.push((t1 - t0).as_secs_f64());
            t_sched.push((t2 - t1).as_secs_f64());
            t_sim.push((t3 - t2).as_secs_f64());
            t_all.push((t3 - t0).as_secs_f64());
            tasks = r.tasks.len();
            iter = r.iteration_time_s;
        }
        let ms = |(a, b): (f64, f64)| format!("median {:.2} ms, max {:.2} ms", a * 1e3, b * 1e3);
        println!("{name}: 1000 nodes, 32 devices, 64 micro-batches, {tasks} tasks, iteration {iter:.4} s");
        println!("  stage costs : {}", ms(stats(t_cost)));
        println!("  schedule    : {}", ms(stats(t_sched)));
        println!("  simulate    : {}", ms(stats(t_sim)));
        println!("  total       : {}", ms(stats(t_all)));
    }
}
