//! Fused (flash) attention: the score products run on the tensor cores as GEMMs of their
//! shapes would (tiles, waves, the sustained clock) while the score tiles stay on chip, so HBM
//! sees only the kernel's own tensors (`workload::kernel_op` counts them); the softmax's
//! arithmetic overlaps the products. They run at the chip's `efficiency.attention_compute`
//! of peak: fitted where fused kernels were timed (collect.py's `attention_flash` rows), else
//! the GEMMs' `tensor_compute`, an assumption those rows replace.

use super::gemm::gemm_cost;
use super::{dominant_bound, Bound, MemoryLevel};
use crate::arch::ArchConfig;
use crate::workload::{attention_products, kernel_op, OpKind, Pass};

/// Latency, energy and bound of a fused attention kernel on `cores` tensor cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionCost {
    pub latency_s: f64,
    pub energy_j: f64,
    pub bound: Bound,
    /// The score products' tensor-core time (half of it under a causal mask).
    pub compute_s: f64,
    /// The kernel's own tensors through HBM.
    pub hbm_s: f64,
}

/// Cost of `kind` (an [`OpKind::Attention`]) with `elem_bytes`-byte tensors on `cores` tensor
/// cores of `arch`; `None` for any other kind.
pub fn attention_cost(
    arch: &ArchConfig,
    kind: OpKind,
    elem_bytes: u32,
    cores: u32,
) -> Option<AttentionCost> {
    let OpKind::Attention { shape, pass } = kind else {
        return None;
    };
    let (heads, s, d) = (shape.heads, shape.seq_len, shape.head_dim);
    let masked = if shape.causal { 0.5 } else { 1.0 };
    // QKᵀ-shaped products (s × s out of depth d) and the others (s × d out of depth s).
    let scores = match pass {
        Pass::Forward => 1,
        Pass::Backward => 2,
    };
    let others = attention_products(pass) - scores;
    let square = gemm_cost(arch, heads, s, s, d, elem_bytes, cores);
    let tall = gemm_cost(arch, heads, s, d, s, elem_bytes, cores);
    // The products at the fused kernel's own fraction of peak, not the GEMMs'.
    let eff = &arch.efficiency;
    let fraction = eff.tensor_compute / eff.attention_compute();
    let compute_s =
        fraction * masked * (scores as f64 * square.compute_s + others as f64 * tall.compute_s);
    let op = kernel_op(kind, elem_bytes);
    let hbm_bytes = (op.bytes_read + op.bytes_written) as f64;
    let hbm_s = hbm_bytes / (arch.hbm.bandwidth_bytes_per_s * eff.hbm_bandwidth);
    let overhead_s = eff.gemm_overhead_s * op.launches();
    let e = &arch.energy;
    let macs = masked * (scores as f64 * square.macs + others as f64 * tall.macs);
    let local_bytes =
        masked * (scores as f64 * square.local_bytes + others as f64 * tall.local_bytes);
    Some(AttentionCost {
        latency_s: compute_s.max(hbm_s) + overhead_s,
        energy_j: macs * e.mac_j
            + local_bytes * e.local_byte_j
            + hbm_bytes * (e.glb_byte_j + e.hbm_byte_j),
        bound: dominant_bound(compute_s, &[(MemoryLevel::Hbm, hbm_s)], overhead_s),
        compute_s,
        hbm_s,
    })
}
