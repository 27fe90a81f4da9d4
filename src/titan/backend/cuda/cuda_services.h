#pragma once
// The CUDA backend's process-wide pieces, for the backend's own files, tests and benchmarks
// (core reaches them only through DeviceServices, see core/device_services.h):
//   - the caching allocator and copies behind device_services(Device::CUDA);
//   - one compute stream per process: every kernel and copy is ordered on it, so a block freed
//     by one op can be reused by the next without synchronisation (as PyTorch's allocator does
//     for its current stream);
//   - events for timing and cross-stream ordering;
//   - a growable scratch workspace for libraries (cuBLASLt) on the compute stream.
// Built only with the CUDA backend (TITAN_HAVE_CUDA); nothing here initialises the GPU before
// first use, so programs that never touch Device::CUDA pay nothing.
#include <cstddef>
#include <cstdint>
#include <string>

namespace titan::cuda {

// The process's compute stream (a cudaStream_t), created on first use. Errors when no GPU.
void* compute_stream();

// Why the CUDA device cannot be used ("no CUDA device found: ..."), or empty when it can.
std::string unavailable_reason();

// Device scratch memory of at least `nbytes` for work ordered on the compute stream; valid until
// the next call (the buffer only grows; its bytes count in the allocator's stats).
void* workspace(size_t nbytes);

// A CUDA event on the compute stream (timing; making another stream wait for the compute stream).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record();              // on the compute stream
  void synchronize() const;   // host waits until the recorded work is done
  float elapsed_ms(const Event& since) const;  // time from `since` to this event (both recorded)

 private:
  void* event_ = nullptr;  // cudaEvent_t
};

// Throws titan::Error for a failed CUDA runtime call, naming the call and the CUDA error.
void check(int cuda_error, const char* what, const char* file, int line);

}  // namespace titan::cuda

#define TITAN_CUDA_CHECK(expr) ::titan::cuda::check(int(expr), #expr, __FILE__, __LINE__)
