//! `tandem plan`: the best data × tensor × pipeline plan of a workload on one chip.

use super::common::{print_plan, ChipArgs, SolverArgs};
use anyhow::{Context, Result};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::arch::load_chip;
use tandem::model::{evaluate, EvaluateError, PlanOptions};
use tandem::placement::{
    simulate_plan, DeviceLayout, Fixed, PipelineSchedule, Plan, RecomputeMode, Simulation,
    ZeroStage,
};
use tandem::schedule::ScheduleCache;
use tandem::search::{append_rows, DesignRow};
use tandem::workload::Workload;

/// Exit status when no plan fits (bad input exits with 1, a command-line usage error with 2).
pub const EXIT_INFEASIBLE: u8 = 3;

/// Find the parallel plan with the lowest time per batch. Every option left out is searched;
/// every one given is held.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workload file: a model template (TOML) or an operator DAG (JSON).
    #[arg(long)]
    workload: PathBuf,
    #[command(flatten)]
    chip: ChipArgs,
    /// Micro-batch sizes to search (samples per pipeline micro-batch), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    micro_batch: Vec<u32>,
    /// Activation recompute modes to search, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Recompute::None, Recompute::Selective, Recompute::Full])]
    recompute: Vec<Recompute>,
    /// Sequence parallelism: reduce-scatter + all-gather instead of all-reduce; norms and
    /// dropout split across the tensor group.
    #[arg(long)]
    seq_parallel: bool,
    /// Hold the tensor-parallel width t.
    #[arg(long)]
    tp: Option<u32>,
    /// Hold the number of pipeline stages p.
    #[arg(long)]
    pp: Option<u32>,
    /// Hold the data-parallel width d (copies of the whole pipeline).
    #[arg(long)]
    dp: Option<u32>,
    /// Largest tensor width searched when --tp is not given.
    #[arg(long, default_value_t = 8)]
    max_tp: u32,
    /// Pipeline schedule: the order each replica runs its forwards and backwards, which sets
    /// the pipeline bubble and the micro-batches a stage holds (docs/pipeline.md).
    #[arg(long, value_enum, default_value_t = Schedule::OneFOneB)]
    schedule: Schedule,
    /// Hold the model chunks per stage of the interleaved schedule (searched otherwise).
    #[arg(long, value_name = "V")]
    virtual_stages: Option<u32>,
    /// Hold the expert-parallel width of a mixture-of-experts model: the data-parallel
    /// pipelines each expert layer's experts are divided over (searched otherwise).
    #[arg(long)]
    ep: Option<u32>,
    /// How devices are numbered: each pipeline on consecutive devices, or each stage's
    /// data-parallel copies on consecutive devices (Megatron-LM's rank order), which decides
    /// the tier data-parallel rings, expert all-to-alls and pipeline sends run on.
    #[arg(long, value_enum, default_value_t = Layout::PipelineMajor)]
    layout: Layout,
    /// Overlap each pipeline send with the computation of the operation that sends it
    /// (Megatron-LM's --overlap-p2p-communication, on by default in its interleaved schedule).
    #[arg(long)]
    overlap_p2p: bool,
    /// ZeRO stages to search, comma-separated: how far data-parallel copies shard the training
    /// state (0 none, 1 optimizer state, 2 and gradients, 3 and weights: FSDP full shard).
    #[arg(long, value_delimiter = ',', default_values_t = ZeroStage::ALL.map(|z| z.number()), value_parser = clap::value_parser!(u8).range(0..=3))]
    zero: Vec<u8>,
    /// Do not overlap the gradient all-reduce with the last backward pass.
    #[arg(long)]
    no_dp_overlap: bool,
    /// Allow d·t not dividing the device count and stages leaving devices idle.
    #[arg(long)]
    allow_idle_devices: bool,
    /// Allow d × micro-batch not dividing the global batch: each pipeline then runs
    /// ⌈global batch / (d × micro-batch)⌉ micro-batches (PHAZE's convention).
    #[arg(long)]
    allow_uneven_batch: bool,
    /// Also run the plan's schedule in the discrete-event simulator and print its time next
    /// to the closed form the search optimises.
    #[arg(long)]
    simulate: bool,
    #[command(flatten)]
    solver: SolverArgs,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Append the design point as one CSV row (the columns of docs/design.md §9) to this file.
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Recompute {
    None,
    Selective,
    Full,
}

impl From<Recompute> for RecomputeMode {
    fn from(r: Recompute) -> Self {
        match r {
            Recompute::None => RecomputeMode::None,
            Recompute::Selective => RecomputeMode::Selective,
            Recompute::Full => RecomputeMode::Full,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Schedule {
    #[value(name = "1f1b")]
    OneFOneB,
    #[value(name = "gpipe")]
    GPipe,
    #[value(name = "interleaved")]
    Interleaved,
}

impl From<Schedule> for PipelineSchedule {
    fn from(s: Schedule) -> Self {
        match s {
            Schedule::OneFOneB => PipelineSchedule::OneFOneB,
            Schedule::GPipe => PipelineSchedule::GPipe,
            Schedule::Interleaved => PipelineSchedule::Interleaved,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    PipelineMajor,
    StageMajor,
}

impl From<Layout> for DeviceLayout {
    fn from(l: Layout) -> Self {
        match l {
            Layout::PipelineMajor => DeviceLayout::PipelineMajor,
            Layout::StageMajor => DeviceLayout::StageMajor,
        }
    }
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let workload = Workload::load(&args.workload)?;
    if args.ep.is_some_and(|e| e > 1) && !workload.has_experts() {
        anyhow::bail!(
            "--ep {}: {} ({}) has no expert layers to divide (expert parallelism needs a [moe] \
             table)",
            args.ep.unwrap_or(1),
            workload.name,
            args.workload.display()
        );
    }
    let arch = load_chip(&args.chip.arch)?;
    let options = PlanOptions {
        devices: args.chip.devices()?,
        hbm_bytes: args.chip.hbm_bytes()?,
        micro_batches: positive("--micro-batch", &args.micro_batch)?,
        recompute: args.recompute.iter().map(|&r| r.into()).collect(),
        sequence_parallel: args.seq_parallel,
        schedule: args.schedule.into(),
        fixed: Fixed {
            tp: held("--tp", args.tp)?,
            pp: held("--pp", args.pp)?,
            dp: held("--dp", args.dp)?,
            virtual_stages: held("--virtual-stages", args.virtual_stages)?,
            ep: held("--ep", args.ep)?,
        },
        max_tp: args.max_tp.max(1),
        only_widths: None,
        zero: zero_stages(&args.zero),
        layout: args.layout.into(),
        p2p_overlap: args.overlap_p2p,
        dp_overlap: !args.no_dp_overlap,
        allow_idle_devices: args.allow_idle_devices,
        allow_uneven_batch: args.allow_uneven_batch,
        only_data_parallel: None,
        progress: std::io::stderr().is_terminal(),
    };
    let cache = ScheduleCache::new(args.solver.options()?)?;
    let outcome = evaluate(&workload, &arch, &options, &cache);
    let hbm_bytes = options.hbm_bytes.unwrap_or(arch.hbm.capacity_bytes);

    if let Some(path) = &args.csv {
        let row = match &outcome {
            Ok(e) => DesignRow::evaluated(&arch, e),
            Err(err) => DesignRow::failed(
                &workload.name,
                &arch,
                single(&options.micro_batches),
                single(&options.recompute),
                hbm_bytes,
                err,
            ),
        };
        append_rows(path, &[row]).with_context(|| format!("writing {}", path.display()))?;
    }

    match outcome {
        Ok(e) => {
            let simulated = args
                .simulate
                .then(|| simulate_plan(&e.plan))
                .transpose()
                .map_err(|why| anyhow::anyhow!("simulating the plan's schedule: {why}"))?;
            if args.json {
                let mut value = plan_json(&e);
                if let Some(sim) = &simulated {
                    value["simulated"] = json!({
                        "pipeline_s": sim.makespan_s,
                        "closed_form_pipeline_s": pipeline_s(&e.plan),
                        "peak_in_flight": sim.peak_in_flight,
                    });
                }
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print_plan(&e, &workload);
                if let Some(sim) = &simulated {
                    print_simulation(&e.plan, sim);
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(EvaluateError::Infeasible(why)) => {
            if args.json {
                let value = json!({
                    "status": "infeasible",
                    "workload": workload.name,
                    "arch": arch.name,
                    "reasons": why.reasons,
                    "alternatives": why.alternatives,
                });
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                println!(
                    "{} on {} ({} devices): {why}",
                    workload.name, arch.name, options.devices
                );
            }
            Ok(ExitCode::from(EXIT_INFEASIBLE))
        }
        Err(other) => Err(other.into()),
    }
}

/// The value when exactly one was offered (a failed row then records it).
fn single<T: Copy>(values: &[T]) -> Option<T> {
    match values {
        [one] => Some(*one),
        _ => None,
    }
}

fn positive(flag: &str, values: &[u32]) -> Result<Vec<u32>> {
    if values.is_empty() || values.contains(&0) {
        anyhow::bail!("{flag}: every value must be a positive integer, got {values:?}");
    }
    if let Some(v) = tandem::search::first_repeated(values) {
        anyhow::bail!("{flag}: {v} is given twice");
    }
    Ok(values.to_vec())
}

/// A held width from the command line: absent, or at least 1.
fn held(flag: &str, value: Option<u32>) -> Result<Option<u32>> {
    if value == Some(0) {
        anyhow::bail!("{flag}: must be at least 1 (leave it out to search it)");
    }
    Ok(value)
}

/// The pipeline part of a plan's time: what the schedule simulator runs.
fn pipeline_s(plan: &Plan) -> f64 {
    let split = &plan.time_split;
    split.compute_s + split.bubble_s + split.pp_comm_s + split.dp_group_comm_s
}

fn print_simulation(plan: &Plan, sim: &Simulation) {
    let closed_s = pipeline_s(plan);
    println!(
        "schedule simulator: pipeline {} against the closed form's {} ({:+.2} %); most \
         micro-batches held per stage {:?}",
        tandem::report::seconds(sim.makespan_s),
        tandem::report::seconds(closed_s),
        100.0 * (sim.makespan_s / closed_s - 1.0),
        sim.peak_in_flight
    );
}

/// The plan as JSON: the documented top-level fields first, then the whole evaluation.
pub fn plan_json(e: &tandem::model::Evaluation) -> serde_json::Value {
    let p = &e.plan;
    let (fewest, most) = p.replica_range();
    json!({
        "status": "ok",
        "workload": e.workload,
        "arch": e.arch,
        "time_per_batch_s": p.time_per_batch_s,
        "throughput_samples_per_s": p.throughput_samples_per_s,
        "throughput_tokens_per_s": e.throughput_tokens_per_s,
        "mfu": e.mfu,
        "model_flops_per_s_per_device": e.model_flops_per_s_per_device,
        "energy_per_sample_j": e.energy_per_sample_j,
        "tp": p.tp,
        "pp": p.pp,
        "dp": p.dp,
        "schedule": p.schedule,
        "virtual_stages": p.virtual_stages,
        "zero": p.zero.number(),
        "ep": p.ep,
        "layout": p.layout.name(),
        "groups_per_pipeline": p.groups_per_pipeline(),
        "replicas_per_stage": [fewest, most],
        "micro_batch": p.micro_batch,
        "micro_batches_per_pipeline": p.micro_batches_per_pipeline,
        "recompute": e.recompute,
        "sequence_parallel": e.sequence_parallel,
        "hbm_bytes": e.hbm_bytes,
        "devices_used": p.devices_used,
        "peak_memory_bytes": p.peak_memory_bytes,
        "time_split": p.time_split,
        "stages": p.stages.iter().map(stage_json).collect::<Vec<_>>(),
    })
}

/// One stage in the plan's JSON.
fn stage_json(s: &tandem::placement::Stage) -> serde_json::Value {
    json!({
            "layers": s.layers,
            "devices": s.devices,
            "replicas": s.replicas,
            "in_flight": s.in_flight,
            "fwd_s": s.fwd_s,
            "bwd_s": s.bwd_s,
            "send_s": s.send_s(),
            "send_forward_s": s.send_forward_s,
            "send_backward_s": s.send_backward_s,
            "grad_accumulation_s": s.grad_accumulation_s,
            "dp_group_forward_s": s.dp_group_forward_s,
            "dp_group_backward_s": s.dp_group_backward_s,
            "load_s": s.load_s,
            "dp_comm_s": s.dp_comm_s,
            "dp_sync_s": s.dp_sync_s,
            "dp_hidden_s": s.dp_hidden_s,
            "optimizer_s": s.optimizer_s,
            "memory_bytes": s.memory.total,
            "memory": s.memory,
            "chunks": s.chunks,
    })
}

/// The ZeRO stages named on the command line (clap has checked the range), each once.
pub fn zero_stages(numbers: &[u8]) -> Vec<ZeroStage> {
    ZeroStage::ALL
        .into_iter()
        .filter(|z| numbers.contains(&z.number()))
        .collect()
}
