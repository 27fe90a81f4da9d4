// cached_attention on the CPU: one thread per query row (batch, query, head) of scores, each dot
// product and weighted sum of values a vector loop compiled per ISA (backend/cpu/lanes.h). A decode
// step reads every cached key and value once per query head: memory-bound, so no tiling.
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

// T: float, or uint16_t for bf16 bits; f32 math, the output rounded once.
template <class T>
void forward(const KernelContext&, const CachedAttentionShape& s, const void* qv, const void* kv,
             const void* vv, void* outv) {
  check_cached_attention_shape(s, "cached_attention");
  const T *q = static_cast<const T*>(qv), *k = static_cast<const T*>(kv), *v = static_cast<const T*>(vv);
  T* out = static_cast<T*>(outv);
  const int64_t D = s.D, r = s.Hq / s.Hkv, ldk = s.Hkv * D, rows = s.B * s.Sq * s.Hq;
  // Below this many multiply-adds a parallel region costs more than it saves.
  const bool threads = rows * s.length * D > (int64_t(1) << 16);
#pragma omp parallel if (threads)
  {
    std::vector<float> p(static_cast<size_t>(s.length)), qf(static_cast<size_t>(D)),
        acc(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {  // q's rows in order: ((b * Sq + i) * Hq + h)
      const int64_t h = row % s.Hq, i = (row / s.Hq) % s.Sq, b = row / (s.Hq * s.Sq);
      const T* kb = k + b * s.capacity * ldk + (h / r) * D;
      const T* vb = v + b * s.capacity * ldk + (h / r) * D;
      const int64_t last = s.length - s.Sq + i;  // the query's own position
      for (int64_t d = 0; d < D; ++d) qf[size_t(d)] = ld(q[row * D + d]);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= last; ++j)
        m = std::max(m, p[size_t(j)] = dot(qf.data(), kb + j * ldk, D) * s.scale);
      float l = 0;
      for (int64_t j = 0; j <= last; ++j) l += p[size_t(j)] = std::exp(p[size_t(j)] - m);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j <= last; ++j) axpy(acc.data(), p[size_t(j)], vb + j * ldk, D);
      for (int64_t d = 0; d < D; ++d) st(out + row * D + d, acc[size_t(d)] / l);
    }
  }
}

const bool registered = kernels::register_kernels(
    "cached_attention", Device::CPU,
    {{DType::F32, "default", "thread per query row, SIMD dot products and value sums, f32",
      CachedAttentionKernel{forward<float>}},
     {DType::BF16, "default",
      "thread per query row, SIMD dot products and value sums, f32 math, rounded once",
      CachedAttentionKernel{forward<uint16_t>}}});

}  // namespace
}  // namespace titan::ops
