//! Scheduling speed on synthetic transformer blocks (GPT-3 dimensions at t = 8, SwiGLU FFN,
//! attention split into head groups) across eleven core configurations, forward and backward.
//! Before timing, prints the median time per schedule and how each problem was closed.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::time::Instant;
use tandem::schedule::{
    list_schedule, lower_bound, schedule, CoreCounts, SchedOp, ScheduleProblem, SolverOptions,
};
use tandem::workload::CoreType;

/// GPT-3 175B, tensor-parallel width 8, one micro-batch of one sequence.
const SEQ: f64 = 2048.0;
const HIDDEN: f64 = 12288.0;
const FFN: f64 = 4.0 * HIDDEN;
const TP: f64 = 8.0;
/// Head groups the attention core is split into (independent chains).
const HEAD_GROUPS: usize = 2;

/// One 128 × 128 systolic core at 1 GHz; 1 TB/s of HBM; 32-lane vector cores at 1 GHz.
const CORE_FLOP_PER_S: f64 = 2.0 * 128.0 * 128.0 * 1e9;
const HBM_B_PER_S: f64 = 1.0e12;
const VECTOR_ELEM_PER_S: f64 = 32.0 * 1e9;
const LINK_B_PER_S: f64 = 1.0e11;
const JOULE_PER_FLOP: f64 = 0.5e-12;

/// The eleven (tensor, vector) core configurations the search would visit.
const CONFIGS: [(u32, u32); 11] = [
    (1, 1),
    (2, 1),
    (2, 2),
    (4, 1),
    (4, 2),
    (4, 4),
    (8, 2),
    (8, 4),
    (8, 8),
    (16, 4),
    (16, 8),
];

struct Builder {
    ops: Vec<SchedOp>,
    edges: Vec<(usize, usize)>,
    cores: CoreCounts,
}

impl Builder {
    fn push(&mut self, op: SchedOp, preds: &[usize]) -> usize {
        let id = self.ops.len();
        self.edges.extend(preds.iter().map(|&p| (p, id)));
        self.ops.push(op);
        id
    }

    /// A GEMM: compute-bound on one core; on n cores a 1/n share plus 10 % imbalance and a
    /// fixed 2 µs split overhead, never faster than streaming its operands from HBM.
    fn gemm(&mut self, name: &str, m: f64, n: f64, k: f64, preds: &[usize]) -> usize {
        let flop = 2.0 * m * n * k;
        let one_core_s = flop / CORE_FLOP_PER_S;
        let memory_s = 2.0 * (m * k + k * n + m * n) / HBM_B_PER_S;
        let cores = f64::from(self.cores.tensor);
        let all_cores_s = (one_core_s / cores * 1.1 + 2e-6).max(memory_s);
        let energy_j = flop * JOULE_PER_FLOP;
        let op = SchedOp {
            name: name.to_string(),
            core: CoreType::Tensor,
            one_core_s: one_core_s.max(memory_s),
            all_cores_s,
            one_core_energy_j: energy_j,
            all_cores_energy_j: energy_j * 1.05,
        };
        self.push(op, preds)
    }

    /// A vector op over `elements` values at `cycles` per element per lane, or HBM-bound.
    fn vector(&mut self, name: &str, elements: f64, cycles: f64, preds: &[usize]) -> usize {
        let compute_s = elements * cycles / VECTOR_ELEM_PER_S;
        let memory_s = 4.0 * elements / HBM_B_PER_S;
        let cores = f64::from(self.cores.vector);
        let op = SchedOp {
            name: name.to_string(),
            core: CoreType::Vector,
            one_core_s: compute_s.max(memory_s),
            all_cores_s: (compute_s / cores + 1e-6).max(memory_s),
            one_core_energy_j: elements * 2e-12,
            all_cores_energy_j: elements * 2.1e-12,
        };
        self.push(op, preds)
    }

    fn all_reduce(&mut self, name: &str, preds: &[usize]) -> usize {
        let bytes = 2.0 * SEQ * HIDDEN;
        let latency_s = 2.0 * (TP - 1.0) / TP * bytes / LINK_B_PER_S + 2.0 * (TP - 1.0) * 5e-6;
        let op = SchedOp {
            name: name.to_string(),
            core: CoreType::Link,
            one_core_s: latency_s,
            all_cores_s: latency_s,
            one_core_energy_j: bytes * 10e-12,
            all_cores_energy_j: bytes * 10e-12,
        };
        self.push(op, preds)
    }

    fn finish(self) -> ScheduleProblem {
        ScheduleProblem {
            ops: self.ops,
            edges: self.edges,
            cores: self.cores,
        }
    }
}

fn new_builder(tensor: u32, vector: u32) -> Builder {
    Builder {
        ops: Vec::new(),
        edges: Vec::new(),
        cores: CoreCounts { tensor, vector },
    }
}

/// Forward block: LN, Q/K/V GEMMs in parallel, per head group QKᵀ → softmax → dropout → ×V,
/// output projection, all-reduce, residual, LN, SwiGLU gate and up in parallel, SiLU × up,
/// down projection, all-reduce, residual. 27 operators.
fn forward(tensor: u32, vector: u32) -> ScheduleProblem {
    let mut b = new_builder(tensor, vector);
    let (h_t, f_t) = (HIDDEN / TP, FFN / TP);
    let group_h = h_t / HEAD_GROUPS as f64;
    let act = SEQ * HIDDEN;
    let ln1 = b.vector("ln1", act, 8.0, &[]);
    let q = b.gemm("q", SEQ, h_t, HIDDEN, &[ln1]);
    let k = b.gemm("k", SEQ, h_t, HIDDEN, &[ln1]);
    let v = b.gemm("v", SEQ, h_t, HIDDEN, &[ln1]);
    let mut heads = Vec::new();
    for g in 0..HEAD_GROUPS {
        let scores = SEQ * SEQ * 12.0 / HEAD_GROUPS as f64;
        let qk = b.gemm(
            &format!("qk{g}"),
            SEQ,
            SEQ * 12.0 / HEAD_GROUPS as f64,
            group_h / 6.0,
            &[q, k],
        );
        let sm = b.vector(&format!("softmax{g}"), scores, 30.0, &[qk]);
        let dr = b.vector(&format!("dropout{g}"), scores, 2.0, &[sm]);
        heads.push(b.gemm(&format!("av{g}"), SEQ, group_h, SEQ, &[dr, v]));
    }
    let proj = b.gemm("proj", SEQ, HIDDEN, h_t, &heads);
    let ar1 = b.all_reduce("allreduce1", &[proj]);
    let add1 = b.vector("add1", act, 1.0, &[ar1]);
    let ln2 = b.vector("ln2", act, 8.0, &[add1]);
    let gate = b.gemm("gate", SEQ, f_t, HIDDEN, &[ln2]);
    let up = b.gemm("up", SEQ, f_t, HIDDEN, &[ln2]);
    let silu = b.vector("silu", SEQ * f_t, 15.0, &[gate]);
    let mul = b.vector("mul", SEQ * f_t, 1.0, &[silu, up]);
    let down = b.gemm("down", SEQ, HIDDEN, f_t, &[mul]);
    let ar2 = b.all_reduce("allreduce2", &[down]);
    b.vector("add2", act, 1.0, &[ar2, add1]);
    b.finish()
}

/// Backward block: each GEMM becomes an input-gradient and a weight-gradient GEMM (the
/// weight gradient off the critical path), vector ops their backward, gradients of parallel
/// branches summed. 30 operators.
fn backward(tensor: u32, vector: u32) -> ScheduleProblem {
    let mut b = new_builder(tensor, vector);
    let (h_t, f_t) = (HIDDEN / TP, FFN / TP);
    let group_h = h_t / HEAD_GROUPS as f64;
    let act = SEQ * HIDDEN;
    let ar2 = b.all_reduce("allreduce2_bwd", &[]);
    let down_d = b.gemm("down_dgrad", SEQ, f_t, HIDDEN, &[ar2]);
    b.gemm("down_wgrad", f_t, HIDDEN, SEQ, &[ar2]);
    let mul = b.vector("mul_bwd", SEQ * f_t, 2.0, &[down_d]);
    let silu = b.vector("silu_bwd", SEQ * f_t, 20.0, &[mul]);
    let gate_d = b.gemm("gate_dgrad", SEQ, HIDDEN, f_t, &[silu]);
    b.gemm("gate_wgrad", HIDDEN, f_t, SEQ, &[silu]);
    let up_d = b.gemm("up_dgrad", SEQ, HIDDEN, f_t, &[mul]);
    b.gemm("up_wgrad", HIDDEN, f_t, SEQ, &[mul]);
    let ln2 = b.vector("ln2_bwd", act, 10.0, &[gate_d, up_d]);
    let proj_d = b.gemm("proj_dgrad", SEQ, h_t, HIDDEN, &[ln2]);
    b.gemm("proj_wgrad", h_t, HIDDEN, SEQ, &[ln2]);
    let mut q_grads = Vec::new();
    let mut kv_grads = Vec::new();
    for g in 0..HEAD_GROUPS {
        let scores = SEQ * SEQ * 12.0 / HEAD_GROUPS as f64;
        let av_d = b.gemm(
            &format!("av{g}_dgrad"),
            SEQ,
            SEQ * 12.0 / HEAD_GROUPS as f64,
            group_h / 6.0,
            &[proj_d],
        );
        kv_grads.push(b.gemm(&format!("av{g}_vgrad"), SEQ, group_h, SEQ, &[proj_d]));
        let dr = b.vector(&format!("dropout{g}_bwd"), scores, 2.0, &[av_d]);
        let sm = b.vector(&format!("softmax{g}_bwd"), scores, 12.0, &[dr]);
        q_grads.push(b.gemm(&format!("qk{g}_qgrad"), SEQ, group_h, SEQ, &[sm]));
        kv_grads.push(b.gemm(&format!("qk{g}_kgrad"), SEQ, group_h, SEQ, &[sm]));
    }
    let mut qkv_inputs = q_grads.clone();
    qkv_inputs.extend(&kv_grads);
    let qkv_d = b.gemm("qkv_dgrad", SEQ, HIDDEN, 3.0 * h_t, &qkv_inputs);
    b.gemm("qkv_wgrad", 3.0 * h_t, HIDDEN, SEQ, &qkv_inputs);
    let ln1 = b.vector("ln1_bwd", act, 10.0, &[qkv_d]);
    b.all_reduce("allreduce1_bwd", &[ln1]);
    b.finish()
}

fn problems() -> Vec<(String, ScheduleProblem)> {
    CONFIGS
        .iter()
        .flat_map(|&(t, v)| {
            [
                (format!("fwd t{t} v{v}"), forward(t, v)),
                (format!("bwd t{t} v{v}"), backward(t, v)),
            ]
        })
        .collect()
}

/// Median wall time per schedule and how each was closed, printed once.
fn summary(problems: &[(String, ScheduleProblem)], options: &SolverOptions) {
    const REPEATS: usize = 5;
    let mut times_s = Vec::new();
    let mut by_bounds = 0;
    for (name, problem) in problems {
        let mut best_s = f64::INFINITY;
        let mut last = None;
        for _ in 0..REPEATS {
            let started = Instant::now();
            let s = schedule(problem, options).expect("synthetic problems are valid");
            best_s = best_s.min(started.elapsed().as_secs_f64());
            last = Some(s);
        }
        let s = last.expect("at least one repeat");
        // Closed without the solver when the list schedule is already within the gap of the
        // first lower bound.
        let lb_s = lower_bound(problem).expect("valid");
        let ub_s = list_schedule(problem).expect("valid").makespan_s;
        if ub_s - lb_s <= options.relative_gap * ub_s {
            by_bounds += 1;
        }
        println!(
            "{name:>14}: {:>3} ops  makespan {:>9.3} µs  lb {:>9.3} µs  ub {:>9.3} µs  {:>14}  {:>8.3} ms",
            problem.ops.len(),
            s.makespan_s * 1e6,
            s.lower_bound_s * 1e6,
            s.upper_bound_s * 1e6,
            s.status.to_string(),
            best_s * 1e3
        );
        times_s.push(best_s);
    }
    times_s.sort_by(f64::total_cmp);
    println!(
        "median {:.3} ms per schedule, max {:.3} ms; {by_bounds}/{} closed without the solver",
        times_s[times_s.len() / 2] * 1e3,
        times_s[times_s.len() - 1] * 1e3,
        times_s.len()
    );
}

fn bench(c: &mut Criterion) {
    let options = SolverOptions::default();
    let problems = problems();
    summary(&problems, &options);
    let mut group = c.benchmark_group("schedule");
    group.sample_size(10);
    for direction in ["fwd", "bwd"] {
        let subset: Vec<&ScheduleProblem> = problems
            .iter()
            .filter(|(name, _)| name.starts_with(direction))
            .map(|(_, p)| p)
            .collect();
        group.bench_function(
            format!("{direction} block, 11 core configurations"),
            |bench| {
                bench.iter(|| {
                    for p in &subset {
                        black_box(schedule(p, &options).expect("valid"));
                    }
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
