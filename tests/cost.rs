//! Cost model tests: hand-derived cases on toy chips, formula checks, and validation against
//! measured A100 kernels (`data/reference/a100_kernels/`, LLMCompass artifact).
//! Run with `--nocapture` to see the error tables.

use std::collections::BTreeSet;
use std::path::Path;
use tandem::arch::{
    fewest_in_domain, group_link, ArchConfig, Efficiency, EnergyCosts, GlobalBuffer, Hbm,
    KernelExecution, RowBandwidth, TensorCores, Tier, VectorCores, VectorCycles,
};
use tandem::calibrate::{load_measurements, Target};
use tandem::cost::{
    class_errors, collective_cost, fit_efficiency, fit_static_power, gemm_cost, peak_power,
    predicted_latency_s, vector_cost, Bound, CostModel, Decomposition, KernelSample, MemoryLevel,
    PowerSample,
};
use tandem::error::{parse_toml, read_input, InputError};
use tandem::workload::{
    AttentionShape, CollectiveKind, CoreType, Launches, Op, OpKind, Pass, VectorOp, Workload,
};

const KERNELS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/reference/a100_kernels");

fn load_chip(name: &str) -> ArchConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("arch_specs")
        .join(format!("{name}.toml"));
    let text = read_input(&path).expect("chip file readable");
    parse_toml(&path, &text).expect("chip file parses")
}

fn rel_err(predicted: f64, measured: f64) -> f64 {
    (predicted - measured).abs() / measured
}

/// A chip with `cores` 4×4 arrays at 1 GHz, effectively unlimited buffers and bandwidth,
/// no overheads and ideal efficiency: only the array's cycles count.
fn toy_chip(cores: u32) -> ArchConfig {
    ArchConfig {
        name: "toy".into(),
        clock_hz: 1e9,
        tensor: TensorCores {
            count: cores,
            rows: 4,
            cols: 4,
            local_buffer_bytes: 1 << 40,
            stream_k: false,
        },
        vector: VectorCores {
            count: cores,
            lanes: 4,
            local_buffer_bytes: 1 << 40,
        },
        glb: GlobalBuffer {
            bytes: 1 << 50,
            bandwidth_bytes_per_s: 1e30,
        },
        hbm: Hbm {
            capacity_bytes: 1 << 40,
            bandwidth_bytes_per_s: 1e30,
        },
        interconnect: vec![
            Tier {
                name: "fast".into(),
                devices: 8,
                bandwidth_bytes_per_s: 100e9,
                latency_s: 2e-6,
            },
            Tier {
                name: "slow".into(),
                devices: 1024,
                bandwidth_bytes_per_s: 10e9,
                latency_s: 10e-6,
            },
        ],
        efficiency: Efficiency::default(),
        vector_cycles: VectorCycles::default(),
        energy: EnergyCosts {
            mac_j: 1e-12,
            vector_op_j: 1e-12,
            local_byte_j: 0.0,
            glb_byte_j: 0.0,
            hbm_byte_j: 10e-12,
            link_byte_j: 100e-12,
            static_power_w_per_mm2: 0.0,
        },
        die_area_mm2: None,
        kernel_execution: KernelExecution::Concurrent,
    }
}

fn assert_close(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= 1e-9 * expected.abs().max(1e-30),
        "{what}: got {actual:e}, expected {expected:e}"
    );
}

#[test]
fn toy_compute_bound_gemm_is_quantised_cycles_over_clock() {
    let chip = toy_chip(1);
    // 8×8×8 on one 4×4 array: the best tile is 8×8 (largest candidate, one tile):
    // ceil(8/4)·ceil(8/4)·K = 4·8 = 32 streaming cycles + fill/drain 4 + 4 − 2 = 6 → 38.
    let c = gemm_cost(&chip, 1, 8, 8, 8, 2, 1);
    assert_eq!(c.compute_cycles, 38);
    assert_close(c.latency_s, 38e-9, "8x8x8 latency");
    assert_eq!(c.bound, Bound::Compute);
    // M = 6 pads to the 8-row tile: tile quantisation charges the full 38 cycles.
    let c = gemm_cost(&chip, 1, 6, 8, 8, 2, 1);
    assert_eq!(c.compute_cycles, 38);
    // A 4×4×100 GEMM: one pass of K = 100 plus fill/drain 6.
    let c = gemm_cost(&chip, 1, 4, 4, 100, 2, 1);
    assert_close(c.latency_s, 106e-9, "4x4x100 latency");
    // Energy: 4·4·100 MACs at 1 pJ plus HBM bytes (A, B, C once each: 800 + 800 + 32) at 10 pJ.
    assert_close(c.energy_j, 1600e-12 + 1632.0 * 10e-12, "4x4x100 energy");
}

#[test]
fn toy_wave_quantisation_tiles_plus_one_is_two_waves() {
    // 160×32×16 on 4 cores of 4×4. Candidates: tile edges 4..32. One 32×32 tile per core
    // would be 5 tiles = 2 waves × (8·8·16 + 6) = 2060 cycles; the best are 20 tiles of
    // 8×32 (or 16×16, 32×8) = 5 waves × (2·8·16 + 6) = 1310 cycles; 8×32 comes first.
    let chip = toy_chip(4);
    let c = gemm_cost(&chip, 1, 160, 32, 16, 2, 4);
    assert_eq!((c.tile.m, c.tile.n), (8, 32));
    assert_eq!(c.waves, 5);
    assert_eq!(c.compute_cycles, 1310);
    assert_close(c.latency_s, 1310e-9, "160x32x16 latency");
    // With exactly cores + 1 = 5 tiles of the maximal size forced by a 1-tile-wide chip:
    // M = 5·4 = 20 on a chip whose buffer only fits a 4×4 tile → 5 tiles, 4 cores, 2 waves.
    let mut small = toy_chip(4);
    // Room for one 4×4 tile: operands 2·(4+4)·4·2 B = 128 B + accumulators 4·4·4 B = 64 B.
    small.tensor.local_buffer_bytes = 192;
    let c = gemm_cost(&small, 1, 20, 4, 4, 2, 4);
    assert_eq!(c.tile.m, 4);
    assert_eq!(c.tile.n, 4);
    assert_eq!(c.cores_used, 4);
    assert_eq!(c.waves, 2);
    assert_eq!(c.compute_cycles, 2 * (4 + 6));
    // Four tiles fit in one wave.
    let c = gemm_cost(&small, 1, 16, 4, 4, 2, 4);
    assert_eq!(c.waves, 1);
    assert_eq!(c.compute_cycles, 4 + 6);
}

/// Stream-K against a unit-by-unit simulation: every tile's K slices are dealt in order to the
/// cores in equal runs, each core pays its slices' array cycles and one fill/drain per tile it
/// touches, and the GEMM takes the busiest core; the model keeps the faster of that and waves.
#[test]
fn toy_stream_k_matches_dealing_k_slices_to_cores() {
    let mut chip = toy_chip(4);
    // Room for one 4×4 tile only (as above), so every shape has one tiling.
    chip.tensor.local_buffer_bytes = 192;
    chip.tensor.stream_k = true;
    let fill_drain = 6;
    let simulate = |tiles: u64, k: u64, cores: u64| -> u64 {
        let slices = k.div_ceil(4);
        let units = tiles * slices;
        let per_core = units.div_ceil(cores.min(units));
        let mut busy = vec![(0u64, None::<u64>); cores as usize];
        let mut touched = vec![0u64; cores as usize];
        for unit in 0..units {
            let core = (unit / per_core) as usize;
            let tile = unit / slices;
            if busy[core].1 != Some(tile) {
                touched[core] += 1;
                busy[core].1 = Some(tile);
            }
            busy[core].0 += 1;
        }
        (0..cores as usize)
            .filter(|&c| busy[c].0 > 0)
            .map(|c| (busy[c].0 * k).div_ceil(slices) + touched[c] * fill_drain)
            .max()
            .unwrap_or(0)
    };
    let mut stream_k_won = 0;
    for tiles in 1..=13u64 {
        for k in [4, 8, 16, 28, 64] {
            let c = gemm_cost(&chip, 1, 4 * tiles, 4, k, 2, 4);
            let waves = tiles.div_ceil(4) * (k + fill_drain);
            let streamed = simulate(tiles, k, 4);
            assert_eq!(
                c.compute_cycles,
                waves.min(streamed),
                "{tiles} tiles, K = {k}"
            );
            if streamed < waves {
                assert_eq!(c.decomposition, Decomposition::StreamK);
                stream_k_won += 1;
            }
        }
    }
    assert!(
        stream_k_won >= 20,
        "Stream-K won {stream_k_won} of 65 shapes"
    );
    // Hand-derived: 5 tiles of K = 16 (4 slices each) on 4 cores: waves take 2 × (16 + 6) = 44
    // cycles; Stream-K deals 5 slices to each core, which touches 2 tiles: 5·4 + 2·6 = 32.
    let c = gemm_cost(&chip, 1, 20, 4, 16, 2, 4);
    assert_eq!(
        (c.decomposition, c.compute_cycles),
        (Decomposition::StreamK, 32)
    );
    // Three runs start inside a tile: three 4×4 fp32 partial tiles written and read back.
    // Besides A once (640 B), B once per tile row (5 × 128 B) and C once (160 B).
    assert_close(c.glb_bytes, 1440.0 + 3.0 * 2.0 * 64.0, "Stream-K GLB bytes");
    // Off (the default), the same GEMM runs in waves.
    chip.tensor.stream_k = false;
    let c = gemm_cost(&chip, 1, 20, 4, 16, 2, 4);
    assert_eq!(
        (c.decomposition, c.compute_cycles),
        (Decomposition::Waves, 44)
    );
}

#[test]
fn toy_memory_bound_gemm_is_bytes_over_bandwidth() {
    let mut chip = toy_chip(1);
    chip.hbm.bandwidth_bytes_per_s = 1e9;
    // 4×4096×4096 fp16 with the GLB holding everything: HBM traffic is compulsory,
    // A 4·4096·2 + B 4096·4096·2 + C 4·4096·2 bytes; compute is 1024 passes of 4096 cycles
    // (4.2 ms) against 33.6 ms of traffic.
    let c = gemm_cost(&chip, 1, 4, 4096, 4096, 2, 1);
    let bytes = (4 * 4096 * 2 + 4096 * 4096 * 2 + 4 * 4096 * 2) as f64;
    assert_close(c.hbm_bytes, bytes, "compulsory HBM bytes");
    assert_close(c.latency_s, bytes / 1e9, "memory-bound latency");
    assert_eq!(c.bound, Bound::Memory(MemoryLevel::Hbm));
    // Efficiency scales the achieved bandwidth and the overhead adds on top.
    chip.efficiency.hbm_bandwidth = 0.5;
    chip.efficiency.gemm_overhead_s = 1e-6;
    let c = gemm_cost(&chip, 1, 4, 4096, 4096, 2, 1);
    assert_close(c.latency_s, bytes / 0.5e9 + 1e-6, "derated latency");
}

#[test]
fn toy_gemm_rereads_when_glb_is_small() {
    // One core, GLB of 1 KiB: no panel set of a 64×64×64 fp16 GEMM fits (one 32-row panel
    // is 4 KiB), so blocks are single tiles (a one-tile wave) and HBM sees A once per tile
    // column and B once per tile row — exactly the GLB → local traffic.
    let mut chip = toy_chip(1);
    chip.glb.bytes = 1024;
    let c = gemm_cost(&chip, 1, 64, 64, 64, 2, 1);
    let (a, b, out) = (64.0 * 64.0 * 2.0, 64.0 * 64.0 * 2.0, 64.0 * 64.0 * 2.0);
    let (tm, tn) = (64.0 / c.tile.m as f64, 64.0 / c.tile.n as f64);
    assert_close(c.glb_bytes, a * tn + b * tm + out, "GLB bytes");
    assert_close(c.hbm_bytes, c.glb_bytes, "HBM bytes with no reuse");
}

#[test]
fn collective_formulas_for_eight_devices() {
    let chip = toy_chip(1);
    let s = 1e9 as u64;
    let (b, a) = (100e9, 2e-6);
    let n = 8.0;
    let ar = collective_cost(&chip, CollectiveKind::AllReduce, s, 8);
    assert_close(
        ar.latency_s,
        2.0 * (n - 1.0) / n * 1e9 / b + 2.0 * (n - 1.0) * a,
        "all-reduce",
    );
    assert_eq!(ar.tier.as_deref(), Some("fast"));
    assert_close(
        ar.energy_j,
        2.0 * 7.0 / 8.0 * 1e9 * 100e-12,
        "all-reduce energy",
    );
    for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
        let c = collective_cost(&chip, kind, s, 8);
        assert_close(
            c.latency_s,
            (n - 1.0) / n * 1e9 / b + (n - 1.0) * a,
            "ag/rs",
        );
    }
    let p2p = collective_cost(&chip, CollectiveKind::SendRecv, s, 2);
    assert_close(p2p.latency_s, 1e9 / b + a, "send/recv");
    // Nine devices leave the 8-device tier.
    let c = collective_cost(&chip, CollectiveKind::AllGather, s, 9);
    assert_eq!(c.tier.as_deref(), Some("slow"));
    assert_close(
        c.latency_s,
        8.0 / 9.0 * 1e9 / 10e9 + 8.0 * 10e-6,
        "slow tier",
    );
    // A group of one moves nothing.
    assert_eq!(
        collective_cost(&chip, CollectiveKind::AllReduce, s, 1).latency_s,
        0.0
    );
}

#[test]
fn a100_tier_selection() {
    let a100 = load_chip("a100");
    let eff = a100.efficiency.link_bandwidth;
    let s = (1u64 << 30) as f64;
    let eight = collective_cost(&a100, CollectiveKind::AllReduce, 1 << 30, 8);
    assert_eq!(eight.tier.as_deref(), Some("nvlink"));
    assert_close(
        eight.latency_s,
        2.0 * 7.0 / 8.0 * s / (300e9 * eff) + 14.0 * 5e-6,
        "8-GPU all-reduce on NVLink",
    );
    // Two full nodes: eight rings, one per GPU's NIC, 8 x 25 GB/s (below NVLink's 300).
    let c = collective_cost(&a100, CollectiveKind::AllReduce, 1 << 30, 16);
    assert_eq!(c.tier.as_deref(), Some("infiniband"));
    assert_close(
        c.latency_s,
        2.0 * 15.0 / 16.0 * s / (200e9 * eff) + 30.0 * 10e-6,
        "16-GPU all-reduce on InfiniBand",
    );
    // Twelve GPUs leave four in the second node: four rails.
    let c = collective_cost(&a100, CollectiveKind::AllReduce, 1 << 30, 12);
    assert_close(
        c.latency_s,
        2.0 * 11.0 / 12.0 * s / (100e9 * eff) + 22.0 * 10e-6,
        "12-GPU all-reduce on InfiniBand",
    );
    // A send crosses one link whatever the group.
    let p2p = collective_cost(&a100, CollectiveKind::SendRecv, 1 << 30, 16);
    assert_close(p2p.latency_s, s / (25e9 * eff) + 10e-6, "send over one NIC");
}

#[test]
fn multi_rail_group_links() {
    let tier = |name: &str, devices, bandwidth_bytes_per_s| Tier {
        name: name.into(),
        devices,
        bandwidth_bytes_per_s,
        latency_s: 0.0,
    };
    let tiers = [tier("node", 8, 300e9), tier("network", 1024, 25e9)];
    let link = |span, fewest: u32| {
        let l = group_link(&tiers, span, |_| fewest).unwrap();
        (l.tier.name.clone(), l.bandwidth_bytes_per_s)
    };
    assert_eq!(link(8, 1), ("node".into(), 300e9));
    assert_eq!(link(32, 1), ("network".into(), 25e9));
    assert_eq!(link(32, 4), ("network".into(), 100e9));
    // Bounded by the node's links, which carry every ring inside it.
    let fast_nics = [tier("node", 8, 300e9), tier("network", 1024, 50e9)];
    assert_eq!(
        group_link(&fast_nics, 64, |_| 8)
            .unwrap()
            .bandwidth_bytes_per_s,
        300e9
    );
    // Beyond the last tier: the last tier.
    assert_eq!(link(4096, 2), ("network".into(), 50e9));
    assert!(group_link(&[], 8, |_| 1).is_none());

    // Members `stride` apart from a domain boundary, domains of 8.
    assert_eq!(fewest_in_domain(32, 1, 8), 8);
    assert_eq!(fewest_in_domain(9, 1, 8), 1);
    assert_eq!(fewest_in_domain(12, 1, 8), 4);
    assert_eq!(fewest_in_domain(32, 2, 8), 4);
    assert_eq!(fewest_in_domain(3, 2, 8), 3);
    assert_eq!(fewest_in_domain(32, 8, 8), 1);
    assert_eq!(fewest_in_domain(32, 16, 8), 1);
    // A stride that does not divide the domain may leave one member in some domain.
    assert_eq!(fewest_in_domain(32, 3, 8), 1);
}

#[test]
fn all_cores_never_slower_than_one_core_for_big_gemms() {
    for chip in ["a100", "h100", "phaze-tpuv4-template"].map(load_chip) {
        for (m, n, k) in [(4096, 4096, 4096), (8192, 1024, 12288), (2048, 50304, 1600)] {
            let one = gemm_cost(&chip, 1, m, n, k, 2, 1);
            let all = gemm_cost(&chip, 1, m, n, k, 2, chip.tensor.count);
            assert!(
                all.latency_s <= one.latency_s,
                "{}: {m}x{n}x{k}: all {} > one {}",
                chip.name,
                all.latency_s,
                one.latency_s
            );
            if chip.tensor.count > 1 {
                // Big GEMMs scale nearly linearly: at least half the core count.
                let speedup = one.latency_s / all.latency_s;
                assert!(
                    speedup >= f64::from(chip.tensor.count) / 2.0,
                    "speed-up {speedup}"
                );
            }
        }
    }
}

#[test]
fn vector_op_on_a100_is_memory_bound_for_large_n() {
    let a100 = load_chip("a100");
    let n = 1u64 << 28;
    for op in [
        VectorOp::Add,
        VectorOp::Gelu,
        VectorOp::LayerNorm,
        VectorOp::Softmax,
    ] {
        let c = vector_cost(&a100, op, Pass::Forward, n, 4096, 2, a100.vector.count);
        assert_eq!(c.bound, Bound::Memory(MemoryLevel::Hbm), "{op:?}");
        assert!(c.compute_s < c.hbm_s);
        assert_close(
            c.latency_s,
            c.hbm_bytes
                / (a100.hbm.bandwidth_bytes_per_s
                    * a100
                        .efficiency
                        .hbm_bandwidth_for_rows(op, Pass::Forward, 4096))
                + a100.efficiency.vector_overhead_for(op, Pass::Forward),
            "memory-bound latency",
        );
    }
    // Add reads two operands and writes one: 3 · 2 bytes per element.
    let c = vector_cost(
        &a100,
        VectorOp::Add,
        Pass::Forward,
        n,
        1,
        2,
        a100.vector.count,
    );
    assert_close(c.hbm_bytes, 6.0 * n as f64, "add bytes");
    // A layout copy reads and writes each element once and does no arithmetic: 2 · 2 bytes
    // per element, at 0.46 of 2039 GB/s for the strided transpose (and its gradient's
    // transpose back) and 0.36 for the QKV-gradient stack, plus the default 12.6 µs: 2^28
    // elements take 1.157 and 1.475 ms.
    for (op, pass, fraction, expected_s) in [
        (VectorOp::Copy, Pass::Forward, 0.46, 1.157e-3),
        (VectorOp::Copy, Pass::Backward, 0.46, 1.157e-3),
        (VectorOp::Stack, Pass::Backward, 0.36, 1.475e-3),
    ] {
        let c = vector_cost(&a100, op, pass, n, 1, 2, a100.vector.count);
        assert_close(c.hbm_bytes, 4.0 * n as f64, "copy bytes");
        assert_eq!(c.compute_s, 0.0);
        assert_close(
            c.latency_s,
            4.0 * n as f64 / (2.039e12 * fraction) + 12.6e-6,
            "copy latency",
        );
        assert!(
            (c.latency_s / expected_s - 1.0).abs() < 1e-3,
            "copy latency, rounded: {}",
            c.latency_s
        );
    }
    // A cast from fp16 to fp32 (and its backward, back to fp16) reads 2 and writes 4 bytes per
    // element, one conversion per lane each: memory-bound, 2^28 elements take 1.352 ms up
    // (0.59 of the bandwidth) and 0.871 ms down (0.92).
    for (pass, fraction, expected_s) in [
        (Pass::Forward, 0.59, 1.352e-3),
        (Pass::Backward, 0.92, 0.871e-3),
    ] {
        let c = vector_cost(&a100, VectorOp::Cast, pass, n, 1, 2, a100.vector.count);
        assert_close(c.hbm_bytes, 6.0 * n as f64, "cast bytes");
        assert_eq!(c.bound, Bound::Memory(MemoryLevel::Hbm));
        assert_close(
            c.latency_s,
            6.0 * n as f64 / (2.039e12 * fraction) + 12.6e-6,
            "cast latency",
        );
        assert!(
            (c.latency_s / expected_s - 1.0).abs() < 1e-3,
            "cast latency, rounded: {}",
            c.latency_s
        );
    }
}

/// The bytes an operator shows (`tandem inspect`) are the bytes its kernel is priced at: one
/// traffic table serves both. Every element-wise kernel of a GPT block and its head, forward
/// and backward, and of the optimizer step (reductions add a second read of their rows).
#[test]
fn shown_bytes_are_the_priced_bytes() {
    let a100 = load_chip("a100");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/gpt3-175b.toml");
    let gpt3 = Workload::load(&path).expect("workload");
    let graph = gpt3.layer_graph(8, 1, false).expect("graph");
    let mut ops: Vec<Op> = gpt3.optimizer_step_ops(&[1 << 20]);
    for layer in &graph.layers {
        ops.extend(layer.fwd.ops.iter().chain(&layer.bwd.ops).cloned());
    }
    let mut checked = BTreeSet::new();
    for op in &ops {
        let OpKind::Vector {
            op: prim,
            elements,
            row_len,
            pass,
        } = op.kind
        else {
            continue;
        };
        if row_len > 1 {
            continue;
        }
        let c = vector_cost(&a100, prim, pass, elements, 1, op.elem_bytes, 108);
        assert_close(
            c.hbm_bytes,
            (op.bytes_read + op.bytes_written) as f64,
            &op.name,
        );
        checked.insert((prim, pass));
    }
    // Residual and bias adds, GeLU, dropout, copies, casts and Adam, both ways where they run.
    assert!(checked.len() >= 10, "{checked:?}");
}
#[test]
fn toy_vector_compute_is_cycles_per_lane() {
    let chip = toy_chip(2);
    // Softmax with default cycles: mul 1 + 4 adds + exp 15 + div 10 = 30 lane-cycles per
    // element. 8 rows of 16 on 2 cores × 4 lanes: 4 rows · 16 / 4 lanes = 16 lane-steps.
    let c = vector_cost(&chip, VectorOp::Softmax, Pass::Forward, 128, 16, 2, 2);
    assert_close(c.cycles_per_element, 30.0, "softmax cycles");
    assert_close(c.latency_s, 16.0 * 30.0 / 1e9, "softmax latency");
    assert_eq!(c.bound, Bound::Compute);
    // One core does all 8 rows: twice the time.
    let c = vector_cost(&chip, VectorOp::Softmax, Pass::Forward, 128, 16, 2, 1);
    assert_close(c.latency_s, 32.0 * 30.0 / 1e9, "one-core softmax");
    // 9 rows on 2 cores: row quantisation gives 5 rows on the busier core.
    let c = vector_cost(&chip, VectorOp::Add, Pass::Forward, 9 * 16, 16, 2, 2);
    assert_close(c.latency_s, 5.0 * 16.0 / 4.0 / 1e9, "row quantisation");
}

/// A bandwidth table by row length is linear in log2(row length) between its lengths and flat
/// beyond them, and overrides the primitive's single value in its own pass only.
#[test]
fn row_length_tables_interpolate_in_log_row_length() {
    let table = RowBandwidth {
        op: VectorOp::Softmax,
        pass: Pass::Forward,
        row_len: vec![512, 2048, 8192],
        hbm_bandwidth: vec![1.0, 0.5, 0.4],
    };
    assert_eq!(table.at(32), 1.0);
    assert_eq!(table.at(512), 1.0);
    // 1024 is halfway between 512 and 2048 in log2.
    assert_close(table.at(1024), 0.75, "1024");
    assert_close(table.at(4096), 0.45, "4096");
    assert_eq!(table.at(1 << 20), 0.4);
    let mut chip = toy_chip(1);
    chip.hbm.bandwidth_bytes_per_s = 1e9;
    chip.efficiency.row_hbm_bandwidth = vec![table];
    // Softmax streams its row twice and writes once: 3 · 2 B per element over 0.75 GB/s.
    let n = 1 << 20;
    let forward = vector_cost(&chip, VectorOp::Softmax, Pass::Forward, n, 1024, 2, 1);
    assert_close(forward.hbm_s, 6.0 * n as f64 / 0.75e9, "forward at 1024");
    // The backward has no table: the shared fraction (1 on the toy chip).
    let backward = vector_cost(&chip, VectorOp::Softmax, Pass::Backward, n, 1024, 2, 1);
    assert_close(backward.hbm_s, backward.hbm_bytes / 1e9, "backward");
}

/// A fused causal softmax reads its row up to the diagonal and writes all of it: 0.5 + 1
/// tensors forward (3 B per fp16 element) and 2 · 0.5 + 1 backward (4 B), with the row on chip
/// (no second read), against the plain softmax's 6 and 8 B.
#[test]
fn causal_softmax_reads_up_to_the_diagonal() {
    let a100 = load_chip("a100");
    let n: u64 = 1 << 24;
    for (pass, causal_bytes, plain_bytes) in [(Pass::Forward, 3.0, 6.0), (Pass::Backward, 4.0, 8.0)]
    {
        let causal = vector_cost(&a100, VectorOp::CausalSoftmax, pass, n, 2048, 2, 108);
        let plain = vector_cost(&a100, VectorOp::Softmax, pass, n, 2048, 2, 108);
        assert_close(causal.hbm_bytes, causal_bytes * n as f64, "causal bytes");
        assert_close(plain.hbm_bytes, plain_bytes * n as f64, "plain bytes");
    }
}

#[test]
fn reductions_reread_rows_that_do_not_fit_local_buffer() {
    let mut chip = toy_chip(1);
    chip.hbm.bandwidth_bytes_per_s = 1e9;
    chip.vector.local_buffer_bytes = 8 * 1024;
    // A staged 512-element row needs 4 fp32 copies (input and output, double-buffered):
    // 4 · 4 B · 512 = 8 KiB: fits, so LayerNorm reads once and writes once (2 + 2 B).
    let n = 1u64 << 20;
    let fits = vector_cost(&chip, VectorOp::LayerNorm, Pass::Forward, n, 512, 2, 1);
    assert!(fits.row_fits_local);
    assert_close(fits.hbm_bytes, 4.0 * n as f64, "one read one write");
    assert_close(
        fits.latency_s,
        4.0 * n as f64 / 1e9,
        "memory-bound layernorm",
    );
    let spills = vector_cost(&chip, VectorOp::LayerNorm, Pass::Forward, n, 1024, 2, 1);
    assert!(!spills.row_fits_local);
    assert_close(spills.hbm_bytes, 6.0 * n as f64, "two reads one write");
    // Softmax streams its statistics pass: two reads even for short rows.
    let softmax = vector_cost(&chip, VectorOp::Softmax, Pass::Forward, n, 64, 2, 1);
    assert_close(softmax.hbm_bytes, 6.0 * n as f64, "softmax bytes");
    // Cross-entropy writes one value per row only.
    let xent = vector_cost(&chip, VectorOp::CrossEntropy, Pass::Forward, n, 64, 2, 1);
    assert_close(xent.hbm_bytes, 4.0 * n as f64, "cross-entropy bytes");
}

#[test]
fn cost_model_memoises_and_matches_direct_models() {
    let a100 = load_chip("a100");
    let model = CostModel::new(&a100);
    let gemm = Op {
        name: "qkv".into(),
        kind: OpKind::Gemm {
            batch: 1,
            m: 8192,
            n: 4608,
            k: 1536,
        },
        elem_bytes: 2,
        flops: 2.0 * 8192.0 * 4608.0 * 1536.0,
        bytes_read: 0,
        bytes_written: 0,
        launches: Launches::default(),
        asynchronous: false,
    };
    let c = model.op_cost(&gemm);
    assert_eq!(c.core, CoreType::Tensor);
    let direct = gemm_cost(&a100, 1, 8192, 4608, 1536, 2, 108);
    assert_eq!(c.all_cores_s, direct.latency_s);
    assert_eq!(c.all_cores_bound, direct.bound);
    assert_eq!(
        c.one_core_s,
        gemm_cost(&a100, 1, 8192, 4608, 1536, 2, 1).latency_s
    );
    // Same kind and width, different name: served from the memo, identical.
    let renamed = Op {
        name: "other".into(),
        ..gemm.clone()
    };
    assert_eq!(model.op_cost(&renamed), c);
    // Parallel callers agree with the sequential answer.
    let ops: Vec<Op> = (0..64)
        .map(|i| Op {
            name: format!("v{i}"),
            kind: OpKind::Vector {
                op: VectorOp::Gelu,
                elements: 1 << (10 + i % 16),
                row_len: 1,
                pass: Pass::Forward,
            },
            elem_bytes: 2,
            flops: 0.0,
            bytes_read: 0,
            bytes_written: 0,
            launches: Launches::default(),
            asynchronous: false,
        })
        .collect();
    let fresh = CostModel::new(&a100);
    let parallel: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ops
            .chunks(16)
            .map(|chunk| s.spawn(|| chunk.iter().map(|o| fresh.op_cost(o)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let sequential: Vec<_> = ops.iter().map(|o| model.op_cost(o)).collect();
    assert_eq!(parallel, sequential);
    let link = Op {
        name: "ar".into(),
        kind: OpKind::Collective {
            collective: CollectiveKind::AllReduce,
            bytes: 1 << 26,
            group: 8,
        },
        elem_bytes: 2,
        flops: 0.0,
        bytes_read: 0,
        bytes_written: 0,
        launches: Launches::default(),
        asynchronous: false,
    };
    let c = model.op_cost(&link);
    assert_eq!(c.core, CoreType::Link);
    assert_eq!(c.one_core_s, c.all_cores_s);
    assert_eq!(c.one_core_bound, Bound::Network);
}

#[test]
fn bad_chip_file_is_an_input_error_not_a_panic() {
    let text = read_input(&Path::new(env!("CARGO_MANIFEST_DIR")).join("arch_specs/a100.toml"))
        .expect("a100.toml");
    let broken = text.replace("tensor_compute =", "tensor_compte =");
    let err = parse_toml::<ArchConfig>(Path::new("broken.toml"), &broken).unwrap_err();
    assert!(matches!(err, InputError::Malformed { .. }));
    assert!(err.to_string().contains("tensor_compte"), "{err}");
}

/// Reads a CSV of the reference data as it is: no header, whitespace after commas.
fn read_rows(file: &str) -> Vec<Vec<String>> {
    let path = Path::new(KERNELS_DIR).join(file);
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .trim(csv::Trim::All)
        .from_path(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    reader
        .records()
        .map(|r| r.expect("csv row").iter().map(str::to_owned).collect())
        .collect()
}

fn num(field: &str) -> f64 {
    field
        .parse()
        .unwrap_or_else(|e| panic!("number `{field}`: {e}"))
}

struct ErrorStats {
    mean: f64,
    max: f64,
}

fn stats(errors: &[f64]) -> ErrorStats {
    ErrorStats {
        mean: errors.iter().sum::<f64>() / errors.len() as f64,
        max: errors.iter().copied().fold(0.0, f64::max),
    }
}

#[test]
fn a100_gemm_matches_measured_latency() {
    let a100 = load_chip("a100").timed_in_isolation();
    let rows = read_rows("matmul_A100.csv");
    assert_eq!(rows.len(), 20);
    let mut table = String::from("\nA100 GEMM (fp16): measured vs model\n");
    table += &format!(
        "{:>6} {:>6} {:>6} {:>11} {:>11} {:>7} {:>10} {:>8}\n",
        "M", "N", "K", "meas_us", "model_us", "err_%", "tile", "bound"
    );
    let mut errors = Vec::new();
    for r in &rows {
        let (m, n, k) = (num(&r[0]) as u64, num(&r[1]) as u64, num(&r[2]) as u64);
        let ms = r[3].strip_suffix("ms").expect("latency in ms");
        let measured_s = num(ms) * 1e-3;
        let c = gemm_cost(&a100, 1, m, n, k, 2, a100.tensor.count);
        let err = rel_err(c.latency_s, measured_s);
        errors.push(err);
        table += &format!(
            "{m:>6} {n:>6} {k:>6} {:>11.1} {:>11.1} {:>7.1} {:>10} {:>8?}\n",
            measured_s * 1e6,
            c.latency_s * 1e6,
            err * 100.0,
            format!("{}x{}", c.tile.m, c.tile.n),
            c.bound
        );
        if m == 8192 && n == k && n <= 512 {
            assert_ne!(c.bound, Bound::Compute, "small-shape knee {m}x{n}x{k}");
        }
    }
    let s = stats(&errors);
    table += &format!(
        "GEMM: mean {:.1} %, max {:.1} %",
        s.mean * 100.0,
        s.max * 100.0
    );
    println!("{table}");
    // 3.1 % as timed; at the training run's power-limited clock it would be 7.5 %.
    assert!(s.mean <= 0.05, "mean GEMM error {:.3}", s.mean);
}

/// Compares a vector op with a throughput CSV (G elements/s); `shape` maps a row to
/// (elements, row length).
fn vector_errors(
    a100: &ArchConfig,
    op: VectorOp,
    file: &str,
    shape: impl Fn(&[String]) -> (u64, u64),
) -> ErrorStats {
    let mut table = format!("\nA100 {op:?} (fp16): measured vs model\n");
    table += &format!(
        "{:>11} {:>7} {:>10} {:>10} {:>7} {:>14}\n",
        "elements", "row", "meas_us", "model_us", "err_%", "bound"
    );
    let mut errors = Vec::new();
    for r in read_rows(file) {
        let (elements, row_len) = shape(&r);
        let gelems_per_s = num(r.last().expect("throughput column"));
        let measured_s = elements as f64 / (gelems_per_s * 1e9);
        let c = vector_cost(
            a100,
            op,
            Pass::Forward,
            elements,
            row_len,
            2,
            a100.vector.count,
        );
        let err = rel_err(c.latency_s, measured_s);
        errors.push(err);
        table += &format!(
            "{elements:>11} {row_len:>7} {:>10.1} {:>10.1} {:>7.1} {:>14?}\n",
            measured_s * 1e6,
            c.latency_s * 1e6,
            err * 100.0,
            c.bound
        );
    }
    let s = stats(&errors);
    table += &format!(
        "{op:?}: mean {:.1} %, max {:.1} %",
        s.mean * 100.0,
        s.max * 100.0
    );
    println!("{table}");
    s
}

#[test]
fn a100_vector_ops_match_measured_throughput() {
    let a100 = load_chip("a100").timed_in_isolation();
    let rows2 = |r: &[String]| {
        let (m, n) = (num(&r[0]) as u64, num(&r[1]) as u64);
        (m * n, n)
    };
    let softmax = vector_errors(&a100, VectorOp::Softmax, "softmax_A100.csv", rows2);
    let layernorm = vector_errors(&a100, VectorOp::LayerNorm, "layernorm_A100.csv", rows2);
    let gelu = vector_errors(&a100, VectorOp::Gelu, "gelu_A100.csv", |r| {
        (num(&r[0]) as u64, 1)
    });
    for (name, s) in [
        ("softmax", &softmax),
        ("layernorm", &layernorm),
        ("gelu", &gelu),
    ] {
        assert!(s.mean <= 0.15, "{name} mean error {:.3}", s.mean);
    }
}

/// All measured A100 kernels as fit samples (fp16).
fn a100_samples() -> Vec<KernelSample> {
    let mut samples = Vec::new();
    for r in read_rows("matmul_A100.csv") {
        let ms = r[3].strip_suffix("ms").expect("latency in ms");
        samples.push(KernelSample {
            kind: OpKind::Gemm {
                batch: 1,
                m: num(&r[0]) as u64,
                n: num(&r[1]) as u64,
                k: num(&r[2]) as u64,
            },
            elem_bytes: 2,
            measured_s: num(ms) * 1e-3,
            with_backward: false,
        });
    }
    for (op, file) in [
        (VectorOp::Softmax, "softmax_A100.csv"),
        (VectorOp::LayerNorm, "layernorm_A100.csv"),
    ] {
        for r in read_rows(file) {
            let (m, n) = (num(&r[0]) as u64, num(&r[1]) as u64);
            samples.push(KernelSample {
                kind: OpKind::Vector {
                    op,
                    elements: m * n,
                    row_len: n,
                    pass: Pass::Forward,
                },
                elem_bytes: 2,
                measured_s: (m * n) as f64 / (num(&r[2]) * 1e9),
                with_backward: false,
            });
        }
    }
    for r in read_rows("gelu_A100.csv") {
        let n = num(&r[0]) as u64;
        samples.push(KernelSample {
            kind: OpKind::Vector {
                op: VectorOp::Gelu,
                elements: n,
                row_len: 1,
                pass: Pass::Forward,
            },
            elem_bytes: 2,
            measured_s: n as f64 / (num(&r[1]) * 1e9),
            with_backward: false,
        });
    }
    samples
}

#[test]
fn fit_recovers_known_parameters_on_toy_chip() {
    // 8 cores of 16×16 arrays and 256 lanes at 1 GHz, 100 GB/s HBM: the shapes below are
    // each clearly limited by one term (compute, HBM or overhead).
    let mut truth = toy_chip(8);
    truth.tensor.rows = 16;
    truth.tensor.cols = 16;
    truth.vector.lanes = 256;
    truth.hbm.bandwidth_bytes_per_s = 100e9;
    truth.efficiency.tensor_compute = 0.8;
    truth.efficiency.hbm_bandwidth = 0.7;
    truth.efficiency.gemm_overhead_s = 10e-6;
    truth.efficiency.vector_overhead_s = 5e-6;
    truth.efficiency.link_bandwidth = 0.75;
    // Fused attention kernels reach less of the arrays than GEMMs do, their backward less
    // than their forward, and their tiles add work per query row.
    truth.efficiency.attention_compute = Some(0.6);
    truth.efficiency.attention_backward_compute = Some(0.5);
    truth.efficiency.attention_row_overhead = Some(150.0);
    truth
        .efficiency
        .vector_op_overhead_s
        .set(VectorOp::Gelu, Some(20e-6));
    truth
        .efficiency
        .vector_op_overhead_s
        .set(VectorOp::LayerNorm, Some(30e-6));
    // Softmax streams slower than the other kernels, its backward kernel at a rate of its own.
    truth
        .efficiency
        .vector_op_hbm_bandwidth
        .set(VectorOp::Softmax, Some(0.5));
    truth
        .efficiency
        .vector_op_backward_hbm_bandwidth
        .set(VectorOp::Softmax, Some(0.6));
    // ... and with an overhead of its own.
    truth
        .efficiency
        .vector_op_backward_overhead_s
        .set(VectorOp::Softmax, Some(8e-6));
    // Compute-bound, memory-bound and overhead-bound GEMMs; small and large vector ops.
    let gemms = [
        (512, 512, 512),
        (1024, 1024, 256),
        (4, 2048, 2048),
        (4, 4, 4),
    ]
    .map(|(m, n, k)| OpKind::Gemm { batch: 1, m, n, k });
    let vectors = [
        (VectorOp::Softmax, 1 << 10, 64, Pass::Forward),
        (VectorOp::Softmax, 1 << 24, 64, Pass::Forward),
        (VectorOp::Softmax, 1 << 12, 64, Pass::Backward),
        (VectorOp::Softmax, 1 << 24, 64, Pass::Backward),
        (VectorOp::LayerNorm, 1 << 10, 64, Pass::Forward),
        (VectorOp::LayerNorm, 1 << 24, 64, Pass::Forward),
        (VectorOp::Gelu, 1 << 10, 1, Pass::Forward),
        (VectorOp::Gelu, 1 << 24, 1, Pass::Forward),
    ]
    .map(|(op, elements, row_len, pass)| OpKind::Vector {
        op,
        elements,
        row_len,
        pass,
    });
    // All-reduces and all-gathers in the node, small (hop-latency-bound) to large.
    let collectives = [
        (CollectiveKind::AllReduce, 1 << 10, 8),
        (CollectiveKind::AllReduce, 1 << 28, 8),
        (CollectiveKind::AllGather, 1 << 26, 4),
    ]
    .map(|(collective, bytes, group)| OpKind::Collective {
        collective,
        bytes,
        group,
    });
    // Compute-bound fused attention, causal or not, forward alone at three sequence lengths
    // (which tell the tiles' work per row from the fraction), and backward.
    let attention = [
        (true, Pass::Forward, 1024),
        (false, Pass::Forward, 1024),
        (true, Pass::Backward, 1024),
        (false, Pass::Forward, 256),
        (false, Pass::Forward, 4096),
    ]
    .map(|(causal, pass, seq_len)| OpKind::Attention {
        shape: AttentionShape {
            heads: 8,
            kv_heads: 8,
            seq_len,
            head_dim: 64,
            causal,
        },
        pass,
    });
    let kinds = [
        gemms.as_slice(),
        vectors.as_slice(),
        collectives.as_slice(),
        attention.as_slice(),
    ]
    .concat();
    // The last attention shape also timed with its backward, as published benchmarks time it.
    let paired = attention[attention.len() - 1];
    let samples: Vec<KernelSample> = kinds
        .iter()
        .map(|&kind| (kind, false))
        .chain([(paired, true)])
        .map(|(kind, with_backward)| {
            let mut s = KernelSample {
                kind,
                elem_bytes: 2,
                measured_s: 0.0,
                with_backward,
            };
            s.measured_s = predicted_latency_s(&truth, &s);
            s
        })
        .collect();
    let forward_alone = predicted_latency_s(
        &truth,
        &KernelSample {
            with_backward: false,
            ..samples[samples.len() - 1]
        },
    );
    assert!(samples[samples.len() - 1].measured_s > 3.0 * forward_alone);
    let mut start = truth.clone();
    start.efficiency = Efficiency::default();
    let fitted = fit_efficiency(&start, &samples);
    let near = |got: f64, want: f64, tol: f64, what: &str| {
        assert!(
            (got - want).abs() <= tol,
            "{what}: fitted {got:e}, true {want:e}"
        );
    };
    near(fitted.tensor_compute, 0.8, 0.005, "tensor_compute");
    near(fitted.attention_compute(), 0.6, 0.005, "attention_compute");
    near(
        fitted.attention_compute_for(Pass::Backward),
        0.5,
        0.005,
        "attention_backward_compute",
    );
    assert_eq!(fitted.attention_backward_row_overhead, None);
    near(
        fitted.attention_row_overhead(),
        150.0,
        2.0,
        "attention_row_overhead",
    );
    near(fitted.hbm_bandwidth, 0.7, 0.005, "hbm_bandwidth");
    near(fitted.gemm_overhead_s, 10e-6, 0.1e-6, "gemm_overhead_s");
    near(fitted.link_bandwidth, 0.75, 0.005, "link_bandwidth");
    near(
        fitted.vector_overhead_s,
        5e-6,
        0.1e-6,
        "vector_overhead_s (softmax)",
    );
    near(
        fitted.vector_overhead_for(VectorOp::Gelu, Pass::Forward),
        20e-6,
        0.1e-6,
        "gelu overhead",
    );
    assert_eq!(fitted.vector_op_overhead_s.get(VectorOp::Softmax), None);
    near(
        fitted.vector_overhead_for(VectorOp::Softmax, Pass::Backward),
        8e-6,
        0.1e-6,
        "softmax backward overhead",
    );
    // LayerNorm's backward was not measured: it keeps the primitive's overhead.
    assert_eq!(
        fitted
            .vector_op_backward_overhead_s
            .get(VectorOp::LayerNorm),
        None
    );
    near(
        fitted.hbm_bandwidth_for(VectorOp::Softmax, Pass::Forward),
        0.5,
        0.005,
        "softmax bandwidth",
    );
    near(
        fitted.hbm_bandwidth_for(VectorOp::Softmax, Pass::Backward),
        0.6,
        0.005,
        "softmax backward bandwidth",
    );
    near(
        fitted.hbm_bandwidth_for(VectorOp::Gelu, Pass::Forward),
        0.7,
        0.005,
        "gelu bandwidth",
    );
    // GeLU's backward was not measured: it streams at the primitive's rate.
    assert_eq!(
        fitted.vector_op_backward_hbm_bandwidth.get(VectorOp::Gelu),
        None
    );
    assert_eq!(
        fitted.hbm_bandwidth_for(VectorOp::Gelu, Pass::Backward),
        fitted.hbm_bandwidth_for(VectorOp::Gelu, Pass::Forward)
    );
    start.efficiency = fitted;
    for (class, err) in class_errors(&start, &samples) {
        assert!(err < 0.01, "{class:?}: {err}");
    }
}

/// FlashAttention-2's published A100 benchmarks (data/reference/flash_attention/a100), each
/// row a forward timed with its backward.
fn a100_flash_attention_samples() -> Vec<KernelSample> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/reference/flash_attention/a100");
    load_measurements(&dir)
        .expect("published FlashAttention-2 rows")
        .iter()
        .map(|m| match m.target {
            Target::ForwardBackward(kind) => KernelSample {
                kind,
                elem_bytes: m.elem_bytes,
                measured_s: m.measured_s,
                with_backward: true,
            },
            _ => panic!("{}: the A100 rows time forward and backward", m.source),
        })
        .collect()
}

#[test]
fn a100_chip_file_efficiency_is_the_fit_to_measurements() {
    let a100 = load_chip("a100");
    let samples = [a100_samples(), a100_flash_attention_samples()].concat();
    let fitted = fit_efficiency(&load_chip("a100").timed_in_isolation(), &samples);
    let e = a100.efficiency;
    println!("\nA100 efficiency fit: {fitted:?}");
    // The chip file holds the fit, rounded.
    let near = |file: f64, fit: f64, tol: f64, what: &str| {
        assert!(
            (file - fit).abs() <= tol,
            "{what}: chip file {file:e}, fit {fit:e}"
        );
    };
    near(
        e.tensor_compute,
        fitted.tensor_compute,
        0.01,
        "tensor_compute",
    );
    near(e.hbm_bandwidth, fitted.hbm_bandwidth, 0.01, "hbm_bandwidth");
    near(
        e.attention_compute(),
        fitted.attention_compute(),
        0.005,
        "attention_compute",
    );
    near(
        e.attention_row_overhead(),
        fitted.attention_row_overhead(),
        2.0,
        "attention_row_overhead",
    );
    // Timed only forward and backward together: one set for both passes.
    assert_eq!(
        (
            fitted.attention_backward_compute,
            fitted.attention_backward_row_overhead
        ),
        (None, None)
    );
    near(
        e.gemm_overhead_s,
        fitted.gemm_overhead_s,
        1e-6,
        "gemm_overhead_s",
    );
    for op in [VectorOp::Softmax, VectorOp::LayerNorm, VectorOp::Gelu] {
        near(
            e.vector_overhead_for(op, Pass::Forward),
            fitted.vector_overhead_for(op, Pass::Forward),
            1e-6,
            &format!("{op:?} overhead"),
        );
        near(
            e.hbm_bandwidth_for(op, Pass::Forward),
            fitted.hbm_bandwidth_for(op, Pass::Forward),
            0.01,
            &format!("{op:?} bandwidth"),
        );
    }
    // Softmax and LayerNorm were timed over rows of 32-32768 elements: a fraction per row
    // length. (The file's causal-softmax tables are the H100's: not timed on an A100.)
    let fitted_ops: Vec<_> = fitted
        .row_hbm_bandwidth
        .iter()
        .map(|t| (t.op, t.pass))
        .collect();
    assert_eq!(
        fitted_ops,
        [
            (VectorOp::Softmax, Pass::Forward),
            (VectorOp::LayerNorm, Pass::Forward)
        ]
    );
    for fit in &fitted.row_hbm_bandwidth {
        let file = e
            .row_hbm_bandwidth
            .iter()
            .find(|t| (t.op, t.pass) == (fit.op, fit.pass))
            .expect("the chip file holds the fitted table");
        assert_eq!(file.row_len, fit.row_len);
        for (i, (&f, &g)) in file
            .hbm_bandwidth
            .iter()
            .zip(&fit.hbm_bandwidth)
            .enumerate()
        {
            near(
                f,
                g,
                0.005,
                &format!("{:?} at row {}", file.op, file.row_len[i]),
            );
        }
    }
    assert!(e.tensor_compute <= 1.0 && e.hbm_bandwidth <= 1.0 && e.link_bandwidth <= 1.0);
}

/// The A100's fractions for the kernels its artifact does not time are the H100 fit's, rounded
/// to two places, as its file says: the layout copies, the QKV-gradient stack, the casts,
/// dropout, cross-entropy and Adam forward; the casts, softmax, LayerNorm, dropout and
/// cross-entropy backward; and the fused causal softmax's tables both ways.
#[test]
fn a100_copies_of_the_h100_fractions_are_the_h100_fit_rounded() {
    let a100 = load_chip("a100").efficiency;
    let h100 = load_chip("h100.calibrated").efficiency;
    let rounded = |x: f64| (x * 100.0).round() / 100.0;
    let copied = [
        (VectorOp::Copy, Pass::Forward),
        (VectorOp::Stack, Pass::Forward),
        (VectorOp::Cast, Pass::Forward),
        (VectorOp::Dropout, Pass::Forward),
        (VectorOp::CrossEntropy, Pass::Forward),
        (VectorOp::Update, Pass::Forward),
        (VectorOp::Cast, Pass::Backward),
        (VectorOp::Softmax, Pass::Backward),
        (VectorOp::LayerNorm, Pass::Backward),
        (VectorOp::Dropout, Pass::Backward),
        (VectorOp::CrossEntropy, Pass::Backward),
    ];
    for (op, pass) in copied {
        let (file, fit) = (
            a100.hbm_bandwidth_for(op, pass),
            h100.hbm_bandwidth_for(op, pass),
        );
        assert!(
            (file - rounded(fit)).abs() < 1e-9,
            "{op:?} {pass:?}: a100.toml {file}, the H100 fit {fit}"
        );
    }
    for pass in [Pass::Forward, Pass::Backward] {
        let table = |e: &tandem::arch::Efficiency| {
            e.row_hbm_bandwidth
                .iter()
                .find(|t| t.op == VectorOp::CausalSoftmax && t.pass == pass)
                .cloned()
                .expect("a causal-softmax table")
        };
        let (file, fit) = (table(&a100), table(&h100));
        assert_eq!(file.row_len, fit.row_len, "{pass:?}");
        for (f, g) in file.hbm_bandwidth.iter().zip(&fit.hbm_bandwidth) {
            assert!(
                (f - rounded(*g)).abs() < 1e-9,
                "causal softmax {pass:?}: {f} vs {g}"
            );
        }
    }
}

/// A power-limited clock stretches tensor-core arithmetic by its fraction and nothing else:
/// a compute-bound GEMM's busy time grows by 1/0.8, a memory-bound one and vector kernels
/// keep theirs.
#[test]
fn sustained_clock_slows_tensor_compute_only() {
    let mut full = toy_chip(4);
    full.hbm.bandwidth_bytes_per_s = 1e10;
    full.efficiency.gemm_overhead_s = 1e-6;
    let mut limited = full.clone();
    limited.efficiency.sustained_clock = 0.8;
    let busy_s = |arch: &ArchConfig, m: u64, n: u64, k: u64| {
        let c = gemm_cost(arch, 1, m, n, k, 2, 4);
        (c.latency_s - 1e-6, c.bound)
    };
    // 256³ on four 4×4 arrays at 1 GHz: ~0.26 ms of arithmetic, 0.4 MB of HBM traffic.
    let (full_s, bound) = busy_s(&full, 256, 256, 256);
    assert_eq!(bound, Bound::Compute);
    let (limited_s, _) = busy_s(&limited, 256, 256, 256);
    assert!(
        (limited_s / full_s - 1.25).abs() < 1e-12,
        "{limited_s} / {full_s}"
    );
    // A skinny GEMM streams its 2 MB weight from HBM: no slower at the lower clock.
    let (full_s, bound) = busy_s(&full, 1, 1024, 1024);
    assert_eq!(bound, Bound::Memory(MemoryLevel::Hbm));
    assert_eq!(busy_s(&limited, 1, 1024, 1024).0, full_s);
    for op in [VectorOp::Softmax, VectorOp::Gelu] {
        let cost = |arch: &ArchConfig| vector_cost(arch, op, Pass::Forward, 1 << 20, 1024, 2, 4);
        assert_eq!(cost(&limited).latency_s, cost(&full).latency_s, "{op:?}");
    }
}

/// A vector primitive's training rate divides its kernels' time (overhead included) in its own
/// pass only: a forward GeLU at rate 0.8 takes 1/0.8 of its single-kernel time, its backward
/// the chip-wide rate's (0.5: twice), a GEMM its own; timed in isolation, every rate is 1.
#[test]
fn vector_rates_stretch_training_kernels_of_their_pass() {
    let mut single = toy_chip(4);
    single.efficiency.vector_overhead_s = 1e-6;
    let mut training = single.clone();
    training
        .efficiency
        .vector_op_sustained_rate
        .set(VectorOp::Gelu, Some(0.8));
    training.efficiency.vector_sustained_rate = 0.5;
    let latency_s = |arch: &ArchConfig, pass| {
        vector_cost(arch, VectorOp::Gelu, pass, 1 << 20, 1, 2, 4).latency_s
    };
    let ratio = latency_s(&training, Pass::Forward) / latency_s(&single, Pass::Forward);
    assert!((ratio - 1.25).abs() < 1e-12, "{ratio}");
    let ratio = latency_s(&training, Pass::Backward) / latency_s(&single, Pass::Backward);
    assert!((ratio - 2.0).abs() < 1e-12, "{ratio}");
    assert_eq!(
        gemm_cost(&training, 1, 256, 256, 256, 2, 4).latency_s,
        gemm_cost(&single, 1, 256, 256, 256, 2, 4).latency_s
    );
    let isolated = training.timed_in_isolation();
    for pass in [Pass::Forward, Pass::Backward] {
        assert_eq!(latency_s(&isolated, pass), latency_s(&single, pass));
    }
}

#[test]
fn big_gemms_reach_published_throughput() {
    // specs.md: best public dense bf16 GEMMs reach ~268 TFLOP/s on A100 and ~790 TFLOP/s on
    // H100, sustained; TPU v4 peaks at 275. The A100's 258 is at its power-limited clock (the
    // LLMCompass kernels above, timed one at a time near the boost clock, reach 277-293).
    for (chip, published_flops) in [
        ("a100", 268e12),
        ("h100", 790e12),
        ("phaze-tpuv4-template", 275e12),
    ] {
        let arch = load_chip(chip);
        let n = 8192u64;
        let c = gemm_cost(&arch, 1, n, n, n, 2, arch.tensor.count);
        let achieved = 2.0 * (n * n * n) as f64 / c.latency_s;
        println!("{chip}: 8192^3 GEMM {:.0} TFLOP/s", achieved / 1e12);
        assert!(
            (achieved - published_flops).abs() <= 0.1 * published_flops,
            "{chip}: {achieved:e} FLOP/s"
        );
        assert_eq!(c.bound, Bound::Compute);
    }
}

/// One 4×4 tensor core and one 4-lane vector core at 1 GHz with buffers at table points of the
/// area model (1 MiB local buffers, a 2 MiB GLB), unlimited bandwidth and no overheads, where
/// only MACs and vector operations cost energy (`vector_op_j` given).
fn power_chip(vector_op_j: f64) -> ArchConfig {
    ArchConfig {
        name: "power".into(),
        tensor: TensorCores {
            count: 1,
            rows: 4,
            cols: 4,
            local_buffer_bytes: 1 << 20,
            stream_k: false,
        },
        vector: VectorCores {
            count: 1,
            lanes: 4,
            local_buffer_bytes: 1 << 20,
        },
        glb: GlobalBuffer {
            bytes: 2 << 20,
            bandwidth_bytes_per_s: 1e30,
        },
        energy: EnergyCosts {
            mac_j: 1e-12,
            vector_op_j,
            local_byte_j: 0.0,
            glb_byte_j: 0.0,
            hbm_byte_j: 0.0,
            link_byte_j: 0.0,
            static_power_w_per_mm2: 2.0,
        },
        ..toy_chip(1)
    }
}

#[test]
fn peak_power_is_static_plus_the_densest_kernel_by_hand() {
    // Area (µm², data/reference/phaze_area.md): 16 MACs × 760.041386 + 4 lanes × 759.823853
    // + two 1 MiB local buffers × 1 634 130 + a 2 MiB GLB 3 338 220 = 6 621 679.957588 µm²;
    // static power 2 W/mm² × 6.621679957588 mm².
    let static_w = 2.0 * 6.621_679_957_588;
    // GEMM 16384³ on one 4×4 array: the 32×32 tile wins, 512² tiles of 8·8·16384 + 6 cycles
    // = 2^38 + 6·2^18 cycles at 1 GHz for 2^42 MACs of 1 pJ.
    let gemm_w = 2f64.powi(42) * 1e-12 / ((2f64.powi(38) + 6.0 * 2f64.powi(18)) / 1e9);
    // The streaming add of 2^30 elements on 4 lanes: 2^28 cycles, 2^30 operations.
    let stream_w = |op_j: f64| 2f64.powi(30) * op_j / (2f64.powi(28) / 1e9);
    let gemm_bound = peak_power(&power_chip(1e-12));
    assert_close(gemm_bound.static_w, static_w, "static W");
    assert_close(gemm_bound.gemm_dynamic_w, gemm_w, "GEMM W");
    assert_close(gemm_bound.stream_dynamic_w, stream_w(1e-12), "stream W");
    assert_close(
        gemm_bound.peak_power_w,
        static_w + gemm_w,
        "peak W, GEMM densest",
    );
    // Ten times the vector energy: 40 mW of streaming beats the GEMM's 16 mW.
    let stream_bound = peak_power(&power_chip(10e-12));
    assert!(stream_w(10e-12) > gemm_w);
    assert_close(
        stream_bound.peak_power_w,
        static_w + stream_w(10e-12),
        "peak W, stream densest",
    );
}

#[test]
fn static_power_fit_recovers_the_static_part_and_skips_unusable_rows() {
    let chip = power_chip(1e-12);
    let gemm = |m: u64, measured_s: f64| KernelSample {
        kind: OpKind::Gemm {
            batch: 1,
            m,
            n: 64,
            k: 64,
        },
        elem_bytes: 2,
        measured_s,
        with_backward: false,
    };
    // Board power = 300 W + the model's energy over the measured time, ±10 W.
    let energy_j = |m: u64| gemm_cost(&chip, 1, m, 64, 64, 2, 1).energy_j;
    let sample = |m: u64, s: f64, offset_w: f64, timed_s: f64| PowerSample {
        kernel: gemm(m, s),
        board_power_w: Some(300.0 + offset_w + energy_j(m) / s),
        timed_s,
    };
    let samples = [
        sample(64, 1e-3, -10.0, 2.0),
        sample(128, 2e-3, 0.0, 2.0),
        sample(256, 3e-3, 10.0, 2.0),
        sample(512, 4e-3, 20.0, 2.0),
        // Left out: timed for half a second (its sample still holds earlier rows), no sample.
        sample(64, 1e-3, 500.0, 0.5),
        PowerSample {
            board_power_w: None,
            ..sample(64, 1e-3, 0.0, 2.0)
        },
    ];
    let fit = fit_static_power(&chip, &samples).expect("four usable rows");
    assert_eq!(fit.rows.len(), 4);
    assert_eq!((fit.short_window, fit.without_sample), (1, 1));
    // Median of 290, 300, 310, 320: the mean of the middle two; the mean of all four.
    assert_close(fit.static_w, 305.0, "median static W");
    assert_close(fit.mean_static_w, 305.0, "mean static W");
    assert_close(
        fit.static_power_w_per_mm2,
        305.0 / 6.621_679_957_588,
        "W/mm²",
    );
    assert!(fit_static_power(&chip, &samples[4..]).is_none());
}

#[test]
fn peak_power_against_published_tdp() {
    // Modelled peak power against the published board power (data/reference/specs.md): A100
    // SXM 400 W, H100 and H200 SXM 700 W, TPU v4 192 W (the maximum of Jouppi et al., ISCA
    // 2023). The H100 and H200 static power is fitted to kernels that ran at their 700 W cap,
    // so those two rows are not independent checks; the A100 and TPU v4 take the H100's
    // W/mm², an assumption the TPU v4 row shows does not hold (docs/design.md, "Peak power").
    // The errors below are those of the table in docs/design.md and BENCHMARKS.md.
    for (chip, tdp_w, error) in [
        ("a100", 400.0, "-6.9 %"),
        ("h100", 700.0, "+2.6 %"),
        ("h100.calibrated", 700.0, "-0.5 %"),
        ("h200", 700.0, "+2.2 %"),
        ("h200.calibrated", 700.0, "-1.2 %"),
        ("tpuv4", 192.0, "+191.1 %"),
    ] {
        let peak = peak_power(&load_chip(chip)).peak_power_w;
        let actual = format!("{:+.1} %", 100.0 * (peak / tdp_w - 1.0));
        println!("{chip}: peak {peak:.1} W against {tdp_w} W: {actual}");
        assert_eq!(actual, error, "{chip}: {peak:.1} W against {tdp_w} W");
    }
}

#[test]
fn fitted_static_power_is_the_one_the_chip_files_record() {
    for (gpu, chip) in [("h100", "h100.calibrated"), ("h200", "h200.calibrated")] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args([
                "power",
                "--arch",
                &format!("arch_specs/{chip}.toml"),
                "--fit",
                &format!("calibration/data/{gpu}/kernels.csv"),
                "--json",
            ])
            .output()
            .expect("run tandem power");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let value: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        let fit = &value["fit"]["fit"];
        assert_eq!(fit["rows"].as_array().map(Vec::len), Some(5), "{gpu}");
        let fitted = fit["static_power_w_per_mm2"].as_f64().expect("a number");
        for file in [gpu.to_string(), chip.to_string()] {
            let recorded = load_chip(&file).energy.static_power_w_per_mm2;
            assert!(
                (recorded - fitted).abs() < 5e-5,
                "{file}.toml records {recorded}, the fit gives {fitted}"
            );
        }
    }
}

/// A board-power sample that is not a positive number is bad input to the static-power fit:
/// exit 1, naming the file, the row and the field.
#[test]
fn negative_board_power_is_refused() {
    let dir = tempfile::tempdir().expect("scratch dir");
    let file = dir.path().join("kernels.csv");
    std::fs::write(
        &file,
        "gpu,kernel,dtype,batch,m,n,k,elements,row_len,group,median_s,repeats,burst,power_run_w\n\
         H100,gemm,bf16,1,8192,8192,8192,0,0,1,0.002,30,10,-5\n",
    )
    .expect("write");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["power", "--arch", "arch_specs/h100.toml", "--fit"])
        .arg(&file)
        .output()
        .expect("run tandem power");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("kernels.csv") && err.contains("row 1, power_run_w") && err.contains("-5"),
        "{err}"
    );
}

/// A fused attention kernel streams its score products through the tensor arrays at the
/// chip's attention fraction of peak (here the GEMMs': none fitted) and takes one exponential
/// per score element on the vector lanes between them, while HBM sees only the kernel's own
/// tensors (Q, K, V, the output, its gradient and the log-sum-exp): each pass takes the longer
/// of the two plus the GEMM overhead per kernel (one forward, three backward). A row computes
/// its 4096 keys, or under a causal mask up to the end of its 128-row query tile, 2112 on
/// average, plus the tile's work per row where the chip sets one; the backward at its own
/// fraction where the chip sets one. On the H100, 32 heads of 4096 × 128 are bound by the
/// products.
#[test]
fn flash_attention_prices_its_products_and_exponentials() {
    let mut h100 = load_chip("h100");
    let cores = h100.tensor.count;
    // Then with tile work per row, and a backward of its own at 0.4 of peak.
    for (row_overhead, backward_compute) in [(None, None), (Some(200.0), Some(0.4))] {
        h100.efficiency.attention_row_overhead = row_overhead;
        h100.efficiency.attention_backward_compute = backward_compute;
        let model = CostModel::new(&h100);
        let eff = &h100.efficiency;
        let clock_hz = h100.clock_hz * eff.sustained_clock;
        let lane_cycles_per_s =
            f64::from(h100.vector.count * h100.vector.lanes) * clock_hz * eff.vector_compute;
        for (pass, products, kernels) in [(Pass::Forward, 2.0, 1.0), (Pass::Backward, 5.0, 3.0)] {
            let fraction = match pass {
                Pass::Backward => backward_compute.unwrap_or(eff.tensor_compute),
                Pass::Forward => eff.tensor_compute,
            };
            let macs_per_s =
                f64::from(cores * h100.tensor.rows * h100.tensor.cols) * clock_hz * fraction;
            for (causal, keys_per_row) in [(false, 4096.0), (true, 2112.0)] {
                let keys_per_row = keys_per_row + row_overhead.unwrap_or(0.0);
                let op = tandem::workload::kernel_op(
                    OpKind::Attention {
                        shape: AttentionShape {
                            heads: 32,
                            kv_heads: 32,
                            seq_len: 4096,
                            head_dim: 128,
                            causal,
                        },
                        pass,
                    },
                    2,
                );
                let scores = 32.0 * 4096.0 * keys_per_row;
                let products_s = products * scores * 128.0 / macs_per_s;
                let exp_s = scores * h100.vector_cycles.exp / lane_cycles_per_s;
                let hbm_s = (op.bytes_read + op.bytes_written) as f64
                    / (h100.hbm.bandwidth_bytes_per_s * eff.hbm_bandwidth);
                assert!(products_s > 2.0 * hbm_s, "{pass:?}: compute-bound");
                let cost = model.op_cost(&op);
                assert_eq!(cost.core, CoreType::Tensor);
                assert_eq!(cost.all_cores_bound, Bound::Compute);
                let expected_s = products_s + exp_s + kernels * eff.gemm_overhead_s;
                assert!(
                    rel_err(cost.all_cores_s, expected_s) < 1e-12,
                    "{pass:?} causal {causal}: {} s vs {expected_s} s",
                    cost.all_cores_s
                );
                // One core runs the same products alone.
                assert!(cost.one_core_s > cost.all_cores_s);
            }
        }
    }
}
