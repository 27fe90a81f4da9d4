#include "titan/models/qwen3/estimate.h"

#include <algorithm>
#include <string>

#include "titan/core/check.h"
#include "titan/models/qwen3/size_check.h"

namespace titan::qwen3 {

MemoryEstimate estimate_training_memory(const ModelArgs& a, int64_t batch, int64_t seq, DType compute,
                                        const char* checkpointing) {
  // 128-bit arithmetic: with the ModelArgs bounds and these, no product below can overflow.
  constexpr int64_t kMaxBatchOrSeq = int64_t(1) << 31;
  TITAN_CHECK(batch >= 1 && batch <= kMaxBatchOrSeq, "memory estimate: batch size ", batch, " outside [1, ",
              kMaxBatchOrSeq, "]");
  TITAN_CHECK(seq >= 1 && seq <= kMaxBatchOrSeq, "memory estimate: sequence length ", seq, " outside [1, ",
              kMaxBatchOrSeq, "]");
  using Wide = __int128;
  MemoryEstimate m;
  const Wide P = a.num_params();
  m.weights = narrow_size(P * 4, "weight bytes");
  m.grads = narrow_size(P * 4, "gradient bytes");
  m.optimizer = narrow_size(P * 8, "optimizer bytes");
  const Wide c = Wide(dtype_size(compute)), T = Wide(batch) * seq, hd = a.head_dim;
  auto layer_bytes = [&](int64_t i) -> Wide {
    Wide attn = c * (2 * Wide(a.dim) + Wide(a.n_heads + 2 * a.n_kv_heads) * hd +
                     Wide(a.n_heads + a.n_kv_heads) * hd + Wide(a.n_heads) * hd) +
                4 * Wide(a.n_heads);
    Wide ffn =
        a.is_moe_layer(i)
            ? c * (Wide(a.dim) + a.num_experts + Wide(a.top_k) * (3 * Wide(a.moe_hidden_dim) + a.dim)) +
                  4 * Wide(a.num_experts)
            : c * (Wide(a.dim) + 3 * Wide(a.hidden_dim));
    return T * (attn + ffn);
  };
  std::string mode = checkpointing;
  Wide largest = 0, all = 0, half = 0;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    Wide b = layer_bytes(i);
    largest = std::max(largest, b);
    all += b;
    half += (i % 2 == 0) ? T * c * a.dim : b;  // selective recomputes even layers
  }
  Wide layers = mode == "full"        ? Wide(a.n_layers) * T * c * a.dim + largest
                : mode == "selective" ? half + largest
                                      : all;
  m.activations = narrow_size(layers + T * (c * a.dim + 4), "activation bytes");
  return m;
}

}  // namespace titan::qwen3
