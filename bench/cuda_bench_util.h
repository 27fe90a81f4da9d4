#pragma once
// Shared by the CUDA benchmarks: device buffers, event timing, the table row format.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "titan/backend/cuda/cuda_services.h"
#include "titan/core/device_services.h"

namespace titan::bench {

// Device memory filled with one value, freed at scope end.
struct Buffer {
  DeviceServices& s;
  size_t n;
  void* p;
  Buffer(DeviceServices& services, size_t bytes, double value, DType t)
      : s(services), n(bytes), p(services.allocate(bytes)) {
    services.fill(p, int64_t(bytes / dtype_size(t)), t, value);
  }
  ~Buffer() { s.deallocate(p, n); }
};

// Milliseconds per call of f: 3 warm-up calls, then enough back-to-back calls for ~200 ms (at
// least 5), timed with CUDA events on the compute stream.
inline double time_ms(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  cuda::Event a, b;
  a.record();
  f();
  b.record();
  b.synchronize();
  const double once = std::max(1e-3, double(b.elapsed_ms(a)));
  const int iters = std::max(5, int(200.0 / once));
  a.record();
  for (int i = 0; i < iters; ++i) f();
  b.record();
  b.synchronize();
  return double(b.elapsed_ms(a)) / iters;
}

inline void print_header() { std::printf("%-46s %13s %17s\n", "kernel", "time/call", "rate"); }
inline void print_row(const std::string& name, double ms, double rate, const char* unit) {
  std::printf("%-46s %10.3f ms %9.1f %s\n", name.c_str(), ms, rate, unit);
  std::fflush(stdout);
}

// The name filter of the command line (argv[1]): a substring of the row name, or everything.
inline bool wanted(const std::string& name, const char* filter) { return !filter || name.find(filter) != std::string::npos; }

// Prints why and returns false when there is no usable GPU (the benchmark then exits 0).
inline bool gpu_ready(const char* program) {
  const std::string why = cuda::unavailable_reason();
  if (why.empty()) return true;
  std::printf("%s: skipped: %s\n", program, why.c_str());
  return false;
}

inline void print_memory(DeviceServices& s) {
  const MemoryStats st = s.stats();
  std::printf("allocator: peak %.2f GiB, reserved %.2f GiB\n", double(st.peak_bytes) / (1 << 30),
              double(st.reserved_bytes) / (1 << 30));
}

}  // namespace titan::bench
