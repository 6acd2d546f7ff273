//! pipec as a library: `pipec::driver::compile` and `pipec::artifact` give a build pipeline the
//! same OUTDIR as the CLI, byte for byte.

mod common;

use common::{model, tempdir};
use pipec::artifact::OutDir;
use pipec::driver::{self, CompileOptions};

#[test]
fn library_compile_writes_the_cli_outdir() {
    let t = tempdir();
    let m = model("gpt2_tiny.onnx");
    let cli_out = t.path().join("cli");
    let mut flags = common::README_CONFIG.to_vec();
    flags.extend_from_slice(&["--planner", "gpp"]);
    common::compile("gpt2_tiny.onnx", &cli_out, &flags);

    let cluster = driver::resolve_cluster("cpu", None, Some(4)).unwrap();
    let mut opts = CompileOptions::new("gpp", cluster, 8);
    opts.set_micro_batch(Some(2)).unwrap();
    opts.set_optimizer("adam:lr=0.001").unwrap();
    opts.keep_ir = true;
    let steps = std::sync::Mutex::new(Vec::new());
    let out = driver::compile(&m, &opts, &|s| steps.lock().unwrap().push(s.to_string())).unwrap();
    let lib_out = t.path().join("lib");
    out.artifact.write(&lib_out).unwrap();

    common::assert_same_files(&cli_out, &lib_out, "the CLI's OUTDIR vs the library's");
    // The IR snapshots start with the import and end with the pieces.
    assert_eq!(out.ir[0].0, "import");
    assert!(
        out.ir.iter().any(|(l, _)| l == "reference-train"),
        "{:?}",
        out.ir.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    let steps = steps.into_inner().unwrap();
    assert!(
        steps[0].starts_with("planning with gpp on 4 devices"),
        "{steps:?}"
    );

    // Read back: the program and the typed plan.
    let od = OutDir::open(&lib_out).unwrap();
    assert_eq!(od.version, pipec::artifact::FORMAT_VERSION);
    assert_eq!(od.program.devices.len(), 4);
    let plan = od.plan.expect("plan.json reads back as a Plan");
    assert_eq!(plan.stages, out.artifact.plan.stages);
    assert_eq!(od.cluster.expect("cluster.json"), out.artifact.cluster);
}

/// `pipec compile` is a declared pipeline on the pass manager: its steps in order, each with a
/// contract the manager checks (a step whose input no earlier step made is refused by name).
#[test]
fn compile_runs_its_steps_on_the_pass_manager() {
    use pipec_compiler::passmgr::{PassManager, PrintIr};
    let names: Vec<&str> = driver::pipeline().iter().map(|p| p.name()).collect();
    assert_eq!(
        names,
        [
            "import",
            "plan",
            "partition",
            "stage-pieces",
            "reference",
            "insert-comm",
            "verify-program"
        ]
    );
    let m = model("mlp4.onnx");
    let cluster = driver::resolve_cluster("cpu", None, Some(2)).unwrap();
    let opts = CompileOptions::new("straight", cluster, 4);

    // Without `plan`, `partition` is refused before it runs.
    let mut steps = driver::pipeline();
    steps.remove(1);
    let pm = PassManager::new(steps);
    let mut st = driver::CompileState::new(&m, &opts, &|_| {});
    let e = pm.run(&mut st, &mut |_, _, _| {}).unwrap_err().to_string();
    assert_eq!(
        e,
        "pass 'partition': needs the compile product 'plan' (run plan first)"
    );

    // The whole pipeline: every step's IR handed to the printer, labelled, in order; per-step
    // statistics as declared.
    let mut labels: Vec<(String, String)> = Vec::new();
    let (st, records) =
        driver::run_pipeline(&m, &opts, &|_| {}, PrintIr::AfterAll, &mut |s, l, _| {
            labels.push((s.to_string(), l.to_string()))
        })
        .unwrap();
    let steps: Vec<&str> = records.iter().map(|r| r.name).collect();
    assert_eq!(steps, names);
    assert_eq!(labels[0], ("import".into(), "import".into()));
    assert_eq!(labels[1], ("partition".into(), "partition".into()));
    assert!(
        labels.contains(&("stage-pieces".into(), "training-s1".into())),
        "{labels:?}"
    );
    assert!(
        labels.contains(&("stage-pieces".into(), "stages-s0-fwd".into())),
        "{labels:?}"
    );
    assert_eq!(
        labels.last().unwrap(),
        &("reference".to_string(), "reference-step".to_string())
    );
    assert_eq!(records[2].stats.get("stages"), 2);
    let art = st.into_artifact().unwrap();
    let instrs: usize = art
        .compiled
        .program
        .devices
        .iter()
        .map(|d| d.instructions.len())
        .sum();
    assert_eq!(records[5].stats.get("instructions"), instrs as u64);
}
