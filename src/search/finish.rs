//! A sweep's summaries, all derived from `points.csv` and `run.toml` alone (so a merged set of
//! shards gives the files one run gives): `pareto.csv` (throughput against area, per workload),
//! `best.json` (the best point per workload with its plan, and with several workloads the
//! best hardware for the set) and `pareto.svg`; and the merge of shard directories.

use super::sweep::{
    io_error, read_points, read_points_where, read_shard, rows_csv, POINTS_CSV, RUN_TOML,
    SHARD_TOML,
};
use super::{DesignRow, Objective, Sweep, SweepError, SweepRecord};
use crate::model::{evaluate, Evaluation, PlanOptions};
use crate::output::{same_file, write_atomic, DirLock};
use crate::report::svg::{self, ParetoFront};
use crate::schedule::ScheduleCache;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub const PARETO_CSV: &str = "pareto.csv";
pub const BEST_JSON: &str = "best.json";
pub const PARETO_SVG: &str = "pareto.svg";

/// The best point of one workload, re-evaluated for its plan.
#[derive(Debug, Clone, Serialize)]
pub struct BestOfWorkload {
    pub workload: String,
    pub row: DesignRow,
    pub evaluation: Evaluation,
}

/// The hardware (configuration × HBM) with the best mean objective over the workloads.
#[derive(Debug, Clone, Serialize)]
pub struct BestForSet {
    pub config: u64,
    pub arch: String,
    pub hbm_bytes: u64,
    pub area_mm2: f64,
    /// Mean over workloads of each workload's best objective value on this hardware
    /// (samples/s, samples/s/mm², or −J/sample).
    pub mean_objective: f64,
    /// The best row per workload on this hardware.
    pub rows: Vec<DesignRow>,
}

/// What `best.json` holds, plus the leading rows for printing.
#[derive(Debug, Clone, Serialize)]
pub struct BestPoints {
    pub objective: Objective,
    pub workloads: Vec<BestOfWorkload>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set: Option<BestForSet>,
    /// Per workload, the ten best `ok` rows by the objective.
    #[serde(skip)]
    pub top: Vec<DesignRow>,
}

/// Sort key of a row under `objective`: best first, ties by point id.
fn by_objective(objective: Objective) -> impl Fn(&&DesignRow, &&DesignRow) -> std::cmp::Ordering {
    move |a, b| {
        let (sa, sb) = (objective.score(a), objective.score(b));
        sb.unwrap_or(f64::NEG_INFINITY)
            .total_cmp(&sa.unwrap_or(f64::NEG_INFINITY))
            .then(a.point.cmp(&b.point))
    }
}

/// The `ok` rows not dominated in (smaller area, higher samples/s), by area then throughput.
/// Equal points are all kept.
pub fn pareto_front(rows: &[DesignRow]) -> Vec<DesignRow> {
    let mut ok: Vec<&DesignRow> = rows.iter().filter(|r| r.plan().is_some()).collect();
    let thr = |r: &DesignRow| r.plan().map_or(0.0, |p| p.throughput_samples_per_s);
    ok.sort_by(|a, b| {
        a.area_mm2
            .total_cmp(&b.area_mm2)
            .then(thr(b).total_cmp(&thr(a)))
            .then(a.point.cmp(&b.point))
    });
    let mut front: Vec<DesignRow> = Vec::new();
    let mut best_before = f64::NEG_INFINITY; // best throughput at strictly smaller area
    let mut i = 0;
    while i < ok.len() {
        let area = ok[i].area_mm2;
        let group_end = ok[i..]
            .iter()
            .position(|r| r.area_mm2 != area)
            .map_or(ok.len(), |n| i + n);
        let group_best = thr(ok[i]);
        if group_best > best_before {
            front.extend(
                ok[i..group_end]
                    .iter()
                    .filter(|r| thr(r) == group_best)
                    .map(|r| (*r).clone()),
            );
            best_before = group_best;
        }
        i = group_end;
    }
    front
}

/// Writes `pareto.csv`, `best.json` and `pareto.svg` into `out_dir` from its `points.csv`.
pub fn finish(sweep: &Sweep, out_dir: &Path) -> Result<BestPoints, SweepError> {
    let _lock = DirLock::acquire(out_dir)?;
    // Fronts, rankings and the chart read only the rows with a plan.
    let rows = read_points_where(&out_dir.join(POINTS_CSV), |r| r.plan().is_some())?;
    let mut front_rows = Vec::new();
    let mut fronts = Vec::new();
    let mut workloads = Vec::new();
    let mut top = Vec::new();
    let cache = ScheduleCache::new(sweep.solver)?;
    for workload in &sweep.workloads {
        let mine: Vec<DesignRow> = rows
            .iter()
            .filter(|r| r.workload == workload.name)
            .cloned()
            .collect();
        let front = pareto_front(&mine);
        front_rows.extend(front.iter().cloned());
        fronts.push((workload.name.clone(), mine.clone(), front));
        let mut ranked: Vec<&DesignRow> = mine
            .iter()
            .filter(|r| sweep.objective.score(r).is_some())
            .collect();
        ranked.sort_by(by_objective(sweep.objective));
        top.extend(ranked.iter().take(10).map(|r| (*r).clone()));
        if let Some(best) = ranked.first() {
            let evaluation = reevaluate(sweep, best, &cache)?;
            workloads.push(BestOfWorkload {
                workload: workload.name.clone(),
                row: (*best).clone(),
                evaluation,
            });
        }
    }
    let set = (sweep.workloads.len() > 1)
        .then(|| best_for_set(sweep, &rows))
        .flatten();
    let best = BestPoints {
        objective: sweep.objective,
        workloads,
        set,
        top,
    };

    let pareto_path = out_dir.join(PARETO_CSV);
    let pareto = if front_rows.is_empty() {
        Vec::new()
    } else {
        rows_csv(&pareto_path, &front_rows, true)?
    };
    write_atomic(&pareto_path, &pareto).map_err(|e| io_error(&pareto_path, e))?;
    let best_path = out_dir.join(BEST_JSON);
    let json = serde_json::to_string_pretty(&best).map_err(|e| io_error(&best_path, e))?;
    write_atomic(&best_path, (json + "\n").as_bytes()).map_err(|e| io_error(&best_path, e))?;
    render_pareto(&fronts, &out_dir.join(PARETO_SVG))?;
    Ok(best)
}

/// A row's plan, evaluated again (the CSV keeps only its figures).
pub(super) fn reevaluate(
    sweep: &Sweep,
    row: &DesignRow,
    cache: &ScheduleCache,
) -> Result<Evaluation, SweepError> {
    let missing = |what: &str| SweepError::Input(format!("points.csv: best row lacks `{what}`"));
    let config = row.config.ok_or_else(|| missing("config"))?;
    let arch = sweep
        .space
        .get(config as usize)
        .ok_or_else(|| missing("a configuration inside the space"))?;
    let workload = sweep
        .workloads
        .iter()
        .find(|w| w.name == row.workload)
        .ok_or_else(|| missing("a workload of the sweep"))?;
    let recompute = row.recompute.ok_or_else(|| missing("recompute"))?;
    let options = PlanOptions {
        hbm_bytes: Some(row.hbm_bytes),
        micro_batches: vec![row.micro_batch.ok_or_else(|| missing("micro_batch"))?],
        recompute: vec![recompute],
        zero: sweep.zero.clone(),
        fixed: sweep.fixed,
        ..PlanOptions::searching(sweep.devices)
    };
    evaluate(workload, &arch, &options, cache).map_err(|e| SweepError::Input(e.to_string()))
}

/// With several workloads: the hardware whose mean (over workloads) best objective is highest,
/// among hardware with an `ok` row for every workload. Ties: lowest configuration, then HBM.
fn best_for_set(sweep: &Sweep, rows: &[DesignRow]) -> Option<BestForSet> {
    let names: Vec<&str> = sweep.workloads.iter().map(|w| w.name.as_str()).collect();
    let mut per_hardware: BTreeMap<(u64, u64), Vec<Option<&DesignRow>>> = BTreeMap::new();
    for row in rows {
        let (Some(config), Some(score)) = (row.config, sweep.objective.score(row)) else {
            continue;
        };
        let Some(w) = names.iter().position(|n| *n == row.workload) else {
            continue;
        };
        let slots = per_hardware
            .entry((config, row.hbm_bytes))
            .or_insert_with(|| vec![None; names.len()]);
        let better = slots[w]
            .is_none_or(|old| score > sweep.objective.score(old).unwrap_or(f64::NEG_INFINITY));
        if better {
            slots[w] = Some(row);
        }
    }
    let mut best: Option<BestForSet> = None;
    for ((config, hbm_bytes), slots) in per_hardware {
        let Some(chosen) = slots.into_iter().collect::<Option<Vec<&DesignRow>>>() else {
            continue;
        };
        let mean = chosen
            .iter()
            .filter_map(|r| sweep.objective.score(r))
            .sum::<f64>()
            / chosen.len() as f64;
        if best.as_ref().is_none_or(|b| mean > b.mean_objective) {
            best = Some(BestForSet {
                config,
                arch: chosen[0].arch.clone(),
                hbm_bytes,
                area_mm2: chosen[0].area_mm2,
                mean_objective: mean,
                rows: chosen.into_iter().cloned().collect(),
            });
        }
    }
    best
}

/// `pareto.svg`: every evaluated point and each workload's front (`report::svg::pareto`).
fn render_pareto(
    fronts: &[(String, Vec<DesignRow>, Vec<DesignRow>)],
    path: &Path,
) -> Result<(), SweepError> {
    let ok = |r: &&DesignRow| r.plan().is_some();
    let area_and_throughput =
        |r: &DesignRow| Some((r.area_mm2, r.plan()?.throughput_samples_per_s));
    let points: Vec<(f64, f64)> = fronts
        .iter()
        .flat_map(|(_, rows, _)| rows.iter().filter(ok))
        .filter_map(area_and_throughput)
        .collect();
    let fronts: Vec<ParetoFront> = fronts
        .iter()
        .map(|(name, _, front)| ParetoFront {
            name: name.clone(),
            corners: front.iter().filter_map(area_and_throughput).collect(),
        })
        .collect();
    let svg = svg::pareto(&points, &fronts).map_err(|e| io_error(path, e))?;
    write_atomic(path, svg.as_bytes()).map_err(|e| io_error(path, e))
}

/// Joins shard directories into `out`: their `run.toml` must agree, their shards cover `0..n`
/// once, and each shard must be complete (every point it owns written: its run finished) with
/// rows that pass the resume checks ([`Sweep`]'s row checks and a re-evaluated sample). `out`
/// may not be one of the inputs. Writes `run.toml` and `points.csv` (rows by point id);
/// returns the record so the caller can rebuild the sweep and [`finish`] it.
pub fn merge(inputs: &[PathBuf], out: &Path) -> Result<SweepRecord, SweepError> {
    let first = inputs
        .first()
        .ok_or_else(|| SweepError::Input("merge: give at least one sweep directory".into()))?;
    if let Some(input) = inputs.iter().find(|dir| same_file(dir, out)) {
        return Err(SweepError::Input(format!(
            "merge: --out {} is one of the shards ({}): merging into it would overwrite that \
             shard; choose another directory",
            out.display(),
            input.display()
        )));
    }
    let run_text = |dir: &Path| {
        let path = dir.join(RUN_TOML);
        std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))
    };
    let record_text = run_text(first)?;
    let record: SweepRecord =
        toml::from_str(&record_text).map_err(|e| io_error(&first.join(RUN_TOML), e))?;
    let sweep = Sweep::from_record(&record)?;
    let mut shards: BTreeSet<u32> = BTreeSet::new();
    let mut count = None;
    let mut rows: Vec<DesignRow> = Vec::new();
    for dir in inputs {
        if run_text(dir)? != record_text {
            return Err(SweepError::Input(format!(
                "{}: its run.toml differs from {}'s: not shards of one sweep",
                dir.join(RUN_TOML).display(),
                first.display()
            )));
        }
        let shard_path = dir.join(SHARD_TOML);
        let shard = read_shard(&shard_path)?;
        if count.is_some_and(|n| n != shard.count) {
            return Err(SweepError::Input(format!(
                "{}: shard {}/{} mixes with shards of another count",
                shard_path.display(),
                shard.index,
                shard.count
            )));
        }
        count = Some(shard.count);
        if !shards.insert(shard.index) {
            return Err(SweepError::Input(format!(
                "{}: shard {}/{} is given twice",
                dir.display(),
                shard.index,
                shard.count
            )));
        }
        let points_path = dir.join(POINTS_CSV);
        let mine = read_points(&points_path)?;
        sweep.check_rows(&points_path, &mine, shard)?;
        let expected = sweep.shard_points(shard);
        if (mine.len() as u64) < expected {
            return Err(SweepError::Input(format!(
                "{}: shard {}/{} is incomplete: {} of its {expected} points written, {} missing \
                 (its run did not finish; finish it with `tandem search … --shard {}/{} \
                 --resume --out {}`)",
                dir.display(),
                shard.index,
                shard.count,
                mine.len(),
                expected - mine.len() as u64,
                shard.index,
                shard.count,
                dir.display()
            )));
        }
        sweep.check_rows_reproduce(&points_path, &mine)?;
        rows.extend(mine);
    }
    let n = count.unwrap_or(1);
    let missing: Vec<String> = (0..n)
        .filter(|i| !shards.contains(i))
        .map(|i| format!("{i}/{n}"))
        .collect();
    if !missing.is_empty() {
        return Err(SweepError::Input(format!(
            "merge: shards {} are missing",
            missing.join(", ")
        )));
    }
    rows.sort_by_key(|r| r.point);
    let _lock = DirLock::acquire(out)?;
    let run_path = out.join(RUN_TOML);
    write_atomic(&run_path, record_text.as_bytes()).map_err(|e| io_error(&run_path, e))?;
    let shard_path = out.join(SHARD_TOML);
    if shard_path.exists() {
        std::fs::remove_file(&shard_path).map_err(|e| io_error(&shard_path, e))?;
    }
    let points_path = out.join(POINTS_CSV);
    let bytes = rows_csv(&points_path, &rows, true)?;
    write_atomic(&points_path, &bytes).map_err(|e| io_error(&points_path, e))?;
    Ok(record)
}
