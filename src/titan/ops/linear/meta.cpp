// linear on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/linear/linear.h"

namespace titan::ops {
namespace {

const LinearKernel linear_meta{
    [](const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void*, const void*, void*) {
      ctx.services->add_flops(2.0 * double(M) * double(N) * double(K));
    },
    [](const KernelContext& ctx, int64_t M, int64_t N, int64_t K, const void*, const void*, const void*,
       const LinearGradients& g) {
      ctx.services->add_flops(2.0 * double(M) * double(N) * double(K) * ((g.dx ? 1 : 0) + (g.dw ? 1 : 0)));
    }};

const bool registered =
    kernels::register_meta_kernel("linear", {DType::F32, DType::BF16, DType::F64}, linear_meta);

}  // namespace
}  // namespace titan::ops
