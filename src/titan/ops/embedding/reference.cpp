// The reference kernels of embedding: plain loops, the ground truth every other variant is
// tested against (registered as variant "reference" on the CPU).
#include <cstring>
#include <vector>

#include "titan/kernels/registry.h"
#include "titan/ops/embedding/embedding.h"

namespace titan::ops {

namespace {
// Reference: row copies and a serial scatter-add in id order (the order every variant must keep
// per row, so f32 gradients are bit-identical across variants).
template <class T>
void embedding_forward_ref(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids, const void* tv, void* ov) {
  const T* table = static_cast<const T*>(tv);
  T* out = static_cast<T*>(ov);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) out[i * D + d] = table[ids[i] * D + d];
}

template <class A>
void embedding_backward_ref(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids,
                            int64_t padding_idx, const void* dyv, void* dtv, bool add) {
  const A* dy = static_cast<const A*>(dyv);
  A* dt = static_cast<A*>(dtv);
  if (!add)
    for (int64_t k = 0; k < V * D; ++k) dt[k] = 0;
  for (int64_t i = 0; i < N; ++i)
    if (ids[i] != padding_idx)
      for (int64_t d = 0; d < D; ++d) dt[ids[i] * D + d] += dy[i * D + d];
}

const bool registered = kernels::register_reference_kernels(
    "embedding", "row copy, serial scatter-add", "scatter-add into f32",
    TITAN_REFERENCE_KERNEL(EmbeddingKernel, embedding_forward_ref<T>, embedding_backward_ref<Acc>));

}  // namespace

}  // namespace titan::ops
