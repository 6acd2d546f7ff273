//! BaPipe's intra-layer split, emitted end to end: `pipec plan` / `pipec compile --planner bapipe`
//! on mlp4 over 2 fast + 2 slow devices split a boundary Gemm by output channels, put the halves
//! in different stages, and the program trains exactly like the unsplit model.

mod common;

use common::{model, pipec_ok, root, tempdir};
use std::path::Path;

fn cluster() -> String {
    root()
        .join("passes/tests/data/hetero-2fast-2slow.toml")
        .display()
        .to_string()
}

fn compile(planner: &str, out: &Path) -> serde_json::Value {
    let c = cluster();
    let flags = [
        "--cluster",
        &c,
        "--planner",
        planner,
        "--batch",
        "8",
        "--micro-batch",
        "2",
    ];
    common::compile("mlp4.onnx", out, &flags);
    let text = std::fs::read_to_string(out.join("plan.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn read_npz(p: &Path) -> Vec<(String, pipec_runtime::Tensor)> {
    pipec_runtime::npz::read(p).unwrap()
}

#[test]
fn bapipe_emits_the_split_and_trains_like_the_unsplit_model() {
    let t = tempdir();
    let out = t.path().join("o");
    let plan = compile("bapipe", &out);
    let splits = plan["intra_splits"].as_array().unwrap();
    assert!(!splits.is_empty(), "{plan:#}");
    let stage_of = |n: &str| {
        plan["stages"]
            .as_array()
            .unwrap()
            .iter()
            .position(|s| s["nodes"].as_array().unwrap().iter().any(|x| x == n))
    };
    for s in splits {
        let nodes: Vec<&str> = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let (from, to) = (
            s["from_stage"].as_u64().unwrap(),
            s["to_stage"].as_u64().unwrap(),
        );
        assert_ne!(from, to);
        assert_eq!(stage_of(nodes[0]), Some(from as usize), "{s}");
        assert_eq!(stage_of(nodes[1]), Some(to as usize), "{s}");
        assert_eq!(s["op"], "Gemm");
        let ch = s["channels"].as_array().unwrap();
        assert!(ch.iter().all(|c| c.as_u64().unwrap() >= 1));
    }
    // weights.npz holds the halves, not the original.
    let w = read_npz(&out.join("weights.npz"));
    let first = &splits[0]["params"][0];
    let name = first["name"].as_str().unwrap();
    assert!(w.iter().all(|(k, _)| k != name));
    assert!(w
        .iter()
        .any(|(k, _)| k == first["parts"][0].as_str().unwrap()));
    // `pipec plan` reports the same split.
    let (m, c) = (model("mlp4.onnx"), cluster());
    let so = pipec_ok(&[
        "plan",
        m.to_str().unwrap(),
        "--cluster",
        &c,
        "--planner",
        "bapipe",
        "--batch",
        "8",
        "--micro-batch",
        "2",
        "--json",
    ]);
    let p2: serde_json::Value = serde_json::from_str(&so).unwrap();
    assert_eq!(p2["intra_splits"], plan["intra_splits"]);
    assert_eq!(p2["stages"], plan["stages"]);

    // --check against the (split) reference, and -o under the original names.
    let params = t.path().join("p.npz");
    let so = pipec_ok(&[
        "run",
        out.to_str().unwrap(),
        "--steps",
        "3",
        "--check",
        "-o",
        params.to_str().unwrap(),
    ]);
    assert!(so.contains("check ok"), "{so}");
    // The same training on the unsplit model (whole layers) gives the same parameters.
    let out2 = t.path().join("whole");
    let plan2 = compile("straight", &out2);
    assert_eq!(plan2["intra_splits"].as_array().map(Vec::len), Some(0));
    let params2 = t.path().join("p2.npz");
    pipec_ok(&[
        "run",
        out2.to_str().unwrap(),
        "--steps",
        "3",
        "-o",
        params2.to_str().unwrap(),
    ]);
    let (a, b) = (read_npz(&params), read_npz(&params2));
    let names =
        |v: &[(String, pipec_runtime::Tensor)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
    let (mut na, mut nb) = (names(&a), names(&b));
    na.sort();
    nb.sort();
    assert_eq!(na, nb, "-o names the model's parameters");
    for (k, ta) in &a {
        let tb = &b.iter().find(|x| &x.0 == k).unwrap().1;
        let (abs, max_ref) = pipec_runtime::tensor::max_abs_diff(ta, tb).unwrap();
        assert!(
            abs <= 1e-5 * max_ref.max(1e-30),
            "{k}: max abs diff {abs} (max |ref| {max_ref})"
        );
    }
}
