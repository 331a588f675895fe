#!/usr/bin/env bash
# The main job on bundled defaults: plans every bundled PHAZE workload on each bundled chip
# for a 1024-device cluster (micro-batch, recompute, t, p, d and stages all searched) and
# writes results/default/plans.csv (one row per workload x chip) plus the best plan as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-deps.sh
cargo build --release --quiet
out=results/default
mkdir -p "$out"
rm -f "$out/plans.csv"
for workload in bert-large gpt2-xl opt-350m llama2-7b megatron-gpt2-8.3b gpt3-175b; do
  for chip in tpuv4 a100 h100; do
    echo "== $workload on $chip" >&2
    target/release/tandem plan \
      --workload "workloads/$workload.toml" --arch "arch_specs/$chip.toml" --devices 1024 \
      --csv "$out/plans.csv" --json >"$out/$workload-$chip.json" || true
  done
done
echo "wrote $out/plans.csv" >&2
