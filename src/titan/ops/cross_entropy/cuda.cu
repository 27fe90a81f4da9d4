// Cross-entropy and fused linear + cross-entropy on CUDA (contract in ops/cross_entropy/cuda.h).
//
// Row statistics: one block per row; each thread runs an online (max, sum of exp) over its
// columns, the pairs are merged across the block. The fused op keeps, per row, the running
// (max, sum) over the vocabulary chunks seen so far and the label's logit once its chunk comes by,
// so each chunk's logits live only between its GEMM and its statistics pass; or, when the caller
// keeps all the logits for the backward, one GEMM over the whole vocabulary writes them and one
// pass takes the statistics, and the backward turns them into dlogits in place.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "titan/backend/cuda/common.cuh"
#include "titan/backend/cuda/gemm.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/cross_entropy/cross_entropy.h"
#include "titan/ops/cross_entropy/cuda.h"
#include "titan/ops/cuda_registration.h"

namespace titan::cuda {

namespace {

constexpr int kRowThreads = 256;

// Whether row n takes part; labels outside [0, V) (rejected by the op before) are skipped, never read.
__device__ __forceinline__ bool counted(int64_t label, int64_t V, int64_t ignore_index) {
  return label != ignore_index && label >= 0 && label < V;
}

// (max, sum exp(x - max)) pairs: merging is associative, -inf max means "nothing seen".
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};  // 0, or NaN when a NaN logit was seen: keep it
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}
// Block-wide merge; every thread gets the result. `shared` holds 2 * 32 floats.
__device__ MaxSum block_merge(MaxSum v, float* shared) {
  for (int o = 16; o > 0; o >>= 1)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v.m, shared[32 + warp] = v.s;
  __syncthreads();
  v = lane < warps ? MaxSum{shared[lane], shared[32 + lane]} : MaxSum{-INFINITY, 0.f};
  for (int o = 16; o > 0; o >>= 1)
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  return v;
}

// The element bits load_vec / store_vec (common.cuh) take: f32 as it is, bf16 as its 16 bits.
__device__ __forceinline__ const float* bits(const float* p) {
  return p;
}
__device__ __forceinline__ const uint16_t* bits(const bf16_t* p) {
  return reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ float* bits(float* p) {
  return p;
}
__device__ __forceinline__ uint16_t* bits(bf16_t* p) {
  return reinterpret_cast<uint16_t*>(p);
}
// Whether rows of C elements, `ld` apart from `p`, may be read kVec = 4 at a time.
inline bool rows_of_4(const void* p, size_t elem_bytes, int64_t C, int64_t ld) {
  return C % 4 == 0 && ld % 4 == 0 && vector_aligned(p, 4, elem_bytes);
}

// Folds one logit into a thread's online (max, sum).
__device__ __forceinline__ void fold(MaxSum& local, float v) {
  if (v == -INFINITY) return;  // contributes exp(-inf) = 0 (and would make -inf - -inf = NaN below)
  if (v > local.m) {
    local.s = local.s * expf(local.m - v) + 1.f;
    local.m = v;
  } else {
    local.s += expf(v - local.m);
  }
}

// (max, sum) over x[0..C) of one row, read kVec elements at a time (kVec 4: C a multiple of 4 and x
// aligned to it).
template <int kVec, class T>
__device__ MaxSum row_max_sum(const T* x, int64_t C, float* shared) {
  MaxSum local{-INFINITY, 0.f};
  for (int64_t v = threadIdx.x; v < C / kVec; v += blockDim.x) {
    float e[kVec];
    load_vec<kVec>(bits(x), v, e);
#pragma unroll
    for (int i = 0; i < kVec; ++i) fold(local, e[i]);
  }
  return block_merge(local, shared);
}

template <int kVec, class T>
__global__ void ce_forward_kernel(int64_t V, const T* logits, const int64_t* labels, int64_t ignore_index,
                                  float* lse, float* row_loss) {
  __shared__ float shared[64];
  const int64_t n = blockIdx.x;
  const int64_t y = labels[n];
  if (!counted(y, V, ignore_index)) {  // block-uniform
    if (threadIdx.x == 0) lse[n] = row_loss[n] = 0.f;
    return;
  }
  const T* x = logits + n * V;
  const MaxSum r = row_max_sum<kVec>(x, V, shared);
  if (threadIdx.x == 0) {
    const float l = r.m + logf(r.s);
    lse[n] = l;
    row_loss[n] = l - to_f32(x[y]);
  }
}

// ---- fused linear + cross-entropy -----------------------------------------------------------

__global__ void lce_init_kernel(int64_t N, float* run_max, float* run_sum, float* label_logit) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += int64_t(gridDim.x) * blockDim.x) {
    run_max[n] = -INFINITY;
    run_sum[n] = 0.f;
    label_logit[n] = 0.f;
  }
}

// One block per row: folds chunk columns [c0, c0 + C) (row n's at logits + n * ld) into the row's
// running stats.
template <int kVec, class TL>
__global__ void lce_chunk_stats_kernel(int64_t V, int64_t C, int64_t c0, const TL* logits, int64_t ld,
                                       const int64_t* labels, int64_t ignore_index, float* run_max,
                                       float* run_sum, float* label_logit) {
  __shared__ float shared[64];
  const int64_t n = blockIdx.x, y = labels[n];
  if (!counted(y, V, ignore_index)) return;  // block-uniform
  const TL* x = logits + n * ld;
  const MaxSum r = row_max_sum<kVec>(x, C, shared);
  if (threadIdx.x == 0) {
    const MaxSum total = merge({run_max[n], run_sum[n]}, r);
    run_max[n] = total.m;
    run_sum[n] = total.s;
    if (y >= c0 && y < c0 + C) label_logit[n] = to_f32(x[y - c0]);
  }
}

__global__ void lce_finish_kernel(int64_t N, int64_t V, const int64_t* labels, int64_t ignore_index,
                                  const float* run_max, const float* run_sum, const float* label_logit,
                                  float* lse, float* row_loss) {
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N;
       n += int64_t(gridDim.x) * blockDim.x) {
    if (!counted(labels[n], V, ignore_index)) {
      lse[n] = row_loss[n] = 0.f;
      continue;
    }
    const float l = run_max[n] + logf(run_sum[n]);
    lse[n] = l;
    row_loss[n] = l - label_logit[n];
  }
}

// dlogits of one chunk, in the GEMM operand type TD (bf16 rounds once, as the reference does).
// Rows on grid y (the label and lse read once per row), columns on grid x, kVec elements per access
// (kVec 4: C and ld multiples of 4, both buffers aligned to it): no 64-bit division per element
// (a call covers N x C elements: a vocabulary chunk of the chunked path, or the whole vocabulary
// of kept logits, 2.5G elements for 16k tokens of Qwen3's).
template <int kVec, class TL, class TD>
__global__ void lce_chunk_grad_kernel(int64_t N, int64_t V, int64_t C, int64_t c0, const TL* logits,
                                      int64_t ld, const int64_t* labels, int64_t ignore_index,
                                      const float* lse, float scale, TD* dlogits) {
  for (int64_t n = blockIdx.y; n < N; n += gridDim.y) {
    const int64_t y = labels[n];
    const bool row_counts = counted(y, V, ignore_index);
    const float row_lse = row_counts ? lse[n] : 0.f;
    const TL* row = logits + n * ld;
    TD* out = dlogits + n * C;
    for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < C / kVec;
         v += int64_t(gridDim.x) * blockDim.x) {
      float g[kVec] = {};  // rows that do not count get zeros, their logits unread
      if (row_counts) {
        load_vec<kVec>(bits(row), v, g);
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          g[i] = scale * (expf(g[i] - row_lse) - (c0 + v * kVec + i == y ? 1.f : 0.f));
      }
      store_vec<kVec>(bits(out), v, g);
    }
  }
}

// Columns in blocks of 256 threads of kVec elements; rows at most 8192 blocks high (a block then
// walks several rows: a chunk's rows are many and short).
dim3 chunk_grad_grid(int64_t N, int64_t C, int vec) {
  return dim3(unsigned(std::clamp<int64_t>((C / vec + 255) / 256, 1, 65535)),
              unsigned(std::clamp<int64_t>(N, 1, 8192)));
}

// Launches the chunk gradient kernel with 4-element accesses where the rows allow them.
template <class TL, class TD>
void launch_chunk_grad(cudaStream_t stream, int64_t N, int64_t V, int64_t C, int64_t c0, const TL* logits,
                       int64_t ld, const int64_t* labels, int64_t ignore_index, const float* lse, float scale,
                       TD* dlogits) {
  if (rows_of_4(logits, sizeof(TL), C, ld) && rows_of_4(dlogits, sizeof(TD), C, C))
    lce_chunk_grad_kernel<4, TL, TD><<<chunk_grad_grid(N, C, 4), 256, 0, stream>>>(
        N, V, C, c0, logits, ld, labels, ignore_index, lse, scale, dlogits);
  else
    lce_chunk_grad_kernel<1, TL, TD><<<chunk_grad_grid(N, C, 1), 256, 0, stream>>>(
        N, V, C, c0, logits, ld, labels, ignore_index, lse, scale, dlogits);
}

// Launches the chunk statistics kernel (one block per row), 4 elements per access where it can.
template <class TL>
void launch_chunk_stats(cudaStream_t stream, int64_t N, int64_t V, int64_t C, int64_t c0, const TL* logits,
                        int64_t ld, const int64_t* labels, int64_t ignore_index, float* run_max,
                        float* run_sum, float* label_logit) {
  if (rows_of_4(logits, sizeof(TL), C, ld))
    lce_chunk_stats_kernel<4, TL><<<unsigned(N), kRowThreads, 0, stream>>>(
        V, C, c0, logits, ld, labels, ignore_index, run_max, run_sum, label_logit);
  else
    lce_chunk_stats_kernel<1, TL><<<unsigned(N), kRowThreads, 0, stream>>>(
        V, C, c0, logits, ld, labels, ignore_index, run_max, run_sum, label_logit);
}

void check_dtype(DType dtype) {
  TITAN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "cross_entropy (cuda): no kernel for ",
              dtype_name(dtype), " (f32 and bf16 only)");
}

// The logits of a chunk: bf16 when they are rounded to bf16, else f32.
DType chunk_logits_dtype(const LinearCrossEntropyDims& d, DType dtype) {
  return dtype == DType::BF16 && d.round_logits ? DType::BF16 : DType::F32;
}

size_t dtype_bytes(DType t) {
  return t == DType::BF16 ? 2 : 4;
}

// logits[:, c0 : c0 + C] = hidden @ weight[c0 : c0 + C]^T, rows `ld` elements apart.
void chunk_logits(const KernelContext& ctx, const LinearCrossEntropyDims& d, DType dtype, const void* hidden,
                  const void* weight, int64_t c0, int64_t C, DType logits_dtype, void* logits, int64_t ld) {
  const char* w = static_cast<const char*>(weight) + size_t(c0 * d.D) * dtype_bytes(dtype);
  gemm(false, true, d.N, C, d.D, 1.f, dtype, hidden, d.D, w, d.D, 0.f, logits_dtype, logits, ld, {},
       ctx.stream);
}

// Chunk c0's logits: in the kept [N, V] logits (row stride V) when there are some, else in the
// [N, C] chunk buffer.
struct ChunkLogits {
  void* data;
  int64_t ld;
};
ChunkLogits chunk_place(const LinearCrossEntropyDims& d, DType ld_type, void* kept, void* chunk_buffer, int64_t c0,
                        int64_t C) {
  if (kept) return {static_cast<char*>(kept) + size_t(c0) * dtype_bytes(ld_type), d.V};
  return {chunk_buffer, C};
}

}  // namespace

void cross_entropy_fwd(const KernelContext& ctx, int64_t N, int64_t V, DType dtype, const void* logits,
                       const int64_t* labels, int64_t ignore_index, float* lse, float* row_loss) {
  check_dtype(dtype);
  if (N == 0) return;
  TITAN_CHECK(N <= 0x7fffffff, "cross_entropy (cuda): ", N, " rows exceed the grid");
  // One block per row, 4 elements per access where the rows allow it.
  auto launch = [&](const auto* x) {
    if (rows_of_4(x, sizeof(*x), V, V))
      ce_forward_kernel<4>
          <<<unsigned(N), kRowThreads, 0, stream_of(ctx)>>>(V, x, labels, ignore_index, lse, row_loss);
    else
      ce_forward_kernel<1>
          <<<unsigned(N), kRowThreads, 0, stream_of(ctx)>>>(V, x, labels, ignore_index, lse, row_loss);
  };
  if (dtype == DType::F32)
    launch(static_cast<const float*>(logits));
  else
    launch(static_cast<const bf16_t*>(logits));
  check_launch("cross_entropy (cuda): forward");
}

void cross_entropy_bwd(const KernelContext& ctx, int64_t N, int64_t V, DType dtype, const void* logits,
                       const int64_t* labels, int64_t ignore_index, const float* lse, double scale,
                       float* dlogits) {
  check_dtype(dtype);
  if (N == 0) return;
  // The whole vocabulary as one chunk of the fused loss's gradient kernel: rows on the grid's y
  // (labels and lse read once per row), columns on x, no 64-bit division per element.
  if (dtype == DType::F32)
    launch_chunk_grad(stream_of(ctx), N, V, V, 0, static_cast<const float*>(logits), V, labels, ignore_index,
                      lse, float(scale), dlogits);
  else
    launch_chunk_grad(stream_of(ctx), N, V, V, 0, static_cast<const bf16_t*>(logits), V, labels, ignore_index,
                      lse, float(scale), dlogits);
  check_launch("cross_entropy (cuda): backward");
}

void linear_cross_entropy_fwd(const KernelContext& ctx, const LinearCrossEntropyDims& d, DType dtype,
                              const void* hidden, const void* weight, const int64_t* labels,
                              int64_t ignore_index, float* lse, float* row_loss, void* keep_logits) {
  check_dtype(dtype);
  TITAN_CHECK(d.chunk > 0 && d.N <= 0x7fffffff, "linear_cross_entropy (cuda): bad chunk ", d.chunk, " or N ",
              d.N);
  if (d.N == 0) return;
  const DType ld = chunk_logits_dtype(d, dtype);
  if (keep_logits) {  // every logit into the kept buffer by one GEMM, then the rows' statistics
    chunk_logits(ctx, d, dtype, hidden, weight, 0, d.V, ld, keep_logits, d.V);
    cross_entropy_fwd(ctx, d.N, d.V, ld, keep_logits, labels, ignore_index, lse, row_loss);
    return;
  }
  const int64_t chunk = d.chunk < d.V ? d.chunk : d.V;
  Scratch logits(ctx, size_t(d.N * chunk) * dtype_bytes(ld));
  Scratch stats(ctx, size_t(3 * d.N) * sizeof(float));
  float *run_max = stats.as<float>(), *run_sum = run_max + d.N, *label_logit = run_sum + d.N;
  cudaStream_t stream = stream_of(ctx);
  lce_init_kernel<<<grid_for(d.N), 256, 0, stream>>>(d.N, run_max, run_sum, label_logit);
  check_launch("cross_entropy (cuda): init");
  for (int64_t c0 = 0; c0 < d.V; c0 += chunk) {
    const int64_t C = d.V - c0 < chunk ? d.V - c0 : chunk;
    const ChunkLogits at = chunk_place(d, ld, keep_logits, logits.as<void>(), c0, C);
    chunk_logits(ctx, d, dtype, hidden, weight, c0, C, ld, at.data, at.ld);
    if (ld == DType::BF16)
      launch_chunk_stats(stream, d.N, d.V, C, c0, static_cast<const bf16_t*>(at.data), at.ld, labels,
                         ignore_index, run_max, run_sum, label_logit);
    else
      launch_chunk_stats(stream, d.N, d.V, C, c0, static_cast<const float*>(at.data), at.ld, labels,
                         ignore_index, run_max, run_sum, label_logit);
    check_launch("cross_entropy (cuda): chunk statistics");
  }
  lce_finish_kernel<<<grid_for(d.N), 256, 0, stream>>>(d.N, d.V, labels, ignore_index, run_max, run_sum,
                                                       label_logit, lse, row_loss);
  check_launch("cross_entropy (cuda): finish");
}

void linear_cross_entropy_bwd(const KernelContext& ctx, const LinearCrossEntropyDims& d, DType dtype,
                              const void* hidden, const void* weight, const int64_t* labels,
                              int64_t ignore_index, const float* lse, double scale, float* dhidden,
                              float* dweight, void* kept_logits, bool add_dweight) {
  check_dtype(dtype);
  TITAN_CHECK(d.chunk > 0, "linear_cross_entropy (cuda): bad chunk ", d.chunk);
  cudaStream_t stream = stream_of(ctx);
  if (d.N == 0) {  // no rows: zero gradients
    if (dweight && !add_dweight)
      TITAN_CHECK(cudaMemsetAsync(dweight, 0, sizeof(float) * size_t(d.V * d.D), stream) == cudaSuccess,
                  "linear_cross_entropy (cuda): clearing dweight failed");
    return;
  }
  if (!dhidden && !dweight) return;
  const DType ld = chunk_logits_dtype(d, dtype);
  if (kept_logits && ld == dtype) {
    // The kept logits become dlogits in place (each element read, then written, by one thread), and
    // the two GEMMs run once over the whole vocabulary.
    const float s = float(scale);
    if (dtype == DType::BF16)
      launch_chunk_grad(stream, d.N, d.V, d.V, 0, static_cast<const bf16_t*>(kept_logits), d.V, labels,
                        ignore_index, lse, s, static_cast<bf16_t*>(kept_logits));
    else
      launch_chunk_grad(stream, d.N, d.V, d.V, 0, static_cast<const float*>(kept_logits), d.V, labels,
                        ignore_index, lse, s, static_cast<float*>(kept_logits));
    check_launch("cross_entropy (cuda): dlogits");
    if (dhidden)  // dhidden = dlogits [N, V] @ weight [V, D]
      gemm(false, false, d.N, d.D, d.V, 1.f, dtype, kept_logits, d.V, weight, d.D, 0.f, DType::F32, dhidden,
           d.D, {}, ctx.stream);
    if (dweight)  // dweight (+)= dlogits^T [V, N] @ hidden [N, D]
      gemm(true, false, d.V, d.D, d.N, 1.f, dtype, kept_logits, d.V, hidden, d.D, add_dweight ? 1.f : 0.f,
           DType::F32, dweight, d.D, {}, ctx.stream);
    return;
  }
  const int64_t chunk = d.chunk < d.V ? d.chunk : d.V;
  // Kept logits are read where the forward left them; otherwise each chunk's are recomputed.
  Scratch logits(ctx, kept_logits ? 0 : size_t(d.N * chunk) * dtype_bytes(ld));
  Scratch dlogits(ctx, size_t(d.N * chunk) * dtype_bytes(dtype));
  for (int64_t c0 = 0; c0 < d.V; c0 += chunk) {
    const int64_t C = d.V - c0 < chunk ? d.V - c0 : chunk;
    const ChunkLogits at = chunk_place(d, ld, kept_logits, logits.as<void>(), c0, C);
    if (!kept_logits) chunk_logits(ctx, d, dtype, hidden, weight, c0, C, ld, at.data, at.ld);
    const float s = float(scale);
    if (ld == DType::BF16)  // bf16 logits imply bf16 operands
      launch_chunk_grad(stream, d.N, d.V, C, c0, static_cast<const bf16_t*>(at.data), at.ld, labels,
                        ignore_index, lse, s, dlogits.as<bf16_t>());
    else if (dtype == DType::BF16)
      launch_chunk_grad(stream, d.N, d.V, C, c0, static_cast<const float*>(at.data), at.ld, labels,
                        ignore_index, lse, s, dlogits.as<bf16_t>());
    else
      launch_chunk_grad(stream, d.N, d.V, C, c0, static_cast<const float*>(at.data), at.ld, labels,
                        ignore_index, lse, s, dlogits.as<float>());
    check_launch("cross_entropy (cuda): chunk gradient");
    const char* w = static_cast<const char*>(weight) + size_t(c0 * d.D) * dtype_bytes(dtype);
    if (dhidden)  // dhidden (+)= dlogits [N, C] @ weight[c0 : c0 + C] [C, D]
      gemm(false, false, d.N, d.D, C, 1.f, dtype, dlogits.as<void>(), C, w, d.D, c0 == 0 ? 0.f : 1.f,
           DType::F32, dhidden, d.D, {}, ctx.stream);
    if (dweight)  // dweight[c0 : c0 + C] (+)= dlogits^T [C, N] @ hidden [N, D]
      gemm(true, false, C, d.D, d.N, 1.f, dtype, dlogits.as<void>(), C, hidden, d.D, add_dweight ? 1.f : 0.f,
           DType::F32, dweight + c0 * d.D, d.D, {}, ctx.stream);
  }
}

// =============================================================================================
// Registration with the loss ops (ops/cross_entropy/cross_entropy.h).
namespace {

template <DType kDType>
void ce_forward_entry(const KernelContext& ctx, int64_t N, int64_t V, const void* logits,
                      const int64_t* labels, int64_t ignore_index, void* lse, void* row_loss) {
  cross_entropy_fwd(ctx, N, V, kDType, logits, labels, ignore_index, static_cast<float*>(lse),
                    static_cast<float*>(row_loss));
}
template <DType kDType>
void ce_backward_entry(const KernelContext& ctx, int64_t N, int64_t V, const void* logits,
                       const int64_t* labels, int64_t ignore_index, const void* lse, double scale,
                       void* dlogits) {
  cross_entropy_bwd(ctx, N, V, kDType, logits, labels, ignore_index, static_cast<const float*>(lse), scale,
                    static_cast<float*>(dlogits));
}

LinearCrossEntropyDims lce_dims(const ops::LinearCrossEntropyArgs& a) {
  return {a.N, a.V, a.D, a.chunk, a.round_logits};
}
// The logits are kept from forward to backward when all of them fit in the caller's budget
// (a.keep_bytes), as the CPU kernel: the backward then skips the recomputing GEMMs.
template <DType kDType>
void lce_forward_entry(const KernelContext& ctx, const ops::LinearCrossEntropyArgs& a, void* lse,
                       void* row_loss) {
  const LinearCrossEntropyDims d = lce_dims(a);
  const DType kept = chunk_logits_dtype(d, kDType);
  void* keep = nullptr;
  if (a.kept && a.N * a.V * int64_t(dtype_bytes(kept)) <= a.keep_bytes) {
    *a.kept = Tensor::empty({a.N * a.V}, kept, ctx.device);
    keep = a.kept->raw_data();
  }
  linear_cross_entropy_fwd(ctx, d, kDType, a.hidden, a.weight, a.labels, a.ignore_index, static_cast<float*>(lse),
                           static_cast<float*>(row_loss), keep);
}
template <DType kDType>
void lce_backward_entry(const KernelContext& ctx, const ops::LinearCrossEntropyArgs& a, const void* lse,
                        double scale, void* dhidden, void* dweight, bool add_dweight) {
  void* kept = a.kept && a.kept->defined() ? a.kept->raw_data() : nullptr;
  linear_cross_entropy_bwd(ctx, lce_dims(a), kDType, a.hidden, a.weight, a.labels, a.ignore_index,
                           static_cast<const float*>(lse), scale, static_cast<float*>(dhidden),
                           static_cast<float*>(dweight), kept, add_dweight);
}

const bool cross_entropy_kernels_registered = cuda::register_float_kernels(
    "cross_entropy", "block per row, online logsumexp in f32",
    "block per row, bf16 logits widened, online logsumexp in f32",
    TITAN_FLOAT_KERNEL(ops::CrossEntropyKernel, ce_forward_entry<kDType>, ce_backward_entry<kDType>));
const bool linear_cross_entropy_kernels_registered = cuda::register_float_kernels(
    "linear_cross_entropy",
    "cuBLASLt GEMM per vocabulary chunk (f32, TF32 off), online logsumexp; logits kept for backward within "
    "keep_logits_bytes (then whole-vocabulary GEMMs, dlogits in place), else recomputed",
    "cuBLASLt bf16 GEMM per vocabulary chunk (f32 accumulation), online logsumexp; logits kept for backward "
    "within keep_logits_bytes (then whole-vocabulary GEMMs, dlogits in place), else recomputed",
    TITAN_FLOAT_KERNEL(ops::LinearCrossEntropyKernel, lce_forward_entry<kDType>, lce_backward_entry<kDType>));

}  // namespace

}  // namespace titan::cuda
