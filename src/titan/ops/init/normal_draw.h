#pragma once
// The arithmetic of a parameter's random init, compiled for the host and for CUDA devices from this
// one text so that both draw the same bits: every value is a pure function of (stream, element) made
// of integer operations and IEEE-rounded double additions, multiplications, divisions and square
// roots, with the logarithm computed here rather than by a math library (glibc's and CUDA's differ
// in the last bit of a few results). Products and sums are spelled mul_rn / add_rn so that no
// compiler contracts them into fused multiply-adds on one side only.
//
// The generator: element j of a stream is component j % 2 of normal pair j / 2; a pair is Marsaglia's
// polar method on two uniforms in (-1, 1), each 53 bits of splitmix64 applied to a Weyl sequence
// (SplittableRandom's generator) indexed by (pair, attempt), so any element is drawn without the
// ones before it. A point outside the unit disc (21 %) moves on to the next attempt; a value outside
// the truncation bound is redrawn from its pair's next usable attempt, its partner keeping its own
// draw (the two normals of a pair are independent). 8 bits of attempts are more than any draw needs
// (0.21^256 of them all outside) and would give 0.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TITAN_HOST_DEVICE __host__ __device__
#else
#define TITAN_HOST_DEVICE
#endif

namespace titan::ops::init_draw {

TITAN_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;  // never fused: the files that draw build with -ffp-contract=off (src/titan/CMakeLists.txt)
#endif
}
TITAN_HOST_DEVICE inline double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// splitmix64's finaliser: a bijection of 64-bit words whose outputs pass BigCrush for consecutive
// inputs; here it turns a counter into random bits.
TITAN_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Random bits number `counter` of a stream.
TITAN_HOST_DEVICE inline uint64_t stream_bits(uint64_t stream, uint64_t counter) {
  return mix64(stream + counter * 0x9e3779b97f4a7c15ull);
}

// A uniform in (-1, 1): 53 random bits as a signed fraction (exact in a double).
TITAN_HOST_DEVICE inline double signed_unit(uint64_t bits) {
  return mul_rn(double(int64_t(bits) >> 10), 0x1.0p-53);
}

// ln(x) for a finite x > 0, within one ulp (the 4.3BSD / fdlibm algorithm): x = 2^k m with m in
// [sqrt(2)/2, sqrt(2)), f = m - 1, s = f / (2 + f), ln(1 + f) = 2 atanh(s) = f - s (f - R(s^2)),
// R a degree-7 minimax polynomial with fdlibm's Remez coefficients, and k ln 2 added in two parts
// (k ln2_hi is exact) so that its rounding stays below the result's ulp. For m near sqrt(2) and its
// half, where f - s (f - R) would lose a bit, the same value is formed as f - (f^2/2 - s (f^2/2 + R)).
// fdlibm's shortcut for |f| < 2^-20 is left out (the general formula is as accurate there). Worst
// error 0.864 ulp. Subnormal x is scaled into the normal range first (the polar method's s is never
// below 2^-106); x = 0 is not an argument here (s > 0).
TITAN_HOST_DEVICE inline double log_exact_arith(double x) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kLg1 = 6.666666666666735130e-01, kLg2 = 3.999999999940941908e-01,
                   kLg3 = 2.857142874366239149e-01, kLg4 = 2.222219843214978396e-01,
                   kLg5 = 1.818357216161805012e-01, kLg6 = 1.531383769920937332e-01,
                   kLg7 = 1.479819860511658591e-01;
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  int k = 0;
  if ((bits >> 52) == 0) {  // subnormal: scale by 2^54
    x = mul_rn(x, 0x1.0p54);
    memcpy(&bits, &x, sizeof bits);
    k = -54;
  }
  // The mantissa's top 20 bits; 0x95f64 + hi carries into bit 20 when the mantissa is at or above
  // sqrt(2) (0x6a09e...), which then takes the next exponent and is halved.
  const int32_t hi = int32_t(bits >> 32 & 0x000fffff);
  k += int(bits >> 52) - 1023;
  const uint32_t up = uint32_t(hi + 0x95f64) & 0x100000;
  k += int(up >> 20);
  bits = uint64_t(uint32_t(hi) | (up ^ 0x3ff00000)) << 32 | (bits & 0xffffffffull);
  double m;
  memcpy(&m, &bits, sizeof m);
  const double f = add_rn(m, -1.0);
  const double s = f / add_rn(2.0, f);
  const double dk = double(k);
  const double z = mul_rn(s, s), w = mul_rn(z, z);
  const double t1 = mul_rn(w, add_rn(kLg2, mul_rn(w, add_rn(kLg4, mul_rn(w, kLg6)))));
  const double t2 =
      mul_rn(z, add_rn(kLg1, mul_rn(w, add_rn(kLg3, mul_rn(w, add_rn(kLg5, mul_rn(w, kLg7)))))));
  const double r = add_rn(t2, t1);
  double rest;  // ln(1 + f) - f, plus k ln2_lo
  if (((hi - 0x6147a) | (0x6b851 - hi)) > 0) {
    const double hfsq = mul_rn(mul_rn(0.5, f), f);
    rest = add_rn(-hfsq, add_rn(mul_rn(s, add_rn(hfsq, r)), mul_rn(dk, kLn2Lo)));
  } else {
    rest = add_rn(-mul_rn(s, add_rn(f, -r)), mul_rn(dk, kLn2Lo));
  }
  return add_rn(mul_rn(dk, kLn2Hi), add_rn(rest, f));
}

// Normal pair number `pair` of a stream from its first usable attempt at or after `attempt`
// (advanced to it), into z[0], z[1]; zeros when no attempt is usable.
TITAN_HOST_DEVICE inline void normal_pair(uint64_t stream, uint64_t pair, uint64_t& attempt, double z[2]) {
  for (; attempt < 256; ++attempt) {
    const uint64_t counter = (pair << 8 | attempt) * 2;
    const double x = signed_unit(stream_bits(stream, counter)),
                 y = signed_unit(stream_bits(stream, counter + 1));
    const double s = add_rn(mul_rn(x, x), mul_rn(y, y));
    if (s < 1 && s > 0) {
      const double f = sqrt(mul_rn(-2.0, log_exact_arith(s)) / s);
      z[0] = mul_rn(x, f), z[1] = mul_rn(y, f);
      return;
    }
  }
  z[0] = z[1] = 0.0;
}

// Whether a value drawn for a parameter truncated at +-bound (bound > 0; 0: no truncation) must be
// drawn again. The test is on the value as stored (f32), as torch's trunc_normal_ bounds it.
TITAN_HOST_DEVICE inline bool outside_bound(float v, double bound) {
  return bound > 0 && !(double(v < 0 ? -v : v) <= bound);
}

// The two elements of normal pair `pair` scaled by `std` (as f32), each redrawn from the pair's
// later attempts while outside_bound.
TITAN_HOST_DEVICE inline void draw_pair(uint64_t stream, double std, double bound, uint64_t pair,
                                        float out[2]) {
  uint64_t first = 0;
  double z[2];
  normal_pair(stream, pair, first, z);
  for (int c = 0; c < 2; ++c) {
    float v = float(mul_rn(z[c], std));
    for (uint64_t attempt = first + 1; outside_bound(v, bound) && attempt < 256; ++attempt) {
      double redraw[2];
      normal_pair(stream, pair, attempt, redraw);
      v = float(mul_rn(redraw[c], std));
    }
    out[c] = outside_bound(v, bound) ? 0.0f : v;
  }
}

// Elements [b, e) of a stream into out[0, e - b), one pair at a time (element j is component j % 2
// of pair j / 2; a slice may start or end inside a pair).
TITAN_HOST_DEVICE inline void draw_elements(uint64_t stream, double std, double bound, int64_t b, int64_t e,
                                            float* out) {
  for (int64_t j = b; j < e;) {
    float pair[2];
    draw_pair(stream, std, bound, uint64_t(j / 2), pair);
    for (int64_t k = j % 2; k < 2 && j < e; ++k, ++j) out[j - b] = pair[k];
  }
}

}  // namespace titan::ops::init_draw
