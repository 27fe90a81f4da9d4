#include "titan/dist/communicator.h"

#include <atomic>
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

// Host memory needs no services: the communicators copy it themselves.
KernelContext host_context() {
  return KernelContext{Device::CPU, nullptr, nullptr};
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
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleProcess>(); }

 private:
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
                                                  double timeout_seconds) {
  if (device == Device::CPU) return host;
  TITAN_CHECK(device == Device::CUDA, "comm: device ", device_name(device), " has no communicator");
  device_services(device);  // loads the CUDA backend (which registers NCCL); an error naming why not
  const DeviceCommunicatorFactory make = g_cuda_communicator.load();
  TITAN_CHECK(make, "comm: ", host->size(), " ranks on device cuda need the NCCL communicator, but this build's "
              "CUDA backend has none (nccl.h and libnccl were not found when it was built: install the CUDA "
              "toolkit's NCCL or Debian's libnccl-dev and rebuild)");
  return make(std::move(host), timeout_seconds);
}

}  // namespace titan::dist
