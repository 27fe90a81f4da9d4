// embedding on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/kernels/registry.h"
#include "titan/ops/embedding/embedding.h"

namespace titan::ops {
namespace {

const EmbeddingKernel embedding_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, const int64_t*, const void*, void*) {},
    [](const KernelContext&, int64_t, int64_t, int64_t, const int64_t*, const void*, void*) {}};

const bool registered = [] {
  const auto floats = {DType::F32, DType::BF16, DType::F64};
  kernels::register_meta_kernel("embedding", floats, embedding_meta);
  return true;
}();

}  // namespace
}  // namespace titan::ops
