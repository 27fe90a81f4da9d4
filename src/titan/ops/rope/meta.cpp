// rope on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/rope/rope.h"

namespace titan::ops {
namespace {

const RopeKernel rope_meta{[](const KernelContext&, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                              const RopeTable&, const void*, void*) {},
                           [](const KernelContext&, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                              const RopeTable&, const void*, void*) {},
                           /*needs_table=*/false};

const bool registered =
    kernels::register_meta_kernel("rope", {DType::F32, DType::BF16, DType::F64}, rope_meta);

}  // namespace
}  // namespace titan::ops
