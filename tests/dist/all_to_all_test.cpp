// dist::Communicator::all_to_all (MPI_Alltoallv semantics) over three real MPI ranks (`mpirun -np 3`,
// this program again), and in the world of one process. Element i of the segment rank s sends
// rank d is value(dtype, s, d, i), exact in the dtype, so every receiver recomputes what each
// sender wrote and checks it bit for bit; the receive buffers start as a sentinel (NaN, -1) with
// spare elements past the end, so an element written where nothing should arrive is caught too.
// The counts are uneven, with zeros: a rank that sends a peer nothing, a rank that receives
// nothing at all, a rank that sends nothing at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dist_test_util.h"
#include "test_util.h"
#include "titan/core/device_services.h"
#include "titan/core/element.h"
#include "titan/dist/communicator.h"

namespace titan {
namespace {

namespace tt = titan::testing;
using dist::Communicator;

constexpr int kRanks = 3;
constexpr int kRankTests = 7;  // the AllToAllRanks tests every rank runs
// Set by the parent test for the ranks it starts under mpirun.
constexpr const char* kRankEnv = "TITAN_ALL_TO_ALL_TEST_RANKS";

// Element i of what rank src sends rank dst, exact in `dtype` and different for (nearly) every
// (src, dst, i): bf16 and u8 keep only 8 significant bits, so theirs repeat after 256.
double value(DType dtype, int src, int dst, int64_t i) {
  switch (dtype) {
    case DType::BF16:
      return double((src * 89 + dst * 31 + i * 7) % 256) - 128;
    case DType::U8:
      return double((src * 89 + dst * 31 + i * 7) % 256);
    case DType::F32:
      return double(src * (1 << 20) + dst * (1 << 18) + i) - double(1 << 21) + 0.5;
    case DType::I64:
      return double(src) * 1e12 + double(dst) * 1e6 + double(i);
    default:
      return std::ldexp(double(src), 40) + std::ldexp(double(dst), 20) + double(i) + 0.25;  // f64
  }
}

// Elements rank s sends rank d.
using Counts = std::function<int64_t(int s, int d)>;

// Over three ranks: rank 0 sends rank 1 nothing, rank 2 sends rank 0 nothing, rank 1 receives
// nothing at all.
int64_t uneven(int s, int d) {
  constexpr int64_t table[kRanks][kRanks] = {{2, 0, 7}, {4, 0, 1}, {0, 0, 9}};
  return table[s][d];
}
// Its transpose: rank 1 sends nothing at all.
int64_t uneven_transposed(int s, int d) {
  return uneven(d, s);
}

constexpr int64_t kSpare = 3;  // sentinel elements past the end of every receive buffer

// One rank's side of an all_to_all over `size` ranks: its buffers, counts and what it must receive.
struct Exchange {
  Exchange(int rank, int size, const Counts& counts, int64_t scale, DType dt) : rank(rank), dtype(dt) {
    for (int p = 0; p < size; ++p) {
      send_counts.push_back(counts(rank, p) * scale);
      recv_counts.push_back(counts(p, rank) * scale);
    }
    int64_t sent = 0, received = 0;
    for (int p = 0; p < size; ++p) {
      sent += send_counts[size_t(p)];
      received += recv_counts[size_t(p)];
    }
    send.resize(size_t(sent) * dtype_size(dt));
    int64_t at = 0;
    for (int p = 0; p < size; ++p)
      for (int64_t i = 0; i < send_counts[size_t(p)]; ++i)
        store_element(send.data(), dt, at++, value(dt, rank, p, i));
    // All bits set: NaN in the float dtypes, -1 in i64, 255 in u8: no value() of these counts.
    recv.assign(size_t(received + kSpare) * dtype_size(dt), 0xFF);
  }

  std::unique_ptr<dist::CommHandle> start(Communicator& comm) {
    return comm.start_all_to_all(send.data(), send_counts, recv.data(), recv_counts, dtype,
                                 dist::host_context());
  }

  // Every element received is value(dtype, p, rank, i); the spare elements are untouched.
  void check(const std::string& what) const {
    SCOPED_TRACE(what + ", " + std::string(dtype_name(dtype)) + ", rank " + std::to_string(rank));
    int64_t at = 0, wrong = 0;
    for (size_t p = 0; p < recv_counts.size(); ++p)
      for (int64_t i = 0; i < recv_counts[p]; ++i, ++at) {
        const double got = load_element(recv.data(), dtype, at), want = value(dtype, int(p), rank, i);
        if (got != want && ++wrong <= 5)
          ADD_FAILURE() << "element " << i << " from rank " << p << " is " << got << ", expected " << want;
      }
    EXPECT_EQ(wrong, 0);
    const uint8_t* tail = recv.data() + size_t(at) * dtype_size(dtype);
    for (size_t b = 0; b < size_t(kSpare) * dtype_size(dtype); ++b)
      ASSERT_EQ(tail[b], 0xFF) << "a byte past the " << at << " elements received was written";
  }

  int rank;
  DType dtype;
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<uint8_t> send, recv;
};

const std::vector<DType> kDtypes = {DType::F32, DType::BF16, DType::I64, DType::F64, DType::U8};

// ------------------------------------------------------------------ three real ranks

TEST(AllToAll, OverThreeRealRanks) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs AllToAllRanks.* only";
  const tt::RanksRun run = tt::run_this_program_on_ranks(kRanks, kRankEnv, "AllToAllRanks.*", kRankTests);
  if (!run.skipped.empty()) GTEST_SKIP() << run.skipped;
  EXPECT_EQ(run.rc, 0) << run.output;
  EXPECT_EQ(run.ranks_passed, kRanks)
      << "every rank must pass the " << kRankTests << " AllToAllRanks tests:\n"
      << run.output;
}

// The rank side (skipped when run directly).
#define REQUIRE_RANK()                                                                                       \
  do {                                                                                                       \
    if (!std::getenv(kRankEnv)) GTEST_SKIP() << "runs under mpirun, started by AllToAll.OverThreeRealRanks"; \
  } while (0)

TEST(AllToAllRanks, UnevenCountsWithZerosInEveryDtype) {
  REQUIRE_RANK();
  Communicator& world = tt::rank_world();
  ASSERT_EQ(world.size(), kRanks);
  // 517 elements a unit: segments of up to 4653 elements, past the eager message sizes.
  for (int64_t scale : {1, 517})
    for (DType dt : kDtypes) {
      Exchange x(world.rank(), kRanks, uneven, scale, dt);
      world.all_to_all(x.send.data(), x.send_counts, x.recv.data(), x.recv_counts, dt, dist::host_context());
      x.check("uneven x " + std::to_string(scale));
    }
  // The transposed counts: rank 1 sends nothing at all (and receives from everyone).
  Exchange x(world.rank(), kRanks, uneven_transposed, 11, DType::F32);
  x.start(world)->wait();
  x.check("transposed x 11");
}

TEST(AllToAllRanks, TwoInFlightOutliveTheirCountsAndAreWaitedInReverse) {
  REQUIRE_RANK();
  Communicator& world = tt::rank_world();
  Exchange a(world.rank(), kRanks, uneven, 129, DType::F32);
  Exchange b(world.rank(), kRanks, uneven_transposed, 257, DType::BF16);
  std::unique_ptr<dist::CommHandle> ha, hb;
  {
    // The handles own what the library reads: the callers' counts may change or die at once.
    std::vector<int64_t> sa = a.send_counts, ra = a.recv_counts, sb = b.send_counts, rb = b.recv_counts;
    ha = world.start_all_to_all(a.send.data(), sa, a.recv.data(), ra, a.dtype, dist::host_context());
    hb = world.start_all_to_all(b.send.data(), sb, b.recv.data(), rb, b.dtype, dist::host_context());
    for (auto* v : {&sa, &ra, &sb, &rb}) {
      std::fill(v->begin(), v->end(), int64_t(-7));
      v->clear();
      v->shrink_to_fit();
    }
  }
  hb->wait();
  ha->wait();
  EXPECT_TRUE(ha->poll());
  EXPECT_TRUE(hb->poll());
  a.check("first of two in flight");
  b.check("second of two in flight");
}

// The idiom of expert parallelism: each rank knows only what it sends; an all_to_all of one i64
// per peer tells every rank what it receives, then the data follows.
TEST(AllToAllRanks, CountsExchangedFirstThenTheData) {
  REQUIRE_RANK();
  Communicator& world = tt::rank_world();
  const int rank = world.rank();
  for (DType dt : {DType::BF16, DType::I64}) {
    std::vector<int64_t> send_counts, recv_counts(kRanks, -1);
    for (int p = 0; p < kRanks; ++p) send_counts.push_back(uneven(rank, p) * 33);
    const std::vector<int64_t> ones(kRanks, 1);
    world.all_to_all(send_counts.data(), ones, recv_counts.data(), ones, DType::I64, dist::host_context());
    for (int p = 0; p < kRanks; ++p)
      EXPECT_EQ(recv_counts[size_t(p)], uneven(p, rank) * 33) << "rank " << rank << " from rank " << p;

    Exchange x(rank, kRanks, uneven, 33, dt);
    ASSERT_EQ(x.send_counts, send_counts);
    world.all_to_all(x.send.data(), send_counts, x.recv.data(), recv_counts, dt, dist::host_context());
    x.check("after the count exchange");
  }
}

TEST(AllToAllRanks, WrongCountsAreErrorsNamingTheEntry) {
  REQUIRE_RANK();
  Communicator& world = tt::rank_world();
  float send[8] = {}, recv[8] = {};
  const std::vector<int64_t> two = {1, 1}, three = {1, 1, 1}, four = {1, 1, 1, 1}, negative = {1, -1, 1};
  auto error = [&](std::span<const int64_t> sc, std::span<const int64_t> rc) {
    return tt::error_of([&] { world.all_to_all(send, sc, recv, rc, DType::F32, dist::host_context()); });
  };
  std::string e = error(two, three);
  EXPECT_NE(e.find("comm: all_to_all: send_counts has 2 entries, expected one per rank of the group (3)"),
            std::string::npos)
      << e;
  e = error(three, four);
  EXPECT_NE(e.find("comm: all_to_all: recv_counts has 4 entries, expected one per rank of the group (3)"),
            std::string::npos)
      << e;
  e = error(three, negative);
  EXPECT_NE(e.find("comm: all_to_all: recv_counts[1] is -1, counts must be >= 0"), std::string::npos) << e;
  e = tt::error_of([&] { world.all_to_all(send, three, send + 1, three, DType::F32, dist::host_context()); });
  EXPECT_NE(e.find("comm: all_to_all: send (3 elements) and recv (3 elements) overlap"), std::string::npos)
      << e;
  e = tt::error_of([&] {
    world.all_to_all(send, three, recv, three, DType::F32, device_services(Device::Meta).context());
  });
  EXPECT_NE(e.find("comm: all_to_all on device meta: the MPI communicator moves host memory only"),
            std::string::npos)
      << e;
  // Past MPI's int counts and displacements. The addresses are far apart and never touched: the
  // error comes before MPI sees them.
  const auto* far_send = reinterpret_cast<const void*>(uintptr_t(1) << 44);
  auto* far_recv = reinterpret_cast<void*>(uintptr_t(1) << 45);
  const std::vector<int64_t> huge = {int64_t(INT_MAX) + 1, 0, 0}, long_way = {INT_MAX, INT_MAX, 2};
  e = tt::error_of(
      [&] { world.all_to_all(far_send, huge, far_recv, three, DType::U8, dist::host_context()); });
  EXPECT_NE(e.find("comm: all_to_all: send_counts[0] is 2147483648 elements, past MPI's int counts"),
            std::string::npos)
      << e;
  e = tt::error_of(
      [&] { world.all_to_all(far_send, three, far_recv, long_way, DType::U8, dist::host_context()); });
  EXPECT_NE(
      e.find("comm: all_to_all: recv segment 2 starts at element 4294967294, past MPI's int displacements"),
      std::string::npos)
      << e;
  // Every rank refused them before any message: the world still exchanges.
  Exchange x(world.rank(), kRanks, uneven, 5, DType::F32);
  x.start(world)->wait();
  x.check("after the refused calls");
}

// Split groups exchange among themselves: ranks {0, 2} as a group of two, rank 1 alone.
TEST(AllToAllRanks, SplitGroupsExchangeAmongThemselves) {
  REQUIRE_RANK();
  Communicator& world = tt::rank_world();
  auto group = world.split(world.rank() == 1 ? 1 : 0, world.rank(), world.rank() == 1 ? 1 : world.size() - 1);
  ASSERT_EQ(group->size(), world.rank() == 1 ? 1 : 2);
  const Counts counts = [](int s, int d) { return int64_t(3 + 5 * s + 2 * d); };
  for (DType dt : {DType::F32, DType::I64}) {
    Exchange x(group->rank(), group->size(), counts, 7, dt);
    x.start(*group)->wait();
    x.check("split group of " + std::to_string(group->size()));
  }
}

// A timeout set on the world binds the groups split from it before the call (the trainer sets the
// step bound after the plan split its groups): rank 0 waits on a group collective rank 1 joins only
// after 4 s, and gives up after the world's new 0.5 s, naming the key that set it.
TEST(AllToAllRanks, ATimeoutSetOnTheWorldBindsTheGroupsSplitBefore) {
  REQUIRE_RANK();
  Communicator& world = tt::rank_world();
  const bool pair = world.rank() < 2;
  auto group = world.split(pair ? 0 : 1, world.rank(), pair ? 2 : world.size() - 2);
  world.set_timeout(dist::CommTimeout(0.5, "test.timeout_key"));
  // Outlives the test: rank 0's timed-out request completes (into it) once rank 1 joins.
  static double value = 1;
  if (pair && group->rank() == 0) {
    auto handle = group->start_all_reduce(&value, 1, DType::F64, dist::ReduceOp::Sum, dist::host_context());
    const std::string e = tt::error_of([&] { handle->wait(); });
    EXPECT_NE(
        e.find("all_reduce(f64 x 1, sum) over 2 ranks did not complete within 0.5 s (test.timeout_key)"),
        std::string::npos)
        << e;
  } else if (pair) {
    std::this_thread::sleep_for(std::chrono::seconds(4));  // far past 0.5 s, even on a loaded host
    group->all_reduce(&value, 1, DType::F64, dist::ReduceOp::Sum, dist::host_context());
  }
  world.set_timeout(dist::CommTimeout(60));
  world.barrier();
}

// A wait on another rank's long file work (a replica waiting while another writes a checkpoint):
// inside a DiskTimeAllowance the world's bound grows by the bytes' time at 50 MB/s, and is put back
// after it; a wait that outlasts the allowance names both parts of its bound.
TEST(AllToAllRanks, ADiskTimeAllowanceWidensTheBoundForItsScope) {
  REQUIRE_RANK();
  Communicator& world = tt::rank_world();
  world.set_timeout(dist::CommTimeout(0.5, "test.timeout_key"));
  {
    const dist::DiskTimeAllowance allowance(world, 200'000'000, "write the test file");  // + 4 s
    EXPECT_EQ(world.timeout().seconds, 4.5);
    EXPECT_EQ(world.timeout().key, "test.timeout_key + 4 s to write the test file: 200.0 MB at 50 MB/s");
    // Rank 0 "writes" for 1.5 s, three times the bound without the allowance; the others wait.
    if (world.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    world.barrier();
  }
  EXPECT_EQ(world.timeout().seconds, 0.5);
  EXPECT_EQ(world.timeout().key, "test.timeout_key");
  {
    const dist::DiskTimeAllowance allowance(world, 1'000'000, "write the test file");  // + 1 s
    // Outlives the test: the timed-out request completes (into it) once rank 0 joins.
    static double value = 1;
    if (world.rank() != 0) {  // waits on rank 0, which sleeps past the widened bound
      auto handle = world.start_all_reduce(&value, 1, DType::F64, dist::ReduceOp::Sum, dist::host_context());
      const std::string e = tt::error_of([&] { handle->wait(); });
      EXPECT_NE(e.find("did not complete within 1.5 s (test.timeout_key + 1 s to write the test file: 1.0 MB "
                       "at 50 MB/s)"),
                std::string::npos)
          << e;
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(5));  // far past 1.5 s
      world.all_reduce(&value, 1, DType::F64, dist::ReduceOp::Sum, dist::host_context());
    }
  }
  world.set_timeout(dist::CommTimeout(60));
  world.barrier();
}

// ------------------------------------------------------------------ one process

TEST(AllToAll, ASingleProcessCopiesItsOnlySegment) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs AllToAllRanks.* only";
  auto comm = dist::single_process_communicator();
  const Counts counts = [](int, int) { return int64_t(37); };
  for (DType dt : kDtypes) {
    Exchange x(0, 1, counts, 1, dt);
    comm->all_to_all(x.send.data(), x.send_counts, x.recv.data(), x.recv_counts, dt, dist::host_context());
    x.check("one process, host context");
    // Through the device services' copy (the path of a device's buffers).
    Exchange y(0, 1, counts, 3, dt);
    comm->start_all_to_all(y.send.data(), y.send_counts, y.recv.data(), y.recv_counts, dt,
                           device_services(Device::CPU).context())
        ->wait();
    y.check("one process, cpu services");
  }
  // Nothing to move: no buffers needed.
  const std::vector<int64_t> zero = {0};
  comm->all_to_all(nullptr, zero, nullptr, zero, DType::F32, dist::host_context());
  EXPECT_TRUE(comm->start_all_to_all(nullptr, zero, nullptr, zero, DType::F32, dist::host_context())->poll());
}

TEST(AllToAll, ASingleProcessRefusesCountsThatDoNotMatch) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs AllToAllRanks.* only";
  auto comm = dist::single_process_communicator();
  float send[4] = {1, 2, 3, 4}, recv[4] = {};
  const std::vector<int64_t> four = {4}, three = {3}, two_entries = {2, 2}, negative = {-4};
  auto error = [&](std::span<const int64_t> sc, std::span<const int64_t> rc) {
    return tt::error_of([&] { comm->all_to_all(send, sc, recv, rc, DType::F32, dist::host_context()); });
  };
  std::string e = error(four, three);
  EXPECT_NE(e.find("comm: all_to_all: recv_counts[0] is 3 but this rank's send_counts[0] is 4"),
            std::string::npos)
      << e;
  e = error(two_entries, four);
  EXPECT_NE(e.find("comm: all_to_all: send_counts has 2 entries, expected one per rank of the group (1)"),
            std::string::npos)
      << e;
  e = error(negative, four);
  EXPECT_NE(e.find("comm: all_to_all: send_counts[0] is -4, counts must be >= 0"), std::string::npos) << e;
  e = tt::error_of([&] { comm->all_to_all(send, four, send, four, DType::F32, dist::host_context()); });
  EXPECT_NE(e.find("comm: all_to_all: send (4 elements) and recv (4 elements) overlap"), std::string::npos)
      << e;
  EXPECT_EQ(recv[0], 0.0f) << "a refused all_to_all wrote into recv";
}

}  // namespace
}  // namespace titan
