//! Opset upgrade: rewrite a model of an older default-domain opset (7 to 16) into the opset
//! pipec's passes read and emit ([`TARGET_OPSET`], 17), as ONNX's version converter
//! (`onnx.version_converter.convert_version`) does.
//!
//! The rewrites follow the operator changelog of the ONNX specification (`docs/Changelog.md`,
//! one entry per op version) and the converter's adapters:
//!
//! - attributes that became inputs: `Squeeze` / `Unsqueeze` / `ReduceSum` `axes` (13), `Split`
//!   `split` (13), `Pad` `pads` / `value` (11), `Clip` `min` / `max` (11), `Slice` `starts` /
//!   `ends` / `axes` (10), `TopK` `k` (10), `Dropout` `ratio` (12): each becomes a `Constant` op
//!   feeding the new input (a `Constant`, not an initializer, so training does not take it for
//!   a parameter);
//! - `Softmax` / `LogSoftmax` / `Hardmax` before 13 coerce the input to 2-D at `axis`
//!   (default 1) and normalise each row; from 13 they work along one axis (default -1). When the input's
//!   rank is known and `axis` is its last axis the two agree and only `axis` is rewritten;
//!   otherwise the op becomes `Flatten(axis)` → op(axis = 1) → `Reshape` to `Shape(x)` (the
//!   converter's `softmax_12_13` adapter);
//! - `Upsample` (deprecated in 10) becomes `Resize` and `Resize`-10 becomes the 11 form (an
//!   empty `roi` input), both with `coordinate_transformation_mode = asymmetric` and, for
//!   `nearest`, `nearest_mode = floor` (Resize-10's semantics, `resize_10_11`);
//! - `Scatter` (deprecated in 11) becomes `ScatterElements`; `RoiAlign` before 16 gets its old
//!   default `coordinate_transformation_mode = output_half_pixel` written out;
//! - `BatchNormalization`: `spatial = 1` (before 9) is dropped (`spatial = 0` is refused);
//!   the optional training outputs of 7–13 (mean, var, saved mean / var) have no opset-14
//!   inference form, so they are dropped when nothing reads them and refused otherwise.
//!
//! Every other default-domain op of the specification whose signature and semantics did not
//! change between the model's opset and 17 (new types only, or new attributes whose default is
//! the old behaviour) is kept as is. An op this module does not know is refused with an error
//! naming the node, the op and the opset, as are models older than opset 7 (the legacy
//! `broadcast` attributes). Ops of other domains are untouched.

use crate::error::{Error, Result};
use crate::ir::{Attr, DType, Graph, Module, Op, OpData, TensorData, TensorType, Value};
use bytes::Bytes;
use std::collections::HashSet;

/// The default-domain opset an upgraded module declares (the one pipec's passes emit).
pub const TARGET_OPSET: i64 = 17;
/// The oldest default-domain opset [`upgrade_opset`] reads.
pub const MIN_SOURCE_OPSET: i64 = 7;

/// What [`upgrade_opset`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgraded {
    /// The model's default-domain opset before.
    pub from: i64,
    /// The opset it declares now ([`TARGET_OPSET`]).
    pub to: i64,
    /// Ops rewritten (the others were kept as they are).
    pub rewritten: usize,
}

/// Default-domain ops whose signature and semantics did not change between opset 7 and 17
/// (only new types, or new attributes that default to the old behaviour). The ops with a
/// change are handled in [`upgrade_op`].
const UNCHANGED: &[&str] = &[
    // Rewritten below only for older opsets.
    "BatchNormalization",
    "Clip",
    "Dropout",
    "Hardmax",
    "LogSoftmax",
    "ReduceSum",
    "Resize",
    "RoiAlign",
    "Slice",
    "Softmax",
    "Split",
    "Squeeze",
    "TopK",
    "Unsqueeze",
    // Unchanged.
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "AveragePool",
    "Bernoulli",
    "BitShift",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Compress",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvInteger",
    "ConvTranspose",
    "Cos",
    "Cosh",
    "CumSum",
    "DepthToSpace",
    "DequantizeLinear",
    "Det",
    "Div",
    "DynamicQuantizeLinear",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "EyeLike",
    "Flatten",
    "Floor",
    "GRU",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gemm",
    "GlobalAveragePool",
    "GlobalLpPool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "InstanceNormalization",
    "IsInf",
    "IsNaN",
    "LRN",
    "LSTM",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LpNormalization",
    "LpPool",
    "MatMul",
    "MatMulInteger",
    "Max",
    "MaxPool",
    "MaxRoiPool",
    "MaxUnpool",
    "Mean",
    "MeanVarianceNormalization",
    "Min",
    "Mod",
    "Mul",
    "Multinomial",
    "Neg",
    "NegativeLogLikelihoodLoss",
    "NonMaxSuppression",
    "NonZero",
    "Not",
    "OneHot",
    "Or",
    "PRelu",
    "Pad",
    "Pow",
    "QLinearConv",
    "QLinearMatMul",
    "QuantizeLinear",
    "RNN",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "ReverseSequence",
    "Round",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "Shape",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Size",
    "SoftmaxCrossEntropyLoss",
    "Softplus",
    "Softsign",
    "SpaceToDepth",
    "Sqrt",
    "StringNormalizer",
    "Sub",
    "Sum",
    "Tan",
    "Tanh",
    "TfIdfVectorizer",
    "ThresholdedRelu",
    "Tile",
    "Transpose",
    "Trilu",
    "Unique",
    "Where",
    "Xor",
];

/// Upgrade `m` to [`TARGET_OPSET`] when its default-domain opset is older (see the module doc).
/// Returns `None` when nothing was to be done (opset 17 or newer, or no default-domain import).
/// Types of rewritten values are left to shape inference: run it afterwards. The ranks and
/// dtypes of operands it reads (Softmax's input, Clip's and Pad's data) come from the types
/// present, so running shape inference before helps (it reads the old forms).
pub fn upgrade_opset(m: &mut Module) -> Result<Option<Upgraded>> {
    let from = m.opset();
    if from == 0 || from >= TARGET_OPSET {
        return Ok(None);
    }
    if from < MIN_SOURCE_OPSET {
        return Err(Error::msg(format!(
            "the model has default-domain opset {from}; pipec upgrades models from opset \
             {MIN_SOURCE_OPSET} on (convert it with onnx.version_converter first)"
        )));
    }
    let mut cx = Cx {
        names: m.graph.values.values().map(|v| v.name.clone()).collect(),
    };
    cx.names
        .extend(m.graph.ops.values().map(|o| o.name.clone()));
    let old = std::mem::take(&mut m.graph.order);
    let outputs: HashSet<Value> = m.graph.outputs.iter().copied().collect();
    let mut read: HashSet<Value> = HashSet::new();
    for &op in &old {
        read.extend(m.graph.ops[op].inputs.iter().flatten().copied());
    }
    let mut rewritten = 0;
    for op in old {
        let g = &mut m.graph;
        let is_default = g.ops[op].domain.is_empty() || g.ops[op].domain == "ai.onnx";
        if is_default
            && upgrade_op(g, op, from, &mut cx, &|v: Value| {
                read.contains(&v) || outputs.contains(&v)
            })?
        {
            rewritten += 1;
        }
        g.order.push(op);
    }
    m.opset_imports.remove("ai.onnx");
    m.opset_imports.insert(String::new(), TARGET_OPSET);
    // Opset 17 needs IR version 8.
    m.ir_version = m.ir_version.max(8);
    Ok(Some(Upgraded {
        from,
        to: TARGET_OPSET,
        rewritten,
    }))
}

/// Fresh names for the ops and values the rewrites add.
struct Cx {
    names: HashSet<String>,
}

impl Cx {
    fn fresh(&mut self, base: &str) -> String {
        let mut n = base.to_string();
        let mut i = 1;
        while self.names.contains(&n) {
            n = format!("{base}.{i}");
            i += 1;
        }
        self.names.insert(n.clone());
        n
    }
}

fn refuse(d: &OpData, from: i64, why: &str) -> Error {
    Error::node(
        &d.name,
        &d.op_type,
        format!("cannot upgrade from opset {from} to {TARGET_OPSET}: {why}"),
    )
}

/// Append an op (before the op being rewritten, which is pushed after) with one result.
fn emit(
    g: &mut Graph,
    cx: &mut Cx,
    base: &str,
    op_type: &str,
    inputs: Vec<Option<Value>>,
    attrs: Vec<(&str, Attr)>,
    ty: TensorType,
) -> Value {
    let name = cx.fresh(base);
    let out = cx.fresh(base);
    let data = OpData {
        name,
        op_type: op_type.into(),
        domain: String::new(),
        inputs,
        outputs: vec![],
        attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    let (_, outs) = g.add_op(data, vec![(out, ty)]);
    outs[0]
}

/// A `Constant` op holding `t`.
fn constant(g: &mut Graph, cx: &mut Cx, base: &str, t: TensorData) -> Value {
    let ty = TensorType::known(t.dtype, &t.dims);
    emit(
        g,
        cx,
        base,
        "Constant",
        vec![],
        vec![("value", Attr::Tensor(t))],
        ty,
    )
}

fn ints_const(g: &mut Graph, cx: &mut Cx, base: &str, v: &[i64]) -> Value {
    constant(g, cx, base, TensorData::from_i64(vec![v.len() as i64], v))
}

/// A 0-D float constant of `dtype` (the dtype of the operand it goes with).
fn float_scalar(d: &OpData, from: i64, dtype: DType, v: f32) -> Result<TensorData> {
    let raw: Vec<u8> = match dtype {
        DType::F32 => v.to_le_bytes().to_vec(),
        DType::F64 => (v as f64).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
        other => {
            return Err(refuse(
                d,
                from,
                &format!("its data is {other} (or of unknown type); run shape inference first"),
            ))
        }
    };
    TensorData::from_raw(dtype, vec![], Bytes::from(raw))
}

/// Move an ints attribute to a constant input at `idx` (padding omitted inputs before it).
fn attr_to_input(g: &mut Graph, cx: &mut Cx, op: Op, attr: &str, idx: usize) {
    let Some(Attr::Ints(v)) = g.ops[op].attrs.remove(attr) else {
        return;
    };
    let base = format!("{}/{attr}", g.ops[op].name);
    let c = ints_const(g, cx, &base, &v);
    set_input(&mut g.ops[op], idx, c);
}

fn set_input(d: &mut OpData, idx: usize, v: Value) {
    if d.inputs.len() <= idx {
        d.inputs.resize(idx + 1, None);
    }
    d.inputs[idx] = Some(v);
}

/// Rewrite one default-domain op of opset `from` into its opset-17 form (module doc). New ops
/// are appended to `g.order`; the caller appends `op` after them. Returns whether `op` changed.
fn upgrade_op(
    g: &mut Graph,
    op: Op,
    from: i64,
    cx: &mut Cx,
    used: &dyn Fn(Value) -> bool,
) -> Result<bool> {
    let t = g.ops[op].op_type.clone();
    let name = g.ops[op].name.clone();
    let x_dtype = g.ops[op].input(0).map(|x| g.ty(x).dtype);
    match t.as_str() {
        "Squeeze" | "Unsqueeze" | "ReduceSum" if from < 13 => {
            if t == "Unsqueeze" && g.ops[op].attr("axes").is_none() {
                return Err(refuse(&g.ops[op], from, "it has no 'axes' attribute"));
            }
            attr_to_input(g, cx, op, "axes", 1);
            Ok(true)
        }
        "Split" if from < 13 => {
            attr_to_input(g, cx, op, "split", 1);
            Ok(true)
        }
        "Softmax" | "LogSoftmax" | "Hardmax" if from < 13 => {
            let d = &g.ops[op];
            let axis = d.int_attr("axis").unwrap_or(1);
            let x = d
                .input(0)
                .ok_or_else(|| refuse(d, from, "it has no input"))?;
            let rank = g.ty(x).rank().map(|r| r as i64);
            if let Some(r) = rank {
                let a = if axis < 0 { axis + r } else { axis };
                if a < 0 || a >= r.max(1) {
                    return Err(refuse(
                        d,
                        from,
                        &format!("axis {axis} is out of range for its rank-{r} input"),
                    ));
                }
                if a == r - 1 {
                    g.ops[op].attrs.insert("axis".into(), Attr::Int(-1));
                    return Ok(true);
                }
            }
            // y = Reshape(op(Flatten(x, axis), axis = 1), Shape(x)); the original op becomes the
            // Reshape so its result keeps its name and uses.
            let ty = g.ty(x).clone();
            let shape = emit(
                g,
                cx,
                &format!("{name}/shape"),
                "Shape",
                vec![Some(x)],
                vec![],
                TensorType::unranked(DType::I64),
            );
            let flat = emit(
                g,
                cx,
                &format!("{name}/flatten"),
                "Flatten",
                vec![Some(x)],
                vec![("axis", Attr::Int(axis))],
                TensorType::unranked(ty.dtype),
            );
            let norm = emit(
                g,
                cx,
                &format!("{name}/2d"),
                &t,
                vec![Some(flat)],
                vec![("axis", Attr::Int(1))],
                TensorType::unranked(ty.dtype),
            );
            let d = &mut g.ops[op];
            d.op_type = "Reshape".into();
            d.inputs = vec![Some(norm), Some(shape)];
            d.attrs.retain(|k, _| k.starts_with("pipec."));
            Ok(true)
        }
        "Pad" if from < 11 => {
            let d = &g.ops[op];
            let pads = d
                .ints_attr("pads")
                .ok_or_else(|| refuse(d, from, "it has no 'pads' attribute"))?
                .to_vec();
            let value = d.float_attr("value").unwrap_or(0.0);
            let dt = x_dtype.unwrap_or(DType::F32);
            let vt = if value != 0.0 {
                Some(float_scalar(d, from, dt, value)?)
            } else {
                None
            };
            let p = ints_const(g, cx, &format!("{name}/pads"), &pads);
            let d = &mut g.ops[op];
            d.attrs.remove("pads");
            d.attrs.remove("value");
            set_input(d, 1, p);
            if let Some(vt) = vt {
                let c = constant(g, cx, &format!("{name}/value"), vt);
                set_input(&mut g.ops[op], 2, c);
            }
            Ok(true)
        }
        "Clip" if from < 11 => {
            let dt = x_dtype.unwrap_or(DType::F32);
            for (i, a) in [(1, "min"), (2, "max")] {
                let d = &g.ops[op];
                let Some(v) = d.float_attr(a) else { continue };
                let c = float_scalar(d, from, dt, v)?;
                g.ops[op].attrs.remove(a);
                let c = constant(g, cx, &format!("{name}/{a}"), c);
                set_input(&mut g.ops[op], i, c);
            }
            Ok(true)
        }
        "Slice" if from < 10 => {
            let d = &g.ops[op];
            if d.attr("starts").is_none() || d.attr("ends").is_none() {
                return Err(refuse(d, from, "it lacks 'starts' or 'ends'"));
            }
            attr_to_input(g, cx, op, "starts", 1);
            attr_to_input(g, cx, op, "ends", 2);
            attr_to_input(g, cx, op, "axes", 3);
            Ok(true)
        }
        "TopK" if from < 10 => {
            let d = &g.ops[op];
            let k = d
                .int_attr("k")
                .ok_or_else(|| refuse(d, from, "it has no 'k' attribute"))?;
            g.ops[op].attrs.remove("k");
            let c = ints_const(g, cx, &format!("{name}/k"), &[k]);
            set_input(&mut g.ops[op], 1, c);
            Ok(true)
        }
        "Dropout" if from < 12 => {
            let d = &g.ops[op];
            if from < 10 && d.outputs.get(1).is_some_and(|v| used(*v)) {
                return Err(refuse(
                    d,
                    from,
                    "its mask output is read, and the mask's type changed to bool in opset 10",
                ));
            }
            let ratio = d.float_attr("ratio");
            let dt = x_dtype.unwrap_or(DType::F32);
            let rt = ratio.map(|r| float_scalar(d, from, dt, r)).transpose()?;
            let d = &mut g.ops[op];
            d.attrs.remove("ratio");
            d.attrs.remove("is_test");
            if let Some(rt) = rt {
                let c = constant(g, cx, &format!("{name}/ratio"), rt);
                set_input(&mut g.ops[op], 1, c);
            }
            Ok(true)
        }
        "Upsample" | "Resize" if t == "Upsample" || from < 11 => {
            let d = &g.ops[op];
            let mode = d.str_attr("mode").unwrap_or("nearest").to_string();
            if mode != "nearest" && mode != "linear" {
                return Err(refuse(
                    d,
                    from,
                    &format!("mode '{mode}' is not nearest or linear"),
                ));
            }
            let x = d.input(0);
            let scales = match (d.input(1), d.attr("scales")) {
                (Some(s), _) => s,
                (None, Some(Attr::Floats(s))) => {
                    let s = s.clone();
                    constant(
                        g,
                        cx,
                        &format!("{name}/scales"),
                        TensorData::from_f32(vec![s.len() as i64], &s),
                    )
                }
                _ => return Err(refuse(&g.ops[op], from, "it has no scales")),
            };
            let d = &mut g.ops[op];
            d.op_type = "Resize".into();
            d.inputs = vec![x, None, Some(scales)];
            d.attrs.remove("scales");
            d.attrs.insert("mode".into(), Attr::String(mode.clone()));
            d.attrs.insert(
                "coordinate_transformation_mode".into(),
                Attr::String("asymmetric".into()),
            );
            if mode == "nearest" {
                d.attrs
                    .insert("nearest_mode".into(), Attr::String("floor".into()));
            }
            Ok(true)
        }
        "Scatter" => {
            g.ops[op].op_type = "ScatterElements".into();
            Ok(true)
        }
        "RoiAlign" if from < 16 => {
            let d = &mut g.ops[op];
            if d.attr("coordinate_transformation_mode").is_some() {
                return Ok(false);
            }
            d.attrs.insert(
                "coordinate_transformation_mode".into(),
                Attr::String("output_half_pixel".into()),
            );
            Ok(true)
        }
        "BatchNormalization" => {
            let d = &g.ops[op];
            let mut changed = false;
            if from < 9 {
                if d.int_attr("spatial").unwrap_or(1) != 1 {
                    return Err(refuse(
                        d,
                        from,
                        "spatial = 0 (statistics per element) has no opset-9 equivalent",
                    ));
                }
                changed |= d.attr("spatial").is_some();
            }
            if from < 14 && d.outputs.len() > 1 {
                if d.outputs[1..].iter().any(|v| used(*v)) {
                    return Err(refuse(
                        d,
                        from,
                        "its training-mode outputs (mean, var, saved mean/var) are read; \
                         opset 14 expresses training mode differently",
                    ));
                }
                changed = true;
            }
            let d = &mut g.ops[op];
            d.attrs.remove("spatial");
            if from < 14 {
                d.outputs.truncate(1);
            }
            Ok(changed)
        }
        _ if UNCHANGED.contains(&t.as_str()) => Ok(false),
        _ => Err(refuse(
            &g.ops[op],
            from,
            &format!("pipec does not know how '{t}' changed since opset {from}"),
        )),
    }
}
