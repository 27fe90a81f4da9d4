#!/usr/bin/env python3
"""The next-token distribution as transformers' generate shapes it, in PyTorch (no transformers on
this machine): the logits processors that apply to greedy and sampled search alike, in the order
`_get_logits_processor` appends them (SequenceBiasLogitsProcessor, RepetitionPenaltyLogitsProcessor,
NoRepeatNGramLogitsProcessor, NoBadWordsLogitsProcessor, ForcedBOSTokenLogitsProcessor,
ForcedEOSTokenLogitsProcessor, ExponentialDecayLengthPenalty, SuppressTokensLogitsProcessor) and, when sampling, the
warpers in the order `_get_logits_processor` appends them (Temperature, TopK, TopP, MinP, Typical,
Epsilon, Eta),
each written from its documented rule on whole score rows with -inf for removed ids, as transformers
computes them (min_tokens_to_keep 1). Then softmax, or the argmax for greedy.

    logits_processors.py IN.json OUT.json
IN: {"cases": [{"logits": [...], "sequence": [...], "temperature", "top_k", "top_p", "min_p",
    "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty", "no_repeat_ngram_size",
    "sequence_bias": [[[ids], bias], ...], "bad_words_ids": [[ids], ...], "suppress_tokens": [ids],
    "prompt_length": P, "max_new_tokens": M, "eos": [ids], "forced_bos": id, "forced_eos": [ids],
    "decay": [start, factor]}]}
    (the last nine optional; `sequence` is the prompt's P ids and the new tokens so far)
OUT: {"cases": [[[id, probability], ...] (ids with a probability above 0, ascending)]}

The repetition penalty and the length decay are applied in float32 as transformers does; the
warpers run in float64 here so that a cut exactly at a boundary is not decided by float32 rounding
(titan's sampler computes its probabilities in double). One departure, titan's: the length decay
leaves a banned eos logit -inf, where transformers' abs(-inf) * (factor^k - 1) makes it NaN (factor > 1).
"""
import json
import sys

import torch

NEG_INF = float("-inf")


def banned_by_ngrams(sequence, n):
    """Ids that would complete an n-gram already in `sequence` (NoRepeatNGramLogitsProcessor)."""
    if n <= 0 or len(sequence) + 1 < n:
        return []
    followers = {}
    for start in range(len(sequence) - n + 1):
        followers.setdefault(tuple(sequence[start:start + n - 1]), []).append(sequence[start + n - 1])
    prefix = tuple(sequence[len(sequence) - (n - 1):]) if n > 1 else ()
    return followers.get(prefix, [])


def sequence_bias(scores, sequence, biases):
    """SequenceBiasLogitsProcessor: a float32 bias row, the one-id entries' biases first, then each
    longer entry's bias on its last id where its other ids end the sequence (an entry longer than
    the sequence is skipped); added to the scores."""
    biases = {tuple(ids): value for ids, value in biases}  # transformers' dict: the last value of a key
    bias = torch.zeros_like(scores)
    for ids, value in biases.items():
        if len(ids) == 1:
            bias[0, ids[0]] = value
    for ids, value in biases.items():
        if len(ids) == 1 or len(ids) > len(sequence):
            continue
        if tuple(sequence[len(sequence) - (len(ids) - 1):]) == ids[:-1]:
            bias[0, ids[-1]] += value
    return scores + bias


def distribution(case):
    scores = torch.tensor(case["logits"], dtype=torch.float32)[None, :]
    sequence = case["sequence"]
    if case.get("sequence_bias"):
        scores = sequence_bias(scores, sequence, case["sequence_bias"])
    penalty = case["repetition_penalty"]
    if penalty != 1 and sequence:
        ids = torch.tensor(sequence, dtype=torch.long)[None, :]
        seen = torch.gather(scores, 1, ids)
        seen = torch.where(seen < 0, seen * penalty, seen / penalty)
        scores = scores.scatter(1, ids, seen)
    # ExponentialDecayLengthPenalty, in float32 (moved before the bans, which leave -inf either way; a
    # forced step below replaces it).
    cur_len = len(sequence)
    prompt_length = case.get("prompt_length", cur_len)
    if case.get("decay"):
        start, factor = case["decay"]
        regulation_start = start + prompt_length
        if cur_len > regulation_start:
            eos = torch.tensor(case["eos"], dtype=torch.long)
            penalties = torch.zeros_like(scores)
            penalties[:, eos] = torch.abs(scores[:, eos]) * (pow(factor, cur_len - regulation_start) - 1)
            scores = scores + penalties
    scores = scores.double()
    for banned in banned_by_ngrams(sequence, case["no_repeat_ngram_size"]):
        scores[0, banned] = NEG_INF
    if case.get("bad_words_ids"):  # NoBadWordsLogitsProcessor: a sequence bias of -inf
        scores = sequence_bias(scores, sequence, [[ids, NEG_INF] for ids in case["bad_words_ids"]])
    if case.get("forced_bos") is not None and cur_len == 1:  # ForcedBOSTokenLogitsProcessor
        scores = torch.full_like(scores, NEG_INF)
        scores[0, case["forced_bos"]] = 0
    if case.get("forced_eos") and cur_len == prompt_length + case["max_new_tokens"] - 1:  # ForcedEOS...
        scores = torch.full_like(scores, NEG_INF)
        scores[0, case["forced_eos"]] = 0
    for suppressed in case.get("suppress_tokens", []):
        scores[0, suppressed] = NEG_INF
    if case["temperature"] == 0:
        return [[int(torch.argmax(scores[0])), 1.0]]

    scores = scores / case["temperature"]
    if case["top_k"] > 0:
        k = min(case["top_k"], scores.shape[-1])
        kth = torch.topk(scores, k)[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, NEG_INF)
    if case["top_p"] < 1:
        ascending, order = torch.sort(scores, descending=False)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - case["top_p"])
        remove[..., -1:] = False
        scores = scores.masked_fill(remove.scatter(1, order, remove), NEG_INF)
    if case["min_p"] > 0:
        probs = torch.softmax(scores, dim=-1)
        remove = probs < case["min_p"] * probs.amax(dim=-1, keepdim=True)
        descending = torch.argsort(scores, descending=True, dim=-1)
        remove_sorted = torch.gather(remove, 1, descending)
        remove_sorted[..., :1] = False
        scores = scores.masked_fill(remove_sorted.scatter(1, descending, remove_sorted), NEG_INF)
    if case["typical_p"] < 1:
        log_q = torch.nn.functional.log_softmax(scores, dim=-1)
        q = torch.exp(log_q)
        entropy = -(log_q * q).nansum(-1, keepdim=True)
        surprise = torch.abs(-log_q - entropy)
        by_surprise, order = torch.sort(surprise, descending=False)
        cumulative = scores.gather(-1, order).softmax(dim=-1).cumsum(dim=-1)
        last = (cumulative < case["typical_p"]).sum(dim=1).clamp(max=by_surprise.shape[-1] - 1)
        remove = by_surprise > by_surprise.gather(1, last.view(-1, 1))
        remove[..., :1] = False
        scores = scores.masked_fill(remove.scatter(1, order, remove), NEG_INF)
    # Epsilon and eta: an id below the cut leaves unless its score is the top one (min_tokens_to_keep 1).
    if 0 < case["epsilon_cutoff"] < 1:
        probs = torch.softmax(scores, dim=-1)
        remove = (probs < case["epsilon_cutoff"]) & (scores < torch.topk(scores, 1)[0][..., -1, None])
        scores = scores.masked_fill(remove, NEG_INF)
    if 0 < case["eta_cutoff"] < 1:
        probs = torch.softmax(scores, dim=-1)
        entropy = torch.distributions.Categorical(logits=scores).entropy()
        epsilon = torch.tensor(case["eta_cutoff"], dtype=torch.float64)
        eta = torch.min(epsilon, torch.sqrt(epsilon) * torch.exp(-entropy))[..., None]
        remove = (probs < eta) & (scores < torch.topk(scores, 1)[0][..., -1, None])
        scores = scores.masked_fill(remove, NEG_INF)
    probs = torch.softmax(scores, dim=-1)[0]
    return [[i, float(p)] for i, p in enumerate(probs.tolist()) if p > 0]


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)["cases"]
    with open(sys.argv[2], "w") as f:
        json.dump({"cases": [distribution(c) for c in cases]}, f)


if __name__ == "__main__":
    main()
