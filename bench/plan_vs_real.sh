#!/usr/bin/env bash
# `titan plan`'s estimates against real `titan train` runs on this machine: the main job's model
# (configs/debugmodel.toml), the same global batch (2 x SEQ tokens) on 1 rank x 2 threads and on
# 2 ranks x 1 thread (FSDP and DDP, mpirun --oversubscribe), validation and checkpoints off.
# For each: estimated (the plan's "communication hidden" figure) vs measured tokens/s per rank
# (sustained, warm-up step excluded) and peak
# memory per rank (the plan's meta-device peak vs the allocator's peak in metrics.jsonl). The plan
# runs with the rank's thread count, so its GEMM rate is the one a rank gets; communication uses
# the plan's shared-memory defaults. The machine may be shared: the load is printed.
#
#   bash bench/plan_vs_real.sh [STEPS] [SEQ] [PRECISION]   # default 6 steps, 512, bfloat16
source "$(dirname "$0")/debugmodel_job.sh" "$@"

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cpus," \
  "$STEPS steps of global batch 2 x $SEQ, $PREC, load $(cut -d' ' -f1 /proc/loadavg)"
printf "%-22s %11s %11s %6s %10s %10s %6s\n" run "plan tok/s" "real tok/s" ratio "plan GiB" "real GiB" ratio
# name ranks threads local_batch mesh-flag
run_case() {
  local name=$1 ranks=$2 threads=$3 batch=$4 mesh=$5
  local mesh_keys=(--parallelism.data_parallel_replicate_degree=1 --parallelism.data_parallel_shard_degree=1)
  [ "$mesh" = "dp_shard=2" ] && mesh_keys=(--parallelism.data_parallel_replicate_degree=1 --parallelism.data_parallel_shard_degree=2)
  [ "$mesh" = "dp_replicate=2" ] && mesh_keys=(--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1)
  OMP_NUM_THREADS=$threads "$TITAN" plan "${common[@]}" --training.local_batch_size="$batch" --mesh "$mesh" \
    --memory-per-rank 64GiB >"$OUT/$name.plan" 2>&1
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=$threads "$TITAN" train "${common[@]}" --training.local_batch_size="$batch" \
      --job.dump_folder="$OUT/$name" >"$OUT/$name.log" 2>&1
  else
    OMP_NUM_THREADS=$threads mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np "$ranks" "$TITAN" train \
      "${common[@]}" "${mesh_keys[@]}" --training.local_batch_size="$batch" --job.dump_folder="$OUT/$name" \
      >"$OUT/$name.log" 2>&1
  fi
  local plan_tps real_tps plan_gib real_gib
  plan_tps=$(sed -n 's/^tokens\/s estimate: \([0-9.e+]*\) per rank.*/\1/p' "$OUT/$name.plan")
  real_tps=$(sed -n 's/.*sustained \([0-9.]*\) tokens\/s.*/\1/p' "$OUT/$name.log")
  plan_gib=$(sed -n 's/^  peak per rank *\([0-9.]*\) GiB/\1/p' "$OUT/$name.plan")
  real_gib=$(tail -1 "$OUT/$name/metrics.jsonl" | python3 -c "import json,sys;print(round(json.load(sys.stdin)['memory_gib'],2))")
  awk -v n="$name" -v pt="$plan_tps" -v rt="$real_tps" -v pg="$plan_gib" -v rg="$real_gib" \
    'BEGIN {printf "%-22s %11.0f %11.0f %6.2f %10s %10s %6.3f\n", n, pt, rt, pt / rt, pg, rg, pg / rg}'
  sed -n 's/^  GEMM rate *\(.*\)/    GEMM: \1/p; s/^  communication *\(.*\)/    comm: \1/p' "$OUT/$name.plan"
}
run_case "1 rank x 2 threads" 1 2 2 dp_shard=1
run_case "FSDP 2 ranks x 1 thr" 2 1 1 dp_shard=2
run_case "DDP 2 ranks x 1 thr" 2 1 1 dp_replicate=2
echo "# tok/s per rank; ratio = plan / real (> 1: the plan is optimistic)"
