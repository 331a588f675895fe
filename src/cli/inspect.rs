//! `tandem inspect`: a workload's layers and operators, optionally priced on a chip.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use tandem::arch::load_chip;
use tandem::cost::{CostModel, OpCost};
use tandem::report;
use tandem::workload::{ActivationBytes, Layer, Op, OpGraph, OpKind, Workload};

/// Show a workload's layers and operators: kind, shape, FLOPs and bytes; with `--arch`, each
/// operator's latency on one core and intra-operator parallel on all cores of its type.
/// Besides each layer's forward (`fwd`) and backward (`bwd`), the kernels over its parameters:
/// `accum`, every micro-batch after a copy's first (gradient accumulation), and `step`, once
/// per iteration (the data-parallel wrapper's gradient work, then the optimizer step).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workload file: a model template (TOML) or an operator DAG (JSON).
    #[arg(long)]
    workload: PathBuf,
    /// Chip file (TOML); when given, operators are priced on it.
    #[arg(long)]
    arch: Option<PathBuf>,
    /// Micro-batch size (samples per forward pass).
    #[arg(long, default_value_t = 1)]
    micro_batch: u32,
    /// Tensor-parallel width t (Megatron slicing); sizes are per device.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Use sequence parallelism (reduce-scatter + all-gather instead of all-reduce).
    #[arg(long)]
    seq_parallel: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Also write one CSV row per operator of each unique layer to this file.
    #[arg(long, value_name = "PATH")]
    csv: Option<PathBuf>,
}

#[derive(Serialize)]
struct LayerSummary<'a> {
    name: &'a str,
    signature: &'a str,
    fwd_flops: f64,
    bwd_flops: f64,
    params: u64,
    activation_bytes: ActivationBytes,
    output_bytes: u64,
}

/// One operator, in JSON as an operator DAG names it (`name`, and `kind` with the kind's own
/// fields under it).
#[derive(Serialize)]
struct OpRow<'a> {
    layer: &'a str,
    direction: &'static str,
    name: &'a str,
    kind: &'a OpKind,
    /// Issued asynchronously (`Op::asynchronous`): on a GPU, beside the kernels after it.
    asynchronous: bool,
    flops: f64,
    bytes_read: u64,
    bytes_written: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost: Option<OpCost>,
}

#[derive(Serialize)]
struct Report<'a> {
    workload: &'a str,
    arch: Option<&'a str>,
    tp: u32,
    micro_batch: u32,
    sequence_parallel: bool,
    params: u64,
    model_flops_per_iteration: f64,
    activation_bytes_per_micro_batch: ActivationBytes,
    layers: Vec<LayerSummary<'a>>,
    unique_layers: BTreeMap<&'a str, Vec<OpRow<'a>>>,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let workload = Workload::load(&args.workload)?;
    let arch = args.arch.as_deref().map(load_chip).transpose()?;
    let graph = workload.layer_graph(args.tp, args.micro_batch, args.seq_parallel)?;
    let cost_model = arch.as_ref().map(CostModel::new);

    let mut activations = ActivationBytes::default();
    for layer in &graph.layers {
        activations.none += layer.activation_bytes.none;
        activations.selective += layer.activation_bytes.selective;
        activations.full += layer.activation_bytes.full;
    }
    let unique = unique_layers(&graph.layers);
    let param_kernels: Vec<_> = unique
        .iter()
        .map(|(layer, _)| param_graphs(&workload, layer))
        .collect();
    let mut unique_rows = BTreeMap::new();
    for ((layer, _), param_kernels) in unique.iter().zip(&param_kernels) {
        let mut rows = op_rows(layer, "fwd", &layer.fwd, cost_model.as_ref());
        rows.extend(op_rows(layer, "bwd", &layer.bwd, cost_model.as_ref()));
        for (direction, graph) in param_kernels {
            rows.extend(op_rows(layer, direction, graph, cost_model.as_ref()));
        }
        unique_rows.insert(layer.signature.as_str(), rows);
    }
    let report = Report {
        workload: &workload.name,
        arch: arch.as_ref().map(|a| a.name.as_str()),
        tp: args.tp,
        micro_batch: args.micro_batch,
        sequence_parallel: args.seq_parallel,
        params: workload.total_params(),
        model_flops_per_iteration: workload.model_flops_per_iteration(),
        activation_bytes_per_micro_batch: activations,
        layers: graph
            .layers
            .iter()
            .map(|l| LayerSummary {
                name: &l.name,
                signature: &l.signature,
                fwd_flops: l.fwd.total_flops(),
                bwd_flops: l.bwd.total_flops(),
                params: l.params,
                activation_bytes: l.activation_bytes,
                output_bytes: l.output_bytes,
            })
            .collect(),
        unique_layers: unique_rows,
    };

    if let Some(path) = &args.csv {
        write_csv(path, &unique, &report)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report, &unique, cost_model.is_some());
    }
    Ok(ExitCode::SUCCESS)
}

/// Unique layers in order of first appearance, with how many layers share each signature.
fn unique_layers(layers: &[Layer]) -> Vec<(&Layer, usize)> {
    let mut out: Vec<(&Layer, usize)> = Vec::new();
    for layer in layers {
        match out.iter_mut().find(|(l, _)| l.signature == layer.signature) {
            Some((_, count)) => *count += 1,
            None => out.push((layer, 1)),
        }
    }
    out
}

/// The kernels over a layer's parameters outside its passes, as the placement prices them:
/// `accum`, a micro-batch's gradient accumulation; `step`, the data-parallel wrapper's work
/// on the gradients and the optimizer step. None for a layer without parameters.
fn param_graphs(workload: &Workload, layer: &Layer) -> [(&'static str, OpGraph); 2] {
    let tensors = &layer.param_tensors;
    let graph = |ops: Vec<Op>| OpGraph {
        ops,
        edges: Vec::new(),
    };
    let mut step = workload.grad_buffer_ops(tensors);
    step.extend(workload.optimizer_step_ops(tensors));
    [
        ("accum", graph(workload.grad_accumulation_ops(tensors))),
        ("step", graph(step)),
    ]
}

fn op_rows<'a>(
    layer: &'a Layer,
    direction: &'static str,
    graph: &'a OpGraph,
    cost_model: Option<&CostModel>,
) -> Vec<OpRow<'a>> {
    graph
        .ops
        .iter()
        .map(|op: &'a Op| OpRow {
            layer: &layer.signature,
            direction,
            name: &op.name,
            kind: &op.kind,
            asynchronous: op.asynchronous,
            flops: op.flops,
            bytes_read: op.bytes_read,
            bytes_written: op.bytes_written,
            cost: cost_model.map(|m| m.op_cost(op)),
        })
        .collect()
}

/// A row's kind (", async" where the operator is asynchronous) and shape.
fn describe(row: &OpRow) -> (String, String) {
    let (mut kind, shape) = shape(row.kind);
    if row.asynchronous {
        kind.push_str(", async");
    }
    (kind, shape)
}

fn shape(kind: &OpKind) -> (String, String) {
    match *kind {
        OpKind::Gemm { batch, m, n, k } => {
            let prefix = if batch > 1 {
                format!("{batch} × ")
            } else {
                String::new()
            };
            ("gemm".into(), format!("{prefix}{m}×{n}×{k}"))
        }
        OpKind::Vector {
            op,
            elements,
            row_len,
            ..
        } => {
            let rows = if row_len > 1 {
                format!(" (rows of {row_len})")
            } else {
                String::new()
            };
            (
                format!("vector/{op:?}").to_lowercase(),
                format!("{elements}{rows}"),
            )
        }
        OpKind::Collective {
            collective,
            bytes,
            group,
        } => (
            format!("collective/{collective:?}").to_lowercase(),
            format!("{} over {group}", report::bytes(bytes as f64)),
        ),
        OpKind::Attention { shape: a, .. } => (
            if a.causal {
                "attention/causal"
            } else {
                "attention"
            }
            .into(),
            format!(
                "{} heads ({} K/V) × {}×{}",
                a.heads, a.kv_heads, a.seq_len, a.head_dim
            ),
        ),
    }
}

fn print_text(report: &Report, unique: &[(&Layer, usize)], priced: bool) {
    println!(
        "{}: t = {}, micro-batch {}, sequence parallel {}{}",
        report.workload,
        report.tp,
        report.micro_batch,
        if report.sequence_parallel {
            "on"
        } else {
            "off"
        },
        report
            .arch
            .map(|a| format!(", priced on {a}"))
            .unwrap_or_default()
    );
    for (layer, count) in unique {
        println!();
        println!(
            "layer {} (× {count}, signature {}): params/device {}, activations/micro-batch none {} · selective {} · full {}",
            layer.name,
            layer.signature,
            report::si(layer.params as f64, ""),
            report::bytes(layer.activation_bytes.none as f64),
            report::bytes(layer.activation_bytes.selective as f64),
            report::bytes(layer.activation_bytes.full as f64),
        );
        let mut header = vec!["dir / op", "kind", "shape", "FLOP", "read", "written"];
        if priced {
            header.extend(["one core", "all cores", "bound (all)"]);
        }
        let rows = report.unique_layers[layer.signature.as_str()]
            .iter()
            .map(|r| {
                let (kind, shape) = describe(r);
                let mut row = vec![
                    format!("{} {}", r.direction, r.name),
                    kind,
                    shape,
                    report::si(r.flops, ""),
                    report::bytes(r.bytes_read as f64),
                    report::bytes(r.bytes_written as f64),
                ];
                if let Some(c) = &r.cost {
                    row.push(report::seconds(c.one_core_s));
                    row.push(report::seconds(c.all_cores_s));
                    row.push(format!("{:?}", c.all_cores_bound).to_lowercase());
                }
                row
            })
            .collect();
        println!("{}", report::table(&header, rows));
    }
    println!();
    println!(
        "totals: parameters {} ({}), model FLOPs per iteration {}",
        report.params,
        report::si(report.params as f64, ""),
        report::si(report.model_flops_per_iteration, "FLOP"),
    );
    let a = report.activation_bytes_per_micro_batch;
    println!(
        "activation bytes per micro-batch, all layers on one device: none {} · selective {} · full {}",
        report::bytes(a.none as f64),
        report::bytes(a.selective as f64),
        report::bytes(a.full as f64),
    );
}

fn write_csv(path: &std::path::Path, unique: &[(&Layer, usize)], report: &Report) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "workload",
        "layer",
        "count",
        "direction",
        "op",
        "kind",
        "shape",
        "flops",
        "bytes_read",
        "bytes_written",
        "one_core_s",
        "all_cores_s",
        "bound",
    ])?;
    for (layer, count) in unique {
        for r in &report.unique_layers[layer.signature.as_str()] {
            let (kind, shape) = describe(r);
            let (one, all, bound) = match &r.cost {
                Some(c) => (
                    c.one_core_s.to_string(),
                    c.all_cores_s.to_string(),
                    format!("{:?}", c.all_cores_bound).to_lowercase(),
                ),
                None => Default::default(),
            };
            w.write_record([
                report.workload,
                &layer.name,
                &count.to_string(),
                r.direction,
                r.name,
                &kind,
                &shape,
                &r.flops.to_string(),
                &r.bytes_read.to_string(),
                &r.bytes_written.to_string(),
                &one,
                &all,
                &bound,
            ])?;
        }
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    tandem::output::write_atomic(path, &bytes)
        .with_context(|| format!("writing {}", path.display()))
}
