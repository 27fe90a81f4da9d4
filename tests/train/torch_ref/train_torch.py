#!/usr/bin/env python3
"""An independent PyTorch training loop that does what `titan train` promises, for comparing the two
step by step (tests/train/trajectory_test.cpp). Needs only torch (Debian's python3-torch 1.13).

    train_torch.py SPEC.json

SPEC.json:
  model_dir       an HF folder (config.json + model.safetensors): the initial weights
  documents       token ids of each document, in dataset order (the tokenizer is not under test here)
  separator       the token id that ends every document
  attn_mask_type  optional: "block_causal" cuts attention after every separator (torchtitan's document
                  mask; positions run on over the row) or, for packed conversations, between them;
                  else causal over each row
  chat            optional, instead of documents: {"conversations": [{"ids", "trained"}], "pad",
                  "packed"}: each conversation's token ids and, per token, whether the loss trains on
                  it (1) or not (0); packed: several whole conversations per row
  seq_len, local_batch_size, accumulation, steps
  lr, warmup_steps, decay_ratio (null: decay after warmup), decay_type, min_lr_factor
  beta1, beta2, eps, weight_decay, max_norm
  load_balance    MoE: "aux_loss" (transformers' aux loss in the loss, as config.json asks) or
                  "expert_bias" (torchtitan's aux-loss-free balancing, load_balance_coeff per step)
  out_json        written: {"steps": [{"step", "loss", "aux_loss", "grad_norm", "lr", "batch_hash"}],
                  "document_cuts": documents starting inside a row with block_causal,
                  "padding": padded positions of all rows}
  out_weights     written: the final weights, f32 safetensors under their checkpoint keys

What each part follows (written from the upstream code's semantics, not from titan's):
- data: torchtitan's packing (HuggingFaceDataset): every document's tokens then the separator, one
  endless stream that starts over at the first document when the data ends, cut into
  non-overlapping windows of seq_len + 1; inputs window[:-1], labels window[1:]. batch_hash is
  64-bit FNV-1a over the little-endian int64 inputs of the step's micro-batches, in order.
- conversations (chat): supervised fine-tuning as transformers' Trainer does it without packing:
  one conversation per row, its first seq_len + 1 tokens, padded after its end; a label is the next
  token where that token is trained, else -100 (ignored). Packed: next-fit in order, each
  row takes whole conversations while the next one fits, then padding; one longer than a row takes
  a row alone, cut as above; attention stays within each conversation (transformers' padding-free
  packing; its position_ids restart per conversation where these run on over the row, which RoPE,
  depending on position differences only, does not see but for rounding). The padding is masked
  out of the MoE aux loss (transformers' attention_mask).
- model: tests/models/torch_ref/qwen3_torch.py (transformers' math, checked against the oracles):
  cross-entropy, plus router_aux_loss_coef x aux for an MoE with output_router_logits.
- step: the cross-entropy summed over each micro-batch's targets and divided by the targets of the
  whole step (transformers' Trainer's num_items_in_batch; for packed text, where every micro-batch
  has as many, torchtitan's mean / accumulation), plus the aux term / accumulation, back-propagated;
  the logged loss the step's mean cross-entropy plus the aux term's mean; torch.nn.utils.clip_grad_norm_'s rule (the norm before clipping is
  logged), with the norm summed in f64 (see clip_grad_norm);
  torch.optim.AdamW (or Adam, spec "optimizer") over every parameter (torchtitan decays all of
  them); LambdaLR with
  torchtitan's linear_warmup_stable_decay, stepped after the optimizer.
- expert bias: torchtitan's MoE (moe.py): the bias is added to the router's scores for choosing
  the top-k only, the gate weights are the unbiased probabilities; its optimizer pre-step hook
  moves each layer's bias by coeff * sign(mean load - load) over the step's tokens, less the
  moves' mean. The aux loss is then a diagnostic of the experts actually chosen.
"""
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "torch_ref"))
import qwen3_torch  # noqa: E402

FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211


def fnv1a(data, h):
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def windows(documents, separator, length):
    """torchtitan's packing: an endless stream of windows of `length` tokens."""
    buffer = []
    while True:
        for doc in documents:
            buffer.extend(doc)
            buffer.append(separator)
            while len(buffer) >= length:
                yield buffer[:length]
                buffer = buffer[length:]


def conversation_rows(conversations, pad, length):
    """One row per conversation, endlessly: (inputs, labels, None, tokens before the padding) of
    length - 1 positions."""
    while True:
        for c in conversations:
            ids, trained = c["ids"], c["trained"]
            n = len(ids)
            inputs = [ids[t] if t < n else pad for t in range(length - 1)]
            labels = [ids[t + 1] if t + 1 < n and trained[t + 1] else -100 for t in range(length - 1)]
            yield inputs, labels, None, min(n, length - 1)


def packed_conversation_rows(conversations, pad, length):
    """Whole conversations packed next-fit in order, endlessly: (inputs, labels, document number
    per position, tokens before the padding) of S = length - 1 positions."""
    S = length - 1

    def endless():
        while True:
            yield from conversations

    stream = endless()
    pending = next(stream)
    while True:
        inputs, labels, document = [], [], []
        while len(inputs) < S:
            ids, trained = pending["ids"], pending["trained"]
            n = len(ids)
            if inputs and n > S - len(inputs):
                break
            doc = len(set(document))
            for t in range(min(n, S)):
                inputs.append(ids[t])
                labels.append(ids[t + 1] if t + 1 < n and trained[t + 1] else -100)
                document.append(doc)
            pending = next(stream)
        used = len(inputs)
        padding_document = len(set(document))
        inputs += [pad] * (S - used)
        labels += [-100] * (S - used)
        document += [padding_document] * (S - used)
        yield inputs, labels, document, used


def lr_factor(step, warmup, stable, decay, decay_type, min_lr_factor):
    """torchtitan's linear_warmup_stable_decay for the 0-based step (LambdaLR's last_epoch)."""
    if step < warmup:
        return (step + 1) / warmup
    if step < warmup + stable:
        return 1.0
    progress = (step + 1 - warmup - stable) / decay
    if decay_type == "linear":
        f = 1 - progress
    elif decay_type == "sqrt":
        f = 1 - math.sqrt(progress)
    elif decay_type == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"decay_type {decay_type}")
    return min_lr_factor + (1 - min_lr_factor) * f


def schedule_lengths(steps, warmup, decay_ratio):
    """torchtitan's build_lr_schedulers: decay steps, then a stable span with one virtual step."""
    if decay_ratio is None:
        decay = steps - warmup
    else:
        decay = round(steps * decay_ratio)
        if warmup + decay > steps:
            decay = steps - warmup
    return warmup, steps + 1 - warmup - decay, decay


def clip_grad_norm(params, max_norm):
    """torch.nn.utils.clip_grad_norm_ with the norm summed in f64. torch 1.13 sums each tensor's
    squares in f32: over a 151936 x 32 embedding gradient that is off by up to ~3e-5 relative
    (measured against f64 on these runs), and every clip coefficient with it."""
    params = list(params)
    norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params))
    coef = min(max_norm / (norm + 1e-6), 1.0)
    for p in params:
        p.grad.mul_(coef)
    return norm


class ExpertBias:
    """torchtitan's aux-loss-free balancing for qwen3_torch's MoE blocks (one bias per layer)."""

    def __init__(self, cfg, coeff):
        self.cfg, self.coeff = cfg, coeff
        self.bias, self.load = {}, {}
        self.biased_choices = 0  # (token, slot) choices the bias changed: the case exercises it
        self.choices = []  # this forward's (probs, chosen experts) per layer
        self.attention_mask = None  # this forward's [B, S] (1: token, 0: padding), None: no padding

    def aux_loss(self, attention_mask=None):
        """transformers' aux-loss formula over the experts actually chosen (the bias included),
        as titan reports it under expert_bias: a diagnostic of the balance the run has."""
        probs = torch.cat([p for p, _ in self.choices])
        chosen = torch.cat([i for _, i in self.choices])
        layers = len(self.choices)
        self.choices = []
        mask = torch.nn.functional.one_hot(chosen, self.cfg.n_experts).float()
        keep = torch.ones(probs.shape[0]) if attention_mask is None else \
            attention_mask.reshape(-1).float().repeat(layers)
        tokens = (mask * keep[:, None, None]).sum(dim=0) / keep.sum()
        return (tokens * ((probs * keep[:, None]).sum(dim=0) / keep.sum())[None, :]).sum() * self.cfg.n_experts

    def moe_block(self, cfg, P, prefix, x, router_logits_out):
        B, S, D = x.shape
        t = x.reshape(-1, D)
        logits = torch.nn.functional.linear(t, P(prefix + "gate.weight"))
        router_logits_out.append(logits)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        bias = self.bias.setdefault(prefix, torch.zeros(cfg.n_experts))
        with torch.no_grad():
            _, top_i = torch.topk(probs + bias, cfg.top_k, dim=-1)
            _, unbiased = torch.topk(probs, cfg.top_k, dim=-1)
            self.biased_choices += int((top_i.sort(dim=-1).values != unbiased.sort(dim=-1).values).sum())
            # The load counts the tokens, not the padding (titan's choice: torchtitan never pads).
            counted = top_i if self.attention_mask is None else top_i[self.attention_mask.reshape(-1) == 1]
            self.load[prefix] = self.load.get(prefix, 0) + torch.bincount(counted.reshape(-1), minlength=cfg.n_experts)
            self.choices.append((probs, top_i))
        top_w = probs.gather(1, top_i)
        if cfg.norm_topk:
            top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return qwen3_torch.experts_output(cfg, P, prefix, t, top_i, top_w).reshape(B, S, D)

    def update(self):
        """The optimizer pre-step hook: every layer's load of the whole step, then cleared."""
        for prefix, load in self.load.items():
            load = load.double()
            delta = self.coeff * torch.sign(load.mean() - load)
            self.bias[prefix] += (delta - delta.mean()).float()
        self.load = {}


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.set_num_threads(2)
    torch.manual_seed(0)  # nothing here is random; fixed anyway

    with open(os.path.join(spec["model_dir"], "config.json")) as f:
        cfg = qwen3_torch.Config(json.load(f))
    weights = qwen3_torch.read_checkpoint(spec["model_dir"])
    if cfg.tied:
        weights.pop("lm_head.weight", None)
    names = sorted(weights)
    params = {k: torch.nn.Parameter(weights[k].float().clone()) for k in names}

    def P(key):
        return params[key]

    kind = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam}[spec.get("optimizer", "AdamW")]
    optimizer = kind([params[k] for k in names], lr=spec["lr"], betas=(spec["beta1"], spec["beta2"]),
                     eps=spec["eps"], weight_decay=spec["weight_decay"], foreach=False)
    warmup, stable, decay = schedule_lengths(spec["steps"], spec["warmup_steps"], spec["decay_ratio"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup, stable, decay, spec["decay_type"], spec["min_lr_factor"]))

    balance = spec.get("load_balance", "aux_loss")
    expert_bias = None
    if cfg.n_experts and balance == "expert_bias":
        expert_bias = ExpertBias(cfg, spec["load_balance_coeff"])
        qwen3_torch.moe_block = expert_bias.moe_block
    aux_in_loss = cfg.n_experts and balance == "aux_loss" and cfg.output_router_logits

    S, B, A = spec["seq_len"], spec["local_batch_size"], spec["accumulation"]
    chat = spec.get("chat")
    if chat:
        rows_of = packed_conversation_rows if chat.get("packed") else conversation_rows
        stream = rows_of(chat["conversations"], chat["pad"], S + 1)
    else:
        stream = ((w[:-1], w[1:], None, S) for w in windows(spec["documents"], spec["separator"], S + 1))
    block_causal = spec.get("attn_mask_type") == "block_causal"
    cuts, padding = 0, 0  # documents starting inside a row (block_causal), padded positions
    records = []
    for step in range(1, spec["steps"] + 1):
        optimizer.zero_grad(set_to_none=True)
        batch_hash = FNV_OFFSET
        loss_sum, aux_sum = 0.0, 0.0
        micro_batches = [[next(stream) for _ in range(B)] for _ in range(A)]
        targets = sum(label != -100 for rows in micro_batches for row in rows for label in row[1])
        for rows in micro_batches:
            inputs = torch.tensor([r[0] for r in rows], dtype=torch.int64)
            labels = torch.tensor([r[1] for r in rows], dtype=torch.int64)
            batch_hash = fnv1a(inputs.numpy().astype("<i8").tobytes(), batch_hash)
            lengths = torch.tensor([r[3] for r in rows], dtype=torch.int64)
            attention_mask = None
            if bool((lengths < S).any()):
                attention_mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
                padding += int(S * len(rows) - lengths.sum())
            document = None
            if block_causal:
                document = torch.tensor([r[2] for r in rows], dtype=torch.int64) if chat else \
                    qwen3_torch.documents_after(inputs, spec["separator"])
                # Each row's documents but its first, padding not counted.
                within = document * (torch.arange(S)[None, :] < lengths[:, None])
                cuts += int(within.max(dim=1).values.sum())
            if expert_bias:
                expert_bias.attention_mask = attention_mask
            logits, _, aux = qwen3_torch.forward(cfg, P, inputs, document, attention_mask)
            if expert_bias:
                aux = expert_bias.aux_loss(attention_mask)
            ce_sum = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg.vocab), labels.reshape(-1),
                                                       ignore_index=-100, reduction="sum")
            loss = ce_sum / targets
            if aux_in_loss:
                loss = loss + cfg.aux_coef * aux / A
            loss.backward()
            loss_sum += float(ce_sum) / targets
            aux_sum += 0.0 if aux is None else float(aux)
        logged = loss_sum + (cfg.aux_coef * aux_sum / A if aux_in_loss else 0.0)
        grad_norm = clip_grad_norm(params.values(), spec["max_norm"])
        lr = optimizer.param_groups[0]["lr"]
        if expert_bias:
            expert_bias.update()
        optimizer.step()
        scheduler.step()
        records.append({"step": step, "loss": logged, "aux_loss": aux_sum / A if cfg.n_experts else None,
                        "grad_norm": grad_norm, "lr": lr, "batch_hash": f"{batch_hash:016x}"})
        print(f"step {step}: loss {logged:.7f} grad_norm {grad_norm:.6f} lr {lr:.6g}", flush=True)

    with open(spec["out_json"], "w") as f:
        json.dump({"steps": records, "biased_choices": expert_bias.biased_choices if expert_bias else 0,
                   "document_cuts": cuts, "padding": padding}, f, indent=1)
    qwen3_torch.write_safetensors(spec["out_weights"], [(k, params[k].detach()) for k in names])
    return 0


if __name__ == "__main__":
    sys.exit(main())
