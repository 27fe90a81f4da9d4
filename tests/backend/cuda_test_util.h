#pragma once
// Shared by the CUDA test programs: why the GPU tests cannot run here (empty when they can).
// CI has nvcc but no GPU, so these tests report a skip with this reason instead of failing.
#include <string>

#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::testing {

inline std::string cuda_skip_reason() {
#ifndef TITAN_HAVE_CUDA
  return "built without the CUDA backend (nvcc not found at configure time)";
#else
  if (device_available(Device::CUDA)) return "";
  try {
    device_services(Device::CUDA);
  } catch (const Error& e) {
    return std::string("no usable CUDA device: ") + e.what();
  }
  return "no usable CUDA device";
#endif
}

}  // namespace titan::testing

// First line of every GPU test.
#define TITAN_REQUIRE_CUDA()                                                        \
  do {                                                                              \
    const std::string titan_cuda_skip = ::titan::testing::cuda_skip_reason();       \
    if (!titan_cuda_skip.empty()) GTEST_SKIP() << titan_cuda_skip;                  \
  } while (0)
