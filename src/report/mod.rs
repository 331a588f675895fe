//! Presentation: aligned text tables and human-readable quantities (here), CSV files
//! (`csv.rs`), Markdown tables (`markdown.rs`) and SVG charts (`svg/`: one palette and page
//! setup; Gantt charts, Pareto fronts, speed-up bars). Nothing here computes a model quantity:
//! it formats what other stages return, as plain data.

pub mod csv;
pub mod markdown;
pub mod svg;

use comfy_table::{presets::UTF8_BORDERS_ONLY, CellAlignment, Table};

/// A text table with a header row; numeric columns are right-aligned.
pub fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    for (i, column) in t.column_iter_mut().enumerate() {
        if i > 0 {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    t.to_string()
}

/// Bytes in a GiB (2³⁰).
pub const GIB: f64 = (1u64 << 30) as f64;

/// Bytes in GiB, for tables and messages that state memory in GiB.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// Bytes in the largest binary unit that holds them exactly, without a space, as chip names
/// carry them: `128MiB`, `164KiB`, `2GiB`, `1000B`.
pub fn exact_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(size, _)| bytes.is_multiple_of(*size))
        .map_or(format!("{bytes}B"), |(size, unit)| {
            format!("{}{unit}", bytes / size)
        })
}

/// Bytes in binary units (KiB, MiB, GiB) with three significant digits.
pub fn bytes(value: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = value;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.3} {}", UNITS[unit])
    }
}

/// A quantity with an SI prefix (k, M, G, T, P, E) and a unit, e.g. `1.23 TFLOP`.
pub fn si(value: f64, unit: &str) -> String {
    const PREFIXES: [(f64, &str); 6] = [
        (1e18, "E"),
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
    ];
    for (scale, prefix) in PREFIXES {
        if value.abs() >= scale {
            return format!("{:.3} {prefix}{unit}", value / scale);
        }
    }
    format!("{value:.3} {unit}")
}

/// Seconds shown in the most readable of s, ms, µs.
pub fn seconds(value_s: f64) -> String {
    if value_s.abs() >= 1.0 {
        format!("{value_s:.3} s")
    } else if value_s.abs() >= 1e-3 {
        format!("{:.3} ms", value_s * 1e3)
    } else {
        format!("{:.2} µs", value_s * 1e6)
    }
}

/// A fraction as a percentage with one decimal, e.g. `0.4567` → `45.7 %`.
pub fn percent(fraction: f64) -> String {
    format!("{:.1} %", 100.0 * fraction)
}

/// A number for an axis tick: up to two decimals, trailing zeros dropped, thousands as `k`,
/// millions as `M` (e.g. `100k`, `2.5k`, `120`, `0.05`).
pub fn tick(value: f64) -> String {
    let (scaled, suffix) = if value.abs() >= 1e6 {
        (value / 1e6, "M")
    } else if value.abs() >= 1e3 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let text = format!("{scaled:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    let text = if text == "-0" { "0" } else { text };
    format!("{text}{suffix}")
}

/// Tick values for a log axis over `lo..=hi` (both positive): powers of ten, with 2 and 5
/// times them, or more mantissas, until there are at least four.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    const MANTISSAS: [&[f64]; 4] = [
        &[1.0],
        &[1.0, 2.0, 5.0],
        &[1.0, 2.0, 3.0, 5.0, 7.0],
        &[1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    ];
    let mut ticks = Vec::new();
    for mantissas in MANTISSAS {
        ticks.clear();
        let mut decade = 10f64.powf(lo.log10().floor());
        while decade <= hi {
            ticks.extend(
                mantissas
                    .iter()
                    .map(|m| m * decade)
                    .filter(|t| (lo..=hi).contains(t)),
            );
            decade *= 10.0;
        }
        if ticks.len() >= 4 {
            break;
        }
    }
    ticks
}

/// A plan in one line: tensor width, pipelines, stages and the replicas of each stage, e.g.
/// `t=4, 1 pipeline of 25 stages × 40–48 replicas`. `replicas` is the text for the count:
/// `40`, a range `40–48`, or a mean marked as one.
pub fn plan_line(tp: u32, pipelines: u32, stages: u32, replicas: &str) -> String {
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    format!(
        "t={tp}, {pipelines} pipeline{} of {stages} stage{} × {replicas} replica{}",
        plural(pipelines),
        plural(stages),
        if replicas == "1" { "" } else { "s" }
    )
}

/// The replicas of a plan's stages: one number when all stages have as many, else `min–max`.
pub fn replica_range(fewest: u32, most: u32) -> String {
    if fewest == most {
        most.to_string()
    } else {
        format!("{fewest}–{most}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_scaled_to_readable_units() {
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(80.0 * 1024.0 * 1024.0 * 1024.0), "80.000 GiB");
        assert_eq!(si(174.6e9, ""), "174.600 G");
        assert_eq!(si(3.14e20, "FLOP"), "314.000 EFLOP");
        assert_eq!(seconds(0.0123), "12.300 ms");
        assert_eq!(seconds(4.5e-6), "4.50 µs");
        assert_eq!(seconds(2.0), "2.000 s");
        assert_eq!(percent(0.4567), "45.7 %");
    }

    #[test]
    fn bytes_are_named_in_the_largest_exact_unit() {
        assert_eq!(exact_bytes(128 << 20), "128MiB");
        assert_eq!(exact_bytes(164 << 10), "164KiB");
        assert_eq!(exact_bytes(2 << 30), "2GiB");
        assert_eq!(exact_bytes(1000), "1000B");
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(100_000.0), "100k");
        assert_eq!(tick(2500.0), "2.5k");
        assert_eq!(tick(120.0), "120");
        assert_eq!(tick(0.05), "0.05");
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(3.0e6), "3M");
        assert_eq!(tick(14.0), "14");
    }

    #[test]
    fn log_ticks_are_several_and_round() {
        assert_eq!(
            log_ticks(40.0, 8000.0),
            [50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0]
        );
        assert_eq!(log_ticks(25.0, 130.0), [30.0, 50.0, 70.0, 100.0]);
        assert_eq!(log_ticks(1.0, 1e4), [1.0, 10.0, 100.0, 1000.0, 10000.0]);
    }

    #[test]
    fn plan_line_names_pipelines_stages_and_replicas() {
        assert_eq!(
            plan_line(4, 1, 25, &replica_range(40, 48)),
            "t=4, 1 pipeline of 25 stages × 40–48 replicas"
        );
        assert_eq!(
            plan_line(2, 512, 1, &replica_range(1, 1)),
            "t=2, 512 pipelines of 1 stage × 1 replica"
        );
    }

    #[test]
    fn table_has_header_and_rows() {
        let t = table(&["name", "value"], vec![vec!["a".into(), "1".into()]]);
        assert!(t.contains("name"));
        assert!(t.lines().any(|l| l.contains('a') && l.contains('1')));
    }
}
