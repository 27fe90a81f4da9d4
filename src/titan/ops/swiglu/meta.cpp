// swiglu on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/swiglu/swiglu.h"

namespace titan::ops {
namespace {

void backward_meta(const KernelContext&, int64_t, const void*, const void*, const void*, void*, void*) {}

// (The bf16-gradient backward too: standing in for CUDA, whose kernels write bf16 gradients.)
const SwigluKernel swiglu_meta{[](const KernelContext&, int64_t, const void*, const void*, void*) {},
                               backward_meta, backward_meta};

const bool registered =
    kernels::register_meta_kernel("swiglu", {DType::F32, DType::BF16, DType::F64}, swiglu_meta);

}  // namespace
}  // namespace titan::ops
