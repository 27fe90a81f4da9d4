// The NCCL communicator (dist/nccl_communicator.cu) on real GPUs: every collective (all_reduce
// sum/max in f32, bf16, f64 and i64; all_gather out of place and in place; reduce_scatter;
// broadcast; all_to_all with uneven counts), blocking and with several start_* handles in flight,
// and split groups, on CUDA buffers against (a) the same collective on host buffers through the
// host communicator it wraps (MPI under mpirun) and (b) the result computed here from every
// rank's inputs. The inputs are multiples of 1/8 below 64, so every sum is exact in every dtype and
// all three agree bit for bit.
//   - a world of one rank (any machine with a GPU; NCCL bootstrapped over the one-process
//     communicator, no launcher needed), also polling a collective still running;
//   - two ranks under `mpirun -np 2` (this program again), one GPU each, when the machine has two
//     GPUs and mpirun: also a rank that skips a collective makes the other fail after
//     comm.timeout_seconds with an error naming the collective.
// Skips without a GPU or without NCCL in the build, saying which.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "backend/cuda_test_util.h"
#include "test_util.h"
#include "titan/core/element.h"
#include "titan/dist/communicator.h"
#ifdef TITAN_HAVE_CUDA
#include "titan/backend/cuda/device.h"
#endif

namespace titan {
namespace {

namespace tt = titan::testing;
using dist::Communicator;
using dist::ReduceOp;

constexpr double kTimeoutSeconds = 60;
// Set by the parent test for the ranks it starts under mpirun.
constexpr const char* kRankEnv = "TITAN_NCCL_TEST_RANKS";

std::string nccl_skip_reason() {
  std::string why = tt::cuda_skip_reason();
  if (!why.empty()) return why;
#ifndef TITAN_HAVE_NCCL
  return "the CUDA backend was built without NCCL (nccl.h / libnccl not found at configure time)";
#else
  return "";
#endif
}

#define REQUIRE_NCCL()                                                  \
  do {                                                                  \
    const std::string titan_nccl_skip = nccl_skip_reason();             \
    if (!titan_nccl_skip.empty()) GTEST_SKIP() << titan_nccl_skip;      \
  } while (0)

// Rank r's input element i, exact in bf16.
double input(int rank, int salt, int64_t i) { return double((i * 7 + rank * 13 + salt * 5) % 64) / 8.0 - 4.0; }

std::vector<uint8_t> bytes_of(const std::vector<double>& v, DType dtype) {
  std::vector<uint8_t> b(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) store_element(b.data(), dtype, int64_t(i), v[i]);
  return b;
}

std::vector<double> inputs(int rank, int salt, int64_t count) {
  std::vector<double> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[size_t(i)] = input(rank, salt, i);
  return v;
}

// One collective on host buffers and on CUDA buffers. `run` starts it on (ctx, in, out) and
// returns its handle; `in` starts as `in_bytes`, `out` as `out_bytes` (in-place collectives use
// only `out`). Returns {host result, device result} of `out`.
using Start = std::function<std::unique_ptr<dist::CommHandle>(const KernelContext&, void* in, void* out)>;
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> run_both(const std::vector<uint8_t>& in_bytes,
                                                               std::vector<uint8_t> out_bytes, const Start& run) {
  std::vector<uint8_t> host_in = in_bytes, host_out = out_bytes;
  run(dist::host_context(), host_in.data(), host_out.data())->wait();

  DeviceServices& gpu = device_services(Device::CUDA);
  void* din = gpu.allocate(in_bytes.size());
  void* dout = gpu.allocate(out_bytes.size());
  gpu.copy_from_host(din, in_bytes.data(), in_bytes.size());
  gpu.copy_from_host(dout, out_bytes.data(), out_bytes.size());
  run(gpu.context(), din, dout)->wait();
  gpu.copy_to_host(out_bytes.data(), dout, out_bytes.size());
  gpu.deallocate(din, in_bytes.size());
  gpu.deallocate(dout, out_bytes.size());
  return {host_out, out_bytes};
}

void expect_equal(const std::vector<uint8_t>& got, const std::vector<double>& want, DType dtype,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size() * dtype_size(dtype)) << what;
  for (size_t i = 0; i < want.size(); ++i)
    if (load_element(got.data(), dtype, int64_t(i)) != want[i]) {
      ADD_FAILURE() << what << ": element " << i << " is " << load_element(got.data(), dtype, int64_t(i))
                    << ", expected " << want[i];
      return;
    }
}

// Every collective of `comm` (an NCCL communicator) on this rank.
void check_every_collective(Communicator& comm) {
  const int rank = comm.rank(), size = comm.size();
  SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(size));

  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::I64})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      const int64_t n = 1000 + 3;
      // Integers for i64 (the inputs truncated).
      auto value = [&](int r, int64_t i) { return dt == DType::I64 ? double(int64_t(input(r, 1, i))) : input(r, 1, i); };
      std::vector<double> want(static_cast<size_t>(n)), mine(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        double acc = op == ReduceOp::Sum ? 0.0 : -1e300;
        for (int r = 0; r < size; ++r) acc = op == ReduceOp::Sum ? acc + value(r, i) : std::max(acc, value(r, i));
        want[size_t(i)] = acc;
        mine[size_t(i)] = value(rank, i);
      }
      const std::string what = std::string("all_reduce ") + std::string(dtype_name(dt)) +
                               (op == ReduceOp::Sum ? " sum" : " max");
      auto [host, device] = run_both({0}, bytes_of(mine, dt), [&](const KernelContext& ctx, void*, void* out) {
        return comm.start_all_reduce(out, n, dt, op, ctx);
      });
      EXPECT_EQ(device, host) << what << ": NCCL differs from the host communicator";
      expect_equal(device, want, dt, what);
    }

  for (DType dt : {DType::F32, DType::U8, DType::BF16}) {
    const int64_t n = 777;
    std::vector<double> want;
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < n; ++i) want.push_back(dt == DType::U8 ? double((i + r) % 251) : input(r, 2, i));
    std::vector<double> mine(want.begin() + rank * n, want.begin() + (rank + 1) * n);
    const std::string what = "all_gather " + std::string(dtype_name(dt));
    auto [host, device] = run_both(bytes_of(mine, dt), std::vector<uint8_t>(want.size() * dtype_size(dt)),
                                   [&](const KernelContext& ctx, void* in, void* out) {
                                     return comm.start_all_gather(in, out, n, dt, ctx);
                                   });
    EXPECT_EQ(device, host) << what;
    expect_equal(device, want, dt, what);
    // In place: this rank's slice already sits at its offset of the output.
    std::vector<double> placed(want.size(), 0.0);
    std::copy(mine.begin(), mine.end(), placed.begin() + rank * n);
    auto [host2, device2] = run_both({0}, bytes_of(placed, dt), [&](const KernelContext& ctx, void*, void* out) {
      return comm.start_all_gather(static_cast<char*>(out) + size_t(rank * n) * dtype_size(dt), out, n, dt, ctx);
    });
    EXPECT_EQ(device2, host2) << what << " in place";
    expect_equal(device2, want, dt, what + " in place");
  }

  for (DType dt : {DType::F32, DType::BF16}) {
    const int64_t n = 513;  // per rank
    std::vector<double> want(static_cast<size_t>(n), 0.0);
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] += input(r, 3, rank * n + i);
    const std::string what = "reduce_scatter " + std::string(dtype_name(dt));
    auto [host, device] = run_both(bytes_of(inputs(rank, 3, n * size), dt),
                                   std::vector<uint8_t>(size_t(n) * dtype_size(dt)),
                                   [&](const KernelContext& ctx, void* in, void* out) {
                                     return comm.start_reduce_scatter(in, out, n, dt, ReduceOp::Sum, ctx);
                                   });
    EXPECT_EQ(device, host) << what;
    expect_equal(device, want, dt, what);
  }

  for (int root : {size - 1, 0}) {
    const int64_t n = 4099;
    const std::string what = "broadcast from rank " + std::to_string(root);
    auto [host, device] = run_both({0}, bytes_of(inputs(rank, 4, n), DType::F32),
                                   [&](const KernelContext& ctx, void*, void* out) {
                                     return comm.start_broadcast(out, n, DType::F32, root, ctx);
                                   });
    EXPECT_EQ(device, host) << what;
    expect_equal(device, inputs(root, 4, n), DType::F32, what);
  }

  for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
    // Rank s sends rank d count(s, d) elements: uneven, and zero for some pairs of two ranks
    // (rank 0 sends rank 1 nothing). Element i of that segment is input(s, 7 + d, i).
    auto count = [](int s, int d) { return int64_t((s * 2 + d * 3 + 1) % 4) * 97; };
    auto element = [&](int s, int d, int64_t i) {
      return dt == DType::I64 ? double(int64_t(input(s, 7 + d, i))) : input(s, 7 + d, i);
    };
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<double> mine, want;
    for (int p = 0; p < size; ++p) {
      send_counts.push_back(count(rank, p));
      recv_counts.push_back(count(p, rank));
      for (int64_t i = 0; i < count(rank, p); ++i) mine.push_back(element(rank, p, i));
      for (int64_t i = 0; i < count(p, rank); ++i) want.push_back(element(p, rank, i));
    }
    const std::string what = "all_to_all " + std::string(dtype_name(dt));
    auto [host, device] = run_both(bytes_of(mine, dt), std::vector<uint8_t>(want.size() * dtype_size(dt)),
                                   [&](const KernelContext& ctx, void* in, void* out) {
                                     return comm.start_all_to_all(in, send_counts, out, recv_counts, dt, ctx);
                                   });
    EXPECT_EQ(device, host) << what << ": NCCL differs from the host communicator";
    expect_equal(device, want, dt, what);
  }

  {  // Several collectives in flight on the communication stream, waited on in reverse order.
    DeviceServices& gpu = device_services(Device::CUDA);
    const int64_t n = 1 << 16;
    std::vector<double> want(static_cast<size_t>(n), 0.0);
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] += input(r, 5, i);
    const std::vector<uint8_t> mine = bytes_of(inputs(rank, 5, n), DType::F32);
    std::vector<void*> bufs;
    std::vector<std::unique_ptr<dist::CommHandle>> pending;
    for (int k = 0; k < 4; ++k) {
      bufs.push_back(gpu.allocate(mine.size()));
      gpu.copy_from_host(bufs.back(), mine.data(), mine.size());
      pending.push_back(comm.start_all_reduce(bufs.back(), n, DType::F32, ReduceOp::Sum, gpu.context()));
    }
    for (int k = 3; k >= 0; --k) pending[size_t(k)]->wait();
    for (int k = 0; k < 4; ++k) {
      std::vector<uint8_t> got(mine.size());
      gpu.copy_to_host(got.data(), bufs[size_t(k)], got.size());
      expect_equal(got, want, DType::F32, "all_reduce " + std::to_string(k) + " of 4 in flight");
      gpu.deallocate(bufs[size_t(k)], mine.size());
    }
  }

  {  // Split groups are NCCL communicators too: all ranks together, and each rank alone.
    auto all = comm.split(0, rank, comm.size());
    auto alone = comm.split(rank, 0, 1);
    ASSERT_EQ(all->size(), size);
    ASSERT_EQ(alone->size(), 1);
    const int64_t n = 301;
    std::vector<double> want(static_cast<size_t>(n), 0.0);
    for (int r = 0; r < size; ++r)
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] += input(r, 6, i);
    auto [h1, d1] = run_both({0}, bytes_of(inputs(rank, 6, n), DType::F32), [&](const KernelContext& ctx, void*, void* out) {
      return all->start_all_reduce(out, n, DType::F32, ReduceOp::Sum, ctx);
    });
    expect_equal(d1, want, DType::F32, "all_reduce over split(0, rank)");
    auto [h2, d2] = run_both({0}, bytes_of(inputs(rank, 6, n), DType::F32), [&](const KernelContext& ctx, void*, void* out) {
      return alone->start_all_reduce(out, n, DType::F32, ReduceOp::Sum, ctx);
    });
    expect_equal(d2, inputs(rank, 6, n), DType::F32, "all_reduce over split(rank, 0)");
  }

  EXPECT_NE(comm.library().find("NCCL "), std::string::npos) << comm.library();
  // A reduction NCCL and MPI do not define here is refused by name, as by the MPI communicator.
  DeviceServices& gpu = device_services(Device::CUDA);
  void* b = gpu.allocate(16);
  EXPECT_NE(tt::error_of([&] { comm.all_reduce(b, 16, DType::U8, ReduceOp::Sum, gpu.context()); })
                .find("reductions support f32, f64, i64 and bf16, got u8"),
            std::string::npos);
  // An all_to_all's counts are checked before NCCL sees them, as by every communicator.
  const std::vector<int64_t> too_many(size_t(size) + 1, 0), counts(size_t(size), 0);
  EXPECT_NE(tt::error_of([&] {
              comm.all_to_all(b, too_many, b, counts, DType::F32, gpu.context());
            }).find("comm: all_to_all: send_counts has " + std::to_string(size + 1) + " entries"),
            std::string::npos);
  gpu.deallocate(b, 16);
}

TEST(Nccl, EveryCollectiveInAWorldOfOneRank) {
  REQUIRE_NCCL();
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs NcclRanks.* only";
  auto comm = dist::device_communicator(dist::single_process_communicator(), Device::CUDA,
                                        dist::CommTimeout(kTimeoutSeconds));
  ASSERT_EQ(comm->size(), 1);
  check_every_collective(*comm);
  // A new timeout is checked, named, and taken by the NCCL world, its host MPI world and their
  // groups alike (the trainer's step bound); the collectives still run under it.
  EXPECT_NE(tt::error_of([&] {
              comm->set_timeout(dist::CommTimeout(0, "test.timeout_key"));
            }).find("test.timeout_key must be positive and at most 1e9 seconds, got 0"),
            std::string::npos);
  comm->set_timeout(dist::CommTimeout(30, "test.timeout_key"));
  check_every_collective(*comm);
}

// A poll() that finds a collective still running must leave nothing in CUDA's last-error slot
// (cudaEventQuery's cudaErrorNotReady): the next kernel's launch check would read it as its own
// failure, as an FSDP step's first layer did after polling its prefetched gather. A 1 GiB fill
// queued ahead keeps the collective pending while it is polled.
TEST(Nccl, APollWhileTheCollectiveRunsLeavesNoErrorForTheNextKernel) {
  REQUIRE_NCCL();
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs NcclRanks.* only";
  auto comm = dist::device_communicator(dist::single_process_communicator(), Device::CUDA,
                                        dist::CommTimeout(kTimeoutSeconds));
  DeviceServices& gpu = device_services(Device::CUDA);
  const int64_t n = int64_t(1) << 28, m = 1024;
  void* big = gpu.allocate(size_t(n) * 4);
  void* small = gpu.allocate(size_t(m) * 4);
  gpu.fill(big, n, DType::F32, 1.0);
  auto handle = comm->start_all_reduce(big, n, DType::F32, ReduceOp::Sum, gpu.context());
  int pending_polls = 0;
  for (int i = 0; i < 3; ++i) pending_polls += handle->poll() ? 0 : 1;
  RecordProperty("pending_polls", pending_polls);
  EXPECT_NO_THROW(gpu.fill(small, m, DType::F32, 2.0))
      << "after " << pending_polls << " polls that found it running";
  handle->wait();
  float first = 0, last = 0;
  gpu.copy_to_host(&first, big, 4);
  gpu.copy_to_host(&last, small, 4);
  EXPECT_EQ(first, 1.0f);  // the sum over one rank
  EXPECT_EQ(last, 2.0f);
  gpu.deallocate(big, size_t(n) * 4);
  gpu.deallocate(small, size_t(m) * 4);
}

int gpu_count() {
#ifdef TITAN_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

TEST(Nccl, EveryCollectiveOverTwoRanksMatchesMpi) {
  REQUIRE_NCCL();
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs NcclRanks.* only";
  if (gpu_count() < 2) GTEST_SKIP() << "two ranks need two GPUs (one GPU per rank); this machine has " << gpu_count();
  std::string found;
  if (tt::run_command("command -v mpirun", &found) != 0) GTEST_SKIP() << "mpirun not found on PATH";
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  std::string out;
  // The ranks find the same libraries as this process (the GPU bundle sets LD_LIBRARY_PATH).
  const std::string pass_libs = std::getenv("LD_LIBRARY_PATH") ? " -x LD_LIBRARY_PATH" : "";
  const int rc = tt::run_command(std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ") + kRankEnv +
                                     "=1 mpirun --oversubscribe --bind-to none -x " + kRankEnv + pass_libs +
                                     " -np 2 " + self + " --gtest_filter='NcclRanks.*'",
                                 &out);
  EXPECT_EQ(rc, 0) << out;
  size_t passed = 0;
  for (size_t at = out.find("[  PASSED  ] 2 tests"); at != std::string::npos;
       at = out.find("[  PASSED  ] 2 tests", at + 1))
    ++passed;
  EXPECT_EQ(passed, 2u) << "both ranks must pass both NcclRanks tests:\n" << out;
}

// The ranks' side of Nccl.EveryCollectiveOverTwoRanksMatchesMpi (skipped when run directly): the
// NCCL world over MPI that launch_communicator builds for a CUDA job, made once per process (MPI
// is initialised once) and released by the last test, before the CUDA runtime shuts down.
constexpr double kRankTimeoutSeconds = 10;
std::unique_ptr<Communicator>& rank_world() {
  static std::unique_ptr<Communicator> world =
      dist::launch_communicator(dist::CommTimeout(kRankTimeoutSeconds), Device::CUDA);
  return world;
}

TEST(NcclRanks, EveryCollectiveMatchesMpi) {
  if (!std::getenv(kRankEnv)) GTEST_SKIP() << "runs under mpirun, started by Nccl.EveryCollectiveOverTwoRanksMatchesMpi";
  REQUIRE_NCCL();
  Communicator& world = *rank_world();
  ASSERT_EQ(world.size(), 2);
  EXPECT_NE(world.library().find("NCCL "), std::string::npos) << "launch_communicator did not pick NCCL";
  check_every_collective(world);
}

// Runs last: it leaves the communicator aborted, then releases it (MPI_Finalize).
TEST(NcclRanks, ARankThatSkipsACollectiveMakesTheOtherFailNamingIt) {
  if (!std::getenv(kRankEnv)) GTEST_SKIP() << "runs under mpirun, started by Nccl.EveryCollectiveOverTwoRanksMatchesMpi";
  REQUIRE_NCCL();
  Communicator& world = *rank_world();
  DeviceServices& gpu = device_services(Device::CUDA);
  void* buf = gpu.allocate(4096);
  world.barrier();
  if (world.rank() == 0) {
    const std::string err = tt::error_of([&] { world.all_reduce(buf, 1024, DType::F32, ReduceOp::Sum, gpu.context()); });
    EXPECT_NE(err.find("comm: rank 0: all_reduce(f32 x 1024, sum) over 2 ranks (NCCL) did not complete within 10 s"),
              std::string::npos)
        << err;
  }
  world.barrier();  // over MPI: rank 1 stays until rank 0 has given up
  gpu.deallocate(buf, 4096);
  rank_world().reset();
}

}  // namespace
}  // namespace titan
