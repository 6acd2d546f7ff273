//! `dp`: pure data parallelism, the baseline every paper compares against.
//!
//! One stage holds every node and is replicated on every device; each micro-batch is split evenly
//! over the replicas, gradients are accumulated over the micro-batches and all-reduced once per
//! iteration (DAPPLE's "DP No Overlap" baseline: no overlap of all-reduce with backward). The
//! default micro-batch is the whole batch (`M = 1`), which is best when nothing is pipelined.
//!
//! Objective: DAPPLE's latency for one stage (Eq. 2 with `S = 1`):
//! `L = M·(F + B) + AR(P, G)`, with F and B the per-replica times of one micro-batch slice.
//!
//! Search cost: none; one pass over the nodes per device kind and one all-reduce costing
//! (`O(nodes · kinds + devices)`), then one simulation of the plan.

use super::planner::Planner;
use crate::cost::comm::allreduce_time;
use crate::cost::{Cluster, CostGraph};
use crate::plan::{Plan, PlanOptions, StageSpec};
use crate::sim::ScheduleKind;
use pipec_compiler::Result;
use std::time::Instant;

/// The `dp` planner.
pub struct DataParallel;

impl Planner for DataParallel {
    fn name(&self) -> &'static str {
        "dp"
    }

    fn plan(&self, g: &CostGraph, cluster: &Cluster, opts: &PlanOptions) -> Result<Plan> {
        let t0 = Instant::now();
        let mb = opts.micro_batch_or(1);
        let m = opts.batch.max(1) / mb;
        let devices: Vec<usize> = (0..cluster.len()).collect();
        let slice = mb as f64 / devices.len() as f64;
        let mask = vec![true; g.len()];
        // The slowest device kind sets the pace of a synchronous step.
        let per_mb = devices
            .iter()
            .map(|&d| {
                let c = g.group_cost(&mask, slice, cluster.kind_of(d));
                c.fwd_s + c.bwd_s
            })
            .fold(0.0, f64::max);
        let ar = allreduce_time(cluster, &devices, g.total_parameter_bytes(), opts.allreduce);
        let objective = m as f64 * per_mb + ar;
        let spec = StageSpec {
            nodes: g.topo_order().to_vec(),
            devices,
        };
        let search = t0.elapsed().as_secs_f64();
        Plan::assemble(
            self.name(),
            g,
            cluster,
            opts,
            vec![spec],
            mb,
            opts.schedule.unwrap_or(ScheduleKind::OneFOneB),
            objective,
            search,
        )
    }
}
