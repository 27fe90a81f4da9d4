// normal_init's fast CPU variant: the reference's draw (normal_draw.h) eight normal pairs at a
// time in AVX-512 double lanes, with the same operations lane by lane (64-bit integer hashing,
// IEEE double adds, multiplies, divisions and square roots, never fused), so its values are the
// reference's bits. The polar method's rejection runs as attempts over all unfinished lanes (hashing
// only): a lane keeps the first attempt whose point lies inside the unit disc, the reference's
// choice, and the logarithm, division and square root then run once on the chosen points.
// A pair with a value outside a truncation bound (rare: 0.27 % of values at 3 std) is drawn again
// by the scalar code, which owns the redraw rule. Without AVX-512 (cpu_info.h: kernel_isa) the
// variant is the reference loop.
#include "titan/ops/init/cpu.h"

#include <immintrin.h>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/kernels/registry.h"
#include "titan/ops/init/init.h"
#include "titan/ops/init/normal_draw.h"

namespace titan::ops {
namespace {

using init_draw::draw_elements;
using init_draw::draw_pair;

// GCC 12's AVX-512 headers build results from _mm512_undefined_*() (`__m512 __Y = __Y;`), which
// trips -Wuninitialized at every inlined intrinsic; the value is never read.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define TITAN_AVX512 __attribute__((target("avx512f,avx512dq")))

TITAN_AVX512 inline __m512i mix64(__m512i z) {
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64(0xbf58476d1ce4e5b9ll));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64(0x94d049bb133111ebll));
  return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

// init_draw::signed_unit(init_draw::stream_bits(stream, counter)) per lane.
TITAN_AVX512 inline __m512d signed_unit(__m512i stream, __m512i counter) {
  const __m512i bits =
      mix64(_mm512_add_epi64(stream, _mm512_mullo_epi64(counter, _mm512_set1_epi64(0x9e3779b97f4a7c15ll))));
  return _mm512_mul_pd(_mm512_cvtepi64_pd(_mm512_srai_epi64(bits, 10)), _mm512_set1_pd(0x1.0p-53));
}

TITAN_AVX512 inline __m512d splat(double v) {
  return _mm512_set1_pd(v);
}

// init_draw::log_exact_arith per lane, for normal (not subnormal) positive x: the caller's s is at
// least 2^-106.
TITAN_AVX512 inline __m512d log_lanes(__m512d x) {
  const __m512i bits = _mm512_castpd_si512(x);
  const __m512i hi = _mm512_and_si512(_mm512_srli_epi64(bits, 32), _mm512_set1_epi64(0x000fffff));
  const __m512i up = _mm512_and_si512(_mm512_add_epi64(hi, _mm512_set1_epi64(0x95f64)), _mm512_set1_epi64(0x100000));
  const __m512i k = _mm512_add_epi64(_mm512_sub_epi64(_mm512_srli_epi64(bits, 52), _mm512_set1_epi64(1023)),
                                     _mm512_srli_epi64(up, 20));
  const __m512i m_hi = _mm512_or_si512(hi, _mm512_xor_si512(up, _mm512_set1_epi64(0x3ff00000)));
  const __m512d m = _mm512_castsi512_pd(
      _mm512_or_si512(_mm512_slli_epi64(m_hi, 32), _mm512_and_si512(bits, _mm512_set1_epi64(0xffffffffll))));
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d f = _mm512_sub_pd(m, one);
  const __m512d s = _mm512_div_pd(f, _mm512_add_pd(_mm512_set1_pd(2.0), f));
  const __m512d dk = _mm512_cvtepi64_pd(k);
  const __m512d z = _mm512_mul_pd(s, s), w = _mm512_mul_pd(z, z);
  const __m512d t1 = _mm512_mul_pd(
      w, _mm512_add_pd(splat(3.999999999940941908e-01),
                       _mm512_mul_pd(w, _mm512_add_pd(splat(2.222219843214978396e-01),
                                                      _mm512_mul_pd(w, splat(1.531383769920937332e-01))))));
  const __m512d t2 = _mm512_mul_pd(
      z,
      _mm512_add_pd(
          splat(6.666666666666735130e-01),
          _mm512_mul_pd(
              w, _mm512_add_pd(
                     splat(2.857142874366239149e-01),
                     _mm512_mul_pd(w, _mm512_add_pd(splat(1.818357216161805012e-01),
                                                    _mm512_mul_pd(w, splat(1.479819860511658591e-01))))))));
  const __m512d r = _mm512_add_pd(t2, t1);
  const __m512d k_lo = _mm512_mul_pd(dk, splat(1.90821492927058770002e-10));
  // The reference's branch, hi in [0x6147a, 0x6b851]: f - (f^2/2 - s (f^2/2 + R)).
  const __mmask8 near_sqrt2 = _mm512_cmpge_epi64_mask(hi, _mm512_set1_epi64(0x6147a)) &
                              _mm512_cmple_epi64_mask(hi, _mm512_set1_epi64(0x6b851));
  const __m512d hfsq = _mm512_mul_pd(_mm512_mul_pd(splat(0.5), f), f);
  const __m512d rest_near =
      _mm512_sub_pd(_mm512_add_pd(_mm512_mul_pd(s, _mm512_add_pd(hfsq, r)), k_lo), hfsq);
  const __m512d rest_far = _mm512_sub_pd(k_lo, _mm512_mul_pd(s, _mm512_sub_pd(f, r)));
  const __m512d rest = _mm512_mask_blend_pd(near_sqrt2, rest_far, rest_near);
  return _mm512_add_pd(_mm512_mul_pd(dk, splat(6.93147180369123816490e-01)), _mm512_add_pd(rest, f));
}

// Normal pairs first_pair .. first_pair + 7 (init_draw::normal_pair from attempt 0), components 0 in
// a and 1 in b.
TITAN_AVX512 void normal_8_pairs(uint64_t stream, uint64_t first_pair, __m512d& a, __m512d& b) {
  const __m512i streams = _mm512_set1_epi64(int64_t(stream));
  const __m512i pairs =
      _mm512_add_epi64(_mm512_set1_epi64(int64_t(first_pair)), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
  // The chosen points: each lane's first attempt inside the unit disc. Lanes that never get one
  // keep x = y = 0 (their normals are 0, as the reference's) and s = 1/2, so the log sees only
  // normal numbers.
  __m512d cx = _mm512_setzero_pd(), cy = _mm512_setzero_pd(), cs = _mm512_set1_pd(0.5);
  __mmask8 done = 0;
  for (int64_t attempt = 0; attempt < 256 && done != 0xff; ++attempt) {
    // counter = (pair << 8 | attempt) * 2, then its successor.
    const __m512i counter =
        _mm512_slli_epi64(_mm512_or_si512(_mm512_slli_epi64(pairs, 8), _mm512_set1_epi64(attempt)), 1);
    const __m512d x = signed_unit(streams, counter);
    const __m512d y = signed_unit(streams, _mm512_add_epi64(counter, _mm512_set1_epi64(1)));
    const __m512d s = _mm512_add_pd(_mm512_mul_pd(x, x), _mm512_mul_pd(y, y));
    const __mmask8 inside = __mmask8(~done) & _mm512_cmp_pd_mask(s, _mm512_set1_pd(1.0), _CMP_LT_OQ) &
                            _mm512_cmp_pd_mask(s, _mm512_setzero_pd(), _CMP_GT_OQ);
    cx = _mm512_mask_blend_pd(inside, cx, x);
    cy = _mm512_mask_blend_pd(inside, cy, y);
    cs = _mm512_mask_blend_pd(inside, cs, s);
    done |= inside;
  }
  // The logarithm, division and square root once per lane, on its chosen point.
  const __m512d f = _mm512_sqrt_pd(_mm512_div_pd(_mm512_mul_pd(_mm512_set1_pd(-2.0), log_lanes(cs)), cs));
  a = _mm512_mul_pd(cx, f), b = _mm512_mul_pd(cy, f);
}

// The same scaled by std, as f32.
TITAN_AVX512 void draw_8_pairs(uint64_t stream, double std, uint64_t first_pair, float z0[8], float z1[8]) {
  __m512d a, b;
  normal_8_pairs(stream, first_pair, a, b);
  const __m512d sv = _mm512_set1_pd(std);
  _mm256_storeu_ps(z0, _mm512_cvtpd_ps(_mm512_mul_pd(a, sv)));
  _mm256_storeu_ps(z1, _mm512_cvtpd_ps(_mm512_mul_pd(b, sv)));
}

TITAN_AVX512 void normal_pairs_avx512(uint64_t stream, uint64_t first_pair, int64_t count, double* z) {
  for (int64_t i = 0; i < count; i += 8) {
    __m512d a, b;
    normal_8_pairs(stream, first_pair + uint64_t(i), a, b);
    double za[8], zb[8];
    _mm512_storeu_pd(za, a);
    _mm512_storeu_pd(zb, b);
    for (int64_t l = 0; l < 8 && i + l < count; ++l) z[2 * (i + l)] = za[l], z[2 * (i + l) + 1] = zb[l];
  }
}

// Elements [b, e) into out[0, e - b): whole pairs eight at a time, the edges one pair at a time.
TITAN_AVX512 void draw_avx512(uint64_t stream, double std, double bound, int64_t b, int64_t e, float* out) {
  int64_t j = b;
  if (j % 2 != 0) draw_elements(stream, std, bound, j, j + 1, out), ++j;
  for (; j + 16 <= e; j += 16) {
    float z0[8], z1[8];
    draw_8_pairs(stream, std, uint64_t(j / 2), z0, z1);
    float* o = out + (j - b);
    for (int l = 0; l < 8; ++l) {
      if (init_draw::outside_bound(z0[l], bound) || init_draw::outside_bound(z1[l], bound)) {
        draw_pair(stream, std, bound, uint64_t(j / 2 + l), o + 2 * l);  // the redraw rule's owner
      } else {
        o[2 * l] = z0[l], o[2 * l + 1] = z1[l];
      }
    }
  }
  draw_elements(stream, std, bound, j, e, out + (j - b));
}

#pragma GCC diagnostic pop

void normal_init_default(const KernelContext&, uint64_t stream, double std, double bound, int64_t begin, int64_t n,
                         float* out) {
  const bool avx512 = cpu::kernel_isa() >= cpu::KernelIsa::kAvx512;
  for_each_init_chunk(begin, n, [&](int64_t b, int64_t e) {
    if (avx512)
      draw_avx512(stream, std, bound, b, e, out + (b - begin));
    else
      draw_elements(stream, std, bound, b, e, out + (b - begin));
  });
}

}  // namespace

bool normal_pairs_vectorised(uint64_t stream, uint64_t first_pair, int64_t count, double* z) {
  if (cpu::kernel_isa() < cpu::KernelIsa::kAvx512) return false;
  normal_pairs_avx512(stream, first_pair, count, z);
  return true;
}

namespace {

const bool normal_init_kernels_registered = kernels::register_kernels(
    "normal_init", Device::CPU,
    {{DType::F32, "default",
      "AVX-512: 8 normal pairs per vector, the reference's operations lane by lane (bit-identical); "
      "else the reference loop",
      NormalInitKernel{normal_init_default}}});

}  // namespace
}  // namespace titan::ops
