//! A buffer the runtime holds: a host [`Tensor`], or an executor's own value that stays where the
//! executor computes (an ONNX Runtime value, in host memory for the CPU provider or in GPU memory
//! for the CUDA provider).
//!
//! The worker keeps every buffer of the schedule (parameters, gradients, optimizer state,
//! micro-batch activations) as a [`Value`]: an executor that has its own values
//! ([`crate::exec::Executor::upload`]) gets them back without a copy on every run, and a value
//! leaves its device only where the host needs it (the loss, an MPI message or all-reduce, the
//! final parameters): [`Value::into_host`].

use crate::error::Result;
use crate::ort_backend::OrtValue;
use crate::tensor::Tensor;
use pipec_compiler::ir::DType;

/// A tensor on the host or in an executor's own memory.
#[derive(Debug)]
pub enum Value {
    /// In host memory, as the reference interpreter and the transports use it.
    Host(Tensor),
    /// An ONNX Runtime value (host memory for the CPU provider, GPU memory for CUDA).
    Ort(OrtValue),
}

impl Value {
    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Value::Host(t) => t.dtype(),
            Value::Ort(v) => v.dtype(),
        }
    }

    /// Shape.
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Value::Host(t) => t.shape().to_vec(),
            Value::Ort(v) => v.shape().to_vec(),
        }
    }

    /// Whether the value is a host tensor.
    pub fn is_host(&self) -> bool {
        matches!(self, Value::Host(_))
    }

    /// The host tensor: moved for a host value, copied off the device otherwise.
    pub fn into_host(self) -> Result<Tensor> {
        match self {
            Value::Host(t) => Ok(t),
            Value::Ort(v) => v.to_host(),
        }
    }

    /// A copy where the value is (host or device memory).
    pub fn try_clone(&self) -> Result<Value> {
        match self {
            Value::Host(t) => Ok(Value::Host(t.clone())),
            Value::Ort(v) => v.try_clone().map(Value::Ort),
        }
    }

    /// A host copy.
    pub fn to_host(&self) -> Result<Tensor> {
        match self {
            Value::Host(t) => Ok(t.clone()),
            Value::Ort(v) => v.to_host(),
        }
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Host(t)
    }
}
