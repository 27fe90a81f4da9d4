#include "titan/dist/communicator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "titan/core/check.h"

namespace titan::dist {

void Communicator::all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, const KernelContext& ctx) {
  start_all_reduce(buf, count, dtype, op, ctx)->wait();
}
void Communicator::all_gather(const void* send, void* recv, int64_t count, DType dtype,
                              const KernelContext& ctx) {
  start_all_gather(send, recv, count, dtype, ctx)->wait();
}
void Communicator::reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                  const KernelContext& ctx) {
  start_reduce_scatter(send, recv, count, dtype, op, ctx)->wait();
}
void Communicator::broadcast(void* buf, int64_t count, DType dtype, int root, const KernelContext& ctx) {
  start_broadcast(buf, count, dtype, root, ctx)->wait();
}

void Communicator::all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                              std::span<const int64_t> recv_counts, DType dtype, const KernelContext& ctx) {
  start_all_to_all(send, send_counts, recv, recv_counts, dtype, ctx)->wait();
}

AllToAllTotals check_all_to_all(const void* send, std::span<const int64_t> send_counts, const void* recv,
                                std::span<const int64_t> recv_counts, DType dtype, int size) {
  auto total = [size](const char* name, std::span<const int64_t> counts) {
    TITAN_CHECK(counts.size() == size_t(size), "comm: all_to_all: ", name, " has ", counts.size(),
                " entries, expected one per rank of the group (", size, ")");
    int64_t sum = 0;
    for (size_t p = 0; p < counts.size(); ++p) {
      TITAN_CHECK(counts[p] >= 0, "comm: all_to_all: ", name, "[", p, "] is ", counts[p],
                  ", counts must be >= 0");
      sum += counts[p];
    }
    return sum;
  };
  const AllToAllTotals totals{total("send_counts", send_counts), total("recv_counts", recv_counts)};
  // MPI and NCCL read send while they write recv: an exchange in place would read what it wrote.
  const uintptr_t s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const uintptr_t elem = dtype_size(dtype);
  TITAN_CHECK(totals.send == 0 || totals.recv == 0 || s + uintptr_t(totals.send) * elem <= r ||
                  r + uintptr_t(totals.recv) * elem <= s,
              "comm: all_to_all: send (", totals.send, " elements) and recv (", totals.recv,
              " elements) overlap; they must be separate buffers");
  return totals;
}

std::string AllToAllTotals::describe(DType dtype) const {
  return "all_to_all(" + std::string(dtype_name(dtype)) + " x " + std::to_string(send) + " sent, " +
         std::to_string(recv) + " received)";
}

// Host memory needs no services: the communicators copy it themselves.
KernelContext host_context() {
  return KernelContext{Device::CPU, nullptr, nullptr};
}

DiskTimeAllowance::DiskTimeAllowance(Communicator& world, uint64_t bytes, const std::string& what)
    : world_(world), before_(world.timeout()), widened_(bytes > 0) {
  if (!widened_) return;
  const double extra = std::ceil(double(bytes) / kSlowDiskBytesPerSecond);
  const bool gb = bytes >= 1000000000;
  char text[96];
  std::snprintf(text, sizeof text, ": %.1f %s at %.0f MB/s", double(bytes) / (gb ? 1e9 : 1e6),
                gb ? "GB" : "MB", kSlowDiskBytesPerSecond / 1e6);
  world_.set_timeout(
      CommTimeout(std::min(before_.seconds + extra, 1e9),
                  before_.key + " + " + std::to_string(int64_t(extra)) + " s to " + what + text));
}

DiskTimeAllowance::~DiskTimeAllowance() {
  if (widened_) world_.set_timeout(before_);
}

namespace {

class Done final : public CommHandle {
 public:
  void wait() override {}
  bool poll() override { return true; }
};

// With one rank every reduction is the identity and every gather a copy.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string library() const override { return "none (one process, no MPI launcher)"; }
  std::unique_ptr<CommHandle> start_all_reduce(void*, int64_t, DType, ReduceOp,
                                               const KernelContext&) override {
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommHandle> start_all_gather(const void* send, void* recv, int64_t count, DType dtype,
                                               const KernelContext& ctx) override {
    copy(send, recv, count, dtype, ctx);
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommHandle> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                                                   ReduceOp, const KernelContext& ctx) override {
    copy(send, recv, count, dtype, ctx);
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommHandle> start_broadcast(void*, int64_t, DType, int root,
                                              const KernelContext&) override {
    TITAN_CHECK(root == 0, "comm: broadcast from root ", root, " in a world of one rank");
    return std::make_unique<Done>();
  }
  // This rank's only segment goes to itself.
  std::unique_ptr<CommHandle> start_all_to_all(const void* send, std::span<const int64_t> send_counts,
                                               void* recv, std::span<const int64_t> recv_counts, DType dtype,
                                               const KernelContext& ctx) override {
    check_all_to_all(send, send_counts, recv, recv_counts, dtype, 1);
    TITAN_CHECK(recv_counts[0] == send_counts[0], "comm: all_to_all: recv_counts[0] is ", recv_counts[0],
                " but this rank's send_counts[0] is ", send_counts[0],
                ": a rank receives what its peer sends it (one rank: itself)");
    if (send_counts[0] > 0) copy(send, recv, send_counts[0], dtype, ctx);
    return std::make_unique<Done>();
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
  void set_timeout(const CommTimeout& timeout) override {
    check_timeout(timeout);
    timeout_ = timeout;
  }
  CommTimeout timeout() const override { return timeout_; }
  std::unique_ptr<Communicator> split(int, int, int size) override {
    TITAN_CHECK(size == 1, "comm: a group of one process split into a group of ", size, " ranks");
    return std::make_unique<SingleProcess>();
  }

 private:
  CommTimeout timeout_{300};  // never waited on: kept for timeout()
  static void copy(const void* send, void* recv, int64_t count, DType dtype, const KernelContext& ctx) {
    if (send == recv) return;
    const size_t bytes = size_t(count) * dtype_size(dtype);
    if (ctx.services) {
      ctx.services->copy(recv, send, bytes);
    } else {
      TITAN_CHECK(ctx.device == Device::CPU, "comm: a copy on ", device_name(ctx.device),
                  " needs its device services");
      std::memcpy(recv, send, bytes);
    }
  }
};

}  // namespace

std::unique_ptr<Communicator> single_process_communicator() {
  return std::make_unique<SingleProcess>();
}

namespace {
std::atomic<DeviceCommunicatorFactory> g_cuda_communicator{nullptr};
}  // namespace

void register_device_communicator(Device device, DeviceCommunicatorFactory factory) {
  TITAN_CHECK(device == Device::CUDA, "register_device_communicator: only the CUDA backend brings one, got '",
              device_name(device), "'");
  g_cuda_communicator.store(factory);
}

std::unique_ptr<Communicator> device_communicator(std::unique_ptr<Communicator> host, Device device,
                                                  const CommTimeout& timeout) {
  if (device == Device::CPU) return host;
  TITAN_CHECK(device == Device::CUDA, "comm: device ", device_name(device), " has no communicator");
  device_services(device);  // loads the CUDA backend (which registers NCCL); an error naming why not
  const DeviceCommunicatorFactory make = g_cuda_communicator.load();
  TITAN_CHECK(make, "comm: ", host->size(), " ranks on device cuda need the NCCL communicator, but this build's "
              "CUDA backend has none (nccl.h and libnccl were not found when it was built: install the CUDA "
              "toolkit's NCCL or Debian's libnccl-dev and rebuild)");
  return make(std::move(host), timeout);
}

}  // namespace titan::dist
