//! Per-layer operator scheduling (docs/design.md §5).
//!
//! One unique layer's forward or backward operator DAG is scheduled on a device's tensor cores,
//! vector cores and network link so that the makespan is minimal. Each tensor or vector
//! operator runs either on one core or intra-operator parallel on all cores of its type (then
//! alone on that type); link operators (collectives) use the single network resource one at a
//! time.
//!
//! The pipeline per problem:
//! 1. [`lower_bound`]: critical path and, per core type, a preemptive one-machine bound
//!    with heads and tails; then the largest makespan that constraint propagation (precedence,
//!    overload, edge finding for operators that must hold their core type alone) refutes.
//! 2. [`list_schedule`]: serial schedule-generation passes (several priority rules and
//!    execution-variant rules, earliest-deadline-first on the deadlines of the shortest
//!    makespan propagation could not refute, plus fixed-seed randomised passes, many more of
//!    them when the solver is about to run); the best is the upper bound and the ILP's warm
//!    start.
//! 3. When the bounds are further apart than the requested gap, a depth-first search
//!    (`dfs`) asks for a schedule no longer than lower bound / (1 − gap); a target it proves
//!    infeasible becomes the lower bound for the next round. It stops at a placement budget
//!    ([`SolverOptions::search_node_limit`]).
//! 4. If the gap is still open, PHAZE's ILP on HiGHS (via good_lp) from the raised bound, its
//!    start times confined to the windows propagation leaves for schedules no longer than the
//!    list schedule, first without core-assignment binaries; they are added for a core type
//!    only when the solution needs more cores of that type than exist, and the model is solved
//!    again.
//! 5. The solver's times are turned into a schedule that is valid by construction (precedence
//!    and same-type orderings are replayed exactly, cores assigned by interval colouring) and
//!    checked by [`verify`]. Anything the solver returns that cannot be realised falls back to
//!    the heuristic, and the status says so.
//!
//! Results are memoised per (layer signature, core configuration, hardware) in
//! [`ScheduleCache`].

mod bounds;
mod cache;
mod dfs;
mod gantt;
mod ilp;
mod list;
mod prepare;
mod profile;
mod realise;

pub use cache::ScheduleCache;
pub use gantt::render_gantt;
pub use realise::verify;

use crate::arch::KernelExecution;
use crate::cost::CostModel;
use crate::workload::{CoreType, OpGraph};
use prepare::Prepared;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

/// One operator as the scheduler sees it: its core type and its two execution variants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedOp {
    pub name: String,
    pub core: CoreType,
    /// Latency on a single core of its type (the only variant for link operators).
    pub one_core_s: f64,
    /// Latency when split across all cores of its type.
    pub all_cores_s: f64,
    pub one_core_energy_j: f64,
    pub all_cores_energy_j: f64,
    /// Issued asynchronously ([`crate::workload::Op::asynchronous`]): under
    /// [`KernelExecution::Serial`] the operators after it run while it does.
    #[serde(default)]
    pub asynchronous: bool,
}

/// Cores of each type on the device. The link is a single network resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CoreCounts {
    pub tensor: u32,
    pub vector: u32,
}

impl CoreCounts {
    /// Number of units of a core type (1 for the link).
    pub fn of(&self, core: CoreType) -> u32 {
        match core {
            CoreType::Tensor => self.tensor,
            CoreType::Vector => self.vector,
            CoreType::Link => 1,
        }
    }
}

/// A layer's operator DAG on one device. Invariant (checked by [`ScheduleProblem::validate`]):
/// `ops` are topologically ordered and every edge `(i, j)` has `i < j`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleProblem {
    pub ops: Vec<SchedOp>,
    pub edges: Vec<(usize, usize)>,
    pub cores: CoreCounts,
    /// Under [`KernelExecution::Serial`] the operators run one at a time in their (topological)
    /// order, each in its fastest variant, an asynchronous one beside the others: the
    /// schedule is forced, no search is needed.
    pub execution: KernelExecution,
}

impl ScheduleProblem {
    /// The problem of running `graph` on the chip `cost` prices for: every operator in both
    /// variants, on all the chip's tensor and vector cores.
    pub fn from_op_graph(graph: &OpGraph, cost: &CostModel) -> ScheduleProblem {
        let ops = graph
            .ops
            .iter()
            .map(|op| {
                let c = cost.op_cost(op);
                SchedOp {
                    name: op.name.clone(),
                    core: c.core,
                    one_core_s: c.one_core_s,
                    all_cores_s: c.all_cores_s,
                    one_core_energy_j: c.one_core_energy_j,
                    all_cores_energy_j: c.all_cores_energy_j,
                    asynchronous: op.asynchronous,
                }
            })
            .collect();
        let arch = cost.arch();
        ScheduleProblem {
            ops,
            edges: graph.edges.clone(),
            cores: CoreCounts {
                tensor: arch.tensor.count,
                vector: arch.vector.count,
            },
            execution: arch.kernel_execution,
        }
    }

    /// Checks the invariants the scheduler relies on; names the offending field.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let invalid = |field: String, reason: &str| ScheduleError::InvalidProblem {
            field,
            reason: reason.to_string(),
        };
        for (i, op) in self.ops.iter().enumerate() {
            let values = [
                ("one_core_s", op.one_core_s),
                ("all_cores_s", op.all_cores_s),
                ("one_core_energy_j", op.one_core_energy_j),
                ("all_cores_energy_j", op.all_cores_energy_j),
            ];
            for (name, value) in values {
                if !value.is_finite() || value < 0.0 {
                    return Err(invalid(
                        format!("ops[{i}].{name}"),
                        &format!("must be finite and non-negative, got {value}"),
                    ));
                }
            }
            if self.cores.of(op.core) == 0 {
                return Err(invalid(
                    format!("ops[{i}].core"),
                    &format!(
                        "operator `{}` needs {:?} cores but the device has none",
                        op.name, op.core
                    ),
                ));
            }
        }
        for (e, &(from, to)) in self.edges.iter().enumerate() {
            if from >= self.ops.len() || to >= self.ops.len() {
                return Err(invalid(
                    format!("edges[{e}]"),
                    &format!(
                        "({from}, {to}) refers to an operator beyond the {} given",
                        self.ops.len()
                    ),
                ));
            }
            if from >= to {
                return Err(invalid(
                    format!("edges[{e}]"),
                    &format!("({from}, {to}) is not in topological order (need from < to)"),
                ));
            }
        }
        Ok(())
    }
}

/// How hard to work on one problem.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SolverOptions {
    /// Wall-clock budget for the ILP of one problem (all its re-solves together): a safety
    /// net, since a schedule cut off by the clock depends on the machine's load.
    pub time_limit_s: f64,
    /// Branch-and-bound nodes per ILP solve: the deterministic work limit, so equal inputs
    /// give equal schedules on any machine.
    pub node_limit: u32,
    /// Placements the depth-first search may make per problem before the ILP takes over
    /// (deterministic like `node_limit`); 0 leaves every open gap to the ILP.
    pub search_node_limit: u32,
    /// Stop once (makespan − lower bound) / makespan is at most this (0.01 = 1 %).
    pub relative_gap: f64,
    /// When false, return the list schedule (with its bounds) without calling the solver.
    pub use_ilp: bool,
}

impl Default for SolverOptions {
    fn default() -> Self {
        SolverOptions {
            time_limit_s: 10.0,
            node_limit: 500,
            search_node_limit: 300_000,
            relative_gap: 0.01,
            use_ilp: true,
        }
    }
}

impl SolverOptions {
    pub fn validate(&self) -> Result<(), ScheduleError> {
        if !(self.time_limit_s.is_finite() && self.time_limit_s > 0.0) {
            return Err(ScheduleError::InvalidOptions {
                field: "time_limit_s".into(),
                reason: format!("must be finite and positive, got {}", self.time_limit_s),
            });
        }
        if self.node_limit == 0 || self.node_limit > i32::MAX as u32 {
            return Err(ScheduleError::InvalidOptions {
                field: "node_limit".into(),
                reason: format!("must lie in 1..={}, got {}", i32::MAX, self.node_limit),
            });
        }
        if !(self.relative_gap.is_finite() && (0.0..1.0).contains(&self.relative_gap)) {
            return Err(ScheduleError::InvalidOptions {
                field: "relative_gap".into(),
                reason: format!("must lie in [0, 1), got {}", self.relative_gap),
            });
        }
        Ok(())
    }
}

/// How the returned schedule was obtained. `Display` gives the CSV form.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum SolveStatus {
    /// The list schedule meets the lower bound: optimal without the solver.
    BoundsMet,
    /// The solver or the depth-first search proved optimality.
    Optimal,
    /// Within the requested relative gap of the lower bound: by the solver, or by the list
    /// schedule (at once, or once the search has raised the lower bound).
    WithinGap { gap: f64 },
    /// Within the requested relative gap, found by the depth-first search without the solver.
    Searched { gap: f64 },
    /// A work limit (nodes) or the time limit stopped the solver; the best schedule found is
    /// returned.
    TimeLimit { gap: f64 },
    /// Only the list schedule: the solver was disabled, failed, or returned something that
    /// could not be realised.
    HeuristicOnly,
}

impl fmt::Display for SolveStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SolveStatus::BoundsMet => write!(f, "bounds"),
            SolveStatus::Optimal => write!(f, "optimal"),
            SolveStatus::WithinGap { gap } => write!(f, "gap:{:.1}%", gap * 100.0),
            SolveStatus::Searched { gap } => write!(f, "search:{:.1}%", gap * 100.0),
            SolveStatus::TimeLimit { gap } => write!(f, "time-limit:{:.1}%", gap * 100.0),
            SolveStatus::HeuristicOnly => write!(f, "heuristic"),
        }
    }
}

/// Where an operator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Assignment {
    /// Intra-operator parallel on every core of its type, alone on that type.
    AllCores,
    /// On one core of its type (index within the type; always 0 for the link).
    Core(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScheduledOp {
    /// Index into [`ScheduleProblem::ops`].
    pub op: usize,
    pub start_s: f64,
    pub end_s: f64,
    pub assignment: Assignment,
}

/// Busy fraction of each core type over the makespan (busy core-seconds / (cores × makespan)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CoreUtilisation {
    pub tensor: f64,
    pub vector: f64,
    pub link: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub makespan_s: f64,
    /// Best proven lower bound on the optimal makespan.
    pub lower_bound_s: f64,
    /// Makespan of the heuristic schedule the solver starts from: the list schedule, after
    /// more randomised passes when the first ones leave the gap open.
    pub upper_bound_s: f64,
    pub status: SolveStatus,
    /// Wall-clock time spent on this problem.
    pub solve_time_s: f64,
    /// One entry per operator, in operator order.
    pub ops: Vec<ScheduledOp>,
    /// Sum of the chosen variants' operator energies.
    pub energy_j: f64,
    pub utilisation: CoreUtilisation,
}

impl Schedule {
    /// (makespan − lower bound) / makespan; 0 for an empty schedule.
    pub fn gap(&self) -> f64 {
        relative_gap(self.makespan_s, self.lower_bound_s)
    }

    /// How long `problem`'s asynchronous collectives ran beside the compute stream of a
    /// [`KernelExecution::Serial`] chip: each one's overlap with the tensor and vector
    /// operators' spans (which never overlap one another there). 0 on a chip whose cores run
    /// side by side, where a collective has a link of its own.
    pub fn async_overlap_s(&self, problem: &ScheduleProblem) -> f64 {
        if problem.execution != KernelExecution::Serial {
            return 0.0;
        }
        let on_link = |op: &ScheduledOp| problem.ops[op.op].core == CoreType::Link;
        let compute: Vec<(f64, f64)> = self
            .ops
            .iter()
            .filter(|op| !on_link(op))
            .map(|op| (op.start_s, op.end_s))
            .collect();
        self.ops
            .iter()
            .filter(|op| on_link(op) && problem.ops[op.op].asynchronous)
            .map(|c| {
                compute
                    .iter()
                    .map(|&(start, end)| (end.min(c.end_s) - start.max(c.start_s)).max(0.0))
                    .sum::<f64>()
            })
            .sum()
    }
}

/// Invalid input to the scheduler, or a failure to write its chart.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule problem: field `{field}`: {reason}")]
    InvalidProblem { field: String, reason: String },
    #[error("solver options: field `{field}`: {reason}")]
    InvalidOptions { field: String, reason: String },
    #[error("{file}: cannot draw the Gantt chart: {reason}", file = .file.display())]
    Render { file: PathBuf, reason: String },
}

/// Makespans closer than this (relative) count as equal: the bounds met, or the solver proved
/// optimality up to its own tolerances.
const SAME_MAKESPAN_REL: f64 = 1e-6;

fn relative_gap(makespan_s: f64, lower_bound_s: f64) -> f64 {
    if makespan_s > 0.0 {
        ((makespan_s - lower_bound_s) / makespan_s).max(0.0)
    } else {
        0.0
    }
}

/// Status of a schedule the depth-first search found.
fn searched(makespan_s: f64, lower_bound_s: f64) -> SolveStatus {
    let gap = relative_gap(makespan_s, lower_bound_s);
    if gap <= SAME_MAKESPAN_REL {
        SolveStatus::Optimal
    } else {
        SolveStatus::Searched { gap }
    }
}

/// Lower bound on the optimal makespan (critical path; per core type, a preemptive one-machine
/// bound; raised to the largest makespan constraint propagation refutes). Under serial
/// execution, the forced schedule's makespan.
pub fn lower_bound(problem: &ScheduleProblem) -> Result<f64, ScheduleError> {
    problem.validate()?;
    let prep = Prepared::new(problem);
    if problem.execution == KernelExecution::Serial {
        return Ok(serial(&prep, Instant::now()).makespan_s);
    }
    Ok(bounds::lower_bound(&prep).makespan_s)
}

/// Lower bound on the energy of any schedule: every operator in its least-energy mode. Under
/// serial execution each runs in its fastest mode, which spends no less.
pub fn energy_lower_bound(problem: &ScheduleProblem) -> Result<f64, ScheduleError> {
    problem.validate()?;
    Ok(prepare::min_energy_j(problem))
}

/// The best of the list-scheduling passes, with status [`SolveStatus::HeuristicOnly`] (under
/// serial execution, the forced schedule).
pub fn list_schedule(problem: &ScheduleProblem) -> Result<Schedule, ScheduleError> {
    problem.validate()?;
    let started = Instant::now();
    let prep = Prepared::new(problem);
    if problem.execution == KernelExecution::Serial {
        return Ok(serial(&prep, started));
    }
    let bound = bounds::lower_bound(&prep);
    let heuristic = list::best_list_schedule(&prep, bound.guide.as_ref(), f64::INFINITY);
    let lower_bound_s = bound.makespan_s;
    Ok(realise::assemble(
        &prep,
        &heuristic,
        lower_bound_s,
        heuristic.makespan_s,
        SolveStatus::HeuristicOnly,
        started,
    ))
}

/// What [`meet_makespan`] found out about a makespan.
#[derive(Debug, Clone, PartialEq)]
pub enum Feasibility {
    /// A schedule no longer than the makespan asked for (its status: [`SolveStatus::Searched`]
    /// with its gap to the lower bound, or [`SolveStatus::Optimal`] when it meets it).
    Met(Schedule),
    /// Proven: no schedule is that short.
    Infeasible,
    /// The placements allowed ran out before either was shown.
    Undecided,
}

/// Whether the problem has a schedule no longer than `makespan_s` (within a relative 1e-9), by
/// the depth-first search alone with at most `node_limit` placements: a deadline check
/// ("can this layer run in 5 ms on this chip?") and the search's contract, which the tests
/// hold to brute force. Under serial execution the forced schedule decides. Problems of more
/// than 512 operators are not searched (undecided unless propagation refutes the makespan).
pub fn meet_makespan(
    problem: &ScheduleProblem,
    makespan_s: f64,
    node_limit: u32,
) -> Result<Feasibility, ScheduleError> {
    problem.validate()?;
    if !(makespan_s.is_finite() && makespan_s > 0.0) {
        return Err(ScheduleError::InvalidOptions {
            field: "makespan_s".into(),
            reason: format!("must be finite and positive, got {makespan_s}"),
        });
    }
    let started = Instant::now();
    let prep = Prepared::new(problem);
    if problem.execution == KernelExecution::Serial {
        let forced = serial(&prep, started);
        return Ok(if forced.makespan_s <= makespan_s * (1.0 + 1e-9) {
            Feasibility::Met(forced)
        } else {
            Feasibility::Infeasible
        });
    }
    let mut budget = dfs::Budget {
        nodes: node_limit as usize,
        deadline: None,
    };
    Ok(match dfs::meet_target(&prep, makespan_s, &mut budget) {
        dfs::Outcome::Met(plan) => {
            let lower_bound_s = bounds::lower_bound(&prep).makespan_s.min(plan.makespan_s);
            let status = searched(plan.makespan_s, lower_bound_s);
            let schedule = realise::assemble(
                &prep,
                &plan,
                lower_bound_s,
                plan.makespan_s,
                status,
                started,
            );
            Feasibility::Met(schedule)
        }
        dfs::Outcome::Refuted => Feasibility::Infeasible,
        dfs::Outcome::Undecided => Feasibility::Undecided,
    })
}

/// Minimum-makespan schedule of one layer's operator DAG (docs/design.md §5). Errors only on
/// invalid input; solver trouble degrades to the list schedule with a status that says so.
pub fn schedule(
    problem: &ScheduleProblem,
    options: &SolverOptions,
) -> Result<Schedule, ScheduleError> {
    problem.validate()?;
    options.validate()?;
    Ok(solve_valid(problem, options))
}

/// The forced schedule of [`KernelExecution::Serial`]: operators in index order (a
/// topological order), each in its fastest variant, on two streams. The compute stream runs
/// one operator at a time, each once its inputs are done; so does the link, where a
/// synchronous collective also holds the compute stream and an asynchronous one
/// ([`SchedOp::asynchronous`]) does not: it starts once its inputs are done and the link is
/// free, and the operators after it wait only if they read it. Without asynchronous
/// operators the operators run back to back. It is optimal for that execution model, so
/// both bounds are its makespan.
fn serial(prep: &Prepared, started: Instant) -> Schedule {
    let mut starts_s = Vec::with_capacity(prep.len());
    let mut ends_s: Vec<f64> = Vec::with_capacity(prep.len());
    let mut modes = Vec::with_capacity(prep.len());
    let mut compute_free_s = 0.0_f64;
    let mut link_free_s = 0.0_f64;
    for (i, op_modes) in prep.modes.iter().enumerate() {
        let (mode, fastest) = op_modes
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.duration_s.total_cmp(&b.1.duration_s))
            .expect("every operator has at least one mode");
        let inputs_done_s = prep.preds[i]
            .iter()
            .map(|&p| ends_s[p])
            .fold(0.0_f64, f64::max);
        let op = &prep.problem.ops[i];
        let on_link = op.core == CoreType::Link;
        let holds_compute = !(on_link && op.asynchronous);
        let mut start_s = inputs_done_s;
        if on_link {
            start_s = start_s.max(link_free_s);
        }
        if holds_compute {
            start_s = start_s.max(compute_free_s);
        }
        let end_s = start_s + fastest.duration_s;
        if on_link {
            link_free_s = end_s;
        }
        if holds_compute {
            compute_free_s = end_s;
        }
        starts_s.push(start_s);
        ends_s.push(end_s);
        modes.push(mode);
    }
    let plan = realise::assign(prep, starts_s, modes)
        .expect("operators that never overlap fit on any non-empty core set");
    realise::assemble(
        prep,
        &plan,
        plan.makespan_s,
        plan.makespan_s,
        SolveStatus::BoundsMet,
        started,
    )
}

/// [`schedule`] on input already validated.
fn solve_valid(problem: &ScheduleProblem, options: &SolverOptions) -> Schedule {
    let started = Instant::now();
    let prep = Prepared::new(problem);
    if problem.execution == KernelExecution::Serial {
        return serial(&prep, started);
    }
    let bound = bounds::lower_bound(&prep);
    let mut lower_bound_s = bound.makespan_s;
    // With the solver to follow, more passes until the gap is met: a better warm start.
    let enough_s = if options.use_ilp {
        lower_bound_s / (1.0 - options.relative_gap)
    } else {
        f64::INFINITY
    };
    let heuristic = list::best_list_schedule(&prep, bound.guide.as_ref(), enough_s);
    let upper_bound_s = heuristic.makespan_s;
    let finish = |plan: &realise::Realised, lower_bound_s: f64, status: SolveStatus| {
        realise::assemble(&prep, plan, lower_bound_s, upper_bound_s, status, started)
    };

    let heuristic_gap = relative_gap(upper_bound_s, lower_bound_s);
    if heuristic_gap <= SAME_MAKESPAN_REL {
        return finish(&heuristic, lower_bound_s, SolveStatus::BoundsMet);
    }
    if !options.use_ilp {
        return finish(&heuristic, lower_bound_s, SolveStatus::HeuristicOnly);
    }
    if heuristic_gap <= options.relative_gap {
        return finish(
            &heuristic,
            lower_bound_s,
            SolveStatus::WithinGap { gap: heuristic_gap },
        );
    }

    // Depth-first search for a schedule within the gap; each target it refutes raises the
    // lower bound, and the solver starts from there when the search gives up.
    match search_within_gap(&prep, &mut lower_bound_s, upper_bound_s, options, started) {
        Some(plan) => {
            let status = searched(plan.makespan_s, lower_bound_s);
            return finish(&plan, lower_bound_s, status);
        }
        None => {
            let gap = relative_gap(upper_bound_s, lower_bound_s);
            if gap <= options.relative_gap {
                return finish(&heuristic, lower_bound_s, SolveStatus::WithinGap { gap });
            }
        }
    }

    // The list schedule meets its own makespan, so propagation cannot refute it.
    let Some(windows) = bounds::windows(&prep, upper_bound_s) else {
        return finish(&heuristic, lower_bound_s, SolveStatus::HeuristicOnly);
    };
    // Core-assignment binaries per core type (tensor, vector); added only after a solution
    // without them needed more cores than exist.
    let mut assign_cores = [false; prepare::RESOURCES];
    loop {
        let remaining_s = options.time_limit_s - started.elapsed().as_secs_f64();
        if remaining_s <= 0.0 {
            let gap = relative_gap(upper_bound_s, lower_bound_s);
            return finish(&heuristic, lower_bound_s, SolveStatus::TimeLimit { gap });
        }
        let request = ilp::Request {
            warm_start: &heuristic,
            windows: &windows,
            lower_bound_s,
            assign_cores,
            time_limit_s: remaining_s,
            node_limit: options.node_limit,
            relative_gap: options.relative_gap,
        };
        let Ok(outcome) = ilp::solve(&prep, &request) else {
            return finish(&heuristic, lower_bound_s, SolveStatus::HeuristicOnly);
        };
        lower_bound_s = lower_bound_s.max(outcome.dual_bound_s);
        let Some((starts_s, modes)) = outcome.solution else {
            let gap = relative_gap(upper_bound_s, lower_bound_s);
            let status = if outcome.limit_hit {
                SolveStatus::TimeLimit { gap }
            } else {
                SolveStatus::HeuristicOnly
            };
            return finish(&heuristic, lower_bound_s, status);
        };
        match realise::from_solver(&prep, &starts_s, &modes) {
            Ok(plan) => {
                let best = if plan.makespan_s < heuristic.makespan_s {
                    &plan
                } else {
                    &heuristic
                };
                lower_bound_s = lower_bound_s.min(best.makespan_s);
                let gap = relative_gap(best.makespan_s, lower_bound_s);
                let status = if outcome.limit_hit {
                    SolveStatus::TimeLimit { gap }
                } else if gap <= SAME_MAKESPAN_REL {
                    SolveStatus::Optimal
                } else {
                    SolveStatus::WithinGap { gap }
                };
                return finish(best, lower_bound_s, status);
            }
            Err(over_capacity) => {
                let new_types: Vec<usize> = over_capacity
                    .into_iter()
                    .filter(|&r| !assign_cores[r])
                    .collect();
                if outcome.limit_hit {
                    let gap = relative_gap(upper_bound_s, lower_bound_s);
                    return finish(&heuristic, lower_bound_s, SolveStatus::TimeLimit { gap });
                }
                if new_types.is_empty() {
                    return finish(&heuristic, lower_bound_s, SolveStatus::HeuristicOnly);
                }
                for r in new_types {
                    assign_cores[r] = true;
                }
            }
        }
    }
}

/// Rounds of [`dfs::meet_target`], each asking for a schedule within `options.relative_gap`
/// of `lower_bound_s`; a refuted target becomes the new lower bound. Stops with a schedule, or
/// with `None` once a round is undecided (`options.search_node_limit` placements over all
/// rounds, or the time limit, spent) or the lower bound has come within the gap of
/// `upper_bound_s` (the list schedule suffices then), or a refutation did not raise it.
fn search_within_gap(
    prep: &Prepared,
    lower_bound_s: &mut f64,
    upper_bound_s: f64,
    options: &SolverOptions,
    started: Instant,
) -> Option<realise::Realised> {
    let mut budget = dfs::Budget {
        nodes: options.search_node_limit as usize,
        deadline: Some(started + std::time::Duration::from_secs_f64(options.time_limit_s)),
    };
    loop {
        let target_s = *lower_bound_s / (1.0 - options.relative_gap);
        if target_s >= upper_bound_s || budget.nodes == 0 {
            return None;
        }
        match dfs::meet_target(prep, target_s, &mut budget) {
            dfs::Outcome::Met(plan) => return Some(plan),
            // Refuting the bound itself (a zero gap, or one too small to move the target in
            // floating point) raises nothing: the next round would ask the same.
            dfs::Outcome::Refuted if target_s <= *lower_bound_s => return None,
            dfs::Outcome::Refuted => *lower_bound_s = target_s,
            dfs::Outcome::Undecided => return None,
        }
    }
}
