//! Collectives over an [`Endpoint`]: the all-reduce (sum) of the schedule's
//! [`AllReduce`](pipec_compiler::program::Instr::AllReduce) instruction.
//!
//! [`Collectives`] is a trait so that a backend with its own collectives (MPI's
//! `MPI_Allreduce`, NCCL) can replace the portable [`Ring`] implementation.

use super::transport::{CommError, Endpoint, Tag};
use crate::tensor::Tensor;
use ndarray::{ArrayD, IxDyn};
use pipec_compiler::ir::DType;
use pipec_compiler::program::{Instr, Program};
use std::collections::BTreeMap;
use std::time::Duration;

/// Collective operations of a backend.
pub trait Collectives: Send + Sync {
    /// Sum `tensors` element-wise over the ranks of `group` (ascending, contains `ep.rank()`);
    /// every member calls it with the same `tag` and tensors of the same dtypes and shapes, and
    /// every member ends with the same sum (bit-identical). A group of one is a no-op. `tag` is
    /// the schedule's tag of the instruction; an implementation may use any [`Tag`] with that
    /// `id` for its messages.
    fn all_reduce_sum(
        &self,
        ep: &mut dyn Endpoint,
        group: &[usize],
        tag: u32,
        tensors: &mut [Tensor],
        timeout: Duration,
    ) -> Result<(), CommError>;
}

/// Collectives on executor values that stay where they are (NCCL on GPU memory), for the
/// all-reduce of a group whose devices may share a process.
///
/// The worker sums a group in two levels: the group's devices in this process send their
/// values to the first of them (in-process value messages, no copy off the device), which adds
/// them, calls [`ValueCollectives::all_reduce_sum`] once for the process (the sum across the
/// processes that hold the group's devices) and hands each local member a copy. With one
/// process per device (MPI) the first level is empty; with one process (threads) the second
/// is a world of one.
pub trait ValueCollectives: Send + Sync {
    /// Whether device `d` runs in this process.
    fn is_local(&self, d: usize) -> bool;
    /// Whether it can reduce `group` (the worker uses the host collectives for the others).
    fn covers(&self, group: &[usize]) -> bool;
    /// Sum `values` element-wise, in place, over the processes of `group`; called once per
    /// process by the group's first local device, with the same tag and the values of the
    /// same dtypes and shapes on every process.
    fn all_reduce_sum(
        &self,
        group: &[usize],
        tag: u32,
        values: &mut [crate::value::Value],
    ) -> Result<(), CommError>;
}

/// Ring all-reduce (reduce-scatter then all-gather, `2(n-1)` steps, each rank sending
/// `2(n-1)/n` of the bytes). The tensors are summed as one flattened concatenation per dtype,
/// cut into `n` chunks; each chunk is reduced in a fixed ring order and then copied to every
/// member, so all members end bit-identical.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ring;

/// Element types the ring (and the MPI all-reduce) can sum.
pub(crate) trait Elem: Copy + std::ops::AddAssign + 'static {
    fn wrap(v: Vec<Self>) -> Tensor;
    fn unwrap(t: Tensor) -> Option<Vec<Self>>;
    fn flatten(ts: &[&Tensor], out: &mut Vec<Self>);
    fn scatter(v: &[Self], ts: &mut [&mut Tensor]);
    fn as_mut_slice(t: &mut Tensor) -> Option<&mut [Self]>;
}

macro_rules! elem {
    ($t:ty, $v:ident) => {
        impl Elem for $t {
            fn wrap(v: Vec<Self>) -> Tensor {
                let n = v.len();
                // A 1-D shape of the vector's own length always fits.
                Tensor::$v(ArrayD::from_shape_vec(IxDyn(&[n]), v).unwrap_or_default())
            }
            fn unwrap(t: Tensor) -> Option<Vec<Self>> {
                match t {
                    // Contiguous (the normal case): take the buffer, no element-wise walk.
                    Tensor::$v(a) => Some(crate::tensor::into_row_major_vec(a)),
                    _ => None,
                }
            }
            fn flatten(ts: &[&Tensor], out: &mut Vec<Self>) {
                for t in ts {
                    if let Tensor::$v(a) = t {
                        match a.as_slice() {
                            Some(s) => out.extend_from_slice(s),
                            None => out.extend(a.iter().copied()),
                        }
                    }
                }
            }
            fn as_mut_slice(t: &mut Tensor) -> Option<&mut [Self]> {
                match t {
                    Tensor::$v(a) => a.as_slice_mut(),
                    _ => None,
                }
            }
            fn scatter(v: &[Self], ts: &mut [&mut Tensor]) {
                let mut at = 0;
                for t in ts.iter_mut() {
                    if let Tensor::$v(a) = &mut **t {
                        let n = a.len();
                        match a.as_slice_mut() {
                            Some(s) => s.copy_from_slice(&v[at..at + n]),
                            None => {
                                for (x, y) in a.iter_mut().zip(&v[at..]) {
                                    *x = *y;
                                }
                            }
                        }
                        at += n;
                    }
                }
            }
        }
    };
}
elem!(f32, F32);
elem!(f64, F64);
elem!(i64, I64);
elem!(i32, I32);

/// Chunk `i` of `n` of a buffer of `len` elements.
fn chunk(len: usize, n: usize, i: usize) -> std::ops::Range<usize> {
    (i * len / n)..((i + 1) * len / n)
}

/// Ring all-reduce of one flat buffer; `part0` is the first tag part this call may use
/// (it uses `2(n-1)`).
fn ring_buffer<T: Elem>(
    ep: &mut dyn Endpoint,
    group: &[usize],
    pos: usize,
    id: u32,
    part0: u32,
    buf: &mut [T],
    timeout: Duration,
) -> Result<(), CommError> {
    let n = group.len();
    let len = buf.len();
    let right = group[(pos + 1) % n];
    let left = group[(pos + n - 1) % n];
    let tag = |s: usize| Tag {
        id,
        part: part0 + s as u32,
    };
    let bad = |what: &str, s: usize| {
        CommError::Other(format!(
            "all-reduce (tag {id}) step {s}: device {left} sent {what}"
        ))
    };
    // Reduce-scatter: a partial sum travels the ring; at step s rank `pos` receives chunk
    // (pos - s - 1), adds its own part into the received buffer and forwards that same buffer
    // (moved, no copy) at the next step. After n - 1 steps it holds the full sum of chunk
    // (pos + 1).
    let mut out: Vec<T> = buf[chunk(len, n, pos)].to_vec();
    for s in 0..n - 1 {
        ep.send(right, tag(s), T::wrap(out))?;
        let recv_c = chunk(len, n, (pos + 2 * n - s - 1) % n);
        let mut got = T::unwrap(ep.recv(left, tag(s), timeout)?)
            .ok_or_else(|| bad("a tensor of another dtype", s))?;
        if got.len() != recv_c.len() {
            return Err(bad("a chunk of another length", s));
        }
        for (g, x) in got.iter_mut().zip(&buf[recv_c]) {
            *g += *x;
        }
        out = got;
    }
    buf[chunk(len, n, (pos + 1) % n)].copy_from_slice(&out);
    // All-gather: pass the full sums around; each received chunk is stored and forwarded.
    for s in 0..n - 1 {
        let step = n - 1 + s;
        ep.send(right, tag(step), T::wrap(out))?;
        let recv_c = chunk(len, n, (pos + n - s) % n);
        let got = T::unwrap(ep.recv(left, tag(step), timeout)?)
            .ok_or_else(|| bad("a tensor of another dtype", step))?;
        if got.len() != recv_c.len() {
            return Err(bad("a chunk of another length", step));
        }
        buf[recv_c].copy_from_slice(&got);
        out = got;
    }
    Ok(())
}

fn ring_dtype<T: Elem>(
    ep: &mut dyn Endpoint,
    group: &[usize],
    pos: usize,
    id: u32,
    part0: u32,
    ts: &mut [&mut Tensor],
    timeout: Duration,
) -> Result<(), CommError> {
    if ts.len() == 1 {
        if let Some(slice) = T::as_mut_slice(ts[0]) {
            return ring_buffer(ep, group, pos, id, part0, slice, timeout);
        }
    }
    let mut buf: Vec<T> = Vec::with_capacity(ts.iter().map(|t| t.len()).sum());
    {
        let refs: Vec<&Tensor> = ts.iter().map(|t| &**t).collect();
        T::flatten(&refs, &mut buf);
    }
    ring_buffer(ep, group, pos, id, part0, &mut buf, timeout)?;
    T::scatter(&buf, ts);
    Ok(())
}

impl Collectives for Ring {
    fn all_reduce_sum(
        &self,
        ep: &mut dyn Endpoint,
        group: &[usize],
        tag: u32,
        tensors: &mut [Tensor],
        timeout: Duration,
    ) -> Result<(), CommError> {
        let me = ep.rank();
        let pos = group.iter().position(|&g| g == me).ok_or_else(|| {
            CommError::Other(format!(
                "all-reduce over {group:?} called on device {me}, not a member"
            ))
        })?;
        let n = group.len();
        if n <= 1 {
            return Ok(());
        }
        if let Some(t) = tensors
            .iter()
            .find(|t| !matches!(t.dtype(), DType::F32 | DType::F64 | DType::I64 | DType::I32))
        {
            return Err(CommError::Other(format!(
                "all-reduce (tag {tag}): cannot sum {} tensors",
                t.dtype()
            )));
        }
        // One ring per dtype present, in a fixed order so every member agrees.
        let steps = 2 * (n as u32 - 1);
        for (k, dt) in [DType::F32, DType::F64, DType::I64, DType::I32]
            .into_iter()
            .enumerate()
        {
            let mut ts: Vec<&mut Tensor> = tensors.iter_mut().filter(|t| t.dtype() == dt).collect();
            if ts.is_empty() {
                continue;
            }
            let part0 = 1 + k as u32 * steps;
            match dt {
                DType::F32 => ring_dtype::<f32>(ep, group, pos, tag, part0, &mut ts, timeout)?,
                DType::F64 => ring_dtype::<f64>(ep, group, pos, tag, part0, &mut ts, timeout)?,
                DType::I64 => ring_dtype::<i64>(ep, group, pos, tag, part0, &mut ts, timeout)?,
                _ => ring_dtype::<i32>(ep, group, pos, tag, part0, &mut ts, timeout)?,
            }
        }
        Ok(())
    }
}

/// Every all-reduce group of the program (2 or more members) whose members all issue the same
/// sequence of all-reduce tags on it, in a global order (sorted): the groups a backend that
/// matches collectives by their order on a communicator (MPI, NCCL) can reduce.
pub fn ordered_groups(p: &Program) -> Vec<Vec<usize>> {
    let mut seqs: BTreeMap<Vec<usize>, BTreeMap<usize, Vec<u32>>> = BTreeMap::new();
    for (d, dp) in p.devices.iter().enumerate() {
        for ins in &dp.instructions {
            if let Instr::AllReduce { group, tag, .. } = ins {
                if group.len() > 1 {
                    seqs.entry(group.clone())
                        .or_default()
                        .entry(d)
                        .or_default()
                        .push(*tag);
                }
            }
        }
    }
    seqs.into_iter()
        .filter(|(g, per)| {
            let first = per.values().next();
            per.len() == g.len() && per.values().all(|s| Some(s) == first)
        })
        .map(|(g, _)| g)
        .collect()
}
