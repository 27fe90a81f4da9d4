#!/usr/bin/env bash
# Data-parallel throughput on one host: the main job's model (configs/debugmodel.toml) at
# 1 rank x 2 threads vs 2 ranks x 1 thread (FSDP = ZeRO-3, and DDP), the same global batch (2 x 512
# tokens by default), sustained tokens/s over all ranks (warm-up step excluded). Then, per mode,
# the bytes rank 0 sent per step (metrics.jsonl comm_mib) against the ZeRO-3 theory, and the share
# of the step it spent inside communication calls (comm_seconds / step_seconds: what compute did
# not hide). Communication goes through shared memory here.
#
#   bash bench/dist_throughput.sh [STEPS] [SEQ] [PRECISION]   # default 6 steps, 512, bfloat16
source "$(dirname "$0")/debugmodel_job.sh" "$@"

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
# Theory for debugmodel (vocab 151936 x dim 256 tied embedding + the final norm = the root blocks,
# gathered once per micro-batch; every block gathered in bf16 under bf16, f32 otherwise):
#   ZeRO-3: Psi_layers x (g + g + 4) x (N-1)/N + Psi_root x (g + 4) x (N-1)/N;  DDP: 2 x 4 x Psi x (N-1)/N
python3 - "$OUT" "$params" "$PREC" <<'PY'
import json, sys
out, psi, prec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
root = 151936 * 256 + 256
layers = psi - root
g = 2 if prec == "bfloat16" else 4
n, f = 2, 0.5
theory = {"fsdp": (layers * (g + g + 4) + root * (g + 4)) * f, "ddp": 2 * 4 * psi * f}
print(f"communication per rank per step (N = 2, Psi = {psi} = {layers} in layers + {root} in embedding/norm):")
print(f"{'mode':6} {'sent MiB':>9} {'theory MiB':>11} {'comm s':>8} {'step s':>8} {'in comm':>8}")
for mode in ("fsdp", "ddp"):
    rows = [json.loads(l) for l in open(f"{out}/{mode}/metrics.jsonl") if l.strip()]
    rows = [r for r in rows if not r["warmup"] and "val_loss" not in r] or rows
    mib = sum(r["comm_mib"] for r in rows) / len(rows)
    cs = sum(r["comm_seconds"] for r in rows) / len(rows)
    ss = sum(r["step_seconds"] for r in rows) / len(rows)
    print(f"{mode:6} {mib:9.1f} {theory[mode] / 2**20:11.1f} {cs:8.3f} {ss:8.3f} {100 * cs / ss:7.1f}%")
PY
