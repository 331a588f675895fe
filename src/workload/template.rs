//! Transformer model templates (`workloads/*.toml`): parsing, validation, parameter counts
//! and the Megatron-sliced layer graphs of the four families (gpt, bert, opt, llama).
//!
//! Notation follows Korthikanti et al. 2022: s sequence, b micro-batch, h hidden, a heads,
//! L layers, V vocabulary, t tensor-parallel width; plus kv (key/value heads), d = h/a (head
//! dimension), f (feed-forward width) and e (bytes per element).

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::graph::{
    ActivationBytes, AttentionShape, CollectiveKind, Layer, LayerGraph, Op, OpKind,
    ReplicatedParams, TiedUse,
};
use super::ops::{
    attention, build_graphs, collective, collective_backward, column_sum, gemm, gemm_grad_a,
    gemm_grad_b, mul, vector, vector_in_pass, Feeds, Node,
};
use super::{
    Checkpoint, Ddp, Family, GptSizes, Model, Optimizer, ParamKernels, Precision, Workload,
};
use crate::error::InputError;
use crate::vocab::{Pass, VectorOp};

/// The raw TOML form. Sizes are read as signed integers so a negative value gets a message
/// naming its field instead of a generic type error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTemplate {
    name: String,
    family: String,
    layers: i64,
    hidden: i64,
    heads: i64,
    kv_heads: Option<i64>,
    head_dim: Option<i64>,
    ffn_hidden: Option<i64>,
    vocab: i64,
    seq_len: i64,
    global_batch: i64,
    precision: Option<String>,
    grad_precision: Option<String>,
    optimizer: Option<String>,
    loss_scaling: Option<bool>,
    gradient_clipping: Option<bool>,
    gradient_accumulation_fusion: Option<bool>,
    param_kernels: Option<String>,
    ddp: Option<String>,
    checkpoint: Option<String>,
    norm: Option<Norm>,
    activation: Option<Activation>,
    positions: Option<Positions>,
    bias: Option<bool>,
    dropout: Option<bool>,
    tied_embeddings: Option<bool>,
    parallel_block: Option<bool>,
    attention_softmax: Option<AttentionSoftmax>,
    cross_entropy: Option<CrossEntropyKernels>,
    qkv_bias: Option<QkvBias>,
    tp_grad_overlap: Option<bool>,
    moe: Option<RawMoe>,
}

/// The raw `[moe]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMoe {
    experts: i64,
    top_k: i64,
    capacity_factor: Option<f64>,
    shared_experts: Option<i64>,
    expert_ffn_hidden: Option<i64>,
    every: Option<i64>,
}

/// Mixture-of-experts feed-forward layers (Shazeer et al. 2017; GShard, Switch, Mixtral): a
/// router picks `top_k` of `experts` feed-forward networks per token; `shared_experts` more
/// see every token (DeepSeek-MoE). Every `every`-th block has one (GLaM and Switch: every
/// other block), the others a dense feed-forward network.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moe {
    pub experts: u64,
    pub top_k: u64,
    /// Tokens each expert takes, as a multiple of an even share `top_k · tokens / experts`
    /// (1: the dropless average).
    pub capacity_factor: f64,
    pub shared_experts: u64,
    /// Width of each expert's feed-forward network.
    pub expert_ffn_hidden: u64,
    pub every: u64,
}

impl Eq for Moe {}

impl Moe {
    /// Token slots the experts of one device process for `tokens` routed tokens:
    /// `capacity_factor · top_k · tokens`, rounded up.
    fn routed_tokens(&self, tokens: u64) -> u64 {
        (self.capacity_factor * (self.top_k * tokens) as f64).ceil() as u64
    }

    /// Whether block `i` (from 0) has experts.
    fn has_experts(&self, i: u64) -> bool {
        (i + 1).is_multiple_of(self.every)
    }
}

impl RawTemplate {
    /// A GPT (multi-head attention, 4h feed-forward) trained with Adam at `precision`, from
    /// sizes given as numbers; [`RawTemplate::validate`] checks them as it checks a file's.
    pub(crate) fn gpt(name: &str, sizes: GptSizes, precision: Precision) -> RawTemplate {
        let size = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        RawTemplate {
            name: name.to_string(),
            family: "gpt".to_string(),
            layers: size(sizes.layers),
            hidden: size(sizes.hidden),
            heads: size(sizes.heads),
            kv_heads: None,
            head_dim: None,
            ffn_hidden: None,
            vocab: size(sizes.vocab),
            seq_len: size(sizes.seq_len),
            global_batch: size(sizes.global_batch),
            precision: Some(precision.name().to_string()),
            grad_precision: None,
            optimizer: Some("adam".to_string()),
            loss_scaling: None,
            gradient_clipping: None,
            gradient_accumulation_fusion: None,
            param_kernels: None,
            ddp: None,
            checkpoint: None,
            norm: None,
            activation: None,
            positions: None,
            bias: None,
            dropout: None,
            tied_embeddings: None,
            parallel_block: None,
            attention_softmax: None,
            cross_entropy: None,
            qkv_bias: None,
            tp_grad_overlap: None,
            moe: None,
        }
    }
}

/// Megatron-LM's `vocab_parallel_cross_entropy` over `tokens` rows of `vocab` fp32 logits per
/// device: the rows' maximum (all-reduced over the `tp` devices), subtracted in place,
/// exponentiated in place, the rows' sum (all-reduced, as are the target logits), and the
/// division that leaves the softmax for the backward, which scales it by the loss gradient in
/// one kernel (the autograd function's own backward, so the forward kernels have none). The
/// reductions are priced as the norm primitive (one read, one value per row out), the
/// element-wise steps as the scaling primitive (one read, one write): memory-bound streams,
/// at those primitives' rates. The target's index kernels (over one value per row) are left
/// out.
fn vocab_parallel_cross_entropy(
    bld: &mut Builder,
    logits: usize,
    tokens: u64,
    vocab: u64,
    tp: u64,
) {
    let elements = tokens * vocab;
    let all_reduce = |bld: &mut Builder, name: &str, pred: usize| {
        if tp == 1 {
            return pred;
        }
        let bytes = mul(&[tokens, 4]);
        let op = collective(name, CollectiveKind::AllReduce, bytes, tp as u32, 4);
        bld.forward_only(op, pred)
    };
    let reduce = |name: &str| vector(name, VectorOp::Norm, elements, vocab, 4);
    let stream = |name: &str| vector(name, VectorOp::Scale, elements, 1, 4);
    let max = bld.forward_only(reduce("ce_row_max"), logits);
    let max = all_reduce(bld, "ce_row_max_all_reduce", max);
    let shifted = bld.forward_only(stream("ce_subtract_max"), max);
    let exp = bld.forward_only(stream("ce_exp"), shifted);
    let sum = bld.forward_only(reduce("ce_row_sum"), exp);
    let sum = all_reduce(bld, "ce_target_logit_all_reduce", sum);
    let sum = all_reduce(bld, "ce_row_sum_all_reduce", sum);
    let softmax = bld.forward_only(stream("ce_divide_by_sum"), sum);
    let grad = vector_in_pass(
        "ce_scale_softmax",
        VectorOp::Scale,
        Pass::Backward,
        elements,
        1,
        4,
    );
    bld.nodes[softmax].grad.push((grad, Feeds::All));
}

/// Largest accepted value of each size: far above any real model, low enough that parameter
/// counts stay below 2^61 (L·(4h² + 3hf) ≤ 2^60) and fit a `u64` exactly.
const MAX_SIZE: [(&str, u64); 14] = [
    ("layers", 1 << 16),
    ("hidden", 1 << 20),
    ("heads", 1 << 16),
    ("kv_heads", 1 << 16),
    ("head_dim", 1 << 16),
    ("moe.experts", 1 << 12),
    ("moe.top_k", 1 << 12),
    ("moe.shared_experts", 1 << 12),
    ("moe.expert_ffn_hidden", 1 << 20),
    ("moe.every", 1 << 16),
    ("ffn_hidden", 1 << 22),
    ("vocab", 1 << 24),
    ("seq_len", 1 << 20),
    ("global_batch", 1 << 32),
];

/// Normalisation layer of a block and of the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    /// Scale, and a shift where the model has biases.
    LayerNorm,
    /// Scale only.
    RmsNorm,
}

/// The feed-forward network's activation; the gated ones have two up-projections (gate and
/// up), each `ffn_hidden` wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Gelu,
    Relu,
    /// SiLU(gate) × up (Shazeer 2020; Llama, PaLM).
    Swiglu,
    /// GeLU(gate) × up (Shazeer 2020; T5 v1.1, LaMDA).
    Geglu,
}

impl Activation {
    fn gated(self) -> bool {
        matches!(self, Activation::Swiglu | Activation::Geglu)
    }
}

/// How token positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Positions {
    /// A learned table of rows added to the embeddings (OPT: 2 rows more than s).
    Learned,
    /// Rotary embeddings applied to queries and keys in every block (no parameters).
    Rotary,
}

/// The kernel that normalises the attention scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionSoftmax {
    /// A softmax over whole rows, as PyTorch's `torch.softmax` runs it.
    Separate,
    /// Megatron-LM's fused causal kernel (`scaled_upper_triang_masked_softmax`): scale, mask
    /// and softmax in one pass that reads each row only up to the diagonal.
    FusedCausal,
    /// Fused (flash) attention: the score products, the softmax, its dropout and the product
    /// with V in one kernel whose scores never reach HBM nor the activations
    /// ([`OpKind::Attention`]; FlashAttention-2, PyTorch's `scaled_dot_product_attention`),
    /// causal in decoders; the backward recomputes the scores in one kernel of its own.
    Flash,
}

/// The kernels that compute the loss over the vocabulary logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CrossEntropyKernels {
    /// One fused kernel forward and one backward (PyTorch's `cross_entropy`).
    Fused,
    /// Megatron-LM's `vocab_parallel_cross_entropy`: the rows' maximum, its subtraction, the
    /// exponential, the rows' sum and the division, each a kernel over the fp32 logits, with
    /// the tensor group's three all-reduces; one kernel backward.
    VocabParallel,
}

/// How the QKV projection's bias reaches its output. The other linear layers' biases ride on
/// the element-wise kernel after them (GeLU, dropout), so only this one can cost a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkvBias {
    /// In the GEMM's epilogue (cuBLASLt's bias epilogue, as PyTorch 2's `linear` runs it).
    Epilogue,
    /// By a kernel of its own after the GEMM, reading and writing the projection's output:
    /// the PyTorch of 2021, whose `linear` on an input of more than two dimensions runs
    /// `matmul` and then `add_` (Megatron-LM's `ColumnParallelLinear` for the QKV).
    AddKernel,
}

/// The shape of the transformer block and its ends; each family has defaults a file may
/// override (docs/workloads.md, "Block shape").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockShape {
    pub norm: Norm,
    pub activation: Activation,
    pub positions: Positions,
    /// Biases on every linear layer (and a LayerNorm shift).
    pub bias: bool,
    pub dropout: bool,
    /// The output head reuses the word embedding.
    pub tied_embeddings: bool,
    /// Attention and feed-forward both read one normalised input and their outputs are summed
    /// before a single residual add (GPT-J, PaLM), instead of one after the other.
    pub parallel: bool,
    pub softmax: AttentionSoftmax,
    pub cross_entropy: CrossEntropyKernels,
    pub qkv_bias: QkvBias,
    /// The tensor group's collective on a column-parallel linear's input gradient (an
    /// all-reduce; a reduce-scatter under sequence parallelism) runs while the linear's
    /// weight gradient is computed (Megatron-LM since September 2021, `async_op=True`; on by
    /// default there as `--async-tensor-model-parallel-allreduce`, and always under sequence
    /// parallelism), instead of blocking the kernels after it.
    pub tp_grad_overlap: bool,
}

impl BlockShape {
    /// A short name of every choice, for layer signatures (the fused softmax, the
    /// vocabulary-parallel loss, the QKV bias kernel and the overlapped input-gradient
    /// collective only where chosen, so the signatures of the default stay as they were).
    fn tag(&self) -> String {
        format!(
            "{}-{}-{} bias{} drop{} tied{} par{}{}{}{}{}",
            match self.norm {
                Norm::LayerNorm => "ln",
                Norm::RmsNorm => "rms",
            },
            match self.activation {
                Activation::Gelu => "gelu",
                Activation::Relu => "relu",
                Activation::Swiglu => "swiglu",
                Activation::Geglu => "geglu",
            },
            match self.positions {
                Positions::Learned => "learned",
                Positions::Rotary => "rotary",
            },
            u8::from(self.bias),
            u8::from(self.dropout),
            u8::from(self.tied_embeddings),
            u8::from(self.parallel),
            match self.softmax {
                AttentionSoftmax::Separate => "",
                AttentionSoftmax::FusedCausal => " fused-causal-softmax",
                AttentionSoftmax::Flash => " flash-attention",
            },
            match self.cross_entropy {
                CrossEntropyKernels::Fused => "",
                CrossEntropyKernels::VocabParallel => " vocab-parallel-ce",
            },
            match self.qkv_bias {
                QkvBias::Epilogue => "",
                QkvBias::AddKernel => " qkv-bias-add",
            },
            if self.tp_grad_overlap {
                " tp-grad-overlap"
            } else {
                ""
            }
        )
    }

    /// The defaults of a family.
    fn of(family: Family) -> BlockShape {
        let llama = family == Family::Llama;
        BlockShape {
            norm: if llama {
                Norm::RmsNorm
            } else {
                Norm::LayerNorm
            },
            activation: match family {
                Family::Llama => Activation::Swiglu,
                Family::Opt => Activation::Relu,
                Family::Gpt | Family::Bert => Activation::Gelu,
            },
            positions: if llama {
                Positions::Rotary
            } else {
                Positions::Learned
            },
            bias: !llama,
            dropout: !llama,
            tied_embeddings: !llama,
            parallel: false,
            softmax: AttentionSoftmax::Separate,
            cross_entropy: CrossEntropyKernels::Fused,
            qkv_bias: QkvBias::Epilogue,
            tp_grad_overlap: false,
        }
    }
}

/// A validated transformer template (sizes of the whole, unsliced model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub family: Family,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    /// Key/value heads (grouped- or multi-query attention); equals `heads` for multi-head
    /// attention.
    pub kv_heads: u64,
    /// Size of one attention head (default `hidden / heads`).
    pub head_dim: u64,
    pub ffn_hidden: u64,
    pub vocab: u64,
    pub block: BlockShape,
    pub moe: Option<Moe>,
}

fn positive(file: &Path, field: &str, value: i64) -> Result<u64, InputError> {
    if value <= 0 {
        return Err(InputError::invalid(
            file,
            field,
            format!("must be a positive integer, got {value}"),
        ));
    }
    let value = value as u64;
    let max = MAX_SIZE
        .iter()
        .find(|(name, _)| *name == field)
        .map_or(u64::MAX, |(_, max)| *max);
    if value > max {
        return Err(InputError::invalid(
            file,
            field,
            format!("{value} is larger than the supported maximum {max}"),
        ));
    }
    Ok(value)
}

impl RawTemplate {
    /// Checks every field and returns the validated template.
    pub(crate) fn validate(self, file: &Path) -> Result<Workload, InputError> {
        if self.name.trim().is_empty() {
            return Err(InputError::invalid(file, "name", "must not be empty"));
        }
        let family = Family::parse(&self.family).ok_or_else(|| {
            InputError::invalid(
                file,
                "family",
                format!(
                    "unknown family `{}`; expected one of gpt, bert, opt, llama",
                    self.family
                ),
            )
        })?;
        let layers = positive(file, "layers", self.layers)?;
        let hidden = positive(file, "hidden", self.hidden)?;
        let heads = positive(file, "heads", self.heads)?;
        let kv_heads = positive(file, "kv_heads", self.kv_heads.unwrap_or(self.heads))?;
        let head_dim = match self.head_dim {
            Some(value) => positive(file, "head_dim", value)?,
            None if hidden % heads != 0 => {
                return Err(InputError::invalid(
                    file,
                    "heads",
                    format!(
                        "{heads} heads do not divide hidden size {hidden}; give `head_dim` \
                         when heads × head_dim is not the hidden size"
                    ),
                ))
            }
            None => hidden / heads,
        };
        let ffn_hidden = positive(
            file,
            "ffn_hidden",
            self.ffn_hidden.unwrap_or(4 * self.hidden),
        )?;
        let vocab = positive(file, "vocab", self.vocab)?;
        let seq_len = positive(file, "seq_len", self.seq_len)?;
        let global_batch = positive(file, "global_batch", self.global_batch)?;
        if heads * head_dim > 1 << 22 {
            return Err(InputError::invalid(
                file,
                "head_dim",
                format!(
                    "{heads} heads of {head_dim} give an attention width beyond the supported \
                     {}",
                    1u64 << 22
                ),
            ));
        }
        if heads % kv_heads != 0 {
            return Err(InputError::invalid(
                file,
                "kv_heads",
                format!("{kv_heads} key/value heads do not divide {heads} heads"),
            ));
        }
        let precision = match self.precision.as_deref() {
            None => Precision::Bf16,
            Some(text) => Precision::parse(text).ok_or_else(|| {
                InputError::invalid(
                    file,
                    "precision",
                    format!("unknown precision `{text}`; expected one of fp32, bf16, fp16"),
                )
            })?,
        };
        let grads = precision.read_grads(file, self.grad_precision.as_deref())?;
        let optimizer = match self.optimizer.as_deref() {
            None => Optimizer::Adam,
            Some(text) => Optimizer::parse(text).ok_or_else(|| {
                InputError::invalid(
                    file,
                    "optimizer",
                    format!("unknown optimizer `{text}`; expected one of sgd, adam"),
                )
            })?,
        };
        let param_kernels = ParamKernels::read(file, self.param_kernels.as_deref())?;
        let ddp = Ddp::read(file, self.ddp.as_deref())?;
        let checkpoint = Checkpoint::read(file, self.checkpoint.as_deref())?;
        let block = self.block_shape(family);
        if block.qkv_bias == QkvBias::AddKernel && !block.bias {
            return Err(InputError::invalid(
                file,
                "qkv_bias",
                "add_kernel adds the QKV projection's bias, but the block has none (bias = false)",
            ));
        }
        if family == Family::Bert && block.softmax == AttentionSoftmax::FusedCausal {
            return Err(InputError::invalid(
                file,
                "attention_softmax",
                "fused_causal masks the keys after each query, but BERT's attention is \
                 bidirectional; use separate",
            ));
        }
        let moe = match &self.moe {
            Some(raw) => Some(raw.validate(file, ffn_hidden, layers)?),
            None => None,
        };
        Ok(Workload {
            name: self.name,
            seq_len,
            global_batch,
            precision,
            grads,
            optimizer,
            loss_scaling: self.loss_scaling.unwrap_or(precision == Precision::Fp16),
            gradient_clipping: self.gradient_clipping.unwrap_or(true),
            gradient_accumulation_fusion: self.gradient_accumulation_fusion.unwrap_or(true),
            param_kernels,
            ddp,
            checkpoint,
            source: file.to_path_buf(),
            model: Model::Template(Template {
                family,
                layers,
                hidden,
                heads,
                kv_heads,
                head_dim,
                ffn_hidden,
                vocab,
                block,
                moe,
            }),
        })
    }
}

impl RawMoe {
    fn validate(&self, file: &Path, ffn_hidden: u64, layers: u64) -> Result<Moe, InputError> {
        let experts = positive(file, "moe.experts", self.experts)?;
        let top_k = positive(file, "moe.top_k", self.top_k)?;
        if top_k > experts {
            return Err(InputError::invalid(
                file,
                "moe.top_k",
                format!("{top_k} exceeds the {experts} experts"),
            ));
        }
        let capacity_factor = self.capacity_factor.unwrap_or(1.0);
        let most = experts as f64 / top_k as f64;
        if !(capacity_factor > 0.0 && capacity_factor <= most) {
            return Err(InputError::invalid(
                file,
                "moe.capacity_factor",
                format!(
                    "must be positive and at most experts / top_k = {most} (every token \
                     fits at that), got {capacity_factor}"
                ),
            ));
        }
        let shared_experts = match self.shared_experts {
            None | Some(0) => 0,
            Some(n) => positive(file, "moe.shared_experts", n)?,
        };
        let expert_ffn_hidden = match self.expert_ffn_hidden {
            Some(n) => positive(file, "moe.expert_ffn_hidden", n)?,
            None => ffn_hidden,
        };
        let every = positive(file, "moe.every", self.every.unwrap_or(1))?;
        if every > layers {
            return Err(InputError::invalid(
                file,
                "moe.every",
                format!("{every} leaves none of the {layers} blocks with experts"),
            ));
        }
        Ok(Moe {
            experts,
            top_k,
            capacity_factor,
            shared_experts,
            expert_ffn_hidden,
            every,
        })
    }
}

impl RawTemplate {
    /// The family's block shape with the file's overrides.
    fn block_shape(&self, family: Family) -> BlockShape {
        let default = BlockShape::of(family);
        BlockShape {
            norm: self.norm.unwrap_or(default.norm),
            activation: self.activation.unwrap_or(default.activation),
            positions: self.positions.unwrap_or(default.positions),
            bias: self.bias.unwrap_or(default.bias),
            dropout: self.dropout.unwrap_or(default.dropout),
            tied_embeddings: self.tied_embeddings.unwrap_or(default.tied_embeddings),
            parallel: self.parallel_block.unwrap_or(default.parallel),
            softmax: self.attention_softmax.unwrap_or(default.softmax),
            cross_entropy: self.cross_entropy.unwrap_or(default.cross_entropy),
            qkv_bias: self.qkv_bias.unwrap_or(default.qkv_bias),
            tp_grad_overlap: self.tp_grad_overlap.unwrap_or(default.tp_grad_overlap),
        }
    }
}

/// Shape of one layer-graph request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub seq_len: u64,
    pub micro_batch: u64,
    pub tp: u64,
    pub sequence_parallel: bool,
    pub precision: Precision,
    /// The weight-gradient GEMMs accumulate into the main gradients themselves
    /// ([`Workload::gradient_accumulation_fusion`](super::Workload)).
    pub gradient_accumulation_fusion: bool,
}

impl Shape {
    fn tokens(&self) -> u64 {
        self.seq_len * self.micro_batch
    }
    /// Tokens a device holds outside the tensor-parallel regions (layernorm, dropout,
    /// residual): all of them, or 1/t of them under sequence parallelism.
    fn local_tokens(&self) -> u64 {
        if self.sequence_parallel {
            self.tokens() / self.tp
        } else {
            self.tokens()
        }
    }
    fn elem_bytes(&self) -> u32 {
        self.precision.bytes()
    }
    fn e(&self) -> u64 {
        u64::from(self.precision.bytes())
    }
}

/// Appends nodes and returns their indices.
struct Builder {
    nodes: Vec<Node>,
    /// Hidden size: collectives move s·b·h elements.
    hidden: u64,
    /// [`BlockShape::tp_grad_overlap`].
    tp_grad_overlap: bool,
}

impl Builder {
    fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }
    fn op(&mut self, op: Op, preds: &[usize], weight_operand: bool) -> usize {
        self.push(Node::op(op, preds.to_vec(), weight_operand))
    }
    /// A forward operator on `input` whose gradient passes straight through (no backward
    /// kernel of its own).
    fn forward_only(&mut self, op: Op, input: usize) -> usize {
        self.push(Node::new(Some(op), vec![input], Vec::new()))
    }
    /// A GEMM by a weight; with `bias`, its backward also sums the output gradient over the
    /// tokens (Megatron's linear layers: `grad_output.sum(0)`, a kernel of its own).
    fn linear(&mut self, op: Op, preds: &[usize], bias: bool) -> usize {
        let bias_grad = match op.kind {
            OpKind::Gemm { batch, m, n, .. } if bias => Some(column_sum(
                &format!("{}.bias_grad", op.name),
                batch * m * n,
                n,
                op.elem_bytes,
            )),
            _ => None,
        };
        let node = self.op(op, preds, true);
        self.nodes[node].leaf.extend(bias_grad);
        node
    }
    /// Megatron's `f` before a column-parallel GEMM: identity forward and all-reduce backward;
    /// under sequence parallelism an all-gather forward (reduce-scatter backward), whose result
    /// the backward gathers again for the consumers' weight gradients (Megatron-LM keeps only
    /// the shard: `.regather`). The backward collectives are asynchronous with
    /// [`BlockShape::tp_grad_overlap`].
    fn enter_parallel(&mut self, name: &str, input: usize, shape: &Shape) -> usize {
        if shape.tp == 1 {
            return input;
        }
        let asynchronous = self.tp_grad_overlap;
        let (fwd, grad, regather) = if shape.sequence_parallel {
            let gather = self.tp_collective(name, CollectiveKind::AllGather, shape);
            let scatter = collective_backward(&gather);
            let regather = Op {
                name: format!("{name}.regather"),
                asynchronous,
                ..gather.clone()
            };
            (Some(gather), scatter, Some(regather))
        } else {
            (
                None,
                self.tp_collective(name, CollectiveKind::AllReduce, shape),
                None,
            )
        };
        let grad = Op {
            asynchronous,
            ..grad
        };
        self.push(Node {
            regather,
            ..Node::new(fwd, vec![input], vec![(grad, Feeds::All)])
        })
    }
    /// Megatron's `g` after a row-parallel GEMM: all-reduce forward and identity backward;
    /// under sequence parallelism a reduce-scatter forward (all-gather backward).
    fn leave_parallel(&mut self, name: &str, input: usize, shape: &Shape) -> usize {
        if shape.tp == 1 {
            return input;
        }
        let kind = if shape.sequence_parallel {
            CollectiveKind::ReduceScatter
        } else {
            CollectiveKind::AllReduce
        };
        let op = self.tp_collective(name, kind, shape);
        if shape.sequence_parallel {
            self.op(op, &[input], false)
        } else {
            self.forward_only(op, input)
        }
    }
    /// A tensor-parallel collective over the s·b·h activations of the group of `t` devices.
    fn tp_collective(&self, name: &str, kind: CollectiveKind, shape: &Shape) -> Op {
        let bytes = mul(&[shape.tokens(), self.hidden, shape.e()]);
        collective(name, kind, bytes, shape.tp as u32, shape.elem_bytes())
    }
}

impl Template {
    /// An empty graph builder for this template's layers.
    fn builder(&self) -> Builder {
        Builder {
            nodes: Vec::new(),
            hidden: self.hidden,
            tp_grad_overlap: self.block.tp_grad_overlap,
        }
    }

    /// Width of the queries (and of the attention output): heads × head size, which equals
    /// the hidden size unless the file gives `head_dim` (PaLM 540B: 48 × 256 < 18432).
    fn attention_width(&self) -> u64 {
        self.heads * self.head_dim
    }
    /// Key/value heads one device of a tensor group of `tp` holds: its share, or, when the
    /// group is wider than the key/value heads, the one its query heads read (K/V replicated
    /// across the `tp / kv_heads` devices sharing it, as PaLM does for multi-query attention).
    fn kv_heads_per_device(&self, tp: u64) -> u64 {
        (self.kv_heads / tp).max(1)
    }
    /// Devices of a tensor group of `tp` holding the same key/value head (1: none replicated).
    fn kv_replicas(&self, tp: u64) -> u64 {
        (tp / self.kv_heads).max(1)
    }
    /// Width of the fused Q, K, V projection on one device at tensor width `tp`.
    fn qkv_width(&self, tp: u64) -> u64 {
        self.attention_width() / tp + 2 * self.kv_heads_per_device(tp) * self.head_dim
    }
    fn norm(&self) -> VectorOp {
        match self.block.norm {
            Norm::RmsNorm => VectorOp::RmsNorm,
            Norm::LayerNorm => VectorOp::LayerNorm,
        }
    }
    /// Parameter tensors of one normalisation layer: the scale, plus the shift of a LayerNorm
    /// with biases.
    fn norm_tensors(&self) -> Vec<u64> {
        match self.block.norm {
            Norm::LayerNorm if self.block.bias => vec![self.hidden; 2],
            _ => vec![self.hidden],
        }
    }
    fn has_dropout(&self) -> bool {
        self.block.dropout
    }
    fn has_bias(&self) -> bool {
        self.block.bias
    }
    /// Learned position-embedding rows (OPT reserves 2 extra; rotary positions have none).
    fn position_rows(&self, seq_len: u64) -> u64 {
        match (self.block.positions, self.family) {
            (Positions::Rotary, _) => 0,
            (Positions::Learned, Family::Opt) => seq_len + 2,
            (Positions::Learned, _) => seq_len,
        }
    }
    /// Vocabulary rows one device holds: Megatron pads V to a multiple of t.
    fn vocab_per_device(&self, tp: u64) -> u64 {
        self.vocab.div_ceil(tp)
    }

    /// Why width `tp` cannot slice this model, if it cannot.
    pub(crate) fn tp_error(
        &self,
        tp: u64,
        seq_len: u64,
        sequence_parallel: bool,
    ) -> Option<String> {
        if tp == 0 {
            return Some("must be at least 1".to_string());
        }
        let expert_ffn = self.moe.map_or(self.ffn_hidden, |m| m.expert_ffn_hidden);
        let checks = [
            ("heads", self.heads),
            ("ffn_hidden", self.ffn_hidden),
            ("moe.expert_ffn_hidden", expert_ffn),
        ];
        for (what, value) in checks {
            if value % tp != 0 {
                return Some(format!(
                    "tensor-parallel width {tp} does not divide {what} = {value}"
                ));
            }
        }
        if !self.kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(self.kv_heads) {
            return Some(format!(
                "tensor-parallel width {tp} neither divides kv_heads = {} nor is a multiple of \
                 it (key/value heads are either split across the group or replicated in it)",
                self.kv_heads
            ));
        }
        if sequence_parallel && !seq_len.is_multiple_of(tp) {
            return Some(format!(
                "sequence parallelism needs tensor-parallel width {tp} to divide seq_len = {seq_len}"
            ));
        }
        None
    }

    /// Why micro-batch `micro_batch` makes some per-device size too large to count exactly
    /// in 64-bit integers, if it does (the largest are the attention scores, the FFN
    /// activations and the fp32 logits).
    pub(crate) fn size_error(&self, seq_len: u64, micro_batch: u64) -> Option<String> {
        let tokens = seq_len as f64 * micro_batch as f64;
        let largest = [
            tokens * seq_len as f64 * self.heads as f64 * 9.0,
            tokens * self.ffn_hidden as f64 * 16.0,
            tokens * self.vocab as f64 * 4.0,
            tokens * self.hidden.max(self.attention_width()) as f64 * 64.0,
            self.moe.map_or(0.0, |m| {
                tokens
                    * m.capacity_factor
                    * (m.top_k * m.expert_ffn_hidden.max(self.hidden)) as f64
                    * 16.0
            }),
        ]
        .into_iter()
        .fold(0.0, f64::max);
        (largest > 2f64.powi(62)).then(|| {
            format!("{micro_batch} samples of {seq_len} tokens give tensors beyond 2^62 bytes")
        })
    }

    fn up_projections(&self) -> u64 {
        if self.block.activation.gated() {
            2
        } else {
            1
        }
    }

    /// Parameter tensors of `count` feed-forward networks of width `width` at tensor width
    /// `tp`, each: the column-parallel up projection (with the gate, fused as Megatron-LM
    /// fuses them) and its bias sliced, the row-parallel down projection whole along its
    /// output and its bias replicated.
    fn ffn_tensors(&self, count: u64, width: u64, tp: u64) -> Vec<u64> {
        let up = self.up_projections();
        let h = self.hidden;
        let mut one = vec![up * h * width / tp, h * width / tp];
        if self.has_bias() {
            one.extend([up * width / tp, h]);
        }
        let copies = usize::try_from(count).unwrap_or(usize::MAX);
        one.repeat(copies)
    }

    /// Parameter tensors of one transformer block held by one device at width `tp`: the
    /// norms, the fused QKV projection and the output projection (the QKV bias sliced, the
    /// projection's replicated) and the feed-forward networks; with `experts`, the
    /// mixture-of-experts block (router, shared experts and all routed experts).
    pub(crate) fn block_tensors(&self, tp: u64, experts: bool) -> Vec<u64> {
        let h = self.hidden;
        let norms = if self.block.parallel { 1 } else { 2 };
        let mut tensors = self.norm_tensors().repeat(norms);
        tensors.extend([h * self.qkv_width(tp), self.attention_width() / tp * h]);
        if self.has_bias() {
            tensors.extend([self.qkv_width(tp), h]);
        }
        match self.moe {
            Some(m) if experts => {
                tensors.push(m.experts * h);
                tensors.extend(self.ffn_tensors(m.shared_experts, m.expert_ffn_hidden, tp));
                tensors.extend(self.ffn_tensors(m.experts, m.expert_ffn_hidden, tp));
            }
            _ => tensors.extend(self.ffn_tensors(1, self.ffn_hidden, tp)),
        }
        tensors
    }

    /// Parameters of one transformer block held by one device at width `tp`; with `experts`,
    /// the mixture-of-experts block (all its experts, [`Template::expert_params`] of them).
    pub(crate) fn block_params(&self, tp: u64, experts: bool) -> u64 {
        self.block_tensors(tp, experts).iter().sum()
    }

    /// The routed experts' parameters of a mixture-of-experts block on one device at width
    /// `tp`, before expert parallelism divides them.
    pub(crate) fn expert_params(&self, tp: u64) -> u64 {
        self.moe.map_or(0, |m| {
            self.ffn_tensors(m.experts, m.expert_ffn_hidden, tp)
                .iter()
                .sum()
        })
    }

    /// Blocks with experts.
    fn expert_blocks(&self) -> u64 {
        self.moe.map_or(0, |m| self.layers / m.every)
    }

    /// Parameters of one block that each device holds together with the other devices of its
    /// tensor group sharing its key/value head: the K/V projections (and their biases) when the
    /// group is wider than the key/value heads; 0 otherwise.
    pub(crate) fn block_replicated_params(&self, tp: u64) -> u64 {
        if self.kv_replicas(tp) == 1 {
            return 0;
        }
        let kv = 2 * self.head_dim;
        kv * self.hidden + if self.has_bias() { kv } else { 0 }
    }

    /// Parameter tensors of the embedding layer per device: the (vocab-parallel) token table
    /// and the replicated position table where positions are learned; BERT adds its two
    /// token-type rows and its embedding layernorm.
    pub(crate) fn embedding_tensors(&self, seq_len: u64, tp: u64) -> Vec<u64> {
        let h = self.hidden;
        let mut tensors = vec![self.vocab_per_device(tp) * h];
        let positions = self.position_rows(seq_len);
        if positions > 0 {
            tensors.push(positions * h);
        }
        if self.family == Family::Bert {
            tensors.push(2 * h);
            tensors.extend(self.norm_tensors());
        }
        tensors
    }

    /// Parameter tensors of the head per device: the final norm (BERT: the masked-LM
    /// transform, a dense layer and its bias and a layernorm, and the decoder bias), and an
    /// output projection of its own where the embeddings are not tied (with a bias where the
    /// model has biases). Tied output embeddings are counted once, in the embedding layer;
    /// BERT's pooler is not modelled.
    pub(crate) fn head_tensors(&self, tp: u64) -> Vec<u64> {
        let h = self.hidden;
        let vocab = self.vocab_per_device(tp);
        let mut tensors = match self.family {
            Family::Bert => {
                let mut transform = vec![h * h, h];
                transform.extend(self.norm_tensors());
                transform.push(vocab);
                transform
            }
            _ => self.norm_tensors(),
        };
        if !self.block.tied_embeddings {
            tensors.push(vocab * h);
            if self.has_bias() && self.family != Family::Bert {
                tensors.push(vocab);
            }
        }
        tensors
    }

    pub(crate) fn total_params(&self, seq_len: u64) -> u64 {
        let experts = self.expert_blocks();
        let sum = |tensors: Vec<u64>| tensors.iter().sum::<u64>();
        sum(self.embedding_tensors(seq_len, 1))
            + (self.layers - experts) * self.block_params(1, false)
            + experts * self.block_params(1, true)
            + sum(self.head_tensors(1))
    }

    /// Korthikanti et al. 2022 activation memory of one block, generalised to GQA/MQA (K/V
    /// replicated where t exceeds the key/value heads), any head size and FFN width, gated
    /// activations, the parallel block, no-dropout models and any element size. For a GPT
    /// block in 16-bit it is exactly s·b·h·(34 + 5as/h) (t = 1), s·b·h·(10 + 24/t + 5as/(ht))
    /// (TP) and s·b·h·(34/t + 5as/(ht)) (TP + SP); selective drops the as² terms; full keeps
    /// the input.
    pub(crate) fn block_activation_bytes(&self, shape: &Shape, experts: bool) -> ActivationBytes {
        let e = shape.e();
        let tp = shape.tp;
        let h = self.hidden;
        let tokens = shape.tokens();
        let local = shape.local_tokens();
        let drop = u64::from(self.has_dropout());
        // Outside the parallel regions (replicated, or sliced by SP): per branch point a norm
        // input and the column-parallel GEMMs' input, and a 1-byte mask per dropout (two of
        // each in a sequential block, one in a parallel block).
        let branch_points = if self.block.parallel { 1 } else { 2 };
        let outside = branch_points * local * h * (2 * e + drop);
        // Inside (sliced by t, K/V per device): Q and K, V, the projection input, the FFN
        // activation's inputs and the down-projection input.
        let q = self.attention_width() / tp;
        let kv = self.kv_heads_per_device(tp) * self.head_dim;
        let ffn_inputs = self.up_projections();
        let attention_inside = tokens * e * ((q + kv) + kv + q);
        // A feed-forward network keeps its activation's inputs and the down projection's.
        let ffn_inside = |tokens: u64, width: u64| tokens * e * (ffn_inputs + 1) * width / tp;
        let inside = attention_inside
            + match self.moe {
                // The experts also keep their dispatched input, and the router its fp32
                // probabilities.
                Some(m) if experts => {
                    let routed = m.routed_tokens(tokens);
                    routed * h * e
                        + ffn_inside(routed, m.expert_ffn_hidden)
                        + ffn_inside(tokens, m.shared_experts * m.expert_ffn_hidden)
                        + tokens * m.experts * 4
                }
                _ => ffn_inside(tokens, self.ffn_hidden),
            };
        // Attention scores: softmax output (e), dropout mask (1) and dropout output (e); a
        // fused kernel keeps its rows' fp32 log-sum-exp instead, which selective recompute
        // drops as Megatron-Core's `core_attn` checkpoint does (it reruns the kernel's
        // forward; Q, K and V stay, the checkpoint's inputs, and its output is the
        // projection's input).
        let scores = mul(&[
            shape.micro_batch,
            self.heads / tp,
            shape.seq_len,
            shape.seq_len,
        ]);
        let attention = if self.block.softmax == AttentionSoftmax::Flash {
            4 * mul(&[shape.micro_batch, self.heads / tp, shape.seq_len])
        } else {
            scores * (e + drop * (1 + e))
        };
        let selective = outside + inside;
        ActivationBytes {
            none: selective + attention,
            selective,
            full: local * h * e,
        }
    }

    fn embedding_activation_bytes(&self, shape: &Shape) -> ActivationBytes {
        // Token ids (int32), the dropout mask and BERT's layernorm input. Full recompute
        // checkpoints the transformer layers only (Megatron-LM's `--recompute-granularity full`,
        // Korthikanti et al. §4 keep the embedding's dropout mask; PyTorch's profile of a
        // checkpointed iteration runs the embedding's kernels once): the embedding keeps them
        // and is not rerun.
        let ids = 4 * shape.tokens();
        let local = shape.local_tokens() * self.hidden;
        let kept = ids
            + local * u64::from(self.has_dropout())
            + if self.family == Family::Bert {
                local * shape.e()
            } else {
                0
            };
        ActivationBytes {
            none: kept,
            selective: kept,
            full: kept,
        }
    }

    fn head_activation_bytes(&self, shape: &Shape) -> ActivationBytes {
        // The head is never recomputed: norm (BERT: dense, GeLU, norm) inputs, the LM-head
        // input (gathered) and fp32 logits for the loss (4·s·b·V/t, Korthikanti §4.3).
        let e = shape.e();
        let local = shape.local_tokens() * self.hidden * e;
        let norm_inputs = if self.family == Family::Bert { 3 } else { 1 };
        let kept = norm_inputs * local
            + shape.tokens() * self.hidden * e
            + 4 * shape.tokens() * self.vocab_per_device(shape.tp);
        ActivationBytes {
            none: kept,
            selective: kept,
            full: kept,
        }
    }

    fn block_nodes(&self, shape: &Shape, experts: bool) -> Vec<Node> {
        let mut bld = self.builder();
        let e = shape.elem_bytes();
        let (h, tp) = (self.hidden, shape.tp);
        let (s, b) = (shape.seq_len, shape.micro_batch);
        let tokens = shape.tokens();
        let local = shape.local_tokens() * h;
        let d = self.head_dim;
        let q_width = self.attention_width() / tp;
        let kv_width = self.kv_heads_per_device(tp) * d;
        let heads = b * self.heads / tp;
        let f = self.ffn_hidden / tp;
        let bias = self.has_bias();
        let parallel = self.block.parallel;

        let ln1 = bld.op(vector("ln1", self.norm(), local, h, e), &[], false);
        let attn_in = if parallel {
            "tp_block_in"
        } else {
            "tp_attn_in"
        };
        let x = bld.enter_parallel(attn_in, ln1, shape);
        let qkv_width = self.qkv_width(tp);
        let mut qkv = bld.linear(gemm("qkv", 1, tokens, qkv_width, h, e), &[x], bias);
        if self.block.qkv_bias == QkvBias::AddKernel {
            // An in-place broadcast add streams the output once each way (priced as a scale:
            // one operand, the bias row staying in cache); its gradient passes straight through.
            let add = vector("qkv.bias_add", VectorOp::Scale, tokens * qkv_width, 1, e);
            qkv = bld.forward_only(add, qkv);
        }
        // q, k and v are views of the fused projection's output; its backward assembles their
        // three gradients into one tensor (Megatron-LM's split, PyTorch's unbind: a
        // concatenation kernel) before the projection's own backward.
        let concat = vector_in_pass(
            "qkv_split.bwd",
            VectorOp::Stack,
            Pass::Backward,
            tokens * qkv_width,
            1,
            e,
        );
        let qkv = bld.push(Node::new(None, vec![qkv], vec![(concat, Feeds::All)]));
        let qk_in = if self.block.positions == Positions::Rotary {
            let rotary = vector(
                "rotary",
                VectorOp::Rotary,
                tokens * (q_width + kv_width),
                d,
                e,
            );
            bld.op(rotary, &[qkv], false)
        } else {
            qkv
        };
        let context = if self.block.softmax == AttentionSoftmax::Flash {
            // One kernel each way over Q, K and V (its backward derived); its output is already
            // token-major, and its gradients go to the rotary kernel (Q, K) and the projection
            // (V).
            let shape = AttentionShape {
                heads,
                kv_heads: b * self.kv_heads_per_device(tp),
                seq_len: s,
                head_dim: d,
                causal: self.family != Family::Bert,
            };
            let inputs = if qk_in == qkv {
                vec![qkv]
            } else {
                vec![qk_in, qkv]
            };
            let fused = attention("attention", shape, Pass::Forward, e);
            bld.op(fused, &inputs, false)
        } else {
            self.score_path(&mut bld, qkv, qk_in, shape)
        };
        let proj = bld.linear(gemm("proj", 1, tokens, h, q_width, e), &[context], bias);
        // A sequential block finishes attention (all-reduce, dropout, residual) and normalises
        // again; a parallel block feeds the same normalised input to the feed-forward branch.
        let (ffn_in, residual) = if parallel {
            (x, None)
        } else {
            let y = bld.leave_parallel("tp_attn_out", proj, shape);
            let y = self.dropout(&mut bld, "dropout1", local, y, e);
            let add1 = bld.op(vector("residual1", VectorOp::Add, local, 1, e), &[y], false);
            let ln2 = bld.op(vector("ln2", self.norm(), local, h, e), &[add1], false);
            (bld.enter_parallel("tp_mlp_in", ln2, shape), Some(add1))
        };
        let down = match self.moe {
            Some(m) if experts => self.moe_nodes(&mut bld, ffn_in, &m, shape),
            _ => self.ffn_nodes(&mut bld, "ffn", tokens, f, &[ffn_in], e),
        };
        let y = if parallel {
            // Both branches' partial sums are added first, so one all-reduce (or
            // reduce-scatter) serves the block.
            let sum = bld.op(
                vector("branch_sum", VectorOp::Add, tokens * h, 1, e),
                &[proj, down],
                false,
            );
            bld.leave_parallel("tp_block_out", sum, shape)
        } else {
            bld.leave_parallel("tp_mlp_out", down, shape)
        };
        let y = self.dropout(&mut bld, "dropout2", local, y, e);
        let preds: Vec<usize> = std::iter::once(y).chain(residual).collect();
        bld.op(
            vector("residual2", VectorOp::Add, local, 1, e),
            &preds,
            false,
        );
        bld.nodes
    }

    /// The attention core as eager PyTorch and Megatron-LM's unfused attention run it, with
    /// the scores in HBM: QKᵀ, the softmax, its dropout, ×V and the context's transpose back to
    /// token-major rows, fed by `qk_in` (Q and K) and `qkv` (V); returns the context's node.
    fn score_path(&self, bld: &mut Builder, qkv: usize, qk_in: usize, shape: &Shape) -> usize {
        let e = shape.elem_bytes();
        let (s, d) = (shape.seq_len, self.head_dim);
        let heads = shape.micro_batch * self.heads / shape.tp;
        let tokens = shape.tokens();
        let q_width = self.attention_width() / shape.tp;
        // The scores' 1/√d rides on the QKᵀ GEMM in the forward (`baddbmm`'s alpha, as
        // Megatron-LM's unfused attention runs it); the GEMM's backward multiplies each of its
        // two operand gradients by it in a kernel of its own (PyTorch's autograd of
        // `baddbmm`).
        let operand_grad = |name: &str| {
            let op = vector_in_pass(name, VectorOp::Scale, Pass::Backward, heads * s * d, 1, e);
            (op, Feeds::All)
        };
        let qk_in = bld.push(Node::new(
            None,
            vec![qk_in],
            vec![operand_grad("q_scale.bwd"), operand_grad("k_scale.bwd")],
        ));
        let qk = bld.op(gemm("qk", heads, s, s, d, e), &[qk_in], false);
        let scores = heads * s * s;
        let softmax_op = if self.block.softmax == AttentionSoftmax::FusedCausal {
            VectorOp::CausalSoftmax
        } else {
            VectorOp::Softmax
        };
        let softmax = bld.op(vector("softmax", softmax_op, scores, s, e), &[qk], false);
        let probs = if self.has_dropout() {
            let dropout = vector("attn_dropout", VectorOp::Dropout, scores, 1, e);
            bld.op(dropout, &[softmax], false)
        } else {
            softmax
        };
        // Probabilities × V: the gradient of the probabilities goes back to the softmax side,
        // the gradient of V to the QKV projection.
        let av = gemm("av", heads, s, d, s, e);
        let grad = vec![
            (gemm_grad_a(&av, "grad_a"), Feeds::Only(vec![probs])),
            (gemm_grad_b(&av, "grad_b"), Feeds::Only(vec![qkv])),
        ];
        let av = bld.push(Node::new(Some(av), vec![probs, qkv], grad));
        // The context, batched by head, goes back to token-major rows for the projection. Its
        // gradient goes the other way as a view: the batched GEMMs' backward reads it strided,
        // and no copy kernel runs (PyTorch's profile of an iteration: one transpose per block
        // forward, none in the backward).
        let transpose = vector("context_transpose", VectorOp::Copy, tokens * q_width, 1, e);
        bld.forward_only(transpose, av)
    }

    /// A feed-forward network over `tokens` rows of width `width` (per device) fed by `inputs`:
    /// up (and gate) projections, the activation (times the up projection when gated) and the
    /// down projection, whose node it returns. Ops are named `{prefix}_up` and so on; the
    /// dense network's activation ops keep their bare names (`gelu`, `silu`, `swiglu_mul`).
    fn ffn_nodes(
        &self,
        bld: &mut Builder,
        prefix: &str,
        tokens: u64,
        width: u64,
        inputs: &[usize],
        e: u32,
    ) -> usize {
        let h = self.hidden;
        let bias = self.has_bias();
        let named = |name: &str| {
            if prefix == "ffn" {
                name.to_string()
            } else {
                format!("{prefix}_{name}")
            }
        };
        let act = match self.block.activation {
            Activation::Swiglu | Activation::Geglu => {
                let gate = bld.linear(
                    gemm(&format!("{prefix}_gate"), 1, tokens, width, h, e),
                    inputs,
                    bias,
                );
                let up = bld.linear(
                    gemm(&format!("{prefix}_up"), 1, tokens, width, h, e),
                    inputs,
                    bias,
                );
                let (name, op, product) = if self.block.activation == Activation::Swiglu {
                    ("silu", VectorOp::Silu, "swiglu_mul")
                } else {
                    ("gelu", VectorOp::Gelu, "geglu_mul")
                };
                let gated = bld.op(
                    vector(&named(name), op, tokens * width, 1, e),
                    &[gate],
                    false,
                );
                bld.op(
                    vector(&named(product), VectorOp::Mul, tokens * width, 1, e),
                    &[gated, up],
                    false,
                )
            }
            Activation::Gelu | Activation::Relu => {
                let up = bld.linear(
                    gemm(&format!("{prefix}_up"), 1, tokens, width, h, e),
                    inputs,
                    bias,
                );
                let (name, op) = if self.block.activation == Activation::Relu {
                    ("relu", VectorOp::Relu)
                } else {
                    ("gelu", VectorOp::Gelu)
                };
                bld.op(vector(&named(name), op, tokens * width, 1, e), &[up], false)
            }
        };
        bld.linear(
            gemm(&format!("{prefix}_down"), 1, tokens, h, width, e),
            &[act],
            bias,
        )
    }

    /// The mixture-of-experts feed-forward layer on one device: the router (a GEMM replicated
    /// in the tensor group, and a softmax over the experts), the experts over the token slots
    /// dispatched to the device (one grouped GEMM per projection, its experts' capacity
    /// together; each expert sliced by t like a dense network), the weighted combination of
    /// each token's `top_k` outputs, and the shared experts over every token. The all-to-alls
    /// that carry tokens to and from the experts depend on the expert-parallel width and are
    /// priced by the placement (`Layer::all_to_all_bytes`).
    fn moe_nodes(&self, bld: &mut Builder, input: usize, m: &Moe, shape: &Shape) -> usize {
        let e = shape.elem_bytes();
        let h = self.hidden;
        let tokens = shape.tokens();
        let width = m.expert_ffn_hidden / shape.tp;
        let router = bld.linear(gemm("router", 1, tokens, m.experts, h, e), &[input], false);
        let probs = bld.op(
            vector(
                "router_softmax",
                VectorOp::Softmax,
                tokens * m.experts,
                m.experts,
                e,
            ),
            &[router],
            false,
        );
        let routed = m.routed_tokens(tokens);
        let experts = self.ffn_nodes(bld, "expert", routed, width, &[input, probs], e);
        let combined = bld.op(
            vector("moe_combine", VectorOp::Mul, routed * h, 1, e),
            &[experts, probs],
            false,
        );
        if m.shared_experts == 0 {
            return combined;
        }
        let shared = self.ffn_nodes(bld, "shared", tokens, m.shared_experts * width, &[input], e);
        bld.op(
            vector("shared_add", VectorOp::Add, tokens * h, 1, e),
            &[combined, shared],
            false,
        )
    }

    /// A dropout over `elements` after `input`, where the model has dropout.
    fn dropout(&self, bld: &mut Builder, name: &str, elements: u64, input: usize, e: u32) -> usize {
        if self.has_dropout() {
            bld.op(
                vector(name, VectorOp::Dropout, elements, 1, e),
                &[input],
                false,
            )
        } else {
            input
        }
    }

    fn embedding_nodes(&self, shape: &Shape) -> Vec<Node> {
        let mut bld = self.builder();
        let e = shape.elem_bytes();
        let h = self.hidden;
        let local = shape.local_tokens() * h;
        // Vocab-parallel gather: each device looks up its slice of the table for every token,
        // then the partial rows are summed across the group.
        let gather = vector("embedding", VectorOp::Embedding, shape.tokens() * h, h, e);
        let x = bld.op(gather, &[], false);
        // With the GEMMs accumulating their own weight gradients, Megatron-LM's gradient hook
        // adds the table's gradient (its slice of the vocabulary) into the main gradient every
        // micro-batch, on any stage. Tied to the head without that fusion, autograd sums it
        // with the head's weight gradient where both share a stage: the head's
        // `Layer::tied` carries that add (`Workload::tied_grad_sum_ops`).
        if shape.gradient_accumulation_fusion {
            bld.nodes[x].leaf.push(vector(
                "embedding_table.grad_add",
                VectorOp::Add,
                self.vocab_per_device(shape.tp) * h,
                1,
                e,
            ));
        }
        let mut x = bld.leave_parallel("tp_embedding_out", x, shape);
        if self.block.positions == Positions::Learned {
            // Learned positions are added to the rows (a kernel of their own, as Megatron-LM
            // and PyTorch run it); the add passes its gradient through, and the position
            // table's gradient sums it over the sequences.
            let add = vector("embedding_position", VectorOp::Add, local, 1, e);
            x = bld.push(Node {
                leaf: vec![column_sum("embedding_position.wgrad", local, h, e)],
                ..Node::new(Some(add), vec![x], Vec::new())
            });
        }
        let x = if self.family == Family::Bert {
            bld.op(
                vector("embedding_norm", VectorOp::LayerNorm, local, h, e),
                &[x],
                false,
            )
        } else {
            x
        };
        if self.has_dropout() {
            bld.op(
                vector("embedding_dropout", VectorOp::Dropout, local, 1, e),
                &[x],
                false,
            );
        }
        bld.nodes
    }

    fn head_nodes(&self, shape: &Shape) -> Vec<Node> {
        let mut bld = self.builder();
        let e = shape.elem_bytes();
        let h = self.hidden;
        let local_tokens = shape.local_tokens();
        let local = local_tokens * h;
        let x = if self.family == Family::Bert {
            // Masked-LM transform: a replicated dense layer, GeLU and layernorm.
            let dense = bld.linear(
                gemm("mlm_dense", 1, local_tokens, h, h, e),
                &[],
                self.has_bias(),
            );
            let gelu = bld.op(
                vector("mlm_gelu", VectorOp::Gelu, local, 1, e),
                &[dense],
                false,
            );
            bld.op(
                vector("mlm_norm", VectorOp::LayerNorm, local, h, e),
                &[gelu],
                false,
            )
        } else {
            bld.op(vector("final_norm", self.norm(), local, h, e), &[], false)
        };
        let x = bld.enter_parallel("tp_head_in", x, shape);
        let vocab = self.vocab_per_device(shape.tp);
        let mut logits = bld.op(gemm("lm_head", 1, shape.tokens(), vocab, h, e), &[x], true);
        // The loss runs over fp32 logits, as mixed-precision training computes it and as the
        // memory model keeps them (4·s·b·V/t above): a cast up first (Megatron-LM's
        // `output.float()`), whose backward casts the logits' gradient back down.
        if e < 4 {
            logits = bld.op(
                vector(
                    "logits_to_fp32",
                    VectorOp::Cast,
                    shape.tokens() * vocab,
                    1,
                    e,
                ),
                &[logits],
                false,
            );
        }
        match self.block.cross_entropy {
            CrossEntropyKernels::Fused => {
                let loss = vector(
                    "cross_entropy",
                    VectorOp::CrossEntropy,
                    shape.tokens() * vocab,
                    vocab,
                    4,
                );
                bld.op(loss, &[logits], false);
            }
            CrossEntropyKernels::VocabParallel => {
                vocab_parallel_cross_entropy(&mut bld, logits, shape.tokens(), vocab, shape.tp);
            }
        }
        bld.nodes
    }

    /// Shape-determining values shared by the signatures of this template's layers.
    fn signature_tail(&self, shape: &Shape) -> String {
        let mut tail = format!(
            "h{} a{} kv{} f{} v{} s{} b{} t{} sp{} {}",
            self.hidden,
            self.heads,
            self.kv_heads,
            self.ffn_hidden,
            self.vocab,
            shape.seq_len,
            shape.micro_batch,
            shape.tp,
            u8::from(shape.sequence_parallel),
            shape.precision.name()
        );
        // What the family's defaults leave out, only where a file changed it.
        if self.head_dim * self.heads != self.hidden {
            tail.push_str(&format!(" d{}", self.head_dim));
        }
        if self.block != BlockShape::of(self.family) {
            tail.push(' ');
            tail.push_str(&self.block.tag());
        }
        // The embedding adds its table's gradient into the main gradient only with fusion.
        if !shape.gradient_accumulation_fusion {
            tail.push_str(" gaf0");
        }
        if let Some(m) = self.moe {
            tail.push_str(&format!(
                " moe{}x{} c{} shared{} fe{} every{}",
                m.experts,
                m.top_k,
                m.capacity_factor,
                m.shared_experts,
                m.expert_ffn_hidden,
                m.every
            ));
        }
        tail
    }

    /// The layer graph at one shape: embedding, the L blocks (one shared operator graph) and
    /// the head, as a chain. The caller has checked the shape with [`Template::tp_error`].
    pub(crate) fn layer_graph(&self, shape: &Shape) -> LayerGraph {
        let family = self.family.name();
        let tail = self.signature_tail(shape);
        let hidden_bytes = mul(&[shape.local_tokens(), self.hidden, shape.e()]);
        let make = |name: String, kind: &str, nodes: Vec<Node>, tensors: Vec<u64>, act, out| {
            let (fwd, bwd) = build_graphs(&nodes);
            Layer {
                name,
                signature: format!("{family}-{kind} {tail}"),
                fwd: Arc::new(fwd),
                bwd: Arc::new(bwd),
                params: tensors.iter().sum(),
                param_tensors: tensors,
                activation_bytes: act,
                output_bytes: out,
                replicated: ReplicatedParams::default(),
                expert_params: 0,
                all_to_all_bytes: 0,
                tied: None,
            }
        };
        let mut layers = Vec::with_capacity(self.layers as usize + 2);
        layers.push(make(
            "embedding".to_string(),
            "embedding",
            self.embedding_nodes(shape),
            self.embedding_tensors(shape.seq_len, shape.tp),
            self.embedding_activation_bytes(shape),
            hidden_bytes,
        ));
        let replicated = ReplicatedParams {
            params: self.block_replicated_params(shape.tp),
            group: self.kv_replicas(shape.tp) as u32,
        };
        let block = Layer {
            replicated,
            ..make(
                "block".to_string(),
                "block",
                self.block_nodes(shape, false),
                self.block_tensors(shape.tp, false),
                self.block_activation_bytes(shape, false),
                hidden_bytes,
            )
        };
        let expert_block = self.moe.map(|m| Layer {
            replicated,
            expert_params: self.expert_params(shape.tp),
            all_to_all_bytes: mul(&[m.routed_tokens(shape.tokens()), self.hidden, shape.e()]),
            ..make(
                "block".to_string(),
                "moe-block",
                self.block_nodes(shape, true),
                self.block_tensors(shape.tp, true),
                self.block_activation_bytes(shape, true),
                hidden_bytes,
            )
        });
        for i in 0..self.layers {
            let prototype = match (&expert_block, self.moe) {
                (Some(expert_block), Some(m)) if m.has_experts(i) => expert_block,
                _ => &block,
            };
            layers.push(Layer {
                name: format!("block{i}"),
                ..prototype.clone()
            });
        }
        // The head's output is the fp32 loss of each sample. Tied to the input embeddings, its
        // projection is the embedding layer's vocabulary table (layer 0).
        layers.push(Layer {
            tied: self.block.tied_embeddings.then(|| TiedUse {
                owner: 0,
                tensors: vec![self.vocab_per_device(shape.tp) * self.hidden],
            }),
            ..make(
                "head".to_string(),
                "head",
                self.head_nodes(shape),
                self.head_tensors(shape.tp),
                self.head_activation_bytes(shape),
                4 * shape.micro_batch,
            )
        });
        let edges = (1..layers.len())
            .map(|j| (j - 1, j, hidden_bytes))
            .collect();
        LayerGraph {
            layers,
            edges,
            tp: shape.tp as u32,
            micro_batch: shape.micro_batch as u32,
            sequence_parallel: shape.sequence_parallel,
        }
    }
}
