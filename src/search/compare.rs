//! Baselines against co-design (docs/design.md §8): per workload, each baseline chip with a
//! fixed Megatron-style plan and with the searched plan, the decoupled search (hardware chosen
//! first for one layer on one device, then planned) and the joint search, in one table.

use super::finish::reevaluate;
use super::{
    finish, read_points, run_sweep, DesignRow, Objective, Phase, RunOptions, Shard, SpaceMemo,
    Sweep, SweepError, SweepRecord,
};
use crate::arch::{area_breakdown, ArchConfig, SearchSpace};
use crate::cost::{peak_power_w, CostModel};
use crate::error::{parse_toml, read_input, InputError};
use crate::model::{evaluate, layer_costs, EvaluateError, Evaluation, LayerCosts, PlanOptions};
use crate::output::{write_atomic, DirLock};
use crate::placement::{Fixed, RecomputeMode, ZeroStage};
use crate::report;
use crate::report::markdown::{self, cell};
use crate::report::svg::{self, BarGroup};
use crate::schedule::{ScheduleCache, SolverOptions};
use crate::workload::Workload;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Fixed (t, p, d) per workload name, for one cluster size (`workloads/plans/phaze.toml`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaselinePlans {
    pub devices: u32,
    pub plans: BTreeMap<String, FixedWidths>,
}

/// One fixed plan: tensor, pipeline and data-parallel widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedWidths {
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
}

impl BaselinePlans {
    /// Reads and checks a plans file: every width positive, t·p·d within the devices.
    pub fn load(path: &Path) -> Result<BaselinePlans, InputError> {
        let plans: BaselinePlans = parse_toml(path, &read_input(path)?)?;
        if plans.devices == 0 {
            return Err(InputError::invalid(path, "devices", "must be positive"));
        }
        for (name, p) in &plans.plans {
            if p.tp == 0 || p.pp == 0 || p.dp == 0 {
                return Err(InputError::invalid(
                    path,
                    format!("plans.{name}"),
                    "tp, pp and dp must be positive",
                ));
            }
            let used = u64::from(p.tp) * u64::from(p.pp) * u64::from(p.dp);
            if used > u64::from(plans.devices) {
                return Err(InputError::invalid(
                    path,
                    format!("plans.{name}"),
                    format!("t·p·d = {used} exceeds the {} devices", plans.devices),
                ));
            }
        }
        Ok(plans)
    }
}

/// One row of a comparison table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    pub workload: String,
    /// `<chip> fixed plan`, `<chip> searched plan`, `decoupled`, `co-design`.
    pub row: String,
    pub chip: String,
    pub tensor_cores: u32,
    pub tensor_rows: u32,
    pub tensor_cols: u32,
    pub vector_cores: u32,
    pub glb_bytes: u64,
    pub hbm_bytes: u64,
    pub area_mm2: f64,
    /// Static power plus the dynamic power of the chip's densest kernel (`cost::peak_power`).
    pub peak_power_w: f64,
    /// Whether the chip (with this HBM size) is a point of the co-design sweep.
    pub in_space: bool,
    pub tp: Option<u32>,
    pub pp: Option<u32>,
    pub dp: Option<u32>,
    /// The fewest and the most replicas of a pipeline stage.
    pub stage_replicas_min: Option<u32>,
    pub stage_replicas_max: Option<u32>,
    pub micro_batch: Option<u32>,
    pub recompute: Option<RecomputeMode>,
    pub time_per_batch_s: Option<f64>,
    pub throughput_samples_per_s: Option<f64>,
    pub mfu: Option<f64>,
    pub energy_per_sample_j: Option<f64>,
    /// Samples/s over the first row's (over the first row with a plan when row 1 has none).
    pub speedup: Option<f64>,
    /// What the comparison's sweeps and choices maximise.
    pub objective: Objective,
    /// The row's value of the objective in its own unit ([`objective_value`]): samples/s,
    /// samples/s per mm² of template area, or J/sample.
    pub objective_value: Option<f64>,
    /// The objective relative to the speed-up's reference row, > 1 better ([`gain`]).
    pub gain: Option<f64>,
    /// Why there is no plan, or what to know about the row.
    pub note: String,
}

impl CompareRow {
    /// A row with the chip's fields filled and no plan yet.
    pub fn new(
        workload: &str,
        row: String,
        arch: &ArchConfig,
        hbm_bytes: u64,
        in_space: bool,
    ) -> Self {
        CompareRow {
            workload: workload.to_string(),
            row,
            chip: arch.name.clone(),
            tensor_cores: arch.tensor.count,
            tensor_rows: arch.tensor.rows,
            tensor_cols: arch.tensor.cols,
            vector_cores: arch.vector.count,
            glb_bytes: arch.glb.bytes,
            hbm_bytes,
            area_mm2: area_breakdown(arch).total_mm2,
            peak_power_w: peak_power_w(arch),
            in_space,
            tp: None,
            pp: None,
            dp: None,
            stage_replicas_min: None,
            stage_replicas_max: None,
            micro_batch: None,
            recompute: None,
            time_per_batch_s: None,
            throughput_samples_per_s: None,
            mfu: None,
            energy_per_sample_j: None,
            speedup: None,
            objective: Objective::Throughput,
            objective_value: None,
            gain: None,
            note: String::new(),
        }
    }

    fn with_outcome(mut self, outcome: Result<Evaluation, EvaluateError>) -> Self {
        match outcome {
            Ok(e) => {
                self.tp = Some(e.plan.tp);
                self.pp = Some(e.plan.pp);
                self.dp = Some(e.plan.dp);
                let (fewest, most) = e.plan.replica_range();
                self.stage_replicas_min = Some(fewest);
                self.stage_replicas_max = Some(most);
                self.micro_batch = Some(e.plan.micro_batch);
                self.recompute = Some(e.recompute);
                self.time_per_batch_s = Some(e.plan.time_per_batch_s);
                self.throughput_samples_per_s = Some(e.plan.throughput_samples_per_s);
                self.mfu = Some(e.mfu);
                self.energy_per_sample_j = Some(e.energy_per_sample_j);
            }
            Err(EvaluateError::Infeasible(why)) => {
                self.note = format!("infeasible: {}", why.reasons.join("; ")).replace('\n', " ");
            }
            Err(other) => self.note = format!("error: {other}").replace('\n', " "),
        }
        self
    }
}

/// What the comparison needs besides the workloads.
#[derive(Debug)]
pub struct Comparison {
    pub space_path: PathBuf,
    pub space: SearchSpace,
    pub baselines: Vec<ArchConfig>,
    pub plans: BaselinePlans,
    pub devices: u32,
    pub micro_batches: Vec<u32>,
    pub recompute: Vec<RecomputeMode>,
    /// HBM sizes of the co-design sweep and the decoupled chip.
    pub hbm_bytes: Vec<u64>,
    /// ZeRO stages the searched plans choose from (the fixed plan holds ZeRO-0, as
    /// Megatron-LM runs without its distributed optimizer).
    pub zero: Vec<ZeroStage>,
    pub solver: SolverOptions,
    /// What every sweep maximises, and what the rows' choices among HBM sizes and the
    /// iso-area and iso-power rows choose by.
    pub objective: Objective,
    /// Continue the co-design sweeps found in their directories (refused otherwise).
    pub resume: bool,
    /// Show each sweep's progress on stderr.
    pub progress: bool,
    /// What the comparison's sweeps and hardware-first rows share (one space: see
    /// [`SpaceMemo`]).
    pub space_memo: Arc<SpaceMemo>,
}

/// The objective's value of a row in its own unit: samples/s, samples/s per mm² of template
/// area, or J/sample (`None` without a plan).
pub fn objective_value(objective: Objective, row: &CompareRow) -> Option<f64> {
    let thr = row.throughput_samples_per_s?;
    Some(match objective {
        Objective::Throughput => thr,
        Objective::ThroughputPerArea => thr / row.area_mm2,
        Objective::Energy => row.energy_per_sample_j?,
    })
}

/// `value` relative to `reference` under `objective`, > 1 better everywhere: throughput and
/// throughput per area `value / reference`, energy `reference / value`.
pub fn gain(objective: Objective, value: f64, reference: f64) -> f64 {
    match objective {
        Objective::Throughput | Objective::ThroughputPerArea => value / reference,
        Objective::Energy => reference / value,
    }
}

/// An evaluation's score under `objective` on a chip of `area_mm2`, higher better (as
/// [`Objective::score`]); no plan scores −∞.
fn evaluation_score(
    objective: Objective,
    outcome: &Result<Evaluation, EvaluateError>,
    area_mm2: f64,
) -> f64 {
    outcome
        .as_ref()
        .map_or(f64::NEG_INFINITY, |e| match objective {
            Objective::Throughput => e.plan.throughput_samples_per_s,
            Objective::ThroughputPerArea => e.plan.throughput_samples_per_s / area_mm2,
            Objective::Energy => -e.energy_per_sample_j,
        })
}

/// `dir` with `.suffix` appended to its last component: the sibling sweeps of a co-design
/// sweep.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!("{name}.{suffix}"))
}

impl Comparison {
    /// The co-design sweep's directory for `workload` under `sweeps`: `<workload>` for
    /// throughput, `<workload>.<objective>` otherwise (so one output directory holds every
    /// objective's sweeps). Its sibling adds `.fixed-plan`.
    pub fn sweep_dir(&self, sweeps: &Path, workload: &str) -> PathBuf {
        match self.sweep_objective() {
            Objective::Throughput => sweeps.join(workload),
            other => sweeps.join(format!("{workload}.{other}")),
        }
    }

    /// The objective the comparison's sweeps record. Throughput per area reads the throughput
    /// sweeps: their points are the same (the screen prunes on throughput against area
    /// alike), and they hold the point of most samples/s per mm² under any area cap (a point
    /// strictly dominated in throughput at no larger area is also beaten per mm²); the
    /// objective then chooses among them.
    pub fn sweep_objective(&self) -> Objective {
        match self.objective {
            Objective::ThroughputPerArea => Objective::Throughput,
            other => other,
        }
    }

    fn options(&self, hbm_bytes: Option<u64>) -> PlanOptions {
        PlanOptions {
            hbm_bytes,
            micro_batches: self.micro_batches.clone(),
            recompute: self.recompute.clone(),
            zero: self.zero.clone(),
            ..PlanOptions::searching(self.devices)
        }
    }

    /// Row 1: the baseline with the workload's fixed plan (t, p, d held; micro-batch and
    /// recompute searched; idle devices allowed when t·p·d is below the cluster).
    pub fn fixed_plan_options(&self, fixed: FixedWidths) -> PlanOptions {
        let used = u64::from(fixed.tp) * u64::from(fixed.pp) * u64::from(fixed.dp);
        PlanOptions {
            fixed: Fixed {
                tp: Some(fixed.tp),
                pp: Some(fixed.pp),
                dp: Some(fixed.dp),
                virtual_stages: None,
                ep: None,
            },
            max_tp: fixed.tp,
            allow_idle_devices: used < u64::from(self.devices),
            zero: vec![ZeroStage::Replicated],
            ..self.options(None)
        }
    }

    /// The configuration of the space with the lowest forward + backward latency of the
    /// workload's most frequent layer on one device (t = 1, micro-batch 1; list schedules),
    /// ties to the lowest index.
    fn decoupled_choice(&self, workload: &Workload) -> Result<ArchConfig, EvaluateError> {
        self.lowest_latency_configuration(workload, "decoupled", 1, |costs| {
            costs
                .unique
                .iter()
                .max_by_key(|u| u.count)
                .map_or(f64::INFINITY, |u| u.fwd_s + u.bwd_s)
        })
    }

    /// Spotlight's hardware-first baseline (Sakhuja et al., HPCA 2023: hardware tuned for
    /// per-layer latency at a fixed software mapping): the configuration with the lowest
    /// forward + backward latency of one micro-batch through every layer of the model, each
    /// layer at the workload's fixed-plan tensor width (t = 1 without one) on one tensor group
    /// (micro-batch 1; list schedules), ties to the lowest index. The plan is searched after.
    fn hardware_first_choice(&self, workload: &Workload) -> Result<ArchConfig, EvaluateError> {
        let tp = self
            .plans
            .plans
            .get(&workload.name)
            .map_or(1, |widths| widths.tp);
        self.lowest_latency_configuration(workload, "hardware-first", tp, |costs| {
            costs.graph.layers.iter().map(|l| l.fwd_s + l.bwd_s).sum()
        })
    }

    /// The configuration of the space whose layer costs at width `tp` and micro-batch 1 (list
    /// schedules) give the lowest `latency_s`, ties to the lowest index: hardware chosen before
    /// any plan. Kept in the comparison's [`SpaceMemo`] under `rule` (it depends on the space,
    /// the workload and `tp` alone).
    fn lowest_latency_configuration(
        &self,
        workload: &Workload,
        rule: &'static str,
        tp: u32,
        latency_s: impl Fn(&LayerCosts) -> f64 + Sync,
    ) -> Result<ArchConfig, EvaluateError> {
        let heuristic = SolverOptions {
            use_ilp: false,
            ..self.solver
        };
        let best = self.space_memo.choice(&workload.name, rule, tp, || {
            let latencies: Vec<(f64, usize)> = (0..self.space.len())
                .into_par_iter()
                .map(|i| {
                    let arch = self.space.get(i).ok_or_else(|| {
                        InputError::invalid(
                            &self.space_path,
                            "configurations",
                            "index out of range",
                        )
                    })?;
                    let cache = ScheduleCache::new(heuristic)?;
                    let costs =
                        layer_costs(workload, &CostModel::new(&arch), &cache, tp, 1, false)?;
                    Ok((latency_s(&costs), i))
                })
                .collect::<Result<_, EvaluateError>>()?;
            Ok::<usize, EvaluateError>(
                latencies
                    .into_iter()
                    .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                    .map_or(0, |(_, i)| i),
            )
        })?;
        self.space.get(best).ok_or_else(|| {
            InputError::invalid(&self.space_path, "configurations", "the space is empty").into()
        })
    }

    /// The row of `chip` with its plan searched at each of the comparison's HBM sizes: the
    /// best by the objective (ties to the smaller HBM).
    fn best_over_hbm(
        &self,
        workload: &Workload,
        name: &str,
        chip: &ArchConfig,
        cache: &ScheduleCache,
    ) -> CompareRow {
        let best = self
            .hbm_bytes
            .iter()
            .map(|&hbm| {
                (
                    hbm,
                    evaluate(workload, chip, &self.options(Some(hbm)), cache),
                )
            })
            .max_by(|a, b| {
                let area = area_breakdown(chip).total_mm2;
                let score = |r| evaluation_score(self.objective, r, area);
                score(&a.1).total_cmp(&score(&b.1)).then(b.0.cmp(&a.0))
            });
        match best {
            Some((hbm, outcome)) => {
                CompareRow::new(&workload.name, name.into(), chip, hbm, true).with_outcome(outcome)
            }
            None => CompareRow::new(&workload.name, name.into(), chip, 0, true),
        }
    }

    /// A co-design sweep of the space into `dir` (resumed where it has run before), with the
    /// plan widths `fixed` held and only configurations of peak power at most
    /// `max_peak_power_w` (none: all), and its best point as a row named `name`.
    #[allow(clippy::too_many_arguments)]
    fn codesign_row(
        &self,
        workload: &Workload,
        workload_path: &Path,
        dir: &Path,
        name: &str,
        fixed: Fixed,
        power_levels_w: Vec<f64>,
        fallback_chip: &ArchConfig,
    ) -> Result<(CompareRow, Sweep), SweepError> {
        let record = SweepRecord {
            tandem_version: env!("CARGO_PKG_VERSION").to_string(),
            workloads: vec![workload_path.to_path_buf()],
            space: self.space_path.clone(),
            devices: self.devices,
            micro_batches: self.micro_batches.clone(),
            recompute: self.recompute.clone(),
            hbm_bytes: self.hbm_bytes.clone(),
            zero: if fixed == Fixed::default() {
                self.zero.clone()
            } else {
                vec![ZeroStage::Replicated]
            },
            fixed,
            objective: self.sweep_objective(),
            prune: true,
            ilp_time_limit_s: self.solver.time_limit_s,
            ilp_node_limit: self.solver.node_limit,
            ilp_relative_gap: self.solver.relative_gap,
            search_node_limit: self.solver.search_node_limit,
            use_ilp: self.solver.use_ilp,
            inputs_sha256: Vec::new(),
            max_peak_power_w: None,
            power_levels_w,
        };
        let mut sweep = Sweep::from_record(&record)?;
        sweep.share_memo(self.space_memo.clone());
        let resume = dir.join(super::RUN_TOML).exists();
        if resume && !self.resume {
            return Err(SweepError::Input(format!(
                "{} holds a sweep from an earlier comparison: pass --resume to continue it, or \
                 remove it to start afresh",
                dir.display()
            )));
        }
        let options = RunOptions {
            out_dir: dir.to_path_buf(),
            shard: Shard::WHOLE,
            resume,
            progress: self.progress,
            phase: Phase::Whole,
        };
        run_sweep(&sweep, &record, &options)?;
        let best = finish(&sweep, dir)?;
        if self.objective != self.sweep_objective() {
            let rows = read_points(&dir.join(super::POINTS_CSV))?;
            let row = self.iso_area_row(
                workload,
                &sweep,
                &rows,
                name.into(),
                f64::INFINITY,
                fallback_chip,
            )?;
            return Ok((row, sweep));
        }
        let row = match best.workloads.into_iter().next() {
            Some(b) => {
                let config = b.row.config.unwrap_or(0) as usize;
                let arch = sweep
                    .space
                    .get(config)
                    .unwrap_or_else(|| fallback_chip.clone());
                CompareRow::new(&workload.name, name.into(), &arch, b.row.hbm_bytes, true)
                    .with_outcome(Ok(b.evaluation))
            }
            None => {
                let mut row = CompareRow::new(&workload.name, name.into(), fallback_chip, 0, true);
                row.note = "no design point of the space fits".into();
                row
            }
        };
        Ok((row, sweep))
    }

    /// Co-design held to `area_mm2` (infinite: not held): the best point by the objective
    /// (ties to the lower point id) among the `ok` rows of the sweep in `dir` no larger than
    /// it. The sweep's pruning keeps every point that can be the best under any area cap (a
    /// pruned point's bound is below what a point of no larger area reaches), so filtering its
    /// rows is exact.
    fn iso_area_row(
        &self,
        workload: &Workload,
        sweep: &Sweep,
        rows: &[DesignRow],
        name: String,
        area_mm2: f64,
        fallback_chip: &ArchConfig,
    ) -> Result<CompareRow, SweepError> {
        let empty = if area_mm2.is_finite() {
            "no design point of the space fits in that area"
        } else {
            "no design point of the space fits"
        };
        self.best_row(
            workload,
            sweep,
            rows,
            name,
            |r| r.area_mm2 <= area_mm2,
            empty,
            fallback_chip,
        )
    }

    /// Co-design held to the peak power `max_peak_power_w` (watts): the best point by the
    /// objective among the sweep's `ok` rows whose configuration's peak power (§3) is at most
    /// it. Exact when the sweep kept that power as a level (`power_levels_w`): a point is then
    /// pruned only by one of no larger area at no higher level.
    fn iso_power_row(
        &self,
        workload: &Workload,
        sweep: &Sweep,
        rows: &[DesignRow],
        name: String,
        max_peak_power_w: f64,
        fallback_chip: &ArchConfig,
    ) -> Result<CompareRow, SweepError> {
        let mut power_w: BTreeMap<u64, f64> = BTreeMap::new();
        for config in rows
            .iter()
            .filter(|r| r.plan().is_some())
            .filter_map(|r| r.config)
        {
            if let std::collections::btree_map::Entry::Vacant(slot) = power_w.entry(config) {
                let arch = sweep.space.get(config as usize).ok_or_else(|| {
                    SweepError::Input(format!("configuration {config} is outside the space"))
                })?;
                slot.insert(peak_power_w(&arch));
            }
        }
        let under = |r: &DesignRow| {
            r.config
                .and_then(|c| power_w.get(&c))
                .is_some_and(|&w| w <= max_peak_power_w)
        };
        self.best_row(
            workload,
            sweep,
            rows,
            name,
            under,
            "no design point of the space fits under that power",
            fallback_chip,
        )
    }

    /// The best `ok` row of `rows` by the objective among those `keep` keeps (ties to the lower
    /// point id), evaluated again for its plan; a row noted `empty` when there is none.
    #[allow(clippy::too_many_arguments)]
    fn best_row(
        &self,
        workload: &Workload,
        sweep: &Sweep,
        rows: &[DesignRow],
        name: String,
        keep: impl Fn(&DesignRow) -> bool,
        empty: &str,
        fallback_chip: &ArchConfig,
    ) -> Result<CompareRow, SweepError> {
        let score = |r: &DesignRow| self.objective.score(r).unwrap_or(f64::NEG_INFINITY);
        let best = rows
            .iter()
            .filter(|r| r.workload == workload.name && r.plan().is_some() && keep(r))
            .max_by(|a, b| score(a).total_cmp(&score(b)).then(b.point.cmp(&a.point)));
        let Some(best) = best else {
            let mut row = CompareRow::new(&workload.name, name, fallback_chip, 0, true);
            row.note = empty.into();
            return Ok(row);
        };
        let config = best.config.unwrap_or(0) as usize;
        let arch = sweep.space.get(config).ok_or_else(|| {
            SweepError::Input(format!("configuration {config} is outside the space"))
        })?;
        let cache = ScheduleCache::new(self.solver)?;
        let evaluation = reevaluate(sweep, best, &cache)?;
        Ok(
            CompareRow::new(&workload.name, name, &arch, best.hbm_bytes, true)
                .with_outcome(Ok(evaluation)),
        )
    }

    /// The table of one workload; the co-design sweep runs into `sweep_dir` (see
    /// [`Comparison::sweep_dir`]) with each baseline's peak power as a level (its points then
    /// answer the iso-area and iso-power rows), and the one holding the fixed plan into
    /// `<sweep_dir>.fixed-plan`.
    pub fn compare_workload(
        &self,
        workload: &Workload,
        workload_path: &Path,
        sweep_dir: &Path,
    ) -> Result<Vec<CompareRow>, SweepError> {
        let cache = ScheduleCache::new(self.solver)?;
        let mut rows = Vec::new();
        for chip in &self.baselines {
            let in_space =
                self.space.contains(chip) && self.hbm_bytes.contains(&chip.hbm.capacity_bytes);
            let hbm = chip.hbm.capacity_bytes;
            let fixed = CompareRow::new(
                &workload.name,
                format!("{} fixed plan", chip.name),
                chip,
                hbm,
                in_space,
            );
            rows.push(match self.plans.plans.get(&workload.name) {
                Some(&widths) => fixed.with_outcome(evaluate(
                    workload,
                    chip,
                    &self.fixed_plan_options(widths),
                    &cache,
                )),
                None => CompareRow {
                    note: format!("no fixed plan for `{}` in the plans file", workload.name),
                    ..fixed
                },
            });
            let searched = CompareRow::new(
                &workload.name,
                format!("{} searched plan", chip.name),
                chip,
                hbm,
                in_space,
            );
            rows.push(searched.with_outcome(evaluate(workload, chip, &self.options(None), &cache)));
        }

        let decoupled = self
            .decoupled_choice(workload)
            .map_err(|e| SweepError::Input(e.to_string()))?;
        rows.push(self.best_over_hbm(workload, "decoupled", &decoupled, &cache));

        let hardware_first = self
            .hardware_first_choice(workload)
            .map_err(|e| SweepError::Input(e.to_string()))?;
        rows.push(self.best_over_hbm(workload, "hardware-first", &hardware_first, &cache));

        // The sweep keeps each baseline's peak power as a level, so that its points answer the
        // iso-power rows too.
        let mut levels: Vec<f64> = self.baselines.iter().map(peak_power_w).collect();
        levels.sort_by(f64::total_cmp);
        levels.dedup();
        let (codesign, sweep) = self.codesign_row(
            workload,
            workload_path,
            sweep_dir,
            "co-design",
            Fixed::default(),
            levels,
            &decoupled,
        )?;
        rows.push(codesign);
        // Co-design no larger than each baseline: a better chip that is also larger has not
        // won alone ...
        let points = read_points(&sweep_dir.join(super::POINTS_CSV))?;
        for reference in &self.baselines {
            rows.push(self.iso_area_row(
                workload,
                &sweep,
                &points,
                format!("co-design ≤ {} area", reference.name),
                area_breakdown(reference).total_mm2,
                &decoupled,
            )?);
            // ... and no hungrier: a better chip that draws more power has not won alone either.
            rows.push(self.iso_power_row(
                workload,
                &sweep,
                &points,
                format!("co-design ≤ {} power", reference.name),
                peak_power_w(reference),
                &decoupled,
            )?);
        }
        match self.plans.plans.get(&workload.name) {
            Some(&widths) => {
                let dir = sibling(sweep_dir, "fixed-plan");
                let (row, _) = self.codesign_row(
                    workload,
                    workload_path,
                    &dir,
                    "fixed-plan co-design",
                    Fixed {
                        tp: Some(widths.tp),
                        pp: Some(widths.pp),
                        dp: Some(widths.dp),
                        virtual_stages: None,
                        ep: None,
                    },
                    Vec::new(),
                    &decoupled,
                )?;
                rows.push(row);
            }
            None => {
                let mut row = CompareRow::new(
                    &workload.name,
                    "fixed-plan co-design".into(),
                    &decoupled,
                    0,
                    true,
                );
                row.note = format!("no fixed plan for `{}` in the plans file", workload.name);
                rows.push(row);
            }
        }

        // Speed-ups and gains are over row 1; when it has no plan, over the first row that has
        // one.
        for row in &mut rows {
            row.objective = self.objective;
            row.objective_value = objective_value(self.objective, row);
        }
        let reference_row = rows
            .iter()
            .position(|r| r.throughput_samples_per_s.is_some());
        let reference = reference_row.and_then(|i| rows[i].throughput_samples_per_s);
        let reference_value = reference_row.and_then(|i| rows[i].objective_value);
        if let Some(i) = reference_row.filter(|&i| i > 0) {
            rows[i].note = "speed-up reference (row 1 has no plan)".into();
        }
        for row in &mut rows {
            row.speedup = reference
                .zip(row.throughput_samples_per_s)
                .map(|(base, thr)| thr / base);
            row.gain = reference_value
                .zip(row.objective_value)
                .map(|(base, value)| gain(self.objective, value, base));
            if !row.in_space && row.note.is_empty() {
                row.note = "outside the searched space".into();
            }
        }
        Ok(rows)
    }
}

pub const COMPARE_CSV: &str = "compare.csv";
pub const COMPARE_MD: &str = "compare.md";
pub const COMPARE_SVG: &str = "compare.svg";

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or("-".to_string(), |v| v.to_string())
}

/// A row's plan in one line (`-` without one).
pub(super) fn plan_cell(r: &CompareRow) -> String {
    match (r.tp, r.dp, r.pp, r.stage_replicas_min, r.stage_replicas_max) {
        (Some(tp), Some(pipelines), Some(stages), Some(fewest), Some(most)) => {
            report::plan_line(tp, pipelines, stages, &report::replica_range(fewest, most))
        }
        _ => "-".to_string(),
    }
}

/// The unit of `objective`'s value, as the tables name it.
pub fn objective_unit(objective: Objective) -> &'static str {
    match objective {
        Objective::Throughput => "samples/s",
        Objective::ThroughputPerArea => "samples/s/mm²",
        Objective::Energy => "J/sample",
    }
}

/// A value of `objective` for a table cell (`-` without one).
pub fn objective_cell(objective: Objective, value: Option<f64>) -> String {
    value.map_or("-".into(), |v| match objective {
        Objective::Throughput => format!("{v:.2}"),
        Objective::ThroughputPerArea => format!("{v:.4}"),
        Objective::Energy => format!("{v:.4}"),
    })
}

/// A ratio for a table cell: `1.23×` (`-` without one).
pub fn ratio_cell(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}×"))
}

/// One workload's rows as a Markdown table (also what the CLI prints); the objective column
/// is the first row's objective.
pub fn markdown_table(rows: &[CompareRow]) -> String {
    let objective = rows.first().map_or(Objective::Throughput, |r| r.objective);
    let objective_header = format!("{objective} ({})", objective_unit(objective));
    let header: [&str; 16] = [
        "row",
        "chip",
        "mm²",
        "peak W",
        "HBM GiB",
        "plan",
        "b",
        "recompute",
        "s/batch",
        "samples/s",
        "MFU",
        "J/sample",
        &objective_header,
        "gain",
        "speed-up",
        "note",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                cell(&r.row),
                cell(&r.chip),
                format!("{:.1}", r.area_mm2),
                format!("{:.0}", r.peak_power_w),
                format!("{:.0}", report::gib(r.hbm_bytes)),
                plan_cell(r),
                opt(r.micro_batch),
                r.recompute.map_or("-".into(), |m| m.to_string()),
                r.time_per_batch_s.map_or("-".into(), |v| format!("{v:.4}")),
                r.throughput_samples_per_s
                    .map_or("-".into(), |v| format!("{v:.2}")),
                r.mfu.map_or("-".into(), |v| format!("{:.1} %", v * 100.0)),
                r.energy_per_sample_j
                    .map_or("-".into(), |v| format!("{v:.3}")),
                objective_cell(r.objective, r.objective_value),
                ratio_cell(r.gain),
                ratio_cell(r.speedup),
                cell(&r.note),
            ]
        })
        .collect();
    markdown::table(&header, &cells)
}

/// Writes `compare.csv` (all rows), `compare.md` (one table per workload) and `compare.svg`
/// (the gain in the objective over each workload's reference row, grouped by workload) into
/// `out`.
pub fn write_comparison(rows: &[CompareRow], out: &Path) -> Result<(), SweepError> {
    use super::sweep::io_error;
    let _lock = DirLock::acquire(out)?;

    let mut by_workload: Vec<(&str, Vec<CompareRow>)> = Vec::new();
    for row in rows {
        match by_workload.iter_mut().find(|(w, _)| *w == row.workload) {
            Some((_, list)) => list.push(row.clone()),
            None => by_workload.push((&row.workload, vec![row.clone()])),
        }
    }
    let objective = rows.first().map_or(Objective::Throughput, |r| r.objective);
    let mut md = format!(
        "# Baselines against co-design\n\nObjective: {objective} ({}); gain: the objective \
         over each workload's reference row (row 1, or the first row with a plan), > 1 better; \
         speed-up: samples/s over the same row.\n\n",
        objective_unit(objective)
    );
    for (workload, list) in &by_workload {
        md += &format!("## {}\n\n{}\n", cell(workload), markdown_table(list));
    }
    let md_path = out.join(COMPARE_MD);
    write_atomic(&md_path, md.as_bytes()).map_err(|e| io_error(&md_path, e))?;
    let svg_path = out.join(COMPARE_SVG);
    let groups: Vec<BarGroup> = by_workload
        .iter()
        .map(|(workload, list)| BarGroup {
            name: workload.to_string(),
            bars: list.iter().map(|r| (r.row.clone(), r.gain)).collect(),
        })
        .collect();
    let svg = svg::speedup_bars(
        &format!("gain in {objective} over each workload's first row"),
        "gain (×)",
        &groups,
    )
    .map_err(|e| io_error(&svg_path, e))?;
    write_atomic(&svg_path, svg.as_bytes()).map_err(|e| io_error(&svg_path, e))?;
    // The rows last: a folder whose compare.csv holds a workload holds its table and chart.
    let csv_path = out.join(COMPARE_CSV);
    let bytes = report::csv::to_bytes(rows, true).map_err(|e| io_error(&csv_path, e))?;
    write_atomic(&csv_path, &bytes).map_err(|e| io_error(&csv_path, e))
}
