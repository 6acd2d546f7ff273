//! Every candidate of DAPPLE's published planner (HPGO), as `--dapple-reference hpgo` reproduces
//! it, with HPGO's speed-up and time, for one profile, global batch and topology:
//! `cargo run --release -p pipec-passes --example dapple_hpgo -- PROFILE.txt GBS SERVERSxGPUS`
//! (e.g. `onnx-models/profiles/vgg-19-pbs-32.txt 2048 2x8`). The lines follow the order HPGO
//! builds its candidates in; the chosen one is marked.
use pipec_passes::cost::profile::{load_profile, profile_batch_from_name};
use pipec_passes::cost::Cluster;
use pipec_passes::planners::dapple_hpgo::{orchestrate, Devices, Model, Source};
use std::path::Path;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4 {
        return Err("usage: dapple_hpgo PROFILE.txt GBS SERVERSxGPUS".into());
    }
    let path = Path::new(&a[1]);
    let gbs: u64 = a[2].parse()?;
    let (servers, per) = a[3]
        .split_once('x')
        .ok_or("topology: SERVERSxGPUS, e.g. 2x8")?;
    let (servers, per): (usize, usize) = (servers.parse()?, per.parse()?);
    let pbs = profile_batch_from_name(path).unwrap_or(1) as f64;
    let g = load_profile(path, pbs)?.graph;
    let c = Cluster::from_inline(
        &format!("{per}@25e9,{servers}@3e9"),
        pipec_passes::cost::cluster::v100_16gb(),
    )?;
    let t0 = Instant::now();
    let d = Devices::of_cluster(&c);
    let m = Model::new(&g, &c, gbs)?;
    let out = orchestrate(&d, &m)?;
    let dt = t0.elapsed().as_secs_f64();
    let total = m.ct(0, m.len() - 1);
    for (i, c) in out.candidates.iter().enumerate() {
        let what = match c.source {
            Source::General { i } => format!("general i={i}"),
            Source::Straight { i } => format!("straight i={i}"),
            Source::Bipartition => "two-way split".to_string(),
        };
        let stages: Vec<String> = c
            .stages
            .iter()
            .map(|s| {
                let ids: Vec<String> = (0..128)
                    .filter(|&d| s.gids >> d & 1 == 1)
                    .map(|d| d.to_string())
                    .collect();
                format!(
                    "{}..{}x{}{{{}}}",
                    s.start,
                    s.end,
                    s.per_copy,
                    ids.join(", ")
                )
            })
            .collect();
        println!(
            "{} {what} rp={} speedup={:.17} time={:.17} stages={}",
            if i == out.best { "*" } else { " " },
            c.rp,
            c.speedup,
            c.time_s,
            stages.join(" ")
        );
    }
    println!(
        "states={} total_compute={total:.17} search={:.3} ms",
        m.len(),
        dt * 1e3
    );
    Ok(())
}
