// Mixture-of-experts on CUDA (contract in ops/moe/cuda.h).
//
// Router: one warp per token; the softmax in f32 with each lane holding E/32 probabilities in
// registers, then k warp-wide argmax passes (ties to the lower expert, as the CPU kernels).
//
// Experts, without a host round trip: a histogram of the expert indices, a one-block scan into
// per-expert row offsets (and per-expert GEMM tile offsets), and a stable rank (one block per
// expert walks the indices in order with ballots) give the routing order. The expert GEMMs are
// grouped GEMMs that read those device offsets: each block of the "rows" kernel maps its blockIdx
// to (expert, row tile) through the tile offsets and gathers its A rows by each routing row's
// token; the weight-gradient kernel runs one block column per expert over that expert's rows.
// bf16 models run the GEMMs on tensor cores (WMMA, f32 accumulation, or in the "mma_sync" and
// "mma_sync_wide" variants raw mma.sync on 128 x 128 or 128 x 256 tiles with a four-stage cp.async
// pipeline), every operand bf16: the
// backward stores dy, dy * w, dg and du rounded, as a bf16 autograd holds them; f32 models on
// f32-FMA tiles (exact f32 products). The backward's dh = dy wd[e] is taken before the routing
// weight, so the weight's gradient is dh . h per row, with no recompute of the down projection (the
// CPU kernel's way). The forward's elementwise steps round to the storage type exactly where the
// reference kernels (ops/moe/reference.cpp) do; the backward, where the CPU kernel does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "titan/backend/cuda/common.cuh"
#include "titan/backend/cuda/cudnn_moe.h"
#include "titan/core/check.h"
#include "titan/kernels/registry.h"
#include "titan/ops/cuda_registration.h"
#include "titan/ops/moe/cuda.h"
#include "titan/ops/moe/mma_layout.h"
#include "titan/ops/moe/moe.h"

namespace titan::cuda {

namespace {

using namespace ops::moe_mma;  // the mma.sync GEMMs' index maps (mma_layout.h)

constexpr unsigned kFull = 0xffffffffu;

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
void check_dtype(DType dtype) {
  TITAN_CHECK(dtype == DType::F32 || dtype == DType::BF16, "moe (cuda): no kernel for ", dtype_name(dtype),
              " (f32 and bf16 only)");
}

// v rounded to T and widened back: the T(...) of the reference kernels.
template <class T>
__device__ __forceinline__ float rnd(float v) {
  return to_f32(from_f32<T>(v));
}
__device__ __forceinline__ float sigmoid(float v) {
  return 1.f / (1.f + expf(-v));
}
__device__ __forceinline__ int64_t clamp_expert(int64_t e, int64_t E) {
  return e < 0 ? 0 : (e >= E ? E - 1 : e);
}

// =============================================================================================
// Router. One warp per token, kPerLane probabilities per lane (E <= 32 * kPerLane).
constexpr int kPerLane = 32;

template <class T>
__global__ void router_fwd_kernel(int64_t T_, int E, int k, bool renormalize, const T* logits,
                                  const float* bias, float* weights, int64_t* indices, float* probs) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T_) return;  // warp-uniform
  float p[kPerLane];
  float m = -INFINITY;
  for (int c = 0; c < kPerLane; ++c) {
    const int e = lane + 32 * c;
    p[c] = e < E ? to_f32(logits[t * E + e]) : -INFINITY;
    m = fmaxf(m, p[c]);
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  float sum = 0.f;
  for (int c = 0; c < kPerLane; ++c) {
    const int e = lane + 32 * c;
    p[c] = e < E ? expf(p[c] - m) : 0.f;
    sum += p[c];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  for (int c = 0; c < kPerLane; ++c) {
    const int e = lane + 32 * c;
    p[c] /= sum;
    if (e < E) probs[t * E + e] = p[c];
  }
  uint32_t chosen = 0;  // bit c: expert lane + 32c is taken
  float total = 0.f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float best_score = 0.f, best_p = 0.f;
    for (int c = 0; c < kPerLane; ++c) {
      const int e = lane + 32 * c;
      if (e >= E || (chosen >> c & 1u)) continue;
      const float score = bias ? p[c] + bias[e] : p[c];
      if (best < 0 || score > best_score) best = e, best_score = score, best_p = p[c];
    }
    for (int o = 16; o > 0; o >>= 1) {  // argmax; ties (and NaN) keep a valid lower index
      const int other = __shfl_xor_sync(kFull, best, o);
      const float other_score = __shfl_xor_sync(kFull, best_score, o);
      const float other_p = __shfl_xor_sync(kFull, best_p, o);
      const bool take = other >= 0 && (best < 0 || other_score > best_score ||
                                       (!(other_score < best_score) && other < best));
      if (take) best = other, best_score = other_score, best_p = other_p;
    }
    // With NaN among finite scores the merge is not associative, so lanes may end on different
    // winners: lane 0's is the choice (it writes indices), and every lane must mark that one.
    best = __shfl_sync(kFull, best, 0);
    best_p = __shfl_sync(kFull, best_p, 0);
    if (best % 32 == lane) chosen |= 1u << (best / 32);
    if (lane == 0) {
      indices[t * k + j] = best;
      weights[t * k + j] = best_p;
    }
    total += best_p;
  }
  if (renormalize && lane == 0)
    for (int j = 0; j < k; ++j) weights[t * k + j] /= total;
}

__global__ void router_bwd_kernel(int64_t T_, int E, int k, bool renormalize, const float* probs,
                                  const int64_t* indices, const float* dweights, const float* dprobs,
                                  float* dlogits) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (t >= T_) return;
  const float* p = probs + t * E;
  const int64_t* idx = indices + t * k;
  float dp[kPerLane];
  for (int c = 0; c < kPerLane; ++c) {
    const int e = lane + 32 * c;
    dp[c] = (dprobs && e < E) ? dprobs[t * E + e] : 0.f;
  }
  if (dweights) {
    float S = 0.f, dot = 0.f;
    if (renormalize) {  // w_j = p_j / S: dp_j += (dw_j - sum_m dw_m w_m) / S
      for (int j = 0; j < k; ++j) S += p[idx[j]];
      for (int j = 0; j < k; ++j) dot += dweights[t * k + j] * (p[idx[j]] / S);
    }
    for (int j = 0; j < k; ++j) {
      const int e = int(idx[j]);
      if (e % 32 != lane) continue;
      for (int c = 0; c < kPerLane; ++c)  // static register index
        if (c == e / 32) dp[c] += renormalize ? (dweights[t * k + j] - dot) / S : dweights[t * k + j];
    }
  }
  float s = 0.f;
  for (int c = 0; c < kPerLane; ++c) {
    const int e = lane + 32 * c;
    if (e < E) s += p[e] * dp[c];
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
  for (int c = 0; c < kPerLane; ++c) {
    const int e = lane + 32 * c;
    if (e < E) dlogits[t * E + e] = p[e] * (dp[c] - s);
  }
}

// Histogram of expert indices. Indices outside [0, E) are counted as the nearest valid expert with
// `clamp` (where the routing order puts them), else skipped.
__global__ void count_kernel(int64_t n, int64_t E, const int64_t* indices, bool clamp,
                             unsigned long long* counts) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = indices[i];
    if (!clamp && (e < 0 || e >= E)) continue;
    atomicAdd(&counts[clamp_expert(e, E)], 1ull);
  }
}

// =============================================================================================
// Aux loss.
// Column sums of probs [T, E] in two deterministic passes: block c sums rows
// [c * rows, (c + 1) * rows) of every column in f64 (threads over columns: coalesced), then one
// thread per column adds the chunks in chunk order to psum. The f64 sums differ from the
// reference's one serial pass only by f64 rounding; the order is fixed, so runs repeat bitwise.
// (One thread per column over all T rows was a serial chain of 16384 dependent loads per MoE layer.)
constexpr int64_t kAuxRowsPerChunk = 64;

__global__ void aux_column_chunks_kernel(int64_t T_, int64_t E, const float* probs, double* chunks) {
  const int64_t c = blockIdx.x, t0 = c * kAuxRowsPerChunk;
  const int64_t t1 = t0 + kAuxRowsPerChunk < T_ ? t0 + kAuxRowsPerChunk : T_;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    double acc = 0.0;
    for (int64_t t = t0; t < t1; ++t) acc += double(probs[t * E + e]);
    chunks[c * E + e] = acc;
  }
}

__global__ void aux_column_total_kernel(int64_t n_chunks, int64_t E, const double* chunks, double* psum) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < E; e += int64_t(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (int64_t c = 0; c < n_chunks; ++c) acc += chunks[c * E + e];
    psum[e] += acc;
  }
}

__global__ void aux_finish_kernel(int64_t E, double scale, const int64_t* counts, const double* psum,
                                  float* loss) {
  if (threadIdx.x != 0) return;
  double aux = 0.0;
  for (int64_t e = 0; e < E; ++e) aux += double(counts[e]) * psum[e];
  *loss = float(scale * aux);
}

__global__ void aux_bwd_kernel(int64_t T_, int64_t E, double scale, const int64_t* counts, const float* dloss,
                               float* dprobs) {
  const double g = double(*dloss) * scale;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < T_ * E;
       i += int64_t(gridDim.x) * blockDim.x)
    dprobs[i] = float(g * double(counts[i % E]));
}

// =============================================================================================
// Routing order.
constexpr int kRowTile = 64;       // rows per tile of the f32 and WMMA grouped GEMMs
constexpr int kWideRowTile = 128;  // of the mma.sync ones

// One thread: offsets[e+1] = offsets[e] + counts[e]; tiles[e+1] = tiles[e] + ceil(counts[e] / 64)
// and wide_tiles the same with 128-row tiles.
__global__ void scan_kernel(int64_t E, const unsigned long long* counts, int64_t* offsets, int* tiles,
                            int* wide_tiles) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  offsets[0] = 0;
  tiles[0] = 0;
  wide_tiles[0] = 0;
  for (int64_t e = 0; e < E; ++e) {
    offsets[e + 1] = offsets[e] + int64_t(counts[e]);
    tiles[e + 1] = tiles[e] + int((counts[e] + kRowTile - 1) / kRowTile);
    wide_tiles[e + 1] = wide_tiles[e] + int((counts[e] + kWideRowTile - 1) / kWideRowTile);
  }
}

// One block (1024 threads) per expert: walks the indices in order; ballots give each match its
// rank among the earlier matches, so the order is stable. token (when not null) gets each routing
// row's token, order / k: the row the expert GEMMs gather, with no division in their inner loops.
__global__ void rank_kernel(int64_t n, int64_t E, int64_t k, const int64_t* indices, const int64_t* offsets,
                            int64_t* order, int64_t* pos, int64_t* token) {
  __shared__ int warp_counts[32];
  const int64_t e = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int64_t running = offsets[e];
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const bool match = i < n && clamp_expert(indices[i], E) == e;
    const unsigned ballot = __ballot_sync(kFull, match);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < warps; ++w) {
      before += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    if (match) {
      const int64_t r = running + before + __popc(ballot & ((1u << lane) - 1u));
      order[r] = i;
      pos[i] = r;
      if (token) token[r] = i / k;
    }
    running += total;
    __syncthreads();  // warp_counts is rewritten next round
  }
}

// Everything the expert kernels need to know about the routing, on the device. tiles holds the
// prefix sums of the experts' row tiles of 64 rows (E + 1 ints), then of 128 rows (E + 1 more);
// token [T*k] each routing row's token.
struct Routing {
  Scratch order, pos, offsets, tiles, token;
  Routing(const KernelContext& ctx, const MoeExpertDims& d)
      : order(ctx, sizeof(int64_t) * size_t(d.T * d.k)),
        pos(ctx, sizeof(int64_t) * size_t(d.T * d.k)),
        offsets(ctx, sizeof(int64_t) * size_t(d.E + 1)),
        tiles(ctx, sizeof(int) * size_t(2 * (d.E + 1))),
        token(ctx, sizeof(int64_t) * size_t(d.T * d.k)) {}
  const int* row_tiles(int rows_per_tile, int64_t E) const {
    TITAN_CHECK(rows_per_tile == kRowTile || rows_per_tile == kWideRowTile, "moe (cuda): no prefix sums of ",
                rows_per_tile, "-row tiles");
    return tiles.as<int>() + (rows_per_tile == kRowTile ? 0 : E + 1);
  }
  // Upper bound of the row tiles over all experts (grid size of the rows GEMM).
  static int64_t max_tiles(const MoeExpertDims& d, int rows_per_tile) {
    return (d.T * d.k + rows_per_tile - 1) / rows_per_tile + d.E;
  }
};

// tiles: 2 (E + 1) ints, as Routing::tiles; token may be null.
void build_routing(const KernelContext& ctx, const MoeExpertDims& d, const int64_t* indices, int64_t* order,
                   int64_t* pos, int64_t* offsets, int* tiles, int64_t* token) {
  const int64_t n = d.T * d.k;
  cudaStream_t stream = stream_of(ctx);
  Scratch counts(ctx, sizeof(unsigned long long) * size_t(d.E));
  TITAN_CHECK(
      cudaMemsetAsync(counts.as<void>(), 0, sizeof(unsigned long long) * size_t(d.E), stream) == cudaSuccess,
      "moe (cuda): clearing the expert counts failed");
  // Clamped indices count where the rank kernel places them.
  if (n > 0) {
    count_kernel<<<grid_for(n), 256, 0, stream>>>(n, d.E, indices, true, counts.as<unsigned long long>());
    check_launch("moe (cuda): expert histogram");
  }
  scan_kernel<<<1, 32, 0, stream>>>(d.E, counts.as<unsigned long long>(), offsets, tiles, tiles + d.E + 1);
  check_launch("moe (cuda): routing scan");
  if (n > 0) {
    rank_kernel<<<unsigned(d.E), 1024, 0, stream>>>(n, d.E, d.k, indices, offsets, order, pos, token);
    check_launch("moe (cuda): routing rank");
  }
}

// =============================================================================================
// Grouped GEMMs (f32 FMA tiles, 64 x 64 per block, 16 x 16 threads with 4 x 4 outputs each).
constexpr int kTileN = 64, kTileK = 16, kGemmThreads = 256;

enum class Epilogue { kStoreRounded, kAdd };

// Block `tile` of a grouped row GEMM: the expert e whose row tiles hold it, tiles[e] <= tile <
// tiles[e + 1] (tiles[] is the exclusive prefix sum of the experts' counts of row tiles of
// rows_per_tile rows; found by binary search), and the tile's rows [r0, r_end) (r_end: the end of
// expert e's rows).
struct RowTile {
  int64_t e, r0, r_end;
};
__device__ inline RowTile row_tile_of(const int* tiles, const int64_t* offsets, int64_t E, int tile,
                                      int rows_per_tile) {
  int64_t lo = 0, hi = E;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (tiles[mid] <= tile)
      lo = mid;
    else
      hi = mid;
  }
  return {lo, offsets[lo] + int64_t(tile - tiles[lo]) * rows_per_tile, offsets[lo + 1]};
}

// For each expert e and its rows r in [offsets[e], offsets[e+1]):
//   C[r, col] (=|+=) sum_kk A[arow(r), kk] * B_e(kk, col),   arow(r) = gather ? gather[r] : r
// (gather: the routing rows' tokens, to read x in routing order)
// B_e = B + e * stride_b is stored [N, K] (kTransB: C = A B_e^T) or [K, N]. blockIdx.x enumerates
// (expert, row tile) through tiles[]; blockIdx.y the column tile.
// acc (the thread's 4 x 4 outputs at rows ty*4.., columns tx*4..) += As^T Bs over the staged K tile.
__device__ __forceinline__ void multiply_tiles(const float (&As)[kTileK][kRowTile + 4],
                                               const float (&Bs)[kTileK][kTileN + 4], int tx, int ty,
                                               float (&acc)[4][4]) {
  for (int kk = 0; kk < kTileK; ++kk) {
    float a[4], b[4];
    for (int i = 0; i < 4; ++i) a[i] = As[kk][ty * 4 + i];
    for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx * 4 + j];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
  }
}

// Stages one K step of an operand in shared memory: S[kk][c] = load(kk, c) for kk < kTileK and
// c < kCols (load returns 0 outside the operand), the block's threads walking K fastest
// (kKFastest: the operand is contiguous along K) or the columns fastest.
template <int kCols, bool kKFastest, class Load>
__device__ __forceinline__ void stage_f32_tile(float (&S)[kTileK][kCols + 4], Load load) {
  for (int idx = threadIdx.x; idx < kTileK * kCols; idx += kGemmThreads) {
    const int kk = kKFastest ? idx % kTileK : idx / kCols, c = kKFastest ? idx / kTileK : idx % kCols;
    S[kk][c] = load(kk, c);
  }
}

template <class T, bool kTransB, class TC, Epilogue kEpi>
__global__ void __launch_bounds__(kGemmThreads)
    grouped_rows_gemm(int64_t N, int64_t K, const T* A, int64_t lda, const int64_t* gather, const T* B,
                      int64_t stride_b, const int64_t* offsets, const int* tiles, int64_t E, TC* C,
                      int64_t ldc) {
  __shared__ float As[kTileK][kRowTile + 4];
  __shared__ float Bs[kTileK][kTileN + 4];
  const int tile = blockIdx.x;
  if (tile >= tiles[E]) return;  // block-uniform
  const RowTile rows = row_tile_of(tiles, offsets, E, tile, kRowTile);
  const int64_t e = rows.e, r0 = rows.r0, r_end = rows.r_end, c0 = int64_t(blockIdx.y) * kTileN;
  const T* Be = B + e * stride_b;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    stage_f32_tile<kRowTile, true>(As, [&](int kk, int m) {
      const int64_t r = r0 + m, kcol = k0 + kk;
      if (r >= r_end || kcol >= K) return 0.f;
      const int64_t arow = gather ? gather[r] : r;
      return to_f32(A[arow * lda + kcol]);
    });
    // Consecutive threads walk B's contiguous dimension: K when B is transposed, else N.
    stage_f32_tile<kTileN, kTransB>(Bs, [&](int kk, int nn) {
      const int64_t kcol = k0 + kk, col = c0 + nn;
      if (kcol >= K || col >= N) return 0.f;
      return to_f32(kTransB ? Be[col * K + kcol] : Be[kcol * N + col]);
    });
    __syncthreads();
    multiply_tiles(As, Bs, tx, ty, acc);
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + ty * 4 + i;
    if (r >= r_end) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t col = c0 + tx * 4 + j;
      if (col >= N) continue;
      if constexpr (kEpi == Epilogue::kAdd)
        C[r * ldc + col] += acc[i][j];
      else
        C[r * ldc + col] = from_f32<TC>(acc[i][j]);
    }
  }
}

// Weight gradients: C[e] [M, N] (+)= sum over expert e's rows r of A[r, m] * B[brow(r), n],
// brow(r) = gather ? gather[r] : r, added to what C holds when `accumulate` (a
// parameter's gradient buffer). grid (ceil(N/64), ceil(M/64), E); experts without rows get zeros
// (or keep what they hold).
template <class T>
__global__ void __launch_bounds__(kGemmThreads)
    grouped_weight_grad(int64_t M, int64_t N, const T* A, int64_t lda, const T* B, int64_t ldb,
                        const int64_t* gather, const int64_t* offsets, float* C, bool accumulate) {
  __shared__ float As[kTileK][kRowTile + 4];
  __shared__ float Bs[kTileK][kTileN + 4];
  const int64_t e = blockIdx.z, m0 = int64_t(blockIdx.y) * kRowTile, n0 = int64_t(blockIdx.x) * kTileN;
  const int64_t r_begin = offsets[e], r_end = offsets[e + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t rs = r_begin; rs < r_end; rs += kTileK) {
    stage_f32_tile<kRowTile, false>(As, [&](int kk, int m) {
      const int64_t r = rs + kk, row = m0 + m;
      return (r < r_end && row < M) ? to_f32(A[r * lda + row]) : 0.f;
    });
    stage_f32_tile<kTileN, false>(Bs, [&](int kk, int nn) {
      const int64_t r = rs + kk, col = n0 + nn;
      if (r >= r_end || col >= N) return 0.f;
      const int64_t brow = gather ? gather[r] : r;
      return to_f32(B[brow * ldb + col]);
    });
    __syncthreads();
    multiply_tiles(As, Bs, tx, ty, acc);
    __syncthreads();
  }
  float* Ce = C + e * M * N;
  for (int i = 0; i < 4; ++i) {
    const int64_t row = m0 + ty * 4 + i;
    if (row >= M) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx * 4 + j;
      if (col < N) Ce[row * N + col] = accumulate ? Ce[row * N + col] + acc[i][j] : acc[i][j];
    }
  }
}

// ---- the same two grouped GEMMs on bf16 tensor cores (WMMA 16x16x16, f32 accumulators) ---------
// Used for bf16 models (every operand bf16: the backward's dy * w, dg and du are stored rounded, as a
// bf16 autograd holds them). 64 x 64 tiles, 4 warps of 32 x 32,
// K steps of 32, the accumulators leave through a shared f32 tile for the bounds-checked epilogue.
namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::row_major>;
using FragAcol = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16_t, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::row_major>;
using FragBcol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16_t, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
constexpr int kTcK = 32, kTcThreads = 128;
constexpr int kLdK = kTcK + 8;    // bf16 tiles [64][40] (row-major, K contiguous)
constexpr int kLdN = kTileN + 8;  // bf16 tiles [32][72] (row-major, N or M contiguous)
constexpr int kLdC = kTileN + 4;  // f32 [64][68]
constexpr int kStage = 64 * kLdK > kTcK* kLdN ? 64 * kLdK : kTcK* kLdN;

// 8 consecutive bf16 into 16-byte aligned shared memory: one 16-byte load, or zeros when `inside`
// is false. src must be 16-byte aligned.
__device__ __forceinline__ void load8(bf16_t* dst, const bf16_t* src, bool inside) {
  *reinterpret_cast<uint4*>(dst) = inside ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
}

// Stages rows x cols (cols a multiple of 8) of a row-major source into dst[rows][ld] as bf16;
// element (i, j) is src_row(i)[j] when inside(i, j) (checked per 8-element chunk when `vec`, i.e.
// when every row start is 16-byte aligned and the column bound is a multiple of 8), else 0.
template <int kRows, int kCols, class RowPtr, class Inside>
__device__ __forceinline__ void stage_tile(bf16_t* dst, int ld, bool vec, RowPtr row_ptr, Inside inside) {
  if (vec) {
    for (int idx = threadIdx.x; idx < kRows * kCols / 8; idx += blockDim.x) {
      const int i = idx / (kCols / 8), j = (idx % (kCols / 8)) * 8;
      const bool in = inside(i, j);
      load8(dst + i * ld + j, in ? row_ptr(i) + j : static_cast<const bf16_t*>(nullptr), in);
    }
  } else {
    for (int idx = threadIdx.x; idx < kRows * kCols; idx += blockDim.x) {
      const int i = idx / kCols, j = idx % kCols;
      dst[i * ld + j] = inside(i, j) ? row_ptr(i)[j] : __float2bfloat16_rn(0.f);
    }
  }
}

// The 64 x 64 f32 result tile of a block: each warp stores its 2 x 2 fragments into Cs.
__device__ __forceinline__ void store_warp_tile(float* Cs, FragC (&acc)[2][2], int wm, int wn) {
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * kLdC + wn * 32 + j * 16, acc[i][j], kLdC,
                              wmma::mem_row_major);
}

template <bool kTransB, class TC, Epilogue kEpi>
__global__ void __launch_bounds__(kTcThreads)
    grouped_rows_gemm_tc(int64_t N, int64_t K, const bf16_t* A, int64_t lda, const int64_t* gather,
                         const bf16_t* B, int64_t stride_b, const int64_t* offsets, const int* tiles,
                         int64_t E, TC* C, int64_t ldc, bool vec) {
  __shared__ __align__(128) bf16_t As[64 * kLdK];
  __shared__ __align__(128) bf16_t Bs[kStage];
  __shared__ __align__(128) float Cs[64 * kLdC];
  const int tile = blockIdx.x;
  if (tile >= tiles[E]) return;  // block-uniform
  const RowTile rows = row_tile_of(tiles, offsets, E, tile, kRowTile);
  const int64_t e = rows.e, r0 = rows.r0, r_end = rows.r_end, c0 = int64_t(blockIdx.y) * kTileN;
  const bf16_t* Be = B + e * stride_b;
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  FragC acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int64_t k0 = 0; k0 < K; k0 += kTcK) {
    __syncthreads();  // the previous tiles are consumed
    stage_tile<64, kTcK>(
        As, kLdK, vec, [&](int m) { return A + (gather ? gather[r0 + m] : r0 + m) * lda + k0; },
        [&](int m, int kk) { return r0 + m < r_end && k0 + kk < K; });
    if (kTransB)  // B^T tile [64 n][32 k]: element (k, n) of B at Bs[n * kLdK + k]
      stage_tile<kTileN, kTcK>(
          Bs, kLdK, vec, [&](int nn) { return Be + (c0 + nn) * K + k0; },
          [&](int nn, int kk) { return c0 + nn < N && k0 + kk < K; });
    else  // B tile [32 k][64 n]
      stage_tile<kTcK, kTileN>(
          Bs, kLdN, vec, [&](int kk) { return Be + (k0 + kk) * N + c0; },
          [&](int kk, int nn) { return k0 + kk < K && c0 + nn < N; });
    __syncthreads();
    for (int kk = 0; kk < kTcK; kk += 16) {
      FragA a[2];
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], As + (wm * 32 + i * 16) * kLdK + kk, kLdK);
      for (int j = 0; j < 2; ++j) {
        if constexpr (kTransB) {
          FragBcol b;
          wmma::load_matrix_sync(b, Bs + (wn * 32 + j * 16) * kLdK + kk, kLdK);
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
        } else {
          FragB b;
          wmma::load_matrix_sync(b, Bs + kk * kLdN + wn * 32 + j * 16, kLdN);
          for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
        }
      }
    }
  }
  store_warp_tile(Cs, acc, wm, wn);
  __syncthreads();
  for (int idx = threadIdx.x; idx < 64 * kTileN; idx += kTcThreads) {
    const int m = idx / kTileN, nn = idx % kTileN;
    const int64_t r = r0 + m, col = c0 + nn;
    if (r >= r_end || col >= N) continue;
    const float v = Cs[m * kLdC + nn];
    if constexpr (kEpi == Epilogue::kAdd)
      C[r * ldc + col] += v;
    else
      C[r * ldc + col] = from_f32<TC>(v);
  }
}

__global__ void __launch_bounds__(kTcThreads)
    grouped_weight_grad_tc(int64_t M, int64_t N, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb,
                           const int64_t* gather, const int64_t* offsets, float* C, bool vec,
                           bool accumulate) {
  __shared__ __align__(128) bf16_t At[kTcK * kLdN];  // [32 r][64 m]: A^T read column-major
  __shared__ __align__(128) bf16_t Bs[kTcK * kLdN];  // [32 r][64 n]
  __shared__ __align__(128) float Cs[64 * kLdC];
  const int64_t e = blockIdx.z, m0 = int64_t(blockIdx.y) * kRowTile, n0 = int64_t(blockIdx.x) * kTileN;
  const int64_t r_begin = offsets[e], r_end = offsets[e + 1];
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  FragC acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int64_t rs = r_begin; rs < r_end; rs += kTcK) {
    __syncthreads();
    stage_tile<kTcK, 64>(
        At, kLdN, vec, [&](int kk) { return A + (rs + kk) * lda + m0; },
        [&](int kk, int m) { return rs + kk < r_end && m0 + m < M; });
    stage_tile<kTcK, kTileN>(
        Bs, kLdN, vec, [&](int kk) { return B + (gather ? gather[rs + kk] : rs + kk) * ldb + n0; },
        [&](int kk, int nn) { return rs + kk < r_end && n0 + nn < N; });
    __syncthreads();
    for (int kk = 0; kk < kTcK; kk += 16) {
      FragAcol a[2];  // element (m, r) at At[r * kLdN + m]
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], At + kk * kLdN + wm * 32 + i * 16, kLdN);
      for (int j = 0; j < 2; ++j) {
        FragB b;
        wmma::load_matrix_sync(b, Bs + kk * kLdN + wn * 32 + j * 16, kLdN);
        for (int i = 0; i < 2; ++i) wmma::mma_sync(acc[i][j], a[i], b, acc[i][j]);
      }
    }
  }
  store_warp_tile(Cs, acc, wm, wn);
  __syncthreads();
  float* Ce = C + e * M * N;
  for (int idx = threadIdx.x; idx < 64 * kTileN; idx += kTcThreads) {
    const int m = idx / kTileN, nn = idx % kTileN;
    const int64_t row = m0 + m, col = n0 + nn;
    if (row < M && col < N)
      Ce[row * N + col] = accumulate ? Ce[row * N + col] + Cs[m * kLdC + nn] : Cs[m * kLdC + nn];
  }
}

// ---- the same two grouped GEMMs on raw mma.sync with a multi-stage cp.async pipeline ----------
// The "mma_sync" and "mma_sync_wide" variants (bf16 operands, 16-byte aligned rows whose loaded
// extents are multiples of 8; the launchers fall back to WMMA otherwise). Block tile 128 rows x
// MmaTile<kWarpsN>::kN columns (128 with 4 warps, two blocks per SM; or 256 with 8 warps, one
// block per SM, reading a third fewer operand bytes from L2 per product), warps of 64 x 64 (4 x 8
// accumulator tiles of 16 x 8 in registers: 32 mma per 8 ldmatrix), K steps of 32 in kMmaStages
// shared-memory stages (dynamic shared memory): the tiles of the next kMmaStages - 1 steps travel
// by cp.async while the current one multiplies. Fragments come through ldmatrix (transposed where
// the operand's contiguous dimension is not K: the plain-B GEMMs of the backward and the
// transposed A of the weight gradients); the results leave straight from the accumulators, two
// adjacent columns per store where C's rows allow it. Same products, f32 accumulation and rounding
// points as WMMA.
constexpr int kMmaM = 128, kMmaK = 32, kMmaStages = 4;
// Blocks per SM the register budget must allow (__launch_bounds__' second argument: ptxas then
// keeps a thread within 65536 / (threads x blocks) registers, 256 for the 4-warp tile, instead of
// the two blocks resting on its choice of 248).
constexpr int mma_blocks_per_sm(int warps_n) {
  return warps_n == 2 ? 2 : 1;
}
constexpr int kMmaLdK = kMmaK + 8;  // [rows][32 k] tiles, K contiguous (80-byte rows)
constexpr int kMmaLdM = kMmaM + 8;  // [32 k][128 m] tiles, M contiguous (weight-gradient A^T)
static_assert(kMmaM == kWideRowTile, "the mma.sync row tiles are the routing's wide tiles");

// The block shape: 2 x kWarpsN warps of 64 x 64.
template <int kWarpsN>
struct MmaTile {
  static constexpr int kN = 64 * kWarpsN;        // columns per block
  static constexpr int kThreads = 64 * kWarpsN;  // 2 x kWarpsN warps
  static constexpr int kLdN = kN + 8;            // [32 k][kN n] tiles, N contiguous
};

// One stage of a [kRows][kCols] bf16 tile by cp.async over kThreads threads: this thread's chunks c
// go to dst[i * ld + j] from row_ptr(i, c) + j when inside(i, j), else zeros. `base` is any valid
// address of the operand: a zero-filled cp.async reads nothing but still names a global source.
template <int kRows, int kCols, int kThreads, class RowPtr, class Inside>
__device__ __forceinline__ void load_stage(bf16_t* dst, int ld, const bf16_t* base, RowPtr row_ptr,
                                           Inside inside) {
#pragma unroll
  for (int c = 0; c < stage_chunks<kRows, kCols, kThreads>(); ++c) {
    const int i = stage_chunk_row<kCols, kThreads>(c, threadIdx.x),
              j = stage_chunk_column<kCols, kThreads>(c, threadIdx.x);
    const bool in = inside(i, j);
    cp_async16(dst + i * ld + j, in ? row_ptr(i, c) + j : base, in);
  }
}

// The pipeline of a block: issue(step) queues step's tiles into stage step % kMmaStages (for steps
// 0, 1, 2, ... in order, each once), and multiply(stage) consumes one. One group is committed per step (empty
// past the end) so that waiting for all but the newest kMmaStages - 2 groups always means "this step's tiles
// landed". The barrier at the top of a step also says every warp is done with the stage the step then refills
// (the one the previous step multiplied).
template <class Issue, class Multiply>
__device__ __forceinline__ void run_mma_pipeline(int64_t steps, Issue issue, Multiply multiply) {
#pragma unroll
  for (int s = 0; s < kMmaStages - 1; ++s) {
    if (s < steps) issue(s);
    cp_async_commit();
  }
  for (int64_t step = 0; step < steps; ++step) {
    cp_async_wait<kMmaStages - 2>();
    __syncthreads();
    if (step + kMmaStages - 1 < steps) issue(step + kMmaStages - 1);
    cp_async_commit();
    multiply(int(step % kMmaStages));
  }
  cp_async_wait<0>();
}

// This warp's 64 x 64 share of the block's result (mma_tile_element says where each register
// lands). Hands each pair of adjacent columns to put(row, col, v0, v1), row and col (even) within
// the block's tile (put checks the bounds).
template <class Put>
__device__ __forceinline__ void store_mma_tile(const float (&acc)[4][8][4], int wm, int wn, Put put) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const TileElement at = mma_tile_element(wm, wn, i, j, 2 * h, lane);
        put(at.row, at.col, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
}

// Writes (or adds) v0, v1 at C[row * ldc + col] and C[row * ldc + col + 1], the columns below n;
// as one 2-element store when `pairs` (C's rows start at even elements of a suitably aligned C).
template <class TC, Epilogue kEpi>
__device__ __forceinline__ void put_pair(TC* C, int64_t ldc, int64_t row, int64_t col, int64_t n, bool pairs,
                                         float v0, float v1) {
  TC* p = C + row * ldc + col;
  if (pairs && col + 1 < n) {
    if constexpr (kEpi == Epilogue::kAdd) {
      static_assert(std::is_same_v<TC, float>, "added results are f32");
      float2 old = *reinterpret_cast<float2*>(p);
      *reinterpret_cast<float2*>(p) = make_float2(old.x + v0, old.y + v1);
    } else if constexpr (std::is_same_v<TC, float>) {
      *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
    } else {
      *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v0, v1);
    }
    return;
  }
  for (int h = 0; h < 2 && col + h < n; ++h) {
    const float v = h ? v1 : v0;
    if constexpr (kEpi == Epilogue::kAdd)
      p[h] += v;
    else
      p[h] = from_f32<TC>(v);
  }
}

// One 32-deep K step of a warp: acc += A (64 rows of the warp, from a_frag) x B (64 columns).
// a_frag(i, ks, frag) loads the A fragment of rows i*16.., k ks*16..; b_frag(j2, ks, frag) the B
// fragments of columns j2*16 .. j2*16+15 (two 16 x 8 halves), k ks*16...
template <class AFrag, class BFrag>
__device__ __forceinline__ void mma_k_step(float (&acc)[4][8][4], AFrag a_frag, BFrag b_frag) {
#pragma unroll
  for (int ks = 0; ks < kMmaK / 16; ++ks) {
    uint32_t a[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a_frag(i, ks, a[i]);
#pragma unroll
    for (int j2 = 0; j2 < 4; ++j2) {
      uint32_t b[4];
      b_frag(j2, ks, b);
#pragma unroll
      for (int i = 0; i < 4; ++i) mma_16x16x16(acc[i][2 * j2], acc[i][2 * j2 + 1], a[i], b);
    }
  }
}

// Shared memory of the rows GEMM: kMmaStages stages of A [128 rows][32 k] and of B (B^T [kN n][32 k]
// or B [32 k][kN n]).
template <int kWarpsN>
constexpr size_t mma_rows_smem(bool trans_b) {
  using Tile = MmaTile<kWarpsN>;
  return sizeof(bf16_t) * kMmaStages *
         (kMmaM * kMmaLdK + (trans_b ? Tile::kN * kMmaLdK : kMmaK * Tile::kLdN));
}
// Of the weight-gradient GEMM: stages of A^T [32 r][128 m] and B [32 r][kN n].
template <int kWarpsN>
constexpr size_t mma_weight_grad_smem() {
  return sizeof(bf16_t) * kMmaStages * (kMmaK * kMmaLdM + kMmaK * MmaTile<kWarpsN>::kLdN);
}

// One block per (row tile, column tile), blockIdx.x = row tile * column tiles + column tile: the
// column tiles of one row tile are neighbours in launch order, so they run together and read the
// tile's (gathered) A rows from L2, not from memory, one after the other.
template <int kWarpsN, bool kTransB, class TC, Epilogue kEpi>
__global__ void __launch_bounds__(MmaTile<kWarpsN>::kThreads, mma_blocks_per_sm(kWarpsN))
    grouped_rows_gemm_mma(int64_t N, int64_t K, const bf16_t* A, int64_t lda, const int64_t* gather,
                          const bf16_t* B, int64_t stride_b, const int64_t* offsets, const int* tiles,
                          int64_t E, TC* C, int64_t ldc, bool pairs) {
  using Tile = MmaTile<kWarpsN>;
  constexpr int kBN = Tile::kN, kThreads = Tile::kThreads;
  constexpr int kAStage = kMmaM * kMmaLdK, kBStage = kTransB ? kBN * kMmaLdK : kMmaK * Tile::kLdN;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16_t* As = reinterpret_cast<bf16_t*>(mma_smem);
  bf16_t* Bs = As + kMmaStages * kAStage;
  __shared__ int64_t a_row[kMmaM];
  const unsigned column_tiles = unsigned((N + kBN - 1) / kBN);
  const int tile = int(blockIdx.x / column_tiles);
  if (tile >= tiles[E]) return;  // block-uniform
  const RowTile rows = row_tile_of(tiles, offsets, E, tile, kMmaM);
  const int64_t e = rows.e, r0 = rows.r0, r_end = rows.r_end, c0 = int64_t(blockIdx.x % column_tiles) * kBN;
  const bf16_t* Be = B + e * stride_b;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp / kWarpsN, wn = warp % kWarpsN;
  // The tile's A rows are the same at every K step: their offsets (through the rows' tokens when
  // gathered) are looked up once.
  for (int m = threadIdx.x; m < kMmaM; m += kThreads)
    a_row[m] = r0 + m < r_end ? (gather ? gather[r0 + m] : r0 + m) * lda : 0;
  __syncthreads();

  float acc[4][8][4] = {};
  run_mma_pipeline((K + kMmaK - 1) / kMmaK,
                   [&](int64_t step) {
                     const int stage = int(step % kMmaStages);
                     const int64_t k0 = step * kMmaK;
                     load_stage<kMmaM, kMmaK, kThreads>(
                         As + stage * kAStage, kMmaLdK, A, [&](int m, int) { return A + a_row[m] + k0; },
                         [&](int m, int kk) { return r0 + m < r_end && k0 + kk < K; });
                     if constexpr (kTransB)  // B^T tile [kBN n][32 k]
                       load_stage<kBN, kMmaK, kThreads>(
                           Bs + stage * kBStage, kMmaLdK, Be,
                           [&](int nn, int) { return Be + (c0 + nn) * K + k0; },
                           [&](int nn, int kk) { return c0 + nn < N && k0 + kk < K; });
                     else  // B tile [32 k][kBN n]
                       load_stage<kMmaK, kBN, kThreads>(
                           Bs + stage * kBStage, Tile::kLdN, Be,
                           [&](int kk, int) { return Be + (k0 + kk) * N + c0; },
                           [&](int kk, int nn) { return k0 + kk < K && c0 + nn < N; });
                   },
                   [&](int stage) {
                     const bf16_t* as = As + stage * kAStage;
                     const bf16_t* bs = Bs + stage * kBStage;
                     mma_k_step(
                         acc,
                         [&](int i, int ks, uint32_t(&f)[4]) {
                           ldmatrix_x4(f, as + frag_a_rk(kMmaLdK, wm * 64 + i * 16, ks * 16, lane));
                         },
                         [&](int j2, int ks, uint32_t(&f)[4]) {
                           if constexpr (kTransB)
                             ldmatrix_x4(f, bs + frag_b_nk(kMmaLdK, wn * 64 + j2 * 16, ks * 16, lane));
                           else
                             ldmatrix_x4_trans(f,
                                               bs + frag_b_kn(Tile::kLdN, ks * 16, wn * 64 + j2 * 16, lane));
                         });
                   });
  store_mma_tile(acc, wm, wn, [&](int m, int nn, float v0, float v1) {
    const int64_t r = r0 + m, col = c0 + nn;
    if (r < r_end && col < N) put_pair<TC, kEpi>(C, ldc, r, col, N, pairs, v0, v1);
  });
}

// Weight gradients on mma.sync: C[e] [M, N] (+)= sum over expert e's rows r of A[r, m] *
// B[brow(r), n] (added to C when `accumulate`). grid (ceil(N/kN), ceil(M/128), E); experts without
// rows get zeros (or keep what they hold). The reduction runs over rows, so A's tile [32 r][128 m]
// is read transposed.
template <int kWarpsN>
__global__ void __launch_bounds__(MmaTile<kWarpsN>::kThreads, mma_blocks_per_sm(kWarpsN))
    grouped_weight_grad_mma(int64_t M, int64_t N, const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb,
                            const int64_t* gather, const int64_t* offsets, float* C, bool accumulate,
                            bool pairs) {
  using Tile = MmaTile<kWarpsN>;
  constexpr int kBN = Tile::kN, kThreads = Tile::kThreads;
  constexpr int kAStage = kMmaK * kMmaLdM, kBStage = kMmaK * Tile::kLdN;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  bf16_t* At = reinterpret_cast<bf16_t*>(mma_smem);
  bf16_t* Bs = At + kMmaStages * kAStage;
  const int64_t e = blockIdx.z, m0 = int64_t(blockIdx.y) * kMmaM, n0 = int64_t(blockIdx.x) * kBN;
  const int64_t r_begin = offsets[e], r_end = offsets[e + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wm = warp / kWarpsN, wn = warp % kWarpsN;
  // The B rows (the rows' tokens when gathered) of this thread's chunks of a step's B tile, looked
  // up one step ahead: the lookup of step s + 1 is in flight while step s multiplies, instead of
  // stalling the issue of every step on a dependent global load.
  constexpr int kBChunks = stage_chunks<kMmaK, kBN, kThreads>();
  int64_t b_row[kBChunks];
  auto look_up_b_rows = [&](int64_t step) {
#pragma unroll
    for (int c = 0; c < kBChunks; ++c) {
      const int64_t r = r_begin + step * kMmaK + stage_chunk_row<kBN, kThreads>(c, threadIdx.x);
      b_row[c] = r < r_end ? (gather ? gather[r] : r) : 0;
    }
  };
  look_up_b_rows(0);

  float acc[4][8][4] = {};
  run_mma_pipeline(
      (r_end - r_begin + kMmaK - 1) / kMmaK,  // block-uniform
      [&](int64_t step) {  // called for steps 0, 1, 2, ... in order: b_row holds this step's rows
        const int stage = int(step % kMmaStages);
        const int64_t rs = r_begin + step * kMmaK;
        load_stage<kMmaK, kMmaM, kThreads>(
            At + stage * kAStage, kMmaLdM, A, [&](int kk, int) { return A + (rs + kk) * lda + m0; },
            [&](int kk, int m) { return rs + kk < r_end && m0 + m < M; });
        load_stage<kMmaK, kBN, kThreads>(
            Bs + stage * kBStage, Tile::kLdN, B, [&](int, int c) { return B + b_row[c] * ldb + n0; },
            [&](int kk, int nn) { return rs + kk < r_end && n0 + nn < N; });
        look_up_b_rows(step + 1);
      },
      [&](int stage) {
        const bf16_t* at = At + stage * kAStage;
        const bf16_t* bs = Bs + stage * kBStage;
        mma_k_step(
            acc,
            [&](int i, int ks, uint32_t(&f)[4]) {
              ldmatrix_x4_trans(f, at + frag_a_kr(kMmaLdM, ks * 16, wm * 64 + i * 16, lane));
            },
            [&](int j2, int ks, uint32_t(&f)[4]) {
              ldmatrix_x4_trans(f, bs + frag_b_kn(Tile::kLdN, ks * 16, wn * 64 + j2 * 16, lane));
            });
      });
  float* Ce = C + e * M * N;
  store_mma_tile(acc, wm, wn, [&](int m, int nn, float v0, float v1) {
    const int64_t row = m0 + m, col = n0 + nn;
    if (row >= M || col >= N) return;
    if (accumulate)
      put_pair<float, Epilogue::kAdd>(Ce, N, row, col, N, pairs, v0, v1);
    else
      put_pair<float, Epilogue::kStoreRounded>(Ce, N, row, col, N, pairs, v0, v1);
  });
}

// =============================================================================================
// Elementwise steps of the experts.

// The row-wise steps run on a (column blocks, rows) grid, striding over both: a block's threads
// share one row (its routing values read once per thread) and walk its columns, with no 64-bit
// division per element.
constexpr int kRowThreads = 256;
dim3 row_grid(int64_t rows, int64_t cols) {
  return dim3(unsigned(std::clamp<int64_t>((cols + kRowThreads - 1) / kRowThreads, 1, 65535)),
              unsigned(std::clamp<int64_t>(rows, 1, 65535)));
}
#define TITAN_FOR_ROWS(r, rows) for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)
#define TITAN_FOR_COLUMNS(c, cols)                                             \
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < (cols); \
       c += int64_t(gridDim.x) * blockDim.x)

// h[r, f] = T(T(silu(g)) * u) from act = [gate | up] (the reference's rounding points).
template <class T>
__global__ void swiglu_rows_kernel(int64_t n, int64_t F, const T* act, T* h) {
  TITAN_FOR_ROWS(r, n) {
    const T* gate = act + r * 2 * F;
    TITAN_FOR_COLUMNS(f, F) {
      const float g = to_f32(gate[f]), u = to_f32(gate[F + f]);
      h[r * F + f] = from_f32<T>(rnd<T>(g * sigmoid(g)) * u);
    }
  }
}

// y[t, c]: token t's k contributions T(T(o) * T(w)) added in ascending expert (= routing row)
// order, rounding after every add.
template <class T>
__global__ void combine_kernel(int64_t T_, int64_t D, int k, const float* weights, const int64_t* pos,
                               const T* o, T* y) {
  TITAN_FOR_ROWS(t, T_) {
    TITAN_FOR_COLUMNS(c, D) {
      int64_t done = -1;  // rows visited in increasing order without sorting: k is small
      float acc = 0.f;
      for (int step = 0; step < k; ++step) {
        int64_t best = -1;
        int best_j = 0;
        for (int j = 0; j < k; ++j) {
          const int64_t r = pos[t * k + j];
          if (r > done && (best < 0 || r < best)) best = r, best_j = j;
        }
        done = best;
        const float w = rnd<T>(weights[t * k + best_j]);
        acc = rnd<T>(acc + rnd<T>(to_f32(o[best * D + c]) * w));
      }
      y[t * D + c] = from_f32<T>(acc);
    }
  }
}

// dyw[r, c] = T(w_i) * dy[t, c] for routing row r = pos[i], i = t * k + j, stored as Out: f32
// (moe_combine's rows' gradient, from the f32 dy) or T (the expert GEMMs' operand, from dy already
// rounded to T: T(T(w) T(dy)), the CPU kernel's rounding points).
template <class T, class In, class Out>
__global__ void scaled_dy_kernel(int64_t n, int64_t D, int64_t k, const int64_t* order, const float* weights,
                                 const In* dy, Out* dyw) {
  TITAN_FOR_ROWS(r, n) {
    const int64_t i = order[r];
    const float w = rnd<T>(weights[i]);
    const In* dy_row = dy + (i / k) * D;
    TITAN_FOR_COLUMNS(c, D) dyw[r * D + c] = from_f32<Out>(w * to_f32(dy_row[c]));
  }
}

// From dh = dy wd[e] (f32, before the routing weight) and act: with dhw = T(w) * dh,
// dg = dhw * u * sg * (1 + g (1 - sg)) and du = dhw * T(silu(g)), stored as T side by side,
// gu[r] = [dg | du]: the GEMMs that read them take bf16 operands rounded.
template <class T>
__global__ void swiglu_bwd_rows_kernel(int64_t n, int64_t F, const int64_t* order, const float* weights,
                                       const T* act, const float* dh, T* gu) {
  TITAN_FOR_ROWS(r, n) {
    const T* gate = act + r * 2 * F;
    T* out = gu + r * 2 * F;
    const float w = rnd<T>(weights[order[r]]);
    TITAN_FOR_COLUMNS(f, F) {
      const float g = to_f32(gate[f]), u = to_f32(gate[F + f]);
      const float sg = sigmoid(g), dhv = w * dh[r * F + f];
      out[f] = from_f32<T>(dhv * u * sg * (1.f + g * (1.f - sg)));
      out[F + f] = from_f32<T>(dhv * rnd<T>(g * sg));
    }
  }
}

// dx[t, c] = sum_j dxr[pos[t*k + j], c].
__global__ void gather_sum_kernel(int64_t T_, int64_t D, int64_t k, const int64_t* pos, const float* dxr,
                                  float* dx) {
  TITAN_FOR_ROWS(t, T_) {
    TITAN_FOR_COLUMNS(c, D) {
      float acc = 0.f;
      for (int64_t j = 0; j < k; ++j) acc += dxr[pos[t * k + j] * D + c];
      dx[t * D + c] = acc;
    }
  }
}
#undef TITAN_FOR_ROWS
#undef TITAN_FOR_COLUMNS

// dweights[order[r]] = sum_f dh[r, f] * h[r, f] with dh = dy wd[e]: the routing weight's gradient
// dy . o (o = h wd[e]^T, the unweighted expert output) summed the other way round, so the backward
// needs no o (the CPU kernel's way). One warp per row.
template <class T>
__global__ void dweights_kernel(int64_t n, int64_t F, const int64_t* order, const float* dh, const T* h,
                                float* dweights) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < n; r += warps) {
    float acc = 0.f;
    for (int64_t f = lane; f < F; f += 32) acc += dh[r * F + f] * to_f32(h[r * F + f]);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
    if (lane == 0) dweights[order[r]] = acc;
  }
}

// moe_combine's: dweights[i] = sum_c dy[t, c] * rows[r, c] (the rows as they are stored), one warp
// per row.
template <class T>
__global__ void combine_dweights_kernel(int64_t n, int64_t D, int64_t k, const int64_t* order,
                                        const float* dy, const T* rows, float* dweights) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < n; r += warps) {
    const int64_t i = order[r], t = i / k;
    float acc = 0.f;
    for (int64_t c = lane; c < D; c += 32) acc += dy[t * D + c] * to_f32(rows[r * D + c]);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
    if (lane == 0) dweights[i] = acc;
  }
}

// cuDNN's grouped matmul takes each expert's first row as int32 [E] and its tokens in expert order.
__global__ void first_rows_kernel(int64_t E, const int64_t* offsets, int32_t* first) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < E; e += int64_t(gridDim.x) * blockDim.x)
    first[e] = int32_t(offsets[e]);
}
template <class T>
__global__ void gather_rows_kernel(int64_t n, int64_t D, const int64_t* token, const T* x, T* xr) {
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    const T* src = x + token[r] * D;
    for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < D;
         c += int64_t(gridDim.x) * blockDim.x)
      xr[r * D + c] = src[c];
  }
}

// The backward's GEMMs on cuDNN need each expert's weight with K contiguous: out[e][c][r] (row stride
// ldo, expert stride C * ldo) = in[e][r][c] for in [E, R, C]; 32 x 32 tiles through shared memory.
__global__ void transpose_experts_kernel(int64_t R, int64_t C, const bf16_t* in, bf16_t* out, int64_t ldo) {
  __shared__ bf16_t tile[32][33];
  const int64_t e = blockIdx.z, r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  const bf16_t* src = in + e * R * C;
  bf16_t* dst = out + e * C * ldo;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < R && c < C) tile[i][threadIdx.x] = src[r * C + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < R && c < C) dst[c * ldo + r] = tile[threadIdx.x][i];
  }
}
// ---- launchers --------------------------------------------------------------------------------

// The two mma.sync block shapes (128 x 128 and 128 x 256).
bool is_mma_sync(MoeGemm algo) {
  return algo == MoeGemm::kMmaSync || algo == MoeGemm::kMmaSyncWide;
}

template <class T, bool kTransB, class TC, Epilogue kEpi>
void rows_gemm(const KernelContext& ctx, const MoeExpertDims& d, MoeGemm algo, int64_t N, int64_t K,
               const T* A, int64_t lda, const int64_t* gather, const T* B, int64_t stride_b,
               const Routing& routing, TC* C, int64_t ldc) {
  const int64_t tiles = Routing::max_tiles(d, kRowTile);
  TITAN_CHECK(tiles <= 0x7fffffff && (N + kTileN - 1) / kTileN <= 65535, "moe (cuda): GEMM grid too large");
  dim3 grid(unsigned(tiles), unsigned((N + kTileN - 1) / kTileN));
  const int64_t* offsets = routing.offsets.as<int64_t>();
  if constexpr (std::is_same_v<T, bf16_t>) {
    // 8-element loads: every A and B row start 16-byte aligned, and the loaded extent of a row a
    // multiple of 8 (K for A and a transposed B, N for a plain B).
    const bool vec = aligned16(A) && aligned16(B) && lda % 8 == 0 && K % 8 == 0 && stride_b % 8 == 0 &&
                     (kTransB || N % 8 == 0);
    if (is_mma_sync(algo) && vec) {
      const bool pairs = reinterpret_cast<uintptr_t>(C) % (2 * sizeof(TC)) == 0 && ldc % 2 == 0;
      auto launch = [&](auto warps_n) {
        constexpr int kWarpsN = decltype(warps_n)::value;
        const int64_t column_tiles = (N + MmaTile<kWarpsN>::kN - 1) / MmaTile<kWarpsN>::kN,
                      blocks = Routing::max_tiles(d, kWideRowTile) * column_tiles;
        TITAN_CHECK(blocks <= 0x7fffffff, "moe (cuda): GEMM grid too large");
        const size_t smem = mma_rows_smem<kWarpsN>(kTransB);
        const auto kernel = grouped_rows_gemm_mma<kWarpsN, kTransB, TC, kEpi>;
        allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), smem,
                                    "moe (cuda): grouped GEMM (mma.sync)");
        kernel<<<unsigned(blocks), MmaTile<kWarpsN>::kThreads, smem, stream_of(ctx)>>>(
            N, K, A, lda, gather, B, stride_b, offsets, routing.row_tiles(kWideRowTile, d.E), d.E, C, ldc,
            pairs);
      };
      if (algo == MoeGemm::kMmaSyncWide)
        launch(std::integral_constant<int, 4>{});
      else
        launch(std::integral_constant<int, 2>{});
      check_launch("moe (cuda): grouped GEMM (mma.sync)");
      return;
    }
    grouped_rows_gemm_tc<kTransB, TC, kEpi><<<grid, kTcThreads, 0, stream_of(ctx)>>>(
        N, K, A, lda, gather, B, stride_b, offsets, routing.row_tiles(kRowTile, d.E), d.E, C, ldc, vec);
  } else
    grouped_rows_gemm<T, kTransB, TC, kEpi><<<grid, kGemmThreads, 0, stream_of(ctx)>>>(
        N, K, A, lda, gather, B, stride_b, offsets, routing.row_tiles(kRowTile, d.E), d.E, C, ldc);
  check_launch("moe (cuda): grouped GEMM");
}

template <class T>
void weight_grad(const KernelContext& ctx, const MoeExpertDims& d, MoeGemm algo, int64_t M, int64_t N,
                 const T* A, int64_t lda, const T* B, int64_t ldb, const int64_t* gather,
                 const Routing& routing, float* C, bool accumulate) {
  TITAN_CHECK((M + kRowTile - 1) / kRowTile <= 65535 && d.E <= 65535,
              "moe (cuda): weight-gradient grid too large");
  dim3 grid(unsigned((N + kTileN - 1) / kTileN), unsigned((M + kRowTile - 1) / kRowTile), unsigned(d.E));
  const int64_t* offsets = routing.offsets.as<int64_t>();
  if constexpr (std::is_same_v<T, bf16_t>) {
    const bool vec = aligned16(A) && aligned16(B) && lda % 8 == 0 && ldb % 8 == 0 && M % 8 == 0 && N % 8 == 0;
    if (is_mma_sync(algo) && vec) {
      const bool pairs = reinterpret_cast<uintptr_t>(C) % 8 == 0;  // N is even: every row alike
      auto launch = [&](auto warps_n) {
        constexpr int kWarpsN = decltype(warps_n)::value;
        constexpr size_t smem = mma_weight_grad_smem<kWarpsN>();
        const auto kernel = grouped_weight_grad_mma<kWarpsN>;
        allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), smem,
                                    "moe (cuda): grouped weight gradient (mma.sync)");
        const dim3 mma_grid(unsigned((N + MmaTile<kWarpsN>::kN - 1) / MmaTile<kWarpsN>::kN),
                            unsigned((M + kMmaM - 1) / kMmaM), grid.z);
        kernel<<<mma_grid, MmaTile<kWarpsN>::kThreads, smem, stream_of(ctx)>>>(M, N, A, lda, B, ldb, gather,
                                                                               offsets, C, accumulate, pairs);
      };
      if (algo == MoeGemm::kMmaSyncWide)
        launch(std::integral_constant<int, 4>{});
      else
        launch(std::integral_constant<int, 2>{});
      check_launch("moe (cuda): grouped weight gradient (mma.sync)");
      return;
    }
    grouped_weight_grad_tc<<<grid, kTcThreads, 0, stream_of(ctx)>>>(M, N, A, lda, B, ldb, gather, offsets, C,
                                                                    vec, accumulate);
  } else
    grouped_weight_grad<T>
        <<<grid, kGemmThreads, 0, stream_of(ctx)>>>(M, N, A, lda, B, ldb, gather, offsets, C, accumulate);
  check_launch("moe (cuda): grouped weight gradient");
}

void check_expert_dims(const MoeExpertDims& d) {
  TITAN_CHECK(d.T >= 0 && d.D >= 1 && d.F >= 1 && d.E >= 1 && d.k >= 1 && d.k <= d.E && d.k <= 64,
              "moe (cuda): bad dims T=", d.T, " D=", d.D, " F=", d.F, " E=", d.E, " k=", d.k,
              " (k must be in [1, min(E, 64)])");
}

// Whether the "cudnn" variant sends a layer's row GEMMs to cuDNN at all: D and F multiples of 8 (the
// rule its registration and docs/kernels.md state). Judged per GEMM, a gate | up product with D = 8
// and F = 4 (K = 8, N = 8) would pass while the layer's others did not.
bool cudnn_takes_layer(const MoeExpertDims& d) {
  return d.D % 8 == 0 && d.F % 8 == 0;
}

// The "cudnn" variant's forward GEMMs: out [n, N] (row stride ldc, rounded to T) = tokens [n, K]
// (expert order) @ w[e]^T through cuDNN's grouped matmul when it takes the layer and the shape, else
// mma_sync.
template <class T>
void forward_rows_gemm(const KernelContext& ctx, const MoeExpertDims& d, MoeGemm algo, int64_t N, int64_t K,
                       const T* tokens, const T* w, const Routing& routing, const int32_t* first, T* out,
                       int64_t ldc) {
  const GroupedMatmulShape shape{d.T * d.k, K, N, d.E, ldc, DType::BF16};
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (algo == MoeGemm::kCudnn && first && cudnn_takes_layer(d) &&
        cudnn_grouped_matmul_unsupported(shape).empty() && aligned16(tokens) && aligned16(w) &&
        aligned16(out)) {
      cudnn_grouped_matmul(ctx.stream, shape, tokens, w, first, out);
      return;
    }
  }
  rows_gemm<T, true, T, Epilogue::kStoreRounded>(ctx, d, algo == MoeGemm::kCudnn ? MoeGemm::kMmaSync : algo,
                                                 N, K, tokens, K, nullptr, w, N * K, routing, out, ldc);
}

// For the "cudnn" variant: each expert's first row as int32 (null for the other variants). A
// missing or older cuDNN is an error naming it, never a silent fallback.
std::unique_ptr<Scratch> first_rows(const KernelContext& ctx, const MoeExpertDims& d, MoeGemm algo,
                                    const Routing& routing) {
  if (algo != MoeGemm::kCudnn) return nullptr;
  const std::string why = cudnn_grouped_matmul_unavailable();
  TITAN_CHECK(why.empty(), "moe_experts (cuda, cudnn): ", why);
  auto first = std::make_unique<Scratch>(ctx, sizeof(int32_t) * size_t(d.E));
  first_rows_kernel<<<grid_for(d.E), 256, 0, stream_of(ctx)>>>(d.E, routing.offsets.as<int64_t>(),
                                                               first->as<int32_t>());
  check_launch("moe (cuda): first rows");
  return first;
}
const int32_t* as_first(const std::unique_ptr<Scratch>& first) { return first ? first->as<int32_t>() : nullptr; }

// in [E, R, C] bf16 -> out[e] = in[e]^T, rows of ldo elements (columns [0, R) written).
void transpose_experts(const KernelContext& ctx, int64_t E, int64_t R, int64_t C, const bf16_t* in, bf16_t* out,
                       int64_t ldo) {
  TITAN_CHECK((R + 31) / 32 <= 65535 && E <= 65535, "moe (cuda): transpose grid too large");
  const dim3 grid(unsigned((C + 31) / 32), unsigned((R + 31) / 32), unsigned(E)), block(32, 8);
  transpose_experts_kernel<<<grid, block, 0, stream_of(ctx)>>>(R, C, in, out, ldo);
  check_launch("moe (cuda): transpose expert weights");
}

// Whether the "cudnn" variant's backward dx GEMM (bf16 operands, f32 out) goes to cuDNN: the shape
// it takes and a plan that builds. cuDNN documents bf16 outputs for its grouped matmul, not f32, so
// a plan that does not build is said once on stderr and the GEMM runs mma_sync. (The dh GEMM reads
// dy rows gathered by token, which cuDNN's contiguous rows do not: it always runs mma_sync.)
bool cudnn_takes_backward(const MoeExpertDims& d, const int32_t* first) {
  const GroupedMatmulShape dx{d.T * d.k, 2 * d.F, d.D, d.E, d.D, DType::F32};
  if (!first || !cudnn_takes_layer(d) || !cudnn_grouped_matmul_unsupported(dx).empty()) return false;
  const std::string why = cudnn_grouped_matmul_plan_error(dx);
  if (why.empty()) return true;
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(stderr, "titan: moe_experts (cuda, cudnn): the backward's dx GEMM runs mma_sync: %s\n",
                 why.c_str());
  });
  return false;
}

template <class T>
void experts_fwd(const KernelContext& ctx, const MoeExpertDims& d, MoeGemm algo, const T* x,
                 const float* weights, const int64_t* indices, const T* wg, const T* wu, const T* wd, T* act,
                 T* y) {
  const int64_t n = d.T * d.k;
  if (d.T == 0) return;
  if constexpr (!std::is_same_v<T, bf16_t>)  // cuDNN's grouped matmul is bf16: f32 has no cudnn variant
    if (algo == MoeGemm::kCudnn) algo = MoeGemm::kMmaSync;
  cudaStream_t stream = stream_of(ctx);
  Routing routing(ctx, d);
  build_routing(ctx, d, indices, routing.order.as<int64_t>(), routing.pos.as<int64_t>(),
                routing.offsets.as<int64_t>(), routing.tiles.as<int>(), routing.token.as<int64_t>());
  const int64_t* token = routing.token.as<int64_t>();
  const std::unique_ptr<Scratch> first = first_rows(ctx, d, algo, routing);
  Scratch o(ctx, sizeof(T) * size_t(n * d.D));
  // act = [x wg^T | x wu^T] per routing row (rounded to T).
  if (algo == MoeGemm::kCudnn) {
    // cuDNN reads the tokens in expert order (gathered once, into o) and writes a contiguous output:
    // one GEMM over each expert's gate and up rows stacked, [wg[e]; wu[e]] [2F, D], fills act.
    T* xr = o.as<T>();
    gather_rows_kernel<T><<<row_grid(n, d.D), kRowThreads, 0, stream>>>(n, d.D, token, x, xr);
    check_launch("moe (cuda): gather rows");
    Scratch wgu(ctx, sizeof(T) * size_t(d.E * 2 * d.F * d.D));
    const size_t expert_bytes = sizeof(T) * size_t(d.F * d.D);
    for (const auto& [src, offset] : {std::pair{wg, size_t(0)}, std::pair{wu, expert_bytes}})
      TITAN_CUDA_CHECK(cudaMemcpy2DAsync(wgu.as<char>() + offset, 2 * expert_bytes, src, expert_bytes, expert_bytes,
                                         size_t(d.E), cudaMemcpyDeviceToDevice, stream));
    forward_rows_gemm<T>(ctx, d, algo, 2 * d.F, d.D, xr, wgu.as<T>(), routing, as_first(first), act, 2 * d.F);
  } else {
    rows_gemm<T, true, T, Epilogue::kStoreRounded>(ctx, d, algo, d.F, d.D, x, d.D, token, wg, d.F * d.D,
                                                   routing, act, 2 * d.F);
    rows_gemm<T, true, T, Epilogue::kStoreRounded>(ctx, d, algo, d.F, d.D, x, d.D, token, wu, d.F * d.D,
                                                   routing, act + d.F, 2 * d.F);
  }
  Scratch h(ctx, sizeof(T) * size_t(n * d.F));
  swiglu_rows_kernel<T><<<row_grid(n, d.F), kRowThreads, 0, stream>>>(n, d.F, act, h.as<T>());
  check_launch("moe (cuda): swiglu rows");
  forward_rows_gemm<T>(ctx, d, algo, d.D, d.F, h.as<T>(), wd, routing, as_first(first), o.as<T>(), d.D);
  combine_kernel<T><<<row_grid(d.T, d.D), kRowThreads, 0, stream>>>(d.T, d.D, int(d.k), weights,
                                                                    routing.pos.as<int64_t>(), o.as<T>(), y);
  check_launch("moe (cuda): combine");
}

template <class T>
void experts_bwd(const KernelContext& ctx, const MoeExpertDims& d, MoeGemm algo, const T* x,
                 const float* weights, const int64_t* indices, const T* wg, const T* wu, const T* wd,
                 const T* act, const float* dy, float* dx, float* dweights, float* dwg, float* dwu,
                 float* dwd, bool add_dweights) {
  const int64_t n = d.T * d.k;
  cudaStream_t stream = stream_of(ctx);
  auto zero = [&](float* p, int64_t count) {
    if (p)
      TITAN_CHECK(cudaMemsetAsync(p, 0, sizeof(float) * size_t(count), stream) == cudaSuccess,
                  "moe (cuda): clearing a gradient failed");
  };
  if (d.T == 0) {  // no tokens: zero weight gradients (added: nothing to add)
    if (add_dweights) return;
    zero(dwg, d.E * d.F * d.D);
    zero(dwu, d.E * d.F * d.D);
    zero(dwd, d.E * d.D * d.F);
    return;
  }
  if constexpr (!std::is_same_v<T, bf16_t>)
    if (algo == MoeGemm::kCudnn) algo = MoeGemm::kMmaSync;
  Routing routing(ctx, d);
  build_routing(ctx, d, indices, routing.order.as<int64_t>(), routing.pos.as<int64_t>(),
                routing.offsets.as<int64_t>(), routing.tiles.as<int>(), routing.token.as<int64_t>());
  const int64_t* order = routing.order.as<int64_t>();
  const int64_t* token = routing.token.as<int64_t>();
  std::unique_ptr<Scratch> h;  // the swiglu output again: an operand of dweights and dwd only
  if (dweights || dwd) {
    h = std::make_unique<Scratch>(ctx, sizeof(T) * size_t(n * d.F));
    swiglu_rows_kernel<T><<<row_grid(n, d.F), kRowThreads, 0, stream>>>(n, d.F, act, h->as<T>());
    check_launch("moe (cuda): swiglu rows");
  }
  const std::unique_ptr<Scratch> first = first_rows(ctx, d, algo, routing);
  // cuDNN takes the backward's dx GEMM with transposed copies of the weights; the other GEMMs, and
  // shapes it does not take, run mma_sync.
  bool cudnn_rows = false;
  if constexpr (std::is_same_v<T, bf16_t>) cudnn_rows = algo == MoeGemm::kCudnn && cudnn_takes_backward(d, as_first(first));
  if (algo == MoeGemm::kCudnn) algo = MoeGemm::kMmaSync;
  const bool need_gu = dx || dwg || dwu;
  // The GEMMs' operands dy, dyw, dg and du are stored as T: the tensor-core GEMMs take them rounded
  // to bf16 (as a bf16 autograd holds them) and f32 models keep them exact.
  // dh [n, F] = dy[token] [n, D] @ wd[e] [D, F], before the routing weight, in f32: the routing
  // weight's gradient is dh . h per row (no recompute of the down projection's output), and the
  // swiglu backward weighs it into gu = [dg | du] [n, 2F].
  std::unique_ptr<Scratch> gu;
  if (need_gu) gu = std::make_unique<Scratch>(ctx, sizeof(T) * size_t(n * 2 * d.F));
  // dy rounded to T once (f32 models read it as it is): the operand of dh's GEMM and of dyw, freed
  // before dx's rows (as the meta device plans it). (The services' convert queues on their stream,
  // which is every context's: KernelContext.)
  std::unique_ptr<Scratch> dy_rounded;
  const T* dy_t = nullptr;
  if constexpr (std::is_same_v<T, float>) {
    dy_t = dy;
  } else if (dweights || need_gu || dwd) {
    dy_rounded = std::make_unique<Scratch>(ctx, sizeof(T) * size_t(d.T * d.D));
    ctx.services->convert(dy_rounded->as<T>(), DType::BF16, dy, DType::F32, d.T * d.D);
    dy_t = dy_rounded->as<T>();
  }
  if (dweights || need_gu) {
    Scratch dh(ctx, sizeof(float) * size_t(n * d.F));
    rows_gemm<T, false, float, Epilogue::kStoreRounded>(ctx, d, algo, d.F, d.D, dy_t, d.D, token, wd,
                                                        d.D * d.F, routing, dh.as<float>(), d.F);
    if (dweights) {
      dweights_kernel<T>
          <<<grid_for(n * 32), 256, 0, stream>>>(n, d.F, order, dh.as<float>(), h->as<T>(), dweights);
      check_launch("moe (cuda): routing-weight gradient");
    }
    if (need_gu) {
      swiglu_bwd_rows_kernel<T><<<row_grid(n, d.F), kRowThreads, 0, stream>>>(n, d.F, order, weights, act,
                                                                              dh.as<float>(), gu->as<T>());
      check_launch("moe (cuda): swiglu backward rows");
    }
  }
  if (dwd) {  // dwd[e] [D, F] = dyw^T h over the expert's rows, dyw = T(T(w) T(dy[token]))
    Scratch dyw(ctx, sizeof(T) * size_t(n * d.D));
    scaled_dy_kernel<T, T, T>
        <<<row_grid(n, d.D), kRowThreads, 0, stream>>>(n, d.D, d.k, order, weights, dy_t, dyw.as<T>());
    check_launch("moe (cuda): scaled dy");
    weight_grad<T>(ctx, d, algo, d.D, d.F, dyw.as<T>(), d.D, h->as<T>(), d.F, nullptr, routing, dwd,
                   add_dweights);
  }
  dy_rounded.reset();
  if (!need_gu) return;
  const T* dg = gu->as<T>();
  const T* du = dg + d.F;
  if (dwg)  // dwg[e] [F, D] = dg^T x over the expert's rows (x gathered by token)
    weight_grad<T>(ctx, d, algo, d.F, d.D, dg, 2 * d.F, x, d.D, token, routing, dwg, add_dweights);
  if (dwu) weight_grad<T>(ctx, d, algo, d.F, d.D, du, 2 * d.F, x, d.D, token, routing, dwu, add_dweights);
  if (dx) {  // dxr [n, D] = dg wg[e] + du wu[e]; dx[t] = sum of its k rows
    Scratch dxr(ctx, sizeof(float) * size_t(n * d.D));
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (cudnn_rows) {  // one GEMM over K = 2F: [dg | du] @ per expert [wg^T | wu^T] [D, 2F]
        Scratch wgut(ctx, sizeof(bf16_t) * size_t(d.E * d.D * 2 * d.F));
        transpose_experts(ctx, d.E, d.F, d.D, wg, wgut.as<bf16_t>(), 2 * d.F);
        transpose_experts(ctx, d.E, d.F, d.D, wu, wgut.as<bf16_t>() + d.F, 2 * d.F);
        cudnn_grouped_matmul(ctx.stream, {n, 2 * d.F, d.D, d.E, d.D, DType::F32}, gu->as<void>(),
                             wgut.as<void>(), as_first(first), dxr.as<float>());
      }
    }
    if (!cudnn_rows) {
      rows_gemm<T, false, float, Epilogue::kStoreRounded>(ctx, d, algo, d.D, d.F, dg, 2 * d.F, nullptr, wg,
                                                          d.F * d.D, routing, dxr.as<float>(), d.D);
      rows_gemm<T, false, float, Epilogue::kAdd>(ctx, d, algo, d.D, d.F, du, 2 * d.F, nullptr, wu, d.F * d.D,
                                                 routing, dxr.as<float>(), d.D);
    }
    gather_sum_kernel<<<row_grid(d.T, d.D), kRowThreads, 0, stream>>>(
        d.T, d.D, d.k, routing.pos.as<int64_t>(), dxr.as<float>(), dx);
    check_launch("moe (cuda): dx gather");
  }
}

}  // namespace

// ---- public launchers ---------------------------------------------------------------------------

void router_topk_fwd(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize, DType dtype,
                     const void* logits, const float* bias, float* weights, int64_t* indices, float* probs,
                     int64_t* counts) {
  check_dtype(dtype);
  TITAN_CHECK(E >= 1 && E <= 32 * kPerLane && k >= 1 && k <= E, "router_topk (cuda): E=", E, ", k=", k,
              " (needs 1 <= k <= E <= ", 32 * kPerLane, ")");
  if (T == 0) {
    if (counts) moe_count_experts(ctx, 0, E, indices, counts);
    return;
  }
  const unsigned grid = unsigned((T + 7) / 8);
  if (dtype == DType::F32)
    router_fwd_kernel<float><<<grid, 256, 0, stream_of(ctx)>>>(
        T, int(E), int(k), renormalize, static_cast<const float*>(logits), bias, weights, indices, probs);
  else
    router_fwd_kernel<bf16_t><<<grid, 256, 0, stream_of(ctx)>>>(
        T, int(E), int(k), renormalize, static_cast<const bf16_t*>(logits), bias, weights, indices, probs);
  check_launch("moe (cuda): router forward");
  if (counts) moe_count_experts(ctx, T * k, E, indices, counts);
}

void router_topk_bwd(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize,
                     const float* probs, const int64_t* indices, const float* dweights, const float* dprobs,
                     float* dlogits) {
  TITAN_CHECK(E >= 1 && E <= 32 * kPerLane && k >= 1 && k <= E, "router_topk (cuda): E=", E, ", k=", k);
  if (T == 0) return;
  router_bwd_kernel<<<unsigned((T + 7) / 8), 256, 0, stream_of(ctx)>>>(T, int(E), int(k), renormalize, probs,
                                                                       indices, dweights, dprobs, dlogits);
  check_launch("moe (cuda): router backward");
}

void moe_count_experts(const KernelContext& ctx, int64_t n, int64_t E, const int64_t* indices,
                       int64_t* counts) {
  cudaStream_t stream = stream_of(ctx);
  TITAN_CHECK(cudaMemsetAsync(counts, 0, sizeof(int64_t) * size_t(E), stream) == cudaSuccess,
              "moe (cuda): clearing counts failed");
  if (n == 0) return;
  count_kernel<<<grid_for(n), 256, 0, stream>>>(n, E, indices, false,
                                                reinterpret_cast<unsigned long long*>(counts));
  check_launch("moe (cuda): expert counts");
}

void moe_aux_accumulate(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, const float* probs,
                        const int64_t* indices, int64_t* counts, double* psum) {
  if (T == 0) return;
  const int64_t n_chunks = (T + kAuxRowsPerChunk - 1) / kAuxRowsPerChunk;
  Scratch chunks(ctx, sizeof(double) * size_t(n_chunks * E));
  aux_column_chunks_kernel<<<unsigned(n_chunks), E < 256 ? unsigned((E + 31) / 32 * 32) : 256u, 0,
                             stream_of(ctx)>>>(T, E, probs, chunks.as<double>());
  aux_column_total_kernel<<<grid_for(E), 256, 0, stream_of(ctx)>>>(n_chunks, E, chunks.as<double>(), psum);
  count_kernel<<<grid_for(T * k), 256, 0, stream_of(ctx)>>>(T * k, E, indices, false,
                                                            reinterpret_cast<unsigned long long*>(counts));
  check_launch("moe (cuda): aux loss statistics");
}

void moe_aux_finish(const KernelContext& ctx, int64_t E, double scale, const int64_t* counts,
                    const double* psum, float* loss) {
  aux_finish_kernel<<<1, 32, 0, stream_of(ctx)>>>(E, scale, counts, psum, loss);
  check_launch("moe (cuda): aux loss");
}

void moe_aux_bwd(const KernelContext& ctx, int64_t T, int64_t E, double scale, const int64_t* counts,
                 const float* dloss, float* dprobs) {
  if (T == 0) return;
  aux_bwd_kernel<<<grid_for(T * E), 256, 0, stream_of(ctx)>>>(T, E, scale, counts, dloss, dprobs);
  check_launch("moe (cuda): aux loss backward");
}

void moe_routing_order_cuda(const KernelContext& ctx, const MoeExpertDims& d, const int64_t* indices,
                            int64_t* order, int64_t* pos, int64_t* offsets) {
  check_expert_dims(d);
  Scratch tiles(ctx, sizeof(int) * size_t(2 * (d.E + 1)));
  build_routing(ctx, d, indices, order, pos, offsets, tiles.as<int>(), nullptr);
}

void moe_experts_fwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* x,
                     const float* weights, const int64_t* indices, const void* w_gate, const void* w_up,
                     const void* w_down, void* act, void* y, MoeGemm algo) {
  check_dtype(dtype);
  check_expert_dims(d);
  if (dtype == DType::F32)
    return experts_fwd<float>(ctx, d, algo, static_cast<const float*>(x), weights, indices,
                              static_cast<const float*>(w_gate), static_cast<const float*>(w_up),
                              static_cast<const float*>(w_down), static_cast<float*>(act),
                              static_cast<float*>(y));
  experts_fwd<bf16_t>(ctx, d, algo, static_cast<const bf16_t*>(x), weights, indices,
                      static_cast<const bf16_t*>(w_gate), static_cast<const bf16_t*>(w_up),
                      static_cast<const bf16_t*>(w_down), static_cast<bf16_t*>(act), static_cast<bf16_t*>(y));
}

void moe_experts_bwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* x,
                     const float* weights, const int64_t* indices, const void* w_gate, const void* w_up,
                     const void* w_down, const void* act, const float* dy, float* dx, float* dweights,
                     float* dw_gate, float* dw_up, float* dw_down, MoeGemm algo, bool add_dweights) {
  check_dtype(dtype);
  check_expert_dims(d);
  if (dtype == DType::F32)
    return experts_bwd<float>(ctx, d, algo, static_cast<const float*>(x), weights, indices,
                              static_cast<const float*>(w_gate), static_cast<const float*>(w_up),
                              static_cast<const float*>(w_down), static_cast<const float*>(act), dy, dx,
                              dweights, dw_gate, dw_up, dw_down, add_dweights);
  experts_bwd<bf16_t>(ctx, d, algo, static_cast<const bf16_t*>(x), weights, indices,
                      static_cast<const bf16_t*>(w_gate), static_cast<const bf16_t*>(w_up),
                      static_cast<const bf16_t*>(w_down), static_cast<const bf16_t*>(act), dy, dx, dweights,
                      dw_gate, dw_up, dw_down, add_dweights);
}

// moe_combine (expert parallelism): the experts' weighted sum over rows computed elsewhere, with
// the forward's own combine kernel (the same rounding points), and for the backward its scaled dy
// (the rows' gradient, in routing order) and routing-weight gradient kernels.
template <class T>
void combine_fwd(const KernelContext& ctx, const MoeExpertDims& d, const T* rows, const float* weights,
                 const int64_t* indices, T* y) {
  if (d.T == 0) return;
  Routing routing(ctx, d);
  build_routing(ctx, d, indices, routing.order.as<int64_t>(), routing.pos.as<int64_t>(),
                routing.offsets.as<int64_t>(), routing.tiles.as<int>(), nullptr);  // no GEMM: no tokens
  combine_kernel<T><<<row_grid(d.T, d.D), kRowThreads, 0, stream_of(ctx)>>>(
      d.T, d.D, int(d.k), weights, routing.pos.as<int64_t>(), rows, y);
  check_launch("moe_combine (cuda): combine");
}

template <class T>
void combine_bwd(const KernelContext& ctx, const MoeExpertDims& d, const T* rows, const float* weights,
                 const int64_t* indices, const float* dy, float* drows, float* dweights) {
  const int64_t n = d.T * d.k;
  if (d.T == 0 || (!drows && !dweights)) return;
  cudaStream_t stream = stream_of(ctx);
  Routing routing(ctx, d);
  build_routing(ctx, d, indices, routing.order.as<int64_t>(), routing.pos.as<int64_t>(),
                routing.offsets.as<int64_t>(), routing.tiles.as<int>(), nullptr);  // no GEMM: no tokens
  const int64_t* order = routing.order.as<int64_t>();
  if (drows) {
    scaled_dy_kernel<T, float, float>
        <<<row_grid(n, d.D), kRowThreads, 0, stream>>>(n, d.D, d.k, order, weights, dy, drows);
    check_launch("moe_combine (cuda): rows' gradient");
  }
  if (dweights) {
    combine_dweights_kernel<T><<<grid_for(n * 32), 256, 0, stream>>>(n, d.D, d.k, order, dy, rows, dweights);
    check_launch("moe_combine (cuda): routing weights' gradient");
  }
}

void moe_combine_fwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* rows,
                     const float* weights, const int64_t* indices, void* y) {
  check_dtype(dtype);
  check_expert_dims({d.T, d.D, 1, d.E, d.k});  // F unused
  if (dtype == DType::F32)
    return combine_fwd<float>(ctx, d, static_cast<const float*>(rows), weights, indices,
                              static_cast<float*>(y));
  combine_fwd<bf16_t>(ctx, d, static_cast<const bf16_t*>(rows), weights, indices, static_cast<bf16_t*>(y));
}

void moe_combine_bwd(const KernelContext& ctx, const MoeExpertDims& d, DType dtype, const void* rows,
                     const float* weights, const int64_t* indices, const float* dy, float* drows,
                     float* dweights) {
  check_dtype(dtype);
  check_expert_dims({d.T, d.D, 1, d.E, d.k});
  if (dtype == DType::F32)
    return combine_bwd<float>(ctx, d, static_cast<const float*>(rows), weights, indices, dy, drows, dweights);
  combine_bwd<bf16_t>(ctx, d, static_cast<const bf16_t*>(rows), weights, indices, dy, drows, dweights);
}

// =============================================================================================
// Registration with the MoE ops (ops/moe/moe.h).
namespace {

// The expert-bias update: the block's threads sum each expert's load over the micro-batch rows
// into shared memory (i64: exact in any order), then one thread runs the f64 passes in expert
// order, bit for bit the CPU reference's (f64 means, IEEE division, one f32 add per expert), with
// no host round trip. (coeff x sign is exact, so a contraction of delta - mean into an FMA rounds
// alike.)
__device__ double expert_delta(double mean, int64_t load, double coeff) {
  const double d = mean - double(load);
  return coeff * double((d > 0) - (d < 0));
}
__global__ void expert_bias_kernel(int64_t M, int64_t E, const int64_t* counts, double coeff, float* bias) {
  extern __shared__ int64_t load[];  // [E]
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t sum = 0;
    for (int64_t m = 0; m < M; ++m) sum += counts[m * E + e];
    load[e] = sum;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double mean = 0;
  for (int64_t e = 0; e < E; ++e) mean += double(load[e]) / double(E);
  double delta_mean = 0;
  for (int64_t e = 0; e < E; ++e) delta_mean += expert_delta(mean, load[e], coeff) / double(E);
  for (int64_t e = 0; e < E; ++e) bias[e] = __fadd_rn(bias[e], float(expert_delta(mean, load[e], coeff) - delta_mean));
}
void expert_bias_entry(const KernelContext& ctx, int64_t M, int64_t E, const int64_t* counts, double coeff,
                       float* bias) {
  if (E == 0) return;
  const size_t shared = size_t(E) * sizeof(int64_t);
  TITAN_CHECK(shared <= 48 * 1024, "moe (cuda): expert bias update of ", E, " experts: at most 6144");
  expert_bias_kernel<<<1, 256, shared, stream_of(ctx)>>>(M, E, counts, coeff, bias);
  check_launch("moe (cuda): expert bias update");
}

template <DType kDType>
void router_forward_entry(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize,
                          const void* logits, const float* bias, void* weights, int64_t* indices, void* probs,
                          int64_t* counts) {
  router_topk_fwd(ctx, T, E, k, renormalize, kDType, logits, bias, static_cast<float*>(weights), indices,
                  static_cast<float*>(probs), counts);
}
void router_backward_entry(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, bool renormalize,
                           const void* probs, const int64_t* indices, const void* dweights,
                           const void* dprobs, void* dlogits) {
  router_topk_bwd(ctx, T, E, k, renormalize, static_cast<const float*>(probs), indices,
                  static_cast<const float*>(dweights), static_cast<const float*>(dprobs),
                  static_cast<float*>(dlogits));
}

// Adds to counts (unlike moe_count_experts, which clears them first).
void moe_add_expert_counts(const KernelContext& ctx, int64_t n, int64_t E, const int64_t* indices,
                           int64_t* counts) {
  if (n == 0) return;
  count_kernel<<<grid_for(n), 256, 0, stream_of(ctx)>>>(n, E, indices, false,
                                                        reinterpret_cast<unsigned long long*>(counts));
  check_launch("moe (cuda): expert counts");
}

void aux_accumulate_entry(const KernelContext& ctx, int64_t T, int64_t E, int64_t k, const void* probs,
                          const int64_t* indices, int64_t* counts, double* psum) {
  moe_aux_accumulate(ctx, T, E, k, static_cast<const float*>(probs), indices, counts, psum);
}
void aux_finish_entry(const KernelContext& ctx, int64_t E, double scale, const int64_t* counts,
                      const double* psum, void* loss) {
  moe_aux_finish(ctx, E, scale, counts, psum, static_cast<float*>(loss));
}
void aux_backward_entry(const KernelContext& ctx, int64_t T, int64_t E, double scale, const int64_t* counts,
                        const void* dloss, void* dprobs) {
  moe_aux_bwd(ctx, T, E, scale, counts, static_cast<const float*>(dloss), static_cast<float*>(dprobs));
}

MoeExpertDims expert_dims(const ops::MoeDims& d) {
  return {d.T, d.D, d.F, d.E, d.k};
}
template <DType kDType, MoeGemm kAlgo = MoeGemm::kWmma>
void experts_forward_entry(const KernelContext& ctx, const ops::MoeDims& d, const void* x,
                           const void* weights, const int64_t* indices, const void* w_gate, const void* w_up,
                           const void* w_down, void* act, void* y) {
  moe_experts_fwd(ctx, expert_dims(d), kDType, x, static_cast<const float*>(weights), indices, w_gate, w_up,
                  w_down, act, y, kAlgo);
}
template <DType kDType, MoeGemm kAlgo = MoeGemm::kWmma>
void experts_backward_entry(const KernelContext& ctx, const ops::MoeDims& d, const void* x,
                            const void* weights, const int64_t* indices, const void* w_gate, const void* w_up,
                            const void* w_down, const void* act, const void* dy, void* dx, void* dweights,
                            void* dw_gate, void* dw_up, void* dw_down, bool add_dweights) {
  moe_experts_bwd(ctx, expert_dims(d), kDType, x, static_cast<const float*>(weights), indices, w_gate, w_up,
                  w_down, act, static_cast<const float*>(dy), static_cast<float*>(dx),
                  static_cast<float*>(dweights), static_cast<float*>(dw_gate), static_cast<float*>(dw_up),
                  static_cast<float*>(dw_down), kAlgo, add_dweights);
}

template <DType kDType>
void combine_forward_entry(const KernelContext& ctx, const ops::MoeDims& d, const void* rows,
                           const void* weights, const int64_t* indices, void* y) {
  moe_combine_fwd(ctx, expert_dims(d), kDType, rows, static_cast<const float*>(weights), indices, y);
}
template <DType kDType>
void combine_backward_entry(const KernelContext& ctx, const ops::MoeDims& d, const void* rows,
                            const void* weights, const int64_t* indices, const void* dy, void* drows,
                            void* dweights) {
  moe_combine_bwd(ctx, expert_dims(d), kDType, rows, static_cast<const float*>(weights), indices,
                  static_cast<const float*>(dy), static_cast<float*>(drows), static_cast<float*>(dweights));
}

const bool router_topk_kernels_registered = cuda::register_float_kernels(
    "router_topk", "warp per token: f32 softmax in registers, k warp argmax passes, device expert counts",
    "warp per token: bf16 logits widened, f32 softmax, k warp argmax passes, device expert counts",
    TITAN_FLOAT_KERNEL(ops::RouterKernel, router_forward_entry<kDType>, router_backward_entry));
const bool moe_aux_loss_kernels_registered = kernels::register_kernels(
    "moe_aux_loss", Device::CUDA,
    {{DType::F32, "default",
      "device counts and f64 column sums over layers; loss and gradient read no host data",
      ops::MoeAuxLossKernel{aux_accumulate_entry, aux_finish_entry, aux_backward_entry}}},
    kernel_available);
const bool expert_counts_kernels_registered =
    kernels::register_kernels("expert_counts", Device::CUDA,
                              {{DType::I64, "default", "device histogram (atomic adds), no host read",
                                ops::ExpertCountKernel{moe_add_expert_counts}}},
                              kernel_available);
const bool update_expert_bias_kernels_registered = kernels::register_kernels(
    "update_expert_bias", Device::CUDA,
    {{DType::F32, "default", "one thread in expert order (bit-identical to the CPU), no host read",
      ops::ExpertBiasKernel{expert_bias_entry}}},
    kernel_available);
const bool moe_experts_kernels_registered = cuda::register_float_kernels(
    "moe_experts", "device routing order, grouped f32-FMA GEMMs with device-side expert offsets",
    "device routing order, grouped WMMA tensor-core GEMMs with device-side expert offsets, the CPU "
    "kernel's rounding points",
    TITAN_FLOAT_KERNEL(ops::MoeExpertsKernel, experts_forward_entry<kDType>, experts_backward_entry<kDType>));
const bool moe_combine_kernels_registered = cuda::register_float_kernels(
    "moe_combine",
    "device routing order, thread per element in ascending expert order; warp dot products backward",
    "device routing order, thread per element in ascending expert order with reference rounding points; warp "
    "dot products backward",
    TITAN_FLOAT_KERNEL(ops::MoeCombineKernel, combine_forward_entry<kDType>, combine_backward_entry<kDType>));
// Becomes the bf16 default once cuda_moe_test passes it on a GPU and the benchmark shows it faster.
// cuDNN's MoE grouped matmul for the forward's row GEMMs and the backward's dx (cuDNN 9.18 or later),
// mma_sync for the backward's dh and the weight gradients.
const bool moe_experts_cudnn_registered = kernels::register_kernels(
    "moe_experts", Device::CUDA,
    {{DType::BF16, "cudnn",
      "device routing order, the row GEMMs (forward and dx) on cuDNN's MoE grouped matmul (cuDNN 9.18+; "
      "D, F multiples of 8), dh and the weight gradients on mma_sync, the CPU kernel's rounding points",
      ops::MoeExpertsKernel{experts_forward_entry<DType::BF16, MoeGemm::kCudnn>,
                            experts_backward_entry<DType::BF16, MoeGemm::kCudnn>}}},
    kernel_available);
const bool moe_experts_mma_registered = kernels::register_kernels(
    "moe_experts", Device::CUDA,
    {{DType::BF16, "mma_sync",
      "device routing order, grouped GEMMs on raw mma.sync with a four-stage cp.async pipeline (128 x 128 "
      "tiles; WMMA where rows are not 16-byte aligned), the CPU kernel's rounding points",
      ops::MoeExpertsKernel{experts_forward_entry<DType::BF16, MoeGemm::kMmaSync>,
                            experts_backward_entry<DType::BF16, MoeGemm::kMmaSync>}}},
    kernel_available);
// The same GEMMs on 128 x 256 tiles of 8 warps (one block per SM): fewer operand bytes from L2 per
// product, fewer blocks to hide each other's barriers. Which shape the H200 prefers is for
// cuda_moe_bench and bench/gpu_models.sh's MoE+wide row to say.
const bool moe_experts_mma_wide_registered = kernels::register_kernels(
    "moe_experts", Device::CUDA,
    {{DType::BF16, "mma_sync_wide",
      "as mma_sync on 128 x 256 tiles of 8 warps (one block per SM), the CPU kernel's rounding points",
      ops::MoeExpertsKernel{experts_forward_entry<DType::BF16, MoeGemm::kMmaSyncWide>,
                            experts_backward_entry<DType::BF16, MoeGemm::kMmaSyncWide>}}},
    kernel_available);

}  // namespace

}  // namespace titan::cuda
