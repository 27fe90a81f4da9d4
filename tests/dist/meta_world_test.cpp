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

TEST(MetaWorld, RefusesRealTensorsAndTheSizeOfASplit) {
  auto world = meta_world_communicator(2);
  Tensor t = Tensor::zeros({4}, DType::F32);
  const std::string e = testing::error_of(
      [&] { world->all_reduce(t.raw_data(), 4, DType::F32, ReduceOp::Sum, device_services(Device::CPU).context()); });
  EXPECT_NE(e.find("meta world: all_reduce(f32 x 4) of a tensor on cpu"), std::string::npos) << e;
  auto group = world->split(0, 0);
  EXPECT_EQ(group->rank(), 0);
  EXPECT_NE(testing::error_of([&] { (void)group->size(); }).find("size of a group split from it is unknown"),
            std::string::npos);
  EXPECT_NE(testing::error_of([&] { meta_world_communicator(0); }).find("size must be >= 1"), std::string::npos);
}

}  // namespace
}  // namespace titan::dist
