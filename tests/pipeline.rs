//! The pipeline schedules against their closed forms: the discrete-event simulator
//! (`placement::simulate`) runs every micro-batch's operations on random instances and on the
//! plans the search returns, and the closed forms the search optimises must bound it (equal it
//! where docs/pipeline.md says they are exact), with the memory each replica holds equal to
//! what the model charges.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use tandem::arch::Tier;
use tandem::placement::{
    evaluate_fixed, place, simulate, simulate_plan, BytesPerParam, FixedPlan, FixedStage,
    LayerCost, LayerCostGraph, PipelineSchedule, PlacementProblem, RecomputeMode, SimOp,
    SimSchedule, TiedParams, ZeroStage,
};
use tandem::workload::ActivationBytes;

fn runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha))
}

/// Replica counts of `stages` stages, drawn from the last stage forwards so that each divides
/// the tensor groups after its stage (the 1F1B schedule's rule), at most `most` each.
fn divisible_replicas(draws: &[u32], most: u32) -> Vec<u32> {
    let mut after = 0;
    let mut replicas = Vec::with_capacity(draws.len());
    for &draw in draws.iter().rev() {
        let allowed: Vec<u32> = (1..=most).filter(|k| after % k == 0).collect();
        let k = allowed[draw as usize % allowed.len()];
        replicas.push(k);
        after += k;
    }
    replicas.reverse();
    replicas
}

fn op(forward_s: f64, backward_s: f64, accumulation_s: f64, replicas: u32) -> SimOp {
    SimOp {
        forward_s,
        backward_s,
        accumulation_s,
        replicas,
        kept_bytes: 1,
    }
}

/// `(m + K − 1) · maxᵢ (Fᵢ + Bᵢ + Aᵢ) / kᵢ`, the accumulation counted where a replica runs
/// more than one micro-batch.
fn one_f_one_b_closed_form(ops: &[SimOp], m: u64) -> f64 {
    let groups: u32 = ops.iter().map(|o| o.replicas).sum();
    let rate = ops
        .iter()
        .map(|o| {
            let k = u64::from(o.replicas);
            let acc = if m.div_ceil(k) >= 2 {
                o.accumulation_s
            } else {
                0.0
            };
            (o.forward_s + o.backward_s + acc) / k as f64
        })
        .fold(0.0, f64::max);
    (m + u64::from(groups) - 1) as f64 * rate
}

#[test]
fn one_f_one_b_closed_form_bounds_the_simulated_schedule() {
    let stage = (0.01f64..2.0, 0.01f64..4.0, 0.0f64..0.5, 0u32..64);
    let tight = std::cell::Cell::new(0);
    runner(400)
        .run(
            &(proptest::collection::vec(stage, 1..=8), 1u64..=64),
            |(stages, m)| {
                let draws: Vec<u32> = stages.iter().map(|s| s.3).collect();
                let replicas = divisible_replicas(&draws, 8);
                let ops: Vec<SimOp> = stages
                    .iter()
                    .zip(&replicas)
                    .map(|(&(f, b, a, _), &k)| op(f, b, a, k))
                    .collect();
                let sim = simulate(&ops, m, SimSchedule::OneFOneB).unwrap();
                let closed = one_f_one_b_closed_form(&ops, m);
                prop_assert!(
                    sim.makespan_s <= closed * (1.0 + 1e-12),
                    "{} > {closed}",
                    sim.makespan_s
                );
                if sim.makespan_s >= closed * (1.0 - 0.01) {
                    tight.set(tight.get() + 1);
                }
                // Each replica holds min(Kᵢ / kᵢ, ⌈m / kᵢ⌉) micro-batches.
                let mut after = 0;
                for (i, &k) in replicas.iter().enumerate().rev() {
                    after += k;
                    let held = u64::from(after / k).min(m.div_ceil(u64::from(k)));
                    prop_assert_eq!(sim.peak_in_flight[i], held, "stage {}", i);
                }
                Ok(())
            },
        )
        .unwrap();
    // The bound is reached, not only respected: within 1 % on some instances.
    assert!(tight.get() >= 10, "{} tight instances", tight.get());
}

#[test]
fn one_f_one_b_is_exact_for_one_replica_per_stage_and_equal_loads() {
    runner(300)
        .run(
            &(
                proptest::collection::vec(0.05f64..0.95, 1..=8),
                1u64..=64,
                0.1f64..5.0,
            ),
            |(splits, m, load)| {
                // Equal loads, each split differently between forward and backward.
                let ops: Vec<SimOp> = splits
                    .iter()
                    .map(|&s| op(s * load, (1.0 - s) * load, 0.0, 1))
                    .collect();
                let sim = simulate(&ops, m, SimSchedule::OneFOneB).unwrap();
                let closed = (m + ops.len() as u64 - 1) as f64 * load;
                prop_assert!((sim.makespan_s - closed).abs() <= 1e-9 * closed);
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn balanced_replicated_stages_simulate_within_one_replica_cycle_of_the_closed_form() {
    // Every stage at the same rate τ = 1: the staggered start the bound assumes costs at most
    // (largest replica count − 1) slots.
    runner(300)
        .run(
            &(
                proptest::collection::vec((0.05f64..0.95, 0u32..64), 1..=8),
                1u64..=64,
            ),
            |(stages, m)| {
                let draws: Vec<u32> = stages.iter().map(|s| s.1).collect();
                let replicas = divisible_replicas(&draws, 8);
                let ops: Vec<SimOp> = stages
                    .iter()
                    .zip(&replicas)
                    .map(|(&(s, _), &k)| op(s * f64::from(k), (1.0 - s) * f64::from(k), 0.0, k))
                    .collect();
                let sim = simulate(&ops, m, SimSchedule::OneFOneB).unwrap();
                let closed = one_f_one_b_closed_form(&ops, m);
                let most = f64::from(*replicas.iter().max().unwrap());
                prop_assert!(closed - sim.makespan_s <= (most - 1.0) + 1e-9);
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn replica_counts_that_do_not_divide_are_refused_by_the_schedule() {
    // 4 replicas before 5: the 1F1B order of replicated stages does not exist.
    let ops = [op(1.0, 2.0, 0.0, 4), op(1.0, 2.0, 0.0, 5)];
    let err = simulate(&ops, 8, SimSchedule::OneFOneB).unwrap_err();
    assert!(err.contains("4 replicas do not divide the 5"), "{err}");
}

#[test]
fn gpipe_closed_form_bounds_the_simulated_schedule() {
    let stage = (0.01f64..2.0, 0.01f64..4.0, 0.0f64..0.5, 1u32..=8);
    runner(300)
        .run(
            &(proptest::collection::vec(stage, 1..=8), 1u64..=48),
            |(stages, m)| {
                let ops: Vec<SimOp> = stages.iter().map(|&(f, b, a, k)| op(f, b, a, k)).collect();
                let sim = simulate(&ops, m, SimSchedule::GPipe).unwrap();
                let groups: u32 = ops.iter().map(|o| o.replicas).sum();
                let rate = |f: &dyn Fn(&SimOp) -> f64| {
                    ops.iter()
                        .map(|o| f(o) / f64::from(o.replicas))
                        .fold(0.0, f64::max)
                };
                let forward = rate(&|o| o.forward_s);
                let backward = rate(&|o| {
                    let acc = if m.div_ceil(u64::from(o.replicas)) >= 2 {
                        o.accumulation_s
                    } else {
                        0.0
                    };
                    o.backward_s + acc
                });
                let closed = (m + u64::from(groups) - 1) as f64 * (forward + backward);
                prop_assert!(sim.makespan_s <= closed * (1.0 + 1e-12));
                for (i, o) in ops.iter().enumerate() {
                    prop_assert_eq!(sim.peak_in_flight[i], m.div_ceil(u64::from(o.replicas)));
                }
                Ok(())
            },
        )
        .unwrap();
}

/// `min_f [(m·v + p − 1)·f + m·Σ_c (F_c − f)⁺]` over the chunks' own durations.
fn interleaved_part(durations: &[f64], slots: f64, m: f64) -> f64 {
    durations
        .iter()
        .map(|&f| slots * f + m * durations.iter().map(|&d| (d - f).max(0.0)).sum::<f64>())
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn interleaved_schedule_is_megatron_s_for_equal_chunks_and_bounded_otherwise() {
    runner(300)
        .run(
            &(
                1u32..=6,
                2u32..=4,
                1u64..=6,
                proptest::collection::vec((0.01f64..1.0, 0.01f64..2.0), 24),
                any::<bool>(),
            ),
            |(p, v, groups, loads, equal)| {
                let m = u64::from(p) * groups;
                let chunks = (p * v) as usize;
                let ops: Vec<SimOp> = (0..chunks)
                    .map(|c| {
                        let (f, b) = if equal { loads[0] } else { loads[c] };
                        op(f, b, 0.0, 1)
                    })
                    .collect();
                let sim = simulate(&ops, m, SimSchedule::Interleaved { stages: p }).unwrap();
                let slots = (m * u64::from(v) + u64::from(p) - 1) as f64;
                let forwards: Vec<f64> = ops.iter().map(|o| o.forward_s).collect();
                let backwards: Vec<f64> = ops.iter().map(|o| o.backward_s).collect();
                let closed = interleaved_part(&forwards, slots, m as f64)
                    + interleaved_part(&backwards, slots, m as f64);
                if equal {
                    // Narayanan et al. 2021: a bubble of (p − 1) / v of the non-interleaved one.
                    prop_assert!(
                        (sim.makespan_s - slots * (loads[0].0 + loads[0].1)).abs()
                            <= 1e-9 * sim.makespan_s
                    );
                }
                prop_assert!(sim.makespan_s <= closed * (1.0 + 1e-12));
                // Warm-up forwards plus one: p·v + p − 1 chunk activations on the first stage
                // (Korthikanti et al. 2022), all of them when m = p.
                for r in 0..u64::from(p) {
                    let p = u64::from(p);
                    let v = u64::from(v);
                    let held = if m == p {
                        m * v
                    } else {
                        (2 * (p - r - 1) + (v - 1) * p + 1).min(m * v)
                    };
                    prop_assert_eq!(sim.peak_in_flight[r as usize], held);
                }
                Ok(())
            },
        )
        .unwrap();
}

const GIB: u64 = 1 << 30;

/// A transformer-like chain: embedding, `blocks` equal blocks, a head.
fn transformer(blocks: usize, tp: u32) -> LayerCostGraph {
    let t = f64::from(tp);
    let layer = |name: String, fwd_s: f64, params: u64, act: u64| LayerCost {
        name,
        fwd_s: fwd_s / t,
        bwd_s: 2.0 * fwd_s / t,
        selective_recompute_s: 0.2 * fwd_s / t,
        recompute_skipped_s: 0.0,
        params: params / u64::from(tp),
        activation_bytes: ActivationBytes {
            none: act,
            selective: act / 2,
            full: act / 16,
        },
        output_bytes: 16 << 20,
        optimizer_step_s: 1e-4 / t,
        grad_accumulation_s: 5e-5 / t,
        grad_buffer_s: 0.0,
        replica_grad_sync_s: 0.0,
        expert_params: 0,
        all_to_all_bytes: 0,
        tied: None,
    };
    let mut layers = vec![layer("embedding".into(), 2e-4, 50_000_000, 32 << 20)];
    layers.extend((0..blocks).map(|i| layer(format!("block{i}"), 1e-3, 12_000_000, 256 << 20)));
    layers.push(layer("head".into(), 6e-3, 50_000_000, 512 << 20));
    let n = layers.len();
    LayerCostGraph {
        tp,
        layers,
        edges: (1..n).map(|j| (j - 1, j, 16 << 20)).collect(),
        replicated_edges: tp > 1,
        repeated_layers: Some([1, n - 1]),
    }
}

fn transformer_problem(
    devices: u32,
    global_batch: u64,
    schedule: PipelineSchedule,
) -> PlacementProblem {
    PlacementProblem {
        graphs: vec![transformer(16, 1), transformer(16, 2)],
        devices,
        hbm_bytes: 4 * GIB,
        global_batch,
        micro_batch: 1,
        recompute: RecomputeMode::Selective,
        bytes_per_param: BytesPerParam::ADAM_MIXED,
        zero: ZeroStage::Replicated,
        layout: Default::default(),
        schedule,
        tiers: vec![
            Tier {
                name: "node".into(),
                devices: 8,
                bandwidth_bytes_per_s: 100e9,
                latency_s: 3e-6,
            },
            Tier {
                name: "cluster".into(),
                devices: 1024,
                bandwidth_bytes_per_s: 10e9,
                latency_s: 20e-6,
            },
        ],
        dp_overlap: true,
        p2p_overlap: false,
        overlap_efficiency: 1.0,
        constraints: Default::default(),
        allow_idle_devices: false,
        allow_uneven_batch: false,
        only_data_parallel: None,
        experts: 0,
    }
}

#[test]
fn searched_plans_simulate_within_their_pipeline_time_holding_what_they_charge() {
    let mut replicated = 0;
    for schedule in [
        PipelineSchedule::OneFOneB,
        PipelineSchedule::GPipe,
        PipelineSchedule::Interleaved,
    ] {
        for (devices, batch) in [(8, 16), (16, 32), (24, 48), (32, 64), (64, 32)] {
            let problem = transformer_problem(devices, batch, schedule);
            let Ok(plan) = place(&problem) else {
                continue;
            };
            let sim = simulate_plan(&plan).unwrap();
            let split = plan.time_split;
            let pipeline_s = split.compute_s + split.bubble_s + split.pp_comm_s;
            assert!(
                sim.makespan_s <= pipeline_s * (1.0 + 1e-9),
                "{schedule:?} on {devices}: simulated {} > {pipeline_s}",
                sim.makespan_s
            );
            for (i, stage) in plan.stages.iter().enumerate() {
                assert_eq!(
                    sim.peak_in_flight[i], stage.in_flight,
                    "{schedule:?} stage {i}"
                );
                // The model charges the micro-batch being processed at its working set and
                // each other one at what it keeps: at least what the schedule holds.
                assert!(
                    sim.peak_held_bytes[i] <= stage.memory.activations + stage.memory.stash,
                    "{schedule:?} stage {i}"
                );
            }
            replicated += usize::from(plan.stages.iter().any(|s| s.replicas > 1));
        }
    }
    assert!(replicated >= 1, "no plan with replicated stages");
}

/// The interleaved schedule with the head tied to the embedding (its 50 M parameters held by
/// layer 0): on 2 devices in 2 chunks each, the head's chunk sits on the second device and
/// the embedding's on the first, so the second keeps a copy (16 B per parameter of state)
/// and both all-reduce its 2-byte gradients after the backward, a ring of two on the node
/// tier (100 GB/s, two latencies of 3 µs). The pipeline itself is unchanged: no stage sums
/// the two uses' gradients.
#[test]
fn an_interleaved_stage_holding_the_tied_head_keeps_a_copy() {
    let mut problem = transformer_problem(2, 16, PipelineSchedule::Interleaved);
    problem.graphs.truncate(1);
    problem.dp_overlap = false;
    problem.constraints.tp = Some(1);
    problem.constraints.pp = Some(2);
    problem.constraints.dp = Some(1);
    problem.constraints.virtual_stages = Some(2);
    problem.hbm_bytes = 64 * GIB;
    let untied = place(&problem).unwrap();
    const Q: u64 = 50_000_000;
    let head = problem.graphs[0].layers.last_mut().unwrap();
    head.params = 0;
    head.optimizer_step_s = 0.0;
    head.tied = Some(TiedParams {
        owner: 0,
        params: Q,
        optimizer_step_s: 1e-4,
        grad_accumulation_s: 0.0,
        grad_buffer_s: 0.0,
        // Summing the two gradients happens only where both uses share a stage: not here.
        grad_sum_s: 1e-3,
    });
    let tied = place(&problem).unwrap();
    let chunks = |plan: &tandem::placement::Plan| -> Vec<Vec<Vec<usize>>> {
        plan.stages
            .iter()
            .map(|s| s.chunks.iter().map(|c| c.layers.clone()).collect())
            .collect()
    };
    assert_eq!(chunks(&tied), chunks(&untied));
    let last = tied.stages[1].chunks.last().unwrap().layers.clone();
    assert_eq!(last.last(), Some(&17));
    // The head's own 50 M became the copy: the state is the same, the sync is new.
    assert_eq!(tied.stages[1].memory, untied.stages[1].memory);
    assert_eq!(tied.stages[0].memory, untied.stages[0].memory);
    let sync = 2.0 * Q as f64 / 100e9 + 2.0 * 3e-6;
    for (t, u) in tied.stages.iter().zip(&untied.stages) {
        assert!(
            (t.dp_comm_s - u.dp_comm_s - sync).abs() <= 1e-12,
            "{} - {} against {sync}",
            t.dp_comm_s,
            u.dp_comm_s
        );
    }
    let pipe = |p: &tandem::placement::Plan| {
        p.time_split.compute_s + p.time_split.bubble_s + p.time_split.pp_comm_s
    };
    assert_eq!(pipe(&tied), pipe(&untied));
}

#[test]
fn a_stage_replicated_k_times_is_not_priced_below_k_whole_pipelines() {
    // 16 equal blocks on 8 devices, one micro-batch per sample: 4 stages × 2 replicas and
    // 2 pipelines of 4 stages run the same work; the replicated plan's micro-batch still
    // crosses every stage's whole load, so it pays (m + K − 1) slots of L / 2 against the
    // pipelines' (m / 2 + p − 1) of L.
    let mut problem = transformer_problem(8, 16, PipelineSchedule::OneFOneB);
    problem.graphs.truncate(1);
    let quarters: Vec<Vec<usize>> = vec![
        (0..5).collect(),
        (5..9).collect(),
        (9..13).collect(),
        (13..18).collect(),
    ];
    let plan = |dp: u32, devices: u32| FixedPlan {
        tp: 1,
        dp,
        stages: quarters
            .iter()
            .map(|layers| FixedStage {
                layers: layers.clone(),
                devices,
            })
            .collect(),
    };
    let replicated = evaluate_fixed(&problem, &plan(1, 2)).unwrap();
    let pipelines = evaluate_fixed(&problem, &plan(2, 1)).unwrap();
    let pipe = |p: &tandem::placement::Plan| {
        p.time_split.compute_s + p.time_split.bubble_s + p.time_split.pp_comm_s
    };
    assert!(
        pipe(&replicated) >= pipe(&pipelines),
        "{} < {}",
        pipe(&replicated),
        pipe(&pipelines)
    );
    // Both are what the simulator runs, or more.
    for p in [&replicated, &pipelines] {
        assert!(simulate_plan(p).unwrap().makespan_s <= pipe(p) * (1.0 + 1e-12));
    }
    // 8 micro-batches per pipeline of 4 stages: (8 + 3) slots of the bottleneck load.
    let bottleneck = pipelines
        .stages
        .iter()
        .map(|s| s.load_s)
        .fold(0.0, f64::max);
    assert!((pipe(&pipelines) - 11.0 * bottleneck).abs() <= 1e-12 * pipe(&pipelines));
    // 16 micro-batches over 8 groups: (16 + 8 − 1) slots of half the bottleneck load.
    let bottleneck = replicated
        .stages
        .iter()
        .map(|s| s.load_s / 2.0)
        .fold(0.0, f64::max);
    assert!((pipe(&replicated) - 23.0 * bottleneck).abs() <= 1e-12 * pipe(&replicated));
}
