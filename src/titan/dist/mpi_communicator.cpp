// The MPI communicator (CPU ranks): non-blocking MPI-3 collectives, waited on by polling so that a
// rank that died or hangs turns into an error after the timeout instead of a hang.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/parse.h"
#include "titan/dist/communicator.h"
#include "titan/dist/parallel_plan.h"

namespace titan::dist {

namespace {

const char* op_name(ReduceOp op) {
  return op == ReduceOp::Sum ? "sum" : "max";
}

// bf16 has no MPI type: it travels as 16-bit words and is reduced by this user operation.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const bf16* a = static_cast<const bf16*>(in);
  bf16* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I64:
      return MPI_INT64_T;
    case DType::I32:
      return MPI_INT32_T;
    case DType::BF16:
    case DType::F16:
      return MPI_UINT16_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  TITAN_FAIL("comm: unknown dtype");
}

// Message counts are int in MPI-3.
int mpi_count(int64_t count, const char* what) {
  TITAN_CHECK(count >= 0 && count <= INT32_MAX, "comm: ", what, " of ", count,
              " elements exceeds MPI's int count (split the buffer)");
  return int(count);
}

void check_host(const KernelContext& ctx, const char* what) {
  TITAN_CHECK(ctx.device == Device::CPU, "comm: ", what, " on device ", device_name(ctx.device),
              ": the MPI communicator moves host memory only (a device backend brings its own)");
}

class MpiHandle final : public CommHandle {
 public:
  // `args`: what MPI reads until the collective completes (all_to_all's counts and displacements).
  MpiHandle(MPI_Request req, std::string what, std::shared_ptr<const SharedTimeout> timeout, int rank,
            int size, std::vector<int> args = {})
      : req_(req),
        what_(std::move(what)),
        timeout_(std::move(timeout)),
        rank_(rank),
        size_(size),
        args_(std::move(args)) {}
  // A handle dropped before its wait() completed belongs to a job on its way to MPI_Abort (a
  // timeout, or an error while other collectives were in flight): waiting here could hang, and
  // MPI forbids freeing a collective's request, so it is left to the abort (an all_to_all's
  // counts go with the handle: the abort makes no progress that would read them).
  ~MpiHandle() override = default;
  void wait() override {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    const CommTimeout timeout = timeout_->get();
    int done = 0;
    // Spin briefly (most collectives complete in microseconds), then poll with short sleeps so a
    // waiting rank leaves the cores to the ranks still computing.
    for (int spin = 0; spin < 1000 && !done; ++spin) MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    while (!done) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
      if (!done && std::chrono::duration<double>(Clock::now() - t0).count() > timeout.seconds)
        TITAN_FAIL("comm: rank ", rank_, ": ", what_, " over ", size_, " ranks did not complete within ",
                   timeout.seconds, " s (", timeout.key, "): another rank died or stopped answering");
    }
    req_ = MPI_REQUEST_NULL;
  }
  bool poll() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_Test(&req_, &done, MPI_STATUS_IGNORE);  // a completed request becomes MPI_REQUEST_NULL
    return done != 0;
  }

 private:
  MPI_Request req_;
  std::string what_;
  std::shared_ptr<const SharedTimeout> timeout_;
  int rank_, size_;
  std::vector<int> args_;
};

class Mpi final : public Communicator {
 public:
  Mpi(MPI_Comm comm, std::shared_ptr<SharedTimeout> timeout, bool owns_mpi)
      : comm_(comm), timeout_(std::move(timeout)), owns_mpi_(owns_mpi) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(bf16_sum, /*commute=*/1, &bf16_sum_);
    MPI_Op_create(bf16_max, 1, &bf16_max_);
  }
  ~Mpi() override {
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string library() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, size_t(len));
    if (auto nl = v.find_first_of("\r\n,"); nl != std::string::npos) v.resize(nl);
    int major = 0, minor = 0;
    MPI_Get_version(&major, &minor);
    return v + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
  }

  std::unique_ptr<CommHandle> start_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                                               const KernelContext& ctx) override {
    check_host(ctx, "all_reduce");
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, buf, mpi_count(count, "all_reduce"), mpi_type(dtype), mpi_op(op, dtype),
                   comm_, &req);
    return handle(req, "all_reduce", count, dtype, op_name(op));
  }
  std::unique_ptr<CommHandle> start_all_gather(const void* send, void* recv, int64_t count, DType dtype,
                                               const KernelContext& ctx) override {
    check_host(ctx, "all_gather");
    const size_t bytes = size_t(count) * dtype_size(dtype);
    const bool in_place = send == static_cast<const char*>(recv) + size_t(rank_) * bytes;
    MPI_Request req;
    MPI_Iallgather(in_place ? MPI_IN_PLACE : send, mpi_count(count, "all_gather"), mpi_type(dtype), recv,
                   int(count), mpi_type(dtype), comm_, &req);
    return handle(req, "all_gather", count, dtype, nullptr);
  }
  std::unique_ptr<CommHandle> start_reduce_scatter(const void* send, void* recv, int64_t count, DType dtype,
                                                   ReduceOp op, const KernelContext& ctx) override {
    check_host(ctx, "reduce_scatter");
    MPI_Request req;
    MPI_Ireduce_scatter_block(send, recv, mpi_count(count, "reduce_scatter"), mpi_type(dtype),
                              mpi_op(op, dtype), comm_, &req);
    return handle(req, "reduce_scatter", count, dtype, op_name(op));
  }
  std::unique_ptr<CommHandle> start_broadcast(void* buf, int64_t count, DType dtype, int root,
                                              const KernelContext& ctx) override {
    check_host(ctx, "broadcast");
    MPI_Request req;
    MPI_Ibcast(buf, mpi_count(count, "broadcast"), mpi_type(dtype), root, comm_, &req);
    return handle(req, "broadcast", count, dtype, nullptr);
  }
  std::unique_ptr<CommHandle> start_all_to_all(const void* send, std::span<const int64_t> send_counts,
                                               void* recv, std::span<const int64_t> recv_counts, DType dtype,
                                               const KernelContext& ctx) override {
    const AllToAllTotals totals = check_all_to_all(send, send_counts, recv, recv_counts, dtype, size_);
    check_host(ctx, "all_to_all");
    // MPI-3's counts and displacements are int: past INT_MAX elements is an error, as for the
    // other collectives (a contiguous derived datatype would stretch it only for counts sharing a
    // divisor).
    auto check_int = [](const char* side, int p, int64_t count, int64_t offset) {
      TITAN_CHECK(count <= INT32_MAX, "comm: all_to_all: ", side, "_counts[", p, "] is ", count,
                  " elements, past MPI's int counts (split the exchange)");
      TITAN_CHECK(offset <= INT32_MAX, "comm: all_to_all: ", side, " segment ", p, " starts at element ",
                  offset, ", past MPI's int displacements (split the exchange)");
    };
    std::vector<int> args(4 * size_t(size_));  // counts, displacements of send; the same of recv
    int *scounts = args.data(), *sdispls = scounts + size_, *rcounts = sdispls + size_,
        *rdispls = rcounts + size_;
    int64_t soffset = 0, roffset = 0;
    for (int p = 0; p < size_; ++p) {
      const int64_t scount = send_counts[size_t(p)], rcount = recv_counts[size_t(p)];
      check_int("send", p, scount, soffset);
      check_int("recv", p, rcount, roffset);
      scounts[p] = int(scount);
      sdispls[p] = int(soffset);
      rcounts[p] = int(rcount);
      rdispls[p] = int(roffset);
      soffset += scount;
      roffset += rcount;
    }
    // MPI reads them until the exchange completes: the handle owns them (the caller's spans may be
    // gone by then).
    MPI_Request req;
    MPI_Ialltoallv(send, scounts, sdispls, mpi_type(dtype), recv, rcounts, rdispls, mpi_type(dtype), comm_,
                   &req);
    return std::make_unique<MpiHandle>(req, totals.describe(dtype), timeout_, rank_, size_, std::move(args));
  }
  void barrier() override {
    MPI_Request req;
    MPI_Ibarrier(comm_, &req);
    MpiHandle(req, "barrier", timeout_, rank_, size_).wait();
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this tells the compiler so
  }
  void set_timeout(const CommTimeout& timeout) override {
    check_timeout(timeout);
    timeout_->set(timeout);
  }
  CommTimeout timeout() const override { return timeout_->get(); }
  std::unique_ptr<Communicator> split(int color, int key, int size) override {
    // MPI_Comm_split blocks until every rank calls it, with no bound of its own: the timed barrier
    // first, so a rank that never comes is a timeout naming the split, not a hang.
    MPI_Request req;
    MPI_Ibarrier(comm_, &req);
    MpiHandle(req, "barrier before split(color " + std::to_string(color) + ")", timeout_, rank_, size_)
        .wait();
    MPI_Comm sub;
    MPI_Comm_split(comm_, color, key, &sub);
    auto group = std::make_unique<Mpi>(sub, timeout_, false);  // the same timeout: set_timeout reaches it
    TITAN_CHECK(group->size() == size, "comm: split(color ", color, ") made a group of ", group->size(),
                " ranks where ", size, " were expected (the ranks disagree on the mesh)");
    return group;
  }

 private:
  MPI_Op mpi_op(ReduceOp op, DType dtype) const {
    TITAN_CHECK(dtype == DType::F32 || dtype == DType::F64 || dtype == DType::I64 || dtype == DType::BF16,
                "comm: reductions support f32, f64, i64 and bf16, got ", dtype_name(dtype));
    if (dtype == DType::BF16) return op == ReduceOp::Sum ? bf16_sum_ : bf16_max_;
    return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
  }
  std::unique_ptr<CommHandle> handle(MPI_Request req, const char* what, int64_t count, DType dtype,
                                     const char* op) const {
    std::string desc = std::string(what) + "(" + std::string(dtype_name(dtype)) + " x " +
                       std::to_string(count) + (op ? std::string(", ") + op : "") + ")";
    return std::make_unique<MpiHandle>(req, desc, timeout_, rank_, size_);
  }

  MPI_Comm comm_;
  std::shared_ptr<SharedTimeout> timeout_;
  bool owns_mpi_;
  int rank_ = 0, size_ = 1;
  MPI_Op bf16_sum_, bf16_max_;
};

// MPI_Init waits for every rank of the job to start: a rank that never does (a host that stops
// answering, a process stopped in its first second) would keep the others there forever, where no
// collective's timeout can reach. This watchdog ends the process after the start-up timeout
// (comm.init_timeout_seconds, else comm.timeout_seconds), naming why; the launcher then ends the
// whole job, as for a rank that died.
class InitWatchdog {
 public:
  explicit InitWatchdog(const CommTimeout& timeout) {
    thread_ = std::thread([this, timeout] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (done_cv_.wait_for(lock, std::chrono::duration<double>(timeout.seconds), [this] { return done_; }))
        return;
      const std::optional<int> rank = launcher_rank();
      const std::optional<int> ranks = launcher_world_size();
      std::fprintf(stderr,
                   "titan: error: comm: rank %s: MPI_Init over %s ranks did not complete within %g s "
                   "(%s): a rank did not start, or stopped answering, before MPI started\n",
                   rank ? std::to_string(*rank).c_str() : "?", ranks ? std::to_string(*ranks).c_str() : "?",
                   timeout.seconds, timeout.key.c_str());
      std::fflush(stderr);
      std::_Exit(1);  // the main thread is inside MPI_Init: nothing can unwind it
    });
  }
  ~InitWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }
  InitWatchdog(const InitWatchdog&) = delete;
  InitWatchdog& operator=(const InitWatchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

bool started_by_launcher() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

std::optional<int> launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* text = std::getenv(v))
      if (std::optional<int64_t> r = parse_int(text)) return int(*r);
  return std::nullopt;
}

std::optional<int> launcher_world_size() {
  if (!started_by_launcher()) return 1;
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* text = std::getenv(v))
      if (std::optional<int64_t> n = parse_int(text); n && *n >= 1) return int(*n);
  return std::nullopt;
}

std::optional<int> open_mpi_launcher_pid() {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE")) return std::nullopt;
  const pid_t parent = getppid();
  std::ifstream comm("/proc/" + std::to_string(parent) + "/comm");
  std::string name;
  std::getline(comm, name);
  // Debian installs mpirun.openmpi (the name a process started through the alternatives link has);
  // Open MPI 5's mpirun execs prterun.
  for (const char* launcher : {"mpirun", "mpiexec", "orterun", "prterun"})
    if (name.rfind(launcher, 0) == 0) return int(parent);
  return std::nullopt;
}

std::unique_ptr<Communicator> launch_communicator(const CommTimeout& timeout, Device device) {
  check_timeout(timeout);
  if (!started_by_launcher()) return single_process_communicator();
  int provided = 0;
  {
    InitWatchdog watchdog(timeout);
    // Only the main thread calls MPI (OpenMP threads compute between collectives).
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  }
  TITAN_CHECK(provided >= MPI_THREAD_FUNNELED, "comm: the MPI library does not support MPI_THREAD_FUNNELED");
  // Errors come back as codes only where we check them; a failed collective must stop the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  auto world = std::make_unique<Mpi>(MPI_COMM_WORLD, std::make_shared<SharedTimeout>(timeout), true);
  // A world of one rank needs no device communicator (every collective is a copy or nothing).
  if (device == Device::CPU || world->size() == 1) return world;
  // Every rank has the device before any enters the device communicator's bootstrap, which no
  // timeout bounds: a rank without it (no GPU on its host, no backend) would finalize MPI while
  // the others waited there for good. Now every rank stops with its reason.
  agree_on_success(*world, [&] { device_services(device); });
  return device_communicator(std::move(world), device, timeout);
}

}  // namespace titan::dist
