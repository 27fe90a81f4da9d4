#include <cuda_runtime.h>

#include <cstdio>

#include "titan/backend/cuda/device.h"

namespace titan::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

std::string device_summary(int device) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "unavailable";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %.1f GiB", p.name, p.major, p.minor,
                double(p.totalGlobalMem) / double(1ull << 30));
  return buf;
}

}  // namespace titan::cuda
