//! Forward pass of the 4 dev models on each backend, against the torch reference outputs in
//! `NAME.ref.npz` (max abs diff <= 1e-4 * max |ref|). Skipped when the models are not found.

mod common;

use pipec_runtime::reference::Reference;
use pipec_runtime::tensor::max_abs_diff;
use pipec_runtime::tract_backend::Tract;
use pipec_runtime::{npz, Executor, Tensor};
use std::time::Instant;

fn forward(name: &str, exec: &dyn Executor) {
    let Some(dir) = common::models_dir() else {
        eprintln!("{name}: dev models not found, skipped");
        return;
    };
    let m = pipec_compiler::onnx::import::load(&dir.join(format!("{name}.onnx"))).unwrap();
    let refp = dir.join(format!("{name}.ref.npz"));
    let inputs = npz::read_prefixed(&refp, "input/").unwrap();
    let want = npz::read_prefixed(&refp, "output/").unwrap();
    assert!(!inputs.is_empty() && !want.is_empty());
    let t0 = Instant::now();
    let mut p = exec.prepare(&m).unwrap();
    let t1 = Instant::now();
    let got = p.run(&inputs).unwrap();
    let t2 = Instant::now();
    // A second run reuses the prepared program (and tract's cached plan).
    let again = p.run(&inputs).unwrap();
    let t3 = Instant::now();
    assert_eq!(got, again, "{name}: two runs differ");
    for (n, w) in &want {
        let (_, g) = got.iter().find(|(gn, _)| gn == n).unwrap();
        let (d, mx) = max_abs_diff(g, w).unwrap();
        eprintln!(
            "{name} [{}]: output {n} {:?}: max abs diff {d:.3e} (max |ref| {mx:.3e}, rel {:.3e}); prepare {:.3}s, first run {:.3}s, second run {:.3}s",
            exec.name(),
            g.shape(),
            d / mx,
            (t1 - t0).as_secs_f64(),
            (t2 - t1).as_secs_f64(),
            (t3 - t2).as_secs_f64()
        );
        assert!(
            d <= 1e-4 * mx,
            "{name} [{}]: output {n} differs: {d} (max |ref| {mx})",
            exec.name()
        );
    }
}

#[test]
fn mlp4_reference() {
    forward("mlp4", &Reference);
}
#[test]
fn mlp4_tract() {
    forward("mlp4", &Tract);
}
#[test]
fn inception_mini_reference() {
    forward("inception_mini", &Reference);
}
#[test]
fn inception_mini_tract() {
    forward("inception_mini", &Tract);
}
#[test]
fn gpt2_tiny_reference() {
    forward("gpt2_tiny", &Reference);
}
#[test]
fn gpt2_tiny_tract() {
    forward("gpt2_tiny", &Tract);
}
#[test]
fn resnet18_reference() {
    forward("resnet18", &Reference);
}
#[test]
fn resnet18_tract() {
    forward("resnet18", &Tract);
}

/// The batch is symbolic: a batch of 1 (the first sample) gives the first row of the reference.
#[test]
fn symbolic_batch_of_one() {
    let Some(dir) = common::models_dir() else {
        return;
    };
    for name in ["mlp4", "gpt2_tiny"] {
        let m = pipec_compiler::onnx::import::load(&dir.join(format!("{name}.onnx"))).unwrap();
        let refp = dir.join(format!("{name}.ref.npz"));
        let first = |t: &Tensor| -> Tensor {
            pipec_runtime::map_any!(t, a => a.slice_axis(ndarray::Axis(0), ndarray::Slice::from(0..1)).to_owned())
        };
        let inputs: Vec<(String, Tensor)> = npz::read_prefixed(&refp, "input/")
            .unwrap()
            .into_iter()
            .map(|(n, t)| (n, first(&t)))
            .collect();
        let want = npz::read_prefixed(&refp, "output/").unwrap();
        for exec in [&Reference as &dyn Executor, &Tract] {
            let got = exec.prepare(&m).unwrap().run(&inputs).unwrap();
            let (d, mx) = max_abs_diff(&got[0].1, &first(&want[0].1)).unwrap();
            assert!(d <= 1e-4 * mx, "{name} [{}] batch 1: {d}", exec.name());
        }
    }
}

#[test]
fn npz_round_trip_with_slash_names() {
    let dir = std::env::temp_dir().join(format!("pipec-npz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.npz");
    let entries = vec![
        (
            "grad/conv1.weight".to_string(),
            Tensor::F32(ndarray::ArrayD::from_elem(ndarray::IxDyn(&[2, 3]), 1.5)),
        ),
        (
            "loss".to_string(),
            Tensor::F64(ndarray::arr0(0.25).into_dyn()),
        ),
        (
            "input/input_ids".to_string(),
            Tensor::I64(ndarray::arr1(&[1i64, -2, 3]).into_dyn()),
        ),
        (
            "mask".to_string(),
            Tensor::Bool(ndarray::arr1(&[true, false]).into_dyn()),
        ),
    ];
    npz::write(&p, &entries).unwrap();
    let back = npz::read(&p).unwrap();
    assert_eq!(back, entries);
    let _ = std::fs::remove_dir_all(&dir);
    // Reading a missing file names it.
    let e = npz::read(&dir.join("nope.npz")).unwrap_err().to_string();
    assert!(e.contains("nope.npz"), "{e}");
}

/// The f64 copy of a model (`exec::to_f64`) runs on the reference backend and matches the
/// torch f32 reference.
#[test]
fn f64_forward_on_reference() {
    let Some(dir) = common::models_dir() else {
        return;
    };
    for name in ["mlp4", "inception_mini", "gpt2_tiny"] {
        let m = pipec_compiler::onnx::import::load(&dir.join(format!("{name}.onnx"))).unwrap();
        let m64 = pipec_runtime::exec::to_f64(&m).unwrap();
        let refp = dir.join(format!("{name}.ref.npz"));
        let inputs: Vec<(String, Tensor)> = npz::read_prefixed(&refp, "input/")
            .unwrap()
            .into_iter()
            .map(|(n, t)| {
                let t = if t.dtype() == pipec_compiler::ir::DType::F32 {
                    t.cast(pipec_compiler::ir::DType::F64).unwrap()
                } else {
                    t
                };
                (n, t)
            })
            .collect();
        let want = npz::read_prefixed(&refp, "output/").unwrap();
        let got = Reference.prepare(&m64).unwrap().run(&inputs).unwrap();
        assert_eq!(got[0].1.dtype(), pipec_compiler::ir::DType::F64);
        let (d, mx) = max_abs_diff(&got[0].1, &want[0].1).unwrap();
        eprintln!(
            "{name} [reference, f64]: max abs diff {d:.3e} (rel {:.3e})",
            d / mx
        );
        assert!(d <= 1e-4 * mx, "{name} f64: {d}");
    }
}
