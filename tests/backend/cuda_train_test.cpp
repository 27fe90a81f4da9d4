// Training on the GPU, through the trainer as `titan train --job.device=cuda` runs it (the tiny
// debugmodel job of the train tests, real tokenizer and corpus):
//   - 20 steps on the GPU follow the CPU's losses step by step: within 1e-3 (relative) in f32, where
//     the two differ only in summation order, and within 2e-2 under bf16 mixed precision, where
//     a different summation order moves bf16 roundings (2^-8 relative each);
//   - a run checkpointed on the GPU and resumed there equals the uninterrupted run bit for bit
//     (losses, grad norms and the checkpoint files), as on the CPU;
//   - the Hugging Face export of a GPU run holds exactly its checkpoint's weights (verify-export);
//   - the plan of a GPU step (`titan plan` / `titan info` of a cuda job, on the meta device) holds
//     what the step holds on the GPU.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>

#include "backend/cuda_test_util.h"
#include "test_util.h"
#include "titan/core/device_services.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/step_profile.h"
#include "titan/train/trainer.h"
#include "train/train_test_util.h"

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

// gpu_losses: where the GPU run's losses by step go, if wanted.
void expect_losses_follow_the_cpu(const char* precision, double rel, const Overrides& job = {},
                                  const std::string& what = "text",
                                  std::map<int64_t, double>* gpu_losses = nullptr) {
  const Overrides common = testing::joined({{"training.steps", "20"},
                                            {"training.mixed_precision_param", precision},
                                            {"validation.enable", "false"}},
                                           job);
  auto with = [&](const char* device) { return testing::joined(common, {{"job.device", device}}); };
  const std::string tag = "cuda_follows_" + what + "_" + precision;
  const fs::path cpu = testing::temp_dir(tag + "_cpu"), gpu = testing::temp_dir(tag + "_gpu");
  train(cpu, with("cpu"));
  train(gpu, with("cuda"));
  auto lc = by_step(read_metrics(cpu), "loss"), lg = by_step(read_metrics(gpu), "loss");
  if (gpu_losses) *gpu_losses = lg;
  // Both devices' records say what their caching allocator holds: every peak byte sat in a segment
  // that is still reserved (segments go back only when the device refuses one).
  for (const fs::path& run : {gpu, cpu})
    for (const auto& r : read_metrics(run)) {
      ASSERT_TRUE(r.contains("memory_reserved_gib")) << r.dump();
      EXPECT_GE(r["memory_reserved_gib"].get<double>(), r["memory_gib"].get<double>()) << r.dump();
    }
  ASSERT_EQ(lc.size(), 20u);
  ASSERT_EQ(lg.size(), 20u);
  double worst = 0;
  for (auto& [step, loss] : lc) {
    const double d = std::abs(lg[step] - loss) / std::abs(loss);
    EXPECT_LE(d, rel) << precision << ": step " << step << " loss cpu " << loss << ", cuda " << lg[step];
    worst = std::max(worst, d);
  }
  std::printf(
      "%s, %s: 20 steps, worst relative loss difference cpu vs cuda %.3g (last: cpu %.6f, cuda %.6f)\n",
      what.c_str(), precision, worst, lc[20], lg[20]);
}

TEST(CudaTrain, FollowsTheCpuLossesInFloat32) {
  TITAN_REQUIRE_CUDA();
  expect_losses_follow_the_cpu("float32", 1e-3);
}

TEST(CudaTrain, FollowsTheCpuLossesInBfloat16) {
  TITAN_REQUIRE_CUDA();
  expect_losses_follow_the_cpu("bfloat16", 2e-2);
}

// training.activation_grad_dtype = "bfloat16" on both devices: the GPU's kernels that write bf16
// gradients themselves against the CPU's, which round their f32 ones.
TEST(CudaTrain, FollowsTheCpuLossesWithBf16ActivationGradients) {
  TITAN_REQUIRE_CUDA();
  std::map<int64_t, double> bf16_grads, f32_grads;
  expect_losses_follow_the_cpu("bfloat16", 2e-2, {{"training.activation_grad_dtype", "bfloat16"}},
                               "bf16_activation_gradients", &bf16_grads);
  expect_losses_follow_the_cpu("bfloat16", 2e-2, {}, "f32_activation_gradients", &f32_grads);
  bool differs = false;
  for (const auto& [step, loss] : f32_grads) differs |= bf16_grads.at(step) != loss;
  EXPECT_TRUE(differs) << "the GPU run with bf16 activation gradients rounded some of them";
}

// Supervised fine-tuning on the GPU: conversations packed into rows (block-causal attention, one
// launch per conversation, the padding a document of its own), prompts and padding left out of the
// loss; in f32 on an MoE whose aux loss leaves the padding out too (in bf16 a near-tied router
// choice may differ between the devices' summation orders), in bf16 on the dense model. The
// tolerances of text.
TEST(CudaTrain, PackedConversationsFollowTheCpu) {
  TITAN_REQUIRE_CUDA();
  const Overrides packed = {
      {"training.dataset_path", testing::write_conversations("cuda_packed_data").string()},
      {"training.chat_field", "messages"},
      {"training.pack_conversations", "true"},
      {"model.attn_mask_type", "block_causal"}};
  const Overrides moe = {{"model.flavor", "debugmodel_moe"},
                         {"model.num_experts", "4"},
                         {"model.top_k", "2"},
                         {"model.moe_hidden_dim", "64"},
                         {"training.load_balance", "aux_loss"}};
  expect_losses_follow_the_cpu("float32", 1e-3, testing::joined(packed, moe), "packed_conversations_moe");
  expect_losses_follow_the_cpu("bfloat16", 2e-2, packed, "packed_conversations");
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

// The plan of a GPU step (the meta device standing in for CUDA: its kernels' scratch and cuBLASLt's
// workspace) against the same step run on the GPU, as StepProfile checks the CPU's: the persistent
// state to the byte, the peak and the caching allocator's reservation within 1 % (printed to the
// byte). The plan leaves out cub's sort storage in the embedding backward, the rope tables and the
// reductions' partial sums (KiB to a few MiB), and the cudnn variants' buffers.
void expect_the_plan_is_the_gpus_step(const qwen3::ModelArgs& args, DType compute) {
  train::StepShape s;
  s.local_batch = 2;
  s.seq_len = 128;
  s.compute = compute;
  s.device = Device::CUDA;
  s.keep_logits_bytes = train::loss_logits_budget(Device::CUDA);
  // A first step allocates what the process keeps (the GEMM workspace, the rope tables); the
  // measured one holds only its own memory, so the plan's workspace is taken off its figures.
  train::profile_training_step(args, s, Device::CUDA);
  const train::StepProfile gpu = train::profile_training_step(args, s, Device::CUDA);
  const train::StepProfile plan = train::profile_training_step(args, s, Device::Meta);
  EXPECT_EQ(plan.weights, gpu.weights);
  EXPECT_EQ(plan.grads, gpu.grads);
  EXPECT_EQ(plan.optimizer, gpu.optimizer);
  EXPECT_EQ(plan.other, gpu.other);
  const int64_t workspace = int64_t(kCudaGemmWorkspaceBytes);
  for (auto [what, planned, measured] : {std::tuple{"peak", plan.peak - workspace, gpu.peak},
                                         std::tuple{"reserved", plan.reserved - workspace, gpu.reserved}}) {
    const double rel = std::abs(double(planned - measured)) / double(measured);
    EXPECT_LE(rel, 0.01) << what << ": planned " << planned << " B, on the GPU " << measured << " B";
    std::printf("%s, %s, 2 x 128: %s planned %lld B, on the GPU %lld B (%+lld B)\n",
                args.is_moe() ? "MoE" : "dense", dtype_name(compute).data(), what, (long long)planned,
                (long long)measured, (long long)(planned - measured));
  }
}

qwen3::ModelArgs two_layers(const char* flavor) {
  qwen3::ModelArgs a = qwen3::flavor(flavor);
  a.n_layers = 2;
  return a;
}

TEST(CudaStepProfile, ThePlanOfADenseStepIsTheGpusStep) {
  TITAN_REQUIRE_CUDA();
  expect_the_plan_is_the_gpus_step(two_layers("debugmodel"), DType::BF16);
  expect_the_plan_is_the_gpus_step(two_layers("debugmodel"), DType::F32);
}

TEST(CudaStepProfile, ThePlanOfAMoeStepIsTheGpusStep) {
  TITAN_REQUIRE_CUDA();
  qwen3::ModelArgs a = two_layers("debugmodel_moe");
  a.output_router_logits = true;
  expect_the_plan_is_the_gpus_step(a, DType::BF16);
}

}  // namespace
}  // namespace titan
