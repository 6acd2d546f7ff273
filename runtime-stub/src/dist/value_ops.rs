//! The schedule's data instructions (`Sum`, `Accumulate`, `Concat`, a sliced `Send`) on
//! [`Value`]s. Host tensors use [`super::data`]'s loops; an executor's own values (ONNX Runtime's,
//! on the GPU with `--device cuda`) go through small ONNX graphs (`Add`, `Concat`, `Slice`) that
//! the device's executor prepares once per dtype and runs where the values are, so gradients and
//! activations never leave the device for them (no hand-written kernels).

use super::data;
use crate::exec::{Executor, Prepared};
use crate::tensor::Tensor;
use crate::value::Value;
use pipec_compiler::ir::{Attr, DType, Graph, Module, OpData, TensorType};
use std::collections::{BTreeMap, HashMap};

/// Which small graph.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    /// `c = a + b`.
    Add,
    /// `y = concat(x0..x{n-1}, axis)`: `(n, axis)`.
    Concat(usize, usize),
    /// `y = x[starts..ends]` on the axis.
    Slice(usize),
}

/// The prepared graphs of one device.
pub struct ValueOps<'a> {
    executor: &'a dyn Executor,
    pieces: HashMap<(Kind, DType), Box<dyn Prepared>>,
}

type R<T> = std::result::Result<T, String>;

impl<'a> ValueOps<'a> {
    pub fn new(executor: &'a dyn Executor) -> Self {
        ValueOps {
            executor,
            pieces: HashMap::new(),
        }
    }

    /// `a + b` (same dtype and shape).
    pub fn add(&mut self, a: Value, b: Value) -> R<Value> {
        if a.shape() != b.shape() || a.dtype() != b.dtype() {
            return Err(format!(
                "cannot add a {}{:?} tensor to a {}{:?} accumulator",
                b.dtype(),
                b.shape(),
                a.dtype(),
                a.shape()
            ));
        }
        match (a, b) {
            (Value::Host(mut a), Value::Host(b)) => {
                data::add_assign(&mut a, &b)?;
                Ok(Value::Host(a))
            }
            (a, b) => {
                let dt = a.dtype();
                self.run(Kind::Add, dt, vec![("a".into(), a), ("b".into(), b)])
            }
        }
    }

    /// The parts concatenated along `axis`.
    pub fn concat(&mut self, parts: Vec<Value>, axis: usize) -> R<Value> {
        let first = parts.first().ok_or("nothing to concatenate")?;
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one part"));
        }
        if parts.iter().all(Value::is_host) {
            let ts = parts
                .into_iter()
                .map(|v| v.into_host().map_err(|e| e.to_string()))
                .collect::<R<Vec<Tensor>>>()?;
            return data::concat(&ts, axis).map(Value::Host);
        }
        let dt = first.dtype();
        let n = parts.len();
        let feeds = parts
            .into_iter()
            .enumerate()
            .map(|(i, v)| (format!("x{i}"), v))
            .collect();
        self.run(Kind::Concat(n, axis), dt, feeds)
    }

    /// Rows `lo * n / of .. hi * n / of` of `v`'s axis `axis` (`n` long); returns `v` and the
    /// slice.
    pub fn slice_rows(
        &mut self,
        v: Value,
        axis: usize,
        lo: u64,
        hi: u64,
        of: u64,
    ) -> R<(Value, Value)> {
        if let Value::Host(t) = &v {
            let s = data::slice_rows(t, axis, lo, hi, of)?;
            return Ok((v, Value::Host(s)));
        }
        let (a, b) = data::row_range(&v.shape(), axis, lo, hi, of)?;
        let bound = |x: usize| Value::Host(Tensor::I64(ndarray::arr1(&[x as i64]).into_dyn()));
        let dt = v.dtype();
        let (back, out) = self.run_keep(
            Kind::Slice(axis),
            dt,
            vec![
                ("x".into(), v),
                ("starts".into(), bound(a)),
                ("ends".into(), bound(b)),
            ],
        )?;
        let x = back
            .into_iter()
            .find(|(name, _)| name == "x")
            .map(|(_, v)| v)
            .ok_or("the slice graph did not give its input back")?;
        Ok((x, out))
    }

    fn run(&mut self, kind: Kind, dt: DType, feeds: Vec<(String, Value)>) -> R<Value> {
        self.run_keep(kind, dt, feeds).map(|(_, out)| out)
    }

    fn run_keep(
        &mut self,
        kind: Kind,
        dt: DType,
        feeds: Vec<(String, Value)>,
    ) -> R<(Vec<(String, Value)>, Value)> {
        let piece = match self.pieces.entry((kind, dt)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let m = graph_of(kind, dt);
                let p = self
                    .executor
                    .prepare(&m)
                    .map_err(|err| format!("preparing the {kind:?} graph for {dt}: {err}"))?;
                e.insert(p)
            }
        };
        let (back, outs) = piece
            .run_values(feeds)
            .map_err(|e| format!("{kind:?} ({dt}): {e}"))?;
        let out = outs
            .into_iter()
            .next()
            .map(|(_, v)| v)
            .ok_or_else(|| format!("the {kind:?} graph returned nothing"))?;
        Ok((back, out))
    }
}

/// The ONNX graph of `kind` on `dt` tensors of any shape (opset 17).
fn graph_of(kind: Kind, dt: DType) -> Module {
    let mut g = Graph::new(format!("pipec_{kind:?}_{dt}").to_lowercase());
    let any = TensorType::unranked(dt);
    let (op_type, inputs, attrs) = match kind {
        Kind::Add => (
            "Add",
            vec![g.add_input("a", any.clone()), g.add_input("b", any.clone())],
            BTreeMap::new(),
        ),
        Kind::Concat(n, axis) => (
            "Concat",
            (0..n)
                .map(|i| g.add_input(format!("x{i}"), any.clone()))
                .collect(),
            BTreeMap::from([("axis".to_string(), Attr::Int(axis as i64))]),
        ),
        Kind::Slice(axis) => {
            let x = g.add_input("x", any.clone());
            let one = TensorType::known(DType::I64, &[1]);
            let s = g.add_input("starts", one.clone());
            let e = g.add_input("ends", one);
            let axes = g.add_initializer(
                "axes",
                Tensor::I64(ndarray::arr1(&[axis as i64]).into_dyn()).to_tensor_data(),
            );
            ("Slice", vec![x, s, e, axes], BTreeMap::new())
        }
    };
    let (_, outs) = g.add_op(
        OpData {
            name: op_type.to_lowercase(),
            op_type: op_type.into(),
            inputs: inputs.into_iter().map(Some).collect(),
            attrs,
            ..Default::default()
        },
        vec![("y".into(), any)],
    );
    g.outputs = outs;
    Module {
        graph: g,
        opset_imports: BTreeMap::from([(String::new(), 17)]),
        ir_version: 8,
        producer_name: "pipec".into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::F32(ArrayD::from_shape_vec(shape, v.to_vec()).unwrap())
    }

    /// The graphs compute what the host loops do, on the reference interpreter (whose values
    /// are host tensors, so the graphs run only when asked for directly).
    #[test]
    fn graphs_agree_with_the_host_loops() {
        let ex = crate::reference::Reference;
        for (kind, feeds, want) in [
            (
                Kind::Add,
                vec![("a", t(&[1., 2.], &[2])), ("b", t(&[3., 4.], &[2]))],
                t(&[4., 6.], &[2]),
            ),
            (
                Kind::Concat(2, 0),
                vec![("x0", t(&[1., 2.], &[1, 2])), ("x1", t(&[3., 4.], &[1, 2]))],
                t(&[1., 2., 3., 4.], &[2, 2]),
            ),
            (
                Kind::Concat(2, 1),
                vec![("x0", t(&[1., 2.], &[2, 1])), ("x1", t(&[3., 4.], &[2, 1]))],
                t(&[1., 3., 2., 4.], &[2, 2]),
            ),
            (
                Kind::Slice(1),
                vec![
                    ("x", t(&[1., 2., 3., 4.], &[2, 2])),
                    ("starts", Tensor::I64(ndarray::arr1(&[1i64]).into_dyn())),
                    ("ends", Tensor::I64(ndarray::arr1(&[2i64]).into_dyn())),
                ],
                t(&[2., 4.], &[2, 1]),
            ),
            (
                Kind::Slice(0),
                vec![
                    ("x", t(&[1., 2., 3., 4.], &[4])),
                    ("starts", Tensor::I64(ndarray::arr1(&[1i64]).into_dyn())),
                    ("ends", Tensor::I64(ndarray::arr1(&[3i64]).into_dyn())),
                ],
                t(&[2., 3.], &[2]),
            ),
        ] {
            let m = graph_of(kind, DType::F32);
            let mut p = ex.prepare(&m).unwrap();
            let feeds: Vec<(String, Tensor)> =
                feeds.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
            let out = p.run(&feeds).unwrap();
            assert_eq!(out[0].1, want, "{kind:?}");
        }
    }
}
