//! `tandem compare`: baseline chips (fixed and searched plans), the decoupled search and
//! co-design, per workload, in one table.

use super::common::hbm_gib_to_bytes;
use super::plan::Recompute;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::arch::{load_chip, SearchSpace};
use tandem::schedule::SolverOptions;
use tandem::search::{markdown_table, write_comparison, BaselinePlans, Comparison};
use tandem::workload::Workload;

/// Compare, per workload: each baseline chip with the fixed plan of the plans file and with
/// the searched plan, the decoupled search (the space's best chip for one layer on one device,
/// then planned) and co-design (the joint search of `tandem search`). Writes OUT/compare.csv,
/// compare.md, compare.svg, and each workload's sweep under OUT/sweeps/.
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
    #[arg(long, default_value = "workloads/phaze-plans.toml")]
    plans: PathBuf,
    /// Micro-batch sizes searched, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    micro_batch: Vec<u32>,
    /// Recompute modes searched, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Recompute::None, Recompute::Full])]
    recompute: Vec<Recompute>,
    /// HBM sizes (GiB) of the co-design sweep and the decoupled chip (default: the space's).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "GIB",
        allow_negative_numbers = true
    )]
    hbm_gib: Vec<f64>,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
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
    if args.micro_batch.is_empty() || args.micro_batch.contains(&0) {
        anyhow::bail!("--micro-batch: give positive micro-batch sizes");
    }
    let space = SearchSpace::load(&args.space)?;
    let hbm_bytes = if args.hbm_gib.is_empty() {
        vec![space.base_hbm_bytes()]
    } else {
        args.hbm_gib
            .iter()
            .map(|&g| hbm_gib_to_bytes(g))
            .collect::<Result<_>>()?
    };
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
        micro_batches: args.micro_batch.clone(),
        recompute: args.recompute.iter().map(|&r| r.into()).collect(),
        hbm_bytes,
        solver: SolverOptions::default(),
    };
    let mut rows = Vec::new();
    for path in &args.workload {
        let workload = Workload::load(path)?;
        eprintln!("== {}", workload.name);
        let sweep_dir = args.out.join("sweeps").join(&workload.name);
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
