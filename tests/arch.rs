//! Chip files, the PHAZE area model and the PHAZE search space, checked against the numbers of
//! `data/reference/phaze_area.md` and `specs.md`, plus every kind of bad input.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tandem::arch::{area_breakdown, load_chip, ArchConfig, SearchSpace};
use tandem::error::InputError;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// PHAZE table values used in hand derivations (µm²).
const MAC_UM2: f64 = 760.041386;
const LANE_UM2: f64 = 759.823853;
const L2_1KIB: f64 = 6_133.98;
const L2_2KIB: f64 = 8_248.43;
const L2_128KIB: f64 = 204_764.0;
const L2_256KIB: f64 = 446_565.0;
const GLB_2MIB: f64 = 3_338_220.0;
const GLB_8MIB: f64 = 11_952_400.0;
const GLB_32MIB: f64 = 46_750_900.0;
const GLB_64MIB: f64 = 88_605_700.0;
const GLB_128MIB: f64 = 175_423_000.0;

fn spec(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("arch_specs")
        .join(name)
}

fn phaze() -> SearchSpace {
    SearchSpace::load(&spec("phaze.toml")).expect("phaze.toml loads")
}

fn assert_close(got: f64, expected: f64, rel: f64) {
    assert!(
        (got - expected).abs() <= rel * expected.abs(),
        "got {got}, expected {expected} (relative tolerance {rel})"
    );
}

/// Writes `text` to a fresh file under the test temp dir and returns its path.
fn write_temp(name: &str, text: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, text).expect("temp file is writable");
    path
}

/// Replaces exactly one occurrence of `from` in `text`.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` occurs once");
    text.replacen(from, to, 1)
}

/// Loads an edited copy of a chip file and returns the error message.
fn chip_error(base: &str, name: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(spec(base)).unwrap();
    let path = write_temp(name, &edit(&text, from, to));
    let err = load_chip(&path).expect_err("edited chip must be rejected");
    let message = err.to_string();
    assert!(message.contains(name), "message names the file: {message}");
    message
}

/// Loads an edited copy of phaze.toml and returns the error message.
fn space_error(name: &str, from: &str, to: &str) -> String {
    let text = std::fs::read_to_string(spec("phaze.toml")).unwrap();
    let path = write_temp(name, &edit(&text, from, to));
    let err = SearchSpace::load(&path).expect_err("edited space must be rejected");
    let message = err.to_string();
    assert!(message.contains(name), "message names the file: {message}");
    message
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }
}

#[test]
fn phaze_tpuv4_template_area_is_the_phaze_closed_form() {
    let tpu = load_chip(&spec("phaze-tpuv4-template.toml")).unwrap();
    let area = area_breakdown(&tpu);
    assert_close(area.tensor_mm2, 8.0 * 128.0 * 128.0 * MAC_UM2 * 1e-6, 1e-12);
    assert_close(area.tensor_local_mm2, 8.0 * L2_256KIB * 1e-6, 1e-12);
    assert_close(area.vector_mm2, 2.0 * 128.0 * LANE_UM2 * 1e-6, 1e-12);
    assert_close(area.vector_local_mm2, 2.0 * L2_2KIB * 1e-6, 1e-12);
    assert_close(area.glb_mm2, GLB_128MIB * 1e-6, 1e-12);
    assert!((area.total_mm2 - 278.83).abs() < 0.01, "{}", area.total_mm2);
    // phaze_area.md: A_max = 278,826,676.3 µm².
    assert_close(area.total_mm2, 278.8266763, 1e-9);
    let sum = area.tensor_mm2
        + area.tensor_local_mm2
        + area.vector_mm2
        + area.vector_local_mm2
        + area.glb_mm2;
    assert_close(area.total_mm2, sum, 1e-12);
}

#[test]
fn gpu_areas_interpolate_log_log_between_table_points() {
    let a100 = load_chip(&spec("a100.toml")).unwrap();
    let area = area_breakdown(&a100);
    // 164 KiB lies between 128 and 256 KiB: A = A128 · (A256/A128)^log2(164/128).
    let l2_164kib = L2_128KIB * (L2_256KIB / L2_128KIB).powf((164.0f64 / 128.0).log2());
    assert!(L2_128KIB < l2_164kib && l2_164kib < L2_256KIB);
    assert_close(area.tensor_local_mm2, 108.0 * l2_164kib * 1e-6, 1e-12);
    assert_close(area.vector_local_mm2, 108.0 * l2_164kib * 1e-6, 1e-12);
    // 40 MiB between 32 and 64 MiB.
    let glb_40mib = GLB_32MIB * (GLB_64MIB / GLB_32MIB).powf((40.0f64 / 32.0).log2());
    assert_close(area.glb_mm2, glb_40mib * 1e-6, 1e-12);
    assert_close(area.tensor_mm2, 108.0 * 32.0 * 32.0 * MAC_UM2 * 1e-6, 1e-12);
    assert_close(area.vector_mm2, 108.0 * 64.0 * LANE_UM2 * 1e-6, 1e-12);
    // The template estimate (205.19 mm²) of the compute and SRAM; the 826 mm² die also holds
    // I/O, HBM PHYs and caches the template does not model.
    assert_close(area.total_mm2, 205.192027, 1e-8);
    assert_eq!(a100.die_area_mm2, Some(826.0));
}

#[test]
fn chip_peaks_match_published_numbers() {
    let a100 = load_chip(&spec("a100.toml")).unwrap();
    assert_close(a100.peak_tensor_flops(), 312e12, 1e-3);
    let h100 = load_chip(&spec("h100.toml")).unwrap();
    assert_close(h100.peak_tensor_flops(), 989e12, 1e-3);
    let tpu = load_chip(&spec("phaze-tpuv4-template.toml")).unwrap();
    assert_close(tpu.peak_tensor_flops(), 275.3e12, 1e-3);
    assert_eq!(a100.interconnect.len(), 2);
    assert_eq!(tpu.interconnect[0].devices, 4096);
}

/// The real TPU v4 (`tpuv4.toml`) against its public facts, derived by hand: 2 TensorCores ×
/// 4 MXUs of 128 × 128 bf16 MACs at 1.05 GHz, and one vector unit of 8 sublanes × 128 lanes
/// per TensorCore, eight times the vector throughput of PHAZE's template point (2 × 128 lanes).
#[test]
fn real_tpuv4_peaks_are_its_published_ones() {
    let real = load_chip(&spec("tpuv4.toml")).unwrap();
    let template = load_chip(&spec("phaze-tpuv4-template.toml")).unwrap();
    assert_eq!(real.name, "tpuv4");
    assert_eq!(template.name, "phaze-tpuv4-template");

    // 2 × 4 × 128 × 128 MACs × 2 FLOP × 1.05 GHz = 275.25 TFLOP/s (Cloud TPU v4: 275).
    let peak = 2.0 * 4.0 * 128.0 * 128.0 * 2.0 * 1.05e9;
    assert_close(peak, 275.2512e12, 1e-12);
    assert_close(real.peak_tensor_flops(), peak, 1e-12);
    assert_close(real.peak_tensor_flops(), 275e12, 1e-3);
    assert_close(
        real.peak_tensor_flops(),
        template.peak_tensor_flops(),
        1e-12,
    );

    // Vector elements per second: 2 units × (8 × 128) lanes × 1.05 GHz = 2.1504e12, against
    // the template's 2 × 128 × 1.05 GHz = 2.688e11.
    let lanes_per_s =
        |c: &ArchConfig| f64::from(c.vector.count) * f64::from(c.vector.lanes) * c.clock_hz;
    assert_close(lanes_per_s(&real), 2.0 * 8.0 * 128.0 * 1.05e9, 1e-12);
    assert_close(lanes_per_s(&template), 2.0 * 128.0 * 1.05e9, 1e-12);
    assert_close(lanes_per_s(&real) / lanes_per_s(&template), 8.0, 1e-12);
    // The cost model agrees: an element-wise add of 2^24 values (compute time only).
    let n = 1u64 << 24;
    let add = |c: &ArchConfig| {
        tandem::cost::vector_cost(
            c,
            tandem::workload::VectorOp::Add,
            tandem::workload::Pass::Forward,
            n,
            1,
            2,
            c.vector.count,
        )
        .compute_s
    };
    assert_close(add(&template) / add(&real), 8.0, 1e-12);

    // Memory and interconnect: 32 GiB HBM2 at 1.2 TB/s, 128 MiB CMEM, 16 MiB VMEM per
    // TensorCore (a quarter per MXU); ICI 6 × 50 GB/s in 4096-chip pods, then the DCN.
    assert_eq!(real.hbm.capacity_bytes, 32 * 1024 * MIB);
    assert_close(real.hbm.bandwidth_bytes_per_s, 1.2e12, 1e-12);
    assert_eq!(real.glb.bytes, 128 * MIB);
    assert_eq!(real.vector.local_buffer_bytes, 16 * MIB);
    assert_eq!(real.tensor.local_buffer_bytes, 4 * MIB);
    assert_eq!(real.interconnect.len(), 2);
    assert_eq!(real.interconnect[0].name, "ici");
    assert_eq!(real.interconnect[0].devices, 4096);
    assert_close(
        real.interconnect[0].bandwidth_bytes_per_s,
        6.0 * 50e9,
        1e-12,
    );
    assert_eq!(real.interconnect[1].name, "dcn");
    // PaLM's 81 Tb/s over 1536 hosts of 4 chips.
    assert_close(
        real.interconnect[1].bandwidth_bytes_per_s,
        81e12 / 8.0 / 1536.0 / 4.0,
        0.01,
    );
    // Only a bound on the die (< 600 mm²) is published: no die area.
    assert_eq!(real.die_area_mm2, None);
    // The ideal machine: no efficiency fitted.
    let e = &real.efficiency;
    for f in [
        e.tensor_compute,
        e.vector_compute,
        e.hbm_bandwidth,
        e.link_bandwidth,
    ] {
        assert_eq!(f, 1.0);
    }
    assert_eq!((e.gemm_overhead_s, e.vector_overhead_s), (0.0, 0.0));
    // The real chip is not a point of the PHAZE space (its vector lanes are not the array width).
    assert!(!phaze().contains(&real));
}

#[test]
fn phaze_space_has_29360_points_in_the_area_window() {
    let space = phaze();
    assert_eq!(space.name(), "phaze");
    assert_close(space.area_budget_mm2(), 278.826676, 1e-6);
    assert_eq!(space.len(), 29_360);
    let budget = space.area_budget_mm2();
    let mut waived = 0;
    let mut count = 0;
    for arch in space.iter() {
        count += 1;
        let area = area_breakdown(&arch).total_mm2;
        assert!(area <= budget, "{} over budget: {area}", arch.name);
        if area < 0.3 * budget {
            assert!(
                arch.tensor.count == 1 || arch.vector.count == 1,
                "{} under the lower bound without a waiver",
                arch.name
            );
            waived += 1;
        }
        assert_eq!(arch.vector.lanes, arch.tensor.cols, "lanes tied to w");
    }
    assert_eq!(count, 29_360);
    // Brute force (Python over the same tables): 5,780 of them rely on the waiver.
    assert_eq!(waived, 5_780);
}

/// Independent enumeration with table look-ups at powers of two only.
#[test]
fn phaze_order_and_membership_match_brute_force() {
    let l2 = |kib: u64| match kib {
        1 => 6_133.98,
        2 => 8_248.43,
        4 => 12_610.50,
        8 => 22_139.90,
        16 => 38_583.00,
        32 => 63_338.40,
        64 => 115_579.00,
        128 => 204_764.00,
        256 => 446_565.00,
        512 => 897_890.00,
        1024 => 1_634_130.00,
        _ => unreachable!("only powers of two up to 1 MiB occur"),
    };
    let glb = |mib: u64| match mib {
        2 => 3_338_220.0,
        4 => 6_078_640.0,
        8 => 11_952_400.0,
        16 => 23_745_200.0,
        32 => 46_750_900.0,
        64 => 88_605_700.0,
        128 => 175_423_000.0,
        _ => unreachable!("only powers of two from 2 to 128 MiB occur"),
    };
    let area_um2 = |tc: u64, d: u64, w: u64, vc: u64, g: u64| {
        (tc * w * d) as f64 * MAC_UM2
            + tc as f64 * l2((w * d / 64).max(1))
            + (vc * w) as f64 * LANE_UM2
            + vc as f64 * l2((w / 64).max(1))
            + glb(g)
    };
    let budget_um2 = area_um2(8, 128, 128, 2, 128);
    let counts: Vec<u64> = (0..13).map(|i| 1 << i).collect();
    let sides: Vec<u64> = (1..9).map(|i| 1 << i).collect();
    let glbs: Vec<u64> = (1..8).map(|i| 1 << i).collect();
    let mut expected = Vec::new();
    for &tc in &counts {
        for &d in &sides {
            for &w in &sides {
                for &vc in &counts {
                    for &g in &glbs {
                        let a = area_um2(tc, d, w, vc, g);
                        if a <= budget_um2 && (a >= 0.3 * budget_um2 || tc == 1 || vc == 1) {
                            expected.push((tc, d, w, vc, g * MIB));
                        }
                    }
                }
            }
        }
    }
    let got: Vec<(u64, u64, u64, u64, u64)> = phaze()
        .iter()
        .map(|a| {
            (
                u64::from(a.tensor.count),
                u64::from(a.tensor.rows),
                u64::from(a.tensor.cols),
                u64::from(a.vector.count),
                a.glb.bytes,
            )
        })
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn get_is_random_access_into_iter() {
    let space = phaze();
    let all: Vec<ArchConfig> = space.iter().collect();
    for (i, arch) in all.iter().enumerate() {
        assert_eq!(space.get(i).as_ref(), Some(arch), "index {i}");
    }
    assert_eq!(space.get(all.len()), None);
    assert_eq!(space.get(usize::MAX), None);
    // Deterministic across loads, and names are unique.
    let again: Vec<String> = phaze().iter().map(|a| a.name).collect();
    let names: Vec<String> = all.iter().map(|a| a.name.clone()).collect();
    assert_eq!(names, again);
    assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), names.len());
}

#[test]
fn hand_checked_points() {
    let space = phaze();
    // First point: 1 TC of 2x2, 1 VC of 2 lanes, 2 MiB GLB, both buffers at the 1 KiB floor.
    // Far under 0.3·A_max, kept by the single-core waiver.
    let first = space.get(0).unwrap();
    assert_eq!(first.name, "tc1x2x2-vc1x2-glb2MiB");
    assert_eq!(first.tensor.local_buffer_bytes, KIB);
    assert_eq!(first.vector.local_buffer_bytes, KIB);
    let expected_um2 = 4.0 * MAC_UM2 + L2_1KIB + 2.0 * LANE_UM2 + L2_1KIB + GLB_2MIB;
    assert_close(area_breakdown(&first).total_mm2, expected_um2 * 1e-6, 1e-12);
    assert_close(area_breakdown(&first).total_mm2, 3.35504777325, 1e-10);

    // Last point: 4096 TCs of 32x2 (64 MACs -> 1 KiB buffer), 4096 VCs of 2 lanes, 8 MiB GLB.
    let last = space.get(space.len() - 1).unwrap();
    assert_eq!(last.name, "tc4096x32x2-vc4096x2-glb8MiB");
    let expected_um2 = 4096.0 * (64.0 * MAC_UM2 + L2_1KIB + 2.0 * LANE_UM2 + L2_1KIB) + GLB_8MIB;
    assert_close(area_breakdown(&last).total_mm2, expected_um2 * 1e-6, 1e-12);

    // The TPU v4-like point carries the derived buffers and GLB bandwidth of phaze-tpuv4-template.toml.
    let tpu_point = space
        .iter()
        .find(|a| a.name == "tc8x128x128-vc2x128-glb128MiB")
        .unwrap();
    let tpu = load_chip(&spec("phaze-tpuv4-template.toml")).unwrap();
    assert_eq!(tpu_point.tensor, tpu.tensor);
    assert_eq!(tpu_point.vector, tpu.vector);
    assert_eq!(tpu_point.glb.bytes, tpu.glb.bytes);
    assert_close(
        tpu_point.glb.bandwidth_bytes_per_s,
        2.0 * 8.0 * 256.0 * 1.05e9,
        1e-12,
    );
    assert_close(tpu_point.glb.bandwidth_bytes_per_s, 4.3e12, 1e-3);
    assert_eq!(tpu_point.clock_hz, tpu.clock_hz);
    assert_eq!(tpu_point.hbm, tpu.hbm);
    // The chip file adds the data-centre network between pods beyond the space's ICI tier.
    assert_eq!(tpu_point.interconnect[..], tpu.interconnect[..1]);
    assert_eq!(tpu.interconnect[1].name, "dcn");
    assert_eq!(tpu_point.energy, tpu.energy);
    assert_eq!(tpu_point.die_area_mm2, None);
    assert_close(
        area_breakdown(&tpu_point).total_mm2,
        space.area_budget_mm2(),
        1e-15,
    );
}

#[test]
fn contains_compares_compute_and_memory_structure() {
    let space = phaze();
    let tpu = load_chip(&spec("phaze-tpuv4-template.toml")).unwrap();
    assert!(space.contains(&tpu));

    let mut renamed = tpu.clone();
    renamed.name = "other".into();
    renamed.hbm.capacity_bytes = 80 * 1024 * MIB;
    renamed.efficiency.tensor_compute = 0.5;
    assert!(
        space.contains(&renamed),
        "name, HBM capacity, efficiency ignored"
    );

    // Half the depth: a point of the space only with the derived 128 KiB buffer.
    let mut shallow = tpu.clone();
    shallow.tensor.rows = 64;
    assert!(!space.contains(&shallow));
    shallow.tensor.local_buffer_bytes = 16 * 64 * 128;
    assert!(space.contains(&shallow));

    let mut wide_vector = tpu.clone();
    wide_vector.vector.lanes = 64;
    assert!(!space.contains(&wide_vector), "lanes must equal cols");

    let mut too_big = tpu.clone();
    too_big.tensor.count = 16;
    assert!(!space.contains(&too_big), "over the area budget");

    let mut not_listed = tpu.clone();
    not_listed.tensor.count = 6;
    assert!(!space.contains(&not_listed), "6 is not a power of two");

    let mut faster = tpu.clone();
    faster.clock_hz = 1.41e9;
    assert!(!space.contains(&faster));

    let a100 = load_chip(&spec("a100.toml")).unwrap();
    assert!(!space.contains(&a100));
}

#[test]
fn nested_tables_explicit_lists_and_fixed_budget() {
    // Nested-table spelling of phaze.toml's dimensions gives the same space.
    let text = std::fs::read_to_string(spec("phaze.toml")).unwrap();
    let nested = edit(
        &text,
        "\"tensor.count\" = { min = 1, max = 4096 }\n\
         \"tensor.rows\" = { min = 2, max = 256 }                    # d\n\
         \"tensor.cols\" = { min = 2, max = 256 }                    # w\n",
        "tensor = { count = { min = 1, max = 4096 }, rows = { min = 2, max = 256 }, \
         cols = { min = 2, max = 256 } }\n",
    );
    let path = write_temp("nested.toml", &nested);
    let space = SearchSpace::load(&path).unwrap();
    assert_eq!(space.len(), 29_360);
    assert_eq!(space.get(0).unwrap().name, "tc1x2x2-vc1x2-glb2MiB");

    // Explicit lists, searched local buffers, fixed GLB bandwidth, explicit budget.
    let small = edit(
        &text,
        &text[text.find("[dimensions]").unwrap()..],
        r#"[dimensions]
"tensor.count" = [2, 1]
"tensor.rows" = [4]
"tensor.cols" = [4]
"tensor.local_buffer_bytes" = [1024, 2048]
"vector.count" = [1]
"vector.lanes" = [8]
"vector.local_buffer_bytes" = [1024]
"glb.bytes" = [2_097_152]

[derived.glb_bandwidth]
bytes_per_s = 1e12

[area]
budget_mm2 = 3.388
"#,
    );
    let path = write_temp("small.toml", &small);
    let space = SearchSpace::load(&path).unwrap();
    assert_eq!(space.area_budget_mm2(), 3.388);
    let names: Vec<String> = space.iter().map(|a| a.name).collect();
    // List order is kept; the 2-TC, 2 KiB point (3.3913 mm²) exceeds the budget.
    assert_eq!(
        names,
        [
            "tc2x4x4-vc1x8-glb2MiB-tl1KiB-vl1KiB",
            "tc1x4x4-vc1x8-glb2MiB-tl1KiB-vl1KiB",
            "tc1x4x4-vc1x8-glb2MiB-tl2KiB-vl1KiB",
        ]
    );
    let kept = space.get(0).unwrap();
    assert_eq!(kept.glb.bandwidth_bytes_per_s, 1e12);
    let expected_um2 = 2.0 * (16.0 * MAC_UM2 + L2_1KIB) + 8.0 * LANE_UM2 + L2_1KIB + GLB_2MIB;
    assert_close(area_breakdown(&kept).total_mm2, expected_um2 * 1e-6, 1e-12);
    let over_um2 = 2.0 * (16.0 * MAC_UM2 + L2_2KIB) + 8.0 * LANE_UM2 + L2_1KIB + GLB_2MIB;
    assert!(over_um2 * 1e-6 > 3.388);
}

#[test]
fn bad_chip_files_name_file_field_and_reason() {
    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "bad_syntax.toml",
        "clock_hz = 1.05e9",
        "clock_hz = = 1",
    );
    assert_mentions(&m, &["malformed TOML", "clock_hz"]);

    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "no_clock.toml",
        "clock_hz = 1.05e9",
        "",
    );
    assert_mentions(&m, &["missing field", "clock_hz"]);

    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "zero_rows.toml",
        "rows = 128",
        "rows = 0",
    );
    assert_mentions(&m, &["tensor.rows", "must be positive"]);

    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "negative_cols.toml",
        "cols = 128",
        "cols = -128",
    );
    assert_mentions(&m, &["cols", "-128"]);

    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "negative_hbm.toml",
        "bandwidth_bytes_per_s = 1.2e12",
        "bandwidth_bytes_per_s = -1.2e12",
    );
    assert_mentions(
        &m,
        &[
            "hbm.bandwidth_bytes_per_s",
            "must be positive",
            "-1200000000000",
        ],
    );

    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "unknown.toml",
        "cols = 128",
        "cols = 128\nwidth = 3",
    );
    assert_mentions(&m, &["unknown field", "width"]);

    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "efficiency.toml",
        "tensor_compute = 1.0",
        "tensor_compute = 1.2",
    );
    assert_mentions(&m, &["efficiency.tensor_compute", "[0.001, 1]", "1.2"]);

    let m = chip_error(
        "a100.toml",
        "sustained_clock.toml",
        "sustained_clock = 0.926",
        "sustained_clock = 0.0",
    );
    assert_mentions(
        &m,
        &[
            "sustained_clock.toml",
            "efficiency.sustained_clock",
            "must be positive",
        ],
    );

    // The fused attention kernels' own fraction, in range and not above the peak at the
    // training clock (0.926 × 1.1 > 1); their tiles' work per query row, none or more, at
    // most sixteen tiles of 128 keys (2048).
    for (file, key, file_value, value, shown) in [
        (
            "attention_zero.toml",
            "attention_compute",
            "0.685",
            "0.0",
            "got 0",
        ),
        (
            "attention_peak.toml",
            "attention_compute",
            "0.685",
            "1.1",
            "got 1.1",
        ),
        (
            "attention_row_negative.toml",
            "attention_row_overhead",
            "138.0",
            "-1.0",
            "got -1",
        ),
        (
            "attention_row_huge.toml",
            "attention_row_overhead",
            "138.0",
            "4096.0",
            "2048 score elements per query row, got 4096",
        ),
        (
            "attention_row_nan.toml",
            "attention_row_overhead",
            "138.0",
            "nan",
            "got NaN",
        ),
    ] {
        let m = chip_error(
            "a100.toml",
            file,
            &format!("{key} = {file_value}"),
            &format!("{key} = {value}"),
        );
        assert_mentions(&m, &[file, &format!("efficiency.{key}"), shown]);
    }
    // The backward's own pair, bounded as the forward's.
    for (key, value, shown) in [
        ("attention_backward_compute", "0.0", "got 0"),
        ("attention_backward_row_overhead", "-5.0", "got -5"),
    ] {
        let file = format!("{key}.toml");
        let m = chip_error(
            "a100.toml",
            &file,
            "attention_row_overhead = 138.0",
            &format!("attention_row_overhead = 138.0\n{key} = {value}"),
        );
        assert_mentions(&m, &[&file, &format!("efficiency.{key}"), shown]);
    }

    // Above 1 is a training clock above the fitted kernels', but not above the peak.
    let m = chip_error(
        "a100.toml",
        "sustained_clock_peak.toml",
        "sustained_clock = 0.926",
        "sustained_clock = 1.2",
    );
    assert_mentions(
        &m,
        &[
            "sustained_clock_peak.toml",
            "efficiency.sustained_clock",
            "at most 1",
            "1.2",
        ],
    );

    for (file, field, line) in [
        (
            "vector_rate.toml",
            "efficiency.vector_sustained_rate",
            "sustained_clock = 0.926\nvector_sustained_rate = 0.0",
        ),
        (
            "gelu_rate.toml",
            "efficiency.vector_op_backward_sustained_rate.gelu",
            "sustained_clock = 0.926\n[efficiency.vector_op_backward_sustained_rate]\ngelu = 9.0",
        ),
    ] {
        let m = chip_error("a100.toml", file, "sustained_clock = 0.926", line);
        assert_mentions(&m, &[file, field, "[0.25, 4]"]);
    }

    let m = chip_error(
        "a100.toml",
        "comm_overlap.toml",
        "sustained_clock = 0.926",
        "sustained_clock = 0.926\ncomm_overlap = 1.5",
    );
    assert_mentions(&m, &["efficiency.comm_overlap", "[0, 1]", "1.5"]);

    let m = chip_error(
        "a100.toml",
        "softmax_bandwidth.toml",
        "softmax = 0.74",
        "softmax = 1.5",
    );
    assert_mentions(
        &m,
        &[
            "efficiency.vector_op_hbm_bandwidth.softmax",
            "[0.001, 1]",
            "1.5",
        ],
    );

    let m = chip_error(
        "a100.toml",
        "softmax_backward_bandwidth.toml",
        "softmax = 0.61",
        "softmax = 0.0",
    );
    assert_mentions(
        &m,
        &[
            "efficiency.vector_op_backward_hbm_bandwidth.softmax",
            "[0.001, 1]",
        ],
    );

    // h100.toml has no row-length tables: the appended ones are the first (and second).
    let one = "row_len = [512]\nhbm_bandwidth = [0.9]";
    let table_head = "\n\n[[efficiency.row_hbm_bandwidth]]\nop = \"softmax\"\npass = \"forward\"\n";
    for (name, tables, field, expected) in [
        (
            "row_table_lengths.toml",
            "row_len = [512, 2048]\nhbm_bandwidth = [0.9]".to_string(),
            "[0]",
            "equal length",
        ),
        (
            "row_table_order.toml",
            "row_len = [2048, 512]\nhbm_bandwidth = [0.9, 0.5]".to_string(),
            "[0]",
            "strictly increasing",
        ),
        (
            "row_table_fraction.toml",
            "row_len = [512, 2048]\nhbm_bandwidth = [0.9, 1.2]".to_string(),
            "[0]",
            "[0.001, 1]",
        ),
        (
            "row_table_twice.toml",
            format!("{one}{table_head}{one}"),
            "[1]",
            "a second table for softmax",
        ),
    ] {
        let m = chip_error(
            "h100.toml",
            name,
            "static_power_w_per_mm2 = 1.3636",
            &format!("static_power_w_per_mm2 = 1.3636{table_head}{tables}"),
        );
        let field = format!("efficiency.row_hbm_bandwidth{field}");
        assert_mentions(&m, &[name, &field, expected]);
    }

    let m = chip_error(
        "a100.toml",
        "gelu_overhead.toml",
        "gelu = 47.2e-6",
        "gelu = -47.2e-6",
    );
    assert_mentions(
        &m,
        &[
            "efficiency.vector_op_overhead_s.gelu",
            "non-negative",
            "-0.0000472",
        ],
    );

    let m = chip_error(
        "h200.toml",
        "launch_gap.toml",
        "launch_gap_s = 1.78e-6",
        "launch_gap_s = -1.78e-6",
    );
    assert_mentions(
        &m,
        &["efficiency.launch_gap_s", "non-negative", "-0.00000178"],
    );

    let m = chip_error(
        "h200.toml",
        "dropout_backward_overhead.toml",
        "host_dispatch_s = 10.1e-6",
        "host_dispatch_s = 10.1e-6\n\n[efficiency.vector_op_backward_overhead_s]\ndropout = -1.6e-6",
    );
    assert_mentions(
        &m,
        &[
            "efficiency.vector_op_backward_overhead_s.dropout",
            "non-negative",
        ],
    );

    let m = chip_error(
        "a100.toml",
        "unknown_primitive.toml",
        "softmax = 0.74",
        "softmax = 0.74\nsoftmx = 0.5",
    );
    assert_mentions(&m, &["unknown field", "softmx"]);

    let m = chip_error(
        "phaze-tpuv4-template.toml",
        "zero_clock.toml",
        "clock_hz = 1.05e9",
        "clock_hz = 0.0",
    );
    assert_mentions(&m, &["clock_hz", "must be positive"]);

    let m = chip_error("a100.toml", "tiers.toml", "devices = 65_536", "devices = 4");
    assert_mentions(
        &m,
        &["interconnect[1].devices", "strictly increasing", "nvlink"],
    );

    let m = chip_error(
        "a100.toml",
        "nesting.toml",
        "devices = 65_536",
        "devices = 65_540",
    );
    assert_mentions(
        &m,
        &[
            "interconnect[1].devices",
            "not a whole number of the 8-device domains",
            "nvlink",
        ],
    );

    let text = std::fs::read_to_string(spec("phaze-tpuv4-template.toml")).unwrap();
    let start = text.find("[[interconnect]]").unwrap();
    let end = text.find("[vector_cycles]").unwrap();
    let without_tiers = text[..start].to_string() + &text[end..];
    let path = write_temp("no_tiers.toml", &without_tiers);
    let m = load_chip(&path).unwrap_err().to_string();
    assert_mentions(&m, &["no_tiers.toml", "missing field", "interconnect"]);
    let path = write_temp(
        "empty_tiers.toml",
        &edit(
            &without_tiers,
            "clock_hz = 1.05e9",
            "clock_hz = 1.05e9\ninterconnect = []",
        ),
    );
    let m = load_chip(&path).unwrap_err().to_string();
    assert_mentions(
        &m,
        &["empty_tiers.toml", "`interconnect`", "at least one tier"],
    );

    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("does_not_exist.toml");
    let err = load_chip(&missing).unwrap_err();
    assert!(matches!(err, InputError::Io { .. }));
    assert_mentions(&err.to_string(), &["does_not_exist.toml", "cannot read"]);
}

#[test]
fn bad_space_files_name_file_field_and_reason() {
    let m = space_error(
        "empty_dimension.toml",
        "\"tensor.count\" = { min = 1, max = 4096 }",
        "\"tensor.count\" = []",
    );
    assert_mentions(&m, &["dimensions.tensor.count", "empty list of values"]);

    let m = space_error(
        "unknown_tie.toml",
        "\"vector.lanes\" = \"tensor.cols\"",
        "\"vector.lanes\" = \"tensor.width\"",
    );
    assert_mentions(
        &m,
        &["ties.vector.lanes", "unknown tie target `tensor.width`"],
    );

    let m = space_error(
        "tie_not_dimension.toml",
        "\"vector.lanes\" = \"tensor.cols\"",
        "\"vector.lanes\" = \"tensor.local_buffer_bytes\"",
    );
    assert_mentions(&m, &["ties.vector.lanes", "not a dimension"]);

    let m = space_error("untied.toml", "\"vector.lanes\" = \"tensor.cols\"", "");
    assert_mentions(&m, &["`vector.lanes`", "not defined"]);

    let m = space_error(
        "twice.toml",
        "\"vector.lanes\" = \"tensor.cols\"",
        "\"vector.lanes\" = \"tensor.cols\"\n\"tensor.rows\" = \"tensor.cols\"",
    );
    assert_mentions(
        &m,
        &[
            "ties.tensor.rows",
            "already defined at `dimensions.tensor.rows`",
        ],
    );

    let m = space_error(
        "not_pow2.toml",
        "\"tensor.rows\" = { min = 2, max = 256 }",
        "\"tensor.rows\" = { min = 3, max = 256 }",
    );
    assert_mentions(
        &m,
        &["dimensions.tensor.rows.min", "3 is not a power of two"],
    );

    let m = space_error(
        "reversed.toml",
        "\"tensor.rows\" = { min = 2, max = 256 }",
        "\"tensor.rows\" = { min = 256, max = 2 }",
    );
    assert_mentions(&m, &["dimensions.tensor.rows", "min 256 exceeds max 2"]);

    let m = space_error(
        "zero_value.toml",
        "\"tensor.rows\" = { min = 2, max = 256 }",
        "\"tensor.rows\" = [0, 2]",
    );
    assert_mentions(&m, &["dimensions.tensor.rows", "positive integer", "got 0"]);

    let m = space_error(
        "unknown_dimension.toml",
        "\"tensor.rows\" = { min = 2, max = 256 }",
        "\"tensor.depth\" = { min = 2, max = 256 }",
    );
    assert_mentions(
        &m,
        &["dimensions.tensor.depth", "unknown field", "tensor.rows"],
    );

    let m = space_error(
        "bad_fraction.toml",
        "min_fraction = 0.3",
        "min_fraction = 1.5",
    );
    assert_mentions(&m, &["area.min_fraction", "[0, 1]", "1.5"]);

    let m = space_error("reference_gap.toml", "\"tensor.count\" = 8\n", "");
    assert_mentions(&m, &["area.budget_reference", "dimension `tensor.count`"]);

    let m = space_error(
        "reference_tie.toml",
        "\"tensor.count\" = 8\n",
        "\"tensor.count\" = 8\n\"vector.lanes\" = 128\n",
    );
    assert_mentions(
        &m,
        &["area.budget_reference.vector.lanes", "not a dimension"],
    );

    let m = space_error(
        "two_budgets.toml",
        "min_fraction = 0.3",
        "min_fraction = 0.3\nbudget_mm2 = 100.0",
    );
    assert_mentions(&m, &["`area`", "exactly one of"]);

    let m = space_error(
        "bad_base.toml",
        "tensor_compute = 1.0",
        "tensor_compute = 0.0",
    );
    assert_mentions(&m, &["base.efficiency.tensor_compute", "[0.001, 1]"]);

    let m = space_error(
        "unknown_key.toml",
        "min_fraction = 0.3",
        "min_fracton = 0.3",
    );
    assert_mentions(&m, &["unknown field", "min_fracton"]);

    let m = space_error(
        "lanes_overflow.toml",
        "\"tensor.cols\" = { min = 2, max = 256 }",
        "\"tensor.cols\" = [2, 8_589_934_592]",
    );
    assert_mentions(&m, &["dimensions.tensor.cols", "at most 4294967295"]);

    let m = space_error(
        "bandwidth_rule.toml",
        "bytes_per_cycle_per_edge = 2.0",
        "bytes_per_cycle_per_edge = 2.0\nbytes_per_s = 1e12",
    );
    assert_mentions(&m, &["derived.glb_bandwidth", "exactly one of"]);
}
