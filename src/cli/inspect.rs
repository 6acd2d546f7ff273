//! `pipec inspect MODEL [--json]`: a summary of a model (cli.md).

use anyhow::Result;
use clap::Args;
use pipec_compiler::ir::{Dim, Module, TensorType, Value};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// Summarise a model: node count, op-type histogram, parameters, inputs and outputs with shapes,
/// nodes whose output has several consumers, and whether the graph is series-parallel.
///
/// MODEL is an ONNX file (external data next to it allowed) or textual IR (`.mlir`).
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The model: `.onnx` or `.mlir`.
    pub model: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the import time and read speed (file bytes per second) to stderr.
    #[arg(long)]
    pub timing: bool,
}

/// One graph input or output.
#[derive(Serialize, Debug)]
pub struct Port {
    pub name: String,
    pub dtype: String,
    /// Ints for static dims, strings for symbolic ones.
    pub shape: Option<Vec<serde_json::Value>>,
}

/// Shape knowledge over every op result: static, symbolic (named symbols from the graph inputs,
/// e.g. `batch`), or unknown (unranked, or a size inference had to make up).
#[derive(Serialize, Debug, Default)]
pub struct ShapeSummary {
    pub values: usize,
    pub static_values: usize,
    pub symbolic_values: usize,
    pub unknown_values: usize,
    /// Named symbols that appear in result shapes, sorted.
    pub symbols: Vec<String>,
}

fn shape_summary(m: &Module) -> ShapeSummary {
    let g = &m.graph;
    let mut s = ShapeSummary::default();
    let mut symbols = std::collections::BTreeSet::new();
    for &op in &g.order {
        for &v in &g.ops[op].outputs {
            s.values += 1;
            let ty = g.ty(v);
            let Some(shape) = &ty.shape else {
                s.unknown_values += 1;
                continue;
            };
            if shape.iter().any(pipec_compiler::shape::is_fresh_symbol) {
                s.unknown_values += 1;
            } else if shape.iter().all(|d| d.known().is_some()) {
                s.static_values += 1;
            } else {
                s.symbolic_values += 1;
                for d in shape {
                    if let Dim::Sym(sd) = d {
                        symbols.extend(sd.syms.iter().cloned());
                    }
                }
            }
        }
    }
    s.symbols = symbols.into_iter().collect();
    s
}

/// What `inspect --json` prints.
#[derive(Serialize, Debug)]
pub struct Summary {
    pub nodes: usize,
    pub parameters: u64,
    pub parameter_bytes: u64,
    pub initializers: usize,
    pub op_types: BTreeMap<String, usize>,
    pub inputs: Vec<Port>,
    pub outputs: Vec<Port>,
    /// Nodes with at least one output read by more than one consumer.
    pub multi_consumer_nodes: usize,
    pub series_parallel: bool,
    /// How well shapes are known over all op results.
    pub shapes: ShapeSummary,
    pub opset: i64,
    pub ir_version: i64,
    pub producer: String,
}

fn port(m: &Module, v: Value) -> Port {
    let ty: &TensorType = m.graph.ty(v);
    Port {
        name: m.graph.name(v).to_string(),
        dtype: ty.dtype.name().to_string(),
        shape: ty.shape.as_ref().map(|s| {
            s.iter()
                .map(|d| match d {
                    Dim::Known(k) => serde_json::Value::from(*k),
                    Dim::Sym(_) => serde_json::Value::from(d.to_string()),
                })
                .collect()
        }),
    }
}

/// Compute the summary of a loaded module.
pub fn summarize(m: &Module) -> Summary {
    let g = &m.graph;
    let mut op_types = BTreeMap::new();
    for &op in &g.order {
        *op_types.entry(g.ops[op].op_type.clone()).or_insert(0) += 1;
    }
    let (mut parameters, mut parameter_bytes) = (0u64, 0u64);
    for t in g.initializers.values() {
        if t.dtype.is_float() {
            let n = t.numel().unwrap_or(0);
            parameters += n;
            parameter_bytes += t.dtype.bytes_for(n).unwrap_or(0);
        }
    }
    let uses = g.uses();
    let multi_consumer_nodes = g
        .order
        .iter()
        .filter(|op| {
            g.ops[**op].outputs.iter().any(|v| {
                let mut users: Vec<_> = uses[*v].iter().map(|(u, _)| *u).collect();
                users.dedup();
                users.len() + usize::from(g.outputs.contains(v)) > 1
            })
        })
        .count();
    Summary {
        nodes: g.order.len(),
        parameters,
        parameter_bytes,
        initializers: g.initializers.len(),
        op_types,
        inputs: g.inputs.iter().map(|v| port(m, *v)).collect(),
        outputs: g.outputs.iter().map(|v| port(m, *v)).collect(),
        multi_consumer_nodes,
        series_parallel: pipec_compiler::analysis::is_series_parallel(g),
        shapes: shape_summary(m),
        opset: m.opset(),
        ir_version: m.ir_version,
        producer: m.producer_name.clone(),
    }
}

fn fmt_port(p: &Port) -> String {
    let shape = match &p.shape {
        None => "*".to_string(),
        Some(s) => s
            .iter()
            .map(|d| match d {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!("{}: {}[{}]", p.name, p.dtype, shape)
}

/// Run the command.
pub fn run(a: InspectArgs) -> Result<ExitCode> {
    let t0 = Instant::now();
    let m = super::load_module_with(&a.model, false)?;
    let elapsed = t0.elapsed();
    if a.timing {
        let size = std::fs::metadata(&a.model).map(|md| md.len()).unwrap_or(0);
        let secs = elapsed.as_secs_f64();
        eprintln!(
            "import: {:.3} ms for {} bytes ({:.2} GB/s)",
            secs * 1e3,
            size,
            size as f64 / secs.max(1e-9) / 1e9
        );
    }
    let s = summarize(&m);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("model:       {}", a.model.display());
    println!(
        "producer:    {} (ir_version {}, opset {})",
        if s.producer.is_empty() {
            "?"
        } else {
            &s.producer
        },
        s.ir_version,
        s.opset
    );
    println!("nodes:       {}", s.nodes);
    println!(
        "parameters:  {} ({} bytes) in {} initializers",
        s.parameters, s.parameter_bytes, s.initializers
    );
    println!("multi-consumer nodes: {}", s.multi_consumer_nodes);
    println!(
        "shapes:      {} results: {} static, {} symbolic ({}), {} unknown",
        s.shapes.values,
        s.shapes.static_values,
        s.shapes.symbolic_values,
        s.shapes.symbols.join(", "),
        s.shapes.unknown_values
    );
    println!(
        "series-parallel: {}",
        if s.series_parallel { "yes" } else { "no" }
    );
    println!("inputs:");
    for p in &s.inputs {
        println!("  {}", fmt_port(p));
    }
    println!("outputs:");
    for p in &s.outputs {
        println!("  {}", fmt_port(p));
    }
    println!("op types:");
    let mut hist: Vec<_> = s.op_types.iter().collect();
    hist.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    for (t, n) in hist {
        println!("  {n:>6}  {t}");
    }
    Ok(ExitCode::SUCCESS)
}
