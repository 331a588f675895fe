//! How a sweep's cost grows with its space: wall time and exactly evaluated points against
//! the points of the space, one line per cluster size, both axes on log scales (the
//! benchmark's spaces differ by powers). A dashed line through each series' first run with
//! slope one shows what growing with the space would cost.

use super::{log_y_ticks, page, palette, Frame, Page};
use crate::report;
use plotters::prelude::*;

/// One sweep of the growth benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrowthRun {
    /// Design points of the space swept.
    pub points: f64,
    pub wall_s: f64,
    /// Points evaluated exactly (ILP schedules).
    pub exact_points: f64,
}

/// The runs of one cluster size, in order of growing space.
#[derive(Debug, Clone, PartialEq)]
pub struct GrowthSeries {
    pub name: String,
    pub runs: Vec<GrowthRun>,
}

/// The two panels (wall time, exact points) of `series` against the points swept.
pub fn growth(series: &[GrowthSeries]) -> Result<String, String> {
    page((1200, 560), |root| {
        let (left, right) = root.split_horizontally(600);
        panel(
            &left,
            series,
            "wall time against points (dashed: proportional)",
            "wall (s)",
            |r| r.wall_s,
        )?;
        panel(
            &right,
            series,
            "exact points against points (dashed: proportional)",
            "exact points",
            |r| r.exact_points,
        )
    })
}

fn panel(
    area: &Page<'_>,
    series: &[GrowthSeries],
    caption: &str,
    y_desc: &str,
    value: impl Fn(&GrowthRun) -> f64,
) -> Result<(), String> {
    let runs = series.iter().flat_map(|s| &s.runs);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for r in runs {
        x0 = x0.min(r.points);
        x1 = x1.max(r.points);
        y0 = y0.min(value(r));
        y1 = y1.max(value(r));
    }
    if !(x0 > 0.0 && y0 > 0.0 && x1.is_finite() && y1.is_finite()) {
        return Err(format!("{caption}: every value must be positive"));
    }
    let frame = Frame {
        caption_px: 18,
        margin_px: 15,
        x_labels_px: 45,
        y_labels_px: 60,
    };
    let mut chart = frame
        .on(area, caption)
        .build_cartesian_2d(
            (x0 / 1.3..x1 * 1.3).log_scale(),
            (y0 / 1.5..y1 * 3.0).log_scale(),
        )
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .disable_y_mesh()
        .y_labels(0)
        .y_label_formatter(&|_| String::new())
        .x_label_formatter(&|x| report::tick(*x))
        .x_desc("design points in the space (log scale)")
        .y_desc(format!("{y_desc} (log scale)"))
        .draw()
        .map_err(|e| e.to_string())?;
    let (x_lo, x_hi) = (x0 / 1.3, x1 * 1.3);
    log_y_ticks(&mut chart, area, (x_lo, x_hi), (y0 / 1.5, y1 * 3.0))?;
    for (i, one) in series.iter().enumerate() {
        let colour = palette::SERIES[i % palette::SERIES.len()];
        let line: Vec<(f64, f64)> = one.runs.iter().map(|r| (r.points, value(r))).collect();
        if let Some(&(x, y)) = line.first() {
            // Cost proportional to the space, from this series' smallest run.
            let proportional = [(x, y), (x1, y * x1 / x)];
            chart
                .draw_series(DashedLineSeries::new(
                    proportional,
                    4,
                    4,
                    colour.mix(0.5).stroke_width(1),
                ))
                .map_err(|e| e.to_string())?;
        }
        chart
            .draw_series(LineSeries::new(line.clone(), colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(one.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart
            .draw_series(line.into_iter().map(|p| Circle::new(p, 4, colour.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(palette::GRID)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One dot per run and panel, a legend entry per series; bad values are refused.
    #[test]
    fn growth_draws_every_run_and_refuses_non_positive_values() {
        let run = |points: f64, wall_s: f64, exact_points: f64| GrowthRun {
            points,
            wall_s,
            exact_points,
        };
        let series = vec![
            GrowthSeries {
                name: "64 devices".into(),
                runs: vec![run(7e5, 30.0, 900.0), run(1.1e7, 200.0, 2700.0)],
            },
            GrowthSeries {
                name: "1024 devices".into(),
                runs: vec![run(7e5, 45.0, 1076.0), run(1.1e7, 300.0, 3076.0)],
            },
        ];
        let svg = growth(&series).unwrap();
        assert!(svg.contains("64 devices") && svg.contains("1024 devices"));
        // Two panels × two series × two runs.
        assert_eq!(svg.matches("<circle").count(), 8);
        let bad = vec![GrowthSeries {
            name: "x".into(),
            runs: vec![run(0.0, 1.0, 1.0)],
        }];
        assert!(growth(&bad).is_err());
    }
}
