//! DAPPLE Table 6 (PPoPP'21 Table VI): early backward vs GPipe on the same 2-stage plan of a
//! BERT-48-like model (48 uniform layers, 640M parameters, Adam, micro-batch 2, one V100 per stage
//! on `dapple-b`). Per layer at batch 2: 3.3 ms forward, 6.7 ms backward, 146 MB saved for
//! backward, 4 MB boundary activation (calibrated so that GPipe at M = 2 needs ~12.1 GB as in the
//! paper). `cargo run --release -p pipec-passes --example dapple_table6`.
use pipec_passes::cost::{Cluster, CostEdge, CostGraph, CostNode, Optimizer, Work};
use pipec_passes::plan::{Plan, PlanOptions, StageSpec};
use pipec_passes::sim::{schedule, simulate, ScheduleKind, StageGraph};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = 48;
    let nodes = (0..n)
        .map(|i| CostNode {
            name: format!("layer{i}"),
            op: "TransformerLayer".into(),
            work: Work::Measured {
                fwd_s: 3.3e-3,
                bwd_s: 6.7e-3,
            },
            activation_bytes: 4e6,
            saved_bytes: 146e6,
            saved_fixed_bytes: 0.0,
            parameter_bytes: 640e6 * 4.0 / n as f64,
            is_input: false,
            side: false,
        })
        .collect();
    let edges = (1..n).map(|i| CostEdge::new(i - 1, i, 4e6)).collect();
    let g = CostGraph::new("bert48", 2.0, nodes, edges, "bert48")?;
    let c = Cluster::preset("dapple-b").ok_or("preset")?.take(2)?;
    let specs = vec![
        StageSpec {
            nodes: (0..24).collect(),
            devices: vec![0],
        },
        StageSpec {
            nodes: (24..48).collect(),
            devices: vec![1],
        },
    ];
    println!("| schedule | M | throughput (samples/s) | avg peak memory (GB) | max peak (GB) |");
    println!("|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (kind, m) in [
        (ScheduleKind::GPipe, 2u64),
        (ScheduleKind::GPipe, 3),
        (ScheduleKind::DappleA, 2),
        (ScheduleKind::DappleA, 8),
        (ScheduleKind::DappleA, 16),
    ] {
        let mut o = PlanOptions::new(2 * m);
        o.optimizer = Optimizer::Adam;
        let p = Plan::assemble("x", &g, &c, &o, specs.clone(), 2, kind, 0.0, 0.0)?;
        let avg = p
            .stages
            .iter()
            .map(|s| s.peak_memory_bytes as f64)
            .sum::<f64>()
            / p.stages.len() as f64;
        println!(
            "| {} | {m} | {:.2} | {:.1} | {:.1}{} |",
            kind.name(),
            p.throughput_samples_per_s(),
            avg / 1e9,
            p.peak_memory_bytes as f64 / 1e9,
            if p.out_of_memory { " (OOM)" } else { "" }
        );
        rows.push((kind, m, p.throughput_samples_per_s(), avg));
    }
    // Re-computation (RC): the same plan with B' = B + F and only boundary inputs saved.
    for (kind, m) in [
        (ScheduleKind::GPipe, 2u64),
        (ScheduleKind::GPipe, 5),
        (ScheduleKind::DappleA, 2),
        (ScheduleKind::DappleA, 16),
    ] {
        let sg = StageGraph::from_specs(&g, &c, &specs, 2.0, Optimizer::Adam).with_recomputation();
        let sched = schedule::generate(&sg, kind, m as usize);
        let res = simulate(&sg, &sched, &c, Default::default())?;
        let peaks: Vec<f64> = (0..2).map(|d| res.devices[d].peak_memory_bytes).collect();
        let cap = c.kind_of(0).memory_bytes as f64;
        println!(
            "| {} + RC | {m} | {:.2} | {:.1} | {:.1}{} |",
            kind.name(),
            (2 * m) as f64 / res.iteration_time_s,
            peaks.iter().sum::<f64>() / 2.0 / 1e9,
            peaks.iter().copied().fold(0.0, f64::max) / 1e9,
            if peaks.iter().any(|p| *p > cap) {
                " (OOM)"
            } else {
                ""
            }
        );
    }
    let (g2, d16) = (rows[0], rows[4]);
    println!(
        "\nDAPPLE M=16 vs GPipe M=2: throughput {:.2}x (paper 1.6x), avg peak memory {:.2}x (paper 0.88x)",
        d16.2 / g2.2,
        d16.3 / g2.3
    );
    Ok(())
}
