// GEMM throughput: square 2048^3 and the shapes one Qwen3 training step runs, for every backend.
// Counters: GFLOP/s (2*M*N*K per call over wall time) and peak% (against cpu_info's estimated peak for
// the input dtype; the formula is in src/titan/backend/cpu/cpu_info.h).
//
//   build/bin/matmul_bench --benchmark_min_time=0.3
//   build/bin/matmul_bench --benchmark_filter='2048'          # just the square ones
//   TITAN_GEMM_F32 is ignored here: each f32 benchmark names its backend.
//
// Training shapes, tokens M = 1024 (batch 2 x seq 512), a linear layer Y[M,out] = X[M,in] W[out,in]^T:
//   fwd  Y  = X  W^T    NT  M=1024 N=out K=in
//   dX  dX = dY W       NN  M=1024 N=in  K=out
//   dW  dW = dY^T X     TN  M=out  N=in  K=1024
// for in/out = 1024/3072 (MLP up, Qwen3-0.6B), 3072/1024 (MLP down), 1024/8192 (one lm_head chunk
// of the 151936 vocabulary), 256/3072 (debug model MLP up), 256/8192 (a debug-model lm_head chunk);
// attention score/value products as batches of 16 heads; and TT once, so no Trans combination
// hides a slow path.
#include <benchmark/benchmark.h>

#include <chrono>
#include <random>
#include <type_traits>
#include <string>
#include <vector>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/backend/cpu/gemm.h"

namespace titan::cpu {
namespace {

// gemm.cpp runs A^T products with N <= 256 as NN over transposed panels on AVX2-tier CPUs only.
// The other choice is timed beside the default for the A^T cases: F32OneDnnOwnAt (oneDNN's own A^T
// code; on AVX2 CPUs, the kernel tier capped to portable turns the panels off) or F32OneDnnPanels
// (on AVX-512 CPUs, the tier capped to AVX2 turns them on; oneDNN still runs its AVX-512 code).
// Bf16Widened: the bf16 product through the f32 GEMM (Bf16Backend::WidenToF32), the path titan
// takes where the CPU's bf16 dot product is no faster than its f32 FMA.
enum class Kind { F32OneDnn, F32OneDnnOwnAt, F32OneDnnPanels, F32OpenBlas, Bf16, Bf16Widened, Bf16Out };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::F32OneDnn: return "f32_onednn";
    case Kind::F32OneDnnOwnAt: return "f32_onednn_own_at";
    case Kind::F32OneDnnPanels: return "f32_onednn_panels";
    case Kind::F32OpenBlas: return "f32_openblas";
    case Kind::Bf16: return "bf16";
    case Kind::Bf16Widened:
      return "bf16_widened";
    case Kind::Bf16Out: return "bf16_out";
  }
  return "";
}

struct Case {
  std::string name;
  Trans ta, tb;
  int64_t batch, M, N, K;
};

template <class T>
std::vector<T> random_buffer(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> v(n);
  for (T& x : v) {
    if constexpr (std::is_same_v<T, bf16>) {
      x = f32_to_bf16(dist(rng));
    } else {
      x = dist(rng);
    }
  }
  return v;
}

void run_case(benchmark::State& state, Kind kind, const Case& c) {
  const int64_t a_cols = c.ta == Trans::N ? c.K : c.M, b_cols = c.tb == Trans::N ? c.N : c.K;
  const int64_t sa = c.M * c.K, sb = c.K * c.N, sc = c.M * c.N;
  const bool f32 = kind == Kind::F32OneDnn || kind == Kind::F32OneDnnOwnAt || kind == Kind::F32OneDnnPanels ||
                   kind == Kind::F32OpenBlas;
  set_gemm_f32_backend(kind == Kind::F32OpenBlas ? F32Backend::OpenBLAS : F32Backend::OneDNN);
  const Bf16Backend bf16_default = gemm_bf16_backend();
  if (kind == Kind::Bf16) set_gemm_bf16_backend(Bf16Backend::OneDNN);
  if (kind == Kind::Bf16Widened) set_gemm_bf16_backend(Bf16Backend::WidenToF32);
  limit_kernel_isa(kind == Kind::F32OneDnnOwnAt    ? KernelIsa::kPortable
                   : kind == Kind::F32OneDnnPanels ? KernelIsa::kAvx2
                                                   : kHighestKernelIsa);
  std::vector<float> Af, Bf, C(size_t(c.batch * sc));
  std::vector<bf16> Ab, Bb, Cb;
  if (f32) {
    Af = random_buffer<float>(size_t(c.batch * sa), 1);
    Bf = random_buffer<float>(size_t(c.batch * sb), 2);
  } else {
    Ab = random_buffer<bf16>(size_t(c.batch * sa), 1);
    Bb = random_buffer<bf16>(size_t(c.batch * sb), 2);
    if (kind == Kind::Bf16Out) Cb.resize(size_t(sc));
  }
  auto once = [&] {
    switch (kind) {
      case Kind::F32OneDnn:
      case Kind::F32OneDnnOwnAt:
      case Kind::F32OneDnnPanels:
      case Kind::F32OpenBlas:
        gemm_f32_batched(c.ta, c.tb, c.batch, c.M, c.N, c.K, 1.0f, Af.data(), a_cols, sa, Bf.data(), b_cols, sb,
                         0.0f, C.data(), c.N, sc);
        break;
      case Kind::Bf16:
      case Kind::Bf16Widened:
        gemm_bf16_batched(c.ta, c.tb, c.batch, c.M, c.N, c.K, 1.0f, Ab.data(), a_cols, sa, Bb.data(), b_cols, sb,
                          0.0f, C.data(), c.N, sc);
        break;
      case Kind::Bf16Out:
        gemm_bf16_out(c.ta, c.tb, c.M, c.N, c.K, 1.0f, Ab.data(), a_cols, Bb.data(), b_cols, Cb.data(), c.N);
        break;
    }
  };
  once();  // primitive creation and first-touch page faults stay out of the timing
  // Wall time of the timed loop, measured here so the counters print as plain numbers.
  auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    once();
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double flops = 2.0 * double(c.batch) * double(c.M) * double(c.N) * double(c.K);
  const double rate = flops * double(state.iterations()) / seconds;
  state.counters["GFLOP/s"] = rate * 1e-9;
  state.counters["peak%"] = rate / cpu_info().peak_flops(f32 ? DType::F32 : DType::BF16) * 100;
  set_gemm_f32_backend(F32Backend::OneDNN);
  set_gemm_bf16_backend(bf16_default);
  limit_kernel_isa(kHighestKernelIsa);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T})
      out.push_back({"square", ta, tb, 1, 2048, 2048, 2048});
  struct Layer {
    const char* name;
    int64_t in, out;
  };
  const int64_t tokens = 1024;
  for (Layer l : {Layer{"mlp_up", 1024, 3072}, Layer{"mlp_down", 3072, 1024}, Layer{"lm_head_chunk", 1024, 8192},
                  Layer{"debug_up", 256, 3072}, Layer{"debug_lm_head_chunk", 256, 8192}}) {
    out.push_back({std::string(l.name) + "_fwd", Trans::N, Trans::T, 1, tokens, l.out, l.in});
    out.push_back({std::string(l.name) + "_dx", Trans::N, Trans::N, 1, tokens, l.in, l.out});
    out.push_back({std::string(l.name) + "_dw", Trans::T, Trans::N, 1, l.out, l.in, tokens});
  }
  out.push_back({"mlp_up_tt", Trans::T, Trans::T, 1, tokens, 3072, 1024});
  // Attention per head (seq 512, head_dim 128, 16 heads): S = Q K^T and O = P V.
  out.push_back({"attn_qk_x16", Trans::N, Trans::T, 16, 512, 512, 128});
  out.push_back({"attn_pv_x16", Trans::N, Trans::N, 16, 512, 128, 512});
  return out;
}

const bool registered = [] {
  benchmark::AddCustomContext("cpu", cpu_info().summary());
  benchmark::AddCustomContext("gemm", gemm_describe());
  for (const Case& c : cases()) {
    const Kind other_at = cpu_kernel_isa() == KernelIsa::kAvx2 ? Kind::F32OneDnnOwnAt : Kind::F32OneDnnPanels;
    for (Kind kind :
         {Kind::F32OneDnn, other_at, Kind::F32OpenBlas, Kind::Bf16, Kind::Bf16Widened, Kind::Bf16Out}) {
      if (kind == Kind::Bf16Out && c.batch != 1) continue;
      if (kind == other_at && (c.ta != Trans::T || c.batch != 1 || cpu_kernel_isa() < KernelIsa::kAvx2)) continue;
      std::string name = std::string(kind_name(kind)) + "/" + c.name + "/" + (c.ta == Trans::N ? "N" : "T") +
                         (c.tb == Trans::N ? "N" : "T") + "/M" + std::to_string(c.M) + "_N" + std::to_string(c.N) +
                         "_K" + std::to_string(c.K) + (c.batch > 1 ? "_B" + std::to_string(c.batch) : "");
      benchmark::RegisterBenchmark(name.c_str(), [kind, c](benchmark::State& s) { run_case(s, kind, c); })
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace
}  // namespace titan::cpu
