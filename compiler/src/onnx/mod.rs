//! The ONNX front end and exporter.
//!
//! - [`proto`]: the ONNX protobuf messages as hand-written `prost` structs.
//! - [`import`]: ONNX → IR ([`load`], [`from_bytes`]), zero-copy for weights, with validation.
//! - [`export`]: IR → ONNX ([`to_model_proto`], [`to_bytes`], [`save`]).
//! - [`upgrade`]: older default-domain opsets (7–16) rewritten to opset 17, as ONNX's version
//!   converter does.

#![warn(missing_docs)]

pub mod export;
pub mod import;
pub mod proto;
pub mod upgrade;

pub use export::{
    save, save_with, to_bytes, to_bytes_with, to_model_proto, to_model_proto_with, ExportOptions,
};
pub use import::{from_bytes, from_model_proto, load};
