//! Filetests: textual IR in, textual IR (or a diagnostic) out, checked the way MLIR's tests are.
//!
//! Every `tests/filetests/<group>/*.mlir` carries its own commands and expectations:
//!
//! ```text
//! // RUN: pipec opt %s --passes=dce | FileCheck %s
//! // RUN: not pipec opt %s --passes=bogus 2>&1 | FileCheck %s --check-prefix=ERR
//! // CHECK: "onnx.Relu"
//! // CHECK-NOT: "onnx.Neg"
//! // ERR: unknown pass 'bogus'
//! ```
//!
//! A RUN line is `[not] pipec ARGS [2>&1] | FileCheck %s [--check-prefix=P]` (a RUN line may be
//! continued with a trailing `\`). `%s` is the file itself, `%S` its folder (inputs that textual
//! IR cannot hold, such as ONNX models with subgraphs, live in `<group>/Inputs/`). Without `not` the command must exit
//! 0; with `not` it must exit 2, pipec's status for bad input (and must not panic). Without
//! `2>&1` only stdout is checked; with it, stderr followed by stdout. The checks are LLVM
//! FileCheck's (`CHECK`, `CHECK-NEXT`, `CHECK-SAME`, `CHECK-NOT`, `CHECK-DAG`,
//! `CHECK-LABEL`, `{{regex}}`, `[[VAR:regex]]` / `[[VAR]]`), matched by the `litcheck-filecheck`
//! crate, whose reports point at the failing check and the output it searched.
//!
//! Groups: one folder per registered pass (named as `pipec opt --list-passes` names it; the test
//! `every_pass_has_filetests` keeps the two lists equal) and `diagnostics/`, one file per class
//! of error the IR path reports (`every_diagnostic_class_has_a_filetest`).
//!
//! Run one file: `cargo test --test filetests -- --nocapture` prints each file as it runs;
//! `PIPEC_FILETEST=dce cargo test --test filetests` runs only files whose path contains `dce`.

mod common;

use litcheck_filecheck::litcheck::reporting::PrintDiagnostic;
use litcheck_filecheck::litcheck::Symbol;
use litcheck_filecheck::{Config, Test};
use std::path::{Path, PathBuf};
use std::process::Command;

const PIPEC: &str = env!("CARGO_BIN_EXE_pipec");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests")
}

/// Every `.mlir` file under `tests/filetests`, sorted.
fn files() -> Vec<PathBuf> {
    let root = root();
    common::files_under(&root)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "mlir"))
        .map(|p| root.join(p))
        .collect()
}

/// One RUN line, parsed.
#[derive(Debug)]
struct Run {
    line: usize,
    expect_failure: bool,
    args: Vec<String>,
    merge_stderr: bool,
    prefix: String,
}

/// The RUN lines of a file (`\` at the end of a line continues it on the next RUN line).
fn runs(path: &Path, text: &str) -> Result<Vec<Run>, String> {
    let file = path.display().to_string();
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, l) in text.lines().enumerate() {
        let Some(cmd) = l.trim_start().strip_prefix("// RUN:") else {
            if let Some((n, _)) = pending {
                return Err(format!(
                    "{file}:{}: RUN line continued by a non-RUN line",
                    n + 1
                ));
            }
            continue;
        };
        let (start, mut acc) = pending.take().unwrap_or((i, String::new()));
        let cmd = cmd.trim();
        if let Some(head) = cmd.strip_suffix('\\') {
            acc.push_str(head);
            acc.push(' ');
            pending = Some((start, acc));
            continue;
        }
        acc.push_str(cmd);
        out.push(parse_run(&file, start + 1, &acc, path)?);
    }
    if let Some((n, _)) = pending {
        return Err(format!(
            "{file}:{}: the last RUN line ends with '\\'",
            n + 1
        ));
    }
    if out.is_empty() {
        return Err(format!("{file}: no RUN line"));
    }
    Ok(out)
}

fn parse_run(file: &str, line: usize, cmd: &str, path: &Path) -> Result<Run, String> {
    let bad = |msg: &str| format!("{file}:{line}: {msg}: {cmd}");
    let dir = path.parent().unwrap_or(Path::new("."));
    let (left, right) = cmd
        .split_once('|')
        .ok_or_else(|| bad("expected `pipec ARGS | FileCheck %s`"))?;
    let check = shlex::split(right).ok_or_else(|| bad("unbalanced quotes after '|'"))?;
    let prefix = match check.as_slice() {
        [fc, s] if fc == "FileCheck" && s == "%s" => "CHECK".to_string(),
        [fc, s, p] if fc == "FileCheck" && s == "%s" => p
            .strip_prefix("--check-prefix=")
            .ok_or_else(|| bad("the only FileCheck option is --check-prefix=P"))?
            .to_string(),
        _ => return Err(bad("expected `| FileCheck %s [--check-prefix=P]`")),
    };
    let mut words = shlex::split(left).ok_or_else(|| bad("unbalanced quotes"))?;
    let expect_failure = words.first().is_some_and(|w| w == "not");
    if expect_failure {
        words.remove(0);
    }
    if words.first().map(String::as_str) != Some("pipec") {
        return Err(bad("the command must be `pipec ...`"));
    }
    words.remove(0);
    let merge_stderr = words.last().is_some_and(|w| w == "2>&1");
    if merge_stderr {
        words.pop();
    }
    let args = words
        .into_iter()
        .map(|w| {
            w.replace("%S", &dir.display().to_string())
                .replace("%s", &path.display().to_string())
        })
        .collect();
    Ok(Run {
        line,
        expect_failure,
        args,
        merge_stderr,
        prefix,
    })
}

/// Run one file's RUN lines; the error says which line failed and why.
fn run_file(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = path.display().to_string();
    for run in runs(path, &text)? {
        let at = format!("{file}:{} (pipec {})", run.line, run.args.join(" "));
        let out = Command::new(PIPEC)
            .args(&run.args)
            .output()
            .map_err(|e| format!("{at}: cannot run pipec: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("panicked") {
            return Err(format!("{at}: pipec panicked:\n{stderr}"));
        }
        let code = out.status.code();
        match (run.expect_failure, code) {
            (false, Some(0)) | (true, Some(2)) => {}
            (false, _) => return Err(format!("{at}: exit {code:?}, expected 0:\n{stderr}")),
            (true, _) => {
                return Err(format!(
                    "{at}: exit {code:?}, expected 2 (`not`):\n{stderr}{stdout}"
                ))
            }
        }
        let input = if run.merge_stderr {
            format!("{stderr}{stdout}")
        } else {
            stdout.into_owned()
        };
        filecheck(path, &input, &run.prefix).map_err(|e| format!("{at}:\n{e}"))?;
    }
    Ok(())
}

/// Match `input` against the `PREFIX:` checks of `checks` (LLVM FileCheck semantics).
fn filecheck(checks: &Path, input: &str, prefix: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = dir.path().join("output.txt");
    std::fs::write(&out, input).map_err(|e| e.to_string())?;
    let mut config = Config::default();
    config.options.check_prefixes = vec![Symbol::intern(prefix)];
    config.options.allow_unused_prefixes = false;
    let mut test = Test::from_file(checks, &config);
    test.verify_file(&out)
        .map(|_| ())
        .map_err(|e| format!("{}", PrintDiagnostic::new(e)))
}

#[test]
fn filetests() {
    let only = std::env::var("PIPEC_FILETEST").ok();
    let mut failed = Vec::new();
    let mut ran = 0;
    for f in files() {
        if only
            .as_deref()
            .is_some_and(|o| !f.display().to_string().contains(o))
        {
            continue;
        }
        ran += 1;
        println!("filetest {}", f.display());
        if let Err(e) = run_file(&f) {
            failed.push(e);
        }
    }
    assert!(ran > 0, "no filetest ran");
    assert!(
        failed.is_empty(),
        "{} of {ran} filetests failed:\n\n{}",
        failed.len(),
        failed.join("\n\n")
    );
}

/// The folders under `tests/filetests` besides `diagnostics` are exactly the registered passes,
/// and each holds at least one test.
#[test]
fn every_pass_has_filetests() {
    let mut passes: Vec<String> = pipec_passes::registry()
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    passes.sort();
    let mut dirs: Vec<String> = std::fs::read_dir(root())
        .expect("tests/filetests")
        .filter_map(|e| {
            let p = e.ok()?.path();
            let name = p.file_name()?.to_string_lossy().into_owned();
            (p.is_dir() && name != "diagnostics").then_some(name)
        })
        .collect();
    dirs.sort();
    assert_eq!(dirs, passes, "one folder per registered pass");
    for d in &dirs {
        let n = files()
            .iter()
            .filter(|f| {
                f.parent()
                    .and_then(Path::file_name)
                    .is_some_and(|x| x == d.as_str())
            })
            .count();
        assert!(n > 0, "tests/filetests/{d}/ has no .mlir file");
    }
}

/// One file per class of diagnostic the IR path reports (`pipec_compiler::Error`'s variants
/// that textual IR can reach; `Decode` and `Io` are about files and are tested in
/// `tests/cli_errors.rs`).
#[test]
fn every_diagnostic_class_has_a_filetest() {
    for class in [
        "parse",
        "verify",
        "unknown-op",
        "shape",
        "invalid",
        "pass",
        "usage",
    ] {
        let f = root().join("diagnostics").join(format!("{class}.mlir"));
        assert!(f.exists(), "{}: missing", f.display());
    }
}

/// The harness itself: a check that does not hold fails, and a failure it reports names the
/// check file.
#[test]
fn filecheck_fails_on_a_missing_match() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("t.mlir");
    std::fs::write(
        &f,
        "// CHECK: [[X:%[a-z]+]] = \"onnx.Relu\"\n// CHECK-NEXT: onnx.Neg\"([[X]])\n",
    )
    .expect("write");
    assert!(filecheck(
        &f,
        "%a = \"onnx.Relu\"(%x)\n%b = \"onnx.Neg\"(%a)\n",
        "CHECK"
    )
    .is_ok());
    let e = filecheck(
        &f,
        "%a = \"onnx.Relu\"(%x)\n%b = \"onnx.Neg\"(%x)\n",
        "CHECK",
    )
    .unwrap_err();
    assert!(e.contains("t.mlir"), "{e}");
    let e = filecheck(&f, "%a = \"onnx.Relu\"(%x)\n%b = \"onnx.Neg\"(%a)\n", "ERR").unwrap_err();
    assert!(!e.is_empty());
}
