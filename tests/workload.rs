//! Workload loading and graph generation: parameter counts against published sizes, FLOPs
//! against Narayanan et al. 2021, activation memory against Korthikanti et al. 2022, Megatron
//! collectives, backward structure, operator-DAG workloads and input errors.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tandem::calibrate::megatron_flops_per_iteration;
use tandem::placement::RecomputeMode;
use tandem::workload::{
    AttentionShape, Checkpoint, CollectiveKind, Ddp, GradPrecision, Layer, LayerGraph, Op, OpGraph,
    OpKind, Optimizer, ParamKernels, Pass, Precision, VectorOp, Workload,
};

fn load(name: &str) -> Workload {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    Workload::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn rel_err(got: f64, want: f64) -> f64 {
    (got - want).abs() / want
}

fn gemm_flops(graph: &OpGraph) -> f64 {
    graph
        .ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Gemm { .. }))
        .map(|o| o.flops)
        .sum()
}

fn block(graph: &LayerGraph) -> &Layer {
    &graph.layers[1]
}

fn op_index(graph: &OpGraph, name: &str) -> usize {
    graph
        .ops
        .iter()
        .position(|o| o.name == name)
        .unwrap_or_else(|| panic!("no op {name}"))
}

/// Whether `to` is reachable from `from` along edges.
fn reaches(graph: &OpGraph, from: usize, to: usize) -> bool {
    let mut seen = BTreeSet::from([from]);
    let mut stack = vec![from];
    while let Some(i) = stack.pop() {
        if i == to {
            return true;
        }
        for &(a, b) in &graph.edges {
            if a == i && seen.insert(b) {
                stack.push(b);
            }
        }
    }
    false
}

fn collectives(graph: &OpGraph) -> Vec<(CollectiveKind, u64, u32)> {
    graph
        .ops
        .iter()
        .filter_map(|o| match o.kind {
            OpKind::Collective {
                collective,
                bytes,
                group,
            } => Some((collective, bytes, group)),
            _ => None,
        })
        .collect()
}

const GPT_WORKLOADS: [&str; 8] = [
    "workloads/gpt2-xl.toml",
    "workloads/megatron-gpt2-8.3b.toml",
    "workloads/gpt3-175b.toml",
    "workloads/gpt-1.7b.toml",
    "workloads/gpt-3.6b.toml",
    "workloads/gpt-7.5b.toml",
    "workloads/gpt-18.4b.toml",
    "workloads/gpt-39.1b.toml",
];

const ALL_WORKLOADS: [&str; 12] = [
    "workloads/bert-large.toml",
    "workloads/gpt2-xl.toml",
    "workloads/megatron-gpt2-8.3b.toml",
    "workloads/gpt3-175b.toml",
    "workloads/opt-350m.toml",
    "workloads/llama2-7b.toml",
    "workloads/llama2-70b.toml",
    "workloads/gpt-1.7b.toml",
    "workloads/gpt-3.6b.toml",
    "workloads/gpt-7.5b.toml",
    "workloads/gpt-18.4b.toml",
    "workloads/gpt-39.1b.toml",
];

#[test]
fn parameter_counts_match_published_sizes() {
    let gpt3 = load("workloads/gpt3-175b.toml");
    // V·h + s·h + 96·(12h² + 13h) + 2h, exactly.
    assert_eq!(gpt3.total_params(), 174_604_259_328);
    assert!(rel_err(gpt3.total_params() as f64, 174.6e9) < 0.005);
    let llama7 = load("workloads/llama2-7b.toml");
    assert_eq!(llama7.total_params(), 6_738_415_616);
    assert!(rel_err(llama7.total_params() as f64, 6.74e9) < 0.005);
    let llama70 = load("workloads/llama2-70b.toml");
    assert!(rel_err(llama70.total_params() as f64, 69.0e9) < 0.01);
    // BERT-Large counting word, position and token-type embeddings, the embedding layernorm,
    // the 24 blocks and the masked-LM head (dense, layernorm, decoder bias); no pooler.
    let bert = load("workloads/bert-large.toml");
    assert_eq!(bert.total_params(), 335_174_458);
    assert!(rel_err(bert.total_params() as f64, 336e6) < 0.02);
    // Narayanan et al. 2021 Table 1 sizes (rounded to 0.1 B in the paper).
    for (file, billions) in [
        ("workloads/gpt-1.7b.toml", 1.7),
        ("workloads/gpt-3.6b.toml", 3.6),
        ("workloads/gpt-7.5b.toml", 7.5),
        ("workloads/gpt-18.4b.toml", 18.4),
        ("workloads/gpt-39.1b.toml", 39.1),
    ] {
        let params = load(file).total_params() as f64;
        assert!(rel_err(params, billions * 1e9) < 0.03, "{file}: {params}");
    }
}

#[test]
fn layer_params_sum_to_total_at_t1_and_shrink_with_t() {
    for file in ALL_WORKLOADS {
        let w = load(file);
        let g = w.layer_graph(1, 1, false).unwrap();
        let sum: u64 = g.layers.iter().map(|l| l.params).sum();
        assert_eq!(sum, w.total_params(), "{file}");
    }
    let gpt3 = load("workloads/gpt3-175b.toml");
    let h = 12288u64;
    let g8 = gpt3.layer_graph(8, 1, false).unwrap();
    // Sliced weights and column-parallel biases / 8; two row-parallel biases and two
    // layernorms (4h) replicated.
    assert_eq!(block(&g8).params, (12 * h * h + 7 * h) / 8 + 2 * h + 4 * h);
}

#[test]
fn a_tied_head_uses_the_embedding_layers_vocabulary_slice() {
    // GPT-3's head projects onto the embedding table (50257 tokens, h 12288): at t = 8 each
    // device's slice is ⌈50257 / 8⌉ = 6283 rows, held by layer 0 and not by the head.
    let gpt3 = load("workloads/gpt3-175b.toml");
    let g8 = gpt3.layer_graph(8, 1, false).unwrap();
    let head = g8.layers.last().unwrap();
    let tied = head
        .tied
        .as_ref()
        .expect("GPT-3 ties its head to the embeddings");
    assert_eq!(tied.owner, 0);
    assert_eq!(tied.tensors, vec![6283 * 12288]);
    assert_eq!(g8.layers[0].param_tensors[0], 6283 * 12288);
    // The head holds only the final layernorm.
    assert_eq!(head.params, 2 * 12288);
    // Llama's head has an output projection of its own: nothing is tied.
    let llama = load("workloads/llama2-7b.toml");
    let g1 = llama.layer_graph(1, 1, false).unwrap();
    assert!(g1.layers.iter().all(|l| l.tied.is_none()));
}

/// Where the embedding table's gradient is summed with another each micro-batch. With
/// gradient-accumulation fusion (the default) the owner's hook adds it into the main
/// gradient on any stage: an operator of the embedding's backward over its 6283 × 12288
/// slice, and nothing for the head. Without it (the Megatron-LM of 2021) autograd adds the
/// head's gradient to the table's, which only a stage holding both does: the head's tied use
/// carries one add of the fp16 gradients (two read, one written), the embedding none.
#[test]
fn the_tied_tables_gradient_sum_sits_where_it_runs() {
    let table = 6283 * 12288u64;
    let grad_add = |w: &Workload| -> Vec<(u64, u64)> {
        let g = w.layer_graph(8, 1, false).unwrap();
        g.layers[0]
            .bwd
            .ops
            .iter()
            .filter(|op| op.name == "embedding_table.grad_add")
            .map(|op| (op.bytes_read, op.bytes_written))
            .collect()
    };
    let head_sum = |w: &Workload| -> Vec<(u64, u64)> {
        let g = w.layer_graph(8, 1, false).unwrap();
        let tied = g.layers.last().unwrap().tied.clone().expect("tied head");
        w.tied_grad_sum_ops(&tied.tensors)
            .iter()
            .map(|op| (op.bytes_read, op.bytes_written))
            .collect()
    };
    let fused = load("workloads/gpt3-175b.toml");
    assert_eq!(grad_add(&fused), vec![(4 * table, 2 * table)]);
    assert!(head_sum(&fused).is_empty());
    let unfused = Workload {
        gradient_accumulation_fusion: false,
        ..load("workloads/gpt3-175b.toml")
    };
    assert!(grad_add(&unfused).is_empty());
    assert_eq!(head_sum(&unfused), vec![(4 * table, 2 * table)]);
}

#[test]
fn model_flops_match_narayanan_formula() {
    for file in GPT_WORKLOADS {
        let w = load(file);
        let Some(tandem::workload::Model::Template(t)) = Some(&w.model) else {
            unreachable!()
        };
        // Narayanan et al. (2021): 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)), 96·…·V/(16·l·h)
        // recomputing.
        let count = |recompute| {
            megatron_flops_per_iteration(
                t.layers,
                t.hidden,
                w.seq_len,
                t.vocab,
                w.global_batch,
                recompute,
            )
        };
        let (model, hardware) = (count(RecomputeMode::None), count(RecomputeMode::Full));
        assert!(
            rel_err(w.model_flops_per_iteration(), model) < 1e-3,
            "{file}"
        );
        assert!(
            rel_err(w.hardware_flops_per_iteration(true), hardware) < 1e-3,
            "{file}"
        );
        assert_eq!(
            w.hardware_flops_per_iteration(false),
            w.model_flops_per_iteration()
        );
    }
}

#[test]
fn graph_flops_are_three_times_forward_and_consistent_across_widths() {
    for file in ALL_WORKLOADS {
        let w = load(file);
        let g = w.layer_graph(1, 1, false).unwrap();
        let fwd: f64 = g.layers.iter().map(|l| gemm_flops(&l.fwd)).sum();
        let bwd: f64 = g.layers.iter().map(|l| gemm_flops(&l.bwd)).sum();
        assert!(rel_err(bwd, 2.0 * fwd) < 1e-12, "{file}");
        let model = w.model_flops_per_iteration();
        assert!(
            rel_err(3.0 * fwd * w.global_batch as f64, model) < 1e-9,
            "{file}"
        );
        // At t and micro-batch 2, t devices together do the work of 2 samples (to 1 %:
        // Megatron pads the vocabulary to a multiple of t). BERT's masked-LM dense layer is
        // replicated, so every device does all of it.
        let t = *w.valid_tp(8).last().unwrap();
        let gt = w.layer_graph(t, 2, false).unwrap();
        let all_ops = || {
            gt.layers
                .iter()
                .flat_map(|l| l.fwd.ops.iter().chain(&l.bwd.ops))
        };
        let gemm = |o: &&tandem::workload::Op| matches!(o.kind, OpKind::Gemm { .. });
        let per_device: f64 = all_ops().filter(gemm).map(|o| o.flops).sum();
        let replicated: f64 = all_ops()
            .filter(gemm)
            .filter(|o| o.name.starts_with("mlm_dense"))
            .map(|o| o.flops)
            .sum();
        let whole =
            ((per_device - replicated) * f64::from(t) + replicated) / 2.0 * w.global_batch as f64;
        assert!(rel_err(whole, model) < 0.01, "{file} t={t}");
    }
}

#[test]
fn backward_gemms_are_twice_forward_per_block() {
    for file in ALL_WORKLOADS {
        let w = load(file);
        for (t, sp) in [(1, false), (2, false), (2, true)] {
            if !w.valid_tp(2).contains(&t) {
                continue;
            }
            let g = w.layer_graph(t, 1, sp).unwrap();
            for layer in &g.layers {
                let fwd_gemms = layer
                    .fwd
                    .ops
                    .iter()
                    .filter(|o| matches!(o.kind, OpKind::Gemm { .. }))
                    .count();
                let bwd_gemms = layer
                    .bwd
                    .ops
                    .iter()
                    .filter(|o| matches!(o.kind, OpKind::Gemm { .. }))
                    .count();
                assert_eq!(bwd_gemms, 2 * fwd_gemms, "{file} {}", layer.name);
                assert_eq!(gemm_flops(&layer.bwd), 2.0 * gemm_flops(&layer.fwd));
            }
        }
    }
}

#[test]
fn gpt3_block_matches_megatron_shapes() {
    let w = load("workloads/gpt3-175b.toml");
    let g = w.layer_graph(8, 1, false).unwrap();
    let fwd = &block(&g).fwd;
    let kind = |name: &str| fwd.ops[op_index(fwd, name)].kind;
    let (s, h) = (2048, 12288);
    assert_eq!(
        kind("qkv"),
        OpKind::Gemm {
            batch: 1,
            m: s,
            n: 3 * h / 8,
            k: h
        }
    );
    assert_eq!(
        kind("qk"),
        OpKind::Gemm {
            batch: 12,
            m: s,
            n: s,
            k: 128
        }
    );
    assert_eq!(
        kind("av"),
        OpKind::Gemm {
            batch: 12,
            m: s,
            n: 128,
            k: s
        }
    );
    assert_eq!(
        kind("proj"),
        OpKind::Gemm {
            batch: 1,
            m: s,
            n: h,
            k: h / 8
        }
    );
    assert_eq!(
        kind("ffn_down"),
        OpKind::Gemm {
            batch: 1,
            m: s,
            n: h,
            k: 4 * h / 8
        }
    );
    // Topological order and a chain of layers: embedding, 96 blocks, head.
    for layer in &g.layers {
        assert!(layer.fwd.edges.iter().all(|&(i, j)| i < j));
        assert!(layer.bwd.edges.iter().all(|&(i, j)| i < j));
    }
    assert_eq!(g.layers.len(), 98);
    assert_eq!(g.edges.len(), 97);
    assert!(g
        .edges
        .iter()
        .all(|&(i, j, bytes)| j == i + 1 && bytes == s * h * 2));
    let signatures: BTreeSet<&str> = g.layers[1..97]
        .iter()
        .map(|l| l.signature.as_str())
        .collect();
    assert_eq!(signatures.len(), 1);
    assert_eq!(
        g.layers[1].signature,
        "gpt-block h12288 a96 kv96 f49152 v50257 s2048 b1 t8 sp0 bf16"
    );
}

#[test]
fn gpt3_activation_bytes_match_korthikanti() {
    // s·b·h = 2048·12288 = 25 165 824; 5as/h = 80.
    let w = load("workloads/gpt3-175b.toml");
    let act = |t, sp| block(&w.layer_graph(t, 1, sp).unwrap()).activation_bytes;
    let a1 = act(1, false);
    assert_eq!(a1.none, 2_868_903_936); // sbh·(34 + 80)
    assert_eq!(a1.selective, 855_638_016); // sbh·34
    assert_eq!(a1.full, 50_331_648); // 2·sbh
    let a8 = act(8, false);
    assert_eq!(a8.none, 578_813_952); // sbh·(10 + 24/8 + 80/8)
    assert_eq!(a8.selective, 327_155_712); // sbh·(10 + 3)
    assert_eq!(a8.full, 50_331_648);
    let sp = act(8, true);
    assert_eq!(sp.none, 358_612_992); // sbh·(34/8 + 10)
    assert_eq!(sp.selective, 106_954_752); // sbh·34/8
    assert_eq!(sp.full, 6_291_456); // 2·sbh/8
                                    // Linear in the micro-batch.
    let a4 = block(&w.layer_graph(8, 4, true).unwrap()).activation_bytes;
    assert_eq!(a4.none, 4 * sp.none);
    assert_eq!(
        block(&w.layer_graph(1, 1, false).unwrap()).output_bytes,
        50_331_648
    );
}

#[test]
fn collectives_present_iff_tp_with_megatron_sizes() {
    let w = load("workloads/gpt3-175b.toml");
    let sbh2 = 2048 * 12288 * 2;
    let g1 = w.layer_graph(1, 1, false).unwrap();
    for layer in &g1.layers {
        assert!(collectives(&layer.fwd).is_empty());
        assert!(collectives(&layer.bwd).is_empty());
    }
    let g8 = w.layer_graph(8, 1, false).unwrap();
    let b = block(&g8);
    let ar = (CollectiveKind::AllReduce, sbh2, 8);
    assert_eq!(collectives(&b.fwd), vec![ar, ar]);
    assert_eq!(collectives(&b.bwd), vec![ar, ar]);
    // Backward all-reduces follow the column-parallel input-gradient GEMMs.
    let bwd = &b.bwd;
    for (dgrad, reduce) in [("qkv.dgrad", "tp_attn_in"), ("ffn_up.dgrad", "tp_mlp_in")] {
        let (i, j) = (op_index(bwd, dgrad), op_index(bwd, reduce));
        assert!(bwd.edges.contains(&(i, j)), "{dgrad} -> {reduce}");
    }
    // The forward all-reduces follow the row-parallel GEMMs.
    let fwd = &b.fwd;
    assert!(fwd
        .edges
        .contains(&(op_index(fwd, "proj"), op_index(fwd, "tp_attn_out"))));
    // Sequence parallel: all-gather before, reduce-scatter after; duals in backward, where
    // each column-parallel projection's input is also gathered again for its weight gradient.
    let sp = w.layer_graph(8, 1, true).unwrap();
    let b = block(&sp);
    let ag = (CollectiveKind::AllGather, sbh2, 8);
    let rs = (CollectiveKind::ReduceScatter, sbh2, 8);
    assert_eq!(collectives(&b.fwd), vec![ag, rs, ag, rs]);
    assert_eq!(collectives(&b.bwd), vec![ag, ag, rs, ag, ag, rs]);
    // Layernorm work is divided by t under sequence parallelism.
    let ln = &b.fwd.ops[op_index(&b.fwd, "ln1")];
    assert!(matches!(ln.kind, OpKind::Vector { elements, .. } if elements == 2048 * 12288 / 8));
}

/// One device's compute of a tensor-parallel block (what a single GPU times of a slice): every
/// non-collective operator once, in order, and one operator depends on another exactly when
/// it did through the removed collectives.
#[test]
fn without_collectives_keeps_compute_and_its_order() {
    let w = load("workloads/gpt3-175b.toml");
    for sp in [false, true] {
        let b = block(&w.layer_graph(8, 1, sp).unwrap()).clone();
        for graph in [&b.fwd, &b.bwd] {
            let compute = graph.without_collectives();
            let kept: Vec<usize> = (0..graph.ops.len())
                .filter(|&i| !matches!(graph.ops[i].kind, OpKind::Collective { .. }))
                .collect();
            assert_eq!(compute.ops.len(), kept.len());
            assert!(collectives(&compute).is_empty());
            for (new, &old) in kept.iter().enumerate() {
                assert_eq!(compute.ops[new], graph.ops[old]);
            }
            assert!(compute.edges.iter().all(|&(a, b)| a < b));
            for (x, &i) in kept.iter().enumerate() {
                for (y, &j) in kept.iter().enumerate() {
                    if x != y {
                        assert_eq!(
                            reaches(&compute, x, y),
                            reaches(graph, i, j),
                            "{} -> {}",
                            graph.ops[i].name,
                            graph.ops[j].name
                        );
                    }
                }
            }
        }
        // The row-parallel projection still precedes the residual add it fed via the all-reduce.
        let compute = b.fwd.without_collectives();
        assert!(reaches(
            &compute,
            op_index(&compute, "proj"),
            op_index(&compute, "residual1")
        ));
    }
    // Without tensor parallelism there is nothing to remove.
    let b1 = block(&w.layer_graph(1, 1, false).unwrap()).clone();
    assert_eq!(b1.fwd.without_collectives(), *b1.fwd);
}

#[test]
fn llama_block_is_swiglu_rmsnorm_rotary_gqa() {
    let w = load("workloads/llama2-70b.toml");
    let g = w.layer_graph(8, 1, false).unwrap();
    let fwd = &block(&g).fwd;
    let (gate, up) = (op_index(fwd, "ffn_gate"), op_index(fwd, "ffn_up"));
    assert!(!reaches(fwd, gate, up) && !reaches(fwd, up, gate));
    let mul = op_index(fwd, "swiglu_mul");
    assert!(reaches(fwd, gate, mul) && reaches(fwd, up, mul));
    // GQA: q h/t + 2·kv·d/t = 1024 + 2·8·128/8.
    assert!(matches!(
        fwd.ops[op_index(fwd, "qkv")].kind,
        OpKind::Gemm {
            n: 1280,
            k: 8192,
            ..
        }
    ));
    assert!(fwd.ops.iter().any(|o| o.name == "rotary"));
    assert!(fwd.ops.iter().all(|o| !o.name.contains("dropout")));
    assert!(matches!(
        fwd.ops[op_index(fwd, "ln1")].kind,
        OpKind::Vector {
            op: tandem::workload::VectorOp::RmsNorm,
            ..
        }
    ));
    // Gate and up gradients run independently in backward too.
    let bwd = &block(&g).bwd;
    let (gd, ud) = (
        op_index(bwd, "ffn_gate.dgrad"),
        op_index(bwd, "ffn_up.dgrad"),
    );
    assert!(!reaches(bwd, gd, ud) && !reaches(bwd, ud, gd));
    // Widths above kv_heads = 8 replicate K and V across the devices sharing a head.
    assert_eq!(w.valid_tp(64), vec![1, 2, 4, 8, 16, 32, 64]);
    assert_eq!(
        block(&w.layer_graph(32, 1, false).unwrap())
            .replicated
            .group,
        4
    );
}

#[test]
fn bytes_per_param_by_optimizer_and_precision() {
    let w = load("workloads/gpt3-175b.toml");
    assert_eq!(w.precision, Precision::Bf16);
    assert_eq!(w.optimizer, Optimizer::Adam);
    assert_eq!(w.bytes_per_param().total(), 16);
    let mut sgd = w.clone();
    sgd.optimizer = Optimizer::Sgd;
    assert_eq!(sgd.bytes_per_param().total(), 4);
    let mut fp32 = w.clone();
    fp32.precision = Precision::Fp32;
    assert_eq!(fp32.bytes_per_param().total(), 16);
    assert_eq!(fp32.bytes_per_param().optimizer, 8);
    assert_eq!(w.tokens_per_sample(), 2048);
}

/// The optimizer step's kernels and the bytes each streams per parameter: in mixed precision
/// the gradients cast up to fp32 (2 B in, 4 out), fused Adam over fp32 weights, gradients and
/// moments (16 in, 12 out), the weights cast back down (4 in, 2 out); in fp32 Adam alone;
/// SGD reads weights and gradients and writes the weights.
#[test]
fn optimizer_step_kernels_by_optimizer_and_precision() {
    let w = load("workloads/gpt3-175b.toml");
    let params = 1_000_000u64;
    // "name primitive pass bytes-read/bytes-written per parameter", one per kernel.
    let kernels = |w: &Workload| -> Vec<String> {
        w.optimizer_step_ops(&[params])
            .iter()
            .map(|op| match op.kind {
                OpKind::Vector {
                    op: prim,
                    elements,
                    pass,
                    ..
                } => {
                    assert_eq!(elements, params, "{}", op.name);
                    let (read, written) = (op.bytes_read / params, op.bytes_written / params);
                    format!("{} {} {pass:?} {read}/{written}", op.name, prim.name())
                }
                _ => panic!("{} is not a vector kernel", op.name),
            })
            .collect()
    };
    // bf16 mixed-precision Adam, clipped (the defaults): 44 B per parameter.
    assert_eq!(
        kernels(&w),
        [
            "grads_to_fp32 cast Forward 2/4",
            "grad_norm norm Forward 4/0",
            "optimizer_step update Forward 16/12",
            "weights_from_fp32 cast Backward 4/2",
        ]
    );
    let mut fp32 = w.clone();
    fp32.precision = Precision::Fp32;
    assert_eq!(
        kernels(&fp32),
        [
            "grad_norm norm Forward 4/0",
            "optimizer_step update Forward 16/12"
        ]
    );
    let mut sgd = w.clone();
    sgd.optimizer = Optimizer::Sgd;
    sgd.gradient_clipping = false;
    assert_eq!(kernels(&sgd), ["optimizer_step add Forward 4/2"]);
    // fp16 scales the loss by default: the scale comes off the fp32 gradients first.
    let tmp = tempfile::Builder::new()
        .prefix("tandem-recipe-")
        .tempdir()
        .expect("dir");
    let dir = tmp.path();
    let text = std::fs::read_to_string("workloads/gpt3-175b.toml").expect("read");
    let file = dir.join("fp16.toml");
    std::fs::write(&file, format!("{text}\nprecision = \"fp16\"\n")).expect("write");
    let fp16 = load(file.to_str().expect("utf-8"));
    assert!(fp16.loss_scaling && fp16.gradient_clipping);
    assert_eq!(
        kernels(&fp16),
        [
            "grads_to_fp32 cast Forward 2/4",
            "unscale_grads scale Forward 4/4",
            "grad_norm norm Forward 4/0",
            "optimizer_step update Forward 16/12",
            "weights_from_fp32 cast Backward 4/2",
        ]
    );
    // Both are recipe choices a workload file can turn off.
    std::fs::write(
        &file,
        format!("{text}\nprecision = \"fp16\"\nloss_scaling = false\ngradient_clipping = false\n"),
    )
    .expect("write");
    let plain = load(file.to_str().expect("utf-8"));
    assert_eq!(kernels(&plain).len(), 3);
    // Gradient accumulation: fused into the GEMMs by default, no kernel of its own; unfused,
    // a kernel reading both fp16 gradients and writing the sum.
    assert!(fp16.gradient_accumulation_fusion);
    assert!(fp16.grad_accumulation_ops(&[params]).is_empty());
    std::fs::write(
        &file,
        format!("{text}\nprecision = \"fp16\"\ngradient_accumulation_fusion = false\n"),
    )
    .expect("write");
    let separate = load(file.to_str().expect("utf-8"));
    let accumulate = separate.grad_accumulation_ops(&[params]);
    assert_eq!(accumulate.len(), 1);
    assert_eq!(
        (accumulate[0].bytes_read, accumulate[0].bytes_written),
        (4 * params, 2 * params)
    );
    assert!(separate.grad_accumulation_ops(&[]).is_empty());
}

/// Each layer's parameter tensors, counted by hand: a GPT block has two LayerNorms (scale
/// and shift each), the fused QKV and output projections and the two feed-forward
/// projections, each with a bias (12 tensors); the embedding its token and position tables;
/// the head its final LayerNorm (the output projection is the tied token table). GPT-1.7B
/// has 24·12 + 4 = 292, the parameters collect.py's training step copies one by one. A
/// Llama block (RMSNorm, no biases, gate and up projections fused) has 2 + 2 + 2 = 6, its
/// untied head the norm and the output projection; Mixtral's expert blocks add the router
/// and two tensors per expert. In every bundled workload the tensors add up to the layer's
/// parameters, at every tensor width.
#[test]
fn parameter_tensors_are_counted_per_layer_and_add_up_to_the_parameters() {
    let tensors = |path: &str, tp: u32| -> Vec<usize> {
        let w = load(path);
        let graph = w.layer_graph(tp, 1, false).expect("graph");
        graph.layers.iter().map(|l| l.param_tensors.len()).collect()
    };
    let gpt = tensors("workloads/gpt-1.7b.toml", 1);
    assert_eq!(gpt.len(), 26);
    assert_eq!((gpt[0], gpt[1], gpt[25]), (2, 12, 2));
    assert_eq!(gpt.iter().sum::<usize>(), 24 * 12 + 4);
    let llama = tensors("workloads/llama2-7b.toml", 1);
    assert_eq!((llama[0], llama[1], llama[llama.len() - 1]), (1, 6, 2));
    let mixtral = tensors("workloads/mixtral-8x7b.toml", 1);
    assert_eq!(mixtral[1], 2 + 2 + 1 + 8 * 2);
    let gpt = load("workloads/gpt-1.7b.toml");
    let graph = gpt.layer_graph(1, 1, false).expect("graph");
    let h = 2304u64;
    assert_eq!(
        graph.layers[1].param_tensors,
        [
            h,
            h,
            h,
            h,
            3 * h * h,
            h * h,
            3 * h,
            h,
            4 * h * h,
            h * 4 * h,
            4 * h,
            h
        ]
    );
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads"))
        .expect("workloads")
    {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let w = Workload::load(&path).expect("workload");
        for tp in w.valid_tp(8) {
            let graph = w.layer_graph(tp, 1, false).expect("graph");
            for layer in &graph.layers {
                assert_eq!(
                    layer.param_tensors.iter().sum::<u64>(),
                    layer.params,
                    "{} t{tp} {}",
                    path.display(),
                    layer.name
                );
                assert!(layer.param_tensors.iter().all(|&n| n > 0));
            }
        }
    }
}

/// `param_kernels = "per_tensor"` launches the casts to and from the fp32 main weights and
/// the gradient accumulation once per tensor, each over its own elements; the per-layer
/// default once over all of them; `per_tensor_grads` the gradients' kernels per tensor and
/// the weights' cast per layer. Adam and the gradient norm stay one kernel per layer.
#[test]
fn per_tensor_parameter_kernels_visit_each_tensor() {
    let mut w = load("workloads/gpt-1.7b.toml");
    w.gradient_accumulation_fusion = false;
    let tensors = [4u64, 1000, 7];
    let summary = |w: &Workload| -> Vec<(String, u64)> {
        w.optimizer_step_ops(&tensors)
            .into_iter()
            .chain(w.grad_accumulation_ops(&tensors))
            .map(|op| match op.kind {
                OpKind::Vector { elements, .. } => (op.name, elements),
                _ => panic!("{} is not a vector kernel", op.name),
            })
            .collect()
    };
    let named = |list: &[(&str, u64)]| -> Vec<(String, u64)> {
        list.iter().map(|&(n, e)| (n.to_string(), e)).collect()
    };
    assert_eq!(
        summary(&w),
        named(&[
            ("grads_to_fp32", 1011),
            ("grad_norm", 1011),
            ("optimizer_step", 1011),
            ("weights_from_fp32", 1011),
            ("grad_accumulate", 1011),
        ])
    );
    w.param_kernels = ParamKernels::PerTensor;
    assert_eq!(
        summary(&w),
        named(&[
            ("grads_to_fp32", 4),
            ("grads_to_fp32", 1000),
            ("grads_to_fp32", 7),
            ("grad_norm", 1011),
            ("optimizer_step", 1011),
            ("weights_from_fp32", 4),
            ("weights_from_fp32", 1000),
            ("weights_from_fp32", 7),
            ("grad_accumulate", 4),
            ("grad_accumulate", 1000),
            ("grad_accumulate", 7),
        ])
    );
    // Megatron-LM 2021: the gradients tensor by tensor, the weights back in one kernel.
    w.param_kernels = ParamKernels::PerTensorGrads;
    assert_eq!(
        summary(&w),
        named(&[
            ("grads_to_fp32", 4),
            ("grads_to_fp32", 1000),
            ("grads_to_fp32", 7),
            ("grad_norm", 1011),
            ("optimizer_step", 1011),
            ("weights_from_fp32", 1011),
            ("grad_accumulate", 4),
            ("grad_accumulate", 1000),
            ("grad_accumulate", 7),
        ])
    );
}

/// The optimizer step's update and gradient norm are multi-tensor kernels: a launch per 320
/// chunks of 65 536 elements (PyTorch's `multi_tensor_apply`), so a layer of 320 × 65 536 × 3 / 2
/// parameters holds one and a half launches of each; the casts stay a kernel per tensor (or
/// per layer), the weights' copy back of Megatron-LM 2021 (`per_tensor_grads`) is
/// multi-tensor too. PyTorch's softmax backward is two kernels, its cross-entropy two forward
/// and four backward.
#[test]
fn launches_count_multi_tensor_chunks_and_multi_kernel_operators() {
    let mut w = load("workloads/gpt-1.7b.toml");
    let chunks = 320 * 65_536u64;
    let tensors = [chunks, chunks / 2];
    let launches = |w: &Workload| -> Vec<(String, f64)> {
        w.optimizer_step_ops(&tensors)
            .iter()
            .map(|op| (op.name.clone(), op.launches()))
            .collect()
    };
    let named = |list: &[(&str, f64)]| -> Vec<(String, f64)> {
        list.iter().map(|&(n, l)| (n.to_string(), l)).collect()
    };
    assert_eq!(
        launches(&w),
        named(&[
            ("grads_to_fp32", 1.0),
            ("grad_norm", 1.5),
            ("optimizer_step", 1.5),
            ("weights_from_fp32", 1.0),
        ])
    );
    w.param_kernels = ParamKernels::PerTensorGrads;
    assert_eq!(
        launches(&w),
        named(&[
            ("grads_to_fp32", 1.0),
            ("grads_to_fp32", 1.0),
            ("grad_norm", 1.5),
            ("optimizer_step", 1.5),
            ("weights_from_fp32", 1.5),
        ])
    );
    let graph = w.layer_graph(1, 1, false).expect("graph");
    let launches_of = |name: &str| -> Vec<f64> {
        graph
            .layers
            .iter()
            .flat_map(|l| l.fwd.ops.iter().chain(&l.bwd.ops))
            .filter(|op| op.name.starts_with(name))
            .map(|op| op.launches())
            .collect()
    };
    assert_eq!(launches_of("softmax")[..2], [1.0, 2.0]);
    assert_eq!(launches_of("cross_entropy"), [2.0, 4.0]);
    assert_eq!(launches_of("qkv")[..3], [1.0, 1.0, 1.0]);
}

#[test]
fn dag_workload_loads_scales_and_derives_backward() {
    let w = load("examples/dag-workload.json");
    assert!(w.gradient_accumulation_fusion);
    // The recipe knobs of a template file work in a DAG file too.
    let tmp = tempfile::Builder::new()
        .prefix("tandem-dag-recipe-")
        .tempdir()
        .expect("dir");
    let dir = tmp.path();
    let text = std::fs::read_to_string("examples/dag-workload.json").expect("read");
    let file = dir.join("separate.json");
    let separate_text = text.replacen('{', "{\"gradient_accumulation_fusion\": false, ", 1);
    std::fs::write(&file, separate_text).expect("write");
    assert!(!load(file.to_str().expect("utf-8")).gradient_accumulation_fusion);
    assert_eq!(w.checkpoint, Checkpoint::Rerun);
    let file = dir.join("stop-early.json");
    std::fs::write(
        &file,
        text.replacen('{', "{\"checkpoint\": \"stop_early\", ", 1),
    )
    .expect("write");
    assert_eq!(
        load(file.to_str().expect("utf-8")).checkpoint,
        Checkpoint::StopEarly
    );
    let file = dir.join("checkpoint-typo.json");
    std::fs::write(
        &file,
        text.replacen('{', "{\"checkpoint\": \"stop-early\", ", 1),
    )
    .expect("write");
    let err = Workload::load(&file).unwrap_err().to_string();
    assert!(
        err.contains("checkpoint-typo.json")
            && err.contains("`checkpoint`")
            && err.contains("unknown value `stop-early`"),
        "{err}"
    );
    assert_eq!(w.total_params(), 288_768 + 262_656 + 525_568 + 256_000);
    assert_eq!(w.valid_tp(8), vec![1]);
    let g1 = w.layer_graph(1, 1, false).unwrap();
    let g4 = w.layer_graph(1, 4, false).unwrap();
    assert_eq!(
        g4.edges,
        vec![
            (0, 1, 262_144),
            (0, 2, 262_144),
            (1, 3, 262_144),
            (2, 3, 262_144)
        ]
    );
    for (a, b) in g1.layers.iter().zip(&g4.layers) {
        assert_eq!(b.params, a.params);
        assert_eq!(b.activation_bytes.none, 4 * a.activation_bytes.none);
        assert_eq!(b.output_bytes, 4 * a.output_bytes);
        assert_eq!(gemm_flops(&b.fwd), 4.0 * gemm_flops(&a.fwd));
        assert_eq!(b.fwd.total_flops(), 4.0 * a.fwd.total_flops());
    }
    let attn = &g4.layers[1];
    assert_eq!(
        attn.fwd.ops[4].kind,
        OpKind::Gemm {
            batch: 16,
            m: 128,
            n: 128,
            k: 64
        }
    );
    assert_eq!(
        attn.fwd.ops[1].kind,
        OpKind::Gemm {
            batch: 1,
            m: 512,
            n: 256,
            k: 256
        }
    );
    // Q, K and V run in parallel; derived backward has two GEMMs per forward GEMM.
    assert!(!reaches(&attn.fwd, 1, 2) && !reaches(&attn.fwd, 2, 3));
    assert_eq!(gemm_flops(&attn.bwd), 2.0 * gemm_flops(&attn.fwd));
    // Model FLOPs: (fwd + bwd GEMMs per sample) × global batch 64.
    let per_sample: f64 = g1
        .layers
        .iter()
        .map(|l| gemm_flops(&l.fwd) + gemm_flops(&l.bwd))
        .sum();
    assert_eq!(w.model_flops_per_iteration(), 64.0 * per_sample);
    // Explicit backward is taken as given.
    assert_eq!(g1.layers[3].bwd.ops.len(), 4);
    assert_eq!(g1.layers[3].bwd.edges, vec![(0, 1), (0, 2), (1, 3)]);
    let err = w.layer_graph(2, 1, false).unwrap_err().to_string();
    assert!(
        err.contains("dag-workload.json") && err.contains("`tp`") && err.contains("only tp = 1"),
        "{err}"
    );
}

#[test]
fn identical_dag_layers_share_a_signature() {
    let w = load("examples/dag-workload.json");
    let g = w.layer_graph(1, 2, false).unwrap();
    let sigs: BTreeSet<&str> = g.layers.iter().map(|l| l.signature.as_str()).collect();
    assert_eq!(sigs.len(), 4);
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/dag-workload.json"),
    )
    .unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut copy = json["layers"][2].clone();
    copy["name"] = "mlp_tower_2".into();
    json["layers"].as_array_mut().unwrap().push(copy);
    json["edges"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!([3, 4, 512]));
    let path = write_temp("dag-copy.json", &json.to_string());
    let w = Workload::load(&path).unwrap();
    let g = w.layer_graph(1, 2, false).unwrap();
    assert_eq!(g.layers[2].signature, g.layers[4].signature);
}

/// A file in a directory of its own, both removed when dropped.
struct TempFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for TempFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

fn write_temp(name: &str, text: &str) -> TempFile {
    let dir = tempfile::Builder::new()
        .prefix("tandem-workload-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    TempFile { path, _dir: dir }
}

const GOOD: &str = "name = \"tiny\"\nfamily = \"gpt\"\nlayers = 2\nhidden = 64\nheads = 4\n\
vocab = 100\nseq_len = 16\nglobal_batch = 8\n";

fn load_error(file: &str, text: &str) -> String {
    let path = write_temp(file, text);
    Workload::load(&path).unwrap_err().to_string()
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "`{message}` lacks `{part}`");
    }
}

#[test]
fn bad_inputs_name_file_field_and_reason() {
    assert!(Workload::load(&write_temp("good.toml", GOOD)).is_ok());
    let e = load_error("heads.toml", &GOOD.replace("heads = 4", "heads = 3"));
    assert_mentions(
        &e,
        &["heads.toml", "`heads`", "do not divide hidden size 64"],
    );
    let e = load_error("negative.toml", &GOOD.replace("layers = 2", "layers = -2"));
    assert_mentions(
        &e,
        &[
            "negative.toml",
            "`layers`",
            "must be a positive integer, got -2",
        ],
    );
    let e = load_error("family.toml", &GOOD.replace("\"gpt\"", "\"mamba\""));
    assert_mentions(&e, &["family.toml", "`family`", "unknown family `mamba`"]);
    let e = load_error(
        "malformed.toml",
        &GOOD.replace("layers = 2", "layers = = 2"),
    );
    assert_mentions(&e, &["malformed.toml", "malformed TOML", "layers"]);
    let e = load_error("unknown.toml", &format!("{GOOD}attention_dropout = 0.1\n"));
    assert_mentions(&e, &["unknown.toml", "unknown field `attention_dropout`"]);
    let e = load_error("dropout.toml", &format!("{GOOD}dropout = 0.1\n"));
    assert_mentions(&e, &["dropout.toml", "dropout", "expected a boolean"]);
    let e = load_error("act.toml", &format!("{GOOD}activation = \"swish\"\n"));
    assert_mentions(
        &e,
        &["act.toml", "activation", "unknown variant `swish`", "geglu"],
    );
    let e = load_error("ckpt.toml", &format!("{GOOD}checkpoint = \"sometimes\"\n"));
    assert_mentions(
        &e,
        &[
            "ckpt.toml",
            "`checkpoint`",
            "unknown value `sometimes`; expected one of rerun, stop_early",
        ],
    );
    let e = load_error("hd.toml", &format!("{GOOD}head_dim = 0\n"));
    assert_mentions(&e, &["hd.toml", "`head_dim`", "got 0"]);
    let e = load_error("hd-wide.toml", &format!("{GOOD}head_dim = 2000000\n"));
    assert_mentions(&e, &["hd-wide.toml", "`head_dim`", "larger than"]);
    let e = load_error("kv.toml", &format!("{GOOD}kv_heads = 3\n"));
    assert_mentions(&e, &["kv.toml", "`kv_heads`", "do not divide 4 heads"]);
    let e = load_error("zero.toml", &GOOD.replace("vocab = 100", "vocab = 0"));
    assert_mentions(&e, &["zero.toml", "`vocab`", "got 0"]);
    let e = load_error("huge.toml", &GOOD.replace("layers = 2", "layers = 100000"));
    assert_mentions(
        &e,
        &[
            "huge.toml",
            "`layers`",
            "larger than the supported maximum 65536",
        ],
    );
    let tiny = Workload::load(&write_temp("tiny.toml", GOOD)).unwrap();
    let e = tiny.layer_graph(1, 9, false).unwrap_err().to_string();
    assert_mentions(
        &e,
        &["tiny.toml", "`micro_batch`", "exceeds the global batch 8"],
    );
    let odd_seq = write_temp("odd.toml", &GOOD.replace("seq_len = 16", "seq_len = 18"));
    let odd_seq = Workload::load(&odd_seq).unwrap();
    assert!(odd_seq.layer_graph(4, 1, false).is_ok());
    let e = odd_seq.layer_graph(4, 1, true).unwrap_err().to_string();
    assert_mentions(&e, &["odd.toml", "`tp`", "divide seq_len = 18"]);
    // Tensor width that does not divide the heads (GPT-2 XL has 25).
    let xl = load("workloads/gpt2-xl.toml");
    let e = xl.layer_graph(2, 1, false).unwrap_err().to_string();
    assert_mentions(&e, &["gpt2-xl.toml", "`tp`", "does not divide heads = 25"]);
    assert_eq!(xl.valid_tp(8), vec![1]);
    let e = xl.layer_graph(1, 0, false).unwrap_err().to_string();
    assert_mentions(&e, &["gpt2-xl.toml", "`micro_batch`"]);
    // Operator DAG errors.
    let dag = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/dag-workload.json"),
    )
    .unwrap();
    let e = load_error(
        "edge.json",
        &dag.replace("[[0, 1], [1, 2], [2, 3]]", "[[0, 1], [2, 1], [2, 3]]"),
    );
    assert_mentions(&e, &["edge.json", "`layers[2].fwd.edges[1]`", "i < j"]);
    let e = load_error(
        "names.json",
        &dag.replace("\"mlp_tower\"", "\"attention_tower\""),
    );
    assert_mentions(&e, &["names.json", "`layers[2].name`", "unique"]);
    let e = load_error("size.json", &dag.replace("\"n\": 1024", "\"n\": 0"));
    assert_mentions(
        &e,
        &["size.json", "`layers[2].fwd.ops[1].kind`", "positive"],
    );
    let e = load_error(
        "layer_edge.json",
        &dag.replace("[2, 3, 65536]", "[3, 3, 65536]"),
    );
    assert_mentions(&e, &["layer_edge.json", "`edges[3]`", "i < j"]);
    // Parameter tensors: each holds parameters, together the layer's.
    let tensors = |list: &str| {
        dag.replace(
            "\"params\": 262656,",
            &format!("\"params\": 262656, \"param_tensors\": {list},"),
        )
    };
    let e = load_error("sum.json", &tensors("[65536, 65536, 65536, 65536, 256]"));
    assert_mentions(
        &e,
        &["sum.json", "`layers[1].param_tensors`", "params = 262656"],
    );
    let e = load_error(
        "empty-tensor.json",
        &tensors("[65536, 65536, 65536, 65536, 512, 0]"),
    );
    assert_mentions(
        &e,
        &[
            "empty-tensor.json",
            "`layers[1].param_tensors[5]`",
            "at least one",
        ],
    );
    let e = load_error(
        "kernels.json",
        &dag.replace(
            "\"layers\": [",
            "\"param_kernels\": \"per_op\", \"layers\": [",
        ),
    );
    assert_mentions(
        &e,
        &["kernels.json", "`param_kernels`", "unknown value `per_op`"],
    );
    let wrapped = write_temp(
        "wrapped.json",
        &dag.replace("\"layers\": [", "\"ddp\": \"megatron\", \"layers\": ["),
    );
    assert_eq!(Workload::load(&wrapped).unwrap().ddp, Ddp::Megatron);
    let e = load_error(
        "wrapper.json",
        &dag.replace("\"layers\": [", "\"ddp\": \"fsdp\", \"layers\": ["),
    );
    assert_mentions(&e, &["wrapper.json", "`ddp`", "unknown value `fsdp`"]);
    let per_tensor = write_temp(
        "per-tensor.json",
        &tensors("[65536, 65536, 65536, 65536, 256, 256]").replace(
            "\"layers\": [",
            "\"param_kernels\": \"per_tensor\", \"layers\": [",
        ),
    );
    let per_tensor = Workload::load(&per_tensor).unwrap();
    let graph = per_tensor.layer_graph(1, 1, false).unwrap();
    assert_eq!(graph.layers[1].param_tensors.len(), 6);
    assert_eq!(graph.layers[0].param_tensors, [288768]);
    let casts = |tensors: &[u64]| {
        per_tensor
            .optimizer_step_ops(tensors)
            .iter()
            .filter(|op| op.name == "grads_to_fp32")
            .count()
    };
    assert_eq!(casts(&graph.layers[1].param_tensors), 6);
    assert_eq!(casts(&graph.layers[0].param_tensors), 1);
    let e = load_error(
        "kernels.toml",
        &format!("{GOOD}param_kernels = \"per_op\"\n"),
    );
    assert_mentions(
        &e,
        &[
            "kernels.toml",
            "`param_kernels`",
            "unknown value `per_op`",
            "per_tensor",
        ],
    );
}

/// Megatron's backward sums the output gradient of every biased linear over the tokens and
/// the LayerNorms' weight gradients over their input and output gradient: one column sum per
/// bias (reading tokens × width) and per norm (reading both tensors), nothing waiting on them.
#[test]
fn gpt_block_backward_has_bias_and_norm_weight_gradients() {
    let w = load("workloads/gpt3-175b.toml");
    let (h, s, b, t) = (12_288u64, 2048u64, 2u64, 4u64);
    let graph = w.layer_graph(t as u32, b as u32, false).expect("graph");
    let bwd = &block(&graph).bwd;
    let tokens = s * b;
    let expected = [
        ("qkv.bias_grad", tokens * 3 * h / t, 3 * h / t),
        ("proj.bias_grad", tokens * h, h),
        ("ffn_up.bias_grad", tokens * 4 * h / t, 4 * h / t),
        ("ffn_down.bias_grad", tokens * h, h),
        ("ln1.wgrad", 2 * tokens * h, h),
        ("ln2.wgrad", 2 * tokens * h, h),
    ];
    for (name, elements, columns) in expected {
        let i = op_index(bwd, name);
        let op = &bwd.ops[i];
        match op.kind {
            OpKind::Vector {
                elements: e,
                row_len,
                ..
            } => {
                assert_eq!((e, row_len), (elements, columns), "{name}");
            }
            _ => panic!("{name} is not a vector op"),
        }
        assert_eq!(
            op.bytes_read,
            2 * elements,
            "{name}: reads its input once (fp16)"
        );
        assert_eq!(
            op.bytes_written,
            2 * columns,
            "{name}: one value per column"
        );
        assert!(
            bwd.edges.iter().all(|&(from, _)| from != i),
            "{name} feeds nothing"
        );
    }
    let column_sums = |graph: &OpGraph| {
        graph
            .ops
            .iter()
            .filter(|o| {
                matches!(
                    o.kind,
                    OpKind::Vector {
                        op: VectorOp::ColumnSum,
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(column_sums(bwd), 6);
    // LLaMA has no biases: only its two RMSNorms' weight gradients.
    let llama = load("workloads/llama2-7b.toml");
    let graph = llama.layer_graph(1, 1, false).expect("graph");
    let llama_bwd = &block(&graph).bwd;
    assert_eq!(column_sums(llama_bwd), 2);
    op_index(llama_bwd, "ln1.wgrad");
    op_index(llama_bwd, "ln2.wgrad");
}

/// `attention_softmax = "fused_causal"` (Megatron-LM's kernel) replaces the attention's
/// softmax with the causal one: the same scores, read up to the diagonal (half of them) and
/// written whole, 3 B per fp16 element forward and 4 B backward; BERT's bidirectional
/// attention cannot take it.
#[test]
fn fused_causal_softmax_reads_half_the_scores() {
    let text = format!("{GOOD}attention_softmax = \"fused_causal\"\n");
    let fused = Workload::load(&write_temp("fused.toml", &text)).expect("loads");
    let plain = Workload::load(&write_temp("plain.toml", GOOD)).expect("loads");
    // 2 sequences of 16 tokens, 4 heads: 2 · 4 · 16² scores.
    let scores = 2 * 4 * 16 * 16;
    for (w, op, read, written) in [
        (&fused, VectorOp::CausalSoftmax, scores, 2 * scores),
        (&plain, VectorOp::Softmax, 2 * scores, 2 * scores),
    ] {
        let graph = w.layer_graph(1, 2, false).expect("graph");
        let fwd = &block(&graph).fwd;
        let softmax = &fwd.ops[op_index(fwd, "softmax")];
        assert_eq!(
            softmax.kind,
            OpKind::Vector {
                op,
                elements: scores,
                row_len: 16,
                pass: Pass::Forward,
            }
        );
        assert_eq!((softmax.bytes_read, softmax.bytes_written), (read, written));
        let bwd = &block(&graph).bwd;
        let grad = &bwd.ops[op_index(bwd, "softmax.bwd")];
        assert_eq!(grad.bytes_read, 2 * read, "{op:?} backward reads y and dy");
    }
    let e = load_error(
        "bert-fused.toml",
        &text.replace("family = \"gpt\"", "family = \"bert\""),
    );
    assert_mentions(
        &e,
        &["bert-fused.toml", "`attention_softmax`", "bidirectional"],
    );
    let e = load_error(
        "fused-typo.toml",
        &format!("{GOOD}attention_softmax = \"fused\"\n"),
    );
    assert_mentions(
        &e,
        &["fused-typo.toml", "unknown variant `fused`", "fused_causal"],
    );
}

/// `cross_entropy = "vocab_parallel"` (Megatron-LM's loss) replaces the fused loss kernel with
/// one kernel per step over the device's fp32 logits, here 2 · 16 tokens × 50 of the 100
/// words at t = 2: the rows' maximum and sum read them (4 B each), the subtraction, the
/// exponential and the division read and write them (8 B each): 20 B per logit read and 12
/// written, where the fused kernel reads 4. Each reduction's result is all-reduced over the
/// tensor group (4 B per row), as are the target logits; the backward is one kernel scaling
/// the kept softmax (4 B in, 4 B out), then the cast back to 16 bits.
#[test]
fn vocab_parallel_cross_entropy_runs_a_kernel_per_step() {
    let text = format!("{GOOD}cross_entropy = \"vocab_parallel\"\n");
    let w = Workload::load(&write_temp("megatron-loss.toml", &text)).expect("loads");
    let logits = 2 * 16 * 50u64;
    let graph = w.layer_graph(2, 2, false).expect("graph");
    let head = graph.layers.last().unwrap();
    let loss_ops: Vec<(&str, u64, u64)> = head
        .fwd
        .ops
        .iter()
        .filter(|op| op.name.starts_with("ce_"))
        .map(|op| (op.name.as_str(), op.bytes_read, op.bytes_written))
        .collect();
    let row = 2 * 16 * 4;
    assert_eq!(
        loss_ops,
        vec![
            ("ce_row_max", 4 * logits, 0),
            ("ce_row_max_all_reduce", row, row),
            ("ce_subtract_max", 4 * logits, 4 * logits),
            ("ce_exp", 4 * logits, 4 * logits),
            ("ce_row_sum", 4 * logits, 0),
            ("ce_target_logit_all_reduce", row, row),
            ("ce_row_sum_all_reduce", row, row),
            ("ce_divide_by_sum", 4 * logits, 4 * logits),
        ]
    );
    assert!(head.fwd.ops.iter().all(|op| op.name != "cross_entropy"));
    let backward: Vec<(&str, u64, u64)> = head
        .bwd
        .ops
        .iter()
        .filter(|op| op.name.starts_with("ce_") || op.name.starts_with("logits_to_fp32"))
        .map(|op| (op.name.as_str(), op.bytes_read, op.bytes_written))
        .collect();
    assert_eq!(
        backward,
        vec![
            ("ce_scale_softmax", 4 * logits, 4 * logits),
            ("logits_to_fp32.bwd", 4 * logits, 2 * logits),
        ]
    );
    // At t = 1 nothing is all-reduced.
    let one = w.layer_graph(1, 2, false).expect("graph");
    let head = one.layers.last().unwrap();
    assert!(head
        .fwd
        .ops
        .iter()
        .all(|op| !op.name.ends_with("all_reduce")));
    let e = load_error(
        "loss-typo.toml",
        &format!("{GOOD}cross_entropy = \"unfused\"\n"),
    );
    assert_mentions(
        &e,
        &[
            "loss-typo.toml",
            "unknown variant `unfused`",
            "vocab_parallel",
        ],
    );
}

/// Schedule caches key on layer signatures and may serve several workloads: across templates
/// that differ in any one setting, and at each shape, two layers with one signature have the
/// same forward and backward graphs. Every variant here changes some layer's graph, so each
/// must change its signature too.
#[test]
fn equal_signatures_mean_equal_graphs_across_settings() {
    let variants = [
        "",
        "gradient_accumulation_fusion = false\n",
        "qkv_bias = \"add_kernel\"\n",
        "attention_softmax = \"fused_causal\"\n",
        "cross_entropy = \"vocab_parallel\"\n",
        "checkpoint = \"stop_early\"\n",
        "dropout = false\n",
        "tied_embeddings = false\n",
        "precision = \"fp16\"\n",
        "bias = false\n",
        "parallel_block = true\n",
        "tp_grad_overlap = true\n",
    ];
    let mut by_signature: std::collections::BTreeMap<String, (String, String)> =
        std::collections::BTreeMap::new();
    for (i, extra) in variants.iter().enumerate() {
        let w = Workload::load(&write_temp(
            &format!("variant-{i}.toml"),
            &format!("{GOOD}{extra}"),
        ))
        .expect("loads");
        for (t, b, sp) in [(1, 1, false), (2, 2, false), (2, 2, true)] {
            for layer in w.layer_graph(t, b, sp).expect("graph").layers {
                let graphs = format!("{:?}", (&layer.fwd, &layer.bwd));
                let seen = by_signature
                    .entry(layer.signature.clone())
                    .or_insert_with(|| (extra.to_string(), graphs.clone()));
                assert_eq!(
                    seen.1, graphs,
                    "`{}` names different graphs under `{}` and `{extra}`",
                    layer.signature, seen.0
                );
            }
        }
    }
}

/// `qkv_bias = "add_kernel"` (the PyTorch of 2021: `linear` on a 3-D input runs `matmul`,
/// then `add_`) adds one forward kernel right after the QKV projection that reads and writes
/// its output, here 2 · 16 tokens × 3 · 64 / 2 columns of 2 B at t = 2; its gradient passes
/// through, so the backward is the default's, the bias's column sum included.
#[test]
fn qkv_bias_add_kernel_streams_the_projection_output_once_forward() {
    let plain = Workload::load(&write_temp("epilogue.toml", GOOD)).expect("loads");
    let text = format!("{GOOD}qkv_bias = \"add_kernel\"\n");
    let added = Workload::load(&write_temp("bias-add.toml", &text)).expect("loads");
    let block = |w: &Workload| w.layer_graph(2, 2, false).expect("graph").layers[1].clone();
    let (plain, added) = (block(&plain), block(&added));
    let names =
        |graph: &OpGraph| -> Vec<String> { graph.ops.iter().map(|op| op.name.clone()).collect() };
    let mut expected = names(&plain.fwd);
    let after_qkv = expected.iter().position(|n| n == "qkv").expect("qkv") + 1;
    expected.insert(after_qkv, "qkv.bias_add".to_string());
    assert_eq!(names(&added.fwd), expected);
    let add = &added.fwd.ops[after_qkv];
    let output_bytes = 2 * 16 * (3 * 64 / 2) * 2;
    assert_eq!(
        (add.bytes_read, add.bytes_written),
        (output_bytes, output_bytes)
    );
    assert_eq!(names(&added.bwd), names(&plain.bwd));
    assert!(names(&added.bwd).contains(&"qkv.bias_grad".to_string()));
    let e = load_error(
        "no-bias.toml",
        &format!("{GOOD}bias = false\nqkv_bias = \"add_kernel\"\n"),
    );
    assert_mentions(&e, &["no-bias.toml", "qkv_bias", "bias = false"]);
    let e = load_error("bias-typo.toml", &format!("{GOOD}qkv_bias = \"add\"\n"));
    assert_mentions(
        &e,
        &["bias-typo.toml", "unknown variant `add`", "add_kernel"],
    );
}

/// `tp_grad_overlap = true` (Megatron-LM's asynchronous input-gradient collective) makes
/// exactly the backward collectives of the column-parallel linears' inputs asynchronous: the
/// block's two (before the QKV and the MLP) and the head's one, an all-reduce each, or under
/// sequence parallelism a reduce-scatter each and the all-gather that gathers the linear's
/// input again for its weight gradient; every operator and edge is otherwise the default's,
/// and a single device has none. A value that is not a boolean is refused.
#[test]
fn tp_grad_overlap_makes_the_column_parallel_input_gradients_asynchronous() {
    let plain = Workload::load(&write_temp("blocking.toml", GOOD)).expect("loads");
    let text = format!("{GOOD}tp_grad_overlap = true\n");
    let overlapped = Workload::load(&write_temp("overlapped.toml", &text)).expect("loads");
    for (tp, sp, kinds) in [
        (2, false, [CollectiveKind::AllReduce; 2]),
        (
            2,
            true,
            [CollectiveKind::AllGather, CollectiveKind::ReduceScatter],
        ),
    ] {
        let (a, b) = (
            plain.layer_graph(tp, 2, sp).expect("graph"),
            overlapped.layer_graph(tp, 2, sp).expect("graph"),
        );
        let mut asynchronous = Vec::new();
        for (p, o) in a.layers.iter().zip(&b.layers) {
            assert_ne!(p.signature, o.signature);
            assert_eq!(p.fwd, o.fwd);
            assert_eq!(p.bwd.edges, o.bwd.edges);
            for (x, y) in p.bwd.ops.iter().zip(&o.bwd.ops) {
                assert!(!x.asynchronous);
                assert_eq!(
                    *x,
                    Op {
                        asynchronous: false,
                        ..y.clone()
                    }
                );
                if y.asynchronous {
                    match y.kind {
                        OpKind::Collective {
                            collective, group, ..
                        } => {
                            // Under sequence parallelism the re-gather of the input, then the
                            // input gradient's reduce-scatter.
                            let kind = kinds[usize::from(!y.name.ends_with(".regather"))];
                            assert_eq!((collective, group), (kind, 2), "{}", y.name)
                        }
                        _ => panic!("{} is not a collective", y.name),
                    }
                    asynchronous.push(y.name.clone());
                }
            }
        }
        let names = [
            "tp_mlp_in",
            "tp_attn_in",
            "tp_mlp_in",
            "tp_attn_in",
            "tp_head_in",
        ];
        let expected: Vec<String> = names
            .iter()
            .flat_map(|n| {
                if sp {
                    vec![format!("{n}.regather"), format!("{n}.bwd")]
                } else {
                    vec![n.to_string()]
                }
            })
            .collect();
        assert_eq!(asynchronous, expected, "sequence parallel {sp}");
    }
    let single = overlapped.layer_graph(1, 2, false).expect("graph");
    assert!(single
        .layers
        .iter()
        .all(|l| l.bwd.ops.iter().all(|op| !op.asynchronous)));
    let e = load_error(
        "overlap-typo.toml",
        &format!("{GOOD}tp_grad_overlap = \"yes\"\n"),
    );
    assert_mentions(&e, &["overlap-typo.toml", "tp_grad_overlap"]);
}

/// An operator DAG marks a collective `asynchronous`; its derived backward's collective
/// blocks, the flag enters the layer's signature, and on any other operator it is refused
/// naming the operator's field.
#[test]
fn dag_collectives_may_be_asynchronous() {
    let dag = |asynchronous: bool, on: usize| {
        let flag = |k: usize| {
            if asynchronous && k == on {
                r#", "asynchronous": true"#
            } else {
                ""
            }
        };
        format!(
            r#"{{"name": "async", "global_batch": 8, "seq_len": 16, "layers": [{{
  "name": "l", "params": 4096,
  "activation_bytes": {{"none": 64, "selective": 64, "full": 64}}, "output_bytes": 64,
  "fwd": {{"ops": [
    {{"name": "gemm", "kind": {{"kind": "gemm", "batch": 1, "m": 16, "n": 64, "k": 64}}{}}},
    {{"name": "ar", "kind": {{"kind": "collective", "collective": "all_reduce", "bytes": 2048, "group": 2}}{}}},
    {{"name": "add", "kind": {{"kind": "vector", "op": "add", "elements": 1024, "row_len": 1}}{}}}],
  "edges": [[0, 1], [0, 2]]}}}}], "edges": []}}"#,
            flag(0),
            flag(1),
            flag(2)
        )
    };
    let layer = |text: &str| {
        let w = Workload::load(&write_temp("async.json", text)).expect("loads");
        w.layer_graph(1, 2, false).expect("graph").layers[0].clone()
    };
    let (blocking, overlapped) = (layer(&dag(false, 1)), layer(&dag(true, 1)));
    let flags = |g: &OpGraph| -> Vec<bool> { g.ops.iter().map(|op| op.asynchronous).collect() };
    assert_eq!(flags(&blocking.fwd), [false, false, false]);
    assert_eq!(flags(&overlapped.fwd), [false, true, false]);
    assert!(overlapped.bwd.ops.iter().all(|op| !op.asynchronous));
    assert_eq!(overlapped.bwd.ops, blocking.bwd.ops);
    assert_ne!(overlapped.signature, blocking.signature);
    for on in [0, 2] {
        let e = load_error("async-gemm.json", &dag(true, on));
        assert_mentions(
            &e,
            &[
                "async-gemm.json",
                &format!("layers[0].fwd.ops[{on}].asynchronous"),
                "collectives only",
            ],
        );
    }
}

/// The layout copies every Megatron-LM (and PyTorch) block runs: the attention context back to
/// token-major rows before the projection (its gradient is a view), and the QKV gradient
/// assembled from the q, k and v gradients before the projection's backward; and the loss over
/// fp32 logits, as the memory model keeps them.
#[test]
fn gpt_block_has_layout_copies_and_the_loss_runs_over_fp32_logits() {
    let w = load("workloads/gpt3-175b.toml");
    let (h, s, b, t) = (12_288u64, 2048u64, 2u64, 4u64);
    let tokens = s * b;
    let graph = w.layer_graph(t as u32, b as u32, false).expect("graph");
    let copy = |graph: &OpGraph, name: &str, elements: u64, pass: Pass| {
        let i = op_index(graph, name);
        let op = &graph.ops[i];
        let kernel = if name == "qkv_split.bwd" {
            VectorOp::Stack
        } else {
            VectorOp::Copy
        };
        assert_eq!(
            op.kind,
            OpKind::Vector {
                op: kernel,
                elements,
                row_len: 1,
                pass,
            },
            "{name}"
        );
        assert_eq!(op.flops, 0.0, "{name} moves data only");
        assert_eq!(
            (op.bytes_read, op.bytes_written),
            (2 * elements, 2 * elements),
            "{name}: one fp16 read and one write per element"
        );
        i
    };
    let fwd = &block(&graph).fwd;
    let transpose = copy(fwd, "context_transpose", tokens * h / t, Pass::Forward);
    assert!(reaches(fwd, op_index(fwd, "av"), transpose));
    assert!(reaches(fwd, transpose, op_index(fwd, "proj")));
    let bwd = &block(&graph).bwd;
    // The transpose's gradient is a view (no copy kernel runs in PyTorch's backward).
    assert!(bwd.ops.iter().all(|op| op.name != "context_transpose.bwd"));
    let concat = copy(bwd, "qkv_split.bwd", tokens * 3 * h / t, Pass::Backward);
    for from in ["qk.grad_a", "qk.grad_b", "av.grad_b"] {
        assert!(reaches(bwd, op_index(bwd, from), concat), "{from}");
    }
    for to in ["qkv.dgrad", "qkv.wgrad"] {
        assert!(reaches(bwd, concat, op_index(bwd, to)), "{to}");
    }
    // The loss reads fp32 logits: 4 bytes for each logit the head's GEMM writes in fp16, cast
    // up by a kernel between them (2 B in, 4 out per logit) whose backward casts the logits'
    // gradient back down (4 in, 2 out) before the head's backward GEMMs.
    let head = graph.layers.last().expect("head");
    let fwd = &head.fwd;
    let lm_head = op_index(fwd, "lm_head");
    let cast = op_index(fwd, "logits_to_fp32");
    let loss = op_index(fwd, "cross_entropy");
    let logits = fwd.ops[lm_head].bytes_written;
    assert!(fwd.edges.contains(&(lm_head, cast)) && fwd.edges.contains(&(cast, loss)));
    assert_eq!(fwd.ops[loss].elem_bytes, 4);
    assert_eq!(fwd.ops[loss].bytes_read, 2 * logits);
    assert_eq!(
        (fwd.ops[cast].bytes_read, fwd.ops[cast].bytes_written),
        (logits, 2 * logits)
    );
    let bwd = &head.bwd;
    let cast_bwd = op_index(bwd, "logits_to_fp32.bwd");
    assert_eq!(
        (
            bwd.ops[cast_bwd].bytes_read,
            bwd.ops[cast_bwd].bytes_written
        ),
        (2 * logits, logits)
    );
    assert!(reaches(bwd, op_index(bwd, "cross_entropy.bwd"), cast_bwd));
    assert!(reaches(bwd, cast_bwd, op_index(bwd, "lm_head.dgrad")));
    // A model trained in fp32 has nothing to cast.
    let mut fp32 = w.clone();
    fp32.precision = Precision::Fp32;
    let graph = fp32.layer_graph(t as u32, b as u32, false).expect("graph");
    let head = graph.layers.last().expect("head");
    assert!(head.fwd.ops.iter().all(|op| op.name != "logits_to_fp32"));
}

/// The attention scores' 1/√d rides on the QKᵀ GEMM in the forward (no kernel); the GEMM's
/// backward scales each operand gradient in a kernel of its own, over the GEMM's q and k
/// operands (b·a/t heads × s × d), between the GEMM's gradients and the QKV projection's.
#[test]
fn attention_backward_scales_both_operand_gradients() {
    let w = load("workloads/gpt3-175b.toml");
    let (h, a, s, b, t) = (12_288u64, 96u64, 2048u64, 2u64, 4u64);
    let graph = w.layer_graph(t as u32, b as u32, false).expect("graph");
    let layer = block(&graph);
    assert!(layer.fwd.ops.iter().all(|op| !matches!(
        op.kind,
        OpKind::Vector {
            op: VectorOp::Scale,
            ..
        }
    )));
    let bwd = &layer.bwd;
    let scales: Vec<usize> = (0..bwd.ops.len())
        .filter(|&i| {
            matches!(
                bwd.ops[i].kind,
                OpKind::Vector {
                    op: VectorOp::Scale,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(scales.len(), 2);
    for &i in &scales {
        assert_eq!(
            bwd.ops[i].kind,
            OpKind::Vector {
                op: VectorOp::Scale,
                elements: b * a / t * s * (h / a),
                row_len: 1,
                pass: Pass::Backward,
            }
        );
        for from in ["qk.grad_a", "qk.grad_b"] {
            assert!(reaches(bwd, op_index(bwd, from), i), "{from}");
        }
        assert!(reaches(bwd, i, op_index(bwd, "qkv_split.bwd")));
    }
}

/// The names chip files key per-primitive values by are serde's names of the primitives, and
/// `VectorOp::ALL` lists each primitive once.
#[test]
fn vector_primitive_names_are_their_serde_names() {
    let names: BTreeSet<&str> = VectorOp::ALL.iter().map(|op| op.name()).collect();
    assert_eq!(names.len(), VectorOp::ALL.len());
    for op in VectorOp::ALL {
        assert_eq!(
            serde_json::to_value(op).expect("serialises"),
            serde_json::Value::String(op.name().to_string())
        );
    }
}

/// PyTorch's non-reentrant checkpoint stops recomputing after the last operator that keeps a
/// tensor for the backward: in a GPT block the residual add after the feed-forward's dropout
/// (which keeps its mask); in a Llama block, which has no dropout, at t = 2 also the
/// all-reduce before it (after the down projection, a GEMM, which keeps its inputs). Megatron-LM's
/// recompute reruns everything, and it is the default.
#[test]
fn checkpoint_stop_early_skips_the_forward_tail_that_saves_nothing() {
    let with = |text: &str| {
        Workload::load(&write_temp(
            "ckpt.toml",
            &format!("{text}checkpoint = \"stop_early\"\n"),
        ))
        .expect("valid workload")
    };
    assert_eq!(
        Workload::load(&write_temp("good.toml", GOOD))
            .unwrap()
            .checkpoint,
        Checkpoint::Rerun
    );
    let gpt = with(GOOD);
    assert_eq!(gpt.checkpoint, Checkpoint::StopEarly);
    let llama = with(&GOOD.replace("\"gpt\"", "\"llama\""));
    for (workload, tp, tail) in [
        (&gpt, 1, vec!["residual2"]),
        (&gpt, 2, vec!["residual2"]),
        (&llama, 1, vec!["residual2"]),
        (&llama, 2, vec!["tp_mlp_out", "residual2"]),
    ] {
        let graph = workload.layer_graph(tp, 1, false).expect("graph");
        let fwd = &block(&graph).fwd;
        let skipped = workload.checkpoint.skipped_ops(fwd);
        let names: Vec<&str> = fwd.ops[fwd.ops.len() - skipped..]
            .iter()
            .map(|op| op.name.as_str())
            .collect();
        assert_eq!(names, tail, "{} t{tp}", workload.name);
        assert!(fwd.ops[fwd.ops.len() - skipped - 1].saves_for_backward());
        assert_eq!(Checkpoint::Rerun.skipped_ops(fwd), 0);
        // Nothing outside the transformer blocks is rerun, whatever its tail.
        assert!(graph
            .layers
            .iter()
            .filter(|l| !l.activation_bytes.recomputed_under_full())
            .all(|l| !l.name.starts_with("block")));
    }
}

/// `ddp` names the data-parallel wrapper (none by default) in template and DAG files alike,
/// and its once-per-iteration kernels over a layer's gradients: PyTorch DDP's two bucket copies
/// per tensor, Megatron-LM's buffer zeroing (one fill over the layer, plus the first
/// micro-batch's add without gradient-accumulation fusion), its coalescing variant's flatten,
/// division and per-tensor copy back. An unknown wrapper is refused, naming file and field.
#[test]
fn ddp_names_the_wrapper_and_its_gradient_kernels() {
    let tiny = write_temp("tiny-ddp.toml", GOOD);
    let plain = Workload::load(&tiny).unwrap();
    assert_eq!(plain.ddp, Ddp::None);
    let tensors = [4096, 64, 8192];
    assert!(plain.grad_buffer_ops(&tensors).is_empty());
    let kernels = |ddp: &str, fusion: bool| {
        let text = format!("{GOOD}ddp = \"{ddp}\"\ngradient_accumulation_fusion = {fusion}\n");
        let w = Workload::load(&write_temp("ddp.toml", &text)).unwrap();
        assert_eq!(w.ddp.name(), ddp);
        w.grad_buffer_ops(&tensors)
            .iter()
            .map(|op| {
                let OpKind::Vector {
                    op: kind, elements, ..
                } = op.kind
                else {
                    panic!("{} is not a vector kernel", op.name);
                };
                (
                    op.name.clone(),
                    kind,
                    elements,
                    op.bytes_read,
                    op.bytes_written,
                )
            })
            .collect::<Vec<_>>()
    };
    let kernel = |name: &str, kind: VectorOp, n: u64, read: u64, written: u64| {
        (name.to_string(), kind, n, read, written)
    };
    // bf16 gradients: 2 B per element.
    let torch: Vec<_> = tensors
        .iter()
        .flat_map(|&n| {
            [
                kernel("ddp_bucket_in", VectorOp::Scale, n, 2 * n, 2 * n),
                kernel("ddp_bucket_out", VectorOp::Scale, n, 2 * n, 2 * n),
            ]
        })
        .collect();
    assert_eq!(kernels("torch", true), torch);
    let fill = kernel("grad_buffer_zero", VectorOp::Fill, 12352, 0, 2 * 12352);
    assert_eq!(kernels("megatron", true), std::slice::from_ref(&fill));
    assert_eq!(
        kernels("megatron", false),
        [
            fill,
            kernel(
                "grad_accumulate_first",
                VectorOp::Add,
                12352,
                4 * 12352,
                2 * 12352
            )
        ]
    );
    let mut coalesced = vec![
        kernel("ddp_flatten", VectorOp::Scale, 12352, 2 * 12352, 2 * 12352),
        kernel("ddp_divide", VectorOp::Scale, 12352, 2 * 12352, 2 * 12352),
    ];
    coalesced.extend(tensors.map(|n| kernel("ddp_unflatten", VectorOp::Scale, n, 2 * n, 2 * n)));
    assert_eq!(kernels("megatron_coalesced", true), coalesced);
    // Run-plans files read the wrapper through serde: the same names.
    for ddp in Ddp::ALL {
        assert_eq!(
            serde_json::to_string(&ddp).unwrap(),
            format!("\"{}\"", ddp.name())
        );
    }
    let e = load_error("wrapper.toml", &format!("{GOOD}ddp = \"fsdp\"\n"));
    assert_mentions(
        &e,
        &[
            "wrapper.toml",
            "`ddp`",
            "unknown value `fsdp`",
            "megatron_coalesced",
        ],
    );
}

/// `grad_precision` reads the gradients' format in a template and in an operator DAG: absent,
/// the weights'; fp32 beside bf16 weights; never narrower than the weights, nor unknown.
#[test]
fn grad_precision_is_the_weights_or_fp32() {
    let path = write_temp(
        "grads-fp32.toml",
        &format!("{GOOD}grad_precision = \"fp32\"\n"),
    );
    let w = Workload::load(&path).expect("fp32 gradients");
    assert_eq!(
        (w.precision, w.grads, w.grad_precision()),
        (Precision::Bf16, GradPrecision::Fp32, Precision::Fp32)
    );
    assert_eq!(w.bytes_per_param().grads, 4);
    let plain = Workload::load(&write_temp("grads-default.toml", GOOD)).expect("default");
    assert_eq!(
        (plain.grads, plain.grad_precision()),
        (GradPrecision::Weights, Precision::Bf16)
    );
    // The weights' own precision named is the default.
    let named = write_temp(
        "grads-named.toml",
        &format!("{GOOD}grad_precision = \"bf16\"\n"),
    );
    assert_eq!(
        Workload::load(&named).expect("named").grads,
        GradPrecision::Weights
    );
    let e = load_error(
        "grads-narrow.toml",
        &format!("{GOOD}precision = \"fp32\"\ngrad_precision = \"bf16\"\n"),
    );
    assert_mentions(
        &e,
        &[
            "grads-narrow.toml",
            "`grad_precision`",
            "fp32 weights",
            "expected fp32",
        ],
    );
    let e = load_error(
        "grads-unknown.toml",
        &format!("{GOOD}grad_precision = \"fp8\"\n"),
    );
    assert_mentions(
        &e,
        &[
            "grads-unknown.toml",
            "`grad_precision`",
            "unknown precision `fp8`",
        ],
    );
    let e = load_error(
        "grads-other.toml",
        &format!("{GOOD}grad_precision = \"fp16\"\n"),
    );
    assert_mentions(
        &e,
        &["grads-other.toml", "`fp16` gradients for bf16 weights"],
    );
    // An operator DAG takes the same key.
    let dag = std::fs::read_to_string("examples/dag-workload.json").expect("example DAG");
    let mut value: serde_json::Value = serde_json::from_str(&dag).expect("JSON");
    value["grad_precision"] = "fp32".into();
    let path = write_temp("grads-dag.json", &value.to_string());
    assert_eq!(
        Workload::load(&path).expect("DAG").bytes_per_param().grads,
        4
    );
    value["grad_precision"] = "int8".into();
    let path = write_temp("grads-dag-bad.json", &value.to_string());
    let e = Workload::load(&path).unwrap_err().to_string();
    assert_mentions(&e, &["grads-dag-bad.json", "`grad_precision`", "int8"]);
}

/// `attention_softmax = "flash"` runs the attention core as one fused kernel each way
/// (FlashAttention-2): QKᵀ and P·V forward, five such products backward (the scores
/// recomputed), 2·s²·d FLOP each per query head, half under a decoder's causal mask. Two
/// sequences of 16 tokens and 4 heads of 16 (bf16): 8 query heads, Q 8·16·16·2 = 4096 B, K
/// and V as much again each, the rows' fp32 log-sum-exp 8·16·4 = 512 B. No score tensor
/// reaches the graphs or the activations, which keep the log-sum-exp instead (which selective
/// recompute drops, as Megatron-Core's `core_attn` checkpoint does); BERT's attention is not
/// causal; grouped K/V heads read less.
#[test]
fn flash_attention_is_one_kernel_each_way_without_scores() {
    let text = format!("{GOOD}attention_softmax = \"flash\"\n");
    let flash = Workload::load(&write_temp("flash.toml", &text)).expect("loads");
    let plain = Workload::load(&write_temp("plain-attention.toml", GOOD)).expect("loads");
    let graph = flash.layer_graph(1, 2, false).expect("graph");
    let (fwd, bwd) = (&block(&graph).fwd, &block(&graph).bwd);
    let product = 2.0 * 8.0 * 16.0 * 16.0 * 16.0;
    let (q, kv, lse) = (4096, 2 * 4096, 512);
    let forward = &fwd.ops[op_index(fwd, "attention")];
    assert_eq!(
        forward.kind,
        OpKind::Attention {
            shape: AttentionShape {
                heads: 8,
                kv_heads: 8,
                seq_len: 16,
                head_dim: 16,
                causal: true,
            },
            pass: Pass::Forward,
        }
    );
    assert_eq!(forward.flops, 2.0 * product / 2.0);
    assert_eq!(
        (forward.bytes_read, forward.bytes_written),
        (q + kv, q + lse)
    );
    let backward = &bwd.ops[op_index(bwd, "attention.bwd")];
    assert_eq!(backward.flops, 5.0 * product / 2.0);
    assert_eq!(
        (backward.bytes_read, backward.bytes_written),
        (3 * q + kv + lse, q + kv)
    );
    for gone in ["qk", "softmax", "attn_dropout", "av", "context_transpose"] {
        assert!(fwd.ops.iter().all(|op| op.name != gone), "{gone}");
    }
    for gone in ["q_scale.bwd", "k_scale.bwd", "softmax.bwd", "av.grad_a"] {
        assert!(bwd.ops.iter().all(|op| op.name != gone), "{gone}");
    }
    let (flash_bytes, plain_bytes) = (
        block(&graph).activation_bytes,
        block(&plain.layer_graph(1, 2, false).expect("graph")).activation_bytes,
    );
    assert_eq!(flash_bytes.none, flash_bytes.selective + lse);
    assert_eq!(flash_bytes.selective, plain_bytes.selective);
    assert_eq!(flash_bytes.full, plain_bytes.full);
    // 8 heads · 16² scores: softmax output, dropout mask and output, 2 + 1 + 2 B each.
    assert_eq!(plain_bytes.none - plain_bytes.selective, 8 * 16 * 16 * 5);

    let bert = Workload::load(&write_temp(
        "flash-bert.toml",
        &text.replace("family = \"gpt\"", "family = \"bert\""),
    ))
    .expect("BERT takes flash attention");
    let graph = bert.layer_graph(1, 2, false).expect("graph");
    let forward = &block(&graph).fwd.ops[op_index(&block(&graph).fwd, "attention")];
    assert!(matches!(
        forward.kind,
        OpKind::Attention {
            shape: AttentionShape { causal: false, .. },
            ..
        }
    ));
    assert_eq!(forward.flops, 2.0 * product);
    let grouped = Workload::load(&write_temp(
        "flash-gqa.toml",
        &format!("{text}kv_heads = 2\n"),
    ))
    .expect("grouped K/V");
    let graph = grouped.layer_graph(1, 2, false).expect("graph");
    let forward = &block(&graph).fwd.ops[op_index(&block(&graph).fwd, "attention")];
    assert!(matches!(
        forward.kind,
        OpKind::Attention {
            shape: AttentionShape { kv_heads: 4, .. },
            ..
        }
    ));
    assert_eq!(forward.bytes_read, q + kv / 2);
}

/// An operator DAG holds a fused attention kernel as it holds a GEMM: its query and K/V heads
/// scale with the micro-batch, its backward (five products, three kernels) is derived, and a
/// zero size or K/V heads that do not divide the query heads are refused by name.
#[test]
fn dag_attention_scales_and_derives_its_backward() {
    let json = serde_json::json!({
        "name": "flash-dag",
        "global_batch": 8,
        "seq_len": 128,
        "layers": [{
            "name": "attn",
            "params": 262144,
            "activation_bytes": {"none": 1024, "selective": 1024, "full": 1024},
            "output_bytes": 65536,
            "fwd": {
                "ops": [
                    {"name": "qkv", "kind": {"kind": "gemm", "batch": 1, "m": 128, "n": 512, "k": 256}},
                    {"name": "attention", "kind": {"kind": "attention", "heads": 4, "kv_heads": 2,
                        "seq_len": 128, "head_dim": 64, "causal": true}},
                    {"name": "proj", "kind": {"kind": "gemm", "batch": 1, "m": 128, "n": 256, "k": 256}}
                ],
                "edges": [[0, 1], [1, 2]]
            }
        }],
        "edges": []
    });
    let w = Workload::load(&write_temp("flash-dag.json", &json.to_string())).expect("loads");
    let graph = w.layer_graph(1, 2, false).expect("graph");
    let layer = &graph.layers[0];
    assert_eq!(
        layer.fwd.ops[1].kind,
        OpKind::Attention {
            shape: AttentionShape {
                heads: 8,
                kv_heads: 4,
                seq_len: 128,
                head_dim: 64,
                causal: true,
            },
            pass: Pass::Forward,
        }
    );
    let bwd = layer
        .bwd
        .ops
        .iter()
        .find(|op| op.name == "attention.bwd")
        .expect("derived backward");
    assert!(matches!(
        bwd.kind,
        OpKind::Attention {
            shape: AttentionShape {
                heads: 8,
                kv_heads: 4,
                ..
            },
            pass: Pass::Backward,
        }
    ));
    assert_eq!(bwd.flops, 5.0 * 2.0 * 8.0 * 128.0 * 128.0 * 64.0 / 2.0);
    assert_eq!(bwd.launches(), 3.0);
    for (field, value, expected) in [
        ("heads", 0, "every size must be positive"),
        (
            "kv_heads",
            3,
            "3 key/value heads do not divide 4 query heads",
        ),
    ] {
        let mut bad = json.clone();
        bad["layers"][0]["fwd"]["ops"][1]["kind"][field] = value.into();
        let e = Workload::load(&write_temp("flash-dag-bad.json", &bad.to_string()))
            .unwrap_err()
            .to_string();
        assert_mentions(&e, &["flash-dag-bad.json", expected]);
    }
}
