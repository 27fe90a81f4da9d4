// Causal GQA flash attention on the CPU, shape of issue #2: B=2, Hq=16, S=2048, D=128, Hkv 16 and 8; and
// the README's main job (debugmodel: S=512, Hkv 8).
// FLOPs are counted without causal halving (the convention of issue #2): forward 4*B*Hq*S*S*D,
// backward 2.5x that. The kernels skip masked tiles, so the arithmetic actually done is about half.
//   build/bin/attention_bench --benchmark_filter=F32   (each case takes a few seconds on 2 cores)
// Bf16Probs is the bf16_probs variant (P and dS rounded to bf16, every product on AVX512-BF16).
#include <benchmark/benchmark.h>

#include <random>
#include <type_traits>
#include <vector>

#include "titan/ops/attention/cpu.h"

namespace {

using titan::bf16;
using titan::ops::AttentionShape;

constexpr int64_t kB = 2, kHq = 16, kD = 128;

template <class T>
std::vector<T> random_tensor(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<T> x(n);
  for (auto& e : x) {
    if constexpr (std::is_same_v<T, bf16>)
      e = titan::f32_to_bf16(dist(gen));
    else
      e = dist(gen);
  }
  return x;
}

// Kernel choice: float, bf16 (exact, f32 P and dS) or Bf16Probs (the bf16_probs variant: P and dS in bf16).
struct Bf16Probs {};
template <class K>
using Storage = std::conditional_t<std::is_same_v<K, float>, float, bf16>;

template <class K>
struct Problem {
  using T = Storage<K>;
  AttentionShape s;
  std::vector<T> q, k, v, out, dout, dq, dk, dv;
  std::vector<float> lse;
  Problem(int64_t hkv, int64_t S, int64_t B = kB)
      : s{B, S, kHq, hkv, kD, 1.f / 11.3137085f},
        q(random_tensor<T>(B * S * kHq * kD, 1)),
        k(random_tensor<T>(B * S * hkv * kD, 2)),
        v(random_tensor<T>(B * S * hkv * kD, 3)),
        out(q.size()),
        dout(random_tensor<T>(q.size(), 4)),
        dq(q.size()),
        dk(k.size()),
        dv(k.size()),
        lse(B * kHq * S) {}
  void fwd() { fwd(s, 0); }
  void bwd() { bwd(s, 0); }
  // The kernels on `rows` rows of `length` tokens from flattened token `first` (one document).
  void fwd(const AttentionShape& c, int64_t first) {
    const int64_t qo = first * c.Hq * c.D, ko = first * c.Hkv * c.D, lo = first * c.Hq;
    if constexpr (std::is_same_v<K, Bf16Probs>)
      titan::cpu::attention_fwd_flash_bf16_probs(c, &q[qo], &k[ko], &v[ko], &out[qo], &lse[lo]);
    else if constexpr (std::is_same_v<K, bf16>)
      titan::cpu::attention_fwd_flash_bf16(c, &q[qo], &k[ko], &v[ko], &out[qo], &lse[lo]);
    else
      titan::cpu::attention_fwd_flash_f32(c, &q[qo], &k[ko], &v[ko], &out[qo], &lse[lo]);
  }
  void bwd(const AttentionShape& c, int64_t first) {
    const int64_t qo = first * c.Hq * c.D, ko = first * c.Hkv * c.D, lo = first * c.Hq;
    if constexpr (std::is_same_v<K, Bf16Probs>)
      titan::cpu::attention_bwd_flash_bf16_probs(c, &q[qo], &k[ko], &v[ko], &out[qo], &lse[lo], &dout[qo],
                                                 &dq[qo], &dk[ko], &dv[ko]);
    else if constexpr (std::is_same_v<K, bf16>)
      titan::cpu::attention_bwd_flash_bf16(c, &q[qo], &k[ko], &v[ko], &out[qo], &lse[lo], &dout[qo], &dq[qo],
                                           &dk[ko], &dv[ko]);
    else
      titan::cpu::attention_bwd_flash_f32(c, &q[qo], &k[ko], &v[ko], &out[qo], &lse[lo], &dout[qo], &dq[qo],
                                          &dk[ko], &dv[ko]);
  }
};

double fwd_flops(int64_t S) {
  return 4.0 * kB * kHq * S * S * kD;
}

template <class T>
void BM_Forward(benchmark::State& state) {
  Problem<T> p(state.range(0), state.range(1));
  for (auto _ : state) p.fwd();
  state.counters["FLOP/s"] =
      benchmark::Counter(fwd_flops(state.range(1)), benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void BM_Backward(benchmark::State& state) {
  Problem<T> p(state.range(0), state.range(1));
  p.fwd();
  for (auto _ : state) p.bwd();
  state.counters["FLOP/s"] =
      benchmark::Counter(2.5 * fwd_flops(state.range(1)), benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void BM_ForwardBackward(benchmark::State& state) {
  Problem<T> p(state.range(0), state.range(1));
  for (auto _ : state) {
    p.fwd();
    p.bwd();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(3.5 * fwd_flops(state.range(1)), benchmark::Counter::kIsIterationInvariantRate);
}

// Args: Hkv, S. Wall-clock rates (the kernels are multi-threaded). Two iterations each (16 at S = 512) keep a
// full run near a minute on 2 cores.
#define TITAN_ATTN_BENCH(fn, T)        \
  BENCHMARK_TEMPLATE(fn, T)            \
      ->ArgNames({"Hkv", "S"})         \
      ->Args({16, 2048})               \
      ->Args({8, 2048})                \
      ->Iterations(2)                  \
      ->UseRealTime()                  \
      ->Unit(benchmark::kMillisecond); \
  BENCHMARK_TEMPLATE(fn, T)            \
      ->ArgNames({"Hkv", "S"})         \
      ->Args({8, 512})                 \
      ->Iterations(16)                 \
      ->UseRealTime()                  \
      ->Unit(benchmark::kMillisecond)

// Block-causal attention on packed rows (ops::attention with DocumentSpans): kB rows of S = 4096
// tokens cut into documents of `doc` tokens. calls = 1: what the op does, one kernel call (one
// parallel region) per document; calls = 0: the same documents as kB * S / doc rows of one call, the
// same arithmetic in one parallel region (what a variable-length kernel would schedule). The
// difference is the cost of a region per document. Forward + backward.
template <class T>
void BM_Documents(benchmark::State& state) {
  constexpr int64_t kS = 4096;
  const int64_t doc = state.range(0), docs = kB * kS / doc;
  const bool per_document = state.range(1) != 0;
  Problem<T> p(8, doc, docs);
  AttentionShape one = p.s;
  one.B = 1;
  for (auto _ : state) {
    if (per_document) {
      for (int64_t d = 0; d < docs; ++d) p.fwd(one, d * doc);
      for (int64_t d = 0; d < docs; ++d) p.bwd(one, d * doc);
    } else {
      p.fwd();
      p.bwd();
    }
  }
  state.counters["docs"] = double(docs);
}
#define TITAN_DOCS_BENCH(T)                         \
  BENCHMARK_TEMPLATE(BM_Documents, T)               \
      ->ArgNames({"doc", "calls"})                  \
      ->ArgsProduct({{32, 128, 512, 4096}, {0, 1}}) \
      ->Iterations(4)                               \
      ->UseRealTime()                               \
      ->Unit(benchmark::kMillisecond)
TITAN_DOCS_BENCH(bf16);
TITAN_DOCS_BENCH(Bf16Probs);
TITAN_DOCS_BENCH(float);

TITAN_ATTN_BENCH(BM_Forward, float);
TITAN_ATTN_BENCH(BM_Backward, float);
TITAN_ATTN_BENCH(BM_ForwardBackward, float);
TITAN_ATTN_BENCH(BM_Forward, bf16);
TITAN_ATTN_BENCH(BM_Backward, bf16);
TITAN_ATTN_BENCH(BM_ForwardBackward, bf16);
TITAN_ATTN_BENCH(BM_Forward, Bf16Probs);
TITAN_ATTN_BENCH(BM_Backward, Bf16Probs);
TITAN_ATTN_BENCH(BM_ForwardBackward, Bf16Probs);

}  // namespace
