//! Tests of the constant evaluator, one or more per op. Expected values were computed once with
//! numpy (`np.transpose`, `np.take`, `np.arange`, `np.triu`, ... on the same inputs) and inlined.

use cranelift_entity::EntityRef;
use pipec_compiler::eval::{eval_op, MAX_ELEMENTS};
use pipec_compiler::ir::{Attr, DType, Dim, OpData, Payload, TensorData, TensorType, Value};
use pipec_compiler::Result;

const OPSET: i64 = 17;

/// A node named `n0` with `n_in` operands.
fn node(op_type: &str, n_in: usize, attrs: &[(&str, Attr)]) -> OpData {
    OpData {
        name: "n0".into(),
        op_type: op_type.into(),
        inputs: (0..n_in).map(|i| Some(Value::new(i))).collect(),
        outputs: vec![Value::new(100)],
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

fn eval_at(op: &OpData, ins: &[TensorData], opset: i64) -> Result<Option<Vec<TensorData>>> {
    let refs: Vec<Option<&TensorData>> = ins.iter().map(Some).collect();
    eval_op(op, &refs, &[], opset)
}

/// Evaluate a one-result op that must fold.
fn ev(op_type: &str, attrs: &[(&str, Attr)], ins: &[TensorData]) -> TensorData {
    ev_at(op_type, attrs, ins, OPSET)
}

fn ev_at(op_type: &str, attrs: &[(&str, Attr)], ins: &[TensorData], opset: i64) -> TensorData {
    let op = node(op_type, ins.len(), attrs);
    let mut out = eval_at(&op, ins, opset)
        .unwrap_or_else(|e| panic!("{op_type}: {e}"))
        .unwrap_or_else(|| panic!("{op_type}: not evaluated"));
    assert_eq!(out.len(), 1);
    out.remove(0)
}

/// The error message of an op that must fail.
fn ev_err(op_type: &str, attrs: &[(&str, Attr)], ins: &[TensorData]) -> String {
    let op = node(op_type, ins.len(), attrs);
    match eval_at(&op, ins, OPSET) {
        Err(e) => e.to_string(),
        Ok(r) => panic!("{op_type}: expected an error, got {r:?}"),
    }
}

fn ev_none(op_type: &str, attrs: &[(&str, Attr)], ins: &[TensorData]) {
    let op = node(op_type, ins.len(), attrs);
    assert!(
        matches!(eval_at(&op, ins, OPSET), Ok(None)),
        "{op_type}: expected Ok(None)"
    );
}

fn i64s(dims: &[i64], v: &[i64]) -> TensorData {
    TensorData::from_i64(dims.to_vec(), v)
}

fn f32s(dims: &[i64], v: &[f32]) -> TensorData {
    TensorData::from_f32(dims.to_vec(), v)
}

/// A tensor of any numeric dtype from f64 values (test inputs only).
fn typed(dtype: DType, dims: &[i64], v: &[f64]) -> TensorData {
    let mut b = Vec::new();
    for &x in v {
        match dtype {
            DType::F64 => b.extend_from_slice(&x.to_le_bytes()),
            DType::F32 => b.extend_from_slice(&(x as f32).to_le_bytes()),
            DType::F16 => b.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
            DType::BF16 => b.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
            DType::I64 => b.extend_from_slice(&(x as i64).to_le_bytes()),
            DType::I32 => b.extend_from_slice(&(x as i32).to_le_bytes()),
            DType::I8 => b.push(x as i8 as u8),
            DType::U8 => b.push(x as u8),
            DType::Bool => b.push(u8::from(x != 0.0)),
            _ => unreachable!(),
        }
    }
    TensorData::from_raw(dtype, dims.to_vec(), b.into()).unwrap()
}

fn bools(dims: &[i64], v: &[bool]) -> TensorData {
    let f: Vec<f64> = v.iter().map(|b| f64::from(u8::from(*b))).collect();
    typed(DType::Bool, dims, &f)
}

#[track_caller]
fn check_i(t: &TensorData, dtype: DType, dims: &[i64], v: &[i64]) {
    assert_eq!(t.dtype, dtype);
    assert_eq!(t.dims, dims);
    assert_eq!(t.to_i64_vec().unwrap(), v);
}

#[track_caller]
fn check_f(t: &TensorData, dtype: DType, dims: &[i64], v: &[f64]) {
    assert_eq!(t.dtype, dtype);
    assert_eq!(t.dims, dims);
    let got = t.to_f64_vec().unwrap();
    assert_eq!(got.len(), v.len(), "{got:?} vs {v:?}");
    for (g, w) in got.iter().zip(v) {
        assert!(
            g == w || (g - w).abs() <= 1e-6 * w.abs() || (g.is_nan() && w.is_nan()),
            "{got:?} vs {v:?}"
        );
    }
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn iota(dims: &[i64]) -> TensorData {
    let n: i64 = dims.iter().product();
    i64s(dims, &(0..n).collect::<Vec<_>>())
}

// --- Constants, casts, shapes ----------------------------------------------------------------

#[test]
fn constant_all_value_forms() {
    let t = f32s(&[2], &[1.0, 2.0]);
    assert_eq!(
        ev("Constant", &[("value", Attr::Tensor(t.clone()))], &[]),
        t
    );
    check_f(
        &ev("Constant", &[("value_float", Attr::Float(2.5))], &[]),
        DType::F32,
        &[],
        &[2.5],
    );
    check_f(
        &ev(
            "Constant",
            &[("value_floats", Attr::Floats(vec![1.0, -1.0]))],
            &[],
        ),
        DType::F32,
        &[2],
        &[1.0, -1.0],
    );
    check_i(
        &ev("Constant", &[("value_int", Attr::Int(7))], &[]),
        DType::I64,
        &[],
        &[7],
    );
    check_i(
        &ev("Constant", &[("value_ints", ints(&[3, 4]))], &[]),
        DType::I64,
        &[2],
        &[3, 4],
    );
    let s = ev(
        "Constant",
        &[("value_string", Attr::String("hi".into()))],
        &[],
    );
    assert_eq!(s.dtype, DType::String);
    assert_eq!(s.payload, Payload::Strings(vec!["hi".into()]));
    let s = ev(
        "Constant",
        &[("value_strings", Attr::Strings(vec!["a".into(), "b".into()]))],
        &[],
    );
    assert_eq!(s.dims, [2]);
}

#[test]
fn identity_copies() {
    let t = i64s(&[2], &[5, 6]);
    assert_eq!(ev("Identity", &[], std::slice::from_ref(&t)), t);
}

#[test]
fn cast_between_dtypes() {
    let to = |d: DType| [("to", Attr::Int(d.onnx_code() as i64))];
    let x = f32s(&[4], &[-2.7, 2.7, 0.0, 300.0]);
    // Float -> int truncates toward zero (C semantics, as onnxruntime).
    check_i(
        &ev("Cast", &to(DType::I64), std::slice::from_ref(&x)),
        DType::I64,
        &[4],
        &[-2, 2, 0, 300],
    );
    check_i(
        &ev("Cast", &to(DType::Bool), std::slice::from_ref(&x)),
        DType::Bool,
        &[4],
        &[1, 1, 0, 1],
    );
    // numpy: np.array([1.0000001, 3.14159265, 65520.0, -1e-8, 1/3], np.float32).astype(np.float16)
    let v = f32s(
        &[5],
        &[1.000_000_1, std::f32::consts::PI, 65520.0, -1e-8, 1.0 / 3.0],
    );
    check_f(
        &ev("Cast", &to(DType::F16), std::slice::from_ref(&v)),
        DType::F16,
        &[5],
        &[1.0, 3.140625, f64::INFINITY, -0.0, 0.333251953125],
    );
    // bf16 keeps the top 16 bits of f32, rounded to nearest even.
    check_f(
        &ev("Cast", &to(DType::BF16), &[v]),
        DType::BF16,
        &[5],
        &[1.0, 3.140625, 65536.0, -1.0011717677116394e-8, 0.333984375],
    );
    // Integer narrowing wraps (numpy astype).
    let i = typed(DType::I32, &[3], &[300.0, -1.0, 200.0]);
    check_i(
        &ev("Cast", &to(DType::U8), &[i]),
        DType::U8,
        &[3],
        &[44, 255, 200],
    );
    let u = typed(DType::U8, &[2], &[200.0, 5.0]);
    check_i(
        &ev("Cast", &to(DType::I8), &[u]),
        DType::I8,
        &[2],
        &[-56, 5],
    );
    let b = bools(&[2], &[true, false]);
    check_f(
        &ev("Cast", &to(DType::F64), &[b]),
        DType::F64,
        &[2],
        &[1.0, 0.0],
    );
    let h = typed(DType::F16, &[2], &[1.5, -2.0]);
    check_i(
        &ev("Cast", &to(DType::I32), &[h]),
        DType::I32,
        &[2],
        &[1, -2],
    );
    assert!(ev_err("Cast", &[("to", Attr::Int(99))], &[f32s(&[], &[1.0])]).contains("99"));
}

#[test]
fn shape_and_size_from_types() {
    let ty = TensorType::new(
        DType::F32,
        vec![Dim::sym("batch"), Dim::Known(3), Dim::Known(4)],
    );
    let op = node("Shape", 1, &[]);
    // All dims: one is symbolic, so no constant.
    assert!(eval_op(&op, &[None], &[Some(&ty)], OPSET)
        .unwrap()
        .is_none());
    // Shape(start = -2) selects only known dims (opset 15).
    let op = node("Shape", 1, &[("start", Attr::Int(-2))]);
    let r = eval_op(&op, &[None], &[Some(&ty)], OPSET).unwrap().unwrap();
    check_i(&r[0], DType::I64, &[2], &[3, 4]);
    let op = node(
        "Shape",
        1,
        &[("start", Attr::Int(1)), ("end", Attr::Int(-1))],
    );
    let r = eval_op(&op, &[None], &[Some(&ty)], OPSET).unwrap().unwrap();
    check_i(&r[0], DType::I64, &[1], &[3]);
    // Static type, no data: the whole shape and the size.
    let st = TensorType::known(DType::F32, &[2, 3, 4]);
    let r = eval_op(&node("Shape", 1, &[]), &[None], &[Some(&st)], OPSET)
        .unwrap()
        .unwrap();
    check_i(&r[0], DType::I64, &[3], &[2, 3, 4]);
    let r = eval_op(&node("Size", 1, &[]), &[None], &[Some(&st)], OPSET)
        .unwrap()
        .unwrap();
    check_i(&r[0], DType::I64, &[], &[24]);
    assert!(eval_op(&node("Size", 1, &[]), &[None], &[Some(&ty)], OPSET)
        .unwrap()
        .is_none());
    // From data; the data may be larger than the cap since it is not read.
    check_i(
        &ev("Shape", &[], &[iota(&[2, 5])]),
        DType::I64,
        &[2],
        &[2, 5],
    );
}

// --- Data movement ---------------------------------------------------------------------------

#[test]
fn gather_any_axis_and_negative_indices() {
    let x = iota(&[2, 3, 4]);
    // np.take(x, [[2, 0], [-1, 1]], axis=1)
    let g = ev(
        "Gather",
        &[("axis", Attr::Int(1))],
        &[x.clone(), i64s(&[2, 2], &[2, 0, -1, 1])],
    );
    check_i(
        &g,
        DType::I64,
        &[2, 2, 2, 4],
        &[
            8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 20,
            21, 22, 23, 16, 17, 18, 19,
        ],
    );
    // Scalar index on the last axis (i32 indices).
    let i = typed(DType::I32, &[], &[-1.0]);
    let g = ev("Gather", &[("axis", Attr::Int(-1))], &[x.clone(), i]);
    check_i(&g, DType::I64, &[2, 3], &[3, 7, 11, 15, 19, 23]);
    // The GPT-2 pattern: Gather(Shape, 0).
    let g = ev("Gather", &[], &[i64s(&[3], &[1, 8, 64]), i64s(&[], &[0])]);
    check_i(&g, DType::I64, &[], &[1]);
}

#[test]
fn gather_out_of_range_names_node() {
    let e = ev_err(
        "Gather",
        &[("axis", Attr::Int(1))],
        &[iota(&[2, 3]), i64s(&[1], &[3])],
    );
    assert!(e.contains("node 'n0' (Gather)"), "{e}");
    assert!(e.contains("index 3"), "{e}");
    let e = ev_err("Gather", &[], &[iota(&[2, 3]), i64s(&[1], &[-3])]);
    assert!(e.contains("index -3"), "{e}");
}

#[test]
fn unsqueeze_and_squeeze() {
    let x = iota(&[2, 3]);
    let u = ev("Unsqueeze", &[], &[x.clone(), i64s(&[2], &[0, -1])]);
    check_i(&u, DType::I64, &[1, 2, 3, 1], &[0, 1, 2, 3, 4, 5]);
    // Opset 11: axes as an attribute.
    let u = ev_at(
        "Unsqueeze",
        &[("axes", ints(&[1]))],
        std::slice::from_ref(&x),
        11,
    );
    assert_eq!(u.dims, [2, 1, 3]);
    let s = ev("Squeeze", &[], &[iota(&[1, 3, 1])]);
    assert_eq!(s.dims, [3]);
    let s = ev("Squeeze", &[], &[iota(&[1, 3, 1]), i64s(&[1], &[-1])]);
    assert_eq!(s.dims, [1, 3]);
    assert!(ev_err("Squeeze", &[], &[x, i64s(&[1], &[1])]).contains("axis 1"));
}

#[test]
fn concat_negative_axis() {
    let c = ev(
        "Concat",
        &[("axis", Attr::Int(-1))],
        &[iota(&[2, 1]), i64s(&[2, 2], &[7, 8, 9, 10])],
    );
    check_i(&c, DType::I64, &[2, 3], &[0, 7, 8, 1, 9, 10]);
    let c = ev(
        "Concat",
        &[("axis", Attr::Int(0))],
        &[i64s(&[1], &[1]), i64s(&[2], &[-1, 768])],
    );
    check_i(&c, DType::I64, &[3], &[1, -1, 768]);
    let e = ev_err(
        "Concat",
        &[("axis", Attr::Int(0))],
        &[iota(&[2, 1]), iota(&[2, 2])],
    );
    assert!(e.contains("(Concat)"), "{e}");
}

#[test]
fn slice_steps_and_clamping() {
    let x = iota(&[2, 3, 4]);
    // x[:, ::-2, 1:-1]
    let s = ev(
        "Slice",
        &[],
        &[
            x.clone(),
            i64s(&[2], &[-1, 1]),
            i64s(&[2], &[i64::MIN, -1]),
            i64s(&[2], &[1, 2]),
            i64s(&[2], &[-2, 1]),
        ],
    );
    check_i(&s, DType::I64, &[2, 2, 2], &[9, 10, 1, 2, 21, 22, 13, 14]);
    // x[..., 3:0:-1]
    let s = ev(
        "Slice",
        &[],
        &[
            x.clone(),
            i64s(&[1], &[3]),
            i64s(&[1], &[0]),
            i64s(&[1], &[-1]),
            i64s(&[1], &[-1]),
        ],
    );
    check_i(
        &s,
        DType::I64,
        &[2, 3, 3],
        &[
            3, 2, 1, 7, 6, 5, 11, 10, 9, 15, 14, 13, 19, 18, 17, 23, 22, 21,
        ],
    );
    // Ends past the dim clamp; no axes means 0..n.
    let s = ev(
        "Slice",
        &[],
        &[iota(&[5]), i64s(&[1], &[2]), i64s(&[1], &[i64::MAX])],
    );
    check_i(&s, DType::I64, &[3], &[2, 3, 4]);
    // Opset 9: attributes.
    let s = ev_at(
        "Slice",
        &[
            ("starts", ints(&[1])),
            ("ends", ints(&[3])),
            ("axes", ints(&[1])),
        ],
        &[iota(&[2, 4])],
        9,
    );
    check_i(&s, DType::I64, &[2, 2], &[1, 2, 5, 6]);
    // An empty axis with a negative step gives an empty result.
    let s = ev(
        "Slice",
        &[],
        &[
            iota(&[0]),
            i64s(&[1], &[-1]),
            i64s(&[1], &[i64::MIN]),
            i64s(&[1], &[0]),
            i64s(&[1], &[-1]),
        ],
    );
    check_i(&s, DType::I64, &[0], &[]);
    assert!(ev_err(
        "Slice",
        &[],
        &[
            iota(&[5]),
            i64s(&[1], &[0]),
            i64s(&[1], &[3]),
            i64s(&[1], &[0]),
            i64s(&[1], &[0])
        ]
    )
    .contains("step 0"));
}

#[test]
fn reshape_and_flatten() {
    let x = iota(&[2, 3, 4]);
    let r = ev("Reshape", &[], &[x.clone(), i64s(&[3], &[0, -1, 2])]);
    assert_eq!(r.dims, [2, 6, 2]);
    assert_eq!(r.to_i64_vec(), x.to_i64_vec());
    let e = ev_err("Reshape", &[], &[x.clone(), i64s(&[2], &[5, -1])]);
    assert!(e.contains("(Reshape)"), "{e}");
    assert_eq!(ev("Flatten", &[], std::slice::from_ref(&x)).dims, [2, 12]);
    assert_eq!(
        ev(
            "Flatten",
            &[("axis", Attr::Int(0))],
            std::slice::from_ref(&x)
        )
        .dims,
        [1, 24]
    );
    assert_eq!(
        ev(
            "Flatten",
            &[("axis", Attr::Int(-1))],
            std::slice::from_ref(&x)
        )
        .dims,
        [6, 4]
    );
    assert_eq!(
        ev(
            "Flatten",
            &[("axis", Attr::Int(3))],
            std::slice::from_ref(&x)
        )
        .dims,
        [24, 1]
    );
    assert_eq!(
        ev("Flatten", &[("axis", Attr::Int(0))], &[i64s(&[], &[1])]).dims,
        [1, 1]
    );
    let e = ev_err("Flatten", &[("axis", Attr::Int(4))], &[iota(&[2, 3, 4])]);
    assert!(e.contains("axis 4"), "{e}");
}

#[test]
fn transpose_perm_and_default() {
    let x = iota(&[2, 3, 4]);
    let t = ev(
        "Transpose",
        &[("perm", ints(&[1, 0, 2]))],
        std::slice::from_ref(&x),
    );
    check_i(
        &t,
        DType::I64,
        &[3, 2, 4],
        &[
            0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 16, 17, 18, 19, 8, 9, 10, 11, 20, 21, 22, 23,
        ],
    );
    let t = ev("Transpose", &[], std::slice::from_ref(&x));
    check_i(
        &t,
        DType::I64,
        &[4, 3, 2],
        &[
            0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23,
        ],
    );
    // Any byte-sized dtype moves: f16.
    let h = typed(DType::F16, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    check_f(
        &ev("Transpose", &[], &[h]),
        DType::F16,
        &[2, 2],
        &[1.0, 3.0, 2.0, 4.0],
    );
    assert!(ev_err("Transpose", &[("perm", ints(&[0, 0, 1]))], &[x]).contains("perm"));
}

#[test]
fn expand_tile_constant_of_shape() {
    // np.broadcast_to([[1], [2], [3]], (2, 3, 4)), via a shape of lower-rank dims [2, 1, 4].
    let e = ev(
        "Expand",
        &[],
        &[i64s(&[3, 1], &[1, 2, 3]), i64s(&[3], &[2, 1, 4])],
    );
    check_i(
        &e,
        DType::I64,
        &[2, 3, 4],
        &[
            1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
        ],
    );
    // np.tile([[1, 2], [3, 4]], (2, 3))
    let t = ev(
        "Tile",
        &[],
        &[i64s(&[2, 2], &[1, 2, 3, 4]), i64s(&[2], &[2, 3])],
    );
    check_i(
        &t,
        DType::I64,
        &[4, 6],
        &[
            1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4,
        ],
    );
    let c = ev("ConstantOfShape", &[], &[i64s(&[2], &[2, 2])]);
    check_f(&c, DType::F32, &[2, 2], &[0.0; 4]);
    let c = ev(
        "ConstantOfShape",
        &[("value", Attr::Tensor(i64s(&[1], &[1])))],
        &[i64s(&[1], &[3])],
    );
    check_i(&c, DType::I64, &[3], &[1, 1, 1]);
    let c = ev("ConstantOfShape", &[], &[i64s(&[0], &[])]);
    check_f(&c, DType::F32, &[], &[0.0]);
}

#[test]
fn range_int_and_float() {
    // np.arange(10, -3, -4)
    let r = ev(
        "Range",
        &[],
        &[i64s(&[], &[10]), i64s(&[], &[-3]), i64s(&[], &[-4])],
    );
    check_i(&r, DType::I64, &[4], &[10, 6, 2, -2]);
    // np.arange(np.float32(0.5), np.float32(2.0), np.float32(0.3), dtype=np.float32)
    let r = ev(
        "Range",
        &[],
        &[f32s(&[], &[0.5]), f32s(&[], &[2.0]), f32s(&[], &[0.3])],
    );
    let want = [0.5f32, 0.8, 1.1, 1.4, 1.7];
    check_f(&r, DType::F32, &[5], &want.map(f64::from));
    // Counts are exact beyond f64's 53 bits: np.arange(0, 2**62 + 1, 2**62) has 2 elements.
    let big = 1i64 << 62;
    let r = ev(
        "Range",
        &[],
        &[i64s(&[], &[0]), i64s(&[], &[big + 1]), i64s(&[], &[big])],
    );
    check_i(&r, DType::I64, &[2], &[0, big]);
    let r = ev(
        "Range",
        &[],
        &[i64s(&[], &[5]), i64s(&[], &[0]), i64s(&[], &[1])],
    );
    check_i(&r, DType::I64, &[0], &[]);
    assert!(ev_err(
        "Range",
        &[],
        &[i64s(&[], &[0]), i64s(&[], &[5]), i64s(&[], &[0])]
    )
    .contains("delta"));
}

// --- Element-wise ----------------------------------------------------------------------------

#[test]
fn comparisons_and_logic_broadcast() {
    let a = i64s(&[3], &[1, 2, 3]);
    let b = i64s(&[2, 1], &[2, 3]);
    let b3 = |v: [i64; 6]| v;
    check_i(
        &ev("Equal", &[], &[a.clone(), b.clone()]),
        DType::Bool,
        &[2, 3],
        &b3([0, 1, 0, 0, 0, 1]),
    );
    check_i(
        &ev("Less", &[], &[a.clone(), b.clone()]),
        DType::Bool,
        &[2, 3],
        &b3([1, 0, 0, 1, 1, 0]),
    );
    check_i(
        &ev("Greater", &[], &[a.clone(), b.clone()]),
        DType::Bool,
        &[2, 3],
        &b3([0, 0, 1, 0, 0, 0]),
    );
    check_i(
        &ev("LessOrEqual", &[], &[a.clone(), b.clone()]),
        DType::Bool,
        &[2, 3],
        &b3([1, 1, 0, 1, 1, 1]),
    );
    check_i(
        &ev("GreaterOrEqual", &[], &[a, b]),
        DType::Bool,
        &[2, 3],
        &b3([0, 1, 1, 0, 0, 1]),
    );
    let f = f32s(&[2], &[0.5, f32::NAN]);
    check_i(
        &ev("Equal", &[], &[f.clone(), f]),
        DType::Bool,
        &[2],
        &[1, 0],
    );
    let p = bools(&[2], &[true, false]);
    let q = bools(&[2, 1], &[true, false]);
    check_i(
        &ev("And", &[], &[p.clone(), q.clone()]),
        DType::Bool,
        &[2, 2],
        &[1, 0, 0, 0],
    );
    check_i(
        &ev("Or", &[], &[p.clone(), q.clone()]),
        DType::Bool,
        &[2, 2],
        &[1, 1, 1, 0],
    );
    check_i(
        &ev("Xor", &[], &[p.clone(), q]),
        DType::Bool,
        &[2, 2],
        &[0, 1, 1, 0],
    );
    check_i(&ev("Not", &[], &[p]), DType::Bool, &[2], &[0, 1]);
    assert!(ev_err("And", &[], &[i64s(&[1], &[1]), bools(&[1], &[true])]).contains("bool"));
}

#[test]
fn where_broadcasts_three_ways() {
    // The causal-mask pattern: Where(mask[s, s], x, -inf).
    let c = bools(&[2, 2], &[true, false, true, true]);
    let w = ev(
        "Where",
        &[],
        &[c, f32s(&[2], &[1.0, 2.0]), f32s(&[], &[f32::MIN])],
    );
    check_f(
        &w,
        DType::F32,
        &[2, 2],
        &[1.0, f64::from(f32::MIN), 1.0, 2.0],
    );
    let c = bools(&[2, 1], &[false, true]);
    let w = ev("Where", &[], &[c, i64s(&[3], &[1, 2, 3]), i64s(&[1], &[0])]);
    check_i(&w, DType::I64, &[2, 3], &[0, 0, 0, 1, 2, 3]);
}

#[test]
fn arithmetic_float_broadcast() {
    let a = f32s(&[1, 3], &[1.5, -2.25, 3.0]);
    let b = f32s(&[2, 1], &[2.0, -0.5]);
    let run = |op: &str| ev(op, &[], &[a.clone(), b.clone()]);
    check_f(
        &run("Add"),
        DType::F32,
        &[2, 3],
        &[3.5, -0.25, 5.0, 1.0, -2.75, 2.5],
    );
    check_f(
        &run("Sub"),
        DType::F32,
        &[2, 3],
        &[-0.5, -4.25, 1.0, 2.0, -1.75, 3.5],
    );
    check_f(
        &run("Mul"),
        DType::F32,
        &[2, 3],
        &[3.0, -4.5, 6.0, -0.75, 1.125, -1.5],
    );
    check_f(
        &run("Div"),
        DType::F32,
        &[2, 3],
        &[0.75, -1.125, 1.5, -3.0, 4.5, -6.0],
    );
    let p = ev("Pow", &[], &[a.clone(), f32s(&[], &[2.0])]);
    check_f(&p, DType::F32, &[1, 3], &[2.25, 5.0625, 9.0]);
    // Pow with an integer exponent keeps the base type.
    let p = ev("Pow", &[], &[a, i64s(&[], &[3])]);
    check_f(&p, DType::F32, &[1, 3], &[3.375, -11.390625, 27.0]);
    let m = ev(
        "Mod",
        &[("fmod", Attr::Int(1))],
        &[f32s(&[2], &[5.5, -5.5]), f32s(&[], &[2.0])],
    );
    check_f(&m, DType::F32, &[2], &[1.5, -1.5]);
    // f64, f16, bf16 arithmetic rounds once to the operand type.
    let d = ev(
        "Add",
        &[],
        &[
            typed(DType::F64, &[1], &[0.1]),
            typed(DType::F64, &[1], &[0.2]),
        ],
    );
    check_f(&d, DType::F64, &[1], &[0.1 + 0.2]);
    let h = ev(
        "Add",
        &[],
        &[
            typed(DType::F16, &[1], &[1.0]),
            typed(DType::F16, &[1], &[0.0004]),
        ],
    );
    check_f(&h, DType::F16, &[1], &[1.0]);
    let h = ev(
        "Mul",
        &[],
        &[
            typed(DType::BF16, &[1], &[3.0]),
            typed(DType::BF16, &[1], &[3.0]),
        ],
    );
    check_f(&h, DType::BF16, &[1], &[9.0]);
    let e = ev_err(
        "Add",
        &[],
        &[f32s(&[2, 3], &[0.0; 6]), f32s(&[4], &[0.0; 4])],
    );
    assert!(
        e.contains("node 'n0' (Add)") && e.contains("broadcast"),
        "{e}"
    );
    assert!(ev_err("Add", &[], &[f32s(&[1], &[0.0]), i64s(&[1], &[0])]).contains("differ"));
}

#[test]
fn arithmetic_integers() {
    let a = i64s(&[4], &[7, -7, 7, -7]);
    let b = i64s(&[4], &[2, 2, -2, -2]);
    // ONNX integer Div truncates toward zero (unlike numpy's //).
    check_i(
        &ev("Div", &[], &[a.clone(), b.clone()]),
        DType::I64,
        &[4],
        &[3, -3, -3, 3],
    );
    // np.mod: sign of the divisor; np.fmod: sign of the dividend.
    check_i(
        &ev("Mod", &[], &[a.clone(), b.clone()]),
        DType::I64,
        &[4],
        &[1, 1, -1, -1],
    );
    check_i(
        &ev("Mod", &[("fmod", Attr::Int(1))], &[a.clone(), b.clone()]),
        DType::I64,
        &[4],
        &[1, -1, 1, -1],
    );
    check_i(
        &ev("Mul", &[], &[a.clone(), b]),
        DType::I64,
        &[4],
        &[14, -14, -14, 14],
    );
    // i32 wraps at its width.
    let x = typed(DType::I32, &[1], &[2147483647.0]);
    check_i(
        &ev("Add", &[], &[x.clone(), typed(DType::I32, &[1], &[1.0])]),
        DType::I32,
        &[1],
        &[-2147483648],
    );
    check_i(
        &ev("Pow", &[], &[i64s(&[2], &[3, -2]), i64s(&[], &[3])]),
        DType::I64,
        &[2],
        &[27, -8],
    );
    // Division by zero is left to the runtime.
    ev_none("Div", &[], &[a.clone(), i64s(&[], &[0])]);
    ev_none("Mod", &[], &[a, i64s(&[], &[0])]);
    assert!(ev_err("Mod", &[], &[f32s(&[1], &[1.0]), f32s(&[1], &[1.0])]).contains("fmod"));
}

#[test]
fn unary_and_min_max() {
    let x = f32s(&[3], &[-4.0, 0.25, 9.0]);
    check_f(
        &ev("Neg", &[], std::slice::from_ref(&x)),
        DType::F32,
        &[3],
        &[4.0, -0.25, -9.0],
    );
    check_f(
        &ev("Abs", &[], std::slice::from_ref(&x)),
        DType::F32,
        &[3],
        &[4.0, 0.25, 9.0],
    );
    check_f(
        &ev("Sqrt", &[], &[x]),
        DType::F32,
        &[3],
        &[f64::NAN, 0.5, 3.0],
    );
    check_i(
        &ev("Abs", &[], &[typed(DType::I8, &[2], &[-5.0, 3.0])]),
        DType::I8,
        &[2],
        &[5, 3],
    );
    check_i(
        &ev("Neg", &[], &[i64s(&[1], &[4])]),
        DType::I64,
        &[1],
        &[-4],
    );
    let m = ev(
        "Max",
        &[],
        &[
            i64s(&[3], &[1, 5, 3]),
            i64s(&[1], &[2]),
            i64s(&[2, 1], &[0, 4]),
        ],
    );
    check_i(&m, DType::I64, &[2, 3], &[2, 5, 3, 4, 5, 4]);
    let m = ev(
        "Min",
        &[],
        &[f32s(&[2], &[1.0, f32::NAN]), f32s(&[2], &[0.5, 0.0])],
    );
    check_f(&m, DType::F32, &[2], &[0.5, f64::NAN]);
}

// --- Reductions, scans, Trilu, Split -----------------------------------------------------------

#[test]
fn reductions_axes_forms() {
    let y = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let cases: [(&str, [f64; 2], f64); 5] = [
        ("ReduceSum", [6.0, 15.0], 21.0),
        ("ReduceProd", [6.0, 120.0], 720.0),
        ("ReduceMax", [3.0, 6.0], 6.0),
        ("ReduceMin", [1.0, 4.0], 1.0),
        ("ReduceMean", [2.0, 5.0], 3.5),
    ];
    for (op, last, all) in cases {
        // Opset 18 form: axes operand (ReduceSum since 13).
        let r = ev_at(op, &[], &[y.clone(), i64s(&[1], &[-1])], 18);
        check_f(&r, DType::F32, &[2, 1], &last);
        // Opset 11 form: axes attribute.
        let r = ev_at(
            op,
            &[("axes", ints(&[1])), ("keepdims", Attr::Int(0))],
            std::slice::from_ref(&y),
            11,
        );
        check_f(&r, DType::F32, &[2], &last);
        let r = ev(op, &[("keepdims", Attr::Int(0))], std::slice::from_ref(&y));
        check_f(&r, DType::F32, &[], &[all]);
    }
    let r = ev(
        "ReduceSum",
        &[("noop_with_empty_axes", Attr::Int(1))],
        std::slice::from_ref(&y),
    );
    assert_eq!(r, y);
    let r = ev(
        "ReduceMean",
        &[("axes", ints(&[0]))],
        &[i64s(&[2, 2], &[1, 2, 4, 6])],
    );
    check_i(&r, DType::I64, &[1, 2], &[2, 4]);
}

#[test]
fn trilu_upper_lower_k() {
    let m = i64s(&[3, 4], &(1..=12).collect::<Vec<_>>());
    // np.triu(m), np.triu(m, 1), np.tril(m, -1)
    check_i(
        &ev("Trilu", &[], std::slice::from_ref(&m)),
        DType::I64,
        &[3, 4],
        &[1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12],
    );
    check_i(
        &ev("Trilu", &[], &[m.clone(), i64s(&[], &[1])]),
        DType::I64,
        &[3, 4],
        &[0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12],
    );
    check_i(
        &ev("Trilu", &[("upper", Attr::Int(0))], &[m, i64s(&[], &[-1])]),
        DType::I64,
        &[3, 4],
        &[0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0],
    );
}

#[test]
fn cumsum_exclusive_reverse() {
    let y = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    check_f(
        &ev("CumSum", &[], &[y.clone(), i64s(&[], &[1])]),
        DType::F32,
        &[2, 3],
        &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0],
    );
    check_f(
        &ev(
            "CumSum",
            &[("exclusive", Attr::Int(1)), ("reverse", Attr::Int(1))],
            &[y, i64s(&[], &[-2])],
        ),
        DType::F32,
        &[2, 3],
        &[4.0, 5.0, 6.0, 0.0, 0.0, 0.0],
    );
    check_i(
        &ev("CumSum", &[], &[i64s(&[3], &[1, 2, 3]), i64s(&[], &[0])]),
        DType::I64,
        &[3],
        &[1, 3, 6],
    );
}

#[test]
fn split_forms() {
    let x = iota(&[2, 5]);
    let mut op = node("Split", 2, &[("axis", Attr::Int(1))]);
    op.outputs = vec![Value::new(100), Value::new(101)];
    let r = eval_at(&op, &[x.clone(), i64s(&[2], &[2, 3])], OPSET)
        .unwrap()
        .unwrap();
    check_i(&r[0], DType::I64, &[2, 2], &[0, 1, 5, 6]);
    check_i(&r[1], DType::I64, &[2, 3], &[2, 3, 4, 7, 8, 9]);
    // Equal parts, one per result.
    let mut op = node("Split", 1, &[]);
    op.outputs = vec![Value::new(100), Value::new(101)];
    let r = eval_at(&op, std::slice::from_ref(&x), OPSET)
        .unwrap()
        .unwrap();
    check_i(&r[1], DType::I64, &[1, 5], &[5, 6, 7, 8, 9]);
    // Opset 18 num_outputs: the last part is smaller.
    let mut op = node(
        "Split",
        1,
        &[("axis", Attr::Int(-1)), ("num_outputs", Attr::Int(2))],
    );
    op.outputs = vec![Value::new(100), Value::new(101)];
    let r = eval_at(&op, std::slice::from_ref(&x), 18).unwrap().unwrap();
    assert_eq!(
        (r[0].dims.clone(), r[1].dims.clone()),
        (vec![2, 3], vec![2, 2])
    );
    assert!(ev_err(
        "Split",
        &[("axis", Attr::Int(1))],
        &[x, i64s(&[2], &[2, 2])]
    )
    .contains("sum"));
}

// --- Declining -------------------------------------------------------------------------------

#[test]
fn size_cap_declines() {
    let side = 300; // 300 * 300 > MAX_ELEMENTS
    assert!((side * side) as u64 > MAX_ELEMENTS);
    ev_none("ConstantOfShape", &[], &[i64s(&[2], &[side, side])]);
    ev_none(
        "Expand",
        &[],
        &[i64s(&[1], &[1]), i64s(&[2], &[side, side])],
    );
    ev_none("Tile", &[], &[iota(&[1, 300]), i64s(&[2], &[300, 1])]);
    ev_none(
        "Range",
        &[],
        &[i64s(&[], &[0]), i64s(&[], &[1 << 40]), i64s(&[], &[1])],
    );
    let big = MAX_ELEMENTS as i64 + 1;
    ev_none("Identity", &[], &[iota(&[big])]);
    ev_none("Neg", &[], &[iota(&[big])]);
    // Empty, but with dims whose product overflows: refused, not computed.
    let empty = i64s(&[0, 1 << 40, 1 << 40], &[]);
    ev_none("Transpose", &[], &[empty]);
    ev_none(
        "ConstantOfShape",
        &[],
        &[i64s(&[3], &[0, 1 << 40, 1 << 40])],
    );
    ev_none(
        "Reshape",
        &[("allowzero", Attr::Int(1))],
        &[iota(&[0]), i64s(&[3], &[0, 1 << 40, 1 << 40])],
    );
}

#[test]
fn declines_non_constant_unknown_and_foreign() {
    // Operand 1 of the Add exists but has no data.
    let op = node("Add", 2, &[]);
    let x = f32s(&[1], &[1.0]);
    assert!(eval_op(&op, &[Some(&x), None], &[], OPSET)
        .unwrap()
        .is_none());
    ev_none("RandomNormal", &[], &[]);
    ev_none(
        "MatMul",
        &[],
        &[f32s(&[1, 1], &[1.0]), f32s(&[1, 1], &[1.0])],
    );
    let mut op = node("Add", 2, &[]);
    op.domain = "com.microsoft".into();
    assert!(eval_op(&op, &[Some(&x), Some(&x)], &[], OPSET)
        .unwrap()
        .is_none());
    // Strings only move through Constant.
    let s = TensorData {
        dtype: DType::String,
        dims: vec![1],
        payload: Payload::Strings(vec!["a".into()]),
    };
    ev_none("Identity", &[], &[s]);
}

/// Random operands and attributes (deterministic LCG) over every covered op: the evaluator
/// answers `Ok` or `Err`, never panics, whatever the constant data says.
#[test]
fn random_operands_never_panic() {
    const OPS: &[&str] = &[
        "Identity",
        "Cast",
        "Shape",
        "Size",
        "Gather",
        "Unsqueeze",
        "Squeeze",
        "Concat",
        "Slice",
        "Reshape",
        "Flatten",
        "Transpose",
        "Expand",
        "Tile",
        "ConstantOfShape",
        "Range",
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
        "Not",
        "Where",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Abs",
        "Sqrt",
        "Pow",
        "Min",
        "Max",
        "Mod",
        "ReduceProd",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceMean",
        "Trilu",
        "CumSum",
        "Split",
    ];
    const DTYPES: &[DType] = &[
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I8,
        DType::U8,
        DType::Bool,
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    };
    let mut outcomes = [0usize; 3];
    for case in 0..20_000 {
        let op_type = OPS[case % OPS.len()];
        let n_in = rnd(4) as usize;
        let ins: Vec<TensorData> = (0..n_in)
            .map(|_| {
                let dtype = if rnd(2) == 0 {
                    DType::I64
                } else {
                    DTYPES[rnd(DTYPES.len() as u64) as usize]
                };
                let dims: Vec<i64> = (0..rnd(4)).map(|_| rnd(4) as i64).collect();
                let n: i64 = dims.iter().product();
                let vals: Vec<f64> = (0..n).map(|_| rnd(9) as f64 - 4.0).collect();
                typed(dtype, &dims, &vals)
            })
            .collect();
        let r = |rnd: &mut dyn FnMut(u64) -> u64| rnd(9) as i64 - 4;
        let mut attrs: Vec<(&str, Attr)> = Vec::new();
        for name in [
            "axis",
            "keepdims",
            "upper",
            "exclusive",
            "reverse",
            "fmod",
            "start",
            "end",
            "allowzero",
            "num_outputs",
            "noop_with_empty_axes",
        ] {
            if rnd(3) == 0 {
                attrs.push((name, Attr::Int(r(&mut rnd))));
            }
        }
        for name in ["axes", "perm", "split", "starts", "ends"] {
            if rnd(4) == 0 {
                let v = (0..rnd(4)).map(|_| r(&mut rnd)).collect();
                attrs.push((name, Attr::Ints(v)));
            }
        }
        if rnd(3) == 0 {
            attrs.push(("to", Attr::Int(rnd(24) as i64)));
        }
        let mut op = node(op_type, n_in, &attrs);
        op.outputs = (0..1 + rnd(3) as usize).map(Value::new).collect();
        let opset = [9, 11, 13, 17, 18][rnd(5) as usize];
        let k = match eval_at(&op, &ins, opset) {
            Ok(Some(_)) => 0,
            Ok(None) => 1,
            Err(e) => {
                assert!(e.to_string().contains(op_type), "{e}");
                2
            }
        };
        outcomes[k] += 1;
    }
    // Each outcome happens often enough for the test to mean something.
    assert!(outcomes.iter().all(|n| *n > 500), "{outcomes:?}");
}
