#pragma once
// A caching allocator's bookkeeping, independent of the device: memory is obtained from the device
// in segments, segments are split into blocks handed out best fit, a freed block merges with its
// free neighbours in the same segment, and wholly free segments go back to the device only when it
// runs out (or on release_cached()). The CUDA services use it because cudaMalloc and cudaFree
// synchronise the whole device and cost tens of microseconds, while a training step frees and
// re-allocates the same activation sizes every step; the CPU services over mmap'd segments,
// because a heap that served those sizes kept holes it could neither reuse nor return, and fresh
// mappings would fault and zero their pages again every step; the meta device replays a step's
// allocations through the same policy, so `titan info` can say what either device would reserve.
//
// The policy (the one PyTorch's CUDA allocator made familiar, so reserved figures compare):
//   - every size is rounded up to 512 bytes (block pointers keep the segment's alignment, 256 bytes
//     or more: every vector load stays aligned);
//   - requests up to 1 MiB come from 2 MiB segments of a small pool, requests up to 10 MiB from
//     20 MiB segments of a large pool, larger ones from a segment of their size rounded up to 2 MiB;
//     the pools never share blocks, so small tensors do not pin holes in large segments;
//   - a cached block larger than the request is split when the rest is worth keeping (any rest in
//     the small pool, over 1 MiB in the large pool); otherwise the request takes it whole;
//   - when the device refuses a segment, every wholly free segment is returned and the request is
//     tried once more before allocate() gives up (returns null: the caller names the request).
//
// Reuse is immediate: the caller orders every use of a block before its deallocate and every use
// after the next allocate (one stream on a GPU). Thread-safe.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

namespace titan {

class CachingAllocator {
 public:
  // The device's raw memory. allocate_segment returns null when the device is out of memory (and
  // throws for any other fault); before_release runs before cached segments are returned, so work
  // still queued on the device that used them can finish first.
  struct Device {
    std::function<void*(size_t)> allocate_segment;
    std::function<void(void*, size_t)> free_segment;
    std::function<void()> before_release;
  };

  struct Stats {
    int64_t reserved_bytes = 0;  // in segments obtained from the device
    int64_t cached_bytes = 0;    // of which in free blocks
    int64_t segments = 0;
    int64_t device_allocations = 0;  // segments ever obtained (cache misses)
  };

  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallRequest = size_t(1) << 20;  // up to this: the small pool
  static constexpr size_t kSmallSegment = size_t(2) << 20;
  static constexpr size_t kMediumRequest = size_t(10) << 20;  // up to this: 20 MiB segments
  static constexpr size_t kMediumSegment = size_t(20) << 20;
  static constexpr size_t kLargeSegmentRound = size_t(2) << 20;
  static constexpr size_t kLargeMinSplitRest = size_t(1) << 20;  // a smaller rest stays with the block
  static constexpr size_t kMaxBytes = size_t(1) << 63;  // requests and reservations stay within (no overflow)

  explicit CachingAllocator(Device device);
  ~CachingAllocator();  // returns every segment (blocks still handed out are the caller's leak)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `nbytes` (0 gives a unique block too), or null when the device has no room
  // even after the cached segments went back. A request, or a reservation, past 2^63 bytes is an
  // error saying so.
  void* allocate(size_t nbytes);
  // `ptr` must come from allocate() and not be freed yet: anything else is an error naming it.
  void deallocate(void* ptr);
  // Returns every wholly free segment to the device (PyTorch's empty_cache).
  void release_cached();
  Stats stats() const;

  // What a request of `nbytes` becomes: the rounded block size, and the segment a miss obtains.
  static size_t block_size(size_t nbytes);
  static size_t segment_size(size_t block_size);

 private:
  struct Block;
  struct BySize {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BySize>;

  FreeSet& pool_of(const Block& b);
  void insert_free(Block* b);
  void erase_free(Block* b);
  Block* take_cached(bool small, size_t size);
  Block* new_segment(bool small, size_t size);
  void release_free_segments();

  Device device_;
  mutable std::mutex mutex_;
  FreeSet small_free_, large_free_;
  std::unordered_map<void*, std::unique_ptr<Block>> blocks_;  // every block, free or handed out
  std::map<void*, size_t> segments_;                          // base address -> bytes
  Stats stats_;
};

}  // namespace titan
