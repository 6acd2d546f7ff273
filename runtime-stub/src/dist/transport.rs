//! The point-to-point transport between devices.
//!
//! A transport gives every device (rank) an [`Endpoint`]. The contract, which every backend
//! (in-process threads, MPI) keeps:
//!
//! - [`Endpoint::send`] never blocks: the message is buffered until the receiver takes it.
//! - Messages between one ordered pair of ranks with one [`Tag`] arrive in the order they were
//!   sent (FIFO), so a schedule that reuses its tags every step stays matched.
//! - [`Endpoint::recv`] blocks until the message `(src, tag)` arrives, the timeout passes
//!   ([`CommError::Timeout`]) or some rank called [`Endpoint::abort`] ([`CommError::Aborted`]);
//!   an abort wakes every waiting receiver within a second.
//! - Payloads are [`Tensor`]s, moved, never serialized by the in-process backend (zero copy);
//!   an inter-process backend serializes them (dtype, shape, little-endian bytes).
//! - [`Endpoint::send_value`] / [`Endpoint::recv_value`] carry a worker's [`Value`]: the
//!   in-process backend hands it over as it is (a GPU buffer stays on the GPU: the devices of
//!   one process share it); the default copies it through the host.

use crate::tensor::Tensor;
use crate::value::Value;
use std::time::Duration;

/// A message tag: the schedule's program-wide `u32` tag plus a sub-index `part` that
/// collectives use for their internal steps (point-to-point messages use part 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    pub id: u32,
    pub part: u32,
}

impl Tag {
    /// The tag of a point-to-point message of the schedule.
    pub fn p2p(id: u32) -> Tag {
        Tag { id, part: 0 }
    }
}

impl std::fmt::Display for Tag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.part == 0 {
            write!(f, "tag {}", self.id)
        } else {
            write!(f, "tag {}.{}", self.id, self.part)
        }
    }
}

/// Why a communication call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum CommError {
    /// Nothing arrived within the timeout.
    Timeout {
        src: usize,
        tag: Tag,
        waited: Duration,
    },
    /// Another rank aborted the run.
    Aborted,
    /// Anything else (bad rank, a peer that went away, a malformed message).
    Other(String),
}

impl std::fmt::Display for CommError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommError::Timeout { src, tag, waited } => write!(
                f,
                "timed out after {:.1} s waiting for {tag} from device {src}",
                waited.as_secs_f64()
            ),
            CommError::Aborted => f.write_str("aborted because another device failed"),
            CommError::Other(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CommError {}

/// One rank's view of the transport.
pub trait Endpoint: Send {
    /// This device's rank (`0..size`).
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Send `t` to `dst` with `tag`. Never blocks.
    fn send(&mut self, dst: usize, tag: Tag, t: Tensor) -> Result<(), CommError>;
    /// Take the next message `tag` from `src`, waiting at most `timeout`.
    fn recv(&mut self, src: usize, tag: Tag, timeout: Duration) -> Result<Tensor, CommError>;
    /// Send a worker's value; by default copied to the host and sent as a [`Tensor`].
    fn send_value(&mut self, dst: usize, tag: Tag, v: Value) -> Result<(), CommError> {
        let t = v.into_host().map_err(|e| {
            CommError::Other(format!("copying a value to the host to send it: {e}"))
        })?;
        self.send(dst, tag, t)
    }
    /// Receive a value sent with [`Endpoint::send_value`] (or a tensor sent with `send`).
    fn recv_value(&mut self, src: usize, tag: Tag, timeout: Duration) -> Result<Value, CommError> {
        self.recv(src, tag, timeout).map(Value::Host)
    }
    /// Whether [`Endpoint::send_value`] hands a value over where it is (no host copy), so
    /// that collectives on executor values are better done with value messages than on host
    /// tensors. Default: no.
    fn moves_values(&self) -> bool {
        false
    }
    /// Tell every rank to stop: their pending and future `recv`s fail with
    /// [`CommError::Aborted`].
    fn abort(&self);
    /// Whether some rank aborted.
    fn is_aborted(&self) -> bool;
}
