//! pipec's compiler core: the IR, the ONNX front end and exporter, the textual IR (MLIR generic
//! syntax), the verifier, shape inference and the pass manager. See ARCHITECTURE.md.

pub mod error;
pub mod ir;
pub mod passmgr;
pub mod shape;

pub use error::{Error, Result};
