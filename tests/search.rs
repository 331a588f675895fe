//! Design-space sweeps (docs/design.md §7): sound pruning against exhaustive search, resume
//! after an interruption, and shards joined by merge — each compared file by file.

mod common;
use common::scratch;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use std::path::{Path, PathBuf};
use std::process::Command;
use tandem::arch::SearchSpace;
use tandem::cost::peak_power_w;
use tandem::placement::{RecomputeMode, ZeroStage};
use tandem::schedule::SolverOptions;
use tandem::search::{
    finish, merge, read_points, run_sweep, DesignRow, Objective, Outcome, Phase, RunOptions, Shard,
    Sweep, SweepRecord, PILOT_CSV, POINTS_CSV, SCREEN_CSV,
};

const FILES: [&str; 5] = [
    "run.toml",
    "points.csv",
    "pareto.csv",
    "best.json",
    "pareto.svg",
];

/// A two-block GPT small enough that a configuration evaluates in milliseconds.
fn tiny_workload(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.toml");
    std::fs::write(
        &path,
        "name = \"tiny\"\nfamily = \"gpt\"\nlayers = 2\nhidden = 256\nheads = 4\nvocab = 1024\n\
         seq_len = 128\nglobal_batch = 16\n",
    )
    .expect("write workload");
    path
}

/// The PHAZE space narrowed to the given exponent ranges (powers of two), written to `dir`.
fn small_space(
    dir: &Path,
    name: &str,
    tc: (u32, u32),
    rows: (u32, u32),
    vc: (u32, u32),
) -> PathBuf {
    let text = std::fs::read_to_string("arch_specs/phaze.toml").expect("phaze.toml");
    let text = text
        .replace("name = \"phaze\"", &format!("name = \"{name}\""))
        .replace(
            "\"tensor.count\" = { min = 1, max = 4096 }",
            &format!(
                "\"tensor.count\" = {{ min = {}, max = {} }}",
                1 << tc.0,
                1 << tc.1
            ),
        )
        .replace(
            "\"tensor.rows\" = { min = 2, max = 256 }",
            &format!(
                "\"tensor.rows\" = {{ min = {}, max = {} }}",
                1 << rows.0,
                1 << rows.1
            ),
        )
        .replace(
            "\"vector.count\" = { min = 1, max = 4096 }",
            &format!(
                "\"vector.count\" = {{ min = {}, max = {} }}",
                1 << vc.0,
                1 << vc.1
            ),
        )
        .replace(
            "\"tensor.cols\" = { min = 2, max = 256 }",
            "\"tensor.cols\" = { min = 64, max = 128 }",
        )
        .replace(
            "\"glb.bytes\" = { min = 2_097_152, max = 134_217_728 }",
            "\"glb.bytes\" = { min = 33_554_432, max = 67_108_864 }",
        );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write space");
    path
}

fn record(
    workloads: Vec<PathBuf>,
    space: PathBuf,
    objective: Objective,
    prune: bool,
) -> SweepRecord {
    SweepRecord {
        tandem_version: "test".into(),
        workloads,
        space,
        devices: 8,
        micro_batches: vec![1],
        recompute: vec![RecomputeMode::None, RecomputeMode::Full],
        hbm_bytes: vec![16 << 30],
        zero: vec![ZeroStage::Replicated],
        fixed: Default::default(),
        objective,
        prune,
        ilp_time_limit_s: SolverOptions::default().time_limit_s,
        ilp_node_limit: SolverOptions::default().node_limit,
        ilp_relative_gap: SolverOptions::default().relative_gap,
        search_node_limit: SolverOptions::default().search_node_limit,
        use_ilp: true,
        inputs_sha256: Vec::new(),
        max_peak_power_w: None,
        power_levels_w: Vec::new(),
    }
}

/// Runs (a shard of) the sweep into `out` and writes its summaries; returns the pruned count.
fn sweep_into(record: &SweepRecord, out: &Path, shard: Shard, resume: bool) -> u64 {
    sweep_sharing(record, out, shard, resume, None)
}

/// `sweep_into`, with the sweep using `memo` (`SpaceMemo`) where given.
fn sweep_sharing(
    record: &SweepRecord,
    out: &Path,
    shard: Shard,
    resume: bool,
    memo: Option<&std::sync::Arc<tandem::search::SpaceMemo>>,
) -> u64 {
    let mut sweep = Sweep::from_record(record).expect("valid sweep");
    if let Some(memo) = memo {
        sweep.share_memo(memo.clone());
    }
    let options = RunOptions {
        out_dir: out.to_path_buf(),
        shard,
        resume,
        progress: false,
        phase: Phase::Whole,
    };
    let stats = run_sweep(&sweep, record, &options).expect("sweep runs");
    finish(&sweep, out).expect("summaries");
    stats.pruned
}

fn assert_same_files(a: &Path, b: &Path) {
    for f in FILES {
        let (x, y) = (std::fs::read(a.join(f)), std::fs::read(b.join(f)));
        assert!(
            x.is_ok() && x.as_ref().ok() == y.as_ref().ok(),
            "{f} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// Resumes copies of the finished sweep in `whole` cut off at three places in its
/// `points.csv` (mid-row, as a kill leaves it) into `dir`, and checks that each gives the
/// same files; returns the whole `points.csv`.
fn resume_from_cuts(rec: &SweepRecord, whole: &Path, dir: &Path) -> Vec<u8> {
    let points = std::fs::read(whole.join(POINTS_CSV)).expect("points");
    for cut in [points.len() / 3, points.len() / 2 + 7, points.len() - 5] {
        let killed = dir.join(format!("killed{cut}"));
        std::fs::create_dir_all(&killed).expect("dir");
        std::fs::copy(whole.join("run.toml"), killed.join("run.toml")).expect("copy run.toml");
        std::fs::write(killed.join(POINTS_CSV), &points[..cut]).expect("partial points");
        sweep_into(rec, &killed, Shard::WHOLE, true);
        assert_same_files(whole, &killed);
    }
    points
}

fn front_without_bounds(dir: &Path) -> Vec<tandem::search::DesignRow> {
    let mut rows = tandem::search::read_points(&dir.join("pareto.csv")).expect("pareto.csv");
    for r in &mut rows {
        r.bound_samples_per_s = None;
    }
    rows
}

fn best_without_bounds(dir: &Path) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                map.remove("bound_samples_per_s");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(dir.join("best.json")).expect("best.json");
    let mut value = serde_json::from_str(&text).expect("JSON");
    strip(&mut value);
    value
}

/// The best point (by the objective) and the Pareto front are the same with and without
/// pruning, over random small spaces, both pruning objectives, one or two workloads and two
/// HBM sizes (one refusing some plans); and pruning does happen.
#[test]
fn pruning_never_changes_the_best_point_or_the_front() {
    let tmp = scratch("prune");
    let dir = tmp.path();
    let tiny = tiny_workload(dir);
    let other = dir.join("tiny-wide.toml");
    std::fs::write(
        &other,
        "name = \"tiny-wide\"\nfamily = \"gpt\"\nlayers = 2\nhidden = 512\nheads = 8\nvocab = 1024\n\
         seq_len = 128\nglobal_batch = 16\n",
    )
    .expect("write workload");
    let mut config = Config::with_cases(5);
    config.rng_seed = RngSeed::Fixed(7);
    config.failure_persistence = None;
    let pruned_total = std::cell::Cell::new(0);
    let refused = std::cell::Cell::new(0);
    let case = std::cell::Cell::new(0);
    proptest!(config, |(tc_lo in 0u32..4, tc_span in 1u32..3, rows_lo in 5u32..7, vc_lo in 0u32..4,
                        per_area in any::<bool>(), two in any::<bool>())| {
        case.set(case.get() + 1);
        let case = case.get();
        let space = small_space(dir, &format!("space{case}"), (tc_lo, tc_lo + tc_span), (rows_lo, 7), (vc_lo, vc_lo + 1));
        let objective = if per_area { Objective::ThroughputPerArea } else { Objective::Throughput };
        let workloads = if two { vec![tiny.clone(), other.clone()] } else { vec![tiny.clone()] };
        // Two HBM sizes, one small enough to refuse some plans.
        let with_hbm = |prune: bool| SweepRecord {
            hbm_bytes: vec![6 << 20, 16 << 30],
            ..record(workloads.clone(), space.clone(), objective, prune)
        };
        let (pruned_dir, full_dir, pruned) = pruned_and_exhaustive(dir, &format!("case{case}"), with_hbm);
        pruned_total.set(pruned_total.get() + pruned);
        let points = std::fs::read_to_string(full_dir.join("points.csv")).expect("points.csv");
        refused.set(refused.get() + points.lines().filter(|l| l.contains(",infeasible,")).count());
        // The exhaustive run screens nothing, so its rows carry no bound; all else must agree.
        prop_assert_eq!(front_without_bounds(&pruned_dir), front_without_bounds(&full_dir), "pareto.csv, case {}", case);
        prop_assert_eq!(best_without_bounds(&pruned_dir), best_without_bounds(&full_dir), "best.json, case {}", case);
    });
    assert!(
        pruned_total.get() > 0,
        "no case pruned anything: the property was not exercised"
    );
    assert!(
        refused.get() > 0,
        "the small HBM size refused no point: memory never bound the plans"
    );
}

/// The throughput screen's bounds count the pipeline bubble a batch smaller than the cluster
/// forces (at micro-batch 4, a global batch of 8 is two micro-batches for 8 devices): on a
/// random small space, every bound the pruned sweep states (pruned rows and exact ones) is at
/// least the exhaustive sweep's samples/s of that point, the best point and the front are the
/// same, and pruning happens.
#[test]
fn throughput_bounds_hold_where_pipelines_idle() {
    let tmp = scratch("bubble");
    let dir = tmp.path();
    let moe = tiny_moe_small_batch(dir);
    let tiny = tiny_workload(dir);
    let space = small_space(dir, "space", (1, 3), (5, 7), (0, 2));
    let (mut checked, mut pruned_total) = (0, 0);
    for (case, workload) in [moe, tiny].into_iter().enumerate() {
        let with = |prune: bool| SweepRecord {
            hbm_bytes: vec![18 << 20, 16 << 30],
            micro_batches: vec![1, 2, 4],
            ..record(
                vec![workload.clone()],
                space.clone(),
                Objective::Throughput,
                prune,
            )
        };
        let (pruned_dir, full_dir, pruned) = pruned_and_exhaustive(dir, &case.to_string(), with);
        pruned_total += pruned;
        let full = read_points(&full_dir.join(POINTS_CSV)).expect("points");
        for row in read_points(&pruned_dir.join(POINTS_CSV)).expect("points") {
            let id = row.point.expect("id") as usize;
            let (Some(bound), Some(plan)) = (row.bound_samples_per_s, full[id].plan()) else {
                continue;
            };
            assert!(
                bound >= plan.throughput_samples_per_s * (1.0 - 1e-6),
                "case {case}, point {id}: bound {bound} < {} samples/s",
                plan.throughput_samples_per_s
            );
            checked += 1;
        }
        assert_eq!(
            front_without_bounds(&pruned_dir),
            front_without_bounds(&full_dir)
        );
        assert_eq!(
            best_without_bounds(&pruned_dir),
            best_without_bounds(&full_dir)
        );
    }
    assert!(
        checked > 0 && pruned_total > 0,
        "{checked} bounds checked, {pruned_total} pruned"
    );
}

/// `tests/data/tiny-moe.toml` with a global batch of 8: on the 8 devices of `record`, a
/// whole-cluster plan at micro-batch 2 or more idles in its pipeline bubble.
fn tiny_moe_small_batch(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-moe-batch8.toml");
    let text = std::fs::read_to_string("tests/data/tiny-moe.toml").expect("tiny-moe.toml");
    std::fs::write(
        &path,
        text.replace("global_batch = 512", "global_batch = 8"),
    )
    .expect("write workload");
    path
}

/// Runs the sweep `with(true)` (pruned) into `DIR/p<name>` and `with(false)` (exhaustive,
/// which must prune nothing) into `DIR/f<name>`; returns both directories and the points
/// pruned.
fn pruned_and_exhaustive(
    dir: &Path,
    name: &str,
    with: impl Fn(bool) -> SweepRecord,
) -> (PathBuf, PathBuf, u64) {
    let (pruned_dir, full_dir) = (dir.join(format!("p{name}")), dir.join(format!("f{name}")));
    let pruned = sweep_into(&with(true), &pruned_dir, Shard::WHOLE, false);
    assert_eq!(sweep_into(&with(false), &full_dir, Shard::WHOLE, false), 0);
    (pruned_dir, full_dir, pruned)
}

/// The tiny workload with a global batch of 512: per-iteration energy (gradient
/// synchronisation, optimizer steps), which only some plans spend, is then a small share of a
/// sample's, so the energy bound has something to prune.
fn tiny_large_batch(dir: &Path) -> PathBuf {
    let path = tiny_workload(dir);
    let text = std::fs::read_to_string(&path).expect("workload");
    std::fs::write(
        &path,
        text.replace("global_batch = 16", "global_batch = 512"),
    )
    .expect("write");
    path
}

/// Per point id: the least energy per sample an `ok` row spends at no larger area (the
/// staircase an energy sweep must keep exact), as (point, area, J/sample) corners.
fn energy_front(rows: &[DesignRow]) -> Vec<(u64, f64, f64)> {
    let mut ok: Vec<(u64, f64, f64)> = rows
        .iter()
        .filter_map(|r| Some((r.point?, r.area_mm2, r.plan()?.energy_per_sample_j)))
        .collect();
    ok.sort_by(|a, b| {
        a.1.total_cmp(&b.1)
            .then(a.2.total_cmp(&b.2))
            .then(a.0.cmp(&b.0))
    });
    let mut least = f64::INFINITY;
    ok.into_iter()
        .filter(|&(_, _, e)| {
            let lower = e < least;
            least = least.min(e);
            lower
        })
        .collect()
}

/// Exponent ranges of `small_space`: tensor cores, tensor rows, vector cores.
type SpaceRanges = ((u32, u32), (u32, u32), (u32, u32));

/// Runs a pruned and an exhaustive energy sweep of `workload` over each small space of `cases`
/// at `hbm_bytes` and micro-batches 1 and 2, and checks that the pruned sweep's best point and
/// (area, energy) front equal the exhaustive run's; that its evaluated rows are the
/// exhaustive run's rows; that every point it prunes spends, exhaustively evaluated, at least
/// what its witness spends at no larger area and at least its bound; and that points no plan
/// fits are found without evaluation. Returns the points pruned and refused.
fn energy_pruning_matches_exhaustive(
    dir: &Path,
    workload: &Path,
    hbm_bytes: &[u64],
    cases: &[SpaceRanges],
) -> (u64, usize) {
    let (mut pruned_total, mut refused) = (0, 0);
    for (case, &(tc, rows, vc)) in cases.iter().enumerate() {
        let stem = workload.file_stem().expect("a file").to_string_lossy();
        let name = format!("{stem}-{case}");
        let space = small_space(dir, &name, tc, rows, vc);
        let with = |prune: bool| SweepRecord {
            hbm_bytes: hbm_bytes.to_vec(),
            micro_batches: vec![1, 2],
            ..record(
                vec![workload.to_path_buf()],
                space.clone(),
                Objective::Energy,
                prune,
            )
        };
        let (pruned_dir, full_dir, pruned) = pruned_and_exhaustive(dir, &name, with);
        pruned_total += pruned;
        let mut pruned = read_points(&pruned_dir.join(POINTS_CSV)).expect("points");
        pruned.sort_by_key(|r| r.point);
        let full = read_points(&full_dir.join(POINTS_CSV)).expect("points");
        assert_eq!(pruned.len(), full.len());
        assert_eq!(energy_front(&pruned), energy_front(&full), "case {case}");
        assert_eq!(
            best_without_bounds(&pruned_dir),
            best_without_bounds(&full_dir),
            "case {case}"
        );
        let spent = |id: u64| full[id as usize].plan().map(|p| p.energy_per_sample_j);
        for (p, f) in pruned.iter().zip(&full) {
            assert_eq!(p.point, f.point, "every point has one row");
            match &p.outcome {
                Outcome::Ok(_) => assert_eq!(p, f, "case {case}"),
                Outcome::Infeasible { .. } => {
                    refused += 1;
                    assert!(matches!(f.outcome, Outcome::Infeasible { .. }), "{p:?}");
                }
                Outcome::Pruned(tandem::search::Pruning::Energy { bound_j, beaten_by }) => {
                    let own = spent(p.point.expect("id")).expect("a pruned point has a plan");
                    let witness = spent(beaten_by.by).expect("the witness has a plan");
                    assert!(own >= witness && full[beaten_by.by as usize].area_mm2 <= p.area_mm2);
                    // The bound is a lower bound (to the reason's four digits).
                    assert!(*bound_j <= own * (1.0 + 1e-4), "{bound_j} > {own}");
                }
                Outcome::Pruned(other) => panic!("not an energy pruning: {other:?}"),
            }
        }
    }
    (pruned_total, refused)
}

/// Energy sweeps prune by a lower bound on joules per sample: over random small spaces with
/// two HBM sizes (one refusing some plans), the pruned sweep keeps the exhaustive run's
/// answers (`energy_pruning_matches_exhaustive`), and pruning does happen.
#[test]
fn energy_pruning_keeps_the_least_energy_at_every_area() {
    let tmp = scratch("energy");
    let dir = tmp.path();
    let tiny = tiny_large_batch(dir);
    let cases = [
        ((0, 2), (5, 7), (0, 1)),
        ((1, 3), (6, 7), (2, 3)),
        ((2, 4), (5, 6), (1, 2)),
    ];
    let (pruned_total, refused) =
        energy_pruning_matches_exhaustive(dir, &tiny, &[6 << 20, 16 << 30], &cases);
    assert!(pruned_total > 0, "no case pruned anything");
    assert!(refused > 0, "the small HBM size refused no point");
}

/// The same for a mixture-of-experts model (4 experts, top-2), whose bound adds the
/// all-to-alls at the cheapest expert-parallel width some plan fits with, and the expert
/// layers' optimizer steps. The HBM sizes are where no plan fits, where only plans of some
/// widths divide the experts (18 MiB: a plan with e = 1 needs t = 4 and two stages on the
/// template chip), where plans of every e fit (40 MiB) and where memory never binds. With a
/// global batch of 8 on the 8 devices, a whole-cluster plan at micro-batch 2 idles in its
/// pipeline bubble, which the bound counts (the powered passes).
#[test]
fn energy_pruning_holds_for_experts() {
    let tmp = scratch("energy-moe");
    let dir = tmp.path();
    let moe = Path::new("tests/data/tiny-moe.toml");
    let small_batch = tiny_moe_small_batch(dir);
    let hbm = [12 << 20, 18 << 20, 40 << 20, 16 << 30];
    for workload in [moe, small_batch.as_path()] {
        let (pruned_total, refused) =
            energy_pruning_matches_exhaustive(dir, workload, &hbm, &[((1, 3), (5, 7), (0, 2))]);
        assert!(pruned_total > 0, "{}: nothing pruned", workload.display());
        assert!(refused > 0, "the smallest HBM size refused no point");
    }
}

/// A pruned energy sweep cut off mid-row (its `points.csv` holds rows in the order it
/// settled them, so any cut is where a kill could leave it) and resumed writes the same files
/// as an uninterrupted one; it refuses to run as shards.
#[test]
fn energy_sweep_resumes_to_the_same_files() {
    let tmp = scratch("energy-resume");
    let dir = tmp.path();
    let space = small_space(dir, "space", (1, 3), (5, 7), (0, 2));
    let rec = SweepRecord {
        micro_batches: vec![1, 2],
        ..record(vec![tiny_large_batch(dir)], space, Objective::Energy, true)
    };
    let whole = dir.join("whole");
    assert!(
        sweep_into(&rec, &whole, Shard::WHOLE, false) > 0,
        "nothing pruned"
    );
    resume_from_cuts(&rec, &whole, dir);
    let sweep = Sweep::from_record(&rec).expect("valid");
    let options = RunOptions {
        out_dir: dir.join("shard"),
        shard: Shard { index: 0, count: 2 },
        resume: false,
        progress: false,
        phase: Phase::Whole,
    };
    let err = run_sweep(&sweep, &rec, &options).expect_err("shards refused");
    assert!(err.to_string().contains("runs whole"), "{err}");
}

/// A sweep that keeps power levels (`--power-levels-w`) has the exhaustive run's best point
/// under each level and any area cap, for throughput and energy, on random small spaces; and
/// without levels the same sweep would have pruned some of those answers away (the levels
/// are what keeps them).
#[test]
fn power_levels_keep_the_best_point_under_each_power() {
    let tmp = scratch("levels");
    let dir = tmp.path();
    let workload = tiny_large_batch(dir);
    let (mut checked, mut lost) = (0, 0);
    for (case, (tc, rows, vc)) in [((0, 3), (5, 7), (0, 2)), ((1, 4), (5, 7), (1, 3))]
        .into_iter()
        .enumerate()
    {
        let space_path = small_space(dir, &format!("levels{case}"), tc, rows, vc);
        let space = SearchSpace::load(&space_path).expect("space");
        let mut powers: Vec<f64> = (0..space.len())
            .map(|i| peak_power_w(&space.get(i).expect("configuration")))
            .collect();
        powers.sort_by(f64::total_cmp);
        let levels = vec![powers[powers.len() / 4], powers[powers.len() / 2]];
        let power_of = |r: &DesignRow| {
            peak_power_w(
                &space
                    .get(r.config.expect("config") as usize)
                    .expect("in the space"),
            )
        };
        for objective in [Objective::Throughput, Objective::Energy] {
            let with = |prune: bool, levels: Vec<f64>| SweepRecord {
                micro_batches: vec![1, 2],
                power_levels_w: levels,
                ..record(vec![workload.clone()], space_path.clone(), objective, prune)
            };
            let out = |name: &str| dir.join(format!("{name}{case}-{objective}"));
            sweep_into(
                &with(true, levels.clone()),
                &out("kept"),
                Shard::WHOLE,
                false,
            );
            sweep_into(&with(false, Vec::new()), &out("full"), Shard::WHOLE, false);
            sweep_into(&with(true, Vec::new()), &out("plain"), Shard::WHOLE, false);
            let kept = read_points(&out("kept").join(POINTS_CSV)).expect("points");
            let full = read_points(&out("full").join(POINTS_CSV)).expect("points");
            let plain = read_points(&out("plain").join(POINTS_CSV)).expect("points");
            let best = |rows: &[DesignRow], watts: f64, area: f64| {
                rows.iter()
                    .filter(|r| r.plan().is_some() && power_of(r) <= watts && r.area_mm2 <= area)
                    .max_by(|a, b| {
                        let s = |r: &DesignRow| objective.score(r).expect("ok");
                        s(a).total_cmp(&s(b)).then(b.point.cmp(&a.point))
                    })
                    .map(|r| (r.point, r.plan().copied()))
            };
            let areas: Vec<f64> = full.iter().map(|r| r.area_mm2).collect();
            for &watts in levels.iter().chain(&[f64::INFINITY]) {
                for area in [
                    f64::INFINITY,
                    areas[areas.len() / 2],
                    areas[areas.len() / 5],
                ] {
                    assert_eq!(
                        best(&kept, watts, area),
                        best(&full, watts, area),
                        "case {case} {objective} {watts} W {area} mm²"
                    );
                    checked += 1;
                    lost += usize::from(best(&plain, watts, area) != best(&full, watts, area));
                }
            }
        }
    }
    assert_eq!(checked, 2 * 2 * 3 * 3);
    assert!(lost > 0, "the levels kept no answer a plain sweep loses");
    // Levels are refused unless positive, rising and with one workload.
    let space = small_space(dir, "refused", (0, 1), (5, 6), (0, 1));
    for (levels, two, message) in [
        (vec![0.0], false, "positive"),
        (vec![300.0, 200.0], false, "rising"),
        (vec![300.0], true, "one workload"),
    ] {
        let other = dir.join("other.toml");
        let text = std::fs::read_to_string(&workload).expect("workload");
        std::fs::write(&other, text.replace("name = \"tiny\"", "name = \"other\"")).expect("write");
        let workloads = if two {
            vec![workload.clone(), other]
        } else {
            vec![workload.clone()]
        };
        let rec = SweepRecord {
            power_levels_w: levels,
            ..record(workloads, space.clone(), Objective::Throughput, true)
        };
        let err = Sweep::from_record(&rec).expect_err("refused");
        assert!(err.to_string().contains(message), "{err}");
    }
}

/// Sweeps of one space that share their layer bounds (`Sweep::share_memo`, as a comparison's
/// and a study's do) write the same files as sweeps that price them alone: a throughput sweep
/// after an energy sweep of another cluster size and a power-capped sweep, all on one memo.
#[test]
fn sweeps_sharing_layer_bounds_write_the_same_files() {
    let tmp = scratch("memo");
    let dir = tmp.path();
    let space = small_space(dir, "space", (1, 3), (5, 7), (0, 2));
    let workload = tiny_large_batch(dir);
    let memo = std::sync::Arc::new(tandem::search::SpaceMemo::default());
    let energy = SweepRecord {
        devices: 16,
        micro_batches: vec![1, 2],
        ..record(
            vec![workload.clone()],
            space.clone(),
            Objective::Energy,
            true,
        )
    };
    let throughput = SweepRecord {
        micro_batches: vec![1, 2],
        ..record(vec![workload], space, Objective::Throughput, true)
    };
    let capped = SweepRecord {
        max_peak_power_w: Some(200.0),
        ..throughput.clone()
    };
    for (i, rec) in [energy, capped, throughput].iter().enumerate() {
        let (alone, shared) = (
            dir.join(format!("alone{i}")),
            dir.join(format!("shared{i}")),
        );
        sweep_sharing(rec, &alone, Shard::WHOLE, false, None);
        sweep_sharing(rec, &shared, Shard::WHOLE, false, Some(&memo));
        assert_same_files(&alone, &shared);
    }
}

/// A sweep cut off mid-row (as a kill leaves it) and resumed writes the same files as an
/// uninterrupted run.
#[test]
fn resume_after_interruption_gives_the_same_files() {
    let tmp = scratch("resume");
    let dir = tmp.path();
    let space = small_space(dir, "space", (2, 4), (6, 7), (1, 3));
    let rec = record(vec![tiny_workload(dir)], space, Objective::Throughput, true);
    let whole = dir.join("whole");
    sweep_into(&rec, &whole, Shard::WHOLE, false);
    let points = resume_from_cuts(&rec, &whole, dir);
    // Resuming with other inputs is refused.
    let mut other = rec.clone();
    other.devices = 16;
    let sweep = Sweep::from_record(&other).expect("valid");
    let options = RunOptions {
        out_dir: whole.clone(),
        shard: Shard::WHOLE,
        resume: true,
        progress: false,
        phase: Phase::Whole,
    };
    let err = run_sweep(&sweep, &other, &options).expect_err("different inputs");
    assert!(
        err.to_string().contains("--devices: 8 then, 16 now"),
        "{err}"
    );
    // So is resuming after the workload file changed under the same path: run.toml records
    // each input file's SHA-256, and the message names the file.
    let killed = dir.join("edited");
    std::fs::create_dir_all(&killed).expect("dir");
    std::fs::copy(whole.join("run.toml"), killed.join("run.toml")).expect("copy run.toml");
    std::fs::write(killed.join(POINTS_CSV), &points[..points.len() / 2]).expect("points");
    let workload = &rec.workloads[0];
    let text = std::fs::read_to_string(workload).expect("workload");
    std::fs::write(workload, text.replace("hidden = 256", "hidden = 384")).expect("edit");
    let options = RunOptions {
        out_dir: killed.clone(),
        ..options
    };
    let sweep = Sweep::from_record(&rec).expect("valid");
    let err = run_sweep(&sweep, &rec, &options).expect_err("edited workload");
    let message = err.to_string();
    assert!(
        message.contains("run.toml")
            && message.contains(&format!("{} changed since that run", workload.display())),
        "{message}"
    );
    // The finished rows were left as they were.
    let kept = std::fs::read(killed.join(POINTS_CSV)).expect("points");
    assert_eq!(kept, &points[..points.len() / 2]);
    // With the same inputs, a model that prices the points otherwise (another build of
    // tandem) is caught by evaluating the first finished point again; every plan column is
    // compared, so one that priced only energy otherwise (as before the optimizer step and
    // gradient synchronisation counted) is caught too.
    std::fs::write(workload, &text).expect("restore");
    let whole_lines = kept.iter().rposition(|&b| b == b'\n').expect("rows") + 1;
    let mut reader = csv::Reader::from_reader(&kept[..whole_lines]);
    let mut rows: Vec<DesignRow> = reader.deserialize().map(|r| r.expect("row")).collect();
    let first_ok = rows
        .iter_mut()
        .find_map(|r| match &mut r.outcome {
            Outcome::Ok(plan) => Some(plan),
            _ => None,
        })
        .expect("an evaluated row");
    first_ok.energy_per_sample_j *= 0.99;
    let mut writer = csv::Writer::from_path(killed.join(POINTS_CSV)).expect("points");
    rows.iter().for_each(|r| writer.serialize(r).expect("row"));
    writer.flush().expect("flush");
    let sweep = Sweep::from_record(&rec).expect("valid");
    let err = run_sweep(&sweep, &rec, &options).expect_err("other energy model");
    let message = err.to_string();
    assert!(
        message.contains("points.csv")
            && message.contains("tiny on")
            && message.contains("energy_per_sample_j")
            && message.contains("another model or other inputs"),
        "{message}"
    );
}

/// A list-only sweep (`--no-ilp`) prices every layer at its list schedule, which the exact
/// schedules (search, then ILP) only improve on: no point it evaluates is faster than the
/// same point evaluated exactly, some are slower, and run.toml records the choice.
#[test]
fn list_only_sweep_is_never_faster_than_the_exact_one() {
    let tmp = scratch("list-only");
    let dir = tmp.path();
    let space = small_space(dir, "space", (0, 2), (5, 7), (0, 2));
    let exact = record(
        vec![tiny_workload(dir)],
        space,
        Objective::Throughput,
        false,
    );
    let mut list = exact.clone();
    list.use_ilp = false;
    sweep_into(&exact, &dir.join("exact"), Shard::WHOLE, false);
    sweep_into(&list, &dir.join("list"), Shard::WHOLE, false);
    let run_toml = std::fs::read_to_string(dir.join("list").join("run.toml")).expect("run.toml");
    assert!(run_toml.contains("use_ilp = false"), "{run_toml}");
    let times = |name: &str| -> Vec<(Option<u64>, Option<f64>)> {
        tandem::search::read_points(&dir.join(name).join(POINTS_CSV))
            .expect("points.csv")
            .into_iter()
            .map(|r| (r.point, r.plan().map(|p| p.time_per_batch_s)))
            .collect()
    };
    let (exact_times, list_times) = (times("exact"), times("list"));
    assert_eq!(exact_times.len(), list_times.len());
    let mut slower = 0;
    for ((point, exact_s), (list_point, list_s)) in exact_times.iter().zip(&list_times) {
        assert_eq!(point, list_point);
        let (Some(exact_s), Some(list_s)) = (exact_s, list_s) else {
            assert_eq!(exact_s.is_some(), list_s.is_some(), "point {point:?}");
            continue;
        };
        assert!(
            *list_s >= exact_s * (1.0 - 1e-12),
            "point {point:?}: list {list_s} s < exact {exact_s} s"
        );
        if *list_s > exact_s * (1.0 + 1e-9) {
            slower += 1;
        }
    }
    assert!(slower > 0, "no point differs: the flag was not exercised");
}

/// Three shards merged give the files of one run; a missing shard is named.
#[test]
fn shards_merged_equal_one_run() {
    let tmp = scratch("shards");
    let dir = tmp.path();
    let space = small_space(dir, "space", (2, 4), (6, 7), (1, 3));
    let rec = record(vec![tiny_workload(dir)], space, Objective::Throughput, true);
    let whole = dir.join("whole");
    sweep_into(&rec, &whole, Shard::WHOLE, false);
    let shards: Vec<PathBuf> = (0..3)
        .map(|i| {
            let out = dir.join(format!("shard{i}"));
            sweep_into(&rec, &out, Shard { index: i, count: 3 }, false);
            out
        })
        .collect();
    let merged = dir.join("merged");
    let record = merge(&shards, &merged).expect("merge");
    finish(&Sweep::from_record(&record).expect("valid"), &merged).expect("summaries");
    assert_same_files(&whole, &merged);
    let err = merge(&shards[..2], &dir.join("partial")).expect_err("shard 2/3 missing");
    assert!(err.to_string().contains("2/3"), "{err}");
    // Every point appears once, ok rows carry a plan, pruned rows a bound and the point of
    // their workload, with a plan, that beats it.
    let rows = tandem::search::read_points(&merged.join(POINTS_CSV)).expect("rows");
    let ids: Vec<u64> = rows.iter().filter_map(|r| r.point).collect();
    assert_eq!(ids, (0..ids.len() as u64).collect::<Vec<_>>());
    for r in &rows {
        match &r.outcome {
            Outcome::Ok(plan) => assert!(plan.tp > 0 && plan.time_per_batch_s > 0.0),
            Outcome::Pruned(pruning) => {
                let tandem::search::Pruning::Throughput { beaten_by, .. } = pruning else {
                    panic!("a throughput sweep pruned by energy: {r:?}");
                };
                let by = &rows[beaten_by.by as usize];
                assert!(by.plan().is_some() && by.workload == r.workload, "{r:?}");
            }
            Outcome::Infeasible { reason } => assert!(!reason.is_empty()),
        }
        let bound = r.bound_samples_per_s.expect("bound");
        if let Some(thr) = r.plan().map(|p| p.throughput_samples_per_s) {
            assert!(
                thr <= bound * (1.0 + 1e-9),
                "throughput {thr} above its bound {bound}"
            );
        }
    }
}

/// A sweep split into a screen pass and an exact pass per shard (each shard screens only its
/// own blocks of the space) merges to the files of one run, byte for byte; the exact pass
/// refuses to start before every block is screened.
#[test]
fn split_screen_shards_merged_equal_one_run() {
    let scratch_dir = scratch("split");
    let dir = scratch_dir.path();
    let space = small_space(dir, "space", (1, 10), (3, 7), (0, 7));
    let rec = record(vec![tiny_workload(dir)], space, Objective::Throughput, true);
    let sweep = Sweep::from_record(&rec).expect("valid sweep");
    let blocks = tandem::search::screen_blocks(sweep.space.len());
    assert!(
        blocks >= 2,
        "{} configurations: one block",
        sweep.space.len()
    );
    let whole = dir.join("whole");
    let pruned = sweep_into(&rec, &whole, Shard::WHOLE, false);
    assert!(pruned > 0);
    let shards: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("shard{i}"))).collect();
    // The screen pass starts each shard's directory; the exact pass continues it.
    let run = |i: usize, phase: Phase| {
        let options = RunOptions {
            out_dir: shards[i].clone(),
            shard: Shard {
                index: i as u32,
                count: 3,
            },
            resume: !matches!(phase, Phase::Screen { .. }),
            progress: false,
            phase,
        };
        run_sweep(&sweep, &rec, &options)
    };
    let exact = || Phase::Exact {
        screens: shards.clone(),
    };
    // A seed step screens block 0 once; shard 2 screens it itself (no seed given): the same.
    let seed = dir.join("seed");
    let seeding = RunOptions {
        out_dir: seed.clone(),
        shard: Shard::WHOLE,
        resume: false,
        progress: false,
        phase: Phase::Seed,
    };
    run_sweep(&sweep, &rec, &seeding).expect("seed step");
    // The pilot found points with a plan outside block 0 to seed the blocks with; a seed
    // directory without it is refused, naming the file.
    let pilot = seed.join(PILOT_CSV);
    let pilot_text = std::fs::read_to_string(&pilot).expect("pilot.csv");
    assert!(pilot_text.lines().count() > 1, "the pilot found nothing");
    std::fs::remove_file(&pilot).expect("rm");
    let err = run(
        0,
        Phase::Screen {
            seed: Some(seed.clone()),
        },
    )
    .expect_err("no pilot.csv");
    assert!(
        err.to_string().contains(&pilot.display().to_string()),
        "{err}"
    );
    // A row of block 0 (point 0) is no pilot point: refused, naming the file and row.
    let header = pilot_text.lines().next().expect("header");
    std::fs::write(&pilot, format!("{header}\n0,1.0,2.0,1.0\n")).expect("write");
    let err = run(
        0,
        Phase::Screen {
            seed: Some(seed.clone()),
        },
    )
    .expect_err("a block-0 row in pilot.csv");
    assert!(
        err.to_string()
            .contains("row 1: point 0 is not a pilot point"),
        "{err}"
    );
    std::fs::write(&pilot, pilot_text).expect("restore");
    if shards[0].exists() {
        std::fs::remove_dir_all(&shards[0]).expect("rm");
    }
    for i in 0..3 {
        let seed = (i < 2).then(|| seed.clone());
        let screened = run(i, Phase::Screen { seed }).expect("screen pass");
        assert_eq!(screened.evaluated, 0);
    }
    // Shard 1's screen lost: the exact pass names it.
    let screen_1 = shards[1].join(SCREEN_CSV);
    let kept = std::fs::read(&screen_1).expect("screen.csv");
    std::fs::remove_file(&screen_1).expect("rm");
    let err = run(0, exact()).expect_err("a screen is missing");
    assert!(
        err.to_string().contains(&screen_1.display().to_string()),
        "{err}"
    );
    std::fs::write(&screen_1, kept).expect("restore");
    for (i, shard) in shards.iter().enumerate() {
        run(i, exact()).expect("exact pass");
        finish(&sweep, shard).expect("summaries");
    }
    let merged = dir.join("merged");
    let record = merge(&shards, &merged).expect("merge");
    finish(&Sweep::from_record(&record).expect("valid"), &merged).expect("summaries");
    assert_same_files(&whole, &merged);
    // Seeded by block 0 and the pilot, the blocks prune nothing the exhaustive run needs.
    let exhaustive = dir.join("exhaustive");
    let unpruned = SweepRecord {
        prune: false,
        ..rec.clone()
    };
    sweep_into(&unpruned, &exhaustive, Shard::WHOLE, false);
    assert_eq!(
        front_without_bounds(&whole),
        front_without_bounds(&exhaustive)
    );
    assert_eq!(
        best_without_bounds(&whole),
        best_without_bounds(&exhaustive)
    );
    // Each shard's status says it is done, with every point of its share counted.
    for shard in &shards {
        match tandem::search::read_status(shard) {
            tandem::search::DirStatus::Known { status, gone } => {
                assert!(!gone && status.state == tandem::search::RunState::Done);
                assert_eq!(
                    (status.phase.as_str(), status.done),
                    ("exact", status.total)
                );
            }
            other => panic!("{}: {other:?}", shard.display()),
        }
    }
}

/// `tandem status` reads each directory's status.json: a run whose process is gone without
/// finishing is reported stopped (exit 1); done and not-started directories are normal.
#[test]
fn status_reports_done_running_and_stopped_runs() {
    let scratch_dir = scratch("status");
    let dir = scratch_dir.path();
    let write = |name: &str, state: &str, pid: u32| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).expect("dir");
        let status = serde_json::json!({
            "phase": "exact", "state": state, "unit": "points", "done": 40, "total": 100,
            "rate_per_s": 4.0, "eta_s": 15.0, "host": tandem::search::host_name(),
            "pid": pid, "updated_unix_s": 0
        });
        std::fs::write(d.join("status.json"), status.to_string()).expect("status");
        d.display().to_string()
    };
    let alive = write("alive", "running", std::process::id());
    let done = write("done", "done", 1);
    let status = |dirs: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .arg("status")
            .args(dirs)
            .output()
            .expect("run tandem")
    };
    let never = dir.join("never").display().to_string();
    let out = status(&[&alive, &done, &never]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("40 / 100 points") && text.contains("15 s"),
        "{text}"
    );
    assert!(
        text.contains("1 done, 1 running, 0 failed or stopped, 1 not started"),
        "{text}"
    );
    // A pid that no process has: the run stopped without saying so.
    let gone = write("gone", "running", u32::MAX);
    let out = status(&[&gone]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("stopped (pid 4294967295"), "{text}");
}

/// Bad command lines exit non-zero with the option named.
#[test]
fn power_capped_sweep_equals_the_exhaustive_sweep_filtered_by_power() {
    let tmp = scratch("power-cap");
    let dir = tmp.path();
    let tiny = tiny_workload(dir);
    let space = small_space(dir, "space", (1, 3), (5, 6), (1, 2));
    let full_dir = dir.join("full");
    let full = record(
        vec![tiny.clone()],
        space.clone(),
        Objective::Throughput,
        false,
    );
    sweep_into(&full, &full_dir, Shard::WHOLE, false);
    let rows = read_points(&full_dir.join(POINTS_CSV)).expect("points.csv");
    let loaded = SearchSpace::load(&space).expect("space");
    let powers: Vec<f64> = loaded.iter().map(|arch| peak_power_w(&arch)).collect();
    let power_of = |r: &DesignRow| powers[r.config.expect("config") as usize];
    let thr = |r: &DesignRow| r.plan().map_or(0.0, |p| p.throughput_samples_per_s);
    // The best of `rows` (ties to the lowest point id), as the sweep's best.json picks it.
    let best = |rows: Vec<&DesignRow>| {
        rows.into_iter()
            .filter(|r| r.plan().is_some())
            .max_by(|a, b| thr(a).total_cmp(&thr(b)).then(b.point.cmp(&a.point)))
            .cloned()
            .expect("a point with a plan")
    };
    let unrestricted = best(rows.iter().collect());
    // The cap: just below the unrestricted best's peak power, so it binds.
    let cap = powers
        .iter()
        .copied()
        .filter(|&w| w < power_of(&unrestricted))
        .fold(f64::NEG_INFINITY, f64::max);
    assert!(
        cap.is_finite(),
        "the best point is the least hungry: no cap binds"
    );
    let brute = best(rows.iter().filter(|r| power_of(r) <= cap).collect());

    let capped_dir = dir.join("capped");
    let capped = SweepRecord {
        max_peak_power_w: Some(cap),
        ..record(vec![tiny], space, Objective::Throughput, true)
    };
    sweep_into(&capped, &capped_dir, Shard::WHOLE, false);
    let sweep = Sweep::from_record(&capped).expect("capped sweep");
    let kept: Vec<String> = sweep.space.iter().map(|a| a.name).collect();
    let within: Vec<String> = loaded
        .iter()
        .filter(|a| peak_power_w(a) <= cap)
        .map(|a| a.name)
        .collect();
    assert_eq!(kept, within);
    assert!(kept.len() < loaded.len());
    let found = finish(&sweep, &capped_dir).expect("summaries");
    let found = &found.workloads[0].row;
    assert_ne!(found.arch, unrestricted.arch);
    assert_eq!(
        (
            &found.arch,
            found.hbm_bytes,
            found.micro_batch,
            found.recompute
        ),
        (
            &brute.arch,
            brute.hbm_bytes,
            brute.micro_batch,
            brute.recompute
        )
    );
    assert_eq!(thr(found), thr(&brute));
}

#[test]
fn bad_sweep_input_is_reported() {
    let tmp = scratch("bad");
    let dir = tmp.path();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(args)
            .output()
            .expect("run tandem")
    };
    let out = dir.join("o");
    let base = [
        "search",
        "--workload",
        "workloads/bert-large.toml",
        "--space",
        "arch_specs/phaze-small.toml",
        "--devices",
        "8",
        "--out",
        out.to_str().expect("utf-8"),
    ];
    for (extra, needle) in [
        (vec!["--shard", "3/2"], "--shard"),
        (vec!["--hbm-gib", "-4"], "--hbm-gib"),
        (vec!["--micro-batch", "0"], "--micro-batch"),
        (vec!["--max-power-w", "0"], "--max-power-w"),
        (vec!["--max-power-w", "-300"], "--max-power-w"),
        (vec!["--max-power-w", "NaN"], "--max-power-w"),
        (vec!["--max-power-w", "1"], "--max-power-w"),
        (vec!["--resume"], "run.toml"),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra);
        let o = run(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}
