//! The layering ARCHITECTURE.md states, checked on the source.

mod common;

/// No import circle between the modules of `passes/`, not even between a parent module and its
/// own children (`scripts/import_cycles.py`; at the start of this work it found one circle of 16
/// modules — partition_gpp, planners, plan, sim, schedule_gpp, sp_decompose, ... — and four
/// parent/child pairs).
#[test]
fn passes_has_no_import_circles() {
    let (ok, out) = common::run_script("import_cycles.py", &[] as &[&str]);
    assert!(ok, "{out}");
    assert!(
        out.contains("0 circles between modules that are not parent and children"),
        "{out}"
    );
    assert!(!out.contains("parent and children:"), "{out}");
    // The folder rules: transforms below the cost model, GraphPipe's passes above the planners.
    assert!(out.contains("\n0 layer violations"), "{out}");
}
