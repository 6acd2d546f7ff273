//! `pipec opt FILE [--passes P1,P2,...] [--print-ir-after-all] [--print-ir-after NAME] [-o OUT]`:
//! like `mlir-opt` (cli.md).

use anyhow::{bail, Result};
use clap::Args;
use pipec_compiler::passmgr::{PassManager, PrintIr};
use pipec_compiler::text::{self, PrintOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Run passes over a model and print the resulting IR (MLIR generic syntax).
///
/// FILE is ONNX or textual IR (`.mlir`). It is imported (or parsed), shape-inferred and verified;
/// then the passes named by `--passes` run in order, with the verifier after each. The IR is
/// printed to stdout or to OUT. Weights stay out of the text: tensors with more than 16 elements
/// print as `dense_resource<NAME>`. The output is accepted by `mlir-opt
/// --allow-unregistered-dialect` and parses back to the same text.
#[derive(Args, Debug)]
pub struct OptArgs {
    /// The input: `.onnx` or `.mlir`.
    #[arg(required_unless_present = "list_passes")]
    pub file: Option<PathBuf>,
    /// Comma-separated pipeline, e.g. `shape-infer,fold-constants,dce`. Options in MLIR style,
    /// space-separated: `autodiff{loss=sum},optimizer{type=adam lr=0.001}`.
    #[arg(long, value_delimiter = ',')]
    pub passes: Vec<String>,
    /// Print the IR to stderr after every pass.
    #[arg(long)]
    pub print_ir_after_all: bool,
    /// Print the IR to stderr after the named pass (repeatable).
    #[arg(long, value_name = "NAME")]
    pub print_ir_after: Vec<String>,
    /// Write the IR here instead of stdout (written atomically).
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// List the passes: a one-line summary each, then their options (kind, default), statistics,
    /// the module attributes they require, provide and invalidate; then exit.
    #[arg(long)]
    pub list_passes: bool,
    /// Print per-pass wall time and statistics to stderr.
    #[arg(long)]
    pub timing: bool,
    /// Skip the verifier between passes (it still runs after import).
    #[arg(long)]
    pub no_verify: bool,
    /// Include the weights in the text as an MLIR `dialect_resources` section.
    #[arg(long)]
    pub emit_resources: bool,
}

/// Run the command.
pub fn run(a: OptArgs) -> Result<ExitCode> {
    let registry = pipec_passes::registry();
    if a.list_passes {
        let width = registry.iter().map(|p| p.name().len()).max().unwrap_or(0);
        for p in &registry {
            print!("{}", p.info().describe(width));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(file) = a.file else {
        bail!("missing FILE (see `pipec opt --help`)");
    };
    let mut passes = Vec::new();
    for spec in a.passes.iter().filter(|n| !n.is_empty()) {
        let name = spec.split('{').next().unwrap_or(spec);
        if pipec_passes::lookup(name).is_none() {
            bail!(
                "--passes: unknown pass '{name}' (known: {})",
                registry
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let pass = pipec_passes::lookup_spec(spec).map_err(|e| anyhow::anyhow!("--passes: {e}"))?;
        passes.push(pass);
    }
    for name in &a.print_ir_after {
        if !a
            .passes
            .iter()
            .any(|p| p.split('{').next() == Some(name.as_str()))
        {
            bail!("--print-ir-after: pass '{name}' is not in the pipeline");
        }
    }
    let t0 = std::time::Instant::now();
    let mut module = super::load_module(&file)?;
    let load_time = t0.elapsed();
    let mut pm = PassManager::new(passes);
    pm.verify_each = !a.no_verify;
    pm.print_ir = if a.print_ir_after_all {
        PrintIr::AfterAll
    } else if !a.print_ir_after.is_empty() {
        PrintIr::After(a.print_ir_after.clone())
    } else {
        PrintIr::Never
    };
    let opts = PrintOptions {
        emit_resources: a.emit_resources,
        ..PrintOptions::default()
    };
    let mut printer = |name: &str, _: &str, m: &pipec_compiler::ir::Module| {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "// -----// IR Dump After {name} //----- //");
        let _ = err.write_all(text::print_with(m, &opts).as_bytes());
    };
    let records = pm.run(&mut module, &mut printer)?;
    if a.timing {
        print_timing(&records, Some(load_time), t0.elapsed());
    }
    let out = text::print_with(&module, &opts);
    match a.output {
        Some(path) => super::write_atomic(&path, out.as_bytes())?,
        None => std::io::stdout().lock().write_all(out.as_bytes())?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `--timing`: each pass's wall time and statistics on stderr (after the import's, when given).
pub fn print_timing(
    records: &[pipec_compiler::passmgr::PassRecord],
    import: Option<std::time::Duration>,
    total: std::time::Duration,
) {
    eprintln!("===- pass timing -===");
    if let Some(t) = import {
        eprintln!("{:>10.3} ms  import + verify", t.as_secs_f64() * 1e3);
    }
    for r in records {
        let stats = r
            .stats
            .0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        eprintln!(
            "{:>10.3} ms  {}  {}",
            r.wall.as_secs_f64() * 1e3,
            r.name,
            stats
        );
    }
    eprintln!("{:>10.3} ms  total", total.as_secs_f64() * 1e3);
}
