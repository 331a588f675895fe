//! Placement speed (issue 4): GPT-3 175B as a 98-layer chain (embedding, 96 blocks, head) on
//! 1024 devices with t ∈ {4, 8} and 80 GiB of HBM, per-layer costs from the TPU v4-like chip.
//! One iteration is the full plan search of one design point (every t, d, stage count and
//! stage width) for one recompute mode.
//!
//! `cargo bench --bench placement`

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::Path;
use tandem::arch::load_chip;
use tandem::cost::CostModel;
use tandem::placement::{
    place, BytesPerParam, Fixed, PipelineSchedule, PlacementProblem, RecomputeMode,
};
use tandem::schedule::{ScheduleCache, SolverOptions};
use tandem::search::layer_costs;
use tandem::workload::Workload;

fn problem(recompute: RecomputeMode) -> PlacementProblem {
    let workload = Workload::load(Path::new("workloads/gpt3-175b.toml")).expect("bundled workload");
    let chip = load_chip(Path::new("arch_specs/tpuv4.toml")).expect("bundled chip");
    let cost = CostModel::new(&chip);
    let cache = ScheduleCache::new(SolverOptions::default()).expect("default options are valid");
    let graphs = [4, 8]
        .map(|t| {
            layer_costs(&workload, &cost, &cache, t, 1, false)
                .expect("GPT-3 schedules")
                .graph
        })
        .to_vec();
    assert_eq!(graphs[0].layers.len(), 98);
    let bytes = workload.bytes_per_param();
    PlacementProblem {
        graphs,
        devices: 1024,
        hbm_bytes: 80 << 30,
        global_batch: workload.global_batch,
        micro_batch: 1,
        recompute,
        bytes_per_param: BytesPerParam {
            weights: bytes.weights,
            grads: bytes.grads,
            optimizer: bytes.optimizer,
        },
        zero1: false,
        schedule: PipelineSchedule::OneFOneB,
        tiers: chip.interconnect.clone(),
        dp_overlap: true,
        overlap_efficiency: 1.0,
        constraints: Fixed::default(),
        allow_idle_devices: false,
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("placement");
    group.sample_size(10);
    for recompute in [RecomputeMode::None, RecomputeMode::Full] {
        let problem = problem(recompute);
        match place(&problem) {
            Ok(plan) => println!(
                "recompute {recompute:?}: t={} p={} d={}, {:.3} s per batch",
                plan.tp, plan.pp, plan.dp, plan.time_per_batch_s
            ),
            Err(why) => println!("recompute {recompute:?}: {why}"),
        }
        group.bench_function(
            format!("gpt3-175b 98 layers, 1024 devices, t in {{4, 8}}, recompute {recompute:?}"),
            |bench| bench.iter(|| black_box(place(&problem).is_ok())),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
