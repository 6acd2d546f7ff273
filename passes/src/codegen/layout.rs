//! How codegen lays a value out over a stage's replicas, its concrete dims for a micro-batch,
//! and the names of cotangent inputs: the vocabulary `mod.rs` (the stage pieces) and
//! `insert_comm.rs` (the communication) share, apart from both.

use pipec_compiler::ir::{Dim, TensorType};

/// How a cross value is laid out over a stage's replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Axis 0 carries the batch: replicas hold row slices.
    Rows,
    /// No batch axis: every replica holds the whole value.
    Whole,
    /// The batch is on axis `k > 0` and only there (an RNN's `[seq, batch, hidden]`, attention
    /// transposed to `[seq, batch, heads, d]`): replicas hold slices of that axis.
    Axis(usize),
    /// The batch is on several axes: only exchangeable between equal replica counts.
    Other,
}

impl Layout {
    /// The axis replicas slice (`Rows`: 0), `None` for `Whole` and `Other`.
    pub fn batch_axis(self) -> Option<usize> {
        match self {
            Layout::Rows => Some(0),
            Layout::Axis(k) => Some(k),
            Layout::Whole | Layout::Other => None,
        }
    }
}

/// Concrete dims of `ty` with the batch symbol bound to `n` (`-1` where a dim stays unknown).
pub fn concrete_dims(ty: &TensorType, batch: &str, n: u64) -> Vec<i64> {
    ty.shape
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .map(|d| match d {
            Dim::Known(k) => *k,
            Dim::Sym(s) if s.syms.iter().all(|x| x == batch) => {
                s.coeff * (n as i64).pow(s.syms.len() as u32)
            }
            Dim::Sym(_) => -1,
        })
        .collect()
}

/// The layout of a value of type `ty`.
pub fn layout(ty: &TensorType, batch: &str) -> Layout {
    let has = |d: &Dim| matches!(d, Dim::Sym(s) if s.syms.iter().any(|x| x == batch));
    let dims = ty.shape.as_deref().unwrap_or(&[]);
    match dims.iter().position(has) {
        None => Layout::Whole,
        Some(k) if dims[k + 1..].iter().any(has) => Layout::Other,
        Some(0) => Layout::Rows,
        Some(k) => Layout::Axis(k),
    }
}

/// The cotangent input name for value `v` coming back from stage `consumer`.
pub fn cot_name(v: &str, consumer: usize) -> String {
    format!("cot/{v}/s{consumer}")
}
