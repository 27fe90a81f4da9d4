// Causal GQA attention on CUDA (ops/attention/cuda.h has the contract; docs/kernels.md the
// design): f32 math, and flash attention on the tensor cores through WMMA or raw mma.sync (below,
// after the WMMA pair), and the entry points of cuDNN's fused engines (at the end). The first two:
//
// f32 math: one warp per query row (forward, dq) or per key row (dk, dv). The block stages a tile
// of 32 rows of the other side in shared memory as f32; each lane scores one of those 32 rows with
// a full f32 dot product, the warp does the online softmax with shuffles, and each lane owns
// D / 32 output columns. Simple, any head_dim, exact f32 arithmetic: the parity baseline and what
// f32 models run.
//
// Tensor cores: FlashAttention-2 on bf16 WMMA 16x16x16 tiles (f32 accumulators), 64 x 64 tiles,
// 4 warps of 16 rows each. WMMA accumulator layouts are opaque, so the softmax goes through a
// per-warp f32 scratch tile in shared memory; the forward keeps its output rows in registers with
// a fixed lane -> (row, column) map so the online-softmax rescale is elementwise. The backward runs
// one block per (batch, kv head, 64-key tile), loops over the query heads of the group and the
// query tiles at or after the key tile, keeps dK and dV in accumulator fragments and adds dQ with
// f32 atomics (dq is f32 anyway).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "titan/backend/cuda/common.cuh"
#include "titan/backend/cuda/cudnn_attention.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/attention/attention.h"
#include "titan/ops/attention/cuda.h"

namespace titan::cuda {

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;


__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
// Offsets of row i, head h in [B, S, H, D].
__device__ __forceinline__ int64_t row_offset(int64_t b, int64_t i, int64_t h, const AttentionShape& s,
                                              int64_t H) {
  return ((b * s.S + i) * H + h) * s.D;
}

// =============================================================================================
// f32 math kernels. kTile rows of the other side per shared-memory tile, kWarps rows per block.
constexpr int kTile = 32;
constexpr int kWarps = 8;

// Loads rows r0 .. r0+kTile-1 (head `h` of an [B, S, H, D] tensor) into dst[kTile][D+1] as f32,
// zeros past S.
template <class T>
__device__ void load_tile_f32(float* dst, const T* src, int64_t b, int64_t r0, int64_t h, int64_t H,
                              const AttentionShape& s) {
  const int D = int(s.D), ld = D + 1;
  for (int idx = threadIdx.x; idx < kTile * D; idx += blockDim.x) {
    const int rr = idx / D, d = idx % D;
    const int64_t r = r0 + rr;
    dst[rr * ld + d] = r < s.S ? to_f32(src[row_offset(b, r, h, s, H) + d]) : 0.f;
  }
}

// grid (ceil(S / kWarps), B * Hq), kWarps warps. C = ceil(D / 32) output columns per lane.
// acc[c] += sum over the tile's first n rows jj of w_jj * tile[jj][lane + 32 c] (the lane's columns),
// where w_jj is lane jj's value of w: P V for the output rows, dS K for dq.
template <int C>
__device__ __forceinline__ void add_weighted_rows(float (&acc)[C], float w, int n, const float* tile, int ld, int D,
                                                  int lane) {
  for (int jj = 0; jj < n; ++jj) {
    const float wj = __shfl_sync(kFull, w, jj);
    for (int c = 0; c < C; ++c) {
      const int d = lane + 32 * c;
      if (d < D) acc[c] += wj * tile[jj * ld + d];
    }
  }
}

template <class T, int C>
__global__ void __launch_bounds__(kWarps * 32)
    fwd_f32_math_kernel(AttentionShape s, const T* q, const T* k, const T* v, T* out, float* lse) {
  extern __shared__ float smem[];
  const int D = int(s.D), ld = D + 1;
  float* ks = smem;             // [kTile][D+1]
  float* vs = ks + kTile * ld;  // [kTile][D+1]
  float* qs = vs + kTile * ld;  // [kWarps][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.Hq, h = blockIdx.y % s.Hq, g = h / (s.Hq / s.Hkv);
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kWarps;  // longest rows first
  const int64_t i = q0 + warp;
  const bool row_valid = i < s.S;
  float* qrow = qs + warp * D;
  for (int d = lane; d < D; d += 32) qrow[d] = row_valid ? to_f32(q[row_offset(b, i, h, s, s.Hq) + d]) : 0.f;

  float o[C];
  for (int c = 0; c < C; ++c) o[c] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t key_end = min(s.S, q0 + kWarps);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();  // the previous tile is consumed (and qrow is visible on the first pass)
    load_tile_f32(ks, k, b, j0, g, s.Hkv, s);
    load_tile_f32(vs, v, b, j0, g, s.Hkv, s);
    __syncthreads();
    if (!row_valid || j0 > i) continue;  // warp-uniform
    const int64_t j = j0 + lane;
    float score = -INFINITY;
    if (j <= i) {
      float acc = 0.f;
      for (int d = 0; d < D; ++d) acc += qrow[d] * ks[lane * ld + d];
      score = acc * s.scale;
    }
    const float m_new = fmaxf(m, warp_max(score));  // finite: key j0 <= i is always scored
    const float p = j <= i ? expf(score - m_new) : 0.f;
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * alpha + warp_sum(p);
    m = m_new;
    const int n = i - j0 + 1 < kTile ? int(i - j0 + 1) : kTile;
    for (int c = 0; c < C; ++c) o[c] *= alpha;
    add_weighted_rows(o, p, n, vs, ld, D, lane);
  }
  if (!row_valid) return;
  const float inv = 1.f / l;
  for (int c = 0; c < C; ++c) {
    const int d = lane + 32 * c;
    if (d < D) out[row_offset(b, i, h, s, s.Hq) + d] = from_f32<T>(o[c] * inv);
  }
  if (lane == 0) lse[(b * s.Hq + h) * s.S + i] = m + logf(l);
}

// delta[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d] (the softmax backward's row term), with
// dout rounded to bf16 first when the backward's products see it rounded (tensor cores), so that
// dP - delta is formed from one dout. One warp per row; grid (ceil(B * S * Hq / 8)), 256 threads.
template <class T>
__global__ void delta_kernel(AttentionShape s, const T* out, const float* dout, bool round_dout,
                             float* delta) {
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;  // row = (b * S + i) * Hq + h
  const int lane = threadIdx.x % 32;
  if (row >= s.B * s.S * s.Hq) return;
  float acc = 0.f;
  for (int64_t d = lane; d < s.D; d += 32) {
    const float g = dout[row * s.D + d];
    acc += to_f32(out[row * s.D + d]) * (round_dout ? __bfloat162float(__float2bfloat16_rn(g)) : g);
  }
  acc = warp_sum(acc);
  const int64_t h = row % s.Hq, bi = row / s.Hq, b = bi / s.S, i = bi % s.S;
  if (lane == 0) delta[(b * s.Hq + h) * s.S + i] = acc;
}

// dq: one warp per query row, the forward's loop with p recomputed from lse.
template <class T, int C>
__global__ void __launch_bounds__(kWarps * 32)
    dq_f32_math_kernel(AttentionShape s, const T* q, const T* k, const T* v, const float* lse,
                       const float* delta, const float* dout, float* dq) {
  extern __shared__ float smem[];
  const int D = int(s.D), ld = D + 1;
  float* ks = smem;
  float* vs = ks + kTile * ld;
  float* qs = vs + kTile * ld;   // [kWarps][D]
  float* dos = qs + kWarps * D;  // [kWarps][D]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.Hq, h = blockIdx.y % s.Hq, g = h / (s.Hq / s.Hkv);
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kWarps;
  const int64_t i = q0 + warp;
  const bool row_valid = i < s.S;
  float *qrow = qs + warp * D, *dorow = dos + warp * D;
  for (int d = lane; d < D; d += 32) {
    qrow[d] = row_valid ? to_f32(q[row_offset(b, i, h, s, s.Hq) + d]) : 0.f;
    dorow[d] = row_valid ? dout[row_offset(b, i, h, s, s.Hq) + d] : 0.f;
  }
  const float row_lse = row_valid ? lse[(b * s.Hq + h) * s.S + i] : 0.f;
  const float row_delta = row_valid ? delta[(b * s.Hq + h) * s.S + i] : 0.f;
  float acc_dq[C];
  for (int c = 0; c < C; ++c) acc_dq[c] = 0.f;
  const int64_t key_end = min(s.S, q0 + kWarps);
  for (int64_t j0 = 0; j0 < key_end; j0 += kTile) {
    __syncthreads();
    load_tile_f32(ks, k, b, j0, g, s.Hkv, s);
    load_tile_f32(vs, v, b, j0, g, s.Hkv, s);
    __syncthreads();
    if (!row_valid || j0 > i) continue;
    const int64_t j = j0 + lane;
    float ds = 0.f;
    if (j <= i) {
      float qk = 0.f, dp = 0.f;
      for (int d = 0; d < D; ++d) {
        qk += qrow[d] * ks[lane * ld + d];
        dp += dorow[d] * vs[lane * ld + d];
      }
      const float p = expf(qk * s.scale - row_lse);
      ds = p * (dp - row_delta);
    }
    const int n = i - j0 + 1 < kTile ? int(i - j0 + 1) : kTile;
    add_weighted_rows(acc_dq, ds, n, ks, ld, D, lane);
  }
  if (!row_valid) return;
  for (int c = 0; c < C; ++c) {
    const int d = lane + 32 * c;
    if (d < D) dq[row_offset(b, i, h, s, s.Hq) + d] = acc_dq[c] * s.scale;
  }
}

// dk, dv: one warp per key row of kv head g; the block loops over the group's query heads and the
// query tiles at or after its keys. grid (ceil(S / kWarps), B * Hkv).
template <class T, int C>
__global__ void __launch_bounds__(kWarps * 32)
    dkdv_f32_math_kernel(AttentionShape s, const T* q, const T* k, const T* v, const float* lse,
                         const float* delta, const float* dout, float* dk, float* dv) {
  extern __shared__ float smem[];
  const int D = int(s.D), ld = D + 1;
  float* qs = smem;               // [kTile][D+1]
  float* dos = qs + kTile * ld;   // [kTile][D+1]
  float* kr = dos + kTile * ld;   // [kWarps][D]
  float* vr = kr + kWarps * D;    // [kWarps][D]
  float* lses = vr + kWarps * D;  // [kTile]
  float* deltas = lses + kTile;   // [kTile]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y / s.Hkv, g = blockIdx.y % s.Hkv, r = s.Hq / s.Hkv;
  const int64_t j0 = int64_t(blockIdx.x) * kWarps;
  const int64_t j = j0 + warp;
  const bool row_valid = j < s.S;
  float *krow = kr + warp * D, *vrow = vr + warp * D;
  for (int d = lane; d < D; d += 32) {
    krow[d] = row_valid ? to_f32(k[row_offset(b, j, g, s, s.Hkv) + d]) : 0.f;
    vrow[d] = row_valid ? to_f32(v[row_offset(b, j, g, s, s.Hkv) + d]) : 0.f;
  }
  float acc_dk[C], acc_dv[C];
  for (int c = 0; c < C; ++c) acc_dk[c] = acc_dv[c] = 0.f;
  for (int64_t h = g * r; h < g * r + r; ++h) {
    for (int64_t i0 = j0 - j0 % kTile; i0 < s.S; i0 += kTile) {
      __syncthreads();
      load_tile_f32(qs, q, b, i0, h, s.Hq, s);
      for (int idx = threadIdx.x; idx < kTile * D; idx += blockDim.x) {
        const int rr = idx / D, d = idx % D;
        const int64_t i = i0 + rr;
        dos[rr * ld + d] = i < s.S ? dout[row_offset(b, i, h, s, s.Hq) + d] : 0.f;
      }
      for (int rr = threadIdx.x; rr < kTile; rr += blockDim.x) {
        const int64_t i = i0 + rr;
        lses[rr] = i < s.S ? lse[(b * s.Hq + h) * s.S + i] : 0.f;
        deltas[rr] = i < s.S ? delta[(b * s.Hq + h) * s.S + i] : 0.f;
      }
      __syncthreads();
      if (!row_valid || i0 + kTile <= j) continue;  // every query of the tile is before this key
      const int64_t i = i0 + lane;
      float p = 0.f, ds = 0.f;
      if (i >= j && i < s.S) {
        float qk = 0.f, dp = 0.f;
        for (int d = 0; d < D; ++d) {
          qk += qs[lane * ld + d] * krow[d];
          dp += dos[lane * ld + d] * vrow[d];
        }
        p = expf(qk * s.scale - lses[lane]);
        ds = p * (dp - deltas[lane]);
      }
      for (int ii = 0; ii < kTile; ++ii) {
        const float pi = __shfl_sync(kFull, p, ii), dsi = __shfl_sync(kFull, ds, ii);
        for (int c = 0; c < C; ++c) {
          const int d = lane + 32 * c;
          if (d < D) {
            acc_dv[c] += pi * dos[ii * ld + d];
            acc_dk[c] += dsi * qs[ii * ld + d];
          }
        }
      }
    }
  }
  if (!row_valid) return;
  for (int c = 0; c < C; ++c) {
    const int d = lane + 32 * c;
    if (d < D) {
      dk[row_offset(b, j, g, s, s.Hkv) + d] = acc_dk[c] * s.scale;
      dv[row_offset(b, j, g, s, s.Hkv) + d] = acc_dv[c];
    }
  }
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), bytes, "attention (cuda)");
}

void check_dims(const AttentionShape& s, const char* what) {
  TITAN_CHECK(s.B >= 1 && s.S >= 1 && s.Hkv >= 1 && s.Hq % s.Hkv == 0 && s.D >= 1, "attention (cuda) ", what,
              ": bad shape B=", s.B, " S=", s.S, " Hq=", s.Hq, " Hkv=", s.Hkv, " D=", s.D);
  TITAN_CHECK(s.B * s.Hq <= 65535 && s.B * s.Hkv <= 65535, "attention (cuda) ", what, ": B*Hq = ", s.B * s.Hq,
              " exceeds the grid's 65535 rows");
}

// Launches `kernel`(s, args...) on one block of `warps` warps per `rows_per_block` rows of the
// sequence and per (batch, head) of `heads` heads, with `smem` bytes of dynamic shared memory.
template <class Kernel, class... Args>
void launch_row_blocks(const KernelContext& ctx, const AttentionShape& s, Kernel kernel, int rows_per_block,
                       int warps, int64_t heads, size_t smem, const char* what, Args... args) {
  allow_smem(kernel, smem);
  dim3 grid(unsigned((s.S + rows_per_block - 1) / rows_per_block), unsigned(s.B * heads));
  kernel<<<grid, warps * 32, smem, stream_of(ctx)>>>(s, args...);
  check_launch(what);
}

template <class T, int C>
void fwd_f32_math(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                  const void* v, void* out, float* lse) {
  const size_t smem = sizeof(float) * size_t(2 * kTile * (s.D + 1) + kWarps * s.D);
  launch_row_blocks(ctx, s, fwd_f32_math_kernel<T, C>, kWarps, kWarps, s.Hq, smem,
                    "attention (cuda): forward (f32 math)", static_cast<const T*>(q),
                    static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out), lse);
}

template <class T, int C>
void bwd_f32_math(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                  const void* v, const float* lse, const float* delta, const float* dout, float* dq,
                  float* dk, float* dv) {
  const T *qt = static_cast<const T*>(q), *kt = static_cast<const T*>(k), *vt = static_cast<const T*>(v);
  const size_t smem_dq = sizeof(float) * size_t(2 * kTile * (s.D + 1) + 2 * kWarps * s.D);
  launch_row_blocks(ctx, s, dq_f32_math_kernel<T, C>, kWarps, kWarps, s.Hq, smem_dq,
                    "attention (cuda): dq (f32 math)", qt, kt, vt, lse, delta, dout, dq);
  const size_t smem_kv = sizeof(float) * size_t(2 * kTile * (s.D + 1) + 2 * kWarps * s.D + 2 * kTile);
  launch_row_blocks(ctx, s, dkdv_f32_math_kernel<T, C>, kWarps, kWarps, s.Hkv, smem_kv,
                    "attention (cuda): dk/dv (f32 math)", qt, kt, vt, lse, delta, dout, dk, dv);
}

// Calls f with the columns per lane (1, 2, 4, 8 or 16) that head_dim D needs, as a compile-time
// constant: the f32-math kernels are instantiated by it.
template <class F>
void with_columns_per_lane(int64_t D, F&& f) {
  if (D <= 32) return f(std::integral_constant<int, 1>{});
  if (D <= 64) return f(std::integral_constant<int, 2>{});
  if (D <= 128) return f(std::integral_constant<int, 4>{});
  if (D <= 256) return f(std::integral_constant<int, 8>{});
  f(std::integral_constant<int, 16>{});
}
template <class T>
void fwd_f32_math_dispatch(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                           const void* v, void* out, float* lse) {
  with_columns_per_lane(s.D, [&](auto c) { fwd_f32_math<T, c.value>(ctx, s, q, k, v, out, lse); });
}
template <class T>
void bwd_f32_math_dispatch(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                           const void* v, const float* lse, const float* delta, const float* dout, float* dq,
                           float* dk, float* dv) {
  with_columns_per_lane(
      s.D, [&](auto c) { bwd_f32_math<T, c.value>(ctx, s, q, k, v, lse, delta, dout, dq, dk, dv); });
}

// The backward's delta buffer, B * Hq * S floats, from the device's allocator. Freed right after
// the kernels are queued: the caching allocator hands memory out in stream order, so a later
// allocation on the same stream cannot be overwritten before these kernels have read it.
Scratch delta_buffer(const KernelContext& ctx, const AttentionShape& s) {
  return Scratch(ctx, sizeof(float) * size_t(s.B * s.Hq * s.S));
}

template <class T>
void launch_delta(const KernelContext& ctx, const AttentionShape& s, const void* out, const float* dout,
                  bool round_dout, float* delta) {
  const int64_t rows = s.B * s.S * s.Hq;
  delta_kernel<T><<<unsigned((rows + 7) / 8), 256, 0, stream_of(ctx)>>>(s, static_cast<const T*>(out), dout,
                                                                        round_dout, delta);
  check_launch("attention (cuda): delta");
}

// =============================================================================================
// Tensor-core kernels (bf16, D = 64 or 128).
namespace wmma = nvcuda::wmma;
constexpr int kBlockRows = 64;  // query rows (forward) or key rows (backward) per block
constexpr int kTcWarps = 4;     // 16 rows each
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>;
using FragAcol = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major>;
using FragBcol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Leading dimensions (elements), padded against bank conflicts; all keep WMMA's 32-byte alignment.
template <int D>
struct TcLayout {
  static constexpr int ld = D + 8;  // bf16 [64][D+8] tiles
  static constexpr int tile_bytes = kBlockRows * ld * 2;
  static constexpr int lds = kBlockRows + 4;  // f32 [16][68] score tiles
  static constexpr int ldo = D + 4;           // f32 [16][D+4] output tiles
  static constexpr int ldp = kBlockRows + 8;  // bf16 [16][72] probability tiles
};

// The 16 bytes c of a tile row to shared memory as bf16: 8 bf16 copied, or 4 f32 rounded to bf16.
__device__ __forceinline__ void store_bf16(bf16_t* row, int c, uint4 v) {
  reinterpret_cast<uint4*>(row)[c] = v;
}
__device__ __forceinline__ void store_bf16(bf16_t* row, int c, float4 v) {
  bf16_t* d = row + 4 * c;
  d[0] = __float2bfloat16_rn(v.x);
  d[1] = __float2bfloat16_rn(v.y);
  d[2] = __float2bfloat16_rn(v.z);
  d[3] = __float2bfloat16_rn(v.w);
}

// Copies rows r0.. r0+63 of head h of a bf16 or f32 [B, S, H, D] tensor into dst[64][ld] as bf16
// (f32 rounded), 16 bytes at a time, zeros past S.
template <int D, class T>
__device__ void load_tile_bf16(bf16_t* dst, const T* src, int64_t b, int64_t r0, int64_t h, int64_t H,
                               const AttentionShape& s) {
  using Vec = std::conditional_t<std::is_same_v<T, float>, float4, uint4>;
  constexpr int kPerVec = 16 / sizeof(T);  // elements per Vec
  constexpr int kVec = D / kPerVec;        // Vec per row
  for (int idx = threadIdx.x; idx < kBlockRows * kVec; idx += blockDim.x) {
    const int rr = idx / kVec, c = idx % kVec;
    const int64_t r = r0 + rr;
    Vec val = {};
    if (r < s.S) val = reinterpret_cast<const Vec*>(src + row_offset(b, r, h, s, H))[c];
    store_bf16(dst + rr * TcLayout<D>::ld, c, val);
  }
}

// out [16][ldo] (f32) = A B for one warp's 16 rows: A [16 x 64 keys] bf16 with leading dimension
// ldp, stored row-major (FragA) or column-major (FragAcol: element (i, k) at a[k * ldp + i]), B a
// [64][ld] bf16 tile.
template <int D, class FragAT>
__device__ __forceinline__ void rows_times_tile(float* out, const bf16_t* a, const bf16_t* b) {
  using L = TcLayout<D>;
  constexpr bool kColMajor = std::is_same_v<FragAT, FragAcol>;
  for (int dn = 0; dn < D / 16; ++dn) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
    for (int kk = 0; kk < kBlockRows / 16; ++kk) {
      FragAT af;
      FragB bf;
      wmma::load_matrix_sync(af, a + (kColMajor ? (kk * 16) * L::ldp : kk * 16), L::ldp);
      wmma::load_matrix_sync(bf, b + (kk * 16) * L::ld + dn * 16, L::ld);
      wmma::mma_sync(acc, af, bf, acc);
    }
    wmma::store_matrix_sync(out + dn * 16, acc, L::ldo, wmma::mem_row_major);
  }
}

template <int D>
constexpr size_t fwd_tc_smem() {
  using L = TcLayout<D>;
  // K and V tiles, per-warp f32 scratch (also stages the Q tile), per-warp P tiles.
  constexpr size_t scratch = size_t(kTcWarps) * 16 * L::ldo * 4;
  static_assert(scratch >= size_t(L::tile_bytes), "the Q tile is staged in the scratch area");
  static_assert(L::ldo >= L::lds, "score tiles fit the scratch rows");
  return 2 * size_t(L::tile_bytes) + scratch + size_t(kTcWarps) * 16 * L::ldp * 2;
}

// grid (ceil(S / 64), B * Hq), 128 threads. Lane l of a warp owns row l / 2 of the warp's 16 rows
// and the columns of parity l % 2 of the output.
template <int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    fwd_tc_kernel(AttentionShape s, const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* out,
                  float* lse) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16_t* ks = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* vs = ks + kBlockRows * L::ld;
  float* scratch_all = reinterpret_cast<float*>(vs + kBlockRows * L::ld);
  bf16_t* ps_all = reinterpret_cast<bf16_t*>(scratch_all + kTcWarps * 16 * L::ldo);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* scratch = scratch_all + warp * 16 * L::ldo;
  bf16_t* ps = ps_all + warp * 16 * L::ldp;
  const int64_t b = blockIdx.y / s.Hq, h = blockIdx.y % s.Hq, g = h / (s.Hq / s.Hkv);
  const int64_t qt = int64_t(gridDim.x - 1 - blockIdx.x);  // longest rows first
  const int64_t q0 = qt * kBlockRows;

  // Q fragments of this warp's 16 rows, staged through the scratch area.
  FragA qf[D / 16];
  {
    bf16_t* qs = reinterpret_cast<bf16_t*>(scratch_all);
    load_tile_bf16<D>(qs, q, b, q0, h, s.Hq, s);
    __syncthreads();
    for (int kk = 0; kk < D / 16; ++kk)
      wmma::load_matrix_sync(qf[kk], qs + (warp * 16) * L::ld + kk * 16, L::ld);
  }

  const int row = lane / 2, parity = lane % 2;
  const int64_t qi = q0 + warp * 16 + row;
  const float scale2 = s.scale * kLog2e;  // scores in log2 units: exp2f is one instruction
  float o[D / 2];
  for (int t = 0; t < D / 2; ++t) o[t] = 0.f;
  float m = -INFINITY, l = 0.f;

  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kBlockRows;
    __syncthreads();  // everyone is done with the previous K/V tiles (and with the staged Q)
    load_tile_bf16<D>(ks, k, b, k0, g, s.Hkv, s);
    load_tile_bf16<D>(vs, v, b, k0, g, s.Hkv, s);
    __syncthreads();

    // S = Q K^T for 16 rows x 64 keys.
    for (int n = 0; n < kBlockRows / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < D / 16; ++kk) {
        FragBcol kf;  // K^T: element (d, key) = ks[key][d]
        wmma::load_matrix_sync(kf, ks + (n * 16) * L::ld + kk * 16, L::ld);
        wmma::mma_sync(acc, qf[kk], kf, acc);
      }
      wmma::store_matrix_sync(scratch + n * 16, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on this lane's 32 scores of its row.
    float sc[kBlockRows / 2];
    float tile_max = -INFINITY;
    for (int t = 0; t < kBlockRows / 2; ++t) {
      const int col = 2 * t + parity;
      const int64_t j = k0 + col;
      const bool keep = j <= qi && j < s.S;
      sc[t] = keep ? scratch[row * L::lds + col] * scale2 : -INFINITY;
      tile_max = fmaxf(tile_max, sc[t]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFull, tile_max, 1));
    // Finite: key k0 <= q0 <= qi and k0 < S. Rows past S (never stored) see keys < S only.
    const float m_new = fmaxf(m, tile_max);
    float tile_sum = 0.f;
    for (int t = 0; t < kBlockRows / 2; ++t) {
      const float p = exp2f(sc[t] - m_new);
      tile_sum += p;
      ps[row * L::ldp + 2 * t + parity] = __float2bfloat16_rn(p);
    }
    tile_sum += __shfl_xor_sync(kFull, tile_sum, 1);
    const float alpha = exp2f(m - m_new);
    l = l * alpha + tile_sum;
    m = m_new;
    __syncwarp();

    // P V for 16 rows x D, through the scratch (the scores there are consumed).
    rows_times_tile<D, FragA>(scratch, ps, vs);
    __syncwarp();
    for (int t = 0; t < D / 2; ++t) o[t] = o[t] * alpha + scratch[row * L::ldo + 2 * t + parity];
    __syncwarp();
  }

  // Normalise into the scratch, then write the warp's rows with consecutive lanes on consecutive columns.
  const float inv = 1.f / l;
  for (int t = 0; t < D / 2; ++t) scratch[row * L::ldo + 2 * t + parity] = o[t] * inv;
  if (parity == 0 && qi < s.S) lse[(b * s.Hq + h) * s.S + qi] = (m + log2f(l)) * kLn2;
  __syncwarp();
  for (int idx = lane; idx < 16 * D; idx += 32) {
    const int rr = idx / D, d = idx % D;
    const int64_t i = q0 + warp * 16 + rr;
    if (i < s.S) out[row_offset(b, i, h, s, s.Hq) + d] = __float2bfloat16_rn(scratch[rr * L::ldo + d]);
  }
}

// The shared memory both backward kernels start with: the block's K and V tiles (64 keys) and a Q
// and a dO tile (kQ queries) in bf16, then the query tile's lse (log2 units) and delta; each
// kernel's own buffers begin at `rest` (`bytes` past the start).
template <int D, int kQ>
struct BwdTiles {
  static constexpr size_t bytes =
      2 * size_t(TcLayout<D>::tile_bytes) + 2 * size_t(kQ) * TcLayout<D>::ld * 2 + 2 * kQ * 4;
  bf16_t *ks, *vs, *qs, *dos;
  float *lses, *deltas, *rest;
  __device__ explicit BwdTiles(unsigned char* smem) {
    ks = reinterpret_cast<bf16_t*>(smem);
    vs = ks + kBlockRows * TcLayout<D>::ld;
    qs = vs + kBlockRows * TcLayout<D>::ld;
    dos = qs + kQ * TcLayout<D>::ld;
    lses = reinterpret_cast<float*>(dos + kQ * TcLayout<D>::ld);
    deltas = lses + kQ;
    rest = deltas + kQ;
  }
};

// lse (in log2 units) and delta of queries q0 .. q0 + kQ - 1 of head (b, h) into the shared tile
// (zeros past S).
template <int kQ>
__device__ void load_lse_delta(float* lses, float* deltas, const float* lse, const float* delta, int64_t b,
                               int64_t h, int64_t q0, const AttentionShape& s) {
  for (int i = threadIdx.x; i < kQ; i += blockDim.x) {
    const bool in = q0 + i < s.S;
    lses[i] = in ? lse[(b * s.Hq + h) * s.S + q0 + i] * kLog2e : 0.f;
    deltas[i] = in ? delta[(b * s.Hq + h) * s.S + q0 + i] : 0.f;
  }
}

template <int D>
constexpr size_t bwd_tc_smem() {
  using L = TcLayout<D>;
  // K, V, Q, dO tiles; lse and delta of the query tile; per-warp f32 scratch for S^T and dP^T (also
  // dQ's output); per-warp P^T; the block's dS^T.
  constexpr size_t scratch = size_t(kTcWarps) * 2 * 16 * L::lds * 4;
  static_assert(size_t(16) * L::ldo <= size_t(2) * 16 * L::lds, "dQ rows fit the per-warp scratch");
  return BwdTiles<D, kBlockRows>::bytes + scratch + size_t(kTcWarps) * 16 * L::ldp * 2 +
         size_t(kBlockRows) * L::ldp * 2;
}

// grid (ceil(S / 64), B * Hkv), 128 threads; warp w owns keys w*16 .. w*16+15 of the block's tile.
template <int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    bwd_tc_kernel(AttentionShape s, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse,
                  const float* delta, const float* dout, float* dq, float* dk, float* dv) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BwdTiles<D, kBlockRows> tiles(smem_raw);
  bf16_t *ks = tiles.ks, *vs = tiles.vs, *qs = tiles.qs, *dos = tiles.dos;
  float *lses = tiles.lses, *deltas = tiles.deltas, *scratch_all = tiles.rest;
  bf16_t* pt_all = reinterpret_cast<bf16_t*>(scratch_all + kTcWarps * 2 * 16 * L::lds);
  bf16_t* dst = pt_all + kTcWarps * 16 * L::ldp;  // dS^T [64 keys][72]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* st = scratch_all + warp * 2 * 16 * L::lds;  // S^T [16][68]
  float* dpt = st + 16 * L::lds;                     // dP^T [16][68]
  float* dqs = st;                                   // dQ rows [16][D+4] (after S^T, dP^T are used)
  bf16_t* pt = pt_all + warp * 16 * L::ldp;
  const int64_t b = blockIdx.y / s.Hkv, g = blockIdx.y % s.Hkv, r = s.Hq / s.Hkv;
  const int64_t kt = blockIdx.x, k0 = kt * kBlockRows;
  const int64_t num_qt = (s.S + kBlockRows - 1) / kBlockRows;
  const float scale2 = s.scale * kLog2e;

  load_tile_bf16<D>(ks, k, b, k0, g, s.Hkv, s);
  load_tile_bf16<D>(vs, v, b, k0, g, s.Hkv, s);

  // Indexed only by unrolled loops (compile-time indices), so the accumulators stay in registers.
  FragC dk_acc[D / 16], dv_acc[D / 16];
#pragma unroll
  for (int dn = 0; dn < D / 16; ++dn) {
    wmma::fill_fragment(dk_acc[dn], 0.f);
    wmma::fill_fragment(dv_acc[dn], 0.f);
  }
  const int row = lane / 2, parity = lane % 2;
  const int64_t j = k0 + warp * 16 + row;  // this lane's key

  for (int64_t h = g * r; h < g * r + r; ++h) {
    for (int64_t qt = kt; qt < num_qt; ++qt) {
      const int64_t q0 = qt * kBlockRows;
      __syncthreads();  // the previous Q / dO / dS^T are consumed
      load_tile_bf16<D>(qs, q, b, q0, h, s.Hq, s);
      load_tile_bf16<D>(dos, dout, b, q0, h, s.Hq, s);
      load_lse_delta<kBlockRows>(lses, deltas, lse, delta, b, h, q0, s);
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x 64 queries.
      for (int n = 0; n < kBlockRows / 16; ++n) {
        FragC acc_s, acc_dp;
        wmma::fill_fragment(acc_s, 0.f);
        wmma::fill_fragment(acc_dp, 0.f);
        for (int kk = 0; kk < D / 16; ++kk) {
          FragA kf, vf;
          FragBcol qf, dof;
          wmma::load_matrix_sync(kf, ks + (warp * 16) * L::ld + kk * 16, L::ld);
          wmma::load_matrix_sync(qf, qs + (n * 16) * L::ld + kk * 16, L::ld);
          wmma::mma_sync(acc_s, kf, qf, acc_s);
          wmma::load_matrix_sync(vf, vs + (warp * 16) * L::ld + kk * 16, L::ld);
          wmma::load_matrix_sync(dof, dos + (n * 16) * L::ld + kk * 16, L::ld);
          wmma::mma_sync(acc_dp, vf, dof, acc_dp);
        }
        wmma::store_matrix_sync(st + n * 16, acc_s, L::lds, wmma::mem_row_major);
        wmma::store_matrix_sync(dpt + n * 16, acc_dp, L::lds, wmma::mem_row_major);
      }
      __syncwarp();

      // P^T and dS^T = P^T * (dP^T - delta), masked to i >= j, i < S, j < S.
      for (int t = 0; t < kBlockRows / 2; ++t) {
        const int col = 2 * t + parity;
        const int64_t i = q0 + col;
        float p = 0.f, ds = 0.f;
        if (i >= j && i < s.S && j < s.S) {
          p = exp2f(st[row * L::lds + col] * scale2 - lses[col]);
          ds = p * (dpt[row * L::lds + col] - deltas[col]);
        }
        pt[row * L::ldp + col] = __float2bfloat16_rn(p);
        dst[(warp * 16 + row) * L::ldp + col] = __float2bfloat16_rn(ds);
      }
      __syncwarp();

      // dV += P^T dO, dK += dS^T Q (scaled at the end).
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        for (int kk = 0; kk < kBlockRows / 16; ++kk) {
          FragA pf, df;
          FragB dof, qf;
          wmma::load_matrix_sync(pf, pt + kk * 16, L::ldp);
          wmma::load_matrix_sync(dof, dos + (kk * 16) * L::ld + dn * 16, L::ld);
          wmma::mma_sync(dv_acc[dn], pf, dof, dv_acc[dn]);
          wmma::load_matrix_sync(df, dst + (warp * 16) * L::ldp + kk * 16, L::ldp);
          wmma::load_matrix_sync(qf, qs + (kk * 16) * L::ld + dn * 16, L::ld);
          wmma::mma_sync(dk_acc[dn], df, qf, dk_acc[dn]);
        }
      }
      __syncthreads();  // all of dS^T is written

      // dQ (query rows warp*16 .. +15) = dS K: dS = (dS^T)^T read column-major.
      rows_times_tile<D, FragAcol>(dqs, dst + warp * 16, ks);
      __syncwarp();
      for (int idx = lane; idx < 16 * D; idx += 32) {
        const int rr = idx / D, d = idx % D;
        const int64_t i = q0 + warp * 16 + rr;
        if (i < s.S) atomicAdd(dq + row_offset(b, i, h, s, s.Hq) + d, dqs[rr * L::ldo + d] * s.scale);
      }
    }
  }

  // dK (times scale) and dV through the scratch, bounds-checked.
  __syncwarp();
  float* out_rows = st;
#pragma unroll
  for (int dn = 0; dn < D / 16; ++dn)
    for (int e = 0; e < dk_acc[dn].num_elements; ++e) dk_acc[dn].x[e] *= s.scale;
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    // Two explicit stores, not one of `pass == 0 ? dk_acc[dn] : dv_acc[dn]`: a reference chosen at
    // run time would put both accumulator arrays in local memory.
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      if (pass == 0)
        wmma::store_matrix_sync(out_rows + dn * 16, dk_acc[dn], L::ldo, wmma::mem_row_major);
      else
        wmma::store_matrix_sync(out_rows + dn * 16, dv_acc[dn], L::ldo, wmma::mem_row_major);
    }
    __syncwarp();
    float* dst_grad = pass == 0 ? dk : dv;
    for (int idx = lane; idx < 16 * D; idx += 32) {
      const int rr = idx / D, d = idx % D;
      const int64_t jj = k0 + warp * 16 + rr;
      if (jj < s.S) dst_grad[row_offset(b, jj, g, s, s.Hkv) + d] = out_rows[rr * L::ldo + d];
    }
    __syncwarp();
  }
}

// =============================================================================================
// Tensor-core forward on raw mma.sync (m16n8k16, bf16 -> f32) with the FlashAttention-2 register
// layout: S, P and O never leave registers. Per warp 16 query rows; lane = 4 g + t holds, of every
// 16 x 8 accumulator tile, rows g and g + 8 at columns 2t and 2t + 1. That layout is exactly the
// A operand of the next product once P is packed to bf16 pairs, so P V needs no shared memory;
// K and V fragments come from shared memory through ldmatrix (V transposed on the fly).
template <int D>
constexpr size_t fwd_mma_smem() {
  return 3 * size_t(TcLayout<D>::tile_bytes);  // Q, K, V tiles
}

// grid (ceil(S / 64), B * Hq), 128 threads.
template <int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    fwd_mma_kernel(AttentionShape s, const bf16_t* q, const bf16_t* k, const bf16_t* v, bf16_t* out,
                   float* lse) {
  using L = TcLayout<D>;
  constexpr int kNt = kBlockRows / 8;  // 8-key column tiles of S per key tile
  constexpr int kDt = D / 8;           // 8-wide column tiles of O
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16_t* qs = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* ks = qs + kBlockRows * L::ld;
  bf16_t* vs = ks + kBlockRows * L::ld;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.y / s.Hq, h = blockIdx.y % s.Hq, hk = h / (s.Hq / s.Hkv);
  const int64_t qt = int64_t(gridDim.x - 1 - blockIdx.x);  // longest rows first
  const int64_t q0 = qt * kBlockRows;
  const int64_t row0 = q0 + warp * 16 + g, row1 = row0 + 8;  // this lane's two query rows

  load_tile_bf16<D>(qs, q, b, q0, h, s.Hq, s);
  __syncthreads();
  uint32_t qf[D / 16][4];  // A fragments: rows warp*16 + (lane % 16), columns kk*16 + (lane / 16) * 8
  for (int kk = 0; kk < D / 16; ++kk)
    ldmatrix_x4(qf[kk], qs + (warp * 16 + lane % 16) * L::ld + kk * 16 + (lane / 16) * 8);

  float o[kDt][4];
  for (int n = 0; n < kDt; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows row0, row1 (l: this lane's part)
  const float scale2 = s.scale * kLog2e;

  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kBlockRows;
    __syncthreads();  // the previous K / V tiles are consumed
    load_tile_bf16<D>(ks, k, b, k0, hk, s.Hkv, s);
    load_tile_bf16<D>(vs, v, b, k0, hk, s.Hkv, s);
    __syncthreads();

    // S = Q K^T: 16 rows x 64 keys, kNt tiles of 8 keys.
    float sc[kNt][4];
    for (int n = 0; n < kNt; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
    for (int kk = 0; kk < D / 16; ++kk)
      for (int n = 0; n < kNt; n += 2) {
        // Keys n*8 .. n*8+15: matrices (keys +0..7, d +0..7), (keys +0..7, d +8..15), then keys +8.
        uint32_t kf[4];
        ldmatrix_x4(kf, ks + (n * 8 + (lane / 16) * 8 + lane % 8) * L::ld + kk * 16 + ((lane / 8) % 2) * 8);
        mma_16x16x16(sc[n], sc[n + 1], qf[kk], kf);
      }

    // Mask, scale (log2 units) and the online softmax; rows are shared by the 4 lanes of a quad.
    float tmax0 = -INFINITY, tmax1 = -INFINITY;
    for (int n = 0; n < kNt; ++n)
      for (int e = 0; e < 2; ++e) {
        const int64_t j = k0 + n * 8 + 2 * t + e;
        sc[n][e] = (j <= row0 && j < s.S) ? sc[n][e] * scale2 : -INFINITY;
        sc[n][2 + e] = (j <= row1 && j < s.S) ? sc[n][2 + e] * scale2 : -INFINITY;
        tmax0 = fmaxf(tmax0, sc[n][e]);
        tmax1 = fmaxf(tmax1, sc[n][2 + e]);
      }
    for (int off = 1; off <= 2; off <<= 1) {
      tmax0 = fmaxf(tmax0, __shfl_xor_sync(kFull, tmax0, off));
      tmax1 = fmaxf(tmax1, __shfl_xor_sync(kFull, tmax1, off));
    }
    // Finite: key k0 <= q0 <= row and k0 < S (rows past S are never stored).
    const float mn0 = fmaxf(m0, tmax0), mn1 = fmaxf(m1, tmax1);
    const float alpha0 = exp2f(m0 - mn0), alpha1 = exp2f(m1 - mn1);
    m0 = mn0, m1 = mn1;
    l0 *= alpha0, l1 *= alpha1;
    for (int n = 0; n < kDt; ++n) o[n][0] *= alpha0, o[n][1] *= alpha0, o[n][2] *= alpha1, o[n][3] *= alpha1;
    for (int n = 0; n < kNt; ++n) {
      sc[n][0] = exp2f(sc[n][0] - mn0), sc[n][1] = exp2f(sc[n][1] - mn0);
      sc[n][2] = exp2f(sc[n][2] - mn1), sc[n][3] = exp2f(sc[n][3] - mn1);
      l0 += sc[n][0] + sc[n][1];
      l1 += sc[n][2] + sc[n][3];
    }

    // O += P V: P's accumulator tiles 2kk, 2kk+1 are the A fragment of keys kk*16 .. kk*16+15.
    for (int kk = 0; kk < kBlockRows / 16; ++kk) {
      const uint32_t pf[4] = {
          pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
          pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]), pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      for (int n = 0; n < kDt; n += 2) {
        // V^T fragments of d tiles n and n+1: matrices (keys +0..7, d n*8), (keys +8..15, d n*8), then d + 8.
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, vs + (kk * 16 + lane % 16) * L::ld + n * 8 + (lane / 16) * 8);
        mma_16x16x16(o[n], o[n + 1], pf, vf);
      }
    }
  }

  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(kFull, l0, off);
    l1 += __shfl_xor_sync(kFull, l1, off);
  }
  const float inv0 = 1.f / l0, inv1 = 1.f / l1;
  for (int n = 0; n < kDt; ++n) {
    const int d = n * 8 + 2 * t;
    if (row0 < s.S)
      *reinterpret_cast<__nv_bfloat162*>(out + row_offset(b, row0, h, s, s.Hq) + d) =
          __floats2bfloat162_rn(o[n][0] * inv0, o[n][1] * inv0);
    if (row1 < s.S)
      *reinterpret_cast<__nv_bfloat162*>(out + row_offset(b, row1, h, s, s.Hq) + d) =
          __floats2bfloat162_rn(o[n][2] * inv1, o[n][3] * inv1);
  }
  if (t == 0) {
    if (row0 < s.S) lse[(b * s.Hq + h) * s.S + row0] = (m0 + log2f(l0)) * kLn2;
    if (row1 < s.S) lse[(b * s.Hq + h) * s.S + row1] = (m1 + log2f(l1)) * kLn2;
  }
}

// The backward on mma.sync: one block per (batch, kv head, 64-key tile), warp w owns keys
// w*16 .. w*16+15 and keeps their dK and dV accumulators in registers. Per 32-query tile: S^T and
// dP^T (16 keys x 32 queries per warp) from ldmatrix'd K, V, Q, dO; P^T and dS^T elementwise in
// registers; dV += P^T dO and dK += dS^T Q straight from those registers (accumulator layout =
// A operand); dS^T goes to shared memory once so that every warp can form dQ = dS K for its share
// (16 queries x D/2) over all 64 keys and add it to dq with f32 atomics.
constexpr int kBwdQ = 32;         // queries per inner tile
constexpr int kLdDs = kBwdQ + 8;  // dS^T [64 keys][40]: 80-byte rows, ldmatrix conflict-free

template <int D>
constexpr size_t bwd_mma_smem() {
  using L = TcLayout<D>;
  return BwdTiles<D, kBwdQ>::bytes + size_t(kBlockRows) * kLdDs * 2;
}

// Rows r0 .. r0+kBwdQ-1 of a [B, S, H, D] tensor into dst[kBwdQ][ld] as bf16 (zeros past S).
template <int D, class T>
__device__ void load_q_tile(bf16_t* dst, const T* src, int64_t b, int64_t r0, int64_t h, int64_t H,
                            const AttentionShape& s) {
  for (int idx = threadIdx.x; idx < kBwdQ * D / 2; idx += blockDim.x) {
    const int rr = idx / (D / 2), c = (idx % (D / 2)) * 2;
    const int64_t r = r0 + rr;
    float x0 = 0.f, x1 = 0.f;
    if (r < s.S) {
      const T* p = src + row_offset(b, r, h, s, H) + c;
      x0 = to_f32(p[0]), x1 = to_f32(p[1]);
    }
    *reinterpret_cast<__nv_bfloat162*>(dst + rr * TcLayout<D>::ld + c) = __floats2bfloat162_rn(x0, x1);
  }
}

template <int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    bwd_mma_kernel(AttentionShape s, const bf16_t* q, const bf16_t* k, const bf16_t* v, const float* lse,
                   const float* delta, const float* dout, float* dq, float* dk, float* dv) {
  using L = TcLayout<D>;
  constexpr int kDt = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BwdTiles<D, kBwdQ> tiles(smem_raw);
  bf16_t *ks = tiles.ks, *vs = tiles.vs, *qs = tiles.qs, *dos = tiles.dos;
  float *lses = tiles.lses, *deltas = tiles.deltas;
  bf16_t* dst = reinterpret_cast<bf16_t*>(tiles.rest);  // dS^T [64 keys][kLdDs]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.y / s.Hkv, hk = blockIdx.y % s.Hkv, r = s.Hq / s.Hkv;
  const int64_t k0 = int64_t(blockIdx.x) * kBlockRows;
  const int64_t key0 = k0 + warp * 16 + g, key1 = key0 + 8;  // this lane's two keys
  const float scale2 = s.scale * kLog2e;

  load_tile_bf16<D>(ks, k, b, k0, hk, s.Hkv, s);
  load_tile_bf16<D>(vs, v, b, k0, hk, s.Hkv, s);

  float dk_acc[kDt][4], dv_acc[kDt][4];
  for (int n = 0; n < kDt; ++n)
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;

  for (int64_t h = hk * r; h < hk * r + r; ++h) {
    for (int64_t q0 = k0; q0 < s.S; q0 += kBwdQ) {
      __syncthreads();  // the previous Q, dO and dS^T are consumed (and K, V are loaded)
      load_q_tile<D>(qs, q, b, q0, h, s.Hq, s);
      load_q_tile<D>(dos, dout, b, q0, h, s.Hq, s);
      load_lse_delta<kBwdQ>(lses, deltas, lse, delta, b, h, q0, s);
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T: 16 keys x 32 queries, 4 tiles of 8 queries.
      float st[kBwdQ / 8][4], dpt[kBwdQ / 8][4];
      for (int n = 0; n < kBwdQ / 8; ++n)
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.f;
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kf[4], vf[4];
        ldmatrix_x4(kf, ks + (warp * 16 + lane % 16) * L::ld + kk * 16 + (lane / 16) * 8);
        ldmatrix_x4(vf, vs + (warp * 16 + lane % 16) * L::ld + kk * 16 + (lane / 16) * 8);
        for (int n = 0; n < kBwdQ / 8; n += 2) {
          const int row = n * 8 + (lane / 16) * 8 + lane % 8, col = kk * 16 + ((lane / 8) % 2) * 8;
          uint32_t qf[4], df[4];
          ldmatrix_x4(qf, qs + row * L::ld + col);
          ldmatrix_x4(df, dos + row * L::ld + col);
          mma_16x16x16(st[n], st[n + 1], kf, qf);
          mma_16x16x16(dpt[n], dpt[n + 1], vf, df);
        }
      }

      // P^T and dS^T in place (st -> P^T, dpt -> dS^T), masked to q >= key, q < S, key < S; dS^T
      // also to shared memory (bf16 pairs) for dQ.
      for (int n = 0; n < kBwdQ / 8; ++n)
        for (int e = 0; e < 2; ++e) {
          const int c = n * 8 + 2 * t + e;
          const int64_t qi = q0 + c;
          const bool in0 = qi >= key0 && qi < s.S && key0 < s.S, in1 = qi >= key1 && qi < s.S && key1 < s.S;
          const float p0 = in0 ? exp2f(st[n][e] * scale2 - lses[c]) : 0.f;
          const float p1 = in1 ? exp2f(st[n][2 + e] * scale2 - lses[c]) : 0.f;
          st[n][e] = p0, st[n][2 + e] = p1;
          dpt[n][e] = p0 * (dpt[n][e] - deltas[c]);
          dpt[n][2 + e] = p1 * (dpt[n][2 + e] - deltas[c]);
        }
      for (int n = 0; n < kBwdQ / 8; ++n) {
        *reinterpret_cast<uint32_t*>(dst + (warp * 16 + g) * kLdDs + n * 8 + 2 * t) =
            pack_bf16(dpt[n][0], dpt[n][1]);
        *reinterpret_cast<uint32_t*>(dst + (warp * 16 + g + 8) * kLdDs + n * 8 + 2 * t) =
            pack_bf16(dpt[n][2], dpt[n][3]);
      }

      // dV += P^T dO, dK += dS^T Q: the accumulator tiles 2kk, 2kk+1 are the A fragment of queries
      // kk*16 .. kk*16+15; dO and Q fragments transposed by ldmatrix.
      for (int kk = 0; kk < kBwdQ / 16; ++kk) {
        const uint32_t pf[4] = {
            pack_bf16(st[2 * kk][0], st[2 * kk][1]), pack_bf16(st[2 * kk][2], st[2 * kk][3]),
            pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]), pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3])};
        const uint32_t sf[4] = {pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]),
                                pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]),
                                pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
        for (int n = 0; n < kDt; n += 2) {
          const int row = kk * 16 + lane % 16, col = n * 8 + (lane / 16) * 8;
          uint32_t df[4], qf[4];
          ldmatrix_x4_trans(df, dos + row * L::ld + col);
          ldmatrix_x4_trans(qf, qs + row * L::ld + col);
          mma_16x16x16(dv_acc[n], dv_acc[n + 1], pf, df);
          mma_16x16x16(dk_acc[n], dk_acc[n + 1], sf, qf);
        }
      }
      __syncthreads();  // all of dS^T is in shared memory

      // dQ: warp w takes queries (w % 2) * 16 .. +15 and columns (w / 2) * D/2 .. +D/2, over all 64 keys.
      const int qw = (warp % 2) * 16, d0 = (warp / 2) * (D / 2);
      for (int n = 0; n < kDt / 2; n += 2) {
        float acc[2][4] = {};
        for (int kk = 0; kk < kBlockRows / 16; ++kk) {
          uint32_t af[4], bf[4];
          // dS (queries x keys) = (dS^T)^T: matrix m = keys +(m/2)*8, queries +(m%2)*8, transposed.
          ldmatrix_x4_trans(af,
                            dst + (kk * 16 + (lane / 16) * 8 + lane % 8) * kLdDs + qw + ((lane / 8) % 2) * 8);
          ldmatrix_x4_trans(bf, ks + (kk * 16 + lane % 16) * L::ld + d0 + n * 8 + (lane / 16) * 8);
          mma_16x16x16(acc[0], acc[1], af, bf);
        }
        for (int j = 0; j < 2; ++j) {
          const int d = d0 + (n + j) * 8 + 2 * t;
          const int64_t qa = q0 + qw + g, qb = qa + 8;
          if (qa < s.S) {
            float* p = dq + row_offset(b, qa, h, s, s.Hq) + d;
            atomicAdd(p, acc[j][0] * s.scale);
            atomicAdd(p + 1, acc[j][1] * s.scale);
          }
          if (qb < s.S) {
            float* p = dq + row_offset(b, qb, h, s, s.Hq) + d;
            atomicAdd(p, acc[j][2] * s.scale);
            atomicAdd(p + 1, acc[j][3] * s.scale);
          }
        }
      }
    }
  }

  for (int n = 0; n < kDt; ++n) {
    const int d = n * 8 + 2 * t;
    if (key0 < s.S) {
      *reinterpret_cast<float2*>(dk + row_offset(b, key0, hk, s, s.Hkv) + d) =
          make_float2(dk_acc[n][0] * s.scale, dk_acc[n][1] * s.scale);
      *reinterpret_cast<float2*>(dv + row_offset(b, key0, hk, s, s.Hkv) + d) =
          make_float2(dv_acc[n][0], dv_acc[n][1]);
    }
    if (key1 < s.S) {
      *reinterpret_cast<float2*>(dk + row_offset(b, key1, hk, s, s.Hkv) + d) =
          make_float2(dk_acc[n][2] * s.scale, dk_acc[n][3] * s.scale);
      *reinterpret_cast<float2*>(dv + row_offset(b, key1, hk, s, s.Hkv) + d) =
          make_float2(dv_acc[n][2], dv_acc[n][3]);
    }
  }
}

const bf16_t* as_cuda(const bf16* p) {
  return reinterpret_cast<const bf16_t*>(p);
}
bf16_t* as_cuda(bf16* p) {
  return reinterpret_cast<bf16_t*>(p);
}

}  // namespace

std::string attention_tensor_cores_unsupported(const AttentionShape& s, DType dtype) {
  if (dtype != DType::BF16) return "tensor-core attention is bf16 only";
  if (s.D != 64 && s.D != 128)
    return "tensor-core attention needs head_dim 64 or 128, got " + std::to_string(s.D);
  return "";
}

void attention_fwd_f32_math(const KernelContext& ctx, const AttentionShape& s, DType dtype, const void* q,
                            const void* k, const void* v, void* out, float* lse) {
  check_dims(s, "forward");
  TITAN_CHECK(s.D <= 512, "attention (cuda, f32 math): head_dim ", s.D, " exceeds 512");
  if (dtype == DType::F32) return fwd_f32_math_dispatch<float>(ctx, s, q, k, v, out, lse);
  TITAN_CHECK(dtype == DType::BF16, "attention (cuda): no kernel for ", dtype_name(dtype));
  fwd_f32_math_dispatch<bf16_t>(ctx, s, q, k, v, out, lse);
}

void attention_bwd_f32_math(const KernelContext& ctx, const AttentionShape& s, DType dtype, const void* q,
                            const void* k, const void* v, const void* out, const float* lse,
                            const float* dout, float* dq, float* dk, float* dv) {
  check_dims(s, "backward");
  TITAN_CHECK(s.D <= 512, "attention (cuda, f32 math): head_dim ", s.D, " exceeds 512");
  TITAN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "attention (cuda): no kernel for ",
              dtype_name(dtype));
  Scratch delta = delta_buffer(ctx, s);
  if (dtype == DType::F32) {
    launch_delta<float>(ctx, s, out, dout, false, delta.as<float>());
    bwd_f32_math_dispatch<float>(ctx, s, q, k, v, lse, delta.as<float>(), dout, dq, dk, dv);
  } else {
    launch_delta<bf16_t>(ctx, s, out, dout, false, delta.as<float>());
    bwd_f32_math_dispatch<bf16_t>(ctx, s, q, k, v, lse, delta.as<float>(), dout, dq, dk, dv);
  }
}

namespace {

// A tensor-core kernel family (WMMA, mma.sync): its forward and backward kernels instantiated for
// head_dim 64 and 128, with their dynamic shared memory. The forward runs one block per (batch,
// query head, row block), the backward one per (batch, kv head, key tile).
using TcForwardKernel = void (*)(AttentionShape, const bf16_t*, const bf16_t*, const bf16_t*, bf16_t*,
                                 float*);
using TcBackwardKernel = void (*)(AttentionShape, const bf16_t*, const bf16_t*, const bf16_t*, const float*,
                                  const float*, const float*, float*, float*, float*);
template <class Kernel>
struct TcKernel {
  Kernel kernel;
  size_t smem;
};
struct TcFamily {
  const char* name;
  TcKernel<TcForwardKernel> fwd64, fwd128;
  TcKernel<TcBackwardKernel> bwd64, bwd128;
};
const TcFamily kWmma{"tensor cores",
                     {fwd_tc_kernel<64>, fwd_tc_smem<64>()},
                     {fwd_tc_kernel<128>, fwd_tc_smem<128>()},
                     {bwd_tc_kernel<64>, bwd_tc_smem<64>()},
                     {bwd_tc_kernel<128>, bwd_tc_smem<128>()}};
const TcFamily kMmaSync{"mma.sync",
                        {fwd_mma_kernel<64>, fwd_mma_smem<64>()},
                        {fwd_mma_kernel<128>, fwd_mma_smem<128>()},
                        {bwd_mma_kernel<64>, bwd_mma_smem<64>()},
                        {bwd_mma_kernel<128>, bwd_mma_smem<128>()}};

void check_tensor_core_shape(const AttentionShape& s, const char* what) {
  check_dims(s, what);
  const std::string why = attention_tensor_cores_unsupported(s, DType::BF16);
  TITAN_CHECK(why.empty(), "attention (cuda): ", why);
}

void forward_on_tensor_cores(const TcFamily& family, const KernelContext& ctx, const AttentionShape& s,
                             const bf16* q, const bf16* k, const bf16* v, bf16* out, float* lse) {
  check_tensor_core_shape(s, "forward");
  const TcKernel<TcForwardKernel>& f = s.D == 64 ? family.fwd64 : family.fwd128;
  const std::string what = std::string("attention (cuda): forward (") + family.name + ")";
  launch_row_blocks(ctx, s, f.kernel, kBlockRows, kTcWarps, s.Hq, f.smem, what.c_str(), as_cuda(q),
                    as_cuda(k), as_cuda(v), as_cuda(out), lse);
}

void backward_on_tensor_cores(const TcFamily& family, const KernelContext& ctx, const AttentionShape& s,
                              const bf16* q, const bf16* k, const bf16* v, const bf16* out, const float* lse,
                              const float* dout, float* dq, float* dk, float* dv) {
  check_tensor_core_shape(s, "backward");
  Scratch delta = delta_buffer(ctx, s);
  launch_delta<bf16_t>(ctx, s, out, dout, true, delta.as<float>());
  // dq is accumulated with atomics from every key tile.
  cudaError_t e = cudaMemsetAsync(dq, 0, sizeof(float) * size_t(s.B * s.S * s.Hq * s.D), stream_of(ctx));
  TITAN_CHECK(e == cudaSuccess, "attention (cuda): clearing dq failed: ", cudaGetErrorString(e));
  const TcKernel<TcBackwardKernel>& b = s.D == 64 ? family.bwd64 : family.bwd128;
  const std::string what = std::string("attention (cuda): backward (") + family.name + ")";
  launch_row_blocks(ctx, s, b.kernel, kBlockRows, kTcWarps, s.Hkv, b.smem, what.c_str(), as_cuda(q),
                    as_cuda(k), as_cuda(v), lse, delta.as<float>(), dout, dq, dk, dv);
}

}  // namespace

void attention_fwd_tensor_cores(const KernelContext& ctx, const AttentionShape& s, const bf16* q,
                                const bf16* k, const bf16* v, bf16* out, float* lse) {
  forward_on_tensor_cores(kWmma, ctx, s, q, k, v, out, lse);
}

void attention_fwd_mma(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                       const bf16* v, bf16* out, float* lse) {
  forward_on_tensor_cores(kMmaSync, ctx, s, q, k, v, out, lse);
}

void attention_bwd_mma(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                       const bf16* v, const bf16* out, const float* lse, const float* dout, float* dq,
                       float* dk, float* dv) {
  backward_on_tensor_cores(kMmaSync, ctx, s, q, k, v, out, lse, dout, dq, dk, dv);
}

void attention_bwd_tensor_cores(const KernelContext& ctx, const AttentionShape& s, const bf16* q,
                                const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                const float* dout, float* dq, float* dk, float* dv) {
  backward_on_tensor_cores(kWmma, ctx, s, q, k, v, out, lse, dout, dq, dk, dv);
}

// =============================================================================================
// cuDNN's fused attention (backend/cuda/cudnn_attention.h). cuDNN's backward reads dout and writes
// dq, dk, dv in the dtype of q (bf16); the op's gradients are f32 unless the job has bf16 activation
// gradients, so dout is rounded into a bf16 scratch copy and the three gradients widened back. The
// extra passes move 12 bytes per gradient element, small next to the attention's S^2 work at
// training lengths; with bf16 activation gradients they go (bwd_bf16_grads_cudnn_or_tensor_cores).
namespace {
SdpaShape sdpa_shape(const AttentionShape& s) { return {s.B, s.S, s.Hq, s.Hkv, s.D, s.scale}; }
}  // namespace

std::string attention_cudnn_unsupported(const AttentionShape& s) {
  return cudnn_attention_unsupported(sdpa_shape(s));
}

void attention_fwd_cudnn(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                         const bf16* v, bf16* out, float* lse) {
  check_dims(s, "forward");
  cudnn_attention_forward(ctx.stream, sdpa_shape(s), q, k, v, out, lse);
}

void attention_bwd_cudnn(const KernelContext& ctx, const AttentionShape& s, const bf16* q, const bf16* k,
                         const bf16* v, const bf16* out, const float* lse, const float* dout, float* dq,
                         float* dk, float* dv) {
  check_dims(s, "backward");
  const int64_t nq = int64_t(s.q_numel()), nkv = int64_t(s.kv_numel());
  Scratch dout16(ctx, size_t(nq) * 2), dq16(ctx, size_t(nq) * 2), dk16(ctx, size_t(nkv) * 2),
      dv16(ctx, size_t(nkv) * 2);
  DeviceServices& dev = *ctx.services;
  dev.convert(dout16.as<void>(), DType::BF16, dout, DType::F32, nq);
  cudnn_attention_backward(ctx.stream, sdpa_shape(s), q, k, v, out, lse, dout16.as<void>(), dq16.as<void>(),
                           dk16.as<void>(), dv16.as<void>());
  dev.convert(dq, DType::F32, dq16.as<void>(), DType::BF16, nq);
  dev.convert(dk, DType::F32, dk16.as<void>(), DType::BF16, nkv);
  dev.convert(dv, DType::F32, dv16.as<void>(), DType::BF16, nkv);
}

// =============================================================================================
// Registration with the attention op (ops/attention/attention.h): "default" = tensor cores where they apply
// (bf16, head_dim 64/128, 16-byte aligned tensors), else f32 math; "mma_sync" (bf16) the same with
// the raw mma.sync kernels; "f32_math" (bf16) the f32-math kernels everywhere.
namespace {

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

bool use_tensor_cores(const AttentionShape& s, std::initializer_list<const void*> ptrs) {
  if (!attention_tensor_cores_unsupported(s, DType::BF16).empty()) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

template <DType kDType>
void fwd_f32_math_entry(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                        const void* v, void* out, void* lse) {
  attention_fwd_f32_math(ctx, s, kDType, q, k, v, out, static_cast<float*>(lse));
}
template <DType kDType>
void bwd_f32_math_entry(const KernelContext& ctx, const AttentionShape& s, const void* q, const void* k,
                        const void* v, const void* out, const void* lse, const void* dout, void* dq, void* dk,
                        void* dv) {
  attention_bwd_f32_math(ctx, s, kDType, q, k, v, out, static_cast<const float*>(lse),
                         static_cast<const float*>(dout), static_cast<float*>(dq), static_cast<float*>(dk),
                         static_cast<float*>(dv));
}

// bf16 on the tensor-core pair kFwd/kBwd (WMMA or mma.sync) where it applies, else f32 math.
template <auto kFwd>
void fwd_bf16_tensor_cores_or_f32_math(const KernelContext& ctx, const AttentionShape& s, const void* q,
                                       const void* k, const void* v, void* out, void* lse) {
  if (!use_tensor_cores(s, {q, k, v, out})) return fwd_f32_math_entry<DType::BF16>(ctx, s, q, k, v, out, lse);
  kFwd(ctx, s, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
       static_cast<bf16*>(out), static_cast<float*>(lse));
}
template <auto kBwd>
void bwd_bf16_tensor_cores_or_f32_math(const KernelContext& ctx, const AttentionShape& s, const void* q,
                                       const void* k, const void* v, const void* out, const void* lse,
                                       const void* dout, void* dq, void* dk, void* dv) {
  // (dq, dk, dv too: the mma.sync backward stores dk and dv rows as float2 pairs.)
  if (!use_tensor_cores(s, {q, k, v, out, dout, dq, dk, dv}))
    return bwd_f32_math_entry<DType::BF16>(ctx, s, q, k, v, out, lse, dout, dq, dk, dv);
  kBwd(ctx, s, static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
       static_cast<const bf16*>(out), static_cast<const float*>(lse), static_cast<const float*>(dout),
       static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv));
}

// bf16 on cuDNN where its engines take the shape (and the library loads), else the WMMA pair (itself
// f32 math where it does not apply: the same rounding of P and dS as cuDNN's, ~10x f32 math). cuDNN's
// tensors are declared 16-byte aligned, which a document's view (ops::attention) need not be.
void fwd_bf16_cudnn_or_tensor_cores(const KernelContext& ctx, const AttentionShape& s, const void* q,
                                    const void* k, const void* v, void* out, void* lse) {
  if (!attention_cudnn_unsupported(s).empty() || !aligned16(q) || !aligned16(k) || !aligned16(v) ||
      !aligned16(out) || !aligned16(lse))
    return fwd_bf16_tensor_cores_or_f32_math<attention_fwd_tensor_cores>(ctx, s, q, k, v, out, lse);
  attention_fwd_cudnn(ctx, s, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                      static_cast<const bf16*>(v), static_cast<bf16*>(out), static_cast<float*>(lse));
}
void bwd_bf16_cudnn_or_tensor_cores(const KernelContext& ctx, const AttentionShape& s, const void* q,
                                    const void* k, const void* v, const void* out, const void* lse,
                                    const void* dout, void* dq, void* dk, void* dv) {
  if (!attention_cudnn_unsupported(s).empty() || !aligned16(q) || !aligned16(k) || !aligned16(v) ||
      !aligned16(out) || !aligned16(lse))
    return bwd_bf16_tensor_cores_or_f32_math<attention_bwd_tensor_cores>(ctx, s, q, k, v, out, lse, dout, dq,
                                                                         dk, dv);
  attention_bwd_cudnn(ctx, s, static_cast<const bf16*>(q), static_cast<const bf16*>(k),
                      static_cast<const bf16*>(v), static_cast<const bf16*>(out),
                      static_cast<const float*>(lse), static_cast<const float*>(dout),
                      static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv));
}
// bf16 activation gradients: dout, dq, dk and dv in bf16, which is what cuDNN reads and writes (no
// copies). Where cuDNN does not take the call, the WMMA pair runs on f32 copies and its gradients
// are rounded once.
void bwd_bf16_grads_cudnn_or_tensor_cores(const KernelContext& ctx, const AttentionShape& s, const void* q,
                                          const void* k, const void* v, const void* out, const void* lse,
                                          const void* dout, void* dq, void* dk, void* dv) {
  if (attention_cudnn_unsupported(s).empty()) {
    bool aligned = true;
    for (const void* p : {q, k, v, out, lse, dout, static_cast<const void*>(dq), static_cast<const void*>(dk),
                          static_cast<const void*>(dv)})
      aligned = aligned && aligned16(p);
    if (aligned) {
      check_dims(s, "backward");
      return cudnn_attention_backward(ctx.stream, sdpa_shape(s), q, k, v, out, static_cast<const float*>(lse),
                                      dout, dq, dk, dv);
    }
  }
  const int64_t nq = int64_t(s.q_numel()), nkv = int64_t(s.kv_numel());
  Scratch dout32(ctx, size_t(nq) * 4), dq32(ctx, size_t(nq) * 4), dk32(ctx, size_t(nkv) * 4),
      dv32(ctx, size_t(nkv) * 4);
  DeviceServices& dev = *ctx.services;
  dev.convert(dout32.as<void>(), DType::F32, dout, DType::BF16, nq);
  bwd_bf16_tensor_cores_or_f32_math<attention_bwd_tensor_cores>(
      ctx, s, q, k, v, out, lse, dout32.as<void>(), dq32.as<void>(), dk32.as<void>(), dv32.as<void>());
  dev.convert(dq, DType::BF16, dq32.as<void>(), DType::F32, nq);
  dev.convert(dk, DType::BF16, dk32.as<void>(), DType::F32, nkv);
  dev.convert(dv, DType::BF16, dv32.as<void>(), DType::F32, nkv);
}

const bool registered = kernels::register_kernels(
    "attention", Device::CUDA,
    {{DType::F32, "default", "warp-per-row tiles, f32 math, any head_dim <= 512",
      ops::AttentionKernel{fwd_f32_math_entry<DType::F32>, bwd_f32_math_entry<DType::F32>}},
     {DType::BF16, "default",
      "FlashAttention-2 on bf16 WMMA tensor cores (head_dim 64/128; P, dS rounded to bf16), else the "
      "f32-math tiles",
      ops::AttentionKernel{fwd_bf16_tensor_cores_or_f32_math<attention_fwd_tensor_cores>,
                           bwd_bf16_tensor_cores_or_f32_math<attention_bwd_tensor_cores>}},
     {DType::BF16, "mma_sync",
      "FlashAttention-2 on raw mma.sync/ldmatrix, scores in registers (head_dim 64/128, else f32 math)",
      ops::AttentionKernel{fwd_bf16_tensor_cores_or_f32_math<attention_fwd_mma>,
                           bwd_bf16_tensor_cores_or_f32_math<attention_bwd_mma>}},
     {DType::BF16, "f32_math", "warp-per-row tiles, f32 math, bf16 output rounded once",
      ops::AttentionKernel{fwd_f32_math_entry<DType::BF16>, bwd_f32_math_entry<DType::BF16>}}},
    kernel_available);
// Available only where cuDNN loads (and is not a release with known fused-attention bugs): a job
// that takes it by default (train/startup.cpp) then keeps titan's own kernels instead of failing
// at its first attention call.
const bool cudnn_registered = kernels::register_kernels(
    "attention", Device::CUDA,
    {{DType::BF16, "cudnn",
      "cuDNN 9's fused flash attention through its backend graph API (head_dim a multiple of 8 up to 128, "
      "else the WMMA tensor-core kernels)",
      ops::AttentionKernel{fwd_bf16_cudnn_or_tensor_cores, bwd_bf16_cudnn_or_tensor_cores,
                           bwd_bf16_grads_cudnn_or_tensor_cores}}},
    [] {
      const std::string why = kernel_available();
      return why.empty() ? cudnn_attention_unavailable() : why;
    });

}  // namespace

}  // namespace titan::cuda
