# The scoring peer: lm-eval-harness' loglikelihood requests as its Hugging Face model scores them at
# its default batch size 1 (one forward over context + continuation per request, the log-softmax of
# the continuation's positions), on the PyTorch reference Qwen3 of ../shared/peers/cpu (qwen3_ref.py,
# st.py) with a Hugging Face folder's weights. Reads the requests from a `titan generate` scoring
# output (its prompt_ids and completion_ids per line, so both score the same ids) and prints one JSON
# object: seconds and each request's per-token log-probabilities. Used by bench/score_vs_peer.sh.
#   python3 bench/score_peer.py HF_DIR TITAN_SCORES.jsonl [fp32|bf16]
import json, sys, time
import torch
import peer_model

hf, scores = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "fp32"
m = peer_model.load(hf)
requests = [json.loads(l) for l in open(scores) if l.strip()]
out = []
start = time.time()
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
    for r in requests:
        context, continuation = r["prompt_ids"], r["completion_ids"]
        whole = context + continuation
        logits = m(torch.tensor([whole[:-1]]))["logits"][0, len(context) - 1 :].float()
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        out.append(logprobs[torch.arange(len(continuation)), torch.tensor(continuation)].tolist())
seconds = time.time() - start
print(json.dumps({"seconds": seconds, "logprobs": out}))
