//! A small op builder used by the gradient rules, the loss and the optimizer: appends standard
//! ONNX ops (default domain) at the end of the program order with fresh, unique names.
//!
//! Result types are left unranked (element type only); the caller runs shape inference once at
//! the end, which fills every shape in. Rules must therefore only ask for the shapes of values
//! that existed before they ran (forward values), never of values the builder made.

use pipec_compiler::error::Error;
use pipec_compiler::ir::{Attr, DType, Dim, Graph, Op, OpData, TensorData, TensorType, Value};
use pipec_compiler::shape::SymbolicValues;
use pipec_compiler::Result;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Gradients of the operands, one slot per operand.
pub type Grads = Vec<Option<Value>>;

/// Appends ops to a graph. `tag` is stored as the `pipec.phase` annotation of every op made.
pub struct Builder<'g> {
    pub g: &'g mut Graph,
    names: HashSet<String>,
    /// Prefix for node and value names (e.g. the forward node being differentiated).
    pub prefix: String,
    /// `pipec.phase` annotation of the ops made (`bwd`, `loss`, `opt`).
    pub phase: &'static str,
    counter: usize,
    /// Cache of scalar / 1-D constants, keyed by (dtype, dims, bit patterns).
    consts: HashMap<(DType, Vec<i64>, Vec<u64>), Value>,
    /// Ops made so far (in order).
    pub made: Vec<Op>,
    /// The forward op whose backward the ops made now belong to (autodiff sets it while it
    /// differentiates an op); recorded per made op in [`Builder::origins`].
    pub grad_of: Option<Op>,
    /// `grad_of` at the time each op of [`Builder::made`] was made (parallel to it).
    pub origins: Vec<Option<Op>>,
    /// Integer values shape inference knows element by element although no `Constant` defines
    /// them (`Gather(Shape(x), 1)` where dim 1 of `x` is static and dim 0 the batch): the
    /// `Shape -> Gather -> Unsqueeze -> Concat` bounds of real exports' `Slice`/`Pad`/`Tile`.
    pub known: SymbolicValues,
}

impl<'g> Builder<'g> {
    /// A builder over `g`; every existing value and op name is reserved.
    pub fn new(g: &'g mut Graph, phase: &'static str) -> Self {
        let mut names = HashSet::new();
        for v in g.values.values() {
            names.insert(v.name.clone());
        }
        for o in g.ops.values() {
            names.insert(o.name.clone());
        }
        Builder {
            g,
            names,
            prefix: String::new(),
            phase,
            counter: 0,
            consts: HashMap::new(),
            made: Vec::new(),
            grad_of: None,
            origins: Vec::new(),
            known: SymbolicValues::new(),
        }
    }

    /// The integers of `v` if they are static: a constant's data, or values shape inference
    /// knows exactly ([`Builder::known`]).
    pub fn const_ints(&self, v: Value) -> Option<Vec<i64>> {
        if let Some(t) = self.g.constant(v) {
            return t.to_i64_vec();
        }
        let vals: Vec<i64> = self
            .known
            .get(v)?
            .iter()
            .map(Dim::known)
            .collect::<Option<_>>()?;
        let n = pipec_compiler::ir::numel(&self.g.ty(v).static_dims()?)?;
        (n == vals.len() as u64).then_some(vals)
    }

    /// A fresh name `base` (or `base_N`).
    pub fn fresh(&mut self, base: &str) -> String {
        if self.names.insert(base.to_string()) {
            return base.to_string();
        }
        loop {
            self.counter += 1;
            let n = format!("{base}_{}", self.counter);
            if self.names.insert(n.clone()) {
                return n;
            }
        }
    }

    /// Append an op with `n_out` results of the given element types; returns the results.
    pub fn op(
        &mut self,
        op_type: &str,
        inputs: &[Option<Value>],
        attrs: Vec<(&str, Attr)>,
        out_types: &[DType],
    ) -> Vec<Value> {
        let base = if self.prefix.is_empty() {
            op_type.to_string()
        } else {
            format!("{}/{op_type}", self.prefix)
        };
        let name = self.fresh(&base);
        let mut a: BTreeMap<String, Attr> =
            attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        a.insert("pipec.phase".into(), Attr::String(self.phase.into()));
        let results: Vec<(String, TensorType)> = out_types
            .iter()
            .enumerate()
            .map(|(i, dt)| {
                let vn = self.fresh(&format!("{name}_out{i}"));
                (vn, TensorType::unranked(*dt))
            })
            .collect();
        let (op, outs) = self.g.add_op(
            OpData {
                name,
                op_type: op_type.to_string(),
                domain: String::new(),
                inputs: inputs.to_vec(),
                outputs: Vec::new(),
                attrs: a,
            },
            results,
        );
        self.made.push(op);
        self.origins.push(self.grad_of);
        outs
    }

    /// One-result op whose result has element type `dt`.
    pub fn op1(
        &mut self,
        op_type: &str,
        inputs: &[Value],
        attrs: Vec<(&str, Attr)>,
        dt: DType,
    ) -> Value {
        let ins: Vec<Option<Value>> = inputs.iter().map(|v| Some(*v)).collect();
        self.op(op_type, &ins, attrs, &[dt])[0]
    }

    /// Element type of `v`.
    pub fn dt(&self, v: Value) -> DType {
        self.g.ty(v).dtype
    }

    /// Elementwise op keeping the element type of `a`.
    pub fn bin(&mut self, op_type: &str, a: Value, b: Value) -> Value {
        let dt = self.dt(a);
        self.op1(op_type, &[a, b], vec![], dt)
    }
    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.bin("Add", a, b)
    }
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.bin("Sub", a, b)
    }
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.bin("Mul", a, b)
    }
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.bin("Div", a, b)
    }
    /// Unary op keeping the element type.
    pub fn un(&mut self, op_type: &str, a: Value) -> Value {
        let dt = self.dt(a);
        self.op1(op_type, &[a], vec![], dt)
    }
    pub fn neg(&mut self, a: Value) -> Value {
        self.un("Neg", a)
    }

    /// A constant of element type `dt` (a float or integer type) with the given dims and values.
    pub fn constant(&mut self, dt: DType, dims: &[i64], vals: &[f64]) -> Result<Value> {
        let key = (
            dt,
            dims.to_vec(),
            vals.iter().map(|v| v.to_bits()).collect(),
        );
        if let Some(v) = self.consts.get(&key) {
            return Ok(*v);
        }
        let mut raw = Vec::new();
        for &x in vals {
            match dt {
                DType::F32 => raw.extend_from_slice(&(x as f32).to_le_bytes()),
                DType::F64 => raw.extend_from_slice(&x.to_le_bytes()),
                DType::F16 => raw.extend_from_slice(&half::f16::from_f64(x).to_le_bytes()),
                DType::BF16 => raw.extend_from_slice(&half::bf16::from_f64(x).to_le_bytes()),
                DType::I64 => raw.extend_from_slice(&(x as i64).to_le_bytes()),
                DType::I32 => raw.extend_from_slice(&(x as i32).to_le_bytes()),
                other => {
                    return Err(Error::msg(format!(
                        "autodiff: cannot make a constant of element type {other}"
                    )))
                }
            }
        }
        let t = TensorData::from_raw(dt, dims.to_vec(), raw.into())?;
        let saved = std::mem::take(&mut self.prefix);
        let v = self.op1("Constant", &[], vec![("value", Attr::Tensor(t))], dt);
        self.prefix = saved;
        self.consts.insert(key, v);
        Ok(v)
    }

    /// A scalar (0-D) constant of element type `dt`.
    pub fn scalar(&mut self, dt: DType, x: f64) -> Result<Value> {
        self.constant(dt, &[], &[x])
    }

    /// A 1-D int64 constant.
    pub fn ints(&mut self, vals: &[i64]) -> Value {
        let key = (
            DType::I64,
            vec![vals.len() as i64],
            vals.iter().map(|v| *v as u64).collect(),
        );
        if let Some(v) = self.consts.get(&key) {
            return *v;
        }
        let t = TensorData::from_i64(vec![vals.len() as i64], vals);
        let saved = std::mem::take(&mut self.prefix);
        let v = self.op1(
            "Constant",
            &[],
            vec![("value", Attr::Tensor(t))],
            DType::I64,
        );
        self.prefix = saved;
        self.consts.insert(key, v);
        v
    }

    /// `Shape(x)`, or a constant when `x`'s shape is static.
    pub fn shape_of(&mut self, x: Value) -> Value {
        if let Some(d) = self.g.ty(x).static_dims() {
            return self.ints(&d);
        }
        self.op1("Shape", &[x], vec![], DType::I64)
    }

    /// `ReduceSum(x, axes, keepdims)` (opset >= 13 form, axes as an input). Empty `axes` is the
    /// identity.
    pub fn reduce_sum(&mut self, x: Value, axes: &[i64], keepdims: bool) -> Value {
        if axes.is_empty() {
            return x;
        }
        let a = self.ints(axes);
        let dt = self.dt(x);
        self.op1(
            "ReduceSum",
            &[x, a],
            vec![("keepdims", Attr::Int(keepdims as i64))],
            dt,
        )
    }

    /// `Squeeze(x, axes)` (opset >= 13 form).
    pub fn squeeze(&mut self, x: Value, axes: &[i64]) -> Value {
        if axes.is_empty() {
            return x;
        }
        let a = self.ints(axes);
        let dt = self.dt(x);
        self.op1("Squeeze", &[x, a], vec![], dt)
    }

    /// `Unsqueeze(x, axes)` (opset >= 13 form).
    pub fn unsqueeze(&mut self, x: Value, axes: &[i64]) -> Value {
        if axes.is_empty() {
            return x;
        }
        let a = self.ints(axes);
        let dt = self.dt(x);
        self.op1("Unsqueeze", &[x, a], vec![], dt)
    }

    /// `Transpose(x, perm)`.
    pub fn transpose(&mut self, x: Value, perm: &[i64]) -> Value {
        let dt = self.dt(x);
        self.op1(
            "Transpose",
            &[x],
            vec![("perm", Attr::Ints(perm.to_vec()))],
            dt,
        )
    }

    /// `Reshape(x, shape-of-like)`.
    pub fn reshape_like(&mut self, x: Value, like: Value) -> Value {
        let s = self.shape_of(like);
        let dt = self.dt(x);
        self.op1("Reshape", &[x, s], vec![], dt)
    }

    /// `Reshape(x, const shape)`.
    pub fn reshape(&mut self, x: Value, shape: &[i64]) -> Value {
        let s = self.ints(shape);
        let dt = self.dt(x);
        self.op1("Reshape", &[x, s], vec![], dt)
    }

    /// `Expand(x, shape-of-like)`.
    pub fn expand_like(&mut self, x: Value, like: Value) -> Value {
        let s = self.shape_of(like);
        let dt = self.dt(x);
        self.op1("Expand", &[x, s], vec![], dt)
    }

    /// Zeros of `like`'s shape and element type.
    pub fn zeros_like(&mut self, like: Value) -> Result<Value> {
        let dt = self.dt(like);
        let s = self.shape_of(like);
        let z = TensorData::from_raw(dt, vec![1], zero_bytes(dt)?.into())?;
        Ok(self.op1(
            "ConstantOfShape",
            &[s],
            vec![("value", Attr::Tensor(z))],
            dt,
        ))
    }

    /// `Cast(x, to)`.
    pub fn cast(&mut self, x: Value, to: DType) -> Value {
        if self.dt(x) == to {
            return x;
        }
        self.op1(
            "Cast",
            &[x],
            vec![("to", Attr::Int(to.onnx_code() as i64))],
            to,
        )
    }

    /// Sum of several values (`Add` for two, `Sum` for more).
    pub fn sum(&mut self, vs: &[Value]) -> Value {
        match vs {
            [v] => *v,
            [a, b] => self.add(*a, *b),
            _ => {
                let dt = self.dt(vs[0]);
                self.op1("Sum", vs, vec![], dt)
            }
        }
    }

    /// Reduce `g` (whose shape is `gdims`, the broadcast result) to `tdims`, the shape of an
    /// operand that was broadcast to it (numpy rules): sum over the leading extra axes and over
    /// the axes where the operand has size 1 and the result does not.
    pub fn unbroadcast(&mut self, g: Value, gdims: &[Dim], tdims: &[Dim]) -> Result<Value> {
        let r = gdims.len();
        let k = tdims.len();
        if k > r {
            return Err(Error::msg(format!(
                "autodiff: operand of rank {k} broadcast to rank {r}"
            )));
        }
        let lead: Vec<i64> = (0..(r - k) as i64).collect();
        let inner: Vec<i64> = (0..k)
            .filter(|&j| tdims[j] == Dim::Known(1) && gdims[r - k + j] != Dim::Known(1))
            .map(|j| (r - k + j) as i64)
            .collect();
        if inner.is_empty() {
            return Ok(self.reduce_sum(g, &lead, false));
        }
        let all: Vec<i64> = lead.iter().chain(&inner).copied().collect();
        let s = self.reduce_sum(g, &all, true);
        Ok(self.squeeze(s, &lead))
    }
}

/// Little-endian bytes of one zero of element type `dt`.
pub fn zero_bytes(dt: DType) -> Result<Vec<u8>> {
    let n = dt
        .bytes_for(1)
        .filter(|_| dt != DType::String)
        .ok_or_else(|| Error::msg(format!("autodiff: no zero of element type {dt}")))?;
    Ok(vec![0u8; n as usize])
}
