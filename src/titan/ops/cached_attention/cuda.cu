// cached_attention on CUDA (f32 and bf16): one block of four warps per query row (batch, query,
// head). Each warp takes every fourth cached key with an online softmax in f32, a lane holding
// head_dim / 32 elements of the query and of its running output; the four warps' partial results
// are then merged through shared memory and the output rounded once. A decode step is a few
// hundred such rows reading the cache once per query head: memory-bound, no tensor cores.
#include <cmath>

#include "titan/backend/cuda/common.cuh"
#include "titan/core/check.h"
#include "titan/ops/cached_attention/cached_attention.h"
#include "titan/ops/cuda_registration.h"

namespace titan::ops {
namespace {

using namespace cuda;  // the CUDA backend's shared helpers (backend/cuda/common.cuh)

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim up to 256

template <class T>
__global__ void __launch_bounds__(kWarps * 32)
    cached_attention_kernel(CachedAttentionShape s, const T* q, const T* k, const T* v,
                            const int64_t* first_key, T* out) {
  const int64_t row = blockIdx.x;  // q's rows in order: ((b * Sq + i) * Hq + h)
  const int64_t h = row % s.Hq, i = (row / s.Hq) % s.Sq, b = row / (s.Hq * s.Sq);
  const int64_t ldk = s.Hkv * s.D, last = s.length - s.Sq + i;  // the query's own position
  // The first key after the row's padding (batched generation's left-padded prompts).
  const int64_t first = first_key ? max(first_key[b], int64_t(0)) : 0;
  const T* kb = k + b * s.capacity * ldk + (h / (s.Hq / s.Hkv)) * s.D;
  const T* vb = v + b * s.capacity * ldk + (h / (s.Hq / s.Hkv)) * s.D;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    qv[e] = d < s.D ? load_f32(q + row * s.D, d) : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j = first + warp; j <= last; j += kWarps) {
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < s.D) dot += qv[e] * load_f32(kb + j * ldk, d);
    }
    const float score = warp_sum(dot) * s.scale;
    const float m_new = fmaxf(m, score);
    const float rescale = expf(m - m_new), p = expf(score - m_new);  // expf(-inf) = 0 at the first key
    l = l * rescale + p;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < s.D) acc[e] = acc[e] * rescale + p * load_f32(vb + j * ldk, d);
    }
    m = m_new;
  }

  // Merge the warps: a warp that saw no key (a short cache) has m = -inf and l = 0, weight 0.
  __shared__ float warp_m[kWarps], warp_l[kWarps], warp_acc[kWarps][kMaxPerLane * 32];
  if (lane == 0) warp_m[warp] = m, warp_l[warp] = l;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) warp_acc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  if (warp != 0) return;
  float top = -INFINITY;
  for (int w = 0; w < kWarps; ++w) top = fmaxf(top, warp_m[w]);  // finite unless no key was read
  if (first > last) {  // no key to attend to: a zero output, as the reference's
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e)
      if (lane + 32 * e < s.D) store_f32(out + row * s.D, lane + 32 * e, 0.f);
    return;
  }
  float weight[kWarps], total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += warp_l[w] * (weight[w] = expf(warp_m[w] - top));
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d >= s.D) continue;
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += warp_acc[w][d] * weight[w];
    store_f32(out + row * s.D, d, o / total);
  }
}

template <class T>
void forward(const KernelContext& ctx, const CachedAttentionShape& s, const void* q, const void* k,
             const void* v, const int64_t* first_key, void* out) {
  check_cached_attention_shape(s, "cached_attention");
  TITAN_CHECK(s.D <= 32 * kMaxPerLane, "cached_attention on cuda: head_dim ", s.D, " is above the kernel's ",
              32 * kMaxPerLane);
  const int64_t rows = s.B * s.Sq * s.Hq;
  TITAN_CHECK(rows <= int64_t(INT32_MAX), "cached_attention on cuda: ", rows,
              " query rows pass the grid's limit");
  cached_attention_kernel<T><<<unsigned(rows), kWarps * 32, 0, stream_of(ctx)>>>(
      s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), first_key,
      static_cast<T*>(out));
  check_launch("cached_attention_kernel");
}

const bool registered =
    cuda::register_float_kernels("cached_attention", "CUDA: four warps per query row, online softmax, f32",
                                 "CUDA: four warps per query row, online softmax in f32, output rounded once",
                                 TITAN_FLOAT_KERNEL(CachedAttentionKernel, forward<T>));

}  // namespace
}  // namespace titan::ops
