// The routed experts of the MoE speed-floor job on the GPU (ops/moe/cuda.h): 30B-A3B dims, 8 x 2048
// tokens, D 2048, F 768, 64 experts, top-4, bf16, forward and backward (every gradient, the routing
// weights' included), for each grouped-GEMM family: WMMA ("default"), mma_sync (128 x 128 tiles),
// mma_sync_wide (128 x 256), and cuDNN's MoE grouped matmul ("cudnn", with mma_sync for the weight
// gradients). Routing: each token picks 4
// distinct experts uniformly (fixed seed), so the experts hold about T*k/E rows each. TFLOP/s
// counts the GEMM work: forward 3 GEMMs of 2*T*k*D*F; backward 6 (dh, dx over gate and up, and three
// weight gradients; the routing weight's gradient is dh . h per row, with no recompute of the down
// projection's output since 647c7d8: the first H200 figures, 12-05, counted the 7 GEMMs it then ran).
//   build/bin/cuda_moe_bench          (prints why and exits 0 without a GPU)
#include <algorithm>
#include <exception>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_bench_util.h"
#include "titan/ops/moe/cuda.h"

namespace titan::bench {
namespace {

void run(DeviceServices& s) {
  KernelContext ctx = s.context();
  const cuda::MoeExpertDims d{8 * 2048, 2048, 768, 64, 4};
  const int64_t n = d.T * d.k;
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::mt19937 gen(7);
  std::vector<int64_t> experts(static_cast<size_t>(d.E));
  std::iota(experts.begin(), experts.end(), 0);
  for (int64_t t = 0; t < d.T; ++t) {
    std::shuffle(experts.begin(), experts.end(), gen);
    for (int64_t j = 0; j < d.k; ++j) idx[size_t(t * d.k + j)] = experts[size_t(j)];
  }
  Buffer indices(s, idx.size() * 8, 0, DType::I64), weights(s, size_t(n) * 4, 0.25, DType::F32),
      x(s, size_t(d.T * d.D) * 2, 0.5, DType::BF16), wg(s, size_t(d.E * d.F * d.D) * 2, 0.02, DType::BF16),
      wu(s, size_t(d.E * d.F * d.D) * 2, 0.02, DType::BF16),
      wd(s, size_t(d.E * d.D * d.F) * 2, 0.02, DType::BF16), act(s, size_t(n * 2 * d.F) * 2, 0, DType::BF16),
      y(s, size_t(d.T * d.D) * 2, 0, DType::BF16), dy(s, size_t(d.T * d.D) * 4, 0.01, DType::F32),
      dx(s, size_t(d.T * d.D) * 4, 0, DType::F32), dweights(s, size_t(n) * 4, 0, DType::F32),
      dwg(s, size_t(d.E * d.F * d.D) * 4, 0, DType::F32), dwu(s, size_t(d.E * d.F * d.D) * 4, 0, DType::F32),
      dwd(s, size_t(d.E * d.D * d.F) * 4, 0, DType::F32);
  s.copy_from_host(indices.p, idx.data(), indices.n);
  const double gemm = 2.0 * double(n) * double(d.D) * double(d.F);
  auto fwd = [&](cuda::MoeGemm algo) {
    cuda::moe_experts_fwd(ctx, d, DType::BF16, x.p, static_cast<const float*>(weights.p),
                          static_cast<const int64_t*>(indices.p), wg.p, wu.p, wd.p, act.p, y.p, algo);
  };
  auto bwd = [&](cuda::MoeGemm algo) {
    cuda::moe_experts_bwd(ctx, d, DType::BF16, x.p, static_cast<const float*>(weights.p),
                          static_cast<const int64_t*>(indices.p), wg.p, wu.p, wd.p, act.p,
                          static_cast<const float*>(dy.p), static_cast<float*>(dx.p),
                          static_cast<float*>(dweights.p), static_cast<float*>(dwg.p),
                          static_cast<float*>(dwu.p), static_cast<float*>(dwd.p), algo);
  };
  const std::pair<const char*, cuda::MoeGemm> algos[] = {{"wmma", cuda::MoeGemm::kWmma},
                                                         {"mma_sync", cuda::MoeGemm::kMmaSync},
                                                         {"mma_sync_wide", cuda::MoeGemm::kMmaSyncWide},
                                                         {"cudnn", cuda::MoeGemm::kCudnn}};
  for (const auto& [name, algo] : algos) {
    try {
      const double f = time_ms([&] { fwd(algo); });
      print_row(std::string("moe_experts ") + name + " fwd [16384 x top-4, 2048, 768, 64]", f,
                3 * gemm / f * 1e-9, "TFLOP/s");
      const double b = time_ms([&] { bwd(algo); });
      print_row(std::string("moe_experts ") + name + " bwd", b, 6 * gemm / b * 1e-9, "TFLOP/s");
    } catch (const std::exception& e) {
      std::printf("moe_experts %s: failed: %s\n", name, e.what());
    }
  }
}

}  // namespace
}  // namespace titan::bench

int main() {
  using namespace titan;
  if (!bench::gpu_ready("cuda_moe_bench")) return 0;
  DeviceServices& s = device_services(Device::CUDA);
  bench::print_header();
  bench::run(s);
  bench::print_memory(s);
  return 0;
}
