//! Reference implementation: tries every partition into stages (every chain of downsets),
//! every device count per stage, every tensor width and every data-parallel width, and keeps
//! the fastest plan that fits. Exponential; meant for tests on graphs of a few layers. (The
//! interleaved schedule's layouts follow from the widths; its search is an enumeration.)

use super::interleaved;
use super::model::{
    build_plan, predecessors, stage_metrics, validate, widths, Ctx, PartStage, StageMetrics,
};
use super::{Infeasible, PipelineSchedule, PlacementProblem, Plan};

/// Largest graph the brute force accepts (it enumerates all subsets of the layers).
const MAX_LAYERS: usize = 16;

/// A stage between two downsets (layer bitmasks).
struct Cand {
    from: usize,
    to: usize,
    layers: u32,
    metrics: StageMetrics,
}

struct Search<'a> {
    ctx: &'a Ctx<'a>,
    cands: &'a [Cand],
    full: u32,
    chain: Vec<usize>,
    replicas: Vec<u32>,
    best: Option<(f64, Vec<PartStage>)>,
}

impl Search<'_> {
    /// Extends the chain of stages that ends at downset `at`.
    fn chains(&mut self, at: u32) {
        if at == self.full {
            let p = self.chain.len() as u32;
            if self.ctx.problem.constraints.pp.is_none_or(|pp| pp == p) {
                self.devices(0, self.ctx.units);
            }
            return;
        }
        for ci in 0..self.cands.len() {
            if self.cands[ci].from as u32 == at {
                self.chain.push(ci);
                self.chains(self.cands[ci].to as u32);
                self.chain.pop();
            }
        }
    }

    /// Assigns replicas to stage `i` onwards with `left` tensor groups left.
    fn devices(&mut self, i: usize, left: u32) {
        if i == self.chain.len() {
            if left == 0 || self.ctx.problem.allow_idle_devices {
                self.price();
            }
            return;
        }
        let most = if self.ctx.replicas_free() {
            left
        } else {
            left.min(1)
        };
        for k in 1..=most {
            self.replicas.push(k);
            self.devices(i + 1, left - k);
            self.replicas.pop();
        }
    }

    /// Prices the chain with its replicas: `(m + K − 1) · (largest rate + largest backward
    /// rate) + largest tail`, if every stage fits and the schedule admits the replica counts.
    fn price(&mut self) {
        let ctx = self.ctx;
        let groups: u32 = self.replicas.iter().sum();
        let (mut rate, mut backward_rate, mut tail) = (0.0f64, 0.0f64, 0.0f64);
        let mut groups_to_end = groups;
        for (&ci, &k) in self.chain.iter().zip(&self.replicas) {
            let sm = &self.cands[ci].metrics;
            if ctx.problem.schedule == PipelineSchedule::OneFOneB
                && !groups_to_end.is_multiple_of(k)
            {
                return;
            }
            if !ctx.fits(sm, k, groups_to_end) {
                return;
            }
            groups_to_end -= k;
            let (r, b) = ctx.rate_s(&ctx.ops(sm, k), k);
            rate = rate.max(r);
            backward_rate = backward_rate.max(b);
            tail = tail.max(ctx.tail_s(sm, k));
        }
        let time_s = ctx.slots(groups) * (rate + backward_rate) + tail;
        if self.best.as_ref().is_none_or(|b| time_s < b.0) {
            let n = ctx.problem.graphs[ctx.graph_index].layers.len();
            let parts = self
                .chain
                .iter()
                .zip(&self.replicas)
                .map(|(&ci, &k)| PartStage {
                    layers: (0..n)
                        .filter(|&l| self.cands[ci].layers >> l & 1 == 1)
                        .collect(),
                    metrics: self.cands[ci].metrics,
                    replicas: k,
                })
                .collect();
            self.best = Some((time_s, parts));
        }
    }
}

/// The fastest plan by exhaustive enumeration (reference for [`super::place`]; graphs of at
/// most 16 layers).
pub fn brute_force(problem: &PlacementProblem) -> Result<Plan, Infeasible> {
    validate(problem).map_err(Infeasible::reason)?;
    if problem.schedule == PipelineSchedule::Interleaved {
        return interleaved::search(problem, f64::INFINITY)?
            .ok_or_else(|| Infeasible::reason("no interleaved layout".into()));
    }
    let n = problem.graphs[0].layers.len();
    if n > MAX_LAYERS {
        return Err(Infeasible::reason(format!(
            "brute force handles at most {MAX_LAYERS} layers, the graph has {n}"
        )));
    }
    let (ctxs, reasons) = widths(problem);
    let mut best: Option<(f64, usize, Vec<PartStage>)> = None;
    for (ci, ctx) in ctxs.iter().enumerate() {
        let graph = &problem.graphs[ctx.graph_index];
        let preds = predecessors(n, &graph.edges);
        // Every predecessor-closed subset, by direct test of all 2^n subsets.
        let downsets: Vec<u32> = (0..1u32 << n)
            .filter(|&set| {
                (0..n).all(|v| set >> v & 1 == 0 || preds[v].iter().all(|&u| set >> u & 1 == 1))
            })
            .collect();
        let mut dist = vec![0.0; n];
        let mut cands = Vec::new();
        for &from in &downsets {
            for &to in &downsets {
                if to & from != from || to == from {
                    continue;
                }
                let before: Vec<bool> = (0..n).map(|v| from >> v & 1 == 1).collect();
                let in_stage: Vec<bool> = (0..n).map(|v| (to & !from) >> v & 1 == 1).collect();
                cands.push(Cand {
                    from: from as usize,
                    to: to as usize,
                    layers: to & !from,
                    metrics: stage_metrics(
                        problem,
                        ctx.graph_index,
                        &preds,
                        &in_stage,
                        &before,
                        &mut dist,
                    ),
                });
            }
        }
        let mut search = Search {
            ctx,
            cands: &cands,
            full: (1u32 << n) - 1,
            chain: Vec::new(),
            replicas: Vec::new(),
            best: None,
        };
        search.chains(0);
        if let Some((time_s, parts)) = search.best {
            if best.as_ref().is_none_or(|b| time_s < b.0) {
                best = Some((time_s, ci, parts));
            }
        }
    }
    match best {
        Some((_, ci, parts)) => Ok(build_plan(&ctxs[ci], &parts)),
        None => Err(Infeasible {
            reasons: if reasons.is_empty() {
                vec!["no plan fits in memory".into()]
            } else {
                reasons
            },
            alternatives: Vec::new(),
        }),
    }
}
