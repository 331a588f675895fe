//! Baselines against co-design (docs/design.md §8): the joint search is never worse than the
//! rows it contains, and the fixed-plan row is exactly `tandem plan` with the same options.

mod common;
use common::scratch;

use std::path::{Path, PathBuf};
use std::process::Command;
use tandem::arch::{area_breakdown, load_chip, SearchSpace};
use tandem::cost::peak_power_w;
use tandem::placement::{RecomputeMode, ZeroStage};
use tandem::schedule::SolverOptions;
use tandem::search::{
    read_points, BaselinePlans, CompareRow, Comparison, DesignRow, Objective, COMPARE_CSV,
    COMPARE_MD, COMPARE_SVG, POINTS_CSV,
};

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
        objective: Objective::Throughput,
        resume: false,
        progress: false,
        space_memo: Default::default(),
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
            "co-design ≤ a100 area",
            "co-design ≤ a100 power",
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
    // Held to its peak power, likewise: the sweep's points under that power still hold the chip.
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
    // One sweep answers it: the co-design sweep keeps each baseline's power as a level.
    assert!(!dir.join("sweep.iso-power.inside").exists());
    let run_toml = std::fs::read_to_string(dir.join("sweep").join("run.toml")).expect("run.toml");
    assert!(run_toml.contains("power_levels_w"), "{run_toml}");
    // Held to the baseline's fixed plan, the sweep still finds the baseline chip's point (it
    // is in the space): no slower than the baseline with that plan, no faster than co-design.
    let fixed_co = &rows[11];
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

/// The best `ok` row of `rows` by `objective` (ties to the lower point id) among those
/// `keep` accepts: the brute-force choice.
fn best_by(
    rows: &[DesignRow],
    objective: Objective,
    keep: impl Fn(&DesignRow) -> bool,
) -> Option<&DesignRow> {
    rows.iter()
        .filter(|r| r.plan().is_some() && keep(r))
        .max_by(|a, b| {
            let score = |r: &DesignRow| objective.score(r).expect("ok row");
            score(a).total_cmp(&score(b)).then(b.point.cmp(&a.point))
        })
}

/// A comparison row is the design point `point` of a sweep: same chip, HBM, micro-batch,
/// recompute and plan numbers.
fn assert_row_is_point(row: &CompareRow, point: &DesignRow) {
    let plan = point.plan().expect("ok row");
    assert_eq!(row.chip, point.arch, "{row:?} vs {point:?}");
    assert_eq!(row.hbm_bytes, point.hbm_bytes, "{row:?} vs {point:?}");
    assert_eq!(row.micro_batch, point.micro_batch, "{row:?} vs {point:?}");
    assert_eq!(row.recompute, point.recompute, "{row:?} vs {point:?}");
    assert_eq!(row.area_mm2, point.area_mm2, "{row:?} vs {point:?}");
    assert_eq!(
        row.throughput_samples_per_s,
        Some(plan.throughput_samples_per_s),
        "{row:?} vs {point:?}"
    );
    assert_eq!(
        row.energy_per_sample_j,
        Some(plan.energy_per_sample_j),
        "{row:?} vs {point:?}"
    );
}

/// An unpruned sweep (`tandem search --no-prune`) of the comparison's space and axes under
/// `objective`, into `out`: its rows.
fn unpruned_points(
    workload: &Path,
    space: &Path,
    hbm_gib: f64,
    objective: &str,
    out: &Path,
) -> Vec<DesignRow> {
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["search", "--workload"])
        .arg(workload)
        .arg("--space")
        .arg(space)
        .args([
            "--devices",
            "8",
            "--micro-batch",
            "1,2",
            "--recompute",
            "none,full",
        ])
        .args(["--hbm-gib", &hbm_gib.to_string(), "--objective", objective])
        .args(["--no-prune", "--quiet", "--out"])
        .arg(out)
        .output()
        .expect("run search");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    read_points(&out.join(POINTS_CSV)).expect("points.csv")
}

/// Under every objective: co-design is the best row of an unpruned sweep by that objective,
/// the iso-area row of each baseline is the brute-force filter of that sweep's points, the
/// gain column is the objective over the reference row computed by hand, and the iso-power row
/// of each baseline is the brute-force filter of its points by peak power (one sweep, the
/// baselines' powers kept as levels): the co-design row where no configuration is hungrier.
#[test]
fn every_objective_chooses_its_rows_and_each_baseline_gets_iso_rows() {
    let tmp = scratch("objectives");
    let dir = tmp.path();
    let (workload, space_path, chip, plans) = inputs(dir);
    let inside = load_chip(&chip).expect("chip loads back");
    let space = SearchSpace::load(&space_path).expect("space");
    // The space's most power-hungry configuration: every configuration is under its power.
    let mut hungriest = (0..space.len())
        .map(|i| space.get(i).expect("configuration"))
        .max_by(|a, b| peak_power_w(a).total_cmp(&peak_power_w(b)))
        .expect("a configuration");
    hungriest.name = "hungriest".into();
    let baselines = vec![inside.clone(), hungriest.clone()];
    let hbm = inside.hbm.capacity_bytes;
    let hbm_gib = hbm as f64 / (1u64 << 30) as f64;
    let w = tandem::workload::Workload::load(&workload).expect("workload");
    for (objective, name) in [
        (Objective::Throughput, "throughput"),
        (Objective::ThroughputPerArea, "throughput-per-area"),
        (Objective::Energy, "energy"),
    ] {
        let comparison = Comparison {
            space_path: space_path.clone(),
            space: space.clone(),
            baselines: baselines.clone(),
            plans: BaselinePlans::load(&plans).expect("plans"),
            devices: 8,
            micro_batches: vec![1, 2],
            recompute: vec![RecomputeMode::None, RecomputeMode::Full],
            hbm_bytes: vec![hbm],
            zero: vec![ZeroStage::Replicated],
            solver: SolverOptions::default(),
            objective,
            // Throughput per area reads the sweeps the throughput pass wrote.
            resume: objective == Objective::ThroughputPerArea,
            progress: false,
            space_memo: Default::default(),
        };
        let sweeps = dir.join("sweeps");
        let sweep_dir = comparison.sweep_dir(&sweeps, "tiny");
        let (expected_dir, recorded) = match objective {
            Objective::Throughput | Objective::ThroughputPerArea => {
                ("tiny".to_string(), "throughput")
            }
            Objective::Energy => (format!("tiny.{name}"), name),
        };
        assert_eq!(sweep_dir, sweeps.join(&expected_dir));
        let rows = comparison
            .compare_workload(&w, &workload, &sweep_dir)
            .expect("comparison");
        let names: Vec<&str> = rows.iter().map(|r| r.row.as_str()).collect();
        assert_eq!(
            names,
            [
                "inside fixed plan",
                "inside searched plan",
                "hungriest fixed plan",
                "hungriest searched plan",
                "decoupled",
                "hardware-first",
                "co-design",
                "co-design ≤ inside area",
                "co-design ≤ inside power",
                "co-design ≤ hungriest area",
                "co-design ≤ hungriest power",
                "fixed-plan co-design"
            ],
            "{name}"
        );
        for r in &rows {
            assert_eq!(r.objective, objective, "{r:?}");
        }
        let run_toml =
            std::fs::read_to_string(sweep_dir.join("run.toml")).expect("co-design run.toml");
        assert!(
            run_toml.contains(&format!("objective = \"{recorded}\"")),
            "{run_toml}"
        );
        let fixed_plan = sweeps.join(format!("{expected_dir}.fixed-plan"));
        let text = std::fs::read_to_string(fixed_plan.join("run.toml"))
            .unwrap_or_else(|e| panic!("{}: {e}", fixed_plan.display()));
        assert!(
            text.contains(&format!("objective = \"{recorded}\"")),
            "{text}"
        );
        // The co-design sweep keeps the baselines' powers as levels; no capped sweeps.
        assert!(run_toml.contains("power_levels_w"), "{run_toml}");
        assert!(!sweeps
            .join(format!("{expected_dir}.iso-power.inside"))
            .exists());
        // No configuration is over the hungriest chip's power: its iso-power row is the
        // co-design point.
        let co = &rows[6];
        let reused = &rows[10];
        assert_eq!(
            CompareRow {
                row: co.row.clone(),
                note: co.note.clone(),
                ..reused.clone()
            },
            *co
        );

        // Against the unpruned sweep of the same space under the same objective.
        let points = unpruned_points(
            &workload,
            &space_path,
            hbm_gib,
            name,
            &dir.join(format!("unpruned-{name}")),
        );
        assert!(points
            .iter()
            .all(|r| !matches!(r.outcome, tandem::search::Outcome::Pruned(_))));
        let best = best_by(&points, objective, |_| true).expect("a point fits");
        assert_row_is_point(co, best);
        let power_of = |r: &DesignRow| {
            peak_power_w(
                &space
                    .get(r.config.expect("config") as usize)
                    .expect("in the space"),
            )
        };
        let mut power_excluded = false;
        for (i, baseline) in baselines.iter().enumerate() {
            let cap = area_breakdown(baseline).total_mm2;
            let iso = &rows[7 + 2 * i];
            match best_by(&points, objective, |r| r.area_mm2 <= cap) {
                Some(point) => assert_row_is_point(iso, point),
                None => assert!(iso.throughput_samples_per_s.is_none(), "{iso:?}"),
            }
            // Held to its peak power: the brute-force filter of the unpruned sweep.
            let watts = peak_power_w(baseline);
            power_excluded |= points
                .iter()
                .any(|r| r.plan().is_some() && power_of(r) > watts);
            let iso = &rows[8 + 2 * i];
            match best_by(&points, objective, |r| power_of(r) <= watts) {
                Some(point) => assert_row_is_point(iso, point),
                None => assert!(iso.throughput_samples_per_s.is_none(), "{iso:?}"),
            }
        }
        assert!(power_excluded, "no baseline's power excluded a point");

        // Under the throughput objectives the inside chip's area cap excludes co-design's
        // chip, so the filter is exercised (energy's best chip is smaller than it).
        if objective != Objective::Energy {
            assert!(rows[7].area_mm2 < co.area_mm2, "{name}: {:?}", rows[7]);
        }

        // Gains: by hand from the rows, over row 1 (which has a plan here).
        let reference = &rows[0];
        let thr = |r: &CompareRow| r.throughput_samples_per_s.expect("plan");
        for r in rows.iter().filter(|r| r.throughput_samples_per_s.is_some()) {
            let by_hand = match objective {
                Objective::Throughput => thr(r) / thr(reference),
                Objective::ThroughputPerArea => {
                    (thr(r) / r.area_mm2) / (thr(reference) / reference.area_mm2)
                }
                Objective::Energy => {
                    reference.energy_per_sample_j.expect("plan")
                        / r.energy_per_sample_j.expect("plan")
                }
            };
            let gain = r.gain.expect("a gain");
            assert!(
                (gain - by_hand).abs() <= 1e-12 * by_hand,
                "{}: {gain} vs {by_hand}",
                r.row
            );
            assert_eq!(r.speedup, Some(thr(r) / thr(reference)), "{}", r.row);
        }
        assert_eq!(reference.gain, Some(1.0));
    }
}

#[test]
fn an_unknown_objective_is_a_usage_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "compare",
            "--workload",
            "workloads/bert-large.toml",
            "--space",
            "arch_specs/phaze-small.toml",
            "--baseline",
            "arch_specs/a100.toml",
            "--objective",
            "speed",
            "--out",
            "/nonexistent/never-written",
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--objective") && stderr.contains("throughput-per-area"),
        "{stderr}"
    );
}
