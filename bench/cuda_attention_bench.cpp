// Causal GQA attention on the GPU at the Qwen3-0.6B training shape: B=8, S=2048, Hq=16, Hkv=8,
// D=128, bf16 (ops/attention/cuda.h). FLOP/s counts the causal work only (half the S x S
// products): forward 2*B*Hq*S*S*D, backward 2.5x that, the FlashAttention papers' convention
// (bench/attention_bench.cpp on the CPU counts the full square: its rates read 2x these).
//   build/bin/cuda_attention_bench                     (says "skipped" and exits 0 without a GPU)
// Arg algo: 0 = f32 math (warp-per-row f32 kernels), 1 = tensor cores through WMMA (the "default"
// pair), 2 = tensor cores through raw mma.sync (the "mma_sync" pair), 3 = cuDNN's fused attention
// (the "cudnn" variant; its backward includes the f32 <-> bf16 gradient conversions the op pays).
// Built only with the CUDA backend (bench/CMakeLists.txt).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "cuda_bench_util.h"
#include "titan/core/device_services.h"
#include "titan/ops/attention/cuda.h"

namespace {

using titan::bf16;
using titan::Device;
using titan::DeviceServices;
using titan::ops::AttentionShape;

constexpr int64_t kB = 8, kS = 2048, kHq = 16, kHkv = 8, kD = 128;
constexpr double kFwdFlops = 2.0 * kB * kHq * kS * kS * kD;  // causal: half of 4 * B * Hq * S^2 * D

// Device memory for one tensor, freed with the problem.
struct Buffer {
  DeviceServices* dev;
  size_t bytes;
  void* ptr;
  Buffer(DeviceServices* d, size_t n) : dev(d), bytes(n), ptr(d->allocate(n)) {}
  ~Buffer() { dev->deallocate(ptr, bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Uniform in [-1.7, 1.7) (variance ~1): cheap enough for the 33M-element q of this shape.
std::vector<bf16> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<bf16> x(n);
  for (auto& e : x) e = titan::f32_to_bf16(float(gen()) * (3.4f / 4294967296.f) - 1.7f);
  return x;
}

struct Problem {
  DeviceServices* dev;
  titan::KernelContext ctx;
  AttentionShape s{kB, kS, kHq, kHkv, kD, 0.08838834764831845f};
  size_t nq = size_t(kB * kS * kHq * kD), nkv = size_t(kB * kS * kHkv * kD);
  Buffer q, k, v, out, lse, dout, dq, dk, dv;
  Problem()
      : dev(&titan::device_services(Device::CUDA)),
        ctx(dev->context()),
        q(dev, nq * 2),
        k(dev, nkv * 2),
        v(dev, nkv * 2),
        out(dev, nq * 2),
        lse(dev, size_t(kB * kHq * kS) * 4),
        dout(dev, nq * 4),
        dq(dev, nq * 4),
        dk(dev, nkv * 4),
        dv(dev, nkv * 4) {
    auto upload = [&](Buffer& b, const std::vector<bf16>& x) {
      dev->copy_from_host(b.ptr, x.data(), b.bytes);
    };
    upload(q, random_bf16(nq, 1));
    upload(k, random_bf16(nkv, 2));
    upload(v, random_bf16(nkv, 3));
    dev->fill(dout.ptr, int64_t(nq), titan::DType::F32, 1e-3);
  }
  void fwd(int algo) {
    if (algo == 3)
      titan::cuda::attention_fwd_cudnn(ctx, s, static_cast<const bf16*>(q.ptr), static_cast<const bf16*>(k.ptr),
                                       static_cast<const bf16*>(v.ptr), static_cast<bf16*>(out.ptr),
                                       static_cast<float*>(lse.ptr));
    else if (algo == 2)
      titan::cuda::attention_fwd_mma(ctx, s, static_cast<const bf16*>(q.ptr), static_cast<const bf16*>(k.ptr),
                                     static_cast<const bf16*>(v.ptr), static_cast<bf16*>(out.ptr),
                                     static_cast<float*>(lse.ptr));
    else if (algo == 1)
      titan::cuda::attention_fwd_tensor_cores(
          ctx, s, static_cast<const bf16*>(q.ptr), static_cast<const bf16*>(k.ptr),
          static_cast<const bf16*>(v.ptr), static_cast<bf16*>(out.ptr), static_cast<float*>(lse.ptr));
    else
      titan::cuda::attention_fwd_f32_math(ctx, s, titan::DType::BF16, q.ptr, k.ptr, v.ptr, out.ptr,
                                          static_cast<float*>(lse.ptr));
  }
  void bwd(int algo) {
    auto f = [](Buffer& b) { return static_cast<float*>(b.ptr); };
    if (algo == 3)
      titan::cuda::attention_bwd_cudnn(ctx, s, static_cast<const bf16*>(q.ptr), static_cast<const bf16*>(k.ptr),
                                       static_cast<const bf16*>(v.ptr), static_cast<const bf16*>(out.ptr),
                                       f(lse), f(dout), f(dq), f(dk), f(dv));
    else if (algo == 2)
      titan::cuda::attention_bwd_mma(ctx, s, static_cast<const bf16*>(q.ptr), static_cast<const bf16*>(k.ptr),
                                     static_cast<const bf16*>(v.ptr), static_cast<const bf16*>(out.ptr),
                                     f(lse), f(dout), f(dq), f(dk), f(dv));
    else if (algo == 1)
      titan::cuda::attention_bwd_tensor_cores(
          ctx, s, static_cast<const bf16*>(q.ptr), static_cast<const bf16*>(k.ptr),
          static_cast<const bf16*>(v.ptr), static_cast<const bf16*>(out.ptr), f(lse), f(dout), f(dq), f(dk),
          f(dv));
    else
      titan::cuda::attention_bwd_f32_math(ctx, s, titan::DType::BF16, q.ptr, k.ptr, v.ptr, out.ptr, f(lse),
                                          f(dout), f(dq), f(dk), f(dv));
  }
};

// One problem for every case (the host-side random fill is the slow part of a case's set-up).
Problem& problem() {
  static Problem p;
  return p;
}

// Each iteration ends with a device synchronisation.
void BM_Forward(benchmark::State& state) {
  Problem& p = problem();
  const int algo = int(state.range(0));
  p.fwd(algo);  // warm-up (shared-memory opt-in, first launch)
  p.dev->synchronize();
  for (auto _ : state) {
    p.fwd(algo);
    p.dev->synchronize();
  }
  state.counters["FLOP/s"] = benchmark::Counter(kFwdFlops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Backward(benchmark::State& state) {
  Problem& p = problem();
  const int algo = int(state.range(0));
  p.fwd(algo);
  p.bwd(algo);
  p.dev->synchronize();
  for (auto _ : state) {
    p.bwd(algo);
    p.dev->synchronize();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.5 * kFwdFlops, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_ForwardBackward(benchmark::State& state) {
  Problem& p = problem();
  const int algo = int(state.range(0));
  p.fwd(algo);
  p.bwd(algo);
  p.dev->synchronize();
  for (auto _ : state) {
    p.fwd(algo);
    p.bwd(algo);
    p.dev->synchronize();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(3.5 * kFwdFlops, benchmark::Counter::kIsIterationInvariantRate);
}

#define TITAN_CUDA_ATTN_BENCH(fn)                                                            \
  BENCHMARK(fn)->ArgName("algo")->Arg(1)->Arg(2)->Arg(3)->Arg(0)->MinTime(0.3)->UseRealTime()->Unit( \
      benchmark::kMillisecond)
TITAN_CUDA_ATTN_BENCH(BM_Forward);
TITAN_CUDA_ATTN_BENCH(BM_Backward);
TITAN_CUDA_ATTN_BENCH(BM_ForwardBackward);

}  // namespace

int main(int argc, char** argv) {
  if (!titan::bench::gpu_ready("cuda_attention_bench")) return 0;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
