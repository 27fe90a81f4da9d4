// The attention op (ops::attention): autograd through the registered kernels, GQA, errors.
// The raw kernels have their own exhaustive tests in tests/backend/attention_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/op_test_util.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention/attention.h"

using namespace titan;
using namespace titan::testing;

namespace {
OpFn attention_fn(double scale) {
  return [scale](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::attention(in[0], in[1], in[2], scale)}; };
}
}  // namespace

TEST(AttentionOp, GradientMatchesFiniteDifferencesForEveryGqaRatio) {
  for (int64_t r : {1, 2, 4}) {
    const int64_t B = 2, S = 5, Hkv = 2, D = 4;
    expect_gradcheck(attention_fn(1.0 / std::sqrt(double(D))),
                     {random_tensor({B, S, Hkv * r, D}, DType::F64, 1), random_tensor({B, S, Hkv, D}, DType::F64, 2),
                      random_tensor({B, S, Hkv, D}, DType::F64, 3)});
  }
}

TEST(AttentionOp, FlashVariantMatchesReferenceThroughAutograd) {
  // GQA ratios 1, 2, 4, 8; head_dim 64 and 128; S not a multiple of the 64-wide tiles.
  for (auto [r, D, S] : {std::tuple<int64_t, int64_t, int64_t>{1, 64, 37}, {2, 128, 70}, {4, 64, 129}, {8, 128, 33}}) {
    const int64_t B = 2, Hkv = 2;
    auto q = random_tensor({B, S, Hkv * r, D}, DType::F32, 4).set_requires_grad(true);
    auto k = random_tensor({B, S, Hkv, D}, DType::F32, 5).set_requires_grad(true);
    auto v = random_tensor({B, S, Hkv, D}, DType::F32, 6).set_requires_grad(true);
    // f32: same math, different summation order (the spec's tolerance, ops/attention/spec.cpp).
    expect_variant_matches_spec("attention", "default", {B, S, Hkv * r, Hkv, D}, attention_fn(1.0 / std::sqrt(double(D))),
                                {q, k, v});
  }
}

TEST(AttentionOp, CausalRowZeroAttendsOnlyToItself) {
  // Position 0 sees only key 0, so out[:, 0] == v[:, 0] for every head of its group.
  const int64_t B = 1, S = 9, Hkv = 2, r = 2, D = 8;
  auto q = random_tensor({B, S, Hkv * r, D}, DType::F32, 7);
  auto k = random_tensor({B, S, Hkv, D}, DType::F32, 8);
  auto v = random_tensor({B, S, Hkv, D}, DType::F32, 9);
  Tensor out = ops::attention(q, k, v, 0.3);
  for (int64_t h = 0; h < Hkv * r; ++h)
    for (int64_t d = 0; d < D; ++d)
      EXPECT_FLOAT_EQ(out.data<float>()[h * D + d], v.data<float>()[(h / r) * D + d]) << "head " << h;
}

TEST(AttentionOp, BadShapesNameTheOpAndShapes) {
  auto q = Tensor::zeros({1, 4, 3, 8}, DType::F32), k = Tensor::zeros({1, 4, 2, 8}, DType::F32);
  try {
    ops::attention(q, k, k, 1.0);
    FAIL() << "3 query heads over 2 kv heads must be rejected";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("attention"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[1, 4, 3, 8]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::attention(Tensor::zeros({1, 4, 2, 8}, DType::F32), Tensor::zeros({1, 5, 2, 8}, DType::F32),
                              Tensor::zeros({1, 5, 2, 8}, DType::F32), 1.0),
               Error);
  EXPECT_THROW(ops::attention(Tensor::zeros({1, 4, 2, 8}, DType::F32), Tensor::zeros({1, 4, 2, 8}, DType::BF16),
                              Tensor::zeros({1, 4, 2, 8}, DType::BF16), 1.0),
               Error);
}

// The bf16 kernels' activation-sized scratch (the default backward's bf16 dout and gradients, the
// reference's f32 copies of its inputs) comes from the allocator, so the metrics line's memory and
// peak count it; it is all given back when the kernel returns.
TEST(AttentionOp, Bf16ScratchIsCountedAsTheRunsMemory) {
  const ops::AttentionShape s{2, 70, 4, 2, 64, 0.125f};
  DeviceServices& mem = device_services(Device::CPU);
  const KernelContext ctx = mem.context();
  const int64_t B = s.B, S = s.S, Hq = s.Hq, Hkv = s.Hkv, D = s.D;
  Tensor q = random_tensor({B, S, Hq, D}, DType::BF16, 1), k = random_tensor({B, S, Hkv, D}, DType::BF16, 2),
         v = random_tensor({B, S, Hkv, D}, DType::BF16, 3),
         dout = random_tensor({B, S, Hq, D}, DType::F32, 4);
  Tensor out = Tensor::empty({B, S, Hq, D}, DType::BF16), lse = Tensor::empty({B, Hq, S}, DType::F32);
  Tensor dq = Tensor::empty({B, S, Hq, D}, DType::F32), dk = Tensor::empty({B, S, Hkv, D}, DType::F32),
         dv = Tensor::empty({B, S, Hkv, D}, DType::F32);
  const int64_t q_n = int64_t(s.q_numel()), kv_n = int64_t(s.kv_numel());
  // default: bf16 dout, dq, dk, dv; reference: f32 q, k, v, out (its forward: q, k, v, out too).
  for (auto [variant, backward_scratch, forward_scratch] :
       {std::tuple<const char*, int64_t, int64_t>{"default", 2 * (2 * q_n + 2 * kv_n), 0},
        {"reference", 4 * (2 * q_n + 2 * kv_n), 4 * (2 * q_n + 2 * kv_n)}}) {
    SCOPED_TRACE(variant);
    const auto& kernel =
        kernels::kernel_for<ops::AttentionKernel>("attention", Device::CPU, DType::BF16, variant);
    const int64_t held = mem.stats().current_bytes;
    mem.reset_peak();
    kernel.forward(ctx, s, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data());
    EXPECT_GE(mem.stats().peak_bytes - held, forward_scratch);
    EXPECT_EQ(mem.stats().current_bytes, held);
    mem.reset_peak();
    kernel.backward(ctx, s, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(),
                    dout.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data());
    EXPECT_GE(mem.stats().peak_bytes - held, backward_scratch);
    EXPECT_EQ(mem.stats().current_bytes, held) << "scratch not given back";
  }
}
