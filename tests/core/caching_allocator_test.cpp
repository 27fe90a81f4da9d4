// The caching allocator's policy on host memory: segments come from std::aligned_alloc under a byte
// budget (what a GPU's capacity is to cudaMalloc), so the blocks are real memory the tests write.
#include "titan/core/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

using namespace titan;

namespace {

constexpr size_t MiB = size_t(1) << 20;

// Host memory with a capacity: a segment past it is refused (null), as cudaMalloc refuses one.
struct HostDevice {
  explicit HostDevice(size_t bytes) : capacity(bytes) {}
  size_t capacity;
  size_t held = 0;
  int releases = 0;  // before_release calls
  std::map<void*, size_t> segments;

  CachingAllocator::Device device() {
    return {[this](size_t n) -> void* {
              if (held + n > capacity) return nullptr;
              void* p = std::aligned_alloc(256, n);
              if (!p) return nullptr;
              held += n;
              segments.emplace(p, n);
              return p;
            },
            [this](void* p, size_t n) {
              auto it = segments.find(p);
              if (it == segments.end() || it->second != n)
                throw std::logic_error("freed a segment it did not hand out");
              segments.erase(it);
              held -= n;
              std::free(p);
            },
            [this] { ++releases; }};
  }
};

}  // namespace

TEST(CachingAllocator, SizesRoundTo512AndSegmentsFollowThePools) {
  EXPECT_EQ(CachingAllocator::block_size(0), 512u);
  EXPECT_EQ(CachingAllocator::block_size(1), 512u);
  EXPECT_EQ(CachingAllocator::block_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(512), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(10 * MiB), 20 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(10 * MiB + 512), 12 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(100 * MiB + 512), 102 * MiB);
}

TEST(CachingAllocator, SmallRequestsShareOneSegmentAndAFreedBlockIsReusedInPlace) {
  HostDevice host(64 * MiB);
  CachingAllocator cache(host.device());
  std::vector<char*> p;
  for (int i = 0; i < 4; ++i) p.push_back(static_cast<char*>(cache.allocate(1000)));
  // One 2 MiB segment, blocks of 1024 bytes one after the other.
  EXPECT_EQ(cache.stats().segments, 1);
  EXPECT_EQ(cache.stats().reserved_bytes, int64_t(2 * MiB));
  for (int i = 1; i < 4; ++i) EXPECT_EQ(p[size_t(i)] - p[size_t(i) - 1], 1024);
  for (char* q : p) std::memset(q, 0x5a, 1000);
  cache.deallocate(p[1]);
  EXPECT_EQ(cache.allocate(700), p[1]);  // the freed 1024-byte hole is the best fit
  EXPECT_EQ(cache.stats().device_allocations, 1);
}

TEST(CachingAllocator, ALargeFreeBlockIsSplitAndItsPiecesMergeBack) {
  HostDevice host(256 * MiB);
  CachingAllocator cache(host.device());
  char* big = static_cast<char*>(cache.allocate(100 * MiB));
  cache.deallocate(big);
  char* a = static_cast<char*>(cache.allocate(30 * MiB));
  char* b = static_cast<char*>(cache.allocate(60 * MiB));
  EXPECT_EQ(a, big);
  EXPECT_EQ(b, big + 30 * MiB);  // the rest of the same segment
  EXPECT_EQ(cache.stats().device_allocations, 1);
  EXPECT_EQ(cache.stats().cached_bytes, int64_t(10 * MiB));
  std::memset(a, 1, 30 * MiB);
  std::memset(b, 2, 60 * MiB);
  // Freed in either order, the pieces become one block again: a request for the whole fits.
  for (bool later_first : {true, false}) {
    cache.deallocate(later_first ? b : a);
    cache.deallocate(later_first ? a : b);
    EXPECT_EQ(cache.stats().cached_bytes, int64_t(100 * MiB));
    EXPECT_EQ(cache.allocate(100 * MiB), big);  // one 100 MiB block: the merge closed both seams
    cache.deallocate(big);
    a = static_cast<char*>(cache.allocate(30 * MiB));
    b = static_cast<char*>(cache.allocate(60 * MiB));
    ASSERT_EQ(a, big);
    ASSERT_EQ(b, big + 30 * MiB);
  }
  EXPECT_EQ(cache.stats().device_allocations, 1);
  EXPECT_EQ(cache.stats().reserved_bytes, int64_t(100 * MiB));
}

// Sizes past 2^63 bytes (a planned step of an absurd size on the meta device) are errors naming
// the request, never counters that wrap. The device here hands out addresses without memory.
TEST(CachingAllocator, RequestsAndReservationsPast2To63BytesAreErrors) {
  uint64_t next = uint64_t(1) << 40;
  CachingAllocator cache({[&](size_t n) { return reinterpret_cast<void*>(std::exchange(next, next + n)); },
                          [](void*, size_t) {}, nullptr});
  auto error_of = [&](size_t n) {
    try {
      cache.allocate(n);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(~size_t(0)).find("a request of 18446744073709551615 bytes exceeds 2^63 bytes"),
            std::string::npos);
  ASSERT_NE(cache.allocate(size_t(1) << 62), nullptr);
  ASSERT_NE(cache.allocate((size_t(1) << 62) - (size_t(4) << 20)), nullptr);
  EXPECT_NE(error_of(size_t(16) << 20).find("would take the memory reserved at once past 2^63 bytes"),
            std::string::npos);
  EXPECT_EQ(cache.stats().reserved_bytes, int64_t((size_t(1) << 63) - (size_t(4) << 20)));
}

TEST(CachingAllocator, ARestUnder1MiBStaysWithTheLargeBlock) {
  HostDevice host(64 * MiB);
  CachingAllocator cache(host.device());
  char* p = static_cast<char*>(cache.allocate(12 * MiB));
  cache.deallocate(p);
  EXPECT_EQ(cache.allocate(12 * MiB - 4096), p);  // takes it whole: a 4 KiB rest is not worth a block
  EXPECT_EQ(cache.stats().cached_bytes, 0);
  void* q = cache.allocate(12 * MiB);  // so this one needs a segment of its own
  EXPECT_NE(q, p);
  EXPECT_EQ(cache.stats().device_allocations, 2);
}

TEST(CachingAllocator, SmallAndLargePoolsNeverShareASegment) {
  HostDevice host(64 * MiB);
  CachingAllocator cache(host.device());
  void* large = cache.allocate(12 * MiB);
  cache.deallocate(large);
  void* small = cache.allocate(4096);  // the free 12 MiB block is in the other pool
  EXPECT_EQ(cache.stats().device_allocations, 2);
  EXPECT_EQ(cache.stats().reserved_bytes, int64_t(14 * MiB));
  cache.deallocate(small);
}

TEST(CachingAllocator, AFullDeviceGetsTheCachedSegmentsBackBeforeTheRequestFails) {
  HostDevice host(64 * MiB);
  CachingAllocator cache(host.device());
  void* a = cache.allocate(40 * MiB);
  void* keep = cache.allocate(4096);
  cache.deallocate(a);
  // 50 MiB does not fit beside the cached 40 MiB segment: that one goes back, then it fits.
  void* b = cache.allocate(50 * MiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(host.releases, 1);
  EXPECT_EQ(cache.stats().reserved_bytes, int64_t(52 * MiB));  // 50 MiB + the small pool's 2 MiB
  EXPECT_EQ(host.held, 52 * MiB);
  // Past the capacity even with nothing cached: null, and the allocator is unchanged.
  EXPECT_EQ(cache.allocate(20 * MiB), nullptr);
  EXPECT_EQ(cache.stats().reserved_bytes, int64_t(52 * MiB));
  cache.deallocate(b);
  cache.deallocate(keep);
  cache.release_cached();
  EXPECT_EQ(cache.stats().reserved_bytes, 0);
  EXPECT_EQ(host.held, 0u);
}

TEST(CachingAllocator, ForeignAndDoubleFreesAreNamed) {
  HostDevice host(8 * MiB);
  CachingAllocator cache(host.device());
  void* p = cache.allocate(64);
  int local = 0;
  try {
    cache.deallocate(&local);
    FAIL() << "a pointer the allocator never handed out was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("was not handed out by this allocator"), std::string::npos)
        << e.what();
  }
  cache.deallocate(p);
  try {
    cache.deallocate(p);
    FAIL() << "a double free was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("was freed already"), std::string::npos) << e.what();
  }
}

// Thousands of random allocations and frees of mixed sizes: every live block is real memory no
// other live block overlaps (each is filled with its own byte and checked when freed), the cached
// and reserved counts add up, and once everything is freed every segment is whole again and goes
// back to the device.
TEST(CachingAllocator, RandomTrafficKeepsBlocksDisjointAndCountsExact) {
  HostDevice host(512 * MiB);
  CachingAllocator cache(host.device());
  std::mt19937_64 rng(7);
  struct Live {
    char* p;
    size_t n;
    unsigned char tag;
  };
  std::vector<Live> live;
  auto check_and_free = [&](size_t i) {
    const Live l = live[i];
    for (size_t k = 0; k < l.n; k += 997)
      ASSERT_EQ(static_cast<unsigned char>(l.p[k]), l.tag) << "block overwritten";
    ASSERT_EQ(static_cast<unsigned char>(l.p[l.n - 1]), l.tag);
    cache.deallocate(l.p);
    live[i] = live.back();
    live.pop_back();
  };
  int64_t live_bytes = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 5 < 3) {
      const int kind = int(rng() % 10);
      const size_t n = kind < 6   ? 1 + rng() % 200000
                       : kind < 9 ? 1 + rng() % (12 * MiB)
                                  : 1 + rng() % (40 * MiB);
      char* p = static_cast<char*>(cache.allocate(n));
      if (!p) continue;  // the budget is full: fine, frees follow
      const unsigned char tag = static_cast<unsigned char>(1 + step % 250);
      std::memset(p, tag, n);
      live.push_back({p, n, tag});
    } else {
      check_and_free(size_t(rng() % live.size()));
      if (HasFatalFailure()) return;
    }
    live_bytes = 0;
    for (const Live& l : live) live_bytes += int64_t(CachingAllocator::block_size(l.n));
    const auto s = cache.stats();
    ASSERT_EQ(s.reserved_bytes, int64_t(host.held));
    // Handed-out blocks may hold an unsplit rest (under 1 MiB each in the large pool).
    ASSERT_GE(s.reserved_bytes - s.cached_bytes, live_bytes);
    ASSERT_LE(s.reserved_bytes - s.cached_bytes, live_bytes + int64_t(live.size() * MiB));
  }
  while (!live.empty()) {
    check_and_free(live.size() - 1);
    if (HasFatalFailure()) return;
  }
  const auto s = cache.stats();
  EXPECT_EQ(s.cached_bytes, s.reserved_bytes);
  cache.release_cached();
  EXPECT_EQ(cache.stats().reserved_bytes, 0);
  EXPECT_EQ(cache.stats().segments, 0);
  EXPECT_TRUE(host.segments.empty());
}
