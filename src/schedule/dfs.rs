//! Depth-first search for a schedule no longer than a target makespan, or a proof that none
//! exists.
//!
//! The serial schedule-generation scheme as a search tree: each node places one ready
//! operator, in one of its modes, at the earliest time its predecessors and the free units of
//! its resource allow. Placements go in order of start time (ties by operator index): the
//! start-ordered list of an active schedule regenerates exactly that schedule, so the tree
//! holds every active schedule once, and whatever is still unplaced starts no earlier than the
//! last placement (the clock). Branches are cut when
//! - an operator cannot end by the latest end that propagation allows for the target
//!   (precedence, then the units already taken: profiles only fill up deeper in the tree, so
//!   the earliest fit now is a lower bound);
//! - a resource's unplaced operators need more unit-seconds between some earliest start and
//!   some deadline than its profile leaves free there;
//! - a ready operator fits, in some mode, entirely before the clock: it could be moved there
//!   and end earlier with nothing else changed, so the schedule below is not active in the
//!   multi-mode sense (the multi-mode left-shift rule of Sprecher, Hartmann & Drexl, 1997)
//!   and an active one that is no longer is reached elsewhere.
//!
//! Every schedule that meets the target can be turned into a multi-mode active one that still
//! meets it, and none of the cuts removes that one, so a search that runs out of branches
//! proves the target infeasible: a lower bound.

use super::bounds;
use super::prepare::{Prepared, RESOURCES};
use super::profile::Profile;
use super::realise::{self, Realised};
use std::time::Instant;

/// Relative slack on every deadline, so rounding never cuts a schedule that meets the target.
const TOLERANCE_REL: f64 = 1e-9;
/// Placements between two looks at the clock.
const NODES_PER_CLOCK_CHECK: usize = 1 << 10;
/// Larger problems are left undecided: the tree is as deep as the operator count (one stack
/// frame per level) and each node costs up to the square of it. Layers have tens.
const MAX_OPERATORS: usize = 512;

/// What the search learnt about a target makespan.
pub(crate) enum Outcome {
    /// A schedule no longer than the target (within [`TOLERANCE_REL`]).
    Met(Realised),
    /// The whole tree was explored: no schedule is that short.
    Refuted,
    /// The node budget or the deadline ran out first, or the problem is too large to search.
    Undecided,
}

/// Work the search may do: placements, and optionally a wall-clock deadline as a safety net.
pub(crate) struct Budget {
    pub nodes: usize,
    pub deadline: Option<Instant>,
}

/// Searches for a schedule no longer than `target_s`; spends placements from `budget`.
pub(crate) fn meet_target(prep: &Prepared, target_s: f64, budget: &mut Budget) -> Outcome {
    let Some(windows) = bounds::windows(prep, target_s) else {
        return Outcome::Refuted;
    };
    if prep.len() > MAX_OPERATORS {
        return Outcome::Undecided;
    }
    let n = prep.len();
    let mut search = Search {
        prep,
        earliest_start_s: windows.earliest_start_s,
        latest_end_s: windows.latest_end_s,
        tolerance_s: TOLERANCE_REL * target_s,
        budget,
        starts_s: vec![0.0; n],
        ends_s: vec![0.0; n],
        modes: vec![0; n],
        placed: vec![false; n],
        waiting: prep.preds.iter().map(Vec::len).collect(),
        earliest_fit_s: vec![0.0; n],
        earliest_end_s: vec![0.0; n],
    };
    let ready: Vec<usize> = (0..n).filter(|&i| prep.preds[i].is_empty()).collect();
    let profiles: [Profile; RESOURCES] = std::array::from_fn(|_| Profile::new());
    let met = search.descend(&profiles, &ready, (f64::NEG_INFINITY, 0));
    let exhausted = search.budget.nodes == 0;
    if met {
        // Profiles never exceed capacity, so core assignment cannot fail.
        match realise::assign(prep, search.starts_s, search.modes) {
            Ok(plan) => Outcome::Met(plan),
            Err(_) => Outcome::Undecided,
        }
    } else if exhausted {
        Outcome::Undecided
    } else {
        Outcome::Refuted
    }
}

/// One way to extend the partial schedule.
struct Candidate {
    op: usize,
    mode: usize,
    start_s: f64,
    end_s: f64,
}

struct Search<'p, 'a, 'b> {
    prep: &'p Prepared<'a>,
    earliest_start_s: Vec<f64>,
    latest_end_s: Vec<f64>,
    tolerance_s: f64,
    budget: &'b mut Budget,
    starts_s: Vec<f64>,
    ends_s: Vec<f64>,
    modes: Vec<usize>,
    placed: Vec<bool>,
    /// Unplaced predecessors per operator.
    waiting: Vec<usize>,
    /// Earliest start and end of each unplaced operator given the placed ones (scratch).
    earliest_fit_s: Vec<f64>,
    earliest_end_s: Vec<f64>,
}

impl Search<'_, '_, '_> {
    /// Places the operators not yet placed; true once all are, leaving the schedule in
    /// `starts_s` / `modes`. `ready` holds the unplaced operators whose predecessors are all
    /// placed; `last` the start and index of the latest placement.
    fn descend(
        &mut self,
        profiles: &[Profile; RESOURCES],
        ready: &[usize],
        last: (f64, usize),
    ) -> bool {
        if ready.is_empty() {
            return true;
        }
        let prep = self.prep;
        let mut candidates = Vec::new();
        for &op in ready {
            let r = prep.resource[op];
            let ready_s = self.ready_s(op);
            for (mode, m) in prep.modes[op].iter().enumerate() {
                let limit = prep.capacity[r] - prep.demand(op, mode);
                let start_s = profiles[r].earliest(ready_s, m.duration_s, limit);
                let end_s = start_s + m.duration_s;
                let in_order = start_s > last.0 || (start_s == last.0 && op > last.1);
                if in_order && end_s <= self.latest_end_s[op] + self.tolerance_s {
                    candidates.push(Candidate {
                        op,
                        mode,
                        start_s,
                        end_s,
                    });
                }
            }
        }
        // Chronological: what starts first, then what ends first.
        candidates.sort_by(|a, b| {
            a.start_s
                .total_cmp(&b.start_s)
                .then(a.end_s.total_cmp(&b.end_s))
                .then(a.op.cmp(&b.op))
                .then(a.mode.cmp(&b.mode))
        });
        for c in candidates {
            if !self.spend_node() {
                return false;
            }
            let r = prep.resource[c.op];
            let mut next = profiles.clone();
            next[r].add(c.start_s, c.end_s, prep.demand(c.op, c.mode));
            self.placed[c.op] = true;
            self.starts_s[c.op] = c.start_s;
            self.ends_s[c.op] = c.end_s;
            self.modes[c.op] = c.mode;
            let mut next_ready: Vec<usize> = ready.iter().copied().filter(|&i| i != c.op).collect();
            for &s in &prep.succs[c.op] {
                self.waiting[s] -= 1;
                if self.waiting[s] == 0 {
                    next_ready.push(s);
                }
            }
            if self.rest_fits(&next, c.start_s)
                && self.descend(&next, &next_ready, (c.start_s, c.op))
            {
                return true;
            }
            for &s in &prep.succs[c.op] {
                self.waiting[s] += 1;
            }
            self.placed[c.op] = false;
        }
        false
    }

    /// Takes one placement from the budget; false once it is spent or the deadline passed.
    fn spend_node(&mut self) -> bool {
        if self.budget.nodes == 0 {
            return false;
        }
        self.budget.nodes -= 1;
        let past_deadline = || self.budget.deadline.is_some_and(|d| Instant::now() >= d);
        if self.budget.nodes.is_multiple_of(NODES_PER_CLOCK_CHECK) && past_deadline() {
            self.budget.nodes = 0;
            return false;
        }
        true
    }

    /// When an operator whose predecessors are all placed may start.
    fn ready_s(&self, op: usize) -> f64 {
        self.prep.preds[op]
            .iter()
            .map(|&p| self.ends_s[p])
            .fold(self.earliest_start_s[op], f64::max)
    }

    /// Whether the unplaced operators can still be placed after the clock: none that is
    /// ready fits entirely before it, each can end by its deadline, and each resource has
    /// the unit-seconds they need.
    fn rest_fits(&mut self, profiles: &[Profile; RESOURCES], clock_s: f64) -> bool {
        let prep = self.prep;
        for j in 0..prep.len() {
            if self.placed[j] {
                continue;
            }
            let r = prep.resource[j];
            let is_ready = self.waiting[j] == 0;
            // Indices are a topological order, so predecessors are already updated.
            let from_s = prep.preds[j]
                .iter()
                .map(|&p| {
                    if self.placed[p] {
                        self.ends_s[p]
                    } else {
                        self.earliest_end_s[p]
                    }
                })
                .fold(self.earliest_start_s[j], f64::max);
            let mut start_s = f64::INFINITY;
            let mut end_s = f64::INFINITY;
            for (mode, m) in prep.modes[j].iter().enumerate() {
                let limit = prep.capacity[r] - prep.demand(j, mode);
                let mut fits_s = profiles[r].earliest(from_s, m.duration_s, limit);
                if fits_s < clock_s {
                    // A ready operator that would end strictly earlier than at or after the
                    // clock (one with a zero-length mode could end right at it).
                    let shifted_end_s = fits_s + m.duration_s;
                    if is_ready
                        && (shifted_end_s < clock_s
                            || (shifted_end_s <= clock_s && prep.min_duration_s[j] > 0.0))
                    {
                        return false;
                    }
                    fits_s = profiles[r].earliest(clock_s, m.duration_s, limit);
                }
                start_s = start_s.min(fits_s);
                end_s = end_s.min(fits_s + m.duration_s);
            }
            if end_s > self.latest_end_s[j] + self.tolerance_s {
                return false;
            }
            self.earliest_fit_s[j] = start_s;
            self.earliest_end_s[j] = end_s;
        }
        (0..RESOURCES).all(|r| self.energy_fits(r, &profiles[r]))
    }

    /// Task-interval energy check on one resource: for every earliest start `from` and
    /// deadline `until` of its unplaced operators, those inside `[from, until]` need no more
    /// unit-seconds (least over the modes that fit) than the profile leaves free there.
    fn energy_fits(&self, r: usize, profile: &Profile) -> bool {
        let prep = self.prep;
        let capacity = f64::from(prep.capacity[r]);
        // (earliest start, deadline, unit-seconds)
        let mut jobs: Vec<(f64, f64, f64)> = (0..prep.len())
            .filter(|&i| !self.placed[i] && prep.resource[i] == r)
            .map(|i| {
                let from_s = self.earliest_fit_s[i];
                let area_s = prep.modes[i]
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| {
                        from_s + m.duration_s <= self.latest_end_s[i] + self.tolerance_s
                    })
                    .map(|(mode, m)| f64::from(prep.demand(i, mode)) * m.duration_s)
                    .fold(f64::INFINITY, f64::min);
                (from_s, self.latest_end_s[i], area_s)
            })
            .collect();
        jobs.sort_by(|a, b| a.1.total_cmp(&b.1));
        for &(from_s, _, _) in &jobs {
            let mut need_s = 0.0;
            for &(start_s, until_s, area_s) in &jobs {
                if start_s < from_s {
                    continue;
                }
                need_s += area_s;
                let free_s = capacity * (until_s - from_s) - profile.busy_s(from_s, until_s);
                if need_s > free_s + capacity * self.tolerance_s {
                    return false;
                }
            }
        }
        true
    }
}
