#!/usr/bin/env python3
"""PyTorch oracle for titan's rms_norm / rope / swiglu ops, written as transformers' Qwen3 does them.

Usage: qwen3_ops_ref.py DIR
DIR/spec.json = {"cases": [{"name": str, "op": "rms_norm" | "rope" | "swiglu", "dtype": "f32" | "bf16",
                            "inputs": {name: {"file": str, "shape": [..], "kind": "f32" | "i64"}},
                            "params": {"eps": float} | {"theta": float}}]}
Input files are raw little-endian f32 (float inputs, converted to the case dtype here: bf16 inputs are
exact in f32) or i64 (positions). For each case the output is written to DIR/<name>.out as raw f32
(bf16 outputs widen exactly). Exits 3 when torch cannot be imported, so callers can skip.
"""
import json
import os
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "no oracle here"
    print(f"torch unavailable: {e}", file=sys.stderr)
    sys.exit(3)

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def load(d, spec, dtype):
    raw = open(os.path.join(d, spec["file"]), "rb").read()
    if spec["kind"] == "i64":
        return torch.frombuffer(bytearray(raw), dtype=torch.int64).reshape(spec["shape"])
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(spec["shape"]).to(dtype)


# transformers Qwen3RMSNorm.forward
def rms_norm(x, w, eps):
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


# transformers Qwen3RotaryEmbedding (default rope, attention_scaling 1.0) + apply_rotary_pos_emb;
# x is [B, S, H, D] here (transformers has [B, H, S, D] and unsqueezes dim 1 instead of 2).
def rope(x, positions, theta):
    B, S, H, D = x.shape
    if positions.dim() == 1:
        positions = positions[None, :].expand(B, S)
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    inv_freq_expanded = inv_freq[None, :, None].float().expand(B, -1, 1)
    position_ids_expanded = positions[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * 1.0).to(x.dtype).unsqueeze(2)
    sin = (emb.sin() * 1.0).to(x.dtype).unsqueeze(2)
    return (x * cos) + (rotate_half(x) * sin)


# transformers Qwen3MLP: act_fn(gate_proj(x)) * up_proj(x) with act_fn = silu.
# torch >= 2 (what transformers 5 runs on) computes silu of a bf16 tensor as
# float(x) / (1 + exp(-float(x))) rounded once to bf16 (aten/src/ATen/native/cpu/Activation.cpp,
# isReducedFloatingType branch). Debian's torch 1.13 instead rounds every sub-op (exp, 1 + e, the
# division) to bf16, 1-2 ulps off for ~25% of elements; so silu is evaluated in f32 here and rounded,
# which is bit-for-bit what torch >= 2 does. The product with up is a plain bf16 mul in every version.
def swiglu(gate, up):
    return torch.nn.functional.silu(gate.float()).to(gate.dtype) * up


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    spec = json.load(open(os.path.join(d, "spec.json")))
    for case in spec["cases"]:
        dtype = DTYPES[case["dtype"]]
        inp = {k: load(d, v, dtype) for k, v in case["inputs"].items()}
        p = case.get("params", {})
        with torch.no_grad():
            if case["op"] == "rms_norm":
                out = rms_norm(inp["x"], inp["w"], p["eps"])
            elif case["op"] == "rope":
                out = rope(inp["x"], inp["positions"], p["theta"])
            elif case["op"] == "swiglu":
                out = swiglu(inp["gate"], inp["up"])
            else:
                raise SystemExit(f"unknown op {case['op']}")
        assert out.dtype == dtype, (case["name"], out.dtype)
        out.float().contiguous().numpy().tofile(os.path.join(d, case["name"] + ".out"))


if __name__ == "__main__":
    main()
