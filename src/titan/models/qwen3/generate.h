#pragma once
// Text generation from a model: the prompt runs through the decoder once, then each new token
// alone, attending over the keys and values cached for the tokens before it (Qwen3Model's KVCache,
// ops::cached_attention); the next token comes from the last position's logits, greedy or sampled
// with temperature, top-k and top-p. (torchtitan's scripts/generate reruns the whole sequence for
// every token; the tests hold the cached steps to that full forward's logits.) `titan generate` is
// the command around it.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "titan/models/qwen3/model.h"

namespace titan::qwen3 {

struct SamplingOptions {
  double temperature = 0.0;  // 0: greedy (the largest logit, the lowest id on a tie)
  int64_t top_k = 0;         // 0: no limit; else only the k most likely ids (ties: lower ids first)
  double top_p = 1.0;        // nucleus: the most likely ids whose probabilities reach top_p
  // transformers' repetition_penalty, applied first, greedy or sampled: every id already in the
  // sequence (prompt and new tokens) has its logit divided by it when positive, multiplied when
  // negative (1: none; above 1 discourages repeats).
  double repetition_penalty = 1.0;
  uint64_t seed = 0;         // the sampler's random stream (the same seed gives the same text)

  // Names the field and the rule: temperature finite and >= 0, top_k >= 0, top_p in (0, 1],
  // repetition_penalty finite and > 0.
  void validate() const;
};

// The sampling a transformers generation_config.json asks for when generate is given none, as
// transformers' generate applies it: greedy unless do_sample is true, then its temperature, top_k
// and top_p, with transformers' defaults (1.0, 50, 1.0) for those absent and null as "no limit";
// and its repetition_penalty either way (a logits processor, not a sampling setting). `not_applied`
// names the keys it sets that titan's sampler has no counterpart for (min_p, num_beams, ...), for
// the caller to say. An ill-typed value is an error naming `where` and the key.
struct GenerationDefaults {
  SamplingOptions sampling;  // seed 0
  bool samples = false;      // do_sample
  std::vector<std::string> not_applied;
};
GenerationDefaults generation_defaults(const nlohmann::json& generation_config, const std::string& where);

// The next token from one row of logits. `allowed` (empty: every id) marks the ids that may be
// chosen; an id outside it is never picked (a tokenizer's unknown ids: the embedding's padding).
// `sequence`: the ids so far, which options.repetition_penalty penalises.
int64_t pick_next_token(std::span<const float> logits, const SamplingOptions& options, std::mt19937_64& rng,
                        const std::vector<bool>& allowed = {}, std::span<const int64_t> sequence = {});

struct Generation {
  std::vector<int64_t> ids;  // the new tokens only (the stop token included when one ended it)
  std::string stop_reason;   // "stop token" or "max new tokens"
  double seconds = 0;        // wall time of the new tokens
};

// Up to `max_new_tokens` tokens after `prompt` (ids in the model's vocabulary, at least one);
// stops after a token in `stop_ids`. prompt + new tokens must fit the model's max_seq_len.
// `on_token` (if set) is called with each new token as soon as it is chosen (streaming output).
Generation generate(Qwen3Model& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                    const SamplingOptions& options, const std::vector<int64_t>& stop_ids,
                    const std::vector<bool>& allowed = {}, const std::function<void(int64_t)>& on_token = {});

}  // namespace titan::qwen3
