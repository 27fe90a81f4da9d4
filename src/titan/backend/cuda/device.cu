#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <vector>

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
  char mem[32];
  std::snprintf(mem, sizeof mem, "%.1f GiB", double(p.totalGlobalMem) / double(1ull << 30));
  return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " + mem;
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

namespace {

struct Datasheet {
  const char* product;  // a word of the device's name
  const char* variant;  // a further word of it ("NVL", "PCIe"), or "" for the product's main part
  double bf16_tflops;   // dense, tensor cores (f16 the same)
  double f32_tflops;    // dense, CUDA cores; 0 where not taken from the datasheet
};

// The variant rows of a product come before its main row.
constexpr Datasheet kDatasheets[] = {
    {"H100", "NVL", 835.5, 60.0},  {"H100", "PCIe", 756.5, 51.0}, {"H100", "", 989.4, 67.0},
    {"H800", "PCIe", 756.5, 51.0}, {"H800", "", 989.4, 67.0},     {"H200", "NVL", 835.5, 60.0},
    {"H200", "", 989.4, 67.0},     {"GH200", "", 989.4, 67.0},    {"A100", "", 312.0, 19.5},
    {"A800", "", 312.0, 19.5},     {"B200", "", 2250.0, 0},       {"L40S", "", 362.05, 91.6},
    {"L4", "", 121.0, 30.3},
};

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

}  // namespace

double datasheet_peak_flops(std::string_view device_name, DType dtype) {
  // Words of the name, split at spaces, hyphens and underscores ("A100-SXM4-80GB"), compared
  // without case: "L4" is not a word of "NVIDIA L40S".
  std::vector<std::string> words;
  std::string word;
  for (const char c : std::string(device_name) + " ") {
    if (c == ' ' || c == '-' || c == '_') {
      if (!word.empty()) words.push_back(lowercase(word));
      word.clear();
    } else {
      word += c;
    }
  }
  auto has = [&](const char* w) {
    return std::find(words.begin(), words.end(), lowercase(w)) != words.end();
  };
  // A MIG slice keeps its part's name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb") but has a share of its
  // SMs: the part's peak would understate MFU several times over.
  if (has("MIG")) return 0;
  for (const Datasheet& d : kDatasheets) {
    if (!has(d.product) || (*d.variant && !has(d.variant))) continue;
    if (dtype == DType::BF16 || dtype == DType::F16) return d.bf16_tflops * 1e12;
    if (dtype == DType::F32) return d.f32_tflops * 1e12;
    return 0;
  }
  return 0;
}

}  // namespace titan::cuda
