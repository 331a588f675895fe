//! Analytic tiling model of a (batched) GEMM on systolic tensor cores.
//!
//! The output is cut into `tile.m × tile.n` tiles, each computed by one core while K streams
//! through it in steps of `tile.k_step`; tiles are dealt to the cores in waves. A tile needs
//! its double-buffered operand slices and its fp32 accumulators in the core's local buffer.
//! Traffic is counted per level:
//! - GLB → local: every tile reads its A row-panel and B column-panel once, so A is re-read
//!   once per tile column and B once per tile row; results are written once.
//! - HBM → GLB: the GLB holds an output *block* of tiles. A block either is one wave (its
//!   tiles stream K in lockstep, so the GLB only needs a window of their panels) or has its
//!   full K panels resident; A is re-read once per block column and B once per block row.
//!
//! Where the chip's GEMM library balances work with Stream-K (`tensor.stream_k`; Osama et al.,
//! PPoPP 2023), each tile's K slices are work units dealt evenly to the cores instead, so a
//! partly filled last wave costs no whole wave: a core's run of units may start or end inside
//! a tile, whose fp32 partial sums then pass through the GLB to the core that finishes it.
//!
//! Latency = max(compute, GLB traffic / GLB bandwidth, HBM traffic / HBM bandwidth) plus the
//! fixed kernel overhead; the tiling (and, with Stream-K, the decomposition) is the one of a
//! small candidate set with the lowest latency (as a cuBLAS heuristic would pick).

use super::{dominant_bound, Bound, MemoryLevel};
use crate::arch::ArchConfig;
use serde::{Deserialize, Serialize};

/// Largest tile edge tried, in multiples of the array edge (1, 2, 4, 8 × rows or cols).
const TILE_MULTIPLES: [u64; 4] = [1, 2, 4, 8];
/// Accumulators are kept in fp32 (or wider when the operands are wider).
const MIN_ACCUMULATOR_BYTES: u64 = 4;

/// The tiling a GEMM runs with: output tile `m × n` per core, K streamed in `k_step` slices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmTile {
    pub m: u64,
    pub n: u64,
    pub k_step: u64,
}

/// How a GEMM's work is dealt to the cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decomposition {
    /// Whole tiles, one per core, in waves.
    Waves,
    /// Stream-K: K slices of tiles dealt evenly to the cores.
    StreamK,
}

/// Cost of one GEMM on a given number of cores, with the model's intermediate terms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GemmCost {
    pub latency_s: f64,
    pub energy_j: f64,
    pub bound: Bound,
    pub tile: GemmTile,
    pub decomposition: Decomposition,
    /// Cores that receive work.
    pub cores_used: u32,
    /// Tile waves over the cores used (with Stream-K, the tiles' worth of units per core,
    /// rounded up).
    pub waves: u64,
    /// Array cycles including fill/drain and tile/wave quantisation.
    pub compute_cycles: u64,
    pub compute_s: f64,
    pub glb_s: f64,
    pub hbm_s: f64,
    /// Useful multiply-accumulates (batch·m·n·k).
    pub macs: f64,
    /// Operand bytes read from local buffers into the arrays, plus results written.
    pub local_bytes: f64,
    /// Bytes moved between the GLB and the local buffers.
    pub glb_bytes: f64,
    /// Bytes moved between HBM and the GLB.
    pub hbm_bytes: f64,
}

/// Cost of `batch` products (m × k)·(k × n) with `elem_bytes`-byte operands on `cores`
/// tensor cores of `arch` (1 for the single-core variant, `arch.tensor.count` for the
/// intra-operator parallel one; clamped to that range).
pub fn gemm_cost(
    arch: &ArchConfig,
    batch: u64,
    m: u64,
    n: u64,
    k: u64,
    elem_bytes: u32,
    cores: u32,
) -> GemmCost {
    let cores = cores.clamp(1, arch.tensor.count.max(1));
    let rows = u64::from(arch.tensor.rows.max(1));
    let cols = u64::from(arch.tensor.cols.max(1));
    if batch == 0 || m == 0 || n == 0 || k == 0 {
        return empty_gemm(rows, cols);
    }
    let candidates = tile_candidates(arch, m, n, k, u64::from(elem_bytes));
    let decompositions: &[Decomposition] = if arch.tensor.stream_k {
        &[Decomposition::Waves, Decomposition::StreamK]
    } else {
        &[Decomposition::Waves]
    };
    let mut best: Option<GemmCost> = None;
    for tile in candidates {
        for &decomposition in decompositions {
            let cost = cost_with_tile(
                arch,
                batch,
                (m, n, k),
                elem_bytes,
                cores,
                tile,
                decomposition,
            );
            // Strict `<` keeps the first (smallest tile, waves) on ties: a deterministic choice.
            if best.is_none_or(|b| cost.latency_s < b.latency_s) {
                best = Some(cost);
            }
        }
    }
    best.unwrap_or_else(|| empty_gemm(rows, cols))
}

fn empty_gemm(rows: u64, cols: u64) -> GemmCost {
    GemmCost {
        latency_s: 0.0,
        energy_j: 0.0,
        bound: Bound::Compute,
        tile: GemmTile {
            m: rows,
            n: cols,
            k_step: 0,
        },
        decomposition: Decomposition::Waves,
        cores_used: 0,
        waves: 0,
        compute_cycles: 0,
        compute_s: 0.0,
        glb_s: 0.0,
        hbm_s: 0.0,
        macs: 0.0,
        local_bytes: 0.0,
        glb_bytes: 0.0,
        hbm_bytes: 0.0,
    }
}

/// Tiles of 1, 2, 4, 8 array edges per side (no larger than the padded matrix) whose
/// double-buffered operand slices and accumulators fit the local buffer. If none fits (a
/// tiny buffer), the single array-sized tile is used anyway: the array's own registers hold
/// the accumulators.
fn tile_candidates(arch: &ArchConfig, m: u64, n: u64, k: u64, elem_bytes: u64) -> Vec<GemmTile> {
    let rows = u64::from(arch.tensor.rows.max(1));
    let cols = u64::from(arch.tensor.cols.max(1));
    let acc_bytes = elem_bytes.max(MIN_ACCUMULATOR_BYTES);
    // One K slice is as deep as the array is wide: the array consumes that many steps per slice.
    let k_step = k.min(rows.max(cols));
    let sizes = |edge: u64, dim: u64| -> Vec<u64> {
        let padded = dim.div_ceil(edge) * edge;
        TILE_MULTIPLES
            .iter()
            .map(|f| f * edge)
            .filter(|&t| t == edge || t <= padded)
            .collect()
    };
    let mut out = Vec::new();
    for &tm in &sizes(rows, m) {
        for &tn in &sizes(cols, n) {
            let need = 2 * (tm + tn) * k_step * elem_bytes + tm * tn * acc_bytes;
            if need <= arch.tensor.local_buffer_bytes {
                out.push(GemmTile {
                    m: tm,
                    n: tn,
                    k_step,
                });
            }
        }
    }
    if out.is_empty() {
        out.push(GemmTile {
            m: rows,
            n: cols,
            k_step,
        });
    }
    out
}

fn cost_with_tile(
    arch: &ArchConfig,
    batch: u64,
    (m, n, k): (u64, u64, u64),
    elem_bytes: u32,
    cores: u32,
    tile: GemmTile,
    decomposition: Decomposition,
) -> GemmCost {
    let eff = &arch.efficiency;
    let rows = u64::from(arch.tensor.rows.max(1));
    let cols = u64::from(arch.tensor.cols.max(1));
    let eb = f64::from(elem_bytes);
    let tiles_m = m.div_ceil(tile.m);
    let tiles_n = n.div_ceil(tile.n);
    let tiles = batch * tiles_m * tiles_n;
    // Each tile is ceil(tm/rows)·ceil(tn/cols) array passes of K steps; the array fills and
    // drains once per tile (consecutive passes pipeline through it).
    let passes = tile.m.div_ceil(rows) * tile.n.div_ceil(cols);
    let fill_drain = rows + cols - 2;
    let acc_bytes = u64::from(elem_bytes).max(MIN_ACCUMULATOR_BYTES) as f64;
    let (cores_used, waves, compute_cycles, fixup_bytes) = match decomposition {
        Decomposition::Waves => {
            let cores_used = u64::from(cores).min(tiles);
            let waves = tiles.div_ceil(cores_used);
            (cores_used, waves, waves * (passes * k + fill_drain), 0.0)
        }
        Decomposition::StreamK => {
            let slices = k.div_ceil(tile.k_step.max(1));
            let units = tiles * slices;
            let cores_used = u64::from(cores).min(units);
            let per_core = units.div_ceil(cores_used);
            // Core c runs units [c·per_core, (c+1)·per_core): the array fills and drains once
            // per tile the run touches, and every run that starts inside a tile hands that
            // tile's partial sums over the GLB (written once, read once).
            let mut cycles = 0;
            let mut split_tiles = 0u64;
            for start in (0..units).step_by(per_core as usize) {
                let end = (start + per_core).min(units);
                let touched = (end - 1) / slices - start / slices + 1;
                let run = passes * ((end - start) * k).div_ceil(slices) + touched * fill_drain;
                cycles = cycles.max(run);
                split_tiles += u64::from(start % slices != 0);
            }
            let fixup = 2.0 * split_tiles as f64 * (tile.m * tile.n) as f64 * acc_bytes;
            (cores_used, per_core.div_ceil(slices), cycles, fixup)
        }
    };
    let compute_s =
        compute_cycles as f64 / (arch.clock_hz * eff.sustained_clock * eff.tensor_compute);

    let (bf, mf, nf, kf) = (batch as f64, m as f64, n as f64, k as f64);
    let a_bytes = mf * kf * eb;
    let b_bytes = kf * nf * eb;
    let c_bytes = mf * nf * eb;

    let glb_bytes =
        bf * (a_bytes * tiles_n as f64 + b_bytes * tiles_m as f64 + c_bytes) + fixup_bytes;
    // A core draws its share of the aggregate GLB bandwidth.
    let glb_bw = arch.glb.bandwidth_bytes_per_s * cores_used as f64 / f64::from(arch.tensor.count);
    let glb_s = glb_bytes / glb_bw;

    let (block_rows, block_cols) = glb_block(arch, tile, (m, n, k), eb, cores_used);
    let hbm_bytes = bf
        * (a_bytes * tiles_n.div_ceil(block_cols) as f64
            + b_bytes * tiles_m.div_ceil(block_rows) as f64
            + c_bytes);
    let hbm_s = hbm_bytes / (arch.hbm.bandwidth_bytes_per_s * eff.hbm_bandwidth);

    let busy_s = compute_s.max(glb_s).max(hbm_s);
    let bound = dominant_bound(
        compute_s,
        &[(MemoryLevel::Glb, glb_s), (MemoryLevel::Hbm, hbm_s)],
        eff.gemm_overhead_s,
    );

    // Every array pass streams its A rows and B columns out of the local buffer.
    let local_bytes =
        bf * (a_bytes * n.div_ceil(cols) as f64 + b_bytes * m.div_ceil(rows) as f64 + c_bytes);
    let macs = bf * mf * nf * kf;
    let e = &arch.energy;
    let energy_j = macs * e.mac_j
        + local_bytes * e.local_byte_j
        + glb_bytes * e.glb_byte_j
        + hbm_bytes * e.hbm_byte_j;

    GemmCost {
        latency_s: busy_s + eff.gemm_overhead_s,
        energy_j,
        bound,
        tile,
        decomposition,
        cores_used: u32::try_from(cores_used).unwrap_or(u32::MAX),
        waves,
        compute_cycles,
        compute_s,
        glb_s,
        hbm_s,
        macs,
        local_bytes,
        glb_bytes,
        hbm_bytes,
    }
}

/// The output block (in tiles, rows × cols) that shares operands in the GLB, chosen to
/// minimise HBM re-reads. For each block height, the width is the larger of: the rest of a
/// wave (tiles in flight together stream K in lockstep, so their panels pass through the
/// GLB once), and what fits when the block's whole K panels stay resident.
fn glb_block(
    arch: &ArchConfig,
    tile: GemmTile,
    dims: (u64, u64, u64),
    eb: f64,
    wave_tiles: u64,
) -> (u64, u64) {
    let tiles_m = dims.0.div_ceil(tile.m);
    // Block widths only shrink as blocks grow taller, so among the heights with the same
    // number of block rows (`ceil(tiles_m / block_rows)`) the shortest re-reads least and wins
    // ties by coming first: trying only those (O(√tiles_m) of them) picks the same block.
    let heights = std::iter::successors(Some(1), |&block_rows| {
        let row_blocks = tiles_m.div_ceil(block_rows);
        (row_blocks > 1).then(|| tiles_m.div_ceil(row_blocks - 1))
    });
    best_block(arch, tile, dims, eb, wave_tiles, heights)
}

/// The block of least HBM re-reads among the block heights `heights` (ascending; the first
/// wins ties).
fn best_block(
    arch: &ArchConfig,
    tile: GemmTile,
    (m, n, k): (u64, u64, u64),
    eb: f64,
    wave_tiles: u64,
    heights: impl Iterator<Item = u64>,
) -> (u64, u64) {
    let tiles_m = m.div_ceil(tile.m);
    let tiles_n = n.div_ceil(tile.n);
    let panel_bytes = |tiles: u64, edge: u64| (tiles * edge) as f64 * k as f64 * eb;
    let mut best = (1, 1);
    let mut best_rereads = f64::INFINITY;
    for block_rows in heights {
        let wave_cols = (wave_tiles / block_rows).min(tiles_n);
        let free_bytes = arch.glb.bytes as f64 - panel_bytes(block_rows, tile.m);
        let resident_cols = if free_bytes > 0.0 {
            ((free_bytes / panel_bytes(1, tile.n)).floor() as u64).min(tiles_n)
        } else {
            0
        };
        let block_cols = wave_cols.max(resident_cols);
        if block_cols == 0 {
            continue;
        }
        // HBM bytes over K·elem_bytes: A (m rows) is read once per block column, B (n
        // columns) once per block row.
        let rereads = (tiles_n.div_ceil(block_cols) * m + tiles_m.div_ceil(block_rows) * n) as f64;
        if rereads < best_rereads {
            best_rereads = rereads;
            best = (block_rows, block_cols);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::{best_block, glb_block, GemmTile};
    use crate::arch::ArchConfig;

    #[test]
    fn glb_block_matches_trying_every_height() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("arch_specs/phaze-tpuv4-template.toml");
        let text = std::fs::read_to_string(&path).expect("chip file");
        let mut arch: ArchConfig = crate::error::parse_toml(&path, &text).expect("chip parses");
        let mut checked = 0;
        for glb_bytes in [1 << 16, 1 << 21, 1 << 27] {
            arch.glb.bytes = glb_bytes;
            for edge in [2, 16, 128] {
                for (m, n, k) in [
                    (1, 1, 1),
                    (300, 70, 64),
                    (2048, 12288, 4096),
                    (16384, 3, 96),
                ] {
                    for wave_tiles in [1, 3, 8, 64, 4096] {
                        let tile = GemmTile {
                            m: edge,
                            n: edge * 2,
                            k_step: k.min(edge),
                        };
                        let every_height = 1..=u64::div_ceil(m, tile.m);
                        assert_eq!(
                            glb_block(&arch, tile, (m, n, k), 2.0, wave_tiles),
                            best_block(&arch, tile, (m, n, k), 2.0, wave_tiles, every_height),
                            "glb {glb_bytes}, edge {edge}, {m}x{n}x{k}, wave {wave_tiles}"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 180);
    }
}
