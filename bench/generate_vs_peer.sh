#!/usr/bin/env bash
# Greedy generation throughput, side by side on one machine in one run: `titan generate` (the prompt
# once, then each new token over its KV cache) against the generation peer, torchtitan's
# scripts/generate loop (every token reruns the whole sequence) on the PyTorch reference Qwen3
# (bench/generate_peer.py, Debian python3-torch). Both load the same Hugging Face folder and take the
# same prompt ids; the table gives new tokens/s, the ratio, whether the greedy ids agree, and the
# 1-minute load average before each row.
#
#   bash bench/generate_vs_peer.sh HF_DIR [NEW_TOKENS...]     # default 32 128
#   TITAN_PREC=bf16 bash bench/generate_vs_peer.sh outputs/debugmodel/checkpoint/step-40-hf 32
set -euo pipefail
cd "$(dirname "$0")/.."
HF=${1:?usage: bench/generate_vs_peer.sh HF_DIR [NEW_TOKENS...]}
shift
LENGTHS=${*:-"32 128"}
PROMPT=${TITAN_PROMPT_IDS:-785,3840,315,279,3283}  # "The history of the city" in Qwen3's tokenizer
TITAN=${TITAN_BIN:-./build/bin/titan}
PREC=${TITAN_PREC:-fp32}
[ -x "$TITAN" ] || { echo "build first: bash scripts/build.sh (or set TITAN_BIN)" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
dtype=$([ "$PREC" = bf16 ] && echo bfloat16 || echo float32)

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus, $(lscpu | sed -n 's/^Model name: *//p'), $HF, $PREC, prompt $PROMPT"
printf "%10s %11s %12s %8s %10s %6s\n" "new tokens" "peer tok/s" "titan tok/s" ratio "same ids" load
for n in $LENGTHS; do
  load=$(cut -d' ' -f1 /proc/loadavg)
  /usr/bin/python3 bench/generate_peer.py "$HF" "$PROMPT" "$n" "$PREC" >"$OUT/peer.json"
  "$TITAN" generate --model-path "$HF" --prompt-ids "$PROMPT" --max-new-tokens "$n" --ignore-eos --dtype "$dtype" \
    --json >"$OUT/titan.json" 2>/dev/null
  python3 - "$OUT/peer.json" "$OUT/titan.json" "$n" "$load" <<'PY'
import json, sys
peer, titan = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
titan_tps = len(titan["ids"]) / titan["seconds"]
same = "yes" if peer["ids"] == titan["ids"] else "no, from %d" % next(
    i for i, (a, b) in enumerate(zip(peer["ids"], titan["ids"])) if a != b)
print("%10s %11.1f %12.1f %7.1fx %10s %6s" % (sys.argv[3], peer["tokens_per_s"], titan_tps,
                                             titan_tps / peer["tokens_per_s"], same, sys.argv[4]))
PY
done
