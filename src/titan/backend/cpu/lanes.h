#pragma once
// Element loads/stores shared by the vectorised elementwise kernels (rms_norm, rope, swiglu,
// moe_experts).
// bf16 is handled as raw uint16_t so the loops stay plain scalar code gcc vectorises; every
// store to bf16 rounds to nearest even (NaN stays NaN), like torch.
#include <bit>
#include <cstdint>

// Compile a row kernel twice, for AVX-512 (x86-64-v4) and baseline x86-64; the loader picks one.
#define TITAN_CLONES __attribute__((target_clones("arch=x86-64-v4", "default")))

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

// e^x for the SiLU kernels (swiglu, moe_experts): Cephes-style range reduction by ln 2 and a
// degree-6 polynomial, ~1 f32 ulp from glibc's expf, branch-free so `omp simd` loops vectorise.
// x is clamped to [-87.3, 88]: e^-88 would be a denormal, and silu(g) = g / (1 + e^-g) stays
// tiny (like the exact value) for g below -88.
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

}  // namespace titan::cpu::lanes
