//! Fused (flash) attention, as FlashAttention-2 runs it: the score tiles stay on chip, so the
//! products stream through the tensor arrays at the kernel's own fraction of peak
//! (`efficiency.attention_compute`, at the sustained clock) and HBM sees only the kernel's own
//! tensors (`workload::kernel_op` counts them). Between the products each score element takes
//! an exponential on the vector lanes (the forward's softmax, the backward's recomputed
//! probabilities), which FlashAttention-2 does not overlap with them. A query row computes
//! every key it sees, under a causal mask up to the end of its query tile (the tile on the
//! diagonal is computed whole), plus its tile's fixed work per row
//! (`efficiency.attention_row_overhead`). Both parameters are fitted where fused kernels were
//! timed (collect.py's `attention_flash` rows, FlashAttention's published benchmarks), the
//! backward's own where its kernels were timed apart from the forward's; unset, the products
//! run at the GEMMs' `tensor_compute` and the rows carry no overhead, an assumption those
//! measurements replace.

use super::{dominant_bound, Bound, MemoryLevel};
use crate::arch::ArchConfig;
use crate::workload::{attention_products, kernel_op, AttentionShape, OpKind, Pass};

/// Query rows in one tile of a fused attention kernel: FlashAttention-2's and -3's training
/// kernels tile the queries by 128 rows, and a causal one computes the tile on the diagonal
/// whole.
const QUERY_TILE_ROWS: u64 = 128;

/// Score elements one query row of `shape` computes in a fused kernel whose tile adds
/// `row_overhead` per row: all `seq_len` keys, or under a causal mask on average half of them
/// and half a tile (a row's tile runs to the end of its diagonal tile).
fn scores_per_query_row(shape: AttentionShape, row_overhead: f64) -> f64 {
    let s = shape.seq_len as f64;
    let seen = if shape.causal {
        0.5 * (s + QUERY_TILE_ROWS.min(shape.seq_len) as f64)
    } else {
        s
    };
    seen + row_overhead
}

/// Latency, energy and bound of a fused attention kernel on `cores` tensor cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionCost {
    pub latency_s: f64,
    pub energy_j: f64,
    pub bound: Bound,
    /// The score products' tensor-core time and the exponentials' vector time between them.
    pub compute_s: f64,
    /// The kernel's own tensors through HBM.
    pub hbm_s: f64,
}

/// Cost of a fused attention kernel of `shape` in `pass` with `elem_bytes`-byte tensors on
/// `cores` tensor cores of `arch`.
pub fn attention_cost(
    arch: &ArchConfig,
    shape: AttentionShape,
    pass: Pass,
    elem_bytes: u32,
    cores: u32,
) -> AttentionCost {
    let (heads, s, d) = (shape.heads, shape.seq_len, shape.head_dim);
    let eff = &arch.efficiency;
    // Each product is d multiply-accumulates per score element its rows compute; the tiles
    // stay on chip, so they stream through the arrays at the kernel's own fraction of peak.
    let scores_per_row = scores_per_query_row(shape, eff.attention_row_overhead_for(pass));
    let score_elements = (heads * s) as f64 * scores_per_row;
    let products = attention_products(pass).iter().sum::<u64>() as f64;
    let macs = products * score_elements * d as f64;
    let array_macs_per_cycle = u64::from(arch.tensor.rows) * u64::from(arch.tensor.cols);
    let macs_per_s = f64::from(cores.clamp(1, arch.tensor.count.max(1)))
        * array_macs_per_cycle as f64
        * arch.clock_hz
        * eff.sustained_clock
        * eff.attention_compute_for(pass);
    let products_s = macs / macs_per_s;
    // One exponential per score element each pass, on the vector lanes beside these cores, at
    // the kernel's clock.
    let vector_cores = (u64::from(cores) * u64::from(arch.vector.count)
        / u64::from(arch.tensor.count.max(1)))
    .max(1);
    let exp_lane_cycles = score_elements * arch.vector_cycles.exp;
    let lane_cycles_per_s = (vector_cores * u64::from(arch.vector.lanes.max(1))) as f64
        * arch.clock_hz
        * eff.sustained_clock
        * eff.vector_compute;
    let exp_s = exp_lane_cycles / lane_cycles_per_s;
    let compute_s = products_s + exp_s;
    let op = kernel_op(OpKind::Attention { shape, pass }, elem_bytes);
    let hbm_bytes = (op.bytes_read + op.bytes_written) as f64;
    let hbm_s = hbm_bytes / (arch.hbm.bandwidth_bytes_per_s * eff.hbm_bandwidth);
    let overhead_s = eff.gemm_overhead_s * op.launches();
    let e = &arch.energy;
    // Every array pass streams its operands out of the local buffer, as a GEMM's do.
    let edges = 1.0 / f64::from(arch.tensor.rows.max(1)) + 1.0 / f64::from(arch.tensor.cols.max(1));
    let local_bytes = macs * f64::from(elem_bytes) * edges;
    AttentionCost {
        latency_s: compute_s.max(hbm_s) + overhead_s,
        energy_j: macs * e.mac_j
            + exp_lane_cycles * e.vector_op_j
            + local_bytes * e.local_byte_j
            + hbm_bytes * (e.glb_byte_j + e.hbm_byte_j),
        bound: dominant_bound(compute_s, &[(MemoryLevel::Hbm, hbm_s)], overhead_s),
        compute_s,
        hbm_s,
    }
}
