//! `tandem study`: the comparison of `tandem compare` for every cluster size × objective ×
//! workload of a study file, resumable, and a summary per objective.

use anyhow::Result;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::search::{run_study, summary_paths, Study, StudyOptions};

/// Run a co-design study from a data file (studies/codesign.toml): for every cluster size ×
/// objective × workload, the rows of `tandem compare` into OUT/d<devices>/<objective>/
/// (compare.csv, .md, .svg, sweeps/; written whole as each workload finishes), then per
/// objective OUT/<objective>.md, .csv and .svg: co-design's chip, plan and objective, and its
/// gain over each baseline. Long: hours on 2 cores for the committed study.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Study file (TOML; paths in it are relative to the current directory).
    #[arg(long)]
    config: PathBuf,
    /// Output directory (must be empty or absent unless --resume).
    #[arg(long)]
    out: PathBuf,
    /// Continue a study in OUT: finished cells are kept, partial sweeps continue; on a
    /// finished study only the summaries are rewritten.
    #[arg(long)]
    resume: bool,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let study = Study::load(&args.config)?;
    let options = StudyOptions {
        out: args.out.clone(),
        resume: args.resume,
        progress: std::io::stderr().is_terminal(),
    };
    run_study(&study, &options, |line| eprintln!("{line}"))?;
    for objective in &study.objectives {
        for path in summary_paths(&args.out, *objective) {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
