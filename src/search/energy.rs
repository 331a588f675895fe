//! Energy sweeps that prune (`--objective energy`, one workload): a branch and bound on
//! joules per sample, exact at every area.
//!
//! A point's energy per sample (that of its fastest plan: dynamic and static) has a lower
//! bound that needs no plan: every layer's forward, backward and recomputation with each
//! operator in its least-energy mode, on the `t` devices of its tensor group, per sample, plus
//! each layer's optimizer step once per iteration on those devices, plus the static power of
//! the device-seconds an iteration keeps powered (the powered passes of the pipeline shape
//! that fits with the fewest, [`powered_passes`](super::memory), times the work bound of one pass: no plan
//! of width `t` keeps its devices powered for less, bubble included), plus the expert layers'
//! four all-to-alls per micro-batch at the expert-parallel width `e` that spends least among
//! those some plan of width `t` fits in memory with, at the tensor width `t` that spends least
//! among those some plan fits with ([`LayerBounds`](crate::model::LayerBounds)); what a plan
//! adds (pipeline sends, gradient synchronisation and accumulation, more optimizer steps, a
//! wider expert group, a slower stage) only raises it. No cheaper search knows which plan is
//! fastest, so only an exact evaluation says what a point spends.
//!
//! 1. **Bounds**: which tensor widths, and with them which expert-parallel widths and which
//!    data-parallel widths, some plan fits in memory with at each (HBM, micro-batch,
//!    recompute): memory follows the workload, the plan and the HBM capacity, never the
//!    chip's latencies, so a few plan searches per combination and width settle it for every
//!    configuration; then the lower bound of every point.
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

use super::memory::MemoryFit;
use super::row::{Outcome, Pruning, SpentBy};
use super::screen::{recompute_index, Staircase};
use super::status::StatusFile;
use super::sweep::{
    open_points, progress_bar, write_rows, Chip, ExactPoint, RunOptions, Sweep, SweepError,
    SweepStats, POINTS_CSV,
};
use super::DesignRow;
use crate::arch::{area_breakdown, ArchConfig};
use crate::cost::{collective_cost, static_power_w, CostModel};
use crate::workload::CollectiveKind;
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

/// One configuration's area and, per (HBM, micro-batch, recompute) in point order, the lower
/// bound on joules per sample (infinite where nothing fits).
struct ConfigBounds {
    area_mm2: f64,
    energy_j: Vec<f64>,
}

impl Sweep {
    /// Stage 1 for configuration `config` (the sweep's one workload), given what fits in
    /// memory at each (HBM, micro-batch, recompute) in point order.
    fn energy_bounds(&self, config: usize, fits: &[MemoryFit]) -> Result<ConfigBounds, SweepError> {
        let arch = self.config(config)?;
        let cost = CostModel::new(&arch);
        let static_w = static_power_w(&arch);
        let batch = self.workloads[0].global_batch as f64;
        let bounds = self.layer_bounds(0, &arch, &cost)?;
        let mut fit = fits.iter();
        let mut energy_j = Vec::with_capacity(fits.len());
        for _ in &self.hbm_bytes {
            for ((widths, work), &micro_batch) in bounds
                .iter()
                .zip(&self.layer_work[0])
                .zip(&self.micro_batches)
            {
                // Per sample: the micro-batch's share of its layers' events and of its
                // all-to-alls; the batch's of the static power of the device-seconds its
                // passes keep powered and of the steps.
                let per_sample = 1.0 / f64::from(micro_batch);
                for &recompute in &self.recompute {
                    let fit = fit.next().ok_or_else(|| {
                        SweepError::Input("memory checks fewer than the points".into())
                    })?;
                    let mut least = f64::INFINITY;
                    for (b, w) in widths.iter().zip(work) {
                        let Some(width) = fit.width(w.tp) else {
                            continue;
                        };
                        // Each all-to-all's energy is linear in its bytes, so the layers'
                        // sum prices all of them at once.
                        let all_to_all_j = width
                            .experts
                            .iter()
                            .map(|&e| {
                                4.0 * collective_cost(
                                    &arch,
                                    CollectiveKind::AllGather,
                                    b.all_to_all_bytes,
                                    e,
                                )
                                .energy_j
                            })
                            .fold(f64::INFINITY, f64::min);
                        let r = recompute_index(recompute);
                        let per_micro_batch_j = b.energy_j[r] + f64::from(width.tp) * all_to_all_j;
                        let static_j = static_w * b.busy_s[r] * width.powered_passes;
                        least = least.min(
                            per_micro_batch_j * per_sample
                                + (static_j + b.optimizer_energy_j) / batch,
                        );
                    }
                    energy_j.push(least);
                }
            }
        }
        Ok(ConfigBounds {
            area_mm2: area_breakdown(&arch).total_mm2,
            energy_j,
        })
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
    let fits = sweep.memory_fits(0)?;
    let memory_time_s = started.elapsed().as_secs_f64();
    let bounds: Vec<ConfigBounds> = (0..configs)
        .into_par_iter()
        .map(|c| {
            let b = sweep.energy_bounds(c, fits);
            bar.inc(1);
            b
        })
        .collect::<Result<_, _>>()?;
    bar.finish_and_clear();
    let screen_time_s = started.elapsed().as_secs_f64();
    let mut stats = SweepStats {
        configurations: configs,
        points: configs as u64 * per_config,
        skipped: done.len() as u64,
        screen_time_s,
        work_bound_time_s: screen_time_s - memory_time_s,
        plan_bound_time_s: memory_time_s,
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
    let fits_point = |id: u64| fits[(id % per_config) as usize].any();

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
            (bounds[config].energy_j[(id % per_config) as usize], id)
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
                    let fitting: Vec<u32> = fits[(id % per_config) as usize]
                        .widths
                        .iter()
                        .map(|w| w.tp)
                        .collect();
                    visited.push(Visit::Exact(
                        config,
                        sweep.unscreened_point(id, Some(fitting)),
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

#[cfg(test)]
mod tests {
    use super::super::memory::{FittingWidth, MemoryFit};
    use super::Sweep;
    use crate::placement::{RecomputeMode, ZeroStage};
    use crate::schedule::SolverOptions;
    use crate::search::sweep::Chip;
    use crate::search::{Objective, SweepRecord};
    use std::path::Path;

    /// A mixture-of-experts model (4 experts, top-2) on 8 devices over 8 chips of the PHAZE
    /// space, at HBM sizes where memory decides which widths and expert-parallel widths some
    /// plan fits with: every point's energy bound is at most what its exact evaluation spends,
    /// and the memory checks raise some bounds above the bound that lets every width and
    /// `e` = 1 (no all-to-all) through, with the batch's passes only.
    #[test]
    fn expert_bounds_are_lower_bounds_and_memory_raises_them() {
        let (checked, [memory, _]) = check_bounds(Path::new("tests/data/tiny-moe.toml"));
        assert!(checked > 0);
        assert!(memory > 0, "the memory checks raised no bound");
    }

    /// The same model with a global batch of 8 on 8 devices: at micro-batch 2 and t = 1 a
    /// whole-cluster plan idles at least half its slots, and the powered passes raise bounds
    /// above the bound with the same widths and the batch's passes only.
    #[test]
    fn bubble_bounds_are_lower_bounds_and_raise_them() {
        let dir = tempfile::tempdir().expect("scratch");
        let text = std::fs::read_to_string("tests/data/tiny-moe.toml").expect("tiny-moe.toml");
        let workload = dir.path().join("small-batch.toml");
        let text = text.replace("global_batch = 512", "global_batch = 8");
        std::fs::write(&workload, text).expect("write workload");
        let (checked, [_, bubble]) = check_bounds(&workload);
        assert!(checked > 0);
        assert!(bubble > 0, "the powered passes raised no bound");
    }

    /// Checks every point's energy bound against its exact evaluation over 8 chips of the
    /// PHAZE space on 8 devices; returns the points checked and how many bounds the memory
    /// checks, and the powered passes, raise.
    fn check_bounds(workload: &Path) -> (usize, [usize; 2]) {
        let dir = tempfile::tempdir().expect("scratch");
        let space = dir.path().join("space.toml");
        let text = std::fs::read_to_string("arch_specs/phaze.toml").expect("phaze.toml");
        let narrowed = [
            (
                "\"tensor.count\" = { min = 1, max = 4096 }",
                "\"tensor.count\" = { min = 2, max = 4 }",
            ),
            (
                "\"tensor.rows\" = { min = 2, max = 256 }",
                "\"tensor.rows\" = { min = 64, max = 128 }",
            ),
            (
                "\"tensor.cols\" = { min = 2, max = 256 }",
                "\"tensor.cols\" = { min = 128, max = 128 }",
            ),
            (
                "\"vector.count\" = { min = 1, max = 4096 }",
                "\"vector.count\" = { min = 2, max = 4 }",
            ),
            (
                "\"glb.bytes\" = { min = 2_097_152, max = 134_217_728 }",
                "\"glb.bytes\" = { min = 33_554_432, max = 33_554_432 }",
            ),
        ];
        let text = narrowed
            .iter()
            .fold(text, |t, (from, to)| t.replace(from, to));
        std::fs::write(&space, text).expect("write space");
        let solver = SolverOptions::default();
        let record = SweepRecord {
            tandem_version: "test".into(),
            workloads: vec![workload.to_path_buf()],
            space,
            devices: 8,
            micro_batches: vec![1, 2],
            recompute: vec![RecomputeMode::None, RecomputeMode::Full],
            hbm_bytes: vec![18 << 20, 40 << 20, 16 << 30],
            zero: vec![ZeroStage::Replicated],
            fixed: Default::default(),
            objective: Objective::Energy,
            prune: true,
            ilp_time_limit_s: solver.time_limit_s,
            ilp_node_limit: solver.node_limit,
            ilp_relative_gap: solver.relative_gap,
            search_node_limit: solver.search_node_limit,
            use_ilp: true,
            inputs_sha256: Vec::new(),
            max_peak_power_w: None,
            power_levels_w: Vec::new(),
        };
        let sweep = Sweep::from_record(&record).expect("valid sweep");
        let fits = sweep.memory_fits(0).expect("memory checks");
        let per_config = sweep.points_per_config() as usize;
        assert_eq!(fits.len(), per_config);
        let batch = sweep.workloads[0].global_batch as f64;
        let micro_batch = |i: usize| {
            f64::from(sweep.micro_batches[i / sweep.recompute.len() % sweep.micro_batches.len()])
        };
        // Every width fits, with no all-to-all and the batch's passes only.
        let free: Vec<MemoryFit> = (0..fits.len())
            .map(|i| MemoryFit {
                widths: sweep.layer_work[0][i / sweep.recompute.len() % sweep.micro_batches.len()]
                    .iter()
                    .map(|w| FittingWidth {
                        tp: w.tp,
                        experts: vec![1],
                        powered_passes: batch / micro_batch(i),
                    })
                    .collect(),
            })
            .collect();
        // What fits, with the batch's passes only.
        let no_bubble: Vec<MemoryFit> = fits
            .iter()
            .enumerate()
            .map(|(i, fit)| MemoryFit {
                widths: fit
                    .widths
                    .iter()
                    .map(|w| FittingWidth {
                        tp: w.tp,
                        experts: w.experts.clone(),
                        powered_passes: batch / micro_batch(i),
                    })
                    .collect(),
            })
            .collect();
        let (mut checked, mut raised) = (0, [0, 0]);
        for config in 0..sweep.space.len() {
            let bounds = sweep.energy_bounds(config, fits).expect("bounds");
            let loose = sweep.energy_bounds(config, &free).expect("bounds");
            let flat = sweep.energy_bounds(config, &no_bubble).expect("bounds");
            let chip = Chip::new(config, &sweep.config(config).expect("chip"), sweep.solver)
                .expect("chip");
            for (within, fit) in fits.iter().enumerate().filter(|(_, f)| f.any()) {
                let id = (config * per_config + within) as u64;
                let row = sweep.exact_row(&chip, &sweep.unscreened_point(id, None));
                let plan = row.plan().expect("a plan fits");
                let spent = plan.energy_per_sample_j;
                let bound = bounds.energy_j[within];
                assert!(
                    bound <= spent * (1.0 + 1e-9),
                    "point {id}: bound {bound} > {spent} J"
                );
                assert!(bound >= flat.energy_j[within] * (1.0 - 1e-12));
                assert!(flat.energy_j[within] >= loose.energy_j[within] * (1.0 - 1e-12));
                assert!(fit.widths.iter().any(|w| w.tp == plan.tp));
                checked += 1;
                raised[0] +=
                    usize::from(flat.energy_j[within] > loose.energy_j[within] * (1.0 + 1e-6));
                raised[1] += usize::from(bound > flat.energy_j[within] * (1.0 + 1e-6));
            }
        }
        assert!(sweep.space.len() >= 2);
        (checked, raised)
    }
}
