//! Textual IR: exact round trips, acceptance by `mlir-opt`, a pinned golden print, errors, and
//! robustness against garbled input.

use bytes::Bytes;
use pipec_compiler::ir::{
    Attr, DType, Dim, Graph, Module, OpData, Payload, SymDim, TensorData, TensorType, Value,
};
use pipec_compiler::text::{parse, print, print_with, PrintOptions};
use pipec_compiler::Error;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// A small deterministic pseudo-random generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Random but valid data for `n` elements of `dtype` (bools 0/1, sub-byte padding zero).
fn random_tensor(rng: &mut Rng, dtype: DType, dims: Vec<i64>) -> TensorData {
    let n = dims.iter().product::<i64>() as u64;
    if dtype == DType::String {
        let strs = (0..n)
            .map(|i| Bytes::from(format!("s{i}\"\\\n\u{e9}").into_bytes()))
            .collect();
        return TensorData {
            dtype,
            dims,
            payload: Payload::Strings(strs),
        };
    }
    let len = dtype.bytes_for(n).unwrap() as usize;
    let mut b = rng.bytes(len);
    if dtype == DType::Bool {
        b.iter_mut().for_each(|x| *x &= 1);
    }
    if matches!(dtype, DType::I4 | DType::U4) && n % 2 == 1 {
        if let Some(last) = b.last_mut() {
            *last &= 0xf;
        }
    }
    TensorData::from_raw(dtype, dims, Bytes::from(b)).unwrap()
}

fn op(name: &str, ty: &str, domain: &str, inputs: Vec<Option<Value>>) -> OpData {
    OpData {
        name: name.into(),
        op_type: ty.into(),
        domain: domain.into(),
        inputs,
        ..Default::default()
    }
}

/// A module exercising every feature of the format.
fn big_module() -> Module {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let mut g = Graph::new("main graph!");
    let batch = Dim::sym("batch");
    let prod = Dim::Sym(SymDim {
        coeff: 2,
        syms: vec!["batch".into(), "seq".into()],
    });
    // Not in Display/parse normal form: unsorted symbols, a numeric-looking symbol.
    let odd = Dim::Sym(SymDim {
        coeff: 1,
        syms: vec!["z".into(), "a*b".into()],
    });
    let numeric = Dim::sym("3");
    let x = g.add_input(
        "input.1",
        TensorType::new(DType::F32, vec![batch.clone(), Dim::Known(3), prod.clone()]),
    );
    let s = g.add_input("/strings in", TensorType::unranked(DType::String));
    let y = g.add_input(
        "odd dims",
        TensorType::new(DType::F16, vec![odd.clone(), numeric, Dim::Known(-1)]),
    );
    let scalar = g.add_input("scalar", TensorType::new(DType::I64, vec![]));

    // Initializers: each dtype small (inline) and large (elided), plus special shapes.
    let mut inits = Vec::new();
    for (i, &dt) in DType::ALL.iter().enumerate() {
        let small = random_tensor(&mut rng, dt, vec![3]);
        inits.push(g.add_initializer(format!("w.{}.small", dt.name()), small));
        let large = random_tensor(&mut rng, dt, vec![4, 5]);
        inits.push(g.add_initializer(format!("onnx::W_{i}"), large));
    }
    let w = g.add_initializer(
        "conv1.weight",
        TensorData::from_f32(
            vec![2, 3],
            &[1.0, -0.0, f32::NAN, f32::INFINITY, 1e-45, 0.1],
        ),
    );
    g.add_initializer("empty", TensorData::from_f32(vec![2, 0], &[]));
    g.add_initializer("scalar.c", TensorData::from_i64(vec![], &[-7]));
    // Already elided (as parsed from text without blobs), with a key that is not the name's.
    g.add_initializer(
        "pre.elided",
        TensorData {
            dtype: DType::F32,
            dims: vec![2],
            payload: Payload::Elided("custom_key".into()),
        },
    );
    // Names that collide after sanitizing.
    g.add_initializer("a/b", TensorData::from_i64(vec![1], &[1]));
    g.add_initializer("a_b", TensorData::from_i64(vec![1], &[2]));

    let mut attrs = BTreeMap::new();
    attrs.insert("f".to_string(), Attr::Float(1.5));
    attrs.insert(
        "f_nan".to_string(),
        Attr::Float(f32::from_bits(0x7fc0_0123)),
    );
    attrs.insert("f_neg0".to_string(), Attr::Float(-0.0));
    attrs.insert("f_big".to_string(), Attr::Float(1e20));
    attrs.insert("i".to_string(), Attr::Int(i64::MIN));
    attrs.insert("s".to_string(), Attr::String("he\"llo\\\n ü\t".into()));
    attrs.insert(
        "t_small".to_string(),
        Attr::Tensor(TensorData::from_i64(vec![2, 2], &[1, -2, 3, i64::MAX])),
    );
    attrs.insert(
        "t_large".to_string(),
        Attr::Tensor(random_tensor(&mut rng, DType::F32, vec![17])),
    );
    attrs.insert(
        "fs".to_string(),
        Attr::Floats(vec![1.0, 1e-45, f32::NEG_INFINITY, 0.1]),
    );
    attrs.insert("fs_empty".to_string(), Attr::Floats(vec![]));
    attrs.insert("is".to_string(), Attr::Ints(vec![1, 2, -3]));
    attrs.insert("is_empty".to_string(), Attr::Ints(vec![]));
    attrs.insert(
        "ss".to_string(),
        Attr::Strings(vec!["a".into(), "b c".into()]),
    );
    attrs.insert("ss_empty".to_string(), Attr::Strings(vec![]));
    // Names the format reserves or cannot print bare.
    attrs.insert("pipec.node".to_string(), Attr::Int(1));
    attrs.insert("".to_string(), Attr::Int(2));
    attrs.insert("pipec.esc.x".to_string(), Attr::Int(3));
    attrs.insert("my attr".to_string(), Attr::Int(4));
    attrs.insert("pipec.stage".to_string(), Attr::Int(5));
    let mut conv = op(
        "/layer1/conv/Conv",
        "Conv",
        "",
        vec![Some(x), Some(w), None],
    );
    conv.attrs = attrs;
    let (_, c) = g.add_op(
        conv,
        vec![(
            "/layer1/conv/Conv_output_0".into(),
            TensorType::new(DType::F32, vec![batch.clone(), Dim::Known(2)]),
        )],
    );
    let (_, split) = g.add_op(
        op("split", "Split", "", vec![Some(c[0])]),
        vec![
            (
                "x/y".into(),
                TensorType::new(DType::F32, vec![batch.clone(), Dim::Known(1)]),
            ),
            (
                "x_y".into(),
                TensorType::new(DType::F32, vec![batch.clone(), Dim::Known(1)]),
            ),
            ("onnx::Gemm_12".into(), TensorType::unranked(DType::F32)),
        ],
    );
    let (_, fm) = g.add_op(
        op(
            "",
            "FusedMatMul",
            "com.microsoft",
            vec![None, Some(split[0]), None],
        ),
        vec![("12".into(), TensorType::known(DType::F32, &[1]))],
    );
    g.add_op(
        op(
            "weird",
            "weird.type",
            "x",
            vec![Some(s), Some(y), Some(scalar)],
        ),
        vec![
            ("1abc".into(), TensorType::unranked(DType::Bool)),
            ("".into(), TensorType::unranked(DType::Bool)),
        ],
    );
    g.add_op(op("sink", "Print", "ai.onnx", vec![Some(fm[0])]), vec![]);
    g.add_op(
        op("empty type", "", "", vec![]),
        vec![("e".into(), TensorType::unranked(DType::I8))],
    );
    g.outputs = vec![c[0], split[1], x, inits[0], split[2]];

    let mut m = Module {
        graph: g,
        ir_version: 8,
        producer_name: "pytorch".into(),
        producer_version: "2.1.0".into(),
        ..Default::default()
    };
    m.opset_imports.insert("".into(), 17);
    m.opset_imports.insert("com.microsoft".into(), 1);
    m.attrs.insert("pipec.stages".into(), Attr::Int(4));
    m.attrs
        .insert("pipec.ir_version".into(), Attr::String("collides".into()));
    m.attrs.insert(
        "pipec.table".into(),
        Attr::Tensor(TensorData::from_f32(vec![2], &[0.5, 2.0])),
    );
    m
}

/// Compare tensor data; `elided_ok` allows `b` to be elided where `a` has data.
fn same_tensor(a: &TensorData, b: &TensorData, elided_ok: bool, what: &str) {
    assert_eq!(a.dtype, b.dtype, "{what}");
    assert_eq!(a.dims, b.dims, "{what}");
    match (&a.payload, &b.payload) {
        (_, Payload::Elided(_)) if elided_ok => {}
        (Payload::Elided(_), Payload::Elided(_)) => {}
        (x, y) => assert_eq!(x, y, "{what}"),
    }
}

fn same_attr(a: &Attr, b: &Attr, elided_ok: bool, what: &str) {
    match (a, b) {
        (Attr::Tensor(x), Attr::Tensor(y)) => same_tensor(x, y, elided_ok, what),
        (Attr::Float(x), Attr::Float(y)) => assert_eq!(x.to_bits(), y.to_bits(), "{what}"),
        (Attr::Floats(x), Attr::Floats(y)) => {
            let xb: Vec<u32> = x.iter().map(|f| f.to_bits()).collect();
            let yb: Vec<u32> = y.iter().map(|f| f.to_bits()).collect();
            assert_eq!(xb, yb, "{what}");
        }
        _ => assert_eq!(a, b, "{what}"),
    }
}

/// Everything the IR holds is the same (value identity through names).
fn assert_same(a: &Module, b: &Module, elided_ok: bool) {
    assert_same_impl(a, b, elided_ok, true)
}

/// Everything is the same; value names only when `names`.
fn assert_same_impl(a: &Module, b: &Module, elided_ok: bool, names: bool) {
    assert_eq!(a.ir_version, b.ir_version);
    assert_eq!(a.producer_name, b.producer_name);
    assert_eq!(a.producer_version, b.producer_version);
    assert_eq!(a.opset_imports, b.opset_imports);
    assert_eq!(a.attrs.len(), b.attrs.len());
    for (k, v) in &a.attrs {
        same_attr(v, &b.attrs[k], elided_ok, k);
    }
    let (ga, gb) = (&a.graph, &b.graph);
    assert_eq!(ga.name, gb.name);
    let val = |g: &Graph, v: Value| {
        let n = if names {
            g.name(v).to_string()
        } else {
            String::new()
        };
        (n, g.ty(v).clone())
    };
    let vals = |g: &Graph, vs: &[Value]| vs.iter().map(|v| val(g, *v)).collect::<Vec<_>>();
    assert_eq!(vals(ga, &ga.inputs), vals(gb, &gb.inputs));
    assert_eq!(vals(ga, &ga.outputs), vals(gb, &gb.outputs));
    assert_eq!(ga.initializers.len(), gb.initializers.len());
    for ((va, ta), (vb, tb)) in ga.initializers.iter().zip(gb.initializers.iter()) {
        assert_eq!(val(ga, *va), val(gb, *vb));
        same_tensor(ta, tb, elided_ok, ga.name(*va));
    }
    assert_eq!(ga.order.len(), gb.order.len());
    for (oa, ob) in ga.order.iter().zip(gb.order.iter()) {
        let (da, db) = (&ga.ops[*oa], &gb.ops[*ob]);
        assert_eq!(da.name, db.name);
        assert_eq!(da.op_type, db.op_type);
        assert_eq!(da.domain, db.domain);
        let ins = |g: &Graph, d: &OpData| {
            d.inputs
                .iter()
                .map(|i| i.map(|v| val(g, v)))
                .collect::<Vec<_>>()
        };
        assert_eq!(ins(ga, da), ins(gb, db), "inputs of {}", da.name);
        assert_eq!(vals(ga, &da.outputs), vals(gb, &db.outputs));
        assert_eq!(
            da.attrs.keys().collect::<Vec<_>>(),
            db.attrs.keys().collect::<Vec<_>>()
        );
        for (k, v) in &da.attrs {
            same_attr(v, &db.attrs[k], elided_ok, k);
        }
    }
}

fn mlir_opt() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("MLIR_OPT") {
        return Some(PathBuf::from(p));
    }
    let p = PathBuf::from("/usr/lib/llvm-22/bin/mlir-opt");
    if p.exists() {
        return Some(p);
    }
    Command::new("mlir-opt")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("mlir-opt"))
}

/// Run `mlir-opt --allow-unregistered-dialect` on `text`; return its output, or `None` (with a
/// printed note) when mlir-opt is not installed.
fn run_mlir_opt(text: &str, tag: &str) -> Option<String> {
    let Some(bin) = mlir_opt() else {
        eprintln!("note: mlir-opt not found; skipping the mlir-opt check ({tag})");
        return None;
    };
    let path = std::env::temp_dir().join(format!("pipec-text-{}-{tag}.mlir", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let out = Command::new(&bin)
        .arg("--allow-unregistered-dialect")
        .arg(&path)
        .output()
        .expect("running mlir-opt");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "mlir-opt rejected the text ({tag}):\n{}\n--- text ---\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

/// mlir-opt accepts `text`, accepts its own output of it, and we parse its output back to the
/// same module (`m`) except for the value names mlir-opt renumbers.
fn check_mlir_opt(text: &str, tag: &str, m: &Module, elided_ok: bool) {
    if let Some(out) = run_mlir_opt(text, tag) {
        let again = run_mlir_opt(&out, &format!("{tag}-again")).unwrap();
        assert_eq!(out, again, "mlir-opt output is not stable ({tag})");
        match parse(&out, "mlir-opt-output") {
            Ok(back) => assert_same_impl(m, &back, elided_ok, false),
            Err(e) => panic!("cannot parse mlir-opt's output ({tag}): {e}\n{out}"),
        }
    }
}

#[test]
fn exact_round_trip_of_everything() {
    let m = big_module();
    let t1 = print(&m);
    let m2 = parse(&t1, "t1.mlir").unwrap_or_else(|e| panic!("{e}\n{t1}"));
    let t2 = print(&m2);
    if std::env::var_os("PIPEC_SHOW_TEXT").is_some() {
        println!("{t1}");
    }
    assert_eq!(t1, t2);
    assert_same(&m, &m2, true);
    // The names that needed it are kept.
    assert!(
        t1.contains("pipec.names = [\"/layer1/conv/Conv_output_0\"]"),
        "{t1}"
    );
    assert!(
        t1.contains("%a_b_1 = \"pipec.initializer\"() {pipec.name = \"a_b\""),
        "{t1}"
    );
    assert!(t1.contains("pipec.graph_name = \"main graph!\""), "{t1}");
    // Weights stay out of the text.
    assert!(t1.contains("dense_resource<onnx__W_0>"), "{t1}");
    assert!(t1.contains("dense_resource<custom_key>"), "{t1}");
    assert!(!t1.contains("dialect_resources"));
    let elided = m2
        .graph
        .initializers
        .values()
        .filter(|t| matches!(t.payload, Payload::Elided(_)))
        .count();
    assert!(elided > 20);
}

#[test]
fn exact_round_trip_with_resources() {
    let m = big_module();
    let opts = PrintOptions {
        emit_resources: true,
        ..Default::default()
    };
    let t1 = print_with(&m, &opts);
    assert!(t1.contains("dialect_resources"));
    assert!(t1.contains("onnx__W_0: \"0x04000000"), "{t1}");
    let m2 = parse(&t1, "t1.mlir").unwrap_or_else(|e| panic!("{e}"));
    // Everything, data included, except the one tensor that had no data to start with.
    assert_same(&m, &m2, false);
    assert_eq!(print_with(&m2, &opts), t1);
    // And the elided print of the reparsed module is the elided print of the original.
    assert_eq!(print(&m2), print(&m));
}

#[test]
fn threshold_zero_elides_everything_but_strings() {
    let m = big_module();
    let opts = PrintOptions {
        elide_threshold: 0,
        emit_resources: true,
    };
    let t = print_with(&m, &opts);
    let m2 = parse(&t, "t").unwrap_or_else(|e| panic!("{e}"));
    assert_same(&m, &m2, false);
    assert_eq!(print_with(&m2, &opts), t);
}

#[test]
fn mlir_opt_accepts_the_output() {
    let m = big_module();
    check_mlir_opt(&print(&m), "elided", &m, true);
    let opts = PrintOptions {
        emit_resources: true,
        ..Default::default()
    };
    check_mlir_opt(&print_with(&m, &opts), "resources", &m, false);
    check_mlir_opt(&print(&tiny()), "tiny", &tiny(), true);
}

#[test]
fn every_dtype_is_accepted_by_mlir_opt() {
    // One input per dtype, ranked, unranked and with a symbolic dim, and a constant of each.
    let mut g = Graph::new("main");
    let mut rng = Rng(7);
    let mut outs = Vec::new();
    for &dt in &DType::ALL {
        outs.push(g.add_input(format!("r.{dt}"), TensorType::known(dt, &[2, 3])));
        outs.push(g.add_input(format!("u.{dt}"), TensorType::unranked(dt)));
        outs.push(g.add_input(
            format!("s.{dt}"),
            TensorType::new(dt, vec![Dim::sym("n"), Dim::Known(1)]),
        ));
        outs.push(g.add_initializer(format!("c.{dt}"), random_tensor(&mut rng, dt, vec![2, 2])));
    }
    g.outputs = outs;
    let m = Module {
        graph: g,
        ..Default::default()
    };
    let t = print(&m);
    for &dt in &DType::ALL {
        assert!(t.contains(dt.mlir_name()), "{dt}");
    }
    let m2 = parse(&t, "t").unwrap_or_else(|e| panic!("{e}"));
    assert_same(&m, &m2, false);
    assert_eq!(print(&m2), t);
    check_mlir_opt(&t, "dtypes", &m, false);
}

/// A tiny graph whose print is pinned below.
fn tiny() -> Module {
    let mut g = Graph::new("main");
    let x = g.add_input(
        "input",
        TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(3)]),
    );
    let w = g.add_initializer(
        "fc.weight",
        TensorData::from_f32(vec![8, 3], &(0..24).map(|i| i as f32).collect::<Vec<_>>()),
    );
    let b = g.add_initializer(
        "fc.bias",
        TensorData::from_f32(vec![8], &[0.5, -1.0, 0.0, 2.0, 0.1, 1e-8, 3e20, -0.0]),
    );
    let mut gemm = op("/fc/Gemm", "Gemm", "", vec![Some(x), Some(w), Some(b)]);
    gemm.attrs.insert("transB".into(), Attr::Int(1));
    gemm.attrs.insert("alpha".into(), Attr::Float(1.0));
    let (_, y) = g.add_op(
        gemm,
        vec![(
            "/fc/Gemm_output_0".into(),
            TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(8)]),
        )],
    );
    let (_, z) = g.add_op(
        op("relu", "Relu", "", vec![Some(y[0])]),
        vec![(
            "out".into(),
            TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(8)]),
        )],
    );
    g.outputs = vec![z[0]];
    let mut m = Module {
        graph: g,
        ir_version: 8,
        producer_name: "pytorch".into(),
        ..Default::default()
    };
    m.opset_imports.insert("".into(), 17);
    m
}

#[test]
fn golden_tiny_graph() {
    let expected = r#"module attributes {pipec.ir_version = 8 : i64, pipec.opset_imports = [["", 17]], pipec.producer_name = "pytorch"} {
  func.func @main(%input: tensor<?x3xf32, ["batch"]>) -> (tensor<?x8xf32, ["batch"]>) {
    %fc.weight = "pipec.initializer"() {value = dense_resource<fc.weight> : tensor<8x3xf32>} : () -> tensor<8x3xf32>
    %fc.bias = "pipec.initializer"() {value = dense<[0.5, -1.0, 0.0, 2.0, 0.1, 1.0e-8, 3.0e20, -0.0]> : tensor<8xf32>} : () -> tensor<8xf32>
    %fc_Gemm_output_0 = "onnx.Gemm"(%input, %fc.weight, %fc.bias) {alpha = 1.0 : f32, pipec.names = ["/fc/Gemm_output_0"], pipec.node = "/fc/Gemm", transB = 1 : i64} : (tensor<?x3xf32, ["batch"]>, tensor<8x3xf32>, tensor<8xf32>) -> tensor<?x8xf32, ["batch"]>
    %out = "onnx.Relu"(%fc_Gemm_output_0) {pipec.node = "relu"} : (tensor<?x8xf32, ["batch"]>) -> tensor<?x8xf32, ["batch"]>
    func.return %out : tensor<?x8xf32, ["batch"]>
  }
}
"#;
    let t = print(&tiny());
    assert_eq!(t, expected, "\n{t}");
    let with = print_with(
        &tiny(),
        &PrintOptions {
            emit_resources: true,
            ..Default::default()
        },
    );
    let tail = "\n{-#\n  dialect_resources: {\n    builtin: {\n      fc.weight: \"0x04000000000000000000803F";
    assert!(
        with.starts_with(expected) && with[expected.len()..].starts_with(tail),
        "{with}"
    );
}

fn parse_err(src: &str) -> (usize, usize, String) {
    match parse(src, "bad.mlir") {
        Err(Error::Parse {
            file,
            line,
            col,
            msg,
        }) => {
            assert_eq!(file, "bad.mlir");
            (line, col, msg)
        }
        Err(e) => panic!("not a parse error: {e}"),
        Ok(_) => panic!("parsed: {src}"),
    }
}

#[test]
fn errors_name_the_culprit_with_position() {
    let src = "module {\n  func.func @main() -> (tensor<f32>) {\n    %a = \"onnx.Neg\"(%nope) : (tensor<f32>) -> tensor<f32>\n    func.return %a : tensor<f32>\n  }\n}\n";
    let (line, col, msg) = parse_err(src);
    assert_eq!((line, col), (3, 21), "{msg}");
    assert!(msg.contains("%nope"), "{msg}");

    let src = "module {\n  func.func @main(%x: tensor<f32>) {\n    %x = \"onnx.Neg\"(%x) : (tensor<f32>) -> tensor<f32>\n    func.return\n  }\n}\n";
    let (line, _, msg) = parse_err(src);
    assert_eq!(line, 3);
    assert!(msg.contains("redefinition of value '%x'"), "{msg}");

    let (line, col, msg) = parse_err("module {\n  func.func @main(%x: tensor<2xfoo>) {\n");
    assert_eq!((line, col), (2, 32), "{msg}");
    assert!(msg.contains("unknown element type 'foo'"), "{msg}");

    let (_, _, msg) = parse_err("module {\n func.func @main() {\n \"onnx.X\"() {v = dense<[1, 2]> : tensor<3xf32>} : () -> ()\n func.return\n }\n}");
    assert!(msg.contains("2 elements"), "{msg}");

    let (line, col, msg) = parse_err("module {\n func.func @main(%x: tensor<2xf32>) {\n %y = \"onnx.Neg\"(%x) : (tensor<3xf32>) -> tensor<2xf32>\n func.return\n }\n}");
    assert_eq!((line, col), (3, 18), "{msg}");
    assert!(
        msg.contains("used with type tensor<3xf32> but defined with type tensor<2xf32>"),
        "{msg}"
    );

    let (_, _, msg) = parse_err("");
    assert!(msg.contains("end of input"), "{msg}");

    let e = parse("module {", "x.mlir").unwrap_err().to_string();
    assert!(e.starts_with("x.mlir:1:9: parse error:"), "{e}");
}

#[test]
fn no_panics_on_garbled_input() {
    let text = print(&big_module());
    let with = print_with(
        &big_module(),
        &PrintOptions {
            emit_resources: true,
            elide_threshold: 4,
        },
    );
    // Every prefix (on char boundaries) of valid prints.
    for t in [&text, &with] {
        let step = (t.len() / 3000).max(1);
        for i in (0..t.len()).step_by(step) {
            if t.is_char_boundary(i) {
                let _ = parse(&t[..i], "prefix");
            }
        }
    }
    // Random mutations of a valid print.
    let mut rng = Rng(12345);
    let tiny_text = print(&tiny());
    let alphabet = b"%@\"{}[]()<>:,=-#?*x0123456789.abcfiste_ \n\\!";
    for _ in 0..3000 {
        let mut b = tiny_text.clone().into_bytes();
        for _ in 0..(1 + rng.next() % 4) {
            let i = (rng.next() as usize) % b.len();
            match rng.next() % 3 {
                0 => b[i] = alphabet[(rng.next() as usize) % alphabet.len()],
                1 => {
                    b.remove(i);
                }
                _ => b.insert(i, alphabet[(rng.next() as usize) % alphabet.len()]),
            }
        }
        let s = String::from_utf8_lossy(&b);
        if let Ok(m) = parse(&s, "mutated") {
            // Whatever parses must print and parse back to the same text.
            let t = print(&m);
            let m2 = parse(&t, "reprint").unwrap_or_else(|e| panic!("{e}\n{t}\nfrom\n{s}"));
            assert_eq!(print(&m2), t);
        }
    }
    // Pure noise, and pathological nesting.
    for _ in 0..500 {
        let n = (rng.next() % 200) as usize;
        let b: Vec<u8> = (0..n)
            .map(|_| alphabet[(rng.next() as usize) % alphabet.len()])
            .collect();
        let _ = parse(&String::from_utf8_lossy(&b), "noise");
        let _ = parse(&String::from_utf8_lossy(&rng.bytes(n)), "noise");
    }
    let deep = format!("module attributes {{a = {}}} {{}}", "[".repeat(100_000));
    assert!(parse(&deep, "deep").is_err());
    let splat = "module {\n func.func @main() {\n \"onnx.X\"() {v = dense<1.0> : tensor<99999999999xf32>} : () -> ()\n func.return\n }\n}";
    assert!(parse(splat, "splat").is_err());
}

#[test]
fn large_graph_prints_and_parses_fast() {
    // GPT-2-sized: ~150 weights, 2500 ops in a chain with long ONNX names.
    let mut g = Graph::new("torch_jit");
    let seq = TensorType::new(
        DType::F32,
        vec![Dim::sym("batch"), Dim::sym("seq"), Dim::Known(768)],
    );
    let mut cur = g.add_input("input_ids", seq.clone());
    for i in 0..2500 {
        let w = g.add_initializer(
            format!("transformer.h.{i}.attn.c_attn.weight"),
            TensorData {
                dtype: DType::F32,
                dims: vec![768, 768],
                payload: Payload::Raw(Bytes::from(vec![0u8; 16])),
            },
        );
        let mut d = op(
            &format!("/transformer/h.{i}/attn/MatMul"),
            "MatMul",
            "",
            vec![Some(cur), Some(w)],
        );
        d.attrs.insert("axes".into(), Attr::Ints(vec![1, 2, 3]));
        let (_, o) = g.add_op(
            d,
            vec![(
                format!("/transformer/h.{i}/attn/MatMul_output_0"),
                seq.clone(),
            )],
        );
        cur = o[0];
    }
    g.outputs = vec![cur];
    let m = Module {
        graph: g,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let t = print(&m);
    let dp = t0.elapsed();
    let t0 = std::time::Instant::now();
    let m2 = parse(&t, "big").unwrap();
    let dq = t0.elapsed();
    eprintln!("2500 ops: print {dp:?}, parse {dq:?}, {} bytes", t.len());
    assert_eq!(print(&m2), t);
    // Generous bounds for an unoptimized build on a busy machine; linear work is ~10x below.
    assert!(dp.as_millis() < 2000 && dq.as_millis() < 2000);
}

#[test]
fn parses_hand_written_mlir() {
    // Custom-ish input: bare `?` dims, `return`, result groups, splats, comments.
    let src = r#"
// a comment
func.func @f(%a: tensor<?x2xf32>) -> tensor<?x2xf32> {
  %c = "pipec.initializer"() {value = dense<1.5> : tensor<2x2xf32>} : () -> tensor<2x2xf32>
  %r:2 = "onnx.Split"(%a) {axis = 0 : i64, split = [1, 1]} : (tensor<?x2xf32>) -> (tensor<?x2xf32>, tensor<?x2xf32>)
  return %r#1 : tensor<?x2xf32>
}
"#;
    let m = parse(src, "f.mlir").unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    assert_eq!(g.name, "f");
    let c = g.initializers.values().next().unwrap();
    assert_eq!(c.to_f64_vec().unwrap(), vec![1.5; 4]);
    let d = &g.ops[g.order[0]];
    assert_eq!(d.ints_attr("split"), Some(&[1i64, 1][..]));
    assert_eq!(g.name(g.outputs[0]), "r#1");
    assert_eq!(g.ty(g.inputs[0]).shape.as_ref().unwrap()[0], Dim::sym("?"));
    // And it prints to something that round-trips.
    let t = print(&m);
    assert_eq!(print(&parse(&t, "t").unwrap()), t);
}

#[test]
fn empty_module() {
    let m = Module::default();
    let t = print(&m);
    assert_eq!(
        t,
        "module attributes {pipec.ir_version = 0 : i64, pipec.opset_imports = []} {\n  func.func @main() attributes {pipec.graph_name = \"\"} {\n    func.return\n  }\n}\n"
    );
    let m2 = parse(&t, "t").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m2.graph.name, "");
    assert_eq!(print(&m2), t);
    check_mlir_opt(&t, "empty", &m, false);
}

/// A longer run of the mutation fuzzing, over the big module (`cargo test -- --ignored`).
#[test]
#[ignore]
fn fuzz_long() {
    let texts = [
        print(&big_module()),
        print_with(
            &big_module(),
            &PrintOptions {
                emit_resources: true,
                elide_threshold: 8,
            },
        ),
    ];
    let alphabet = b"%@\"{}[]()<>:,=-#?*x0123456789.abcfiste_ \n\\!";
    let mut rng = Rng(987654321);
    let iters: usize = std::env::var("FUZZ_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    for k in 0..iters {
        let mut b = texts[k % 2].clone().into_bytes();
        for _ in 0..(1 + rng.next() % 3) {
            if b.is_empty() {
                break;
            }
            let i = (rng.next() as usize) % b.len();
            match rng.next() % 4 {
                0 => b[i] = alphabet[(rng.next() as usize) % alphabet.len()],
                1 => {
                    b.remove(i);
                }
                2 => b.insert(i, alphabet[(rng.next() as usize) % alphabet.len()]),
                _ => b.truncate(i),
            }
        }
        let s = String::from_utf8_lossy(&b);
        if let Ok(m) = parse(&s, "mutated") {
            let t = print(&m);
            let m2 = parse(&t, "reprint").unwrap_or_else(|e| panic!("{e}\n{t}"));
            assert_eq!(print(&m2), t);
        }
    }
}

#[test]
fn wide_inline_tensors_survive_mlir_opt_hex_form() {
    // mlir-opt prints dense literals over 100 elements as dense<"0x...">; that must parse back.
    let mut rng = Rng(99);
    let mut g = Graph::new("main");
    let mut outs = Vec::new();
    for &dt in &DType::ALL {
        outs.push(g.add_initializer(
            format!("big.{dt}"),
            random_tensor(&mut rng, dt, vec![3, 67]),
        ));
        outs.push(g.add_initializer(
            format!("splat.{dt}"),
            TensorData {
                dtype: dt,
                dims: vec![150],
                payload: match dt {
                    DType::String => Payload::Strings(vec![Bytes::from_static(b"x"); 150]),
                    _ => Payload::Raw(Bytes::from(vec![
                        if dt == DType::Bool { 1 } else { 0x11 };
                        dt.bytes_for(150).unwrap() as usize
                    ])),
                },
            },
        ));
    }
    g.outputs = outs;
    let m = Module {
        graph: g,
        ..Default::default()
    };
    let opts = PrintOptions {
        elide_threshold: 1000,
        emit_resources: false,
    };
    let t = print_with(&m, &opts);
    assert!(!t.contains("dense_resource"));
    let m2 = parse(&t, "t").unwrap_or_else(|e| panic!("{e}"));
    assert_same(&m, &m2, false);
    assert_eq!(print_with(&m2, &opts), t);
    if let Some(out) = run_mlir_opt(&t, "hex") {
        assert!(out.contains("dense<\"0x"), "{out}");
        let back = parse(&out, "hex-out").unwrap_or_else(|e| panic!("{e}"));
        assert_same_impl(&m, &back, false, false);
    }
}
