// The reference kernels of cached_attention: the textbook formulas, one query row of scores at a
// time, the ground truth every other variant is tested against.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "titan/kernels/registry.h"
#include "titan/ops/cached_attention/cached_attention.h"

namespace titan::ops {
namespace {

// T: the element type, A: the accumulator (f64 for f64, else f32); the output is rounded to T once.
template <class T, class A>
void forward_ref(const KernelContext&, const CachedAttentionShape& s, const void* qv, const void* kv,
                 const void* vv, const int64_t* first_key, void* outv) {
  check_cached_attention_shape(s, "cached_attention_reference");
  const T *q = static_cast<const T*>(qv), *k = static_cast<const T*>(kv), *v = static_cast<const T*>(vv);
  T* out = static_cast<T*>(outv);
  const int64_t D = s.D, r = s.Hq / s.Hkv, ldq = s.Hq * D, ldk = s.Hkv * D;
  std::vector<A> p(static_cast<size_t>(s.length)), o(static_cast<size_t>(D));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.Sq; ++i)
      for (int64_t h = 0; h < s.Hq; ++h) {
        const T* qi = q + (b * s.Sq + i) * ldq + h * D;
        const T* kb = k + b * s.capacity * ldk + (h / r) * D;
        const T* vb = v + b * s.capacity * ldk + (h / r) * D;
        const int64_t last = s.length - s.Sq + i;  // the query's own position
        const int64_t first = first_key ? std::max<int64_t>(first_key[b], 0) : 0;  // after the padding
        T* oi = out + (b * s.Sq + i) * ldq + h * D;
        if (first > last) {  // no key to attend to
          for (int64_t d = 0; d < D; ++d) oi[d] = T(0);
          continue;
        }
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t j = first; j <= last; ++j) {
          A dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += A(qi[d]) * A(kb[j * ldk + d]);
          p[size_t(j)] = dot * A(s.scale);
          m = std::max(m, p[size_t(j)]);
        }
        A l = 0;
        for (int64_t j = first; j <= last; ++j) l += p[size_t(j)] = std::exp(p[size_t(j)] - m);
        std::fill(o.begin(), o.end(), A(0));
        for (int64_t j = first; j <= last; ++j)
          for (int64_t d = 0; d < D; ++d) o[size_t(d)] += p[size_t(j)] / l * A(vb[j * ldk + d]);
        for (int64_t d = 0; d < D; ++d) oi[d] = T(o[size_t(d)]);
      }
}

const bool registered = kernels::register_reference_kernels(
    "cached_attention", "one row of scores at a time", "f32 math, output rounded once",
    TITAN_REFERENCE_KERNEL(CachedAttentionKernel, forward_ref<T, Acc>));

}  // namespace
}  // namespace titan::ops
