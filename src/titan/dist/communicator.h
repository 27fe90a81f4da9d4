#pragma once
// Collective communication between the ranks of a job, device-neutral: buffers are raw pointers
// with a DType and an element count, and every call takes the KernelContext (device, stream) the
// buffers live on. The MPI implementation serves CPU ranks; the CUDA backend implements the same
// interface with NCCL (dist/nccl_communicator.cu, bootstrapped over MPI), passing host buffers on
// to the MPI communicator it wraps. Every collective has a non-blocking form returning a handle
// (start_*), and a blocking form that waits on it. Buffers must stay allocated until the wait.
//
// Semantics (those of MPI and NCCL):
//   all_reduce      buf[i] = op over ranks of buf[i]                          (count elements)
//   all_gather      recv[r * count + i] = rank r's send[i]; in place when send == recv + rank * count
//   reduce_scatter  recv[i] = op over ranks of send[rank * count + i]       (send holds size * count)
//   broadcast       buf = root's buf
//   all_to_all      (MPI_Alltoallv) send holds size segments packed in rank order, segment p
//                   (send_counts[p] elements) going to rank p; recv receives size segments packed
//                   in rank order, segment p (recv_counts[p] elements) from rank p. recv_counts[p]
//                   must equal rank p's send_counts[rank] (exchange the counts first: an
//                   all_to_all of I64 with every count 1). send and recv must not overlap.
// Reductions support F32, F64, I64 and BF16 (summed in f32, rounded once per step of the
// reduction); gathers, broadcasts and all_to_all move any dtype. Ranks must call collectives in
// the same order.
//
// A handle's wait() gives up after the communicator's timeout with an error naming the collective,
// its size, the group and the config key that set the timeout, so that a dead or hung rank stops
// the others instead of hanging them.
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "titan/core/check.h"
#include "titan/core/device_services.h"
#include "titan/core/dtype.h"

namespace titan::dist {

enum class ReduceOp : uint8_t { Sum, Max };

// Communication of training steps (dist::ShardedBlocks counts it, since its reset_stats()): what
// this rank sent (a ring collective over n ranks of B bytes sends (n-1)/n B for a gather or
// reduce-scatter, twice that for an all-reduce; an all-to-all what goes to the other ranks) and the
// time it spent inside communication calls (starting, polling and waiting for collectives): the
// communication compute did not hide. On CPU ranks MPI moves shared-memory data only inside such
// calls, so this includes the copies themselves.
struct CommStats {
  int64_t bytes_sent = 0;
  int64_t collectives = 0;
  int64_t ring_steps = 0;  // (n-1) per gather, reduce-scatter or all-to-all, 2(n-1) per
                           // all-reduce: one latency each
  // Of bytes_sent and collectives: the expert exchange's all-to-alls (expert parallelism), which
  // titan plan names beside the sharding's collectives.
  int64_t all_to_all_bytes = 0;
  int64_t all_to_alls = 0;
  double seconds = 0;
};

class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual void wait() = 0;  // returns when the collective is complete on this rank
  // Lets the collective progress (MPI moves data of non-blocking collectives only inside MPI calls)
  // and says whether it is complete; wait() is still required before the handle is dropped.
  virtual bool poll() = 0;
};

// How long a wait for a collective may last before it is an error, and the config key that set it
// (the error names it): comm.timeout_seconds, or torchtitan's comm.init_timeout_seconds (start-up,
// checkpoint load and the first step) and comm.train_timeout_seconds (every step after it).
struct CommTimeout {
  explicit CommTimeout(double s, std::string k = "comm.timeout_seconds") : seconds(s), key(std::move(k)) {}
  double seconds;
  std::string key;
};

// An error naming the key unless the seconds are positive and at most 1e9 (~31 years: a wait's
// deadline is counted in 64-bit nanoseconds, which 9.2e9 s overflows). Inline: the config's
// validation uses it without the communicators.
inline void check_timeout(const CommTimeout& timeout) {
  TITAN_CHECK(std::isfinite(timeout.seconds) && timeout.seconds > 0 && timeout.seconds <= 1e9, timeout.key,
              " must be positive and at most 1e9 seconds, got ", timeout.seconds);
}

// The timeout a communicator shares with every group split from it, so that set_timeout on the
// world reaches them all; a wait reads it when it starts.
class SharedTimeout {
 public:
  explicit SharedTimeout(CommTimeout t) : t_(std::move(t)) {}
  CommTimeout get() const {
    std::lock_guard<std::mutex> lock(m_);
    return t_;
  }
  void set(CommTimeout t) {
    std::lock_guard<std::mutex> lock(m_);
    t_ = std::move(t);
  }

 private:
  mutable std::mutex m_;
  CommTimeout t_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The library behind it, e.g. "Open MPI v4.1.4 (MPI 3.1)", or "none (one process)".
  virtual std::string library() const = 0;

  virtual std::unique_ptr<CommHandle> start_all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                                                       const KernelContext& ctx) = 0;
  virtual std::unique_ptr<CommHandle> start_all_gather(const void* send, void* recv, int64_t count,
                                                       DType dtype, const KernelContext& ctx) = 0;
  virtual std::unique_ptr<CommHandle> start_reduce_scatter(const void* send, void* recv, int64_t count,
                                                           DType dtype, ReduceOp op,
                                                           const KernelContext& ctx) = 0;
  virtual std::unique_ptr<CommHandle> start_broadcast(void* buf, int64_t count, DType dtype, int root,
                                                      const KernelContext& ctx) = 0;
  // Both spans hold size() counts, each >= 0 (check_all_to_all); they are read before it returns
  // (the handle keeps what the library needs until the exchange completes).
  virtual std::unique_ptr<CommHandle> start_all_to_all(const void* send, std::span<const int64_t> send_counts,
                                                       void* recv, std::span<const int64_t> recv_counts,
                                                       DType dtype, const KernelContext& ctx) = 0;
  virtual void barrier() = 0;

  // Ends every rank of the job with exit status `code`: a rank that failed alone must not leave
  // the others waiting in a collective.
  [[noreturn]] virtual void abort(int code) = 0;

  // The ranks passing the same `color` form a new communicator of `size` ranks, ranked by `key`. Every
  // rank of a group passes its size, which the caller's mesh knows: a real communicator checks it,
  // and a planning one (dist/meta_world.h), whose other ranks are imagined, takes it as given.
  virtual std::unique_ptr<Communicator> split(int color, int key, int size) = 0;

  // The timeout of every wait from now on, in this communicator and every group split from it
  // (before or after this call). An error when not positive. A world that never waits (one
  // process, meta) keeps nothing.
  virtual void set_timeout(const CommTimeout& timeout) = 0;
  // The timeout in effect: the last set_timeout's, else the one the communicator was made with
  // (comm.timeout_seconds' default for a world that never waits).
  virtual CommTimeout timeout() const = 0;

  // Blocking forms.
  void all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op, const KernelContext& ctx);
  void all_gather(const void* send, void* recv, int64_t count, DType dtype, const KernelContext& ctx);
  void reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                      const KernelContext& ctx);
  void broadcast(void* buf, int64_t count, DType dtype, int root, const KernelContext& ctx);
  void all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                  std::span<const int64_t> recv_counts, DType dtype, const KernelContext& ctx);
};

// The elements an all_to_all sends and receives in all, after checking its arguments for a group
// of `size` ranks: one count per rank in each span, none negative, send and recv not overlapping;
// an error naming the entry and the rule otherwise. Every communicator's start_all_to_all calls it.
struct AllToAllTotals {
  int64_t send = 0, recv = 0;
  // "all_to_all(f32 x 12 sent, 9 received)": the collective in errors and timeouts.
  std::string describe(DType dtype) const;
};
AllToAllTotals check_all_to_all(const void* send, std::span<const int64_t> send_counts, const void* recv,
                                std::span<const int64_t> recv_counts, DType dtype, int size);

// The context of host (CPU) buffers (no stream, no services needed).
KernelContext host_context();

// Whether an MPI launcher started this process (mpirun / srun set OMPI_COMM_WORLD_SIZE, PMI_SIZE
// or PMIX_RANK).
bool started_by_launcher();
// This process' rank as the launcher numbered it (from its environment), before MPI is initialised:
// for errors that stop a rank before the communicator exists. nullopt without a launcher.
std::optional<int> launcher_rank();
// The number of ranks the launcher started (OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS), before
// MPI is initialised; 1 without a launcher; nullopt under a launcher that does not say.
std::optional<int> launcher_world_size();

// A wait on another rank's long file work (writing a checkpoint's files or the Hugging Face export,
// reading a checkpoint) is no sign of a hang: for the life of this scope the world's timeout, and its
// groups', grows by the time `bytes` take at kSlowDiskBytesPerSecond, so that a rank waiting on a
// writer is not stopped as if the writer had died (with comm.timeout_seconds' 300 s, a replica
// waiting while another writes Qwen3-30B-A3B's 366 GB of state would be); the bound before is put
// back at the end. `bytes`: what all the ranks read or write in the scope (on one shared file system
// they take turns at its pace). A wait that outlasts it names both parts: "did not complete within
// 7628 s (comm.train_timeout_seconds + 7328 s to write the checkpoint: 366.4 GB at 50 MB/s)".
class DiskTimeAllowance {
 public:
  // A busy network file system's pace; local disks write 10-100 times faster.
  static constexpr double kSlowDiskBytesPerSecond = 50e6;
  DiskTimeAllowance(Communicator& world, uint64_t bytes, const std::string& what);
  ~DiskTimeAllowance();
  DiskTimeAllowance(const DiskTimeAllowance&) = delete;
  DiskTimeAllowance& operator=(const DiskTimeAllowance&) = delete;

 private:
  Communicator& world_;
  CommTimeout before_;
  bool widened_;  // no bytes, no change
};

// The process id of Open MPI's mpirun (or mpiexec, orterun, prterun) when it is this process' parent, the
// launcher of every rank on its own host; nullopt otherwise (no launcher, another launcher, a rank
// on another host under an orted). What the start-up line on stopping a job names.
std::optional<int> open_mpi_launcher_pid();

// The communicator of this process: MPI when a launcher started it (started_by_launcher), else a
// world of one that needs no MPI at all.
// With `device` other than the CPU and more than one rank, the device's communicator built over
// the MPI one (cuda: NCCL, one GPU per rank); an error naming the device when it has none.
// `timeout` bounds MPI_Init and every wait until set_timeout. Call once per process (MPI is
// initialised once).
std::unique_ptr<Communicator> launch_communicator(const CommTimeout& timeout, Device device = Device::CPU);

// A device backend's communicator, built over a host communicator (any size) that it
// keeps (for host buffers, barriers, aborts and its own bootstrap). The CUDA backend library
// registers NCCL's when it is loaded (core/device_services.h).
using DeviceCommunicatorFactory = std::unique_ptr<Communicator> (*)(std::unique_ptr<Communicator> host,
                                                                    const CommTimeout& timeout);
void register_device_communicator(Device device, DeviceCommunicatorFactory factory);
// `host` wrapped by the communicator of `device` (loading its backend first); an error naming the
// device when the backend cannot be loaded or brings no communicator.
std::unique_ptr<Communicator> device_communicator(std::unique_ptr<Communicator> host, Device device,
                                                  const CommTimeout& timeout);

// A world of one process: every collective is a copy or nothing.
std::unique_ptr<Communicator> single_process_communicator();

}  // namespace titan::dist
