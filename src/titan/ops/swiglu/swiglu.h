#pragma once
// swiglu: out = silu(gate) * up, gate and up [..., F] of one shape and dtype (the Qwen3 MLP's
// act_fn(gate_proj(x)) * up_proj(x)). silu(g) = g / (1 + exp(-g)) in f32 (f64 for f64).
// In bf16 it matches transformers + torch: silu is computed in f32 from the bf16 gate and rounded
// to bf16 (one op), then the product with up is computed in f32 and rounded to bf16 (a second op).
// Autograd, in f32 (f64 for f64), with s = sigmoid(gate):
//   dgate = dy * up * s * (1 + gate * (1 - s)),   dup = dy * silu(gate).to(dtype)
// (dup uses the value the forward multiplied by).
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

Tensor swiglu(const Tensor& gate, const Tensor& up);

// Kernels over n contiguous elements. gate, up, out in the op dtype; dy, dgate, dup in the grad
// dtype (f32, f64 for f64). dgate or dup is null when not needed; both are overwritten.
struct SwigluKernel {
  void (*forward)(const KernelContext& ctx, int64_t n, const void* gate, const void* up, void* out);
  void (*backward)(const KernelContext& ctx, int64_t n, const void* gate, const void* up, const void* dy, void* dgate, void* dup);
  // bf16 activation gradients (ops/activation_grads.h), bf16 kernels only, null where the kernel
  // has none: the same with dy, dgate and dup in bf16.
  void (*backward_bf16_grads)(const KernelContext& ctx, int64_t n, const void* gate, const void* up,
                              const void* dy, void* dgate, void* dup) = nullptr;
};

}  // namespace titan::ops
