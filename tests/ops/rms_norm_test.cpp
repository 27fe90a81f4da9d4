#include "titan/ops/rms_norm/rms_norm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

#include "ops/op_test_util.h"
#include "ops/torch_ref/torch_ref.h"
#include "titan/autograd/autograd.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"

using namespace titan;
using namespace titan::testing;

namespace {

constexpr double kEps = 1e-6;

std::vector<Tensor> rms_norm_fn(const std::vector<Tensor>& in) {
  return {ops::rms_norm(in[0], in[1], kEps)};
}

Tensor weight(int64_t D, DType dt, uint64_t seed) {
  return random_tensor({D}, dt, seed, 0.5, 1.5);
}

// Shapes: tiny, odd, threaded (R*D above the threading threshold), and the per-head q_norm layout.
const std::vector<Shape> kShapes = {{1, 1}, {3, 7}, {37, 129}, {65, 1031}, {2, 5, 3, 128}};

}  // namespace

TEST(RmsNorm, GradientMatchesFiniteDifferences) {
  expect_gradcheck(rms_norm_fn, {random_tensor({2, 3, 7}, DType::F64, 1), weight(7, DType::F64, 2)});
}

// Independent double-precision evaluation of the formula on f32 inputs.
TEST(RmsNorm, F32MatchesFormulaInDouble) {
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("rms_norm", variant);
    auto x = random_tensor({5, 33}, DType::F32, 3, -3, 3);
    auto w = weight(33, DType::F32, 4);
    auto y = ops::rms_norm(x, w, kEps).to_vector();
    auto xv = x.to_vector(), wv = w.to_vector();
    for (int r = 0; r < 5; ++r) {
      double ss = 0;
      for (int d = 0; d < 33; ++d) ss += xv[r * 33 + d] * xv[r * 33 + d];
      double rs = 1 / std::sqrt(ss / 33 + kEps);
      for (int d = 0; d < 33; ++d) {
        double want = wv[d] * xv[r * 33 + d] * rs;
        EXPECT_NEAR(y[r * 33 + d], want, 1e-6 * std::fabs(want) + 1e-7) << variant << " " << r << "," << d;
      }
    }
  }
}

// bf16 rounds the normalised row before the weight multiply (transformers' order): with w = 3 the
// output is bf16(3 * bf16(y)), which differs from bf16(3 * y) for many elements.
TEST(RmsNorm, Bf16CastsBeforeWeightMultiply) {
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("rms_norm", variant);
    auto x = random_tensor({4, 64}, DType::BF16, 5);
    auto w = Tensor::full({64}, 3.0, DType::BF16);
    auto y = ops::rms_norm(x, w, kEps).to_vector();
    auto xv = x.to_vector();
    int differs_from_single_rounding = 0;
    for (int r = 0; r < 4; ++r) {
      float ss = 0;
      for (int d = 0; d < 64; ++d) ss += float(xv[r * 64 + d]) * float(xv[r * 64 + d]);
      float rs = 1.0f / std::sqrt(ss / 64 + float(kEps));
      for (int d = 0; d < 64; ++d) {
        float yn = float(xv[r * 64 + d]) * rs;
        float want = bf16_to_f32(f32_to_bf16(3.0f * bf16_to_f32(f32_to_bf16(yn))));
        EXPECT_LE(ulp_distance(float(y[r * 64 + d]), want, DType::BF16), 1)
            << variant << " " << r << "," << d;
        differs_from_single_rounding += want != bf16_to_f32(f32_to_bf16(3.0f * yn));
      }
    }
    EXPECT_GT(differs_from_single_rounding, 10);  // the test can tell the two orders apart
  }
}

TEST(RmsNorm, DefaultVariantMatchesReference) {
  for (const Shape& s : kShapes) {
    const int64_t D = s.back();
    auto x = random_tensor(s, DType::F32, 6, -2, 2).set_requires_grad(true);
    auto w = weight(D, DType::F32, 7).set_requires_grad(true);
    // f32: the sums are reassociated (SIMD lanes, dw partials over row chunks): a few f32 ulps.
    const int64_t R = x.numel() / D;
    expect_variant_matches_spec("rms_norm", "default", {R, D}, rms_norm_fn, {x, w});
    // bf16: outputs may differ by 1 bf16 ulp (2^-8 relative) where rstd's last bit flips a rounding;
    // the gradients are f32 but dw sums dy * bf16(y), so such a flip moves dw by |dy| * ulp(y).
    expect_variant_matches_spec("rms_norm", "default", {R, D}, rms_norm_fn,
                                {x.to(DType::BF16).set_requires_grad(true), w.to(DType::BF16).set_requires_grad(true)});
  }
}

// The default's results, forward and backward, f32 and bf16, are the same bits on one thread as on
// several: dw adds the rows' partial sums in chunks fixed by the shape, not one partial per thread
// (1024 rows of 256: 16 chunks of 64 rows).
TEST(RmsNorm, ResultsDoNotDependOnTheThreadCount) {
  const int64_t R = 1024, D = 256;
  const Tensor x = random_tensor({R, D}, DType::F32, 20, -2, 2), w = weight(D, DType::F32, 21),
               dy = random_tensor({R, D}, DType::F32, 22);
  const int threads = omp_get_max_threads();
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto run = [&](int team) {
      omp_set_num_threads(team);
      Tensor xt = x.to(dt).set_requires_grad(true), wt = w.to(dt).set_requires_grad(true);
      const Tensor y = ops::rms_norm(xt, wt, kEps);
      autograd::backward(autograd::current_tape(), {y}, {dy});
      return std::vector<Tensor>{y, xt.grad(), wt.grad()};
    };
    const std::vector<Tensor> one = run(1), three = run(3);
    omp_set_num_threads(threads);
    const char* names[] = {"y", "dx", "dw"};
    for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(max_abs_diff(one[i], three[i]), 0.0) << names[i];
  }
}

TEST(RmsNorm, BadArgumentsNameOpAndShapes) {
  try {
    ops::rms_norm(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({7}, DType::F32), kEps);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("rms_norm"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[4, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find("f32[7]"), std::string::npos) << m;
  }
  EXPECT_THROW(ops::rms_norm(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({8}, DType::BF16), kEps),
               Error);
  EXPECT_THROW(ops::rms_norm(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({8, 1}, DType::F32), kEps),
               Error);
  EXPECT_THROW(ops::rms_norm(Tensor::zeros({4, 8}, DType::F32), Tensor::zeros({8}, DType::F32), -1.0), Error);
}

// Cross-check with PyTorch running transformers' Qwen3RMSNorm. Tolerances: bf16 outputs within 1 bf16
// ulp and at most 1% of elements off by that ulp (torch sums squares in another order, so rstd can
// differ in its last f32 bit; measured: 0 differ); f32 outputs within 8 f32 ulps (measured max 6).
TEST(RmsNorm, MatchesTorch) {
  if (auto why = torch_unavailable(); !why.empty()) GTEST_SKIP() << why;
  std::vector<TorchCase> cases;
  for (DType dt : {DType::F32, DType::BF16})
    for (const Shape& s : {Shape{3, 17, 256}, Shape{2, 9, 4, 128}, Shape{5, 1031}}) {
      TorchCase c{"case" + std::to_string(cases.size()), "rms_norm", dt, {}, {{"eps", kEps}}};
      c.inputs = {{"x", random_tensor(s, dt, 10 + cases.size(), -2, 2)}, {"w", weight(s.back(), dt, 11)}};
      cases.push_back(c);
    }
  auto want = run_torch("rms_norm", cases);
  ASSERT_EQ(want.size(), cases.size());
  for (const char* variant : {"reference", "default"}) {
    kernels::ForceVariant force("rms_norm", variant);
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      auto got = ops::rms_norm(c.inputs[0].second, c.inputs[1].second, kEps);
      auto st = compare_ulps(got, want[i], c.dtype);
      std::string what =
          std::string(variant) + " " + std::string(dtype_name(c.dtype)) + " " + c.inputs[0].second.str();
      if (c.dtype == DType::BF16) {
        EXPECT_LE(st.max_ulp, 1) << what;
        EXPECT_LE(st.mismatches * 100, st.n) << what << ": " << st.mismatches << " of " << st.n << " differ";
      } else {
        EXPECT_LE(st.max_ulp, 8) << what;
      }
      std::printf("rms_norm %s: max %lld ulp, %lld of %lld elements differ from torch\n", what.c_str(),
                  (long long)st.max_ulp, (long long)st.mismatches, (long long)st.n);
    }
  }
}
