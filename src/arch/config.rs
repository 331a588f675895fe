//! The accelerator template (docs/design.md §3, docs/arch.md): tensor cores, vector cores,
//! on-chip buffers, HBM, clock and interconnect tiers. Real chips and searched configurations
//! share this type.

use crate::vocab::{Pass, VectorOp};
use serde::{Deserialize, Serialize};

/// `count` systolic arrays of `rows × cols` MACs, each with its own local buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorCores {
    pub count: u32,
    pub rows: u32,
    pub cols: u32,
    pub local_buffer_bytes: u64,
    /// The GEMM library may split K across cores to fill a partly filled last wave of
    /// tiles (Stream-K: CUTLASS 3, cuBLAS on Hopper); partial sums meet in the global buffer.
    /// Off by default: each tile runs whole on one core, in waves.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream_k: bool,
}

/// `count` SIMD vector cores of `lanes` lanes, each with its own local buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorCores {
    pub count: u32,
    pub lanes: u32,
    pub local_buffer_bytes: u64,
}

/// Global buffer shared by all cores (TPU CMEM, GPU L2).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalBuffer {
    pub bytes: u64,
    /// Aggregate bandwidth from the global buffer to the cores' local buffers.
    pub bandwidth_bytes_per_s: f64,
}

/// Off-chip memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hbm {
    pub capacity_bytes: u64,
    pub bandwidth_bytes_per_s: f64,
}

/// One level of the interconnect. Tiers are ordered fastest first; `devices` is how many
/// devices one group at this tier spans (e.g. 8 GPUs per NVSwitch node), and the last tier
/// spans the whole cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    pub name: String,
    pub devices: u32,
    /// Per-device bandwidth in one direction: every device has links of its own at this tier
    /// (a DGX A100's eight GPUs have eight InfiniBand NICs).
    pub bandwidth_bytes_per_s: f64,
    pub latency_s: f64,
}

/// Where interconnect tiers are not listed fastest first — each spanning strictly more devices
/// than the one inside it, a whole number of its domains (NVLink nodes within a rail group,
/// pods within the data-centre network), with no more bandwidth and no less latency — the
/// first offending tier's index, the field that breaks the rule and why. A cluster may still
/// fill its outermost domains partly (6144 TPU v4 chips are 1.5 pods of 4096). One rule for
/// chip files, search spaces and `costs.json`.
pub fn tier_order_error(tiers: &[Tier]) -> Option<(usize, &'static str, String)> {
    tiers.windows(2).enumerate().find_map(|(i, pair)| {
        let (inner, tier) = (&pair[0], &pair[1]);
        let (field, reason) = if tier.devices <= inner.devices {
            (
                "devices",
                format!(
                    "spans {} devices, not more than the {} of `{}` inside it",
                    tier.devices, inner.devices, inner.name
                ),
            )
        } else if !tier.devices.is_multiple_of(inner.devices) {
            (
                "devices",
                format!(
                    "spans {} devices, not a whole number of the {}-device domains of `{}` \
                     inside it",
                    tier.devices, inner.devices, inner.name
                ),
            )
        } else if tier.bandwidth_bytes_per_s > inner.bandwidth_bytes_per_s {
            (
                "bandwidth_bytes_per_s",
                format!(
                    "{} B/s is faster than the {} B/s of `{}` inside it",
                    tier.bandwidth_bytes_per_s, inner.bandwidth_bytes_per_s, inner.name
                ),
            )
        } else if tier.latency_s < inner.latency_s {
            (
                "latency_s",
                format!(
                    "{} s is less latency than the {} s of `{}` inside it",
                    tier.latency_s, inner.latency_s, inner.name
                ),
            )
        } else {
            return None;
        };
        Some((
            i + 1,
            field,
            format!(
                "tiers must be listed fastest first (strictly increasing `devices`, no more \
                 bandwidth, no less latency): tier `{}` {reason}",
                tier.name
            ),
        ))
    })
}

/// The tier a collective group communicates over, and the bus bandwidth it achieves there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupLink<'a> {
    pub tier: &'a Tier,
    /// What each member moves its share of a ring collective at.
    pub bandwidth_bytes_per_s: f64,
}

/// How a group whose members span `span` consecutive devices communicates: over the first tier
/// spanning them (the last tier when none does). A group that leaves the domains of the tier
/// below with several members in each runs one ring per member's own outer link, as NCCL does
/// over a node's NICs (multi-rail), so it moves as many links' worth across domains as the
/// sparsest domain has members (`fewest_in(domain devices)`, see [`fewest_in_domain`]), bounded
/// by the tier below, which carries every ring between a domain's members. `None` when there
/// are no tiers.
pub fn group_link(
    tiers: &[Tier],
    span: u32,
    fewest_in: impl Fn(u32) -> u32,
) -> Option<GroupLink<'_>> {
    let outer = tiers
        .iter()
        .position(|tier| tier.devices >= span)
        .unwrap_or(tiers.len().checked_sub(1)?);
    let tier = &tiers[outer];
    let bandwidth_bytes_per_s = match outer.checked_sub(1).map(|inner| &tiers[inner]) {
        Some(inner) => {
            let rails = fewest_in(inner.devices).clamp(1, inner.devices);
            (f64::from(rails) * tier.bandwidth_bytes_per_s)
                .min(inner.bandwidth_bytes_per_s)
                .max(tier.bandwidth_bytes_per_s)
        }
        None => tier.bandwidth_bytes_per_s,
    };
    Some(GroupLink {
        tier,
        bandwidth_bytes_per_s,
    })
}

/// The fewest of `count` members, placed `stride` devices apart from a domain boundary, that
/// any domain of `domain` devices holding one of them holds. 1 when the stride neither spans
/// nor divides the domain (some domain may then hold a single member).
pub fn fewest_in_domain(count: u32, stride: u32, domain: u32) -> u32 {
    if stride == 0 || stride >= domain || !domain.is_multiple_of(stride) {
        return 1;
    }
    let per_domain = domain / stride;
    match count % per_domain {
        _ if count <= per_domain => count.max(1),
        0 => per_domain,
        rest => rest,
    }
}

/// Achievable fractions of peak and fixed overheads, fitted by `calibrate` from measured
/// kernels (docs/design.md §4). The defaults describe an ideal machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Efficiency {
    /// Fraction of peak tensor-core throughput a well-shaped GEMM achieves.
    pub tensor_compute: f64,
    /// Fraction of peak tensor-core throughput a fused attention kernel's products achieve
    /// (`OpKind::Attention`); unset, the GEMMs' `tensor_compute`
    /// ([`Efficiency::attention_compute`]). Fitted by `calibrate` from collect.py's
    /// `attention_flash` rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_compute: Option<f64>,
    /// Score elements a fused attention kernel spends per query row beyond the keys the row
    /// sees, in each pass: its tile's fixed work (loading the query tile, rescaling and writing
    /// the output and its log-sum-exp), which short sequences amortise worst
    /// ([`Efficiency::attention_row_overhead`]); unset, none. Fitted by `calibrate` with
    /// `attention_compute` from fused kernels timed at several sequence lengths.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_row_overhead: Option<f64>,
    /// The fused attention backward's own fraction of peak and work per query row, where its
    /// kernels were timed apart from the forward's (FlashAttention-2's backward runs below
    /// its forward's rate); unset, the forward's values
    /// ([`Efficiency::attention_compute_for`], [`Efficiency::attention_row_overhead_for`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_backward_compute: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_backward_row_overhead: Option<f64>,
    /// Fraction of peak vector throughput achieved.
    pub vector_compute: f64,
    /// Fraction of peak HBM bandwidth achieved by streaming kernels.
    pub hbm_bandwidth: f64,
    /// Fixed time added to every GEMM (kernel launch, prologue/epilogue).
    pub gemm_overhead_s: f64,
    /// Fixed time added to every vector kernel (a primitive that PyTorch runs as several pays
    /// it for each: `VectorOp::kernels`).
    pub vector_overhead_s: f64,
    /// Per-primitive overrides of `vector_overhead_s` (kernels differ in launch and
    /// prologue work); unset primitives use `vector_overhead_s`.
    pub vector_op_overhead_s: PerVectorOp,
    /// Per-primitive overrides of the overhead for backward kernels (another kernel, often
    /// with less set-up: dropout's backward draws no random numbers); unset primitives use
    /// their forward value.
    #[serde(skip_serializing_if = "PerVectorOp::is_empty")]
    pub vector_op_backward_overhead_s: PerVectorOp,
    /// Per-primitive overrides of `hbm_bandwidth` for vector kernels (implementations
    /// stream at different rates: a softmax that holds its row in registers runs at lower
    /// occupancy than an element-wise kernel); unset primitives use `hbm_bandwidth`.
    pub vector_op_hbm_bandwidth: PerVectorOp,
    /// Per-primitive overrides for backward kernels, which are often other implementations
    /// (PyTorch's softmax backward is a full-size multiply and then a row reduction; dropout's
    /// backward draws no random numbers); unset primitives use their forward value.
    #[serde(skip_serializing_if = "PerVectorOp::is_empty")]
    pub vector_op_backward_hbm_bandwidth: PerVectorOp,
    /// Per-primitive fractions of HBM bandwidth by row length, for row-wise kernels whose
    /// implementation changes with the row (PyTorch's softmax keeps rows of up to 2048
    /// elements in registers and reads longer ones more than once). They override the
    /// primitive's single value in their pass.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub row_hbm_bandwidth: Vec<RowBandwidth>,
    /// Fraction of link bandwidth collectives achieve.
    pub link_bandwidth: f64,
    /// The clock tensor-core work holds through a training run, relative to the clock of the
    /// single kernels the other fractions were fitted to: below 1 where the board's power
    /// limit pulls a training run's clock below theirs (the A100's kernels were timed near the
    /// boost clock), above 1 where they ran under the limit harder than training does
    /// (collect.py's back-to-back GEMM replays on random operands; `calibrate` fits it to the
    /// GEMM kernels of profiled block passes). Times `tensor_compute`, at most 1. Applied to
    /// training, not to the single kernels `calibrate` fits: see
    /// [`ArchConfig::timed_in_isolation`].
    #[serde(skip_serializing_if = "is_one")]
    pub sustained_clock: f64,
    /// The rate vector kernels hold through a training run, relative to the single kernels
    /// their fractions were fitted to (a kernel's time divides by it): below 1 where the
    /// board's power limit, which the GEMMs around them reach, pulls the clock of kernels
    /// with arithmetic per element below a lone replay's. `calibrate` fits it to the vector
    /// kernels of profiled block passes, all together; primitives with a rate of their own in
    /// `vector_op_sustained_rate` (forward) or `vector_op_backward_sustained_rate` use that.
    /// Applied to training, not to the single kernels `calibrate` fits.
    #[serde(skip_serializing_if = "is_one")]
    pub vector_sustained_rate: f64,
    /// Per-primitive rates of forward kernels in a training run (see `vector_sustained_rate`):
    /// fitted to the primitive's kernels in the profiled block passes.
    #[serde(skip_serializing_if = "PerVectorOp::is_empty")]
    pub vector_op_sustained_rate: PerVectorOp,
    /// Per-primitive rates of backward kernels in a training run: another kernel than the
    /// forward's, so an unset primitive uses `vector_sustained_rate`, not its forward rate.
    #[serde(skip_serializing_if = "PerVectorOp::is_empty")]
    pub vector_op_backward_sustained_rate: PerVectorOp,
    /// Fraction of an overlapped collective that the computation beside it hides, up to the
    /// computation's length (1: all of it): the data-parallel gradient all-reduce during the
    /// last backward pass, and on a serial chip each asynchronous collective of a layer's
    /// passes (`Schedule::async_overlap_s`). Below 1 where the collective's kernels take SMs
    /// and HBM bandwidth from the computation's. Fitted by `calibrate` from collect.py's
    /// overlap rows (two or more GPUs).
    #[serde(skip_serializing_if = "is_one")]
    pub comm_overlap: f64,
    /// GPU time between two kernels that the host launches one at a time (eager PyTorch, as
    /// training runs), beyond what a replay of the same kernels from a CUDA graph leaves
    /// between them (the replays the other fractions and overheads are fitted to). Fitted by
    /// `calibrate` from kernels timed both ways (collect.py `--eager` rows beside graph rows).
    #[serde(skip_serializing_if = "is_zero")]
    pub launch_gap_s: f64,
    /// The host's time to dispatch one eager kernel (framework dispatch and the launch call):
    /// a pass whose kernels are on average shorter leaves the GPU waiting for the host.
    /// Fitted by `calibrate` from the same rows (kernels that ran faster than the host
    /// launched them).
    #[serde(skip_serializing_if = "is_zero")]
    pub host_dispatch_s: f64,
}

/// A primitive's achieved fraction of HBM bandwidth in one pass as a function of row length:
/// a chip file's `[[efficiency.row_hbm_bandwidth]]`. Linear in log2(row length) between the
/// listed lengths and flat beyond them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowBandwidth {
    pub op: VectorOp,
    pub pass: Pass,
    /// Row lengths in elements, strictly increasing.
    pub row_len: Vec<u64>,
    /// The fraction at each of `row_len`.
    pub hbm_bandwidth: Vec<f64>,
}

impl RowBandwidth {
    /// The fraction at `row_len` (`row_len` and `hbm_bandwidth` are non-empty and of equal
    /// length: chip files are checked at load).
    pub fn at(&self, row_len: u64) -> f64 {
        let log = |r: u64| (r.max(1) as f64).log2();
        let upper = self.row_len.partition_point(|&r| r < row_len);
        if upper == 0 {
            return self.hbm_bandwidth[0];
        }
        if upper == self.row_len.len() {
            return self.hbm_bandwidth[upper - 1];
        }
        let (r0, r1) = (log(self.row_len[upper - 1]), log(self.row_len[upper]));
        let (b0, b1) = (self.hbm_bandwidth[upper - 1], self.hbm_bandwidth[upper]);
        b0 + (b1 - b0) * (log(row_len) - r0) / (r1 - r0)
    }
}

fn is_one(fraction: &f64) -> bool {
    *fraction == 1.0
}

fn is_zero(seconds: &f64) -> bool {
    *seconds == 0.0
}

/// An optional value per vector primitive (a chip file's `[efficiency.vector_op_overhead_s]`,
/// `[efficiency.vector_op_hbm_bandwidth]` and `[efficiency.vector_op_backward_hbm_bandwidth]`,
/// keyed by the primitive's snake_case name).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PerVectorOp {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mul: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gelu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub silu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relu: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softmax: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub causal_softmax: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_norm: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rms_norm: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropout: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotary: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cross_entropy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column_sum: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cast: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fill: Option<f64>,
}

impl PerVectorOp {
    /// Whether no primitive has a value.
    pub fn is_empty(&self) -> bool {
        VectorOp::ALL.iter().all(|&op| self.get(op).is_none())
    }

    /// The value for `op`, if the chip file sets one.
    pub fn get(&self, op: VectorOp) -> Option<f64> {
        match op {
            VectorOp::Add => self.add,
            VectorOp::Mul => self.mul,
            VectorOp::Gelu => self.gelu,
            VectorOp::Silu => self.silu,
            VectorOp::Relu => self.relu,
            VectorOp::Softmax => self.softmax,
            VectorOp::CausalSoftmax => self.causal_softmax,
            VectorOp::LayerNorm => self.layer_norm,
            VectorOp::RmsNorm => self.rms_norm,
            VectorOp::Dropout => self.dropout,
            VectorOp::Rotary => self.rotary,
            VectorOp::Embedding => self.embedding,
            VectorOp::CrossEntropy => self.cross_entropy,
            VectorOp::Update => self.update,
            VectorOp::ColumnSum => self.column_sum,
            VectorOp::Copy => self.copy,
            VectorOp::Stack => self.stack,
            VectorOp::Cast => self.cast,
            VectorOp::Scale => self.scale,
            VectorOp::Norm => self.norm,
            VectorOp::Fill => self.fill,
        }
    }

    /// Sets (or with `None` clears) the value for `op`.
    pub fn set(&mut self, op: VectorOp, value: Option<f64>) {
        let slot = match op {
            VectorOp::Add => &mut self.add,
            VectorOp::Mul => &mut self.mul,
            VectorOp::Gelu => &mut self.gelu,
            VectorOp::Silu => &mut self.silu,
            VectorOp::Relu => &mut self.relu,
            VectorOp::Softmax => &mut self.softmax,
            VectorOp::CausalSoftmax => &mut self.causal_softmax,
            VectorOp::LayerNorm => &mut self.layer_norm,
            VectorOp::RmsNorm => &mut self.rms_norm,
            VectorOp::Dropout => &mut self.dropout,
            VectorOp::Rotary => &mut self.rotary,
            VectorOp::Embedding => &mut self.embedding,
            VectorOp::CrossEntropy => &mut self.cross_entropy,
            VectorOp::Update => &mut self.update,
            VectorOp::ColumnSum => &mut self.column_sum,
            VectorOp::Copy => &mut self.copy,
            VectorOp::Stack => &mut self.stack,
            VectorOp::Cast => &mut self.cast,
            VectorOp::Scale => &mut self.scale,
            VectorOp::Norm => &mut self.norm,
            VectorOp::Fill => &mut self.fill,
        };
        *slot = value;
    }
}

impl Efficiency {
    /// The fused attention kernels' fraction of peak: their own where set, else the GEMMs'.
    pub fn attention_compute(&self) -> f64 {
        self.attention_compute.unwrap_or(self.tensor_compute)
    }

    /// The fused attention kernels' work per query row beyond its keys, in score elements.
    pub fn attention_row_overhead(&self) -> f64 {
        self.attention_row_overhead.unwrap_or(0.0)
    }

    /// The fused attention fraction of `pass`: the backward's own where set, else the
    /// forward's.
    pub fn attention_compute_for(&self, pass: Pass) -> f64 {
        match (pass, self.attention_backward_compute) {
            (Pass::Backward, Some(value)) => value,
            _ => self.attention_compute(),
        }
    }

    /// The fused attention work per query row of `pass`: the backward's own where set, else
    /// the forward's.
    pub fn attention_row_overhead_for(&self, pass: Pass) -> f64 {
        match (pass, self.attention_backward_row_overhead) {
            (Pass::Backward, Some(value)) => value,
            _ => self.attention_row_overhead(),
        }
    }

    /// The time of `launches` kernels launched eagerly one after another whose GPU work, as a
    /// graph replay times it, is `gpu_s` in all: each adds `launch_gap_s`, and the pass takes
    /// no less than the host's dispatch of all of them. The host usually runs ahead of a busy
    /// GPU, so this is the pass's time when it starts with the host no further ahead. A
    /// layer's share of a multi-tensor kernel counts as a fraction of a launch.
    pub fn eager_pass_s(&self, gpu_s: f64, launches: f64) -> f64 {
        (gpu_s + launches * self.launch_gap_s).max(launches * self.host_dispatch_s)
    }

    /// Fixed overhead of one vector kernel of primitive `op` in `pass`.
    pub fn vector_overhead_for(&self, op: VectorOp, pass: Pass) -> f64 {
        let backward = match pass {
            Pass::Forward => None,
            Pass::Backward => self.vector_op_backward_overhead_s.get(op),
        };
        backward
            .or(self.vector_op_overhead_s.get(op))
            .unwrap_or(self.vector_overhead_s)
    }

    /// The rate of primitive `op`'s kernels in `pass` in a training run relative to their
    /// single-kernel fit: the pass's own value, else `vector_sustained_rate`.
    pub fn vector_rate_for(&self, op: VectorOp, pass: Pass) -> f64 {
        match pass {
            Pass::Forward => self.vector_op_sustained_rate.get(op),
            Pass::Backward => self.vector_op_backward_sustained_rate.get(op),
        }
        .unwrap_or(self.vector_sustained_rate)
    }

    /// Achieved fraction of peak HBM bandwidth of one vector kernel of primitive `op` in
    /// `pass` over rows of `row_len`: the pass's row-length table, else as
    /// [`Efficiency::hbm_bandwidth_for`].
    pub fn hbm_bandwidth_for_rows(&self, op: VectorOp, pass: Pass, row_len: u64) -> f64 {
        self.row_hbm_bandwidth
            .iter()
            .find(|t| t.op == op && t.pass == pass)
            .map_or_else(|| self.hbm_bandwidth_for(op, pass), |t| t.at(row_len))
    }

    /// Achieved fraction of peak HBM bandwidth of one vector kernel of primitive `op` in
    /// `pass`, whatever its rows: the backward's own value, else the primitive's, else the
    /// shared one.
    pub fn hbm_bandwidth_for(&self, op: VectorOp, pass: Pass) -> f64 {
        let backward = match pass {
            Pass::Backward => self.vector_op_backward_hbm_bandwidth.get(op),
            Pass::Forward => None,
        };
        backward
            .or(self.vector_op_hbm_bandwidth.get(op))
            .unwrap_or(self.hbm_bandwidth)
    }
}

impl Default for Efficiency {
    fn default() -> Self {
        Efficiency {
            tensor_compute: 1.0,
            attention_compute: None,
            attention_row_overhead: None,
            attention_backward_compute: None,
            attention_backward_row_overhead: None,
            vector_compute: 1.0,
            hbm_bandwidth: 1.0,
            gemm_overhead_s: 0.0,
            vector_overhead_s: 0.0,
            vector_op_overhead_s: PerVectorOp::default(),
            vector_op_backward_overhead_s: PerVectorOp::default(),
            vector_op_hbm_bandwidth: PerVectorOp::default(),
            vector_op_backward_hbm_bandwidth: PerVectorOp::default(),
            row_hbm_bandwidth: Vec::new(),
            link_bandwidth: 1.0,
            sustained_clock: 1.0,
            vector_sustained_rate: 1.0,
            vector_op_sustained_rate: PerVectorOp::default(),
            vector_op_backward_sustained_rate: PerVectorOp::default(),
            comm_overlap: 1.0,
            launch_gap_s: 0.0,
            host_dispatch_s: 0.0,
        }
    }
}

/// Cycles per element per lane of each vector primitive's arithmetic (docs/design.md §4:
/// add 1, exp ~15, division ~10). Chips with special-function units override them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VectorCycles {
    pub add: f64,
    pub mul: f64,
    pub exp: f64,
    pub div: f64,
    pub sqrt: f64,
}

impl Default for VectorCycles {
    fn default() -> Self {
        VectorCycles {
            add: 1.0,
            mul: 1.0,
            exp: 15.0,
            div: 10.0,
            sqrt: 10.0,
        }
    }
}

/// Energy per event in joules (docs/design.md §3); constants are cited in the spec files.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnergyCosts {
    /// One multiply-accumulate on a tensor core.
    pub mac_j: f64,
    /// One vector-lane operation.
    pub vector_op_j: f64,
    /// One byte moved to or from a core's local buffer.
    pub local_byte_j: f64,
    /// One byte moved to or from the global buffer.
    pub glb_byte_j: f64,
    /// One byte moved to or from HBM.
    pub hbm_byte_j: f64,
    /// One byte sent over an inter-device link.
    pub link_byte_j: f64,
    /// Static power (leakage, clock tree, control) per mm² of modelled (template) area: the
    /// board power no kernel's energy accounts for (docs/design.md §3, "Peak power"). Absent
    /// from a chip file: [`DEFAULT_STATIC_POWER_W_PER_MM2`].
    #[serde(default = "default_static_power_w_per_mm2")]
    pub static_power_w_per_mm2: f64,
}

/// Static power per mm² of template area fitted to the H100's measured kernels
/// (`tandem power --arch arch_specs/h100.calibrated.toml --fit calibration/data/h100/kernels.csv`):
/// the default of chips and spaces that give none, an assumption for any chip but the H100.
pub const DEFAULT_STATIC_POWER_W_PER_MM2: f64 = 1.3636;

fn default_static_power_w_per_mm2() -> f64 {
    DEFAULT_STATIC_POWER_W_PER_MM2
}

/// How a device runs the operators of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelExecution {
    /// Dataflow accelerator (PHAZE's model): independent operators run at once on separate
    /// tensor cores, vector cores and the link, scheduled by the per-layer ILP.
    #[default]
    Concurrent,
    /// GPU training step: one kernel at a time on one stream, each on every core, in the
    /// graph's order (PyTorch autograd; Megatron-LM's blocking tensor-parallel collectives).
    Serial,
}

/// A complete accelerator description: either a real chip from `arch_specs/*.toml` or one
/// point of a search space.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchConfig {
    pub name: String,
    pub clock_hz: f64,
    pub tensor: TensorCores,
    pub vector: VectorCores,
    pub glb: GlobalBuffer,
    pub hbm: Hbm,
    pub interconnect: Vec<Tier>,
    pub efficiency: Efficiency,
    pub vector_cycles: VectorCycles,
    pub energy: EnergyCosts,
    /// Die area when published (real chips); `None` means use the template area model.
    pub die_area_mm2: Option<f64>,
    /// Whether a layer's operators may overlap on the device (`kernel_execution` in a chip
    /// file; default `concurrent`).
    #[serde(default)]
    pub kernel_execution: KernelExecution,
}

impl ArchConfig {
    /// Peak tensor-core throughput in FLOP/s (a MAC is 2 FLOPs).
    pub fn peak_tensor_flops(&self) -> f64 {
        2.0 * f64::from(self.tensor.count)
            * f64::from(self.tensor.rows)
            * f64::from(self.tensor.cols)
            * self.clock_hz
    }

    /// The chip as single kernels are timed for calibration: one call at a time at
    /// `clock_hz`, too briefly for the power limit to pull the clock down.
    pub fn timed_in_isolation(&self) -> ArchConfig {
        ArchConfig {
            efficiency: Efficiency {
                sustained_clock: 1.0,
                vector_sustained_rate: 1.0,
                vector_op_sustained_rate: PerVectorOp::default(),
                vector_op_backward_sustained_rate: PerVectorOp::default(),
                ..self.efficiency.clone()
            },
            ..self.clone()
        }
    }
}
