#!/usr/bin/env python3
"""Independent PyTorch reference of Qwen3 / Qwen3-MoE: one forward + backward of
`model(input_ids, labels=input_ids)` as transformers 5.17 computes it, written from the math in
shared/design/REFERENCE_NOTES.md ("Forward details") and the oracle README. Needs only torch
(Debian python3-torch 1.13 works) -- no transformers.

    qwen3_torch.py --model-path DIR --tokens IN.safetensors --out OUT.safetensors [--dtype float32|bfloat16]
    qwen3_torch.py --jobs JOBS.json   # [{"model_path", "tokens", "out", "dtype"}, ...] in one process

Writes the same names as `titan debug dump`: logits (f32 [B, S, V]), loss (f32 scalar), aux_loss
(MoE only) and grad.<hf key> (f32) for every checkpoint tensor.

bfloat16 follows a transformers model loaded with torch_dtype=bfloat16: every parameter is
rounded to bf16 and every op runs and rounds in bf16, except where transformers upcasts:
RMSNorm statistics (x.float(), cast back before the weight multiply), the attention softmax and
the router softmax (fp32, cast back), and the cross-entropy (logits.float()). The parameters
stay f32 leaves cast on use, so the gradients come out as f32 of the bf16 computation (for a
tied embedding the two uses are summed in f32 rather than bf16).
"""
import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

# ------------------------------------------------------------------ safetensors

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path):
    """name -> tensor (copied out of the file)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        raw = bytearray(data[begin:end])
        t = torch.frombuffer(raw, dtype=dtype) if len(raw) else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(shape).clone()
    return out


def write_safetensors(path, tensors):
    """tensors: list of (name, tensor); header padded with spaces to 8 bytes, format pt."""
    header = {"__metadata__": {"format": "pt"}}
    chunks, offset = [], 0
    for name, t in tensors:
        t = t.detach().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


def read_checkpoint(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        out = {}
        for s in shards:
            out.update(read_safetensors(os.path.join(model_dir, s)))
        return out
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))

# ------------------------------------------------------------------ config


class Config:
    """The fields of config.json the math depends on; Hub and transformers-v5 spellings."""

    def __init__(self, c):
        arch = c["architectures"][0]
        if arch not in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            raise ValueError(f"unsupported architecture {arch}")
        self.vocab = c["vocab_size"]
        self.dim = c["hidden_size"]
        self.n_layers = c["num_hidden_layers"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv = c.get("num_key_value_heads", self.n_heads)
        self.head_dim = c.get("head_dim") or self.dim // self.n_heads
        self.eps = c["rms_norm_eps"]
        rp = c.get("rope_parameters")
        self.theta = rp["rope_theta"] if isinstance(rp, dict) else c["rope_theta"]
        self.tied = bool(c.get("tie_word_embeddings", False))
        moe = arch == "Qwen3MoeForCausalLM"
        self.n_experts = (c["num_experts"] if "num_experts" in c else c["num_local_experts"]) if moe else 0
        self.top_k = c.get("num_experts_per_tok", 0) if moe else 0
        self.sparse_step = c.get("decoder_sparse_step", 1) if moe else 1
        self.mlp_only = list(c.get("mlp_only_layers") or []) if moe else []
        self.norm_topk = bool(c.get("norm_topk_prob", False)) if moe else False
        self.aux_coef = c.get("router_aux_loss_coef", 0.001) if moe else 0.0
        self.output_router_logits = bool(c.get("output_router_logits", False)) if moe else False

    def sparse(self, layer):
        return self.n_experts > 0 and layer not in self.mlp_only and (layer + 1) % self.sparse_step == 0

# ------------------------------------------------------------------ the model, as functions


# Where transformers upcasts (RMSNorm statistics, rope tables, the softmaxes): fp32 as it does; a
# float64 check (beam_search.py) sets float64, so that nothing in its model rounds to fp32.
UPCAST = torch.float32


def rms_norm(x, weight, eps):
    # Statistics in fp32; normalized value cast back to the input dtype before the weight multiply.
    x32 = x.to(UPCAST)
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def rope_tables(seq, head_dim, theta, dtype):
    # inv_freq[j] = theta^(-2j/hd) in fp32; emb = cat(freqs, freqs); cos/sin cast to the compute dtype.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(UPCAST) / head_dim))
    pos = torch.arange(seq, dtype=torch.int64).to(UPCAST)
    freqs = pos[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, cos, sin):
    # x [B, H, S, hd]; rotate_half(x) = cat(-x2, x1).
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention(cfg, P, prefix, x, cos, sin, hidden):
    B, S, _ = x.shape
    hd, H, KV = cfg.head_dim, cfg.n_heads, cfg.n_kv
    q = F.linear(x, P(prefix + "q_proj.weight")).view(B, S, H, hd)
    k = F.linear(x, P(prefix + "k_proj.weight")).view(B, S, KV, hd)
    v = F.linear(x, P(prefix + "v_proj.weight")).view(B, S, KV, hd)
    q = rms_norm(q, P(prefix + "q_norm.weight"), cfg.eps).transpose(1, 2)
    k = rms_norm(k, P(prefix + "k_norm.weight"), cfg.eps).transpose(1, 2)
    v = v.transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # GQA: kv head g serves query heads g*r .. g*r+r-1.
    r = H // KV
    k = k.repeat_interleave(r, dim=1)
    v = v.repeat_interleave(r, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=UPCAST).to(q.dtype)
    o = torch.matmul(probs, v).transpose(1, 2).reshape(B, S, H * hd)
    return F.linear(o, P(prefix + "o_proj.weight"))


def swiglu_mlp(x, gate_w, up_w, down_w):
    return F.linear(F.silu(F.linear(x, gate_w)) * F.linear(x, up_w), down_w)


def moe_block(cfg, P, prefix, x, router_logits_out):
    B, S, D = x.shape
    t = x.reshape(-1, D)
    logits = F.linear(t, P(prefix + "gate.weight"))
    router_logits_out.append(logits)
    probs = torch.softmax(logits, dim=-1, dtype=UPCAST)
    top_w, top_i = torch.topk(probs, cfg.top_k, dim=-1)
    if cfg.norm_topk:
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
    top_w = top_w.to(logits.dtype)
    return experts_output(cfg, P, prefix, t, top_i, top_w).reshape(B, S, D)


def experts_output(cfg, P, prefix, t, top_i, top_w):
    """sum over each token's chosen experts of weight x SwiGLU expert, accumulated in expert order."""
    out = torch.zeros_like(t)
    for e in range(cfg.n_experts):
        token, slot = torch.where(top_i == e)
        if token.numel() == 0:
            continue
        ep = f"{prefix}experts.{e}."
        y = swiglu_mlp(t[token], P(ep + "gate_proj.weight"), P(ep + "up_proj.weight"),
                       P(ep + "down_proj.weight"))
        out = out.index_add(0, token, y * top_w[token, slot, None])
    return out


def load_balancing_loss(cfg, router_logits, attention_mask=None):
    # transformers' load_balancing_loss_func: all MoE layers' tokens concatenated; softmax in the
    # logits' dtype; aux = E * sum_e (top-k assignments to e / tokens) * mean(p_e); with an
    # attention_mask [B, S], both means are over the tokens it keeps (1), in every layer.
    logits = torch.cat(router_logits, dim=0)
    probs = torch.softmax(logits, dim=-1)
    _, selected = torch.topk(probs, cfg.top_k, dim=-1)
    mask = F.one_hot(selected, cfg.n_experts).float()
    if attention_mask is None:
        tokens_per_expert = mask.mean(dim=0)          # [k, E]
        prob_per_expert = probs.mean(dim=0)            # [E]
    else:
        keep = attention_mask.reshape(-1).float().repeat(len(router_logits))  # layer-major, as cat
        tokens_per_expert = (mask * keep[:, None, None]).sum(dim=0) / keep.sum()
        prob_per_expert = (probs * keep[:, None]).sum(dim=0) / keep.sum()
    return (tokens_per_expert * prob_per_expert[None, :]).sum() * cfg.n_experts


def documents_after(ids, separator):
    """[B, S] document numbers of packed rows whose documents end with `separator` (torchtitan's
    block_causal document mask): a new document starts after each separator."""
    ends = ids == separator
    document = torch.zeros_like(ids)
    document[:, 1:] = torch.cumsum(ends.long(), dim=1)[:, :-1]
    return document


def hidden_keys(S, document=None):
    """[B or 1, 1, S, S] True where query i may not see key j: j > i, or (with document numbers
    [B, S]) j in another document."""
    hidden = torch.ones(S, S, dtype=torch.bool).triu(1)[None, None]
    if document is None:
        return hidden
    return hidden | (document[:, None, :, None] != document[:, None, None, :])


def forward(cfg, P, ids, document=None, attention_mask=None):
    """document: [B, S] document numbers (attention stays within each), None: causal rows.
    attention_mask: [B, S] 1 for tokens, 0 for padding (which only the aux loss reads: the padding
    follows every token of its row)."""
    B, S = ids.shape
    hidden = hidden_keys(S, document)
    emb_w = P("model.embed_tokens.weight")
    h = F.embedding(ids, emb_w)
    cos, sin = rope_tables(S, cfg.head_dim, cfg.theta, h.dtype)
    router_logits = []
    for i in range(cfg.n_layers):
        lp = f"model.layers.{i}."
        x = rms_norm(h, P(lp + "input_layernorm.weight"), cfg.eps)
        h = h + attention(cfg, P, lp + "self_attn.", x, cos, sin, hidden)
        x = rms_norm(h, P(lp + "post_attention_layernorm.weight"), cfg.eps)
        if cfg.sparse(i):
            h = h + moe_block(cfg, P, lp + "mlp.", x, router_logits)
        else:
            h = h + swiglu_mlp(x, P(lp + "mlp.gate_proj.weight"), P(lp + "mlp.up_proj.weight"),
                               P(lp + "mlp.down_proj.weight"))
    h = rms_norm(h, P("model.norm.weight"), cfg.eps)
    logits = F.linear(h, emb_w if cfg.tied else P("lm_head.weight"))
    # Loss: mean CE of logits[:, :-1] against labels[:, 1:], upcast to fp32.
    V = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, V), ids[:, 1:].reshape(-1))
    aux = load_balancing_loss(cfg, router_logits, attention_mask) if router_logits else None
    if aux is not None and cfg.output_router_logits:
        loss = loss + cfg.aux_coef * aux.to(loss.dtype)
    return logits, loss, aux


def run(model_dir, tokens_path, out_path, dtype_name):
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config(json.load(f))
    weights = read_checkpoint(model_dir)
    if cfg.tied:
        weights.pop("lm_head.weight", None)  # a tied checkpoint may carry it; the embedding is used
    leaves = {k: v.float().requires_grad_(True) for k, v in weights.items()}
    cast = {}

    def P(key):
        # The parameter in the compute dtype (one cast per parameter, like a bf16 model's weights).
        if key not in cast:
            cast[key] = leaves[key] if dtype == torch.float32 else leaves[key].to(dtype)
        return cast[key]

    ids = read_safetensors(tokens_path)["input_ids"].long()
    logits, loss, aux = forward(cfg, P, ids)
    loss.backward()
    result = [("logits", logits.detach().float()), ("loss", loss.detach().float().reshape(()))]
    if aux is not None:
        result.append(("aux_loss", aux.detach().float().reshape(())))
    for key in weights:
        g = leaves[key].grad
        result.append(("grad." + key, torch.zeros_like(leaves[key]) if g is None else g.float()))
    write_safetensors(out_path, result)
    return float(loss), None if aux is None else float(aux)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path")
    ap.add_argument("--tokens")
    ap.add_argument("--out")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--jobs", help="JSON list of {model_path, tokens, out, dtype}: several runs, one process")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.jobs:
        with open(a.jobs) as f:
            jobs = json.load(f)
    elif a.model_path and a.tokens and a.out:
        jobs = [{"model_path": a.model_path, "tokens": a.tokens, "out": a.out, "dtype": a.dtype}]
    else:
        ap.error("give --model-path, --tokens and --out, or --jobs")
    for j in jobs:
        loss, aux = run(j["model_path"], j["tokens"], j["out"], j.get("dtype", "float32"))
        print(f"{j['out']}: loss {loss:.7f}" + ("" if aux is None else f" aux_loss {aux:.7f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
