//! Gantt chart of one schedule: one row per core (tensor 0..n, vector 0..m, link); an
//! all-core operator spans every row of its type. Chips with many cores get thinner rows
//! (every few cores labelled); operator names are drawn only where they fit in their bar; the
//! time axis is in µs, ms or s, whichever keeps its numbers short.

use super::{page, palette, Frame};
use crate::report;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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

/// The resource an operator runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    Tensor,
    Vector,
    /// The network link (one resource, whatever the cores).
    Link,
}

/// The cores of its type an operator occupies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cores {
    All,
    One(u32),
}

/// One operator's bar.
#[derive(Debug, Clone, PartialEq)]
pub struct GanttBar {
    pub resource: Resource,
    pub cores: Cores,
    pub start_s: f64,
    pub end_s: f64,
    pub label: String,
}

/// A schedule to draw: its title (e.g. the layer and direction), makespan, solver status and
/// the chip's core counts.
#[derive(Debug, Clone, PartialEq)]
pub struct GanttChart {
    pub title: String,
    pub makespan_s: f64,
    pub status: String,
    pub tensor_cores: u32,
    pub vector_cores: u32,
    pub bars: Vec<GanttBar>,
}

fn colour(resource: Resource) -> RGBColor {
    match resource {
        Resource::Tensor => palette::BLUE,
        Resource::Vector => palette::GREEN,
        Resource::Link => palette::RED,
    }
}

/// The chart as SVG, titled with the makespan and the solver status.
pub fn gantt(chart: &GanttChart) -> Result<String, String> {
    let tensor = chart.tensor_cores as usize;
    let vector = chart.vector_cores as usize;
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
    let first_row = |resource: Resource| match resource {
        Resource::Tensor => 0,
        Resource::Vector => tensor,
        Resource::Link => tensor + vector,
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
    page((WIDTH_PX, height_px), |root| {
        let (scale, unit) = if chart.makespan_s >= 1.0 {
            (1.0, "s")
        } else if chart.makespan_s >= 1e-3 {
            (1e3, "ms")
        } else {
            (1e6, "µs")
        };
        let span = (chart.makespan_s * scale).max(f64::MIN_POSITIVE);
        let frame = Frame {
            caption_px: 18,
            margin_px: 10,
            x_labels_px: 40,
            y_labels_px: MARGIN_PX,
        };
        let mut plot = frame
            .on(
                root,
                format!(
                    "{}: makespan {} ({})",
                    chart.title,
                    report::seconds(chart.makespan_s),
                    chart.status
                ),
            )
            .build_cartesian_2d(0.0..span, -0.5..rows as f64 - 0.5)
            .map_err(|e| e.to_string())?;
        plot.configure_mesh()
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
            .map_err(|e| e.to_string())?;
        let label_style = ("sans-serif", LABEL_FONT_PX)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));

        for bar in &chart.bars {
            let (top, bottom) = match bar.cores {
                _ if bar.resource == Resource::Link => {
                    let first = first_row(Resource::Link);
                    (first, first + link_rows - 1)
                }
                Cores::All => {
                    let first = first_row(bar.resource);
                    let count = if bar.resource == Resource::Tensor {
                        tensor
                    } else {
                        vector
                    };
                    (first, first + count - 1)
                }
                Cores::One(c) => {
                    let row = first_row(bar.resource) + c as usize;
                    (row, row)
                }
            };
            let (x0, x1) = (bar.start_s * scale, bar.end_s * scale);
            let (y_top, y_bottom) = (y_of(top) + BAR_HALF_HEIGHT, y_of(bottom) - BAR_HALF_HEIGHT);
            let fill = colour(bar.resource);
            plot.draw_series([
                Rectangle::new([(x0, y_top), (x1, y_bottom)], fill.mix(0.6).filled()),
                Rectangle::new([(x0, y_top), (x1, y_bottom)], fill.stroke_width(1)),
            ])
            .map_err(|e| e.to_string())?;
            // The name only where it fits inside the bar, so names never run over each other:
            // across a wide bar, up a tall narrow one, or not at all.
            let width_px = (x1 - x0) / span * PLOT_WIDTH_PX;
            let height_px = (y_top - y_bottom) * f64::from(row_px);
            let text_px = LABEL_CHAR_PX * bar.label.chars().count() as f64 + 6.0;
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
                plot.draw_series(std::iter::once(Text::new(
                    bar.label.clone(),
                    position,
                    style,
                )))
                .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    })
}
