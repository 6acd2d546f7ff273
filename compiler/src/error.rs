//! Errors as values. Every error that comes from user input names the file, node or flag that
//! caused it; the CLI prints `Display` on one line and exits 2.

use std::path::PathBuf;

/// Result alias used across the compiler.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of the compiler. `Display` is one line that names the culprit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bytes of a model file are not a valid ONNX protobuf (empty, truncated, random bytes).
    #[error("{path}: not a valid ONNX model: {msg}")]
    Decode { path: PathBuf, msg: String },
    /// The model is well-formed protobuf but breaks an ONNX rule (dangling input, cycle, ...).
    #[error("{}{msg}", loc_prefix(node, op_type))]
    Invalid {
        /// Name of the node (or initializer / value) at fault, if any.
        node: Option<String>,
        /// Op type of that node, if it is a node.
        op_type: Option<String>,
        msg: String,
    },
    /// An op type the compiler has no rule for.
    #[error("node '{node}': unknown op type '{domain}{sep}{op_type}'", sep = if domain.is_empty() { "" } else { "." })]
    UnknownOp {
        node: String,
        op_type: String,
        domain: String,
    },
    /// Shape inference found inconsistent shapes.
    #[error("node '{node}' ({op_type}): shape error: {msg}")]
    Shape {
        node: String,
        op_type: String,
        msg: String,
    },
    /// Textual IR could not be parsed.
    #[error("{file}:{line}:{col}: parse error: {msg}")]
    Parse {
        file: String,
        line: usize,
        col: usize,
        msg: String,
    },
    /// The verifier rejected the IR.
    #[error("verifier: {0}")]
    Verify(String),
    /// An error of a step defined outside this crate (the driver's compile steps), carried
    /// through the pass manager unchanged.
    #[error(transparent)]
    External(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A pass failed; wraps the inner error with the pass name.
    #[error("pass '{pass}': {source}")]
    Pass {
        pass: String,
        #[source]
        source: Box<Error>,
    },
    /// Bad usage: unknown pass name, bad option value.
    #[error("{0}")]
    Usage(String),
    /// A planning option that cannot be used as given: `option` is the library's name of it
    /// ([`PlanOption`]; a command-line front end names its own flag instead), `value` the value
    /// given, `msg` what is wrong with it.
    #[error("{option} {value}: {msg}")]
    InvalidOption {
        option: PlanOption,
        value: String,
        msg: String,
    },
    /// The planner found no plan that meets the constraints (devices, the model's shape).
    #[error("{planner}: {msg}")]
    Infeasible { planner: String, msg: String },
    /// No plan fits in device memory (`have` bytes per device): every plan the planner formed
    /// has a stage over it. `stage` names the first node of the part of the model the planner
    /// cannot split further that needs the most, `need` bytes of parameters, gradients,
    /// optimizer state and buffers before any activations.
    #[error(
        "{planner}: no plan fits in device memory ({have_gb:.2} GB per device){at}: every plan \
         has a stage over it; the largest part that cannot be split (at '{stage}') alone needs \
         {need_gb:.2} GB of parameters, gradients, optimizer state and buffers",
        have_gb = have / 1e9,
        need_gb = need / 1e9
    )]
    OutOfMemory {
        planner: String,
        /// Where the search was (e.g. " at micro-batch 4"), or empty.
        at: String,
        stage: String,
        need: f64,
        have: f64,
    },
}

/// The options of planning that [`Error::InvalidOption`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanOption {
    Batch,
    MicroBatch,
    Devices,
    Cluster,
    Planner,
    Stages,
    Optimizer,
    DappleReference,
}

impl PlanOption {
    /// The library's name of the option (the field of the planning options).
    pub fn name(self) -> &'static str {
        match self {
            PlanOption::Batch => "batch",
            PlanOption::MicroBatch => "micro_batch",
            PlanOption::Devices => "devices",
            PlanOption::Cluster => "cluster",
            PlanOption::Planner => "planner",
            PlanOption::Stages => "stages",
            PlanOption::Optimizer => "optimizer",
            PlanOption::DappleReference => "dapple_reference",
        }
    }
}

impl std::fmt::Display for PlanOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn loc_prefix(node: &Option<String>, op_type: &Option<String>) -> String {
    match (node, op_type) {
        (Some(n), Some(t)) => format!("node '{n}' ({t}): "),
        (Some(n), None) => format!("'{n}': "),
        _ => String::new(),
    }
}

impl Error {
    /// Error about a node of the graph.
    pub fn node(
        node: impl Into<String>,
        op_type: impl Into<String>,
        msg: impl Into<String>,
    ) -> Self {
        Error::Invalid {
            node: Some(node.into()),
            op_type: Some(op_type.into()),
            msg: msg.into(),
        }
    }
    /// Error about a named value or initializer.
    pub fn named(name: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Invalid {
            node: Some(name.into()),
            op_type: None,
            msg: msg.into(),
        }
    }
    /// Error without a location.
    pub fn msg(msg: impl Into<String>) -> Self {
        Error::Invalid {
            node: None,
            op_type: None,
            msg: msg.into(),
        }
    }
    /// Shape-inference error for a node.
    pub fn shape(node: &str, op_type: &str, msg: impl Into<String>) -> Self {
        Error::Shape {
            node: node.to_string(),
            op_type: op_type.to_string(),
            msg: msg.into(),
        }
    }
    /// [`Error::InvalidOption`].
    pub fn option(
        option: PlanOption,
        value: impl std::fmt::Display,
        msg: impl Into<String>,
    ) -> Self {
        Error::InvalidOption {
            option,
            value: value.to_string(),
            msg: msg.into(),
        }
    }
    /// [`Error::Infeasible`].
    pub fn infeasible(planner: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::Infeasible {
            planner: planner.into(),
            msg: msg.into(),
        }
    }
    /// Wrap an io error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
