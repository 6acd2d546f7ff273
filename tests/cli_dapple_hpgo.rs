//! `pipec plan --planner dapple --dapple-reference hpgo`: DAPPLE's published planner (HPGO)
//! reproduced. The expected plans and times are what HPGO 0.9.1 itself printed on DAPPLE's
//! profiles (BENCHMARKS.md, "DAPPLE's own planner (HPGO)"): replicas per stage, nodes per stage
//! and HPGO's estimated iteration time `L` (pipec's `objective_s`).

mod common;

use common::{pipec, profile, stderr};

/// The three topologies of 16 GPUs: servers of 8, 1 and 2 GPUs.
const TWO_BY_EIGHT: &str = "8@25e9,2@3e9";
const SIXTEEN_BY_ONE: &str = "1@25e9,16@3e9";
const EIGHT_BY_TWO: &str = "2@25e9,8@3e9";

/// Plan with the reference mode; returns the plan JSON.
fn hpgo(model: &str, cluster: &str, batch: &str) -> serde_json::Value {
    let o = pipec(&[
        "plan",
        &profile(model),
        "--cluster",
        cluster,
        "--planner",
        "dapple",
        "--dapple-reference",
        "hpgo",
        "--batch",
        batch,
        "--json",
    ]);
    assert!(o.status.success(), "{model} on {cluster}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("plan JSON")
}

fn replicas(p: &serde_json::Value) -> Vec<u64> {
    p["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["replicas"].as_u64().expect("replicas"))
        .collect()
}

fn nodes(p: &serde_json::Value) -> Vec<usize> {
    p["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .map(|s| s["nodes"].as_array().expect("nodes").len())
        .collect()
}

fn devices(p: &serde_json::Value, s: usize) -> Vec<u64> {
    p["stages"][s]["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d.as_u64().expect("device id"))
        .collect()
}

/// HPGO's `L` (seconds) as pipec's objective, to 1e-9 relative.
fn assert_objective(p: &serde_json::Value, want: f64, what: &str) {
    let got = p["objective_s"].as_f64().expect("objective_s");
    assert!(
        ((got - want) / want).abs() < 1e-9,
        "{what}: objective {got} s, HPGO printed {want} s"
    );
}

#[test]
fn vgg19_plans_are_hpgos() {
    let vgg = "vgg-19-pbs-32.txt";
    // 2 x 8: 15:1, split after Conv2d_5_2 (19 of 26 profile nodes with the input).
    let p = hpgo(vgg, TWO_BY_EIGHT, "2048");
    assert_eq!(replicas(&p), vec![15, 1]);
    assert_eq!(nodes(&p), vec![19, 7]);
    assert_eq!(devices(&p, 1), vec![15]);
    assert_objective(&p, 0.628_046_978_805_555_4, "VGG-19 2x8");
    assert_eq!(p["planner"], "dapple-hpgo");
    assert_eq!(p["micro_batch"], 1);
    // 16 x 1: 14:2.
    let p = hpgo(vgg, SIXTEEN_BY_ONE, "2048");
    assert_eq!(replicas(&p), vec![14, 2]);
    assert_eq!(nodes(&p), vec![17, 9]);
    assert_objective(&p, 0.770_048_540_511_904_6, "VGG-19 16x1");
    // 8 x 2: 15:1, one state later than on 2 x 8.
    let p = hpgo(vgg, EIGHT_BY_TWO, "2048");
    assert_eq!(replicas(&p), vec![15, 1]);
    assert_eq!(nodes(&p), vec![18, 8]);
    assert_objective(&p, 0.757_633_794_855_555_6, "VGG-19 8x2");
}

#[test]
fn gnmt16_plans_are_hpgos() {
    let gnmt = "gnmt-16-pbs-64.txt";
    // 2 x 8: 8:8, one server per stage (HPGO's split at its state 1053).
    let p = hpgo(gnmt, TWO_BY_EIGHT, "1024");
    assert_eq!(replicas(&p), vec![8, 8]);
    assert_eq!(devices(&p, 0), (0..8).collect::<Vec<u64>>());
    assert_eq!(nodes(&p).iter().sum::<usize>(), 96);
    assert_objective(&p, 0.268_757_113_464_375, "GNMT-16 2x8");
    // 16 x 1: the straight pipeline (16 stages of one GPU). Which cuts HPGO picks among those
    // with the same slowest stage depends on its hash-map order; the time does not.
    let p = hpgo(gnmt, SIXTEEN_BY_ONE, "1024");
    assert_eq!(replicas(&p), vec![1; 16]);
    assert_objective(&p, 0.579_173_364_625_000_9, "GNMT-16 16x1");
}

#[test]
fn reference_flag_errors_name_the_flag() {
    let vgg = profile("vgg-19-pbs-32.txt");
    let o = pipec(&[
        "plan",
        &vgg,
        "--cluster",
        TWO_BY_EIGHT,
        "--planner",
        "gpp",
        "--dapple-reference",
        "hpgo",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--dapple-reference hpgo: only with --planner dapple"),
        "{}",
        stderr(&o)
    );
    let o = pipec(&[
        "plan",
        &vgg,
        "--cluster",
        TWO_BY_EIGHT,
        "--planner",
        "dapple",
        "--dapple-reference",
        "paper",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--dapple-reference paper: unknown reference"),
        "{}",
        stderr(&o)
    );
    // HPGO aborts on a pipeline block under 1 ms ("ppl time error"): an error, not a plan.
    let o = pipec(&[
        "plan",
        &vgg,
        "--cluster",
        TWO_BY_EIGHT,
        "--planner",
        "dapple",
        "--dapple-reference",
        "hpgo",
        "--batch",
        "1",
    ]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("HPGO aborts"), "{}", stderr(&o));
}
