// A model built for one rank of a sharded data-parallel plan (nn::BlockShard): its blocks are born
// as this rank's slices; a random initialisation draws the slices alone, a Hugging Face load
// writes the slices alone. Checked with the CPU allocator's counters, and against the slices
// of a model built whole: the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "models/oracle_check.h"
#include "titan/core/device_services.h"
#include "titan/models/qwen3/args.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict.h"

namespace titan {
namespace {

using qwen3::Qwen3Model;

qwen3::ModelArgs small_args() {
  qwen3::ModelArgs a = qwen3::flavor("debugmodel");
  a.n_layers = 3;
  a.vocab_size = 1000;
  // A padding row that straddles the first slice boundary of the embedding block (dim 256, a third
  // of the block ends inside row 333): each rank zeroes only its part of the row.
  a.pad_token_id = 333;
  return a;
}

// Rank `index` of `count` holds exactly its slice of every block of the whole model.
void expect_slices_of(const Qwen3Model& whole, const Qwen3Model& rank, int64_t index, int64_t count) {
  ASSERT_EQ(whole.blocks().size(), rank.blocks().size());
  for (size_t b = 0; b < whole.blocks().size(); ++b) {
    const nn::ParamBlock& w = whole.blocks()[b];
    const nn::ParamBlock& r = rank.blocks()[b];
    ASSERT_TRUE(r.sharded()) << r.name();
    const int64_t n = r.shard().numel();
    EXPECT_EQ(r.shard_begin(), index * n) << r.name();
    EXPECT_EQ(n * count, r.numel()) << r.name() << ": the slices cover the padded block";
    const int64_t have = std::max<int64_t>(0, std::min(n, w.numel() - index * n));  // the rest is padding
    const float* mine = r.shard().data<float>();
    EXPECT_EQ(0, std::memcmp(mine, w.data().data<float>() + index * n, size_t(have) * 4)) << r.name();
    for (int64_t i = have; i < n; ++i) ASSERT_EQ(mine[i], 0.0f) << r.name() << ": padding element " << i;
  }
}

TEST(BornSharded, ARankHoldsOnlyItsSlicesAndDrawsOnlyThem) {
  const qwen3::ModelArgs args = small_args();
  Qwen3Model whole(args, DType::F32);
  whole.initialize(11, qwen3::InitScheme::HuggingFace);

  DeviceServices& cpu = device_services(Device::CPU);
  for (int64_t index : {0, 1, 2}) {
    const int64_t before = cpu.stats().current_bytes;
    Qwen3Model rank(args, DType::F32, Device::CPU, nn::BlockShard{index, 3});
    // Parameters and gradients: a third of every (padded) block, nothing whole.
    int64_t slices = 0;
    for (auto& b : rank.blocks()) {
      EXPECT_FALSE(b.data_resident()) << b.name();
      EXPECT_FALSE(b.grad_resident()) << b.name();
      slices += 2 * b.shard().nbytes();
    }
    EXPECT_EQ(cpu.stats().current_bytes - before, slices);
    cpu.reset_peak();
    rank.initialize(11, qwen3::InitScheme::HuggingFace);
    // No block was ever whole: the allocator's peak did not move (on the CPU the slices are drawn in
    // place, without a host scratch).
    EXPECT_EQ(cpu.stats().peak_bytes - before, slices);
    EXPECT_EQ(cpu.stats().current_bytes - before, slices);
    expect_slices_of(whole, rank, index, 3);
  }
}

// A Hugging Face load writes each tensor's part inside the rank's slices and nothing else: no
// block is ever whole, the allocator's peak does not move.
TEST(BornSharded, AHuggingFaceLoadWritesOnlyTheSlices) {
  const auto dir = testing::oracle_dir("tiny_moe");
  auto whole = qwen3::load_hf_model(dir, DType::F32);
  DeviceServices& cpu = device_services(Device::CPU);
  for (int64_t index : {0, 1}) {
    Qwen3Model rank(whole->args(), DType::F32, Device::CPU, nn::BlockShard{index, 2});
    const int64_t held = cpu.stats().current_bytes;
    cpu.reset_peak();
    qwen3::load_hf_weights(rank, dir);
    EXPECT_EQ(cpu.stats().peak_bytes, held);
    for (auto& b : rank.blocks()) EXPECT_FALSE(b.data_resident()) << b.name();
    expect_slices_of(*whole, rank, index, 2);
  }
}

}  // namespace
}  // namespace titan
