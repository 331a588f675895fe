//! `tandem place`: the placement search on per-layer costs the user measured.

use super::common::{hbm_gib_to_bytes, plan_shape, print_plan_body};
use super::plan::EXIT_INFEASIBLE;
use anyhow::{bail, Result};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::placement::{load_costs_file, place};
use tandem::report::percent;

/// Find the best data × tensor × pipeline plan for per-layer costs given as JSON (schema:
/// README, "Bring your own layer costs"), e.g. profiled on your own hardware.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Per-layer costs, one layer graph per tensor width, plus cluster and training setup.
    #[arg(long)]
    layers: PathBuf,
    /// Override the file's device count.
    #[arg(long)]
    devices: Option<u32>,
    /// Override the file's HBM per device, GiB.
    #[arg(long, value_name = "GIB", allow_negative_numbers = true)]
    hbm_gib: Option<f64>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let mut problem = load_costs_file(&args.layers)?;
    if let Some(devices) = args.devices {
        if devices == 0 {
            bail!("--devices: must be at least 1");
        }
        problem.devices = devices;
    }
    if let Some(gib) = args.hbm_gib {
        problem.hbm_bytes = hbm_gib_to_bytes(gib)?;
    }
    match place(&problem) {
        Ok(plan) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&plan)?);
            } else {
                let p = &plan;
                println!(
                    "{}, micro-batch {} ({} per pipeline), {} of {} devices used",
                    plan_shape(p),
                    p.micro_batch,
                    p.micro_batches_per_pipeline,
                    p.devices_used,
                    problem.devices
                );
                println!(
                    "{:.4} s per batch, {:.2} samples/s; bubble {} of the time",
                    p.time_per_batch_s,
                    p.throughput_samples_per_s,
                    percent(p.time_split.bubble_s / p.time_per_batch_s)
                );
                let graph = problem
                    .graphs
                    .iter()
                    .find(|g| g.tp == p.tp)
                    .unwrap_or(&problem.graphs[0]);
                let names: Vec<String> = graph.layers.iter().map(|l| l.name.clone()).collect();
                print_plan_body(p, &names, problem.hbm_bytes);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            if args.json {
                let value = json!({
                    "status": "infeasible",
                    "reasons": why.reasons,
                    "alternatives": why.alternatives,
                });
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                println!("{}: {why}", args.layers.display());
            }
            Ok(ExitCode::from(EXIT_INFEASIBLE))
        }
    }
}
