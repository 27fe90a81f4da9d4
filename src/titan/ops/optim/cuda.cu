// The optimizer kernels on CUDA (f32 flat buffers):
//   adamw:     (and Adam's L2 decay) one grid-stride pass over param, grad, exp_avg, exp_avg_sq with the
//   reference's exact
//              f32 operations (optim.h): fused multiply-adds exactly where the reference has
//              std::fma, every other product and sum rounded on its own (__fmul_rn / __fadd_rn keep
//              the compiler from contracting them), IEEE sqrt and division. The result is
//              bit-identical to the CPU kernels and to torch.optim.AdamW. grad_scale (the folded
//              clip coefficient) multiplies each gradient as it is read.
//   grad_norm: sum of squares in f64 (a square of an f32 is exact in f64): fixed-size per-block
//              partial sums, then one block adds the partials in order and adds that sum to the
//              f64 total in device memory, so the result does not depend on scheduling. Nothing is
//              read back here: the op reads the total once, after every buffer has been added.
#include "titan/backend/cuda/common.cuh"
#include "titan/kernels/registry.h"
#include "titan/ops/optim/optim.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

struct AdamWF32 {
  float decay, b1, omb1, b2, omb2, neg_lr, bc2, eps, scale, l2;
};

__global__ void adamw_kernel(int64_t n, float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, AdamWF32 s) {
#pragma unroll 4
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gi = __fmul_rn(g[i], s.scale);
    if (s.l2 != 0.f) gi = fmaf(p[i], s.l2, gi);  // Adam's L2 term, from p before the step
    const float pi = __fmul_rn(p[i], s.decay);
    const float mi = fmaf(gi, s.omb1, __fmul_rn(m[i], s.b1));
    const float vi = fmaf(__fmul_rn(s.omb2, gi), gi, __fmul_rn(v[i], s.b2));
    const float denom = __fadd_rn(__fsqrt_rn(vi) / s.bc2, s.eps);
    p[i] = __fadd_rn(pi, __fmul_rn(s.neg_lr, mi) / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

void adamw_step(const KernelContext& ctx, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
                const AdamWScalars& s) {
  if (n == 0) return;
  const AdamWF32 f{float(s.decay),
                   float(s.beta1),
                   float(s.one_minus_beta1),
                   float(s.beta2),
                   float(s.one_minus_beta2),
                   float(s.neg_step_size),
                   float(s.bias_correction2_sqrt),
                   float(s.eps),
                   float(s.grad_scale),
                   float(s.l2)};
  launch_grid_stride(ctx, "adamw_kernel", n, adamw_kernel, n, static_cast<float*>(param),
                     static_cast<const float*>(grad), static_cast<float*>(exp_avg), static_cast<float*>(exp_avg_sq),
                     f);
}

__global__ void sum_sq_partial_kernel(int64_t n, const float* g, double* partial) {
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double x = g[i];
    acc += x * x;
  }
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *total += the partials, summed by one block in a fixed order.
__global__ void add_partials_kernel(int count, const double* partial, double* total) {
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum_f64(acc);
  if (threadIdx.x == 0) *total += acc;
}

void grad_norm_add_sum_sq(const KernelContext& ctx, int64_t n, const void* grad, double* total) {
  if (n == 0) return;
  Scratch partials(ctx, kReduceBlocks * sizeof(double));
  sum_sq_partial_kernel<<<kReduceBlocks, kThreads, 0, stream_of(ctx)>>>(n, static_cast<const float*>(grad),
                                                                         partials.as<double>());
  check_launch("sum_sq_partial_kernel");
  add_partials_kernel<<<1, kThreads, 0, stream_of(ctx)>>>(kReduceBlocks, partials.as<double>(), total);
  check_launch("add_partials_kernel");
}

const bool adamw_kernels_registered = kernels::register_kernels(
    "adamw", Device::CUDA,
    {{DType::F32, "default", "CUDA: one fused pass, torch.optim.AdamW rounding (bit-identical)",
      AdamWKernel{adamw_step}}},
    cuda::kernel_available);
const bool grad_norm_kernels_registered = kernels::register_kernels(
    "grad_norm", Device::CUDA,
    {{DType::F32, "default", "CUDA: f64 sum of squares, fixed 1024 block partials (deterministic)",
      GradNormKernel{grad_norm_add_sum_sq}}},
    cuda::kernel_available);

}  // namespace
}  // namespace titan::ops
