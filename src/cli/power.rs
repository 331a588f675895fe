//! `tandem power`: a chip's peak power, and the fit of its static power to measured kernels.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tandem::arch::{area_breakdown, load_chip};
use tandem::calibrate::{load_collected, Target};
use tandem::cost::{fit_static_power, peak_power, PowerSample, MIN_POWER_WINDOW_S};
use tandem::error::InputError;
use tandem::report::table;
use tandem::workload::OpKind;

/// Print each chip's peak power: static power (`energy.static_power_w_per_mm2` × template
/// area) plus the dynamic power of its densest kernel, the larger of a dense 16384³ bf16 GEMM
/// on every tensor core and a streaming add of 2³⁰ bf16 elements through HBM (energy model
/// over latency). With `--fit`, first fit the first chip's static power to measured kernels.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Chip file (TOML); repeat for several.
    #[arg(long, required = true)]
    arch: Vec<PathBuf>,
    /// A `kernels.csv` of calibration/collect.py with board power (`power_run_w`): fit the
    /// first chip's static power to its GEMM rows timed for at least one second (board power
    /// = static + the model's energy of the kernel over its measured time; the median).
    #[arg(long, value_name = "KERNELS_CSV")]
    fit: Option<PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// The GEMM rows of a collect.py `kernels.csv` (every layout and batched product, which the
/// model prices alike) with their board power and timed window, and how many rows are not
/// GEMMs.
fn gemm_rows(file: &Path) -> Result<(Vec<PowerSample>, usize), InputError> {
    let measurements = load_collected(file)?;
    let samples: Vec<PowerSample> = measurements
        .iter()
        .filter_map(|m| match m.target {
            Target::Op(kind @ OpKind::Gemm { .. }) => Some(PowerSample {
                kernel: m.kernel_sample(kind),
                board_power_w: m.board_power_w,
                timed_s: m.timed_s,
            }),
            _ => None,
        })
        .collect();
    let other = measurements.len() - samples.len();
    Ok((samples, other))
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let chips = args
        .arch
        .iter()
        .map(|p| load_chip(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut fit_json = serde_json::Value::Null;
    if let (Some(file), Some(first)) = (&args.fit, chips.first()) {
        let (samples, other) = gemm_rows(file)?;
        let fit = fit_static_power(&first.timed_in_isolation(), &samples).with_context(|| {
            format!(
                "{}: no GEMM row with a board-power sample timed for at least {MIN_POWER_WINDOW_S} s",
                file.display()
            )
        })?;
        if args.json {
            fit_json = serde_json::json!({
                "arch": first.name,
                "kernels": file,
                "not_gemm": other,
                "fit": fit,
            });
        } else {
            println!(
                "{}: static power fitted to {} GEMM rows of {} (board power − the model's dynamic \
                 power; rows left out: {} without a power sample, {} timed under {MIN_POWER_WINDOW_S} s, \
                 {other} not GEMMs)",
                first.name,
                fit.rows.len(),
                file.display(),
                fit.without_sample,
                fit.short_window,
            );
            let rows = fit
                .rows
                .iter()
                .map(|r| {
                    let shape = match r.kind {
                        OpKind::Gemm { batch, m, n, k } => format!("{batch}x{m}x{n}x{k}"),
                        other => format!("{other:?}"),
                    };
                    vec![
                        shape,
                        format!("{:.3e}", r.measured_s),
                        format!("{:.1}", r.board_power_w),
                        format!("{:.1}", r.dynamic_w),
                        format!("{:.1}", r.static_w),
                    ]
                })
                .collect();
            println!(
                "{}",
                table(
                    &["GEMM", "median s", "board W", "dynamic W", "static W"],
                    rows
                )
            );
            println!(
                "static power: median {:.1} W (mean {:.1} W) over {:.1} mm² of template area = \
                 static_power_w_per_mm2 {:.4}",
                fit.static_w, fit.mean_static_w, fit.area_mm2, fit.static_power_w_per_mm2
            );
        }
    }
    let powers: Vec<_> = chips.iter().map(peak_power).collect();
    if args.json {
        let chips_json: Vec<_> = chips
            .iter()
            .zip(&powers)
            .map(|(arch, power)| {
                serde_json::json!({
                    "arch": arch.name,
                    "area_mm2": area_breakdown(arch).total_mm2,
                    "static_power_w_per_mm2": arch.energy.static_power_w_per_mm2,
                    "power": power,
                })
            })
            .collect();
        let value = serde_json::json!({ "fit": fit_json, "chips": chips_json });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    let rows = chips
        .iter()
        .zip(&powers)
        .map(|(arch, p)| {
            vec![
                arch.name.clone(),
                format!("{:.1}", area_breakdown(arch).total_mm2),
                format!("{:.4}", arch.energy.static_power_w_per_mm2),
                format!("{:.1}", p.static_w),
                format!("{:.1}", p.gemm_dynamic_w),
                format!("{:.1}", p.stream_dynamic_w),
                format!("{:.1}", p.peak_power_w),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "chip",
                "template mm²",
                "static W/mm²",
                "static W",
                "GEMM dynamic W",
                "stream dynamic W",
                "peak W",
            ],
            rows
        )
    );
    Ok(ExitCode::SUCCESS)
}
