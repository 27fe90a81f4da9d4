#pragma once
// Element loads/stores shared by the vectorised elementwise kernels (rms_norm, rope, swiglu,
// moe_experts), and the CPU kernels' exp.
// bf16 is handled as raw uint16_t so the loops stay plain scalar code gcc vectorises; every
// store to bf16 rounds to nearest even (NaN stays NaN), like torch.
#include <immintrin.h>

#include <bit>
#include <cstdint>

// Compile a row kernel three times, for AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3: Zen 1-3,
// Haswell and later) and baseline x86-64; the loader picks the best one the CPU runs.
#define TITAN_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace titan::cpu::lanes {

inline float ld(float v) { return v; }
inline float ld(uint16_t v) { return std::bit_cast<float>(uint32_t(v) << 16); }

inline uint16_t round_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40u) : uint16_t(r);
}

// v rounded to the element type T, returned as f32 (what a torch op in dtype T produces).
inline float rnd(float, float v) { return v; }
inline float rnd(uint16_t, float v) { return ld(round_bf16(v)); }

inline void st(float* p, float v) { *p = v; }
inline void st(uint16_t* p, float v) { *p = round_bf16(v); }

// e^x: the one exp of the CPU kernels, Cephes' expf algorithm in two forms. n = round(x / ln 2);
// r = x - n ln 2 in two steps (Cody-Waite: ln 2 = 0.693359375 - 2.12194440e-4, the first exact in
// few bits, so n * it is exact); e^r = 1 + r + r^2 P(r) with a degree-5 P; times 2^n. ~1 f32 ulp
// from glibc's expf.

// Scalar, branch-free, so the `omp simd` / target_clones loops of the SiLU kernels (swiglu,
// moe_experts) vectorise it. x is clamped to [-87.3, 88] so that 2^n fits the exponent bits it is
// built from (e^-88 would be a denormal); sigmoid_poly(g) is then a denormal below g = -87.3, which
// the SiLU loops flush to 0 (FlushDenormals).
inline float exp_poly(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln2) with the 1.5 * 2^23 trick (vectorises without a rounding instruction).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  return e * std::bit_cast<float>(uint32_t(int32_t(n) + 127) << 23);
}

// The logistic sigmoid 1 / (1 + e^-g) of the SiLU kernels, which multiply by it (silu(g) = g * s).
// Written as g / (1 + e^-g), GCC's partial-redundancy elimination copies the division into the
// branches of exp_poly's clamp (there e^-g is a constant) and the vectorised loop then runs three
// vdivps per vector instead of one (objdump of the AVX-512 clone). Call it under FlushDenormals
// (below).
inline float sigmoid_poly(float g) {
  return 1.0f / (1.0f + exp_poly(-g));
}

// Denormal floats flushed to zero (results, MXCSR FTZ) and read as zero (inputs, DAZ) on this
// thread while in scope. The SiLU loops need it: their vectorised sigmoid_poly evaluates the clamp
// branch's constant 1 / (1 + e^88) = 6e-39, a denormal, times the gate for every vector and blends
// the products away, and with denormals honoured each such multiply takes a microcode assist. The
// bf16 swiglu forward ran 14.5 ms per 3.1M elements on one Intel Xeon (Sapphire Rapids) core, 3.5
// ms with them flushed (swiglu's share of a debugmodel step: 134 -> 40 ms). Under it sigmoid_poly is
// 0 for g below -87.3, so silu is 0 there (the exact value is below 1e-36 in magnitude: silu(-90) =
// -7e-38), and any other result below 2^-126 becomes 0, in f32 as in bf16 (same exponent range).
// Scoped to the loops that need it: every other kernel keeps IEEE denormals.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  static constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;
  unsigned saved_;
};

// 16 lanes, for the AVX-512 intrinsic kernels (attention, cross_entropy): the same steps with
// fused multiply-adds, 2^n by scalef, so x <= -104 gives 0 (and -inf gives 0) and NaN propagates.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.f), x);  // the second operand is returned for NaN: keeps NaN
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(e, n);
}

// Lanes 0 .. n-1 of 8 set (all of them for n >= 8, none for n <= 0): the lane mask of AVX2's
// maskload / maskstore and blends for a partial vector.
__attribute__((target("avx2"))) inline __m256i lanes_below8(int64_t n) {
  const int k = n < 0 ? 0 : (n > 8 ? 8 : int(n));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 lanes, for the AVX2 + FMA intrinsic kernels (CPUs without AVX-512): exp16's steps, with 2^n
// built in the exponent bits (AVX2 has no scalef). x is clamped to [-87.3, 88] so that 2^n is a
// normal number, and x < -87.3 (-inf included) gives 0 where exp16 gives a denormal; NaN propagates.
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);  // false for NaN
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);  // the second operand is returned for NaN: keeps NaN
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(e, _mm256_castsi256_ps(bits)));
}

}  // namespace titan::cpu::lanes
