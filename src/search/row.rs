//! One design point and its outcome (docs/design.md §9), shared by `tandem plan --csv` and
//! sweeps: [`DesignRow`] with an [`Outcome`] (a plan, no plan, or pruned), written and read
//! as the flat CSV row [`PointRecord`] (the same fields in `best.json`). Evaluation times are
//! printed, not stored, so that equal inputs give equal files.

use crate::arch::{area_breakdown, ArchConfig};
use crate::model::{EvaluateError, Evaluation};
use crate::placement::{RecomputeMode, ZeroStage};
use crate::report;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One design point: the workload, the chip, the point's own choices and what it came to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "PointRecord", try_from = "PointRecord")]
pub struct DesignRow {
    pub workload: String,
    pub arch: String,
    pub tensor_cores: u32,
    pub tensor_rows: u32,
    pub tensor_cols: u32,
    pub vector_cores: u32,
    pub vector_lanes: u32,
    pub glb_bytes: u64,
    pub area_mm2: f64,
    /// `None` when a failed point searched several values.
    pub micro_batch: Option<u32>,
    pub recompute: Option<RecomputeMode>,
    pub hbm_bytes: u64,
    pub outcome: Outcome,
    /// Sweeps only: the point's id (its position in the sweep's order).
    pub point: Option<u64>,
    /// Sweeps only: the configuration's index in the search space.
    pub config: Option<u64>,
    /// Sweeps that prune: the screen's upper bound on samples/s (0 when no plan fits), for
    /// every outcome.
    pub bound_samples_per_s: Option<f64>,
}

/// What a design point came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Its best plan.
    Ok(PlanSummary),
    /// No plan: why, on one line.
    Infeasible { reason: String },
    /// Not evaluated: a sound bound shows it cannot matter (sweeps only).
    Pruned(Pruning),
}

/// The figures of a point's best plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanSummary {
    pub tp: u32,
    pub dp: u32,
    pub pp: u32,
    /// The ZeRO stage the plan shards its training state with.
    pub zero: ZeroStage,
    /// Expert-parallel width (1 without experts).
    pub ep: u32,
    pub devices_used: u32,
    pub time_per_batch_s: f64,
    pub throughput_samples_per_s: f64,
    pub throughput_tokens_per_s: f64,
    pub mfu: f64,
    pub peak_memory_bytes: u64,
    pub energy_per_sample_j: f64,
}

/// Why a point was pruned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pruning {
    /// Throughput sweeps: the screen bound (the row's `bound_samples_per_s`) is below what
    /// another point reaches at no larger area.
    Throughput {
        /// The point that beats the bound (`by` its id).
        beaten_by: Reached,
        /// With several workloads: the hardware's mean bound over workloads, and the
        /// configuration that beats it (`by` its index, the samples/s its mean over
        /// workloads).
        set: Option<(f64, Reached)>,
    },
    /// Energy sweeps: the point's lower bound on joules per sample is above what an evaluated
    /// point spends at no larger area.
    Energy { bound_j: f64, beaten_by: SpentBy },
}

/// A throughput reached at an area, and what reached it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reached {
    pub by: u64,
    pub samples_per_s: f64,
    pub area_mm2: f64,
}

/// Joules per sample an evaluated point spends at an area, and which point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpentBy {
    pub by: u64,
    pub energy_per_sample_j: f64,
    pub area_mm2: f64,
}

impl Pruning {
    /// The `reason` column of a pruned row of `workload`, whose screen bound on samples/s is
    /// `bound` (throughput sweeps).
    fn reason(&self, workload: &str, bound: f64) -> String {
        match *self {
            Pruning::Throughput { beaten_by, set } => {
                let Reached {
                    by,
                    samples_per_s,
                    area_mm2,
                } = beaten_by;
                let set = set.map_or(String::new(), |(mean_bound, r)| {
                    format!(
                        "; mean over workloads at most {mean_bound:.4e} < {:.4e} reachable by \
                         configuration {} at {:.1} mm²",
                        r.samples_per_s, r.by, r.area_mm2
                    )
                });
                format!(
                    "pruned: {workload}: at most {bound:.4e} samples/s < {samples_per_s:.4e} \
                     reachable by point {by} at {area_mm2:.1} mm²{set}"
                )
            }
            Pruning::Energy { bound_j, beaten_by } => format!(
                "pruned: {workload}: at least {bound_j:.4e} J/sample > {:.4e} spent by point {} \
                 at {:.1} mm²",
                beaten_by.energy_per_sample_j, beaten_by.by, beaten_by.area_mm2
            ),
        }
    }

    /// The pruning a `reason` column states (the inverse of [`Pruning::reason`], to its
    /// precision).
    fn from_reason(reason: &str, workload: &str) -> Option<Pruning> {
        let reached = |text: &str, by_what: &str| -> Option<Reached> {
            let (samples_per_s, rest) = text.split_once(by_what)?;
            let (by, area) = rest.split_once(" at ")?;
            Some(Reached {
                by: by.parse().ok()?,
                samples_per_s: samples_per_s.parse().ok()?,
                area_mm2: area.parse().ok()?,
            })
        };
        let rest = reason.strip_prefix("pruned: ")?.strip_prefix(workload)?;
        if let Some(rest) = rest.strip_prefix(": at least ") {
            let (bound_j, rest) = rest.split_once(" J/sample > ")?;
            let spent = reached(rest.strip_suffix(" mm²")?, " spent by point ")?;
            return Some(Pruning::Energy {
                bound_j: bound_j.parse().ok()?,
                beaten_by: SpentBy {
                    by: spent.by,
                    energy_per_sample_j: spent.samples_per_s,
                    area_mm2: spent.area_mm2,
                },
            });
        }
        let rest = rest.strip_prefix(": at most ")?;
        let (_, rest) = rest.split_once(" samples/s < ")?;
        let (point, set) = rest.split_once(" mm²")?;
        let set = match set.strip_prefix("; mean over workloads at most ") {
            None if set.is_empty() => None,
            None => return None,
            Some(set) => {
                let (mean_bound, rest) = set.split_once(" < ")?;
                let by = reached(rest.strip_suffix(" mm²")?, " reachable by configuration ")?;
                Some((mean_bound.parse().ok()?, by))
            }
        };
        Some(Pruning::Throughput {
            beaten_by: reached(point, " reachable by point ")?,
            set,
        })
    }
}

impl DesignRow {
    /// A row of `workload` on `arch` with its outcome; no sweep fields.
    pub fn new(
        workload: &str,
        arch: &ArchConfig,
        micro_batch: Option<u32>,
        recompute: Option<RecomputeMode>,
        hbm_bytes: u64,
        outcome: Outcome,
    ) -> DesignRow {
        DesignRow {
            workload: workload.to_string(),
            arch: arch.name.clone(),
            tensor_cores: arch.tensor.count,
            tensor_rows: arch.tensor.rows,
            tensor_cols: arch.tensor.cols,
            vector_cores: arch.vector.count,
            vector_lanes: arch.vector.lanes,
            glb_bytes: arch.glb.bytes,
            area_mm2: area_breakdown(arch).total_mm2,
            micro_batch,
            recompute,
            hbm_bytes,
            outcome,
            point: None,
            config: None,
            bound_samples_per_s: None,
        }
    }

    /// The row of an evaluated point.
    pub fn evaluated(arch: &ArchConfig, e: &Evaluation) -> DesignRow {
        let p = &e.plan;
        DesignRow::new(
            &e.workload,
            arch,
            Some(p.micro_batch),
            Some(e.recompute),
            e.hbm_bytes,
            Outcome::Ok(PlanSummary {
                tp: p.tp,
                dp: p.dp,
                pp: p.pp,
                zero: p.zero,
                ep: p.ep,
                devices_used: p.devices_used,
                time_per_batch_s: p.time_per_batch_s,
                throughput_samples_per_s: p.throughput_samples_per_s,
                throughput_tokens_per_s: e.throughput_tokens_per_s,
                mfu: e.mfu,
                peak_memory_bytes: p.peak_memory_bytes,
                energy_per_sample_j: e.energy_per_sample_j,
            }),
        )
    }

    /// The row of a point without a plan, with the reason on one line.
    pub fn failed(
        workload: &str,
        arch: &ArchConfig,
        micro_batch: Option<u32>,
        recompute: Option<RecomputeMode>,
        hbm_bytes: u64,
        error: &EvaluateError,
    ) -> DesignRow {
        let reason = match error {
            EvaluateError::Infeasible(why) => why.reasons.join("; "),
            other => other.to_string(),
        };
        DesignRow::new(
            workload,
            arch,
            micro_batch,
            recompute,
            hbm_bytes,
            Outcome::Infeasible {
                reason: reason.replace('\n', " "),
            },
        )
    }

    /// The point's plan, if it has one.
    pub fn plan(&self) -> Option<&PlanSummary> {
        match &self.outcome {
            Outcome::Ok(plan) => Some(plan),
            Outcome::Infeasible { .. } | Outcome::Pruned(_) => None,
        }
    }
}

/// The `status` column: which [`Outcome`] a row holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Infeasible,
    Pruned,
}

/// A [`DesignRow`] as one flat CSV row: the plan columns are empty unless `status` is `ok`,
/// `reason` is empty when it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointRecord {
    pub workload: String,
    pub arch: String,
    pub tensor_cores: u32,
    pub tensor_rows: u32,
    pub tensor_cols: u32,
    pub vector_cores: u32,
    pub vector_lanes: u32,
    pub glb_bytes: u64,
    pub area_mm2: f64,
    pub micro_batch: Option<u32>,
    pub recompute: Option<RecomputeMode>,
    pub hbm_bytes: u64,
    pub tp: Option<u32>,
    pub dp: Option<u32>,
    pub pp: Option<u32>,
    pub zero: Option<ZeroStage>,
    pub ep: Option<u32>,
    pub devices_used: Option<u32>,
    pub time_per_batch_s: Option<f64>,
    pub throughput_samples_per_s: Option<f64>,
    pub throughput_tokens_per_s: Option<f64>,
    pub mfu: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
    pub energy_per_sample_j: Option<f64>,
    pub status: Status,
    pub reason: String,
    pub point: Option<u64>,
    pub config: Option<u64>,
    pub bound_samples_per_s: Option<f64>,
}

impl From<DesignRow> for PointRecord {
    fn from(row: DesignRow) -> PointRecord {
        let plan = row.plan().copied();
        let (status, reason) = match &row.outcome {
            Outcome::Ok(_) => (Status::Ok, String::new()),
            Outcome::Infeasible { reason } => (Status::Infeasible, reason.clone()),
            Outcome::Pruned(pruning) => (
                Status::Pruned,
                pruning.reason(&row.workload, row.bound_samples_per_s.unwrap_or(0.0)),
            ),
        };
        PointRecord {
            tp: plan.map(|p| p.tp),
            dp: plan.map(|p| p.dp),
            pp: plan.map(|p| p.pp),
            zero: plan.map(|p| p.zero),
            ep: plan.map(|p| p.ep),
            devices_used: plan.map(|p| p.devices_used),
            time_per_batch_s: plan.map(|p| p.time_per_batch_s),
            throughput_samples_per_s: plan.map(|p| p.throughput_samples_per_s),
            throughput_tokens_per_s: plan.map(|p| p.throughput_tokens_per_s),
            mfu: plan.map(|p| p.mfu),
            peak_memory_bytes: plan.map(|p| p.peak_memory_bytes),
            energy_per_sample_j: plan.map(|p| p.energy_per_sample_j),
            status,
            reason,
            workload: row.workload,
            arch: row.arch,
            tensor_cores: row.tensor_cores,
            tensor_rows: row.tensor_rows,
            tensor_cols: row.tensor_cols,
            vector_cores: row.vector_cores,
            vector_lanes: row.vector_lanes,
            glb_bytes: row.glb_bytes,
            area_mm2: row.area_mm2,
            micro_batch: row.micro_batch,
            recompute: row.recompute,
            hbm_bytes: row.hbm_bytes,
            point: row.point,
            config: row.config,
            bound_samples_per_s: row.bound_samples_per_s,
        }
    }
}

/// A record whose columns contradict its status: plan columns in a row without a plan, an
/// `ok` row missing one or with a reason, a pruned row whose reason is not what tandem writes.
impl TryFrom<PointRecord> for DesignRow {
    type Error = String;

    fn try_from(r: PointRecord) -> Result<DesignRow, String> {
        let plan = [
            ("tp", r.tp.is_some()),
            ("dp", r.dp.is_some()),
            ("pp", r.pp.is_some()),
            ("zero", r.zero.is_some()),
            ("ep", r.ep.is_some()),
            ("devices_used", r.devices_used.is_some()),
            ("time_per_batch_s", r.time_per_batch_s.is_some()),
            (
                "throughput_samples_per_s",
                r.throughput_samples_per_s.is_some(),
            ),
            (
                "throughput_tokens_per_s",
                r.throughput_tokens_per_s.is_some(),
            ),
            ("mfu", r.mfu.is_some()),
            ("peak_memory_bytes", r.peak_memory_bytes.is_some()),
            ("energy_per_sample_j", r.energy_per_sample_j.is_some()),
        ];
        let outcome = match r.status {
            Status::Ok => {
                if let Some((column, _)) = plan.iter().find(|(_, present)| !present) {
                    return Err(format!("an ok row without its {column}"));
                }
                if !r.reason.is_empty() {
                    return Err("an ok row with a reason".to_string());
                }
                Outcome::Ok(PlanSummary {
                    tp: r.tp.unwrap_or_default(),
                    dp: r.dp.unwrap_or_default(),
                    pp: r.pp.unwrap_or_default(),
                    zero: r.zero.unwrap_or_default(),
                    ep: r.ep.unwrap_or(1),
                    devices_used: r.devices_used.unwrap_or_default(),
                    time_per_batch_s: r.time_per_batch_s.unwrap_or_default(),
                    throughput_samples_per_s: r.throughput_samples_per_s.unwrap_or_default(),
                    throughput_tokens_per_s: r.throughput_tokens_per_s.unwrap_or_default(),
                    mfu: r.mfu.unwrap_or_default(),
                    peak_memory_bytes: r.peak_memory_bytes.unwrap_or_default(),
                    energy_per_sample_j: r.energy_per_sample_j.unwrap_or_default(),
                })
            }
            status => {
                if let Some((column, _)) = plan.iter().find(|(_, present)| *present) {
                    return Err(format!("a row without a plan has a {column}"));
                }
                if status == Status::Infeasible {
                    Outcome::Infeasible {
                        reason: r.reason.clone(),
                    }
                } else {
                    let pruning = Pruning::from_reason(&r.reason, &r.workload);
                    // An energy pruning states its bound in the reason; any other needs the
                    // bound column.
                    let bound = match pruning {
                        Some(Pruning::Energy { .. }) => r.bound_samples_per_s.unwrap_or(0.0),
                        _ => r
                            .bound_samples_per_s
                            .ok_or("a pruned row without its bound_samples_per_s")?,
                    };
                    let pruning = pruning
                        .filter(|p| p.reason(&r.workload, bound) == r.reason)
                        .ok_or_else(|| {
                            format!(
                                "a pruned row whose reason does not state its bound and the \
                                 point that beats it: `{}`",
                                r.reason
                            )
                        })?;
                    Outcome::Pruned(pruning)
                }
            }
        };
        Ok(DesignRow {
            workload: r.workload,
            arch: r.arch,
            tensor_cores: r.tensor_cores,
            tensor_rows: r.tensor_rows,
            tensor_cols: r.tensor_cols,
            vector_cores: r.vector_cores,
            vector_lanes: r.vector_lanes,
            glb_bytes: r.glb_bytes,
            area_mm2: r.area_mm2,
            micro_batch: r.micro_batch,
            recompute: r.recompute,
            hbm_bytes: r.hbm_bytes,
            outcome,
            point: r.point,
            config: r.config,
            bound_samples_per_s: r.bound_samples_per_s,
        })
    }
}

/// Appends `rows` to the CSV file at `path` (the header first when the file is new or empty)
/// and flushes; a non-empty file must start with the same header.
pub fn append_rows(path: &Path, rows: &[DesignRow]) -> std::io::Result<()> {
    report::csv::append(
        path,
        rows,
        "the file's first line is not tandem's design-point header; append to a file \
         `--csv` wrote before, or give a new file",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pruning_reads_back_from_its_reason() {
        let beaten_by = Reached {
            by: 616,
            samples_per_s: 4205.2,
            area_mm2: 99.9,
        };
        let one = Pruning::Throughput {
            beaten_by,
            set: None,
        };
        let two = Pruning::Throughput {
            beaten_by,
            set: Some((
                228.38,
                Reached {
                    by: 17,
                    samples_per_s: 1733.7,
                    area_mm2: 99.9,
                },
            )),
        };
        let three = Pruning::Energy {
            bound_j: 2.5316,
            beaten_by: SpentBy {
                by: 42,
                energy_per_sample_j: 2.4007,
                area_mm2: 151.3,
            },
        };
        assert_eq!(
            three.reason("gpt2-xl", 0.0),
            "pruned: gpt2-xl: at least 2.5316e0 J/sample > 2.4007e0 spent by point 42 at \
             151.3 mm²"
        );
        for pruning in [one, two, three] {
            let reason = pruning.reason("bert-large", 567.5262766602947);
            assert_eq!(Pruning::from_reason(&reason, "bert-large"), Some(pruning));
        }
        assert_eq!(
            two.reason("bert-large", 567.5262766602947),
            "pruned: bert-large: at most 5.6753e2 samples/s < 4.2052e3 reachable by point 616 \
             at 99.9 mm²; mean over workloads at most 2.2838e2 < 1.7337e3 reachable by \
             configuration 17 at 99.9 mm²"
        );
        assert_eq!(
            Pruning::from_reason("pruned: other: at most 1e0", "bert-large"),
            None
        );
    }

    #[test]
    fn a_record_contradicting_its_status_is_refused() {
        let record = PointRecord {
            workload: "w".into(),
            arch: "a".into(),
            tensor_cores: 1,
            tensor_rows: 1,
            tensor_cols: 1,
            vector_cores: 1,
            vector_lanes: 1,
            glb_bytes: 1,
            area_mm2: 1.0,
            micro_batch: Some(1),
            recompute: Some(RecomputeMode::None),
            hbm_bytes: 1,
            tp: None,
            dp: None,
            pp: None,
            zero: None,
            ep: None,
            devices_used: None,
            time_per_batch_s: None,
            throughput_samples_per_s: None,
            throughput_tokens_per_s: None,
            mfu: None,
            peak_memory_bytes: None,
            energy_per_sample_j: None,
            status: Status::Infeasible,
            reason: "no plan fits".into(),
            point: None,
            config: None,
            bound_samples_per_s: None,
        };
        let row = DesignRow::try_from(record.clone()).expect("consistent");
        assert_eq!(PointRecord::from(row), record);
        let with = |f: fn(&mut PointRecord)| {
            let mut r = record.clone();
            f(&mut r);
            DesignRow::try_from(r).expect_err("contradiction")
        };
        assert_eq!(with(|r| r.tp = Some(1)), "a row without a plan has a tp");
        assert_eq!(with(|r| r.status = Status::Ok), "an ok row without its tp");
        assert!(with(|r| r.status = Status::Pruned).contains("bound_samples_per_s"));
        assert!(with(|r| {
            r.status = Status::Pruned;
            r.bound_samples_per_s = Some(1.0);
        })
        .contains("does not state its bound"));
    }
}
