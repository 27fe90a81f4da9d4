# Sourced by the data-parallel benches: the main job's model (configs/debugmodel.toml) as they all
# run it. Reads [STEPS] [SEQ] [PRECISION] (default 6 steps, 512, bfloat16) and sets STEPS, SEQ, PREC,
# TITAN (the binary, or $TITAN_BIN), OUT (a temporary folder removed on exit) and `common` (the
# train arguments: no checkpoints, no validation, one warm-up step, every step logged).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
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
        --validation.enable=false --lr_scheduler.warmup_steps=1 --metrics.log_freq=1)
