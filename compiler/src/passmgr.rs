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

/// When to hand the IR to the printer.
#[derive(Clone, Debug, Default)]
pub enum PrintIr {
    /// Never.
    #[default]
    Never,
    /// After every pass (`--print-ir-after-all`).
    AfterAll,
    /// After the passes with these names (`--print-ir-after NAME`).
    After(Vec<String>),
}

/// Wall time and statistics of one pass run.
#[derive(Clone, Debug)]
pub struct PassRecord {
    pub name: &'static str,
    pub wall: std::time::Duration,
    pub stats: Stats,
}

/// A pipeline of passes with its instrumentation.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    /// Run the verifier after every pass (on by default).
    pub verify_each: bool,
    /// When to print.
    pub print_ir: PrintIr,
}

impl PassManager {
    /// A pipeline of the given passes, verifying after each.
    pub fn new(passes: Vec<Box<dyn Pass>>) -> Self {
        PassManager {
            passes,
            verify_each: true,
            print_ir: PrintIr::Never,
        }
    }

    /// Names of the passes, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Run every pass in order. After each pass the verifier runs (if enabled), then `print` is
    /// called with the pass name and the IR when the print option asks for it. The first error
    /// stops the pipeline and is returned wrapped with the pass name.
    pub fn run(
        &self,
        module: &mut Module,
        print: &mut dyn FnMut(&str, &Module),
    ) -> Result<Vec<PassRecord>> {
        let mut records = Vec::with_capacity(self.passes.len());
        for pass in &self.passes {
            let mut stats = Stats::default();
            let t0 = std::time::Instant::now();
            pass.run(module, &mut stats)
                .map_err(|e| pass_error(pass.name(), e))?;
            let wall = t0.elapsed();
            if self.verify_each {
                // exec branch only: `crate::verify` is not wired into lib.rs yet (the lead merges
                // it); the verifier call is restored on integration.
                let _ = &module;
            }
            let want = match &self.print_ir {
                PrintIr::Never => false,
                PrintIr::AfterAll => true,
                PrintIr::After(names) => names.iter().any(|n| n == pass.name()),
            };
            if want {
                print(pass.name(), module);
            }
            records.push(PassRecord {
                name: pass.name(),
                wall,
                stats,
            });
        }
        Ok(records)
    }
}
