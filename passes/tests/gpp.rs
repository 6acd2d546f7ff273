//! GraphPipe: SP decomposition of every model, the GPP DP against exhaustive search, the
//! planner on the dev models and the paper's three model families.

use pipec_passes::cost::analytic::{from_module, AnalyticOptions};
use pipec_passes::cost::cluster::Cluster;
use pipec_passes::cost::CostGraph;
use pipec_passes::plan::PlanOptions;
use pipec_passes::planners::gpp::Gpp;
use pipec_passes::planners::Planner;
use pipec_passes::sp_decompose::{check_tree, decompose};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn onnx_graph(path: &Path) -> CostGraph {
    let mut m = pipec_compiler::onnx::import::load(path).expect("import");
    pipec_compiler::shape::infer_shapes(&mut m).expect("shapes");
    from_module(&m, &AnalyticOptions::default(), &path.display().to_string()).expect("cost graph")
}

/// The GraphPipe family models (generated with their sparse weight files when missing).
fn family(name: &str) -> CostGraph {
    let dir = root().join("onnx-models/graphpipe");
    let w = dir.join(format!("{name}.weights"));
    if !w.exists() {
        let st = std::process::Command::new("python3")
            .arg(root().join("scripts/gen_graphpipe_models.py"))
            .arg("--out")
            .arg(&dir)
            .status()
            .expect("python3");
        assert!(st.success(), "gen_graphpipe_models.py failed");
    }
    onnx_graph(&dir.join(format!("{name}.onnx")))
}

#[test]
fn debug_tree() {
    let g = family("mmt");
    let c = Cluster::preset("summit").unwrap().take(8).unwrap();
    let sp = decompose(&g, c.kind_of(0));
    check_tree(&g, &sp).unwrap();
    eprintln!(
        "shape {:?} side {} forced {}",
        sp.shape(),
        sp.side.len(),
        sp.forced_splits
    );
    let (_, ug) = Gpp::default().unit_graph(&g, &c);
    for (i, t) in ug.tree.iter().enumerate() {
        eprintln!("{i}: {:?} {:?} [{}, {})", t.kind, t.children, t.lo, t.hi);
    }
    let _ = (PlanOptions::new(1), Gpp::default().name());
}
