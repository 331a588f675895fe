//! Baselines against co-design (docs/design.md §8): the joint search is never worse than the
//! rows it contains, and the fixed-plan row is exactly `tandem plan` with the same options.

use std::path::{Path, PathBuf};
use std::process::Command;
use tandem::arch::{load_chip, SearchSpace};
use tandem::placement::{RecomputeMode, ZeroStage};
use tandem::schedule::SolverOptions;
use tandem::search::{BaselinePlans, CompareRow, Comparison, COMPARE_CSV, COMPARE_MD, COMPARE_SVG};

/// A fresh directory for one test, removed when the returned guard drops.
fn scratch(test: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tandem-compare-{test}-"))
        .tempdir()
        .expect("scratch dir")
}

/// A small GPT, a narrowed PHAZE space, one of its chips as a baseline file, a foreign chip
/// (the A100) and a plans file holding t = 1, p = 2, d = 4 on 8 devices.
fn inputs(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let workload = dir.join("tiny.toml");
    std::fs::write(
        &workload,
        "name = \"tiny\"\nfamily = \"gpt\"\nlayers = 4\nhidden = 256\nheads = 4\nvocab = 1024\n\
         seq_len = 128\nglobal_batch = 32\n",
    )
    .expect("workload");
    let text = std::fs::read_to_string("arch_specs/phaze.toml").expect("phaze.toml");
    let text = text
        .replace("{ min = 1, max = 4096 }", "{ min = 2, max = 16 }")
        .replace(
            "\"tensor.rows\" = { min = 2, max = 256 }",
            "\"tensor.rows\" = { min = 64, max = 128 }",
        )
        .replace(
            "\"tensor.cols\" = { min = 2, max = 256 }",
            "\"tensor.cols\" = { min = 64, max = 64 }",
        )
        .replace(
            "\"glb.bytes\" = { min = 2_097_152, max = 134_217_728 }",
            "\"glb.bytes\" = { min = 33_554_432, max = 33_554_432 }",
        );
    let space = dir.join("space.toml");
    std::fs::write(&space, text).expect("space");
    let loaded = SearchSpace::load(&space).expect("valid space");
    assert!(loaded.len() >= 4, "{} configurations", loaded.len());
    let mut chip = loaded.get(loaded.len() / 2).expect("a configuration");
    chip.name = "inside".into();
    let chip_path = dir.join("inside.toml");
    std::fs::write(&chip_path, toml::to_string(&chip).expect("TOML")).expect("chip");
    let plans = dir.join("plans.toml");
    std::fs::write(
        &plans,
        "devices = 8\n[plans]\ntiny = { tp = 1, pp = 2, dp = 4 }\n",
    )
    .expect("plans");
    (workload, space, chip_path, plans)
}

fn thr(row: &CompareRow) -> f64 {
    row.throughput_samples_per_s.unwrap_or(0.0)
}

#[test]
fn co_design_is_never_worse_than_the_rows_it_contains() {
    let tmp = scratch("never-worse");
    let dir = tmp.path();
    let (workload, space, chip, plans) = inputs(dir);
    let inside = load_chip(&chip).expect("chip loads back");
    let comparison = Comparison {
        space_path: space.clone(),
        space: SearchSpace::load(&space).expect("space"),
        baselines: vec![
            inside.clone(),
            load_chip(Path::new("arch_specs/a100.toml")).expect("a100"),
        ],
        plans: BaselinePlans::load(&plans).expect("plans"),
        devices: 8,
        micro_batches: vec![1, 2],
        recompute: vec![RecomputeMode::None, RecomputeMode::Full],
        hbm_bytes: vec![inside.hbm.capacity_bytes],
        zero: vec![ZeroStage::Replicated],
        solver: SolverOptions::default(),
        resume: false,
        progress: false,
    };
    let w = tandem::workload::Workload::load(&workload).expect("workload");
    let rows = comparison
        .compare_workload(&w, &workload, &dir.join("sweep"))
        .expect("comparison");
    let names: Vec<&str> = rows.iter().map(|r| r.row.as_str()).collect();
    assert_eq!(
        names,
        [
            "inside fixed plan",
            "inside searched plan",
            "a100 fixed plan",
            "a100 searched plan",
            "decoupled",
            "hardware-first",
            "co-design",
            "co-design ≤ inside area",
            "co-design ≤ inside power",
            "fixed-plan co-design"
        ]
    );
    let co = &rows[6];
    // Held to the reference baseline's area, co-design still contains that chip (it is in
    // the space): no larger than it, at least as fast as it with a searched plan, and no
    // faster than co-design unrestricted.
    let iso = &rows[7];
    assert!(iso.area_mm2 <= rows[0].area_mm2, "{iso:?}");
    assert!(thr(iso) >= thr(&rows[1]) * (1.0 - 1e-12), "{iso:?}");
    assert!(thr(iso) <= thr(co) * (1.0 + 1e-12), "{iso:?}");
    // Held to its peak power, likewise: the capped sweep still holds the chip.
    let iso_power = &rows[8];
    assert!(
        iso_power.peak_power_w <= rows[0].peak_power_w,
        "{iso_power:?}"
    );
    assert!(
        thr(iso_power) >= thr(&rows[1]) * (1.0 - 1e-12),
        "{iso_power:?}"
    );
    assert!(thr(iso_power) <= thr(co) * (1.0 + 1e-12), "{iso_power:?}");
    assert!(dir.join("tiny.iso-power").join("run.toml").exists());
    // Held to the baseline's fixed plan, the sweep still finds the baseline chip's point (it
    // is in the space): no slower than the baseline with that plan, no faster than co-design.
    let fixed_co = &rows[9];
    assert_eq!(
        (fixed_co.tp, fixed_co.pp, fixed_co.dp),
        (Some(1), Some(2), Some(4))
    );
    assert!(
        thr(fixed_co) >= thr(&rows[0]) * (1.0 - 1e-12),
        "{fixed_co:?}"
    );
    assert!(co.throughput_samples_per_s.is_some(), "{co:?}");
    for r in &rows {
        if r.in_space {
            assert!(
                thr(co) >= thr(r) * (1.0 - 1e-12),
                "{} beats co-design: {} > {}",
                r.row,
                thr(r),
                thr(co)
            );
        } else {
            assert_eq!(r.note, "outside the searched space", "{r:?}");
        }
    }
    // The fixed plan is held; the searched plan is at least as fast on the same chip.
    assert_eq!(
        (rows[0].tp, rows[0].pp, rows[0].dp),
        (Some(1), Some(2), Some(4))
    );
    assert!(thr(&rows[1]) >= thr(&rows[0]) * (1.0 - 1e-12));
    assert_eq!(rows[0].speedup, Some(1.0));
    assert!(rows[0].in_space && !rows[2].in_space);
}

#[test]
fn fixed_plan_row_equals_tandem_plan_and_the_cli_writes_the_report() {
    let tmp = scratch("cli");
    let dir = tmp.path();
    let (workload, space, chip, plans) = inputs(dir);
    let out = dir.join("out");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(args)
            .output()
            .expect("run")
    };
    let compare_args = [
        "compare",
        "--workload",
        workload.to_str().expect("utf-8"),
        "--space",
        space.to_str().expect("utf-8"),
        "--baseline",
        chip.to_str().expect("utf-8"),
        "--plans",
        plans.to_str().expect("utf-8"),
        "--micro-batch",
        "1,2",
        "--out",
        out.to_str().expect("utf-8"),
    ];
    let o = run(&compare_args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in [COMPARE_CSV, COMPARE_MD, COMPARE_SVG] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let first = std::fs::read(out.join(COMPARE_CSV)).expect("compare.csv");
    // A second run finds the sweeps: continuing them takes --resume, and gives the same table.
    let again = run(&compare_args);
    assert_eq!(again.status.code(), Some(1));
    let message = String::from_utf8_lossy(&again.stderr);
    assert!(
        message.contains("--resume") && message.contains("sweeps"),
        "{message}"
    );
    let resumed = run(&[&compare_args[..], &["--resume"]].concat());
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(
        std::fs::read(out.join(COMPARE_CSV)).expect("compare.csv"),
        first
    );
    let mut reader = csv::Reader::from_path(out.join(COMPARE_CSV)).expect("compare.csv");
    let rows: Vec<CompareRow> = reader
        .deserialize()
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(rows.len(), 8);
    let o = run(&[
        "plan",
        "--workload",
        workload.to_str().expect("utf-8"),
        "--arch",
        chip.to_str().expect("utf-8"),
        "--devices",
        "8",
        "--tp",
        "1",
        "--pp",
        "2",
        "--dp",
        "4",
        "--micro-batch",
        "1,2",
        "--recompute",
        "none,full",
        "--zero",
        "0",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).expect("plan JSON");
    let expected = plan["time_per_batch_s"].as_f64().expect("time_per_batch_s");
    assert_eq!(rows[0].time_per_batch_s, Some(expected), "{plan}");
    assert_eq!(
        rows[0].micro_batch.map(u64::from),
        plan["micro_batch"].as_u64()
    );
    // Bad plans files are rejected with the field named.
    std::fs::write(
        &plans,
        "devices = 8\n[plans]\ntiny = { tp = 4, pp = 2, dp = 4 }\n",
    )
    .expect("plans");
    let o = run(&[
        "compare",
        "--workload",
        workload.to_str().expect("utf-8"),
        "--space",
        space.to_str().expect("utf-8"),
        "--baseline",
        chip.to_str().expect("utf-8"),
        "--plans",
        plans.to_str().expect("utf-8"),
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("plans.tiny") && stderr.contains("exceeds"),
        "{stderr}"
    );
}
