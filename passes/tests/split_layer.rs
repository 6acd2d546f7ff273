//! `split_layer`: splitting a Gemm / MatMul / Conv by output channels computes the same function
//! (reference executor on random inputs), keeps the output name, and cuts the parameters.

use pipec_compiler::ir::{Attr, DType, Dim, Module, Op, OpData, TensorData, TensorType};
use pipec_passes::split_layer::split_output_channels;
use pipec_runtime::tensor::max_abs_diff;
use pipec_runtime::Tensor;
use std::collections::BTreeMap;

/// Deterministic pseudo-random values in [-1, 1).
fn rand(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn init(m: &mut Module, name: &str, dims: &[i64], seed: u64) -> pipec_compiler::ir::Value {
    let n = dims.iter().product::<i64>() as usize;
    m.graph
        .add_initializer(name, TensorData::from_f32(dims.to_vec(), &rand(n, seed)))
}

/// One `op_type` node on input `x` (`[batch] ++ x_dims`) with the given constant operands and
/// attributes; shapes inferred.
fn one_node(
    op_type: &str,
    x_dims: &[i64],
    consts: &[(&str, Vec<i64>)],
    attrs: &[(&str, Attr)],
) -> (Module, Op) {
    let mut m = Module::default();
    m.opset_imports.insert(String::new(), 17);
    m.ir_version = 8;
    let mut shape = vec![Dim::sym("batch")];
    shape.extend(x_dims.iter().map(|d| Dim::Known(*d)));
    let x = m.graph.add_input("x", TensorType::new(DType::F32, shape));
    let mut inputs = vec![Some(x)];
    for (i, (name, dims)) in consts.iter().enumerate() {
        inputs.push(Some(init(&mut m, name, dims, 7 + i as u64)));
    }
    let (op, outs) = m.graph.add_op(
        OpData {
            name: "layer".into(),
            op_type: op_type.into(),
            inputs,
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        },
        vec![("y".into(), TensorType::unranked(DType::F32))],
    );
    m.graph.outputs.push(outs[0]);
    pipec_compiler::shape::infer_shapes(&mut m).unwrap();
    (m, op)
}

fn run(m: &Module, x: &Tensor) -> Tensor {
    let mut out = pipec_runtime::exec::run_module(m, &[("x".to_string(), x.clone())]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, "y");
    out.remove(0).1
}

/// Split `op` into `channels`, check the IR, and compare outputs on a random batch of 3.
fn check_equivalent(m: Module, op: Op, x_dims: &[i64], channels: [u64; 2], split_params: &[&str]) {
    let mut dims = vec![3i64];
    dims.extend_from_slice(x_dims);
    let n = dims.iter().product::<i64>() as usize;
    let x = Tensor::from_tensor_data(&TensorData::from_f32(dims, &rand(n, 99))).unwrap();
    let want = run(&m, &x);
    let mut m2 = m.clone();
    let s = split_output_channels(&mut m2, op, channels).unwrap();
    pipec_compiler::verify::verify(&m2).unwrap();
    assert_eq!(s.channels, channels);
    let got_params: Vec<&str> = s.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(got_params, split_params);
    let g = &m2.graph;
    let names: Vec<&str> = g.order.iter().map(|o| g.ops[*o].op_type.as_str()).collect();
    assert_eq!(names.last(), Some(&"Concat"));
    for p in &s.params {
        assert!(!g.values_by_name().contains_key(p.name.as_str()), "{p:?}");
        for part in &p.parts {
            assert!(g.values_by_name().contains_key(part.as_str()), "{part}");
        }
    }
    let got = run(&m2, &x);
    assert_eq!(got.shape(), want.shape());
    let (abs, _) = max_abs_diff(&got, &want).unwrap();
    assert!(abs <= 1e-6, "max abs diff {abs}");
    // The check can fail: a wrong cut (halves swapped) changes the output.
    let mut m3 = m.clone();
    split_output_channels(&mut m3, op, channels).unwrap();
    let c = m3.graph.order[2];
    m3.graph.ops[c].inputs.reverse();
    if channels[0] == channels[1] {
        let (abs, _) = max_abs_diff(&run(&m3, &x), &want).unwrap();
        assert!(abs > 1e-3, "swapped halves should differ");
    }
}

#[test]
fn gemm_trans_b_0_and_1_with_bias() {
    for trans_b in [0, 1] {
        let w = if trans_b == 1 { vec![5, 4] } else { vec![4, 5] };
        let (m, op) = one_node(
            "Gemm",
            &[4],
            &[("W", w), ("C", vec![5])],
            &[("transB", Attr::Int(trans_b)), ("alpha", Attr::Float(0.5))],
        );
        check_equivalent(m, op, &[4], [3, 2], &["W", "C"]);
    }
    // A bias broadcast over the channels is shared, not cut.
    let (m, op) = one_node(
        "Gemm",
        &[4],
        &[("W", vec![6, 4]), ("C", vec![1])],
        &[("transB", Attr::Int(1))],
    );
    check_equivalent(m, op, &[4], [3, 3], &["W"]);
}

#[test]
fn matmul_with_a_2d_weight_on_the_right() {
    let (m, op) = one_node("MatMul", &[2, 4], &[("W", vec![4, 6])], &[]);
    check_equivalent(m, op, &[2, 4], [3, 3], &["W"]);
    let (m, op) = one_node("MatMul", &[4], &[("W", vec![4, 7])], &[]);
    check_equivalent(m, op, &[4], [1, 6], &["W"]);
}

#[test]
fn conv_weight_and_bias() {
    let (m, op) = one_node(
        "Conv",
        &[2, 5, 5],
        &[("W", vec![6, 2, 3, 3]), ("B", vec![6])],
        &[("pads", Attr::Ints(vec![1, 1, 1, 1]))],
    );
    check_equivalent(m, op, &[2, 5, 5], [3, 3], &["W", "B"]);
    let (m, op) = one_node("Conv", &[2, 5, 5], &[("W", vec![5, 2, 3, 3])], &[]);
    check_equivalent(m, op, &[2, 5, 5], [4, 1], &["W"]);
}

#[test]
fn mlp4_gemm_split_matches_the_unsplit_model() {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../onnx-models/mlp4.onnx");
    let mut m = pipec_compiler::onnx::import::load(&p).unwrap();
    pipec_compiler::shape::infer_shapes(&mut m).unwrap();
    let op = m.graph.order[2]; // /net/net.2/Gemm: 128 -> 128, transB = 1
    assert_eq!(m.graph.ops[op].op_type, "Gemm");
    let x = Tensor::from_tensor_data(&TensorData::from_f32(vec![4, 64], &rand(256, 5))).unwrap();
    let name = m.graph.name(m.graph.inputs[0]).to_string();
    let run = |m: &Module| {
        pipec_runtime::exec::run_module(m, &[(name.clone(), x.clone())]).unwrap()[0]
            .1
            .clone()
    };
    let want = run(&m);
    let mut m2 = m.clone();
    let s = split_output_channels(&mut m2, op, [97, 31]).unwrap();
    assert_eq!(s.params[0].parts[0], "net.2.weight.split0");
    assert_eq!(s.params[0].axis, 0);
    pipec_compiler::verify::verify(&m2).unwrap();
    let (abs, _) = max_abs_diff(&run(&m2), &want).unwrap();
    assert!(abs <= 1e-6, "{abs}");
}

#[test]
fn unsupported_layers_fail_with_the_node_name() {
    let (mut m, op) = one_node(
        "Conv",
        &[2, 5, 5],
        &[("W", vec![4, 1, 3, 3])],
        &[("group", Attr::Int(2))],
    );
    let e = split_output_channels(&mut m, op, [2, 2])
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer") && e.contains("group"), "{e}");
    let (mut m, op) = one_node("Relu", &[4], &[], &[]);
    let e = split_output_channels(&mut m, op, [2, 2])
        .unwrap_err()
        .to_string();
    assert!(e.contains("layer") && e.contains("only Gemm"), "{e}");
    // A weight that is a graph input, not an initializer.
    let (mut m, op) = one_node("MatMul", &[4], &[("W", vec![4, 6])], &[]);
    let w = m.graph.ops[op].inputs[1].unwrap();
    m.graph.initializers.shift_remove(&w);
    let e = split_output_channels(&mut m, op, [3, 3])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an initializer"), "{e}");
}
