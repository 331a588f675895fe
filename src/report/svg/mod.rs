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

use plotters::coord::Shift;
use plotters::prelude::*;

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
