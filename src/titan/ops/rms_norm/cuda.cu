// rms_norm on CUDA (f32 and bf16), rounding where the reference rounds (rms_norm.h).
//   forward:  one warp per row: sum of squares in f32 (a warp tree instead of the reference's
//             serial sum: the only difference), rstd = 1 / sqrt(ss / D + eps) correctly rounded,
//             y = T(w * T(x * rstd)) with no fused multiply-add (as the CPU).
//   backward: dx one warp per row; dw as column sums over row chunks (coalesced across columns),
//             partial sums per chunk, then one reduction in a fixed order: deterministic, no atomics.
#include <algorithm>

#include "titan/backend/cuda/common.cuh"
#include "titan/kernels/registry.h"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/rms_norm/rms_norm.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

constexpr int kWarpsPerBlock = kThreads / 32;

template <class T>
__global__ void rms_norm_forward_kernel(int64_t R, int64_t D, float eps, const T* x, const T* w, T* y, float* rstd) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const T* xr = x + r * D;
  float ss = 0.f;
  for (int64_t d = lane; d < D; d += 32) {
    const float v = load_f32(xr, d);
    ss += v * v;
  }
  ss = cuda::warp_sum(ss);
  const float rs = 1.f / sqrtf(__fadd_rn(ss / float(D), eps));
  if (lane == 0) rstd[r] = rs;
  T* yr = y + r * D;
  for (int64_t d = lane; d < D; d += 32)
    store_f32(yr, d, __fmul_rn(load_f32(w, d), round_to<T>(__fmul_rn(load_f32(xr, d), rs))));
}

template <class T>
__global__ void rms_norm_dx_kernel(int64_t R, int64_t D, const T* x, const T* w, const float* rstd, const float* dy,
                                   float* dx) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const T* xr = x + r * D;
  const float* g = dy + r * D;
  const float rs = rstd[r];
  float dot = 0.f;
  for (int64_t d = lane; d < D; d += 32) dot += g[d] * load_f32(w, d) * (load_f32(xr, d) * rs);
  const float mean = cuda::warp_sum(dot) / float(D);
  for (int64_t d = lane; d < D; d += 32) {
    const float gw = __fmul_rn(g[d], load_f32(w, d));
    const float xm = __fmul_rn(__fmul_rn(load_f32(xr, d), rs), mean);
    dx[r * D + d] = __fmul_rn(rs, __fsub_rn(gw, xm));
  }
}

// partial[c, d] = sum over the rows of chunk c (rows_per_chunk consecutive rows) of
// dy[r, d] * T(x[r, d] * rstd[r]); one thread per column, coalesced across the row.
template <class T>
__global__ void rms_norm_dw_partial_kernel(int64_t R, int64_t D, int64_t rows_per_chunk, const T* x, const float* rstd,
                                           const float* dy, float* partial) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t c = blockIdx.y;
  if (d >= D) return;
  const int64_t r0 = c * rows_per_chunk, r1 = min(R, r0 + rows_per_chunk);
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r)
    acc = __fadd_rn(acc, __fmul_rn(dy[r * D + d], round_to<T>(__fmul_rn(load_f32(x + r * D, d), rstd[r]))));
  partial[c * D + d] = acc;
}

// out[d] = sum over chunks of partial[c, d]: 32 columns per block, 32 lanes per column each summing
// every 32nd chunk, then the 32 lane sums added in lane order (a fixed order: deterministic). With
// head_dim 128 (the q/k norms) there are only 4 such blocks, so the serial part per thread is what
// counts: 2048 chunks / 32 lanes = 64 loads.
constexpr int kSumLanes = 32;
__global__ void sum_columns_kernel(int64_t chunks, int64_t D, const float* partial, float* out) {
  __shared__ float lane_sums[kSumLanes][32];
  const int col = threadIdx.x & 31, lane = threadIdx.x >> 5;
  const int64_t d = int64_t(blockIdx.x) * 32 + col;
  float acc = 0.f;
  if (d < D)
    for (int64_t c = lane; c < chunks; c += kSumLanes) acc += partial[c * D + d];
  lane_sums[lane][col] = acc;
  __syncthreads();
  if (lane == 0 && d < D) {
    float total = 0.f;
    for (int l = 0; l < kSumLanes; ++l) total += lane_sums[l][col];
    out[d] = total;
  }
}

template <class T>
void forward(const KernelContext& ctx, int64_t R, int64_t D, double eps, const void* x, const void* w, void* y,
             void* rstd) {
  if (R == 0) return;
  rms_norm_forward_kernel<T><<<unsigned((R + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0, cuda::stream_of(ctx)>>>(
      R, D, float(eps), static_cast<const T*>(x), static_cast<const T*>(w), static_cast<T*>(y),
      static_cast<float*>(rstd));
  cuda::check_launch("rms_norm_forward_kernel");
}

template <class T>
void backward(const KernelContext& ctx, int64_t R, int64_t D, const void* x, const void* w, const void* rstd,
              const void* dy, void* dx, void* dw) {
  cudaStream_t s = cuda::stream_of(ctx);
  if (dx && R > 0) {
    rms_norm_dx_kernel<T><<<unsigned((R + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0, s>>>(
        R, D, static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const float*>(rstd),
        static_cast<const float*>(dy), static_cast<float*>(dx));
    cuda::check_launch("rms_norm_dx_kernel");
  }
  if (dw) {
    if (R == 0) return ctx.services->fill(dw, D, DType::F32, 0.0);
    // About 2048 blocks of partial sums (enough to fill the GPU), at least 16 rows each.
    const int threads = D >= kThreads ? kThreads : int((D + 31) / 32 * 32);
    const int64_t col_blocks = (D + threads - 1) / threads;
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(2048 / col_blocks, (R + 15) / 16));
    const int64_t rows_per_chunk = (R + chunks - 1) / chunks;
    const size_t bytes = size_t(chunks * D) * sizeof(float);
    float* partial = static_cast<float*>(ctx.services->allocate(bytes));
    rms_norm_dw_partial_kernel<T><<<dim3(unsigned(col_blocks), unsigned(chunks)), threads, 0, s>>>(
        R, D, rows_per_chunk, static_cast<const T*>(x), static_cast<const float*>(rstd),
        static_cast<const float*>(dy), partial);
    cuda::check_launch("rms_norm_dw_partial_kernel");
    sum_columns_kernel<<<unsigned((D + 31) / 32), 32 * kSumLanes, 0, s>>>(chunks, D, partial,
                                                                        static_cast<float*>(dw));
    cuda::check_launch("sum_columns_kernel");
    ctx.services->deallocate(partial, bytes);  // stream-ordered: reused only by later work
  }
}

const bool registered = cuda::register_float_kernels(
    "rms_norm", "CUDA: warp per row, f32 statistics; dw by row-chunk column sums",
    "CUDA: warp per row, f32 statistics, bf16 rounding as transformers",
    TITAN_FLOAT_KERNEL(RmsNormKernel, forward<T>, backward<T>));

}  // namespace
}  // namespace titan::ops
