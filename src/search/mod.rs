//! Search (docs/design.md §7): sweeps of many design points, each evaluated by
//! [`crate::model`]: enumeration, sound pruning, streaming, resume, shards, merge, and the
//! baselines against co-design.
//!
//! Files:
//! - `row.rs`: `DesignRow`, one design point with its `Outcome` (ok with a plan summary,
//!   infeasible with a reason, pruned with the point that beats its bound), and `PointRecord`,
//!   the flat CSV row of docs/design.md §9 it is written and read as.
//! - `sweep.rs`: `Sweep` (from a `SweepRecord` = `run.toml`), point ids, exact evaluation of
//!   the undominated points in parallel batches streamed to `points.csv`, resume, `Shard`.
//! - `screen.rs`: pass 1 — the work bound of every point (`LayerWork`), then a branch and bound
//!   in order of falling bound that prices points with `throughput_bound` (schedule lower
//!   bounds) and list-schedule plans only while they might beat the per-workload staircase of
//!   achievable throughput at their area.
//! - `memory.rs`: what fits in memory at each (HBM, micro-batch, recompute), once per sweep
//!   for the whole space: the tensor widths and expert-parallel widths some plan fits with,
//!   and the fewest powered passes (pipeline bubble included) of each width; the work bound
//!   and the energy bound use it.
//! - `energy.rs`: pruned energy sweeps (one workload) — a lower bound on joules per sample
//!   per point, then exact points in order of rising bound while they might beat the
//!   staircase of least energy at their area.
//! - `finish.rs`: `pareto.csv`, `best.json`, `pareto.svg` from `points.csv` alone (drawn by
//!   `report::svg`), and `merge`.
//! - `compare.rs`: the baseline / decoupled / co-design table (`Comparison`, `BaselinePlans`
//!   from `workloads/plans/phaze.toml`) and its files: cells and bars built here, written by
//!   `report` (CSV, Markdown, SVG); one objective's sweeps, choices and gains throughout.
//! - `study.rs`: `tandem study` — the comparison for every cluster size × objective ×
//!   workload of a study file (`studies/codesign.toml`) into compare folders, resumable, and
//!   the per-objective summaries computed from those folders alone.

mod compare;
mod energy;
mod finish;
mod memory;
mod row;
mod screen;
mod status;
mod study;
mod sweep;

pub use compare::{
    gain, markdown_table, objective_cell, objective_unit, objective_value, ratio_cell,
    write_comparison, BaselinePlans, CompareRow, Comparison, FixedWidths, COMPARE_CSV, COMPARE_MD,
    COMPARE_SVG,
};
pub use finish::{finish, merge, pareto_front, BestPoints};
pub use row::{
    append_rows, DesignRow, Outcome, PlanSummary, PointRecord, Pruning, Reached, SpentBy, Status,
};
pub use screen::{screen_blocks, SpaceMemo};
pub use status::{host_name, read_status, DirStatus, RunState, SweepStatus, STATUS_JSON};
pub use study::{
    parse_objective, run_study, summarise, summary_paths, summary_rows, write_summaries,
    BaselineGains, Study, StudyOptions, SummaryRow,
};
pub use sweep::{
    first_repeated, read_points, run_sweep, Objective, Phase, RunOptions, Shard, Sweep, SweepError,
    SweepRecord, SweepStats, PILOT_CSV, POINTS_CSV, RUN_TOML, SCREEN_CSV, SEED_CSV, SHARD_TOML,
};
