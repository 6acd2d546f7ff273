//! Losses added on top of a forward graph, as standard ONNX ops (annotated `pipec.phase = loss`).
//! Used by [`crate::Autodiff`]; the CLI names them as in `cli.md` (`--loss KIND`).
//!
//! - `mean-square`: `L = sum(y0 * y0) / numel(y0)`.
//! - `sum`: `L = sum(y0)`.
//! - `cross-entropy:LABEL`: softmax cross-entropy over the last axis of `y0` with integer class
//!   labels from graph input `LABEL` (added as an int64 input of shape `y0.shape[:-1]` if the
//!   model has no such input): `L = -sum(onehot(LABEL) * LogSoftmax(y0)) / numel(LABEL)`
//!   (one-hot built as `Equal(LABEL[..., None], Range(0, C))`), the
//!   mean over all label positions (PyTorch's `cross_entropy` with `reduction='mean'`).
//!
//! The loss is a 0-D tensor of `y0`'s element type, named `loss` (or `loss_N` if taken).

use crate::transforms::autodiff::builder::Builder;
use pipec_compiler::error::Error;
use pipec_compiler::ir::{Attr, DType, Module, TensorType, Value};
use pipec_compiler::Result;
use std::str::FromStr;

/// Which loss to put on the model's first output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossKind {
    /// `mean(y0^2)`.
    MeanSquare,
    /// `sum(y0)`.
    Sum,
    /// Softmax cross-entropy over the last axis with labels from the named graph input.
    CrossEntropy(String),
}

impl FromStr for LossKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mean-square" => Ok(LossKind::MeanSquare),
            "sum" => Ok(LossKind::Sum),
            _ => match s.strip_prefix("cross-entropy:") {
                Some(l) if !l.is_empty() => Ok(LossKind::CrossEntropy(l.to_string())),
                _ => Err(Error::Usage(format!(
                    "unknown loss '{s}' (known: mean-square, sum, cross-entropy:LABEL_INPUT)"
                ))),
            },
        }
    }
}

impl std::fmt::Display for LossKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LossKind::MeanSquare => f.write_str("mean-square"),
            LossKind::Sum => f.write_str("sum"),
            LossKind::CrossEntropy(l) => write!(f, "cross-entropy:{l}"),
        }
    }
}

/// Append the loss ops for `kind` on the first graph output; returns the loss value (0-D).
pub fn add_loss(m: &mut Module, kind: &LossKind) -> Result<Value> {
    let y = *m
        .graph
        .outputs
        .first()
        .ok_or_else(|| Error::msg("the model has no outputs to put a loss on"))?;
    let dt = m.graph.ty(y).dtype;
    if !dt.is_float() {
        return Err(Error::named(
            m.graph.name(y),
            format!("the loss needs a floating-point first output, not {dt}"),
        ));
    }
    // A cross-entropy label input is added before the builder reserves names.
    let label = match kind {
        LossKind::CrossEntropy(name) => Some(label_input(m, y, name)?),
        _ => None,
    };
    let mut b = Builder::new(&mut m.graph, "loss");
    b.prefix = "loss".into();
    let all =
        |b: &mut Builder, v: Value| b.op1("ReduceSum", &[v], vec![("keepdims", Attr::Int(0))], dt);
    let l = match (kind, label) {
        (LossKind::MeanSquare, _) => {
            let sq = b.mul(y, y);
            let s = all(&mut b, sq);
            let n = b.op1("Size", &[y], vec![], DType::I64);
            let n = b.cast(n, dt);
            b.div(s, n)
        }
        (LossKind::Sum, _) => all(&mut b, y),
        (LossKind::CrossEntropy(_), Some(lab)) => {
            let ls = b.op1("LogSoftmax", &[y], vec![("axis", Attr::Int(-1))], dt);
            // one-hot(labels) = Cast(Equal(labels[..., None], Range(0, C))) (no OneHot: ORT has
            // no double kernel for it).
            let depth = match b
                .g
                .ty(y)
                .shape
                .as_ref()
                .and_then(|s| s.last())
                .and_then(|d| d.known())
            {
                Some(c) => b.constant(DType::I64, &[], &[c as f64])?,
                None => {
                    let s = b.op1("Shape", &[y], vec![], DType::I64);
                    let i = b.ints(&[-1]);
                    let c = b.op1("Gather", &[s, i], vec![], DType::I64);
                    b.squeeze(c, &[0])
                }
            };
            let zero = b.constant(DType::I64, &[], &[0.0])?;
            let one = b.constant(DType::I64, &[], &[1.0])?;
            let classes = b.op1("Range", &[zero, depth, one], vec![], DType::I64);
            let lab64 = b.cast(lab, DType::I64);
            let lu = b.unsqueeze(lab64, &[-1]);
            let eq = b.op1("Equal", &[lu, classes], vec![], DType::Bool);
            let oh = b.cast(eq, dt);
            let p = b.mul(oh, ls);
            let s = all(&mut b, p);
            let n = b.op1("Size", &[lab], vec![], DType::I64);
            let n = b.cast(n, dt);
            let q = b.div(s, n);
            b.neg(q)
        }
        (LossKind::CrossEntropy(_), None) => unreachable!("label input made above"),
    };
    let name = b.fresh("loss");
    b.g.values[l].name = name;
    Ok(l)
}

/// The integer label input `name`, added (int64, `y.shape[:-1]`) if the graph lacks it.
fn label_input(m: &mut Module, y: Value, name: &str) -> Result<Value> {
    let g = &mut m.graph;
    if let Some(v) = g.inputs.iter().copied().find(|v| g.name(*v) == name) {
        if !g.ty(v).dtype.is_int() {
            return Err(Error::named(
                name,
                "cross-entropy labels must be an integer input",
            ));
        }
        return Ok(v);
    }
    if g.values.values().any(|v| v.name == name) {
        return Err(Error::named(
            name,
            "cross-entropy label name is taken by a value that is not a graph input",
        ));
    }
    let shape = g
        .ty(y)
        .shape
        .as_ref()
        .map(|s| s[..s.len().saturating_sub(1)].to_vec());
    let ty = TensorType {
        dtype: DType::I64,
        shape,
    };
    Ok(g.add_input(name, ty))
}
