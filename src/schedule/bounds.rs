//! Lower bound on the optimal makespan.

use super::prepare::{Prepared, RESOURCES};

/// The larger of
/// - the critical path with every operator in its fastest mode, and
/// - per resource: no operator of that type starts before the smallest head, all finish at
///   least the smallest tail before the end, and in between the resource must absorb its
///   operators' occupancy. An all-unit run holds the resource alone for its latency; one-unit
///   runs share it, but at most `lanes = min(units, most operators that can run at once)`
///   of them at a time, so each holds at least `1 / lanes` of it. The cap on concurrency is
///   what keeps the bound tight on chips with many more cores than a layer has independent
///   operators.
pub(crate) fn lower_bound(prep: &Prepared) -> f64 {
    let n = prep.len();
    let critical_path_s = (0..n)
        .map(|i| prep.head_s[i] + prep.min_duration_s[i] + prep.tail_s[i])
        .fold(0.0, f64::max);

    let concurrent = max_concurrent(prep);
    let mut occupied_s = [0.0; RESOURCES];
    let mut min_head_s = [f64::INFINITY; RESOURCES];
    let mut min_tail_s = [f64::INFINITY; RESOURCES];
    for i in 0..n {
        let r = prep.resource[i];
        let lanes = f64::from(prep.capacity[r].min(concurrent[r]).max(1));
        occupied_s[r] += prep.modes[i]
            .iter()
            .map(|m| {
                if m.parallel {
                    m.duration_s
                } else {
                    m.duration_s / lanes
                }
            })
            .fold(f64::INFINITY, f64::min);
        min_head_s[r] = min_head_s[r].min(prep.head_s[i]);
        min_tail_s[r] = min_tail_s[r].min(prep.tail_s[i]);
    }
    (0..RESOURCES)
        .filter(|&r| min_head_s[r].is_finite())
        .map(|r| min_head_s[r] + occupied_s[r] + min_tail_s[r])
        .fold(critical_path_s, f64::max)
}

/// Per resource, the most of its operators that can run at the same time: operators running
/// together are pairwise unordered, so at most the width of the resource's operators in the
/// precedence order — by Dilworth's theorem, their count less a maximum matching between
/// each operator and its descendants (a fewest-chains cover).
fn max_concurrent(prep: &Prepared) -> [u32; RESOURCES] {
    let mut most = [0u32; RESOURCES];
    for (r, most) in most.iter_mut().enumerate() {
        let ops: Vec<usize> = (0..prep.len()).filter(|&i| prep.resource[i] == r).collect();
        // matched_to[j]: the operator whose chain continues with operator `ops[j]`.
        let mut matched_to: Vec<Option<usize>> = vec![None; ops.len()];
        let mut matching = 0;
        for a in 0..ops.len() {
            let mut seen = vec![false; ops.len()];
            if augment(prep, &ops, a, &mut seen, &mut matched_to) {
                matching += 1;
            }
        }
        *most = (ops.len() - matching) as u32;
    }
    most
}

/// Kuhn's augmenting path from `ops[a]` to an unmatched descendant.
fn augment(
    prep: &Prepared,
    ops: &[usize],
    a: usize,
    seen: &mut [bool],
    matched_to: &mut [Option<usize>],
) -> bool {
    for b in 0..ops.len() {
        if seen[b] || !prep.descendants[ops[a]].contains(ops[b]) {
            continue;
        }
        seen[b] = true;
        if matched_to[b].is_none_or(|c| augment(prep, ops, c, seen, matched_to)) {
            matched_to[b] = Some(a);
            return true;
        }
    }
    false
}
