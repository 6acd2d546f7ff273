//! pipec's passes crate, in layers (ARCHITECTURE.md): IR → IR transforms (`transforms/`), the cost
//! model (`cost/`), the planning vocabulary (`stage.rs`), the simulator (`sim/`), the plan
//! (`plan.rs`), the planners (`planners/`), codegen (`codegen/`) and GraphPipe's IR passes
//! (`graphpipe/`). Each pass file opens with its contract (requires, guarantees, invalidates,
//! statistics); [`registry`] lists the passes for the CLI and the pass manager.

pub mod codegen;
pub mod cost;
pub mod graphpipe;
pub mod plan;
pub mod planners;
pub mod sim;
pub mod stage;
pub mod transforms;

// The passes' modules at the crate root too: the paths the CLI, the runtime and the tests use.
pub use graphpipe::{gpp_ir, partition_gpp, schedule_gpp, sp_decompose};
pub use transforms::{
    autodiff, dce, fold_constants, loss, lower, optimizer, shape_infer, split_layer,
};

pub use transforms::autodiff::Autodiff;
pub use transforms::dce::Dce;
pub use transforms::fold_constants::FoldConstants;
pub use transforms::lower::Lower;
pub use transforms::optimizer::Optimizer;
pub use transforms::shape_infer::ShapeInfer;

use pipec_compiler::passmgr::Pass;

/// Every pass, in the order `--list-passes` prints them (roughly the order a pipeline runs them).
pub fn registry() -> Vec<Box<dyn Pass>> {
    vec![
        // Analyses that refine types go first.
        Box::new(ShapeInfer),
        // Canonicalization.
        Box::new(FoldConstants),
        Box::new(Dce),
        // Lowering of ops with no kernel / gradient rule.
        Box::new(Lower),
        // Training.
        Box::new(Autodiff::default()),
        Box::new(Optimizer::default()),
        // GraphPipe (issue 5).
        Box::new(sp_decompose::SpDecompose),
        Box::new(partition_gpp::PartitionGpp::default()),
        Box::new(schedule_gpp::ScheduleGpp),
    ]
}

/// The pass named `name` (its CLI name), if any.
pub fn lookup(name: &str) -> Option<Box<dyn Pass>> {
    registry().into_iter().find(|p| p.name() == name)
}

/// A pass from a spec with MLIR-style options, `name` or `name{key=value key=value}`
/// (space-separated, so the spec survives a comma-separated pipeline). The options a pass takes,
/// their kinds and defaults are its contract's ([`Pass::info`], printed by `pipec opt
/// --list-passes`): `autodiff{loss=... wrt-inputs=...}`, `optimizer{type=sgd|adam
/// micro-batches=M lr=.. ...}`, `partition-gpp{cluster=C devices=N batch=B micro-batch=b
/// schedule=...}` (each sets the module attribute `pipec.<key>` the GPP passes read,
/// `micro-batch` → `pipec.micro_batch`); the other passes take none.
pub fn lookup_spec(spec: &str) -> pipec_compiler::Result<Box<dyn Pass>> {
    use pipec_compiler::error::Error;
    let (name, opts) = match spec.split_once('{') {
        Some((n, rest)) => {
            let inner = rest
                .strip_suffix('}')
                .ok_or_else(|| Error::Usage(format!("pass spec '{spec}': missing '}}'")))?;
            (n.trim(), inner)
        }
        None => (spec.trim(), ""),
    };
    let mut kv = Vec::new();
    for part in opts.split_whitespace() {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            Error::Usage(format!("pass '{name}': option '{part}' is not KEY=VALUE"))
        })?;
        kv.push((k.to_string(), v.to_string()));
    }
    let pass = lookup(name).ok_or_else(|| Error::Usage(format!("unknown pass '{name}'")))?;
    // Keys, and values by kind, are checked against the contract; what is left is how each
    // option configures its pass.
    pass.info().parse_options(&kv)?;
    match name {
        "autodiff" => {
            let mut a = Autodiff::default();
            for (k, v) in &kv {
                match (k.as_str(), v.as_str()) {
                    ("loss", "none") => a.loss = None,
                    ("loss", _) => a.loss = Some(v.parse()?),
                    (_, v) => a.wrt_inputs = matches!(v, "true" | "1"),
                }
            }
            Ok(Box::new(a))
        }
        "optimizer" => {
            let mut kind = "sgd".to_string();
            let mut micro = 1u32;
            let mut hyper = Vec::new();
            for (k, v) in &kv {
                match k.as_str() {
                    "type" => kind = v.clone(),
                    "micro-batches" => {
                        micro = v.parse().map_err(|_| {
                            Error::Usage(format!(
                                "pass 'optimizer': micro-batches={v} is too large"
                            ))
                        })?
                    }
                    _ => hyper.push(format!("{k}={v}")),
                }
            }
            let k: optimizer::OptimizerKind = format!("{kind}:{}", hyper.join(",")).parse()?;
            Ok(Box::new(Optimizer::new(k, micro)))
        }
        "partition-gpp" => {
            use pipec_compiler::ir::Attr;
            let set = kv
                .iter()
                .map(|(k, v)| {
                    let int = || Attr::Int(v.parse::<i64>().unwrap_or(1));
                    let (key, attr) = match k.as_str() {
                        "cluster" => ("pipec.cluster", Attr::String(v.clone())),
                        "devices" => ("pipec.devices", int()),
                        "batch" => ("pipec.batch", int()),
                        "micro-batch" => ("pipec.micro_batch", int()),
                        _ => ("pipec.schedule", Attr::String(v.clone())),
                    };
                    (key.to_string(), attr)
                })
                .collect();
            Ok(Box::new(partition_gpp::PartitionGpp { set }))
        }
        _ => Ok(pass),
    }
}
