//! A discrete-event simulator of the pipeline schedules: every micro-batch's forward and
//! backward operation on its replica, in the order the schedule gives each replica, each
//! started as soon as its replica is free and its input has arrived (the previous stage's
//! forward, the next stage's backward). It is the executable reference for the closed forms
//! of [`super::place`]: the tests run it on random instances and on the plans the search
//! returns (`docs/pipeline.md`), and `tandem plan --simulate` shows it beside the plan.

use super::{PipelineSchedule, Plan};

/// One stage's operations (for the interleaved schedule: one model chunk's), as simulated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimOp {
    /// The forward operation of one micro-batch on one replica, sends included.
    pub forward_s: f64,
    /// The backward operation, sends included, without gradient accumulation.
    pub backward_s: f64,
    /// Added to the backward of every micro-batch after the replica's first.
    pub accumulation_s: f64,
    /// Replicas taking micro-batches round-robin (1 for interleaved chunks).
    pub replicas: u32,
    /// Activation bytes each micro-batch a replica holds keeps.
    pub kept_bytes: u64,
}

/// The schedule to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimSchedule {
    /// 1F1B: each replica of stage `i` runs `K_{i+1} / kᵢ` forwards, then alternates forward
    /// and backward, then runs its remaining backwards (`kᵢ` must divide `K_{i+1}`).
    OneFOneB,
    /// All of a replica's forwards, then its backwards.
    GPipe,
    /// Megatron-LM's interleaved 1F1B over `stages` devices: the operations are the model's
    /// chunks in order, chunk `c` on device `c mod stages`.
    Interleaved { stages: u32 },
}

/// What the simulated schedule did.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    /// When the last operation ends.
    pub makespan_s: f64,
    /// Per stage (interleaved: per device), the most micro-batches (chunk activations) one of
    /// its replicas holds: forwards run whose backward has not.
    pub peak_in_flight: Vec<u64>,
    /// Per stage (device), the most activation bytes one of its replicas holds.
    pub peak_held_bytes: Vec<u64>,
}

/// Operation `(backward, position, micro-batch)` as an index.
fn index(m: u64, backward: bool, position: usize, micro_batch: u64) -> usize {
    ((position as u64 * m + micro_batch) * 2 + u64::from(backward)) as usize
}

/// Simulates `micro_batches` micro-batches through `ops` under `schedule`.
pub fn simulate(
    ops: &[SimOp],
    micro_batches: u64,
    schedule: SimSchedule,
) -> Result<Simulation, String> {
    let m = micro_batches;
    if ops.is_empty() || m == 0 {
        return Err("nothing to simulate: no stage or no micro-batch".into());
    }
    if let Some(i) = ops.iter().position(|o| o.replicas == 0) {
        return Err(format!("stage {i} has no replica"));
    }
    // Per replica (queue): the device group it belongs to and its operations in order.
    let (queues, groups) = match schedule {
        SimSchedule::OneFOneB | SimSchedule::GPipe => replica_orders(ops, m, schedule)?,
        SimSchedule::Interleaved { stages } => interleaved_orders(ops, m, stages)?,
    };
    let last = ops.len() - 1;
    let count = ops.len() * m as usize * 2;
    let mut finish = vec![f64::NAN; count];
    let mut waiting: Vec<Option<usize>> = vec![None; count];
    let mut cursor = vec![0usize; queues.len()];
    let mut clock = vec![0.0f64; queues.len()];
    let mut ready: Vec<usize> = (0..queues.len()).rev().collect();
    while let Some(q) = ready.pop() {
        while let Some(&(backward, position, j)) = queues[q].get(cursor[q]) {
            let dependency = match (backward, position) {
                (false, 0) => None,
                (false, p) => Some(index(m, false, p - 1, j)),
                (true, p) if p == last => Some(index(m, false, p, j)),
                (true, p) => Some(index(m, true, p + 1, j)),
            };
            let arrived = match dependency {
                None => 0.0,
                Some(dep) if finish[dep].is_nan() => {
                    waiting[dep] = Some(q);
                    break;
                }
                Some(dep) => finish[dep],
            };
            let op = &ops[position];
            let duration = if backward {
                let first = j < u64::from(op.replicas);
                op.backward_s + if first { 0.0 } else { op.accumulation_s }
            } else {
                op.forward_s
            };
            let me = index(m, backward, position, j);
            finish[me] = clock[q].max(arrived) + duration;
            clock[q] = finish[me];
            cursor[q] += 1;
            if let Some(other) = waiting[me].take() {
                ready.push(other);
            }
        }
    }
    if let Some(q) = (0..queues.len()).find(|&q| cursor[q] < queues[q].len()) {
        let (backward, position, j) = queues[q][cursor[q]];
        return Err(format!(
            "the schedule deadlocks: the {} of micro-batch {j} at position {position} never \
             gets its input",
            if backward { "backward" } else { "forward" }
        ));
    }
    let group_count = groups.iter().max().map_or(0, |g| g + 1);
    let mut peak_in_flight = vec![0u64; group_count];
    let mut peak_held_bytes = vec![0u64; group_count];
    for (queue, &group) in queues.iter().zip(&groups) {
        let (mut held, mut bytes) = (0u64, 0u64);
        for &(backward, position, _) in queue {
            if backward {
                held -= 1;
                bytes -= ops[position].kept_bytes;
            } else {
                held += 1;
                bytes += ops[position].kept_bytes;
                peak_in_flight[group] = peak_in_flight[group].max(held);
                peak_held_bytes[group] = peak_held_bytes[group].max(bytes);
            }
        }
    }
    Ok(Simulation {
        makespan_s: clock.iter().copied().fold(0.0, f64::max),
        peak_in_flight,
        peak_held_bytes,
    })
}

/// An operation in a replica's order: (backward, position, micro-batch).
type Order = Vec<(bool, usize, u64)>;

/// 1F1B and GPipe: one queue per replica of every stage, grouped by stage.
fn replica_orders(
    ops: &[SimOp],
    m: u64,
    schedule: SimSchedule,
) -> Result<(Vec<Order>, Vec<usize>), String> {
    let mut queues = Vec::new();
    let mut groups = Vec::new();
    let mut groups_after = 0u64;
    let mut per_stage = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate().rev() {
        let k = u64::from(op.replicas);
        let warmup = match schedule {
            SimSchedule::OneFOneB if !groups_after.is_multiple_of(k) => {
                return Err(format!(
                    "stage {i}: {k} replicas do not divide the {groups_after} tensor groups after \
                     it, which the 1F1B schedule of replicated stages needs"
                ))
            }
            SimSchedule::OneFOneB => groups_after / k,
            _ => m,
        };
        groups_after += k;
        per_stage.push((i, k, warmup));
    }
    per_stage.reverse();
    for (i, k, warmup) in per_stage {
        for r in 0..k {
            let mine: Vec<u64> = (r..m).step_by(k as usize).collect();
            let w = (warmup as usize).min(mine.len());
            let mut order: Order = mine[..w].iter().map(|&j| (false, i, j)).collect();
            for q in 0..mine.len() - w {
                order.push((false, i, mine[w + q]));
                order.push((true, i, mine[q]));
            }
            order.extend(mine[mine.len() - w..].iter().map(|&j| (true, i, j)));
            queues.push(order);
            groups.push(i);
        }
    }
    Ok((queues, groups))
}

/// Megatron-LM's interleaved order (`forward_backward_pipelining_with_interleaving`): per
/// device, virtual step `k` runs model chunk `(k mod p·v) / p` (backwards in reverse chunk
/// order) on micro-batch `(k / p·v)·p + k mod p`, after `2(p − r − 1) + (v − 1)p` warm-up
/// forwards (all of them when `m = p`).
fn interleaved_orders(
    ops: &[SimOp],
    m: u64,
    stages: u32,
) -> Result<(Vec<Order>, Vec<usize>), String> {
    let p = u64::from(stages);
    if p == 0 || !(ops.len() as u64).is_multiple_of(p) {
        return Err(format!(
            "{} chunks do not divide over {stages} stages",
            ops.len()
        ));
    }
    if !m.is_multiple_of(p) {
        return Err(format!(
            "the interleaved schedule needs the micro-batches ({m}) to be a multiple of the \
             stages ({p})"
        ));
    }
    if let Some(c) = ops.iter().position(|o| o.replicas != 1) {
        return Err(format!(
            "chunk {c}: the interleaved schedule has one replica per stage"
        ));
    }
    let v = ops.len() as u64 / p;
    let total = m * v;
    let step = |k: u64, backward: bool, r: u64| {
        let in_group = k % (p * v);
        let chunk = in_group / p;
        let chunk = if backward { v - 1 - chunk } else { chunk };
        let micro_batch = k / (p * v) * p + k % p;
        (backward, (chunk * p + r) as usize, micro_batch)
    };
    let mut queues = Vec::with_capacity(stages as usize);
    for r in 0..p {
        let warmup = if m == p {
            total
        } else {
            (2 * (p - r - 1) + (v - 1) * p).min(total)
        };
        let mut order: Order = (0..warmup).map(|k| step(k, false, r)).collect();
        for k in 0..total - warmup {
            order.push(step(k + warmup, false, r));
            order.push(step(k, true, r));
        }
        order.extend((total - warmup..total).map(|k| step(k, true, r)));
        queues.push(order);
    }
    Ok((queues, (0..stages as usize).collect()))
}

/// Simulates a plan's schedule with its stages' (or chunks') operations.
pub fn simulate_plan(plan: &Plan) -> Result<Simulation, String> {
    let op = |forward: f64, backward: f64, send_forward: f64, send_backward: f64| SimOp {
        forward_s: forward + send_forward,
        backward_s: backward + send_backward,
        accumulation_s: 0.0,
        replicas: 1,
        kept_bytes: 0,
    };
    let (ops, schedule): (Vec<SimOp>, SimSchedule) = match plan.schedule {
        PipelineSchedule::Interleaved => {
            let p = plan.stages.len();
            let v = plan.virtual_stages as usize;
            let mut ops = Vec::with_capacity(p * v);
            for c in 0..p * v {
                let stage = &plan.stages[c % p];
                let chunk = stage
                    .chunks
                    .get(c / p)
                    .ok_or_else(|| format!("stage {} lacks chunk {}", c % p, c / p))?;
                ops.push(SimOp {
                    accumulation_s: chunk.grad_accumulation_s,
                    kept_bytes: chunk.kept_bytes,
                    ..op(
                        chunk.fwd_s + chunk.dp_group_forward_s,
                        chunk.bwd_s + chunk.dp_group_backward_s,
                        chunk.send_forward_s,
                        chunk.send_backward_s,
                    )
                });
            }
            (ops, SimSchedule::Interleaved { stages: p as u32 })
        }
        PipelineSchedule::OneFOneB | PipelineSchedule::GPipe => {
            let ops = plan
                .stages
                .iter()
                .map(|s| SimOp {
                    accumulation_s: s.grad_accumulation_s,
                    replicas: s.replicas,
                    kept_bytes: s.kept_bytes,
                    ..op(
                        s.fwd_s + s.dp_group_forward_s,
                        s.bwd_s + s.dp_group_backward_s,
                        s.send_forward_s,
                        s.send_backward_s,
                    )
                })
                .collect();
            let schedule = if plan.schedule == PipelineSchedule::GPipe {
                SimSchedule::GPipe
            } else {
                SimSchedule::OneFOneB
            };
            (ops, schedule)
        }
    };
    simulate(&ops, plan.micro_batches_per_pipeline, schedule)
}
