//! Upper bounds on a design point's throughput without the ILP: the same plan search on
//! per-layer schedule lower bounds with free communication (`throughput_bound`), and the work
//! bound of a workload's unique layers (`LayerWork`).

use super::evaluate::{placement_problem, tensor_widths};
use super::layers::{attention_core, kernels_in_turn, recompute_skipped, tied_use_costs};
use super::{EvaluateError, PlanOptions};
use crate::arch::Tier;
use crate::cost::CostModel;
use crate::error::InputError;
use crate::placement::{place_faster_than, LayerCost, LayerCostGraph};
use crate::schedule::{energy_lower_bound, lower_bound, ScheduleError, ScheduleProblem};
use crate::workload::{Layer, Workload};
use std::collections::BTreeMap;

/// Forward, backward and selective-recompute lower bounds of one layer of `workload` on
/// `cost`'s chip, as training launches their kernels, and what full recompute skips of the
/// forward's bound (the forward's bound less it bounds the rerun from below).
fn layer_bounds(
    workload: &Workload,
    layer: &Layer,
    cost: &CostModel,
) -> Result<[f64; 4], ScheduleError> {
    let fwd_problem = ScheduleProblem::from_op_graph(&layer.fwd, cost);
    let bwd_problem = ScheduleProblem::from_op_graph(&layer.bwd, cost);
    // Eager launch only adds to a pass, and monotonically in its GPU time.
    let efficiency = &cost.arch().efficiency;
    let fwd_gpu_s = lower_bound(&fwd_problem)?;
    let skipped_ops = workload.checkpoint.skipped_ops(&layer.fwd);
    Ok([
        efficiency.eager_pass_s(fwd_gpu_s, layer.fwd.launches()),
        efficiency.eager_pass_s(lower_bound(&bwd_problem)?, layer.bwd.launches()),
        attention_core(&layer.fwd, &fwd_problem, efficiency).0,
        recompute_skipped(
            &layer.fwd,
            &fwd_problem,
            efficiency,
            skipped_ops,
            fwd_gpu_s,
            0.0,
        )
        .0,
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
    let mut bounds: BTreeMap<&str, [f64; 7]> = BTreeMap::new();
    let mut layers = Vec::with_capacity(graph.layers.len());
    for layer in &graph.layers {
        let [fwd_s, bwd_s, selective_recompute_s, recompute_skipped_s, optimizer_step_s, grad_accumulation_s, grad_buffer_s] =
            match bounds.get(layer.signature.as_str()) {
                Some(&b) => b,
                None => {
                    let [f, b, s, skipped] = layer_bounds(workload, layer, cost)?;
                    let b = [
                        f,
                        b,
                        s,
                        skipped,
                        kernels_in_turn(cost, &workload.optimizer_step_ops(&layer.param_tensors)).0,
                        kernels_in_turn(
                            cost,
                            &workload.grad_accumulation_ops(&layer.param_tensors),
                        )
                        .0,
                        kernels_in_turn(cost, &workload.grad_buffer_ops(&layer.param_tensors)).0,
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
            recompute_skipped_s,
            params: layer.params,
            activation_bytes: layer.activation_bytes,
            output_bytes: layer.output_bytes,
            optimizer_step_s,
            grad_accumulation_s,
            grad_buffer_s,
            // Communication is free in the bound.
            replica_grad_sync_s: 0.0,
            expert_params: layer.expert_params,
            all_to_all_bytes: layer.all_to_all_bytes,
            // The copy's step and accumulation and a shared stage's gradient sum are the
            // plan's own (kernels in turn, exact).
            tied: layer
                .tied
                .as_ref()
                .map(|tied| tied_use_costs(workload, cost, tied).0),
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
/// layers sharing it: what [`LayerWork::bounds`] prices on each chip of a sweep, built once.
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

    /// What this micro-batch's layers cost `cost`'s chip at the least (see [`LayerBounds`]).
    pub fn bounds(
        &self,
        workload: &Workload,
        cost: &CostModel,
    ) -> Result<LayerBounds, ScheduleError> {
        // Per quantity: forward + backward, the forward of the layers full recompute reruns,
        // and selective recompute's attention core.
        let (mut busy, mut energy) = ([0.0; 3], [0.0; 3]);
        let mut optimizer_j = 0.0;
        let mut all_to_all_bytes = 0;
        for (count, layer) in &self.unique {
            let fwd_problem = ScheduleProblem::from_op_graph(&layer.fwd, cost);
            let bwd_problem = ScheduleProblem::from_op_graph(&layer.bwd, cost);
            let efficiency = &cost.arch().efficiency;
            let (selective_s, selective_j) = attention_core(&layer.fwd, &fwd_problem, efficiency);
            let fwd_gpu_s = lower_bound(&fwd_problem)?;
            let fwd_j = energy_lower_bound(&fwd_problem)?;
            let (skipped_s, skipped_j) = recompute_skipped(
                &layer.fwd,
                &fwd_problem,
                efficiency,
                workload.checkpoint.skipped_ops(&layer.fwd),
                fwd_gpu_s,
                fwd_j,
            );
            let times = [
                efficiency.eager_pass_s(fwd_gpu_s, layer.fwd.launches()),
                efficiency.eager_pass_s(lower_bound(&bwd_problem)?, layer.bwd.launches()),
                selective_s,
                skipped_s,
            ];
            let joules = [
                fwd_j,
                energy_lower_bound(&bwd_problem)?,
                selective_j,
                skipped_j,
            ];
            let n = *count as f64;
            let recomputed = layer.activation_bytes.recomputed_under_full();
            for (sum, [f, b, s, skipped]) in [(&mut busy, times), (&mut energy, joules)] {
                sum[0] += n * (f + b);
                if recomputed {
                    sum[1] += n * (f - skipped);
                }
                sum[2] += n * s;
            }
            optimizer_j +=
                n * kernels_in_turn(cost, &workload.optimizer_step_ops(&layer.param_tensors)).1;
            all_to_all_bytes += *count as u64 * layer.all_to_all_bytes;
        }
        let t = f64::from(self.tp);
        let per_mode = |[fwd_bwd, full, selective]: [f64; 3]| {
            [t * fwd_bwd, t * (fwd_bwd + selective), t * (fwd_bwd + full)]
        };
        Ok(LayerBounds {
            busy_s: per_mode(busy),
            energy_j: per_mode(energy),
            optimizer_energy_j: t * optimizer_j,
            all_to_all_bytes,
        })
    }
}

/// What one micro-batch's layers at one tensor width cost a chip at the least, which no plan
/// of that width beats ([`LayerWork::bounds`]). Per recompute mode (in
/// [`RecomputeMode`](crate::placement::RecomputeMode) order: none, selective, full):
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerBounds {
    /// Device-seconds the micro-batch keeps its tensor group busy: `t` devices times the
    /// summed schedule lower bounds of every layer's forward, backward and recomputation.
    pub busy_s: [f64; 3],
    /// Joules it costs the group: `t` times every layer's forward, backward and recomputation
    /// with each operator in its least-energy mode. What a plan adds (pipeline sends,
    /// gradient synchronisation and accumulation, all-to-alls) is left out.
    pub energy_j: [f64; 3],
    /// Joules of the optimizer steps per iteration: each layer's step once on each of the `t`
    /// devices (a plan steps every dense layer once per data-parallel copy, or once in all
    /// under ZeRO-1 and above; an expert layer's `d·k` copies each step their `1/e` of the
    /// experts, and `e` divides `d`, so no fewer than once either).
    pub optimizer_energy_j: f64,
    /// Bytes each device dispatches to the experts per micro-batch, summed over the expert
    /// layers: what each of a micro-batch's four all-to-alls moves over the expert-parallel
    /// group of a plan that divides the experts (none at `e` = 1).
    pub all_to_all_bytes: u64,
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

/// An upper bound on the samples/s [`evaluate`](super::evaluate) can find under `options`: the same plan search
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
    throughput_bound_after(workload, cost, options, threshold_samples_per_s, None).map(|r| r.0)
}

/// What a plan search under a time bound found at one HBM size, which settles the same search
/// at no more HBM (every plan that fits there fits here; latencies do not depend on HBM).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HbmOutcome {
    /// HBM per device the search ran with.
    pub hbm_bytes: u64,
    /// Only plans faster than this (seconds per batch) were searched for.
    pub bound_s: f64,
    /// The fastest plan under the bound: its seconds per batch, samples/s and largest
    /// per-device memory; `None` when no plan is under the bound.
    pub best: Option<(f64, f64, u64)>,
}

impl HbmOutcome {
    /// The same search at `hbm_bytes` under `bound_s`, where this outcome settles it: `Some`
    /// of the fastest plan's (seconds per batch, samples/s) or `None` when no plan is under
    /// the bound. Settled when the fastest plan also fits in `hbm_bytes` (no plan there is
    /// faster), or when no plan was under a bound at least as large.
    pub fn settles(&self, hbm_bytes: u64, bound_s: f64) -> Option<Option<(f64, f64)>> {
        if hbm_bytes > self.hbm_bytes {
            return None;
        }
        match self.best {
            Some((time_s, samples_per_s, peak_bytes)) if peak_bytes <= hbm_bytes => {
                Some((time_s < bound_s).then_some((time_s, samples_per_s)))
            }
            Some(_) => None,
            None => (bound_s <= self.bound_s).then_some(None),
        }
    }
}

/// [`throughput_bound`], settled by `known` (the same search at another HBM size, see
/// [`HbmOutcome::settles`]) where it can be; with the outcome at this HBM size (`None` when
/// there is no outcome to share: the search failed).
pub fn throughput_bound_after(
    workload: &Workload,
    cost: &CostModel,
    options: &PlanOptions,
    threshold_samples_per_s: f64,
    known: Option<&HbmOutcome>,
) -> Result<(PlanBound, Option<HbmOutcome>), EvaluateError> {
    let arch = cost.arch();
    let hbm_bytes = options.hbm_bytes.unwrap_or(arch.hbm.capacity_bytes);
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
    let result = |best: Option<(f64, f64, u64)>| {
        let outcome = HbmOutcome {
            hbm_bytes,
            bound_s: threshold_s,
            best,
        };
        let bound = match best {
            Some((best_s, _, _)) => PlanBound::AtMost(batch / best_s),
            None if threshold_samples_per_s > 0.0 => PlanBound::Below(batch / threshold_s),
            None => PlanBound::NoPlanFits,
        };
        (bound, Some(outcome))
    };
    if let Some(settled) = known.and_then(|k| k.settles(hbm_bytes, threshold_s)) {
        let peak = known.and_then(|k| k.best).map_or(0, |b| b.2);
        return Ok(result(settled.map(|(t, s)| (t, s, peak))));
    }
    let mut best: Option<(f64, f64, u64)> = None;
    let mut best_s = threshold_s;
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
                    zero,
                );
                problem.tiers = free_links.clone();
                // Free links leave a vanishing all-reduce; hiding it behind the backward pass
                // makes it exactly zero, so the search compares loads alone (see
                // `dp::walkable`).
                problem.dp_overlap = true;
                if let Ok(Some(plan)) = place_faster_than(&problem, best_s) {
                    best_s = plan.time_per_batch_s;
                    best = Some((
                        best_s,
                        plan.throughput_samples_per_s,
                        plan.peak_memory_bytes,
                    ));
                }
            }
        }
    }
    Ok(result(best))
}
