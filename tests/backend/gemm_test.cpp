// Every gemm path against plain f64 loops on odd shapes, all four Trans combinations, padded leading
// dimensions, beta = 0 over NaN, beta != 0 accumulation, zero sizes, batches and bad arguments.
//
// Tolerances (per element, eps = 2^-24 f32 unit roundoff):
//   f32 and bf16->f32:  (K + 2) * eps * (|alpha| * sum_k |a_ik b_kj| + |beta c_ij|)
//     the classic bound for a length-K dot product accumulated in f32 plus the final scale/add; the
//     bf16 inputs are exact in f32 and their products are exact too (8 x 8 significant bits), so bf16
//     has the same bound when the truth is computed from the same rounded inputs.
//   bf16 output: the above plus 2^-8 * |truth|, half a bf16 ulp, for the final rounding.
#include "titan/backend/cpu/gemm.h"

#include <gtest/gtest.h>
#include <oneapi/dnnl/dnnl_types.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "ops/op_test_util.h"
#include "test_util.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/check.h"
#include "train/tiny_job.h"

namespace titan::cpu {
namespace {

constexpr double kEps = 1.0 / (1 << 24);
constexpr float kSentinel = 12288.0f;  // exact in bf16; fills the padding between N and ldc, which must survive

struct Shape {
  int64_t M, N, K;
};
// Each of 1, 7, 33, 129, 257 appears in every position; none is a multiple of a SIMD width.
const Shape kShapes[] = {{1, 1, 1},     {7, 7, 7},     {1, 257, 33},   {33, 1, 129},   {257, 33, 1},
                         {7, 129, 257}, {129, 7, 33},  {33, 257, 7},   {257, 129, 129}, {129, 33, 257},
                         {257, 1, 7},   {1, 7, 257}};
const Trans kTrans[] = {Trans::N, Trans::T};

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> round_to_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

std::vector<double> to_f64(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// One problem: stored operands (with their leading dims) and the initial C.
struct Problem {
  Trans ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  std::vector<float> A, B, C0;  // C0 holds NaN when beta == 0 (it must be overwritten)

  Problem(Trans ta_, Trans tb_, Shape s, int64_t pad, float alpha_, float beta_, uint32_t seed, bool bf16_inputs)
      : ta(ta_), tb(tb_), M(s.M), N(s.N), K(s.K), alpha(alpha_), beta(beta_) {
    int64_t a_rows = ta == Trans::N ? M : K, a_cols = ta == Trans::N ? K : M;
    int64_t b_rows = tb == Trans::N ? K : N, b_cols = tb == Trans::N ? N : K;
    lda = a_cols + pad;
    ldb = b_cols + pad;
    ldc = N + pad;
    A = random_vec(size_t(a_rows * lda), seed);
    B = random_vec(size_t(b_rows * ldb), seed + 1);
    if (bf16_inputs) {
      A = round_to_bf16(A);
      B = round_to_bf16(B);
    }
    C0 = random_vec(size_t(M * ldc), seed + 2);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = N; j < ldc; ++j) C0[i * ldc + j] = kSentinel;
    if (beta == 0.0f)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) C0[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
  }

  // Truth in f64 from the same (possibly bf16-rounded) inputs, and the error scale sum |a||b|.
  void truth(std::vector<double>* ref, std::vector<double>* scale) const {
    std::vector<double> a = to_f64(A), b = to_f64(B), c = to_f64(C0);
    ref->assign(c.begin(), c.end());
    gemm_f64_reference(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, ref->data(), ldc);
    for (double& x : a) x = std::fabs(x);
    for (double& x : b) x = std::fabs(x);
    scale->assign(c.size(), 0.0);
    gemm_f64_reference(ta, tb, M, N, K, 1.0, a.data(), lda, b.data(), ldb, 0.0, scale->data(), ldc);
  }

  ::testing::AssertionResult check(const std::vector<float>& C, double extra_rel) const {
    std::vector<double> ref, scale;
    truth(&ref, &scale);
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        size_t idx = size_t(i * ldc + j);
        if (j >= N) {
          if (std::memcmp(&C[idx], &kSentinel, 4) != 0)
            return ::testing::AssertionFailure() << "padding C[" << i << "," << j << "] was written: " << C[idx];
          continue;
        }
        double c0 = beta == 0.0f ? 0.0 : double(C0[idx]);
        double tol = (K + 2) * kEps * (std::fabs(alpha) * scale[idx] + std::fabs(beta * c0)) +
                     extra_rel * std::fabs(ref[idx]) + 1e-30;
        if (!(std::fabs(double(C[idx]) - ref[idx]) <= tol))
          return ::testing::AssertionFailure() << "C[" << i << "," << j << "] = " << C[idx] << ", reference "
                                               << ref[idx] << ", tolerance " << tol;
      }
    }
    return ::testing::AssertionSuccess();
  }
};

std::string describe(const Problem& p) {
  return std::string(p.ta == Trans::N ? "N" : "T") + (p.tb == Trans::N ? "N" : "T") + " M=" + std::to_string(p.M) +
         " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K) + " lda=" + std::to_string(p.lda) +
         " ldb=" + std::to_string(p.ldb) + " ldc=" + std::to_string(p.ldc) + " alpha=" + std::to_string(p.alpha) +
         " beta=" + std::to_string(p.beta);
}

// Runs `body` over every shape x Trans combination, with tight leading dims and beta = 0 (over NaN)
// and with padded leading dims and beta != 0 (accumulation).
template <class Body>
void for_all_problems(bool bf16_inputs, Body body) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    for (Trans ta : kTrans) {
      for (Trans tb : kTrans) {
        for (auto [pad, alpha, beta] : {std::tuple{0, 1.0f, 0.0f}, std::tuple{5, -0.5f, 1.0f},
                                        std::tuple{3, 1.25f, -0.75f}}) {
          Problem p(ta, tb, s, pad, alpha, beta, seed += 3, bf16_inputs);
          SCOPED_TRACE(describe(p));
          body(p);
        }
      }
    }
  }
}

class BackendGuard {
 public:
  explicit BackendGuard(F32Backend b) : saved_(gemm_f32_backend()) { set_gemm_f32_backend(b); }
  ~BackendGuard() { set_gemm_f32_backend(saved_); }

 private:
  F32Backend saved_;
};

// Runs `body` once per kernel tier this CPU has (cpu::kernel_isa capped): on the AVX2 tier the A^T
// products with N <= 256 run as A products over transposed panels (gemm.cpp, transpose_a_first),
// the wider ones (N = 257 here) on oneDNN's A^T code.
template <class Body>
void on_every_tier(Body body) {
  for (KernelIsa tier : testing::cpu_kernel_tiers()) {
    testing::KernelIsaCap cap(tier);
    SCOPED_TRACE(std::string("kernel tier ") + kernel_isa_name(tier));
    body();
  }
}

void check_f32_backend(F32Backend backend) {
  BackendGuard guard(backend);
  on_every_tier([] {
    for_all_problems(false, [](const Problem& p) {
      std::vector<float> C = p.C0;
      gemm_f32(p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A.data(), p.lda, p.B.data(), p.ldb, p.beta, C.data(), p.ldc);
      EXPECT_TRUE(p.check(C, 0.0));
    });
  });
}

TEST(Gemm, F32OneDnnMatchesReference) { check_f32_backend(F32Backend::OneDNN); }
TEST(Gemm, F32OpenBlasMatchesReference) { check_f32_backend(F32Backend::OpenBLAS); }

TEST(Gemm, F32ReferenceMatchesF64Reference) {
  for_all_problems(false, [](const Problem& p) {
    std::vector<float> C = p.C0;
    gemm_f32_reference(p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A.data(), p.lda, p.B.data(), p.ldb, p.beta, C.data(),
                       p.ldc);
    EXPECT_TRUE(p.check(C, 0.0));
  });
}

// The bf16 cases run on each bf16 backend: oneDNN's bf16 code (itself the widening on a CPU
// without it, e.g. AVX2-only) and the widening to f32 that such CPUs take, forced here so that every
// machine tests it.
class Bf16Gemm : public ::testing::TestWithParam<Bf16Backend> {
 protected:
  void SetUp() override {
    saved_ = gemm_bf16_backend();
    set_gemm_bf16_backend(GetParam());
  }
  void TearDown() override { set_gemm_bf16_backend(saved_); }

 private:
  Bf16Backend saved_ = Bf16Backend::OneDNN;
};

INSTANTIATE_TEST_SUITE_P(Backends, Bf16Gemm, ::testing::Values(Bf16Backend::OneDNN, Bf16Backend::WidenToF32),
                         [](const ::testing::TestParamInfo<Bf16Backend>& info) {
                           return std::string(info.param == Bf16Backend::OneDNN ? "OneDnn" : "WidenToF32");
                         });

TEST_P(Bf16Gemm, MatchesF64ReferenceOnRoundedInputs) {
  on_every_tier([] {
    for_all_problems(true, [](const Problem& p) {
      std::vector<bf16> a = to_bf16(p.A), b = to_bf16(p.B);
      std::vector<float> C = p.C0;
      gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, p.alpha, a.data(), p.lda, b.data(), p.ldb, p.beta, C.data(), p.ldc);
      EXPECT_TRUE(p.check(C, 0.0));
    });
  });
}

// An A^T product larger than one transposed panel (2^21 elements of A): the panels must tile M
// exactly, each writing its own rows of C, on the AVX2 tier where they run (f32, and bf16 widened
// to f32 on the way). The last panel is partial and M, K are not multiples of 8.
TEST(Gemm, TransposedAPanelsTileLargeProducts) {
  if (cpu_kernel_isa() < KernelIsa::kAvx2) GTEST_SKIP() << "this CPU has no AVX2: A^T products are never panelled";
  testing::KernelIsaCap cap(KernelIsa::kAvx2);
  BackendGuard guard(F32Backend::OneDNN);
  for (Trans tb : kTrans) {
    Problem p(Trans::T, tb, Shape{2213, 5, 1931}, 3, 0.75f, 0.5f, 71, true);
    SCOPED_TRACE(describe(p));
    ASSERT_GT(p.M * p.K, int64_t(1) << 21);
    std::vector<float> C = p.C0;
    gemm_f32(p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A.data(), p.lda, p.B.data(), p.ldb, p.beta, C.data(), p.ldc);
    EXPECT_TRUE(p.check(C, 0.0));
    std::vector<bf16> a = to_bf16(p.A), b = to_bf16(p.B);
    C = p.C0;
    struct WidenGuard {
      Bf16Backend saved = gemm_bf16_backend();
      WidenGuard() { set_gemm_bf16_backend(Bf16Backend::WidenToF32); }
      ~WidenGuard() { set_gemm_bf16_backend(saved); }
    } widen;
    gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, p.alpha, a.data(), p.lda, b.data(), p.ldb, p.beta, C.data(), p.ldc);
    EXPECT_TRUE(p.check(C, 0.0));
  }
}

TEST_P(Bf16Gemm, OutMatchesReferenceWithinOneRounding) {
  for_all_problems(true, [](Problem p) {
    if (p.beta != 0.0f) return;  // the bf16-output variant has no beta
    std::vector<bf16> a = to_bf16(p.A), b = to_bf16(p.B);
    std::vector<bf16> C(p.C0.size());
    for (size_t i = 0; i < C.size(); ++i) C[i] = f32_to_bf16(p.C0[i]);  // NaN, and the sentinel (exact in bf16)
    gemm_bf16_out(p.ta, p.tb, p.M, p.N, p.K, p.alpha, a.data(), p.lda, b.data(), p.ldb, C.data(), p.ldc);
    std::vector<float> Cf(C.size());
    for (size_t i = 0; i < C.size(); ++i) Cf[i] = bf16_to_f32(C[i]);
    EXPECT_TRUE(p.check(Cf, 1.0 / 256));
  });
}

// The reference loops themselves: with A = I, op(I) @ op(B) must reproduce op(B) exactly.
TEST(Gemm, F64ReferenceIndexesLikeBlas) {
  for (Trans tb : kTrans) {
    const int64_t n = 5, m = 3;  // op(B) is [n, m]
    std::vector<double> I(n * n, 0.0), B(n * m), C(n * m, -1.0);
    for (int64_t i = 0; i < n; ++i) I[i * n + i] = 1.0;
    for (size_t i = 0; i < B.size(); ++i) B[i] = double(i) + 0.5;
    int64_t ldb = tb == Trans::N ? m : n;
    gemm_f64_reference(Trans::T, tb, n, m, n, 1.0, I.data(), n, B.data(), ldb, 0.0, C.data(), m);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j) EXPECT_EQ(C[i * m + j], tb == Trans::N ? B[i * m + j] : B[j * n + i]);
  }
}

TEST(Gemm, ZeroSizes) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (F32Backend backend : {F32Backend::OneDNN, F32Backend::OpenBLAS}) {
    BackendGuard guard(backend);
    // M == 0 or N == 0: nothing is read or written (null pointers are fine).
    gemm_f32(Trans::N, Trans::N, 0, 4, 3, 1.0f, nullptr, 3, nullptr, 4, 0.0f, nullptr, 4);
    gemm_f32(Trans::T, Trans::N, 4, 0, 3, 1.0f, nullptr, 4, nullptr, 1, 0.0f, nullptr, 1);
    // K == 0: C = beta * C, A and B unread; beta == 0 clears NaN.
    std::vector<float> C = {nan, 2.0f, kSentinel, nan, 4.0f, kSentinel};
    gemm_f32(Trans::N, Trans::N, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, C.data(), 3);
    EXPECT_EQ(C, (std::vector<float>{0, 0, kSentinel, 0, 0, kSentinel}));
    C = {1.0f, 2.0f, kSentinel, 3.0f, 4.0f, kSentinel};
    gemm_f32(Trans::N, Trans::T, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 1, 0.5f, C.data(), 3);
    EXPECT_EQ(C, (std::vector<float>{0.5f, 1.0f, kSentinel, 1.5f, 2.0f, kSentinel}));
  }
  std::vector<float> C = {nan, 2.0f, 3.0f, 4.0f};
  gemm_bf16(Trans::N, Trans::N, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{0, 0, 0, 0}));
  C = {1.0f, 2.0f, 3.0f, 4.0f};
  gemm_bf16(Trans::T, Trans::N, 2, 2, 0, 2.0f, nullptr, 2, nullptr, 2, 1.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  std::vector<bf16> Cb(4, f32_to_bf16(nan));
  gemm_bf16_out(Trans::N, Trans::N, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, Cb.data(), 2);
  for (bf16 v : Cb) EXPECT_EQ(bf16_to_f32(v), 0.0f);
  gemm_bf16(Trans::N, Trans::N, 0, 0, 5, 1.0f, nullptr, 5, nullptr, 1, 0.0f, nullptr, 1);
  // Tight strides of empty operands, as ops pass them (lda = K = 0; ldc = N = 0): accepted.
  C = {nan, nan, nan, nan};
  gemm_f32(Trans::N, Trans::T, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 0, 0.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{0, 0, 0, 0}));
  gemm_f32(Trans::N, Trans::T, 3, 0, 5, 1.0f, nullptr, 5, nullptr, 5, 0.0f, nullptr, 0);
  gemm_bf16_out(Trans::N, Trans::N, 0, 4, 3, 1.0f, nullptr, 3, nullptr, 4, nullptr, 0);
  EXPECT_THROW(gemm_f32(Trans::N, Trans::N, 2, 2, 0, 1.0f, nullptr, 0, nullptr, 2, 0.0f, C.data(), 1), Error);
  gemm_f32_batched(Trans::N, Trans::N, 0, 3, 3, 3, 1.0f, nullptr, 3, 9, nullptr, 3, 9, 0.0f, nullptr, 3, 9);
}

// Batches: a zero stride shares one A (or one B) across the batch; other strides include padding.
void check_batched(bool bf16_inputs) {
  const int64_t batch = 3;
  uint32_t seed = 100;
  enum Share { kNone, kShareA, kShareB };
  for (Shape s : {Shape{33, 7, 129}, Shape{7, 129, 33}, Shape{1, 33, 257}}) {
    for (Trans ta : kTrans) {
      for (Trans tb : kTrans) {
        for (Share share : {kNone, kShareA, kShareB}) {
          std::vector<Problem> ps;
          float beta = share == kNone ? 1.0f : 0.0f;
          for (int64_t i = 0; i < batch; ++i) ps.emplace_back(ta, tb, s, 2, 0.75f, beta, seed += 3, bf16_inputs);
          for (auto& p : ps) {
            if (share == kShareA) p.A = ps[0].A;
            if (share == kShareB) p.B = ps[0].B;
          }
          const Problem& p0 = ps[0];
          SCOPED_TRACE(describe(p0) + (share == kShareA ? " shared A" : share == kShareB ? " shared B" : ""));
          int64_t sa = share == kShareA ? 0 : int64_t(p0.A.size()) + 11;
          int64_t sb = share == kShareB ? 0 : int64_t(p0.B.size()) + 5;
          int64_t sc = int64_t(p0.C0.size()) + 7;
          std::vector<float> A(p0.A.size() + size_t((batch - 1) * sa)), B(p0.B.size() + size_t((batch - 1) * sb)),
              C(size_t(batch * sc), kSentinel);
          for (int64_t i = 0; i < batch; ++i) {
            std::copy(ps[i].A.begin(), ps[i].A.end(), A.begin() + i * sa);
            std::copy(ps[i].B.begin(), ps[i].B.end(), B.begin() + i * sb);
            std::copy(ps[i].C0.begin(), ps[i].C0.end(), C.begin() + i * sc);
          }
          if (bf16_inputs) {
            std::vector<bf16> a = to_bf16(A), b = to_bf16(B);
            gemm_bf16_batched(ta, tb, batch, p0.M, p0.N, p0.K, p0.alpha, a.data(), p0.lda, sa, b.data(), p0.ldb, sb,
                              beta, C.data(), p0.ldc, sc);
          } else {
            gemm_f32_batched(ta, tb, batch, p0.M, p0.N, p0.K, p0.alpha, A.data(), p0.lda, sa, B.data(), p0.ldb, sb,
                             beta, C.data(), p0.ldc, sc);
          }
          for (int64_t i = 0; i < batch; ++i) {
            std::vector<float> Ci(C.begin() + i * sc, C.begin() + i * sc + int64_t(p0.C0.size()));
            EXPECT_TRUE(ps[i].check(Ci, 0.0)) << "batch " << i;
            for (int64_t j = int64_t(p0.C0.size()); j < sc; ++j) EXPECT_EQ(C[size_t(i * sc + j)], kSentinel);
          }
        }
      }
    }
  }
}

TEST(Gemm, F32BatchedMatchesReference) { check_batched(false); }
TEST_P(Bf16Gemm, BatchedMatchesReference) { check_batched(true); }

// Threads may run gemms at once (moe_experts spreads its experts over the OpenMP threads). Each call
// must give what it gives alone: oneDNN's library-managed scratchpad is one buffer shared by all
// primitives, so before run_prim passed a per-thread one, concurrent calls corrupted each other.
// Inside a parallel region the bf16 calls also take the run-time-dimension primitives (another
// oneDNN kernel, so another summation order): compared within f32 reassociation, and against the
// f64 reference for bf16_out. Shapes alternate so different primitives are in flight together.
// Races are timing-dependent: without the per-thread scratchpad this caught 4 runs in 5 on 2 cores.
TEST_P(Bf16Gemm, ConcurrentCallsMatchSequentialOnes) {
  const int64_t jobs = 64, M = 256, N = 160, K = 200;
  std::vector<bf16> a = to_bf16(random_vec(size_t(jobs * M * K), 31)),
                    b = to_bf16(random_vec(size_t(jobs * N * K), 32));
  std::vector<float> alone(size_t(jobs * M * N)), together(alone.size(), NAN);
  std::vector<bf16> out_alone(alone.size()), out_together(alone.size());
  auto rows = [&](int64_t j) { return j % 2 ? M : M / 2; };
  auto job = [&](int64_t j, float* c, bf16* o) {
    // C = A B^T (as a batch of two half-height products: batched primitives keep exact shapes even
    // inside a parallel region), then C += 0.5 A B^T (the beta = 1 sum post-op): 1.5 A B^T.
    const int64_t half = rows(j) / 2;
    gemm_bf16_batched(Trans::N, Trans::T, 2, half, N, K, 1.f, a.data() + j * M * K, K, half * K,
                      b.data() + j * N * K, K, 0, 0.f, c + j * M * N, N, half * N);
    gemm_bf16(Trans::N, Trans::T, rows(j), N, K, 0.5f, a.data() + j * M * K, K, b.data() + j * N * K, K, 1.f,
              c + j * M * N, N);
    gemm_bf16_out(Trans::N, Trans::T, rows(j), N, K, 1.f, a.data() + j * M * K, K, b.data() + j * N * K, K,
                  o + j * M * N, N);
  };
  for (int64_t j = 0; j < jobs; ++j) job(j, alone.data(), out_alone.data());
#pragma omp parallel for schedule(dynamic, 1) num_threads(4)
  for (int64_t j = 0; j < jobs; ++j) job(j, together.data(), out_together.data());
  for (int64_t j = 0; j < jobs; ++j) {
    std::vector<double> ad(size_t(M * K)), bd(size_t(N * K)), ref(size_t(M * N));
    for (int64_t i = 0; i < M * K; ++i) ad[size_t(i)] = bf16_to_f32(a[size_t(j * M * K + i)]);
    for (int64_t i = 0; i < N * K; ++i) bd[size_t(i)] = bf16_to_f32(b[size_t(j * N * K + i)]);
    gemm_f64_reference(Trans::N, Trans::T, rows(j), N, K, 1.0, ad.data(), K, bd.data(), K, 0.0, ref.data(), N);
    for (int64_t i = 0; i < rows(j) * N; ++i) {
      const size_t at = size_t(j * M * N + i);
      // f32 sums of K exact products, in two orders: within K f32 ulps of the magnitude.
      ASSERT_NEAR(alone[at], together[at], 1e-5 * (1.0 + std::abs(ref[size_t(i)]) * 1.5)) << "job " << j << " element " << i;
      ASSERT_NEAR(1.5 * ref[size_t(i)], together[at], 1e-4 * (1.0 + std::abs(ref[size_t(i)]))) << "job " << j;
      // bf16 output: the f64 product rounded once, give or take one bf16 ulp (2^-8 relative).
      ASSERT_NEAR(ref[size_t(i)], bf16_to_f32(out_together[at]), std::abs(ref[size_t(i)]) * 0x1p-8 + 1e-6)
          << "job " << j << " element " << i;
    }
  }
}

TEST(Gemm, BadArgumentsThrow) {
  std::vector<float> A(64), B(64), C(64);
  std::vector<bf16> Ab(64), Bb(64);
  // lda below the stored row length: K for Trans::N, M for Trans::T.
  EXPECT_THROW(gemm_f32(Trans::N, Trans::N, 4, 4, 4, 1, A.data(), 3, B.data(), 4, 0, C.data(), 4), Error);
  EXPECT_THROW(gemm_f32(Trans::T, Trans::N, 5, 4, 4, 1, A.data(), 4, B.data(), 4, 0, C.data(), 4), Error);
  EXPECT_THROW(gemm_f32(Trans::N, Trans::T, 4, 4, 5, 1, A.data(), 5, B.data(), 4, 0, C.data(), 4), Error);
  EXPECT_THROW(gemm_f32(Trans::N, Trans::N, 4, 4, 4, 1, A.data(), 4, B.data(), 4, 0, C.data(), 3), Error);
  EXPECT_THROW(gemm_f32(Trans::N, Trans::N, -1, 4, 4, 1, A.data(), 4, B.data(), 4, 0, C.data(), 4), Error);
  EXPECT_THROW(gemm_bf16(Trans::N, Trans::N, 4, 4, 4, 1, Ab.data(), 2, Bb.data(), 4, 0, C.data(), 4), Error);
  EXPECT_THROW(gemm_bf16_out(Trans::N, Trans::N, 4, 4, 4, 1, Ab.data(), 4, Bb.data(), 4, Ab.data(), 2), Error);
  // Batched outputs that overlap.
  EXPECT_THROW(gemm_f32_batched(Trans::N, Trans::N, 2, 4, 4, 4, 1, A.data(), 4, 16, B.data(), 4, 16, 0, C.data(), 4,
                                8),
               Error);
  try {
    gemm_f32(Trans::N, Trans::N, 4, 4, 4, 1, A.data(), 3, B.data(), 4, 0, C.data(), 4);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lda=3"), std::string::npos) << e.what();
  }
}

TEST(CpuInfo, ConsistentAndPlausible) {
  const CpuInfo& info = cpu_info();
  EXPECT_FALSE(info.vendor.empty());
  EXPECT_GE(info.cores, 1);
  EXPECT_LE(info.cores, info.logical_cpus);
  EXPECT_GT(info.ghz, 0.2);
  EXPECT_LT(info.ghz, 10.0);
  EXPECT_TRUE(!info.avx512_bf16 || info.avx512f);
  EXPECT_TRUE(!info.amx_usable || info.amx_tile);
  EXPECT_GE(info.peak_flops(DType::BF16), info.peak_flops(DType::F32));
  EXPECT_DOUBLE_EQ(info.peak_flops(DType::F32),
                   info.cores * info.ghz * 1e9 * info.f32_flops_per_cycle);
  EXPECT_DOUBLE_EQ(info.peak_flops(DType::F64) * 2, info.peak_flops(DType::F32));
  EXPECT_NE(info.summary().find("GFLOP/s"), std::string::npos);
  EXPECT_NE(gemm_describe().find("bf16"), std::string::npos);
}

}  // namespace
}  // namespace titan::cpu

namespace titan::cpu {

// Library kernels the CPU cannot run are refused by name before they run: an OPENBLAS_CORETYPE of a
// newer CPU (SIGILL in OpenBLAS's first sgemm otherwise), and oneDNN's AVX2 code, which also uses
// FMA, on a CPU with AVX2 and no FMA (capped at AVX there).
TEST(Gemm, LibraryKernelsTheCpuCannotRunAreRefusedOrCapped) {
  CpuInfo avx2_fma, avx512, avx2_no_fma, sse;
  avx2_fma.avx2 = avx2_fma.fma = true;
  avx512 = avx2_fma;
  avx512.avx512f = avx512.avx512bw = avx512.avx512vl = avx512.avx512dq = true;
  avx2_no_fma.avx2 = true;
  EXPECT_EQ(openblas_core_unrunnable("SkylakeX", avx512), "");
  EXPECT_EQ(openblas_core_unrunnable("Cooperlake", avx512), "");
  EXPECT_EQ(openblas_core_unrunnable("Zen", avx2_fma), "");
  EXPECT_EQ(openblas_core_unrunnable("Prescott", sse), "");
  EXPECT_EQ(openblas_core_unrunnable("SkylakeX", avx2_fma),
            "its 'SkylakeX' kernels need AVX-512, which this CPU lacks");
  EXPECT_EQ(openblas_core_unrunnable("Cooperlake", avx2_fma),
            "its 'Cooperlake' kernels need AVX-512, which this CPU lacks");
  EXPECT_EQ(openblas_core_unrunnable("Haswell", avx2_no_fma),
            "its 'Haswell' kernels need AVX2 and FMA, which this CPU lacks");
  EXPECT_TRUE(onednn_needs_avx_cap(avx2_no_fma));
  EXPECT_FALSE(onednn_needs_avx_cap(avx2_fma));
  EXPECT_FALSE(onednn_needs_avx_cap(sse));
  EXPECT_EQ(onednn_isa_name(dnnl_cpu_isa_avx2), "avx2");
  EXPECT_EQ(onednn_isa_name(dnnl_cpu_isa_avx512_core_amx), "avx512_core_amx");
}

// Which bf16 arithmetic is fastest, by CPU: AMX, and AMD's AVX512-BF16 (VDPBF16PS at the zmm FMA's
// issue rate), beat f32 FMAs on widened inputs; Intel's AVX512-BF16 without AMX (VDPBF16PS every
// other cycle) and AVX2 do not. The bf16 GEMM's default path follows it.
TEST(Gemm, Bf16GemmsRunNativeOnlyWhereBf16ArithmeticBeatsTheF32Fma) {
  auto cpu = [](const char* vendor, int family, bool avx512, bool bf16, bool amx) {
    CpuInfo c;
    c.vendor = vendor, c.family = family;
    c.avx2 = c.fma = true;
    c.avx512f = c.avx512bw = c.avx512vl = c.avx512dq = avx512;
    c.avx512_bf16 = bf16;
    c.amx_tile = c.amx_bf16 = c.amx_usable = amx;
    assign_flop_rates(c);
    return c;
  };
  const CpuInfo zen4 = cpu("AuthenticAMD", 0x19, true, true, false);
  EXPECT_TRUE(zen4.bf16_dot_beats_fma);
  EXPECT_EQ(zen4.f32_flops_per_cycle, 32);
  EXPECT_EQ(zen4.bf16_flops_per_cycle, 64);
  const CpuInfo zen5 = cpu("AuthenticAMD", 0x1a, true, true, false);
  EXPECT_TRUE(zen5.bf16_dot_beats_fma);
  EXPECT_EQ(zen5.f32_flops_per_cycle, 64);
  EXPECT_EQ(zen5.bf16_flops_per_cycle, 128);
  EXPECT_NE(zen5.peak_formula(DType::BF16).find("AVX512-BF16"), std::string::npos);
  const CpuInfo sapphire_rapids = cpu("GenuineIntel", 6, true, true, true);
  EXPECT_TRUE(sapphire_rapids.bf16_dot_beats_fma);
  EXPECT_EQ(sapphire_rapids.bf16_flops_per_cycle, 1024);
  const CpuInfo intel_without_amx = cpu("GenuineIntel", 6, true, true, false);
  EXPECT_FALSE(intel_without_amx.bf16_dot_beats_fma);
  EXPECT_EQ(intel_without_amx.f32_flops_per_cycle, 64);
  EXPECT_EQ(intel_without_amx.bf16_flops_per_cycle, 64);  // the widened f32 path's rate
  EXPECT_NE(intel_without_amx.peak_formula(DType::BF16).find("AVX-512 FMA, widened"), std::string::npos);
  const CpuInfo zen3 = cpu("AuthenticAMD", 0x19, false, false, false);
  EXPECT_FALSE(zen3.bf16_dot_beats_fma);
  EXPECT_EQ(zen3.bf16_flops_per_cycle, zen3.f32_flops_per_cycle);
  // This process, unless TITAN_GEMM_BF16 chose (ctest does not set it).
  ASSERT_EQ(std::getenv("TITAN_GEMM_BF16"), nullptr);
  EXPECT_EQ(gemm_bf16_backend(),
            cpu_info().bf16_dot_beats_fma ? Bf16Backend::OneDNN : Bf16Backend::WidenToF32);
}

// TITAN_GEMM_BF16 chooses the bf16 path on any CPU, the start-up's gemm line says so, both pass the
// linear parity cases, and a name that is no path is an error naming it.
TEST(Gemm, TheBf16PathFromTheEnvironmentIsAppliedAndNamed) {
  const std::string titan = titan::testing::titan_binary().string();
  std::string out;
  for (const char* path : {"onednn", "widen"})
    EXPECT_EQ(titan::testing::run_command(std::string("TITAN_GEMM_BF16=") + path + " " + titan +
                                              " kernels parity --op linear --dtype bf16 2>&1",
                                          &out),
              0)
        << path << ": " << out;
  EXPECT_EQ(
      titan::testing::run_command("TITAN_GEMM_BF16=amx " + titan + " kernels parity --op linear 2>&1", &out),
      1)
      << out;
  EXPECT_NE(out.find("TITAN_GEMM_BF16=amx is not a bf16 gemm path (use onednn or widen)"), std::string::npos)
      << out;
  const std::filesystem::path dump =
      std::filesystem::path(TITAN_BINARY_DIR) / "test_tmp" / ("gemm_bf16_widen_" + std::to_string(getpid()));
  std::filesystem::remove_all(dump);
  EXPECT_EQ(
      titan::testing::run_command(
          "TITAN_GEMM_BF16=widen " + titan + " train --config " + titan::testing::debugmodel_toml().string() +
              " --model.n_layers=1 --model.dim=64 --model.n_heads=2 --model.n_kv_heads=1 --model.head_dim=32"
              " --model.hidden_dim=128 --training.seq_len=32 --training.steps=1 --lr_scheduler.warmup_steps=0"
              " --training.mixed_precision_param=bfloat16 --validation.enable=false --checkpoint.enable=false"
              " --checkpoint.last_save_in_hf=false --job.dump_folder=" +
              dump.string() + " 2>&1",
          &out),
      0)
      << out;
  EXPECT_NE(out.find("bf16 widened to f32 (TITAN_GEMM_BF16=widen)"), std::string::npos) << out;
  EXPECT_NE(
      out.find("mixed precision: bf16 GEMMs run as f32 GEMMs on widened inputs (TITAN_GEMM_BF16=widen)"),
      std::string::npos)
      << out;
  std::filesystem::remove_all(dump);
}

// The real thing, through the binary: OPENBLAS_CORETYPE=SKYLAKEX on a CPU without AVX-512 fails the
// linear parity cases naming the variable, where the process used to die of SIGILL.
TEST(Gemm, AnOpenBlasCoreTypeOfANewerCpuIsAnErrorNotSigill) {
  if (cpu_info().avx512_core()) GTEST_SKIP() << "this CPU runs the SkylakeX kernels (AVX-512)";
  std::string out;
  const int rc = titan::testing::run_command("OPENBLAS_CORETYPE=SKYLAKEX TITAN_GEMM_F32=openblas " +
                                                 titan::testing::titan_binary().string() +
                                                 " kernels parity --op linear --dtype f32 2>&1",
                                             &out);
  EXPECT_EQ(rc, 1) << out;  // failed cases, not a signal
  EXPECT_NE(
      out.find("its 'SkylakeX' kernels need AVX-512, which this CPU lacks (OPENBLAS_CORETYPE=SKYLAKEX)"),
      std::string::npos)
      << out;
}

// TITAN_KERNEL_ISA caps the hand-vectorised kernels for a user checking a lower tier: the portable
// tier passes parity, a run says it is capped, and a name that is no tier is an error naming it.
TEST(Gemm, TheKernelTierCapFromTheEnvironmentIsAppliedAndNamed) {
  const std::string titan = titan::testing::titan_binary().string();
  std::string out;
  EXPECT_EQ(
      titan::testing::run_command(
          "TITAN_KERNEL_ISA=portable " + titan + " kernels parity --op attention --dtype f32 2>&1", &out),
      0)
      << out;
  // Whichever op is checked: rope has no tiers, and passed under the bad name.
  for (const char* op : {"attention", "rope"}) {
    EXPECT_EQ(titan::testing::run_command(
                  "TITAN_KERNEL_ISA=avx9 " + titan + " kernels parity --op " + op + " 2>&1", &out),
              1)
        << out;
    EXPECT_NE(
        out.find(
            "TITAN_KERNEL_ISA=avx9 is not a kernel tier (use portable, avx2, avx512, avx512_bf16 or amx)"),
        std::string::npos)
        << op << ": " << out;
  }
  if (cpu_kernel_isa() == KernelIsa::kPortable) GTEST_SKIP() << "this CPU runs the portable tier anyway";
  const std::filesystem::path dump =
      std::filesystem::path(TITAN_BINARY_DIR) / "test_tmp" / ("kernel_isa_cap_" + std::to_string(getpid()));
  std::filesystem::remove_all(dump);
  EXPECT_EQ(
      titan::testing::run_command(
          "TITAN_KERNEL_ISA=portable " + titan + " train --config " +
              titan::testing::debugmodel_toml().string() +
              " --model.n_layers=1 --model.dim=64 --model.n_heads=2 --model.n_kv_heads=1 --model.head_dim=32"
              " --model.hidden_dim=128 --training.seq_len=32 --training.steps=1 --lr_scheduler.warmup_steps=0"
              " --validation.enable=false --checkpoint.enable=false --checkpoint.last_save_in_hf=false"
              " --job.dump_folder=" +
              dump.string() + " 2>&1",
          &out),
      0)
      << out;
  EXPECT_NE(
      out.find(
          "kernels: the hand-vectorised kernels run their portable code (TITAN_KERNEL_ISA); this CPU runs " +
          std::string(kernel_isa_name(cpu_kernel_isa()))),
      std::string::npos)
      << out;
  std::filesystem::remove_all(dump);
}

}  // namespace titan::cpu
