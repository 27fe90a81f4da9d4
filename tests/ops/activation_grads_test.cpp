// bf16 activation gradients (ops/activation_grads.h) on the CPU: with the setting on, rms_norm, rope,
// swiglu, linear and attention hand bf16 gradients to their bf16 activations, equal bit for bit to
// their f32 gradients rounded to bf16 (the CPU kernels compute in f32 and the op rounds once), and
// leave the weights' f32 gradients exactly as they were. The CUDA kernels that write bf16
// gradients themselves are checked against these in tests/backend/cuda_ops_test.cpp.
#include "titan/ops/activation_grads.h"

#include <gtest/gtest.h>

#include "ops/op_test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/linear/linear.h"
#include "titan/ops/rms_norm/rms_norm.h"
#include "titan/ops/rope/rope.h"
#include "titan/ops/swiglu/swiglu.h"

using namespace titan;
using namespace titan::testing;

namespace {

using Op = std::function<Tensor(const std::vector<Tensor>&, const std::vector<Tensor>&)>;

void expect_bf16_activation_grads(const Op& f, const std::vector<Tensor>& activations,
                                  const std::vector<Tensor>& weights) {
  const ActivationGradsRun f32 = run_activation_grads(f, activations, weights, false, Device::CPU),
                           bf16 = run_activation_grads(f, activations, weights, true, Device::CPU);
  for (size_t i = 0; i < activations.size(); ++i) {
    SCOPED_TRACE("activation " + std::to_string(i));
    EXPECT_EQ(f32.seen[i], DType::F32);
    EXPECT_EQ(bf16.seen[i], DType::BF16);
    EXPECT_EQ(bf16.grads[i].to_vector(), f32.grads[i].to(DType::BF16).to_vector())
        << "the f32 gradient, rounded once";
  }
  for (size_t i = activations.size(); i < f32.grads.size(); ++i) {
    SCOPED_TRACE("weight " + std::to_string(i - activations.size()));
    EXPECT_EQ(bf16.grads[i].dtype(), DType::F32);
    EXPECT_EQ(bf16.grads[i].to_vector(), f32.grads[i].to_vector()) << "weights' gradients do not change";
  }
}

}  // namespace

TEST(ActivationGrads, RmsNormRoundsTheInputsGradientOnly) {
  expect_bf16_activation_grads([](const std::vector<Tensor>& a,
                                  const std::vector<Tensor>& w) { return ops::rms_norm(a[0], w[0], 1e-6); },
                               {random_tensor({6, 40}, DType::BF16, 1, -2, 2)},
                               {random_tensor({40}, DType::BF16, 2, 0.5, 1.5)});
}

TEST(ActivationGrads, LinearRoundsTheInputsGradientOnly) {
  expect_bf16_activation_grads(
      [](const std::vector<Tensor>& a, const std::vector<Tensor>& w) { return ops::linear(a[0], w[0]); },
      {random_tensor({9, 32}, DType::BF16, 3)}, {random_tensor({16, 32}, DType::BF16, 4)});
}

TEST(ActivationGrads, RopeSwigluAndAttentionRoundTheirInputsGradients) {
  const Tensor pos = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4}, {5});
  expect_bf16_activation_grads(
      [&](const std::vector<Tensor>& a, const std::vector<Tensor>&) { return ops::rope(a[0], pos, 1e6); },
      {random_tensor({2, 5, 3, 16}, DType::BF16, 5)}, {});
  expect_bf16_activation_grads(
      [](const std::vector<Tensor>& a, const std::vector<Tensor>&) { return ops::swiglu(a[0], a[1]); },
      {random_tensor({7, 24}, DType::BF16, 6, -4, 4), random_tensor({7, 24}, DType::BF16, 7)}, {});
  expect_bf16_activation_grads(
      [](const std::vector<Tensor>& a, const std::vector<Tensor>&) {
        return ops::attention(a[0], a[1], a[2], 0.25);
      },
      {random_tensor({2, 8, 4, 16}, DType::BF16, 8), random_tensor({2, 8, 2, 16}, DType::BF16, 9),
       random_tensor({2, 8, 2, 16}, DType::BF16, 10)},
      {});
}

// An op that writes f32 gradients (the fused loss, the MoE experts) can hand a bf16 output an f32
// gradient. Under the setting it is that output's gradient, so bf16: the op rounds it before its
// kernel (the CPU's f32-gradient kernel here, as a CUDA kernel reading bf16 does), and every
// gradient, the weight's included, is the one of the rounded upstream gradient.
TEST(ActivationGrads, AnF32UpstreamGradientIsRoundedFirst) {
  autograd::Bf16ActivationGradientsScope setting(true);
  const Tensor x = random_tensor({6, 40}, DType::BF16, 1, -2, 2),
               w = random_tensor({40}, DType::BF16, 2, 0.5, 1.5);
  const Tensor upstream = random_tensor({6, 40}, DType::F32, 3, -1, 1);  // not on the bf16 grid
  ASSERT_NE(upstream.to_vector(), upstream.to(DType::BF16).to(DType::F32).to_vector());
  auto grads = [&](const Tensor& seed) {
    const Tensor xl = x.clone().set_requires_grad(true), wl = w.clone().set_requires_grad(true);
    const Tensor y = ops::rms_norm(xl, wl, 1e-6);
    autograd::backward(autograd::current_tape(), {y}, {seed});
    return std::vector<std::vector<double>>{xl.grad().to_vector(), wl.grad().to_vector()};
  };
  EXPECT_EQ(grads(upstream), grads(upstream.to(DType::BF16).to(DType::F32)));
}

// f32 activations never get bf16 gradients, whatever the setting.
TEST(ActivationGrads, F32ActivationsKeepF32Gradients) {
  const ActivationGradsRun r = run_activation_grads(
      [](const std::vector<Tensor>& a, const std::vector<Tensor>& w) {
        return ops::rms_norm(a[0], w[0], 1e-6);
      },
      {random_tensor({3, 8}, DType::F32, 1)}, {random_tensor({8}, DType::F32, 2)}, true, Device::CPU);
  EXPECT_EQ(r.seen[0], DType::F32);
}
