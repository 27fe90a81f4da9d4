#!/usr/bin/env python3
"""transformers' beam search (GenerationMixin._beam_search of transformers 4.56+, batch size 1,
do_sample False) over the PyTorch reference model of qwen3_torch.py, in float64: the ground truth
for titan's qwen3::beam_search. Each step runs the whole sequence of every beam through the model
(no KV cache), so the reference shares nothing with titan's cached steps.

    beam_search.py IN.json OUT.json

IN:  {"model_dir": DIR, "cases": [{"prompt": [ids], "max_new_tokens": N, "num_beams": B,
      "length_penalty": x, "early_stopping": false | true | "never", "num_return_sequences": R,
      "stop_ids": [ids], "repetition_penalty": x, "no_repeat_ngram_size": n, "min_new_tokens": m,
      "forced_bos": id, "forced_eos": [ids], "decay": [start, factor], "renormalize": bool}, ...]}
      (the last four optional)
OUT: {"cases": [[{"ids": [new ids], "score": s}, ...best first...], ...]}

The processors run in _get_logits_processor's order: repetition penalty, no repeated n-gram, min new
tokens, forced bos, forced eos, exponential decay length penalty, then LogitNormalization
(renormalize_logits). One departure, titan's: the decay leaves an eos log-probability that min new
tokens set to -inf as it is, where transformers' abs(-inf) * (factor^k - 1) makes it NaN.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_torch  # noqa: E402


def repetition_penalty(input_ids, scores, penalty):
    """RepetitionPenaltyLogitsProcessor."""
    score = torch.gather(scores, 1, input_ids)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return scores.scatter(1, input_ids, score)


def no_repeat_ngram(input_ids, scores, n):
    """NoRepeatNGramLogitsProcessor: ban the ids that would complete an n-gram seen before."""
    rows, cur_len = input_ids.shape
    if cur_len + 1 < n:
        return scores
    scores = scores.clone()
    for r in range(rows):
        seq = input_ids[r].tolist()
        seen = {}
        for i in range(len(seq) - n + 1):
            gram = tuple(seq[i:i + n])
            seen.setdefault(gram[:-1], []).append(gram[-1])
        for banned in seen.get(tuple(seq[cur_len - n + 1:cur_len]), []):
            scores[r, banned] = -float("inf")
    return scores


def beam_search(cfg, P, case):
    prompt = torch.tensor(case["prompt"], dtype=torch.int64)
    num_beams = case["num_beams"]
    length_penalty = case["length_penalty"]
    early_stopping = case["early_stopping"]
    eos = case["stop_ids"]
    decoder_prompt_len = cur_len = prompt.shape[0]
    max_length = cur_len + case["max_new_tokens"]
    vocab_size = cfg.vocab
    beams_to_keep = max(2, 1 + len(eos)) * num_beams
    top_num_beam_mask = torch.cat((torch.ones(num_beams, dtype=torch.bool),
                                   torch.zeros(beams_to_keep - num_beams, dtype=torch.bool)))

    running_sequences = torch.full((num_beams, max_length), -1, dtype=torch.int64)
    running_sequences[:, :cur_len] = prompt
    sequences = running_sequences.clone()
    running_beam_scores = torch.zeros(num_beams, dtype=torch.float64)
    running_beam_scores[1:] = -1e9
    beam_scores = torch.full((num_beams,), -1e9, dtype=torch.float64)
    is_sent_finished = torch.zeros(num_beams, dtype=torch.bool)
    unsatisfied = True  # is_early_stop_heuristic_unsatisfied
    generated = torch.zeros(num_beams, dtype=torch.int64)  # new tokens of each finished slot
    running_generated = torch.zeros(num_beams, dtype=torch.int64)

    while True:
        flat = running_sequences[:, :cur_len]
        with torch.no_grad():
            logits, _, _ = qwen3_torch.forward(cfg, P, flat)
        log_probs = torch.nn.functional.log_softmax(logits[:, -1, :], dim=-1)
        if case["repetition_penalty"] != 1.0:
            log_probs = repetition_penalty(flat, log_probs, case["repetition_penalty"])
        if case["no_repeat_ngram_size"] > 0:
            log_probs = no_repeat_ngram(flat, log_probs, case["no_repeat_ngram_size"])
        if cur_len - decoder_prompt_len < case.get("min_new_tokens", 0):  # MinNewTokensLengthLogitsProcessor
            log_probs[:, eos] = -float("inf")
        if case.get("forced_bos") is not None and cur_len == 1:  # ForcedBOSTokenLogitsProcessor
            log_probs = torch.full_like(log_probs, -float("inf"))
            log_probs[:, case["forced_bos"]] = 0
        if case.get("forced_eos") and cur_len == max_length - 1:  # ForcedEOSTokenLogitsProcessor
            log_probs = torch.full_like(log_probs, -float("inf"))
            log_probs[:, case["forced_eos"]] = 0
        if case.get("decay"):  # ExponentialDecayLengthPenalty
            start, factor = case["decay"]
            regulation_start = start + decoder_prompt_len
            if cur_len > regulation_start:
                held = log_probs[:, eos]
                boosted = held + torch.abs(held) * (pow(factor, cur_len - regulation_start) - 1)
                log_probs[:, eos] = torch.where(torch.isfinite(held), boosted, held)
        if case.get("renormalize"):  # LogitNormalization
            log_probs = torch.nn.functional.log_softmax(log_probs, dim=-1)
        log_probs = (log_probs + running_beam_scores[:, None]).reshape(num_beams * vocab_size)

        # _get_top_k_continuations
        topk_log_probs, topk_indices = torch.topk(log_probs, k=beams_to_keep)
        topk_beam = topk_indices // vocab_size
        topk_ids = topk_indices % vocab_size
        topk_running_sequences = running_sequences[topk_beam].clone()
        topk_running_sequences[:, cur_len] = topk_ids
        topk_generated = running_generated[topk_beam] + 1

        # stopping criteria: an eos id, or max_length reached
        hits = torch.tensor([int(i) in eos for i in topk_ids.tolist()], dtype=torch.bool)
        if cur_len + 1 >= max_length:
            hits[:] = True

        # _get_running_beams_for_next_iteration
        topk_running_log_probs = topk_log_probs + hits.to(torch.float64) * -1.0e9
        next_topk = torch.topk(topk_running_log_probs, k=num_beams)[1]
        new_running_sequences = topk_running_sequences[next_topk]
        new_running_scores = topk_running_log_probs[next_topk]
        new_running_generated = topk_generated[next_topk]

        # _update_finished_beams
        just_finished = hits & top_num_beam_mask
        finished_scores = topk_log_probs / ((cur_len + 1 - decoder_prompt_len) ** length_penalty)
        if bool(is_sent_finished.all()) and early_stopping is True:
            finished_scores = finished_scores - 1.0e9
        if not unsatisfied:
            finished_scores = finished_scores - 1.0e9
        finished_scores = finished_scores + (~just_finished).to(torch.float64) * -1.0e9
        merged_sequences = torch.cat((sequences, topk_running_sequences))
        merged_scores = torch.cat((beam_scores, finished_scores))
        merged_finished = torch.cat((is_sent_finished, just_finished))
        merged_generated = torch.cat((generated, topk_generated))
        keep = torch.topk(merged_scores, k=num_beams)[1]
        sequences, beam_scores = merged_sequences[keep], merged_scores[keep]
        is_sent_finished, generated = merged_finished[keep], merged_generated[keep]

        running_sequences, running_beam_scores = new_running_sequences, new_running_scores
        running_generated = new_running_generated
        cur_len += 1

        # _check_early_stop_heuristic
        if early_stopping == "never" and length_penalty > 0.0:
            best_length = max_length - decoder_prompt_len
        else:
            best_length = cur_len - decoder_prompt_len
        best_possible = running_beam_scores[0] / (best_length ** length_penalty)
        worst = torch.where(is_sent_finished, torch.min(beam_scores), torch.tensor(-1.0e9, dtype=torch.float64))
        unsatisfied = unsatisfied and bool(torch.any(best_possible > worst))

        # _beam_search_has_unfinished_sequences
        exists_open_beam = not (bool(is_sent_finished.all()) and early_stopping is True)
        valid_continuations = not bool(hits.all())
        if not (unsatisfied and exists_open_beam and valid_continuations):
            break

    out = []
    for r in range(case["num_return_sequences"]):
        n = int(generated[r])
        ids = sequences[r, decoder_prompt_len:decoder_prompt_len + n].tolist()
        out.append({"ids": ids, "score": float(beam_scores[r]), "finished": bool(is_sent_finished[r])})
    return out


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    torch.set_num_threads(2)
    qwen3_torch.UPCAST = torch.float64  # f64 throughout, as titan's f64 model
    with open(os.path.join(spec["model_dir"], "config.json")) as f:
        cfg = qwen3_torch.Config(json.load(f))
    weights = qwen3_torch.read_checkpoint(spec["model_dir"])
    if cfg.tied:
        weights.pop("lm_head.weight", None)
    params = {k: v.double() for k, v in weights.items()}
    results = [beam_search(cfg, params.__getitem__, case) for case in spec["cases"]]
    with open(sys.argv[2], "w") as f:
        json.dump({"cases": results}, f)


if __name__ == "__main__":
    main()
