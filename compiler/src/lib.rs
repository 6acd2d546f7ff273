//! pipec's compiler core: the IR, the ONNX front end and exporter, the textual IR (MLIR generic
//! syntax), the verifier, shape inference and the pass manager. See ARCHITECTURE.md.

pub mod analysis;
pub mod error;
pub mod eval;
pub mod ir;
#[cfg(feature = "mlir")]
pub mod mlir;
pub mod onnx;
pub mod passmgr;
pub mod program;
pub mod shape;
pub mod text;
pub mod topo;
pub mod verify;

pub use error::{Error, PlanOption, Result};
