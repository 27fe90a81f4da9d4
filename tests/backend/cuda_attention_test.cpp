// CUDA attention kernels (ops/attention/cuda.h) against the CPU f32 reference
// (ops/attention/cpu.h), forward and backward, f32 and bf16, both algorithms. Skips without a GPU.
#include <gtest/gtest.h>

#ifndef TITAN_HAVE_CUDA
TEST(CudaAttention, NeedsTheCudaBackend) {
  GTEST_SKIP() << "built without the CUDA backend (TITAN_CUDA off, or no nvcc)";
}
#else

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda_kernel_test_util.h"
#include "backend/cuda_test_util.h"
#include "titan/ops/attention/cpu.h"
#include "titan/ops/attention/cuda.h"

namespace titan::cuda {
namespace {

using cuda_test::DeviceBuffer;
using cuda_test::expect_close;

// kTensorCores: the WMMA pair ("default"); kMma: the mma.sync pair ("mma_sync"); kCudnn: cuDNN's
// fused attention ("cudnn").
enum class Algo { kF32Math, kTensorCores, kMma, kCudnn };

struct Case {
  AttentionShape dims;
  DType dtype;
  Algo algo;
};

// Runs forward and backward on the GPU and on the CPU reference (on the same, possibly
// bf16-rounded, inputs) and compares out, lse, dq, dk, dv with the algorithm's tolerance:
//  - f32 math on f32: only summation order differs: 2e-5 relative + 2e-5 of max|ref|;
//  - f32 math on bf16: out is rounded once (2^-9): 4e-3 relative + 1e-4 of max|ref|; the gradients
//    are f32 from f32 math: as f32;
//  - tensor cores: P, dS and dout are rounded to bf16 before their products (the CPU bf16_probs
//    numerics): 1e-2 relative + 1e-2 of max|ref|, as tests/backend/attention_test.cpp states.
void run_case(const Case& c) {
  const AttentionShape& s = c.dims;
  const size_t nq = size_t(s.B * s.S * s.Hq * s.D), nkv = size_t(s.B * s.S * s.Hkv * s.D),
               nlse = size_t(s.B * s.Hq * s.S);
  std::vector<float> q = cuda_test::randn(nq, 1), k = cuda_test::randn(nkv, 2), v = cuda_test::randn(nkv, 3),
                     dout = cuda_test::randn(nq, 4);
  const bool bf = c.dtype == DType::BF16;
  if (bf) q = cuda_test::round_bf16(q), k = cuda_test::round_bf16(k), v = cuda_test::round_bf16(v);

  // Reference.
  std::vector<float> out_r(nq), lse_r(nlse), dq_r(nq), dk_r(nkv), dv_r(nkv);
  cpu::attention_fwd_reference_f32(s, q.data(), k.data(), v.data(), out_r.data(), lse_r.data());

  // GPU forward.
  KernelContext ctx = device_services(Device::CUDA).context();
  auto upload = [&](const std::vector<float>& x) {
    return bf ? std::make_unique<DeviceBuffer>(cuda_test::to_bf16(x)) : std::make_unique<DeviceBuffer>(x);
  };
  auto qd = upload(q), kd = upload(k), vd = upload(v);
  DeviceBuffer out_d(nq * (bf ? 2 : 4)), lse_d(nlse * 4), dout_d(dout), dq_d(nq * 4), dk_d(nkv * 4),
      dv_d(nkv * 4);
  out_d.poison(), lse_d.poison(), dq_d.poison(), dk_d.poison(), dv_d.poison();
  if (c.algo == Algo::kTensorCores)
    attention_fwd_tensor_cores(ctx, s, qd->as<bf16>(), kd->as<bf16>(), vd->as<bf16>(), out_d.as<bf16>(),
                               lse_d.as<float>());
  else if (c.algo == Algo::kCudnn)
    attention_fwd_cudnn(ctx, s, qd->as<bf16>(), kd->as<bf16>(), vd->as<bf16>(), out_d.as<bf16>(),
                        lse_d.as<float>());
  else if (c.algo == Algo::kMma)
    attention_fwd_mma(ctx, s, qd->as<bf16>(), kd->as<bf16>(), vd->as<bf16>(), out_d.as<bf16>(),
                      lse_d.as<float>());
  else
    attention_fwd_f32_math(ctx, s, c.dtype, qd->as<void>(), kd->as<void>(), vd->as<void>(), out_d.as<void>(),
                           lse_d.as<float>());
  const std::vector<float> out_g = bf ? cuda_test::to_f32(out_d.download<bf16>()) : out_d.download<float>();
  const std::vector<float> lse_g = lse_d.download<float>();

  const bool tc = c.algo != Algo::kF32Math;
  const double out_rtol = tc ? 1e-2 : (bf ? 4e-3 : 2e-5), out_atol = tc ? 1e-2 : (bf ? 1e-4 : 2e-5);
  const double grad_tol = tc ? 1e-2 : 2e-5;
  expect_close(out_g, out_r, out_rtol, out_atol, "out");
  expect_close(lse_g, lse_r, 2e-5, 2e-5, "lse");

  // Backward from the GPU's own out and lse (what the op saves); the reference gets the same.
  if (c.algo == Algo::kCudnn)
    attention_bwd_cudnn(ctx, s, qd->as<bf16>(), kd->as<bf16>(), vd->as<bf16>(), out_d.as<bf16>(),
                        lse_d.as<float>(), dout_d.as<float>(), dq_d.as<float>(), dk_d.as<float>(),
                        dv_d.as<float>());
  else if (c.algo == Algo::kMma)
    attention_bwd_mma(ctx, s, qd->as<bf16>(), kd->as<bf16>(), vd->as<bf16>(), out_d.as<bf16>(),
                      lse_d.as<float>(), dout_d.as<float>(), dq_d.as<float>(), dk_d.as<float>(),
                      dv_d.as<float>());
  else if (tc)
    attention_bwd_tensor_cores(ctx, s, qd->as<bf16>(), kd->as<bf16>(), vd->as<bf16>(), out_d.as<bf16>(),
                               lse_d.as<float>(), dout_d.as<float>(), dq_d.as<float>(), dk_d.as<float>(),
                               dv_d.as<float>());
  else
    attention_bwd_f32_math(ctx, s, c.dtype, qd->as<void>(), kd->as<void>(), vd->as<void>(), out_d.as<void>(),
                           lse_d.as<float>(), dout_d.as<float>(), dq_d.as<float>(), dk_d.as<float>(),
                           dv_d.as<float>());
  // The tensor-core kernels round dout to bf16 for their products; the reference sees the same dout.
  const std::vector<float> dout_r = tc ? cuda_test::round_bf16(dout) : dout;
  cpu::attention_bwd_reference_f32(s, q.data(), k.data(), v.data(), out_g.data(), lse_g.data(), dout_r.data(),
                                   dq_r.data(), dk_r.data(), dv_r.data());
  expect_close(dq_d.download<float>(), dq_r, grad_tol, grad_tol, "dq");
  expect_close(dk_d.download<float>(), dk_r, grad_tol, grad_tol, "dk");
  expect_close(dv_d.download<float>(), dv_r, grad_tol, grad_tol, "dv");
}

// (GQA ratio, head_dim, sequence length)
using Param = std::tuple<int, int, int>;

AttentionShape dims_of(const Param& p) {
  const auto [r, D, S] = p;
  const int64_t hq = std::max(4, r);
  return {2, S, hq, hq / r, D, float(1.0 / std::sqrt(double(D)))};
}

class CudaAttentionF32Math : public ::testing::TestWithParam<Param> {};
TEST_P(CudaAttentionF32Math, F32) {
  TITAN_REQUIRE_CUDA();
  run_case({dims_of(GetParam()), DType::F32, Algo::kF32Math});
}
TEST_P(CudaAttentionF32Math, Bf16) {
  TITAN_REQUIRE_CUDA();
  run_case({dims_of(GetParam()), DType::BF16, Algo::kF32Math});
}
// Odd head_dims (8, 25, 200) use partial lanes, 512 the widest lanes (16 columns each) and the
// largest shared-memory request (~160 KiB); lengths around the 8-row block and 32-row tile.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionF32Math,
                         ::testing::Combine(::testing::Values(1, 2, 8),
                                            ::testing::Values(8, 25, 64, 128, 200, 512),
                                            ::testing::Values(1, 7, 33, 100)));

class CudaAttentionTensorCores : public ::testing::TestWithParam<Param> {};
TEST_P(CudaAttentionTensorCores, Bf16) {
  TITAN_REQUIRE_CUDA();
  run_case({dims_of(GetParam()), DType::BF16, Algo::kTensorCores});
}
TEST_P(CudaAttentionTensorCores, Bf16Mma) {
  TITAN_REQUIRE_CUDA();
  run_case({dims_of(GetParam()), DType::BF16, Algo::kMma});
}
// Lengths around the 64-row tile: one partial tile, exact tiles, a partial last tile.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionTensorCores,
                         ::testing::Combine(::testing::Values(1, 2, 4, 8), ::testing::Values(64, 128),
                                            ::testing::Values(1, 7, 64, 100, 257)));
// The 0.6B job's GQA ratio and head_dim at a length of 18 tiles (the last partial): up to 18 blocks
// add into each dq row, as at the job's 2048 (32).
INSTANTIATE_TEST_SUITE_P(LongSequence, CudaAttentionTensorCores,
                         ::testing::Combine(::testing::Values(2), ::testing::Values(128),
                                            ::testing::Values(1100)));

// cuDNN's fused attention on whole 128-row tiles (every cuDNN 9), and on the tensor-core suite's
// ragged lengths where the loaded cuDNN takes them (9.16 and later; skipped, saying so, before).
class CudaAttentionCudnn : public ::testing::TestWithParam<Param> {};
TEST_P(CudaAttentionCudnn, Bf16) {
  TITAN_REQUIRE_CUDA();
  const AttentionShape s = dims_of(GetParam());
  const std::string why = attention_cudnn_unsupported(s);
  if (!why.empty()) GTEST_SKIP() << why;
  run_case({s, DType::BF16, Algo::kCudnn});
}
// (Each shape builds its own plans, a runtime compile of cuDNN's kernels: few shapes.)
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionCudnn,
                         ::testing::Combine(::testing::Values(1, 2, 8), ::testing::Values(64, 128),
                                            ::testing::Values(128, 384, 100)));

TEST(CudaAttention, CudnnRejectsHeadDimsItsEnginesDoNotTake) {
  EXPECT_NE(attention_cudnn_unsupported({1, 8, 2, 1, 100, 0.1f}), "");  // not a multiple of 8
  EXPECT_NE(attention_cudnn_unsupported({1, 8, 2, 1, 256, 0.1f}), "");
  EXPECT_NE(attention_cudnn_unsupported({1, 256, 6, 4, 64, 0.1f}), "");  // 6 query heads on 4 kv heads
  EXPECT_NE(attention_cudnn_unsupported({1, 1, 2, 1, 64, 0.1f}), "");    // no backward over one row
  // Whole 128-row tiles suit every cuDNN 9 (other lengths depend on the loaded release).
  EXPECT_EQ(attention_cudnn_unsupported({1, 256, 2, 1, 128, 0.1f}), "");
  EXPECT_EQ(attention_cudnn_unsupported({1, 128, 4, 2, 64, 0.1f}), "");
}

TEST(CudaAttention, TensorCoresRejectOtherHeadDims) {
  EXPECT_NE(attention_tensor_cores_unsupported({1, 8, 2, 1, 96, 0.1f}, DType::BF16), "");
  EXPECT_NE(attention_tensor_cores_unsupported({1, 8, 2, 1, 128, 0.1f}, DType::F32), "");
  EXPECT_EQ(attention_tensor_cores_unsupported({1, 8, 2, 1, 128, 0.1f}, DType::BF16), "");
}

}  // namespace
}  // namespace titan::cuda

#endif  // TITAN_HAVE_CUDA
