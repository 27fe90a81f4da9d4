// Optimizer passes over one flat f32 buffer of 100M parameters (a Qwen3-0.6B step covers ~6x that):
// the fused AdamW step (reads p, g, m, v; writes p, m, v: 28 bytes per parameter) and the
// gradient-norm pass (reads g: 4 bytes). Both are memory-bound, so the reference point is a trivial
// OpenMP loop with the same traffic ("stream_28B", "stream_read_4B"): the bandwidth this host gives.
//   build/bin/adamw_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include "titan/kernels/registry.h"
#include "titan/ops/optim/optim.h"

using namespace titan;

namespace {

constexpr int64_t kParams = 100'000'000;

struct Buffers {
  Tensor p, g, m, v;
  Buffers()
      : p(Tensor::full({kParams}, 0.02, DType::F32)),
        g(Tensor::full({kParams}, 1e-3, DType::F32)),
        m(Tensor::zeros({kParams}, DType::F32)),
        v(Tensor::zeros({kParams}, DType::F32)) {}
};

Buffers& buffers() {
  static Buffers b;  // 1.6 GB, shared by every benchmark in the program
  return b;
}

const char* kVariants[] = {"default", "portable", "reference"};

void set_rates(benchmark::State& state, double bytes_per_param) {
  state.counters["params"] =
      benchmark::Counter(double(kParams), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB"] = benchmark::Counter(bytes_per_param * double(kParams) / 1e9,
                                            benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AdamW(benchmark::State& state) {
  const char* variant = kVariants[state.range(0)];
  state.SetLabel(variant);
  kernels::ForceVariant force("adamw", variant);
  Buffers& b = buffers();
  ops::AdamWConfig c;
  int64_t step = 0;
  for (auto _ : state) ops::adamw_step(b.p, b.g, b.m, b.v, c, ++step);
  set_rates(state, 28);
}
BENCHMARK(BM_AdamW)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_GradNorm(benchmark::State& state) {
  const char* variant = kVariants[state.range(0)];
  state.SetLabel(variant);
  kernels::ForceVariant force("grad_norm", variant);
  Buffers& b = buffers();
  for (auto _ : state) benchmark::DoNotOptimize(ops::grad_norm_sq(b.g));
  set_rates(state, 4);
}
BENCHMARK(BM_GradNorm)->DenseRange(0, 2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same 4 reads + 3 writes per element with no arithmetic to speak of.
void BM_Stream28B(benchmark::State& state) {
  state.SetLabel("stream_28B");
  Buffers& b = buffers();
  float *p = b.p.data<float>(), *m = b.m.data<float>(), *v = b.v.data<float>();
  const float* g = b.g.data<float>();
  for (auto _ : state) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < kParams; ++i) {
      const float gi = g[i];
      p[i] += gi;
      m[i] += gi;
      v[i] += gi;
    }
    benchmark::ClobberMemory();
  }
  set_rates(state, 28);
}
BENCHMARK(BM_Stream28B)->Unit(benchmark::kMillisecond)->UseRealTime();

// The gradient norm's traffic (one read per element) with an f32 sum: the read bandwidth.
void BM_StreamRead4B(benchmark::State& state) {
  state.SetLabel("stream_read_4B");
  const float* g = buffers().g.data<float>();
  for (auto _ : state) {
    float sum = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
    for (int64_t i = 0; i < kParams; ++i) sum += g[i];
    benchmark::DoNotOptimize(sum);
  }
  set_rates(state, 4);
}
BENCHMARK(BM_StreamRead4B)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
