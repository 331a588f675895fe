//! Collectives over the interconnect: bandwidth-optimal ring algorithms and point-to-point
//! transfers in the α-β model (docs/design.md §4). A group of n consecutive devices uses the
//! fastest tier that spans n devices, at its bus bandwidth ([`group_link`]: a group wider than
//! one domain of the tier below drives one ring per member's link);
//! `efficiency.link_bandwidth` scales it.

use crate::arch::{fewest_in_domain, group_link, ArchConfig};
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
    let group = group.max(2);
    // A transfer uses the sender's own link; a ring collective every member's.
    let rails = |domain| {
        if point_to_point {
            1
        } else {
            fewest_in_domain(group, 1, domain)
        }
    };
    let Some(link) = group_link(&arch.interconnect, group, rails) else {
        return none;
    };
    let n = f64::from(group);
    let s = bytes as f64;
    let (link_bytes, hops) = match kind {
        CollectiveKind::AllReduce => (2.0 * (n - 1.0) / n * s, 2.0 * (n - 1.0)),
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => ((n - 1.0) / n * s, n - 1.0),
        CollectiveKind::SendRecv => (s, 1.0),
    };
    let bandwidth = link.bandwidth_bytes_per_s * arch.efficiency.link_bandwidth;
    CollectiveCost {
        latency_s: link_bytes / bandwidth + hops * link.tier.latency_s,
        energy_j: link_bytes * arch.energy.link_byte_j,
        tier: Some(link.tier.name.clone()),
        link_bytes,
    }
}
