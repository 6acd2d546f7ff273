//! The view of one op that shape rules work on, and shared dim helpers.

use super::{SymbolicValues, MAX_TRACKED_ELEMS};
use crate::error::{Error, Result};
use crate::ir::{Attr, DType, Dim, Graph, Op, OpData, TensorType, Value};
use cranelift_entity::EntityRef;

/// Largest rank accepted for a result whose rank comes from data.
pub const MAX_RANK: i64 = 1024;

/// Prefix of symbols invented by inference.
pub const FRESH_PREFIX: &str = "unk_";

/// One op under inference: graph, op data, opset and the symbolic values of its operands.
pub struct Node<'a> {
    pub g: &'a Graph,
    pub op: Op,
    pub data: &'a OpData,
    pub opset: i64,
    pub vals: &'a SymbolicValues,
}

impl<'a> Node<'a> {
    /// View of `op`.
    pub fn new(g: &'a Graph, op: Op, opset: i64, vals: &'a SymbolicValues) -> Self {
        Node {
            g,
            op,
            data: &g.ops[op],
            opset,
            vals,
        }
    }

    /// Shape error naming this node.
    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::shape(&self.data.display_name(self.g), &self.data.op_type, msg)
    }

    /// Op type.
    pub fn op_type(&self) -> &str {
        &self.data.op_type
    }

    /// Number of results.
    pub fn num_outputs(&self) -> usize {
        self.data.outputs.len()
    }

    /// Number of operand slots.
    pub fn num_inputs(&self) -> usize {
        self.data.inputs.len()
    }

    /// The i-th operand, if present.
    pub fn input(&self, i: usize) -> Option<Value> {
        self.data.input(i)
    }

    /// Type of the required i-th operand.
    pub fn ty(&self, i: usize) -> Result<&'a TensorType> {
        let g = self.g;
        match self.data.input(i) {
            Some(v) => Ok(g.ty(v)),
            None => Err(self.err(format!("missing required input {i}"))),
        }
    }

    /// Type of the optional i-th operand.
    pub fn opt_ty(&self, i: usize) -> Option<&'a TensorType> {
        let g = self.g;
        self.data.input(i).map(|v| g.ty(v))
    }

    /// Element type of the required i-th operand.
    pub fn dtype(&self, i: usize) -> Result<DType> {
        Ok(self.ty(i)?.dtype)
    }

    /// Shape of the required i-th operand (`None`: rank unknown).
    pub fn shape(&self, i: usize) -> Result<Option<&'a [Dim]>> {
        Ok(self.ty(i)?.shape.as_deref())
    }

    /// Integer attribute with a default; a non-int attribute is an error.
    pub fn int_attr(&self, name: &str, default: i64) -> Result<i64> {
        match self.data.attr(name) {
            None => Ok(default),
            Some(Attr::Int(v)) => Ok(*v),
            Some(a) => Err(self.err(format!("attribute '{name}' must be an int, got {a:?}"))),
        }
    }

    /// Optional integer attribute.
    pub fn opt_int_attr(&self, name: &str) -> Result<Option<i64>> {
        match self.data.attr(name) {
            None => Ok(None),
            Some(Attr::Int(v)) => Ok(Some(*v)),
            Some(a) => Err(self.err(format!("attribute '{name}' must be an int, got {a:?}"))),
        }
    }

    /// Float attribute with a default.
    pub fn float_attr(&self, name: &str, default: f32) -> Result<f32> {
        match self.data.attr(name) {
            None => Ok(default),
            Some(a) => a
                .as_float()
                .ok_or_else(|| self.err(format!("attribute '{name}' must be a float"))),
        }
    }

    /// Optional ints attribute.
    pub fn ints_attr(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.data.attr(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Int(v)) => Ok(Some(vec![*v])),
            Some(a) => Err(self.err(format!("attribute '{name}' must be ints, got {a:?}"))),
        }
    }

    /// Optional floats attribute.
    pub fn floats_attr(&self, name: &str) -> Result<Option<Vec<f32>>> {
        match self.data.attr(name) {
            None => Ok(None),
            Some(Attr::Floats(v)) => Ok(Some(v.clone())),
            Some(Attr::Float(v)) => Ok(Some(vec![*v])),
            Some(a) => Err(self.err(format!("attribute '{name}' must be floats, got {a:?}"))),
        }
    }

    /// String attribute with a default.
    pub fn str_attr(&self, name: &str, default: &'a str) -> Result<&'a str> {
        match self.data.attrs.get(name) {
            None => Ok(default),
            Some(Attr::String(s)) => Ok(s.as_str()),
            Some(a) => Err(self.err(format!("attribute '{name}' must be a string, got {a:?}"))),
        }
    }

    /// Element values of the i-th operand as dims: tracked symbolic values, or the data of a
    /// small integer constant.
    pub fn value(&self, i: usize) -> Option<Vec<Dim>> {
        let v = self.data.input(i)?;
        value_of(self.g, self.vals, v)
    }

    /// Element values of the i-th operand, if all are known integers.
    pub fn const_ints(&self, i: usize) -> Option<Vec<i64>> {
        let v = self.data.input(i)?;
        if let Some(t) = self.g.constant(v) {
            return t.to_i64_vec();
        }
        self.value(i)?.iter().map(Dim::known).collect()
    }

    /// Float values of a constant operand (initializer, `Constant` with `value` or
    /// `value_float(s)` / `value_int(s)`, or tracked known ints).
    pub fn const_floats(&self, i: usize) -> Option<Vec<f64>> {
        let v = self.data.input(i)?;
        if let Some(t) = self.g.constant(v) {
            return t.to_f64_vec();
        }
        if let Some(op) = self.g.producer(v) {
            let d = &self.g.ops[op];
            if d.op_type == "Constant" && d.domain.is_empty() {
                match (d.attr("value_float"), d.attr("value_floats")) {
                    (Some(Attr::Float(x)), _) => return Some(vec![f64::from(*x)]),
                    (_, Some(Attr::Floats(x))) => {
                        return Some(x.iter().map(|f| f64::from(*f)).collect())
                    }
                    _ => {}
                }
            }
        }
        self.const_ints(i)
            .map(|v| v.into_iter().map(|x| x as f64).collect())
    }

    /// Normalize axis `a` for rank `r` (`-r <= a < r`).
    pub fn axis(&self, a: i64, r: usize) -> Result<usize> {
        let ri = r as i64;
        if a < -ri || a >= ri {
            return Err(self.err(format!("axis {a} is out of range for rank {r}")));
        }
        Ok(if a < 0 { (a + ri) as usize } else { a as usize })
    }

    /// Normalize a list of axes, rejecting duplicates.
    pub fn axes(&self, axes: &[i64], r: usize) -> Result<Vec<usize>> {
        let mut out = Vec::with_capacity(axes.len());
        for &a in axes {
            let x = self.axis(a, r)?;
            if out.contains(&x) {
                return Err(self.err(format!("axis {a} is repeated in {axes:?}")));
            }
            out.push(x);
        }
        Ok(out)
    }

    /// A fresh symbol for result dim `k` of this op (data-dependent or not derivable).
    pub fn fresh(&self, k: usize) -> Dim {
        Dim::sym(format!("{FRESH_PREFIX}{}_{k}", self.op.index()))
    }

    /// `rank` fresh dims for a result whose rank comes from a shape operand's length.
    pub fn fresh_shape(&self, rank: i64) -> Result<Vec<Dim>> {
        if !(0..=MAX_RANK).contains(&rank) {
            return Err(self.err(format!(
                "result rank {rank} is out of range (0..={MAX_RANK})"
            )));
        }
        Ok((0..rank as usize).map(|k| self.fresh(k)).collect())
    }

    /// Checked product of dims.
    pub fn product(&self, dims: &[Dim]) -> Result<Dim> {
        product(dims).ok_or_else(|| {
            self.err(format!(
                "the element count of {} overflows i64",
                super::fmt_dims(dims)
            ))
        })
    }

    /// Checked dim product.
    pub fn mul(&self, a: &Dim, b: &Dim) -> Result<Dim> {
        a.mul(b)
            .ok_or_else(|| self.err(format!("dim product {a} * {b} overflows i64")))
    }

    /// Known dim as a non-negative i64 or error.
    pub fn check_dim(&self, v: i64, what: &str) -> Result<Dim> {
        if v < 0 {
            return Err(self.err(format!("{what} is negative ({v})")));
        }
        Ok(Dim::Known(v))
    }

    /// Multidirectional (numpy) broadcast of two shapes.
    pub fn broadcast(&self, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
        let r = a.len().max(b.len());
        let mut out = Vec::with_capacity(r);
        for k in 0..r {
            let da = (k + a.len()).checked_sub(r).and_then(|i| a.get(i));
            let db = (k + b.len()).checked_sub(r).and_then(|i| b.get(i));
            out.push(match (da, db) {
                (Some(x), None) | (None, Some(x)) => x.clone(),
                (Some(x), Some(y)) => self.broadcast_dim(x, y, k).ok_or_else(|| {
                    self.err(format!(
                        "shapes {} and {} do not broadcast (dim {x} vs {y})",
                        super::fmt_dims(a),
                        super::fmt_dims(b)
                    ))
                })?,
                (None, None) => Dim::Known(1),
            });
        }
        Ok(out)
    }

    /// Broadcast two dims: 1 broadcasts, equal dims match, a known dim wins over a symbol (the
    /// symbol must equal it or be 1 at run time). Two different symbols: the non-fresh one if the
    /// other is fresh, else a fresh symbol for result dim `k` (either could be 1 at run time).
    /// `None` for two different known dims (neither 1).
    pub fn broadcast_dim(&self, x: &Dim, y: &Dim, k: usize) -> Option<Dim> {
        match (x, y) {
            _ if x == y => Some(x.clone()),
            (Dim::Known(1), o) | (o, Dim::Known(1)) => Some(o.clone()),
            (Dim::Known(_), Dim::Known(_)) => None,
            (Dim::Known(k), Dim::Sym(_)) | (Dim::Sym(_), Dim::Known(k)) => Some(Dim::Known(*k)),
            (Dim::Sym(_), Dim::Sym(_)) => {
                match (super::is_fresh_symbol(x), super::is_fresh_symbol(y)) {
                    (true, false) => Some(y.clone()),
                    (false, true) => Some(x.clone()),
                    _ => Some(self.fresh(k)),
                }
            }
        }
    }

    /// Broadcast the shapes of all present inputs; `None` if a rank is unknown.
    pub fn broadcast_inputs(&self, idx: &[usize]) -> Result<Option<Vec<Dim>>> {
        let mut acc: Vec<Dim> = Vec::new();
        for &i in idx {
            let Some(t) = self.opt_ty(i) else { continue };
            let Some(s) = &t.shape else { return Ok(None) };
            acc = self.broadcast(&acc, s)?;
        }
        Ok(Some(acc))
    }
}

/// Tracked values of `v` or the data of a small integer constant.
pub fn value_of(g: &Graph, vals: &SymbolicValues, v: Value) -> Option<Vec<Dim>> {
    if let Some(d) = vals.get(v) {
        return Some(d.to_vec());
    }
    let t = g.constant(v)?;
    if t.numel()? > MAX_TRACKED_ELEMS as u64 {
        return None;
    }
    if !(t.dtype.is_int() || t.dtype == DType::Bool) {
        return None;
    }
    Some(t.to_i64_vec()?.into_iter().map(Dim::Known).collect())
}

/// Checked product of dims (`None` on overflow).
pub fn product(dims: &[Dim]) -> Option<Dim> {
    dims.iter().try_fold(Dim::Known(1), |acc, d| acc.mul(d))
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{dims, T};
    use super::*;

    #[test]
    fn broadcast_dims() {
        let mut t = T::new();
        let x = t.input(DType::F32, "2");
        let op = t.op("Relu", &[Some(x)], &[], 1);
        let vals = SymbolicValues::new();
        let n = Node::new(&t.g, op, 18, &vals);
        let b = |a: &str, c: &str| {
            n.broadcast(&dims(a), &dims(c))
                .map(|v| super::super::fmt_dims(&v))
                .map_err(|e| e.to_string())
        };
        assert_eq!(b("batch,1,5", "4,1").unwrap(), "[batch, 4, 5]");
        assert_eq!(b("batch", "batch").unwrap(), "[batch]");
        assert_eq!(b("batch", "1").unwrap(), "[batch]");
        assert_eq!(b("batch", "7").unwrap(), "[7]");
        assert_eq!(b("", "3,2").unwrap(), "[3, 2]");
        assert_eq!(b("unk_1_0", "seq").unwrap(), "[seq]");
        assert_eq!(b("seq", "unk_1_0").unwrap(), "[seq]");
        assert_eq!(b("n", "m").unwrap(), format!("[unk_{}_0]", op.as_u32()));
        assert!(b("3", "4").unwrap_err().contains("do not broadcast"));
    }

    #[test]
    fn axes_and_products() {
        let mut t = T::new();
        let x = t.input(DType::F32, "2");
        let op = t.op("Relu", &[Some(x)], &[], 1);
        let vals = SymbolicValues::new();
        let n = Node::new(&t.g, op, 18, &vals);
        assert_eq!(n.axis(-1, 3).unwrap(), 2);
        assert!(n.axis(3, 3).is_err());
        assert!(n.axis(-4, 3).is_err());
        assert!(n.axes(&[0, -3], 3).is_err(), "repeated axis");
        assert_eq!(
            n.product(&dims("2,batch,3")).unwrap().to_string(),
            "6*batch"
        );
        assert!(n.product(&[Dim::Known(i64::MAX), Dim::Known(2)]).is_err());
        assert!(n.fresh_shape(-1).is_err());
        assert!(n.fresh_shape(MAX_RANK + 1).is_err());
        assert_eq!(n.fresh_shape(2).unwrap().len(), 2);
    }
}
