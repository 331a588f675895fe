//! Charts as SVG, drawn with plotters: one palette and one page setup for every chart tandem
//! writes. Each chart takes plain data (built by the stage that computed it) and returns the
//! SVG text; the caller writes it.

mod bars;
mod gantt;
mod growth;
mod pareto;

pub use bars::{speedup_bars, BarGroup};
pub use gantt::{gantt, Cores, GanttBar, GanttChart, Resource};
pub use growth::{growth, GrowthRun, GrowthSeries};
pub use pareto::{pareto, ParetoFront};

use plotters::coord::ranged1d::Ranged;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The palette: every colour a chart uses, named once.
pub(super) mod palette {
    use plotters::style::RGBColor;

    pub const BLUE: RGBColor = RGBColor(66, 133, 244);
    pub const RED: RGBColor = RGBColor(234, 67, 53);
    pub const GREEN: RGBColor = RGBColor(52, 168, 83);
    pub const YELLOW: RGBColor = RGBColor(251, 188, 5);
    pub const PURPLE: RGBColor = RGBColor(155, 81, 224);
    pub const CYAN: RGBColor = RGBColor(0, 172, 193);
    pub const ORANGE: RGBColor = RGBColor(255, 112, 67);
    /// A baseline's bars.
    pub const GREY: RGBColor = RGBColor(158, 158, 158);
    /// Points in the background.
    pub const LIGHT_GREY: RGBColor = RGBColor(170, 170, 170);
    /// Grid lines drawn by hand.
    pub const GRID: RGBColor = RGBColor(215, 215, 215);
    /// Series in order (one per workload).
    pub const SERIES: [RGBColor; 7] = [BLUE, RED, GREEN, YELLOW, PURPLE, CYAN, ORANGE];
}

/// The drawing area of a page.
pub(super) type Page<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A chart's frame: caption size, margin and the room for the axes' labels, in pixels.
pub(super) struct Frame {
    pub caption_px: u32,
    pub margin_px: u32,
    pub x_labels_px: u32,
    pub y_labels_px: u32,
}

impl Frame {
    /// A chart builder on `area` with this frame and `caption`.
    pub fn on<'a, 'b>(
        &self,
        area: &'a Page<'b>,
        caption: impl AsRef<str>,
    ) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
        let mut builder = ChartBuilder::on(area);
        builder
            .caption(caption, ("sans-serif", self.caption_px))
            .margin(self.margin_px)
            .x_label_area_size(self.x_labels_px)
            .y_label_area_size(self.y_labels_px);
        builder
    }
}

/// An SVG page of `size` pixels on white, drawn by `draw`.
pub(super) fn page(
    size: (u32, u32),
    draw: impl FnOnce(&Page<'_>) -> Result<(), String>,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&root)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// The ticks, labels and grid lines of a log-scale y axis at several round values
/// ([`crate::report::log_ticks`]), not only the powers of ten plotters labels: drawn on
/// `chart` from `x_lo` to `x_hi`, labels on `area` left of the plot.
pub(super) fn log_y_ticks<X: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, LogCoord<f64>>>,
    area: &Page<'_>,
    (x_lo, x_hi): (f64, f64),
    (y_lo, y_hi): (f64, f64),
) -> Result<(), String> {
    let label_font =
        TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    for tick in crate::report::log_ticks(y_lo, y_hi) {
        chart
            .draw_series(LineSeries::new([(x_lo, tick), (x_hi, tick)], palette::GRID))
            .map_err(|e| e.to_string())?;
        // The backend's pixel, relative to `area` (a split page starts off the origin).
        let (x, y) = chart.backend_coord(&(x_lo, tick));
        let (base_x, base_y) = area.get_base_pixel();
        let (x, y) = (x - base_x, y - base_y);
        area.draw(&PathElement::new([(x - 5, y), (x, y)], BLACK))
            .map_err(|e| e.to_string())?;
        area.draw(&Text::new(
            crate::report::tick(tick),
            (x - 8, y),
            label_font.clone(),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}
