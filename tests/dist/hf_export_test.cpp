// The trainer's streamed Hugging Face export (train::export_from_ranks, what Checkpointer::export_hf
// runs) of a dense model on real MPI ranks (`mpirun -np 2` and `-np 4`, this program again). Every
// rank holds its slices as a training rank does (born sharded, initialised from one seed, sharded for
// the step); rank 0 writes while the ranks of its shard group gather one block at a time with it. Its
// folder must be the one-process export of the model of the same seed, byte for byte, and no rank may
// hold more than one block whole at once: the real CPU device's counters (core/device_services.h)
// around the export say what each rank held beyond its state. Eight layers and a small vocabulary,
// so that a layer is an eighth of the model: gathered whole (as the export once did) it would be all
// of it. Meshes: FSDP 2 (tied embeddings: the head block is the final norm alone), FSDP 4 (untied,
// bf16 training: the gathers fill the f32 masters, not the bf16 copies), HSDP 2 x 2 (the second
// replica gathers nothing and waits for the first).
#include "titan/train/hf_export.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "test_util.h"
#include "titan/core/device_services.h"
#include "titan/dist/communicator.h"
#include "titan/dist/parallel_plan.h"
#include "titan/dist/sharded_blocks.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/train_state.h"

namespace titan {
namespace {

namespace fs = std::filesystem;
namespace tt = titan::testing;

// Set by the parent tests for the ranks they start under mpirun.
constexpr const char* kRankEnv = "TITAN_HF_EXPORT_TEST_RANKS";
constexpr uint64_t kSeed = 11;

qwen3::ModelArgs dense_args(bool tied) {
  qwen3::ModelArgs a;
  a.vocab_size = 512, a.dim = 64, a.n_layers = 8, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 16;
  a.hidden_dim = 256, a.max_seq_len = 32;
  a.tie_embeddings = tied;
  a.validate();
  return a;
}

void check_streamed_export(int64_t replicate, int64_t shard, DType compute, bool tied) {
  dist::Communicator& world = tt::rank_world();
  ASSERT_EQ(world.size(), replicate * shard);
  const dist::ParallelPlan plan(world, replicate, shard);
  SCOPED_TRACE(plan.describe() + ", rank " + std::to_string(plan.rank()));
  const qwen3::ModelArgs a = dense_args(tied);
  // As train::TrainState builds it: born as its slices, sharded for the step.
  qwen3::Qwen3Model model(a, compute, Device::CPU, nn::BlockShard{plan.shard_index(), plan.dp_shard()});
  plan.shard_blocks(model.blocks());
  model.initialize(kSeed, qwen3::InitScheme::Torchtitan);
  dist::ShardedBlocks sharding(plan, model.blocks(), train::block_roles(model), dist::Reshard::AfterForward);
  sharding.shard(compute);
  int64_t whole_model = 0, largest_block = 0;  // f32 bytes, padded
  for (const nn::ParamBlock& b : model.blocks()) {
    ASSERT_TRUE(b.sharded());
    whole_model += 4 * b.numel();
    largest_block = std::max<int64_t>(largest_block, 4 * b.numel());
  }

  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const fs::path out = plan.is_logging_rank() ? tt::temp_dir("hf_export_" + name) : fs::path();
  DeviceServices& dev = device_services(Device::CPU);
  dev.reset_peak();
  const int64_t state = dev.stats().current_bytes;
  train::export_from_ranks(plan, model, sharding, [&](const qwen3::ExportSource& source) {
    qwen3::export_hf_model(model, out / "ranks", DType::F32, {}, /*overwrite=*/false, source);
  });
  const int64_t held = dev.stats().peak_bytes - state;
  plan.barrier();
  EXPECT_EQ(dev.stats().current_bytes, state) << "every gathered block released";
  for (const nn::ParamBlock& b : model.blocks()) EXPECT_FALSE(b.data_resident()) << b.name();
  std::printf("rank %d: held %lld B beyond its state during the export; the whole f32 model is %lld B\n",
              plan.rank(), static_cast<long long>(held), static_cast<long long>(whole_model));
  if (plan.replicate_index() == 0) {
    // Its slices stay; what it gathers is one block at a time, the largest at most.
    EXPECT_EQ(held, largest_block) << "one block gathered whole at a time, never two";
    EXPECT_LT(held, whole_model / 2);
  } else {
    EXPECT_EQ(held, 0) << "another replica's ranks gather nothing";
  }
  if (!plan.is_logging_rank()) return;

  qwen3::Qwen3Model one(a, DType::F32);
  one.initialize(kSeed, qwen3::InitScheme::Torchtitan);
  qwen3::export_hf_model(one, out / "one", DType::F32);
  const std::vector<std::string> files = tt::files_in(out / "one");
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors", "titan_checksums.json"}));
  EXPECT_EQ(tt::files_in(out / "ranks"), files);
  for (const std::string& f : files)
    EXPECT_EQ(tt::file_difference(out / "one" / f, out / "ranks" / f), "") << f;
}

TEST(HfExportStream, OverTwoRanksIsTheOneProcessExportHoldingABlockAtATime) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs HfExportStreamRanks*.* only";
  const tt::RanksRun run = tt::run_this_program_on_ranks(2, kRankEnv, "HfExportStreamRanks2.*", 1);
  if (!run.skipped.empty()) GTEST_SKIP() << run.skipped;
  EXPECT_EQ(run.rc, 0) << run.output;
  EXPECT_EQ(run.ranks_passed, 2) << "every rank must pass the HfExportStreamRanks2 tests:\n" << run.output;
}

TEST(HfExportStream, OverFourRanksIsTheOneProcessExportHoldingABlockAtATime) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs HfExportStreamRanks*.* only";
  const tt::RanksRun run = tt::run_this_program_on_ranks(4, kRankEnv, "HfExportStreamRanks4.*", 2);
  if (!run.skipped.empty()) GTEST_SKIP() << run.skipped;
  EXPECT_EQ(run.rc, 0) << run.output;
  EXPECT_EQ(run.ranks_passed, 4) << "every rank must pass the HfExportStreamRanks4 tests:\n" << run.output;
}

// The rank side (skipped when run directly).
#define REQUIRE_RANK()                                                                            \
  do {                                                                                            \
    if (!std::getenv(kRankEnv)) GTEST_SKIP() << "runs under mpirun, started by HfExportStream.*"; \
  } while (0)

TEST(HfExportStreamRanks2, FsdpTiedF32) {
  REQUIRE_RANK();
  check_streamed_export(1, 2, DType::F32, /*tied=*/true);
}
TEST(HfExportStreamRanks4, FsdpUntiedBf16Training) {
  REQUIRE_RANK();
  check_streamed_export(1, 4, DType::BF16, /*tied=*/false);
}
TEST(HfExportStreamRanks4, HsdpTwoReplicasTied) {
  REQUIRE_RANK();
  check_streamed_export(2, 2, DType::F32, /*tied=*/true);
}

// The events every rank runs: each block gathered before its first read and released before the
// next block's gather (so one is whole at a time), a tied model's head block the final norm alone.
TEST(HfExportStream, TheEventsGatherEachBlockOnceBeforeItsReads) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs HfExportStreamRanks*.* only";
  qwen3::Qwen3Model model(dense_args(/*tied=*/true), DType::F32, Device::Meta);
  const std::vector<train::ExportEvent> events = train::export_events(model);
  size_t gathered = ~size_t(0), reads = 0;
  std::vector<size_t> order;
  for (const train::ExportEvent& e : events) {
    switch (e.kind) {
      case train::ExportEvent::Gather:
        EXPECT_EQ(gathered, ~size_t(0)) << "block " << e.block << " gathered while another is";
        gathered = e.block;
        order.push_back(e.block);
        break;
      case train::ExportEvent::Release:
        EXPECT_EQ(e.block, gathered);
        gathered = ~size_t(0);
        break;
      case train::ExportEvent::Read:
        EXPECT_EQ(e.block, gathered) << e.param->name;
        EXPECT_TRUE(model.blocks()[e.block].holds(e.param)) << e.param->name;
        ++reads;
        break;
      case train::ExportEvent::Exchange:
        ADD_FAILURE() << "a dense model exchanges no experts";
        break;
    }
  }
  EXPECT_EQ(gathered, ~size_t(0)) << "the last block released";
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "embedding, 8 layers, head";
  EXPECT_EQ(reads, qwen3::hf_tensors(model).size());
}

}  // namespace
}  // namespace titan
