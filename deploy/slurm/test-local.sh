#!/usr/bin/env bash
# End-to-end check of the Slurm scripts on a one-machine cluster (run as root; installs
# slurm-wlm and munge when missing):
#   TANDEM=target/release/tandem bash deploy/slurm/test-local.sh
# Brings the cluster up (local-cluster.sh), runs a small sweep locally, submits the same
# sweep as 3 shards (submit.sh: seed job, screen array, exact array, merge), waits, and
# compares the merged files with the local run byte for byte. Then it cuts shard 1's points.csv in half
# (as a killed task leaves it), requeues its finished exact task and the merge with
# `scontrol requeue`, and checks that the resumed shard gives the same bytes again. Stops
# everything it started.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
here=$repo/deploy/slurm
tandem=$(realpath "${TANDEM:-$repo/target/release/tandem}")
export TANDEM=$tandem
work=$(mktemp -d /tmp/tandem-slurm-test.XXXXXX)
export TANDEM_SLURM_DIR=$work/cluster

cleanup() {
  bash "$here/local-cluster.sh" down >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

bash "$here/local-cluster.sh" up
export SLURM_CONF=$TANDEM_SLURM_DIR/slurm.conf

# A two-block GPT on a space of 909 configurations: two screen blocks, seconds per shard.
cat > "$work/tiny.toml" <<'TOML'
name = "tiny"
family = "gpt"
layers = 2
hidden = 256
heads = 4
vocab = 1024
seq_len = 128
global_batch = 16
TOML
sed -e 's/"tensor.count" = { min = 1, max = 4096 }/"tensor.count" = { min = 4, max = 256 }/' \
    -e 's/"vector.count" = { min = 1, max = 4096 }/"vector.count" = { min = 1, max = 64 }/' \
    -e 's/"tensor.rows" = { min = 2, max = 256 }/"tensor.rows" = { min = 16, max = 128 }/' \
    -e 's/"tensor.cols" = { min = 2, max = 256 }/"tensor.cols" = { min = 16, max = 128 }/' \
    -e 's/"glb.bytes" = { min = 2_097_152, max = 134_217_728 }/"glb.bytes" = { min = 33_554_432, max = 67_108_864 }/' \
    "$repo/arch_specs/phaze.toml" > "$work/space.toml"
args=(--workload "$work/tiny.toml" --space "$work/space.toml" --devices 8
      --micro-batch 1,2 --recompute none,full --hbm-gib 16)

"$tandem" search "${args[@]}" --quiet --out "$work/local" >/dev/null 2>&1

# Waits until none of the given jobs is pending or running, then requires each to have
# completed.
wait_for() {
  for _ in $(seq 1 600); do
    if [ -z "$(squeue -h -j "$(IFS=,; echo "$*")" 2>/dev/null)" ]; then
      break
    fi
    sleep 1
  done
  for job in "$@"; do
    if scontrol -o show job "$job" | grep -v 'JobState=COMPLETED' | grep -q JobState; then
      echo "test-local.sh: job $job did not complete:" >&2
      scontrol -o show job "$job" | grep -o 'JobId=[^ ]* .*JobState=[^ ]*' >&2 || true
      tail -n 20 "$work/run/logs/"*.out >&2 || true
      exit 1
    fi
  done
}

same_files() {
  for f in run.toml points.csv pareto.csv best.json pareto.svg; do
    if ! cmp -s "$work/local/$f" "$work/run/all/$f"; then
      echo "test-local.sh: $f of the Slurm run differs from the local run ($1)" >&2
      exit 1
    fi
  done
}

read -r seed screen exact merge < <(bash "$here/submit.sh" 3 "$work/run" -- "${args[@]}")
echo "submitted: seed $seed, screen $screen, exact $exact, merge $merge"
wait_for "$seed" "$screen" "$exact" "$merge"
same_files "after the job arrays"
"$tandem" status "$work"/run/shard-*

# A task cut short and requeued resumes to the same bytes.
points=$work/run/shard-1/points.csv
head -n $(( $(wc -l < "$points") / 2 )) "$points" > "$points.half"
mv "$points.half" "$points"
scontrol requeue "${exact}_1"
wait_for "$exact"
scontrol requeue "$merge"
wait_for "$merge"
same_files "after requeueing a shard cut in half"
echo "test-local.sh: the Slurm sweep equals the local run, also after a requeued shard"
