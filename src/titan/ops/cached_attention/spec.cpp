// The test and parity specification of cached_attention (kernels/spec.h): shapes, seeded inputs and
// the tolerance per dtype, in one place; `titan kernels parity` and the op tests read it.
#include "titan/kernels/spec.h"

#include <cmath>
#include <limits>

#include "titan/core/element.h"
#include "titan/ops/cached_attention/cached_attention.h"

namespace titan::ops {
namespace {

using namespace kernels;

// A [B, capacity, Hkv, D] cache whose positions from `length` on hold NaN: a kernel that read past
// the cached positions would put NaN in its output.
Tensor cache_with_nan_tail(const Dims& s, DType dt, uint64_t seed, double lo, double hi) {
  const int64_t B = s[0], length = s[2], Hkv = s[4], D = s[5], capacity = length + 3;
  Tensor cache = spec_uniform({B, capacity, Hkv, D}, dt, seed, lo, hi);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = (b * capacity + length) * Hkv * D; e < (b + 1) * capacity * Hkv * D; ++e)
      store_element(cache.raw_data(), dt, e, std::numeric_limits<double>::quiet_NaN());
  return cache;
}

TITAN_REGISTER_OP_SPEC(
    cached_attention,
    {"cached_attention",
     {"B", "Sq", "length", "Hq", "Hkv", "D"},
     6,
     {{1, 1, 1, 2, 1, 8}, {1, 1, 300, 16, 8, 128}, {2, 5, 37, 4, 2, 64}, {1, 70, 70, 4, 1, 25}},
     [](const Dims& s) -> std::string {
       if (s[1] > s[2]) return "Sq must be <= length";
       return s[3] % s[4] == 0 ? std::string() : "Hq must be a multiple of Hkv";
     },
     [](const Dims& s, DType dt, uint64_t seed, const std::string&) {
       const double scale = 1.0 / std::sqrt(double(s[5]));
       const int64_t length = s[2];
       // Each row's first key (left padding, batched generation) anywhere up to the first query's
       // own position, 0 included.
       return ParityCase{
           {spec_uniform({s[0], s[1], s[3], s[5]}, dt, seed, -2, 2),
            cache_with_nan_tail(s, dt, seed + 1, -2, 2), cache_with_nan_tail(s, dt, seed + 2, -1, 1),
            spec_random_ids(s[0], length - s[1] + 1, seed + 3)},
           {"q", "k_cache", "v_cache", "first_key"},
           [scale, length](const std::vector<Tensor>& in) {
             return std::vector<Tensor>{ops::cached_attention(in[0], in[1], in[2], length, scale, in[3])};
           },
           {"out"}};
     },
     // As attention's f32-math kernels: the summation order differs; in bf16 each side rounds its
     // f32 result once, so two results near a rounding boundary land one bf16 step (2^-7) apart.
     spec_tolerance(Tolerance{2e-5, 2e-5, true}, Tolerance{1e-4, 8e-3, true}),
     "summation order; m = max(1, max\\|reference\\|); bf16 outputs rounded once on each side (one bf16 "
     "step, "
     "2^-7, apart)",
     {{1, 1, 1, 2, 1, 8}, {2, 1, 37, 4, 2, 16}, {1, 3, 19, 4, 4, 25}, {2, 7, 7, 2, 1, 8}}});

}  // namespace
}  // namespace titan::ops
