#include "titan/models/qwen3/estimate.h"

#include <algorithm>
#include <string>

#include "titan/core/check.h"
#include "titan/models/qwen3/size_check.h"

namespace titan::qwen3 {

MemoryEstimate estimate_training_memory(const ModelArgs& a, int64_t batch, int64_t seq, DType compute,
                                        Checkpointing checkpointing) {
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
  Wide layers = 0, largest_covered = 0;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    const Wide b = layer_bytes(i);
    if (checkpointing.covers(i)) {
      layers += T * c * a.dim;  // the input it recomputes from
      largest_covered = std::max(largest_covered, b);
    } else {
      layers += b;
    }
  }
  layers += largest_covered;  // one covered layer's activations, live again in its backward
  m.activations = narrow_size(layers + T * (c * a.dim + 4), "activation bytes");
  return m;
}

}  // namespace titan::qwen3
