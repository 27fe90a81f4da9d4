// normal_init on CUDA: one thread per normal pair (grid-stride), the host's arithmetic
// (normal_draw.h: integer hashing, IEEE double operations kept unfused, its own logarithm), so the
// GPU writes the bits the CPU reference writes.
#include "titan/backend/cuda/common.cuh"
#include "titan/kernels/registry.h"
#include "titan/ops/init/init.h"
#include "titan/ops/init/normal_draw.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

// Pair p covers elements 2p and 2p + 1; the pairs run from begin / 2 to (begin + n - 1) / 2, and
// the first and last may be half outside [begin, begin + n).
__global__ void normal_init_kernel(uint64_t stream, double std, double bound, int64_t begin, int64_t n,
                                   float* __restrict__ out) {
  const int64_t first_pair = begin / 2, pairs = (begin + n - 1) / 2 - first_pair + 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pair = first_pair + i;
    float v[2];
    init_draw::draw_pair(stream, std, bound, uint64_t(pair), v);
    for (int k = 0; k < 2; ++k) {
      const int64_t j = 2 * pair + k - begin;
      if (j >= 0 && j < n) out[j] = v[k];
    }
  }
}

void normal_init_entry(const KernelContext& ctx, uint64_t stream, double std, double bound, int64_t begin,
                       int64_t n, float* out) {
  const int64_t pairs = (begin + n - 1) / 2 - begin / 2 + 1;
  launch_grid_stride(ctx, "normal_init (cuda)", pairs, normal_init_kernel, stream, std, bound, begin, n, out);
}

const bool normal_init_kernels_registered = kernels::register_kernels(
    "normal_init", Device::CUDA,
    {{DType::F32, "default", "thread per normal pair, the CPU's arithmetic (bit-identical)",
      NormalInitKernel{normal_init_entry}}},
    kernel_available);

}  // namespace
}  // namespace titan::ops
