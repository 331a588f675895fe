//! Per-layer scheduling speed (issue 3): the GPT-3 175B block, forward and backward, t = 8,
//! micro-batch 1, on the TPU v4-like chip and ten configurations spread over the PHAZE space.
//! Before timing, prints per problem the makespan, bounds, status and solve time, then the
//! median time per (layer, direction, configuration) and the share closed by bounds alone.
//!
//! `cargo bench --bench schedule`

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;
use tandem::arch::{load_chip, ArchConfig, SearchSpace};
use tandem::cost::CostModel;
use tandem::schedule::{list_schedule, lower_bound, schedule, ScheduleProblem, SolverOptions};
use tandem::workload::Workload;

const OTHER_CONFIGURATIONS: usize = 10;

fn chips() -> Vec<ArchConfig> {
    let mut chips =
        vec![load_chip(Path::new("arch_specs/phaze-tpuv4-template.toml")).expect("bundled chip")];
    let space = SearchSpace::load(Path::new("arch_specs/phaze.toml")).expect("bundled space");
    // Evenly spaced indices, offset so that they do not all share the last dimension's value.
    let stride = space.len() / OTHER_CONFIGURATIONS;
    chips.extend(
        (0..OTHER_CONFIGURATIONS).filter_map(|i| space.get(i * stride + (i * 7) % stride.max(1))),
    );
    chips
}

fn problems() -> Vec<(String, ScheduleProblem)> {
    let workload = Workload::load(Path::new("workloads/gpt3-175b.toml")).expect("bundled workload");
    let graph = workload
        .layer_graph(8, 1, false)
        .expect("t = 8 divides GPT-3");
    let block = graph
        .layers
        .iter()
        .find(|l| l.name.contains("block"))
        .expect("GPT-3 has transformer blocks");
    let mut out = Vec::new();
    for chip in chips() {
        let cost = CostModel::new(&chip);
        out.push((
            format!("fwd {}", chip.name),
            ScheduleProblem::from_op_graph(&block.fwd, &cost),
        ));
        out.push((
            format!("bwd {}", chip.name),
            ScheduleProblem::from_op_graph(&block.bwd, &cost),
        ));
    }
    out
}

fn summary(problems: &[(String, ScheduleProblem)], options: &SolverOptions) {
    const REPEATS: usize = 3;
    let mut times_s = Vec::new();
    let mut by_bounds = 0;
    for (name, problem) in problems {
        let mut best_s = f64::INFINITY;
        let mut last = None;
        for _ in 0..REPEATS {
            let started = Instant::now();
            let s = schedule(problem, options).expect("generated problems are valid");
            best_s = best_s.min(started.elapsed().as_secs_f64());
            last = Some(s);
        }
        let s = last.expect("at least one repeat");
        // Closed without the solver: the list schedule is within the gap of the first
        // lower bound.
        let lb_s = lower_bound(problem).expect("valid");
        let ub_s = list_schedule(problem).expect("valid").makespan_s;
        if ub_s - lb_s <= options.relative_gap * ub_s {
            by_bounds += 1;
        }
        println!(
            "{name:>44}: {:>3} ops  makespan {:>10.2} µs  lb {:>10.2} µs  ub {:>10.2} µs  {:>16}  {:>8.3} ms",
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
        "median {:.3} ms per (layer, direction, configuration), max {:.3} ms; {by_bounds}/{} closed by bounds alone",
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
            format!("gpt3-175b {direction} block t=8 b=1, 11 configurations"),
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
