// moe on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
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
const MoeExpertsKernel moe_experts_meta{
    [](const KernelContext& ctx, const MoeDims& d, const void*, const void*, const int64_t*, const void*,
       const void*, const void*, void*, void*) { ctx.services->add_flops(expert_flops(d)); },
    [](const KernelContext& ctx, const MoeDims& d, const void*, const void*, const int64_t*, const void*,
       const void*, const void*, const void*, const void*, void*, void*, void*, void*,
       void*) { ctx.services->add_flops(2.0 * expert_flops(d)); }};

const bool router_topk_registered =
    kernels::register_meta_kernel("router_topk", {DType::F32, DType::BF16, DType::F64}, router_meta);
const bool moe_aux_loss_registered =
    kernels::register_meta_kernel("moe_aux_loss", {DType::F32, DType::F64}, moe_aux_loss_meta);
const ExpertBiasKernel expert_bias_meta{
    [](const KernelContext&, int64_t, int64_t, const int64_t*, double, float*) {}};
const bool update_expert_bias_registered =
    kernels::register_meta_kernel("update_expert_bias", {DType::F32}, expert_bias_meta);
const bool moe_experts_registered =
    kernels::register_meta_kernel("moe_experts", {DType::F32, DType::BF16, DType::F64}, moe_experts_meta);

}  // namespace
}  // namespace titan::ops
