//! Per-op tests: every case of `op_cases` (expected values from onnxruntime) on each backend,
//! in f32 and f64.

mod common;
mod op_cases;

use common::{build, check};
use pipec_compiler::ir::DType;
use pipec_runtime::reference::Reference;
use pipec_runtime::tract_backend::Tract;
use pipec_runtime::{Executor, Tensor};

/// Run every case on a backend; returns the failures as `(case, message)`.
fn run_all(exec: &dyn Executor, float: DType, rtol: f64) -> Vec<(String, String)> {
    let mut fails = Vec::new();
    for c in op_cases::cases() {
        let (m, feeds) = build(&c, float);
        let r = exec.prepare(&m).and_then(|mut p| p.run(&feeds));
        let res = match r {
            Ok(out) => check(&c, &out, rtol),
            Err(e) => Err(format!("error: {e}")),
        };
        if let Err(e) = res {
            fails.push((c.name.to_string(), e));
        }
    }
    fails
}

fn report(what: &str, fails: &[(String, String)]) {
    for (n, e) in fails {
        eprintln!("{what}: {n}: {e}");
    }
}

#[test]
fn reference_backend_f32() {
    let fails = run_all(&Reference, DType::F32, 1e-5);
    report("reference f32", &fails);
    assert!(fails.is_empty(), "{} cases failed", fails.len());
}

#[test]
fn reference_backend_f64() {
    let fails = run_all(&Reference, DType::F64, 1e-5);
    report("reference f64", &fails);
    assert!(fails.is_empty(), "{} cases failed", fails.len());
}

/// Cases tract 0.23 fails, in f32 (kept in sync with `tract_backend::KNOWN_GAPS`).
const TRACT_F32_FAILS: &[&str] = &[
    "conv_transpose_output_shape",
    "batchnorm",
    "pad_constant",
    "celu",
    "conv_transpose_output_shape_odd",
    "pad_wrap",
];
/// Cases tract 0.23 fails, in f64.
const TRACT_F64_FAILS: &[&str] = &[
    "erf",
    "sigmoid",
    "gemm_transb",
    "conv_transpose_output_shape",
    "batchnorm",
    "pad_constant",
    "hard_swish",
    "celu",
    "conv_transpose_output_shape_odd",
    "pad_wrap",
];

#[test]
fn tract_backend_known_gaps() {
    let mut changed = Vec::new();
    for (float, known) in [(DType::F32, TRACT_F32_FAILS), (DType::F64, TRACT_F64_FAILS)] {
        let fails = run_all(&Tract, float, 1e-5);
        report(&format!("tract {float}"), &fails);
        let names: Vec<&str> = fails.iter().map(|(n, _)| n.as_str()).collect();
        if names != known {
            changed.push(format!("tract {float}: failing cases are now {names:?}"));
        }
    }
    assert!(changed.is_empty(), "{changed:?}");
}

#[test]
fn unsupported_op_names_the_node() {
    let mut c = op_cases::cases().remove(0);
    c.op = "FancyOp";
    let (m, _) = build(&c, DType::F32);
    let e = Reference.prepare(&m).err().expect("must fail").to_string();
    assert!(e.contains("n0") && e.contains("FancyOp"), "{e}");
}

#[test]
fn bad_inputs_are_errors() {
    let c = op_cases::cases().remove(0);
    let (m, mut feeds) = build(&c, DType::F32);
    let mut p = Reference.prepare(&m).unwrap();
    // wrong dtype
    let mut f2 = feeds.clone();
    f2[0].1 = f2[0].1.cast(DType::F64).unwrap();
    let e = p.run(&f2).unwrap_err().to_string();
    assert!(e.contains("'a'") && e.contains("float64"), "{e}");
    // missing input
    feeds.pop();
    let e = p.run(&feeds).unwrap_err().to_string();
    assert!(e.contains("'b'") && e.contains("missing"), "{e}");
    // kernel error names node and op: a shape that does not broadcast
    let c = op_cases::cases().remove(0);
    let (m, mut feeds) = build(&c, DType::F32);
    let mut p = Reference.prepare(&m).unwrap();
    feeds[1].1 = Tensor::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[3, 2])));
    let e = p.run(&feeds).unwrap_err().to_string();
    assert!(e.contains("'b'") && e.contains("dim 1"), "{e}");
}
