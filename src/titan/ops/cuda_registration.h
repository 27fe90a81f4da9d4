#pragma once
// The registration every CUDA kernel file (ops/<op>/cuda.cu) uses for its f32/bf16 pair: a
// backend cannot include the registry (CONTRIBUTING.md, Layering), so the op layer joins the two.
#include <string>

#include "titan/backend/cuda/cuda_services.h"
#include "titan/kernels/float_kernels.h"

namespace titan::cuda {

// kernels::register_float_kernels on the CUDA device, usable when a GPU is (unavailable_reason):
//   register_float_kernels("rms_norm", "warp per row", "warp per row, bf16 rounding",
//                          TITAN_FLOAT_KERNEL(RmsNormKernel, forward<T>, backward<T>));
template <class KernelFor>
bool register_float_kernels(const std::string& op, const std::string& f32, const std::string& bf16,
                            KernelFor kernel_for) {
  return kernels::register_float_kernels(op, Device::CUDA, f32, bf16, kernel_for, unavailable_reason);
}

}  // namespace titan::cuda
