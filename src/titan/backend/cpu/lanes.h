#pragma once
// Element loads/stores shared by the vectorised elementwise kernels (rms_norm, rope, swiglu).
// bf16 is handled as raw uint16_t so the loops stay plain scalar code gcc vectorises; every
// store to bf16 rounds to nearest even (NaN stays NaN), like torch.
#include <bit>
#include <cstdint>

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

}  // namespace titan::cpu::lanes
