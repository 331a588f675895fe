//! List scheduling: the serial schedule-generation scheme of resource-constrained project
//! scheduling. Operators are taken one at a time in priority order among those whose
//! predecessors are placed, and each starts at the earliest time its predecessors and the
//! free units of its resource allow (gaps left earlier are filled). The scheduler keeps the
//! best of a few deterministic rules and a fixed-seed batch of randomised ones.

use super::bounds::Windows;
use super::prepare::{Prepared, RESOURCES};
use super::profile::Profile;
use super::realise::{self, Realised};

/// Randomised passes after the deterministic ones; cheap (microseconds each) and they often
/// close the gap to the lower bound so the ILP is skipped.
const RANDOM_PASSES: usize = 32;
/// Randomised passes in all while the best is not yet good enough to spare the solver: a few
/// milliseconds against a solve of hundreds, and a better warm start shortens the solve.
const RANDOM_PASSES_BEFORE_SOLVER: usize = 300;
/// Probability that a randomised pass takes a random mode instead of the fastest-finishing one.
const RANDOM_MODE_PROBABILITY: f64 = 0.2;
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Clone, Copy)]
enum ModeRule {
    /// The mode that finishes first (ties: fewer units).
    Fastest,
    /// Always one core where possible.
    Single,
    /// Always all cores where possible.
    Parallel,
    /// Fastest, but sometimes a random mode.
    Randomised,
}

/// xorshift64*: tiny, deterministic, good enough to perturb priorities.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One serial pass; returns start times and chosen modes.
fn serial_pass(
    prep: &Prepared,
    priority: &[f64],
    rule: ModeRule,
    rng: &mut Rng,
) -> (Vec<f64>, Vec<usize>) {
    let n = prep.len();
    let mut profiles: Vec<Profile> = (0..RESOURCES).map(|_| Profile::new()).collect();
    let mut waiting: Vec<usize> = prep.preds.iter().map(Vec::len).collect();
    let mut eligible: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut starts_s = vec![0.0; n];
    let mut ends_s = vec![0.0; n];
    let mut modes = vec![0; n];
    while !eligible.is_empty() {
        let pick = (0..eligible.len())
            .max_by(|&a, &b| {
                let (i, j) = (eligible[a], eligible[b]);
                priority[i].total_cmp(&priority[j]).then(j.cmp(&i))
            })
            .unwrap_or(0);
        let op = eligible.swap_remove(pick);
        let r = prep.resource[op];
        let ready_s = prep.preds[op]
            .iter()
            .map(|&p| ends_s[p])
            .fold(0.0, f64::max);
        let options: Vec<(f64, f64)> = (0..prep.modes[op].len())
            .map(|m| {
                let duration_s = prep.modes[op][m].duration_s;
                let limit = prep.capacity[r] - prep.demand(op, m);
                let start_s = profiles[r].earliest(ready_s, duration_s, limit);
                (start_s, start_s + duration_s)
            })
            .collect();
        let fastest = (0..options.len())
            .min_by(|&a, &b| options[a].1.total_cmp(&options[b].1).then(a.cmp(&b)))
            .unwrap_or(0);
        let mode = match rule {
            ModeRule::Fastest => fastest,
            ModeRule::Single => 0,
            ModeRule::Parallel => options.len() - 1,
            ModeRule::Randomised => {
                if rng.next_f64() < RANDOM_MODE_PROBABILITY {
                    ((rng.next_f64() * options.len() as f64) as usize).min(options.len() - 1)
                } else {
                    fastest
                }
            }
        };
        let (start_s, end_s) = options[mode];
        profiles[r].add(start_s, end_s, prep.demand(op, mode));
        starts_s[op] = start_s;
        ends_s[op] = end_s;
        modes[op] = mode;
        for &s in &prep.succs[op] {
            waiting[s] -= 1;
            if waiting[s] == 0 {
                eligible.push(s);
            }
        }
    }
    (starts_s, modes)
}

/// Every operator after the previous one in index order, first mode: valid for any problem,
/// the baseline the passes improve on.
fn sequential(prep: &Prepared) -> Realised {
    let mut starts_s = Vec::with_capacity(prep.len());
    let mut clock_s = 0.0;
    for op in 0..prep.len() {
        starts_s.push(clock_s);
        clock_s += prep.modes[op][0].duration_s;
    }
    realise::sequential(prep, starts_s)
}

/// The shortest schedule over all passes (ties: less energy, then the earlier pass): the
/// deterministic rules, then [`RANDOM_PASSES`] randomised ones and, while the best is still
/// longer than `enough_s`, more of them up to [`RANDOM_PASSES_BEFORE_SOLVER`]. Each randomised
/// pass draws its priorities and modes from one stream, so more passes only add schedules.
pub(crate) fn best_list_schedule(
    prep: &Prepared,
    guide: Option<&Windows>,
    enough_s: f64,
) -> Realised {
    let n = prep.len();
    let remaining_path_s: Vec<f64> = (0..n)
        .map(|i| prep.min_duration_s[i] + prep.tail_s[i])
        .collect();
    let earliest_first: Vec<f64> = (0..n)
        .map(|i| -prep.head_s[i] + 1e-3 * remaining_path_s[i])
        .collect();
    let mut rng = Rng(SEED);
    let mut passes: Vec<(Vec<f64>, ModeRule)> = vec![
        (remaining_path_s.clone(), ModeRule::Fastest),
        (remaining_path_s.clone(), ModeRule::Single),
        (remaining_path_s.clone(), ModeRule::Parallel),
        (earliest_first, ModeRule::Fastest),
    ];
    if let Some(guide) = guide {
        // Earliest deadline first, the deadlines of a makespan close to the lower bound.
        let deadline_first: Vec<f64> = (0..n)
            .map(|i| -guide.latest_end_s[i] + 1e-3 * remaining_path_s[i])
            .collect();
        passes.push((deadline_first.clone(), ModeRule::Fastest));
        passes.push((deadline_first, ModeRule::Parallel));
    }

    let mut best = sequential(prep);
    let mut keep = |starts_s: Vec<f64>, modes: Vec<usize>| {
        if let Ok(plan) = realise::assign(prep, starts_s, modes) {
            let better = plan.makespan_s < best.makespan_s
                || (plan.makespan_s == best.makespan_s && plan.energy_j < best.energy_j);
            if better {
                best = plan;
            }
        }
        best.makespan_s
    };
    for (priority, rule) in &passes {
        let (starts_s, modes) = serial_pass(prep, priority, *rule, &mut rng);
        keep(starts_s, modes);
    }
    for pass in 0..RANDOM_PASSES_BEFORE_SOLVER {
        let perturbed: Vec<f64> = remaining_path_s
            .iter()
            .map(|&p| p * (0.5 + rng.next_f64()))
            .collect();
        let (starts_s, modes) = serial_pass(prep, &perturbed, ModeRule::Randomised, &mut rng);
        let best_s = keep(starts_s, modes);
        if pass + 1 >= RANDOM_PASSES && best_s <= enough_s {
            break;
        }
    }
    best
}
