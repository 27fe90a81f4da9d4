#include "titan/core/caching_allocator.h"

#include <algorithm>
#include <vector>

#include "titan/core/check.h"

namespace titan {

// A piece of a segment: handed out or free. Blocks of one segment form an address-ordered list
// (prev/next), so a freed block finds its neighbours in O(1).
struct CachingAllocator::Block {
  char* ptr = nullptr;
  size_t size = 0;
  bool small = false;  // which pool its segment belongs to
  bool free = true;
  Block* prev = nullptr;
  Block* next = nullptr;
};

// Best fit: the smallest block that holds the request, the lowest address among equals (a stable
// order, so the same sequence of calls gives the same addresses).
bool CachingAllocator::BySize::operator()(const Block* a, const Block* b) const {
  if (a->size != b->size) return a->size < b->size;
  return std::less<const char*>()(a->ptr, b->ptr);
}

namespace {
size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}
}  // namespace

size_t CachingAllocator::block_size(size_t nbytes) {
  return round_up(std::max<size_t>(nbytes, 1), kRound);
}

size_t CachingAllocator::segment_size(size_t block) {
  if (block <= kSmallRequest) return kSmallSegment;
  if (block <= kMediumRequest) return kMediumSegment;
  return round_up(block, kLargeSegmentRound);
}

CachingAllocator::CachingAllocator(Device device) : device_(std::move(device)) {
  TITAN_CHECK(device_.allocate_segment && device_.free_segment,
              "CachingAllocator: the device must provide allocate_segment and free_segment");
}

CachingAllocator::~CachingAllocator() {
  for (const auto& [base, bytes] : segments_) {
    try {
      device_.free_segment(base, bytes);
    } catch (...) {  // a device already torn down at exit: nothing left to return it to
    }
  }
}

CachingAllocator::FreeSet& CachingAllocator::pool_of(const Block& b) {
  return b.small ? small_free_ : large_free_;
}

void CachingAllocator::insert_free(Block* b) {
  b->free = true;
  pool_of(*b).insert(b);
  stats_.cached_bytes += int64_t(b->size);
}

void CachingAllocator::erase_free(Block* b) {
  pool_of(*b).erase(b);
  stats_.cached_bytes -= int64_t(b->size);
}

CachingAllocator::Block* CachingAllocator::take_cached(bool small, size_t size) {
  FreeSet& pool = small ? small_free_ : large_free_;
  Block key;
  key.size = size;  // with a null address: the first block of this size or the next larger
  auto it = pool.lower_bound(&key);
  if (it == pool.end()) return nullptr;
  Block* b = *it;
  erase_free(b);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(bool small, size_t size) {
  const size_t bytes = segment_size(size);  // small requests: kSmallSegment
  TITAN_CHECK(bytes < kMaxBytes - size_t(stats_.reserved_bytes), "caching allocator: a ", bytes,
              "-byte segment would take the memory reserved at once past 2^63 bytes (", stats_.reserved_bytes,
              " reserved)");
  void* base = device_.allocate_segment(bytes);
  if (!base) return nullptr;
  auto owned = std::make_unique<Block>();
  Block* b = owned.get();
  b->ptr = static_cast<char*>(base);
  b->size = bytes;
  b->small = small;
  b->free = false;
  blocks_.emplace(base, std::move(owned));
  segments_.emplace(base, bytes);
  stats_.reserved_bytes += int64_t(bytes);
  stats_.segments += 1;
  stats_.device_allocations += 1;
  return b;
}

void* CachingAllocator::allocate(size_t nbytes) {
  TITAN_CHECK(nbytes <= kMaxBytes, "caching allocator: a request of ", nbytes, " bytes exceeds 2^63 bytes");
  const size_t size = block_size(nbytes);
  const bool small = size <= kSmallRequest;
  std::lock_guard<std::mutex> lock(mutex_);
  Block* b = take_cached(small, size);
  if (!b) b = new_segment(small, size);
  if (!b) {  // the device is full: give back what is cached and try once more
    release_free_segments();
    b = new_segment(small, size);
    if (!b) return nullptr;
  }
  b->free = false;
  const size_t rest = b->size - size;
  if (small ? rest >= kRound : rest > kLargeMinSplitRest) {
    auto owned = std::make_unique<Block>();
    Block* r = owned.get();
    r->ptr = b->ptr + size;
    r->size = rest;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    blocks_.emplace(r->ptr, std::move(owned));
    insert_free(r);
  }
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = blocks_.find(ptr);
  TITAN_CHECK(found != blocks_.end() && !found->second->free, "caching allocator: ", ptr,
              found == blocks_.end() ? " was not handed out by this allocator" : " was freed already");
  Block* b = found->second.get();
  // Merge with the free neighbours in the segment: a later larger request can use the whole run.
  if (Block* n = b->next; n && n->free) {
    erase_free(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    blocks_.erase(n->ptr);
  }
  if (Block* p = b->prev; p && p->free) {
    erase_free(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    blocks_.erase(b->ptr);
    b = p;
  }
  insert_free(b);
}

void CachingAllocator::release_free_segments() {
  std::vector<Block*> whole;  // free blocks that span their segment
  for (FreeSet* pool : {&small_free_, &large_free_})
    for (Block* b : *pool)
      if (!b->prev && !b->next) whole.push_back(b);
  if (whole.empty()) return;
  if (device_.before_release) device_.before_release();
  for (Block* b : whole) {
    void* base = b->ptr;
    const size_t bytes = b->size;
    device_.free_segment(base, bytes);  // a segment that failed to go back stays counted
    erase_free(b);
    segments_.erase(base);
    blocks_.erase(base);
    stats_.reserved_bytes -= int64_t(bytes);
    stats_.segments -= 1;
  }
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_free_segments();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace titan
