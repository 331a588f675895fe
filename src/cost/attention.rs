//! Fused (flash) attention: the score products run on the tensor cores as GEMMs of their
//! shapes would (tiles, waves, the sustained clock) while the score tiles stay on chip, so HBM
//! sees only the kernel's own tensors (`workload::kernel_op` counts them); the softmax's
//! arithmetic overlaps the products. They run at the chip's `efficiency.attention_compute`
//! of peak: fitted where fused kernels were timed (collect.py's `attention_flash` rows), else
//! the GEMMs' `tensor_compute`, an assumption those rows replace.

use super::gemm::gemm_cost;
use super::{dominant_bound, Bound, MemoryLevel};
use crate::arch::ArchConfig;
use crate::workload::{attention_products, kernel_op, AttentionShape, OpKind, Pass};

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
    let masked = if shape.causal { 0.5 } else { 1.0 };
    let [scores, values] = attention_products(pass).map(|n| masked * n as f64);
    let square = gemm_cost(arch, heads, s, s, d, elem_bytes, cores);
    let tall = gemm_cost(arch, heads, s, d, s, elem_bytes, cores);
    // The products at the fused kernel's own fraction of peak, not the GEMMs'.
    let eff = &arch.efficiency;
    let fraction = eff.tensor_compute / eff.attention_compute();
    let compute_s = fraction * (scores * square.compute_s + values * tall.compute_s);
    let op = kernel_op(OpKind::Attention { shape, pass }, elem_bytes);
    let hbm_bytes = (op.bytes_read + op.bytes_written) as f64;
    let hbm_s = hbm_bytes / (arch.hbm.bandwidth_bytes_per_s * eff.hbm_bandwidth);
    let overhead_s = eff.gemm_overhead_s * op.launches();
    let e = &arch.energy;
    let macs = scores * square.macs + values * tall.macs;
    let local_bytes = scores * square.local_bytes + values * tall.local_bytes;
    AttentionCost {
        latency_s: compute_s.max(hbm_s) + overhead_s,
        energy_j: macs * e.mac_j
            + local_bytes * e.local_byte_j
            + hbm_bytes * (e.glb_byte_j + e.hbm_byte_j),
        bound: dominant_bound(compute_s, &[(MemoryLevel::Hbm, hbm_s)], overhead_s),
        compute_s,
        hbm_s,
    }
}
