//! Command implementations and the helpers they share.

pub mod compare;
pub mod compile;
pub mod grad;
pub mod inspect;
pub mod opt;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod run;
pub mod simulate;

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

pub use pipec::frontend::{
    batch_symbol, bind_dims, load_module, load_module_dims, load_module_with,
};

/// Print an error as `error: <one line>` followed by its causes, one per line.
/// A cause whose text the message above it already contains (a wrapper that prints its
/// source, as `Error::Pass` does) is not repeated.
pub fn report_error(e: &anyhow::Error) {
    let mut chain = e.chain().map(cli_text);
    let mut shown = chain.next().unwrap_or_default();
    eprintln!("error: {shown}");
    for text in chain {
        if shown.contains(&text) {
            continue;
        }
        eprintln!("  caused by: {text}");
        shown = text;
    }
}

/// An error's text as the command line says it: a planning option named by its flag.
fn cli_text(e: &(dyn std::error::Error + 'static)) -> String {
    match e.downcast_ref::<pipec_compiler::Error>() {
        Some(pipec_compiler::Error::InvalidOption { option, value, msg }) => {
            format!("{} {value}: {msg}", flag(*option))
        }
        _ => e.to_string(),
    }
}

/// The flag that sets a planning option.
fn flag(o: pipec_compiler::PlanOption) -> &'static str {
    use pipec_compiler::PlanOption::*;
    match o {
        Batch => "--batch",
        MicroBatch => "--micro-batch",
        Devices => "--devices",
        Cluster => "--cluster",
        Planner => "--planner",
        Stages => "--stages",
        Optimizer => "--optimizer",
        DappleReference => "--dapple-reference",
    }
}

/// The help text of `--dim` (compile, plan, compare, grad).
pub const DIM_HELP: &str = "Size of a symbolic input dim other than the batch, as NAME=VALUE \
(repeatable), e.g. `--dim sequence_length=16000` for an input float32[batch,128,sequence_length]. \
Training and planning need every dim but the batch known";

/// Parse `--dim NAME=VALUE` flags.
pub fn parse_dims(flags: &[String]) -> Result<BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for f in flags {
        let Some((k, v)) = f.split_once('=') else {
            bail!("--dim {f}: expected NAME=VALUE");
        };
        let k = k.trim();
        let v: i64 = match v.trim().parse() {
            Ok(v) if v >= 1 && !k.is_empty() => v,
            _ => bail!("--dim {f}: expected NAME=VALUE with a name and VALUE >= 1"),
        };
        if out.insert(k.to_string(), v).is_some_and(|old| old != v) {
            bail!("--dim {k}: given twice with different values");
        }
    }
    Ok(out)
}

/// Write `contents` to `path` atomically: a temporary file next to it, then a rename, so a failed
/// run never leaves a partial output.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    std::fs::write(&tmp, contents).with_context(|| format!("{}: cannot write", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: cannot write", path.display())
    })?;
    Ok(())
}
