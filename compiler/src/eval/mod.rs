//! Constant evaluator: computes one ONNX op on constant operands, for constant folding of the shape
//! arithmetic and small constant subgraphs that `torch.onnx.export` leaves in real models
//! (`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`, causal masks built from
//! `Range`/`Trilu`/`Where`, ...).
//!
//! [`eval_op`] answers three ways:
//! - `Ok(Some(results))`: one tensor per op result, exactly as ONNX defines them;
//! - `Ok(None)`: the evaluator does not handle this op, dtype, opset form, or size (an operand or
//!   result above [`MAX_ELEMENTS`]), or an operand is not constant; the caller leaves the op alone;
//! - `Err`: the operands are genuinely invalid for the op (shapes that do not broadcast, a Gather
//!   index out of range, ...); the error names the node and its op type.
//!
//! Covered ops (default domain): Constant, Identity, Cast, Shape, Size, Gather, Unsqueeze,
//! Squeeze, Concat, Slice, Reshape, Flatten, Transpose, Expand, Tile, ConstantOfShape, Range,
//! Equal, Less, Greater, LessOrEqual, GreaterOrEqual, And, Or, Xor, Not, Where, Add, Sub, Mul,
//! Div, Neg, Abs, Sqrt, Pow, Min, Max, Mod, ReduceProd, ReduceSum, ReduceMax, ReduceMin,
//! ReduceMean, Trilu, CumSum, Split.
//!
//! Element types: data movement works on every byte-sized type (so Transpose of complex64 or
//! float8 is fine); arithmetic and Cast on f32, f64, f16, bf16, i64, i32, i16, i8, u64, u32, u16,
//! u8 and bool. Floats are computed in f64 and rounded once to the result type, which gives the
//! correctly rounded result for `+ - * /` and `Sqrt` of every narrower float type; integers are
//! computed in i64 and wrap to the result width, as numpy and onnxruntime do. Integer `Div`
//! truncates toward zero. Integer division or modulo by zero is undefined in ONNX: the evaluator
//! declines it (`Ok(None)`) rather than failing a model on a value no one may read.

mod ops;
mod tensor;

use crate::error::{Error, Result};
use crate::ir::{OpData, TensorData, TensorType};
use tensor::Tensor;

/// Largest operand or result, in elements, the evaluator computes. Folding exists for shape
/// arithmetic and small masks; above this the op is left to the runtime so that folding never
/// turns a small graph into a large one or allocates without bound.
pub const MAX_ELEMENTS: u64 = 65_536;

/// Evaluate `op` on constant operands.
///
/// `inputs[i]` is the constant data of operand `i`, or `None` when the operand is omitted or not
/// constant (`op.inputs[i]` tells the two apart: an operand the op lists but for which no data is
/// given is non-constant and makes the evaluator decline). `input_types[i]` is the operand's type;
/// it is read only by ops that need no data (`Shape` and `Size` of a statically shaped value) and
/// may be shorter than `inputs`. `opset` is the default-domain opset of the model; it picks
/// between attribute and operand forms (`Unsqueeze` axes before 13, `Slice` before 10, ...).
///
/// Ops outside the default domain are never evaluated. `Constant` is not subject to
/// [`MAX_ELEMENTS`]: it returns the attribute's data without copying a large payload.
pub fn eval_op(
    op: &OpData,
    inputs: &[Option<&TensorData>],
    input_types: &[Option<&TensorType>],
    opset: i64,
) -> Result<Option<Vec<TensorData>>> {
    if !op.domain.is_empty() && op.domain != "ai.onnx" {
        return Ok(None);
    }
    let cx = Cx {
        op,
        inputs,
        types: input_types,
        opset,
    };
    match ops::eval(&cx) {
        Ok(ts) => Ok(Some(ts)),
        Err(Fail::Unsupported) => Ok(None),
        Err(Fail::Invalid(msg)) => Err(Error::node(&op.name, &op.op_type, msg)),
    }
}

/// Why an op was not evaluated.
#[derive(Debug)]
pub(crate) enum Fail {
    /// Outside the evaluator's coverage: the caller leaves the op alone.
    Unsupported,
    /// The operands are invalid for the op; becomes an error naming the node.
    Invalid(String),
}

impl Fail {
    pub(crate) fn invalid(msg: impl Into<String>) -> Fail {
        Fail::Invalid(msg.into())
    }
}

/// Internal result: `?` propagates both "decline" and "invalid".
pub(crate) type R<T> = std::result::Result<T, Fail>;

/// The op being evaluated, with its operands.
pub(crate) struct Cx<'a> {
    pub op: &'a OpData,
    inputs: &'a [Option<&'a TensorData>],
    types: &'a [Option<&'a TensorType>],
    pub opset: i64,
}

impl Cx<'_> {
    /// Whether operand `i` is given (constant or not), as opposed to omitted.
    pub fn has_input(&self, i: usize) -> bool {
        self.op.input(i).is_some() || self.data(i).is_some()
    }

    /// Raw constant data of operand `i`.
    pub fn data(&self, i: usize) -> Option<&TensorData> {
        self.inputs.get(i).copied().flatten()
    }

    /// Type of operand `i`, if known.
    pub fn ty(&self, i: usize) -> Option<&TensorType> {
        self.types.get(i).copied().flatten()
    }

    /// Required constant operand `i`.
    pub fn input(&self, i: usize) -> R<Tensor> {
        match self.data(i) {
            Some(t) => Tensor::from_data(t),
            None if self.has_input(i) => Err(Fail::Unsupported),
            None => Err(Fail::invalid(format!("missing operand {i}"))),
        }
    }

    /// Optional operand `i`: `None` when omitted, `Unsupported` when given but not constant.
    pub fn opt_input(&self, i: usize) -> R<Option<Tensor>> {
        match self.data(i) {
            Some(t) => Tensor::from_data(t).map(Some),
            None if self.has_input(i) => Err(Fail::Unsupported),
            None => Ok(None),
        }
    }

    /// All operands as constants (variadic ops).
    pub fn all_inputs(&self) -> R<Vec<Tensor>> {
        let n = self.op.inputs.len().max(self.inputs.len());
        (0..n).map(|i| self.input(i)).collect()
    }

    /// Integer attribute with a default.
    pub fn int_attr(&self, name: &str, default: i64) -> i64 {
        self.op.int_attr(name).unwrap_or(default)
    }

    /// Integer list from attribute `name` (the form of older opsets) or else operand `i` (the
    /// form of newer ones); `None` when neither is given.
    pub fn ints_arg(&self, i: usize, name: &str) -> R<Option<Vec<i64>>> {
        if let Some(v) = self.op.ints_attr(name) {
            return Ok(Some(v.to_vec()));
        }
        match self.opt_input(i)? {
            Some(t) => t.ints(name).map(Some),
            None => Ok(None),
        }
    }
}
