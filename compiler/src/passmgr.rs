//! The pass manager: passes by name, pipelines, a verifier run after every pass, IR printing and
//! per-pass timing as instrumentation (MLIR's `PassManager`, Cranelift's `timing`).

use crate::error::{Error, Result};
use crate::ir::Module;
use std::collections::BTreeMap;

/// Named counters a pass reports (MLIR's `Statistic`), e.g. `folded-ops`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats(pub BTreeMap<&'static str, u64>);

impl Stats {
    /// Add `n` to counter `name`.
    pub fn add(&mut self, name: &'static str, n: u64) {
        *self.0.entry(name).or_insert(0) += n;
    }
    /// Value of a counter (0 if never added to).
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// An IR -> IR pass. Each implementation lives in its own file in `passes/` with a `//!` doc
/// stating what it requires, what it guarantees and what it invalidates.
pub trait Pass: Send + Sync {
    /// The CLI name (`shape-infer`).
    fn name(&self) -> &'static str;
    /// One line for `--list-passes`.
    fn summary(&self) -> &'static str;
    /// Run on the module. An error stops the pipeline.
    fn run(&self, module: &mut Module, stats: &mut Stats) -> Result<()>;
}

impl std::fmt::Debug for dyn Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Wrap a pass error with the pass name.
pub fn pass_error(pass: &str, e: Error) -> Error {
    Error::Pass {
        pass: pass.to_string(),
        source: Box::new(e),
    }
}
