// The second pass of the deterministic f64 reductions (common.cuh, sum_block_partials).
#include "titan/backend/cuda/common.cuh"

namespace titan::cuda {

namespace {

__global__ void sum_partials_kernel(int count, const double* partial, double* out) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) *out = acc;
}

}  // namespace

double sum_block_partials(const KernelContext& ctx, const std::function<void(double* partials)>& write_partials) {
  Scratch buffer(ctx, (kReduceBlocks + 1) * sizeof(double));  // the partials, then the total
  double* partials = buffer.as<double>();
  write_partials(partials);
  sum_partials_kernel<<<1, kThreads, 0, stream_of(ctx)>>>(kReduceBlocks, partials, partials + kReduceBlocks);
  check_launch("sum_partials_kernel");
  double total = 0;
  ctx.services->copy_to_host(&total, partials + kReduceBlocks, sizeof total);
  return total;
}

}  // namespace titan::cuda
