// Fast linear kernels: the op's three matmuls on the GEMM backend (oneDNN / OpenBLAS).
//   forward  Y[M,N]  = X[M,K] W[N,K]^T
//   backward dX[M,K] = dY[M,N] W[N,K]      dW[N,K] = dY^T[N,M] X[M,K]
// bf16: bf16 operands, f32 accumulation; the f32 upstream gradient is rounded to bf16 once
// (what a bf16 autograd hands a bf16 matmul), dX and dW come out in f32.
#include "titan/backend/cpu/gemm.h"
#include "titan/core/tensor.h"
#include "titan/kernels/registry.h"
#include "titan/ops/linear/linear.h"

namespace titan::cpu {
namespace {

void linear_forward_f32(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y) {
  gemm_f32(Trans::N, Trans::T, M, N, K, 1.0f, static_cast<const float*>(x), K, static_cast<const float*>(w), K, 0.0f,
           static_cast<float*>(y), N);
}

void linear_backward_f32(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* xv, const void* wv,
                         const void* dyv, const ops::LinearGradients& g) {
  auto x = static_cast<const float*>(xv), w = static_cast<const float*>(wv), dy = static_cast<const float*>(dyv);
  if (g.dx) gemm_f32(Trans::N, Trans::N, M, K, N, 1.0f, dy, N, w, K, g.add_dx ? 1.0f : 0.0f, static_cast<float*>(g.dx), K);
  if (g.dw) gemm_f32(Trans::T, Trans::N, N, K, M, 1.0f, dy, N, x, K, g.add_dw ? 1.0f : 0.0f, static_cast<float*>(g.dw), K);
}

void linear_forward_bf16(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y) {
  gemm_bf16_out(Trans::N, Trans::T, M, N, K, 1.0f, static_cast<const bf16*>(x), K, static_cast<const bf16*>(w), K,
                static_cast<bf16*>(y), N);
}

void linear_backward_bf16(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* xv, const void* wv,
                          const void* dyv, const ops::LinearGradients& g) {
  auto x = static_cast<const bf16*>(xv), w = static_cast<const bf16*>(wv);
  Tensor dy_t = Tensor::empty({M * N}, DType::BF16);  // written whole by the conversion: no zero-fill
  bf16* dy = dy_t.data<bf16>();
  convert_f32_to_bf16(static_cast<const float*>(dyv), dy, size_t(M * N));
  if (g.dx) gemm_bf16(Trans::N, Trans::N, M, K, N, 1.0f, dy, N, w, K, g.add_dx ? 1.0f : 0.0f, static_cast<float*>(g.dx), K);
  if (g.dw) gemm_bf16(Trans::T, Trans::N, N, K, M, 1.0f, dy, N, x, K, g.add_dw ? 1.0f : 0.0f, static_cast<float*>(g.dw), K);
}

const bool registered =
    kernels::register_kernels("linear", Device::CPU,
                              {{DType::F32, "default", "GEMM backend (oneDNN sgemm / OpenBLAS), OpenMP",
                                ops::LinearKernel{linear_forward_f32, linear_backward_f32}},
                               {DType::BF16, "default",
                                "oneDNN bf16 matmul (AMX / AVX512-BF16), f32 accumulation; on CPUs without "
                                "them inputs widened to f32 GEMMs",
                                ops::LinearKernel{linear_forward_bf16, linear_backward_bf16}}});

}  // namespace
}  // namespace titan::cpu
