//! From start times and modes to a concrete, checked schedule: replay the solver's orderings
//! exactly, assign cores by interval colouring, and verify.

use super::prepare::{Prepared, RESOURCES};
use super::{Assignment, CoreUtilisation, Schedule, ScheduleProblem, ScheduledOp, SolveStatus};
use std::time::Instant;

/// Operators whose solver intervals overlap by less than this fraction of the makespan are
/// taken as ordered (the solver's feasibility tolerances are far below it).
const ORDER_TOLERANCE_REL: f64 = 1e-7;
/// Relative tolerance of [`verify`].
const VERIFY_TOLERANCE_REL: f64 = 1e-9;

/// A schedule in the scheduler's own terms, valid for its problem.
#[derive(Debug, Clone)]
pub(crate) struct Realised {
    pub starts_s: Vec<f64>,
    pub modes: Vec<usize>,
    pub assignment: Vec<Assignment>,
    pub makespan_s: f64,
    pub energy_j: f64,
}

fn ends_s(prep: &Prepared, starts_s: &[f64], modes: &[usize]) -> Vec<f64> {
    (0..prep.len())
        .map(|i| starts_s[i] + prep.modes[i][modes[i]].duration_s)
        .collect()
}

fn finish(
    prep: &Prepared,
    starts_s: Vec<f64>,
    modes: Vec<usize>,
    assignment: Vec<Assignment>,
) -> Realised {
    let makespan_s = ends_s(prep, &starts_s, &modes)
        .into_iter()
        .fold(0.0, f64::max);
    let energy_j = (0..prep.len())
        .map(|i| prep.modes[i][modes[i]].energy_j)
        .sum();
    Realised {
        starts_s,
        modes,
        assignment,
        makespan_s,
        energy_j,
    }
}

/// Assigns cores: per resource, operators by start time; an all-core operator needs every unit
/// free, a one-core operator takes the lowest free unit. Greedy colouring in start order uses
/// exactly as many units as the most operators running at once, so it fails only when the
/// schedule really needs more units than exist. Err lists those resources.
pub(crate) fn assign(
    prep: &Prepared,
    starts_s: Vec<f64>,
    modes: Vec<usize>,
) -> Result<Realised, Vec<usize>> {
    let ends_s = ends_s(prep, &starts_s, &modes);
    let mut assignment = vec![Assignment::Core(0); prep.len()];
    let mut over_capacity = Vec::new();
    for r in 0..RESOURCES {
        let mut order: Vec<usize> = (0..prep.len()).filter(|&i| prep.resource[i] == r).collect();
        order.sort_by(|&a, &b| {
            starts_s[a]
                .total_cmp(&starts_s[b])
                .then(ends_s[a].total_cmp(&ends_s[b]))
                .then(a.cmp(&b))
        });
        let mut free_from_s = vec![0.0_f64; prep.capacity[r] as usize];
        let mut fits = true;
        for op in order {
            let parallel = prep.modes[op][modes[op]].parallel;
            if parallel {
                assignment[op] = Assignment::AllCores;
            }
            // An empty interval overlaps nothing.
            if ends_s[op] <= starts_s[op] {
                continue;
            }
            if parallel {
                if free_from_s.iter().all(|&f| f <= starts_s[op]) {
                    free_from_s.fill(ends_s[op]);
                } else {
                    fits = false;
                }
            } else if let Some(core) = free_from_s.iter().position(|&f| f <= starts_s[op]) {
                free_from_s[core] = ends_s[op];
                assignment[op] = Assignment::Core(core as u32);
            } else {
                fits = false;
            }
        }
        if !fits {
            over_capacity.push(r);
        }
    }
    if over_capacity.is_empty() {
        Ok(finish(prep, starts_s, modes, assignment))
    } else {
        Err(over_capacity)
    }
}

/// Every operator in its first mode at the given start times, which must not overlap (one
/// operator at a time).
pub(crate) fn sequential(prep: &Prepared, starts_s: Vec<f64>) -> Realised {
    let modes = vec![0; prep.len()];
    let assignment = (0..prep.len())
        .map(|i| {
            if prep.modes[i][0].parallel {
                Assignment::AllCores
            } else {
                Assignment::Core(0)
            }
        })
        .collect();
    finish(prep, starts_s, modes, assignment)
}

/// Turns solver start times into an exact schedule. Start times are first pushed forward so
/// precedence holds exactly; then every same-resource pair the solver ran one after the other
/// (within tolerance) becomes an ordering, and all operators start as early as the DAG and
/// these orderings allow. Two operators overlap afterwards only if they overlapped in the
/// solver's solution, so core use never grows. Err lists resources that still need more units
/// than exist (the model had no core-assignment constraints for them).
pub(crate) fn from_solver(
    prep: &Prepared,
    solver_starts_s: &[f64],
    modes: &[usize],
) -> Result<Realised, Vec<usize>> {
    let n = prep.len();
    let duration_s: Vec<f64> = (0..n).map(|i| prep.modes[i][modes[i]].duration_s).collect();
    let mut repaired_s = vec![0.0_f64; n];
    for j in 0..n {
        repaired_s[j] = prep.preds[j]
            .iter()
            .map(|&i| repaired_s[i] + duration_s[i])
            .fold(solver_starts_s[j].max(0.0), f64::max);
    }
    let horizon_s = (0..n)
        .map(|i| repaired_s[i] + duration_s[i])
        .fold(0.0, f64::max);
    let tolerance_s = ORDER_TOLERANCE_REL * horizon_s;

    // (repaired start, index) orders DAG edges forward (indices are topological), so replaying
    // in this order sees every predecessor first.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| repaired_s[a].total_cmp(&repaired_s[b]).then(a.cmp(&b)));
    let mut starts_s = vec![0.0_f64; n];
    for (rank, &j) in order.iter().enumerate() {
        let after_preds_s = prep.preds[j]
            .iter()
            .map(|&i| starts_s[i] + duration_s[i])
            .fold(0.0, f64::max);
        starts_s[j] = order[..rank]
            .iter()
            .filter(|&&i| {
                prep.resource[i] == prep.resource[j]
                    && repaired_s[i] + duration_s[i] <= repaired_s[j] + tolerance_s
            })
            .map(|&i| starts_s[i] + duration_s[i])
            .fold(after_preds_s, f64::max);
    }
    assign(prep, starts_s, modes.to_vec())
}

/// The public [`Schedule`] of a realised plan.
pub(crate) fn assemble(
    prep: &Prepared,
    plan: &Realised,
    lower_bound_s: f64,
    upper_bound_s: f64,
    status: SolveStatus,
    started: Instant,
) -> Schedule {
    let ends_s = ends_s(prep, &plan.starts_s, &plan.modes);
    let ops = (0..prep.len())
        .map(|i| ScheduledOp {
            op: i,
            start_s: plan.starts_s[i],
            end_s: ends_s[i],
            assignment: plan.assignment[i],
        })
        .collect();
    let mut busy_core_s = [0.0; RESOURCES];
    for i in 0..prep.len() {
        busy_core_s[prep.resource[i]] +=
            f64::from(prep.demand(i, plan.modes[i])) * (ends_s[i] - plan.starts_s[i]);
    }
    let fraction = |r: usize| {
        let available_core_s = f64::from(prep.capacity[r]) * plan.makespan_s;
        if available_core_s > 0.0 {
            busy_core_s[r] / available_core_s
        } else {
            0.0
        }
    };
    Schedule {
        makespan_s: plan.makespan_s,
        lower_bound_s: lower_bound_s.min(plan.makespan_s),
        upper_bound_s,
        status,
        solve_time_s: started.elapsed().as_secs_f64(),
        ops,
        energy_j: plan.energy_j,
        utilisation: CoreUtilisation {
            tensor: fraction(0),
            vector: fraction(1),
            link: fraction(2),
        },
    }
}

/// Checks a schedule against its problem: one entry per operator in order, durations and
/// energy of the assigned variants, core indices that exist, precedence, no two operators on
/// one core at once, all-core operators alone on their type, makespan and bounds consistent.
pub fn verify(problem: &ScheduleProblem, schedule: &Schedule) -> Result<(), String> {
    problem.validate().map_err(|e| e.to_string())?;
    let n = problem.ops.len();
    if schedule.ops.len() != n {
        return Err(format!(
            "{} scheduled operators for {n} operators",
            schedule.ops.len()
        ));
    }
    let tol_s = VERIFY_TOLERANCE_REL * schedule.makespan_s.abs() + f64::MIN_POSITIVE;
    let mut energy_j = 0.0;
    let mut latest_end_s = 0.0_f64;
    for (k, s) in schedule.ops.iter().enumerate() {
        let op = &problem.ops[k];
        if s.op != k {
            return Err(format!("entry {k} is operator {} (expected {k})", s.op));
        }
        let (duration_s, energy) = match s.assignment {
            Assignment::AllCores if op.core == crate::workload::CoreType::Link => {
                return Err(format!(
                    "link operator `{}` cannot run on all cores",
                    op.name
                ));
            }
            Assignment::AllCores => (op.all_cores_s, op.all_cores_energy_j),
            Assignment::Core(c) => {
                if c >= problem.cores.of(op.core) {
                    return Err(format!(
                        "`{}` on {:?} core {c}, which does not exist",
                        op.name, op.core
                    ));
                }
                (op.one_core_s, op.one_core_energy_j)
            }
        };
        if s.start_s < -tol_s || ((s.end_s - s.start_s) - duration_s).abs() > tol_s {
            return Err(format!(
                "`{}` runs [{}, {}] but its variant takes {duration_s} s",
                op.name, s.start_s, s.end_s
            ));
        }
        energy_j += energy;
        latest_end_s = latest_end_s.max(s.end_s);
    }
    for &(i, j) in &problem.edges {
        if schedule.ops[i].end_s > schedule.ops[j].start_s + tol_s {
            return Err(format!(
                "`{}` starts at {} before its predecessor `{}` ends at {}",
                problem.ops[j].name,
                schedule.ops[j].start_s,
                problem.ops[i].name,
                schedule.ops[i].end_s
            ));
        }
    }
    for i in 0..n {
        for j in i + 1..n {
            let (a, b) = (&schedule.ops[i], &schedule.ops[j]);
            if problem.ops[i].core != problem.ops[j].core {
                continue;
            }
            let overlap_s = a.end_s.min(b.end_s) - a.start_s.max(b.start_s);
            let shared = match (a.assignment, b.assignment) {
                (Assignment::Core(x), Assignment::Core(y)) => x == y,
                _ => true,
            };
            if shared && overlap_s > tol_s {
                return Err(format!(
                    "`{}` and `{}` overlap by {overlap_s} s on the same {:?} core(s)",
                    problem.ops[i].name, problem.ops[j].name, problem.ops[i].core
                ));
            }
        }
    }
    if (schedule.makespan_s - latest_end_s).abs() > tol_s {
        return Err(format!(
            "makespan {} but the last operator ends at {latest_end_s}",
            schedule.makespan_s
        ));
    }
    if (schedule.energy_j - energy_j).abs()
        > VERIFY_TOLERANCE_REL * energy_j.abs() + f64::MIN_POSITIVE
    {
        return Err(format!(
            "energy {} J but the chosen variants sum to {energy_j} J",
            schedule.energy_j
        ));
    }
    if schedule.lower_bound_s > schedule.makespan_s + tol_s
        || schedule.makespan_s > schedule.upper_bound_s + tol_s
    {
        return Err(format!(
            "bounds out of order: lower {} makespan {} upper {}",
            schedule.lower_bound_s, schedule.makespan_s, schedule.upper_bound_s
        ));
    }
    Ok(())
}
