#include "titan/core/dtype.h"

#include <algorithm>
#include <cstddef>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "titan/core/check.h"

namespace titan {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::U8: return 1;
  }
  TITAN_FAIL("unknown dtype ", int(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

DType dtype_from_name(std::string_view n) {
  if (n == "f32" || n == "float32" || n == "float") return DType::F32;
  if (n == "f64" || n == "float64" || n == "double") return DType::F64;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "f16" || n == "float16" || n == "half") return DType::F16;
  if (n == "i32" || n == "int32") return DType::I32;
  if (n == "i64" || n == "int64") return DType::I64;
  if (n == "u8" || n == "uint8") return DType::U8;
  TITAN_FAIL("unknown dtype '", n, "' (expected one of f32, f64, bf16, f16, i32, i64, u8)");
}

std::string_view dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

bool dtype_from_safetensors_name(std::string_view n, DType* out) {
  static const std::pair<std::string_view, DType> table[] = {
      {"F32", DType::F32}, {"F64", DType::F64}, {"BF16", DType::BF16}, {"F16", DType::F16},
      {"I32", DType::I32}, {"I64", DType::I64}, {"U8", DType::U8}};
  for (auto& [name, t] : table)
    if (name == n) { *out = t; return true; }
  return false;
}

bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = int32_t((u >> 23) & 0xff) - 127 + 15;
  uint32_t man = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return uint16_t(half);
}

namespace {

// A value of `Bits` is NaN or infinite when its exponent field (`exponent`) is all ones. Chunks are
// tested branch-free (vectorised), and only a chunk that holds one is searched.
template <class Bits>
int64_t first_all_ones_exponent(const std::byte* data, int64_t n, Bits exponent) {
  constexpr int64_t kChunk = 4096;
  auto at = [&](int64_t i) {
    Bits v;
    std::memcpy(&v, data + i * int64_t(sizeof(Bits)), sizeof v);
    return (v & exponent) == exponent;
  };
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    bool any = false;
    for (int64_t i = begin; i < end; ++i) any |= at(i);
    if (!any) continue;
    for (int64_t i = begin; i < end; ++i)
      if (at(i)) return i;
  }
  return -1;
}

}  // namespace

int64_t first_non_finite(const void* data, int64_t n, DType t) {
  const auto* p = static_cast<const std::byte*>(data);
  switch (t) {
    case DType::F32:
      return first_all_ones_exponent<uint32_t>(p, n, 0x7f800000u);
    case DType::F64:
      return first_all_ones_exponent<uint64_t>(p, n, 0x7ff0000000000000ull);
    case DType::BF16:
      return first_all_ones_exponent<uint16_t>(p, n, 0x7f80u);
    case DType::F16:
      return first_all_ones_exponent<uint16_t>(p, n, 0x7c00u);
    default:
      TITAN_FAIL("first_non_finite: ", dtype_name(t), " is not a floating type");
  }
}

// The bulk conversions run on every bf16 step (weight casts, gradients handed to bf16 GEMMs), so
// they are compiled three times: AVX-512 (x86-64-v4), AVX2 (x86-64-v3) and baseline, picked when the
// library loads. The loop
// bodies are branch-free selects gcc vectorises; results are identical to f32_to_bf16/bf16_to_f32.
namespace {

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void f32_to_bf16_range(
    const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40u) : uint16_t(rounded);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void bf16_to_f32_range(
    const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(src[i]) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

// Splits [0, n) into one contiguous range per OpenMP thread (one parallel region per call).
template <class F>
void parallel_ranges(size_t n, F&& f) {
#ifdef _OPENMP
  if (n >= kBulkConvertThreadsMin) {
#pragma omp parallel
    {
      const size_t t = size_t(omp_get_thread_num()), nt = size_t(omp_get_num_threads());
      const size_t chunk = (n + nt - 1) / nt, begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
      if (begin < end) f(begin, end - begin);
    }
    return;
  }
#endif
  f(size_t(0), n);  // small, or built without OpenMP (the fuzz target)
}

}  // namespace

void convert_f32_to_bf16(const float* src, bf16* dst, size_t n) {
  static_assert(sizeof(bf16) == 2);
  parallel_ranges(n, [&](size_t begin, size_t count) {
    f32_to_bf16_range(src + begin, reinterpret_cast<uint16_t*>(dst) + begin, count);
  });
}

void convert_bf16_to_f32(const bf16* src, float* dst, size_t n) {
  parallel_ranges(n, [&](size_t begin, size_t count) {
    bf16_to_f32_range(reinterpret_cast<const uint16_t*>(src) + begin, dst + begin, count);
  });
}

}  // namespace titan
