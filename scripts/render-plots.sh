#!/usr/bin/env bash
# Renders every SVG tandem writes to PNG, for a reader to look at: the committed Pareto and
# comparison plots under results/, and the Gantt charts of one layer schedule (README's
# `tandem schedule --gantt` example). Fails when an SVG does not render. Needs rsvg-convert
# (Debian: apt-get install librsvg2-bin). Usage: scripts/render-plots.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/plots}"
rm -rf "$out"
mkdir -p "$out/gantt"
cargo build --release --quiet
target/release/tandem schedule --workload workloads/llama2-7b.toml --arch arch_specs/h100.toml \
  --tp 2 --gantt "$out/gantt/llama.svg" >/dev/null
count=0
while IFS= read -r svg; do
  name="${svg#"$out"/}"
  png="$out/$(echo "${name%.svg}" | tr / _).png"
  rsvg-convert "$svg" -o "$png"
  count=$((count + 1))
done < <(find results "$out/gantt" -name '*.svg' | sort)
echo "rendered $count SVGs to $out"
