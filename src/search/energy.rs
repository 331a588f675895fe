//! Energy sweeps that prune (`--objective energy`, one workload): a branch and bound on
//! joules per sample, exact at every area.
//!
//! A point's energy per sample (that of its fastest plan: dynamic and static) has a plan-free
//! lower bound: every layer's forward, backward and recomputation with each operator in its
//! least-energy mode, on the `t` devices of its tensor group, per sample, plus each dense
//! layer's optimizer step once per iteration on those devices, plus the static power of the
//! device-seconds the work bound says a sample keeps busy (no plan uses fewer), at the tensor
//! width that spends least
//! ([`LayerBounds`](crate::model::LayerBounds)); what a plan
//! adds (pipeline sends, gradient synchronisation and accumulation, more optimizer steps,
//! all-to-alls) only raises it. No cheaper
//! search knows which plan is fastest, so only an exact evaluation says what a point spends.
//!
//! 1. **Bounds**: the lower bound of every point (it depends on neither the HBM size nor the
//!    plan), and whether any plan fits in memory at each (HBM, micro-batch, recompute):
//!    memory follows the workload, the plan and the HBM capacity, never the chip's latencies,
//!    so one plan search per combination settles it for every configuration.
//! 2. **Branch and bound**: points are visited in order of rising bound (ties by id), in
//!    batches of [`BATCH`] points evaluated exactly in parallel. A staircase holds the least
//!    energy an evaluated point spends at each area; a point whose bound is above it at its
//!    area is pruned (some point of no larger area spends less), and after each batch its
//!    points join the staircase in visiting order. So the least-energy point under any area
//!    cap, and the (area, energy) front, are those of the unpruned sweep.
//!
//! Rows are appended after each batch in visiting order (the rows where no plan fits first, in
//! point order), so `points.csv` lists points in the order the sweep settled them. A resumed
//! sweep replays the finished rows in the order they were written, which rebuilds the
//! staircase the interrupted run had, and goes on from there.

use super::row::{Outcome, Pruning, SpentBy};
use super::screen::{recompute_index, Staircase};
use super::status::StatusFile;
use super::sweep::{
    open_points, progress_bar, write_rows, Chip, ExactPoint, RunOptions, Sweep, SweepError,
    SweepStats, POINTS_CSV,
};
use super::DesignRow;
use crate::arch::{area_breakdown, ArchConfig};
use crate::cost::{static_power_w, CostModel};
use crate::model::{throughput_bound, PlanBound};
use rayon::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// Exact points evaluated between two staircase updates. Fixed (not the thread count) so that
/// every machine prunes the same points.
const BATCH: usize = 32;

/// A bound prunes only when it is above the staircase by more than rounding: the bound and
/// the evaluation sum the same energies in different orders.
const SLACK: f64 = 1e-9;

/// Reason recorded for the points at an (HBM, micro-batch, recompute) where no plan fits.
const NO_PLAN_FITS: &str = "no plan fits in memory: every t, p, d and stage split runs out of HBM at this HBM size, micro-batch and recompute mode, on every chip of the space (`tandem plan` on this point shows by how much)";

/// Configurations whose decided rows are written together.
const CONFIGS_PER_WRITE: usize = 1024;

/// One configuration's area and, per (micro-batch, recompute) in sweep order, the lower bound
/// on joules per sample.
struct ConfigBounds {
    area_mm2: f64,
    energy_j: Vec<f64>,
}

impl Sweep {
    /// Stage 1 for configuration `config` (the sweep's one workload).
    fn energy_bounds(&self, config: usize) -> Result<ConfigBounds, SweepError> {
        let arch = self.config(config)?;
        let cost = CostModel::new(&arch);
        let static_w = static_power_w(&arch);
        let batch = self.workloads[0].global_batch as f64;
        let mut energy_j = Vec::with_capacity(self.micro_batches.len() * self.recompute.len());
        let bounds = self.layer_bounds(0, &arch, &cost)?;
        for (widths, &micro_batch) in bounds.iter().zip(&self.micro_batches) {
            // Per sample: the micro-batch's share of its layers' events and of the static
            // power of the device-seconds they keep busy, and the batch's of the steps.
            let per_sample = 1.0 / f64::from(micro_batch);
            let mut least = [f64::INFINITY; 3];
            for b in widths {
                let step_j = b.optimizer_energy_j / batch;
                for ((l, e), s) in least.iter_mut().zip(b.energy_j).zip(b.busy_s) {
                    *l = l.min((e + static_w * s) * per_sample + step_j);
                }
            }
            for &recompute in &self.recompute {
                energy_j.push(least[recompute_index(recompute)]);
            }
        }
        Ok(ConfigBounds {
            area_mm2: area_breakdown(&arch).total_mm2,
            energy_j,
        })
    }

    /// Whether some plan fits in memory at each (HBM, micro-batch, recompute), in point
    /// order; `true` where the search failed (the evaluation reports why).
    fn plans_fit(&self) -> Result<Vec<bool>, SweepError> {
        let cost = CostModel::new(&self.config(0)?);
        let mut combinations = Vec::new();
        for &hbm in &self.hbm_bytes {
            for &micro_batch in &self.micro_batches {
                for &recompute in &self.recompute {
                    combinations.push(self.plan_options(hbm, micro_batch, recompute));
                }
            }
        }
        Ok(combinations
            .par_iter()
            .map(|options| {
                !matches!(
                    throughput_bound(&self.workloads[0], &cost, options, 0.0),
                    Ok(PlanBound::NoPlanFits)
                )
            })
            .collect())
    }
}

/// Runs a pruned energy sweep into `options.out_dir`, after the rows `finished` (in the order
/// an interrupted run wrote them).
pub(super) fn run(
    sweep: &Sweep,
    options: &RunOptions,
    finished: &[DesignRow],
    status: &mut Option<StatusFile>,
) -> Result<SweepStats, SweepError> {
    let out = &options.out_dir;
    let points_path = out.join(POINTS_CSV);
    let configs = sweep.space.len();
    let per_config = sweep.points_per_config();
    let per_hardware = sweep.points_per_hardware() as u64;
    let done: BTreeSet<u64> = finished.iter().filter_map(|r| r.point).collect();
    let status = status.insert(StatusFile::start(
        out,
        options.phase.name(),
        "points",
        configs as u64 * per_config,
        done.len() as u64,
    ));
    let started = Instant::now();
    let bar = progress_bar(
        options.progress,
        configs as u64,
        "bounding energy",
        "configurations",
    );
    let bounds: Vec<ConfigBounds> = (0..configs)
        .into_par_iter()
        .map(|c| {
            let b = sweep.energy_bounds(c);
            bar.inc(1);
            b
        })
        .collect::<Result<_, _>>()?;
    bar.finish_and_clear();
    let work_bound_time_s = started.elapsed().as_secs_f64();
    let fits = sweep.plans_fit()?;
    let screen_time_s = started.elapsed().as_secs_f64();
    let mut stats = SweepStats {
        configurations: configs,
        points: configs as u64 * per_config,
        skipped: done.len() as u64,
        screen_time_s,
        work_bound_time_s,
        plan_bound_time_s: screen_time_s - work_bound_time_s,
        plan_bounded: fits.len() as u64,
        ..SweepStats::default()
    };

    let (mut file, mut header_written) = open_points(&points_path)?;
    let bar = progress_bar(
        options.progress,
        stats.points - stats.skipped,
        "evaluating",
        "points",
    );
    let mut record = |rows: &[DesignRow], stats: &mut SweepStats| -> Result<(), SweepError> {
        stats.count(rows);
        write_rows(&mut file, &points_path, rows, !header_written)?;
        header_written |= !rows.is_empty();
        bar.inc(rows.len() as u64);
        status.progress(stats.skipped + stats.ok + stats.infeasible + stats.pruned);
        Ok(())
    };
    let fits_point = |id: u64| fits[(id % per_config) as usize];

    // Points where no plan fits are decided at once, in point order.
    for chunk in (0..configs)
        .collect::<Vec<usize>>()
        .chunks(CONFIGS_PER_WRITE)
    {
        let rows: Vec<DesignRow> = chunk
            .par_iter()
            .map(|&c| {
                let arch = sweep.config(c)?;
                let first = c as u64 * per_config;
                Ok((first..first + per_config)
                    .filter(|&id| !fits_point(id) && !done.contains(&id))
                    .map(|id| {
                        let mut row = point_row(
                            sweep,
                            &arch,
                            id,
                            Outcome::Infeasible {
                                reason: NO_PLAN_FITS.into(),
                            },
                        );
                        row.config = Some(c as u64);
                        row
                    })
                    .collect::<Vec<_>>())
            })
            .collect::<Result<Vec<_>, SweepError>>()?
            .into_iter()
            .flatten()
            .collect();
        record(&rows, &mut stats)?;
    }

    // Every point some plan fits, finished or not, in visiting order: a resumed sweep walks
    // the same batches, taking finished points' rows from the file.
    let mut candidates: Vec<(f64, u64)> = (0..configs as u64 * per_config)
        .filter(|&id| fits_point(id))
        .map(|id| {
            let config = (id / per_config) as usize;
            let within = (id % per_hardware) as usize;
            (bounds[config].energy_j[within], id)
        })
        .collect();
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let finished: BTreeMap<u64, &DesignRow> = finished
        .iter()
        .filter_map(|r| Some((r.point?, r)))
        .collect();
    // Exact points left per configuration, so a chip's memo is dropped after its last one.
    let mut left: BTreeMap<usize, usize> = BTreeMap::new();
    for &(_, id) in candidates.iter().filter(|(_, id)| !done.contains(id)) {
        *left.entry((id / per_config) as usize).or_default() += 1;
    }

    // Least energy at each area per power level, kept as staircases of its negation.
    let mut stairs = vec![Staircase::default(); sweep.lanes()];
    let mut chips: BTreeMap<usize, Chip> = BTreeMap::new();
    let mut next = 0;
    while next < candidates.len() {
        // Visiting order: pruned rows where met, exact points filling the batch.
        let mut visited: Vec<Visit> = Vec::new();
        let mut exact = 0;
        while next < candidates.len() && exact < BATCH {
            let (bound_j, id) = candidates[next];
            next += 1;
            let config = (id / per_config) as usize;
            if let Some(&row) = finished.get(&id) {
                exact += usize::from(!matches!(row.outcome, Outcome::Pruned(_)));
                visited.push(Visit::Finished(row));
                continue;
            }
            let area_mm2 = bounds[config].area_mm2;
            let beaten = stairs[sweep.lane(id as usize)]
                .best_up_to(area_mm2)
                .filter(|&(_, least, _)| bound_j.is_finite() && bound_j > -least * (1.0 + SLACK));
            match beaten {
                Some((area_mm2, least, by)) => {
                    let arch = sweep.config(config)?;
                    let mut row = point_row(
                        sweep,
                        &arch,
                        id,
                        Outcome::Pruned(Pruning::Energy {
                            bound_j,
                            beaten_by: SpentBy {
                                by,
                                energy_per_sample_j: -least,
                                area_mm2,
                            },
                        }),
                    );
                    row.config = Some(config as u64);
                    visited.push(Visit::Pruned(Box::new(row)));
                }
                None => {
                    if let std::collections::btree_map::Entry::Vacant(slot) = chips.entry(config) {
                        slot.insert(Chip::new(config, &sweep.config(config)?, sweep.solver)?);
                    }
                    let (_, _, h, m, r) = sweep.point_parts(id as usize);
                    visited.push(Visit::Exact(
                        config,
                        ExactPoint {
                            id,
                            workload: 0,
                            hbm: sweep.hbm_bytes[h],
                            micro_batch: sweep.micro_batches[m],
                            recompute: sweep.recompute[r],
                            achievable: None,
                            bound: None,
                        },
                    ));
                    exact += 1;
                }
            }
        }
        let rows: Vec<Option<DesignRow>> = visited
            .par_iter()
            .map(|v| match v {
                Visit::Finished(_) => None,
                Visit::Pruned(row) => Some((**row).clone()),
                Visit::Exact(config, point) => Some(sweep.exact_row(&chips[config], point)),
            })
            .collect();
        let mut fresh = Vec::with_capacity(rows.len());
        for (visit, row) in visited.iter().zip(rows) {
            let row = match (visit, row) {
                (Visit::Finished(row), _) => row,
                (_, Some(row)) => {
                    let config = row.config.unwrap_or(0) as usize;
                    if let Some(n) = left.get_mut(&config) {
                        *n -= 1;
                        if *n == 0 {
                            left.remove(&config);
                            chips.remove(&config);
                        }
                    }
                    fresh.push(row);
                    &fresh[fresh.len() - 1]
                }
                (_, None) => continue,
            };
            if let (Some(plan), Some(id)) = (row.plan(), row.point) {
                for lane in sweep.lanes_from(id as usize) {
                    stairs[lane].insert(row.area_mm2, -plan.energy_per_sample_j, id);
                }
            }
        }
        record(&fresh, &mut stats)?;
    }
    bar.finish_and_clear();
    status.done();
    stats.sweep_time_s = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// A point as a batch meets it.
enum Visit<'a> {
    /// Settled by the run a resume continues: its row as written.
    Finished(&'a DesignRow),
    Pruned(Box<DesignRow>),
    /// To evaluate exactly on its configuration's chip.
    Exact(usize, ExactPoint),
}

/// The row of point `id` on `arch` with `outcome` (its config left for the caller).
fn point_row(sweep: &Sweep, arch: &ArchConfig, id: u64, outcome: Outcome) -> DesignRow {
    let (_, w, h, m, r) = sweep.point_parts(id as usize);
    let mut row = DesignRow::new(
        &sweep.workloads[w].name,
        arch,
        Some(sweep.micro_batches[m]),
        Some(sweep.recompute[r]),
        sweep.hbm_bytes[h],
        outcome,
    );
    row.point = Some(id);
    row
}
