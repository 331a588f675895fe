//! Per-layer operator scheduling (docs/design.md §5): hand-derived instances, an exact brute
//! force on random small DAGs, bounds, validity, time limit, memoisation, input errors, Gantt
//! output.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use std::sync::Arc;
use tandem::arch::KernelExecution;
use tandem::schedule::{
    list_schedule, lower_bound, meet_makespan, render_gantt, schedule, verify, Assignment,
    CoreCounts, Feasibility, SchedOp, Schedule, ScheduleCache, ScheduleError, ScheduleProblem,
    SolveStatus, SolverOptions,
};
use tandem::workload::CoreType;

const US: f64 = 1e-6;

fn op(name: &str, core: CoreType, one_core_s: f64, all_cores_s: f64) -> SchedOp {
    SchedOp {
        name: name.to_string(),
        core,
        one_core_s,
        all_cores_s,
        one_core_energy_j: 1.0,
        all_cores_energy_j: 1.5,
        asynchronous: false,
    }
}

/// Operators `ops` with precedences `edges` on `tensor` tensor and `vector` vector cores that
/// may run at the same time.
fn concurrent(
    ops: Vec<SchedOp>,
    edges: Vec<(usize, usize)>,
    tensor: u32,
    vector: u32,
) -> ScheduleProblem {
    ScheduleProblem {
        execution: KernelExecution::Concurrent,
        ops,
        edges,
        cores: CoreCounts { tensor, vector },
    }
}

fn exact() -> SolverOptions {
    SolverOptions {
        time_limit_s: 30.0,
        node_limit: i32::MAX as u32,
        search_node_limit: SolverOptions::default().search_node_limit,
        relative_gap: 0.0,
        use_ilp: true,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs())
}

fn assert_sound(problem: &ScheduleProblem, s: &Schedule) {
    verify(problem, s).unwrap_or_else(|e| panic!("invalid schedule: {e}\n{s:#?}"));
    assert!(s.lower_bound_s <= s.makespan_s * (1.0 + 1e-9));
    assert!(s.makespan_s <= s.upper_bound_s * (1.0 + 1e-9));
}

// ---------------------------------------------------------------------------------------------
// Exact brute force.
//
// With the execution variant of every operator fixed, the problem is a resource-constrained
// project scheduling problem: resource "tensor" with `tensor` units, "vector" with `vector`
// units, "link" with 1; a one-core run needs 1 unit, an all-core run every unit of its type.
// (A schedule that never uses more units than exist has a concrete core assignment: one-core
// intervals form an interval graph, coloured greedily with as many colours as the most
// intervals that overlap.) For a regular objective such as the makespan, some optimal schedule
// is *active* (no operator can start earlier without delaying another), and the serial
// schedule-generation scheme, run over every precedence-feasible order, produces exactly the
// active schedules (Sprecher, Kolisch & Drexl 1995; Kolisch 1996). Enumerating every variant
// vector × every topological order and keeping the shortest result is therefore exact.

struct Brute<'a> {
    problem: &'a ScheduleProblem,
    preds: Vec<Vec<usize>>,
}

/// The exact schedule of `problem` is valid and `optimum_s` long, as brute force confirms.
fn assert_optimum(problem: &ScheduleProblem, optimum_s: f64) {
    assert!(close(Brute::optimum(problem), optimum_s));
    let s = schedule(problem, &exact()).unwrap();
    assert_sound(problem, &s);
    assert!(close(s.makespan_s, optimum_s), "{}", s.makespan_s);
}

fn capacity(problem: &ScheduleProblem, core: CoreType) -> u32 {
    problem.cores.of(core)
}

impl Brute<'_> {
    fn duration_demand(&self, i: usize, parallel: bool) -> (f64, u32) {
        let o = &self.problem.ops[i];
        if parallel {
            (o.all_cores_s, capacity(self.problem, o.core))
        } else {
            (o.one_core_s, 1)
        }
    }

    /// Serial schedule generation for one order and variant vector.
    fn serial(&self, order: &[usize], parallel: &[bool]) -> f64 {
        let n = self.problem.ops.len();
        let mut start = vec![0.0; n];
        let mut end = vec![0.0; n];
        let mut placed: Vec<usize> = Vec::new();
        for &j in order {
            let (dur, demand) = self.duration_demand(j, parallel[j]);
            let core = self.problem.ops[j].core;
            let cap = capacity(self.problem, core);
            let ready = self.preds[j].iter().map(|&p| end[p]).fold(0.0, f64::max);
            let same: Vec<usize> = placed
                .iter()
                .copied()
                .filter(|&k| self.problem.ops[k].core == core)
                .collect();
            let mut candidates: Vec<f64> = std::iter::once(ready)
                .chain(same.iter().map(|&k| end[k]).filter(|&e| e >= ready))
                .collect();
            candidates.sort_by(f64::total_cmp);
            let usage = |tau: f64| -> u32 {
                same.iter()
                    .filter(|&&k| start[k] <= tau && tau < end[k])
                    .map(|&k| self.duration_demand(k, parallel[k]).1)
                    .sum()
            };
            let fits = |t: f64| {
                dur <= 0.0
                    || std::iter::once(t)
                        .chain(
                            same.iter()
                                .map(|&k| start[k])
                                .filter(|&s| t < s && s < t + dur),
                        )
                        .all(|tau| usage(tau) + demand <= cap)
            };
            let t = candidates
                .into_iter()
                .find(|&t| fits(t))
                .expect("the last end time always fits");
            start[j] = t;
            end[j] = t + dur;
            placed.push(j);
        }
        end.into_iter().fold(0.0, f64::max)
    }

    fn orders(&self, prefix: &mut Vec<usize>, done: &mut Vec<bool>, out: &mut Vec<Vec<usize>>) {
        let n = self.problem.ops.len();
        if prefix.len() == n {
            out.push(prefix.clone());
            return;
        }
        for j in 0..n {
            if !done[j] && self.preds[j].iter().all(|&p| done[p]) {
                done[j] = true;
                prefix.push(j);
                self.orders(prefix, done, out);
                prefix.pop();
                done[j] = false;
            }
        }
    }

    fn optimum(problem: &ScheduleProblem) -> f64 {
        let n = problem.ops.len();
        let mut preds = vec![Vec::new(); n];
        for &(a, b) in &problem.edges {
            preds[b].push(a);
        }
        let brute = Brute { problem, preds };
        let mut orders = Vec::new();
        brute.orders(&mut Vec::new(), &mut vec![false; n], &mut orders);
        // Variants: the link has only one; elsewhere both are tried.
        let choosable: Vec<usize> = (0..n)
            .filter(|&i| problem.ops[i].core != CoreType::Link)
            .collect();
        let mut best = f64::INFINITY;
        for mask in 0..1u32 << choosable.len() {
            let mut parallel = vec![false; n];
            for (bit, &i) in choosable.iter().enumerate() {
                parallel[i] = mask >> bit & 1 == 1;
            }
            for order in &orders {
                best = best.min(brute.serial(order, &parallel));
            }
        }
        best
    }
}

fn random_problem() -> impl Strategy<Value = ScheduleProblem> {
    (1usize..=7, 1u32..=3, 1u32..=3).prop_flat_map(|(n, tensor, vector)| {
        let ops = prop::collection::vec((0u8..5, 1u32..=12, 2u32..=14), n);
        let edges = prop::collection::vec(prop::bool::weighted(0.3), n * (n - 1) / 2);
        (ops, edges).prop_map(move |(ops, edge_bits)| {
            let ops: Vec<SchedOp> = ops
                .into_iter()
                .enumerate()
                .map(|(i, (kind, one, all_tenths))| {
                    // Two tensor, two vector, one link in five; the all-core variant between
                    // 0.2× and 1.4× the one-core latency, so both variants matter.
                    let core = match kind {
                        0 | 1 => CoreType::Tensor,
                        2 | 3 => CoreType::Vector,
                        _ => CoreType::Link,
                    };
                    let one_core_s = f64::from(one) * US;
                    SchedOp {
                        name: format!("op{i}"),
                        core,
                        one_core_s,
                        all_cores_s: one_core_s * f64::from(all_tenths) / 10.0,
                        one_core_energy_j: f64::from(one),
                        all_cores_energy_j: f64::from(one) * 1.2,
                        asynchronous: false,
                    }
                })
                .collect();
            let mut edges = Vec::new();
            let mut k = 0;
            for i in 0..n {
                for j in i + 1..n {
                    if edge_bits[k] {
                        edges.push((i, j));
                    }
                    k += 1;
                }
            }
            concurrent(ops, edges, tensor, vector)
        })
    })
}

proptest! {
    #![proptest_config(Config {
        cases: 300,
        rng_seed: RngSeed::Fixed(0x5EED),
        failure_persistence: None,
        ..Config::default()
    })]

    /// The solver's makespan equals the brute-force optimum; bounds bracket it; the schedule
    /// is valid.
    #[test]
    fn ilp_matches_brute_force(problem in random_problem()) {
        let optimum = Brute::optimum(&problem);
        let s = schedule(&problem, &exact()).unwrap();
        assert_sound(&problem, &s);
        prop_assert!(
            matches!(s.status, SolveStatus::BoundsMet | SolveStatus::Optimal),
            "status {}", s.status
        );
        prop_assert!(close(s.makespan_s, optimum), "ilp {} brute {}", s.makespan_s, optimum);
        let lb = lower_bound(&problem).unwrap();
        prop_assert!(lb <= optimum * (1.0 + 1e-9), "lower bound {lb} above optimum {optimum}");
        let heuristic = list_schedule(&problem).unwrap();
        assert_sound(&problem, &heuristic);
        prop_assert!(heuristic.makespan_s >= optimum * (1.0 - 1e-9));
        // The solver starts from the list schedule or, after more randomised passes, a
        // shorter one.
        prop_assert!(s.upper_bound_s <= heuristic.makespan_s * (1.0 + 1e-9));
        prop_assert!(s.upper_bound_s >= optimum * (1.0 - 1e-9));
    }

    /// The depth-first search, run to the end, meets the optimum and refutes anything
    /// shorter: every cut it makes is sound and it misses no schedule.
    #[test]
    fn search_meets_the_optimum_and_refutes_below(problem in random_problem()) {
        let optimum = Brute::optimum(&problem);
        match meet_makespan(&problem, optimum * (1.0 + 1e-7), u32::MAX).unwrap() {
            Feasibility::Met(s) => {
                assert_sound(&problem, &s);
                prop_assert!(s.makespan_s <= optimum * (1.0 + 1e-7), "{} vs {optimum}", s.makespan_s);
            }
            other => prop_assert!(false, "optimum {optimum} not met: {other:?}"),
        }
        let below = meet_makespan(&problem, optimum * (1.0 - 1e-6), u32::MAX).unwrap();
        prop_assert_eq!(below, Feasibility::Infeasible);
    }

    /// With a gap to meet, the depth-first search meets it or hands over to the solver, and
    /// the targets it refutes never raise the lower bound past the optimum (on this seed 26
    /// of the 300 problems end with a bound the search raised).
    #[test]
    fn search_keeps_the_gap_and_a_sound_bound(problem in random_problem()) {
        let optimum = Brute::optimum(&problem);
        let options = SolverOptions { relative_gap: 0.01, ..exact() };
        let s = schedule(&problem, &options).unwrap();
        assert_sound(&problem, &s);
        prop_assert!(
            s.lower_bound_s <= optimum * (1.0 + 1e-9),
            "bound {} above optimum {optimum}", s.lower_bound_s
        );
        prop_assert!(s.makespan_s >= optimum * (1.0 - 1e-9));
        prop_assert!(s.gap() <= 0.01 + 1e-9, "status {}", s.status);
    }
}

/// Two tensor cores: a (one core only, 5 µs) feeds b (vector, 1 µs or 0.2 µs on all three
/// cores); c (tensor, 9 µs on one core or 1.8 µs on both) is free. Best: a 0–5, then b and c on
/// all their cores from 5: 6.8 µs (c first on both cores pushes a and b to 7 µs; c on one
/// core alone takes 9). In start order b (index 1) is placed at 5 µs before c, and c, which
/// would fit on one core from 0 µs but run past that clock, must survive the left-shift cut.
#[test]
fn search_spares_operators_that_would_run_past_the_clock() {
    let problem = concurrent(
        vec![
            op("a", CoreType::Tensor, 5.0 * US, 5.0 * US),
            op("b", CoreType::Vector, 1.0 * US, 0.2 * US),
            op("c", CoreType::Tensor, 9.0 * US, 1.8 * US),
        ],
        vec![(0, 1)],
        2,
        3,
    );
    let Feasibility::Met(s) = meet_makespan(&problem, 6.8 * US, u32::MAX).unwrap() else {
        panic!("6.8 µs not met");
    };
    assert_sound(&problem, &s);
    assert!(close(s.makespan_s, 6.8 * US), "{}", s.makespan_s);
    assert_eq!(s.ops[2].assignment, Assignment::AllCores);
    assert_eq!(
        meet_makespan(&problem, 6.79 * US, u32::MAX).unwrap(),
        Feasibility::Infeasible
    );
}

/// A chain of 600 operators is past what the search takes on (one stack frame per operator):
/// it answers undecided, and `schedule` still closes the chain by its bounds.
#[test]
fn search_leaves_problems_of_many_operators_undecided() {
    let ops: Vec<SchedOp> = (0..600)
        .map(|i| op(&format!("v{i}"), CoreType::Vector, 2.0 * US, 1.0 * US))
        .collect();
    let edges = (1..600).map(|i| (i - 1, i)).collect();
    let problem = concurrent(ops, edges, 1, 2);
    assert_eq!(
        meet_makespan(&problem, 600.0 * US, u32::MAX).unwrap(),
        Feasibility::Undecided
    );
    assert_eq!(
        meet_makespan(&problem, 599.0 * US, u32::MAX).unwrap(),
        Feasibility::Infeasible
    );
    let s = schedule(&problem, &exact()).unwrap();
    assert!(close(s.makespan_s, 600.0 * US), "{}", s.makespan_s);
    assert_eq!(s.status, SolveStatus::BoundsMet);
}

/// The three GEMMs of [`mixed_variants_beat_uniform_ones`]: the list schedule finds the
/// optimum, 6.5 µs, over the lower bound of 6 µs (gap 7.7 %). Asked for 5 %, the search
/// refutes 6 / 0.95 = 6.316 µs (two GEMMs on one core each and the third on both is the
/// shortest mix), which brings the list schedule within the gap: 1 − 6.316 / 6.5 = 2.8 %.
#[test]
fn search_refutes_targets_to_raise_the_lower_bound() {
    let problem = three_on_two(2.5);
    let options = SolverOptions {
        relative_gap: 0.05,
        ..exact()
    };
    let s = schedule(&problem, &options).unwrap();
    assert_sound(&problem, &s);
    assert!(close(s.makespan_s, 6.5 * US), "{}", s.makespan_s);
    assert!(
        close(s.lower_bound_s, 6.0 / 0.95 * US),
        "{}",
        s.lower_bound_s
    );
    match s.status {
        SolveStatus::WithinGap { gap } => assert!(close(gap, 1.0 - 6.0 / (0.95 * 6.5)), "{gap}"),
        other => panic!("status {other}"),
    }
}

/// A GPT-3 175B backward block on a PHAZE-space chip with 2 tensor and 16 vector cores,
/// written out by the full-space sweep. The ILP alone stops at its 500-node limit more than
/// 5 % from its bound; the depth-first search refutes targets up from the propagation bound
/// and then finds a schedule within 1 % of the last one refuted, over 5 % shorter.
#[test]
fn search_closes_a_gap_the_node_limited_ilp_leaves_open() {
    let text = std::fs::read_to_string("tests/data/gpt3-bwd-block-tc2-vc16.json").unwrap();
    let problem: ScheduleProblem = serde_json::from_str(&text).unwrap();
    let searched = schedule(&problem, &SolverOptions::default()).unwrap();
    assert_sound(&problem, &searched);
    let SolveStatus::Searched { gap } = searched.status else {
        panic!("status {}", searched.status);
    };
    assert!(gap <= 0.01, "{gap}");
    assert!(searched.lower_bound_s > lower_bound(&problem).unwrap() * 1.05);

    let ilp_only = SolverOptions {
        search_node_limit: 0,
        ..SolverOptions::default()
    };
    let solved = schedule(&problem, &ilp_only).unwrap();
    assert_sound(&problem, &solved);
    let SolveStatus::TimeLimit { gap } = solved.status else {
        panic!("status {}", solved.status);
    };
    assert!(gap > 0.05, "{gap}");
    assert!(solved.makespan_s > searched.makespan_s * 1.05);
}

/// The brute force itself on a hand-solved case (three independent ops, two cores, below).
#[test]
fn brute_force_reproduces_hand_optimum() {
    assert!(close(Brute::optimum(&three_on_two(2.5)), 6.5 * US));
    assert!(close(Brute::optimum(&three_on_two(3.9)), 7.9 * US));
}

// ---------------------------------------------------------------------------------------------
// Hand-derived instances.

/// A chain needs no solver: makespan = Σ min(one-core, all-core).
#[test]
fn chain_is_sum_of_fastest_variants_without_solver() {
    let problem = concurrent(
        vec![
            op("ln", CoreType::Vector, 3.0 * US, 1.0 * US),
            op("qkv", CoreType::Tensor, 40.0 * US, 12.0 * US),
            op("softmax", CoreType::Vector, 2.0 * US, 2.5 * US),
            op("allreduce", CoreType::Link, 7.0 * US, 1.0 * US),
            op("proj", CoreType::Tensor, 10.0 * US, 11.0 * US),
        ],
        vec![(0, 1), (1, 2), (2, 3), (3, 4)],
        4,
        2,
    );
    let s = schedule(&problem, &exact()).unwrap();
    assert_sound(&problem, &s);
    // 1 + 12 + 2 + 7 (link: one-core only) + 10.
    assert!(close(s.makespan_s, 32.0 * US), "{}", s.makespan_s);
    assert_eq!(s.status, SolveStatus::BoundsMet);
    assert_eq!(s.status.to_string(), "bounds");
    let assignments: Vec<Assignment> = s.ops.iter().map(|o| o.assignment).collect();
    assert_eq!(
        assignments,
        [
            Assignment::AllCores,
            Assignment::AllCores,
            Assignment::Core(0),
            Assignment::Core(0),
            Assignment::Core(0)
        ]
    );
    // 1.5 + 1.5 + 1 + 1 + 1 J.
    assert!(close(s.energy_j, 6.0));
}

/// Three independent GEMMs on two tensor cores, one core 4 µs, all cores `all_us`.
fn three_on_two(all_us: f64) -> ScheduleProblem {
    let gemms = (0..3)
        .map(|i| op(&format!("g{i}"), CoreType::Tensor, 4.0 * US, all_us * US))
        .collect();
    concurrent(gemms, vec![], 2, 1)
}

/// Two GEMMs on one core each (0–4 µs), the third on both (4–6.5 µs): 6.5 µs. The lower bound
/// is work / cores = (4 + 4 + 4) / 2 = 6 µs, so the solver must close the gap.
#[test]
fn mixed_variants_beat_uniform_ones() {
    let problem = three_on_two(2.5);
    assert!(close(lower_bound(&problem).unwrap(), 6.0 * US));
    let s = schedule(&problem, &exact()).unwrap();
    assert_sound(&problem, &s);
    assert!(close(s.makespan_s, 6.5 * US), "{}", s.makespan_s);
    assert!(matches!(s.status, SolveStatus::Optimal), "{}", s.status);
    assert!(close(s.lower_bound_s, 6.5 * US));
    let parallel = s
        .ops
        .iter()
        .filter(|o| o.assignment == Assignment::AllCores)
        .count();
    assert_eq!(parallel, 1);
    // Energy 1 + 1 + 1.5 J; both cores busy throughout: (4 + 4 + 2 × 2.5) / (2 × 6.5) = 1.
    assert!(close(s.energy_j, 3.5));
    assert!(close(s.utilisation.tensor, 1.0));
    assert_eq!(s.utilisation.vector, 0.0);
}

/// All-core 3.9 µs: without core assignment the model would run three one-core GEMMs at once
/// (makespan 6 µs = the lower bound); with it, 4 + 3.9 = 7.9 µs.
#[test]
fn core_assignment_added_when_relaxation_overbooks() {
    let problem = three_on_two(3.9);
    let s = schedule(&problem, &exact()).unwrap();
    assert_sound(&problem, &s);
    assert!(close(s.makespan_s, 7.9 * US), "{}", s.makespan_s);
    assert!(matches!(s.status, SolveStatus::Optimal), "{}", s.status);
}

/// A GPU runs one kernel at a time: the three independent GEMMs that overlap on a dataflow
/// chip (6.5 µs above) run back to back, each in its faster variant (2.5 µs on both cores),
/// and a collective no longer hides behind them: 3 × 2.5 + 3 = 10.5 µs, bounds closed.
#[test]
fn serial_execution_runs_operators_back_to_back() {
    let mut problem = three_on_two(2.5);
    problem.execution = KernelExecution::Serial;
    problem
        .ops
        .push(op("ar", CoreType::Link, 3.0 * US, 3.0 * US));
    let s = schedule(&problem, &exact()).unwrap();
    assert_sound(&problem, &s);
    assert!(close(s.makespan_s, 10.5 * US), "{}", s.makespan_s);
    assert!(matches!(s.status, SolveStatus::BoundsMet), "{}", s.status);
    assert!(close(s.lower_bound_s, s.makespan_s));
    let mut intervals: Vec<(f64, f64)> = s.ops.iter().map(|o| (o.start_s, o.end_s)).collect();
    intervals.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in intervals.windows(2) {
        assert!(pair[0].1 <= pair[1].0 * (1.0 + 1e-12), "overlap: {pair:?}");
    }
    assert!(s.ops[..3]
        .iter()
        .all(|o| o.assignment == Assignment::AllCores));
}

/// A GPU's asynchronous collective (Megatron-LM's input-gradient all-reduce beside the weight
/// gradient) runs on the link while the compute stream goes on; what reads it waits. dgrad
/// (2 µs), then the all-reduce (3 µs, from 2 µs) beside wgrad (1 µs) and a bias sum (0.5
/// µs); the norm's backward (1 µs) reads the all-reduce: 2 + 3 + 1 = 6 µs, where blocking it
/// is 2 + 1 + 0.5 + 3 + 1 = 7.5 µs. A second asynchronous collective waits for the link: its
/// 2 µs start at 5 µs, and the last kernel, which reads it, ends at 8 µs. Bounds closed. The
/// first collective runs 1.5 µs beside the compute stream (wgrad and the bias sum), which is
/// what hiding none of the overlap adds back (6 + 1.5 = the blocking 7.5 µs); the second 1 µs
/// (the norm's backward); none on a chip whose link runs beside its cores.
#[test]
fn serial_execution_overlaps_asynchronous_collectives() {
    let ops = |asynchronous: bool| {
        vec![
            op("dgrad", CoreType::Tensor, 2.0 * US, 2.0 * US),
            op("wgrad", CoreType::Tensor, 1.0 * US, 1.0 * US),
            op("bias_grad", CoreType::Vector, 0.5 * US, 0.5 * US),
            SchedOp {
                asynchronous,
                ..op("ar", CoreType::Link, 3.0 * US, 3.0 * US)
            },
            op("ln_bwd", CoreType::Vector, 1.0 * US, 1.0 * US),
        ]
    };
    let edges = vec![(0, 1), (0, 2), (0, 3), (3, 4)];
    let serial = |ops: Vec<SchedOp>, edges: Vec<(usize, usize)>| ScheduleProblem {
        execution: KernelExecution::Serial,
        ..concurrent(ops, edges, 2, 2)
    };
    for (asynchronous, makespan_us, overlap_us) in [(true, 6.0, 1.5), (false, 7.5, 0.0)] {
        let problem = serial(ops(asynchronous), edges.clone());
        let s = schedule(&problem, &exact()).unwrap();
        assert_sound(&problem, &s);
        assert!(close(s.makespan_s, makespan_us * US), "{}", s.makespan_s);
        assert!(close(lower_bound(&problem).unwrap(), s.makespan_s));
        assert!(matches!(s.status, SolveStatus::BoundsMet), "{}", s.status);
        assert!(close(s.async_overlap_s(&problem), overlap_us * US));
        assert!(close(s.makespan_s + s.async_overlap_s(&problem), 7.5 * US));
    }
    let side_by_side = concurrent(ops(true), edges.clone(), 2, 2);
    let s = schedule(&side_by_side, &exact()).unwrap();
    assert_eq!(s.async_overlap_s(&side_by_side), 0.0);
    let mut two = ops(true);
    two.push(SchedOp {
        asynchronous: true,
        ..op("ar2", CoreType::Link, 2.0 * US, 2.0 * US)
    });
    two.push(op("last", CoreType::Vector, 1.0 * US, 1.0 * US));
    let problem = serial(two, vec![(0, 1), (0, 2), (0, 3), (3, 4), (2, 5), (5, 6)]);
    let s = list_schedule(&problem).unwrap();
    assert_sound(&problem, &s);
    assert!(close(s.ops[5].start_s, 5.0 * US), "{}", s.ops[5].start_s);
    assert!(close(s.makespan_s, 8.0 * US), "{}", s.makespan_s);
    assert!(close(s.async_overlap_s(&problem), 2.5 * US));
}

/// Two collectives share the one link; a GEMM overlaps them: 3 + 2 = 5 µs.
#[test]
fn link_runs_one_collective_at_a_time() {
    let problem = concurrent(
        vec![
            op("ar0", CoreType::Link, 3.0 * US, 1.0 * US),
            op("ar1", CoreType::Link, 2.0 * US, 1.0 * US),
            op("gemm", CoreType::Tensor, 4.0 * US, 4.0 * US),
        ],
        vec![],
        1,
        1,
    );
    let s = schedule(&problem, &exact()).unwrap();
    assert_sound(&problem, &s);
    assert!(close(s.makespan_s, 5.0 * US));
    assert!(close(s.utilisation.link, 1.0));
    assert!(close(s.utilisation.tensor, 0.8));
}

/// Two independent GEMMs on 8 tensor cores: 8 µs on one core, 2 µs on all eight. Work alone
/// (8 core-µs each over 8 cores) gives 2 µs, but at most 2 operators ever run at once, so a
/// one-core run holds at least half the array: each costs min(2, 8 / 2) = 2 µs of the
/// array's time, 4 µs in all — both all-core runs back to back, the optimum.
#[test]
fn lower_bound_caps_concurrency_at_the_graph_width() {
    let problem = concurrent(
        vec![
            op("x", CoreType::Tensor, 8.0 * US, 2.0 * US),
            op("y", CoreType::Tensor, 8.0 * US, 2.0 * US),
        ],
        vec![],
        8,
        1,
    );
    assert!(close(lower_bound(&problem).unwrap(), 4.0 * US));
    assert_optimum(&problem, 4.0 * US);
    // A chain of the two is one wide: the same 4 µs, now also the critical path.
    let chain = ScheduleProblem {
        edges: vec![(0, 1)],
        ..problem
    };
    assert!(close(lower_bound(&chain).unwrap(), 4.0 * US));
}

/// GEMMs y and z (3 µs each on the one tensor core) need p's 5 µs of vector work before and
/// q's 5 µs after; x (1 µs) is free. Critical path 5 + 3 + 5 = 13 µs; the tensor core's work
/// over the whole layer is only 7 µs, but y and z cannot start before 5 µs and leave 5 µs to
/// go: 5 + 3 + 3 + 5 = 16 µs, the optimum.
#[test]
fn lower_bound_counts_the_idle_time_precedence_forces_on_a_resource() {
    let problem = concurrent(
        vec![
            op("p", CoreType::Vector, 5.0 * US, 5.0 * US),
            op("y", CoreType::Tensor, 3.0 * US, 3.0 * US),
            op("z", CoreType::Tensor, 3.0 * US, 3.0 * US),
            op("q", CoreType::Vector, 5.0 * US, 5.0 * US),
            op("x", CoreType::Tensor, 1.0 * US, 1.0 * US),
        ],
        vec![(0, 1), (0, 2), (1, 3), (2, 3)],
        1,
        1,
    );
    assert!(close(lower_bound(&problem).unwrap(), 16.0 * US));
    assert_optimum(&problem, 16.0 * US);
}

/// One tensor core; GEMM a (10 µs) has 2 µs of vector work after it, GEMM b (1 µs) needs 3 µs
/// before and 10 µs after. With preemption a would yield to b at 3 µs: 3 + 1 + 10 = 14 µs,
/// the critical path too. Neither GEMM can be split: a first ends b at 11 (21 µs), b first
/// keeps a from starting before 4 (4 + 10 + 2 = 16 µs). Edge finding sees the second: for a
/// makespan below 16, b must precede a, which then ends too late.
#[test]
fn lower_bound_knows_operators_cannot_be_preempted() {
    let problem = concurrent(
        vec![
            op("a", CoreType::Tensor, 10.0 * US, 10.0 * US),
            op("r", CoreType::Vector, 2.0 * US, 2.0 * US),
            op("p", CoreType::Vector, 3.0 * US, 3.0 * US),
            op("b", CoreType::Tensor, 1.0 * US, 1.0 * US),
            op("q", CoreType::Vector, 10.0 * US, 10.0 * US),
        ],
        vec![(0, 1), (2, 3), (3, 4)],
        1,
        3,
    );
    let lb = lower_bound(&problem).unwrap();
    assert!(
        (16.0 * US * (1.0 - 1e-3)..=16.0 * US).contains(&lb),
        "lower bound {lb}"
    );
    assert_optimum(&problem, 16.0 * US);
    // A gap too small to move a target in floating point: the search's first target is the
    // refuted bound itself, and refuting it again must end the rounds rather than repeat them.
    let tiny_gap = SolverOptions {
        relative_gap: 1e-17,
        ..exact()
    };
    let s = schedule(&problem, &tiny_gap).unwrap();
    assert_sound(&problem, &s);
    assert!(close(s.makespan_s, 16.0 * US), "{}", s.makespan_s);
}

/// Critical path 2 + 3 = 5 µs vs vector work (2 + 6 + 6) / 2 = 7 µs.
#[test]
fn lower_bound_is_max_of_path_and_work() {
    let problem = concurrent(
        vec![
            op("a", CoreType::Vector, 2.0 * US, 2.0 * US),
            op("b", CoreType::Vector, 3.0 * US, 3.0 * US),
            op("c", CoreType::Vector, 6.0 * US, 6.0 * US),
            op("d", CoreType::Vector, 3.0 * US, 3.0 * US),
        ],
        vec![(0, 1)],
        1,
        2,
    );
    assert!(close(lower_bound(&problem).unwrap(), 7.0 * US));
    // c alone on one core (6), a→b and d on the other (2 + 3 + 3 = 8): 8 µs optimal.
    assert_optimum(&problem, 8.0 * US);
}

#[test]
fn heuristic_only_when_ilp_disabled() {
    let problem = three_on_two(3.9);
    let options = SolverOptions {
        use_ilp: false,
        ..exact()
    };
    let s = schedule(&problem, &options).unwrap();
    assert_sound(&problem, &s);
    assert_eq!(s.status, SolveStatus::HeuristicOnly);
    assert_eq!(s.status.to_string(), "heuristic");
    assert_eq!(s.makespan_s, s.upper_bound_s);
}

/// A gap already within tolerance skips the solver and says how close it is.
#[test]
fn heuristic_within_requested_gap_skips_solver() {
    let problem = three_on_two(2.5);
    let options = SolverOptions {
        relative_gap: 0.1,
        ..exact()
    };
    let s = schedule(&problem, &options).unwrap();
    assert_sound(&problem, &s);
    // 6.5 found, 6 proven: gap 1/13.
    assert!(close(s.makespan_s, 6.5 * US));
    match s.status {
        SolveStatus::WithinGap { gap } => assert!(close(gap, 0.5 / 6.5)),
        other => panic!("status {other}"),
    }
    assert_eq!(s.status.to_string(), "gap:7.7%");
}

// ---------------------------------------------------------------------------------------------
// Work limits.

/// Sixteen independent GEMMs with varied latencies on three cores: far too many orderings to
/// prove optimal within one branch-and-bound node. The work limits stop the solver (the clock
/// never does: its limit is far away), and the best schedule found comes back, valid, marked
/// with its gap.
#[test]
fn work_limit_returns_best_found_and_says_so() {
    let ops: Vec<SchedOp> = (0..16)
        .map(|i| {
            let one = 5.0 + f64::from((i * 37) % 23);
            op(
                &format!("g{i}"),
                CoreType::Tensor,
                one * US,
                one * 0.37 * US,
            )
        })
        .collect();
    let problem = concurrent(ops, vec![], 3, 1);
    let options = SolverOptions {
        node_limit: 1,
        search_node_limit: 0,
        relative_gap: 0.0,
        ..exact()
    };
    let s = schedule(&problem, &options).unwrap();
    assert_sound(&problem, &s);
    let SolveStatus::TimeLimit { gap } = s.status else {
        panic!("status {}", s.status);
    };
    assert!(gap > 0.0 && close(gap, s.gap()), "{gap} vs {}", s.gap());
    assert!(s.status.to_string().starts_with("time-limit:"));
}

#[test]
fn status_display_is_csv_friendly() {
    assert_eq!(SolveStatus::Optimal.to_string(), "optimal");
    assert_eq!(
        SolveStatus::WithinGap { gap: 0.008 }.to_string(),
        "gap:0.8%"
    );
    assert_eq!(
        SolveStatus::TimeLimit { gap: 0.031 }.to_string(),
        "time-limit:3.1%"
    );
}

// ---------------------------------------------------------------------------------------------
// Memoisation.

#[test]
fn cache_reuses_per_signature_and_core_configuration() {
    let cache = ScheduleCache::new(exact()).unwrap();
    let problem = three_on_two(2.5);
    let first = cache
        .get_or_compute("block/fwd", "chip-a", &problem)
        .unwrap();
    let again = cache
        .get_or_compute("block/fwd", "chip-a", &problem)
        .unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    assert_eq!(cache.len(), 1);

    let mut more_cores = problem.clone();
    more_cores.cores.tensor = 3;
    let wider = cache
        .get_or_compute("block/fwd", "chip-a", &more_cores)
        .unwrap();
    // Three cores: every GEMM on its own core, 4 µs.
    assert!(close(wider.makespan_s, 4.0 * US));
    cache
        .get_or_compute("block/fwd", "chip-b", &problem)
        .unwrap();
    assert_eq!(cache.len(), 3);

    // Many threads asking for one key get the one result.
    let results: Vec<Arc<Schedule>> = (0..8)
        .map(|_| {
            let cache = &cache;
            let problem = &problem;
            std::thread::scope(|scope| {
                scope
                    .spawn(move || {
                        cache
                            .get_or_compute("block/bwd", "chip-a", problem)
                            .unwrap()
                    })
                    .join()
                    .unwrap()
            })
        })
        .collect();
    assert!(results.iter().all(|r| Arc::ptr_eq(r, &results[0])));
    assert_eq!(cache.len(), 4);
}

/// Independent solves on several threads at once (the search runs them under rayon).
#[test]
fn concurrent_solves_agree_with_sequential() {
    let problems: Vec<ScheduleProblem> = [2.5, 3.9, 2.5, 3.9, 2.5, 3.9]
        .iter()
        .map(|&a| three_on_two(a))
        .collect();
    let makespans: Vec<f64> = std::thread::scope(|scope| {
        let handles: Vec<_> = problems
            .iter()
            .map(|p| scope.spawn(move || schedule(p, &exact()).unwrap().makespan_s))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (p, m) in problems.iter().zip(makespans) {
        assert!(close(m, schedule(p, &exact()).unwrap().makespan_s));
    }
}

// ---------------------------------------------------------------------------------------------
// Bad input.

fn field_of(e: ScheduleError) -> String {
    match e {
        ScheduleError::InvalidProblem { field, .. }
        | ScheduleError::InvalidOptions { field, .. } => field,
        ScheduleError::Render { reason, .. } => reason,
    }
}

#[test]
fn invalid_problems_are_errors_naming_the_field() {
    let base = three_on_two(2.5);
    let mut out_of_range = base.clone();
    out_of_range.edges.push((1, 9));
    let mut backwards = base.clone();
    backwards.edges.push((2, 1));
    let mut nan = base.clone();
    nan.ops[1].all_cores_s = f64::NAN;
    let mut negative = base.clone();
    negative.ops[2].one_core_energy_j = -1.0;
    let mut no_cores = base.clone();
    no_cores.cores.tensor = 0;
    let cases = [
        (out_of_range, "edges[0]"),
        (backwards, "edges[0]"),
        (nan, "ops[1].all_cores_s"),
        (negative, "ops[2].one_core_energy_j"),
        (no_cores, "ops[0].core"),
    ];
    for (problem, field) in cases {
        let e = schedule(&problem, &exact()).unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(field_of(e), field);
        assert!(lower_bound(&problem).is_err());
        assert!(list_schedule(&problem).is_err());
    }
    let cache = ScheduleCache::new(exact()).unwrap();
    let mut bad = base.clone();
    bad.edges.push((0, 0));
    assert!(cache.get_or_compute("x", "y", &bad).is_err());
    assert!(cache.is_empty());
}

#[test]
fn invalid_options_are_errors_naming_the_field() {
    let problem = three_on_two(2.5);
    for (options, field) in [
        (
            SolverOptions {
                time_limit_s: 0.0,
                ..exact()
            },
            "time_limit_s",
        ),
        (
            SolverOptions {
                relative_gap: f64::NAN,
                ..exact()
            },
            "relative_gap",
        ),
        (
            SolverOptions {
                node_limit: 0,
                ..exact()
            },
            "node_limit",
        ),
    ] {
        let e = schedule(&problem, &options).unwrap_err();
        assert_eq!(field_of(e), field);
        assert!(ScheduleCache::new(options).is_err());
    }
}

#[test]
fn empty_problem_has_zero_makespan() {
    let problem = concurrent(vec![], vec![], 0, 0);
    let s = schedule(&problem, &exact()).unwrap();
    assert_sound(&problem, &s);
    assert_eq!(s.makespan_s, 0.0);
    assert_eq!(s.status, SolveStatus::BoundsMet);
}

#[test]
fn verify_rejects_broken_schedules() {
    let problem = three_on_two(2.5);
    let good = schedule(&problem, &exact()).unwrap();
    let mut overlap = good.clone();
    // Put every GEMM on core 0 at its original time: two one-core runs now collide.
    for o in &mut overlap.ops {
        if let Assignment::Core(_) = o.assignment {
            o.assignment = Assignment::Core(0);
        }
    }
    assert!(verify(&problem, &overlap).unwrap_err().contains("overlap"));
    let mut missing_core = good.clone();
    missing_core.ops[0].assignment = Assignment::Core(5);
    assert!(verify(&problem, &missing_core).is_err());
    // Two GEMMs run side by side in the optimum; an edge between them is violated.
    let side_by_side = (0..3)
        .flat_map(|i| (i + 1..3).map(move |j| (i, j)))
        .find(|&(i, j)| {
            let (a, b) = (&good.ops[i], &good.ops[j]);
            a.start_s < b.end_s && b.start_s < a.end_s
        })
        .expect("6.5 µs needs two GEMMs at once");
    let mut chain = problem.clone();
    chain.edges.push(side_by_side);
    assert!(verify(&chain, &good).is_err());
}

// ---------------------------------------------------------------------------------------------
// Gantt chart.

#[test]
fn gantt_has_a_row_per_core_and_labelled_bars() {
    let problem = three_on_two(2.5);
    let s = schedule(&problem, &exact()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("gantt.svg");
    render_gantt(&s, &problem, "g forward", &path).unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"));
    let title = format!("g forward: makespan {:.2} µs", s.makespan_s * 1e6);
    assert!(svg.contains(&title), "{title}");
    assert!(svg.contains("time (µs)"), "axis unit");
    for label in ["tensor 0", "tensor 1", "vector 0", "link", "g0", "g1", "g2"] {
        assert!(svg.contains(label), "missing {label}");
    }

    let mut other = problem.clone();
    other.ops.pop();
    let refused = tmp.path().join("refused.svg");
    let e = render_gantt(&s, &other, "g forward", &refused).unwrap_err();
    assert!(matches!(e, ScheduleError::Render { .. }), "{e}");
    assert!(!refused.exists());
}
