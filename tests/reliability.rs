//! Sweeps that cannot lose or corrupt results, and bad input refused at load: each case runs
//! the `tandem` binary as a user would and checks its exit status, its message and the files
//! it leaves.

mod common;
use common::{scratch, tandem};

use proptest::prelude::Rng;
use proptest::test_runner::{RngAlgorithm, TestRng};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use tandem::output::{write_atomic, DirLock, LOCK_FILE};
use tandem::search::{markdown_table, CompareRow};

const SUMMARIES: [&str; 5] = [
    "run.toml",
    "points.csv",
    "pareto.csv",
    "best.json",
    "pareto.svg",
];
fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts exit status `code` and a message (on either stream) holding every one of `needles`.
fn expect_exit(out: &Output, code: i32, needles: &[&str]) {
    let err = stderr(out) + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
}

/// A two-block GPT whose design points evaluate in milliseconds.
fn tiny_workload(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("w_{}.toml", name.replace(['/', '.'], "_")));
    std::fs::write(
        &path,
        format!(
            "name = \"{name}\"\nfamily = \"gpt\"\nlayers = 2\nhidden = 256\nheads = 4\n\
             vocab = 1024\nseq_len = 128\nglobal_batch = 16\n"
        ),
    )
    .expect("write workload");
    path
}

/// `arch_specs/phaze-small.toml` narrowed to a few dozen configurations.
fn small_space(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string("arch_specs/phaze-small.toml").expect("space");
    let text = text
        .replace(
            "\"tensor.count\" = { min = 8, max = 64 }",
            "\"tensor.count\" = { min = 8, max = 32 }",
        )
        .replace(
            "\"vector.count\" = { min = 2, max = 16 }",
            "\"vector.count\" = { min = 2, max = 8 }",
        );
    let path = dir.join("space.toml");
    std::fs::write(&path, text).expect("write space");
    path
}

/// The arguments of a small sweep into `out`.
fn sweep_args<'a>(workload: &'a str, space: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "search",
        "--workload",
        workload,
        "--space",
        space,
        "--devices",
        "8",
        "--micro-batch",
        "1,2",
        "--recompute",
        "none,full",
        "--hbm-gib",
        "16",
        "--quiet",
        "--out",
        out,
    ]
}

fn assert_same_summaries(a: &Path, b: &Path) {
    for f in SUMMARIES {
        let (x, y) = (std::fs::read(a.join(f)), std::fs::read(b.join(f)));
        assert!(
            x.as_ref().expect(f) == y.as_ref().expect(f),
            "{f} differs: {} vs {}",
            a.display(),
            b.display()
        );
    }
}

struct Fixture {
    dir: PathBuf,
    /// Removes `dir` when the fixture drops.
    _guard: tempfile::TempDir,
    workload: String,
    space: String,
}

impl Fixture {
    fn new(test: &str) -> Fixture {
        let guard = scratch(test);
        let dir = guard.path().to_path_buf();
        let workload = tiny_workload(&dir, "tiny").display().to_string();
        let space = small_space(&dir).display().to_string();
        Fixture {
            dir,
            _guard: guard,
            workload,
            space,
        }
    }

    fn out(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn sweep(&self, out: &str, extra: &[&str]) -> Output {
        let mut args = sweep_args(&self.workload, &self.space, out);
        args.extend_from_slice(extra);
        tandem(&args)
    }
}

fn data_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("points")
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").expect("write points");
}

#[test]
fn merge_refuses_incomplete_shards_and_merges_them_once_finished() {
    let f = Fixture::new("merge-incomplete");
    let whole = f.out("whole");
    expect_exit(&f.sweep(&whole, &[]), 0, &[]);
    let shards: Vec<String> = (0..3).map(|i| f.out(&format!("s{i}"))).collect();
    for (i, shard) in shards.iter().enumerate() {
        expect_exit(&f.sweep(shard, &["--shard", &format!("{i}/3")]), 0, &[]);
    }
    // Shard 1 killed halfway: its points.csv holds a prefix of its rows.
    let points = Path::new(&shards[1]).join("points.csv");
    let lines = data_lines(&points);
    let kept = lines.len() / 2;
    write_lines(&points, &lines[..kept]);
    let merged = f.out("merged");
    let out = tandem(&[
        "merge", &shards[0], &shards[1], &shards[2], "--out", &merged,
    ]);
    let missing = format!("{} missing", lines.len() - kept);
    expect_exit(
        &out,
        1,
        &[shards[1].as_str(), "shard 1/3 is incomplete", &missing],
    );
    assert!(!Path::new(&merged).join("points.csv").exists());
    // Resumed, the shard completes and the merge equals one run, byte for byte.
    expect_exit(
        &f.sweep(&shards[1], &["--shard", "1/3", "--resume"]),
        0,
        &[],
    );
    expect_exit(
        &tandem(&[
            "merge", &shards[0], &shards[1], &shards[2], "--out", &merged,
        ]),
        0,
        &[],
    );
    assert_same_summaries(Path::new(&whole), Path::new(&merged));
    // Merging into one of the shards would overwrite it.
    let out = tandem(&[
        "merge", &shards[0], &shards[1], &shards[2], "--out", &shards[2],
    ]);
    expect_exit(&out, 1, &["is one of the shards"]);
    // A shard given twice is refused.
    let out = tandem(&[
        "merge", &shards[0], &shards[0], &shards[1], "--out", &merged,
    ]);
    expect_exit(&out, 1, &["given twice"]);
}

#[test]
fn an_output_directory_is_locked_while_a_run_writes_into_it() {
    let f = Fixture::new("lock");
    let out_dir = f.out("o");
    let lock = DirLock::acquire(Path::new(&out_dir)).expect("lock");
    let pid = format!("pid {}", std::process::id());
    expect_exit(
        &f.sweep(&out_dir, &[]),
        1,
        &[&out_dir, &pid, "another tandem run"],
    );
    assert!(!Path::new(&out_dir).join("points.csv").exists());
    // A lock whose holder has gone (its file is still there) is taken over.
    drop(lock);
    assert!(Path::new(&out_dir).join(LOCK_FILE).exists());
    expect_exit(&f.sweep(&out_dir, &[]), 0, &[]);
    // The same sweep started again into the finished directory is refused, not appended.
    expect_exit(&f.sweep(&out_dir, &[]), 1, &["pass --resume"]);
    // A points.csv that lists a point twice is refused on resume.
    let points = Path::new(&out_dir).join("points.csv");
    let mut lines = data_lines(&points);
    lines.insert(3, lines[2].clone());
    write_lines(&points, &lines);
    expect_exit(
        &f.sweep(&out_dir, &["--resume"]),
        1,
        &["line 4", "is listed twice"],
    );
}

/// A lock this process holds a moment longer than its owner (a child spawned by another
/// thread keeps a copy of the descriptor until it execs) is waited for; one it keeps holding
/// is refused after a second, naming this process.
#[test]
fn a_lock_held_by_this_process_is_waited_for_a_moment() {
    let f = Fixture::new("lock-wait");
    let out_dir = f.out("o");
    let dir = Path::new(&out_dir).to_path_buf();
    let lock = DirLock::acquire(&dir).expect("lock");
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(lock);
    });
    let second = DirLock::acquire(&dir).expect("taken once the first is released");
    release.join().expect("release thread");
    let message = DirLock::acquire(&dir).expect_err("still held").to_string();
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );
    drop(second);
}

/// Sets column `column` of data row `row` (0-based, after the header) of a points.csv.
fn edit_cell(path: &Path, row: usize, column: &str, edit: impl Fn(f64) -> f64) {
    let mut reader = csv::Reader::from_path(path).expect("points");
    let header = reader.headers().expect("header").clone();
    let at = header.iter().position(|h| h == column).expect("column");
    let mut records: Vec<csv::StringRecord> =
        reader.records().map(|r| r.expect("record")).collect();
    let value: f64 = records[row][at].parse().expect("a number");
    let mut fields: Vec<String> = records[row].iter().map(str::to_string).collect();
    fields[at] = edit(value).to_string();
    records[row] = csv::StringRecord::from(fields);
    let mut writer = csv::Writer::from_path(path).expect("rewrite");
    writer.write_record(&header).expect("header");
    for r in &records {
        writer.write_record(r).expect("record");
    }
    writer.flush().expect("flush");
}

/// The index of the first `ok` row of a points.csv.
fn first_ok_row(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).expect("points");
    text.lines()
        .skip(1)
        .position(|l| l.contains(",ok,"))
        .expect("an ok row")
}

#[test]
fn tampered_rows_are_refused_on_resume_and_merge() {
    let f = Fixture::new("tamper");
    let whole = f.out("whole");
    expect_exit(&f.sweep(&whole, &[]), 0, &[]);
    let points = Path::new(&whole).join("points.csv");
    let pristine = std::fs::read(&points).expect("points");
    let row = first_ok_row(&points);
    let line = format!("line {}", row + 2);
    for (column, edit, needle) in [
        (
            "throughput_samples_per_s",
            (|v: f64| v * 10.0) as fn(f64) -> f64,
            "is not the global batch",
        ),
        ("mfu", |v: f64| v + 1.0, "outside [0, 1]"),
        ("peak_memory_bytes", |v: f64| v * 1e3, "exceeds the HBM"),
    ] {
        std::fs::write(&points, &pristine).expect("restore");
        edit_cell(&points, row, column, edit);
        expect_exit(
            &f.sweep(&whole, &["--resume"]),
            1,
            &[points.to_str().expect("path"), &line, needle],
        );
        let out = tandem(&["merge", &whole, "--out", &f.out("m")]);
        expect_exit(&out, 1, &[&line, needle]);
    }
    // A row whose throughput and time agree but were both edited is caught by the
    // re-evaluated sample.
    std::fs::write(&points, &pristine).expect("restore");
    edit_cell(&points, row, "throughput_samples_per_s", |v| v * 0.5);
    edit_cell(&points, row, "time_per_batch_s", |v| v * 2.0);
    expect_exit(
        &f.sweep(&whole, &["--resume"]),
        1,
        &["time_per_batch_s", "another model or other inputs"],
    );
}

#[test]
fn workload_names_that_would_be_paths_are_refused() {
    let tmp = scratch("names");
    let dir = tmp.path();
    for (name, reason) in [
        ("../../escaped", "plain name"),
        ("a/b", "plain name"),
        (".hidden", "plain name"),
        ("with space", "plain name"),
        ("", "must not be empty"),
    ] {
        let workload = tiny_workload(dir, name);
        let out = tandem(&["inspect", "--workload", workload.to_str().expect("path")]);
        expect_exit(
            &out,
            1,
            &[workload.to_str().expect("path"), "field `name`", reason],
        );
    }
    let escaped = tiny_workload(dir, "../../escaped");
    let out_dir = dir.join("cmp");
    let out = tandem(&[
        "compare",
        "--workload",
        escaped.to_str().expect("path"),
        "--space",
        "arch_specs/phaze-small.toml",
        "--baseline",
        "arch_specs/phaze-tpuv4-template.toml",
        "--devices",
        "8",
        "--out",
        out_dir.to_str().expect("path"),
    ]);
    expect_exit(&out, 1, &["field `name`"]);
    assert!(!dir.join("escaped").exists() && !out_dir.exists());
}

#[test]
fn interconnect_rules_are_checked_when_the_chip_loads() {
    let tmp = scratch("tiers");
    let dir = tmp.path();
    let a100 = std::fs::read_to_string("arch_specs/a100.toml").expect("a100");
    for (name, edit, field) in [
        (
            "latency0",
            a100.replace("latency_s = 10e-6", "latency_s = 0"),
            "interconnect[1].latency_s",
        ),
        (
            "faster-outer",
            a100.replace(
                "bandwidth_bytes_per_s = 25e9",
                "bandwidth_bytes_per_s = 900e9",
            ),
            "interconnect[1].bandwidth_bytes_per_s",
        ),
        (
            "misordered",
            a100.replace("devices = 65_536", "devices = 4"),
            "interconnect[1].devices",
        ),
    ] {
        assert_ne!(edit, a100, "{name}: the edit applies");
        let chip = dir.join(format!("{name}.toml"));
        std::fs::write(&chip, edit).expect("write chip");
        let chip = chip.to_str().expect("path");
        for args in [
            vec!["area", "--arch", chip],
            vec![
                "plan",
                "--workload",
                "workloads/bert-large.toml",
                "--arch",
                chip,
                "--devices",
                "64",
                "--micro-batch",
                "1",
                "--recompute",
                "none",
            ],
        ] {
            expect_exit(&tandem(&args), 1, &[chip, field]);
        }
    }
}

#[test]
fn held_widths_are_held_exactly() {
    let out = tandem(&[
        "plan",
        "--workload",
        "workloads/bert-large.toml",
        "--arch",
        "arch_specs/phaze-tpuv4-template.toml",
        "--devices",
        "16",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "8",
        "--micro-batch",
        "1",
        "--recompute",
        "none",
        "--json",
    ]);
    expect_exit(&out, 0, &[]);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(plan["dp"], 8, "{plan}");
    assert_eq!(plan["devices_used"], 8, "{plan}");
    for flag in ["--tp", "--pp", "--dp"] {
        let out = tandem(&[
            "plan",
            "--workload",
            "workloads/bert-large.toml",
            "--arch",
            "arch_specs/phaze-tpuv4-template.toml",
            "--devices",
            "16",
            flag,
            "0",
        ]);
        expect_exit(&out, 1, &[flag, "at least 1"]);
    }
}

#[test]
fn changed_settings_are_named_and_the_same_file_is_the_same_input() {
    let f = Fixture::new("settings");
    let out_dir = f.out("o");
    expect_exit(&f.sweep(&out_dir, &["--shard", "0/2"]), 0, &[]);
    let run_toml = std::fs::read(Path::new(&out_dir).join("run.toml")).expect("run.toml");
    expect_exit(
        &f.sweep(&out_dir, &["--shard", "1/2", "--resume"]),
        1,
        &["--shard", "holds shard 0/2, not 1/2"],
    );
    let mut args = sweep_args(&f.workload, &f.space, &out_dir);
    let at = args.iter().position(|a| *a == "8").expect("devices");
    args[at] = "16";
    args.extend(["--shard", "0/2", "--resume"]);
    expect_exit(&tandem(&args), 1, &["--devices: 8 then, 16 now"]);
    // The workload given through another spelling of its path is the same input.
    let dotted = format!(
        "{}/./{}",
        f.dir.display(),
        Path::new(&f.workload)
            .file_name()
            .expect("name")
            .to_str()
            .expect("utf-8")
    );
    let mut args = sweep_args(&dotted, &f.space, &out_dir);
    args.extend(["--shard", "0/2", "--resume"]);
    expect_exit(&tandem(&args), 0, &[]);
    assert_eq!(
        std::fs::read(Path::new(&out_dir).join("run.toml")).expect("run.toml"),
        run_toml,
        "run.toml keeps the first run's spelling"
    );
}

#[test]
fn sizes_and_lists_out_of_range_are_refused() {
    let f = Fixture::new("limits");
    let dag = std::fs::read_to_string("examples/dag-workload.json").expect("dag");
    let mut value: serde_json::Value = serde_json::from_str(&dag).expect("json");
    value["layers"][0]["params"] = serde_json::json!(u64::MAX);
    let path = f.dir.join("huge.json");
    std::fs::write(&path, value.to_string()).expect("write dag");
    let path = path.to_str().expect("path");
    expect_exit(
        &tandem(&["inspect", "--workload", path]),
        1,
        &[path, "layers[0].params", "18446744073709551615"],
    );
    // A chain longer than the plan search takes says what the limit is.
    let long = f.dir.join("long.toml");
    std::fs::write(
        &long,
        "name = \"long\"\nfamily = \"gpt\"\nlayers = 4094\nhidden = 64\nheads = 1\nvocab = 64\n\
         seq_len = 8\nglobal_batch = 8\n",
    )
    .expect("write");
    let out = tandem(&[
        "plan",
        "--workload",
        long.to_str().expect("path"),
        "--arch",
        "arch_specs/a100.toml",
        "--devices",
        "8",
        "--micro-batch",
        "1",
        "--recompute",
        "none",
        "--tp",
        "1",
    ]);
    expect_exit(&out, 3, &["4096 layers in a chain", "at most 4095"]);
    let out_dir = f.out("o");
    for (flag, value, needle) in [
        ("--micro-batch", "1,1", "1 is given twice"),
        ("--hbm-gib", "16,16", "16 GiB is given twice"),
        ("--micro-batch", "100000", "exceeds the global batch 16"),
        ("--hbm-gib", "1e30", "1 PiB"),
        ("--hbm-gib", "-3", "positive"),
    ] {
        let mut args = sweep_args(&f.workload, &f.space, &out_dir);
        let at = args.iter().position(|a| *a == flag).expect("flag") + 1;
        args[at] = value;
        expect_exit(&tandem(&args), 1, &[flag, needle]);
    }
    assert!(!Path::new(&out_dir).join("points.csv").exists());
}

#[test]
fn summaries_are_replaced_whole_or_not_at_all() {
    let tmp = scratch("atomic");
    let dir = tmp.path();
    let file = dir.join("best.json");
    write_atomic(&file, b"first").expect("write");
    write_atomic(&file, b"second").expect("overwrite");
    assert_eq!(std::fs::read(&file).expect("read"), b"second");
    // A write that cannot land (the target is a directory) leaves the target as it was and
    // no temporary file behind.
    let target = dir.join("taken");
    std::fs::create_dir_all(target.join("inside")).expect("dir");
    assert!(write_atomic(&target, b"x").is_err());
    assert!(target.join("inside").is_dir());
    let names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // A sweep leaves only its own files.
    let f = Fixture::new("atomic-sweep");
    let out_dir = f.out("o");
    expect_exit(&f.sweep(&out_dir, &[]), 0, &[]);
    let mut left: Vec<String> = std::fs::read_dir(&out_dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            ".tandem.lock",
            "best.json",
            "pareto.csv",
            "pareto.svg",
            "points.csv",
            "run.toml",
            "status.json"
        ]
    );
    // An output under a regular file names its path.
    let blocked = dir.join("best.json").join("o");
    let blocked = blocked.to_str().expect("path");
    expect_exit(&f.sweep(blocked, &[]), 1, &[blocked]);
}

#[test]
fn empty_or_absurd_kernel_measurements_are_refused() {
    let tmp = scratch("kernels");
    let dir = tmp.path();
    let kernels = dir.join("k");
    std::fs::create_dir_all(&kernels).expect("dir");
    let reference = Path::new("data/reference/a100_kernels");
    for entry in std::fs::read_dir(reference).expect("kernels") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, kernels.join(path.file_name().expect("name"))).expect("copy");
    }
    let empty = kernels.join("matmul_empty.csv");
    std::fs::write(&empty, "").expect("empty");
    let k = kernels.to_str().expect("path");
    for command in ["validate", "calibrate"] {
        let out_file = dir.join("out.toml");
        let mut args = vec![
            command,
            "--arch",
            "arch_specs/a100.toml",
            if command == "validate" {
                "--kernels"
            } else {
                "--measurements"
            },
            k,
        ];
        if command == "calibrate" {
            args.extend(["--out", out_file.to_str().expect("path")]);
        }
        expect_exit(
            &tandem(&args),
            1,
            &[empty.to_str().expect("path"), "no measurements"],
        );
    }
    std::fs::write(&empty, "1e308,1024,1024,0.5ms,x\n").expect("huge");
    expect_exit(
        &tandem(&["validate", "--arch", "arch_specs/a100.toml", "--kernels", k]),
        1,
        &[empty.to_str().expect("path"), "row 1, M", "at most"],
    );
}

#[test]
fn markdown_cells_escape_pipes() {
    let chip =
        tandem::arch::load_chip(Path::new("arch_specs/phaze-tpuv4-template.toml")).expect("chip");
    let mut row = CompareRow::new("w", "a|b".into(), &chip, 32 << 30, true);
    row.chip = "chip|x".into();
    row.note = "see | here".into();
    let md = markdown_table(&[row]);
    let line = md.lines().nth(2).expect("row");
    assert!(
        line.starts_with("| a\\|b | chip\\|x |") && line.ends_with("| see \\| here |"),
        "{line}"
    );
    // Each data line keeps the header's column count once escapes are discounted.
    let columns = |l: &str| l.replace("\\|", "").matches('|').count();
    assert_eq!(columns(line), columns(md.lines().next().expect("header")));
}

#[test]
fn plan_csv_appends_only_under_its_own_header() {
    let tmp = scratch("csv");
    let dir = tmp.path();
    let file = dir.join("rows.csv");
    std::fs::write(&file, "a,b\n1,2\n").expect("foreign csv");
    let f = file.to_str().expect("path");
    let args = [
        "plan",
        "--workload",
        "workloads/bert-large.toml",
        "--arch",
        "arch_specs/phaze-tpuv4-template.toml",
        "--devices",
        "8",
        "--micro-batch",
        "1",
        "--recompute",
        "none",
        "--csv",
        f,
    ];
    expect_exit(&tandem(&args), 1, &[f, "header"]);
    assert_eq!(std::fs::read_to_string(&file).expect("kept"), "a,b\n1,2\n");
    std::fs::remove_file(&file).expect("rm");
    expect_exit(&tandem(&args), 0, &[]);
    expect_exit(&tandem(&args), 0, &[]);
    assert_eq!(
        std::fs::read_to_string(&file)
            .expect("rows")
            .lines()
            .count(),
        3
    );
}

#[test]
fn collect_py_helps_without_pytorch_and_names_what_is_missing() {
    let python = |args: &[&str]| Command::new("python3").args(args).output();
    let Ok(help) = python(&["calibration/collect.py", "--help"]) else {
        panic!("python3 is needed to check calibration/collect.py");
    };
    assert!(help.status.success(), "{}", stderr(&help));
    assert!(String::from_utf8_lossy(&help.stdout).contains("--out"));
    let has_torch = python(&["-c", "import torch"]).is_ok_and(|o| o.status.success());
    if !has_torch {
        let tmp = scratch("collect");
        let dir = tmp.path();
        let out = python(&[
            "calibration/collect.py",
            "--out",
            dir.to_str().expect("path"),
        ])
        .expect("run");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("PyTorch is not installed") && err.contains("pip install torch"));
    }
}

/// Kills a running command after `delay`, then waits for it.
fn run_killed_after(args: &[&str], delay: Duration) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    std::thread::sleep(delay);
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills sweeps at random moments (20 seeds), resumes them and compares every file with an
/// uninterrupted run; then the same for a set of three shards, merged.
#[test]
fn sweeps_killed_at_random_moments_resume_to_the_same_bytes() {
    let f = Fixture::new("fault");
    let whole = f.out("whole");
    let started = std::time::Instant::now();
    expect_exit(&f.sweep(&whole, &["--no-prune", "--threads", "1"]), 0, &[]);
    let run_ms = (started.elapsed().as_millis() as u64).max(20);
    let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]);
    for seed in 0..20 {
        let out = f.out(&format!("k{seed}"));
        let mut args = sweep_args(&f.workload, &f.space, &out);
        args.extend(["--no-prune", "--threads", "1"]);
        run_killed_after(&args, Duration::from_millis(rng.next_u64() % run_ms));
        if Path::new(&out).join("run.toml").exists() {
            args.push("--resume");
        }
        expect_exit(&tandem(&args), 0, &[]);
        assert_same_summaries(Path::new(&whole), Path::new(&out));
    }
    let shards: Vec<String> = (0..3).map(|i| f.out(&format!("shard{i}"))).collect();
    for (i, shard) in shards.iter().enumerate() {
        let index = format!("{i}/3");
        let mut args = sweep_args(&f.workload, &f.space, shard);
        args.extend(["--no-prune", "--threads", "1", "--shard", &index]);
        run_killed_after(&args, Duration::from_millis(rng.next_u64() % run_ms));
        if Path::new(shard).join("run.toml").exists() {
            args.push("--resume");
        }
        expect_exit(&tandem(&args), 0, &[]);
    }
    let merged = f.out("merged");
    expect_exit(
        &tandem(&[
            "merge", &shards[0], &shards[1], &shards[2], "--out", &merged,
        ]),
        0,
        &[],
    );
    assert_same_summaries(Path::new(&whole), Path::new(&merged));
}
