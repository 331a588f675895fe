//! The cost model shared by the dynamic programme, the brute force and fixed-plan evaluation:
//! stage metrics, operations, memory, pipeline sends, the tail (gradient synchronisation and
//! optimizer step) and the time per batch of the 1F1B and GPipe schedules.

use super::{
    Alternative, DeviceLayout, FixedPlan, Infeasible, LayerCost, LayerCostGraph, MemoryBreakdown,
    PipelineSchedule, PlacementProblem, Plan, RecomputeMode, Stage, TimeSplit, ZeroStage,
};
use crate::arch::{fewest_in_domain, group_link, tier_order_error, GroupLink};
use crate::report::{gib, plan_line, replica_range};

/// What the cost model needs to know about a set of layers forming one stage, independent of
/// how many devices run it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct StageMetrics {
    pub fwd_s: f64,
    /// Backward critical path including recomputation.
    pub bwd_s: f64,
    /// Activation bytes sent forward on edges leaving the stage.
    pub out_bytes: u64,
    /// Gradient bytes sent backward on edges entering the stage from earlier stages.
    pub in_bytes: u64,
    pub params: u64,
    /// Optimizer step of the stage's layers on one device (unsharded).
    pub optimizer_s: f64,
    /// The data-parallel wrapper's per-iteration gradient work on one device.
    pub grad_buffer_s: f64,
    /// One micro-batch's gradient accumulation over the stage's layers on one device.
    pub grad_accumulation_s: f64,
    /// All-reduce of the gradients the tensor group replicates, once per iteration.
    pub replica_sync_s: f64,
    /// Parameters whose gradients the stage all-reduces with another stage's copy of them
    /// once per iteration (tied parameters split between stages, `LayerCost::tied`).
    pub tied_sync_params: u64,
    /// Parameters of the stage's largest layer on one device: what ZeRO-3 gathers at once.
    pub largest_layer_params: u64,
    /// Of those, its experts (which expert parallelism divides).
    pub largest_layer_experts: u64,
    /// Of `params`, expert weights (all experts: expert parallelism divides them).
    pub expert_params: u64,
    /// Bytes dispatched to the experts per micro-batch (each of the four all-to-alls).
    pub all_to_all_bytes: u64,
    /// Activations of the micro-batch being processed.
    pub act_one: u64,
    /// Activations kept per other in-flight micro-batch.
    pub stash_per_micro_batch: u64,
}

impl StageMetrics {
    /// Adds what `layer` holds and does once per micro-batch or iteration besides its
    /// forward and backward: parameters (and experts), optimizer step, gradient accumulation,
    /// replicated-gradient sync, dispatched bytes, kept activations; and, where the layer of
    /// the parameters it is tied to is not in the stage (`owner_in_stage` false), its copy of
    /// them and their gradients' all-reduce.
    fn add_layer_state(&mut self, layer: &LayerCost, mode: RecomputeMode, owner_in_stage: bool) {
        let copy = layer.tied.filter(|_| !owner_in_stage);
        let copy_params = copy.map_or(0, |c| c.params);
        self.params += layer.params + copy_params;
        self.tied_sync_params += copy_params;
        self.optimizer_s += layer.optimizer_step_s + copy.map_or(0.0, |c| c.optimizer_step_s);
        self.grad_buffer_s += layer.grad_buffer_s + copy.map_or(0.0, |c| c.grad_buffer_s);
        self.grad_accumulation_s +=
            layer.grad_accumulation_s + copy.map_or(0.0, |c| c.grad_accumulation_s);
        self.replica_sync_s += layer.replica_grad_sync_s;
        self.note_largest_layer(layer.params + copy_params, layer.expert_params);
        self.expert_params += layer.expert_params;
        self.all_to_all_bytes += layer.all_to_all_bytes;
        self.stash_per_micro_batch += kept_bytes(layer, mode);
    }

    /// Keeps the larger of the stage's largest layer and one of `params` (`experts` of them).
    fn note_largest_layer(&mut self, params: u64, experts: u64) {
        if params > self.largest_layer_params {
            self.largest_layer_params = params;
            self.largest_layer_experts = experts;
        }
    }

    /// What one device holding the chunks `parts` (one after another, one micro-batch at a
    /// time) computes, holds and keeps: sums of times and state, the largest working set and
    /// per-micro-batch stash of any chunk.
    pub fn of_chunks<'a>(parts: impl IntoIterator<Item = &'a StageMetrics>) -> StageMetrics {
        let mut device = StageMetrics::default();
        for sm in parts {
            device.fwd_s += sm.fwd_s;
            device.bwd_s += sm.bwd_s;
            device.params += sm.params;
            device.optimizer_s += sm.optimizer_s;
            device.grad_buffer_s += sm.grad_buffer_s;
            device.grad_accumulation_s += sm.grad_accumulation_s;
            device.replica_sync_s += sm.replica_sync_s;
            device.tied_sync_params += sm.tied_sync_params;
            device.note_largest_layer(sm.largest_layer_params, sm.largest_layer_experts);
            device.expert_params += sm.expert_params;
            device.all_to_all_bytes += sm.all_to_all_bytes;
            device.act_one = device.act_one.max(sm.act_one);
            device.stash_per_micro_batch =
                device.stash_per_micro_batch.max(sm.stash_per_micro_batch);
        }
        device
    }
}

/// Predecessor lists of a validated graph.
pub(crate) fn predecessors(n: usize, edges: &[(usize, usize, u64)]) -> Vec<Vec<usize>> {
    let mut preds = vec![Vec::new(); n];
    for &(from, to, _) in edges {
        preds[to].push(from);
    }
    preds
}

/// Backward time of a layer with its recomputation (full recompute reruns the forward of the
/// layers that drop activations for it, but what its checkpoint skips), and where the owner
/// of the parameters it is tied to shares its stage, the sum of the two uses' gradients.
fn backward_s(layer: &LayerCost, mode: RecomputeMode, owner_in_stage: bool) -> f64 {
    layer.bwd_s
        + layer
            .tied
            .filter(|_| owner_in_stage)
            .map_or(0.0, |t| t.grad_sum_s)
        + layer.recompute_s(mode)
}

/// Activation bytes a layer keeps per stashed micro-batch.
fn kept_bytes(layer: &LayerCost, mode: RecomputeMode) -> u64 {
    let act = &layer.activation_bytes;
    match mode {
        RecomputeMode::None => act.none,
        RecomputeMode::Selective => act.selective,
        RecomputeMode::Full => act.full,
    }
}

/// Metrics of the stage `in_stage`, given the layers of earlier stages `before`.
/// `dist` is scratch space of at least `n` entries.
pub(crate) fn stage_metrics(
    problem: &PlacementProblem,
    graph_index: usize,
    preds: &[Vec<usize>],
    in_stage: &[bool],
    before: &[bool],
    dist: &mut [f64],
) -> StageMetrics {
    let graph = &problem.graphs[graph_index];
    let mode = problem.recompute;
    let mut sm = StageMetrics::default();
    let mut largest_full_working_set = 0u64;
    // Longest paths in topological (index) order: first forward weights, then backward.
    for backward in [false, true] {
        let mut longest = 0.0f64;
        for (v, layer) in graph.layers.iter().enumerate() {
            if !in_stage[v] {
                continue;
            }
            let own = if backward {
                backward_s(layer, mode, layer.tied.is_some_and(|t| in_stage[t.owner]))
            } else {
                layer.fwd_s
            };
            let start = preds[v]
                .iter()
                .filter(|&&u| in_stage[u])
                .map(|&u| dist[u])
                .fold(0.0f64, f64::max);
            dist[v] = start + own;
            longest = longest.max(dist[v]);
        }
        if backward {
            sm.bwd_s = longest;
        } else {
            sm.fwd_s = longest;
        }
    }
    for (v, layer) in graph.layers.iter().enumerate() {
        let owner_in_stage = layer.tied.is_some_and(|t| in_stage[t.owner]);
        if !in_stage[v] {
            // The stage holds the parameters another stage keeps a copy of.
            if owner_in_stage {
                sm.tied_sync_params += layer.tied.map_or(0, |t| t.params);
            }
            continue;
        }
        sm.add_layer_state(layer, mode, owner_in_stage);
        if layer.activation_bytes.recomputed_under_full() {
            largest_full_working_set = largest_full_working_set.max(layer.activation_bytes.none);
        }
    }
    sm.act_one = sm.stash_per_micro_batch
        + if mode == RecomputeMode::Full {
            largest_full_working_set
        } else {
            0
        };
    for &(from, to, bytes) in &graph.edges {
        if in_stage[from] && !in_stage[to] {
            sm.out_bytes += bytes;
        }
        if before[from] && in_stage[to] {
            sm.in_bytes += bytes;
        }
    }
    sm
}

/// Whether every layer has an edge from the layer before it: then the downsets are the
/// prefixes and every stage is a range of layers.
pub(crate) fn is_chain(preds: &[Vec<usize>]) -> bool {
    preds
        .iter()
        .enumerate()
        .skip(1)
        .all(|(v, p)| p.contains(&(v - 1)))
}

/// What [`chain_stage_metrics`] reads of a graph for every starting layer, built once per
/// graph.
pub(crate) struct ChainTables {
    /// Edges into each layer as (from, bytes).
    incoming: Vec<Vec<(usize, u64)>>,
    /// Bytes on the edges out of each layer.
    outgoing_bytes: Vec<u64>,
    /// Per owner, the parameters later layers are tied to (their copies' gradients are
    /// all-reduced with the owner's stage until the stage reaches them).
    tied_to: Vec<u64>,
}

impl ChainTables {
    pub(crate) fn new(graph: &LayerCostGraph) -> ChainTables {
        let n = graph.layers.len();
        let mut incoming = vec![Vec::new(); n];
        let mut outgoing_bytes = vec![0u64; n];
        for &(from, to, bytes) in &graph.edges {
            incoming[to].push((from, bytes));
            outgoing_bytes[from] += bytes;
        }
        let mut tied_to = vec![0u64; n];
        for t in graph.layers.iter().filter_map(|layer| layer.tied) {
            tied_to[t.owner] += t.params;
        }
        ChainTables {
            incoming,
            outgoing_bytes,
            tied_to,
        }
    }
}

/// [`stage_metrics`] of the stages `first..end` of a chain ([`is_chain`]) for every `end`
/// after `first`, extending the stage one layer at a time: a chain stage's critical path is
/// its sum, accumulated in the same order, so the results are identical. `tables` are the
/// graph's ([`ChainTables::new`]).
pub(crate) fn chain_stage_metrics(
    problem: &PlacementProblem,
    graph_index: usize,
    tables: &ChainTables,
    first: usize,
) -> Vec<StageMetrics> {
    let graph = &problem.graphs[graph_index];
    let mode = problem.recompute;
    let mut sm = StageMetrics::default();
    let mut largest_full_working_set = 0u64;
    let mut all = Vec::with_capacity(graph.layers.len() - first);
    for (v, layer) in graph.layers.iter().enumerate().skip(first) {
        sm.fwd_s += layer.fwd_s;
        let owner_in_stage = layer.tied.is_some_and(|t| t.owner >= first);
        sm.bwd_s += backward_s(layer, mode, owner_in_stage);
        sm.tied_sync_params += tables.tied_to[v];
        if let Some(t) = layer.tied.filter(|_| owner_in_stage) {
            // Owner and user on one stage: nothing to synchronise.
            sm.tied_sync_params -= t.params;
        }
        sm.add_layer_state(layer, mode, owner_in_stage);
        if layer.activation_bytes.recomputed_under_full() {
            largest_full_working_set = largest_full_working_set.max(layer.activation_bytes.none);
        }
        sm.act_one = sm.stash_per_micro_batch
            + if mode == RecomputeMode::Full {
                largest_full_working_set
            } else {
                0
            };
        for &(from, bytes) in &tables.incoming[v] {
            if from < first {
                sm.in_bytes += bytes;
            } else {
                // Now inside the stage: no longer sent.
                sm.out_bytes -= bytes;
            }
        }
        sm.out_bytes += tables.outgoing_bytes[v];
        all.push(sm);
    }
    all
}

/// One choice of tensor width and data-parallel width, with what follows from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx<'a> {
    pub problem: &'a PlacementProblem,
    pub graph_index: usize,
    pub t: u32,
    pub d: u32,
    /// Micro-batches per pipeline.
    pub m: u64,
    /// Tensor groups (of `t` devices) in each pipeline copy's block.
    pub units: u32,
    /// Expert-parallel width: pipelines (a divisor of `d`) dividing each expert layer.
    pub e: u32,
}

/// The two operations of one micro-batch on one replica of a stage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ops {
    pub send_forward_s: f64,
    pub send_backward_s: f64,
    /// Gradient accumulation on every micro-batch after the replica's first.
    pub accumulation_s: f64,
    /// Forward critical path and the forward sends.
    pub forward_s: f64,
    /// ZeRO-3's exposed weight all-gathers in the forward.
    pub dp_group_forward_s: f64,
    /// ZeRO-2/3's exposed gradient reduce-scatter (and ZeRO-3's weight all-gather) in the
    /// backward.
    pub dp_group_backward_s: f64,
    /// Backward critical path, the backward sends, the accumulation and the exposed
    /// ZeRO-2/3 communication.
    pub backward_s: f64,
}

impl Ctx<'_> {
    fn link(&self, span: u32, fewest_in: impl Fn(u32) -> u32) -> GroupLink<'_> {
        group_link(&self.problem.tiers, span, fewest_in).expect("validated: at least one tier")
    }

    /// The fewest of a stage's `d·k` copies that a domain of `domain` devices holding one of
    /// them holds. Pipelines (blocks of `units·t` devices) tile the cluster from device 0, so
    /// when whole blocks fit a domain, each holds as many copies of the stage as blocks fit
    /// (fewer in the last), `k` replicas each. When a block spans domains, where the stage sits
    /// in it is not fixed and its replicas may straddle a boundary: one, the safe count.
    fn fewest_copies_in(&self, k: u32, domain: u32) -> u32 {
        if self.problem.layout == DeviceLayout::StageMajor {
            // The d·k copies sit on consecutive tensor groups.
            return fewest_in_domain(self.d * k, self.t, domain);
        }
        let block = self.units * self.t;
        if block < domain && domain.is_multiple_of(block) {
            k * fewest_in_domain(self.d, block, domain)
        } else {
            1
        }
    }

    /// Devices spanned by the `d·k` copies of a stage with `k` replicas.
    fn copies_span(&self, k: u32) -> u32 {
        match self.problem.layout {
            DeviceLayout::PipelineMajor => (self.d - 1) * self.units * self.t + k * self.t,
            DeviceLayout::StageMajor => self.d * k * self.t,
        }
    }

    /// Whether replica counts are free (a held `dp` holds every stage to one replica).
    pub fn replicas_free(&self) -> bool {
        self.problem.constraints.dp.is_none()
    }

    /// The pipeline time's multiplier of the bottleneck: `m + K − 1` slots for a pipeline of
    /// `K` tensor groups.
    pub fn slots(&self, groups: u32) -> f64 {
        (self.m + u64::from(groups) - 1) as f64
    }

    /// Pipeline sends of a stage run by `k` replicas: forward, backward.
    pub fn sends(&self, sm: &StageMetrics, k: u32) -> [f64; 2] {
        if sm.out_bytes == 0 && sm.in_bytes == 0 {
            return [0.0; 2];
        }
        // Each device sends over its own link, to a neighbouring stage: the next tensor groups
        // (pipeline-major), or past this stage's copies (stage-major).
        let span = match self.problem.layout {
            DeviceLayout::PipelineMajor => (k + 1) * self.t,
            DeviceLayout::StageMajor => (self.d * k + 1) * self.t,
        };
        let link = self.link(span, |_| 1);
        // Or, where every device of the group holds the whole tensor, a t-th each and an
        // all-gather on the receiving group, if that is faster.
        let group = (self.t > 1 && self.problem.graphs[self.graph_index].replicated_edges)
            .then(|| self.link(self.t, |domain| fewest_in_domain(self.t, 1, domain)));
        let t = f64::from(self.t);
        let send = |bytes: u64| {
            if bytes == 0 {
                return 0.0;
            }
            let bytes = bytes as f64;
            let direct = bytes / link.bandwidth_bytes_per_s + link.tier.latency_s;
            group.map_or(direct, |group| {
                let gather = (t - 1.0) / t * bytes / group.bandwidth_bytes_per_s
                    + (t - 1.0) * group.tier.latency_s;
                direct.min(bytes / t / link.bandwidth_bytes_per_s + link.tier.latency_s + gather)
            })
        };
        [send(sm.out_bytes), send(sm.in_bytes)]
    }

    /// Gradient accumulation of every micro-batch after a replica's first (none when each
    /// replica runs a single micro-batch).
    pub fn accumulation_s(&self, sm: &StageMetrics, k: u32) -> f64 {
        if self.m.div_ceil(u64::from(k)) >= 2 {
            self.per_held_param_s(sm, k, sm.grad_accumulation_s, false)
        } else {
            0.0
        }
    }

    /// A stage's parameters on one device, by how they are copied: the dense ones (held by
    /// each of the `d·k` copies) and its `1/e` of the experts (held by `d·k/e` copies).
    fn param_groups(&self, sm: &StageMetrics, k: u32) -> [(u64, u32); 2] {
        let copies = self.d * k;
        [
            (sm.params - sm.expert_params, copies),
            (
                sm.expert_params.div_ceil(u64::from(self.e)),
                (copies / self.e).max(1),
            ),
        ]
    }

    /// `per_layer_s` (a cost proportional to a stage's parameters, given for all of them) for
    /// what one device holds, optimizer state sharded over `shard` copies where `sharded`.
    fn per_held_param_s(&self, sm: &StageMetrics, k: u32, per_params_s: f64, sharded: bool) -> f64 {
        let shards = |copies: u32| if sharded { f64::from(copies) } else { 1.0 };
        if sm.expert_params == 0 {
            return per_params_s / shards(self.d * k);
        }
        let held: f64 = self
            .param_groups(sm, k)
            .iter()
            .map(|&(params, copies)| params as f64 / shards(copies))
            .sum();
        per_params_s * held / sm.params as f64
    }

    /// Parameters of the stage's largest layer one device holds: its dense ones and `1/e` of
    /// its experts.
    fn largest_layer_held(&self, sm: &StageMetrics) -> u64 {
        sm.largest_layer_params - sm.largest_layer_experts
            + sm.largest_layer_experts.div_ceil(u64::from(self.e))
    }

    /// One of the experts' all-to-alls over the `e` pipelines sharing a stage's experts: each
    /// device sends `(e − 1)/e` of its dispatched bytes over its own link, on the tier the
    /// group spans. The experts wait for their tokens, so nothing hides it.
    fn all_to_all_s(&self, sm: &StageMetrics) -> f64 {
        if self.e <= 1 || sm.all_to_all_bytes == 0 {
            return 0.0;
        }
        let span = match self.problem.layout {
            DeviceLayout::PipelineMajor => (self.e - 1) * self.units * self.t + self.t,
            DeviceLayout::StageMajor => self.e * self.t,
        };
        let link = self.link(span, |_| 1);
        let e = f64::from(self.e);
        (e - 1.0) / e * sm.all_to_all_bytes as f64 / link.bandwidth_bytes_per_s
            + (e - 1.0) * link.tier.latency_s
    }

    /// The forward and backward operation of one micro-batch on one of `k` replicas.
    pub fn ops(&self, sm: &StageMetrics, k: u32) -> Ops {
        let [send_forward_s, send_backward_s] = self.sends(sm, k);
        let [send_forward_s, send_backward_s] = if self.problem.p2p_overlap {
            let hide = |send_s: f64, compute_s: f64| {
                exposed_after_overlap(send_s, compute_s, self.problem.overlap_efficiency)
            };
            [
                hide(send_forward_s, sm.fwd_s),
                hide(send_backward_s, sm.bwd_s),
            ]
        } else {
            [send_forward_s, send_backward_s]
        };
        let accumulation_s = self.accumulation_s(sm, k);
        let [dp_group_forward_s, dp_group_backward_s] = self.dp_group_comm_s(sm, k);
        Ops {
            send_forward_s,
            send_backward_s,
            accumulation_s,
            dp_group_forward_s,
            dp_group_backward_s,
            forward_s: sm.fwd_s + send_forward_s + dp_group_forward_s,
            backward_s: sm.bwd_s + send_backward_s + accumulation_s + dp_group_backward_s,
        }
    }

    /// What of a collective of `comm_s` beside `compute_s` stays exposed: with overlap the
    /// computation hides `overlap_efficiency` of it, up to its length.
    fn exposed(&self, comm_s: f64, compute_s: f64) -> f64 {
        if self.problem.dp_overlap {
            exposed_after_overlap(comm_s, compute_s, self.problem.overlap_efficiency)
        } else {
            comm_s
        }
    }

    /// One reduce-scatter or all-gather of `bytes` (per copy, whole) over `n` copies of a
    /// stage with `k` replicas, on the link of its `d·k` copies' ring.
    fn ring_pass_s(&self, k: u32, n: u32, bytes: u64) -> f64 {
        if n <= 1 || bytes == 0 {
            return 0.0;
        }
        let link = self.link(self.copies_span(k), |domain| {
            self.fewest_copies_in(k, domain)
        });
        let n = f64::from(n);
        (n - 1.0) / n * bytes as f64 / link.bandwidth_bytes_per_s + (n - 1.0) * link.tier.latency_s
    }

    /// Reduce-scatters (or all-gathers) of `bytes_per_param` per parameter, each parameter
    /// group over its own copies.
    fn ring_passes_s(&self, sm: &StageMetrics, k: u32, bytes_per_param: u32) -> f64 {
        self.param_groups(sm, k)
            .iter()
            .map(|&(params, n)| self.ring_pass_s(k, n, params * u64::from(bytes_per_param)))
            .sum()
    }

    /// The exposed collectives over the data-parallel group in each micro-batch's forward and
    /// backward. ZeRO-3 all-gathers the stage's weights in the forward and again in the
    /// backward, ZeRO-2 and 3 reduce-scatter its gradients in the backward: FSDP and DeepSpeed
    /// prefetch the next layer's gather and reduce the previous layer's gradients while a layer
    /// computes, so a pass hides up to `overlap_efficiency` of itself behind the computation,
    /// except for the one layer nothing precedes (the first gathered, the last reduced),
    /// charged as the stage's largest layer (all exposed without overlap). Expert layers add
    /// two all-to-alls each way (dispatch and combine), exposed.
    pub fn dp_group_comm_s(&self, sm: &StageMetrics, k: u32) -> [f64; 2] {
        let bpp = &self.problem.bytes_per_param;
        let experts_s = 2.0 * self.all_to_all_s(sm);
        // One layer's pass over the dense copies, and the stage's whole passes.
        let [(held_dense, copies), (held_experts, _)] = self.param_groups(sm, k);
        let one_layer = self.largest_layer_held(sm).min(held_dense + held_experts);
        let layer_pass =
            |per_param: u32| self.ring_pass_s(k, copies, one_layer * u64::from(per_param));
        let hidden_behind = |first_s: f64, all_s: f64, compute_s: f64| {
            let first_s = first_s.min(all_s);
            first_s + self.exposed(all_s - first_s, compute_s)
        };
        let [forward_s, backward_s] = match self.problem.zero {
            ZeroStage::Replicated | ZeroStage::Optimizer => [0.0; 2],
            ZeroStage::Gradients => [
                0.0,
                hidden_behind(
                    layer_pass(bpp.grads),
                    self.ring_passes_s(sm, k, bpp.grads),
                    sm.bwd_s,
                ),
            ],
            ZeroStage::Parameters => {
                let gather_s = self.ring_passes_s(sm, k, bpp.weights);
                let scatter_s = self.ring_passes_s(sm, k, bpp.grads);
                [
                    hidden_behind(layer_pass(bpp.weights), gather_s, sm.fwd_s),
                    hidden_behind(
                        layer_pass(bpp.weights) + layer_pass(bpp.grads),
                        gather_s + scatter_s,
                        sm.bwd_s,
                    ),
                ]
            }
        };
        [forward_s + experts_s, backward_s + experts_s]
    }

    /// What the pipeline time charges per slot for a stage of `k` replicas, as the pair the
    /// search minimises: 1F1B `((F + B) / k, 0)`, GPipe `(F / k, B / k)`; the pipeline time is
    /// `slots · (max first + max second)`.
    pub fn rate_s(&self, ops: &Ops, k: u32) -> (f64, f64) {
        let k = f64::from(k);
        match self.problem.schedule {
            PipelineSchedule::GPipe => (ops.forward_s / k, ops.backward_s / k),
            PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved => {
                ((ops.forward_s + ops.backward_s) / k, 0.0)
            }
        }
    }

    /// Micro-batches each of a stage's `k` replicas holds at most, `groups_to_end` tensor
    /// groups from the stage to the pipeline's end (its own included).
    pub fn in_flight(&self, k: u32, groups_to_end: u32) -> u64 {
        let own = self.m.div_ceil(u64::from(k));
        match self.problem.schedule {
            PipelineSchedule::GPipe => own,
            PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved => {
                u64::from(groups_to_end / k).min(own)
            }
        }
    }

    /// Weights, gradients and optimizer state on one device of a stage with `k` replicas: the
    /// dense parameters sharded over the `d·k` copies, the device's experts over theirs.
    pub fn state_bytes(&self, sm: &StageMetrics, k: u32) -> [u64; 3] {
        let [(dense, dense_copies), (experts, expert_copies)] = self.param_groups(sm, k);
        let dense = state_bytes(
            self.problem,
            dense,
            self.largest_layer_held(sm),
            u64::from(dense_copies),
        );
        if experts == 0 {
            return dense;
        }
        let experts = state_bytes(self.problem, experts, 0, u64::from(expert_copies));
        [0, 1, 2].map(|i| dense[i] + experts[i])
    }

    /// Copies the optimizer state and step are divided over: the stage's `d·k` with ZeRO-1 and
    /// above.
    pub fn optimizer_shards(&self, k: u32) -> u64 {
        if self.problem.zero >= ZeroStage::Optimizer {
            u64::from(self.d) * u64::from(k)
        } else {
            1
        }
    }

    /// Memory of one device of a stage with `k` replicas holding `in_flight` micro-batches.
    pub fn memory(&self, sm: &StageMetrics, k: u32, in_flight: u64) -> MemoryBreakdown {
        let [weights, grads, optimizer] = self.state_bytes(sm, k);
        let mut mem = MemoryBreakdown {
            weights,
            grads,
            optimizer,
            activations: sm.act_one,
            stash: in_flight.saturating_sub(1) * sm.stash_per_micro_batch,
            total: 0,
        };
        mem.total = mem.weights + mem.grads + mem.optimizer + mem.activations + mem.stash;
        mem
    }

    /// Whether `k` replicas fit in memory with `groups_to_end` groups from the stage to the end.
    pub fn fits(&self, sm: &StageMetrics, k: u32, groups_to_end: u32) -> bool {
        self.fits_state(self.state_bytes(sm, k).iter().sum(), sm, k, groups_to_end)
    }

    /// [`Ctx::fits`] with the state bytes per device already summed (`state_bytes`), the same
    /// sum [`Ctx::memory`] makes.
    pub fn fits_state(
        &self,
        state_bytes: u64,
        sm: &StageMetrics,
        k: u32,
        groups_to_end: u32,
    ) -> bool {
        let held = self.in_flight(k, groups_to_end);
        state_bytes + sm.act_one + held.saturating_sub(1) * sm.stash_per_micro_batch
            <= self.problem.hbm_bytes
    }

    /// The optimizer step of a stage with `k` replicas on one device, and before it the
    /// data-parallel wrapper's work on the gradients the device holds (all of them at every
    /// ZeRO stage: the step's share is divided, the gradient buffer is not).
    pub fn stage_optimizer_s(&self, sm: &StageMetrics, k: u32) -> f64 {
        self.per_held_param_s(
            sm,
            k,
            sm.optimizer_s,
            self.problem.zero >= ZeroStage::Optimizer,
        ) + self.stage_grad_buffer_s(sm, k)
    }

    /// Of [`Ctx::stage_optimizer_s`], the data-parallel wrapper's work on the gradients one
    /// device holds.
    pub fn stage_grad_buffer_s(&self, sm: &StageMetrics, k: u32) -> f64 {
        self.per_held_param_s(sm, k, sm.grad_buffer_s, false)
    }

    /// Exposed gradient synchronisation of a stage with `k` replicas: of the data-parallel
    /// synchronisation all of it, or with overlap what the last backward does not hide; and the
    /// all-reduces of the tensor group's replicated parameters and of the tied parameters split
    /// between stages, which follow the backward.
    pub fn dp_comm_s(&self, sm: &StageMetrics, k: u32) -> f64 {
        self.exposed(self.dp_sync_s(sm, k), sm.bwd_s) + sm.replica_sync_s + self.tied_sync_s(sm)
    }

    /// The part of a stage's data-parallel synchronisation its last backward hides (none
    /// without overlap).
    pub fn dp_hidden_s(&self, sm: &StageMetrics, k: u32) -> f64 {
        let sync_s = self.dp_sync_s(sm, k);
        sync_s - self.exposed(sync_s, sm.bwd_s)
    }

    /// The all-reduce of the gradients of tied parameters the stage shares with another stage
    /// (the first and last of a pipeline): each device with its counterpart in the other
    /// stage, on the tier a pipeline spans (pipeline-major) or, its stages being a stage's
    /// copies apart, the tier of the devices in use (stage-major). A ring of two moves the
    /// whole buffer once each way.
    pub fn tied_sync_s(&self, sm: &StageMetrics) -> f64 {
        if sm.tied_sync_params == 0 {
            return 0.0;
        }
        let span = match self.problem.layout {
            DeviceLayout::PipelineMajor => self.units * self.t,
            DeviceLayout::StageMajor => self.d * self.units * self.t,
        };
        let link = self.link(span, |_| 1);
        let bytes = sm.tied_sync_params * u64::from(self.problem.bytes_per_param.grads);
        bytes as f64 / link.bandwidth_bytes_per_s + 2.0 * link.tier.latency_s
    }

    /// What a stage with `k` replicas does after its last backward: its exposed gradient
    /// synchronisation, then its optimizer step.
    pub fn tail_s(&self, sm: &StageMetrics, k: u32) -> f64 {
        self.dp_comm_s(sm, k) + self.stage_optimizer_s(sm, k)
    }

    /// The whole data-parallel gradient synchronisation of a stage with `k` replicas after
    /// its last backward, hidden or not: ZeRO-0 all-reduces the gradients, ZeRO-1
    /// reduce-scatters them and all-gathers the updated weights, ZeRO-2 (whose backwards
    /// reduce-scattered already) all-gathers the weights, ZeRO-3 (whose forwards gather them)
    /// nothing.
    pub fn dp_sync_s(&self, sm: &StageMetrics, k: u32) -> f64 {
        let bpp = &self.problem.bytes_per_param;
        let grads = || self.ring_passes_s(sm, k, bpp.grads);
        let weights = || self.ring_passes_s(sm, k, bpp.weights);
        match self.problem.zero {
            // A ring all-reduce is a reduce-scatter and an all-gather of the gradients.
            ZeroStage::Replicated => 2.0 * grads(),
            ZeroStage::Optimizer => grads() + weights(),
            ZeroStage::Gradients => weights(),
            ZeroStage::Parameters => 0.0,
        }
    }
}

/// Weights, gradients and optimizer state on one device of a stage of `params` parameters
/// (its largest layer `largest_layer_params`) whose data-parallel copies number `shards`: each
/// ZeRO stage divides one more of them over the copies. ZeRO-2 also holds the full gradients
/// of the layer being reduced; ZeRO-3 the gathered weights of the layer computing and of the
/// one prefetched, and the full gradients of the layer being reduced.
pub(crate) fn state_bytes(
    problem: &PlacementProblem,
    params: u64,
    largest_layer_params: u64,
    shards: u64,
) -> [u64; 3] {
    let bpp = &problem.bytes_per_param;
    let shards = shards.max(1);
    let zero = problem.zero;
    let sharded = |bytes: u64, from: ZeroStage| {
        if zero >= from {
            bytes.div_ceil(shards)
        } else {
            bytes
        }
    };
    let largest_grads = largest_layer_params * u64::from(bpp.grads);
    let largest_weights = largest_layer_params * u64::from(bpp.weights);
    // A single copy shards nothing and gathers nothing.
    let (gathered_weights, bucket_grads) = match zero {
        _ if shards == 1 => (0, 0),
        ZeroStage::Replicated | ZeroStage::Optimizer => (0, 0),
        ZeroStage::Gradients => (0, largest_grads),
        ZeroStage::Parameters => (2 * largest_weights, largest_grads),
    };
    [
        sharded(params * u64::from(bpp.weights), ZeroStage::Parameters) + gathered_weights,
        sharded(params * u64::from(bpp.grads), ZeroStage::Gradients) + bucket_grads,
        sharded(params * u64::from(bpp.optimizer), ZeroStage::Optimizer),
    ]
}

/// What stays exposed of a collective of `comm_s` launched beside `compute_s` of computation
/// that hides `hidden_fraction` of it, up to the computation's length.
pub fn exposed_after_overlap(comm_s: f64, compute_s: f64, hidden_fraction: f64) -> f64 {
    comm_s - hidden_fraction * comm_s.min(compute_s)
}

/// The largest cluster the plan search takes.
pub(crate) const MAX_DEVICES: u32 = 1 << 20;

/// Checks the problem's invariants; the message says what is wrong.
pub(crate) fn validate(problem: &PlacementProblem) -> Result<(), String> {
    if problem.graphs.is_empty() {
        return Err("no layer graph given".into());
    }
    if problem.devices == 0 || problem.micro_batch == 0 || problem.global_batch == 0 {
        return Err("devices, micro-batch and global batch must be positive".into());
    }
    if problem.devices > MAX_DEVICES {
        return Err(format!(
            "{} devices: the plan search handles at most {MAX_DEVICES} (its tables grow with the \
             tensor groups of a pipeline)",
            problem.devices
        ));
    }
    if !(0.0..=1.0).contains(&problem.overlap_efficiency) {
        return Err(format!(
            "overlap_efficiency must be a fraction in [0, 1], got {}",
            problem.overlap_efficiency
        ));
    }
    if has_experts(problem) && problem.experts == 0 {
        return Err(
            "experts must be positive: some layers hold expert parameters (expert_params)".into(),
        );
    }
    let fixed = &problem.constraints;
    for (name, value) in [("tp", fixed.tp), ("pp", fixed.pp), ("dp", fixed.dp)] {
        if value == Some(0) {
            return Err(format!("constraints.{name} must be at least 1"));
        }
    }
    if let Some(only) = &problem.only_data_parallel {
        if only.is_empty() || only.contains(&0) {
            return Err(format!(
                "only_data_parallel must list data-parallel widths of at least 1, got {only:?}"
            ));
        }
    }
    match fixed.virtual_stages {
        Some(v) if problem.schedule != PipelineSchedule::Interleaved => {
            return Err(format!(
                "constraints.virtual_stages = {v} needs the interleaved schedule, not {}",
                problem.schedule.name()
            ))
        }
        Some(v) if v < 2 => {
            return Err(format!(
                "constraints.virtual_stages must be at least 2 (model chunks per stage), got {v}"
            ))
        }
        _ => {}
    }
    let n = problem.graphs[0].layers.len();
    for (gi, g) in problem.graphs.iter().enumerate() {
        if g.tp == 0 {
            return Err(format!("graph {gi}: tensor width 0"));
        }
        if g.layers.is_empty() || g.layers.len() != n {
            return Err(format!(
                "graph {gi} (t={}) has {} layers; every graph must have the same non-zero number ({n})",
                g.tp,
                g.layers.len()
            ));
        }
        if problem.graphs[..gi].iter().any(|o| o.tp == g.tp) {
            return Err(format!("two graphs for tensor width {}", g.tp));
        }
        for (li, l) in g.layers.iter().enumerate() {
            let times = [
                l.fwd_s,
                l.bwd_s,
                l.selective_recompute_s,
                l.recompute_skipped_s,
                l.optimizer_step_s,
                l.grad_accumulation_s,
                l.grad_buffer_s,
                l.replica_grad_sync_s,
            ];
            if l.recompute_skipped_s > l.fwd_s {
                return Err(format!(
                    "graph t={} layer {li} ({}): recompute_skipped_s {} exceeds its fwd_s {}",
                    g.tp, l.name, l.recompute_skipped_s, l.fwd_s
                ));
            }
            if l.expert_params > l.params {
                return Err(format!(
                    "graph t={} layer {li} ({}): expert_params {} exceed its params {}",
                    g.tp, l.name, l.expert_params, l.params
                ));
            }
            if let Some(tied) = l.tied {
                if tied.owner >= li {
                    return Err(format!(
                        "graph t={} layer {li} ({}): tied.owner {} is not an earlier layer",
                        g.tp, l.name, tied.owner
                    ));
                }
                let times = [
                    tied.optimizer_step_s,
                    tied.grad_accumulation_s,
                    tied.grad_buffer_s,
                    tied.grad_sum_s,
                ];
                if times.iter().any(|x| !x.is_finite() || *x < 0.0) {
                    return Err(format!(
                        "graph t={} layer {li} ({}): tied latencies must be finite and \
                         non-negative",
                        g.tp, l.name
                    ));
                }
            }
            if times.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err(format!(
                    "graph t={} layer {li} ({}): latencies must be finite and non-negative",
                    g.tp, l.name
                ));
            }
        }
        for &(from, to, _) in &g.edges {
            if from >= to || to >= n {
                return Err(format!(
                    "graph t={}: edge ({from}, {to}) must go forward between existing layers",
                    g.tp
                ));
            }
        }
        if let Some([first, end]) = g.repeated_layers {
            if first >= end || end > n {
                return Err(format!(
                    "graph t={}: repeated_layers [{first}, {end}) must be a non-empty range of \
                     the {n} layers",
                    g.tp
                ));
            }
        }
    }
    let tiers = &problem.tiers;
    if tiers.is_empty() {
        return Err("no interconnect tier given".into());
    }
    if let Some((i, name, reason)) = tier_order_error(tiers) {
        return Err(format!("tiers[{i}].{name}: {reason}"));
    }
    if let Some(bad) = tiers.iter().find(|tr| {
        let bandwidth_ok = tr.bandwidth_bytes_per_s.is_finite() && tr.bandwidth_bytes_per_s > 0.0;
        let latency_ok = tr.latency_s.is_finite() && tr.latency_s >= 0.0;
        !(bandwidth_ok && latency_ok)
    }) {
        return Err(format!(
            "tier `{}`: bandwidth must be positive, latency non-negative",
            bad.name
        ));
    }
    let last = tiers.last().expect("non-empty");
    if last.devices < problem.devices {
        return Err(format!(
            "the last interconnect tier `{}` spans {} devices, fewer than the {} devices of the cluster",
            last.name, last.devices, problem.devices
        ));
    }
    Ok(())
}

/// Micro-batches per pipeline for `d` pipelines: the global batch over `d × micro-batch`,
/// rounded up where uneven batches are allowed, `None` where it does not divide.
pub(crate) fn micro_batches(problem: &PlacementProblem, d: u32) -> Option<u64> {
    let per_step = u64::from(d) * u64::from(problem.micro_batch);
    if problem.global_batch.is_multiple_of(per_step) {
        Some(problem.global_batch / per_step)
    } else if problem.allow_uneven_batch {
        Some(problem.global_batch.div_ceil(per_step))
    } else {
        None
    }
}

/// Whether any layer has experts to divide.
fn has_experts(problem: &PlacementProblem) -> bool {
    problem
        .graphs
        .iter()
        .any(|g| g.layers.iter().any(|l| l.expert_params > 0))
}

/// The expert-parallel widths a layer of `experts` routed experts allows under the held
/// width `fixed` (none: any): the divisors of the expert count (a device holds whole experts),
/// or only `fixed` among them.
pub fn allowed_expert_widths(experts: u32, fixed: Option<u32>) -> Vec<u32> {
    (1..=experts)
        .filter(|&e| experts.is_multiple_of(e))
        .filter(|&e| fixed.is_none_or(|fixed| fixed == e))
        .collect()
}

/// The expert-parallel widths for `d` pipelines: those the expert count and the constraint
/// allow that divide `d` (only 1 without experts).
fn expert_widths(problem: &PlacementProblem, experts: bool, d: u32) -> Vec<u32> {
    if !experts {
        return match problem.constraints.ep {
            Some(e) if e > 1 => Vec::new(),
            _ => vec![1],
        };
    }
    allowed_expert_widths(problem.experts, problem.constraints.ep)
        .into_iter()
        .filter(|&e| d.is_multiple_of(e))
        .collect()
}

/// The (t, d) choices the constraints allow, and a line per choice rejected for a reason the
/// user can act on.
pub(crate) fn widths(problem: &PlacementProblem) -> (Vec<Ctx<'_>>, Vec<String>) {
    let mut ok = Vec::new();
    let mut rejected = Vec::new();
    let fixed = problem.constraints;
    let experts = has_experts(problem);
    for (graph_index, g) in problem.graphs.iter().enumerate() {
        let t = g.tp;
        if fixed.tp.is_some_and(|ft| ft != t) {
            continue;
        }
        if t > problem.devices {
            rejected.push(format!(
                "t={t}: more than the {} devices available",
                problem.devices
            ));
            continue;
        }
        let mut not_divisible = Vec::new();
        for d in 1..=problem.devices / t {
            if fixed.dp.is_some_and(|fd| fd != d)
                || problem
                    .only_data_parallel
                    .as_ref()
                    .is_some_and(|only| !only.contains(&d))
            {
                continue;
            }
            if !problem.allow_idle_devices && !problem.devices.is_multiple_of(t * d) {
                continue;
            }
            let Some(m) = micro_batches(problem, d) else {
                not_divisible.push(d.to_string());
                continue;
            };
            for e in expert_widths(problem, experts, d) {
                ok.push(Ctx {
                    problem,
                    graph_index,
                    t,
                    d,
                    m,
                    units: problem.devices / (t * d),
                    e,
                });
            }
        }
        if !not_divisible.is_empty() {
            rejected.push(format!(
                "t={t}: d ∈ {{{}}} rejected: global batch {} is not a multiple of d × micro-batch {}",
                not_divisible.join(", "),
                problem.global_batch,
                problem.micro_batch
            ));
        }
    }
    if let Some(e) = fixed.ep.filter(|&e| e > 1) {
        if !experts {
            rejected.push(format!("ep={e}: the model has no expert layers to divide"));
        } else if !problem.experts.is_multiple_of(e) {
            rejected.push(format!(
                "ep={e}: does not divide the {} experts of each expert layer (a device holds whole experts)",
                problem.experts
            ));
        } else if !ok.iter().any(|c| c.e == e) {
            rejected.push(format!(
                "ep={e}: no data-parallel width d that it divides is possible"
            ));
        }
    }
    if let Some(fd) = fixed.dp {
        if !ok.iter().any(|c| c.d == fd) && !problem.allow_idle_devices {
            rejected.push(format!(
                "d={fd}: t·d must divide the {} devices (idle devices not allowed)",
                problem.devices
            ));
        }
    }
    (ok, rejected)
}

/// One stage of a partition being turned into a plan.
pub(crate) struct PartStage {
    pub layers: Vec<usize>,
    pub metrics: StageMetrics,
    pub replicas: u32,
}

/// The first index with the largest value (`NaN`-free input).
fn argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

/// Turns a 1F1B or GPipe partition into a [`Plan`] (memory not checked); its time is what the
/// search minimises, computed by the same expressions.
pub(crate) fn build_plan(ctx: &Ctx, parts: &[PartStage]) -> Plan {
    let p = parts.len() as u32;
    let groups: u32 = parts.iter().map(|s| s.replicas).sum();
    let mut stages = Vec::with_capacity(parts.len());
    let mut rates = Vec::with_capacity(parts.len());
    let mut groups_to_end = groups;
    for part in parts {
        let k = part.replicas;
        let sm = &part.metrics;
        let ops = ctx.ops(sm, k);
        rates.push((ops, ctx.rate_s(&ops, k)));
        let in_flight = ctx.in_flight(k, groups_to_end);
        groups_to_end -= k;
        stages.push(Stage {
            layers: part.layers.clone(),
            devices: k * ctx.t,
            replicas: k,
            fwd_s: sm.fwd_s,
            bwd_s: sm.bwd_s,
            send_forward_s: ops.send_forward_s,
            send_backward_s: ops.send_backward_s,
            grad_accumulation_s: ops.accumulation_s,
            dp_group_forward_s: ops.dp_group_forward_s,
            dp_group_backward_s: ops.dp_group_backward_s,
            load_s: ops.forward_s + ops.backward_s,
            in_flight,
            kept_bytes: sm.stash_per_micro_batch,
            dp_comm_s: ctx.dp_comm_s(sm, k),
            dp_sync_s: ctx.dp_sync_s(sm, k),
            dp_hidden_s: ctx.dp_hidden_s(sm, k),
            optimizer_s: ctx.stage_optimizer_s(sm, k),
            grad_buffer_s: ctx.stage_grad_buffer_s(sm, k),
            memory: ctx.memory(sm, k, in_flight),
            chunks: Vec::new(),
        });
    }
    let first = argmax(rates.iter().map(|r| r.1 .0));
    let second = argmax(rates.iter().map(|r| r.1 .1));
    let rate_s = rates[first].1 .0 + rates[second].1 .1;
    let pipeline_s = ctx.slots(groups) * rate_s;
    // The steady state: m times the bottleneck's work per group (for GPipe its forward and
    // backward bottlenecks), split into compute and sends.
    let m = ctx.m as f64;
    let per_group = |i: usize| f64::from(stages[i].replicas);
    let pp_comm_s = match ctx.problem.schedule {
        PipelineSchedule::GPipe => {
            m * (rates[first].0.send_forward_s / per_group(first)
                + rates[second].0.send_backward_s / per_group(second))
        }
        PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved => {
            m * stages[first].send_s() / per_group(first)
        }
    };
    let dp_group_comm_s = match ctx.problem.schedule {
        PipelineSchedule::GPipe => {
            m * (rates[first].0.dp_group_forward_s / per_group(first)
                + rates[second].0.dp_group_backward_s / per_group(second))
        }
        PipelineSchedule::OneFOneB | PipelineSchedule::Interleaved => {
            m * stages[first].dp_group_s() / per_group(first)
        }
    };
    let compute_s = m * rate_s - pp_comm_s - dp_group_comm_s;
    let tail = argmax(stages.iter().map(Stage::tail_s));
    let tail_s = stages[tail].tail_s();
    let time_per_batch_s = pipeline_s + tail_s;
    Plan {
        tp: ctx.t,
        pp: p,
        dp: ctx.d,
        schedule: ctx.problem.schedule,
        zero: ctx.problem.zero,
        ep: ctx.e,
        layout: ctx.problem.layout,
        virtual_stages: 1,
        micro_batch: ctx.problem.micro_batch,
        micro_batches_per_pipeline: ctx.m,
        peak_memory_bytes: stages.iter().map(|s| s.memory.total).max().unwrap_or(0),
        devices_used: ctx.d * groups * ctx.t,
        time_split: TimeSplit {
            compute_s,
            bubble_s: pipeline_s - m * rate_s,
            pp_comm_s,
            dp_group_comm_s,
            dp_comm_s: stages[tail].dp_comm_s,
            optimizer_s: stages[tail].optimizer_s,
            grad_buffer_s: stages[tail].grad_buffer_s,
        },
        stages,
        time_per_batch_s,
        throughput_samples_per_s: ctx.problem.global_batch as f64 / time_per_batch_s,
    }
}

/// The stage with the largest memory and its overshoot over HBM (0 when it fits).
pub(crate) fn worst_stage(plan: &Plan, hbm_bytes: u64) -> (usize, u64) {
    let (i, total) = plan
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.memory.total))
        .fold((0, 0), |a, b| if b.1 > a.1 { b } else { a });
    (i, total.saturating_sub(hbm_bytes))
}

/// "stage 3 needs 91.2 GiB per device, HBM is 80.0 GiB: weights …".
pub(crate) fn memory_reason(plan: &Plan, stage: usize, hbm_bytes: u64) -> String {
    let m = &plan.stages[stage].memory;
    let (fewest, most) = plan.replica_range();
    format!(
        "{}: stage {stage} needs {:.1} GiB per device, HBM is {:.1} GiB: weights {:.1}, \
         grads {:.1}, optimizer {:.1}, activations {:.1}, stash {:.1} GiB",
        plan_line(plan.tp, plan.dp, plan.pp, &replica_range(fewest, most)),
        gib(m.total),
        gib(hbm_bytes),
        gib(m.weights),
        gib(m.grads),
        gib(m.optimizer),
        gib(m.activations),
        gib(m.stash)
    )
}

/// Evaluates a partition the user fixes: checks that it places every layer exactly once,
/// respects precedence, fits the devices, the 1F1B schedule's replica rule and the memory,
/// and prices it with the same model as [`super::place`].
pub fn evaluate_fixed(problem: &PlacementProblem, fixed: &FixedPlan) -> Result<Plan, Infeasible> {
    validate(problem).map_err(Infeasible::reason)?;
    if problem.schedule == PipelineSchedule::Interleaved {
        return Err(Infeasible::reason(
            "a fixed partition prices the 1f1b and gpipe schedules; an interleaved layout \
             follows from its widths: hold tp, pp, dp and virtual_stages and search"
                .into(),
        ));
    }
    let graph_index = problem
        .graphs
        .iter()
        .position(|g| g.tp == fixed.tp)
        .ok_or_else(|| Infeasible::reason(format!("no layer graph for t={}", fixed.tp)))?;
    let t = fixed.tp;
    let d = fixed.dp;
    let graph = &problem.graphs[graph_index];
    let n = graph.layers.len();
    if d == 0 || fixed.stages.is_empty() {
        return Err(Infeasible::reason(
            "a plan needs d ≥ 1 and at least one stage".into(),
        ));
    }
    let mut stage_of = vec![usize::MAX; n];
    for (si, stage) in fixed.stages.iter().enumerate() {
        if stage.devices == 0 || stage.devices % t != 0 {
            return Err(Infeasible::reason(format!(
                "stage {si}: {} devices is not a positive multiple of t={t}",
                stage.devices
            )));
        }
        if stage.layers.is_empty() {
            return Err(Infeasible::reason(format!("stage {si} holds no layer")));
        }
        for &l in &stage.layers {
            if l >= n || stage_of[l] != usize::MAX {
                return Err(Infeasible::reason(format!(
                    "stage {si}: layer {l} does not exist or is already placed"
                )));
            }
            stage_of[l] = si;
        }
    }
    if let Some(l) = stage_of.iter().position(|&s| s == usize::MAX) {
        return Err(Infeasible::reason(format!("layer {l} is in no stage")));
    }
    if let Some(&(from, to, _)) = graph
        .edges
        .iter()
        .find(|&&(from, to, _)| stage_of[from] > stage_of[to])
    {
        return Err(Infeasible::reason(format!(
            "edge {from} → {to} goes from stage {} back to stage {}",
            stage_of[from], stage_of[to]
        )));
    }
    let pipeline_devices: u32 = fixed.stages.iter().map(|s| s.devices).sum();
    let used = u64::from(d) * u64::from(pipeline_devices);
    if used > u64::from(problem.devices) {
        return Err(Infeasible::reason(format!(
            "the plan uses {used} devices, the cluster has {}",
            problem.devices
        )));
    }
    if !problem.allow_idle_devices && used != u64::from(problem.devices) {
        return Err(Infeasible::reason(format!(
            "the plan uses {used} of {} devices and idle devices are not allowed",
            problem.devices
        )));
    }
    if problem.schedule == PipelineSchedule::OneFOneB {
        let mut groups_to_end = 0;
        for (si, stage) in fixed.stages.iter().enumerate().rev() {
            let k = stage.devices / t;
            groups_to_end += k;
            if groups_to_end % k != 0 {
                return Err(Infeasible::reason(format!(
                    "stage {si}: {k} replicas do not divide the {groups_to_end} tensor groups \
                     from it to the pipeline's end, which the 1F1B schedule of replicated \
                     stages needs (see docs/pipeline.md)"
                )));
            }
        }
    }
    let Some(m) = micro_batches(problem, d) else {
        return Err(Infeasible::reason(format!(
            "global batch {} is not a multiple of d × micro-batch = {}",
            problem.global_batch,
            u64::from(d) * u64::from(problem.micro_batch)
        )));
    };
    let e = problem.constraints.ep.unwrap_or(1);
    if e > 1 && !has_experts(problem) {
        return Err(Infeasible::reason(format!(
            "expert-parallel width {e}: the model has no expert layers to divide"
        )));
    }
    if !d.is_multiple_of(e) {
        return Err(Infeasible::reason(format!(
            "expert-parallel width {e} does not divide the {d} data-parallel pipelines"
        )));
    }
    if !problem.experts.is_multiple_of(e) {
        return Err(Infeasible::reason(format!(
            "expert-parallel width {e} does not divide the {} experts of each expert layer (a \
             device holds whole experts)",
            problem.experts
        )));
    }
    if let Some(only) = problem
        .only_data_parallel
        .as_ref()
        .filter(|o| !o.contains(&d))
    {
        return Err(Infeasible::reason(format!(
            "the fixed plan's {d} data-parallel pipelines are not among only_data_parallel \
             {only:?}"
        )));
    }
    let ctx = Ctx {
        problem,
        graph_index,
        t,
        d,
        m,
        units: problem.devices / (t * d),
        e,
    };
    let preds = predecessors(n, &graph.edges);
    let mut dist = vec![0.0; n];
    let mut before = vec![false; n];
    let mut parts = Vec::with_capacity(fixed.stages.len());
    for stage in &fixed.stages {
        let mut in_stage = vec![false; n];
        let mut layers = stage.layers.clone();
        layers.sort_unstable();
        for &l in &layers {
            in_stage[l] = true;
        }
        let metrics = stage_metrics(problem, graph_index, &preds, &in_stage, &before, &mut dist);
        for &l in &layers {
            before[l] = true;
        }
        parts.push(PartStage {
            layers,
            metrics,
            replicas: stage.devices / t,
        });
    }
    let plan = build_plan(&ctx, &parts);
    let (worst, overshoot_bytes) = worst_stage(&plan, problem.hbm_bytes);
    if overshoot_bytes > 0 {
        return Err(Infeasible {
            reasons: vec![memory_reason(&plan, worst, problem.hbm_bytes)],
            alternatives: vec![Alternative {
                plan,
                worst_stage: worst,
                overshoot_bytes,
            }],
        });
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Tier;
    use crate::placement::{BytesPerParam, LayerCostGraph, TiedParams};
    use crate::workload::ActivationBytes;

    /// A chain of `n` layers with skip edges from `skip` layers back, uneven costs and two
    /// tied pairs.
    fn chain_problem(n: usize, skip: usize, mode: RecomputeMode) -> PlacementProblem {
        let mut layers = (0..n)
            .map(|i| LayerCost {
                name: format!("l{i}"),
                fwd_s: 0.1 + 0.37 * i as f64 % 1.3,
                bwd_s: 0.3 + 0.71 * i as f64 % 0.9,
                selective_recompute_s: 0.01 * i as f64,
                recompute_skipped_s: 0.0,
                params: 1000 + 17 * i as u64,
                activation_bytes: ActivationBytes {
                    none: 500 + (i as u64 * 97) % 400,
                    selective: 200 + i as u64,
                    full: 50,
                },
                output_bytes: 10,
                optimizer_step_s: 0.001 * i as f64,
                grad_accumulation_s: 0.0005 * i as f64,
                grad_buffer_s: 0.0002 * i as f64,
                replica_grad_sync_s: 0.0,
                expert_params: 0,
                all_to_all_bytes: 0,
                tied: None,
            })
            .collect::<Vec<_>>();
        // The last layer tied to the first (a head to the embeddings), one more pair inside.
        let tied = |owner: usize, params: u64| {
            Some(TiedParams {
                owner,
                params,
                optimizer_step_s: 0.0007 * params as f64 / 1000.0,
                grad_accumulation_s: 0.0003,
                grad_buffer_s: 0.00004,
                grad_sum_s: 0.00011 * params as f64 / 1000.0,
            })
        };
        layers[n - 1].tied = tied(0, 1000);
        layers[5].tied = tied(2, 300);
        let mut edges: Vec<(usize, usize, u64)> =
            (1..n).map(|j| (j - 1, j, 100 + j as u64)).collect();
        edges.extend((skip..n).map(|j| (j - skip, j, 7 * j as u64)));
        PlacementProblem {
            graphs: vec![LayerCostGraph {
                tp: 1,
                layers,
                edges,
                replicated_edges: false,
                repeated_layers: None,
            }],
            devices: 4,
            hbm_bytes: 1 << 30,
            global_batch: 8,
            micro_batch: 1,
            recompute: mode,
            bytes_per_param: BytesPerParam::ADAM_MIXED,
            zero: ZeroStage::Replicated,
            layout: Default::default(),
            schedule: PipelineSchedule::OneFOneB,
            tiers: vec![Tier {
                name: "all".into(),
                devices: 4,
                bandwidth_bytes_per_s: 1e9,
                latency_s: 1e-6,
            }],
            dp_overlap: false,
            p2p_overlap: false,
            overlap_efficiency: 1.0,
            constraints: Default::default(),
            allow_idle_devices: false,
            allow_uneven_batch: false,
            only_data_parallel: None,
            experts: 0,
        }
    }

    #[test]
    fn chain_metrics_equal_general_metrics_bit_for_bit() {
        for mode in [
            RecomputeMode::None,
            RecomputeMode::Selective,
            RecomputeMode::Full,
        ] {
            for skip in [2, 3] {
                let n = 9;
                let problem = chain_problem(n, skip, mode);
                let edges = &problem.graphs[0].edges;
                let preds = predecessors(n, edges);
                assert!(is_chain(&preds));
                let tables = ChainTables::new(&problem.graphs[0]);
                let mut dist = vec![0.0; n];
                for first in 0..n {
                    let fast = chain_stage_metrics(&problem, 0, &tables, first);
                    assert_eq!(fast.len(), n - first);
                    for (end, got) in (first + 1..=n).zip(fast) {
                        let in_stage: Vec<bool> = (0..n).map(|v| v >= first && v < end).collect();
                        let before: Vec<bool> = (0..n).map(|v| v < first).collect();
                        let want =
                            stage_metrics(&problem, 0, &preds, &in_stage, &before, &mut dist);
                        // `==` on the f64 fields: the same sums in the same order.
                        assert_eq!(got, want, "{mode:?} skip {skip}: stage {first}..{end}");
                    }
                }
            }
        }
    }

    #[test]
    fn skip_edge_alone_is_not_a_chain() {
        // 0 → 2 and 1 → 2: layer 1 has no edge from 0, so {1} is a downset and stages need
        // not be ranges.
        let preds = predecessors(3, &[(0, 2, 1), (1, 2, 1)]);
        assert!(!is_chain(&preds));
        assert!(is_chain(&predecessors(
            3,
            &[(0, 1, 1), (1, 2, 1), (0, 2, 1)]
        )));
    }
}
