// The NCCL communicator: dist::Communicator for CUDA buffers, one GPU per rank (the CUDA device
// services pick this process's GPU from the launcher's local rank). Built into the CUDA backend
// library (libtitan_cuda.so) when CMake found NCCL; it registers itself as the cuda device's
// communicator when that library loads, and launch_communicator builds it over the MPI world for a
// job on device cuda with more than one rank.
//
// Bootstrap: rank 0 of the host (MPI) communicator makes the ncclUniqueId and broadcasts its bytes
// over MPI; every rank then joins with ncclCommInitRankConfig (blocking). split() splits the MPI communicator
// and bootstraps a new NCCL communicator over each part the same way.
//
// Streams: collectives run on a communication stream of their own, so they overlap the compute
// stream's work: start_* records an event on the caller's stream (ctx.stream, the compute stream)
// that the communication stream waits for (the buffers are ready), enqueues the NCCL call, and
// records a "done" event. wait() polls that event, checking ncclCommGetAsyncError, then makes the
// caller's stream wait for it too (later kernels see the result). A collective that does not
// finish within the timeout (a rank died or hangs) aborts the NCCL communicator (ncclCommAbort: the
// stuck kernels return) and throws an error naming the collective, its size and the group.
// all_to_all is a group of ncclSend/ncclRecv, one pair per peer (NCCL has no all-to-all call).
// Host buffers (ctx.device == CPU: losses, norms, config hashes) go to the MPI communicator.
#ifdef TITAN_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/dist/communicator.h"

namespace titan::dist {
namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  TITAN_FAIL("comm (NCCL): CUDA error in ", what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

// cudaEventQuery on an event still pending: cudaErrorNotReady, which the runtime also leaves in the
// thread's last-error slot; cleared here, or the next kernel's launch check (cudaGetLastError)
// would report it as that kernel's failure.
cudaError_t query_event(cudaEvent_t event) {
  const cudaError_t q = cudaEventQuery(event);
  if (q == cudaErrorNotReady) cudaGetLastError();
  return q;
}

// The communicator is blocking (made so explicitly, whatever NCCL_COMM_BLOCKING says): a call that
// returns has finished its host side, and ncclInProgress, a non-blocking communicator's answer, is
// never a success here.
void check_nccl(ncclResult_t res, const char* what) {
  TITAN_CHECK(res == ncclSuccess, "comm (NCCL): ", what, " failed: ", ncclGetErrorString(res), " (",
              ncclGetLastError(nullptr), ")");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  TITAN_FAIL("comm (NCCL): unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  // The same reductions as the MPI communicator (communicator.h).
  TITAN_CHECK(dtype == DType::F32 || dtype == DType::F64 || dtype == DType::I64 || dtype == DType::BF16,
              "comm: reductions support f32, f64, i64 and bf16, got ", dtype_name(dtype));
  return op == ReduceOp::Sum ? ncclSum : ncclMax;
}

const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

std::string nccl_version() {
  int v = 0;
  ncclGetVersion(&v);
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

class NcclCommunicator;

class NcclHandle final : public CommHandle {
 public:
  NcclHandle(NcclCommunicator& comm, cudaEvent_t done, cudaStream_t caller, std::string what)
      : comm_(comm), done_(done), caller_(caller), what_(std::move(what)) {}
  ~NcclHandle() override;
  void wait() override;
  // Complete once the event recorded after the collective fired; an error also ends the polling,
  // for wait() to report.
  bool poll() override { return query_event(done_) != cudaErrorNotReady; }

 private:
  NcclCommunicator& comm_;
  cudaEvent_t done_;
  cudaStream_t caller_;
  std::string what_;
};

class NcclCommunicator final : public Communicator {
 public:
  // `timeout` is shared with the groups split from this communicator (set_timeout reaches them).
  NcclCommunicator(std::unique_ptr<Communicator> host, std::shared_ptr<SharedTimeout> timeout)
      : host_(std::move(host)), timeout_(std::move(timeout)) {
    check_timeout(timeout_->get());
    // Makes this process's GPU (the device services pick it by local rank) current on this thread
    // before NCCL binds the communicator to the current device.
    device_services(Device::CUDA).stream();
    ncclUniqueId id{};
    if (host_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host_->broadcast(&id, int64_t(sizeof id), DType::U8, 0, host_context());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    check_nccl(ncclCommInitRankConfig(&comm_, host_->size(), id, host_->rank(), &config),
               "ncclCommInitRankConfig");
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    device_ = device;
    // Non-blocking with respect to the legacy default stream, like the compute stream.
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~NcclCommunicator() override {
    if (std::uncaught_exceptions() > 0) {
      // Destroyed while this rank unwinds from an error: ncclCommDestroy would first flush the
      // pending collectives, which the other ranks (still computing, or gone) may never complete,
      // and this rank would hang before it prints its error. Abort instead.
      abort_nccl();
    } else if (!aborted_ && comm_) {  // (after ncclCommAbort nothing is left to free)
      ncclCommDestroy(comm_);
    }
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string library() const override {
    return "NCCL " + nccl_version() + " (GPU " + std::to_string(device_) + " of this host) over " + host_->library();
  }

  std::unique_ptr<CommHandle> start_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                                               const KernelContext& ctx) override {
    if (ctx.device == Device::CPU) return host_->start_all_reduce(buf, count, dtype, op, ctx);
    const ncclRedOp_t rop = nccl_op(op, dtype);
    return launch(ctx, describe("all_reduce", count, dtype, op_name(op)), [&] {
      return ncclAllReduce(buf, buf, size_t(count), nccl_type(dtype), rop, comm_, stream_);
    });
  }
  std::unique_ptr<CommHandle> start_all_gather(const void* send, void* recv, int64_t count, DType dtype,
                                               const KernelContext& ctx) override {
    if (ctx.device == Device::CPU) return host_->start_all_gather(send, recv, count, dtype, ctx);
    // In place (send == recv + rank * count) is NCCL's in-place form too.
    return launch(ctx, describe("all_gather", count, dtype, nullptr), [&] {
      return ncclAllGather(send, recv, size_t(count), nccl_type(dtype), comm_, stream_);
    });
  }
  std::unique_ptr<CommHandle> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                                                   ReduceOp op, const KernelContext& ctx) override {
    if (ctx.device == Device::CPU) return host_->start_reduce_scatter(send, recv, count, dtype, op, ctx);
    const ncclRedOp_t rop = nccl_op(op, dtype);
    return launch(ctx, describe("reduce_scatter", count, dtype, op_name(op)), [&] {
      return ncclReduceScatter(send, recv, size_t(count), nccl_type(dtype), rop, comm_, stream_);
    });
  }
  std::unique_ptr<CommHandle> start_broadcast(void* buf, int64_t count, DType dtype, int root,
                                              const KernelContext& ctx) override {
    if (ctx.device == Device::CPU) return host_->start_broadcast(buf, count, dtype, root, ctx);
    TITAN_CHECK(root >= 0 && root < size(), "comm: broadcast from root ", root, " in a group of ", size(), " ranks");
    return launch(ctx, describe("broadcast", count, dtype, nullptr), [&] {
      return ncclBroadcast(buf, buf, size_t(count), nccl_type(dtype), root, comm_, stream_);
    });
  }
  // One ncclSend and one ncclRecv per peer with a non-empty segment (both sides skip the empty
  // ones alike: recv_counts[p] is rank p's send_counts[rank]), fused by ncclGroupStart/End into one
  // operation on the communication stream. NCCL reads the counts while enqueuing (the communicator
  // is blocking), so the handle needs no copy of them.
  std::unique_ptr<CommHandle> start_all_to_all(const void* send, std::span<const int64_t> send_counts,
                                               void* recv, std::span<const int64_t> recv_counts, DType dtype,
                                               const KernelContext& ctx) override {
    if (ctx.device == Device::CPU)
      return host_->start_all_to_all(send, send_counts, recv, recv_counts, dtype, ctx);
    const AllToAllTotals totals = check_all_to_all(send, send_counts, recv, recv_counts, dtype, size());
    const ncclDataType_t type = nccl_type(dtype);
    const size_t elem = dtype_size(dtype);
    return launch(ctx, totals.describe(dtype), [&] {
      ncclResult_t res = ncclGroupStart();
      if (res != ncclSuccess) return res;
      size_t soffset = 0, roffset = 0;
      for (int p = 0; p < size() && res == ncclSuccess; ++p) {
        const size_t scount = size_t(send_counts[size_t(p)]), rcount = size_t(recv_counts[size_t(p)]);
        if (scount > 0)
          res = ncclSend(static_cast<const char*>(send) + soffset * elem, scount, type, p, comm_, stream_);
        if (rcount > 0 && res == ncclSuccess)
          res = ncclRecv(static_cast<char*>(recv) + roffset * elem, rcount, type, p, comm_, stream_);
        soffset += scount;
        roffset += rcount;
      }
      // The group is closed even after a failed call (NCCL keeps a group open until its end).
      const ncclResult_t end = ncclGroupEnd();
      return res != ncclSuccess ? res : end;
    });
  }
  void barrier() override { host_->barrier(); }
  [[noreturn]] void abort(int code) override {
    abort_nccl();
    host_->abort(code);
    std::_Exit(code);  // host_->abort does not return; this tells the compiler so
  }
  void set_timeout(const CommTimeout& timeout) override {
    check_timeout(timeout);
    timeout_->set(timeout);
    host_->set_timeout(timeout);  // its barriers and host collectives
  }
  CommTimeout timeout() const override { return timeout_->get(); }
  std::unique_ptr<Communicator> split(int color, int key, int size) override {
    return std::make_unique<NcclCommunicator>(host_->split(color, key, size), timeout_);
  }

  // Polls `done` until it completes; after the timeout, or when NCCL reports an asynchronous error
  // (a peer's connection broke), aborts the communicator and throws naming the collective.
  void wait_for(cudaEvent_t done, const std::string& what) {
    using Clock = std::chrono::steady_clock;
    TITAN_CHECK(!aborted_, "comm: ", what, ": the NCCL communicator was aborted by an earlier failed collective");
    const auto t0 = Clock::now();
    const CommTimeout timeout = timeout_->get();
    for (int polls = 0;; ++polls) {
      const cudaError_t q = query_event(done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check_cuda(q, ("waiting for " + what).c_str());
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        abort_nccl();
        TITAN_FAIL("comm: rank ", rank(), ": ", what, " over ", size(), " ranks failed in NCCL: ",
                   ncclGetErrorString(async), " (another rank died or its connection broke)");
      }
      if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout.seconds) {
        abort_nccl();
        TITAN_FAIL("comm: rank ", rank(), ": ", what, " over ", size(),
                   " ranks (NCCL) did not complete within ", timeout.seconds, " s (", timeout.key,
                   "): another rank died or stopped answering");
      }
      // Spin briefly (most collectives finish in microseconds), then leave the core to others.
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  template <class Call>
  std::unique_ptr<CommHandle> launch(const KernelContext& ctx, std::string what, Call&& call) {
    TITAN_CHECK(ctx.device == Device::CUDA, "comm: ", what, " on device ", device_name(ctx.device),
                ": the NCCL communicator moves CUDA (and, through MPI, host) memory only");
    TITAN_CHECK(!aborted_, "comm: ", what, ": the NCCL communicator was aborted by an earlier failed collective");
    cudaStream_t caller = static_cast<cudaStream_t>(ctx.stream);
    cudaEvent_t ready = nullptr, done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    // The communication stream starts after the work queued so far on the caller's stream.
    check_cuda(cudaEventRecord(ready, caller), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);  // released once the wait is resolved
    try {
      check_nccl(call(), what.c_str());
    } catch (...) {
      cudaEventDestroy(done);
      throw;
    }
    check_cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    return std::make_unique<NcclHandle>(*this, done, caller, std::move(what));
  }

  std::string describe(const char* what, int64_t count, DType dtype, const char* op) const {
    return std::string(what) + "(" + std::string(dtype_name(dtype)) + " x " + std::to_string(count) +
           (op ? std::string(", ") + op : "") + ")";
  }

  void abort_nccl() {
    if (aborted_ || !comm_) return;
    aborted_ = true;
    ncclCommAbort(comm_);
  }

  std::unique_ptr<Communicator> host_;  // MPI: host buffers, barriers, aborts, bootstrap
  std::shared_ptr<SharedTimeout> timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the communication stream
  int device_ = 0;
  bool aborted_ = false;
};

// A handle dropped without wait() (an error unwinding the step) still orders the caller's stream
// after the collective: its buffers go back to the allocator, whose next user runs on that stream,
// and must not be overwritten while NCCL may still write into them. (Queued, not waited on the host.)
NcclHandle::~NcclHandle() {
  // A destructor cannot throw: a failure here (the context already broken by what is unwinding)
  // is left for that error to report, and not in the last-error slot for the next launch check.
  if (cudaStreamWaitEvent(caller_, done_, 0) != cudaSuccess) cudaGetLastError();
  if (cudaEventDestroy(done_) != cudaSuccess) cudaGetLastError();
}

void NcclHandle::wait() {
  comm_.wait_for(done_, what_);
  // Kernels queued on the caller's stream after this wait read the collective's result.
  check_cuda(cudaStreamWaitEvent(caller_, done_, 0), "cudaStreamWaitEvent");
}

std::unique_ptr<Communicator> make_nccl(std::unique_ptr<Communicator> host, const CommTimeout& timeout) {
  return std::make_unique<NcclCommunicator>(std::move(host), std::make_shared<SharedTimeout>(timeout));
}

// Runs when libtitan_cuda.so is loaded (see core/device_services.h).
const bool registered = [] {
  register_device_communicator(Device::CUDA, &make_nccl);
  return true;
}();

}  // namespace
}  // namespace titan::dist

#endif  // TITAN_HAVE_NCCL
