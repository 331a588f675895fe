//! Models to train: workload files, the generated operator and layer graphs, and memory facts.
//!
//! A workload is either a transformer template (`.toml`, see [`Template`]) expanded into
//! Megatron-sliced layer graphs, or a user-given operator DAG (`.json`, see [`Dag`]). The file
//! formats and formulas are documented in `docs/workloads.md`.
//!
//! Besides the forward graphs: tensor-parallel slicing; backward graphs (with Megatron-LM's
//! layout copies — context transpose, QKV-gradient concatenation — and the loss over fp32
//! logits after a cast up, whose backward casts the gradient down); the optimizer step's kernels
//! (`optimizer_step_ops`: in mixed precision gradients cast up, the loss scale taken off them
//! and their norm for clipping where the recipe says so, Adam, weights cast down); the gradient
//! accumulation kernels (`grad_accumulation_ops`, unless the workload fuses them into the
//! GEMMs), per layer or per parameter tensor (`param_kernels`).
//! `graph.rs` holds the `OpGraph` / `LayerGraph` types all later stages consume.

mod dag;
mod graph;
mod ops;
mod template;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{parse_json, parse_toml, read_input, InputError};
pub use crate::vocab::{Pass, VectorOp, VectorTraffic};
pub use dag::{Dag, DagGraph, DagLayer, DagOp, Scale};
pub use graph::*;
pub use template::{AttentionSoftmax, BlockShape, CrossEntropyKernels, QkvBias, Template};
use template::{RawTemplate, Shape};

/// Transformer families the templates generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// GPT-2/3 (Megatron): LayerNorm, GeLU, learned positions, tied embeddings.
    Gpt,
    /// BERT: like GPT but bidirectional, with token-type embeddings and a masked-LM head.
    Bert,
    /// OPT: LayerNorm, ReLU, learned positions offset by 2, tied embeddings.
    Opt,
    /// Llama: RMSNorm, SwiGLU, rotary positions, grouped-query attention, untied head.
    Llama,
}

impl Family {
    fn parse(text: &str) -> Option<Family> {
        match text {
            "gpt" => Some(Family::Gpt),
            "bert" => Some(Family::Bert),
            "opt" => Some(Family::Opt),
            "llama" => Some(Family::Llama),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Family::Gpt => "gpt",
            Family::Bert => "bert",
            Family::Opt => "opt",
            Family::Llama => "llama",
        }
    }
}

/// Numeric format of weights and activations during training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

impl Precision {
    /// Bytes per element.
    pub fn bytes(self) -> u32 {
        match self {
            Precision::Fp32 => 4,
            Precision::Bf16 | Precision::Fp16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    fn parse(text: &str) -> Option<Precision> {
        match text {
            "fp32" => Some(Precision::Fp32),
            "bf16" => Some(Precision::Bf16),
            "fp16" => Some(Precision::Fp16),
            _ => None,
        }
    }

    /// A workload file's `grad_precision` for weights in `self`: absent, the weights'
    /// precision; else that or fp32, a gradient no narrower than its weight.
    fn read_grads(self, file: &Path, text: Option<&str>) -> Result<GradPrecision, InputError> {
        let Some(text) = text else {
            return Ok(GradPrecision::Weights);
        };
        match Precision::parse(text) {
            Some(grads) if grads == self => Ok(GradPrecision::Weights),
            Some(Precision::Fp32) => Ok(GradPrecision::Fp32),
            Some(_) => {
                let expected = match self {
                    Precision::Fp32 => "fp32".to_string(),
                    narrow => format!("{} or fp32", narrow.name()),
                };
                Err(InputError::invalid(
                    file,
                    "grad_precision",
                    format!(
                        "`{text}` gradients for {} weights; expected {expected}",
                        self.name()
                    ),
                ))
            }
            None => Err(InputError::invalid(
                file,
                "grad_precision",
                format!("unknown precision `{text}`; expected one of fp32, bf16, fp16"),
            )),
        }
    }
}

/// The gradients' format: the weights' ([`Precision`]) or fp32 beside narrower weights
/// (Megatron-LM's `--accumulate-allreduce-grads-in-fp32`, its default in bf16; the gradients of
/// PyTorch autocast's fp32 parameters). Never narrower than the weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GradPrecision {
    #[default]
    Weights,
    Fp32,
}

/// Optimizer, which sets the per-parameter state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    Sgd,
    Adam,
}

impl Optimizer {
    fn parse(text: &str) -> Option<Optimizer> {
        match text {
            "sgd" => Some(Optimizer::Sgd),
            "adam" => Some(Optimizer::Adam),
            _ => None,
        }
    }
}

/// How the kernels that visit every parameter outside the optimizer's fused update are
/// launched: the casts between the weights and the fp32 main copies and the gradient
/// accumulation (`param_kernels` in a workload file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ParamKernels {
    /// One kernel per layer's parameters: multi-tensor kernels or contiguous buffers, as
    /// Megatron-LM has them.
    #[default]
    PerLayer,
    /// One kernel per parameter tensor: a PyTorch loop over the parameters (`copy_` to and
    /// from the main copies, `AccumulateGrad`), as collect.py's training step has it.
    PerTensor,
    /// The gradients' kernels per tensor (accumulation, the cast up to the main copy), the
    /// weights' copy back per layer: the Megatron-LM of 2021, whose optimizer casts each
    /// gradient up in a loop and copies the weights back with a multi-tensor kernel.
    PerTensorGrads,
}

/// The value of an optional text field of workload `file` named in `choices`, the first one
/// where the field is absent; any other text is refused naming the field and the choices.
fn read_choice<T: Copy>(
    file: &Path,
    field: &str,
    text: Option<&str>,
    choices: &[(&str, T)],
) -> Result<T, InputError> {
    let Some(text) = text else {
        return Ok(choices[0].1);
    };
    choices
        .iter()
        .find(|(name, _)| *name == text)
        .map(|&(_, value)| value)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
            InputError::invalid(
                file,
                field,
                format!(
                    "unknown value `{text}`; expected one of {}",
                    names.join(", ")
                ),
            )
        })
}

impl ParamKernels {
    /// The `param_kernels` field of workload `file` (absent: per layer).
    fn read(file: &Path, text: Option<&str>) -> Result<ParamKernels, InputError> {
        read_choice(
            file,
            "param_kernels",
            text,
            &[
                ("per_layer", ParamKernels::PerLayer),
                ("per_tensor", ParamKernels::PerTensor),
                ("per_tensor_grads", ParamKernels::PerTensorGrads),
            ],
        )
    }

    /// Whether the kernels over the parameters' gradients (`grads`) or weights run per tensor.
    fn per_tensor(self, grads: bool) -> bool {
        match self {
            ParamKernels::PerLayer => false,
            ParamKernels::PerTensor => true,
            ParamKernels::PerTensorGrads => grads,
        }
    }
}

/// The data-parallel wrapper that owns the gradients, and the work it does on them every
/// iteration besides the all-reduce (`ddp` in a workload file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ddp {
    /// The gradients are the parameters' own, released after each step (PyTorch's
    /// `zero_grad(set_to_none=True)`): the first micro-batch's are kept as computed, with no
    /// kernel of their own.
    #[default]
    None,
    /// PyTorch's `DistributedDataParallel`: in the last micro-batch's backward each gradient is
    /// copied into its all-reduce bucket, divided by the copies (`mul_out`), and copied back
    /// after the bucket's all-reduce, a kernel per parameter tensor each way.
    Torch,
    /// Megatron-LM's own `DistributedDataParallel` (`--DDP-impl local`, Megatron-Core's):
    /// the gradients live in one contiguous buffer, zeroed before each iteration
    /// (`zero_grad_buffer`, one kernel over the buffer); without gradient-accumulation fusion
    /// every micro-batch, the first too, adds its gradients into it.
    Megatron,
    /// The same without contiguous buffers (Megatron-LM's `--DDP-impl local` before they
    /// became the default in 2022): after the backward the gradients are flattened into one
    /// tensor (`_flatten_dense_tensors`), divided by the copies, all-reduced and copied back
    /// tensor by tensor.
    MegatronCoalesced,
}

impl Ddp {
    /// Every wrapper, in declaration order.
    pub const ALL: [Ddp; 4] = [Ddp::None, Ddp::Torch, Ddp::Megatron, Ddp::MegatronCoalesced];

    /// The name workload files and CSVs use (also its serde name, which run-plans files read).
    pub fn name(self) -> &'static str {
        match self {
            Ddp::None => "none",
            Ddp::Torch => "torch",
            Ddp::Megatron => "megatron",
            Ddp::MegatronCoalesced => "megatron_coalesced",
        }
    }

    /// The `ddp` field of workload `file` (absent: none).
    fn read(file: &Path, text: Option<&str>) -> Result<Ddp, InputError> {
        read_choice(file, "ddp", text, &Ddp::ALL.map(|d| (d.name(), d)))
    }
}

/// What full recompute reruns of a checkpointed layer's forward in the backward
/// (`checkpoint` in a workload file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// The whole forward: Megatron-LM's checkpointing, PyTorch's reentrant checkpoint.
    #[default]
    Rerun,
    /// The forward up to its last operator that keeps a tensor for the backward
    /// ([`Op::saves_for_backward`]): PyTorch's non-reentrant checkpoint
    /// (`use_reentrant=False`, collect.py's training step) stops recomputing once it has
    /// rebuilt every saved tensor, so a block's trailing residual add is not rerun.
    StopEarly,
}

impl Checkpoint {
    /// The `checkpoint` field of workload `file` (absent: rerun).
    fn read(file: &Path, text: Option<&str>) -> Result<Checkpoint, InputError> {
        read_choice(
            file,
            "checkpoint",
            text,
            &[
                ("rerun", Checkpoint::Rerun),
                ("stop_early", Checkpoint::StopEarly),
            ],
        )
    }

    /// How many of the last operators of forward `fwd` full recompute does not rerun.
    pub fn skipped_ops(self, fwd: &OpGraph) -> usize {
        match self {
            Checkpoint::Rerun => 0,
            Checkpoint::StopEarly => fwd
                .ops
                .iter()
                .rev()
                .take_while(|op| !op.saves_for_backward())
                .count(),
        }
    }
}

/// `op` launched as a multi-tensor kernel.
fn multi_tensor(op: Op) -> Op {
    Op {
        launches: Launches::MultiTensor,
        ..op
    }
}

/// Bytes held per model parameter, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BytesPerModelParam {
    /// Working weights (at the training precision).
    pub weights: u32,
    /// Gradients (at the training precision).
    pub grads: u32,
    /// Optimizer state: Adam in mixed precision keeps fp32 master weights, momentum and
    /// variance (12 B); in fp32 momentum and variance (8 B). Plain SGD keeps none.
    pub optimizer: u32,
}

impl BytesPerModelParam {
    pub fn total(self) -> u32 {
        self.weights + self.grads + self.optimizer
    }
}

/// How the model is described.
#[derive(Debug, Clone, PartialEq)]
pub enum Model {
    /// A transformer template expanded by the generator.
    Template(Template),
    /// A user-given operator DAG, per device and per sample.
    Dag(Dag),
}

/// A model and its training setup.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    /// Samples per optimizer step.
    pub global_batch: u64,
    /// Tokens per sample.
    pub seq_len: u64,
    pub precision: Precision,
    /// The format the gradients are accumulated, stored, all-reduced and handed to the
    /// optimizer in (`grad_precision` in a workload file; default the weights');
    /// [`Workload::grad_precision`] names it.
    pub grads: GradPrecision,
    pub optimizer: Optimizer,
    /// Whether each step takes a dynamic loss scale off the gradients and checks them for
    /// infinities (`loss_scaling` in a workload file; default: in fp16, whose gradients would
    /// underflow without it).
    pub loss_scaling: bool,
    /// Whether each step computes the gradient norm to clip by (`gradient_clipping` in a
    /// workload file; default true, as Megatron-LM and most LLM recipes clip).
    pub gradient_clipping: bool,
    /// Whether the weight-gradient GEMMs add into the iteration's gradients themselves
    /// (`gradient_accumulation_fusion` in a workload file; default true, as Megatron-LM has
    /// done by default since 2022): otherwise every micro-batch after a copy's first adds its
    /// weight gradients with a kernel of its own ([`Workload::grad_accumulation_ops`]:
    /// PyTorch's `AccumulateGrad`, the Megatron-LM of the 2021 published runs).
    pub gradient_accumulation_fusion: bool,
    /// Whether the per-parameter casts and gradient accumulation run a kernel per layer or
    /// per parameter tensor (`param_kernels`; default per layer).
    pub param_kernels: ParamKernels,
    /// The data-parallel wrapper's per-iteration gradient work (`ddp`; default none).
    pub ddp: Ddp,
    /// What full recompute reruns of a layer's forward (`checkpoint`; default the whole of
    /// it).
    pub checkpoint: Checkpoint,
    pub model: Model,
    /// The file it was loaded from (named in errors).
    pub source: PathBuf,
}

/// One call of a kernel of `kind` as an operator: its FLOPs and the bytes it reads and writes,
/// counted as the generated graphs count them (a measured kernel's working set).
pub fn kernel_op(kind: OpKind, elem_bytes: u32) -> Op {
    let name = "kernel";
    match kind {
        OpKind::Gemm { batch, m, n, k } => ops::gemm(name, batch, m, n, k, elem_bytes),
        OpKind::Vector {
            op,
            elements,
            row_len,
            pass,
        } => ops::vector_in_pass(name, op, pass, elements, row_len, elem_bytes),
        OpKind::Collective {
            collective,
            bytes,
            group,
        } => ops::collective(name, collective, bytes, group, elem_bytes),
        OpKind::Attention { shape, pass } => ops::attention(name, shape, pass, elem_bytes),
    }
}

/// Longest workload name: names become directory names (`compare`'s sweeps) and CSV cells.
const MAX_NAME_LEN: usize = 100;

/// A workload's name names files and directories, so it is one plain path component: letters,
/// digits, `.`, `_`, `-` and `+`, not starting with a dot.
fn check_name(path: &Path, name: &str) -> Result<(), InputError> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+');
    if name.is_empty()
        || name.len() > MAX_NAME_LEN
        || name.starts_with('.')
        || !name.chars().all(plain)
    {
        return Err(InputError::invalid(
            path,
            "name",
            format!(
                "`{name}` is not a plain name: use 1 to {MAX_NAME_LEN} letters, digits, `.`, \
                 `_`, `-` or `+`, not starting with `.` (it names output directories)"
            ),
        ));
    }
    Ok(())
}

/// The sizes of a GPT given as numbers rather than a file (a published run, a measured block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptSizes {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub vocab: u64,
    pub seq_len: u64,
    pub global_batch: u64,
}

impl Workload {
    /// A GPT (multi-head attention, 4h feed-forward) trained with Adam at `precision`,
    /// validated as a workload file is; errors name `source` and the field.
    pub fn gpt(
        name: &str,
        source: &Path,
        sizes: GptSizes,
        precision: Precision,
    ) -> Result<Workload, InputError> {
        RawTemplate::gpt(name, sizes, precision).validate(source)
    }

    /// Loads a workload: `.toml` is a model template, `.json` an operator DAG.
    pub fn load(path: &Path) -> Result<Workload, InputError> {
        let text = read_input(path)?;
        let workload = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => parse_toml::<RawTemplate>(path, &text)?.validate(path),
            Some("json") => parse_json::<dag::RawDag>(path, &text)?.validate(path),
            _ => Err(InputError::invalid(
                path,
                "extension",
                "workload files end in .toml (model template) or .json (operator DAG)",
            )),
        }?;
        check_name(path, &workload.name)?;
        Ok(workload)
    }

    /// The layer graph per device at tensor width `tp` for micro-batch `micro_batch`.
    pub fn layer_graph(
        &self,
        tp: u32,
        micro_batch: u32,
        sequence_parallel: bool,
    ) -> Result<LayerGraph, InputError> {
        if micro_batch == 0 {
            return Err(InputError::invalid(
                &self.source,
                "micro_batch",
                "must be at least 1",
            ));
        }
        if u64::from(micro_batch) > self.global_batch {
            return Err(InputError::invalid(
                &self.source,
                "micro_batch",
                format!(
                    "{micro_batch} exceeds the global batch {}",
                    self.global_batch
                ),
            ));
        }
        match &self.model {
            Model::Template(template) => {
                if let Some(reason) =
                    template.tp_error(u64::from(tp), self.seq_len, sequence_parallel)
                {
                    return Err(InputError::invalid(&self.source, "tp", reason));
                }
                if let Some(reason) = template.size_error(self.seq_len, u64::from(micro_batch)) {
                    return Err(InputError::invalid(&self.source, "micro_batch", reason));
                }
                Ok(template.layer_graph(&self.shape(tp, micro_batch, sequence_parallel)))
            }
            Model::Dag(dag) => {
                if tp != 1 {
                    return Err(InputError::invalid(
                        &self.source,
                        "tp",
                        format!(
                            "operator DAG workloads are given per device; only tp = 1 is \
                             possible, got {tp}"
                        ),
                    ));
                }
                Ok(dag.layer_graph(u64::from(micro_batch), sequence_parallel))
            }
        }
    }

    /// Tensor widths `layer_graph` accepts up to `max_tp`: the powers of two that divide the
    /// heads, key/value heads and FFN width (Megatron practice: t spans a power-of-two node).
    /// Operator DAGs are per device, so only 1.
    pub fn valid_tp(&self, max_tp: u32) -> Vec<u32> {
        match &self.model {
            Model::Template(template) => std::iter::successors(Some(1u32), |&t| t.checked_mul(2))
                .take_while(|&t| t <= max_tp)
                .filter(|&t| {
                    template
                        .tp_error(u64::from(t), self.seq_len, false)
                        .is_none()
                })
                .collect(),
            Model::Dag(_) => (max_tp >= 1).then_some(1).into_iter().collect(),
        }
    }

    /// Parameters of the whole, unsliced model.
    pub fn total_params(&self) -> u64 {
        match &self.model {
            Model::Template(template) => template.total_params(self.seq_len),
            Model::Dag(dag) => dag.total_params(),
        }
    }

    /// GEMM FLOPs of one training iteration (forward and backward, whole model, global batch),
    /// counted from the generated graphs. For GPT this is Narayanan et al. 2021's
    /// 72·B·L·s·h²·(1 + s/(6h) + V/(12hL)).
    pub fn model_flops_per_iteration(&self) -> f64 {
        let graph = self.single_sample_graph();
        let per_sample: f64 = graph
            .layers
            .iter()
            .map(|l| gemm_flops(&l.fwd.ops) + gemm_flops(&l.bwd.ops))
            .sum();
        per_sample * self.global_batch as f64
    }

    /// GEMM FLOPs the hardware executes per iteration. Full recompute reruns the forward of
    /// every layer that keeps less under full recompute than without (the transformer
    /// blocks): for GPT 96·B·L·s·h²·(1 + s/(6h) + V/(16hL)).
    pub fn hardware_flops_per_iteration(&self, full_recompute: bool) -> f64 {
        let model = self.model_flops_per_iteration();
        if !full_recompute {
            return model;
        }
        let graph = self.single_sample_graph();
        let recomputed: f64 = graph
            .layers
            .iter()
            .filter(|l| l.activation_bytes.recomputed_under_full())
            .map(|l| gemm_flops(&l.fwd.ops))
            .sum();
        model + recomputed * self.global_batch as f64
    }

    /// The gradients' precision ([`Workload::grads`]).
    pub fn grad_precision(&self) -> Precision {
        match self.grads {
            GradPrecision::Weights => self.precision,
            GradPrecision::Fp32 => Precision::Fp32,
        }
    }

    /// Bytes per parameter for weights, gradients and optimizer state (docs/design.md §2,
    /// docs/workloads.md).
    pub fn bytes_per_param(&self) -> BytesPerModelParam {
        let weights = self.precision.bytes();
        let optimizer = match (self.optimizer, self.precision) {
            (Optimizer::Sgd, _) => 0,
            (Optimizer::Adam, Precision::Fp32) => 8,
            (Optimizer::Adam, _) => 12,
        };
        BytesPerModelParam {
            weights,
            grads: self.grad_precision().bytes(),
            optimizer,
        }
    }

    /// The kernels of the optimizer step over a layer's parameter tensors (sizes in
    /// elements), in order. Adam reads the fp32 weights, gradients and both moments and writes
    /// back the weights and moments (28 B per parameter, a fused Adam on fp32 main parameters
    /// and gradients); in mixed precision the gradients are first cast up to the main copy
    /// (unless `grad_precision` keeps them in fp32 already) and the updated main weights cast
    /// back to the model's precision (Megatron-LM's
    /// `_copy_model_grads_to_main_grads` and `_copy_main_params_to_model_params`: 6 B per
    /// parameter each), a kernel per layer or per tensor as [`Workload::param_kernels`] says.
    /// SGD reads weights and gradients and writes the weights. Before the update, loss scaling
    /// takes the scale off the gradients and checks them for infinities (one read and write),
    /// and clipping computes their norm (one read): Megatron-LM's
    /// `_unscale_main_grads_and_check_for_nan` and `clip_grad_norm_fp32`. The update, the
    /// unscaling and the norm are multi-tensor kernels (PyTorch's fused Adam and `_foreach`
    /// ops, apex's in Megatron-LM), launched over all layers' tensors together
    /// ([`Launches::MultiTensor`]), as is the copy of the weights back where it is not per tensor.
    /// None for a layer without parameters.
    pub fn optimizer_step_ops(&self, param_tensors: &[u64]) -> Vec<Op> {
        let params: u64 = param_tensors.iter().sum();
        if params == 0 {
            return Vec::new();
        }
        let e = self.precision.bytes();
        let mixed = self.optimizer == Optimizer::Adam && e < 4;
        // The gradients the bookkeeping and the update read: Adam's fp32 main copy.
        let grad_bytes = match self.optimizer {
            Optimizer::Adam => 4,
            Optimizer::Sgd => e,
        };
        let mut ops = Vec::with_capacity(3 + 2 * param_tensors.len());
        // Gradients already in fp32 are the main copy's.
        if mixed && self.grad_precision() != Precision::Fp32 {
            ops.extend(
                self.param_kernel_sizes(param_tensors, true)
                    .into_iter()
                    .map(|n| ops::vector("grads_to_fp32", VectorOp::Cast, n, 1, e)),
            );
        }
        for (wanted, name, op) in [
            (self.loss_scaling, "unscale_grads", VectorOp::Scale),
            (self.gradient_clipping, "grad_norm", VectorOp::Norm),
        ] {
            if wanted {
                ops.push(multi_tensor(ops::vector(name, op, params, 1, grad_bytes)));
            }
        }
        ops.push(multi_tensor(match self.optimizer {
            Optimizer::Adam => ops::vector("optimizer_step", VectorOp::Update, params, 1, 4),
            Optimizer::Sgd => ops::vector("optimizer_step", VectorOp::Add, params, 1, e),
        }));
        if mixed {
            let weights_multi_tensor = self.param_kernels == ParamKernels::PerTensorGrads;
            ops.extend(
                self.param_kernel_sizes(param_tensors, false)
                    .into_iter()
                    .map(|n| {
                        let op = ops::vector_in_pass(
                            "weights_from_fp32",
                            VectorOp::Cast,
                            Pass::Backward,
                            n,
                            1,
                            e,
                        );
                        if weights_multi_tensor {
                            multi_tensor(op)
                        } else {
                            op
                        }
                    }),
            );
        }
        ops
    }

    /// The kernels that add one micro-batch's weight gradients over a layer's parameter
    /// tensors into the iteration's (both read, the sum written, at the gradients' precision:
    /// PyTorch's `AccumulateGrad`, Megatron-LM's `main_grad.add_`; with fp32 gradients of
    /// narrower weights the micro-batch's own arrives narrower, 10 B of the 12 priced), run
    /// by every micro-batch after a copy's first; none without parameters or when the GEMMs
    /// accumulate themselves.
    pub fn grad_accumulation_ops(&self, param_tensors: &[u64]) -> Vec<Op> {
        let sizes = self.param_kernel_sizes(param_tensors, true);
        self.unfused_grad_adds("grad_accumulate", sizes)
    }

    /// The data-parallel wrapper's kernels over a layer's gradients once per iteration, at
    /// the gradients' precision ([`Workload::ddp`]), each a read and a write per element
    /// unless said (a same-precision copy is a device-to-device memcpy, priced as that
    /// traffic): PyTorch DDP's copy of each gradient into its bucket (divided by the copies,
    /// `mul_out`) and back after the all-reduce, a kernel per tensor each; Megatron-LM's
    /// zeroing of the gradient buffer (a write per element, one kernel over all layers) and,
    /// without gradient-accumulation fusion, the first micro-batch's add into it, which
    /// [`Workload::grad_accumulation_ops`] leaves out; its coalescing variant's flatten and
    /// division (each one kernel over all layers) and copy back (a kernel per tensor). None
    /// without a wrapper or parameters.
    pub fn grad_buffer_ops(&self, param_tensors: &[u64]) -> Vec<Op> {
        let grads = self.bytes_per_param().grads;
        let params: u64 = param_tensors.iter().sum();
        match self.ddp {
            Ddp::None => Vec::new(),
            Ddp::Torch => param_tensors
                .iter()
                .filter(|&&n| n > 0)
                .flat_map(|&n| {
                    ["ddp_bucket_in", "ddp_bucket_out"]
                        .map(|name| ops::vector(name, VectorOp::Scale, n, 1, grads))
                })
                .collect(),
            Ddp::Megatron | Ddp::MegatronCoalesced if params == 0 => Vec::new(),
            Ddp::Megatron => {
                let zero = ops::vector("grad_buffer_zero", VectorOp::Fill, params, 1, grads);
                let first_adds = self.unfused_grad_adds(
                    "grad_accumulate_first",
                    self.param_kernel_sizes(param_tensors, true),
                );
                std::iter::once(multi_tensor(zero))
                    .chain(first_adds)
                    .collect()
            }
            Ddp::MegatronCoalesced => ["ddp_flatten", "ddp_divide"]
                .map(|name| multi_tensor(ops::vector(name, VectorOp::Scale, params, 1, grads)))
                .into_iter()
                .chain(
                    param_tensors
                        .iter()
                        .filter(|&&n| n > 0)
                        .map(|&n| ops::vector("ddp_unflatten", VectorOp::Scale, n, 1, grads)),
                )
                .collect(),
        }
    }

    /// The kernels summing the two gradients of tied parameters where their owner and the
    /// layer using them share a stage, every micro-batch: without gradient-accumulation fusion
    /// autograd adds the user's gradient to the owner's (an add over each tied tensor); with
    /// it, the GEMM accumulates the user's gradient itself, and the owner's gradient hook adds
    /// its own on any stage (an operator of the owner's graph).
    pub fn tied_grad_sum_ops(&self, tied_tensors: &[u64]) -> Vec<Op> {
        let sizes = tied_tensors.iter().copied().filter(|&n| n > 0).collect();
        self.unfused_grad_adds("tied_grad_sum", sizes)
    }

    /// One add of two gradients (both read, the sum written, at the gradients' precision) over
    /// each of `sizes` elements, where the GEMMs do not accumulate their own (none where they
    /// do).
    fn unfused_grad_adds(&self, name: &str, sizes: Vec<u64>) -> Vec<Op> {
        if self.gradient_accumulation_fusion {
            return Vec::new();
        }
        let grads = self.bytes_per_param().grads;
        sizes
            .into_iter()
            .map(|n| ops::vector(name, VectorOp::Add, n, 1, grads))
            .collect()
    }

    /// Elements of each per-parameter kernel over a layer's parameter tensors, for the
    /// gradients' kernels (`grads`) or the weights': all of them in one, or one per tensor;
    /// none for a layer without parameters.
    fn param_kernel_sizes(&self, param_tensors: &[u64], grads: bool) -> Vec<u64> {
        if self.param_kernels.per_tensor(grads) {
            return param_tensors.iter().copied().filter(|&n| n > 0).collect();
        }
        let params: u64 = param_tensors.iter().sum();
        if params == 0 {
            Vec::new()
        } else {
            vec![params]
        }
    }

    /// Whether the model has mixture-of-experts layers (a template's `[moe]` table; operator
    /// DAGs have none), which expert parallelism divides.
    pub fn has_experts(&self) -> bool {
        self.experts() > 0
    }

    /// Routed experts of each mixture-of-experts layer (0 without experts; at most 4096, as
    /// the template checks).
    pub fn experts(&self) -> u32 {
        match &self.model {
            Model::Template(t) => t.moe.as_ref().map_or(0, |m| m.experts as u32),
            Model::Dag(_) => 0,
        }
    }

    /// Tokens per sample.
    pub fn tokens_per_sample(&self) -> u64 {
        self.seq_len
    }

    fn shape(&self, tp: u32, micro_batch: u32, sequence_parallel: bool) -> Shape {
        Shape {
            seq_len: self.seq_len,
            micro_batch: u64::from(micro_batch),
            tp: u64::from(tp),
            sequence_parallel,
            precision: self.precision,
            gradient_accumulation_fusion: self.gradient_accumulation_fusion,
        }
    }

    /// The unsliced graph of one sample (always valid: t = 1, b = 1).
    fn single_sample_graph(&self) -> LayerGraph {
        match &self.model {
            Model::Template(template) => template.layer_graph(&self.shape(1, 1, false)),
            Model::Dag(dag) => dag.layer_graph(1, false),
        }
    }
}

fn gemm_flops(ops: &[Op]) -> f64 {
    ops.iter()
        .filter(|o| matches!(o.kind, OpKind::Gemm { .. }))
        .map(|o| o.flops)
        .sum()
}
