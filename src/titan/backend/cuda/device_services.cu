// CudaDeviceServices: Device::CUDA's memory, copies, fill/convert/strided-copy kernels and stream.
//
// Allocation: core/caching_allocator.h over cudaMalloc (cudaMalloc and cudaFree synchronise the
// whole device and cost tens of microseconds, and a training step frees and re-allocates the same
// activation sizes every step): segments split into blocks, freed blocks merged and reused, cached
// segments returned only when cudaMalloc fails; then the error names the request and the current
// / reserved bytes.
// Every kernel and copy runs on the one compute stream, so a block freed on the host side can be
// reused at once: the work that used it is ordered before any work that reuses it.
//
// Host copies: small ones go straight through cudaMemcpyAsync; large ones through two pinned
// staging buffers, so the CPU copy of one chunk overlaps the DMA of the other (pageable copies are
// staged by the driver one synchronous chunk at a time).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "titan/backend/cuda/common.cuh"
#include "titan/backend/cuda/cuda_services.h"
#include "titan/backend/cuda/cudnn_graph.h"
#include "titan/backend/cuda/device.h"
#include "titan/core/caching_allocator.h"
#include "titan/core/check.h"
#include "titan/core/device_services.h"

namespace titan::cuda {

void check(int err, const char* what, const char* file, int line) {
  if (err == int(cudaSuccess)) return;
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  detail::throw_error(file, line,
                      detail::concat("CUDA error in ", what, ": ", cudaGetErrorName(cudaError_t(err)), " (",
                                     cudaGetErrorString(cudaError_t(err)), ")"));
}

namespace {

constexpr size_t kStagingBytes = 8u << 20;    // one pinned staging buffer
constexpr size_t kStagedCopyMin = 1u << 20;   // host copies at least this large go through staging

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// ---- fill / convert / strided-copy kernels -------------------------------------------------------

// fill: writes a bit pattern of the element size (the value is converted on the host exactly as
// Tensor::fill converts it on the CPU).
template <class Bits>
__global__ void fill_kernel(Bits* dst, int64_t n, Bits value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

// Element loads and stores through double, as core/tensor.cpp's load_as_double / store_from_double
// (f64 -> bf16 / f16 goes through f32 first, as there).
template <DType T> struct Elem;
template <> struct Elem<DType::F32> { using type = float; };
template <> struct Elem<DType::F64> { using type = double; };
template <> struct Elem<DType::BF16> { using type = uint16_t; };
template <> struct Elem<DType::F16> { using type = __half; };
template <> struct Elem<DType::I32> { using type = int32_t; };
template <> struct Elem<DType::I64> { using type = int64_t; };
template <> struct Elem<DType::U8> { using type = uint8_t; };

template <DType T>
__device__ double load_as_double(const typename Elem<T>::type* p, int64_t i) {
  if constexpr (T == DType::BF16) return bf16_to_f32(p[i]);
  else if constexpr (T == DType::F16) return __half2float(p[i]);
  else return double(p[i]);
}
template <DType T>
__device__ void store_from_double(typename Elem<T>::type* p, int64_t i, double v) {
  if constexpr (T == DType::BF16) p[i] = f32_to_bf16(float(v));
  else if constexpr (T == DType::F16) p[i] = __float2half_rn(float(v));
  else p[i] = typename Elem<T>::type(v);
}

// Direct paths for the conversions training does every step, so they are exact f32 arithmetic
// and no double round trip (the results are the same).
template <DType S, DType D>
__global__ void convert_kernel(typename Elem<D>::type* __restrict__ dst, const typename Elem<S>::type* __restrict__ src,
                               int64_t n) {
#pragma unroll 4
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (S == DType::F32 && D == DType::BF16) dst[i] = f32_to_bf16(src[i]);
    else if constexpr (S == DType::BF16 && D == DType::F32) dst[i] = bf16_to_f32(src[i]);
    else store_from_double<D>(dst, i, load_as_double<S>(src, i));
  }
}

// The two casts of every bf16 training step (weights to bf16, bf16 gradients to f32), four elements
// a thread: one 16-byte access on the f32 side, one 8-byte access on the bf16 side (the scalar
// kernel moves 2-4 bytes per access and reaches a fraction of the bandwidth). Same rounding.
__global__ void f32_to_bf16_x4_kernel(uint2* __restrict__ dst, const float4* __restrict__ src, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    dst[i] = make_uint2(uint32_t(f32_to_bf16(v.x)) | uint32_t(f32_to_bf16(v.y)) << 16,
                        uint32_t(f32_to_bf16(v.z)) | uint32_t(f32_to_bf16(v.w)) << 16);
  }
}
__global__ void bf16_to_f32_x4_kernel(float4* __restrict__ dst, const uint2* __restrict__ src, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const uint2 v = src[i];
    dst[i] = make_float4(bf16_to_f32(uint16_t(v.x & 0xffffu)), bf16_to_f32(uint16_t(v.x >> 16)),
                         bf16_to_f32(uint16_t(v.y & 0xffffu)), bf16_to_f32(uint16_t(v.y >> 16)));
  }
}

template <DType S, DType D>
void launch_convert(void* dst, const void* src, int64_t n, cudaStream_t s) {
  using SrcT = typename Elem<S>::type;
  using DstT = typename Elem<D>::type;
  constexpr bool kF32ToBf16 = S == DType::F32 && D == DType::BF16, kBf16ToF32 = S == DType::BF16 && D == DType::F32;
  if constexpr (kF32ToBf16 || kBf16ToF32) {
    // Views of a tensor may start anywhere: vectors only where both sides are aligned for them.
    const uintptr_t f32_side = reinterpret_cast<uintptr_t>(kF32ToBf16 ? src : dst);
    const uintptr_t bf16_side = reinterpret_cast<uintptr_t>(kF32ToBf16 ? dst : src);
    if (f32_side % 16 == 0 && bf16_side % 8 == 0 && n >= 4) {
      const int64_t n4 = n / 4;
      if constexpr (kF32ToBf16)
        f32_to_bf16_x4_kernel<<<grid_for(n4), kThreads, 0, s>>>(static_cast<uint2*>(dst),
                                                                 static_cast<const float4*>(src), n4);
      else
        bf16_to_f32_x4_kernel<<<grid_for(n4), kThreads, 0, s>>>(static_cast<float4*>(dst),
                                                                 static_cast<const uint2*>(src), n4);
      if (n % 4 == 0) return;
      dst = static_cast<DstT*>(dst) + 4 * n4;
      src = static_cast<const SrcT*>(src) + 4 * n4;
      n -= 4 * n4;
    }
  }
  convert_kernel<S, D><<<grid_for(n), kThreads, 0, s>>>(static_cast<DstT*>(dst), static_cast<const SrcT*>(src), n);
}

template <DType S>
void launch_convert_from(void* dst, DType d, const void* src, int64_t n, cudaStream_t s) {
  switch (d) {
    case DType::F32: return launch_convert<S, DType::F32>(dst, src, n, s);
    case DType::F64: return launch_convert<S, DType::F64>(dst, src, n, s);
    case DType::BF16: return launch_convert<S, DType::BF16>(dst, src, n, s);
    case DType::F16: return launch_convert<S, DType::F16>(dst, src, n, s);
    case DType::I32: return launch_convert<S, DType::I32>(dst, src, n, s);
    case DType::I64: return launch_convert<S, DType::I64>(dst, src, n, s);
    case DType::U8: return launch_convert<S, DType::U8>(dst, src, n, s);
  }
}

// copy_strided: element i (row-major over `shape`) moves from its offset in the source view to its
// offset in the destination view.
constexpr int kMaxRank = 8;
struct StridedCopy {
  int rank;
  int64_t shape[kMaxRank];
  int64_t dst_strides[kMaxRank];
  int64_t src_strides[kMaxRank];
};

template <class Bits>
__global__ void copy_strided_kernel(Bits* dst, const Bits* src, int64_t n, StridedCopy v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rest = i, src_off = 0, dst_off = 0;
    for (int d = v.rank - 1; d >= 0; --d) {
      const int64_t idx = rest % v.shape[d];
      rest /= v.shape[d];
      src_off += idx * v.src_strides[d];
      dst_off += idx * v.dst_strides[d];
    }
    dst[dst_off] = src[src_off];
  }
}

// ---- the services -----------------------------------------------------------------------------

class CudaDeviceServices final : public DeviceServices {
 public:
  Device device() const override { return Device::CUDA; }

  std::string unavailable_reason() const override {
    std::call_once(probe_once_, [this] { probe(); });
    return reason_;
  }

  std::string description() const override {
    return unavailable_reason().empty() ? device_summary(device_)
                                        : "cuda (unavailable: " + unavailable_reason() + ")";
  }

  std::vector<std::pair<std::string, std::string>> versions() const override {
    const int gpus = device_count();
    // cuDNN is loaded only to read its version here (the "cudnn" attention variant uses it).
    return {{"CUDA", runtime_versions()},
            {"GPU", gpus == 0 ? "none" : std::to_string(gpus) + " x " + device_summary(0)},
            {"cuDNN", cudnn_version_text()}};
  }

  int64_t capacity_bytes() const override {
    if (!unavailable_reason().empty()) return 0;
    // From the properties of this process's GPU: no context is created (cudaMemGetInfo would make
    // one on the thread's current device, GPU 0 for every rank before the first kernel).
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device_) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return int64_t(p.totalGlobalMem);
  }

  // The datasheet's dense peak for this GPU (datasheet_peak_flops: 0 for one the table lacks, so
  // that the metrics ask for metrics.peak_tflops).
  double peak_flops(DType dtype) const override {
    if (!unavailable_reason().empty()) return 0;
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, device_) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return datasheet_peak_flops(p.name, dtype);
  }

  void copy_from_host(void* dst, const void* host_src, size_t nbytes) override {
    if (nbytes == 0) return;
    cudaStream_t s = stream_handle();
    if (nbytes < kStagedCopyMin) {
      // Pageable source: returns once the bytes are staged, so host_src may be reused at once.
      TITAN_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, nbytes, cudaMemcpyHostToDevice, s));
      return;
    }
    std::lock_guard<std::mutex> lock(staging_mutex_);
    ensure_staging();
    const char* src = static_cast<const char*>(host_src);
    char* out = static_cast<char*>(dst);
    for (size_t done = 0, k = 0; done < nbytes; done += kStagingBytes, k ^= 1) {
      const size_t chunk = std::min(kStagingBytes, nbytes - done);
      TITAN_CUDA_CHECK(cudaEventSynchronize(staging_done_[k]));  // the DMA that last read buffer k
      std::memcpy(staging_[k], src + done, chunk);
      TITAN_CUDA_CHECK(cudaMemcpyAsync(out + done, staging_[k], chunk, cudaMemcpyHostToDevice, s));
      TITAN_CUDA_CHECK(cudaEventRecord(staging_done_[k], s));
    }
  }

  void copy_to_host(void* host_dst, const void* src, size_t nbytes) override {
    if (nbytes == 0) return;
    cudaStream_t s = stream_handle();
    if (nbytes < kStagedCopyMin) {
      TITAN_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, nbytes, cudaMemcpyDeviceToHost, s));
      TITAN_CUDA_CHECK(cudaStreamSynchronize(s));
      return;
    }
    std::lock_guard<std::mutex> lock(staging_mutex_);
    ensure_staging();
    const char* in = static_cast<const char*>(src);
    char* out = static_cast<char*>(host_dst);
    // Two chunks in flight: while chunk i is copied out of its buffer on the host, chunk i+1's DMA runs.
    size_t pending[2] = {0, 0}, pending_at[2] = {0, 0};
    auto drain = [&](size_t k) {
      if (!pending[k]) return;
      TITAN_CUDA_CHECK(cudaEventSynchronize(staging_done_[k]));
      std::memcpy(out + pending_at[k], staging_[k], pending[k]);
      pending[k] = 0;
    };
    size_t k = 0;
    for (size_t done = 0; done < nbytes; done += kStagingBytes, k ^= 1) {
      drain(k);
      const size_t chunk = std::min(kStagingBytes, nbytes - done);
      TITAN_CUDA_CHECK(cudaMemcpyAsync(staging_[k], in + done, chunk, cudaMemcpyDeviceToHost, s));
      TITAN_CUDA_CHECK(cudaEventRecord(staging_done_[k], s));
      pending[k] = chunk;
      pending_at[k] = done;
    }
    drain(k);
    drain(k ^ 1);
  }

  void copy(void* dst, const void* src, size_t nbytes) override {
    if (nbytes == 0 || dst == src) return;
    TITAN_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream_handle()));
  }

  void fill(void* dst, int64_t n, DType dtype, double value) override {
    if (n <= 0) return;
    cudaStream_t s = stream_handle();
    if (value == 0.0 && !std::signbit(value)) {  // +0 is all-zero bits in every dtype (zero_grad, zeros)
      TITAN_CUDA_CHECK(cudaMemsetAsync(dst, 0, size_t(n) * dtype_size(dtype), s));
      return;
    }
    // The element's bits, converted as core/tensor.cpp's store_from_double does.
    switch (dtype) {
      case DType::F32: return fill_bits<uint32_t>(dst, n, float(value), s);
      case DType::F64: return fill_bits<uint64_t>(dst, n, value, s);
      case DType::BF16: return fill_bits<uint16_t>(dst, n, f32_to_bf16(float(value)), s);
      case DType::F16: return fill_bits<uint16_t>(dst, n, __half_as_ushort(__float2half_rn(float(value))), s);
      case DType::I32: return fill_bits<uint32_t>(dst, n, int32_t(value), s);
      case DType::I64: return fill_bits<uint64_t>(dst, n, int64_t(value), s);
      case DType::U8: return fill_bits<uint8_t>(dst, n, uint8_t(value), s);
    }
  }

  void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) override {
    if (n <= 0) return;
    cudaStream_t s = stream_handle();
    if (dst_dtype == src_dtype) return copy(dst, src, size_t(n) * dtype_size(dst_dtype));
    switch (src_dtype) {
      case DType::F32: launch_convert_from<DType::F32>(dst, dst_dtype, src, n, s); break;
      case DType::F64: launch_convert_from<DType::F64>(dst, dst_dtype, src, n, s); break;
      case DType::BF16: launch_convert_from<DType::BF16>(dst, dst_dtype, src, n, s); break;
      case DType::F16: launch_convert_from<DType::F16>(dst, dst_dtype, src, n, s); break;
      case DType::I32: launch_convert_from<DType::I32>(dst, dst_dtype, src, n, s); break;
      case DType::I64: launch_convert_from<DType::I64>(dst, dst_dtype, src, n, s); break;
      case DType::U8: launch_convert_from<DType::U8>(dst, dst_dtype, src, n, s); break;
    }
    check_launch("convert_kernel");
  }

  void copy_strided(void* dst, const int64_t* dst_strides, const void* src, const int64_t* src_strides, DType dtype,
                    int rank, const int64_t* shape) override {
    TITAN_CHECK(rank >= 0 && rank <= kMaxRank, "cuda copy_strided: rank ", rank, " is above the supported ",
                kMaxRank);
    StridedCopy v{};
    v.rank = rank;
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) {
      v.shape[d] = shape[d];
      v.dst_strides[d] = dst_strides[d];
      v.src_strides[d] = src_strides[d];
      n *= shape[d];
    }
    if (n <= 0) return;
    cudaStream_t s = stream_handle();
    const unsigned grid = grid_for(n);
    switch (dtype_size(dtype)) {
      case 1: copy_strided_kernel<<<grid, kThreads, 0, s>>>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, v); break;
      case 2: copy_strided_kernel<<<grid, kThreads, 0, s>>>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, v); break;
      case 4: copy_strided_kernel<<<grid, kThreads, 0, s>>>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), n, v); break;
      case 8: copy_strided_kernel<<<grid, kThreads, 0, s>>>(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), n, v); break;
      default: TITAN_FAIL("cuda copy_strided: unsupported element size for ", dtype_name(dtype));
    }
    check_launch("copy_strided_kernel");
  }

  void synchronize() override {
    if (stream_) TITAN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void* stream() override { return stream_handle(); }
  void release_cached() override { cache_.release_cached(); }

  // The op profiler's clock: an event per mark on the compute stream, reused across timelines.
  void record_time_mark() override {
    if (marks_used_ == mark_events_.size()) mark_events_.push_back(std::make_unique<Event>());
    mark_events_[marks_used_++]->record();
  }
  std::vector<double> take_time_marks() override {
    std::vector<double> seconds;
    if (marks_used_ == 0) return seconds;
    mark_events_[marks_used_ - 1]->synchronize();
    // Consecutive differences summed in double: each float difference is short, so exact enough.
    double t = 0;
    for (size_t i = 0; i < marks_used_; ++i) {
      if (i > 0) t += 1e-3 * double(mark_events_[i]->elapsed_ms(*mark_events_[i - 1]));
      seconds.push_back(t);
    }
    marks_used_ = 0;
    return seconds;
  }

  cudaStream_t stream_handle() {
    std::call_once(stream_once_, [this] {
      require_available();
      bind_this_thread();
      TITAN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    });
    bind_this_thread();
    return stream_;
  }

  // CUDA's current device is per host thread, and a new thread starts on GPU 0: every thread that
  // reaches the device (the main thread, and the OpenMP workers that copy parameters at start-up)
  // first makes this process's GPU current, or a rank that sees several GPUs would allocate,
  // create events or copy on GPU 0.
  void bind_this_thread() const {
    thread_local int bound = -1;
    if (bound == device_) return;
    TITAN_CUDA_CHECK(cudaSetDevice(device_));
    bound = device_;
  }

  void* workspace(size_t nbytes) {
    std::lock_guard<std::mutex> lock(workspace_mutex_);
    if (nbytes > workspace_bytes_) {
      // The larger block first: when it cannot be had (out of memory) the error propagates and
      // the old workspace stays whole, rather than a null pointer passed on with a large size.
      const size_t grown = round_up(nbytes, 1u << 20);
      void* larger = allocate(grown);
      if (workspace_) deallocate(workspace_, workspace_bytes_);
      workspace_ = larger;
      workspace_bytes_ = grown;
    }
    return workspace_;
  }

 protected:
  void* raw_allocate(size_t nbytes) override {
    void* p = cache_.allocate(nbytes);
    // Null only when cudaMalloc refused the segment even after every cached one went back. The
    // device counted this request before calling here: the tensors' bytes are the others.
    if (!p)
      throw DeviceOutOfMemory(
          detail::located(__FILE__, __LINE__,
                          detail::concat("out of CUDA memory allocating ", nbytes, " bytes (",
                                         stats().current_bytes - int64_t(nbytes), " bytes in tensors, ",
                                         reserved_bytes(), " reserved in segments)")));
    return p;
  }

  void raw_deallocate(void* ptr, size_t) override { cache_.deallocate(ptr); }

  int64_t reserved_bytes() const override { return cache_.stats().reserved_bytes; }

 private:
  std::vector<std::unique_ptr<Event>> mark_events_;  // the profiler's marks (record_time_mark)
  size_t marks_used_ = 0;

  void probe() const {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();
      // Without an NVIDIA driver the runtime reports an "insufficient" driver version; say what
      // is really missing.
      const bool no_driver = err == cudaErrorInsufficientDriver && !driver_library_present();
      reason_ = std::string("no CUDA device found (") +
                (no_driver ? "no NVIDIA driver: libcuda.so.1 is not installed" : cudaGetErrorString(err)) + ")";
    } else if (n == 0) {
      reason_ = "no CUDA device found";
    } else if (const int local = launcher_local_rank(); n > 1 && local >= n) {
      reason_ = "this process is local rank " + std::to_string(local) + " of its host, which shows " +
                std::to_string(n) + " GPUs: one GPU per rank (start at most " + std::to_string(n) +
                " ranks per host)";
    } else {
      // A process that sees one GPU uses it (a launcher that gives each rank its own through
      // CUDA_VISIBLE_DEVICES, or one process).
      device_ = n == 1 ? 0 : std::max(local, 0);
    }
  }
  static bool driver_library_present() {
    void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib) dlclose(lib);
    return lib != nullptr;
  }
  // One GPU per rank: an MPI (or Slurm, torchrun) launcher's local rank on this host picks the
  // GPU among those the process sees; -1 when no launcher set one (one process: GPU 0).
  static int launcher_local_rank() {
    for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"})
      if (const char* v = std::getenv(var); v && *v) return std::atoi(v);
    return -1;
  }
  void require_available() const {
    const std::string why = unavailable_reason();
    TITAN_CHECK(why.empty(), "device 'cuda' is unavailable: ", why);
  }

  template <class Bits, class V>
  void fill_bits(void* dst, int64_t n, V value, cudaStream_t s) {
    Bits bits;
    static_assert(sizeof(V) == sizeof(Bits));
    std::memcpy(&bits, &value, sizeof bits);
    fill_kernel<<<grid_for(n), kThreads, 0, s>>>(static_cast<Bits*>(dst), n, bits);
    check_launch("fill_kernel");
  }

  // Both pinned buffers and both events, or none: a call that fails part-way (pinned memory
  // refused) frees what it made, so the next call starts again instead of using a null buffer.
  void ensure_staging() {  // after stream_handle(): this thread is on the GPU
    if (staging_ready_) return;
    try {
      for (int k = 0; k < 2; ++k) {
        TITAN_CUDA_CHECK(cudaHostAlloc(&staging_[k], kStagingBytes, cudaHostAllocDefault));
        TITAN_CUDA_CHECK(cudaEventCreateWithFlags(&staging_done_[k], cudaEventDisableTiming));
      }
    } catch (...) {
      for (int k = 0; k < 2; ++k) {
        if (staging_[k]) cudaFreeHost(staging_[k]);
        if (staging_done_[k]) cudaEventDestroy(staging_done_[k]);
        staging_[k] = nullptr;
        staging_done_[k] = nullptr;
      }
      throw;
    }
    staging_ready_ = true;
  }

  mutable std::once_flag probe_once_;
  mutable std::string reason_;
  mutable int device_ = 0;  // this process's GPU (probe)
  std::once_flag stream_once_;
  cudaStream_t stream_ = nullptr;

  // Segments from cudaMalloc; returned only when a cudaMalloc fails (after the stream drained:
  // queued work may still read a freed block).
  CachingAllocator cache_{CachingAllocator::Device{
      [this](size_t bytes) -> void* {
        stream_handle();  // the device is initialised (and current on this thread) first
        void* p = nullptr;
        const cudaError_t err = cudaMalloc(&p, bytes);
        if (err == cudaSuccess) return p;
        cudaGetLastError();
        // Only an allocation failure is "out of memory": another error here is a fault an earlier
        // kernel left in the context (an illegal address), which cudaMalloc merely reports.
        if (err == cudaErrorMemoryAllocation) return nullptr;
        TITAN_FAIL("cudaMalloc of a ", bytes, "-byte segment failed: ", cudaGetErrorString(err),
                   " (an error of earlier work on the device, reported by the allocation)");
      },
      [](void* p, size_t) { TITAN_CUDA_CHECK(cudaFree(p)); },
      [this] { TITAN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }}};

  std::mutex staging_mutex_;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  bool staging_ready_ = false;  // both buffers and both events exist

  std::mutex workspace_mutex_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// The services live for the whole process and are never destroyed: tensors freed during static
// destruction (after the CUDA runtime may have shut down) return their blocks to a live cache.
CudaDeviceServices& services() {
  static CudaDeviceServices* s = new CudaDeviceServices;
  return *s;
}

// Runs when libtitan_cuda.so is loaded (core/device_services.cpp's dlopen, or at start-up of a
// program linked against it). Registration only stores the pointer; the GPU is probed on first use.
const bool registered = [] {
  register_device_services(Device::CUDA, &services());
  return true;
}();

}  // namespace

void* compute_stream() { return services().stream_handle(); }
std::string unavailable_reason() { return services().unavailable_reason(); }
void* workspace(size_t nbytes) { return services().workspace(nbytes); }

Event::Event() {
  services().stream_handle();
  cudaEvent_t e;
  TITAN_CUDA_CHECK(cudaEventCreate(&e));
  event_ = e;
}
Event::~Event() { cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }
void Event::record() {
  TITAN_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), services().stream_handle()));
}
void Event::synchronize() const {
  TITAN_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
}
float Event::elapsed_ms(const Event& since) const {
  float ms = 0;
  TITAN_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(since.event_), static_cast<cudaEvent_t>(event_)));
  return ms;
}

}  // namespace titan::cuda
