#!/usr/bin/env bash
# The sweep-growth benchmark of BENCHMARKS.md ("Sweep growth"): the GPT-3 175B sweep of the
# full-space benchmark (HBM 32/64/80 GiB × micro-batch 1, 2, 4, 8 × recompute none/full) over
# spaces of growing size — PHAZE's (arch_specs/phaze.toml) and the finer grids
# arch_specs/phaze-fine4.toml (3.5×) and arch_specs/phaze-fine16.toml (15.5×) — on each
# cluster size asked for. Prints one CSV row per run: space, devices, configurations, points,
# wall and CPU seconds, peak resident memory, the points that reach each stage and each
# stage's seconds (the pilot's included in the work and plan bounds). The rows also go to
# OUT/growth.csv, and their chart (wall time and exact points against points, one line per
# cluster size) to OUT/growth.svg. Each run's output directory is removed after it
# (points.csv runs to gigabytes).
#   bash scripts/bench-growth.sh "SPACES" "DEVICES" [OUT=/tmp/tandem-bench-growth]
#   e.g. bash scripts/bench-growth.sh "phaze phaze-fine4" "64 1024 4096"
set -euo pipefail
cd "$(dirname "$0")/.."
spaces=${1:-"phaze phaze-fine4 phaze-fine16"}
devices=${2:-"64 1024 4096"}
out=${3:-/tmp/tandem-bench-growth}
cargo build --release --quiet --bin tandem --example growth_plot
mkdir -p "$out"
echo "space,devices,configurations,points,wall_s,cpu_s,peak_kb,plan_bounded,exact_ok,infeasible,pruned,work_bounds_s,plan_bounds_s,exact_s,pilot_configs,pilot_s" \
  | tee "$out/growth.csv"
for space in $spaces; do
  for n in $devices; do
    dir="$out/$space-$n"
    rm -rf "$dir"
    /usr/bin/time -f "%e,%U,%S,%M" -o "$out/time.txt" target/release/tandem search \
      --workload workloads/gpt3-175b.toml --space "arch_specs/$space.toml" --devices "$n" \
      --micro-batch 1,2,4,8 --recompute none,full --hbm-gib 32,64,80 --quiet --out "$dir" \
      > "$out/log.txt" 2>&1 || { cat "$out/log.txt" >&2; exit 1; }
    IFS=, read -r wall user sys peak < "$out/time.txt"
    configs=$(sed -n 's/^sweeping \([0-9]*\) configurations.*/\1/p' "$out/log.txt")
    read -r points ok infeasible pruned < <(sed -n \
      's/^\([0-9]*\) points: [0-9]* evaluated (\([0-9]*\) ok, \([0-9]*\) infeasible), \([0-9]*\) pruned.*/\1 \2 \3 \4/p' \
      "$out/log.txt")
    read -r work plan bounded exact < <(sed -n \
      's/^screen [0-9.]* s (work bounds \([0-9.]*\) s; plan bounds and list-schedule plans \([0-9.]*\) s for \([0-9]*\) points.*exact points \([0-9.]*\) s.*/\1 \2 \3 \4/p' \
      "$out/log.txt")
    read -r pilot pilot_configs < <(sed -n \
      's/^screen .*of which the pilot \([0-9.]*\) s over \([0-9]*\) configurations.*/\1 \2/p' \
      "$out/log.txt")
    cpu=$(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }')
    echo "$space,$n,$configs,$points,$wall,$cpu,$peak,$bounded,$ok,$infeasible,$pruned,$work,$plan,$exact,$pilot_configs,$pilot" \
      | tee -a "$out/growth.csv"
    rm -rf "$dir"
  done
done
target/release/examples/growth_plot "$out/growth.csv" "$out/growth.svg"
