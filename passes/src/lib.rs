//! IR -> IR passes of pipec, one per file. Each file opens with its contract (requires,
//! guarantees, invalidates, statistics); [`registry`] lists them all for the CLI and the pass
//! manager.

pub mod autodiff;
pub mod codegen;
pub mod cost;
pub mod dce;
pub mod fold_constants;
pub mod loss;
pub mod lower;
pub mod optimizer;
pub mod partition_gpp;
pub mod plan;
pub mod planners;
pub mod schedule_gpp;
pub mod shape_infer;
pub mod sim;
pub mod sp_decompose;
pub mod split_layer;

pub use autodiff::Autodiff;
pub use dce::Dce;
pub use fold_constants::FoldConstants;
pub use lower::Lower;
pub use optimizer::Optimizer;
pub use shape_infer::ShapeInfer;

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
/// (space-separated, so the spec survives a comma-separated pipeline):
/// - `autodiff{loss=mean-square|sum|cross-entropy:LABEL|none wrt-inputs=true|false}`
///   (`none`: the first output already is the 0-D loss);
/// - `optimizer{type=sgd|adam micro-batches=M lr=.. momentum=.. weight_decay=.. beta1=..
///   beta2=.. eps=..}`;
/// - `partition-gpp{cluster=C devices=N batch=B micro-batch=b schedule=gpp|kfkb-K|gpp-per-stage}`
///   (each sets the module attribute `pipec.<key>` the GPP passes read, `micro-batch` →
///   `pipec.micro_batch`);
/// - every other pass takes no options.
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
    let bad = |k: &str| Error::Usage(format!("pass '{name}': unknown option '{k}'"));
    let flag = |k: &str, v: &str| match v {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(Error::Usage(format!(
            "pass '{name}': option '{k}' must be true or false"
        ))),
    };
    match name {
        "autodiff" => {
            let mut a = Autodiff::default();
            for (k, v) in &kv {
                match k.as_str() {
                    "loss" if v == "none" => a.loss = None,
                    "loss" => a.loss = Some(v.parse()?),
                    "wrt-inputs" => a.wrt_inputs = flag(k, v)?,
                    _ => return Err(bad(k)),
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
                            Error::Usage(format!("pass 'optimizer': micro-batches '{v}'"))
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
            let mut set = Vec::new();
            for (k, v) in &kv {
                let int = || {
                    v.parse::<i64>()
                        .ok()
                        .filter(|&x| x >= 1)
                        .map(Attr::Int)
                        .ok_or_else(|| {
                            Error::Usage(format!(
                                "pass 'partition-gpp': {k}={v} must be an integer >= 1"
                            ))
                        })
                };
                let (key, attr) = match k.as_str() {
                    "cluster" => ("pipec.cluster", Attr::String(v.clone())),
                    "devices" => ("pipec.devices", int()?),
                    "batch" => ("pipec.batch", int()?),
                    "micro-batch" => ("pipec.micro_batch", int()?),
                    "schedule" => ("pipec.schedule", Attr::String(v.clone())),
                    _ => return Err(bad(k)),
                };
                set.push((key.to_string(), attr));
            }
            Ok(Box::new(partition_gpp::PartitionGpp { set }))
        }
        _ => {
            let p = lookup(name).ok_or_else(|| Error::Usage(format!("unknown pass '{name}'")))?;
            match kv.first() {
                Some((k, _)) => Err(bad(k)),
                None => Ok(p),
            }
        }
    }
}
