//! Peak power of a chip and the fit of its static power (docs/design.md §3, "Peak power").
//!
//! Peak power = static power + the dynamic power of the chip's densest kernel. Static power
//! (leakage, clock tree, control: what the board draws that no kernel's energy accounts for)
//! is `energy.static_power_w_per_mm2` × the template area. Dynamic power is the energy model's
//! energy of a kernel over its latency, at the clock single kernels run at
//! (`ArchConfig::timed_in_isolation`), for the larger of two kernels: a dense 16384³ bf16 GEMM
//! on every tensor core, and a streaming add of 2³⁰ bf16 elements through HBM on every vector
//! core.
//!
//! The static power is fitted to measured kernels with the board power sampled while each was
//! timed: board power = static + the model's dynamic power (its energy of the kernel over the
//! measured time), so each row gives one value of static power and the fit is their median.

use super::{gemm_cost, on_all_cores, vector_cost, KernelSample};
use crate::arch::{area_breakdown, ArchConfig};
use crate::workload::{OpKind, Pass, VectorOp};
use serde::Serialize;

/// Edge of the dense GEMM that sets a chip's peak tensor-core power (m = n = k).
pub const PEAK_GEMM_EDGE: u64 = 16_384;
/// Elements of the streaming add that sets a chip's peak memory power.
pub const PEAK_STREAM_ELEMENTS: u64 = 1 << 30;
/// Operand width of both kernels (bf16).
const PEAK_ELEM_BYTES: u32 = 2;

/// Shortest timed window, in seconds, whose board-power sample belongs to its own kernel:
/// `nvidia-smi`'s `power.draw` is an average over the last second on Ampere and later GPUs, so
/// the samples of a shorter row still hold the rows before it.
pub const MIN_POWER_WINDOW_S: f64 = 1.0;

/// A chip's peak power and its parts, in watts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PeakPower {
    /// `energy.static_power_w_per_mm2` × template area.
    pub static_w: f64,
    /// Energy over latency of the dense GEMM on every tensor core.
    pub gemm_dynamic_w: f64,
    /// Energy over latency of the streaming add on every vector core.
    pub stream_dynamic_w: f64,
    /// Static + the larger dynamic power.
    pub peak_power_w: f64,
}

/// Static power of `arch`: its `energy.static_power_w_per_mm2` × its template area, W.
pub fn static_power_w(arch: &ArchConfig) -> f64 {
    arch.energy.static_power_w_per_mm2 * area_breakdown(arch).total_mm2
}

/// Peak power of `arch` and its parts.
pub fn peak_power(arch: &ArchConfig) -> PeakPower {
    let timed = arch.timed_in_isolation();
    let edge = PEAK_GEMM_EDGE;
    let gemm = gemm_cost(
        &timed,
        1,
        edge,
        edge,
        edge,
        PEAK_ELEM_BYTES,
        arch.tensor.count,
    );
    let stream = vector_cost(
        &timed,
        VectorOp::Add,
        Pass::Forward,
        PEAK_STREAM_ELEMENTS,
        1,
        PEAK_ELEM_BYTES,
        arch.vector.count,
    );
    let static_w = static_power_w(arch);
    let gemm_dynamic_w = gemm.energy_j / gemm.latency_s;
    let stream_dynamic_w = stream.energy_j / stream.latency_s;
    PeakPower {
        static_w,
        gemm_dynamic_w,
        stream_dynamic_w,
        peak_power_w: static_w + gemm_dynamic_w.max(stream_dynamic_w),
    }
}

/// Peak power of `arch`, W ([`peak_power`]'s total).
pub fn peak_power_w(arch: &ArchConfig) -> f64 {
    peak_power(arch).peak_power_w
}

/// One measured kernel with the board power sampled while it was timed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PowerSample {
    pub kernel: KernelSample,
    /// Median board power sampled while the row was timed; `None` when no sample fell in it.
    pub board_power_w: Option<f64>,
    /// How long the row's timed calls ran back to back (repeats × burst × median time), s.
    pub timed_s: f64,
}

/// One kernel of the fit: its measured board power, the model's dynamic power and the static
/// power they imply.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PowerRow {
    #[serde(skip)]
    pub kind: OpKind,
    pub measured_s: f64,
    pub board_power_w: f64,
    /// The model's energy of the kernel on every core over the measured time.
    pub dynamic_w: f64,
    /// Board power − dynamic power.
    pub static_w: f64,
}

/// The static power fitted to measured kernels, with the rows it used and those it left out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StaticPowerFit {
    /// Median over the rows used of board − dynamic power (the mean of the middle two for an
    /// even count), W.
    pub static_w: f64,
    /// Their mean (the least-squares fit of board = static + dynamic), W.
    pub mean_static_w: f64,
    /// The fitted static power over the chip's template area.
    pub static_power_w_per_mm2: f64,
    /// The template area it is spread over, mm².
    pub area_mm2: f64,
    pub rows: Vec<PowerRow>,
    /// Rows left out: no board-power sample.
    pub without_sample: usize,
    /// Rows left out: timed for less than [`MIN_POWER_WINDOW_S`].
    pub short_window: usize,
    /// Rows left out: collectives (their energy is spent on several devices).
    pub collectives: usize,
}

/// Fits `arch`'s static power to `samples`: each GEMM or vector kernel with a board-power
/// sample over a window of at least [`MIN_POWER_WINDOW_S`] gives board − dynamic power, the
/// dynamic power being the model's energy of the kernel on every core of `arch` over its
/// measured time; the fit is their median. `None` when no row qualifies.
pub fn fit_static_power(arch: &ArchConfig, samples: &[PowerSample]) -> Option<StaticPowerFit> {
    let mut rows = Vec::new();
    let (mut without_sample, mut short_window, mut collectives) = (0, 0, 0);
    for sample in samples {
        let kernel = &sample.kernel;
        let Some((_, energy_j)) = on_all_cores(arch, kernel) else {
            collectives += 1;
            continue;
        };
        let Some(board_power_w) = sample.board_power_w else {
            without_sample += 1;
            continue;
        };
        if sample.timed_s < MIN_POWER_WINDOW_S {
            short_window += 1;
            continue;
        }
        let dynamic_w = energy_j / kernel.measured_s;
        rows.push(PowerRow {
            kind: kernel.kind,
            measured_s: kernel.measured_s,
            board_power_w,
            dynamic_w,
            static_w: board_power_w - dynamic_w,
        });
    }
    if rows.is_empty() {
        return None;
    }
    let mut values: Vec<f64> = rows.iter().map(|r| r.static_w).collect();
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    let static_w = if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    };
    let mean_static_w = values.iter().sum::<f64>() / values.len() as f64;
    let area_mm2 = area_breakdown(arch).total_mm2;
    Some(StaticPowerFit {
        static_w,
        mean_static_w,
        static_power_w_per_mm2: static_w / area_mm2,
        area_mm2,
        rows,
        without_sample,
        short_window,
        collectives,
    })
}
