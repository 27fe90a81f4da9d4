// linear on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/linear/linear.h"

namespace titan::ops {
namespace {

void forward_meta(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void*, const void*,
                  void*) {
  ctx.services->add_flops(2.0 * double(M) * double(N) * double(K));
}

// A bf16 backward holds what the CPU and CUDA kernels hold: dy [M, N] rounded to bf16 for the bf16
// GEMMs (the CPU kernel holds it even without gradients to compute).
template <DType kDType>
void backward_meta(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void*, const void*,
                   const void*, const LinearGradients& g) {
  ctx.services->add_flops(2.0 * double(M) * double(N) * double(K) * ((g.dx ? 1 : 0) + (g.dw ? 1 : 0)));
  if (kDType == DType::BF16 && (meta_stands_in_for() == Device::CPU || g.dx || g.dw)) {
    const Scratch dy16(ctx, size_t(M * N) * 2);
  }
}

// bf16 activation gradients (CUDA's kernel): dy is bf16 already, no copy.
void backward_bf16_grads_meta(const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void*,
                              const void*, const void*, const LinearGradients& g) {
  ctx.services->add_flops(2.0 * double(M) * double(N) * double(K) * ((g.dx ? 1 : 0) + (g.dw ? 1 : 0)));
}

const bool f32_registered = kernels::register_meta_kernel(
    "linear", {DType::F32}, LinearKernel{forward_meta, backward_meta<DType::F32>});
const bool bf16_registered = kernels::register_meta_kernel(
    "linear", {DType::BF16},
    LinearKernel{forward_meta, backward_meta<DType::BF16>, backward_bf16_grads_meta});
const bool f64_registered = kernels::register_meta_kernel(
    "linear", {DType::F64}, LinearKernel{forward_meta, backward_meta<DType::F64>});

}  // namespace
}  // namespace titan::ops
