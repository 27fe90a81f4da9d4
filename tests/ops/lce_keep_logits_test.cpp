// linear_cross_entropy with keep_logits_bytes: the default CPU kernel keeps the forward logits and
// its backward reads them instead of recomputing. Same values as recomputing (bit for bit: the same
// GEMMs on the same rows), same tolerances against the reference as the recomputing path, and the
// memory it holds is the logits, only when they fit in the budget.
#include <gtest/gtest.h>

#include <random>

#include "ops/op_test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"
#include "titan/ops/cross_entropy/cross_entropy.h"

using namespace titan;
using namespace titan::testing;

namespace {

constexpr int64_t kIgnore = -100;

OpFn lce_fn(int64_t chunk, bool round, int64_t keep_bytes) {
  return [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::linear_cross_entropy(in[0], in[1], in[2], kIgnore, chunk,
                                                         ops::Reduction::Mean, nullptr, round, keep_bytes)};
  };
}

struct Case {
  int64_t N, D, V, chunk;
  std::vector<int64_t> ignored;
};
const Case kCases[] = {
    {37, 19, 1000, 384, {}}, {37, 19, 1000, 384, {0, 5, 36}}, {13, 64, 257, 8192, {3}}, {16, 8, 100, 7, {}}};
constexpr int64_t kPlenty = int64_t(1) << 30;

std::vector<Tensor> inputs(const Case& c, DType dt) {
  return {random_tensor({c.N, c.D}, DType::F32, 8, -1, 1).to(dt).set_requires_grad(true),
          random_tensor({c.V, c.D}, DType::F32, 9, -1, 1).to(dt).set_requires_grad(true),
          make_labels(c.N, c.V, 10, c.ignored)};
}

}  // namespace

TEST(LinearCrossEntropyKeepLogits, SameResultsAsRecomputing) {
  for (const Case& c : kCases)
    for (DType dt : {DType::F32, DType::BF16})
      for (bool round : {true, false}) {
        SCOPED_TRACE("N=" + std::to_string(c.N) + " V=" + std::to_string(c.V) + " chunk=" +
                     std::to_string(c.chunk) + " " + std::string(dtype_name(dt)) + (round ? " rounded" : ""));
        OpRun kept =
            run_variant("linear_cross_entropy", "default", lce_fn(c.chunk, round, kPlenty), inputs(c, dt));
        OpRun recomputed =
            run_variant("linear_cross_entropy", "default", lce_fn(c.chunk, round, 0), inputs(c, dt));
        EXPECT_EQ(max_abs_diff(kept.outputs[0], recomputed.outputs[0]), 0.0);
        EXPECT_EQ(max_abs_diff(kept.input_grads[0], recomputed.input_grads[0]), 0.0);
        EXPECT_EQ(max_abs_diff(kept.input_grads[1], recomputed.input_grads[1]), 0.0);
      }
}

TEST(LinearCrossEntropyKeepLogits, MatchesReference) {
  // The op's spec tolerances (ops/cross_entropy/spec.cpp), as the recomputing path's test.
  for (const Case& c : kCases) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " V=" + std::to_string(c.V) +
                 " chunk=" + std::to_string(c.chunk));
    const kernels::Dims dims = {c.N, c.V, c.D, c.chunk};
    expect_variant_matches_spec("linear_cross_entropy", "default", dims, lce_fn(c.chunk, true, kPlenty),
                                inputs(c, DType::F32));
    for (bool round : {true, false})
      expect_variant_matches_spec("linear_cross_entropy", "default", dims, lce_fn(c.chunk, round, kPlenty),
                                  inputs(c, DType::BF16));
  }
}

TEST(LinearCrossEntropyKeepLogits, HoldsTheLogitsOnlyWithinTheBudget) {
  const int64_t N = 256, V = 50000, D = 16, chunk = 4096;
  const int64_t ignored = 2, M = N - ignored;
  DeviceServices& alloc = device_services(Device::CPU);
  struct Want {
    DType dt;
    bool round;
    int64_t kept_bytes;
  };
  for (const Want& want : {Want{DType::F32, true, M * V * 4}, Want{DType::BF16, true, M * V * 2},
                           Want{DType::BF16, false, M * V * 4}}) {
    SCOPED_TRACE(std::string(dtype_name(want.dt)) + (want.round ? " rounded" : ""));
    for (int64_t budget : {want.kept_bytes, want.kept_bytes - 1}) {
      auto h = random_tensor({N, D}, want.dt, 28, -1, 1).set_requires_grad(true);
      auto w = random_tensor({V, D}, want.dt, 29, -0.5, 0.5).set_requires_grad(true);
      auto y = make_labels(N, V, 30, {3, 100});
      const int64_t before = alloc.stats().current_bytes;
      Tensor loss = ops::linear_cross_entropy(h, w, y, kIgnore, chunk, ops::Reduction::Mean, nullptr,
                                              want.round, budget);
      const int64_t held = alloc.stats().current_bytes - before;  // the loss, the lse and any kept logits
      if (budget >= want.kept_bytes) {
        EXPECT_GE(held, want.kept_bytes);
        EXPECT_LT(held, want.kept_bytes + 64 * 1024);
      } else {
        EXPECT_LT(held, 64 * 1024) << "kept logits beyond the budget of " << budget << " bytes";
      }
      autograd::backward(loss);
      // Backward frees the kept logits: what remains is the gradients (f32) and the loss.
      EXPECT_LT(alloc.stats().current_bytes - before, (N * D + V * D) * 4 + 64 * 1024);
    }
  }
}
