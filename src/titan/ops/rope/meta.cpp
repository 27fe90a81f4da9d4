// rope on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/rope/rope.h"

namespace titan::ops {
namespace {

void rotate_meta(const KernelContext&, int64_t, int64_t, int64_t, int64_t, const int64_t*, const RopeTable&,
                 const void*, void*) {}

// (The bf16-gradient backward too: standing in for CUDA, whose kernels write bf16 gradients.)
const RopeKernel rope_meta{rotate_meta, rotate_meta, /*needs_table=*/false, rotate_meta};

const bool registered =
    kernels::register_meta_kernel("rope", {DType::F32, DType::BF16, DType::F64}, rope_meta);

}  // namespace
}  // namespace titan::ops
