//! A co-design study driven by a data file (`tandem study`, `studies/codesign.toml`): the
//! comparison of [`Comparison::compare_workload`] for every cluster size × objective ×
//! workload, each (cluster size, objective) into its own compare folder
//! `OUT/d<devices>/<objective>/`, then a summary per objective (`OUT/<objective>.md`, `.csv`,
//! `.svg`) computed from those folders' `compare.csv` alone.

use super::compare::{objective_value, plan_cell};
use super::sweep::io_error;
use super::{
    gain, objective_cell, objective_unit, ratio_cell, write_comparison, BaselinePlans, CompareRow,
    Comparison, Objective, SpaceMemo, SweepError, COMPARE_CSV,
};
use crate::arch::{load_chip, ArchConfig, SearchSpace};
use crate::error::{parse_toml, read_input, InputError};
use crate::output::{write_atomic, DirLock};
use crate::placement::{RecomputeMode, ZeroStage};
use crate::report;
use crate::report::markdown::{self, cell};
use crate::report::svg::{self, BarGroup};
use crate::schedule::SolverOptions;
use crate::workload::Workload;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// The study file as written (paths relative to the current directory).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StudyFile {
    space: PathBuf,
    workloads: Vec<PathBuf>,
    devices: Vec<u32>,
    baselines: Vec<PathBuf>,
    objectives: Vec<String>,
    micro_batches: Vec<u32>,
    recompute: Vec<String>,
    hbm_gib: Vec<f64>,
    /// Fixed-plan file per device count (TOML keys are strings).
    #[serde(default)]
    plans: BTreeMap<String, PathBuf>,
}

/// A loaded, checked study.
#[derive(Debug)]
pub struct Study {
    pub space_path: PathBuf,
    pub space: SearchSpace,
    /// Each workload's file and model, in the file's order.
    pub workloads: Vec<(PathBuf, Workload)>,
    /// Cluster sizes, ascending.
    pub devices: Vec<u32>,
    pub baselines: Vec<ArchConfig>,
    /// In the file's order.
    pub objectives: Vec<Objective>,
    pub micro_batches: Vec<u32>,
    pub recompute: Vec<RecomputeMode>,
    pub hbm_bytes: Vec<u64>,
    /// The fixed plans per cluster size; sizes without a file get no fixed-plan rows.
    pub plans: BTreeMap<u32, BaselinePlans>,
}

/// The objective named `name` as the study file (and `--objective`) spells it.
pub fn parse_objective(name: &str) -> Option<Objective> {
    match name {
        "throughput" => Some(Objective::Throughput),
        "throughput-per-area" => Some(Objective::ThroughputPerArea),
        "energy" => Some(Objective::Energy),
        _ => None,
    }
}

/// The largest HBM size a device may have, GiB (1 PiB).
const MAX_HBM_GIB: f64 = 1_048_576.0;

/// A non-empty list without repeats, or the error naming `field`.
fn check_list<T: PartialEq + std::fmt::Debug>(
    file: &Path,
    field: &str,
    items: &[T],
) -> Result<(), InputError> {
    if items.is_empty() {
        return Err(InputError::invalid(file, field, "must not be empty"));
    }
    for (i, item) in items.iter().enumerate() {
        if items[..i].contains(item) {
            return Err(InputError::invalid(
                file,
                format!("{field}[{i}]"),
                format!("{item:?} is given twice"),
            ));
        }
    }
    Ok(())
}

/// `path` if it names a file, or the error naming `field`.
fn existing(file: &Path, field: &str, path: &Path) -> Result<(), InputError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(InputError::invalid(
            file,
            field,
            format!("no file `{}`", path.display()),
        ))
    }
}

impl Study {
    /// Reads and checks a study file; every referenced file is loaded (and so validated).
    pub fn load(path: &Path) -> Result<Study, InputError> {
        let raw: StudyFile = parse_toml(path, &read_input(path)?)?;

        existing(path, "space", &raw.space)?;
        let space = SearchSpace::load(&raw.space)?;
        if space.is_empty() {
            return Err(InputError::invalid(path, "space", "the space is empty"));
        }

        check_list(path, "workloads", &raw.workloads)?;
        let mut workloads: Vec<(PathBuf, Workload)> = Vec::new();
        for (i, file) in raw.workloads.iter().enumerate() {
            let field = format!("workloads[{i}]");
            existing(path, &field, file)?;
            let workload = Workload::load(file)?;
            if let Some((other, _)) = workloads.iter().find(|(_, w)| w.name == workload.name) {
                return Err(InputError::invalid(
                    path,
                    field,
                    format!(
                        "its model `{}` is also that of `{}`",
                        workload.name,
                        other.display()
                    ),
                ));
            }
            workloads.push((file.clone(), workload));
        }

        check_list(path, "devices", &raw.devices)?;
        if let Some(i) = raw.devices.iter().position(|&d| d == 0) {
            return Err(InputError::invalid(
                path,
                format!("devices[{i}]"),
                "must be at least 1",
            ));
        }
        let mut devices = raw.devices.clone();
        devices.sort_unstable();

        check_list(path, "baselines", &raw.baselines)?;
        let mut baselines: Vec<ArchConfig> = Vec::new();
        for (i, file) in raw.baselines.iter().enumerate() {
            let field = format!("baselines[{i}]");
            existing(path, &field, file)?;
            let chip = load_chip(file)?;
            if baselines.iter().any(|b| b.name == chip.name) {
                return Err(InputError::invalid(
                    path,
                    field,
                    format!("a second chip named `{}`", chip.name),
                ));
            }
            baselines.push(chip);
        }

        check_list(path, "objectives", &raw.objectives)?;
        let objectives = raw
            .objectives
            .iter()
            .enumerate()
            .map(|(i, name)| {
                parse_objective(name).ok_or_else(|| {
                    InputError::invalid(
                        path,
                        format!("objectives[{i}]"),
                        format!(
                            "unknown objective `{name}` (throughput, throughput-per-area, energy)"
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;

        check_list(path, "micro_batches", &raw.micro_batches)?;
        if let Some(i) = raw.micro_batches.iter().position(|&b| b == 0) {
            return Err(InputError::invalid(
                path,
                format!("micro_batches[{i}]"),
                "must be at least 1",
            ));
        }

        check_list(path, "recompute", &raw.recompute)?;
        let recompute = raw
            .recompute
            .iter()
            .enumerate()
            .map(|(i, name)| match name.as_str() {
                "none" => Ok(RecomputeMode::None),
                "selective" => Ok(RecomputeMode::Selective),
                "full" => Ok(RecomputeMode::Full),
                _ => Err(InputError::invalid(
                    path,
                    format!("recompute[{i}]"),
                    format!("unknown recompute mode `{name}` (none, selective, full)"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;

        check_list(path, "hbm_gib", &raw.hbm_gib)?;
        let hbm_bytes = raw
            .hbm_gib
            .iter()
            .enumerate()
            .map(|(i, &gib)| {
                let bytes = (gib * report::GIB).round();
                if gib.is_finite() && gib > 0.0 && gib <= MAX_HBM_GIB && bytes >= 1.0 {
                    Ok(bytes as u64)
                } else {
                    Err(InputError::invalid(
                        path,
                        format!("hbm_gib[{i}]"),
                        format!("must be a positive number of GiB up to {MAX_HBM_GIB}, got {gib}"),
                    ))
                }
            })
            .collect::<Result<Vec<u64>, _>>()?;

        let mut plans = BTreeMap::new();
        for (key, file) in &raw.plans {
            let field = format!("plans.{key}");
            let count: u32 = key
                .parse()
                .map_err(|_| InputError::invalid(path, &field, "the key must be a device count"))?;
            if !devices.contains(&count) {
                return Err(InputError::invalid(
                    path,
                    &field,
                    format!("{count} is not one of `devices`"),
                ));
            }
            existing(path, &field, file)?;
            let loaded = BaselinePlans::load(file)?;
            if loaded.devices != count {
                return Err(InputError::invalid(
                    path,
                    &field,
                    format!(
                        "`{}` holds plans for {} devices, not {count}",
                        file.display(),
                        loaded.devices
                    ),
                ));
            }
            plans.insert(count, loaded);
        }

        Ok(Study {
            space_path: raw.space,
            space,
            workloads,
            devices,
            baselines,
            objectives,
            micro_batches: raw.micro_batches,
            recompute,
            hbm_bytes,
            plans,
        })
    }

    /// The compare folder of one cluster size and objective: `OUT/d<devices>/<objective>`.
    pub fn folder(out: &Path, devices: u32, objective: Objective) -> PathBuf {
        out.join(format!("d{devices}")).join(objective.to_string())
    }

    /// The rows a cell of `devices` holds, in order (as [`Comparison::compare_workload`]
    /// names them, less the fixed-plan rows where the cluster size has no plans file).
    fn row_names(&self, devices: u32) -> Vec<String> {
        let fixed = self.plans.contains_key(&devices);
        let mut names = Vec::new();
        for b in &self.baselines {
            if fixed {
                names.push(format!("{} fixed plan", b.name));
            }
            names.push(format!("{} searched plan", b.name));
        }
        names.extend(["decoupled", "hardware-first", "co-design"].map(String::from));
        for b in &self.baselines {
            names.push(format!("co-design ≤ {} area", b.name));
            names.push(format!("co-design ≤ {} power", b.name));
        }
        if fixed {
            names.push("fixed-plan co-design".into());
        }
        names
    }

    fn comparison(
        &self,
        devices: u32,
        objective: Objective,
        options: &StudyOptions,
        memo: &Arc<SpaceMemo>,
    ) -> Comparison {
        Comparison {
            space_path: self.space_path.clone(),
            space: self.space.clone(),
            baselines: self.baselines.clone(),
            plans: self.plans.get(&devices).cloned().unwrap_or(BaselinePlans {
                devices,
                plans: BTreeMap::new(),
            }),
            devices,
            micro_batches: self.micro_batches.clone(),
            recompute: self.recompute.clone(),
            hbm_bytes: self.hbm_bytes.clone(),
            zero: vec![ZeroStage::Replicated],
            solver: SolverOptions::default(),
            objective,
            // A study starts in an empty directory unless resumed, so any sweep it finds is
            // its own: a cell cut off, or the throughput sweeps that throughput per area reads.
            resume: true,
            progress: options.progress,
            space_memo: memo.clone(),
        }
    }
}

/// How a study runs.
#[derive(Debug, Clone)]
pub struct StudyOptions {
    pub out: PathBuf,
    /// Continue a study in `out`: partial sweeps resume, finished cells are kept.
    pub resume: bool,
    /// Show each sweep's progress bar on stderr.
    pub progress: bool,
}

/// The files of one objective's summary.
pub fn summary_paths(out: &Path, objective: Objective) -> [PathBuf; 3] {
    ["md", "csv", "svg"].map(|ext| out.join(format!("{objective}.{ext}")))
}

/// Reads a compare folder's rows (none when it has no `compare.csv` yet).
fn read_compare_rows(folder: &Path) -> Result<Vec<CompareRow>, SweepError> {
    let path = folder.join(COMPARE_CSV);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut reader = csv::Reader::from_path(&path).map_err(|e| io_error(&path, e))?;
    reader
        .deserialize()
        .collect::<Result<Vec<CompareRow>, _>>()
        .map_err(|e| io_error(&path, e))
}

/// Whether a directory exists and holds anything.
fn non_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some())
}

/// Runs every cell of the study that `out` does not hold yet (cluster sizes ascending, then
/// objectives, then workloads in the file's order), writing its compare folder whole after
/// each cell, then the summaries. `log` gets one line per finished cell.
pub fn run_study(
    study: &Study,
    options: &StudyOptions,
    mut log: impl FnMut(&str),
) -> Result<(), SweepError> {
    let out = &options.out;
    if !options.resume && non_empty(out) {
        return Err(SweepError::Input(format!(
            "{} is not empty: pass --resume to continue the study there, or choose an empty \
             directory",
            out.display()
        )));
    }
    let _lock = DirLock::acquire(out)?;
    // Layer bounds depend on neither the cluster size nor the objective: priced once.
    let memo = Arc::new(SpaceMemo::default());
    for &devices in &study.devices {
        for &objective in &study.objectives {
            let folder = Study::folder(out, devices, objective);
            let comparison = study.comparison(devices, objective, options, &memo);
            let mut done = read_compare_rows(&folder)?;
            let expected = study.row_names(devices);
            for (path, workload) in &study.workloads {
                let kept: Vec<&CompareRow> = done
                    .iter()
                    .filter(|r| r.workload == workload.name)
                    .collect();
                if !kept.is_empty() {
                    // A finished cell is kept only if it is this study file's.
                    let names: Vec<&str> = kept.iter().map(|r| r.row.as_str()).collect();
                    if names != expected || kept.iter().any(|r| r.objective != objective) {
                        return Err(SweepError::Input(format!(
                            "{}: the rows of `{}` are not those this study file asks for (were \
                             the baselines or the plans changed?): remove that folder, or use \
                             another output directory",
                            folder.join(COMPARE_CSV).display(),
                            workload.name
                        )));
                    }
                    continue;
                }
                let start = Instant::now();
                // Throughput per area reads the throughput sweeps (`Comparison::sweep_objective`).
                let sweeps =
                    Study::folder(out, devices, comparison.sweep_objective()).join("sweeps");
                let sweep_dir = comparison.sweep_dir(&sweeps, &workload.name);
                let mut rows = comparison
                    .compare_workload(workload, path, &sweep_dir)
                    .map_err(|e| match e {
                        SweepError::Input(m) => SweepError::Input(format!(
                            "d{devices} {objective} {}: {m}",
                            workload.name
                        )),
                        other => other,
                    })?;
                if !study.plans.contains_key(&devices) {
                    rows.retain(|r| {
                        !(r.row.ends_with(" fixed plan") || r.row == "fixed-plan co-design")
                    });
                    // The reference is now row 1 itself.
                    if let Some(first) = rows.first_mut() {
                        if first.note.starts_with("speed-up reference") {
                            first.note.clear();
                        }
                    }
                }
                done.extend(rows);
                // The folder's rows in the file's workload order, replaced whole.
                let ordered: Vec<CompareRow> = study
                    .workloads
                    .iter()
                    .flat_map(|(_, w)| done.iter().filter(move |r| r.workload == w.name))
                    .cloned()
                    .collect();
                write_comparison(&ordered, &folder)?;
                log(&format!(
                    "d{devices} {objective} {}: done in {:.1} s",
                    workload.name,
                    start.elapsed().as_secs_f64()
                ));
            }
        }
    }
    write_summaries(study, out)
}

/// One line of an objective's summary: co-design for one workload on one cluster size.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    pub workload: String,
    pub devices: u32,
    /// Co-design's row.
    pub codesign: CompareRow,
    /// Per baseline: co-design's gain over its searched-plan row, over its fixed-plan row,
    /// and the gain of co-design held to its area and to its peak power over its
    /// searched-plan row.
    pub gains: Vec<BaselineGains>,
    /// Co-design's gain over the decoupled and the hardware-first rows (hardware chosen
    /// before the plan): what searching both together adds (`None`: a row has no plan).
    pub over_decoupled: Option<f64>,
    pub over_hardware_first: Option<f64>,
    /// Whether co-design's chip (configuration or HBM size) differs from the decoupled and
    /// the hardware-first rows' (`None`: a row has no plan).
    pub differs_from_decoupled: Option<bool>,
    pub differs_from_hardware_first: Option<bool>,
}

/// Co-design's gains against one baseline (`None`: a row has no plan, or is absent).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BaselineGains {
    pub over_searched: Option<f64>,
    pub over_fixed: Option<f64>,
    pub iso_area: Option<f64>,
    pub iso_power: Option<f64>,
}

/// The chip of a row with a plan: its configuration and HBM size.
fn chip_key(row: &CompareRow) -> Option<(u32, u32, u32, u32, u64, u64)> {
    row.throughput_samples_per_s?;
    Some((
        row.tensor_cores,
        row.tensor_rows,
        row.tensor_cols,
        row.vector_cores,
        row.glb_bytes,
        row.hbm_bytes,
    ))
}

/// The summary rows of one cluster size's compare rows under `objective` (one per workload,
/// in the rows' order).
pub fn summarise(
    rows: &[CompareRow],
    devices: u32,
    objective: Objective,
    baselines: &[String],
) -> Vec<SummaryRow> {
    let mut workloads: Vec<&str> = Vec::new();
    for r in rows {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    workloads
        .into_iter()
        .filter_map(|w| {
            let find = |name: &str| rows.iter().find(|r| r.workload == w && r.row == name);
            let value = |name: &str| find(name).and_then(|r| objective_value(objective, r));
            let codesign = find("co-design")?.clone();
            let co = objective_value(objective, &codesign);
            let ratio = |value: Option<f64>, reference: Option<f64>| {
                value.zip(reference).map(|(v, r)| gain(objective, v, r))
            };
            let gains = baselines
                .iter()
                .map(|b| {
                    let searched = value(&format!("{b} searched plan"));
                    BaselineGains {
                        over_searched: ratio(co, searched),
                        over_fixed: ratio(co, value(&format!("{b} fixed plan"))),
                        iso_area: ratio(value(&format!("co-design ≤ {b} area")), searched),
                        iso_power: ratio(value(&format!("co-design ≤ {b} power")), searched),
                    }
                })
                .collect();
            let differs = |name: &str| {
                let other = chip_key(find(name)?)?;
                Some(chip_key(&codesign)? != other)
            };
            Some(SummaryRow {
                workload: w.to_string(),
                devices,
                over_decoupled: ratio(co, value("decoupled")),
                over_hardware_first: ratio(co, value("hardware-first")),
                differs_from_decoupled: differs("decoupled"),
                differs_from_hardware_first: differs("hardware-first"),
                codesign,
                gains,
            })
        })
        .collect()
}

/// Reads every compare folder of `objective` and summarises them: workloads in the study
/// file's order, each on every cluster size ascending.
pub fn summary_rows(
    study: &Study,
    out: &Path,
    objective: Objective,
) -> Result<Vec<SummaryRow>, SweepError> {
    let names: Vec<String> = study.baselines.iter().map(|b| b.name.clone()).collect();
    let mut all = Vec::new();
    for &devices in &study.devices {
        let rows = read_compare_rows(&Study::folder(out, devices, objective))?;
        all.extend(summarise(&rows, devices, objective, &names));
    }
    let order = |name: &str| study.workloads.iter().position(|(_, w)| w.name == name);
    all.sort_by(|a: &SummaryRow, b: &SummaryRow| {
        order(&a.workload)
            .cmp(&order(&b.workload))
            .then(a.workload.cmp(&b.workload))
            .then(a.devices.cmp(&b.devices))
    });
    Ok(all)
}

fn yes_no(v: Option<bool>) -> String {
    v.map_or("-".into(), |v| if v { "yes" } else { "no" }.into())
}

/// An exact number for the CSV (empty without one).
fn number(v: Option<f64>) -> String {
    v.map_or(String::new(), |v| v.to_string())
}

/// Writes `OUT/<objective>.md`, `.csv` and `.svg` for every objective of the study from its
/// compare folders alone.
pub fn write_summaries(study: &Study, out: &Path) -> Result<(), SweepError> {
    let names: Vec<&str> = study.baselines.iter().map(|b| b.name.as_str()).collect();
    for &objective in &study.objectives {
        let rows = summary_rows(study, out, objective)?;
        let [md_path, csv_path, svg_path] = summary_paths(out, objective);

        // CSV: exact values.
        let mut header: Vec<String> = [
            "workload",
            "devices",
            "objective",
            "chip",
            "hbm_bytes",
            "tp",
            "pp",
            "dp",
            "micro_batch",
            "recompute",
            "objective_value",
        ]
        .map(String::from)
        .to_vec();
        for b in &names {
            header.push(format!("gain_over_{b}_searched_plan"));
            header.push(format!("gain_over_{b}_fixed_plan"));
            header.push(format!("gain_at_{b}_area"));
            header.push(format!("gain_at_{b}_power"));
        }
        header.push("gain_over_decoupled".into());
        header.push("gain_over_hardware_first".into());
        header.push("chip_differs_from_decoupled".into());
        header.push("chip_differs_from_hardware_first".into());
        let opt = |v: Option<u32>| v.map_or(String::new(), |v| v.to_string());
        let records: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let c = &r.codesign;
                let mut record = vec![
                    r.workload.clone(),
                    r.devices.to_string(),
                    objective.to_string(),
                    c.chip.clone(),
                    c.hbm_bytes.to_string(),
                    opt(c.tp),
                    opt(c.pp),
                    opt(c.dp),
                    opt(c.micro_batch),
                    c.recompute.map_or(String::new(), |m| m.to_string()),
                    number(objective_value(objective, c)),
                ];
                for g in &r.gains {
                    record.extend(
                        [g.over_searched, g.over_fixed, g.iso_area, g.iso_power].map(number),
                    );
                }
                record.push(number(r.over_decoupled));
                record.push(number(r.over_hardware_first));
                record.push(yes_no(r.differs_from_decoupled));
                record.push(yes_no(r.differs_from_hardware_first));
                record
            })
            .collect();
        let bytes =
            report::csv::table_bytes(&header, &records).map_err(|e| io_error(&csv_path, e))?;

        // Markdown: the same, rounded, with the plan in words, as two tables (co-design and
        // its gains over the searched plans; the fixed-plan, iso-area and iso-power gains).
        let unit = objective_unit(objective);
        let mut main_header: Vec<String> = [
            "workload",
            "devices",
            "co-design chip",
            "HBM GiB",
            "plan",
            "b",
            "recompute",
        ]
        .map(String::from)
        .to_vec();
        main_header.push(format!("{objective} ({unit})"));
        main_header.extend(names.iter().map(|b| format!("over {b}")));
        main_header.extend(
            [
                "over decoupled",
                "over hardware-first",
                "chip ≠ decoupled",
                "chip ≠ hardware-first",
            ]
            .map(String::from),
        );
        let mut iso_header: Vec<String> = vec!["workload".into(), "devices".into()];
        for b in &names {
            iso_header.push(format!("over {b} fixed plan"));
            iso_header.push(format!("≤ {b} area"));
            iso_header.push(format!("≤ {b} power"));
        }
        let (mut main_cells, mut iso_cells) = (Vec::new(), Vec::new());
        for r in &rows {
            let c = &r.codesign;
            let mut line = vec![
                cell(&r.workload),
                r.devices.to_string(),
                cell(&c.chip),
                format!("{:.0}", report::gib(c.hbm_bytes)),
                plan_cell(c),
                c.micro_batch.map_or("-".into(), |b| b.to_string()),
                c.recompute.map_or("-".into(), |m| m.to_string()),
                objective_cell(objective, objective_value(objective, c)),
            ];
            line.extend(r.gains.iter().map(|g| ratio_cell(g.over_searched)));
            line.push(ratio_cell(r.over_decoupled));
            line.push(ratio_cell(r.over_hardware_first));
            line.push(yes_no(r.differs_from_decoupled));
            line.push(yes_no(r.differs_from_hardware_first));
            main_cells.push(line);
            let mut iso = vec![cell(&r.workload), r.devices.to_string()];
            for g in &r.gains {
                iso.extend([g.over_fixed, g.iso_area, g.iso_power].map(ratio_cell));
            }
            iso_cells.push(iso);
        }
        let md = format!(
            "# Co-design study: {objective}\n\nObjective: {objective} ({unit}). Gains are > 1 \
             when co-design is better. Compare folders: `d<devices>/{objective}/`.\n\n\
             ## Co-design and its gains\n\nCo-design's point, and its gain over each \
             baseline's searched-plan row (the baseline chip with tandem's plan search, same \
             cluster) and over the decoupled and hardware-first rows (hardware chosen before \
             the plan).\n\n{}\n## Fixed plans, iso-area and iso-power\n\nCo-design's gain \
             over each baseline's fixed-plan row, and co-design held to the baseline's \
             template area (`≤ area`) or peak power (`≤ power`) over the baseline's \
             searched-plan row.\n\n{}",
            markdown::table(&main_header, &main_cells),
            markdown::table(&iso_header, &iso_cells)
        );

        // SVG: co-design's gain over each baseline's searched plan, per workload × devices.
        let groups: Vec<BarGroup> = rows
            .iter()
            .map(|r| BarGroup {
                name: format!("{} d{}", r.workload, r.devices),
                bars: names
                    .iter()
                    .zip(&r.gains)
                    .map(|(b, g)| (format!("over {b}"), g.over_searched))
                    .collect(),
            })
            .collect();
        let chart = svg::speedup_bars(
            &format!("co-design's gain in {objective} over each baseline (searched plan)"),
            "gain (×)",
            &groups,
        )
        .map_err(|e| io_error(&svg_path, e))?;

        write_atomic(&csv_path, &bytes).map_err(|e| io_error(&csv_path, e))?;
        write_atomic(&md_path, md.as_bytes()).map_err(|e| io_error(&md_path, e))?;
        write_atomic(&svg_path, chart.as_bytes()).map_err(|e| io_error(&svg_path, e))?;
    }
    Ok(())
}
