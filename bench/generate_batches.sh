#!/usr/bin/env bash
# Batched generation throughput: the same prompts continued by `titan generate --prompts-file` with
# --batch-size 1 (one prompt at a time) and larger batches (the prompts as rows of one batch, each
# step reading the weights once for all of them). The prompts are the first words of the held-out
# documents of the bundled corpus (assets/, scripts/fetch_assets.sh), so their lengths differ and
# the shorter are left-padded. Greedy, --ignore-eos. Prints new tokens/s per batch size, its ratio
# to batch size 1, and how many prompts got the same ids as at batch size 1 (a batch's products
# round differently, so a near tie may go the other way in f32).
#
#   bash bench/generate_batches.sh HF_DIR [PROMPTS] [NEW_TOKENS] [BATCH_SIZES...]
#   bash bench/generate_batches.sh outputs/debugmodel/checkpoint/step-40-hf 16 64 1 4 16
#   TITAN_DTYPE=bfloat16 bash bench/generate_batches.sh outputs/debugmodel/checkpoint/step-40-hf
#   TITAN_GENERATE_ARGS="--num-beams 4" bash bench/generate_batches.sh outputs/debugmodel/checkpoint/step-40-hf 16 32 1 4
#     (beam search: tokens/s counts the returned sequences' tokens, one per prompt)
set -euo pipefail
cd "$(dirname "$0")/.."
HF=${1:?usage: bench/generate_batches.sh HF_DIR [PROMPTS] [NEW_TOKENS] [BATCH_SIZES...]}
PROMPTS=${2:-16}
NEW=${3:-64}
shift $(($# < 3 ? $# : 3))
SIZES=${*:-"1 4 16"}
TITAN=${TITAN_BIN:-./build/bin/titan}
DTYPE=${TITAN_DTYPE:-float32}
EXTRA=${TITAN_GENERATE_ARGS:-}
VAL=${TITAN_ASSETS_DIR:-assets}/datasets/nlp-corpus-validation/val.jsonl
[ -x "$TITAN" ] || { echo "build first: bash scripts/build.sh (or set TITAN_BIN)" >&2; exit 1; }
[ -f "$VAL" ] || { echo "no $VAL: run bash scripts/setup.sh" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# Prompt i: the first 4 + 3 * (i % 5) words of held-out document i.
python3 - "$VAL" "$PROMPTS" >"$OUT/prompts.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for i, doc in enumerate(lines[: int(sys.argv[2])]):
    print(json.dumps({"prompt": " ".join(doc["text"].split()[: 4 + 3 * (i % 5)])}))
PY
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus, $(lscpu | sed -n 's/^Model name: *//p'), $HF, $DTYPE, $PROMPTS prompts, $NEW new tokens each${EXTRA:+, $EXTRA}"
printf "%10s %12s %8s %9s %6s\n" "batch size" "tokens/s" "vs 1" "same ids" load
for b in $SIZES; do
  load=$(cut -d' ' -f1 /proc/loadavg)
  "$TITAN" generate --model-path "$HF" --prompts-file "$OUT/prompts.jsonl" --batch-size "$b" --max-new-tokens "$NEW" \
    --ignore-eos --dtype "$DTYPE" $EXTRA >"$OUT/b$b.jsonl" 2>"$OUT/b$b.err"
  python3 - "$OUT" "$b" "$load" "$(echo "$SIZES" | awk '{print $1}')" <<'PY'
import json, re, sys
out, b, load, first = sys.argv[1:5]
tps = float(re.search(r"\(([0-9.]+) tokens/s", open(f"{out}/b{b}.err").read()).group(1))
rows = [json.loads(l)["ids"] for l in open(f"{out}/b{b}.jsonl")]
base_rows = [json.loads(l)["ids"] for l in open(f"{out}/b{first}.jsonl")]
base_tps = float(re.search(r"\(([0-9.]+) tokens/s", open(f"{out}/b{first}.err").read()).group(1))
same = sum(a == c for a, c in zip(rows, base_rows))
print("%10s %12.1f %7.2fx %5d/%-3d %6s" % (b, tps, tps / base_tps, same, len(rows), load))
PY
done
