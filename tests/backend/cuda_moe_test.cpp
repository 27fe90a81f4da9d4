// CUDA MoE kernels (ops/moe/cuda.h) against the CPU "reference" kernels of ops/moe: router
// forward/backward (with and without expert bias and renormalisation), expert counts, the routing
// order, the aux loss, the experts forward/backward in f32 and bf16, and moe_combine. Skips without
// a GPU.
#include <gtest/gtest.h>

#include <cstdio>

#ifndef TITAN_HAVE_CUDA
TEST(CudaMoe, NeedsTheCudaBackend) {
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
#include "ops/op_test_util.h"
#include "titan/backend/cuda/cudnn_moe.h"
#include "titan/kernels/registry.h"
#include "titan/ops/moe/cuda.h"
#include "titan/ops/moe/moe.h"

namespace titan::cuda {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::expect_close;

std::unique_ptr<DeviceBuffer> upload(const std::vector<float>& x, DType dtype) {
  return dtype == DType::BF16 ? std::make_unique<DeviceBuffer>(cuda_test::to_bf16(x))
                              : std::make_unique<DeviceBuffer>(x);
}
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
std::vector<float> maybe_round(std::vector<float> x, DType dtype) {
  return dtype == DType::BF16 ? cuda_test::round_bf16(x) : x;
}

// (dtype, T, E, k, renormalize, with bias)
class CudaRouter
    : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t, bool, bool> > {};

// Softmax in f32 on both sides: weights, probs and dlogits within 2e-5 relative (the parity
// tolerance of router_topk); random logits have no ties, so the indices match exactly.
TEST_P(CudaRouter, ForwardBackwardAndCounts) {
  TITAN_REQUIRE_CUDA();
  const auto [dtype, T, E, k, renorm, with_bias] = GetParam();
  const std::vector<float> logits = maybe_round(cuda_test::randn(static_cast<size_t>(T * E), 21, 2.0), dtype);
  std::vector<float> bias = cuda_test::randn(static_cast<size_t>(E), 22, 0.05);
  const HostInput host = host_input(logits);
  const auto& ref = kernels::kernel_for<ops::RouterKernel>("router_topk", Device::CPU, dtype, "reference");
  std::vector<float> w_r(static_cast<size_t>(T * k)), p_r(static_cast<size_t>(T * E));
  std::vector<int64_t> idx_r(static_cast<size_t>(T * k)), counts_r(static_cast<size_t>(E));
  const KernelContext cpu = device_services(Device::CPU).context();
  ref.forward(cpu, T, E, k, renorm, host.data(dtype), with_bias ? bias.data() : nullptr, w_r.data(),
              idx_r.data(), p_r.data(), counts_r.data());

  KernelContext ctx = device_services(Device::CUDA).context();
  auto logits_d = upload(logits, dtype);
  DeviceBuffer bias_d(bias), w_d(static_cast<size_t>(T * k) * 4), p_d(static_cast<size_t>(T * E) * 4),
      idx_d(static_cast<size_t>(T * k) * 8), counts_d(static_cast<size_t>(E) * 8);
  router_topk_fwd(ctx, T, E, k, renorm, dtype, logits_d->as<void>(), with_bias ? bias_d.as<float>() : nullptr,
                  w_d.as<float>(), idx_d.as<int64_t>(), p_d.as<float>(), counts_d.as<int64_t>());
  EXPECT_EQ(idx_d.download<int64_t>(), idx_r);
  expect_close(w_d.download<float>(), w_r, 2e-5, 1e-7, "weights");
  expect_close(p_d.download<float>(), p_r, 2e-5, 1e-7, "probs");
  EXPECT_EQ(counts_d.download<int64_t>(), counts_r);

  const std::vector<float> dw = cuda_test::randn(static_cast<size_t>(T * k), 23),
                           dp = cuda_test::randn(static_cast<size_t>(T * E), 24);
  std::vector<float> dl_r(static_cast<size_t>(T * E));
  ref.backward(cpu, T, E, k, renorm, p_r.data(), idx_r.data(), dw.data(), dp.data(), dl_r.data());
  DeviceBuffer dw_d(dw), dp_d(dp), dl_d(static_cast<size_t>(T * E) * 4);
  dl_d.poison();
  router_topk_bwd(ctx, T, E, k, renorm, p_d.as<float>(), idx_d.as<int64_t>(), dw_d.as<float>(),
                  dp_d.as<float>(), dl_d.as<float>());
  expect_close(dl_d.download<float>(), dl_r, 2e-5, 1e-7, "dlogits");
  // Only the weights' gradient (the aux loss unused).
  ref.backward(cpu, T, E, k, renorm, p_r.data(), idx_r.data(), dw.data(), nullptr, dl_r.data());
  router_topk_bwd(ctx, T, E, k, renorm, p_d.as<float>(), idx_d.as<int64_t>(), dw_d.as<float>(), nullptr,
                  dl_d.as<float>());
  expect_close(dl_d.download<float>(), dl_r, 2e-5, 1e-7, "dlogits (no dprobs)");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaRouter,
                         ::testing::Values(std::make_tuple(DType::F32, 1, 1, 1, true, false),
                                           std::make_tuple(DType::F32, 37, 8, 2, true, false),
                                           std::make_tuple(DType::F32, 37, 8, 2, false, true),
                                           std::make_tuple(DType::F32, 64, 128, 8, true, true),
                                           std::make_tuple(DType::BF16, 64, 128, 8, true, false),
                                           std::make_tuple(DType::BF16, 200, 64, 4, false, true),
                                           std::make_tuple(DType::F32, 5, 1000, 16, true, false)));

// A NaN expert bias on some experts (a diverged bias update) makes the lanes' argmax merge
// non-associative: every token must still get k distinct, valid experts, counted once each.
TEST(CudaMoe, ANaNBiasStillChoosesDistinctExperts) {
  TITAN_REQUIRE_CUDA();
  const int64_t T = 256, E = 64, k = 8;
  const std::vector<float> logits = cuda_test::randn(static_cast<size_t>(T * E), 31, 2.0);
  std::vector<float> bias = cuda_test::randn(static_cast<size_t>(E), 32, 0.05);
  for (int64_t e = 1; e < E; e += 3) bias[size_t(e)] = std::nanf("");
  KernelContext ctx = device_services(Device::CUDA).context();
  DeviceBuffer logits_d(logits), bias_d(bias), w_d(static_cast<size_t>(T * k) * 4),
      p_d(static_cast<size_t>(T * E) * 4), idx_d(static_cast<size_t>(T * k) * 8),
      counts_d(static_cast<size_t>(E) * 8);
  router_topk_fwd(ctx, T, E, k, true, DType::F32, logits_d.as<void>(), bias_d.as<float>(), w_d.as<float>(),
                  idx_d.as<int64_t>(), p_d.as<float>(), counts_d.as<int64_t>());
  const std::vector<int64_t> idx = idx_d.download<int64_t>();
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> row(idx.begin() + t * k, idx.begin() + (t + 1) * k);
    for (int64_t e : row) {
      ASSERT_TRUE(e >= 0 && e < E) << "token " << t << " expert " << e;
      ++counts[size_t(e)];
    }
    std::sort(row.begin(), row.end());
    EXPECT_EQ(std::adjacent_find(row.begin(), row.end()), row.end())
        << "token " << t << " has an expert twice";
  }
  EXPECT_EQ(counts_d.download<int64_t>(), counts);
}

TEST(CudaMoe, RoutingOrderMatchesTheHostOrder) {
  TITAN_REQUIRE_CUDA();
  KernelContext ctx = device_services(Device::CUDA).context();
  const ops::MoeDims d{3000, 1, 1, 16, 4};  // more than one 1024-index pass per expert
  std::vector<int64_t> idx(static_cast<size_t>(d.T * d.k));
  std::mt19937 gen(5);
  for (auto& e : idx) e = int64_t(gen() % uint64_t(d.E));
  std::vector<int64_t> order_r(idx.size()), pos_r(idx.size()), off_r(static_cast<size_t>(d.E + 1));
  ops::moe_routing_order(d, idx.data(), order_r.data(), pos_r.data(), off_r.data());
  DeviceBuffer idx_d(idx), order_d(idx.size() * 8), pos_d(idx.size() * 8), off_d(off_r.size() * 8);
  moe_routing_order_cuda(ctx, {d.T, d.D, d.F, d.E, d.k}, idx_d.as<int64_t>(), order_d.as<int64_t>(),
                         pos_d.as<int64_t>(), off_d.as<int64_t>());
  EXPECT_EQ(order_d.download<int64_t>(), order_r);
  EXPECT_EQ(pos_d.download<int64_t>(), pos_r);
  EXPECT_EQ(off_d.download<int64_t>(), off_r);
}

// moe_combine (expert parallelism's weighted sum) on the GPU against the CPU reference: y with the
// same rounding points and order, the rows' and routing weights' gradients (a D-long f32 sum), on
// rows whose expert order differs from their slot order.
TEST(CudaMoe, CombineMatchesTheReference) {
  TITAN_REQUIRE_CUDA();
  const int64_t T = 131, D = 72, E = 8, k = 3;
  const ops::RouterOutput r =
      ops::router_topk(testing::random_tensor({T, E}, DType::F32, 7, -2, 2), k, /*renormalize=*/true);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    testing::expect_device_matches_reference(
        "moe_combine", Device::CUDA,
        [E](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::moe_combine(in[0], in[1], ops::expert_indices(in[2], E))};
        },
        {testing::random_tensor({T * k, D}, dt, 8).set_requires_grad(true),
         r.weights.detach().clone().set_requires_grad(true), r.indices.tensor()},
        1e-7 * double(D), 1e-5);
  }
}

// Three layers of statistics (the last over several 64-row chunks of the column sums, the final
// one partial), then the loss and its gradient, against the formula of ops/moe/moe.h evaluated on the
// host in f64.
TEST(CudaMoe, AuxLossOverLayers) {
  TITAN_REQUIRE_CUDA();
  KernelContext ctx = device_services(Device::CUDA).context();
  const int64_t E = 8, k = 2, T0 = 37, T1 = 20, T2 = 300, N = T0 + T1 + T2;
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  std::vector<double> psum(static_cast<size_t>(E), 0.0);
  DeviceBuffer counts_d(counts), psum_d(psum), loss_d(4);
  std::vector<std::unique_ptr<DeviceBuffer> > keep;
  for (int64_t T : {T0, T1, T2}) {
    std::vector<float> p = cuda_test::randn(static_cast<size_t>(T * E), uint32_t(30 + T));
    for (auto& x : p) x = std::abs(x);
    std::vector<int64_t> idx(static_cast<size_t>(T * k));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t((i * 7 + size_t(T)) % size_t(E));
    for (size_t i = 0; i < p.size(); ++i) psum[i % size_t(E)] += p[i];
    for (int64_t e : idx) ++counts[static_cast<size_t>(e)];
    keep.push_back(std::make_unique<DeviceBuffer>(p));
    keep.push_back(std::make_unique<DeviceBuffer>(idx));
    moe_aux_accumulate(ctx, T, E, k, keep[keep.size() - 2]->as<float>(), keep.back()->as<int64_t>(),
                       counts_d.as<int64_t>(), psum_d.as<double>());
  }
  const double scale = double(E) / (double(N) * double(N));
  moe_aux_finish(ctx, E, scale, counts_d.as<int64_t>(), psum_d.as<double>(), loss_d.as<float>());
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += double(counts[size_t(e)]) * psum[size_t(e)];
  aux *= scale;
  EXPECT_NEAR(loss_d.download<float>()[0], aux, 1e-6 * std::max(1.0, aux));
  EXPECT_EQ(counts_d.download<int64_t>(), counts);

  DeviceBuffer dloss_d(std::vector<float>{2.f}), dp_d(static_cast<size_t>(T0 * E) * 4);
  moe_aux_bwd(ctx, T0, E, scale, counts_d.as<int64_t>(), dloss_d.as<float>(), dp_d.as<float>());
  const std::vector<float> dp = dp_d.download<float>();
  for (int64_t t = 0; t < T0; ++t)
    for (int64_t e = 0; e < E; ++e)
      EXPECT_FLOAT_EQ(dp[size_t(t * E + e)], float(2.0 * scale * double(counts[size_t(e)])));
}

// (dtype, T, D, F, E, k)
using ExpertShape = std::tuple<DType, int64_t, int64_t, int64_t, int64_t, int64_t>;
class CudaMoeExperts : public ::testing::TestWithParam<ExpertShape> {};
// The bf16 grouped GEMMs of the "mma_sync" variant, in test cases of their own (named *Mma*) so
// that a kernel fault there cannot take the default kernels' cases down with it in one process.
class CudaMoeExpertsMma : public ::testing::TestWithParam<ExpertShape> {};
// The same GEMMs on 128 x 256 tiles of 8 warps ("mma_sync_wide").
class CudaMoeExpertsMmaWide : public ::testing::TestWithParam<ExpertShape> {};
// The "cudnn" variant (cuDNN's MoE grouped matmul for the forward GEMMs), likewise on its own (*Cudnn*).
class CudaMoeExpertsCudnn : public ::testing::TestWithParam<ExpertShape> {};

// Forward (y and the saved act) and every gradient vs the reference kernels, with the parity
// tolerances of moe_experts: bf16 1e-2 relative + 1e-2 of max|ref| (a GEMM output rounded to bf16
// may round the other way when summed in another order, and the tensor-core GEMMs of the backward
// round their f32 operands dy*w, dg, du to bf16), f32 1e-5 relative + 1e-7 * max(T, D, F).
void check_experts(const ExpertShape& shape, MoeGemm algo) {
  const auto [dtype, T, D, F, E, k] = shape;
  const ops::MoeDims d{T, D, F, E, k};
  // Routing from the reference router (f32 logits), weights f32 as the model passes them.
  std::vector<float> w(static_cast<size_t>(T * k)), probs(static_cast<size_t>(T * E));
  std::vector<int64_t> idx(static_cast<size_t>(T * k)), counts(static_cast<size_t>(E));
  const KernelContext cpu = device_services(Device::CPU).context();
  {
    const std::vector<float> logits = cuda_test::randn(static_cast<size_t>(T * E), 41, 2.0);
    kernels::kernel_for<ops::RouterKernel>("router_topk", Device::CPU, DType::F32, "reference")
        .forward(cpu, T, E, k, true, logits.data(), nullptr, w.data(), idx.data(), probs.data(),
                 counts.data());
  }
  const double sd = 1.7 / std::sqrt(double(D)), sf = 1.7 / std::sqrt(double(F));
  const auto x = maybe_round(cuda_test::randn(static_cast<size_t>(T * D), 42), dtype);
  const auto wg = maybe_round(cuda_test::randn(static_cast<size_t>(E * F * D), 43, sd), dtype);
  const auto wu = maybe_round(cuda_test::randn(static_cast<size_t>(E * F * D), 44, sd), dtype);
  const auto wd = maybe_round(cuda_test::randn(static_cast<size_t>(E * D * F), 45, sf), dtype);
  // The upstream gradient of a bf16 layer holds bf16 values (as it does in a bf16 model, where it
  // comes from bf16 GEMMs): the GPU rounds dy w to bf16 for its tensor cores, and with f32 values
  // that rounding alone moved dx by 2 % of its scale at T 1, D 8, F 4, k 1 (an emulation of the
  // GPU's rounding points reproduced the H200's 0.020615 against the reference's 0.042084 exactly).
  const auto dy = maybe_round(cuda_test::randn(static_cast<size_t>(T * D), 46), dtype);
  const HostInput hx = host_input(x), hg = host_input(wg), hu = host_input(wu), hd = host_input(wd);
  const bool bf = dtype == DType::BF16;

  const auto& ref =
      kernels::kernel_for<ops::MoeExpertsKernel>("moe_experts", Device::CPU, dtype, "reference");
  const size_t n_act = static_cast<size_t>(T * k * 2 * F);
  std::vector<float> act_r32(n_act), y_r32(static_cast<size_t>(T * D));
  std::vector<bf16> act_r16(n_act), y_r16(static_cast<size_t>(T * D));
  void* act_r = bf ? static_cast<void*>(act_r16.data()) : act_r32.data();
  void* y_r = bf ? static_cast<void*>(y_r16.data()) : y_r32.data();
  ref.forward(cpu, d, hx.data(dtype), w.data(), idx.data(), hg.data(dtype), hu.data(dtype), hd.data(dtype),
              act_r, y_r);
  std::vector<float> dx_r(static_cast<size_t>(T * D)), dw_r(static_cast<size_t>(T * k)),
      dwg_r(static_cast<size_t>(E * F * D)), dwu_r(dwg_r.size()), dwd_r(static_cast<size_t>(E * D * F));
  ref.backward(cpu, d, hx.data(dtype), w.data(), idx.data(), hg.data(dtype), hu.data(dtype), hd.data(dtype),
               act_r, dy.data(), dx_r.data(), dw_r.data(), dwg_r.data(), dwu_r.data(), dwd_r.data(), false);

  KernelContext ctx = device_services(Device::CUDA).context();
  auto x_d = upload(x, dtype), wg_d = upload(wg, dtype), wu_d = upload(wu, dtype), wd_d = upload(wd, dtype);
  const size_t es = bf ? 2 : 4;
  DeviceBuffer w_d(w), idx_d(idx), dy_d(dy), act_d(n_act * es), y_d(static_cast<size_t>(T * D) * es),
      dx_d(dx_r.size() * 4), dw_d(dw_r.size() * 4), dwg_d(dwg_r.size() * 4), dwu_d(dwu_r.size() * 4),
      dwd_d(dwd_r.size() * 4);
  for (DeviceBuffer* b : {&act_d, &y_d, &dx_d, &dw_d, &dwg_d, &dwu_d, &dwd_d}) b->poison();
  const MoeExpertDims dims{T, D, F, E, k};
  const int64_t cudnn_calls = cudnn_grouped_matmul_calls();
  moe_experts_fwd(ctx, dims, dtype, x_d->as<void>(), w_d.as<float>(), idx_d.as<int64_t>(), wg_d->as<void>(),
                  wu_d->as<void>(), wd_d->as<void>(), act_d.as<void>(), y_d.as<void>(), algo);
  moe_experts_bwd(ctx, dims, dtype, x_d->as<void>(), w_d.as<float>(), idx_d.as<int64_t>(), wg_d->as<void>(),
                  wu_d->as<void>(), wd_d->as<void>(), act_d.as<void>(), dy_d.as<float>(), dx_d.as<float>(),
                  dw_d.as<float>(), dwg_d.as<float>(), dwu_d.as<float>(), dwd_d.as<float>(), algo);

  if (algo == MoeGemm::kCudnn) {
    // The cudnn variant really ran cuDNN: the forward's two grouped matmuls (gate | up, down), plus
    // the backward's dx unless cuDNN built no f32-output plan here (then stderr said so); none for a
    // shape it does not take (D or F not a multiple of 8).
    const int64_t calls = cudnn_grouped_matmul_calls() - cudnn_calls;
    if (D % 8 == 0 && F % 8 == 0)
      EXPECT_TRUE(calls == 2 || calls == 3) << calls << " grouped matmuls through cuDNN";
    else
      EXPECT_EQ(calls, 0) << "a shape cuDNN does not take still reached it";
  }
  const double n = double(std::max({T, D, F}));
  const double rtol = bf ? 1e-2 : 1e-5, atol = bf ? 1e-2 : 1e-7 * n;
  auto widen = [&](const DeviceBuffer& b) {
    return bf ? cuda_test::to_f32(b.download<bf16>()) : b.download<float>();
  };
  expect_close(widen(y_d), bf ? cuda_test::to_f32(y_r16) : y_r32, rtol, atol, "y");
  expect_close(widen(act_d), bf ? cuda_test::to_f32(act_r16) : act_r32, rtol, atol, "act");
  expect_close(dx_d.download<float>(), dx_r, rtol, atol, "dx");
  expect_close(dw_d.download<float>(), dw_r, rtol, atol, "dweights");
  expect_close(dwg_d.download<float>(), dwg_r, rtol, atol, "dw_gate");
  expect_close(dwu_d.download<float>(), dwu_r, rtol, atol, "dw_up");
  expect_close(dwd_d.download<float>(), dwd_r, rtol, atol, "dw_down");

  // The weight gradients added to what the buffers hold (parameters' gradient buffers,
  // add_dweights): held + the same gradients, an expert without rows keeping what it held.
  const auto held_g = cuda_test::randn(dwg_r.size(), 47), held_u = cuda_test::randn(dwu_r.size(), 48),
             held_d = cuda_test::randn(dwd_r.size(), 49);
  DeviceBuffer add_g(held_g), add_u(held_u), add_d(held_d);
  moe_experts_bwd(ctx, dims, dtype, x_d->as<void>(), w_d.as<float>(), idx_d.as<int64_t>(), wg_d->as<void>(),
                  wu_d->as<void>(), wd_d->as<void>(), act_d.as<void>(), dy_d.as<float>(), nullptr, nullptr,
                  add_g.as<float>(), add_u.as<float>(), add_d.as<float>(), algo, /*add_dweights=*/true);
  auto plus = [](std::vector<float> held, const std::vector<float>& g) {
    for (size_t i = 0; i < held.size(); ++i) held[i] += g[i];
    return held;
  };
  expect_close(add_g.download<float>(), plus(held_g, dwg_r), rtol, atol, "dw_gate added");
  expect_close(add_u.download<float>(), plus(held_u, dwu_r), rtol, atol, "dw_up added");
  expect_close(add_d.download<float>(), plus(held_d, dwd_r), rtol, atol, "dw_down added");
}

TEST_P(CudaMoeExperts, ForwardAndBackward) {
  TITAN_REQUIRE_CUDA();
  check_experts(GetParam(), MoeGemm::kWmma);
}
TEST_P(CudaMoeExpertsMma, ForwardAndBackward) {
  TITAN_REQUIRE_CUDA();
  check_experts(GetParam(), MoeGemm::kMmaSync);
}
TEST_P(CudaMoeExpertsMmaWide, ForwardAndBackward) {
  TITAN_REQUIRE_CUDA();
  check_experts(GetParam(), MoeGemm::kMmaSyncWide);
}

// An f32 upstream gradient (the model's, before any GEMM rounded it) reaches the down projection's
// weight gradient rounded as the CPU kernel rounds it, T(T(w) T(dy)), not T(T(w) dy). One routing
// row per expert makes each dw_down element one exact product (bf16 x bf16 in f32), and gates of 32
// make h = T(silu(32) u) = 32 u exact, so the GPU, the CPU "default" kernel and the host formula must
// agree bit for bit; dy[0] = 1.005859375 with w = 1.5 is a case the two roundings tell apart
// (1.515625 against 1.5078125).
TEST(CudaMoeMma, TheDownProjectionsGradientRoundsAnF32DyOnceAsTheCpuKernel) {
  TITAN_REQUIRE_CUDA();
  const int64_t T = 3, D = 64, F = 16, E = 3, k = 1;
  const std::vector<float> w{1.5f, 0.75f, 1.25f};
  const std::vector<int64_t> idx{0, 1, 2};
  std::vector<float> dy = cuda_test::randn(static_cast<size_t>(T * D), 61);  // f32, not rounded
  dy[0] = 1.005859375f;
  const auto x = cuda_test::round_bf16(cuda_test::randn(static_cast<size_t>(T * D), 62));
  const auto wg = cuda_test::round_bf16(cuda_test::randn(static_cast<size_t>(E * F * D), 63, 0.2));
  const auto wu = cuda_test::round_bf16(cuda_test::randn(static_cast<size_t>(E * F * D), 64, 0.2));
  const auto wd = cuda_test::round_bf16(cuda_test::randn(static_cast<size_t>(E * D * F), 65, 0.2));
  std::vector<float> act = cuda_test::round_bf16(cuda_test::randn(static_cast<size_t>(T * 2 * F), 66));
  for (int64_t r = 0; r < T; ++r)
    for (int64_t f = 0; f < F; ++f) act[static_cast<size_t>(r * 2 * F + f)] = 32.f;  // the gates
  // The host formula: dw_down[e][d][f] = T(T(w) T(dy[d])) * 32 u[f] for expert e's one row.
  std::vector<float> want(static_cast<size_t>(E * D * F));
  for (int64_t r = 0; r < T; ++r)
    for (int64_t dd = 0; dd < D; ++dd)
      for (int64_t f = 0; f < F; ++f) {
        const float dyw =
            bf16_to_f32(f32_to_bf16(w[size_t(r)] * bf16_to_f32(f32_to_bf16(dy[size_t(r * D + dd)]))));
        want[static_cast<size_t>((idx[size_t(r)] * D + dd) * F + f)] =
            dyw * (32.f * act[size_t(r * 2 * F + F + f)]);
      }
  const size_t w_down_at = static_cast<size_t>(idx[0] * D * F);  // element (e 0, d 0, f 0)
  ASSERT_NE(want[w_down_at], bf16_to_f32(f32_to_bf16(1.5f * dy[0])) * 32.f * act[size_t(F)])
      << "the case no longer tells the two roundings apart";

  const ops::MoeDims d{T, D, F, E, k};
  const KernelContext cpu = device_services(Device::CPU).context();
  const HostInput hx = host_input(x), hg = host_input(wg), hu = host_input(wu), hd = host_input(wd),
                  ha = host_input(act);
  std::vector<float> dwd_cpu(want.size());
  kernels::kernel_for<ops::MoeExpertsKernel>("moe_experts", Device::CPU, DType::BF16, "default")
      .backward(cpu, d, hx.data(DType::BF16), w.data(), idx.data(), hg.data(DType::BF16),
                hu.data(DType::BF16), hd.data(DType::BF16), ha.data(DType::BF16), dy.data(), nullptr, nullptr,
                nullptr, nullptr, dwd_cpu.data(), false);
  EXPECT_EQ(dwd_cpu, want) << "the CPU kernel";

  KernelContext ctx = device_services(Device::CUDA).context();
  auto x_d = upload(x, DType::BF16), wg_d = upload(wg, DType::BF16), wu_d = upload(wu, DType::BF16),
       wd_d = upload(wd, DType::BF16), act_d = upload(act, DType::BF16);
  DeviceBuffer w_d(w), idx_d(idx), dy_d(dy), dwd_d(want.size() * 4);
  dwd_d.poison();
  moe_experts_bwd(ctx, MoeExpertDims{T, D, F, E, k}, DType::BF16, x_d->as<void>(), w_d.as<float>(),
                  idx_d.as<int64_t>(), wg_d->as<void>(), wu_d->as<void>(), wd_d->as<void>(),
                  act_d->as<void>(), dy_d.as<float>(), nullptr, nullptr, nullptr, nullptr, dwd_d.as<float>(),
                  MoeGemm::kMmaSync);
  EXPECT_EQ(dwd_d.download<float>(), want) << "the GPU";
}

// cuDNN's grouped matmul alone against a loop on the host: out[r] = tokens[r] W[e]^T for the rows of
// each expert, with empty experts (first, middle, last), a bf16 and an f32 output (cuDNN documents
// bf16 outputs only: an f32 plan that does not build is said and skipped, as the variant runs those
// GEMMs on mma_sync). Skipped, saying why, where the loaded cuDNN has no grouped matmul (before 9.18).
TEST(CudaMoeCudnn, GroupedMatmulMatchesAHostLoop) {
  TITAN_REQUIRE_CUDA();
  if (const std::string why = cudnn_grouped_matmul_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const int64_t K = 72, N = 40, E = 6;
  const std::vector<int32_t> counts = {0, 17, 64, 0, 30, 0};  // rows per expert
  std::vector<int32_t> first(static_cast<size_t>(E));
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) first[size_t(e)] = int32_t(rows), rows += counts[size_t(e)];
  const auto tokens = cuda_test::round_bf16(cuda_test::randn(static_cast<size_t>(rows * K), 61));
  const auto w = cuda_test::round_bf16(cuda_test::randn(static_cast<size_t>(E * N * K), 62, 0.2));
  std::vector<float> ref(static_cast<size_t>(rows * N));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = first[size_t(e)]; r < first[size_t(e)] + counts[size_t(e)]; ++r)
      for (int64_t c = 0; c < N; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) acc += double(tokens[size_t(r * K + j)]) * w[size_t((e * N + c) * K + j)];
        ref[size_t(r * N + c)] = float(acc);
      }
  DeviceBuffer tokens_d(cuda_test::to_bf16(tokens)), w_d(cuda_test::to_bf16(w)), first_d(first);
  KernelContext ctx = device_services(Device::CUDA).context();
  for (DType out : {DType::BF16, DType::F32}) {
    const GroupedMatmulShape shape{rows, K, N, E, N, out};
    if (out == DType::F32)
      if (const std::string why = cudnn_grouped_matmul_plan_error(shape); !why.empty()) {
        std::printf("f32 output not checked: its plan did not build: %s\n", why.c_str());
        continue;
      }
    DeviceBuffer out_d(static_cast<size_t>(rows * N) * dtype_size(out));
    out_d.poison();
    cudnn_grouped_matmul(ctx.stream, shape, tokens_d.as<void>(), w_d.as<void>(), first_d.as<int32_t>(),
                         out_d.as<void>());
    const std::vector<float> got =
        out == DType::BF16 ? cuda_test::to_f32(out_d.download<bf16>()) : out_d.download<float>();
    // f32 accumulation in another order; a bf16 output rounded once more.
    expect_close(got, out == DType::BF16 ? cuda_test::round_bf16(ref) : ref, out == DType::BF16 ? 1e-2 : 1e-4,
                 1e-3, std::string(dtype_name(out)));
  }
}

TEST_P(CudaMoeExpertsCudnn, ForwardAndBackward) {
  TITAN_REQUIRE_CUDA();
  if (const std::string why = cudnn_grouped_matmul_unavailable(); !why.empty()) GTEST_SKIP() << why;
  check_experts(GetParam(), MoeGemm::kCudnn);
}

// The parity shapes, plus one with several 64-row tiles per expert and an expert likely left empty.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeExperts,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16),
                                            ::testing::Values(1, 37, 300), ::testing::Values(8, 72),
                                            ::testing::Values(4, 40), ::testing::Values(3, 8, 40),
                                            ::testing::Values(1, 2)));
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeExpertsMma,
                         ::testing::Combine(::testing::Values(DType::BF16), ::testing::Values(1, 37, 300),
                                            ::testing::Values(8, 72), ::testing::Values(4, 40),
                                            ::testing::Values(3, 8, 40), ::testing::Values(1, 2)));
// bf16 GEMMs spanning several 128-column tiles and 32-deep K steps (D and F multiples of 8, not of
// the tile sizes; more K steps than mma_sync's four pipeline stages), experts holding several
// 64-row tiles, and at T 1000 several 128-row tiles (and weight-gradient reductions of 20+ steps).
INSTANTIATE_TEST_SUITE_P(LargeTiles, CudaMoeExperts,
                         ::testing::Combine(::testing::Values(DType::BF16), ::testing::Values(300),
                                            ::testing::Values(264), ::testing::Values(136),
                                            ::testing::Values(3, 8), ::testing::Values(2)));
INSTANTIATE_TEST_SUITE_P(LargeTiles, CudaMoeExpertsMma,
                         ::testing::Combine(::testing::Values(DType::BF16), ::testing::Values(300, 1000),
                                            ::testing::Values(264), ::testing::Values(136),
                                            ::testing::Values(3, 8), ::testing::Values(2)));
// The wide tiles: every path of the small shapes (the WMMA fallback included) once per dims, and
// GEMMs over several 256-column tiles (D 264 and 520, F 136 and 264: one tile and a partial one).
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeExpertsMmaWide,
                         ::testing::Combine(::testing::Values(DType::BF16), ::testing::Values(37, 300),
                                            ::testing::Values(8, 72), ::testing::Values(4, 40),
                                            ::testing::Values(8), ::testing::Values(2)));
INSTANTIATE_TEST_SUITE_P(LargeTiles, CudaMoeExpertsMmaWide,
                         ::testing::Combine(::testing::Values(DType::BF16), ::testing::Values(300, 1000),
                                            ::testing::Values(264, 520), ::testing::Values(136, 264),
                                            ::testing::Values(3), ::testing::Values(2)));

// An odd expert hidden size: the up projection's half of the fused output starts at an odd column
// (no two-column stores) and the gate's last column is a one-column tail; the backward GEMMs over
// K = 13 fall back to WMMA.
INSTANTIATE_TEST_SUITE_P(OddHidden, CudaMoeExpertsMma,
                         ::testing::Values(ExpertShape{DType::BF16, 37, 72, 13, 8, 2}));
INSTANTIATE_TEST_SUITE_P(OddHidden, CudaMoeExpertsMmaWide,
                         ::testing::Values(ExpertShape{DType::BF16, 37, 72, 13, 8, 2}));

// D and F multiples of 8 (cuDNN's grouped matmul): fewer rows than experts (3 tokens x top-2 over
// 8: at least two experts empty), one row tile per expert, several; and a shape it does not take
// (F = 4: those GEMMs run mma_sync). Few shapes: each builds its own plans (a runtime compile).
INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeExpertsCudnn,
                         ::testing::Values(ExpertShape{DType::BF16, 3, 72, 40, 8, 2},
                                           ExpertShape{DType::BF16, 37, 72, 40, 8, 2},
                                           ExpertShape{DType::BF16, 300, 264, 136, 8, 2}));
INSTANTIATE_TEST_SUITE_P(Fallback, CudaMoeExpertsCudnn,
                         ::testing::Combine(::testing::Values(DType::BF16), ::testing::Values(37),
                                            ::testing::Values(8), ::testing::Values(4), ::testing::Values(3),
                                            ::testing::Values(1)));

}  // namespace
}  // namespace titan::cuda

#endif  // TITAN_HAVE_CUDA
