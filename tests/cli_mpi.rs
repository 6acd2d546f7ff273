//! `pipec run --backend mpi` under `mpirun` (cargo feature `mpi`; needs Open MPI's `mpirun`,
//! installed by `scripts/setup.sh`): compiled pipelines and a replicated (data-parallel) plan
//! pass `--check` with one process per device, a wrong `-np` is a clear error, and a failing
//! or crashing rank ends the whole job with a non-zero status within seconds.
#![cfg(feature = "mpi")]

mod common;

use common::{compile, tempdir, MLP4_DAPPLE_4};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// `mpirun -np N pipec run OUTDIR --backend mpi ARGS...` (as root too), with extra env.
fn mpirun(np: usize, outdir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let t = Instant::now();
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .arg(env!("CARGO_BIN_EXE_pipec"))
        .args(["run", outdir.to_str().unwrap(), "--backend", "mpi"])
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // No network interfaces needed: every rank is on this machine.
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c
        .output()
        .expect("spawn mpirun (is Open MPI installed? scripts/setup.sh)");
    (out, t.elapsed())
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn compile_mlp4(out: &Path, planner: &str, devices: usize) {
    let d = devices.to_string();
    let flags = [
        "--cluster",
        "cpu",
        "--devices",
        &d,
        "--planner",
        planner,
        "--batch",
        "8",
        "--micro-batch",
        "2",
    ];
    compile("mlp4.onnx", out, &flags);
}

/// The `max_rel_diff` rank 0 printed.
fn max_rel_diff(o: &Output) -> f64 {
    let s = String::from_utf8_lossy(&o.stdout);
    let line = s
        .lines()
        .find(|l| l.starts_with("max_rel_diff "))
        .unwrap_or_else(|| panic!("no max_rel_diff:\n{}", text(o)));
    line["max_rel_diff ".len()..].trim().parse().unwrap()
}

#[test]
fn mpi_pipeline_of_four_ranks_passes_check() {
    let dir = tempdir();
    let out = dir.path().join("out");
    compile_mlp4(&out, "straight", 4);
    let params = dir.path().join("p.npz");
    let trace = dir.path().join("t.json");
    let (o, wall) = mpirun(
        4,
        &out,
        &[
            "--steps",
            "2",
            "--check",
            "-o",
            params.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(max_rel_diff(&o) <= 1e-4, "{}", text(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("backend mpi: 4 ranks") && s.contains("step 2: loss"),
        "{s}"
    );
    // Only rank 0 prints the results.
    assert_eq!(
        s.lines().filter(|l| l.starts_with("max_rel_diff ")).count(),
        1,
        "{s}"
    );
    assert_eq!(
        s.lines()
            .filter(|l| l.trim_start().starts_with("3 "))
            .count(),
        1,
        "one timing row per device: {s}"
    );
    let p = pipec_runtime::npz::read(&params).unwrap();
    assert!(p.iter().any(|(k, _)| k == "net.0.weight"), "{p:?}");
    // Rank 0 writes every rank's events: each device's instructions, twice (2 steps), in order.
    let t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let evs: Vec<&serde_json::Value> = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    let prog: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("schedule.json")).unwrap()).unwrap();
    for d in 0..4 {
        let n = prog["devices"][d]["instructions"].as_array().unwrap().len();
        let mine: Vec<_> = evs.iter().filter(|e| e["pid"] == d).collect();
        assert_eq!(mine.len(), 2 * n, "device {d}");
        assert!(mine
            .iter()
            .any(|e| e["name"].as_str().unwrap().starts_with("compute fwd mb 0")));
        assert!(mine
            .windows(2)
            .all(|w| w[0]["ts"].as_f64() <= w[1]["ts"].as_f64()));
    }
    eprintln!("mpirun -np 4 straight: {:.2} s", wall.as_secs_f64());
}

#[test]
fn mpi_data_parallel_all_reduce_passes_check() {
    let dir = tempdir();
    let out = dir.path().join("out");
    compile_mlp4(&out, "dp", 2);
    let sched = std::fs::read_to_string(out.join("schedule.json")).unwrap();
    assert!(
        sched.contains("all_reduce") || sched.contains("AllReduce"),
        "no all-reduce in the plan"
    );
    let (o, wall) = mpirun(2, &out, &["--steps", "3", "--check"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(max_rel_diff(&o) <= 1e-4, "{}", text(&o));
    eprintln!("mpirun -np 2 dp: {:.2} s", wall.as_secs_f64());
}

#[test]
fn mpi_wrong_number_of_ranks_is_a_clear_error() {
    let dir = tempdir();
    let out = dir.path().join("out");
    compile_mlp4(&out, "dp", 2);
    let (o, wall) = mpirun(3, &out, &["--check"], &[]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("has 2 devices but mpirun started 3 ranks") && e.contains("-np 2"),
        "{}",
        text(&o)
    );
    // Reported once (by rank 0), not by every rank.
    assert_eq!(
        e.matches("mpirun started 3 ranks").count(),
        1,
        "{}",
        text(&o)
    );
    assert!(wall < Duration::from_secs(30), "{wall:?}");
}

#[test]
fn mpi_failing_rank_aborts_the_job_quickly() {
    let dir = tempdir();
    let out = dir.path().join("out");
    compile_mlp4(&out, "straight", 4);
    // Rank 2 fails while the others wait for it in receives (timeout 60 s): MPI_Abort must end
    // the job long before that.
    let (o, wall) = mpirun(4, &out, &["--check"], &[("PIPEC_MPI_TEST_FAIL", "2")]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("rank 2: the run failed") && e.contains("failing on purpose"),
        "{}",
        text(&o)
    );
    assert!(
        wall < Duration::from_secs(20),
        "took {wall:?}: {}",
        text(&o)
    );
    eprintln!("failing rank: job ended after {:.2} s", wall.as_secs_f64());
}

#[test]
fn mpi_crashing_rank_ends_the_job_quickly() {
    let dir = tempdir();
    let out = dir.path().join("out");
    compile_mlp4(&out, "dp", 2);
    let (o, wall) = mpirun(2, &out, &["--check"], &[("PIPEC_MPI_TEST_FAIL", "1:crash")]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        wall < Duration::from_secs(20),
        "took {wall:?}: {}",
        text(&o)
    );
    eprintln!("crashing rank: job ended after {:.2} s", wall.as_secs_f64());
}

#[test]
fn mpi_dapple_with_a_replicated_stage_passes_check() {
    // Stages 0 and 1 on one device each, stage 2 replicated on devices 2 and 3: the all-reduce
    // runs on a sub-communicator that ranks 0 and 1 are not in.
    let dir = tempdir();
    let out = dir.path().join("out");
    compile("mlp4.onnx", &out, MLP4_DAPPLE_4);
    let (o, wall) = mpirun(4, &out, &["--steps", "3", "--check"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(max_rel_diff(&o) <= 1e-4, "{}", text(&o));
    eprintln!("mpirun -np 4 dapple: {:.2} s", wall.as_secs_f64());
}

#[test]
fn mpi_failing_check_exits_1() {
    use pipec_runtime::dist::fixtures::{write_linear, LinearSpec};
    // A 2-stage program whose reference optimizer uses another learning rate: rank 0's check
    // fails, every rank exits 1 (the code is broadcast), so mpirun exits 1.
    let a = tempdir();
    let b = tempdir();
    write_linear(a.path(), &LinearSpec::default()).unwrap();
    write_linear(
        b.path(),
        &LinearSpec {
            lr: 0.02,
            ..Default::default()
        },
    )
    .unwrap();
    std::fs::copy(
        b.path().join("reference/step.onnx"),
        a.path().join("reference/step.onnx"),
    )
    .unwrap();
    let n = pipec_runtime::dist::load(a.path())
        .unwrap()
        .program
        .devices
        .len();
    let (o, _) = mpirun(n, a.path(), &["--check"], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("check FAILED"),
        "{}",
        text(&o)
    );
}

/// `--transport nccl` where there is no GPU (this CI machine): a clear error naming the missing
/// CUDA driver, exit 2, in one process and under `mpirun` (every rank agrees before any
/// collective, so nobody waits for a communicator that will not come). A GPU machine runs
/// `scripts/gpu_check.sh` instead.
#[cfg(feature = "cuda")]
#[test]
fn nccl_without_a_gpu_is_a_clear_error() {
    if Path::new("/dev/nvidiactl").exists() {
        return;
    }
    let dir = tempdir();
    let out = dir.path().join("out");
    compile_mlp4(&out, "dp", 2);
    let flags = ["--device", "cuda", "--transport", "nccl"];
    let o = Command::new(env!("CARGO_BIN_EXE_pipec"))
        .args(["run", out.to_str().unwrap()])
        .args(flags)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--transport nccl: the CUDA driver library (libcuda.so.1)"),
        "{}",
        text(&o)
    );
    let (o, wall) = mpirun(2, &out, &flags, &[]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("libcuda.so.1"), "{}", text(&o));
    assert!(!text(&o).contains("panicked"), "{}", text(&o));
    assert!(wall < Duration::from_secs(60), "took {wall:?}");
}

/// Interleaved 1F1B and ZB-V under MPI: each rank runs its group's chunks, messages between two
/// chunks of one rank stay in the rank, and rank 0 collects every chunk's parameters for
/// `--check` (under ZB-V, the LSTM's weights two chunks of a rank read, stepped once).
#[test]
fn mpi_interleaved_chunks_pass_check() {
    for (model, planner, schedule) in [
        ("inception_mini.onnx", "straight", "interleaved-3"),
        ("lstm_tiny.onnx", "bapipe", "zbv"),
    ] {
        let dir = tempdir();
        let out = dir.path().join("out");
        compile(
            model,
            &out,
            &[
                "--cluster",
                "cpu",
                "--devices",
                "2",
                "--planner",
                planner,
                "--batch",
                "8",
                "--schedule",
                schedule,
            ],
        );
        let (o, _) = mpirun(2, &out, &["--steps", "2", "--check"], &[]);
        assert_eq!(o.status.code(), Some(0), "{schedule}: {}", text(&o));
        assert!(max_rel_diff(&o) <= 1e-4, "{schedule}: {}", text(&o));
    }
}
