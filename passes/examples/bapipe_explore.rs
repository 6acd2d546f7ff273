//! Print BaPipe's schedule exploration: `cargo run -p pipec-passes --example bapipe_explore --
//! PROFILE.txt PROFILE_BATCH CLUSTER BATCH`.
use pipec_passes::cost::profile::load_profile;
use pipec_passes::cost::Cluster;
use pipec_passes::plan::PlanOptions;
use pipec_passes::planners::bapipe;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        return Err("usage: bapipe_explore PROFILE PROFILE_BATCH CLUSTER BATCH".into());
    }
    let g = load_profile(std::path::Path::new(&a[1]), a[2].parse()?)?.graph;
    let c = Cluster::resolve(&a[3], None)?;
    let opts = PlanOptions::new(a[4].parse()?);
    for c in bapipe::explore(&g, &c, &opts)? {
        println!(
            "mb {:>4} {:<8} sim {:.6} s  table2 {:.6} s  bounds {:?} coarse {} comm/comp {:?}",
            c.micro_batch,
            c.schedule.name(),
            c.simulated_s,
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
