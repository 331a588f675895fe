#!/usr/bin/env bash
# Submits a tandem sweep split over N Slurm array tasks:
#   deploy/slurm/submit.sh N OUT -- [tandem search arguments, without --out/--shard]
# 1. a seed job (screens block 0, which seeds every other block),
# 2. an array of N screen tasks after it (each bounds its share of the space),
# 3. an array of N exact tasks after all of them (--dependency=afterok),
# 4. a merge job after those, writing OUT/all (the files one run would write).
# Prints the four job ids. The binary is $TANDEM (default: tandem on PATH); extra sbatch
# options (partition, time, memory) go in $SBATCH_OPTIONS. Watch it with
# `tandem status OUT/shard-*`; logs are in OUT/logs/.
set -euo pipefail

if [ $# -lt 3 ] || [ "$2" = -- ] || [ "$3" != -- ]; then
  echo "usage: $0 N OUT -- [tandem search arguments]" >&2
  exit 2
fi
n=$1
out=$2
shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/logs"
read -r -a options <<< "${SBATCH_OPTIONS:-}"

id() { echo "${1%%;*}"; }
seed=$(id "$(sbatch --parsable "${options[@]}" --output="$out/logs/seed.out" \
  "$here/shard.sbatch" seed "$n" "$out" "$@")")
screen=$(id "$(sbatch --parsable "${options[@]}" --array=0-$((n - 1)) \
  --dependency=afterok:"$seed" --output="$out/logs/screen-%a.out" \
  "$here/shard.sbatch" screen "$n" "$out" "$@")")
exact=$(id "$(sbatch --parsable "${options[@]}" --array=0-$((n - 1)) \
  --dependency=afterok:"$screen" --output="$out/logs/exact-%a.out" \
  "$here/shard.sbatch" exact "$n" "$out" "$@")")
merge=$(id "$(sbatch --parsable "${options[@]}" --dependency=afterok:"$exact" \
  --output="$out/logs/merge.out" "$here/merge.sbatch" "$n" "$out")")
echo "$seed $screen $exact $merge"
