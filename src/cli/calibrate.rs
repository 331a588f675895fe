//! `tandem calibrate`: fit a chip's efficiency parameters to measured kernels.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::arch::{load_chip, Efficiency, PerVectorOp};
use tandem::calibrate::{calibrate, load_measurement_dirs, summarise, ErrorSummary};
use tandem::report::{percent, table};
use tandem::workload::{Pass, VectorOp};

/// Fit the chip's efficiency parameters (achieved fraction of peak compute, HBM and link
/// bandwidth, kernel overheads, hidden fraction of overlapped all-reduces) to measured GEMM,
/// vector and collective kernels, report the fit by two-fold cross-validation, and write the
/// calibrated chip file.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Chip file to calibrate (TOML).
    #[arg(long)]
    arch: PathBuf,
    /// Directory of measurement CSVs (calibration/collect.py output, the LLMCompass A100
    /// files of data/reference/a100_kernels, or published fused-attention benchmarks such as
    /// data/reference/flash_attention/h100); repeat for several directories.
    #[arg(long, required = true)]
    measurements: Vec<PathBuf>,
    /// Where to write the calibrated chip file (TOML).
    #[arg(long)]
    out: PathBuf,
    /// Print the fit as JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// Directories for a report line: `a, b`.
pub fn dir_list(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|dir| dir.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn summary_rows(summaries: &[ErrorSummary]) -> Vec<Vec<String>> {
    summaries
        .iter()
        .map(|s| {
            vec![
                s.class.clone(),
                s.count.to_string(),
                percent(s.mean_abs_error),
                percent(s.max_abs_error),
                format!("{:+.1} %", 100.0 * s.mean_signed_error),
            ]
        })
        .collect()
}

pub const SUMMARY_HEADER: [&str; 5] = [
    "class",
    "n",
    "mean abs err",
    "max abs err",
    "mean signed err",
];

pub fn run(args: &Args) -> Result<ExitCode> {
    let mut arch = load_chip(&args.arch)?;
    let measurements = load_measurement_dirs(&args.measurements)?;
    let fit = calibrate(&arch, &measurements)?;
    let held_out = summarise(&fit.held_out);
    let held_out_blocks = summarise(&fit.held_out_blocks);
    let in_sample = summarise(&fit.in_sample);
    let before = arch.efficiency.clone();
    arch.efficiency = fit.efficiency.clone();
    arch.name = format!("{}-calibrated", arch.name.trim_end_matches("-calibrated"));

    let class_list = held_out
        .iter()
        .filter(|s| s.class != "all")
        .map(|s| format!("{} {}", s.class, percent(s.mean_abs_error)))
        .collect::<Vec<_>>()
        .join(", ");
    let clock_line = fit.clock.map_or(String::new(), |c| {
        format!(
            "# sustained_clock: fitted to the GEMM kernels of {} profiled block passes \
             ({:+.1} to {:+.1} % after the fit).\n",
            c.block_passes,
            100.0 * c.min_signed_error,
            100.0 * c.max_signed_error
        )
    });
    let rates_line = fit.vector_rates.as_ref().map_or(String::new(), |r| {
        format!(
            "# vector_sustained_rate and the vector_op_…sustained_rate tables: fitted to the \
             vector kernels of the profiled block passes ({} primitives).\n",
            r.primitives.len()
        )
    });
    let header = format!(
        "# Calibrated by `tandem calibrate --arch {} {}` from {} measurements.\n\
         # Held-out mean |error| (two-fold cross-validation): {class_list}.\n\
         {clock_line}{rates_line}\
         # Facts and citations: see {}.\n",
        args.arch.display(),
        args.measurements
            .iter()
            .map(|dir| format!("--measurements {}", dir.display()))
            .collect::<Vec<_>>()
            .join(" "),
        fit.in_sample.len(),
        args.arch.display()
    );
    let body = toml::to_string_pretty(&arch).context("serialising the calibrated chip")?;
    tandem::output::write_atomic(&args.out, (header + &body).as_bytes())
        .with_context(|| format!("writing {}", args.out.display()))?;

    if args.json {
        let value = serde_json::json!({
            "arch": arch.name,
            "measurements": fit.in_sample.len(),
            "before": before,
            "efficiency": fit.efficiency,
            "overlaps": fit.overlaps,
            "collectives": fit.collectives,
            "launch": fit.launch,
            "clock": fit.clock,
            "vector_rates": fit.vector_rates,
            "held_out": held_out,
            "held_out_blocks": held_out_blocks,
            "in_sample": in_sample,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: fitted to {} measurements from {}",
        arch.name,
        fit.in_sample.len(),
        dir_list(&args.measurements)
    );
    let e = &fit.efficiency;
    let mut rows = vec![
        vec![
            "tensor_compute".into(),
            format!("{:.3}", before.tensor_compute),
            format!("{:.3}", e.tensor_compute),
        ],
        vec![
            "hbm_bandwidth".into(),
            format!("{:.3}", before.hbm_bandwidth),
            format!("{:.3}", e.hbm_bandwidth),
        ],
        vec![
            "gemm_overhead_s".into(),
            format!("{:.2e}", before.gemm_overhead_s),
            format!("{:.2e}", e.gemm_overhead_s),
        ],
        vec![
            "vector_overhead_s".into(),
            format!("{:.2e}", before.vector_overhead_s),
            format!("{:.2e}", e.vector_overhead_s),
        ],
    ];
    // The fused attention kernels' own values, where either file sets one.
    let attention = [
        (
            "attention_compute",
            before.attention_compute,
            e.attention_compute,
        ),
        (
            "attention_row_overhead",
            before.attention_row_overhead,
            e.attention_row_overhead,
        ),
        (
            "attention_backward_compute",
            before.attention_backward_compute,
            e.attention_backward_compute,
        ),
        (
            "attention_backward_row_overhead",
            before.attention_backward_row_overhead,
            e.attention_backward_row_overhead,
        ),
    ];
    let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
    for (name, was, now) in attention {
        if was.is_some() || now.is_some() {
            rows.push(vec![name.into(), show(was), show(now)]);
        }
    }
    // Per-primitive values, where either file sets one: (parameter, pass label, table, value).
    type PerOpColumn = (
        &'static str,
        &'static str,
        fn(&Efficiency) -> &PerVectorOp,
        fn(&Efficiency, VectorOp) -> String,
    );
    let columns: [PerOpColumn; 4] = [
        (
            "hbm_bandwidth",
            "",
            |e| &e.vector_op_hbm_bandwidth,
            |e, op| format!("{:.3}", e.hbm_bandwidth_for(op, Pass::Forward)),
        ),
        (
            "hbm_bandwidth",
            " backward",
            |e| &e.vector_op_backward_hbm_bandwidth,
            |e, op| format!("{:.3}", e.hbm_bandwidth_for(op, Pass::Backward)),
        ),
        (
            "vector_overhead_s",
            "",
            |e| &e.vector_op_overhead_s,
            |e, op| format!("{:.2e}", e.vector_overhead_for(op, Pass::Forward)),
        ),
        (
            "vector_overhead_s",
            " backward",
            |e| &e.vector_op_backward_overhead_s,
            |e, op| format!("{:.2e}", e.vector_overhead_for(op, Pass::Backward)),
        ),
    ];
    for op in VectorOp::ALL {
        for (param, pass, values, value) in columns {
            if values(&before).get(op).or(values(e).get(op)).is_some() {
                rows.push(vec![
                    format!("{param}[{}{pass}]", op.name()),
                    value(&before, op),
                    value(e, op),
                ]);
            }
        }
    }
    for table in &e.row_hbm_bandwidth {
        let knots = table
            .row_len
            .iter()
            .zip(&table.hbm_bandwidth)
            .map(|(r, b)| format!("{r}: {b:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let pass = match table.pass {
            Pass::Forward => "",
            Pass::Backward => " backward",
        };
        rows.push(vec![
            format!("hbm_bandwidth[{}{pass}] by row length", table.op.name()),
            "-".into(),
            knots,
        ]);
    }
    if fit.collectives > 0 {
        rows.push(vec![
            format!("link_bandwidth ({} collectives measured)", fit.collectives),
            format!("{:.3}", before.link_bandwidth),
            format!("{:.3}", e.link_bandwidth),
        ]);
    }
    if fit.overlaps > 0 || before.comm_overlap != 1.0 {
        rows.push(vec![
            format!("comm_overlap ({} overlaps measured)", fit.overlaps),
            format!("{:.3}", before.comm_overlap),
            format!("{:.3}", e.comm_overlap),
        ]);
    }
    let (gpu_bound, host_bound, drift) = fit.launch.map_or((0, 0, 0.0), |l| {
        (l.gpu_bound_pairs, l.host_bound_pairs, l.eager_drift)
    });
    if fit.launch.is_some() || before.launch_gap_s != 0.0 || before.host_dispatch_s != 0.0 {
        rows.push(vec![
            format!(
                "launch_gap_s ({gpu_bound} kernels timed eagerly and replayed; their eager run's \
                 clock, {:+.1} % of a kernel's time, left out)",
                100.0 * drift
            ),
            format!("{:.2e}", before.launch_gap_s),
            format!("{:.2e}", e.launch_gap_s),
        ]);
        rows.push(vec![
            format!("host_dispatch_s ({host_bound} kernels faster than their launch)"),
            format!("{:.2e}", before.host_dispatch_s),
            format!("{:.2e}", e.host_dispatch_s),
        ]);
    }
    if let Some(c) = fit.clock {
        rows.push(vec![
            format!(
                "sustained_clock ({} profiled block passes' GEMMs, then {:+.1} to {:+.1} %)",
                c.block_passes,
                100.0 * c.min_signed_error,
                100.0 * c.max_signed_error
            ),
            format!("{:.3}", before.sustained_clock),
            format!("{:.3}", e.sustained_clock),
        ]);
    }
    if let Some(r) = &fit.vector_rates {
        rows.push(vec![
            "vector_sustained_rate (all the profiled block passes' vector kernels)".into(),
            format!("{:.3}", before.vector_sustained_rate),
            format!("{:.3}", r.rate),
        ]);
        for p in &r.primitives {
            let pass = match p.pass {
                Pass::Forward => "",
                Pass::Backward => " backward",
            };
            rows.push(vec![
                format!(
                    "sustained_rate[{}{pass}] ({} block passes, then {:+.1} to {:+.1} %)",
                    p.op.name(),
                    p.block_passes,
                    100.0 * p.min_signed_error,
                    100.0 * p.max_signed_error
                ),
                format!("{:.3}", before.vector_rate_for(p.op, p.pass)),
                format!("{:.3}", p.rate),
            ]);
        }
    }
    println!("{}", table(&["parameter", "before", "fitted"], rows));
    println!("held-out error (fit on one half of each class's shapes, scored on the other):");
    println!("{}", table(&SUMMARY_HEADER, summary_rows(&held_out)));
    if !fit.held_out_blocks.is_empty() {
        println!(
            "held-out block passes (training clock and vector rates fitted to the other half of \
             the block shapes):"
        );
        println!("{}", table(&SUMMARY_HEADER, summary_rows(&held_out_blocks)));
    }
    println!("in-sample error of the final fit (all shapes):");
    println!("{}", table(&SUMMARY_HEADER, summary_rows(&in_sample)));
    println!("wrote {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}
