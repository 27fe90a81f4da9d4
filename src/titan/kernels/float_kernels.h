#pragma once
// register_float_kernels: an op's f32 and bf16 "default" kernels registered in one call when they
// are two instances of the same templates (the CUDA kernel files).
#include <cstdint>
#include <functional>
#include <string>

#include "titan/kernels/registry.h"

namespace titan::kernels {

// The element type and DType of one kernel of an op's f32/bf16 pair (register_float_kernels); bf16
// elements are their uint16_t bits.
template <class T, DType kDType>
struct FloatTypes {};

// Registers an op's "default" kernels on `device` for f32 and bf16, described as `f32` and `bf16`
// (what the two instances of the same templates do differently); `kernel_for` builds the op's
// kernel struct for one FloatTypes (TITAN_FLOAT_KERNEL below writes it), `available` as for
// register_kernels:
//   register_float_kernels("rms_norm", Device::CUDA, "warp per row", "warp per row, bf16 rounding",
//       TITAN_FLOAT_KERNEL(RmsNormKernel, forward<T>, backward<T>), cuda::kernel_available);
template <class KernelFor>
bool register_float_kernels(const std::string& op, Device device, const std::string& f32, const std::string& bf16,
                            KernelFor kernel_for, const std::function<std::string()>& available = {}) {
  return register_kernels(op, device,
                          {{DType::F32, "default", f32, kernel_for(FloatTypes<float, DType::F32>{})},
                           {DType::BF16, "default", bf16, kernel_for(FloatTypes<uint16_t, DType::BF16>{})}},
                          available);
}

}  // namespace titan::kernels

// The kernel_for of register_float_kernels: the kernel struct `Kernel` initialised with the fields
// given, written in terms of the element type T (float or uint16_t) or its DType kDType.
#define TITAN_FLOAT_KERNEL(Kernel, ...) \
  []<class T, ::titan::DType kDType>(::titan::kernels::FloatTypes<T, kDType>) { return Kernel{__VA_ARGS__}; }
