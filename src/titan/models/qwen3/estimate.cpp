#include "titan/models/qwen3/estimate.h"

#include <algorithm>
#include <string>

namespace titan::qwen3 {

MemoryEstimate estimate_training_memory(const ModelArgs& a, int64_t batch, int64_t seq, DType compute,
                                        const char* checkpointing) {
  MemoryEstimate m;
  const int64_t P = a.num_params();
  m.weights = P * 4;
  m.grads = P * 4;
  m.optimizer = P * 8;
  const int64_t c = int64_t(dtype_size(compute)), T = batch * seq, hd = a.head_dim;
  auto layer_bytes = [&](int64_t i) {
    int64_t attn = c * (2 * a.dim + (a.n_heads + 2 * a.n_kv_heads) * hd + (a.n_heads + a.n_kv_heads) * hd +
                        a.n_heads * hd) + 4 * a.n_heads;
    int64_t ffn = a.is_moe_layer(i)
                      ? c * (a.dim + a.num_experts + a.top_k * (3 * a.moe_hidden_dim + a.dim)) + 4 * a.num_experts
                      : c * (a.dim + 3 * a.hidden_dim);
    return T * (attn + ffn);
  };
  std::string mode = checkpointing;
  int64_t largest = 0, all = 0, half = 0;
  for (int64_t i = 0; i < a.n_layers; ++i) {
    int64_t b = layer_bytes(i);
    largest = std::max(largest, b);
    all += b;
    half += (i % 2 == 0) ? T * c * a.dim : b;  // selective recomputes even layers
  }
  int64_t layers = mode == "full" ? a.n_layers * T * c * a.dim + largest : mode == "selective" ? half + largest : all;
  m.activations = layers + T * (c * a.dim + 4);
  return m;
}

}  // namespace titan::qwen3
