//! Placement speed: the plan search of one design point, in the cases that stress it.
//!
//! * `phaze-setting`: GPT-3 175B as a 98-layer chain (embedding, 96 blocks, head) with the
//!   TPU v4-like chip's per-layer costs, t ∈ {4, 8}, 1024 devices, 80 GiB, one interconnect
//!   tier at 4 GB/s, global batch 4096 at micro-batch 1, plain SGD (2 + 2 B per parameter,
//!   no optimizer state): PHAZE's own GPT-3 setting. Checked against the unpruned programme.
//! * `phaze-tpuv4-template gpt3-175b`: the same chain on the chip's own ICI, Adam, global batch 1536,
//!   recompute none and full.
//! * `h100 gpt3-175b, N devices`: list-schedule layer costs (`plan --no-ilp`), t ∈ {1, 2, 4,
//!   8}, 16,384 and 65,536 devices.
//! * `a100 plan <model>`: `tandem plan` with everything searched (micro-batch 1–8, every
//!   recompute mode, t ≤ 8) on 1,024 A100s: layer schedules (a fresh cache) and placements.
//! * `plan mixtral-8x7b` / `plan palm-540b`: micro-batch 1–2, selective and full recompute,
//!   ZeRO 0–3 and (Mixtral) expert parallelism searched, schedules cached: the placement
//!   searches of a mixture-of-experts model on 64 H100s and of PaLM on 6144 TPU v4 chips.
//!
//! `cargo bench --bench placement`

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::Path;
use tandem::arch::{load_chip, ArchConfig, Tier};
use tandem::cost::CostModel;
use tandem::model::{evaluate, layer_costs, PlanOptions};
use tandem::placement::{
    place, place_exhaustive, BytesPerParam, Fixed, PipelineSchedule, PlacementProblem,
    RecomputeMode, ZeroStage,
};
use tandem::schedule::{ScheduleCache, SolverOptions};
use tandem::workload::Workload;

fn chip(name: &str) -> ArchConfig {
    load_chip(Path::new(&format!("arch_specs/{name}.toml"))).expect("bundled chip")
}

fn gpt3() -> Workload {
    Workload::load(Path::new("workloads/gpt3-175b.toml")).expect("bundled workload")
}

/// GPT-3's placement problem on `chip` at the tensor widths `widths`, micro-batch 1.
fn problem(
    chip: &ArchConfig,
    widths: &[u32],
    devices: u32,
    solver: SolverOptions,
) -> PlacementProblem {
    let workload = gpt3();
    let cost = CostModel::new(chip);
    let cache = ScheduleCache::new(solver).expect("valid options");
    let graphs: Vec<_> = widths
        .iter()
        .map(|&t| {
            layer_costs(&workload, &cost, &cache, t, 1, false)
                .expect("GPT-3 schedules")
                .graph
        })
        .collect();
    assert_eq!(graphs[0].layers.len(), 98);
    PlacementProblem {
        graphs,
        devices,
        hbm_bytes: 80 << 30,
        global_batch: workload.global_batch,
        micro_batch: 1,
        recompute: RecomputeMode::None,
        bytes_per_param: workload.bytes_per_param().into(),
        zero: ZeroStage::Replicated,
        layout: Default::default(),
        schedule: PipelineSchedule::OneFOneB,
        tiers: chip.interconnect.clone(),
        dp_overlap: true,
        p2p_overlap: false,
        overlap_efficiency: 1.0,
        constraints: Fixed::default(),
        allow_idle_devices: false,
        allow_uneven_batch: false,
        only_data_parallel: None,
        experts: workload.experts(),
    }
}

fn report(name: &str, problem: &PlacementProblem) {
    match place(problem) {
        Ok(plan) => println!(
            "{name}: t={} p={} d={} K={}, {:.4} s per batch",
            plan.tp,
            plan.pp,
            plan.dp,
            plan.groups_per_pipeline(),
            plan.time_per_batch_s
        ),
        Err(why) => println!("{name}: {why}"),
    }
}

fn placement(c: &mut Criterion) {
    let mut group = c.benchmark_group("placement");
    group.sample_size(10);
    let tpu = chip("phaze-tpuv4-template");
    let tpu_problem = problem(&tpu, &[4, 8], 1024, SolverOptions::default());

    let phaze = PlacementProblem {
        tiers: vec![Tier {
            name: "phaze".into(),
            devices: 1024,
            bandwidth_bytes_per_s: 4e9,
            latency_s: 0.0,
        }],
        global_batch: 4096,
        bytes_per_param: BytesPerParam {
            weights: 2,
            grads: 2,
            optimizer: 0,
        },
        ..tpu_problem.clone()
    };
    let fast = place(&phaze).expect("a plan");
    let full = place_exhaustive(&phaze).expect("a plan");
    assert_eq!(
        fast.time_per_batch_s, full.time_per_batch_s,
        "pruned = unpruned"
    );
    report("phaze-setting", &phaze);
    group.bench_function(
        "phaze-setting gpt3-175b, 1024 devices, t in {4, 8}, 4 GB/s, SGD",
        |b| b.iter(|| black_box(place(&phaze).is_ok())),
    );

    for recompute in [RecomputeMode::None, RecomputeMode::Full] {
        let p = PlacementProblem {
            recompute,
            ..tpu_problem.clone()
        };
        report(&format!("phaze-tpuv4-template recompute {recompute:?}"), &p);
        group.bench_function(
            format!("phaze-tpuv4-template gpt3-175b, 1024 devices, t in {{4, 8}}, recompute {recompute:?}"),
            |b| b.iter(|| black_box(place(&p).is_ok())),
        );
    }

    let list_only = SolverOptions {
        use_ilp: false,
        ..SolverOptions::default()
    };
    let h100 = chip("h100");
    for devices in [16_384, 65_536] {
        let p = problem(&h100, &[1, 2, 4, 8], devices, list_only);
        report(&format!("h100 {devices}"), &p);
        group.bench_function(
            format!("h100 gpt3-175b, {devices} devices, t in {{1, 2, 4, 8}}"),
            |b| b.iter(|| black_box(place(&p).is_ok())),
        );
    }

    let a100 = chip("a100");
    for model in ["megatron-gpt2-8.3b", "gpt3-175b"] {
        let workload = Workload::load(Path::new(&format!("workloads/{model}.toml")))
            .expect("bundled workload");
        let options = PlanOptions::searching(1024);
        group.bench_function(
            format!("a100 plan {model}, 1024 devices, everything searched"),
            |b| {
                b.iter(|| {
                    let cache =
                        ScheduleCache::new(SolverOptions::default()).expect("valid options");
                    black_box(evaluate(&workload, &a100, &options, &cache).is_ok())
                })
            },
        );
    }

    // Expert parallelism (a fourth axis) and all four ZeRO stages: Mixtral on 64 H100s, and
    // PaLM 540B on 6144 TPU v4 chips in two pods, everything else searched as `plan` does.
    let h100 = chip("h100.calibrated");
    for (model, arch, devices) in [("mixtral-8x7b", &h100, 64), ("palm-540b", &tpu, 6144)] {
        let workload = Workload::load(Path::new(&format!("workloads/{model}.toml")))
            .expect("bundled workload");
        let options = PlanOptions {
            micro_batches: vec![1, 2],
            recompute: vec![RecomputeMode::Selective, RecomputeMode::Full],
            zero: ZeroStage::ALL.to_vec(),
            ..PlanOptions::searching(devices)
        };
        let cache = ScheduleCache::new(SolverOptions::default()).expect("valid options");
        assert!(evaluate(&workload, arch, &options, &cache).is_ok());
        group.bench_function(
            format!(
                "{} plan {model}, {devices} devices, ZeRO 0-3 searched (schedules cached)",
                arch.name
            ),
            |b| b.iter(|| black_box(evaluate(&workload, arch, &options, &cache).is_ok())),
        );
    }
    group.finish();
}

criterion_group!(benches, placement);
criterion_main!(benches);
