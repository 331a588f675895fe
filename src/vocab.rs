//! The vocabulary the workload and the chip descriptions share: the vector primitives
//! ([`VectorOp`]), the pass a kernel belongs to ([`Pass`]) and each primitive's memory traffic
//! per element ([`VectorTraffic`], which both the bytes an operator shows and the cost model's
//! pricing read). A leaf of the crate: it depends on nothing else in it, so `arch` can name
//! primitives without depending on `workload` (ARCHITECTURE.md, code map).

use serde::{Deserialize, Serialize};

/// Element-wise or reduction primitives run on vector cores. Their per-element cost lives in
/// the architecture (`arch::VectorCycles`), so a chip file can describe its special-function units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VectorOp {
    /// Residual add, bias add, gradient accumulation.
    Add,
    /// Element-wise multiply (SwiGLU gating, scaling, masking).
    Mul,
    /// GeLU (tanh approximation).
    Gelu,
    /// SiLU / swish.
    Silu,
    /// ReLU (OPT's feed-forward activation).
    Relu,
    /// Row-wise softmax (max, exp, sum, divide) including scale and mask.
    Softmax,
    /// A fused causal softmax over square attention scores (Megatron-LM's
    /// `scaled_upper_triang_masked_softmax`): scale, mask the keys after the query and
    /// normalise in one pass with the row on chip, reading only up to the diagonal.
    CausalSoftmax,
    /// LayerNorm: mean and variance reductions, then scale and shift.
    LayerNorm,
    /// RMSNorm: one reduction, then scale.
    RmsNorm,
    /// Dropout: random mask and scale.
    Dropout,
    /// Rotary position embedding.
    Rotary,
    /// Embedding-table gather (and positional add).
    Embedding,
    /// Softmax cross-entropy loss over the vocabulary.
    CrossEntropy,
    /// Optimizer / generic update: a few fused multiply-adds per element.
    Update,
    /// Sums over tokens, one value per column (`row_len` columns): the gradients of biases and
    /// of norm weights, a separate kernel after the weight-gradient GEMM or the norm's backward.
    ColumnSum,
    /// A layout copy: one read and one write per element and no arithmetic (the attention
    /// context's transpose back to token-major rows, and its gradient the other way).
    Copy,
    /// Several strided tensors gathered into one (the QKV gradient assembled from the q, k and
    /// v gradients: PyTorch's and Megatron-LM's backward of splitting the fused projection).
    /// The same bytes as a copy, but a gather of its own kernel.
    Stack,
    /// A conversion between the operand precision and fp32: the forward pass widens (the
    /// logits the loss reads; gradients copied up to mixed precision's fp32 main copy), its
    /// backward narrows (the logits' gradient; the main weights copied back after the step).
    Cast,
    /// A tensor multiplied by one number in place: fp16 training's loss scale taken off the
    /// gradients, with the check for infinities and NaNs that decides whether to step.
    Scale,
    /// The sum of squares of a tensor into one number: the gradient norm that clipping needs.
    Norm,
    /// One value written to every element, nothing read: a gradient buffer zeroed before an
    /// iteration's first micro-batch.
    Fill,
}

impl VectorOp {
    /// Every primitive, in declaration order.
    pub const ALL: [VectorOp; 21] = [
        VectorOp::Add,
        VectorOp::Mul,
        VectorOp::Gelu,
        VectorOp::Silu,
        VectorOp::Relu,
        VectorOp::Softmax,
        VectorOp::CausalSoftmax,
        VectorOp::LayerNorm,
        VectorOp::RmsNorm,
        VectorOp::Dropout,
        VectorOp::Rotary,
        VectorOp::Embedding,
        VectorOp::CrossEntropy,
        VectorOp::Update,
        VectorOp::ColumnSum,
        VectorOp::Copy,
        VectorOp::Stack,
        VectorOp::Cast,
        VectorOp::Scale,
        VectorOp::Norm,
        VectorOp::Fill,
    ];

    /// The snake_case name chip files and CSVs use.
    pub fn name(self) -> &'static str {
        match self {
            VectorOp::Add => "add",
            VectorOp::Mul => "mul",
            VectorOp::Gelu => "gelu",
            VectorOp::Silu => "silu",
            VectorOp::Relu => "relu",
            VectorOp::Softmax => "softmax",
            VectorOp::CausalSoftmax => "causal_softmax",
            VectorOp::LayerNorm => "layer_norm",
            VectorOp::RmsNorm => "rms_norm",
            VectorOp::Dropout => "dropout",
            VectorOp::Rotary => "rotary",
            VectorOp::Embedding => "embedding",
            VectorOp::CrossEntropy => "cross_entropy",
            VectorOp::Update => "update",
            VectorOp::ColumnSum => "column_sum",
            VectorOp::Copy => "copy",
            VectorOp::Stack => "stack",
            VectorOp::Cast => "cast",
            VectorOp::Scale => "scale",
            VectorOp::Norm => "norm",
            VectorOp::Fill => "fill",
        }
    }
}

/// Whether a vector kernel is a forward primitive or its backward, which reads the incoming
/// gradient besides the saved tensors and so moves more bytes.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    #[default]
    Forward,
    Backward,
}

/// Memory traffic of a vector primitive per element: whole tensors read and written, in
/// operand elements, plus bytes outside them (dropout's one-byte keep-mask). Operands and
/// results once each; a cost model adds the re-reads its kernels need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorTraffic {
    pub reads: u64,
    /// Tensors read only up to the diagonal of square rows (half their elements): a causal
    /// softmax skips the masked keys.
    pub causal_reads: u64,
    pub writes: u64,
    pub extra_read_bytes: u64,
    pub extra_write_bytes: u64,
}

impl VectorTraffic {
    const fn tensors(reads: u64, writes: u64) -> Self {
        VectorTraffic {
            reads,
            causal_reads: 0,
            writes,
            extra_read_bytes: 0,
            extra_write_bytes: 0,
        }
    }
}

/// Indices up to which PyTorch's embedding backward runs one kernel over the features
/// (`embedding_dense_backward_cuda`: `num_indices <= 3072`); beyond, it sorts the indices and
/// sums the gradient rows segment by segment.
const EMBEDDING_FEATURE_KERNEL_MAX_TOKENS: u64 = 3072;

/// Kernels of PyTorch's sorting embedding backward (profiled in collect.py's iterations: an
/// arange, the radix sort's histogram, scan and eight one-sweep passes, the unique-by-key,
/// five segment kernels, the scan's two, then the partial sums and their scatter).
const EMBEDDING_SORTED_BACKWARD_KERNELS: u32 = 20;

impl VectorOp {
    /// Kernels PyTorch runs for one call of the primitive's `pass` over `elements` in rows of
    /// `row_len`, each paying the kernel's fixed cost (`efficiency.vector_op_…overhead_s`) and,
    /// launched eagerly, the launch gap: the softmax backward's product then row reduction, the
    /// cross-entropy's log-softmax and NLL loss (backward: autograd's seed of the loss gradient,
    /// NLL's zero-fill and scatter, the log-softmax backward), the embedding backward beyond
    /// 3072 tokens its sort and segment sums; one for the rest.
    pub fn kernels(self, pass: Pass, elements: u64, row_len: u64) -> u32 {
        match (self, pass) {
            (VectorOp::Softmax, Pass::Backward) | (VectorOp::CrossEntropy, Pass::Forward) => 2,
            (VectorOp::CrossEntropy, Pass::Backward) => 4,
            (VectorOp::Embedding, Pass::Backward)
                if elements / row_len.max(1) > EMBEDDING_FEATURE_KERNEL_MAX_TOKENS =>
            {
                EMBEDDING_SORTED_BACKWARD_KERNELS
            }
            _ => 1,
        }
    }

    /// Whether PyTorch's autograd keeps a tensor for the backward when the primitive runs in
    /// a forward: not for adds, scalings by a constant, layout copies, stacks and casts, whose
    /// gradients pass through unchanged or reshaped; for every other primitive (its input, its
    /// output, dropout's mask, the embedding's indices).
    pub fn saves_for_backward(self) -> bool {
        !matches!(
            self,
            VectorOp::Add
                | VectorOp::Scale
                | VectorOp::Copy
                | VectorOp::Stack
                | VectorOp::Cast
                | VectorOp::Fill
        )
    }

    /// What the primitive's `pass` kernel reads and writes per element. A backward kernel
    /// reads the incoming gradient and the saved tensors it differentiates through, and writes
    /// one gradient per forward input (PyTorch's and Megatron-LM's kernels).
    pub fn traffic(self, pass: Pass) -> VectorTraffic {
        let tensors = VectorTraffic::tensors;
        match (self, pass) {
            (VectorOp::Add | VectorOp::Mul, Pass::Forward) => tensors(2, 1),
            // Residual add: the gradient passes to both inputs.
            (VectorOp::Add, Pass::Backward) => tensors(1, 2),
            // d(a·b): dy, a and b in; da and db out.
            (VectorOp::Mul, Pass::Backward) => tensors(3, 2),
            // x in, y out; the backward reads dy besides the saved x (GeLU, a norm) or y
            // (softmax).
            (
                VectorOp::Gelu
                | VectorOp::Silu
                | VectorOp::Relu
                | VectorOp::Rotary
                | VectorOp::LayerNorm
                | VectorOp::RmsNorm
                | VectorOp::Softmax,
                pass,
            ) => tensors(if pass == Pass::Backward { 2 } else { 1 }, 1),
            // Scores (forward), or the probabilities and their gradient (backward), up to the
            // diagonal in; the whole row out, zeros after the diagonal.
            (VectorOp::CausalSoftmax, pass) => VectorTraffic {
                causal_reads: if pass == Pass::Backward { 2 } else { 1 },
                ..tensors(0, 1)
            },
            // The loss is one value per row: nothing per element is written.
            (VectorOp::CrossEntropy, Pass::Forward) => tensors(1, 0),
            // Softmax of the logits minus the one-hot target: logits in, their gradient out.
            (VectorOp::CrossEntropy, Pass::Backward) => tensors(1, 1),
            // The keep-mask is stored for the backward pass, which reads it with dy.
            (VectorOp::Dropout, Pass::Forward) => VectorTraffic {
                extra_write_bytes: 1,
                ..tensors(1, 1)
            },
            (VectorOp::Dropout, Pass::Backward) => VectorTraffic {
                extra_read_bytes: 1,
                ..tensors(1, 1)
            },
            // Table rows in, embeddings out (learned positions are an add of their own).
            (VectorOp::Embedding, Pass::Forward) => tensors(1, 1),
            // Adam: weights, gradients, two moments in; weights and moments out.
            (VectorOp::Update, Pass::Forward) => tensors(4, 3),
            // Scatter-add of the output gradient into the table rows.
            (VectorOp::Embedding | VectorOp::Update, Pass::Backward) => tensors(1, 1),
            // Read once; one value per column out (nothing per element). Only ever a backward
            // kernel (bias and norm-weight gradients), the same in either pass.
            (VectorOp::ColumnSum, _) => tensors(1, 0),
            // The gradient of a layout copy is the inverse copy.
            (VectorOp::Copy | VectorOp::Stack, _) => tensors(1, 1),
            // Operand-precision values in, fp32 out; and back.
            (VectorOp::Cast, Pass::Forward) => VectorTraffic {
                extra_write_bytes: 4,
                ..tensors(1, 0)
            },
            (VectorOp::Cast, Pass::Backward) => VectorTraffic {
                extra_read_bytes: 4,
                ..tensors(0, 1)
            },
            // Optimizer-step kernels, the same in either pass: the tensor in and out again,
            // or in only (one number out).
            (VectorOp::Scale, _) => tensors(1, 1),
            (VectorOp::Norm, _) => tensors(1, 0),
            (VectorOp::Fill, _) => tensors(0, 1),
        }
    }
}
