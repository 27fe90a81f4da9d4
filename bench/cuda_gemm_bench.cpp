// cuBLASLt GEMM throughput (backend/cuda/gemm.h) on the linear layers of one training step, timed
// with CUDA events (bench/cuda_bench_util.h) and printed as a table:
//   - Qwen3-0.6B (8 x 2048 tokens) and Qwen3-4B (2 x 2048 tokens), bf16 operands with f32
//     accumulation: forward Y = X W^T (bf16 out), dX = dY W and dW = dY^T X (f32 out), for q, k/v,
//     o, gate/up, down and one 8192-column chunk of the output projection;
//   - an 8192^3 bf16 product (the ceiling on this GPU) and a 4096^3 f32 one (TF32 off).
// TFLOP/s = 2*M*N*K per call over the time. Operands hold constant values (cuBLASLt's speed does
// not depend on them much: ~10 % between zeros and random data on an H200).
//
//   build/bin/cuda_gemm_bench          # everything (~15 s on an H200)
//   build/bin/cuda_gemm_bench 4B       # rows whose name contains "4B"
// Without a usable GPU it prints why and exits 0.
#include "cuda_bench_util.h"
#include "titan/backend/cuda/gemm.h"

namespace titan::bench {
namespace {

void run(DeviceServices& s, const char* filter) {
  struct Model {
    const char* name;
    int64_t tokens, hidden, q, kv, inter;
  };
  const Model models[] = {{"0.6B", 8 * 2048, 1024, 2048, 1024, 3072}, {"4B", 2 * 2048, 2560, 4096, 1024, 9728}};
  for (const Model& m : models) {
    struct Lin {
      const char* name;
      int64_t in, out;
    };
    const Lin lins[] = {{"q_proj", m.hidden, m.q},      {"k/v_proj", m.hidden, m.kv}, {"o_proj", m.q, m.hidden},
                        {"gate/up", m.hidden, m.inter}, {"down", m.inter, m.hidden},  {"lm_head chunk", m.hidden, 8192}};
    for (const Lin& l : lins) {
      const int64_t M = m.tokens, N = l.out, K = l.in;
      const double flop = 2.0 * double(M) * double(N) * double(K);
      const std::string base = std::string("gemm bf16 ") + m.name + " " + l.name;
      if (!wanted(base, filter)) continue;
      Buffer x(s, size_t(M * K) * 2, 0.01, DType::BF16), w(s, size_t(N * K) * 2, 0.02, DType::BF16);
      Buffer y(s, size_t(M * N) * 2, 0, DType::BF16), dy(s, size_t(M * N) * 2, 0.03, DType::BF16);
      Buffer dx(s, size_t(M * K) * 4, 0, DType::F32), dw(s, size_t(N * K) * 4, 0, DType::F32);
      double ms = time_ms([&] { cuda::gemm(false, true, M, N, K, 1.f, DType::BF16, x.p, K, w.p, K, 0.f, DType::BF16, y.p, N); });
      print_row(base + " fwd", ms, flop / ms * 1e-9, "TFLOP/s");
      ms = time_ms([&] { cuda::gemm(false, false, M, K, N, 1.f, DType::BF16, dy.p, N, w.p, K, 0.f, DType::F32, dx.p, K); });
      print_row(base + " dX", ms, flop / ms * 1e-9, "TFLOP/s");
      ms = time_ms([&] { cuda::gemm(true, false, N, K, M, 1.f, DType::BF16, dy.p, N, x.p, K, 0.f, DType::F32, dw.p, K); });
      print_row(base + " dW", ms, flop / ms * 1e-9, "TFLOP/s");
    }
  }
  const std::string sq = "gemm bf16 8192^3 (ceiling)";
  if (wanted(sq, filter)) {
    const int64_t n = 8192;
    Buffer a(s, size_t(n * n) * 2, 0.01, DType::BF16), b(s, size_t(n * n) * 2, 0.02, DType::BF16),
        c(s, size_t(n * n) * 2, 0, DType::BF16);
    const double ms =
        time_ms([&] { cuda::gemm(false, true, n, n, n, 1.f, DType::BF16, a.p, n, b.p, n, 0.f, DType::BF16, c.p, n); });
    print_row(sq, ms, 2.0 * n * n * n / ms * 1e-9, "TFLOP/s");
  }
  const std::string f32 = "gemm f32 4096^3 (TF32 off)";
  if (wanted(f32, filter)) {
    const int64_t n = 4096;
    Buffer a(s, size_t(n * n) * 4, 0.01, DType::F32), b(s, size_t(n * n) * 4, 0.02, DType::F32),
        c(s, size_t(n * n) * 4, 0, DType::F32);
    const double ms =
        time_ms([&] { cuda::gemm(false, true, n, n, n, 1.f, DType::F32, a.p, n, b.p, n, 0.f, DType::F32, c.p, n); });
    print_row(f32, ms, 2.0 * n * n * n / ms * 1e-9, "TFLOP/s");
  }
}

}  // namespace
}  // namespace titan::bench

int main(int argc, char** argv) {
  using namespace titan;
  if (!bench::gpu_ready("cuda_gemm_bench")) return 0;
  DeviceServices& s = device_services(Device::CUDA);
  bench::print_header();
  bench::run(s, argc > 1 ? argv[1] : nullptr);
  bench::print_memory(s);
  return 0;
}
