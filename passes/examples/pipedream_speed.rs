//! PipeDream planner search speed on the shared PipeDream profiles.
//!
//! `cargo run --release -p pipec-passes --example pipedream_speed [REPS]` runs the search of
//! `--planner pipedream` (antichain linearisation, every level's DP, expansion into stages; not
//! the simulation `Plan::assemble` adds) `REPS` times (default 20) per profile and cluster setting
//! and prints the minimum and median wall time, so a busy machine shows its quiet-time figure.

use pipec_passes::cost::antichain::{pipedream_exclusions, Linearization};
use pipec_passes::cost::cluster::{v100_16gb, Cluster};
use pipec_passes::cost::profile::load_profile;
use pipec_passes::planners::pipedream::{hierarchy, PipeDreamOptions, Solver};
use std::path::Path;
use std::time::Instant;

fn main() {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../onnx-models/profiles");
    let settings = [
        ("n4", "4@1250000000"),
        ("n8", "8@1250000000"),
        ("n16", "16@3125000000"),
        ("n8x2", "8@25000000000,2@3125000000"),
        ("n8x4", "8@25000000000,4@1250000000"),
    ];
    let opts = PipeDreamOptions::default();
    println!("profile setting states objective_s min_s median_s");
    for model in ["vgg16", "resnet50", "gnmt", "inception_v3"] {
        let g = load_profile(&root.join(format!("{model}.txt")), 64.0)
            .expect("profile")
            .graph;
        for (tag, spec) in settings {
            let c = Cluster::from_inline(spec, v100_16gb()).expect("cluster");
            let kind = c.kind_of(0);
            let time = |n: usize| {
                let (f, b) = g.times(n, 64.0, kind);
                f + b
            };
            let mut times = Vec::with_capacity(reps);
            let (mut obj, mut states) = (0.0, 0);
            for _ in 0..reps {
                let t0 = Instant::now();
                let ex = pipedream_exclusions(&g);
                let lin = Linearization::for_graph(&g, &ex, opts.max_states, time);
                let mut solver = Solver::new(&g, &lin, hierarchy(&c), &opts, time);
                obj = solver.solve();
                let stages = solver.stages().expect("stages");
                times.push(t0.elapsed().as_secs_f64());
                states = lin.len();
                assert!(!stages.is_empty());
            }
            times.sort_by(f64::total_cmp);
            println!(
                "{model} {tag} {states} {obj:.10} {:.6} {:.6}",
                times[0],
                times[reps / 2]
            );
        }
    }
}
