//! Fits a chip's efficiency parameters to measured kernel latencies (docs/design.md §4, §8).
//!
//! The parameters are few and physical: the achieved fraction of peak tensor throughput,
//! the achieved fraction of HBM bandwidth, the fixed GEMM overhead, per measured vector
//! primitive a fixed overhead and its own achieved fraction of HBM bandwidth, and, from
//! measured collectives, the achieved fraction of link bandwidth (NCCL's bus bandwidth). The
//! objective is the mean relative latency error per kernel class (GEMM, each vector primitive,
//! collectives), averaged over classes so a large sweep of one kernel does not drown the
//! others. It is minimised by deterministic coordinate descent on shrinking grids (the model
//! has max() kinks, so no gradients), in two stages: first the shared parameters with every
//! class (so the shared bandwidth is what kernels achieve in general, the value unmeasured
//! primitives use), then each measured primitive's bandwidth and overhead with the shared
//! ones held. A primitive's measured backward kernels are a class of their own and get their
//! own bandwidth (they are often another implementation); its overhead is shared by both.
//! Last, a class measured at several row lengths gets a bandwidth per row length (a
//! [`RowBandwidth`] table, interpolated in between), since row-wise kernels change
//! implementation with the row: PyTorch's softmax streams 2048-long rows at 0.76 of the H100's
//! HBM bandwidth and 8192-long ones at 0.46. Primitives timed only inside training passes
//! (a profiled block's bias gradients, residual adds, QKV-gradient stack) get their own
//! bandwidth and overhead from those kernels by [`fit_in_pass`], with the rest held.

use super::{attention_cost, collective_cost, gemm_cost, vector_cost};
use crate::arch::{ArchConfig, Efficiency, RowBandwidth};
use crate::workload::{OpKind, Pass, VectorOp};
use std::collections::BTreeMap;

/// Search ranges: fractions of peak (PyTorch's embedding backward, a sort and a segmented
/// scatter, moves its rows at 0.06 of the H200's HBM bandwidth), and overheads up to 200 µs.
const FRACTION_RANGE: (f64, f64) = (0.05, 1.0);
const OVERHEAD_RANGE_S: (f64, f64) = (0.0, 200e-6);
/// A fused attention tile's fixed work, in score elements per query row: up to eight tiles of
/// 128 keys.
const ROW_OVERHEAD_RANGE: (f64, f64) = (0.0, 1024.0);
/// Grid points per coordinate and rounds of grid shrinking (by 4× per round).
const GRID_POINTS: usize = 21;
const ROUNDS: usize = 5;
/// Distinct row lengths a class needs for a bandwidth per row length (and fused attention
/// kernels for their tile's work per query row).
const MIN_ROW_LENGTHS: usize = 3;

/// One measured kernel: a GEMM or vector operator run on all cores of the chip, or a
/// collective across its group of devices; or a forward kernel timed with its backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelSample {
    pub kind: OpKind,
    pub elem_bytes: u32,
    pub measured_s: f64,
    /// Timed together with the backward of the same shape (`kind` is the forward):
    /// FlashAttention's published benchmarks time the forward and backward as one.
    pub with_backward: bool,
}

/// The backward of a fused attention kernel's forward, of the same shape; `None` for any other
/// operator (no other is timed with its backward).
fn backward_of(kind: OpKind) -> Option<OpKind> {
    match kind {
        OpKind::Attention {
            shape,
            pass: Pass::Forward,
        } => Some(OpKind::Attention {
            shape,
            pass: Pass::Backward,
        }),
        _ => None,
    }
}

/// The model's latency and energy for `sample` on all cores of `arch` (with its backward's
/// where it was timed with it): `(latency_s, energy_j)`; `None` for a collective, which runs
/// on several devices, or a backward the operator does not have.
pub fn on_all_cores(arch: &ArchConfig, sample: &KernelSample) -> Option<(f64, f64)> {
    let forward = one_on_all_cores(arch, sample.kind, sample.elem_bytes)?;
    if !sample.with_backward {
        return Some(forward);
    }
    let backward = one_on_all_cores(arch, backward_of(sample.kind)?, sample.elem_bytes)?;
    Some((forward.0 + backward.0, forward.1 + backward.1))
}

fn one_on_all_cores(arch: &ArchConfig, kind: OpKind, elem_bytes: u32) -> Option<(f64, f64)> {
    match kind {
        OpKind::Gemm { batch, m, n, k } => {
            let c = gemm_cost(arch, batch, m, n, k, elem_bytes, arch.tensor.count);
            Some((c.latency_s, c.energy_j))
        }
        OpKind::Vector {
            op,
            elements,
            row_len,
            pass,
        } => {
            let cores = arch.vector.count;
            let c = vector_cost(arch, op, pass, elements, row_len, elem_bytes, cores);
            Some((c.latency_s, c.energy_j))
        }
        OpKind::Attention { shape, pass } => {
            let c = attention_cost(arch, shape, pass, elem_bytes, arch.tensor.count);
            Some((c.latency_s, c.energy_j))
        }
        OpKind::Collective { .. } => None,
    }
}

/// The model's latency for `sample` on all cores of `arch` (a collective across its group).
pub fn predicted_latency_s(arch: &ArchConfig, sample: &KernelSample) -> f64 {
    match sample.kind {
        OpKind::Collective {
            collective,
            bytes,
            group,
        } => collective_cost(arch, collective, bytes, group).latency_s,
        _ => on_all_cores(arch, sample).map_or(0.0, |(latency_s, _)| latency_s),
    }
}

/// What a kernel's error is averaged with in the fit's objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelClass {
    Gemm,
    /// A vector primitive's forward or backward kernels.
    Vector(VectorOp, Pass),
    /// All-reduces and all-gathers: they share the links.
    Collective,
    /// Fused attention kernels.
    Attention,
}

impl KernelClass {
    pub fn of(kind: &OpKind) -> KernelClass {
        match *kind {
            OpKind::Gemm { .. } => KernelClass::Gemm,
            OpKind::Vector { op, pass, .. } => KernelClass::Vector(op, pass),
            OpKind::Collective { .. } => KernelClass::Collective,
            OpKind::Attention { .. } => KernelClass::Attention,
        }
    }
}

/// Mean relative latency error per kernel class, in a deterministic order.
pub fn class_errors(arch: &ArchConfig, samples: &[KernelSample]) -> BTreeMap<KernelClass, f64> {
    let mut sums: BTreeMap<KernelClass, (f64, usize)> = BTreeMap::new();
    for s in samples {
        let predicted_s = predicted_latency_s(arch, s);
        let class = KernelClass::of(&s.kind);
        let entry = sums.entry(class).or_insert((0.0, 0));
        entry.0 += (predicted_s - s.measured_s).abs() / s.measured_s;
        entry.1 += 1;
    }
    sums.into_iter()
        .map(|(class, (sum, count))| (class, sum / count as f64))
        .collect()
}

fn objective(arch: &ArchConfig, samples: &[KernelSample]) -> f64 {
    let errors = class_errors(arch, samples);
    if errors.is_empty() {
        return 0.0;
    }
    errors.values().sum::<f64>() / errors.len() as f64
}

#[derive(Debug, Clone, Copy)]
enum Param {
    TensorCompute,
    AttentionCompute,
    AttentionRowOverhead,
    AttentionBackwardCompute,
    AttentionBackwardRowOverhead,
    HbmBandwidth,
    GemmOverhead,
    VectorOverhead(VectorOp),
    VectorBackwardOverhead(VectorOp),
    VectorBandwidth(VectorOp),
    VectorBackwardBandwidth(VectorOp),
    /// The fraction at one row length of one of `row_hbm_bandwidth`'s tables.
    RowBandwidth {
        table: usize,
        row: usize,
    },
    LinkBandwidth,
}

impl Param {
    fn range(self) -> (f64, f64) {
        match self {
            Param::TensorCompute
            | Param::AttentionCompute
            | Param::AttentionBackwardCompute
            | Param::HbmBandwidth
            | Param::VectorBandwidth(_)
            | Param::VectorBackwardBandwidth(_)
            | Param::RowBandwidth { .. }
            | Param::LinkBandwidth => FRACTION_RANGE,
            Param::GemmOverhead | Param::VectorOverhead(_) | Param::VectorBackwardOverhead(_) => {
                OVERHEAD_RANGE_S
            }
            Param::AttentionRowOverhead | Param::AttentionBackwardRowOverhead => ROW_OVERHEAD_RANGE,
        }
    }

    fn get(self, eff: &Efficiency) -> f64 {
        match self {
            Param::TensorCompute => eff.tensor_compute,
            Param::AttentionCompute => eff.attention_compute(),
            Param::AttentionRowOverhead => eff.attention_row_overhead(),
            Param::AttentionBackwardCompute => eff.attention_compute_for(Pass::Backward),
            Param::AttentionBackwardRowOverhead => eff.attention_row_overhead_for(Pass::Backward),
            Param::HbmBandwidth => eff.hbm_bandwidth,
            Param::GemmOverhead => eff.gemm_overhead_s,
            Param::VectorOverhead(op) => eff.vector_overhead_for(op, Pass::Forward),
            Param::VectorBackwardOverhead(op) => eff.vector_overhead_for(op, Pass::Backward),
            Param::VectorBandwidth(op) => eff.hbm_bandwidth_for(op, Pass::Forward),
            Param::VectorBackwardBandwidth(op) => eff.hbm_bandwidth_for(op, Pass::Backward),
            Param::RowBandwidth { table, row } => eff.row_hbm_bandwidth[table].hbm_bandwidth[row],
            Param::LinkBandwidth => eff.link_bandwidth,
        }
    }

    fn set(self, eff: &mut Efficiency, value: f64) {
        match self {
            Param::TensorCompute => eff.tensor_compute = value,
            Param::AttentionCompute => eff.attention_compute = Some(value),
            Param::AttentionRowOverhead => eff.attention_row_overhead = Some(value),
            Param::AttentionBackwardCompute => eff.attention_backward_compute = Some(value),
            Param::AttentionBackwardRowOverhead => {
                eff.attention_backward_row_overhead = Some(value)
            }
            Param::HbmBandwidth => eff.hbm_bandwidth = value,
            Param::GemmOverhead => eff.gemm_overhead_s = value,
            Param::VectorOverhead(op) => eff.vector_op_overhead_s.set(op, Some(value)),
            Param::VectorBackwardOverhead(op) => {
                eff.vector_op_backward_overhead_s.set(op, Some(value))
            }
            Param::VectorBandwidth(op) => eff.vector_op_hbm_bandwidth.set(op, Some(value)),
            Param::VectorBackwardBandwidth(op) => {
                eff.vector_op_backward_hbm_bandwidth.set(op, Some(value))
            }
            Param::RowBandwidth { table, row } => {
                eff.row_hbm_bandwidth[table].hbm_bandwidth[row] = value
            }
            Param::LinkBandwidth => eff.link_bandwidth = value,
        }
    }
}

/// Efficiency parameters of `arch` fitted to `samples`. Parameters without samples to
/// inform them (tensor terms without GEMMs, vector compute, links without collectives) keep
/// `arch`'s values. Fused attention kernels, which the shared parameters do not see, get their
/// own tensor-core fraction and tile work per query row ([`fit_attention`]) after them, the
/// backward's own pair where forward kernels were timed alone beside kernels that include it.
/// The default `vector_overhead_s` becomes the smallest fitted per-primitive overhead (the
/// leanest measured kernel: the best guess for unmeasured ones), and only primitives that
/// differ from it keep an override; each measured primitive keeps its own bandwidth, and its
/// measured backward kernels theirs where it differs, and each class measured at
/// `MIN_ROW_LENGTHS` or more row lengths a bandwidth per row length.
pub fn fit_efficiency(arch: &ArchConfig, samples: &[KernelSample]) -> Efficiency {
    let has = |class: KernelClass| samples.iter().any(|s| KernelClass::of(&s.kind) == class);
    let has_gemm = has(KernelClass::Gemm);
    let measured = |pass: Pass| {
        let mut ops: Vec<VectorOp> = samples
            .iter()
            .filter_map(|s| match s.kind {
                OpKind::Vector { op, pass: p, .. } if p == pass => Some(op),
                _ => None,
            })
            .collect();
        ops.sort();
        ops.dedup();
        ops
    };
    let (forward_ops, backward_ops) = (measured(Pass::Forward), measured(Pass::Backward));
    let mut vector_ops = [forward_ops.clone(), backward_ops.clone()].concat();
    vector_ops.sort();
    vector_ops.dedup();

    let mut params = Vec::new();
    if has_gemm {
        params.extend([Param::TensorCompute, Param::GemmOverhead]);
    }
    if has_gemm || !vector_ops.is_empty() {
        params.push(Param::HbmBandwidth);
    }
    params.extend(vector_ops.iter().map(|&op| Param::VectorOverhead(op)));
    if has(KernelClass::Collective) {
        params.push(Param::LinkBandwidth);
    }

    let mut trial = arch.clone();
    trial.efficiency.row_hbm_bandwidth.clear();
    for &op in &vector_ops {
        trial.efficiency.vector_op_hbm_bandwidth.set(op, None);
        trial
            .efficiency
            .vector_op_backward_hbm_bandwidth
            .set(op, None);
        trial.efficiency.vector_op_backward_overhead_s.set(op, None);
    }
    // The shared parameters from the other kernels alone: a fused attention kernel's errors
    // are its own parameters' to settle.
    let (attention, others): (Vec<KernelSample>, Vec<KernelSample>) = samples
        .iter()
        .partition(|s| KernelClass::of(&s.kind) == KernelClass::Attention);
    descend(&mut trial, &others, &params);
    if !attention.is_empty() {
        // The forward's parameters from forward kernels timed alone, where there are some
        // beside kernels that include a backward, and the backward's from those with the
        // forward's held; otherwise one set for both passes.
        let (forward, backward): (Vec<KernelSample>, Vec<KernelSample>) =
            attention.iter().partition(|s| {
                !s.with_backward
                    && matches!(
                        s.kind,
                        OpKind::Attention {
                            pass: Pass::Forward,
                            ..
                        }
                    )
            });
        if forward.is_empty() || backward.is_empty() {
            fit_attention(&mut trial, &attention, Pass::Forward);
        } else {
            fit_attention(&mut trial, &forward, Pass::Forward);
            fit_attention(&mut trial, &backward, Pass::Backward);
        }
    }
    let own: Vec<Param> = vector_ops
        .iter()
        .flat_map(|&op| {
            let forward = forward_ops
                .contains(&op)
                .then_some(Param::VectorBandwidth(op));
            let backward = backward_ops
                .contains(&op)
                .then_some(Param::VectorBackwardBandwidth(op));
            let backward_overhead = (forward.is_some() && backward.is_some())
                .then_some(Param::VectorBackwardOverhead(op));
            [
                forward,
                backward,
                Some(Param::VectorOverhead(op)),
                backward_overhead,
            ]
        })
        .flatten()
        .collect();
    descend(&mut trial, samples, &own);
    // Each table with its primitive's overhead, which one bandwidth over rows of several
    // lengths had to compromise with.
    trial.efficiency.row_hbm_bandwidth = row_tables(&trial.efficiency, samples);
    // A pass's own overhead where both passes were measured.
    let overhead_of = |op: VectorOp, pass: Pass| match pass {
        Pass::Backward if forward_ops.contains(&op) && backward_ops.contains(&op) => {
            Param::VectorBackwardOverhead(op)
        }
        _ => Param::VectorOverhead(op),
    };
    let rows: Vec<Param> = trial
        .efficiency
        .row_hbm_bandwidth
        .iter()
        .enumerate()
        .flat_map(|(table, t)| {
            (0..t.row_len.len())
                .map(move |row| Param::RowBandwidth { table, row })
                .chain([overhead_of(t.op, t.pass)])
        })
        .collect();
    descend(&mut trial, samples, &rows);

    let mut eff = trial.efficiency;
    let fitted: Vec<(VectorOp, f64)> = vector_ops
        .iter()
        .map(|&op| (op, eff.vector_overhead_for(op, Pass::Forward)))
        .collect();
    if let Some(default_s) = fitted.iter().map(|&(_, s)| s).reduce(f64::min) {
        eff.vector_overhead_s = default_s;
        for (op, s) in fitted {
            eff.vector_op_overhead_s
                .set(op, (s != default_s).then_some(s));
        }
    }
    for &op in &forward_ops {
        let bandwidth = eff.hbm_bandwidth_for(op, Pass::Forward);
        eff.vector_op_hbm_bandwidth
            .set(op, (bandwidth != eff.hbm_bandwidth).then_some(bandwidth));
    }
    for &op in &backward_ops {
        let backward_s = eff.vector_overhead_for(op, Pass::Backward);
        let forward_s = eff.vector_overhead_for(op, Pass::Forward);
        eff.vector_op_backward_overhead_s
            .set(op, (backward_s != forward_s).then_some(backward_s));
        let backward = eff.hbm_bandwidth_for(op, Pass::Backward);
        let forward = eff.hbm_bandwidth_for(op, Pass::Forward);
        eff.vector_op_backward_hbm_bandwidth
            .set(op, (backward != forward).then_some(backward));
    }
    eff
}

/// `arch`'s efficiency with each vector primitive and pass among `samples` (kernels timed
/// inside training passes) given its own HBM bandwidth and fixed overhead for that pass,
/// fitted to them with every other parameter held: what the primitive achieves amid a
/// pass's other kernels.
pub fn fit_in_pass(arch: &ArchConfig, samples: &[KernelSample]) -> Efficiency {
    let mut classes: Vec<(VectorOp, Pass)> = samples
        .iter()
        .filter_map(|s| match s.kind {
            OpKind::Vector { op, pass, .. } => Some((op, pass)),
            _ => None,
        })
        .collect();
    classes.sort();
    classes.dedup();
    let params: Vec<Param> = classes
        .iter()
        .flat_map(|&(op, pass)| match pass {
            Pass::Forward => [Param::VectorBandwidth(op), Param::VectorOverhead(op)],
            Pass::Backward => [
                Param::VectorBackwardBandwidth(op),
                Param::VectorBackwardOverhead(op),
            ],
        })
        .collect();
    let mut trial = arch.clone();
    descend(&mut trial, samples, &params);
    trial.efficiency
}

/// A table per vector class measured at `MIN_ROW_LENGTHS` or more row lengths, at those
/// lengths, starting from the class's single fitted value; in `VectorOp`, then pass, order.
fn row_tables(eff: &Efficiency, samples: &[KernelSample]) -> Vec<RowBandwidth> {
    let mut lengths: BTreeMap<(VectorOp, Pass), Vec<u64>> = BTreeMap::new();
    for s in samples {
        if let OpKind::Vector {
            op, pass, row_len, ..
        } = s.kind
        {
            lengths.entry((op, pass)).or_default().push(row_len);
        }
    }
    lengths
        .into_iter()
        .filter_map(|((op, pass), mut row_len)| {
            row_len.sort_unstable();
            row_len.dedup();
            (row_len.len() >= MIN_ROW_LENGTHS).then(|| RowBandwidth {
                op,
                pass,
                hbm_bandwidth: vec![eff.hbm_bandwidth_for(op, pass); row_len.len()],
                row_len,
            })
        })
        .collect()
}

/// The fused attention fraction and tile work per query row of `pass` (the forward's: of
/// both passes unless the backward's are fitted next) fitted to `samples`: the work per row
/// only where sequence lengths differ enough to tell it from the fraction; the two trade off,
/// so the fraction is refitted at every trial work per row.
fn fit_attention(trial: &mut ArchConfig, samples: &[KernelSample], pass: Pass) {
    let (row_overhead, compute) = match pass {
        Pass::Forward => (Param::AttentionRowOverhead, Param::AttentionCompute),
        Pass::Backward => (
            Param::AttentionBackwardRowOverhead,
            Param::AttentionBackwardCompute,
        ),
    };
    let mut seq_lens: Vec<u64> = samples
        .iter()
        .filter_map(|s| match s.kind {
            OpKind::Attention { shape, .. } => Some(shape.seq_len),
            _ => None,
        })
        .collect();
    seq_lens.sort_unstable();
    seq_lens.dedup();
    if seq_lens.len() >= MIN_ROW_LENGTHS {
        descend_nested(trial, samples, row_overhead, compute);
    } else {
        descend(trial, samples, &[compute]);
    }
}

/// `outer` on shrinking grids as [`descend`] does, with `inner` refitted over its whole range
/// at every trial value: for two parameters that trade off, which coordinate descent would
/// leave in a valley.
fn descend_nested(trial: &mut ArchConfig, samples: &[KernelSample], outer: Param, inner: Param) {
    let (lo, hi) = outer.range();
    let (inner_lo, inner_hi) = inner.range();
    let mut best: Option<(f64, ArchConfig)> = None;
    let mut centre = outer.get(&trial.efficiency).clamp(lo, hi);
    for round in 0..ROUNDS {
        let width = (hi - lo) / 4f64.powi(round as i32);
        let start = (centre - width / 2.0).max(lo);
        let end = (centre + width / 2.0).min(hi);
        for i in 0..GRID_POINTS {
            let mut candidate = trial.clone();
            outer.set(
                &mut candidate.efficiency,
                start + (end - start) * i as f64 / (GRID_POINTS - 1) as f64,
            );
            inner.set(&mut candidate.efficiency, 0.5 * (inner_lo + inner_hi));
            descend(&mut candidate, samples, &[inner]);
            let obj = objective(&candidate, samples);
            if best.as_ref().is_none_or(|(b, _)| obj < *b) {
                best = Some((obj, candidate));
            }
        }
        if let Some((_, b)) = &best {
            centre = outer.get(&b.efficiency);
        }
    }
    if let Some((_, b)) = best {
        *trial = b;
    }
}

/// Coordinate descent of `params` of `trial` on shrinking grids, each started inside its
/// range.
fn descend(trial: &mut ArchConfig, samples: &[KernelSample], params: &[Param]) {
    for p in params {
        let (lo, hi) = p.range();
        let v = p.get(&trial.efficiency).clamp(lo, hi);
        p.set(&mut trial.efficiency, v);
    }
    let mut best_obj = objective(trial, samples);
    for round in 0..ROUNDS {
        for &p in params {
            let (lo, hi) = p.range();
            let width = (hi - lo) / 4f64.powi(round as i32);
            let centre = p.get(&trial.efficiency);
            let start = (centre - width / 2.0).max(lo);
            let end = (centre + width / 2.0).min(hi);
            let mut best_v = centre;
            for i in 0..GRID_POINTS {
                let v = start + (end - start) * i as f64 / (GRID_POINTS - 1) as f64;
                p.set(&mut trial.efficiency, v);
                let obj = objective(trial, samples);
                if obj < best_obj {
                    best_obj = obj;
                    best_v = v;
                }
            }
            p.set(&mut trial.efficiency, best_v);
        }
    }
}
