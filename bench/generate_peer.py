# The generation peer: torchtitan's scripts/generate loop (every new token reruns the whole sequence
# through the model, greedy on the last position's logits) on the PyTorch reference Qwen3 of
# ../shared/peers/cpu (qwen3_ref.py, st.py), with a Hugging Face folder's weights. Used by
# bench/generate_vs_peer.sh; prints one JSON object.
#   python3 bench/generate_peer.py HF_DIR PROMPT_IDS NEW_TOKENS [fp32|bf16]
import json, sys, time
import torch
import peer_model

hf, prompt, new_tokens = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "fp32"
m = peer_model.load(hf)
ids = list(prompt)
start = time.time()
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
    for _ in range(new_tokens):
        logits = m(torch.tensor([ids]))["logits"][0, -1].float()
        ids.append(int(torch.argmax(logits)))
seconds = time.time() - start
print(json.dumps({"ids": ids[len(prompt):], "seconds": seconds, "tokens_per_s": new_tokens / seconds}))
