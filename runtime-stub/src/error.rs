//! Errors of the runtime. `Display` is one line that names the node and op, the file or the input
//! at fault.

use std::path::PathBuf;

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A node failed to execute (bad attribute, shape mismatch, unsupported dtype, ...).
    #[error("node '{node}' ({op_type}): {msg}")]
    Node {
        node: String,
        op_type: String,
        msg: String,
    },
    /// An op type the backend cannot run.
    #[error("node '{node}': op '{op_type}' is not supported by the {backend} backend")]
    Unsupported {
        node: String,
        op_type: String,
        backend: &'static str,
    },
    /// A graph input is missing or does not match the declared type.
    #[error("input '{name}': {msg}")]
    Input { name: String, msg: String },
    /// A `.npz` file could not be read or written.
    #[error("{path}: {msg}")]
    Npz { path: PathBuf, msg: String },
    /// The compiler (importer, exporter) failed.
    #[error(transparent)]
    Compiler(#[from] pipec_compiler::Error),
    /// The backend engine failed (tract's own error text).
    #[error("{backend}: {msg}")]
    Backend { backend: &'static str, msg: String },
    /// Anything else (tensor conversions).
    #[error("{0}")]
    Msg(String),
}

impl Error {
    /// An error about one node.
    pub fn node(node: &str, op_type: &str, msg: impl Into<String>) -> Self {
        Error::Node {
            node: node.to_string(),
            op_type: op_type.to_string(),
            msg: msg.into(),
        }
    }
    /// An error about a graph input.
    pub fn input(name: &str, msg: impl Into<String>) -> Self {
        Error::Input {
            name: name.to_string(),
            msg: msg.into(),
        }
    }
}
