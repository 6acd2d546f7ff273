//! pipec's runtime: loads a compiled program and runs it (issues 3 and 7).
//!
//! For now: [`npz`] (numpy array files) and [`run_graph`], a **temporary** single-device
//! executor that delegates to onnxruntime through Python ([`ort_bridge`]) until the native CPU
//! executor (branch `exec`) replaces it behind the same signature.

pub mod npz;
pub mod ort_bridge;

pub use ort_bridge::run_graph;
