//! Dispatch to the gradient rules that live outside `rules.rs` (activations, ConvTranspose, Pad,
//! group/instance normalization); `rules.rs` falls back to it. Apart from `autodiff.rs` so that
//! the rules do not import the pass that runs them.

use super::builder::{Builder, Grads};
use super::{activations, conv, norm, pad};
use pipec_compiler::ir::{Op, Value};
use pipec_compiler::Result;

/// Which operands carry gradients, for the op types whose rules live outside [`super::rules`]
/// (`None`: not one of them).
pub(super) fn extra_diff_inputs(d: &pipec_compiler::ir::OpData) -> Option<Vec<bool>> {
    match d.op_type.as_str() {
        // X and constant_value (pads and axes are integers).
        "Pad" => Some((0..d.inputs.len()).map(|i| i == 0 || i == 2).collect()),
        _ => activations::diff_inputs(d),
    }
}

/// The rules that live outside [`super::rules`] (`Ok(None)`: no rule for the op type).
pub(super) fn extra_grad(
    b: &mut Builder,
    op: Op,
    d: &pipec_compiler::ir::OpData,
    dys: &[Option<Value>],
    need: &[bool],
    opset: i64,
) -> Result<Option<Grads>> {
    let _ = op;
    let mut out: Grads = vec![None; d.inputs.len()];
    let Some(g) = dys.first().copied().flatten() else {
        return activations::grad(b, d, dys, need);
    };
    match d.op_type.as_str() {
        "ConvTranspose" => conv::conv_transpose_grads(b, d, g, need, &mut out)?,
        "Pad" => pad::pad_grads(b, d, g, need, &mut out)?,
        "InstanceNormalization" | "GroupNormalization" => {
            norm::group_norm_grads(b, d, g, need, &mut out, opset)?
        }
        _ => return activations::grad(b, d, dys, need),
    }
    Ok(Some(out))
}
