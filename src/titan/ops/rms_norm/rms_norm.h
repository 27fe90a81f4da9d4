#pragma once
// rms_norm over the last dimension, exactly as transformers' Qwen3RMSNorm:
//   x32 = float(x); y = x32 * rsqrt(mean(x32^2) + eps); out = w * y.to(x.dtype)
// The normalised row is cast to the input dtype BEFORE the weight multiply: in bf16, y is rounded
// to bf16, multiplied by the bf16 weight (exact product in f32) and rounded again. rsqrt is
// 1 / sqrt(v) in f32 (both correctly rounded, as torch's CPU rsqrt), mean = sum / D, and eps is
// added as an f32. x [..., D], w [D], same dtype; used for the block norms and, with x viewed as
// [..., H, head_dim], for the per-head q_norm / k_norm.
// Saves rstd (one f32 per row; f64 in f64). Autograd: with g = dy * w and y = x * rstd (f32),
//   dx = rstd * (g - y * mean(g * y)),   dw = sum over rows of dy * y.to(x.dtype)
// (the cast is a straight-through in dx; dw uses the value the forward multiplied by).
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);

// Kernels; pointers are contiguous row-major. x, y [R, D] and w [D] in the op dtype; rstd [R],
// dy, dx [R, D] and dw [D] in the grad dtype (f32, f64 for f64). dx or dw is null when not needed;
// both are overwritten.
struct RmsNormKernel {
  void (*forward)(const KernelContext& ctx, int64_t R, int64_t D, double eps, const void* x, const void* w, void* y, void* rstd);
  void (*backward)(const KernelContext& ctx, int64_t R, int64_t D, const void* x, const void* w, const void* rstd, const void* dy,
                   void* dx, void* dw);
  // bf16 activation gradients (ops/activation_grads.h), bf16 kernels only, null where the kernel
  // has none: the same with dy and dx in bf16 (dw stays f32).
  void (*backward_bf16_grads)(const KernelContext& ctx, int64_t R, int64_t D, const void* x, const void* w,
                              const void* rstd, const void* dy, void* dx, void* dw) = nullptr;
};

}  // namespace titan::ops
