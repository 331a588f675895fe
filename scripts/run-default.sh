#!/usr/bin/env bash
# The main job on bundled defaults: plans each bundled PHAZE workload on each bundled chip
# for a 64-device cluster (micro-batch, recompute, t, p, d and the stage partition searched)
# and writes results/default/plans.csv (one row per workload x chip, DESIGN §9 columns) plus
# each best plan as JSON. A workload that fits nowhere gets an `infeasible` row with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-deps.sh
cargo build --release --quiet
out=results/default
mkdir -p "$out"
rm -f "$out/plans.csv"
for workload in bert-large gpt2-xl opt-350m llama2-7b megatron-gpt2-8.3b gpt3-175b llama2-70b; do
  for chip in tpuv4 a100 h100; do
    echo "== $workload on $chip" >&2
    status=0
    target/release/tandem plan \
      --workload "workloads/$workload.toml" --arch "arch_specs/$chip.toml" --devices 64 \
      --micro-batch 1,2,4 --recompute none,full \
      --csv "$out/plans.csv" --json >"$out/$workload-$chip.json" || status=$?
    # 3 = no plan fits (recorded in the CSV); anything else non-zero is an error.
    if [ "$status" -ne 0 ] && [ "$status" -ne 3 ]; then exit "$status"; fi
  done
done
echo "wrote $out/plans.csv" >&2
