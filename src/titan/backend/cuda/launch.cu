// Launch-time settings of kernels (common.cuh, allow_dynamic_shared_memory).
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "titan/backend/cuda/common.cuh"

namespace titan::cuda {

void allow_dynamic_shared_memory(const void* kernel, size_t bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  int device = 0;
  TITAN_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  // Per (kernel, device): the most it may take already. The attribute is the device's.
  static std::map<std::pair<const void*, int>, size_t> reserved;
  std::lock_guard lock(mutex);
  size_t& have = reserved[{kernel, device}];
  if (have >= bytes) return;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  TITAN_CHECK(e == cudaSuccess, what, ": cannot reserve ", bytes,
              " bytes of shared memory: ", cudaGetErrorString(e));
  have = bytes;
}

}  // namespace titan::cuda
