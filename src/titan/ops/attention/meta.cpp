// attention on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention/attention.h"

namespace titan::ops {
namespace {

// Causal attention: QK^T and PV over the lower triangle, 2 FLOPs per multiply-add; backward does
// four such products (dV, dP, dQ, dK).
double attention_pair_flops(const AttentionShape& s) {
  return 2.0 * double(s.B) * double(s.Hq) * double(s.S) * double(s.S + 1) / 2.0 * double(s.D);
}
// Standing in for CUDA (core/device_services.h, MetaStandIn), the backward holds what the default
// CUDA kernels hold: the f32 row terms delta = rowsum(dO * O) [B, Hq, S].
void backward_meta(const KernelContext& ctx, const AttentionShape& s, const void*, const void*, const void*,
                   const void*, const void*, const void*, void*, void*, void*) {
  ctx.services->add_flops(4.0 * attention_pair_flops(s));
  if (meta_stands_in_for() == Device::CUDA) {
    const Scratch delta(ctx, sizeof(float) * size_t(s.B * s.Hq * s.S));
  }
}
// (The bf16-gradient backward too: standing in for CUDA, whose kernels write bf16 gradients.)
const AttentionKernel attention_meta{
    [](const KernelContext& ctx, const AttentionShape& s, const void*, const void*, const void*, void*,
       void*) { ctx.services->add_flops(2.0 * attention_pair_flops(s)); },
    backward_meta, backward_meta};

const bool registered =
    kernels::register_meta_kernel("attention", {DType::F32, DType::BF16, DType::F64}, attention_meta);

}  // namespace
}  // namespace titan::ops
