#!/usr/bin/env bash
# Scoring throughput (lm-eval-harness' loglikelihood requests: a multiple-choice question's choices
# after its context), side by side in one run: `titan generate --prompts-file` over a file of
# completions to score, against the scoring peer (bench/score_peer.py: lm-eval's Hugging Face model
# at its default batch size 1, one forward per request, on the PyTorch reference Qwen3). The
# questions are 60-120 words of the bundled corpus' held-out documents (run together), each with 4
# choices of 8 words: the words that follow, and those that follow three other questions. titan runs
# the file twice: as written (a question's choices one after another: titan runs the question once)
# and shuffled (no line shares its prompt with the line before, so every line runs whole). The table gives
# requests/s, the ratio to the peer, the largest difference of a token's log-probability from the
# peer's, and the 1-minute load average before each row.
#
#   bash bench/score_vs_peer.sh HF_DIR [QUESTIONS]     # default 16
#   TITAN_PREC=bf16 bash bench/score_vs_peer.sh outputs/debugmodel/checkpoint/step-40-hf 16
set -euo pipefail
cd "$(dirname "$0")/.."
HF=${1:?usage: bench/score_vs_peer.sh HF_DIR [QUESTIONS]}
QUESTIONS=${2:-16}
TITAN=${TITAN_BIN:-./build/bin/titan}
PREC=${TITAN_PREC:-fp32}
VAL=${TITAN_ASSETS_DIR:-assets}/datasets/nlp-corpus-validation/val.jsonl
[ -x "$TITAN" ] || { echo "build first: bash scripts/build.sh (or set TITAN_BIN)" >&2; exit 1; }
[ -f "$VAL" ] || { echo "no $VAL: run bash scripts/setup.sh" >&2; exit 1; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
dtype=$([ "$PREC" = bf16 ] && echo bfloat16 || echo float32)
python3 - "$VAL" "$QUESTIONS" "$OUT" <<'PY'
import json, random, sys
words = [w for l in open(sys.argv[1]) if l.strip() for w in json.loads(l)["text"].split()]
n = int(sys.argv[2])
assert len(words) >= 200 * (n + 1), f"the held-out set has {len(words)} words, too few for {n} questions"
lines = []
for i in range(n):
    start, cut = 200 * i, 60 + 20 * (i % 4)  # question i: words start .. start + cut of the corpus
    context = " ".join(words[start : start + cut])
    for j in range(4):  # choice 0: the 8 words that follow; the others: those after other questions
        at = 200 * ((i + j) % n) + cut
        lines.append({"prompt": context, "completion": " " + " ".join(words[at : at + 8])})
with open(f"{sys.argv[3]}/grouped.jsonl", "w") as f:
    f.writelines(json.dumps(l) + "\n" for l in lines)
order = [q * 4 + j for j in range(4) for q in range(n)]  # choice j of every question, then j + 1
with open(f"{sys.argv[3]}/shuffled.jsonl", "w") as f:
    f.writelines(json.dumps(lines[k]) + "\n" for k in order)
PY
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cpus, $(lscpu | sed -n 's/^Model name: *//p'), $HF, $PREC, $QUESTIONS questions x 4 choices"
printf "%-36s %11s %8s %14s %6s\n" "" "requests/s" "vs peer" "max |dlogp|" load
load=$(cut -d' ' -f1 /proc/loadavg)
"$TITAN" generate --model-path "$HF" --prompts-file "$OUT/grouped.jsonl" --dtype "$dtype" >"$OUT/grouped.out" 2>"$OUT/grouped.err"
/usr/bin/python3 bench/score_peer.py "$HF" "$OUT/grouped.out" "$PREC" >"$OUT/peer.json"
python3 - "$OUT" "$load" <<'PY'
import json, sys
out, load = sys.argv[1:3]
peer = json.load(open(f"{out}/peer.json"))
print("%-36s %11.2f %8s %14s %6s" % ("peer (one forward each)", len(peer["logprobs"]) / peer["seconds"], "1.00x", "", load))
PY
for run in grouped shuffled; do
  load=$(cut -d' ' -f1 /proc/loadavg)
  [ "$run" = grouped ] || "$TITAN" generate --model-path "$HF" --prompts-file "$OUT/$run.jsonl" --dtype "$dtype" \
    >"$OUT/$run.out" 2>"$OUT/$run.err"
  python3 - "$OUT" "$run" "$load" <<'PY'
import json, re, sys
out, run, load = sys.argv[1:4]
peer = json.load(open(f"{out}/peer.json"))
err = open(f"{out}/{run}.err").read()
seconds = float(re.search(r" in ([0-9.]+) s:", err).group(1))
cached = re.search(r"(\d+) of (\d+) positions from the KV cache", err)
rows = [json.loads(l) for l in open(f"{out}/{run}.out")]
n = len(rows) // 4
# The peer scored the grouped file; a shuffled line k is grouped line order[k].
order = list(range(len(rows))) if run == "grouped" else [q * 4 + j for j in range(4) for q in range(n)]
worst = max(abs(a - b) for k, r in enumerate(rows) for a, b in zip(r["logprobs"], peer["logprobs"][order[k]]))
peer_rps = len(peer["logprobs"]) / peer["seconds"]
label = "titan, %s (%s/%s cached)" % (run, cached.group(1), cached.group(2))
print("%-36s %11.2f %7.2fx %14.3g %6s" % (label, len(rows) / seconds, len(rows) / seconds / peer_rps, worst, load))
PY
done
