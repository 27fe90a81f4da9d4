#pragma once
// linear: y = x @ w^T with x [..., K], w [N, K] (the Hugging Face Linear layout), y [..., N].
// Autograd: dx = dy @ w, dw = dy^T @ x (f32 gradients, dx bf16 under bf16 activation gradients:
// ops/activation_grads.h; bf16 inputs multiply in bf16 with f32 accumulation); a parameter's dw is
// added straight into its gradient buffer (GEMM beta = 1) instead of being written fresh and added
// by autograd.
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

Tensor linear(const Tensor& x, const Tensor& w);

// Where the backward's gradients go: dx [M, K] and dw [N, K] in the grad dtype (f64 for f64, else
// f32; dx in bf16 for backward_bf16_grads unless add_dx), null when not needed; overwritten, or added to with
// add_dx / add_dw (the op passes the gradient autograd has accumulated so far, autograd::GradientSink, so the
// GEMM's beta = 1 replaces a fresh gradient and a separate accumulation pass).
struct LinearGradients {
  void* dx = nullptr;
  void* dw = nullptr;
  bool add_dx = false, add_dw = false;
};

// Kernels, per dtype; pointers are contiguous row-major. X [M, K], W [N, K], Y [M, N], dy [M, N]
// in the grad dtype.
struct LinearKernel {
  void (*forward)(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y);
  void (*backward)(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w,
                   const void* dy, const LinearGradients& grads);
  // bf16 activation gradients (ops/activation_grads.h), bf16 kernels only, null where the kernel
  // has none: the same with dy in bf16 and dx in bf16 (f32 when add_dx: a parameter's buffer);
  // dw stays f32.
  void (*backward_bf16_grads)(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x,
                              const void* w, const void* dy, const LinearGradients& grads) = nullptr;
};

}  // namespace titan::ops
