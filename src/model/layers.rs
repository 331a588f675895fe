//! Per-layer costs of a workload on one chip: every unique layer scheduled on the chip's
//! cores (memoised in a `ScheduleCache`), its energy, and the optimizer step, gradient
//! accumulation and selective recomputation beside it.

use super::EvaluateError;
use crate::arch::{ArchConfig, Efficiency};
use crate::cost::{collective_cost, CollectiveCost, CostModel};
use crate::placement::{
    BytesPerParam, LayerCost, LayerCostGraph, Plan, RecomputeMode, TiedParams, ZeroStage,
};
use crate::schedule::{Schedule, ScheduleCache, ScheduleProblem};
use crate::workload::{CollectiveKind, Layer, Op, OpGraph, OpKind, TiedUse, VectorOp, Workload};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The schedules of one unique layer (all layers sharing a signature).
#[derive(Debug, Clone, Serialize)]
pub struct UniqueLayerSchedule {
    pub signature: String,
    /// The first layer with this signature.
    pub name: String,
    /// Layers sharing it.
    pub count: usize,
    pub fwd: Arc<Schedule>,
    pub bwd: Arc<Schedule>,
    /// The forward and backward as training launches their kernels: each schedule's GPU work,
    /// on a serial chip with the contention of its asynchronous collectives, plus the chip's
    /// eager launch costs ([`Efficiency::eager_pass_s`]).
    pub fwd_s: f64,
    pub bwd_s: f64,
    /// The problems the schedules solve (operator names and variants, for display).
    #[serde(skip)]
    pub fwd_problem: ScheduleProblem,
    #[serde(skip)]
    pub bwd_problem: ScheduleProblem,
    /// Extra backward time and energy under selective recompute: the attention core's forward.
    pub selective_recompute_s: f64,
    pub selective_recompute_energy_j: f64,
    /// Of the forward, the time and energy full recompute does not rerun
    /// (`recompute_skipped`).
    pub recompute_skipped_s: f64,
    pub recompute_skipped_energy_j: f64,
    /// The optimizer step over one layer's parameters (once per iteration), and its energy.
    pub optimizer_step_s: f64,
    pub optimizer_step_energy_j: f64,
    /// Adding one micro-batch's weight gradients into the iteration's, and its energy.
    pub grad_accumulation_s: f64,
    pub grad_accumulation_energy_j: f64,
    /// The data-parallel wrapper's work on the layer's gradients (once per iteration), and
    /// its energy.
    pub grad_buffer_s: f64,
    pub grad_buffer_energy_j: f64,
}

/// Per-layer costs of a workload at one (t, micro-batch) on one chip: the placement input,
/// and the energy per layer that the placement does not need.
#[derive(Debug, Clone)]
pub struct LayerCosts {
    pub graph: LayerCostGraph,
    /// Per layer and device: energy of the forward, backward and selective recomputation of
    /// one micro-batch, and of the optimizer step (once per iteration), J.
    pub energy_j: Vec<LayerEnergy>,
    pub unique: Vec<UniqueLayerSchedule>,
}

/// One layer's energy on one device of its tensor group, J.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerEnergy {
    pub fwd_j: f64,
    pub bwd_j: f64,
    pub selective_recompute_j: f64,
    /// Of `fwd_j`, what full recompute does not rerun.
    pub recompute_skipped_j: f64,
    pub optimizer_step_j: f64,
    /// One micro-batch's gradient accumulation (every micro-batch after a copy's first).
    pub grad_accumulation_j: f64,
    /// The data-parallel wrapper's work on the gradients (once per iteration and copy).
    pub grad_buffer_j: f64,
    /// The all-reduce of the gradients its tensor group replicates (once per iteration).
    pub replica_grad_sync_j: f64,
    /// What the parameters it is tied to (`LayerCost::tied`) cost it besides its passes.
    pub tied: TiedEnergy,
}

/// Energy of a layer's use of tied parameters, J.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TiedEnergy {
    /// The optimizer step of the copy a stage without the owner holds.
    pub optimizer_step_j: f64,
    /// One micro-batch's gradient accumulation into that copy.
    pub grad_accumulation_j: f64,
    /// The data-parallel wrapper's work on the copy's gradients.
    pub grad_buffer_j: f64,
    /// Where the owner shares the stage: one micro-batch's sum of the two uses' gradients.
    pub grad_sum_j: f64,
}

impl LayerCosts {
    /// Dynamic energy (the energy model's events; static power is
    /// [`Evaluation`](super::Evaluation)'s) of one sample under `plan`: every layer's forward
    /// and backward (and
    /// recomputation) on each of the `t` devices of its tensor group, per sample of a
    /// micro-batch; and once per iteration, over the global batch, each data-parallel copy's
    /// gradient accumulation (every micro-batch after its first), optimizer step and gradient
    /// synchronisation over the `d · k` copies of a stage as `plan.zero` does it (ZeRO-0: a
    /// ring all-reduce; 1: a reduce-scatter of gradients and an all-gather of weights, each
    /// copy stepping its share; 2: the reduce-scatter in every micro-batch's backward; 3: also
    /// two all-gathers of the weights per micro-batch and none after the step), and the
    /// all-reduce of the gradients a tensor group replicates; and the copy of tied parameters
    /// a stage holds without their owner (`LayerCost::tied`), with the all-reduce of the two
    /// copies' gradients on both stages. Pipeline sends are not counted.
    pub fn dynamic_energy_per_sample_j(
        &self,
        plan: &Plan,
        recompute: RecomputeMode,
        bytes_per_param: BytesPerParam,
        global_batch: u64,
        arch: &ArchConfig,
    ) -> f64 {
        let t = f64::from(self.graph.tp);
        let per_micro_batch: f64 = self
            .energy_j
            .iter()
            .zip(&self.graph.layers)
            .map(|(e, layer)| {
                // Two all-to-alls each way carry an expert layer's tokens (moving what an
                // all-gather of the same bytes moves).
                let all_to_all_j = if layer.all_to_all_bytes > 0 && plan.ep > 1 {
                    4.0 * collective_cost(
                        arch,
                        CollectiveKind::AllGather,
                        layer.all_to_all_bytes,
                        plan.ep,
                    )
                    .energy_j
                } else {
                    0.0
                };
                all_to_all_j
                    + e.fwd_j
                    + e.bwd_j
                    + match recompute {
                        RecomputeMode::None => 0.0,
                        RecomputeMode::Selective => e.selective_recompute_j,
                        RecomputeMode::Full if layer.activation_bytes.recomputed_under_full() => {
                            e.fwd_j - e.recompute_skipped_j
                        }
                        RecomputeMode::Full => 0.0,
                    }
            })
            .sum();
        let mut per_iteration = 0.0;
        // The d·k copies of a stage run the d pipelines' micro-batches, each copy its share.
        let passes = (u64::from(plan.dp) * plan.micro_batches_per_pipeline) as f64;
        for stage in &plan.stages {
            let copies = plan.dp * stage.replicas;
            let copies_f = f64::from(copies);
            // Synchronising `params` per device over rings of `n` copies, on all `copies`
            // devices of the stage.
            let sync_j = |params: u64, n: u32| {
                let grad_bytes = params * u64::from(bytes_per_param.grads);
                let weight_bytes = params * u64::from(bytes_per_param.weights);
                let energy = |kind, bytes| collective_cost(arch, kind, bytes, n).energy_j;
                let scatter_j = energy(CollectiveKind::ReduceScatter, grad_bytes);
                let gather_j = energy(CollectiveKind::AllGather, weight_bytes);
                match plan.zero {
                    ZeroStage::Replicated => {
                        copies_f * energy(CollectiveKind::AllReduce, grad_bytes)
                    }
                    ZeroStage::Optimizer => copies_f * (scatter_j + gather_j),
                    ZeroStage::Gradients => passes * scatter_j + copies_f * gather_j,
                    ZeroStage::Parameters => passes * (scatter_j + 2.0 * gather_j),
                }
            };
            let accumulations = (passes - copies_f).max(0.0);
            let step_copies = if plan.zero >= ZeroStage::Optimizer {
                1.0
            } else {
                copies_f
            };
            for &l in &stage.layers {
                let cost = &self.graph.layers[l];
                let layer = &self.energy_j[l];
                let replicas_j = copies_f * layer.replica_grad_sync_j;
                per_iteration += t * if cost.expert_params == 0 {
                    sync_j(cost.params, copies)
                        + replicas_j
                        + step_copies * layer.optimizer_step_j
                        + accumulations * layer.grad_accumulation_j
                        + copies_f * layer.grad_buffer_j
                } else {
                    // The dense part is copied `d·k` times, each device's 1/ep of the experts
                    // `d·k/ep` times; steps and accumulations scale with what a device holds.
                    let dense = cost.params - cost.expert_params;
                    let experts = cost.expert_params.div_ceil(u64::from(plan.ep));
                    let held = (dense + experts) as f64 / cost.params as f64;
                    let steps_j = if plan.zero >= ZeroStage::Optimizer {
                        layer.optimizer_step_j
                    } else {
                        copies_f * held * layer.optimizer_step_j
                    };
                    sync_j(dense, copies)
                        + sync_j(experts, (copies / plan.ep).max(1))
                        + replicas_j
                        + steps_j
                        + accumulations * held * layer.grad_accumulation_j
                        + copies_f * held * layer.grad_buffer_j
                };
            }
            // Tied parameters split between this stage and another: the all-reduce of the
            // copies' gradients, and where this stage holds the copy, its synchronisation,
            // step and accumulation as for its own parameters.
            // Where both share the stage, the sum of their gradients in every pass.
            for (l, cost) in self.graph.layers.iter().enumerate() {
                let Some(tied) = cost.tied else { continue };
                let holds_copy = stage.layers.contains(&l);
                let holds_owner = stage.layers.contains(&tied.owner);
                if holds_copy && holds_owner {
                    per_iteration += t * passes * self.energy_j[l].tied.grad_sum_j;
                }
                if holds_copy == holds_owner {
                    continue;
                }
                let grad_bytes = tied.params * u64::from(bytes_per_param.grads);
                let tied_sync_j = copies_f
                    * collective_cost(arch, CollectiveKind::AllReduce, grad_bytes, 2).energy_j;
                let layer = &self.energy_j[l];
                per_iteration += t * if holds_copy {
                    sync_j(tied.params, copies)
                        + step_copies * layer.tied.optimizer_step_j
                        + accumulations * layer.tied.grad_accumulation_j
                        + copies_f * layer.tied.grad_buffer_j
                        + tied_sync_j
                } else {
                    tied_sync_j
                };
            }
        }
        per_micro_batch * t / f64::from(plan.micro_batch) + per_iteration / global_batch as f64
    }
}

/// Schedules every unique layer of `workload` at width `tp` and micro-batch `micro_batch` on
/// `cost`'s chip (memoised in `cache`) and returns the per-layer costs.
pub fn layer_costs(
    workload: &Workload,
    cost: &CostModel,
    cache: &ScheduleCache,
    tp: u32,
    micro_batch: u32,
    sequence_parallel: bool,
) -> Result<LayerCosts, EvaluateError> {
    let graph = workload.layer_graph(tp, micro_batch, sequence_parallel)?;
    let mut unique: Vec<UniqueLayerSchedule> = Vec::new();
    let mut index_of: BTreeMap<&str, usize> = BTreeMap::new();
    let mut layers = Vec::with_capacity(graph.layers.len());
    let mut energy_j = Vec::with_capacity(graph.layers.len());
    for layer in &graph.layers {
        let u = match index_of.get(layer.signature.as_str()) {
            Some(&u) => {
                unique[u].count += 1;
                u
            }
            None => {
                let key = format!(
                    "{}|t{tp}|b{micro_batch}|sp{}",
                    layer.signature,
                    u8::from(sequence_parallel)
                );
                let fwd_problem = ScheduleProblem::from_op_graph(&layer.fwd, cost);
                let bwd_problem = ScheduleProblem::from_op_graph(&layer.bwd, cost);
                let hardware = cost.hardware_key();
                let fwd = cache.get_or_compute(&format!("{key}|fwd"), hardware, &fwd_problem)?;
                let bwd = cache.get_or_compute(&format!("{key}|bwd"), hardware, &bwd_problem)?;
                let efficiency = &cost.arch().efficiency;
                // A collective beside the compute stream takes SMs and HBM bandwidth from it:
                // the computation hides `comm_overlap` of their overlap, as it does of the
                // data-parallel all-reduce.
                let exposed = 1.0 - efficiency.comm_overlap;
                let contended_s = |schedule: &Schedule, problem: &ScheduleProblem| {
                    if exposed > 0.0 {
                        schedule.makespan_s + exposed * schedule.async_overlap_s(problem)
                    } else {
                        schedule.makespan_s
                    }
                };
                let fwd_s =
                    efficiency.eager_pass_s(contended_s(&fwd, &fwd_problem), layer.fwd.launches());
                let bwd_s =
                    efficiency.eager_pass_s(contended_s(&bwd, &bwd_problem), layer.bwd.launches());
                let (selective_recompute_s, selective_recompute_energy_j) =
                    attention_core(&layer.fwd, &fwd_problem, efficiency);
                let (recompute_skipped_s, recompute_skipped_energy_j) = recompute_skipped(
                    &layer.fwd,
                    &fwd_problem,
                    efficiency,
                    workload.checkpoint.skipped_ops(&layer.fwd),
                    fwd.makespan_s,
                    fwd.energy_j,
                );
                let (optimizer_step_s, optimizer_step_energy_j) =
                    kernels_in_turn(cost, &workload.optimizer_step_ops(&layer.param_tensors));
                let (grad_accumulation_s, grad_accumulation_energy_j) =
                    kernels_in_turn(cost, &workload.grad_accumulation_ops(&layer.param_tensors));
                let (grad_buffer_s, grad_buffer_energy_j) =
                    kernels_in_turn(cost, &workload.grad_buffer_ops(&layer.param_tensors));
                index_of.insert(&layer.signature, unique.len());
                unique.push(UniqueLayerSchedule {
                    signature: layer.signature.clone(),
                    name: layer.name.clone(),
                    count: 1,
                    fwd,
                    bwd,
                    fwd_s,
                    bwd_s,
                    fwd_problem,
                    bwd_problem,
                    selective_recompute_s,
                    selective_recompute_energy_j,
                    recompute_skipped_s,
                    recompute_skipped_energy_j,
                    optimizer_step_s,
                    optimizer_step_energy_j,
                    grad_accumulation_s,
                    grad_accumulation_energy_j,
                    grad_buffer_s,
                    grad_buffer_energy_j,
                });
                unique.len() - 1
            }
        };
        let s = &unique[u];
        let replica_sync = replica_grad_sync(workload, cost, layer);
        // A stage without the owner of the parameters the layer is tied to steps and
        // accumulates a copy of them.
        let tied = layer
            .tied
            .as_ref()
            .map(|tied| tied_use_costs(workload, cost, tied));
        layers.push(LayerCost {
            name: layer.name.clone(),
            fwd_s: s.fwd_s,
            bwd_s: s.bwd_s,
            selective_recompute_s: s.selective_recompute_s,
            recompute_skipped_s: s.recompute_skipped_s,
            params: layer.params,
            activation_bytes: layer.activation_bytes,
            output_bytes: layer.output_bytes,
            optimizer_step_s: s.optimizer_step_s,
            grad_accumulation_s: s.grad_accumulation_s,
            grad_buffer_s: s.grad_buffer_s,
            replica_grad_sync_s: replica_sync.latency_s,
            expert_params: layer.expert_params,
            all_to_all_bytes: layer.all_to_all_bytes,
            tied: tied.map(|t| t.0),
        });
        energy_j.push(LayerEnergy {
            fwd_j: s.fwd.energy_j,
            bwd_j: s.bwd.energy_j,
            selective_recompute_j: s.selective_recompute_energy_j,
            recompute_skipped_j: s.recompute_skipped_energy_j,
            optimizer_step_j: s.optimizer_step_energy_j,
            grad_accumulation_j: s.grad_accumulation_energy_j,
            grad_buffer_j: s.grad_buffer_energy_j,
            replica_grad_sync_j: replica_sync.energy_j,
            tied: tied.map_or_else(TiedEnergy::default, |t| t.1),
        });
    }
    Ok(LayerCosts {
        graph: LayerCostGraph {
            tp,
            layers,
            edges: graph.edges.clone(),
            replicated_edges: graph.replicated_edges(),
            repeated_layers: graph.repeated_layers(),
        },
        energy_j,
        unique,
    })
}

/// What a layer's use of the parameters `tied` names costs besides its passes: a stage
/// keeping its own copy of them steps it and accumulates one micro-batch's gradient into it
/// (as the owner's own tensors are priced); a stage holding the owner too sums the two uses'
/// gradients every micro-batch. With their energies.
pub(super) fn tied_use_costs(
    workload: &Workload,
    cost: &CostModel,
    tied: &TiedUse,
) -> (TiedParams, TiedEnergy) {
    let kernels = |ops: Vec<Op>| kernels_in_turn(cost, &ops);
    let (step_s, optimizer_step_j) = kernels(workload.optimizer_step_ops(&tied.tensors));
    let (accumulation_s, grad_accumulation_j) =
        kernels(workload.grad_accumulation_ops(&tied.tensors));
    let (buffer_s, grad_buffer_j) = kernels(workload.grad_buffer_ops(&tied.tensors));
    let (grad_sum_s, grad_sum_j) = kernels(workload.tied_grad_sum_ops(&tied.tensors));
    let params = TiedParams {
        owner: tied.owner,
        params: tied.params(),
        optimizer_step_s: step_s,
        grad_accumulation_s: accumulation_s,
        grad_buffer_s: buffer_s,
        grad_sum_s,
    };
    let energy = TiedEnergy {
        optimizer_step_j,
        grad_accumulation_j,
        grad_buffer_j,
        grad_sum_j,
    };
    (params, energy)
}

/// The all-reduce, once per iteration, of the gradients of the parameters `layer`'s tensor
/// group replicates, over the devices holding each copy.
pub(super) fn replica_grad_sync(
    workload: &Workload,
    cost: &CostModel,
    layer: &Layer,
) -> CollectiveCost {
    let replicated = layer.replicated;
    let bytes = replicated.params * u64::from(workload.bytes_per_param().grads);
    collective_cost(
        cost.arch(),
        CollectiveKind::AllReduce,
        bytes,
        replicated.group,
    )
}

/// Time and energy of `ops` on the chip's vector cores: one after another, each in its
/// faster variant, launched as training launches them: the kernels over a layer's parameters
/// (`Workload::optimizer_step_ops`, `grad_accumulation_ops`, `grad_buffer_ops`,
/// `tied_grad_sum_ops`).
pub(super) fn kernels_in_turn(cost: &CostModel, ops: &[Op]) -> (f64, f64) {
    let (gpu_s, energy_j) = ops
        .iter()
        .map(|op| {
            let c = cost.op_cost(op);
            if c.all_cores_s <= c.one_core_s {
                (c.all_cores_s, c.all_cores_energy_j)
            } else {
                (c.one_core_s, c.one_core_energy_j)
            }
        })
        .fold((0.0, 0.0), |(s, j), (op_s, op_j)| (s + op_s, j + op_j));
    let launches = ops.iter().map(Op::launches).sum();
    (
        cost.arch().efficiency.eager_pass_s(gpu_s, launches),
        energy_j,
    )
}

/// GPU time, energy and kernel launches of the operators of `graph` that `pick` selects (by
/// index), one after another, each in its faster variant.
fn ops_in_turn(
    graph: &OpGraph,
    problem: &ScheduleProblem,
    pick: impl Fn(usize, &Op) -> bool,
) -> (f64, f64, f64) {
    let mut time_s = 0.0;
    let mut energy_j = 0.0;
    let mut launches = 0.0;
    for (i, (op, sched)) in graph.ops.iter().zip(&problem.ops).enumerate() {
        if pick(i, op) {
            let (t, e) = if sched.all_cores_s < sched.one_core_s {
                (sched.all_cores_s, sched.all_cores_energy_j)
            } else {
                (sched.one_core_s, sched.one_core_energy_j)
            };
            time_s += t;
            energy_j += e;
            launches += op.launches();
        }
    }
    (time_s, energy_j, launches)
}

/// Time and energy of re-running the attention core (QKᵀ, softmax, dropout, ×V) that
/// selective recompute drops from memory: the operators over the score tensor, found by shape
/// (the softmax's element count, whole-row or fused causal), or the fused attention kernel's
/// forward, each in its faster variant since they form a chain.
pub(super) fn attention_core(
    graph: &OpGraph,
    problem: &ScheduleProblem,
    efficiency: &Efficiency,
) -> (f64, f64) {
    let score_elements: Vec<u64> = graph
        .ops
        .iter()
        .filter_map(|op| match op.kind {
            OpKind::Vector {
                op: VectorOp::Softmax | VectorOp::CausalSoftmax,
                elements,
                ..
            } => Some(elements),
            _ => None,
        })
        .collect();
    let touches_scores = |kind: &OpKind| match *kind {
        OpKind::Vector { elements, .. } => score_elements.contains(&elements),
        OpKind::Gemm { batch, m, n, k } => {
            batch > 1
                && (score_elements.contains(&(batch * m * n))
                    || score_elements.contains(&(batch * m * k)))
        }
        // A fused kernel is the whole core: Megatron-Core's `core_attn` checkpoint reruns it.
        OpKind::Attention { .. } => true,
        OpKind::Collective { .. } => false,
    };
    let (time_s, energy_j, launches) =
        ops_in_turn(graph, problem, |_, op| touches_scores(&op.kind));
    (efficiency.eager_pass_s(time_s, launches), energy_j)
}

/// Time and energy of a forward that full recompute does not rerun: its last `skipped`
/// operators ([`Checkpoint::skipped_ops`](crate::workload::Checkpoint::skipped_ops)), each in
/// its faster variant. The rerun is the forward's GPU time `gpu_s` less theirs, with their
/// launches, launched eagerly ([`Efficiency::eager_pass_s`]); what it saves is at most the
/// forward's time and its energy `fwd_j`. Monotone in `gpu_s`, so a lower bound on the
/// forward's GPU time gives a lower bound on the rerun.
pub(super) fn recompute_skipped(
    graph: &OpGraph,
    problem: &ScheduleProblem,
    efficiency: &Efficiency,
    skipped: usize,
    gpu_s: f64,
    fwd_j: f64,
) -> (f64, f64) {
    if skipped == 0 {
        return (0.0, 0.0);
    }
    let first = graph.ops.len().saturating_sub(skipped);
    let (skipped_s, skipped_j, skipped_launches) = ops_in_turn(graph, problem, |i, _| i >= first);
    let launches = graph.launches();
    let fwd_s = efficiency.eager_pass_s(gpu_s, launches);
    // Clamped: rounding must not make a forward that skips everything rerun less than nothing.
    let rerun_s = efficiency
        .eager_pass_s(
            (gpu_s - skipped_s).max(0.0),
            (launches - skipped_launches).max(0.0),
        )
        .min(fwd_s);
    (fwd_s - rerun_s, skipped_j.min(fwd_j))
}
