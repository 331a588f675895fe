//! End-to-end validation: published training runs re-planned with their (t, p, d) held fixed,
//! and single GPT blocks, predicted from chip facts and kernel calibration only.

use super::{Measurement, Target};
use crate::arch::ArchConfig;
use crate::cost::CostModel;
use crate::error::InputError;
use crate::placement::{Fixed, RecomputeMode};
use crate::schedule::{ScheduleCache, ScheduleProblem};
use crate::search::{evaluate, recompute_from_name, EvaluateError, PlanOptions};
use crate::workload::{Family, Model, OpGraph, Optimizer, Precision, Template, Workload};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A row of `published_runs.csv`.
#[derive(Debug, Clone, Deserialize)]
struct PublishedRun {
    source: String,
    model: String,
    layers: u64,
    hidden: u64,
    heads: u64,
    seq: u64,
    vocab: u64,
    global_batch: u64,
    tp: u32,
    pp: u32,
    dp: u32,
    gpus: u32,
    recompute: String,
    measured_tflops_per_gpu: f64,
}

/// Predicted against measured throughput of one published run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunError {
    pub source: String,
    pub model: String,
    pub gpus: u32,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    pub recompute: RecomputeMode,
    /// The micro-batch the search chose (the runs do not state theirs).
    pub micro_batch: Option<u32>,
    pub measured_tflops_per_gpu: f64,
    /// The publication's FLOPs per iteration ([`megatron_flops_per_iteration`]) over the
    /// predicted iteration time, per GPU: predicted / measured is measured / predicted time.
    pub predicted_tflops_per_gpu: f64,
    pub time_per_batch_s: f64,
    /// (predicted − measured) / measured.
    pub signed_error: f64,
}

/// A GPT model (multi-head attention, 4h FFN) of `layers` × `hidden` with `heads` heads.
fn gpt_template(layers: u64, hidden: u64, heads: u64, vocab: u64) -> Template {
    Template {
        family: Family::Gpt,
        layers,
        hidden,
        heads,
        kv_heads: heads,
        ffn_hidden: 4 * hidden,
        vocab,
    }
}

/// Mixed-precision Adam training of `template`, as the Megatron-LM runs use.
fn training(
    name: &str,
    source: &Path,
    template: Template,
    seq_len: u64,
    global_batch: u64,
) -> Workload {
    Workload {
        name: name.to_string(),
        global_batch,
        seq_len,
        precision: Precision::Fp16,
        optimizer: Optimizer::Adam,
        model: Model::Template(template),
        source: source.to_path_buf(),
    }
}

/// FLOPs per iteration as Narayanan et al. (2021, §5.1) count them for a GPT of `layers` ×
/// `hidden`, sequence `seq`, vocabulary `vocab` and `global_batch` sequences: every block's
/// GEMMs 3× (forward and backward) or, recomputing, 4×, plus the logits 3×:
/// c·B·s·l·h²·(1 + s/(6h)) + 6·B·s·h·V with c = 72, or 96 under full recompute. Selective
/// recompute adds the attention core's forward (4·B·s²·h per layer). The measured TFLOP/s of
/// `published_runs.csv` are this count over the measured time, so predictions use it too.
pub fn megatron_flops_per_iteration(
    layers: u64,
    hidden: u64,
    seq: u64,
    vocab: u64,
    global_batch: u64,
    recompute: RecomputeMode,
) -> f64 {
    let (l, h, s, v, b) = (
        layers as f64,
        hidden as f64,
        seq as f64,
        vocab as f64,
        global_batch as f64,
    );
    let blocks = b * s * l * h * h * (1.0 + s / (6.0 * h));
    let logits = 6.0 * b * s * h * v;
    match recompute {
        RecomputeMode::None => 72.0 * blocks + logits,
        RecomputeMode::Selective => 72.0 * blocks + 4.0 * b * s * s * h * l + logits,
        RecomputeMode::Full => 96.0 * blocks + logits,
    }
}

fn recompute_mode(file: &Path, row: usize, text: &str) -> Result<RecomputeMode, InputError> {
    recompute_from_name(text).ok_or_else(|| {
        InputError::invalid(
            file,
            format!("row {row}, recompute"),
            format!("`{text}` is not one of none, selective, full"),
        )
    })
}

/// Every run of `runs_csv` planned on `arch` with its (t, p, d) and recompute mode held and
/// the micro-batch searched; predicted TFLOP/s per GPU against the measured ones.
pub fn validate_runs(
    runs_csv: &Path,
    arch: &ArchConfig,
    cache: &ScheduleCache,
) -> Result<Vec<RunError>, EvaluateError> {
    let text = crate::error::read_input(runs_csv)?;
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut out = Vec::new();
    for (i, record) in reader.deserialize::<PublishedRun>().enumerate() {
        let row = i + 1;
        let run = record.map_err(|e| InputError::malformed(runs_csv, "CSV", e.to_string()))?;
        let recompute = recompute_mode(runs_csv, row, &run.recompute)?;
        if run.tp * run.pp * run.dp != run.gpus {
            return Err(InputError::invalid(
                runs_csv,
                format!("row {row}, gpus"),
                format!(
                    "t·p·d = {}·{}·{} is not the {} GPUs",
                    run.tp, run.pp, run.dp, run.gpus
                ),
            )
            .into());
        }
        let workload = training(
            &run.model,
            runs_csv,
            gpt_template(run.layers, run.hidden, run.heads, run.vocab),
            run.seq,
            run.global_batch,
        );
        let options = PlanOptions {
            micro_batches: vec![1, 2, 4, 8, 16],
            recompute: vec![recompute],
            fixed: Fixed {
                tp: Some(run.tp),
                pp: Some(run.pp),
                dp: Some(run.dp),
            },
            // Megatron-LM of these runs all-reduced gradients after the backward pass.
            dp_overlap: false,
            ..PlanOptions::searching(run.gpus)
        };
        let e = evaluate(&workload, arch, &options, cache)?;
        let flops = megatron_flops_per_iteration(
            run.layers,
            run.hidden,
            run.seq,
            run.vocab,
            run.global_batch,
            recompute,
        );
        let predicted = flops / (e.plan.time_per_batch_s * f64::from(run.gpus)) / 1e12;
        out.push(RunError {
            source: format!("{}:{row} ({})", runs_csv.display(), run.source),
            model: run.model,
            gpus: run.gpus,
            tp: run.tp,
            pp: run.pp,
            dp: run.dp,
            recompute,
            micro_batch: Some(e.plan.micro_batch),
            measured_tflops_per_gpu: run.measured_tflops_per_gpu,
            predicted_tflops_per_gpu: predicted,
            time_per_batch_s: e.plan.time_per_batch_s,
            signed_error: (predicted - run.measured_tflops_per_gpu) / run.measured_tflops_per_gpu,
        });
    }
    Ok(out)
}

/// A measured GPT block: hidden `hidden`, `heads` heads, sequence `seq_len`, micro-batch
/// `micro_batch`, sliced `tensor_parallel` ways, operands of `elem_bytes` bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockShape {
    pub micro_batch: u64,
    pub seq_len: u64,
    pub hidden: u64,
    pub heads: u64,
    pub tensor_parallel: u32,
    pub elem_bytes: u32,
}

/// Forward and backward latency of one device's share of a GPT block on `arch`, without the
/// tensor-parallel collectives (what one GPU times of a slice).
pub fn gpt_block_latency(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    block: BlockShape,
) -> Result<(f64, f64), EvaluateError> {
    let mut workload = training(
        "block",
        &PathBuf::from("measured block"),
        gpt_template(1, block.hidden, block.heads, 1024),
        block.seq_len,
        block.micro_batch,
    );
    if block.elem_bytes == 4 {
        workload.precision = Precision::Fp32;
    }
    let micro_batch = u32::try_from(block.micro_batch)
        .map_err(|_| InputError::invalid(&workload.source, "batch", "micro-batch too large"))?;
    let graph = workload.layer_graph(block.tensor_parallel, micro_batch, false)?;
    let layer = graph
        .layers
        .iter()
        .find(|l| l.signature.contains("block"))
        .ok_or_else(|| InputError::invalid(&workload.source, "layers", "no transformer block"))?;
    let cost = CostModel::new(arch);
    let schedule = |pass: &str, ops: &OpGraph| -> Result<f64, EvaluateError> {
        let problem = ScheduleProblem::from_op_graph(&ops.without_collectives(), &cost);
        let key = format!("{}|compute only|{pass}", layer.signature);
        Ok(cache
            .get_or_compute(&key, cost.hardware_key(), &problem)?
            .makespan_s)
    };
    Ok((schedule("fwd", &layer.fwd)?, schedule("bwd", &layer.bwd)?))
}

/// The predicted latency of a measured GPT block (its forward or backward schedule); `None`
/// for a measurement of something else or a block that cannot be scheduled.
pub fn block_latency(arch: &ArchConfig, cache: &ScheduleCache, m: &Measurement) -> Option<f64> {
    let Target::Block {
        backward,
        micro_batch,
        seq_len,
        hidden,
        heads,
        tensor_parallel,
    } = m.target
    else {
        return None;
    };
    let shape = BlockShape {
        micro_batch,
        seq_len,
        hidden,
        heads,
        tensor_parallel,
        elem_bytes: m.elem_bytes,
    };
    let (fwd_s, bwd_s) = gpt_block_latency(arch, cache, shape).ok()?;
    Some(if backward { bwd_s } else { fwd_s })
}
