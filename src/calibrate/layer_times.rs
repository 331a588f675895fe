//! Single transformer layers: a publication's measured forward and backward time of one GPT
//! block against the model's, as Megatron-LM runs it (`data/reference/
//! korthikanti2022_layer_times.csv`: Korthikanti et al. 2022, Table 4). Where an end-to-end
//! run's iteration is a whole number of such layers and something else (no pipeline), the
//! pair splits its error into the layers' and the rest's.

use super::runs::{megatron_gpt, recompute_mode, RunError};
use crate::arch::ArchConfig;
use crate::cost::CostModel;
use crate::error::InputError;
use crate::model::{layer_costs, EvaluateError};
use crate::placement::RecomputeMode;
use crate::schedule::ScheduleCache;
use crate::workload::{Ddp, GptSizes};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A row of a layer-times CSV.
#[derive(Debug, Clone, Deserialize)]
struct PublishedLayerTime {
    source: String,
    model: String,
    hidden: u64,
    heads: u64,
    seq: u64,
    vocab: u64,
    tp: u32,
    micro_batch: u32,
    recompute: String,
    sequence_parallel: bool,
    /// The column-parallel linears' input-gradient collective issued asynchronously beside
    /// their weight gradient (`BlockShape::tp_grad_overlap`).
    tp_grad_overlap: bool,
    measured_forward_ms: f64,
    measured_backward_ms: f64,
}

/// Predicted against measured time of one layer's forward and backward.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerTimeError {
    /// The layer-times file and row.
    pub source: String,
    /// The CSV's `source` column: the publication and table the time comes from.
    pub publication: String,
    pub model: String,
    pub tp: u32,
    pub micro_batch: u32,
    pub recompute: RecomputeMode,
    pub sequence_parallel: bool,
    pub tp_grad_overlap: bool,
    pub measured_forward_s: f64,
    pub predicted_forward_s: f64,
    pub measured_backward_s: f64,
    /// The backward pass, what it reruns of the forward (`recompute`) and the per-tensor
    /// gradient adds Megatron-LM's hooks make as each weight gradient is ready.
    pub predicted_backward_s: f64,
    /// Of `predicted_backward_s`: the rerun forward (full: the layer's; selective: its
    /// attention core).
    pub predicted_recompute_s: f64,
    /// Of `predicted_backward_s`: the gradient adds (`main_grad.add_`).
    pub predicted_grad_accumulation_s: f64,
    /// (predicted − measured) / measured, by time: negative where the model is fast.
    pub forward_error: f64,
    pub backward_error: f64,
    /// Of forward and backward together.
    pub layer_error: f64,
}

impl LayerTimeError {
    pub fn measured_layer_s(&self) -> f64 {
        self.measured_forward_s + self.measured_backward_s
    }

    pub fn predicted_layer_s(&self) -> f64 {
        self.predicted_forward_s + self.predicted_backward_s
    }
}

/// Every row of `csv` (columns `source, model, hidden, heads, seq, vocab, tp, micro_batch,
/// recompute, sequence_parallel, tp_grad_overlap, measured_forward_ms, measured_backward_ms`;
/// `#` starts a comment line) priced on `arch`: one GPT block of the row's sizes, built as
/// Megatron-LM's fp16 runs build it, scheduled at its tensor-parallel width and micro-batch.
pub fn validate_layer_times(
    csv: &Path,
    arch: &ArchConfig,
    cache: &ScheduleCache,
) -> Result<Vec<LayerTimeError>, EvaluateError> {
    let text = crate::error::read_input(csv)?;
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    let rows = reader
        .deserialize::<PublishedLayerTime>()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| InputError::malformed(csv, "CSV", e.to_string()))?;
    let cost = CostModel::new(arch);
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.into_iter().enumerate() {
        let n = i + 1;
        let recompute = recompute_mode(csv, n, &row.recompute)?;
        for (field, value) in [
            ("measured_forward_ms", row.measured_forward_ms),
            ("measured_backward_ms", row.measured_backward_ms),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(InputError::invalid(
                    csv,
                    format!("row {n}, {field}"),
                    format!("{value} is not a positive time"),
                )
                .into());
            }
        }
        for (field, value) in [("tp", row.tp), ("micro_batch", row.micro_batch)] {
            if value == 0 {
                return Err(InputError::invalid(
                    csv,
                    format!("row {n}, {field}"),
                    "must be at least 1",
                )
                .into());
            }
        }
        let sizes = GptSizes {
            layers: 1,
            hidden: row.hidden,
            heads: row.heads,
            vocab: row.vocab,
            seq_len: row.seq,
            global_batch: u64::from(row.micro_batch),
        };
        // The wrapper's once-per-iteration work is not the layer's: no `ddp`.
        let workload = megatron_gpt(&row.model, csv, sizes, row.tp_grad_overlap, Ddp::None)
            .map_err(|e| super::in_row(n, e))?;
        let costs = layer_costs(
            &workload,
            &cost,
            cache,
            row.tp,
            row.micro_batch,
            row.sequence_parallel,
        )
        .map_err(|e| match e {
            EvaluateError::Input(e) => EvaluateError::Input(super::in_row(n, e)),
            other => other,
        })?;
        // A GPT template names its blocks `block0` onwards.
        let block = costs
            .graph
            .layers
            .iter()
            .find(|l| l.name == "block0")
            .ok_or_else(|| {
                InputError::invalid(csv, format!("row {n}, model"), "builds no GPT block")
            })?;
        let rerun_s = block.recompute_s(recompute);
        let predicted_backward_s = block.bwd_s + rerun_s + block.grad_accumulation_s;
        let measured_forward_s = row.measured_forward_ms * 1e-3;
        let measured_backward_s = row.measured_backward_ms * 1e-3;
        let error = |predicted: f64, measured: f64| (predicted - measured) / measured;
        out.push(LayerTimeError {
            source: format!("{}:{n}", csv.display()),
            publication: row.source,
            model: row.model,
            tp: row.tp,
            micro_batch: row.micro_batch,
            recompute,
            sequence_parallel: row.sequence_parallel,
            tp_grad_overlap: row.tp_grad_overlap,
            measured_forward_s,
            predicted_forward_s: block.fwd_s,
            measured_backward_s,
            predicted_backward_s,
            predicted_recompute_s: rerun_s,
            predicted_grad_accumulation_s: block.grad_accumulation_s,
            forward_error: error(block.fwd_s, measured_forward_s),
            backward_error: error(predicted_backward_s, measured_backward_s),
            layer_error: error(
                block.fwd_s + predicted_backward_s,
                measured_forward_s + measured_backward_s,
            ),
        });
    }
    Ok(out)
}

/// An end-to-end run without a pipeline whose layers a layer-times row measured (same model,
/// tensor-parallel width, micro-batch, recompute, sequence parallelism and input-gradient
/// overlap): its iteration split into the layers (blocks × micro-batches × one layer's
/// forward and backward) and the rest (embedding, head, optimizer step, the wrapper's
/// gradient work), measured and predicted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IterationSplit {
    /// The runs file and row, and the layer-times file and row.
    pub run_source: String,
    pub layer_source: String,
    pub model: String,
    pub recompute: RecomputeMode,
    pub sequence_parallel: bool,
    pub measured_iteration_s: f64,
    pub predicted_iteration_s: f64,
    pub measured_layers_s: f64,
    pub predicted_layers_s: f64,
    pub measured_rest_s: f64,
    pub predicted_rest_s: f64,
}

impl IterationSplit {
    /// The layers' and the rest's parts of the iteration's time error, each over the measured
    /// iteration: they add up to (predicted − measured) / measured.
    pub fn error_parts(&self) -> (f64, f64) {
        (
            (self.predicted_layers_s - self.measured_layers_s) / self.measured_iteration_s,
            (self.predicted_rest_s - self.measured_rest_s) / self.measured_iteration_s,
        )
    }
}

/// Every run of `runs` with one pipeline stage and a matching row of `layers`, split.
pub fn split_iterations(runs: &[RunError], layers: &[LayerTimeError]) -> Vec<IterationSplit> {
    runs.iter()
        .filter(|run| run.pp == 1)
        .filter_map(|run| {
            let layer = layers.iter().find(|l| {
                l.model == run.model
                    && l.tp == run.tp
                    && l.micro_batch == run.micro_batch
                    && l.recompute == run.recompute
                    && l.sequence_parallel == run.sequence_parallel
                    && l.tp_grad_overlap == run.tp_grad_overlap
            })?;
            let passes = run.layers as f64 * run.micro_batches_per_pipeline as f64;
            let measured_layers_s = passes * layer.measured_layer_s();
            let predicted_layers_s = passes * layer.predicted_layer_s();
            Some(IterationSplit {
                run_source: run.source.clone(),
                layer_source: layer.source.clone(),
                model: run.model.clone(),
                recompute: run.recompute,
                sequence_parallel: run.sequence_parallel,
                measured_iteration_s: run.measured_time_per_batch_s,
                predicted_iteration_s: run.time_per_batch_s,
                measured_layers_s,
                predicted_layers_s,
                measured_rest_s: run.measured_time_per_batch_s - measured_layers_s,
                predicted_rest_s: run.time_per_batch_s - predicted_layers_s,
            })
        })
        .collect()
}
