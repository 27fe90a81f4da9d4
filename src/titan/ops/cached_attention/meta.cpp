// cached_attention on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/cached_attention/cached_attention.h"

namespace titan::ops {
namespace {

// Query i reads length - Sq + i + 1 keys (fewer after a row's padding, which the meta device cannot
// see: counted as read): q.k and p v, 2 FLOPs per multiply-add each.
const CachedAttentionKernel cached_attention_meta{[](const KernelContext& ctx, const CachedAttentionShape& s,
                                                     const void*, const void*, const void*, const int64_t*,
                                                     void*) {
  const double keys = double(s.Sq) * double(s.length - s.Sq) + double(s.Sq) * double(s.Sq + 1) / 2.0;
  ctx.services->add_flops(4.0 * double(s.B) * double(s.Hq) * keys * double(s.D));
}};

const bool registered = kernels::register_meta_kernel(
    "cached_attention", {DType::F32, DType::BF16, DType::F64}, cached_attention_meta);

}  // namespace
}  // namespace titan::ops
