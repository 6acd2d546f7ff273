//! The schedule kinds (`--schedule`): their names, parsing and what each implies for the
//! stage graph. Apart from the generator (`schedule.rs`) so the stage graph can name a kind
//! without depending on the generator.

use serde::Serialize;

/// Most chunks per device group of `interleaved-V`.
pub const MAX_CHUNKS: u32 = 64;

/// A schedule kind (`--schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum ScheduleKind {
    GPipe,
    OneFOneB,
    DappleA,
    DappleB,
    OneFOneBSo,
    Gpp,
    /// GPipe with re-computation of the forward during the backward.
    GPipeRecompute,
    /// 1F1B (policy A) with re-computation.
    OneFOneBRecompute,
    /// PipeDream's 1F1B with whole micro-batches given to replicas round robin.
    OneFOneBRr,
    /// GraphPipe's kFkB with the same `k` (≥ 1) and micro-batch on every stage.
    Kfkb(u32),
    /// GraphPipe's per-stage micro-batch sizes and `k_sFk_sB` schedules
    /// ([`crate::sim::PerStage`] on the stage graph; without it, the same as `gpp`).
    GppPerStage,
    /// Zero-bubble ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, §3.1): 1F1B's
    /// forwards and backwards with each backward split into `B` (input gradients) and `W`
    /// (weight gradients), a stage's `W` lagging its `B` by as many micro-batches as the stage
    /// lies behind the deepest one ([`crate::sim::schedule::weight_lag`]).
    ZbH1,
    /// Zero-bubble ZB-H2 (Qi et al. 2023, §3.1): ZB-H1's split backward with DAPPLE policy B's
    /// longer warm-up (`2·depth − 1` forwards, so no stage waits for its first backward), each
    /// stage's `W` lagging as [`crate::sim::schedule::weight_lag`] says, at up to twice 1F1B's
    /// activation memory.
    ZbH2,
    /// PipeDream's asynchronous 1F1B (Narayanan et al. 2019, §3.3–3.4): 1F1B's order with no
    /// flush between micro-batches: after each backward a stage all-reduces that micro-batch's
    /// gradients over its replicas and applies the optimizer at once (each micro-batch is one
    /// of PipeDream's minibatches), and **weight stashing** keeps the parameter version a
    /// micro-batch's forward read for its backward ([`crate::sim::schedule::stashed`]).
    PipeDreamAsync,
    /// Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21, §2.2): `v` (≥ 2; 0 asks the
    /// planner to pick `v`, ZB-V or 1F1B, `--schedule interleaved`, and never reaches a plan)
    /// stages
    /// ("model chunks", virtual stages) per device group, stage `s` on the group of stage
    /// `s mod P` for `P` groups, each device running its chunks' forwards and backwards in one
    /// 1F1B order over "virtual micro-batches" ([`crate::sim::schedule::interleaved_order`]):
    /// the pipeline bubble shrinks `v` times, at `v` times the stage-to-stage messages.
    Interleaved(u32),
    /// Zero-bubble ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §6; torch's
    /// `ScheduleZBVZeroBubble`): two stages per device group laid out as a V, stage `s` on
    /// group `s` for `s < P` and on group `2P − 1 − s` after (the last group runs the two
    /// middle stages, the first the input and the loss), every backward split into `B` and
    /// `W`, in the order [`crate::sim::schedule::zbv_order`]: the bubble of ZB-H1 on a
    /// pipeline of `2P` half-stages at 1F1B's peak activation memory.
    Zbv,
}

/// The label ([`ScheduleKind::label`]).
impl std::fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl ScheduleKind {
    /// All kinds, in `--schedule` order.
    pub const ALL: [ScheduleKind; 13] = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::DappleA,
        ScheduleKind::DappleB,
        ScheduleKind::OneFOneBSo,
        ScheduleKind::Gpp,
        ScheduleKind::GPipeRecompute,
        ScheduleKind::OneFOneBRecompute,
        ScheduleKind::OneFOneBRr,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbH2,
        ScheduleKind::PipeDreamAsync,
        ScheduleKind::Zbv,
    ];

    /// The `--schedule` name.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::DappleA => "dapple-a",
            ScheduleKind::DappleB => "dapple-b",
            ScheduleKind::OneFOneBSo => "1f1b-so",
            ScheduleKind::Gpp => "gpp",
            ScheduleKind::GPipeRecompute => "gpipe-recompute",
            ScheduleKind::OneFOneBRecompute => "1f1b-recompute",
            ScheduleKind::OneFOneBRr => "1f1b-rr",
            ScheduleKind::Kfkb(_) => "kfkb",
            ScheduleKind::GppPerStage => "gpp-per-stage",
            ScheduleKind::ZbH1 => "zb-h1",
            ScheduleKind::ZbH2 => "zb-h2",
            ScheduleKind::PipeDreamAsync => "pipedream-async",
            ScheduleKind::Interleaved(_) => "interleaved",
            ScheduleKind::Zbv => "zbv",
        }
    }

    /// The name with its parameter, as `--schedule` takes it and `plan.json` records it:
    /// [`ScheduleKind::name`], or `kfkb-K`.
    pub fn label(self) -> String {
        match self {
            ScheduleKind::Kfkb(k) => format!("kfkb-{k}"),
            ScheduleKind::Interleaved(0) => "interleaved".to_string(),
            ScheduleKind::Interleaved(v) => format!("interleaved-{v}"),
            _ => self.name().to_string(),
        }
    }

    /// The `--schedule` names, for help and error messages.
    pub fn names() -> Vec<&'static str> {
        let mut v: Vec<&'static str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
        v.push("kfkb-K");
        v.push("gpp-per-stage");
        v.push("interleaved-V");
        v.push("interleaved");
        v
    }

    /// `k` of kFkB: how many forwards (and backwards) a stage runs back to back after its
    /// warm-up (1 for every kind but `kfkb-K`).
    pub fn group(self) -> usize {
        match self {
            ScheduleKind::Kfkb(k) => k.max(1) as usize,
            _ => 1,
        }
    }

    /// Whether the backward re-runs the forward (only stage inputs are kept in flight).
    pub fn recompute(self) -> bool {
        matches!(
            self,
            ScheduleKind::GPipeRecompute | ScheduleKind::OneFOneBRecompute
        )
    }

    /// Whether a stage's backward runs as two tasks, `B` (input gradients) then, later, `W`
    /// (weight gradients).
    pub fn splits_backward(self) -> bool {
        matches!(
            self,
            ScheduleKind::ZbH1 | ScheduleKind::ZbH2 | ScheduleKind::Zbv
        )
    }

    /// Whether every micro-batch's backward is followed at once by its own all-reduce and
    /// optimizer step (PipeDream's asynchronous 1F1B), instead of one flush per iteration.
    pub fn per_micro_batch_step(self) -> bool {
        self == ScheduleKind::PipeDreamAsync
    }

    /// Chunks per device group under interleaved 1F1B (`v`) and ZB-V (2), else 1: only then
    /// do several stages share devices.
    pub fn chunks(self) -> usize {
        match self {
            ScheduleKind::Interleaved(v) => v.max(1) as usize,
            ScheduleKind::Zbv => 2,
            _ => 1,
        }
    }

    /// Whether the schedule deals several stages to each device group: `interleaved-V`,
    /// `interleaved` (`V` yet to pick) and `zbv`. Planners then re-cut their stages into chunks
    /// ([`crate::planners::interleave`]).
    pub fn chunked(self) -> bool {
        matches!(self, ScheduleKind::Interleaved(_) | ScheduleKind::Zbv)
    }

    /// Whether the order runs the micro-batches through the chunks in groups of the `P` device
    /// groups, so that the micro-batch count must be a multiple of `P`: interleaved 1F1B
    /// (Megatron-LM's order); ZB-V's order takes any count.
    pub fn micro_batches_in_groups(self) -> bool {
        matches!(self, ScheduleKind::Interleaved(_))
    }

    /// The device group (of `p`) that runs stage `s` of a schedule with several chunks per
    /// group ([`ScheduleKind::chunks`]): `s mod p` under interleaved 1F1B (Megatron-LM deals
    /// the chunks round robin), the V of ZB-V (`s` down the groups, then `2p − 1 − s` back
    /// up), `s` otherwise.
    pub fn group_of(self, s: usize, p: usize) -> usize {
        match self {
            ScheduleKind::Interleaved(_) => s % p.max(1),
            ScheduleKind::Zbv if s >= p => (2 * p).saturating_sub(1 + s),
            _ => s,
        }
    }

    /// The stage of chunk `c` on device group `r` of `p` (the inverse of
    /// [`ScheduleKind::group_of`]): `c·p + r` under interleaved 1F1B, `r` and `2p − 1 − r`
    /// under ZB-V.
    pub fn chunk_stage(self, c: usize, r: usize, p: usize) -> usize {
        match self {
            ScheduleKind::Zbv if c == 1 => 2 * p - 1 - r,
            _ => c * p + r,
        }
    }

    /// Whether replicas take whole micro-batches round robin (PipeDream's 1F1B-RR) instead of an
    /// even slice of every micro-batch.
    pub fn round_robin(self) -> bool {
        self == ScheduleKind::OneFOneBRr
    }

    /// Parse a `--schedule` name.
    pub fn parse(s: &str) -> Option<ScheduleKind> {
        if let Some(k) = s.strip_prefix("kfkb-") {
            return k
                .parse::<u32>()
                .ok()
                .filter(|k| (1..=1024).contains(k))
                .map(ScheduleKind::Kfkb);
        }
        if s == "interleaved" {
            return Some(ScheduleKind::Interleaved(0));
        }
        if let Some(v) = s.strip_prefix("interleaved-") {
            return v
                .parse::<u32>()
                .ok()
                .filter(|v| (2..=MAX_CHUNKS).contains(v))
                .map(ScheduleKind::Interleaved);
        }
        if s == "gpp-per-stage" {
            return Some(ScheduleKind::GppPerStage);
        }
        ScheduleKind::ALL.iter().copied().find(|k| k.name() == s)
    }

    /// Warm-up forwards `K` of a stage at `depth` (stages to the sink, ≥ 1) with `m` micro-batches.
    pub fn warmup(self, depth: usize, m: usize) -> usize {
        let k = match self {
            ScheduleKind::GPipe | ScheduleKind::GPipeRecompute => m,
            ScheduleKind::OneFOneB
            | ScheduleKind::DappleA
            | ScheduleKind::Gpp
            | ScheduleKind::OneFOneBRecompute
            | ScheduleKind::OneFOneBRr
            | ScheduleKind::GppPerStage
            | ScheduleKind::ZbH1
            | ScheduleKind::PipeDreamAsync
            | ScheduleKind::Interleaved(_)
            | ScheduleKind::Zbv => depth,
            ScheduleKind::DappleB | ScheduleKind::ZbH2 => 2 * depth - 1,
            ScheduleKind::OneFOneBSo => 2 * depth,
            ScheduleKind::Kfkb(1) => depth,
            ScheduleKind::Kfkb(k) => k as usize + 2 * depth.saturating_sub(1),
        };
        k.clamp(1, m.max(1))
    }
}
