//! The downset dynamic programme of the 1F1B and GPipe schedules.
//!
//! `F[l][D][K]` is the best way to place the layers *not* in downset `D` into stages that use
//! exactly `K` tensor groups: the lexicographically smallest (largest rate, largest tail,
//! largest GPipe backward rate), where a stage of `k` replicas has rate `(F + B) / k` (1F1B)
//! or `F / k` and backward rate `B / k` (GPipe), and its tail is its exposed gradient
//! synchronisation plus its optimizer step. `l` counts the stages to go when the stage count
//! is held and is 0 otherwise. Filling the table from the end makes `K`, the groups from the
//! stage being placed to the pipeline's end, known where a stage is chosen: that decides how
//! many micro-batches a 1F1B replica holds (`min(K / k, ⌈m / k⌉)`) and which replica counts
//! the 1F1B schedule admits (`k | K`).
//!
//! The time per batch, `(m + K − 1) · (rate + backward rate) + tail`, adds maxima, so the
//! programme is repeated with a tightening bound on the tail (and, for GPipe, an outer loop
//! tightening the backward rate) until no plan under the bounds can win; the result is exact
//! (it equals [`super::brute_force`]). Cells that cannot beat the best time so far are left
//! out: a pipeline through (D, K) has rate at least (work outside D) / K and
//! (work inside D) / (groups before D), work being forward plus backward critical path.

use super::model::{
    build_plan, chain_stage_metrics, is_chain, memory_reason, predecessors, stage_metrics,
    state_bytes, widths, worst_stage, ChainTables, Ctx, PartStage, StageMetrics,
};
use super::{Alternative, Infeasible, PipelineSchedule, PlacementProblem, Plan, ZeroStage};
use fixedbitset::FixedBitSet;
use std::collections::{BTreeMap, HashMap};

/// Downsets beyond this many make the table too large; such graphs are reported infeasible.
pub(crate) const MAX_DOWNSETS: usize = 4096;
/// Largest pipeline (in tensor groups) searched for the closest infeasible plans.
const MAX_ALTERNATIVE_UNITS: u32 = 128;
/// Relative margin taken off the work lower bounds to absorb floating-point rounding.
const WORK_MARGIN: f64 = 1e-9;

/// A stage candidate: the layers between downset `from` (implicit) and downset `to`.
pub(crate) struct Pair {
    pub to: usize,
    pub metrics: StageMetrics,
    /// Lower bound on the stage's forward and backward operations (less the rounding margin).
    work_s: f64,
    /// Fits in memory with the most favourable sharding and a single micro-batch; stages that
    /// never fit are kept only for the closest-infeasible-plan search.
    may_fit: bool,
}

/// Downsets of one graph and every stage between two of them.
pub(crate) struct Analysis {
    /// Membership bitsets, in order of size (the empty set first, all layers last).
    downsets: Vec<FixedBitSet>,
    /// Every downset is a prefix (chain graphs): the pairs after `D` are in order of size.
    chain: bool,
    /// Layers outside each downset.
    suffix_len: Vec<u32>,
    /// Least weights, gradients and optimizer state, summed over one replica of each stage,
    /// of any stages holding the layers outside each downset: `s` stages of at most HBM each
    /// hold no more than `s · HBM`.
    state_outside_bytes: Vec<u128>,
    /// Stages that can follow each downset.
    pairs: Vec<Vec<Pair>>,
    /// Lower bounds on the summed stage operations of any partition of the layers inside /
    /// outside each downset: forward plus backward critical path (a longest path crosses the
    /// stages in order, so the stages' own critical paths add up to at least it), and one
    /// micro-batch's gradient accumulation.
    work_inside_s: Vec<f64>,
    work_outside_s: Vec<f64>,
    accumulation_inside_s: Vec<f64>,
    accumulation_outside_s: Vec<f64>,
    /// The largest optimizer step of one layer's dense parameters: the stage holding it steps
    /// at least that (over its ZeRO shards; expert parallelism divides only the experts), so
    /// every plan's tail is at least that much.
    largest_layer_optimizer_s: f64,
}

/// All downsets of a graph (breadth first from the empty set, so sorted by size), or `None`
/// when there are more than `limit`.
pub(crate) fn downsets(n: usize, preds: &[Vec<usize>], limit: usize) -> Option<Vec<FixedBitSet>> {
    let mut all = vec![FixedBitSet::with_capacity(n)];
    let mut index: HashMap<FixedBitSet, usize> = HashMap::new();
    index.insert(all[0].clone(), 0);
    let mut next = 0;
    while next < all.len() {
        let current = all[next].clone();
        next += 1;
        for (v, before) in preds.iter().enumerate() {
            if current.contains(v) || !before.iter().all(|&u| current.contains(u)) {
                continue;
            }
            let mut grown = current.clone();
            grown.insert(v);
            if !index.contains_key(&grown) {
                if all.len() == limit {
                    return None;
                }
                index.insert(grown.clone(), all.len());
                all.push(grown);
            }
        }
    }
    Some(all)
}

/// Forward plus backward time, slightly below the float sums so that rounding never makes
/// a bound built from it exceed an operation summed in another order.
fn work_s(sm: &StageMetrics) -> f64 {
    (sm.fwd_s + sm.bwd_s) * (1.0 - WORK_MARGIN)
}

impl Analysis {
    /// Enumerates downsets and the metrics of every stage between two of them.
    pub(crate) fn new(problem: &PlacementProblem, graph_index: usize) -> Result<Self, String> {
        let graph = &problem.graphs[graph_index];
        let n = graph.layers.len();
        let preds = predecessors(n, &graph.edges);
        let downsets = downsets(n, &preds, MAX_DOWNSETS).ok_or_else(|| {
            if is_chain(&preds) {
                format!(
                    "t={}: the model has {n} layers in a chain; the plan search takes at most \
                     {} (its tables hold one row per downset, {MAX_DOWNSETS} at most): merge \
                     layers",
                    graph.tp,
                    MAX_DOWNSETS - 1
                )
            } else {
                format!(
                    "t={}: the layer graph has more than {MAX_DOWNSETS} downsets (sets of layers \
                     closed under predecessors; a chain of n layers has n + 1, parallel \
                     branches multiply them) — the plan search takes at most {MAX_DOWNSETS}: \
                     chain the branches or merge layers",
                    graph.tp
                )
            }
        })?;
        let suffix_len: Vec<u32> = downsets
            .iter()
            .map(|s| (n - s.count_ones(..)) as u32)
            .collect();
        // The most copies a stage can have: all tensor groups of the cluster.
        let max_shards = u64::from(problem.devices / graph.tp).max(1);
        let mut dist = vec![0.0; n];
        let mut before = vec![false; n];
        let mut in_stage = vec![false; n];
        let mut pairs = Vec::with_capacity(downsets.len());
        // Experts divided as far as they can be: over every tensor group.
        let least_held =
            |params: u64, experts: u64| params - experts + experts.div_ceil(max_shards);
        let least_bytes = |sm: &StageMetrics| {
            let held = least_held(sm.params, sm.expert_params);
            let largest = least_held(sm.largest_layer_params, sm.largest_layer_experts);
            state_bytes(problem, held, largest, max_shards)
                .iter()
                .sum::<u64>()
                + sm.act_one
        };
        let pair = |to: usize, metrics: StageMetrics| Pair {
            to,
            metrics,
            work_s: work_s(&metrics),
            may_fit: least_bytes(&metrics) <= problem.hbm_bytes,
        };
        let chain = is_chain(&preds);
        if chain {
            // Downset `i` is the first `i` layers (breadth first from the empty set).
            let tables = ChainTables::new(graph);
            for first in 0..n {
                let stages = chain_stage_metrics(problem, graph_index, &tables, first);
                pairs.push(
                    (first + 1..=n)
                        .zip(stages)
                        .map(|(to, m)| pair(to, m))
                        .collect(),
                );
            }
            pairs.push(Vec::new());
        }
        for from in downsets.iter().skip(pairs.len()) {
            let mut list = Vec::new();
            for (v, b) in before.iter_mut().enumerate() {
                *b = from.contains(v);
            }
            for (to, set) in downsets.iter().enumerate() {
                let superset = from.is_subset(set) && set != from;
                if !superset {
                    continue;
                }
                for (v, x) in in_stage.iter_mut().enumerate() {
                    *x = set.contains(v) && !before[v];
                }
                let metrics =
                    stage_metrics(problem, graph_index, &preds, &in_stage, &before, &mut dist);
                list.push(pair(to, metrics));
            }
            pairs.push(list);
        }
        // Per-stage rounding up of sharded state only adds to the sum.
        let state_outside_bytes = downsets
            .iter()
            .map(|set| {
                let params: u128 = (0..n)
                    .filter(|&v| !set.contains(v))
                    .map(|v| {
                        let layer = &graph.layers[v];
                        u128::from(least_held(layer.params, layer.expert_params))
                    })
                    .sum();
                let bpp = &problem.bytes_per_param;
                let sharded = |per_param: u32, from: ZeroStage| {
                    let bytes = params * u128::from(per_param);
                    if problem.zero >= from {
                        bytes.div_ceil(u128::from(max_shards))
                    } else {
                        bytes
                    }
                };
                sharded(bpp.weights, ZeroStage::Parameters)
                    + sharded(bpp.grads, ZeroStage::Gradients)
                    + sharded(bpp.optimizer, ZeroStage::Optimizer)
            })
            .collect();
        // (work, accumulation) of the layers inside and outside each downset.
        let bounds: Vec<[(f64, f64); 2]> = if chain {
            // Downset `i` holds the stage 0..i and leaves the stage i..n.
            let stage = |from: usize, to: usize| {
                (from < to)
                    .then(|| &pairs[from][to - from - 1].metrics)
                    .map_or((0.0, 0.0), |sm| (work_s(sm), sm.grad_accumulation_s))
            };
            (0..=n).map(|i| [stage(0, i), stage(i, n)]).collect()
        } else {
            let nothing = vec![false; n];
            let mut work = |set: &FixedBitSet, inside: bool| {
                for (v, x) in in_stage.iter_mut().enumerate() {
                    *x = set.contains(v) == inside;
                }
                let sm =
                    stage_metrics(problem, graph_index, &preds, &in_stage, &nothing, &mut dist);
                (work_s(&sm), sm.grad_accumulation_s)
            };
            downsets
                .iter()
                .map(|set| [work(set, true), work(set, false)])
                .collect()
        };
        let side =
            |i: usize, part: fn((f64, f64)) -> f64| bounds.iter().map(|b| part(b[i])).collect();
        Ok(Analysis {
            downsets,
            chain,
            suffix_len,
            state_outside_bytes,
            pairs,
            work_inside_s: side(0, |b| b.0),
            work_outside_s: side(1, |b| b.0),
            accumulation_inside_s: side(0, |b| b.1),
            accumulation_outside_s: side(1, |b| b.1),
            largest_layer_optimizer_s: graph
                .layers
                .iter()
                .map(|l| {
                    if l.expert_params == 0 {
                        l.optimizer_step_s
                    } else {
                        let dense = l.params - l.expert_params;
                        l.optimizer_step_s * dense as f64 / l.params as f64
                    }
                })
                .fold(0.0, f64::max),
        })
    }

    fn empty(&self) -> usize {
        0
    }

    fn full(&self) -> usize {
        self.downsets.len() - 1
    }

    /// The layers of the stage between downsets `from` and `to`.
    fn layers(&self, from: usize, to: usize) -> Vec<usize> {
        let n = self.suffix_len[0] as usize;
        (0..n)
            .filter(|&l| self.downsets[to].contains(l) && !self.downsets[from].contains(l))
            .collect()
    }
}

/// What the programme minimises.
#[derive(Clone, Copy)]
enum Objective {
    /// Rate, then tail, then backward rate; stages must fit in memory, have a tail below
    /// `beta` and a backward rate below `gamma`; partial plans whose pipeline time and the
    /// tail every plan has (`tail_floor_s`) reach `prune_s` are dropped.
    Time {
        beta: f64,
        gamma: f64,
        prune_s: f64,
        tail_floor_s: f64,
    },
    /// Largest per-device memory (for the closest infeasible plans).
    Memory,
}

impl Objective {
    fn prune_s(self) -> f64 {
        match self {
            Objective::Time { prune_s, .. } => prune_s,
            Objective::Memory => f64::INFINITY,
        }
    }
}

/// What `k` replicas of a stage cost wherever the stage sits in the pipeline.
#[derive(Clone, Copy, Default)]
struct Replica {
    /// The stage this entry belongs to ([`ReplicaCache::stamp`]); others are recomputed.
    stamp: u32,
    rate_s: f64,
    backward_rate_s: f64,
    tail_s: f64,
    /// Weights, gradients and optimizer state per device.
    state_bytes: u64,
}

/// The replica choices of the stage being extended, computed on first use and reused for
/// every cell the stage is tried in.
#[derive(Default)]
struct ReplicaCache {
    stamp: u32,
    entries: Vec<Replica>,
}

impl ReplicaCache {
    fn reset(&mut self, units: u32) {
        self.stamp = 0;
        self.entries.clear();
        self.entries.resize(units as usize + 1, Replica::default());
    }

    fn next_stage(&mut self) {
        self.stamp += 1;
    }

    fn get(&mut self, ctx: &Ctx, sm: &StageMetrics, k: u32) -> Replica {
        let entry = &mut self.entries[k as usize];
        if entry.stamp != self.stamp {
            let ops = ctx.ops(sm, k);
            let (rate_s, backward_rate_s) = ctx.rate_s(&ops, k);
            *entry = Replica {
                stamp: self.stamp,
                rate_s,
                backward_rate_s,
                tail_s: ctx.tail_s(sm, k),
                state_bytes: ctx.state_bytes(sm, k).iter().sum(),
            };
        }
        *entry
    }
}

/// A cell's value: the lexicographic key the programme minimises.
#[derive(Clone, Copy, PartialEq)]
struct Value {
    rate_s: f64,
    tail_s: f64,
    backward_rate_s: f64,
}

impl Value {
    const NONE: Value = Value {
        rate_s: f64::INFINITY,
        tail_s: f64::INFINITY,
        backward_rate_s: f64::INFINITY,
    };
    const ZERO: Value = Value {
        rate_s: 0.0,
        tail_s: 0.0,
        backward_rate_s: 0.0,
    };

    fn better_than(&self, other: &Value) -> bool {
        (self.rate_s, self.tail_s, self.backward_rate_s).partial_cmp(&(
            other.rate_s,
            other.tail_s,
            other.backward_rate_s,
        )) == Some(std::cmp::Ordering::Less)
    }

    fn is_set(&self) -> bool {
        self.rate_s.is_finite()
    }
}

/// Table storage reused across (t, d) and bound iterations.
#[derive(Default)]
struct Tables {
    values: Vec<Value>,
    /// The stage each cell starts with: (index into the pairs of its downset, replicas).
    choices: Vec<(u32, u32)>,
    replicas: ReplicaCache,
    /// `divisors[K]`: the divisors of `K`, ascending (1F1B with free replica counts).
    divisors: Vec<Vec<u32>>,
}

/// Fills `divisors[K]` with the divisors of every `K` up to `units` where the 1F1B schedule
/// with free replica counts needs them.
fn prepare_divisors(ctx: &Ctx, divisors: &mut Vec<Vec<u32>>) {
    let units = ctx.units as usize;
    let wanted = ctx.replicas_free() && ctx.problem.schedule == PipelineSchedule::OneFOneB;
    if !wanted || divisors.len() > units {
        return;
    }
    divisors.clear();
    divisors.resize(units + 1, Vec::new());
    for k in 1..=units {
        for multiple in (k..=units).step_by(k) {
            divisors[multiple].push(k as u32);
        }
    }
}

/// Calls `f` for each replica count in `from..=to`, ascending, that a stage with `groups`
/// tensor groups from it to the pipeline's end may take: divisors of `groups` (1F1B), any
/// count (GPipe), or one (a held `dp`).
fn for_each_replica_count(
    divisors: &[Vec<u32>],
    ctx: &Ctx,
    groups: u32,
    from: u32,
    to: u32,
    mut f: impl FnMut(u32),
) {
    if !ctx.replicas_free() {
        if from <= 1 && 1 <= to {
            f(1);
        }
    } else if ctx.problem.schedule == PipelineSchedule::OneFOneB {
        let all = &divisors[groups as usize];
        let start = all.partition_point(|&k| k < from);
        all[start..]
            .iter()
            .take_while(|&&k| k <= to)
            .for_each(|&k| f(k));
    } else {
        (from..=to).for_each(f);
    }
}

/// The table's cells: per (layer `l`, downset `D`) the window of group counts `K` that can
/// still lead to a plan faster than the bound, stored one window after another.
struct Shape {
    downsets: usize,
    /// 1 when the stage count is free, `pp + 1` when it is held.
    layers: usize,
    /// First and last `K` of each (l, D) window; empty when `lo > hi`.
    lo: Vec<u32>,
    hi: Vec<u32>,
    /// Index of each window's first cell.
    offset: Vec<usize>,
    cells: usize,
}

/// Smallest `K` in `from..=to` with `bound(K) < prune_s` for a `bound` falling in `K`, or
/// `to + 1` when none.
fn first_below(from: u32, to: u32, prune_s: f64, bound: impl Fn(u32) -> f64) -> u32 {
    let (mut lo, mut hi) = (from, to.saturating_add(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if bound(mid) < prune_s {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

impl Shape {
    /// Cells for plans faster than `prune_s`, which must fit in memory when `fit` (the
    /// closest-infeasible search does without).
    fn new(an: &Analysis, ctx: &Ctx, prune_s: f64, fit: bool) -> Self {
        let problem = ctx.problem;
        let held = problem.constraints.pp;
        let layers = held.map_or(1, |pp| pp as usize + 1);
        let downsets = an.downsets.len();
        let units = ctx.units;
        let hbm_bytes = u128::from(problem.hbm_bytes);
        let whole = !problem.allow_idle_devices;
        let m = ctx.m;
        // Pipeline slots of a plan whose pipeline has at least `groups` groups.
        let slots = |groups: u32| {
            if whole {
                ctx.slots(units)
            } else {
                ctx.slots(groups.max(1))
            }
        };
        // Per-group work of `groups` groups sharing `work` and, when each of them runs more
        // than one micro-batch, `accumulation`.
        let share = |work: f64, accumulation: f64, groups: u32| {
            let accumulation = if u64::from(groups) < m {
                accumulation * (1.0 - WORK_MARGIN)
            } else {
                0.0
            };
            (work + accumulation) / f64::from(groups)
        };
        let (mut lo, mut hi, mut offset) = (Vec::new(), Vec::new(), Vec::new());
        let mut cells = 0;
        for l in 0..layers as u32 {
            for d in 0..downsets {
                let (mut first, mut last) = (1u32, 0u32);
                // Stages the remainder needs at least, and the stages before D.
                let (stages_after, stages_before) = match held {
                    Some(pp) => (
                        l,
                        if d == an.empty() {
                            0
                        } else {
                            pp.saturating_sub(l)
                        },
                    ),
                    None => (1, u32::from(d != an.empty())),
                };
                let root_ok = held.is_none_or(|pp| (d == an.empty()) == (l == pp));
                if d == an.full() {
                    if l == 0 {
                        (first, last) = (0, 0);
                    }
                } else if root_ok
                    && stages_after >= 1
                    && an.suffix_len[d] >= stages_after
                    && (d == an.empty() || stages_before >= 1)
                    && u64::from(stages_after) + u64::from(stages_before) <= u64::from(units)
                {
                    first = stages_after;
                    last = units - stages_before;
                    if d == an.empty() && whole {
                        first = units;
                    }
                    let (work, acc) = (an.work_outside_s[d], an.accumulation_outside_s[d]);
                    first = first_below(first, last, prune_s, |k| {
                        slots(k + stages_before) * share(work, acc, k)
                    });
                    if d != an.empty() {
                        let (work, acc) = (an.work_inside_s[d], an.accumulation_inside_s[d]);
                        let before = first_below(stages_before, units, prune_s, |k| {
                            slots(k + 1) * share(work, acc, k)
                        });
                        last = last.min(units.saturating_sub(before));
                    }
                    if fit {
                        // Each stage holds its state on each of its devices: the stages after
                        // D hold at most (their count) HBMs of it, and they are at most K.
                        let stages_at_most = |k: u32| match held {
                            Some(_) => u128::from(l),
                            None => u128::from(k),
                        };
                        let need = an.state_outside_bytes[d];
                        if stages_at_most(last) * hbm_bytes < need {
                            (first, last) = (1, 0);
                        } else {
                            while first <= last && stages_at_most(first) * hbm_bytes < need {
                                first += 1;
                            }
                        }
                    }
                }
                lo.push(first);
                hi.push(last);
                offset.push(cells);
                if first <= last {
                    cells += (last - first + 1) as usize;
                }
            }
        }
        Shape {
            downsets,
            layers,
            lo,
            hi,
            offset,
            cells,
        }
    }

    fn row(&self, l: usize, d: usize) -> usize {
        l * self.downsets + d
    }

    /// The `K` window of (l, D), possibly empty.
    fn window(&self, l: usize, d: usize) -> (u32, u32) {
        let r = self.row(l, d);
        (self.lo[r], self.hi[r])
    }

    /// Index of cell (l, D, K), `None` outside its window.
    fn at(&self, l: usize, d: usize, k: u32) -> Option<usize> {
        let (lo, hi) = self.window(l, d);
        (lo <= k && k <= hi).then(|| self.offset[self.row(l, d)] + (k - lo) as usize)
    }

    /// The layer of the remainder after a stage placed at layer `l`.
    fn next_layer(&self, l: usize) -> usize {
        if self.layers == 1 {
            0
        } else {
            l - 1
        }
    }

    /// The layer of the whole pipeline.
    fn root_layer(&self) -> usize {
        self.layers - 1
    }
}

/// Fills the table. Downsets go from the largest down; each stage after a downset is tried
/// in every cell it can start (so its per-replica costs are computed once), in a fixed order
/// (stage, cell, replicas ascending), and a cell keeps the first of equal values.
fn solve(an: &Analysis, ctx: &Ctx, obj: Objective, shape: &Shape, t: &mut Tables) {
    let Tables {
        values,
        choices,
        replicas,
        divisors,
    } = t;
    values.clear();
    values.resize(shape.cells, Value::NONE);
    choices.clear();
    choices.resize(shape.cells, (u32::MAX, 0));
    let base = shape
        .at(0, an.full(), 0)
        .expect("the empty remainder is a cell");
    values[base] = Value::ZERO;
    replicas.reset(ctx.units);
    let prune_s = obj.prune_s();
    let whole = !ctx.problem.allow_idle_devices;
    let time = matches!(obj, Objective::Time { .. });
    for d in (0..shape.downsets).rev() {
        if d == an.full() {
            continue;
        }
        let live: Vec<usize> = (0..shape.layers)
            .filter(|&l| {
                let (lo, hi) = shape.window(l, d);
                lo <= hi
            })
            .collect();
        if live.is_empty() {
            continue;
        }
        let most_groups = live
            .iter()
            .map(|&l| shape.window(l, d).1)
            .max()
            .unwrap_or(0);
        // The fewest pipeline slots any plan through these cells has.
        let fewest_slots = if whole {
            ctx.slots(ctx.units)
        } else {
            ctx.slots(1)
        };
        for (pi, pair) in an.pairs[d].iter().enumerate() {
            if time && !pair.may_fit {
                continue;
            }
            // The stage's operations are at least its work: shared by the most replicas it
            // can have, they must still leave room under the bound. On a chain, later pairs
            // only add layers.
            if time && pair.work_s / f64::from(most_groups.max(1)) * fewest_slots >= prune_s {
                if an.chain {
                    break;
                }
                continue;
            }
            replicas.next_stage();
            let sm = &pair.metrics;
            for &l in &live {
                let rl = shape.next_layer(l);
                if shape.layers > 1 && l == 0 {
                    continue;
                }
                let (clo, chi) = shape.window(rl, pair.to);
                let (lo, hi) = shape.window(l, d);
                if clo > chi || hi <= clo {
                    continue;
                }
                let row = shape.offset[shape.row(l, d)];
                let rest_row = shape.offset[shape.row(rl, pair.to)];
                if let Objective::Time {
                    beta,
                    gamma,
                    tail_floor_s,
                    ..
                } = obj
                {
                    if whole {
                        let cells = Cells {
                            row,
                            lo,
                            hi,
                            rest_row,
                            clo,
                            chi,
                        };
                        let bounds = TimeBounds {
                            beta,
                            gamma,
                            prune_s,
                            tail_floor_s,
                        };
                        extend_whole(ctx, pair, pi, cells, bounds, values, choices, replicas);
                        continue;
                    }
                }
                for groups in lo.max(clo + 1)..=hi {
                    let slots = if whole {
                        ctx.slots(ctx.units)
                    } else {
                        ctx.slots(groups)
                    };
                    let mut from = groups.saturating_sub(chi).max(1);
                    if time {
                        // Fewer replicas leave the stage's own work over the bound.
                        let fewest = pair.work_s * slots / prune_s;
                        if fewest >= f64::from(groups) {
                            continue;
                        }
                        from = from.max(fewest as u32 + 1);
                    }
                    let to = groups - clo;
                    if from > to {
                        continue;
                    }
                    let cell = row + (groups - lo) as usize;
                    let (mut best, mut choice) = (values[cell], choices[cell]);
                    let consider = |k: u32| {
                        let rest = values[rest_row + (groups - k - clo) as usize];
                        if !rest.is_set() {
                            return;
                        }
                        let candidate = match obj {
                            Objective::Time {
                                beta,
                                gamma,
                                tail_floor_s,
                                ..
                            } => {
                                let r = replicas.get(ctx, sm, k);
                                if r.tail_s >= beta || r.backward_rate_s >= gamma {
                                    return;
                                }
                                let rate_s = r.rate_s.max(rest.rate_s);
                                let backward_rate_s = r.backward_rate_s.max(rest.backward_rate_s);
                                // Pruning on the rate (and the tail every plan has) alone, the
                                // first key of the cells' order, keeps that order: a candidate
                                // a cell's best hid has no smaller rate, so it is pruned with it.
                                // GPipe's backward rate is left out: the best could be pruned on
                                // it while a hidden candidate with a larger rate and a smaller
                                // backward rate is not, and the cell would lose that plan.
                                if slots * rate_s + tail_floor_s >= prune_s {
                                    return;
                                }
                                if !ctx.fits_state(r.state_bytes, sm, k, groups) {
                                    return;
                                }
                                Value {
                                    rate_s,
                                    tail_s: r.tail_s.max(rest.tail_s),
                                    backward_rate_s,
                                }
                            }
                            Objective::Memory => {
                                let memory = ctx.memory(sm, k, ctx.in_flight(k, groups)).total;
                                Value {
                                    rate_s: (memory as f64).max(rest.rate_s),
                                    tail_s: 0.0,
                                    backward_rate_s: 0.0,
                                }
                            }
                        };
                        if candidate.better_than(&best) {
                            best = candidate;
                            choice = (pi as u32, k);
                        }
                    };
                    for_each_replica_count(divisors, ctx, groups, from, to, consider);
                    values[cell] = best;
                    choices[cell] = choice;
                }
            }
        }
    }
}

/// The cells of one (layer, downset) row a stage extends, and the row of the remainder after
/// it: `groups` in `lo..=hi` at `row + groups - lo`, the remainder's `groups` in `clo..=chi`
/// at `rest_row + groups - clo`.
#[derive(Clone, Copy)]
struct Cells {
    row: usize,
    lo: u32,
    hi: u32,
    rest_row: usize,
    clo: u32,
    chi: u32,
}

/// The bounds of [`Objective::Time`], with the pruning bound of the table's cells.
#[derive(Clone, Copy)]
struct TimeBounds {
    beta: f64,
    gamma: f64,
    prune_s: f64,
    tail_floor_s: f64,
}

/// [`solve`]'s extension of the cells of one row by one stage (`pair`, the `pi`-th after its
/// downset) under [`Objective::Time`] when every pipeline takes all the groups (the slots are
/// the same in every cell). The same candidates as the cell-by-cell loop, and each cell sees
/// its replica counts in the same (ascending) order, keeping the first of equal values; but
/// replica counts go outside, so what depends on the count alone (its costs, the bound on its
/// work and on its rate, the tail and backward-rate bounds) is decided once for all its cells,
/// and a count stops at the first cell (in rising groups) where its state does not fit, since
/// a replica holds no fewer micro-batches with more groups after it.
#[allow(clippy::too_many_arguments)]
fn extend_whole(
    ctx: &Ctx,
    pair: &Pair,
    pi: usize,
    cells: Cells,
    bounds: TimeBounds,
    values: &mut [Value],
    choices: &mut [(u32, u32)],
    replicas: &mut ReplicaCache,
) {
    let Cells {
        row,
        lo,
        hi,
        rest_row,
        clo,
        chi,
    } = cells;
    let TimeBounds {
        beta,
        gamma,
        prune_s,
        tail_floor_s,
    } = bounds;
    let sm = &pair.metrics;
    let slots = ctx.slots(ctx.units);
    // Fewer replicas leave the stage's own work over the bound (in every cell: the same
    // slots), and a cell needs more groups than replicas.
    let fewest = pair.work_s * slots / prune_s;
    if fewest >= f64::from(hi) {
        return;
    }
    let first_k = (fewest as u32 + 1).max(1);
    let (free, one_f_one_b) = (
        ctx.replicas_free(),
        ctx.problem.schedule == PipelineSchedule::OneFOneB,
    );
    let last_k = if free { hi - clo } else { 1.min(hi - clo) };
    for k in first_k..=last_k {
        // Cells this count reaches: the remainder keeps `groups - k` in `clo..=chi`.
        let g_lo = lo.max(clo + 1).max(k + clo);
        let g_hi = hi.min(k.saturating_add(chi));
        if g_lo > g_hi {
            continue;
        }
        // 1F1B with free counts: `k` divides the groups.
        let (start, step) = if free && one_f_one_b {
            (g_lo.div_ceil(k) * k, k)
        } else {
            (g_lo, 1)
        };
        let mut replica: Option<Replica> = None;
        let mut groups = start;
        while groups <= g_hi {
            let rest = values[rest_row + (groups - k - clo) as usize];
            if rest.is_set() {
                let r = *replica.get_or_insert_with(|| replicas.get(ctx, sm, k));
                if r.tail_s >= beta || r.backward_rate_s >= gamma {
                    break;
                }
                // The rate is at least the stage's own: no cell of this count beats the bound.
                if slots * r.rate_s + tail_floor_s >= prune_s {
                    break;
                }
                let rate_s = r.rate_s.max(rest.rate_s);
                if slots * rate_s + tail_floor_s < prune_s {
                    if !ctx.fits_state(r.state_bytes, sm, k, groups) {
                        break;
                    }
                    let candidate = Value {
                        rate_s,
                        tail_s: r.tail_s.max(rest.tail_s),
                        backward_rate_s: r.backward_rate_s.max(rest.backward_rate_s),
                    };
                    let cell = row + (groups - lo) as usize;
                    if candidate.better_than(&values[cell]) {
                        values[cell] = candidate;
                        choices[cell] = (pi as u32, k);
                    }
                }
            }
            groups += step;
        }
    }
}

/// The root cells a plan may come from: (layer, groups per pipeline).
fn finals(an: &Analysis, shape: &Shape) -> Vec<(usize, u32)> {
    let l = shape.root_layer();
    let (lo, hi) = shape.window(l, an.empty());
    (lo..=hi).map(|k| (l, k)).collect()
}

fn value_at(shape: &Shape, t: &Tables, l: usize, d: usize, k: u32) -> Value {
    shape.at(l, d, k).map_or(Value::NONE, |at| t.values[at])
}

/// Walks the filled table back from the root cell (l, ∅, K) to a partition.
fn reconstruct(an: &Analysis, shape: &Shape, t: &Tables, l: usize, groups: u32) -> Vec<PartStage> {
    let mut parts = Vec::new();
    let (mut l, mut d, mut groups) = (l, an.empty(), groups);
    while d != an.full() {
        let at = shape.at(l, d, groups).expect("a stored cell");
        let (pi, k) = t.choices[at];
        let pair = &an.pairs[d][pi as usize];
        parts.push(PartStage {
            layers: an.layers(d, pair.to),
            metrics: pair.metrics,
            replicas: k,
        });
        l = shape.next_layer(l);
        d = pair.to;
        groups -= k;
    }
    parts
}

/// The best plan found so far.
struct Best<'a> {
    time_s: f64,
    ctx: Ctx<'a>,
    parts: Vec<PartStage>,
}

/// Searches one (t, d) for plans faster than `best`'s (or `bound_s`), replacing it with any;
/// without `pruning`, every cell is kept (the table of the unpruned programme).
fn search_widths<'a>(
    an: &Analysis,
    ctx: &Ctx<'a>,
    tables: &mut Tables,
    best_s: &mut f64,
    best: &mut Option<Best<'a>>,
    pruning: bool,
) {
    let gpipe = ctx.problem.schedule == PipelineSchedule::GPipe;
    let tail_floor_s = an.largest_layer_optimizer_s / ctx.optimizer_shards(ctx.units) as f64;
    let mut gamma = f64::INFINITY;
    loop {
        // Per pipeline group count (its slots differ when devices may idle): the smallest
        // `slots · rate + tail` under `gamma` (GPipe leaves out its backward rate there; for
        // 1F1B it is the time itself), and that plan's backward rate.
        let mut best_partial: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        let mut beta = f64::INFINITY;
        loop {
            let prune_s = if pruning { *best_s } else { f64::INFINITY };
            let obj = Objective::Time {
                beta,
                gamma,
                prune_s,
                tail_floor_s,
            };
            let shape = Shape::new(an, ctx, prune_s - tail_floor_s, true);
            solve(an, ctx, obj, &shape, tables);
            let cells = finals(an, &shape);
            for &(l, k) in &cells {
                let v = value_at(&shape, tables, l, an.empty(), k);
                if !v.is_set() {
                    continue;
                }
                let slots = ctx.slots(k);
                let time_s = slots * (v.rate_s + v.backward_rate_s) + v.tail_s;
                if time_s < *best_s {
                    *best_s = time_s;
                    *best = Some(Best {
                        time_s,
                        ctx: *ctx,
                        parts: reconstruct(an, &shape, tables, l, k),
                    });
                }
                let partial_s = slots * v.rate_s + v.tail_s;
                let entry = best_partial.entry(k).or_insert((f64::INFINITY, 0.0));
                if partial_s < entry.0 {
                    *entry = (partial_s, v.backward_rate_s);
                }
            }
            // A plan beating the best must have a smaller tail than every cell that could
            // still win on its rate alone (against the best, or its group count's smallest
            // rest): tighten the bound to the largest such tail.
            let next_beta = cells
                .iter()
                .map(|&(l, k)| (k, ctx.slots(k), value_at(&shape, tables, l, an.empty(), k)))
                .filter(|(k, slots, v)| {
                    let partial_s = best_partial.get(k).map_or(f64::INFINITY, |p| p.0);
                    v.is_set() && slots * v.rate_s + tail_floor_s < best_s.min(partial_s)
                })
                .map(|(_, _, v)| v.tail_s)
                .fold(f64::NEG_INFINITY, f64::max);
            if next_beta <= 0.0 {
                break;
            }
            beta = next_beta;
        }
        // GPipe: a plan of `k` groups beating the best must have a smaller backward rate than
        // the plan of `k` groups that minimised the rest (the same slots multiply both), so
        // every plan that can still win has a backward rate below the largest of those.
        let next_gamma = best_partial
            .values()
            .map(|&(_, backward_rate_s)| backward_rate_s)
            .fold(f64::NEG_INFINITY, f64::max);
        if gpipe && next_gamma > 0.0 && next_gamma < gamma {
            gamma = next_gamma;
        } else {
            break;
        }
    }
}

/// The exact search of [`super::place`] and [`super::place_faster_than`] for the 1F1B and
/// GPipe schedules: the best plan faster than `bound_s` (`Ok(None)` when a finite bound is not
/// beaten; the closest infeasible plans are only searched for when the bound is infinite).
/// Without `pruning` every (t, d) fills its whole table ([`super::place_exhaustive`]).
pub(crate) fn search(
    problem: &PlacementProblem,
    bound_s: f64,
    pruning: bool,
) -> Result<Option<Plan>, Infeasible> {
    let (ctxs, mut reasons) = widths(problem);
    let mut analyses: Vec<Option<Analysis>> = Vec::new();
    for gi in 0..problem.graphs.len() {
        if ctxs.iter().any(|c| c.graph_index == gi) {
            match Analysis::new(problem, gi) {
                Ok(a) => analyses.push(Some(a)),
                Err(reason) => {
                    reasons.push(reason);
                    analyses.push(None);
                }
            }
        } else {
            analyses.push(None);
        }
    }
    let mut tables = Tables::default();
    let mut best: Option<Best> = None;
    let mut best_s = bound_s;
    let mut considered = Vec::new();
    // Small tables first: they finish fast and give the bound that prunes the large ones.
    let mut order: Vec<usize> = (0..ctxs.len()).collect();
    order.sort_by_key(|&ci| (ctxs[ci].units, ci));
    for ci in order {
        let ctx = &ctxs[ci];
        let Some(an) = &analyses[ctx.graph_index] else {
            continue;
        };
        considered.push(ci);
        tables.divisors.clear();
        prepare_divisors(ctx, &mut tables.divisors);
        if pruning {
            search_widths(an, ctx, &mut tables, &mut best_s, &mut best, true);
        } else {
            // Every (t, d) on its own, its cells all kept: the reference the pruning must match.
            let (mut own_s, mut own) = (bound_s, None);
            search_widths(an, ctx, &mut tables, &mut own_s, &mut own, false);
            if own_s < best_s {
                (best_s, best) = (own_s, own);
            }
        }
    }
    if let Some(b) = best {
        let plan = build_plan(&b.ctx, &b.parts);
        debug_assert!((plan.time_per_batch_s - b.time_s).abs() <= 1e-9 * b.time_s.max(1.0));
        return Ok(Some(plan));
    }
    if bound_s.is_finite() {
        return Ok(None);
    }
    Err(infeasible(
        problem,
        &ctxs,
        &analyses,
        &considered,
        &mut tables,
        reasons,
    ))
}

/// Why no plan fits, with the closest plans: per (t, d), the partition with the smallest
/// largest per-device memory, among pipelines of at most [`MAX_ALTERNATIVE_UNITS`] groups
/// (all of them when none is that small), which bounds the cost of the hint.
fn infeasible(
    problem: &PlacementProblem,
    ctxs: &[Ctx],
    analyses: &[Option<Analysis>],
    considered: &[usize],
    tables: &mut Tables,
    mut reasons: Vec<String>,
) -> Infeasible {
    let mut alternatives = Vec::new();
    let smallest = considered.iter().map(|&ci| ctxs[ci].units).min();
    let limit = smallest.map_or(0, |u| u.max(MAX_ALTERNATIVE_UNITS));
    for &ci in considered.iter().filter(|&&ci| ctxs[ci].units <= limit) {
        let ctx = &ctxs[ci];
        let an = analyses[ctx.graph_index].as_ref().expect("considered");
        let shape = Shape::new(an, ctx, f64::INFINITY, false);
        tables.divisors.clear();
        prepare_divisors(ctx, &mut tables.divisors);
        solve(an, ctx, Objective::Memory, &shape, tables);
        let best_cell = finals(an, &shape)
            .into_iter()
            .map(|(l, k)| (value_at(&shape, tables, l, an.empty(), k).rate_s, l, k))
            .filter(|c| c.0.is_finite())
            .fold(None, |acc: Option<(f64, usize, u32)>, c| match acc {
                Some(a) if a.0 <= c.0 => Some(a),
                _ => Some(c),
            });
        if let Some((_, l, k)) = best_cell {
            let parts = reconstruct(an, &shape, tables, l, k);
            let plan = build_plan(ctx, &parts);
            let (worst_stage, overshoot_bytes) = worst_stage(&plan, problem.hbm_bytes);
            alternatives.push(Alternative {
                plan,
                worst_stage,
                overshoot_bytes,
            });
        }
    }
    alternatives.sort_by(|a, b| {
        a.overshoot_bytes
            .cmp(&b.overshoot_bytes)
            .then(a.plan.time_per_batch_s.total_cmp(&b.plan.time_per_batch_s))
    });
    alternatives.truncate(3);
    if let Some(best_alt) = alternatives.first() {
        reasons.push(memory_reason(
            &best_alt.plan,
            best_alt.worst_stage,
            problem.hbm_bytes,
        ));
    } else if reasons.is_empty() {
        reasons.push(
            "no combination of tensor width, data-parallel width and stage count is allowed \
             by the constraints and the device count"
                .into(),
        );
    }
    Infeasible {
        reasons,
        alternatives,
    }
}

#[cfg(test)]
mod tests {
    use super::first_below;
    use proptest::prelude::*;

    proptest! {
        /// The windows' search finds the first group count whose (falling) bound is below the
        /// pruning bound, as a scan would: no cell it leaves out could beat the bound.
        #[test]
        fn first_below_finds_the_first_group_count_under_the_bound(
            work in 0.0f64..100.0,
            extra in 0.0f64..10.0,
            from in 0u32..50,
            span in 0u32..200,
            prune in 0.01f64..50.0,
        ) {
            let to = from + span;
            let bound = |k: u32| extra + work / f64::from(k.max(1));
            let scan = (from..=to).find(|&k| bound(k) < prune).unwrap_or(to + 1);
            prop_assert_eq!(first_below(from, to, prune, bound), scan);
        }
    }
}
