//! Derived facts every stage of the scheduler shares: execution modes per operator,
//! reachability as bitsets, and longest paths before and after each operator.

use super::{SchedOp, ScheduleProblem};
use crate::workload::CoreType;
use fixedbitset::FixedBitSet;

/// Resource indices: tensor cores, vector cores, the link.
pub(crate) const RESOURCES: usize = 3;
pub(crate) const LINK: usize = 2;

pub(crate) fn resource_of(core: CoreType) -> usize {
    match core {
        CoreType::Tensor => 0,
        CoreType::Vector => 1,
        CoreType::Link => LINK,
    }
}

/// One way to run an operator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Mode {
    pub duration_s: f64,
    pub energy_j: f64,
    /// Occupies every unit of its resource (intra-operator parallel), so runs alone there.
    pub parallel: bool,
}

/// A validated problem with everything the bounds, heuristic and ILP need.
pub(crate) struct Prepared<'a> {
    pub problem: &'a ScheduleProblem,
    pub resource: Vec<usize>,
    pub capacity: [u32; RESOURCES],
    /// Non-dominated modes; when two, the single-core one comes first.
    pub modes: Vec<Vec<Mode>>,
    pub preds: Vec<Vec<usize>>,
    pub succs: Vec<Vec<usize>>,
    /// Operators reachable from each operator (its strict descendants).
    pub descendants: Vec<FixedBitSet>,
    pub min_duration_s: Vec<f64>,
    /// Longest path (shortest modes) that must finish before the operator can start.
    pub head_s: Vec<f64>,
    /// Longest path (shortest modes) that must run after the operator ends.
    pub tail_s: Vec<f64>,
}

impl<'a> Prepared<'a> {
    /// `problem` must have passed `validate`.
    pub fn new(problem: &'a ScheduleProblem) -> Self {
        let n = problem.ops.len();
        let capacity = [problem.cores.tensor, problem.cores.vector, 1];
        let resource: Vec<usize> = problem.ops.iter().map(|o| resource_of(o.core)).collect();
        let modes: Vec<Vec<Mode>> = problem
            .ops
            .iter()
            .zip(&resource)
            .map(|(op, &r)| modes_of(op, r, capacity[r]))
            .collect();

        let mut edges = problem.edges.clone();
        edges.sort_unstable();
        edges.dedup();
        let mut preds = vec![Vec::new(); n];
        let mut succs = vec![Vec::new(); n];
        for &(from, to) in &edges {
            preds[to].push(from);
            succs[from].push(to);
        }

        // Indices are a topological order, so one reverse sweep closes reachability.
        let mut descendants = vec![FixedBitSet::with_capacity(n); n];
        for i in (0..n).rev() {
            for &j in &succs[i] {
                let below = descendants[j].clone();
                descendants[i].union_with(&below);
                descendants[i].insert(j);
            }
        }

        let min_duration_s: Vec<f64> = modes
            .iter()
            .map(|m| m.iter().map(|x| x.duration_s).fold(f64::INFINITY, f64::min))
            .collect();
        let mut head_s = vec![0.0; n];
        for j in 0..n {
            head_s[j] = preds[j]
                .iter()
                .map(|&i| head_s[i] + min_duration_s[i])
                .fold(0.0, f64::max);
        }
        let mut tail_s = vec![0.0; n];
        for i in (0..n).rev() {
            tail_s[i] = succs[i]
                .iter()
                .map(|&j| tail_s[j] + min_duration_s[j])
                .fold(0.0, f64::max);
        }

        Prepared {
            problem,
            resource,
            capacity,
            modes,
            preds,
            succs,
            descendants,
            min_duration_s,
            head_s,
            tail_s,
        }
    }

    pub fn len(&self) -> usize {
        self.problem.ops.len()
    }

    /// True when a path joins `i` and `j` in either direction.
    pub fn comparable(&self, i: usize, j: usize) -> bool {
        self.descendants[i].contains(j) || self.descendants[j].contains(i)
    }

    /// Units of its resource an operator holds in a mode.
    pub fn demand(&self, op: usize, mode: usize) -> u32 {
        if self.modes[op][mode].parallel {
            self.capacity[self.resource[op]]
        } else {
            1
        }
    }
}

/// The least energy any schedule of `problem` spends: each operator in its least-energy mode
/// (a schedule runs every operator once, in one of its modes, and energy does not depend on
/// when). `problem` must have passed `validate`.
pub(crate) fn min_energy_j(problem: &ScheduleProblem) -> f64 {
    let capacity = [problem.cores.tensor, problem.cores.vector, 1];
    problem
        .ops
        .iter()
        .map(|op| {
            let r = resource_of(op.core);
            modes_of(op, r, capacity[r])
                .iter()
                .map(|m| m.energy_j)
                .fold(f64::INFINITY, f64::min)
        })
        .sum()
}

/// The modes worth considering. All-core execution runs alone, so it is dominated when it is not
/// faster than one core (the one-core run fits in the same interval on any core). On a resource
/// with one unit both variants hold the whole resource, so only the faster one is kept; the link
/// has no parallel variant.
fn modes_of(op: &SchedOp, resource: usize, capacity: u32) -> Vec<Mode> {
    let single = Mode {
        duration_s: op.one_core_s,
        energy_j: op.one_core_energy_j,
        parallel: false,
    };
    let parallel = Mode {
        duration_s: op.all_cores_s,
        energy_j: op.all_cores_energy_j,
        parallel: true,
    };
    if resource == LINK || op.all_cores_s >= op.one_core_s {
        vec![single]
    } else if capacity == 1 {
        vec![parallel]
    } else {
        vec![single, parallel]
    }
}
