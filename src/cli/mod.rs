//! Subcommands. Each file holds one command's arguments and its thin driver.

mod area;
mod calibrate;
mod common;
mod compare;
mod inspect;
mod merge;
mod place;
mod plan;
mod power;
mod schedule;
mod search;
mod status;
mod study;
mod validate;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// tandem: co-design accelerator hardware and the distributed training plan of large models.
///
/// All quantities are SI (seconds, bytes, FLOP, joules, mm²) unless an option's name says
/// otherwise (e.g. `--hbm-gib`).
#[derive(Debug, Parser)]
#[command(name = "tandem", version, about, long_about = None, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Inspect(inspect::Args),
    Area(area::Args),
    Power(power::Args),
    Schedule(schedule::Args),
    Plan(plan::Args),
    Place(place::Args),
    Calibrate(calibrate::Args),
    Validate(validate::Args),
    Search(search::Args),
    Merge(merge::Args),
    Status(status::Args),
    Compare(compare::Args),
    Study(study::Args),
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Area(args) => area::run(&args),
        Command::Power(args) => power::run(&args),
        Command::Schedule(args) => schedule::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Place(args) => place::run(&args),
        Command::Calibrate(args) => calibrate::run(&args),
        Command::Validate(args) => validate::run(&args),
        Command::Search(args) => search::run(&args),
        Command::Merge(args) => merge::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Study(args) => study::run(&args),
    }
}
