// rms_norm on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/rms_norm/rms_norm.h"

namespace titan::ops {
namespace {

void backward_meta(const KernelContext&, int64_t, int64_t, const void*, const void*, const void*, const void*,
                   void*, void*) {}

// (The bf16-gradient backward too: standing in for CUDA, whose kernels write bf16 gradients.)
const RmsNormKernel rms_norm_meta{
    [](const KernelContext&, int64_t, int64_t, double, const void*, const void*, void*, void*) {},
    backward_meta, backward_meta};

const bool registered =
    kernels::register_meta_kernel("rms_norm", {DType::F32, DType::BF16, DType::F64}, rms_norm_meta);

}  // namespace
}  // namespace titan::ops
