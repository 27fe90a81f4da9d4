// The meta device's profile of a training step against the same step run for real on the CPU:
// the peak bytes the allocator counts must agree within 5 %, and the persistent state exactly.
#include "titan/train/step_profile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"
#include "titan/models/qwen3/args.h"
#include "titan/train/job_config.h"
#include "titan/train/scale_planner.h"
#include "titan/train/startup.h"

namespace titan::train {
namespace {

void expect_meta_matches_cpu(const qwen3::ModelArgs& args, const StepShape& shape) {
  const StepProfile meta = profile_training_step(args, shape, Device::Meta);
  const StepProfile cpu = profile_training_step(args, shape, Device::CPU);
  EXPECT_EQ(meta.weights, cpu.weights);
  EXPECT_EQ(meta.grads, cpu.grads);
  EXPECT_EQ(meta.optimizer, cpu.optimizer);
  EXPECT_EQ(meta.other, cpu.other);
  EXPECT_GT(meta.activations(), 0);
  EXPECT_EQ(meta.after_step_peak > 0, cpu.after_step_peak > 0);
  if (cpu.after_step_peak > 0) {
    EXPECT_LE(std::abs(double(meta.after_step_peak - cpu.after_step_peak)) / double(cpu.after_step_peak),
              0.05)
        << "meta " << meta.after_step_peak << " B vs cpu " << cpu.after_step_peak << " B after the step";
  }
  const double rel = std::abs(double(meta.peak - cpu.peak)) / double(cpu.peak);
  EXPECT_LE(rel, 0.05) << "meta peak " << meta.peak << " B vs cpu peak " << cpu.peak << " B";
  // Both hand out memory through the same caching policy: their reservations agree as closely.
  EXPECT_GE(cpu.reserved, cpu.peak);
  const double rel_reserved = std::abs(double(meta.reserved - cpu.reserved)) / double(cpu.reserved);
  EXPECT_LE(rel_reserved, 0.05) << "meta reserved " << meta.reserved << " B vs cpu reserved " << cpu.reserved
                                << " B";
  // The meta run counts the step's FLOPs; the real devices leave the counter alone.
  EXPECT_GT(meta.flops, 0);
  EXPECT_EQ(cpu.flops, 0);
  std::printf(
      "peak: meta %lld B, cpu %lld B (%.2f %% apart); reserved %.2f %% apart; meta %.1f ms, cpu %.1f ms\n",
      (long long)meta.peak, (long long)cpu.peak, 100 * rel, 100 * rel_reserved, meta.seconds * 1e3,
      cpu.seconds * 1e3);
}

// Two layers keep the real steps short; the vocabulary stays full size (the fused loss' kept
// logits are the largest activation, and the meta kernel must allocate them like the CPU one).
qwen3::ModelArgs small(const char* flavor) {
  qwen3::ModelArgs a = qwen3::flavor(flavor);
  a.n_layers = 2;
  return a;
}

StepShape small_step(DType compute) {
  StepShape s;
  s.local_batch = 2;
  s.seq_len = 128;
  s.compute = compute;
  return s;
}

TEST(StepProfile, MetaPeakMatchesACpuStepDense) {
  expect_meta_matches_cpu(small("debugmodel"), small_step(DType::F32));
}

TEST(StepProfile, MetaPeakMatchesACpuStepMoe) {
  qwen3::ModelArgs a = small("debugmodel_moe");
  a.output_router_logits = true;  // the aux loss adds its own saved tensors
  expect_meta_matches_cpu(a, small_step(DType::F32));
}

TEST(StepProfile, MetaPeakMatchesACpuStepBf16) { expect_meta_matches_cpu(small("debugmodel"), small_step(DType::BF16)); }

// What runs after a step with the state held is planned too: a [validation] pass at its own shape
// (here four times the step's tokens) and the export, as a real CPU step holds them; the peak is
// the larger of the two phases', and the step's FLOPs and communication stay its own. Under FSDP
// the export gathers one block at a time, whole in f32 beside the slices (train/hf_export.h): the
// largest (here the embedding of the full vocabulary), never every block.
TEST(StepProfile, AValidationPassAndTheExportAreCountedAfterTheStep) {
  StepShape with = small_step(DType::F32);
  with.validation_batch = 4;
  with.validation_seq = 256;
  with.export_gather = true;
  expect_meta_matches_cpu(small("debugmodel"), with);
  const StepProfile alone = profile_training_step(small("debugmodel"), small_step(DType::F32), Device::Meta);
  const StepProfile after = profile_training_step(small("debugmodel"), with, Device::Meta);
  EXPECT_EQ(alone.after_step_peak, 0);
  EXPECT_GT(after.after_step_peak, after.persistent());
  EXPECT_EQ(after.peak, std::max(alone.peak, after.after_step_peak));
  EXPECT_EQ(after.flops, alone.flops);
  StepShape sharded = small_step(DType::F32);
  sharded.dp_shard = 2;
  const StepProfile rank_alone = profile_training_step(small("debugmodel"), sharded, Device::Meta);
  sharded.export_gather = true;
  const StepProfile rank = profile_training_step(small("debugmodel"), sharded, Device::Meta);
  int64_t largest_block = 0;
  const qwen3::Qwen3Model whole(small("debugmodel"), DType::F32, Device::Meta);
  for (const nn::ParamBlock& b : whole.blocks()) largest_block = std::max(largest_block, b.numel());
  EXPECT_GE(rank.after_step_peak, rank.persistent() + 4 * largest_block)
      << "the largest block gathered whole in f32 beside the rank's state";
  EXPECT_LT(rank.after_step_peak, rank.persistent() + 4 * rank.block_elements) << "never every block at once";
  EXPECT_EQ(rank.peak, std::max(rank_alone.peak, rank.after_step_peak));
  EXPECT_EQ(rank.comm.bytes_sent, rank_alone.comm.bytes_sent);
}

// Under FSDP the [validation] forward gathers its blocks as the step's forward does (a layer and
// the next at a time, Validator::run), and the export one block at a time (train/hf_export.h),
// never the whole model: a model that fits only sharded validates and exports as it trains. Eight
// layers and a small vocabulary, so that the layers are most of it.
TEST(StepProfile, AValidationForwardUnderFsdpHoldsAFewLayersNotTheModel) {
  qwen3::ModelArgs a = qwen3::flavor("debugmodel");
  a.n_layers = 8;
  a.vocab_size = 2048;
  StepShape sharded = small_step(DType::F32);
  sharded.dp_shard = 2;
  sharded.validation_batch = 1;
  sharded.validation_seq = 16;
  const StepProfile meta = profile_training_step(a, sharded, Device::Meta);
  const int64_t whole_model = 4 * meta.block_elements;  // f32
  ASSERT_GT(meta.after_step_peak, meta.persistent());
  EXPECT_LT(meta.after_step_peak - meta.persistent(), whole_model / 2)
      << "the validation forward held " << meta.after_step_peak - meta.persistent() << " B beside the state; "
      << "the whole model is " << whole_model << " B";
  sharded.validation_batch = 0;
  sharded.export_gather = true;
  const StepProfile exporting = profile_training_step(a, sharded, Device::Meta);
  ASSERT_GT(exporting.after_step_peak, exporting.persistent());
  EXPECT_LT(exporting.after_step_peak - exporting.persistent(), whole_model / 2)
      << "the export held " << exporting.after_step_peak - exporting.persistent() << " B beside the state; "
      << "the whole model is " << whole_model << " B";
}

// With experts split over ranks the export's writer holds a MoE layer's whole experts (every run,
// received from its expert group) beside the gathered block, in host memory: a CPU job's device's.
// Still a layer's, not the model's.
TEST(StepProfile, TheExportOfSplitExpertsHoldsOneLayersExperts) {
  qwen3::ModelArgs a = qwen3::flavor("debugmodel_moe");
  a.vocab_size = 2048;
  StepShape sharded = small_step(DType::F32);
  sharded.dp_shard = 2;
  sharded.ep = 2;
  sharded.export_gather = true;
  const StepProfile p = profile_training_step(a, sharded, Device::Meta);
  const int64_t layer_experts = 4 * 3 * a.num_experts * a.moe_hidden_dim * a.dim,
                whole_model = 4 * a.num_params();
  EXPECT_GE(p.after_step_peak, p.persistent() + layer_experts) << "a MoE layer's whole experts";
  EXPECT_LT(p.after_step_peak - p.persistent(), whole_model / 2)
      << "the export held " << p.after_step_peak - p.persistent()
      << " B beside the state; the whole model is " << whole_model << " B";
  sharded.device = Device::CUDA;  // the writer copies them to the host as they arrive
  const StepProfile gpu = profile_training_step(a, sharded, Device::Meta);
  EXPECT_LT(gpu.after_step_peak - gpu.persistent(), p.after_step_peak - p.persistent());
}

// bf16 activation gradients: on the CPU the ops round f32 gradients (more buffers, briefly), which
// the meta device plans as well; planned for cuda, whose kernels write bf16 gradients themselves,
// the step's peak is lower than with f32 activation gradients.
TEST(StepProfile, Bf16ActivationGradientsArePlannedForEachDevice) {
  StepShape cpu_shape = small_step(DType::BF16);
  cpu_shape.bf16_activation_grads = true;
  expect_meta_matches_cpu(small("debugmodel"), cpu_shape);
  // (A small vocabulary and a longer sequence: the activations and their gradients, not the
  // parameters, the optimizer or the loss, set the peak.)
  StepShape shape = small_step(DType::BF16);
  shape.device = Device::CUDA;
  shape.seq_len = 1024;
  qwen3::ModelArgs args = small("debugmodel");
  args.vocab_size = 2048;
  const StepProfile f32_grads = profile_training_step(args, shape, Device::Meta);
  shape.bf16_activation_grads = true;
  const StepProfile bf16_grads = profile_training_step(args, shape, Device::Meta);
  EXPECT_FALSE(autograd::bf16_activation_gradients()) << "the setting ended with the profile";
  EXPECT_LT(bf16_grads.peak, f32_grads.peak);
  EXPECT_EQ(bf16_grads.flops, f32_grads.flops);
  std::printf(
      "cuda plan, debugmodel 2 layers, vocabulary 2048, 2 x 1024: peak %lld B with f32 activation gradients, "
      "%lld B with bf16\n",
      (long long)f32_grads.peak, (long long)bf16_grads.peak);
}

TEST(StepProfile, MetaPeakMatchesACpuStepWithCheckpointing) {
  StepShape s = small_step(DType::F32);
  s.checkpointing = qwen3::Checkpointing::full();
  expect_meta_matches_cpu(small("debugmodel"), s);
}

TEST(StepProfile, MetaFlopsAreTheModelsMatmulFlops) {
  // 6 x active matmul parameters (lm_head counted) per token for the projections, plus causal
  // attention: the meta kernels' counts must add up to the closed form.
  const qwen3::ModelArgs a = qwen3::flavor("debugmodel");
  StepShape s = small_step(DType::F32);
  const StepProfile meta = profile_training_step(a, s, Device::Meta);
  const double tokens = double(s.local_batch * s.seq_len);
  // The embedding lookup and the RMSNorm weights (two per layer of dim, q/k norms of head_dim, the
  // final norm) do no matmul; a tied table is counted once, as the lm_head.
  const int64_t norms = a.n_layers * (2 * a.dim + 2 * a.head_dim) + a.dim;
  const double matmul_params =
      double(a.num_active_params() - norms - (a.tie_embeddings ? 0 : a.vocab_size * a.dim));
  const double projections = 6.0 * matmul_params * tokens;
  const double attention = 6.0 * 2.0 * double(a.n_layers) * double(s.local_batch) * double(a.n_heads) *
                           double(s.seq_len) * double(s.seq_len + 1) / 2.0 * double(a.head_dim);
  EXPECT_NEAR(meta.flops / (projections + attention), 1.0, 1e-9);
}

}  // namespace
}  // namespace titan::train

namespace titan::train {
namespace {

// The profile runs at most three micro-batches (first, middle, last) and counts the others as
// copies of the middle one: what it reports for N equals three really run plus N - 3 times what
// a third one really added (measured by difference of two runs), and the peak does not move. One
// rank of an FSDP mesh of 2, so that the per-micro-batch collectives are counted too.
TEST(StepProfile, AccumulatedMicroBatchesAreCountedAsCopiesOfAMiddleOne) {
  const qwen3::ModelArgs args = small("debugmodel");
  auto with = [&](int64_t accumulation) {
    StepShape s = small_step(DType::BF16);
    s.grad_accumulation = accumulation;
    s.dp_shard = 2;
    return profile_training_step(args, s, Device::Meta);
  };
  const StepProfile two = with(2), three = with(3), many = with(1000);
  const double per_flops = three.flops - two.flops;
  const int64_t per_bytes = three.comm.bytes_sent - two.comm.bytes_sent;
  EXPECT_GT(per_flops, 0);
  EXPECT_GT(per_bytes, 0);
  EXPECT_DOUBLE_EQ(many.flops, three.flops + 997 * per_flops);
  EXPECT_EQ(many.comm.bytes_sent, three.comm.bytes_sent + 997 * per_bytes);
  EXPECT_EQ(many.comm.collectives,
            three.comm.collectives + 997 * (three.comm.collectives - two.comm.collectives));
  EXPECT_EQ(many.comm.ring_steps,
            three.comm.ring_steps + 997 * (three.comm.ring_steps - two.comm.ring_steps));
  EXPECT_EQ(many.peak, three.peak);
}

TEST(StepProfile, InfoCommandPrintsTheMetaProfileOfTheJob) {
  // `titan info --config` runs the job's step on the meta device: its figures are the profile's.
  const std::string config = (testing::source_dir() / "configs" / "debugmodel.toml").string();
  std::string out;
  ASSERT_EQ(testing::run_command(testing::titan_binary().string() + " info --config " + config +
                                     " --training.mixed_precision_param=float32 --training.seq_len=128",
                                 &out),
            0)
      << out;
  const JobConfig cfg = load_job_config(config, {{"training.mixed_precision_param", "float32"},
                                                 {"training.seq_len", "128"}});
  ResolvedJob job;
  job.args = resolve_model_args(cfg);
  job.compute_dtype = DType::F32;
  job.local_batch_size = cfg.training.local_batch_size;
  job.seq_len = 128;
  const StepProfile p = profile_training_step(job.args, step_shape(cfg, job), Device::Meta);
  char peak[64];
  std::snprintf(peak, sizeof peak, "peak per process     %.2f GiB", double(p.peak) / double(1ll << 30));
  EXPECT_NE(out.find(peak), std::string::npos) << out;
  char flops[64];
  std::snprintf(flops, sizeof flops, "FLOPs per step: %.4g", p.flops);
  EXPECT_NE(out.find(flops), std::string::npos) << out;
  EXPECT_NE(out.find("batch 2 x seq 128, f32 compute"), std::string::npos) << out;
  // Accumulating 4 micro-batches: 4 x the FLOPs of the step, the same FLOPs per token.
  std::string accumulating;
  ASSERT_EQ(testing::run_command(testing::titan_binary().string() + " info --config " + config +
                                     " --training.mixed_precision_param=float32 --training.seq_len=128 "
                                     "--training.global_batch_size=8",
                                 &accumulating),
            0)
      << accumulating;
  EXPECT_NE(accumulating.find("batch 2 x seq 128 x 4 micro-batches, f32 compute"), std::string::npos)
      << accumulating;
  char per_token[96];
  std::snprintf(per_token, sizeof per_token, "(%.4g per token,", p.flops / (2.0 * 128.0));
  EXPECT_NE(out.find(per_token), std::string::npos) << out;
  EXPECT_NE(accumulating.find(per_token), std::string::npos) << accumulating;
  // A config note is said as titan train says it (here: torchtitan's per-op policy, applied as one
  // layer in two).
  ASSERT_EQ(testing::run_command(
                testing::titan_binary().string() + " info --config " + config +
                    " --activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=op",
                &out),
            0)
      << out;
  EXPECT_NE(out.find("config: activation_checkpoint.selective_ac_option = op applied as \"2\""),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("activation checkpointing selective (1 layer in 2)"), std::string::npos) << out;
  EXPECT_EQ(out.find("[parallelism] is not applied here"), std::string::npos) << out;
  // A job on a mesh: info profiles one process, and says where a rank's figures are.
  ASSERT_EQ(testing::run_command(testing::titan_binary().string() + " info --config " + config +
                                     " --parallelism.data_parallel_shard_degree=2",
                                 &out),
            0)
      << out;
  EXPECT_NE(
      out.find("note: [parallelism] is not applied here (the step is one process's, its experts whole); "
               "`titan plan --config " +
               config + "` gives one rank's memory on the job's mesh"),
      std::string::npos)
      << out;
}

// `titan info --flavor` runs the step its options describe on the meta device too (one way to count
// a step's memory): its figures are the profile's, per device (the GPU's loss keeps more logits).
TEST(StepProfile, InfoForAFlavorPrintsTheMetaProfileOfTheStepItsOptionsDescribe) {
  const qwen3::ModelArgs args = qwen3::flavor("debugmodel_moe");
  for (const char* device : {"cpu", "cuda"}) {
    StepShape shape;
    shape.local_batch = 2;
    shape.seq_len = 2048;
    shape.compute = DType::BF16;
    shape.checkpointing = qwen3::Checkpointing::full();
    shape.device = std::string(device) == "cuda" ? Device::CUDA : Device::CPU;
    shape.keep_logits_bytes = loss_logits_budget(shape.device);
    const StepProfile p = profile_training_step(args, shape, Device::Meta);
    std::string out;
    ASSERT_EQ(testing::run_command(testing::titan_binary().string() +
                                       " info --flavor debugmodel_moe --batch 2 --seq 2048 "
                                       "--activation-checkpoint full --device " +
                                       device,
                                   &out),
              0)
        << out;
    char line[96];
    std::snprintf(line, sizeof line, "peak per process     %.2f GiB", double(p.peak) / double(1ll << 30));
    EXPECT_NE(out.find(line), std::string::npos) << device << ": " << out;
    std::snprintf(line, sizeof line, "activations + temps  %.2f GiB",
                  double(p.activations()) / double(1ll << 30));
    EXPECT_NE(out.find(line), std::string::npos) << device << ": " << out;
    std::snprintf(line, sizeof line, "FLOPs per step: %.4g", p.flops);
    EXPECT_NE(out.find(line), std::string::npos) << device << ": " << out;
    EXPECT_NE(out.find(std::string("activation checkpointing full (every layer), one process on ") + device),
              std::string::npos)
        << out;
    // It also says what the device's caching allocator would reserve (meta replays the policy every
    // device uses): at least the peak, as every byte in use sits in a segment.
    std::snprintf(line, sizeof line, "reserved             %.2f GiB", double(p.reserved) / double(1ll << 30));
    EXPECT_NE(out.find(line), std::string::npos) << device << ": " << out;
    EXPECT_GE(p.reserved, p.peak);
  }
  // Options out of their range are errors naming the option.
  std::string out;
  EXPECT_NE(testing::run_command(
                testing::titan_binary().string() + " info --flavor debugmodel --seq 99999 2>&1", &out),
            0);
  EXPECT_NE(out.find("titan info: error: --seq = 99999 exceeds the model's max_seq_len"), std::string::npos)
      << out;
  EXPECT_NE(testing::run_command(
                testing::titan_binary().string() + " info --flavor debugmodel --batch 3000000000 2>&1", &out),
            0);
  EXPECT_NE(out.find("titan info: error: --batch = 3000000000 exceeds the limit 2147483648"),
            std::string::npos)
      << out;
  EXPECT_NE(testing::run_command(
                testing::titan_binary().string() + " info --flavor debugmodel --device cdua 2>&1", &out),
            0);
  EXPECT_NE(out.find("--device cdua: expected cpu or cuda"), std::string::npos) << out;
}

// The plan builds a rank's state as the trainer does (train::rank_model): its blocks born as its
// slices. Were they born whole and sliced afterwards, the start-up would hold whole layers, and the
// segments they took would stay reserved through the step (a 30B-A3B plan on 8 ranks once showed
// 228 GiB reserved for an 80 GiB peak).
TEST(StepProfile, AShardedRanksPlannedStartUpHoldsItsSlicesOnly) {
  for (const int64_t ep : {1, 2}) {
    StepShape shape = small_step(DType::BF16);
    shape.device = Device::CUDA;
    shape.dp_shard = 4;
    shape.ep = ep;
    const StepProfile sharded = profile_training_step(small("debugmodel_moe"), shape, Device::Meta);
    EXPECT_EQ(sharded.startup_peak, sharded.persistent()) << "ep " << ep;
    shape.dp_shard = 1;
    shape.ep = 1;
    const StepProfile whole = profile_training_step(small("debugmodel_moe"), shape, Device::Meta);
    EXPECT_EQ(whole.startup_peak, whole.persistent());
    // A quarter of the state, up to the padding of each block to a multiple of 4 elements (the bf16
    // copies apart: a sharded rank keeps its slice's of every block, one process none of its untied
    // embedding table, which it only looks up).
    EXPECT_LE((sharded.persistent() - sharded.compute_weights) * 4,
              whole.persistent() - whole.compute_weights + 4 * 16 * int64_t(sizeof(float)) * sharded.blocks)
        << "ep " << ep;
    EXPECT_EQ(sharded.compute_weights * 2, sharded.weights) << "ep " << ep;
    // The step's reservation is its peak's, up to what rounding and splitting cannot reuse.
    EXPECT_LE(sharded.reserved, sharded.peak + sharded.peak / 10) << "ep " << ep;
  }
}

// The meta device hands out memory through the caching allocator CUDA uses, and each profile
// starts from an empty cache: the reserved bytes are the step's own, the same run after run, and
// above the peak only by the segments' rounding and what splitting could not reuse.
TEST(StepProfile, ReservedBytesAreTheStepsOwnAndRepeatable) {
  DeviceServices& meta = device_services(Device::Meta);
  StepShape shape = small_step(DType::BF16);
  shape.keep_logits_bytes = loss_logits_budget(Device::CUDA);
  const int64_t before = meta.stats().current_bytes;
  const StepProfile first = profile_training_step(small("debugmodel_moe"), shape, Device::Meta);
  // Nothing of the step outlives it: a MoE model's logged-only aux loss left its node, and every
  // layer's router probabilities with it, on the tape until the next backward.
  EXPECT_EQ(meta.stats().current_bytes, before);
  // Memory left cached by other work does not count towards the next step's figure.
  void* p = meta.allocate(size_t(256) << 20);
  meta.deallocate(p, size_t(256) << 20);
  const StepProfile second = profile_training_step(small("debugmodel_moe"), shape, Device::Meta);
  EXPECT_EQ(first.reserved, second.reserved);
  EXPECT_EQ(first.peak, second.peak);
  EXPECT_GE(first.reserved, first.peak);
  EXPECT_LE(first.reserved, first.peak + first.peak / 4) << "peak " << first.peak << " B";
  std::printf("debugmodel_moe (2 layers), bf16, 2 x 128: peak %.1f MiB, reserved %.1f MiB\n",
              double(first.peak) / 1048576.0, double(first.reserved) / 1048576.0);
}

// The meta device bounded as a GPU's memory bounds CUDA's caching allocator (MetaMemoryBound): a
// segment past the bound is refused, the cache returns its wholly free segments and tries again,
// and a request refused even then throws MetaOutOfMemory; unbounded again, the same request is
// served.
TEST(StepProfile, TheMetaCacheWithinABoundReturnsItsFreeSegmentsBeforeRefusing) {
  constexpr size_t MiB = size_t(1) << 20;
  DeviceServices& meta = device_services(Device::Meta);
  meta.release_cached();
  const int64_t base = meta.stats().reserved_bytes;
  {
    const MetaMemoryBound bound(base + int64_t(64 * MiB));
    void* a = meta.allocate(40 * MiB);
    meta.deallocate(a, 40 * MiB);       // its segment stays cached
    void* b = meta.allocate(50 * MiB);  // 40 + 50 > 64: the cached segment goes back first
    EXPECT_EQ(meta.stats().reserved_bytes - base, int64_t(50 * MiB));
    try {
      meta.allocate(20 * MiB);  // 50 + 20 > 64 with nothing cached
      ADD_FAILURE() << "a request past the bound was served";
    } catch (const MetaOutOfMemory& e) {
      EXPECT_NE(std::string(e.what()).find("20971520 bytes requested"), std::string::npos) << e.what();
    }
    meta.deallocate(b, 50 * MiB);
  }
  void* c = meta.allocate(80 * MiB);  // no bound: as large as asked
  meta.deallocate(c, 80 * MiB);
  meta.release_cached();
  EXPECT_EQ(meta.stats().reserved_bytes, base);
}

// titan plan's verdict for a cuda job (fit_step by the reservation): within the unbounded
// reservation it fits as is; below the peak nothing fits; in between it fits exactly when the step
// replayed within the bound completes, and then needs no more than the bound.
TEST(StepProfile, ACudaStepFitsWhenItsReplayWithinTheBoundCompletes) {
  StepShape shape = small_step(DType::BF16);
  shape.device = Device::CUDA;
  shape.keep_logits_bytes = loss_logits_budget(Device::CUDA);
  const qwen3::ModelArgs args = small("debugmodel_moe");
  const StepProfile p = profile_training_step(args, shape, Device::Meta);
  ASSERT_GT(p.reserved, p.peak);
  const MemoryFit roomy = fit_step(args, shape, p.reserved, true);
  EXPECT_TRUE(roomy.fits && !roomy.by_returning_cache);
  EXPECT_EQ(roomy.need, p.reserved);
  EXPECT_FALSE(fit_step(args, shape, p.peak - 1, true).fits);
  for (const int64_t available : {p.peak, p.peak + (p.reserved - p.peak) / 2, p.reserved - 1}) {
    const MemoryFit f = fit_step(args, shape, available, true);
    bool completes = true;
    try {
      const MetaMemoryBound bound(available);
      profile_training_step(args, shape, Device::Meta);
    } catch (const MetaOutOfMemory&) {
      completes = false;
    }
    EXPECT_EQ(f.fits, completes) << available << " bytes";
    EXPECT_EQ(f.by_returning_cache, completes) << available << " bytes";
    EXPECT_EQ(f.unbounded_need, p.reserved);
    if (f.fits) {
      EXPECT_LE(f.need, available);
    }
  }
}

// A GPU step lets the fused loss keep more of its logits than a CPU step (loss_logits_budget), and
// the plan of a cuda job counts them, also on a machine without a GPU: 2 x 2048 tokens of f32 logits
// over Qwen3's vocabulary (2.5 GB) are over the CPU's 1 GiB and under the GPU's 8 GiB. The GPU
// step also holds cuBLASLt's workspace, and not the [N, 8192] f32 chunk of logits the CPU's backward
// recomputes into (the GPU turns its kept logits into their gradient in place).
TEST(StepProfile, ACudaJobsPlanCountsTheLogitsItKeeps) {
  EXPECT_EQ(loss_logits_budget(Device::CPU), int64_t(1) << 30);
  EXPECT_EQ(loss_logits_budget(Device::CUDA), int64_t(8) << 30);
  const std::string config = (testing::source_dir() / "configs" / "debugmodel.toml").string();
  auto plan = [&](const char* device) {
    const JobConfig cfg = load_job_config(config, {{"job.device", device},
                                                   {"training.mixed_precision_param", "float32"},
                                                   {"training.seq_len", "2048"},
                                                   {"model.n_layers", "1"}});
    const PlannedStep p = planned_step(cfg, 1, 1);
    EXPECT_EQ(p.shape.keep_logits_bytes, loss_logits_budget(std::string(device) == "cuda" ? Device::CUDA : Device::CPU));
    return profile_training_step(p.args, p.shape, Device::Meta);
  };
  const StepProfile cpu = plan("cpu"), cuda = plan("cuda");
  const int64_t logits = 2 * 2048 * int64_t(qwen3::flavor("debugmodel").vocab_size) * 4;
  ASSERT_GT(logits, int64_t(1) << 30);
  EXPECT_EQ(cuda.weights, cpu.weights);
  const int64_t cpu_chunk = 2 * 2048 * int64_t(8192) * 4;
  EXPECT_GE(cuda.peak - cpu.peak, logits - cpu_chunk)
      << "cpu " << cpu.peak << " B, cuda " << cuda.peak << " B";
  EXPECT_LE(cuda.peak - cpu.peak, logits + int64_t(kCudaGemmWorkspaceBytes));
}

// A step planned for a GPU holds what the CUDA kernels hold besides the tensors (MetaStandIn): the
// cuBLASLt workspace, the bf16 copy of dy in each linear backward, the MoE routing and expert
// buffers, the attention row terms. With the same loss budget on both, the plan of the GPU step
// peaks above the CPU step's by at least the workspace, less the [N, 8192] bf16 chunk of the loss
// gradient the CPU's backward holds and the GPU's does not (it turns its kept logits into their
// gradient in place), its persistent state is the same, and the stand-in ends with the profile. (Whether the
// figures are the GPU's own is checked on a GPU: cuda_train_test, CudaStepProfile.)
TEST(StepProfile, AStepPlannedForAGpuHoldsTheCudaKernelsScratch) {
  qwen3::ModelArgs a = small("debugmodel_moe");
  StepShape shape = small_step(DType::BF16);
  const StepProfile cpu = profile_training_step(a, shape, Device::Meta);
  shape.device = Device::CUDA;
  const StepProfile gpu = profile_training_step(a, shape, Device::Meta);
  EXPECT_EQ(meta_stands_in_for(), Device::CPU);
  EXPECT_EQ(gpu.weights, cpu.weights);
  EXPECT_EQ(gpu.grads, cpu.grads);
  EXPECT_EQ(gpu.optimizer, cpu.optimizer);
  EXPECT_EQ(gpu.other, cpu.other);
  const int64_t cpu_loss_gradient = shape.local_batch * shape.seq_len * int64_t(8192) * 2;
  EXPECT_GE(gpu.peak - cpu.peak, int64_t(kCudaGemmWorkspaceBytes) - cpu_loss_gradient)
      << "cpu " << cpu.peak << " B, gpu " << gpu.peak;
  EXPECT_EQ(gpu.flops, cpu.flops);
  std::printf("debugmodel_moe (2 layers), bf16, 2 x 128, planned peak: cpu %lld B, cuda %lld B\n",
              (long long)cpu.peak, (long long)gpu.peak);
  // Only the meta device stands in for another.
  const std::string e = testing::error_of([&] { profile_training_step(a, shape, Device::CPU); });
  EXPECT_NE(e.find("step profile: a step for cuda profiled on cpu"), std::string::npos) << e;
}

}  // namespace
}  // namespace titan::train
