//! The downset dynamic programme.
//!
//! `F[s][D][K]` is the best way to place the layers *not* in downset `D` into `s` stages that
//! use exactly `K` tensor groups: the lexicographically smallest (largest `load / k`, largest
//! exposed all-reduce). Filling it from the end of the model means the first stage of the
//! remainder is always the `s`-th from the end, which fixes its in-flight micro-batches (and so
//! its memory) without knowing the total stage count; one table serves every `p`.
//!
//! Speed comes from storing only the cells that can still beat the best time so far
//! ([`Shape`]): work lower bounds inside and outside each downset leave each (s, D) a narrow
//! window of `K`, rows whose remaining weights and optimizer state exceed `s · HBM` are
//! empty, and a layer of rows past the bubble the bound allows ends the table. Every cell
//! left out is one the full table leaves empty or drops against the bound, so the best
//! cell, the plan rebuilt from it and the all-reduce bounds are the full table's, bit for
//! bit. Chains (an edge from every layer to the next) get their stage metrics as running
//! sums in the order the general longest-path code adds them, and each stage's per-replica
//! costs are computed once for all positions.

use super::model::{
    build_plan, chain_stage_metrics, is_chain, memory_reason, predecessors, stage_metrics, widths,
    worst_stage, Ctx, PartStage, StageMetrics,
};
use super::{Alternative, Infeasible, PlacementProblem, Plan};
use std::collections::HashMap;
use std::ops::RangeInclusive;

/// Downsets beyond this many make the table too large; such graphs are reported infeasible.
pub(crate) const MAX_DOWNSETS: usize = 4096;
/// Largest pipeline (in tensor groups) searched for the closest infeasible plans.
const MAX_ALTERNATIVE_UNITS: u32 = 128;
/// Fewest stage options for which the crossing walk beats trying every option (its checks
/// cost more than a few options do).
const MIN_WALK_OPTIONS: usize = 8;
/// Relative margin taken off the work lower bounds to absorb floating-point rounding.
const WORK_MARGIN: f64 = 1e-9;

/// A stage candidate: the layers between downset `from` (implicit) and downset `to`.
struct Pair {
    to: usize,
    metrics: StageMetrics,
    /// Lower bound on the stage's load (its forward and backward time, less the rounding margin).
    work_s: f64,
    /// Fits in memory with the most favourable sharding and a single in-flight micro-batch;
    /// stages that never fit are kept only for the closest-infeasible-plan search.
    may_fit: bool,
}

/// Downsets of one graph and every stage between two of them.
pub(crate) struct Analysis {
    /// Membership bitsets, in order of size (the empty set first, all layers last).
    downsets: Vec<Vec<u64>>,
    /// Layers outside each downset.
    suffix_len: Vec<u32>,
    /// Least weights, gradients and optimizer state, summed over the devices of one copy of
    /// each stage, of any stages holding the layers outside each downset: `s` stages of at
    /// most HBM each hold no more than `s · HBM`.
    state_outside_bytes: Vec<u128>,
    /// Stages that can follow each downset.
    pairs: Vec<Vec<Pair>>,
    /// Lower bounds on the summed stage loads of any partition of the layers inside / outside
    /// each downset: forward plus backward critical path (a longest path crosses the stages in
    /// order, so the stages' own critical paths add up to at least it).
    work_inside_s: Vec<f64>,
    work_outside_s: Vec<f64>,
    /// One micro-batch's gradient accumulation of the layers inside / outside each downset.
    accumulation_inside_s: Vec<f64>,
    accumulation_outside_s: Vec<f64>,
}

fn contains(set: &[u64], v: usize) -> bool {
    set[v / 64] >> (v % 64) & 1 == 1
}

/// All downsets of a graph (breadth first from the empty set, so sorted by size), or `None`
/// when there are more than `limit`.
pub(crate) fn downsets(n: usize, preds: &[Vec<usize>], limit: usize) -> Option<Vec<Vec<u64>>> {
    let words = n.div_ceil(64);
    let mut all = vec![vec![0u64; words]];
    let mut index: HashMap<Vec<u64>, usize> = HashMap::new();
    index.insert(all[0].clone(), 0);
    let mut next = 0;
    while next < all.len() {
        let current = all[next].clone();
        next += 1;
        for v in 0..n {
            if contains(&current, v) || !preds[v].iter().all(|&u| contains(&current, u)) {
                continue;
            }
            let mut grown = current.clone();
            grown[v / 64] |= 1 << (v % 64);
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
/// a bound built from it exceed a load summed in another order.
fn work_s(sm: &StageMetrics) -> f64 {
    (sm.fwd_s + sm.bwd_s) * (1.0 - WORK_MARGIN)
}

/// Smallest `k` in `from..=units` with which `c` pipeline slots of `work_s` (from [`work_s`])
/// and `accumulation_s` of gradient accumulation stay below `prune_s`, `units + 1` when none.
/// Shared by `k` groups, the load per group is at least `(work + accumulation · (1 − k/m)) / k`
/// (each group adds its gradients for all but the first of its micro-batches, and a stage of
/// several groups sums them), which is below `prune_s / c` exactly when
/// `(work + accumulation) · c < k · (prune_s + accumulation · c / m)`.
fn first_below(
    work_s: f64,
    accumulation_s: f64,
    c: f64,
    m: u64,
    prune_s: f64,
    from: u32,
    units: u32,
) -> u32 {
    let bound_s = (work_s + accumulation_s * (1.0 - WORK_MARGIN)) * c;
    first_above(
        bound_s,
        prune_s + accumulation_s * c / m as f64,
        from,
        units,
    )
}

impl Analysis {
    /// Enumerates downsets and the metrics of every stage between two of them.
    pub(crate) fn new(problem: &PlacementProblem, graph_index: usize) -> Result<Self, String> {
        let graph = &problem.graphs[graph_index];
        let n = graph.layers.len();
        let preds = predecessors(n, &graph.edges);
        let downsets = downsets(n, &preds, MAX_DOWNSETS).ok_or_else(|| {
            format!(
                "t={}: the layer graph has more than {MAX_DOWNSETS} downsets (too many parallel \
                 branches to enumerate stages)",
                graph.tp
            )
        })?;
        let count = |set: &Vec<u64>| set.iter().map(|w| w.count_ones()).sum::<u32>();
        let suffix_len: Vec<u32> = downsets.iter().map(|s| n as u32 - count(s)).collect();
        let bpp = &problem.bytes_per_param;
        let max_shard = if problem.zero1 {
            u64::from(problem.devices / graph.tp).max(1)
        } else {
            1
        };
        let mut dist = vec![0.0; n];
        let mut before = vec![false; n];
        let mut in_stage = vec![false; n];
        let mut pairs = Vec::with_capacity(downsets.len());
        let least_bytes = |sm: &StageMetrics| {
            sm.params * u64::from(bpp.weights + bpp.grads)
                + (sm.params * u64::from(bpp.optimizer)).div_ceil(max_shard)
                + sm.act_one
        };
        let chain = is_chain(&preds);
        if chain {
            // Downset `i` is the first `i` layers (breadth first from the empty set).
            let mut incoming = vec![Vec::new(); n];
            for &(from, to, bytes) in &graph.edges {
                incoming[to].push((from, bytes));
            }
            for first in 0..n {
                let stages = chain_stage_metrics(problem, graph_index, &incoming, first);
                let list = (first + 1..=n).zip(stages).map(|(to, metrics)| Pair {
                    to,
                    metrics,
                    work_s: work_s(&metrics),
                    may_fit: least_bytes(&metrics) <= problem.hbm_bytes,
                });
                pairs.push(list.collect());
            }
            pairs.push(Vec::new());
        }
        for from in downsets.iter().skip(pairs.len()) {
            let mut list = Vec::new();
            for (v, b) in before.iter_mut().enumerate() {
                *b = contains(from, v);
            }
            for (to, set) in downsets.iter().enumerate() {
                let superset = set.iter().zip(from).all(|(s, f)| s & f == *f) && set != from;
                if !superset {
                    continue;
                }
                for (v, x) in in_stage.iter_mut().enumerate() {
                    *x = contains(set, v) && !before[v];
                }
                let metrics =
                    stage_metrics(problem, graph_index, &preds, &in_stage, &before, &mut dist);
                list.push(Pair {
                    to,
                    metrics,
                    work_s: work_s(&metrics),
                    may_fit: least_bytes(&metrics) <= problem.hbm_bytes,
                });
            }
            pairs.push(list);
        }
        // Per-stage rounding up of sharded optimizer state only adds to the sum.
        let state_outside_bytes = downsets
            .iter()
            .map(|set| {
                let params: u128 = (0..n)
                    .filter(|&v| !contains(set, v))
                    .map(|v| u128::from(graph.layers[v].params))
                    .sum();
                params * u128::from(bpp.weights + bpp.grads)
                    + (params * u128::from(bpp.optimizer)).div_ceil(u128::from(max_shard))
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
            let mut work = |set: &Vec<u64>, inside: bool| {
                for (v, x) in in_stage.iter_mut().enumerate() {
                    *x = contains(set, v) == inside;
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
            suffix_len,
            state_outside_bytes,
            pairs,
            work_inside_s: side(0, |b| b.0),
            work_outside_s: side(1, |b| b.0),
            accumulation_inside_s: side(0, |b| b.1),
            accumulation_outside_s: side(1, |b| b.1),
        })
    }

    fn empty(&self) -> usize {
        0
    }

    fn full(&self) -> usize {
        self.downsets.len() - 1
    }
}

/// What the programme minimises.
#[derive(Clone, Copy)]
enum Objective {
    /// Bottleneck `load / k`, then exposed all-reduce; stages must fit in memory and have an
    /// exposed all-reduce below `beta`; partial plans that cannot beat `best_s` are dropped.
    Time { beta: f64, best_s: f64 },
    /// Largest per-device memory (for the closest infeasible plans).
    Memory,
}

/// One way to run a stage: `k` replicas, its value and its exposed all-reduce.
#[derive(Clone, Copy)]
struct Opt {
    k: u32,
    value: f64,
    e: f64,
}

/// What `k` replicas of a stage cost wherever the stage sits in the pipeline.
#[derive(Clone, Copy, Default)]
struct Replica {
    /// The stage this entry belongs to ([`ReplicaCache::stamp`]); others are recomputed.
    stamp: u32,
    /// `load / k`.
    value: f64,
    /// Exposed all-reduce.
    e: f64,
    /// Weights, gradients and optimizer state per device.
    state_bytes: u64,
}

/// The replica choices of the stage being extended, computed on first use and reused for
/// every position (stages to go) the stage is tried at.
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
            let [weights, grads, optimizer] = ctx.state_bytes(sm, k);
            *entry = Replica {
                stamp: self.stamp,
                value: ctx.load_s(sm, k) / f64::from(k),
                e: ctx.dp_comm_s(sm, k),
                state_bytes: weights + grads + optimizer,
            };
        }
        *entry
    }
}

/// Table storage reused across (t, d) and bound iterations.
#[derive(Default)]
struct Tables {
    value: Vec<f64>,
    e: Vec<f64>,
    opts: Vec<Opt>,
    replicas: ReplicaCache,
}

/// The table's cells: per (stages to go `s`, downset `D`) the window of group counts `K` that
/// can still lead to a plan faster than the bound, stored one window after another.
///
/// A plan through (s, D, K) has bottleneck `L ≥ work outside D / K` and, as the stages before
/// D share the other `units − K` groups, `L ≥ work inside D / (units − K)`; with at least
/// `c = m + s − 1` pipeline slots its time is at least `L · c`. Cells whose bound reaches the
/// best time so far are left out: every value they could hold is one the full table drops
/// anyway (its load already reaches the bound), so the result is the full table's.
struct Shape {
    downsets: usize,
    s_max: u32,
    /// First and last `K` of each (s, D) window; empty when `lo > hi`.
    lo: Vec<u32>,
    hi: Vec<u32>,
    /// Index of each window's first cell.
    offset: Vec<usize>,
    cells: usize,
    /// Per downset, the first and last `s ≥ 1` whose window is not empty.
    s_span: Vec<(u32, u32)>,
}

impl Shape {
    /// Cells for plans faster than `prune_s`, which must fit in memory when `fit` (the
    /// closest-infeasible search does without).
    fn new(an: &Analysis, ctx: &Ctx, s_max: u32, prune_s: f64, fit: bool) -> Self {
        let downsets = an.downsets.len();
        let rows = (s_max as usize + 1) * downsets;
        let (mut lo, mut hi, mut offset) = (
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
            Vec::with_capacity(rows),
        );
        let units = ctx.units;
        let hbm_bytes = u128::from(ctx.problem.hbm_bytes);
        let mut cells = 0;
        let mut live_s_max = 0;
        for s in 0..=s_max {
            // Windows shrink as s grows (more pipeline slots): after an empty layer, all are.
            if s > live_s_max + 1 {
                break;
            }
            let c = ctx.m as f64 + f64::from(s.max(1) - 1);
            for d in 0..downsets {
                let (mut first, mut last) = (1, 0);
                if s == 0 {
                    if d == an.full() {
                        (first, last) = (0, 0);
                    }
                } else if an.suffix_len[d] >= s {
                    let m = ctx.m;
                    let (work, accumulation) = (an.work_outside_s[d], an.accumulation_outside_s[d]);
                    first = first_below(work, accumulation, c, m, prune_s, s, units);
                    // The stages before D need `units − K` groups with the same bound.
                    let before = if d == an.empty() {
                        0
                    } else {
                        let (work, accumulation) =
                            (an.work_inside_s[d], an.accumulation_inside_s[d]);
                        first_below(work, accumulation, c, m, prune_s, 1, units)
                    };
                    last = units.saturating_sub(before);
                    if first <= last {
                        live_s_max = s;
                    }
                    // Fewer stages than the state needs cannot fit (more may, so this does
                    // not end the layers).
                    if fit && u128::from(s) * hbm_bytes < an.state_outside_bytes[d] {
                        (first, last) = (1, 0);
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
        let s_max = live_s_max;
        let mut s_span = vec![(1, 0); downsets];
        for s in 1..=s_max {
            for (d, span) in s_span.iter_mut().enumerate() {
                let r = s as usize * downsets + d;
                if lo[r] <= hi[r] {
                    *span = if span.0 > span.1 { (s, s) } else { (span.0, s) };
                }
            }
        }
        Shape {
            downsets,
            s_max,
            lo,
            hi,
            offset,
            cells,
            s_span,
        }
    }

    fn row(&self, s: u32, d: usize) -> usize {
        s as usize * self.downsets + d
    }

    /// The `K` window of (s, D), possibly empty (always beyond `s_max`).
    fn window(&self, s: u32, d: usize) -> (u32, u32) {
        if s > self.s_max {
            return (1, 0);
        }
        let r = self.row(s, d);
        (self.lo[r], self.hi[r])
    }

    /// Index of cell (s, D, K), `None` outside its window.
    fn at(&self, s: u32, d: usize, k: u32) -> Option<usize> {
        let (lo, hi) = self.window(s, d);
        (lo <= k && k <= hi).then(|| self.offset[self.row(s, d)] + (k - lo) as usize)
    }
}

/// Smallest `k` in `from..=units` with `bound_s < prune_s · k`, `units + 1` when none: the
/// fewest groups that share `bound_s` of work below `prune_s`.
fn first_above(bound_s: f64, prune_s: f64, from: u32, units: u32) -> u32 {
    // The quotient is within one of the answer; the exact comparison settles it.
    let mut k = (bound_s / prune_s)
        .min(f64::from(units))
        .max(f64::from(from)) as u32;
    while k > from && bound_s < prune_s * f64::from(k - 1) {
        k -= 1;
    }
    while k <= units && bound_s >= prune_s * f64::from(k) {
        k += 1;
    }
    k
}

/// Fills `opts` with the ways to run stage `pair` as the `s`-th stage from the end with `k` in
/// `ks`; `k_all` is the number of tensor groups left for it, and every `k ≥ k_fit` is known
/// to fit in memory. `replicas` holds this stage.
#[allow(clippy::too_many_arguments)]
fn options(
    ctx: &Ctx,
    obj: Objective,
    pair: &Pair,
    s: u32,
    ks: RangeInclusive<u32>,
    k_all: u32,
    k_fit: u32,
    replicas: &mut ReplicaCache,
    opts: &mut Vec<Opt>,
) {
    opts.clear();
    let hbm = ctx.problem.hbm_bytes;
    let sm = &pair.metrics;
    let c_min = ctx.m as f64 + f64::from(s - 1);
    if matches!(obj, Objective::Time { .. }) && !pair.may_fit {
        return;
    }
    for k in ks {
        match obj {
            Objective::Time { beta, best_s } => {
                let r = replicas.get(ctx, sm, k);
                // The same sum, in the same order, as `Ctx::memory`.
                if k < k_fit && r.state_bytes + sm.act_one + ctx.stash_bytes(sm, k, s) > hbm {
                    continue;
                }
                // No larger k can pass the bound either, unless more replicas in a node drive
                // more of its links.
                if r.e >= beta {
                    if ctx.all_reduce_grows_with_replicas() {
                        break;
                    }
                    continue;
                }
                if r.value * c_min >= best_s {
                    continue;
                }
                opts.push(Opt {
                    k,
                    value: r.value,
                    e: r.e,
                });
            }
            // A hint, not an optimum: one replica, or as many as are left (least stash per
            // device), keeps this pass linear in the device count.
            Objective::Memory if k == 1 || k == k_all => opts.push(Opt {
                k,
                value: ctx.memory(sm, k, s).total as f64,
                e: 0.0,
            }),
            Objective::Memory => {}
        }
    }
}

/// Whether `k` replicas of a stage fit in memory as the `s`-th stage from the end.
fn fits(ctx: &Ctx, sm: &StageMetrics, k: u32, s: u32) -> bool {
    ctx.memory(sm, k, s).total <= ctx.problem.hbm_bytes
}

fn better(v: f64, e: f64, than_v: f64, than_e: f64) -> bool {
    v < than_v || (v == than_v && e < than_e)
}

fn prune_s(obj: Objective) -> f64 {
    match obj {
        Objective::Time { best_s, .. } => best_s,
        Objective::Memory => f64::INFINITY,
    }
}

/// Fills the table. Downsets go from the largest down, each stage after a downset is tried at
/// every position `s` in turn (so its per-replica costs are computed once), and every cell
/// sees its candidates in the same order as a row-by-row fill: stage, then `k`.
fn solve(an: &Analysis, ctx: &Ctx, obj: Objective, shape: &Shape, t: &mut Tables) {
    let Tables {
        value,
        e: exposed,
        opts,
        replicas,
    } = t;
    value.clear();
    value.resize(shape.cells, f64::INFINITY);
    exposed.clear();
    exposed.resize(shape.cells, f64::INFINITY);
    let base = shape
        .at(0, an.full(), 0)
        .expect("the empty remainder is a cell");
    value[base] = 0.0;
    exposed[base] = 0.0;
    replicas.reset(ctx.units);
    let units = ctx.units;
    let prune_s = prune_s(obj);
    let time = matches!(obj, Objective::Time { .. });
    for d in (0..shape.downsets).rev() {
        let (s_first, s_last) = shape.s_span[d];
        if s_first > s_last {
            continue;
        }
        for pair in &an.pairs[d] {
            if time && !pair.may_fit {
                continue;
            }
            // Positions whose remainder (s − 1 stages after this one) has cells.
            let (rest_first, rest_last) = if pair.to == an.full() {
                (0, 0)
            } else {
                let span = shape.s_span[pair.to];
                (span.0.max(1), span.1)
            };
            replicas.next_stage();
            // Fewest replicas that fit in memory, and that keep the stage's work below the
            // bound: both only grow with s (more in flight, more pipeline slots).
            let mut k_fit = 1;
            let mut k_work = 0;
            for s in s_first.max(rest_first + 1)..=s_last.min(rest_last + 1) {
                let rest = s - 1;
                let (lo, hi) = shape.window(s, d);
                let (clo, chi) = shape.window(rest, pair.to);
                if lo > hi || clo > chi || hi <= clo {
                    continue;
                }
                let c_min = ctx.m as f64 + f64::from(s - 1);
                // K = k + K' must lie in this window with K' in the remainder's.
                let k_to = hi - clo;
                // The trackers are lower bounds for every later s too: test them as they
                // stand before tightening them.
                let k_from = lo.saturating_sub(chi).max(k_work).max(k_fit);
                if k_from > k_to {
                    continue;
                }
                // As in `first_below`: the stage's load per replica is at least
                // (work + accumulation · (1 − k/m)) / k.
                let accumulation_s = pair.metrics.grad_accumulation_s;
                let bound_s = (pair.work_s + accumulation_s * (1.0 - WORK_MARGIN)) * c_min;
                let prune_k_s = prune_s + accumulation_s * c_min / ctx.m as f64;
                if k_work == 0 {
                    k_work = first_above(bound_s, prune_k_s, 1, k_to);
                }
                while k_work <= k_to && bound_s >= prune_k_s * f64::from(k_work) {
                    k_work += 1;
                }
                if time {
                    while k_fit <= k_to && !fits(ctx, &pair.metrics, k_fit, s) {
                        k_fit += 1;
                    }
                }
                let k_from = k_from.max(k_work).max(k_fit);
                if k_from > k_to {
                    continue;
                }
                let ks = k_from..=k_to;
                options(ctx, obj, pair, s, ks, units - rest, k_fit, replicas, opts);
                // The remainder's row (fewer stages to go) lies before this one.
                let row = shape.offset[shape.row(s, d)];
                let prev = shape.offset[shape.row(rest, pair.to)]..;
                let (done_v, todo_v) = value.split_at_mut(row);
                let (done_e, todo_e) = exposed.split_at_mut(row);
                let (prev_v, prev_e) = (&done_v[prev.clone()], &done_e[prev]);
                let rows = Rows {
                    lo,
                    hi,
                    clo,
                    chi,
                    c_min,
                    prune_s,
                };
                let prev = (
                    &prev_v[..=(chi - clo) as usize],
                    &prev_e[..=(chi - clo) as usize],
                );
                let cur = (
                    &mut todo_v[..=(hi - lo) as usize],
                    &mut todo_e[..=(hi - lo) as usize],
                );
                combine(&rows, opts, prev, cur);
            }
        }
    }
}

/// The window of the row being filled (`K` in `lo..=hi`, `s` stages to go) and of the
/// remainder's row (`K'` in `clo..=chi`), with the pipeline slots and bound that prune.
struct Rows {
    lo: u32,
    hi: u32,
    clo: u32,
    chi: u32,
    c_min: f64,
    prune_s: f64,
}

/// Every way to run the stage (`opts`) before every remainder (`prev`, indexed by
/// `K' − clo`) into the row's cells (`cur`, indexed by `K − lo`): by the crossing walk when
/// [`walkable`], else by trying every option on every cell. Both give the same cells.
fn combine(rows: &Rows, opts: &[Opt], prev: (&[f64], &[f64]), cur: (&mut [f64], &mut [f64])) {
    if walkable(opts, prev.0) {
        combine_walk(rows, opts, prev, cur);
    } else {
        combine_every(rows, opts, prev, cur);
    }
}

/// The stage's values fall with `k` and the remainder's with `K'`, and there are enough
/// options for the walk to pay off.
fn walkable(opts: &[Opt], prev_v: &[f64]) -> bool {
    opts.len() >= MIN_WALK_OPTIONS
        && opts.windows(2).all(|w| w[1].value <= w[0].value)
        && prev_v.windows(2).all(|w| w[1] <= w[0])
}

/// Each option on each cell it reaches, in stage-then-`k` order.
fn combine_every(
    rows: &Rows,
    opts: &[Opt],
    (prev_v, prev_e): (&[f64], &[f64]),
    (todo_v, todo_e): (&mut [f64], &mut [f64]),
) {
    for opt in opts {
        // K = opt.k + K' for K in first..=last.
        let (first, last) = (rows.lo.max(opt.k + rows.clo), rows.hi.min(opt.k + rows.chi));
        if first > last {
            continue;
        }
        let cur = (first - rows.lo) as usize..=(last - rows.lo) as usize;
        let from = (first - opt.k - rows.clo) as usize..;
        let cur_cells = todo_v[cur.clone()].iter_mut().zip(&mut todo_e[cur]);
        let prev_cells = prev_v[from.clone()].iter().zip(&prev_e[from]);
        for ((cv, ce), (&pv, &pe)) in cur_cells.zip(prev_cells) {
            // An empty remainder (infinite value) fails this too.
            let v = opt.value.max(pv);
            if v * rows.c_min >= rows.prune_s {
                continue;
            }
            let e = opt.e.max(pe);
            if better(v, e, *cv, *ce) {
                *cv = v;
                *ce = e;
            }
        }
    }
}

/// [`combine_every`] in O(cells + options + ties) on [`walkable`] input: each cell takes the
/// smallest `max(value_k, prev[K − k])` over `k`, the maximum of a falling and a rising
/// sequence, which is smallest where they cross; the crossing moves one way as `K` grows.
/// The options that tie at that minimum are contiguous around the crossing, and the cell
/// gets the least exposed all-reduce among them, tested the same way.
fn combine_walk(
    rows: &Rows,
    opts: &[Opt],
    (prev_v, prev_e): (&[f64], &[f64]),
    (todo_v, todo_e): (&mut [f64], &mut [f64]),
) {
    let at = |i: usize, big_k: u32| (big_k - opts[i].k - rows.clo) as usize;
    let value = |i: usize, big_k: u32| opts[i].value.max(prev_v[at(i, big_k)]);
    // Without exposed all-reduce (free links, or an all-reduce hidden behind the backward
    // pass) every tie has the same exposure: no need to look for the least. (An empty
    // remainder's infinite exposure comes with an infinite value, which is pruned.)
    let unexposed =
        opts.iter().all(|o| o.e == 0.0) && prev_e.iter().all(|&e| e == 0.0 || e == f64::INFINITY);
    // Options whose remainder K − k lies in clo..=chi are opts[first..end]; both ends and the
    // crossing only move right as K grows (a larger K meets smaller remainders).
    let (mut first, mut end, mut cross) = (0, 0, 0);
    for big_k in rows.lo..=rows.hi {
        while first < opts.len() && opts[first].k + rows.chi < big_k {
            first += 1;
        }
        while end < opts.len() && opts[end].k + rows.clo <= big_k {
            end += 1;
        }
        if first >= end {
            continue;
        }
        // Options before the crossing are bound by their own value, those after by the
        // remainder's: the minimum is at one of the two options around it.
        cross = cross.max(first);
        while cross < end && opts[cross].value > prev_v[at(cross, big_k)] {
            cross += 1;
        }
        let (v, best) = [
            cross.checked_sub(1).filter(|&i| i >= first),
            (cross < end).then_some(cross),
        ]
        .into_iter()
        .flatten()
        .map(|i| (value(i, big_k), i))
        .fold((f64::INFINITY, end), |a, b| if b.0 < a.0 { b } else { a });
        if v * rows.c_min >= rows.prune_s {
            continue;
        }
        let e = if unexposed {
            0.0
        } else {
            let ties = |i: &usize| value(*i, big_k) == v;
            let left = (first..best).rev().take_while(ties).last().unwrap_or(best);
            let right = (best + 1..end).take_while(ties).last().unwrap_or(best);
            (left..=right)
                .map(|i| opts[i].e.max(prev_e[at(i, big_k)]))
                .fold(f64::INFINITY, f64::min)
        };
        let cell = (big_k - rows.lo) as usize;
        if better(v, e, todo_v[cell], todo_e[cell]) {
            todo_v[cell] = v;
            todo_e[cell] = e;
        }
    }
}

/// Value and exposed all-reduce of cell (s, D, K); infinite outside the table.
fn cell(shape: &Shape, t: &Tables, s: u32, d: usize, k: u32) -> (f64, f64) {
    shape
        .at(s, d, k)
        .map_or((f64::INFINITY, f64::INFINITY), |at| (t.value[at], t.e[at]))
}

/// Walks the filled table back from (p stages, all layers, K groups) to a partition.
fn reconstruct(
    an: &Analysis,
    ctx: &Ctx,
    obj: Objective,
    shape: &Shape,
    t: &mut Tables,
    p: u32,
    k_total: u32,
) -> Vec<PartStage> {
    let n = ctx.problem.graphs[ctx.graph_index].layers.len();
    let mut parts = Vec::with_capacity(p as usize);
    let (mut d, mut k_left) = (an.empty(), k_total);
    for s in (1..=p).rev() {
        let (v, e) = cell(shape, t, s, d, k_left);
        let rest = s - 1;
        let mut found = None;
        'search: for pair in &an.pairs[d] {
            if (rest == 0) != (pair.to == an.full()) || an.suffix_len[pair.to] < rest {
                continue;
            }
            // Only replica counts that leave the remainder a cell of its window can match.
            let (clo, chi) = shape.window(rest, pair.to);
            if clo > chi || k_left <= clo {
                continue;
            }
            t.replicas.next_stage();
            options(
                ctx,
                obj,
                pair,
                s,
                k_left.saturating_sub(chi).max(1)..=k_left - clo,
                ctx.units - rest,
                u32::MAX,
                &mut t.replicas,
                &mut t.opts,
            );
            for opt in &t.opts {
                let (pv, pe) = cell(shape, t, rest, pair.to, k_left - opt.k);
                if opt.value.max(pv) == v && opt.e.max(pe) == e {
                    found = Some((pair, opt.k));
                    break 'search;
                }
            }
        }
        let (pair, k) = found.expect("a stored table entry has a predecessor");
        let layers = (0..n)
            .filter(|&l| contains(&an.downsets[pair.to], l) && !contains(&an.downsets[d], l))
            .collect();
        parts.push(PartStage {
            layers,
            metrics: pair.metrics,
            replicas: k,
        });
        d = pair.to;
        k_left -= k;
    }
    parts
}

/// The (p, K) cells a final plan may come from.
fn finals(ctx: &Ctx, shape: &Shape) -> Vec<(u32, u32)> {
    let problem = ctx.problem;
    let stage_counts: Vec<u32> = match problem.constraints.pp {
        Some(pp) => vec![pp],
        None => (1..=shape.s_max).collect(),
    };
    let mut cells = Vec::new();
    for p in stage_counts {
        if problem.allow_idle_devices {
            cells.extend((p..=ctx.units).map(|k| (p, k)));
        } else if p <= ctx.units {
            cells.push((p, ctx.units));
        }
    }
    cells
}

struct Best {
    time_s: f64,
    ctx_index: usize,
    parts: Vec<PartStage>,
}

/// The exact search of [`super::place`] and [`super::place_faster_than`]: the best plan
/// faster than `bound_s` (`Ok(None)` when a finite bound is not beaten; the closest
/// infeasible plans are only searched for when the bound is infinite).
pub(crate) fn search(problem: &PlacementProblem, bound_s: f64) -> Result<Option<Plan>, Infeasible> {
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
    let n = problem.graphs[0].layers.len() as u32;
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
        let s_max = problem.constraints.pp.unwrap_or(n).min(n).min(ctx.units);
        if problem.constraints.pp.is_some_and(|pp| pp > s_max) {
            continue;
        }
        considered.push((ci, s_max));
        let mut beta = f64::INFINITY;
        loop {
            let obj = Objective::Time { beta, best_s };
            let shape = Shape::new(an, ctx, s_max, best_s, true);
            solve(an, ctx, obj, &shape, &mut tables);
            let cells = finals(ctx, &shape);
            let mut improved = None;
            for &(p, k) in &cells {
                let (v, e) = cell(&shape, &tables, p, an.empty(), k);
                let time_s = v * (ctx.m as f64 + f64::from(p - 1)) + e + ctx.optimizer_s(p);
                if time_s < best_s {
                    best_s = time_s;
                    improved = Some((p, k));
                }
            }
            if let Some((p, k)) = improved {
                let parts = reconstruct(an, ctx, obj, &shape, &mut tables, p, k);
                best = Some(Best {
                    time_s: best_s,
                    ctx_index: ci,
                    parts,
                });
            }
            // A plan beating the best must have a smaller exposed all-reduce than every cell
            // that could still win on load (and its optimizer step) alone: tighten the bound to
            // the largest such one.
            let next_beta = cells
                .iter()
                .map(|&(p, k)| {
                    let (v, e) = cell(&shape, &tables, p, an.empty(), k);
                    let c = ctx.m as f64 + f64::from(p - 1);
                    (v * c + ctx.optimizer_s(p), e)
                })
                .filter(|&(bound, _)| bound < best_s)
                .map(|(_, e)| e)
                .fold(f64::NEG_INFINITY, f64::max);
            if next_beta <= 0.0 {
                break;
            }
            beta = next_beta;
        }
    }
    if let Some(b) = best {
        let plan = build_plan(&ctxs[b.ctx_index], &b.parts);
        debug_assert!((plan.time_per_batch_s - b.time_s).abs() <= 1e-9 * b.time_s.max(1.0));
        return Ok(Some(plan));
    }
    if bound_s.is_finite() {
        return Ok(None);
    }
    let mut alternatives = Vec::new();
    // The closest infeasible plans are searched among pipelines of at most this many tensor
    // groups (all of them when none is that small), which bounds the cost of the hint.
    let smallest = considered.iter().map(|&(ci, _)| ctxs[ci].units).min();
    let limit = smallest.map_or(0, |u| u.max(MAX_ALTERNATIVE_UNITS));
    for &(ci, s_max) in considered
        .iter()
        .filter(|&&(ci, _)| ctxs[ci].units <= limit)
    {
        let ctx = &ctxs[ci];
        let an = analyses[ctx.graph_index].as_ref().expect("considered");
        let shape = Shape::new(an, ctx, s_max, f64::INFINITY, false);
        solve(an, ctx, Objective::Memory, &shape, &mut tables);
        let best_cell = finals(ctx, &shape)
            .into_iter()
            .map(|(p, k)| (cell(&shape, &tables, p, an.empty(), k).0, p, k))
            .filter(|c| c.0 < f64::INFINITY)
            .fold(None, |acc: Option<(f64, u32, u32)>, c| match acc {
                Some(a) if a.0 <= c.0 => Some(a),
                _ => Some(c),
            });
        if let Some((_, p, k)) = best_cell {
            let parts = reconstruct(an, ctx, Objective::Memory, &shape, &mut tables, p, k);
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
    Err(Infeasible {
        reasons,
        alternatives,
    })
}

#[cfg(test)]
mod tests {
    use super::{
        combine_every, combine_walk, first_below, walkable, Opt, Rows, MIN_WALK_OPTIONS,
        WORK_MARGIN,
    };
    use proptest::prelude::*;

    proptest! {
        /// `first_below` leaves out exactly the group counts whose load bound, with each of
        /// the `k` groups adding its gradients for all but its first of `m / k` micro-batches,
        /// reaches the pruning bound over `c` slots: every smaller `k` is pruned soundly and
        /// the count it returns is not.
        #[test]
        fn first_below_prunes_only_group_counts_that_cannot_beat_the_bound(
            work_s in 0.0f64..10.0,
            accumulation_s in 0.0f64..10.0,
            m in 1u64..64,
            extra_slots in 0u64..8,
            prune_s in 0.1f64..200.0,
            units in 1u32..80,
        ) {
            let c = (m + extra_slots) as f64;
            let k0 = first_below(work_s, accumulation_s, c, m, prune_s, 1, units);
            let load = |k: u32| {
                (work_s + accumulation_s * (1.0 - WORK_MARGIN) * (1.0 - f64::from(k) / m as f64))
                    / f64::from(k)
            };
            for k in 1..k0.min(units + 1) {
                prop_assert!(load(k) * c >= prune_s * (1.0 - 1e-12), "k {k} pruned");
            }
            if k0 <= units {
                prop_assert!(load(k0) * c < prune_s * (1.0 + 1e-12), "k {k0} kept");
            }
        }
    }

    /// Falling values (some infinite at the front when `inf_front`), as [`walkable`]
    /// requires of the remainder's row and of the stage's options.
    fn falling(mut values: Vec<f64>, inf_front: usize) -> Vec<f64> {
        values.sort_by(|a, b| b.total_cmp(a));
        for v in values.iter_mut().take(inf_front) {
            *v = f64::INFINITY;
        }
        values
    }

    proptest! {
        /// On inputs it accepts, the crossing walk fills the cells bit for bit as the general
        /// every-option-every-cell loop does, ties (of values, then of exposed all-reduce) and
        /// pruning included.
        #[test]
        fn walk_fills_cells_as_trying_every_option_does(
            ks in proptest::collection::btree_set(1u32..32, MIN_WALK_OPTIONS..16),
            option_values in proptest::collection::vec((1u32..40, 0u32..4), 16),
            prev_values in proptest::collection::vec((1u32..40, 0u32..4), 1..16),
            prev_inf in 0usize..4,
            exposed in any::<bool>(),
            cells in proptest::collection::vec((1u32..60, 0u32..3), 1..30),
            clo in 0u32..6,
            lo_offset in 0u32..20,
            c_min in 1u32..4,
            prune in 20u32..200,
        ) {
            let ks: Vec<u32> = ks.into_iter().collect();
            // Small integers make ties between options, remainders and cells common.
            // Exposed all-reduce in any order (the walk only needs the values sorted), or none.
            let half = if exposed { 0.5 } else { 0.0 };
            let values = falling(option_values.iter().map(|&(v, _)| f64::from(v)).collect(), 0);
            let opts: Vec<Opt> = ks
                .iter()
                .zip(values)
                .zip(&option_values)
                .map(|((&k, value), &(_, e))| Opt { k, value, e: f64::from(e) * half })
                .collect();
            let prev_v = falling(prev_values.iter().map(|&(v, _)| f64::from(v)).collect(), prev_inf);
            let prev_e: Vec<f64> = prev_v
                .iter()
                .zip(&prev_values)
                .map(|(&v, &(_, e))| if v.is_finite() { f64::from(e) * half } else { f64::INFINITY })
                .collect();
            let chi = clo + prev_v.len() as u32 - 1;
            let lo = clo + lo_offset;
            let hi = lo + cells.len() as u32 - 1;
            let rows = Rows {
                lo,
                hi,
                clo,
                chi,
                c_min: f64::from(c_min),
                prune_s: if prune > 190 { f64::INFINITY } else { f64::from(prune) },
            };
            // Cells already holding a value from an earlier stage, with or without exposure.
            let start_v: Vec<f64> = cells
                .iter()
                .map(|&(v, _)| if v > 55 { f64::INFINITY } else { f64::from(v) })
                .collect();
            let start_e: Vec<f64> = cells.iter().map(|&(_, e)| f64::from(e)).collect();
            let (mut general_v, mut general_e) = (start_v.clone(), start_e.clone());
            combine_every(&rows, &opts, (&prev_v, &prev_e), (&mut general_v, &mut general_e));
            let (mut fast_v, mut fast_e) = (start_v, start_e);
            prop_assert!(walkable(&opts, &prev_v));
            combine_walk(&rows, &opts, (&prev_v, &prev_e), (&mut fast_v, &mut fast_e));
            prop_assert_eq!(fast_v, general_v);
            prop_assert_eq!(fast_e, general_e);
        }
    }

    #[test]
    fn walk_declines_rising_values_or_few_options() {
        let falling: Vec<Opt> = (1..=10)
            .map(|k| Opt {
                k,
                value: 20.0 / f64::from(k),
                e: 0.1 * f64::from(k),
            })
            .collect();
        let falling_prev = [3.0, 2.0, 1.0];
        assert!(walkable(&falling, &falling_prev));
        assert!(!walkable(&falling, &[1.0, 2.0, 3.0]));
        let mut rising = falling.clone();
        rising[5].value = 30.0;
        assert!(!walkable(&rising, &falling_prev));
        assert!(!walkable(&falling[..MIN_WALK_OPTIONS - 1], &falling_prev));
    }
}
