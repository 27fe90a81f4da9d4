#pragma once
// The CUDA backend's entry points. Built only with -DTITAN_CUDA=ON (nvcc present); every
// caller guards on TITAN_HAVE_CUDA. Kernels for the op families will land here.
#include <string>

namespace titan::cuda {

int device_count();              // 0 when the driver or a GPU is missing (never throws)
std::string device_summary(int device);  // "NVIDIA H200, sm_90, 139.8 GiB"
// "runtime 12.4, driver 12.6" (the driver part reads "none" without a driver; never throws).
std::string runtime_versions();

}  // namespace titan::cuda
