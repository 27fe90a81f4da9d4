// Rows padded after their tokens (conversations, RowContents::lengths): what the expert bias balances
// is the real tokens' routing, the counts of each row's tokens alone; the padding is routed (its
// rows are computed whole) but not counted.
#include <gtest/gtest.h>

#include <random>

#include "models/small_args.h"
#include "titan/autograd/autograd.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"

namespace titan {
namespace {

using qwen3::Qwen3Model;

// Each MoE layer's expert counts of the model's last forward, as numbers.
std::vector<std::vector<int64_t>> counts_of(const Qwen3Model& model) {
  std::vector<std::vector<int64_t>> out;
  for (const Tensor& c : model.last_expert_counts()) {
    std::vector<int64_t> v;
    for (double x : c.to_vector()) v.push_back(int64_t(x));
    out.push_back(v);
  }
  return out;
}

TEST(Padding, TheExpertCountsOfPaddedRowsAreThoseOfTheirTokensAlone) {
  // f64: the prefixes alone route exactly as inside the padded rows (causal attention keeps the
  // padding out of every earlier position).
  Qwen3Model model(testing::small_args(2, true), DType::F64);
  model.enable_expert_bias();
  model.initialize(11);
  autograd::NoGradGuard no_grad;
  const int64_t S = 16, E = model.args().num_experts, k = model.args().top_k;
  const std::vector<int64_t> lengths = {S, 9, 3};
  const int64_t B = int64_t(lengths.size());
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> token(0, model.args().vocab_size - 1);
  std::vector<int64_t> ids(size_t(B * S));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t t = 0; t < S; ++t) ids[size_t(r * S + t)] = t < lengths[size_t(r)] ? token(rng) : 7;  // 7: pad

  // Each row's tokens alone: the counts summed over the rows.
  std::vector<std::vector<int64_t>> alone;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t n = lengths[size_t(r)];
    const std::vector<int64_t> row(ids.begin() + r * S, ids.begin() + r * S + n);
    model.forward_loss(Tensor::from_vector(row, {1, n}), Tensor::from_vector(row, {1, n}));
    const auto c = counts_of(model);
    if (alone.empty()) alone.assign(c.size(), std::vector<int64_t>(size_t(E), 0));
    for (size_t layer = 0; layer < c.size(); ++layer)
      for (int64_t e = 0; e < E; ++e) alone[layer][size_t(e)] += c[layer][size_t(e)];
  }

  const Tensor ids_t = Tensor::from_vector(ids, {B, S});
  model.forward_loss(ids_t, ids_t, 1, 1, qwen3::RowContents{{}, lengths});
  const auto padded = counts_of(model);
  ASSERT_EQ(padded.size(), alone.size());
  for (size_t layer = 0; layer < padded.size(); ++layer) {
    EXPECT_EQ(padded[layer], alone[layer]) << "layer " << layer;
    int64_t assignments = 0;
    for (int64_t c : padded[layer]) assignments += c;
    EXPECT_EQ(assignments, k * (S + 9 + 3)) << "layer " << layer;
  }

  // Without the lengths every position counts, the padding's too.
  model.forward_loss(ids_t, ids_t);
  const auto unmasked = counts_of(model);
  int64_t all = 0;
  for (int64_t c : unmasked[0]) all += c;
  EXPECT_EQ(all, k * B * S);
}

}  // namespace
}  // namespace titan
