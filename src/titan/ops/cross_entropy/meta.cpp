// cross_entropy on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/cross_entropy/cross_entropy.h"

namespace titan::ops {
namespace {

const CrossEntropyKernel cross_entropy_meta{
    [](const KernelContext&, int64_t, int64_t, const void*, const int64_t*, int64_t, void*, void*) {},
    [](const KernelContext&, int64_t, int64_t, const void*, const int64_t*, int64_t, const void*, double,
       void*) {}};

// The fused loss keeps its logits for backward when they fit in keep_bytes, as the CPU kernel
// does (bf16 when rounded to bf16, else the accumulation type): that buffer is often the largest
// activation of a step, so the meta profile allocates it too.
template <DType kAcc>
void lce_meta_forward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, void*, void*) {
  ctx.services->add_flops(2.0 * double(a.N) * double(a.V) * double(a.D));
  const DType kept = a.round_logits ? DType::BF16 : kAcc;
  if (a.kept && a.N * a.V * int64_t(dtype_size(kept)) <= a.keep_bytes)
    *a.kept = Tensor::empty({a.N * a.V}, kept, ctx.device);
}
void lce_meta_backward(const KernelContext& ctx, const LinearCrossEntropyArgs& a, const void*, double,
                       void* dh, void* dw) {
  ctx.services->add_flops(2.0 * double(a.N) * double(a.V) * double(a.D) * ((dh ? 1 : 0) + (dw ? 1 : 0)));
}

const bool cross_entropy_registered =
    kernels::register_meta_kernel("cross_entropy", {DType::F32, DType::BF16, DType::F64}, cross_entropy_meta);
const bool linear_cross_entropy_f32_bf16_registered =
    kernels::register_meta_kernel("linear_cross_entropy", {DType::F32, DType::BF16},
                                  LinearCrossEntropyKernel{lce_meta_forward<DType::F32>, lce_meta_backward});
const bool linear_cross_entropy_f64_registered =
    kernels::register_meta_kernel("linear_cross_entropy", {DType::F64},
                                  LinearCrossEntropyKernel{lce_meta_forward<DType::F64>, lce_meta_backward});

}  // namespace
}  // namespace titan::ops
