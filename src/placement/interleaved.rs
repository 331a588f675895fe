//! Megatron-LM's interleaved 1F1B schedule (Narayanan et al. 2021 §2.2.2): `p` stages of one
//! tensor group each hold `v` model chunks. Its layout follows from the widths as Megatron-LM
//! lays it out — the model's repeated layers split evenly into `p·v` chunks, chunk `c` on
//! stage `c mod p`, the layers before the repeated ones with chunk 0 and those after with the
//! last — so the search enumerates (t, d, p, v) and prices each layout.
//!
//! Pipeline time: for chunks of equal forward `f` and backward `b` operations the schedule
//! takes exactly `(m·v + p − 1)(f + b)` (Megatron-LM's `(p − 1) / v` bubble; checked by the
//! simulator). Its longest path only grows with an operation's duration and holds each
//! operation once, so raising every chunk to a reference `f` and adding what exceeds it gives
//! `(m·v + p − 1)·f + m·Σ_c (F_c − f)⁺`, an upper bound for any `f`; the model takes the
//! smallest over the chunks' own forwards, and likewise for the backwards.

use super::model::{
    chain_stage_metrics, is_chain, memory_reason, predecessors, widths, ChainTables, Ctx,
    StageMetrics,
};
use super::{
    Alternative, Chunk, Infeasible, MemoryBreakdown, PipelineSchedule, PlacementProblem, Plan,
    Stage, TimeSplit,
};

/// `min_f [(m·v + p − 1)·f + m·Σ_c (durations_c − f)⁺]` over the chunks' own durations.
fn pipeline_part_s(durations: &[f64], slots: f64, m: f64) -> f64 {
    durations
        .iter()
        .map(|&f| slots * f + m * durations.iter().map(|&d| (d - f).max(0.0)).sum::<f64>())
        .fold(f64::INFINITY, f64::min)
}

/// Chunk activations stage `r` of `p` holds at most with `v` chunks and `m` micro-batches:
/// Megatron-LM's warm-up forwards and the first steady forward, or all of them when `m = p`.
pub(crate) fn chunks_in_flight(p: u64, v: u64, m: u64, r: u64) -> u64 {
    let total = m * v;
    if m == p {
        total
    } else {
        (2 * (p - r - 1) + (v - 1) * p + 1).min(total)
    }
}

/// The layer ranges `[first, end)` of the `p·v` chunks, or `None` when the repeated layers do
/// not split evenly.
fn layout(n: usize, repeated: [usize; 2], chunks: usize) -> Option<Vec<[usize; 2]>> {
    let [first, end] = repeated;
    let blocks = end - first;
    if chunks == 0 || blocks % chunks != 0 {
        return None;
    }
    let per = blocks / chunks;
    Some(
        (0..chunks)
            .map(|c| {
                let start = if c == 0 { 0 } else { first + c * per };
                let stop = if c + 1 == chunks {
                    n
                } else {
                    first + (c + 1) * per
                };
                [start, stop]
            })
            .collect(),
    )
}

/// Prices one interleaved layout of `p` stages and `v` chunks each.
fn price(ctx: &Ctx, metrics: &[StageMetrics], ranges: &[[usize; 2]], p: usize) -> Plan {
    let v = ranges.len() / p;
    let m = ctx.m;
    let chunks: Vec<Chunk> = metrics
        .iter()
        .zip(ranges)
        .map(|(sm, range)| {
            let ops = ctx.ops(sm, 1);
            Chunk {
                layers: (range[0]..range[1]).collect(),
                fwd_s: sm.fwd_s,
                bwd_s: sm.bwd_s,
                send_forward_s: ops.send_forward_s,
                send_backward_s: ops.send_backward_s,
                grad_accumulation_s: ops.accumulation_s,
                dp_group_forward_s: ops.dp_group_forward_s,
                dp_group_backward_s: ops.dp_group_backward_s,
                kept_bytes: sm.stash_per_micro_batch,
            }
        })
        .collect();
    let slots = (m * v as u64 + p as u64 - 1) as f64;
    let forwards: Vec<f64> = chunks
        .iter()
        .map(|c| c.fwd_s + c.send_forward_s + c.dp_group_forward_s)
        .collect();
    let backwards: Vec<f64> = chunks
        .iter()
        .map(|c| c.bwd_s + c.send_backward_s + c.grad_accumulation_s + c.dp_group_backward_s)
        .collect();
    let pipeline_s =
        pipeline_part_s(&forwards, slots, m as f64) + pipeline_part_s(&backwards, slots, m as f64);
    let mut stages = Vec::with_capacity(p);
    for r in 0..p {
        let mine: Vec<usize> = (r..p * v).step_by(p).collect();
        let device = StageMetrics::of_chunks(mine.iter().map(|&c| &metrics[c]));
        let in_flight = chunks_in_flight(p as u64, v as u64, m, r as u64);
        let [weights, grads, optimizer] = ctx.state_bytes(&device, 1);
        let stash = (in_flight - 1) * device.stash_per_micro_batch;
        let sum = |f: fn(&Chunk) -> f64| mine.iter().map(|&c| f(&chunks[c])).sum::<f64>();
        let [send_forward_s, send_backward_s, grad_accumulation_s, dp_group_forward_s, dp_group_backward_s] = [
            sum(|c| c.send_forward_s),
            sum(|c| c.send_backward_s),
            sum(|c| c.grad_accumulation_s),
            sum(|c| c.dp_group_forward_s),
            sum(|c| c.dp_group_backward_s),
        ];
        stages.push(Stage {
            layers: mine
                .iter()
                .flat_map(|&c| chunks[c].layers.clone())
                .collect(),
            devices: ctx.t,
            replicas: 1,
            fwd_s: device.fwd_s,
            bwd_s: device.bwd_s,
            send_forward_s,
            send_backward_s,
            grad_accumulation_s,
            dp_group_forward_s,
            dp_group_backward_s,
            load_s: device.fwd_s
                + device.bwd_s
                + send_forward_s
                + send_backward_s
                + grad_accumulation_s
                + dp_group_forward_s
                + dp_group_backward_s,
            in_flight,
            kept_bytes: device.stash_per_micro_batch,
            dp_comm_s: ctx.dp_comm_s(&device, 1),
            dp_sync_s: ctx.dp_sync_s(&device, 1),
            dp_hidden_s: ctx.dp_hidden_s(&device, 1),
            optimizer_s: ctx.stage_optimizer_s(&device, 1),
            grad_buffer_s: ctx.stage_grad_buffer_s(&device, 1),
            memory: MemoryBreakdown {
                weights,
                grads,
                optimizer,
                activations: device.act_one,
                stash,
                total: weights + grads + optimizer + device.act_one + stash,
            },
            chunks: mine.iter().map(|&c| chunks[c].clone()).collect(),
        });
    }
    for stage in &mut stages {
        stage.layers.sort_unstable();
    }
    // The steady state: m micro-batches on the busiest stage.
    let busiest = stages
        .iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, s)| {
            if s.load_s > best.1 {
                (i, s.load_s)
            } else {
                best
            }
        })
        .0;
    let steady = &stages[busiest];
    let pp_comm_s = m as f64 * steady.send_s();
    let dp_group_comm_s = m as f64 * steady.dp_group_s();
    let compute_s = m as f64 * (steady.load_s - steady.send_s() - steady.dp_group_s());
    let tail = stages
        .iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, s)| {
            if s.dp_comm_s + s.optimizer_s > best.1 {
                (i, s.dp_comm_s + s.optimizer_s)
            } else {
                best
            }
        })
        .0;
    let (dp_comm_s, optimizer_s) = (stages[tail].dp_comm_s, stages[tail].optimizer_s);
    let time_per_batch_s = pipeline_s + dp_comm_s + optimizer_s;
    Plan {
        tp: ctx.t,
        pp: p as u32,
        dp: ctx.d,
        schedule: PipelineSchedule::Interleaved,
        zero: ctx.problem.zero,
        ep: ctx.e,
        layout: ctx.problem.layout,
        virtual_stages: v as u32,
        micro_batch: ctx.problem.micro_batch,
        micro_batches_per_pipeline: m,
        peak_memory_bytes: stages.iter().map(|s| s.memory.total).max().unwrap_or(0),
        devices_used: ctx.d * p as u32 * ctx.t,
        time_split: TimeSplit {
            compute_s,
            bubble_s: pipeline_s - compute_s - pp_comm_s - dp_group_comm_s,
            pp_comm_s,
            dp_group_comm_s,
            dp_comm_s,
            optimizer_s,
            grad_buffer_s: stages[tail].grad_buffer_s,
        },
        stages,
        time_per_batch_s,
        throughput_samples_per_s: ctx.problem.global_batch as f64 / time_per_batch_s,
    }
}

/// The best interleaved plan faster than `bound_s` (see [`super::place_faster_than`]).
pub(crate) fn search(problem: &PlacementProblem, bound_s: f64) -> Result<Option<Plan>, Infeasible> {
    let (ctxs, mut reasons) = widths(problem);
    let fixed = problem.constraints;
    let mut best: Option<Plan> = None;
    let mut misfits: Vec<Plan> = Vec::new();
    let mut layouts = 0usize;
    let mut uneven = Vec::new();
    for ctx in &ctxs {
        let graph = &problem.graphs[ctx.graph_index];
        let n = graph.layers.len();
        if !is_chain(&predecessors(n, &graph.edges)) {
            reasons.push(format!(
                "t={}: the interleaved schedule needs a chain of layers (each feeding the next)",
                ctx.t
            ));
            continue;
        }
        let repeated = graph.repeated_layers.unwrap_or([0, n]);
        let blocks = repeated[1] - repeated[0];
        let tables = ChainTables::new(graph);
        let stage_counts: Vec<u32> = match fixed.pp {
            Some(pp) => vec![pp],
            None if problem.allow_idle_devices => (2..=ctx.units).collect(),
            None => vec![ctx.units],
        };
        for p in stage_counts {
            if p < 2 || p > ctx.units || (!problem.allow_idle_devices && p != ctx.units) {
                continue;
            }
            if ctx.m % u64::from(p) != 0 {
                uneven.push(format!("t={} d={} p={p}: m={}", ctx.t, ctx.d, ctx.m));
                continue;
            }
            let chunk_counts: Vec<u32> = match fixed.virtual_stages {
                Some(v) => vec![v],
                None => (2..=(blocks as u32 / p)).collect(),
            };
            for v in chunk_counts {
                let Some(ranges) = layout(n, repeated, (p * v) as usize) else {
                    continue;
                };
                layouts += 1;
                let metrics: Vec<StageMetrics> = ranges
                    .iter()
                    .map(|&[first, end]| {
                        chain_stage_metrics(problem, ctx.graph_index, &tables, first)
                            [end - first - 1]
                    })
                    .collect();
                let plan = price(ctx, &metrics, &ranges, p as usize);
                if plan.peak_memory_bytes > problem.hbm_bytes {
                    misfits.push(plan);
                } else if plan.time_per_batch_s < bound_s
                    && best
                        .as_ref()
                        .is_none_or(|b| plan.time_per_batch_s < b.time_per_batch_s)
                {
                    best = Some(plan);
                }
            }
        }
    }
    if best.is_some() || bound_s.is_finite() {
        return Ok(best);
    }
    if !uneven.is_empty() {
        reasons.push(format!(
            "the interleaved schedule needs the micro-batches per pipeline to be a multiple of \
             the stages: not so for {}",
            uneven.join(", ")
        ));
    }
    if layouts == 0 {
        reasons.push(
            "no interleaved layout: it needs p ≥ 2 stages of one tensor group using the \
             pipeline's devices and v ≥ 2 chunks per stage dividing the model's repeated layers \
             into p·v equal chunks"
                .into(),
        );
    }
    misfits.sort_by(|a, b| {
        a.peak_memory_bytes
            .cmp(&b.peak_memory_bytes)
            .then(a.time_per_batch_s.total_cmp(&b.time_per_batch_s))
    });
    misfits.truncate(3);
    let alternatives: Vec<Alternative> = misfits
        .into_iter()
        .map(|plan| {
            let (worst_stage, peak) = plan
                .stages
                .iter()
                .enumerate()
                .map(|(i, s)| (i, s.memory.total))
                .fold((0, 0), |a, b| if b.1 > a.1 { b } else { a });
            Alternative {
                overshoot_bytes: peak - problem.hbm_bytes,
                worst_stage,
                plan,
            }
        })
        .collect();
    if let Some(closest) = alternatives.first() {
        reasons.push(memory_reason(
            &closest.plan,
            closest.worst_stage,
            problem.hbm_bytes,
        ));
    }
    Err(Infeasible {
        reasons,
        alternatives,
    })
}

#[cfg(test)]
mod tests {
    use super::{chunks_in_flight, layout, pipeline_part_s};

    #[test]
    fn megatron_layout_puts_the_ends_with_the_first_and_last_chunk() {
        // Embedding, 8 blocks, head; 2 stages × 2 chunks of 2 blocks.
        let ranges = layout(10, [1, 9], 4).unwrap();
        assert_eq!(ranges, vec![[0, 3], [3, 5], [5, 7], [7, 10]]);
        assert!(layout(10, [1, 9], 3).is_none());
    }

    #[test]
    fn equal_chunks_give_megatron_s_bubble() {
        // 4 stages, 2 chunks, 8 micro-batches, f = 1: (8·2 + 3)·1.
        assert_eq!(pipeline_part_s(&[1.0; 8], 19.0, 8.0), 19.0);
        // One chunk 0.5 longer: the reference stays at 1, m·0.5 more.
        let mut uneven = [1.0; 8];
        uneven[7] = 1.5;
        assert_eq!(pipeline_part_s(&uneven, 19.0, 8.0), 19.0 + 4.0);
        // Korthikanti et al.: the first stage holds p(1 + (p−1)/(pv)) stages' activations,
        // p·v + p − 1 chunk activations.
        assert_eq!(chunks_in_flight(4, 2, 8, 0), 4 * 2 + 4 - 1);
        assert_eq!(chunks_in_flight(4, 2, 8, 3), 5);
        assert_eq!(chunks_in_flight(4, 2, 4, 3), 8);
    }
}
