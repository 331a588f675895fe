//! `tandem merge`: shards of one sweep joined into the files a single run writes.

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::search::merge;

/// Join the output directories of `tandem search --shard i/n` runs (all n shards of one sweep)
/// into OUT, with the same points.csv, pareto.csv, best.json and pareto.svg as one run.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Shard output directories.
    #[arg(required = true)]
    shards: Vec<PathBuf>,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let record = merge(&args.shards, &args.out)?;
    super::search::finish_merged(&record, &args.out)?;
    eprintln!("wrote {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}
