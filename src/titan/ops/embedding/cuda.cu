// embedding on CUDA (f32 and bf16 tables). The ids were checked by the op (first_index_outside,
// the "index" kernel in ops/elementwise/cuda.cu) before these run.
//   forward:  block per token, its threads copy the table row.
//   backward: deterministic and bit-identical to the reference's serial scatter-add: the ids are
//             sorted stably (CUB radix sort of (id, position)), so each distinct id's positions stay
//             in increasing order; one block per run of equal ids adds its dy rows in that order
//             into a zeroed dtable, or into the held row when adding to a gradient buffer (the
//             reference's order either way). No float atomics (their order would vary from run to
//             run).
#include <cub/device/device_radix_sort.cuh>

#include "titan/backend/cuda/common.cuh"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/embedding/embedding.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

template <class T>
__global__ void embedding_forward_kernel(int64_t N, int64_t D, const int64_t* ids, const T* table, T* out) {
  const int64_t i = blockIdx.x;
  const T* row = table + ids[i] * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[i * D + d] = row[d];
}

template <class T>
void forward(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids, const void* table,
             void* out) {
  if (N == 0 || D == 0) return;
  embedding_forward_kernel<T><<<unsigned(N), kThreads, 0, cuda::stream_of(ctx)>>>(
      N, D, ids, static_cast<const T*>(table), static_cast<T*>(out));
  cuda::check_launch("embedding_forward_kernel");
}

__global__ void iota_kernel(int32_t n, int32_t* out) {
  // An int64 counter: i + stride may pass 2^31 when n is close to it.
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = int32_t(i);
}

// Block k handles the run of equal ids that starts at sorted position k (other blocks exit):
// dtable[id, :] = (add ? dtable[id, :] : 0) + dy[pos, :] over the run's positions, in increasing
// position order; padding_idx's run is left as it is (zeroed beforehand unless adding).
__global__ void scatter_runs_kernel(int64_t N, int64_t D, const int64_t* sorted_ids, const int32_t* positions,
                                    int64_t padding_idx, const float* dy, float* dtable, bool add) {
  const int64_t k = blockIdx.x;
  const int64_t id = sorted_ids[k];
  if ((k > 0 && sorted_ids[k - 1] == id) || id == padding_idx) return;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = add ? dtable[id * D + d] : 0.f;
    for (int64_t r = k; r < N && sorted_ids[r] == id; ++r) acc = __fadd_rn(acc, dy[int64_t(positions[r]) * D + d]);
    dtable[id * D + d] = acc;
  }
}

void backward(const KernelContext& ctx, int64_t N, int64_t V, int64_t D, const int64_t* ids,
              int64_t padding_idx, const void* dy, void* dtable, bool add) {
  cudaStream_t s = cuda::stream_of(ctx);
  DeviceServices& mem = *ctx.services;
  if (!add) mem.fill(dtable, V * D, DType::F32, 0.0);
  if (N == 0 || D == 0) return;
  TITAN_CHECK(N < (int64_t(1) << 31), "embedding: CUDA backward supports fewer than 2^31 ids, got ", N);
  int end_bit = 1;
  while (end_bit < 63 && (int64_t(1) << end_bit) < V) ++end_bit;  // ids are in [0, V): sort only those bits
  const int n = int(N);
  size_t temp_bytes = 0;
  TITAN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int64_t*>(nullptr),
                                                   static_cast<int64_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                   static_cast<int32_t*>(nullptr), n, 0, end_bit, s));
  const size_t ids_bytes = size_t(N) * sizeof(int64_t), pos_bytes = size_t(N) * sizeof(int32_t);
  auto* sorted_ids = static_cast<int64_t*>(mem.allocate(ids_bytes));
  auto* pos_in = static_cast<int32_t*>(mem.allocate(pos_bytes));
  auto* pos_out = static_cast<int32_t*>(mem.allocate(pos_bytes));
  void* temp = mem.allocate(temp_bytes);
  iota_kernel<<<cuda::grid_for(N), kThreads, 0, s>>>(n, pos_in);
  cuda::check_launch("iota_kernel");
  TITAN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, sorted_ids, pos_in, pos_out, n, 0, end_bit, s));
  scatter_runs_kernel<<<unsigned(N), kThreads, 0, s>>>(N, D, sorted_ids, pos_out, padding_idx,
                                                       static_cast<const float*>(dy),
                                                       static_cast<float*>(dtable), add);
  cuda::check_launch("scatter_runs_kernel");
  mem.deallocate(temp, temp_bytes);  // stream-ordered frees
  mem.deallocate(pos_out, pos_bytes);
  mem.deallocate(pos_in, pos_bytes);
  mem.deallocate(sorted_ids, ids_bytes);
}

const bool registered = cuda::register_float_kernels(
    "embedding", "CUDA: row copy; stable radix sort + in-order run sums (deterministic)",
    "CUDA: row copy; stable radix sort + in-order run sums into f32",
    TITAN_FLOAT_KERNEL(EmbeddingKernel, forward<T>, backward));

}  // namespace
}  // namespace titan::ops
