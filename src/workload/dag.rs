//! Operator-DAG workloads (`.json`): models outside the templates, given per device and per
//! sample as a DAG of layers, each a DAG of operators (branching allowed). FLOPs and bytes of
//! every operator are derived from its shape, so scaling to a micro-batch stays exact.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::graph::{
    ActivationBytes, AttentionShape, Launches, Layer, LayerGraph, Op, OpGraph, OpKind,
    ReplicatedParams,
};
use super::ops::{attention, build_graphs, collective, gemm, mul, vector, Node};
use super::{Checkpoint, Ddp, Model, Optimizer, ParamKernels, Precision, Workload};
use crate::error::InputError;

/// Which GEMM dimension holds the samples (and grows with the micro-batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// Rows: token-major activations (m = tokens).
    #[default]
    M,
    /// The batch of independent products (e.g. attention heads × samples).
    Batch,
}

fn default_true() -> bool {
    true
}

/// One operator of a DAG workload, for one sample.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DagOp {
    pub name: String,
    pub kind: OpKind,
    /// GEMMs only: the dimension that scales with the micro-batch.
    #[serde(default)]
    pub scale: Scale,
    /// GEMMs only: operand B is a weight, so its gradient is a weight gradient that nothing in
    /// the layer waits for (otherwise both gradients flow back to predecessors).
    #[serde(default = "default_true")]
    pub weight_operand: bool,
    /// Collectives only: issued asynchronously ([`Op::asynchronous`]; in a backward derived
    /// from `fwd`, the forward collective only).
    #[serde(default)]
    pub asynchronous: bool,
}

/// Operators and their dependencies, for one sample.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DagGraph {
    pub ops: Vec<DagOp>,
    pub edges: Vec<(usize, usize)>,
}

/// One layer of a DAG workload, per sample.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DagLayer {
    pub name: String,
    /// Parameters held by the device.
    pub params: u64,
    /// Elements of each of the layer's parameter tensors, summing to `params`; absent, the
    /// parameters are one tensor.
    #[serde(default)]
    pub param_tensors: Option<Vec<u64>>,
    /// Activation bytes kept per sample under each recompute mode.
    pub activation_bytes: ActivationBytes,
    /// Bytes of the layer's output per sample.
    pub output_bytes: u64,
    pub fwd: DagGraph,
    /// Optional explicit backward; derived from `fwd` when absent.
    pub bwd: Option<DagGraph>,
}

/// A validated operator-DAG model.
#[derive(Debug, Clone, PartialEq)]
pub struct Dag {
    pub layers: Vec<DagLayer>,
    /// Layer edges `(i, j, bytes per sample)`.
    pub edges: Vec<(usize, usize, u64)>,
    pub precision: Precision,
}

/// The JSON file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDag {
    name: String,
    global_batch: i64,
    seq_len: i64,
    #[serde(default = "default_precision")]
    precision: Precision,
    grad_precision: Option<String>,
    #[serde(default = "default_optimizer")]
    optimizer: Optimizer,
    loss_scaling: Option<bool>,
    #[serde(default = "clips")]
    gradient_clipping: bool,
    #[serde(default = "fuses_accumulation")]
    gradient_accumulation_fusion: bool,
    param_kernels: Option<String>,
    ddp: Option<String>,
    checkpoint: Option<String>,
    layers: Vec<DagLayer>,
    edges: Vec<(usize, usize, u64)>,
}

fn fuses_accumulation() -> bool {
    true
}

fn default_precision() -> Precision {
    Precision::Bf16
}

fn default_optimizer() -> Optimizer {
    Optimizer::Adam
}

fn clips() -> bool {
    true
}

/// Largest size (bytes, elements, parameters, GEMM dimension) of one item per sample: a
/// terabyte, far beyond any layer, and small enough that a micro-batch of up to
/// [`MAX_BATCH`] samples never overflows the 64-bit arithmetic downstream.
const MAX_SIZE: u64 = 1 << 40;
/// Largest global batch (and sequence length) a DAG workload may give.
const MAX_BATCH: u64 = 1 << 22;
/// Most parameters a DAG model may hold in all (17.6 T).
const MAX_PARAMS: u64 = 1 << 44;

fn at_most(file: &Path, field: &str, value: u64, limit: u64) -> Result<(), InputError> {
    if value > limit {
        return Err(InputError::invalid(
            file,
            field,
            format!("{value} is more than the largest size tandem takes here, {limit}"),
        ));
    }
    Ok(())
}

fn positive(file: &Path, field: &str, value: i64) -> Result<u64, InputError> {
    u64::try_from(value).ok().filter(|&v| v > 0).ok_or_else(|| {
        InputError::invalid(
            file,
            field,
            format!("must be a positive integer, got {value}"),
        )
    })
}

/// A layer's parameter tensors: each holds parameters, and together they are the layer's.
fn check_param_tensors(
    file: &Path,
    field: &str,
    tensors: &[u64],
    params: u64,
) -> Result<(), InputError> {
    if let Some(n) = tensors.iter().position(|&t| t == 0) {
        return Err(InputError::invalid(
            file,
            format!("{field}[{n}]"),
            "every tensor must hold at least one parameter",
        ));
    }
    let sum = tensors
        .iter()
        .try_fold(0u64, |sum, &t| sum.checked_add(t))
        .filter(|&sum| sum == params);
    if sum.is_none() {
        return Err(InputError::invalid(
            file,
            field,
            format!("the tensors must add up to the layer's params = {params}"),
        ));
    }
    Ok(())
}

fn check_edges(
    file: &Path,
    field: &str,
    edges: &[(usize, usize)],
    len: usize,
) -> Result<(), InputError> {
    for (n, &(i, j)) in edges.iter().enumerate() {
        if i >= j || j >= len {
            return Err(InputError::invalid(
                file,
                format!("{field}[{n}]"),
                format!("edge [{i}, {j}] must satisfy i < j < {len} (items in topological order)"),
            ));
        }
    }
    Ok(())
}

fn check_graph(file: &Path, field: &str, graph: &DagGraph) -> Result<(), InputError> {
    if graph.ops.is_empty() {
        return Err(InputError::invalid(
            file,
            format!("{field}.ops"),
            "needs at least one operator",
        ));
    }
    for (n, op) in graph.ops.iter().enumerate() {
        let at = format!("{field}.ops[{n}]");
        let zero = match op.kind {
            OpKind::Gemm { batch, m, n, k } => [batch, m, n, k].contains(&0),
            OpKind::Vector {
                elements, row_len, ..
            } => elements == 0 || row_len == 0,
            OpKind::Collective { bytes, group, .. } => bytes == 0 || group == 0,
            OpKind::Attention { shape: a, .. } => {
                [a.heads, a.kv_heads, a.seq_len, a.head_dim].contains(&0)
            }
        };
        if zero {
            return Err(InputError::invalid(
                file,
                format!("{at}.kind"),
                "every size must be positive",
            ));
        }
        let sizes: &[(&str, u64)] = match op.kind {
            OpKind::Gemm { batch, m, n, k } => &[("batch", batch), ("m", m), ("n", n), ("k", k)],
            OpKind::Vector {
                elements, row_len, ..
            } => &[("elements", elements), ("row_len", row_len)],
            OpKind::Collective { bytes, group, .. } => {
                &[("bytes", bytes), ("group", u64::from(group))]
            }
            OpKind::Attention { shape: a, .. } => &[
                ("heads", a.heads),
                ("kv_heads", a.kv_heads),
                ("seq_len", a.seq_len),
                ("head_dim", a.head_dim),
            ],
        };
        for &(name, value) in sizes {
            at_most(file, &format!("{at}.kind.{name}"), value, MAX_SIZE)?;
        }
        if let OpKind::Attention { shape: a, .. } = op.kind {
            if a.heads % a.kv_heads != 0 {
                return Err(InputError::invalid(
                    file,
                    format!("{at}.kind.kv_heads"),
                    format!(
                        "{} key/value heads do not divide {} query heads",
                        a.kv_heads, a.heads
                    ),
                ));
            }
        }
        let is_gemm = matches!(op.kind, OpKind::Gemm { .. });
        if !is_gemm && (op.scale != Scale::M || !op.weight_operand) {
            return Err(InputError::invalid(
                file,
                at,
                "`scale` and `weight_operand` apply to GEMMs only",
            ));
        }
        if op.asynchronous && !matches!(op.kind, OpKind::Collective { .. }) {
            return Err(InputError::invalid(
                file,
                format!("{at}.asynchronous"),
                "applies to collectives only",
            ));
        }
    }
    check_edges(
        file,
        &format!("{field}.edges"),
        &graph.edges,
        graph.ops.len(),
    )
}

impl RawDag {
    pub(crate) fn validate(self, file: &Path) -> Result<Workload, InputError> {
        if self.name.trim().is_empty() {
            return Err(InputError::invalid(file, "name", "must not be empty"));
        }
        let global_batch = positive(file, "global_batch", self.global_batch)?;
        at_most(file, "global_batch", global_batch, MAX_BATCH)?;
        let seq_len = positive(file, "seq_len", self.seq_len)?;
        at_most(file, "seq_len", seq_len, MAX_BATCH)?;
        let param_kernels = ParamKernels::read(file, self.param_kernels.as_deref())?;
        let ddp = Ddp::read(file, self.ddp.as_deref())?;
        let checkpoint = Checkpoint::read(file, self.checkpoint.as_deref())?;
        let grads = self
            .precision
            .read_grads(file, self.grad_precision.as_deref())?;
        let mut total_params = 0u64;
        if self.layers.is_empty() {
            return Err(InputError::invalid(
                file,
                "layers",
                "needs at least one layer",
            ));
        }
        let mut names = BTreeSet::new();
        for (n, layer) in self.layers.iter().enumerate() {
            let at = format!("layers[{n}]");
            if layer.name.trim().is_empty() || !names.insert(layer.name.as_str()) {
                return Err(InputError::invalid(
                    file,
                    format!("{at}.name"),
                    format!(
                        "layer names must be non-empty and unique, got `{}`",
                        layer.name
                    ),
                ));
            }
            if layer.output_bytes == 0 {
                return Err(InputError::invalid(
                    file,
                    format!("{at}.output_bytes"),
                    "must be positive",
                ));
            }
            at_most(file, &format!("{at}.params"), layer.params, MAX_SIZE)?;
            if let Some(tensors) = &layer.param_tensors {
                check_param_tensors(file, &format!("{at}.param_tensors"), tensors, layer.params)?;
            }
            total_params += layer.params;
            at_most(
                file,
                &format!("{at}.params (sum of all layers)"),
                total_params,
                MAX_PARAMS,
            )?;
            at_most(
                file,
                &format!("{at}.output_bytes"),
                layer.output_bytes,
                MAX_SIZE,
            )?;
            let act = layer.activation_bytes;
            at_most(
                file,
                &format!("{at}.activation_bytes.none"),
                act.none,
                MAX_SIZE,
            )?;
            if act.full > act.selective || act.selective > act.none {
                return Err(InputError::invalid(
                    file,
                    format!("{at}.activation_bytes"),
                    format!(
                        "must satisfy full <= selective <= none, got {}/{}/{}",
                        act.full, act.selective, act.none
                    ),
                ));
            }
            check_graph(file, &format!("{at}.fwd"), &layer.fwd)?;
            if let Some(bwd) = &layer.bwd {
                check_graph(file, &format!("{at}.bwd"), bwd)?;
            }
        }
        for (n, &(i, j, bytes)) in self.edges.iter().enumerate() {
            check_edges(file, "edges", &[(i, j)], self.layers.len()).map_err(|_| {
                InputError::invalid(
                    file,
                    format!("edges[{n}]"),
                    format!(
                        "edge [{i}, {j}] must satisfy i < j < {} (layers in topological order)",
                        self.layers.len()
                    ),
                )
            })?;
            if bytes == 0 {
                return Err(InputError::invalid(
                    file,
                    format!("edges[{n}]"),
                    "bytes per sample must be positive",
                ));
            }
            at_most(file, &format!("edges[{n}]"), bytes, MAX_SIZE)?;
        }
        Ok(Workload {
            name: self.name,
            global_batch,
            seq_len,
            precision: self.precision,
            grads,
            optimizer: self.optimizer,
            loss_scaling: self
                .loss_scaling
                .unwrap_or(self.precision == Precision::Fp16),
            gradient_clipping: self.gradient_clipping,
            gradient_accumulation_fusion: self.gradient_accumulation_fusion,
            param_kernels,
            ddp,
            checkpoint,
            source: file.to_path_buf(),
            model: Model::Dag(Dag {
                layers: self.layers,
                edges: self.edges,
                precision: self.precision,
            }),
        })
    }
}

/// The operator for `micro_batch` samples, FLOPs and bytes derived from the scaled shape.
fn scaled_op(op: &DagOp, micro_batch: u64, elem_bytes: u32) -> Op {
    match op.kind {
        OpKind::Gemm { batch, m, n, k } => match op.scale {
            Scale::M => gemm(&op.name, batch, mul(&[m, micro_batch]), n, k, elem_bytes),
            Scale::Batch => gemm(&op.name, mul(&[batch, micro_batch]), m, n, k, elem_bytes),
        },
        OpKind::Vector {
            op: prim,
            elements,
            row_len,
            pass,
        } => {
            let mut scaled = vector(
                &op.name,
                prim,
                mul(&[elements, micro_batch]),
                row_len,
                elem_bytes,
            );
            if let OpKind::Vector {
                pass: p, elements, ..
            } = &mut scaled.kind
            {
                *p = pass;
                scaled.launches = Launches::Kernels(prim.kernels(pass, *elements, row_len));
            }
            scaled
        }
        OpKind::Attention { shape, pass } => {
            let scaled = AttentionShape {
                heads: mul(&[shape.heads, micro_batch]),
                kv_heads: mul(&[shape.kv_heads, micro_batch]),
                ..shape
            };
            attention(&op.name, scaled, pass, elem_bytes)
        }
        OpKind::Collective {
            collective: kind,
            bytes,
            group,
        } => Op {
            asynchronous: op.asynchronous,
            ..collective(
                &op.name,
                kind,
                mul(&[bytes, micro_batch]),
                group,
                elem_bytes,
            )
        },
    }
}

fn explicit_graph(graph: &DagGraph, micro_batch: u64, elem_bytes: u32) -> OpGraph {
    OpGraph {
        ops: graph
            .ops
            .iter()
            .map(|op| scaled_op(op, micro_batch, elem_bytes))
            .collect(),
        edges: graph.edges.clone(),
    }
}

/// A name-independent description of a graph's shapes and dependencies.
fn graph_signature(graph: &OpGraph) -> String {
    let ops: Vec<String> = graph
        .ops
        .iter()
        .map(|o| {
            let overlap = if o.asynchronous { " async" } else { "" };
            format!("{:?}{overlap}", o.kind)
        })
        .collect();
    format!("ops[{}] edges{:?}", ops.join("; "), graph.edges)
}

impl Dag {
    pub(crate) fn total_params(&self) -> u64 {
        self.layers.iter().map(|l| l.params).sum()
    }

    /// The layer graph for `micro_batch` samples (per device; tensor width 1).
    pub(crate) fn layer_graph(&self, micro_batch: u64, sequence_parallel: bool) -> LayerGraph {
        let elem_bytes = self.precision.bytes();
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let (fwd, bwd) = match &layer.bwd {
                    Some(bwd) => (
                        explicit_graph(&layer.fwd, micro_batch, elem_bytes),
                        explicit_graph(bwd, micro_batch, elem_bytes),
                    ),
                    None => {
                        let nodes: Vec<Node> = layer
                            .fwd
                            .ops
                            .iter()
                            .enumerate()
                            .map(|(j, op)| {
                                let preds = layer
                                    .fwd
                                    .edges
                                    .iter()
                                    .filter(|&&(_, to)| to == j)
                                    .map(|&(from, _)| from)
                                    .collect();
                                let scaled = scaled_op(op, micro_batch, elem_bytes);
                                Node::op(scaled, preds, op.weight_operand)
                            })
                            .collect();
                        build_graphs(&nodes)
                    }
                };
                let act = layer.activation_bytes;
                let activation_bytes = ActivationBytes {
                    none: mul(&[act.none, micro_batch]),
                    selective: mul(&[act.selective, micro_batch]),
                    full: mul(&[act.full, micro_batch]),
                };
                let tensors = layer
                    .param_tensors
                    .as_ref()
                    .map_or(String::new(), |t| format!(" tensors{t:?}"));
                let signature = format!(
                    "dag {} b{micro_batch} p{}{tensors} act{}/{}/{} out{} fwd {} bwd {}",
                    self.precision.name(),
                    layer.params,
                    act.none,
                    act.selective,
                    act.full,
                    layer.output_bytes,
                    graph_signature(&fwd),
                    graph_signature(&bwd)
                );
                Layer {
                    name: layer.name.clone(),
                    signature,
                    fwd: Arc::new(fwd),
                    bwd: Arc::new(bwd),
                    params: layer.params,
                    param_tensors: layer.param_tensors.clone().unwrap_or_else(|| {
                        if layer.params == 0 {
                            Vec::new()
                        } else {
                            vec![layer.params]
                        }
                    }),
                    activation_bytes,
                    output_bytes: mul(&[layer.output_bytes, micro_batch]),
                    replicated: ReplicatedParams::default(),
                    expert_params: 0,
                    all_to_all_bytes: 0,
                    tied: None,
                }
            })
            .collect();
        LayerGraph {
            layers,
            edges: self
                .edges
                .iter()
                .map(|&(i, j, bytes)| (i, j, mul(&[bytes, micro_batch])))
                .collect(),
            tp: 1,
            micro_batch: micro_batch as u32,
            sequence_parallel,
        }
    }
}
