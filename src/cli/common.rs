//! Options and printing shared by several subcommands.

use super::plan::Recompute;
use anyhow::{bail, Result};
use std::path::PathBuf;
use tandem::arch::SearchSpace;
use tandem::model::Evaluation;
use tandem::placement::{DeviceLayout, Plan, RecomputeMode, ZeroStage};
use tandem::report::{self, bytes, seconds, table};
use tandem::schedule::SolverOptions;
use tandem::search::{first_repeated, Objective};
use tandem::workload::Workload;

/// The chip and the cluster it is deployed in.
#[derive(Debug, clap::Args)]
pub struct ChipArgs {
    /// Chip file (TOML, arch_specs/); its interconnect tiers describe the cluster.
    #[arg(long)]
    pub arch: PathBuf,
    /// Devices in the cluster.
    #[arg(long)]
    pub devices: u32,
    /// HBM per device in GiB (default: the chip file's capacity).
    #[arg(long, value_name = "GIB", allow_negative_numbers = true)]
    pub hbm_gib: Option<f64>,
}

impl ChipArgs {
    pub fn devices(&self) -> Result<u32> {
        if self.devices == 0 {
            bail!("--devices: must be at least 1");
        }
        Ok(self.devices)
    }

    pub fn hbm_bytes(&self) -> Result<Option<u64>> {
        self.hbm_gib.map(hbm_gib_to_bytes).transpose()
    }
}

/// Largest HBM per device the command line takes, in GiB (1 PiB).
const MAX_HBM_GIB: f64 = 1_048_576.0;

/// GiB from the command line to bytes, rejecting zero, negative, non-finite and absurd sizes.
pub fn hbm_gib_to_bytes(gib: f64) -> Result<u64> {
    if !(gib.is_finite() && gib > 0.0) {
        bail!("--hbm-gib: must be a positive number of GiB, got {gib}");
    }
    if gib > MAX_HBM_GIB {
        bail!("--hbm-gib: {gib} GiB is more than the {MAX_HBM_GIB} GiB (1 PiB) a device can have");
    }
    let bytes = (gib * report::GIB).round() as u64;
    if bytes == 0 {
        bail!("--hbm-gib: {gib} GiB is less than one byte");
    }
    Ok(bytes)
}

/// The axes a sweep adds to each configuration of a space: micro-batch, recompute, HBM.
#[derive(Debug, clap::Args)]
pub struct SweepAxes {
    /// Micro-batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    pub micro_batch: Vec<u32>,
    /// Recompute modes, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Recompute::None, Recompute::Full])]
    pub recompute: Vec<Recompute>,
    /// HBM sizes per device in GiB, comma-separated (default: the space's base capacity).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "GIB",
        allow_negative_numbers = true
    )]
    pub hbm_gib: Vec<f64>,
    /// ZeRO stages each design point's plan search chooses from, comma-separated (0 none,
    /// 1 optimizer state, 2 and gradients, 3 and weights). Sweeps hold ZeRO-0 unless asked:
    /// every stage listed is another plan search per point (all four take 1.5× the default
    /// job's time and 3.7× that of results/phaze-models).
    #[arg(long, value_delimiter = ',', default_values_t = [0], value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Vec<u8>,
}

impl SweepAxes {
    pub fn zero(&self) -> Result<Vec<ZeroStage>> {
        if let Some(z) = first_repeated(&self.zero) {
            bail!("--zero: {z} is given twice");
        }
        Ok(super::plan::zero_stages(&self.zero))
    }

    pub fn micro_batches(&self) -> Result<Vec<u32>> {
        if self.micro_batch.is_empty() || self.micro_batch.contains(&0) {
            bail!("--micro-batch: give positive micro-batch sizes");
        }
        if let Some(m) = first_repeated(&self.micro_batch) {
            bail!("--micro-batch: {m} is given twice");
        }
        Ok(self.micro_batch.clone())
    }

    pub fn recompute(&self) -> Result<Vec<RecomputeMode>> {
        let modes: Vec<RecomputeMode> = self.recompute.iter().map(|&r| r.into()).collect();
        if let Some(r) = first_repeated(&modes) {
            bail!("--recompute: {r} is given twice");
        }
        Ok(modes)
    }

    /// The HBM sizes in bytes; the space's own capacity when none is given.
    pub fn hbm_bytes(&self, space: &SearchSpace) -> Result<Vec<u64>> {
        if self.hbm_gib.is_empty() {
            return Ok(vec![space.base_hbm_bytes()]);
        }
        let bytes: Vec<u64> = self
            .hbm_gib
            .iter()
            .map(|&g| hbm_gib_to_bytes(g))
            .collect::<Result<_>>()?;
        if let Some(b) = first_repeated(&bytes) {
            bail!("--hbm-gib: {} GiB is given twice", report::gib(*b));
        }
        Ok(bytes)
    }
}

/// How hard the per-layer scheduler works: its work limits and gap.
#[derive(Debug, clap::Args)]
pub struct SolverLimits {
    /// Time limit per layer schedule (ILP on HiGHS), seconds: a safety net (a schedule cut
    /// off by the clock depends on the machine's load); its status says so.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    pub ilp_time_limit_s: f64,
    /// Branch-and-bound nodes per layer ILP: the deterministic work limit (equal inputs give
    /// equal results on any machine; the time limit is only a safety net).
    #[arg(long, default_value_t = 500)]
    pub ilp_node_limit: u32,
    /// Relative optimality gap at which a schedule is accepted (0.01 = 1 %).
    #[arg(long, default_value_t = 0.01)]
    pub ilp_gap: f64,
    /// Placements the depth-first schedule search may make per layer before the ILP takes
    /// over (0: ILP only).
    #[arg(long, default_value_t = 300_000)]
    pub search_node_limit: u32,
}

/// The scheduler's limits, and whether it may go past the list schedule.
#[derive(Debug, clap::Args)]
pub struct SolverArgs {
    #[command(flatten)]
    pub limits: SolverLimits,
    /// Use the list-scheduling heuristic only (no search, no ILP).
    #[arg(long)]
    pub no_ilp: bool,
}

impl SolverArgs {
    pub fn options(&self) -> Result<SolverOptions> {
        let limits = &self.limits;
        let options = SolverOptions {
            time_limit_s: limits.ilp_time_limit_s,
            node_limit: limits.ilp_node_limit,
            search_node_limit: limits.search_node_limit,
            relative_gap: limits.ilp_gap,
            use_ilp: !self.no_ilp,
        };
        options.validate()?;
        Ok(options)
    }
}

/// Layer indices as compact ranges with the names at their ends, e.g. `1-48 (block0..block47)`.
pub fn layer_ranges(layers: &[usize], names: &[String]) -> String {
    let name = |i: usize| names.get(i).map_or("?", String::as_str);
    let mut parts = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            format!("{} ({})", layers[i], name(layers[i]))
        } else {
            format!(
                "{}-{} ({}..{})",
                layers[i],
                layers[j],
                name(layers[i]),
                name(layers[j])
            )
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// What a plan is, in one line: its widths, pipelines, replicas per stage and schedule, e.g.
/// `t=4, 1 pipeline of 25 stages × 40 replicas (1000 tensor groups per pipeline), 1f1b`.
pub fn plan_shape(p: &Plan) -> String {
    let (fewest, most) = p.replica_range();
    let schedule = if p.virtual_stages > 1 {
        format!(
            "{}, {} chunks per stage",
            p.schedule.name(),
            p.virtual_stages
        )
    } else {
        p.schedule.name().to_string()
    };
    let groups = p.groups_per_pipeline();
    let mut zero = if p.zero == ZeroStage::Replicated {
        String::new()
    } else {
        format!(", ZeRO-{}", p.zero.number())
    };
    if p.ep > 1 {
        zero.push_str(&format!(", experts over {} pipelines", p.ep));
    }
    if p.layout != DeviceLayout::PipelineMajor {
        zero.push_str(&format!(", {} layout", p.layout.name()));
    }
    format!(
        "{} ({groups} tensor group{} per pipeline), {schedule}{zero}",
        report::plan_line(p.tp, p.dp, p.pp, &report::replica_range(fewest, most)),
        if groups == 1 { "" } else { "s" }
    )
}

/// The stage table and time split of a plan.
pub fn print_plan_body(plan: &Plan, names: &[String], hbm_bytes: u64) {
    let rows = plan
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let m = &s.memory;
            vec![
                i.to_string(),
                layer_ranges(&s.layers, names),
                s.replicas.to_string(),
                s.devices.to_string(),
                seconds(s.fwd_s),
                seconds(s.bwd_s),
                seconds(s.send_s()),
                seconds(s.grad_accumulation_s),
                seconds(s.load_s),
                s.in_flight.to_string(),
                bytes(m.weights as f64),
                bytes(m.grads as f64),
                bytes(m.optimizer as f64),
                bytes(m.activations as f64),
                bytes(m.stash as f64),
                bytes(m.total as f64),
            ]
        })
        .collect();
    println!(
        "{}",
        table(
            &[
                "stage",
                "layers",
                "replicas",
                "devices",
                "fwd",
                "bwd",
                "send",
                "accum.",
                "load",
                "held",
                "weights",
                "grads",
                "optimizer",
                "activ.",
                "stash",
                "memory",
            ],
            rows,
        )
    );
    let split = &plan.time_split;
    // A part of the split named only where the plan has it.
    let part = |time_s: f64, before: &str, after: &str| {
        if time_s > 0.0 {
            format!("{before}{}{after}", seconds(time_s))
        } else {
            String::new()
        }
    };
    let hidden = part(
        plan.dp_hidden_s(),
        " (after ",
        " hidden behind the backward)",
    );
    let shard = part(
        split.dp_group_comm_s,
        ", data-parallel-group collectives (ZeRO-2/3, expert all-to-all) ",
        "",
    );
    let buffer = part(
        split.grad_buffer_s,
        " (of it the data-parallel wrapper's gradient work ",
        ")",
    );
    println!(
        "time per batch {}: compute {}, pipeline bubble {}, pipeline sends {}{shard}, data-parallel sync {}{hidden}, optimizer step {}{buffer}",
        seconds(plan.time_per_batch_s),
        seconds(split.compute_s),
        seconds(split.bubble_s),
        seconds(split.pp_comm_s),
        seconds(split.dp_comm_s),
        seconds(split.optimizer_s)
    );
    println!(
        "peak memory per device {} of {} HBM",
        bytes(plan.peak_memory_bytes as f64),
        bytes(hbm_bytes as f64)
    );
}

/// A searched plan: headline figures, then stages and time split.
pub fn print_plan(e: &Evaluation, workload: &Workload) {
    let p = &e.plan;
    println!(
        "{} on {}: {}, micro-batch {} ({} per pipeline), recompute {}{}, {} devices used",
        e.workload,
        e.arch,
        plan_shape(p),
        p.micro_batch,
        p.micro_batches_per_pipeline,
        e.recompute,
        if e.sequence_parallel {
            ", sequence parallel"
        } else {
            ""
        },
        p.devices_used
    );
    println!(
        "{:.4} s per batch, {:.1} samples/s, {:.0} tokens/s, MFU {:.1} % ({:.1} TFLOP/s per device), {:.3} J per sample",
        p.time_per_batch_s,
        p.throughput_samples_per_s,
        e.throughput_tokens_per_s,
        100.0 * e.mfu,
        e.model_flops_per_s_per_device / 1e12,
        e.energy_per_sample_j
    );
    let names: Vec<String> = workload
        .layer_graph(p.tp, p.micro_batch, e.sequence_parallel)
        .map(|g| g.layers.into_iter().map(|l| l.name).collect())
        .unwrap_or_default();
    print_plan_body(p, &names, e.hbm_bytes);
}

/// The library's [`Objective`] as `--objective` names it (`search`, `compare`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ObjectiveArg {
    /// Samples per second.
    Throughput,
    /// Samples per second per mm² of die.
    ThroughputPerArea,
    /// Fewest joules per sample (pruned by a lower bound on joules per sample with one
    /// workload; with several, every point is evaluated).
    Energy,
}

impl From<ObjectiveArg> for Objective {
    fn from(objective: ObjectiveArg) -> Self {
        match objective {
            ObjectiveArg::Throughput => Objective::Throughput,
            ObjectiveArg::ThroughputPerArea => Objective::ThroughputPerArea,
            ObjectiveArg::Energy => Objective::Energy,
        }
    }
}
