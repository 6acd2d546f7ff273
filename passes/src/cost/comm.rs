//! Communication costs on a [`Cluster`]: the α-β model.
//!
//! - A point-to-point message of `n` bytes from `a` to `b` takes `α + n/β`, where β is the
//!   bandwidth of the slowest link on the path (the links of every level up to the one where `a`
//!   and `b` part) and α the sum of those levels' latencies ([`p2p_time`]).
//! - Ring all-reduce over `p` devices (Patarasuk & Yuan; NCCL's ring): a reduce-scatter and an
//!   all-gather of `p−1` steps each, every step moving `n/p` bytes over the ring's slowest link:
//!   `T = 2(p−1)/p · n/β + 2(p−1)·α` ([`ring_allreduce`]).
//! - Hierarchical all-reduce (as in Horovod/NCCL trees over nodes): intra-node reduce-scatter
//!   (`(k−1)/k · n/β₀ + (k−1)α₀`, k devices per node), inter-node ring all-reduce of the `n/k`
//!   shard among the `g` nodes (`2(g−1)/g · (n/k)/β₁ + 2(g−1)α₁`), then intra-node all-gather
//!   (same as the reduce-scatter) ([`hierarchical_allreduce`]).
//! - Split/concat between stages with different replica counts (DAPPLE §3.3, Fig. 9 arXiv):
//!   a micro-batch is cut into even contiguous slices, one per replica; producer slice `i`
//!   overlaps consumer slice `j` on `[i/r_a, (i+1)/r_a) ∩ [j/r_b, (j+1)/r_b)` of the batch, and
//!   that fraction of the bytes flows from the `i`-th producer device to the `j`-th consumer device
//!   ([`redistribute`]).

use super::cluster::Cluster;

/// Time of one point-to-point message of `bytes` from device `a` to device `b` (0 when `a == b`).
pub fn p2p_time(c: &Cluster, a: usize, b: usize, bytes: f64) -> f64 {
    match c.path(a, b) {
        None => 0.0,
        Some((bw, lat)) => {
            if bytes <= 0.0 {
                0.0
            } else {
                lat + bytes / bw
            }
        }
    }
}

/// A message of `values` tensors totalling `bytes` from `a` to `b`: one transfer at
/// [`p2p_time`], each value after the first adding the link latency (one send per value, as the
/// programs issue them). 0 when nothing moves.
pub fn message_time(c: &Cluster, a: usize, b: usize, bytes: f64, values: usize) -> f64 {
    let t = p2p_time(c, a, b, bytes);
    if t > 0.0 && values > 1 {
        t + (values - 1) as f64 * c.path(a, b).map_or(0.0, |(_, lat)| lat)
    } else {
        t
    }
}

/// Ring all-reduce of `bytes` over `p` devices on links of bandwidth `bw` and latency `lat`:
/// `2(p−1)/p · bytes/bw + 2(p−1)·lat`; 0 for `p ≤ 1`.
pub fn ring_allreduce(p: usize, bytes: f64, bw: f64, lat: f64) -> f64 {
    if p <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let p = p as f64;
    2.0 * (p - 1.0) / p * bytes / bw + 2.0 * (p - 1.0) * lat
}

/// Ring reduce-scatter (or all-gather) alone: `(p−1)/p · bytes/bw + (p−1)·lat`.
pub fn ring_reduce_scatter(p: usize, bytes: f64, bw: f64, lat: f64) -> f64 {
    if p <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let p = p as f64;
    (p - 1.0) / p * bytes / bw + (p - 1.0) * lat
}

/// All-reduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AllReduceAlgo {
    /// One flat ring over all devices; every step runs at the slowest link the group spans.
    Ring,
    /// Reduce-scatter in each node, ring all-reduce across nodes, all-gather in each node.
    Hierarchical,
    /// The faster of the two (what NCCL's tuner approximates).
    #[default]
    Auto,
}

/// All-reduce of `bytes` (per device) over the device group `devs` (ring on the group's path link).
pub fn ring_allreduce_on(c: &Cluster, devs: &[usize], bytes: f64) -> f64 {
    AllReduceGroup::new(c, devs, AllReduceAlgo::Ring).time(bytes)
}

/// Hierarchical all-reduce over `devs`; equals the ring when the group is inside one node.
pub fn hierarchical_allreduce(c: &Cluster, devs: &[usize], bytes: f64) -> f64 {
    AllReduceGroup::new(c, devs, AllReduceAlgo::Hierarchical).time(bytes)
}

/// All-reduce time of `bytes` over `devs` with the chosen algorithm.
pub fn allreduce_time(c: &Cluster, devs: &[usize], bytes: f64, algo: AllReduceAlgo) -> f64 {
    AllReduceGroup::new(c, devs, algo).time(bytes)
}

/// The group-dependent part of an all-reduce (span level, links, devices per node), prepared
/// once for costing many message sizes over the same group (the planners' DPs do).
#[derive(Clone, Copy, Debug)]
pub struct AllReduceGroup {
    algo: AllReduceAlgo,
    /// Flat ring: `(p, β, α)` of the group's path link; `None` for a group inside one device.
    ring: Option<(usize, f64, f64)>,
    /// Hierarchical across nodes: `(k_max, β₀, α₀, g, k_min, β₁, α₁)`; `None` inside one node
    /// (where it is the ring).
    tree: Option<(usize, f64, f64, usize, usize, f64, f64)>,
}

impl AllReduceGroup {
    pub fn new(c: &Cluster, devs: &[usize], algo: AllReduceAlgo) -> AllReduceGroup {
        let top = c.group_span_level(devs);
        let ring = top.map(|l| {
            let (bw, lat) = c.path_to_level(l);
            (devs.len(), bw, lat)
        });
        let tree = match top {
            Some(top) if top > 0 => {
                let mut per_node: std::collections::BTreeMap<usize, usize> = Default::default();
                for &d in devs {
                    *per_node.entry(c.node_of(d)).or_insert(0) += 1;
                }
                let kmax = per_node.values().copied().max().unwrap_or(1);
                let kmin = per_node.values().copied().min().unwrap_or(1);
                let (bw0, lat0) = c.path_to_level(0);
                let (bw1, lat1) = c.path_to_level(top);
                Some((kmax, bw0, lat0, per_node.len(), kmin, bw1, lat1))
            }
            _ => None,
        };
        AllReduceGroup { algo, ring, tree }
    }

    /// Flat ring all-reduce of `bytes` over the group.
    fn ring(&self, bytes: f64) -> f64 {
        self.ring
            .map_or(0.0, |(p, bw, lat)| ring_allreduce(p, bytes, bw, lat))
    }

    /// Hierarchical all-reduce: intra-node reduce-scatter, inter-node ring of the shard,
    /// intra-node all-gather.
    fn hierarchical(&self, bytes: f64) -> f64 {
        match self.tree {
            None => self.ring(bytes),
            Some((kmax, bw0, lat0, g, kmin, bw1, lat1)) => {
                let intra = ring_reduce_scatter(kmax, bytes, bw0, lat0);
                // Each node's leader shards hold bytes/k; with uneven nodes the smallest node
                // has the largest shard.
                let inter = ring_allreduce(g, bytes / kmin as f64, bw1, lat1);
                2.0 * intra + inter
            }
        }
    }

    /// All-reduce time of `bytes` per device over the group with its algorithm.
    pub fn time(&self, bytes: f64) -> f64 {
        match self.algo {
            AllReduceAlgo::Ring => self.ring(bytes),
            AllReduceAlgo::Hierarchical => self.hierarchical(bytes),
            AllReduceAlgo::Auto => self.ring(bytes).min(self.hierarchical(bytes)),
        }
    }
}

/// Split/concat traffic for one tensor of `bytes` (whole micro-batch) produced by a stage on
/// `src` (its replicas, each holding an even slice) and consumed by a stage on `dst`:
/// `(src index, dst index, bytes)` for every overlapping slice pair. With equal counts this is
/// pairwise (`i → i`); `1 → n` is a split, `n → 1` a concat.
pub fn redistribute(src: usize, dst: usize, bytes: f64) -> Vec<(usize, usize, f64)> {
    let mut out = Vec::new();
    if src == 0 || dst == 0 {
        return out;
    }
    // Work in units of 1/(src*dst) of the batch to stay exact.
    let unit = bytes / (src * dst) as f64;
    let (mut i, mut j) = (0usize, 0usize);
    let (mut pos, total) = (0usize, src * dst);
    while pos < total {
        let end_i = (i + 1) * dst;
        let end_j = (j + 1) * src;
        let end = end_i.min(end_j);
        out.push((i, j, (end - pos) as f64 * unit));
        pos = end;
        if end == end_i {
            i += 1;
        }
        if end == end_j {
            j += 1;
        }
    }
    out
}

/// [`redistribute`] for a stage edge whose `bytes` (whole micro-batch) include `whole` bytes of
/// values with no batch axis: those go whole to every consumer replica `j`, from producer
/// replica `j mod src` (codegen's route for such values), the rest is sliced. One entry per
/// replica pair, in [`redistribute`]'s order, then the pairs only the whole values use.
pub fn routes(src: usize, dst: usize, bytes: f64, whole: f64) -> Vec<(usize, usize, f64)> {
    if whole <= 0.0 {
        return redistribute(src, dst, bytes);
    }
    let mut out = redistribute(src, dst, (bytes - whole).max(0.0));
    for j in 0..dst {
        let i = j % src.max(1);
        match out.iter_mut().find(|(a, b, _)| (*a, *b) == (i, j)) {
            Some(r) => r.2 += whole,
            None => out.push((i, j, whole)),
        }
    }
    out
}

/// Time to redistribute one tensor of `bytes` from the devices `src` to the devices `dst`
/// ([`redistribute`]), with every device sending and receiving one message at a time: the most
/// loaded sender or receiver sets the time.
pub fn redistribute_time(c: &Cluster, src: &[usize], dst: &[usize], bytes: f64) -> f64 {
    let mut send = vec![0.0f64; src.len()];
    let mut recv = vec![0.0f64; dst.len()];
    for (i, j, b) in redistribute(src.len(), dst.len(), bytes) {
        let t = p2p_time(c, src[i], dst[j], b);
        send[i] += t;
        recv[j] += t;
    }
    send.iter().chain(recv.iter()).copied().fold(0.0, f64::max)
}
