//! pipec's runtime: loads a compiled program and runs it (issues 3 and 7).
//!
//! This crate holds the **single-device executor** (issue 3, part 4): [`exec::Executor`] runs one
//! IR function (a whole model, or later one stage's forward / backward / optimizer-step subgraph)
//! on the CPU. See [`exec`] for the trait and the backends, [`tensor::Tensor`] for the host tensor
//! type and [`npz`] for reading and writing `.npz` files.

pub mod dist;
pub mod error;
pub mod exec;
pub mod npz;
pub mod ort_backend;
pub mod reference;
pub mod tensor;
pub mod tract_backend;
pub mod value;

pub use error::{Error, Result};
pub use exec::{default_executor, executor_by_name, run_graph, Executor, Prepared};
pub use tensor::Tensor;
pub use value::Value;
