//! Cluster descriptions: device kinds, a hierarchy of link levels, and the devices.
//!
//! A [`Cluster`] is a tree. Level 0 groups `levels[0].size` devices (a server; its link is NVLink or
//! PCIe), level 1 groups `levels[1].size` level-0 groups (its link is Ethernet or InfiniBand), and
//! so on: exactly PipeDream's `-n N1 N2 ... -b B1 B2 ...` hierarchy, with a latency per level added
//! for the α-β model of [`super::comm`]. A level-0 group is called a *node*. Every node has one
//! device kind, so a cluster may mix kinds (heterogeneous), node by node.
//!
//! Three ways to get one (`pipec plan --cluster C`):
//! - a preset name ([`Cluster::preset`], listed by [`PRESETS`] / `pipec plan --list-clusters`);
//! - a TOML file ([`Cluster::from_toml_str`]; format below);
//! - an inline hierarchy `N1@BW1,N2@BW2` ([`Cluster::from_inline`]), read like PipeDream's flags.
//!
//! `--devices N` keeps the first `N` devices in index order ([`Cluster::take`]).
//!
//! TOML format (all sizes in bytes, bandwidths in bytes/s, latencies in seconds, FLOP/s per dtype):
//! ```toml
//! name = "two-v100-servers"
//! [[device_kind]]
//! name = "V100-16GB"
//! memory_bytes = 17179869184
//! memory_bandwidth = 900e9
//! peak_flops = { f32 = 15.7e12, f16 = 125e12 }
//! [[level]]            # innermost first
//! name = "nvlink"
//! size = 8
//! bandwidth = 130e9
//! latency = 5e-6
//! [[level]]
//! name = "ethernet"
//! size = 2
//! bandwidth = 3.125e9
//! latency = 50e-6
//! [[node]]             # optional; default: every node is of the first device_kind
//! kind = "V100-16GB"
//! count = 2
//! ```

use pipec_compiler::ir::DType;
use pipec_compiler::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Numeric precision classes that have their own peak rate on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F64,
    F32,
    /// TF32 tensor cores (used for f32 matmuls when a kind lists it).
    Tf32,
    F16,
    Bf16,
    F8,
    I8,
}

impl Precision {
    /// The precision class an IR element type computes in.
    pub fn of(dtype: DType) -> Precision {
        use DType::*;
        match dtype {
            F64 | Complex128 => Precision::F64,
            F16 => Precision::F16,
            BF16 => Precision::Bf16,
            F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ => Precision::F8,
            I8 | U8 | U4 | I4 | Bool => Precision::I8,
            _ => Precision::F32,
        }
    }
}

/// One kind of accelerator (or CPU core).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceKind {
    pub name: String,
    /// Device memory capacity in bytes.
    pub memory_bytes: u64,
    /// Device memory bandwidth in bytes/s.
    pub memory_bandwidth: f64,
    /// Peak FLOP/s per precision class. A missing class falls back (see [`DeviceKind::peak`]).
    pub peak_flops: BTreeMap<Precision, f64>,
}

impl DeviceKind {
    /// Peak FLOP/s for a precision: the listed figure, else f16/bf16 fall back to each other and
    /// then to f32, f8/i8 to f16, tf32 and f64 to f32; f32 must be listed (checked on load).
    pub fn peak(&self, p: Precision) -> f64 {
        use Precision::*;
        let chain: &[Precision] = match p {
            F64 => &[F64, F32],
            F32 => &[F32],
            Tf32 => &[Tf32, F32],
            F16 => &[F16, Bf16, F32],
            Bf16 => &[Bf16, F16, F32],
            F8 => &[F8, F16, Bf16, F32],
            I8 => &[I8, F8, F16, F32],
        };
        chain
            .iter()
            .find_map(|q| self.peak_flops.get(q).copied())
            .unwrap_or(1.0)
    }

    fn validate(&self, ctx: &str) -> Result<()> {
        if self.name.is_empty() {
            return Err(Error::Usage(format!(
                "{ctx}: device_kind has an empty name"
            )));
        }
        let who = format!("{ctx}: device_kind '{}'", self.name);
        if self.memory_bytes == 0 {
            return Err(Error::Usage(format!("{who}: memory_bytes must be > 0")));
        }
        positive(self.memory_bandwidth, &who, "memory_bandwidth")?;
        if !self.peak_flops.contains_key(&Precision::F32) {
            return Err(Error::Usage(format!(
                "{who}: peak_flops needs an f32 entry"
            )));
        }
        for (p, v) in &self.peak_flops {
            positive(*v, &who, &format!("peak_flops.{p:?}").to_lowercase())?;
        }
        Ok(())
    }
}

fn positive(v: f64, who: &str, field: &str) -> Result<()> {
    if !(v.is_finite() && v > 0.0) {
        return Err(Error::Usage(format!(
            "{who}: {field} must be a positive finite number, got {v}"
        )));
    }
    Ok(())
}

/// One level of the hierarchy: `size` groups of the level below, joined by one kind of link.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// Link name (`nvlink`, `pcie`, `ethernet`, `infiniband`).
    pub name: String,
    /// Fan-out: how many members of the level below form one group of this level.
    pub size: usize,
    /// Bandwidth of one link at this level, bytes/s, per direction.
    pub bandwidth: f64,
    /// Latency (α) of one message at this level, seconds.
    #[serde(default)]
    pub latency: f64,
}

/// One device of the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// Index in the cluster (0-based); plans name devices by it.
    pub id: usize,
    /// Index into [`Cluster::kinds`].
    pub kind: usize,
    /// Group index at each level: `coord[0]` is the position inside the node, `coord[l]` the
    /// position of its level-(l−1) group inside the level-l group.
    pub coord: Vec<usize>,
}

/// A cluster of devices with a hierarchical interconnect. See the module doc.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    pub name: String,
    pub kinds: Vec<DeviceKind>,
    /// Levels, innermost first. At least one.
    pub levels: Vec<Level>,
    pub devices: Vec<Device>,
    /// Cores of one host that all the devices share, when there are fewer cores than devices
    /// (the `cpu` preset oversubscribed with `--devices N`, as `pipec run`'s worker threads
    /// share this machine): the simulator shares them between the devices computing at once
    /// (processor sharing, as the OS time-slices threads). `None`: every device computes on its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cores: Option<usize>,
    /// With `host_cores`: how much slower one task computes when every host core is busy than
    /// when it runs alone (memory bandwidth, caches, a shared core's clock), measured by
    /// `pipec profile` (`concurrent_run_s / run_s`); 1 when unknown. The simulator interpolates
    /// it linearly in the number of busy cores.
    #[serde(default = "one_f64", skip_serializing_if = "is_one_f64")]
    pub host_slowdown: f64,
}

fn one_f64() -> f64 {
    1.0
}

fn is_one_f64(x: &f64) -> bool {
    *x == 1.0
}

/// A preset: name, one-line description (for `--list-clusters`), and its constructor.
pub struct Preset {
    pub name: &'static str,
    pub summary: &'static str,
    build: fn() -> Cluster,
}

impl Preset {
    pub fn build(&self) -> Cluster {
        (self.build)()
    }
}

/// The most devices a cluster may have. Every planner stays within a minute up to here on the
/// bundled models (PipeDream's DP at 16384 devices: 0.3 s on mlp4; GPP and DAPPLE have lower
/// limits of their own); a hundred thousand devices made `dp` and `pipedream` run for minutes.
pub const MAX_DEVICES: usize = 16384;

// ---- device kinds: vendor datasheet figures (dense, no sparsity) ----

/// NVIDIA V100 SXM2 16 GB: 15.7 TFLOP/s fp32, 125 TFLOP/s fp16 tensor, 900 GB/s HBM2.
pub fn v100_16gb() -> DeviceKind {
    kind(
        "V100-16GB",
        16 << 30,
        900e9,
        &[
            (Precision::F32, 15.7e12),
            (Precision::F64, 7.8e12),
            (Precision::F16, 125e12),
        ],
    )
}

/// NVIDIA Titan X (Pascal) 12 GB: 11 TFLOP/s fp32, 480 GB/s (PipeDream's Cluster-A).
pub fn titan_x_12gb() -> DeviceKind {
    kind(
        "TitanX-12GB",
        12 << 30,
        480e9,
        &[(Precision::F32, 11.0e12), (Precision::F16, 11.0e12)],
    )
}

/// NVIDIA H100 SXM5 80 GB: 67 TFLOP/s fp32, 495 tf32, 989 fp16/bf16, 1979 fp8, 3.35 TB/s HBM3.
pub fn h100_80gb() -> DeviceKind {
    kind(
        "H100-80GB",
        80 << 30,
        3.35e12,
        &[
            (Precision::F64, 34e12),
            (Precision::F32, 67e12),
            (Precision::Tf32, 495e12),
            (Precision::F16, 989e12),
            (Precision::Bf16, 989e12),
            (Precision::F8, 1979e12),
            (Precision::I8, 1979e12),
        ],
    )
}

/// One core of this machine as the reference executor uses it (single-threaded), with an equal
/// share of the machine's memory. The figures are **measured** (`pipec profile --calibrate`,
/// `scripts/profile_error.sh`, BENCHMARKS.md "Analytic vs measured"): a 1024³ f32 MatMul on the
/// reference executor (matrixmultiply GEMM) ran at 7.1–8.0e10 FLOP/s → 75 GFLOP/s f32 (f64 taken
/// as half); an f32 `Add` over 2²⁴ elements (two 64 MiB reads, one write) moved 3.0–3.9e9 B/s →
/// 3.5 GB/s effective memory bandwidth (a streaming kernel of the interpreter, well below the
/// DRAM's peak). Best of 3 runs each, on the shared 2-core development machine under load. (The
/// earlier datasheet guess was 96 GFLOP/s and 10 GB/s.)
pub fn cpu_core(mem_bytes: u64) -> DeviceKind {
    kind(
        "cpu-core",
        mem_bytes.max(1),
        3.5e9,
        &[(Precision::F32, 75e9), (Precision::F64, 37.5e9)],
    )
}

fn kind(name: &str, mem: u64, bw: f64, peaks: &[(Precision, f64)]) -> DeviceKind {
    DeviceKind {
        name: name.to_string(),
        memory_bytes: mem,
        memory_bandwidth: bw,
        peak_flops: peaks.iter().copied().collect(),
    }
}

/// A device kind by name (the kinds the presets use), for `--device-kind`.
pub fn device_kind_by_name(name: &str) -> Option<DeviceKind> {
    let all = [
        v100_16gb(),
        titan_x_12gb(),
        h100_80gb(),
        cpu_core(machine_memory() / cores() as u64),
    ];
    all.into_iter().find(|k| k.name.eq_ignore_ascii_case(name))
}

fn level(name: &str, size: usize, bw: f64, lat: f64) -> Level {
    Level {
        name: name.to_string(),
        size,
        bandwidth: bw,
        latency: lat,
    }
}

const GBPS: f64 = 1e9 / 8.0;

// Link figures: NVLink 2 on DGX-1 "up to 130 GB/s" (DAPPLE arXiv), Summit NVLink 2 at 50 GB/s per
// direction between GPU pairs, NVLink 4 at 450 GB/s per direction (900 GB/s bidirectional), PCIe 3.0
// x16 at 15.75 GB/s. Network figures are the papers' nominal rates (25 Gbps = 3.125 GB/s). The
// latencies are typical values (not from the papers): NVLink 5 µs, PCIe 10 µs, IB 5 µs, Ethernet 50 µs.

/// The built-in presets (the papers' testbeds).
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "dapple-a",
        summary: "DAPPLE config A: 2 servers x 8 V100-16GB, NVLink 130 GB/s inside, 25 Gbps Ethernet between",
        build: || {
            homogeneous(
                "dapple-a",
                v100_16gb(),
                vec![level("nvlink", 8, 130e9, 5e-6), level("ethernet", 2, 25.0 * GBPS, 50e-6)],
            )
        },
    },
    Preset {
        name: "dapple-b",
        summary: "DAPPLE config B: 16 servers x 1 V100-16GB, 25 Gbps Ethernet",
        build: || {
            homogeneous(
                "dapple-b",
                v100_16gb(),
                vec![level("pcie", 1, 15.75e9, 10e-6), level("ethernet", 16, 25.0 * GBPS, 50e-6)],
            )
        },
    },
    Preset {
        name: "dapple-c",
        summary: "DAPPLE config C: 16 servers x 1 V100-16GB, 10 Gbps Ethernet",
        build: || {
            homogeneous(
                "dapple-c",
                v100_16gb(),
                vec![level("pcie", 1, 15.75e9, 10e-6), level("ethernet", 16, 10.0 * GBPS, 50e-6)],
            )
        },
    },
    Preset {
        name: "pipedream-a",
        summary: "PipeDream Cluster-A: 16 servers x 1 Titan X 12 GB, 25 Gbps Ethernet",
        build: || {
            homogeneous(
                "pipedream-a",
                titan_x_12gb(),
                vec![level("pcie", 1, 15.75e9, 10e-6), level("ethernet", 16, 25.0 * GBPS, 50e-6)],
            )
        },
    },
    Preset {
        name: "pipedream-b",
        summary: "PipeDream Cluster-B (AWS p3.2xlarge): 16 servers x 1 V100-16GB, 10 Gbps Ethernet",
        build: || {
            homogeneous(
                "pipedream-b",
                v100_16gb(),
                vec![level("pcie", 1, 15.75e9, 10e-6), level("ethernet", 16, 10.0 * GBPS, 50e-6)],
            )
        },
    },
    Preset {
        name: "summit",
        summary: "Summit as GraphPipe uses it: 8 nodes x 4 V100-16GB, NVLink 50 GB/s, EDR 100 Gb InfiniBand",
        build: || {
            homogeneous(
                "summit",
                v100_16gb(),
                vec![level("nvlink", 4, 50e9, 5e-6), level("infiniband", 8, 100.0 * GBPS, 5e-6)],
            )
        },
    },
    Preset {
        name: "bapipe-pcie",
        summary: "BaPipe's testbed: 1 server x 8 V100-16GB on PCIe 3.0 x16 (15.75 GB/s)",
        build: || homogeneous("bapipe-pcie", v100_16gb(), vec![level("pcie", 8, 15.75e9, 10e-6)]),
    },
    Preset {
        name: "bapipe-hetero",
        summary: "heterogeneous chain for BaPipe: 2 V100-16GB + 2 TitanX-12GB, one per server, PCIe 3.0 x16 (15.75 GB/s)",
        build: || {
            Cluster::build(
                "bapipe-hetero",
                vec![v100_16gb(), titan_x_12gb()],
                vec![level("pcie", 1, 15.75e9, 10e-6), level("pcie-chain", 4, 15.75e9, 10e-6)],
                &[(0, 2), (1, 2)],
            )
            .unwrap_or_else(|e| panic!("preset bapipe-hetero: {e}"))
        },
    },
    Preset {
        name: "dgx-h100",
        summary: "4 DGX H100 nodes x 8 H100-80GB, NVLink 4 (450 GB/s per direction), 400 Gb InfiniBand",
        build: || {
            homogeneous(
                "dgx-h100",
                h100_80gb(),
                vec![level("nvlink4", 8, 450e9, 3e-6), level("infiniband", 4, 400.0 * GBPS, 5e-6)],
            )
        },
    },
    Preset {
        name: "cpu",
        summary: "this machine: one device per CPU core (--devices N > cores oversubscribes), shared memory 10 GB/s",
        build: || {
            let n = cores();
            homogeneous(
                "cpu",
                cpu_core(machine_memory() / n as u64),
                vec![level("shm", n, 10e9, 1e-6)],
            )
        },
    },
];

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Total memory of this machine from `/proc/meminfo` (8 GiB if unknown).
fn machine_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(8 << 30)
}

fn homogeneous(name: &str, k: DeviceKind, levels: Vec<Level>) -> Cluster {
    // Presets are valid by construction; `build` cannot fail for them.
    Cluster::build(name, vec![k], levels, &[]).unwrap_or_else(|e| panic!("preset {name}: {e}"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlCluster {
    name: Option<String>,
    device_kind: Vec<TomlKind>,
    level: Vec<TomlLevel>,
    #[serde(default)]
    node: Vec<TomlNode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlKind {
    name: String,
    memory_bytes: f64,
    memory_bandwidth: f64,
    peak_flops: BTreeMap<Precision, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlLevel {
    name: Option<String>,
    size: i64,
    bandwidth: f64,
    #[serde(default)]
    latency: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlNode {
    kind: String,
    #[serde(default = "one")]
    count: i64,
}

fn one() -> i64 {
    1
}

impl Cluster {
    /// Build and validate a cluster. `node_kinds` gives `(kind index, count)` runs for the nodes in
    /// order; empty means every node is of kind 0.
    pub fn build(
        name: &str,
        kinds: Vec<DeviceKind>,
        levels: Vec<Level>,
        node_kinds: &[(usize, usize)],
    ) -> Result<Cluster> {
        if kinds.is_empty() {
            return Err(Error::Usage(format!("{name}: no device_kind")));
        }
        for k in &kinds {
            k.validate(name)?;
        }
        if levels.is_empty() {
            return Err(Error::Usage(format!(
                "{name}: no level (need at least one)"
            )));
        }
        for (i, l) in levels.iter().enumerate() {
            let who = format!("{name}: level {i} ('{}')", l.name);
            if l.size == 0 {
                return Err(Error::Usage(format!("{who}: size must be >= 1")));
            }
            positive(l.bandwidth, &who, "bandwidth")?;
            if !(l.latency.is_finite() && l.latency >= 0.0) {
                return Err(Error::Usage(format!(
                    "{who}: latency must be >= 0, got {}",
                    l.latency
                )));
            }
        }
        let total = levels
            .iter()
            .try_fold(1usize, |a, l| a.checked_mul(l.size))
            .filter(|n| *n <= MAX_DEVICES)
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{name}: too many devices (the levels' sizes multiply to more than {MAX_DEVICES})"
                ))
            })?;
        let per_node = levels[0].size;
        let nodes = total / per_node;
        let mut node_kind = vec![0usize; nodes];
        if !node_kinds.is_empty() {
            let listed: usize = node_kinds.iter().map(|(_, c)| c).sum();
            if listed != nodes {
                return Err(Error::Usage(format!(
                    "{name}: [[node]] entries list {listed} nodes but the levels give {nodes}"
                )));
            }
            let mut i = 0;
            for &(k, c) in node_kinds {
                for _ in 0..c {
                    node_kind[i] = k;
                    i += 1;
                }
            }
        }
        let devices = (0..total)
            .map(|id| {
                let mut coord = Vec::with_capacity(levels.len());
                let mut rest = id;
                for l in &levels {
                    coord.push(rest % l.size);
                    rest /= l.size;
                }
                Device {
                    id,
                    kind: node_kind[id / per_node],
                    coord,
                }
            })
            .collect();
        Ok(Cluster {
            name: name.to_string(),
            kinds,
            levels,
            devices,
            host_cores: None,
            host_slowdown: 1.0,
        })
    }

    /// A preset by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Option<Cluster> {
        PRESETS.iter().find(|p| p.name == name).map(Preset::build)
    }

    /// Parse a TOML cluster description; `file` names it in errors.
    pub fn from_toml_str(text: &str, file: &str) -> Result<Cluster> {
        let t: TomlCluster = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                    format!(":{line}")
                })
                .unwrap_or_default();
            Error::Usage(format!("{file}{at}: bad cluster description: {msg}"))
        })?;
        let mut kinds = Vec::new();
        for k in t.device_kind {
            if !(k.memory_bytes.is_finite() && k.memory_bytes > 0.0) {
                return Err(Error::Usage(format!(
                    "{file}: device_kind '{}': memory_bytes must be > 0, got {}",
                    k.name, k.memory_bytes
                )));
            }
            kinds.push(DeviceKind {
                name: k.name,
                memory_bytes: k.memory_bytes as u64,
                memory_bandwidth: k.memory_bandwidth,
                peak_flops: k.peak_flops,
            });
        }
        let mut levels = Vec::new();
        for (i, l) in t.level.into_iter().enumerate() {
            if l.size < 1 {
                return Err(Error::Usage(format!(
                    "{file}: level {i}: size must be >= 1, got {}",
                    l.size
                )));
            }
            levels.push(Level {
                name: l.name.unwrap_or_else(|| format!("level{i}")),
                size: l.size as usize,
                bandwidth: l.bandwidth,
                latency: l.latency,
            });
        }
        let mut runs = Vec::new();
        for n in &t.node {
            let k = kinds.iter().position(|k| k.name == n.kind).ok_or_else(|| {
                Error::Usage(format!(
                    "{file}: [[node]] names unknown device_kind '{}'",
                    n.kind
                ))
            })?;
            if n.count < 0 {
                return Err(Error::Usage(format!(
                    "{file}: [[node]] count must be >= 0, got {}",
                    n.count
                )));
            }
            runs.push((k, n.count as usize));
        }
        let name = t.name.unwrap_or_else(|| {
            Path::new(file)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| file.to_string())
        });
        Cluster::build(&name, kinds, levels, &runs).map_err(|e| match e {
            Error::Usage(m) if !m.starts_with(file) => Error::Usage(format!("{file}: {m}")),
            e => e,
        })
    }

    /// An inline homogeneous hierarchy `N1@BW1,N2@BW2,...` (N1 devices per group joined at BW1
    /// bytes/s, N2 such groups at BW2, ...), as PipeDream's `-n N1 N2 -b BW1 BW2`. Latency 0.
    pub fn from_inline(spec: &str, kind: DeviceKind) -> Result<Cluster> {
        let mut levels = Vec::new();
        for (i, part) in spec.split(',').enumerate() {
            let (n, bw) = part.split_once('@').ok_or_else(|| {
                Error::Usage(format!(
                    "--cluster {spec}: '{part}' is not N@BANDWIDTH (e.g. 8@25e9)"
                ))
            })?;
            let n: usize = n.trim().parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                Error::Usage(format!(
                    "--cluster {spec}: '{n}' is not a device count >= 1"
                ))
            })?;
            let bw: f64 = bw
                .trim()
                .parse()
                .ok()
                .filter(|b: &f64| b.is_finite() && *b > 0.0)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "--cluster {spec}: '{bw}' is not a bandwidth > 0 in bytes/s"
                    ))
                })?;
            levels.push(level(&format!("level{i}"), n, bw, 0.0));
        }
        Cluster::build(spec, vec![kind], levels, &[])
            .map_err(|e| Error::Usage(format!("--cluster {spec}: {e}")))
    }

    /// Resolve `--cluster C`: a preset name, an inline `N@BW,...` hierarchy, or a TOML file.
    /// `kind` is the device kind for the inline form (V100-16GB when `None`).
    pub fn resolve(spec: &str, kind: Option<DeviceKind>) -> Result<Cluster> {
        if let Some(c) = Cluster::preset(spec) {
            return Ok(c);
        }
        if spec.contains('@') && !spec.ends_with(".toml") {
            return Cluster::from_inline(spec, kind.unwrap_or_else(v100_16gb));
        }
        let path = Path::new(spec);
        if !path.exists() {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            return Err(Error::Usage(format!(
                "--cluster {spec}: not a preset ({}), an N@BW,... hierarchy, or an existing TOML file",
                names.join(", ")
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Cluster::from_toml_str(&text, spec)
    }

    /// Keep the first `n` devices (`--devices N`). Fails if the cluster has fewer.
    pub fn take(mut self, n: usize) -> Result<Cluster> {
        if n == 0 {
            return Err(Error::Usage("--devices 0: need at least one device".into()));
        }
        if n > MAX_DEVICES {
            return Err(Error::Usage(format!(
                "--devices {n}: pipec plans for at most {MAX_DEVICES} devices"
            )));
        }
        if n > self.devices.len() && self.name == "cpu" {
            // The `cpu` preset may be oversubscribed: N worker devices sharing this machine's
            // cores (what `pipec run` executes on), each with its share of the memory.
            let mut c = homogeneous(
                "cpu",
                cpu_core(machine_memory() / n as u64),
                vec![level("shm", n, 10e9, 1e-6)],
            );
            c.host_cores = Some(self.devices.len());
            return Ok(c);
        }
        if n > self.devices.len() {
            return Err(Error::Usage(format!(
                "--devices {n}: cluster '{}' has only {} devices",
                self.name,
                self.devices.len()
            )));
        }
        self.devices.truncate(n);
        Ok(self)
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// True when there is no device (never, for a validated cluster).
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device kind of device `d`.
    pub fn kind_of(&self, d: usize) -> &DeviceKind {
        &self.kinds[self.devices[d].kind]
    }

    /// Node (level-0 group) index of device `d`.
    pub fn node_of(&self, d: usize) -> usize {
        d / self.levels[0].size
    }

    /// The highest level at which `a` and `b` sit in different groups, i.e. the level whose link a
    /// message between them must cross; `None` when `a == b`.
    pub fn span_level(&self, a: usize, b: usize) -> Option<usize> {
        if a == b {
            return None;
        }
        let (ca, cb) = (&self.devices[a].coord, &self.devices[b].coord);
        (0..self.levels.len()).rev().find(|&l| ca[l] != cb[l])
    }

    /// The level a group of devices spans (the highest [`Cluster::span_level`] over its pairs).
    pub fn group_span_level(&self, devs: &[usize]) -> Option<usize> {
        let first = *devs.first()?;
        devs.iter().filter_map(|&d| self.span_level(first, d)).max()
    }

    /// The path link between `a` and `b`: bandwidth of the slowest level crossed on the way up to
    /// the spanning level, and the sum of the latencies of the levels crossed. `None` when `a == b`.
    pub fn path(&self, a: usize, b: usize) -> Option<(f64, f64)> {
        let top = self.span_level(a, b)?;
        Some(self.path_to_level(top))
    }

    /// Slowest bandwidth and summed latency from a device up to level `top` (inclusive).
    pub fn path_to_level(&self, top: usize) -> (f64, f64) {
        let ls = &self.levels[..=top];
        let bw = ls.iter().map(|l| l.bandwidth).fold(f64::INFINITY, f64::min);
        let lat = ls.iter().map(|l| l.latency).sum();
        (bw, lat)
    }

    /// One line per level, for messages: `8 x nvlink @ 130 GB/s, 2 x ethernet @ 3.125 GB/s`.
    pub fn describe(&self) -> String {
        let lv: Vec<String> = self
            .levels
            .iter()
            .map(|l| format!("{} x {} @ {} GB/s", l.size, l.name, l.bandwidth / 1e9))
            .collect();
        let kinds: Vec<&str> = self.kinds.iter().map(|k| k.name.as_str()).collect();
        format!(
            "{}: {} devices ({}), {}",
            self.name,
            self.devices.len(),
            kinds.join("+"),
            lv.join(", ")
        )
    }
}
