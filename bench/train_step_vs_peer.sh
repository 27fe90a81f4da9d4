#!/usr/bin/env bash
# Side-by-side training-step throughput: titan.cpp vs the PyTorch CPU peer
# (../shared/peers/cpu/cpu_peer.py, Debian python3-torch), same machine, same run.
# Cases: debugmodel, debugmodel_moe and 0.6B (configs/qwen3_0.6b.toml), batch 2 x seq 512 (one
# micro-batch, no activation checkpointing, as the peer),
# fp32 and bf16 mixed precision. Reports median-step tokens/s for the peer and sustained tokens/s
# for titan (both exclude the first, warm-up step), peak resident memory of each process
# (/usr/bin/time), the ratios, and the 1-minute load average before each case (the machine may be
# shared: compare only rows measured at a similar load).
#
#   bash bench/train_step_vs_peer.sh [STEPS] [CASES]   # default 3 measured steps, all four cases
#   TITAN_BIN=build-perf/bin/titan bash bench/train_step_vs_peer.sh 3 "debugmodel:bf16"
#   TITAN_KERNELS='attention = { impl = "bf16_probs", modules = "layers.*.attention" }' \
#     bash bench/train_step_vs_peer.sh 3 "debugmodel:bf16"   # titan with a [kernels] substitution
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-3}
CASES=${2:-"debugmodel:fp32 debugmodel:bf16 debugmodel_moe:fp32 debugmodel_moe:bf16"}
PEER=${TITAN_PEER:-../shared/peers/cpu/cpu_peer.py}
TITAN=${TITAN_BIN:-./build/bin/titan}
[ -x "$TITAN" ] || { echo "build first: bash scripts/build.sh (or set TITAN_BIN)" >&2; exit 1; }
[ -f "$PEER" ] || { echo "peer harness not found at $PEER (set TITAN_PEER)" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

peak_mib() { awk '/Maximum resident set size/ {printf "%.0f", $6/1024}' "$1"; }
load1() { cut -d' ' -f1 /proc/loadavg; }

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus, $STEPS measured steps per case, titan: $TITAN"
[ -n "${TITAN_KERNELS:-}" ] && echo "# titan [kernels]: $TITAN_KERNELS"
printf "%-15s %-5s %10s %11s %7s %9s %10s %11s\n" model prec "peer tok/s" "titan tok/s" ratio "peer MiB" \
  "titan MiB" "load p/t"
for case in $CASES; do
  model=${case%%:*} prec=${case##*:}
  lp=$(load1)
  /usr/bin/time -v /usr/bin/python3 "$PEER" "$model" "$prec" 2 512 "$STEPS" \
    >"$OUT/peer.json" 2>"$OUT/peer.time"
  peer_tps=$(python3 -c "import json;print(round(json.load(open('$OUT/peer.json'))['tokens_per_s'],1))")
  mp=$([ "$prec" = bf16 ] && echo bfloat16 || echo float32)
  config="configs/$model.toml"
  [ -f "$config" ] || config="configs/qwen3_${model,,}.toml"  # 0.6B -> configs/qwen3_0.6b.toml
  if [ -n "${TITAN_KERNELS:-}" ]; then  # the config plus a [kernels] table (not settable with --k=v)
    { cat "$config"; printf '\n[kernels]\n%s\n' "$TITAN_KERNELS"; } >"$OUT/$model.toml"
    config="$OUT/$model.toml"
  fi
  lt=$(load1)
  /usr/bin/time -v "$TITAN" train --config "$config" --job.dump_folder="$OUT/titan" \
    --training.steps=$((STEPS + 1)) --lr_scheduler.warmup_steps=1 --training.local_batch_size=2 \
    --training.global_batch_size=2 --activation_checkpoint.mode=none \
    --training.seq_len=512 --training.mixed_precision_param=$mp --checkpoint.enable=false \
    --checkpoint.last_save_in_hf=false --validation.enable=false --metrics.log_freq=1 \
    >"$OUT/titan.log" 2>"$OUT/titan.time"
  titan_tps=$(sed -n 's/.*sustained \([0-9.]*\) tokens\/s.*/\1/p' "$OUT/titan.log")
  ratio=$(python3 -c "print(f'{$titan_tps/$peer_tps:.2f}')")
  printf "%-15s %-5s %10s %11s %7s %9s %10s %11s\n" "$model" "$prec" "$peer_tps" "$titan_tps" "${ratio}x" \
    "$(peak_mib "$OUT/peer.time")" "$(peak_mib "$OUT/titan.time")" "$lp/$lt"
  rm -rf "$OUT/titan"
done
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
