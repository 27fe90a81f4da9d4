#pragma once
// linear: y = x @ w^T with x [..., K], w [N, K] (the Hugging Face Linear layout), y [..., N].
// Autograd: dx = dy @ w, dw = dy^T @ x (f32 gradients; bf16 inputs multiply in bf16
// with f32 accumulation).
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

Tensor linear(const Tensor& x, const Tensor& w);

// Kernels, per dtype; pointers are contiguous row-major. X [M, K], W [N, K], Y [M, N].
// Gradient pointers (dy, dx, dw) are in the grad dtype (f64 for f64, else f32);
// dx or dw is null when that gradient is not needed; both are overwritten.
struct LinearKernel {
  void (*forward)(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w, void* y);
  void (*backward)(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void* x, const void* w, const void* dy, void* dx,
                   void* dw);
};

}  // namespace titan::ops
