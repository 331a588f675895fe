//! Calibration and validation (docs/design.md §4, §8): fit a chip's efficiency parameters to
//! measured kernels, and report how far the model's predictions are from measurements.
//!
//! Kernel-level error is reported by two-fold cross-validation: within each kernel class the
//! shapes are split alternately into two halves, the model is fitted on one half and scored
//! on the other, then the halves swap. The chip file written at the end is fitted on all
//! shapes.
//!
//! Measurements come as CSVs (collect.py's schema and the LLMCompass A100 files). Besides the
//! fit: the hidden fraction of overlapped all-reduces (`comm_overlap`, from collect.py's overlap
//! rows); kernel, block and training-step errors (a block slice of t > 1 is its layer graph
//! `without_collectives`, as one GPU times it; a measured training step is planned with
//! t = p = d = 1 and its micro-batch); published-run validation with plans held (t, p, d,
//! recompute and sequence parallelism from the runs CSVs; micro-batch, all-reduce overlap and
//! schedule from a run-plans file such as `calibration/published_run_plans.csv`; throughput
//! counted with the publication's FLOP formula, or the iteration time where a run gives it).

mod composite;
mod layer_times;
mod measurements;
mod runs;

use composite::measured_precision;
pub use composite::{
    composite_latency, gpt_block_class_s, gpt_block_gemm_s, gpt_block_graphs, gpt_block_latency,
    gpt_step_gemm_s, gpt_step_latency, measured_class_launches, measured_class_s, measured_gemm_s,
    model_kernel_class,
};
pub use layer_times::{split_iterations, validate_layer_times, IterationSplit, LayerTimeError};
pub use measurements::{
    load_collected, load_measurement_dirs, load_measurements, profiled_kernel_class, BlockShape,
    CollectedRow, Measurement, OverlapPart, OverlapShape, PassProfile, Prelude, StepShape, Target,
    AFTER_GEMM, ATTENTION_CLASS, COLD, GEMM_CLASS, OTHER_CLASS,
};
pub use runs::{megatron_flops_per_iteration, validate_runs, RunError, RunPlans};

use crate::arch::{ArchConfig, Efficiency, PerVectorOp};
use crate::cost::{
    collective_cost, fit_efficiency, fit_in_pass, gemm_cost, predicted_latency_s, KernelClass,
    KernelSample,
};
use crate::error::InputError;
use crate::placement::exposed_after_overlap;
use crate::schedule::{ScheduleCache, ScheduleError, SolverOptions};
use crate::vocab::{Pass, VectorOp};
use crate::workload::{kernel_op, CollectiveKind, OpKind};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Predicted against measured for one measurement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelError {
    pub source: String,
    pub class: String,
    /// Shape in words, e.g. `gemm 1x8192x64x64` or `softmax 4096x32`.
    pub shape: String,
    pub measured_s: f64,
    pub predicted_s: f64,
    /// (predicted − measured) / measured.
    pub signed_error: f64,
    /// A single kernel's operands and results, once each: what stays in the chip's L2
    /// (`glb.bytes`) between calls of a replayed burst when it fits. Empty for blocks,
    /// iterations and overlap rows.
    pub working_set_bytes: Option<u64>,
}

/// A measured training iteration against the model, with the GPU's own share of it where the
/// iteration was profiled. An eager iteration is the GPU's kernels, the launch gap after each
/// (`efficiency.launch_gap_s`, fitted to single kernels) and any further waits of a GPU that
/// ran ahead of the host, which the model does not price.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepError {
    pub source: String,
    pub class: String,
    pub shape: String,
    pub measured_s: f64,
    /// The GPU time of the iteration's kernels (collect.py `--profile`).
    pub gpu_busy_s: Option<f64>,
    /// The kernels the profiled iteration launched.
    pub gpu_kernels: Option<u64>,
    /// gpu_busy_s + gpu_kernels · launch_gap_s: the iteration had the host kept the GPU fed.
    pub launched_s: Option<f64>,
    /// 1 − launched_s / measured_s: the share of the iteration the GPU waited for the host
    /// beyond the launch gaps.
    pub host_wait: Option<f64>,
    pub predicted_s: f64,
    /// (predicted − measured) / measured.
    pub signed_error: f64,
    /// (predicted − launched) / launched: the error of the model's own scope.
    pub launched_signed_error: Option<f64>,
}

/// A profiled block pass or training iteration split into its GEMM kernels and the rest,
/// each against the model's: the rest of an iteration is its other kernels and the launch gap
/// after every kernel, that of a block pass (validated as replayed) its other kernels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GemmSplit {
    pub source: String,
    pub class: String,
    pub shape: String,
    /// The profiled GEMM kernels' GPU time.
    pub gpu_gemm_s: f64,
    /// The model's GEMMs of the same pass or iteration.
    pub predicted_gemm_s: f64,
    /// (predicted − measured) / measured, of the GEMMs.
    pub gemm_signed_error: f64,
    /// The rest, measured: the other kernels (and, for an iteration, every launch gap).
    pub gpu_rest_s: f64,
    /// The rest of the model's pass or iteration.
    pub predicted_rest_s: f64,
    /// (predicted − measured) / measured, of the rest.
    pub rest_signed_error: f64,
    /// The GEMM kernels' share of the profiled GPU time.
    pub gemm_share: f64,
}

/// The training steps among `errors` (from [`kernel_errors`] over `measurements`), each with
/// its profiled GPU time and that time with a gap of `launch_gap_s` after each kernel.
pub fn step_errors(
    measurements: &[Measurement],
    errors: &[KernelError],
    launch_gap_s: f64,
) -> Vec<StepError> {
    let profiled: BTreeMap<&str, Option<&PassProfile>> = measurements
        .iter()
        .filter(|m| matches!(m.target, Target::Step(_)))
        .map(|m| (m.source.as_str(), m.profile.as_ref()))
        .collect();
    errors
        .iter()
        .filter_map(|e| {
            let profile = *profiled.get(e.source.as_str())?;
            let launched_s =
                profile.map(|p| p.gpu_busy_s() + p.gpu_kernels() as f64 * launch_gap_s);
            Some(StepError {
                source: e.source.clone(),
                class: e.class.clone(),
                shape: e.shape.clone(),
                measured_s: e.measured_s,
                gpu_busy_s: profile.map(PassProfile::gpu_busy_s),
                gpu_kernels: profile.map(PassProfile::gpu_kernels),
                launched_s,
                host_wait: launched_s.map(|l| 1.0 - l / e.measured_s),
                predicted_s: e.predicted_s,
                signed_error: e.signed_error,
                launched_signed_error: launched_s.map(|l| (e.predicted_s - l) / l),
            })
        })
        .collect()
}

/// The profiled block passes and training steps among `errors` (from [`kernel_errors`] over
/// `measurements`) that ran GEMM kernels, split into their GEMMs and the rest, each against
/// the model's: `predict_gemm` gives the model's GEMM time of a measurement (e.g.
/// [`measured_gemm_s`]), and an iteration's rest carries a gap of `launch_gap_s` after each of
/// its kernels, as the model's does.
pub fn gemm_splits(
    measurements: &[Measurement],
    errors: &[KernelError],
    launch_gap_s: f64,
    predict_gemm: impl Fn(&Measurement) -> Option<f64>,
) -> Vec<GemmSplit> {
    let profiled: BTreeMap<&str, &Measurement> = measurements
        .iter()
        .filter(|m| m.profile.as_ref().is_some_and(|p| p.gemm_busy_s() > 0.0))
        .map(|m| (m.source.as_str(), m))
        .collect();
    errors
        .iter()
        .filter_map(|e| {
            let m = *profiled.get(e.source.as_str())?;
            let profile = m.profile.as_ref()?;
            let gemm_busy_s = profile.gemm_busy_s();
            let predicted_gemm_s = predict_gemm(m)?;
            let gaps_s = match m.target {
                Target::Step(_) => profile.gpu_kernels() as f64 * launch_gap_s,
                _ => 0.0,
            };
            let gpu_busy_s = profile.gpu_busy_s();
            let gpu_rest_s = gpu_busy_s - gemm_busy_s + gaps_s;
            if gpu_rest_s <= 0.0 {
                return None;
            }
            let predicted_rest_s = e.predicted_s - predicted_gemm_s;
            Some(GemmSplit {
                source: e.source.clone(),
                class: e.class.clone(),
                shape: e.shape.clone(),
                gpu_gemm_s: gemm_busy_s,
                predicted_gemm_s,
                gemm_signed_error: (predicted_gemm_s - gemm_busy_s) / gemm_busy_s,
                gpu_rest_s,
                predicted_rest_s,
                rest_signed_error: (predicted_rest_s - gpu_rest_s) / gpu_rest_s,
                gemm_share: gemm_busy_s / gpu_busy_s,
            })
        })
        .collect()
}

/// One kernel class of a profiled block pass or training iteration against the model's
/// operators of that class ([`class_splits`]): GPU time, without launch gaps.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassSplit {
    pub source: String,
    /// The measurement's class: `block_fwd`, `block_bwd`, `train_step_full`, ….
    pub class: String,
    pub shape: String,
    /// [`profiled_kernel_class`] and [`model_kernel_class`]: `gemm`, a vector primitive's name,
    /// or `other` (profiled kernels no operator stands for).
    pub kernel_class: String,
    /// The profiled kernels of the class, summed (0 where only the model has the class).
    pub gpu_s: f64,
    /// The model's operators of the class, summed (0 where only the profile has it).
    pub predicted_s: f64,
    /// (predicted − measured) / measured; none where nothing of the class was profiled.
    pub signed_error: Option<f64>,
    /// The profiled kernels of the class.
    pub gpu_kernels: u64,
    /// The model's launches of the class (`predict_launches`; a multi-tensor kernel's share
    /// of a launch per layer makes it fractional).
    pub predicted_kernels: f64,
}

/// Every profiled block pass and training iteration among `measurements`, class by class:
/// its profiled kernels against the model's operators of the class (`predict_classes`, e.g.
/// [`measured_class_s`], and `predict_launches`, e.g. [`measured_class_launches`]), in the
/// measurements' order and then by class name.
pub fn class_splits(
    measurements: &[Measurement],
    predict_classes: impl Fn(&Measurement) -> Option<BTreeMap<&'static str, f64>>,
    predict_launches: impl Fn(&Measurement) -> Option<BTreeMap<&'static str, f64>>,
) -> Vec<ClassSplit> {
    let mut out = Vec::new();
    for m in measurements {
        let Some(profile) = m.profile.as_ref() else {
            continue;
        };
        let shape = match m.target {
            Target::Block { shape, .. } => shape.label(),
            Target::Step(step) => step.label(),
            _ => continue,
        };
        let (Some(predicted), Some(launches)) = (predict_classes(m), predict_launches(m)) else {
            continue;
        };
        let classes: BTreeSet<&str> = profile
            .class_s
            .keys()
            .chain(predicted.keys())
            .copied()
            .collect();
        for class in classes {
            let gpu_s = profile.class_s.get(class).copied().unwrap_or(0.0);
            let predicted_s = predicted.get(class).copied().unwrap_or(0.0);
            out.push(ClassSplit {
                source: m.source.clone(),
                class: m.class.clone(),
                shape: shape.clone(),
                kernel_class: class.to_string(),
                gpu_s,
                predicted_s,
                signed_error: (gpu_s > 0.0).then(|| (predicted_s - gpu_s) / gpu_s),
                gpu_kernels: profile.class_calls.get(class).copied().unwrap_or(0),
                predicted_kernels: launches.get(class).copied().unwrap_or(0.0),
            });
        }
    }
    out
}

/// One kernel class summed over the profiled passes of one kind (`block_fwd`, `block_bwd`,
/// `train_step_full`, …) of [`class_splits`]' rows.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassTotal {
    pub class: String,
    pub kernel_class: String,
    /// Passes that profiled or modelled the class.
    pub passes: usize,
    pub gpu_s: f64,
    pub predicted_s: f64,
    pub gpu_kernels: u64,
    pub predicted_kernels: f64,
}

impl ClassTotal {
    /// The model's error on the class's GPU time summed over the kind's passes, signed (> 0:
    /// slower than profiled); `None` for a class the model has no operator for (`other`) or
    /// that no profiled kernel ran.
    pub fn signed_error(&self) -> Option<f64> {
        (self.predicted_s > 0.0 && self.gpu_s > 0.0)
            .then(|| (self.predicted_s - self.gpu_s) / self.gpu_s)
    }
}

/// Per pass kind, the errors of its priced classes' totals ([`ClassTotal::signed_error`])
/// weighted by GPU time: Σ |predicted − profiled| / Σ profiled over those classes.
pub fn time_weighted_class_errors(totals: &[ClassTotal]) -> BTreeMap<&str, f64> {
    let mut sums: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for t in totals.iter().filter(|t| t.signed_error().is_some()) {
        let (off_s, gpu_s) = sums.entry(t.class.as_str()).or_default();
        *off_s += (t.predicted_s - t.gpu_s).abs();
        *gpu_s += t.gpu_s;
    }
    sums.into_iter()
        .map(|(kind, (off_s, gpu_s))| (kind, off_s / gpu_s))
        .collect()
}

/// [`ClassTotal`]s of `splits`, by pass kind, then kernel class.
pub fn class_totals(splits: &[ClassSplit]) -> Vec<ClassTotal> {
    let mut totals: BTreeMap<(&str, &str), ClassTotal> = BTreeMap::new();
    for s in splits {
        let total = totals
            .entry((&s.class, &s.kernel_class))
            .or_insert_with(|| ClassTotal {
                class: s.class.clone(),
                kernel_class: s.kernel_class.clone(),
                passes: 0,
                gpu_s: 0.0,
                predicted_s: 0.0,
                gpu_kernels: 0,
                predicted_kernels: 0.0,
            });
        total.passes += 1;
        total.gpu_s += s.gpu_s;
        total.predicted_s += s.predicted_s;
        total.gpu_kernels += s.gpu_kernels;
        total.predicted_kernels += s.predicted_kernels;
    }
    totals.into_values().collect()
}

/// Error statistics of one class of measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorSummary {
    pub class: String,
    pub count: usize,
    /// Mean of |relative error|.
    pub mean_abs_error: f64,
    pub max_abs_error: f64,
    /// Mean of the signed relative error (> 0: the model is slow, i.e. pessimistic).
    pub mean_signed_error: f64,
}

/// Per-class summaries (sorted by class), plus an `all` row when there are several classes.
pub fn summarise(errors: &[KernelError]) -> Vec<ErrorSummary> {
    summarise_errors(errors.iter().map(|e| (e.class.as_str(), e.signed_error)))
}

/// The same summaries from (class, signed relative error) pairs.
pub fn summarise_errors<'a>(errors: impl IntoIterator<Item = (&'a str, f64)>) -> Vec<ErrorSummary> {
    let mut by_class: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut all = Vec::new();
    for (class, error) in errors {
        by_class.entry(class).or_default().push(error);
        all.push(error);
    }
    let summary = |class: &str, values: &[f64]| ErrorSummary {
        class: class.to_string(),
        count: values.len(),
        mean_abs_error: values.iter().map(|v| v.abs()).sum::<f64>() / values.len() as f64,
        max_abs_error: values.iter().map(|v| v.abs()).fold(0.0, f64::max),
        mean_signed_error: values.iter().sum::<f64>() / values.len() as f64,
    };
    let mut out: Vec<ErrorSummary> = by_class
        .iter()
        .map(|(class, values)| summary(class, values))
        .collect();
    if by_class.len() > 1 {
        out.push(summary("all", &all));
    }
    out
}

/// `error` with its field prefixed by the CSV row it came from.
fn in_row(row: usize, error: InputError) -> InputError {
    match error {
        InputError::Invalid {
            file,
            field,
            reason,
        } => InputError::Invalid {
            file,
            field: format!("row {row}, {field}"),
            reason,
        },
        other => other,
    }
}

fn shape(kind: &OpKind) -> String {
    match *kind {
        OpKind::Gemm { batch, m, n, k } => format!("{batch}x{m}x{n}x{k}"),
        OpKind::Vector {
            elements, row_len, ..
        } => format!("{}x{row_len}", elements / row_len.max(1)),
        OpKind::Collective { bytes, group, .. } => format!("{bytes}B/{group}"),
        OpKind::Attention { shape: a, .. } => format!("{}x{}x{}", a.heads, a.seq_len, a.head_dim),
    }
}

/// Predicted against measured for every measurement; blocks and training steps are priced by
/// `predict_composite` (which needs the workload, scheduling and placement stages), or
/// skipped when it returns `None`.
pub fn kernel_errors(
    arch: &ArchConfig,
    measurements: &[Measurement],
    predict_composite: impl Fn(&Measurement) -> Option<f64>,
) -> Vec<KernelError> {
    // Single kernels as they were timed; blocks, steps and kernels replayed after a GEMM (at
    // the clock a training step's GEMMs leave) as training runs them.
    let isolated = arch.timed_in_isolation();
    measurements
        .iter()
        .filter_map(|m| {
            let (predicted_s, shape, working_set_bytes) = match m.target {
                Target::Op(kind)
                | Target::ForwardBackward(kind)
                | Target::Eager { kind, .. }
                | Target::InBlock(kind)
                | Target::AfterPrelude { kind, .. } => {
                    let sample = m.kernel_sample(kind);
                    let timed_as = match m.target {
                        Target::AfterPrelude {
                            prelude: Prelude::Gemm,
                            ..
                        } => arch,
                        _ => &isolated,
                    };
                    let gpu_s = predicted_latency_s(timed_as, &sample);
                    let op = kernel_op(kind, m.elem_bytes);
                    let working_set = op.bytes_read.saturating_add(op.bytes_written);
                    match m.target {
                        // A burst of eager calls is an eager pass of the call's kernels.
                        Target::Eager { launches, .. } => (
                            isolated.efficiency.eager_pass_s(gpu_s, f64::from(launches)),
                            shape(&kind),
                            Some(working_set),
                        ),
                        // Kernels amid a block's others: no replayed working set.
                        Target::InBlock(_) => (gpu_s, shape(&kind), None),
                        _ => (gpu_s, shape(&kind), Some(working_set)),
                    }
                }
                Target::Block { shape, .. } => (predict_composite(m)?, shape.label(), None),
                Target::Step(step) => (predict_composite(m)?, step.label(), None),
                Target::Overlap { part, shape } => (
                    predict_overlap(&isolated, part, shape, m.elem_bytes),
                    shape.label(),
                    None,
                ),
            };
            Some(KernelError {
                source: m.source.clone(),
                class: m.class.clone(),
                shape,
                measured_s: m.measured_s,
                predicted_s,
                signed_error: (predicted_s - m.measured_s) / m.measured_s,
                working_set_bytes,
            })
        })
        .collect()
}

/// The single kernels among `errors` whose working set fits in `l2_bytes` (`fits`) or does
/// not, summarised by class: a burst of calls replayed on the same buffers reads a working set
/// that fits from the L2, one that does not from HBM, which is what the model prices.
pub fn summarise_by_working_set(
    errors: &[KernelError],
    l2_bytes: u64,
    fits: bool,
) -> Vec<ErrorSummary> {
    summarise_errors(errors.iter().filter_map(|e| {
        let bytes = e.working_set_bytes?;
        ((bytes <= l2_bytes) == fits).then_some((e.class.as_str(), e.signed_error))
    }))
}

/// The GEMM stream's and the all-reduce's predicted latencies of an overlap measurement.
fn overlap_parts(arch: &ArchConfig, shape: OverlapShape, elem_bytes: u32) -> (f64, f64) {
    let gemm = gemm_cost(
        arch,
        1,
        shape.m,
        shape.n,
        shape.k,
        elem_bytes,
        arch.tensor.count,
    );
    let all_reduce = collective_cost(arch, CollectiveKind::AllReduce, shape.bytes, shape.group);
    (shape.gemms as f64 * gemm.latency_s, all_reduce.latency_s)
}

/// The model's latency for one timing of an overlap measurement: together, the computation
/// hides `efficiency.comm_overlap` of the all-reduce, up to the computation's length (as the
/// placement prices an overlapped gradient all-reduce).
fn predict_overlap(
    arch: &ArchConfig,
    part: OverlapPart,
    shape: OverlapShape,
    elem_bytes: u32,
) -> f64 {
    let (gemms_s, all_reduce_s) = overlap_parts(arch, shape, elem_bytes);
    match part {
        OverlapPart::Gemms => gemms_s,
        OverlapPart::AllReduce => all_reduce_s,
        OverlapPart::Both => {
            gemms_s + exposed_after_overlap(all_reduce_s, gemms_s, arch.efficiency.comm_overlap)
        }
    }
}

/// The hidden fraction of the measured overlaps, `(gemms + all-reduce − both) / min(gemms,
/// all-reduce)` from each shape's three timings (clamped to [0, 1]), and its median over the
/// shapes; `None` without overlap measurements.
fn fit_comm_overlap(measurements: &[Measurement]) -> Result<Option<(f64, usize)>, CalibrateError> {
    let mut timings: BTreeMap<OverlapShape, [Option<f64>; 3]> = BTreeMap::new();
    let mut first_source: BTreeMap<OverlapShape, &str> = BTreeMap::new();
    for m in measurements {
        if let Target::Overlap { part, shape } = m.target {
            timings.entry(shape).or_default()[part as usize] = Some(m.measured_s);
            first_source.entry(shape).or_insert(&m.source);
        }
    }
    let mut fractions = Vec::with_capacity(timings.len());
    for (shape, parts) in &timings {
        let [Some(gemms_s), Some(all_reduce_s), Some(both_s)] = *parts else {
            return Err(CalibrateError::IncompleteOverlap {
                row: first_source[shape].to_string(),
                shape: shape.label(),
            });
        };
        let hidden_s = gemms_s + all_reduce_s - both_s;
        fractions.push((hidden_s / gemms_s.min(all_reduce_s)).clamp(0.0, 1.0));
    }
    let count = fractions.len();
    Ok(median(fractions).map(|m| (m, count)))
}

/// The eager launch costs fitted from kernels timed both ways, each row per kernel it launches
/// (collect.py's `launches`; one where the file predates it): the host's dispatch interval,
/// the median time per launch of the eager rows that took over twice their graph-replayed time
/// (kernels the host launched slower than the GPU ran them), and the launch gap, from the
/// excess of an eager row over its graph-replayed twin among kernels of at least twice that
/// interval (which the host keeps fed). The eager rows come from a run of their own, whose
/// clock differs from the replays' by a per cent or so: an excess that grows with the kernel's
/// time is that difference, not a launch. So the excess is a line in the replayed time
/// (Theil–Sen: the median slope over pairs of kernels, then the median intercept, robust to a
/// stray row): the gap is its intercept, what every launch adds; `eager_drift` its slope.
/// `None` without such pairs of both kinds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LaunchFit {
    pub launch_gap_s: f64,
    pub host_dispatch_s: f64,
    /// How much slower, as a fraction of a kernel's time, the eager run ran its kernels than
    /// the replays did (the slope left out of the gap).
    pub eager_drift: f64,
    /// Pairs that set each value.
    pub gpu_bound_pairs: usize,
    pub host_bound_pairs: usize,
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[mid]
    } else {
        0.5 * (values[mid - 1] + values[mid])
    })
}

/// See [`LaunchFit`].
fn fit_launch(measurements: &[Measurement]) -> Option<LaunchFit> {
    // Looked up only, never iterated: the fit does not depend on the map's order. Eager
    // calls run as a warm replay does, so a replay after a prelude is no twin.
    let mut replayed: HashMap<(OpKind, u32), f64> = HashMap::new();
    for m in measurements {
        if let Target::Op(kind) = m.target {
            replayed.entry((kind, m.elem_bytes)).or_insert(m.measured_s);
        }
    }
    // (graph-replayed, eager) seconds per kernel launched of each operator timed both ways:
    // a call that launches n kernels is n launches of its mean kernel.
    let pairs: Vec<(f64, f64)> = measurements
        .iter()
        .filter_map(|m| match m.target {
            Target::Eager { kind, launches } => {
                let n = f64::from(launches);
                replayed
                    .get(&(kind, m.elem_bytes))
                    .map(|&graph_s| (graph_s / n, m.measured_s / n))
            }
            _ => None,
        })
        .collect();
    let host_bound: Vec<f64> = pairs
        .iter()
        .filter(|(graph_s, eager_s)| *eager_s > 2.0 * graph_s)
        .map(|&(_, eager_s)| eager_s)
        .collect();
    let host_bound_pairs = host_bound.len();
    let host_dispatch_s = median(host_bound)?;
    let excess: Vec<(f64, f64)> = pairs
        .iter()
        .filter(|(graph_s, _)| *graph_s >= 2.0 * host_dispatch_s)
        .map(|&(graph_s, eager_s)| (graph_s, eager_s - graph_s))
        .collect();
    let (gap_s, drift) = theil_sen(&excess)?;
    Some(LaunchFit {
        launch_gap_s: gap_s.max(0.0),
        host_dispatch_s,
        eager_drift: drift,
        gpu_bound_pairs: excess.len(),
        host_bound_pairs,
    })
}

/// The Theil–Sen line through `points` (x, y): the median slope over pairs of points of
/// distinct x (0 when there are none), then the median of y less that slope times x;
/// (intercept, slope). `None` without points.
fn theil_sen(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let slopes: Vec<f64> = points
        .iter()
        .enumerate()
        .flat_map(|(i, &(x0, y0))| {
            points[i + 1..]
                .iter()
                .filter(move |&&(x1, _)| x1 != x0)
                .map(move |&(x1, y1)| (y1 - y0) / (x1 - x0))
        })
        .collect();
    let slope = median(slopes).unwrap_or(0.0);
    let intercept = median(points.iter().map(|&(x, y)| y - slope * x).collect())?;
    Some((intercept, slope))
}

/// The measurements the efficiency fit uses: single operators (GEMMs, vector kernels,
/// collectives) and vector primitives' mean kernels in profiled block passes. Replays after a
/// prelude ([`Target::AfterPrelude`]) are validated, not fitted: a cold one's L2 was read away
/// and is clean, while a kernel in a training iteration, like a warm replay of one larger than
/// the L2, writes back the dirty results of the kernels before it; one after a GEMM measures a
/// clock, not the kernel.
fn fittable<'a>(
    measurements: impl IntoIterator<Item = &'a Measurement>,
) -> Vec<(&'a Measurement, KernelSample)> {
    measurements
        .into_iter()
        .filter_map(|m| match m.target {
            Target::Op(kind) | Target::InBlock(kind) | Target::ForwardBackward(kind) => {
                Some((m, m.kernel_sample(kind)))
            }
            _ => None,
        })
        .collect()
}

/// The suffix of the class of a primitive's mean kernel in the profiled block passes.
pub const IN_BLOCKS: &str = "_in_blocks";

/// `measurements` followed by the mean kernels of the primitives priced from their kernels in
/// the profiled block passes (classes `…_in_blocks`, see [`calibrate`]): what `validate` scores,
/// so its kernel table shows every class the fit takes.
pub fn with_in_block_kernels(
    measurements: Vec<Measurement>,
) -> Result<Vec<Measurement>, CalibrateError> {
    let in_block = in_block_measurements(&measurements)?;
    let mut all = measurements;
    all.extend(in_block);
    Ok(all)
}

/// Vector operators by kernel class ([`model_kernel_class`]): each one's primitive, pass and
/// elements.
type VectorOpsByClass = BTreeMap<&'static str, Vec<(VectorOp, Pass, u64)>>;

/// The model's vector operators of the measured block pass `m` (of `shape`, its backward if
/// `backward`).
fn block_vector_ops(
    m: &Measurement,
    shape: BlockShape,
    backward: bool,
) -> Result<VectorOpsByClass, CalibrateError> {
    let (_, graphs) = gpt_block_graphs(shape, measured_precision(m.elem_bytes)).map_err(|e| {
        CalibrateError::Block {
            row: m.source.clone(),
            reason: e.to_string(),
        }
    })?;
    let mut by_class = VectorOpsByClass::new();
    for op in &graphs[usize::from(backward)].ops {
        if let OpKind::Vector {
            op: primitive,
            pass,
            elements,
            ..
        } = op.kind
        {
            by_class
                .entry(model_kernel_class(&op.kind))
                .or_default()
                .push((primitive, pass, elements));
        }
    }
    Ok(by_class)
}

/// The primitive and pass of a class's operators when they all share one.
fn sole_primitive(ops: &[(VectorOp, Pass, u64)]) -> Option<(VectorOp, Pass)> {
    let &(primitive, pass, _) = ops.first()?;
    ops.iter()
        .all(|&(o, p, _)| (o, p) == (primitive, pass))
        .then_some((primitive, pass))
}

/// The mean kernels ([`Target::InBlock`]) of the vector primitives that no warm single-kernel row
/// times in their pass, in every profiled block pass: one per pass and kernel class whose
/// model operators are all of one primitive and whose profiled kernels number as many as
/// those operators (one kernel per operator, as PyTorch runs a bias gradient, a residual
/// add or the QKV gradients' stack). Their class is the primitive's name, `_bwd` for a
/// backward, and [`IN_BLOCKS`].
fn in_block_measurements(measurements: &[Measurement]) -> Result<Vec<Measurement>, CalibrateError> {
    let timed: BTreeSet<(VectorOp, Pass)> = measurements
        .iter()
        .filter_map(|m| match m.target {
            Target::Op(OpKind::Vector { op, pass, .. }) => Some((op, pass)),
            _ => None,
        })
        .collect();
    let mut found = Vec::new();
    for m in measurements {
        let (Target::Block { backward, shape }, Some(profile)) = (m.target, &m.profile) else {
            continue;
        };
        for (class, ops) in block_vector_ops(m, shape, backward)? {
            let (Some((primitive, pass)), Some(&total_s), Some(&calls)) = (
                sole_primitive(&ops),
                profile.class_s.get(class),
                profile.class_calls.get(class),
            ) else {
                continue;
            };
            if timed.contains(&(primitive, pass)) || calls != ops.len() as u64 {
                continue;
            }
            let elements: u64 = ops.iter().map(|&(_, _, n)| n).sum();
            let suffix = if pass == Pass::Backward { "_bwd" } else { "" };
            found.push(Measurement::new(
                format!("{} ({class} kernels)", m.source),
                format!("{}{suffix}{IN_BLOCKS}", primitive.name()),
                Target::InBlock(OpKind::Vector {
                    op: primitive,
                    elements: elements / calls,
                    row_len: 1,
                    pass,
                }),
                m.elem_bytes,
                total_s / calls as f64,
            ));
        }
    }
    Ok(found)
}

/// The clock of GEMMs as a training block runs them, relative to the single GEMMs the
/// efficiency fit used (`efficiency.sustained_clock`): the ratio at which the model's GEMM time
/// of the profiled block passes, summed, matches their GEMM kernels'. `None` without profiled
/// block passes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClockFit {
    pub sustained_clock: f64,
    /// Profiled block passes that set it.
    pub block_passes: usize,
    /// The most negative and most positive (predicted − measured) / measured of a pass's GEMM
    /// time at that clock.
    pub min_signed_error: f64,
    pub max_signed_error: f64,
}

/// The GEMM time the model gives a measured block pass at sustained clock `clock` on `arch`.
fn block_gemm_at(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    m: &Measurement,
    clock: f64,
) -> Option<f64> {
    let mut at = arch.clone();
    at.efficiency.sustained_clock = clock;
    measured_gemm_s(&at, cache, m)
}

/// The clock between a quarter and four times the kernels' at which the times `gemm_s(clock)`,
/// decreasing in the clock, sum to the measured times' sum (so the passes weigh by their
/// length, as in an iteration); by bisection.
fn clock_matching(measured_s: &[f64], gemm_s: impl Fn(f64) -> Option<Vec<f64>>) -> Option<f64> {
    let (mut low, mut high) = (0.25_f64, 4.0_f64);
    let total_s: f64 = measured_s.iter().sum();
    let log_ratio = |clock: f64| -> Option<f64> {
        let predicted_s: f64 = gemm_s(clock)?.iter().sum();
        Some((predicted_s / total_s).ln())
    };
    if log_ratio(low)? < 0.0 || log_ratio(high)? > 0.0 {
        return None;
    }
    for _ in 0..50 {
        let mid = (low * high).sqrt();
        if log_ratio(mid)? > 0.0 {
            low = mid;
        } else {
            high = mid;
        }
    }
    Some((low * high).sqrt())
}

/// See [`ClockFit`]: `arch` carries the fitted single-kernel efficiency.
fn fit_sustained_clock(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    measurements: &[Measurement],
) -> Result<Option<ClockFit>, CalibrateError> {
    let blocks: Vec<(&Measurement, f64)> = measurements
        .iter()
        .filter(|m| matches!(m.target, Target::Block { .. }))
        .filter_map(|m| Some((m, m.profile.as_ref()?.gemm_busy_s())))
        .filter(|(_, gemm_s)| *gemm_s > 0.0)
        .collect();
    if blocks.is_empty() {
        return Ok(None);
    }
    let measured: Vec<f64> = blocks.iter().map(|(_, s)| *s).collect();
    let gemm_s = |clock: f64| -> Option<Vec<f64>> {
        blocks
            .iter()
            .map(|(m, _)| block_gemm_at(arch, cache, m, clock))
            .collect()
    };
    let out_of_range = || CalibrateError::ClockOutOfRange {
        row: blocks[0].0.source.clone(),
    };
    let sustained_clock = clock_matching(&measured, gemm_s).ok_or_else(out_of_range)?;
    if sustained_clock * arch.efficiency.tensor_compute > 1.0 {
        return Err(out_of_range());
    }
    let errors: Vec<f64> = gemm_s(sustained_clock)
        .ok_or_else(out_of_range)?
        .iter()
        .zip(&measured)
        .map(|(p, m)| (p - m) / m)
        .collect();
    Ok(Some(ClockFit {
        sustained_clock,
        block_passes: blocks.len(),
        min_signed_error: errors.iter().copied().fold(f64::INFINITY, f64::min),
        max_signed_error: errors.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    }))
}

/// The rate of one vector primitive's kernels in the profiled block passes relative to the
/// model's single-kernel pricing ([`VectorRateFit`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrimitiveRate {
    pub op: VectorOp,
    pub pass: Pass,
    pub rate: f64,
    /// Profiled block passes with kernels of the primitive's class.
    pub block_passes: usize,
    /// The most negative and most positive (predicted − measured) / measured of a pass's
    /// kernels of the class at that rate.
    pub min_signed_error: f64,
    pub max_signed_error: f64,
}

/// The rates vector kernels hold in training (`efficiency.vector_sustained_rate` and the
/// per-primitive tables): for each primitive alone in its kernel class in a profiled block
/// pass, the model's time of that class at the single-kernel fit over the profiled kernels'
/// time, summed over the passes (so they weigh by their length, as in an iteration); `rate`,
/// the same over all of them, prices the primitives that no block pass runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VectorRateFit {
    pub rate: f64,
    pub primitives: Vec<PrimitiveRate>,
}

/// See [`VectorRateFit`]: `arch` carries the fitted single-kernel efficiency.
fn fit_vector_rates(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    measurements: &[Measurement],
) -> Result<Option<VectorRateFit>, CalibrateError> {
    // Rates 1, the rest as fitted (not `timed_in_isolation`: the GEMM clock moves no vector
    // operator, but it moves their spans' start and end times, and so their last digits).
    let mut arch = arch.clone();
    VectorRateFit {
        rate: 1.0,
        primitives: Vec::new(),
    }
    .apply(&mut arch.efficiency);
    let arch = &arch;
    // Per primitive and pass: each block pass's (model, profiled) time of its class.
    let mut by_primitive: BTreeMap<(VectorOp, Pass), Vec<(f64, f64)>> = BTreeMap::new();
    for m in measurements {
        let (Target::Block { backward, shape }, Some(profile)) = (m.target, &m.profile) else {
            continue;
        };
        let by_class = block_vector_ops(m, shape, backward)?;
        let model_s = measured_class_s(arch, cache, m).ok_or_else(|| CalibrateError::Block {
            row: m.source.clone(),
            reason: "the model cannot schedule it".into(),
        })?;
        for (class, ops) in by_class {
            let (Some(primitive), Some(&profiled_s), Some(&modelled_s)) = (
                sole_primitive(&ops),
                profile.class_s.get(class),
                model_s.get(class),
            ) else {
                continue;
            };
            if profiled_s > 0.0 && modelled_s > 0.0 {
                by_primitive
                    .entry(primitive)
                    .or_default()
                    .push((modelled_s, profiled_s));
            }
        }
    }
    if by_primitive.is_empty() {
        return Ok(None);
    }
    let ratio = |pairs: &mut dyn Iterator<Item = &(f64, f64)>| {
        let (model_s, profiled_s) = pairs.fold((0.0, 0.0), |(a, b), (m, p)| (a + m, b + p));
        model_s / profiled_s
    };
    let rate = ratio(&mut by_primitive.values().flatten());
    let primitives = by_primitive
        .iter()
        .map(|(&(op, pass), pairs)| {
            let rate = ratio(&mut pairs.iter());
            let errors = pairs.iter().map(|(m, p)| (m / rate - p) / p);
            PrimitiveRate {
                op,
                pass,
                rate,
                block_passes: pairs.len(),
                min_signed_error: errors.clone().fold(f64::INFINITY, f64::min),
                max_signed_error: errors.fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect();
    Ok(Some(VectorRateFit { rate, primitives }))
}

impl VectorRateFit {
    /// Sets `efficiency`'s training rates to these (and no others).
    pub fn apply(&self, efficiency: &mut Efficiency) {
        efficiency.vector_sustained_rate = self.rate;
        efficiency.vector_op_sustained_rate = PerVectorOp::default();
        efficiency.vector_op_backward_sustained_rate = PerVectorOp::default();
        for p in &self.primitives {
            let table = match p.pass {
                Pass::Forward => &mut efficiency.vector_op_sustained_rate,
                Pass::Backward => &mut efficiency.vector_op_backward_sustained_rate,
            };
            table.set(p.op, Some(p.rate));
        }
    }
}

/// Why calibration cannot run.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("no GEMM, vector-operator or collective measurements to fit (blocks and training steps are only validated)")]
    NothingToFit,
    #[error(
        "{row}: the overlap measurement {shape} needs all three timings (overlap_gemms, \
         overlap_all_reduce and overlap_both rows of the same shape)"
    )]
    IncompleteOverlap { row: String, shape: String },
    #[error(
        "{row} and the other profiled blocks: no training clock from a quarter of the fitted \
         kernels' up to the chip's peak (sustained_clock × tensor_compute = 1) prices their \
         GEMM kernels (are the profiles those of these blocks?)"
    )]
    ClockOutOfRange { row: String },
    #[error("{row}: cannot build the model's block for it: {reason}")]
    Block { row: String, reason: String },
    #[error("scheduling the profiled blocks: {0}")]
    Schedule(#[from] ScheduleError),
}

/// A fitted chip and the evidence for it.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// Fitted on all measurements.
    pub efficiency: Efficiency,
    /// Held-out errors of the two cross-validation folds, per measurement.
    pub held_out: Vec<KernelError>,
    /// Errors of the final fit on the data it was fitted to (for comparison only).
    pub in_sample: Vec<KernelError>,
    /// How many overlap measurements (shapes with all three timings) set
    /// `efficiency.comm_overlap`; 0 keeps the chip's value.
    pub overlaps: usize,
    /// How many collective measurements set `efficiency.link_bandwidth`; 0 keeps the chip's
    /// value.
    pub collectives: usize,
    /// The eager launch costs, where kernels were timed both ways; `None` keeps the chip's.
    pub launch: Option<LaunchFit>,
    /// The GEMMs' clock in the profiled block passes; `None` keeps the chip's.
    pub clock: Option<ClockFit>,
    /// The vector kernels' rates in the profiled block passes; `None` keeps the chip's.
    pub vector_rates: Option<VectorRateFit>,
    /// Each profiled block pass predicted with the training clock and rates fitted to the
    /// passes of the other half of the block shapes (the single kernels' fit as in
    /// `efficiency`); empty without profiled blocks.
    pub held_out_blocks: Vec<KernelError>,
}

/// Sets `arch`'s training clock and vector rates from the profiled block passes among
/// `measurements` (`arch` carries the single kernels' fit); each `None` keeps the chip's.
fn fit_training(
    arch: &mut ArchConfig,
    cache: &ScheduleCache,
    measurements: &[Measurement],
) -> Result<(Option<ClockFit>, Option<VectorRateFit>), CalibrateError> {
    let clock = fit_sustained_clock(arch, cache, measurements)?;
    if let Some(c) = clock {
        arch.efficiency.sustained_clock = c.sustained_clock;
    }
    let vector_rates = fit_vector_rates(arch, cache, measurements)?;
    if let Some(r) = &vector_rates {
        r.apply(&mut arch.efficiency);
    }
    Ok((clock, vector_rates))
}

/// See [`Calibration::held_out_blocks`]: block shapes alternate between the two halves in the
/// order they were measured, a shape's forward and backward together.
fn held_out_blocks(
    single_fit: &ArchConfig,
    cache: &ScheduleCache,
    measurements: &[Measurement],
) -> Result<Vec<KernelError>, CalibrateError> {
    let mut shapes: Vec<BlockShape> = Vec::new();
    let mut fold_of = Vec::new();
    for m in measurements {
        fold_of.push(match (m.target, &m.profile) {
            (Target::Block { shape, .. }, Some(_)) => {
                let index = shapes.iter().position(|s| *s == shape).unwrap_or_else(|| {
                    shapes.push(shape);
                    shapes.len() - 1
                });
                Some(index % 2)
            }
            _ => None,
        });
    }
    // Each half's passes are predicted by the fit to the other half's.
    let mut archs = Vec::new();
    for fold in 0..2 {
        let train: Vec<Measurement> = measurements
            .iter()
            .zip(&fold_of)
            .filter(|(_, f)| **f == Some(1 - fold))
            .map(|(m, _)| m.clone())
            .collect();
        let mut arch = single_fit.clone();
        fit_training(&mut arch, cache, &train)?;
        archs.push(arch);
    }
    Ok(measurements
        .iter()
        .zip(&fold_of)
        .filter_map(|(m, fold)| {
            let arch = &archs[(*fold)?];
            kernel_errors(arch, std::slice::from_ref(m), |m| {
                composite_latency(arch, cache, m)
            })
            .pop()
        })
        .collect())
}

/// Fits `arch`'s efficiency parameters to `measurements` and cross-validates the fit.
pub fn calibrate(
    arch: &ArchConfig,
    measurements: &[Measurement],
) -> Result<Calibration, CalibrateError> {
    let in_block = in_block_measurements(measurements)?;
    let usable = fittable(measurements.iter().chain(&in_block));
    if usable.is_empty() {
        return Err(CalibrateError::NothingToFit);
    }
    // Alternate shapes within each class between the folds, so both halves span the range.
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    let fold: Vec<usize> = usable
        .iter()
        .map(|(m, _)| {
            let count = seen.entry(&m.class).or_default();
            *count += 1;
            *count % 2
        })
        .collect();
    let overlap = fit_comm_overlap(measurements)?;
    let launch = fit_launch(measurements);
    let isolated = arch.timed_in_isolation();
    // Single kernels first; then the primitives seen only in the profiled blocks, each with
    // the shared parameters the single kernels set.
    let fit = |samples: &[&(&Measurement, KernelSample)]| {
        let of = |in_block: bool| -> Vec<KernelSample> {
            samples
                .iter()
                .filter(|(m, _)| matches!(m.target, Target::InBlock(_)) == in_block)
                .map(|(_, s)| *s)
                .collect()
        };
        let mut at = isolated.clone();
        at.efficiency = fit_efficiency(&isolated, &of(false));
        Efficiency {
            sustained_clock: arch.efficiency.sustained_clock,
            vector_sustained_rate: arch.efficiency.vector_sustained_rate,
            vector_op_sustained_rate: arch.efficiency.vector_op_sustained_rate,
            vector_op_backward_sustained_rate: arch.efficiency.vector_op_backward_sustained_rate,
            comm_overlap: overlap.map_or(arch.efficiency.comm_overlap, |(f, _)| f),
            launch_gap_s: launch.map_or(arch.efficiency.launch_gap_s, |l| l.launch_gap_s),
            host_dispatch_s: launch.map_or(arch.efficiency.host_dispatch_s, |l| l.host_dispatch_s),
            ..fit_in_pass(&at, &of(true))
        }
    };
    let mut held_out: Vec<Option<KernelError>> = vec![None; usable.len()];
    for test_fold in 0..2 {
        let train: Vec<&(&Measurement, KernelSample)> = usable
            .iter()
            .zip(&fold)
            .filter(|(_, &f)| f != test_fold)
            .map(|(u, _)| u)
            .collect();
        let mut fitted = arch.clone();
        fitted.efficiency = fit(&train);
        for (i, (m, _)) in usable.iter().enumerate() {
            if fold[i] == test_fold {
                held_out[i] = kernel_errors(&fitted, std::slice::from_ref(*m), |_| None).pop();
            }
        }
    }
    let held_out = held_out.into_iter().flatten().collect();
    let mut fitted = arch.clone();
    fitted.efficiency = fit(&usable.iter().collect::<Vec<_>>());
    let cache = ScheduleCache::new(SolverOptions::default())?;
    let single_fit = fitted.clone();
    let (clock, vector_rates) = fit_training(&mut fitted, &cache, measurements)?;
    let held_out_blocks = held_out_blocks(&single_fit, &cache, measurements)?;
    let used: Vec<Measurement> = usable.iter().map(|(m, _)| (*m).clone()).collect();
    let in_sample = kernel_errors(&fitted, &used, |_| None);
    Ok(Calibration {
        efficiency: fitted.efficiency,
        held_out,
        in_sample,
        overlaps: overlap.map_or(0, |(_, n)| n),
        launch,
        clock,
        vector_rates,
        held_out_blocks,
        collectives: usable
            .iter()
            .filter(|(_, s)| KernelClass::of(&s.kind) == KernelClass::Collective)
            .count(),
    })
}
