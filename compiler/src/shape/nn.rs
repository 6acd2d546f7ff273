//! Linear algebra and normalization: `MatMul` (numpy `matmul`: 1-D promotion, broadcast batch
//! dims), `MatMulInteger`, `Gemm` (`transA`/`transB`), `Einsum` (equation with `...`),
//! `BatchNormalization` (training outputs), `LayerNormalization` (Mean / InvStdDev),
//! `InstanceNormalization`, `GroupNormalization`.

use super::{node::Node, Rule};
use crate::error::Result;
use crate::ir::{DType, Dim, TensorType};
use std::collections::HashMap;

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    r.insert("MatMul", matmul);
    r.insert("MatMulInteger", matmul);
    r.insert("QLinearMatMul", qlinear_matmul);
    r.insert("Gemm", gemm);
    r.insert("Einsum", einsum);
    r.insert("BatchNormalization", batch_norm);
    r.insert("LayerNormalization", layer_norm);
    r.insert("InstanceNormalization", same0);
    r.insert("GroupNormalization", same0);
}

fn same0(n: &Node) -> Result<Vec<TensorType>> {
    Ok(vec![n.ty(0)?.clone()])
}

/// Check that two contraction dims agree (when both are known).
fn check_k(n: &Node, a: &Dim, b: &Dim) -> Result<()> {
    if let (Dim::Known(x), Dim::Known(y)) = (a, b) {
        if x != y {
            return Err(n.err(format!(
                "inner dimensions differ: {x} (input 0) vs {y} (input 1)"
            )));
        }
    }
    Ok(())
}

/// numpy `matmul` result shape of `a @ b`.
fn matmul_shape(n: &Node, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
    if a.is_empty() || b.is_empty() {
        return Err(n.err("matmul operands must have rank >= 1"));
    }
    let a2: Vec<Dim> = if a.len() == 1 {
        vec![Dim::Known(1), a[0].clone()]
    } else {
        a.to_vec()
    };
    let b2: Vec<Dim> = if b.len() == 1 {
        vec![b[0].clone(), Dim::Known(1)]
    } else {
        b.to_vec()
    };
    let (ra, rb) = (a2.len(), b2.len());
    check_k(n, &a2[ra - 1], &b2[rb - 2])?;
    let mut out = n.broadcast(&a2[..ra - 2], &b2[..rb - 2])?;
    if a.len() != 1 {
        out.push(a2[ra - 2].clone());
    }
    if b.len() != 1 {
        out.push(b2[rb - 1].clone());
    }
    Ok(out)
}

/// `MatMul(A, B)`; `MatMulInteger` gives int32.
fn matmul(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = if n.op_type() == "MatMulInteger" {
        DType::I32
    } else {
        n.dtype(0)?
    };
    let shape = match (n.shape(0)?, n.shape(1)?) {
        (Some(a), Some(b)) => Some(matmul_shape(n, a, b)?),
        _ => None,
    };
    Ok(vec![TensorType { dtype, shape }])
}

/// `QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)`.
fn qlinear_matmul(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = n.dtype(7)?;
    let shape = match (n.shape(0)?, n.shape(3)?) {
        (Some(a), Some(b)) => Some(matmul_shape(n, a, b)?),
        _ => None,
    };
    Ok(vec![TensorType { dtype, shape }])
}

/// `Gemm(A, B, C)`: `alpha*A'*B' + beta*C`, A' = A or Aᵀ (transA), result `[M, N]`.
fn gemm(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = n.dtype(0)?;
    let (Some(a), Some(b)) = (n.shape(0)?, n.shape(1)?) else {
        return Ok(vec![TensorType::unranked(dtype)]);
    };
    if a.len() != 2 || b.len() != 2 {
        return Err(n.err(format!(
            "A and B must be 2-D, got ranks {} and {}",
            a.len(),
            b.len()
        )));
    }
    let ta = n.int_attr("transA", 0)? != 0;
    let tb = n.int_attr("transB", 0)? != 0;
    let (m, ka) = if ta { (&a[1], &a[0]) } else { (&a[0], &a[1]) };
    let (kb, nn) = if tb { (&b[1], &b[0]) } else { (&b[0], &b[1]) };
    check_k(n, ka, kb)?;
    let out = vec![m.clone(), nn.clone()];
    if let Some(c) = n.opt_ty(2).and_then(|t| t.shape.as_ref()) {
        // C must be unidirectionally broadcastable to [M, N].
        let bc = n.broadcast(&out, c)?;
        if bc.len() != 2 {
            return Err(n.err(format!(
                "C of rank {} does not broadcast to [M, N]",
                c.len()
            )));
        }
    }
    Ok(vec![TensorType::new(dtype, out)])
}

/// `BatchNormalization(X, scale, B, mean, var)`: Y has X's type; in training mode (opset 14+,
/// `training_mode=1`) also running_mean / running_var `[C]`. Opset < 14 optional outputs
/// (mean, var, saved_mean, saved_var) are `[C]` too.
fn batch_norm(n: &Node) -> Result<Vec<TensorType>> {
    let x = n.ty(0)?.clone();
    let c = match &x.shape {
        Some(s) if s.len() >= 2 => Some(vec![s[1].clone()]),
        Some(s) => return Err(n.err(format!("input must have rank >= 2, got {}", s.len()))),
        None => None,
    };
    let sdt = n.opt_ty(3).map(|t| t.dtype).unwrap_or(x.dtype);
    let stat = TensorType {
        dtype: sdt,
        shape: c,
    };
    let mut out = vec![x];
    for _ in 1..n.num_outputs().max(1) {
        out.push(stat.clone());
    }
    Ok(out)
}

/// `LayerNormalization(X, Scale, B; axis=-1, stash_type)`: Y like X; Mean and InvStdDev have X's
/// shape with the normalized axes `[axis, rank)` set to 1, dtype from `stash_type` (float).
fn layer_norm(n: &Node) -> Result<Vec<TensorType>> {
    let x = n.ty(0)?.clone();
    let stash = n.int_attr("stash_type", 1)?;
    let sdt = i32::try_from(stash)
        .ok()
        .and_then(DType::from_onnx)
        .ok_or_else(|| n.err(format!("bad stash_type {stash}")))?;
    let stat_shape = match &x.shape {
        Some(s) => {
            let ax = n.axis(n.int_attr("axis", -1)?, s.len())?;
            let mut v = s[..ax].to_vec();
            v.extend(std::iter::repeat_n(Dim::Known(1), s.len() - ax));
            Some(v)
        }
        None => None,
    };
    let stat = TensorType {
        dtype: sdt,
        shape: stat_shape,
    };
    Ok(vec![x, stat.clone(), stat])
}

/// One Einsum operand term: letters, with the position of `...` if any.
struct Term {
    letters: Vec<char>,
    ellipsis: Option<usize>,
}

fn parse_term(n: &Node, s: &str) -> Result<Term> {
    let s = s.trim();
    let mut letters = Vec::new();
    let mut ellipsis = None;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if chars.next() != Some('.') || chars.next() != Some('.') || ellipsis.is_some() {
                    return Err(n.err(format!("bad ellipsis in Einsum term '{s}'")));
                }
                ellipsis = Some(letters.len());
            }
            c if c.is_ascii_alphabetic() => letters.push(c),
            c if c.is_whitespace() => {}
            c => return Err(n.err(format!("bad character '{c}' in Einsum equation"))),
        }
    }
    Ok(Term { letters, ellipsis })
}

/// `Einsum(equation)`: letters bind dims (which must agree), `...` binds the broadcast of the
/// ellipsis dims; implicit output = ellipsis dims then letters seen once, alphabetically.
fn einsum(n: &Node) -> Result<Vec<TensorType>> {
    let dtype = n.dtype(0)?;
    let eq = n
        .data
        .attr("equation")
        .and_then(|a| a.as_str())
        .ok_or_else(|| n.err("attribute 'equation' is required"))?;
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq, None),
    };
    let terms = lhs
        .split(',')
        .map(|t| parse_term(n, t))
        .collect::<Result<Vec<_>>>()?;
    if terms.len() != n.num_inputs() {
        return Err(n.err(format!(
            "equation '{eq}' has {} operands but the node has {} inputs",
            terms.len(),
            n.num_inputs()
        )));
    }
    let mut bind: Vec<(char, Dim)> = Vec::new();
    let mut count: HashMap<char, usize> = HashMap::new();
    let mut ell: Vec<Dim> = Vec::new();
    for (i, t) in terms.iter().enumerate() {
        let Some(s) = n.shape(i)? else {
            return Ok(vec![TensorType::unranked(dtype)]);
        };
        let n_ell = match t.ellipsis {
            Some(_) => s.len().checked_sub(t.letters.len()).ok_or_else(|| {
                n.err(format!(
                    "operand {i} has rank {} < its term's letters",
                    s.len()
                ))
            })?,
            None if s.len() == t.letters.len() => 0,
            None => {
                return Err(n.err(format!(
                    "operand {i} has rank {} but its term has {} letters",
                    s.len(),
                    t.letters.len()
                )))
            }
        };
        let e = t.ellipsis.unwrap_or(t.letters.len());
        for (j, &c) in t.letters.iter().enumerate() {
            let d = if j < e { &s[j] } else { &s[j + n_ell] };
            *count.entry(c).or_insert(0) += 1;
            match bind.iter_mut().find(|(b, _)| *b == c) {
                Some((_, old)) => {
                    let nd = n.broadcast_dim(old, d, j).ok_or_else(|| {
                        n.err(format!("Einsum label '{c}' is bound to both {old} and {d}"))
                    })?;
                    *old = nd;
                }
                None => bind.push((c, d.clone())),
            }
        }
        if t.ellipsis.is_some() {
            ell = n.broadcast(&ell, &s[e..e + n_ell])?;
        }
    }
    let get = |c: char| -> Result<Dim> {
        bind.iter()
            .find(|(b, _)| *b == c)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| n.err(format!("output label '{c}' does not appear in the inputs")))
    };
    let mut out = Vec::new();
    match rhs {
        Some(r) => {
            let t = parse_term(n, r)?;
            let e = t.ellipsis.unwrap_or(t.letters.len());
            for (j, &c) in t.letters.iter().enumerate() {
                if j == e {
                    out.extend(ell.iter().cloned());
                }
                out.push(get(c)?);
            }
            if e == t.letters.len() && t.ellipsis.is_some() {
                out.extend(ell.iter().cloned());
            }
        }
        None => {
            out.extend(ell.iter().cloned());
            let mut once: Vec<char> = count
                .iter()
                .filter(|(_, k)| **k == 1)
                .map(|(c, _)| *c)
                .collect();
            once.sort_unstable();
            for c in once {
                out.push(get(c)?);
            }
        }
    }
    Ok(vec![TensorType::new(dtype, out)])
}

#[cfg(test)]
mod tests {
    use super::super::testutil::T;
    use super::*;
    use crate::ir::Attr;

    fn einsum(eq: &str, shapes: &[&str]) -> String {
        let mut t = T::new();
        let ins: Vec<_> = shapes
            .iter()
            .map(|s| Some(t.input(DType::F32, s)))
            .collect();
        let op = t.op("Einsum", &ins, &[("equation", Attr::String(eq.into()))], 1);
        t.shapes(op, 18).remove(0)
    }

    #[test]
    fn einsum_equations() {
        assert_eq!(
            einsum("bhqd,bhkd->bhqk", &["b,4,32,8", "b,4,32,8"]),
            "b,4,32,32"
        );
        assert_eq!(einsum("ij,jk", &["2,3", "3,5"]), "2,5");
        assert_eq!(
            einsum("ji", &["2,3"]),
            "3,2",
            "implicit output is alphabetical"
        );
        assert_eq!(einsum("...i,...i->...", &["b,1,4", "5,4"]), "b,5");
        assert_eq!(einsum("i...->...", &["3,b,2"]), "b,2");
        assert_eq!(einsum("i,i->", &["3", "3"]), "");
        assert!(einsum("ij,jk->ik", &["2,3", "4,5"]).contains("bound to both"));
        assert!(einsum("ij->ik", &["2,3"]).contains("does not appear"));
        assert!(einsum("i.j->i", &["2,3"]).contains("ellipsis"));
        assert!(einsum("i1->i", &["2,3"]).contains("bad character"));
        assert!(einsum("ij,jk->ik", &["2,3"]).contains("2 operands"));
    }

    #[test]
    fn gemm_and_matmul_errors() {
        let mut t = T::new();
        let a = t.input(DType::F32, "4,3");
        let b = t.input(DType::F32, "4,5");
        let op = t.op("Gemm", &[Some(a), Some(b)], &[("transA", Attr::Int(1))], 1);
        assert_eq!(t.shapes(op, 18), ["3,5"]);
        let op = t.op("Gemm", &[Some(a), Some(b)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("inner dimensions differ: 3"));
        let c = t.input(DType::F32, "2,5");
        let op = t.op(
            "Gemm",
            &[Some(a), Some(b), Some(c)],
            &[("transA", Attr::Int(1))],
            1,
        );
        assert!(t.shapes(op, 18)[0].contains("do not broadcast"));
        let s = t.input(DType::F32, "");
        let op = t.op("MatMul", &[Some(s), Some(a)], &[], 1);
        assert!(t.shapes(op, 18)[0].contains("rank >= 1"));
        let i8a = t.input(DType::U8, "b,4,3");
        let i8b = t.input(DType::U8, "3,2");
        let op = t.op("MatMulInteger", &[Some(i8a), Some(i8b)], &[], 1);
        let ty = t.infer(op, 18).unwrap();
        assert_eq!(ty[0].dtype, DType::I32);
        assert_eq!(super::super::testutil::show(&ty[0]), "b,4,2");
    }

    #[test]
    fn norms() {
        let mut t = T::new();
        let x = t.input(DType::F16, "b,8,4");
        let scale = t.input(DType::F16, "4");
        let op = t.op("LayerNormalization", &[Some(x), Some(scale)], &[], 3);
        let ty = t.infer(op, 18).unwrap();
        assert_eq!(ty[0].dtype, DType::F16);
        assert_eq!(ty[1].dtype, DType::F32);
        assert_eq!(super::super::testutil::show(&ty[1]), "b,8,1");
        let op = t.op(
            "LayerNormalization",
            &[Some(x), Some(scale)],
            &[("axis", Attr::Int(3))],
            1,
        );
        assert!(t.shapes(op, 18)[0].contains("out of range"));
        let c = t.input(DType::F16, "8");
        let op = t.op(
            "BatchNormalization",
            &[Some(x), Some(c), Some(c), Some(c), Some(c)],
            &[],
            1,
        );
        assert_eq!(t.shapes(op, 15), ["b,8,4"]);
        let op = t.op("GroupNormalization", &[Some(x), Some(c), Some(c)], &[], 1);
        assert_eq!(t.shapes(op, 21), ["b,8,4"]);
        // Fewer operands than the schema's minimum: refused before the rule runs.
        let op = t.op("BatchNormalization", &[Some(x)], &[], 1);
        assert!(
            t.shapes(op, 15)[0].contains("has 1 operand but BatchNormalization (opset 15) takes 5")
        );
    }
}
