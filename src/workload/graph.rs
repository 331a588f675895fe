//! The graphs every later stage consumes: an operator DAG per unique layer ([`OpGraph`]) and
//! the layer DAG of a whole model at one tensor-parallel width ([`LayerGraph`]).
//!
//! All sizes are *per device* after tensor-parallel slicing and for one micro-batch.

use serde::{Deserialize, Serialize};
use std::sync::Arc;

use crate::vocab::{Pass, VectorOp};

/// Which kind of on-chip resource executes an operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoreType {
    /// Systolic tensor cores (GEMMs).
    Tensor,
    /// SIMD vector cores (element-wise ops, reductions).
    Vector,
    /// The device's network port (collectives); one operation at a time.
    Link,
}

/// Collective communication patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    /// Point-to-point send/receive (pipeline stage boundaries).
    SendRecv,
}

/// What an operator computes, with the shape that determines its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpKind {
    /// `batch` independent products of an (m × k) by a (k × n) matrix.
    Gemm { batch: u64, m: u64, n: u64, k: u64 },
    /// A vector primitive over `elements` values in rows of `row_len` (1 for element-wise ops).
    Vector {
        op: VectorOp,
        elements: u64,
        row_len: u64,
        #[serde(default)]
        pass: Pass,
    },
    /// A collective over `group` devices moving `bytes` (the full buffer size per device).
    Collective {
        collective: CollectiveKind,
        bytes: u64,
        group: u32,
    },
    /// Fused (flash) attention of `shape`: the score products, the softmax and the product with
    /// V in one kernel whose score tiles stay on chip (FlashAttention-2; PyTorch's
    /// `scaled_dot_product_attention`); the backward recomputes the scores.
    Attention {
        #[serde(flatten)]
        shape: AttentionShape,
        #[serde(default)]
        pass: Pass,
    },
}

/// The shape of a fused attention kernel ([`OpKind::Attention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionShape {
    /// Query heads: the micro-batch's samples × the heads on the device.
    pub heads: u64,
    /// Key/value heads, as many or a divisor of them (grouped-query attention).
    pub kv_heads: u64,
    pub seq_len: u64,
    pub head_dim: u64,
    /// Keys after each query masked (decoders): the kernel skips those tiles.
    pub causal: bool,
}

/// The score products a fused attention kernel runs per query head, each over `seq_len` ×
/// `seq_len` × `head_dim`: those shaped as QKᵀ (an s × s result over depth d) and those
/// shaped as P·V (s × d over depth s). Forward, QKᵀ and P·V; the backward recomputes QKᵀ and
/// adds dP = dO·Vᵀ (score-shaped), dV = Pᵀ·dO, dQ = dS·K and dK = dSᵀ·Q.
pub fn attention_products(pass: Pass) -> [u64; 2] {
    match pass {
        Pass::Forward => [1, 1],
        Pass::Backward => [2, 3],
    }
}

impl OpKind {
    /// Which core type executes this operator.
    pub fn core_type(&self) -> CoreType {
        match self {
            OpKind::Gemm { .. } | OpKind::Attention { .. } => CoreType::Tensor,
            OpKind::Vector { .. } => CoreType::Vector,
            OpKind::Collective { .. } => CoreType::Link,
        }
    }
}

/// Elements one chunk of a multi-tensor kernel covers, and chunks one launch of it takes:
/// PyTorch's `multi_tensor_apply` (ATen/native/cuda/MultiTensorApply.cuh: `kChunkSize` 65 536,
/// `depth_to_max_blocks` 320) and apex's, which Megatron-LM calls with chunks of 2048 × 32.
const MULTI_TENSOR_CHUNK_ELEMENTS: f64 = 65_536.0;
const MULTI_TENSOR_CHUNKS_PER_LAUNCH: f64 = 320.0;

/// How a GPU framework launches an operator: what the chip's launch gap
/// (`efficiency.launch_gap_s`) is paid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launches {
    /// This many kernels one after another (PyTorch's softmax backward: the element-wise
    /// product, then the row reduction).
    Kernels(u32),
    /// One multi-tensor kernel over many layers' tensors (the optimizer step's update, its
    /// gradient unscaling and norm): a launch per 320 chunks of 65 536 elements, so a layer's
    /// share is its elements over 20 971 520 (collect.py's fused Adam over GPT-1.7B's 1.65 G
    /// parameters: 79 by this count, 80 profiled).
    MultiTensor,
}

impl Default for Launches {
    fn default() -> Self {
        Launches::Kernels(1)
    }
}

/// One operator of a layer, per device, for one micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    pub name: String,
    pub kind: OpKind,
    /// Bytes per element of the operands (2 for bf16/fp16).
    pub elem_bytes: u32,
    /// Floating-point operations (a multiply-add counts 2).
    pub flops: f64,
    /// Bytes the operator reads from and writes to memory outside the core (operands and
    /// results, once each); the cost model adds re-reads caused by tiling.
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// How its kernels are launched.
    #[serde(default)]
    pub launches: Launches,
    /// Issued asynchronously on a stream of its own (a collective Megatron-LM launches with
    /// `async_op=True`): under serial kernel execution the kernels after it in the graph's
    /// order run while it does, each waiting only for its own inputs. Concurrent execution
    /// overlaps every operator anyway.
    #[serde(default)]
    pub asynchronous: bool,
}

impl Op {
    /// Whether the operator, run in a forward, keeps a tensor for the backward: a GEMM its
    /// inputs, a vector primitive as [`VectorOp::saves_for_backward`], a collective nothing.
    pub fn saves_for_backward(&self) -> bool {
        match self.kind {
            OpKind::Gemm { .. } | OpKind::Attention { .. } => true,
            OpKind::Vector { op, .. } => op.saves_for_backward(),
            OpKind::Collective { .. } => false,
        }
    }

    /// Kernel launches of one call, or a layer's share of a multi-tensor kernel's.
    pub fn launches(&self) -> f64 {
        match self.launches {
            Launches::Kernels(n) => f64::from(n),
            Launches::MultiTensor => {
                let elements = match self.kind {
                    OpKind::Vector { elements, .. } => elements,
                    OpKind::Gemm { .. } | OpKind::Collective { .. } | OpKind::Attention { .. } => 0,
                };
                elements as f64 / (MULTI_TENSOR_CHUNK_ELEMENTS * MULTI_TENSOR_CHUNKS_PER_LAUNCH)
            }
        }
    }
}

/// A DAG of operators. Invariant: `ops` are in topological order and every edge `(i, j)`
/// has `i < j`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpGraph {
    pub ops: Vec<Op>,
    pub edges: Vec<(usize, usize)>,
}

impl OpGraph {
    pub fn total_flops(&self) -> f64 {
        self.ops.iter().map(|o| o.flops).sum()
    }

    /// Kernel launches of one run of the graph ([`Op::launches`]).
    pub fn launches(&self) -> f64 {
        self.ops.iter().map(Op::launches).sum()
    }

    /// The graph with its collectives removed: what one device computes of a tensor-parallel
    /// layer when timed alone. A collective's successors inherit its predecessors, so the
    /// order among the remaining operators is kept.
    pub fn without_collectives(&self) -> OpGraph {
        let mut preds: Vec<Vec<usize>> = vec![Vec::new(); self.ops.len()];
        for &(from, to) in &self.edges {
            preds[to].push(from);
        }
        // Per operator, the surviving operators it depends on directly (through collectives).
        let mut kept_preds: Vec<Vec<usize>> = vec![Vec::new(); self.ops.len()];
        let mut new_index: Vec<Option<usize>> = vec![None; self.ops.len()];
        let mut graph = OpGraph::default();
        for (i, op) in self.ops.iter().enumerate() {
            let mut inherited: Vec<usize> = preds[i]
                .iter()
                .flat_map(|&p| match new_index[p] {
                    Some(kept) => vec![kept],
                    None => kept_preds[p].clone(),
                })
                .collect();
            inherited.sort_unstable();
            inherited.dedup();
            if op.kind.core_type() == CoreType::Link {
                kept_preds[i] = inherited;
            } else {
                let index = graph.ops.len();
                new_index[i] = Some(index);
                graph
                    .edges
                    .extend(inherited.into_iter().map(|p| (p, index)));
                graph.ops.push(op.clone());
            }
        }
        graph.edges.sort_unstable();
        graph
    }
}

/// Activation bytes one layer keeps for the backward pass, per device and micro-batch,
/// under each recompute mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivationBytes {
    /// No recompute: every tensor the backward pass needs.
    pub none: u64,
    /// Selective recompute: the attention core (QKᵀ, softmax, dropout, ×V) is recomputed.
    pub selective: u64,
    /// Full recompute: only the layer input is kept.
    pub full: u64,
}

impl ActivationBytes {
    /// Whether full recompute reruns the layer's forward: only a layer that keeps less under
    /// it than without recompute has anything to recompute (a GPT's head keeps its logits
    /// and is never recomputed).
    pub fn recomputed_under_full(&self) -> bool {
        self.full < self.none
    }
}

/// One layer of the model at a given tensor-parallel width and micro-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    pub name: String,
    /// Layers with equal signatures have identical operator graphs; later stages key caches
    /// on it (e.g. the 96 blocks of GPT-3 share one).
    pub signature: String,
    pub fwd: Arc<OpGraph>,
    pub bwd: Arc<OpGraph>,
    /// Parameters held by one device (after tensor-parallel slicing).
    pub params: u64,
    /// Elements of each parameter tensor one device holds, summing to `params`: what the
    /// per-tensor kernels of [`crate::workload::ParamKernels::PerTensor`] visit one by one.
    #[serde(default)]
    pub param_tensors: Vec<u64>,
    pub activation_bytes: ActivationBytes,
    /// Bytes of the layer's output per device: what a pipeline send carries.
    pub output_bytes: u64,
    /// Parameters the device's tensor group replicates (included in `params`).
    #[serde(default, skip_serializing_if = "ReplicatedParams::is_empty")]
    pub replicated: ReplicatedParams,
    /// Of `params`, the weights of a mixture-of-experts layer's experts (all of them:
    /// expert parallelism divides them over devices later).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expert_params: u64,
    /// Bytes of tokens (with their capacity padding) the device dispatches to the experts per
    /// micro-batch: what each all-to-all moves.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub all_to_all_bytes: u64,
    /// Parameters the layer uses that an earlier layer holds (not in `params`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied: Option<TiedUse>,
}

/// A layer's use of an earlier layer's parameters (an output projection tied to the input
/// embeddings): a pipeline stage without the owner keeps a copy of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TiedUse {
    /// Index of the layer holding the parameters.
    pub owner: usize,
    /// Elements of each tied tensor one device uses (after tensor-parallel slicing).
    pub tensors: Vec<u64>,
}

impl TiedUse {
    pub fn params(&self) -> u64 {
        self.tensors.iter().sum()
    }
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Parameters that several devices of a tensor group hold whole (K/V projections when the
/// group is wider than the key/value heads): each device's gradients cover only its own query
/// heads, so the copies' gradients are all-reduced over the `group` devices holding them once
/// per iteration, as Megatron-LM does for the parameters its tensor group replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ReplicatedParams {
    /// Parameters per device.
    pub params: u64,
    /// Devices holding each copy (consecutive in the tensor group).
    pub group: u32,
}

impl ReplicatedParams {
    pub fn is_empty(&self) -> bool {
        self.params == 0 || self.group <= 1
    }
}

/// The model as a DAG of layers for one (tensor width, micro-batch, sequence-parallel) choice.
/// Invariant: layers are in topological order; every edge `(i, j, bytes)` has `i < j`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerGraph {
    pub layers: Vec<Layer>,
    pub edges: Vec<(usize, usize, u64)>,
    pub tp: u32,
    pub micro_batch: u32,
    pub sequence_parallel: bool,
}

impl LayerGraph {
    /// Whether every device of a tensor group holds each edge's whole tensor: tensor
    /// parallelism without sequence parallelism leaves the activations between layers
    /// replicated (sequence parallelism splits them along the sequence).
    pub fn replicated_edges(&self) -> bool {
        self.tp > 1 && !self.sequence_parallel
    }

    /// The model's repeated layers `[first, end)`: the longest run of consecutive layers
    /// sharing one signature (a transformer's blocks), where one layer repeats at all. The
    /// interleaved pipeline schedule splits them evenly into chunks, as Megatron-LM does.
    pub fn repeated_layers(&self) -> Option<[usize; 2]> {
        let mut best: Option<[usize; 2]> = None;
        let mut start = 0;
        for end in 1..=self.layers.len() {
            let run_ends = end == self.layers.len()
                || self.layers[end].signature != self.layers[start].signature;
            if run_ends {
                if end - start >= 2 && best.is_none_or(|[a, b]| end - start > b - a) {
                    best = Some([start, end]);
                }
                start = end;
            }
        }
        best
    }
}
