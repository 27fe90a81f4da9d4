// embedding on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/embedding/embedding.h"

namespace titan::ops {
namespace {

const EmbeddingKernel embedding_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, const int64_t*, const void*, void*) {},
    [](const KernelContext&, int64_t, int64_t, int64_t, const int64_t*, const void*, void*) {}};

const bool registered =
    kernels::register_meta_kernel("embedding", {DType::F32, DType::BF16, DType::F64}, embedding_meta);

}  // namespace
}  // namespace titan::ops
