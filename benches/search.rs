//! Sweep speed (issue 5): BERT-Large on 64 devices over the 98-configuration
//! `arch_specs/phaze-small.toml` × micro-batch {1, 4} × recompute {none, full} × HBM {32 GiB}
//! (392 design points): one iteration is the whole pruned sweep (screen of every point, exact
//! evaluation of the undominated ones, points.csv streamed, summaries written). The exhaustive
//! sweep (`--no-prune`) is timed once from the CLI in BENCHMARKS.md: criterion's ten samples
//! of it would take too long.
//!
//! `cargo bench --bench search`

use criterion::{criterion_group, criterion_main, Criterion};
use std::path::PathBuf;
use tandem::placement::{RecomputeMode, ZeroStage};
use tandem::schedule::SolverOptions;
use tandem::search::{finish, run_sweep, Objective, Phase, RunOptions, Shard, Sweep, SweepRecord};

fn record() -> SweepRecord {
    let solver = SolverOptions::default();
    SweepRecord {
        tandem_version: "bench".into(),
        workloads: vec![PathBuf::from("workloads/bert-large.toml")],
        space: PathBuf::from("arch_specs/phaze-small.toml"),
        devices: 64,
        micro_batches: vec![1, 4],
        recompute: vec![RecomputeMode::None, RecomputeMode::Full],
        hbm_bytes: vec![32 << 30],
        zero: vec![ZeroStage::Replicated],
        fixed: Default::default(),
        objective: Objective::Throughput,
        prune: true,
        ilp_time_limit_s: solver.time_limit_s,
        ilp_node_limit: solver.node_limit,
        ilp_relative_gap: solver.relative_gap,
        search_node_limit: solver.search_node_limit,
        use_ilp: solver.use_ilp,
        inputs_sha256: Vec::new(),
        max_peak_power_w: None,
        power_levels_w: Vec::new(),
    }
}

fn sweep_once(record: &SweepRecord, out: &std::path::Path) {
    let _ = std::fs::remove_dir_all(out);
    let sweep = Sweep::from_record(record).expect("bundled inputs");
    let options = RunOptions {
        out_dir: out.to_path_buf(),
        shard: Shard::WHOLE,
        resume: false,
        progress: false,
        phase: Phase::Whole,
    };
    let stats = run_sweep(&sweep, record, &options).expect("sweep");
    finish(&sweep, out).expect("summaries");
    eprintln!(
        "{} points: {} evaluated, {} pruned, {} infeasible; screen {:.2} s, whole {:.2} s",
        stats.points,
        stats.evaluated,
        stats.pruned,
        stats.infeasible,
        stats.screen_time_s,
        stats.sweep_time_s
    );
}

fn sweeps(c: &mut Criterion) {
    let out = std::env::temp_dir().join(format!("tandem-bench-search-{}", std::process::id()));
    let mut group = c.benchmark_group("sweep bert-large x phaze-small, 64 devices");
    group.sample_size(10);
    let r = record();
    group.bench_function("pruned", |b| b.iter(|| sweep_once(&r, &out)));
    group.finish();
    let _ = std::fs::remove_dir_all(&out);
}

criterion_group!(benches, sweeps);
criterion_main!(benches);
