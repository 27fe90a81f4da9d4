// The CUDA device services (backend/cuda/device_services.cu) against the CPU's: the caching
// allocator's counters and block reuse, host <-> device copies (small ones direct, large ones
// through the pinned staging buffers), and the fill / convert / strided-copy kernels, whose bytes
// must equal what core/tensor produces on the CPU for every dtype. Skips without a GPU.
#include <gtest/gtest.h>

#ifndef TITAN_HAVE_CUDA
TEST(CudaServices, NeedsTheCudaBackend) {
  GTEST_SKIP() << "built without the CUDA backend (TITAN_CUDA off, or no nvcc)";
}
#else

#include <cuda_runtime.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "titan/backend/cuda/device.h"
#include "titan/core/device_services.h"
#include "titan/core/tensor.h"

namespace titan {
namespace {

const DType kAllDtypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                            DType::I32, DType::I64, DType::U8};

// Device memory owned for the scope of a test.
struct DeviceBuffer {
  DeviceServices& s;
  size_t n;
  void* p;
  DeviceBuffer(DeviceServices& services, size_t bytes) : s(services), n(bytes), p(services.allocate(bytes)) {}
  ~DeviceBuffer() { s.deallocate(p, n); }
};

std::vector<unsigned char> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  std::vector<unsigned char> b(c.nbytes());
  std::memcpy(b.data(), c.raw_data(), b.size());
  return b;
}

std::vector<unsigned char> device_bytes(DeviceServices& s, const void* p, size_t n) {
  std::vector<unsigned char> b(n);
  s.copy_to_host(b.data(), p, n);
  return b;
}

// Values every dtype holds without undefined conversions (0..200), with fractions that bf16 and
// f16 must round.
Tensor random_values(int64_t n, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 200.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng);
  return Tensor::from_vector(v, {n}, DType::F64).to(dtype);
}

TEST(CudaServices, DescribesTheDevice) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  const std::string d = s.description();
  EXPECT_NE(d.find(", sm_"), std::string::npos) << d;
  EXPECT_GT(s.capacity_bytes(), int64_t(1) << 30) << d;
  // The MFU denominator is the datasheet's figure for the device's own name (the H200: 989.4).
  cudaDeviceProp p{};
  ASSERT_EQ(cudaGetDeviceProperties(&p, 0), cudaSuccess);
  EXPECT_EQ(s.peak_flops(DType::BF16), cuda::datasheet_peak_flops(p.name, DType::BF16)) << d;
  EXPECT_EQ(s.peak_flops(DType::F32), cuda::datasheet_peak_flops(p.name, DType::F32)) << d;
  if (std::string(p.name) == "NVIDIA H200") {
    EXPECT_EQ(s.peak_flops(DType::BF16), 989.4e12);
  }
}

TEST(CudaServices, AllocatorCountsAndReusesBlocks) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  const MemoryStats before = s.stats();
  void* a = s.allocate(1000);
  void* b = s.allocate(3 << 20);
  const MemoryStats mid = s.stats();
  EXPECT_EQ(mid.current_bytes - before.current_bytes, 1000 + (3 << 20));
  EXPECT_GE(mid.peak_bytes, mid.current_bytes);
  EXPECT_GE(mid.reserved_bytes, mid.current_bytes);
  EXPECT_EQ(mid.total_allocations - before.total_allocations, 2);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 256, 0u) << "blocks must be 256-byte aligned for vector loads";
  s.deallocate(b, 3 << 20);
  EXPECT_EQ(s.stats().current_bytes - before.current_bytes, 1000);
  EXPECT_EQ(s.stats().reserved_bytes, mid.reserved_bytes) << "a freed block stays cached";
  // The same size again comes from the cache: nothing new is reserved.
  void* c = s.allocate(3 << 20);
  EXPECT_EQ(c, b);
  EXPECT_EQ(s.stats().reserved_bytes, mid.reserved_bytes);
  s.deallocate(c, 3 << 20);
  s.deallocate(a, 1000);
  EXPECT_EQ(s.stats().current_bytes, before.current_bytes);
  // allocate(0) gives distinct valid pointers.
  void* z0 = s.allocate(0);
  void* z1 = s.allocate(0);
  EXPECT_NE(z0, nullptr);
  EXPECT_NE(z0, z1);
  s.deallocate(z0, 0);
  s.deallocate(z1, 0);
  s.reset_peak();
  EXPECT_EQ(s.stats().peak_bytes, s.stats().current_bytes);
}

TEST(CudaServices, OutOfMemoryIsAClearErrorAndTheAllocatorStaysUsable) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  const MemoryStats before = s.stats();
  const size_t too_much = size_t(1) << 44;  // 16 TiB
  try {
    s.allocate(too_much);
    FAIL() << "a 16 TiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of CUDA memory allocating 17592186044416 bytes"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(s.stats().current_bytes, before.current_bytes);
  Tensor t = Tensor::full({1000}, 2.5, DType::F32, Device::CUDA);
  EXPECT_EQ(t.to_vector(), std::vector<double>(1000, 2.5));
}

TEST(CudaServices, TensorsMoveBetweenHostAndDevice) {
  TITAN_REQUIRE_CUDA();
  Tensor host = random_values(3 * 1000 * 700, DType::F32, 3).reshape({3, 1000, 700});  // 8 MiB: staged
  Tensor dev = host.to(Device::CUDA);
  EXPECT_EQ(dev.device(), Device::CUDA);
  Tensor back = dev.transpose(0, 2).contiguous().to(Device::CPU);  // a strided copy on the device
  EXPECT_EQ(bytes_of(back), bytes_of(host.transpose(0, 2)));
  EXPECT_EQ(dev.to(DType::BF16).to(Device::CPU).to_vector(), host.to(DType::BF16).to_vector());
}

TEST(CudaServices, CopiesRoundTripSmallAndStaged) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  // 1 KiB goes directly; 21 MiB + 3 bytes crosses both staging buffers several times, odd tail.
  for (size_t n : {size_t(1024), size_t(21u << 20) + 3}) {
    std::vector<unsigned char> host(n);
    std::mt19937 rng{uint32_t(n)};
    for (auto& b : host) b = static_cast<unsigned char>(rng());
    DeviceBuffer d1(s, n), d2(s, n);
    s.copy_from_host(d1.p, host.data(), n);
    s.copy(d2.p, d1.p, n);
    EXPECT_EQ(device_bytes(s, d2.p, n), host) << n << " bytes host -> device -> device -> host";
  }
}

TEST(CudaServices, FillMatchesCpuForEveryDtype) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  const int64_t n = 100003;
  for (DType t : kAllDtypes)
    for (double v : {0.0, -0.0, 1.0, 3.14159, 200.7}) {  // +0 is a memset, -0 the fill kernel
      DeviceBuffer d(s, size_t(n) * dtype_size(t));
      s.fill(d.p, n, t, v);
      EXPECT_EQ(device_bytes(s, d.p, d.n), bytes_of(Tensor::full({n}, v, t)))
          << dtype_name(t) << " fill " << v;
    }
}

TEST(CudaServices, ConvertMatchesCpuForEveryDtypePair) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  const int64_t n = 4099;
  for (DType from : kAllDtypes) {
    Tensor src = random_values(n, from, 7);
    DeviceBuffer dsrc(s, src.nbytes());
    s.copy_from_host(dsrc.p, src.raw_data(), src.nbytes());
    for (DType to : kAllDtypes) {
      DeviceBuffer ddst(s, size_t(n) * dtype_size(to));
      s.convert(ddst.p, to, dsrc.p, from, n);
      EXPECT_EQ(device_bytes(s, ddst.p, ddst.n), bytes_of(src.to(to)))
          << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

// The f32 <-> bf16 casts take four elements a thread where both sides are aligned for it and the
// scalar kernel elsewhere (views starting mid-block, lengths not a multiple of 4): every start and
// length gives the CPU's bits, rounding ties, infinities, NaN, -0 and subnormals included.
TEST(CudaServices, F32Bf16CastsAtAnyAlignmentAndLength) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.5f, 1.00390625f /* a tie */, 1.01171875f /* a tie */,
                               3.0e38f, -3.4e38f, 1e-40f /* subnormal */, -1e-45f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 3.f);
  while (values.size() < 4107) values.push_back(normal(rng));
  const Tensor f32 = Tensor::from_vector(values, {int64_t(values.size())});
  const Tensor bf16 = f32.to(DType::BF16);
  DeviceBuffer df32(s, f32.nbytes()), dbf16(s, bf16.nbytes()), out(s, f32.nbytes());
  s.copy_from_host(df32.p, f32.raw_data(), f32.nbytes());
  s.copy_from_host(dbf16.p, bf16.raw_data(), bf16.nbytes());
  for (int64_t n : {1, 3, 4, 5, 8, 4099})
    for (int64_t from : {0, 1, 2, 3})
      for (int64_t to : {0, 1, 3}) {
        const Tensor want_bf16 = f32.narrow(0, from, n).to(DType::BF16);
        s.convert(static_cast<uint16_t*>(out.p) + to, DType::BF16, static_cast<const float*>(df32.p) + from,
                  DType::F32, n);
        EXPECT_EQ(device_bytes(s, static_cast<uint16_t*>(out.p) + to, size_t(n) * 2), bytes_of(want_bf16))
            << "f32 -> bf16, n " << n << ", source at " << from << ", destination at " << to;
        const Tensor want_f32 = bf16.narrow(0, from, n).to(DType::F32);
        s.convert(static_cast<float*>(out.p) + to, DType::F32, static_cast<const uint16_t*>(dbf16.p) + from,
                  DType::BF16, n);
        EXPECT_EQ(device_bytes(s, static_cast<float*>(out.p) + to, size_t(n) * 4), bytes_of(want_f32))
            << "bf16 -> f32, n " << n << ", source at " << from << ", destination at " << to;
      }
}

TEST(CudaServices, CopyStridedGathersAndScattersLikeTheCpu) {
  TITAN_REQUIRE_CUDA();
  DeviceServices& s = device_services(Device::CUDA);
  for (DType t : {DType::U8, DType::BF16, DType::F32, DType::I64}) {
    const int64_t es = int64_t(dtype_size(t));
    Tensor base = random_values(3 * 5 * 7 * 4, t, 11).reshape({3, 5, 7, 4});
    DeviceBuffer d(s, base.nbytes());
    s.copy_from_host(d.p, base.raw_data(), base.nbytes());
    // Gather: a permuted, narrowed view and a broadcast one into contiguous memory.
    Tensor view = base.transpose(1, 3).narrow(2, 1, 5).narrow(0, 1, 2);
    Tensor expanded = base.narrow(1, 2, 1).expand({3, 6, 7, 4});
    for (const Tensor& v : {view, expanded}) {
      DeviceBuffer out(s, v.nbytes());
      const Shape dense = contiguous_strides(v.shape());
      s.copy_strided(out.p, dense.data(), static_cast<const char*>(d.p) + v.offset() * es, v.strides().data(),
                     t, int(v.dim()), v.shape().data());
      EXPECT_EQ(device_bytes(s, out.p, out.n), bytes_of(v))
          << dtype_name(t) << " gather " << shape_str(v.shape());
    }
    // Scatter: contiguous values written into the permuted view of the device copy.
    Tensor values = random_values(view.numel(), t, 12).reshape(view.shape());
    DeviceBuffer src(s, values.nbytes());
    s.copy_from_host(src.p, values.raw_data(), values.nbytes());
    const Shape dense = contiguous_strides(view.shape());
    s.copy_strided(static_cast<char*>(d.p) + view.offset() * es, view.strides().data(), src.p, dense.data(),
                   t, int(view.dim()), view.shape().data());
    Tensor expected = base.clone();
    Tensor target = expected.transpose(1, 3).narrow(2, 1, 5).narrow(0, 1, 2);
    target.copy_from(values);
    EXPECT_EQ(device_bytes(s, d.p, d.n), bytes_of(expected)) << dtype_name(t) << " scatter";
  }
}

}  // namespace
}  // namespace titan

#endif  // TITAN_HAVE_CUDA
