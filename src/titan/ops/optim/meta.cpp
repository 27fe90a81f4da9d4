// optim on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/optim/optim.h"

namespace titan::ops {
namespace {

const AdamWKernel adamw_meta{
    [](const KernelContext&, int64_t, void*, const void*, void*, void*, uint16_t*, const AdamWScalars&) {}};
const GradNormKernel grad_norm_meta{[](const KernelContext&, int64_t, const void*, double*) {}};

const bool adamw_registered = kernels::register_meta_kernel("adamw", {DType::F32, DType::F64}, adamw_meta);
const bool grad_norm_registered =
    kernels::register_meta_kernel("grad_norm", {DType::F32, DType::F64}, grad_norm_meta);

}  // namespace
}  // namespace titan::ops
