//! Placement (DESIGN §6): the data × tensor × pipeline parallel plan with the lowest time per
//! batch for a model given as per-layer costs, one layer graph per tensor width.
//!
//! # Model
//!
//! * **Downset.** A set of layers closed under predecessors: if a layer is in it, so is every
//!   layer with an edge into it. A chain of `n` layers has `n + 1` downsets; a branching graph
//!   has more (its order ideals).
//! * **Stage.** `D₂ \ D₁` for downsets `D₁ ⊂ D₂`. A partition into stages is a chain of
//!   downsets `∅ = D₀ ⊂ D₁ ⊂ … ⊂ D_p = all layers`; stage `i` holds `Dᵢ₊₁ \ Dᵢ`, so every edge
//!   goes from a stage to itself or to a later one.
//! * **Devices.** Each stage uses `k · t` devices: `k` replicas of one tensor-parallel group of
//!   `t`. Replicas take micro-batches round-robin (Piper's data parallelism within a stage),
//!   so a stage's per-micro-batch load counts `load / k` towards the pipeline rate and each
//!   replica holds `⌈in-flight / k⌉` micro-batches. The whole pipeline is replicated `d` times;
//!   each replica owns a block of `⌊N / (d·t)⌋ · t` devices (exactly `N / d` unless idle
//!   devices are allowed), and its stages use all of the block, or at most the block when idle
//!   devices are allowed.
//! * **Stage load** (one micro-batch, one replica): critical path of the forward latencies
//!   through the stage's layers + critical path of the backward latencies (each layer's
//!   backward includes its recomputation: nothing, `selective_recompute_s`, or its whole
//!   forward, because recomputation runs layer by layer inside the backward pass) + pipeline
//!   sends. A branching stage runs independent branches concurrently, so its load is a longest
//!   path, not a sum.
//! * **Pipeline sends** are charged to the sender: the activations on edges leaving the stage
//!   (forward) and the gradients on edges entering it from earlier stages (backward), each
//!   `bytes / B + α` on the tier spanning the stage's devices plus one tensor group of its
//!   neighbour, `(k + 1)·t`. Where the tensor group holds the whole tensor on every device
//!   (`replicated_edges`) and it is faster, each of the `t` devices sends a `t`-th and the
//!   receiving group all-gathers it on the tier of `t` devices (Megatron-LM's scatter/gather).
//! * **Memory per device:** weights + gradients + optimizer state (optimizer ÷ `d·k` with
//!   ZeRO-1) + activations of the micro-batch being processed + stash of the other in-flight
//!   micro-batches. In flight at a stage: 1F1B `s` (stages from this one to the last), GPipe
//!   `m` (all). Under full recompute a layer keeps only its input (`activation_bytes.full`)
//!   and the micro-batch being processed also holds the largest recomputed layer's full
//!   activations while that layer is recomputed. A layer that keeps as much under full
//!   recompute as without (a GPT's head) is not recomputed: its backward adds no forward.
//! * **Data-parallel gradient all-reduce:** ring over the `d·k` copies of each stage on the
//!   tier spanning `(d − 1)·block + k·t` devices, at that tier's bus bandwidth for the
//!   copies' layout (`arch::group_link`: with several copies in each domain of the tier
//!   below, one ring per copy's link, as NCCL over a node's NICs); with ZeRO-1 a
//!   reduce-scatter of gradients and an all-gather of weights. With overlap the stage's last
//!   backward hides `overlap_efficiency` of the all-reduce, up to its backward time. Stages
//!   reduce concurrently; the slowest exposed one counts.
//! * **Time per batch** `= L·(m + p − 1) + E`, `L` the largest `load / k`, `m = global batch
//!   / (d · micro-batch)` (must be an integer), `E` the largest exposed all-reduce.
//!
//! # Search
//!
//! [`place`] runs, per tensor width `t` and data-parallel width `d`, a dynamic programme over
//! (downset, stages to go, device groups) whose value is the lexicographically smallest
//! (largest `load / k`, largest exposed all-reduce). Since the objective adds the two maxima,
//! the programme is repeated with a tightening bound on the all-reduce term until no plan
//! with a smaller bound can win, which makes the result exact (it equals [`brute_force`]).
//!
//! (t, d) pairs are tried with the fewest tensor groups first, and each table only holds the
//! cells that can still beat the best time found so far: a plan that leaves `K` groups to the
//! stages after downset `D` has bottleneck at least (work after `D`) / `K` and (work before
//! `D`) / (groups − `K`), work being forward plus backward critical path; `s` stages cannot
//! hold more than `s` HBMs of weights, gradients and optimizer state. Cells outside these
//! bounds are cells the full table leaves empty or drops against the best time, so the plan
//! is the one the full table gives. Chains (every layer feeding the next) take stage metrics
//! from running sums. GPT-3 175B on 1024 devices: under 8 ms per design point
//! (`BENCHMARKS.md`).

mod brute;
mod dp;
mod input;
mod model;

pub use brute::brute_force;
pub use input::{load_costs_file, parse_costs};
pub use model::{evaluate_fixed, exposed_after_overlap};

use crate::arch::Tier;
use crate::workload::ActivationBytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Which activations the backward pass recomputes instead of storing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecomputeMode {
    /// Store everything.
    #[default]
    None,
    /// Recompute the attention core (costs `selective_recompute_s` per layer).
    Selective,
    /// Keep only each layer's input; rerun the layer's forward inside the backward pass.
    Full,
}

/// Pipeline schedule; decides how many micro-batches a stage holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineSchedule {
    /// One forward, one backward (PipeDream-flush / Megatron): a stage holds as many
    /// micro-batches as there are stages from it to the end.
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// All forwards, then all backwards: every stage holds all micro-batches.
    #[serde(rename = "gpipe")]
    GPipe,
}

/// Bytes each parameter costs in memory (mixed-precision Adam: 2, 2, 12; SGD: 2, 2, 0 or 4, 4, 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BytesPerParam {
    pub weights: u32,
    pub grads: u32,
    pub optimizer: u32,
}

impl BytesPerParam {
    /// Mixed-precision Adam: fp16 weights and gradients, fp32 master weights, momentum and
    /// variance — 16 B per parameter.
    pub const ADAM_MIXED: BytesPerParam = BytesPerParam {
        weights: 2,
        grads: 2,
        optimizer: 12,
    };
}

/// Parallel widths the user fixes; `None` lets the search choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixed {
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub dp: Option<u32>,
}

/// Cost of one layer at one tensor width, per device and micro-batch. Tensor-parallel
/// collectives are already inside `fwd_s` and `bwd_s`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCost {
    pub name: String,
    pub fwd_s: f64,
    pub bwd_s: f64,
    /// Extra backward time under selective recompute (the attention core's forward).
    #[serde(default)]
    pub selective_recompute_s: f64,
    /// Parameters held by one device (after tensor-parallel slicing).
    pub params: u64,
    pub activation_bytes: ActivationBytes,
    /// Bytes of the layer's output per device.
    pub output_bytes: u64,
    /// The optimizer step over the layer's parameters on one device, once per iteration after
    /// the gradients are synchronised (ZeRO-1 divides it among the data-parallel copies).
    #[serde(default)]
    pub optimizer_step_s: f64,
    /// Adding one micro-batch's weight gradients into the iteration's on one device, which
    /// every micro-batch after a copy's first does (0 where the GEMMs accumulate themselves).
    #[serde(default)]
    pub grad_accumulation_s: f64,
}

/// The per-layer cost graph at one tensor width. Layers are in topological order and every
/// edge `(from, to, bytes)` has `from < to`; `bytes` is what crosses a stage boundary on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCostGraph {
    pub tp: u32,
    pub layers: Vec<LayerCost>,
    pub edges: Vec<(usize, usize, u64)>,
    /// Whether every device of a tensor group holds the whole of each edge's tensor
    /// (`workload::LayerGraph::replicated_edges`): a pipeline send may then scatter it over the
    /// group's links and all-gather it on the receiving group (Megatron-LM's scatter/gather).
    #[serde(default)]
    pub replicated_edges: bool,
}

/// Everything the search needs: per-t cost graphs, the cluster and the training setup.
/// Its serde form is the `costs.json` file (schema in the README, "Bring your own layer costs").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementProblem {
    /// One graph per tensor width; all list the same layers in the same order.
    pub graphs: Vec<LayerCostGraph>,
    pub devices: u32,
    pub hbm_bytes: u64,
    pub global_batch: u64,
    pub micro_batch: u32,
    #[serde(default)]
    pub recompute: RecomputeMode,
    #[serde(default = "adam_mixed")]
    pub bytes_per_param: BytesPerParam,
    /// Shard optimizer state across the data-parallel copies of a stage.
    #[serde(default)]
    pub zero1: bool,
    #[serde(default)]
    pub schedule: PipelineSchedule,
    /// Interconnect tiers, fastest first; the last spans the cluster.
    pub tiers: Vec<Tier>,
    /// Overlap the gradient all-reduce with the last backward pass.
    #[serde(default)]
    pub dp_overlap: bool,
    /// With overlap, the fraction of the all-reduce the backward hides, up to the backward's
    /// length (a chip's `efficiency.comm_overlap`; 1: all of it).
    #[serde(default = "all_hidden")]
    pub overlap_efficiency: f64,
    #[serde(default)]
    pub constraints: Fixed,
    /// Allow `d·t` not dividing the device count and stages leaving devices unused.
    #[serde(default)]
    pub allow_idle_devices: bool,
}

fn all_hidden() -> f64 {
    1.0
}

fn adam_mixed() -> BytesPerParam {
    BytesPerParam::ADAM_MIXED
}

/// Per-device memory of a stage, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    pub weights: u64,
    pub grads: u64,
    pub optimizer: u64,
    /// The micro-batch being processed.
    pub activations: u64,
    /// The other in-flight micro-batches.
    pub stash: u64,
    pub total: u64,
}

/// One pipeline stage of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// Layer indices, ascending.
    pub layers: Vec<usize>,
    /// Devices of one pipeline copy of this stage (`replicas · t`).
    pub devices: u32,
    pub replicas: u32,
    /// Forward critical path for one micro-batch.
    pub fwd_s: f64,
    /// Backward critical path, recomputation included.
    pub bwd_s: f64,
    /// Pipeline sends charged to this stage.
    pub send_s: f64,
    /// Gradient accumulation per micro-batch, on average (all but a replica's first
    /// micro-batch add their weight gradients into the iteration's).
    pub grad_accumulation_s: f64,
    /// `fwd_s + bwd_s + send_s + grad_accumulation_s`: one replica, one micro-batch.
    pub load_s: f64,
    /// Gradient synchronisation not hidden behind the backward pass.
    pub dp_comm_s: f64,
    /// The whole gradient synchronisation, hidden or not (`dp_comm_s` without overlap).
    pub dp_sync_s: f64,
    /// Its own optimizer step (the plan charges the stages' average, see `TimeSplit`).
    pub optimizer_s: f64,
    pub memory: MemoryBreakdown,
}

/// Where the time per batch goes; the parts add up to `time_per_batch_s`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TimeSplit {
    /// `m ·` the bottleneck stage's compute per micro-batch, gradient accumulation included
    /// (÷ its replicas).
    pub compute_s: f64,
    /// `(p − 1) ·` the bottleneck load: pipeline fill and drain.
    pub bubble_s: f64,
    /// `m ·` the bottleneck stage's pipeline sends (÷ its replicas).
    pub pp_comm_s: f64,
    /// Exposed data-parallel gradient synchronisation (the slowest stage's).
    pub dp_comm_s: f64,
    /// The optimizer step: all layers' steps over the stage count (the stages update at once).
    #[serde(default)]
    pub optimizer_s: f64,
}

/// A complete parallel plan and its predicted cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub micro_batch: u32,
    pub micro_batches_per_pipeline: u64,
    pub stages: Vec<Stage>,
    pub time_per_batch_s: f64,
    pub time_split: TimeSplit,
    pub throughput_samples_per_s: f64,
    pub peak_memory_bytes: u64,
    pub devices_used: u32,
}

impl Plan {
    /// The slowest stage's whole gradient synchronisation, hidden or not.
    pub fn dp_sync_s(&self) -> f64 {
        self.stages.iter().map(|s| s.dp_sync_s).fold(0.0, f64::max)
    }
}

/// A user-fixed partition for [`evaluate_fixed`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixedPlan {
    pub tp: u32,
    pub dp: u32,
    pub stages: Vec<FixedStage>,
}

/// One stage of a [`FixedPlan`]: its layers and its devices (a multiple of `tp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixedStage {
    pub layers: Vec<usize>,
    pub devices: u32,
}

/// A plan that does not fit in memory, kept as a hint of what would be needed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    pub plan: Plan,
    /// Index of the stage with the largest per-device memory.
    pub worst_stage: usize,
    /// How far that stage exceeds HBM.
    pub overshoot_bytes: u64,
}

/// Why no plan exists: reasons with numbers, and the closest plans that do not fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Infeasible {
    pub reasons: Vec<String>,
    /// Up to three plans with the smallest memory overshoot, best first.
    pub alternatives: Vec<Alternative>,
}

impl fmt::Display for Infeasible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "no feasible plan:")?;
        for reason in &self.reasons {
            writeln!(f, "  - {reason}")?;
        }
        if !self.alternatives.is_empty() {
            writeln!(f, "closest plans (smallest memory overshoot):")?;
            for alt in &self.alternatives {
                let p = &alt.plan;
                writeln!(
                    f,
                    "  - t={} p={} d={}: stage {} over by {:.1} GiB; {:.4} s per batch if it fitted",
                    p.tp,
                    p.pp,
                    p.dp,
                    alt.worst_stage,
                    gib(alt.overshoot_bytes),
                    p.time_per_batch_s
                )?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for Infeasible {}

impl Infeasible {
    fn reason(reason: String) -> Self {
        Infeasible {
            reasons: vec![reason],
            alternatives: Vec::new(),
        }
    }
}

/// Bytes in GiB, for messages.
pub(crate) fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// The plan with the lowest time per batch, found by the exact dynamic programme.
pub fn place(problem: &PlacementProblem) -> Result<Plan, Infeasible> {
    model::validate(problem).map_err(Infeasible::reason)?;
    dp::search(problem, f64::INFINITY)?
        .ok_or_else(|| Infeasible::reason("no plan found (the search space is empty)".to_string()))
}

/// Like [`place`], but only looks for plans faster than `bound_s` seconds per batch (e.g. the
/// best of other candidates already evaluated), which prunes most of the search: `Ok(None)`
/// when none is faster or none fits. With an infinite bound it is [`place`].
pub fn place_faster_than(
    problem: &PlacementProblem,
    bound_s: f64,
) -> Result<Option<Plan>, Infeasible> {
    model::validate(problem).map_err(Infeasible::reason)?;
    dp::search(problem, bound_s)
}
