//! Gantt chart of one schedule as SVG: one row per core (tensor 0..n, vector 0..m, link);
//! an all-core operator spans every row of its type. Chips with many cores get thinner rows
//! (every few cores labelled); operator names are drawn only where they fit in their bar; the
//! time axis is in µs, ms or s, whichever keeps its numbers short.

use super::{verify, Assignment, Schedule, ScheduleError, ScheduleProblem};
use crate::report;
use crate::workload::CoreType;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::path::Path;

const WIDTH_PX: u32 = 1200;
/// Row height while the rows fit in `MAX_ROWS_PX`; thinner (down to `MIN_ROW_HEIGHT_PX`) past it.
const ROW_HEIGHT_PX: u32 = 28;
const MIN_ROW_HEIGHT_PX: u32 = 3;
const MAX_ROWS_PX: u32 = 1400;
const MARGIN_PX: u32 = 90;
/// Half the height of a bar, in rows.
const BAR_HALF_HEIGHT: f64 = 0.4;
/// Operator labels: font size, and the width of one character estimated from it.
const LABEL_FONT_PX: u32 = 11;
const LABEL_CHAR_PX: f64 = 0.55 * LABEL_FONT_PX as f64;
/// The plot's width: the picture less the core names and the chart's margins.
const PLOT_WIDTH_PX: f64 = (WIDTH_PX - MARGIN_PX - 20) as f64;

fn colour(core: CoreType) -> RGBColor {
    match core {
        CoreType::Tensor => RGBColor(66, 133, 244),
        CoreType::Vector => RGBColor(52, 168, 83),
        CoreType::Link => RGBColor(234, 67, 53),
    }
}

/// Writes the chart to `path`, titled `title` (e.g. the layer and direction) with the makespan
/// and solver status. The schedule must belong to the problem (checked with [`verify`]).
pub fn render_gantt(
    schedule: &Schedule,
    problem: &ScheduleProblem,
    title: &str,
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
    let row_px = (MAX_ROWS_PX / (names.len() as u32 + 1)).clamp(MIN_ROW_HEIGHT_PX, ROW_HEIGHT_PX);
    // Label every core while rows are tall enough for text, else every `label_every`th; the
    // link, one resource, gets as many rows as one label so its transfers stay visible.
    let label_every = ROW_HEIGHT_PX.div_ceil(row_px) as usize;
    let link_rows = label_every;
    names.extend(std::iter::repeat_n("link".to_string(), link_rows));
    let rows = names.len();
    // First row of each type; rows are drawn top to bottom.
    let first_row = |core: CoreType| match core {
        CoreType::Tensor => 0,
        CoreType::Vector => tensor,
        CoreType::Link => tensor + vector,
    };
    let y_of = |row: usize| (rows - 1 - row) as f64;
    let labelled = |row: usize| {
        let first = if row >= tensor + vector {
            tensor + vector
        } else if row >= tensor {
            tensor
        } else {
            0
        };
        (row - first).is_multiple_of(label_every)
    };

    let height_px = row_px * rows as u32 + 2 * MARGIN_PX;
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, height_px)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let (scale, unit) = if schedule.makespan_s >= 1.0 {
        (1.0, "s")
    } else if schedule.makespan_s >= 1e-3 {
        (1e3, "ms")
    } else {
        (1e6, "µs")
    };
    let span = (schedule.makespan_s * scale).max(f64::MIN_POSITIVE);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{title}: makespan {} ({})",
                report::seconds(schedule.makespan_s),
                schedule.status
            ),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(MARGIN_PX)
        .build_cartesian_2d(0.0..span, -0.5..rows as f64 - 0.5)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(rows)
        .y_label_formatter(&|y| {
            let nearest = y.round();
            if (y - nearest).abs() < 1e-6 && nearest >= 0.0 && (nearest as usize) < rows {
                let row = rows - 1 - nearest as usize;
                if labelled(row) {
                    return names[row].clone();
                }
            }
            String::new()
        })
        .x_label_formatter(&|x| report::tick(*x))
        .x_desc(format!("time ({unit})"))
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    let label_style = ("sans-serif", LABEL_FONT_PX)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));

    for s in &schedule.ops {
        let op = &problem.ops[s.op];
        let (top, bottom) = match s.assignment {
            _ if op.core == CoreType::Link => {
                let first = first_row(CoreType::Link);
                (first, first + link_rows - 1)
            }
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
        let (x0, x1) = (s.start_s * scale, s.end_s * scale);
        let (y_top, y_bottom) = (y_of(top) + BAR_HALF_HEIGHT, y_of(bottom) - BAR_HALF_HEIGHT);
        let fill = colour(op.core);
        chart
            .draw_series([
                Rectangle::new([(x0, y_top), (x1, y_bottom)], fill.mix(0.6).filled()),
                Rectangle::new([(x0, y_top), (x1, y_bottom)], fill.stroke_width(1)),
            ])
            .map_err(|e| fail(e.to_string()))?;
        // The name only where it fits inside the bar, so names never run over each other:
        // across a wide bar, up a tall narrow one, or not at all.
        let width_px = (x1 - x0) / span * PLOT_WIDTH_PX;
        let height_px = (y_top - y_bottom) * f64::from(row_px);
        let text_px = LABEL_CHAR_PX * op.name.chars().count() as f64 + 6.0;
        let across = width_px >= text_px && height_px >= f64::from(LABEL_FONT_PX);
        let up = !across && height_px >= text_px && width_px >= f64::from(LABEL_FONT_PX) + 2.0;
        if across || up {
            let (position, style) = if across {
                (
                    (x0 + 3.0 * span / PLOT_WIDTH_PX, (y_top + y_bottom) / 2.0),
                    label_style.clone(),
                )
            } else {
                (
                    ((x0 + x1) / 2.0, (y_top + y_bottom) / 2.0),
                    label_style
                        .transform(FontTransform::Rotate270)
                        .pos(Pos::new(HPos::Center, VPos::Center)),
                )
            };
            chart
                .draw_series(std::iter::once(Text::new(op.name.clone(), position, style)))
                .map_err(|e| fail(e.to_string()))?;
        }
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    drop(chart);
    drop(root);
    crate::output::write_atomic(path, svg.as_bytes()).map_err(|e| fail(e.to_string()))
}
