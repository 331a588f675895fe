//! `tandem schedule`: each unique layer's operators scheduled on a chip's cores.

use super::common::SolverArgs;
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tandem::arch::load_chip;
use tandem::cost::CostModel;
use tandem::model::{layer_costs, UniqueLayerSchedule};
use tandem::report::{percent, seconds, table};
use tandem::schedule::{render_gantt, Assignment, Schedule, ScheduleCache, ScheduleProblem};
use tandem::workload::Workload;

/// Schedule each unique layer's forward and backward operator graph on the chip's tensor
/// cores, vector cores and network link, minimising the makespan (ILP on HiGHS between a
/// list-scheduling upper bound and a critical-path / work lower bound), and print each pass as
/// plans price it (`pass`: with the chip's eager launch costs and, on a serial chip, the
/// contention of asynchronous collectives).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workload file: a model template (TOML) or an operator DAG (JSON).
    #[arg(long)]
    workload: PathBuf,
    /// Chip file (TOML).
    #[arg(long)]
    arch: PathBuf,
    /// Micro-batch size (samples per forward pass).
    #[arg(long, default_value_t = 1)]
    micro_batch: u32,
    /// Tensor-parallel width t.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Sequence parallelism (reduce-scatter + all-gather instead of all-reduce).
    #[arg(long)]
    seq_parallel: bool,
    #[command(flatten)]
    solver: SolverArgs,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Draw each schedule as SVG: PATH `g.svg` writes `g-<layer>-fwd.svg` and `g-<layer>-bwd.svg`.
    #[arg(long, value_name = "PATH")]
    gantt: Option<PathBuf>,
}

#[derive(Serialize)]
struct OpRow<'a> {
    op: &'a str,
    cores: String,
    start_s: f64,
    end_s: f64,
}

#[derive(Serialize)]
struct DirectionReport<'a> {
    makespan_s: f64,
    /// The pass as plans price it: the makespan, the contention of its asynchronous
    /// collectives on a serial chip and the eager launch costs.
    pass_s: f64,
    lower_bound_s: f64,
    upper_bound_s: f64,
    status: String,
    solve_time_s: f64,
    energy_j: f64,
    utilisation: tandem::schedule::CoreUtilisation,
    ops: Vec<OpRow<'a>>,
}

#[derive(Serialize)]
struct LayerReport<'a> {
    layer: &'a str,
    signature: &'a str,
    count: usize,
    fwd: DirectionReport<'a>,
    bwd: DirectionReport<'a>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let workload = Workload::load(&args.workload)?;
    let arch = load_chip(&args.arch)?;
    let cost = CostModel::new(&arch);
    let cache = ScheduleCache::new(args.solver.options()?)?;
    let costs = layer_costs(
        &workload,
        &cost,
        &cache,
        args.tp,
        args.micro_batch,
        args.seq_parallel,
    )?;
    if let Some(path) = &args.gantt {
        for u in &costs.unique {
            for (dir, s, p) in [
                ("fwd", &u.fwd, &u.fwd_problem),
                ("bwd", &u.bwd, &u.bwd_problem),
            ] {
                let file = gantt_path(path, &u.name, dir);
                let direction = if dir == "fwd" { "forward" } else { "backward" };
                let title = format!("{} {direction}", u.name);
                render_gantt(s, p, &title, &file)
                    .with_context(|| format!("drawing {}", file.display()))?;
            }
        }
    }
    let reports: Vec<LayerReport> = costs.unique.iter().map(layer_report).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} on {}: t={} micro-batch {}{}",
        workload.name,
        arch.name,
        args.tp,
        args.micro_batch,
        if args.seq_parallel {
            ", sequence parallel"
        } else {
            ""
        }
    );
    let summary = reports
        .iter()
        .flat_map(|r| {
            [("fwd", &r.fwd), ("bwd", &r.bwd)].map(|(dir, d)| {
                vec![
                    format!("{} ×{}", r.layer, r.count),
                    dir.to_string(),
                    seconds(d.makespan_s),
                    seconds(d.pass_s),
                    seconds(d.lower_bound_s),
                    seconds(d.upper_bound_s),
                    d.status.clone(),
                    seconds(d.solve_time_s),
                    format!("{:.3e} J", d.energy_j),
                    percent(d.utilisation.tensor),
                    percent(d.utilisation.vector),
                ]
            })
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "layer",
                "dir",
                "makespan",
                "pass",
                "lower",
                "upper",
                "status",
                "solve",
                "energy",
                "tensor util",
                "vector util",
            ],
            summary,
        )
    );
    for r in &reports {
        for (dir, d) in [("forward", &r.fwd), ("backward", &r.bwd)] {
            println!("\n{} {dir}:", r.layer);
            let rows = d
                .ops
                .iter()
                .map(|o| {
                    vec![
                        o.op.to_string(),
                        o.cores.clone(),
                        seconds(o.start_s),
                        seconds(o.end_s),
                    ]
                })
                .collect();
            println!("{}", table(&["operator", "core(s)", "start", "end"], rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn layer_report(u: &UniqueLayerSchedule) -> LayerReport<'_> {
    LayerReport {
        layer: &u.name,
        signature: &u.signature,
        count: u.count,
        fwd: direction_report(&u.fwd, &u.fwd_problem, u.fwd_s),
        bwd: direction_report(&u.bwd, &u.bwd_problem, u.bwd_s),
    }
}

fn direction_report<'a>(s: &Schedule, p: &'a ScheduleProblem, pass_s: f64) -> DirectionReport<'a> {
    let mut ops: Vec<OpRow> = s
        .ops
        .iter()
        .map(|o| {
            let op = &p.ops[o.op];
            OpRow {
                op: &op.name,
                cores: match o.assignment {
                    Assignment::AllCores => format!("all {}", p.cores.of(op.core)),
                    Assignment::Core(c) => format!("{:?} {c}", op.core).to_lowercase(),
                },
                start_s: o.start_s,
                end_s: o.end_s,
            }
        })
        .collect();
    ops.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    DirectionReport {
        makespan_s: s.makespan_s,
        pass_s,
        lower_bound_s: s.lower_bound_s,
        upper_bound_s: s.upper_bound_s,
        status: s.status.to_string(),
        solve_time_s: s.solve_time_s,
        energy_j: s.energy_j,
        utilisation: s.utilisation,
        ops,
    }
}

/// `dir/g.svg` → `dir/g-<layer>-<direction>.svg`.
fn gantt_path(path: &Path, layer: &str, direction: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "gantt".to_string());
    let safe: String = layer
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    path.with_file_name(format!("{stem}-{safe}-{direction}.svg"))
}
