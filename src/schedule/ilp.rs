//! PHAZE's scheduling ILP (docs/design.md §5), built with good_lp and solved by HiGHS.
//!
//! Variables: makespan T, start t_i, mode y_i (1 = all cores; only where both modes are worth
//! considering), order x_ij (i ends before j starts; only for same-type pairs with no path
//! between them, found from reachability bitsets), and, for a core type only once a solution
//! without them needed too many cores, assignment z_ic. Times are scaled so the warm start's
//! makespan is [`SCALE_UNITS`], which keeps coefficients within a few orders of magnitude
//! whatever the layer's size. T is capped at the warm makespan, so every start time lies in
//! the window propagation leaves for schedules that short (its variable bounds), and the
//! big-M of each ordering constraint is the tightest those windows allow: latest end of i −
//! earliest start of j.

use super::bounds::Windows;
use super::prepare::{Prepared, RESOURCES};
use super::realise::Realised;
use super::Assignment;
use ::highs::{HighsModelStatus, HighsSolutionStatus};
use good_lp::solvers::highs::highs as highs_solver;
use good_lp::{
    constraint, variable, Constraint, Expression, ProblemVariables, SolverModel, Variable,
    VariableDefinition,
};

/// The warm start's makespan in model units.
const SCALE_UNITS: f64 = 1000.0;
/// Windows are widened by this much of the warm makespan, so that rounding in propagation
/// never cuts off the warm start.
const WINDOW_SLACK_REL: f64 = 1e-7;
/// Integrality tolerance: a binary off by δ relaxes a big-M row by δ · M ≤ δ · SCALE_UNITS, which
/// must stay well below the ordering tolerance used when the solution is realised.
const INTEGRALITY_TOLERANCE: f64 = 1e-9;

pub(crate) struct Request<'a> {
    /// A valid schedule: the incumbent HiGHS starts from.
    pub warm_start: &'a Realised,
    /// Windows of every schedule no longer than the warm start: the bounds on start times and
    /// the source of the big-M.
    pub windows: &'a Windows,
    pub lower_bound_s: f64,
    /// Per resource: add core-assignment binaries.
    pub assign_cores: [bool; RESOURCES],
    pub time_limit_s: f64,
    pub node_limit: u32,
    pub relative_gap: f64,
}

pub(crate) struct Outcome {
    /// Start times and modes of the best solution found, if any.
    pub solution: Option<(Vec<f64>, Vec<usize>)>,
    /// Proven lower bound on the makespan of this model (a relaxation when core assignment is
    /// left out, so a lower bound for the real problem too).
    pub dual_bound_s: f64,
    /// A time (or other work) limit stopped the solver before the gap was closed.
    pub limit_hit: bool,
}

/// Variables with their warm-start values, in column order.
struct Columns {
    vars: ProblemVariables,
    initial: Vec<f64>,
}

impl Columns {
    fn add(&mut self, definition: VariableDefinition, initial: f64) -> Variable {
        self.initial.push(initial);
        self.vars.add(definition)
    }

    /// Adds a variable and returns it with its column in the solver's solution vector.
    fn add_indexed(&mut self, definition: VariableDefinition, initial: f64) -> (Variable, usize) {
        let column = self.initial.len();
        (self.add(definition, initial), column)
    }

    fn binary(&mut self, initial: bool) -> Variable {
        self.add(variable().binary(), if initial { 1.0 } else { 0.0 })
    }
}

/// An ordering decision between two operators of one type.
struct Pair {
    i: usize,
    j: usize,
    /// x_ij + x_ji: 1 when the two do not overlap.
    ordered: Expression,
}

pub(crate) fn solve(prep: &Prepared, request: &Request) -> Result<Outcome, String> {
    let n = prep.len();
    let warm = request.warm_start;
    let horizon_s = warm.makespan_s;
    let scale = SCALE_UNITS / horizon_s;
    let window = request.windows;
    let slack_s = WINDOW_SLACK_REL * horizon_s;
    let warm_end_s: Vec<f64> = (0..n)
        .map(|i| warm.starts_s[i] + prep.modes[i][warm.modes[i]].duration_s)
        .collect();

    let mut columns = Columns {
        vars: ProblemVariables::new(),
        initial: Vec::new(),
    };
    let makespan = columns.add(
        variable()
            .min((request.lower_bound_s * scale).min(SCALE_UNITS))
            .max(SCALE_UNITS),
        SCALE_UNITS,
    );
    let (start, start_column): (Vec<Variable>, Vec<usize>) = (0..n)
        .map(|i| {
            let earliest = (window.earliest_start_s[i] - slack_s).max(0.0) * scale;
            let latest = (window.latest_end_s[i] + slack_s - prep.min_duration_s[i]) * scale;
            columns.add_indexed(
                variable().min(earliest).max(latest.max(earliest)),
                warm.starts_s[i] * scale,
            )
        })
        .unzip();
    let (parallel, parallel_column): (Vec<Option<Variable>>, Vec<Option<usize>>) = (0..n)
        .map(|i| {
            if prep.modes[i].len() == 2 {
                let initial = if warm.modes[i] == 1 { 1.0 } else { 0.0 };
                let (y, column) = columns.add_indexed(variable().binary(), initial);
                (Some(y), Some(column))
            } else {
                (None, None)
            }
        })
        .unzip();
    let duration: Vec<Expression> = (0..n)
        .map(|i| {
            let first = prep.modes[i][0].duration_s * scale;
            match parallel[i] {
                Some(y) => first + (prep.modes[i][1].duration_s * scale - first) * y,
                None => Expression::from(first),
            }
        })
        .collect();

    let mut rows: Vec<Constraint> = Vec::new();
    for i in 0..n {
        if prep.succs[i].is_empty() {
            rows.push(constraint!(start[i] + duration[i].clone() <= makespan));
        }
        for &j in &prep.succs[i] {
            rows.push(constraint!(start[i] + duration[i].clone() <= start[j]));
        }
    }

    // `i` before `j` unless `before` is 0: t_i + p_i − t_j ≤ M_ij (1 − before).
    let big_m = |i: usize, j: usize| {
        let reach_s = window.latest_end_s[i] - window.earliest_start_s[j] + 2.0 * slack_s;
        (reach_s * scale).max(0.0)
    };
    let precedes = |i: usize, j: usize, before: Expression| {
        let m = big_m(i, j);
        constraint!(start[i] + duration[i].clone() - start[j] <= m - m * before)
    };
    let mut pairs: Vec<Pair> = Vec::new();
    for i in 0..n {
        for j in i + 1..n {
            let r = prep.resource[i];
            let relevant = prep.capacity[r] == 1
                || prep.modes[i].len() == 2
                || prep.modes[j].len() == 2
                || request.assign_cores[r];
            if prep.resource[j] != r || !relevant || prep.comparable(i, j) {
                continue;
            }
            let i_first = warm_end_s[i] <= warm.starts_s[j];
            if prep.capacity[r] == 1 {
                // One unit: the two are always ordered, so one binary decides which way.
                let before = columns.binary(i_first);
                rows.push(precedes(i, j, Expression::from(before)));
                rows.push(precedes(j, i, 1 - before));
                continue;
            }
            let x_ij = columns.binary(i_first);
            let x_ji = columns.binary(!i_first && warm_end_s[j] <= warm.starts_s[i]);
            rows.push(precedes(i, j, Expression::from(x_ij)));
            rows.push(precedes(j, i, Expression::from(x_ji)));
            rows.push(constraint!(x_ij + x_ji <= 1));
            // An all-core operator runs alone on its type.
            for y in [parallel[i], parallel[j]].into_iter().flatten() {
                rows.push(constraint!(x_ij + x_ji >= y));
            }
            pairs.push(Pair {
                i,
                j,
                ordered: x_ij + x_ji,
            });
        }
    }

    for r in (0..RESOURCES).filter(|&r| request.assign_cores[r]) {
        add_core_assignment(prep, warm, r, &parallel, &pairs, &mut columns, &mut rows);
    }

    let Columns { vars, initial } = columns;
    let mut model = vars
        .minimise(makespan)
        .using(highs_solver)
        .with_all(rows)
        .try_into_inner()
        .map_err(|e| e.to_string())?;
    model.make_quiet();
    let options: [(&str, f64); 3] = [
        ("time_limit", request.time_limit_s),
        ("mip_rel_gap", request.relative_gap),
        ("mip_feasibility_tolerance", INTEGRALITY_TOLERANCE),
    ];
    for (name, value) in options {
        model
            .try_set_option(name, value)
            .map_err(|_| format!("HiGHS rejected option {name} = {value}"))?;
    }
    // One thread per solve: the outer search runs many solves in parallel.
    model
        .try_set_option("threads", 1)
        .map_err(|_| "HiGHS rejected option threads = 1".to_string())?;
    // The warm start (the best list schedule) is usually within a fraction of a percent of
    // the optimum: the solve's work is raising the dual bound, not finding solutions.
    model
        .try_set_option("mip_heuristic_run_feasibility_jump", false)
        .map_err(|_| "HiGHS rejected option mip_heuristic_run_feasibility_jump".to_string())?;
    let nodes = i32::try_from(request.node_limit).unwrap_or(i32::MAX);
    model
        .try_set_option("mip_max_nodes", nodes)
        .map_err(|_| format!("HiGHS rejected option mip_max_nodes = {nodes}"))?;
    model
        .try_set_solution(Some(&initial), None, None, None)
        .map_err(|e| format!("HiGHS rejected the warm start: {e:?}"))?;
    let solved = model
        .try_solve()
        .map_err(|e| format!("HiGHS failed: {e:?}"))?;

    let limit_hit = match solved.status() {
        HighsModelStatus::Optimal => false,
        HighsModelStatus::ReachedTimeLimit
        | HighsModelStatus::ReachedIterationLimit
        | HighsModelStatus::ReachedSolutionLimit
        | HighsModelStatus::ReachedInterrupt
        | HighsModelStatus::ReachedMemoryLimit => true,
        other => return Err(format!("HiGHS ended with status {other:?}")),
    };
    let dual_bound_units = match solved.double_info_value(c"mip_dual_bound") {
        Ok(bound) if bound.is_finite() => bound,
        _ if !limit_hit => solved.objective_value(),
        _ => 0.0,
    };
    let solution = (solved.primal_solution_status() == HighsSolutionStatus::Feasible).then(|| {
        let values = solved.get_solution();
        let values = values.columns();
        let starts_s = start_column.iter().map(|&c| values[c] / scale).collect();
        let modes = parallel_column
            .iter()
            .map(|y| usize::from(y.is_some_and(|c| values[c] > 0.5)))
            .collect();
        (starts_s, modes)
    });
    Ok(Outcome {
        solution,
        dual_bound_s: dual_bound_units / scale,
        limit_hit,
    })
}

/// z_ic = 1 when one-core operator i runs on core c of resource r: Σ_c z_ic + y_i = 1, and two
/// operators on one core are ordered. Cores are interchangeable, so the k-th operator (index
/// order) that may run on one core only gets cores 0..=k: relabelling cores in order of first
/// use turns any assignment into one of this form.
fn add_core_assignment(
    prep: &Prepared,
    warm: &Realised,
    r: usize,
    parallel: &[Option<Variable>],
    pairs: &[Pair],
    columns: &mut Columns,
    rows: &mut Vec<Constraint>,
) {
    let n = prep.len();
    let cores = prep.capacity[r] as usize;
    let mut warm_label: Vec<Option<usize>> = vec![None; cores];
    let mut labels_used = 0;
    let mut z: Vec<Vec<Variable>> = vec![Vec::new(); n];
    let single_core_ops = (0..n).filter(|&i| prep.resource[i] == r && !prep.modes[i][0].parallel);
    for (rank, i) in single_core_ops.enumerate() {
        let warm_core = match warm.assignment[i] {
            Assignment::Core(c) if warm.modes[i] == 0 => {
                let slot = &mut warm_label[c as usize];
                Some(*slot.get_or_insert_with(|| {
                    labels_used += 1;
                    labels_used - 1
                }))
            }
            _ => None,
        };
        z[i] = (0..cores.min(rank + 1))
            .map(|c| columns.binary(warm_core == Some(c)))
            .collect();
        let total: Expression = z[i].iter().copied().sum();
        rows.push(match parallel[i] {
            Some(y) => constraint!(total + y == 1),
            None => constraint!(total == 1),
        });
    }
    for pair in pairs.iter().filter(|p| prep.resource[p.i] == r) {
        for (&z_i, &z_j) in z[pair.i].iter().zip(&z[pair.j]) {
            rows.push(constraint!(pair.ordered.clone() >= z_i + z_j - 1));
        }
    }
}
