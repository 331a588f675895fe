//! Lower bound on the optimal makespan.

use super::prepare::{Prepared, RESOURCES};

/// The larger of
/// - the critical path with every operator in its fastest mode, and
/// - per resource: no operator of that type starts before the smallest head, all finish at
///   least the smallest tail before the end, and in between the resource must absorb its total
///   work (core-seconds, an all-core run costing cores × its latency) on all its units.
pub(crate) fn lower_bound(prep: &Prepared) -> f64 {
    let n = prep.len();
    let critical_path_s = (0..n)
        .map(|i| prep.head_s[i] + prep.min_duration_s[i] + prep.tail_s[i])
        .fold(0.0, f64::max);

    let mut work_core_s = [0.0; RESOURCES];
    let mut min_head_s = [f64::INFINITY; RESOURCES];
    let mut min_tail_s = [f64::INFINITY; RESOURCES];
    for i in 0..n {
        let r = prep.resource[i];
        work_core_s[r] += (0..prep.modes[i].len())
            .map(|m| f64::from(prep.demand(i, m)) * prep.modes[i][m].duration_s)
            .fold(f64::INFINITY, f64::min);
        min_head_s[r] = min_head_s[r].min(prep.head_s[i]);
        min_tail_s[r] = min_tail_s[r].min(prep.tail_s[i]);
    }
    (0..RESOURCES)
        .filter(|&r| min_head_s[r].is_finite())
        .map(|r| min_head_s[r] + work_core_s[r] / f64::from(prep.capacity[r]) + min_tail_s[r])
        .fold(critical_path_s, f64::max)
}
