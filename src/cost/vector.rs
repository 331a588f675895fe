//! Vector-core operators: per-element arithmetic against memory traffic (docs/design.md §4).
//!
//! Arithmetic is counted in lane-cycles per element from the chip's `vector_cycles` (add,
//! mul, exp, div, sqrt); rows are dealt to the cores and their elements to the lanes. Memory
//! traffic is each operator's reads and writes of whole tensors through HBM, the GLB and the
//! local buffer. Row-wise reductions need their row twice (statistics, then normalise).
//! Norms keep the row on chip for the second pass when it fits the local buffer, otherwise
//! read it from HBM again. Softmax and cross-entropy always stream the row twice: the
//! numerically safe form needs the row maximum before any exponential, and softmax kernels
//! stream the statistics pass rather than stage rows (the A100 measurements show ≈ 6 B per
//! fp16 element even for short rows). Latency = max(compute, traffic / bandwidth per level)
//! plus the fixed kernel overhead, divided by the primitive's rate in training
//! (`Efficiency::vector_rate_for`; 1 for the single kernels calibration fits).

use super::{dominant_bound, Bound, MemoryLevel};
use crate::arch::{ArchConfig, VectorCycles};
use crate::workload::{Pass, VectorOp};
use serde::{Deserialize, Serialize};

/// Reductions work in fp32 (or wider when the data are wider).
const MIN_WORKING_BYTES: u64 = 4;
/// A staged row occupies the local buffer as an input and an output row, each
/// double-buffered, at working precision: 4 working-precision values per element.
const STAGED_VALUES_PER_ELEMENT: u64 = 4;

/// Where a row-wise reduction's second read of its input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SecondRead {
    /// Element-wise operator: one pass.
    None,
    /// The local buffer when the row fits there, HBM otherwise.
    UnlessRowFits,
    /// HBM again (streaming statistics pass).
    Always,
}

/// Cost of one vector operator on a given number of cores, with the model's terms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct VectorCost {
    pub latency_s: f64,
    pub energy_j: f64,
    pub bound: Bound,
    /// Arithmetic lane-cycles per element.
    pub cycles_per_element: f64,
    pub compute_s: f64,
    pub glb_s: f64,
    pub hbm_s: f64,
    /// Whether a reduction's row can be staged in the local buffer (always true for
    /// element-wise ops).
    pub row_fits_local: bool,
    pub hbm_bytes: f64,
    pub glb_bytes: f64,
    pub local_bytes: f64,
}

/// Arithmetic lane-cycles per element of `op` over rows of `row_len` (per-row work such as a
/// norm's square root is spread over the row).
pub fn vector_cycles_per_element(op: VectorOp, vc: &VectorCycles, row_len: u64) -> f64 {
    let per_row = |cycles: f64| cycles / row_len.max(1) as f64;
    match op {
        VectorOp::Add => vc.add,
        VectorOp::Mul => vc.mul,
        // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), tanh(u) = (e^{2u} − 1)/(e^{2u} + 1).
        VectorOp::Gelu => 7.0 * vc.mul + 4.0 * vc.add + vc.exp + vc.div,
        // x / (1 + e^{−x}).
        VectorOp::Silu => vc.exp + vc.add + vc.div,
        // max(x, 0): one compare-and-select.
        VectorOp::Relu => vc.add,
        // Scale and mask, running max, subtract, exp, running sum, divide.
        VectorOp::Softmax => vc.mul + 4.0 * vc.add + vc.exp + vc.div,
        // The same on the half of each row up to the diagonal; the rest is written as zeros.
        VectorOp::CausalSoftmax => 0.5 * (vc.mul + 4.0 * vc.add + vc.exp + vc.div),
        // Mean; variance (subtract, square, sum); (x − μ)·rstd·γ + β; rstd once per row.
        VectorOp::LayerNorm => 5.0 * vc.add + 3.0 * vc.mul + per_row(vc.sqrt + vc.div),
        // Sum of squares; x·rstd·γ; rstd once per row.
        VectorOp::RmsNorm => vc.add + 3.0 * vc.mul + per_row(vc.sqrt + vc.div),
        // Counter-based RNG (Philox: about 4 multiplies and 4 adds per output), compare,
        // then mask and scale.
        VectorOp::Dropout => 5.0 * vc.mul + 5.0 * vc.add,
        // x·cos + rotate(x)·sin with precomputed tables.
        VectorOp::Rotary => 2.0 * vc.mul + vc.add,
        // Gather is pure data movement; the positional embedding is one add.
        VectorOp::Embedding => vc.add,
        // Running max, subtract, exp, running sum; log of the sum once per row.
        VectorOp::CrossEntropy => 3.0 * vc.add + vc.exp + per_row(vc.exp + vc.div),
        // Adam: two moment updates, then w −= lr·m/(√v + ε).
        VectorOp::Update => 6.0 * vc.mul + 4.0 * vc.add + vc.sqrt + vc.div,
        // One add per element into its column's running sum.
        VectorOp::ColumnSum => vc.add,
        // Data movement only.
        VectorOp::Copy | VectorOp::Stack | VectorOp::Fill => 0.0,
        // One conversion instruction per element.
        VectorOp::Cast => vc.add,
        // Multiply, and compare against infinity.
        VectorOp::Scale => vc.mul + vc.add,
        // Square and accumulate.
        VectorOp::Norm => vc.mul + vc.add,
    }
}

/// Where a primitive's second read of its row comes from: row-wise reductions need the row
/// twice (statistics, then normalise), element-wise primitives once.
fn second_read(op: VectorOp) -> SecondRead {
    match op {
        VectorOp::LayerNorm | VectorOp::RmsNorm => SecondRead::UnlessRowFits,
        VectorOp::Softmax | VectorOp::CrossEntropy => SecondRead::Always,
        _ => SecondRead::None,
    }
}

/// Cost of `op` over `elements` values in rows of `row_len` (1 for element-wise ops) with
/// `elem_bytes`-byte data on `cores` vector cores (clamped to `1..=arch.vector.count`).
pub fn vector_cost(
    arch: &ArchConfig,
    op: VectorOp,
    pass: Pass,
    elements: u64,
    row_len: u64,
    elem_bytes: u32,
    cores: u32,
) -> VectorCost {
    let eff = &arch.efficiency;
    let cores = cores.clamp(1, arch.vector.count.max(1));
    let row_len = row_len.clamp(1, elements.max(1));
    let cycles_per_element = vector_cycles_per_element(op, &arch.vector_cycles, row_len);
    let eb = u64::from(elem_bytes);

    // Rows are dealt to cores, each core's elements to its lanes.
    let rows = elements.div_ceil(row_len);
    let elements_per_core = rows.div_ceil(u64::from(cores)) * row_len;
    let lanes = u64::from(arch.vector.lanes.max(1));
    let compute_cycles = elements_per_core.div_ceil(lanes) as f64 * cycles_per_element;
    let compute_s = if elements == 0 {
        0.0
    } else {
        compute_cycles / (arch.clock_hz * eff.vector_compute)
    };

    let traffic = op.traffic(pass);
    let second_read = second_read(op);
    let row_fits_local = second_read == SecondRead::None
        || STAGED_VALUES_PER_ELEMENT * row_len * eb.max(MIN_WORKING_BYTES)
            <= arch.vector.local_buffer_bytes;
    let hbm_rereads = match second_read {
        SecondRead::None => 0.0,
        SecondRead::UnlessRowFits if row_fits_local => 0.0,
        SecondRead::UnlessRowFits | SecondRead::Always => 1.0,
    };
    let local_rereads = if second_read == SecondRead::None {
        0.0
    } else {
        1.0
    };
    let n = elements as f64;
    let ebf = eb as f64;
    let tensors = (traffic.reads + traffic.writes) as f64 + 0.5 * traffic.causal_reads as f64;
    let extra_bytes = (traffic.extra_read_bytes + traffic.extra_write_bytes) as f64;
    let hbm_bytes = n * ((tensors + hbm_rereads) * ebf + extra_bytes);
    let glb_bytes = hbm_bytes;
    let local_bytes = n * ((tensors + local_rereads) * ebf + extra_bytes);

    let hbm_s = hbm_bytes
        / (arch.hbm.bandwidth_bytes_per_s * eff.hbm_bandwidth_for_rows(op, pass, row_len));
    let glb_bw =
        arch.glb.bandwidth_bytes_per_s * f64::from(cores) / f64::from(arch.vector.count.max(1));
    let glb_s = glb_bytes / glb_bw;

    // Each kernel of the primitive pays the fixed cost.
    let overhead_s = if elements == 0 {
        0.0
    } else {
        eff.vector_overhead_for(op, pass) * f64::from(op.kernels(pass, elements, row_len))
    };
    let bound = dominant_bound(
        compute_s,
        &[(MemoryLevel::Glb, glb_s), (MemoryLevel::Hbm, hbm_s)],
        overhead_s,
    );
    let e = &arch.energy;
    let energy_j = n * cycles_per_element * e.vector_op_j
        + hbm_bytes * e.hbm_byte_j
        + glb_bytes * e.glb_byte_j
        + local_bytes * e.local_byte_j;
    VectorCost {
        latency_s: (compute_s.max(glb_s).max(hbm_s) + overhead_s) / eff.vector_rate_for(op, pass),
        energy_j,
        bound,
        cycles_per_element,
        compute_s,
        glb_s,
        hbm_s,
        row_fits_local,
        hbm_bytes,
        glb_bytes,
        local_bytes,
    }
}
