#pragma once
// Host-side element access for any dtype through double, and the row-major walk over a strided
// view. Slow and general: the CPU device services (copies between arbitrary strides and dtypes)
// and tensor value reads (to_vector) use them; kernels use typed contiguous loops instead.
#include <cstdint>
#include <vector>

#include "titan/core/dtype.h"

namespace titan {

inline double load_element(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F64: return static_cast<const double*>(base)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const bf16*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return double(static_cast<const int64_t*>(base)[i]);
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

inline void store_element(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = float(v); break;
    case DType::F64: static_cast<double*>(base)[i] = v; break;
    case DType::BF16: static_cast<bf16*>(base)[i] = f32_to_bf16(float(v)); break;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(float(v)); break;
    case DType::I32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    case DType::U8: static_cast<uint8_t*>(base)[i] = uint8_t(v); break;
  }
}

inline int64_t numel_of(int rank, const int64_t* shape) {
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) n *= shape[d];
  return n;
}

// Calls f(linear_index, element_offset) for every element of a strided view in row-major order.
template <class F>
void for_each_strided_offset(int rank, const int64_t* shape, const int64_t* strides, F&& f) {
  const int64_t n = numel_of(rank, shape);
  if (n == 0) return;
  std::vector<int64_t> idx(size_t(rank), 0);
  int64_t off = 0;
  for (int64_t lin = 0; lin < n; ++lin) {
    f(lin, off);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[size_t(d)] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace titan
