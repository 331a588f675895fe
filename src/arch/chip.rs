//! Chip files (`arch_specs/<chip>.toml`): the serde form of [`ArchConfig`], parsed strictly
//! (unknown fields are errors) and validated so later stages can divide by any size, rate or
//! efficiency without checking.

use std::path::Path;

use super::config::{ArchConfig, EnergyCosts, Hbm, Tier, VectorCycles};
use super::config::{Efficiency, GlobalBuffer, TensorCores, VectorCores};
use crate::error::{parse_toml, read_input, InputError};
use crate::vocab::VectorOp;

/// Reads and validates one chip file. Errors name the file, the field and the reason.
pub fn load_chip(path: &Path) -> Result<ArchConfig, InputError> {
    let text = read_input(path)?;
    let arch: ArchConfig = parse_toml(path, &text)?;
    validate_chip(path, &arch)?;
    Ok(arch)
}

/// Checks every field of a parsed chip.
pub(crate) fn validate_chip(file: &Path, arch: &ArchConfig) -> Result<(), InputError> {
    if arch.name.trim().is_empty() {
        return Err(InputError::invalid(file, "name", "must not be empty"));
    }
    validate_structure(file, "", &arch.tensor, &arch.vector, &arch.glb)?;
    validate_environment(
        file,
        "",
        &Environment {
            clock_hz: arch.clock_hz,
            hbm: &arch.hbm,
            interconnect: &arch.interconnect,
            efficiency: &arch.efficiency,
            vector_cycles: &arch.vector_cycles,
            energy: &arch.energy,
        },
    )?;
    if let Some(area_mm2) = arch.die_area_mm2 {
        positive(file, "die_area_mm2", area_mm2)?;
        within(file, "die_area_mm2", area_mm2, (0.0, DIE_AREA_MM2))?;
    }
    Ok(())
}

/// The fields a search space holds fixed (its `[base]`), borrowed from wherever they live.
pub(crate) struct Environment<'a> {
    pub clock_hz: f64,
    pub hbm: &'a Hbm,
    pub interconnect: &'a [Tier],
    pub efficiency: &'a Efficiency,
    pub vector_cycles: &'a VectorCycles,
    pub energy: &'a EnergyCosts,
}

/// Cores and buffers: every count and size positive.
fn validate_structure(
    file: &Path,
    prefix: &str,
    tensor: &TensorCores,
    vector: &VectorCores,
    glb: &GlobalBuffer,
) -> Result<(), InputError> {
    let sizes = [
        ("tensor.count", u64::from(tensor.count)),
        ("tensor.rows", u64::from(tensor.rows)),
        ("tensor.cols", u64::from(tensor.cols)),
        ("tensor.local_buffer_bytes", tensor.local_buffer_bytes),
        ("vector.count", u64::from(vector.count)),
        ("vector.lanes", u64::from(vector.lanes)),
        ("vector.local_buffer_bytes", vector.local_buffer_bytes),
        ("glb.bytes", glb.bytes),
    ];
    for (field, value) in sizes {
        if value == 0 {
            return Err(InputError::invalid(
                file,
                format!("{prefix}{field}"),
                "must be positive, got 0",
            ));
        }
    }
    positive(
        file,
        &format!("{prefix}glb.bandwidth_bytes_per_s"),
        glb.bandwidth_bytes_per_s,
    )?;
    within(
        file,
        &format!("{prefix}glb.bandwidth_bytes_per_s"),
        glb.bandwidth_bytes_per_s,
        BANDWIDTH_BYTES_PER_S,
    )
}

/// Clock, HBM, interconnect, efficiency, vector cycles and energy.
pub(crate) fn validate_environment(
    file: &Path,
    prefix: &str,
    env: &Environment<'_>,
) -> Result<(), InputError> {
    let field = |name: &str| format!("{prefix}{name}");
    positive(file, &field("clock_hz"), env.clock_hz)?;
    within(file, &field("clock_hz"), env.clock_hz, CLOCK_HZ)?;
    if env.hbm.capacity_bytes == 0 {
        return Err(InputError::invalid(
            file,
            field("hbm.capacity_bytes"),
            "must be positive, got 0",
        ));
    }
    positive(
        file,
        &field("hbm.bandwidth_bytes_per_s"),
        env.hbm.bandwidth_bytes_per_s,
    )?;
    within(
        file,
        &field("hbm.bandwidth_bytes_per_s"),
        env.hbm.bandwidth_bytes_per_s,
        BANDWIDTH_BYTES_PER_S,
    )?;
    validate_tiers(file, prefix, env.interconnect)?;

    let eff = env.efficiency;
    for (name, value) in [
        ("efficiency.tensor_compute", eff.tensor_compute),
        ("efficiency.vector_compute", eff.vector_compute),
        ("efficiency.hbm_bandwidth", eff.hbm_bandwidth),
        ("efficiency.link_bandwidth", eff.link_bandwidth),
    ] {
        if !fraction_of_peak(value) {
            return Err(InputError::invalid(
                file,
                field(name),
                format!("must be a fraction of peak in {FRACTION_RANGE}, got {value}"),
            ));
        }
    }
    // A training run's GEMMs may clock above the single kernels the fractions were fitted to,
    // but never above the peak.
    let sustained_tensor = eff.sustained_clock * eff.tensor_compute;
    if !(eff.sustained_clock > 0.0 && sustained_tensor <= 1.0) {
        return Err(InputError::invalid(
            file,
            field("efficiency.sustained_clock"),
            format!(
                "must be positive, and times efficiency.tensor_compute ({}) at most 1 (the \
                 peak), got {}",
                eff.tensor_compute, eff.sustained_clock
            ),
        ));
    }
    // The fused attention kernels' own fractions likewise, and their tiles' fixed work, in
    // score elements per query row: a few tiles' worth at most.
    for (name, value) in [
        ("efficiency.attention_compute", eff.attention_compute),
        (
            "efficiency.attention_backward_compute",
            eff.attention_backward_compute,
        ),
    ] {
        if let Some(value) = value {
            if !fraction_of_peak(value) || eff.sustained_clock * value > 1.0 {
                return Err(InputError::invalid(
                    file,
                    field(name),
                    format!(
                        "must be a fraction of peak in {FRACTION_RANGE}, and times \
                         efficiency.sustained_clock ({}) at most 1, got {value}",
                        eff.sustained_clock
                    ),
                ));
            }
        }
    }
    for (name, value) in [
        (
            "efficiency.attention_row_overhead",
            eff.attention_row_overhead,
        ),
        (
            "efficiency.attention_backward_row_overhead",
            eff.attention_backward_row_overhead,
        ),
    ] {
        if let Some(value) = value {
            if !(value.is_finite() && (0.0..=MAX_ATTENTION_ROW_OVERHEAD).contains(&value)) {
                return Err(InputError::invalid(
                    file,
                    field(name),
                    format!(
                        "must be between 0 and {MAX_ATTENTION_ROW_OVERHEAD} score elements \
                         per query row, got {value}"
                    ),
                ));
            }
        }
    }
    // A training run's vector kernels may run slower than lone replays (a power-capped clock)
    // or faster (a warm L2), within a factor of a few.
    let rates = VectorOp::ALL.iter().flat_map(|&op| {
        [
            ("vector_op_sustained_rate", &eff.vector_op_sustained_rate),
            (
                "vector_op_backward_sustained_rate",
                &eff.vector_op_backward_sustained_rate,
            ),
        ]
        .into_iter()
        .filter_map(move |(table, values)| {
            Some((format!("efficiency.{table}.{}", op.name()), values.get(op)?))
        })
    });
    for (name, rate) in std::iter::once((
        "efficiency.vector_sustained_rate".to_string(),
        eff.vector_sustained_rate,
    ))
    .chain(rates)
    {
        if !(VECTOR_RATE.0..=VECTOR_RATE.1).contains(&rate) {
            return Err(InputError::invalid(
                file,
                field(&name),
                format!(
                    "must be a rate relative to the single kernels' in [{}, {}], got {rate}",
                    VECTOR_RATE.0, VECTOR_RATE.1
                ),
            ));
        }
    }
    if !(0.0..=1.0).contains(&eff.comm_overlap) {
        return Err(InputError::invalid(
            file,
            field("efficiency.comm_overlap"),
            format!("must be a fraction in [0, 1], got {}", eff.comm_overlap),
        ));
    }
    for (name, value) in [
        ("efficiency.gemm_overhead_s", eff.gemm_overhead_s),
        ("efficiency.vector_overhead_s", eff.vector_overhead_s),
        ("efficiency.launch_gap_s", eff.launch_gap_s),
        ("efficiency.host_dispatch_s", eff.host_dispatch_s),
    ] {
        non_negative(file, &field(name), value)?;
        within(file, &field(name), value, (0.0, TIME_S))?;
    }
    for op in VectorOp::ALL {
        let name = op.name();
        for (table, values) in [
            ("vector_op_hbm_bandwidth", &eff.vector_op_hbm_bandwidth),
            (
                "vector_op_backward_hbm_bandwidth",
                &eff.vector_op_backward_hbm_bandwidth,
            ),
        ] {
            if let Some(value) = values.get(op) {
                if !fraction_of_peak(value) {
                    return Err(InputError::invalid(
                        file,
                        field(&format!("efficiency.{table}.{name}")),
                        format!("must be a fraction of peak in {FRACTION_RANGE}, got {value}"),
                    ));
                }
            }
        }
        for (table, values) in [
            ("vector_op_overhead_s", &eff.vector_op_overhead_s),
            (
                "vector_op_backward_overhead_s",
                &eff.vector_op_backward_overhead_s,
            ),
        ] {
            if let Some(value) = values.get(op) {
                let name = field(&format!("efficiency.{table}.{name}"));
                non_negative(file, &name, value)?;
                within(file, &name, value, (0.0, TIME_S))?;
            }
        }
    }
    for (i, table) in eff.row_hbm_bandwidth.iter().enumerate() {
        let name = field(&format!("efficiency.row_hbm_bandwidth[{i}]"));
        let bad = |reason: String| Err(InputError::invalid(file, name.clone(), reason));
        if table.row_len.is_empty() || table.row_len.len() != table.hbm_bandwidth.len() {
            return bad(format!(
                "row_len and hbm_bandwidth must be non-empty and of equal length, got {} and {}",
                table.row_len.len(),
                table.hbm_bandwidth.len()
            ));
        }
        if table.row_len[0] == 0 || table.row_len.windows(2).any(|w| w[0] >= w[1]) {
            return bad(format!(
                "row_len must be positive and strictly increasing, got {:?}",
                table.row_len
            ));
        }
        if let Some(value) = table.hbm_bandwidth.iter().find(|&&v| !fraction_of_peak(v)) {
            return bad(format!(
                "hbm_bandwidth must be fractions of peak in {FRACTION_RANGE}, got {value}"
            ));
        }
        if eff.row_hbm_bandwidth[..i]
            .iter()
            .any(|t| t.op == table.op && t.pass == table.pass)
        {
            return bad(format!(
                "a second table for {} {:?}",
                table.op.name(),
                table.pass
            ));
        }
    }

    let cycles = env.vector_cycles;
    for (name, value) in [
        ("vector_cycles.add", cycles.add),
        ("vector_cycles.mul", cycles.mul),
        ("vector_cycles.exp", cycles.exp),
        ("vector_cycles.div", cycles.div),
        ("vector_cycles.sqrt", cycles.sqrt),
    ] {
        positive(file, &field(name), value)?;
        within(file, &field(name), value, (0.0, VECTOR_CYCLES))?;
    }

    let energy = env.energy;
    for (name, value) in [
        ("energy.mac_j", energy.mac_j),
        ("energy.vector_op_j", energy.vector_op_j),
        ("energy.local_byte_j", energy.local_byte_j),
        ("energy.glb_byte_j", energy.glb_byte_j),
        ("energy.hbm_byte_j", energy.hbm_byte_j),
        ("energy.link_byte_j", energy.link_byte_j),
    ] {
        non_negative(file, &field(name), value)?;
        within(file, &field(name), value, (0.0, ENERGY_J))?;
    }
    let static_power = field("energy.static_power_w_per_mm2");
    non_negative(file, &static_power, energy.static_power_w_per_mm2)?;
    within(
        file,
        &static_power,
        energy.static_power_w_per_mm2,
        (0.0, STATIC_POWER_W_PER_MM2),
    )?;
    Ok(())
}

/// At least one tier; tiers fastest first, each spanning strictly more devices.
fn validate_tiers(file: &Path, prefix: &str, tiers: &[Tier]) -> Result<(), InputError> {
    if tiers.is_empty() {
        return Err(InputError::invalid(
            file,
            format!("{prefix}interconnect"),
            "at least one tier is required (the last tier spans the whole cluster)",
        ));
    }
    for (i, tier) in tiers.iter().enumerate() {
        let field = |name: &str| format!("{prefix}interconnect[{i}].{name}");
        if tier.name.trim().is_empty() {
            return Err(InputError::invalid(
                file,
                field("name"),
                "must not be empty",
            ));
        }
        if tier.devices == 0 {
            return Err(InputError::invalid(
                file,
                field("devices"),
                "must be positive, got 0",
            ));
        }
        positive(
            file,
            &field("bandwidth_bytes_per_s"),
            tier.bandwidth_bytes_per_s,
        )?;
        within(
            file,
            &field("bandwidth_bytes_per_s"),
            tier.bandwidth_bytes_per_s,
            BANDWIDTH_BYTES_PER_S,
        )?;
        non_negative(file, &field("latency_s"), tier.latency_s)?;
        within(file, &field("latency_s"), tier.latency_s, (0.0, TIME_S))?;
    }
    if let Some((i, name, reason)) = super::config::tier_order_error(tiers) {
        return Err(InputError::invalid(
            file,
            format!("{prefix}interconnect[{i}].{name}"),
            reason,
        ));
    }
    Ok(())
}

/// Plausible ranges of a chip's physical rates: far beyond any real chip on both sides, and
/// narrow enough that no latency or energy computed from them overflows to infinity.
const CLOCK_HZ: (f64, f64) = (1e6, 1e11);
const BANDWIDTH_BYTES_PER_S: (f64, f64) = (1e3, 1e16);
const ENERGY_J: f64 = 1e-6;
const STATIC_POWER_W_PER_MM2: f64 = 100.0;
const TIME_S: f64 = 1.0;
/// Achievable fractions of a peak rate: a thousandth at least, below which no kernel runs
/// (and latencies of large tensors would overflow).
const MIN_FRACTION: f64 = 1e-3;
const FRACTION_RANGE: &str = "[0.001, 1]";
/// The most score elements per query row a fused attention tile may add: sixteen tiles of
/// 128 keys.
const MAX_ATTENTION_ROW_OVERHEAD: f64 = 2048.0;
const VECTOR_CYCLES: f64 = 1e6;
/// A vector kernel's rate in training relative to its lone replays.
const VECTOR_RATE: (f64, f64) = (0.25, 4.0);
const DIE_AREA_MM2: f64 = 1e5;

/// Whether `value` is an achievable fraction of a peak rate, in [`MIN_FRACTION`, 1].
fn fraction_of_peak(value: f64) -> bool {
    (MIN_FRACTION..=1.0).contains(&value)
}

/// `value` within `[min, max]`.
fn within(file: &Path, field: &str, value: f64, (min, max): (f64, f64)) -> Result<(), InputError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(InputError::invalid(
            file,
            field,
            format!("{value} lies outside the plausible range [{min:e}, {max:e}]"),
        ))
    }
}

pub(crate) fn positive(file: &Path, field: &str, value: f64) -> Result<(), InputError> {
    if value > 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(InputError::invalid(
            file,
            field,
            format!("must be positive and finite, got {value}"),
        ))
    }
}

fn non_negative(file: &Path, field: &str, value: f64) -> Result<(), InputError> {
    if value >= 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(InputError::invalid(
            file,
            field,
            format!("must be non-negative and finite, got {value}"),
        ))
    }
}
