//! A schedule's Gantt chart: its operators as bars on the chip's cores (`report::svg` draws
//! them).

use super::{verify, Assignment, Schedule, ScheduleError, ScheduleProblem};
use crate::report::svg::{self, Cores, GanttBar, GanttChart, Resource};
use crate::workload::CoreType;
use std::path::Path;

/// Writes the chart to `path` as SVG, titled `title` (e.g. the layer and direction) with the
/// makespan and solver status. The schedule must belong to the problem (checked with
/// [`verify`]).
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
    let chart = GanttChart {
        title: title.to_string(),
        makespan_s: schedule.makespan_s,
        status: schedule.status.to_string(),
        tensor_cores: problem.cores.tensor,
        vector_cores: problem.cores.vector,
        bars: schedule
            .ops
            .iter()
            .map(|s| {
                let op = &problem.ops[s.op];
                GanttBar {
                    resource: match op.core {
                        CoreType::Tensor => Resource::Tensor,
                        CoreType::Vector => Resource::Vector,
                        CoreType::Link => Resource::Link,
                    },
                    cores: match s.assignment {
                        Assignment::AllCores => Cores::All,
                        Assignment::Core(c) => Cores::One(c),
                    },
                    start_s: s.start_s,
                    end_s: s.end_s,
                    label: op.name.clone(),
                }
            })
            .collect(),
    };
    let svg = svg::gantt(&chart).map_err(fail)?;
    crate::output::write_atomic(path, svg.as_bytes()).map_err(|e| fail(e.to_string()))
}
