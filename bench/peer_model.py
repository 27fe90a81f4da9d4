# The PyTorch reference Qwen3 of ../shared/peers/cpu (qwen3_ref.py, st.py; TITAN_PEER_DIR overrides
# the folder) loaded with a Hugging Face folder's config.json and safetensors weights: the model the
# generation and scoring peers (bench/generate_peer.py, bench/score_peer.py) run, on 2 threads.
import glob, json, os, sys

sys.path.insert(0, os.environ.get("TITAN_PEER_DIR", os.path.join(os.path.dirname(__file__), "../../shared/peers/cpu")))
import torch, qwen3_ref as R, st

KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "tie_word_embeddings", "rms_norm_eps", "num_experts",
        "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"]


def load(hf):
    torch.set_num_threads(2)
    c = json.load(open(os.path.join(hf, "config.json")))
    cfg = {k: c[k] for k in KEYS if k in c}
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
    return m
