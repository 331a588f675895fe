#!/usr/bin/env bash
# The scale-out benchmark of BENCHMARKS.md ("Sweeps"): the full GPT-3 175B PHAZE-space sweep
# as one run, then split — the seed step, N shards' screen passes, then their exact passes —
# run one after another on this machine, then merged; prints each run's wall time, CPU time and peak resident memory,
# and checks that the merged files equal the single run's.
#   bash scripts/bench-shards.sh [N=8] [OUT=/tmp/tandem-bench-shards]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8}
out=${2:-/tmp/tandem-bench-shards}
tandem=target/release/tandem
args=(--workload workloads/gpt3-175b.toml --space arch_specs/phaze.toml --devices 1024
      --micro-batch 1,2,4,8 --recompute none,full --hbm-gib 32,64,80 --quiet)
rm -rf "$out"
mkdir -p "$out"
timed() {
  local label=$1
  shift
  /usr/bin/time -f "$label: %e s wall, %U s user, %S s sys, %M KB peak" "$@" >/dev/null 2>"$out/time.tmp" || {
    cat "$out/time.tmp" >&2
    exit 1
  }
  tail -n 1 "$out/time.tmp"
}
timed "single run" "$tandem" search "${args[@]}" --out "$out/single"
screens=()
for i in $(seq 0 $((n - 1))); do
  screens+=("$out/shard-$i")
done
timed "seed" "$tandem" search "${args[@]}" --phase seed --out "$out/seed"
for i in $(seq 0 $((n - 1))); do
  timed "shard $i/$n screen" "$tandem" search "${args[@]}" --shard "$i/$n" --phase screen \
    --seed "$out/seed" --out "$out/shard-$i"
done
for i in $(seq 0 $((n - 1))); do
  timed "shard $i/$n exact" "$tandem" search "${args[@]}" --shard "$i/$n" --phase exact \
    --screens "${screens[@]}" --resume --out "$out/shard-$i"
done
timed "merge" "$tandem" merge "${screens[@]}" --out "$out/merged"
for f in run.toml points.csv pareto.csv best.json pareto.svg; do
  cmp "$out/single/$f" "$out/merged/$f"
done
echo "merged files equal the single run's"
