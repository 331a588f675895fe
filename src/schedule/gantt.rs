//! Gantt chart of one schedule as SVG: one row per core (tensor 0..n, vector 0..m, link);
//! an all-core operator spans every row of its type.

use super::{verify, Assignment, Schedule, ScheduleError, ScheduleProblem};
use crate::workload::CoreType;
use plotters::prelude::*;
use std::path::Path;

const WIDTH_PX: u32 = 1200;
const ROW_HEIGHT_PX: u32 = 28;
const MARGIN_PX: u32 = 90;
/// Half the height of a bar, in rows.
const BAR_HALF_HEIGHT: f64 = 0.4;

fn colour(core: CoreType) -> RGBColor {
    match core {
        CoreType::Tensor => RGBColor(66, 133, 244),
        CoreType::Vector => RGBColor(52, 168, 83),
        CoreType::Link => RGBColor(234, 67, 53),
    }
}

/// Writes the chart to `path`. The schedule must belong to the problem (checked with
/// [`verify`]).
pub fn render_gantt(
    schedule: &Schedule,
    problem: &ScheduleProblem,
    path: &Path,
) -> Result<(), ScheduleError> {
    let fail = |reason: String| ScheduleError::Render {
        file: path.to_path_buf(),
        reason,
    };
    verify(problem, schedule).map_err(|e| fail(format!("invalid schedule: {e}")))?;

    let tensor = problem.cores.tensor as usize;
    let vector = problem.cores.vector as usize;
    let mut names: Vec<String> = (0..tensor).map(|c| format!("tensor {c}")).collect();
    names.extend((0..vector).map(|c| format!("vector {c}")));
    names.push("link".to_string());
    let rows = names.len();
    // First row of each type; rows are drawn top to bottom.
    let first_row = |core: CoreType| match core {
        CoreType::Tensor => 0,
        CoreType::Vector => tensor,
        CoreType::Link => tensor + vector,
    };
    let y_of = |row: usize| (rows - 1 - row) as f64;

    let height_px = ROW_HEIGHT_PX * rows as u32 + 2 * MARGIN_PX;
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, height_px)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let span_us = (schedule.makespan_s * 1e6).max(f64::MIN_POSITIVE);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "makespan {:.3} µs ({})",
                schedule.makespan_s * 1e6,
                schedule.status
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(MARGIN_PX)
        .build_cartesian_2d(0.0..span_us, -0.5..rows as f64 - 0.5)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows)
        .y_label_formatter(&|y| {
            let nearest = y.round();
            if (y - nearest).abs() < 1e-6 && nearest >= 0.0 && (nearest as usize) < rows {
                names[rows - 1 - nearest as usize].clone()
            } else {
                String::new()
            }
        })
        .x_desc("time (µs)")
        .draw()
        .map_err(|e| fail(e.to_string()))?;

    for s in &schedule.ops {
        let op = &problem.ops[s.op];
        let (top, bottom) = match s.assignment {
            Assignment::AllCores => {
                let first = first_row(op.core);
                let count = problem.cores.of(op.core) as usize;
                (first, first + count - 1)
            }
            Assignment::Core(c) => {
                let row = first_row(op.core) + c as usize;
                (row, row)
            }
        };
        let (x0, x1) = (s.start_s * 1e6, s.end_s * 1e6);
        let (y_top, y_bottom) = (y_of(top) + BAR_HALF_HEIGHT, y_of(bottom) - BAR_HALF_HEIGHT);
        let fill = colour(op.core);
        chart
            .draw_series([
                Rectangle::new([(x0, y_top), (x1, y_bottom)], fill.mix(0.6).filled()),
                Rectangle::new([(x0, y_top), (x1, y_bottom)], fill.stroke_width(1)),
            ])
            .map_err(|e| fail(e.to_string()))?;
        chart
            .draw_series(std::iter::once(Text::new(
                op.name.clone(),
                (x0, (y_top + y_bottom) / 2.0),
                ("sans-serif", 11).into_font().color(&BLACK),
            )))
            .map_err(|e| fail(e.to_string()))?;
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    drop(chart);
    drop(root);
    crate::output::write_atomic(path, svg.as_bytes()).map_err(|e| fail(e.to_string()))
}
