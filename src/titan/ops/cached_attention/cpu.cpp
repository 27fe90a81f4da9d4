// cached_attention on the CPU: one thread per (batch, query, kv head), the query heads of the kv
// head's group together, so a decode step reads every cached key and value once; each dot product
// and weighted sum of values a vector loop compiled per ISA (backend/cpu/lanes.h). Memory-bound, so
// no tiling.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "titan/backend/cpu/lanes.h"
#include "titan/kernels/registry.h"
#include "titan/ops/cached_attention/cached_attention.h"

namespace titan::ops {
namespace {

using namespace cpu::lanes;

template <class T>
[[gnu::always_inline]] inline float dot_impl(const float* q, const T* k, int64_t D) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < D; ++d) sum += q[d] * ld(k[d]);
  return sum;
}
template <class T>
[[gnu::always_inline]] inline void axpy_impl(float* acc, float p, const T* v, int64_t D) {
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) acc[d] += p * ld(v[d]);
}
TITAN_CLONES float dot(const float* q, const float* k, int64_t D) {
  return dot_impl(q, k, D);
}
TITAN_CLONES float dot(const float* q, const uint16_t* k, int64_t D) {
  return dot_impl(q, k, D);
}
TITAN_CLONES void axpy(float* acc, float p, const float* v, int64_t D) {
  axpy_impl(acc, p, v, D);
}
TITAN_CLONES void axpy(float* acc, float p, const uint16_t* v, int64_t D) {
  axpy_impl(acc, p, v, D);
}

// T: float, or uint16_t for bf16 bits; f32 math, the output rounded once. One thread per query
// position and kv head: the r query heads that share the kv head go together, so each cached key
// and value is read once for all of them (a decode step is bound by those reads).
template <class T>
void forward(const KernelContext&, const CachedAttentionShape& s, const void* qv, const void* kv,
             const void* vv, const int64_t* first_key, void* outv) {
  check_cached_attention_shape(s, "cached_attention");
  const T *q = static_cast<const T*>(qv), *k = static_cast<const T*>(kv), *v = static_cast<const T*>(vv);
  T* out = static_cast<T*>(outv);
  const int64_t D = s.D, r = s.Hq / s.Hkv, ldk = s.Hkv * D, groups = s.B * s.Sq * s.Hkv;
  // Below this many multiply-adds a parallel region costs more than it saves.
  const bool threads = groups * r * s.length * D > (int64_t(1) << 16);
#pragma omp parallel if (threads)
  {
    // Per query head of the group: its scores over the keys, its query in f32, its output sums.
    std::vector<float> p(static_cast<size_t>(r * s.length)), qf(static_cast<size_t>(r * D)),
        acc(static_cast<size_t>(r * D)), total(static_cast<size_t>(r));
#pragma omp for schedule(static)
    for (int64_t group = 0; group < groups; ++group) {  // ((b * Sq + i) * Hkv + g)
      const int64_t g = group % s.Hkv, i = (group / s.Hkv) % s.Sq, b = group / (s.Hkv * s.Sq);
      const T* kb = k + b * s.capacity * ldk + g * D;
      const T* vb = v + b * s.capacity * ldk + g * D;
      // Keys first .. last: after the row's padding, up to the query's own position.
      const int64_t first = first_key ? std::max<int64_t>(first_key[b], 0) : 0;
      const int64_t last = s.length - s.Sq + i, keys = last + 1 - first;
      const int64_t first_row = (b * s.Sq + i) * s.Hq + g * r;  // q's row of the group's first head
      if (keys <= 0) {                                          // no key to attend to
        for (int64_t e = 0; e < r * D; ++e) st(out + first_row * D + e, 0.f);
        continue;
      }
      kb += first * ldk;
      vb += first * ldk;
      for (int64_t e = 0; e < r * D; ++e) qf[size_t(e)] = ld(q[first_row * D + e]);
      for (int64_t j = 0; j < keys; ++j)
        for (int64_t t = 0; t < r; ++t)
          p[size_t(t * keys + j)] = dot(qf.data() + t * D, kb + j * ldk, D) * s.scale;
      for (int64_t t = 0; t < r; ++t) {
        float* pt = p.data() + t * keys;
        const float m = *std::max_element(pt, pt + keys);
        float l = 0;
        for (int64_t j = 0; j < keys; ++j) l += pt[j] = std::exp(pt[j] - m);
        total[size_t(t)] = l;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < keys; ++j)
        for (int64_t t = 0; t < r; ++t) axpy(acc.data() + t * D, p[size_t(t * keys + j)], vb + j * ldk, D);
      for (int64_t t = 0; t < r; ++t)
        for (int64_t d = 0; d < D; ++d)
          st(out + (first_row + t) * D + d, acc[size_t(t * D + d)] / total[size_t(t)]);
    }
  }
}

const bool registered = kernels::register_kernels(
    "cached_attention", Device::CPU,
    {{DType::F32, "default",
      "thread per query position and kv head (its query heads together), SIMD dots and value sums, f32",
      CachedAttentionKernel{forward<float>}},
     {DType::BF16, "default",
      "thread per query position and kv head (its query heads together), SIMD dots and value sums, "
      "f32 math, rounded once",
      CachedAttentionKernel{forward<uint16_t>}}});

}  // namespace
}  // namespace titan::ops
