#!/usr/bin/env python3
"""PyTorch reference for tests/ops/moe_test.cpp: Qwen3-MoE router + experts + aux loss, written the
way transformers 5.17 / shared/peers/cpu/qwen3_ref.py do it (per-expert loop, index_add_).

Usage: moe_ref.py INPUT.json  -> JSON on stdout.
Input: logits [T,E], x [T,D], w_gate/w_up [E,F,D], w_down [E,D,F], dy [T,D] (flat lists), T, D, F, E, k,
renormalize, aux_coef. Loss = sum(y * dy) + aux_coef * aux; outputs weights, indices, probs, y, aux and
the gradients of logits, x, w_gate, w_up, w_down (flat lists, float32 math).
"""
import json
import sys

import torch
import torch.nn.functional as F


def main():
    a = json.load(open(sys.argv[1]))
    T, D, Fd, E, k = a["T"], a["D"], a["F"], a["E"], a["k"]
    t = lambda name, *shape: torch.tensor(a[name], dtype=torch.float32).reshape(*shape).requires_grad_(True)
    logits, x = t("logits", T, E), t("x", T, D)
    wg, wu, wd = t("w_gate", E, Fd, D), t("w_up", E, Fd, D), t("w_down", E, D, Fd)
    dy = torch.tensor(a["dy"], dtype=torch.float32).reshape(T, D)

    probs = torch.softmax(logits.float(), -1)
    w, idx = probs.topk(k, -1)
    if a["renormalize"]:
        w = w / w.sum(-1, keepdim=True)
    w = w.to(x.dtype)
    y = torch.zeros_like(x)
    for e in range(E):
        r, kk = (idx == e).nonzero(as_tuple=True)
        if r.numel() == 0:
            continue
        h = F.silu(F.linear(x[r], wg[e])) * F.linear(x[r], wu[e])
        y = y.index_add(0, r, F.linear(h, wd[e]) * w[r, kk, None])
    m = F.one_hot(idx, E).float()
    aux = E * (m.mean(0) * probs.mean(0)[None]).sum()
    loss = (y * dy).sum() + a["aux_coef"] * aux
    loss.backward()
    flat = lambda v: v.detach().reshape(-1).tolist()
    print(json.dumps({
        "weights": flat(w), "indices": flat(idx), "probs": flat(probs), "y": flat(y), "aux": aux.item(),
        "d_logits": flat(logits.grad), "d_x": flat(x.grad), "d_w_gate": flat(wg.grad), "d_w_up": flat(wu.grad),
        "d_w_down": flat(wd.grad),
    }))


if __name__ == "__main__":
    main()
