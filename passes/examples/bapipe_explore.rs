//! Print BaPipe's schedule exploration: `cargo run -p pipec-passes --example bapipe_explore --
//! PROFILE.txt PROFILE_BATCH CLUSTER[:DEVICES] BATCH [MICRO_BATCH]`, or with `MODEL.onnx` (PROFILE_BATCH
//! ignored) also the whole-layer plan vs the plan with the intra-layer splits emitted.
use pipec_passes::cost::analytic::{self, AnalyticOptions};
use pipec_passes::cost::profile::load_profile;
use pipec_passes::cost::Cluster;
use pipec_passes::plan::PlanOptions;
use pipec_passes::planners::{bapipe, Planner};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err("usage: bapipe_explore PROFILE PROFILE_BATCH CLUSTER BATCH".into());
    }
    let path = std::path::Path::new(&a[1]);
    let onnx = path.extension().is_some_and(|e| e == "onnx");
    let module = if onnx {
        let mut m = pipec_compiler::onnx::import::load(path)?;
        pipec_compiler::shape::infer_shapes(&mut m)?;
        Some(m)
    } else {
        None
    };
    let g = match &module {
        Some(m) => analytic::planning_graph(m, &AnalyticOptions::default(), &a[1])?.0,
        None => load_profile(path, a[2].parse()?)?.graph,
    };
    // CLUSTER, or PRESET:DEVICES (e.g. cpu:32).
    let cl = match a[3].split_once(':') {
        Some((c, n)) => Cluster::resolve(c, None)?.take(n.parse()?)?,
        None => Cluster::resolve(&a[3], None)?,
    };
    let mut opts = PlanOptions::new(a[4].parse()?);
    if let Some(mb) = a.get(5) {
        opts.set_micro_batch(Some(mb.parse()?))?;
    }
    if let Some(m) = &module {
        let show = |label: &str, p: &pipec_passes::plan::Plan| {
            let t: Vec<String> = p
                .stages
                .iter()
                .map(|s| format!("{:.3}", s.compute_time_s * 1e3))
                .collect();
            let n: Vec<String> = p.stages.iter().map(|s| s.nodes.len().to_string()).collect();
            println!(
                "{label}: mb {} {} nodes {} ms/stage [{}] iteration {:.6} s throughput {:.1}/s splits {:?}",
                p.micro_batch.size(),
                p.schedule,
                n.join(":"),
                t.join(", "),
                p.iteration_time_s,
                p.throughput_samples_per_s(),
                p.intra_splits
                    .iter()
                    .map(|s| format!("{} {:?} s{}->s{}", s.node, s.channels, s.from_stage, s.to_stage))
                    .collect::<Vec<_>>()
            );
        };
        show("whole layers", &bapipe::BaPipe.plan(&g, &cl, &opts)?);
        show("emitted", &bapipe::plan_module(m, &g, &cl, &opts)?.plan);
    }
    for c in bapipe::explore_all(&g, &cl, &opts)? {
        println!(
            "  planned: stage ms {:?} -> balanced {:?}, splits {:?}",
            c.balance
                .stage_times
                .iter()
                .map(|t| t * 1e3)
                .collect::<Vec<_>>(),
            c.balance
                .balanced_times
                .iter()
                .map(|t| t * 1e3)
                .collect::<Vec<_>>(),
            c.balance
                .intra
                .iter()
                .map(|s| (
                    g.nodes[s.node].name.as_str(),
                    s.from_stage,
                    s.to_stage,
                    s.fraction
                ))
                .collect::<Vec<_>>()
        );
        println!(
            "mb {:>4} {:<8} sim {:.6} s  bound {:.6} s  table2 {:.6} s  bounds {:?} coarse {} comm/comp {:?}",
            c.micro_batch,
            c.schedule.name(),
            c.simulated_s,
            c.bound_s,
            c.table2_s,
            c.bounds,
            c.balance.coarse,
            c.balance
                .comm_times
                .iter()
                .zip(&c.balance.stage_times)
                .map(|(m, t)| format!("{:.2}", m / t))
                .collect::<Vec<_>>()
        );
    }
    Ok(())
}
