#include "titan/core/tensor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"

using namespace titan;

TEST(Tensor, ViewsShareStorageAndContiguousCopies) {
  Tensor t = Tensor::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tt = t.transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.storage(), t.storage());
  EXPECT_EQ(tt.contiguous().to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  Tensor row = t.narrow(0, 1, 1);
  EXPECT_EQ(row.to_vector(), (std::vector<double>{3, 4, 5}));
  Tensor col = t.narrow(1, 2, 1);
  EXPECT_EQ(col.to_vector(), (std::vector<double>{2, 5}));
  Tensor e = Tensor::from_vector(std::vector<float>{7, 8}, {2, 1}).expand({2, 3});
  EXPECT_EQ(e.to_vector(), (std::vector<double>{7, 7, 7, 8, 8, 8}));
  EXPECT_EQ(t.reshape({3, -1}).shape(), (Shape{3, 2}));
}

TEST(Tensor, ReshapeOfNonContiguousIsAnErrorNamingShapes) {
  Tensor t = Tensor::zeros({2, 3}, DType::F32).transpose(0, 1);
  try {
    t.reshape({6});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32[3, 2]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor.cpp:"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::zeros({2, 3}, DType::F32).reshape({4, 2}), Error);
}

// Bad shapes and dims: the error names the function called and the value as the caller wrote it.
TEST(Tensor, BadShapesAndDimsAreErrorsNamingTheCallAndValue) {
  auto message_of = [](auto&& make) -> std::string {
    try {
      make();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string negative = message_of([] { Tensor::from_vector(std::vector<float>(6), {-2, -3}); });
  EXPECT_NE(negative.find("Tensor::from_vector: dimension 0 of shape [-2, -3] is negative"),
            std::string::npos)
      << negative;
  const std::string count = message_of([] { Tensor::from_vector(std::vector<float>(5), {2, 3}); });
  EXPECT_NE(count.find("5 values for shape [2, 3] of 6 elements"), std::string::npos) << count;
  const std::string empty = message_of([] { Tensor::zeros({4, -1}, DType::F32); });
  EXPECT_NE(empty.find("Tensor::empty: dimension 1 of shape [4, -1] is negative"), std::string::npos)
      << empty;
  const Tensor t = Tensor::zeros({2, 3}, DType::F32);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.size(-2), 2);
  const std::string range = message_of([&] { t.size(-9); });
  EXPECT_NE(range.find("size(-9) out of range for tensor f32[2, 3] of 2 dims"), std::string::npos) << range;
}

// Views and sizes past what the memory holds are refused before any address is formed: a negative
// size in reshape or expand, a narrow whose start + length would overflow, and a shape whose byte
// count wraps an int64 (2^61 f64 elements would have sat on 0 bytes).
TEST(Tensor, ViewsAndSizesPastTheirBoundsAreErrors) {
  const Tensor t = Tensor::zeros({6}, DType::F32);
  std::string e = titan::testing::error_of([&] { t.reshape({-2, -3}); });
  EXPECT_NE(e.find("reshape: dimension 0 of [-2, -3] is negative"), std::string::npos) << e;
  e = titan::testing::error_of([&] { Tensor::zeros({1}, DType::F32).expand({-5}); });
  EXPECT_NE(e.find("expand: dimension 0 of shape [-5] is negative"), std::string::npos) << e;
  e = titan::testing::error_of(
      [&] { Tensor::zeros({4}, DType::F32).narrow(0, 2, std::numeric_limits<int64_t>::max()); });
  EXPECT_NE(e.find("narrow: start 2, length 9223372036854775807 out of range for dim 0 of f32[4]"),
            std::string::npos)
      << e;
  EXPECT_EQ(Tensor::zeros({4}, DType::F32).narrow(0, 4, 0).numel(), 0);
  e = titan::testing::error_of([] { Tensor::empty({int64_t(1) << 61}, DType::F64, Device::Meta); });
  EXPECT_NE(
      e.find("Tensor::released: shape [2305843009213693952] of f64 holds more bytes than an int64 counts"),
      std::string::npos)
      << e;
  // An empty tensor with huge other dimensions: no overflow in its strides.
  const Tensor empty = Tensor::empty({0, int64_t(1) << 62, int64_t(1) << 62}, DType::F32);
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_TRUE(empty.is_contiguous());
}

TEST(Tensor, DtypeConversionsRoundTrip) {
  Tensor t = Tensor::from_vector(std::vector<float>{1.0f, -2.5f, 3.140625f, 65504.0f}, {4});
  for (DType d : {DType::F64, DType::BF16, DType::F16, DType::I64}) {
    Tensor back = t.to(d).to(DType::F32);
    auto v = back.to_vector();
    EXPECT_EQ(v[0], 1.0);
    if (d == DType::I64) continue;
    EXPECT_EQ(v[1], -2.5) << dtype_name(d);
  }
  // bf16 rounding is to nearest even.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);       // halfway, rounds to even
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);  // halfway, rounds up to even
}

// Every floating dtype, NaN and infinities in the first chunk, past it and at the last element, with
// the dtype's largest finite values and a subnormal that must not count.
// A fill with -0 keeps the sign bit in every floating dtype (as torch.full does, and as the CUDA
// fill writes it); +0 is all-zero bytes.
TEST(Tensor, FullOfNegativeZeroKeepsTheSignBit) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const Tensor neg = Tensor::full({5}, -0.0, t), pos = Tensor::full({5}, 0.0, t);
    for (double v : neg.to_vector()) {
      EXPECT_EQ(v, 0.0);
      EXPECT_TRUE(std::signbit(v));
    }
    const auto* bytes = static_cast<const unsigned char*>(pos.raw_data());
    EXPECT_TRUE(std::all_of(bytes, bytes + pos.nbytes(), [](unsigned char b) { return b == 0; }));
  }
}

TEST(Dtype, FirstNonFiniteFindsNanAndInfinityInEveryFloatingType) {
  const float kInf = std::numeric_limits<float>::infinity(), kNan = std::numeric_limits<float>::quiet_NaN();
  const int64_t n = 10000;
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const float largest = d == DType::F16 ? 65504.0f : d == DType::BF16 ? 3.3895314e38f : 3.4028235e38f;
    std::vector<float> base(size_t(n), 1.5f);
    base[7] = largest;
    base[8] = -largest;
    base[9] = 1e-42f;  // subnormal in f32 (zero or subnormal after narrowing)
    EXPECT_EQ(first_non_finite(Tensor::from_vector(base, {n}).to(d).raw_data(), n, d), -1) << dtype_name(d);
    for (int64_t at : {int64_t(0), int64_t(5000), n - 1})
      for (float bad : {kNan, kInf, -kInf}) {
        std::vector<float> v = base;
        v[size_t(at)] = bad;
        if (at != n - 1) v[size_t(n - 1)] = kNan;  // a later one: the first is the answer
        EXPECT_EQ(first_non_finite(Tensor::from_vector(v, {n}).to(d).raw_data(), n, d), at)
            << dtype_name(d) << " " << bad << " at " << at;
      }
  }
  EXPECT_THROW(first_non_finite(nullptr, 0, DType::I32), Error);
}

TEST(Allocator, CountsCurrentAndPeakBytes) {
  DeviceServices& a = device_services(Device::CPU);
  int64_t before = a.stats().current_bytes;
  a.reset_peak();
  {
    Tensor t = Tensor::empty({1024, 1024}, DType::F32);
    EXPECT_EQ(a.stats().current_bytes - before, 4 << 20);
  }
  EXPECT_EQ(a.stats().current_bytes, before);
  EXPECT_GE(a.stats().peak_bytes - before, 4 << 20);
}

// The CPU's tensors come from the caching allocator CUDA uses (core/caching_allocator.h), over
// segments mapped from the kernel: a freed block stays reserved and serves the next request of its
// size, release_cached() returns the wholly free segments, and a request the machine's memory
// cannot hold is an error naming it, after which the allocator still serves.
TEST(Allocator, CpuBlocksComeFromCachedSegments) {
  constexpr size_t MiB = size_t(1) << 20;
  DeviceServices& a = device_services(Device::CPU);
  a.release_cached();
  const MemoryStats before = a.stats();
  // Mapping a segment reads the host's memory figures (cgroup files through std::filesystem, which
  // raises "inexact"): the caller's floating-point flags stay as they were.
  std::feclearexcept(FE_ALL_EXCEPT);
  void* p = a.allocate(40 * MiB);  // a segment of its own (past the 20 MiB segments' 10 MiB)
  EXPECT_EQ(std::fetestexcept(FE_ALL_EXCEPT), 0);
  const MemoryStats held = a.stats();
  EXPECT_EQ(held.reserved_bytes - before.reserved_bytes, int64_t(40 * MiB));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (uintptr_t(2) << 20), 0u) << "segments start on a huge page";
  static_cast<char*>(p)[40 * MiB - 1] = 1;  // the whole block is writable memory
  a.deallocate(p, 40 * MiB);
  EXPECT_EQ(a.stats().current_bytes, before.current_bytes);
  EXPECT_EQ(a.stats().reserved_bytes, held.reserved_bytes) << "a freed block stays cached";
  void* q = a.allocate(40 * MiB);
  EXPECT_EQ(q, p) << "the same size again comes from the cache";
  EXPECT_EQ(a.stats().reserved_bytes, held.reserved_bytes);
  a.deallocate(q, 40 * MiB);
  a.release_cached();
  EXPECT_EQ(a.stats().reserved_bytes, before.reserved_bytes);

  const int64_t machine = a.capacity_bytes();
  ASSERT_GT(machine, 0);
  const std::string e = titan::testing::error_of([&] { a.allocate(size_t(machine) + MiB); });
  EXPECT_NE(e.find("out of CPU memory allocating " + std::to_string(size_t(machine) + MiB) + " bytes"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("would pass the " + std::to_string(machine) + " bytes the host lets this process use"),
            std::string::npos)
      << e;
  EXPECT_EQ(a.stats().current_bytes, before.current_bytes) << "a refused request is not counted";
  Tensor after = Tensor::full({1000}, 2.0, DType::F32);
  EXPECT_EQ(after.data<float>()[999], 2.0f);
}

// Large CPU buffers are zeroed in parallel 2 MiB chunks: every byte of a buffer that ends mid-chunk
// is zero, even where the cache handed back a block a freed buffer had written.
TEST(Allocator, LargeBuffersAreZeroedToTheLastByte) {
  const int64_t n = (int64_t(5) << 20) / 4 + 13;  // 5 MiB + 52 bytes of f32: two full chunks and a tail
  const void* dirty_at = nullptr;
  {
    Tensor dirty = Tensor::full({n}, 7.0, DType::F32);
    dirty_at = dirty.raw_data();
  }
  Tensor t = Tensor::zeros({n}, DType::F32);
  EXPECT_EQ(t.raw_data(), dirty_at) << "the freed block is reused";
  const float* v = t.data<float>();
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; ++i) nonzero += v[i] != 0.0f;
  EXPECT_EQ(nonzero, 0);
  // Every block keeps at least 512-byte alignment (AVX-512 loads, cache lines).
  Tensor small = Tensor::zeros({100}, DType::F32);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.raw_data()) % 512, 0u);
}
