//! What the GraphPipe IR passes (`sp-decompose`, `partition-gpp`, `schedule-gpp`) read from a
//! module: its cost graph (node `i` = op `graph.order[i]`) and the planning inputs in its
//! attributes (`pipec.cluster`, `pipec.devices`, `pipec.batch`, `pipec.micro_batch`,
//! `pipec.schedule`). Depends only on the cost model, so the passes share it without depending
//! on each other.

use crate::cost::analytic::{from_module, AnalyticOptions};
use crate::cost::{Cluster, CostGraph};
use crate::sim::ScheduleKind;
use pipec_compiler::ir::{Attr, Module};
use pipec_compiler::{Error, Result};

/// The module's cost graph: node `i` is the op `module.graph.order[i]`.
pub fn cost_graph(module: &Module) -> Result<CostGraph> {
    from_module(module, &AnalyticOptions::default(), &module.graph.name)
}

/// Planning inputs read from the module attributes (see [`crate::graphpipe::partition_gpp::PartitionGpp`]).
pub struct IrConfig {
    pub cluster: Cluster,
    pub batch: u64,
    pub micro_batch: Option<u64>,
    /// `pipec.schedule`: `gpp` (default), `kfkb-K` or `gpp-per-stage`.
    pub schedule: Option<ScheduleKind>,
}

impl IrConfig {
    pub fn from_module(m: &Module, _g: &CostGraph) -> Result<IrConfig> {
        let name = m
            .attrs
            .get("pipec.cluster")
            .and_then(Attr::as_str)
            .unwrap_or("summit")
            .to_string();
        let devices = m
            .attrs
            .get("pipec.devices")
            .and_then(Attr::as_int)
            .unwrap_or(4);
        if devices < 1 {
            return Err(Error::Usage(format!(
                "pipec.devices = {devices}: must be >= 1"
            )));
        }
        let cluster = Cluster::resolve(&name, None)?.take(devices as usize)?;
        let batch = m
            .attrs
            .get("pipec.batch")
            .and_then(Attr::as_int)
            .map_or(32, |b| b.max(1) as u64);
        let micro_batch = m
            .attrs
            .get("pipec.micro_batch")
            .and_then(Attr::as_int)
            .map(|b| b.max(0) as u64);
        let schedule = match m.attrs.get("pipec.schedule") {
            None => None,
            Some(a) => {
                let name = a.as_str().unwrap_or("");
                let kind = ScheduleKind::parse(name).filter(|k| {
                    matches!(
                        k,
                        ScheduleKind::Gpp | ScheduleKind::Kfkb(_) | ScheduleKind::GppPerStage
                    )
                });
                Some(kind.ok_or_else(|| {
                    Error::Usage(format!(
                        "pipec.schedule = {name:?}: one of gpp, kfkb-K, gpp-per-stage"
                    ))
                })?)
            }
        };
        Ok(IrConfig {
            cluster,
            batch,
            micro_batch,
            schedule,
        })
    }
}
