//! Batch design-space sweeps (docs/design.md §7): every configuration of a search space × HBM
//! size × micro-batch × recompute mode, for one or several workloads, each design point with
//! its own best parallel plan, streamed to `points.csv`. With a power cap (`--max-power-w`)
//! the space holds only the configurations of peak power at most the cap
//! (`SearchSpace::with_power_cap`, priced by `cost::peak_power_w`): everything below sees that
//! smaller space.
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
//! # Sound pruning (screen, then exact)
//!
//! A first pass over the *whole* space (every shard makes the same one, see
//! [`super::screen`]) gives every point a sound upper bound on its throughput and, for the
//! points that might matter, an achievable throughput (a real plan on list schedules, so the
//! exact point is at least as fast). A point is pruned when some point of no larger area is
//! achievably strictly faster than its upper bound — it is then strictly dominated in
//! throughput and area, so it is on no Pareto front and is the best under neither the
//! throughput nor the throughput-per-area objective. With several workloads the hardware
//! (configuration × HBM) must also be beaten on the mean over workloads by hardware of no
//! larger area, so the best hardware for the set is never pruned. The energy objective
//! disables pruning. Every other point is evaluated exactly (ILP schedules, full plan
//! search). The screen depends on the inputs alone, so shards and resumed runs prune exactly
//! as one run does.

use super::memory::MemoryFit;
use super::row::{Outcome, PlanSummary, Pruning};
use super::screen::{Screen, Screened, SpaceMemo};
use super::status::StatusFile;
use super::DesignRow;
use crate::arch::{ArchConfig, SearchSpace};
use crate::cost::{peak_power_w, CostModel};
use crate::model::{
    evaluate_faster_than, evaluate_on, tensor_widths, throughput_bound, Evaluation, LayerWork,
    PlanBound, PlanOptions, BOUND_SLACK,
};
use crate::output::{same_file, DirLock, LockError};
use crate::placement::{Fixed, RecomputeMode, ZeroStage};
use crate::report;
use crate::schedule::{ScheduleCache, ScheduleError, SolverOptions};
use crate::workload::Workload;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// What the sweep's best point maximises (several workloads: the mean over workloads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// Samples per second.
    Throughput,
    /// Samples per second per mm² of die.
    ThroughputPerArea,
    /// Fewest joules per sample (pruned by its own lower bound with one workload, see
    /// `energy.rs`; with several, every point is evaluated).
    Energy,
}

impl Objective {
    /// The value to maximise for an evaluated row.
    pub fn score(self, row: &DesignRow) -> Option<f64> {
        let plan = row.plan()?;
        let thr = plan.throughput_samples_per_s;
        Some(match self {
            Objective::Throughput => thr,
            Objective::ThroughputPerArea => thr / row.area_mm2,
            Objective::Energy => -plan.energy_per_sample_j,
        })
    }
}

/// The name of `run.toml` and `best.json` (serde's).
impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.serialize(f)
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
    /// ZeRO stages each point's plan search chooses from.
    pub zero: Vec<ZeroStage>,
    /// Parallel widths every point's plan holds (none: all searched).
    pub fixed: Fixed,
    pub objective: Objective,
    pub prune: bool,
    pub solver: SolverOptions,
    /// The space's configurations are those of peak power at most this (watts; none: all).
    pub max_peak_power_w: Option<f64>,
    /// Peak powers (watts, rising) under which the best point is kept exact too.
    pub power_levels_w: Vec<f64>,
    /// Per configuration, the first power level at or above its peak power (the count of
    /// levels when above them all); worked out when first needed.
    config_levels: OnceLock<Vec<u8>>,
    /// Per workload: hardware FLOPs per iteration without and with full recompute (the
    /// peak-FLOP bound needs them for every point; building them walks the model).
    pub(super) hardware_flops: Vec<[f64; 2]>,
    /// Per workload and micro-batch: the unique layers at each tensor width, which the
    /// screen's work bound prices on every configuration.
    pub(super) layer_work: Vec<Vec<Vec<LayerWork>>>,
    /// Layer bounds priced on each configuration, shared with other sweeps of the space.
    pub(super) space_memo: Arc<SpaceMemo>,
    /// Per workload, what fits in memory at each (HBM, micro-batch, recompute); worked out
    /// when first needed ([`Sweep::memory_fits`]).
    pub(super) memory_fits: OnceLock<Vec<Vec<MemoryFit>>>,
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
    /// ZeRO stages each plan search chooses from; absent from sweeps recorded before they
    /// existed: those held ZeRO-0.
    #[serde(default = "replicated_only")]
    pub zero: Vec<ZeroStage>,
    /// Parallel widths every plan holds (absent: all searched).
    #[serde(default, skip_serializing_if = "all_searched")]
    pub fixed: Fixed,
    pub objective: Objective,
    pub prune: bool,
    pub ilp_time_limit_s: f64,
    pub ilp_node_limit: u32,
    pub ilp_relative_gap: f64,
    /// Absent from sweeps recorded before the depth-first search existed: they ran without it.
    #[serde(default)]
    pub search_node_limit: u32,
    /// Whether layer schedules may go past the list schedule (depth-first search and ILP);
    /// absent from sweeps recorded before `--no-ilp` existed: they did.
    #[serde(default = "past_the_list_schedule")]
    pub use_ilp: bool,
    /// SHA-256 of each input file's bytes (the workloads, then the space) when the sweep ran,
    /// so a resume or merge notices a file edited under the same path. Filled by
    /// [`run_sweep`]; absent from sweeps recorded before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs_sha256: Vec<String>,
    /// Only configurations of peak power at most this many watts (`--max-power-w`; absent:
    /// all), the space filtered before any point is screened or evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_peak_power_w: Option<f64>,
    /// Peak powers (watts) under which the best point is kept exact too (`--power-levels-w`;
    /// absent: none): a point is pruned only by one of no larger area whose peak power is
    /// within every level its own is, so one sweep answers the comparisons at each power.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub power_levels_w: Vec<f64>,
}

fn all_searched(fixed: &Fixed) -> bool {
    *fixed == Fixed::default()
}

fn replicated_only() -> Vec<ZeroStage> {
    vec![ZeroStage::Replicated]
}

impl SweepRecord {
    /// The record with `inputs_sha256` computed from the input files as they are now.
    pub fn with_input_digests(&self) -> Result<SweepRecord, SweepError> {
        let inputs_sha256 = self
            .workloads
            .iter()
            .chain(std::iter::once(&self.space))
            .map(|path| {
                let bytes = std::fs::read(path).map_err(|e| io_error(path, e))?;
                Ok(Sha256::digest(&bytes)
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect())
            })
            .collect::<Result<_, SweepError>>()?;
        Ok(SweepRecord {
            inputs_sha256,
            ..self.clone()
        })
    }

    /// What differs between `previous` (an earlier run's record) and `self`, naming the
    /// setting, or `None` when they describe the same sweep. A path spelled another way
    /// (`./workloads/x.toml`, or from another directory) that names the same file is the same
    /// input; an input file whose bytes changed is named with both digests.
    fn difference(&self, previous: &SweepRecord) -> Option<String> {
        let show = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let same_workloads = self.workloads.len() == previous.workloads.len()
            && self
                .workloads
                .iter()
                .zip(&previous.workloads)
                .all(|(a, b)| same_file(a, b));
        if !same_workloads {
            return Some(format!(
                "--workload: {} then, {} now",
                show(&previous.workloads),
                show(&self.workloads)
            ));
        }
        if !same_file(&self.space, &previous.space) {
            return Some(format!(
                "--space: {} then, {} now",
                previous.space.display(),
                self.space.display()
            ));
        }
        let paths = self.workloads.iter().chain(std::iter::once(&self.space));
        let changed = paths
            .zip(self.inputs_sha256.iter().zip(&previous.inputs_sha256))
            .find(|(_, (now, then))| now != then);
        if let Some((path, (now, then))) = changed {
            return Some(format!(
                "{} changed since that run (SHA-256 {}… then, {}… now)",
                path.display(),
                &then[..then.len().min(12)],
                &now[..now.len().min(12)]
            ));
        }
        let settings: [(&str, String, String); 16] = [
            (
                "tandem version",
                previous.tandem_version.clone(),
                self.tandem_version.clone(),
            ),
            (
                "--devices",
                previous.devices.to_string(),
                self.devices.to_string(),
            ),
            (
                "--micro-batch",
                format!("{:?}", previous.micro_batches),
                format!("{:?}", self.micro_batches),
            ),
            (
                "--recompute",
                format!("{:?}", previous.recompute),
                format!("{:?}", self.recompute),
            ),
            (
                "--hbm-gib (bytes)",
                format!("{:?}", previous.hbm_bytes),
                format!("{:?}", self.hbm_bytes),
            ),
            (
                "--zero",
                format!("{:?}", previous.zero),
                format!("{:?}", self.zero),
            ),
            (
                "held plan widths",
                format!("{:?}", previous.fixed),
                format!("{:?}", self.fixed),
            ),
            (
                "--objective",
                previous.objective.to_string(),
                self.objective.to_string(),
            ),
            (
                "--no-prune",
                (!previous.prune).to_string(),
                (!self.prune).to_string(),
            ),
            (
                "--ilp-time-limit-s",
                previous.ilp_time_limit_s.to_string(),
                self.ilp_time_limit_s.to_string(),
            ),
            (
                "--ilp-node-limit",
                previous.ilp_node_limit.to_string(),
                self.ilp_node_limit.to_string(),
            ),
            (
                "--ilp-gap",
                previous.ilp_relative_gap.to_string(),
                self.ilp_relative_gap.to_string(),
            ),
            (
                "--search-node-limit",
                previous.search_node_limit.to_string(),
                self.search_node_limit.to_string(),
            ),
            (
                "--no-ilp",
                (!previous.use_ilp).to_string(),
                (!self.use_ilp).to_string(),
            ),
            (
                "--max-power-w",
                format!("{:?}", previous.max_peak_power_w),
                format!("{:?}", self.max_peak_power_w),
            ),
            (
                "--power-levels-w",
                format!("{:?}", previous.power_levels_w),
                format!("{:?}", self.power_levels_w),
            ),
        ];
        settings
            .into_iter()
            .find(|(_, then, now)| then != now)
            .map(|(name, then, now)| format!("{name}: {then} then, {now} now"))
    }
}

fn past_the_list_schedule() -> bool {
    true
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
    #[error(transparent)]
    Lock(#[from] LockError),
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
    /// Pass 1 (bounds and list-schedule plans over the whole space).
    pub screen_time_s: f64,
    /// Of which: the work bound of every point.
    pub work_bound_time_s: f64,
    /// Of which: plan bounds and achievable plans, with the points they were searched for and
    /// those whose achievable plan raised the staircase.
    pub plan_bound_time_s: f64,
    pub plan_bounded: u64,
    pub achievable_found: u64,
    /// Of the screen: the seed's pilot (configurations it screened, and its time, which the
    /// two above include).
    pub pilot_configs: u64,
    pub pilot_time_s: f64,
    pub sweep_time_s: f64,
}

impl SweepStats {
    /// Counts `rows` by outcome (every row not pruned was evaluated, or decided infeasible).
    pub(super) fn count(&mut self, rows: &[DesignRow]) {
        for row in rows {
            match row.outcome {
                Outcome::Ok(_) => self.ok += 1,
                Outcome::Infeasible { .. } => self.infeasible += 1,
                Outcome::Pruned(_) => self.pruned += 1,
            }
            self.evaluated += u64::from(!matches!(row.outcome, Outcome::Pruned(_)));
        }
    }

    /// Takes the screen's times and counts.
    fn set_screen(&mut self, screen: &super::screen::ScreenStats) {
        self.work_bound_time_s = screen.work_bound_time_s;
        self.plan_bound_time_s = screen.plan_bound_time_s;
        self.plan_bounded = screen.plan_bounded;
        self.achievable_found = screen.achievable_found;
        self.pilot_configs = screen.pilot_configs;
        self.pilot_time_s = screen.pilot_time_s;
    }
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
            node_limit: record.ilp_node_limit,
            search_node_limit: record.search_node_limit,
            relative_gap: record.ilp_relative_gap,
            use_ilp: record.use_ilp,
        };
        solver.validate()?;
        let hardware_flops = workloads
            .iter()
            .map(|w| {
                [
                    w.hardware_flops_per_iteration(false),
                    w.hardware_flops_per_iteration(true),
                ]
            })
            .collect();
        let mut space = SearchSpace::load(&record.space).map_err(input)?;
        if let Some(cap) = record.max_peak_power_w {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(SweepError::Input(format!(
                    "--max-power-w: must be a positive number of watts, got {cap}"
                )));
            }
            space = space.with_power_cap(cap, peak_power_w);
        }
        let mut sweep = Sweep {
            workloads,
            space,
            devices: record.devices,
            micro_batches: record.micro_batches.clone(),
            recompute: record.recompute.clone(),
            hbm_bytes: record.hbm_bytes.clone(),
            zero: record.zero.clone(),
            fixed: record.fixed,
            objective: record.objective,
            prune: record.prune,
            solver,
            max_peak_power_w: record.max_peak_power_w,
            power_levels_w: record.power_levels_w.clone(),
            config_levels: OnceLock::new(),
            memory_fits: OnceLock::new(),
            hardware_flops,
            layer_work: Vec::new(),
            space_memo: Arc::default(),
        };
        sweep.validate()?;
        sweep.layer_work = super::screen::layer_work(&sweep);
        Ok(sweep)
    }

    /// Prices layer bounds through `memo`, shared with other sweeps of the same space (see
    /// [`SpaceMemo`]): they then price each configuration's layers once between them.
    pub fn share_memo(&mut self, memo: Arc<SpaceMemo>) {
        self.space_memo = memo;
    }

    /// Staircases the screens keep: one per workload and power level (the levels, then
    /// above them all).
    pub(super) fn lanes(&self) -> usize {
        self.workloads.len() * (self.power_levels_w.len() + 1)
    }

    /// The power level of configuration `config` (see `config_levels`).
    fn config_level(&self, config: usize) -> usize {
        if self.power_levels_w.is_empty() {
            return 0;
        }
        let levels = self.config_levels.get_or_init(|| {
            (0..self.space.len())
                .into_par_iter()
                .map(|c| {
                    let power_w = self
                        .space
                        .get(c)
                        .map_or(f64::INFINITY, |a| peak_power_w(&a));
                    self.power_levels_w
                        .iter()
                        .position(|&level| power_w <= level)
                        .unwrap_or(self.power_levels_w.len()) as u8
                })
                .collect()
        });
        usize::from(levels[config])
    }

    /// The staircase of point `id`: its workload's at its configuration's power level. A
    /// point is pruned only against it, which holds the points of no higher level.
    pub(super) fn lane(&self, id: usize) -> usize {
        let (config, w, _) = self.point_hardware(id);
        w * (self.power_levels_w.len() + 1) + self.config_level(config)
    }

    /// The staircases point `id` reaches into: its own and those of its workload's higher
    /// levels.
    pub(super) fn lanes_from(&self, id: usize) -> std::ops::Range<usize> {
        let w = self.point_hardware(id).1;
        self.lane(id)..(w + 1) * (self.power_levels_w.len() + 1)
    }

    /// Whether this sweep prunes by energy (`search::energy`): pruning on, the energy
    /// objective, one workload (with several, the set's mean has no such bound).
    pub fn prunes_energy(&self) -> bool {
        self.prune && self.objective == Objective::Energy && self.workloads.len() == 1
    }

    pub(super) fn points_per_config(&self) -> u64 {
        (self.workloads.len()
            * self.hbm_bytes.len()
            * self.micro_batches.len()
            * self.recompute.len()) as u64
    }

    /// Points of one hardware (configuration × HBM) and workload: every micro-batch × recompute.
    pub(super) fn points_per_hardware(&self) -> usize {
        self.micro_batches.len() * self.recompute.len()
    }

    /// (configuration, workload, HBM index) of point `id`.
    pub(super) fn point_hardware(&self, id: usize) -> (usize, usize, usize) {
        let (config, w, h, _, _) = self.point_parts(id);
        (config, w, h)
    }

    /// (configuration, workload, HBM, micro-batch, recompute indices) of point `id`:
    /// [`Sweep::point_id`] undone.
    pub(super) fn point_parts(&self, id: usize) -> (usize, usize, usize, usize, usize) {
        let nr = self.recompute.len();
        let (rest, r) = (id / nr, id % nr);
        let nm = self.micro_batches.len();
        let (hardware, m) = (rest / nm, rest % nm);
        let nh = self.hbm_bytes.len();
        let (config_workload, h) = (hardware / nh, hardware % nh);
        let nw = self.workloads.len();
        (config_workload / nw, config_workload % nw, h, m, r)
    }

    /// Id of a design point (see the module docs).
    pub(super) fn point_id(&self, config: usize, w: usize, h: usize, m: usize, r: usize) -> u64 {
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
        if self
            .power_levels_w
            .iter()
            .any(|&w| !(w.is_finite() && w > 0.0))
        {
            return bad("--power-levels-w: give positive numbers of watts");
        }
        if self.power_levels_w.windows(2).any(|p| p[0] >= p[1]) {
            return bad("--power-levels-w: give each level once, rising");
        }
        if !self.power_levels_w.is_empty() && self.workloads.len() > 1 {
            return bad("--power-levels-w: with one workload only (the set's mean has no levels)");
        }
        if self.workloads.is_empty() {
            return bad("--workload: give at least one workload");
        }
        if self.devices == 0 {
            return bad("--devices: must be positive");
        }
        if self.micro_batches.is_empty() || self.micro_batches.contains(&0) {
            return bad("--micro-batch: give positive micro-batch sizes");
        }
        if let Some(m) = first_repeated(&self.micro_batches) {
            return bad(&format!("--micro-batch: {m} is given twice"));
        }
        for w in &self.workloads {
            if let Some(&m) = self
                .micro_batches
                .iter()
                .find(|&&m| u64::from(m) > w.global_batch)
            {
                return bad(&format!(
                    "--micro-batch: {m} exceeds the global batch {} of `{}` ({})",
                    w.global_batch,
                    w.name,
                    w.source.display()
                ));
            }
        }
        if self.zero.is_empty() {
            return bad("--zero: give at least one ZeRO stage");
        }
        if let Some(z) = first_repeated(&self.zero) {
            return bad(&format!("--zero: {} is given twice", z.number()));
        }
        if self.recompute.is_empty() {
            return bad("--recompute: give at least one mode");
        }
        if self.hbm_bytes.is_empty() || self.hbm_bytes.contains(&0) {
            return bad("--hbm-gib: give positive HBM sizes");
        }
        if let Some(b) = first_repeated(&self.hbm_bytes) {
            return bad(&format!(
                "--hbm-gib: {} GiB is given twice",
                *b as f64 / (1u64 << 30) as f64
            ));
        }
        if let Some(r) = first_repeated(&self.recompute) {
            return bad(&format!("--recompute: {r} is given twice"));
        }
        if self.space.is_empty() {
            return bad(&match self.max_peak_power_w {
                Some(cap) => format!(
                    "--max-power-w: no configuration inside the space's area window has a peak \
                     power of at most {cap} W"
                ),
                None => "--space: no configuration lies inside the space's area window".into(),
            });
        }
        Ok(())
    }

    /// Upper bound on the throughput of workload `w` under `recompute` on any chip of peak
    /// `peak_flops`: `global batch · devices · peak FLOP/s / hardware FLOPs`.
    pub(super) fn peak_flop_bound(
        &self,
        w: usize,
        recompute: RecomputeMode,
        peak_flops: f64,
    ) -> f64 {
        let workload = &self.workloads[w];
        let flops = self.hardware_flops[w][usize::from(recompute == RecomputeMode::Full)];
        if flops <= 0.0 {
            return f64::INFINITY;
        }
        workload.global_batch as f64 * f64::from(self.devices) * peak_flops / flops
    }

    /// The rows of configuration `config` not in `done`: those the screen decides (pruned,
    /// or no plan fits) and the points left to evaluate exactly on its chip.
    fn config_rows(
        &self,
        config: usize,
        screen: &Screen,
        done: &BTreeSet<u64>,
    ) -> Result<ChipRows, SweepError> {
        let arch = self.config(config)?;
        let arch = &arch;
        let mut rows = Vec::new();
        for (w, workload) in self.workloads.iter().enumerate() {
            for (h, &hbm) in self.hbm_bytes.iter().enumerate() {
                let hardware_beaten = screen.hardware_beaten(self, config, h);
                for (m, &micro_batch) in self.micro_batches.iter().enumerate() {
                    for (r, &recompute) in self.recompute.iter().enumerate() {
                        let id = self.point_id(config, w, h, m, r);
                        if done.contains(&id) {
                            continue;
                        }
                        let screened = screen.points.get(&id);
                        let bound = screened.map(|p| p.bound);
                        let pruned_by = hardware_beaten.and_then(|set| {
                            screen
                                .point_beaten(self.lane(id as usize), id)
                                .map(|beaten_by| Pruning::Throughput { beaten_by, set })
                        });
                        let decided = |outcome| {
                            DesignRow::new(
                                &workload.name,
                                arch,
                                Some(micro_batch),
                                Some(recompute),
                                hbm,
                                outcome,
                            )
                        };
                        let infeasible = |reason: &str| Outcome::Infeasible {
                            reason: reason.to_string(),
                        };
                        let mut row = match (pruned_by, bound) {
                            // The screen proved that no plan fits: skip the near-miss hunt.
                            (None, Some(None)) => decided(infeasible(NO_PLAN_FITS_SCREENED)),
                            (None, _) => {
                                rows.push(PendingRow::Exact(ExactPoint {
                                    id,
                                    workload: w,
                                    hbm,
                                    micro_batch,
                                    recompute,
                                    achievable: screened.and_then(|p| p.achievable),
                                    bound: bound.map(|b| b.unwrap_or(0.0)),
                                    fitting_widths: None,
                                }));
                                continue;
                            }
                            (Some(pruning), bound) => decided(match bound.flatten() {
                                Some(_) => Outcome::Pruned(pruning),
                                None => infeasible(NO_PLAN_FITS),
                            }),
                        };
                        row.point = Some(id);
                        row.config = Some(config as u64);
                        row.bound_samples_per_s = bound.map(|b| b.unwrap_or(0.0));
                        rows.push(PendingRow::Decided(Box::new(row)));
                    }
                }
            }
        }
        Ok(ChipRows {
            chip: Chip::new(config, arch, self.solver)?,
            rows,
        })
    }

    /// The exact row of a point `config_rows` left to evaluate.
    pub(super) fn plan_options(
        &self,
        hbm: u64,
        micro_batch: u32,
        recompute: RecomputeMode,
    ) -> PlanOptions {
        PlanOptions {
            hbm_bytes: Some(hbm),
            micro_batches: vec![micro_batch],
            recompute: vec![recompute],
            zero: self.zero.clone(),
            fixed: self.fixed,
            ..PlanOptions::searching(self.devices)
        }
    }

    /// The exact row of a point `config_rows` left to evaluate. A plan on list schedules
    /// reaching the screen's achievable samples/s exists and the ILP schedules are no slower,
    /// so the plan search only looks at plans at least that fast: it skips the tensor widths
    /// whose plan bound is below it, and takes the others one at a time from the highest
    /// bound down (their layers' ILP schedules only when reached), stopping at the first
    /// whose bound the best plan found already meets (falling back to the full search should
    /// rounding leave none).
    pub(super) fn exact_row(&self, chip: &Chip, point: &ExactPoint) -> DesignRow {
        let workload = &self.workloads[point.workload];
        let (cost, cache) = (&chip.cost, &chip.cache);
        let arch = cost.arch();
        let options = PlanOptions {
            only_widths: point.fitting_widths.clone(),
            ..self.plan_options(point.hbm, point.micro_batch, point.recompute)
        };
        // A screened point left without an achievable throughput (its block's staircase was
        // already above its list-schedule plans) gets one here: it narrows the search below.
        let achievable = point.achievable.or_else(|| {
            point.bound.and_then(|_| {
                self.achievable(workload, cost, &options, 0.0)
                    .ok()
                    .flatten()
            })
        });
        let narrowed = achievable.and_then(|a| {
            let only = |t: u32| PlanOptions {
                only_widths: Some(vec![t]),
                ..options.clone()
            };
            // Each width's plan bound, highest first (a stable sort keeps ties in width order).
            let mut widths: Vec<(u32, f64)> = tensor_widths(workload, &options)
                .into_iter()
                .filter_map(|t| match throughput_bound(workload, cost, &only(t), a) {
                    Ok(PlanBound::Below(_) | PlanBound::NoPlanFits) => None,
                    Ok(PlanBound::AtMost(bound)) => Some((t, bound)),
                    Err(_) => Some((t, f64::INFINITY)),
                })
                .collect();
            widths.sort_by(|x, y| y.1.total_cmp(&x.1));
            let mut best: Option<Evaluation> = None;
            let mut bound_s = workload.global_batch as f64 / a * (1.0 + BOUND_SLACK);
            for (t, bound) in widths {
                // No plan of this width, or of any after it, beats the best found.
                if best
                    .as_ref()
                    .is_some_and(|b| bound <= b.plan.throughput_samples_per_s)
                {
                    break;
                }
                if let Ok(Some(e)) = evaluate_faster_than(workload, cost, &only(t), cache, bound_s)
                {
                    bound_s = e.plan.time_per_batch_s;
                    best = Some(e);
                }
            }
            best
        });
        let mut row =
            match narrowed.map_or_else(|| evaluate_on(workload, cost, &options, cache), Ok) {
                Ok(e) => DesignRow::evaluated(arch, &e),
                Err(err) => DesignRow::failed(
                    &workload.name,
                    arch,
                    Some(point.micro_batch),
                    Some(point.recompute),
                    point.hbm,
                    &err,
                ),
            };
        row.point = Some(point.id);
        row.config = Some(chip.config as u64);
        row.bound_samples_per_s = point.bound;
        row
    }

    /// Point `id` of the one-workload sweep to evaluate exactly with no screen figures, over
    /// `fitting_widths` (`None`: every width).
    pub(super) fn unscreened_point(&self, id: u64, fitting_widths: Option<Vec<u32>>) -> ExactPoint {
        let (_, workload, h, m, r) = self.point_parts(id as usize);
        ExactPoint {
            id,
            workload,
            hbm: self.hbm_bytes[h],
            micro_batch: self.micro_batches[m],
            recompute: self.recompute[r],
            achievable: None,
            bound: None,
            fitting_widths,
        }
    }

    /// The plan options of point `id`.
    pub(super) fn point_options(&self, id: usize) -> PlanOptions {
        let (_, _, h, m, r) = self.point_parts(id);
        self.plan_options(self.hbm_bytes[h], self.micro_batches[m], self.recompute[r])
    }

    /// Refuses rows another model wrote. `run.toml` pins the inputs (paths and digests), not
    /// the model: a tandem whose cost model changed since would mix two models' rows in one
    /// sweep, so a few finished points with a plan — the first, the middle and the last — are
    /// evaluated again and must give the plan columns they were written with (results are
    /// deterministic).
    pub(super) fn check_rows_reproduce(
        &self,
        path: &Path,
        rows: &[DesignRow],
    ) -> Result<(), SweepError> {
        let ok: Vec<(&PlanSummary, u64, &DesignRow)> = rows
            .iter()
            .filter_map(|r| Some((r.plan()?, r.point?, r)))
            .collect();
        let sample: BTreeSet<usize> = [0, ok.len() / 2, ok.len().saturating_sub(1)]
            .into_iter()
            .filter(|&i| i < ok.len())
            .collect();
        for (was, id, row) in sample.into_iter().map(|i| ok[i]) {
            let (config, w, ..) = self.point_parts(id as usize);
            let arch = self.config(config)?;
            let cache = ScheduleCache::new(self.solver)?;
            let now = evaluate_on(
                &self.workloads[w],
                &CostModel::new(&arch),
                &self.point_options(id as usize),
                &cache,
            );
            let difference = match &now {
                Ok(e) => DesignRow::evaluated(&arch, e)
                    .plan()
                    .and_then(|now| plan_difference(was, now)),
                Err(_) => Some("a plan, and it has none now".to_string()),
            };
            if let Some(difference) = difference {
                return Err(SweepError::Input(format!(
                    "{}: point {id} ({} on {}) was written with {difference}: the finished rows \
                     come from another model or other inputs (another build of tandem, inputs \
                     run.toml does not pin, or an edited file); start the sweep afresh in an \
                     empty directory",
                    path.display(),
                    row.workload,
                    row.arch,
                )));
            }
        }
        Ok(())
    }

    /// Checks the rows of a `points.csv` written for `shard` of this sweep: point ids strictly
    /// increasing (no duplicates) and owned by the shard, each row describing its own point
    /// (configuration, workload, HBM, micro-batch, recompute), and each `ok` row internally
    /// consistent (samples/s × s per batch = the global batch, no faster than the screen's
    /// bound, MFU in [0, 1], peak memory within the HBM, no more devices than the cluster).
    pub(super) fn check_rows(
        &self,
        path: &Path,
        rows: &[DesignRow],
        shard: Shard,
    ) -> Result<(), SweepError> {
        let total = self.space.len() as u64 * self.points_per_config();
        let mut previous: Option<u64> = None;
        for (i, row) in rows.iter().enumerate() {
            // Line 1 is the header.
            let bad = |why: String| {
                SweepError::Input(format!(
                    "{}: line {}: {why}; the file was edited or corrupted: start the sweep \
                     afresh in an empty directory",
                    path.display(),
                    i + 2
                ))
            };
            let id = row
                .point
                .ok_or_else(|| bad("the row has no point id".into()))?;
            match previous {
                Some(p) if id == p => return Err(bad(format!("point {id} is listed twice"))),
                Some(p) if id < p => {
                    return Err(bad(format!(
                        "point {id} comes after point {p}: rows are out of order"
                    )))
                }
                _ => {}
            }
            previous = Some(id);
            if id >= total {
                return Err(bad(format!(
                    "point {id} is outside the sweep's {total} points"
                )));
            }
            let (config, w, h, m, r) = self.point_parts(id as usize);
            if !shard.owns(config) {
                return Err(bad(format!(
                    "point {id} (configuration {config}) is not in shard {}/{}",
                    shard.index, shard.count
                )));
            }
            let workload = &self.workloads[w];
            let describes_point = row.config == Some(config as u64)
                && row.workload == workload.name
                && row.hbm_bytes == self.hbm_bytes[h]
                && row.micro_batch == Some(self.micro_batches[m])
                && row.recompute == Some(self.recompute[r]);
            if !describes_point {
                return Err(bad(format!(
                    "the row does not describe point {id} (configuration {config}, workload \
                     `{}`, HBM {} B, micro-batch {}, recompute {})",
                    workload.name, self.hbm_bytes[h], self.micro_batches[m], self.recompute[r]
                )));
            }
            let Some(plan) = row.plan() else {
                continue;
            };
            let (time_s, samples_per_s) = (plan.time_per_batch_s, plan.throughput_samples_per_s);
            let batch = workload.global_batch as f64;
            if !(time_s > 0.0 && (samples_per_s * time_s - batch).abs() <= 1e-6 * batch) {
                return Err(bad(format!(
                    "{samples_per_s} samples/s × {time_s} s per batch is not the global batch \
                     {batch}"
                )));
            }
            if let Some(bound) = row.bound_samples_per_s.filter(|_| self.prune) {
                if samples_per_s > bound * (1.0 + 1e-6) {
                    return Err(bad(format!(
                        "{samples_per_s} samples/s is above the screen's upper bound {bound}"
                    )));
                }
            }
            if !(0.0..=1.0).contains(&plan.mfu) {
                return Err(bad(format!("MFU {} is outside [0, 1]", plan.mfu)));
            }
            if plan.peak_memory_bytes > row.hbm_bytes {
                return Err(bad(format!(
                    "peak memory {} B exceeds the HBM of {} B",
                    plan.peak_memory_bytes, row.hbm_bytes
                )));
            }
            if plan.devices_used > self.devices {
                return Err(bad(format!(
                    "{} devices used of a {}-device cluster",
                    plan.devices_used, self.devices
                )));
            }
        }
        Ok(())
    }

    /// Points of the sweep that `shard` owns.
    pub(super) fn shard_points(&self, shard: Shard) -> u64 {
        (0..self.space.len()).filter(|&c| shard.owns(c)).count() as u64 * self.points_per_config()
    }

    pub(super) fn config(&self, index: usize) -> Result<ArchConfig, SweepError> {
        self.space
            .get(index)
            .ok_or_else(|| SweepError::Input(format!("configuration {index} is outside the space")))
    }
}

/// The first plan column of `now` that differs from `was` (times and energies to 1e-9
/// relative), as "<column> <was>, and <now> now".
fn plan_difference(was: &PlanSummary, now: &PlanSummary) -> Option<String> {
    let counts = [
        ("tp", u64::from(was.tp), u64::from(now.tp)),
        ("dp", u64::from(was.dp), u64::from(now.dp)),
        ("pp", u64::from(was.pp), u64::from(now.pp)),
        (
            "peak_memory_bytes",
            was.peak_memory_bytes,
            now.peak_memory_bytes,
        ),
    ];
    let reals = [
        (
            "time_per_batch_s",
            was.time_per_batch_s,
            now.time_per_batch_s,
        ),
        (
            "energy_per_sample_j",
            was.energy_per_sample_j,
            now.energy_per_sample_j,
        ),
    ];
    counts
        .into_iter()
        .find(|(_, a, b)| a != b)
        .map(|(column, a, b)| (column, a.to_string(), b.to_string()))
        .or_else(|| {
            reals
                .into_iter()
                .find(|(_, a, b)| (a - b).abs() > 1e-9 * a.abs().max(b.abs()))
                .map(|(column, a, b)| (column, format!("{a:.6e}"), format!("{b:.6e}")))
        })
        .map(|(column, a, b)| format!("{column} {a}, and {b} now"))
}

/// A configuration's chip as its exact points share it.
pub(super) struct Chip {
    pub config: usize,
    pub cost: CostModel,
    /// Layer schedules of this chip, shared by its exact points.
    pub cache: ScheduleCache,
}

impl Chip {
    pub(super) fn new(
        config: usize,
        arch: &ArchConfig,
        solver: SolverOptions,
    ) -> Result<Chip, SweepError> {
        Ok(Chip {
            config,
            cost: CostModel::new(arch),
            cache: ScheduleCache::new(solver)?,
        })
    }
}

/// One configuration's rows between the screen and the exact evaluation; the exact points of
/// a chunk of configurations are evaluated in parallel, sharing their chip's memo.
struct ChipRows {
    chip: Chip,
    rows: Vec<PendingRow>,
}

impl ChipRows {
    fn exact_points(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| matches!(r, PendingRow::Exact(_)))
            .count()
    }
}

enum PendingRow {
    Decided(Box<DesignRow>),
    Exact(ExactPoint),
}

/// A design point to evaluate exactly, with what the screen knows of it.
pub(super) struct ExactPoint {
    pub id: u64,
    pub workload: usize,
    pub hbm: u64,
    pub micro_batch: u32,
    pub recompute: RecomputeMode,
    pub achievable: Option<f64>,
    pub bound: Option<f64>,
    /// The tensor widths the evaluation searches, where a memory check showed that no plan of
    /// the others fits (so the answer is the same, without scheduling their layers); `None`:
    /// every width.
    pub fitting_widths: Option<Vec<u32>>,
}

/// Which part of a sweep a run does. A sweep split over machines runs `Screen` for every
/// shard, then `Exact` for every shard with all the shards' screens, so that each does a
/// share of both passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Both passes: the screen of the whole space, then this shard's exact points.
    Whole,
    /// The screen of block 0, which seeds every other block's, written to `seed.csv`: run
    /// once before the shards' screen passes so that they need not each screen it.
    Seed,
    /// The screen of this shard's blocks only, written to `screen.csv`, seeded from the
    /// `seed.csv` in `seed` where given (else block 0 is screened here).
    Screen { seed: Option<PathBuf> },
    /// This shard's exact points, pruned by the joined screens of these shard directories
    /// (every block screened once).
    Exact { screens: Vec<PathBuf> },
}

impl Phase {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Phase::Whole => "screen+exact",
            Phase::Seed => "seed",
            Phase::Screen { .. } => "screen",
            Phase::Exact { .. } => "exact",
        }
    }
}

/// Where a sweep writes, and how it reports progress.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub out_dir: PathBuf,
    pub shard: Shard,
    pub resume: bool,
    pub progress: bool,
    pub phase: Phase,
}

pub const POINTS_CSV: &str = "points.csv";
pub const RUN_TOML: &str = "run.toml";
pub const SHARD_TOML: &str = "shard.toml";
pub const SCREEN_CSV: &str = "screen.csv";

/// Reason recorded for the points of pruned hardware on which no plan fits in memory.
const NO_PLAN_FITS: &str = "no plan fits in memory (found while bounding; the hardware is pruned)";

/// Reason recorded for a point on which the screen found that no plan fits in memory.
const NO_PLAN_FITS_SCREENED: &str = "no plan fits in memory: every t, p, d and stage split runs out of HBM (`tandem plan` on this point shows by how much)";

/// Configurations screened together (their rows looked up in parallel), per thread.
const CHUNK_PER_THREAD: usize = 16;
/// Exact points evaluated together between two appends to `points.csv`, per thread: most
/// configurations are pruned whole, so batching by configuration left a thread idle behind
/// each batch's slowest point.
const EXACT_PER_THREAD: usize = 32;
/// Most configurations held back between two appends, so that a sparse stretch of the
/// space still reaches the file (and the progress bar) in bounded memory.
const MAX_CONFIGS_PER_APPEND: usize = 1024;

/// The rows of `chips` in point order: their exact points evaluated in parallel, with the
/// rows the screen decided.
fn evaluate_pending(sweep: &Sweep, chips: Vec<ChipRows>) -> Vec<DesignRow> {
    let exact: Vec<(&Chip, &ExactPoint)> = chips
        .iter()
        .flat_map(|chip| {
            chip.rows.iter().filter_map(move |r| match r {
                PendingRow::Exact(point) => Some((&chip.chip, point)),
                PendingRow::Decided(_) => None,
            })
        })
        .collect();
    let mut rows: Vec<DesignRow> = exact
        .par_iter()
        .map(|&(chip, point)| sweep.exact_row(chip, point))
        .collect();
    rows.extend(chips.into_iter().flat_map(|chip| {
        chip.rows.into_iter().filter_map(|r| match r {
            PendingRow::Decided(row) => Some(*row),
            PendingRow::Exact(_) => None,
        })
    }));
    rows.sort_by_key(|r| r.point);
    rows
}

/// Runs the sweep's shard into `options.out_dir`: `points.csv` streamed (the summaries are
/// written by [`super::finish`]), or for [`Phase::Screen`] its blocks' `screen.csv`. Keeps
/// `status.json` current, and marks it failed when the run fails.
pub fn run_sweep(
    sweep: &Sweep,
    record: &SweepRecord,
    options: &RunOptions,
) -> Result<SweepStats, SweepError> {
    sweep.validate()?;
    let out = &options.out_dir;
    let _lock = DirLock::acquire(out)?;
    let mut status = None;
    let result = run_locked(sweep, record, options, &mut status);
    if let (Err(e), Some(status)) = (&result, status.as_mut()) {
        status.failed(&e.to_string());
    }
    result
}

fn run_locked(
    sweep: &Sweep,
    record: &SweepRecord,
    options: &RunOptions,
    status: &mut Option<StatusFile>,
) -> Result<SweepStats, SweepError> {
    let out = &options.out_dir;
    let points_path = out.join(POINTS_CSV);
    let run_path = out.join(RUN_TOML);
    let shard_path = out.join(SHARD_TOML);
    let record = record.with_input_digests()?;
    let record_text = toml::to_string(&record).map_err(|e| io_error(&run_path, e))?;
    if sweep.prunes_energy() && (options.phase != Phase::Whole || options.shard != Shard::WHOLE) {
        return Err(SweepError::Input(
            "--objective energy: a pruned energy sweep runs whole (each point it evaluates \
             decides which others are pruned); drop --shard/--phase, or pass --no-prune to \
             split an unpruned one"
                .into(),
        ));
    }
    let finished: Vec<DesignRow> = if options.resume {
        let previous = std::fs::read_to_string(&run_path).map_err(|e| io_error(&run_path, e))?;
        if previous != record_text {
            let difference = toml::from_str::<SweepRecord>(&previous).map_or_else(
                |e| Some(format!("its run.toml does not parse: {e}")),
                |p| record.difference(&p),
            );
            if let Some(difference) = difference {
                return Err(SweepError::Input(format!(
                    "{}: --resume needs the same inputs and settings as the interrupted run \
                     ({difference})",
                    run_path.display()
                )));
            }
        }
        let previous_shard = read_shard(&shard_path)?;
        if previous_shard != options.shard {
            return Err(SweepError::Input(format!(
                "{}: --shard: this directory holds shard {}/{}, not {}/{}",
                out.display(),
                previous_shard.index,
                previous_shard.count,
                options.shard.index,
                options.shard.count
            )));
        }
        let rows = finished_rows(&points_path)?;
        if sweep.prunes_energy() {
            // An unfinished energy sweep holds its rows in visiting order, which its resume
            // replays.
            let mut sorted = rows.clone();
            sorted.sort_by_key(|r| r.point);
            sweep.check_rows(&points_path, &sorted, options.shard)?;
        } else {
            sweep.check_rows(&points_path, &rows, options.shard)?;
        }
        sweep.check_rows_reproduce(&points_path, &rows)?;
        rows
    } else {
        if points_path.exists() {
            return Err(SweepError::Input(format!(
                "{}: exists; pass --resume to continue that sweep or choose another --out",
                points_path.display()
            )));
        }
        // The shard record first: a run killed in between leaves no run.toml, so it is
        // started afresh rather than resumed as another shard.
        if options.shard == Shard::WHOLE {
            if shard_path.exists() {
                std::fs::remove_file(&shard_path).map_err(|e| io_error(&shard_path, e))?;
            }
        } else {
            let text = toml::to_string(&options.shard).map_err(|e| io_error(&shard_path, e))?;
            crate::output::write_atomic(&shard_path, text.as_bytes())
                .map_err(|e| io_error(&shard_path, e))?;
        }
        crate::output::write_atomic(&run_path, record_text.as_bytes())
            .map_err(|e| io_error(&run_path, e))?;
        Vec::new()
    };
    let owned_points = sweep.shard_points(options.shard);
    let evaluating = matches!(options.phase, Phase::Whole | Phase::Exact { .. });
    if evaluating && options.resume && finished.len() as u64 == owned_points {
        // A finished sweep resumed (`compare --resume`, `study --resume`): nothing to screen.
        StatusFile::start(
            out,
            options.phase.name(),
            "points",
            owned_points,
            owned_points,
        )
        .done();
        return Ok(SweepStats {
            configurations: (0..sweep.space.len())
                .filter(|&c| options.shard.owns(c))
                .count(),
            points: owned_points,
            skipped: owned_points,
            ..SweepStats::default()
        });
    }
    if sweep.prunes_energy() {
        return super::energy::run(sweep, options, &finished, status);
    }
    let done: BTreeSet<u64> = finished.iter().filter_map(|r| r.point).collect();

    match &options.phase {
        Phase::Seed => return seed_phase(sweep, options),
        Phase::Screen { seed } => return screen_phase(sweep, &record_text, seed, options, status),
        Phase::Whole | Phase::Exact { .. } => {}
    }
    let owned: Vec<usize> = (0..sweep.space.len())
        .filter(|&c| options.shard.owns(c))
        .collect();
    let per_config = sweep.points_per_config();
    let status = status.insert(StatusFile::start(
        out,
        options.phase.name(),
        "points",
        owned.len() as u64 * per_config,
        done.len() as u64,
    ));
    let started = Instant::now();
    let screen = match &options.phase {
        Phase::Exact { screens } => read_screens(sweep, &record_text, screens, options.shard)?,
        _ => sweep.screen(options.progress)?,
    };
    let screen_time_s = started.elapsed().as_secs_f64();

    let mut stats = SweepStats {
        configurations: owned.len(),
        points: owned.len() as u64 * per_config,
        screen_time_s,
        ..SweepStats::default()
    };
    stats.set_screen(&screen.stats);
    let bar = progress_bar(
        options.progress,
        owned.len() as u64,
        "evaluating",
        "configurations",
    );
    let threads = rayon::current_num_threads().max(1);
    let (mut file, mut header_written) = open_points(&points_path)?;
    let mut pending: Vec<ChipRows> = Vec::new();
    let (mut pending_exact, mut pending_configs) = (0, 0);
    let mut chunks = owned.chunks(threads * CHUNK_PER_THREAD).peekable();
    while let Some(configs) = chunks.next() {
        let chips: Vec<ChipRows> = configs
            .par_iter()
            .filter(|&&c| {
                let first = c as u64 * per_config;
                !(first..first + per_config).all(|id| done.contains(&id))
            })
            .map(|&c| sweep.config_rows(c, &screen, &done))
            .collect::<Result<_, SweepError>>()?;
        pending_exact += chips.iter().map(ChipRows::exact_points).sum::<usize>();
        pending_configs += configs.len();
        pending.extend(chips);
        let full = pending_exact >= threads * EXACT_PER_THREAD
            || pending_configs >= MAX_CONFIGS_PER_APPEND;
        if !full && chunks.peek().is_some() {
            continue;
        }
        let rows = evaluate_pending(sweep, std::mem::take(&mut pending));
        stats.count(&rows);
        write_rows(&mut file, &points_path, &rows, !header_written)?;
        header_written |= !rows.is_empty();
        bar.inc(pending_configs as u64);
        (pending_exact, pending_configs) = (0, 0);
        status.progress(done.len() as u64 + stats.ok + stats.infeasible + stats.pruned);
    }
    bar.finish_and_clear();
    status.done();
    stats.skipped = done.len() as u64;
    stats.sweep_time_s = started.elapsed().as_secs_f64();
    Ok(stats)
}

/// One row of `screen.csv`: what the screen knows of a point.
#[derive(Debug, Serialize, Deserialize)]
struct ScreenRow {
    point: u64,
    area_mm2: f64,
    /// Empty: no plan fits in memory.
    bound_samples_per_s: Option<f64>,
    /// Empty: not searched, or nothing beat the block's staircase.
    achievable_samples_per_s: Option<f64>,
}

/// The screen blocks shard `shard` screens in a split sweep: block `b` goes to shard
/// `b mod n`.
fn shard_blocks(sweep: &Sweep, shard: Shard) -> Vec<usize> {
    (0..super::screen::screen_blocks(sweep.space.len()))
        .filter(|&b| b as u64 % u64::from(shard.count) == u64::from(shard.index))
        .collect()
}

/// The screen phase of a split sweep: this shard's blocks into `screen.csv` (written whole;
/// a run finding it already there has nothing to do).
fn screen_phase(
    sweep: &Sweep,
    record_text: &str,
    seed: &Option<PathBuf>,
    options: &RunOptions,
    status: &mut Option<StatusFile>,
) -> Result<SweepStats, SweepError> {
    let path = options.out_dir.join(SCREEN_CSV);
    let blocks = shard_blocks(sweep, options.shard);
    let configs: u64 = blocks
        .iter()
        .map(|&b| sweep.configs_in_block(b) as u64)
        .sum();
    let mut stats = SweepStats {
        configurations: configs as usize,
        ..SweepStats::default()
    };
    if options.resume && path.exists() {
        stats.skipped = configs;
        return Ok(stats);
    }
    if !sweep.screens() {
        return Err(SweepError::Input(
            "--phase screen: this sweep does not prune (--no-prune or --objective energy), so \
             it has no screen to split: run its shards without --phase"
                .into(),
        ));
    }
    let status = status.insert(StatusFile::start(
        &options.out_dir,
        "screen",
        "configurations",
        configs,
        0,
    ));
    let started = Instant::now();
    let seed = seed
        .as_ref()
        .map(|dir| read_seed(sweep, record_text, dir))
        .transpose()?;
    let screened = sweep.screen_of_blocks(&blocks, seed, options.progress, |done| {
        status.progress(done);
    })?;
    let mut rows = Vec::new();
    let mut screen_stats = super::screen::ScreenStats::default();
    for one in screened {
        screen_stats.add(&one.stats);
        rows.extend(screen_rows(one.points));
    }
    stats.set_screen(&screen_stats);
    write_screen_rows(&path, rows)?;
    status.done();
    stats.screen_time_s = started.elapsed().as_secs_f64();
    stats.sweep_time_s = stats.screen_time_s;
    Ok(stats)
}

pub const SEED_CSV: &str = "seed.csv";
/// The pilot's points with an achievable throughput, beside `seed.csv` (the seed step of a
/// split sweep; README, "Scale-out").
pub const PILOT_CSV: &str = "pilot.csv";

/// Writes a screen's rows (by point id) as CSV to `path`, whole.
fn write_screen_rows(path: &Path, mut rows: Vec<ScreenRow>) -> Result<(), SweepError> {
    rows.sort_by_key(|r| r.point);
    let bytes = report::csv::to_bytes(&rows, true).map_err(|e| io_error(path, e))?;
    crate::output::write_atomic(path, &bytes).map_err(|e| io_error(path, e))
}

fn screen_rows(points: Vec<(u64, Screened)>) -> impl Iterator<Item = ScreenRow> {
    points.into_iter().map(|(point, p)| ScreenRow {
        point,
        area_mm2: p.area_mm2,
        bound_samples_per_s: p.bound,
        achievable_samples_per_s: p.achievable,
    })
}

/// The points of a `screen.csv`, `seed.csv` or `pilot.csv` that `accept(row number, row)`
/// keeps (`Ok(false)`: skip; an error refuses the file).
fn read_screen_rows(
    path: &Path,
    mut accept: impl FnMut(usize, &ScreenRow) -> Result<bool, SweepError>,
) -> Result<Vec<(u64, Screened)>, SweepError> {
    let mut reader = csv::Reader::from_path(path).map_err(|e| io_error(path, e))?;
    let mut points = Vec::new();
    for (i, row) in reader.deserialize::<ScreenRow>().enumerate() {
        let row: ScreenRow = row.map_err(|e| io_error(path, format!("row {}: {e}", i + 1)))?;
        if accept(i + 1, &row)? {
            points.push((
                row.point,
                Screened {
                    area_mm2: row.area_mm2,
                    bound: row.bound_samples_per_s,
                    achievable: row.achievable_samples_per_s,
                },
            ));
        }
    }
    Ok(points)
}

/// The seed step of a split sweep: block 0's screen into `seed.csv` (a run finding it there
/// has nothing to do).
fn seed_phase(sweep: &Sweep, options: &RunOptions) -> Result<SweepStats, SweepError> {
    if !sweep.screens() {
        return Err(SweepError::Input(
            "--phase seed: this sweep does not prune, so it has no screen to seed".into(),
        ));
    }
    let path = options.out_dir.join(SEED_CSV);
    let mut stats = SweepStats::default();
    if options.resume && path.exists() {
        return Ok(stats);
    }
    let started = Instant::now();
    let seed = sweep.seed()?;
    let mut screen_stats = seed.block.stats;
    screen_stats.add(&seed.stats);
    stats.set_screen(&screen_stats);
    stats.configurations = sweep.configs_in_block(0);
    // The pilot first: a seed directory with `seed.csv` is complete.
    write_screen_rows(
        &options.out_dir.join(PILOT_CSV),
        screen_rows(seed.pilot).collect(),
    )?;
    write_screen_rows(&path, screen_rows(seed.block.points).collect())?;
    stats.screen_time_s = started.elapsed().as_secs_f64();
    stats.sweep_time_s = stats.screen_time_s;
    Ok(stats)
}

/// Block 0's screen and the pilot from a seed directory of this sweep.
fn read_seed(
    sweep: &Sweep,
    record_text: &str,
    dir: &Path,
) -> Result<super::screen::Seed, SweepError> {
    let run_path = dir.join(RUN_TOML);
    let text = std::fs::read_to_string(&run_path).map_err(|e| io_error(&run_path, e))?;
    if text != record_text {
        return Err(SweepError::Input(format!(
            "{}: --seed: not the seed of this sweep (its run.toml differs)",
            run_path.display()
        )));
    }
    let block = read_block_rows(sweep, &dir.join(SEED_CSV), &[0], |_| true)?;
    let path = dir.join(PILOT_CSV);
    let count = super::screen::screen_blocks(sweep.space.len());
    let pilot = read_screen_rows(&path, |i, row| {
        let config = (row.point / sweep.points_per_config()) as usize;
        if config >= sweep.space.len() || config.is_multiple_of(count) {
            return Err(io_error(
                &path,
                format!(
                    "row {i}: point {} is not a pilot point of this sweep",
                    row.point
                ),
            ));
        }
        if row.achievable_samples_per_s.is_none() {
            return Err(io_error(
                &path,
                format!("row {i}: achievable_samples_per_s: missing"),
            ));
        }
        Ok(true)
    })?;
    Ok(super::screen::Seed {
        block,
        pilot,
        stats: super::screen::ScreenStats::default(),
    })
}

/// The rows of a `screen.csv` or `seed.csv` that must hold exactly the points of `blocks`;
/// only those `keep` accepts are returned.
fn read_block_rows(
    sweep: &Sweep,
    path: &Path,
    blocks: &[usize],
    keep: impl Fn(&ScreenRow) -> bool,
) -> Result<super::screen::BlockScreen, SweepError> {
    let count = super::screen::screen_blocks(sweep.space.len());
    let per = sweep.points_per_config();
    let mut rows = 0u64;
    let points = read_screen_rows(path, |i, row| {
        let config = (row.point / per) as usize;
        if config >= sweep.space.len() || !blocks.contains(&(config % count)) {
            return Err(io_error(
                path,
                format!("row {i}: point {} is not in its blocks", row.point),
            ));
        }
        rows += 1;
        Ok(keep(row))
    })?;
    let expected: u64 = blocks
        .iter()
        .map(|&b| sweep.configs_in_block(b) as u64 * per)
        .sum();
    if rows != expected {
        return Err(io_error(
            path,
            format!(
                "holds {rows} points of the {expected} its blocks have: rerun the pass that writes it"
            ),
        ));
    }
    Ok(super::screen::BlockScreen {
        points,
        stats: super::screen::ScreenStats::default(),
    })
}

/// The screen of the whole space from the `screen.csv` of shard directories `dirs`: each must
/// be a shard of this sweep (the same `run.toml`) whose screen phase finished, and together
/// they must screen every block once.
fn read_screens(
    sweep: &Sweep,
    record_text: &str,
    dirs: &[PathBuf],
    shard: Shard,
) -> Result<Screen, SweepError> {
    if !sweep.screens() {
        return Err(SweepError::Input(
            "--phase exact: this sweep does not prune, so it has no screen: run its shards \
             without --phase"
                .into(),
        ));
    }
    let count = super::screen::screen_blocks(sweep.space.len());
    let mut owner: Vec<Option<PathBuf>> = vec![None; count];
    let mut blocks = Vec::with_capacity(dirs.len());
    for dir in dirs {
        let run_path = dir.join(RUN_TOML);
        let text = std::fs::read_to_string(&run_path).map_err(|e| io_error(&run_path, e))?;
        if text != record_text {
            return Err(SweepError::Input(format!(
                "{}: not a shard of this sweep (its run.toml differs)",
                run_path.display()
            )));
        }
        let theirs = read_shard(&dir.join(SHARD_TOML))?;
        let mine = shard_blocks(sweep, theirs);
        for &b in &mine {
            if let Some(other) = &owner[b] {
                return Err(SweepError::Input(format!(
                    "--screens: {} and {} both screen block {b} (shards of one count, each once)",
                    other.display(),
                    dir.display()
                )));
            }
            owner[b] = Some(dir.clone());
        }
        let path = dir.join(SCREEN_CSV);
        if !path.exists() {
            return Err(SweepError::Input(format!(
                "{}: missing: shard {}/{}'s screen phase has not finished (run it with --phase \
                 screen)",
                path.display(),
                theirs.index,
                theirs.count
            )));
        }
        // Other shards' points matter only through their achievable throughputs.
        let per = sweep.points_per_config();
        let keep = |row: &ScreenRow| {
            row.achievable_samples_per_s.is_some() || shard.owns((row.point / per) as usize)
        };
        blocks.push(read_block_rows(sweep, &path, &mine, keep)?);
    }
    if let Some(b) = owner.iter().position(Option::is_none) {
        return Err(SweepError::Input(format!(
            "--screens: no directory screens block {b} of {count}: give every shard's directory"
        )));
    }
    let per = sweep.points_per_config();
    Ok(Screen::join(sweep, blocks, |id| {
        shard.owns((id / per) as usize)
    }))
}

pub(super) fn progress_bar(show: bool, len: u64, what: &str, unit: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{msg}} {{bar:40}} {{pos}}/{{len}} {unit}  {{per_sec}}  ETA {{eta}}"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_string());
    bar
}

/// `points.csv` opened for appending, and whether it already holds the header.
pub(super) fn open_points(path: &Path) -> Result<(File, bool), SweepError> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    let header_written = file.metadata().map_err(|e| io_error(path, e))?.len() > 0;
    Ok((file, header_written))
}

/// `rows` as CSV bytes, with the header first when asked.
pub(crate) fn rows_csv(
    path: &Path,
    rows: &[DesignRow],
    header: bool,
) -> Result<Vec<u8>, SweepError> {
    report::csv::to_bytes(rows, header).map_err(|e| io_error(path, e))
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
    let bytes = rows_csv(path, rows, header)?;
    file.write_all(&bytes).map_err(|e| io_error(path, e))?;
    file.flush().map_err(|e| io_error(path, e))
}

/// The first value that appears twice in `values` (command-line lists are refused with it).
pub fn first_repeated<T: PartialEq>(values: &[T]) -> Option<&T> {
    values
        .iter()
        .enumerate()
        .find(|(i, v)| values[..*i].contains(v))
        .map(|(_, v)| v)
}

/// The shard a directory's `shard.toml` records (the whole sweep when there is none).
pub(super) fn read_shard(path: &Path) -> Result<Shard, SweepError> {
    if !path.exists() {
        return Ok(Shard::WHOLE);
    }
    let text = std::fs::read_to_string(path).map_err(|e| io_error(path, e))?;
    let shard: Shard = toml::from_str(&text).map_err(|e| io_error(path, e))?;
    if shard.count == 0 || shard.index >= shard.count {
        return Err(io_error(
            path,
            format!("shard {}/{}: need 0 ≤ i < n", shard.index, shard.count),
        ));
    }
    Ok(shard)
}

/// The rows already in `points.csv`, after cutting off a last line that a killed run left
/// unfinished.
fn finished_rows(path: &Path) -> Result<Vec<DesignRow>, SweepError> {
    if !path.exists() {
        return Ok(Vec::new());
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
    read_points(path)
}

/// Every row of a `points.csv`.
pub fn read_points(path: &Path) -> Result<Vec<DesignRow>, SweepError> {
    read_points_where(path, |_| true)
}

/// The rows of a `points.csv` that `keep` accepts, read one at a time (a sweep's summaries
/// need only its few rows with a plan, not the millions pruned).
pub(super) fn read_points_where(
    path: &Path,
    keep: impl Fn(&DesignRow) -> bool,
) -> Result<Vec<DesignRow>, SweepError> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let mut reader = csv::Reader::from_reader(BufReader::new(file));
    let mut rows = Vec::new();
    for (i, row) in reader.deserialize::<DesignRow>().enumerate() {
        let row = row.map_err(|e| io_error(path, format!("row {}: {e}", i + 1)))?;
        if keep(&row) {
            rows.push(row);
        }
    }
    Ok(rows)
}
