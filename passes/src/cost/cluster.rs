//! Cluster descriptions: device kinds, a hierarchy of link levels, and the devices.
//!
//! A [`Cluster`] is a tree. Level 0 groups `levels[0].size` devices (a server; its link is NVLink or
//! PCIe), level 1 groups `levels[1].size` level-0 groups (its link is Ethernet or InfiniBand), and
//! so on: exactly PipeDream's `-n N1 N2 ... -b B1 B2 ...` hierarchy, with a latency per level added
//! for the α-β model of [`super::comm`]. A level-0 group is called a *node*. Every node has one
//! device kind, so a cluster may mix kinds (heterogeneous), node by node.
//!
//! Three ways to get one (`pipec plan --cluster C`):
//! - a preset name ([`Cluster::preset`], listed by [`PRESETS`] / `pipec plan --list-clusters`):
//!   the presets are TOML files of the format below in `passes/presets/` (compiled in; `pipec plan
//!   --show-cluster NAME` prints one), except `cpu`, which is built from this machine;
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
//! A `[[device_kind]]` that gives only `name` is a known kind ([`device_kind_by_name`]: those of
//! `passes/presets/device-kinds.toml` and `cpu-core`); `summary` is an optional one-line
//! description.

use pipec_compiler::ir::DType;
use pipec_compiler::{Error, PlanOption, Result};
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
    /// The name TOML descriptions use (`f32`, `tf32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
            Precision::F8 => "f8",
            Precision::I8 => "i8",
        }
    }

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

/// A preset: its name and where its description comes from.
pub struct Preset {
    pub name: &'static str,
    source: PresetSource,
}

enum PresetSource {
    /// A TOML description compiled in from `passes/presets/NAME.toml`.
    Toml(&'static str),
    /// The `cpu` preset, built from this machine.
    ThisMachine,
}

impl Preset {
    /// The cluster. Presets are valid by construction (a unit test builds every one).
    pub fn build(&self) -> Cluster {
        match self.source {
            PresetSource::Toml(text) => {
                Cluster::from_toml_str(text, &format!("presets/{}.toml", self.name))
                    .unwrap_or_else(|e| panic!("preset {}: {e}", self.name))
            }
            PresetSource::ThisMachine => cpu_cluster(cores()),
        }
    }

    /// The one-line description `--list-clusters` prints (the file's `summary`).
    pub fn summary(&self) -> String {
        match self.source {
            PresetSource::Toml(text) => toml::from_str::<TomlCluster>(text)
                .ok()
                .and_then(|t| t.summary)
                .unwrap_or_default(),
            PresetSource::ThisMachine => CPU_SUMMARY.to_string(),
        }
    }

    /// The preset as a TOML cluster description (the file it is compiled from; for `cpu`, this
    /// machine's cluster written out), to copy and edit into a `--cluster FILE.toml`.
    pub fn toml(&self) -> String {
        match self.source {
            PresetSource::Toml(text) => text.to_string(),
            PresetSource::ThisMachine => cpu_cluster(cores()).to_toml(&self.summary()),
        }
    }
}

/// The most devices a cluster may have. Every planner stays within a minute up to here on the
/// bundled models (PipeDream's DP at 16384 devices: 0.3 s on mlp4; GPP and DAPPLE have lower
/// limits of their own); a hundred thousand devices made `dp` and `pipedream` run for minutes.
pub const MAX_DEVICES: usize = 16384;

// ---- device kinds: vendor datasheet figures (dense, no sparsity), in presets/device-kinds.toml ----

/// The device kinds of `presets/device-kinds.toml`, parsed once.
fn builtin_kinds() -> &'static [DeviceKind] {
    static KINDS: std::sync::OnceLock<Vec<DeviceKind>> = std::sync::OnceLock::new();
    KINDS.get_or_init(|| {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Kinds {
            device_kind: Vec<TomlKind>,
        }
        const FILE: &str = "presets/device-kinds.toml";
        let t: Kinds = toml::from_str(include_str!("../../presets/device-kinds.toml"))
            .unwrap_or_else(|e| panic!("{FILE}: {e}"));
        t.device_kind
            .into_iter()
            .map(|k| k.resolve(FILE).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    })
}

fn builtin_kind(name: &str) -> DeviceKind {
    builtin_kinds()
        .iter()
        .find(|k| k.name == name)
        .cloned()
        .unwrap_or_else(|| panic!("presets/device-kinds.toml has no kind '{name}'"))
}

/// NVIDIA V100 SXM2 16 GB: 15.7 TFLOP/s fp32, 125 TFLOP/s fp16 tensor, 900 GB/s HBM2.
pub fn v100_16gb() -> DeviceKind {
    builtin_kind("V100-16GB")
}

/// NVIDIA Titan X (Pascal) 12 GB: 11 TFLOP/s fp32, 480 GB/s (PipeDream's Cluster-A).
pub fn titan_x_12gb() -> DeviceKind {
    builtin_kind("TitanX-12GB")
}

/// NVIDIA H100 SXM5 80 GB: 67 TFLOP/s fp32, 495 tf32, 989 fp16/bf16, 1979 fp8, 3.35 TB/s HBM3.
pub fn h100_80gb() -> DeviceKind {
    builtin_kind("H100-80GB")
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

/// A device kind by name, case-insensitively (the kinds of `presets/device-kinds.toml` and
/// `cpu-core`), for `--device-kind` and for `[[device_kind]]` entries that give only a name.
pub fn device_kind_by_name(name: &str) -> Option<DeviceKind> {
    if name.eq_ignore_ascii_case("cpu-core") {
        return Some(cpu_core(machine_memory() / cores() as u64));
    }
    builtin_kinds()
        .iter()
        .find(|k| k.name.eq_ignore_ascii_case(name))
        .cloned()
}

/// The names [`device_kind_by_name`] knows, for error messages.
pub fn device_kind_names() -> Vec<&'static str> {
    builtin_kinds()
        .iter()
        .map(|k| k.name.as_str())
        .chain(["cpu-core"])
        .collect()
}

fn level(name: &str, size: usize, bw: f64, lat: f64) -> Level {
    Level {
        name: name.to_string(),
        size,
        bandwidth: bw,
        latency: lat,
    }
}

/// The built-in presets (the papers' testbeds), in `--list-clusters` order. Each is a TOML
/// cluster description in `passes/presets/` (the format of [`Cluster::from_toml_str`], with a
/// `summary` line), compiled in; `cpu` alone is built in code, from this machine's cores and memory.
pub const PRESETS: &[Preset] = &[
    preset("dapple-a", include_str!("../../presets/dapple-a.toml")),
    preset("dapple-b", include_str!("../../presets/dapple-b.toml")),
    preset("dapple-c", include_str!("../../presets/dapple-c.toml")),
    preset(
        "pipedream-a",
        include_str!("../../presets/pipedream-a.toml"),
    ),
    preset(
        "pipedream-b",
        include_str!("../../presets/pipedream-b.toml"),
    ),
    preset("summit", include_str!("../../presets/summit.toml")),
    preset(
        "bapipe-pcie",
        include_str!("../../presets/bapipe-pcie.toml"),
    ),
    preset(
        "bapipe-hetero",
        include_str!("../../presets/bapipe-hetero.toml"),
    ),
    preset("dgx-h100", include_str!("../../presets/dgx-h100.toml")),
    Preset {
        name: "cpu",
        source: PresetSource::ThisMachine,
    },
];

const fn preset(name: &'static str, toml: &'static str) -> Preset {
    Preset {
        name,
        source: PresetSource::Toml(toml),
    }
}

/// The `cpu` preset with `n` devices (one per core of this machine, or more sharing its cores),
/// each with an equal share of its memory, joined by shared memory.
fn cpu_cluster(n: usize) -> Cluster {
    Cluster::build(
        "cpu",
        vec![cpu_core(machine_memory() / n as u64)],
        vec![level("shm", n, 10e9, 1e-6)],
        &[],
    )
    .unwrap_or_else(|e| panic!("preset cpu: {e}"))
}

const CPU_SUMMARY: &str =
    "this machine: one device per CPU core (--devices N > cores oversubscribes), shared memory 10 GB/s";

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlCluster {
    name: Option<String>,
    /// A one-line description (`--list-clusters` prints the presets' own).
    summary: Option<String>,
    device_kind: Vec<TomlKind>,
    level: Vec<TomlLevel>,
    #[serde(default)]
    node: Vec<TomlNode>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlKind {
    name: String,
    memory_bytes: Option<f64>,
    memory_bandwidth: Option<f64>,
    peak_flops: Option<BTreeMap<Precision, f64>>,
}

impl TomlKind {
    /// The kind this entry describes: its figures, or, when it gives only a name, the known kind
    /// of that name ([`device_kind_by_name`]; its name as the kind spells it).
    fn resolve(self, file: &str) -> Result<DeviceKind> {
        match (self.memory_bytes, self.memory_bandwidth, self.peak_flops) {
            (None, None, None) => device_kind_by_name(&self.name).ok_or_else(|| {
                Error::Usage(format!(
                    "{file}: device_kind '{}' gives no figures and is not a known kind ({}); \
                         give memory_bytes, memory_bandwidth and peak_flops",
                    self.name,
                    device_kind_names().join(", ")
                ))
            }),
            (Some(memory_bytes), Some(memory_bandwidth), Some(peak_flops)) => {
                if !(memory_bytes.is_finite() && memory_bytes > 0.0) {
                    return Err(Error::Usage(format!(
                        "{file}: device_kind '{}': memory_bytes must be > 0, got {memory_bytes}",
                        self.name
                    )));
                }
                Ok(DeviceKind {
                    name: self.name,
                    memory_bytes: memory_bytes as u64,
                    memory_bandwidth,
                    peak_flops,
                })
            }
            _ => Err(Error::Usage(format!(
                "{file}: device_kind '{}': give all of memory_bytes, memory_bandwidth and \
                 peak_flops, or only the name of a known kind ({})",
                self.name,
                device_kind_names().join(", ")
            ))),
        }
    }
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
            kinds.push(k.resolve(file)?);
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
        let bad = |m: String| Error::option(PlanOption::Cluster, spec, m);
        let mut levels = Vec::new();
        for (i, part) in spec.split(',').enumerate() {
            let (n, bw) = part
                .split_once('@')
                .ok_or_else(|| bad(format!("'{part}' is not N@BANDWIDTH (e.g. 8@25e9)")))?;
            let n: usize = n
                .trim()
                .parse()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| bad(format!("'{n}' is not a device count >= 1")))?;
            let bw: f64 = bw
                .trim()
                .parse()
                .ok()
                .filter(|b: &f64| b.is_finite() && *b > 0.0)
                .ok_or_else(|| bad(format!("'{bw}' is not a bandwidth > 0 in bytes/s")))?;
            levels.push(level(&format!("level{i}"), n, bw, 0.0));
        }
        Cluster::build(spec, vec![kind], levels, &[]).map_err(|e| bad(format!("{e}")))
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
            return Err(Error::option(
                PlanOption::Cluster,
                spec,
                format!(
                    "not a preset ({}), an N@BW,... hierarchy, or an existing TOML file",
                    names.join(", ")
                ),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Cluster::from_toml_str(&text, spec)
    }

    /// Keep the first `n` devices (`--devices N`). Fails if the cluster has fewer.
    pub fn take(mut self, n: usize) -> Result<Cluster> {
        if n == 0 {
            return Err(Error::option(
                PlanOption::Devices,
                0,
                "need at least one device",
            ));
        }
        if n > MAX_DEVICES {
            return Err(Error::option(
                PlanOption::Devices,
                n,
                format!("pipec plans for at most {MAX_DEVICES} devices"),
            ));
        }
        if n > self.devices.len() && self.name == "cpu" {
            // The `cpu` preset may be oversubscribed: N worker devices sharing this machine's
            // cores (what `pipec run` executes on), each with its share of the memory.
            let mut c = cpu_cluster(n);
            c.host_cores = Some(self.devices.len());
            return Ok(c);
        }
        if n > self.devices.len() {
            return Err(Error::option(
                PlanOption::Devices,
                n,
                format!(
                    "cluster '{}' has only {} devices",
                    self.name,
                    self.devices.len()
                ),
            ));
        }
        self.devices.truncate(n);
        Ok(self)
    }

    /// This cluster as a TOML description that [`Cluster::from_toml_str`] reads back equal (one
    /// `[[node]]` run per change of kind; `host_cores` is not part of the format).
    pub fn to_toml(&self, summary: &str) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        // A TOML basic string, escaped as TOML escapes it.
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let _ = writeln!(out, "name = {}", q(&self.name));
        if !summary.is_empty() {
            let _ = writeln!(out, "summary = {}", q(summary));
        }
        for k in &self.kinds {
            let peaks: Vec<String> = k
                .peak_flops
                .iter()
                .map(|(p, f)| format!("{} = {f:e}", p.name()))
                .collect();
            let _ = writeln!(
                out,
                "[[device_kind]]\nname = {}\nmemory_bytes = {}\nmemory_bandwidth = {:e}\npeak_flops = {{ {} }}",
                q(&k.name),
                k.memory_bytes,
                k.memory_bandwidth,
                peaks.join(", ")
            );
        }
        for l in &self.levels {
            let _ = writeln!(
                out,
                "[[level]]\nname = {}\nsize = {}\nbandwidth = {:e}\nlatency = {:e}",
                q(&l.name),
                l.size,
                l.bandwidth,
                l.latency
            );
        }
        if self.kinds.len() > 1 {
            let per_node = self.levels[0].size;
            let mut runs: Vec<(usize, usize)> = Vec::new();
            for d in self.devices.iter().step_by(per_node) {
                match runs.last_mut() {
                    Some((k, c)) if *k == d.kind => *c += 1,
                    _ => runs.push((d.kind, 1)),
                }
            }
            for (k, c) in runs {
                let _ = writeln!(
                    out,
                    "[[node]]\nkind = {}\ncount = {c}",
                    q(&self.kinds[k].name)
                );
            }
        }
        out
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
