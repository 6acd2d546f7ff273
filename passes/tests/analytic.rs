//! The analytic cost model on hand-built IR.

use pipec_compiler::ir::{Attr, DType, Dim, Module, OpData, TensorData, TensorType};
use pipec_passes::cost::analytic::{from_module, AnalyticOptions};
use pipec_passes::cost::cluster::{h100_80gb, v100_16gb, Cluster};
use pipec_passes::cost::Work;
use pipec_passes::plan::PlanOptions;
use pipec_passes::planners::by_name;
use std::collections::BTreeMap;

fn op(name: &str, ty: &str, inputs: Vec<pipec_compiler::ir::Value>) -> OpData {
    OpData {
        name: name.into(),
        op_type: ty.into(),
        inputs: inputs.into_iter().map(Some).collect(),
        ..Default::default()
    }
}

/// input [batch, 64] → Gemm(64→128) → Relu → MatMul(128→10) → Softmax.
fn mlp(dtype: DType) -> Module {
    let mut m = Module::default();
    let g = &mut m.graph;
    let x = g.add_input(
        "x",
        TensorType::new(dtype, vec![Dim::sym("batch"), Dim::Known(64)]),
    );
    let w1 = g.add_initializer(
        "w1",
        TensorData::from_f32(vec![64, 128], &vec![0.0; 64 * 128]),
    );
    let b1 = g.add_initializer("b1", TensorData::from_f32(vec![128], &[0.0; 128]));
    let w2 = g.add_initializer("w2", TensorData::from_f32(vec![128, 10], &vec![0.0; 1280]));
    let bt = |n: i64| TensorType::new(dtype, vec![Dim::sym("batch"), Dim::Known(n)]);
    let (_, h) = g.add_op(
        op("fc1", "Gemm", vec![x, w1, b1]),
        vec![("h".into(), bt(128))],
    );
    let (_, r) = g.add_op(op("relu", "Relu", vec![h[0]]), vec![("r".into(), bt(128))]);
    let (_, y) = g.add_op(
        op("fc2", "MatMul", vec![r[0], w2]),
        vec![("y".into(), bt(10))],
    );
    let (_, p) = g.add_op(op("sm", "Softmax", vec![y[0]]), vec![("p".into(), bt(10))]);
    g.outputs.push(p[0]);
    m
}

fn counted(w: &Work) -> (f64, f64, f64) {
    match w {
        Work::Counted {
            fwd_flops,
            bwd_flops,
            fwd_bytes,
            ..
        } => (*fwd_flops, *bwd_flops, *fwd_bytes),
        Work::Measured { .. } => panic!("not counted"),
    }
}

#[test]
fn mlp_flops_bytes_and_backward_factors() {
    let mut opts = AnalyticOptions::default();
    opts.dims.insert("batch".into(), 4);
    let g = from_module(&mlp(DType::F32), &opts, "mlp").expect("cost graph");
    assert_eq!(g.len(), 4);
    assert_eq!(g.reference_batch, 4.0);
    let fc1 = g.node_by_name("fc1").expect("fc1");
    let (f, b, bytes) = counted(&g.nodes[fc1].work);
    assert_eq!(f, 2.0 * 4.0 * 128.0 * 64.0 + 4.0 * 128.0);
    assert_eq!(b, 2.0 * f, "matmul-like backward is 2x");
    assert_eq!(
        bytes,
        (4.0 * 64.0 + 4.0 * 128.0) * 4.0,
        "activation traffic in + out"
    );
    assert_eq!(g.nodes[fc1].parameter_bytes, (64.0 * 128.0 + 128.0) * 4.0);
    let relu = g.node_by_name("relu").expect("relu");
    let (f, b, _) = counted(&g.nodes[relu].work);
    assert_eq!((f, b), (512.0, 512.0), "elementwise backward is 1x");
    let fc2 = g.node_by_name("fc2").expect("fc2");
    assert_eq!(counted(&g.nodes[fc2].work).0, 2.0 * 4.0 * 10.0 * 128.0);
    let sm = g.node_by_name("sm").expect("sm");
    assert_eq!(counted(&g.nodes[sm].work).0, 5.0 * 40.0);
    // Edges carry the values' bytes; activations are the outputs.
    assert_eq!(g.edges.len(), 3);
    assert_eq!(g.edges[0].bytes, 4.0 * 128.0 * 4.0);
    // Roofline: fc1 on a V100 is memory-bound at batch 4 (weights dominate).
    let v = v100_16gb();
    let (tf, _) = g.times(fc1, 4.0, &v);
    let want =
        ((4.0 * 64.0 + 4.0 * 128.0) * 4.0 + (64.0 * 128.0 + 128.0) * 4.0) / v.memory_bandwidth;
    assert!((tf - want).abs() < 1e-15, "{tf} vs {want}");
    // Large batches become compute-bound and scale linearly.
    let (t1, _) = g.times(fc1, 1e6, &v);
    let (t2, _) = g.times(fc1, 2e6, &v);
    assert!((t2 / t1 - 2.0).abs() < 1e-9);
}

#[test]
fn dtype_aware_peaks() {
    let g32 = from_module(&mlp(DType::F32), &AnalyticOptions::default(), "mlp").expect("f32");
    let g16 = from_module(&mlp(DType::F16), &AnalyticOptions::default(), "mlp").expect("f16");
    let h = h100_80gb();
    let fc1 = g32.node_by_name("fc1").expect("fc1");
    // f16 halves the bytes (memory-bound at f16 on a real H100) and f32 is at its compute peak.
    let (t32, _) = g32.times(fc1, 1e7, &h);
    let (t16, _) = g16.times(fc1, 1e7, &h);
    assert!(t16 <= t32 / 2.0 * 1.0001, "{t16} vs {t32}");
    // With unlimited bandwidth it is compute-bound: f16 runs at the tensor-core peak.
    let mut fast = h.clone();
    fast.memory_bandwidth = 1e30;
    let (t32, _) = g32.times(fc1, 1e7, &fast);
    let (t16, _) = g16.times(fc1, 1e7, &fast);
    assert!((t32 / t16 - 989.0 / 67.0).abs() < 1e-6, "{t16} vs {t32}");
}

#[test]
fn conv_and_pool_counts() {
    let mut m = Module::default();
    let g = &mut m.graph;
    let f = DType::F32;
    let x = g.add_input("x", TensorType::known(f, &[2, 3, 32, 32]));
    let w = g.add_initializer("w", TensorData::from_f32(vec![16, 3, 3, 3], &[0.0; 432]));
    let mut c = op("conv", "Conv", vec![x, w]);
    c.attrs.insert("pads".into(), Attr::Ints(vec![1, 1, 1, 1]));
    let (_, y) = g.add_op(
        c,
        vec![("y".into(), TensorType::known(f, &[2, 16, 32, 32]))],
    );
    let mut p = op("pool", "MaxPool", vec![y[0]]);
    p.attrs
        .insert("kernel_shape".into(), Attr::Ints(vec![2, 2]));
    let (_, z) = g.add_op(
        p,
        vec![("z".into(), TensorType::known(f, &[2, 16, 16, 16]))],
    );
    let (_, s) = g.add_op(
        op("flat", "Flatten", vec![z[0]]),
        vec![("s".into(), TensorType::known(f, &[2, 4096]))],
    );
    g.outputs.push(s[0]);
    let cg = from_module(
        &m,
        &AnalyticOptions {
            dims: BTreeMap::new(),
            ..AnalyticOptions::default()
        },
        "conv",
    )
    .expect("graph");
    assert_eq!(cg.reference_batch, 2.0);
    let (fc, bc, _) = counted(&cg.nodes[0].work);
    assert_eq!(fc, 2.0 * (2.0 * 16.0 * 32.0 * 32.0) * 3.0 * 9.0);
    assert_eq!(bc, 2.0 * fc);
    assert_eq!(counted(&cg.nodes[1].work).0, 2.0 * 16.0 * 16.0 * 16.0 * 4.0);
    // Flatten is a view: no work, nothing saved.
    assert_eq!(counted(&cg.nodes[2].work), (0.0, 0.0, 0.0));
    assert_eq!(cg.nodes[2].saved_bytes, 0.0);
    // Planners work on analytic graphs too.
    let cl = Cluster::preset("bapipe-pcie")
        .expect("preset")
        .take(2)
        .expect("2");
    for p in ["straight", "dp"] {
        let plan = by_name(p)
            .expect(p)
            .plan(&cg, &cl, &PlanOptions::new(8))
            .expect("plan");
        plan.verify(&cg, &cl).expect("verify");
        assert!(plan.iteration_time_s > 0.0);
    }
}

/// The planning graph's saved activations are what the emitted backward reads of the forward,
/// not every output: on x → Gemm → Relu → MatMul → Softmax the backward reads x (the Gemm's
/// weight gradient), one of the Relu's tensors (its mask), the MatMul's input r (weight
/// gradient) and the Softmax output (its gradient and the loss), never the Gemm's or MatMul's
/// own outputs beyond that.
#[test]
fn saved_bytes_are_what_backward_reads() {
    use pipec_passes::cost::analytic::planning_graph;
    let m = mlp(DType::F32);
    let opts = AnalyticOptions {
        dims: BTreeMap::from([("batch".to_string(), 8)]),
        ..AnalyticOptions::default()
    };
    let (g, note) = planning_graph(&m, &opts, "mlp").expect("planning graph");
    assert!(note.is_none(), "{note:?}");
    let saved: Vec<(String, f64)> = g
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.saved_bytes / 8.0 / 4.0))
        .collect();
    let all_outputs: f64 = g.nodes.iter().map(|n| n.activation_bytes).sum();
    let total: f64 = g.nodes.iter().map(|n| n.saved_bytes).sum();
    // Floats per sample: x 64, h or r 128 (the Relu's mask), r 128 (MatMul's dW), p 10.
    assert!(
        total < all_outputs + 8.0 * 64.0 * 4.0,
        "saved {saved:?} vs outputs {all_outputs}"
    );
    let get = |name: &str| saved.iter().find(|s| s.0 == name).map(|s| s.1).unwrap();
    assert_eq!(get("fc1"), 64.0, "{saved:?}");
    assert!(get("sm") >= 10.0, "{saved:?}");
    assert!(get("relu") + get("fc2") >= 128.0, "{saved:?}");
    assert!(total / 32.0 <= 64.0 + 128.0 * 2.0 + 10.0 * 2.0, "{saved:?}");
}

/// What does not grow with the batch stays fixed (a tied LM head: `Transpose(W)` feeding a
/// `MatMul`, as GPT-2 exports `wte`): the edge carrying `Wᵀ` has fixed bytes only, the
/// `Transpose`'s forward is fixed work, the `MatMul`'s grows. A `Split`'s outputs cross as
/// separate values (one bit each), so a consumer stage reading three of them pays three
/// messages, as codegen sends them.
#[test]
fn fixed_values_and_output_sets() {
    let mut m = Module::default();
    let g = &mut m.graph;
    let bt = |n: i64| TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(n)]);
    let x = g.add_input("x", bt(96));
    let w = g.add_initializer("w", TensorData::from_f32(vec![50, 32], &[0.0; 1600]));
    let mut split = op("split", "Split", vec![x]);
    split.attrs.insert("axis".into(), Attr::Int(1));
    split.attrs.insert("num_outputs".into(), Attr::Int(3));
    let (_, parts) = g.add_op(
        split,
        vec![
            ("a".into(), bt(32)),
            ("b".into(), bt(32)),
            ("c".into(), bt(32)),
        ],
    );
    let (_, ab) = g.add_op(
        op("add", "Add", vec![parts[0], parts[1]]),
        vec![("ab".into(), bt(32))],
    );
    let (_, abc) = g.add_op(
        op("mul", "Mul", vec![ab[0], parts[2]]),
        vec![("abc".into(), bt(32))],
    );
    let (_, wt) = g.add_op(
        op("transpose", "Transpose", vec![w]),
        vec![(
            "wt".into(),
            TensorType::new(DType::F32, vec![Dim::Known(32), Dim::Known(50)]),
        )],
    );
    let (_, y) = g.add_op(
        op("head", "MatMul", vec![abc[0], wt[0]]),
        vec![("y".into(), bt(50))],
    );
    g.outputs.push(y[0]);
    let opts = AnalyticOptions {
        dims: BTreeMap::new(),
        ..AnalyticOptions::default()
    };
    let cg = from_module(&m, &opts, "t").expect("cost graph");
    let id = |n: &str| cg.nodes.iter().position(|x| x.name == n).unwrap();
    let edge = |a: &str, b: &str| {
        cg.edges
            .iter()
            .find(|e| e.src == id(a) && e.dst == id(b))
            .unwrap_or_else(|| panic!("no edge {a} -> {b}"))
    };
    let e = edge("transpose", "head");
    assert_eq!((e.bytes, e.fixed_bytes), (0.0, 32.0 * 50.0 * 4.0), "{e:?}");
    let e = edge("mul", "head");
    assert_eq!((e.bytes, e.fixed_bytes), (32.0 * 4.0, 0.0), "{e:?}");
    // Both outputs a and b on one edge, c on another.
    assert_eq!(edge("split", "add").outputs, 0b011);
    assert_eq!(edge("split", "mul").outputs, 0b100);
    // At batch 1 and 64: the transpose costs the same, the MatMul 64 times its FLOPs.
    let kind = h100_80gb();
    let (t1, t64) = (
        cg.fwd_time(id("transpose"), 1.0, &kind),
        cg.fwd_time(id("transpose"), 64.0, &kind),
    );
    assert!(t1 > 0.0 && (t64 - t1).abs() < 1e-15, "{t1} {t64}");
    assert_eq!(
        cg.edge_bytes(
            cg.edges
                .iter()
                .position(|e| e.src == id("transpose"))
                .unwrap(),
            64.0
        ),
        32.0 * 50.0 * 4.0
    );
    match &cg.nodes[id("head")].work {
        Work::Counted {
            fwd_flops,
            fwd_fixed_flops,
            ..
        } => assert!(*fwd_flops > 0.0 && *fwd_fixed_flops == 0.0),
        Work::Measured { .. } => panic!("not counted"),
    }
}

/// The planning graph holds what the training program computes and sends: a second output the
/// loss never reads (`aux = Relu(h)`) gets no work and no incoming edge, and `h`'s edge into it
/// carries no cotangent; the edge into the loss's path does.
#[test]
fn planning_graph_drops_what_the_loss_never_reads() {
    use pipec_passes::cost::analytic::planning_graph;
    let mut m = mlp(DType::F32);
    let g = &mut m.graph;
    let h = g.ops[g.order[0]].outputs[0];
    let bt = TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(128)]);
    let (_, aux) = g.add_op(op("aux", "Relu", vec![h]), vec![("aux".into(), bt)]);
    g.outputs.push(aux[0]);
    let opts = AnalyticOptions {
        dims: BTreeMap::from([("batch".to_string(), 8)]),
        ..AnalyticOptions::default()
    };
    let (pg, note) = planning_graph(&m, &opts, "mlp").expect("planning graph");
    assert!(note.is_none(), "{note:?}");
    let aux = pg.node_by_name("aux").expect("aux node");
    let relu = pg.node_by_name("relu").expect("relu node");
    assert_eq!(counted(&pg.nodes[aux].work), (0.0, 0.0, 0.0));
    assert!(
        pg.in_edges(aux).is_empty(),
        "nothing is sent to a node that leads nowhere"
    );
    let into_relu = pg.in_edges(relu);
    assert!(!into_relu.is_empty() && into_relu.iter().all(|&e| pg.edges[e].cotangent));
    // A piece of a compiled program runs every op: from_module keeps them all by default.
    let full = from_module(&m, &opts, "mlp").expect("graph");
    let aux_full = full.node_by_name("aux").expect("aux");
    assert!(counted(&full.nodes[aux_full].work).2 > 0.0);
    assert!(!full.in_edges(aux_full).is_empty());
    assert!(full
        .in_edges(aux_full)
        .iter()
        .all(|&e| !full.edges[e].cotangent));
}

/// Weight-gradient kernels (the zero-bubble schedules' `W`): a matmul's `dW = Xᵀ·dY` is `W`,
/// its `dX = dY·Wᵀ` is `B`; a node without parameters has no `W`; the bias gradient (a sum of
/// `dY` over the batch) is `W` too.
#[test]
fn weight_gradient_kernels_are_w() {
    use pipec_passes::cost::analytic::planning_graph;
    let m = mlp(DType::F32);
    let opts = AnalyticOptions {
        dims: BTreeMap::from([("batch".to_string(), 64)]),
        ..AnalyticOptions::default()
    };
    let (g, note) = planning_graph(&m, &opts, "mlp").expect("planning graph");
    assert!(note.is_none(), "{note:?}");
    let kind = h100_80gb();
    let node = |name: &str| g.nodes.iter().position(|n| n.name == name).unwrap();
    let kernels = |n: usize| match &g.nodes[n].work {
        Work::Counted { bwd_kernels, .. } => bwd_kernels.clone(),
        Work::Measured { .. } => panic!("not counted"),
    };
    // fc2 = MatMul(r, w2): dW (weight) and dX (not).
    let fc2 = kernels(node("fc2"));
    let flops = |w: bool| -> f64 { fc2.iter().filter(|k| k.weight == w).map(|k| k.flops).sum() };
    assert_eq!(flops(true), flops(false), "{fc2:?}");
    assert!(flops(true) > 0.0);
    // relu: no parameter, no W.
    assert_eq!(g.weight_time(node("relu"), 64.0, &kind), 0.0);
    assert!(kernels(node("relu")).iter().all(|k| !k.weight));
    // fc1 = Gemm(x, w1, b1) on the data input: its dX is never needed, every kernel left is W.
    let fc1 = node("fc1");
    let (_, b) = g.times(fc1, 64.0, &kind);
    let w = g.weight_time(fc1, 64.0, &kind);
    assert!(w > 0.0 && w <= b * (1.0 + 1e-12), "w {w} b {b}");
    // Split at fc1: the second half's input gradient needs relu's, fc2's and the softmax's
    // `B`; its `W` is fc2's weight gradient, reading fc2's input and the `dY` `B` made.
    let trained = g.trained_nodes();
    let second: Vec<bool> = (0..g.len()).map(|n| n != fc1).collect();
    let w2 = g.weight_part(&second, &trained, 64.0, &kind);
    let fc2n = node("fc2");
    assert!(
        (w2.wgt_s - g.weight_time(fc2n, 64.0, &kind)).abs() < 1e-15,
        "{w2:?}"
    );
    assert!(
        w2.carried_bytes > 0.0 && w2.weight_saved_bytes > 0.0,
        "{w2:?}"
    );
    // fc1 alone sends no input gradient (it reads the data input): its whole backward is `W`,
    // which holds the cotangent of `h` it receives (64 × 128 floats).
    let first: Vec<bool> = (0..g.len()).map(|n| n == fc1).collect();
    let w1 = g.weight_part(&first, &trained, 64.0, &kind);
    assert_eq!(w1.wgt_s, b, "{w1:?}");
    assert_eq!(w1.carried_bytes, 64.0 * 128.0 * 4.0);
}
