#pragma once
// Element types and the bf16/f16 <-> f32 conversions used everywhere.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace titan {

// f64 exists for gradient checks against finite differences; models use the rest.
enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);               // "f32", "bf16", ...
DType dtype_from_name(std::string_view name);       // accepts "f32"/"float32", "bf16"/"bfloat16", ...
std::string_view dtype_safetensors_name(DType t);   // "F32", "BF16", ...
bool dtype_from_safetensors_name(std::string_view name, DType* out);
bool dtype_is_float(DType t);

// bfloat16: the top 16 bits of an IEEE f32. Conversion rounds to nearest even (NaN stays NaN).
struct bf16 {
  uint16_t bits;
};
inline float bf16_to_f32(bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}
// bf16 storage with f32 arithmetic: reading widens exactly, every assignment from float rounds to
// nearest even, as a bf16 torch tensor does. Reference kernels template on it like on float/double,
// so T(x) marks each point where the bf16 computation rounds.
struct Bf16 {
  bf16 v;
  Bf16() = default;
  Bf16(float f) : v(f32_to_bf16(f)) {}
  operator float() const { return bf16_to_f32(v); }
};
static_assert(sizeof(Bf16) == 2);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// The index of the first NaN or infinity among the n values of floating type t (f32, f64, bf16, f16)
// at `data` (any alignment), or -1 when all are finite: weights are checked as they load.
int64_t first_non_finite(const void* data, int64_t n, DType t);

// Bulk conversions (vectorised where the CPU allows); from kBulkConvertThreadsMin elements on, one
// OpenMP region each (a caller inside a parallel region keeps below it).
inline constexpr size_t kBulkConvertThreadsMin = size_t(1) << 16;
void convert_f32_to_bf16(const float* src, bf16* dst, size_t n);
void convert_bf16_to_f32(const bf16* src, float* dst, size_t n);

}  // namespace titan
