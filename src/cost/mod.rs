//! Per-operator cost on one chip: latency and energy on one core and intra-operator parallel
//! on all cores of the operator's type (docs/design.md §4).
//!
//! Three analytic models, each a pure function of the chip and the operator's shape:
//! [`gemm_cost`] (tiled systolic GEMM with per-level traffic), [`vector_cost`] (per-element
//! arithmetic against a memory term) and [`collective_cost`] (ring / point-to-point α-β).
//! [`CostModel`] wraps them for the schedule stage: it is `Send + Sync` and memoises on
//! `(OpKind, elem_bytes)`, which fully determine an operator's cost. [`fit_efficiency`]
//! fits a chip's few efficiency parameters to measured kernels; [`peak_power`] is a chip's
//! static power plus the dynamic power of its densest kernel, and [`fit_static_power`] fits the
//! static part to kernels measured with their board power.
//!
//! GEMM arithmetic runs at the chip's sustained, power-limited clock; each vector primitive at
//! its own achieved HBM bandwidth and overhead where the chip file sets them, its backward
//! kernels at theirs. The fit (`fit.rs`) takes the shared parameters against every kernel class,
//! the link bandwidth against measured collectives, then each measured vector primitive's own
//! bandwidth (forward and, where measured, backward) and overhead.

mod attention;
mod collective;
mod fit;
mod gemm;
mod power;
mod vector;

pub use attention::{attention_cost, AttentionCost};
pub use collective::{collective_cost, CollectiveCost};
pub use fit::{
    class_errors, fit_efficiency, fit_in_pass, on_all_cores, predicted_latency_s, KernelClass,
    KernelSample,
};
pub use gemm::{gemm_cost, Decomposition, GemmCost, GemmTile};
pub use power::{
    fit_static_power, peak_power, peak_power_w, static_power_w, PeakPower, PowerRow, PowerSample,
    StaticPowerFit, MIN_POWER_WINDOW_S, PEAK_GEMM_EDGE, PEAK_STREAM_ELEMENTS,
};
pub use vector::{vector_cost, vector_cycles_per_element, VectorCost};

use crate::arch::ArchConfig;
use crate::workload::{CoreType, Op, OpKind};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::RwLock;

/// The memory level whose traffic limits an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryLevel {
    /// Off-chip HBM.
    Hbm,
    /// The global buffer feeding the cores' local buffers.
    Glb,
    /// A core's local buffer.
    Local,
}

/// What limits an operator's latency: the largest term of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// Tensor-core or vector-lane arithmetic.
    Compute,
    /// Traffic at the given memory level.
    Memory(MemoryLevel),
    /// The fixed per-kernel overhead exceeds every other term.
    Overhead,
    /// Link bandwidth and latency (collectives).
    Network,
}

/// Picks the bound from the model's terms: the largest of compute and the memory levels, or
/// `Overhead` when the fixed overhead alone is larger than all of them.
fn dominant_bound(compute_s: f64, memory_s: &[(MemoryLevel, f64)], overhead_s: f64) -> Bound {
    let mut bound = Bound::Compute;
    let mut worst_s = compute_s;
    for &(level, t_s) in memory_s {
        if t_s > worst_s {
            worst_s = t_s;
            bound = Bound::Memory(level);
        }
    }
    if overhead_s > worst_s {
        Bound::Overhead
    } else {
        bound
    }
}

/// Cost of one operator in its two execution variants.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpCost {
    pub core: CoreType,
    /// Latency when the operator runs on a single core of its type.
    pub one_core_s: f64,
    /// Latency when the operator is split across all cores of its type.
    pub all_cores_s: f64,
    pub one_core_energy_j: f64,
    pub all_cores_energy_j: f64,
    /// What limits the single-core variant.
    pub one_core_bound: Bound,
    /// What limits the all-cores variant.
    pub all_cores_bound: Bound,
}

/// One execution variant's price: latency, energy and what limits it.
type Variant = (f64, f64, Bound);

impl OpCost {
    /// An operator on `core` from its single-core and all-cores variants.
    fn from_variants(core: CoreType, [one, all]: [Variant; 2]) -> OpCost {
        OpCost {
            core,
            one_core_s: one.0,
            all_cores_s: all.0,
            one_core_energy_j: one.1,
            all_cores_energy_j: all.1,
            one_core_bound: one.2,
            all_cores_bound: all.2,
        }
    }
}

/// Prices operators on one chip. Cheap to share across threads: lookups take a read lock and
/// a miss computes outside any lock, so parallel schedulers do not serialise on it. The
/// models are deterministic, so a racing duplicate insert stores an identical value.
#[derive(Debug)]
pub struct CostModel {
    arch: ArchConfig,
    hardware_key: String,
    memo: RwLock<HashMap<(OpKind, u32), OpCost>>,
}

impl CostModel {
    pub fn new(arch: &ArchConfig) -> CostModel {
        let mut costed = arch.clone();
        costed.name.clear();
        costed.hbm.capacity_bytes = 0;
        costed.die_area_mm2 = None;
        CostModel {
            arch: arch.clone(),
            hardware_key: serde_json::to_string(&costed)
                .expect("an ArchConfig (numbers and strings) always serialises to JSON"),
            memo: RwLock::new(HashMap::new()),
        }
    }

    pub fn arch(&self) -> &ArchConfig {
        &self.arch
    }

    /// Everything of the chip that changes an operator's cost, as a cache key: the chip with
    /// its name, HBM capacity and die area blanked, so chips differing only in those share
    /// per-layer results.
    pub fn hardware_key(&self) -> &str {
        &self.hardware_key
    }

    /// Cost of `op` in both variants; memoised on `(op.kind, op.elem_bytes)`.
    pub fn op_cost(&self, op: &Op) -> OpCost {
        let key = (op.kind, op.elem_bytes);
        // A poisoned lock only means another thread panicked mid-insert of a pure value:
        // the map is still consistent, so keep using it.
        if let Some(cost) = self
            .memo
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return *cost;
        }
        let cost = self.compute(op.kind, op.elem_bytes);
        self.memo
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, cost);
        cost
    }

    fn compute(&self, kind: OpKind, elem_bytes: u32) -> OpCost {
        let arch = &self.arch;
        let tensor_cores = [1, arch.tensor.count];
        match kind {
            OpKind::Gemm { batch, m, n, k } => OpCost::from_variants(
                CoreType::Tensor,
                tensor_cores.map(|cores| {
                    let c = gemm_cost(arch, batch, m, n, k, elem_bytes, cores);
                    (c.latency_s, c.energy_j, c.bound)
                }),
            ),
            OpKind::Vector {
                op,
                elements,
                row_len,
                pass,
            } => OpCost::from_variants(
                CoreType::Vector,
                [1, arch.vector.count].map(|cores| {
                    let c = vector_cost(arch, op, pass, elements, row_len, elem_bytes, cores);
                    (c.latency_s, c.energy_j, c.bound)
                }),
            ),
            OpKind::Attention { shape, pass } => OpCost::from_variants(
                CoreType::Tensor,
                tensor_cores.map(|cores| {
                    let c = attention_cost(arch, shape, pass, elem_bytes, cores);
                    (c.latency_s, c.energy_j, c.bound)
                }),
            ),
            OpKind::Collective {
                collective,
                bytes,
                group,
            } => {
                // The device has one network port: both variants are the same transfer.
                let c = collective_cost(arch, collective, bytes, group);
                OpCost::from_variants(
                    CoreType::Link,
                    [(c.latency_s, c.energy_j, Bound::Network); 2],
                )
            }
        }
    }
}
