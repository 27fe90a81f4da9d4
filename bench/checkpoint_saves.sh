#!/usr/bin/env bash
# What checkpointing costs a run, saved in the foreground and in the background
# (checkpoint.async_mode): the same job three times, with no checkpoints, with synchronous saves and
# with saves in the background, every INTERVAL steps. Reports the run's wall time, what the saves
# added to it (wall time less the run without checkpoints), titan's own figure for the time the
# training thread spent saving (the sum of "saved ... in X s" of the saves made in the foreground,
# the last step's always is, and of "copied aside in X s" of those in the background) and the
# sustained tokens/s (steps only: a synchronous save lies between steps, a background one overlaps
# them and slows them where it shares their cores). OMP_NUM_THREADS=1 leaves a core to the writer,
# as a GPU job leaves the host's cores.
# No peer figure: the PyTorch CPU peer harness does not checkpoint.
#
#   bash bench/checkpoint_saves.sh [STEPS] [INTERVAL] [CONFIGS]
#   bash bench/checkpoint_saves.sh 12 3 "debugmodel debugmodel_moe"
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-12}
INTERVAL=${2:-3}
CONFIGS=${3:-"debugmodel debugmodel_moe"}
TITAN=${TITAN_BIN:-./build/bin/titan}
[ -x "$TITAN" ] || { echo "build first: bash scripts/build.sh (or set TITAN_BIN)" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus ($(lscpu | sed -n 's/^Model name: *//p')), $STEPS steps, a save every $INTERVAL, titan: $TITAN"
printf "%-15s %-10s %8s %12s %14s %10s %9s\n" config saves "wall s" "added s" "titan's s" "tok/s" "peak MiB"
for config in $CONFIGS; do
  base=""
  for mode in none disabled async; do
    dump="$OUT/$config-$mode"
    args=(--job.dump_folder="$dump" --training.steps="$STEPS" --validation.enable=false
          --checkpoint.last_save_in_hf=false --lr_scheduler.warmup_steps=1)
    if [ "$mode" = none ]; then
      args+=(--checkpoint.enable=false)
    else
      args+=(--checkpoint.enable=true --checkpoint.interval="$INTERVAL" --checkpoint.keep_latest_k=2
             --checkpoint.async_mode="$mode")
    fi
    start=$(date +%s.%N)
    /usr/bin/time -v "$TITAN" train --config "configs/$config.toml" "${args[@]}" >"$OUT/log" 2>"$OUT/time"
    wall=$(awk -v a="$(date +%s.%N)" -v b="$start" 'BEGIN {printf "%.2f", a - b}')
    [ -z "$base" ] && base=$wall
    # Synchronous saves: "saved DIR in X s"; background saves: "step N copied aside in X s".
    titan_s=$({ grep -oE "(saved [^ ]+ in|copied aside in) [0-9.]+ s" "$OUT/log" || true; } | awk '{s += $(NF-1)} END {printf "%.1f", s}')
    tps=$(sed -n 's/.*sustained \([0-9]*\) tokens\/s.*/\1/p' "$OUT/log")
    peak=$(awk '/Maximum resident set size/ {printf "%.0f", $6/1024}' "$OUT/time")
    label=$([ "$mode" = none ] && echo none || { [ "$mode" = async ] && echo background || echo foreground; })
    printf "%-15s %-10s %8.1f %12.1f %14s %10s %9s\n" "$config" "$label" "$wall" "$(awk -v a="$wall" -v b="$base" 'BEGIN {print a - b}')" \
      "$([ "$mode" = none ] && echo - || echo "$titan_s")" "$tps" "$peak"
  done
done
