//! Reading measured kernel timings from a directory.
//!
//! Three formats are recognised by file name:
//! - `kernels.csv` (any name ending in `kernels.csv`), written by `calibration/collect.py`:
//!   a header row and the columns of [`CollectedRow`]; its training steps take their GPU
//!   time from the `profile.csv` of the same prefix where collect.py wrote one (`--profile`);
//! - the LLMCompass A100 artifact (`data/reference/a100_kernels/`): headerless
//!   `matmul_*.csv` (M, N, K, `0.1900ms`, `101.7Tflops`), `softmax_*.csv` and
//!   `layernorm_*.csv` (M, N, G elements/s) and `gelu_*.csv` (n, G elements/s), all fp16;
//! - published fused-attention benchmarks, `attention_*.csv`: a header row and the columns of
//!   [`AttentionBenchmarkRow`], throughput counted as FlashAttention's benchmarks count it
//!   ([`attention_benchmark_flops`]).

use super::in_row;
use crate::cost::KernelSample;
use crate::error::InputError;
use crate::placement::RecomputeMode;
use crate::workload::{
    AttentionShape, CollectiveKind, GptSizes, OpKind, Pass, Precision, VectorOp, Workload,
};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a measurement timed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// One operator on the whole device (collectives: across `group` devices).
    Op(OpKind),
    /// A forward operator and then its backward of the same shape, timed as one
    /// (FlashAttention's published benchmarks: `attention_*.csv`).
    ForwardBackward(OpKind),
    /// One GEMM or vector operator launched eagerly from the host, call after call (collect.py
    /// rows with `timing` = `eager`): its GPU time plus the gap after each of the `launches`
    /// kernels a call launches, or the host's dispatch of them where they are shorter. Beside
    /// a graph-replayed row of the same operator it measures both (`efficiency.launch_gap_s`,
    /// `efficiency.host_dispatch_s`).
    Eager { kind: OpKind, launches: u32 },
    /// One GPT transformer block (LayerNorm, attention, GeLU MLP), forward or backward; with
    /// `tensor_parallel` > 1, one device's slice of a Megatron-LM tensor-parallel block
    /// without its collectives (one GPU cannot time them).
    Block { backward: bool, shape: BlockShape },
    /// One whole training iteration of a GPT on one device.
    Step(StepShape),
    /// The mean kernel of one vector primitive inside a profiled block pass: the summed GPU
    /// time of the primitive's kernels over their count, against one operator of the model's
    /// operators of that primitive in the pass, their elements averaged likewise (the
    /// primitive streams, so its time is linear in its elements). It prices the primitive as
    /// a training pass runs it, amid other kernels and with their cache state.
    InBlock(OpKind),
    /// One GEMM or vector operator replayed after a prelude before every call, less the
    /// prelude's own time (collect.py `--cold`, `--after-gemm`): validation scores it, the fit
    /// never takes it.
    AfterPrelude { kind: OpKind, prelude: Prelude },
    /// A stream of GEMMs and a gradient all-reduce across `group` devices (collect.py, two or
    /// more GPUs): the GEMMs alone, the all-reduce alone, or both at once (the all-reduce on
    /// a side stream, as PyTorch DDP launches it during the backward).
    Overlap {
        part: OverlapPart,
        shape: OverlapShape,
    },
}

/// What ran before each call of a replay that validation scores and the fit does not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prelude {
    /// A read of twice the L2 (`timing` = `cold`): the kernel starts from a clean, empty L2,
    /// which no kernel of a training iteration sees. Priced as the single kernel.
    L2Flush,
    /// A long GEMM at the power limit (`timing` = `after_gemm`): the kernel runs at the clock
    /// a training step's GEMMs leave. Priced at the chip's training rates.
    Gemm,
}

/// Which timing of an overlap measurement a row holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum OverlapPart {
    Gemms,
    AllReduce,
    Both,
}

/// `gemms` GEMMs of m × n × k one after another, and an all-reduce of `bytes` per device
/// across `group` devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct OverlapShape {
    pub gemms: u64,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub bytes: u64,
    pub group: u32,
}

impl OverlapShape {
    /// The shape in words for reports, e.g. `8x8192x8192x8192 + 268435456B/8`.
    pub fn label(&self) -> String {
        format!(
            "{}x{}x{}x{} + {}B/{}",
            self.gemms, self.m, self.n, self.k, self.bytes, self.group
        )
    }
}

/// A measured GPT block: micro-batch, sequence, hidden size and heads, sliced
/// `tensor_parallel` ways (1 = the whole block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockShape {
    pub micro_batch: u64,
    pub seq_len: u64,
    pub hidden: u64,
    pub heads: u64,
    pub tensor_parallel: u32,
}

impl BlockShape {
    /// The shape in words for reports, e.g. `b4 s2048 h6144 a48 t8`.
    pub fn label(&self) -> String {
        format!(
            "b{} s{} h{} a{} t{}",
            self.micro_batch, self.seq_len, self.hidden, self.heads, self.tensor_parallel
        )
    }
}

/// A measured training step: embedding, the blocks, the tied language-model head and loss,
/// forward, backward (recomputing as `recompute` says) and the mixed-precision Adam step, for
/// one micro-batch (`sizes.global_batch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    pub sizes: GptSizes,
    pub recompute: RecomputeMode,
}

impl StepShape {
    /// The shape in words for reports, e.g. `L24 b16 s2048 h2304 a24 v51200`.
    pub fn label(&self) -> String {
        let s = &self.sizes;
        format!(
            "L{} b{} s{} h{} a{} v{}",
            s.layers, s.global_batch, s.seq_len, s.hidden, s.heads, s.vocab
        )
    }
}

/// One measured kernel: what ran and how long it took (median).
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The file and 1-based data row it came from.
    pub source: String,
    /// Kernel class used in reports (`gemm`, `softmax`, `all_reduce`, `block_fwd`, …).
    pub class: String,
    pub target: Target,
    pub elem_bytes: u32,
    pub measured_s: f64,
    /// Median board power sampled while it was timed, where collect.py recorded one.
    pub board_power_w: Option<f64>,
    /// How long the row was timed for in all (samples × calls per sample × seconds per call).
    pub timed_s: f64,
    /// For a block pass or a training step collect.py profiled: its kernels in one profiled
    /// run.
    pub profile: Option<PassProfile>,
}

/// The kernels of one profiled run of a block pass or a training iteration (collect.py
/// `--profile`, torch.profiler).
#[derive(Debug, Clone, PartialEq)]
pub struct PassProfile {
    /// The GPU time of its kernels by class ([`profiled_kernel_class`]), summed.
    pub class_s: BTreeMap<&'static str, f64>,
    /// How many kernels of each class it launched.
    pub class_calls: BTreeMap<&'static str, u64>,
}

impl PassProfile {
    /// The kernels it launched.
    pub fn gpu_kernels(&self) -> u64 {
        self.class_calls.values().sum()
    }

    /// The GPU time of its kernels, summed: for an iteration, the iteration less the GPU's
    /// waits for the host.
    pub fn gpu_busy_s(&self) -> f64 {
        self.class_s.values().sum()
    }

    /// The GPU time of its GEMM kernels, summed.
    pub fn gemm_busy_s(&self) -> f64 {
        self.class_s.get(GEMM_CLASS).copied().unwrap_or(0.0)
    }
}

/// The class of GEMM kernels, profiled or modelled.
pub const GEMM_CLASS: &str = "gemm";

/// The class of fused attention kernels (FlashAttention-2's, PyTorch's flash backend), profiled
/// or modelled.
pub const ATTENTION_CLASS: &str = "attention";

/// The class of a profiled CUDA kernel, named as the model's operators are
/// (`runs::model_kernel_class`): `gemm` for cuBLAS's and CUTLASS's kernels (`gemm`, and Hopper's
/// cuBLAS `nvjet_…`), else the vector primitive PyTorch's kernel of that name computes in a
/// GPT training step (`backward`: in a pass that holds a backward, a block's or an
/// iteration's), else `other` (memsets, fills, and kernels no operator of the model stands
/// for). PyTorch's softmax backward (`_softmax_backward_data`) multiplies the gradient by the
/// output over the whole tensor before its row reduction; in a backward that element-wise
/// product counts as softmax, as collect.py's `softmax_bwd` rows time both kernels. A copy
/// between dtypes (`direct_copy_kernel_cuda` outside its same-dtype `nocast` form, and
/// `bfloat16_copy_kernel_cuda`) is a cast; the embedding's gather and its backward (one kernel
/// over the features, or a sort, scan and scatter) count as the embedding. In a backward, an
/// fp32 fill is the loss's: PyTorch's NLL backward zero-fills its fp32 input gradient, tokens ×
/// vocabulary, before it scatters into it, and collect.py's `cross_entropy_bwd` rows time that
/// fill with the rest (the embedding table's bf16 zero-fill, which its rows leave out, stays
/// `other`).
pub fn profiled_kernel_class(name: &str, backward: bool) -> &'static str {
    let name = name.to_ascii_lowercase();
    let has = |part: &str| name.contains(part);
    let embedding = [
        "embedding",
        "gather_kernel",
        "radix_sort",
        "unique_by_key",
        "scan::",
        "partial_segment",
        "partials_per_segment",
        "compute_grad_weight",
        "sum_and_scatter",
        "arange",
    ];
    if has("flash_fwd") || has("flash_bwd") {
        ATTENTION_CLASS
    } else if has("gemm") || has("nvjet") {
        GEMM_CLASS
    } else if has("gammabetabackward") || (has("reduce_kernel") && has("sum_functor")) {
        VectorOp::ColumnSum.name()
    } else if has("logsoftmax") || has("nll_loss") || (backward && has("fillfunctor<float>")) {
        VectorOp::CrossEntropy.name()
    } else if has("fusedadam") {
        VectorOp::Update.name()
    } else if has("bfloat16_copy") || (has("direct_copy") && !has("nocast")) {
        VectorOp::Cast.name()
    } else if embedding.iter().any(|part| has(part)) {
        VectorOp::Embedding.name()
    } else if has("softmax") || (backward && has("binaryfunctor") && has("mulfunctor")) {
        VectorOp::Softmax.name()
    } else if has("layer_norm") {
        VectorOp::LayerNorm.name()
    } else if has("catarraybatchedcopy") {
        VectorOp::Stack.name()
    } else if has("dropout") || has("masked_scale") {
        VectorOp::Dropout.name()
    } else if has("gelu") {
        VectorOp::Gelu.name()
    } else if has("cudafunctor_add") {
        VectorOp::Add.name()
    } else if has("aunaryfunctor") && has("mulfunctor") {
        VectorOp::Scale.name()
    } else if has("binaryfunctor") && has("mulfunctor") {
        VectorOp::Mul.name()
    } else if has("direct_copy") {
        VectorOp::Copy.name()
    } else {
        OTHER_CLASS
    }
}

/// The suffix of the class of a kernel replayed cold (collect.py `--cold`: the L2 read away
/// before every call).
pub const COLD: &str = "_cold";

/// The suffix of the class of a kernel replayed after a long GEMM (collect.py `--after-gemm`:
/// at the clock a training step's GEMMs leave).
pub const AFTER_GEMM: &str = "_after_gemm";

impl Measurement {
    /// A measurement of `measured_s` without a power sample or a profile, timed for that one
    /// call (reference data, kernels found inside profiled passes, synthetic rows).
    pub fn new(
        source: String,
        class: String,
        target: Target,
        elem_bytes: u32,
        measured_s: f64,
    ) -> Self {
        Measurement {
            source,
            class,
            target,
            elem_bytes,
            measured_s,
            board_power_w: None,
            timed_s: measured_s,
            profile: None,
        }
    }

    /// Whether it is a replay after a prelude ([`Target::AfterPrelude`]: classes [`COLD`] and
    /// [`AFTER_GEMM`]), which validation scores and the fit does not take.
    pub fn after_prelude(&self) -> bool {
        matches!(self.target, Target::AfterPrelude { .. })
    }

    /// The measurement as the cost fit takes it, of operator `kind` (its target's): timed
    /// with its backward where the target says so.
    pub fn kernel_sample(&self, kind: OpKind) -> KernelSample {
        KernelSample {
            kind,
            elem_bytes: self.elem_bytes,
            measured_s: self.measured_s,
            with_backward: matches!(self.target, Target::ForwardBackward(_)),
        }
    }
}

/// The class of profiled kernels no operator of the model stands for.
pub const OTHER_CLASS: &str = "other";

/// A row of `kernels.csv` as written by `calibration/collect.py` (schema: calibration/README.md).
#[derive(Debug, Clone, Deserialize)]
pub struct CollectedRow {
    pub gpu: String,
    pub kernel: String,
    pub dtype: String,
    pub batch: u64,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub elements: u64,
    pub row_len: u64,
    pub group: u32,
    pub median_s: f64,
    /// Timed samples and calls per sample; absent in files that predate them (one each).
    #[serde(default)]
    pub repeats: u64,
    #[serde(default)]
    pub burst: u64,
    /// Median board power while the row was timed; empty when no sample fell in it.
    #[serde(default, deserialize_with = "csv::invalid_option")]
    pub power_run_w: Option<f64>,
    /// Kernels one call launches (`eager` rows: counted by the profiler, a backward row's less
    /// its forward's); absent in files that predate the column.
    #[serde(default)]
    pub launches: Option<u32>,
    /// How the row was timed: `graph` (replays of a CUDA graph: the GPU's time alone), `cold`
    /// (the same with the L2 read away before every call, whose own time is subtracted: the
    /// operands come from HBM) or `eager` (launched from the host call after call); absent in
    /// files that predate the column, whose kernel rows replayed graphs or were only timed
    /// one way.
    #[serde(default)]
    pub timing: Option<String>,
}

/// All measurements in `dir`, in file-name order then row order. Files that match neither
/// format are ignored; a matching file with a bad row is an error naming file, row and field.
pub fn load_measurements(dir: &Path) -> Result<Vec<Measurement>, InputError> {
    let entries = std::fs::read_dir(dir).map_err(|e| InputError::Io {
        file: dir.to_path_buf(),
        source: e,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let rows = if name.ends_with("kernels.csv") {
            load_collected(&file)?
        } else if name.starts_with("attention_") {
            read_attention_benchmarks(&file)?
        } else if let Some(format) = ArtifactFormat::for_name(&name) {
            read_artifact(&file, format)?
        } else {
            continue;
        };
        if rows.is_empty() {
            return Err(InputError::invalid(
                &file,
                "rows",
                "the file holds no measurements; remove it or collect its rows",
            ));
        }
        out.extend(rows);
    }
    if out.is_empty() {
        return Err(InputError::invalid(
            dir,
            "files",
            "no measurement CSVs found (expected kernels.csv from calibration/collect.py, or \
             matmul_*.csv / softmax_*.csv / layernorm_*.csv / gelu_*.csv, or published \
             attention_*.csv)",
        ));
    }
    Ok(out)
}

/// The measurements of every directory of `dirs` in turn, each read by [`load_measurements`].
pub fn load_measurement_dirs(dirs: &[PathBuf]) -> Result<Vec<Measurement>, InputError> {
    let mut out = Vec::new();
    for dir in dirs {
        out.extend(load_measurements(dir)?);
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy)]
enum ArtifactFormat {
    Matmul,
    Rows(VectorOp),
    Gelu,
}

impl ArtifactFormat {
    fn for_name(name: &str) -> Option<ArtifactFormat> {
        if name.starts_with("matmul_") {
            Some(ArtifactFormat::Matmul)
        } else if name.starts_with("softmax_") {
            Some(ArtifactFormat::Rows(VectorOp::Softmax))
        } else if name.starts_with("layernorm_") {
            Some(ArtifactFormat::Rows(VectorOp::LayerNorm))
        } else if name.starts_with("gelu_") {
            Some(ArtifactFormat::Gelu)
        } else {
            None
        }
    }
}

fn csv_error(file: &Path, e: csv::Error) -> InputError {
    InputError::malformed(file, "CSV", e.to_string())
}

/// A positive finite number from a field, with an optional unit suffix removed.
fn number(
    file: &Path,
    row: usize,
    column: &str,
    field: &str,
    suffix: &str,
) -> Result<f64, InputError> {
    let text = field.trim();
    let text = text.strip_suffix(suffix).unwrap_or(text).trim();
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(v) => Err(InputError::invalid(
            file,
            format!("row {row}, {column}"),
            format!("must be a positive number, got {v}"),
        )),
        Err(_) => Err(InputError::invalid(
            file,
            format!("row {row}, {column}"),
            format!("`{field}` is not a number"),
        )),
    }
}

/// Largest kernel dimension or element count a measurement may give (2^40): beyond any
/// kernel, and safe from overflow in the byte and FLOP counts.
const MAX_SIZE: f64 = (1u64 << 40) as f64;

/// A positive whole size no larger than [`MAX_SIZE`].
fn size(file: &Path, row: usize, column: &str, field: &str) -> Result<u64, InputError> {
    let v = number(file, row, column, field, "")?;
    if v.fract() != 0.0 || v > MAX_SIZE {
        return Err(InputError::invalid(
            file,
            format!("row {row}, {column}"),
            format!("must be a whole number of at most {MAX_SIZE}, got {v}"),
        ));
    }
    Ok(v as u64)
}

fn read_artifact(file: &Path, format: ArtifactFormat) -> Result<Vec<Measurement>, InputError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .trim(csv::Trim::All)
        .flexible(true)
        .from_path(file)
        .map_err(|e| csv_error(file, e))?;
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let row = i + 1;
        let r = record.map_err(|e| csv_error(file, e))?;
        let want = match format {
            ArtifactFormat::Matmul => 5,
            ArtifactFormat::Rows(_) => 3,
            ArtifactFormat::Gelu => 2,
        };
        if r.len() < want {
            return Err(InputError::invalid(
                file,
                format!("row {row}"),
                format!("expected {want} columns, found {}", r.len()),
            ));
        }
        let int = |c: usize, name: &str| size(file, row, name, &r[c]);
        let source = format!("{}:{row}", file.display());
        let (class, kind, measured_s) = match format {
            ArtifactFormat::Matmul => {
                let (m, n, k) = (int(0, "M")?, int(1, "N")?, int(2, "K")?);
                let ms = number(file, row, "latency", &r[3], "ms")?;
                ("gemm", OpKind::Gemm { batch: 1, m, n, k }, ms * 1e-3)
            }
            ArtifactFormat::Rows(op) => {
                let (m, n) = (int(0, "M")?, int(1, "N")?);
                let gelems = number(file, row, "throughput", &r[2], "")?;
                let elements = m * n;
                let kind = OpKind::Vector {
                    op,
                    elements,
                    row_len: n,
                    pass: Pass::Forward,
                };
                (class_of(op), kind, elements as f64 / (gelems * 1e9))
            }
            ArtifactFormat::Gelu => {
                let elements = int(0, "n")?;
                let gelems = number(file, row, "throughput", &r[1], "")?;
                let kind = OpKind::Vector {
                    op: VectorOp::Gelu,
                    elements,
                    row_len: 1,
                    pass: Pass::Forward,
                };
                ("gelu", kind, elements as f64 / (gelems * 1e9))
            }
        };
        out.push(Measurement::new(
            source,
            class.to_string(),
            Target::Op(kind),
            2,
            measured_s,
        ));
    }
    Ok(out)
}

/// A row of a published fused-attention benchmark (`attention_*.csv`, `#` lines are comments):
/// `batch` sequences of `seq_len` tokens with `heads` heads of `head_dim`, timed forward or
/// forward and backward, at `tflops_per_s` as [`attention_benchmark_flops`] counts it.
#[derive(Debug, Clone, Deserialize)]
pub struct AttentionBenchmarkRow {
    /// The kernel's name in the measurement's class (letters, digits, `_`): `fa2`, `fa3`.
    pub implementation: String,
    /// `forward` or `forward_backward`.
    pub pass: String,
    pub causal: bool,
    pub batch: u64,
    pub heads: u64,
    pub seq_len: u64,
    pub head_dim: u64,
    pub dtype: String,
    pub tflops_per_s: f64,
}

/// The FLOPs FlashAttention's benchmarks (`benchmarks/benchmark_flash_attention.py`) count for
/// `shape`'s `batch_heads` = batch × heads: 4 · batch_heads · s² · d forward (the two
/// products), half that under a causal mask, and 2.5 times the forward for the backward.
pub fn attention_benchmark_flops(shape: AttentionShape, with_backward: bool) -> f64 {
    let s = shape.seq_len as f64;
    let masked = if shape.causal { 0.5 } else { 1.0 };
    let forward = 4.0 * shape.heads as f64 * s * s * shape.head_dim as f64 * masked;
    if with_backward {
        3.5 * forward
    } else {
        forward
    }
}

fn read_attention_benchmarks(file: &Path) -> Result<Vec<Measurement>, InputError> {
    let mut reader = headed_reader(file)?;
    let mut out = Vec::new();
    for (i, record) in reader.deserialize::<AttentionBenchmarkRow>().enumerate() {
        let row = i + 1;
        let r = record.map_err(|e| csv_error(file, e))?;
        let bad = |field: &str, reason: String| {
            InputError::invalid(file, format!("row {row}, {field}"), reason)
        };
        if r.implementation.is_empty()
            || !r
                .implementation
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(bad(
                "implementation",
                format!(
                    "must be letters, digits and `_`, got `{}`",
                    r.implementation
                ),
            ));
        }
        let with_backward = match r.pass.as_str() {
            "forward" => false,
            "forward_backward" => true,
            other => {
                return Err(bad(
                    "pass",
                    format!("must be `forward` or `forward_backward`, got `{other}`"),
                ))
            }
        };
        for (name, value) in [
            ("batch", r.batch),
            ("heads", r.heads),
            ("seq_len", r.seq_len),
            ("head_dim", r.head_dim),
        ] {
            if value == 0 {
                return Err(bad(name, "must be positive".into()));
            }
        }
        if !(r.tflops_per_s.is_finite() && r.tflops_per_s > 0.0) {
            return Err(bad(
                "tflops_per_s",
                format!("must be positive, got {}", r.tflops_per_s),
            ));
        }
        let elem_bytes = dtype_bytes(&r.dtype)
            .ok_or_else(|| bad("dtype", format!("unknown dtype `{}`", r.dtype)))?;
        let batch_heads = r
            .batch
            .checked_mul(r.heads)
            .ok_or_else(|| bad("heads", "batch × heads overflows".into()))?;
        let shape = AttentionShape {
            heads: batch_heads,
            kv_heads: batch_heads,
            seq_len: r.seq_len,
            head_dim: r.head_dim,
            causal: r.causal,
        };
        let forward = OpKind::Attention {
            shape,
            pass: Pass::Forward,
        };
        let target = if with_backward {
            Target::ForwardBackward(forward)
        } else {
            Target::Op(forward)
        };
        let measured_s = attention_benchmark_flops(shape, with_backward) / (r.tflops_per_s * 1e12);
        let class = format!(
            "attention_{}{}{}",
            r.implementation,
            if r.causal { "_causal" } else { "" },
            if with_backward { "_fwd_bwd" } else { "" }
        );
        out.push(Measurement::new(
            format!("{}:{row}", file.display()),
            class,
            target,
            elem_bytes,
            measured_s,
        ));
    }
    Ok(out)
}

fn class_of(op: VectorOp) -> &'static str {
    match op {
        VectorOp::Softmax => "softmax",
        VectorOp::LayerNorm => "layernorm",
        VectorOp::Gelu => "gelu",
        VectorOp::Silu => "silu",
        VectorOp::Mul => "mul",
        VectorOp::Add => "add",
        _ => "vector",
    }
}

fn dtype_bytes(dtype: &str) -> Option<u32> {
    match dtype {
        "fp16" | "bf16" | "float16" | "bfloat16" => Some(2),
        "fp32" | "float32" | "tf32" => Some(4),
        _ => None,
    }
}

/// The measurements of one collect.py `kernels.csv`, its training steps with their GPU time
/// from the `profile.csv` of the same prefix beside it, where there is one.
pub fn load_collected(file: &Path) -> Result<Vec<Measurement>, InputError> {
    let mut reader = headed_reader(file)?;
    let busy = profiles_beside(file)?;
    let mut out = Vec::new();
    for (i, record) in reader.deserialize::<CollectedRow>().enumerate() {
        let row = i + 1;
        let r = record.map_err(|e| csv_error(file, e))?;
        let bad = |field: &str, reason: String| {
            InputError::invalid(file, format!("row {row}, {field}"), reason)
        };
        if !(r.median_s.is_finite() && r.median_s > 0.0) {
            return Err(bad(
                "median_s",
                format!("must be positive, got {}", r.median_s),
            ));
        }
        if let Some(w) = r.power_run_w.filter(|w| !(w.is_finite() && *w > 0.0)) {
            return Err(bad("power_run_w", format!("must be positive, got {w}")));
        }
        let elem_bytes = dtype_bytes(&r.dtype)
            .ok_or_else(|| bad("dtype", format!("unknown dtype `{}`", r.dtype)))?;
        let vector_pass = |op: VectorOp, pass: Pass| OpKind::Vector {
            op,
            elements: r.elements,
            row_len: r.row_len.max(1),
            pass,
        };
        let vector = |op: VectorOp| vector_pass(op, Pass::Forward);
        let collective = |collective: CollectiveKind| OpKind::Collective {
            collective,
            bytes: r.elements.saturating_mul(u64::from(elem_bytes)),
            group: r.group,
        };
        let op = |kind: OpKind| Target::Op(kind);
        let target = match r.kernel.as_str() {
            // `gemm_nt` (A·Bᵀ) and `gemm_tn` (Aᵀ·B) are the layouts of nn.Linear's forward and
            // weight gradient; the model prices every layout alike, and validation shows how
            // far that holds.
            "gemm" | "gemm_nt" | "gemm_tn" | "bmm" | "attention_qk" | "attention_av" => {
                op(OpKind::Gemm {
                    batch: r.batch.max(1),
                    m: r.m,
                    n: r.n,
                    k: r.k,
                })
            }
            // Fused (flash) attention (collect.py's `attention_flash`, PyTorch's
            // `scaled_dot_product_attention` on its flash backend): batch = query heads
            // (samples × heads), m = sequence, n = head dimension, k = key/value heads (0: as
            // many as the query heads).
            "attention_flash"
            | "attention_flash_bwd"
            | "attention_flash_causal"
            | "attention_flash_causal_bwd" => op(OpKind::Attention {
                shape: AttentionShape {
                    heads: r.batch,
                    kv_heads: if r.k == 0 { r.batch } else { r.k },
                    seq_len: r.m,
                    head_dim: r.n,
                    causal: r.kernel.contains("causal"),
                },
                pass: if r.kernel.ends_with("_bwd") {
                    Pass::Backward
                } else {
                    Pass::Forward
                },
            }),
            "softmax" => op(vector(VectorOp::Softmax)),
            "softmax_bwd" => op(vector_pass(VectorOp::Softmax, Pass::Backward)),
            // Rows of square causal scores (collect.py's Triton stand-in for Megatron-LM's
            // fused kernel).
            "softmax_causal" => op(vector(VectorOp::CausalSoftmax)),
            "softmax_causal_bwd" => op(vector_pass(VectorOp::CausalSoftmax, Pass::Backward)),
            "layernorm" => op(vector(VectorOp::LayerNorm)),
            "layernorm_bwd" => op(vector_pass(VectorOp::LayerNorm, Pass::Backward)),
            "rmsnorm" => op(vector(VectorOp::RmsNorm)),
            "gelu" => op(vector(VectorOp::Gelu)),
            "gelu_bwd" => op(vector_pass(VectorOp::Gelu, Pass::Backward)),
            "silu" => op(vector(VectorOp::Silu)),
            "mul" => op(vector(VectorOp::Mul)),
            "dropout" => op(vector(VectorOp::Dropout)),
            "dropout_bwd" => op(vector_pass(VectorOp::Dropout, Pass::Backward)),
            "add" => op(vector(VectorOp::Add)),
            // The token embedding (collect.py's `embedding`: m = tokens, n = hidden,
            // k = vocabulary): the table rows' gather, and its backward less the table
            // gradient's zero-fill (the scatter of the tokens' gradient rows into it).
            "embedding" => op(vector(VectorOp::Embedding)),
            "embedding_bwd" => op(vector_pass(VectorOp::Embedding, Pass::Backward)),
            "cross_entropy" => op(vector(VectorOp::CrossEntropy)),
            "cross_entropy_bwd" => op(vector_pass(VectorOp::CrossEntropy, Pass::Backward)),
            // Layout copies (collect.py's `copies`): the attention context's transpose to
            // token-major rows, and the backward of the fused QKV projection's split, which
            // stacks three head-major gradients into token-major rows.
            "copy" => op(vector(VectorOp::Copy)),
            "stack" => op(vector(VectorOp::Stack)),
            // The backward's column sums: a bias gradient (the output gradient summed over the
            // tokens) and a LayerNorm's weight gradients (`elements` counts both tensors read).
            "column_sum" | "layernorm_wgrad" => {
                op(vector_pass(VectorOp::ColumnSum, Pass::Backward))
            }
            // fp16/bf16 → fp32 (`dtype` is the narrow side) and back.
            "cast" => op(vector(VectorOp::Cast)),
            "cast_bwd" => op(vector_pass(VectorOp::Cast, Pass::Backward)),
            // A fused Adam step: one element per parameter (dtype fp32: main weights).
            "adam" => op(vector(VectorOp::Update)),
            "all_reduce" => op(collective(CollectiveKind::AllReduce)),
            "all_gather" => op(collective(CollectiveKind::AllGather)),
            // A block: batch = micro-batch, m = sequence, n = hidden, k = heads,
            // group = tensor-parallel degree of the slice.
            "block_fwd" | "block_bwd" => Target::Block {
                backward: r.kernel == "block_bwd",
                shape: BlockShape {
                    micro_batch: r.batch,
                    seq_len: r.m,
                    hidden: r.n,
                    heads: r.k,
                    tensor_parallel: r.group,
                },
            },
            // A training step: batch = micro-batch, m = sequence, n = hidden, k = heads,
            // group = layers, elements = vocabulary; the name says what is recomputed.
            "train_step_none" | "train_step_selective" | "train_step_full" => {
                Target::Step(StepShape {
                    sizes: GptSizes {
                        layers: u64::from(r.group),
                        hidden: r.n,
                        heads: r.k,
                        vocab: r.elements,
                        seq_len: r.m,
                        global_batch: r.batch,
                    },
                    recompute: match r.kernel.as_str() {
                        "train_step_none" => RecomputeMode::None,
                        "train_step_selective" => RecomputeMode::Selective,
                        _ => RecomputeMode::Full,
                    },
                })
            }
            // batch GEMMs of m × n × k and an all-reduce of `elements` across `group` GPUs.
            "overlap_gemms" | "overlap_all_reduce" | "overlap_both" => Target::Overlap {
                part: match r.kernel.as_str() {
                    "overlap_gemms" => OverlapPart::Gemms,
                    "overlap_all_reduce" => OverlapPart::AllReduce,
                    _ => OverlapPart::Both,
                },
                shape: OverlapShape {
                    gemms: r.batch,
                    m: r.m,
                    n: r.n,
                    k: r.k,
                    bytes: r.elements.saturating_mul(u64::from(elem_bytes)),
                    group: r.group,
                },
            },
            other => return Err(bad("kernel", format!("unknown kernel `{other}`"))),
        };
        let zero = match target {
            Target::Op(OpKind::Gemm { m, n, k, .. }) => m == 0 || n == 0 || k == 0,
            Target::Op(OpKind::Vector { elements, .. }) => elements == 0,
            // Eager rows are made below, from checked operators; in-block kernels by
            // calibration, from checked blocks.
            Target::Eager { .. } | Target::InBlock(_) | Target::AfterPrelude { .. } => false,
            Target::Op(OpKind::Collective { bytes, group, .. }) => bytes == 0 || group < 2,
            Target::Op(OpKind::Attention { shape: a, .. }) => {
                [a.heads, a.kv_heads, a.seq_len, a.head_dim].contains(&0)
                    || a.heads % a.kv_heads != 0
            }
            // Only published benchmarks, checked as they are read.
            Target::ForwardBackward(_) => false,
            Target::Block { shape: b, .. } => {
                [b.micro_batch, b.seq_len, b.hidden, b.heads].contains(&0) || b.tensor_parallel == 0
            }
            // Checked below as a workload file's sizes are.
            Target::Step(_) => false,
            Target::Overlap { shape: o, .. } => {
                [o.gemms, o.m, o.n, o.k, o.bytes].contains(&0) || o.group < 2
            }
        };
        if zero {
            return Err(bad(
                "shape",
                "sizes must be positive (and group ≥ 2 for collectives and overlaps)".into(),
            ));
        }
        if let Some((name, v)) = [
            ("batch", r.batch),
            ("m", r.m),
            ("n", r.n),
            ("k", r.k),
            ("elements", r.elements),
            ("row_len", r.row_len),
        ]
        .into_iter()
        .find(|&(_, v)| v as f64 > MAX_SIZE)
        {
            return Err(bad(name, format!("must be at most {MAX_SIZE}, got {v}")));
        }
        if let Target::Block {
            shape:
                BlockShape {
                    hidden,
                    heads,
                    tensor_parallel,
                    ..
                },
            ..
        } = target
        {
            let tp = u64::from(tensor_parallel);
            if heads % tp != 0 || hidden % heads != 0 {
                return Err(bad(
                    "group",
                    format!(
                        "a {tensor_parallel}-way slice needs heads ({heads}) divisible by it and \
                         hidden ({hidden}) divisible by heads"
                    ),
                ));
            }
        }
        if let Target::Step(step) = target {
            Workload::gpt(&r.kernel, file, step.sizes, Precision::Fp16)
                .map_err(|e| in_row(row, e))?;
        }
        // (eager, a replay's prelude and the suffix of its class).
        let (eager, prelude) = match r.timing.as_deref() {
            None | Some("" | "graph") => (false, None),
            Some("eager") => (true, None),
            Some("cold") => (false, Some((Prelude::L2Flush, COLD))),
            Some("after_gemm") => (false, Some((Prelude::Gemm, AFTER_GEMM))),
            Some(other) => {
                return Err(bad(
                    "timing",
                    format!("unknown timing `{other}` (expected graph, cold, after_gemm or eager)"),
                ))
            }
        };
        let (target, class) = match (target, prelude) {
            (Target::Op(kind @ (OpKind::Gemm { .. } | OpKind::Vector { .. })), _) if eager => (
                Target::Eager {
                    kind,
                    launches: match r.launches {
                        // Files that predate the column: one kernel per call, as every
                        // forward row launches.
                        None => 1,
                        Some(0) => return Err(bad("launches", "must be at least 1".into())),
                        Some(n) => n,
                    },
                },
                format!("{}_eager", r.kernel),
            ),
            (
                Target::Op(kind @ (OpKind::Gemm { .. } | OpKind::Vector { .. })),
                Some((prelude, suffix)),
            ) => (
                Target::AfterPrelude { kind, prelude },
                format!("{}{suffix}", r.kernel),
            ),
            (_, Some(_)) => {
                return Err(bad(
                    "timing",
                    format!(
                        "`{}` replays single GEMM and vector kernels only, not `{}`",
                        r.timing.as_deref().unwrap_or_default(),
                        r.kernel
                    ),
                ))
            }
            (other, None) => (other, r.kernel.clone()),
        };
        let profile = match target {
            Target::Step(_) => {
                let shape = [r.batch, r.m, r.n, r.k, r.elements, u64::from(r.group)];
                busy.get(&(r.kernel.clone(), shape)).cloned()
            }
            Target::Block { .. } => {
                let shape = [r.batch, r.m, r.n, r.k, 0, u64::from(r.group)];
                busy.get(&(r.kernel.clone(), shape)).cloned()
            }
            _ => None,
        };
        out.push(Measurement {
            source: format!("{}:{row}", file.display()),
            class,
            target,
            elem_bytes,
            measured_s: r.median_s,
            board_power_w: r.power_run_w,
            timed_s: r.median_s * (r.repeats.max(1) * r.burst.max(1)) as f64,
            profile,
        });
    }
    Ok(out)
}

/// A reader of a CSV file with a header row; lines that start with `#` are comments.
fn headed_reader(file: &Path) -> Result<csv::Reader<std::fs::File>, InputError> {
    csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_path(file)
        .map_err(|e| csv_error(file, e))
}

/// A block pass or training step as `kernels.csv` and `profile.csv` both name it: kernel
/// (`pass` in the profile), and batch, m, n, k, elements (0 for a block) and group.
type PassKey = (String, [u64; 6]);

/// A row of collect.py's `profile.csv`: one kernel name's CUDA time in one profiled run (a
/// block's row leaves `elements` empty).
#[derive(Debug, Deserialize)]
struct ProfileRow {
    pass: String,
    batch: u64,
    m: u64,
    n: u64,
    k: u64,
    #[serde(deserialize_with = "csv::invalid_option")]
    elements: Option<u64>,
    group: u64,
    /// The CUDA kernel's name.
    name: String,
    calls: u64,
    total_s: f64,
}

/// The kernel time and kernel count by class of every block pass and training
/// step in the collect.py `profile.csv` beside the `kernels.csv` `file` (same prefix); none
/// where there is no such file.
fn profiles_beside(file: &Path) -> Result<BTreeMap<PassKey, PassProfile>, InputError> {
    let mut busy = BTreeMap::new();
    let name = file.file_name().map(|n| n.to_string_lossy().to_lowercase());
    let Some(prefix) = name.as_deref().and_then(|n| n.strip_suffix("kernels.csv")) else {
        return Ok(busy);
    };
    let file = &file.with_file_name(format!("{prefix}profile.csv"));
    if !file.is_file() {
        return Ok(busy);
    }
    let mut reader = headed_reader(file)?;
    for (i, record) in reader.deserialize::<ProfileRow>().enumerate() {
        let r = record.map_err(|e| csv_error(file, e))?;
        if !(r.total_s.is_finite() && r.total_s >= 0.0) {
            return Err(InputError::invalid(
                file,
                format!("row {}, total_s", i + 1),
                format!("must be a time of zero or more seconds, got {}", r.total_s),
            ));
        }
        let elements = if r.pass.starts_with("train_step") {
            r.elements.ok_or_else(|| {
                InputError::invalid(
                    file,
                    format!("row {}, elements", i + 1),
                    "a training step needs its vocabulary size",
                )
            })?
        } else if r.pass == "block_fwd" || r.pass == "block_bwd" {
            0
        } else {
            continue;
        };
        let backward = r.pass.ends_with("bwd") || r.pass.starts_with("train_step");
        let class = profiled_kernel_class(&r.name, backward);
        let key = (r.pass, [r.batch, r.m, r.n, r.k, elements, r.group]);
        let profile = busy.entry(key).or_insert(PassProfile {
            class_s: BTreeMap::new(),
            class_calls: BTreeMap::new(),
        });
        *profile.class_calls.entry(class).or_default() += r.calls;
        *profile.class_s.entry(class).or_default() += r.total_s;
    }
    Ok(busy)
}
