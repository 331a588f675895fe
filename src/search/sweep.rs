//! Batch design-space sweeps (DESIGN §7): every configuration of a search space × HBM size ×
//! micro-batch × recompute mode, for one or several workloads, each design point with its own
//! best parallel plan, streamed to `points.csv`.
//!
//! # Determinism, shards and resume
//!
//! A design point's id is its position in the fixed order configuration → workload → HBM →
//! micro-batch → recompute, and `points.csv` lists points by id. Configurations are evaluated
//! in parallel in chunks; a chunk's rows are sorted and appended (and flushed) before the next
//! chunk's, so thread timing never reaches the file. `--shard i/n` owns the configurations
//! whose index is `i` modulo `n`; merging shards sorts their rows by id, which gives the file
//! one run writes. `--resume` drops a torn last line, skips the ids already written and
//! appends the rest in the same order.
//!
//! # Sound pruning
//!
//! Every GEMM FLOP runs on tensor cores at no more than their peak, so a point's throughput is
//! at most `global batch · devices · peak FLOP/s / hardware FLOPs per iteration`. A fixed set of
//! *probe* configurations (the highest-peak configuration in each of `probes` equal-count area
//! bands of the whole space, so every shard picks the same ones) is evaluated first. A
//! configuration × HBM size is pruned, all its points together, when for every workload some
//! probe point of no larger area is strictly faster than the bound, and — with several
//! workloads — some probe hardware of no larger area has a higher mean throughput than the mean
//! of the bounds. A pruned point is then strictly dominated in throughput and area, so it is on
//! no Pareto front and is the best under neither the throughput nor the throughput-per-area
//! objective; the energy objective disables pruning. Decisions depend on the probes only, not
//! on the order of evaluation, so shards and resumed runs prune exactly as one run does.

use super::{evaluate, DesignRow, PlanOptions, Status};
use crate::arch::{area_breakdown, ArchConfig, SearchSpace};
use crate::placement::RecomputeMode;
use crate::schedule::{ScheduleCache, ScheduleError, SolverOptions};
use crate::workload::Workload;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What the sweep's best point maximises (several workloads: the mean over workloads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// Samples per second.
    Throughput,
    /// Samples per second per mm² of die.
    ThroughputPerArea,
    /// Fewest joules per sample (no pruning: the throughput bound says nothing about energy).
    Energy,
}

impl Objective {
    /// The value to maximise for an evaluated row.
    pub fn score(self, row: &DesignRow) -> Option<f64> {
        let thr = row.throughput_samples_per_s?;
        match self {
            Objective::Throughput => Some(thr),
            Objective::ThroughputPerArea => Some(thr / row.area_mm2),
            Objective::Energy => row.energy_per_sample_j.map(|e| -e),
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Objective::Throughput => "throughput",
            Objective::ThroughputPerArea => "throughput-per-area",
            Objective::Energy => "energy",
        })
    }
}

/// Which configurations one process of a split sweep owns: index ≡ `index` (mod `count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Parses `i/n` with `0 ≤ i < n`.
    pub fn parse(text: &str) -> Result<Shard, String> {
        let (i, n) = text
            .split_once('/')
            .ok_or_else(|| format!("`{text}` is not of the form i/n (e.g. 0/4)"))?;
        let index: u32 = i
            .trim()
            .parse()
            .map_err(|_| format!("shard index `{i}` is not a non-negative integer"))?;
        let count: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("shard count `{n}` is not a positive integer"))?;
        if count == 0 || index >= count {
            return Err(format!("shard {index}/{count}: need 0 ≤ i < n"));
        }
        Ok(Shard { index, count })
    }

    pub fn owns(&self, config: usize) -> bool {
        config as u64 % u64::from(self.count) == u64::from(self.index)
    }
}

/// Everything that defines a sweep; `run.toml` records it (see [`SweepRecord`]).
#[derive(Debug)]
pub struct Sweep {
    pub workloads: Vec<Workload>,
    pub space: SearchSpace,
    pub devices: u32,
    pub micro_batches: Vec<u32>,
    pub recompute: Vec<RecomputeMode>,
    pub hbm_bytes: Vec<u64>,
    pub objective: Objective,
    /// Probe configurations evaluated first to prune against (0 with `prune = false`).
    pub probes: usize,
    pub prune: bool,
    pub solver: SolverOptions,
}

/// The sweep's inputs as written to `run.toml`: enough to run it again or merge its shards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRecord {
    pub tandem_version: String,
    pub workloads: Vec<PathBuf>,
    pub space: PathBuf,
    pub devices: u32,
    pub micro_batches: Vec<u32>,
    pub recompute: Vec<RecomputeMode>,
    pub hbm_bytes: Vec<u64>,
    pub objective: Objective,
    pub probes: usize,
    pub prune: bool,
    pub ilp_time_limit_s: f64,
    pub ilp_relative_gap: f64,
}

/// Why a sweep cannot run or finish.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{0}")]
    Input(String),
    #[error("{file}: {reason}", file = .file.display())]
    Io { file: PathBuf, reason: String },
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

pub(crate) fn io_error(file: &Path, e: impl fmt::Display) -> SweepError {
    SweepError::Io {
        file: file.to_path_buf(),
        reason: e.to_string(),
    }
}

/// What a finished (or resumed) sweep did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SweepStats {
    pub configurations: usize,
    pub points: u64,
    /// Points already in `points.csv` when resuming.
    pub skipped: u64,
    pub evaluated: u64,
    pub ok: u64,
    pub infeasible: u64,
    pub pruned: u64,
    pub probe_time_s: f64,
    pub sweep_time_s: f64,
}

impl Sweep {
    /// Loads the workloads and the space a record names (errors name the file and field).
    pub fn from_record(record: &SweepRecord) -> Result<Sweep, SweepError> {
        let input = |e: crate::error::InputError| SweepError::Input(e.to_string());
        let workloads = record
            .workloads
            .iter()
            .map(|p| Workload::load(p).map_err(input))
            .collect::<Result<Vec<_>, _>>()?;
        let mut names = BTreeSet::new();
        for w in &workloads {
            if !names.insert(w.name.as_str()) {
                return Err(SweepError::Input(format!(
                    "--workload: two workloads are named `{}`",
                    w.name
                )));
            }
        }
        let solver = SolverOptions {
            time_limit_s: record.ilp_time_limit_s,
            relative_gap: record.ilp_relative_gap,
            use_ilp: true,
        };
        solver.validate()?;
        let sweep = Sweep {
            workloads,
            space: SearchSpace::load(&record.space).map_err(input)?,
            devices: record.devices,
            micro_batches: record.micro_batches.clone(),
            recompute: record.recompute.clone(),
            hbm_bytes: record.hbm_bytes.clone(),
            objective: record.objective,
            probes: record.probes,
            prune: record.prune,
            solver,
        };
        sweep.validate()?;
        Ok(sweep)
    }

    fn points_per_config(&self) -> u64 {
        (self.workloads.len()
            * self.hbm_bytes.len()
            * self.micro_batches.len()
            * self.recompute.len()) as u64
    }

    /// Id of a design point (see the module docs).
    fn point_id(&self, config: usize, w: usize, h: usize, m: usize, r: usize) -> u64 {
        let (nw, nh, nm, nr) = (
            self.workloads.len() as u64,
            self.hbm_bytes.len() as u64,
            self.micro_batches.len() as u64,
            self.recompute.len() as u64,
        );
        (((config as u64 * nw + w as u64) * nh + h as u64) * nm + m as u64) * nr + r as u64
    }

    /// Checks the lists; the space and workloads validated themselves when loaded.
    pub fn validate(&self) -> Result<(), SweepError> {
        let bad = |what: &str| Err(SweepError::Input(what.to_string()));
        if self.workloads.is_empty() {
            return bad("--workload: give at least one workload");
        }
        if self.devices == 0 {
            return bad("--devices: must be positive");
        }
        if self.micro_batches.is_empty() || self.micro_batches.contains(&0) {
            return bad("--micro-batch: give positive micro-batch sizes");
        }
        if self.recompute.is_empty() {
            return bad("--recompute: give at least one mode");
        }
        if self.hbm_bytes.is_empty() || self.hbm_bytes.contains(&0) {
            return bad("--hbm-gib: give positive HBM sizes");
        }
        if self.space.is_empty() {
            return bad("--space: no configuration lies inside the space's area window");
        }
        Ok(())
    }

    /// Upper bound on the throughput of `workload` under `recompute` on any chip of peak
    /// `peak_flops` (see the module docs).
    fn bound_samples_per_s(
        &self,
        workload: &Workload,
        recompute: RecomputeMode,
        peak_flops: f64,
    ) -> f64 {
        let flops = workload.hardware_flops_per_iteration(recompute == RecomputeMode::Full);
        if flops <= 0.0 {
            return f64::INFINITY;
        }
        workload.global_batch as f64 * f64::from(self.devices) * peak_flops / flops
    }

    /// The probe configurations: in each of `probes` equal-count bands of configurations by
    /// area, the one with the highest peak FLOP/s (ties: lowest index).
    fn probe_configs(&self) -> Vec<usize> {
        if !self.prune || self.probes == 0 || self.objective == Objective::Energy {
            return Vec::new();
        }
        let mut by_area: Vec<(f64, f64, usize)> = self
            .space
            .iter()
            .enumerate()
            .map(|(i, a)| (area_breakdown(&a).total_mm2, a.peak_tensor_flops(), i))
            .collect();
        by_area.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));
        let bands = self.probes.min(by_area.len());
        let mut picked: Vec<usize> = (0..bands)
            .filter_map(|b| {
                let lo = b * by_area.len() / bands;
                let hi = (b + 1) * by_area.len() / bands;
                by_area[lo..hi]
                    .iter()
                    .max_by(|x, y| x.1.total_cmp(&y.1).then(y.2.cmp(&x.2)))
                    .map(|x| x.2)
            })
            .collect();
        picked.sort_unstable();
        picked.dedup();
        picked
    }

    /// Evaluates the points of configuration `config` that are not in `done`, pruning the
    /// hardware (configuration × HBM) that `probes` dominate.
    fn config_rows(
        &self,
        config: usize,
        arch: &ArchConfig,
        probes: Option<&ProbeFront>,
        done: &BTreeSet<u64>,
    ) -> Result<Vec<DesignRow>, SweepError> {
        let cache = ScheduleCache::new(self.solver)?;
        let area_mm2 = area_breakdown(arch).total_mm2;
        let peak = arch.peak_tensor_flops();
        let mut rows = Vec::new();
        for (h, &hbm) in self.hbm_bytes.iter().enumerate() {
            let pruned_by = probes.and_then(|front| front.dominates(self, area_mm2, peak));
            for (w, workload) in self.workloads.iter().enumerate() {
                for (m, &micro_batch) in self.micro_batches.iter().enumerate() {
                    for (r, &recompute) in self.recompute.iter().enumerate() {
                        let id = self.point_id(config, w, h, m, r);
                        if done.contains(&id) {
                            continue;
                        }
                        let bound = self.bound_samples_per_s(workload, recompute, peak);
                        let mut row = match &pruned_by {
                            Some(reason) => DesignRow::point(
                                &workload.name,
                                arch,
                                Some(micro_batch),
                                Some(recompute),
                                hbm,
                                Status::Pruned,
                                reason.clone(),
                            ),
                            None => self.evaluate_point(
                                workload,
                                arch,
                                hbm,
                                micro_batch,
                                recompute,
                                &cache,
                            ),
                        };
                        row.point = Some(id);
                        row.config = Some(config as u64);
                        row.bound_samples_per_s = Some(bound);
                        rows.push(row);
                    }
                }
            }
        }
        Ok(rows)
    }

    fn evaluate_point(
        &self,
        workload: &Workload,
        arch: &ArchConfig,
        hbm: u64,
        micro_batch: u32,
        recompute: RecomputeMode,
        cache: &ScheduleCache,
    ) -> DesignRow {
        let options = PlanOptions {
            hbm_bytes: Some(hbm),
            micro_batches: vec![micro_batch],
            recompute: vec![recompute],
            ..PlanOptions::searching(self.devices)
        };
        match evaluate(workload, arch, &options, cache) {
            Ok(e) => DesignRow::evaluated(arch, &e),
            Err(err) => DesignRow::failed(
                &workload.name,
                arch,
                Some(micro_batch),
                Some(recompute),
                hbm,
                &err,
            ),
        }
    }

    /// The probe points, evaluated, keyed by id.
    fn evaluate_probes(&self, probes: &[usize]) -> Result<BTreeMap<u64, DesignRow>, SweepError> {
        let none = BTreeSet::new();
        let rows: Vec<Vec<DesignRow>> = probes
            .par_iter()
            .map(|&c| {
                let arch = self.config(c)?;
                self.config_rows(c, &arch, None, &none)
            })
            .collect::<Result<_, _>>()?;
        Ok(rows
            .into_iter()
            .flatten()
            .filter_map(|r| Some((r.point?, r)))
            .collect())
    }

    fn config(&self, index: usize) -> Result<ArchConfig, SweepError> {
        self.space
            .get(index)
            .ok_or_else(|| SweepError::Input(format!("configuration {index} is outside the space")))
    }
}

/// The probes' evaluated throughputs, per workload and (several workloads) per hardware.
#[derive(Debug, Default)]
struct ProbeFront {
    /// Per workload: (area, samples/s, point id) of every `ok` probe point.
    per_workload: Vec<Vec<(f64, f64, u64)>>,
    /// Per probe hardware with an `ok` point for every workload: (area, mean over workloads of
    /// the best samples/s, configuration, HBM index).
    per_hardware: Vec<(f64, f64, u64, usize)>,
}

impl ProbeFront {
    fn new(sweep: &Sweep, rows: &BTreeMap<u64, DesignRow>) -> ProbeFront {
        let nw = sweep.workloads.len();
        let mut per_workload = vec![Vec::new(); nw];
        // (config, hbm index) → best samples/s per workload.
        let mut best: BTreeMap<(u64, usize), (f64, Vec<Option<f64>>)> = BTreeMap::new();
        let per_config = sweep.points_per_config();
        let per_workload_points = per_config / nw as u64;
        let per_hbm = per_workload_points / sweep.hbm_bytes.len() as u64;
        for (&id, row) in rows {
            let Some(thr) = row.throughput_samples_per_s else {
                continue;
            };
            let within = id % per_config;
            let w = (within / per_workload_points) as usize;
            let h = ((within % per_workload_points) / per_hbm) as usize;
            per_workload[w].push((row.area_mm2, thr, id));
            let entry = best
                .entry((id / per_config, h))
                .or_insert_with(|| (row.area_mm2, vec![None; nw]));
            let slot = &mut entry.1[w];
            *slot = Some(slot.map_or(thr, |s: f64| s.max(thr)));
        }
        let per_hardware = best
            .into_iter()
            .filter_map(|((config, h), (area, per_w))| {
                let values: Option<Vec<f64>> = per_w.into_iter().collect();
                values.map(|v| (area, v.iter().sum::<f64>() / v.len() as f64, config, h))
            })
            .collect();
        ProbeFront {
            per_workload,
            per_hardware,
        }
    }

    /// Why a chip of `area_mm2` and peak `peak_flops` cannot matter, or `None` if it might.
    fn dominates(&self, sweep: &Sweep, area_mm2: f64, peak_flops: f64) -> Option<String> {
        let mut bounds = Vec::with_capacity(sweep.workloads.len());
        let mut reasons = Vec::new();
        for (w, workload) in sweep.workloads.iter().enumerate() {
            let bound = sweep
                .recompute
                .iter()
                .map(|&r| sweep.bound_samples_per_s(workload, r, peak_flops))
                .fold(0.0, f64::max);
            let beater = self.per_workload[w]
                .iter()
                .filter(|&&(area, thr, _)| area <= area_mm2 && thr > bound)
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.2.cmp(&a.2)))?;
            reasons.push(format!(
                "{}: at most {bound:.4e} samples/s (peak-FLOP bound) < {:.4e} of point {} at {:.1} mm²",
                workload.name, beater.1, beater.2, beater.0
            ));
            bounds.push(bound);
        }
        if sweep.workloads.len() > 1 {
            let mean_bound = bounds.iter().sum::<f64>() / bounds.len() as f64;
            let beater = self
                .per_hardware
                .iter()
                .filter(|&&(area, mean, _, _)| area <= area_mm2 && mean > mean_bound)
                .max_by(|a, b| a.1.total_cmp(&b.1))?;
            reasons.push(format!(
                "mean at most {mean_bound:.4e} < {:.4e} of configuration {} at {:.1} mm²",
                beater.1, beater.2, beater.0
            ));
        }
        Some(format!("pruned: {}", reasons.join("; ")))
    }
}

/// Where a sweep writes, and how it reports progress.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub out_dir: PathBuf,
    pub shard: Shard,
    pub resume: bool,
    pub progress: bool,
}

pub const POINTS_CSV: &str = "points.csv";
pub const RUN_TOML: &str = "run.toml";
pub const SHARD_TOML: &str = "shard.toml";

/// Configurations evaluated together between two appends to `points.csv`.
const CHUNK_PER_THREAD: usize = 4;

/// Runs the sweep's shard into `options.out_dir` (`points.csv` streamed; the summaries are
/// written by [`super::finish`]).
pub fn run_sweep(
    sweep: &Sweep,
    record: &SweepRecord,
    options: &RunOptions,
) -> Result<SweepStats, SweepError> {
    sweep.validate()?;
    let out = &options.out_dir;
    std::fs::create_dir_all(out).map_err(|e| io_error(out, e))?;
    let points_path = out.join(POINTS_CSV);
    let run_path = out.join(RUN_TOML);
    let record_text = toml::to_string(record).map_err(|e| io_error(&run_path, e))?;
    let done = if options.resume {
        let previous = std::fs::read_to_string(&run_path).map_err(|e| io_error(&run_path, e))?;
        if previous != record_text {
            return Err(SweepError::Input(format!(
                "{}: --resume needs the same inputs as the interrupted run (its run.toml differs)",
                run_path.display()
            )));
        }
        finished_points(&points_path)?
    } else {
        if points_path.exists() {
            return Err(SweepError::Input(format!(
                "{}: exists; pass --resume to continue that sweep or choose another --out",
                points_path.display()
            )));
        }
        BTreeSet::new()
    };
    std::fs::write(&run_path, &record_text).map_err(|e| io_error(&run_path, e))?;
    let shard_path = out.join(SHARD_TOML);
    if options.shard == Shard::WHOLE {
        if shard_path.exists() {
            std::fs::remove_file(&shard_path).map_err(|e| io_error(&shard_path, e))?;
        }
    } else {
        let text = toml::to_string(&options.shard).map_err(|e| io_error(&shard_path, e))?;
        std::fs::write(&shard_path, text).map_err(|e| io_error(&shard_path, e))?;
    }

    let started = Instant::now();
    let probe_configs = sweep.probe_configs();
    let probe_rows = sweep.evaluate_probes(&probe_configs)?;
    let front = ProbeFront::new(sweep, &probe_rows);
    let probe_time_s = started.elapsed().as_secs_f64();

    let owned: Vec<usize> = (0..sweep.space.len())
        .filter(|&c| options.shard.owns(c))
        .collect();
    let per_config = sweep.points_per_config();
    let mut stats = SweepStats {
        configurations: owned.len(),
        points: owned.len() as u64 * per_config,
        probe_time_s,
        ..SweepStats::default()
    };
    let bar = progress_bar(options.progress, owned.len() as u64);
    let chunk = rayon::current_num_threads().max(1) * CHUNK_PER_THREAD;
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&points_path)
        .map_err(|e| io_error(&points_path, e))?;
    let mut header_written = file
        .metadata()
        .map_err(|e| io_error(&points_path, e))?
        .len()
        > 0;
    for configs in owned.chunks(chunk) {
        let rows: Vec<Vec<DesignRow>> = configs
            .par_iter()
            .map(|&c| {
                let first = c as u64 * per_config;
                if (first..first + per_config).all(|id| done.contains(&id)) {
                    return Ok(Vec::new());
                }
                if probe_configs.binary_search(&c).is_ok() {
                    return Ok((first..first + per_config)
                        .filter(|id| !done.contains(id))
                        .filter_map(|id| probe_rows.get(&id).cloned())
                        .collect());
                }
                let arch = sweep.config(c)?;
                let front = (!probe_configs.is_empty()).then_some(&front);
                sweep.config_rows(c, &arch, front, &done)
            })
            .collect::<Result<_, SweepError>>()?;
        let mut rows: Vec<DesignRow> = rows.into_iter().flatten().collect();
        rows.sort_by_key(|r| r.point);
        for row in &rows {
            match row.status {
                Status::Ok => stats.ok += 1,
                Status::Infeasible => stats.infeasible += 1,
                Status::Pruned => stats.pruned += 1,
            }
        }
        stats.evaluated += rows.iter().filter(|r| r.status != Status::Pruned).count() as u64;
        write_rows(&mut file, &points_path, &rows, !header_written)?;
        header_written |= !rows.is_empty();
        bar.inc(configs.len() as u64);
    }
    bar.finish_and_clear();
    stats.skipped = done.len() as u64;
    stats.sweep_time_s = started.elapsed().as_secs_f64();
    Ok(stats)
}

fn progress_bar(show: bool, len: u64) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} configurations  {per_sec}  ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Appends `rows` (and the header first when asked) in one write, then flushes.
pub(crate) fn write_rows(
    file: &mut File,
    path: &Path,
    rows: &[DesignRow],
    header: bool,
) -> Result<(), SweepError> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut writer = csv::WriterBuilder::new()
        .has_headers(header)
        .from_writer(Vec::new());
    for row in rows {
        writer.serialize(row).map_err(|e| io_error(path, e))?;
    }
    let bytes = writer.into_inner().map_err(|e| io_error(path, e.error()))?;
    file.write_all(&bytes).map_err(|e| io_error(path, e))?;
    file.flush().map_err(|e| io_error(path, e))
}

/// Point ids already in `points.csv`, after cutting off a last line that a killed run left
/// unfinished.
fn finished_points(path: &Path) -> Result<BTreeSet<u64>, SweepError> {
    if !path.exists() {
        return Ok(BTreeSet::new());
    }
    let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if complete < bytes.len() {
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| io_error(path, e))?;
        file.set_len(complete as u64)
            .map_err(|e| io_error(path, e))?;
    }
    Ok(read_points(path)?
        .into_iter()
        .filter_map(|r| r.point)
        .collect())
}

/// Every row of a `points.csv`.
pub fn read_points(path: &Path) -> Result<Vec<DesignRow>, SweepError> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let mut reader = csv::Reader::from_reader(BufReader::new(file));
    reader
        .deserialize::<DesignRow>()
        .enumerate()
        .map(|(i, r)| r.map_err(|e| io_error(path, format!("row {}: {e}", i + 1))))
        .collect()
}
