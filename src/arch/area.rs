//! The PHAZE area model (22 nm Accelergy/CACTI tables, `data/reference/phaze_area.md`).
//!
//! Area is linear in MACs and lanes; buffer area comes from tables given at powers of two.
//! Sizes between table points are interpolated linearly in log(size)–log(area) (SRAM area
//! follows a power law in capacity between neighbouring points); sizes outside a table are
//! extrapolated with the power law of the nearest end segment, and a size of zero has zero
//! area. Real chips (164 KiB local buffers, 40 MiB L2) therefore get a template estimate; their
//! published die area stays informational.

use super::config::ArchConfig;

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// One tensor-core MAC with its register file, in µm².
pub const TENSOR_MAC_UM2: f64 = 760.041386;
/// One vector-core lane with its register file, in µm².
pub const VECTOR_LANE_UM2: f64 = 759.823853;

/// A_L2: per-core local buffer area (size in KiB, area in µm²).
const LOCAL_BUFFER_TABLE: [(f64, f64); 11] = [
    (1.0, 6_133.98),
    (2.0, 8_248.43),
    (4.0, 12_610.50),
    (8.0, 22_139.90),
    (16.0, 38_583.00),
    (32.0, 63_338.40),
    (64.0, 115_579.00),
    (128.0, 204_764.00),
    (256.0, 446_565.00),
    (512.0, 897_890.00),
    (1024.0, 1_634_130.00),
];

/// A_GLB: global buffer area (size in MiB, area in µm²).
const GLOBAL_BUFFER_TABLE: [(f64, f64); 7] = [
    (2.0, 3_338_220.0),
    (4.0, 6_078_640.0),
    (8.0, 11_952_400.0),
    (16.0, 23_745_200.0),
    (32.0, 46_750_900.0),
    (64.0, 88_605_700.0),
    (128.0, 175_423_000.0),
];

/// Area of one chip split by component, in mm².
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AreaBreakdown {
    /// All tensor-core MACs with their register files.
    pub tensor_mm2: f64,
    /// All tensor cores' local buffers.
    pub tensor_local_mm2: f64,
    /// All vector-core lanes with their register files.
    pub vector_mm2: f64,
    /// All vector cores' local buffers.
    pub vector_local_mm2: f64,
    /// The shared global buffer.
    pub glb_mm2: f64,
    /// Sum of the components.
    pub total_mm2: f64,
}

/// The fields of the template that determine area (a search-space point before it becomes
/// an [`ArchConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AreaFields {
    pub tensor_count: u64,
    pub tensor_rows: u64,
    pub tensor_cols: u64,
    pub tensor_local_bytes: u64,
    pub vector_count: u64,
    pub vector_lanes: u64,
    pub vector_local_bytes: u64,
    pub glb_bytes: u64,
}

impl AreaFields {
    pub(crate) fn of(arch: &ArchConfig) -> AreaFields {
        AreaFields {
            tensor_count: u64::from(arch.tensor.count),
            tensor_rows: u64::from(arch.tensor.rows),
            tensor_cols: u64::from(arch.tensor.cols),
            tensor_local_bytes: arch.tensor.local_buffer_bytes,
            vector_count: u64::from(arch.vector.count),
            vector_lanes: u64::from(arch.vector.lanes),
            vector_local_bytes: arch.vector.local_buffer_bytes,
            glb_bytes: arch.glb.bytes,
        }
    }

    pub(crate) fn breakdown(&self) -> AreaBreakdown {
        const UM2_PER_MM2: f64 = 1e6;
        let tensor_count = self.tensor_count as f64;
        let vector_count = self.vector_count as f64;
        let tensor_um2 =
            tensor_count * (self.tensor_rows as f64) * (self.tensor_cols as f64) * TENSOR_MAC_UM2;
        let tensor_local_um2 = tensor_count * local_buffer_area_um2(self.tensor_local_bytes);
        let vector_um2 = vector_count * (self.vector_lanes as f64) * VECTOR_LANE_UM2;
        let vector_local_um2 = vector_count * local_buffer_area_um2(self.vector_local_bytes);
        let glb_um2 = global_buffer_area_um2(self.glb_bytes);
        let total_um2 = tensor_um2 + tensor_local_um2 + vector_um2 + vector_local_um2 + glb_um2;
        AreaBreakdown {
            tensor_mm2: tensor_um2 / UM2_PER_MM2,
            tensor_local_mm2: tensor_local_um2 / UM2_PER_MM2,
            vector_mm2: vector_um2 / UM2_PER_MM2,
            vector_local_mm2: vector_local_um2 / UM2_PER_MM2,
            glb_mm2: glb_um2 / UM2_PER_MM2,
            total_mm2: total_um2 / UM2_PER_MM2,
        }
    }
}

/// Template area of `arch` by component (PHAZE closed form).
pub fn area_breakdown(arch: &ArchConfig) -> AreaBreakdown {
    AreaFields::of(arch).breakdown()
}

/// A_L2 of one local buffer of `bytes`, in µm².
pub fn local_buffer_area_um2(bytes: u64) -> f64 {
    table_area_um2(&LOCAL_BUFFER_TABLE, bytes as f64 / KIB)
}

/// A_GLB of a global buffer of `bytes`, in µm².
pub fn global_buffer_area_um2(bytes: u64) -> f64 {
    table_area_um2(&GLOBAL_BUFFER_TABLE, bytes as f64 / MIB)
}

/// Log-log interpolation in `table` (sizes ascending); exact at table points.
fn table_area_um2(table: &[(f64, f64)], size: f64) -> f64 {
    if size <= 0.0 {
        return 0.0;
    }
    if let Some(&(_, area)) = table.iter().find(|&&(s, _)| s == size) {
        return area;
    }
    // The segment whose right end is the first point above `size`, clamped to the end
    // segments for extrapolation.
    let above = table.partition_point(|&(s, _)| s < size);
    let right = above.clamp(1, table.len() - 1);
    let (s0, a0) = table[right - 1];
    let (s1, a1) = table[right];
    let exponent = (a1 / a0).ln() / (s1 / s0).ln();
    a0 * (size / s0).powf(exponent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_points_are_exact() {
        for &(kib, area) in &LOCAL_BUFFER_TABLE {
            assert_eq!(local_buffer_area_um2((kib * KIB) as u64), area);
        }
        for &(mib, area) in &GLOBAL_BUFFER_TABLE {
            assert_eq!(global_buffer_area_um2((mib * MIB) as u64), area);
        }
    }

    #[test]
    fn geometric_midpoint_is_geometric_mean() {
        // log-log interpolation at sqrt(2)·s0 gives sqrt(a0·a1); rounding the size to whole
        // bytes moves the result by under 4e-6 relative.
        let bytes = (2f64.sqrt() * 128.0 * KIB).round() as u64;
        let expected = (204_764.0f64 * 446_565.0).sqrt();
        assert!((local_buffer_area_um2(bytes) / expected - 1.0).abs() < 4e-6);
    }

    #[test]
    fn extrapolation_follows_end_segments() {
        // 256 MiB continues the 64 → 128 MiB power law: a128²/a64.
        let expected = 175_423_000.0f64 * 175_423_000.0 / 88_605_700.0;
        let got = global_buffer_area_um2(256 * 1024 * 1024);
        assert!((got / expected - 1.0).abs() < 1e-12);
        // 512 B continues the 1 → 2 KiB power law: a1²/a2.
        let expected = 6_133.98f64 * 6_133.98 / 8_248.43;
        assert!((local_buffer_area_um2(512) / expected - 1.0).abs() < 1e-12);
        assert_eq!(local_buffer_area_um2(0), 0.0);
    }
}
