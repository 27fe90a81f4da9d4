// Fast CPU embedding: threaded row copies forward; backward partitions the vocabulary rows among
// threads, so each thread owns a disjoint slice of dtable (no atomics, no races) and adds the
// gradient rows of the ids in its slice in id order: the result is bit-identical to the reference.
#include "titan/ops/embedding/embedding.h"

#include <omp.h>

#include <cstring>

#include "titan/kernels/registry.h"

namespace titan::cpu {

namespace {

template <size_t kBytes>
void embedding_forward(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids,
                       const void* table, void* out) {
  const size_t row = size_t(D) * kBytes;  // bytes: the copy needs no element type
#pragma omp parallel for schedule(static) if (N * D > 32768)
  for (int64_t i = 0; i < N; ++i)
    std::memcpy(static_cast<char*>(out) + size_t(i) * row,
                static_cast<const char*>(table) + size_t(ids[i]) * row, row);
}

void embedding_backward(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids,
                        int64_t padding_idx, const void* dyv, void* dtv, bool add) {
  const float* dy = static_cast<const float*>(dyv);
  float* dt = static_cast<float*>(dtv);
#pragma omp parallel if ((add ? 0 : V * D) + N * D > 65536)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = V * t / nt, hi = V * (t + 1) / nt;
    if (!add) std::memset(dt + lo * D, 0, size_t(hi - lo) * size_t(D) * sizeof(float));
    for (int64_t i = 0; i < N; ++i) {
      const int64_t v = ids[i];
      if (v < lo || v >= hi || v == padding_idx) continue;
      float* dst = dt + v * D;
      const float* src = dy + i * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
    }
  }
}

const bool registered = kernels::register_kernels(
    "embedding", Device::CPU,
    {{DType::F32, "default", "threaded row copy; backward partitioned by vocab rows (OpenMP)",
      ops::EmbeddingKernel{embedding_forward<4>, embedding_backward}},
     {DType::BF16, "default", "threaded row copy; backward partitioned by vocab rows into f32 (OpenMP)",
      ops::EmbeddingKernel{embedding_forward<2>, embedding_backward}}});

}  // namespace

}  // namespace titan::cpu
