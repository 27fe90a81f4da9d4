// moe on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include <memory>

#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/moe/moe.h"

namespace titan::ops {
namespace {

const RouterKernel router_meta{[](const KernelContext&, int64_t, int64_t, int64_t, bool, const void*,
                                  const float*, void*, int64_t*, void*, int64_t*) {},
                               [](const KernelContext&, int64_t, int64_t, int64_t, bool, const void*,
                                  const int64_t*, const void*, const void*, void*) {}};

const MoeAuxLossKernel moe_aux_loss_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, const void*, const int64_t*, int64_t*, double*) {},
    [](const KernelContext&, int64_t, double, const int64_t*, const double*, void*) {},
    [](const KernelContext&, int64_t, int64_t, double, const int64_t*, const void*, void*) {}};

// Per (token, slot): gate and up projections (2 x 2DF) and the down projection (2DF); backward
// twice that. Routing is data-dependent, the FLOPs are not.
double expert_flops(const MoeDims& d) {
  return 6.0 * double(d.T) * double(d.k) * double(d.D) * double(d.F);
}

// Standing in for CUDA (core/device_services.h, MetaStandIn), the experts hold the buffers of the
// default CUDA kernels (ops/moe/cuda.cu; the cudnn variant holds more), allocated in their order so
// the caching allocator's replay reserves what theirs would. The routing: order and pos [T*k] and
// offsets [E+1] in i64, the prefix sums of 64- and 128-row tiles [2 (E+1)] in i32, each row's token
// [T*k] in i64, and an [E] histogram while it is built.
struct CudaRouting {
  Scratch order, pos, offsets, tiles, token;
  CudaRouting(const KernelContext& ctx, const MoeDims& d)
      : order(ctx, sizeof(int64_t) * size_t(d.T * d.k)),
        pos(ctx, sizeof(int64_t) * size_t(d.T * d.k)),
        offsets(ctx, sizeof(int64_t) * size_t(d.E + 1)),
        tiles(ctx, sizeof(int) * size_t(2 * (d.E + 1))),
        token(ctx, sizeof(int64_t) * size_t(d.T * d.k)) {
    const Scratch histogram(ctx, sizeof(uint64_t) * size_t(d.E));
  }
};

// Forward: the down projection's rows o [T*k, D] and the SwiGLU rows h [T*k, F], in the dtype.
template <DType kDType>
void experts_forward_meta(const KernelContext& ctx, const MoeDims& d, const void*, const void*,
                          const int64_t*, const void*, const void*, const void*, void*, void*) {
  ctx.services->add_flops(expert_flops(d));
  if (meta_stands_in_for() != Device::CUDA || d.T == 0) return;
  const size_t n = size_t(d.T * d.k), element = dtype_size(kDType);
  const CudaRouting routing(ctx, d);
  const Scratch o(ctx, element * n * size_t(d.D)), h(ctx, element * n * size_t(d.F));
}

// Backward: the routing and h again (for the routing weights' or the down projection's gradient);
// the gate | up gradients [T*k, 2F] in the dtype; dy rounded to bf16 [T, D] (a bf16 model's) while
// the f32 dh [T*k, F] and then the weighted dy [T*k, D] in the dtype are computed; then the f32 rows
// of dx [T*k, D].
template <DType kDType>
void experts_backward_meta(const KernelContext& ctx, const MoeDims& d, const void*, const void*,
                           const int64_t*, const void*, const void*, const void*, const void*, const void*,
                           void* dx, void* dweights, void* dwg, void* dwu, void* dwd, bool) {
  ctx.services->add_flops(2.0 * expert_flops(d));
  if (meta_stands_in_for() != Device::CUDA || d.T == 0) return;
  const size_t n = size_t(d.T * d.k), element = dtype_size(kDType), D = size_t(d.D), F = size_t(d.F);
  const bool need_gu = dx || dwg || dwu;
  const CudaRouting routing(ctx, d);
  std::unique_ptr<Scratch> h;
  if (dweights || dwd) h = std::make_unique<Scratch>(ctx, element * n * F);
  std::unique_ptr<Scratch> gate_up_grads;
  if (need_gu) gate_up_grads = std::make_unique<Scratch>(ctx, element * n * 2 * F);
  std::unique_ptr<Scratch> dy_rounded;
  if (kDType == DType::BF16 && (dweights || need_gu || dwd))
    dy_rounded = std::make_unique<Scratch>(ctx, element * size_t(d.T) * D);
  if (dweights || need_gu) {
    const Scratch dh(ctx, sizeof(float) * n * F);
  }
  if (dwd) {
    const Scratch dy_weighted(ctx, element * n * D);
  }
  dy_rounded.reset();
  if (dx) {
    const Scratch dx_rows(ctx, sizeof(float) * n * D);
  }
}
template <DType kDType>
const MoeExpertsKernel moe_experts_meta{experts_forward_meta<kDType>, experts_backward_meta<kDType>};

// Combine: one multiply-add per element of each (token, slot) row, twice that backward; standing
// in for CUDA, the routing its kernels build each way.
const MoeCombineKernel moe_combine_meta{
    [](const KernelContext& ctx, const MoeDims& d, const void*, const void*, const int64_t*, void*) {
      ctx.services->add_flops(2.0 * double(d.T) * double(d.k) * double(d.D));
      if (meta_stands_in_for() == Device::CUDA && d.T > 0) {
        const CudaRouting routing(ctx, d);
      }
    },
    [](const KernelContext& ctx, const MoeDims& d, const void*, const void*, const int64_t*, const void*,
       void* drows, void* dweights) {
      ctx.services->add_flops(4.0 * double(d.T) * double(d.k) * double(d.D));
      if (meta_stands_in_for() == Device::CUDA && d.T > 0 && (drows || dweights)) {
        const CudaRouting routing(ctx, d);
      }
    }};

const bool router_topk_registered =
    kernels::register_meta_kernel("router_topk", {DType::F32, DType::BF16, DType::F64}, router_meta);
const bool moe_aux_loss_registered =
    kernels::register_meta_kernel("moe_aux_loss", {DType::F32, DType::F64}, moe_aux_loss_meta);
const bool expert_counts_registered = kernels::register_meta_kernel(
    "expert_counts", {DType::I64},
    ExpertCountKernel{[](const KernelContext&, int64_t, int64_t, const int64_t*, int64_t*) {}});
const ExpertBiasKernel expert_bias_meta{
    [](const KernelContext&, int64_t, int64_t, const int64_t*, double, float*) {}};
const bool update_expert_bias_registered =
    kernels::register_meta_kernel("update_expert_bias", {DType::F32}, expert_bias_meta);
const bool moe_experts_f32_registered =
    kernels::register_meta_kernel("moe_experts", {DType::F32}, moe_experts_meta<DType::F32>);
const bool moe_experts_bf16_registered =
    kernels::register_meta_kernel("moe_experts", {DType::BF16}, moe_experts_meta<DType::BF16>);
const bool moe_combine_registered =
    kernels::register_meta_kernel("moe_combine", {DType::F32, DType::BF16, DType::F64}, moe_combine_meta);
const bool moe_experts_f64_registered =
    kernels::register_meta_kernel("moe_experts", {DType::F64}, moe_experts_meta<DType::F64>);

}  // namespace
}  // namespace titan::ops
