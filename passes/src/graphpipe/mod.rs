//! GraphPipe's IR passes (Jeon et al., ASPLOS'25): `sp-decompose`, `partition-gpp` and
//! `schedule-gpp`, with the module-attribute glue they share (`gpp_ir`). They sit above the
//! planners: the algorithms are the `gpp` planner's (`planners/gpp/`) and the simulator's
//! (`sim/in_flight.rs`), which never import these passes.

pub mod gpp_ir;
pub mod partition_gpp;
pub mod schedule_gpp;
pub mod sp_decompose;
