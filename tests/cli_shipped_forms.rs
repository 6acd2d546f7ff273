//! Models in the forms they ship in (issue 16): older opsets (upgraded on import), symbolic
//! non-batch dims (`--dim`), parameters off the loss path (held unchanged by the distributed
//! run, compared by `run --check`). Models come from `scripts/old_opset_models.py` and
//! `scripts/model_forms.py`; needs python3 with onnx, onnxruntime and numpy.

mod common;
use common::*;
use pipec_compiler::ir::TensorData;
use std::path::Path;
use std::process::Command;

fn script(name: &str, args: &[&str]) -> String {
    let (ok, log) = run_script(name, args);
    assert!(ok, "{name} {args:?} failed:\n{log}");
    log
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn npz(p: &Path) -> Vec<(String, TensorData)> {
    pipec_runtime::npz::read_npz(p).expect("read npz")
}

fn f32s(t: &TensorData) -> Vec<f64> {
    t.to_f64_vec().expect("float tensor")
}

/// max |a - b| / max |b| over two arrays of the same shape.
fn rel_diff(a: &TensorData, b: &TensorData) -> f64 {
    assert_eq!(a.dims, b.dims);
    let (a, b) = (f32s(a), f32s(b));
    let m = b.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-12);
    a.iter()
        .zip(&b)
        .fold(0f64, |d, (x, y)| d.max((x - y).abs()))
        / m
}

fn get<'a>(arrays: &'a [(String, TensorData)], k: &str) -> &'a TensorData {
    &arrays
        .iter()
        .find(|(n, _)| n == k)
        .unwrap_or_else(|| panic!("no array '{k}'"))
        .1
}

/// Old-opset models through `pipec grad`: outputs equal onnxruntime on the original model, and
/// every gradient equals `pipec grad` on the model `onnx.version_converter` made (opset 17);
/// the saved training graph declares opset 17 and onnxruntime runs it.
#[test]
fn old_opset_models_train_like_their_converted_versions() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    script("old_opset_models.py", &["gen", s(d)]);
    let cases = std::fs::read_to_string(d.join("cases.txt")).unwrap();
    let mut trained = 0;
    for line in cases.lines().filter(|l| l.ends_with("trainable")) {
        let name = line.split_whitespace().next().unwrap();
        let m = d.join(format!("{name}.onnx"));
        let inputs = d.join(format!("{name}.in.npz"));
        let out = d.join(format!("{name}.grad.npz"));
        let train = d.join(format!("{name}.train.onnx"));
        pipec_ok(&[
            "grad",
            s(&m),
            "--inputs",
            s(&inputs),
            "-o",
            s(&out),
            "--save-training-graph",
            s(&train),
        ]);
        let got = npz(&out);
        let reference = npz(&d.join(format!("{name}.ref.npz")));
        for (k, r) in &reference {
            let e = rel_diff(get(&got, k), r);
            assert!(e <= 1e-5, "{name}: {k} differs from onnxruntime by {e:.2e}");
        }
        let conv = d.join(format!("{name}.conv17.onnx"));
        assert!(conv.exists(), "{name}: onnx.version_converter failed");
        let out17 = d.join(format!("{name}.grad17.npz"));
        pipec_ok(&["grad", s(&conv), "--inputs", s(&inputs), "-o", s(&out17)]);
        let want = npz(&out17);
        let grads: Vec<&String> = want
            .iter()
            .map(|(k, _)| k)
            .filter(|k| k.starts_with("grad/"))
            .collect();
        assert!(!grads.is_empty(), "{name}: no gradients");
        for (k, w) in &want {
            let e = rel_diff(get(&got, k), w);
            assert!(
                e <= 1e-5,
                "{name}: {k} differs from the converted model's by {e:.2e}"
            );
        }
        let chk = "import onnx, onnxruntime as ort, numpy as np, sys\n\
             m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True)\n\
             v = [o.version for o in m.opset_import if o.domain in ('', 'ai.onnx')]\n\
             assert v == [17], v\n\
             s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n\
             f = dict(np.load(sys.argv[2]))\n\
             s.run(None, {i.name: f[i.name] for i in s.get_inputs()})\n";
        let st = Command::new("python3")
            .args(["-c", chk, s(&train), s(&inputs)])
            .status()
            .unwrap();
        assert!(
            st.success(),
            "{name}: the training graph fails onnx/onnxruntime"
        );
        trained += 1;
    }
    assert_eq!(trained, 3);
}

/// A model of opset 6 is refused with exit 2 and the opset named.
#[test]
fn too_old_opsets_are_refused() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let p = dir.path().join("old.onnx");
    let src = "import onnx, sys\nfrom onnx import helper as h, TensorProto as T\n\
               g = h.make_graph([h.make_node('Relu', ['x'], ['y'])], 'g',\n\
               [h.make_tensor_value_info('x', T.FLOAT, [2])], [h.make_tensor_value_info('y', T.FLOAT, [2])])\n\
               m = h.make_model(g, opset_imports=[h.make_opsetid('', 6)]); m.ir_version = 3\n\
               onnx.save(m, sys.argv[1])\n";
    assert!(Command::new("python3")
        .args(["-c", src, s(&p)])
        .status()
        .unwrap()
        .success());
    let out = pipec(&["opt", s(&p)]);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("opset 6") && e.contains("from opset 7"), "{e}");
    // `inspect` describes the file as written.
    let js = pipec_ok(&["inspect", s(&p), "--json"]);
    assert!(
        js.contains("\"opset\": 6") || js.contains("\"opset\":6"),
        "{js}"
    );
}

const AUDIO_COMPILE: &[&str] = &[
    "--cluster",
    "4@1e10",
    "--device-kind",
    "cpu-core",
    "--devices",
    "2",
    "--planner",
    "straight",
    "--batch",
    "4",
    "--micro-batch",
    "2",
];

/// A symbolic sequence axis: `compile` without `--dim` names the dim and the flag (exit 2);
/// with it the program runs and matches single-device training; `grad --keep-symbolic`
/// specialises the sequence axis (keeping the batch) and gives the same gradients as without.
#[test]
fn symbolic_sequence_axis() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    script("model_forms.py", &[s(d)]);
    let m = d.join("audio_seq.onnx");
    let outdir = d.join("out");
    let mut args = vec!["compile", s(&m)];
    args.extend_from_slice(AUDIO_COMPILE);
    args.extend_from_slice(&["-o", s(&outdir)]);
    let out = pipec(&args);
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("input 'x'")
            && e.contains("'sequence_length'")
            && e.contains("--dim sequence_length=N"),
        "{e}"
    );
    assert!(!outdir.exists());
    // A name no input has, and the batch, are refused.
    for (flag, want) in [
        ("seq=20", "no graph input"),
        ("batch=4", "sized by --batch"),
        ("sequence_length=0", "VALUE >= 1"),
    ] {
        let mut a = args.clone();
        a.extend_from_slice(&["--dim", flag]);
        let out = pipec(&a);
        assert_eq!(out.status.code(), Some(2), "--dim {flag}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains(want), "--dim {flag}: {e}");
    }
    let mut a = args.clone();
    a.extend_from_slice(&["--dim", "sequence_length=20"]);
    pipec_ok(&a);
    let log = pipec_ok(&["run", s(&outdir), "--steps", "2", "--check"]);
    assert!(log.contains("max_rel_diff"), "{log}");
    // plan and compare take the flag too.
    let js = pipec_ok(&[
        "plan",
        s(&m),
        "--cluster",
        "4@1e10",
        "--planner",
        "gpp",
        "--dim",
        "sequence_length=20",
        "--json",
    ]);
    assert!(js.contains("\"stages\""), "{js}");
    let out = pipec(&["compare", s(&m), "--cluster", "4@1e10"]);
    assert_eq!(out.status.code(), Some(2));

    let inputs = d.join("audio_seq.in.npz");
    let (g1, g2) = (d.join("g1.npz"), d.join("g2.npz"));
    pipec_ok(&["grad", s(&m), "--inputs", s(&inputs), "-o", s(&g1)]);
    pipec_ok(&[
        "grad",
        s(&m),
        "--inputs",
        s(&inputs),
        "-o",
        s(&g2),
        "--keep-symbolic",
    ]);
    let (a, b) = (npz(&g1), npz(&g2));
    assert!(a.iter().filter(|(k, _)| k.starts_with("grad/")).count() == 6);
    for (k, t) in &a {
        let e = rel_diff(get(&b, k), t);
        assert!(e <= 1e-6, "{k}: --keep-symbolic differs by {e:.2e}");
    }
    // A --dim that disagrees with the arrays.
    let out = pipec(&[
        "grad",
        s(&m),
        "--inputs",
        s(&inputs),
        "-o",
        s(&g2),
        "--dim",
        "sequence_length=21",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("array 'x' has shape"));
}

/// A head no loss reads and an initializer nothing reads: `run --check` passes under several
/// planners (SGD with weight decay and Adam); the distributed run returns them unchanged while
/// the trunk trains; `grad` gives them no gradient (absent from OUT.npz).
#[test]
fn parameters_off_the_loss_path_stay_unchanged() {
    if python_with_onnx().is_none() {
        return;
    }
    let dir = tempdir();
    let d = dir.path();
    script("model_forms.py", &[s(d)]);
    let m = d.join("unused_head.onnx");
    let inputs = d.join("unused_head.in.npz");
    let g = d.join("g.npz");
    pipec_ok(&["grad", s(&m), "--inputs", s(&inputs), "-o", s(&g)]);
    let grads = npz(&g);
    let names: Vec<&str> = grads.iter().map(|(k, _)| k.as_str()).collect();
    for p in ["W1", "B1", "W2", "B2", "W3", "B3"] {
        assert!(names.contains(&format!("grad/{p}").as_str()), "{names:?}");
    }
    for p in ["Wp", "Bp", "orphan"] {
        assert!(!names.contains(&format!("grad/{p}").as_str()), "{names:?}");
    }
    for (planner, devices, opt) in [
        ("straight", "3", "sgd:lr=0.05,weight_decay=0.1"),
        ("gpp", "4", "adam:lr=0.01"),
        ("dapple", "4", "sgd:lr=0.05,momentum=0.9"),
        ("pipedream", "4", "sgd:lr=0.05"),
        ("dp", "2", "adam:lr=0.01"),
    ] {
        let out = d.join(format!("out-{planner}"));
        pipec_ok(&[
            "compile",
            s(&m),
            "--cluster",
            "4@1e10",
            "--device-kind",
            "cpu-core",
            "--devices",
            devices,
            "--planner",
            planner,
            "--batch",
            "8",
            "--micro-batch",
            "2",
            "--optimizer",
            opt,
            "-o",
            s(&out),
        ]);
        let params = d.join(format!("params-{planner}.npz"));
        pipec_ok(&["run", s(&out), "--steps", "3", "--check", "-o", s(&params)]);
        let (after, before) = (npz(&params), npz(&out.join("weights.npz")));
        for p in ["Wp", "Bp", "orphan"] {
            assert_eq!(get(&after, p), get(&before, p), "{planner}: {p} changed");
        }
        assert!(
            rel_diff(get(&after, "W1"), get(&before, "W1")) > 1e-4,
            "{planner}: W1 did not train"
        );
    }
}
