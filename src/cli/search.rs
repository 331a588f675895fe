//! `tandem search`: a design-space sweep (configurations × HBM × micro-batch × recompute) with
//! the best plan per point, streamed to CSV, and its summaries.

use super::common::{ObjectiveArg, SolverArgs, SweepAxes};
use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tandem::report::{self, table};
use tandem::search::{
    finish, run_sweep, BestPoints, Objective, Phase, PlanSummary, RunOptions, Shard, Sweep,
    SweepRecord,
};

/// Search accelerator configurations × HBM size × micro-batch × recompute, each design point
/// with its best parallel plan. Writes OUT/points.csv (every point, streamed), pareto.csv,
/// best.json, pareto.svg and run.toml.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workload file (TOML template or JSON DAG); repeat for several (the objective is then
    /// the mean over workloads).
    #[arg(long, required = true)]
    workload: Vec<PathBuf>,
    /// Search-space file (arch_specs/phaze.toml or your own).
    #[arg(long)]
    space: PathBuf,
    /// Devices in the cluster.
    #[arg(long)]
    devices: u32,
    #[command(flatten)]
    axes: SweepAxes,
    /// What the best point maximises.
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Throughput)]
    objective: ObjectiveArg,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Run only shard i of n (configurations with index ≡ i mod n); join with `tandem merge`.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Continue an interrupted sweep in OUT (same inputs), skipping finished points.
    #[arg(long)]
    resume: bool,
    /// Run one pass of a sweep split over machines: `seed` screens block 0, which seeds every
    /// other block, into OUT/seed.csv (once, before the shards); `screen` bounds this shard's
    /// blocks of the space into OUT/screen.csv (from `--seed`'s seed where given); `exact`
    /// then evaluates this shard's points against the screens of every shard (`--screens`).
    /// Without it a shard screens the whole space.
    #[arg(long, value_enum)]
    phase: Option<PhaseArg>,
    /// With `--phase screen`: the directory of the `--phase seed` run (its seed.csv).
    #[arg(long, value_name = "DIR")]
    seed: Option<PathBuf>,
    /// With `--phase exact`: every shard's output directory (their screen.csv files).
    #[arg(long, num_args = 1.., value_name = "DIR")]
    screens: Vec<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Evaluate every point (no pruning).
    #[arg(long)]
    no_prune: bool,
    /// Search only configurations whose peak power (static power of the template area plus
    /// the dynamic power of the densest kernel: `tandem power`) is at most this many watts.
    #[arg(long, value_name = "W", allow_negative_numbers = true)]
    max_power_w: Option<f64>,
    /// Also keep the best point exact under each of these peak powers (watts, comma-separated,
    /// rising; one workload): a point is pruned only by one of no larger area that is no
    /// hungrier, so `points.csv` answers "the best chip under W watts" for each level.
    #[arg(
        long,
        value_name = "W",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    power_levels_w: Vec<f64>,
    #[command(flatten)]
    solver: SolverArgs,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PhaseArg {
    Seed,
    Screen,
    Exact,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    if let Some(threads) = args.threads {
        if threads == 0 {
            anyhow::bail!("--threads: must be at least 1");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .context("--threads: starting the worker pool")?;
    }
    let shard = match &args.shard {
        Some(text) => Shard::parse(text).map_err(|e| anyhow::anyhow!("--shard: {e}"))?,
        None => Shard::WHOLE,
    };
    let space = tandem::arch::SearchSpace::load(&args.space)?;
    let hbm_bytes = args.axes.hbm_bytes(&space)?;
    let record = SweepRecord {
        tandem_version: env!("CARGO_PKG_VERSION").to_string(),
        workloads: args.workload.clone(),
        space: args.space.clone(),
        devices: args.devices,
        micro_batches: args.axes.micro_batches()?,
        recompute: args.axes.recompute()?,
        hbm_bytes,
        zero: args.axes.zero()?,
        fixed: Default::default(),
        objective: args.objective.into(),
        prune: !args.no_prune,
        ilp_time_limit_s: args.solver.limits.ilp_time_limit_s,
        ilp_node_limit: args.solver.limits.ilp_node_limit,
        ilp_relative_gap: args.solver.limits.ilp_gap,
        search_node_limit: args.solver.limits.search_node_limit,
        use_ilp: !args.solver.no_ilp,
        inputs_sha256: Vec::new(),
        max_peak_power_w: args.max_power_w,
        power_levels_w: args.power_levels_w.clone(),
    };
    let sweep = Sweep::from_record(&record)?;
    eprintln!(
        "sweeping {} configurations{} × {} HBM × {} micro-batch × {} recompute × {} workload(s){}",
        sweep.space.len(),
        sweep
            .max_peak_power_w
            .map_or(String::new(), |cap| format!(" (peak power ≤ {cap} W)")),
        sweep.hbm_bytes.len(),
        sweep.micro_batches.len(),
        sweep.recompute.len(),
        sweep.workloads.len(),
        if shard == Shard::WHOLE {
            String::new()
        } else {
            format!(", shard {}/{}", shard.index, shard.count)
        }
    );
    if matches!(args.phase, Some(PhaseArg::Screen | PhaseArg::Exact)) && args.shard.is_none() {
        anyhow::bail!("--phase screen and --phase exact run one shard: give --shard i/n");
    }
    if args.seed.is_some() && args.phase != Some(PhaseArg::Screen) {
        anyhow::bail!("--seed: only with --phase screen");
    }
    let phase = match (args.phase, args.screens.is_empty()) {
        (None, true) => Phase::Whole,
        (Some(PhaseArg::Seed), true) => Phase::Seed,
        (Some(PhaseArg::Screen), true) => Phase::Screen {
            seed: args.seed.clone(),
        },
        (Some(PhaseArg::Exact), false) => Phase::Exact {
            screens: args.screens.clone(),
        },
        (Some(PhaseArg::Exact), true) => {
            anyhow::bail!("--phase exact: give every shard's directory with --screens")
        }
        (_, false) => anyhow::bail!("--screens: only with --phase exact"),
    };
    let options = RunOptions {
        out_dir: args.out.clone(),
        shard,
        resume: args.resume,
        progress: !args.quiet && std::io::stderr().is_terminal(),
        phase,
    };
    let stats = run_sweep(&sweep, &record, &options)?;
    if matches!(options.phase, Phase::Seed | Phase::Screen { .. }) {
        eprintln!(
            "screened {} configurations{} in {:.1} s (work bounds {:.1} s; plan bounds and \
             list-schedule plans {:.1} s for {} points, {} raising a staircase; of which the \
             pilot {:.1} s over {} configurations); wrote {}",
            stats.configurations,
            if stats.skipped > 0 {
                " (already screened)"
            } else {
                ""
            },
            stats.screen_time_s,
            stats.work_bound_time_s,
            stats.plan_bound_time_s,
            stats.plan_bounded,
            stats.achievable_found,
            stats.pilot_time_s,
            stats.pilot_configs,
            args.out
                .join(if options.phase == Phase::Seed {
                    tandem::search::SEED_CSV
                } else {
                    tandem::search::SCREEN_CSV
                })
                .display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "{} points: {} evaluated ({} ok, {} infeasible), {} pruned, {} already done",
        stats.points, stats.evaluated, stats.ok, stats.infeasible, stats.pruned, stats.skipped,
    );
    if sweep.prunes_energy() {
        eprintln!(
            "bounds {:.1} s (energy bounds {:.1} s; memory checks {:.1} s for {} HBM × \
             micro-batch × recompute); exact points {:.1} s; whole sweep {:.1} s",
            stats.screen_time_s,
            stats.work_bound_time_s,
            stats.plan_bound_time_s,
            stats.plan_bounded,
            stats.sweep_time_s - stats.screen_time_s,
            stats.sweep_time_s
        );
    } else {
        eprintln!(
            "screen {:.1} s (work bounds {:.1} s; plan bounds and list-schedule plans {:.1} s \
             for {} points, {} raising the staircase; of which the pilot {:.1} s over {} \
             configurations); exact points {:.1} s; whole sweep {:.1} s",
            stats.screen_time_s,
            stats.work_bound_time_s,
            stats.plan_bound_time_s,
            stats.plan_bounded,
            stats.achievable_found,
            stats.pilot_time_s,
            stats.pilot_configs,
            stats.sweep_time_s - stats.screen_time_s,
            stats.sweep_time_s
        );
    }
    let best = finish(&sweep, &args.out)?;
    print_top(&best);
    eprintln!("wrote {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

/// The ten best points per workload.
pub fn print_top(best: &BestPoints) {
    let rows = best
        .top
        .iter()
        .map(|r| {
            let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
            let plan = r.plan();
            vec![
                r.workload.clone(),
                r.arch.clone(),
                format!("{:.1}", r.area_mm2),
                format!("{:.0}", report::gib(r.hbm_bytes)),
                opt(r.micro_batch),
                r.recompute.map_or(String::new(), |m| m.to_string()),
                r.plan().map_or("-".into(), row_plan),
                plan.map_or("-".into(), |p| format!("{:.2}", p.throughput_samples_per_s)),
                plan.map_or("-".into(), |p| format!("{:.1} %", p.mfu * 100.0)),
                plan.map_or("-".into(), |p| format!("{:.3}", p.energy_per_sample_j)),
            ]
        })
        .collect();
    println!("best points by {} (ten per workload):", best.objective);
    println!(
        "{}",
        table(
            &[
                "workload",
                "arch",
                "mm²",
                "HBM GiB",
                "b",
                "recompute",
                "plan",
                "samples/s",
                "MFU",
                "J/sample",
            ],
            rows,
        )
    );
    if let Some(set) = &best.set {
        let mean = set.mean_objective;
        let score = match best.objective {
            Objective::Throughput => format!("mean throughput {mean:.2} samples/s"),
            Objective::ThroughputPerArea => {
                format!("mean throughput per area {mean:.4} samples/s/mm²")
            }
            Objective::Energy => format!("mean energy {:.3} J/sample", -mean),
        };
        println!(
            "best for the set: configuration {} ({}), HBM {:.0} GiB, {:.1} mm², {score} \
             (arithmetic mean over the {} workloads of each one's best)",
            set.config,
            set.arch,
            report::gib(set.hbm_bytes),
            set.area_mm2,
            set.rows.len()
        );
    }
}

/// A row's plan in one line. The row keeps the plan's devices, not each stage's replicas, so
/// the replicas per stage are their mean (devices / (t · pipelines · stages)).
fn row_plan(plan: &PlanSummary) -> String {
    let (tp, pipelines, stages, devices) = (plan.tp, plan.dp, plan.pp, plan.devices_used);
    let groups = tp * pipelines * stages;
    if devices == groups {
        return report::plan_line(tp, pipelines, stages, "1");
    }
    let mean = f64::from(devices) / f64::from(groups);
    let replicas = if mean.fract() == 0.0 {
        format!("{mean:.0}")
    } else {
        format!("{mean:.1}")
    };
    format!(
        "{} (mean)",
        report::plan_line(tp, pipelines, stages, &replicas)
    )
}

/// A directory's summaries after a merge.
pub fn finish_merged(record: &SweepRecord, out: &Path) -> Result<()> {
    let sweep = Sweep::from_record(record)?;
    let best = finish(&sweep, out)?;
    print_top(&best);
    Ok(())
}
