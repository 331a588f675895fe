//! Speed-ups or gains as grouped bars: one group per workload (or workload × cluster), one bar
//! per row of its table (the first group's rows name the series); a row without a value is
//! marked `n/a`.

use super::{page, palette, Frame};
use crate::report;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One workload's bars: each row's label and speed-up (`None`: the row has no plan).
#[derive(Debug, Clone, PartialEq)]
pub struct BarGroup {
    pub name: String,
    pub bars: Vec<(String, Option<f64>)>,
}

/// Bar colours by series: the first (the baseline) grey.
const COLOURS: [RGBColor; 8] = [
    palette::GREY,
    palette::BLUE,
    palette::YELLOW,
    palette::PURPLE,
    palette::RED,
    palette::GREEN,
    palette::CYAN,
    palette::ORANGE,
];

/// The chart of `groups` as SVG, under `caption`, the y axis named `y_desc` (ratios, drawn
/// with `×`).
pub fn speedup_bars(caption: &str, y_desc: &str, groups: &[BarGroup]) -> Result<String, String> {
    let kinds: Vec<String> = groups
        .first()
        .map(|g| g.bars.iter().map(|(kind, _)| kind.clone()).collect())
        .unwrap_or_default();
    let top = groups
        .iter()
        .flat_map(|g| g.bars.iter().filter_map(|(_, speedup)| *speedup))
        .fold(1.0, f64::max)
        * 1.15;
    page((1100, 650), |root| {
        let frame = Frame {
            caption_px: 20,
            margin_px: 15,
            x_labels_px: 45,
            y_labels_px: 60,
        };
        let mut chart = frame
            .on(root, caption)
            .build_cartesian_2d(0.0..groups.len().max(1) as f64, 0.0..top)
            .map_err(|e| e.to_string())?;
        let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(groups.len().max(1) * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - i as f64 - 0.5).abs() < 1e-6 && i < names.len() {
                    names[i].clone()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| format!("{}×", report::tick(*v)))
            .y_desc(y_desc)
            .draw()
            .map_err(|e| e.to_string())?;
        let width = 0.8 / kinds.len().max(1) as f64;
        for (k, kind) in kinds.iter().enumerate() {
            let colour = COLOURS[k % COLOURS.len()];
            let x0 = |g: usize| g as f64 + 0.1 + k as f64 * width;
            let speedups: Vec<Option<f64>> = groups
                .iter()
                .map(|g| {
                    g.bars
                        .iter()
                        .find(|(label, _)| label == kind)
                        .and_then(|(_, speedup)| *speedup)
                })
                .collect();
            let bars: Vec<Rectangle<(f64, f64)>> = speedups
                .iter()
                .enumerate()
                .filter_map(|(g, speedup)| {
                    Some(Rectangle::new(
                        [(x0(g), 0.0), (x0(g) + width * 0.9, (*speedup)?)],
                        colour.filled(),
                    ))
                })
                .collect();
            // A row without a plan (infeasible, or no fixed plan for the model) says so.
            let missing = speedups
                .iter()
                .enumerate()
                .filter(|(_, speedup)| speedup.is_none())
                .map(|(g, _)| {
                    Text::new(
                        "n/a",
                        (x0(g) + width * 0.45, top * 0.01),
                        TextStyle::from(("sans-serif", 11).into_font())
                            .pos(Pos::new(HPos::Center, VPos::Bottom)),
                    )
                });
            chart.draw_series(missing).map_err(|e| e.to_string())?;
            chart
                .draw_series(bars)
                .map_err(|e| e.to_string())?
                .label(kind.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())
    })
}
