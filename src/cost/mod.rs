//! Per-operator cost on one chip: latency and energy on one core and intra-operator parallel
//! on all cores of the operator's type (DESIGN §4).

use crate::workload::CoreType;
use serde::{Deserialize, Serialize};

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
}
