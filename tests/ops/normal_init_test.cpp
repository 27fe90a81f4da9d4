// ops::normal_init, the random init's draw (ops/init): its logarithm against a more precise one, its
// values against an independently written generator, its slices against the whole stream, the default variant
// against the reference on every tier, its distribution, and its argument errors. The CUDA kernel's bits are
// checked against these by `titan kernels parity --device cuda` (tolerance 0) and
// CudaModelOps.InitializeDrawsTheCpuBits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/init/cpu.h"
#include "titan/ops/init/init.h"
#include "titan/ops/init/normal_draw.h"

namespace titan {
namespace {

using ops::init_draw::log_exact_arith;
using ::testing::HasSubstr;

// |log_exact_arith(x) - ln x| in units of the result's last place, ln x from the x87's 64-bit
// mantissa (11 more bits than the double).
double ulp_error(double x) {
  const double got = log_exact_arith(x);
  const long double exact = std::log(static_cast<long double>(x));
  const double ulp = std::nextafter(std::fabs(got), INFINITY) - std::fabs(got);
  return double(std::fabs(static_cast<long double>(got) - exact)) / ulp;
}

// The polar method takes the log of s = x^2 + y^2 in (0, 1) with x, y multiples of 2^-53: values
// across the unit interval, near 1 (where ln s is tiny), across binades down to 2^-106, the
// subnormal range and the two sides of the reduction's sqrt(2) boundary.
TEST(NormalInit, LogarithmIsWithinOneUlp) {
  if (LDBL_MANT_DIG < 64) GTEST_SKIP() << "long double has no more precision than double here";
  std::mt19937_64 rng(3);
  double worst = 0;
  auto check = [&](double x) {
    const double e = ulp_error(x);
    ASSERT_LT(e, 1.0) << "ln(" << x << ")";
    worst = std::max(worst, e);
  };
  for (int i = 0; i < 400000; ++i) {
    const double u = std::ldexp(double(rng() >> 11), -53);
    if (u > 0) check(u);
    check(std::ldexp(double((rng() >> 11) | 1), -53 - int(rng() % 54)));
    check(1.0 - std::ldexp(double(rng() >> 11), -53 - int(rng() % 40)));
  }
  for (double x : {0x1p-1074, 0x1.8p-1070, 0x1p-1022, 0x1p-106, 0.5, 1.0, 2.0, 0x1.6a09e667f3bccp-1,
                   0x1.6a09e667f3bcdp-1, 0x1.6a09e667f3bccp+0, 0x1.6a09e667f3bcdp+0})
    check(x);
  EXPECT_EQ(log_exact_arith(1.0), 0.0);
  std::printf("log_exact_arith: worst error %.3f ulp over 1.2M arguments\n", worst);
}

std::vector<float> draw(int64_t n, uint64_t stream, double std, double bound, int64_t begin) {
  Tensor out = Tensor::zeros({n}, DType::F32);
  ops::normal_init(out, stream, std, bound, begin);
  const float* p = out.data<float>();
  return std::vector<float>(p, p + n);
}

// The generator as docs/model.md states it, written here on its own with the C library's log:
// splitmix64 of a Weyl sequence over counters (pair << 8 | attempt) * 2 and + 1, 53-bit signed
// uniforms, Marsaglia's polar method, element j = component j % 2 of pair j / 2, a value outside the
// bound redrawn from its pair's later usable attempts.
float independent_draw(uint64_t stream, double std, double bound, int64_t j) {
  auto bits = [&](uint64_t counter) {
    uint64_t z = stream + counter * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto unit = [](uint64_t b) { return double(int64_t(b) >> 10) / 9007199254740992.0; };
  const uint64_t pair = uint64_t(j) / 2;
  for (uint64_t attempt = 0; attempt < 256; ++attempt) {
    const double x = unit(bits((pair << 8 | attempt) * 2)), y = unit(bits((pair << 8 | attempt) * 2 + 1));
    const double s = x * x + y * y;
    if (!(s > 0 && s < 1)) continue;
    const double z = (j % 2 ? y : x) * std::sqrt(-2 * std::log(s) / s);
    const float v = float(z * std);
    if (bound <= 0 || std::fabs(double(v)) <= bound) return v;
  }
  return 0.0f;
}

// The draw is that generator: its logarithm differs from the C library's in the last bit of a few
// per cent of arguments, which the f32 values do not show (none of 160M values moved in the review
// that compared them).
TEST(NormalInit, MatchesAnIndependentlyWrittenGenerator) {
  for (double bound : {0.0, 0.04}) {
    const int64_t n = 200001, begin = 3;
    const std::vector<float> got = draw(n, 77, 0.02, bound, begin);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += got[size_t(i)] != independent_draw(77, 0.02, bound, begin + i);
    EXPECT_EQ(differ, 0) << "of " << n << " values, bound " << bound;
  }
}

// Any slice, from any element (mid-pair or not) and on any number of threads, is the same bits as
// that part of one whole draw: a sharded rank and a resumed init draw what a whole model would.
TEST(NormalInit, SlicesAndThreadCountsGiveTheWholeDrawsBits) {
  const int64_t n = 300001;  // several 64 Ki-element chunks, an odd length
  for (double bound : {0.0, 0.04}) {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(std::max(threads, 3));  // several chunks in flight even on a one-core machine
    const std::vector<float> whole = draw(n, 99, 0.02, bound, 0);
    omp_set_num_threads(threads);
    for (auto [begin, len] : {std::pair<int64_t, int64_t>{0, 1},
                              {1, 1},
                              {1, 2},
                              {65535, 3},
                              {65536, 70001},
                              {131073, n - 131073}}) {
      const std::vector<float> part = draw(len, 99, 0.02, bound, begin);
      EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + begin, size_t(len) * 4))
          << "slice [" << begin << ", " << begin + len << ") bound " << bound;
    }
    omp_set_num_threads(1);
    const std::vector<float> serial = draw(n, 99, 0.02, bound, 0);
    omp_set_num_threads(threads);
    EXPECT_EQ(serial, whole) << "one thread and " << std::max(threads, 3) << " threads differ, bound "
                             << bound;
  }
  EXPECT_NE(draw(1000, 99, 0.02, 0, 0), draw(1000, 100, 0.02, 0, 0)) << "another stream, other values";
}

// The default variant (AVX-512 lanes where the CPU has them) writes the reference's bits on every
// tier this CPU runs: slices from odd and even elements, lengths that leave partial vectors, and
// bounds that send many pairs back to the scalar redraw (at 1 std a third of the values).
TEST(NormalInit, DefaultVariantIsTheReferenceBitForBitOnEveryTier) {
  struct Case {
    int64_t n, begin;
    double std, bound;
  };
  const Case cases[] = {{1, 0, 0.02, 0},         {1, 7, 0.02, 0},          {17, 1, 0.02, 0},
                        {33, 0, 1.0, 1.0},       {100003, 12345, 0.02, 0}, {100003, 3, 0.5, 0.5},
                        {70001, 65535, 2.0, 6.0}};
  for (cpu::KernelIsa tier : testing::cpu_kernel_tiers()) {
    testing::KernelIsaCap cap(tier);
    for (const Case& c : cases) {
      std::vector<float> want, got;
      {
        kernels::ForceVariant force("normal_init", "reference");
        want = draw(c.n, 1234, c.std, c.bound, c.begin);
      }
      {
        kernels::ForceVariant force("normal_init", "default");
        got = draw(c.n, 1234, c.std, c.bound, c.begin);
      }
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), size_t(c.n) * 4))
          << cpu::kernel_isa_name(tier) << ": n " << c.n << " from " << c.begin << ", std " << c.std
          << ", bound " << c.bound;
    }
  }
}

// Below the f32 rounding: the vectorised normals equal init_draw::normal_pair's doubles bit for bit
// (a reordered or fused operation changes the last bits of some, which f32 would mostly hide).
TEST(NormalInit, VectorisedNormalsAreTheReferenceDoubles) {
  const int64_t count = 1 << 20;
  std::vector<double> lanes(size_t(2 * count));
  for (uint64_t stream : {uint64_t(1), uint64_t(0x9e3779b97f4a7c15ull)}) {
    if (!ops::normal_pairs_vectorised(stream, 1000, count, lanes.data()))
      GTEST_SKIP() << "this CPU has no vectorised draw (kernel tier "
                   << cpu::kernel_isa_name(cpu::kernel_isa())
                   << "); the default variant runs the reference loop";
    int64_t differ = 0;
    for (int64_t i = 0; i < count; ++i) {
      uint64_t attempt = 0;
      double z[2];
      ops::init_draw::normal_pair(stream, uint64_t(1000 + i), attempt, z);
      differ += std::memcmp(z, &lanes[size_t(2 * i)], sizeof z) != 0;
    }
    EXPECT_EQ(differ, 0) << "of " << count << " pairs of stream " << stream;
  }
}

// N(0, std^2), and the truncated normal's moments when bounded: at +-2 std the variance is
// 1 - 2 * 2 phi(2) / (2 Phi(2) - 1) = 0.7737 of std^2, and no value lies outside the bound.
TEST(NormalInit, DrawsTheNormalAndTruncatedNormalDistributions) {
  const int64_t n = 1 << 20;
  auto moments = [&](const std::vector<float>& v, double* mean, double* var) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    *mean = s / double(n), *var = s2 / double(n) - *mean * *mean;
  };
  double mean, var;
  moments(draw(n, 5, 0.5, 0, 0), &mean, &var);
  // Standard errors: mean 0.5 / 1024, variance 0.25 * sqrt(2 / n) = 3.5e-4; 5 of each.
  EXPECT_NEAR(mean, 0.0, 5 * 0.5 / 1024);
  EXPECT_NEAR(var, 0.25, 5 * 3.5e-4);
  const std::vector<float> truncated = draw(n, 5, 0.5, 1.0, 0);
  for (float x : truncated) ASSERT_LE(std::fabs(x), 1.0f);
  moments(truncated, &mean, &var);
  EXPECT_NEAR(mean, 0.0, 5 * 0.5 / 1024);
  EXPECT_NEAR(var, 0.25 * 0.7737, 5 * 3.5e-4);
  // Values inside the bound keep their plain draw: only the ones outside were redrawn.
  const std::vector<float> plain = draw(n, 5, 0.5, 0, 0);
  int64_t kept = 0, inside = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(plain[size_t(i)]) <= 1.0f) ++inside, kept += plain[size_t(i)] == truncated[size_t(i)];
  EXPECT_EQ(kept, inside);
}

TEST(NormalInit, BadArgumentsNameTheRule) {
  Tensor f32 = Tensor::zeros({4}, DType::F32), bf16 = Tensor::zeros({4}, DType::BF16);
  EXPECT_THAT(testing::error_of([&] { ops::normal_init(bf16, 1, 0.02, 0, 0); }),
              HasSubstr("must be a contiguous f32"));
  EXPECT_THAT(testing::error_of([&] { ops::normal_init(f32, 1, -1, 0, 0); }),
              HasSubstr("std -1 must be finite and >= 0"));
  EXPECT_THAT(testing::error_of([&] { ops::normal_init(f32, 1, 0.02, 0.01, 0); }),
              HasSubstr("bound 0.01 must be 0 (no truncation) or at least std (0.02)"));
  EXPECT_THAT(testing::error_of([&] { ops::normal_init(f32, 1, 0.02, 0, -2); }),
              HasSubstr("begin -2 must be >= 0"));
}

}  // namespace
}  // namespace titan
