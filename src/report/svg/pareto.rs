//! Throughput against area: every evaluated point faint, each workload's front as a staircase
//! (the best throughput any area up to `x` buys); throughput on a log scale so workloads of
//! different sizes share the chart. The legend stands right of the plot.

use super::{log_y_ticks, page, palette, Frame, Page};
use crate::report;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One workload's Pareto front: its name and its points as (area mm², samples/s).
#[derive(Debug, Clone, PartialEq)]
pub struct ParetoFront {
    pub name: String,
    pub corners: Vec<(f64, f64)>,
}

/// The chart of `points` (every evaluated point, as (area mm², samples/s)) and `fronts`.
pub fn pareto(points: &[(f64, f64)], fronts: &[ParetoFront]) -> Result<String, String> {
    page((1200, 700), |root| draw(root, points, fronts))
}

fn draw(root: &Page<'_>, points: &[(f64, f64)], fronts: &[ParetoFront]) -> Result<(), String> {
    if points.is_empty() {
        root.draw(&Text::new(
            "no feasible design point",
            (500, 340),
            ("sans-serif", 20),
        ))
        .map_err(|e| e.to_string())?;
        return Ok(());
    }
    let (plot_area, legend_area) = root.split_horizontally(960);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    let pad = |lo: f64, hi: f64| {
        if hi > lo {
            (hi - lo) * 0.05
        } else {
            lo.abs().max(1.0) * 0.05
        }
    };
    let px = pad(x0, x1);
    let (x_lo, x_hi) = ((x0 - px).max(0.0), x1 + px);
    let (y_lo, y_hi) = (y0 / 1.2, y1 * 1.2);
    let frame = Frame {
        caption_px: 20,
        margin_px: 15,
        x_labels_px: 45,
        y_labels_px: 80,
    };
    let mut chart = frame
        .on(
            &plot_area,
            "throughput against area (Pareto fronts highlighted)",
        )
        .build_cartesian_2d(x_lo..x_hi, (y_lo..y_hi).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .y_label_formatter(&|_| String::new())
        .x_label_formatter(&|x| report::tick(*x))
        .x_desc("area (mm²)")
        .y_desc("samples/s (log scale)")
        .draw()
        .map_err(|e| e.to_string())?;
    // The log axis's ticks and grid: several round values, not only the powers of ten.
    log_y_ticks(&mut chart, &plot_area, (x_lo, x_hi), (y_lo, y_hi))?;
    chart
        .draw_series(
            points
                .iter()
                .map(|&p| Circle::new(p, 2, palette::LIGHT_GREY.filled())),
        )
        .map_err(|e| e.to_string())?;
    let mut legend: Vec<(String, RGBColor)> = Vec::new();
    for (i, front) in fronts.iter().enumerate() {
        let colour = palette::SERIES[i % palette::SERIES.len()];
        let mut corners = front.corners.clone();
        corners.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        // Each corner's throughput holds until the next corner's area.
        let mut steps = Vec::with_capacity(2 * corners.len());
        for (j, &(x, y)) in corners.iter().enumerate() {
            if j > 0 {
                steps.push((x, corners[j - 1].1));
            }
            steps.push((x, y));
        }
        chart
            .draw_series(LineSeries::new(steps, colour.stroke_width(2)))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(
                corners
                    .into_iter()
                    .map(|p| Circle::new(p, 4, colour.filled())),
            )
            .map_err(|e| e.to_string())?;
        legend.push((format!("{} (front)", front.name), colour));
    }
    legend.push(("all evaluated points".to_string(), palette::LIGHT_GREY));
    let font =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (label, colour)) in legend.iter().enumerate() {
        let y = 80 + 26 * i as i32;
        let last = i + 1 == legend.len();
        if !last {
            legend_area
                .draw(&PathElement::new([(5, y), (35, y)], colour.stroke_width(2)))
                .map_err(|e| e.to_string())?;
        }
        legend_area
            .draw(&Circle::new(
                (20, y),
                if last { 2 } else { 4 },
                colour.filled(),
            ))
            .map_err(|e| e.to_string())?;
        legend_area
            .draw(&Text::new(label.clone(), (45, y), font.clone()))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
