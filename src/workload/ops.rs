//! Operator constructors (FLOPs and bytes from shapes) and the builder that turns one
//! description of a layer into its forward and backward operator graphs.
//!
//! A layer is described as a list of [`Node`]s in forward topological order. Each node may run
//! an operator in the forward pass and names the operators its backward runs: `grad` operators
//! produce gradients for (some of) the node's forward predecessors, `leaf` operators (weight
//! gradients) feed nothing inside the layer. A node without a forward operator is a pure
//! backward hook (Megatron's `f`: identity forward, all-reduce backward); a node without
//! backward operators passes its incoming gradient straight through (Megatron's `g`).

use std::collections::BTreeSet;

use super::graph::{
    attention_products, AttentionShape, CollectiveKind, Launches, Op, OpGraph, OpKind,
};
use crate::vocab::{Pass, VectorOp};

/// Multiplies sizes, saturating instead of wrapping on absurd inputs.
pub(crate) fn mul(factors: &[u64]) -> u64 {
    factors.iter().fold(1u64, |acc, &x| acc.saturating_mul(x))
}

/// Floating-point operations per element of a vector primitive (a multiply-add counts 2).
fn flops_per_element(op: VectorOp) -> f64 {
    match op {
        VectorOp::Copy | VectorOp::Stack | VectorOp::Cast | VectorOp::Fill => 0.0,
        VectorOp::Add
        | VectorOp::Mul
        | VectorOp::Relu
        | VectorOp::Embedding
        | VectorOp::ColumnSum
        | VectorOp::Scale => 1.0,
        VectorOp::Norm => 2.0,
        VectorOp::Dropout => 2.0,
        VectorOp::Rotary => 3.0,
        VectorOp::Silu | VectorOp::RmsNorm | VectorOp::Update => 4.0,
        VectorOp::Softmax | VectorOp::CrossEntropy => 5.0,
        // The softmax's arithmetic on the half of the elements up to the diagonal.
        VectorOp::CausalSoftmax => 2.5,
        VectorOp::Gelu | VectorOp::LayerNorm => 8.0,
    }
}

/// `batch` products of (m × k)·(k × n): 2·batch·m·n·k FLOP; operands read and result written once.
pub(crate) fn gemm(name: &str, batch: u64, m: u64, n: u64, k: u64, elem_bytes: u32) -> Op {
    let e = u64::from(elem_bytes);
    Op {
        name: name.to_string(),
        kind: OpKind::Gemm { batch, m, n, k },
        elem_bytes,
        flops: 2.0 * batch as f64 * m as f64 * n as f64 * k as f64,
        bytes_read: mul(&[batch, m.saturating_mul(k).saturating_add(mul(&[k, n])), e]),
        bytes_written: mul(&[batch, m, n, e]),
        launches: Launches::default(),
        asynchronous: false,
    }
}

/// A vector primitive over `elements` values in rows of `row_len`.
pub(crate) fn vector(name: &str, op: VectorOp, elements: u64, row_len: u64, elem_bytes: u32) -> Op {
    vector_in_pass(name, op, Pass::Forward, elements, row_len, elem_bytes)
}

/// `op`'s `pass` kernel, its bytes from the primitive's traffic table. The loss writes one
/// fp32 value per row and column sums one value per column besides the per-element tensors.
pub(crate) fn vector_in_pass(
    name: &str,
    op: VectorOp,
    pass: Pass,
    elements: u64,
    row_len: u64,
    elem_bytes: u32,
) -> Op {
    let e = u64::from(elem_bytes);
    let traffic = op.traffic(pass);
    let reduced_output_bytes = match (op, pass) {
        (VectorOp::CrossEntropy, Pass::Forward) => mul(&[elements / row_len.max(1), 4]),
        (VectorOp::ColumnSum, _) => mul(&[row_len, e]),
        _ => 0,
    };
    Op {
        name: name.to_string(),
        kind: OpKind::Vector {
            op,
            elements,
            row_len,
            pass,
        },
        elem_bytes,
        flops: elements as f64 * flops_per_element(op),
        bytes_read: mul(&[elements, traffic.reads * e + traffic.extra_read_bytes])
            .saturating_add(mul(&[elements / 2, traffic.causal_reads * e])),
        bytes_written: mul(&[elements, traffic.writes * e + traffic.extra_write_bytes])
            .saturating_add(reduced_output_bytes),
        launches: Launches::Kernels(op.kernels(pass, elements, row_len)),
        asynchronous: false,
    }
}

/// Fused attention ([`OpKind::Attention`]): 2·s²·d FLOP per product and query head (half of
/// them under a causal mask); HBM traffic of its own tensors only, Q, K and V read and the
/// output and its fp32 row log-sum-exp written forward, Q, K, V, the output, its gradient and
/// the log-sum-exp read and dQ, dK, dV written backward. The backward is three kernels, as
/// FlashAttention-2 runs it (the rows' dO·O sums, the main kernel, dQ's conversion from its
/// fp32 accumulator).
pub(crate) fn attention(name: &str, shape: AttentionShape, pass: Pass, elem_bytes: u32) -> Op {
    let AttentionShape {
        heads,
        kv_heads,
        seq_len,
        head_dim,
        causal,
    } = shape;
    let e = u64::from(elem_bytes);
    let per_head = mul(&[seq_len, head_dim, e]);
    let q = mul(&[heads, per_head]);
    let kv = mul(&[2, kv_heads, per_head]);
    let lse = mul(&[heads, seq_len, 4]);
    let (bytes_read, bytes_written, kernels) = match pass {
        Pass::Forward => (q.saturating_add(kv), q.saturating_add(lse), 1),
        Pass::Backward => (
            mul(&[3, q]).saturating_add(kv).saturating_add(lse),
            q.saturating_add(kv),
            3,
        ),
    };
    let masked = if causal { 0.5 } else { 1.0 };
    Op {
        name: name.to_string(),
        kind: OpKind::Attention { shape, pass },
        elem_bytes,
        flops: 2.0
            * attention_products(pass).iter().sum::<u64>() as f64
            * masked
            * heads as f64
            * seq_len as f64
            * seq_len as f64
            * head_dim as f64,
        bytes_read,
        bytes_written,
        launches: Launches::Kernels(kernels),
        asynchronous: false,
    }
}

/// A collective over `group` devices on a buffer of `bytes` per device.
pub(crate) fn collective(
    name: &str,
    collective: CollectiveKind,
    bytes: u64,
    group: u32,
    elem_bytes: u32,
) -> Op {
    Op {
        name: name.to_string(),
        kind: OpKind::Collective {
            collective,
            bytes,
            group,
        },
        elem_bytes,
        flops: 0.0,
        bytes_read: bytes,
        bytes_written: bytes,
        launches: Launches::default(),
        asynchronous: false,
    }
}

/// A backward column sum over `elements` values in rows of `row_len` (the columns): a bias
/// gradient reads the output gradient; a norm's weight gradients read the output gradient and
/// the saved input (`elements` counts both).
pub(crate) fn column_sum(name: &str, elements: u64, row_len: u64, elem_bytes: u32) -> Op {
    vector_in_pass(
        name,
        VectorOp::ColumnSum,
        Pass::Backward,
        elements,
        row_len,
        elem_bytes,
    )
}

/// Input-gradient GEMM for operand A (m × k): dA = dC (m × n) · Bᵀ (n × k).
pub(crate) fn gemm_grad_a(fwd: &Op, suffix: &str) -> Op {
    match fwd.kind {
        OpKind::Gemm { batch, m, n, k } => gemm(
            &format!("{}.{suffix}", fwd.name),
            batch,
            m,
            k,
            n,
            fwd.elem_bytes,
        ),
        _ => fwd.clone(),
    }
}

/// Gradient GEMM for operand B (k × n): dB = Aᵀ (k × m) · dC (m × n).
pub(crate) fn gemm_grad_b(fwd: &Op, suffix: &str) -> Op {
    match fwd.kind {
        OpKind::Gemm { batch, m, n, k } => gemm(
            &format!("{}.{suffix}", fwd.name),
            batch,
            k,
            n,
            m,
            fwd.elem_bytes,
        ),
        _ => fwd.clone(),
    }
}

/// The backward counterpart of a collective: all-gather and reduce-scatter swap, all-reduce
/// and point-to-point stay; it blocks the kernels after it whether or not the forward did.
pub(crate) fn collective_backward(fwd: &Op) -> Op {
    let mut op = fwd.clone();
    op.name = format!("{}.bwd", fwd.name);
    op.asynchronous = false;
    if let OpKind::Collective {
        collective,
        bytes,
        group,
    } = fwd.kind
    {
        let dual = match collective {
            CollectiveKind::AllGather => CollectiveKind::ReduceScatter,
            CollectiveKind::ReduceScatter => CollectiveKind::AllGather,
            other => other,
        };
        op.kind = OpKind::Collective {
            collective: dual,
            bytes,
            group,
        };
    }
    op
}

/// Which forward predecessors a backward operator sends its gradient to.
#[derive(Debug, Clone)]
pub(crate) enum Feeds {
    /// Every forward predecessor of the node.
    All,
    /// Only these forward predecessors (node indices).
    Only(Vec<usize>),
}

impl Feeds {
    fn includes(&self, pred: usize) -> bool {
        match self {
            Feeds::All => true,
            Feeds::Only(preds) => preds.contains(&pred),
        }
    }
}

/// One step of a layer description.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// The forward operator, or `None` for a backward-only hook.
    pub fwd: Option<Op>,
    /// Forward predecessors (indices of earlier nodes).
    pub preds: Vec<usize>,
    /// Backward operators producing gradients for predecessors.
    pub grad: Vec<(Op, Feeds)>,
    /// Backward operators nothing in the layer waits for (weight gradients).
    pub leaf: Vec<Op>,
    /// Of `leaf`, how many (the first ones) read the node's forward input: a weight gradient
    /// does, a bias gradient does not.
    pub input_leaves: usize,
    /// A collective the backward runs again before the weight gradients of the node's
    /// consumers read its output: a sequence-parallel all-gather, whose result the forward
    /// does not keep (Megatron-LM keeps the shard and gathers it again in the backward). It is
    /// issued where the backward reaches the last of those consumers.
    pub regather: Option<Op>,
}

impl Node {
    /// A forward operator with the standard backward for its kind (see [`standard_backward`]).
    pub fn op(fwd: Op, preds: Vec<usize>, weight_operand: bool) -> Node {
        let (grad, leaf) = standard_backward(&fwd, weight_operand);
        Node {
            fwd: Some(fwd),
            preds,
            grad,
            input_leaves: leaf.len(),
            leaf,
            regather: None,
        }
    }

    /// A node of `fwd` (`None`: a backward-only hook) on `preds` whose backward is `grad`
    /// alone: no weight gradients, nothing gathered again.
    pub fn new(fwd: Option<Op>, preds: Vec<usize>, grad: Vec<(Op, Feeds)>) -> Node {
        Node {
            fwd,
            preds,
            grad,
            leaf: Vec::new(),
            input_leaves: 0,
            regather: None,
        }
    }
}

/// The usual backward of one forward operator. A GEMM gives two GEMMs: the input gradient and
/// the gradient of B, which is a weight gradient (a leaf) when B is a weight and an input
/// gradient otherwise. Vector primitives mirror; collectives take their dual.
pub(crate) fn standard_backward(fwd: &Op, weight_operand: bool) -> (Vec<(Op, Feeds)>, Vec<Op>) {
    match fwd.kind {
        OpKind::Gemm { .. } if weight_operand => (
            vec![(gemm_grad_a(fwd, "dgrad"), Feeds::All)],
            vec![gemm_grad_b(fwd, "wgrad")],
        ),
        OpKind::Gemm { .. } => (
            vec![
                (gemm_grad_a(fwd, "grad_a"), Feeds::All),
                (gemm_grad_b(fwd, "grad_b"), Feeds::All),
            ],
            Vec::new(),
        ),
        // The same primitive over the same elements, its backward kernel's traffic; a norm's
        // weight gradients are column sums of their own.
        OpKind::Vector {
            op,
            elements,
            row_len,
            ..
        } => {
            let name = format!("{}.bwd", fwd.name);
            let grad = vector_in_pass(&name, op, Pass::Backward, elements, row_len, fwd.elem_bytes);
            let leaf = match op {
                VectorOp::LayerNorm | VectorOp::RmsNorm => vec![column_sum(
                    &format!("{}.wgrad", fwd.name),
                    2 * elements,
                    row_len,
                    fwd.elem_bytes,
                )],
                _ => Vec::new(),
            };
            (vec![(grad, Feeds::All)], leaf)
        }
        OpKind::Collective { .. } => (vec![(collective_backward(fwd), Feeds::All)], Vec::new()),
        OpKind::Attention { shape, .. } => {
            let name = format!("{}.bwd", fwd.name);
            let grad = attention(&name, shape, Pass::Backward, fwd.elem_bytes);
            (vec![(grad, Feeds::All)], Vec::new())
        }
    }
}

/// Builds the forward and backward operator graphs of a layer description. Both come out in
/// topological order with every edge `(i, j)` having `i < j`.
pub(crate) fn build_graphs(nodes: &[Node]) -> (OpGraph, OpGraph) {
    (build_forward(nodes), build_backward(nodes))
}

fn build_forward(nodes: &[Node]) -> OpGraph {
    let mut graph = OpGraph::default();
    let mut edges = BTreeSet::new();
    // Forward ops whose output node i stands for (itself, or its sources when it has no op).
    let mut outputs: Vec<BTreeSet<usize>> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let sources: BTreeSet<usize> = node
            .preds
            .iter()
            .flat_map(|&p| outputs[p].iter().copied())
            .collect();
        match &node.fwd {
            Some(op) => {
                let idx = graph.ops.len();
                graph.ops.push(op.clone());
                edges.extend(sources.iter().map(|&s| (s, idx)));
                outputs.push(BTreeSet::from([idx]));
            }
            None => outputs.push(sources),
        }
    }
    graph.edges = edges.into_iter().collect();
    graph
}

fn build_backward(nodes: &[Node]) -> OpGraph {
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (j, node) in nodes.iter().enumerate() {
        for &p in &node.preds {
            succs[p].push(j);
        }
    }
    let mut graph = OpGraph::default();
    let mut edges = BTreeSet::new();
    // Per node: backward op indices of its grad ops (with their feeds), and its incoming
    // gradient sources (used when it passes gradients through).
    let mut grad_ops: Vec<Vec<(usize, Feeds)>> = vec![Vec::new(); nodes.len()];
    let mut incoming: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); nodes.len()];
    // Per node with a `regather`: the backward op index of it, once issued.
    let mut regathered: Vec<Option<usize>> = vec![None; nodes.len()];
    for i in (0..nodes.len()).rev() {
        let mut sources = BTreeSet::new();
        for &j in &succs[i] {
            if grad_ops[j].is_empty() {
                sources.extend(incoming[j].iter().copied());
            } else {
                sources.extend(
                    grad_ops[j]
                        .iter()
                        .filter(|(_, feeds)| feeds.includes(i))
                        .map(|(idx, _)| *idx),
                );
            }
        }
        let node = &nodes[i];
        // The re-gathers this node's weight gradients read, issued with the backward of the
        // last consumer of each (the first one this reverse walk meets).
        let mut gathered = Vec::new();
        for &p in &node.preds {
            let Some(op) = &nodes[p].regather else {
                continue;
            };
            let idx = *regathered[p].get_or_insert_with(|| {
                let idx = graph.ops.len();
                graph.ops.push(op.clone());
                edges.extend(sources.iter().map(|&s| (s, idx)));
                idx
            });
            gathered.push(idx);
        }
        for (op, feeds) in &node.grad {
            let idx = graph.ops.len();
            graph.ops.push(op.clone());
            edges.extend(sources.iter().map(|&s| (s, idx)));
            grad_ops[i].push((idx, feeds.clone()));
        }
        for (k, op) in node.leaf.iter().enumerate() {
            let idx = graph.ops.len();
            graph.ops.push(op.clone());
            edges.extend(sources.iter().map(|&s| (s, idx)));
            if k < node.input_leaves {
                edges.extend(gathered.iter().map(|&g| (g, idx)));
            }
        }
        incoming[i] = sources;
    }
    graph.edges = edges.into_iter().collect();
    graph
}
