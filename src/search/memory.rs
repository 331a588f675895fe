//! What fits in memory, for every chip of a sweep's space: per workload and (HBM,
//! micro-batch, recompute), the tensor widths some plan fits with, each with the
//! expert-parallel widths some plan of that width fits with and the fewest micro-batch passes
//! an iteration of such a plan keeps the cluster powered ([`powered_passes`]: the pipeline
//! bubble no plan of that width avoids).
//!
//! Memory follows the workload, the plan and the HBM capacity, never the chip's latencies, so
//! a few plan searches per combination and width (on the space's first configuration) settle
//! it for the whole space, once per sweep. Both the throughput screen's work bound and the
//! energy bound use it.

use super::sweep::{Sweep, SweepError};
use crate::cost::CostModel;
use crate::model::{throughput_bound, PlanBound, PlanOptions};
use crate::placement::{allowed_expert_widths, PipelineSchedule};
use rayon::prelude::*;

/// What fits in memory at one (HBM, micro-batch, recompute), for every chip of the space:
/// the tensor widths some plan fits with (none: no plan fits).
#[derive(Debug)]
pub(super) struct MemoryFit {
    pub widths: Vec<FittingWidth>,
}

impl MemoryFit {
    /// Whether some plan fits.
    pub fn any(&self) -> bool {
        !self.widths.is_empty()
    }

    /// Tensor width `tp`, where some plan of it fits.
    pub fn width(&self, tp: u32) -> Option<&FittingWidth> {
        self.widths.iter().find(|f| f.tp == tp)
    }
}

/// A tensor width some plan fits in memory with, at one (HBM, micro-batch, recompute).
#[derive(Debug)]
pub(super) struct FittingWidth {
    pub tp: u32,
    /// The expert-parallel widths some plan of this width fits with (`[1]` without experts).
    pub experts: Vec<u32>,
    /// The fewest micro-batch passes' worth of device-seconds an iteration keeps the
    /// devices of a plan of this width that fits powered ([`powered_passes`]).
    pub powered_passes: f64,
}

impl Sweep {
    /// What fits in memory for workload `w` at each (HBM, micro-batch, recompute), in point
    /// order; worked out on the first call.
    pub(super) fn memory_fits(&self, w: usize) -> Result<&[MemoryFit], SweepError> {
        if let Some(fits) = self.memory_fits.get() {
            return Ok(&fits[w]);
        }
        let fits = (0..self.workloads.len())
            .map(|w| self.compute_memory_fits(w))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(&self.memory_fits.get_or_init(|| fits)[w])
    }

    /// What fits in memory for workload `w` at (HBM, micro-batch, recompute) indices
    /// `[h, m, r]`.
    pub(super) fn memory_fit(
        &self,
        w: usize,
        [h, m, r]: [usize; 3],
    ) -> Result<&MemoryFit, SweepError> {
        self.memory_fits(w)?
            .get((h * self.micro_batches.len() + m) * self.recompute.len() + r)
            .ok_or_else(|| SweepError::Input("memory checks fewer than the points".into()))
    }

    /// What fits in memory at each (HBM, micro-batch, recompute), in point order: one plan
    /// search per tensor width and expert-parallel width (divisors of the expert count), and
    /// per width one per data-parallel width in order of rising powered passes until one fits.
    /// A search that fails counts as fitting (the evaluation reports why), which only lowers
    /// a bound.
    fn compute_memory_fits(&self, w: usize) -> Result<Vec<MemoryFit>, SweepError> {
        let workload = &self.workloads[w];
        let cost = CostModel::new(&self.config(0)?);
        let fits = |options: &PlanOptions| {
            !matches!(
                throughput_bound(workload, &cost, options, 0.0),
                Ok(PlanBound::NoPlanFits)
            )
        };
        let experts = workload.experts();
        let expert_widths: Vec<Option<u32>> = if experts == 0 {
            vec![None]
        } else {
            allowed_expert_widths(experts, self.fixed.ep)
                .into_iter()
                .map(Some)
                .collect()
        };
        let mut combinations = Vec::new();
        for &hbm in &self.hbm_bytes {
            for (m, &micro_batch) in self.micro_batches.iter().enumerate() {
                for &recompute in &self.recompute {
                    let options = self.plan_options(hbm, micro_batch, recompute);
                    let widths: Vec<u32> = self.layer_work[w][m].iter().map(|w| w.tp).collect();
                    combinations.push((options, widths));
                }
            }
        }
        Ok(combinations
            .par_iter()
            .map(|(options, widths)| {
                let mut fitting = Vec::new();
                for &t in widths {
                    let only = PlanOptions {
                        only_widths: Some(vec![t]),
                        ..options.clone()
                    };
                    let mut with = Vec::new();
                    for &e in &expert_widths {
                        let mut narrowed = only.clone();
                        narrowed.fixed.ep = e.or(narrowed.fixed.ep);
                        if fits(&narrowed) {
                            with.push(e.unwrap_or(1));
                        }
                    }
                    if with.is_empty() {
                        continue;
                    }
                    let powered_passes = powered_passes(&only, workload.global_batch, t, |d| {
                        fits(&PlanOptions {
                            only_data_parallel: Some(vec![d]),
                            ..only.clone()
                        })
                    });
                    fitting.push(FittingWidth {
                        tp: t,
                        experts: with,
                        powered_passes,
                    });
                }
                MemoryFit { widths: fitting }
            })
            .collect())
    }
}

/// The fewest micro-batch passes' worth of device-seconds that an iteration of a plan of
/// tensor width `t` under `options` (one micro-batch size) keeps its devices powered, over
/// the data-parallel widths `d` some plan fits with (`fits_with`).
///
/// A pass is one micro-batch through every layer on one tensor group, `W` seconds at least.
/// A 1F1B or GPipe plan that uses the whole cluster has `d` pipelines of `K = D/(t·d)` tensor
/// groups each, so its pipeline runs `m + K − 1` slots of at least `W/K` (the slowest stage's
/// share, `max (Fᵢ + Bᵢ)/kᵢ ≥ Σ(Fᵢ + Bᵢ)/Σkᵢ`): its `D` devices are powered at least
/// `D·(m + K − 1)·W/K = t·W·d·(m + K − 1)` device-seconds, `d·(m + K − 1)` passes of which
/// `d·m` do work and `d·(K − 1)` are the bubble. The least is at the largest `d` that fits
/// when the batch divides. Plans that may leave devices idle, and the interleaved schedule,
/// get only the batch's passes, `B / micro-batch`.
fn powered_passes(
    options: &PlanOptions,
    batch: u64,
    t: u32,
    fits_with: impl Fn(u32) -> bool,
) -> f64 {
    let micro_batch = options.micro_batches.first().copied().unwrap_or(1).max(1);
    let working = batch as f64 / f64::from(micro_batch);
    if options.idle_devices_allowed() || options.schedule == PipelineSchedule::Interleaved {
        return working;
    }
    let t = t.max(1);
    let mut shapes: Vec<(u64, u32)> = (1..=options.devices / t)
        .filter(|&d| options.devices.is_multiple_of(t * d))
        .filter(|&d| options.fixed.dp.is_none_or(|fixed| fixed == d))
        .filter_map(|d| {
            let per_step = u64::from(d) * u64::from(micro_batch);
            let m = if batch.is_multiple_of(per_step) {
                batch / per_step
            } else if options.allow_uneven_batch {
                batch.div_ceil(per_step)
            } else {
                return None;
            };
            let groups = u64::from(options.devices / (t * d));
            Some((u64::from(d) * (m + groups - 1), d))
        })
        .collect();
    shapes.sort_unstable();
    shapes
        .into_iter()
        .find(|&(_, d)| fits_with(d))
        .map_or(working, |(passes, _)| passes as f64)
}

#[cfg(test)]
mod tests {
    use super::powered_passes;
    use crate::model::PlanOptions;

    /// Hand-derived passes `d·(m + K − 1)`, `K = D/(t·d)`, at the best `d` that fits.
    #[test]
    fn powered_passes_count_the_bubble_of_the_widest_fitting_pipelines() {
        let options = |devices: u32, micro_batch: u32| PlanOptions {
            micro_batches: vec![micro_batch],
            ..PlanOptions::searching(devices)
        };
        let all = |_: u32| true;
        // 1024 devices, t = 4, batch 256 of micro-batch 8: d = 32 pipelines of one
        // micro-batch each over K = 8 groups: 32·(1 + 8 − 1) = 256 passes for 32 of work.
        assert_eq!(powered_passes(&options(1024, 8), 256, 4, all), 256.0);
        // Only d ≤ 8 fits: d = 8, m = 4, K = 32: 8·(4 + 31) = 280.
        assert_eq!(powered_passes(&options(1024, 8), 256, 4, |d| d <= 8), 280.0);
        // A batch of 100 does not divide by 8·d: no plan at all; allowed uneven, d = 16
        // pipelines of one micro-batch (m = ⌈100/128⌉ = 1, K = 1): 16 passes.
        assert_eq!(powered_passes(&options(16, 8), 100, 1, all), 12.5);
        let uneven = PlanOptions {
            allow_uneven_batch: true,
            ..options(16, 8)
        };
        assert_eq!(powered_passes(&uneven, 100, 1, all), 16.0);
        // d ≤ 4: d = 1 (13 + 15), 2 (2·(7 + 7)), 4 (4·(4 + 3)) all give 28.
        assert_eq!(powered_passes(&uneven, 100, 1, |d| d <= 4), 28.0);
        // t·d must divide the devices: t = 3 on 16 devices has no whole-cluster plan.
        assert_eq!(powered_passes(&options(16, 1), 64, 3, all), 64.0);
        // Idle devices allowed: only the batch's passes.
        let idle = PlanOptions {
            allow_idle_devices: true,
            ..options(1024, 8)
        };
        assert_eq!(powered_passes(&idle, 256, 4, all), 32.0);
    }
}
