#pragma once
// A small Qwen3 (dim 64, 2 heads over 1 KV head, vocabulary 1000) whose forward and backward take
// milliseconds: the tests that count, record or time what a step does, not its numbers.
#include <cstdint>

#include "titan/models/qwen3/args.h"

namespace titan::testing {

// `n_layers` layers, dense, or MoE (8 experts, top 2) in every layer.
inline qwen3::ModelArgs small_args(int64_t n_layers, bool moe) {
  qwen3::ModelArgs a = qwen3::flavor("debugmodel");
  a.n_layers = n_layers;
  a.vocab_size = 1000;
  a.dim = 64;
  a.n_heads = 2;
  a.n_kv_heads = 1;
  a.head_dim = 32;
  a.hidden_dim = 128;
  if (moe) {
    a.num_experts = 8;
    a.top_k = 2;
    a.moe_hidden_dim = 32;
  }
  a.validate();
  return a;
}

}  // namespace titan::testing
