//! The cost model every planner and the simulator share.
//!
//! # The `CostGraph`
//! A [`CostGraph`] is the one input all planners work on. It is a DAG of coarse *nodes* (a layer of a
//! PipeDream/DAPPLE profile, or one ONNX op) with, per node:
//! - its forward and backward **work** ([`Work`]): either *measured* seconds (a `graph.txt` profile)
//!   or *counted* FLOPs and memory bytes (the analytic model of [`analytic`], turned into seconds by a
//!   roofline on the device kind, [`CostGraph::fwd_time`]);
//! - the bytes of its output (**activation**, what crosses a stage boundary and, by default, what
//!   is saved for backward) and of its **parameters** (weights; not batch-dependent);
//!
//! and per edge `u → v`, the bytes that flow from `u` to `v` and which of `u`'s outputs carry
//! them ([`CostEdge`]).
//!
//! Every batch-dependent quantity is stored **at the reference batch** [`CostGraph::reference_batch`]
//! (the profile batch, or the batch the ONNX shapes were costed at) and **scaled linearly** to
//! any other batch, as DAPPLE's planner does with its profiles: `t(b) = t(ref) · b/ref`. (Counted
//! work scales its FLOPs and activation bytes linearly; the weight traffic stays fixed, so small
//! micro-batches become memory-bound as on real hardware. So does the work on, and the edge
//! bytes of, values computed from parameters alone, such as a tied LM head's transposed
//! embedding: the analytic model splits each count into the part that grows with the batch and
//! the part that does not by counting at the batch and at twice it.) Batches are `f64` so that a micro-batch
//! split over replicas (`b/r` samples each) needs no rounding.
//!
//! Typical use in a planner:
//! ```
//! # use pipec_passes::cost::{CostGraph, cluster::Cluster, profile::parse_profile};
//! # let text = "node1 -- Input -- forward_compute_time=0, backward_compute_time=0, activation_size=8, parameter_size=0\nnode2 -- Linear -- forward_compute_time=2, backward_compute_time=4, activation_size=4, parameter_size=16\n\tnode1 -- node2\n";
//! # let g = parse_profile(text, "t.txt", "t", 64.0).unwrap().graph;
//! let cluster = Cluster::preset("dapple-a").unwrap();
//! let kind = cluster.kind_of(0);
//! for &n in g.topo_order() {
//!     let (fwd, bwd) = g.times(n, 16.0, kind); // seconds for 16 samples
//!     let out = g.activation_bytes(n, 16.0);  // bytes sent if a stage ends here
//!     let w = g.nodes[n].parameter_bytes;      // bytes all-reduced if replicated
//!     # let _ = (fwd, bwd, out, w);
//! }
//! ```
//!
//! Nodes are indexed `0..len()` ([`NodeId`]); [`CostGraph::topo_order`] is a fixed topological
//! order (stable: ties go to the lower index), which chain planners (PipeDream, BaPipe, DAPPLE)
//! use as their layer order. [`CostGraph::group_cost`] sums a set of nodes into a stage cost.
//!
//! Producers: [`profile::parse_profile`] (graph.txt) and [`analytic::from_module`] (ONNX IR).

pub mod analytic;
pub mod antichain;
pub mod cluster;
pub mod comm;
pub mod measured;
pub mod memory;
pub mod profile;

pub use cluster::{Cluster, Device, DeviceKind, Level, Precision, PRESETS};
pub use comm::AllReduceAlgo;
pub use memory::{MemoryBreakdown, Optimizer};

use pipec_compiler::topo::topo_order;
use pipec_compiler::{Error, Result};
use std::collections::{BTreeMap, HashMap};

/// Index of a node in a [`CostGraph`].
pub type NodeId = usize;

/// The work of one node at the reference batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Work {
    /// Measured seconds (device-independent: a profile is taken as valid on every device kind).
    Measured { fwd_s: f64, bwd_s: f64 },
    /// Counted work, timed by a roofline on the device kind:
    /// `max(flops·s / peak(precision), (bytes·s + fixed_bytes) / memory bandwidth)` with `s` the
    /// batch scale. `bytes` is the batch-proportional traffic (activations), `fixed_bytes` the
    /// traffic that does not grow with the batch (reading weights, writing weight gradients).
    Counted {
        fwd_flops: f64,
        /// Forward FLOPs that do not grow with the batch (ops on values computed from
        /// parameters alone).
        fwd_fixed_flops: f64,
        bwd_flops: f64,
        /// Activation bytes read and written by the forward kernel(s).
        fwd_bytes: f64,
        /// Activation bytes read and written by the backward kernel(s).
        bwd_bytes: f64,
        /// Weight bytes the forward reads, and its traffic on values computed from parameters
        /// alone.
        fwd_fixed_bytes: f64,
        /// Weight bytes the backward reads and weight-gradient bytes it writes.
        bwd_fixed_bytes: f64,
        precision: Precision,
        /// The backward as the kernels autodiff emits for the node
        /// ([`analytic::with_autodiff_backward`]), each timed by its own roofline and summed, as
        /// the replay of the compiled program times them; the `bwd_*` fields then hold their
        /// sums. Empty: the backward is the one roofline of the `bwd_*` fields (the documented
        /// factors of [`analytic`]).
        bwd_kernels: Vec<Kernel>,
    },
}

/// One kernel's counted work at batch scale `s`: `flops·s + fixed_flops` FLOPs and
/// `bytes·s + fixed_bytes` bytes of memory traffic, timed by the roofline of its precision.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub flops: f64,
    pub fixed_flops: f64,
    pub bytes: f64,
    pub fixed_bytes: f64,
    pub precision: Precision,
    /// A weight-gradient kernel: what it computes reaches only parameter gradients, never the
    /// cotangent another node's backward reads (Qi et al.'s `W`, the rest being `B`; see
    /// [`CostGraph::weight_time`]).
    pub weight: bool,
    /// For a weight-gradient kernel whose result goes on to another node's weight-gradient
    /// kernels (the cotangent of a transposed weight, read by a per-step matmul, flowing to the
    /// `Transpose`), that node: where the two sit in different stages, the value crosses as an
    /// input gradient, so the sending stage computes the kernel in `B`.
    pub weight_to: Option<NodeId>,
}

impl Kernel {
    /// Seconds at batch scale `s` on `kind`.
    pub fn time(&self, s: f64, kind: &DeviceKind) -> f64 {
        ((self.flops * s + self.fixed_flops) / kind.peak(self.precision))
            .max((self.bytes * s + self.fixed_bytes) / kind.memory_bandwidth)
    }
}

/// One node of a [`CostGraph`]. Batch-dependent fields are at the reference batch.
#[derive(Clone, Debug, PartialEq)]
pub struct CostNode {
    /// ONNX node name or profile node id (`node7`); unique.
    pub name: String,
    /// Op type (`Conv`) or the profile's module repr (`Conv2d(3, 64, ...)`).
    pub op: String,
    pub work: Work,
    /// Bytes of the node's output(s).
    pub activation_bytes: f64,
    /// Bytes kept alive from forward to backward for this node: its output by default; in the
    /// planning graph of an ONNX model, the forward values its backward reads as autodiff emits it
    /// ([`analytic::with_autodiff_backward`]).
    pub saved_bytes: f64,
    /// Bytes saved for backward by every micro-batch whatever its size: values computed from
    /// parameters alone (a transposed weight), which the forward piece hands to the backward
    /// piece once per micro-batch. Not scaled with the batch.
    pub saved_fixed_bytes: f64,
    /// Bytes of trainable parameters (independent of the batch).
    pub parameter_bytes: f64,
    /// A graph input (PipeDream's `Input*` nodes): planners pin it to a first stage.
    pub is_input: bool,
    /// A side computation (shape arithmetic, masks, position ids, constants: no float parameter
    /// or activation, [`analytic::side_ops`]): codegen recomputes it in every stage that reads
    /// it, so its output never crosses a cut (its edges carry 0 bytes and make no stage edge).
    pub side: bool,
}

/// A data edge `src → dst` carrying `bytes` at the reference batch (scaled with the batch)
/// plus `fixed_bytes` that do not grow with it: a value computed from parameters alone, such as
/// GPT-2's transposed `wte` feeding the LM head, which codegen sends whole with every
/// micro-batch (and its cotangent back).
#[derive(Clone, Debug, PartialEq)]
pub struct CostEdge {
    pub src: NodeId,
    pub dst: NodeId,
    pub bytes: f64,
    pub fixed_bytes: f64,
    /// Which of the producer's outputs the edge carries: bit `k` for result `k` (results past
    /// 63 share bit 63). Codegen sends each output as its own message, so a consumer stage
    /// reading three outputs of a `Split` pays three link latencies. 0: one output (profiles).
    pub outputs: u64,
    /// Whether the backward sends a cotangent back over the edge when the producer's output
    /// depends on a parameter: the consumer lies on a differentiable path to the loss and
    /// differentiates an input it reads from the producer. Not so for a value read only where
    /// autodiff stops (a `Shape`, an index, a `Where` condition) or by a node whose output
    /// the loss never reads (an LSTM's final state when the loss is on its sequence output).
    /// `true` where unknown (profiles).
    pub cotangent: bool,
}

impl CostEdge {
    /// An edge of one output whose bytes all scale with the batch.
    pub fn new(src: NodeId, dst: NodeId, bytes: f64) -> CostEdge {
        CostEdge {
            src,
            dst,
            bytes,
            fixed_bytes: 0.0,
            outputs: 0,
            cotangent: true,
        }
    }
}

/// Costs of a set of nodes (a stage), at some batch, on some device kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupCost {
    pub fwd_s: f64,
    pub bwd_s: f64,
    pub parameter_bytes: f64,
    /// Bytes saved for backward per micro-batch (summed over the nodes).
    pub saved_bytes: f64,
    /// Bytes entering the set over edges from outside (forward activations received).
    pub in_bytes: f64,
    /// Bytes leaving the set over edges to outside (forward activations sent).
    pub out_bytes: f64,
}

/// A value the weight-gradient kernels of several nodes read ([`CostGraph::weight_held_shared`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HeldValue {
    /// Made by input-gradient kernels (else a forward value).
    pub carried: bool,
    /// Bytes at the reference batch, and bytes that do not grow with it.
    pub bytes: f64,
    pub fixed_bytes: f64,
    /// The nodes whose weight-gradient kernels read it, ascending.
    pub readers: Vec<NodeId>,
}

/// A split backward's weight-gradient part ([`CostGraph::weight_part`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WeightPart {
    /// Seconds of `W`.
    pub wgt_s: f64,
    /// Saved activations held from `B` to `W` (of the set's saved bytes).
    pub weight_saved_bytes: f64,
    /// Values `B` computes for `W`.
    pub carried_bytes: f64,
}

/// Prefix sums over [`CostGraph::topo_order`] at one batch and device kind, for planners that cut
/// the linearized graph into contiguous runs (PipeDream, DAPPLE, BaPipe, `straight`).
///
/// Position `i` is the `i`-th node of the order; a run is a half-open range `[i, j)` of positions.
/// All sums are O(1) per range.
#[derive(Clone, Debug)]
pub struct Chain {
    /// The node at each position.
    pub order: Vec<NodeId>,
    /// `fwd[i]`: forward seconds of positions `0..i` (length `n + 1`).
    pub fwd: Vec<f64>,
    /// `bwd[i]`: backward seconds of positions `0..i`.
    pub bwd: Vec<f64>,
    /// `params[i]`: parameter bytes of positions `0..i`.
    pub params: Vec<f64>,
    /// `saved[i]`: bytes saved for backward by positions `0..i`.
    pub saved: Vec<f64>,
    /// `cut[i]`: bytes that cross a cut just before position `i` (every output of a node before
    /// `i` that a node at or after `i` reads, counted once per producing node); `cut[0] = cut[n] = 0`.
    pub cut: Vec<f64>,
}

impl Chain {
    /// Number of positions.
    pub fn len(&self) -> usize {
        self.order.len()
    }
    /// True for an empty chain.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
    /// Forward + backward seconds of the run `[i, j)`.
    pub fn compute(&self, i: usize, j: usize) -> f64 {
        (self.fwd[j] - self.fwd[i]) + (self.bwd[j] - self.bwd[i])
    }
    /// Parameter bytes of the run `[i, j)`.
    pub fn parameter_bytes(&self, i: usize, j: usize) -> f64 {
        self.params[j] - self.params[i]
    }
    /// Saved activation bytes of the run `[i, j)`.
    pub fn saved_bytes(&self, i: usize, j: usize) -> f64 {
        self.saved[j] - self.saved[i]
    }
}

/// The union of one producer's outputs read over several edges, each edge given as (output
/// set [`CostEdge::outputs`], `[bytes, part]`) with `part` any share of its bytes to total
/// alike: the sets largest first, each counted unless those already counted cover it (equal
/// sets count once, at their largest bytes). Returns the summed `[bytes, part]` and the union.
pub fn output_union(mut sets: Vec<(u64, [f64; 2])>) -> ([f64; 2], u64) {
    sets.sort_by(|a, b| {
        b.0.count_ones()
            .cmp(&a.0.count_ones())
            .then(a.0.cmp(&b.0))
            .then(b.1[0].total_cmp(&a.1[0]))
    });
    let (mut seen, mut total) = (0u64, [0.0, 0.0]);
    for (m, [b, p]) in sets {
        if m & !seen != 0 {
            seen |= m;
            total[0] += b;
            total[1] += p;
        }
    }
    (total, seen)
}

/// The planners' input graph. See the module documentation.
#[derive(Clone, Debug)]
pub struct CostGraph {
    pub name: String,
    /// The batch (samples) at which the batch-dependent fields were taken.
    pub reference_batch: f64,
    pub nodes: Vec<CostNode>,
    pub edges: Vec<CostEdge>,
    in_edges: Vec<Vec<usize>>,
    out_edges: Vec<Vec<usize>>,
    topo: Vec<NodeId>,
    by_name: HashMap<String, NodeId>,
    /// Parameters read by more than one node (see [`TiedParameter`]); empty for graphs from
    /// profiles.
    pub tied: Vec<TiedParameter>,
    /// Saved values that the backward of several nodes reads (see [`SharedSaved`]); empty for
    /// graphs from profiles.
    pub shared_saved: Vec<SharedSaved>,
    /// Per node, what a micro-batch holds between the input-gradient and the weight-gradient
    /// part of a split backward (zero bubble), the values the node's weight-gradient kernels
    /// read: `[saved, saved_fixed, carried, carried_fixed]`, the forward values among them
    /// (a matmul's `X`, part of the saved activations) and those its input-gradient kernels
    /// computed (its `dY`), each as bytes at the reference batch and fixed bytes; values the
    /// weight-gradient kernels of several nodes read are in `weight_held_shared` instead. Empty
    /// for graphs from profiles (then a split holds the saved activations and carries nothing).
    pub weight_held: Vec<[f64; 4]>,
    /// Values the weight-gradient kernels of several nodes read (a bias add's and its matmul's
    /// `dY`): held once by every stage where any of them runs `W`.
    pub weight_held_shared: Vec<HeldValue>,
    /// The loss's forward ops (`pipec.phase = loss`, run by the forward piece of the stage that
    /// computes the model's first output) as kernels, timed with the forward of `loss_node`;
    /// empty for graphs from profiles.
    pub loss_forward: Vec<Kernel>,
    /// The node whose output the loss reads.
    pub loss_node: Option<NodeId>,
    /// The model's data inputs (see [`DataInput`]); empty for graphs from profiles.
    pub data_inputs: Vec<DataInput>,
    /// Sums of a value's cotangent contributions (see [`CotangentSum`]); empty for graphs from
    /// profiles.
    pub cotangent_sums: Vec<CotangentSum>,
    /// Parameter bytes counted at a node that get no gradient (`(node, bytes)`): held by its
    /// stage, but not stepped, accumulated or all-reduced (codegen emits them none).
    pub untrained: Vec<(NodeId, f64)>,
    /// Trainable parameter bytes counted at a node that only forward ops read (`(node,
    /// bytes)`, an embedding table whose gradient is a scatter of `dY`): weight stashing
    /// (`pipedream-async`) does not copy them, as the backward never reads them. Empty for
    /// graphs from profiles (then every parameter is stashed).
    pub forward_only_params: Vec<(NodeId, f64)>,
}

/// The sum of the cotangent contributions of one forward value that autodiff of the whole model
/// emits (read `K` contributions, write one), costed in the backward of the value's `producer`
/// like the rest of its gradient. A pipeline sums where the contributions meet: each stage other
/// than the producer's adds up its own consumers' contributions and sends one cotangent, and the
/// producer's stage adds its own, the seeds, and one per consuming stage. The stage graph moves
/// the cost there ([`CotangentSum::part`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CotangentSum {
    pub producer: NodeId,
    /// The node whose backward made each contribution (`None`: a seed, summed at the producer).
    pub from: Vec<Option<NodeId>>,
    /// The whole sum as costed at the producer.
    pub kernel: Kernel,
}

impl CotangentSum {
    /// The kernel of a sum of `k ≥ 2` of the contributions: `k` reads and one write, `k − 1`
    /// adds (the whole sum is `K = from.len()` of them).
    pub fn part(&self, k: usize) -> Kernel {
        let big = self.from.len().max(2) as f64;
        let (rw, adds) = (
            (k as f64 + 1.0) / (big + 1.0),
            (k as f64 - 1.0) / (big - 1.0),
        );
        Kernel {
            flops: self.kernel.flops * adds,
            fixed_flops: self.kernel.fixed_flops * adds,
            bytes: self.kernel.bytes * rw,
            fixed_bytes: self.kernel.fixed_bytes * rw,
            precision: self.kernel.precision,
            weight: self.kernel.weight,
            weight_to: self.kernel.weight_to,
        }
    }
}

/// A data input of the model (a graph input that is not a parameter). Every stage whose forward
/// reads it, directly or through a side computation it recomputes, loads its slice of every
/// micro-batch: a buffer live through the forward, which the stage's saved activations already
/// count where the backward of one of its nodes reads it, and which is otherwise one more
/// communication buffer (a later stage reading only the input's `Shape`, as a ViT's class token
/// does).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DataInput {
    pub name: String,
    /// Bytes at the reference batch (scaled with the batch).
    pub bytes: f64,
    /// Nodes whose forward reads it (side computations included).
    pub readers: Vec<NodeId>,
    /// Nodes whose backward reads it (it is saved with them).
    pub saved_by: Vec<NodeId>,
}

/// A forward value saved for backward that the backward ops of several nodes read (a `Relu`
/// output read by its own gradient and, as the input of the next `Conv`, by that one's weight
/// gradient). Its bytes count in [`CostNode::saved_bytes`] of its last reader; a stage cut
/// between the readers keeps it in every stage holding one (the producer's keeps it for its
/// own backward, the consumer's receives and keeps it), which [`CostGraph::group_cost`] adds.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedSaved {
    /// Bytes at the reference batch (scaled with the batch) and bytes that do not grow with it.
    pub bytes: f64,
    pub fixed_bytes: f64,
    /// The reading nodes, ascending; the last holds the bytes.
    pub readers: Vec<NodeId>,
}

/// A parameter read by several nodes (a tied parameter, e.g. GPT-2's `wte` in the embedding
/// and the LM head). Its bytes count once in [`CostNode::parameter_bytes`], at its first
/// reader; codegen keeps a copy in every stage that reads it, and one all-reduce over all those
/// stages' devices sums the gradient shares (the simulator models both, [`crate::sim`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TiedParameter {
    pub bytes: f64,
    /// The nodes that read it, in node order; the first holds its bytes.
    pub readers: Vec<NodeId>,
    /// Its name (the initializer's).
    pub name: String,
    /// The backward's sum of the readers' gradient shares (per micro-batch), which runs only
    /// where one stage holds every reader: split over stages, each keeps its own share and the
    /// all-reduce sums them ([`CostGraph::group_cost`] adds it to such a stage).
    pub accumulate: Vec<Kernel>,
    /// The nodes whose backward reads it, in node order (an embedding's lookup does not, the
    /// LM head's matmul does); `None` when unknown (every reader is then taken to).
    pub backward_readers: Option<Vec<NodeId>>,
}

impl CostGraph {
    /// Build and check a graph: unique names, edges in range, no self-loop, acyclic, finite
    /// non-negative values, positive reference batch. `file` names the source in errors.
    pub fn new(
        name: impl Into<String>,
        reference_batch: f64,
        nodes: Vec<CostNode>,
        edges: Vec<CostEdge>,
        file: &str,
    ) -> Result<CostGraph> {
        if !(reference_batch.is_finite() && reference_batch > 0.0) {
            return Err(Error::Usage(format!(
                "{file}: reference batch must be > 0, got {reference_batch}"
            )));
        }
        let mut by_name = HashMap::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            if by_name.insert(n.name.clone(), i).is_some() {
                return Err(Error::Usage(format!(
                    "{file}: node '{}' defined twice",
                    n.name
                )));
            }
            let vals: [(&str, f64); 4] = [
                ("activation_size", n.activation_bytes),
                ("saved bytes", n.saved_bytes),
                ("fixed saved bytes", n.saved_fixed_bytes),
                ("parameter_size", n.parameter_bytes),
            ];
            let work: Vec<(&str, f64)> = match &n.work {
                Work::Measured { fwd_s, bwd_s } => vec![
                    ("forward_compute_time", *fwd_s),
                    ("backward_compute_time", *bwd_s),
                ],
                Work::Counted {
                    fwd_flops,
                    fwd_fixed_flops,
                    bwd_flops,
                    fwd_bytes,
                    bwd_bytes,
                    ..
                } => vec![
                    ("forward FLOPs", *fwd_flops),
                    ("fixed forward FLOPs", *fwd_fixed_flops),
                    ("backward FLOPs", *bwd_flops),
                    ("forward bytes", *fwd_bytes),
                    ("backward bytes", *bwd_bytes),
                ],
            };
            for (what, v) in vals.iter().chain(work.iter()) {
                if !(v.is_finite() && *v >= 0.0) {
                    return Err(Error::Usage(format!(
                        "{file}: node '{}': {what} must be a finite number >= 0, got {v}",
                        n.name
                    )));
                }
            }
        }
        let n = nodes.len();
        let mut in_edges = vec![Vec::new(); n];
        let mut out_edges = vec![Vec::new(); n];
        for (i, e) in edges.iter().enumerate() {
            if e.src >= n || e.dst >= n {
                return Err(Error::Usage(format!(
                    "{file}: edge {i} names a missing node"
                )));
            }
            if e.src == e.dst {
                return Err(Error::Usage(format!(
                    "{file}: edge {} -- {} is a self-loop",
                    nodes[e.src].name, nodes[e.dst].name
                )));
            }
            if !(e.bytes.is_finite()
                && e.bytes >= 0.0
                && e.fixed_bytes.is_finite()
                && e.fixed_bytes >= 0.0)
            {
                return Err(Error::Usage(format!(
                    "{file}: edge {} -- {}: bytes must be >= 0",
                    nodes[e.src].name, nodes[e.dst].name
                )));
            }
            out_edges[e.src].push(i);
            in_edges[e.dst].push(i);
        }
        // Deterministic, ties to the lower index.
        let topo = topo_order(n, |u| out_edges[u].iter().map(|&e| edges[e].dst)).map_err(|c| {
            Error::Usage(format!(
                "{file}: the graph has a cycle through node '{}'",
                nodes[c.stuck].name
            ))
        })?;
        Ok(CostGraph {
            name: name.into(),
            reference_batch,
            nodes,
            edges,
            in_edges,
            out_edges,
            topo,
            by_name,
            tied: Vec::new(),
            shared_saved: Vec::new(),
            weight_held: Vec::new(),
            weight_held_shared: Vec::new(),
            loss_forward: Vec::new(),
            loss_node: None,
            data_inputs: Vec::new(),
            cotangent_sums: Vec::new(),
            untrained: Vec::new(),
            forward_only_params: Vec::new(),
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True for a graph without nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A fixed topological order of the nodes.
    pub fn topo_order(&self) -> &[NodeId] {
        &self.topo
    }

    /// Each node's position in [`CostGraph::topo_order`].
    pub fn topo_positions(&self) -> Vec<usize> {
        let mut pos = vec![0; self.len()];
        for (i, &n) in self.topo.iter().enumerate() {
            pos[n] = i;
        }
        pos
    }

    /// Node by name.
    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }

    /// Indices into [`CostGraph::edges`] of the edges entering `n`.
    pub fn in_edges(&self, n: NodeId) -> &[usize] {
        &self.in_edges[n]
    }

    /// Indices into [`CostGraph::edges`] of the edges leaving `n`.
    pub fn out_edges(&self, n: NodeId) -> &[usize] {
        &self.out_edges[n]
    }

    /// Predecessor nodes of `n`.
    pub fn preds(&self, n: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.in_edges[n].iter().map(|&e| self.edges[e].src)
    }

    /// Successor nodes of `n`.
    pub fn succs(&self, n: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.out_edges[n].iter().map(|&e| self.edges[e].dst)
    }

    /// Linear scale factor from the reference batch to `batch`.
    pub fn scale(&self, batch: f64) -> f64 {
        batch / self.reference_batch
    }

    /// Forward and backward seconds of node `n` for `batch` samples on device kind `kind`.
    pub fn times(&self, n: NodeId, batch: f64, kind: &DeviceKind) -> (f64, f64) {
        let s = self.scale(batch);
        match &self.nodes[n].work {
            Work::Measured { fwd_s, bwd_s } => (fwd_s * s, bwd_s * s),
            Work::Counted {
                fwd_flops,
                fwd_fixed_flops,
                bwd_flops,
                fwd_bytes,
                bwd_bytes,
                fwd_fixed_bytes,
                bwd_fixed_bytes,
                precision,
                bwd_kernels,
            } => {
                let peak = kind.peak(*precision);
                let bw = kind.memory_bandwidth;
                let bwd = if bwd_kernels.is_empty() {
                    (bwd_flops * s / peak).max((bwd_bytes * s + bwd_fixed_bytes) / bw)
                } else {
                    bwd_kernels.iter().map(|k| k.time(s, kind)).sum()
                };
                let mut fwd = ((fwd_flops * s + fwd_fixed_flops) / peak)
                    .max((fwd_bytes * s + fwd_fixed_bytes) / bw);
                if self.loss_node == Some(n) {
                    fwd += self
                        .loss_forward
                        .iter()
                        .map(|k| k.time(s, kind))
                        .sum::<f64>();
                }
                (fwd, bwd)
            }
        }
    }

    /// Of node `n`'s backward seconds ([`CostGraph::times`]), those of its weight-gradient
    /// kernels (Qi et al.'s `W`; the rest is `B`, what the input gradients need). Where the
    /// backward is not given kernel by kernel (profiles, the documented factors), a node with
    /// parameters spends half its backward on `W`, as for a matmul (`dX = dY·Wᵀ` and
    /// `dW = Xᵀ·dY` cost the same) and the zero-bubble paper's `T_W ≈ T_B`.
    pub fn weight_time(&self, n: NodeId, batch: f64, kind: &DeviceKind) -> f64 {
        let s = self.scale(batch);
        match &self.nodes[n].work {
            Work::Counted { bwd_kernels, .. } if !bwd_kernels.is_empty() => bwd_kernels
                .iter()
                .filter(|k| k.weight)
                .map(|k| k.time(s, kind))
                .sum(),
            _ if self.nodes[n].parameter_bytes > 0.0 => 0.5 * self.times(n, batch, kind).1,
            _ => 0.0,
        }
    }

    /// Forward seconds of node `n` for `batch` samples on `kind`.
    pub fn fwd_time(&self, n: NodeId, batch: f64, kind: &DeviceKind) -> f64 {
        self.times(n, batch, kind).0
    }

    /// Backward seconds of node `n` for `batch` samples on `kind`.
    pub fn bwd_time(&self, n: NodeId, batch: f64, kind: &DeviceKind) -> f64 {
        self.times(n, batch, kind).1
    }

    /// Output bytes of node `n` for `batch` samples.
    pub fn activation_bytes(&self, n: NodeId, batch: f64) -> f64 {
        self.nodes[n].activation_bytes * self.scale(batch)
    }

    /// Bytes of edge `e` for `batch` samples.
    pub fn edge_bytes(&self, e: usize, batch: f64) -> f64 {
        self.edges[e].bytes * self.scale(batch) + self.edges[e].fixed_bytes
    }

    /// Parameter bytes of the whole graph.
    pub fn total_parameter_bytes(&self) -> f64 {
        self.nodes.iter().map(|n| n.parameter_bytes).sum()
    }

    /// Sum of the forward and backward time of all nodes (one device, `batch` samples).
    pub fn total_time(&self, batch: f64, kind: &DeviceKind) -> (f64, f64) {
        (0..self.len()).fold((0.0, 0.0), |(f, b), n| {
            let (nf, nb) = self.times(n, batch, kind);
            (f + nf, b + nb)
        })
    }

    /// Cost of the node set `member` (`member[n]` true for members) at `batch` samples on `kind`:
    /// summed compute, parameters and saved activations, and the boundary buffers: each output
    /// that enters or leaves the set counted once, however many nodes on the other side read it
    /// (the runtime holds one buffer per value; a residual stream read by two ops of the next
    /// stage is received once).
    pub fn group_cost(&self, member: &[bool], batch: f64, kind: &DeviceKind) -> GroupCost {
        let mut c = GroupCost::default();
        let s = self.scale(batch);
        for (n, _) in member.iter().enumerate().filter(|(_, m)| **m) {
            let (f, b) = self.times(n, batch, kind);
            c.fwd_s += f;
            c.bwd_s += b;
            c.parameter_bytes += self.nodes[n].parameter_bytes;
            c.saved_bytes += self.nodes[n].saved_bytes * s + self.nodes[n].saved_fixed_bytes;
        }
        for t in self.tied.iter().filter(|t| !t.accumulate.is_empty()) {
            if t.readers.iter().all(|&r| member[r]) {
                c.bwd_s += t.accumulate.iter().map(|k| k.time(s, kind)).sum::<f64>();
            }
        }
        for v in &self.shared_saved {
            let last = v.readers.last().is_some_and(|&r| member[r]);
            if !last && v.readers.iter().any(|&r| member[r]) {
                c.saved_bytes += v.bytes * s + v.fixed_bytes;
            }
        }
        // Per producer crossing the boundary, the output sets its crossing edges carry.
        type Sets = Vec<(u64, [f64; 2])>;
        let mut crossing: BTreeMap<(NodeId, bool), Sets> = BTreeMap::new();
        for e in &self.edges {
            let inward = match (member[e.src], member[e.dst]) {
                (false, true) => true,
                (true, false) => false,
                _ => continue,
            };
            crossing
                .entry((e.src, inward))
                .or_default()
                .push((e.outputs.max(1), [e.bytes * s + e.fixed_bytes, 0.0]));
        }
        for ((_, inward), sets) in crossing {
            let b = output_union(sets).0[0];
            if inward {
                c.in_bytes += b;
            } else {
                c.out_bytes += b;
            }
        }
        c
    }

    /// Nodes whose output depends on a parameter: only those get cotangents back. A node reads
    /// a parameter when it holds its bytes or is one of a tied parameter's readers (whose bytes
    /// count at the first reader only, e.g. GPT-2's LM-head `Transpose(wte)`).
    pub fn trained_nodes(&self) -> Vec<bool> {
        let mut trained = vec![false; self.len()];
        for t in &self.tied {
            for &r in &t.readers {
                trained[r] = true;
            }
        }
        for &u in self.topo_order() {
            trained[u] |= self.nodes[u].parameter_bytes > 0.0 || self.preds(u).any(|p| trained[p]);
        }
        trained
    }

    /// The backward of the node set `member` split for a zero-bubble schedule: the input-gradient
    /// part `B` runs what the cotangents sent out of the set need, the backward of every node a
    /// differentiated input of the set reaches (over edges that carry cotangents from `trained`
    /// producers, [`CostGraph::trained_nodes`]); those nodes' weight-gradient kernels
    /// ([`CostGraph::weight_time`]) and the whole backward of the others (a branch fed by data
    /// inputs alone, a transposed weight another stage reads) make up `W`, which holds what
    /// those kernels read ([`CostGraph::weight_held`]), the other nodes' saved activations and
    /// the cotangents they receive.
    pub fn weight_part(
        &self,
        member: &[bool],
        trained: &[bool],
        batch: f64,
        kind: &DeviceKind,
    ) -> WeightPart {
        let s = self.scale(batch);
        let mut reached = vec![false; self.len()];
        let mut stack: Vec<NodeId> = Vec::new();
        for e in &self.edges {
            if !member[e.src] && member[e.dst] && e.cotangent && trained[e.src] && !reached[e.dst] {
                reached[e.dst] = true;
                stack.push(e.dst);
            }
        }
        while let Some(u) = stack.pop() {
            for &ei in &self.out_edges[u] {
                let e = &self.edges[ei];
                if member[e.dst] && e.cotangent && !reached[e.dst] {
                    reached[e.dst] = true;
                    stack.push(e.dst);
                }
            }
        }
        let mut w = WeightPart::default();
        let mut leaves: Vec<Option<bool>> = vec![None; self.len()];
        for n in (0..self.len()).filter(|&n| member[n]) {
            let saved = self.nodes[n].saved_bytes * s + self.nodes[n].saved_fixed_bytes;
            if !reached[n] {
                w.wgt_s += self.times(n, batch, kind).1;
                w.weight_saved_bytes += saved;
                // The cotangent it receives for its output (read by other stages) waits for
                // `W` too (the largest of its crossing edges: one value, its partial sums
                // added as they arrive).
                if trained[n] {
                    w.carried_bytes += self.out_edges[n]
                        .iter()
                        .map(|&e| &self.edges[e])
                        .filter(|e| !member[e.dst] && e.cotangent)
                        .map(|e| e.bytes * s + e.fixed_bytes)
                        .fold(0.0, f64::max);
                }
                continue;
            }
            // Its weight kernels, but those whose result leaves the set, directly or along the
            // chain of nodes it flows through (a per-step matmul's contribution to a transposed,
            // sliced weight made in an earlier stage): that is an input gradient of the set,
            // which `B` computes and sends.
            w.wgt_s += match &self.nodes[n].work {
                Work::Counted { bwd_kernels, .. } if !bwd_kernels.is_empty() => bwd_kernels
                    .iter()
                    .filter(|k| {
                        k.weight
                            && k.weight_to.is_none_or(|m| {
                                member[m] && !self.exports_out(m, member, &mut leaves)
                            })
                    })
                    .map(|k| k.time(s, kind))
                    .sum(),
                _ => self.weight_time(n, batch, kind),
            };
            match self.weight_held.get(n) {
                Some(&[sp, sf, cp, cf]) => {
                    w.weight_saved_bytes += sp * s + sf;
                    w.carried_bytes += cp * s + cf;
                }
                None => w.weight_saved_bytes += saved,
            }
        }
        for v in &self.weight_held_shared {
            if v.readers.iter().any(|&r| member[r] && reached[r]) {
                let b = v.bytes * s + v.fixed_bytes;
                if v.carried {
                    w.carried_bytes += b;
                } else {
                    w.weight_saved_bytes += b;
                }
            }
        }
        for t in self.tied.iter().filter(|t| !t.accumulate.is_empty()) {
            if t.readers.iter().all(|&r| member[r]) {
                w.wgt_s += t.accumulate.iter().map(|k| k.time(s, kind)).sum::<f64>();
            }
        }
        w
    }

    /// Whether a weight-gradient result reaching node `m` leaves the node set `member` on its way
    /// to the parameter gradient (along [`Kernel::weight_to`]; memoised in `memo`).
    fn exports_out(&self, m: NodeId, member: &[bool], memo: &mut Vec<Option<bool>>) -> bool {
        if let Some(x) = memo[m] {
            return x;
        }
        memo[m] = Some(false);
        let targets: Vec<NodeId> = match &self.nodes[m].work {
            Work::Counted { bwd_kernels, .. } => {
                bwd_kernels.iter().filter_map(|k| k.weight_to).collect()
            }
            Work::Measured { .. } => Vec::new(),
        };
        let out = targets
            .into_iter()
            .any(|t| !member[t] || self.exports_out(t, member, memo));
        memo[m] = Some(out);
        out
    }

    /// Prefix sums over the topological order at `batch` samples on `kind` (see [`Chain`]).
    pub fn chain(&self, batch: f64, kind: &DeviceKind) -> Chain {
        self.chain_in(&self.topo, batch, kind)
    }

    /// Prefix sums over another topological order of every node (e.g.
    /// [`antichain::Linearization::chain_order`]), at `batch` samples on `kind`.
    pub fn chain_in(&self, order: &[NodeId], batch: f64, kind: &DeviceKind) -> Chain {
        let n = self.len();
        debug_assert_eq!(order.len(), n);
        let order = order.to_vec();
        let mut pos = vec![0usize; n];
        for (i, &u) in order.iter().enumerate() {
            pos[u] = i;
        }
        let s = self.scale(batch);
        let (mut fwd, mut bwd, mut params, mut saved) = (
            Vec::with_capacity(n + 1),
            Vec::with_capacity(n + 1),
            Vec::with_capacity(n + 1),
            Vec::with_capacity(n + 1),
        );
        let (mut f, mut b, mut p, mut a) = (0.0, 0.0, 0.0, 0.0);
        fwd.push(f);
        bwd.push(b);
        params.push(p);
        saved.push(a);
        // Difference array: node u's output crosses every cut in (pos u, last consumer].
        let mut diff = vec![0.0f64; n + 2];
        for &u in &order {
            let (tf, tb) = self.times(u, batch, kind);
            f += tf;
            b += tb;
            p += self.nodes[u].parameter_bytes;
            a += self.nodes[u].saved_bytes * s + self.nodes[u].saved_fixed_bytes;
            fwd.push(f);
            bwd.push(b);
            params.push(p);
            saved.push(a);
            let last = self.out_edges[u]
                .iter()
                .map(|&e| pos[self.edges[e].dst])
                .max();
            if let Some(last) = last {
                let bytes = self.out_edges[u]
                    .iter()
                    .map(|&e| self.edges[e].bytes * s + self.edges[e].fixed_bytes)
                    .fold(0.0, f64::max);
                diff[pos[u] + 1] += bytes;
                diff[last + 1] -= bytes;
            }
        }
        let mut cut = Vec::with_capacity(n + 1);
        let mut run = 0.0;
        for d in diff.iter().take(n + 1) {
            run += d;
            cut.push(run.max(0.0));
        }
        Chain {
            order,
            fwd,
            bwd,
            params,
            saved,
            cut,
        }
    }

    /// A membership mask from a list of nodes.
    pub fn mask(&self, nodes: &[NodeId]) -> Vec<bool> {
        let mut m = vec![false; self.len()];
        for &n in nodes {
            m[n] = true;
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::{CotangentSum, Kernel};
    use crate::cost::cluster::Precision;

    #[test]
    fn a_part_of_a_cotangent_sum_reads_its_terms_and_writes_one() {
        // A `Sum` of 4 contributions of 100 bytes each: 5 × 100 bytes, 3 adds of 10 flops.
        let cs = CotangentSum {
            producer: 0,
            from: vec![Some(1), Some(2), Some(3), None],
            kernel: Kernel {
                flops: 30.0,
                fixed_flops: 0.0,
                bytes: 500.0,
                fixed_bytes: 0.0,
                precision: Precision::F32,
                weight: false,
                weight_to: None,
            },
        };
        let two = cs.part(2);
        assert_eq!((two.flops, two.bytes), (10.0, 300.0));
        assert_eq!(cs.part(4), cs.kernel);
    }
}
