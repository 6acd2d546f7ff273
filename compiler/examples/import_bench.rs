//! Import benchmark: loads an ONNX file N times and prints the mean wall time and the throughput
//! in GB/s of file size (external data not counted).
//!
//! ```text
//! cargo run --release -p pipec-compiler --example import_bench -- MODEL.onnx [N] [--export]
//! ```
//!
//! With `--export`, each iteration also serializes the module back to ONNX bytes (timed apart).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let mut path = None;
    let mut n = 10usize;
    let mut export = false;
    for a in std::env::args().skip(1) {
        if a == "--export" {
            export = true;
        } else if path.is_none() {
            path = Some(PathBuf::from(a));
        } else if let Ok(v) = a.parse() {
            n = v;
        } else {
            eprintln!("import_bench: bad argument '{a}'");
            return ExitCode::from(2);
        }
    }
    let Some(path) = path else {
        eprintln!("usage: import_bench MODEL.onnx [N] [--export]");
        return ExitCode::from(2);
    };
    let n = n.max(1);
    let size = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let mut load_times = Vec::with_capacity(n);
    let mut export_times = Vec::with_capacity(n);
    let mut summary = String::new();
    for _ in 0..n {
        let t = Instant::now();
        let m = match pipec_compiler::onnx::load(&path) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        };
        load_times.push(t.elapsed());
        if export {
            let t = Instant::now();
            match pipec_compiler::onnx::to_bytes(&m) {
                Ok(b) => std::hint::black_box(b),
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            };
            export_times.push(t.elapsed());
        }
        if summary.is_empty() {
            let bytes: usize = m.graph.initializers.values().map(|t| t.byte_len()).sum();
            summary = format!(
                "{} ops, {} initializers ({:.1} MB)",
                m.graph.order.len(),
                m.graph.initializers.len(),
                bytes as f64 / 1e6
            );
        }
    }
    println!("{}: {:.1} MB, {summary}", path.display(), size as f64 / 1e6);
    report("import", &load_times, size);
    if export {
        report("export", &export_times, size);
    }
    ExitCode::SUCCESS
}

fn report(what: &str, times: &[Duration], size: u64) {
    let total: Duration = times.iter().sum();
    let mean = total.as_secs_f64() / times.len() as f64;
    let min = times
        .iter()
        .min()
        .copied()
        .unwrap_or_default()
        .as_secs_f64();
    println!(
        "{what}: {} runs, mean {:.3} ms, min {:.3} ms, {:.2} GB/s (mean)",
        times.len(),
        mean * 1e3,
        min * 1e3,
        size as f64 / mean / 1e9
    );
}
