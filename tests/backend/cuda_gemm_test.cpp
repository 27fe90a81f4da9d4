// cuda::gemm (cuBLASLt, backend/cuda/gemm.h) against a host loop in f64: every transpose
// combination, padded row strides, beta accumulation, strided batches, f32 (TF32 off: the error
// must be f32 summation error, far below TF32's 1e-3), bf16 operands with f32 and bf16 outputs,
// and a misaligned view (a plan for aligned pointers must not be reused for it). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda_test_util.h"
#include "titan/core/device_services.h"
#include "titan/core/dtype.h"
#ifdef TITAN_HAVE_CUDA
#include "titan/backend/cuda/gemm.h"
#endif

namespace titan {
namespace {

#ifdef TITAN_HAVE_CUDA
struct Case {
  bool ta, tb;
  int64_t M, N, K, batch;
  DType ab, c;
  float alpha, beta;
  int64_t pad;           // extra elements at the end of each row (lda/ldb/ldc > the row length)
  int64_t misalign = 0;  // elements by which A is offset from an aligned block
};

// `count` random values in [-1, 1), rounded to dtype (so host and device hold the same numbers).
std::vector<double> random_matrix(int64_t count, DType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<double> v(static_cast<size_t>(count));
  for (auto& x : v) {
    float f = u(rng);
    x = t == DType::BF16 ? double(bf16_to_f32(f32_to_bf16(f))) : double(f);
  }
  return v;
}

void* to_device(DeviceServices& s, const std::vector<double>& v, DType t, int64_t lead_elems, size_t* bytes) {
  const size_t es = dtype_size(t);
  *bytes = (v.size() + size_t(lead_elems)) * es;
  void* p = s.allocate(*bytes);
  std::vector<unsigned char> host(*bytes, 0);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::F32) {
      float f = float(v[i]);
      std::memcpy(&host[(i + size_t(lead_elems)) * es], &f, 4);
    } else {
      bf16 b = f32_to_bf16(float(v[i]));
      std::memcpy(&host[(i + size_t(lead_elems)) * es], &b, 2);
    }
  }
  s.copy_from_host(p, host.data(), *bytes);
  return p;
}

void run_case(const Case& c) {
  DeviceServices& s = device_services(Device::CUDA);
  std::mt19937 rng(uint32_t(c.M * 131 + c.N * 7 + c.K));
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const int64_t sa = a_rows * lda, sb = b_rows * ldb, sc = c.M * ldc;
  auto A = random_matrix(sa * c.batch, c.ab, rng), B = random_matrix(sb * c.batch, c.ab, rng),
       C = random_matrix(sc * c.batch, c.c, rng);
  size_t na, nb, nc;
  void* dA = to_device(s, A, c.ab, c.misalign, &na);
  void* dB = to_device(s, B, c.ab, 0, &nb);
  void* dC = to_device(s, C, c.c, 0, &nc);
  const void* a_ptr = static_cast<char*>(dA) + c.misalign * int64_t(dtype_size(c.ab));
  cuda::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, c.ab, a_ptr, lda, dB, ldb, c.beta, c.c, dC, ldc,
             cuda::GemmBatch{c.batch, sa, sb, sc});
  std::vector<unsigned char> out(nc);
  s.copy_to_host(out.data(), dC, nc);
  double worst = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double a = c.ta ? A[size_t(b * sa + k * lda + i)] : A[size_t(b * sa + i * lda + k)];
          const double bb = c.tb ? B[size_t(b * sb + j * ldb + k)] : B[size_t(b * sb + k * ldb + j)];
          ref += a * bb;
          mag += std::abs(a * bb);
        }
        const size_t ci = size_t(b * sc + i * ldc + j);
        ref = c.alpha * ref + c.beta * C[ci];
        mag = std::abs(c.alpha) * mag + std::abs(c.beta * C[ci]);
        double got;
        if (c.c == DType::F32) {
          float f;
          std::memcpy(&f, &out[ci * 4], 4);
          got = f;
        } else {
          bf16 h;
          std::memcpy(&h, &out[ci * 2], 2);
          got = bf16_to_f32(h);
        }
        // f32 accumulation: K roundings of the running sum; a bf16 output adds one rounding (2^-8).
        const double tol = mag * (double(c.K) * 6e-8 + (c.c == DType::BF16 ? 4e-3 : 0.0)) + 1e-30;
        worst = std::max(worst, std::abs(got - ref) / tol);
      }
  EXPECT_LE(worst, 1.0) << "worst error / tolerance; M=" << c.M << " N=" << c.N << " K=" << c.K
                        << " ta=" << c.ta << " tb=" << c.tb << " batch=" << c.batch << " " << dtype_name(c.ab)
                        << "->" << dtype_name(c.c);
  s.deallocate(dA, na);
  s.deallocate(dB, nb);
  s.deallocate(dC, nc);
}
#endif

TEST(CudaGemm, F32AllTransposesExactAccumulation) {
  TITAN_REQUIRE_CUDA();
#ifdef TITAN_HAVE_CUDA
  for (bool ta : {false, true})
    for (bool tb : {false, true}) run_case({ta, tb, 37, 53, 71, 1, DType::F32, DType::F32, 1.f, 0.f, 0});
#endif
}

TEST(CudaGemm, F32PaddedStridesBetaAndBatches) {
  TITAN_REQUIRE_CUDA();
#ifdef TITAN_HAVE_CUDA
  run_case({false, true, 64, 96, 128, 3, DType::F32, DType::F32, 0.5f, 1.f, 8});
  run_case({true, false, 33, 17, 300, 2, DType::F32, DType::F32, 1.f, 0.25f, 4});
#endif
}

TEST(CudaGemm, Bf16OperandsF32AndBf16Outputs) {
  TITAN_REQUIRE_CUDA();
#ifdef TITAN_HAVE_CUDA
  run_case({false, true, 128, 256, 512, 1, DType::BF16, DType::BF16, 1.f, 0.f, 0});
  run_case({false, false, 96, 64, 256, 1, DType::BF16, DType::F32, 1.f, 0.f, 0});
  run_case({true, false, 64, 128, 192, 4, DType::BF16, DType::F32, 1.f, 1.f, 8});
#endif
}

TEST(CudaGemm, MisalignedOperandGetsItsOwnPlan) {
  TITAN_REQUIRE_CUDA();
#ifdef TITAN_HAVE_CUDA
  run_case({false, true, 64, 64, 64, 1, DType::BF16, DType::F32, 1.f, 0.f, 0, 0});
  run_case({false, true, 64, 64, 64, 1, DType::BF16, DType::F32, 1.f, 0.f, 0, 1});  // 2-byte aligned A
  run_case({false, true, 64, 64, 64, 1, DType::F32, DType::F32, 1.f, 0.f, 0, 1});   // 4-byte aligned A
#endif
}

}  // namespace
}  // namespace titan
