#!/usr/bin/env bash
# The main job on bundled defaults: a co-design sweep of three PHAZE workloads on 64 devices
# over the narrowed PHAZE space (arch_specs/phaze-small.toml) x HBM x micro-batch x recompute,
# each design point with its best parallel plan. Writes results/default/ (points.csv,
# pareto.csv, best.json, pareto.svg, run.toml) and prints the best points.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-deps.sh
cargo build --release --quiet
rm -rf results/default
target/release/tandem search \
  --workload workloads/bert-large.toml --workload workloads/gpt2-xl.toml \
  --workload workloads/opt-350m.toml \
  --space arch_specs/phaze-small.toml --devices 64 \
  --micro-batch 1,2,4 --recompute none,full --hbm-gib 16,32 \
  --out results/default "$@"
