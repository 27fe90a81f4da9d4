#include "titan/core/allocator.h"

#include <cstdlib>
#include <malloc.h>
#include <new>

#include "titan/core/check.h"

namespace titan {

MemoryStats Allocator::stats() const { return {current_.load(), peak_.load(), count_.load()}; }

void Allocator::reset_peak() { peak_.store(current_.load()); }

void Allocator::count_alloc(size_t nbytes) {
  int64_t now = current_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  count_.fetch_add(1);
}

void Allocator::count_free(size_t nbytes) { current_.fetch_sub(int64_t(nbytes)); }

namespace {

class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    // Training frees and re-allocates the same large activation buffers every step. glibc serves
    // big blocks with fresh mmaps by default, so each step would page-fault its memory in again;
    // keeping them on the heap (and not trimming it) lets freed blocks be reused.
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, -1);
  }
  void* allocate(size_t nbytes) override {
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded ? rounded : 64);
    TITAN_CHECK(p, "out of CPU memory allocating ", nbytes, " bytes");
    count_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    std::free(ptr);
    count_free(nbytes);
  }
  Device device() const override { return Device::CPU; }
};

}  // namespace

Allocator& allocator_for(Device device) {
  static CpuAllocator cpu;
  TITAN_CHECK(device == Device::CPU, "no allocator for device '", device_name(device),
              "' in this build (CUDA backend not compiled or not initialised)");
  return cpu;
}

}  // namespace titan
