//! `split-layer`: split one layer by **output channels** into two nodes plus a `Concat` — the IR
//! rewrite behind BaPipe's intra-layer partition (Zhao et al., "BaPipe", §III-B: the boundary
//! layer between two unequal neighbouring stages is divided so that part of it runs on the faster
//! neighbour; see `planners/bapipe.rs`).
//!
//! - **Requires**: a module whose node `op` is live and is one of
//!   - `Gemm` with a 2-D float initializer `B` (`transB` respected: `B` is `[K, N]`, or `[N, K]`
//!     when `transB = 1`) and an optional bias `C` that is either an initializer whose last dim
//!     is `N` (split with the weight) or broadcast along the channels (last dim 1 or a scalar:
//!     both halves read it); output channels are axis 1;
//!   - `MatMul` whose right operand is a 2-D float initializer `[K, N]`; output channels are the
//!     last axis;
//!   - `Conv` with `group = 1`, a float initializer weight `[M, C, k...]` and an optional
//!     initializer bias `[M]`; output channels are axis 1.
//!
//!   Every split weight or bias must be read by this node only (splitting a shared parameter
//!   would untie it), and the output channel count must be at least 2.
//! - **Guarantees**: the node is replaced, at its position in the program order, by
//!   `NAME.split0` (channels `[0, c0)`), `NAME.split1` (channels `[c0, c0 + c1)`) and
//!   `NAME.concat` (a `Concat` on the channel axis) whose result **is the node's original output
//!   value** (same name, same type), so every consumer and graph output is unchanged. Each split
//!   parameter `P` is removed and replaced by the new initializers `P.split0` and `P.split1`
//!   (the same bytes, cut along the channel axis of the weight: axis 1 of a `Gemm`/`MatMul`
//!   weight `[K, N]`, axis 0 of a `transB` weight or a `Conv` weight, the last axis of a bias);
//!   a broadcast bias is kept under its name and read by both halves. The halves' results are
//!   `OUT.split0` / `OUT.split1`, typed like `OUT` with the channel dim set to `c0` / `c1`. The
//!   function is mathematically the same (the two halves compute disjoint output channels);
//!   the tests check it numerically with the reference executor.
//! - **Fails** (an error naming the node, never a panic) on an unsupported op, a weight that is
//!   not a float initializer of the expected rank, a shared weight, `group != 1`, `c0` or `c1`
//!   of zero or a sum other than the channel count, or names `P.split0` / `NAME.split0` already in
//!   use.
//! - **Invalidates**: op indices into `graph.order` after the node shift by 2 (the two extra
//!   nodes); `Op` and `Value` ids of everything else stay valid (the old node stays dead in the
//!   arena).

use pipec_compiler::ir::{Attr, DType, Dim, Module, Op, OpData, TensorData, TensorType, Value};
use pipec_compiler::{Error, Result};

/// One parameter that was cut in two (also `plan.json`'s `intra_splits[].params`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SplitParam {
    /// The original initializer name (gone from the module).
    pub name: String,
    /// The two halves' initializer names (`name.split0`, `name.split1`).
    pub parts: [String; 2],
    /// The axis of the original tensor the halves were cut along (concatenate them back on it).
    pub axis: usize,
}

/// What [`split_output_channels`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerSplit {
    /// The original node name.
    pub node: String,
    pub op_type: String,
    /// The three new ops: first half, second half, `Concat`.
    pub ops: [Op; 3],
    /// Their names (`NAME.split0`, `NAME.split1`, `NAME.concat`).
    pub names: [String; 3],
    /// Output channels of the two halves.
    pub channels: [u64; 2],
    pub params: Vec<SplitParam>,
}

/// Output channel count of the node `op`, if it is a layer this pass can split (without checking
/// everything [`split_output_channels`] checks).
pub fn output_channels(m: &Module, op: Op) -> Option<u64> {
    let g = &m.graph;
    let d = &g.ops[op];
    if !d.domain.is_empty() {
        return None;
    }
    let w = g.constant(d.input(1)?)?;
    let n = match (d.op_type.as_str(), w.dims.as_slice()) {
        ("Gemm", [k, n]) => {
            if d.int_attr("transB").unwrap_or(0) != 0 {
                *k
            } else {
                *n
            }
        }
        ("MatMul", [_, n]) => *n,
        ("Conv", [mm, ..]) if w.dims.len() >= 3 => *mm,
        _ => return None,
    };
    u64::try_from(n).ok()
}

/// Split the node `op` of `m` by output channels into halves of `channels[0]` and `channels[1]`
/// (see the module doc).
pub fn split_output_channels(m: &mut Module, op: Op, channels: [u64; 2]) -> Result<LayerSplit> {
    let g = &m.graph;
    let d = g.ops[op].clone();
    let fail = |msg: String| Error::node(&d.name, &d.op_type, format!("split-layer: {msg}"));
    let pos = g
        .order
        .iter()
        .position(|o| *o == op)
        .ok_or_else(|| fail("the node is not live".into()))?;
    if !d.domain.is_empty() || !matches!(d.op_type.as_str(), "Gemm" | "MatMul" | "Conv") {
        return Err(fail(
            "only Gemm, MatMul and Conv can be split by output channels".into(),
        ));
    }
    if d.outputs.len() != 1 {
        return Err(fail("expected one result".into()));
    }
    let out = d.outputs[0];
    // The weight: a float initializer.
    let wv = d
        .input(1)
        .ok_or_else(|| fail("missing weight operand".into()))?;
    let wdata = g.initializers.get(&wv).ok_or_else(|| {
        fail(format!(
            "the weight '{}' is not an initializer (only constant weights can be split)",
            g.name(wv)
        ))
    })?;
    if !wdata.dtype.is_float() || wdata.raw().is_none() {
        return Err(fail(format!(
            "the weight '{}' is not a float tensor with data",
            g.name(wv)
        )));
    }
    let rank = wdata.dims.len();
    // (weight axis, channels, output channel axis as a possibly negative ONNX axis)
    let (w_axis, c, out_axis): (usize, i64, i64) = match d.op_type.as_str() {
        "Gemm" if rank == 2 => {
            if d.int_attr("transB").unwrap_or(0) != 0 {
                (0, wdata.dims[0], 1)
            } else {
                (1, wdata.dims[1], 1)
            }
        }
        "MatMul" if rank == 2 => (1, wdata.dims[1], -1),
        "Conv" if rank >= 3 => {
            if d.int_attr("group").unwrap_or(1) != 1 {
                return Err(fail(
                    "grouped convolutions (group != 1) are not supported".into(),
                ));
            }
            (0, wdata.dims[0], 1)
        }
        _ => {
            return Err(fail(format!(
                "weight '{}' has shape {:?}, not a {} weight this pass can split",
                g.name(wv),
                wdata.dims,
                if d.op_type == "Conv" {
                    "[M, C, k...] Conv"
                } else {
                    "2-D"
                }
            )))
        }
    };
    let c = c as u64;
    if c < 2 {
        return Err(fail(format!("{c} output channel(s): nothing to split")));
    }
    if channels[0] == 0 || channels[1] == 0 || channels[0] + channels[1] != c {
        return Err(fail(format!(
            "halves of {} and {} channels do not split {c} channels (each needs at least 1)",
            channels[0], channels[1]
        )));
    }
    // The bias: split along its last axis when it spans the channels, else shared.
    let bias = match d.op_type.as_str() {
        "Gemm" | "Conv" => d.input(2),
        _ => None,
    };
    let mut split_bias = false;
    if let Some(bv) = bias {
        let bt = g.ty(bv);
        let last = bt.shape.as_ref().and_then(|s| s.last().cloned());
        match (g.initializers.get(&bv), last) {
            (Some(t), Some(Dim::Known(n))) if n as u64 == c && t.raw().is_some() => {
                split_bias = true
            }
            (Some(_), None | Some(Dim::Known(1))) if d.op_type == "Gemm" => {}
            _ => {
                return Err(fail(format!(
                    "bias '{}' of type {} is neither an initializer over the {c} channels nor broadcast over them",
                    g.name(bv),
                    pipec_compiler::ir::fmt_type(bt)
                )))
            }
        }
    }
    // Split parameters must not be shared.
    let to_split: Vec<(Value, usize)> = std::iter::once((wv, w_axis))
        .chain(
            bias.filter(|_| split_bias)
                .map(|b| (b, g.ty(b).rank().unwrap_or(1).saturating_sub(1))),
        )
        .collect();
    let uses = g.uses();
    for &(v, _) in &to_split {
        if uses[v].iter().any(|(o, _)| *o != op) || g.outputs.contains(&v) {
            return Err(fail(format!(
                "parameter '{}' is also read elsewhere; splitting it would untie it",
                g.name(v)
            )));
        }
    }
    let out_rank = g.ty(out).rank();
    let axis_abs = match (out_axis, out_rank) {
        (a, _) if a >= 0 => a as usize,
        (_, Some(r)) if r >= 1 => r - 1,
        _ => {
            return Err(fail(format!(
                "the result '{}' has no known rank",
                g.name(out)
            )))
        }
    };
    // Names.
    let names = [
        format!("{}.split0", d.name),
        format!("{}.split1", d.name),
        format!("{}.concat", d.name),
    ];
    let taken: std::collections::HashSet<&str> = g
        .values
        .values()
        .map(|v| v.name.as_str())
        .chain(g.ops.values().map(|o| o.name.as_str()))
        .collect();
    let out_name = g.name(out).to_string();
    let half_out = [format!("{out_name}.split0"), format!("{out_name}.split1")];
    let mut param_names = Vec::new();
    for &(v, axis) in &to_split {
        let n = g.name(v).to_string();
        param_names.push(SplitParam {
            parts: [format!("{n}.split0"), format!("{n}.split1")],
            name: n,
            axis,
        });
    }
    for n in names
        .iter()
        .chain(&half_out)
        .chain(param_names.iter().flat_map(|p| p.parts.iter()))
    {
        if taken.contains(n.as_str()) {
            return Err(fail(format!("the name '{n}' is already in use")));
        }
    }
    // Cut the parameters.
    let mut halves: Vec<[TensorData; 2]> = Vec::new();
    for &(v, axis) in &to_split {
        let t = &g.initializers[&v];
        halves.push(cut(t, axis, channels[0]).map_err(|e| fail(format!("{}: {e}", g.name(v))))?);
    }
    // Rewrite.
    let g = &mut m.graph;
    let mut new_params: Vec<[Value; 2]> = Vec::new();
    for ((v, _), (p, hs)) in to_split.iter().zip(param_names.iter().zip(halves)) {
        g.initializers.shift_remove(v);
        let [h0, h1] = hs;
        new_params.push([
            g.add_initializer(p.parts[0].clone(), h0),
            g.add_initializer(p.parts[1].clone(), h1),
        ]);
    }
    let out_ty = g.ty(out).clone();
    let mut new_ops = Vec::with_capacity(3);
    let mut half_vals = Vec::with_capacity(2);
    for k in 0..2 {
        let mut od = d.clone();
        od.name = names[k].clone();
        od.outputs.clear();
        for (i, (v, _)) in to_split.iter().enumerate() {
            for x in od.inputs.iter_mut().flatten() {
                if x == v {
                    *x = new_params[i][k];
                }
            }
        }
        let ty = with_dim(&out_ty, axis_abs, channels[k] as i64);
        let (o, vals) = g.add_op(od, vec![(half_out[k].clone(), ty)]);
        new_ops.push(o);
        half_vals.push(vals[0]);
    }
    let mut attrs = std::collections::BTreeMap::new();
    attrs.insert("axis".to_string(), Attr::Int(out_axis));
    let concat = g.ops.push(OpData {
        name: names[2].clone(),
        op_type: "Concat".into(),
        domain: String::new(),
        inputs: half_vals.iter().map(|v| Some(*v)).collect(),
        outputs: vec![out],
        attrs,
    });
    g.values[out].def = pipec_compiler::ir::ValueDef::Result(concat, 0);
    new_ops.push(concat);
    // add_op appended the halves at the end; put all three where the node was.
    g.order.retain(|o| !new_ops.contains(o));
    g.order.splice(pos..=pos, new_ops.iter().copied());
    Ok(LayerSplit {
        node: d.name.clone(),
        op_type: d.op_type.clone(),
        ops: [new_ops[0], new_ops[1], new_ops[2]],
        names,
        channels,
        params: param_names,
    })
}

/// `ty` with dim `axis` set to `n` (unchanged when the shape is unknown).
fn with_dim(ty: &TensorType, axis: usize, n: i64) -> TensorType {
    let mut t = ty.clone();
    if let Some(d) = t.shape.as_mut().and_then(|s| s.get_mut(axis)) {
        *d = Dim::Known(n);
    }
    t
}

/// Cut `t` along `axis` into `[0, c0)` and `[c0, dims[axis])`.
fn cut(t: &TensorData, axis: usize, c0: u64) -> std::result::Result<[TensorData; 2], String> {
    let raw = t.raw().ok_or("no data")?;
    let esize = (t.dtype.bits() / 8) as usize;
    if t.dtype == DType::Bool || esize == 0 || axis >= t.dims.len() {
        return Err("cannot cut this tensor".into());
    }
    let dims: Vec<usize> = t.dims.iter().map(|d| *d as usize).collect();
    let outer: usize = dims[..axis].iter().product();
    let len = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product::<usize>() * esize;
    if raw.len() != outer * len * inner {
        return Err(format!("{} bytes for dims {:?}", raw.len(), t.dims));
    }
    let c0 = c0 as usize;
    let mut parts = [Vec::new(), Vec::new()];
    for o in 0..outer {
        let base = o * len * inner;
        parts[0].extend_from_slice(&raw[base..base + c0 * inner]);
        parts[1].extend_from_slice(&raw[base + c0 * inner..base + len * inner]);
    }
    let mut out = Vec::with_capacity(2);
    for (k, bytes) in parts.into_iter().enumerate() {
        let mut d = t.dims.clone();
        d[axis] = if k == 0 { c0 } else { len - c0 } as i64;
        out.push(TensorData::from_raw(t.dtype, d, bytes.into()).map_err(|e| e.to_string())?);
    }
    let [a, b]: [TensorData; 2] = out.try_into().map_err(|_| "internal: two halves")?;
    Ok([a, b])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(trans_b: i64, n: i64, shared: bool) -> (Module, Op) {
        let mut m = Module::default();
        let g = &mut m.graph;
        let x = g.add_input(
            "x",
            TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(3)]),
        );
        let wdims = if trans_b != 0 { vec![n, 3] } else { vec![3, n] };
        let vals: Vec<f32> = (0..3 * n).map(|i| i as f32).collect();
        let w = g.add_initializer("W", TensorData::from_f32(wdims, &vals));
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("transB".to_string(), Attr::Int(trans_b));
        let (op, outs) = g.add_op(
            OpData {
                name: "fc".into(),
                op_type: "Gemm".into(),
                inputs: vec![Some(x), Some(w)],
                attrs,
                ..Default::default()
            },
            vec![(
                "y".into(),
                TensorType::new(DType::F32, vec![Dim::sym("batch"), Dim::Known(n)]),
            )],
        );
        g.outputs.push(outs[0]);
        if shared {
            let (_, o2) = g.add_op(
                OpData {
                    name: "again".into(),
                    op_type: "MatMul".into(),
                    inputs: vec![Some(x), Some(w)],
                    ..Default::default()
                },
                vec![("z".into(), TensorType::unranked(DType::F32))],
            );
            g.outputs.push(o2[0]);
        }
        (m, op)
    }

    #[test]
    fn cut_follows_the_axis() {
        let t = TensorData::from_f32(vec![2, 3], &[0., 1., 2., 3., 4., 5.]);
        let [a, b] = cut(&t, 1, 1).unwrap();
        assert_eq!(a.dims, vec![2, 1]);
        assert_eq!(a.to_f64_vec().unwrap(), vec![0., 3.]);
        assert_eq!(b.to_f64_vec().unwrap(), vec![1., 2., 4., 5.]);
        let [a, b] = cut(&t, 0, 1).unwrap();
        assert_eq!(a.to_f64_vec().unwrap(), vec![0., 1., 2.]);
        assert_eq!(b.dims, vec![1, 3]);
    }

    #[test]
    fn names_types_and_order() {
        let (mut m, op) = gemm(1, 4, false);
        let s = split_output_channels(&mut m, op, [3, 1]).unwrap();
        let g = &m.graph;
        let names: Vec<&str> = g.order.iter().map(|o| g.ops[*o].name.as_str()).collect();
        assert_eq!(names, ["fc.split0", "fc.split1", "fc.concat"]);
        assert_eq!(
            s.params[0].parts,
            ["W.split0".to_string(), "W.split1".into()]
        );
        assert_eq!(s.params[0].axis, 0);
        let inits: Vec<&str> = g.initializers.keys().map(|v| g.name(*v)).collect();
        assert_eq!(inits, ["W.split0", "W.split1"]);
        assert_eq!(g.name(g.outputs[0]), "y");
        assert_eq!(g.producer(g.outputs[0]), Some(s.ops[2]));
        pipec_compiler::verify::verify(&m).unwrap();
    }

    #[test]
    fn unsupported_shapes_are_errors_naming_the_node() {
        let (mut m, op) = gemm(0, 4, true);
        let e = split_output_channels(&mut m, op, [2, 2]).unwrap_err();
        assert!(
            e.to_string().contains("fc") && e.to_string().contains("also read"),
            "{e}"
        );
        let (mut m, op) = gemm(0, 1, false);
        let e = split_output_channels(&mut m, op, [1, 0]).unwrap_err();
        assert!(e.to_string().contains("nothing to split"), "{e}");
        let (mut m, op) = gemm(0, 4, false);
        let e = split_output_channels(&mut m, op, [4, 0]).unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
        // Nothing changed after a failure.
        assert_eq!(m.graph.order, vec![op]);
    }
}
