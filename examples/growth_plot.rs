//! The sweep-growth chart of BENCHMARKS.md from `scripts/bench-growth.sh`'s CSV: wall time and
//! exactly evaluated points against the points of each space, one line per cluster size.
//!
//! `cargo run --release --example growth_plot -- growth.csv growth.svg`

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use tandem::report::svg::{growth, GrowthRun, GrowthSeries};

/// The columns of a bench-growth row this chart reads.
#[derive(Deserialize)]
struct Row {
    devices: u32,
    points: f64,
    wall_s: f64,
    exact_ok: f64,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [csv_path, svg_path] = args.as_slice() else {
        bail!("usage: growth_plot GROWTH.csv OUT.svg");
    };
    let mut reader = csv::Reader::from_path(csv_path).with_context(|| csv_path.clone())?;
    let mut per_devices: BTreeMap<u32, Vec<GrowthRun>> = BTreeMap::new();
    for (i, row) in reader.deserialize::<Row>().enumerate() {
        let row = row.with_context(|| format!("{csv_path}: row {}", i + 1))?;
        per_devices.entry(row.devices).or_default().push(GrowthRun {
            points: row.points,
            wall_s: row.wall_s,
            exact_points: row.exact_ok,
        });
    }
    let series: Vec<GrowthSeries> = per_devices
        .into_iter()
        .map(|(devices, mut runs)| {
            runs.sort_by(|a, b| a.points.total_cmp(&b.points));
            GrowthSeries {
                name: format!("{devices} devices"),
                runs,
            }
        })
        .collect();
    let svg = growth(&series).map_err(anyhow::Error::msg)?;
    std::fs::write(svg_path, svg).with_context(|| svg_path.clone())?;
    Ok(())
}
