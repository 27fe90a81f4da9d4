#include "titan/dist/meta_world.h"

#include <cstdlib>
#include <cstring>

#include "titan/core/check.h"

namespace titan::dist {
namespace {

class Done final : public CommHandle {
 public:
  void wait() override {}
  bool poll() override { return true; }
};

// A reduce-scatter as long as the backward of one layer, as on a real rank, whose reduction of a
// layer's gradient overlaps the backward of the layer below and holds the unsharded gradient until
// it ends. ShardedBlocks polls at each layer's after_backward (where the reduction starts), then at
// the next layer's before_backward and after_backward: done from the third poll, or when waited for.
// (Done at once, the plan freed each gradient as soon as it was reduced, and 2- and 4-rank runs
// peaked above it.)
class OneLayerLong final : public CommHandle {
 public:
  void wait() override {}
  bool poll() override { return ++polls_ >= 3; }

 private:
  int polls_ = 0;
};

class MetaWorld final : public Communicator {
 public:
  explicit MetaWorld(int size) : size_(size) {}

  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string library() const override { return "meta world (planning: this process is rank 0 of the mesh)"; }

  std::unique_ptr<CommHandle> start_all_reduce(void*, int64_t count, DType dtype, ReduceOp,
                                               const KernelContext& ctx) override {
    check_no_data(ctx, "all_reduce", count, dtype);
    return done();
  }
  std::unique_ptr<CommHandle> start_all_gather(const void* send, void* recv, int64_t count, DType dtype,
                                               const KernelContext& ctx) override {
    // Rank 0's slot is the first `count` elements of recv.
    if (!check_no_data(ctx, "all_gather", count, dtype) && send != recv)
      std::memcpy(recv, send, size_t(count) * dtype_size(dtype));
    return done();
  }
  std::unique_ptr<CommHandle> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                                                   ReduceOp, const KernelContext& ctx) override {
    // Rank 0's part of send is its first `count` elements.
    if (!check_no_data(ctx, "reduce_scatter", count, dtype) && send != recv)
      std::memcpy(recv, send, size_t(count) * dtype_size(dtype));
    return std::make_unique<OneLayerLong>();
  }
  std::unique_ptr<CommHandle> start_broadcast(void*, int64_t count, DType dtype, int,
                                              const KernelContext& ctx) override {
    check_no_data(ctx, "broadcast", count, dtype);
    return done();
  }
  std::unique_ptr<CommHandle> start_all_to_all(const void* send, std::span<const int64_t> send_counts,
                                               void* recv, std::span<const int64_t> recv_counts, DType dtype,
                                               const KernelContext& ctx) override {
    const AllToAllTotals totals = check_all_to_all(send, send_counts, recv, recv_counts, dtype, size());
    TITAN_CHECK(recv_counts[0] == send_counts[0], "meta world: all_to_all: recv_counts[0] is ",
                recv_counts[0], " but send_counts[0] is ", send_counts[0],
                ": rank 0 receives from itself what it sends itself");
    // Rank 0's segment to itself is the first send_counts[0] elements of send and of recv.
    if (!check_no_data(ctx, "all_to_all", totals.send, dtype) && send_counts[0] > 0)
      std::memcpy(recv, send, size_t(send_counts[0]) * dtype_size(dtype));
    return done();
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
  void set_timeout(const CommTimeout& timeout) override {
    check_timeout(timeout);
    timeout_ = timeout;
  }
  CommTimeout timeout() const override { return timeout_; }
  std::unique_ptr<Communicator> split(int, int, int size) override {
    TITAN_CHECK(size >= 1 && size <= size_, "meta world: a group of ", size, " ranks split from a world of ",
                size_);
    return std::make_unique<MetaWorld>(size);
  }

 private:
  CommTimeout timeout_{300};  // never waited on: kept for timeout()
  static std::unique_ptr<CommHandle> done() { return std::make_unique<Done>(); }

  // True for meta buffers (nothing to do); false for host buffers (the caller keeps this rank's
  // values); an error for tensors on a real device.
  static bool check_no_data(const KernelContext& ctx, const char* what, int64_t count, DType dtype) {
    if (ctx.device == Device::Meta) return true;
    TITAN_CHECK(ctx.device == Device::CPU && ctx.services == nullptr, "meta world: ", what, "(",
                dtype_name(dtype), " x ", count, ") of a tensor on ", device_name(ctx.device),
                ": the meta world only plans steps on the meta device (its other ranks are imagined; "
                "real data would not be exchanged)");
    return false;
  }

  int size_;
};

}  // namespace

std::unique_ptr<Communicator> meta_world_communicator(int size) {
  TITAN_CHECK(size >= 1, "meta world: size must be >= 1, got ", size);
  return std::make_unique<MetaWorld>(size);
}

}  // namespace titan::dist
