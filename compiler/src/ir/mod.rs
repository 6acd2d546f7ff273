//! pipec's IR: one [`Module`] holds one [`Graph`] of SSA [`Value`]s defined by [`Op`]s (ONNX nodes),
//! graph inputs or constant initializers. Types are [`TensorType`]s with static or symbolic dims.

mod graph;
mod tensor;
mod types;

pub use graph::{Graph, Module, Op, OpData, Value, ValueData, ValueDef};
pub use tensor::{numel, Attr, Payload, Subgraph, TensorData, CAPTURES_ATTR};
pub use types::{fmt_type, DType, Dim, SymDim, TensorType};
