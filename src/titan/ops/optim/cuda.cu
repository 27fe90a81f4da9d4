// The optimizer kernels on CUDA (f32 flat buffers):
//   adamw:     (and Adam's L2 decay) one grid-stride pass over param, grad, exp_avg, exp_avg_sq (and
//              the bf16 compute copy it writes, if any), 4 elements per access where they align,
//              with the reference's exact f32 operations (optim.h): fused multiply-adds exactly where
//              the reference has std::fma, every other product and sum rounded on its own
//              (__fmul_rn / __fadd_rn keep the compiler from contracting them), IEEE sqrt and
//              division. The result is bit-identical to the CPU kernels and to torch.optim.AdamW.
//              grad_scale (the folded clip coefficient) multiplies each gradient as it is read.
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

// One element's update (the reference's operations, optim.h); returns the new p.
__device__ __forceinline__ float adamw_element(float p, float g, float& m, float& v, const AdamWF32& s) {
  float gi = __fmul_rn(g, s.scale);
  if (s.l2 != 0.f) gi = fmaf(p, s.l2, gi);  // Adam's L2 term, from p before the step
  const float pi = __fmul_rn(p, s.decay);
  m = fmaf(gi, s.omb1, __fmul_rn(m, s.b1));
  v = fmaf(__fmul_rn(s.omb2, gi), gi, __fmul_rn(v, s.b2));
  const float denom = __fadd_rn(__fsqrt_rn(v) / s.bc2, s.eps);
  return __fadd_rn(pi, __fmul_rn(s.neg_lr, m) / denom);
}

// kVec consecutive elements per thread and iteration (4: 16-byte accesses, when every buffer allows),
// over n / kVec vectors; `copy` (or null) receives the new p rounded to bf16.
template <int kVec>
__global__ void adamw_kernel(int64_t vectors, float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, uint16_t* __restrict__ copy,
                             AdamWF32 s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * blockDim.x) {
    float pv[kVec], gv[kVec], mv[kVec], vv[kVec];
    load_vec<kVec>(p, i, pv);
    load_vec<kVec>(g, i, gv);
    load_vec<kVec>(m, i, mv);
    load_vec<kVec>(v, i, vv);
#pragma unroll
    for (int k = 0; k < kVec; ++k) pv[k] = adamw_element(pv[k], gv[k], mv[k], vv[k], s);
    store_vec<kVec>(p, i, pv);
    store_vec<kVec>(m, i, mv);
    store_vec<kVec>(v, i, vv);
    if (copy) store_vec<kVec>(copy, i, pv);
  }
}

void adamw_step(const KernelContext& ctx, int64_t n, void* param, const void* grad, void* exp_avg,
                void* exp_avg_sq, uint16_t* copy, const AdamWScalars& s) {
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
  auto* p = static_cast<float*>(param);
  auto* g = static_cast<const float*>(grad);
  auto *m = static_cast<float*>(exp_avg), *v = static_cast<float*>(exp_avg_sq);
  // Whole vectors of 4 where every buffer starts aligned, then the last n % 4 one by one.
  const int64_t vectorized = vectors_of_4(4, {{p, 4}, {g, 4}, {m, 4}, {v, 4}, {copy, 2}}) ? n / 4 * 4 : 0;
  if (vectorized > 0)
    launch_grid_stride(ctx, "adamw_kernel", vectorized / 4, adamw_kernel<4>, vectorized / 4, p, g, m, v, copy,
                       f);
  if (const int64_t rest = n - vectorized; rest > 0)
    launch_grid_stride(ctx, "adamw_kernel", rest, adamw_kernel<1>, rest, p + vectorized, g + vectorized,
                       m + vectorized, v + vectorized, copy ? copy + vectorized : nullptr, f);
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
