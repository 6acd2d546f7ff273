//! `partition-gpp`: the IR pass of GraphPipe's stage partitioner (Jeon et al., ASPLOS'25, §5,
//! Algorithm 1). The search itself is [`crate::planners::gpp`]'s `units`, `dp` and `search` (re-exported here).
//!
//! # IR pass
//! [`PartitionGpp`] (`partition-gpp`) plans the module with the `gpp` planner (cluster, device
//! count and batch from the module attributes `pipec.cluster` (default `summit`),
//! `pipec.devices` (default 4), `pipec.batch` (default 32) and optional
//! `pipec.micro_batch` and `pipec.schedule` (`gpp`, `kfkb-K`, `gpp-per-stage`)), and annotates
//! every op with `pipec.stage`, and the module with `pipec.micro_batch` and, per stage `i`,
//! `pipec.stage{i}.devices` (and, for `gpp-per-stage`, `pipec.stage{i}.micro_batch` and
//! `pipec.stage{i}.k`).
//!
use pipec_compiler::passmgr::{OptionKind, PassInfo, PassOption};
use pipec_compiler::Result;

pub use crate::graphpipe::gpp_ir as ir;
pub use crate::planners::gpp::dp::*;
pub use crate::planners::gpp::search::*;
pub use crate::planners::gpp::units::*;

/// The `partition-gpp` IR pass (see the module doc).
#[derive(Default)]
pub struct PartitionGpp {
    /// Module attributes set before planning (the pass's options, `partition-gpp{devices=8}`).
    pub set: Vec<(String, pipec_compiler::ir::Attr)>,
}

/// The contract of `partition-gpp` (`--list-passes`, the option parser, the pass manager's checks).
pub static INFO: PassInfo = PassInfo {
    name: "partition-gpp",
    summary: "GraphPipe stage partitioner (Algorithm 1): annotate ops with pipec.stage, stages with devices",
    options: &[
        PassOption {
            name: "cluster",
            kind: OptionKind::Text,
            default: "summit",
            help: "the cluster: a preset, a TOML file or N1@BW1,N2@BW2,...",
        },
        PassOption {
            name: "devices",
            kind: OptionKind::Count,
            default: "4",
            help: "devices to plan for",
        },
        PassOption {
            name: "batch",
            kind: OptionKind::Count,
            default: "32",
            help: "global mini-batch",
        },
        PassOption {
            name: "micro-batch",
            kind: OptionKind::Count,
            default: "",
            help: "micro-batch size (default: the planner's choice)",
        },
        PassOption {
            name: "schedule",
            kind: OptionKind::Text,
            default: "gpp",
            help: "gpp, kfkb-K or gpp-per-stage",
        },
    ],
    statistics: &["depth", "micro-batch", "stages"],
    requires: &[],
    provides: &["pipec.stages"],
    invalidates: &[],
};

impl pipec_compiler::passmgr::Pass for PartitionGpp {
    fn info(&self) -> &'static PassInfo {
        &INFO
    }
    fn run(
        &self,
        module: &mut pipec_compiler::ir::Module,
        stats: &mut pipec_compiler::passmgr::Stats,
    ) -> Result<()> {
        use crate::planners::Planner;
        use pipec_compiler::ir::Attr;
        for (k, v) in &self.set {
            module.attrs.insert(k.clone(), v.clone());
        }
        let g = ir::cost_graph(module)?;
        let cfg = ir::IrConfig::from_module(module, &g)?;
        let mut opts = crate::plan::PlanOptions::new(cfg.batch);
        opts.set_micro_batch(cfg.micro_batch)?;
        opts.schedule = cfg.schedule;
        // Algorithm 1 on all the devices (the pass is the paper's partitioner; the `gpp`
        // planner's extra candidates, fewer devices and sequential planners' plans, are not).
        let algorithm1 = crate::planners::gpp::Gpp {
            seeds: false,
            ..Default::default()
        };
        let plan = algorithm1.plan(&g, &cfg.cluster, &opts)?;
        let specs = plan.specs();
        let order = module.graph.order.clone();
        for (s, sp) in specs.iter().enumerate() {
            for &n in &sp.nodes {
                if let Some(&op) = order.get(n) {
                    module.graph.ops[op]
                        .attrs
                        .insert("pipec.stage".into(), Attr::Int(s as i64));
                }
            }
            module.attrs.insert(
                format!("pipec.stage{s}.devices"),
                Attr::Ints(sp.devices.iter().map(|&d| d as i64).collect()),
            );
            // gpp-per-stage: the stage's own micro-batch size and k.
            let st = &plan.stages[s];
            if let (Some(b), Some(k)) = (st.micro_batch, st.group) {
                module
                    .attrs
                    .insert(format!("pipec.stage{s}.micro_batch"), Attr::Int(b as i64));
                module
                    .attrs
                    .insert(format!("pipec.stage{s}.k"), Attr::Int(k as i64));
            }
        }
        if cfg.schedule.is_some() {
            module
                .attrs
                .insert("pipec.schedule".into(), Attr::String(plan.schedule.label()));
        }
        module.attrs.insert(
            "pipec.micro_batch".into(),
            Attr::Int(plan.micro_batch.size() as i64),
        );
        module
            .attrs
            .insert("pipec.batch".into(), Attr::Int(plan.batch() as i64));
        module
            .attrs
            .insert("pipec.stages".into(), Attr::Int(specs.len() as i64));
        stats.add("stages", specs.len() as u64);
        stats.add("depth", plan.pipeline_depth as u64);
        stats.add("micro-batch", plan.micro_batch.size());
        Ok(())
    }
}
