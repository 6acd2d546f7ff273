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

/// The type of a pass option's value (`pass{key=value}`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptionKind {
    /// `true`/`false` (or `1`/`0`).
    Bool,
    /// An integer >= 1.
    Count,
    /// A finite number.
    Number,
    /// Free text, checked by the pass (a loss spec, a cluster name).
    Text,
    /// One of the listed words.
    OneOf(&'static [&'static str]),
}

/// One option of a pass: `--list-passes` prints it and [`PassInfo::parse_options`] checks it.
#[derive(Clone, Copy, Debug)]
pub struct PassOption {
    pub name: &'static str,
    pub kind: OptionKind,
    /// The value when not given, as text (`""`: none).
    pub default: &'static str,
    pub help: &'static str,
}

/// A pass's contract, as data (MLIR's pass registration and preserved analyses): what
/// `--list-passes` prints, what the option parser accepts and what the [`PassManager`] checks
/// between passes.
#[derive(Debug)]
pub struct PassInfo {
    /// The CLI name (`shape-infer`).
    pub name: &'static str,
    /// One line for `--list-passes`.
    pub summary: &'static str,
    pub options: &'static [PassOption],
    /// The counters it may report ([`Stats`]); reporting another is a bug (checked in debug
    /// builds).
    pub statistics: &'static [&'static str],
    /// Module attributes it needs, each with the pass that sets it: the manager refuses to run
    /// it when one is missing, or stale because a pass that invalidates it ran since.
    pub requires: &'static [(&'static str, &'static str)],
    /// Module attributes it sets (and so makes current again).
    pub provides: &'static [&'static str],
    /// Module attributes whose meaning its rewrite breaks (e.g. `pipec.stages` once ops are
    /// added or removed: the new ops have no stage).
    pub invalidates: &'static [&'static str],
}

impl PassInfo {
    /// Check `key=value` pairs against the declared options: an unknown key, a bool that is not
    /// `true`/`false`, a count that is not an integer >= 1, a number that is not finite or a word
    /// outside its list is an error naming the pass and the option.
    pub fn parse_options(&self, kv: &[(String, String)]) -> Result<()> {
        let name = self.name;
        for (k, v) in kv {
            let Some(o) = self.options.iter().find(|o| o.name == k) else {
                return Err(Error::Usage(format!("pass '{name}': unknown option '{k}'")));
            };
            let ok = match o.kind {
                OptionKind::Bool => matches!(v.as_str(), "true" | "false" | "1" | "0"),
                OptionKind::Count => v.parse::<i64>().is_ok_and(|x| x >= 1),
                OptionKind::Number => v.parse::<f64>().is_ok_and(f64::is_finite),
                OptionKind::Text => !v.is_empty(),
                OptionKind::OneOf(words) => words.contains(&v.as_str()),
            };
            if !ok {
                return Err(Error::Usage(format!(
                    "pass '{name}': {k}={v} must be {}",
                    o.kind.describe()
                )));
            }
        }
        Ok(())
    }

    /// The `--list-passes` entry: the summary line, then one indented line each for the options,
    /// statistics, requirements and invalidations the pass declares.
    pub fn describe(&self, width: usize) -> String {
        let mut s = format!("{:width$}  {}\n", self.name, self.summary);
        let pad = " ".repeat(width + 2);
        for o in self.options {
            let default = if o.default.is_empty() {
                String::new()
            } else {
                format!(", default {}", o.default)
            };
            s.push_str(&format!(
                "{pad}{{{}=...}} {} ({}{default})\n",
                o.name,
                o.help,
                o.kind.describe()
            ));
        }
        let list = |l: &[&str]| l.join(", ");
        if !self.statistics.is_empty() {
            s.push_str(&format!("{pad}statistics: {}\n", list(self.statistics)));
        }
        if !self.requires.is_empty() {
            let r: Vec<String> = self
                .requires
                .iter()
                .map(|(a, by)| format!("{a} (from {by})"))
                .collect();
            s.push_str(&format!("{pad}requires: {}\n", r.join(", ")));
        }
        if !self.provides.is_empty() {
            s.push_str(&format!("{pad}provides: {}\n", list(self.provides)));
        }
        if !self.invalidates.is_empty() {
            s.push_str(&format!("{pad}invalidates: {}\n", list(self.invalidates)));
        }
        s
    }
}

impl OptionKind {
    /// What a value of this kind is, for messages and `--list-passes`.
    pub fn describe(&self) -> String {
        match self {
            OptionKind::Bool => "true or false".into(),
            OptionKind::Count => "an integer >= 1".into(),
            OptionKind::Number => "a number".into(),
            OptionKind::Text => "text".into(),
            OptionKind::OneOf(w) => format!("one of {}", w.join(", ")),
        }
    }
}

/// What a pipeline transforms: one module (`pipec opt`'s passes), or a whole compilation in
/// progress (`pipec compile`'s steps, which make many modules: stage pieces, the reference). The
/// manager asks it whether a declared requirement holds and which IR a pass just made or changed,
/// to verify and print that IR after the pass.
pub trait IrUnit {
    /// Whether the unit holds `attr` ([`PassInfo::requires`]): a module attribute, or a
    /// compilation's product.
    fn holds(&self, attr: &str) -> bool;
    /// What [`IrUnit::holds`] asks about, for messages (`module attribute`).
    fn attr_kind(&self) -> &'static str {
        "module attribute"
    }
    /// A position in the unit's IR history, taken before a pass runs.
    fn ir_mark(&self) -> usize;
    /// The IR made or changed since `mark`, in order, with a label for printers (`""`: the pass's
    /// name). A module is changed in place by every pass: it is always the answer.
    fn ir_since(&self, mark: usize) -> Vec<(&str, &Module)>;
}

impl IrUnit for Module {
    fn holds(&self, attr: &str) -> bool {
        self.attrs.contains_key(attr)
    }
    fn ir_mark(&self) -> usize {
        0
    }
    fn ir_since(&self, _mark: usize) -> Vec<(&str, &Module)> {
        vec![("", self)]
    }
}

/// A pass: IR -> IR on a module (the default), or one step of a compilation. Each module pass
/// lives in its own file in `passes/` with a `//!` doc stating what it requires, what it
/// guarantees and what it invalidates; [`Pass::info`] states the checkable part of that as data.
pub trait Pass<U: ?Sized = Module>: Send + Sync {
    /// The contract.
    fn info(&self) -> &'static PassInfo;
    /// The CLI name (`shape-infer`).
    fn name(&self) -> &'static str {
        self.info().name
    }
    /// One line for `--list-passes`.
    fn summary(&self) -> &'static str {
        self.info().summary
    }
    /// Run on the unit. An error stops the pipeline.
    fn run(&self, unit: &mut U, stats: &mut Stats) -> Result<()>;
}

impl<U: ?Sized> std::fmt::Debug for dyn Pass<U> {
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
pub struct PassManager<U: ?Sized = Module> {
    passes: Vec<Box<dyn Pass<U>>>,
    /// Run the verifier after every pass (on by default).
    pub verify_each: bool,
    /// When to print.
    pub print_ir: PrintIr,
}

impl<U: IrUnit + ?Sized> PassManager<U> {
    /// A pipeline of the given passes, verifying after each.
    pub fn new(passes: Vec<Box<dyn Pass<U>>>) -> Self {
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

    /// Declared contracts of the passes, in order.
    pub fn infos(&self) -> Vec<&'static PassInfo> {
        self.passes.iter().map(|p| p.info()).collect()
    }

    /// Run every pass in order. After each pass the verifier runs (if enabled) on the IR the
    /// pass made or changed ([`IrUnit::ir_since`]), then, when the print option asks for the
    /// pass, `print` is called with the pass name, each of those modules' labels (a module pass:
    /// its name again) and the module. The first error stops the pipeline and is returned wrapped
    /// with the pass name.
    pub fn run(
        &self,
        module: &mut U,
        print: &mut dyn FnMut(&str, &str, &Module),
    ) -> Result<Vec<PassRecord>> {
        let mut records = Vec::with_capacity(self.passes.len());
        // Module attributes a pass of this pipeline invalidated, with that pass's name.
        let mut stale: BTreeMap<&'static str, &'static str> = BTreeMap::new();
        for pass in &self.passes {
            let info = pass.info();
            check_requires(info, module, &stale).map_err(|e| pass_error(pass.name(), e))?;
            let mut stats = Stats::default();
            let mark = module.ir_mark();
            let t0 = std::time::Instant::now();
            pass.run(module, &mut stats)
                .map_err(|e| pass_error(pass.name(), e))?;
            debug_assert!(
                stats.0.keys().all(|k| info.statistics.contains(k)),
                "pass '{}' reported undeclared statistics {:?}",
                info.name,
                stats.0.keys().collect::<Vec<_>>()
            );
            for a in info.invalidates {
                stale.insert(a, info.name);
            }
            for a in info.provides {
                stale.remove(a);
            }
            let wall = t0.elapsed();
            let made = module.ir_since(mark);
            if self.verify_each {
                for (label, m) in &made {
                    crate::verify::verify(m).map_err(|e| Error::Pass {
                        pass: pass.name().to_string(),
                        source: Box::new(Error::Verify(if label.is_empty() {
                            format!("IR is invalid after this pass: {e}")
                        } else {
                            format!("IR is invalid after this pass ({label}): {e}")
                        })),
                    })?;
                }
            }
            let want = match &self.print_ir {
                PrintIr::Never => false,
                PrintIr::AfterAll => true,
                PrintIr::After(names) => names.iter().any(|n| n == pass.name()),
            };
            if want {
                for (label, m) in made {
                    let label = if label.is_empty() { pass.name() } else { label };
                    print(pass.name(), label, m);
                }
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

/// `info.requires` against the module and what earlier passes invalidated.
fn check_requires<U: IrUnit + ?Sized>(
    info: &PassInfo,
    module: &U,
    stale: &BTreeMap<&'static str, &'static str>,
) -> Result<()> {
    for &(attr, by) in info.requires {
        if let Some(culprit) = stale.get(attr) {
            return Err(Error::msg(format!(
                "needs the {} '{attr}' from {by}, but {culprit} ran after it and \
                 invalidated it (run {by} again after {culprit})",
                module.attr_kind()
            )));
        }
        if !module.holds(attr) {
            return Err(Error::msg(format!(
                "needs the {} '{attr}' (run {by} first)",
                module.attr_kind()
            )));
        }
    }
    Ok(())
}
