// Documents packed in a row with block-causal attention (model.attn_mask_type = "block_causal") are
// trained as if each were alone: their tokens' losses and the gradients they send to the weights are
// those of the documents trained one by one, from position 0. The rope positions run over the whole
// row (torchtitan's TOML era; its main numbers each document from 0): the same thing, because a
// rotated query-key score depends only on the distance between the two positions, and no score
// crosses a document. Causal attention over the row is not.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "models/small_args.h"
#include "titan/autograd/autograd.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"
#include "titan/ops/elementwise/elementwise.h"

namespace titan {
namespace {

using qwen3::Qwen3Model;

constexpr int64_t kIgnore = -100;

struct Packed {
  std::vector<int64_t> ids, targets;  // one row
  std::vector<int64_t> starts;        // where each document starts in it
};

// Documents of `lengths` tokens, each token's target the next token of its document (the last
// one's ignored), packed into one row.
Packed pack(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  Packed p;
  for (int64_t n : lengths) {
    p.starts.push_back(int64_t(p.ids.size()));
    for (int64_t t = 0; t < n; ++t) p.ids.push_back(token(rng));
    for (int64_t t = 1; t < n; ++t) p.targets.push_back(p.ids[size_t(p.starts.back() + t)]);
    p.targets.push_back(kIgnore);
  }
  return p;
}

// The summed cross-entropy of the row's targets (the model's mean times their count), and every
// parameter's gradient of that sum.
struct Result {
  double loss_sum = 0;
  std::vector<std::vector<double>> grads;
};

Result run(Qwen3Model& model, const std::vector<int64_t>& ids, const std::vector<int64_t>& targets,
           const qwen3::RowContents& rows) {
  model.zero_grad();
  const int64_t S = int64_t(ids.size());
  qwen3::LossOutput out =
      model.forward_loss(Tensor::from_vector(ids, {1, S}), Tensor::from_vector(targets, {1, S}), 1, 1, rows);
  const double count = double(out.num_targets);
  autograd::backward(ops::scale(out.loss, count));
  Result r{out.ce_loss.item() * count, {}};
  for (const nn::Param* p : model.params()) r.grads.push_back(p->grad().to_vector());
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(PackedDocuments, BlockCausalRowsTrainEachDocumentAsAlone) {
  // f64 compute: the documents alone and packed differ only in summation order (the gradients are
  // summed into the f32 buffers of the parameters: f32's precision there).
  Qwen3Model model(testing::small_args(2, false), DType::F64);
  model.initialize(3);
  const std::vector<int64_t> lengths = {7, 12, 5};
  const Packed packed = pack(lengths, model.args().vocab_size, 17);

  // Each document alone, from position 0: the sums of their losses and gradients.
  Result alone;
  for (size_t d = 0; d < lengths.size(); ++d) {
    const auto first = packed.ids.begin() + packed.starts[d];
    const auto first_target = packed.targets.begin() + packed.starts[d];
    const Result r = run(model, {first, first + lengths[d]}, {first_target, first_target + lengths[d]}, {});
    alone.loss_sum += r.loss_sum;
    if (alone.grads.empty()) alone.grads.assign(r.grads.size(), {});
    for (size_t p = 0; p < r.grads.size(); ++p) {
      alone.grads[p].resize(r.grads[p].size());
      for (size_t i = 0; i < r.grads[p].size(); ++i) alone.grads[p][i] += r.grads[p][i];
    }
  }

  qwen3::RowContents rows;
  rows.documents.starts = packed.starts;
  const Result block_causal = run(model, packed.ids, packed.targets, rows);
  EXPECT_NEAR(block_causal.loss_sum, alone.loss_sum, 1e-10 * alone.loss_sum);
  for (size_t p = 0; p < alone.grads.size(); ++p) {
    const double scale = std::max(max_abs(alone.grads[p]), 1e-30);
    for (size_t i = 0; i < alone.grads[p].size(); ++i)
      ASSERT_NEAR(block_causal.grads[p][i], alone.grads[p][i], 1e-6 * scale)
          << model.params()[p]->name << "[" << i << "]";
  }

  // Causal over the row: the later documents attend to the earlier ones.
  const Result causal = run(model, packed.ids, packed.targets, {});
  EXPECT_GT(std::abs(causal.loss_sum - alone.loss_sum), 1e-6 * alone.loss_sum);
}

}  // namespace
}  // namespace titan
