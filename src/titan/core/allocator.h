#pragma once
// One allocator per device. It counts the bytes currently held and the peak, which the
// trainer logs as "memory". CPU memory is 64-byte aligned (AVX-512 loads, cache lines).
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "titan/core/device.h"

namespace titan {

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t total_allocations = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;

  MemoryStats stats() const;
  void reset_peak();

 protected:
  void count_alloc(size_t nbytes);
  void count_free(size_t nbytes);

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, count_{0};
};

Allocator& allocator_for(Device device);  // errors for a device this build does not have

}  // namespace titan
