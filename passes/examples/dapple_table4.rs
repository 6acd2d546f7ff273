//! DAPPLE Table 4 (PPoPP'21 Table V) on pipec's cost model: the plan the `dapple` planner finds on
//! the DAPPLE profiles with presets `dapple-a/b/c` (16 GPUs, the paper's global batch sizes), next
//! to the paper's plan shapes (DP, 15:1, 8:8, straight) evaluated on the same model: Eq. 2's `L`
//! and the simulated iteration time. `cargo run --release -p pipec-passes --example dapple_table4`.
use pipec_passes::cost::antichain as dapple_cuts;
use pipec_passes::cost::profile::load_profile;
use pipec_passes::cost::{Cluster, CostGraph};
use pipec_passes::plan::{Plan, PlanOptions, StageSpec};
use pipec_passes::planners::{by_name, dapple, Planner};
use pipec_passes::sim::ScheduleKind;
use std::path::Path;

type Stages = Vec<(usize, usize, Vec<usize>)>;

fn simulate(g: &CostGraph, c: &Cluster, o: &PlanOptions, mb: u64, st: &Stages) -> f64 {
    let fam = dapple::cuts(g, c);
    let specs: Vec<StageSpec> = st
        .iter()
        .map(|(i, j, d)| StageSpec {
            nodes: fam.nodes(*i, *j),
            devices: d.clone(),
        })
        .collect();
    [ScheduleKind::DappleA, ScheduleKind::DappleB]
        .iter()
        .filter_map(|&k| Plan::assemble("x", g, c, o, specs.clone(), mb, k, 0.0, 0.0).ok())
        .map(|p| p.iteration_time_s)
        .fold(f64::INFINITY, f64::min)
}

/// Best split (by Eq. 2) of a 2-stage plan with `r0` replicas first.
fn best_two(g: &CostGraph, c: &Cluster, o: &PlanOptions, mb: u64, r0: usize) -> (Stages, f64) {
    let fam = dapple::cuts(g, c);
    let n = fam.last();
    let mut best: Option<(Stages, f64)> = None;
    for j in 1..n {
        let st: Stages = vec![(0, j, (0..r0).collect()), (j, n, (r0..16).collect())];
        let (l, _) = dapple::evaluate(g, c, o, mb, &fam, &st);
        if best.as_ref().is_none_or(|b| l < b.1) {
            best = Some((st, l));
        }
    }
    best.unwrap_or_default()
}

/// A plan's stages as positions of the cut family (cumulative unions of the stages' nodes).
fn positions(g: &CostGraph, fam: &dapple_cuts::Cuts, plan: &Plan) -> Stages {
    let mut down = dapple_cuts::BitSet::new(g.len());
    let mut at = 0;
    let mut out = Vec::new();
    for s in &plan.stages {
        for &u in &s.nodes {
            down.insert(u);
        }
        let p = fam
            .down
            .iter()
            .position(|d| *d == down)
            .unwrap_or(fam.last());
        out.push((at, p, s.devices.clone()));
        at = p;
    }
    out
}

fn shape(g: &CostGraph, c: &Cluster, st: &Stages) -> String {
    let fam = dapple::cuts(g, c);
    let r: Vec<String> = st.iter().map(|s| s.2.len().to_string()).collect();
    let l: Vec<String> = st
        .iter()
        .map(|s| fam.nodes(s.0, s.1).len().to_string())
        .collect();
    format!("{} (nodes {})", r.join(":"), l.join(":"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../onnx-models/profiles");
    println!("| model (GBS) | cluster | dapple plan (re-ranked) | L (s) | sim (s) | search (s) | Eq. 2 only: plan, L / sim | DP L / sim | 15:1 L / sim | 8:8 L / sim | straight L / sim |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for (file, pbs, gbs) in [
        ("vgg-19-pbs-32.txt", 32.0, 2048u64),
        ("gnmt-16-pbs-64.txt", 64.0, 1024),
    ] {
        let g = load_profile(&root.join(file), pbs)?.graph;
        for preset in ["dapple-a", "dapple-b", "dapple-c"] {
            let c = Cluster::preset(preset).ok_or("preset")?;
            let o = PlanOptions::new(gbs);
            let plan = by_name("dapple")?.plan(&g, &c, &o)?;
            let mb = plan.micro_batch.size();
            let fam = dapple::cuts(&g, &c);
            let st = positions(&g, &fam, &plan);
            let pure = dapple::Dapple {
                rerank: 1,
                ..Default::default()
            }
            .plan(&g, &c, &o)?;
            let pst = positions(&g, &fam, &pure);
            let dp: Stages = vec![(0, fam.last(), (0..16).collect())];
            let (s151, _) = best_two(&g, &c, &o, mb, 15);
            let (s88, _) = best_two(&g, &c, &o, mb, 8);
            let straight = by_name("straight")?.plan(&g, &c, &o)?;
            let sst = positions(&g, &fam, &straight);
            let cell = |st: &Stages| {
                format!(
                    "{:.3} / {:.3}",
                    dapple::evaluate(&g, &c, &o, mb, &fam, st).0,
                    simulate(&g, &c, &o, mb, st)
                )
            };
            println!(
                "| {} ({gbs}) | {preset} | {} {} | {:.3} | {:.3} | {:.2} | {} {:.3} / {:.3} | {} | {} {} | {} {} | {} |",
                file.trim_end_matches(".txt"),
                shape(&g, &c, &st),
                plan.schedule,
                plan.objective_s,
                plan.iteration_time_s,
                plan.search_time_s,
                shape(&g, &c, &pst),
                pure.objective_s,
                pure.iteration_time_s,
                cell(&dp),
                cell(&s151),
                shape(&g, &c, &s151).split(' ').nth(2).unwrap_or(""),
                cell(&s88),
                shape(&g, &c, &s88).split(' ').nth(2).unwrap_or(""),
                cell(&sst),
            );
        }
    }
    Ok(())
}
