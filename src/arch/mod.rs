//! Accelerators: the template, chip files, search spaces and the area model (docs/design.md
//! §3, docs/arch.md).
//!
//! - [`load_chip`] reads one chip (`arch_specs/<chip>.toml`) and validates it.
//! - [`SearchSpace`] reads a search-space file and streams its configurations.
//! - [`area_breakdown`] is the PHAZE closed-form area model.
//! - [`group_link`] is the tier a collective group runs on and its bus bandwidth: one ring per
//!   member's link where the group has several members in each domain of the tier below
//!   (NCCL's multi-rail); in-layer collectives and the placement's gradient sync and sends
//!   share it.
//!
//! File formats are documented in `docs/arch.md`.

mod area;
mod chip;
mod config;
mod space;

pub use area::{
    area_breakdown, global_buffer_area_um2, local_buffer_area_um2, AreaBreakdown, TENSOR_MAC_UM2,
    VECTOR_LANE_UM2,
};
pub use chip::load_chip;
pub use config::*;
pub use space::SearchSpace;
