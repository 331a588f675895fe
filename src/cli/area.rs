//! `tandem area`: chip area by component from the PHAZE template model.

use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::arch::{area_breakdown, load_chip};
use tandem::report;

/// Print a chip's area in mm² by component (PHAZE closed-form area model, 22 nm).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Chip file (TOML), e.g. arch_specs/phaze-tpuv4-template.toml.
    #[arg(long)]
    arch: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let arch = load_chip(&args.arch)?;
    let area = area_breakdown(&arch);
    if args.json {
        let value = serde_json::json!({
            "arch": arch.name,
            "area_mm2": area,
            "die_area_mm2": arch.die_area_mm2,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    let tc = &arch.tensor;
    let vc = &arch.vector;
    let rows = vec![
        row(
            &format!("tensor cores ({} x {}x{})", tc.count, tc.rows, tc.cols),
            area.tensor_mm2,
        ),
        row(
            &format!(
                "tensor local buffers ({})",
                report::bytes(tc.local_buffer_bytes as f64)
            ),
            area.tensor_local_mm2,
        ),
        row(
            &format!("vector cores ({} x {} lanes)", vc.count, vc.lanes),
            area.vector_mm2,
        ),
        row(
            &format!(
                "vector local buffers ({})",
                report::bytes(vc.local_buffer_bytes as f64)
            ),
            area.vector_local_mm2,
        ),
        row(
            &format!("global buffer ({})", report::bytes(arch.glb.bytes as f64)),
            area.glb_mm2,
        ),
        row("total", area.total_mm2),
    ];
    println!("{} — template area model (PHAZE, 22 nm)", arch.name);
    println!("{}", report::table(&["component", "area (mm²)"], rows));
    if let Some(die) = arch.die_area_mm2 {
        println!("published die area: {die:.1} mm² (whole chip, for comparison)");
    }
    Ok(ExitCode::SUCCESS)
}

fn row(label: &str, mm2: f64) -> Vec<String> {
    vec![label.to_string(), format!("{mm2:.2}")]
}
