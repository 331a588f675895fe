//! Input fuzzing: the shipped input files (workloads, chips, a search space, layer costs, a
//! DAG workload, run plans) mutated one field at a time — removed, zero, negative, huge, of
//! the wrong type — and fed to every subcommand that reads them. Whatever the mutation, the
//! binary exits 0, 1, 2 or 3 without panicking, within a time limit, and every exit-1 message
//! names the mutated file.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Cases in all: the mutations of every file, thinned evenly to about this many.
const TARGET_CASES: usize = 520;
/// No single command may take longer (a hang is a failure).
const COMMAND_LIMIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug)]
enum Format {
    Toml,
    Json,
    Csv,
}

/// A shipped input and the commands that read it (`{}` is the mutated file, `{dir}` the
/// directory holding it, `{out}` a fresh output directory).
struct Input {
    path: &'static str,
    format: Format,
    commands: &'static [&'static [&'static str]],
    /// Keep one mutation in this many (the expensive commands run fewer cases).
    thin: usize,
    /// The part of the shipped file that is mutated (all of it, or a sample of its rows).
    sample: fn(&str) -> String,
    /// The name the mutated file must have in its own directory (inputs read by directory).
    file_name: Option<&'static str>,
}

fn whole(text: &str) -> String {
    text.to_string()
}

/// The header and the first row of each kernel of a collect.py CSV.
fn one_row_per_kernel(text: &str) -> String {
    let mut lines = text.lines();
    let header = lines.next().expect("header");
    let kernel = header
        .split(',')
        .position(|c| c == "kernel")
        .expect("kernel column");
    let mut seen = std::collections::BTreeSet::new();
    let rows: Vec<&str> = lines
        .filter(|l| seen.insert(l.split(',').nth(kernel).unwrap_or_default().to_string()))
        .collect();
    std::iter::once(header)
        .chain(rows)
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The header and the first two rows of a CSV whose provenance is in `#` comment lines.
fn first_rows_without_comments(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .take(3)
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

const INPUTS: &[Input] = &[
    Input {
        path: "workloads/bert-large.toml",
        format: Format::Toml,
        commands: &[
            &["inspect", "--workload", "{}"],
            &[
                "schedule",
                "--workload",
                "{}",
                "--arch",
                "arch_specs/a100.toml",
            ],
            &[
                "plan",
                "--workload",
                "{}",
                "--arch",
                "arch_specs/a100.toml",
                "--devices",
                "8",
                "--micro-batch",
                "1",
                "--recompute",
                "none",
            ],
        ],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "workloads/llama2-7b.toml",
        format: Format::Toml,
        commands: &[&["inspect", "--workload", "{}"]],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "workloads/mixtral-8x7b.toml",
        format: Format::Toml,
        commands: &[&["inspect", "--workload", "{}"]],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "workloads/palm-540b.toml",
        format: Format::Toml,
        commands: &[&["inspect", "--workload", "{}"]],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "examples/dag-workload.json",
        format: Format::Json,
        commands: &[
            &["inspect", "--workload", "{}"],
            &[
                "plan",
                "--workload",
                "{}",
                "--arch",
                "arch_specs/a100.toml",
                "--devices",
                "4",
                "--micro-batch",
                "1",
                "--recompute",
                "none",
            ],
        ],
        thin: 3,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "arch_specs/a100.toml",
        format: Format::Toml,
        commands: &[
            &["area", "--arch", "{}"],
            &[
                "plan",
                "--workload",
                "workloads/bert-large.toml",
                "--arch",
                "{}",
                "--devices",
                "16",
                "--micro-batch",
                "1",
                "--recompute",
                "none",
            ],
        ],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "arch_specs/phaze-tpuv4-template.toml",
        format: Format::Toml,
        commands: &[
            &["area", "--arch", "{}"],
            &[
                "plan",
                "--workload",
                "workloads/bert-large.toml",
                "--arch",
                "{}",
                "--devices",
                "16",
                "--micro-batch",
                "1",
                "--recompute",
                "none",
                "--no-ilp",
            ],
        ],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "arch_specs/phaze-small.toml",
        format: Format::Toml,
        commands: &[&[
            "search",
            "--workload",
            "workloads/bert-large.toml",
            "--space",
            "{}",
            "--devices",
            "8",
            "--micro-batch",
            "1",
            "--recompute",
            "none",
            "--no-ilp",
            "--quiet",
            "--out",
            "{out}",
        ]],
        thin: 4,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "examples/layer-costs.json",
        format: Format::Json,
        commands: &[&["place", "--layers", "{}"]],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "calibration/published_run_plans.csv",
        format: Format::Csv,
        commands: &[&[
            "validate",
            "--arch",
            "arch_specs/a100.toml",
            "--runs",
            "data/reference/published_runs.csv",
            "--run-plans",
            "{}",
        ]],
        thin: 2,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "data/reference/korthikanti2022_runs.csv",
        format: Format::Csv,
        commands: &[&["validate", "--arch", "arch_specs/a100.toml", "--runs", "{}"]],
        thin: 2,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "data/reference/korthikanti2022_layer_times.csv",
        format: Format::Csv,
        commands: &[&[
            "validate",
            "--arch",
            "arch_specs/a100.toml",
            "--layer-times",
            "{}",
        ]],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "workloads/plans/phaze.toml",
        format: Format::Toml,
        commands: &[&[
            "compare",
            "--workload",
            "workloads/bert-large.toml",
            "--space",
            "arch_specs/phaze-small.toml",
            "--baseline",
            "arch_specs/phaze-tpuv4-template.toml",
            "--plans",
            "{}",
            "--devices",
            "64",
            "--micro-batch",
            "1",
            "--recompute",
            "none",
            "--hbm-gib",
            "32",
            "--out",
            "{out}",
        ]],
        thin: 1,
        sample: whole,
        file_name: None,
    },
    Input {
        path: "calibration/data/h200/kernels.csv",
        format: Format::Csv,
        commands: &[
            &[
                "validate",
                "--arch",
                "arch_specs/h200.toml",
                "--kernels",
                "{dir}",
            ],
            &[
                "calibrate",
                "--arch",
                "arch_specs/h200.toml",
                "--measurements",
                "{dir}",
                "--out",
                "{out}.toml",
            ],
        ],
        thin: 12,
        sample: one_row_per_kernel,
        file_name: Some("kernels.csv"),
    },
    Input {
        path: "data/reference/flash_attention/a100/attention_fa2.csv",
        format: Format::Csv,
        commands: &[
            &[
                "validate",
                "--arch",
                "arch_specs/a100.toml",
                "--kernels",
                "{dir}",
            ],
            &[
                "calibrate",
                "--arch",
                "arch_specs/a100.toml",
                "--measurements",
                "{dir}",
                "--out",
                "{out}.toml",
            ],
        ],
        thin: 1,
        sample: first_rows_without_comments,
        file_name: Some("attention_fa2.csv"),
    },
];

/// What a mutation does to one field.
#[derive(Clone, Copy, Debug)]
enum Mutation {
    Remove,
    Zero,
    Negative,
    Huge,
    Tiny,
    Text,
    Empty,
}

const MUTATIONS: [Mutation; 7] = [
    Mutation::Remove,
    Mutation::Zero,
    Mutation::Negative,
    Mutation::Huge,
    Mutation::Tiny,
    Mutation::Text,
    Mutation::Empty,
];

/// A path to a leaf of a JSON-like tree: object keys and array indices.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn leaves(value: &serde_json::Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                at.push(Step::Key(k.clone()));
                leaves(v, at, out);
                at.pop();
            }
        }
        serde_json::Value::Array(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                at.push(Step::Index(i));
                leaves(v, at, out);
                at.pop();
            }
        }
        _ => out.push(at.clone()),
    }
}

fn mutated(value: &serde_json::Value, path: &[Step], mutation: Mutation) -> serde_json::Value {
    let mut value = value.clone();
    let (last, parents) = path.split_last().expect("a leaf below the root");
    let mut node = &mut value;
    for step in parents {
        node = match step {
            Step::Key(k) => &mut node[k.as_str()],
            Step::Index(i) => &mut node[*i],
        };
    }
    let replacement = match mutation {
        Mutation::Remove => None,
        Mutation::Zero => Some(serde_json::json!(0)),
        Mutation::Negative => Some(serde_json::json!(-3)),
        Mutation::Huge => Some(serde_json::json!(1e308)),
        Mutation::Tiny => Some(serde_json::json!(1e-300)),
        Mutation::Text => Some(serde_json::json!("x")),
        Mutation::Empty => Some(serde_json::json!([])),
    };
    match (last, replacement) {
        (Step::Key(k), None) => {
            node.as_object_mut().expect("object").remove(k);
        }
        (Step::Index(i), None) => {
            node.as_array_mut().expect("array").remove(*i);
        }
        (Step::Key(k), Some(v)) => node[k.as_str()] = v,
        (Step::Index(i), Some(v)) => node[*i] = v,
    }
    value
}

/// Every single-field mutation of a TOML or JSON file, as file text.
fn tree_mutations(text: &str, format: Format) -> Vec<(String, String)> {
    let value: serde_json::Value = match format {
        Format::Toml => {
            let toml: toml::Value = toml::from_str(text).expect("shipped TOML parses");
            serde_json::to_value(toml).expect("TOML as a tree")
        }
        _ => serde_json::from_str(text).expect("shipped JSON parses"),
    };
    let mut paths = Vec::new();
    leaves(&value, &mut Vec::new(), &mut paths);
    let mut out = Vec::new();
    for path in &paths {
        let label: Vec<String> = path
            .iter()
            .map(|s| match s {
                Step::Key(k) => k.clone(),
                Step::Index(i) => i.to_string(),
            })
            .collect();
        for mutation in MUTATIONS {
            let tree = mutated(&value, path, mutation);
            let text = match format {
                // TOML has no null and needs tables after values: JSON's tree, re-serialised.
                Format::Toml => match serde_json::from_value::<toml::Value>(tree)
                    .ok()
                    .and_then(|v| toml::to_string(&v).ok())
                {
                    Some(text) => text,
                    None => continue,
                },
                _ => tree.to_string(),
            };
            out.push((format!("{} {mutation:?}", label.join(".")), text));
        }
    }
    out
}

/// Every single-cell mutation of a CSV file (comment lines kept), as file text.
fn csv_mutations(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let data: Vec<usize> = (0..lines.len())
        .filter(|&i| !lines[i].starts_with('#'))
        .collect();
    let mut out = Vec::new();
    for &line in &data {
        let cells: Vec<&str> = lines[line].split(',').collect();
        for (c, _) in cells.iter().enumerate() {
            for replacement in ["", "0", "-3", "1e308", "x", "a,b"] {
                let mut edited = cells.clone();
                edited[c] = replacement;
                let mut all = lines.clone();
                let joined = edited.join(",");
                all[line] = &joined;
                out.push((
                    format!("line {} cell {c} = `{replacement}`", line + 1),
                    all.join("\n") + "\n",
                ));
            }
        }
        let mut all = lines.clone();
        all.remove(line);
        out.push((format!("line {} removed", line + 1), all.join("\n") + "\n"));
    }
    out
}

struct Case {
    input: &'static Input,
    label: String,
    text: String,
}

fn cases() -> Vec<Case> {
    let mut all: Vec<Case> = Vec::new();
    for input in INPUTS {
        let text = (input.sample)(&std::fs::read_to_string(input.path).expect("shipped input"));
        let mutations = match input.format {
            Format::Csv => csv_mutations(&text),
            format => tree_mutations(&text, format),
        };
        all.extend(
            mutations
                .into_iter()
                .step_by(input.thin)
                .map(|(label, text)| Case { input, label, text }),
        );
    }
    // Evenly spaced, TARGET_CASES of them (all when there are fewer).
    let total = all.len();
    let keep: Vec<usize> = (0..TARGET_CASES.min(total))
        .map(|i| i * total / TARGET_CASES.min(total))
        .collect();
    all.into_iter()
        .enumerate()
        .filter(|(i, _)| keep.binary_search(i).is_ok())
        .map(|(_, case)| case)
        .collect()
}

/// Runs one command; returns (exit code, combined output), failing on a hang or a signal.
fn run(args: &[String], what: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tandem");
    let started = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if started.elapsed() > COMMAND_LIMIT {
            let _ = child.kill();
            panic!("{what}: still running after {COMMAND_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().expect("output");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let code = out
        .status
        .code()
        .unwrap_or_else(|| panic!("{what}: killed by a signal: {text}"));
    (code, text)
}

/// Runs the case's commands; returns their exit codes and what went wrong, one line each.
fn check(case: &Case, dir: &Path, n: usize) -> (Vec<i32>, Vec<String>) {
    let ext = Path::new(case.input.path)
        .extension()
        .and_then(|e| e.to_str())
        .expect("extension");
    let stem = Path::new(case.input.path)
        .file_stem()
        .and_then(|e| e.to_str())
        .expect("stem");
    let file: PathBuf = match case.input.file_name {
        Some(name) => {
            let own = dir.join(format!("{stem}-{n}"));
            std::fs::create_dir_all(&own).expect("case dir");
            own.join(name)
        }
        None => dir.join(format!("{stem}-{n}.{ext}")),
    };
    std::fs::write(&file, &case.text).expect("write mutated input");
    let file_text = file.display().to_string();
    let dir_text = file.parent().expect("parent").display().to_string();
    let mut failures = Vec::new();
    let mut codes = Vec::new();
    for command in case.input.commands {
        let out_dir = dir.join(format!("out-{n}"));
        let args: Vec<String> = command
            .iter()
            .map(|a| match *a {
                "{}" => file_text.clone(),
                "{dir}" => dir_text.clone(),
                "{out}" => out_dir.display().to_string(),
                "{out}.toml" => format!("{}.toml", out_dir.display()),
                other => other.to_string(),
            })
            .collect();
        let what = format!(
            "{} ({}): tandem {}",
            case.input.path,
            case.label,
            args.join(" ")
        );
        let (code, text) = run(&args, &what);
        codes.push(code);
        let first_line = text.lines().next().unwrap_or_default();
        if !matches!(code, 0..=3) {
            failures.push(format!("{what}: exit {code}: {first_line}"));
        } else if text.contains("panicked") {
            failures.push(format!("{what}: panicked: {text}"));
        } else if code == 1 && !text.contains(&file_text) {
            failures.push(format!(
                "{what}: the exit-1 message does not name the mutated file: {first_line}"
            ));
        }
    }
    (codes, failures)
}

#[test]
fn mutated_inputs_exit_cleanly_and_name_the_file() {
    let tmp = tempfile::Builder::new()
        .prefix("tandem-fuzz-")
        .tempdir()
        .expect("scratch dir");
    let dir = tmp.path();
    let cases = cases();
    assert!(cases.len() >= 500, "only {} cases", cases.len());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = cases.len().div_ceil(threads);
    let results: Vec<(Vec<i32>, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .chunks(chunk)
            .enumerate()
            .map(|(t, part)| {
                scope.spawn(move || {
                    part.iter()
                        .enumerate()
                        .map(|(i, case)| check(case, dir, t * chunk + i))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("fuzz thread"))
            .collect()
    });
    let failures: Vec<&String> = results.iter().flat_map(|(_, f)| f).collect();
    let codes: Vec<i32> = results
        .iter()
        .flat_map(|(c, _)| c.iter().copied())
        .collect();
    let count = |code: i32| codes.iter().filter(|&&c| c == code).count();
    eprintln!(
        "{} cases, {} commands: exit 0 {}, 1 {}, 2 {}, 3 {}",
        cases.len(),
        codes.len(),
        count(0),
        count(1),
        count(2),
        count(3)
    );
    // The mutations reach past loading: some inputs stay acceptable and run to the end.
    assert!(
        count(0) * 10 >= codes.len(),
        "few mutated inputs ran to the end"
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
