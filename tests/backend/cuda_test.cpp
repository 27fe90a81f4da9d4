// CUDA backend smoke test: runs where a GPU is present, skips cleanly elsewhere
// (CI has none; builds without -DTITAN_CUDA=ON have no backend at all).
#include <gtest/gtest.h>

#ifdef TITAN_HAVE_CUDA
#include "titan/backend/cuda/device.h"
#endif

TEST(CudaBackend, DeviceQuery) {
#ifndef TITAN_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend (-DTITAN_CUDA=ON)";
#else
  int n = titan::cuda::device_count();
  if (n == 0) GTEST_SKIP() << "no CUDA device on this machine";
  for (int d = 0; d < n; ++d) EXPECT_NE(titan::cuda::device_summary(d), "unavailable") << "device " << d;
#endif
}
