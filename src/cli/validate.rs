//! `tandem validate`: predicted against measured, for kernels and for end-to-end runs.

use super::calibrate::{dir_list, summary_rows, SUMMARY_HEADER};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use tandem::arch::load_chip;
use tandem::calibrate::{
    class_splits, class_totals, composite_latency, gemm_splits, kernel_errors,
    load_measurement_dirs, measured_class_launches, measured_class_s, split_iterations,
    step_errors, summarise, summarise_by_working_set, summarise_errors, time_weighted_class_errors,
    validate_layer_times, validate_runs, with_in_block_kernels, ClassSplit, ClassTotal,
    ErrorSummary, GemmSplit, IterationSplit, KernelError, LayerTimeError, Measurement, RunError,
    RunPlans, StepError, GEMM_CLASS,
};
use tandem::output::write_atomic;
use tandem::placement::RecomputeMode;
use tandem::report::{self, seconds, table};
use tandem::schedule::{ScheduleCache, SolverOptions};

/// Compare the model with measurements: kernel by kernel (GEMMs, vector ops, collectives,
/// whole blocks) and end to end (published training runs with their plans held fixed), as
/// tables and CSV files.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Chip file (TOML), e.g. a calibrated one.
    #[arg(long)]
    arch: PathBuf,
    /// Directory of measured kernels (calibration/collect.py output, the LLMCompass A100 files
    /// or published fused-attention benchmarks); repeat for several directories.
    #[arg(long)]
    kernels: Vec<PathBuf>,
    /// Published end-to-end runs (CSV with the columns of data/reference/published_runs.csv,
    /// or of data/reference/korthikanti2022_runs.csv: an iteration time instead of TFLOP/s and
    /// sequence parallelism); repeat for several files.
    #[arg(long)]
    runs: Vec<PathBuf>,
    /// What the runs' publications leave out of their plans (CSV `model,micro_batch,dp_overlap`
    /// and optionally `schedule` (1f1b or interleaved), `virtual_stages`, `tp_grad_overlap` and
    /// `ddp` (none, torch or megatron),
    /// e.g. calibration/published_run_plans.csv; repeat for several files): held for the runs
    /// they name; the others get the best micro-batch the model finds, an overlapped gradient
    /// all-reduce, 1F1B, blocking tensor-parallel collectives and no data-parallel wrapper's
    /// gradient work.
    #[arg(long, requires = "runs")]
    run_plans: Vec<PathBuf>,
    /// Published times of one transformer layer's forward and backward (CSV with the columns
    /// of data/reference/korthikanti2022_layer_times.csv); repeat for several files. With
    /// --runs, each run without a pipeline whose layer a row measured is also split into its
    /// layers and the rest.
    #[arg(long)]
    layer_times: Vec<PathBuf>,
    /// Directory for kernels.csv, steps.csv (the training iterations, with the GPU time
    /// collect.py profiled), gemms.csv (profiled blocks and iterations split into their GEMMs
    /// and the rest), classes.csv (profiled blocks and iterations by kernel class), runs.csv,
    /// layers.csv (single layers), splits.csv (runs split into their layers and the rest),
    /// summary.csv and summary.md.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Serialize)]
struct SummaryRow<'a> {
    scope: &'a str,
    class: &'a str,
    count: usize,
    mean_abs_error: f64,
    max_abs_error: f64,
    mean_signed_error: f64,
}

pub fn run(args: &Args) -> Result<ExitCode> {
    if args.kernels.is_empty() && args.runs.is_empty() && args.layer_times.is_empty() {
        bail!("nothing to validate: give --kernels DIR, --runs CSV and/or --layer-times CSV");
    }
    let arch = load_chip(&args.arch)?;
    let cache = ScheduleCache::new(SolverOptions::default())?;
    let mut markdown = format!("# Validation of `{}`\n\n", args.arch.display());
    let mut summaries: Vec<(&str, ErrorSummary)> = Vec::new();
    let mut kernel_rows: Vec<KernelError> = Vec::new();
    let mut step_rows: Vec<StepError> = Vec::new();
    let mut gemm_rows: Vec<GemmSplit> = Vec::new();
    let mut class_rows: Vec<ClassSplit> = Vec::new();
    if !args.kernels.is_empty() {
        let measurements = with_in_block_kernels(load_measurement_dirs(&args.kernels)?)?;
        kernel_rows = kernel_errors(&arch, &measurements, |m| {
            composite_latency(&arch, &cache, m)
        });
        let s = summarise(&kernel_rows);
        let dirs = dir_list(&args.kernels);
        println!("kernels ({dirs}): predicted vs measured");
        println!("{}", table(&SUMMARY_HEADER, summary_rows(&s)));
        let quoted: Vec<String> = args
            .kernels
            .iter()
            .map(|dir| format!("`{}`", dir.display()))
            .collect();
        markdown += &format!("## Kernels ({})\n\n", quoted.join(", "));
        markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&s));
        summaries.extend(s.into_iter().map(|x| ("kernel", x)));
        let l2_bytes = arch.glb.bytes;
        for (scope, fits, title) in [
            ("kernel_in_l2", true, "whose working set fits in"),
            ("kernel_beyond_l2", false, "whose working set exceeds"),
        ] {
            let s = summarise_by_working_set(&kernel_rows, l2_bytes, fits);
            if s.is_empty() {
                continue;
            }
            let heading = format!(
                "Single kernels {title} the {:.0} MiB L2 (`glb.bytes`)",
                l2_bytes as f64 / f64::from(1u32 << 20)
            );
            println!("{heading}");
            println!("{}", table(&SUMMARY_HEADER, summary_rows(&s)));
            markdown += &format!("### {heading}\n\n");
            if fits {
                markdown += WORKING_SET_NOTE;
            }
            markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&s));
            summaries.extend(s.into_iter().map(|x| (scope, x)));
        }
        step_rows = step_errors(&measurements, &kernel_rows, arch.efficiency.launch_gap_s);
        if !step_rows.is_empty() {
            let rows: Vec<Vec<String>> = step_rows.iter().map(step_row).collect();
            println!("training iterations: measured (eager, wall) and the GPU's kernels in it");
            println!("{}", table(&STEP_HEADER, rows.clone()));
            markdown += "## Training iterations: wall time and the GPU's own time\n\n";
            markdown += STEP_NOTE;
            markdown += &markdown_table(&STEP_HEADER, &rows);
            let launched = summarise_errors(
                step_rows
                    .iter()
                    .filter_map(|r| Some((r.class.as_str(), r.launched_signed_error?))),
            );
            if !launched.is_empty() {
                println!("against the profiled iterations' kernels and their launch gaps");
                println!("{}", table(&SUMMARY_HEADER, summary_rows(&launched)));
                markdown += "Against the profiled iterations' kernels and their launch gaps:\n\n";
                markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&launched));
                summaries.extend(launched.into_iter().map(|x| ("gpu_launched", x)));
            }
        }
        // The model's kernel classes of each profiled pass and iteration, priced once for both
        // splits.
        let model_classes: BTreeMap<&str, BTreeMap<&'static str, f64>> = measurements
            .iter()
            .filter(|m| m.profile.is_some())
            .filter_map(|m| Some((m.source.as_str(), measured_class_s(&arch, &cache, m)?)))
            .collect();
        let classes_of = |m: &Measurement| model_classes.get(m.source.as_str()).cloned();
        gemm_rows = gemm_splits(
            &measurements,
            &kernel_rows,
            arch.efficiency.launch_gap_s,
            |m| Some(classes_of(m)?.get(GEMM_CLASS).copied().unwrap_or(0.0)),
        );
        if !gemm_rows.is_empty() {
            let rows: Vec<Vec<String>> = gemm_rows.iter().map(gemm_row).collect();
            println!("profiled blocks and iterations: GEMM kernels and the rest against the model");
            println!("{}", table(&GEMM_HEADER, rows.clone()));
            markdown += "## Profiled blocks and iterations: their GEMMs and the rest\n\n";
            markdown += GEMM_NOTE;
            markdown += &markdown_table(&GEMM_HEADER, &rows);
            for (scope, what, part) in [
                (
                    "gemm_kernels",
                    "The GEMMs",
                    (|r| r.gemm_signed_error) as fn(&GemmSplit) -> f64,
                ),
                ("other_kernels", "The rest", |r| r.rest_signed_error),
            ] {
                let s = summarise_errors(gemm_rows.iter().map(|r| (r.class.as_str(), part(r))));
                markdown += &format!("{what}:\n\n");
                markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&s));
                summaries.extend(s.into_iter().map(|x| (scope, x)));
            }
        }
        class_rows = class_splits(&measurements, classes_of, measured_class_launches);
        if !class_rows.is_empty() {
            let rows: Vec<Vec<String>> = class_totals(&class_rows).iter().map(class_row).collect();
            println!("profiled block passes and iterations by kernel class, summed over each kind");
            println!("{}", table(&CLASS_HEADER, rows.clone()));
            markdown += "## Profiled block passes and iterations by kernel class\n\n";
            markdown += CLASS_NOTE;
            markdown += &markdown_table(&CLASS_HEADER, &rows);
            // Classes the model has no operator for are in the table above, not in the errors.
            let labels: Vec<(String, f64)> = class_rows
                .iter()
                .filter(|r| r.predicted_s > 0.0)
                .filter_map(|r| Some((format!("{} {}", r.class, r.kernel_class), r.signed_error?)))
                .collect();
            let s = summarise_errors(labels.iter().map(|(l, e)| (l.as_str(), *e)));
            markdown += "Pass by pass, the classes the model prices:\n\n";
            markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&s));
            summaries.extend(s.into_iter().map(|x| ("kernel_class", x)));
            let totals = class_totals(&class_rows);
            let s = summarise_errors(
                totals
                    .iter()
                    .filter_map(|t| Some((t.class.as_str(), t.signed_error()?))),
            );
            let weighted: Vec<String> = time_weighted_class_errors(&totals)
                .into_iter()
                .map(|(kind, error)| format!("{kind} {:.1} %", 100.0 * error))
                .collect();
            markdown += &format!(
                "Summed over each kind's passes, the classes the model prices, one error per \
                 class (its total against its kernels'; the mean over classes; weighted by GPU \
                 time instead: {}):\n\n",
                weighted.join(", ")
            );
            markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&s));
            summaries.extend(s.into_iter().map(|x| ("kernel_class_totals", x)));
        }
    }
    let mut run_rows = Vec::new();
    if !args.runs.is_empty() {
        let plans = RunPlans::load_all(&args.run_plans)?;
        let files: Vec<&Path> = args.runs.iter().map(PathBuf::as_path).collect();
        run_rows = validate_runs(&files, &plans, &arch, &cache)?;
        let rows: Vec<Vec<String>> = run_rows.iter().map(run_row).collect();
        let header = [
            "publication",
            "model",
            "gpus",
            "t",
            "p",
            "d",
            "recompute",
            "b",
            "schedule",
            "ddp",
            "dp overlap",
            "tp grad overlap",
            "measured",
            "predicted",
            "iteration measured",
            "predicted",
            "error",
        ];
        let names: Vec<String> = files.iter().map(|f| format!("`{}`", f.display())).collect();
        println!(
            "end-to-end runs ({}): TFLOP/s per GPU and seconds per iteration",
            names.join(", ")
        );
        println!("{}", table(&header, rows.clone()));
        let s = summarise_errors(
            run_rows
                .iter()
                .map(|r| (r.publication.as_str(), r.signed_error)),
        );
        println!("{}", table(&SUMMARY_HEADER, summary_rows(&s)));
        markdown += &format!(
            "## End-to-end runs ({}), TFLOP/s per GPU and seconds per iteration\n\n",
            names.join(", ")
        );
        markdown += &markdown_table(&header, &rows);
        markdown += "\n";
        markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&s));
        summaries.extend(s.into_iter().map(|x| ("end_to_end", x)));
    }
    let mut layer_rows = Vec::new();
    for file in &args.layer_times {
        layer_rows.extend(validate_layer_times(file, &arch, &cache)?);
    }
    let mut split_rows = Vec::new();
    if !layer_rows.is_empty() {
        let rows: Vec<Vec<String>> = layer_rows.iter().map(layer_row).collect();
        let names: Vec<String> = args
            .layer_times
            .iter()
            .map(|f| format!("`{}`", f.display()))
            .collect();
        println!("single layers ({}): forward and backward", names.join(", "));
        println!("{}", table(&LAYER_HEADER, rows.clone()));
        markdown += &format!(
            "## Single layers ({}): forward and backward\n\n",
            names.join(", ")
        );
        markdown += LAYER_NOTE;
        markdown += &markdown_table(&LAYER_HEADER, &rows);
        let mut errors: Vec<(String, f64)> = Vec::new();
        for r in &layer_rows {
            for (part, error) in [
                ("forward", r.forward_error),
                ("backward", r.backward_error),
                ("layer", r.layer_error),
            ] {
                errors.push((format!("{} {part}", r.publication), error));
            }
        }
        let mut s = summarise_errors(errors.iter().map(|(class, e)| (class.as_str(), *e)));
        // The parts count each row thrice: no total over them.
        s.retain(|x| x.class != "all");
        println!("{}", table(&SUMMARY_HEADER, summary_rows(&s)));
        markdown += &markdown_table(&SUMMARY_HEADER, &summary_rows(&s));
        summaries.extend(s.into_iter().map(|x| ("layer", x)));
        split_rows = split_iterations(&run_rows, &layer_rows);
        if !split_rows.is_empty() {
            let rows: Vec<Vec<String>> = split_rows.iter().map(split_row).collect();
            println!("end-to-end runs split into their layers and the rest");
            println!("{}", table(&SPLIT_HEADER, rows.clone()));
            markdown += "## End-to-end runs split into their layers and the rest\n\n";
            markdown += SPLIT_NOTE;
            markdown += &markdown_table(&SPLIT_HEADER, &rows);
        }
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        if !args.kernels.is_empty() {
            write_csv(&out.join("kernels.csv"), &kernel_rows)?;
        }
        if !step_rows.is_empty() {
            write_csv(&out.join("steps.csv"), &step_rows)?;
        }
        if !gemm_rows.is_empty() {
            write_csv(&out.join("gemms.csv"), &gemm_rows)?;
        }
        if !class_rows.is_empty() {
            write_csv(&out.join("classes.csv"), &class_rows)?;
        }
        if !args.runs.is_empty() {
            write_csv(&out.join("runs.csv"), &run_rows)?;
        }
        if !layer_rows.is_empty() {
            write_csv(&out.join("layers.csv"), &layer_rows)?;
        }
        if !split_rows.is_empty() {
            write_csv(&out.join("splits.csv"), &split_rows)?;
        }
        let rows: Vec<SummaryRow> = summaries
            .iter()
            .map(|(scope, s)| SummaryRow {
                scope,
                class: &s.class,
                count: s.count,
                mean_abs_error: s.mean_abs_error,
                max_abs_error: s.max_abs_error,
                mean_signed_error: s.mean_signed_error,
            })
            .collect();
        write_csv(&out.join("summary.csv"), &rows)?;
        let md = out.join("summary.md");
        write_atomic(&md, markdown.as_bytes())
            .with_context(|| format!("writing {}", md.display()))?;
        println!("wrote {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

const WORKING_SET_NOTE: &str = "A burst of calls on the same buffers (replayed from a CUDA \
graph or launched eagerly) finds a working set (operands and results) that fits in the L2 there \
after its first call; the model prices every kernel's traffic from HBM, as a training iteration \
streams tensors larger than the L2.\n\n";

const GEMM_HEADER: [&str; 8] = [
    "block pass or iteration",
    "GEMM kernels (profiled)",
    "share of GPU busy",
    "model's GEMMs",
    "error",
    "the rest",
    "model's rest",
    "error",
];

const GEMM_NOTE: &str = "Each profiled block pass and iteration (collect.py `--profile`: one \
run's kernels) split into its GEMM kernels (named `gemm` or cuBLAS's `nvjet`), against the \
model's GEMMs of the same pass or iteration (the tensor-core operators of its schedules), and \
the rest, against the rest of the model's: a block pass's other kernels, an iteration's other \
kernels and the launch gap after every kernel.\n\n";

const CLASS_HEADER: [&str; 8] = [
    "pass",
    "kernel class",
    "passes",
    "profiled",
    "model",
    "error",
    "kernels profiled",
    "model's launches",
];

const CLASS_NOTE: &str = "Each profiled block pass's and iteration's kernels by class \
(cuBLAS's GEMMs; PyTorch's kernels by the vector primitive they compute: the softmax \
backward's element-wise product with its row reduction, copies between dtypes as casts, the \
embedding's gather and backward as the embedding; `other`: memsets, fills and kernels no \
operator stands for), against the model's operators of the class in the same pass or \
iteration, GPU time without launch gaps, summed over the passes or iterations of a kind \
(`classes.csv`: one by one); and the kernels each launched against the model's launches, each \
of which pays the launch gap in an eager iteration (a multi-tensor kernel, the optimizer's \
update, counts a launch per 320 chunks of 65 536 elements, shared out over the layers).\n\n";

fn class_row(t: &ClassTotal) -> Vec<String> {
    let error = if t.gpu_s > 0.0 {
        format!("{:+.1} %", 100.0 * (t.predicted_s - t.gpu_s) / t.gpu_s)
    } else {
        "-".into()
    };
    vec![
        t.class.clone(),
        t.kernel_class.clone(),
        t.passes.to_string(),
        seconds(t.gpu_s),
        seconds(t.predicted_s),
        error,
        t.gpu_kernels.to_string(),
        format!("{:.0}", t.predicted_kernels),
    ]
}

fn gemm_row(r: &GemmSplit) -> Vec<String> {
    vec![
        format!("{} {}", r.class, r.shape),
        seconds(r.gpu_gemm_s),
        format!("{:.1} %", 100.0 * r.gemm_share),
        seconds(r.predicted_gemm_s),
        format!("{:+.1} %", 100.0 * r.gemm_signed_error),
        seconds(r.gpu_rest_s),
        seconds(r.predicted_rest_s),
        format!("{:+.1} %", 100.0 * r.rest_signed_error),
    ]
}

const STEP_HEADER: [&str; 9] = [
    "iteration",
    "measured",
    "GPU busy",
    "kernels",
    "busy + launch gaps",
    "GPU waits for host beyond them",
    "predicted",
    "error",
    "error vs busy + gaps",
];

const STEP_NOTE: &str =
    "Each iteration runs eagerly, as a user runs it; `GPU busy` is the time of \
its `kernels` in a profiled run of the same iteration (collect.py `--profile`). Launched one at \
a time from the host, each kernel leaves the GPU idle for the chip's `launch_gap_s` (fitted to \
single kernels timed eagerly and from a CUDA graph); `busy + launch gaps` is the iteration had \
the host kept the GPU fed otherwise, the model's scope, and the GPU waited for the host for the \
rest.\n\n";

fn step_row(r: &StepError) -> Vec<String> {
    let percent = |x: Option<f64>, signed: bool| match (x, signed) {
        (Some(x), true) => format!("{:+.1} %", 100.0 * x),
        (Some(x), false) => format!("{:.1} %", 100.0 * x),
        (None, _) => "-".to_string(),
    };
    vec![
        format!("{} {}", r.class, r.shape),
        seconds(r.measured_s),
        r.gpu_busy_s.map_or("-".to_string(), seconds),
        r.gpu_kernels.map_or("-".to_string(), |k| k.to_string()),
        r.launched_s.map_or("-".to_string(), seconds),
        percent(r.host_wait, false),
        seconds(r.predicted_s),
        percent(Some(r.signed_error), true),
        percent(r.launched_signed_error, true),
    ]
}

fn run_row(r: &RunError) -> Vec<String> {
    vec![
        r.publication.clone(),
        r.model.clone(),
        r.gpus.to_string(),
        r.tp.to_string(),
        r.pp.to_string(),
        r.dp.to_string(),
        recompute_cell(r.recompute, r.sequence_parallel),
        format!(
            "{}{}",
            r.micro_batch,
            if r.micro_batch_held {
                ""
            } else {
                " (searched)"
            }
        ),
        if r.virtual_stages > 1 {
            format!("{}, v={}", r.schedule.name(), r.virtual_stages)
        } else {
            r.schedule.name().to_string()
        },
        r.ddp.name().to_string(),
        if r.dp_overlap {
            format!("yes, hides {}", seconds(r.dp_hidden_s))
        } else {
            "no".to_string()
        },
        if r.tp_grad_overlap { "yes" } else { "no" }.to_string(),
        format!("{:.1}", r.measured_tflops_per_gpu),
        format!("{:.1}", r.predicted_tflops_per_gpu),
        seconds(r.measured_time_per_batch_s),
        seconds(r.time_per_batch_s),
        format!("{:+.1} %", 100.0 * r.signed_error),
    ]
}

const LAYER_HEADER: [&str; 11] = [
    "publication",
    "model",
    "t",
    "b",
    "recompute",
    "forward measured",
    "predicted",
    "error",
    "backward measured",
    "predicted (rerun, gradient adds)",
    "error",
];

const LAYER_NOTE: &str = "One transformer block of the row's sizes, built as Megatron-LM's \
fp16 runs build it and scheduled at the row's tensor-parallel width and micro-batch. Its \
backward holds what the layer's backward does in the iteration: the backward pass, the forward \
it reruns (full recompute: the layer's; selective: the attention core) and the add of each \
weight gradient into the gradient buffer (`main_grad.add_`, a hook per tensor). Errors are on \
time, (predicted − measured) / measured: negative where the model is fast.\n\n";

fn layer_row(r: &LayerTimeError) -> Vec<String> {
    vec![
        r.publication.clone(),
        r.model.clone(),
        r.tp.to_string(),
        r.micro_batch.to_string(),
        recompute_cell(r.recompute, r.sequence_parallel),
        seconds(r.measured_forward_s),
        seconds(r.predicted_forward_s),
        format!("{:+.1} %", 100.0 * r.forward_error),
        seconds(r.measured_backward_s),
        format!(
            "{} ({}, {})",
            seconds(r.predicted_backward_s),
            seconds(r.predicted_recompute_s),
            seconds(r.predicted_grad_accumulation_s)
        ),
        format!("{:+.1} %", 100.0 * r.backward_error),
    ]
}

const SPLIT_HEADER: [&str; 9] = [
    "model",
    "recompute",
    "iteration measured",
    "predicted",
    "layers measured",
    "predicted",
    "the rest measured",
    "predicted",
    "error",
];

const SPLIT_NOTE: &str = "Each end-to-end run without a pipeline whose layer the single \
layers above measured (same model, t, micro-batch, recompute, sequence parallelism and \
input-gradient overlap): its layers are blocks × micro-batches × one layer's forward and \
backward, the rest (embedding, head, optimizer step, the wrapper's gradient work) is the \
iteration less the layers. The iteration's time error, (predicted − measured) / measured, is \
the sum of the two parts, each over the measured iteration.\n\n";

fn split_row(r: &IterationSplit) -> Vec<String> {
    let (layers, rest) = r.error_parts();
    vec![
        r.model.clone(),
        recompute_cell(r.recompute, r.sequence_parallel),
        seconds(r.measured_iteration_s),
        seconds(r.predicted_iteration_s),
        seconds(r.measured_layers_s),
        seconds(r.predicted_layers_s),
        seconds(r.measured_rest_s),
        seconds(r.predicted_rest_s),
        format!(
            "{:+.1} % (layers {:+.1} %, rest {:+.1} %)",
            100.0 * (layers + rest),
            100.0 * layers,
            100.0 * rest
        ),
    ]
}

/// A run's or a layer's recompute mode, and its sequence parallelism where it has it.
fn recompute_cell(recompute: RecomputeMode, sequence_parallel: bool) -> String {
    if sequence_parallel {
        format!("{recompute}, sequence parallel")
    } else {
        recompute.to_string()
    }
}

fn write_csv<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let bytes = report::csv::to_bytes(rows, true)?;
    write_atomic(path, &bytes).with_context(|| format!("writing {}", path.display()))
}

/// A Markdown table and the blank line after it.
fn markdown_table(header: &[&str], rows: &[Vec<String>]) -> String {
    report::markdown::table(header, rows) + "\n"
}
