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
    opts.micro_batch = Some(2);
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
