//! The autodiff pass's bookkeeping on a dev model: outputs, names, annotations, options.

use pipec_compiler::ir::{Attr, Module};
use pipec_passes::autodiff::{differentiate, Autodiff};
use pipec_passes::loss::LossKind;
use std::path::PathBuf;

fn load(name: &str) -> Module {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../onnx-models/{name}.onnx"));
    let mut m = pipec_compiler::onnx::import::load(&p).unwrap();
    pipec_compiler::shape::infer_shapes(&mut m).unwrap();
    m
}

#[test]
fn outputs_names_and_annotations() {
    let mut m = load("resnet18");
    let t = differentiate(&mut m, &Autodiff::default()).unwrap();
    pipec_compiler::verify::verify(&m).unwrap();
    let g = &m.graph;
    // loss first, then the model output, then one gradient per parameter (62 = all float
    // initializers minus the 40 BN running stats).
    assert_eq!(g.name(g.outputs[0]), "loss");
    assert_eq!(g.ty(g.outputs[0]).rank(), Some(0));
    assert_eq!(g.name(g.outputs[1]), "logits");
    assert_eq!(t.grads.len(), 62);
    assert_eq!(g.outputs.len(), 2 + 62);
    for (p, gv) in &t.grads {
        assert_eq!(g.name(*gv), format!("grad/{}", g.name(*p)));
        assert_eq!(g.ty(*gv), g.ty(*p), "gradient type of {}", g.name(*p));
        assert!(!g.name(*p).contains("running"));
    }
    // Every op has a phase; MaxPool got its indices and they are saved.
    for &op in &g.order {
        assert!(
            g.ops[op].attrs.contains_key("pipec.phase"),
            "{}",
            g.ops[op].name
        );
    }
    let mp = g
        .order
        .iter()
        .find(|o| g.ops[**o].op_type == "MaxPool")
        .unwrap();
    assert_eq!(g.ops[*mp].outputs.len(), 2);
    assert_eq!(
        g.ops[*mp].attrs.get("pipec.saved"),
        Some(&Attr::Ints(vec![0, 1])) // its result feeds a Conv (dW reads it), and the indices
    );
    match m.attrs.get("pipec.saved") {
        Some(Attr::Strings(s)) => assert_eq!(s.len(), t.saved.len()),
        other => panic!("pipec.saved: {other:?}"),
    }
}

#[test]
fn gradients_with_respect_to_inputs() {
    let mut m = load("mlp4");
    let t = differentiate(
        &mut m,
        &Autodiff::with_loss(Some(LossKind::Sum)).wrt_inputs(true),
    )
    .unwrap();
    let g = &m.graph;
    let (_, gi) = t.grads.iter().find(|(p, _)| g.name(*p) == "input").unwrap();
    assert_eq!(g.name(*gi), "grad/input");
    assert_eq!(g.ty(*gi), g.ty(g.inputs[0]));
}

#[test]
fn integer_paths_are_cut_and_tied_weights_get_one_gradient() {
    let mut m = load("gpt2_tiny");
    let t = differentiate(&mut m, &Autodiff::default()).unwrap();
    let g = &m.graph;
    let wte: Vec<_> = t
        .grads
        .iter()
        .filter(|(p, _)| g.name(*p) == "transformer.wte.weight")
        .collect();
    assert_eq!(wte.len(), 1);
    // Cross-entropy adds the label input.
    let mut m = load("gpt2_tiny");
    differentiate(
        &mut m,
        &Autodiff::with_loss(Some("cross-entropy:labels".parse().unwrap())),
    )
    .unwrap();
    let lab = m
        .graph
        .inputs
        .iter()
        .find(|v| m.graph.name(**v) == "labels")
        .unwrap();
    assert_eq!(
        pipec_compiler::ir::fmt_type(m.graph.ty(*lab)),
        "int64[batch,32]"
    );
    pipec_compiler::verify::verify(&m).unwrap();
}

/// Opsets 7..12 are upgraded to 17 first (the training graph declares 17); older ones are
/// refused with the opset named.
#[test]
fn old_opsets_are_upgraded_or_refused() {
    let mut m = load("mlp4");
    m.opset_imports.insert(String::new(), 11);
    differentiate(&mut m, &Autodiff::default()).unwrap();
    assert_eq!(m.opset(), 17);
    pipec_compiler::verify::verify(&m).unwrap();
    let mut m = load("mlp4");
    m.opset_imports.insert(String::new(), 6);
    let e = differentiate(&mut m, &Autodiff::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("opset 6") && e.contains("from opset 7 on"),
        "{e}"
    );
}

/// Training-mode Dropout: the forward op gets its mask result and `dX = dY * mask / (1 - r)`.
/// (Random, so not a finite-difference case: checked as `grad * x == y` with the sum loss.)
#[test]
fn training_dropout_uses_the_saved_mask() {
    use pipec_compiler::ir::{DType, Graph, OpData, TensorData, TensorType};
    if !std::process::Command::new("python3")
        .args(["-c", "import onnxruntime"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
    {
        return;
    }
    let mut g = Graph::new("dropout");
    let xs: Vec<f32> = (0..20).map(|i| 0.5 + i as f32 * 0.1).collect();
    let x = g.add_initializer("x", TensorData::from_f32(vec![4, 5], &xs));
    let r = g.add_initializer("r", TensorData::from_f32(vec![], &[0.3]));
    let t = g.add_initializer(
        "t",
        TensorData::from_raw(DType::Bool, vec![], vec![1u8].into()).unwrap(),
    );
    let (_, outs) = g.add_op(
        OpData {
            name: "drop".into(),
            op_type: "Dropout".into(),
            inputs: vec![Some(x), Some(r), Some(t)],
            attrs: [("seed".to_string(), Attr::Int(7))].into_iter().collect(),
            ..Default::default()
        },
        vec![("y".into(), TensorType::unranked(DType::F32))],
    );
    g.outputs = vec![outs[0]];
    let mut m = Module {
        graph: g,
        opset_imports: [(String::new(), 17)].into_iter().collect(),
        ir_version: 8,
        ..Default::default()
    };
    let tg = differentiate(&mut m, &Autodiff::with_loss(Some(LossKind::Sum))).unwrap();
    pipec_compiler::verify::verify(&m).unwrap();
    // The ratio is a float initializer but not differentiable: only x gets a gradient.
    assert_eq!(tg.grads.len(), 1);
    let res = pipec_runtime::run_graph(&m, &[]).unwrap();
    let get = |k: &str| {
        res.iter()
            .find(|(n, _)| n == k)
            .unwrap()
            .1
            .to_f64_vec()
            .unwrap()
    };
    let (y, gx) = (get("y"), get("grad/x"));
    let mut dropped = 0;
    for i in 0..20 {
        assert!(
            (gx[i] * xs[i] as f64 - y[i]).abs() < 1e-5,
            "{i}: {} vs {}",
            gx[i],
            y[i]
        );
        assert!(gx[i] == 0.0 || (gx[i] - 1.0 / 0.7).abs() < 1e-5);
        dropped += (gx[i] == 0.0) as usize;
    }
    assert!(dropped > 0 && dropped < 20, "dropped {dropped} of 20");
}

#[test]
fn pass_specs_with_options() {
    use pipec_passes::lookup_spec;
    let mut m = load("mlp4");
    let p = lookup_spec("autodiff{loss=sum wrt-inputs=true}").unwrap();
    let mut st = pipec_compiler::passmgr::Stats::default();
    p.run(&mut m, &mut st).unwrap();
    assert_eq!(st.get("params"), 9);
    let o = lookup_spec("optimizer{type=adam lr=0.01 micro-batches=4}").unwrap();
    o.run(&mut m, &mut st).unwrap();
    assert!(m
        .graph
        .inputs
        .iter()
        .any(|v| m.graph.name(*v) == "grad_acc/net.0.weight"));
    assert!(lookup_spec("autodiff{loss=hinge}").is_err());
    assert!(lookup_spec("autodiff{bogus=1}").is_err());
    assert!(lookup_spec("optimizer{type=sgd momentum=x}").is_err());
    assert!(lookup_spec("dce{x=1}").is_err());
    assert!(lookup_spec("dce").is_ok());
}
