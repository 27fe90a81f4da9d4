// embedding on the meta device: shapes, allocations and FLOPs only (kernels/registry.h,
// register_meta_kernel).
#include "titan/core/device_services.h"
#include "titan/kernels/registry.h"
#include "titan/ops/embedding/embedding.h"

namespace titan::ops {
namespace {

// Standing in for CUDA (core/device_services.h, MetaStandIn), the backward holds what the CUDA
// kernel's sort holds: the sorted ids [N] (i64) and two position arrays [N] (i32), in its order.
// (Not cub's own temporary storage: its size is cub's to say, on a GPU.)
const EmbeddingKernel embedding_meta{
    [](const KernelContext&, int64_t, int64_t, int64_t, const int64_t*, const void*, void*) {},
    [](const KernelContext& ctx, int64_t N, int64_t, int64_t D, const int64_t*, int64_t, const void*, void*,
       bool) {
      if (meta_stands_in_for() != Device::CUDA || N == 0 || D == 0) return;
      const Scratch sorted_ids(ctx, size_t(N) * sizeof(int64_t)), pos_in(ctx, size_t(N) * sizeof(int32_t)),
          pos_out(ctx, size_t(N) * sizeof(int32_t));
    }};

const bool registered =
    kernels::register_meta_kernel("embedding", {DType::F32, DType::BF16, DType::F64}, embedding_meta);

}  // namespace
}  // namespace titan::ops
