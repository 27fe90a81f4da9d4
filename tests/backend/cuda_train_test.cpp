// Training on the GPU, through the trainer as `titan train --job.device=cuda` runs it (the tiny
// debugmodel job of the train tests, real tokenizer and corpus):
//   - 20 steps on the GPU follow the CPU's losses step by step: within 1e-3 (relative) in f32, where
//     the two differ only in summation order, and within 2e-2 under bf16 mixed precision, where
//     a different summation order moves bf16 roundings (2^-8 relative each);
//   - a run checkpointed on the GPU and resumed there equals the uninterrupted run bit for bit
//     (losses, grad norms and the checkpoint files), as on the CPU;
//   - the Hugging Face export of a GPU run holds exactly its checkpoint's weights (verify-export).
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "backend/cuda_test_util.h"
#include "test_util.h"
#include "train/train_test_util.h"
#include "titan/train/trainer.h"

namespace titan {
namespace {

namespace fs = std::filesystem;
using testing::by_step;
using testing::Overrides;
using testing::read_metrics;
using testing::tiny_config;

train::TrainSummary train(const fs::path& dump, Overrides extra) {
  return train::run_training(tiny_config(dump, extra));
}

void expect_losses_follow_the_cpu(const char* precision, double rel) {
  const Overrides common = {{"training.steps", "20"}, {"training.mixed_precision_param", precision},
                            {"validation.enable", "false"}};
  auto with = [&](const char* device) { return testing::joined(common, {{"job.device", device}}); };
  const std::string tag = std::string("cuda_follows_") + precision;
  const fs::path cpu = testing::temp_dir(tag + "_cpu"), gpu = testing::temp_dir(tag + "_gpu");
  train(cpu, with("cpu"));
  train(gpu, with("cuda"));
  auto lc = by_step(read_metrics(cpu), "loss"), lg = by_step(read_metrics(gpu), "loss");
  // The GPU's records say what its caching allocator holds: every peak byte sat in a segment that
  // is still reserved (segments go back only when cudaMalloc fails). The CPU has no cache.
  for (const auto& r : read_metrics(gpu)) {
    ASSERT_TRUE(r.contains("memory_reserved_gib")) << r.dump();
    EXPECT_GE(r["memory_reserved_gib"].get<double>(), r["memory_gib"].get<double>()) << r.dump();
  }
  for (const auto& r : read_metrics(cpu)) EXPECT_FALSE(r.contains("memory_reserved_gib")) << r.dump();
  ASSERT_EQ(lc.size(), 20u);
  ASSERT_EQ(lg.size(), 20u);
  double worst = 0;
  for (auto& [step, loss] : lc) {
    const double d = std::abs(lg[step] - loss) / std::abs(loss);
    EXPECT_LE(d, rel) << precision << ": step " << step << " loss cpu " << loss << ", cuda " << lg[step];
    worst = std::max(worst, d);
  }
  std::printf("%s: 20 steps, worst relative loss difference cpu vs cuda %.3g (last: cpu %.6f, cuda %.6f)\n",
              precision, worst, lc[20], lg[20]);
}

TEST(CudaTrain, FollowsTheCpuLossesInFloat32) {
  TITAN_REQUIRE_CUDA();
  expect_losses_follow_the_cpu("float32", 1e-3);
}

TEST(CudaTrain, FollowsTheCpuLossesInBfloat16) {
  TITAN_REQUIRE_CUDA();
  expect_losses_follow_the_cpu("bfloat16", 2e-2);
}

// Run A: 6 steps straight, checkpoints every 3. Run B: 3 steps, then resumed to 6 in the same
// folder. The tiny model's head_dim (32) takes the attention kernels without atomics, so the GPU
// run is deterministic and the two must agree exactly.
TEST(CudaTrain, ResumeEqualsAnUninterruptedRunBitwise) {
  TITAN_REQUIRE_CUDA();
  const Overrides common = {{"job.device", "cuda"},           {"training.deterministic", "true"},
                            {"lr_scheduler.warmup_steps", "2"}, {"lr_scheduler.decay_ratio", "0"},
                            {"checkpoint.enable", "true"},      {"checkpoint.interval", "3"},
                            {"validation.enable", "false"}};
  auto with = [&](const Overrides& extra) { return testing::joined(common, extra); };
  const fs::path a = testing::temp_dir("cuda_resume_a"), b = testing::temp_dir("cuda_resume_b");
  train(a, with({{"training.steps", "6"}, {"checkpoint.last_save_in_hf", "true"}}));
  train(b, with({{"training.steps", "3"}}));
  train::TrainSummary resumed = train(b, with({{"training.steps", "6"}}));
  EXPECT_EQ(resumed.steps_run, 3);
  auto ra = read_metrics(a), rb = read_metrics(b);
  auto la = by_step(ra, "loss"), lb = by_step(rb, "loss");
  auto ga = by_step(ra, "grad_norm"), gb = by_step(rb, "grad_norm");
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  for (int64_t st = 1; st <= 6; ++st) {
    EXPECT_EQ(la[st], lb[st]) << "loss differs at step " << st;
    EXPECT_EQ(ga[st], gb[st]) << "grad_norm differs at step " << st;
  }
  for (const char* f : {"model-rank0.safetensors", "optimizer-rank0.safetensors"})
    EXPECT_EQ(testing::file_difference(a / "checkpoint" / "step-6" / f, b / "checkpoint" / "step-6" / f), "") << f;

  // The export A wrote from the GPU holds exactly the weights of its step-6 checkpoint.
  std::string out;
  const int rc = testing::run_command(testing::titan_binary().string() + " verify-export " +
                                          (a / "checkpoint" / "step-6-hf").string() + " --source " +
                                          (a / "checkpoint" / "step-6").string(),
                                      &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("verify-export OK"), std::string::npos) << out;
}

}  // namespace
}  // namespace titan
