//! The CSV row of one design point (docs/design.md §9), shared by `tandem plan --csv` and
//! sweeps. Evaluation times are printed, not stored, so that equal inputs give equal files.

use crate::arch::{area_breakdown, ArchConfig};
use crate::model::{recompute_name, EvaluateError, Evaluation};
use crate::placement::RecomputeMode;
use crate::report;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Outcome of a design point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Infeasible,
    /// Not evaluated: a sound bound shows it cannot matter (sweeps only).
    Pruned,
}

/// One design point. Plan columns are empty unless `status` is `ok`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Empty when a failed point searched several values.
    pub micro_batch: Option<u32>,
    pub recompute: Option<String>,
    pub hbm_bytes: u64,
    pub tp: Option<u32>,
    pub dp: Option<u32>,
    pub pp: Option<u32>,
    pub devices_used: Option<u32>,
    pub time_per_batch_s: Option<f64>,
    pub throughput_samples_per_s: Option<f64>,
    pub throughput_tokens_per_s: Option<f64>,
    pub mfu: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
    pub energy_per_sample_j: Option<f64>,
    pub status: Status,
    /// Why the point is infeasible or pruned; empty when `ok`.
    pub reason: String,
    /// Sweeps only: the point's id (its position in the sweep's order).
    pub point: Option<u64>,
    /// Sweeps only: the configuration's index in the search space.
    pub config: Option<u64>,
    /// Sweeps that prune: the screen's upper bound on samples/s (0 when no plan fits).
    pub bound_samples_per_s: Option<f64>,
}

impl DesignRow {
    /// The fields every row has: workload, chip and the point's own choices.
    pub fn point(
        workload: &str,
        arch: &ArchConfig,
        micro_batch: Option<u32>,
        recompute: Option<RecomputeMode>,
        hbm_bytes: u64,
        status: Status,
        reason: String,
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
            recompute: recompute.map(|r| recompute_name(r).to_string()),
            hbm_bytes,
            tp: None,
            dp: None,
            pp: None,
            devices_used: None,
            time_per_batch_s: None,
            throughput_samples_per_s: None,
            throughput_tokens_per_s: None,
            mfu: None,
            peak_memory_bytes: None,
            energy_per_sample_j: None,
            status,
            reason,
            point: None,
            config: None,
            bound_samples_per_s: None,
        }
    }

    /// The row of an evaluated point.
    pub fn evaluated(arch: &ArchConfig, e: &Evaluation) -> DesignRow {
        let p = &e.plan;
        DesignRow {
            tp: Some(p.tp),
            dp: Some(p.dp),
            pp: Some(p.pp),
            devices_used: Some(p.devices_used),
            time_per_batch_s: Some(p.time_per_batch_s),
            throughput_samples_per_s: Some(p.throughput_samples_per_s),
            throughput_tokens_per_s: Some(e.throughput_tokens_per_s),
            mfu: Some(e.mfu),
            peak_memory_bytes: Some(p.peak_memory_bytes),
            energy_per_sample_j: Some(e.energy_per_sample_j),
            ..DesignRow::point(
                &e.workload,
                arch,
                Some(p.micro_batch),
                Some(e.recompute),
                e.hbm_bytes,
                Status::Ok,
                String::new(),
            )
        }
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
        DesignRow::point(
            workload,
            arch,
            micro_batch,
            recompute,
            hbm_bytes,
            Status::Infeasible,
            reason.replace('\n', " "),
        )
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
