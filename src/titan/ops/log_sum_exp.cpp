#include "titan/ops/log_sum_exp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "titan/backend/cpu/lanes.h"

namespace titan::ops {
namespace {

TITAN_CLONES float largest(const float* logits, int64_t n) {
  float top = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t i = 0; i < n; ++i) top = logits[i] > top ? logits[i] : top;  // NaN compares false: skipped
  return top;
}

TITAN_CLONES double sum_exp(const float* logits, int64_t n, float top) {
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += 256) {
    const int64_t end = std::min(n, begin + 256);
    float run = 0;
#pragma omp simd reduction(+ : run)
    for (int64_t i = begin; i < end; ++i) {
      const bool number = logits[i] == logits[i];  // not NaN (whose exp_poly would convert NaN to int)
      const float e = cpu::lanes::exp_poly(number ? logits[i] - top : -100.f);
      run += number ? e : 0.f;
    }
    total += double(run);
  }
  return total;
}

}  // namespace

double log_sum_exp_f32(std::span<const float> logits) {
  const int64_t n = int64_t(logits.size());
  const float top = largest(logits.data(), n);
  if (std::isinf(top)) return top;
  return double(top) + std::log(sum_exp(logits.data(), n, top));
}

}  // namespace titan::ops
