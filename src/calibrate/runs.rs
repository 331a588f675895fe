//! End-to-end validation: published training runs re-planned with their (t, p, d) held fixed
//! (and, from a run-plans file, their micro-batch, gradient all-reduce overlap, pipeline
//! schedule, input-gradient overlap and data-parallel wrapper), predicted from chip facts and
//! kernel calibration only; and the GPT those runs trained, as Megatron-LM builds it.

use super::in_row;
use crate::arch::ArchConfig;
use crate::error::InputError;
use crate::model::{evaluate, EvaluateError, PlanOptions};
use crate::placement::{Fixed, PipelineSchedule, RecomputeMode};
use crate::schedule::ScheduleCache;
use crate::workload::{
    AttentionSoftmax, CrossEntropyKernels, Ddp, GptSizes, Model, ParamKernels, Precision, QkvBias,
    Workload,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A row of a published-runs CSV (`data/reference/published_runs.csv`,
/// `data/reference/korthikanti2022_runs.csv`).
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
    /// Megatron-LM's `--sequence-parallel` (optional column; absent: false).
    #[serde(default)]
    sequence_parallel: bool,
    /// What the publication measured: TFLOP/s per GPU as it counts FLOPs, or the iteration
    /// time in seconds (one of the two columns per row).
    #[serde(default)]
    measured_tflops_per_gpu: Option<f64>,
    #[serde(default)]
    measured_iteration_s: Option<f64>,
}

/// Predicted against measured throughput of one published run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunError {
    /// The runs file and row.
    pub source: String,
    /// The CSV's `source` column: the publication and table the run comes from.
    pub publication: String,
    pub model: String,
    pub gpus: u32,
    pub tp: u32,
    pub pp: u32,
    pub dp: u32,
    /// Transformer blocks of the model.
    pub layers: u64,
    pub recompute: RecomputeMode,
    pub sequence_parallel: bool,
    /// The run's micro-batch: held from the run-plans file, or the one the search chose.
    pub micro_batch: u32,
    /// Whether `micro_batch` came from the run-plans file (else it was searched).
    pub micro_batch_held: bool,
    /// Micro-batches each pipeline runs per iteration.
    pub micro_batches_per_pipeline: u64,
    /// Whether the gradient all-reduce overlapped the last micro-batch's backward pass.
    pub dp_overlap: bool,
    /// The pipeline schedule the run used (from the run-plans file; 1F1B otherwise) and its
    /// model chunks per stage.
    pub schedule: PipelineSchedule,
    pub virtual_stages: u32,
    /// Whether the column-parallel linears' input-gradient collective overlapped their weight
    /// gradient (from the run-plans file; false otherwise).
    pub tp_grad_overlap: bool,
    /// The data-parallel wrapper whose per-iteration gradient work is priced (from the
    /// run-plans file; none otherwise).
    pub ddp: Ddp,
    /// The measured throughput, or the publication's FLOPs per iteration
    /// ([`megatron_flops_per_iteration`]) over the measured iteration time where it gave that.
    pub measured_tflops_per_gpu: f64,
    /// Those FLOPs over the predicted iteration time, per GPU: predicted / measured is
    /// measured / predicted time.
    pub predicted_tflops_per_gpu: f64,
    /// The measured iteration time, or the one the publication's FLOP count implies.
    pub measured_time_per_batch_s: f64,
    pub time_per_batch_s: f64,
    /// Where the predicted time goes (they add up to `time_per_batch_s`): the bottleneck
    /// stage's compute, pipeline fill and drain, pipeline sends, the exposed gradient
    /// all-reduce and the optimizer step.
    pub compute_s: f64,
    pub bubble_s: f64,
    pub pp_comm_s: f64,
    pub dp_comm_s: f64,
    pub optimizer_s: f64,
    /// Of `optimizer_s`, the data-parallel wrapper's work on the gradients (`ddp`).
    pub grad_buffer_s: f64,
    /// The slowest stage's whole gradient all-reduce, hidden or not.
    pub dp_sync_s: f64,
    /// The most of it a stage's last backward hides (`dp_overlap`; 0 without): `dp_comm_s`
    /// holds the rest and the exposed all-reduces of replicated and tied parameters.
    pub dp_hidden_s: f64,
    /// (predicted − measured) / measured.
    pub signed_error: f64,
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

/// What a run's publication leaves out of its plan: one row of a run-plans file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RunPlan {
    /// Samples per micro-batch (Megatron-LM's `--micro-batch-size`).
    micro_batch: u32,
    /// Gradient all-reduce overlapped with the last micro-batch's backward pass (PyTorch DDP,
    /// `--DDP-impl torch`) or run after it (`--DDP-impl local`).
    dp_overlap: bool,
    /// Megatron-LM's pipeline schedule: interleaved with `v` model chunks per stage where the
    /// run gave `--num-layers-per-virtual-pipeline-stage`, else 1F1B.
    schedule: PipelineSchedule,
    virtual_stages: Option<u32>,
    /// The column-parallel linears' input-gradient collective overlapped with their weight
    /// gradient ([`crate::workload::BlockShape::tp_grad_overlap`]; Megatron-LM from September
    /// 2021).
    tp_grad_overlap: bool,
    /// The data-parallel wrapper (`--DDP-impl torch` or `local`) and so its per-iteration
    /// work on the gradients ([`Ddp`]).
    ddp: Ddp,
}

/// Run plans by model name, read from CSVs of `model,micro_batch,dp_overlap` and optionally
/// `schedule` (`1f1b` or `interleaved`), `virtual_stages`, `tp_grad_overlap` and `ddp`
/// (`none`, `torch` or `megatron`) (`#` starts a comment line, for the plans' provenance);
/// each plan with the file it came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunPlans {
    by_model: BTreeMap<String, (PathBuf, RunPlan)>,
}

#[derive(Deserialize)]
struct RunPlanRow {
    model: String,
    micro_batch: u32,
    dp_overlap: bool,
    #[serde(default)]
    schedule: Option<PipelineSchedule>,
    #[serde(default)]
    virtual_stages: Option<u32>,
    #[serde(default)]
    tp_grad_overlap: bool,
    #[serde(default)]
    ddp: Ddp,
}

impl RunPlans {
    /// Reads a run-plans file; every model at most once, every micro-batch positive.
    pub fn load(file: &Path) -> Result<RunPlans, InputError> {
        let text = crate::error::read_input(file)?;
        let mut reader = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .comment(Some(b'#'))
            .from_reader(text.as_bytes());
        let mut by_model = BTreeMap::new();
        for (i, record) in reader.deserialize::<RunPlanRow>().enumerate() {
            let row = i + 1;
            let plan = record.map_err(|e| InputError::malformed(file, "CSV", e.to_string()))?;
            if plan.micro_batch == 0 {
                return Err(InputError::invalid(
                    file,
                    format!("row {row}, micro_batch"),
                    "must be a positive number of samples",
                ));
            }
            let schedule = plan.schedule.unwrap_or_default();
            match (schedule, plan.virtual_stages) {
                (PipelineSchedule::Interleaved, Some(v)) if v >= 2 => {}
                (PipelineSchedule::Interleaved, _) => {
                    return Err(InputError::invalid(
                        file,
                        format!("row {row}, virtual_stages"),
                        "the interleaved schedule needs at least 2 model chunks per stage",
                    ))
                }
                (_, Some(v)) => {
                    return Err(InputError::invalid(
                        file,
                        format!("row {row}, virtual_stages"),
                        format!("{v} chunks per stage need the interleaved schedule"),
                    ))
                }
                (_, None) => {}
            }
            let held = RunPlan {
                micro_batch: plan.micro_batch,
                dp_overlap: plan.dp_overlap,
                schedule,
                virtual_stages: plan.virtual_stages,
                tp_grad_overlap: plan.tp_grad_overlap,
                ddp: plan.ddp,
            };
            if by_model
                .insert(plan.model.clone(), (file.to_path_buf(), held))
                .is_some()
            {
                return Err(InputError::invalid(
                    file,
                    format!("row {row}, model"),
                    format!("`{}` is listed twice", plan.model),
                ));
            }
        }
        Ok(RunPlans { by_model })
    }

    /// Reads several run-plans files into one; a model listed in two of them is refused.
    pub fn load_all(files: &[PathBuf]) -> Result<RunPlans, InputError> {
        let mut all = RunPlans::default();
        for file in files {
            for (model, held) in RunPlans::load(file)?.by_model {
                if let Some((first, _)) = all.by_model.get(&model) {
                    return Err(InputError::invalid(
                        file,
                        "model",
                        format!("`{model}` is also listed in {}", first.display()),
                    ));
                }
                all.by_model.insert(model, held);
            }
        }
        Ok(all)
    }
}

/// A GPT as Megatron-LM's fp16 runs (the code of 2021 and of mid-2022 alike) run it: fp16
/// weights and activations, Adam with fp32 master weights, its fused causal softmax
/// (`--masked-softmax-fusion`, on by default, for score rows of up to 2048) and its
/// vocabulary-parallel loss, a kernel per step over the fp32 logits; the QKV bias added by a
/// kernel of its own (2021: PyTorch's `linear` on a 3-D input, `matmul` then `add_`; 2022:
/// Megatron-LM's own linear function, `output + bias`). A kernel per gradient accumulation
/// (`--gradient-accumulation-fusion` came in 2022 and stayed off in fp16 without
/// `--accumulate-allreduce-grads-in-fp32` until September 2022): the gradients are accumulated
/// (PyTorch's `AccumulateGrad`, or with `--DDP-impl local` a hook's `main_grad.add_`) and cast
/// up to the fp32 main copy (`_copy_model_grads_to_main_grads`) one parameter at a time; the
/// weights are copied back by a multi-tensor kernel (`_copy_main_params_to_model_params`).
pub(super) fn megatron_gpt(
    name: &str,
    file: &Path,
    sizes: GptSizes,
    tp_grad_overlap: bool,
    ddp: Ddp,
) -> Result<Workload, InputError> {
    let mut workload = Workload {
        gradient_accumulation_fusion: false,
        param_kernels: ParamKernels::PerTensorGrads,
        ddp,
        ..Workload::gpt(name, file, sizes, Precision::Fp16)?
    };
    if let Model::Template(template) = &mut workload.model {
        template.block.softmax = AttentionSoftmax::FusedCausal;
        template.block.cross_entropy = CrossEntropyKernels::VocabParallel;
        template.block.qkv_bias = QkvBias::AddKernel;
        template.block.tp_grad_overlap = tp_grad_overlap;
    }
    Ok(workload)
}

pub(super) fn recompute_mode(
    file: &Path,
    row: usize,
    text: &str,
) -> Result<RecomputeMode, InputError> {
    text.parse().map_err(|_| {
        InputError::invalid(
            file,
            format!("row {row}, recompute"),
            format!("`{text}` is not one of none, selective, full"),
        )
    })
}

/// Every run of the `runs_csvs` planned on `arch` with its (t, p, d), recompute mode and
/// sequence parallelism held, and its micro-batch, gradient all-reduce overlap, pipeline
/// schedule and input-gradient collective overlap held from `plans` where listed (else the
/// micro-batch is searched, the all-reduce overlapped, the best the model finds, and the
/// tensor-parallel collectives block); predicted TFLOP/s per GPU against the measured ones,
/// file by file and row by row. Every model `plans` lists must have a run.
pub fn validate_runs(
    runs_csvs: &[&Path],
    plans: &RunPlans,
    arch: &ArchConfig,
    cache: &ScheduleCache,
) -> Result<Vec<RunError>, EvaluateError> {
    let mut files = Vec::with_capacity(runs_csvs.len());
    for &runs_csv in runs_csvs {
        let text = crate::error::read_input(runs_csv)?;
        let mut reader = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let runs = reader
            .deserialize::<PublishedRun>()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| InputError::malformed(runs_csv, "CSV", e.to_string()))?;
        files.push((runs_csv, runs));
    }
    if let Some((unmatched, (file, _))) = plans.by_model.iter().find(|(model, _)| {
        !files
            .iter()
            .any(|(_, runs)| runs.iter().any(|run| &&run.model == model))
    }) {
        let names: Vec<String> = runs_csvs.iter().map(|f| f.display().to_string()).collect();
        return Err(InputError::invalid(
            file,
            "model",
            format!("`{unmatched}` is no run of {}", names.join(", ")),
        )
        .into());
    }
    let mut out = Vec::new();
    for (runs_csv, runs) in files {
        out.extend(validate_file_runs(runs_csv, runs, plans, arch, cache)?);
    }
    Ok(out)
}

/// The runs of one file, in its order.
fn validate_file_runs(
    runs_csv: &Path,
    runs: Vec<PublishedRun>,
    plans: &RunPlans,
    arch: &ArchConfig,
    cache: &ScheduleCache,
) -> Result<Vec<RunError>, EvaluateError> {
    let mut out = Vec::with_capacity(runs.len());
    for (i, run) in runs.into_iter().enumerate() {
        let row = i + 1;
        let recompute = recompute_mode(runs_csv, row, &run.recompute)?;
        let (measured, field, value) = match (run.measured_tflops_per_gpu, run.measured_iteration_s)
        {
            (Some(v), None) => (Measured::TflopsPerGpu(v), "measured_tflops_per_gpu", v),
            (None, Some(v)) => (Measured::IterationS(v), "measured_iteration_s", v),
            (both, _) => {
                return Err(InputError::invalid(
                    runs_csv,
                    format!("row {row}, measured_tflops_per_gpu / measured_iteration_s"),
                    if both.is_some() {
                        "give one of the two, not both"
                    } else {
                        "one of the two is needed"
                    },
                )
                .into())
            }
        };
        if !(value.is_finite() && value > 0.0) {
            return Err(InputError::invalid(
                runs_csv,
                format!("row {row}, {field}"),
                format!("{value} is not a positive number"),
            )
            .into());
        }
        if run.gpus == 0 {
            return Err(InputError::invalid(
                runs_csv,
                format!("row {row}, gpus"),
                "must be at least 1",
            )
            .into());
        }
        if u64::from(run.tp) * u64::from(run.pp) * u64::from(run.dp) != u64::from(run.gpus) {
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
        let sizes = GptSizes {
            layers: run.layers,
            hidden: run.hidden,
            heads: run.heads,
            vocab: run.vocab,
            seq_len: run.seq,
            global_batch: run.global_batch,
        };
        let held = plans.by_model.get(&run.model).map(|(_, plan)| *plan);
        let tp_grad_overlap = held.is_some_and(|p| p.tp_grad_overlap);
        let ddp = held.map_or(Ddp::None, |p| p.ddp);
        let workload = megatron_gpt(&run.model, runs_csv, sizes, tp_grad_overlap, ddp)
            .map_err(|e| in_row(row, e))?;
        let options = PlanOptions {
            micro_batches: held.map_or(vec![1, 2, 4, 8, 16], |p| vec![p.micro_batch]),
            recompute: vec![recompute],
            fixed: Fixed {
                tp: Some(run.tp),
                pp: Some(run.pp),
                dp: Some(run.dp),
                virtual_stages: held.and_then(|p| p.virtual_stages),
                ep: None,
            },
            schedule: held.map_or(PipelineSchedule::OneFOneB, |p| p.schedule),
            dp_overlap: held.is_none_or(|p| p.dp_overlap),
            sequence_parallel: run.sequence_parallel,
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
        let gpus = f64::from(run.gpus);
        let predicted = flops / (e.plan.time_per_batch_s * gpus) / 1e12;
        let (measured_tflops_per_gpu, measured_time_per_batch_s) = match measured {
            Measured::TflopsPerGpu(tflops) => (tflops, flops / (tflops * 1e12 * gpus)),
            Measured::IterationS(seconds) => (flops / (seconds * gpus) / 1e12, seconds),
        };
        let split = e.plan.time_split;
        out.push(RunError {
            source: format!("{}:{row}", runs_csv.display()),
            publication: run.source,
            model: run.model,
            gpus: run.gpus,
            tp: run.tp,
            pp: run.pp,
            dp: run.dp,
            layers: run.layers,
            recompute,
            sequence_parallel: run.sequence_parallel,
            micro_batch: e.plan.micro_batch,
            micro_batch_held: held.is_some(),
            micro_batches_per_pipeline: e.plan.micro_batches_per_pipeline,
            dp_overlap: options.dp_overlap,
            schedule: e.plan.schedule,
            virtual_stages: e.plan.virtual_stages,
            tp_grad_overlap,
            ddp,
            measured_tflops_per_gpu,
            predicted_tflops_per_gpu: predicted,
            measured_time_per_batch_s,
            time_per_batch_s: e.plan.time_per_batch_s,
            compute_s: split.compute_s,
            bubble_s: split.bubble_s,
            pp_comm_s: split.pp_comm_s,
            dp_comm_s: split.dp_comm_s,
            optimizer_s: split.optimizer_s,
            grad_buffer_s: split.grad_buffer_s,
            dp_sync_s: e.plan.dp_sync_s(),
            dp_hidden_s: e.plan.dp_hidden_s(),
            signed_error: (predicted - measured_tflops_per_gpu) / measured_tflops_per_gpu,
        });
    }
    Ok(out)
}

/// What a published run measured, as its publication gives it.
#[derive(Debug, Clone, Copy)]
enum Measured {
    TflopsPerGpu(f64),
    IterationS(f64),
}
