#pragma once
// The device seam. Each device (cpu, cuda, meta) provides the same small set of services: memory
// with current / peak / reserved counters, copies between host and device and within a device,
// fill, dtype conversion, strided copies (what `contiguous()` needs), synchronisation, and a
// stream. core/tensor calls only these, never memcpy on a pointer it does not know to be host
// memory; every kernel receives a KernelContext naming its device, stream and services.
//
// Ownership: services live for the whole process (function-local statics); a backend that is
// compiled in but has no device (CUDA without a GPU) reports itself unavailable instead of failing
// at start-up.
//
// Loading: the CPU and meta services are built into libtitan. The CUDA backend (its services, its
// kernels, the NCCL communicator) is a library of its own, libtitan_cuda.so, installed beside
// libtitan.so and loaded with dlopen the first time something asks for Device::CUDA
// (device_services, device_available, load_device_backend): a CPU run never maps the CUDA runtime
// or cuBLAS. Loading runs the library's static registrations (register_device_services, the
// kernel registry, dist::register_device_communicator). A program linked against libtitan_cuda
// itself (the CUDA tests and benchmarks) has it registered before main().
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/device.h"
#include "titan/core/dtype.h"

namespace titan {

struct MemoryStats {
  int64_t current_bytes = 0;      // held by live tensors
  int64_t peak_bytes = 0;         // the most ever held at once (since the last reset_peak)
  int64_t reserved_bytes = 0;     // obtained from the system (>= current with a caching allocator)
  int64_t total_allocations = 0;  // number of allocate() calls
};

class DeviceServices;

// What a kernel gets besides its arguments: where it runs and on which stream. Kernels that need
// temporary memory allocate it through `services` (counted like every other byte). Every context
// comes from DeviceServices::context(), so its stream is the services' own, on which their copies,
// fills and converts queue too: a kernel may mix both (a context on another stream would need
// events between them).
struct KernelContext {
  Device device = Device::CPU;
  void* stream = nullptr;  // cudaStream_t on CUDA; null on CPU and meta
  DeviceServices* services = nullptr;
};

class DeviceServices {
 public:
  virtual ~DeviceServices() = default;
  virtual Device device() const = 0;
  // Empty when usable, else why not ("no CUDA device found", "built without CUDA").
  virtual std::string unavailable_reason() const { return ""; }
  // One line for logs: "cpu", "NVIDIA H200, sm_90, 139.8 GiB", ...
  virtual std::string description() const { return std::string(device_name(device())); }
  // Memory the device has in all (the metrics line's percentage); 0 when it has no such bound.
  virtual int64_t capacity_bytes() const { return 0; }
  // Dense peak of the device's matrix units for `dtype` in FLOP/s (the MFU denominator); 0 when the
  // backend does not know it (metrics.peak_tflops then decides; train/mfu_peak.h says which is used).
  virtual double peak_flops(DType dtype) const { return 0; }
  // (component, version) pairs of the runtime behind the device for `titan version` and the
  // start-up log, e.g. {"CUDA", "runtime 13.0, driver 13.0"}, {"GPU", "1 x NVIDIA H200, ..."};
  // never fails, also when the device is unavailable.
  virtual std::vector<std::pair<std::string, std::string>> versions() const { return {}; }

  // Memory. allocate(0) returns a valid, unique pointer; deallocate takes the same byte count.
  void* allocate(size_t nbytes);
  void deallocate(void* ptr, size_t nbytes);
  MemoryStats stats() const;
  void reset_peak();
  // Every device's freed memory stays reserved in a cache (core/caching_allocator.h: the CPU's and
  // CUDA's segments, and meta, which replays the policy so a planned step can say what a device
  // would reserve); release_cached() returns that cache to the system (PyTorch's empty_cache), the
  // bytes in live tensors stay.
  virtual void release_cached() = 0;

  // Copies of raw bytes. copy_to_host/copy_from_host move between this device and host memory;
  // `copy` stays on this device. All are ordered on the device's stream; copy_to_host returns when
  // the bytes are on the host.
  virtual void copy_from_host(void* dst, const void* host_src, size_t nbytes) = 0;
  virtual void copy_to_host(void* host_dst, const void* src, size_t nbytes) = 0;
  virtual void copy(void* dst, const void* src, size_t nbytes) = 0;

  // Elementwise work that core/tensor needs on any device:
  //   fill:    n elements of `dtype` set to `value` (converted as Tensor::full documents);
  //   convert: n elements from src_dtype to dst_dtype (bf16 rounds to nearest even);
  //   copy_strided: copies a strided view into another of the same shape and dtype (shape and
//                 strides in elements, rank <= 8; either side may be contiguous): what
//                 contiguous() and writes into narrowed views need.
  virtual void fill(void* dst, int64_t n, DType dtype, double value) = 0;
  virtual void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) = 0;
  virtual void copy_strided(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides,
                            DType dtype, int rank, const int64_t* shape) = 0;

  // Work counter: the meta device's kernels add the floating-point operations their op would do,
  // so a meta run of a training step yields its FLOPs. Other devices leave it at zero.
  void add_flops(double flops) { flops_.fetch_add(flops); }
  double flops() const { return flops_.load(); }
  void reset_flops() { flops_.store(0); }

  // Host reads: how often the host took a value this device computed (a copy to the host,
  // Tensor::item / to_vector, a scalar an index or reduction kernel returns). On a GPU each one
  // waits for the stream's queue to drain; the CPU counts the same places, so a test on any machine
  // sees how many a training step makes.
  void count_host_read() { host_reads_.fetch_add(1); }
  int64_t host_reads() const { return host_reads_.load(); }

  virtual void synchronize() {}
  virtual void* stream() { return nullptr; }

  // The op profiler's clock (core/op_timeline.h). record_time_mark() notes the moment the work
  // queued so far has run (CPU and meta: now; CUDA: an event on the stream). take_time_marks()
  // waits for the last mark and returns each one's time in seconds (any origin; differences are
  // what count), then forgets them.
  virtual void record_time_mark();
  virtual std::vector<double> take_time_marks();
  KernelContext context() { return KernelContext{device(), stream(), this}; }

 protected:
  // The device's raw memory, without counting (the counters above wrap these).
  virtual void* raw_allocate(size_t nbytes) = 0;
  virtual void raw_deallocate(void* ptr, size_t nbytes) = 0;
  // Bytes obtained from the system: the caching allocator's segments.
  virtual int64_t reserved_bytes() const = 0;

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, count_{0}, host_reads_{0};
  std::atomic<double> flops_{0};
  std::vector<double> time_marks_;  // the host clock's marks (CPU, meta)
};

// A kernel's scratch memory from its device's allocator, so the memory figures (the metrics line's
// memory, the peak) count it as they count tensors; given back when it goes out of scope (on a GPU
// in stream order: the caching allocator reuses a block only for work queued after that point on
// the same stream). Its contents start undefined: zero it where the kernel relies on zeros.
class Scratch {
 public:
  Scratch(const KernelContext& ctx, size_t bytes);
  ~Scratch() { services_->deallocate(ptr_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  DeviceServices* services_;
  size_t bytes_;
  void* ptr_;
};

// The meta device standing in for a real one: while a MetaStandIn is alive (a step planned for
// that device: train::profile_training_step), the meta kernels allocate the scratch that device's
// default kernels hold while they run (CUDA's attention row terms, MoE routing and expert buffers,
// its fused loss' chunk buffers), so the planned peak and reservation are that device's, not the
// CPU's. The CPU when none is alive. One at a time per process (the planner is single-threaded).
Device meta_stands_in_for();
class MetaStandIn {
 public:
  explicit MetaStandIn(Device device);
  ~MetaStandIn();
  MetaStandIn(const MetaStandIn&) = delete;
  MetaStandIn& operator=(const MetaStandIn&) = delete;

 private:
  Device previous_;
};

// A device's caching allocator refused a request even after returning its cached segments (the
// CPU: the host has no memory left for this process; a GPU: cudaMalloc failed). The trainer adds
// what would shrink the step.
class DeviceOutOfMemory : public Error {
 public:
  using Error::Error;
};

// The meta device's memory bounded as a GPU's is: while a MetaMemoryBound is alive, the meta
// device's caching allocator is refused any segment that would take its reservation past `bytes`,
// and then, as on the GPU, returns its wholly free cached segments and tries once more; a request
// refused even then throws MetaOutOfMemory (the step would fail with CUDA's out-of-memory error).
// So a planned step fits a GPU exactly when its replay under the bound completes. One at a time
// per process (the planner is single-threaded).
class MetaOutOfMemory : public Error {
 public:
  using Error::Error;
};
class MetaMemoryBound {
 public:
  explicit MetaMemoryBound(int64_t bytes);
  ~MetaMemoryBound();
  MetaMemoryBound(const MetaMemoryBound&) = delete;
  MetaMemoryBound& operator=(const MetaMemoryBound&) = delete;

 private:
  int64_t previous_;
};

// The workspace the CUDA backend's cuBLASLt GEMMs hold from the process' first GEMM on (what
// Hopper's split-K and stream-K plans may ask for); a planned CUDA step counts it.
constexpr size_t kCudaGemmWorkspaceBytes = size_t(32) << 20;

// The services of a device (loading its backend library first if it has one); an error naming
// the device and the reason when it cannot be loaded or is unavailable.
DeviceServices& device_services(Device device);
bool device_available(Device device);  // loads the backend library like device_services

// Loads the backend library of `device` unless its services are registered already. Empty when
// they are (now), else why not: a build without that backend, or the library that was looked for
// and the dynamic loader's error. Tried once per process; later calls return the same answer.
// The library is looked for beside libtitan.so, or at the path in the environment variable
// TITAN_CUDA_BACKEND when set.
std::string load_device_backend(Device device);

// The services of `device` when they are in this process (built in, or the backend library
// loaded), else null; loads nothing and checks no availability (versions, tests of the loader).
DeviceServices* loaded_device_services(Device device);

// A backend library (CUDA) registers its services from a static initialiser when it is loaded;
// core never includes backend headers.
void register_device_services(Device device, DeviceServices* services);

}  // namespace titan
