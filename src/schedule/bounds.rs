//! Lower bound on the optimal makespan.

use super::prepare::{Prepared, RESOURCES};

/// Relative tolerance below which a propagation rule does not fire, so that rounding never
/// declares a feasible makespan infeasible.
const PROPAGATION_TOLERANCE_REL: f64 = 1e-9;
/// Propagation passes per makespan tried; each moves some window by more than the tolerance,
/// and a handful reach the fixed point on layer-sized problems.
const MAX_PASSES: usize = 64;
/// The destructive bound stops bisecting once its bracket is this narrow (relative): well
/// below any optimality gap worth asking for.
const BISECTION_REL: f64 = 1e-4;
/// First step above the relaxation bound when searching for a makespan propagation cannot
/// refute (relative); doubled on each refutation.
const FIRST_STEP_REL: f64 = 0.01;

/// The largest makespan [`windows`] refutes, searched from the larger of
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
///
/// Propagation adds what preemption hides: a long GEMM that must run on all cores cannot be
/// split to fill the gaps the vector operators between two other GEMMs leave.
pub(crate) fn lower_bound(prep: &Prepared) -> Bound {
    let lanes = lanes(prep);
    destructive_bound(prep, &lanes, relaxation_bound(prep, &lanes))
}

/// A lower bound on the makespan, with the windows of the shortest makespan propagation
/// could not refute (a guide for the list scheduler: the deadlines a near-optimal schedule
/// must meet).
#[derive(Debug, Clone)]
pub(crate) struct Bound {
    pub makespan_s: f64,
    pub guide: Option<Windows>,
}

/// The critical path and the per-resource preemptive bound described at [`lower_bound`].
fn relaxation_bound(prep: &Prepared, lanes: &[f64; RESOURCES]) -> f64 {
    let n = prep.len();
    let critical_path_s = (0..n)
        .map(|i| prep.head_s[i] + prep.min_duration_s[i] + prep.tail_s[i])
        .fold(0.0, f64::max);

    let mut jobs: [Vec<Job>; RESOURCES] = Default::default();
    for i in 0..n {
        let r = prep.resource[i];
        let lanes = lanes[r];
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

/// Per resource, how many one-unit runs can share it at once: its units, but no more than the
/// most of its operators that can run at the same time.
fn lanes(prep: &Prepared) -> [f64; RESOURCES] {
    let concurrent = max_concurrent(prep);
    std::array::from_fn(|r| f64::from(prep.capacity[r].min(concurrent[r]).max(1)))
}

/// The largest makespan that [`windows`] refutes, searched upward from `relaxation_s` (no
/// schedule is shorter; returned as it is when propagation cannot refute it either): steps
/// that double until a makespan propagation cannot refute brackets the answer, then
/// bisection. Every value returned other than `relaxation_s` was refuted, so it is a lower
/// bound whether or not refutation is monotone in the makespan. The search ends because a
/// makespan no shorter than all operators back to back is feasible and so never refuted.
fn destructive_bound(prep: &Prepared, lanes: &[f64; RESOURCES], relaxation_s: f64) -> Bound {
    let try_makespan = |makespan_s: f64| windows_with(prep, lanes, makespan_s);
    let mut open = try_makespan(relaxation_s);
    if open.is_some() || relaxation_s <= 0.0 {
        return Bound {
            makespan_s: relaxation_s,
            guide: open,
        };
    }
    let mut refuted_s = relaxation_s;
    let mut step_s = FIRST_STEP_REL * relaxation_s;
    let mut open_s = refuted_s + step_s;
    loop {
        open = try_makespan(open_s);
        if open.is_some() {
            break;
        }
        refuted_s = open_s;
        step_s *= 2.0;
        open_s = refuted_s + step_s;
    }
    while open_s - refuted_s > BISECTION_REL * open_s {
        let mid_s = 0.5 * (refuted_s + open_s);
        match try_makespan(mid_s) {
            None => refuted_s = mid_s,
            found => {
                open = found;
                open_s = mid_s;
            }
        }
    }
    Bound {
        makespan_s: refuted_s,
        guide: open,
    }
}

/// Where each operator can run in a schedule no longer than some makespan.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Windows {
    pub earliest_start_s: Vec<f64>,
    pub latest_end_s: Vec<f64>,
}

/// The time windows every schedule of makespan at most `makespan_s` keeps its operators in,
/// or `None` when constraint propagation proves that no such schedule exists.
pub(crate) fn windows(prep: &Prepared, makespan_s: f64) -> Option<Windows> {
    windows_with(prep, &lanes(prep), makespan_s)
}

/// Propagation to a fixed point of three rules, each valid for every schedule that meets the
/// makespan:
/// - precedence: an operator starts after its predecessors end (fastest modes);
/// - overload: a resource absorbs at most one unit of occupancy per second, so the jobs whose
///   windows lie inside an interval cannot need more than its length;
/// - edge finding: if an operator that must hold its resource alone (every mode that still
///   fits its window is all-unit) cannot run together with a set Ω inside Ω's window, it
///   runs after all of Ω or before all of Ω, which moves its window. One-unit runs are
///   counted as occupancy (duration / lanes), as in [`lower_bound`]; they cannot overlap an
///   all-unit run either.
fn windows_with(prep: &Prepared, lanes: &[f64; RESOURCES], makespan_s: f64) -> Option<Windows> {
    let n = prep.len();
    let tolerance_s = PROPAGATION_TOLERANCE_REL * makespan_s;
    let duration_s = &prep.min_duration_s;
    let mut est = prep.head_s.clone();
    let mut lct: Vec<f64> = prep.tail_s.iter().map(|t| makespan_s - t).collect();
    let mut by_resource: [Vec<usize>; RESOURCES] = Default::default();
    for i in 0..n {
        by_resource[prep.resource[i]].push(i);
    }
    let mut changed = true;
    let mut passes = 0;
    while changed && passes < MAX_PASSES {
        changed = false;
        passes += 1;
        // Indices are a topological order.
        for j in 0..n {
            for &i in &prep.preds[j] {
                est[j] = est[j].max(est[i] + duration_s[i]);
            }
        }
        for i in (0..n).rev() {
            for &j in &prep.succs[i] {
                lct[i] = lct[i].min(lct[j] - duration_s[j]);
            }
        }
        if (0..n).any(|i| est[i] + duration_s[i] > lct[i] + tolerance_s) {
            return None;
        }
        for (r, ops) in by_resource.iter().enumerate() {
            let jobs: Vec<ResourceJob> = ops
                .iter()
                .map(|&i| ResourceJob::new(prep, i, lanes[r], (est[i], lct[i]), tolerance_s))
                .collect();
            changed |= edge_find(&jobs, &mut est, &mut lct, tolerance_s)?;
        }
    }
    Some(Windows {
        earliest_start_s: est,
        latest_end_s: lct,
    })
}

/// An operator as one resource's propagation sees it.
struct ResourceJob {
    op: usize,
    earliest_start_s: f64,
    latest_end_s: f64,
    /// Least occupancy over the modes that fit its window.
    work_s: f64,
    /// Every mode that fits holds the whole resource.
    exclusive: bool,
}

impl ResourceJob {
    fn new(prep: &Prepared, op: usize, lanes: f64, window: (f64, f64), tolerance_s: f64) -> Self {
        let (earliest_start_s, latest_end_s) = window;
        let r = prep.resource[op];
        let mut work_s = f64::INFINITY;
        let mut exclusive = true;
        for (m, mode) in prep.modes[op].iter().enumerate() {
            let fits = earliest_start_s + mode.duration_s <= latest_end_s + tolerance_s;
            if !fits && mode.duration_s > prep.min_duration_s[op] {
                continue;
            }
            let alone = prep.demand(op, m) == prep.capacity[r];
            exclusive &= alone;
            let occupancy_s = if alone {
                mode.duration_s
            } else {
                mode.duration_s / lanes
            };
            work_s = work_s.min(occupancy_s);
        }
        ResourceJob {
            op,
            earliest_start_s,
            latest_end_s,
            work_s,
            exclusive,
        }
    }
}

/// Overload check and edge finding on one resource over the task intervals [L, U] (L an
/// earliest start, U a latest end). Moves `est` / `lct` of exclusive operators; `None` when
/// an interval is overloaded; otherwise whether a window moved.
fn edge_find(
    jobs: &[ResourceJob],
    est: &mut [f64],
    lct: &mut [f64],
    tolerance_s: f64,
) -> Option<bool> {
    let mut by_end: Vec<&ResourceJob> = jobs.iter().collect();
    by_end.sort_by(|a, b| a.latest_end_s.total_cmp(&b.latest_end_s));
    let mut starts_s: Vec<f64> = jobs.iter().map(|j| j.earliest_start_s).collect();
    starts_s.sort_by(f64::total_cmp);
    starts_s.dedup();
    // No rule fires on an interval with more slack than the longest exclusive job.
    let longest_exclusive_s = jobs
        .iter()
        .filter(|j| j.exclusive)
        .map(|j| j.work_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut changed = false;
    let mut inside = vec![false; jobs.len()];
    for from_s in starts_s {
        inside.iter_mut().for_each(|x| *x = false);
        let mut work_s = 0.0;
        let mut first_start_s = f64::INFINITY;
        for (k, job) in by_end.iter().enumerate() {
            if job.earliest_start_s < from_s {
                continue;
            }
            inside[k] = true;
            work_s += job.work_s;
            first_start_s = first_start_s.min(job.earliest_start_s);
            let until_s = job.latest_end_s;
            if first_start_s + work_s > until_s + tolerance_s {
                return None;
            }
            if first_start_s + work_s + longest_exclusive_s <= until_s + tolerance_s {
                continue;
            }
            for (m, other) in by_end.iter().enumerate() {
                if inside[m] || !other.exclusive {
                    continue;
                }
                let i = other.op;
                let length_s = work_s + other.work_s;
                // Ω and i cannot all end by Ω's last end: i ends after all of Ω.
                if first_start_s.min(est[i]) + length_s > until_s + tolerance_s
                    && first_start_s + work_s > est[i] + tolerance_s
                {
                    est[i] = first_start_s + work_s;
                    changed = true;
                }
                // Ω and i cannot all start at Ω's first start: i starts before all of Ω.
                if first_start_s + length_s > until_s.max(lct[i]) + tolerance_s
                    && until_s - work_s < lct[i] - tolerance_s
                {
                    lct[i] = until_s - work_s;
                    changed = true;
                }
            }
        }
    }
    Some(changed)
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
