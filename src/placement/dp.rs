//! The downset dynamic programme.
//!
//! `F[s][D][K]` is the best way to place the layers *not* in downset `D` into `s` stages that
//! use exactly `K` tensor groups: the lexicographically smallest (largest `load / k`, largest
//! exposed all-reduce). Filling it from the end of the model means the first stage of the
//! remainder is always the `s`-th from the end, which fixes its in-flight micro-batches (and so
//! its memory) without knowing the total stage count; one table serves every `p`.

use super::model::{
    build_plan, memory_reason, predecessors, stage_metrics, widths, worst_stage, Ctx, PartStage,
    StageMetrics,
};
use super::{Alternative, Infeasible, PlacementProblem, Plan};
use std::collections::HashMap;

/// Downsets beyond this many make the table too large; such graphs are reported infeasible.
pub(crate) const MAX_DOWNSETS: usize = 4096;
/// Largest pipeline (in tensor groups) searched for the closest infeasible plans.
const MAX_ALTERNATIVE_UNITS: u32 = 128;

/// A stage candidate: the layers between downset `from` (implicit) and downset `to`.
struct Pair {
    to: usize,
    metrics: StageMetrics,
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
    /// Stages that can follow each downset.
    pairs: Vec<Vec<Pair>>,
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
        for from in &downsets {
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
                let least_bytes = metrics.params * u64::from(bpp.weights + bpp.grads)
                    + (metrics.params * u64::from(bpp.optimizer)).div_ceil(max_shard)
                    + metrics.act_one;
                list.push(Pair {
                    to,
                    metrics,
                    may_fit: least_bytes <= problem.hbm_bytes,
                });
            }
            pairs.push(list);
        }
        Ok(Analysis {
            downsets,
            suffix_len,
            pairs,
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

/// Table storage reused across (t, d) and bound iterations.
#[derive(Default)]
struct Tables {
    value: Vec<f64>,
    e: Vec<f64>,
    opts: Vec<Opt>,
}

struct Shape {
    downsets: usize,
    width: usize,
    s_max: u32,
}

impl Shape {
    fn at(&self, s: u32, d: usize, k: u32) -> usize {
        (s as usize * self.downsets + d) * self.width + k as usize
    }
}

/// Fills `opts` with the ways to run stage `pair` as the `s`-th stage from the end when at most
/// `k_max` tensor groups are left for it.
fn options(ctx: &Ctx, obj: Objective, pair: &Pair, s: u32, k_max: u32, opts: &mut Vec<Opt>) {
    opts.clear();
    let hbm = ctx.problem.hbm_bytes;
    let sm = &pair.metrics;
    let c_min = ctx.m as f64 + f64::from(s - 1);
    if matches!(obj, Objective::Time { .. }) && !pair.may_fit {
        return;
    }
    for k in 1..=k_max {
        match obj {
            Objective::Time { beta, best_s } => {
                if ctx.memory(sm, k, s).total > hbm {
                    continue;
                }
                let e = ctx.dp_comm_s(sm, k);
                // The exposed all-reduce grows with k: no larger k can pass the bound.
                if e >= beta {
                    break;
                }
                let value = ctx.load_s(sm, k) / f64::from(k);
                if value * c_min >= best_s {
                    continue;
                }
                opts.push(Opt { k, value, e });
            }
            // A hint, not an optimum: one replica, or as many as are left (least stash per
            // device), keeps this pass linear in the device count.
            Objective::Memory if k == 1 || k == k_max => opts.push(Opt {
                k,
                value: ctx.memory(sm, k, s).total as f64,
                e: 0.0,
            }),
            Objective::Memory => {}
        }
    }
}

fn better(v: f64, e: f64, than_v: f64, than_e: f64) -> bool {
    v < than_v || (v == than_v && e < than_e)
}

fn solve(an: &Analysis, ctx: &Ctx, obj: Objective, shape: &Shape, t: &mut Tables) {
    let size = (shape.s_max as usize + 1) * shape.downsets * shape.width;
    t.value.clear();
    t.value.resize(size, f64::INFINITY);
    t.e.clear();
    t.e.resize(size, f64::INFINITY);
    let base = shape.at(0, an.full(), 0);
    t.value[base] = 0.0;
    t.e[base] = 0.0;
    let units = ctx.units;
    let prune_s = match obj {
        Objective::Time { best_s, .. } => best_s,
        Objective::Memory => f64::INFINITY,
    };
    for s in 1..=shape.s_max {
        let c_min = ctx.m as f64 + f64::from(s - 1);
        let split = shape.at(s, 0, 0);
        let (prev_v, cur_v) = t.value.split_at_mut(split);
        let (prev_e, cur_e) = t.e.split_at_mut(split);
        for d in 0..shape.downsets {
            if an.suffix_len[d] < s {
                continue;
            }
            let row = shape.at(s, d, 0) - split;
            for pair in &an.pairs[d] {
                let rest = s - 1;
                if (rest == 0) != (pair.to == an.full()) || an.suffix_len[pair.to] < rest {
                    continue;
                }
                options(ctx, obj, pair, s, units - rest, &mut t.opts);
                let prev = shape.at(rest, pair.to, 0);
                for opt in &t.opts {
                    for k_total in opt.k + rest..=units {
                        let pv = prev_v[prev + (k_total - opt.k) as usize];
                        if pv == f64::INFINITY {
                            continue;
                        }
                        let v = opt.value.max(pv);
                        if v * c_min >= prune_s {
                            continue;
                        }
                        let e = opt.e.max(prev_e[prev + (k_total - opt.k) as usize]);
                        let at = row + k_total as usize;
                        if better(v, e, cur_v[at], cur_e[at]) {
                            cur_v[at] = v;
                            cur_e[at] = e;
                        }
                    }
                }
            }
        }
    }
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
        let (v, e) = (t.value[shape.at(s, d, k_left)], t.e[shape.at(s, d, k_left)]);
        let rest = s - 1;
        let mut found = None;
        'search: for pair in &an.pairs[d] {
            if (rest == 0) != (pair.to == an.full()) || an.suffix_len[pair.to] < rest {
                continue;
            }
            options(ctx, obj, pair, s, ctx.units - rest, &mut t.opts);
            for opt in &t.opts {
                if opt.k > k_left || k_left - opt.k < rest {
                    continue;
                }
                let at = shape.at(rest, pair.to, k_left - opt.k);
                if opt.value.max(t.value[at]) == v && opt.e.max(t.e[at]) == e {
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
        let shape = Shape {
            downsets: an.downsets.len(),
            width: ctx.units as usize + 1,
            s_max,
        };
        considered.push((ci, s_max));
        let mut beta = f64::INFINITY;
        loop {
            let obj = Objective::Time { beta, best_s };
            solve(an, ctx, obj, &shape, &mut tables);
            let cells = finals(ctx, &shape);
            let mut improved = None;
            for &(p, k) in &cells {
                let at = shape.at(p, an.empty(), k);
                let (v, e) = (tables.value[at], tables.e[at]);
                let time_s = v * (ctx.m as f64 + f64::from(p - 1)) + e;
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
            // that could still win on load alone: tighten the bound to the largest such one.
            let next_beta = cells
                .iter()
                .map(|&(p, k)| {
                    let at = shape.at(p, an.empty(), k);
                    let c = ctx.m as f64 + f64::from(p - 1);
                    (tables.value[at] * c, tables.e[at])
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
        let shape = Shape {
            downsets: an.downsets.len(),
            width: ctx.units as usize + 1,
            s_max,
        };
        solve(an, ctx, Objective::Memory, &shape, &mut tables);
        let cell = finals(ctx, &shape)
            .into_iter()
            .map(|(p, k)| (tables.value[shape.at(p, an.empty(), k)], p, k))
            .filter(|c| c.0 < f64::INFINITY)
            .fold(None, |acc: Option<(f64, u32, u32)>, c| match acc {
                Some(a) if a.0 <= c.0 => Some(a),
                _ => Some(c),
            });
        if let Some((_, p, k)) = cell {
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
