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

std::string runtime_versions() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess) cudaGetLastError();
  char buf[96];
  if (driver > 0)
    std::snprintf(buf, sizeof buf, "runtime %d.%d, driver %d.%d", runtime / 1000, runtime % 1000 / 10, driver / 1000,
                  driver % 1000 / 10);
  else
    std::snprintf(buf, sizeof buf, "runtime %d.%d, driver none", runtime / 1000, runtime % 1000 / 10);
  return buf;
}

}  // namespace titan::cuda
