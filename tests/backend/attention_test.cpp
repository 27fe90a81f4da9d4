// Causal GQA attention kernels: flash (f32, bf16; AVX-512, AVX2 and portable paths) against the plain
// reference, and the f64 reference gradient against central finite differences.
#include "titan/ops/attention/cpu.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/check.h"

namespace titan::cpu {
namespace {

template <class T>
std::vector<T> randn(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<T> x(n);
  for (auto& e : x) e = T(dist(gen));
  return x;
}

struct Sizes {
  size_t q, kv, lse;
};
Sizes sizes(const AttentionShape& s) {
  return {size_t(s.B * s.S * s.Hq * s.D), size_t(s.B * s.S * s.Hkv * s.D), size_t(s.B * s.Hq * s.S)};
}

// Tensor-wise relative check: every |got - want| <= rtol * |want| + atol * max(1, max|want|).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  // Inputs are O(1): entries that cancel to ~0 (e.g. dq at S = 1) are judged against that magnitude.
  double scale = 1;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]), lim = rtol * std::abs(want[i]) + atol * scale;
    if (!(err <= lim)) ++bad;
    if (!(err - lim <= worst_excess)) {
      worst_excess = err - lim;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements out of tolerance; worst at "
                     << worst << " got " << got[worst] << " want " << want[worst] << " (max|want| " << scale
                     << ")";
}

std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}
std::vector<bf16> narrow(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}

// (ratio r = Hq / Hkv, head_dim, sequence length, instruction-set cap)
using Param = std::tuple<int, int, int, KernelIsa>;

class FlashVsReference : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const KernelIsa tier = std::get<3>(GetParam());
    if (tier > cpu_kernel_isa())
      GTEST_SKIP() << "this CPU has no " << kernel_isa_name(tier) << " (it runs " << kernel_isa_name(cpu_kernel_isa())
                   << ", checked by the instances of that tier)";
    limit_kernel_isa(tier);
  }
  void TearDown() override { limit_kernel_isa(kHighestKernelIsa); }
  AttentionShape shape() const {
    const auto [r, D, S, portable] = GetParam();
    // Four query heads (eight at r = 8): several kv groups at small r, and the reference stays fast.
    const int64_t hq = std::max(4, r);
    return {2, S, hq, hq / r, D, float(1.0 / std::sqrt(double(D)))};
  }
};

// f32 flash vs f32 reference. Only the summation order differs (plus a ~1e-7 exp polynomial), so
// the tolerance is 2e-5 relative per element plus 2e-5 of the tensor's largest magnitude.
TEST_P(FlashVsReference, F32ForwardAndBackward) {
  const AttentionShape s = shape();
  const Sizes n = sizes(s);
  const auto q = randn<float>(n.q, 1), k = randn<float>(n.kv, 2), v = randn<float>(n.kv, 3),
             dout = randn<float>(n.q, 4);
  std::vector<float> out_r(n.q), lse_r(n.lse), out_f(n.q), lse_f(n.lse);
  attention_fwd_reference_f32(s, q.data(), k.data(), v.data(), out_r.data(), lse_r.data());
  attention_fwd_flash_f32(s, q.data(), k.data(), v.data(), out_f.data(), lse_f.data());
  expect_close(out_f, out_r, 2e-5, 2e-5, "out");
  expect_close(lse_f, lse_r, 2e-5, 2e-5, "lse");

  std::vector<float> dq_r(n.q), dk_r(n.kv), dv_r(n.kv), dq_f(n.q, NAN), dk_f(n.kv, NAN), dv_f(n.kv, NAN);
  attention_bwd_reference_f32(s, q.data(), k.data(), v.data(), out_r.data(), lse_r.data(), dout.data(),
                              dq_r.data(), dk_r.data(), dv_r.data());
  attention_bwd_flash_f32(s, q.data(), k.data(), v.data(), out_r.data(), lse_r.data(), dout.data(),
                          dq_f.data(), dk_f.data(), dv_f.data());
  expect_close(dq_f, dq_r, 2e-5, 2e-5, "dq");
  expect_close(dk_f, dk_r, 2e-5, 2e-5, "dk");
  expect_close(dv_f, dv_r, 2e-5, 2e-5, "dv");
}

// bf16 flash vs the f32 reference on the same (bf16-rounded) inputs. All bf16 math is f32, so the
// error is the final rounding of each output (<= 2^-9 relative) plus f32 noise: tolerance
// 4e-3 * |want| + 1e-4 * max|want|. lse stays f32 and is held to 2e-5.
TEST_P(FlashVsReference, Bf16ForwardAndBackward) {
  const AttentionShape s = shape();
  const Sizes n = sizes(s);
  const auto q = narrow(randn<float>(n.q, 5)), k = narrow(randn<float>(n.kv, 6)),
             v = narrow(randn<float>(n.kv, 7)), dout = narrow(randn<float>(n.q, 8));
  const auto qf = widen(q), kf = widen(k), vf = widen(v), doutf = widen(dout);
  std::vector<bf16> out(n.q);
  std::vector<float> lse(n.lse), out_r(n.q), lse_r(n.lse);
  attention_fwd_flash_bf16(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  attention_fwd_reference_f32(s, qf.data(), kf.data(), vf.data(), out_r.data(), lse_r.data());
  expect_close(widen(out), out_r, 4e-3, 1e-4, "out");
  expect_close(lse, lse_r, 2e-5, 2e-5, "lse");

  // The backward consumes what the bf16 forward saved (bf16 out, its lse); the reference gets the same.
  const auto outf = widen(out);
  std::vector<bf16> dq(n.q), dk(n.kv), dv(n.kv);
  std::vector<float> dq_r(n.q), dk_r(n.kv), dv_r(n.kv);
  attention_bwd_flash_bf16(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                           dk.data(), dv.data());
  attention_bwd_reference_f32(s, qf.data(), kf.data(), vf.data(), outf.data(), lse.data(), doutf.data(),
                              dq_r.data(), dk_r.data(), dv_r.data());
  expect_close(widen(dq), dq_r, 4e-3, 1e-4, "dq");
  expect_close(widen(dk), dk_r, 4e-3, 1e-4, "dk");
  expect_close(widen(dv), dv_r, 4e-3, 1e-4, "dv");
}

// bf16_probs (P and dS rounded to bf16) vs the same f32 reference. Rounding P bounds the forward
// error by 2^-9 * max|v| on top of the output rounding; dV, dK and dQ sum rounded P or dS over up to S
// terms, so gradients are held to 1 % of the tensor's largest magnitude plus 1 % of the element:
// ~2.5x the exact kernel's worst case here, and far below what a dropped tile or a mispaired row gives
// (errors of the order of the values). Where the CPU or the cap lacks AVX512-BF16, or D is odd, the
// variant runs the exact kernels and this holds trivially.
TEST_P(FlashVsReference, Bf16ProbsForwardAndBackward) {
  const AttentionShape s = shape();
  const Sizes n = sizes(s);
  const auto q = narrow(randn<float>(n.q, 15)), k = narrow(randn<float>(n.kv, 16)),
             v = narrow(randn<float>(n.kv, 17)), dout = narrow(randn<float>(n.q, 18));
  const auto qf = widen(q), kf = widen(k), vf = widen(v), doutf = widen(dout);
  std::vector<bf16> out(n.q);
  std::vector<float> lse(n.lse), out_r(n.q), lse_r(n.lse);
  attention_fwd_flash_bf16_probs(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  attention_fwd_reference_f32(s, qf.data(), kf.data(), vf.data(), out_r.data(), lse_r.data());
  expect_close(widen(out), out_r, 4e-3, 4e-3, "out");
  expect_close(lse, lse_r, 2e-5, 2e-5, "lse");

  const auto outf = widen(out);
  std::vector<bf16> dq(n.q), dk(n.kv), dv(n.kv);
  std::vector<float> dq_r(n.q), dk_r(n.kv), dv_r(n.kv);
  attention_bwd_flash_bf16_probs(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                 dk.data(), dv.data());
  attention_bwd_reference_f32(s, qf.data(), kf.data(), vf.data(), outf.data(), lse.data(), doutf.data(),
                              dq_r.data(), dk_r.data(), dv_r.data());
  expect_close(widen(dq), dq_r, 1e-2, 1e-2, "dq");
  expect_close(widen(dk), dk_r, 1e-2, 1e-2, "dk");
  expect_close(widen(dv), dv_r, 1e-2, 1e-2, "dv");
}

// GQA ratios 1/2/4/8 x head_dim 64/128 x lengths around the 64-wide tile on the best path the CPU has
// (AMX tiles on Sapphire Rapids, AVX-512 with the bf16 dot product on Zen4, AVX2 on Zen3); the other
// paths on a smaller sweep (an odd head_dim, 25, makes the bf16 dot kernels step aside, and exercises
// masked vector tails).
INSTANTIATE_TEST_SUITE_P(Best, FlashVsReference,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8), ::testing::Values(64, 128),
                                            ::testing::Values(1, 7, 33, 100, 257),
                                            ::testing::Values(cpu_kernel_isa())));
// The AMX tier's edges (skipped without AMX): head_dim 48 (not a multiple of 32: the vdpbf16ps
// products) and 96 (tiles, but not a multiple of 64), a last kv tile of 32 keys (S 96: AMX on a
// 32-row block) and exactly one tile (S 64).
INSTANTIATE_TEST_SUITE_P(Amx, FlashVsReference,
                         ::testing::Combine(::testing::Values(1, 4), ::testing::Values(48, 96),
                                            ::testing::Values(32, 64, 96),
                                            ::testing::Values(KernelIsa::kAmx)));
INSTANTIATE_TEST_SUITE_P(Avx512Bf16, FlashVsReference,
                         ::testing::Combine(::testing::Values(2, 8), ::testing::Values(25, 128),
                                            ::testing::Values(7, 100),
                                            ::testing::Values(KernelIsa::kAvx512Bf16)));
INSTANTIATE_TEST_SUITE_P(Avx512, FlashVsReference,
                         ::testing::Combine(::testing::Values(2, 8), ::testing::Values(25, 128),
                                            ::testing::Values(7, 100),
                                            ::testing::Values(KernelIsa::kAvx512)));
INSTANTIATE_TEST_SUITE_P(Avx2, FlashVsReference,
                         ::testing::Combine(::testing::Values(2, 8), ::testing::Values(25, 128),
                                            ::testing::Values(7, 100),
                                            ::testing::Values(KernelIsa::kAvx2)));
INSTANTIATE_TEST_SUITE_P(Portable, FlashVsReference,
                         ::testing::Combine(::testing::Values(1, 4), ::testing::Values(25, 64),
                                            ::testing::Values(1, 33, 100),
                                            ::testing::Values(KernelIsa::kPortable)));

// Few (batch, kv head) groups make the backward split each group's kv tiles across tasks and sum
// per-split dq partials; check that path against the reference too.
TEST(AttentionFlash, BackwardWithSplitKvTiles) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (int64_t hkv : {1, 3, 22}) {  // 1, 3 and 22 groups: 4, 4 and 3 splits of the 4 kv tiles
    const AttentionShape s{1, 200, 2 * hkv, hkv, 64, 0.125f};
    const Sizes n = sizes(s);
    const auto q = randn<float>(n.q, 11), k = randn<float>(n.kv, 12), v = randn<float>(n.kv, 13),
               dout = randn<float>(n.q, 14);
    std::vector<float> out(n.q), lse(n.lse);
    attention_fwd_reference_f32(s, q.data(), k.data(), v.data(), out.data(), lse.data());
    std::vector<float> dq_r(n.q), dk_r(n.kv), dv_r(n.kv), dq_f(n.q), dk_f(n.kv), dv_f(n.kv);
    attention_bwd_reference_f32(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(),
                                dq_r.data(), dk_r.data(), dv_r.data());
    attention_bwd_flash_f32(s, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq_f.data(),
                            dk_f.data(), dv_f.data());
    expect_close(dq_f, dq_r, 2e-5, 2e-5, "dq Hkv=" + std::to_string(hkv));
    expect_close(dk_f, dk_r, 2e-5, 2e-5, "dk Hkv=" + std::to_string(hkv));
    expect_close(dv_f, dv_r, 2e-5, 2e-5, "dv Hkv=" + std::to_string(hkv));

    // The bf16 kernels (on this CPU's best tier: AMX tiles where it has them) split the same way.
    const auto q16 = narrow(q), k16 = narrow(k), v16 = narrow(v), dout16 = narrow(dout);
    const auto qw = widen(q16), kw = widen(k16), vw = widen(v16), doutw = widen(dout16);
    std::vector<float> out_w(n.q), lse_w(n.lse);
    attention_fwd_reference_f32(s, qw.data(), kw.data(), vw.data(), out_w.data(), lse_w.data());
    const auto out16 = narrow(out_w);
    const auto outw = widen(out16);
    attention_bwd_reference_f32(s, qw.data(), kw.data(), vw.data(), outw.data(), lse_w.data(), doutw.data(),
                                dq_r.data(), dk_r.data(), dv_r.data());
    for (const bool probs : {false, true}) {
      std::vector<bf16> dq16(n.q), dk16(n.kv), dv16(n.kv);
      (probs ? attention_bwd_flash_bf16_probs : attention_bwd_flash_bf16)(
          s, q16.data(), k16.data(), v16.data(), out16.data(), lse_w.data(), dout16.data(), dq16.data(),
          dk16.data(), dv16.data());
      const double tol = probs ? 1e-2 : 4e-3, atol = probs ? 1e-2 : 1e-4;
      const std::string what = std::string(probs ? "bf16_probs" : "bf16") + " Hkv=" + std::to_string(hkv);
      expect_close(widen(dq16), dq_r, tol, atol, "dq " + what);
      expect_close(widen(dk16), dk_r, tol, atol, "dk " + what);
      expect_close(widen(dv16), dv_r, tol, atol, "dv " + what);
    }
  }
  omp_set_num_threads(saved);
}

// Closed forms the reference must reproduce: with q = 0 every visible key weighs the same, so
// out_i = mean(v_0..v_i) and lse_i = log(i + 1).
TEST(AttentionReference, ZeroQueriesAverageTheVisibleValues) {
  const AttentionShape s{2, 9, 4, 2, 5, 0.3f};
  const Sizes n = sizes(s);
  const std::vector<double> q(n.q, 0.0), k = randn<double>(n.kv, 21), v = randn<double>(n.kv, 22);
  std::vector<double> out(n.q), lse(n.lse);
  attention_fwd_reference_f64(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t i = 0; i < s.S; ++i) {
        EXPECT_NEAR(lse[(b * s.Hq + h) * s.S + i], std::log(double(i + 1)), 1e-12);
        for (int64_t d = 0; d < s.D; ++d) {
          double mean = 0;
          for (int64_t j = 0; j <= i; ++j) mean += v[((b * s.S + j) * s.Hkv + h / 2) * s.D + d];
          EXPECT_NEAR(out[((b * s.S + i) * s.Hq + h) * s.D + d], mean / double(i + 1), 1e-12);
        }
      }
}

// loss = sum(out * w): the reference backward with dout = w must match central differences in f64.
TEST(AttentionReference, GradientMatchesFiniteDifferences) {
  const AttentionShape s{2, 5, 4, 2, 3, 0.8f};
  const Sizes n = sizes(s);
  auto q = randn<double>(n.q, 31), k = randn<double>(n.kv, 32), v = randn<double>(n.kv, 33);
  const auto w = randn<double>(n.q, 34);
  std::vector<double> out(n.q), lse(n.lse);
  auto loss = [&] {
    attention_fwd_reference_f64(s, q.data(), k.data(), v.data(), out.data(), lse.data());
    double l = 0;
    for (size_t i = 0; i < n.q; ++i) l += out[i] * w[i];
    return l;
  };
  loss();
  std::vector<double> dq(n.q), dk(n.kv), dv(n.kv);
  attention_bwd_reference_f64(s, q.data(), k.data(), v.data(), out.data(), lse.data(), w.data(), dq.data(),
                              dk.data(), dv.data());
  const double eps = 1e-6;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double up = loss();
      x[i] = x0 - eps;
      const double down = loss();
      x[i] = x0;
      EXPECT_NEAR(grad[i], (up - down) / (2 * eps), 1e-7 * (1 + std::abs(grad[i])))
          << name << "[" << i << "]";
    }
  };
  check(q, dq, "dq");
  check(k, dk, "dk");
  check(v, dv, "dv");
}

TEST(AttentionFlash, RejectsHeadCountsThatDoNotGroup) {
  const AttentionShape s{1, 4, 6, 4, 8, 1.f};
  std::vector<float> x(1024), lse(64);
  EXPECT_THROW(attention_fwd_flash_f32(s, x.data(), x.data(), x.data(), x.data(), lse.data()), Error);
  EXPECT_THROW(attention_fwd_reference_f32(s, x.data(), x.data(), x.data(), x.data(), lse.data()), Error);
}

}  // namespace
}  // namespace titan::cpu
