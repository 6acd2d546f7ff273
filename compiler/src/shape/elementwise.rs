//! Elementwise ops: unary math and activations (result type = input type), multidirectional
//! broadcasting binary/variadic ops (ONNX "Broadcasting in ONNX": right-aligned dims, 1
//! broadcasts), comparisons and logic (bool results), `Where`, `Cast`, `CastLike`, `Dropout`.

use super::{node::Node, Rule};
use crate::error::Result;
use crate::ir::{DType, TensorType};
use std::collections::HashMap;

/// Unary ops whose result has the type of input 0.
const SAME_AS_INPUT: &[&str] = &[
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "Gelu",
    "Erf",
    "Tanh",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "Softplus",
    "Softsign",
    "Mish",
    "ThresholdedRelu",
    "Shrink",
    "Softmax",
    "LogSoftmax",
    "Hardmax",
    "Sqrt",
    "Reciprocal",
    "Neg",
    "Abs",
    "Exp",
    "Log",
    "Sin",
    "Cos",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
    "Floor",
    "Ceil",
    "Round",
    "Sign",
    "Clip",
    "Identity",
    "Trilu",
    "CumSum",
    "LpNormalization",
    "LRN",
    "MeanVarianceNormalization",
    "BitwiseNot",
    "ReverseSequence",
];

/// Binary/variadic broadcasting ops whose result has the type of input 0.
const BROADCAST_SAME: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Mod",
    "BitShift",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "Min",
    "Max",
    "Sum",
    "Mean",
    "PRelu",
];

/// Broadcasting comparisons / logic ops with a bool result.
const BROADCAST_BOOL: &[&str] = &[
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "And",
    "Or",
    "Xor",
];

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    for op in SAME_AS_INPUT {
        r.insert(op, unary);
    }
    for op in BROADCAST_SAME {
        r.insert(op, broadcast_same);
    }
    for op in BROADCAST_BOOL {
        r.insert(op, broadcast_bool);
    }
    r.insert("Not", unary);
    r.insert("IsNaN", unary_bool);
    r.insert("IsInf", unary_bool);
    r.insert("Where", where_);
    r.insert("Cast", cast);
    r.insert("CastLike", cast_like);
    r.insert("Dropout", dropout);
}

/// Result type = type of input 0 (and for the ops with optional extra inputs, e.g. Clip's
/// min/max, only input 0 decides).
fn unary(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![n.ty(0)?.clone()])
}

/// `IsNaN`, `IsInf`: bool of the input's shape.
fn unary_bool(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![TensorType {
        dtype: DType::Bool,
        shape: n.ty(0)?.shape.clone(),
    }])
}

fn all_inputs(n: &Node) -> Vec<usize> {
    (0..n.num_inputs()).collect()
}

/// Arithmetic ops (Add..Div and the variadic Min/Max/Sum/Mean): numpy broadcasting, dtype of
/// input 0. Add/Sub/Mul/Div/And-like ops require equal operand dtypes (ONNX type constraint T).
fn broadcast_same(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    if matches!(
        n.op_type(),
        "Add" | "Sub" | "Mul" | "Div" | "Min" | "Max" | "Sum" | "Mean"
    ) {
        for i in 1..n.num_inputs() {
            if let Some(t) = n.opt_ty(i) {
                if t.dtype != dt {
                    return Err(n.err(format!(
                        "operand dtypes differ: {dt} (input 0) vs {} (input {i})",
                        t.dtype
                    )));
                }
            }
        }
    }
    let shape = if n.op_type() == "PRelu" {
        // PRelu: slope is unidirectionally broadcast to X.
        n.shape(0)?.map(|s| s.to_vec())
    } else {
        n.broadcast_inputs(&all_inputs(n))?
    };
    Ok(vec![TensorType { dtype: dt, shape }])
}

/// Comparisons and logic: broadcast, bool result.
fn broadcast_bool(n: &Node) -> Result<Vec<TensorType>> {
    n.ty(0)?;
    n.ty(1)?;
    Ok(vec![TensorType {
        dtype: DType::Bool,
        shape: n.broadcast_inputs(&[0, 1])?,
    }])
}

/// `Where(cond, X, Y)`: broadcast of all three, dtype of X.
fn where_(n: &Node) -> Result<Vec<TensorType>> {
    n.ty(0)?;
    let dt = n.dtype(1)?;
    n.ty(2)?;
    Ok(vec![TensorType {
        dtype: dt,
        shape: n.broadcast_inputs(&[0, 1, 2])?,
    }])
}

/// `Cast(to)`: input shape, dtype `to`.
fn cast(n: &Node) -> Result<Vec<TensorType>> {
    let to = n.int_attr("to", -1)?;
    let dtype = i32::try_from(to)
        .ok()
        .and_then(DType::from_onnx)
        .ok_or_else(|| {
            n.err(format!(
                "attribute 'to' is missing or not a dtype code ({to})"
            ))
        })?;
    Ok(vec![TensorType {
        dtype,
        shape: n.ty(0)?.shape.clone(),
    }])
}

/// `CastLike(input, target_type)`: input shape, dtype of input 1.
fn cast_like(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![TensorType {
        dtype: n.dtype(1)?,
        shape: n.ty(0)?.shape.clone(),
    }])
}

/// `Dropout`: output = input; optional mask (bool, same shape).
fn dropout(n: &Node) -> Result<Vec<TensorType>> {
    let t = n.ty(0)?.clone();
    let mask = TensorType {
        dtype: DType::Bool,
        shape: t.shape.clone(),
    };
    Ok(vec![t, mask])
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{show, T};
    use super::*;
    use crate::ir::Attr;

    #[test]
    fn dtypes() {
        let mut t = T::new();
        let x = t.input(DType::F16, "b,3");
        let y = t.input(DType::F16, "3");
        let i = t.input(DType::I64, "3");
        let op = t.op("LessOrEqual", &[Some(x), Some(y)], &[], 1);
        let ty = t.infer(op, 18).unwrap();
        assert_eq!((ty[0].dtype, show(&ty[0])), (DType::Bool, "b,3".into()));
        let op = t.op("Add", &[Some(x), Some(i)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("dtypes differ"));
        let op = t.op("Pow", &[Some(x), Some(i)], &[], 1);
        assert_eq!(t.infer(op, 18).unwrap()[0].dtype, DType::F16);
        let op = t.op("Cast", &[Some(x)], &[("to", Attr::Int(99))], 1);
        assert!(t.shapes(op, 18)[0].contains("dtype code"));
        let op = t.op("Cast", &[Some(x)], &[("to", Attr::String("x".into()))], 1);
        assert!(t.shapes(op, 18)[0].contains("must be an int"));
        let op = t.op("IsInf", &[Some(x)], &[], 1);
        assert_eq!(t.infer(op, 18).unwrap()[0].dtype, DType::Bool);
        let op = t.op("Dropout", &[Some(x)], &[], 2);
        assert_eq!(t.infer(op, 18).unwrap()[1].dtype, DType::Bool);
        let op = t.op("Sum", &[Some(x), Some(y), Some(x)], &[], 1);
        assert_eq!(t.shapes(op, 18), ["b,3"]);
        let op = t.op("PRelu", &[Some(x), Some(y)], &[], 1);
        assert_eq!(t.shapes(op, 18), ["b,3"]);
    }

    #[test]
    fn unranked_inputs_give_unranked_results() {
        let mut t = T::new();
        let x = t.input(DType::F32, "b,3");
        let op = t.op("Relu", &[Some(x)], &[], 1);
        let r = t.g.ops[op].outputs[0]; // still the unranked placeholder
        let op2 = t.op("Add", &[Some(x), Some(r)], &[], 1);
        assert_eq!(t.shapes(op2, 18), ["?"]);
    }
}
