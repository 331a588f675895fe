//! One design point end to end (docs/design.md §1): the workload's layer graph at each tensor
//! width, every unique layer scheduled on the chip's cores, and the best parallel plan over
//! the micro-batch sizes and recompute modes asked for.

use crate::arch::{ArchConfig, Tier};
use crate::cost::{collective_cost, CollectiveCost, CostModel};
use crate::error::InputError;
use crate::placement::{
    place_faster_than, Alternative, BytesPerParam, Fixed, Infeasible, LayerCost, LayerCostGraph,
    PipelineSchedule, PlacementProblem, Plan, RecomputeMode, ZeroStage,
};
use crate::schedule::{lower_bound, Schedule, ScheduleCache, ScheduleError, ScheduleProblem};
use crate::workload::{CollectiveKind, Layer, Op, OpGraph, OpKind, VectorOp, Workload};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything that shapes a plan besides the chip and the workload. Lists are candidates the
/// search chooses from; `fixed` holds the parallel widths the user gave.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    pub devices: u32,
    /// HBM per device; `None` takes the chip's.
    pub hbm_bytes: Option<u64>,
    pub micro_batches: Vec<u32>,
    pub recompute: Vec<RecomputeMode>,
    pub sequence_parallel: bool,
    pub schedule: PipelineSchedule,
    pub fixed: Fixed,
    /// Largest tensor width searched when `fixed.tp` is not given.
    pub max_tp: u32,
    /// Only these tensor widths (of those `fixed.tp` or `max_tp` allow); `None`: all of them.
    pub only_widths: Option<Vec<u32>>,
    /// ZeRO stages the search chooses from.
    pub zero: Vec<ZeroStage>,
    pub dp_overlap: bool,
    pub allow_idle_devices: bool,
    /// Allow `d × micro-batch` not dividing the global batch (PHAZE's `⌈B / d⌉` micro-batches).
    pub allow_uneven_batch: bool,
    /// Show a progress bar over the (micro-batch, recompute) candidates on stderr.
    pub progress: bool,
}

impl PlanOptions {
    /// Searches micro-batch {1, 2, 4, 8}, every recompute mode and t up to 8 on `devices`.
    pub fn searching(devices: u32) -> PlanOptions {
        PlanOptions {
            devices,
            hbm_bytes: None,
            micro_batches: vec![1, 2, 4, 8],
            recompute: vec![
                RecomputeMode::None,
                RecomputeMode::Selective,
                RecomputeMode::Full,
            ],
            sequence_parallel: false,
            schedule: PipelineSchedule::OneFOneB,
            fixed: Fixed::default(),
            max_tp: 8,
            only_widths: None,
            zero: vec![ZeroStage::Replicated],
            dp_overlap: true,
            allow_idle_devices: false,
            allow_uneven_batch: false,
            progress: false,
        }
    }
}

/// Why a design point has no plan.
#[derive(Debug, thiserror::Error)]
pub enum EvaluateError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("{0}")]
    Infeasible(Infeasible),
}

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
    /// The problems the schedules solve (operator names and variants, for display).
    #[serde(skip)]
    pub fwd_problem: ScheduleProblem,
    #[serde(skip)]
    pub bwd_problem: ScheduleProblem,
    /// Extra backward time and energy under selective recompute: the attention core's forward.
    pub selective_recompute_s: f64,
    pub selective_recompute_energy_j: f64,
    /// The optimizer step over one layer's parameters (once per iteration), and its energy.
    pub optimizer_step_s: f64,
    pub optimizer_step_energy_j: f64,
    /// Adding one micro-batch's weight gradients into the iteration's, and its energy.
    pub grad_accumulation_s: f64,
    pub grad_accumulation_energy_j: f64,
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
    pub optimizer_step_j: f64,
    /// One micro-batch's gradient accumulation (every micro-batch after a copy's first).
    pub grad_accumulation_j: f64,
    /// The all-reduce of the gradients its tensor group replicates (once per iteration).
    pub replica_grad_sync_j: f64,
}

impl LayerCosts {
    /// Energy of one sample under `plan`: every layer's forward and backward (and
    /// recomputation) on each of the `t` devices of its tensor group, per sample of a
    /// micro-batch; and once per iteration, over the global batch, each data-parallel copy's
    /// gradient accumulation (every micro-batch after its first), optimizer step and gradient
    /// synchronisation over the `d · k` copies of a stage as `plan.zero` does it (ZeRO-0: a
    /// ring all-reduce; 1: a reduce-scatter of gradients and an all-gather of weights, each
    /// copy stepping its share; 2: the reduce-scatter in every micro-batch's backward; 3: also
    /// two all-gathers of the weights per micro-batch and none after the step), and the
    /// all-reduce of the gradients a tensor group replicates. Pipeline sends are not counted.
    pub fn energy_per_sample_j(
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
                            e.fwd_j
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
            for &l in &stage.layers {
                let cost = &self.graph.layers[l];
                let layer = &self.energy_j[l];
                let replicas_j = copies_f * layer.replica_grad_sync_j;
                per_iteration += t * if cost.expert_params == 0 {
                    let step_copies = if plan.zero >= ZeroStage::Optimizer {
                        1.0
                    } else {
                        copies_f
                    };
                    sync_j(cost.params, copies)
                        + replicas_j
                        + step_copies * layer.optimizer_step_j
                        + accumulations * layer.grad_accumulation_j
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
                let (selective_recompute_s, selective_recompute_energy_j) =
                    attention_core(&layer.fwd, &fwd_problem);
                let (optimizer_step_s, optimizer_step_energy_j) =
                    optimizer_step(workload, cost, layer.params);
                let (grad_accumulation_s, grad_accumulation_energy_j) =
                    grad_accumulation(workload, cost, layer.params);
                index_of.insert(&layer.signature, unique.len());
                unique.push(UniqueLayerSchedule {
                    signature: layer.signature.clone(),
                    name: layer.name.clone(),
                    count: 1,
                    fwd,
                    bwd,
                    fwd_problem,
                    bwd_problem,
                    selective_recompute_s,
                    selective_recompute_energy_j,
                    optimizer_step_s,
                    optimizer_step_energy_j,
                    grad_accumulation_s,
                    grad_accumulation_energy_j,
                });
                unique.len() - 1
            }
        };
        let s = &unique[u];
        let replica_sync = replica_grad_sync(workload, cost, layer);
        layers.push(LayerCost {
            name: layer.name.clone(),
            fwd_s: s.fwd.makespan_s,
            bwd_s: s.bwd.makespan_s,
            selective_recompute_s: s.selective_recompute_s,
            params: layer.params,
            activation_bytes: layer.activation_bytes,
            output_bytes: layer.output_bytes,
            optimizer_step_s: s.optimizer_step_s,
            grad_accumulation_s: s.grad_accumulation_s,
            replica_grad_sync_s: replica_sync.latency_s,
            expert_params: layer.expert_params,
            all_to_all_bytes: layer.all_to_all_bytes,
        });
        energy_j.push(LayerEnergy {
            fwd_j: s.fwd.energy_j,
            bwd_j: s.bwd.energy_j,
            selective_recompute_j: s.selective_recompute_energy_j,
            optimizer_step_j: s.optimizer_step_energy_j,
            grad_accumulation_j: s.grad_accumulation_energy_j,
            replica_grad_sync_j: replica_sync.energy_j,
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

/// Time and energy of the optimizer step over `params` parameters on the chip's vector cores.
fn optimizer_step(workload: &Workload, cost: &CostModel, params: u64) -> (f64, f64) {
    if params == 0 {
        return (0.0, 0.0);
    }
    kernels_in_turn(cost, &workload.optimizer_step_ops(params))
}

/// The all-reduce, once per iteration, of the gradients of the parameters `layer`'s tensor
/// group replicates, over the devices holding each copy.
fn replica_grad_sync(workload: &Workload, cost: &CostModel, layer: &Layer) -> CollectiveCost {
    let replicated = layer.replicated;
    let bytes = replicated.params * u64::from(workload.bytes_per_param().grads);
    collective_cost(
        cost.arch(),
        CollectiveKind::AllReduce,
        bytes,
        replicated.group,
    )
}

/// Time and energy of one micro-batch's gradient accumulation over `params` parameters.
fn grad_accumulation(workload: &Workload, cost: &CostModel, params: u64) -> (f64, f64) {
    let op = workload.grad_accumulation_op(params);
    kernels_in_turn(cost, op.as_slice())
}

/// Time and energy of `ops` on the chip's vector cores: one after another, each in its
/// faster variant.
fn kernels_in_turn(cost: &CostModel, ops: &[Op]) -> (f64, f64) {
    ops.iter()
        .map(|op| {
            let c = cost.op_cost(op);
            if c.all_cores_s <= c.one_core_s {
                (c.all_cores_s, c.all_cores_energy_j)
            } else {
                (c.one_core_s, c.one_core_energy_j)
            }
        })
        .fold((0.0, 0.0), |(s, j), (op_s, op_j)| (s + op_s, j + op_j))
}

/// Forward, backward and selective-recompute lower bounds of one layer on `cost`'s chip.
fn layer_bounds(layer: &Layer, cost: &CostModel) -> Result<[f64; 3], ScheduleError> {
    let fwd_problem = ScheduleProblem::from_op_graph(&layer.fwd, cost);
    let bwd_problem = ScheduleProblem::from_op_graph(&layer.bwd, cost);
    Ok([
        lower_bound(&fwd_problem)?,
        lower_bound(&bwd_problem)?,
        attention_core(&layer.fwd, &fwd_problem).0,
    ])
}

/// The layer costs of `workload` at width `tp` with each unique layer's forward and backward
/// latency replaced by its schedule lower bound (no list scheduling, no ILP): cheap, and no
/// schedule is faster.
fn lower_bound_graph(
    workload: &Workload,
    cost: &CostModel,
    tp: u32,
    micro_batch: u32,
    sequence_parallel: bool,
) -> Result<LayerCostGraph, EvaluateError> {
    let graph = workload.layer_graph(tp, micro_batch, sequence_parallel)?;
    let mut bounds: BTreeMap<&str, [f64; 5]> = BTreeMap::new();
    let mut layers = Vec::with_capacity(graph.layers.len());
    for layer in &graph.layers {
        let [fwd_s, bwd_s, selective_recompute_s, optimizer_step_s, grad_accumulation_s] =
            match bounds.get(layer.signature.as_str()) {
                Some(&b) => b,
                None => {
                    let [f, b, s] = layer_bounds(layer, cost)?;
                    let b = [
                        f,
                        b,
                        s,
                        optimizer_step(workload, cost, layer.params).0,
                        grad_accumulation(workload, cost, layer.params).0,
                    ];
                    bounds.insert(&layer.signature, b);
                    b
                }
            };
        layers.push(LayerCost {
            name: layer.name.clone(),
            fwd_s,
            bwd_s,
            selective_recompute_s,
            params: layer.params,
            activation_bytes: layer.activation_bytes,
            output_bytes: layer.output_bytes,
            optimizer_step_s,
            grad_accumulation_s,
            replica_grad_sync_s: replica_grad_sync(workload, cost, layer).latency_s,
            expert_params: layer.expert_params,
            all_to_all_bytes: layer.all_to_all_bytes,
        });
    }
    Ok(LayerCostGraph {
        tp,
        layers,
        edges: graph.edges.clone(),
        replicated_edges: graph.replicated_edges(),
        repeated_layers: graph.repeated_layers(),
    })
}

/// The unique layers of a workload at one (tensor width, micro-batch), each with the number of
/// layers sharing it: what [`LayerWork::busy_s`] prices on each chip of a sweep, built once.
#[derive(Debug, Clone)]
pub struct LayerWork {
    pub tp: u32,
    pub micro_batch: u32,
    unique: Vec<(usize, Layer)>,
}

impl LayerWork {
    /// Groups the layers of `workload` at width `tp` and `micro_batch` by signature.
    pub fn new(workload: &Workload, tp: u32, micro_batch: u32) -> Result<LayerWork, InputError> {
        let graph = workload.layer_graph(tp, micro_batch, false)?;
        let mut unique: Vec<(usize, Layer)> = Vec::new();
        for layer in graph.layers {
            match unique
                .iter_mut()
                .find(|(_, u)| u.signature == layer.signature)
            {
                Some((count, _)) => *count += 1,
                None => unique.push((1, layer)),
            }
        }
        Ok(LayerWork {
            tp,
            micro_batch,
            unique,
        })
    }

    /// Device-seconds one micro-batch keeps its tensor group busy under each recompute mode
    /// (in [`RecomputeMode`] order: none, selective, full): `t` devices times the summed
    /// schedule lower bounds of every layer's forward, backward and recomputation.
    pub fn busy_s(&self, cost: &CostModel) -> Result<[f64; 3], ScheduleError> {
        let (mut fwd_bwd, mut fwd, mut selective) = (0.0, 0.0, 0.0);
        for (count, layer) in &self.unique {
            let [f, b, s] = layer_bounds(layer, cost)?;
            let n = *count as f64;
            fwd_bwd += n * (f + b);
            if layer.activation_bytes.recomputed_under_full() {
                fwd += n * f;
            }
            selective += n * s;
        }
        let t = f64::from(self.tp);
        Ok([t * fwd_bwd, t * (fwd_bwd + selective), t * (fwd_bwd + fwd)])
    }
}

/// What [`throughput_bound`] proves about the plans of a design point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PlanBound {
    /// No plan fits in memory.
    NoPlanFits,
    /// No plan reaches the threshold asked about: every one runs at most this many samples/s,
    /// which is strictly below it.
    Below(f64),
    /// The bound itself: no plan runs more samples/s.
    AtMost(f64),
}

/// Relative slack on the plan-time bounds that [`throughput_bound`] and sweeps pass to the
/// placement search, so that "no plan faster than the bound" proves a *strict* inequality.
pub const BOUND_SLACK: f64 = 1e-9;

/// An upper bound on the samples/s [`evaluate`] can find under `options`: the same plan search
/// on per-layer schedule lower bounds, with communication between devices free (pipeline
/// sends and the gradient all-reduce cost nothing; tensor-parallel collectives stay inside the
/// layers' bounds). Time per batch never falls when a latency or a transfer shrinks to its
/// bound, so no plan beats it. Memory does not depend on latencies, so when no plan fits,
/// `evaluate` finds none either.
///
/// With `threshold_samples_per_s > 0` only plans reaching it are searched for (much faster
/// when few do); [`PlanBound::Below`] says none does.
pub fn throughput_bound(
    workload: &Workload,
    cost: &CostModel,
    options: &PlanOptions,
    threshold_samples_per_s: f64,
) -> Result<PlanBound, EvaluateError> {
    let arch = cost.arch();
    let free_links: Vec<Tier> = arch
        .interconnect
        .iter()
        .map(|t| Tier {
            bandwidth_bytes_per_s: f64::MAX,
            latency_s: 0.0,
            ..t.clone()
        })
        .collect();
    let batch = workload.global_batch as f64;
    // A finite bound also skips the hunt for near misses when no plan fits.
    let threshold_s = if threshold_samples_per_s > 0.0 {
        batch / threshold_samples_per_s * (1.0 + BOUND_SLACK)
    } else {
        f64::MAX
    };
    let mut best_s = threshold_s;
    let mut found = false;
    for &micro_batch in &options.micro_batches {
        let graphs = tensor_widths(workload, options)
            .into_iter()
            .map(|t| lower_bound_graph(workload, cost, t, micro_batch, options.sequence_parallel))
            .collect::<Result<Vec<_>, _>>()?;
        for &recompute in &options.recompute {
            for &zero in &options.zero {
                let mut problem = placement_problem(
                    workload,
                    arch,
                    options,
                    graphs.clone(),
                    micro_batch,
                    recompute,
                );
                problem.zero = zero;
                problem.tiers = free_links.clone();
                // Free links leave a vanishing all-reduce; hiding it behind the backward pass
                // makes it exactly zero, so the search compares loads alone (see
                // `dp::walkable`).
                problem.dp_overlap = true;
                if let Ok(Some(plan)) = place_faster_than(&problem, best_s) {
                    best_s = plan.time_per_batch_s;
                    found = true;
                }
            }
        }
    }
    Ok(if found {
        PlanBound::AtMost(batch / best_s)
    } else if threshold_samples_per_s > 0.0 {
        PlanBound::Below(batch / threshold_s)
    } else {
        PlanBound::NoPlanFits
    })
}

/// Time and energy of re-running the attention core (QKᵀ, softmax, dropout, ×V) that
/// selective recompute drops from memory: the operators over the score tensor, found by shape
/// (the softmax's element count), each in its faster variant since they form a chain.
fn attention_core(graph: &OpGraph, problem: &ScheduleProblem) -> (f64, f64) {
    let score_elements: Vec<u64> = graph
        .ops
        .iter()
        .filter_map(|op| match op.kind {
            OpKind::Vector {
                op: VectorOp::Softmax,
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
        OpKind::Collective { .. } => false,
    };
    let mut time_s = 0.0;
    let mut energy_j = 0.0;
    for (op, sched) in graph.ops.iter().zip(&problem.ops) {
        if touches_scores(&op.kind) {
            let (t, e) = if sched.all_cores_s < sched.one_core_s {
                (sched.all_cores_s, sched.all_cores_energy_j)
            } else {
                (sched.one_core_s, sched.one_core_energy_j)
            };
            time_s += t;
            energy_j += e;
        }
    }
    (time_s, energy_j)
}

/// A design point's best plan with the figures users compare.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub workload: String,
    pub arch: String,
    pub plan: Plan,
    pub recompute: RecomputeMode,
    pub sequence_parallel: bool,
    pub hbm_bytes: u64,
    pub throughput_tokens_per_s: f64,
    /// Model FLOPs per iteration over (time per batch × devices used × peak FLOP/s).
    pub mfu: f64,
    pub model_flops_per_iteration: f64,
    /// Achieved model FLOP/s per device used.
    pub model_flops_per_s_per_device: f64,
    pub energy_per_sample_j: f64,
}

/// Tensor widths tried: the fixed one, or every width the workload accepts up to
/// `max_tp` and the device count, less those `only_widths` leaves out.
pub fn tensor_widths(workload: &Workload, options: &PlanOptions) -> Vec<u32> {
    let mut widths = match options.fixed.tp {
        Some(t) => vec![t],
        None => workload.valid_tp(options.max_tp.min(options.devices).max(1)),
    };
    if let Some(only) = &options.only_widths {
        widths.retain(|t| only.contains(t));
    }
    widths
}

/// The best plan for `workload` on `arch` under `options`, searching every micro-batch,
/// recompute mode and tensor width offered. Ties keep the first candidate in option order,
/// so the answer is deterministic.
pub fn evaluate(
    workload: &Workload,
    arch: &ArchConfig,
    options: &PlanOptions,
    cache: &ScheduleCache,
) -> Result<Evaluation, EvaluateError> {
    evaluate_on(workload, &CostModel::new(arch), options, cache)
}

/// [`evaluate`] on a chip's cost model, so callers pricing many points of one chip (sweeps)
/// share its operator memo.
pub fn evaluate_on(
    workload: &Workload,
    cost: &CostModel,
    options: &PlanOptions,
    cache: &ScheduleCache,
) -> Result<Evaluation, EvaluateError> {
    let (best, infeasible) = search_plans(workload, cost, options, cache, f64::INFINITY)?;
    best.ok_or_else(|| EvaluateError::Infeasible(merge_infeasible(infeasible)))
}

/// [`evaluate_on`] restricted to plans faster than `bound_s` per batch: `Ok(None)` when
/// none is (which includes no plan fitting in memory). A finite bound prunes the plan search
/// and skips the hunt for near misses.
pub fn evaluate_faster_than(
    workload: &Workload,
    cost: &CostModel,
    options: &PlanOptions,
    cache: &ScheduleCache,
    bound_s: f64,
) -> Result<Option<Evaluation>, EvaluateError> {
    Ok(search_plans(workload, cost, options, cache, bound_s)?.0)
}

/// Why no candidate had a plan, per (micro-batch, recompute) candidate and ZeRO stage (named
/// only when several were offered).
type Infeasibilities = Vec<(String, Option<ZeroStage>, Infeasible)>;

/// The best plan faster than `bound_s` over every candidate of `options`, and why the
/// candidates without one have none (only searched for when `bound_s` is infinite).
fn search_plans(
    workload: &Workload,
    cost: &CostModel,
    options: &PlanOptions,
    cache: &ScheduleCache,
    bound_s: f64,
) -> Result<(Option<Evaluation>, Infeasibilities), EvaluateError> {
    let arch = cost.arch();
    let widths = tensor_widths(workload, options);
    let hbm_bytes = options.hbm_bytes.unwrap_or(arch.hbm.capacity_bytes);
    let mut best: Option<Evaluation> = None;
    let mut infeasible = Vec::new();
    let candidates = options.micro_batches.len() * options.recompute.len() * options.zero.len();
    let bar = if options.progress {
        let bar = indicatif::ProgressBar::new(candidates as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "planning {bar:40} {pos}/{len} (micro-batch, recompute, ZeRO) candidates  ETA {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    for &micro_batch in &options.micro_batches {
        let per_width: Vec<LayerCosts> = widths
            .par_iter()
            .map(|&t| {
                layer_costs(
                    workload,
                    cost,
                    cache,
                    t,
                    micro_batch,
                    options.sequence_parallel,
                )
            })
            .collect::<Result<_, _>>()?;
        for &recompute in &options.recompute {
            for &zero in &options.zero {
                let graphs = per_width.iter().map(|c| c.graph.clone()).collect();
                let mut problem =
                    placement_problem(workload, arch, options, graphs, micro_batch, recompute);
                problem.zero = zero;
                // Only plans faster than the best so far matter: the bound prunes the search.
                let bound_s = best.as_ref().map_or(bound_s, |b| b.plan.time_per_batch_s);
                match place_faster_than(&problem, bound_s) {
                    Ok(Some(plan)) => {
                        let costs = per_width
                            .iter()
                            .find(|c| c.graph.tp == plan.tp)
                            .expect("a plan's tensor width is one of the graphs offered");
                        let energy = costs.energy_per_sample_j(
                            &plan,
                            recompute,
                            problem.bytes_per_param,
                            workload.global_batch,
                            arch,
                        );
                        best = Some(summarise(
                            workload,
                            arch,
                            plan,
                            recompute,
                            options.sequence_parallel,
                            hbm_bytes,
                            energy,
                        ));
                    }
                    Ok(None) => {}
                    Err(why) => infeasible.push((
                        format!(
                            "micro-batch {micro_batch}, recompute {}",
                            recompute_name(recompute)
                        ),
                        (options.zero.len() > 1).then_some(zero),
                        why,
                    )),
                }
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    Ok((best, infeasible))
}

/// The chip's interconnect tiers at the bandwidth collectives achieve on them
/// (`efficiency.link_bandwidth`, as the in-layer collectives of `cost::collective`), so the
/// gradient all-reduce and pipeline sends are priced like tensor-parallel collectives.
fn achieved_tiers(arch: &ArchConfig) -> Vec<Tier> {
    arch.interconnect
        .iter()
        .map(|t| Tier {
            bandwidth_bytes_per_s: t.bandwidth_bytes_per_s * arch.efficiency.link_bandwidth,
            ..t.clone()
        })
        .collect()
}

/// The placement problem of `graphs` (one per tensor width) under `options` on `arch`.
fn placement_problem(
    workload: &Workload,
    arch: &ArchConfig,
    options: &PlanOptions,
    graphs: Vec<LayerCostGraph>,
    micro_batch: u32,
    recompute: RecomputeMode,
) -> PlacementProblem {
    let bytes = workload.bytes_per_param();
    PlacementProblem {
        graphs,
        devices: options.devices,
        hbm_bytes: options.hbm_bytes.unwrap_or(arch.hbm.capacity_bytes),
        global_batch: workload.global_batch,
        micro_batch,
        recompute,
        bytes_per_param: BytesPerParam {
            weights: bytes.weights,
            grads: bytes.grads,
            optimizer: bytes.optimizer,
        },
        zero: options.zero.first().copied().unwrap_or_default(),
        schedule: options.schedule,
        tiers: achieved_tiers(arch),
        dp_overlap: options.dp_overlap,
        overlap_efficiency: arch.efficiency.comm_overlap,
        constraints: options.fixed,
        // With every width held the plan is fixed; devices beyond t·p·d stay idle.
        allow_idle_devices: options.allow_idle_devices
            || (options.fixed.tp.is_some()
                && options.fixed.pp.is_some()
                && options.fixed.dp.is_some()),
        allow_uneven_batch: options.allow_uneven_batch,
    }
}

fn summarise(
    workload: &Workload,
    arch: &ArchConfig,
    plan: Plan,
    recompute: RecomputeMode,
    sequence_parallel: bool,
    hbm_bytes: u64,
    energy_per_sample_j: f64,
) -> Evaluation {
    let model_flops = workload.model_flops_per_iteration();
    let device_seconds = plan.time_per_batch_s * f64::from(plan.devices_used);
    let model_flops_per_s_per_device = model_flops / device_seconds;
    Evaluation {
        workload: workload.name.clone(),
        arch: arch.name.clone(),
        throughput_tokens_per_s: plan.throughput_samples_per_s
            * workload.tokens_per_sample() as f64,
        mfu: model_flops_per_s_per_device / arch.peak_tensor_flops(),
        model_flops_per_iteration: model_flops,
        model_flops_per_s_per_device,
        energy_per_sample_j,
        plan,
        recompute,
        sequence_parallel,
        hbm_bytes,
    }
}

/// The mode a [`recompute_name`] names.
pub fn recompute_from_name(name: &str) -> Option<RecomputeMode> {
    [
        RecomputeMode::None,
        RecomputeMode::Selective,
        RecomputeMode::Full,
    ]
    .into_iter()
    .find(|&m| recompute_name(m) == name)
}

/// The lowercase name used on the command line and in CSV.
pub fn recompute_name(mode: RecomputeMode) -> &'static str {
    match mode {
        RecomputeMode::None => "none",
        RecomputeMode::Selective => "selective",
        RecomputeMode::Full => "full",
    }
}

/// One report for all candidates: each candidate's reasons, labelled, and the three
/// alternatives with the smallest memory overshoot across them.
fn merge_infeasible(cases: Infeasibilities) -> Infeasible {
    // A reason that several ZeRO stages of one candidate share is listed once, naming them.
    let mut merged: Vec<(String, Vec<u8>, String)> = Vec::new();
    let mut alternatives: Vec<Alternative> = Vec::new();
    for (label, zero, case) in cases {
        for reason in case.reasons {
            match merged
                .iter_mut()
                .find(|(l, stages, r)| *l == label && *r == reason && !stages.is_empty())
            {
                Some((_, stages, _)) => stages.extend(zero.map(ZeroStage::number)),
                None => merged.push((
                    label.clone(),
                    zero.map(ZeroStage::number).into_iter().collect(),
                    reason,
                )),
            }
        }
        alternatives.extend(case.alternatives);
    }
    let mut reasons: Vec<String> = merged
        .into_iter()
        .map(|(label, stages, reason)| {
            let stages: Vec<String> = stages.iter().map(u8::to_string).collect();
            if stages.is_empty() {
                format!("{label}: {reason}")
            } else {
                format!("{label}, ZeRO-{}: {reason}", stages.join("/"))
            }
        })
        .collect();
    alternatives.sort_by(|a, b| {
        a.overshoot_bytes
            .cmp(&b.overshoot_bytes)
            .then(a.plan.time_per_batch_s.total_cmp(&b.plan.time_per_batch_s))
    });
    // Stages of ZeRO that change nothing for a plan (one copy per stage) give the same
    // alternative; the lowest stage, offered first, stays.
    alternatives.dedup_by(|later, kept| {
        later.overshoot_bytes == kept.overshoot_bytes
            && later.plan.time_per_batch_s == kept.plan.time_per_batch_s
            && later.plan.stages == kept.plan.stages
    });
    alternatives.truncate(3);
    if reasons.is_empty() {
        reasons.push("no micro-batch size or recompute mode was offered".to_string());
    }
    Infeasible {
        reasons,
        alternatives,
    }
}
