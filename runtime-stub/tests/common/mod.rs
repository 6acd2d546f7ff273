//! Shared test helpers: single-node cases, input patterns, locating the dev models.
#![allow(dead_code)]

use ndarray::{ArrayD, IxDyn};
use pipec_compiler::ir::{Attr, DType, Graph, Module, OpData, TensorData, TensorType};
use pipec_runtime::Tensor;
use std::path::PathBuf;

/// An operand of a single-node case.
pub enum Arg {
    /// Float graph input: name, shape, pattern seed, positive values only.
    Float(&'static str, Vec<usize>, u64, bool),
    /// i64 initializer: name, shape, values.
    IntConst(&'static str, Vec<usize>, Vec<i64>),
    /// i64 graph input: name, shape, values.
    IntInput(&'static str, Vec<usize>, Vec<i64>),
    /// bool graph input: name, shape, values.
    Bool(&'static str, Vec<usize>, Vec<bool>),
    /// An omitted optional operand.
    Omitted,
}

/// An expected output: shape and values.
pub enum Expect {
    Float(Vec<usize>, Vec<f64>),
    Int(Vec<usize>, Vec<i64>),
}

/// One single-node test case (expected values from onnxruntime; see gen_op_cases.py).
pub struct Case {
    pub name: &'static str,
    pub op: &'static str,
    pub opset: i64,
    pub attrs: Vec<(&'static str, Attr)>,
    pub inputs: Vec<Arg>,
    pub expect: Vec<Expect>,
}

/// The deterministic input pattern shared with gen_op_cases.py.
pub fn pattern(shape: &[usize], seed: u64, positive: bool) -> ArrayD<f32> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n as u64)
        .map(|i| {
            let k = ((i * 7 + seed * 13) % 23) as f32;
            if positive {
                (k + 1.0) / 8.0
            } else {
                (k - 11.0) / 8.0
            }
        })
        .collect();
    ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
}

/// Build the one-node module of a case with float inputs of type `float` (F32 or F64), and
/// its feeds.
pub fn build(case: &Case, float: DType) -> (Module, Vec<(String, Tensor)>) {
    let mut g = Graph::new(case.name);
    let mut operands = Vec::new();
    let mut feeds = Vec::new();
    for a in &case.inputs {
        match a {
            Arg::Float(name, shape, seed, pos) => {
                let t = Tensor::F32(pattern(shape, *seed, *pos))
                    .cast(float)
                    .unwrap();
                let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
                operands.push(Some(g.add_input(*name, TensorType::known(float, &dims))));
                feeds.push((name.to_string(), t));
            }
            Arg::IntConst(name, shape, vals) => {
                let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
                operands.push(Some(
                    g.add_initializer(*name, TensorData::from_i64(dims, vals)),
                ));
            }
            Arg::IntInput(name, shape, vals) => {
                let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
                operands.push(Some(
                    g.add_input(*name, TensorType::known(DType::I64, &dims)),
                ));
                let a = ArrayD::from_shape_vec(IxDyn(shape), vals.clone()).unwrap();
                feeds.push((name.to_string(), Tensor::I64(a)));
            }
            Arg::Bool(name, shape, vals) => {
                let dims: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
                operands.push(Some(
                    g.add_input(*name, TensorType::known(DType::Bool, &dims)),
                ));
                let a = ArrayD::from_shape_vec(IxDyn(shape), vals.clone()).unwrap();
                feeds.push((name.to_string(), Tensor::Bool(a)));
            }
            Arg::Omitted => operands.push(None),
        }
    }
    let cast_to = case
        .attrs
        .iter()
        .find(|(k, _)| *k == "to")
        .and_then(|(_, a)| a.as_int())
        .and_then(|c| DType::from_onnx(c as i32));
    let results = case
        .expect
        .iter()
        .enumerate()
        .map(|(k, e)| {
            let dt = match (e, cast_to) {
                (_, Some(dt)) if case.op == "Cast" => dt,
                (Expect::Int(..), _) => DType::I64,
                (Expect::Float(..), _) => float,
            };
            (format!("y{k}"), TensorType::unranked(dt))
        })
        .collect();
    let data = OpData {
        name: "n0".into(),
        op_type: case.op.into(),
        inputs: operands,
        attrs: case
            .attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..Default::default()
    };
    let (_, outs) = g.add_op(data, results);
    g.outputs = outs;
    let mut m = Module {
        graph: g,
        ir_version: 8,
        ..Default::default()
    };
    m.opset_imports.insert(String::new(), case.opset);
    (m, feeds)
}

/// Compare outputs with the expectation; `Err` describes the first mismatch.
pub fn check(case: &Case, got: &[(String, Tensor)], rtol: f64) -> Result<(), String> {
    if got.len() != case.expect.len() {
        return Err(format!(
            "{} outputs, expected {}",
            got.len(),
            case.expect.len()
        ));
    }
    for (k, (e, (_, t))) in case.expect.iter().zip(got).enumerate() {
        match e {
            Expect::Float(shape, want) => {
                if t.shape() != shape.as_slice() {
                    return Err(format!(
                        "output {k}: shape {:?}, expected {shape:?}",
                        t.shape()
                    ));
                }
                let g = t.to_f64();
                for (i, (a, b)) in g.iter().zip(want).enumerate() {
                    if (a - b).abs() > rtol * b.abs().max(1.0) || a.is_nan() {
                        return Err(format!("output {k}[{i}]: {a}, expected {b}"));
                    }
                }
            }
            Expect::Int(shape, want) => {
                if t.shape() != shape.as_slice() {
                    return Err(format!(
                        "output {k}: shape {:?}, expected {shape:?}",
                        t.shape()
                    ));
                }
                if &t.to_i64_vec() != want {
                    return Err(format!(
                        "output {k}: {:?}, expected {want:?}",
                        t.to_i64_vec()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The folder with the dev models: `onnx-models` or `shared/models`, found by walking up from
/// this crate.
pub fn models_dir() -> Option<PathBuf> {
    let mut dir = Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let mut cands = Vec::new();
    while let Some(d) = dir {
        cands.push(d.join("onnx-models"));
        cands.push(d.join("shared/models"));
        dir = d.parent().map(PathBuf::from);
    }
    cands.push(PathBuf::from("/work/main/onnx-models"));
    cands.push(PathBuf::from("/work/shared/models"));
    cands
        .into_iter()
        .find(|d| d.join("mlp4.onnx").is_file() && d.join("mlp4.ref.npz").is_file())
}
