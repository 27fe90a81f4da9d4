// linear on CUDA: the op's three matmuls through cuBLASLt (backend/cuda/gemm.h), f32 accumulation.
//   forward  Y[M,N]  = X[M,K] W[N,K]^T
//   backward dX[M,K] = dY[M,N] W[N,K]      dW[N,K] = dY^T[N,M] X[M,K]
// f32: exact f32 GEMMs (TF32 off). bf16: bf16 tensor cores, Y rounded to bf16 once; the f32 upstream
// gradient is rounded to bf16 once (as the CPU kernel and a bf16 autograd do), dX and dW are f32;
// with bf16 activation gradients dy comes in bf16 and dX goes out in bf16.
#include "titan/backend/cuda/common.cuh"
#include "titan/backend/cuda/gemm.h"
#include "titan/kernels/registry.h"
#include "titan/ops/linear/linear.h"

namespace titan::ops {
namespace {

void forward_f32(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y) {
  cuda::gemm(false, true, M, N, K, 1.f, DType::F32, x, K, w, K, 0.f, DType::F32, y, N, {}, ctx.stream);
}

void backward_f32(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w,
                  const void* dy, const LinearGradients& g) {
  if (g.dx && !(g.add_dx && N == 0))  // adding an empty sum leaves dx as it is
    cuda::gemm(false, false, M, K, N, 1.f, DType::F32, dy, N, w, K, g.add_dx ? 1.f : 0.f, DType::F32, g.dx, K, {},
               ctx.stream);
  if (g.dw && !(g.add_dw && M == 0))
    cuda::gemm(true, false, N, K, M, 1.f, DType::F32, dy, N, x, K, g.add_dw ? 1.f : 0.f, DType::F32, g.dw, K, {},
               ctx.stream);
}

void forward_bf16(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y) {
  cuda::gemm(false, true, M, N, K, 1.f, DType::BF16, x, K, w, K, 0.f, DType::BF16, y, N, {}, ctx.stream);
}

void backward_bf16(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w,
                   const void* dy, const LinearGradients& g) {
  if (!g.dx && !g.dw) return;
  const size_t bytes = size_t(M * N) * 2;
  void* dy16 = ctx.services->allocate(bytes);
  ctx.services->convert(dy16, DType::BF16, dy, DType::F32, M * N);
  if (g.dx && !(g.add_dx && N == 0))
    cuda::gemm(false, false, M, K, N, 1.f, DType::BF16, dy16, N, w, K, g.add_dx ? 1.f : 0.f, DType::F32, g.dx, K,
               {}, ctx.stream);
  if (g.dw && !(g.add_dw && M == 0))
    cuda::gemm(true, false, N, K, M, 1.f, DType::BF16, dy16, N, x, K, g.add_dw ? 1.f : 0.f, DType::F32, g.dw, K,
               {}, ctx.stream);
  ctx.services->deallocate(dy16, bytes);  // stream-ordered: the GEMMs above run first
}

// bf16 activation gradients: dy is bf16 already (no copy), dx is written in bf16 by the GEMM (one
// rounding of its f32 sum; in f32 when it adds into a parameter's buffer), dW in f32 as above.
void backward_bf16_grads(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x,
                         const void* w, const void* dy, const LinearGradients& g) {
  if (g.dx && !(g.add_dx && N == 0))
    cuda::gemm(false, false, M, K, N, 1.f, DType::BF16, dy, N, w, K, g.add_dx ? 1.f : 0.f,
               g.add_dx ? DType::F32 : DType::BF16, g.dx, K, {}, ctx.stream);
  if (g.dw && !(g.add_dw && M == 0))
    cuda::gemm(true, false, N, K, M, 1.f, DType::BF16, dy, N, x, K, g.add_dw ? 1.f : 0.f, DType::F32, g.dw, K,
               {}, ctx.stream);
}

const bool registered = kernels::register_kernels(
    "linear", Device::CUDA,
    {{DType::F32, "default", "CUDA: cuBLASLt f32 GEMM (TF32 off)", LinearKernel{forward_f32, backward_f32}},
     {DType::BF16, "default", "CUDA: cuBLASLt bf16 GEMM, f32 accumulation",
      LinearKernel{forward_bf16, backward_bf16, backward_bf16_grads}}},
    cuda::kernel_available);

}  // namespace
}  // namespace titan::ops
