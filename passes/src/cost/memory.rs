//! Memory model per device.
//!
//! A device running one replica of a stage holds (all in bytes):
//! - **parameters** `w` (one version: synchronous schedules keep no stashed weights);
//! - **gradients** `w` (accumulated over the micro-batches; BaPipe's "weights memory = 2w");
//! - **optimizer state**: SGD 0, SGD with momentum `w`, Adam `2w` (first and second moments), so
//!   Adam totals 16 bytes per fp32 parameter as in DAPPLE Table VIII;
//! - **activations** saved for backward: `a(b/r) × in_flight`, where `a(b/r)` is the stage's saved
//!   bytes for one micro-batch slice and `in_flight` the most micro-batches whose forward has run and
//!   whose backward has not (from the schedule: `M` for GPipe, `S−i` for 1F1B on a chain, DAPPLE's
//!   `K_i`, BaPipe's `k(N−i+1)`);
//! - **communication buffers**: what a compute holds besides the saved activations: during a
//!   forward the slice's received activations and its outputs to send, during a backward the
//!   received cotangents and the gradients to send, `in + out` (the runtime moves a buffer into
//!   the compute or send that is its last use, so no more than one micro-batch's are live).
//!
//! The simulator ([`crate::sim`]) adds what varies over the iteration: the gradients from the
//! device's first backward to its step, one more copy of them during every later backward
//! (the micro-batch's gradients before they are added to the global buffer), and during every
//! forward the data inputs the stage loads for the forward alone (no backward of the stage reads
//! them; [`crate::sim::SimStage::load_bytes`]).

use pipec_compiler::{Error, PlanOption, Result};

/// Optimizer kind, for its state size and the memory traffic of its step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Optimizer {
    #[default]
    Sgd,
    Momentum,
    Adam,
}

impl Optimizer {
    /// Parse `sgd`, `sgd:lr=..,momentum=0.9` (momentum ≠ 0 → [`Optimizer::Momentum`]), `momentum`,
    /// `adam[:...]`.
    pub fn parse(s: &str) -> Result<Optimizer> {
        let (kind, args) = s.split_once(':').unwrap_or((s, ""));
        match kind.trim() {
            "sgd" => {
                let momentum = args
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| k.trim() == "momentum")
                    .map(|(_, v)| v.trim().parse::<f64>().unwrap_or(1.0))
                    .unwrap_or(0.0);
                Ok(if momentum != 0.0 {
                    Optimizer::Momentum
                } else {
                    Optimizer::Sgd
                })
            }
            "momentum" => Ok(Optimizer::Momentum),
            "adam" | "adamw" => Ok(Optimizer::Adam),
            other => Err(Error::option(
                PlanOption::Optimizer,
                s,
                format!("unknown optimizer '{other}' (sgd, momentum, adam)"),
            )),
        }
    }

    /// Optimizer state bytes per parameter byte.
    pub fn state_factor(self) -> f64 {
        match self {
            Optimizer::Sgd => 0.0,
            Optimizer::Momentum => 1.0,
            Optimizer::Adam => 2.0,
        }
    }

    /// Bytes moved by the step per parameter byte, as the step piece that codegen emits runs it
    /// ([`crate::transforms::optimizer::add_optimizer`], one unfused elementwise op after another, each
    /// reading its inputs and writing its output; scalars and `Identity` are free):
    /// - SGD: `t = g·lr` (2), `w − t` (3): **5**;
    /// - momentum: `b = m·μ` (2), `b + g` (3), `·lr` (2), `w − ·` (3): **10**;
    /// - Adam: `m·β1`, `g·(1−β1)` (2 + 2), `+` (3), `g·g` (3), `v·β2`, `·(1−β2)` (2 + 2), `+` (3),
    ///   `m/bc1`, `v/bc2`, `√`, `+ε` (2 each), `m̂/den` (3), `·lr` (2), `w − ·` (3): **33**.
    ///
    /// Weight decay (`weight_decay=` in the optimizer spec) adds `w·λ` (2) and `g + ·` (3), which
    /// this kind does not know of. The test `step_time_is_the_emitted_step_piece` checks these
    /// counts against the roofline of the emitted piece.
    pub fn step_traffic_factor(self) -> f64 {
        match self {
            Optimizer::Sgd => 5.0,
            Optimizer::Momentum => 10.0,
            Optimizer::Adam => 33.0,
        }
    }
}

/// Memory of one device, by category (bytes).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryBreakdown {
    pub parameters: f64,
    pub gradients: f64,
    pub optimizer_state: f64,
    pub activations: f64,
    pub comm_buffers: f64,
}

impl MemoryBreakdown {
    /// Everything that is allocated for the whole iteration (not activations).
    pub fn static_bytes(&self) -> f64 {
        self.parameters + self.gradients + self.optimizer_state + self.comm_buffers
    }
    /// Peak total.
    pub fn total(&self) -> f64 {
        self.static_bytes() + self.activations
    }
}

/// Memory of a device running one replica of a stage.
/// `saved_per_slice`: activation bytes saved for backward by one micro-batch slice;
/// `boundary_per_slice`: bytes in + out of the stage for one micro-batch slice.
pub fn stage_memory(
    parameter_bytes: f64,
    saved_per_slice: f64,
    in_flight: usize,
    boundary_per_slice: f64,
    opt: Optimizer,
) -> MemoryBreakdown {
    MemoryBreakdown {
        parameters: parameter_bytes,
        gradients: parameter_bytes,
        optimizer_state: parameter_bytes * opt.state_factor(),
        activations: saved_per_slice * in_flight as f64,
        comm_buffers: boundary_per_slice,
    }
}

/// Seconds of the optimizer step for `parameter_bytes` on a device with `memory_bandwidth`
/// (the step is memory-bound: [`Optimizer::step_traffic_factor`] passes over the parameters).
pub fn step_time(parameter_bytes: f64, memory_bandwidth: f64, opt: Optimizer) -> f64 {
    parameter_bytes * opt.step_traffic_factor() / memory_bandwidth
}
