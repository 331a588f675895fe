//! The best parallel plan of one design point over the micro-batch sizes, recompute modes
//! and tensor widths asked for, and the figures users compare (`Evaluation`).

use super::layers::{layer_costs, LayerCosts};
use crate::arch::{ArchConfig, Tier};
use crate::cost::{static_power_w, CostModel};
use crate::error::InputError;
use crate::placement::{
    place_faster_than, Alternative, BytesPerParam, DeviceLayout, Fixed, Infeasible, LayerCostGraph,
    PipelineSchedule, PlacementProblem, Plan, RecomputeMode, ZeroStage,
};
use crate::schedule::{ScheduleCache, ScheduleError};
use crate::workload::{BytesPerModelParam, Workload};
use rayon::prelude::*;
use serde::Serialize;

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
    /// Only these data-parallel widths (replicas stay free, unlike `fixed.dp`); `None`: all.
    pub only_data_parallel: Option<Vec<u32>>,
    /// ZeRO stages the search chooses from.
    pub zero: Vec<ZeroStage>,
    /// How the plan's devices are numbered.
    pub layout: DeviceLayout,
    /// Overlap pipeline sends with the computation that sends them.
    pub p2p_overlap: bool,
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
            only_data_parallel: None,
            zero: vec![ZeroStage::Replicated],
            layout: DeviceLayout::PipelineMajor,
            p2p_overlap: false,
            dp_overlap: true,
            allow_idle_devices: false,
            allow_uneven_batch: false,
            progress: false,
        }
    }

    /// Whether a plan may leave devices idle: when asked, or when every width is held (the
    /// plan is fixed; devices beyond t·p·d stay idle).
    pub fn idle_devices_allowed(&self) -> bool {
        self.allow_idle_devices
            || (self.fixed.tp.is_some() && self.fixed.pp.is_some() && self.fixed.dp.is_some())
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
    /// Joules per sample: the dynamic energy of every event the plan runs
    /// ([`LayerCosts::dynamic_energy_per_sample_j`](super::LayerCosts::dynamic_energy_per_sample_j))
    /// plus `static_energy_per_sample_j`.
    pub energy_per_sample_j: f64,
    /// Static power (`cost::static_power_w`) of every device the plan uses, for the time per
    /// batch, over the global batch.
    pub static_energy_per_sample_j: f64,
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
                let problem = placement_problem(
                    workload,
                    arch,
                    options,
                    graphs,
                    micro_batch,
                    recompute,
                    zero,
                );
                // Only plans faster than the best so far matter: the bound prunes the search.
                let bound_s = best.as_ref().map_or(bound_s, |b| b.plan.time_per_batch_s);
                match place_faster_than(&problem, bound_s) {
                    Ok(Some(plan)) => {
                        let costs = per_width
                            .iter()
                            .find(|c| c.graph.tp == plan.tp)
                            .expect("a plan's tensor width is one of the graphs offered");
                        let energy = costs.dynamic_energy_per_sample_j(
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
                        format!("micro-batch {micro_batch}, recompute {recompute}"),
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

/// The placement problem of `graphs` (one per tensor width) under `options` on `arch`, at one
/// micro-batch, recompute mode and ZeRO stage.
pub(super) fn placement_problem(
    workload: &Workload,
    arch: &ArchConfig,
    options: &PlanOptions,
    graphs: Vec<LayerCostGraph>,
    micro_batch: u32,
    recompute: RecomputeMode,
    zero: ZeroStage,
) -> PlacementProblem {
    PlacementProblem {
        graphs,
        devices: options.devices,
        hbm_bytes: options.hbm_bytes.unwrap_or(arch.hbm.capacity_bytes),
        global_batch: workload.global_batch,
        micro_batch,
        recompute,
        bytes_per_param: workload.bytes_per_param().into(),
        zero,
        layout: options.layout,
        schedule: options.schedule,
        tiers: achieved_tiers(arch),
        dp_overlap: options.dp_overlap,
        p2p_overlap: options.p2p_overlap,
        overlap_efficiency: arch.efficiency.comm_overlap,
        constraints: options.fixed,
        allow_idle_devices: options.idle_devices_allowed(),
        allow_uneven_batch: options.allow_uneven_batch,
        only_data_parallel: options.only_data_parallel.clone(),
        experts: workload.experts(),
    }
}

fn summarise(
    workload: &Workload,
    arch: &ArchConfig,
    plan: Plan,
    recompute: RecomputeMode,
    sequence_parallel: bool,
    hbm_bytes: u64,
    dynamic_energy_per_sample_j: f64,
) -> Evaluation {
    let model_flops = workload.model_flops_per_iteration();
    let device_seconds = plan.time_per_batch_s * f64::from(plan.devices_used);
    let model_flops_per_s_per_device = model_flops / device_seconds;
    let static_energy_per_sample_j =
        static_power_w(arch) * device_seconds / workload.global_batch as f64;
    Evaluation {
        workload: workload.name.clone(),
        arch: arch.name.clone(),
        throughput_tokens_per_s: plan.throughput_samples_per_s
            * workload.tokens_per_sample() as f64,
        mfu: model_flops_per_s_per_device / arch.peak_tensor_flops(),
        model_flops_per_iteration: model_flops,
        model_flops_per_s_per_device,
        energy_per_sample_j: dynamic_energy_per_sample_j + static_energy_per_sample_j,
        static_energy_per_sample_j,
        plan,
        recompute,
        sequence_parallel,
        hbm_bytes,
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

/// The workload's bytes per parameter, as the placement (which knows no workload) takes them.
impl From<BytesPerModelParam> for BytesPerParam {
    fn from(bytes: BytesPerModelParam) -> BytesPerParam {
        BytesPerParam {
            weights: bytes.weights,
            grads: bytes.grads,
            optimizer: bytes.optimizer,
        }
    }
}
