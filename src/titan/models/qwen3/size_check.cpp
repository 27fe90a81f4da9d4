#include "titan/models/qwen3/size_check.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "titan/core/check.h"

namespace titan::qwen3 {

void check_size_bounds(const ModelArgs& a) {
  // Powers of two well above the largest published models (Qwen3-235B: 94 layers, dim 4096,
  // 128 experts, vocab 151936), low enough that every product below fits in 128 bits.
  // Fields grouped by their bound, 2^bits.
  struct Field {
    const char* name;
    int64_t value;
  };
  struct Bound {
    int bits;
    std::vector<Field> fields;
  };
  const Bound bounds[] = {
      {12, {{"n_heads", a.n_heads}, {"n_kv_heads", a.n_kv_heads}, {"head_dim", a.head_dim}}},
      {14, {{"n_layers", a.n_layers}, {"num_experts", a.num_experts}, {"top_k", a.top_k},
            {"decoder_sparse_step", a.decoder_sparse_step}}},
      {17, {{"dim", a.dim}}},
      {20, {{"hidden_dim", a.hidden_dim}, {"moe_hidden_dim", a.moe_hidden_dim}}},
      {24, {{"vocab_size", a.vocab_size}, {"max_seq_len", a.max_seq_len}}},
  };
  for (const Bound& b : bounds) {
    const int64_t limit = int64_t(1) << b.bits;
    for (const Field& f : b.fields)
      TITAN_CHECK(f.value <= limit, "model args: ", f.name, " = ", f.value, " exceeds the limit ", limit,
                  " (sizes are bounded so that nothing overflows or is allocated before it is checked)");
  }
  TITAN_CHECK(a.n_layers > 0, "model args: n_layers must be positive, got ", a.n_layers);
  // The list is bounded by the layer count; an entry out of range is the likelier mistake, so it is
  // named first (the same words as ModelArgs::validate).
  for (const int64_t l : a.mlp_only_layers)
    TITAN_CHECK(l >= 0 && l < a.n_layers, "model args: mlp_only_layers entry ", l, " outside [0, ",
                a.n_layers, ")");
  TITAN_CHECK(int64_t(a.mlp_only_layers.size()) <= a.n_layers, "model args: mlp_only_layers lists ",
              a.mlp_only_layers.size(), " layers (with repeats) but the model has ", a.n_layers);
}

int64_t narrow_size(__int128 value, const char* what) {
  TITAN_CHECK(value >= 0 && value <= std::numeric_limits<int64_t>::max(), what, " = ", double(value),
              " does not fit in a 64-bit integer");
  return int64_t(value);
}

void check_memory_fits(const MemoryNeed& need, int64_t available, const std::string& what,
                       const std::string& available_what, const std::string& advice) {
  auto gib = [](int64_t b, int digits = 3) {
    char s[48];
    std::snprintf(s, sizeof s, "%.*g GiB", digits, double(b) / double(int64_t(1) << 30));
    return std::string(s);
  };
  const __int128 total =
      __int128(need.weights) + need.grads + need.optimizer + need.activations + need.checkpoint_copy;
  if (total <= available) return;
  const int64_t needed = narrow_size(total, "memory estimate");
  // The two figures with as many digits as tell them apart ("22.3 GiB ... is 22.3 GiB" says nothing).
  int digits = 3;
  while (digits < 12 && gib(needed, digits) == gib(available, digits)) ++digits;
  const std::string copy =
      need.checkpoint_copy ? ", the copy a save in the background writes from " + gib(need.checkpoint_copy)
                           : "";
  TITAN_FAIL(what, " needs an estimated ", gib(needed, digits), " (", needed, " bytes: weights ",
             gib(need.weights), ", gradients ", gib(need.grads), ", optimizer ", gib(need.optimizer),
             ", activations ", gib(need.activations), copy, ") but ", available_what, " is ",
             gib(available, digits), " (", available, " bytes); ", advice);
}

}  // namespace titan::qwen3
