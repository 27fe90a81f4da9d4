#pragma once
// Helpers of the CUDA kernel tests that call launchers on raw device pointers
// (tests/backend/cuda_{attention,cross_entropy,moe}_test.cpp): device buffers through the CUDA
// device services, seeded random inputs, bf16 rounding of host vectors, and the tolerance check
// the CPU kernel tests use (|got - want| <= rtol |want| + atol max(1, max|want|)). Skipping without
// a GPU is backend/cuda_test_util.h's TITAN_REQUIRE_CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "titan/core/device_services.h"
#include "titan/core/dtype.h"

namespace titan::cuda_test {

// Device memory: a copy of a host vector, or `bytes` uninitialised bytes.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : dev_(device_services(Device::CUDA)), bytes_(bytes) {
    ptr_ = dev_.allocate(bytes_);
  }
  template <class T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    if (bytes_) dev_.copy_from_host(ptr_, host.data(), bytes_);
  }
  ~DeviceBuffer() { dev_.deallocate(ptr_, bytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_) dev_.copy_to_host(host.data(), ptr_, bytes_);
    return host;
  }
  // Fills every byte with 0xff (NaN in f32 and bf16): outputs a kernel forgets to write show up.
  void poison() { dev_.fill(ptr_, int64_t(bytes_ / 4), DType::F32, NAN); }

 private:
  DeviceServices& dev_;
  size_t bytes_;
  void* ptr_;
};

inline std::vector<float> randn(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> x(n);
  for (auto& e : x) e = float(dist(gen));
  return x;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
inline std::vector<float> to_f32(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}
// x rounded to bf16 and widened back.
inline std::vector<float> round_bf16(const std::vector<float>& x) {
  return to_f32(to_bf16(x));
}

// Every element within rtol |want| + atol max(1, max|want|), plus `extra[i]` where given (a bound the
// test derived for that element).
inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                         double atol, const std::string& what, const std::vector<float>& extra = {}) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_TRUE(extra.empty() || extra.size() == want.size()) << what;
  double scale = 1;
  for (float w : want) scale = std::max(scale, double(std::abs(w)));
  size_t bad = 0, worst = 0;
  double worst_excess = -INFINITY;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]),
                 lim = rtol * std::abs(want[i]) + atol * scale + (extra.empty() ? 0.0 : double(extra[i]));
    if (!(err <= lim)) ++bad;
    if (!(err - lim <= worst_excess)) worst_excess = err - lim, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements out of tolerance; worst at "
                     << worst << " got " << got[worst] << " want " << want[worst] << " (max|want| " << scale
                     << ")";
}

}  // namespace titan::cuda_test
