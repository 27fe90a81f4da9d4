// The CPU kernels' exp (backend/cpu/lanes.h) in each of its forms, against glibc's expf, and the
// kernel-ISA tiers (backend/cpu/cpu_info.h) the intrinsic kernels choose from.
#include "titan/backend/cpu/lanes.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "titan/backend/cpu/cpu_info.h"

using namespace titan;
using namespace titan::cpu;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// exp over xs in one form of the kernels' exp.
using ExpForm = std::vector<float> (*)(const std::vector<float>& xs);

std::vector<float> exp_scalar(const std::vector<float>& xs) {
  std::vector<float> out;
  for (float x : xs) out.push_back(lanes::exp_poly(x));
  return out;
}

// One value per call, in lane i % 8 (the other lanes 0), so every lane position is exercised.
__attribute__((target("avx2,fma"))) std::vector<float> exp_avx2(const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    alignas(32) float in[8] = {}, res[8];
    in[i % 8] = xs[i];
    _mm256_store_ps(res, lanes::exp8(_mm256_load_ps(in)));
    out[i] = res[i % 8];
  }
  return out;
}

// GCC 12's AVX-512 headers seed results with _mm512_undefined_ps(), which trips -Wuninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) std::vector<float> exp_avx512(const std::vector<float>& xs) {
  std::vector<float> out(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    alignas(64) float in[16] = {}, res[16];
    in[i % 16] = xs[i];
    _mm512_store_ps(res, lanes::exp16(_mm512_load_ps(in)));
    out[i] = res[i % 16];
  }
  return out;
}
#pragma GCC diagnostic pop

// Units in the last place between a and b (both finite, same sign).
double ulps(float a, float b) {
  return std::abs(double(a) - double(b)) / double(std::nextafter(std::abs(b), kInf) - std::abs(b));
}

// The form of exp each tier's kernels use: exp_poly (plain loops the compiler vectorises), exp8
// (AVX2), exp16 (AVX-512).
ExpForm exp_of(KernelIsa tier) {
  return tier == KernelIsa::kPortable ? exp_scalar : tier == KernelIsa::kAvx2 ? exp_avx2 : exp_avx512;
}

class KernelExp : public ::testing::TestWithParam<KernelIsa> {
 protected:
  void SetUp() override {
    if (cpu_kernel_isa() < GetParam())
      GTEST_SKIP() << "needs " << kernel_isa_name(GetParam()) << "; this CPU runs " << kernel_isa_name(cpu_kernel_isa());
  }
  std::vector<float> exp(const std::vector<float>& xs) const { return exp_of(GetParam())(xs); }
};

// Within 2 ulp of glibc's expf wherever the result is a normal float and x is in the clamp range
// [-87.3, 88]: the range softmax and SiLU use.
TEST_P(KernelExp, WithinTwoUlpOfExpf) {
  std::vector<float> xs;
  for (float x = -87.3f; x <= 88.f; x += 0.0173f) xs.push_back(x);
  for (float x : {0.f, -0.f, 1e-8f, -1e-8f, 0.5f, -0.5f, 1.f, -1.f, 0.6931472f}) xs.push_back(x);
  const std::vector<float> got = exp(xs);
  double worst = 0;
  float worst_x = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double u = ulps(got[i], std::exp(xs[i]));
    if (u > worst) worst = u, worst_x = xs[i];
  }
  EXPECT_LE(worst, 2.0) << "worst at x = " << worst_x;
  EXPECT_EQ(exp({0.f})[0], 1.f);
}

// What the kernels rely on at the edges: tiny results do not go negative or NaN, large ones stay
// finite; in the vector forms (softmax, loss) e^-inf = 0 exactly (masked scores) and NaN stays NaN
// (a NaN loss must show). The scalar form (SiLU) clamps -inf to a tiny value.
TEST_P(KernelExp, EdgesAreZeroFiniteOrNaN) {
  const bool vector = GetParam() != KernelIsa::kPortable;
  const std::vector<float> got = exp({-kInf, -1000.f, -104.f, -88.f, 88.f, 1000.f,
                                                 std::numeric_limits<float>::quiet_NaN()});
  for (int i = 0; i <= 3; ++i) {
    EXPECT_GE(got[size_t(i)], 0.f) << i;
    EXPECT_LT(got[size_t(i)], 1e-37f) << i;
  }
  EXPECT_TRUE(std::isfinite(got[4]) && got[4] > 1e38f) << got[4];
  EXPECT_TRUE(std::isfinite(got[5])) << "exp(1000) is clamped, not inf: " << got[5];
  if (vector) {
    EXPECT_EQ(got[0], 0.f) << "exp(-inf)";
    EXPECT_TRUE(std::isnan(got[6])) << got[6];
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KernelExp,
                         ::testing::Values(KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512),
                         [](const auto& info) { return std::string(kernel_isa_name(info.param)); });

TEST(KernelIsa, TierFollowsTheCpuAndTheCap) {
  const CpuInfo& c = cpu_info();
  const KernelIsa best = cpu_kernel_isa();
  EXPECT_EQ(best >= KernelIsa::kAvx2, c.avx2 && c.fma);
  EXPECT_EQ(best >= KernelIsa::kAvx512, c.avx512_core());
  EXPECT_EQ(best >= KernelIsa::kAvx512Bf16, c.avx512_core() && c.avx512_bf16);
  EXPECT_EQ(best == KernelIsa::kAmx, c.avx512_core() && c.avx512_bf16 && c.amx_usable && c.amx_bf16);
  EXPECT_EQ(kernel_isa(), best);
  for (KernelIsa cap : {KernelIsa::kPortable, KernelIsa::kAvx2, KernelIsa::kAvx512, KernelIsa::kAvx512Bf16}) {
    limit_kernel_isa(cap);
    EXPECT_EQ(kernel_isa(), std::min(cap, best)) << kernel_isa_name(cap);
  }
  limit_kernel_isa(kHighestKernelIsa);
  EXPECT_EQ(kernel_isa(), best);
  EXPECT_STREQ(kernel_isa_name(KernelIsa::kAvx2), "avx2");
}

}  // namespace
