// titan plan: one rank's memory on a data-parallel mesh from the meta device, the largest batch
// that fits, and its errors. The per-rank figures are checked against the in-process profile and
// against the ParallelPlan's own sharding (nothing here re-derives what the plan shards).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <set>

#include "test_util.h"
#include "titan/autograd/autograd.h"
#include "titan/core/device_services.h"
#include "titan/data/assets.h"
#include "titan/data/tokenizer.h"
#include "titan/dist/meta_world.h"
#include "titan/dist/parallel_plan.h"
#include "titan/models/qwen3/model.h"
#include "titan/train/job_config.h"
#include "titan/train/scale_planner.h"
#include "titan/train/step_profile.h"
#include "titan/train/train_state.h"

namespace titan::train {
namespace {

namespace tt = titan::testing;

std::string debugmodel_toml() { return (tt::source_dir() / "configs" / "debugmodel.toml").string(); }

// `titan plan` on debugmodel at seq 128 with `flags`; its output (exit status in *rc).
std::string run_plan(const std::string& flags, int* rc) {
  std::string out;
  // A GEMM rate unless the flags give one (a flag given twice is an error).
  const std::string gemm = flags.find("--gemm-tflops") == std::string::npos ? " --gemm-tflops 1 " : " ";
  *rc = tt::run_command(tt::titan_binary().string() + " plan --config " + debugmodel_toml() +
                            " --training.seq_len=128" + gemm + flags,
                        &out);
  return out;
}

std::string printed_gib(const char* label, int64_t bytes) {
  char s[96];
  std::snprintf(s, sizeof s, "%s%.2f GiB", label, double(bytes) / double(int64_t(1) << 30));
  return s;
}

PlannedStep debugmodel_step(int64_t replicate, int64_t shard, const char* device = "cpu") {
  const JobConfig cfg =
      load_job_config(debugmodel_toml(), {{"training.seq_len", "128"}, {"job.device", device}});
  return planned_step(cfg, replicate, shard);
}

TEST(Plan, PerRankFiguresAreTheInProcessMetaProfile) {
  for (auto [replicate, shard] : {std::pair<int64_t, int64_t>{1, 1}, {1, 2}, {2, 2}}) {
    int rc = 0;
    const std::string out = run_plan("--memory-per-rank 64GiB --mesh dp_shard=" + std::to_string(shard) +
                                         ",dp_replicate=" + std::to_string(replicate),
                                     &rc);
    ASSERT_EQ(rc, 0) << out;
    const auto [args, shape] = debugmodel_step(replicate, shard);
    const StepProfile p = profile_training_step(args, shape, Device::Meta);
    ASSERT_GT(p.compute_weights, 0) << "a bf16 job keeps a bf16 copy of its weights";
    for (auto [label, bytes] : {std::pair{"weights (f32)        ", p.weights},
                                {"weights (bf16 copy)  ", p.compute_weights},
                                {"gradients (f32)      ", p.grads},
                                {"AdamW state (f32)    ", p.optimizer},
                                {"activations + temps  ", p.activations()},
                                {"peak per rank        ", p.peak},
                                {"reserved             ", memory_need(p)}})
      EXPECT_NE(out.find(printed_gib(label, bytes)), std::string::npos) << printed_gib(label, bytes) << "\n" << out;
    // The final export (last_save_in_hf) and [validation] run after the step.
    ASSERT_TRUE(shape.export_gather || shape.validation_batch > 0);
    ASSERT_GT(p.after_step_peak, 0);
    EXPECT_NE(out.find(printed_gib("    after the step: ", p.after_step_peak)), std::string::npos) << out;
    char flops[64];
    std::snprintf(flops, sizeof flops, "compute         %.4g FLOPs per rank", p.flops);
    EXPECT_NE(out.find(flops), std::string::npos) << out;
    EXPECT_NE(out.find("fits: yes"), std::string::npos) << out;
  }
}

TEST(Plan, ShardingKeepsTheSlicesTheParallelPlanCuts) {
  const auto [args, one_shape] = debugmodel_step(1, 1);
  const StepProfile one = profile_training_step(args, one_shape, Device::Meta);
  for (int64_t n : {2, 3, 8}) {
    const StepProfile sharded = profile_training_step(args, debugmodel_step(1, n).shape, Device::Meta);
    // The blocks as the plan pads and slices them for n shards (the ParallelPlan's own decision).
    const auto world = dist::meta_world_communicator(int(n));
    const dist::ParallelPlan plan(*world, 1, n);
    qwen3::Qwen3Model model(args, one_shape.compute, Device::Meta);
    plan.shard_blocks(model.blocks());
    int64_t slice = 0;
    for (auto& b : model.blocks()) slice += int64_t(b.data().nbytes()) / n;
    // ZeRO-3: this rank keeps its slice of the weights and gradients, and the moments of that slice.
    EXPECT_EQ(sharded.weights, slice);
    EXPECT_EQ(sharded.compute_weights, slice / 2);  // the bf16 copy AdamW writes
    EXPECT_EQ(sharded.grads, slice);
    EXPECT_EQ(sharded.optimizer, 2 * slice);
    // ~1/n of one rank's state: padding adds fewer than n elements per block.
    EXPECT_GE(sharded.optimizer * n, one.optimizer);
    EXPECT_LT(sharded.optimizer * n - one.optimizer, int64_t(model.blocks().size()) * n * 2 * 4);
    EXPECT_LT(sharded.peak, one.peak);
  }
  // Replicas hold what one shard group holds; DDP holds what one process holds.
  const StepProfile hsdp = profile_training_step(args, debugmodel_step(2, 2).shape, Device::Meta);
  const StepProfile fsdp = profile_training_step(args, debugmodel_step(1, 2).shape, Device::Meta);
  EXPECT_EQ(hsdp.weights, fsdp.weights);
  EXPECT_EQ(hsdp.optimizer, fsdp.optimizer);
  const StepProfile ddp = profile_training_step(args, debugmodel_step(4, 1).shape, Device::Meta);
  EXPECT_EQ(ddp.weights, one.weights);
  EXPECT_EQ(ddp.optimizer, one.optimizer);
}

// A bf16 job's one process keeps the bf16 copy AdamW writes only of the blocks whose casts its step
// would hold until their backward anyway: not of the layers activation checkpointing covers, nor of
// an untied embedding table (only looked up), so the copy never raises the peak. Sharded, every
// block keeps its slice's copy.
TEST(Plan, ABf16CopyIsKeptOnlyWhereTheStepHoldsTheCastsAnyway) {
  auto [args, shape] = debugmodel_step(1, 1);
  ASSERT_TRUE(args.tie_embeddings);
  qwen3::Qwen3Model model(args, shape.compute, Device::Meta);
  const int64_t head = int64_t(model.blocks()[size_t(args.n_layers) + 1].data().nbytes());
  const int64_t embedding = int64_t(model.blocks()[0].data().nbytes());
  auto profile = [&](qwen3::Checkpointing ac, bool tied) {
    StepShape s = shape;
    s.checkpointing = ac;
    qwen3::ModelArgs a = args;
    a.tie_embeddings = tied;
    return profile_training_step(a, s, Device::Meta);
  };
  const StepProfile none = profile(qwen3::Checkpointing::none(), true),
                    full = profile(qwen3::Checkpointing::full(), true),
                    every_other = profile(qwen3::Checkpointing::every_nth(2), true),
                    untied = profile(qwen3::Checkpointing::none(), false);
  EXPECT_EQ(none.compute_weights, none.weights / 2);        // every block
  EXPECT_EQ(full.compute_weights, (embedding + head) / 2);  // the tied table, read whole by the head
  const int64_t layer = int64_t(model.blocks()[1].data().nbytes());
  EXPECT_EQ(every_other.compute_weights, none.compute_weights - (args.n_layers / 2) * layer / 2);
  const int64_t untied_embedding = int64_t(args.vocab_size * args.dim * 4);
  EXPECT_EQ(untied.compute_weights, (untied.weights - untied_embedding) / 2);
  // Sharded, each slice keeps its copy whatever the checkpointing.
  auto [args2, sharded_shape] = debugmodel_step(1, 2);
  sharded_shape.checkpointing = qwen3::Checkpointing::full();
  const StepProfile sharded = profile_training_step(args2, sharded_shape, Device::Meta);
  EXPECT_EQ(sharded.compute_weights, sharded.weights / 2);
  // The blocks left without a copy, which the step casts at each use, are counted for the line that
  // says what the figure holds.
  EXPECT_EQ(none.cast_layers, 0);
  EXPECT_EQ(full.cast_layers, args.n_layers);
  EXPECT_EQ(every_other.cast_layers, args.n_layers / 2);
  EXPECT_FALSE(none.cast_embedding || full.cast_embedding || every_other.cast_embedding);
  EXPECT_TRUE(untied.cast_embedding);
  EXPECT_EQ(untied.cast_layers, 0);
  EXPECT_EQ(sharded.cast_layers, 0);
  EXPECT_FALSE(sharded.cast_embedding);
}

// titan plan and titan info say what the bf16 copy's figure holds under each checkpointing mode: the
// whole model's copy, or every block's but those the step casts at each use.
TEST(Plan, TheBf16CopyLineSaysWhichBlocksKeepIt) {
  const std::string all = "(written by AdamW with each update: no step casts the weights)";
  const std::string but = "(written by AdamW with each update, of every trained block but ";
  const std::pair<std::string, std::string> cases[] = {
      {"--activation_checkpoint.mode=none", all},
      {"--activation_checkpoint.mode=selective --activation_checkpoint.selective_ac_option=2",
       but + "the 4 layers activation checkpointing covers: a step casts those at each use)"},
      {"--activation_checkpoint.mode=full",
       but + "the 8 layers activation checkpointing covers: a step casts those at each use)"},
      {"--activation_checkpoint.mode=full --model.tie_embeddings=false",
       but + "the 8 layers activation checkpointing covers and the untied embedding table: a step casts "
             "those at each use)"},
      // Sharded, every block keeps its slice's copy whatever the checkpointing.
      {"--activation_checkpoint.mode=full --mesh dp_shard=2", all},
  };
  for (const auto& [flags, expected] : cases)
    for (const char* command : {"plan", "info"}) {
      if (std::string(command) == "info" && flags.find("--mesh") != std::string::npos) continue;
      std::string out;
      const std::string plan_flags =
          std::string(command) == "plan" ? " --gemm-tflops 1 --memory-per-rank 64GiB" : "";
      const int rc =
          tt::run_command(tt::titan_binary().string() + " " + command + " --config " + debugmodel_toml() +
                              " --training.seq_len=128" + plan_flags + " " + flags,
                          &out);
      EXPECT_EQ(rc, 0) << command << " " << flags << "\n" << out;
      EXPECT_NE(out.find("weights (bf16 copy)  "), std::string::npos) << command << " " << flags << "\n"
                                                                      << out;
      EXPECT_NE(out.find(expected), std::string::npos) << command << " " << flags << "\n" << out;
    }
}

TEST(Plan, CommunicationIsWhatTheShardingSendsOnTheMetaStep) {
  const auto [args, shape] = debugmodel_step(1, 1);
  EXPECT_EQ(profile_training_step(args, shape, Device::Meta).comm.bytes_sent, 0);
  // Psi (padded for 2 shards) and the part of it in layer blocks, as the plan and the model say.
  const auto world = dist::meta_world_communicator(2);
  const dist::ParallelPlan plan(*world, 1, 2);
  qwen3::Qwen3Model model(args, shape.compute, Device::Meta);
  plan.shard_blocks(model.blocks());
  const std::vector<dist::BlockRole> roles = block_roles(model);
  double psi = 0, psi_layers = 0;
  for (size_t b = 0; b < model.blocks().size(); ++b) {
    psi += double(model.blocks()[b].numel());
    if (roles[b].kind == dist::BlockKind::Layer) psi_layers += double(model.blocks()[b].numel());
  }
  // DDP on 2 ranks: one f32 all-reduce of every gradient, 2 x 4 x Psi x 1/2 bytes sent.
  const StepProfile ddp = profile_training_step(args, debugmodel_step(2, 1).shape, Device::Meta);
  EXPECT_DOUBLE_EQ(double(ddp.comm.bytes_sent), 2 * 4 * psi / 2);
  // FSDP on 2 ranks: a layer gathered twice (before its forward and its backward) in the compute
  // dtype (g bytes: 2 under bf16), the embedding and head blocks once, also in the compute dtype,
  // and one f32 reduce-scatter of every gradient, x 1/2.
  StepShape fsdp_shape = debugmodel_step(1, 2).shape;
  const double g = double(dtype_size(fsdp_shape.compute));
  const double psi_root = psi - psi_layers;
  const StepProfile fsdp = profile_training_step(args, fsdp_shape, Device::Meta);
  EXPECT_DOUBLE_EQ(double(fsdp.comm.bytes_sent), (2 * g * psi_layers + g * psi_root + 4 * psi) / 2);
  StepShape f32_shape = fsdp_shape;
  f32_shape.compute = DType::F32;  // every block gathered in f32: g = 4
  EXPECT_DOUBLE_EQ(double(profile_training_step(args, f32_shape, Device::Meta).comm.bytes_sent),
                   (2 * 4 * psi_layers + 4 * psi_root + 4 * psi) / 2);
  // training.mixed_precision_reduce = "bfloat16": the reduce-scatters send 2 bytes an element.
  StepShape bf16_reduce = fsdp_shape;
  bf16_reduce.reduce = DType::BF16;
  const StepProfile rs16 = profile_training_step(args, bf16_reduce, Device::Meta);
  EXPECT_DOUBLE_EQ(double(rs16.comm.bytes_sent), (2 * g * psi_layers + g * psi_root + 2 * psi) / 2);
  // fsdp_reshard_after_forward = "never" keeps the layers until their backward: one gather fewer
  // per layer, more memory.
  fsdp_shape.reshard = dist::Reshard::Never;
  const StepProfile kept = profile_training_step(args, fsdp_shape, Device::Meta);
  EXPECT_DOUBLE_EQ(double(fsdp.comm.bytes_sent - kept.comm.bytes_sent), g * psi_layers / 2);
  EXPECT_GT(kept.peak, fsdp.peak);
  // The time model: bytes over the bandwidth plus one latency per ring step.
  const Link link{8, 1};  // 1 GB/s, 1 us
  const CommEstimate e = estimate_communication(fsdp, debugmodel_step(1, 2).shape, link);
  EXPECT_DOUBLE_EQ(e.bytes, double(fsdp.comm.bytes_sent));
  EXPECT_DOUBLE_EQ(e.seconds, e.bytes / 1e9 + double(fsdp.comm.ring_steps) * 1e-6);
  EXPECT_EQ(fsdp.comm.ring_steps, fsdp.comm.collectives);  // n - 1 = 1 step per gather / scatter
  // A latency of 0 prices the bandwidth alone, and `titan plan --link-latency-us 0` asks for it.
  EXPECT_DOUBLE_EQ(estimate_communication(fsdp, debugmodel_step(1, 2).shape, Link{8, 0}).seconds,
                   e.bytes / 1e9);
  int rc = 0;
  const std::string out = run_plan("--mesh dp_shard=2 --link-gbps 8 --link-latency-us 0", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(" at 8 Gbit/s + 0 us per ring step = "), std::string::npos) << out;
  // Without --memory-per-rank each rank was given all of MemAvailable: the plan says what holds when
  // the mesh's ranks share this host, a batch for half of it, no larger than the whole host's.
  const size_t whole_at = out.find("largest local batch that fits: "),
               shared_at = out.find("if the 2 ranks share this host: 2 x ");
  ASSERT_NE(whole_at, std::string::npos) << out;
  ASSERT_NE(shared_at, std::string::npos) << out;
  const size_t each = out.find("the largest local batch that fits each rank's ", shared_at);
  ASSERT_NE(each, std::string::npos) << out;
  const int64_t whole = std::stoll(out.substr(whole_at + 31)),
                shared = std::stoll(out.substr(out.find(": ", each) + 2));
  EXPECT_GE(shared, 1) << out;
  EXPECT_LE(2 * shared, whole + 1) << out;
  EXPECT_EQ(run_plan("--mesh dp_shard=2 --memory-per-rank 64GiB", &rc).find("share this host:"),
            std::string::npos);
}

// Expert parallelism on 4 shard ranks: a rank's step holds its slice of every ordinary block and its
// slice of its run of experts (half of the E/ep experts of a run: the 2 ranks holding it shard it),
// as much as FSDP keeps; it sends the exchanges' rows besides the FSDP collectives, and `titan plan`
// prints that profile; `titan info` (one process) profiles the experts whole.
TEST(Plan, ExpertParallelRanksHoldTheirSliceOfTheirRunOfExperts) {
  const JobConfig cfg = load_job_config(debugmodel_toml(), {{"training.seq_len", "128"},
                                                            {"model.flavor", "debugmodel_moe"},
                                                            {"parallelism.expert_parallel_degree", "2"}});
  const auto [args, shape] = planned_step(cfg, 1, 4, 2);
  const StepProfile ep = profile_training_step(args, shape, Device::Meta);
  const StepProfile fsdp = profile_training_step(args, planned_step(cfg, 1, 4).shape, Device::Meta);
  const auto world = dist::meta_world_communicator(4);
  const dist::ParallelPlan plan(*world, 1, 4, 2);
  qwen3::Qwen3Model model(args, shape.compute, Device::Meta, {}, qwen3::Purpose::Training, {0, 2});
  plan.shard_blocks(model.blocks());
  int64_t held = 0;
  for (size_t b = 0; b < model.blocks().size(); ++b)
    held += int64_t(model.blocks()[b].data().nbytes()) / (model.is_expert_block(b) ? 2 : 4);
  EXPECT_EQ(ep.weights, held);
  EXPECT_EQ(ep.grads, held);
  EXPECT_EQ(ep.optimizer, 2 * held);
  // A quarter of the experts, as under FSDP (the blocks are padded to other multiples: a few
  // elements each).
  EXPECT_NEAR(double(ep.weights), double(fsdp.weights), 4.0 * 4 * double(model.blocks().size()));
  EXPECT_GT(ep.comm.collectives, 0);
  // The exchanges' all-to-alls are a part of what the rank sends, and FSDP alone makes none.
  EXPECT_GT(ep.comm.all_to_alls, 0);
  EXPECT_LT(ep.comm.all_to_alls, ep.comm.collectives);
  EXPECT_GT(ep.comm.all_to_all_bytes, 0);
  EXPECT_LT(ep.comm.all_to_all_bytes, ep.comm.bytes_sent);
  EXPECT_EQ(fsdp.comm.all_to_alls, 0);
  EXPECT_EQ(fsdp.comm.all_to_all_bytes, 0);
  // Experts split over the whole shard dimension stay whole on their rank: under full checkpointing
  // they keep no bf16 copy (cast at each use) while their layers' slices keep theirs.
  StepShape whole_runs = planned_step(cfg, 1, 2, 2).shape;
  whole_runs.checkpointing = qwen3::Checkpointing::full();
  const StepProfile runs = profile_training_step(args, whole_runs, Device::Meta);
  const int64_t expert_blocks = int64_t(model.blocks().size()) - args.n_layers - 2;
  ASSERT_GT(expert_blocks, 0);
  EXPECT_EQ(runs.cast_experts_only, expert_blocks);
  EXPECT_EQ(runs.cast_layers, 0);
  EXPECT_EQ(ep.cast_experts_only, 0);  // sliced over 2 ranks: each slice keeps its copy
  int rc = 0;
  std::string out = run_plan(
      "--model.flavor=debugmodel_moe --parallelism.expert_parallel_degree=2 "
      "--memory-per-rank 64GiB --mesh dp_shard=4",
      &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("mesh: FSDP + EP, 4 ranks (dp_replicate 1 x dp_shard 4, experts split over 2)"),
            std::string::npos)
      << out;
  // The communication line names the layout as the mesh line does, and the all-to-alls' share.
  char comm[192];
  std::snprintf(comm, sizeof comm,
                "MB sent per rank (FSDP + EP, %ld collectives (%ld of them the experts' "
                "all-to-alls, %.4g MB), %ld ring steps;",
                long(ep.comm.collectives), long(ep.comm.all_to_alls), double(ep.comm.all_to_all_bytes) / 1e6,
                long(ep.comm.ring_steps));
  EXPECT_NE(out.find(comm), std::string::npos) << comm << "\n" << out;
  EXPECT_NE(out.find(printed_gib("weights (f32)        ", ep.weights)), std::string::npos) << out;
  out.clear();
  rc = tt::run_command(tt::titan_binary().string() + " info --config " + debugmodel_toml() +
                           " --model.flavor=debugmodel_moe --parallelism.expert_parallel_degree=2",
                       &out);
  EXPECT_EQ(rc, 0) << out;
}

// The shapes the GEMM rate is measured on carry the model's forward matmul FLOPs, all of them (the
// lm_head's whole vocabulary where its measured width is capped, an expert's exact share of the rows):
// what 6 x active matmul parameters counts for the forward, a third of it.
TEST(Plan, TheGemmShapesCarryTheModelsForwardMatmulFlops) {
  for (const char* flavor : {"debugmodel", "debugmodel_moe"}) {
    const JobConfig cfg =
        load_job_config(debugmodel_toml(), {{"training.seq_len", "128"}, {"model.flavor", flavor}});
    const qwen3::ModelArgs args = resolve_model_args(cfg);
    for (const int64_t M : {int64_t(1), int64_t(256)}) {
      double flops = 0;
      for (const GemmShape& s : model_gemm_shapes(args, M)) {
        EXPECT_LE(s.n, 16384) << flavor;
        EXPECT_GE(s.m, 1) << flavor;
        flops += s.flops;
      }
      const double attention = 12.0 * double(args.n_layers * args.n_heads * args.head_dim * 128);
      EXPECT_NEAR(flops, double(M) * (args.flops_per_token(128) - attention) / 3, 1e-9 * flops)
          << flavor << ", M " << M;
    }
  }
}

// The plan's GEMM rate is the model's own: each distinct projection shape measured (the lm_head at
// its capped width), combined by FLOPs, so it lies between the slowest and the fastest shape's.
TEST(Plan, TheGemmRateIsTheModelsShapesWeightedByTheirFlops) {
  const auto [args, shape] = debugmodel_step(1, 1);
  const GemmRate r = measure_model_gemm_rate(Device::CPU, DType::F32, args, 64, 0.05);
  ASSERT_GT(r.tflops, 0);
  const std::regex one(R"((\d+) x (\d+) x (\d+) ([0-9.e+-]+))");
  double slowest = 1e300, fastest = 0;
  std::set<std::string> measured;
  for (auto it = std::sregex_iterator(r.source.begin(), r.source.end(), one); it != std::sregex_iterator();
       ++it) {
    measured.insert((*it)[1].str() + "x" + (*it)[2].str() + "x" + (*it)[3].str());
    slowest = std::min(slowest, std::stod((*it)[4].str()));
    fastest = std::max(fastest, std::stod((*it)[4].str()));
  }
  const int64_t q = args.n_heads * args.head_dim;
  for (const std::string& want : {"64x" + std::to_string(q) + "x" + std::to_string(args.dim),
                                  "64x" + std::to_string(args.dim) + "x" + std::to_string(q),
                                  "64x" + std::to_string(args.hidden_dim) + "x" + std::to_string(args.dim),
                                  "64x16384x" + std::to_string(args.dim)})
    EXPECT_TRUE(measured.count(want)) << want << " in " << r.source;
  EXPECT_GE(r.tflops, slowest * (1 - 1e-2)) << r.source;  // the shown rates have 3 digits
  EXPECT_LE(r.tflops, fastest * (1 + 1e-2)) << r.source;
}

TEST(Plan, TheLargestFittingBatchFitsAndTheNextDoesNot) {
  const auto [args, shape] = debugmodel_step(1, 2);
  StepShape at = shape;
  at.local_batch = 7;
  // A memory budget between the needs (reservations) of batches 7 and 8 (not on either: the search
  // must find 7).
  const int64_t need7 = memory_need(profile_training_step(args, at, Device::Meta));
  at.local_batch = 8;
  const int64_t need8 = memory_need(profile_training_step(args, at, Device::Meta));
  ASSERT_LT(need7, need8);
  const int64_t budget = need7 + (need8 - need7) / 2;
  const BatchSearch s = largest_fitting_batch(args, shape, budget, false);
  EXPECT_EQ(s.largest, 7);
  EXPECT_EQ(s.largest_need, need7);
  EXPECT_EQ(s.next_need, need8);
  EXPECT_FALSE(s.at_bound);
  // The command says the same for that budget in bytes.
  int rc = 0;
  const std::filesystem::path json_file = tt::temp_dir("plan_json") / "plan.json";
  const std::string out = run_plan(
      "--mesh dp_shard=2 --memory-per-rank " + std::to_string(budget) + " --json " + json_file.string(), &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("largest local batch that fits: 7 ("), std::string::npos) << out;
  // --json writes the same figures as numbers.
  std::ifstream json_in(json_file);
  ASSERT_TRUE(json_in) << out;
  const nlohmann::json plan = nlohmann::json::parse(json_in);
  EXPECT_EQ(plan["largest_local_batch"]["value"], 7) << plan;
  EXPECT_EQ(plan["largest_local_batch"]["need"], need7) << plan;
  EXPECT_EQ(plan["largest_local_batch"]["next_need"], need8) << plan;
  EXPECT_EQ(plan["step"]["local_batch"], shape.local_batch) << plan;
  EXPECT_EQ(plan["available_per_rank"]["bytes"], budget) << plan;
  EXPECT_EQ(plan["available_per_rank"]["source"], "--memory-per-rank") << plan;
  EXPECT_EQ(plan["memory_per_rank"]["need"], memory_need(profile_training_step(args, shape, Device::Meta)))
      << plan;
  EXPECT_EQ(plan["fits"], true) << plan;
  EXPECT_EQ(plan["mesh"]["ranks"], 2) << plan;
  EXPECT_EQ(plan["time"]["gemm_tflops"], 1.0) << plan;
  EXPECT_DOUBLE_EQ(
      plan["tokens_per_second"]["per_rank"].get<double>(),
      double(plan["step"]["local_batch"].get<int64_t>() * plan["step"]["seq_len"].get<int64_t>() *
             plan["step"]["micro_batches"].get<int64_t>()) /
          plan["time"]["step_seconds_hidden"].get<double>())
      << plan;
  EXPECT_FALSE(plan.contains("shared_host")) << "given --memory-per-rank, nothing is shared";
  // A --json that would overwrite the config is refused before anything runs.
  const std::string refused = run_plan("--json " + debugmodel_toml(), &rc);
  EXPECT_EQ(rc, 1) << refused;
  EXPECT_NE(refused.find("--json: '" + debugmodel_toml() + "' is the input"), std::string::npos) << refused;
  // Below batch 1's need nothing fits, and the plan says so. (Below the job's own batch's too: a
  // reservation need not grow with the batch, as tensors move between the allocator's pools.)
  at.local_batch = 1;
  const int64_t need1 = memory_need(profile_training_step(args, at, Device::Meta));
  const int64_t below = std::min(need1, memory_need(profile_training_step(args, shape, Device::Meta))) - 1;
  EXPECT_EQ(largest_fitting_batch(args, shape, below, false).largest, 0);
  const std::string none = run_plan("--mesh dp_shard=2 --memory-per-rank " + std::to_string(below), &rc);
  ASSERT_EQ(rc, 3) << "a job that does not fit exits 3\n" << none;
  EXPECT_NE(none.find("fits: NO"), std::string::npos) << none;
  EXPECT_NE(none.find("largest local batch that fits: none"), std::string::npos) << none;
}

// Every job is judged by the reservation the meta replay predicts (both devices' tensors live in a
// caching allocator's segments). Between a job's peak and its reservation only a GPU job may still
// fit: its allocator returns its cached segments when cudaMalloc refuses one, and the plan replays
// the step within the budget; a CPU process returns its cache only at the machine's physical
// memory, so its job does not fit there. (No GPU needed: --memory-per-rank and --gemm-tflops ask
// nothing of the device.)
TEST(Plan, EveryJobMustFitItsReservationOnlyAGpuReturnsItsCacheAtTheBudget) {
  // The same job on the CPU and on a GPU (its kernels' scratch, its loss budget), batch 8.
  const auto [args, gpu_shape] = debugmodel_step(1, 1, "cuda");
  StepShape at = debugmodel_step(1, 1).shape;
  at.local_batch = 8;
  const StepProfile c = profile_training_step(args, at, Device::Meta);
  at = gpu_shape;
  at.local_batch = 8;
  const StepProfile p = profile_training_step(args, at, Device::Meta);
  ASSERT_GT(p.reserved, p.peak) << "the caching policy rounds and splits: segments exceed the tensors";
  ASSERT_GT(c.reserved, c.peak);
  ASSERT_GE(p.peak, c.peak) << "the GPU's step holds more scratch";
  EXPECT_EQ(memory_need(p), p.reserved);
  EXPECT_EQ(memory_need(c), c.reserved);
  const std::string batch =
      " --training.local_batch_size=8 --training.global_batch_size=8 --memory-per-rank ";
  int rc = 0;
  const std::string cpu = run_plan(batch + std::to_string(c.peak + (c.reserved - c.peak) / 2), &rc);
  EXPECT_EQ(rc, 3) << cpu;
  EXPECT_NE(cpu.find(printed_gib("reserved             ", c.reserved)), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("fits: NO, reserved"), std::string::npos) << cpu;
  EXPECT_EQ(cpu.find("returned its free segments"), std::string::npos) << "no replay within the budget\n"
                                                                       << cpu;
  EXPECT_NE(cpu.find("the process adds its code"), std::string::npos) << "the CPU process's own memory\n"
                                                                      << cpu;
  const std::string gpu =
      run_plan(batch + std::to_string(p.peak + (p.reserved - p.peak) / 2) + " --job.device=cuda", &rc);
  EXPECT_EQ(rc, 3) << gpu;
  EXPECT_NE(gpu.find(printed_gib("reserved             ", p.reserved)), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("fits: NO, reserved"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("after the caching allocator returned its free segments"), std::string::npos) << gpu;
  EXPECT_NE(gpu.find("largest local batch that fits: 7 (reserved"), std::string::npos) << gpu;
  EXPECT_EQ(gpu.find("the process adds its code"), std::string::npos) << "a CPU note on a GPU job\n" << gpu;
  // The search by reservation: batch 8 needs its reservation, batch 7 fits under it.
  const BatchSearch s = largest_fitting_batch(args, gpu_shape, p.peak + (p.reserved - p.peak) / 2, true);
  EXPECT_EQ(s.largest, 7);
  EXPECT_EQ(s.next_need, p.reserved);
  // Batch 8's replay ran out of memory mid-step: it left no autograd node behind (the next
  // profile's backward would run it, on a model gone: titan plan crashed so).
  EXPECT_EQ(autograd::current_tape().size(), 0u);
}

// checkpoint.async_mode = "async" on a CPU job: saves in the background write from a copy of this
// rank's weights and moments held beside every step, which plan, info, the batch search and titan
// train's check add to the peak. A GPU job's copy is host memory: the device's figures leave it out.
TEST(Plan, ACheckpointCopyForBackgroundSavesCountsBesideTheStepOnTheCpu) {
  const std::string async = " --checkpoint.enable=true --checkpoint.async_mode=async";
  const JobConfig cfg = load_job_config(
      debugmodel_toml(),
      {{"training.seq_len", "128"}, {"checkpoint.enable", "true"}, {"checkpoint.async_mode", "async"}});
  const auto [args, shape] = planned_step(cfg, 1, 2);
  ASSERT_TRUE(shape.async_checkpoint);
  const StepProfile p = profile_training_step(args, shape, Device::Meta);
  EXPECT_EQ(p.checkpoint_copy, p.weights + p.optimizer);  // this rank's slice: half of each block
  EXPECT_EQ(memory_need(p), p.reserved + p.checkpoint_copy);
  int rc = 0;
  const std::string out = run_plan("--memory-per-rank 64GiB --mesh dp_shard=2" + async, &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(printed_gib("checkpoint copy      ", p.checkpoint_copy)), std::string::npos) << out;
  EXPECT_NE(out.find(printed_gib("fits: yes, reserved + checkpoint copy ", p.reserved + p.checkpoint_copy)),
            std::string::npos)
      << out;
  // A budget between the reservation and the reservation with the copy: the step alone would fit,
  // the job does not.
  const std::string between = std::to_string(p.reserved + p.checkpoint_copy / 2);
  const std::string tight = run_plan("--memory-per-rank " + between + " --mesh dp_shard=2" + async, &rc);
  EXPECT_EQ(rc, 3) << tight;
  EXPECT_NE(tight.find("fits: NO, reserved + checkpoint copy"), std::string::npos) << tight;
  const std::string without = run_plan("--memory-per-rank " + between + " --mesh dp_shard=2", &rc);
  EXPECT_EQ(rc, 0) << without;
  EXPECT_EQ(without.find("checkpoint copy"), std::string::npos) << without;
  // titan info --config prints the same line.
  std::string info;
  EXPECT_EQ(tt::run_command(tt::titan_binary().string() + " info --config " + debugmodel_toml() +
                                " --training.seq_len=128" + async,
                            &info),
            0)
      << info;
  EXPECT_NE(info.find("checkpoint copy"), std::string::npos) << info;
  // On a GPU job the copy is in host memory, not the device's.
  StepShape gpu = shape;
  gpu.device = Device::CUDA;
  EXPECT_EQ(profile_training_step(args, gpu, Device::Meta).checkpoint_copy, 0);
}

TEST(Plan, TheTrainersCheckGivesEachRankOnAHostItsShareOfTheMemory) {
  // titan train's check before allocation profiles the run's own mesh; ranks on one host share
  // its MemAvailable. Enough ranks on this host that a share is below the step's peak: refused.
  const auto [args, shape] = debugmodel_step(1, 2);
  const int64_t peak = profile_training_step(args, shape, Device::Meta).peak;
  const int64_t available = available_memory_per_rank(Device::CPU);
  ASSERT_GT(available, peak) << "this machine cannot hold one debugmodel rank";
  EXPECT_NO_THROW(check_training_fits(args, shape, 1));
  const int64_t crowd = available / peak + 1;
  const std::string e = tt::error_of([&] { check_training_fits(args, shape, crowd); });
  EXPECT_NE(e.find("per rank of 2, the host's memory shared by its " + std::to_string(crowd) + " ranks"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("needs an estimated"), std::string::npos) << e;
  // The figure is named as what it is, and the advice leaves out what the job already does.
  EXPECT_NE(e.find("but this rank's share of the host's MemAvailable ("), std::string::npos) << e;
  EXPECT_NE(e.find(" over " + std::to_string(crowd) + " ranks) is "), std::string::npos) << e;
  EXPECT_NE(e.find("set activation_checkpoint.mode = \"full\""), std::string::npos) << e;
  StepShape full = shape;
  full.checkpointing = qwen3::Checkpointing::full();
  const std::string e_full = tt::error_of([&] { check_training_fits(args, full, crowd * 4); });
  EXPECT_NE(e_full.find("needs an estimated"), std::string::npos) << e_full;
  EXPECT_EQ(e_full.find("activation_checkpoint.mode"), std::string::npos) << e_full;
}

TEST(Plan, BadFlagsAreErrorsNamingTheFlag) {
  const std::pair<std::string, std::string> cases[] = {
      {"--mesh dp_shard=0", "--mesh 'dp_shard=0': dp_shard must be a whole number of ranks"},
      {"--mesh dp_shard=two", "--mesh 'dp_shard=two': dp_shard must be a whole number of ranks"},
      {"--mesh tp=2", "--mesh 'tp=2': unknown entry 'tp=2'"},
      {"--mesh dp_shard=2,dp_replicate=-1", "dp_replicate must be a whole number of ranks"},
      {"--memory-per-rank 12XB", "--memory-per-rank '12XB' is not a positive size"},
      {"--memory-per-rank 0GiB", "--memory-per-rank '0GiB' is not a positive size"},
      {"--memory-per-rank=-3", "--memory-per-rank '-3' is not a positive size"},
      {"--gemm-tflops -1", "--gemm-tflops must be a positive finite number, got '-1'"},
      {"--link-gbps fast", "--link-gbps must be a positive finite number, got 'fast'"},
      {"--link-latency-us -1", "--link-latency-us must be a finite number >= 0, got '-1'"},
      {"--link-latency-us inf", "--link-latency-us must be a finite number >= 0, got 'inf'"},
      {"--gemm-tflops inf", "--gemm-tflops must be a positive finite number, got 'inf'"},
      // A flag given twice is named, not last-wins; so is a mesh cut short.
      {"--mesh dp_shard=2 --mesh dp_shard=4", "--mesh is given twice ('dp_shard=2', 'dp_shard=4')"},
      {"--mesh dp_shard=2,", "--mesh 'dp_shard=2,' ends with a comma"},
      // The mesh must fit the config: global batch = local x ranks x accumulation.
      {"--mesh dp_shard=3 --training.global_batch_size=4",
       "training.global_batch_size (4) must be a positive multiple of local_batch_size x data-parallel ranks "
       "(2 "
       "x 3 = 6): 4 is no multiple of the 3 data-parallel ranks; this mesh takes 6, 12, ... with this local "
       "batch, or a mesh whose data-parallel ranks divide 4 takes it"},
      {"--mesh dp_shard=2 --training.global_batch_size=6",
       "(2 x 2 = 4): training.local_batch_size = 1 takes it (6 = 1 x 2 ranks x 3 accumulation steps)"},
      {"--training.global_batch_size=9223372036854775806",
       "training.global_batch_size = 9223372036854775806 exceeds the limit 2147483648"},
      // A rule that names a degree --mesh set says so, not "left at the default" (a degree the mesh
      // leaves out is 1 by --mesh as well).
      {"--model.flavor=debugmodel_moe --mesh dp_shard=4 --parallelism.expert_parallel_degree=3",
       "parallelism.expert_parallel_degree = 3 must divide parallelism.data_parallel_shard_degree (4 here): "
       "expert parallelism splits the experts over ranks of the shard dimension "
       "(parallelism.data_parallel_shard_degree set by --mesh dp_shard=4; parallelism.expert_parallel_degree "
       "set on the command line)"},
      {"--model.flavor=debugmodel_moe --mesh dp_replicate=8 --parallelism.expert_parallel_degree=8",
       "(1 here): expert parallelism splits the experts over ranks of the shard dimension "
       "(parallelism.data_parallel_shard_degree set by --mesh dp_replicate=8 (no dp_shard entry: 1); "
       "parallelism.expert_parallel_degree set on the command line)"},
      // --mesh sets both degrees: a degree given as a key too is one of them left unused.
      {"--mesh dp_shard=2 --parallelism.data_parallel_replicate_degree=2",
       "--mesh and --parallelism.data_parallel_replicate_degree=2 both set the mesh; give one"},
      // Degrees whose product wraps an int64 to 0 (it passed the bound as 0 ranks).
      {"--parallelism.data_parallel_replicate_degree=4294967296 "
       "--parallelism.data_parallel_shard_degree=4294967296",
       "titan plan: error: the mesh parallelism.data_parallel_replicate_degree 4294967296 x "
       "parallelism.data_parallel_shard_degree 4294967296 must be 1 .. 1048576 ranks"},
  };
  for (const auto& [flags, message] : cases) {
    int rc = 0;
    const std::string out = run_plan(flags, &rc);
    EXPECT_NE(rc, 0) << flags;
    EXPECT_NE(out.find(message), std::string::npos) << flags << "\n" << out;
  }
}

// A cuda job planned on a machine without a GPU (docs/planning.md: a laptop): the plan reads the
// GPU's memory and GEMM rate only where --memory-per-rank and --gemm-tflops do not give them, so the
// error names the flags missing, and with both the job is planned.
TEST(Plan, ACudaJobWithoutItsGpuNeedsTheFlagsThatStandInForIt) {
  if (device_available(Device::CUDA)) GTEST_SKIP() << "a CUDA device is here: the plan reads it";
  struct Case {
    std::string flags;
    bool ok;
    std::string expected, not_expected;
  };
  const std::string advice = "; to plan a cuda job on a machine without its GPU, give ";
  const Case cases[] = {
      {"--memory-per-rank 64GiB", false, advice + "--gemm-tflops (its GEMM rate in TFLOP/s), which",
       "--memory-per-rank ("},
      {"--gemm-tflops 400", false, advice + "--memory-per-rank (the GPU's memory, e.g. 80GiB), which",
       "--gemm-tflops ("},
      {"", false,
       advice + "--memory-per-rank (the GPU's memory, e.g. 80GiB) and --gemm-tflops (its GEMM rate in "
                "TFLOP/s), which the plan would otherwise read from the GPU",
       "src/titan/"},
      {"--memory-per-rank 64GiB --gemm-tflops 400", true, "GEMM rate       400 TFLOP/s (--gemm-tflops)", ""},
  };
  for (const Case& c : cases) {
    std::string out;
    const int rc = tt::run_command(tt::titan_binary().string() + " plan --config " + debugmodel_toml() +
                                       " --training.seq_len=128 --job.device=cuda " + c.flags,
                                   &out);
    EXPECT_EQ(rc == 0, c.ok) << c.flags << "\n" << out;
    EXPECT_NE(out.find(c.expected), std::string::npos) << c.flags << "\n" << out;
    if (!c.ok) {
      EXPECT_NE(out.find("job.device = \"cuda\": device 'cuda'"), std::string::npos) << out;
    }
    if (!c.not_expected.empty()) {
      EXPECT_EQ(out.find(c.not_expected), std::string::npos) << c.flags << "\n" << out;
    }
  }
}

TEST(Plan, AnAbsurdModelIsAnErrorBeforeAnythingIsBuilt) {
  // A config.json-sized mistake: 100,000,000 layers. plan, info and train refuse it from the
  // bounds of the model's fields, before any profile, allocation or data.
  for (const char* command : {"plan", "info", "train"}) {
    std::string out;
    const int rc = tt::run_command(tt::titan_binary().string() + " " + command + " --config " + debugmodel_toml() +
                                       " --model.n_layers=100000000 --job.dump_folder=" +
                                       tt::temp_dir(std::string("plan_absurd_") + command).string(),
                                   &out);
    EXPECT_NE(rc, 0) << command << "\n" << out;
    EXPECT_NE(out.find("n_layers = 100000000 exceeds the limit 16384"), std::string::npos) << command << "\n" << out;
  }
}

// plan and info check the data side as train does (tokenizer, dataset, document separator): a
// separator train refuses is an error here too, and the data line names the token train would use.
TEST(Plan, PlanAndInfoCheckTheDocumentSeparatorAsTrainDoes) {
  const data::Tokenizer tok = data::Tokenizer::load(data::default_tokenizer_path());
  const std::filesystem::path text_dir = tt::temp_dir("plan_plain_text");
  { std::ofstream(text_dir / "book.txt") << "One paragraph.\n\nAnother one.\n"; }
  { std::ofstream(text_dir / "table.xml") << "<x/>\n"; }
  const std::filesystem::path records = tt::temp_dir("plan_records") / "docs.jsonl";
  { std::ofstream(records) << "{\"text\": \"One document.\"}\n{\"text\": \"Another.\"}\n"; }
  struct Case {
    std::string flags, expected;
    bool ok;
  };
  const Case cases[] = {
      {"", "documents end with token " + std::to_string(tok.document_separator_id()) + " \"<|endoftext|>\"",
       true},
      {"--training.document_separator=eos_token",
       "documents end with token " + std::to_string(tok.eos_id()) + " ", true},
      {"'--training.document_separator=<|im_end|>'",
       "documents end with token " + std::to_string(tok.eos_id()) + " ", true},
      {"'--training.document_separator=hello world'",
       "training.document_separator = \"hello world\" is 2 tokens of the run's tokenizer", false},
      {"--training.dataset_path=" + text_dir.string() + " --training.text_split=line",
       "plain text: one document per line", true},
      // Set, with nothing it applies to: said.
      {"--training.dataset_path=" + records.string() + " --training.text_split=line",
       "training.text_split = \"line\" does not apply to these files (no plain-text file: each record is a "
       "document)",
       true},
      // The field records' text comes from; set with no record to read it from: said.
      {"--training.dataset_path=" + records.string(), "records' text from field 'text'", true},
      {"--training.dataset_path=" + text_dir.string() + " --training.text_field=body",
       "training.text_field = \"body\" does not apply to the training files (plain text only: no record has "
       "fields)",
       true},
      // A dataset that exists only on the cluster the job is planned for: said, not refused.
      {"--training.dataset_path=/nonexistent/shards",
       "data: not checked on this machine: training.dataset_path (set on the command line): dataset: "
       "\"/nonexistent/shards\" does not exist",
       true},
      // One that exists here is checked as train checks it.
      {"--training.dataset_path=" + (text_dir / "table.xml").string(),
       "'.xml' files are not a format titan reads", false},
  };
  for (const char* command : {"plan", "info"})
    for (const auto& c : cases) {
      std::string out;
      const std::string plan_flags =
          std::string(command) == "plan" ? " --gemm-tflops 1 --memory-per-rank 64GiB" : "";
      const int rc =
          tt::run_command(tt::titan_binary().string() + " " + command + " --config " + debugmodel_toml() +
                              " --training.seq_len=128" + plan_flags + " " + c.flags,
                          &out);
      EXPECT_EQ(rc == 0, c.ok) << command << " " << c.flags << "\n" << out;
      EXPECT_NE(out.find(c.expected), std::string::npos) << command << " " << c.flags << "\n" << out;
    }
}

// The checks train makes across keys hold in plan and info as well: a job train refuses is no job.
TEST(Plan, PlanAndInfoRefuseWhatTrainRefusesAcrossKeys) {
  for (const char* command : {"plan", "info"}) {
    std::string out;
    const std::string plan_flags =
        std::string(command) == "plan" ? " --gemm-tflops 1 --memory-per-rank 64GiB" : "";
    const int rc =
        tt::run_command(tt::titan_binary().string() + " " + command + " --config " + debugmodel_toml() +
                            plan_flags + " --training.steps=40 --lr_scheduler.warmup_steps=50",
                        &out);
    EXPECT_NE(rc, 0) << command << "\n" << out;
    EXPECT_NE(out.find("lr_scheduler.warmup_steps (50) must not exceed training.steps (40)"),
              std::string::npos)
        << command << "\n"
        << out;
  }
}

// The [kernels] table as train checks it (op, variant, dtype, modules), before any figure: a plan
// of a job that train would refuse is no plan.
TEST(Plan, PlanAndInfoCheckTheKernelsTableAsTrainDoes) {
  const std::filesystem::path dir = tt::temp_dir("plan_kernels_" + std::to_string(getpid()));
  struct Case {
    std::string table, flags, expected;
    bool ok;
  };
  const Case cases[] = {
      {"rope = { impl = \"gather_free\" }", "", "gradients (f32)", true},
      {"rope = { impl = \"nope\" }", "", "kernels.rope: op 'rope' has no variant 'nope'", false},
      {"rope = { impl = \"gather_free\", modules = \"output\" }", "",
       "kernels.rope: modules pattern 'output' matches no module that runs rope", false},
      {"attention = { impl = \"bf16_probs\" }", "--training.mixed_precision_param=float32",
       "kernels.attention: variant 'bf16_probs' has no cpu/f32 kernel", false},
  };
  std::ifstream in(debugmodel_toml());
  const std::string base((std::istreambuf_iterator<char>(in)), {});
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    const std::filesystem::path toml = dir / ("job" + std::to_string(i) + ".toml");
    std::ofstream(toml) << base << "\n[kernels]\n" << c.table << "\n";
    for (const char* command : {"plan", "info"}) {
      std::string out;
      const std::string plan_flags =
          std::string(command) == "plan" ? " --gemm-tflops 1 --memory-per-rank 64GiB" : "";
      const int rc =
          tt::run_command(tt::titan_binary().string() + " " + command + " --config " + toml.string() +
                              " --training.seq_len=128" + plan_flags + " " + c.flags,
                          &out);
      EXPECT_EQ(rc == 0, c.ok) << command << " " << c.table << "\n" << out;
      EXPECT_NE(out.find(c.expected), std::string::npos) << command << " " << c.table << "\n" << out;
    }
  }
}

TEST(Plan, ByteSizes) {
  EXPECT_EQ(parse_byte_size("96GiB"), int64_t(96) << 30);
  EXPECT_EQ(parse_byte_size("1.5 TiB"), int64_t(3) << 39);
  EXPECT_EQ(parse_byte_size("80GB"), int64_t(80'000'000'000));
  EXPECT_EQ(parse_byte_size("512mib"), int64_t(512) << 20);
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  for (const char* bad : {"", "GiB", "0", "-1GiB", "12XB", "1e30TiB", "nan GiB", "5 G i B"})
    EXPECT_FALSE(parse_byte_size(bad).has_value()) << bad;
}

}  // namespace
}  // namespace titan::train
