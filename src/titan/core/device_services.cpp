#include "titan/core/device_services.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "titan/core/caching_allocator.h"
#include "titan/core/check.h"
#include "titan/core/element.h"
#include "titan/core/host_memory.h"

namespace titan {

// ---------------------------------------------------------------- counters

void* DeviceServices::allocate(size_t nbytes) {
  // Counted first: past 8 EiB (only a meta device's step of an absurd size gets there) the request
  // is refused before the device, or its caching allocator, sees it.
  // (The sum in unsigned arithmetic: a signed overflow would be undefined, UBSan says so.)
  const int64_t now = int64_t(uint64_t(current_.fetch_add(int64_t(nbytes))) + uint64_t(nbytes));
  if (now < 0 || nbytes > size_t(INT64_MAX)) {
    current_.fetch_sub(int64_t(nbytes));
    TITAN_FAIL(device_name(device()), " memory: the tensors held at once exceed 2^63 bytes (allocating ",
               nbytes, " bytes)");
  }
  void* p = nullptr;
  try {
    p = raw_allocate(nbytes);
  } catch (...) {
    current_.fetch_sub(int64_t(nbytes));
    throw;
  }
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  count_.fetch_add(1);
  return p;
}

void DeviceServices::deallocate(void* ptr, size_t nbytes) {
  raw_deallocate(ptr, nbytes);
  current_.fetch_sub(int64_t(nbytes));
}

MemoryStats DeviceServices::stats() const {
  return {current_.load(), peak_.load(), reserved_bytes(), count_.load()};
}

void DeviceServices::reset_peak() { peak_.store(current_.load()); }

Scratch::Scratch(const KernelContext& ctx, size_t bytes) : services_(ctx.services), bytes_(bytes) {
  TITAN_CHECK(services_, device_name(ctx.device),
              ": the kernel context has no device services for its scratch");
  ptr_ = services_->allocate(bytes_);
}

// ---------------------------------------------------------------- time marks

// The host clock: CPU kernels have finished when they return, so "now" is when the queued work ran.
void DeviceServices::record_time_mark() {
  time_marks_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

std::vector<double> DeviceServices::take_time_marks() { return std::exchange(time_marks_, {}); }

namespace {

// ---------------------------------------------------------------- cpu

class CpuServices final : public DeviceServices {
 public:
  Device device() const override { return Device::CPU; }
  void release_cached() override { cache_.release_cached(); }
  int64_t capacity_bytes() const override { return host_memory_bytes(); }  // a cgroup's limit binds

  void copy_from_host(void* dst, const void* src, size_t n) override { copy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, size_t n) override { copy(dst, src, n); }
  void copy(void* dst, const void* src, size_t n) override {
    if (n) std::memcpy(dst, src, n);
  }
  void fill(void* dst, int64_t n, DType dtype, double value) override {
    if (value == 0.0 && !std::signbit(value)) {  // -0 keeps its sign bit (the element loop below)
      // Zeroing a model's parameters, gradients and AdamW moments (9 GB for Qwen3-0.6B) is
      // bound by memory bandwidth: every thread takes its share of the stores.
      const size_t bytes = size_t(n) * dtype_size(dtype), chunk = size_t(2) << 20;
      const int64_t chunks = int64_t((bytes + chunk - 1) / chunk);
      char* d = static_cast<char*>(dst);
#pragma omp parallel for schedule(static) if (chunks > 1)
      for (int64_t c = 0; c < chunks; ++c)
        std::memset(d + size_t(c) * chunk, 0, std::min(chunk, bytes - size_t(c) * chunk));
      return;
    }
    for (int64_t i = 0; i < n; ++i) store_element(dst, dtype, i, value);
  }
  void convert(void* dst, DType dd, const void* src, DType sd, int64_t n) override {
    if (dd == sd) return copy(dst, src, size_t(n) * dtype_size(dd));
    if (sd == DType::F32 && dd == DType::BF16)
      return convert_f32_to_bf16(static_cast<const float*>(src), static_cast<bf16*>(dst), size_t(n));
    if (sd == DType::BF16 && dd == DType::F32)
      return convert_bf16_to_f32(static_cast<const bf16*>(src), static_cast<float*>(dst), size_t(n));
    if (sd == DType::I64 && dd == DType::I64) return copy(dst, src, size_t(n) * 8);
    for (int64_t i = 0; i < n; ++i) store_element(dst, dd, i, load_element(src, sd, i));
  }
  void copy_strided(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                    DType dtype, int rank, const int64_t* shape) override {
    // The trailing dimensions both sides hold densely (each stride the product of the sizes after
    // it) move as one block per memcpy: a KV cache's new positions in every row of a batch, a slice
    // of whole rows. The dimensions before them are walked element offset by element offset.
    int outer = rank;
    int64_t block = 1;
    while (outer > 0 && src_strides[outer - 1] == block && dst_strides[outer - 1] == block)
      block *= shape[--outer];
    const size_t block_bytes = size_t(block * int64_t(dtype_size(dtype)));
    const int64_t es = int64_t(dtype_size(dtype));
    std::vector<int64_t> src_off(size_t(numel_of(outer, shape)));
    for_each_strided_offset(outer, shape, src_strides,
                            [&](int64_t lin, int64_t off) { src_off[size_t(lin)] = off; });
    for_each_strided_offset(outer, shape, dst_strides, [&](int64_t lin, int64_t off) {
      // memmove: two views of one buffer may overlap (a row copied onto its neighbour).
      std::memmove(static_cast<char*>(dst) + off * es,
                   static_cast<const char*>(src) + src_off[size_t(lin)] * es, block_bytes);
    });
  }

 protected:
  void* raw_allocate(size_t nbytes) override {
    void* p = cache_.allocate(nbytes);
    // Null only when a new segment was refused (map_segment) even after every cached segment went
    // back. The device counted this request before calling here: the tensors' bytes are the others.
    if (!p)
      throw DeviceOutOfMemory(detail::located(
          __FILE__, __LINE__,
          detail::concat("out of CPU memory allocating ", nbytes, " bytes (",
                         stats().current_bytes - int64_t(nbytes), " bytes in tensors, ", reserved_bytes(),
                         " reserved in segments): ", last_refusal.describe())));
    return p;
  }
  void raw_deallocate(void* ptr, size_t) override {
    cache_.deallocate(ptr);
  }
  int64_t reserved_bytes() const override {
    return cache_.stats().reserved_bytes;
  }

 private:
  // Why map_segment last refused a segment on this thread (the cache calls it on the allocating
  // thread), read by raw_allocate's error; the words are built only then.
  struct Refusal {
    enum Kind { Capacity, Available, Map, Populate } kind = Capacity;
    int64_t bytes = 0, reserved = 0, bound = 0;
    int err = 0;
    std::string describe() const {
      const std::string b = std::to_string(bytes);
      switch (kind) {
        case Capacity:
          return std::to_string(reserved) + " bytes reserved and " + b + " more would pass the " +
                 std::to_string(bound) + " bytes the host lets this process use (its physical memory" +
                 (cgroup_memory_limit() ? ", capped by the cgroup limit of " + cgroup_memory_limit()->file
                                        : "") +
                 ")";
        case Available:
          return "a new " + b + "-byte segment is more than the " + std::to_string(bound) +
                 " bytes available now (" + host_available_name() + ")";
        case Map:
          return "mmap of " + b + " bytes failed: " + std::strerror(err);
        case Populate:
          return "the kernel could not fault in a new " + b + "-byte segment: " + std::strerror(err) + " (" +
                 host_available_name() + ")";
      }
      return "";
    }
  };
  static thread_local Refusal last_refusal;
  void* refuse(Refusal::Kind kind, size_t bytes, int64_t bound = 0, int err = 0) {
    last_refusal = {kind, int64_t(bytes), cache_reserved_, bound, err};
    return nullptr;
  }

  // A segment of fresh pages straight from the kernel, 2 MiB aligned and advised onto transparent
  // huge pages where the kernel offers them ("madvise" mode, Debian's default): a 4 KiB page costs
  // a fault and a TLB entry each, and in a VM faulting in a 0.6B model's 9 GB of state page by page
  // took ~10 s. Segment sizes are multiples of 2 MiB (CachingAllocator), so a segment is whole
  // huge pages.
  // Refused (null) when the reservation would pass the host's memory for this process
  // (capacity_bytes: physical, or a container's cgroup limit), or when the segment is more than the
  // host has available now (host_available_bytes: what other processes, this one's own code and
  // heap, and the cgroup's charges leave; swap is not counted). Where the kernel would kill the
  // process (a cgroup's OOM killer), the job gets an error naming the request and the limit. The
  // cache then returns its free segments and tries once more, so a job whose shapes vary
  // (validation, generation) gives cached memory back first.
  void* map_segment(size_t bytes) {
    constexpr size_t kHugePage = size_t(2) << 20;
    if (cache_reserved_ + int64_t(bytes) > capacity_bytes())
      return refuse(Refusal::Capacity, bytes, capacity_bytes());
    if (const int64_t available = host_available_bytes(); int64_t(bytes) > available)
      return refuse(Refusal::Available, bytes, available);
    void* raw =
        ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return refuse(Refusal::Map, bytes, 0, errno);
    // Trim the mapping to the aligned part: what precedes the 2 MiB boundary and what follows.
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > start)
      TITAN_CHECK(::munmap(raw, aligned - start) == 0, "munmap of a segment's head failed");
    if (const size_t tail = kHugePage - (aligned - start))
      TITAN_CHECK(::munmap(reinterpret_cast<void*>(aligned + bytes), tail) == 0,
                  "munmap of a segment's tail failed");
    void* p = reinterpret_cast<void*>(aligned);
    madvise(p, bytes, MADV_HUGEPAGE);  // advice: without THP the pages are 4 KiB, nothing fails
    // Faulted in now, so that the kernel's available figure, which the next segment is judged by,
    // counts every segment this process holds (a gradient buffer is first written in the first
    // backward, long after its segment was mapped). ENOMEM refuses the segment; a cgroup over its
    // limit kills instead, which the check against host_available_bytes is there to prevent.
    if (const int err = fault_in_pages(p, bytes)) {
      TITAN_CHECK(::munmap(p, bytes) == 0, "munmap of a segment the kernel could not fill failed");
      return refuse(Refusal::Populate, bytes, 0, err);
    }
    cache_reserved_ += int64_t(bytes);
    return p;
  }
  void unmap_segment(void* p, size_t bytes) {
    // munmap of a whole mapping this process made fails only on arguments it never passes.
    TITAN_CHECK(::munmap(p, bytes) == 0, "munmap of a ", bytes, "-byte CPU segment failed");
    cache_reserved_ -= int64_t(bytes);
  }
  // Called by the cache under its lock: one thread at a time.
  int64_t cache_reserved_ = 0;
  // Training frees and re-allocates the same activation sizes every step. The cache keeps freed
  // blocks for the next request (no fault, no zeroing of fresh pages) and its segments apart from
  // glibc's heap: a heap that served them kept ~0.9 GB more resident than the tensors' peak in a
  // MoE step (freed holes it could neither reuse nor return), while the cache's reservation stays
  // within a few percent of the peak, and says so (the metrics line's "reserved").
  CachingAllocator cache_{CachingAllocator::Device{[this](size_t bytes) { return map_segment(bytes); },
                                                   [this](void* p, size_t bytes) { unmap_segment(p, bytes); },
                                                   nullptr}};
};

thread_local CpuServices::Refusal CpuServices::last_refusal;

// ---------------------------------------------------------------- meta

// The bound of the meta device's reservation (MetaMemoryBound; 0: none).
std::atomic<int64_t> g_meta_bound{0};

// No data: every byte is counted, none is held. Pointers are distinct, never dereferenced
// addresses (a kernel that touches one crashes at once, which is the point: nothing may read
// tensor data behind the seam on this device). They come through the caching allocator CUDA uses,
// over an address space with no bound, so a step run here leaves the reserved bytes a GPU's cache
// would hold after the same allocations (the meta kernels allocate the scratch of the device they
// stand in for: MetaStandIn).
class MetaServices final : public DeviceServices {
 public:
  Device device() const override { return Device::Meta; }
  void copy_from_host(void*, const void*, size_t) override {}
  // Values read back from a meta tensor (a loss to log, a norm) are zeros.
  void copy_to_host(void* dst, const void*, size_t n) override {
    if (n) std::memset(dst, 0, n);
  }
  void copy(void*, const void*, size_t) override {}
  void fill(void*, int64_t, DType, double) override {}
  void convert(void*, DType, const void*, DType, int64_t) override {}
  void copy_strided(void*, const int64_t*, const void*, const int64_t*, DType, int, const int64_t*) override {
  }
  void release_cached() override { cache_.release_cached(); }

 protected:
  void* raw_allocate(size_t nbytes) override {
    void* p = cache_.allocate(nbytes);
    if (!p && g_meta_bound.load() > 0)
      throw MetaOutOfMemory(detail::concat(
          "meta memory: ", nbytes, " bytes requested with ", cache_.stats().reserved_bytes,
          " of the bound's ", g_meta_bound.load(), " bytes reserved (every free cached segment returned)"));
    TITAN_CHECK(p, "meta memory: the fake address space (2^63 bytes) is used up allocating ", nbytes,
                " bytes");
    return p;
  }
  void raw_deallocate(void* ptr, size_t) override { cache_.deallocate(ptr); }
  int64_t reserved_bytes() const override { return cache_.stats().reserved_bytes; }

 private:
  // Segments at addresses in the non-canonical x86-64 hole: unique, aligned, and faulting if ever
  // used; refused only past a MetaMemoryBound (a planned step may be larger than any machine), and
  // never reused.
  void* allocate_segment(size_t bytes) {
    const int64_t bound = g_meta_bound.load();
    if (bound > 0 && uint64_t(segments_bytes_) + bytes > uint64_t(bound)) return nullptr;
    const uint64_t p = next_.fetch_add(bytes + 4096);
    // Past the top of the hole (where it starts or ends): refused, not wrapped.
    if (p < 0x8000'0000'0000'0000ull || p > ~uint64_t(0) - bytes) return nullptr;
    segments_bytes_ += int64_t(bytes);
    return reinterpret_cast<void*>(p);
  }
  std::atomic<uint64_t> next_{0x8000'0000'0000'0000ull};
  std::atomic<int64_t> segments_bytes_{0};  // held by the cache's segments
  CachingAllocator cache_{
      CachingAllocator::Device{[this](size_t bytes) { return allocate_segment(bytes); },
                               [this](void*, size_t bytes) { segments_bytes_ -= int64_t(bytes); }, nullptr}};
};

// The CUDA backend's services once its library registered them (read on every CUDA allocation).
std::atomic<DeviceServices*> g_cuda_services{nullptr};

DeviceServices* registered_cuda() { return g_cuda_services.load(std::memory_order_acquire); }

#ifdef TITAN_CUDA_BACKEND_LIBRARY
// Where the CUDA backend library is looked for: TITAN_CUDA_BACKEND when set, else beside the
// libtitan.so this code is in (the build tree's src/titan/, an install's lib/, a bundle's lib/).
std::string cuda_backend_path() {
  if (const char* env = std::getenv("TITAN_CUDA_BACKEND"); env && *env) return env;
  Dl_info info{};
  const bool found = dladdr(reinterpret_cast<void*>(&load_device_backend), &info) != 0 && info.dli_fname;
  const std::filesystem::path self = found ? std::filesystem::path(info.dli_fname) : std::filesystem::path();
  return (self.parent_path() / TITAN_CUDA_BACKEND_LIBRARY).string();
}

// dlopen runs the library's static initialisers, which call register_device_services (and the
// kernel and communicator registries) on this thread.
std::string load_cuda_backend() {
  const std::string path = cuda_backend_path();
  // Never closed: its services, kernels and CUDA runtime live until the process exits.
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    const char* err = dlerror();
    return "the CUDA backend library '" + path + "' could not be loaded (" + (err ? err : "unknown error") +
           "); it is built and installed beside libtitan.so (the environment variable TITAN_CUDA_BACKEND "
           "names another path)";
  }
  if (!registered_cuda()) return "the CUDA backend library '" + path + "' loaded but registered no device services";
  return "";
}
#endif

}  // namespace

namespace {
std::atomic<Device> g_meta_stand_in{Device::CPU};
}  // namespace

Device meta_stands_in_for() {
  return g_meta_stand_in.load();
}

MetaStandIn::MetaStandIn(Device device) : previous_(g_meta_stand_in.load()) {
  TITAN_CHECK(device != Device::Meta, "the meta device cannot stand in for itself");
  g_meta_stand_in.store(device);
}
MetaStandIn::~MetaStandIn() {
  g_meta_stand_in.store(previous_);
}

MetaMemoryBound::MetaMemoryBound(int64_t bytes) : previous_(g_meta_bound.load()) {
  TITAN_CHECK(bytes > 0, "meta memory bound: ", bytes, " bytes (a bound is positive)");
  g_meta_bound.store(bytes);
}
MetaMemoryBound::~MetaMemoryBound() {
  g_meta_bound.store(previous_);
}

void register_device_services(Device device, DeviceServices* services) {
  TITAN_CHECK(device == Device::CUDA, "register_device_services: only the CUDA backend registers itself, got '",
              device_name(device), "'");
  g_cuda_services.store(services, std::memory_order_release);
}

std::string load_device_backend(Device device) {
  if (device != Device::CUDA || registered_cuda()) return "";
#ifdef TITAN_CUDA_BACKEND_LIBRARY
  static std::mutex load_mu;
  static bool tried = false;
  static std::string why;
  std::lock_guard<std::mutex> lock(load_mu);
  if (!tried) {
    why = load_cuda_backend();
    tried = true;
  }
  return why;
#else
  return "this build has no CUDA backend (nvcc was not found when it was built)";
#endif
}

DeviceServices* loaded_device_services(Device device) {
  if (device != Device::CUDA) return &device_services(device);
  return registered_cuda();
}

bool device_available(Device device) {
  if (device != Device::CUDA) return true;
  if (!load_device_backend(device).empty()) return false;
  return registered_cuda()->unavailable_reason().empty();
}

DeviceServices& device_services(Device device) {
  // Never destroyed (as CUDA's): a tensor freed during static destruction returns its block to a
  // live cache, and no segment is unmapped under a tensor still in use.
  static CpuServices* cpu = new CpuServices;
  static MetaServices* meta = new MetaServices;
  switch (device) {
    case Device::CPU:
      return *cpu;
    case Device::Meta:
      return *meta;
    case Device::CUDA: break;
  }
  const std::string not_loaded = load_device_backend(device);
  TITAN_CHECK(not_loaded.empty(), "device 'cuda': ", not_loaded);
  DeviceServices* cuda = registered_cuda();
  const std::string why = cuda->unavailable_reason();
  TITAN_CHECK(why.empty(), "device 'cuda' is unavailable: ", why);
  return *cuda;
}

}  // namespace titan
