#include "titan/ops/rope/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "ops/torch_ref/torch_ref.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

using namespace titan;
using namespace titan::testing;

namespace {

Tensor arange(int64_t n, int64_t start = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = start + i;
  return Tensor::from_vector(v, {n});
}

// [B, S] positions p0_b + s (contiguous ranges, as gather_free needs).
Tensor ranges(int64_t B, int64_t S, std::vector<int64_t> p0) {
  std::vector<int64_t> v;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) v.push_back(p0[size_t(b)] + s);
  return Tensor::from_vector(v, {B, S});
}

Tensor random_positions(int64_t B, int64_t S, int64_t max, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(size_t(B * S));
  for (auto& p : v) p = int64_t(rng() % uint64_t(max));
  return Tensor::from_vector(v, {B, S});
}

OpFn rope_fn(double theta) {
  return
      [theta](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::rope(in[0], in[1], theta)}; };
}

}  // namespace

TEST(Rope, GradientMatchesFiniteDifferences) {
  auto pos = Tensor::from_vector(std::vector<int64_t>{0, 5, 2, 7, 7, 1}, {2, 3});
  expect_gradcheck(rope_fn(10000.0), {random_tensor({2, 3, 2, 6}, DType::F64, 1), pos});
  expect_gradcheck(rope_fn(1e6), {random_tensor({1, 4, 3, 8}, DType::F64, 2), arange(4, 3)});
}

// Independent evaluation in double: rotate each (x[j], x[j + D/2]) pair by p * theta^(-2j/D).
TEST(Rope, F32MatchesRotationInDouble) {
  const int64_t B = 2, S = 5, H = 3, D = 10;
  const double theta = 10000.0;
  auto x = random_tensor({B, S, H, D}, DType::F32, 3);
  auto pos = random_positions(B, S, 20, 4);
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("rope", variant);
    auto y = ops::rope(x, pos, theta).to_vector();
    auto xv = x.to_vector(), pv = pos.to_vector();
    for (int64_t bs = 0; bs < B * S; ++bs)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < D / 2; ++j) {
          double a = pv[size_t(bs)] * std::pow(theta, -2.0 * double(j) / double(D));
          size_t i = size_t((bs * H + h) * D + j), k = i + size_t(D / 2);
          EXPECT_NEAR(y[i], xv[i] * std::cos(a) - xv[k] * std::sin(a), 2e-5) << variant << " " << i;
          EXPECT_NEAR(y[k], xv[k] * std::cos(a) + xv[i] * std::sin(a), 2e-5) << variant << " " << k;
        }
  }
}

// The table and reference compute the same f32 cos/sin and the kernels do the same roundings in the
// same order (no FMA), so every variant is bit-identical to the reference, forward and backward.
TEST(Rope, VariantsMatchReferenceExactly) {
  for (auto [B, S, H, D] : {std::tuple{1, 1, 1, 2}, {2, 7, 3, 10}, {3, 33, 5, 128}}) {
    auto x = random_tensor({B, S, H, D}, DType::F32, 5, -3, 3).set_requires_grad(true);
    auto xb = x.to(DType::BF16).set_requires_grad(true);
    const kernels::Dims dims = {B, S, H, D};  // the spec's tolerance is 0: bit-identical
    std::vector<Tensor> contiguous_positions = {arange(S), ranges(B, S, {0, 17, 40000})};
    for (const Tensor& pos : contiguous_positions)
      for (const char* variant : {"default", "gather_free"})
        for (const Tensor& xi : {x, xb}) {
          expect_variant_matches_spec("rope", variant, dims, rope_fn(1e6), {xi, pos});
          expect_variant_matches_spec("rope", variant, dims, rope_fn(1e4), {xi, pos});
        }
    auto pos = random_positions(B, S, 41000, 6);
    expect_variant_matches_spec("rope", "default", dims, rope_fn(1e6), {x, pos});
    expect_variant_matches_spec("rope", "default", dims, rope_fn(1e6), {xb, pos});
  }
}

TEST(Rope, GatherFreeRejectsNonContiguousPositions) {
  kernels::ForceVariant force("rope", "gather_free");
  auto x = Tensor::zeros({2, 4, 1, 8}, DType::F32);
  auto pos = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 5, 6, 8, 9}, {2, 4});
  auto m = error_of([&] { ops::rope(x, pos, 1e6); });
  EXPECT_NE(m.find("gather_free"), std::string::npos) << m;
  EXPECT_NE(m.find("positions[1, 2] = 8"), std::string::npos) << m;
  EXPECT_NO_THROW(ops::rope(x, ranges(2, 4, {3, 9}), 1e6));
}

TEST(Rope, TableIsSharedAndGrowsKeepingRows) {
  auto a = ops::rope_table(123.0, 16, 10);
  EXPECT_EQ(ops::rope_table(123.0, 16, 5).get(), a.get());
  auto b = ops::rope_table(123.0, 16, a->positions + 1);
  ASSERT_GT(b->positions, a->positions);
  for (size_t i = 0; i < a->cos.size(); ++i) {
    ASSERT_EQ(a->cos[i], b->cos[i]) << i;
    ASSERT_EQ(a->sin[i], b->sin[i]) << i;
  }
  EXPECT_NE(ops::rope_table(123.0, 32, 1).get(), b.get());
  EXPECT_THROW(ops::rope_table(123.0, 15, 1), Error);
}

TEST(Rope, BadArgumentsNameOpAndShapes) {
  auto m = error_of([] { ops::rope(Tensor::zeros({2, 3, 8}, DType::F32), arange(3), 1e6); });
  EXPECT_NE(m.find("rope"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[2, 3, 8]"), std::string::npos) << m;
  m = error_of([] { ops::rope(Tensor::zeros({2, 3, 1, 7}, DType::F32), arange(3), 1e6); });
  EXPECT_NE(m.find("even"), std::string::npos) << m;
  m = error_of([] { ops::rope(Tensor::zeros({2, 3, 1, 8}, DType::F32), arange(4), 1e6); });
  EXPECT_NE(m.find("i64[4]"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[2, 3, 1, 8]"), std::string::npos) << m;
  m = error_of([] {
    ops::rope(Tensor::zeros({1, 2, 1, 8}, DType::F32), Tensor::from_vector(std::vector<int64_t>{0, -4}, {2}),
              1e6);
  });
  EXPECT_NE(m.find("-4"), std::string::npos) << m;
  EXPECT_THROW(ops::rope(Tensor::zeros({1, 2, 1, 8}, DType::F32), Tensor::zeros({2}, DType::F32), 1e6),
               Error);
}

// Positions checked once (ops::rope_positions) serve every call of the same shape with the same
// result as positions checked per call; made for another shape they are an error naming both.
TEST(Rope, CheckedPositionsServeEveryCallOfTheirShape) {
  Tensor x = random_tensor({2, 5, 3, 8}, DType::F32, 7);
  Tensor pos = Tensor::from_vector(std::vector<int64_t>{4, 0, 9, 2, 2}, {5});
  const ops::RopePositions checked = ops::rope_positions(pos, 2, 5);
  EXPECT_EQ(checked.max(), 9);
  EXPECT_EQ(ops::rope(x, checked, 1e6).to_vector(), ops::rope(x, pos, 1e6).to_vector());
  auto m = error_of([&] { ops::rope(Tensor::zeros({2, 4, 3, 8}, DType::F32), checked, 1e6); });
  EXPECT_NE(m.find("i64[2, 5]"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[2, 4, 3, 8]"), std::string::npos) << m;
  m = error_of([] { ops::rope_positions(Tensor::from_vector(std::vector<int64_t>{1, -2}, {2}), 1, 2); });
  EXPECT_NE(m.find("-2"), std::string::npos) << m;
}

TEST(Rope, SequentialPositionsAreCheckedPositionsZeroToSWithoutAHostRead) {
  Tensor x = random_tensor({3, 6, 2, 8}, DType::F32, 8);
  DeviceServices& cpu = device_services(Device::CPU);
  const int64_t before = cpu.host_reads();
  const ops::RopePositions seq = ops::sequential_positions(3, 6, Device::CPU);
  EXPECT_EQ(cpu.host_reads(), before) << "positions made on the host need no read";
  const ops::RopePositions checked = ops::rope_positions(arange(6), 3, 6);
  EXPECT_EQ(seq.max(), 5);
  EXPECT_EQ(seq.tensor().shape(), Shape({3, 6}));
  EXPECT_EQ(seq.tensor().to_vector(), checked.tensor().to_vector());
  EXPECT_EQ(ops::rope(x, seq, 1e4).to_vector(), ops::rope(x, checked, 1e4).to_vector());
  const ops::RopePositions meta = ops::sequential_positions(2, 1 << 20, Device::Meta);
  EXPECT_EQ(meta.tensor().shape(), Shape({2, 1 << 20}));
  EXPECT_EQ(meta.max(), (1 << 20) - 1);

  // A generation step's new tokens: positions 4 .. 9 in every row, as the checked positions say.
  const ops::RopePositions later = ops::sequential_positions(3, 6, Device::CPU, 4);
  Tensor from_four = Tensor::empty({6}, DType::I64);
  for (int64_t i = 0; i < 6; ++i) from_four.data<int64_t>()[i] = 4 + i;
  EXPECT_EQ(later.max(), 9);
  EXPECT_EQ(later.tensor().to_vector(), ops::rope_positions(from_four, 3, 6).tensor().to_vector());
  EXPECT_EQ(ops::rope(x, later, 1e4).to_vector(), ops::rope(x, from_four, 1e4).to_vector());

  // Left-padded rows (batched generation) count from their first token after the padding, as
  // transformers numbers them; the padding's positions are 0. Rows padded by 0, 2 and 6, from 1.
  const std::vector<int64_t> padding = {0, 2, 6};
  const ops::RopePositions padded = ops::sequential_positions(3, 4, Device::CPU, 1, padding);
  EXPECT_EQ(padded.tensor().to_vector(), (std::vector<double>{1, 2, 3, 4, 0, 0, 1, 2, 0, 0, 0, 0}));
  EXPECT_EQ(padded.max(), 4);
  EXPECT_NE(error_of([&] {
              ops::sequential_positions(2, 4, Device::CPU, 0, padding);
            }).find("3 left-padding counts for 2 rows"),
            std::string::npos);
}

// Cross-check with PyTorch running transformers' Qwen3RotaryEmbedding + apply_rotary_pos_emb.
// Tolerances: bf16 within 1 bf16 ulp with at most 1% of elements off (measured: 0 differ); f32 within
// 1e-5 absolute. Our inv_freq is the correctly rounded f32 powf (glibc); torch's vectorised pow (Sleef,
// 1-ulp) differs in 1 of 64 entries for theta 1e6, D 128, which moves the angle at position 4e4 by
// ~2e-6 rad (measured max |diff| 2.9e-6 there, 2.4e-7 at small positions).
TEST(Rope, MatchesTorch) {
  if (auto why = torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  struct Spec {
    Shape shape;
    Tensor pos;
    double theta;
  };
  std::vector<Spec> specs = {{{2, 13, 3, 128}, arange(13), 1e6},
                             {{2, 9, 2, 64}, random_positions(2, 9, 300, 7), 1e4},
                             {{1, 17, 2, 128}, arange(17, 40000), 1e6}};
  std::vector<TorchCase> cases;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Spec& s : specs) {
      TorchCase c{"case" + std::to_string(cases.size()), "rope", dt, {}, {{"theta", s.theta}}};
      c.inputs = {{"x", random_tensor(s.shape, dt, 20 + cases.size(), -2, 2)}, {"positions", s.pos}};
      cases.push_back(c);
    }
  auto want = run_torch("rope", cases);
  ASSERT_EQ(want.size(), cases.size());
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("rope", variant);
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      auto got = ops::rope(c.inputs[0].second, c.inputs[1].second, c.params["theta"].get<double>());
      auto st = compare_ulps(got, want[i], c.dtype);
      std::string what = std::string(variant) + " " + std::string(dtype_name(c.dtype)) + " " +
                         c.inputs[0].second.str() + " theta " + c.params["theta"].dump();
      std::printf("rope %s: max %lld ulp, %lld of %lld elements differ from torch, max abs diff %g\n",
                  what.c_str(), (long long)st.max_ulp, (long long)st.mismatches, (long long)st.n,
                  max_abs_diff(got.to(DType::F32), want[i]));
      if (c.dtype == DType::BF16) {
        EXPECT_LE(st.max_ulp, 1) << what;
        EXPECT_LE(st.mismatches * 100, st.n) << what << ": " << st.mismatches << " of " << st.n << " differ";
      } else {
        EXPECT_LE(max_abs_diff(got, want[i]), 1e-5) << what;
      }
    }
  }
}
