//! Collectives over the interconnect: bandwidth-optimal ring algorithms and point-to-point
//! transfers in the α-β model (DESIGN §4). A group of n devices uses the fastest tier that
//! spans n devices; `efficiency.link_bandwidth` scales that tier's bandwidth.

use crate::arch::{ArchConfig, Tier};
use crate::workload::CollectiveKind;
use serde::{Deserialize, Serialize};

/// Cost of one collective, per device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveCost {
    pub latency_s: f64,
    pub energy_j: f64,
    /// Name of the tier the group runs on (`None` for a group of one device: no transfer).
    pub tier: Option<String>,
    /// Bytes each device sends over its link.
    pub link_bytes: f64,
}

/// The fastest tier whose groups span at least `group` devices; the last (cluster-wide)
/// tier when none is that large. `None` when the chip lists no tiers.
pub fn tier_for_group(arch: &ArchConfig, group: u32) -> Option<&Tier> {
    arch.interconnect
        .iter()
        .find(|t| t.devices >= group)
        .or(arch.interconnect.last())
}

/// Latency and energy of `kind` over `group` devices for a buffer of `bytes` per device:
/// ring all-reduce 2(n−1)/n·S/B + 2(n−1)·α; all-gather and reduce-scatter (n−1)/n·S/B +
/// (n−1)·α; point-to-point S/B + α.
pub fn collective_cost(
    arch: &ArchConfig,
    kind: CollectiveKind,
    bytes: u64,
    group: u32,
) -> CollectiveCost {
    let none = CollectiveCost {
        latency_s: 0.0,
        energy_j: 0.0,
        tier: None,
        link_bytes: 0.0,
    };
    let point_to_point = kind == CollectiveKind::SendRecv;
    // A collective within one device moves nothing; a send/recv always crosses a link.
    if bytes == 0 || (group <= 1 && !point_to_point) {
        return none;
    }
    let Some(tier) = tier_for_group(arch, group.max(2)) else {
        return none;
    };
    let n = f64::from(group.max(2));
    let s = bytes as f64;
    let (link_bytes, hops) = match kind {
        CollectiveKind::AllReduce => (2.0 * (n - 1.0) / n * s, 2.0 * (n - 1.0)),
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => ((n - 1.0) / n * s, n - 1.0),
        CollectiveKind::SendRecv => (s, 1.0),
    };
    let bandwidth = tier.bandwidth_bytes_per_s * arch.efficiency.link_bandwidth;
    CollectiveCost {
        latency_s: link_bytes / bandwidth + hops * tier.latency_s,
        energy_j: link_bytes * arch.energy.link_byte_j,
        tier: Some(tier.name.clone()),
        link_bytes,
    }
}
