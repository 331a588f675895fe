//! `tandem status`: where the runs in a set of sweep directories stand (a job array's shards).

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::report::table;
use tandem::search::{read_status, DirStatus, RunState};

/// Summarise the `status.json` of sweep output directories (one per shard): phase, points
/// done of the total, rate and ETA, and runs that stopped without finishing.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sweep output directories.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
}

fn duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// Exit status 0 when every run is done, 1 when one failed or stopped, 0 otherwise (running
/// or not started are normal states of a job array).
pub fn run(args: &Args) -> Result<ExitCode> {
    let mut rows = Vec::new();
    let (mut done, mut running, mut failed, mut waiting) = (0, 0, 0, 0);
    let mut eta_s: f64 = 0.0;
    for dir in &args.dirs {
        let name = dir.display().to_string();
        match read_status(dir) {
            DirStatus::NotStarted => {
                waiting += 1;
                rows.push(vec![
                    name,
                    "-".into(),
                    "not started".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ]);
            }
            DirStatus::Unreadable(why) => {
                failed += 1;
                rows.push(vec![
                    name,
                    "-".into(),
                    format!("unreadable: {why}"),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ]);
            }
            DirStatus::Known { status, gone } => {
                let state = match (status.state, gone) {
                    (RunState::Running, true) => {
                        failed += 1;
                        format!("stopped (pid {} on {} is gone)", status.pid, status.host)
                    }
                    (RunState::Running, false) => {
                        running += 1;
                        eta_s = eta_s.max(status.eta_s.unwrap_or(0.0));
                        format!("running (pid {} on {})", status.pid, status.host)
                    }
                    (RunState::Done, _) => {
                        done += 1;
                        "done".into()
                    }
                    (RunState::Failed, _) => {
                        failed += 1;
                        format!("failed: {}", status.error)
                    }
                };
                rows.push(vec![
                    name,
                    status.phase.clone(),
                    state,
                    format!("{} / {} {}", status.done, status.total, status.unit),
                    format!("{:.1} {}/s", status.rate_per_s, status.unit),
                    match (status.state, status.eta_s) {
                        (RunState::Running, Some(eta)) if !gone => duration(eta),
                        _ => "-".into(),
                    },
                ]);
            }
        }
    }
    println!(
        "{}",
        table(
            &["directory", "phase", "state", "done", "rate", "ETA"],
            rows
        )
    );
    println!(
        "{} directories: {done} done, {running} running, {failed} failed or stopped, {waiting} not started{}",
        args.dirs.len(),
        if running > 0 {
            format!("; the last running one ends in about {}", duration(eta_s))
        } else {
            String::new()
        }
    );
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
