// The gradient reductions of dist::ShardedBlocks over four real MPI ranks (`mpirun -np 4`, this
// program again), in the reduce dtype (training.mixed_precision_reduce): every rank writes known
// gradients into a layer block (reduce-scattered right after its backward) and a non-layer block
// (reduced at the end of the micro-batch), over two micro-batches, and its shard_grad must then be
// exactly what the stated arithmetic gives:
//   f32   the mean of the ranks' f32 gradients;
//   bf16  each rank's gradient rounded to bf16 once, summed in f32 and rounded to bf16 at each step
//         of a collective, widened into the f32 slice that accumulates the micro-batches; HSDP
//         rounds the accumulated slice to bf16 once more for the all-reduce across replicas;
//   DDP   (whole blocks) f32, whatever the reduce dtype, as torchtitan's reduce dtype is FSDP's.
// FSDP over 4 ranks uses gradients whose sums are exact in bf16 in any order (MPI may sum four
// ranks in any order); HSDP 2 x 2 sums pairs, whose order cannot change a sum, so it uses
// arbitrary gradients and checks the rounding of each step.
#include "titan/dist/sharded_blocks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "test_util.h"
#include "titan/core/dtype.h"
#include "titan/dist/communicator.h"
#include "titan/dist/parallel_plan.h"

namespace titan {
namespace {

namespace tt = titan::testing;

constexpr int kRanks = 4;
constexpr int kMicroBatches = 2;
// Set by the parent test for the ranks it starts under mpirun.
constexpr const char* kRankEnv = "TITAN_SHARDED_BLOCKS_TEST_RANKS";

float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}
// One step of a bf16 collective: two bf16 values summed in f32, rounded to bf16.
float bf16_step(float a, float b) {
  return round_bf16(round_bf16(a) + round_bf16(b));
}

// Gradient element i of `block` on `rank` in micro-batch `mb`.
using Gradient = std::function<float(int rank, int mb, int block, int64_t i)>;

// Sums exact in bf16 and f32 in any order, with f32 gradients that bf16 rounding visibly changes:
// a multiple of 1/8 in [1/8, 4] (exact in bf16) plus an offset under half a bf16 ulp there (2^-11),
// which rounding to bf16 drops and f32 keeps (every f32 partial sum stays exact).
float exact_sum_gradient(int rank, int mb, int block, int64_t i) {
  const int k = 1 + int((i * 7 + rank * 5 + mb * 3 + block * 11) % 32);
  const float offset = float(1 + (i + rank) % 3) * std::ldexp(1.0f, -14);
  return float(k) / 8.0f + offset;
}

// Arbitrary values of both signs and many magnitudes: sums that round at every bf16 step.
float arbitrary_gradient(int rank, int mb, int block, int64_t i) {
  const uint64_t h =
      (uint64_t(i) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(rank * 131 + mb * 17 + block * 7) << 40);
  const double u = double((h >> 11) % 1000003) / 1000003.0;  // [0, 1)
  return float((u - 0.5) * std::ldexp(1.0, int(h % 9) - 4));
}

// Runs two micro-batches of gradients through ShardedBlocks on the mesh replicate x shard and
// checks every element of this rank's shard_grad of both blocks against `expected(block, i)`
// (i indexes the whole padded block).
void check_reduction(int64_t replicate, int64_t shard, DType reduce, const Gradient& gradient,
                     const std::function<float(int block, int64_t i)>& expected, const std::string& what) {
  dist::Communicator& world = tt::rank_world();
  ASSERT_EQ(world.size(), kRanks);
  const dist::ParallelPlan plan(world, replicate, shard);
  // Block 0 stands for the embedding (no backward points), block 1 for a layer; 35 and 26 elements
  // pad to multiples of the shard count.
  std::vector<nn::ParamBlock> blocks;
  blocks.emplace_back("embedding", std::vector<nn::ParamSpec>{{"embedding.weight", {5, 7}}});
  blocks.emplace_back("layer", std::vector<nn::ParamSpec>{{"layer.weight", {2, 13}}});
  plan.shard_blocks(blocks);
  for (auto& b : blocks) b.initialize(7);
  dist::ShardedBlocks sharding(plan, blocks, {dist::BlockKind::Ends, dist::BlockKind::Layer},
                               dist::Reshard::AfterForward, reduce);
  sharding.shard(DType::F32);
  for (auto& b : blocks) b.zero_grad();
  auto write = [&](int mb, int block) {
    Tensor& g = blocks[size_t(block)].grad();
    for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = gradient(plan.rank(), mb, block, i);
  };
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    sharding.begin_micro_batch(mb + 1 == kMicroBatches);
    if (shard == 1 && mb == 0) {  // DDP reduces in the last micro-batch only: the first accumulates
      for (auto& b : blocks) b.materialize_grad();
    }
    sharding.before_backward(1);
    if (shard == 1 && mb > 0) {  // DDP: whole buffers accumulate the micro-batches in place
      Tensor& g = blocks[1].grad();
      for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] += gradient(plan.rank(), mb, 1, i);
    } else {
      write(mb, 1);
    }
    sharding.after_backward(1);
    // bf16: the whole f32 gradient is freed once its bf16 copy is made; f32 keeps it until the
    // reduce-scatter that reads it is over.
    if (shard > 1 && reduce == DType::BF16) {
      EXPECT_FALSE(blocks[1].grad_resident()) << what;
    }
    if (shard == 1 && mb > 0) {
      Tensor& g = blocks[0].grad();
      for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] += gradient(plan.rank(), mb, 0, i);
    } else {
      write(mb, 0);
    }
    sharding.end_micro_batch();
  }
  for (int block = 0; block < 2; ++block) {
    const nn::ParamBlock& B = blocks[size_t(block)];
    const Tensor& slice = B.shard_grad();
    const int64_t begin = shard > 1 ? plan.shard_index() * slice.numel() : 0;
    int64_t wrong = 0;
    for (int64_t j = 0; j < slice.numel() && wrong < 5; ++j) {
      const float want = expected(block, begin + j), got = slice.data<float>()[j];
      if (got != want) {
        ++wrong;
        ADD_FAILURE() << what << ": rank " << plan.rank() << ", block " << B.name() << ", element "
                      << begin + j << ": " << got << " != " << want;
      }
    }
  }
}

TEST(ShardedBlocks, ReduceGradientsInTheReduceDtypeOverFourRanks) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ShardedBlocksRanks.* only";
  const tt::RanksRun run = tt::run_this_program_on_ranks(kRanks, kRankEnv, "ShardedBlocksRanks.*", 5);
  if (!run.skipped.empty()) GTEST_SKIP() << run.skipped;
  EXPECT_EQ(run.rc, 0) << run.output;
  EXPECT_EQ(run.ranks_passed, kRanks) << "every rank must pass the 5 ShardedBlocksRanks tests:\n"
                                      << run.output;
}

// The rank side (skipped when run directly).
#define REQUIRE_RANK()                                                                                   \
  do {                                                                                                   \
    if (!std::getenv(kRankEnv))                                                                          \
      GTEST_SKIP()                                                                                       \
          << "runs under mpirun, started by ShardedBlocks.ReduceGradientsInTheReduceDtypeOverFourRanks"; \
  } while (0)

// Sum over ranks and micro-batches of f(rank, mb), in that order (the values make it exact).
float sum_of(const std::function<float(int, int)>& f) {
  float s = 0;
  for (int r = 0; r < kRanks; ++r)
    for (int mb = 0; mb < kMicroBatches; ++mb) s += f(r, mb);
  return s;
}

TEST(ShardedBlocksRanks, FsdpInF32IsTheMeanOfTheRanksGradients) {
  REQUIRE_RANK();
  check_reduction(
      1, 4, DType::F32, exact_sum_gradient,
      [](int block, int64_t i) {
        return sum_of([&](int r, int mb) { return exact_sum_gradient(r, mb, block, i); }) / float(kRanks);
      },
      "FSDP 4, f32");
}

TEST(ShardedBlocksRanks, FsdpInBf16SumsEachRanksGradientRoundedToBf16) {
  REQUIRE_RANK();
  check_reduction(
      1, 4, DType::BF16, exact_sum_gradient,
      [](int block, int64_t i) {
        const float want =
            sum_of([&](int r, int mb) { return round_bf16(exact_sum_gradient(r, mb, block, i)); });
        // The rounding is visible: the f32 mean differs.
        const float f32 = sum_of([&](int r, int mb) { return exact_sum_gradient(r, mb, block, i); });
        EXPECT_NE(want, f32) << "block " << block << ", element " << i;
        return want / float(kRanks);
      },
      "FSDP 4, bf16");
}

// HSDP 2 x 2: rank = replica * 2 + shard index; the shard group {2q, 2q + 1} reduce-scatters each
// micro-batch, the replicas {s, s + 2} all-reduce the accumulated slices once.
float hsdp_expected(DType reduce, int block, int64_t i) {
  float replicas[2];
  for (int q = 0; q < 2; ++q) {
    float slice = 0;
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      const float a = arbitrary_gradient(2 * q, mb, block, i),
                  b = arbitrary_gradient(2 * q + 1, mb, block, i);
      slice += reduce == DType::BF16 ? bf16_step(a, b) : a + b;
    }
    replicas[q] = slice;
  }
  const float total = reduce == DType::BF16 ? bf16_step(replicas[0], replicas[1]) : replicas[0] + replicas[1];
  return total * 0.25f;
}

TEST(ShardedBlocksRanks, HsdpInF32SumsTheShardsThenTheReplicas) {
  REQUIRE_RANK();
  check_reduction(
      2, 2, DType::F32, arbitrary_gradient,
      [](int block, int64_t i) { return hsdp_expected(DType::F32, block, i); }, "HSDP 2x2, f32");
}

TEST(ShardedBlocksRanks, HsdpInBf16RoundsAtEveryStepOfEachCollective) {
  REQUIRE_RANK();
  int64_t differs = 0;
  check_reduction(
      2, 2, DType::BF16, arbitrary_gradient,
      [&](int block, int64_t i) {
        const float want = hsdp_expected(DType::BF16, block, i);
        differs += want != hsdp_expected(DType::F32, block, i);
        return want;
      },
      "HSDP 2x2, bf16");
  EXPECT_GT(differs, 0) << "no element where bf16 rounding shows: the test proves nothing";
}

TEST(ShardedBlocksRanks, DdpReducesWholeBlocksInF32WhateverTheReduceDtype) {
  REQUIRE_RANK();
  check_reduction(
      4, 1, DType::BF16, exact_sum_gradient,
      [](int block, int64_t i) {
        return sum_of([&](int r, int mb) { return exact_sum_gradient(r, mb, block, i); }) / float(kRanks);
      },
      "DDP 4, bf16 asked");
}

}  // namespace
}  // namespace titan
