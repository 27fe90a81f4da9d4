// The meta world: a planning communicator whose other ranks are imagined. Meta buffers move
// nothing, host scalars keep this rank's values, a real tensor is refused.
#include <gtest/gtest.h>

#include "test_util.h"
#include "titan/core/tensor.h"
#include "titan/dist/meta_world.h"

namespace titan::dist {
namespace {

TEST(MetaWorld, MetaBuffersMoveNothingAndHostScalarsKeepThisRanksValues) {
  auto world = meta_world_communicator(8);
  EXPECT_EQ(world->rank(), 0);
  EXPECT_EQ(world->size(), 8);
  // Meta pointers fault if touched: every collective on them must be a no-op.
  Tensor m = Tensor::empty({64}, DType::F32, Device::Meta), shard = Tensor::empty({8}, DType::F32, Device::Meta);
  const KernelContext meta = device_services(Device::Meta).context();
  world->all_reduce(m.raw_data(), 64, DType::F32, ReduceOp::Sum, meta);
  world->all_gather(shard.raw_data(), m.raw_data(), 8, DType::F32, meta);
  world->reduce_scatter(m.raw_data(), shard.raw_data(), 8, DType::F32, ReduceOp::Sum, meta);
  world->broadcast(m.raw_data(), 64, DType::F32, 3, meta);
  double sums[2] = {1.5, 2.5};
  world->all_reduce(sums, 2, DType::F64, ReduceOp::Sum, host_context());
  EXPECT_EQ(sums[0], 1.5);
  EXPECT_EQ(sums[1], 2.5);
  int64_t mine = 42, all[8] = {};
  world->all_gather(&mine, all, 1, DType::I64, host_context());
  EXPECT_EQ(all[0], 42);
  EXPECT_EQ(all[1], 0);
  world->barrier();
}

// An all_to_all of host buffers copies the segment rank 0 sends itself (the first send_counts[0]
// elements into the first recv_counts[0]) and leaves what the imagined ranks would send.
TEST(MetaWorld, AllToAllCopiesRankZerosOwnSegmentOfHostBuffers) {
  auto world = meta_world_communicator(3);
  const std::vector<int64_t> send_counts = {2, 3, 1}, recv_counts = {2, 4, 0};
  const float send[6] = {1.5f, -2.5f, 3.0f, 4.0f, 5.0f, 6.0f};
  float recv[7] = {-1, -1, -1, -1, -1, -1, -1};
  world->all_to_all(send, send_counts, recv, recv_counts, DType::F32, host_context());
  EXPECT_EQ(recv[0], 1.5f);
  EXPECT_EQ(recv[1], -2.5f);
  for (int i = 2; i < 7; ++i) EXPECT_EQ(recv[i], -1.0f) << "element " << i << " is the imagined ranks'";
  // Meta buffers: nothing moves (their pointers fault if touched).
  Tensor s = Tensor::empty({6}, DType::BF16, Device::Meta), r = Tensor::empty({6}, DType::BF16, Device::Meta);
  world
      ->start_all_to_all(s.raw_data(), send_counts, r.raw_data(), recv_counts, DType::BF16,
                         device_services(Device::Meta).context())
      ->wait();
}

TEST(MetaWorld, AllToAllChecksItsCountsAndRefusesRealTensors) {
  auto world = meta_world_communicator(3);
  float send[4] = {}, recv[4] = {};
  const std::vector<int64_t> two = {1, 1}, three = {1, 1, 1}, other_self = {2, 1, 1};
  std::string e =
      testing::error_of([&] { world->all_to_all(send, two, recv, three, DType::F32, host_context()); });
  EXPECT_NE(e.find("comm: all_to_all: send_counts has 2 entries, expected one per rank of the group (3)"),
            std::string::npos)
      << e;
  e = testing::error_of(
      [&] { world->all_to_all(send, three, recv, other_self, DType::F32, host_context()); });
  EXPECT_NE(e.find("meta world: all_to_all: recv_counts[0] is 2 but send_counts[0] is 1"), std::string::npos)
      << e;
  Tensor a = Tensor::zeros({3}, DType::F32), b = Tensor::zeros({3}, DType::F32);
  e = testing::error_of([&] {
    world->all_to_all(a.raw_data(), three, b.raw_data(), three, DType::F32,
                      device_services(Device::CPU).context());
  });
  EXPECT_NE(e.find("meta world: all_to_all(f32 x 3) of a tensor on cpu"), std::string::npos) << e;
  // A split group takes the number of counts of its size.
  auto group = world->split(0, 0, 2);
  e = testing::error_of([&] { group->all_to_all(send, three, recv, three, DType::F32, host_context()); });
  EXPECT_NE(e.find("comm: all_to_all: send_counts has 3 entries, expected one per rank of the group (2)"),
            std::string::npos)
      << e;
}

TEST(MetaWorld, RefusesRealTensorsAndSplitsOfTheSizeTheMeshGives) {
  auto world = meta_world_communicator(2);
  Tensor t = Tensor::zeros({4}, DType::F32);
  const std::string e = testing::error_of(
      [&] { world->all_reduce(t.raw_data(), 4, DType::F32, ReduceOp::Sum, device_services(Device::CPU).context()); });
  EXPECT_NE(e.find("meta world: all_reduce(f32 x 4) of a tensor on cpu"), std::string::npos) << e;
  auto group = world->split(0, 0, 1);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->size(), 1);
  EXPECT_NE(
      testing::error_of([&] { world->split(0, 0, 3); }).find("a group of 3 ranks split from a world of 2"),
      std::string::npos);
  EXPECT_NE(testing::error_of([&] { meta_world_communicator(0); }).find("size must be >= 1"), std::string::npos);
}

}  // namespace
}  // namespace titan::dist
