// The CPU rms_norm kernels (forward, and backward with dx and dw), called through the registry as the
// op calls them, on the shapes a step runs: the block norms of debugmodel (2 x 512 tokens, dim 256)
// and of Qwen3-0.6B (2 x 2048 tokens, dim 1024), and the 0.6B's per-head q_norm (16 heads of 128).
// Memory-bound: GB/s = the bytes a call must read and write (each input once, each output once).
//   OMP_NUM_THREADS=2 build/bin/rms_norm_bench
#include <benchmark/benchmark.h>

#include "titan/core/device_services.h"
#include "titan/core/tensor.h"
#include "titan/kernels/registry.h"
#include "titan/ops/rms_norm/rms_norm.h"

using namespace titan;

namespace {

// Args: R, D, bf16 (0 or 1).
struct Problem {
  int64_t R, D;
  DType dt;
  Tensor x, w, y, rstd, dy, dx, dw;
  explicit Problem(const benchmark::State& state)
      : R(state.range(0)),
        D(state.range(1)),
        dt(state.range(2) ? DType::BF16 : DType::F32),
        x(Tensor::full({R, D}, 0.5, dt)),
        w(Tensor::full({D}, 1.0, dt)),
        y(Tensor::empty({R, D}, dt)),
        rstd(Tensor::empty({R}, DType::F32)),
        dy(Tensor::full({R, D}, 0.1, DType::F32)),
        dx(Tensor::empty({R, D}, DType::F32)),
        dw(Tensor::empty({D}, DType::F32)) {}
  const ops::RmsNormKernel& kernel() const {
    return kernels::kernel_for<ops::RmsNormKernel>("rms_norm", Device::CPU, dt, "default");
  }
  double elem_bytes() const { return double(dtype_size(dt)); }
};

void BM_Forward(benchmark::State& state) {
  Problem p(state);
  const auto& k = p.kernel();
  const KernelContext ctx = device_services(Device::CPU).context();
  for (auto _ : state)
    k.forward(ctx, p.R, p.D, 1e-6, p.x.raw_data(), p.w.raw_data(), p.y.raw_data(), p.rstd.raw_data());
  state.counters["GB/s"] = benchmark::Counter(double(p.R * p.D) * 2 * p.elem_bytes(),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Backward(benchmark::State& state) {
  Problem p(state);
  const auto& k = p.kernel();
  const KernelContext ctx = device_services(Device::CPU).context();
  for (auto _ : state)
    k.backward(ctx, p.R, p.D, p.x.raw_data(), p.w.raw_data(), p.rstd.raw_data(), p.dy.raw_data(),
               p.dx.raw_data(), p.dw.raw_data());
  state.counters["GB/s"] = benchmark::Counter(double(p.R * p.D) * (p.elem_bytes() + 4 + 4),
                                              benchmark::Counter::kIsIterationInvariantRate);
}

#define TITAN_RMS_NORM_BENCH(fn)                  \
  BENCHMARK(fn)                                   \
      ->ArgNames({"R", "D", "bf16"})              \
      ->ArgsProduct({{1024}, {256}, {0, 1}})      \
      ->ArgsProduct({{4096}, {1024}, {0, 1}})     \
      ->ArgsProduct({{4096 * 16}, {128}, {0, 1}}) \
      ->UseRealTime()                             \
      ->Unit(benchmark::kMicrosecond)
TITAN_RMS_NORM_BENCH(BM_Forward);
TITAN_RMS_NORM_BENCH(BM_Backward);

}  // namespace
