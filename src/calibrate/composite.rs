//! The model's price of measurements that span many operators: a GPT block's forward or
//! backward pass (or a tensor-parallel slice of it) and a whole one-GPU training step, as
//! collect.py timed and profiled them: their latency, their GEMMs' share and their kernels
//! by class and launch, for `validate`'s comparisons and `calibrate`'s fits.

use super::measurements::{ATTENTION_CLASS, GEMM_CLASS};
use super::{BlockShape, Measurement, StepShape, Target};
use crate::arch::ArchConfig;
use crate::cost::CostModel;
use crate::error::InputError;
use crate::model::{evaluate, layer_costs, EvaluateError, PlanOptions};
use crate::placement::{Fixed, RecomputeMode};
use crate::schedule::{Schedule, ScheduleCache, ScheduleProblem};
use crate::workload::{
    Checkpoint, GptSizes, Layer, Op, OpGraph, OpKind, ParamKernels, Precision, VectorOp, Workload,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The training precision of a measurement taken with `elem_bytes`-byte operands.
pub(super) fn measured_precision(elem_bytes: u32) -> Precision {
    if elem_bytes == 4 {
        Precision::Fp32
    } else {
        Precision::Fp16
    }
}

/// Forward and backward latency of one device's share of a GPT block on `arch`, without the
/// tensor-parallel collectives (what one GPU times of a slice).
pub fn gpt_block_latency(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    block: BlockShape,
    precision: Precision,
) -> Result<(f64, f64), EvaluateError> {
    let [fwd, bwd] = block_schedules(arch, cache, block, precision)?;
    Ok((fwd.schedule.makespan_s, bwd.schedule.makespan_s))
}

/// The GEMM time (tensor-core operators' spans) of the forward and backward schedules of
/// [`gpt_block_latency`].
pub fn gpt_block_gemm_s(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    block: BlockShape,
    precision: Precision,
) -> Result<(f64, f64), EvaluateError> {
    let [fwd, bwd] = gpt_block_class_s(arch, cache, block, precision)?;
    let gemm_s = |class_s: &BTreeMap<&str, f64>| class_s.get(GEMM_CLASS).copied().unwrap_or(0.0);
    Ok((gemm_s(&fwd), gemm_s(&bwd)))
}

/// The time of the forward and backward schedules of [`gpt_block_latency`] by kernel class
/// ([`model_kernel_class`]): each operator's span, summed per class.
pub fn gpt_block_class_s(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    block: BlockShape,
    precision: Precision,
) -> Result<[BTreeMap<&'static str, f64>; 2], EvaluateError> {
    Ok(block_schedules(arch, cache, block, precision)?.map(|pass| {
        let mut class_s = BTreeMap::new();
        for op in &pass.schedule.ops {
            *class_s.entry(pass.classes[op.op]).or_default() += op.end_s - op.start_s;
        }
        class_s
    }))
}

/// The class of a model operator, as profiled kernels are classed
/// ([`super::profiled_kernel_class`]): `gemm`, a vector primitive's name (the causal softmax
/// counts as softmax), `attention` (a fused kernel), or `collective` (one GPU's profile has
/// none).
pub fn model_kernel_class(kind: &OpKind) -> &'static str {
    match kind {
        OpKind::Gemm { .. } => GEMM_CLASS,
        OpKind::Vector {
            op: VectorOp::CausalSoftmax,
            ..
        } => VectorOp::Softmax.name(),
        OpKind::Vector { op, .. } => op.name(),
        OpKind::Collective { .. } => "collective",
        OpKind::Attention { .. } => ATTENTION_CLASS,
    }
}

/// One pass of a block as scheduled: the schedule and each operator's kernel class.
struct BlockPass {
    schedule: Arc<Schedule>,
    classes: Vec<&'static str>,
}

/// One device's share of a GPT block as the model builds it for a measured block: its layer
/// signature (the schedule cache's key), and its forward and backward operators without the
/// tensor-parallel collectives (one GPU cannot time them).
pub fn gpt_block_graphs(
    block: BlockShape,
    precision: Precision,
) -> Result<(String, [OpGraph; 2]), EvaluateError> {
    let sizes = GptSizes {
        layers: 1,
        hidden: block.hidden,
        heads: block.heads,
        vocab: 1024,
        seq_len: block.seq_len,
        global_batch: block.micro_batch,
    };
    let workload = Workload::gpt("block", Path::new("measured block"), sizes, precision)?;
    let micro_batch = u32::try_from(block.micro_batch)
        .map_err(|_| InputError::invalid(&workload.source, "batch", "micro-batch too large"))?;
    let graph = workload.layer_graph(block.tensor_parallel, micro_batch, false)?;
    let layer = graph
        .layers
        .iter()
        .find(|l| l.signature.contains("block"))
        .ok_or_else(|| InputError::invalid(&workload.source, "layers", "no transformer block"))?;
    Ok((
        layer.signature.clone(),
        [
            layer.fwd.without_collectives(),
            layer.bwd.without_collectives(),
        ],
    ))
}

/// The forward and backward schedules of [`gpt_block_graphs`], with their operators' kernel
/// classes.
fn block_schedules(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    block: BlockShape,
    precision: Precision,
) -> Result<[BlockPass; 2], EvaluateError> {
    let (signature, [fwd, bwd]) = gpt_block_graphs(block, precision)?;
    let cost = CostModel::new(arch);
    let schedule = |pass: &str, graph: &OpGraph| -> Result<_, EvaluateError> {
        let problem = ScheduleProblem::from_op_graph(graph, &cost);
        let key = format!("{signature}|compute only|{pass}");
        let schedule = cache.get_or_compute(&key, cost.hardware_key(), &problem)?;
        let classes = graph
            .ops
            .iter()
            .map(|op| model_kernel_class(&op.kind))
            .collect();
        Ok(BlockPass { schedule, classes })
    };
    Ok([schedule("fwd", &fwd)?, schedule("bwd", &bwd)?])
}

/// HBM assumed for a measured training step (1 EiB): any that ran fits.
const MEASURED_STEP_HBM_BYTES: u64 = 1 << 60;

/// The predicted time of one training iteration of a GPT on one device (a measured
/// [`Target::Step`]): its single micro-batch's forward and backward, then the optimizer step,
/// planned with t = p = d = 1.
pub fn gpt_step_latency(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    step: StepShape,
    precision: Precision,
) -> Result<f64, EvaluateError> {
    let (workload, micro_batch) = measured_step_workload(step, precision)?;
    let options = PlanOptions {
        micro_batches: vec![micro_batch],
        recompute: vec![step.recompute],
        fixed: Fixed {
            tp: Some(1),
            pp: Some(1),
            dp: Some(1),
            virtual_stages: None,
            ep: None,
        },
        // The step ran, so it fit; the model's time does not depend on the capacity.
        hbm_bytes: Some(MEASURED_STEP_HBM_BYTES),
        ..PlanOptions::searching(1)
    };
    Ok(evaluate(&workload, arch, &options, cache)?
        .plan
        .time_per_batch_s)
}

/// collect.py's training step as a workload, and its micro-batch.
fn measured_step_workload(
    step: StepShape,
    precision: Precision,
) -> Result<(Workload, u32), InputError> {
    let sizes = step.sizes;
    let workload = Workload {
        // collect.py's step neither scales the loss nor clips the gradients, and copies the
        // gradients to the fp32 main weights and the weights back tensor by tensor.
        loss_scaling: false,
        gradient_clipping: false,
        param_kernels: ParamKernels::PerTensor,
        // collect.py checkpoints each block with `use_reentrant=False`.
        checkpoint: Checkpoint::StopEarly,
        ..Workload::gpt("step", Path::new("measured step"), sizes, precision)?
    };
    let micro_batch = u32::try_from(sizes.global_batch)
        .map_err(|_| InputError::invalid(&workload.source, "batch", "micro-batch too large"))?;
    Ok((workload, micro_batch))
}

/// The predicted time of a measured training step's GEMMs (the tensor-core operators of its
/// layers' schedules: every forward, the forwards full recompute reruns, every backward), to
/// set beside its profiled GEMM kernels; `None` under selective recompute, whose rerun
/// attention core is priced outside the schedules.
pub fn gpt_step_gemm_s(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    step: StepShape,
    precision: Precision,
) -> Result<Option<f64>, EvaluateError> {
    Ok(gpt_step_class_s(arch, cache, step, precision)?
        .map(|class_s| class_s.get(GEMM_CLASS).copied().unwrap_or(0.0)))
}

/// How many times a measured step of `workload` runs each operator of a layer's forward:
/// twice where full recompute reruns it (all but the trailing operators its checkpoint skips,
/// [`Checkpoint::skipped_ops`]); `None` under selective recompute, whose rerun attention core
/// no layer's graph holds.
fn step_forward_runs(
    recompute: RecomputeMode,
    workload: &Workload,
) -> Option<impl Fn(&Layer) -> Vec<f64> + '_> {
    let rerun = match recompute {
        RecomputeMode::Selective => return None,
        RecomputeMode::None => false,
        RecomputeMode::Full => true,
    };
    Some(move |layer: &Layer| {
        let ops = layer.fwd.ops.len();
        let rerun_ops = if rerun && layer.activation_bytes.recomputed_under_full() {
            ops - workload.checkpoint.skipped_ops(&layer.fwd)
        } else {
            0
        };
        (0..ops)
            .map(|i| if i < rerun_ops { 2.0 } else { 1.0 })
            .collect()
    })
}

/// The GPU time of a measured training step by kernel class ([`model_kernel_class`]): each
/// operator's span in its layer's schedules (every forward, the forwards full recompute reruns,
/// every backward) and the optimizer step's kernels, without the launch gaps; `None` under
/// selective recompute, whose rerun attention core is priced outside the schedules.
pub fn gpt_step_class_s(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    step: StepShape,
    precision: Precision,
) -> Result<Option<BTreeMap<&'static str, f64>>, EvaluateError> {
    let (workload, micro_batch) = measured_step_workload(step, precision)?;
    let Some(forward_runs) = step_forward_runs(step.recompute, &workload) else {
        return Ok(None);
    };
    let cost = CostModel::new(arch);
    let costs = layer_costs(&workload, &cost, cache, 1, micro_batch, false)?;
    let graph = workload.layer_graph(1, micro_batch, false)?;
    let mut class_s: BTreeMap<&'static str, f64> = BTreeMap::new();
    for unique in &costs.unique {
        let layer = graph
            .layers
            .iter()
            .find(|l| l.name == unique.name)
            .ok_or_else(|| InputError::invalid(&workload.source, "layers", "layer not in graph"))?;
        let count = unique.count as f64;
        let fwd_runs = forward_runs(layer);
        let bwd_runs = vec![1.0; layer.bwd.ops.len()];
        for (schedule, ops, runs) in [
            (&unique.fwd, &layer.fwd, &fwd_runs),
            (&unique.bwd, &layer.bwd, &bwd_runs),
        ] {
            for op in &schedule.ops {
                *class_s
                    .entry(model_kernel_class(&ops.ops[op.op].kind))
                    .or_default() += count * runs[op.op] * (op.end_s - op.start_s);
            }
        }
        for op in workload.optimizer_step_ops(&layer.param_tensors) {
            let c = cost.op_cost(&op);
            *class_s.entry(model_kernel_class(&op.kind)).or_default() +=
                count * c.all_cores_s.min(c.one_core_s);
        }
    }
    Ok(Some(class_s))
}

/// The model's kernel launches by class ([`model_kernel_class`]) of a measured block pass or
/// training step, to set beside the kernels its profile counts: a block pass's operators
/// ([`gpt_block_graphs`]); a step's every forward, the forwards full recompute reruns, every
/// backward and the optimizer step's kernels (`gpt_step_class_s`'s operators), each
/// [`Op::launches`](crate::workload::Op::launches) times. `None` for other measurements, a
/// step under selective recompute, or a shape that cannot be built.
pub fn measured_class_launches(m: &Measurement) -> Option<BTreeMap<&'static str, f64>> {
    let precision = measured_precision(m.elem_bytes);
    let mut launches: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut add = |ops: &[Op], runs: Option<&[f64]>| {
        for (i, op) in ops.iter().enumerate() {
            *launches.entry(model_kernel_class(&op.kind)).or_default() +=
                runs.map_or(1.0, |r| r[i]) * op.launches();
        }
    };
    match m.target {
        Target::Block { backward, shape } => {
            let (_, [fwd, bwd]) = gpt_block_graphs(shape, precision).ok()?;
            add(if backward { &bwd.ops } else { &fwd.ops }, None);
        }
        Target::Step(step) => {
            let (workload, micro_batch) = measured_step_workload(step, precision).ok()?;
            let forward_runs = step_forward_runs(step.recompute, &workload)?;
            let graph = workload.layer_graph(1, micro_batch, false).ok()?;
            for layer in &graph.layers {
                add(&layer.fwd.ops, Some(&forward_runs(layer)));
                add(&layer.bwd.ops, None);
                add(&workload.optimizer_step_ops(&layer.param_tensors), None);
            }
        }
        _ => return None,
    }
    Some(launches)
}

/// The model's GEMM time of a measured block pass ([`gpt_block_gemm_s`]) or training step
/// ([`gpt_step_gemm_s`]): the GEMM class of [`measured_class_s`]; `None` for other
/// measurements, a step under selective recompute, or a shape that cannot be planned.
pub fn measured_gemm_s(arch: &ArchConfig, cache: &ScheduleCache, m: &Measurement) -> Option<f64> {
    measured_class_s(arch, cache, m).map(|class_s| class_s.get(GEMM_CLASS).copied().unwrap_or(0.0))
}

/// The model's time by kernel class of a measured block pass ([`gpt_block_class_s`]) or
/// training step (`gpt_step_class_s`); `None` for other measurements, a step under
/// selective recompute, or a shape that cannot be planned.
pub fn measured_class_s(
    arch: &ArchConfig,
    cache: &ScheduleCache,
    m: &Measurement,
) -> Option<BTreeMap<&'static str, f64>> {
    let precision = measured_precision(m.elem_bytes);
    match m.target {
        Target::Block { backward, shape } => {
            let [fwd, bwd] = gpt_block_class_s(arch, cache, shape, precision).ok()?;
            Some(if backward { bwd } else { fwd })
        }
        Target::Step(step) => gpt_step_class_s(arch, cache, step, precision)
            .ok()
            .flatten(),
        _ => None,
    }
}

/// The predicted latency of a measurement that spans many operators: a GPT block's forward
/// or backward schedule, or a whole training step; `None` for a single operator or a shape
/// that cannot be planned.
pub fn composite_latency(arch: &ArchConfig, cache: &ScheduleCache, m: &Measurement) -> Option<f64> {
    let precision = measured_precision(m.elem_bytes);
    match m.target {
        Target::Op(_)
        | Target::ForwardBackward(_)
        | Target::Eager { .. }
        | Target::InBlock(_)
        | Target::AfterPrelude { .. }
        | Target::Overlap { .. } => None,
        Target::Block { backward, shape } => {
            let (fwd_s, bwd_s) = gpt_block_latency(arch, cache, shape, precision).ok()?;
            Some(if backward { bwd_s } else { fwd_s })
        }
        Target::Step(step) => gpt_step_latency(arch, cache, step, precision).ok(),
    }
}
