//! Placement (docs/design.md §6): the data × tensor × pipeline parallel plan with the lowest
//! time per batch for a model given as per-layer costs, one layer graph per tensor width.
//! `docs/pipeline.md` derives every formula below and says how each is tested.
//!
//! # Model
//!
//! * **Downset.** A set of layers closed under predecessors. A partition into stages is a chain
//!   of downsets `∅ = D₀ ⊂ D₁ ⊂ … ⊂ D_p = all layers`; stage `i` holds `Dᵢ₊₁ \ Dᵢ`, so every
//!   edge goes from a stage to itself or to a later one.
//! * **Devices.** Each stage uses `k · t` devices: `k` replicas of one tensor-parallel group
//!   of `t`. Micro-batch `j` runs, whole, on replica `j mod k` of every stage (PipeDream's
//!   stage replication). The whole pipeline is copied `d` times; a pipeline owns `K = Σ kᵢ`
//!   tensor groups (all `⌊N / (d·t)⌋` of its block unless idle devices are allowed).
//! * **Operations.** One micro-batch on one replica of stage `i` is a forward operation
//!   `Fᵢ` (the critical path of the stage's forward latencies, then the activations sent on
//!   edges leaving the stage) and a backward operation `Bᵢ` (the backward critical path with
//!   its recomputation, the gradients sent back on edges entering the stage, and, on every
//!   micro-batch after the replica's first, the gradient accumulation). Sends are charged to
//!   the sender: `bytes / B + α` on the tier spanning the stage's devices and one tensor group
//!   of its neighbour, or scattered over the tensor group and all-gathered where every device
//!   holds the whole tensor and that is faster (Megatron-LM's scatter/gather).
//! * **Schedules** ([`PipelineSchedule`]), each an explicit per-replica order of operations
//!   that [`simulate`] executes; `m` micro-batches per pipeline, `τ = maxᵢ (Fᵢ + Bᵢ) / kᵢ`:
//!   - *1F1B*: replica counts must divide the tensor groups from their stage to the end
//!     (`kᵢ | Kᵢ`, `Kᵢ = Σ_{l ≥ i} k_l`; one replica per stage always qualifies). Each replica
//!     runs `K_{i+1} / kᵢ` forwards, then alternates forward and backward. Pipeline time
//!     `(m + K − 1) · τ`, an upper bound proved by a periodic schedule (micro-batch `j` starts
//!     at `j·τ`) and equal to the simulated schedule for one replica per stage and equal
//!     loads; each replica holds `min(Kᵢ / kᵢ, ⌈m / kᵢ⌉)` micro-batches.
//!   - *GPipe*: any replica counts; each replica runs all its forwards, then its backwards.
//!     Pipeline time `(m + K − 1) · (maxᵢ Fᵢ/kᵢ + maxᵢ Bᵢ/kᵢ)`; a replica holds `⌈m / k⌉`.
//!   - *Interleaved 1F1B* (Megatron-LM, Narayanan et al. 2021 §2.2.2): `p` stages of one
//!     group, each holding `v` model chunks laid out as Megatron-LM does (the model's repeated
//!     layers split evenly into `p·v` chunks, chunk `c` on stage `c mod p`, the layers before
//!     and after them with the first and last chunk); `m` a multiple of `p`. Pipeline time
//!     `(m·v + p − 1) · (f + b)` for chunks of equal forward `f` and backward `b` (exact), and
//!     for unequal chunks `min_f [(m·v + p − 1)·f + m·Σ_c (F_c − f)⁺]` plus the same in `B`
//!     (monotonicity of the schedule's longest path); stage `r` holds
//!     `min(2(p − r − 1) + (v − 1)p + 1, m·v)` chunk activations (all `m·v` when `m = p`).
//! * **Memory per device:** weights + gradients + optimizer state (each ÷ `d·k` from the
//!   plan's ZeRO stage on: optimizer from 1, gradients from 2, weights from 3; experts over
//!   `d·k/e` copies, 1/e of them per device) + the activations of the micro-batch being
//!   processed + the stash of the other micro-batches it holds. Under full recompute a layer
//!   keeps only its input and the micro-batch being processed also holds the largest
//!   recomputed layer's activations.
//! * **Per micro-batch** besides compute and sends: ZeRO-2/3's reduce-scatters and ZeRO-3's
//!   all-gathers, and the experts' all-to-alls (`Stage::dp_group_forward_s`, `_backward_s`).
//! * **Tail:** after its last backward, every stage synchronises its gradients (a ring over
//!   its `d·k` copies on the tier they span, at the multi-rail bus bandwidth of their layout
//!   (`DeviceLayout`); ZeRO-0 an all-reduce, 1 a reduce-scatter and an all-gather, 2 the
//!   all-gather, 3 nothing; with overlap the last backward hides `overlap_efficiency` of it,
//!   up to the backward's length), all-reduces what its tensor group replicates, and then
//!   steps its optimizer. The iteration ends with the slowest stage: time per batch =
//!   pipeline time + `maxᵢ (exposed syncᵢ + stepᵢ)`. `docs/pipeline.md` has the details.
//!
//! # Search
//!
//! [`place`] tries every tensor width `t` and data-parallel width `d`. 1F1B and GPipe plans
//! come from an exact dynamic programme over (downset, tensor groups left) whose value is the
//! lexicographically smallest (`maxᵢ Fᵢ+Bᵢ / kᵢ` or its GPipe parts, largest tail), repeated
//! with a tightening bound on the tail (and for GPipe on the backward part) until no plan with
//! a smaller bound can win, so the result equals [`brute_force`]. Cells that cannot beat the
//! best time found so far (work bounds inside and outside each downset) are left out.
//! Interleaved plans are enumerated: their layout follows from (t, d, p, v).

mod brute;
mod dp;
mod input;
mod interleaved;
mod model;
mod simulate;

pub use brute::brute_force;
pub use input::{load_costs_file, parse_costs};
pub use model::{allowed_expert_widths, evaluate_fixed, exposed_after_overlap};
pub use simulate::{simulate, simulate_plan, SimOp, SimSchedule, Simulation};

use crate::arch::Tier;
use crate::report::{gib, plan_line, replica_range};
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

/// The name used on the command line, in CSV and in JSON (`none`, `selective`, `full`):
/// serde's.
impl fmt::Display for RecomputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.serialize(f)
    }
}

/// The mode a name (see `Display`) names.
impl std::str::FromStr for RecomputeMode {
    type Err = serde::de::value::Error;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::deserialize(serde::de::IntoDeserializer::into_deserializer(name))
    }
}

/// Pipeline schedule: the order in which each replica runs its forwards and backwards, which
/// decides the time per batch and how many micro-batches a stage holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineSchedule {
    /// One forward, one backward (PipeDream-flush / Megatron-LM).
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// All forwards, then all backwards: every replica holds all its micro-batches.
    #[serde(rename = "gpipe")]
    GPipe,
    /// Megatron-LM's interleaved 1F1B: `v` model chunks per stage, a `v`-th of the bubble.
    Interleaved,
}

impl PipelineSchedule {
    /// The name used on the command line, in `costs.json` and in CSV.
    pub fn name(self) -> &'static str {
        match self {
            PipelineSchedule::OneFOneB => "1f1b",
            PipelineSchedule::GPipe => "gpipe",
            PipelineSchedule::Interleaved => "interleaved",
        }
    }
}

/// How a plan's devices are numbered, which decides the interconnect tier each group spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceLayout {
    /// Each pipeline on consecutive devices, its stages one after another: pipeline sends
    /// stay close, a stage's data-parallel copies are a pipeline apart.
    #[default]
    PipelineMajor,
    /// Each stage's data-parallel copies on consecutive devices, consecutive pipelines next to
    /// each other (Megatron-LM's rank order: tensor, then data with experts inside it, then
    /// pipeline): the copies' rings and expert groups stay close, pipeline sends cross the
    /// stage's copies.
    StageMajor,
}

impl DeviceLayout {
    /// The name used on the command line, in `costs.json` and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            DeviceLayout::PipelineMajor => "pipeline-major",
            DeviceLayout::StageMajor => "stage-major",
        }
    }
}

fn is_pipeline_major(layout: &DeviceLayout) -> bool {
    *layout == DeviceLayout::PipelineMajor
}

/// How far data-parallel copies shard the training state (Rajbhandari et al. 2020, ZeRO;
/// stage 3 is PyTorch FSDP's full shard). In a file and on the command line, the number.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(try_from = "u8", into = "u8")]
pub enum ZeroStage {
    /// Every copy holds everything; gradients are all-reduced after the last backward.
    #[default]
    Replicated,
    /// Optimizer state sharded: gradients reduce-scattered and updated weights all-gathered
    /// after the last backward (Megatron-LM's distributed optimizer), each copy stepping its
    /// shard.
    Optimizer,
    /// Gradients sharded too: each micro-batch's backward reduce-scatters its gradients into
    /// the shards (DeepSpeed's stage 2); weights all-gathered after the step.
    Gradients,
    /// Weights sharded too: every micro-batch all-gathers each layer's weights in the forward
    /// and again in the backward, and reduce-scatters its gradients (FSDP full shard).
    Parameters,
}

impl ZeroStage {
    pub const ALL: [ZeroStage; 4] = [
        ZeroStage::Replicated,
        ZeroStage::Optimizer,
        ZeroStage::Gradients,
        ZeroStage::Parameters,
    ];

    /// The stage's number, 0 to 3.
    pub fn number(self) -> u8 {
        self as u8
    }
}

impl From<ZeroStage> for u8 {
    fn from(stage: ZeroStage) -> u8 {
        stage.number()
    }
}

impl TryFrom<u8> for ZeroStage {
    type Error = String;
    fn try_from(number: u8) -> Result<ZeroStage, String> {
        ZeroStage::ALL
            .get(usize::from(number))
            .copied()
            .ok_or_else(|| format!("ZeRO stage {number} does not exist: use 0, 1, 2 or 3"))
    }
}

impl std::str::FromStr for ZeroStage {
    type Err = String;
    fn from_str(text: &str) -> Result<ZeroStage, String> {
        let number: u8 = text
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a ZeRO stage: use 0, 1, 2 or 3"))?;
        ZeroStage::try_from(number)
    }
}

fn is_replicated(stage: &ZeroStage) -> bool {
    *stage == ZeroStage::Replicated
}

fn is_zero_bytes(value: &u64) -> bool {
    *value == 0
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

fn one() -> u32 {
    1
}

fn is_zero_s(value: &f64) -> bool {
    *value == 0.0
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

/// Parallel widths the user fixes; `None` lets the search choose. A held `dp` is the exact
/// number of data-parallel copies of every stage: its plans have one replica per stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixed {
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub dp: Option<u32>,
    /// Model chunks per stage of the interleaved schedule.
    #[serde(default)]
    pub virtual_stages: Option<u32>,
    /// Expert-parallel width: the data-parallel pipelines each mixture-of-experts layer's
    /// experts are divided over.
    #[serde(default)]
    pub ep: Option<u32>,
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
    /// Of `fwd_s`, what full recompute does not rerun: the forward's trailing operators that
    /// keep nothing for the backward, under PyTorch's non-reentrant checkpoint
    /// (`workload::Checkpoint::StopEarly`); 0 where the whole forward reruns. At most `fwd_s`.
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub recompute_skipped_s: f64,
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
    /// The data-parallel wrapper's work on the layer's gradients on one device, once per
    /// iteration (`workload::Ddp`: bucket copies, the buffer's zeroing); never divided among
    /// the copies, each of which holds all its gradients.
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub grad_buffer_s: f64,
    /// All-reducing, once per iteration, the gradients of the parameters the tensor group
    /// replicates (`workload::ReplicatedParams`: K/V projections when t exceeds the key/value
    /// heads), before the optimizer step.
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub replica_grad_sync_s: f64,
    /// Of `params`, the mixture-of-experts layer's expert weights, which expert parallelism
    /// divides over `ep` devices (all experts here: the cost at `ep` = 1).
    #[serde(default, skip_serializing_if = "is_zero_bytes")]
    pub expert_params: u64,
    /// Bytes one device dispatches to the experts per micro-batch (its tokens, capacity
    /// included): an all-to-all over the expert-parallel group, and another combining the
    /// results, each way.
    #[serde(default, skip_serializing_if = "is_zero_bytes")]
    pub all_to_all_bytes: u64,
    /// Parameters the layer uses that an earlier layer holds (an output projection tied to the
    /// input embeddings); `None` where it uses only its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied: Option<TiedParams>,
}

impl LayerCost {
    /// The forward a micro-batch's backward reruns under `mode`: the attention core under
    /// selective recompute; under full recompute the forward but what its checkpoint skips,
    /// for a layer that drops activations for it.
    pub fn recompute_s(&self, mode: RecomputeMode) -> f64 {
        match mode {
            RecomputeMode::None => 0.0,
            RecomputeMode::Selective => self.selective_recompute_s,
            RecomputeMode::Full if self.activation_bytes.recomputed_under_full() => {
                self.fwd_s - self.recompute_skipped_s
            }
            RecomputeMode::Full => 0.0,
        }
    }
}

/// Parameters a layer shares with an earlier one, its `owner`. Where the two sit on different
/// pipeline stages, the layer's stage keeps a copy of them (weights, gradients and optimizer
/// state, stepped by its own optimizer, synchronised with its data-parallel copies like its
/// own), and the two stages all-reduce the copies' gradients once per iteration, after the
/// backward and before the step (Megatron-LM's word embeddings on the first and last stage,
/// `_allreduce_word_embedding_grads`). On one stage the owner's parameters serve both, and
/// the two uses' gradients are summed every micro-batch (`grad_sum_s`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TiedParams {
    /// Index of the layer holding them, before this one.
    pub owner: usize,
    /// Parameters per device (after tensor-parallel slicing).
    pub params: u64,
    /// The copy's optimizer step on one device.
    pub optimizer_step_s: f64,
    /// Adding one micro-batch's gradient into the copy's (0 where the GEMM accumulates it).
    #[serde(default)]
    pub grad_accumulation_s: f64,
    /// The data-parallel wrapper's work on the copy's gradients, once per iteration.
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub grad_buffer_s: f64,
    /// Where the owner shares the layer's stage: summing the two uses' gradients, each
    /// micro-batch's backward (autograd's add without gradient-accumulation fusion; 0 with it).
    #[serde(default)]
    pub grad_sum_s: f64,
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
    /// The model's repeated layers `[first, end)` (a transformer's blocks), which the
    /// interleaved schedule splits evenly into chunks; `None`: all layers.
    #[serde(default)]
    pub repeated_layers: Option<[usize; 2]>,
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
    /// How far the data-parallel copies of a stage shard the training state.
    #[serde(default)]
    pub zero: ZeroStage,
    /// How devices are numbered (which tier each group spans).
    #[serde(default)]
    pub layout: DeviceLayout,
    #[serde(default)]
    pub schedule: PipelineSchedule,
    /// Interconnect tiers, fastest first; the last spans the cluster.
    pub tiers: Vec<Tier>,
    /// Overlap the gradient all-reduce with the last backward pass.
    #[serde(default)]
    pub dp_overlap: bool,
    /// Overlap each pipeline send with the computation of the operation that sends it
    /// (Megatron-LM's `--overlap-p2p-communication`, on by default for its interleaved
    /// schedule): the computation hides `overlap_efficiency` of it, up to its length.
    #[serde(default)]
    pub p2p_overlap: bool,
    /// With overlap, the fraction of the all-reduce the backward hides, up to the backward's
    /// length (a chip's `efficiency.comm_overlap`; 1: all of it).
    #[serde(default = "all_hidden")]
    pub overlap_efficiency: f64,
    #[serde(default)]
    pub constraints: Fixed,
    /// Allow `d·t` not dividing the device count and stages leaving devices unused.
    #[serde(default)]
    pub allow_idle_devices: bool,
    /// Allow `d × micro-batch` not dividing the global batch: each pipeline then runs
    /// `⌈global batch / (d × micro-batch)⌉` micro-batches (PHAZE's convention).
    #[serde(default)]
    pub allow_uneven_batch: bool,
    /// Only these data-parallel widths `d` (of those the device count and batch allow), with
    /// replica counts as free as without (a fixed plan outside them is refused); `None`: all
    /// of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only_data_parallel: Option<Vec<u32>>,
    /// Routed experts of each mixture-of-experts layer (0 without experts): an expert-parallel
    /// width divides them, as Megatron-LM requires (`num_experts % expert_model_parallel_size
    /// == 0`): a device holds whole experts.
    #[serde(default)]
    pub experts: u32,
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
    /// The other micro-batches (or, interleaved, chunk activations) the device holds.
    pub stash: u64,
    pub total: u64,
}

/// One model chunk of an interleaved stage: a range of layers and its operations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// Layer indices, ascending and contiguous.
    pub layers: Vec<usize>,
    pub fwd_s: f64,
    pub bwd_s: f64,
    pub send_forward_s: f64,
    pub send_backward_s: f64,
    pub grad_accumulation_s: f64,
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub dp_group_forward_s: f64,
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub dp_group_backward_s: f64,
    /// Activation bytes each micro-batch the chunk holds keeps.
    pub kept_bytes: u64,
}

/// One pipeline stage of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// Layer indices, ascending.
    pub layers: Vec<usize>,
    /// Devices of one pipeline copy of this stage (`replicas · t`).
    pub devices: u32,
    pub replicas: u32,
    /// Forward critical path for one micro-batch (all chunks, interleaved).
    pub fwd_s: f64,
    /// Backward critical path, recomputation included.
    pub bwd_s: f64,
    /// Activations sent forward per micro-batch, charged to this stage.
    pub send_forward_s: f64,
    /// Gradients sent back per micro-batch, charged to this stage.
    pub send_backward_s: f64,
    /// Gradient accumulation of every micro-batch after a replica's first.
    pub grad_accumulation_s: f64,
    /// Collectives over the data-parallel group in each forward, not hidden behind it:
    /// ZeRO-3's weight all-gathers, the experts' two all-to-alls.
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub dp_group_forward_s: f64,
    /// The same in each backward: ZeRO-2/3's gradient reduce-scatter, ZeRO-3's weight
    /// all-gather, the experts' two all-to-alls.
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub dp_group_backward_s: f64,
    /// `fwd_s + bwd_s + sends + grad_accumulation_s + dp_group_*_s`: one replica's forward and
    /// backward operation of one micro-batch.
    pub load_s: f64,
    /// Micro-batches (interleaved: chunk activations) each replica holds at most.
    pub in_flight: u64,
    /// Activation bytes each micro-batch a replica holds keeps (interleaved: its largest
    /// chunk's).
    pub kept_bytes: u64,
    /// Gradient synchronisation not hidden behind the backward pass: the data-parallel
    /// synchronisation less `dp_hidden_s`, then the all-reduces of replicated and tied
    /// parameters, which follow the backward.
    pub dp_comm_s: f64,
    /// The whole data-parallel gradient synchronisation, hidden or not.
    pub dp_sync_s: f64,
    /// The part of `dp_sync_s` the last backward hides (0 without overlap).
    #[serde(default)]
    pub dp_hidden_s: f64,
    /// Its optimizer step, after the synchronisation, with the data-parallel wrapper's work
    /// on the gradients before it.
    pub optimizer_s: f64,
    /// Of `optimizer_s`, the data-parallel wrapper's work on the gradients
    /// (`LayerCost::grad_buffer_s` of what the device holds).
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub grad_buffer_s: f64,
    pub memory: MemoryBreakdown,
    /// The interleaved schedule's model chunks, in the order the stage holds them; empty for
    /// the other schedules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<Chunk>,
}

impl Stage {
    /// Both directions' pipeline sends per micro-batch.
    pub fn send_s(&self) -> f64 {
        self.send_forward_s + self.send_backward_s
    }

    /// Both directions' exposed data-parallel-group collectives per micro-batch.
    pub fn dp_group_s(&self) -> f64 {
        self.dp_group_forward_s + self.dp_group_backward_s
    }

    /// The slowest stage's tail: what follows its last backward.
    fn tail_s(&self) -> f64 {
        self.dp_comm_s + self.optimizer_s
    }
}

/// Where the time per batch goes; the parts add up to `time_per_batch_s`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct TimeSplit {
    /// `m ·` the bottleneck's compute per micro-batch and tensor group (forward, backward,
    /// gradient accumulation): the pipeline's steady state.
    pub compute_s: f64,
    /// Pipeline fill and drain: the pipeline time less `compute_s` and `pp_comm_s`.
    pub bubble_s: f64,
    /// `m ·` the bottleneck's pipeline sends per micro-batch and tensor group.
    pub pp_comm_s: f64,
    /// `m ·` the bottleneck's exposed data-parallel-group collectives per micro-batch and
    /// tensor group (ZeRO-2/3, expert all-to-alls).
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub dp_group_comm_s: f64,
    /// The exposed gradient synchronisation of the stage that ends the iteration.
    pub dp_comm_s: f64,
    /// That stage's optimizer step (with its data-parallel wrapper's gradient work).
    #[serde(default)]
    pub optimizer_s: f64,
    /// Of `optimizer_s`, the data-parallel wrapper's work on the gradients.
    #[serde(default, skip_serializing_if = "is_zero_s")]
    pub grad_buffer_s: f64,
}

/// A complete parallel plan and its predicted cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub schedule: PipelineSchedule,
    /// How far the data-parallel copies shard the training state.
    #[serde(default, skip_serializing_if = "is_replicated")]
    pub zero: ZeroStage,
    /// Expert-parallel width: pipelines dividing each expert layer's experts among them.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ep: u32,
    /// How the plan's devices are numbered.
    #[serde(default, skip_serializing_if = "is_pipeline_major")]
    pub layout: DeviceLayout,
    /// Model chunks per stage (1 unless interleaved).
    pub virtual_stages: u32,
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

    /// The most of its data-parallel synchronisation any stage hides behind its backward.
    pub fn dp_hidden_s(&self) -> f64 {
        self.stages
            .iter()
            .map(|s| s.dp_hidden_s)
            .fold(0.0, f64::max)
    }

    /// Tensor groups in one pipeline copy (`K = Σ` replicas).
    pub fn groups_per_pipeline(&self) -> u32 {
        self.stages.iter().map(|s| s.replicas).sum()
    }

    /// The fewest and most replicas of any stage.
    pub fn replica_range(&self) -> (u32, u32) {
        let replicas = self.stages.iter().map(|s| s.replicas);
        (
            replicas.clone().min().unwrap_or(0),
            replicas.max().unwrap_or(0),
        )
    }
}

/// A user-fixed partition for [`evaluate_fixed`] (1F1B and GPipe; interleaved layouts
/// follow from the widths, so `place` with every width held prices them).
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
                let (fewest, most) = p.replica_range();
                let zero = if p.zero == ZeroStage::Replicated {
                    String::new()
                } else {
                    format!(", ZeRO-{}", p.zero.number())
                };
                writeln!(
                    f,
                    "  - {}{zero}: stage {} over by {:.1} GiB; {:.4} s per batch if it fitted",
                    plan_line(p.tp, p.dp, p.pp, &replica_range(fewest, most)),
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

/// The plan with the lowest time per batch, found by the exact search of its schedule.
pub fn place(problem: &PlacementProblem) -> Result<Plan, Infeasible> {
    place_faster_than(problem, f64::INFINITY)?
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
    match problem.schedule {
        PipelineSchedule::Interleaved => interleaved::search(problem, bound_s),
        PipelineSchedule::OneFOneB | PipelineSchedule::GPipe => dp::search(problem, bound_s, true),
    }
}

/// [`place`] without pruning: every (t, d) fills its dynamic programme's whole table, with no
/// bound from the others. Slow; the reference the pruned search must equal (tests, benches).
pub fn place_exhaustive(problem: &PlacementProblem) -> Result<Plan, Infeasible> {
    model::validate(problem).map_err(Infeasible::reason)?;
    let plan = match problem.schedule {
        PipelineSchedule::Interleaved => interleaved::search(problem, f64::INFINITY)?,
        PipelineSchedule::OneFOneB | PipelineSchedule::GPipe => {
            dp::search(problem, f64::INFINITY, false)?
        }
    };
    plan.ok_or_else(|| Infeasible::reason("no plan found (the search space is empty)".to_string()))
}
