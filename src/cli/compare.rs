//! `tandem compare`: baseline chips (fixed and searched plans), the decoupled search and
//! co-design, per workload, in one table.

use super::common::{ObjectiveArg, SweepAxes};
use anyhow::{Context, Result};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::arch::{load_chip, SearchSpace};
use tandem::schedule::SolverOptions;
use tandem::search::{markdown_table, write_comparison, BaselinePlans, Comparison};
use tandem::workload::Workload;

/// Compare, per workload: each baseline chip with the fixed plan of the plans file and with
/// the searched plan, the decoupled search (the space's best chip for one layer on one device,
/// then planned), the hardware-first search, and co-design (the joint search of `tandem
/// search`, with each baseline's peak power as a power level; also held to each baseline's area
/// and to its peak power, read off that sweep's points), all by `--objective`. Writes
/// OUT/compare.csv, compare.md, compare.svg, and each workload's sweeps under OUT/sweeps/
/// (`<workload>` for throughput and throughput per area, `<workload>.energy` for energy, and
/// their `.fixed-plan` siblings).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workload file; repeat for several.
    #[arg(long, required = true)]
    workload: Vec<PathBuf>,
    /// Devices in the cluster (default: the plans file's).
    #[arg(long)]
    devices: Option<u32>,
    /// Search-space file for the decoupled and co-design rows.
    #[arg(long)]
    space: PathBuf,
    /// Baseline chip file; repeat for several (the first one's fixed plan is the reference).
    #[arg(long, required = true)]
    baseline: Vec<PathBuf>,
    /// Fixed (t, p, d) per workload for the baselines.
    #[arg(long, default_value = "workloads/plans/phaze.toml")]
    plans: PathBuf,
    #[command(flatten)]
    axes: SweepAxes,
    /// What the sweeps maximise and the rows choose by (HBM size, the iso-area and iso-power
    /// rows); the tables add its value and its gain over the reference row.
    #[arg(long, value_enum, default_value_t = ObjectiveArg::Throughput)]
    objective: ObjectiveArg,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Continue the co-design sweeps an earlier run left in OUT/sweeps/ (without it, finding
    /// one is an error).
    #[arg(long)]
    resume: bool,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let plans = BaselinePlans::load(&args.plans)?;
    let devices = args.devices.unwrap_or(plans.devices);
    if devices == 0 {
        anyhow::bail!("--devices: must be at least 1");
    }
    if devices != plans.devices {
        eprintln!(
            "note: {} holds plans for {} devices; the cluster has {devices}",
            args.plans.display(),
            plans.devices
        );
    }
    let space = SearchSpace::load(&args.space)?;
    let hbm_bytes = args.axes.hbm_bytes(&space)?;
    let baselines = args
        .baseline
        .iter()
        .map(|p| load_chip(p))
        .collect::<Result<Vec<_>, _>>()?;
    let comparison = Comparison {
        space_path: args.space.clone(),
        space,
        baselines,
        plans,
        devices,
        micro_batches: args.axes.micro_batches()?,
        recompute: args.axes.recompute()?,
        hbm_bytes,
        zero: args.axes.zero()?,
        solver: SolverOptions::default(),
        objective: args.objective.into(),
        resume: args.resume,
        progress: std::io::stderr().is_terminal(),
        space_memo: Default::default(),
    };
    let mut rows = Vec::new();
    for path in &args.workload {
        let workload = Workload::load(path)?;
        eprintln!("== {}", workload.name);
        let sweep_dir = comparison.sweep_dir(&args.out.join("sweeps"), &workload.name);
        let table = comparison
            .compare_workload(&workload, path, &sweep_dir)
            .with_context(|| format!("comparing {}", workload.name))?;
        println!("## {}\n\n{}", workload.name, markdown_table(&table));
        rows.extend(table);
    }
    write_comparison(&rows, &args.out)?;
    eprintln!("wrote {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}
