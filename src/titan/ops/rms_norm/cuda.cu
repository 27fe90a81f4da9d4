// rms_norm on CUDA (f32 and bf16), rounding where the reference rounds (rms_norm.h).
// Rows of up to kMaxRowWidth elements (every hidden size and head_dim of the Qwen3 family) take the
// row-group kernels: a group of G threads (a power of two) holds a row in registers, each thread
// kColumnsPerThread columns as vectors of 4 where the width and the pointers allow it; a block runs
// several groups side by side and keeps the weight's columns in registers for all its rows.
// Columns are dealt to threads in runs of 4 whenever D is a multiple of 4, whatever the pointers'
// alignment (unaligned views read the run element by element): a row's sums, and so its bits, do
// not depend on where the row sits in memory.
//   forward:  the row is read once: sum of squares in f32 (per-thread partial sums, then a tree
//             across the group instead of the reference's serial sum: the only difference),
//             rstd = 1 / sqrt(ss / D + eps) correctly rounded, y = T(w * T(x * rstd)) with no fused
//             multiply-add (as the CPU).
//   backward: one pass over x and dy gives both dx and dw: each thread adds its columns' dw terms
//             over the block's rows in registers, the block adds its groups' sums in group order
//             into one partial row, and the partial rows are summed in a fixed order afterwards:
//             deterministic, no atomics, and x and dy are read once (16 bytes an element before,
//             10 now, for bf16 x with f32 gradients).
// Wider rows take the warp-per-row kernels below (x and dy read twice).
#include <algorithm>

#include "titan/backend/cuda/common.cuh"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/rms_norm/rms_norm.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

constexpr int kWarpsPerBlock = kThreads / 32;

// ---- row-group kernels ----------------------------------------------------------------------
constexpr int kColumnsPerThread = 16;
constexpr int kMaxGroup = 512;  // threads per row; also the largest block
constexpr int64_t kMaxRowWidth = int64_t(kMaxGroup) * kColumnsPerThread;
constexpr int kBackwardBlocks = 1024;  // partial dw rows: enough blocks to fill the GPU

// The sum of v over the G threads of this thread's group (G a power of two; groups are aligned
// runs of G threads). Every thread of the block must call it the same number of times: past a warp
// it goes through `scratch` (32 floats of shared memory) with barriers.
__device__ inline float group_sum(float v, int G, float* scratch) {
  for (int o = min(G, 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (G <= 32) return v;
  const int warp = threadIdx.x >> 5, per_group = G >> 5, first = warp / per_group * per_group;
  __syncthreads();  // the previous call's readers are done with scratch
  if ((threadIdx.x & 31) == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < per_group; ++i) total += scratch[first + i];
  return total;
}

// How a launch lays rows out: runs of `vec` columns per thread item (4 when D allows it), G threads
// per row, `block` threads (G or 256, whichever is larger), block / G rows at a time per block.
struct RowGroups {
  int vec, G, block;
  int groups() const { return block / G; }
};

RowGroups row_groups(int64_t D) {
  const int vec = D % 4 == 0 ? 4 : 1;
  const int64_t vectors = D / vec, per_thread = kColumnsPerThread / vec;
  int G = 1;
  while (int64_t(G) * per_thread < vectors) G *= 2;
  return {vec, G, std::max(G, kThreads)};
}

// kAligned: every pointer may be read kVec elements at a time (else element by element, same order).
template <class T, int kVec, bool kAligned>
__global__ void __launch_bounds__(kMaxGroup)
    rms_norm_forward_rows(int64_t R, int64_t D, int G, float eps, const T* __restrict__ x,
                          const T* __restrict__ w, T* __restrict__ y, float* __restrict__ rstd) {
  constexpr int kItems = kColumnsPerThread / kVec;
  __shared__ float scratch[32];
  const int t = threadIdx.x & (G - 1), group = threadIdx.x / G, groups = blockDim.x / G;
  const int64_t vectors = D / kVec;
  float wv[kItems][kVec];
#pragma unroll
  for (int i = 0; i < kItems; ++i)
    if (t + int64_t(i) * G < vectors) load_run<kVec, kAligned>(w, t + int64_t(i) * G, wv[i]);
  // Block-uniform loop (group_sum's barriers): a group past the last row computes nothing.
  for (int64_t base = int64_t(blockIdx.x) * groups; base < R; base += int64_t(gridDim.x) * groups) {
    const int64_t r = base + group;
    const bool active = r < R;
    float xv[kItems][kVec];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t v = t + int64_t(i) * G;
      if (active && v < vectors) {
        load_run<kVec, kAligned>(x + r * D, v, xv[i]);
#pragma unroll
        for (int e = 0; e < kVec; ++e) ss += xv[i][e] * xv[i][e];
      }
    }
    ss = group_sum(ss, G, scratch);
    if (!active) continue;
    const float rs = 1.f / sqrtf(__fadd_rn(ss / float(D), eps));
    if (t == 0) rstd[r] = rs;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t v = t + int64_t(i) * G;
      if (v >= vectors) continue;
      float out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = __fmul_rn(wv[i][e], round_to<T>(__fmul_rn(xv[i][e], rs)));
      store_run<kVec, kAligned>(y + r * D, v, out);
    }
  }
}

// Rows [blockIdx.x * rows_per_block, + rows_per_block): dx for each (when dx is not null) and, when
// dw_partial is not null, the sum over these rows of dy * T(x * rstd) into dw_partial[blockIdx.x].
// dy and dx are of the gradient element type Gr: float, or bf16 bits (bf16 activation gradients:
// dy widened exactly, dx rounded once as it is stored).
template <class T, class Gr, int kVec, bool kAligned>
__global__ void __launch_bounds__(kMaxGroup)
    rms_norm_backward_rows(int64_t R, int64_t D, int G, int64_t rows_per_block, const T* __restrict__ x,
                           const T* __restrict__ w, const float* __restrict__ rstd, const Gr* __restrict__ dy,
                           Gr* __restrict__ dx, float* __restrict__ dw_partial) {
  constexpr int kItems = kColumnsPerThread / kVec;
  __shared__ float scratch[32];
  __shared__ float group_dw[kMaxGroup * kColumnsPerThread];  // [groups, D]: groups * D <= block * 16
  const int t = threadIdx.x & (G - 1), group = threadIdx.x / G, groups = blockDim.x / G;
  const int64_t vectors = D / kVec;
  float wv[kItems][kVec], acc[kItems][kVec];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    if (t + int64_t(i) * G < vectors) load_run<kVec, kAligned>(w, t + int64_t(i) * G, wv[i]);
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[i][e] = 0.f;
  }
  const int64_t row0 = int64_t(blockIdx.x) * rows_per_block, row_end = min(R, row0 + rows_per_block);
  for (int64_t base = row0; base < row_end; base += groups) {  // block-uniform, as in the forward
    const int64_t r = base + group;
    const bool active = r < row_end;
    const float rs = active ? rstd[r] : 0.f;
    float xv[kItems][kVec], gv[kItems][kVec];
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t v = t + int64_t(i) * G;
      if (active && v < vectors) {
        load_run<kVec, kAligned>(x + r * D, v, xv[i]);
        load_run<kVec, kAligned>(dy + r * D, v, gv[i]);
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot += gv[i][e] * wv[i][e] * (xv[i][e] * rs);
      }
    }
    if (dx) {  // the same for every thread
      const float mean = group_sum(dot, G, scratch) / float(D);
#pragma unroll
      for (int i = 0; i < kItems; ++i) {
        const int64_t v = t + int64_t(i) * G;
        if (!active || v >= vectors) continue;
        float out[kVec];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float gw = __fmul_rn(gv[i][e], wv[i][e]);
          const float xm = __fmul_rn(__fmul_rn(xv[i][e], rs), mean);
          out[e] = __fmul_rn(rs, __fsub_rn(gw, xm));
        }
        store_run<kVec, kAligned>(dx + r * D, v, out);
      }
    }
    if (dw_partial && active) {
#pragma unroll
      for (int i = 0; i < kItems; ++i)
        if (t + int64_t(i) * G < vectors) {
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            acc[i][e] = __fadd_rn(acc[i][e], __fmul_rn(gv[i][e], round_to<T>(__fmul_rn(xv[i][e], rs))));
        }
    }
  }
  if (!dw_partial) return;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t v = t + int64_t(i) * G;
    if (v >= vectors) continue;
#pragma unroll
    for (int e = 0; e < kVec; ++e) group_dw[group * D + v * kVec + e] = acc[i][e];
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float total = 0.f;
    for (int g = 0; g < groups; ++g) total = __fadd_rn(total, group_dw[g * D + d]);
    dw_partial[int64_t(blockIdx.x) * D + d] = total;
  }
}

// ---- warp-per-row kernels (rows wider than kMaxRowWidth) -----------------------------------------
template <class T>
__global__ void rms_norm_forward_wide(int64_t R, int64_t D, float eps, const T* x, const T* w, T* y,
                                      float* rstd) {
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

template <class T, class Gr>
__global__ void rms_norm_dx_wide(int64_t R, int64_t D, const T* x, const T* w, const float* rstd,
                                 const Gr* dy, Gr* dx) {
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (r >= R) return;
  const T* xr = x + r * D;
  const Gr* g = dy + r * D;
  const float rs = rstd[r];
  float dot = 0.f;
  for (int64_t d = lane; d < D; d += 32) dot += load_f32(g, d) * load_f32(w, d) * (load_f32(xr, d) * rs);
  const float mean = cuda::warp_sum(dot) / float(D);
  for (int64_t d = lane; d < D; d += 32) {
    const float gw = __fmul_rn(load_f32(g, d), load_f32(w, d));
    const float xm = __fmul_rn(__fmul_rn(load_f32(xr, d), rs), mean);
    store_f32(dx, r * D + d, __fmul_rn(rs, __fsub_rn(gw, xm)));
  }
}

// partial[c, d] = sum over the rows of chunk c (rows_per_chunk consecutive rows) of
// dy[r, d] * T(x[r, d] * rstd[r]); one thread per column, coalesced across the row.
template <class T, class Gr>
__global__ void rms_norm_dw_partial_wide(int64_t R, int64_t D, int64_t rows_per_chunk, const T* x,
                                         const float* rstd, const Gr* dy, float* partial) {
  const int64_t d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t c = blockIdx.y;
  if (d >= D) return;
  const int64_t r0 = c * rows_per_chunk, r1 = min(R, r0 + rows_per_chunk);
  float acc = 0.f;
  for (int64_t r = r0; r < r1; ++r)
    acc = __fadd_rn(
        acc, __fmul_rn(load_f32(dy, r * D + d), round_to<T>(__fmul_rn(load_f32(x + r * D, d), rstd[r]))));
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

// dw = the column sums of partial [chunks, D] (fixed order), then partial is released.
void sum_partial_rows(const KernelContext& ctx, int64_t chunks, int64_t D, float* partial, size_t bytes,
                      void* dw) {
  sum_columns_kernel<<<unsigned((D + 31) / 32), 32 * kSumLanes, 0, stream_of(ctx)>>>(chunks, D, partial,
                                                                                     static_cast<float*>(dw));
  check_launch("sum_columns_kernel");
  ctx.services->deallocate(partial, bytes);  // stream-ordered: reused only by later work
}

template <class T>
void forward(const KernelContext& ctx, int64_t R, int64_t D, double eps, const void* x, const void* w, void* y,
             void* rstd) {
  if (R == 0) return;
  cudaStream_t s = stream_of(ctx);
  const T *xt = static_cast<const T*>(x), *wt = static_cast<const T*>(w);
  if (D > kMaxRowWidth) {
    rms_norm_forward_wide<T><<<unsigned((R + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0, s>>>(
        R, D, float(eps), xt, wt, static_cast<T*>(y), static_cast<float*>(rstd));
    return check_launch("rms_norm_forward_wide");
  }
  const RowGroups rg = row_groups(D);
  const bool aligned = vectors_of_4(D, {{x, sizeof(T)}, {w, sizeof(T)}, {y, sizeof(T)}});
  const unsigned blocks = unsigned(std::min<int64_t>((R + rg.groups() - 1) / rg.groups(), 4096));
  auto launch = [&](auto kernel) {
    kernel<<<blocks, rg.block, 0, s>>>(R, D, rg.G, float(eps), xt, wt, static_cast<T*>(y),
                                       static_cast<float*>(rstd));
  };
  if (rg.vec == 1)
    launch(rms_norm_forward_rows<T, 1, true>);
  else if (aligned)
    launch(rms_norm_forward_rows<T, 4, true>);
  else
    launch(rms_norm_forward_rows<T, 4, false>);
  check_launch("rms_norm_forward_rows");
}

// Gr: the gradient element type of dy and dx (float, or bf16 bits for bf16 activation gradients).
template <class T, class Gr>
void backward(const KernelContext& ctx, int64_t R, int64_t D, const void* x, const void* w, const void* rstd,
              const void* dy, void* dx, void* dw) {
  if (!dx && !dw) return;
  if (R == 0) return dw ? ctx.services->fill(dw, D, DType::F32, 0.0) : void();
  cudaStream_t s = stream_of(ctx);
  const T *xt = static_cast<const T*>(x), *wt = static_cast<const T*>(w);
  const float* rs = static_cast<const float*>(rstd);
  const Gr* g = static_cast<const Gr*>(dy);
  Gr* dxg = static_cast<Gr*>(dx);
  if (D <= kMaxRowWidth) {
    const RowGroups rg = row_groups(D);
    const bool aligned =
        vectors_of_4(D, {{x, sizeof(T)}, {w, sizeof(T)}, {dy, sizeof(Gr)}, {dx, sizeof(Gr)}});
    const int64_t blocks_wanted = std::min<int64_t>((R + rg.groups() - 1) / rg.groups(), kBackwardBlocks);
    const int64_t rows_per_block = (R + blocks_wanted - 1) / blocks_wanted;
    const int64_t blocks = (R + rows_per_block - 1) / rows_per_block;
    const size_t bytes = dw ? size_t(blocks * D) * sizeof(float) : 0;
    float* partial = dw ? static_cast<float*>(ctx.services->allocate(bytes)) : nullptr;
    auto launch = [&](auto kernel) {
      kernel<<<unsigned(blocks), rg.block, 0, s>>>(R, D, rg.G, rows_per_block, xt, wt, rs, g, dxg, partial);
    };
    if (rg.vec == 1)
      launch(rms_norm_backward_rows<T, Gr, 1, true>);
    else if (aligned)
      launch(rms_norm_backward_rows<T, Gr, 4, true>);
    else
      launch(rms_norm_backward_rows<T, Gr, 4, false>);
    check_launch("rms_norm_backward_rows");
    if (dw) sum_partial_rows(ctx, blocks, D, partial, bytes, dw);
    return;
  }
  if (dx) {
    rms_norm_dx_wide<T, Gr>
        <<<unsigned((R + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0, s>>>(R, D, xt, wt, rs, g, dxg);
    check_launch("rms_norm_dx_wide");
  }
  if (dw) {
    // About 2048 blocks of partial sums (enough to fill the GPU), at least 16 rows each.
    const int64_t col_blocks = (D + kThreads - 1) / kThreads;
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(2048 / col_blocks, (R + 15) / 16));
    const int64_t rows_per_chunk = (R + chunks - 1) / chunks;
    const size_t bytes = size_t(chunks * D) * sizeof(float);
    float* partial = static_cast<float*>(ctx.services->allocate(bytes));
    rms_norm_dw_partial_wide<T, Gr><<<dim3(unsigned(col_blocks), unsigned(chunks)), kThreads, 0, s>>>(
        R, D, rows_per_chunk, xt, rs, g, partial);
    check_launch("rms_norm_dw_partial_wide");
    sum_partial_rows(ctx, chunks, D, partial, bytes, dw);
  }
}

// The bf16-gradient backward of the bf16 kernel (none for f32).
template <class T>
constexpr decltype(RmsNormKernel::backward_bf16_grads) bf16_grads_backward() {
  if constexpr (sizeof(T) == 2)
    return &backward<T, uint16_t>;
  else
    return nullptr;
}

const bool registered = cuda::register_float_kernels(
    "rms_norm", "CUDA: a row per thread group in registers, f32 statistics; dx and dw in one pass",
    "CUDA: a row per thread group in registers, f32 statistics, bf16 rounding as transformers",
    TITAN_FLOAT_KERNEL(RmsNormKernel, forward<T>, backward<T, float>, bf16_grads_backward<T>()));

}  // namespace
}  // namespace titan::ops
