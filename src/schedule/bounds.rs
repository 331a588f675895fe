//! Lower bound on the optimal makespan.

use super::prepare::{Prepared, RESOURCES};

/// The larger of
/// - the critical path with every operator in its fastest mode, and
/// - per resource, the makespan of its operators on one preemptive machine: each becomes a
///   job released at its head, delivered (finished) at least its tail before the end, that
///   needs the resource's occupancy. An all-unit run holds the resource alone for its
///   latency; one-unit runs share it, but at most `lanes = min(units, most operators that
///   can run at once)` of them at a time, so each holds at least `1 / lanes` of it, and the
///   resource completes at most one unit of occupancy per second. The cap on concurrency is
///   what keeps the bound tight on chips with many more cores than a layer has independent
///   operators; the release and delivery times add the idle time the precedence forces on a
///   resource (e.g. tensor cores waiting on the vector operators between two GEMMs).
pub(crate) fn lower_bound(prep: &Prepared) -> f64 {
    let n = prep.len();
    let critical_path_s = (0..n)
        .map(|i| prep.head_s[i] + prep.min_duration_s[i] + prep.tail_s[i])
        .fold(0.0, f64::max);

    let concurrent = max_concurrent(prep);
    let mut jobs: [Vec<Job>; RESOURCES] = Default::default();
    for i in 0..n {
        let r = prep.resource[i];
        let lanes = f64::from(prep.capacity[r].min(concurrent[r]).max(1));
        let occupancy_s = prep.modes[i]
            .iter()
            .map(|m| {
                if m.parallel {
                    m.duration_s
                } else {
                    m.duration_s / lanes
                }
            })
            .fold(f64::INFINITY, f64::min);
        jobs[r].push(Job {
            release_s: prep.head_s[i],
            work_s: occupancy_s,
            tail_s: prep.tail_s[i],
        });
    }
    jobs.iter_mut()
        .map(|jobs| preemptive_makespan(jobs))
        .fold(critical_path_s, f64::max)
}

/// An operator seen by one resource: available from `release_s`, `work_s` of the resource's
/// capacity to absorb, `tail_s` of work after it.
#[derive(Debug, Clone, Copy)]
struct Job {
    release_s: f64,
    work_s: f64,
    tail_s: f64,
}

/// Optimal makespan (largest completion plus tail) of `jobs` on one machine with preemption,
/// by Jackson's rule: whenever a job is released or finishes, run the released job with the
/// longest tail. It equals the largest over job sets of (earliest release + total work +
/// shortest tail), so it is never below the whole set's value. 0 without jobs.
fn preemptive_makespan(jobs: &mut [Job]) -> f64 {
    jobs.sort_by(|a, b| a.release_s.total_cmp(&b.release_s));
    // Released, unfinished jobs as (tail, remaining work); few enough for a linear scan.
    let mut ready: Vec<(f64, f64)> = Vec::new();
    let mut next = 0;
    let mut clock_s: f64 = 0.0;
    let mut makespan_s: f64 = 0.0;
    while next < jobs.len() || !ready.is_empty() {
        if ready.is_empty() {
            clock_s = clock_s.max(jobs[next].release_s);
        }
        while next < jobs.len() && jobs[next].release_s <= clock_s {
            ready.push((jobs[next].tail_s, jobs[next].work_s));
            next += 1;
        }
        let (at, &(tail_s, work_s)) = ready
            .iter()
            .enumerate()
            .max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
            .expect("a job is ready");
        let until_s = jobs.get(next).map_or(f64::INFINITY, |j| j.release_s);
        if clock_s + work_s <= until_s {
            clock_s += work_s;
            makespan_s = makespan_s.max(clock_s + tail_s);
            ready.swap_remove(at);
        } else {
            ready[at].1 = work_s - (until_s - clock_s);
            clock_s = until_s;
        }
    }
    makespan_s
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
