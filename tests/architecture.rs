//! The layering ARCHITECTURE.md states, checked on the source.

mod common;

/// No import circle between the modules of `passes/` other than a parent module and its own
/// children (`scripts/import_cycles.py`; before the GraphPipe split it found one circle of 16
/// modules: partition_gpp, planners, plan, sim, schedule_gpp, sp_decompose, ...).
#[test]
fn passes_has_no_import_circles() {
    let (ok, out) = common::run_script("import_cycles.py", &[] as &[&str]);
    assert!(ok, "{out}");
    assert!(
        out.contains("0 circles between modules that are not parent and children"),
        "{out}"
    );
}
