//! Insta snapshots (kept in `snapshots/`) of the IR of every bundled model after import and after
//! each pass of `shape-infer,fold-constants,dce`. Review changes with `cargo insta review`.

mod common;
use common::*;
use pipec_compiler::passmgr::{PassManager, PrintIr};

fn snapshot(name: &str, text: &str) {
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false, omit_expression => true}, {
        insta::assert_snapshot!(name, text);
    });
}

#[test]
fn ir_after_import_and_each_pass() {
    for name in DEV_MODELS {
        let path = model(&format!("{name}.onnx"));
        let mut m = pipec_compiler::onnx::import::load(&path).unwrap();
        pipec_compiler::shape::infer_shapes(&mut m).unwrap();
        snapshot(
            &format!("{name}.00-import"),
            &pipec_compiler::text::print(&m),
        );
        let passes = ["shape-infer", "fold-constants", "dce"]
            .iter()
            .map(|p| pipec_passes::lookup(p).unwrap())
            .collect();
        let mut pm = PassManager::new(passes);
        pm.print_ir = PrintIr::AfterAll;
        let mut dumps = Vec::new();
        pm.run(&mut m, &mut |pass, m| {
            dumps.push((pass.to_string(), pipec_compiler::text::print(m)))
        })
        .unwrap();
        for (i, (pass, text)) in dumps.iter().enumerate() {
            snapshot(&format!("{name}.{:02}-{pass}", i + 1), text);
        }
    }
}

/// The GraphPipe passes' annotations (`pipec.sp_unit`, `pipec.stage`, per-stage devices and
/// in-flight counts; summit, 4 devices, batch 32) on every dev model.
#[test]
fn ir_after_gpp_passes() {
    for name in DEV_MODELS {
        let path = model(&format!("{name}.onnx"));
        let mut m = pipec_compiler::onnx::import::load(&path).unwrap();
        pipec_compiler::shape::infer_shapes(&mut m).unwrap();
        let passes = [
            "shape-infer",
            "fold-constants",
            "dce",
            "sp-decompose",
            "partition-gpp",
            "schedule-gpp",
        ]
        .iter()
        .map(|p| pipec_passes::lookup(p).unwrap())
        .collect();
        let pm = PassManager::new(passes);
        pm.run(&mut m, &mut |_, _| {}).unwrap();
        snapshot(
            &format!("{name}.gpp-schedule-gpp"),
            &pipec_compiler::text::print(&m),
        );
    }
}
