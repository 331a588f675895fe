//! Search (docs/design.md §7): design points evaluated end to end, from workload and chip to
//! the best parallel plan.
//!
//! [`evaluate`] takes one chip and searches micro-batch, recompute and the parallel plan;
//! [`layer_costs`] is its first half (per-layer schedules at one tensor width), shared by
//! `tandem schedule`.
//!
//! Files:
//! - `evaluate.rs`: a workload on one chip → per-t layer costs (`layer_costs`, schedules
//!   memoised in a `ScheduleCache`) → the best plan over micro-batch × recompute × t × p × d
//!   (candidates pruned by the best so far), and its energy per sample (layers per
//!   micro-batch; optimizer steps and gradient synchronisation per iteration).
//! - `row.rs`: `DesignRow`, the CSV row of docs/design.md §9.
//! - `sweep.rs`: `Sweep` (from a `SweepRecord` = `run.toml`), point ids, exact evaluation of
//!   the undominated points in parallel batches streamed to `points.csv`, resume, `Shard`.
//! - `screen.rs`: pass 1 — the work bound of every point (`LayerWork`), then a branch and bound
//!   in order of falling bound that prices points with `throughput_bound` (schedule lower
//!   bounds) and list-schedule plans only while they might beat the per-workload staircase of
//!   achievable throughput at their area.
//! - `finish.rs`: `pareto.csv`, `best.json`, `pareto.svg` from `points.csv` alone, and `merge`.
//! - `compare.rs`: the baseline / decoupled / co-design table (`Comparison`, `BaselinePlans`
//!   from `workloads/plans/phaze.toml`) and its CSV, Markdown and SVG.

mod compare;
mod evaluate;
mod finish;
mod row;
mod screen;
mod status;
mod sweep;

pub use compare::{
    markdown_table, write_comparison, BaselinePlans, CompareRow, Comparison, FixedWidths,
    COMPARE_CSV, COMPARE_MD, COMPARE_SVG,
};
pub use evaluate::{
    evaluate, evaluate_faster_than, evaluate_on, layer_costs, recompute_from_name, recompute_name,
    tensor_widths, throughput_bound, EvaluateError, Evaluation, LayerCosts, LayerEnergy, LayerWork,
    PlanBound, PlanOptions, UniqueLayerSchedule, BOUND_SLACK,
};
pub use finish::{finish, merge, pareto_front, BestPoints};
pub use row::{append_rows, DesignRow, Status};
pub use screen::screen_blocks;
pub use status::{host_name, read_status, DirStatus, RunState, SweepStatus, STATUS_JSON};
pub use sweep::{
    first_repeated, read_points, run_sweep, Objective, Phase, RunOptions, Shard, Sweep, SweepError,
    SweepRecord, SweepStats, POINTS_CSV, RUN_TOML, SCREEN_CSV, SEED_CSV, SHARD_TOML,
};
