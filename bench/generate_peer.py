# The generation peer: torchtitan's scripts/generate loop (every new token reruns the whole sequence
# through the model, greedy on the last position's logits) on the PyTorch reference Qwen3 of
# ../shared/peers/cpu (qwen3_ref.py, st.py), with a Hugging Face folder's weights. Used by
# bench/generate_vs_peer.sh; prints one JSON object.
#   python3 bench/generate_peer.py HF_DIR PROMPT_IDS NEW_TOKENS [fp32|bf16]
import glob, json, os, sys, time
sys.path.insert(0, os.environ.get("TITAN_PEER_DIR", os.path.join(os.path.dirname(__file__), "../../shared/peers/cpu")))
import torch, qwen3_ref as R, st

torch.set_num_threads(2)
hf, prompt, new_tokens = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "fp32"
c = json.load(open(os.path.join(hf, "config.json")))
keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "tie_word_embeddings", "rms_norm_eps", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"]
cfg = {k: c[k] for k in keys if k in c}
cfg["rope_theta"] = c.get("rope_theta", c.get("rope_parameters", {}).get("rope_theta", 1e6))
m = R.Qwen3(R.Cfg(**cfg))
loaded = {}
for f in sorted(glob.glob(os.path.join(hf, "*.safetensors"))):
    loaded.update(st.load(f))
missing = [k for k in m.p.keys() if k.replace("__", ".") not in loaded]
assert not missing, f"weights missing from {hf}: {missing[:5]}"
with torch.no_grad():
    for k, v in loaded.items():
        m.p[k].copy_(v.float())
ids = list(prompt)
start = time.time()
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=(mode == "bf16")):
    for _ in range(new_tokens):
        logits = m(torch.tensor([ids]))["logits"][0, -1].float()
        ids.append(int(torch.argmax(logits)))
seconds = time.time() - start
print(json.dumps({"ids": ids[len(prompt):], "seconds": seconds, "tokens_per_s": new_tokens / seconds}))
