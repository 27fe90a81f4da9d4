// Fused output projection + cross-entropy (ops::linear_cross_entropy), forward + backward through
// autograd, vocab 151936, at the lm_head shapes of a Qwen3-0.6B step (4096 tokens x hidden 1024)
// and of the debug model's (1024 tokens x hidden 256), on every tier of the row loops (softmax,
// exp, bf16 rounding) this CPU runs: `isa` 0 portable, 1 AVX2, 2 AVX-512 (cpu::KernelIsa).
//
//   build/bin/fused_linear_ce_bench                       # f32 and bf16, chunk 8192 (minutes)
//   build/bin/fused_linear_ce_bench --benchmark_filter='bf16/1024/256'
//
// Counters: items/s = tokens/s; GFLOP/s = 6*N*D*V / time (the model FLOPs of a linear layer's
// forward + backward, the convention MFU uses); executed_GFLOP/s = 8*N*D*V / time (the kernel
// recomputes the logits in backward: 2 forward + 2 recompute + 2 dhidden + 2 dweight).
// Each iteration also accumulates into the leaf gradients, as the trainer does.
#include <benchmark/benchmark.h>

#include <string>

#include "titan/autograd/autograd.h"
#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/core/tensor.h"
#include "titan/ops/cross_entropy/cross_entropy.h"

namespace titan {
namespace {

constexpr int64_t kVocab = 151936;

Tensor uniform(const Shape& shape, DType dtype, double scale, uint64_t seed) {
  // Cheap deterministic fill (a 622 MB weight through mt19937 would dominate start-up).
  Tensor t = Tensor::empty(shape, DType::F32);
  float* p = t.data<float>();
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    p[i] = float(scale * (double(s >> 11) / double(1ull << 53) * 2 - 1));
  }
  return t.to(dtype);
}

void BM_FusedLinearCE(benchmark::State& state, DType dtype) {
  const int64_t kTokens = state.range(0), kHidden = state.range(1), chunk = state.range(2);
  const auto isa = cpu::KernelIsa(state.range(3));
  if (isa > cpu::cpu_kernel_isa()) {
    state.SkipWithError("this CPU does not run that tier");
    return;
  }
  cpu::limit_kernel_isa(isa);
  Tensor h = uniform({kTokens, kHidden}, dtype, 1.0, 1);
  Tensor w = uniform({kVocab, kHidden}, dtype, 0.05, 2);
  std::vector<int64_t> y(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) y[size_t(i)] = (i * 7919) % kVocab;
  Tensor labels = Tensor::from_vector(y, {kTokens});
  h.set_requires_grad(true);
  w.set_requires_grad(true);
  double loss = 0;
  for (auto _ : state) {
    Tensor l = ops::linear_cross_entropy(h, w, labels, -100, chunk);
    autograd::backward(l);
    loss = l.item();
  }
  const double iters = double(state.iterations()), ndv = double(kTokens) * kHidden * kVocab;
  state.SetItemsProcessed(int64_t(iters) * kTokens);
  state.counters["GFLOP/s"] = benchmark::Counter(6 * ndv * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["executed_GFLOP/s"] = benchmark::Counter(8 * ndv * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["loss"] = loss;
  state.SetLabel(std::string(cpu::kernel_isa_name(isa)) + " row loops; " + cpu::gemm_describe());
  cpu::limit_kernel_isa(cpu::kHighestKernelIsa);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"tokens", "hidden", "chunk", "isa"});
  for (int64_t isa = 0; isa <= int64_t(cpu::KernelIsa::kAvx512); ++isa) {
    b->Args({4096, 1024, 8192, isa});
    b->Args({1024, 256, 8192, isa});
  }
}

BENCHMARK_CAPTURE(BM_FusedLinearCE, f32, DType::F32)->Apply(shapes)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FusedLinearCE, bf16, DType::BF16)->Apply(shapes)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace
}  // namespace titan
