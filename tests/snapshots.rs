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
        pm.run(&mut m, &mut |pass, _, m| {
            dumps.push((pass.to_string(), pipec_compiler::text::print(m)))
        })
        .unwrap();
        for (i, (pass, text)) in dumps.iter().enumerate() {
            snapshot(&format!("{name}.{:02}-{pass}", i + 1), text);
        }
    }
}

/// The training IR (forward + mean-square loss + backward) that `autodiff` makes of every dev
/// model, batch left symbolic.
#[test]
fn training_ir_after_autodiff() {
    for name in DEV_MODELS {
        let path = model(&format!("{name}.onnx"));
        let mut m = pipec_compiler::onnx::import::load(&path).unwrap();
        pipec_compiler::shape::infer_shapes(&mut m).unwrap();
        let pm = PassManager::new(vec![pipec_passes::lookup("autodiff").unwrap()]);
        pm.run(&mut m, &mut |_, _, _| {}).unwrap();
        snapshot(
            &format!("{name}.10-autodiff"),
            &pipec_compiler::text::print(&m),
        );
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
        pm.run(&mut m, &mut |_, _, _| {}).unwrap();
        snapshot(
            &format!("{name}.gpp-schedule-gpp"),
            &pipec_compiler::text::print(&m),
        );
    }
}

/// The GraphPipe passes with their options (`partition-gpp{... schedule=S}`): the module
/// attributes they write for kFkB (`kfkb-2`: in-flight `2 + 2·(depth − 1)`) and for per-stage
/// micro-batch sizes (`gpp-per-stage`: each stage's `micro_batch` and `k`, in-flight counts in
/// the stage's own micro-batches), and the op count per stage.
#[test]
fn gpp_passes_with_schedule_options() {
    for sched in ["kfkb-2", "gpp-per-stage"] {
        let path = model("dlrm_tiny.onnx");
        let mut m = pipec_compiler::onnx::import::load(&path).unwrap();
        pipec_compiler::shape::infer_shapes(&mut m).unwrap();
        // Sizes at which the plans have several stages (smaller micro-batches make one
        // data-parallel stage the fastest plan).
        let (batch, mb) = if sched == "kfkb-2" { (32, 4) } else { (64, 8) };
        let spec = format!(
            "partition-gpp{{cluster=cpu devices=4 batch={batch} micro-batch={mb} schedule={sched}}}"
        );
        let passes = [
            "shape-infer",
            "fold-constants",
            "dce",
            "sp-decompose",
            &spec,
            "schedule-gpp",
        ]
        .iter()
        .map(|p| pipec_passes::lookup_spec(p).unwrap())
        .collect();
        PassManager::new(passes)
            .run(&mut m, &mut |_, _, _| {})
            .unwrap();
        let mut text: Vec<String> = m
            .attrs
            .iter()
            .filter(|(k, _)| {
                k.starts_with("pipec.stage") || *k == "pipec.schedule" || *k == "pipec.micro_batch"
            })
            .map(|(k, v)| format!("{k} = {v:?}"))
            .collect();
        text.sort();
        let mut per_stage = std::collections::BTreeMap::new();
        for &op in &m.graph.order {
            if let Some(s) = m.graph.ops[op].int_attr("pipec.stage") {
                *per_stage.entry(s).or_insert(0usize) += 1;
            }
        }
        text.push(format!("ops per stage: {per_stage:?}"));
        snapshot(&format!("dlrm_tiny.gpp-{sched}"), &text.join("\n"));
    }
}
