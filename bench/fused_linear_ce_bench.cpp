// Fused output projection + cross-entropy (ops::linear_cross_entropy), forward + backward through
// autograd, at the lm_head shape of a Qwen3-0.6B step: 4096 tokens x hidden 1024 x vocab 151936.
//
//   build-x/bin/fused_linear_ce_bench                       # f32 and bf16, chunk 8192 (~1 min)
//   build-x/bin/fused_linear_ce_bench --benchmark_filter=bf16
//
// Counters: items/s = tokens/s; GFLOP/s = 6*N*D*V / time (the model FLOPs of a linear layer's
// forward + backward, the convention MFU uses); executed_GFLOP/s = 8*N*D*V / time (the kernel
// recomputes the logits in backward: 2 forward + 2 recompute + 2 dhidden + 2 dweight).
// Each iteration also accumulates into the leaf gradients, as the trainer does.
#include <benchmark/benchmark.h>

#include "titan/autograd/autograd.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/core/tensor.h"
#include "titan/ops/cross_entropy/cross_entropy.h"

namespace titan {
namespace {

constexpr int64_t kTokens = 4096, kHidden = 1024, kVocab = 151936;

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
  const int64_t chunk = state.range(0);
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
  state.SetLabel(cpu::gemm_describe());
}

BENCHMARK_CAPTURE(BM_FusedLinearCE, f32, DType::F32)->Arg(8192)->Unit(benchmark::kSecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_FusedLinearCE, bf16, DType::BF16)->Arg(8192)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace
}  // namespace titan
