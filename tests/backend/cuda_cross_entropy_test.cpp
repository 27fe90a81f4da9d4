// CUDA cross-entropy and fused linear + cross-entropy kernels (ops/cross_entropy/cuda.h)
// against the CPU "reference" kernels of the ops, f32 and bf16, with ignored rows. Skips without a
// GPU.
#include <gtest/gtest.h>

#ifndef TITAN_HAVE_CUDA
TEST(CudaCrossEntropy, NeedsTheCudaBackend) {
  GTEST_SKIP() << "built without the CUDA backend (TITAN_CUDA off, or no nvcc)";
}
#else

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>
#include <vector>

#include "backend/cuda_kernel_test_util.h"
#include "backend/cuda_test_util.h"
#include "titan/kernels/registry.h"
#include "titan/ops/cross_entropy/cross_entropy.h"
#include "titan/ops/cross_entropy/cuda.h"

namespace titan::cuda {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::expect_close;
constexpr int64_t kIgnore = -100;

// Labels in [0, V) with every fifth row ignored.
std::vector<int64_t> make_labels(int64_t N, int64_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> y(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) y[size_t(n)] = n % 5 == 3 ? kIgnore : int64_t(gen() % uint64_t(V));
  return y;
}

std::unique_ptr<DeviceBuffer> upload(const std::vector<float>& x, DType dtype) {
  return dtype == DType::BF16 ? std::make_unique<DeviceBuffer>(cuda_test::to_bf16(x))
                              : std::make_unique<DeviceBuffer>(x);
}

// Host copy the CPU reference kernels take: f32 data, or titan bf16 for bf16.
struct HostInput {
  std::vector<float> f32;
  std::vector<bf16> b16;
  const void* data(DType dtype) const {
    return dtype == DType::BF16 ? static_cast<const void*>(b16.data()) : f32.data();
  }
};
HostInput host_input(const std::vector<float>& x) {
  return {x, cuda_test::to_bf16(x)};
}

class CudaCrossEntropy : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t> > {};

// Row statistics and dlogits vs the reference; the softmax is f32 in both (bf16 logits widened),
// only summation order differs: 2e-5 relative (as the parity tolerance of cross_entropy).
TEST_P(CudaCrossEntropy, ForwardAndBackward) {
  TITAN_REQUIRE_CUDA();
  const auto [dtype, N, V] = GetParam();
  std::vector<float> logits = cuda_test::randn(size_t(N * V), 7, 4.0);
  if (dtype == DType::BF16) logits = cuda_test::round_bf16(logits);
  const std::vector<int64_t> labels = make_labels(N, V, 8);
  const HostInput host = host_input(logits);
  const auto& ref =
      kernels::kernel_for<ops::CrossEntropyKernel>("cross_entropy", Device::CPU, dtype, "reference");
  std::vector<float> lse_r(static_cast<size_t>(N)), loss_r(static_cast<size_t>(N)),
      dl_r(static_cast<size_t>(N * V));
  const KernelContext cpu = device_services(Device::CPU).context();
  ref.forward(cpu, N, V, host.data(dtype), labels.data(), kIgnore, lse_r.data(), loss_r.data());
  const double scale = 1.0 / 3.0;
  ref.backward(cpu, N, V, host.data(dtype), labels.data(), kIgnore, lse_r.data(), scale, dl_r.data());

  KernelContext ctx = device_services(Device::CUDA).context();
  auto logits_d = upload(logits, dtype);
  DeviceBuffer labels_d(labels), lse_d(size_t(N) * 4), loss_d(size_t(N) * 4), dl_d(size_t(N * V) * 4);
  lse_d.poison(), loss_d.poison(), dl_d.poison();
  cross_entropy_fwd(ctx, N, V, dtype, logits_d->as<void>(), labels_d.as<int64_t>(), kIgnore,
                    lse_d.as<float>(), loss_d.as<float>());
  cross_entropy_bwd(ctx, N, V, dtype, logits_d->as<void>(), labels_d.as<int64_t>(), kIgnore,
                    lse_d.as<float>(), scale, dl_d.as<float>());
  expect_close(lse_d.download<float>(), lse_r, 2e-5, 1e-7, "lse");
  expect_close(loss_d.download<float>(), loss_r, 2e-5, 1e-6, "row_loss");
  expect_close(dl_d.download<float>(), dl_r, 2e-5, 1e-7, "dlogits");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaCrossEntropy,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(1, 7, 33),
                                            ::testing::Values(1, 257, 1000, 5000)));

// A NaN logit makes its row's lse and loss NaN, as the reference's, also where the thread that read
// it saw nothing finite (V = 2: thread 0 reads only the NaN, and its partial must survive merging
// with the lanes that read nothing); the other rows are untouched.
TEST(CudaCrossEntropyNaN, ANanLogitMakesItsRowNaNAsTheReference) {
  TITAN_REQUIRE_CUDA();
  for (int64_t V : {2, 1000}) {
    const int64_t N = 3;
    std::vector<float> logits = cuda_test::randn(size_t(N * V), 11, 2.0);
    logits[0] = NAN;  // row 0, column 0
    const std::vector<int64_t> labels = {1, 0, 1};
    const auto& ref =
        kernels::kernel_for<ops::CrossEntropyKernel>("cross_entropy", Device::CPU, DType::F32, "reference");
    std::vector<float> lse_r(static_cast<size_t>(N)), loss_r(static_cast<size_t>(N));
    ref.forward(device_services(Device::CPU).context(), N, V, logits.data(), labels.data(), kIgnore,
                lse_r.data(), loss_r.data());
    KernelContext ctx = device_services(Device::CUDA).context();
    DeviceBuffer logits_d(logits), labels_d(labels), lse_d(size_t(N) * 4), loss_d(size_t(N) * 4);
    cross_entropy_fwd(ctx, N, V, DType::F32, logits_d.as<void>(), labels_d.as<int64_t>(), kIgnore,
                      lse_d.as<float>(), loss_d.as<float>());
    const std::vector<float> lse = lse_d.download<float>(), loss = loss_d.download<float>();
    ASSERT_TRUE(std::isnan(lse_r[0]) && std::isnan(loss_r[0])) << "the reference propagates the NaN";
    EXPECT_TRUE(std::isnan(lse[0])) << "V " << V << ": lse " << lse[0];
    EXPECT_TRUE(std::isnan(loss[0])) << "V " << V << ": loss " << loss[0];
    for (int64_t n = 1; n < N; ++n) {
      EXPECT_NEAR(lse[size_t(n)], lse_r[size_t(n)], 2e-5 * std::abs(lse_r[size_t(n)])) << "row " << n;
      EXPECT_NEAR(loss[size_t(n)], loss_r[size_t(n)], 2e-5 * std::abs(loss_r[size_t(n)]) + 1e-6)
          << "row " << n;
    }
  }
}

// (dtype, N, V, D, chunk)
class CudaLinearCrossEntropy
    : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t, int64_t> > {};

// Multiples of 1/8 in [-2, 2]: their products are multiples of 1/64 below 4, and any sum of up to
// 2^15 of them is exact in f32, so the logits' GEMM gives the same bits in any summation order and
// with any accumulator of f32's width (a tensor core's too), and the bf16 logits are the reference's.
std::vector<float> on_an_eighths_grid(std::vector<float> x) {
  for (float& v : x) v = std::round(std::clamp(v, -2.f, 2.f) * 8.f) / 8.f;
  return x;
}

// Per element: 2^-7 x sum |dlogits| |other operand| over the GEMM's terms, what the dlogits, each
// rounded once to bf16 (one ulp is at most 2^-7 of its value), may move a bf16 gradient when an
// exp that differs in its last f32 bit rounds one of them to its other neighbour.
std::vector<float> dlogit_rounding_bound(int64_t rows, int64_t cols, int64_t K, const std::vector<float>& dl,
                                         bool dl_transposed, const std::vector<float>& other) {
  std::vector<float> bound(size_t(rows * cols), 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const float g = std::fabs(dl_transposed ? dl[size_t(k * rows + r)] : dl[size_t(r * K + k)]);
      for (int64_t c = 0; c < cols; ++c)
        bound[size_t(r * cols + c)] += g * std::fabs(other[size_t(k * cols + c)]);
    }
  for (float& b : bound) b = std::ldexp(b, -7);
  return bound;
}

// Loss statistics, dhidden and dweight vs the reference (which materialises all logits). f32: the
// parity tolerances of linear_cross_entropy, 1e-4 relative + 1e-6 of max|ref| (f32 GEMM, TF32 off).
// bf16: the inputs on an eighths grid (the logits exact), 1e-3 relative + 1e-5 of max|ref|, plus each
// element's dlogit rounding bound (2^-7 sum |dl| |operand|). (With normal bf16 inputs the H200's first run
// found 31 of 24000 dweight elements of the 37 x 1000 x 24 case up to 1 % off, a logit one bf16 ulp away
// moving its softmax term by 2^-7 relative: which logits the tensor cores round the other way is not a
// property of the kernel.)
TEST_P(CudaLinearCrossEntropy, ForwardAndBackward) {
  TITAN_REQUIRE_CUDA();
  const auto [dtype, N, V, D, chunk] = GetParam();
  std::vector<float> hidden = cuda_test::randn(size_t(N * D), 11),
                     weight = cuda_test::randn(size_t(V * D), 12, 0.5);
  if (dtype == DType::BF16) hidden = on_an_eighths_grid(hidden), weight = on_an_eighths_grid(weight);
  const std::vector<int64_t> labels = make_labels(N, V, 13);
  const HostInput h = host_input(hidden), w = host_input(weight);
  const auto& ref = kernels::kernel_for<ops::LinearCrossEntropyKernel>("linear_cross_entropy", Device::CPU,
                                                                       dtype, "reference");
  ops::LinearCrossEntropyArgs a{N,    V,       D, h.data(dtype), w.data(dtype), labels.data(), kIgnore, chunk,
                                true, nullptr, 0};
  a.round_logits = dtype == DType::BF16;
  std::vector<float> lse_r(static_cast<size_t>(N)), loss_r(static_cast<size_t>(N)),
      dh_r(static_cast<size_t>(N * D)), dw_r(static_cast<size_t>(V * D));
  const KernelContext cpu = device_services(Device::CPU).context();
  ref.forward(cpu, a, lse_r.data(), loss_r.data());
  const double scale = 0.25;
  ref.backward(cpu, a, lse_r.data(), scale, dh_r.data(), dw_r.data(), false);

  const bool bf = dtype == DType::BF16;
  const double rtol = bf ? 1e-3 : 1e-4, atol = bf ? 1e-5 : 1e-6;
  std::vector<float> dh_bound, dw_bound;
  if (bf) {  // the reference's dlogits (the logits exact: the inputs are on the grid)
    std::vector<float> dl(size_t(N * V), 0.f);
    for (int64_t n = 0; n < N; ++n) {
      if (labels[size_t(n)] == kIgnore) continue;
      for (int64_t v = 0; v < V; ++v) {
        float z = 0;
        for (int64_t k = 0; k < D; ++k) z += hidden[size_t(n * D + k)] * weight[size_t(v * D + k)];
        z = cuda_test::round_bf16({z})[0];  // round_logits
        const float p = std::exp(z - lse_r[size_t(n)]) - (v == labels[size_t(n)] ? 1.f : 0.f);
        dl[size_t(n * V + v)] = cuda_test::round_bf16({float(scale) * p})[0];
      }
    }
    dh_bound = dlogit_rounding_bound(N, D, V, dl, false, weight);
    dw_bound = dlogit_rounding_bound(V, D, N, dl, true, hidden);
  }

  KernelContext ctx = device_services(Device::CUDA).context();
  auto hd = upload(hidden, dtype), wd = upload(weight, dtype);
  const LinearCrossEntropyDims dims{N, V, D, chunk, a.round_logits};
  // Recomputing the logits in backward, and keeping them from forward ([N, V], bf16 when rounded).
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "logits kept" : "logits recomputed");
    DeviceBuffer labels_d(labels), lse_d(size_t(N) * 4), loss_d(size_t(N) * 4), dh_d(size_t(N * D) * 4),
        dw_d(size_t(V * D) * 4), kept(keep ? size_t(N * V) * (bf ? 2 : 4) : 0);
    lse_d.poison(), loss_d.poison(), dh_d.poison(), dw_d.poison();
    if (keep) kept.poison();
    void* kept_logits = keep ? kept.as<void>() : nullptr;
    linear_cross_entropy_fwd(ctx, dims, dtype, hd->as<void>(), wd->as<void>(), labels_d.as<int64_t>(), kIgnore,
                             lse_d.as<float>(), loss_d.as<float>(), kept_logits);
    linear_cross_entropy_bwd(ctx, dims, dtype, hd->as<void>(), wd->as<void>(), labels_d.as<int64_t>(), kIgnore,
                             lse_d.as<float>(), scale, dh_d.as<float>(), dw_d.as<float>(), kept_logits);
    const std::vector<float> lse = lse_d.download<float>();
    // Each row's dlogits are exp(z - lse) - [label]: an lse off by e moves every p of its row by e
    // relative, and the label's term by e p / (1 - p). Said for every shape, so that a gradient
    // mismatch can be told apart from an lse one (the H200's first run left that open).
    double lse_gap = 0;
    for (size_t n = 0; n < lse.size(); ++n) lse_gap = std::max(lse_gap, std::fabs(double(lse[n]) - lse_r[n]));
    std::printf("N %lld V %lld D %lld chunk %lld: max |lse - reference| %.3g\n", (long long)N, (long long)V,
                (long long)D, (long long)chunk, lse_gap);
    expect_close(lse, lse_r, rtol, atol, "lse");
    expect_close(loss_d.download<float>(), loss_r, rtol, atol, "row_loss");
    expect_close(dh_d.download<float>(), dh_r, rtol, atol, "dhidden", dh_bound);
    expect_close(dw_d.download<float>(), dw_r, rtol, atol, "dweight", dw_bound);
  }
  // Kept logits again, with the weight's gradient added to what its buffer holds (a parameter's
  // buffer after an earlier micro-batch) and no dhidden asked for.
  {
    SCOPED_TRACE("logits kept, dweight added, no dhidden");
    const std::vector<float> held = cuda_test::randn(size_t(V * D), 14);
    DeviceBuffer labels_d(labels), lse_d(size_t(N) * 4), loss_d(size_t(N) * 4), dw_d(held),
        kept(size_t(N * V) * (bf ? 2 : 4));
    kept.poison();
    linear_cross_entropy_fwd(ctx, dims, dtype, hd->as<void>(), wd->as<void>(), labels_d.as<int64_t>(),
                             kIgnore, lse_d.as<float>(), loss_d.as<float>(), kept.as<void>());
    linear_cross_entropy_bwd(ctx, dims, dtype, hd->as<void>(), wd->as<void>(), labels_d.as<int64_t>(),
                             kIgnore, lse_d.as<float>(), scale, nullptr, dw_d.as<float>(), kept.as<void>(),
                             /*add_dweight=*/true);
    std::vector<float> want = held;
    for (size_t i = 0; i < want.size(); ++i) want[i] += dw_r[i];
    expect_close(dw_d.download<float>(), want, rtol, atol, "dweight added", dw_bound);
  }
}

// Kept logits against recomputed ones, on the GPU alone, bf16: rounded logits kept (turned into
// dlogits in place, whole-vocabulary GEMMs) and f32 logits kept for bf16 operands (chunk by chunk),
// also over more than 2^31 kept elements (16384 x 131076: the 8 x 2048 tokens of the H200 jobs
// against most of Qwen3's vocabulary). The inputs lie on an eighths grid, so every logit is exact
// either way; what may differ is the order of the f32 sums (row statistics, GEMM accumulation).
TEST(CudaLinearCrossEntropyKept, GivesTheRecomputedLossAndGradients) {
  TITAN_REQUIRE_CUDA();
  struct Case {
    int64_t N, V, D, chunk;
    bool round_logits;
  };
  for (const Case& c :
       {Case{37, 1000, 24, 384, false}, Case{37, 1000, 24, 384, true}, Case{16384, 131076, 64, 8192, true}}) {
    SCOPED_TRACE(::testing::Message()
                 << "N " << c.N << " V " << c.V << " D " << c.D << " round_logits " << c.round_logits);
    const std::vector<float> hidden = on_an_eighths_grid(cuda_test::randn(size_t(c.N * c.D), 21)),
                             weight = on_an_eighths_grid(cuda_test::randn(size_t(c.V * c.D), 22, 0.5));
    const std::vector<int64_t> labels = make_labels(c.N, c.V, 23);
    KernelContext ctx = device_services(Device::CUDA).context();
    auto hd = upload(hidden, DType::BF16), wd = upload(weight, DType::BF16);
    const LinearCrossEntropyDims dims{c.N, c.V, c.D, c.chunk, c.round_logits};
    struct Result {
      std::vector<float> lse, dh, dw;
    };
    auto run = [&](bool keep) {
      DeviceBuffer labels_d(labels), lse_d(size_t(c.N) * 4), loss_d(size_t(c.N) * 4),
          dh_d(size_t(c.N * c.D) * 4), dw_d(size_t(c.V * c.D) * 4),
          kept(keep ? size_t(c.N * c.V) * (c.round_logits ? 2 : 4) : 0);
      if (keep) kept.poison();
      void* kept_logits = keep ? kept.as<void>() : nullptr;
      linear_cross_entropy_fwd(ctx, dims, DType::BF16, hd->as<void>(), wd->as<void>(), labels_d.as<int64_t>(),
                               kIgnore, lse_d.as<float>(), loss_d.as<float>(), kept_logits);
      linear_cross_entropy_bwd(ctx, dims, DType::BF16, hd->as<void>(), wd->as<void>(), labels_d.as<int64_t>(),
                               kIgnore, lse_d.as<float>(), 0.5, dh_d.as<float>(), dw_d.as<float>(),
                               kept_logits);
      return Result{lse_d.download<float>(), dh_d.download<float>(), dw_d.download<float>()};
    };
    const Result recomputed = run(false), kept = run(true);
    expect_close(kept.lse, recomputed.lse, 1e-5, 1e-6, "lse");
    expect_close(kept.dh, recomputed.dh, 1e-2, 1e-3, "dhidden");
    expect_close(kept.dw, recomputed.dw, 1e-2, 1e-3, "dweight");
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLinearCrossEntropy,
                         ::testing::Values(std::make_tuple(DType::F32, 1, 1, 1, 1),
                                           std::make_tuple(DType::F32, 37, 1000, 19, 384),
                                           std::make_tuple(DType::F32, 16, 100, 8, 7),
                                           std::make_tuple(DType::F32, 13, 257, 64, 8192),
                                           std::make_tuple(DType::BF16, 1, 1, 8, 1),
                                           std::make_tuple(DType::BF16, 37, 1000, 24, 384),
                                           std::make_tuple(DType::BF16, 16, 100, 8, 7),
                                           std::make_tuple(DType::BF16, 64, 3000, 128, 1024)));

}  // namespace
}  // namespace titan::cuda

#endif  // TITAN_HAVE_CUDA
