//! The `optimizer` pass: one training step of mlp4 (SGD with momentum and weight decay; Adam
//! with gradient accumulation over 2 micro-batches) executed by the runtime's `run_graph`, each
//! updated parameter and state tensor checked against the update rule computed here in f64 from
//! the gradients the same graph returns. Needs python3 with onnxruntime (temporary executor).

use pipec_compiler::ir::TensorData;
use pipec_passes::autodiff::{differentiate, Autodiff};
use pipec_passes::optimizer::{add_optimizer, Optimizer, OptimizerKind};
use std::collections::HashMap;
use std::path::PathBuf;

fn have_ort() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import onnxruntime, numpy, onnx"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Deterministic pseudo-random values in [-1, 1).
fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
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

fn step(kind: OptimizerKind, micro: u32) {
    let mut m = pipec_compiler::onnx::import::load(&root().join("onnx-models/mlp4.onnx")).unwrap();
    let refz = pipec_runtime::npz::read_npz(&root().join("onnx-models/mlp4.ref.npz")).unwrap();
    let input = refz
        .iter()
        .find(|(k, _)| k == "input/input")
        .unwrap()
        .1
        .clone();
    differentiate(&mut m, &Autodiff::default()).unwrap();
    add_optimizer(&mut m, &Optimizer::new(kind.clone(), micro)).unwrap();
    pipec_compiler::verify::verify(&m).unwrap();
    let g = &m.graph;
    let mut feeds = vec![("input".to_string(), input)];
    let mut fed: HashMap<String, Vec<f64>> = HashMap::new();
    for (i, &v) in g.inputs.iter().enumerate().skip(1) {
        let name = g.name(v).to_string();
        let dims = g.ty(v).static_dims().unwrap();
        let n = dims.iter().product::<i64>() as usize;
        let mut vals = rand_vec(n, i as u64);
        if name == "opt/step" {
            vals = vec![3.0];
        } else if name.ends_with("/v") {
            vals.iter_mut().for_each(|x| *x = x.abs() * 1e-2);
        }
        fed.insert(name.clone(), vals.iter().map(|x| *x as f64).collect());
        feeds.push((name, TensorData::from_f32(dims, &vals)));
    }
    let out: HashMap<String, Vec<f64>> = pipec_runtime::run_graph(&m, &feeds)
        .unwrap()
        .into_iter()
        .map(|(k, t)| (k, t.to_f64_vec().unwrap()))
        .collect();
    let mut worst = 0f64;
    let mut checked = 0;
    for (&p, _) in &g.initializers {
        let name = g.name(p).to_string();
        let Some(grad) = out.get(&format!("grad/{name}")) else {
            continue;
        };
        let w = g.initializers[&p].to_f64_vec().unwrap();
        let gsum: Vec<f64> = match fed.get(&format!("grad_acc/{name}")) {
            Some(acc) => acc
                .iter()
                .zip(grad)
                .map(|(a, g)| (a + g) / micro as f64)
                .collect(),
            None => grad.clone(),
        };
        let mut expect: Vec<(String, Vec<f64>)> = Vec::new();
        match kind {
            OptimizerKind::Sgd {
                lr,
                momentum,
                weight_decay,
            } => {
                let gg: Vec<f64> = gsum
                    .iter()
                    .zip(&w)
                    .map(|(g, w)| g + weight_decay * w)
                    .collect();
                let buf: Vec<f64> = fed[&format!("opt/{name}/momentum")]
                    .iter()
                    .zip(&gg)
                    .map(|(b, g)| momentum * b + g)
                    .collect();
                expect.push((
                    format!("update/{name}"),
                    w.iter().zip(&buf).map(|(w, b)| w - lr * b).collect(),
                ));
                expect.push((format!("opt/{name}/momentum.out"), buf));
            }
            OptimizerKind::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let t = 3.0;
                let gg: Vec<f64> = gsum
                    .iter()
                    .zip(&w)
                    .map(|(g, w)| g + weight_decay * w)
                    .collect();
                let m1: Vec<f64> = fed[&format!("opt/{name}/m")]
                    .iter()
                    .zip(&gg)
                    .map(|(m, g)| beta1 * m + (1.0 - beta1) * g)
                    .collect();
                let v1: Vec<f64> = fed[&format!("opt/{name}/v")]
                    .iter()
                    .zip(&gg)
                    .map(|(v, g)| beta2 * v + (1.0 - beta2) * g * g)
                    .collect();
                let upd: Vec<f64> = (0..w.len())
                    .map(|i| {
                        let mh = m1[i] / (1.0 - beta1.powf(t));
                        let vh = v1[i] / (1.0 - beta2.powf(t));
                        w[i] - lr * mh / (vh.sqrt() + eps)
                    })
                    .collect();
                expect.push((format!("update/{name}"), upd));
                expect.push((format!("opt/{name}/m.out"), m1));
                expect.push((format!("opt/{name}/v.out"), v1));
            }
        }
        for (k, want) in expect {
            let got = out.get(&k).unwrap_or_else(|| panic!("no output {k}"));
            let scale = want.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-30);
            let err = got
                .iter()
                .zip(&want)
                .fold(0f64, |a, (g, w)| a.max((g - w).abs()))
                / scale;
            worst = worst.max(err);
            // 1e-4: the project's equivalence bound. Adam's m/sqrt(v) amplifies the f32 rounding
            // of tiny gradients (the executor's GEMM sums in another order than the f64 oracle).
            assert!(err < 1e-4, "{k}: relative error {err:.2e}");
            checked += 1;
        }
    }
    assert!(checked >= 16, "only {checked} tensors checked");
    eprintln!("{kind:?} x{micro}: {checked} tensors, worst relative error {worst:.2e}");
}

#[test]
fn sgd_momentum_weight_decay() {
    if !have_ort() {
        return;
    }
    step(
        OptimizerKind::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.01,
        },
        1,
    );
}

#[test]
fn adam_with_accumulation() {
    if !have_ort() {
        return;
    }
    step("adam:lr=0.01,weight_decay=0.001".parse().unwrap(), 2);
}

#[test]
fn bad_optimizer_specs() {
    assert!("rmsprop:lr=1".parse::<OptimizerKind>().is_err());
    assert!("sgd:lr=x".parse::<OptimizerKind>().is_err());
    assert!("sgd:foo=1".parse::<OptimizerKind>().is_err());
    assert_eq!(
        "sgd:lr=0.5,momentum=0.9".parse::<OptimizerKind>().unwrap(),
        OptimizerKind::Sgd {
            lr: 0.5,
            momentum: 0.9,
            weight_decay: 0.0
        }
    );
}
