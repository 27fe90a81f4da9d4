#!/usr/bin/env bash
# Data-parallel throughput on one host: the main job's model (configs/debugmodel.toml) at
# 1 rank x 2 threads vs 2 ranks x 1 thread (FSDP, and DDP), the same global batch (2 x 512 tokens
# by default), sustained tokens/s over all ranks (warm-up step excluded). Also prints the bytes
# each rank sends per step in theory for the mode: FSDP here = f32 reduce-scatter + f32
# all-gather, DDP = f32 all-reduce, both 8 x Psi x (N-1)/N bytes (Psi = parameters), against the
# issue's ZeRO-3 theory with bf16 gathers, Psi x (2 + 2 + 4) x (N-1)/N. Communication goes
# through shared memory here.
#
#   bash bench/dist_throughput.sh [STEPS] [SEQ] [PRECISION]   # default 6 steps, 512, bfloat16
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6}
SEQ=${2:-512}
PREC=${3:-bfloat16}
TITAN=${TITAN_BIN:-./build/bin/titan}
[ -x "$TITAN" ] || { echo "build first: bash scripts/build.sh (or set TITAN_BIN)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
common=(--config configs/debugmodel.toml --training.steps="$STEPS" --training.seq_len="$SEQ"
        --training.mixed_precision_param="$PREC" --checkpoint.enable=false --checkpoint.last_save_in_hf=false
        --lr_scheduler.warmup_steps=1 --metrics.log_freq=1)

# Sustained tokens/s of rank 0 (the summary line) times the number of ranks.
total_tps() { sed -n 's/.*sustained \([0-9.]*\) tokens\/s.*/\1/p' "$1" | awk -v n="$2" '{printf "%.0f", $1 * n}'; }

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus, $STEPS steps of global batch 2 x $SEQ, $PREC, load $(cut -d' ' -f1 /proc/loadavg)"
OMP_NUM_THREADS=2 "$TITAN" train "${common[@]}" --training.local_batch_size=2 --job.dump_folder="$OUT/one" \
  >"$OUT/one.log" 2>&1
one=$(total_tps "$OUT/one.log" 1)
params=$(sed -n 's/.*, \([0-9]*\) parameters (.*/\1/p' "$OUT/one.log")
printf "%-32s %12s %9s\n" run "tokens/s" "vs 1 rank"
printf "%-32s %12s %9s\n" "1 rank x 2 threads" "$one" "1.00"
for mode in fsdp ddp; do
  mesh=(--parallelism.data_parallel_replicate_degree=1 --parallelism.data_parallel_shard_degree=2)
  [ "$mode" = ddp ] && mesh=(--parallelism.data_parallel_replicate_degree=2 --parallelism.data_parallel_shard_degree=1)
  OMP_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np 2 "$TITAN" train "${common[@]}" \
    "${mesh[@]}" --training.local_batch_size=1 --job.dump_folder="$OUT/$mode" >"$OUT/$mode.log" 2>&1
  tps=$(total_tps "$OUT/$mode.log" 2)
  printf "%-32s %12s %9s\n" "2 ranks x 1 thread, $mode" "$tps" "$(awk -v a="$tps" -v b="$one" 'BEGIN{printf "%.2f", a/b}')"
done
awk -v p="$params" 'BEGIN {
  n = 2; f = (n - 1) / n;
  printf "bytes sent per rank per step (N = 2, Psi = %d parameters):\n", p;
  printf "  this engine, FSDP or DDP (f32 grads + f32 params): 8 x Psi x (N-1)/N = %.1f MB\n", 8 * p * f / 1e6;
  printf "  ZeRO-3 with bf16 gathers (issue theory):   (2+2+4) x Psi x (N-1)/N = %.1f MB\n", 8 * p * f / 1e6 }'
