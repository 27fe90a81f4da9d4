// The trainer's Hugging Face export of a Qwen3-MoE whose experts are split over ranks
// (train/hf_export.h, the collectives of Checkpointer::export_hf) on real MPI ranks (`mpirun -np 2`
// and `-np 4`, this program again). Every rank holds its part of the model as a training rank does
// (its slices of the sharded blocks and of its run of experts, initialised from one seed: each run
// the one-process model's values of those experts); rank 0 writes while the ranks of its shard group
// gather a block at a time and the other ranks of its expert group send their runs as its writer
// reaches them (train::export_from_ranks), and its folder must be the one-process export of
// the unsplit model of the same seed: the same files (safetensors, config.json, checksums), byte for
// byte. Meshes: FSDP 2 (ep 2), FSDP 4 (ep 4, and ep 2: a second expert group that sends nothing),
// HSDP 2 x 2 (ep 2: a second replica that sends nothing); exports in f32 and bf16. And `titan train`
// itself over 2 ranks with expert_parallel_degree = 2, exporting the model it initialised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dist_test_util.h"
#include "test_util.h"
#include "titan/dist/communicator.h"
#include "titan/dist/parallel_plan.h"
#include "titan/dist/sharded_blocks.h"
#include "titan/io/hf_checkpoint.h"
#include "titan/models/qwen3/model.h"
#include "titan/models/qwen3/state_dict.h"
#include "titan/train/hf_export.h"
#include "titan/train/train_state.h"
#include "train/tiny_job.h"

namespace titan {
namespace {

namespace fs = std::filesystem;
namespace tt = titan::testing;

// Set by the parent tests for the ranks they start under mpirun.
constexpr const char* kRankEnv = "TITAN_EXPERT_EXPORT_TEST_RANKS";
constexpr uint64_t kSeed = 5;

// Three layers, the middle one dense (its MLP between two layers of experts), 8 experts, an untied
// head: every kind of key of an export.
qwen3::ModelArgs moe_args() {
  qwen3::ModelArgs a;
  a.vocab_size = 256, a.dim = 32, a.n_layers = 3, a.n_heads = 4, a.n_kv_heads = 2, a.head_dim = 8;
  a.hidden_dim = 48, a.max_seq_len = 32, a.num_experts = 8, a.top_k = 2, a.moe_hidden_dim = 16;
  a.mlp_only_layers = {1};
  a.tie_embeddings = false;
  a.validate();
  return a;
}

void check_export(int64_t replicate, int64_t shard, int64_t ep, DType dtype) {
  dist::Communicator& world = tt::rank_world();
  ASSERT_EQ(world.size(), replicate * shard);
  const dist::ParallelPlan plan(world, replicate, shard, ep);
  SCOPED_TRACE(plan.describe() + ", ep " + std::to_string(ep) + ", " + std::string(dtype_name(dtype)) +
               ", rank " + std::to_string(plan.rank()));
  const qwen3::ModelArgs a = moe_args();
  // As train::TrainState builds it: born as its slices, of its run of experts too.
  qwen3::Qwen3Model model(a, DType::F32, Device::CPU, nn::BlockShard{plan.shard_index(), plan.dp_shard()},
                          qwen3::Purpose::Training,
                          qwen3::ExpertSplit{plan.expert_index(), plan.ep(), plan.expert_shard()});
  plan.shard_blocks(model.blocks());
  model.initialize(kSeed, qwen3::InitScheme::Torchtitan);
  dist::ShardedBlocks sharding(plan, model.blocks(), train::block_roles(model), dist::Reshard::AfterForward);
  sharding.shard(DType::F32);

  // Checkpointer::export_hf's collectives.
  const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const fs::path out = plan.is_logging_rank() ? tt::temp_dir("expert_export_" + name) : fs::path();
  train::export_from_ranks(plan, model, sharding, [&](const qwen3::ExportSource& source) {
    qwen3::export_hf_model(model, out / "split", dtype, {}, /*overwrite=*/false, source);
  });
  plan.barrier();
  for (const nn::ParamBlock& b : model.blocks())
    EXPECT_EQ(b.data_resident(), !b.sharded()) << b.name() << ": every gathered block released";
  if (!plan.is_logging_rank()) return;

  qwen3::Qwen3Model one(a, DType::F32);
  one.initialize(kSeed, qwen3::InitScheme::Torchtitan);
  qwen3::export_hf_model(one, out / "one", dtype);
  const std::vector<std::string> files = tt::files_in(out / "one");
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "model.safetensors", "titan_checksums.json"}));
  EXPECT_EQ(tt::files_in(out / "split"), files);
  for (const std::string& f : files)
    EXPECT_EQ(tt::file_difference(out / "one" / f, out / "split" / f), "") << f;
  const io::HfCheckpoint split = io::HfCheckpoint::open(out / "split");
  EXPECT_EQ(split.size(), qwen3::hf_tensors(one).size()) << "every expert of every run";
  EXPECT_TRUE(split.contains("model.layers.2.mlp.experts.7.down_proj.weight"));
  EXPECT_TRUE(split.contains("model.layers.1.mlp.down_proj.weight")) << "the dense layer";
}

TEST(ExpertExport, OverTwoRanksIsTheOneProcessExport) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ExpertExportRanks*.* only";
  const tt::RanksRun run = tt::run_this_program_on_ranks(2, kRankEnv, "ExpertExportRanks2.*", 2);
  if (!run.skipped.empty()) GTEST_SKIP() << run.skipped;
  EXPECT_EQ(run.rc, 0) << run.output;
  EXPECT_EQ(run.ranks_passed, 2) << "every rank must pass the ExpertExportRanks2 tests:\n" << run.output;
}

TEST(ExpertExport, OverFourRanksIsTheOneProcessExport) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ExpertExportRanks*.* only";
  const tt::RanksRun run = tt::run_this_program_on_ranks(4, kRankEnv, "ExpertExportRanks4.*", 3);
  if (!run.skipped.empty()) GTEST_SKIP() << run.skipped;
  EXPECT_EQ(run.rc, 0) << run.output;
  EXPECT_EQ(run.ranks_passed, 4) << "every rank must pass the ExpertExportRanks4 tests:\n" << run.output;
}

// The trainer itself (`mpirun -np 2 titan train`, parallelism.expert_parallel_degree = 2): a run of
// 0 steps exports the model it initialised through Checkpointer::export_hf, and that folder is the
// one-process run's export, file for file (the tokenizer's files too) and byte for byte.
TEST(ExpertExport, TheTrainersExportOverTwoRanksIsTheOneProcessRunsExport) {
  if (std::getenv(kRankEnv)) GTEST_SKIP() << "a rank under mpirun runs ExpertExportRanks*.* only";
  const fs::path dir = tt::temp_dir("expert_export_trainer");
  auto train = [&](const std::string& name, const std::string& launcher, const tt::Overrides& extra) {
    const tt::Overrides o = tt::tiny_job(dir / name, tt::joined({{"model.num_experts", "8"},
                                                                 {"model.top_k", "2"},
                                                                 {"model.moe_hidden_dim", "32"},
                                                                 {"training.seq_len", "32"},
                                                                 {"training.steps", "0"},
                                                                 {"checkpoint.enable", "true"},
                                                                 {"checkpoint.last_save_in_hf", "true"}},
                                                                extra));
    std::string out;
    const int rc =
        tt::run_command("OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " +
                            launcher + tt::titan_binary().string() + " train --config " +
                            (tt::source_dir() / "configs" / "debugmodel_moe.toml").string() + tt::cli_args(o),
                        &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("export: wrote Hugging Face checkpoint"), std::string::npos) << out;
    return dir / name / "checkpoint" / "step-0-hf";
  };
  const fs::path one = train("one", "", {});
  const fs::path two = train("two", "mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -np 2 ",
                             {{"parallelism.expert_parallel_degree", "2"}});
  const std::vector<std::string> files = tt::files_in(one);
  EXPECT_EQ(files,
            (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                      "titan_checksums.json", "tokenizer.json", "tokenizer_config.json"}));
  EXPECT_EQ(tt::files_in(two), files);
  for (const std::string& f : files) EXPECT_EQ(tt::file_difference(one / f, two / f), "") << f;
}

// The rank side (skipped when run directly).
#define REQUIRE_RANK()                                                                          \
  do {                                                                                          \
    if (!std::getenv(kRankEnv)) GTEST_SKIP() << "runs under mpirun, started by ExpertExport.*"; \
  } while (0)

TEST(ExpertExportRanks2, FsdpExpertsOverBothRanksF32) {
  REQUIRE_RANK();
  check_export(1, 2, 2, DType::F32);
}
TEST(ExpertExportRanks2, FsdpExpertsOverBothRanksBf16) {
  REQUIRE_RANK();
  check_export(1, 2, 2, DType::BF16);
}
TEST(ExpertExportRanks4, FsdpExpertsOverAllFourRanksF32) {
  REQUIRE_RANK();
  check_export(1, 4, 4, DType::F32);
}
TEST(ExpertExportRanks4, FsdpTwoExpertGroupsBf16) {
  REQUIRE_RANK();
  check_export(1, 4, 2, DType::BF16);
}
TEST(ExpertExportRanks4, HsdpTwoReplicasF32) {
  REQUIRE_RANK();
  check_export(2, 2, 2, DType::F32);
}

}  // namespace
}  // namespace titan
