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

// The MFU denominators, by the names the driver gives the parts (their datasheets' dense figures):
// a variant's own row wins over its product's, a word must match whole, and a GPU the table lacks
// (or a MIG slice of one it has) gets 0 (the trainer then asks for metrics.peak_tflops instead of guessing).
// Runs without a GPU.
TEST(CudaBackend, DatasheetPeaksGoByTheDevicesName) {
#ifndef TITAN_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend (-DTITAN_CUDA=ON)";
#else
  using titan::DType;
  using titan::cuda::datasheet_peak_flops;
  const struct {
    const char* name;
    double bf16_tflops, f32_tflops;
  } parts[] = {
      {"NVIDIA H200", 989.4, 67.0},
      {"NVIDIA H100 80GB HBM3", 989.4, 67.0},
      {"NVIDIA H100 NVL", 835.5, 60.0},
      {"NVIDIA H100 PCIe", 756.5, 51.0},
      {"NVIDIA H200 NVL", 835.5, 60.0},
      {"NVIDIA GH200 480GB", 989.4, 67.0},
      {"NVIDIA A100-SXM4-80GB", 312.0, 19.5},
      {"NVIDIA A100 80GB PCIe", 312.0, 19.5},
      {"NVIDIA L40S", 362.05, 91.6},
      {"NVIDIA L4", 121.0, 30.3},
      {"NVIDIA B200", 2250.0, 0},
      {"NVIDIA L40", 0, 0},
      {"NVIDIA GeForce RTX 4090", 0, 0},
      {"", 0, 0},
      {"NVIDIA H100 80GB HBM3 MIG 1g.10gb", 0, 0},
  };
  for (const auto& part : parts) {
    EXPECT_EQ(datasheet_peak_flops(part.name, DType::BF16), part.bf16_tflops * 1e12) << part.name;
    EXPECT_EQ(datasheet_peak_flops(part.name, DType::F16), part.bf16_tflops * 1e12) << part.name;
    EXPECT_EQ(datasheet_peak_flops(part.name, DType::F32), part.f32_tflops * 1e12) << part.name;
    EXPECT_EQ(datasheet_peak_flops(part.name, DType::F64), 0.0) << part.name;
  }
#endif
}
