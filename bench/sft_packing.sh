#!/usr/bin/env bash
# Supervised fine-tuning rows: one conversation per row (padded) against packed rows
# (training.pack_conversations, block-causal attention), next-fit in dataset order and best-fit
# decreasing over windows of PACK_WINDOW conversations (training.pack_strategy = "best_fit"), the main
# job's model on conversations made from the built-in corpus (a question of 3-7 words, an answer of
# 5-154: 38 tokens on average with Qwen3's template). Prints each mode's sustained tokens/s, the share
# of padding, and the tokens/s that are not padding (what trains), then the ratios of the last.
# A smaller SEQ puts fewer conversations in a row (128: about three, as 2048-token rows hold
# conversations of a few hundred tokens), where the packing matters most.
#
#   bench/sft_packing.sh [STEPS] [SEQ] [PRECISION]      (default 12 steps, 512, bfloat16)
#   PACK_WINDOW=256                                     best-fit's window (conversations)
#   SFT_MODES="one_per_row next_fit best_fit"           which modes, in this order
#   SFT_FLAVOR=debugmodel                               the model (0.6B: layers, not the lm_head, take
#                                                       most of the step, so padding costs a full position)
source "$(dirname "${BASH_SOURCE[0]}")/debugmodel_job.sh" "${1:-12}" "${2:-512}" "${3:-bfloat16}"
CORPUS=assets/datasets/nlp-corpus/train.jsonl
[ -f "$CORPUS" ] || { echo "the built-in corpus is missing: bash scripts/setup.sh" >&2; exit 1; }

python3 - "$CORPUS" "$OUT/chats.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for i, line in enumerate(l for l in f if l.strip()):
        words = json.loads(line)["text"].split()
        if len(words) < 8:
            continue
        ask, answer = 3 + i % 5, 5 + (i * 37) % 150
        messages = [{"role": "system", "content": "Continue the text."}] if i % 3 == 0 else []
        messages += [{"role": "user", "content": " ".join(words[:ask])},
                     {"role": "assistant", "content": " ".join(words[ask:ask + answer]) or "(nothing)"}]
        out.write(json.dumps({"messages": messages}) + "\n")
EOF

lscpu | grep -m1 "Model name" || true
printf '%-12s %12s %10s %16s\n' rows "tokens/s" padding "non-padding/s"
declare -A trained
for mode in ${SFT_MODES:-one_per_row next_fit best_fit}; do
  extra=()
  [ "$mode" != one_per_row ] && extra=(--training.pack_conversations=true --model.attn_mask_type=block_causal
                                       --training.pack_strategy="$mode" --training.pack_window="${PACK_WINDOW:-256}")
  [ "$mode" = next_fit ] && unset 'extra[-1]'  # pack_window is best-fit's
  "$TITAN" train "${common[@]}" --model.flavor="${SFT_FLAVOR:-debugmodel}" --job.dump_folder="$OUT/$mode" --training.dataset_path="$OUT/chats.jsonl" \
    --training.chat_field=messages "${extra[@]}" > "$OUT/$mode.log" 2>&1 ||
    { cat "$OUT/$mode.log" >&2; exit 1; }
  # The steps after the warm-up step, from metrics.jsonl: tokens/s and the padding share.
  read -r tps pad < <(python3 - "$OUT/$mode/metrics.jsonl" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [s for s in steps if not s["warmup"]]
seconds = sum(s["step_seconds"] for s in steps)
tokens = sum(s["tps"] * s["step_seconds"] for s in steps)
padding = sum(s["padding_pct"] / 100 * s["tps"] * s["step_seconds"] for s in steps)
print(f"{tokens / seconds:.1f} {100 * padding / tokens:.2f}")
EOF
  )
  trained[$mode]=$(python3 -c "print(f'{$tps * (1 - $pad / 100):.1f}')")
  printf '%-12s %12s %9s%% %16s\n' "$mode" "$tps" "$pad" "${trained[$mode]}"
done
[ -n "${trained[one_per_row]:-}" ] && [ -n "${trained[next_fit]:-}" ] &&
  python3 -c "print(f'non-padding tokens/s: next_fit / one per row {${trained[next_fit]} / ${trained[one_per_row]}:.2f}x')"
[ -n "${trained[next_fit]:-}" ] && [ -n "${trained[best_fit]:-}" ] &&
  python3 -c "print(f'non-padding tokens/s: best_fit / next_fit {${trained[best_fit]} / ${trained[next_fit]}:.2f}x')"
exit 0
