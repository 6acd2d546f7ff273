//! Shape inference on hand-built graphs. Expected sizes for conv/pool/slice/resize cases were
//! cross-checked against onnxruntime 1.31 on the same graphs (batch 3).

use pipec_compiler::ir::{Attr, DType, Dim, Graph, Module, OpData, TensorData, TensorType, Value};
use pipec_compiler::shape::{infer_op, infer_shapes, SymbolicValues};
use pipec_compiler::Error;
use std::collections::BTreeMap;

/// Parse `"batch,3,224"` into dims.
fn dims(s: &str) -> Vec<Dim> {
    if s.is_empty() {
        return vec![];
    }
    s.split(',')
        .map(|d| Dim::parse(d.trim()).expect("dim"))
        .collect()
}

struct B {
    g: Graph,
    n: usize,
    opset: i64,
}

impl B {
    fn new(opset: i64) -> Self {
        B {
            g: Graph::new("t"),
            n: 0,
            opset,
        }
    }
    fn input(&mut self, name: &str, dt: DType, shape: &str) -> Value {
        self.g.add_input(name, TensorType::new(dt, dims(shape)))
    }
    fn ints(&mut self, dims: Vec<i64>, vals: &[i64]) -> Value {
        self.n += 1;
        self.g
            .add_initializer(format!("c{}", self.n), TensorData::from_i64(dims, vals))
    }
    fn scalar(&mut self, v: i64) -> Value {
        self.ints(vec![], &[v])
    }
    fn vec(&mut self, vals: &[i64]) -> Value {
        self.ints(vec![vals.len() as i64], vals)
    }
    fn floats(&mut self, dims: Vec<i64>, vals: &[f32]) -> Value {
        self.n += 1;
        self.g
            .add_initializer(format!("f{}", self.n), TensorData::from_f32(dims, vals))
    }
    fn op_n(
        &mut self,
        op_type: &str,
        inputs: &[Option<Value>],
        attrs: Vec<(&str, Attr)>,
        nout: usize,
    ) -> Vec<Value> {
        self.n += 1;
        let name = format!("{op_type}_{}", self.n);
        let results = (0..nout)
            .map(|i| (format!("{name}:{i}"), TensorType::unranked(DType::F32)))
            .collect();
        let data = OpData {
            name,
            op_type: op_type.to_string(),
            domain: String::new(),
            inputs: inputs.to_vec(),
            outputs: vec![],
            attrs: attrs
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect::<BTreeMap<_, _>>(),
        };
        self.g.add_op(data, results).1
    }
    fn op(&mut self, op_type: &str, inputs: &[Value], attrs: Vec<(&str, Attr)>) -> Value {
        let ins: Vec<Option<Value>> = inputs.iter().map(|v| Some(*v)).collect();
        self.op_n(op_type, &ins, attrs, 1)[0]
    }
    fn module(self) -> Module {
        let mut m = Module {
            graph: self.g,
            ..Default::default()
        };
        m.opset_imports.insert(String::new(), self.opset);
        m
    }
    fn run(self) -> Module {
        let mut m = self.module();
        infer_shapes(&mut m).expect("inference");
        m
    }
    fn run_err(self) -> Error {
        let mut m = self.module();
        infer_shapes(&mut m).expect_err("expected an error")
    }
}

fn shape(m: &Module, v: Value) -> String {
    match &m.graph.ty(v).shape {
        None => "?".into(),
        Some(s) => s
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

#[test]
fn symbolic_broadcasting() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, "batch,1,5");
    let y = b.input("y", DType::F32, "4,1");
    let z = b.input("z", DType::F32, "batch,4,1");
    let s = b.input("s", DType::F32, "seq");
    let k = b.input("k", DType::F32, "7");
    let a = b.op("Add", &[x, y], vec![]);
    let c = b.op("Mul", &[a, z], vec![]);
    let d = b.op("Sub", &[s, k], vec![]);
    let e = b.op("Greater", &[x, y], vec![]);
    let w = b.op("Where", &[e, x, z], vec![]);
    let m = b.run();
    assert_eq!(shape(&m, a), "batch,4,5");
    assert_eq!(shape(&m, c), "batch,4,5");
    assert_eq!(shape(&m, d), "7", "a known dim wins over a symbol");
    assert_eq!(shape(&m, e), "batch,4,5");
    assert_eq!(m.graph.ty(e).dtype, DType::Bool);
    assert_eq!(shape(&m, w), "batch,4,5");
    assert_eq!(m.graph.ty(w).dtype, DType::F32);
}

#[test]
fn broadcast_mismatch_is_an_error() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, "batch,3");
    let y = b.input("y", DType::F32, "4");
    b.op("Add", &[x, y], vec![]);
    let e = b.run_err().to_string();
    assert!(
        e.contains("Add_1") && e.contains("3") && e.contains("4"),
        "{e}"
    );
}

#[test]
fn reshape_zero_minus_one_with_symbolic_batch() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, "batch,32,128");
    let s1 = b.vec(&[0, -1]);
    let s2 = b.vec(&[-1, 128]);
    let s3 = b.vec(&[0, 0, 4, 32]);
    let s4 = b.vec(&[-1]);
    let r1 = b.op("Reshape", &[x, s1], vec![]);
    let r2 = b.op("Reshape", &[x, s2], vec![]);
    let r3 = b.op("Reshape", &[x, s3], vec![]);
    let r4 = b.op("Reshape", &[x, s4], vec![]);
    // Back from [32*batch, 128] to [batch, 32, 128] with a -1 in front.
    let s5 = b.vec(&[-1, 32, 128]);
    let r5 = b.op("Reshape", &[r2, s5], vec![]);
    let m = b.run();
    assert_eq!(shape(&m, r1), "batch,4096");
    assert_eq!(shape(&m, r2), "32*batch,128");
    assert_eq!(shape(&m, r3), "batch,32,4,32");
    assert_eq!(shape(&m, r4), "4096*batch");
    assert_eq!(shape(&m, r5), "batch,32,128");
}

#[test]
fn reshape_allowzero() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, "0,4");
    let s = b.vec(&[0, 8]);
    let r = b.op("Reshape", &[x, s], vec![("allowzero", Attr::Int(1))]);
    let m = b.run();
    assert_eq!(shape(&m, r), "0,8");
}

#[test]
fn reshape_element_count_mismatch_names_node_and_counts() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, "2,3");
    let s = b.vec(&[4, 2]);
    b.op("Reshape", &[x, s], vec![]);
    let e = b.run_err();
    assert!(matches!(e, Error::Shape { .. }));
    let e = e.to_string();
    assert!(
        e.contains("Reshape_2") && e.contains("6") && e.contains("8"),
        "{e}"
    );

    let mut b = B::new(17);
    let x = b.input("x", DType::F32, "2,5");
    let s = b.vec(&[3, -1]);
    b.op("Reshape", &[x, s], vec![]);
    let e = b.run_err().to_string();
    assert!(e.contains("10") && e.contains("multiple of 3"), "{e}");
}

/// The GPT-2 export's reshape-target arithmetic: `Shape → Gather → Unsqueeze → Concat →
/// Reshape`, with a symbolic batch, and the `Slice(Shape, -1, INT64_MAX) → Squeeze` idiom.
#[test]
fn gpt2_reshape_chain_stays_static() {
    let mut b = B::new(17);
    let x = b.input("ln", DType::F32, "batch,32,128");
    let sh = b.op("Shape", &[x], vec![]);
    let i0 = b.scalar(0);
    let i1 = b.scalar(1);
    let g0 = b.op("Gather", &[sh, i0], vec![("axis", Attr::Int(0))]);
    let g1 = b.op("Gather", &[sh, i1], vec![("axis", Attr::Int(0))]);
    let st = b.vec(&[-1]);
    let en = b.vec(&[i64::MAX]);
    let ax = b.vec(&[0]);
    let sl = b.op("Slice", &[sh, st, en, ax], vec![]);
    let sq = b.op("Squeeze", &[sl, ax], vec![]);
    let m1 = b.scalar(-1);
    let u0 = b.op("Unsqueeze", &[m1, ax], vec![]);
    let u1 = b.op("Unsqueeze", &[sq, ax], vec![]);
    let cat = b.op("Concat", &[u0, u1], vec![("axis", Attr::Int(0))]);
    let flat = b.op("Reshape", &[x, cat], vec![("allowzero", Attr::Int(0))]);
    let w = b.floats(vec![128, 384], &vec![0.0; 128 * 384]);
    let bias = b.floats(vec![384], &[0.0; 384]);
    let gemm = b.op("Gemm", &[flat, w, bias], vec![]);
    let c384 = b.scalar(384);
    let ua = b.op("Unsqueeze", &[g0, ax], vec![]);
    let ub = b.op("Unsqueeze", &[g1, ax], vec![]);
    let uc = b.op("Unsqueeze", &[c384, ax], vec![]);
    let cat2 = b.op("Concat", &[ua, ub, uc], vec![("axis", Attr::Int(0))]);
    let back = b.op("Reshape", &[gemm, cat2], vec![]);
    let split = b.vec(&[128, 128, 128]);
    let parts = b.op_n(
        "Split",
        &[Some(back), Some(split)],
        vec![("axis", Attr::Int(2))],
        3,
    );
    // [batch, 32, 4, 32] heads, then transpose.
    let c4 = b.scalar(4);
    let c32 = b.scalar(32);
    let u4 = b.op("Unsqueeze", &[c4, ax], vec![]);
    let u32_ = b.op("Unsqueeze", &[c32, ax], vec![]);
    let cat3 = b.op("Concat", &[ua, ub, u4, u32_], vec![("axis", Attr::Int(0))]);
    let heads = b.op("Reshape", &[parts[0], cat3], vec![]);
    let tr = b.op("Transpose", &[heads], vec![("perm", ints(&[0, 2, 1, 3]))]);
    let m = b.run();
    assert_eq!(shape(&m, sh), "3");
    assert_eq!(shape(&m, g0), "");
    assert_eq!(shape(&m, flat), "32*batch,128");
    assert_eq!(shape(&m, gemm), "32*batch,384");
    assert_eq!(shape(&m, back), "batch,32,384");
    assert_eq!(shape(&m, parts[2]), "batch,32,128");
    assert_eq!(shape(&m, tr), "batch,4,32,32");
}

/// The GPT-2 causal/padding mask tail: `Concat → Reshape(-1) → Shape → ConstantOfShape → Mul(-1)
/// → Equal → Where → Expand`.
#[test]
fn gpt2_mask_expand_chain() {
    let mut b = B::new(17);
    let mask = b.input("mask", DType::Bool, "batch,1,32,32");
    let ids = b.input("ids", DType::I64, "batch,32");
    let sh = b.op("Shape", &[ids], vec![]);
    let i0 = b.scalar(0);
    let i1 = b.scalar(1);
    let ax = b.vec(&[0]);
    let g0 = b.op("Gather", &[sh, i0], vec![]);
    let g1 = b.op("Gather", &[sh, i1], vec![]);
    let m1 = b.scalar(-1);
    let ua = b.op("Unsqueeze", &[g0, ax], vec![]);
    let ub = b.op("Unsqueeze", &[m1, ax], vec![]);
    let uc = b.op("Unsqueeze", &[g1, ax], vec![]);
    let cat = b.op("Concat", &[ua, ub, uc, uc], vec![("axis", Attr::Int(0))]);
    let minus1 = b.vec(&[-1]);
    let r = b.op("Reshape", &[cat, minus1], vec![]);
    let rs = b.op("Shape", &[r], vec![]);
    let one = TensorData::from_i64(vec![1], &[1]);
    let cos = b.op("ConstantOfShape", &[rs], vec![("value", Attr::Tensor(one))]);
    let mul = b.op("Mul", &[cos, m1], vec![]);
    let eq = b.op("Equal", &[r, mul], vec![]);
    let wh = b.op("Where", &[eq, cos, r], vec![]);
    let ex = b.op("Expand", &[mask, wh], vec![]);
    // A Range over a static length and a symbolic one.
    let z = b.scalar(0);
    let rg = b.op("Range", &[z, g1, i1], vec![]);
    let rgb = b.op("Range", &[z, g0, i1], vec![]);
    let m = b.run();
    assert_eq!(shape(&m, cos), "4");
    assert_eq!(shape(&m, wh), "4");
    assert_eq!(shape(&m, ex), "batch,1,32,32");
    assert_eq!(shape(&m, rg), "32");
    assert_eq!(shape(&m, rgb), "batch");
    assert_eq!(m.graph.ty(eq).dtype, DType::Bool);
}

fn conv_case(x: &str, w: &[i64], attrs: Vec<(&str, Attr)>) -> String {
    let mut b = B::new(18);
    let xv = b.input("x", DType::F32, x);
    let n: i64 = w.iter().product();
    let wv = b.floats(w.to_vec(), &vec![0.0; n as usize]);
    let y = b.op("Conv", &[xv, wv], attrs);
    shape(&b.run(), y)
}

#[test]
fn conv_output_sizes() {
    // floor((in + pads - d*(k-1) - 1) / s) + 1; values match onnxruntime.
    let w = [6, 3, 2, 4];
    let cases: Vec<(Vec<(&str, Attr)>, &str)> = vec![
        (
            vec![
                ("strides", ints(&[2, 3])),
                ("pads", ints(&[1, 0, 2, 1])),
                ("dilations", ints(&[2, 1])),
            ],
            "batch,6,9,6",
        ),
        (
            vec![
                ("strides", ints(&[2, 2])),
                ("auto_pad", Attr::String("SAME_UPPER".into())),
            ],
            "batch,6,9,10",
        ),
        (
            vec![
                ("strides", ints(&[3, 1])),
                ("auto_pad", Attr::String("SAME_LOWER".into())),
            ],
            "batch,6,6,19",
        ),
        (
            vec![
                ("strides", ints(&[2, 2])),
                ("auto_pad", Attr::String("VALID".into())),
            ],
            "batch,6,8,8",
        ),
        (vec![("kernel_shape", ints(&[2, 4]))], "batch,6,16,16"),
    ];
    for (attrs, want) in cases {
        assert_eq!(conv_case("batch,3,17,19", &w, attrs), want);
    }
    // Grouped conv.
    assert_eq!(
        conv_case(
            "batch,4,9,9",
            &[8, 2, 3, 3],
            vec![
                ("group", Attr::Int(2)),
                ("strides", ints(&[2, 2])),
                ("pads", ints(&[1, 1, 1, 1]))
            ]
        ),
        "batch,8,5,5"
    );
    // Symbolic spatial dims survive "same" convolutions.
    assert_eq!(
        conv_case(
            "n,3,h,w",
            &[6, 3, 3, 3],
            vec![("pads", ints(&[1, 1, 1, 1]))]
        ),
        "n,6,h,w"
    );
    assert_eq!(
        conv_case(
            "n,3,2*h,w",
            &[6, 3, 3, 3],
            vec![
                ("strides", ints(&[2, 1])),
                ("auto_pad", Attr::String("SAME_UPPER".into()))
            ]
        ),
        "n,6,h,w"
    );
}

#[test]
fn conv_channel_mismatch_is_an_error() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "1,4,8,8");
    let w = b.floats(vec![2, 3, 1, 1], &[0.0; 6]);
    b.op("Conv", &[x, w], vec![]);
    let e = b.run_err().to_string();
    assert!(e.contains("Conv_2") && e.contains("channels"), "{e}");
}

#[test]
fn conv_transpose_output_sizes() {
    let run = |attrs: Vec<(&str, Attr)>| {
        let mut b = B::new(18);
        let x = b.input("x", DType::F32, "batch,4,5,7");
        let w = b.floats(vec![4, 3, 3, 3], &[0.0; 108]);
        let y = b.op("ConvTranspose", &[x, w], attrs);
        shape(&b.run(), y)
    };
    assert_eq!(
        run(vec![
            ("strides", ints(&[2, 2])),
            ("output_padding", ints(&[1, 0])),
            ("pads", ints(&[1, 1, 0, 2]))
        ]),
        "batch,3,11,12"
    );
    assert_eq!(
        run(vec![
            ("strides", ints(&[2, 3])),
            ("output_shape", ints(&[11, 22]))
        ]),
        "batch,3,11,22"
    );
    assert_eq!(
        run(vec![
            ("strides", ints(&[2, 2])),
            ("auto_pad", Attr::String("SAME_UPPER".into()))
        ]),
        "batch,3,10,14"
    );
    assert_eq!(run(vec![("dilations", ints(&[2, 1]))]), "batch,3,9,9");
}

#[test]
fn pool_output_sizes_and_ceil_mode() {
    let run = |op: &str, attrs: Vec<(&str, Attr)>| {
        let mut b = B::new(19);
        let x = b.input("x", DType::F32, "batch,3,17,19");
        let y = b.op_n(op, &[Some(x)], attrs, if op == "MaxPool" { 2 } else { 1 });
        let m = b.run();
        let s: Vec<String> = y.iter().map(|v| shape(&m, *v)).collect();
        if let Some(i) = y.get(1) {
            assert_eq!(m.graph.ty(*i).dtype, DType::I64);
        }
        s[0].clone()
    };
    let k = |v: &[i64]| ("kernel_shape", ints(v));
    assert_eq!(
        run(
            "MaxPool",
            vec![
                k(&[3, 3]),
                ("strides", ints(&[2, 2])),
                ("ceil_mode", Attr::Int(1))
            ]
        ),
        "batch,3,8,9"
    );
    assert_eq!(
        run(
            "MaxPool",
            vec![
                k(&[3, 2]),
                ("strides", ints(&[2, 2])),
                ("pads", ints(&[1, 1, 1, 1])),
                ("ceil_mode", Attr::Int(1)),
                ("dilations", ints(&[2, 1]))
            ]
        ),
        "batch,3,8,10"
    );
    assert_eq!(
        run(
            "AveragePool",
            vec![
                k(&[4, 4]),
                ("strides", ints(&[3, 3])),
                ("pads", ints(&[1, 1, 1, 1])),
                ("ceil_mode", Attr::Int(1))
            ]
        ),
        "batch,3,6,7"
    );
    assert_eq!(
        run(
            "AveragePool",
            vec![
                k(&[3, 3]),
                ("strides", ints(&[2, 2])),
                ("auto_pad", Attr::String("SAME_UPPER".into()))
            ]
        ),
        "batch,3,9,10"
    );
    assert_eq!(
        run("MaxPool", vec![k(&[2, 2]), ("strides", ints(&[2, 2]))]),
        "batch,3,8,9"
    );
    assert_eq!(run("GlobalAveragePool", vec![]), "batch,3,1,1");
    // ceil_mode: the last window may not start inside the end padding (in 4, k 2, s 2, pad 1/1).
    let mut b = B::new(19);
    let x = b.input("x", DType::F32, "1,1,4");
    let y = b.op(
        "MaxPool",
        &[x],
        vec![
            k(&[2]),
            ("strides", ints(&[2])),
            ("pads", ints(&[1, 1])),
            ("ceil_mode", Attr::Int(1)),
        ],
    );
    assert_eq!(shape(&b.run(), y), "1,1,3");
    // Missing kernel_shape: error naming the node.
    let mut b = B::new(19);
    let x = b.input("x", DType::F32, "1,1,4,4");
    b.op("MaxPool", &[x], vec![]);
    assert!(b.run_err().to_string().contains("kernel_shape"));
}

#[test]
fn matmul_gemm_einsum() {
    let mut b = B::new(18);
    let a = b.input("a", DType::F32, "batch,1,5,6");
    let w = b.input("w", DType::F32, "7,6,4");
    let v = b.input("v", DType::F32, "6");
    let m2 = b.input("m2", DType::F32, "5,6");
    let d = b.input("d", DType::F32, "4,4");
    let mm = b.op("MatMul", &[a, w], vec![]);
    let mv = b.op("MatMul", &[v, w], vec![]);
    let am = b.op("MatMul", &[a, v], vec![]);
    let vv = b.op("MatMul", &[v, v], vec![]);
    let g1 = b.op("Gemm", &[m2, m2], vec![("transB", Attr::Int(1))]);
    let g2 = b.op("Gemm", &[m2, m2], vec![("transA", Attr::Int(1))]);
    let eq = |s: &str| vec![("equation", Attr::String(s.into()))];
    let e1 = b.op("Einsum", &[a, w], eq("...ij,kjl->...ikl"));
    let e2 = b.op("Einsum", &[m2, m2], eq("ij,kj"));
    let e3 = b.op("Einsum", &[a], eq("...ij->...ji"));
    let e4 = b.op("Einsum", &[a], eq("bcij->"));
    let e5 = b.op("Einsum", &[d], eq("ii->i"));
    let e6 = b.op("Einsum", &[a], eq("b...->...b"));
    let m = b.run();
    assert_eq!(shape(&m, mm), "batch,7,5,4");
    assert_eq!(shape(&m, mv), "7,4");
    assert_eq!(shape(&m, am), "batch,1,5");
    assert_eq!(shape(&m, vv), "");
    assert_eq!(shape(&m, g1), "5,5");
    assert_eq!(shape(&m, g2), "6,6");
    assert_eq!(shape(&m, e1), "batch,1,5,7,4");
    assert_eq!(shape(&m, e2), "5,5");
    assert_eq!(shape(&m, e3), "batch,1,6,5");
    assert_eq!(shape(&m, e4), "");
    assert_eq!(shape(&m, e5), "4");
    assert_eq!(shape(&m, e6), "1,5,6,batch");

    let mut b = B::new(18);
    let a = b.input("a", DType::F32, "2,3");
    let c = b.input("c", DType::F32, "4,5");
    b.op("MatMul", &[a, c], vec![]);
    assert!(b.run_err().to_string().contains("inner dimensions"));

    let mut b = B::new(18);
    let a = b.input("a", DType::F32, "2,3");
    b.op(
        "Einsum",
        &[a],
        vec![("equation", Attr::String("ijk->i".into()))],
    );
    assert!(b.run_err().to_string().contains("rank"));
}

#[test]
fn normalizations() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,4,6,5");
    let s = b.floats(vec![4], &[1.0; 4]);
    let s5 = b.floats(vec![6, 5], &[1.0; 30]);
    let bn = b.op_n(
        "BatchNormalization",
        &[Some(x), Some(s), Some(s), Some(s), Some(s)],
        vec![("training_mode", Attr::Int(1))],
        3,
    );
    let ln = b.op_n(
        "LayerNormalization",
        &[Some(x), Some(s5), Some(s5)],
        vec![("axis", Attr::Int(-2))],
        3,
    );
    let m = b.run();
    assert_eq!(shape(&m, bn[0]), "batch,4,6,5");
    assert_eq!(shape(&m, bn[1]), "4");
    assert_eq!(shape(&m, bn[2]), "4");
    assert_eq!(shape(&m, ln[0]), "batch,4,6,5");
    assert_eq!(shape(&m, ln[1]), "batch,4,1,1");
    assert_eq!(shape(&m, ln[2]), "batch,4,1,1");
}

#[test]
fn shape_ops() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,4,6,5");
    let ax = b.vec(&[1, -1]);
    let fl0 = b.op("Flatten", &[x], vec![("axis", Attr::Int(0))]);
    let fl2 = b.op("Flatten", &[x], vec![("axis", Attr::Int(-2))]);
    let tr = b.op("Transpose", &[x], vec![]);
    let us = b.op("Unsqueeze", &[x, ax], vec![]);
    let sq = b.op("Squeeze", &[us, ax], vec![]);
    let cc = b.op("Concat", &[x, x], vec![("axis", Attr::Int(0))]);
    let sp = b.op_n(
        "Split",
        &[Some(x)],
        vec![("axis", Attr::Int(-1)), ("num_outputs", Attr::Int(3))],
        3,
    );
    let st = b.vec(&[-1, 1]);
    let en = b.vec(&[-100, 100]);
    let sax = b.vec(&[1, 2]);
    let ss = b.vec(&[-1, 2]);
    let sl = b.op("Slice", &[x, st, en, sax, ss], vec![]);
    let gi = b.scalar(1);
    let ga = b.op("Gather", &[x, gi], vec![("axis", Attr::Int(1))]);
    let k = b.vec(&[3]);
    let tk = b.op_n("TopK", &[Some(x), Some(k)], vec![("axis", Attr::Int(2))], 2);
    let pads = b.vec(&[1, 2, 0, 3]);
    let pax = b.vec(&[1, 3]);
    let pd = b.op_n("Pad", &[Some(x), Some(pads), None, Some(pax)], vec![], 1)[0];
    let rep = b.vec(&[1, 2, 2, 2]);
    let tl = b.op("Tile", &[x, rep], vec![]);
    let sc = b.floats(vec![4], &[1.0, 1.0, 2.0, 0.5]);
    let rz = b.op_n("Resize", &[Some(x), None, Some(sc)], vec![], 1)[0];
    let sz = b.vec(&[7, 8]);
    let rz2 = b.op_n(
        "Resize",
        &[Some(x), None, None, Some(sz)],
        vec![("axes", ints(&[2, 3]))],
        1,
    )[0];
    let shp = b.op(
        "Shape",
        &[x],
        vec![("start", Attr::Int(1)), ("end", Attr::Int(-1))],
    );
    let cos = b.op("ConstantOfShape", &[shp], vec![]);
    let ex_s = b.vec(&[3, 1, 1, 1, 1]);
    let ex = b.op("Expand", &[x, ex_s], vec![]);
    let d2s = b.op("DepthToSpace", &[tl], vec![("blocksize", Attr::Int(2))]);
    let s2d = b.op("SpaceToDepth", &[tl], vec![("blocksize", Attr::Int(2))]);
    let am = b.op(
        "ArgMax",
        &[x],
        vec![("axis", Attr::Int(-1)), ("keepdims", Attr::Int(0))],
    );
    let rm = b.op("ReduceMean", &[x, ax], vec![("keepdims", Attr::Int(0))]);
    let rs = b.op("ReduceSum", &[x], vec![]);
    let rn = b.op_n(
        "ReduceSum",
        &[Some(x), None],
        vec![("noop_with_empty_axes", Attr::Int(1))],
        1,
    )[0];
    let m = b.run();
    assert_eq!(shape(&m, fl0), "1,120*batch");
    assert_eq!(shape(&m, fl2), "4*batch,30");
    assert_eq!(shape(&m, tr), "5,6,4,batch");
    assert_eq!(shape(&m, us), "batch,1,4,6,5,1");
    assert_eq!(shape(&m, sq), "batch,4,6,5");
    assert_eq!(shape(&m, cc), "2*batch,4,6,5");
    let sps: Vec<String> = sp.iter().map(|v| shape(&m, *v)).collect();
    assert_eq!(sps, ["batch,4,6,2", "batch,4,6,2", "batch,4,6,1"]);
    assert_eq!(shape(&m, sl), "batch,4,3,5");
    assert_eq!(shape(&m, ga), "batch,6,5");
    assert_eq!(shape(&m, tk[0]), "batch,4,3,5");
    assert_eq!(m.graph.ty(tk[1]).dtype, DType::I64);
    assert_eq!(shape(&m, pd), "batch,5,6,10");
    assert_eq!(shape(&m, tl), "batch,8,12,10");
    assert_eq!(shape(&m, rz), "batch,4,12,2");
    assert_eq!(shape(&m, rz2), "batch,4,7,8");
    assert_eq!(shape(&m, shp), "2");
    assert_eq!(shape(&m, cos), "4,6");
    assert_eq!(shape(&m, ex), "3,batch,4,6,5");
    assert_eq!(shape(&m, d2s), "batch,2,24,20");
    assert_eq!(shape(&m, s2d), "batch,32,6,5");
    assert_eq!(shape(&m, am), "batch,4,6");
    assert_eq!(m.graph.ty(am).dtype, DType::I64);
    assert_eq!(shape(&m, rm), "batch,6");
    assert_eq!(shape(&m, rs), "1,1,1,1");
    assert_eq!(shape(&m, rn), "batch,4,6,5");
}

#[test]
fn attribute_forms_of_older_opsets() {
    let mut b = B::new(11);
    let x = b.input("x", DType::F32, "batch,4,6,1");
    let sq = b.op("Squeeze", &[x], vec![("axes", ints(&[3]))]);
    let us = b.op("Unsqueeze", &[x], vec![("axes", ints(&[0, 5]))]);
    let sp = b.op_n(
        "Split",
        &[Some(x)],
        vec![("axis", Attr::Int(2)), ("split", ints(&[2, 4]))],
        2,
    );
    let rm = b.op("ReduceMean", &[x], vec![("axes", ints(&[1, 2]))]);
    let m = b.run();
    assert_eq!(shape(&m, sq), "batch,4,6");
    assert_eq!(shape(&m, us), "1,batch,4,6,1,1");
    assert_eq!(shape(&m, sp[1]), "batch,4,4,1");
    assert_eq!(shape(&m, rm), "batch,1,1,1");

    let mut b = B::new(9);
    let x = b.input("x", DType::F32, "batch,4,6,1");
    let sl = b.op(
        "Slice",
        &[x],
        vec![
            ("starts", ints(&[1, -3])),
            ("ends", ints(&[3, 1000])),
            ("axes", ints(&[2, 1])),
        ],
    );
    let sc = b.floats(vec![4], &[1.0, 1.0, 2.0, 3.0]);
    let up = b.op("Upsample", &[x, sc], vec![]);
    let m = b.run();
    assert_eq!(shape(&m, sl), "batch,3,2,1");
    assert_eq!(shape(&m, up), "batch,4,12,3");
}

#[test]
fn gathers_scatters_one_hot() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,4,6");
    let gi = b.input("gi", DType::I64, "batch,4,2");
    let nd = b.input("nd", DType::I64, "3,2");
    let ndb = b.input("ndb", DType::I64, "batch,2,1");
    let oh = b.input("oh", DType::I64, "batch,3");
    let depth = b.scalar(5);
    let vals = b.floats(vec![2], &[0.0, 1.0]);
    let ge = b.op("GatherElements", &[x, gi], vec![("axis", Attr::Int(2))]);
    let gn = b.op("GatherND", &[x, nd], vec![]);
    let gnb = b.op("GatherND", &[x, ndb], vec![("batch_dims", Attr::Int(1))]);
    let up = b.input("up", DType::F32, "3,6");
    let snd = b.op("ScatterND", &[x, nd, up], vec![]);
    let ohot = b.op("OneHot", &[oh, depth, vals], vec![("axis", Attr::Int(1))]);
    let m = b.run();
    assert_eq!(shape(&m, ge), "batch,4,2");
    assert_eq!(shape(&m, gn), "3,6");
    assert_eq!(shape(&m, gnb), "batch,2,6");
    assert_eq!(shape(&m, snd), "batch,4,6");
    assert_eq!(shape(&m, ohot), "batch,5,3");

    // Constant index out of range.
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "2,4");
    let i = b.scalar(4);
    b.op("Gather", &[x, i], vec![("axis", Attr::Int(1))]);
    assert!(b.run_err().to_string().contains("out of range"));
}

#[test]
fn data_dependent_ops_get_fresh_symbols() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,5");
    let nz = b.op("NonZero", &[x], vec![]);
    let u = b.op_n("Unique", &[Some(x)], vec![], 4);
    let m = b.run();
    let s = m.graph.ty(nz).shape.clone().expect("ranked");
    assert_eq!(s[0], Dim::Known(2));
    assert!(matches!(s[1], Dim::Sym(_)));
    assert_eq!(m.graph.ty(nz).dtype, DType::I64);
    assert_eq!(m.graph.ty(u[0]).rank(), Some(1));
    assert_eq!(shape(&m, u[2]), "5*batch");
}

#[test]
fn constant_forms_and_casts() {
    let mut b = B::new(18);
    let c1 = b.op("Constant", &[], vec![("value_float", Attr::Float(1.0))]);
    let c2 = b.op("Constant", &[], vec![("value_ints", ints(&[2, 3]))]);
    let c3 = b.op(
        "Constant",
        &[],
        vec![(
            "value",
            Attr::Tensor(TensorData::from_f32(vec![2, 2], &[0.0; 4])),
        )],
    );
    let c4 = b.op(
        "Constant",
        &[],
        vec![("value_strings", Attr::Strings(vec!["a".into()]))],
    );
    // value_ints feed a shape: ConstantOfShape([2, 3]).
    let cos = b.op("ConstantOfShape", &[c2], vec![]);
    let ca = b.op("Cast", &[c3], vec![("to", Attr::Int(7))]);
    let cl = b.op("CastLike", &[c3, c2], vec![]);
    let m = b.run();
    assert_eq!(m.graph.ty(c1), &TensorType::known(DType::F32, &[]));
    assert_eq!(m.graph.ty(c2), &TensorType::known(DType::I64, &[2]));
    assert_eq!(m.graph.ty(c3), &TensorType::known(DType::F32, &[2, 2]));
    assert_eq!(m.graph.ty(c4), &TensorType::known(DType::String, &[1]));
    assert_eq!(shape(&m, cos), "2,3");
    assert_eq!(m.graph.ty(ca).dtype, DType::I64);
    assert_eq!(m.graph.ty(cl).dtype, DType::I64);

    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "2");
    b.op("Cast", &[x], vec![]);
    let e = b.run_err().to_string();
    assert!(e.contains("Cast_1") && e.contains("'to'"), "{e}");
}

#[test]
fn dim_overflow_is_an_error_not_a_panic() {
    let mut b = B::new(18);
    let big = i64::MAX / 2;
    let x = b.input("x", DType::F32, &format!("{big},4"));
    b.op("Flatten", &[x], vec![("axis", Attr::Int(0))]);
    let e = b.run_err();
    assert!(matches!(e, Error::Shape { .. }));
    assert!(e.to_string().contains("overflow"), "{e}");

    let mut b = B::new(18);
    let x = b.input("x", DType::F32, &format!("batch,{big}"));
    let r = b.vec(&[1, 4]);
    b.op("Tile", &[x, r], vec![]);
    assert!(b.run_err().to_string().contains("overflow"));

    let mut b = B::new(18);
    let x = b.input("x", DType::F32, &format!("1,1,{big}"));
    b.op(
        "MaxPool",
        &[x],
        vec![
            ("kernel_shape", ints(&[1])),
            ("pads", ints(&[i64::MAX, i64::MAX])),
        ],
    );
    assert!(b.run_err().to_string().contains("overflow"));
}

#[test]
fn unknown_op_and_domain() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "2");
    b.op("FancyOp", &[x], vec![]);
    match b.run_err() {
        Error::UnknownOp {
            node,
            op_type,
            domain,
        } => {
            assert_eq!(
                (node.as_str(), op_type.as_str(), domain.as_str()),
                ("FancyOp_1", "FancyOp", "")
            );
        }
        e => panic!("{e}"),
    }
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "2");
    b.op("Relu", &[x], vec![]);
    let op = b.g.order[0];
    b.g.ops[op].domain = "com.microsoft".into();
    assert!(matches!(b.run_err(), Error::UnknownOp { domain, .. } if domain == "com.microsoft"));
}

#[test]
fn declared_types_merge() {
    // A declared symbol is replaced by the inferred static dim; a declared static dim is kept
    // where inference only has a fresh symbol.
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,3");
    let y = b.op("Relu", &[x], vec![]);
    b.g.values[y].ty = TensorType::new(DType::F32, dims("n,3"));
    let nz = b.op("NonZero", &[x], vec![]);
    b.g.values[nz].ty = TensorType::new(DType::I64, dims("2,7"));
    let m = b.run();
    assert_eq!(shape(&m, y), "batch,3");
    assert_eq!(shape(&m, nz), "2,7");

    // A declared static dim that disagrees with the inferred one.
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,3");
    let y = b.op("Relu", &[x], vec![]);
    b.g.values[y].ty = TensorType::new(DType::F32, dims("batch,4"));
    let e = b.run_err();
    assert!(matches!(e, Error::Shape { .. }));
    let e = e.to_string();
    assert!(
        e.contains("Relu_1") && e.contains("declared 4") && e.contains("inferred 3"),
        "{e}"
    );
}

#[test]
fn infer_op_on_a_single_op() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,8");
    let y = b.op_n("Split", &[Some(x)], vec![("axis", Attr::Int(1))], 2);
    let op = b.g.order[0];
    let tys = infer_op(&b.g, op, 18, &SymbolicValues::new()).expect("infer");
    assert_eq!(tys.len(), 2);
    assert_eq!(tys[1], TensorType::new(DType::F32, dims("batch,4")));
    assert_eq!(y.len(), 2);
}

#[test]
fn missing_or_bad_attributes_name_the_node() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "2,3");
    b.op("Concat", &[x, x], vec![("axis", Attr::Int(5))]);
    let e = b.run_err().to_string();
    assert!(e.contains("Concat_1") && e.contains("axis 5"), "{e}");

    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "2,3");
    b.op("Transpose", &[x], vec![("perm", ints(&[0, 0]))]);
    assert!(b.run_err().to_string().contains("Transpose_1"));

    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "2,3");
    b.op("Relu", &[], vec![]);
    let _ = x;
    let e = b.run_err().to_string();
    assert!(
        e.contains("has 0 operands but Relu (opset 14) takes 1"),
        "{e}"
    );
}

/// `bias[:, :, 0:seq, 0:seq]` with `seq = Shape(ids)[1]` symbolic: the slice takes the symbol.
#[test]
fn slice_with_symbolic_end() {
    let mut b = B::new(17);
    let ids = b.input("ids", DType::I64, "batch,seq");
    let bias = b.input("bias", DType::Bool, "1,1,128,128");
    let sh = b.op("Shape", &[ids], vec![]);
    let i1 = b.vec(&[1]);
    let seq = b.op("Gather", &[sh, i1], vec![]);
    let zero = b.vec(&[0]);
    let ax2 = b.vec(&[2]);
    let ax3 = b.vec(&[3]);
    let s1 = b.op("Slice", &[bias, zero, seq, ax2], vec![]);
    let s2 = b.op("Slice", &[s1, zero, seq, ax3], vec![]);
    // Non-constant starts: only the sliced axis becomes unknown.
    let x = b.input("x", DType::F32, "batch,4,9");
    let st = b.input("st", DType::I64, "1");
    let s3 = b.op("Slice", &[x, st, seq, ax2], vec![]);
    let m = b.run();
    assert_eq!(shape(&m, s1), "1,1,seq,128");
    assert_eq!(shape(&m, s2), "1,1,seq,seq");
    let s3s = shape(&m, s3);
    assert!(s3s.starts_with("batch,4,unk_"), "{s3s}");
}

#[test]
fn registry_covers_the_required_ops() {
    let have = pipec_compiler::shape::supported_ops();
    let want = "Conv ConvTranspose Gemm MatMul BatchNormalization LayerNormalization \
        InstanceNormalization GroupNormalization Relu LeakyRelu Elu Selu Gelu Erf Tanh Sigmoid \
        HardSigmoid HardSwish Softplus Mish Softmax LogSoftmax MaxPool AveragePool \
        GlobalAveragePool GlobalMaxPool Add Sub Mul Div Pow Sqrt Reciprocal Neg Abs Exp Log Sin \
        Cos Floor Ceil Round Sign Clip Min Max Sum Mean Where Equal Less LessOrEqual Greater \
        GreaterOrEqual And Or Xor Not IsNaN IsInf Cast CastLike Reshape Flatten Transpose Squeeze \
        Unsqueeze Concat Split Slice Gather GatherElements GatherND ScatterND ScatterElements \
        Expand Shape Size ConstantOfShape Constant Range ReduceMean ReduceSum ReduceMax ReduceMin \
        ReduceProd ReduceL2 ReduceLogSumExp ReduceSumSquare ArgMax ArgMin Identity Dropout Pad \
        Resize Upsample Einsum Trilu CumSum TopK Tile OneHot NonZero Unique Compress \
        MatMulInteger Mod BitShift LpNormalization DepthToSpace SpaceToDepth Det";
    for op in want.split_whitespace() {
        assert!(have.contains(&op), "no rule for {op}");
    }
}

/// `F.pad(x, (1, 2, 0, 3))` as exported without constant folding: the pads go through a 2-D
/// `Reshape(-1, 2) → Slice(step -1) → Transpose → Reshape(-1)` before `Pad`.
#[test]
fn torch_pad_chain_with_2d_values() {
    let mut b = B::new(17);
    let x = b.input("x", DType::F32, "batch,3,5,6");
    let p = b.vec(&[1, 2, 0, 3]);
    let four = b.vec(&[4]);
    let zero = TensorData::from_i64(vec![1], &[0]);
    let zeros = b.op(
        "ConstantOfShape",
        &[four],
        vec![("value", Attr::Tensor(zero))],
    );
    let allp = b.op("Concat", &[p, zeros], vec![("axis", Attr::Int(0))]);
    let r2 = b.vec(&[-1, 2]);
    let p2 = b.op("Reshape", &[allp, r2], vec![]);
    let st = b.vec(&[-1]);
    let en = b.vec(&[-i64::MAX]);
    let ax = b.vec(&[0]);
    let step = b.vec(&[-1]);
    let rev = b.op("Slice", &[p2, st, en, ax, step], vec![]);
    let tr = b.op("Transpose", &[rev], vec![("perm", ints(&[1, 0]))]);
    let m1 = b.vec(&[-1]);
    let flat = b.op("Reshape", &[tr, m1], vec![]);
    let pads = b.op("Cast", &[flat], vec![("to", Attr::Int(7))]);
    let zf = b.floats(vec![], &[0.0]);
    let padded = b.op("Pad", &[x, pads, zf], vec![]);
    // Broadcasting on 2-D values: [[0,1,2],[3,4,5]] + [[1],[2]] = [[1,2,3],[5,6,7]].
    let mat = b.ints(vec![2, 3], &[0, 1, 2, 3, 4, 5]);
    let col = b.ints(vec![2, 1], &[1, 2]);
    let sum = b.op("Add", &[mat, col], vec![]);
    let sumf = b.op("Reshape", &[sum, m1], vec![]);
    let s1 = b.vec(&[3]);
    let e1 = b.vec(&[6]);
    let tail = b.op("Slice", &[sumf, s1, e1], vec![]);
    let cos = b.op("ConstantOfShape", &[tail], vec![]);
    let m = b.run();
    assert_eq!(shape(&m, padded), "batch,3,8,9");
    assert_eq!(shape(&m, cos), "5,6,7");
}

#[test]
fn negative_result_dims_are_an_error() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "batch,3");
    let r = b.vec(&[1, -2]);
    b.op("Tile", &[x, r], vec![]);
    let e = b.run_err().to_string();
    assert!(e.contains("Tile_2") && e.contains("negative dim -6"), "{e}");
}

#[test]
fn declared_minus_one_means_unknown() {
    let mut b = B::new(18);
    let x = b.input("x", DType::F32, "-1,3");
    let y = b.op("Relu", &[x], vec![]);
    b.g.values[y].ty = TensorType::new(DType::F32, dims("-1,3"));
    let z = b.op("Relu", &[y], vec![]);
    let w = b.input("w", DType::F32, "2,3");
    let a = b.op("Add", &[w, w], vec![]);
    b.g.values[a].ty = TensorType::new(DType::F32, dims("-1,3"));
    b.g.outputs = vec![z, a];
    let m = b.run();
    assert_eq!(shape(&m, z), "-1,3");
    assert_eq!(shape(&m, a), "2,3");
}
