#pragma once
// Causal grouped-query attention:
//   out[b, i, h] = sum_{j <= i} softmax_j(scale * q[b, i, h] . k[b, j, g]) v[b, j, g],  g = h / (Hq / Hkv)
// q [B, S, Hq, D], k and v [B, S, Hkv, D] -> out [B, S, Hq, D]. Softmax statistics in f32
// (f64 in f64); the forward saves the row logsumexp for the backward. No S x S matrix is
// ever formed (flash-style tiles; the reference holds one row of scores).
#include "titan/backend/cpu/attention.h"
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan::ops {

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale);

// dout, dq, dk, dv are in the grad dtype (f32, or f64 for f64); lse is f32 (f64 for f64).
struct AttentionKernel {
  void (*forward)(const KernelContext& ctx, const cpu::AttentionShape& s, const void* q, const void* k, const void* v, void* out, void* lse);
  void (*backward)(const KernelContext& ctx, const cpu::AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                   const void* lse, const void* dout, void* dq, void* dk, void* dv);
};

}  // namespace titan::ops
