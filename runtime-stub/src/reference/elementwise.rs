//! Elementwise ops (with numpy broadcasting), casts, `Where`, reductions.

use super::{norm_axis, Ctx, KResult};
use crate::tensor::Tensor;
use ndarray::{ArrayD, Axis, IxDyn, Zip};
use pipec_compiler::ir::DType;

/// The float element types the float kernels are generic over (f32, f64).
pub(crate) trait Fl:
    num_traits::Float
    + num_traits::FromPrimitive
    + ndarray::LinalgScalar
    + ndarray::ScalarOperand
    + std::ops::AddAssign
    + std::ops::MulAssign
    + std::fmt::Debug
    + Default
    + Send
    + Sync
    + 'static
{
    /// Long dot products of this type accumulate in float64 (the convolutions' GEMMs).
    const WIDE_ACCUMULATION: bool;
    fn erf(self) -> Self;
    fn c(v: f64) -> Self;
    fn to64(self) -> f64;
}
impl Fl for f32 {
    const WIDE_ACCUMULATION: bool = true;
    fn erf(self) -> Self {
        libm::erff(self)
    }
    fn c(v: f64) -> Self {
        v as f32
    }
    fn to64(self) -> f64 {
        f64::from(self)
    }
}
impl Fl for f64 {
    const WIDE_ACCUMULATION: bool = false;
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn c(v: f64) -> Self {
        v
    }
    fn to64(self) -> f64 {
        self
    }
}

/// Numeric element types (floats and integers) for arithmetic, reductions and scatters.
pub(crate) trait Num:
    Copy
    + Default
    + PartialOrd
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Sub<Output = Self>
    + Send
    + Sync
    + 'static
{
    fn zero() -> Self;
    fn one() -> Self;
}
macro_rules! impl_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn zero() -> Self { 0 as $t }
            fn one() -> Self { 1 as $t }
        }
    )*};
}
impl_num!(f32, f64, i64, i32);

/// Map a float tensor through a generic expression, keeping its float type.
macro_rules! float_map {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::F32($a) => Tensor::F32($body),
            Tensor::F64($a) => Tensor::F64($body),
            other => return Err(format!("expects a float tensor, got {}", other.dtype())),
        }
    };
}

/// Map a numeric tensor (f32, f64, i64, i32) through a generic expression.
macro_rules! num_map {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            Tensor::F32($a) => Tensor::F32($body),
            Tensor::F64($a) => Tensor::F64($body),
            Tensor::I64($a) => Tensor::I64($body),
            Tensor::I32($a) => Tensor::I32($body),
            other => return Err(format!("expects a numeric tensor, got {}", other.dtype())),
        }
    };
}
pub(crate) use num_map;

/// Broadcast shape of two shapes (numpy rules).
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> KResult<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(format!("shapes {a:?} and {b:?} do not broadcast"));
        };
    }
    Ok(out)
}

/// Elementwise binary map with broadcasting.
pub(crate) fn zip2<A: Clone, B: Clone, C: Clone>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    f: impl Fn(A, B) -> C,
) -> KResult<ArrayD<C>> {
    let s = broadcast_shape(a.shape(), b.shape())?;
    let av = a
        .broadcast(IxDyn(&s))
        .ok_or_else(|| format!("cannot broadcast {:?} to {s:?}", a.shape()))?;
    let bv = b
        .broadcast(IxDyn(&s))
        .ok_or_else(|| format!("cannot broadcast {:?} to {s:?}", b.shape()))?;
    let out: ArrayD<C> = Zip::from(&av)
        .and(&bv)
        .map_collect(|x, y| f(x.clone(), y.clone()));
    Ok(if out.is_standard_layout() {
        out
    } else {
        out.as_standard_layout().into_owned()
    })
}

fn same_dtype(a: &Tensor, b: &Tensor) -> KResult<()> {
    if a.dtype() != b.dtype() {
        return Err(format!(
            "operand dtypes differ: {} and {}",
            a.dtype(),
            b.dtype()
        ));
    }
    Ok(())
}

/// Binary numeric op over same-typed operands; `$f` is replicated per element type.
macro_rules! bin_num {
    ($a:expr, $b:expr, |$x:ident, $y:ident| $f:expr) => {{
        same_dtype($a, $b)?;
        match ($a, $b) {
            (Tensor::F32(a), Tensor::F32(b)) => Tensor::F32(zip2(a, b, |$x: f32, $y: f32| $f)?),
            (Tensor::F64(a), Tensor::F64(b)) => Tensor::F64(zip2(a, b, |$x: f64, $y: f64| $f)?),
            (Tensor::I64(a), Tensor::I64(b)) => Tensor::I64(zip2(a, b, |$x: i64, $y: i64| $f)?),
            (Tensor::I32(a), Tensor::I32(b)) => Tensor::I32(zip2(a, b, |$x: i32, $y: i32| $f)?),
            (a, _) => return Err(format!("expects numeric operands, got {}", a.dtype())),
        }
    }};
}

/// Comparison over same-typed operands, giving bool.
macro_rules! cmp {
    ($a:expr, $b:expr, |$x:ident, $y:ident| $f:expr) => {{
        same_dtype($a, $b)?;
        Tensor::Bool(match ($a, $b) {
            (Tensor::F32(a), Tensor::F32(b)) => zip2(a, b, |$x: f32, $y: f32| $f)?,
            (Tensor::F64(a), Tensor::F64(b)) => zip2(a, b, |$x: f64, $y: f64| $f)?,
            (Tensor::I64(a), Tensor::I64(b)) => zip2(a, b, |$x: i64, $y: i64| $f)?,
            (Tensor::I32(a), Tensor::I32(b)) => zip2(a, b, |$x: i32, $y: i32| $f)?,
            (Tensor::U8(a), Tensor::U8(b)) => zip2(a, b, |$x: u8, $y: u8| $f)?,
            (Tensor::Bool(a), Tensor::Bool(b)) => zip2(a, b, |$x: bool, $y: bool| $f)?,
            _ => unreachable!("dtypes checked equal above"),
        })
    }};
}

fn bool_op(a: &Tensor, b: &Tensor, f: impl Fn(bool, bool) -> bool) -> KResult<Tensor> {
    match (a, b) {
        (Tensor::Bool(a), Tensor::Bool(b)) => Ok(Tensor::Bool(zip2(a, b, f)?)),
        _ => Err(format!(
            "expects bool operands, got {} and {}",
            a.dtype(),
            b.dtype()
        )),
    }
}

/// Unary float op; `$f` replicated for f32 and f64.
macro_rules! un_float {
    ($t:expr, |$x:ident| $f:expr) => {
        match $t {
            Tensor::F32(a) => Tensor::F32(a.mapv(|$x: f32| $f)),
            Tensor::F64(a) => Tensor::F64(a.mapv(|$x: f64| $f)),
            other => return Err(format!("expects a float tensor, got {}", other.dtype())),
        }
    };
}

/// Unary numeric op (floats and signed ints).
macro_rules! un_num {
    ($t:expr, |$x:ident, $z:ident| $f:expr) => {
        match $t {
            Tensor::F32(a) => Tensor::F32(a.mapv(|$x: f32| {
                let $z = 0.0f32;
                $f
            })),
            Tensor::F64(a) => Tensor::F64(a.mapv(|$x: f64| {
                let $z = 0.0f64;
                $f
            })),
            Tensor::I64(a) => Tensor::I64(a.mapv(|$x: i64| {
                let $z = 0i64;
                $f
            })),
            Tensor::I32(a) => Tensor::I32(a.mapv(|$x: i32| {
                let $z = 0i32;
                $f
            })),
            other => return Err(format!("expects a numeric tensor, got {}", other.dtype())),
        }
    };
}

fn pow(a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    Ok(match a {
        Tensor::F32(x) => {
            let e = b.cast(DType::F32).map_err(|e| e.to_string())?;
            let Tensor::F32(e) = e else { unreachable!() };
            Tensor::F32(zip2(x, &e, |p: f32, q: f32| {
                if q == 2.0 {
                    p * p
                } else if q == 3.0 {
                    p * p * p
                } else {
                    p.powf(q)
                }
            })?)
        }
        Tensor::F64(x) => {
            let e = b.cast(DType::F64).map_err(|e| e.to_string())?;
            let Tensor::F64(e) = e else { unreachable!() };
            Tensor::F64(zip2(x, &e, |p: f64, q: f64| p.powf(q))?)
        }
        Tensor::I64(x) => {
            let e = b.cast(DType::I64).map_err(|e| e.to_string())?;
            let Tensor::I64(e) = e else { unreachable!() };
            Tensor::I64(zip2(x, &e, |p: i64, q: i64| {
                p.wrapping_pow(q.clamp(0, u32::MAX as i64) as u32)
            })?)
        }
        other => return Err(format!("Pow of {} is not supported", other.dtype())),
    })
}

/// Fold variadic operands (Max, Min, Sum, Mean) with a binary op.
fn variadic(c: &Ctx, f: impl Fn(&Tensor, &Tensor) -> KResult<Tensor>) -> KResult<Tensor> {
    let mut acc = c.input(0)?.clone();
    for i in 1..c.inputs.len() {
        if let Some(t) = c.opt(i) {
            acc = f(&acc, t)?;
        }
    }
    Ok(acc)
}

fn where_(cond: &Tensor, x: &Tensor, y: &Tensor) -> KResult<Tensor> {
    let Tensor::Bool(cnd) = cond else {
        return Err(format!("condition must be bool, got {}", cond.dtype()));
    };
    same_dtype(x, y)?;
    let s = broadcast_shape(cnd.shape(), &broadcast_shape(x.shape(), y.shape())?)?;
    fn sel<T: Clone>(
        c: &ArrayD<bool>,
        x: &ArrayD<T>,
        y: &ArrayD<T>,
        s: &[usize],
    ) -> KResult<ArrayD<T>> {
        let e = || "cannot broadcast".to_string();
        let cv = c.broadcast(IxDyn(s)).ok_or_else(e)?;
        let xv = x.broadcast(IxDyn(s)).ok_or_else(e)?;
        let yv = y.broadcast(IxDyn(s)).ok_or_else(e)?;
        let o =
            Zip::from(&cv)
                .and(&xv)
                .and(&yv)
                .map_collect(|c, a, b| if *c { a.clone() } else { b.clone() });
        Ok(o.as_standard_layout().into_owned())
    }
    Ok(match (x, y) {
        (Tensor::F32(a), Tensor::F32(b)) => Tensor::F32(sel(cnd, a, b, &s)?),
        (Tensor::F64(a), Tensor::F64(b)) => Tensor::F64(sel(cnd, a, b, &s)?),
        (Tensor::I64(a), Tensor::I64(b)) => Tensor::I64(sel(cnd, a, b, &s)?),
        (Tensor::I32(a), Tensor::I32(b)) => Tensor::I32(sel(cnd, a, b, &s)?),
        (Tensor::U8(a), Tensor::U8(b)) => Tensor::U8(sel(cnd, a, b, &s)?),
        (Tensor::Bool(a), Tensor::Bool(b)) => Tensor::Bool(sel(cnd, a, b, &s)?),
        _ => unreachable!("dtypes checked equal above"),
    })
}

fn clip(c: &Ctx) -> KResult<Tensor> {
    let x = c.input(0)?;
    // Opset >= 11: min/max are optional inputs; before: attributes.
    let lo = c
        .opt(1)
        .map(|t| t.to_f64().iter().next().copied().unwrap_or(f64::MIN));
    let hi = c
        .opt(2)
        .map(|t| t.to_f64().iter().next().copied().unwrap_or(f64::MAX));
    let lo = lo
        .or_else(|| c.op.float_attr("min").map(f64::from))
        .unwrap_or(f64::NEG_INFINITY);
    let hi = hi
        .or_else(|| c.op.float_attr("max").map(f64::from))
        .unwrap_or(f64::INFINITY);
    Ok(match x {
        Tensor::F32(a) => Tensor::F32(a.mapv(|v| v.max(lo as f32).min(hi as f32))),
        Tensor::F64(a) => Tensor::F64(a.mapv(|v| v.max(lo).min(hi))),
        Tensor::I64(a) => Tensor::I64(a.mapv(|v| (v as f64).max(lo).min(hi) as i64)),
        Tensor::I32(a) => Tensor::I32(a.mapv(|v| (v as f64).max(lo).min(hi) as i32)),
        other => return Err(format!("Clip of {} is not supported", other.dtype())),
    })
}

/// Which reduction.
#[derive(Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    SumSquare,
    L1,
    L2,
    LogSumExp,
}

impl Red {
    /// The reductions that add terms up (whose float32 results accumulate in float64).
    fn is_sum(self) -> bool {
        matches!(
            self,
            Red::Sum | Red::Mean | Red::SumSquare | Red::L1 | Red::L2 | Red::LogSumExp
        )
    }
}

fn reduce_num<T: Num>(a: &ArrayD<T>, axes: &[usize], keep: bool, r: Red) -> KResult<ArrayD<T>> {
    let mut x = a.clone();
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for &ax in sorted.iter().rev() {
        let n = x.shape()[ax];
        let y = match r {
            Red::Sum | Red::Mean => x.fold_axis(Axis(ax), T::zero(), |acc, v| *acc + *v),
            Red::Prod => x.fold_axis(Axis(ax), T::one(), |acc, v| *acc * *v),
            Red::Max | Red::Min => {
                if n == 0 {
                    return Err("max/min over an empty axis".into());
                }
                let first = x.index_axis(Axis(ax), 0).to_owned();
                let mut acc = first;
                for i in 1..n {
                    let s = x.index_axis(Axis(ax), i);
                    Zip::from(&mut acc).and(&s).for_each(|a, b| {
                        let better = if r == Red::Max { *b > *a } else { *b < *a };
                        // NaN propagates, as in numpy.
                        if better || is_nan(b) {
                            *a = *b;
                        }
                    });
                }
                acc
            }
            _ => return Err("unsupported reduction for this dtype".into()),
        };
        x = if keep { y.insert_axis(Axis(ax)) } else { y };
    }
    Ok(x)
}

fn reduce_float<T: Fl + Num>(
    a: &ArrayD<T>,
    axes: &[usize],
    keep: bool,
    r: Red,
) -> KResult<ArrayD<T>> {
    // Sums of a float32 tensor accumulate in float64 and round once ([`Fl::WIDE_ACCUMULATION`]):
    // a bias or BatchNorm gradient sums batch x spatial terms (tens of thousands), where a
    // sequential float32 sum drifts by ~n u (Higham, 2nd ed., eq. 4.4).
    if T::WIDE_ACCUMULATION
        && matches!(
            r,
            Red::Sum | Red::Mean | Red::SumSquare | Red::L1 | Red::L2 | Red::LogSumExp
        )
    {
        let wide = reduce_float(&a.mapv(|v| v.to64()), axes, keep, r)?;
        return Ok(wide.mapv(T::c));
    }
    let count: usize = {
        let mut s = axes.to_vec();
        s.sort_unstable();
        s.dedup();
        s.iter().map(|&i| a.shape()[i]).product()
    };
    Ok(match r {
        Red::Mean => {
            let s = reduce_num(a, axes, keep, Red::Sum)?;
            let n = T::c(count as f64);
            s.mapv(|v| v / n)
        }
        Red::SumSquare => reduce_num(&a.mapv(|v| v * v), axes, keep, Red::Sum)?,
        Red::L1 => reduce_num(&a.mapv(|v| v.abs()), axes, keep, Red::Sum)?,
        Red::L2 => reduce_num(&a.mapv(|v| v * v), axes, keep, Red::Sum)?.mapv(|v| v.sqrt()),
        Red::LogSumExp => {
            let m = reduce_num(a, axes, true, Red::Max)?;
            let m = m.mapv(|v| if v.is_finite() { v } else { <T as Num>::zero() });
            let e = zip2(a, &m, |x, mm| (x - mm).exp())?;
            let s = reduce_num(&e, axes, true, Red::Sum)?;
            let out = zip2(&s, &m, |s, mm| s.ln() + mm)?;
            if keep {
                out
            } else {
                let mut o = out;
                let mut s = axes.to_vec();
                s.sort_unstable();
                s.dedup();
                for &ax in s.iter().rev() {
                    o = o.index_axis_move(Axis(ax), 0);
                }
                o
            }
        }
        _ => reduce_num(a, axes, keep, r)?,
    })
}

fn reduce(c: &Ctx, r: Red) -> KResult<Tensor> {
    let x = c.input(0)?;
    let rank = x.shape().len();
    // Axes: an input since opset 13 for ReduceSum and opset 18 for the others; an attribute before.
    let axes_in_input = if c.op.op_type == "ReduceSum" {
        c.opset >= 13
    } else {
        c.opset >= 18
    };
    let axes = if axes_in_input {
        c.ints_input(1)
    } else {
        c.ints("axes")
    };
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|&ax| norm_axis(ax, rank))
            .collect::<KResult<_>>()?,
        _ => {
            if c.int("noop_with_empty_axes", 0) != 0 {
                return Ok(x.clone());
            }
            (0..rank).collect()
        }
    };
    let keep = c.int("keepdims", 1) != 0;
    Ok(match x {
        // Sums of float32 accumulate in float64 (then round once): a float32 running sum of K
        // terms is off by up to ~K u (Higham, "Accuracy and Stability of Numerical Algorithms",
        // 2nd ed., eq. 4.4), and the weight gradients of normalisations are such sums over
        // N x H x W elements (`ds = sum_R(dY xhat)`, autodiff/norm.rs).
        Tensor::F32(a) if r.is_sum() => {
            Tensor::F32(reduce_float(&a.mapv(f64::from), &axes, keep, r)?.mapv(|v| v as f32))
        }
        Tensor::F32(a) => Tensor::F32(reduce_float(a, &axes, keep, r)?),
        Tensor::F64(a) => Tensor::F64(reduce_float(a, &axes, keep, r)?),
        Tensor::I64(a) => Tensor::I64(reduce_num(a, &axes, keep, r)?),
        Tensor::I32(a) => Tensor::I32(reduce_num(a, &axes, keep, r)?),
        other => return Err(format!("reduction of {} is not supported", other.dtype())),
    })
}

fn arg_reduce(c: &Ctx, max: bool) -> KResult<Tensor> {
    let x = c.input(0)?.to_f64();
    let rank = x.ndim();
    let ax = norm_axis(c.int("axis", 0), rank)?;
    let keep = c.int("keepdims", 1) != 0;
    let last = c.int("select_last_index", 0) != 0;
    let out = x.map_axis(Axis(ax), |lane| {
        let mut best = 0usize;
        for (i, v) in lane.iter().enumerate() {
            let b = lane[best];
            let better = if max { *v > b } else { *v < b };
            if better || (last && *v == b) {
                best = i;
            }
        }
        best as i64
    });
    Ok(Tensor::I64(if keep {
        out.insert_axis(Axis(ax))
    } else {
        out
    }))
}

fn cumsum<T: Num>(a: &ArrayD<T>, ax: usize, exclusive: bool, reverse: bool) -> ArrayD<T> {
    let mut out = a.clone();
    for mut lane in out.lanes_mut(Axis(ax)) {
        let n = lane.len();
        let mut acc = T::zero();
        for k in 0..n {
            let i = if reverse { n - 1 - k } else { k };
            let v = lane[i];
            if exclusive {
                lane[i] = acc;
                acc = acc + v;
            } else {
                acc = acc + v;
                lane[i] = acc;
            }
        }
    }
    out
}

/// True for NaN (the one value not equal to itself); false for every integer.
pub(crate) fn is_nan<T: PartialOrd>(x: &T) -> bool {
    x.partial_cmp(x).is_none()
}

fn div_by<T: Fl>(a: &ArrayD<T>, n: usize) -> ArrayD<T> {
    let d = T::c(n as f64);
    a.mapv(|v| v / d)
}

fn gelu<T: Fl>(x: T, tanh_approx: bool) -> T {
    let half = T::c(0.5);
    if tanh_approx {
        let k = T::c((2.0 / std::f64::consts::PI).sqrt());
        half * x * (T::one() + (k * (x + T::c(0.044715) * x * x * x)).tanh())
    } else {
        half * x * (T::one() + (x * T::c(std::f64::consts::FRAC_1_SQRT_2)).erf())
    }
}

fn leaky<T: Fl>(x: T, a: f64) -> T {
    if x >= T::zero() {
        x
    } else {
        x * T::c(a)
    }
}

fn elu<T: Fl>(x: T, a: f64) -> T {
    if x >= T::zero() {
        x
    } else {
        (x.exp() - T::one()) * T::c(a)
    }
}

fn hard_sigmoid<T: Fl>(x: T, a: f64, b: f64) -> T {
    (x * T::c(a) + T::c(b)).max(T::zero()).min(T::one())
}

/// HardSwish: `x max(0, min(1, x/6 + 1/2))` (ONNX HardSwish-14).
fn hard_swish<T: Fl>(x: T) -> T {
    x * hard_sigmoid(x, 1.0 / 6.0, 0.5)
}

/// Selu: `gamma x` for `x > 0`, `gamma alpha (e^x - 1)` otherwise (ONNX Selu-6).
fn selu<T: Fl>(x: T, a: f64, g: f64) -> T {
    if x > T::zero() {
        x * T::c(g)
    } else {
        (x.exp() - T::one()) * T::c(a * g)
    }
}

/// Celu: `max(0, x) + min(0, alpha (e^(x/alpha) - 1))` (ONNX Celu-12).
fn celu<T: Fl>(x: T, a: f64) -> T {
    if x > T::zero() {
        x
    } else {
        ((x / T::c(a)).exp() - T::one()) * T::c(a)
    }
}

/// Softplus `ln(1 + e^x)`, exact for large `x`.
fn softplus<T: Fl>(x: T) -> T {
    if x > T::c(20.0) {
        x
    } else {
        x.exp().ln_1p()
    }
}

fn sigmoid<T: Fl>(x: T) -> T {
    if x >= T::zero() {
        T::one() / (T::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::one() + e)
    }
}

/// Elementwise and reduction ops; `None` if `op` is not one of them.
// `x < y` on bools is what ONNX Less means; keep it uniform with the other dtypes.
#[allow(clippy::bool_comparison)]
pub(crate) fn eval(op: &str, c: &Ctx) -> Option<KResult<Vec<Tensor>>> {
    let r = || -> KResult<Vec<Tensor>> {
        let one = |t: Tensor| Ok(vec![t]);
        match op {
            "Add" => one(bin_num!(c.input(0)?, c.input(1)?, |x, y| x + y)),
            "Sub" => one(bin_num!(c.input(0)?, c.input(1)?, |x, y| x - y)),
            "Mul" => one(bin_num!(c.input(0)?, c.input(1)?, |x, y| x * y)),
            "Div" => {
                let (a, b) = (c.input(0)?, c.input(1)?);
                same_dtype(a, b)?;
                one(match (a, b) {
                    (Tensor::F32(a), Tensor::F32(b)) => Tensor::F32(zip2(a, b, |x, y| x / y)?),
                    (Tensor::F64(a), Tensor::F64(b)) => Tensor::F64(zip2(a, b, |x, y| x / y)?),
                    (Tensor::I64(a), Tensor::I64(b)) => {
                        Tensor::I64(zip2(a, b, |x: i64, y: i64| x.checked_div(y).unwrap_or(0))?)
                    }
                    (Tensor::I32(a), Tensor::I32(b)) => {
                        Tensor::I32(zip2(a, b, |x: i32, y: i32| x.checked_div(y).unwrap_or(0))?)
                    }
                    (a, _) => return Err(format!("Div of {} is not supported", a.dtype())),
                })
            }
            "Mod" => {
                let (a, b) = (c.input(0)?, c.input(1)?);
                let fmod = c.int("fmod", 0) != 0;
                same_dtype(a, b)?;
                one(match (a, b) {
                    (Tensor::F32(a), Tensor::F32(b)) => Tensor::F32(zip2(a, b, |x, y| x % y)?),
                    (Tensor::F64(a), Tensor::F64(b)) => Tensor::F64(zip2(a, b, |x, y| x % y)?),
                    (Tensor::I64(a), Tensor::I64(b)) => {
                        Tensor::I64(zip2(a, b, |x: i64, y: i64| {
                            let m = x.checked_rem(y).unwrap_or(0);
                            if !fmod && m != 0 && ((m < 0) != (y < 0)) {
                                m + y
                            } else {
                                m
                            }
                        })?)
                    }
                    (a, _) => return Err(format!("Mod of {} is not supported", a.dtype())),
                })
            }
            "Pow" => one(pow(c.input(0)?, c.input(1)?)?),
            "Max" => one(variadic(c, |a, b| {
                Ok(bin_num!(a, b, |x, y| if x >= y || is_nan(&x) {
                    x
                } else {
                    y
                }))
            })?),
            "Min" => one(variadic(c, |a, b| {
                Ok(bin_num!(a, b, |x, y| if x <= y || is_nan(&x) {
                    x
                } else {
                    y
                }))
            })?),
            "Sum" => one(variadic(c, |a, b| Ok(bin_num!(a, b, |x, y| x + y)))?),
            "Mean" => {
                let n = c.inputs.iter().flatten().count();
                let s = variadic(c, |a, b| Ok(bin_num!(a, b, |x, y| x + y)))?;
                one(float_map!(&s, a => div_by(a, n)))
            }
            "Equal" => one(cmp!(c.input(0)?, c.input(1)?, |x, y| x == y)),
            "Less" => one(cmp!(c.input(0)?, c.input(1)?, |x, y| x < y)),
            "LessOrEqual" => one(cmp!(c.input(0)?, c.input(1)?, |x, y| x <= y)),
            "Greater" => one(cmp!(c.input(0)?, c.input(1)?, |x, y| x > y)),
            "GreaterOrEqual" => one(cmp!(c.input(0)?, c.input(1)?, |x, y| x >= y)),
            "And" => one(bool_op(c.input(0)?, c.input(1)?, |x, y| x && y)?),
            "Or" => one(bool_op(c.input(0)?, c.input(1)?, |x, y| x || y)?),
            "Xor" => one(bool_op(c.input(0)?, c.input(1)?, |x, y| x != y)?),
            "Not" => match c.input(0)? {
                Tensor::Bool(a) => one(Tensor::Bool(a.mapv(|v| !v))),
                t => Err(format!("expects bool, got {}", t.dtype())),
            },
            "Where" => one(where_(c.input(0)?, c.input(1)?, c.input(2)?)?),
            "Relu" => one(un_num!(c.input(0)?, |x, z| if x > z { x } else { z })),
            "Neg" => one(un_num!(c.input(0)?, |x, z| z - x)),
            "Abs" => one(un_num!(c.input(0)?, |x, z| if x < z { z - x } else { x })),
            "Sign" => one(un_float!(c.input(0)?, |x| if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            })),
            "Exp" => one(un_float!(c.input(0)?, |x| x.exp())),
            "Log" => one(un_float!(c.input(0)?, |x| x.ln())),
            "Sqrt" => one(un_float!(c.input(0)?, |x| x.sqrt())),
            "Reciprocal" => one(un_float!(c.input(0)?, |x| 1.0 / x)),
            "Erf" => one(un_float!(c.input(0)?, |x| Fl::erf(x))),
            "Tanh" => one(un_float!(c.input(0)?, |x| x.tanh())),
            "Sigmoid" => one(un_float!(c.input(0)?, |x| sigmoid(x))),
            "Sin" => one(un_float!(c.input(0)?, |x| x.sin())),
            "Cos" => one(un_float!(c.input(0)?, |x| x.cos())),
            "Floor" => one(un_float!(c.input(0)?, |x| x.floor())),
            "Ceil" => one(un_float!(c.input(0)?, |x| x.ceil())),
            "Round" => one(un_float!(c.input(0)?, |x| x.round_ties_even())),
            "Softplus" => one(un_float!(c.input(0)?, |x| softplus(x))),
            "Softsign" => one(un_float!(c.input(0)?, |x| x / (1.0 + x.abs()))),
            // Mish-18: x tanh(softplus(x)).
            "Mish" => one(un_float!(c.input(0)?, |x| x * softplus(x).tanh())),
            "HardSwish" => one(un_float!(c.input(0)?, |x| hard_swish(x))),
            "ThresholdedRelu" => {
                let al = c.float("alpha", 1.0) as f64;
                one(un_float!(c.input(0)?, |x| if x > Fl::c(al) {
                    x
                } else {
                    0.0
                }))
            }
            "Selu" => {
                let al = c.float("alpha", 1.673_263_2) as f64;
                let ga = c.float("gamma", 1.050_701) as f64;
                one(un_float!(c.input(0)?, |x| selu(x, al, ga)))
            }
            "Celu" => {
                let al = c.float("alpha", 1.0) as f64;
                one(un_float!(c.input(0)?, |x| celu(x, al)))
            }
            // PRelu-16: x for x >= 0, slope x otherwise (slope broadcasts to x).
            "PRelu" => {
                let (a, s) = (c.input(0)?, c.input(1)?);
                same_dtype(a, s)?;
                one(match (a, s) {
                    (Tensor::F32(a), Tensor::F32(s)) => {
                        Tensor::F32(zip2(a, s, |x, k| if x < 0.0 { x * k } else { x })?)
                    }
                    (Tensor::F64(a), Tensor::F64(s)) => {
                        Tensor::F64(zip2(a, s, |x, k| if x < 0.0 { x * k } else { x })?)
                    }
                    (a, _) => return Err(format!("PRelu of {} is not supported", a.dtype())),
                })
            }
            "IsNaN" => one(Tensor::Bool(c.input(0)?.to_f64().mapv(|v| v.is_nan()))),
            "IsInf" => {
                let (pos, neg) = (
                    c.int("detect_positive", 1) != 0,
                    c.int("detect_negative", 1) != 0,
                );
                one(Tensor::Bool(c.input(0)?.to_f64().mapv(|v| {
                    (pos && v == f64::INFINITY) || (neg && v == f64::NEG_INFINITY)
                })))
            }
            "LeakyRelu" => {
                let al = c.float("alpha", 0.01) as f64;
                one(un_float!(c.input(0)?, |x| leaky(x, al)))
            }
            "Elu" => {
                let al = c.float("alpha", 1.0) as f64;
                one(un_float!(c.input(0)?, |x| elu(x, al)))
            }
            "HardSigmoid" => {
                let (al, be) = (c.float("alpha", 0.2) as f64, c.float("beta", 0.5) as f64);
                one(un_float!(c.input(0)?, |x| hard_sigmoid(x, al, be)))
            }
            "Gelu" => {
                let tanh = c.string("approximate", "none") == "tanh";
                one(un_float!(c.input(0)?, |x| gelu(x, tanh)))
            }
            "Clip" => one(clip(c)?),
            "Cast" => {
                let to = c.int("to", 0);
                let dt = DType::from_onnx(to as i32).ok_or_else(|| format!("bad 'to' {to}"))?;
                one(c.input(0)?.cast(dt).map_err(|e| e.to_string())?)
            }
            "CastLike" => one(c
                .input(0)?
                .cast(c.input(1)?.dtype())
                .map_err(|e| e.to_string())?),
            "Identity" => one(c.input(0)?.clone()),
            "Dropout" => {
                // Inference (or ratio 0 / training_mode false): identity, mask all true.
                // Training: each element is kept with probability 1 - ratio and scaled by
                // 1 / (1 - ratio); the mask comes from a xorshift64* stream seeded by the `seed`
                // attribute (ONNX leaves the generator unspecified), so runs are reproducible.
                let x = c.input(0)?;
                let training = c
                    .opt(2)
                    .is_some_and(|t| t.to_i64_vec().first().copied().unwrap_or(0) != 0);
                let ratio = c
                    .opt(1)
                    .and_then(|r| r.to_f64().iter().copied().next())
                    .unwrap_or(0.5);
                if !training || ratio == 0.0 {
                    let mask = Tensor::Bool(ArrayD::from_elem(IxDyn(x.shape()), true));
                    return Ok(vec![x.clone(), mask]);
                }
                if !(0.0..1.0).contains(&ratio) {
                    return Err(format!("ratio {ratio} is outside [0, 1)"));
                }
                let mut state = (c.int("seed", 0) as u64) ^ 0x9E37_79B9_7F4A_7C15;
                let keep: Vec<bool> = (0..x.len())
                    .map(|_| {
                        state ^= state >> 12;
                        state ^= state << 25;
                        state ^= state >> 27;
                        let r = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
                        ((r >> 11) as f64 / (1u64 << 53) as f64) >= ratio
                    })
                    .collect();
                let mask =
                    ArrayD::from_shape_vec(IxDyn(x.shape()), keep).map_err(|e| e.to_string())?;
                let scale = 1.0 / (1.0 - ratio);
                let m64 = mask.mapv(|k| if k { scale } else { 0.0 });
                let y = match x {
                    Tensor::F32(a) => {
                        Tensor::F32(a.as_standard_layout().into_owned() * &m64.mapv(|v| v as f32))
                    }
                    Tensor::F64(a) => Tensor::F64(a.as_standard_layout().into_owned() * &m64),
                    other => {
                        return Err(format!("Dropout on {:?} is not supported", other.dtype()))
                    }
                };
                Ok(vec![y, Tensor::Bool(mask)])
            }
            "ReduceSum" => one(reduce(c, Red::Sum)?),
            "ReduceMean" => one(reduce(c, Red::Mean)?),
            "ReduceMax" => one(reduce(c, Red::Max)?),
            "ReduceMin" => one(reduce(c, Red::Min)?),
            "ReduceProd" => one(reduce(c, Red::Prod)?),
            "ReduceSumSquare" => one(reduce(c, Red::SumSquare)?),
            "ReduceL1" => one(reduce(c, Red::L1)?),
            "ReduceL2" => one(reduce(c, Red::L2)?),
            "ReduceLogSumExp" => one(reduce(c, Red::LogSumExp)?),
            "ArgMax" => one(arg_reduce(c, true)?),
            "ArgMin" => one(arg_reduce(c, false)?),
            "CumSum" => {
                let x = c.input(0)?;
                let ax = c
                    .ints_input(1)
                    .and_then(|v| v.first().copied())
                    .ok_or("axis operand is required")?;
                let ax = norm_axis(ax, x.shape().len())?;
                let (ex, rev) = (c.int("exclusive", 0) != 0, c.int("reverse", 0) != 0);
                one(num_map!(x, a => cumsum(a, ax, ex, rev)))
            }
            _ => Err(String::new()),
        }
    };
    const OPS: &[&str] = &[
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Mod",
        "Pow",
        "Max",
        "Min",
        "Sum",
        "Mean",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
        "Not",
        "Where",
        "Relu",
        "Neg",
        "Abs",
        "Sign",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Erf",
        "Tanh",
        "Sigmoid",
        "Sin",
        "Cos",
        "Floor",
        "Ceil",
        "Round",
        "Softplus",
        "Softsign",
        "Mish",
        "HardSwish",
        "ThresholdedRelu",
        "Selu",
        "Celu",
        "PRelu",
        "IsNaN",
        "IsInf",
        "LeakyRelu",
        "Elu",
        "HardSigmoid",
        "Gelu",
        "Clip",
        "Cast",
        "CastLike",
        "Identity",
        "Dropout",
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSumExp",
        "ArgMax",
        "ArgMin",
        "CumSum",
    ];
    if OPS.contains(&op) {
        Some(r())
    } else {
        None
    }
}
