//! Published models as workloads: parameter counts and training FLOPs per token against the
//! papers' figures, hand-derived from each paper's architecture table; the block shapes they
//! need (multi-query and grouped-query attention replicated across a wider tensor group, head
//! sizes that are not hidden/heads, the parallel attention + feed-forward block, GeGLU);
//! and plans on the chips they ran on.

use std::path::Path;
use std::process::Command;

use tandem::arch::load_chip;
use tandem::cost::{collective_cost, CostModel};
use tandem::model::layer_costs;
use tandem::schedule::{ScheduleCache, SolverOptions};
use tandem::workload::{CollectiveKind, LayerGraph, OpKind, Workload};

fn load(name: &str) -> Workload {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("workloads")
        .join(format!("{name}.toml"));
    Workload::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// An architecture table's row: L layers, h model width, a heads of size q, kv key/value
/// heads, f feed-forward width (each of gate and up when gated), V vocabulary.
struct Arch {
    layers: u64,
    hidden: u64,
    heads: u64,
    head_dim: u64,
    kv_heads: u64,
    ffn: u64,
    vocab: u64,
    /// Up-projections: 2 for SwiGLU/GeGLU, 1 otherwise.
    up: u64,
}

impl Arch {
    /// Weights of one block's matrix multiplications: Q, K and V, the output projection and
    /// the feed-forward network.
    fn block_matmul_params(&self) -> u64 {
        let attention = self.heads * self.head_dim;
        self.hidden * (attention + 2 * self.kv_heads * self.head_dim)
            + attention * self.hidden
            + (self.up + 1) * self.hidden * self.ffn
    }

    /// Training FLOPs per token of sequence length `s` as the PaLM paper (Appendix B) counts
    /// them: 6 per matrix-multiply weight (the blocks and the output projection) plus
    /// 12·L·a·q·s for the attention scores and their product with V.
    fn flops_per_token(&self, seq_len: u64) -> f64 {
        let weights = self.layers * self.block_matmul_params() + self.vocab * self.hidden;
        6.0 * weights as f64 + 12.0 * (self.layers * self.heads * self.head_dim * seq_len) as f64
    }
}

fn flops_per_token(w: &Workload) -> f64 {
    w.model_flops_per_iteration() / (w.global_batch * w.seq_len) as f64
}

fn assert_flops(w: &Workload, arch: &Arch) {
    let want = arch.flops_per_token(w.seq_len);
    let got = flops_per_token(w);
    assert!(
        (got - want).abs() <= 1e-12 * want,
        "{}: {got} FLOP per token, hand-derived {want}",
        w.name
    );
}

/// PaLM 540B and 62B (Chowdhery et al. 2022, Table 1): multi-query attention with 256-wide
/// heads, SwiGLU of 4·d, a parallel block, no biases (LayerNorms scale only: d each, one per
/// block and a final one), tied 256k embeddings. The paper's 540.35 B and 62.50 B are
/// rounded to 10 M; its FLOPs per token are 6N + 12·L·H·Q·T (Appendix B), which counts the
/// LayerNorm scales in N as well (6 FLOPs each, 4·10⁻⁶ of the total).
#[test]
fn palm_parameters_and_flops_match_the_paper() {
    for (name, arch, published) in [
        (
            "palm-540b",
            Arch {
                layers: 118,
                hidden: 18432,
                heads: 48,
                head_dim: 256,
                kv_heads: 1,
                ffn: 73728,
                vocab: 256_000,
                up: 2,
            },
            540.35e9,
        ),
        (
            "palm-62b",
            Arch {
                layers: 64,
                hidden: 8192,
                heads: 32,
                head_dim: 256,
                kv_heads: 1,
                ffn: 32768,
                vocab: 256_000,
                up: 2,
            },
            62.50e9,
        ),
    ] {
        let w = load(name);
        let norms = arch.layers * arch.hidden + arch.hidden;
        let params = arch.layers * arch.block_matmul_params() + arch.vocab * arch.hidden + norms;
        assert_eq!(w.total_params(), params, "{name}");
        assert!(
            (params as f64 - published).abs() <= 0.01e9,
            "{name}: {params} vs the paper's {published}"
        );
        assert_flops(&w, &arch);
        let paper = 6.0 * params as f64
            + 12.0 * (arch.layers * arch.heads * arch.head_dim * w.seq_len) as f64;
        let got = flops_per_token(&w);
        assert!(
            (got - paper).abs() <= 1e-5 * paper,
            "{name}: {got} vs {paper}"
        );
    }
    assert_eq!(load("palm-540b").total_params(), 540_356_474_880);
}

/// Llama 3 70B and 405B (Llama 3 Herd, Table 3): GQA with 8 key/value heads, SwiGLU,
/// RMSNorm (scale only: two per block and a final one), untied 128,256-row embedding and head.
/// 70B: the released checkpoint's 70,553,706,496. 405B: the paper's 3.8 × 10²⁵ pre-training
/// FLOPs over 15.6 T tokens are 6·N·D to its two significant digits.
#[test]
fn llama3_parameters_and_flops_match_the_paper() {
    let arch = |layers, hidden, heads, ffn| Arch {
        layers,
        hidden,
        heads,
        head_dim: 128,
        kv_heads: 8,
        ffn,
        vocab: 128_256,
        up: 2,
    };
    for (name, arch) in [
        ("llama3-70b", arch(80, 8192, 64, 28672)),
        ("llama3-405b", arch(126, 16384, 128, 53248)),
    ] {
        let w = load(name);
        let norms = (2 * arch.layers + 1) * arch.hidden;
        let params =
            arch.layers * arch.block_matmul_params() + 2 * arch.vocab * arch.hidden + norms;
        assert_eq!(w.total_params(), params, "{name}");
        assert_flops(&w, &arch);
    }
    assert_eq!(load("llama3-70b").total_params(), 70_553_706_496);
    let n = load("llama3-405b").total_params() as f64;
    let pretraining_flops = 6.0 * n * 15.6e12;
    assert!(
        (pretraining_flops / 1e25 * 10.0).round() == 38.0,
        "6·N·D = {pretraining_flops:e}, the paper's 3.8e25"
    );
}

/// GPT-J 6B: 28 parallel blocks of LayerNorm (scale and shift), 16 × 256 heads, a 16384 GeLU
/// feed-forward with biases, an untied head with a bias over 50,400 rows. The published
/// 6,053,381,344 is 0.034 % above tandem's count, which also gives Q, K, V and the output
/// projection biases GPT-J lacks; the rest of the gap is not explained by the published
/// architecture.
#[test]
fn gptj_parameters_and_flops() {
    let arch = Arch {
        layers: 28,
        hidden: 4096,
        heads: 16,
        head_dim: 256,
        kv_heads: 16,
        ffn: 16384,
        vocab: 50400,
        up: 1,
    };
    let w = load("gptj-6b");
    let (h, f, v) = (arch.hidden, arch.ffn, arch.vocab);
    let biases_per_block = 3 * h + h + f + h;
    let per_block = arch.block_matmul_params() + biases_per_block + 2 * h;
    let params = arch.layers * per_block + v * h + (v * h + v) + 2 * h;
    assert_eq!(w.total_params(), params);
    assert_eq!(params, 6_051_341_536);
    let published = 6_053_381_344f64;
    assert!((params as f64 - published).abs() / published <= 4e-4);
    assert_flops(&w, &arch);
}

/// Gemma 7B and 2B (Gemma Team 2024, Table 2 gives embedding and non-embedding parameters
/// exactly): GeGLU, 256-wide heads (7B: 16 of them over a 3072 model), 2B with multi-query
/// attention, RMSNorm, tied 256,128-row embeddings.
#[test]
fn gemma_parameters_match_the_paper_exactly() {
    for (name, arch, embedding, non_embedding) in [
        (
            "gemma-7b",
            Arch {
                layers: 28,
                hidden: 3072,
                heads: 16,
                head_dim: 256,
                kv_heads: 16,
                ffn: 24576,
                vocab: 256_128,
                up: 2,
            },
            786_825_216u64,
            7_751_248_896u64,
        ),
        (
            "gemma-2b",
            Arch {
                layers: 18,
                hidden: 2048,
                heads: 8,
                head_dim: 256,
                kv_heads: 1,
                ffn: 16384,
                vocab: 256_128,
                up: 2,
            },
            524_550_144,
            1_981_884_416,
        ),
    ] {
        let w = load(name);
        assert_eq!(w.total_params(), embedding + non_embedding, "{name}");
        assert_eq!(arch.vocab * arch.hidden, embedding);
        assert_flops(&w, &arch);
    }
}

fn block(graph: &LayerGraph) -> &tandem::workload::Layer {
    &graph.layers[1]
}

/// Gemma 2B has one key/value head: at t = 8 each device holds a 256-wide slice of the
/// queries and the whole K and V projections (replicated 8 ways), whose gradients are
/// all-reduced over the group once per iteration. Its activation memory at b = 1, s = 8192 in
/// bf16 (no dropout): outside the parallel regions two norm inputs and two GEMM inputs of
/// s·h; inside Q and K (256 + 256), V (256), the projection input (256) and the GeGLU's three
/// inputs (3 × 2048) per token; the scores 1 head × s² once.
#[test]
fn multi_query_attention_replicates_kv_across_a_wider_tensor_group() {
    let w = load("gemma-2b");
    assert_eq!(w.valid_tp(16), vec![1, 2, 4, 8]);
    let graph = w.layer_graph(8, 1, false).expect("t = 8 slices 8 heads");
    let b = block(&graph);
    let (h, q, kv, f) = (2048u64, 256u64, 256u64, 16384u64 / 8);
    assert_eq!(
        b.params,
        h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h,
        "per-device block parameters"
    );
    assert_eq!(b.replicated.params, 2 * kv * h);
    assert_eq!(b.replicated.group, 8);
    assert!(graph.layers[0].replicated.is_empty());
    let s = 8192u64;
    let outside = 2 * s * h * 4;
    let inside = s * 2 * ((q + kv) + kv + q + 3 * f);
    let scores = s * s * 2;
    assert_eq!(b.activation_bytes.selective, outside + inside);
    assert_eq!(b.activation_bytes.none, outside + inside + scores);
    assert_eq!(b.activation_bytes.full, s * h * 2);
    // Where t divides the key/value heads nothing is replicated.
    let llama = load("llama3-70b");
    assert!(block(&llama.layer_graph(8, 1, false).unwrap())
        .replicated
        .is_empty());
    let wide = llama
        .layer_graph(16, 1, false)
        .expect("t = 16 over 8 kv heads");
    assert_eq!(block(&wide).replicated.group, 2);
    assert_eq!(block(&wide).replicated.params, 2 * 128 * 8192);

    // The layer costs charge the all-reduce of those gradients once per iteration.
    let h100 = load_chip(Path::new("arch_specs/h100.toml")).expect("bundled chip");
    let cost = CostModel::new(&h100);
    let cache = ScheduleCache::new(SolverOptions::default()).expect("valid options");
    let costs = layer_costs(&w, &cost, &cache, 8, 1, false).expect("schedules");
    let expected = collective_cost(&h100, CollectiveKind::AllReduce, 2 * kv * h * 2, 8).latency_s;
    assert!(expected > 0.0);
    assert_eq!(costs.graph.layers[1].replica_grad_sync_s, expected);
    assert_eq!(costs.graph.layers[0].replica_grad_sync_s, 0.0);
    let at_one = layer_costs(&w, &cost, &cache, 1, 1, false).expect("schedules");
    assert_eq!(at_one.graph.layers[1].replica_grad_sync_s, 0.0);
}

/// The parallel block (GPT-J, PaLM) normalises once, feeds both branches from it and sums
/// their partial outputs before one all-reduce: at t = 2 one forward all-reduce (after the
/// sum) and one backward all-reduce (before the shared input) per block, against two each in
/// a sequential block. Activations (GPT-J, t = 1, b = 1, s = 2048, bf16, no dropout): one
/// norm input and one GEMM input of s·h outside; Q, K, V, the projection input and the two
/// FFN inputs (2 × 16384) per token inside; 16 heads of s² scores.
#[test]
fn parallel_block_has_one_all_reduce_each_way_and_its_activations() {
    let w = load("gptj-6b");
    let all_reduces = |graph: &tandem::workload::OpGraph| {
        graph
            .ops
            .iter()
            .filter(|o| {
                matches!(
                    o.kind,
                    OpKind::Collective {
                        collective: CollectiveKind::AllReduce,
                        ..
                    }
                )
            })
            .map(|o| o.name.clone())
            .collect::<Vec<_>>()
    };
    let graph = w.layer_graph(2, 1, false).expect("t = 2");
    let b = block(&graph);
    assert_eq!(all_reduces(&b.fwd), vec!["tp_block_out".to_string()]);
    assert_eq!(all_reduces(&b.bwd).len(), 1, "{:?}", all_reduces(&b.bwd));
    assert!(b.fwd.ops.iter().any(|o| o.name == "branch_sum"));
    assert_eq!(
        b.fwd
            .ops
            .iter()
            .filter(|o| o.name.starts_with("ln"))
            .count(),
        1
    );
    let sequential = load("gpt-1.7b").layer_graph(2, 1, false).unwrap();
    assert_eq!(all_reduces(&block(&sequential).fwd).len(), 2);

    let one = w.layer_graph(1, 1, false).unwrap();
    let act = block(&one).activation_bytes;
    let (s, h, f) = (2048u64, 4096u64, 16384u64);
    let outside = s * h * 4;
    let inside = s * 2 * (2 * h + h + h + 2 * f);
    assert_eq!(act.selective, outside + inside);
    assert_eq!(act.none, outside + inside + 16 * s * s * 2);
}

fn tandem_bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
}

/// `tandem plan` accepts the published models on the chips they ran on: PaLM 540B on 6144
/// real TPU v4 chips (`tpuv4.toml`: 1.5 pods, the data-centre network joining them), Llama 3
/// 70B on 1024 H100s at t = 16 (two devices per key/value head), GPT-J on 256 TPU v4-like
/// chips (`phaze-tpuv4-template.toml`), Mixtral on 64 H100s (experts divided over pipelines
/// where that is faster).
#[test]
fn plan_accepts_published_models_on_their_chips() {
    for args in [
        vec![
            "palm-540b",
            "tpuv4",
            "6144",
            "--micro-batch",
            "1",
            "--recompute",
            "full",
        ],
        vec![
            "llama3-70b",
            "h100",
            "1024",
            "--tp",
            "16",
            "--max-tp",
            "16",
            "--micro-batch",
            "1",
            "--recompute",
            "full",
        ],
        vec![
            "gptj-6b",
            "phaze-tpuv4-template",
            "256",
            "--micro-batch",
            "1,2",
        ],
        vec![
            "mixtral-8x7b",
            "h100",
            "64",
            "--micro-batch",
            "1",
            "--recompute",
            "full",
        ],
    ] {
        let out = tandem_bin()
            .args([
                "plan",
                "--workload",
                &format!("workloads/{}.toml", args[0]),
                "--arch",
                &format!("arch_specs/{}.toml", args[1]),
                "--devices",
                args[2],
                "--json",
            ])
            .args(&args[3..])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let plan = &json;
        let used = plan["devices_used"].as_u64().expect("devices used");
        assert!(used <= args[2].parse::<u64>().unwrap(), "{args:?}: {used}");
        assert!(plan["time_per_batch_s"].as_f64().unwrap() > 0.0);
    }
}

/// Mixtral 8x7B (Jiang et al. 2024): 32 blocks of attention (32 × 128 queries, 8 key/value
/// heads) and 8 SwiGLU experts of 14336 with a router of 8 × 4096, RMSNorm, untied 32000-row
/// embedding and head. 46.7 B parameters in all (the checkpoint's 46,702,792,704); a token
/// runs 2 experts, so the matrix multiplies of 12.9 B "active" parameters: training FLOPs per
/// token 6 × (active matmul weights) + 12·L·a·q·s.
#[test]
fn mixtral_parameters_and_active_flops_match_the_paper() {
    let w = load("mixtral-8x7b");
    let (layers, h, q, vocab) = (32u64, 4096u64, 128u64, 32000u64);
    let attention = h * (32 * q + 2 * 8 * q) + 32 * q * h;
    let expert = 3 * h * 14336;
    let router = 8 * h;
    let norms = 2 * h;
    let total = layers * (attention + 8 * expert + router + norms) + 2 * vocab * h + h;
    assert_eq!(w.total_params(), total);
    assert_eq!(total, 46_702_792_704);
    let active = layers * (attention + 2 * expert + router + norms) + 2 * vocab * h + h;
    assert_eq!((active as f64 / 1e8).round(), 129.0, "{active}");
    let matmul = layers * (attention + router + 2 * expert) + vocab * h;
    let want = 6.0 * matmul as f64 + 12.0 * (layers * 32 * q * w.seq_len) as f64;
    let got = flops_per_token(&w);
    assert!((got - want).abs() <= 1e-12 * want, "{got} vs {want}");
}

/// A Mixtral block at t = 1, b = 1, s = 4096 in bf16: the router GEMM (4096 tokens × 8
/// experts × 4096), its softmax, the experts over the 2 × 4096 token slots top-2 routing
/// dispatches (capacity factor 1), the weighted combination; 8 × 3 × 4096 × 14336 expert
/// parameters, 2 × 4096 × 4096 × 2 B dispatched per micro-batch. Activations: outside two norm
/// and two GEMM inputs (2 × s·h × 4 B); attention inside Q and K, V, the projection input
/// (s × 2 B × 10240); the experts' dispatched input, their SwiGLU's three inputs over 8192
/// slots, and the router's fp32 probabilities; the 32 heads' s² scores.
#[test]
fn moe_block_graph_memory_and_dispatch_are_hand_derived() {
    let w = load("mixtral-8x7b");
    let graph = w.layer_graph(1, 1, false).expect("t = 1");
    let b = block(&graph);
    assert!(b.signature.contains("moe-block"), "{}", b.signature);
    let gemm = |name: &str| {
        let op = b
            .fwd
            .ops
            .iter()
            .find(|o| o.name == name)
            .unwrap_or_else(|| panic!("no {name}"));
        match op.kind {
            OpKind::Gemm { batch, m, n, k } => [batch, m, n, k],
            _ => panic!("{name} is not a GEMM"),
        }
    };
    let (s, h, f) = (4096u64, 4096u64, 14336u64);
    assert_eq!(gemm("router"), [1, s, 8, h]);
    assert_eq!(gemm("expert_gate"), [1, 2 * s, f, h]);
    assert_eq!(gemm("expert_down"), [1, 2 * s, h, f]);
    for name in [
        "router_softmax",
        "moe_combine",
        "expert_silu",
        "expert_swiglu_mul",
    ] {
        assert!(b.fwd.ops.iter().any(|o| o.name == name), "no {name}");
    }
    assert_eq!(b.expert_params, 8 * 3 * h * f);
    assert_eq!(b.all_to_all_bytes, 2 * s * h * 2);
    let outside = 2 * s * h * 4;
    let attention = s * 2 * 10240;
    let experts = 2 * s * h * 2 + 2 * s * 2 * 3 * f + s * 8 * 4;
    assert_eq!(b.activation_bytes.selective, outside + attention + experts);
    assert_eq!(
        b.activation_bytes.none,
        outside + attention + experts + 32 * s * s * 2
    );
    // Embedding and head carry no experts.
    assert_eq!(graph.layers[0].expert_params, 0);
    assert_eq!(graph.layers.last().unwrap().all_to_all_bytes, 0);
}

/// Experts every other block (GLaM, Switch) alternate dense and expert blocks; a bad `[moe]`
/// table names its field.
#[test]
fn moe_every_other_block_and_bad_tables() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = "name = \"tiny-moe\"\nfamily = \"gpt\"\nlayers = 4\nhidden = 64\nheads = 4\n\
                vocab = 100\nseq_len = 16\nglobal_batch = 8\n";
    let write = |name: &str, moe: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{base}[moe]\n{moe}")).expect("write");
        path
    };
    let w =
        Workload::load(&write("every.toml", "experts = 4\ntop_k = 1\nevery = 2\n")).expect("valid");
    let graph = w.layer_graph(1, 1, false).unwrap();
    let kinds: Vec<bool> = graph.layers[1..5]
        .iter()
        .map(|l| l.expert_params > 0)
        .collect();
    assert_eq!(kinds, [false, true, false, true]);
    // Dense blocks: 12h² + 13h; expert blocks: attention 4h² + 4h (QKV and projection
    // biases), 2 LayerNorms 4h, the router 4h, and 4 experts of 8h² + 4h + h.
    let dense = 12 * 64 * 64 + 13 * 64;
    let moe = 4 * 64 * 64 + 4 * 64 + 4 * 64 + 4 * 64 + 4 * (8 * 64 * 64 + 5 * 64);
    let ends = 100 * 64 + 16 * 64 + 2 * 64;
    assert_eq!(w.total_params(), 2 * dense + 2 * moe + ends);
    for (file, moe, field, reason) in [
        (
            "k.toml",
            "experts = 4\ntop_k = 5\n",
            "moe.top_k",
            "exceeds the 4 experts",
        ),
        (
            "c.toml",
            "experts = 4\ntop_k = 2\ncapacity_factor = 3.0\n",
            "moe.capacity_factor",
            "at most experts / top_k = 2",
        ),
        ("e.toml", "experts = 0\ntop_k = 1\n", "moe.experts", "got 0"),
        (
            "every.toml",
            "experts = 4\ntop_k = 1\nevery = 5\n",
            "moe.every",
            "none of the 4 blocks",
        ),
        (
            "u.toml",
            "experts = 4\ntop_k = 1\nexpert = 2\n",
            "expert",
            "unknown field",
        ),
    ] {
        let err = Workload::load(&write(file, moe)).unwrap_err().to_string();
        for part in [file, field, reason] {
            assert!(err.contains(part), "`{err}` lacks `{part}`");
        }
    }
}
