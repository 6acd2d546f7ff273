//! `pipec`: the pipeline compiler's command-line interface. The contract (commands, flags, JSON
//! fields, exit codes) is `shared/spec/cli.md`; each command lives in its own file under `cli/`.

mod cli;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// `pipec --version`: the version and the optional cargo features of this build (scripts ask
/// it whether `--backend mpi` or `--device cuda` can work), e.g. `0.1.0 (features: mpi cuda)`.
fn version() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let on: Vec<&str> = [
            ("mlir", cfg!(feature = "mlir")),
            ("mpi", cfg!(feature = "mpi")),
            ("cuda", cfg!(feature = "cuda")),
        ]
        .into_iter()
        .filter_map(|(n, on)| on.then_some(n))
        .collect();
        if on.is_empty() {
            format!("{} (no optional features)", env!("CARGO_PKG_VERSION"))
        } else {
            format!("{} (features: {})", env!("CARGO_PKG_VERSION"), on.join(" "))
        }
    })
}

/// pipec — a pipeline compiler for training large models on many accelerators.
///
/// Imports an ONNX model into a verified IR, transforms it pass by pass and (in later commands)
/// partitions it into pipeline stages. Exit codes: 0 success, 1 a requested check failed,
/// 2 bad input or usage.
#[derive(Parser, Debug)]
#[command(name = "pipec", version = version(), about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    Inspect(cli::inspect::InspectArgs),
    Opt(cli::opt::OptArgs),
    Plan(cli::plan::PlanArgs),
    Grad(cli::grad::GradArgs),
    Compare(cli::compare::CompareArgs),
    Compile(cli::compile::CompileArgs),
    Run(cli::run::RunArgs),
    Simulate(cli::simulate::SimulateArgs),
    Profile(cli::profile::ProfileArgs),
}

/// mimalloc instead of glibc's malloc: the planners' searches are allocation-heavy (small
/// vectors per DP state, per simulated event) and glibc's malloc/free was a fifth of a 4-GPU
/// GraphPipe search (BENCHMARKS.md, "GraphPipe"). It also keeps freed tensor memory in the
/// process for the executors' next ops (glibc returned large blocks to the kernel, so every
/// op's outputs page-faulted in again unless tuned with `mallopt`): a one-stage gpt2_tiny run of
/// 30 steps takes 2,065 page faults with it against 5,162 with glibc tuned.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => cli::inspect::run(a),
        Command::Opt(a) => cli::opt::run(a),
        Command::Plan(a) => cli::plan::run(a),
        Command::Grad(a) => cli::grad::run(a),
        Command::Compare(a) => cli::compare::run(a),
        Command::Compile(a) => cli::compile::run(a),
        Command::Run(a) => cli::run::run(a),
        Command::Simulate(a) => cli::simulate::run(a),
        Command::Profile(a) => cli::profile::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            cli::report_error(&e);
            ExitCode::from(2)
        }
    }
}
