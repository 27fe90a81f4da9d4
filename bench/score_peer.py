# The scoring peer: lm-eval-harness' loglikelihood requests as its Hugging Face model scores them at
# its default batch size 1 (one forward over context + continuation per request, the log-softmax of
# the continuation's positions), on the PyTorch reference Qwen3 of ../shared/peers/cpu (qwen3_ref.py,
# st.py) with a Hugging Face folder's weights. Reads the requests from a `titan generate` scoring
# output (its prompt_ids and completion_ids per line, so both score the same ids) and prints one JSON
# object: seconds and each request's per-token log-probabilities. Used by bench/score_vs_peer.sh.
#   python3 bench/score_peer.py HF_DIR TITAN_SCORES.jsonl [fp32|bf16]
import glob, json, os, sys, time
sys.path.insert(0, os.environ.get("TITAN_PEER_DIR", os.path.join(os.path.dirname(__file__), "../../shared/peers/cpu")))
import torch, qwen3_ref as R, st

torch.set_num_threads(2)
hf, scores = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "fp32"
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
