//! The B/W split of backward pieces (the first step of the zero-bubble schedules): on the stage
//! pieces codegen emits for bundled models, running B then W on the backward's inputs gives
//! exactly the backward's outputs, no op runs in both, and what B carries to W is named.

mod common;

use pipec::driver::{self, CompileOptions};
use pipec_compiler::ir::{DType, Dim, Module, TensorData};
use pipec_compiler::program::Instr;
use pipec_passes::codegen::pieces::split_backward;
use pipec_passes::planners::STAGES_PREFIX;
use pipec_runtime::Tensor;
use std::collections::{HashMap, HashSet};

/// Inputs for every graph input of `m`: the tensor of that name in `known`, else one with
/// symbolic dims sized `batch`, floats from a fixed xorshift sequence, integers 0 (valid
/// indices).
fn inputs_for(m: &Module, batch: i64, known: &HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
    let g = &m.graph;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    g.inputs
        .iter()
        .map(|&v| {
            if let Some(t) = known.get(g.name(v)) {
                return (g.name(v).to_string(), t.clone());
            }
            let ty = g.ty(v);
            let dims: Vec<i64> = ty
                .shape
                .as_deref()
                .unwrap_or(&[])
                .iter()
                .map(|d| match d {
                    Dim::Known(n) => *n,
                    Dim::Sym(s) => s.coeff * batch.pow(s.syms.len() as u32),
                })
                .collect();
            let n: i64 = dims.iter().product();
            let data = if ty.dtype.is_float() {
                let vals: Vec<f32> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                    })
                    .collect();
                TensorData::from_f32(dims, &vals)
            } else {
                TensorData::from_i64(dims, &vec![0; n as usize])
            };
            let mut t = Tensor::from_tensor_data(&data).expect("tensor");
            if ty.dtype != DType::F32 && ty.dtype != DType::I64 {
                t = t.cast(ty.dtype).expect("cast");
            }
            (g.name(v).to_string(), t)
        })
        .collect()
}

fn run(m: &Module, inputs: &[(String, Tensor)]) -> HashMap<String, Tensor> {
    let names: HashSet<&str> = m.graph.inputs.iter().map(|&v| m.graph.name(v)).collect();
    let mine: Vec<(String, Tensor)> = inputs
        .iter()
        .filter(|(n, _)| names.contains(n.as_str()))
        .cloned()
        .collect();
    pipec_runtime::exec::run_module(m, &mine)
        .unwrap_or_else(|e| panic!("{}: {e}", m.graph.name))
        .into_iter()
        .collect()
}

#[test]
fn b_then_w_computes_the_backward() {
    let mut split_any = 0;
    for (model, stages) in [
        ("mlp4.onnx", "0..3;3.."),
        ("gpt2_tiny.onnx", "0..150;150.."),
        ("inception_mini.onnx", "0..20;20.."),
        ("lstm_tiny.onnx", "0..12;12.."),
        ("vit_tiny.onnx", "0..40;40.."),
    ] {
        let cluster = driver::resolve_cluster("cpu", None, Some(2)).unwrap();
        let mut opts = CompileOptions::new(&format!("{STAGES_PREFIX}{stages}"), cluster, 4);
        opts.set_micro_batch(Some(2)).unwrap();
        let out = driver::compile(&common::model(model), &opts, &|_| {}).unwrap();
        let compiled = &out.artifact.compiled;
        for dev in &compiled.program.devices {
            let s = dev.stage;
            let file = format!("stages/s{s}.bwd.onnx");
            let Some((_, bwd)) = compiled.modules.iter().find(|(f, _)| *f == file) else {
                continue;
            };
            let params: Vec<String> = dev
                .instructions
                .iter()
                .find_map(|i| match i {
                    Instr::Accumulate { tensors, .. } => Some(tensors.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            let sp = split_backward(bwd, &params, &format!("s{s}"))
                .unwrap_or_else(|e| panic!("{model} s{s}: {e}"));
            eprintln!(
                "{model} s{s}: backward {} ops = B {} + W {}; carried {:?}",
                bwd.graph.order.len(),
                sp.b.graph.order.len(),
                sp.w.graph.order.len(),
                sp.carried
            );
            // No op twice: B's and W's ops together are the backward's live ops.
            let live = bwd.graph.order.len();
            assert!(
                sp.b.graph.order.len() + sp.w.graph.order.len() <= live,
                "{model} s{s}: {} + {} ops > {live}",
                sp.b.graph.order.len(),
                sp.w.graph.order.len()
            );
            // The backward's inputs as a step has them: the forward's outputs (saved
            // activations, shapes) on the initial weights, random cotangents.
            let fwd_file = format!("stages/s{s}.fwd.onnx");
            let (_, fwd) = compiled
                .modules
                .iter()
                .find(|(f, _)| *f == fwd_file)
                .expect("forward piece");
            let mut known: HashMap<String, Tensor> = compiled
                .weights
                .iter()
                .map(|(n, t)| (n.clone(), Tensor::from_tensor_data(t).expect("weight")))
                .collect();
            let fwd_in = inputs_for(fwd, 2, &known);
            known.extend(run(fwd, &fwd_in));
            let inputs = inputs_for(bwd, 2, &known);
            let whole = run(bwd, &inputs);
            let from_b = run(&sp.b, &inputs);
            let mut w_in = inputs.clone();
            w_in.extend(from_b.iter().map(|(n, t)| (n.clone(), t.clone())));
            let from_w = run(&sp.w, &w_in);
            for (name, want) in &whole {
                let got = from_b
                    .get(name)
                    .or_else(|| from_w.get(name))
                    .unwrap_or_else(|| panic!("{model} s{s}: {name} from neither B nor W"));
                let (abs, _) = pipec_runtime::tensor::max_abs_diff(got, want).unwrap();
                assert_eq!(abs, 0.0, "{model} s{s}: {name}");
            }
            // Every parameter gradient comes from W, every input gradient from B.
            for p in &params {
                assert!(from_w.contains_key(p), "{model} s{s}: {p} not from W");
            }
            if !params.is_empty() && whole.len() > params.len() {
                split_any += 1;
            }
        }
    }
    assert!(split_any >= 3, "only {split_any} stages had both B and W");
}
