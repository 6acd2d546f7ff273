//! Symbolic value propagation (ONNX "data propagation"): element values of small integer 0-D/1-D
//! tensors as [`Dim`]s, through the ops that real exports use for shape arithmetic.
//! Only exact results are recorded; anything else is simply not tracked.

use super::node::{product, Node};
use super::shape_ops::{add_dims, shape_range, slice_args, slice_range};
use super::MAX_TRACKED_ELEMS;
use crate::ir::{Attr, DType, Dim, TensorType};

/// Values of each result of `n` (given its inferred result types), where derivable.
pub fn propagate(n: &Node, out: &[TensorType]) -> Vec<Option<Vec<Dim>>> {
    let mut res = vec![None; out.len()];
    let Some(t0) = out.first() else { return res };
    if !(t0.dtype.is_int() || t0.dtype == DType::Bool) {
        return res;
    }
    if n.op_type() == "Split" {
        // Splitting a shape vector: each piece is a contiguous run.
        if let Some(v) = n.value(0).filter(|_| rank(n, 0).is_some_and(|r| r <= 1)) {
            let mut at = 0usize;
            for (i, t) in out.iter().enumerate() {
                let Some(len) = t
                    .shape
                    .as_ref()
                    .filter(|s| s.len() == 1)
                    .and_then(|s| s[0].known())
                else {
                    break;
                };
                let Some(end) = usize::try_from(len).ok().and_then(|l| at.checked_add(l)) else {
                    break;
                };
                res[i] = v.get(at..end).map(<[Dim]>::to_vec);
                at = end;
            }
        }
        return res;
    }
    let Some(v) = one(n, t0) else { return res };
    // Values of any rank are kept (row-major) when the result's shape is static.
    let ok_len = t0
        .shape
        .as_deref()
        .and_then(static_dims)
        .is_some_and(|d| checked_prod(&d) == Some(v.len() as i64));
    if ok_len && v.len() <= MAX_TRACKED_ELEMS {
        res[0] = Some(v);
    }
    res
}

/// Static dims of a shape (`None` if one is symbolic or negative).
fn static_dims(s: &[Dim]) -> Option<Vec<i64>> {
    s.iter().map(|d| d.known().filter(|k| *k >= 0)).collect()
}

/// Checked product of static dims.
fn checked_prod(d: &[i64]) -> Option<i64> {
    d.iter().try_fold(1i64, |acc, x| acc.checked_mul(*x))
}

/// Rank of operand `i`.
fn rank(n: &Node, i: usize) -> Option<usize> {
    n.opt_ty(i)?.rank()
}

/// Values of operand `i` broadcast (numpy rules) to the static shape of result `out`.
fn operand(n: &Node, i: usize, out: &TensorType) -> Option<Vec<Dim>> {
    let v = n.value(i)?;
    let ind = static_dims(n.opt_ty(i)?.shape.as_deref()?)?;
    let outd = static_dims(out.shape.as_deref()?)?;
    if ind == outd {
        return Some(v);
    }
    let lead = outd.len().checked_sub(ind.len())?;
    remap(&v, &ind, &outd, |c| {
        ind.iter()
            .enumerate()
            .map(|(a, d)| {
                if *d == 1 {
                    Some(0)
                } else {
                    c.get(a + lead).copied()
                }
            })
            .collect()
    })
}

/// Row-major strides of static dims.
fn strides(d: &[i64]) -> Vec<i64> {
    let mut st = vec![1i64; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        st[i] = st[i + 1].saturating_mul(d[i + 1]);
    }
    st
}

/// Gather `data` (row-major, input dims `ind`) into the result of dims `outd`, where the input
/// coordinate on axis `a` of result coordinate `c` is `map(a, c[..])`.
fn remap(
    data: &[Dim],
    ind: &[i64],
    outd: &[i64],
    map: impl Fn(&[i64]) -> Option<Vec<i64>>,
) -> Option<Vec<Dim>> {
    let total = usize::try_from(checked_prod(outd)?).ok()?;
    if total > MAX_TRACKED_ELEMS {
        return None;
    }
    let (ist, ost) = (strides(ind), strides(outd));
    (0..total as i64)
        .map(|flat| {
            let c: Vec<i64> = ost
                .iter()
                .zip(outd)
                .map(|(s, d)| if *d == 0 { 0 } else { (flat / s) % d })
                .collect();
            let ic = map(&c)?;
            let off = ic
                .iter()
                .zip(&ist)
                .try_fold(0i64, |acc, (a, b)| acc.checked_add(a.checked_mul(*b)?))?;
            data.get(usize::try_from(off).ok()?).cloned()
        })
        .collect()
}

/// Elementwise binary op on value vectors with scalar / length-1 broadcasting.
fn zip(a: &[Dim], b: &[Dim], f: impl Fn(&Dim, &Dim) -> Option<Dim>) -> Option<Vec<Dim>> {
    let len = a.len().max(b.len());
    let at = |v: &[Dim], i: usize| -> Option<Dim> {
        if v.len() == 1 {
            v.first().cloned()
        } else {
            v.get(i).cloned()
        }
    };
    if (a.len() != len && a.len() != 1) || (b.len() != len && b.len() != 1) {
        return None;
    }
    (0..len).map(|i| f(&at(a, i)?, &at(b, i)?)).collect()
}

fn neg(d: &Dim) -> Option<Dim> {
    d.mul(&Dim::Known(-1))
}

fn one(n: &Node, out: &TensorType) -> Option<Vec<Dim>> {
    match n.op_type() {
        "Shape" => {
            let s = n.shape(0).ok()??;
            let (a, b) = shape_range(n, s.len()).ok()?;
            Some(s[a..b].to_vec())
        }
        "Size" => Some(vec![product(n.shape(0).ok()??)?]),
        "Constant" => match n.data.attrs.get("value_int") {
            Some(Attr::Int(v)) => Some(vec![Dim::Known(*v)]),
            _ => match n.data.attrs.get("value_ints") {
                Some(Attr::Ints(v)) => Some(v.iter().map(|x| Dim::Known(*x)).collect()),
                _ => {
                    let v = n.data.outputs.first()?;
                    super::node::value_of(n.g, n.vals, *v)
                }
            },
        },
        "Identity" | "Reshape" | "Unsqueeze" | "Squeeze" | "Flatten" => n.value(0),
        "Expand" => {
            let v = n.value(0)?;
            let len = match out.shape.as_deref()? {
                [] => 1,
                [d] => usize::try_from(d.known()?).ok()?,
                _ => return None,
            };
            if len > MAX_TRACKED_ELEMS {
                return None;
            }
            match v.len() {
                l if l == len => Some(v),
                1 => Some(vec![v.first()?.clone(); len]),
                _ => None,
            }
        }
        "Cast" | "CastLike" => {
            let v = n.value(0)?;
            if out.dtype == DType::Bool {
                v.iter()
                    .map(|d| d.known().map(|k| Dim::Known(i64::from(k != 0))))
                    .collect()
            } else {
                Some(v)
            }
        }
        "Concat" => {
            // Row-major concatenation along axis 0 is flat concatenation.
            let r = rank(n, 0)?;
            let ax = n.int_attr("axis", 0).ok()?;
            if r > 1 && ax != 0 && ax != -(r as i64) {
                return None;
            }
            let mut acc = Vec::new();
            for i in 0..n.num_inputs() {
                if n.input(i).is_some() {
                    acc.extend(n.value(i)?);
                }
            }
            Some(acc)
        }
        "Gather" => {
            let data = n.value(0)?;
            if n.shape(0).ok()??.len() != 1 {
                return None;
            }
            let idx = n.const_ints(1)?;
            let len = data.len() as i64;
            idx.iter()
                .map(|&i| {
                    let j = if i < 0 { i + len } else { i };
                    data.get(usize::try_from(j).ok()?).cloned()
                })
                .collect()
        }
        "Slice" => {
            let data = n.value(0)?;
            let ind = static_dims(n.shape(0).ok()??)?;
            let outd = static_dims(out.shape.as_deref()?)?;
            let a = slice_args(n).ok()??;
            let axes = n.axes(&a.axes, ind.len()).ok()?;
            let mut first = vec![0i64; ind.len()];
            let mut step = vec![1i64; ind.len()];
            for (i, &ax) in axes.iter().enumerate() {
                first[ax] = slice_range(ind[ax], a.starts[i], a.ends[i], a.steps[i]).0;
                step[ax] = a.steps[i];
            }
            remap(&data, &ind, &outd, |c| {
                c.iter()
                    .zip(first.iter().zip(&step))
                    .map(|(k, (f, st))| f.checked_add(k.checked_mul(*st)?))
                    .collect()
            })
        }
        "Transpose" => {
            let data = n.value(0)?;
            let ind = static_dims(n.shape(0).ok()??)?;
            let outd = static_dims(out.shape.as_deref()?)?;
            let perm: Vec<usize> = match n.ints_attr("perm").ok()? {
                Some(p) => n.axes(&p, ind.len()).ok()?,
                None => (0..ind.len()).rev().collect(),
            };
            remap(&data, &ind, &outd, |c| {
                let mut ic = vec![0i64; perm.len()];
                for (o, &p) in perm.iter().enumerate() {
                    *ic.get_mut(p)? = *c.get(o)?;
                }
                Some(ic)
            })
        }
        "Add" => zip(&operand(n, 0, out)?, &operand(n, 1, out)?, add_dims),
        "Sub" => zip(&operand(n, 0, out)?, &operand(n, 1, out)?, |a, b| {
            if a == b {
                Some(Dim::Known(0))
            } else {
                add_dims(a, &neg(b)?)
            }
        }),
        "Mul" => zip(&operand(n, 0, out)?, &operand(n, 1, out)?, |a, b| a.mul(b)),
        "Div" => zip(&operand(n, 0, out)?, &operand(n, 1, out)?, |a, b| {
            match (a, b) {
                (Dim::Known(x), Dim::Known(y)) => x.checked_div(*y).map(Dim::Known),
                _ => a.div(b),
            }
        }),
        // Integer Mod: the sign follows the divisor (Python's `%`), or the dividend with `fmod=1`.
        "Mod" => {
            let fmod = n.int_attr("fmod", 0).unwrap_or(0) != 0;
            zip(&operand(n, 0, out)?, &operand(n, 1, out)?, |a, b| {
                match (a, b) {
                    (Dim::Known(x), Dim::Known(y)) => {
                        let r = x.checked_rem(*y)?;
                        Some(Dim::Known(if !fmod && r != 0 && (r < 0) != (*y < 0) {
                            r + y
                        } else {
                            r
                        }))
                    }
                    _ => None,
                }
            })
        }
        "Neg" => n.value(0)?.iter().map(neg).collect(),
        "Equal" => zip(&operand(n, 0, out)?, &operand(n, 1, out)?, |a, b| {
            if a == b {
                return Some(Dim::Known(1));
            }
            match (a, b) {
                (Dim::Known(_), Dim::Known(_)) => Some(Dim::Known(0)),
                // Symbolic sizes are non-negative.
                (Dim::Known(k), Dim::Sym(_)) | (Dim::Sym(_), Dim::Known(k)) if *k < 0 => {
                    Some(Dim::Known(0))
                }
                _ => None,
            }
        }),
        "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" => {
            let op = n.op_type().to_string();
            zip(&operand(n, 0, out)?, &operand(n, 1, out)?, |a, b| {
                let (x, y) = (a.known()?, b.known()?);
                let r = match op.as_str() {
                    "Less" => x < y,
                    "Greater" => x > y,
                    "LessOrEqual" => x <= y,
                    _ => x >= y,
                };
                Some(Dim::Known(i64::from(r)))
            })
        }
        "Not" => n
            .value(0)?
            .iter()
            .map(|d| d.known().map(|k| Dim::Known(i64::from(k == 0))))
            .collect(),
        "Where" => {
            let c = operand(n, 0, out)?;
            let x = operand(n, 1, out)?;
            let y = operand(n, 2, out)?;
            // Select per element with broadcasting of all three.
            let len = c.len().max(x.len()).max(y.len());
            let at = |v: &[Dim], i: usize| {
                if v.len() == 1 {
                    v.first().cloned()
                } else {
                    v.get(i).cloned()
                }
            };
            (0..len)
                .map(|i| {
                    let k = at(&c, i)?.known()?;
                    if k != 0 {
                        at(&x, i)
                    } else {
                        at(&y, i)
                    }
                })
                .collect()
        }
        "Min" | "Max" => {
            let is_min = n.op_type() == "Min";
            let mut acc = operand(n, 0, out)?;
            for i in 1..n.num_inputs() {
                acc = zip(&acc, &operand(n, i, out)?, |a, b| {
                    if a == b {
                        return Some(a.clone());
                    }
                    let (x, y) = (a.known()?, b.known()?);
                    Some(Dim::Known(if is_min { x.min(y) } else { x.max(y) }))
                })?;
            }
            Some(acc)
        }
        "ReduceProd" | "ReduceSum" | "ReduceMax" | "ReduceMin" => {
            let v = n.value(0)?;
            // Only full reductions of a 1-D vector.
            if product(out.shape.as_ref()?)?.known()? != 1 {
                return None;
            }
            let r = match n.op_type() {
                "ReduceProd" => product(&v)?,
                "ReduceSum" => v.iter().try_fold(Dim::Known(0), |a, d| add_dims(&a, d))?,
                "ReduceMax" => Dim::Known(
                    v.iter()
                        .map(Dim::known)
                        .collect::<Option<Vec<_>>>()?
                        .into_iter()
                        .max()?,
                ),
                _ => Dim::Known(
                    v.iter()
                        .map(Dim::known)
                        .collect::<Option<Vec<_>>>()?
                        .into_iter()
                        .min()?,
                ),
            };
            Some(vec![r])
        }
        "ConstantOfShape" => {
            let fill = match n.data.attrs.get("value") {
                Some(Attr::Tensor(t)) => *t.to_i64_vec()?.first()?,
                _ => 0,
            };
            let dims = n.value(0)?;
            let count = product(&dims)?.known()?;
            if count < 0 || count as usize > MAX_TRACKED_ELEMS {
                return None;
            }
            Some(vec![Dim::Known(fill); count as usize])
        }
        "Range" => {
            let (s, l, d) = (n.const_ints(0)?, n.const_ints(1)?, n.const_ints(2)?);
            let (s, l, d) = (*s.first()?, *l.first()?, *d.first()?);
            if d == 0 {
                return None;
            }
            let (num, den) = (l as i128 - s as i128, d as i128);
            let (num, den) = if den < 0 { (-num, -den) } else { (num, den) };
            let count = (num + den - 1).div_euclid(den);
            if count < 0 || count as usize > MAX_TRACKED_ELEMS {
                return if count <= 0 { Some(vec![]) } else { None };
            }
            (0..count as i64)
                .map(|k| Some(Dim::Known(s.checked_add(k.checked_mul(d)?)?)))
                .collect()
        }
        "Tile" if rank(n, 0) == Some(1) => {
            let v = n.value(0)?;
            let r = n.const_ints(1)?;
            let times = usize::try_from(*r.first()?).ok()?;
            if v.len().checked_mul(times)? > MAX_TRACKED_ELEMS {
                return None;
            }
            Some(v.iter().cycle().take(v.len() * times).cloned().collect())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::T;
    use super::super::SymbolicValues;
    use super::*;
    use crate::ir::{Op, TensorData};

    /// Run propagation over ops in order (types from `infer_op`), return the tracked values.
    fn run(t: &mut T, ops: &[Op]) -> SymbolicValues {
        let mut vals = SymbolicValues::new();
        for &op in ops {
            let tys = super::super::infer_op(&t.g, op, 18, &vals).expect("infer");
            let res = propagate(&Node::new(&t.g, op, 18, &vals), &tys);
            let outs = t.g.ops[op].outputs.clone();
            for ((v, ty), r) in outs.iter().zip(tys).zip(res) {
                t.g.values[*v].ty = ty;
                if let Some(r) = r {
                    vals.insert(*v, r);
                }
            }
        }
        vals
    }

    fn txt(v: Option<&[Dim]>) -> String {
        match v {
            None => "-".into(),
            Some(v) => v
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    #[test]
    fn shape_gather_concat_arith() {
        let mut t = T::new();
        let x = t.input(DType::F32, "batch,seq,64");
        let sh = t.op("Shape", &[Some(x)], &[], 1);
        let shv = t.g.ops[sh].outputs[0];
        let i0 = t.scalar(0);
        let g0 = t.op("Gather", &[Some(shv), Some(i0)], &[], 1);
        let g0v = t.g.ops[g0].outputs[0];
        let tail = t.op("Shape", &[Some(x)], &[("start", Attr::Int(-2))], 1);
        let tailv = t.g.ops[tail].outputs[0];
        let cat = t.op(
            "Concat",
            &[Some(tailv), Some(shv)],
            &[("axis", Attr::Int(0))],
            1,
        );
        let c2 = t.scalar(2);
        let mul = t.op("Mul", &[Some(g0v), Some(c2)], &[], 1);
        let mulv = t.g.ops[mul].outputs[0];
        let div = t.op("Div", &[Some(mulv), Some(c2)], &[], 1);
        let sub = t.op("Sub", &[Some(g0v), Some(g0v)], &[], 1);
        let sz = t.op("Size", &[Some(x)], &[], 1);
        let rp = t.op("ReduceProd", &[Some(shv)], &[("keepdims", Attr::Int(0))], 1);
        let st = t.ints(&[1]);
        let en = t.ints(&[i64::MAX]);
        let sl = t.op("Slice", &[Some(shv), Some(st), Some(en)], &[], 1);
        let ops = [sh, g0, tail, cat, mul, div, sub, sz, rp, sl];
        let vals = run(&mut t, &ops);
        let out = |op: Op| txt(vals.get(t.g.ops[op].outputs[0]));
        assert_eq!(out(sh), "batch,seq,64");
        assert_eq!(out(g0), "batch");
        assert_eq!(out(tail), "seq,64");
        assert_eq!(out(cat), "seq,64,batch,seq,64");
        assert_eq!(out(mul), "2*batch");
        assert_eq!(out(div), "batch");
        assert_eq!(out(sub), "0");
        assert_eq!(out(sz), "64*batch*seq");
        assert_eq!(out(rp), "64*batch*seq");
        assert_eq!(out(sl), "seq,64");
    }

    #[test]
    fn equal_where_constant_of_shape_range() {
        let mut t = T::new();
        let x = t.input(DType::F32, "batch,8");
        let sh = t.op("Shape", &[Some(x)], &[], 1);
        let shv = t.g.ops[sh].outputs[0];
        let m1 = t.ints(&[-1, 8]);
        let eq = t.op("Equal", &[Some(shv), Some(m1)], &[], 1);
        let eqv = t.g.ops[eq].outputs[0];
        let ones = t.ints(&[1, 1]);
        let wh = t.op("Where", &[Some(eqv), Some(ones), Some(shv)], &[], 1);
        let two = t.ints(&[2]);
        let fill = TensorData::from_i64(vec![1], &[7]);
        let cos = t.op(
            "ConstantOfShape",
            &[Some(two)],
            &[("value", Attr::Tensor(fill))],
            1,
        );
        let (a, b, c) = (t.scalar(1), t.scalar(8), t.scalar(3));
        let rg = t.op("Range", &[Some(a), Some(b), Some(c)], &[], 1);
        let ci = t.op(
            "Constant",
            &[],
            &[("value_ints", Attr::Ints(vec![4, 5]))],
            1,
        );
        let vals = run(&mut t, &[sh, eq, wh, cos, rg, ci]);
        let out = |op: Op| txt(vals.get(t.g.ops[op].outputs[0]));
        assert_eq!(out(eq), "0,1", "a symbolic size is never -1");
        assert_eq!(out(wh), "batch,1");
        assert_eq!(out(cos), "7,7");
        assert_eq!(out(rg), "1,4,7");
        assert_eq!(out(ci), "4,5");
    }

    #[test]
    fn float_results_are_not_tracked() {
        let mut t = T::new();
        let x = t.input(DType::F32, "batch,8");
        let sh = t.op("Shape", &[Some(x)], &[], 1);
        let shv = t.g.ops[sh].outputs[0];
        let cf = t.op("Cast", &[Some(shv)], &[("to", Attr::Int(1))], 1);
        let vals = run(&mut t, &[sh, cf]);
        assert!(vals.get(t.g.ops[cf].outputs[0]).is_none());
    }
}
